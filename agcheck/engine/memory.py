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
no peak at all. File-backed pages the call brought in (``statm``'s third field: code of
the framework run for the first time, 1-9 MB for a first ``vmap``) are left out: they are
paid once per process, not per batch, and larger batches do not add to them. Elsewhere
(other systems, device memory) only the estimates apply.
"""
from __future__ import annotations

import os

try:
    import resource
except ImportError:  # not on Windows: only the estimates apply there
    resource = None

__all__ = ["MeasuredCall", "measured", "reading_works"]

_STATM = "/proc/self/statm"
try:
    _PAGE = os.sysconf("SC_PAGE_SIZE")
except (AttributeError, ValueError, OSError):
    _PAGE = 4096
_works: bool | None = None
#: ``(pid, file descriptor)`` of this process's ``statm``, kept open: a read is a
#: ``pread`` (about 1 µs, where opening and parsing ``status`` took 25 µs, and small
#: checks measure a dozen calls); reopened in a forked child, whose ``/proc/self`` differs
_statm: tuple[int, int] | None = None


def _read() -> tuple[int, int, int] | None:
    """``(resident bytes, peak resident bytes, file-backed resident bytes)`` of this
    process (``VmRSS``, ``VmHWM`` and ``RssFile + RssShmem``: ``statm``'s second field,
    ``getrusage``'s ``ru_maxrss`` and ``statm``'s third field), or ``None`` where the
    kernel does not tell."""
    global _statm
    if resource is None:
        return None
    try:
        pid = os.getpid()
        if _statm is None or _statm[0] != pid:
            if _statm is not None:
                os.close(_statm[1])
                _statm = None
            _statm = (pid, os.open(_STATM, os.O_RDONLY))
        fields = os.pread(_statm[1], 256, 0).split()
        resident, file_backed = int(fields[1]) * _PAGE, int(fields[2]) * _PAGE
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kB on Linux
    except (OSError, ValueError, IndexError):
        return None
    return resident, peak, file_backed


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
    rss_before, peak_before, file_before = before
    _, peak_after, file_after = after
    if peak_after <= peak_before:
        return MeasuredCall(result, None)
    return MeasuredCall(result, max(0, peak_after - rss_before - max(0, file_after - file_before)))
