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
