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
    # 30 elements: 60 evaluations and 60 VJPs, below ENGINE_FROM_CALLS
    x = make(30, seed=4)
    r = run_check(fn, (x,))
    assert _plans(r) == [("reference", "the loop makes few calls", {"loop_calls": 120, **limit})]
    assert r.verdict is (not broken) is torch.autograd.gradcheck(fn, (x,), raise_exception=False)
    # 50 elements: 200 calls
    x = make(50, seed=4)
    r = run_check(fn, (x,))
    assert _plans(r) == [("engine", "the loop makes many calls", {"loop_calls": 200, **limit})]
    assert r.verdict is (not broken) is torch.autograd.gradcheck(fn, (x,), raise_exception=False)


def test_a_backend_that_compiles_every_shape_runs_the_engine_from_more_calls():
    assert cost.engine_from_calls(True) == cost.COMPILED_ENGINE_FACTOR * cost.engine_from_calls(False)
    assert cost.engine_from_calls(False) == cost.ENGINE_FROM_CALLS
