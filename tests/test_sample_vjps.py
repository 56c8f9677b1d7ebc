"""The first analytical pass by samples (``agcheck.engine.columns.first_pass_by_samples``):
where the output and every checked input hold the same independent samples, one VJP per
element position serves all samples (a cotangent of ones at that position); a wrong
backward still fails with the reference engine's message, and so does a backward that
reaches another sample, which that pass alone would not see."""
import pytest
import torch

import agcheck
from agcheck.engine import cost
from agcheck.core.outcome import EngineEvent

from .helpers import run_check

B, N = 3, 40
BY_SAMPLES = EngineEvent("vjp", "by samples", None, figures={"samples": B})


def _weights(n=N):
    # a heavy diagonal: the entries a leaking backward adds to are large, so that the
    # first pass's comparison (atol + rtol |J|) tolerates the leak
    g = torch.Generator().manual_seed(0)
    return torch.randn(n, n, dtype=torch.float64, generator=g) / n ** 0.5 + 2 * torch.eye(n, dtype=torch.float64)


class _PerSample(torch.autograd.Function):
    """``tanh(W x_s)`` for each sample ``s`` (any number of samples: copies stacked along
    the first dimension are samples too; ``W``: ``N x N`` unless a test sets another
    size). The backward counts its calls, is scaled by
    ``scale`` and adds ``leak`` times the next sample's cotangent to each sample's
    gradient (1.0 and 0.0: correct); ``rounding`` makes each sample's gradient round
    differently when the other samples' cotangents are not zero."""

    scale, leak, calls, rounding, weights = 1.0, 0.0, 0, False, _weights()

    @staticmethod
    def forward(ctx, x):
        y = torch.tanh(x @ _PerSample.weights.T)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, g):
        _PerSample.calls += 1
        (y,) = ctx.saved_tensors
        d = (g * (1 - y * y)) @ _PerSample.weights * _PerSample.scale + _PerSample.leak * torch.roll(g, -1, dims=0)
        if _PerSample.rounding:  # the same gradient, rounded as the whole cotangent's sum says
            d = (d + g.sum()) - g.sum()
        return d


@pytest.fixture(autouse=True)
def _looped_vjps(monkeypatch):
    # VJPs one call each (too few to batch, whatever the check), so that the backward's
    # calls count the VJPs; the engine runs however small the check
    monkeypatch.setattr(cost, "BATCHED_VJPS_FROM_CALLS", 1 << 62)
    monkeypatch.setattr(cost, "ENGINE_FROM_CALLS", 0)
    monkeypatch.setattr(_PerSample, "calls", 0)


def _x(b=B):
    n = _PerSample.weights.shape[0]
    x = torch.randn(b, n, dtype=torch.float64, generator=torch.Generator().manual_seed(1)) * 0.1
    return x.requires_grad_()


def _matches_torch(b=B) -> bool:
    """agcheck's torch text (its message without the summary) starts with torch's whole message
    (the Jacobians printed too)."""
    with pytest.raises(agcheck.GradcheckError) as ours:
        agcheck.gradcheck(_PerSample.apply, (_x(b),))
    with pytest.raises(RuntimeError) as torchs:
        torch.autograd.gradcheck(_PerSample.apply, (_x(b),))
    return ours.value.report.message.startswith(str(torchs.value))


@pytest.mark.parametrize("scale", [1.0, 1.1])
def test_one_vjp_per_position_serves_every_sample(monkeypatch, scale):
    monkeypatch.setattr(_PerSample, "scale", scale)
    r = run_check(_PerSample.apply, (_x(),))
    calls = _PerSample.calls
    assert BY_SAMPLES in r.engine_log
    assert r.verdict is (scale == 1.0)
    assert r.verdict is torch.autograd.gradcheck(_PerSample.apply, (_x(),), raise_exception=False)
    if scale == 1.0:
        # N VJPs for the first pass and N for the coloured second one (and two that time
        # a VJP), where the two column-by-column passes take 2 B N
        assert EngineEvent("vjp", "coloured") in r.engine_log and not r.engine_fallbacks
        assert 2 * N <= calls <= 2 * N + 4, calls
    else:
        # the first pass's columns, computed again one VJP each, reproduce it bitwise and
        # go to the reference engine, which then takes no VJP of its own (its two passes
        # would take 2 B N more)
        assert calls <= (2 + B) * N + 4, calls
        assert _matches_torch()


@pytest.mark.parametrize("leak", [1e-4, 1e-12])
def test_a_backward_that_reaches_another_sample_is_found_by_the_second_pass(monkeypatch, leak):
    """A gradient leaking ``leak`` of the next sample's cotangent: within what the first
    pass's comparison tolerates either way (atol + rtol |J|: the pass by samples reads the
    leak into a diagonal entry of about 2), but torch compares the entry between the two
    samples alone, with atol: 1e-4 fails there, 1e-12 passes. Without the second pass's
    whole-gradient comparison, 1e-4 would pass."""
    monkeypatch.setattr(_PerSample, "leak", leak)
    expected = leak > 1e-5
    assert torch.autograd.gradcheck(_PerSample.apply, (_x(),), raise_exception=False) is not expected
    r = run_check(_PerSample.apply, (_x(),))
    assert BY_SAMPLES in r.engine_log
    assert r.verdict is not expected
    if expected:
        # the second pass saw it; its exact rows replace the first pass's, the numerical
        # rows kept fail against them, and the failure is confirmed from those rows
        assert r.engine_fallbacks
        assert [(e.path, e.decision) for e in r.engine_log if e.path == "failure"] == [("failure", "confirmed")]
        assert _matches_torch()


