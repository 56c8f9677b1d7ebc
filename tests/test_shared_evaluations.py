"""A function with complex outputs is checked twice, on the imaginary and on the real
parts of its outputs; the real parts' pass takes the first pass's evaluations at the
same moves (agcheck.core.shared_evaluations) instead of calling fn again, as torch's
checker does. Verdicts and messages stay torch's."""
import pytest
import torch

import agcheck
from agcheck.core import shared_evaluations
from agcheck.core.shared_evaluations import SharedEvaluations, sharing
from agcheck.core.wirtinger import output_part

from .helpers import (Cube, Square, assert_gradgradcheck_verdicts, busy, digest_kept_waiting, first_paragraph, make,
                      run_check as run, torch_message)

_W = torch.randn(12, 12, dtype=torch.float64, generator=torch.Generator().manual_seed(5)) / 4


def _phase(x):
    return torch.exp(1j * (_W[:x.numel(), :x.numel()] @ x)) * x


class _Phase(torch.autograd.Function):
    """``exp(i W x) * x`` (real in, complex out) without a vmap rule; its backward is
    autograd's, scaled by ``_Phase.factor`` where the cotangent has a real part (that is
    in the real parts' pass only: the imaginary parts' cotangents are imaginary).
    Evaluations are counted in ``_Phase.calls``."""

    factor = 1.0
    calls = 0

    @staticmethod
    def forward(ctx, x):
        _Phase.calls += 1
        ctx.save_for_backward(x)
        return _phase(x)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        with torch.enable_grad():
            x = x.detach().requires_grad_()
            (grad,) = torch.autograd.grad(_phase(x), x, g)
        return grad * (_Phase.factor if bool(g.real.any()) else 1.0)


@pytest.fixture(autouse=True)
def _right_backward_and_cheap_digests(monkeypatch):
    """A right backward unless a test breaks it; and sharing is not stopped by how long
    digests take against this small function's evaluations on a loaded machine (the
    rule that stops it is tested on its own)."""
    monkeypatch.setattr(_Phase, "factor", 1.0)
    monkeypatch.setattr(shared_evaluations, "DIGEST_SHARE_LIMIT", float("inf"))


def _calls(check, **options):
    _Phase.calls = 0
    verdict = check(_Phase.apply, (make(12, seed=3),), **options)
    return verdict, _Phase.calls


@pytest.mark.parametrize("engine", ["reference", "auto"])
def test_the_real_parts_pass_calls_fn_for_no_numerical_jacobian(engine):
    torch_verdict, torch_calls = _calls(torch.autograd.gradcheck)
    r = run(_Phase.apply, (make(12, seed=3),), engine=engine)
    assert torch_verdict and r.verdict
    shared = [e for e in r.engine_log if e.decision == "shared"]
    assert shared and shared[0].figures["served"] >= 2 * 12  # every move of the real pass
    verdict, calls = _calls(agcheck.gradcheck, engine=engine)
    # torch: 2 x 24 moves + 2 traced calls (and its batched-grad check's); agcheck: one
    # pass of moves (+ its own probes, fewer than the moves saved)
    assert verdict and calls < torch_calls - 12


@pytest.mark.parametrize("engine", ["reference", "auto"])
def test_a_wrong_real_part_fails_on_the_shared_evaluations_with_torchs_message(engine):
    _Phase.factor = 1.01
    want = torch_message(_Phase.apply, (make(12, seed=3),))
    assert "real part" in want
    got = first_paragraph(agcheck.gradcheck, _Phase.apply, (make(12, seed=3),), engine=engine)
    assert got.splitlines()[0] == want.splitlines()[0]
    r = run(_Phase.apply, (make(12, seed=3),), engine=engine)
    assert not r.verdict


def test_a_wrong_imaginary_part_fails_in_the_first_pass():
    class _Conj(_Phase):
        @staticmethod
        def backward(ctx, g):
            return _Phase.backward(ctx, g) * (1.01 if bool(g.imag.any()) else 1.0)

    want = torch_message(_Conj.apply, (make(12, seed=3),))
    assert "imaginary part" in want
    got = first_paragraph(agcheck.gradcheck, _Conj.apply, (make(12, seed=3),))
    assert got.splitlines()[0] == want.splitlines()[0]


def test_nothing_is_shared_beyond_the_memory_budget():
    # a quarter of the budget is for kept evaluations: 50 bytes, less than one output
    r = run(_Phase.apply, (make(12, seed=3),), engine="reference", memory_budget=4 * 50)
    assert r.verdict and not [e for e in r.engine_log if e.decision == "shared"]
    _Phase.factor = 1.01
    assert not run(_Phase.apply, (make(12, seed=3),), engine="reference", memory_budget=4 * 50).verdict


def test_sharing_stops_where_digests_cost_more_than_the_evaluations_they_save(monkeypatch):
    monkeypatch.setattr(shared_evaluations, "DIGEST_SHARE_LIMIT", 0.0)  # any digest costs too much
    r = run(_Phase.apply, (make(12, seed=3),), engine="reference")
    assert r.verdict and not [e for e in r.engine_log if e.decision == "shared"]
    _Phase.factor = 1.01
    assert not run(_Phase.apply, (make(12, seed=3),), engine="reference").verdict


