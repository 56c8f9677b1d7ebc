"""gradgradcheck's VJP function reuses ``fn``'s forward while only the cotangents move
(agcheck.backends.torch_forward_memo): fewer calls of ``fn`` than torch's checker makes,
the same verdicts, and no reuse of a graph that does not take a second backward."""
import pytest
import torch

import agcheck
from agcheck.backends import torch_forward_memo

from .helpers import Cube, Square, assert_gradgradcheck_verdicts, busy, digest_kept_waiting, make


@pytest.fixture(autouse=True)
def _right_backward_and_cheap_digests(monkeypatch):
    """A right double backward unless a test breaks it; and the memo is not stopped by
    how long digests take against these small forwards on a loaded machine (that rule is
    tested on its own)."""
    monkeypatch.setattr(Square, "factor", 1.0)
    monkeypatch.setattr(torch_forward_memo, "DIGEST_SHARE_LIMIT", float("inf"))
    monkeypatch.setattr(torch_forward_memo, "DIGEST_NEVER_PAYS", float("inf"))


def _calls(check, fn, x, **options):
    Cube.calls = 0
    verdict = check(fn, (x,), **options)
    return verdict, Cube.calls


@pytest.mark.parametrize("engine", ["reference", "auto"])
def test_the_forward_is_reused_while_only_the_cotangents_move(engine):
    x = make(8, seed=1)
    torch_verdict, torch_calls = _calls(torch.autograd.gradgradcheck, Cube.apply, x)
    verdict, calls = _calls(agcheck.gradgradcheck, Cube.apply, x, engine=engine)
    assert torch_verdict and verdict
    # torch: 2 x 16 moves + 2; agcheck: the cotangent's 16 moves share forwards
    assert calls <= torch_calls - 12


def test_a_wrong_second_derivative_still_fails():
    Square.factor = 1.01
    x = make(8, seed=1)
    with pytest.raises(RuntimeError, match="Jacobian mismatch"):
        torch.autograd.gradgradcheck(Cube.apply, (x,))
    with pytest.raises(agcheck.GradcheckError, match="Jacobian mismatch"):
        agcheck.gradgradcheck(Cube.apply, (x,), engine="reference")


