"""What a batched call costs in memory, measured on the process, and how large the next
batch may be.

Estimating a framework's working memory from array sizes fails by an order of magnitude
on some ops (torch's float64 CPU convolution keeps an unfolded copy of its input per
sample: 0.5 MB a copy for a 5x5 kernel over 4 channels of 24x24, where inputs and outputs
are 9 kB). So the engine also measures: the kernel's high-water mark of the process's
resident memory (``VmHWM``, Linux) is read before and after a call, and never reset
(resetting it would hide memory from the caller's own measurements). When the call raised
the process's peak, ``VmHWM - VmRSS before`` is exactly what the call took at its worst;
when it did not, the call stayed within memory the process had already used, and cost
no peak at all. Elsewhere (other systems, device memory) only the estimates apply.
"""
from __future__ import annotations

__all__ = ["MeasuredCall", "measured", "reading_works"]

_STATUS = "/proc/self/status"
_works: bool | None = None


def _read() -> tuple[int, int] | None:
    """``(VmRSS, VmHWM)`` in bytes, or ``None`` where the kernel does not tell."""
    try:
        with open(_STATUS, "rb") as f:
            text = f.read()
    except OSError:
        return None
    values = {}
    for line in text.split(b"\n"):
        if line.startswith((b"VmRSS:", b"VmHWM:")):
            values[line[:5]] = int(line.split()[1]) * 1024
    if len(values) != 2:
        return None
    return values[b"VmRSS"], values[b"VmHWM"]


def reading_works() -> bool:
    """Whether this process's resident memory and its peak can be read."""
    global _works
    if _works is None:
        _works = _read() is not None
    return _works


class MeasuredCall:
    """The result of a call, and its peak working memory in bytes when it raised the
    process's peak (``None`` when it stayed within memory already used, which costs
    nothing, or when nothing can be measured)."""

    __slots__ = ("result", "added_peak")

    def __init__(self, result, added_peak: int | None):
        self.result, self.added_peak = result, added_peak


def measured(call, *args) -> MeasuredCall:
    """``call(*args)`` and the peak memory it added to the process."""
    before = _read() if reading_works() else None
    result = call(*args)
    if before is None:
        return MeasuredCall(result, None)
    after = _read()
    if after is None:
        return MeasuredCall(result, None)
    rss_before, peak_before = before
    _, peak_after = after
    return MeasuredCall(result, peak_after - rss_before if peak_after > peak_before else None)
