"""The plan's timed band (agcheck.engine.cost.timed_band): a slow-mode check whose loop
makes fewer calls than ENGINE_FROM_CALLS, but not very few, goes to the engine when one
call of fn costs many calls of a reference function timed beside it; a function that
waits (asleep, as on a busy machine) instead of working is planned as one that does not."""
import time

import pytest
import torch

from agcheck.engine import cost

from .helpers import OneEntryOff, busy, make, run_check


def _plans(r) -> list:
    return [(e.decision, e.detail, e.figures) for e in r.engine_log if e.path == "plan"]


def _sines(broken=False, wait=0.0, work=0.0, n=1):
    """A sine (its backward one entry off when ``broken``) after ``n - 1`` other small
    ops; each call waits ``wait`` seconds asleep and works ``work`` seconds of CPU time
    besides."""
    last = OneEntryOff.apply if broken else torch.sin

    def fn(x):
        if wait:
            time.sleep(wait)
        if work:
            busy(work)
        for _ in range(n - 1):
            x = x * 1.0
        return last(x)

    return fn


@pytest.mark.parametrize("broken", [False, True])
def test_a_loop_of_dear_calls_in_the_band_goes_to_the_engine(broken):
    # 30 elements: 60 evaluations and 60 VJPs, in the band and below ENGINE_FROM_CALLS
    x = make(30, seed=4)
    assert 120 in cost.timed_band(False) and 120 < cost.ENGINE_FROM_CALLS
    expected = {"loop_calls": 120, "engine_from_calls": cost.ENGINE_FROM_CALLS}
    for fn in (_sines(broken, work=0.002), _sines(broken, n=200)):  # a slow step, many ops
        r = run_check(fn, (x,))
        assert _plans(r) == [("engine", "the loop makes dear calls", expected)]
        assert r.verdict is (not broken)
        assert r.verdict is torch.autograd.gradcheck(fn, (x,), raise_exception=False)
        if not broken:  # its 60 VJPs batched too: fewer than BATCHED_VJPS_FROM_CALLS, but dear
            assert ("vjp", "batched") in {(e.path, e.decision) for e in r.engine_log}
    # the same check sent to the engine by the keyword, its calls not found dear: a loop
    # of 60 VJPs is not worth batching
    r = run_check(_sines(broken, work=0.002), (x,), engine="batched")
    assert ("vjp", "batched") not in {(e.path, e.decision) for e in r.engine_log}
    assert r.verdict is (not broken)


@pytest.mark.parametrize("broken", [False, True])
def test_cheap_calls_and_very_few_calls_go_to_the_loop(broken):
    expected = {"engine_from_calls": cost.ENGINE_FROM_CALLS}
    r = run_check(_sines(broken), (make(15, seed=4),))  # one sine: 60 calls, in the band
    assert 60 in cost.timed_band(False)
    assert _plans(r) == [("reference", "the loop makes few calls", {"loop_calls": 60, **expected})]
    assert r.verdict is (not broken)
    # 12 elements: 48 calls, below the band: not timed, however dear
    assert 48 not in cost.timed_band(False)
    r = run_check(_sines(broken, work=0.002), (make(12, seed=4),))
    assert _plans(r) == [("reference", "the loop makes few calls", {"loop_calls": 48, **expected})]
    assert r.verdict is (not broken)


def test_time_asleep_is_no_cost(monkeypatch):
    """A call that waits 20 ms asleep (as a process does on a busy machine) is priced by
    the CPU time it takes (its wake-up's), not as a call that works for those 20 ms."""
    from agcheck.checks import loop_plan

    seen = []
    timed = loop_plan.call_in_reference_calls

    def recorded(run, piece):
        seen.append(timed(run, piece))
        return seen[-1]

    monkeypatch.setattr(loop_plan, "call_in_reference_calls", recorded)
    sleeper, worker = run_check(_sines(wait=0.02), (make(30, seed=4),)), run_check(_sines(work=0.02), (make(30, seed=4),))
    assert sleeper.verdict and worker.verdict
    assert len(seen) == 2 and 10 * seen[0] < seen[1], seen


def test_the_timed_calls_are_calls_of_the_guarded_fn():
    """The band's timed calls are counted by the input guard like any other: a function
    that writes into its input at its second call is named at that call."""
    calls = [0]

    def fn(x):
        calls[0] += 1
        if calls[0] == 2:
            with torch.no_grad():
                x.mul_(1.5)
        return _sines(work=0.002)(x)

    import agcheck

    x = make(30, seed=4)
    before = x.detach().clone()
    with pytest.raises(agcheck.CheckInputError, match="at its call 2 in this check"):
        agcheck.gradcheck(fn, (x,))
    assert torch.equal(x.detach(), before)


def test_no_band_where_the_backend_compiles_every_shape():
    assert list(cost.timed_band(True)) == []
    band = cost.timed_band(False)
    assert band.start == cost.ENGINE_FROM_CALLS // cost.TIMED_FROM_SHARE and band.stop == cost.ENGINE_FROM_CALLS
    assert cost.loop_is_dear(100, 2 * cost.DEAR_CALL) and not cost.loop_is_dear(100, cost.DEAR_CALL)


def _three_parts(broken=False, work=0.0):
    """Three inputs of 10 elements, three outputs of 5 or 6 (the last one's backward one
    entry off when ``broken``); each call works ``work`` seconds of CPU time besides."""
    last = OneEntryOff.apply if broken else torch.sin

    def fn(a, b, c):
        if work:
            busy(work)
        return a[:5] * b[:5], b[5:] * c[5:], last(c[4:])

    return fn


@pytest.mark.parametrize("broken", [False, True])
def test_dear_calls_batch_the_vjps_of_small_outputs(broken):
    # inputs too small to be moved in batches, outputs too small for batched VJPs to pay
    # on a cheap function (a VJP function of a gradgradcheck looks so): a loop of 92 calls
    args = (make(10, seed=1), make(10, seed=2), make(10, seed=3))
    fn = _three_parts(broken, work=0.002)
    r = run_check(fn, args)
    assert [e.detail for e in r.engine_log if e.path == "plan"] == ["the loop makes dear calls"]
    assert r.verdict is (not broken) is torch.autograd.gradcheck(fn, args, raise_exception=False)
    if not broken:  # decided by the engine: rows looped, the VJPs batched
        assert ("vjp", "batched") in {(e.path, e.decision) for e in r.engine_log}
        assert not r.engine_fallbacks
    # the engine forced on it, its calls not priced: it has nothing to batch and hands over
    r = run_check(fn, args, engine="batched")
    assert [o.reason for o in r.engine_fallbacks][:1] == ["no input can be moved in batches"]
    assert r.verdict is (not broken)