@pytest.mark.parametrize("factor", [1.0, 1.01])
def test_a_digest_the_scheduler_kept_waiting_does_not_stop_sharing(factor, monkeypatch):
    # a busy machine preempts a digest of microseconds for milliseconds: timed in seconds
    # of work (the calling thread's CPU time), the digests still cost little against the
    # evaluations, and the real parts' pass still takes the first pass's evaluations
    monkeypatch.setattr(shared_evaluations, "DIGEST_SHARE_LIMIT", 0.4)  # the rule as shipped
    monkeypatch.setattr(_Phase, "factor", factor)
    digests = digest_kept_waiting(monkeypatch)

    def fn(z):  # evaluations of half a millisecond of work, beside digests of microseconds
        busy(0.0005)
        return _Phase.apply(z)

    r = run(fn, (make(12, seed=3),), engine="reference")
    assert r.verdict is (factor == 1.0)
    assert r.verdict is torch.autograd.gradcheck(fn, (make(12, seed=3),), raise_exception=False)
    if factor == 1.0:  # (a wrong real part fails in the pass that takes them, before the log says so)
        shared = [e for e in r.engine_log if e.decision == "shared"]
        assert len(digests) > 6 and shared and shared[0].figures["served"] >= 2 * 12


@pytest.mark.parametrize("factor", [1.0, 1.01])
def test_gradgradcheck_of_a_complex_function_shares_its_evaluations(factor, monkeypatch):
    monkeypatch.setattr(Square, "factor", factor)
    z = make(5, dtype=torch.complex128, seed=4)
    assert agcheck.gradcheck(Cube.apply, (z,))
    assert_gradgradcheck_verdicts(Cube.apply, (z,), passes=factor == 1.0)
    # the check of the VJP (complex outputs: the gradients of z) shares its evaluations
    from agcheck.gradgradcheck import _vjp_problem

    be = agcheck.get_backend("torch")
    vjp_fn, args = _vjp_problem(be, Cube.apply, (z,), None, False, 0)
    r = run(vjp_fn, args, engine="reference")
    assert r.verdict == (factor == 1.0)
    assert [e for e in r.engine_log if e.decision == "shared"] or not r.verdict


# -- the share itself -----------------------------------------------------------------
def _share(args, budget=1 << 20):
    be = agcheck.get_backend("torch")
    return be, SharedEvaluations(be, args, [0], first="imag", budget_bytes=budget)


def test_a_kept_evaluation_is_served_only_for_the_same_values_and_the_same_other_arguments():
    calls = []

    def fn(x, y):
        calls.append(1)
        return torch.exp(1j * x) * y

    x, y = make(3), make(3, seed=1)
    be, shared = _share((x, y))
    imag, real = (output_part(be, fn, part, shared) for part in ("imag", "real"))
    with sharing(imag):
        first = imag(x, y)
    assert torch.equal(first[0], fn(x, y).imag)
    calls.clear()
    with sharing(real):
        assert torch.equal(real(x, y.clone())[0], fn(x, y).real)  # another y object: called
        assert len(calls) == 2
        assert torch.equal(real(x + 0.0, y)[0], fn(x, y).real)  # same values of x: served
        assert len(calls) == 3 and shared.served == 1
        assert torch.equal(real(x, y)[0], fn(x, y).real)  # taken once: called again
        assert len(calls) == 5


def test_traced_calls_are_never_served():
    calls = []

    def fn(x):
        calls.append(1)
        return torch.exp(1j * x)

    x = make(3)
    be, shared = _share((x,))
    imag, real = (output_part(be, fn, part, shared) for part in ("imag", "real"))
    with sharing(imag):
        imag(x)
    out = real(x)  # outside a numerical block: fn is called, and the graph is there
    assert len(calls) == 2 and out[0].requires_grad


def test_the_digest_tells_values_shapes_and_signed_zeros_apart():
    be = agcheck.get_backend("torch")
    x = make(2, 3)
    assert be.content_digest(x) == be.content_digest(x.detach().clone())
    assert be.content_digest(x) != be.content_digest(x.reshape(3, 2))
    assert be.content_digest(torch.tensor([0.0])) != be.content_digest(torch.tensor([-0.0]))
    half = torch.tensor([1.0, 2.0], dtype=torch.bfloat16)  # a dtype NumPy lacks, twice
    assert be.content_digest(half) == be.content_digest(half.clone()) != be.content_digest(half + 1)
    z = torch.randn(3, dtype=torch.complex128)
    assert be.content_digest(z.conj()) == be.content_digest(z.conj().resolve_conj())
    assert be.content_digest(z.conj()) != be.content_digest(z)
    with torch.autograd.forward_ad.dual_level():  # a dual tensor's values alone do not make it
        assert be.content_digest(torch.autograd.forward_ad.make_dual(x.detach(), torch.ones_like(x))) is None


def test_the_first_pass_keeps_at_most_one_evaluation_per_move(monkeypatch):
    peaks = []
    keep = SharedEvaluations._keep

    def recording(self, key, outputs):
        keep(self, key, outputs)
        peaks.append((self.kept_bytes, self.budget_bytes))

    monkeypatch.setattr(SharedEvaluations, "_keep", recording)
    r = run(_Phase.apply, (make(12, seed=3),), engine="reference")
    served = [e.figures["served"] for e in r.engine_log if e.decision == "shared"]
    per_evaluation = 12 * 8  # the real part of 12 complex numbers
    moves = 2 * 12  # central differences of 12 real elements
    assert r.verdict and served == [moves]
    assert max(kept for kept, _ in peaks) == moves * per_evaluation
    assert {budget for _, budget in peaks} == {(moves + 8) * per_evaluation}