@pytest.mark.parametrize("scale", [1.0, 1.1])
def test_a_backward_whose_rounding_depends_on_the_other_samples_gets_its_exact_columns(monkeypatch, scale):
    """Not the same bits as one-hot VJPs: the second pass does not reproduce the first.
    Each differing block is computed once more, one VJP per column; the two agree (the
    backward is reentrant), so their rows replace the first pass's and the numerical side
    is compared with them again: torch's verdict and message, with no fallback to the
    reference engine (which computed every numerical row again: 254 calls of fn)."""
    monkeypatch.setattr(_PerSample, "rounding", True)
    monkeypatch.setattr(_PerSample, "scale", scale)
    calls = []
    fn = lambda x: calls.append(1) or _PerSample.apply(x)
    r = run_check(fn, (_x(),))
    vjps = _PerSample.calls
    assert BY_SAMPLES in r.engine_log
    assert EngineEvent("vjp", "corrected", None, "the pass by samples rounded differently") in r.engine_log
    assert r.verdict is (scale == 1.0)
    assert r.verdict is torch.autograd.gradcheck(_PerSample.apply, (_x(),), raise_exception=False)
    assert len(calls) <= 100, len(calls)
    # the first pass (N), the coloured attempt (N), and two passes one VJP per column (2 B N)
    assert vjps <= N + N + 2 * B * N + 10, vjps
    if scale == 1.0:
        assert not r.engine_fallbacks
    else:
        assert [o.reason for o in r.engine_fallbacks] == ["Jacobian mismatch"]
        assert _matches_torch()


class _Unsteady(torch.autograd.Function):
    """``tanh(W x_s)`` whose backward adds a different rounding-level term at every call:
    not reentrant (torch's checker fails it with ``nondet_tol = 0``)."""

    calls = 0

    @staticmethod
    def forward(ctx, x):
        return _PerSample.forward(ctx, x)

    @staticmethod
    def backward(ctx, g):
        _Unsteady.calls += 1
        return _PerSample.backward(ctx, g) * (1 + 1e-15 * (_Unsteady.calls % 7))


@pytest.mark.parametrize("nondet_tol", [0.0, 1e-10])
def test_a_backward_that_is_not_reentrant_still_fails_after_a_pass_by_samples(nondet_tol):
    """The block computed again to settle a difference from the pass by samples differs
    from the second pass too: not reentrant, as torch's checker finds; within a
    ``nondet_tol`` that allows the differences, it passes under both."""
    ours = agcheck.gradcheck(_Unsteady.apply, (_x(),), nondet_tol=nondet_tol, raise_exception=False)
    torchs = torch.autograd.gradcheck(_Unsteady.apply, (_x(),), nondet_tol=nondet_tol, raise_exception=False)
    assert ours is torchs is (nondet_tol > 0)
    if nondet_tol == 0:
        with pytest.raises(agcheck.GradcheckError, match="Backward is not reentrant"):
            agcheck.gradcheck(_Unsteady.apply, (_x(),))


@pytest.mark.parametrize("scale", [1.0, 1.1])
def test_two_samples_go_by_samples_where_the_second_pass_is_column_by_column(monkeypatch, scale):
    """Two samples and an output too small for a coloured second pass (2 x 20 < 64): the
    first pass takes one VJP per position for both samples, the second one per column, as
    the reference engine computes them. A failing check reuses the second pass's columns,
    so neither verdict costs a VJP more than the passes: 20 + 40 (and the reference
    engine's two passes would take 80)."""
    monkeypatch.setattr(_PerSample, "weights", _weights(20))
    monkeypatch.setattr(_PerSample, "scale", scale)
    r = run_check(_PerSample.apply, (_x(2),))
    calls = _PerSample.calls
    assert EngineEvent("vjp", "by samples", None, figures={"samples": 2}) in r.engine_log
    assert r.verdict is (scale == 1.0)
    assert r.verdict is torch.autograd.gradcheck(_PerSample.apply, (_x(2),), raise_exception=False)
    assert calls <= 20 + 40 + 2, calls
    if scale != 1.0:
        assert _matches_torch(2)


