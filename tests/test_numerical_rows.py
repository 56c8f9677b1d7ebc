"""The forward-mode pass of a slow-mode check takes the numerical Jacobians its reverse-mode
pass computed (the run's rows, agcheck.core.numerical_rows) instead of evaluating fn for
them again, as torch's checker does; verdicts and messages stay torch's."""
import numpy as np
import pytest
import torch

import agcheck
from agcheck.core.numerical_rows import NumericalRows
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
    taken = _record_given(monkeypatch)
    with pytest.raises(agcheck.GradcheckError) as info:
        agcheck.gradcheck(_Dense.apply, args, engine=engine, **_BOTH)
    assert torch_text(info.value).split("\n\n")[0] == str(expected.value).rstrip("\n")
    assert "forward mode mismatch" in str(info.value)
    # decided in the forward pass on the reverse pass's rows of both inputs
    assert taken == [0, 1]


def _record_given(monkeypatch) -> list:
    """The positions whose rows the reverse-mode pass left whole for the forward-mode
    pass, from now on."""
    given = []
    comparison = importlib.import_module("agcheck.checks.jacobian")
    check = comparison.check

    def recorded(run, piece):
        if piece.forward:
            for q in piece.checked:
                kept = run.rows.of(piece.fn, piece.args, q)
                if kept is not None and kept.complete():
                    given.append(q)
        check(run, piece)

    monkeypatch.setattr(comparison, "check", recorded)
    return given


def test_rows_match_by_identity_and_tell_which_are_exact():
    be = agcheck.get_backend("torch")
    rows = NumericalRows(be, wanted=True)
    fn, other = (lambda x: x), (lambda x: x)
    x, y = torch.ones(3), torch.ones(3)
    kept = rows.of(fn, (x, y), 0, 3)
    assert rows.of(fn, (x, y), 0) is kept
    assert rows.of(other, (x, y), 0) is None
    assert rows.of(fn, (x, y.clone()), 0) is None
    assert rows.of(fn, (x, y), 1) is None
    eye = torch.eye(3, dtype=torch.float64)
    kept.add(0, 2, {0: eye[:2]}, exact=False)
    assert not kept.complete() and kept.numpy() is None
    kept.add(2, 3, {0: eye[2:]}, exact=True)
    assert kept.complete() and np.array_equal(kept.numpy()[0], eye.numpy())
    assert [(s, e) for s, e, _ in kept.blocks(exact_only=True)] == [(2, 3)]  # the reference engine's kind
    assert [(s, e) for s, e, _ in kept.blocks(exact_only=False)] == [(0, 3)]
    kept.add(0, 1, {0: 2 * eye[:1]}, exact=True)  # a row computed again replaces the kept one
    assert [(s, e) for s, e, _ in kept.blocks(exact_only=True)] == [(0, 1), (2, 3)]
    assert torch.equal(kept.rows(0, 1)[0], 2 * eye[:1]) and kept.bounds == [(0, 1)]
    rows.piece_done(forward=False)  # a forward-mode pass follows: kept for it
    assert rows.of(fn, (x, y), 0) is kept
    rows.piece_done(forward=True)
    assert rows.of(fn, (x, y), 0) is None
    unwanted = NumericalRows(be, wanted=False)
    unwanted.of(fn, (x, y), 0, 3)
    unwanted.piece_done(forward=False)
    assert unwanted.of(fn, (x, y), 0) is None


@pytest.mark.parametrize("options", [dict(fast_mode=True), dict(check_backward_ad=False)])
def test_nothing_is_kept_where_no_forward_pass_follows_a_slow_reverse_pass(options):
    r, _ = _evaluations(_SIZES["auto"], engine="auto", **dict(_BOTH, **options))
    assert r.verdict
    assert not r.rows.wanted and r.rows.of(r.fn, r.args, 0) is None
