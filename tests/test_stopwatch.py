"""The engine's cost clock: seconds of work, not of waiting (agcheck.core.stopwatch)."""
import time

import numpy as np
import pytest
import torch

import agcheck
from agcheck.core.stopwatch import Stopwatch

from .helpers import busy, make, run_check


def test_waiting_costs_nothing_on_the_thread_clock_and_counts_on_the_wall_clock():
    on_thread, wall = Stopwatch(True), Stopwatch(False)
    time.sleep(0.1)
    assert on_thread.seconds() < 0.05
    assert wall.seconds() >= 0.1


def test_work_counts_on_both_clocks_and_never_more_than_the_wall_clock():
    began = time.perf_counter()
    wall = Stopwatch(False)
    on_thread = Stopwatch(True)  # started within the wall-clock span, read before its end
    busy(0.05)
    work = on_thread.seconds()
    waited = wall.seconds()
    assert 0.05 <= work <= waited + 1e-4  # (two clocks: a tick of slack)
    assert waited <= time.perf_counter() - began


def test_the_work_of_a_thread_is_not_billed_to_another():
    import threading

    watch = Stopwatch(True)
    worker = threading.Thread(target=busy, args=(0.1,))
    worker.start()
    worker.join()  # this thread waits while the other works
    assert watch.seconds() < 0.05


def test_backends_say_where_their_work_runs():
    torch_be, numpy_be = agcheck.get_backend("torch"), agcheck.get_backend("numpy")
    assert torch_be.computes_on_calling_thread((torch.ones(3), 2.0))
    # another device's kernels run elsewhere (no GPU is needed to hold a meta tensor)
    assert not torch_be.computes_on_calling_thread((torch.ones(3), torch.empty(3, device="meta")))
    assert numpy_be.computes_on_calling_thread((np.ones(3), 2.0))
    jax = pytest.importorskip("jax")
    # XLA computes on its own threads while the caller waits
    assert not agcheck.get_backend("jax").computes_on_calling_thread((jax.numpy.ones(3),))


@pytest.mark.parametrize("device_work", [False, True])
def test_a_check_times_its_engine_on_the_clock_its_backend_names(device_work, monkeypatch):
    from agcheck.backends.torch_backend import TorchBackend

    monkeypatch.setattr(TorchBackend, "computes_on_calling_thread", lambda self, args: not device_work)
    r = run_check(torch.sin, (make(4),))
    assert r.verdict
    watch = r.stopwatch()
    time.sleep(0.06)
    assert (watch.seconds() >= 0.06) is device_work


def _slow_collection_seconds(garbage) -> float:
    """CPU seconds of one full collection with ``garbage`` alive (many tracked objects)."""
    import gc

    start = time.thread_time()
    gc.collect()
    return time.thread_time() - start


def test_a_garbage_collection_is_left_out_while_checks_count_them_and_counted_otherwise():
    import gc

    from agcheck.core.stopwatch import _on_collection, collections_left_out

    garbage = [[] for _ in range(300_000)]  # alive: every full collection visits them
    whole = _slow_collection_seconds(garbage)
    assert whole > 0.002, "the collection must be long enough to tell apart"
    outside = Stopwatch(True)
    gc.collect()
    assert outside.seconds() >= 0.5 * whole  # outside a check the stopwatch is a plain clock
    with collections_left_out():
        with collections_left_out():  # nested (a check inside a check's fn)
            on_thread, wall = Stopwatch(True), Stopwatch(False)
            gc.collect()
            busy(0.02)
            assert 0.02 <= on_thread.seconds() < 0.02 + 0.3 * whole
            assert 0.02 <= wall.seconds() < 0.02 + 0.3 * whole + 0.05
        assert _on_collection in gc.callbacks  # the outer user still counts
    assert _on_collection not in gc.callbacks  # the caller's process is left as it was
    del garbage