@pytest.mark.parametrize("scale", [1.0, 1.1])
def test_two_samples_go_by_samples_before_a_coloured_second_pass(monkeypatch, scale):
    """Two samples of 40 outputs each (80 >= 64: the second pass is coloured). Right: 40
    VJPs for the first pass and 40 for the coloured one, where the column passes take 160
    under torch's checker. 10% off: the failure is confirmed from the few columns its
    message prints, computed one VJP each, with torch's verdict and message, and still
    fewer VJPs than torch's 160."""
    monkeypatch.setattr(_PerSample, "scale", scale)
    r = run_check(_PerSample.apply, (_x(2),))
    calls = _PerSample.calls
    assert EngineEvent("vjp", "by samples", None, figures={"samples": 2}) in r.engine_log
    assert EngineEvent("vjp", "coloured") in r.engine_log
    assert r.verdict is (scale == 1.0)
    assert r.verdict is torch.autograd.gradcheck(_PerSample.apply, (_x(2),), raise_exception=False)
    if scale == 1.0:
        assert calls <= 40 + 40 + 4, calls
    else:
        assert calls <= 40 + 40 + 10, calls
        assert _matches_torch(2)


def test_a_pass_by_samples_is_not_probed_for_fewer_vjps_than_the_probe_costs(monkeypatch):
    """One output per sample: a pass by samples would save one VJP of two, where probing
    that the input holds independent samples takes three calls of fn. The first pass is
    by columns; right, the check passes, and 1% off, it fails, as under torch."""
    monkeypatch.setattr(_PerSample, "weights", _weights(20))

    def fn(x):
        return _PerSample.apply(x).sum(-1, keepdim=True)

    for scale in (1.0, 1.01):
        monkeypatch.setattr(_PerSample, "scale", scale)
        r = run_check(fn, (_x(2),))
        assert not any(e.path == "vjp" and e.decision == "by samples" for e in r.engine_log)
        assert r.verdict is (scale == 1.0)
        assert r.verdict is torch.autograd.gradcheck(fn, (_x(2),), raise_exception=False)


class _TwoInputs(torch.autograd.Function):
    """``tanh(W x_s + V z_s)`` per sample; ``x``'s gradient leaks ``leak`` of the next
    sample's cotangent and ``z``'s is scaled by ``scale``."""

    leak, scale = 0.0, 1.0

    @staticmethod
    def forward(ctx, x, z):
        w, v = _PerSample.weights, _PerSample.weights.T.flip(0)
        y = torch.tanh(x @ w.T + z @ v.T)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        w, v = _PerSample.weights, _PerSample.weights.T.flip(0)
        d = g * (1 - y * y)
        return d @ w + _TwoInputs.leak * torch.roll(g, -1, dims=0), d @ v * _TwoInputs.scale


@pytest.mark.parametrize("leak", [0.0, 1e-4])
def test_a_leak_the_second_pass_finds_is_reported_before_a_later_inputs_mismatch(monkeypatch, leak):
    """``z``'s gradient 10% off fails the first comparison; ``x``'s leak is within what
    that comparison tolerates by samples and is seen only by the second pass. torch's
    checker reports the first failing block in its order, ``x``'s where it leaks: so
    does agcheck, once the corrected rows unmark ``x`` as agreeing, from the rows it kept
    (no fallback to the reference engine's own passes)."""
    monkeypatch.setattr(_TwoInputs, "leak", leak)
    monkeypatch.setattr(_TwoInputs, "scale", 1.1)
    args = (_x(), _x().detach().flip(1).requires_grad_())
    r = run_check(_TwoInputs.apply, args)
    assert r.verdict is False and BY_SAMPLES in r.engine_log
    assert [(e.path, e.decision) for e in r.engine_log if e.path == "failure"] == [("failure", "confirmed")]
    with pytest.raises(agcheck.GradcheckError) as ours:
        agcheck.gradcheck(_TwoInputs.apply, args)
    with pytest.raises(RuntimeError) as torchs:
        torch.autograd.gradcheck(_TwoInputs.apply, args)
    assert str(torchs.value).startswith(f"Jacobian mismatch for output 0 with respect to input {0 if leak else 1}")
    assert ours.value.report.message.startswith(str(torchs.value))


@pytest.mark.parametrize("scale", [1.0, 1.1])
def test_a_pass_by_samples_whose_batched_vjps_round_differently_keeps_torchs_verdict(monkeypatch, scale):
    """A pass by samples by batched VJPs that round differently from one-hot VJPs: the
    second pass does not reproduce it bit for bit, and the blocks that differ are
    computed again one VJP per column; a right backward passes, a wrong one fails with
    torch's message."""
    from agcheck.engine import columns

    monkeypatch.setattr(cost, "BATCHED_VJPS_FROM_CALLS", 0)
    looped = columns.looped_columns

    def rounding_differently(p, k, c0, c1, inputs, cotangents=None):
        return [c * (1 + 2.0 ** -50) for c in looped(p, k, c0, c1, inputs, cotangents)]

    monkeypatch.setattr(columns, "batched_columns", rounding_differently)
    monkeypatch.setattr(_PerSample, "scale", scale)
    r = run_check(_PerSample.apply, (_x(2),))
    decisions = [e.decision for e in r.engine_log if e.path == "vjp"]
    assert decisions[:2] == ["batched", "by samples"], decisions
    assert r.verdict is (scale == 1.0)
    assert r.verdict is torch.autograd.gradcheck(_PerSample.apply, (_x(2),), raise_exception=False)
    if scale != 1.0:
        assert _matches_torch(2)
