"""The slow-mode plan (agcheck.checks.loop_plan): the element loop or the engine, from the
number of calls the loop would make, never from what a call costs."""
import pytest
import torch

from agcheck.engine import cost

from .helpers import OneEntryOff, busy, make, run_check


def _plans(r) -> list:
    return [(e.decision, e.detail, e.figures) for e in r.engine_log if e.path == "plan"]


def _sines(broken=False, work=0.0):
    """A sine (its backward one entry off when ``broken``); each call works ``work``
    seconds of CPU time besides."""
    last = OneEntryOff.apply if broken else torch.sin

    def fn(x):
        if work:
            busy(work)
        return last(x)

    return fn


@pytest.mark.parametrize("broken", [False, True])
@pytest.mark.parametrize("work", [0.0, 0.002], ids=["cheap calls", "dear calls"])
def test_the_plan_follows_from_the_loops_calls_not_from_their_cost(broken, work):
    limit = {"engine_from_calls": cost.ENGINE_FROM_CALLS}
    fn = _sines(broken, work)
    # n elements: 2n evaluations and 2n VJPs; one element short of ENGINE_FROM_CALLS, then at it
    at = cost.ENGINE_FROM_CALLS // 4
    assert 4 * at == cost.ENGINE_FROM_CALLS
    x = make(at - 1, seed=4)
    r = run_check(fn, (x,))
    assert _plans(r) == [("reference", "the loop makes few calls", {"loop_calls": 4 * (at - 1), **limit})]
    assert r.verdict is (not broken) is torch.autograd.gradcheck(fn, (x,), raise_exception=False)
    x = make(at, seed=4)
    r = run_check(fn, (x,))
    assert _plans(r) == [("engine", "the loop makes many calls", {"loop_calls": 4 * at, **limit})]
    assert r.verdict is (not broken) is torch.autograd.gradcheck(fn, (x,), raise_exception=False)


def test_a_backend_that_compiles_every_shape_runs_the_engine_from_more_calls():
    assert cost.engine_from_calls(True) == cost.COMPILED_ENGINE_FACTOR * cost.engine_from_calls(False)
    assert cost.engine_from_calls(False) == cost.ENGINE_FROM_CALLS
