"""The forward-mode pass of a slow-mode check takes the numerical Jacobians its reverse-mode
pass computed (agcheck.core.numerical_memo) instead of evaluating fn for them again, as
torch's checker does; verdicts and messages stay torch's."""
import pytest
import torch

import agcheck
from agcheck.core.numerical_memo import MemoRows, NumericalMemo
import importlib

from .helpers import make, run_check as run, torch_text

_gen = torch.Generator().manual_seed(31)
_A, _B = (torch.randn(40, 40, dtype=torch.float64, generator=_gen) / 6 for _ in range(2))


class _Dense(torch.autograd.Function):
    """``tanh(A a + B b)`` with a right backward and its own JVP, which is scaled by
    ``_Dense.jvp_factor`` (1.0 is right); evaluations counted in ``_Dense.calls``."""

    generate_vmap_rule = True
    jvp_factor = 1.0
    calls = 0

    @staticmethod
    def forward(a, b):
        _Dense.calls += 1
        return torch.tanh(_A[:a.numel(), :a.numel()] @ a + _B[:a.numel(), :b.numel()] @ b)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(output)
        ctx.save_for_forward(output)

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        d = g * (1 - y * y)
        n, m = y.numel(), y.numel()
        return _A[:n, :n].T @ d, _B[:n, :m].T @ d

    @staticmethod
    def jvp(ctx, ta, tb):
        (y,) = ctx.saved_tensors
        n = y.numel()
        return _Dense.jvp_factor * (1 - y * y) * (_A[:n, :n] @ ta + _B[:n, :n] @ tb)


_BOTH = dict(check_forward_ad=True, check_undefined_grad=False, check_batched_grad=False)
# the reference engine decides small checks at once; 40 + 40 elements go to the engine
_SIZES = {"reference": 4, "auto": 40}


def _evaluations(n, **options):
    _Dense.calls = 0
    r = run(_Dense.apply, (make(n, seed=1), make(n, seed=2)), **options)
    return r, _Dense.calls


@pytest.mark.parametrize("engine", ["reference", "auto"])
def test_the_forward_pass_evaluates_fn_for_no_numerical_jacobian(engine, monkeypatch):
    n = _SIZES[engine]
    # the forward pass's own calls, counted in the run that makes them: two runs' reverse
    # passes may differ (timings decide how the engine moves the inputs)
    forward_calls = []
    comparison = importlib.import_module("agcheck.checks.jacobian")
    check = comparison.check

    def counted(run, piece):
        before = _Dense.calls
        check(run, piece)
        if piece.forward:
            forward_calls.append(_Dense.calls - before)

    monkeypatch.setattr(comparison, "check", counted)
    reverse_only, _ = _evaluations(n, engine=engine, **dict(_BOTH, check_forward_ad=False))
    both, _ = _evaluations(n, engine=engine, **_BOTH)
    assert reverse_only.verdict and both.verdict and len(forward_calls) == 1
    # torch's forward pass evaluates fn twice per input element (4n) for its numerical
    # Jacobians, and once per JVP (2n); agcheck's only for its JVPs: one per input
    # element by the reference engine, one per batch by the engine
    (added,) = forward_calls
    torch_added = _torch_evaluations(n, True) - _torch_evaluations(n, False)
    assert torch_added >= 6 * n
    assert added <= (2 * n if engine == "reference" else n // 2), (added, torch_added)


def _torch_evaluations(n, forward):
    _Dense.calls = 0
    args = (make(n, seed=1), make(n, seed=2))
    assert torch.autograd.gradcheck(_Dense.apply, args, check_forward_ad=forward, check_batched_grad=False,
                                    check_undefined_grad=False)
    return _Dense.calls


@pytest.mark.parametrize("engine", ["reference", "auto"])
def test_a_wrong_jvp_still_fails_the_forward_pass_with_torchs_message(engine, monkeypatch):
    monkeypatch.setattr(_Dense, "jvp_factor", 1.01)
    n = _SIZES[engine]
    args = (make(n, seed=1), make(n, seed=2))
    with pytest.raises(RuntimeError) as expected:
        torch.autograd.gradcheck(_Dense.apply, args, **_BOTH)
    taken = _record_takes(monkeypatch)
    with pytest.raises(agcheck.GradcheckError) as info:
        agcheck.gradcheck(_Dense.apply, args, engine=engine, **_BOTH)
    assert torch_text(info.value).split("\n\n")[0] == str(expected.value).rstrip("\n")
    assert "forward mode mismatch" in str(info.value)
    # decided in the forward pass on the reverse pass's rows of both inputs
    assert taken == [0, 1]


def _record_takes(monkeypatch) -> list:
    """The positions whose rows the memo gave out, from now on."""
    taken, original = [], NumericalMemo.take

    def take(self, fn, args, position, exact_only=False):
        rows = original(self, fn, args, position, exact_only)
        if rows is not None:
            taken.append(position)
        return rows

    monkeypatch.setattr(NumericalMemo, "take", take)
    return taken


def test_the_memo_matches_by_identity_and_gives_each_entry_once():
    memo = NumericalMemo(wanted=True)
    fn, other = (lambda x: x), (lambda x: x)
    x, y = torch.ones(3), torch.ones(3)
    rows = MemoRows({0: torch.eye(3)}, [(0, 3)], exact=False)
    memo.put(fn, (x, y), 0, rows)
    assert memo.take(other, (x, y), 0) is None
    assert memo.take(fn, (x, y.clone()), 0) is None
    assert memo.take(fn, (x, y), 1) is None
    assert memo.take(fn, (x, y), 0) is rows
    assert memo.take(fn, (x, y), 0) is None
    memo.put(fn, (x, y), 0, rows)
    assert memo.take(fn, (x, y), 0, exact_only=True) is None  # the reference engine wants exact rows
    assert memo.take(fn, (x, y), 0) is None  # and they are gone
    unwanted = NumericalMemo(wanted=False)
    unwanted.put(fn, (x, y), 0, rows)
    assert unwanted.take(fn, (x, y), 0) is None


@pytest.mark.parametrize("options", [dict(fast_mode=True), dict(check_backward_ad=False)])
def test_nothing_is_kept_where_no_forward_pass_follows_a_slow_reverse_pass(options):
    r, _ = _evaluations(_SIZES["auto"], engine="auto", **dict(_BOTH, **options))
    assert r.verdict
    assert not r.numerical_memo.wanted
