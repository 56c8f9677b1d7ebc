"""The seconds the engine's cost decisions are made on.

Batching or looping, the size of the next batch, whether a one-time setup pays: each is
decided on the time a piece of work took. Wall-clock time misleads these choices on a
busy machine (tests run in parallel, a CI runner shared with other jobs): a block that
was preempted for a few scheduler slices looks several times dearer than it was, and the
engine then takes the slower path for the rest of the check.

Where the backend does its work on the calling thread (:meth:`Backend.computes_on_calling_thread`:
CPU arrays of an eager framework), the stopwatch reads that thread's CPU time, which does
not count the slices the thread waited for (and never exceeds wall-clock time). The
calling thread's, not the process's: an intra-op pool's workers spin for a while after
each parallel region, and their spinning would be billed to whatever runs next. A
parallel op keeps the calling thread busy until its last worker is done, so its thread
time is its wall-clock time on a machine that is not busy. Elsewhere (an accelerator's
queue, a runtime that computes on its own threads while the caller waits) the caller's
CPU time says nothing of the work, and the stopwatch reads wall-clock time.
"""
from __future__ import annotations

from agcheck.backends.base import work_clock

__all__ = ["Stopwatch"]


class Stopwatch:
    """Started when made; :meth:`seconds` is the time since, as a cost.

    Parameters
    ----------
    on_thread : bool
        Whether the work timed runs on the calling thread: the cost is then the thread's
        CPU seconds; otherwise wall-clock seconds.
    """

    __slots__ = ("_clock", "_start")

    def __init__(self, on_thread: bool) -> None:
        self._clock = work_clock(on_thread)
        self._start = self._clock()

    def seconds(self) -> float:
        """Seconds of work since the stopwatch was made."""
        return self._clock() - self._start
