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

Neither clock should count the garbage collector: in a large process (a test session
holding many objects) one full collection takes a tenth of a second or more, and it lands
on whichever timed call happened to allocate, which then looks hundreds of times dearer
than it is. While :func:`collections_left_out` is active (around each check) the time
collections take on a thread is counted apart (a ``gc.callbacks`` hook, installed for
that span only), and a stopwatch on that thread leaves it out.
"""
from __future__ import annotations

import gc
import threading
import time
from contextlib import contextmanager

from agcheck.backends.base import work_clock

__all__ = ["Stopwatch", "collections_left_out", "collection_seconds"]

_lock = threading.Lock()
_users = 0
#: per thread: CPU and wall-clock seconds its garbage collections took so far
_spent: dict = {}
_began: dict = {}


def _on_collection(phase: str, info: dict) -> None:
    ident = threading.get_ident()
    if phase == "start":
        _began[ident] = (time.thread_time(), time.perf_counter())
        return
    began = _began.pop(ident, None)
    if began is not None:
        cpu, wall = _spent.get(ident, (0.0, 0.0))
        _spent[ident] = (cpu + time.thread_time() - began[0], wall + time.perf_counter() - began[1])


def collection_seconds(on_thread: bool) -> float:
    """The seconds garbage collections took on this thread while counted (CPU seconds
    where ``on_thread``, else wall-clock)."""
    spent = _spent.get(threading.get_ident())
    return 0.0 if spent is None else spent[0 if on_thread else 1]


@contextmanager
def collections_left_out():
    """Count garbage collections apart for the stopwatches made inside (nestable, any
    thread); the hook is removed when the last user leaves."""
    global _users
    with _lock:
        if not _users:
            gc.callbacks.append(_on_collection)
        _users += 1
    try:
        yield
    finally:
        with _lock:
            _users -= 1
            if not _users:
                gc.callbacks.remove(_on_collection)


class Stopwatch:
    """Started when made; :meth:`seconds` is the time since, as a cost.

    Parameters
    ----------
    on_thread : bool
        Whether the work timed runs on the calling thread: the cost is then the thread's
        CPU seconds; otherwise wall-clock seconds.
    """

    __slots__ = ("_clock", "_on_thread", "_start", "_collected")

    def __init__(self, on_thread: bool) -> None:
        self._clock, self._on_thread = work_clock(on_thread), on_thread
        self._collected = collection_seconds(on_thread)
        self._start = self._clock()

    def seconds(self) -> float:
        """Seconds of work since the stopwatch was made (less the garbage collections on
        this thread, where they are counted: :func:`collections_left_out`)."""
        elapsed = self._clock() - self._start
        return max(0.0, elapsed - (collection_seconds(self._on_thread) - self._collected))
