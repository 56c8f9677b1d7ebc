"""Timing checkers against each other in one process: each call warmed, then the calls run
in turn, so that drift on a shared machine hits them alike; CPU time of the calling
thread, which waiting for a core does not inflate."""
from __future__ import annotations

import statistics
import time
from typing import Callable


def cpu_seconds(call: Callable[[], object]) -> float:
    """The calling thread's CPU seconds spent in ``call()``."""
    start = time.thread_time()
    call()
    return time.thread_time() - start


def alternated(calls: dict, repeat: int, warm: int = 5) -> dict:
    """``{name: [CPU seconds of each run]}`` for ``calls`` (``name -> callable``): each run
    ``warm`` times untimed (lazy imports, first-call caches), then all ``repeat`` times in
    turn."""
    for _ in range(warm):
        for call in calls.values():
            call()
    times = {name: [] for name in calls}
    for _ in range(repeat):
        for name, call in calls.items():
            times[name].append(cpu_seconds(call))
    return times


def median_ratio(numerators: list, denominators: list) -> float:
    """The median of the runs' ratios (run ``i`` of one against run ``i`` of the other)."""
    return statistics.median(n / d for n, d in zip(numerators, denominators))