def test_the_call_that_drew_the_cotangents_serves_the_first_evaluation():
    class _RaisingBackward(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            Cube.calls += 1
            return x * 2

        @staticmethod
        def backward(ctx, g):
            raise ArithmeticError("the backward fails")

    x = make(4)
    for check, forwards in ((torch.autograd.gradgradcheck, 2), (agcheck.gradgradcheck, 1)):
        Cube.calls = 0
        with pytest.raises(ArithmeticError, match="the backward fails"):
            check(_RaisingBackward.apply, (x,))
        assert Cube.calls == forwards


def _partly_constant(x, factor):
    """``x`` in value; its derivative ``factor`` (1.0 is right: a factor below makes the
    second derivative of a backward using it wrong, and leaves the first right)."""
    return x * factor + x.detach() * (1 - factor)


class _Forgetful(torch.autograd.Function):
    """``x ** 3`` whose backward drops what it kept: a second backward on the same graph
    raises, which torch's checker never runs. ``factor``: see :func:`_partly_constant`."""

    factor = 1.0

    @staticmethod
    def forward(ctx, x):
        ctx.kept = x  # the input itself: its double backward flows through it
        return x ** 3

    @staticmethod
    def backward(ctx, g):
        x, ctx.kept = ctx.kept, None
        return g * 3 * x * _partly_constant(x, _Forgetful.factor)


class _Counting(torch.autograd.Function):
    """``x ** 3`` whose backward is right the first time it runs on a graph and twice as
    large the next: only a reused forward sees the difference. ``factor``: see
    :func:`_partly_constant`."""

    factor = 1.0

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        ctx.runs = 0
        return x ** 3

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        ctx.runs += 1
        return g * 3 * x * _partly_constant(x, _Counting.factor) * ctx.runs


@pytest.mark.parametrize("factor", [1.0, 0.99])
@pytest.mark.parametrize("function", [_Forgetful, _Counting])
def test_a_backward_that_does_not_repeat_stops_the_reuse_and_the_verdict_is_torchs(function, factor, monkeypatch):
    monkeypatch.setattr(function, "factor", factor)
    x = make(6, seed=2)
    assert_gradgradcheck_verdicts(function.apply, (x,), passes=factor == 1.0)
    be = agcheck.get_backend("torch")
    vjp_fn = be.differentiable_vjp(function.apply, 1, [0], [0])
    assert agcheck.gradcheck(vjp_fn, (x, make(6, seed=3)), engine="reference", raise_exception=False) == \
        (factor == 1.0)
    assert not vjp_fn.forward.enabled  # the repeated backward was seen, and reuse stopped


def test_the_memo_stops_where_digests_cost_more_than_the_forwards(monkeypatch):
    monkeypatch.setattr(torch_forward_memo, "DIGEST_SHARE_LIMIT", 0.0)  # any digest costs too much
    x = make(8, seed=1)
    verdict, calls = _calls(agcheck.gradgradcheck, Cube.apply, x, engine="reference")
    assert verdict and calls >= 2 * 16
    Square.factor = 1.01
    with pytest.raises(agcheck.GradcheckError):
        agcheck.gradgradcheck(Cube.apply, (x,), engine="reference")


@pytest.mark.parametrize("factor", [1.0, 1.01])
def test_a_digest_the_scheduler_kept_waiting_does_not_stop_the_memo(factor, monkeypatch):
    # a busy machine preempts a digest of a few microseconds for milliseconds: timed in
    # seconds of work (the calling thread's CPU time), the digests still cost little
    # against the forwards, and the memo goes on (timed in wall-clock seconds, it closed)
    monkeypatch.setattr(torch_forward_memo, "DIGEST_SHARE_LIMIT", 0.4)  # the rule as shipped
    Square.factor = factor
    digests = digest_kept_waiting(monkeypatch)

    def fn(x):  # a forward of half a millisecond of work, beside a digest of microseconds
        busy(0.0005)
        return Cube.apply(x)

    x, cotangent = make(8, seed=1), make(8, seed=2)
    vjp_fn = agcheck.get_backend("torch").differentiable_vjp(fn, 1, [0], [0])
    verdict = agcheck.gradcheck(vjp_fn, (x, cotangent), engine="reference", raise_exception=False)
    assert verdict is (factor == 1.0)
    assert verdict is torch.autograd.gradgradcheck(fn, (x,), raise_exception=False)
    assert len(digests) > 6 and vjp_fn.forward.enabled


def test_a_mutable_argument_is_never_keyed():
    be = agcheck.get_backend("torch")
    memo = torch_forward_memo.RetainedForward(be, lambda x, options: x * options[0])
    x = make(3)
    assert memo._key((x, [2.0])) is None
    assert memo._key((x, 2.0)) is not None
    assert memo._key((x, 2.0)) != memo._key((x + 1, 2.0))


def test_a_call_whose_own_cotangents_make_the_backward_raise_does_not_stop_the_reuse():
    # cotangents of another shape (a stacked probe passed them to the VJP function of
    # complex outputs): the repeated backward raises, and so does a fresh one; the graph
    # is not at fault, and reuse goes on
    be = agcheck.get_backend("torch")
    vjp_fn = be.differentiable_vjp(Cube.apply, 1, [0], [0])
    x = make(2, 3, seed=1)
    expected = [torch.autograd.grad(Cube.apply(x), x, c)[0] for c in (make(2, 3, seed=2), make(2, 3, seed=3))]
    vjp_fn(x, make(2, 3, seed=4))
    vjp_fn(x, make(2, 3, seed=5))  # a repeated backward, checked against a fresh one
    assert vjp_fn.forward.enabled and vjp_fn.forward.validated
    with pytest.raises(RuntimeError, match="shape"):
        vjp_fn(x, make(4, 3, seed=6))
    assert vjp_fn.forward.enabled
    Cube.calls = 0
    results = [vjp_fn(x, c)[0] for c in (make(2, 3, seed=2), make(2, 3, seed=3))]
    assert Cube.calls == 1  # one forward for both: the graph that raised was not run again
    assert all(torch.equal(r, e) for r, e in zip(results, expected))



class _RaisesOnce(Cube):
    """:class:`Cube` whose backward raises on its ``raise_at``-th run (counted over every
    graph), once: a user's error that does not come back."""

    runs = 0
    raise_at = None

    @staticmethod
    def backward(ctx, g):
        _RaisesOnce.runs += 1
        if _RaisesOnce.runs == _RaisesOnce.raise_at:
            raise RuntimeError("the user's backward failed once")
        return Cube.backward(ctx, g)


def test_a_users_error_in_a_repeated_backward_is_raised_not_taken_for_the_graphs(monkeypatch):
    # a repeated backward on the kept forward raises once; the fresh evaluation after it
    # does not, and the graph takes another backward: the user's error is raised (where
    # a graph refused, as _Forgetful's does, the memo stops instead: the test above)
    be = agcheck.get_backend("torch")
    vjp_fn = be.differentiable_vjp(_RaisesOnce.apply, 1, [0], [0])
    x = make(2, 3, seed=1)
    monkeypatch.setattr(_RaisesOnce, "runs", 0)
    monkeypatch.setattr(_RaisesOnce, "raise_at", None)
    vjp_fn(x, make(2, 3, seed=4))
    vjp_fn(x, make(2, 3, seed=5))  # repeated, validated against a fresh one
    assert vjp_fn.forward.validated
    monkeypatch.setattr(_RaisesOnce, "raise_at", _RaisesOnce.runs + 1)  # the next repeated backward
    with pytest.raises(RuntimeError, match="failed once"):
        vjp_fn(x, make(2, 3, seed=6))
    # the checks: an error raised once in the user's backward comes out of gradgradcheck
    # at whichever of its calls it happens, the reused forwards' calls included
    for at in range(1, 40):
        monkeypatch.setattr(_RaisesOnce, "runs", 0)
        monkeypatch.setattr(_RaisesOnce, "raise_at", at)
        try:
            agcheck.gradgradcheck(_RaisesOnce.apply, (make(4, seed=7),), engine="reference")
        except RuntimeError as error:
            assert "failed once" in str(error)
        else:
            assert _RaisesOnce.runs < at, f"the error at backward {at} was swallowed"


@pytest.mark.parametrize("factor", [1.0, 1.01])
def test_a_digest_dearer_than_a_forward_stops_the_memo_at_the_first_forward(factor, monkeypatch):
    # each call pays a digest and a reuse saves at most a forward: where a digest costs
    # more than a forward, no reuse repays it, and the memo stops at once (here any digest
    # counts as dearer), not after DIGEST_TIMED_CALLS forwards
    monkeypatch.setattr(torch_forward_memo, "DIGEST_NEVER_PAYS", 0.0)
    Square.factor = factor
    x, cotangent = make(8, seed=1), make(8, seed=2)
    seeded = ((x,), (Cube.apply(x),))  # as gradgradcheck's first forward
    vjp_fn = agcheck.get_backend("torch").differentiable_vjp(Cube.apply, 1, [0], [0], evaluated=seeded)
    vjp_fn(x, cotangent)
    assert vjp_fn.forward.enabled  # the seeded forward reused: no forward timed yet
    vjp_fn(x + 1, cotangent)
    assert not vjp_fn.forward.enabled
    assert agcheck.gradgradcheck(Cube.apply, (x,), raise_exception=False) is (factor == 1.0)
    assert torch.autograd.gradgradcheck(Cube.apply, (x,), raise_exception=False) is (factor == 1.0)


def test_where_only_a_few_calls_follow_the_share_rule_applies_from_the_first_forward(monkeypatch):
    # fast mode calls the VJP function six or seven times, two or three of them reusing a
    # forward: the rule that digests cost no good part of the forwards is applied from the
    # first forward instead of the fourth
    monkeypatch.setattr(torch_forward_memo, "DIGEST_SHARE_LIMIT", 0.0)  # any digest costs too much
    be = agcheck.get_backend("torch")
    x, cotangent = make(8, seed=1), make(8, seed=2)
    many, few = (be.differentiable_vjp(Cube.apply, 1, [0], [0], few_calls=flag) for flag in (False, True))
    for vjp_fn in (many, few):
        vjp_fn(x, cotangent)
        vjp_fn(x + 1, cotangent)
    assert many.forward.enabled and not few.forward.enabled
    made = []
    original = torch_forward_memo.RetainedForward.__init__
    monkeypatch.setattr(torch_forward_memo.RetainedForward, "__init__",
                        lambda self, *a, **k: (original(self, *a, **k), made.append(self.decide_after))[0])
    for fast in (False, True):
        assert agcheck.gradgradcheck(Cube.apply, (x,), fast_mode=fast)
    assert made == [torch_forward_memo.DIGEST_TIMED_CALLS, 1]
    Square.factor = 1.01
    for fast in (False, True):
        with pytest.raises(agcheck.GradcheckError):
            agcheck.gradgradcheck(Cube.apply, (x,), fast_mode=fast)


@pytest.mark.parametrize("factor", [1.0, 1.01])
def test_a_timed_seed_decides_before_any_call(factor, monkeypatch):
    # gradgradcheck times the forward it runs to draw the cotangents and hands the time
    # over with it: the seed is then the first timed forward, and a digest dearer than it
    # stops the memo before the VJP function is called at all (one digest paid, not three)
    monkeypatch.setattr(torch_forward_memo, "DIGEST_NEVER_PAYS", 0.0)
    Square.factor = factor
    be = agcheck.get_backend("torch")
    x = make(8, seed=1)
    seeded = ((x,), (Cube.apply(x),))
    untimed = be.differentiable_vjp(Cube.apply, 1, [0], [0], evaluated=seeded)
    timed = be.differentiable_vjp(Cube.apply, 1, [0], [0], evaluated=seeded, evaluated_seconds=1e-3)
    assert untimed.forward.enabled and not timed.forward.enabled
    monkeypatch.setattr(torch_forward_memo, "DIGEST_NEVER_PAYS", float("inf"))
    kept = be.differentiable_vjp(Cube.apply, 1, [0], [0], evaluated=seeded, evaluated_seconds=1e-3)
    assert kept.forward.enabled and kept.forward._forwards == 1
    digests = []
    original = torch_forward_memo.RetainedForward._key
    monkeypatch.setattr(torch_forward_memo.RetainedForward, "_key",
                        lambda self, inputs: (digests.append(1), original(self, inputs))[1])
    monkeypatch.setattr(torch_forward_memo, "DIGEST_NEVER_PAYS", 0.0)
    for fast in (False, True):
        digests.clear()
        assert agcheck.gradgradcheck(Cube.apply, (x,), fast_mode=fast, raise_exception=False) is (factor == 1.0)
        assert len(digests) == 1
    assert torch.autograd.gradgradcheck(Cube.apply, (x,), raise_exception=False) is (factor == 1.0)
