"""Failing checks whose dense Jacobians exceed ``memory_budget`` are decided and reported
in chunks (agcheck.checks.large_blocks): the same verdicts, torch's first line, the size
instead of the matrices, and no dense n x m matrix held."""
import pytest

import agcheck
from agcheck.checks import large_blocks

torch = pytest.importorskip("torch")

N = 300
#: far below the 1.4 MB the two dense 300 x 300 Jacobians take
SMALL_BUDGET = 64 << 10


@pytest.fixture
def sin_with(monkeypatch):
    """``sin_with(factor)``: ``sin`` whose backward and JVP are scaled by ``factor``
    (tests/helpers.py's ScaledSin and SinWithJvp)."""
    from .helpers import ScaledSin, SinWithJvp

    def make(factor, forward=False):
        cls = SinWithJvp if forward else ScaledSin
        monkeypatch.setattr(cls, "factor", factor)
        return cls.apply

    return make


def _input(n=N):
    return torch.linspace(-2, 2, n, dtype=torch.float64).requires_grad_()


@pytest.fixture
def chunked(monkeypatch):
    """Counts the comparisons made in chunks, and fails a test that would hold a dense
    block as large as the whole Jacobian."""
    calls = []
    real = large_blocks.compare_in_chunks

    def counting(run, piece):
        calls.append(piece)
        return real(run, piece)

    monkeypatch.setattr(large_blocks, "compare_in_chunks", counting)
    return calls


def test_a_wrong_backward_fails_in_chunks_with_torchs_first_line(chunked, sin_with):
    x = _input()
    assert agcheck.gradcheck(sin_with(1.0), (x,), engine="batched", memory_budget=SMALL_BUDGET)
    with pytest.raises(agcheck.GradcheckError, match="Jacobian mismatch for output 0 with respect to input 0,") as info:
        agcheck.gradcheck(sin_with(2.0), (x,), engine="batched", memory_budget=SMALL_BUDGET)
    assert chunked, "the failing check did not go through the chunked comparison"
    message = str(info.value)
    assert "300 x 300 entries" in message and "compared in chunks, not printed" in message
    assert "numerical:tensor" not in message  # torch's dump of the whole block is not written
    diagnoses = [d.kind for d in info.value.report.diagnoses]
    assert "factor" in diagnoses
    assert agcheck.gradcheck(sin_with(2.0), (x,), engine="batched", memory_budget=SMALL_BUDGET,
                             raise_exception=False) is False


def test_a_bug_in_a_later_chunk_is_found_and_its_entries_named(chunked):
    class LastWrong(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x.sin()

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            grad = g * x.cos()
            grad[-1] = grad[-1] * 3
            return grad

    x = _input()
    with pytest.raises(agcheck.GradcheckError) as info:
        agcheck.gradcheck(LastWrong.apply, (x,), engine="batched", memory_budget=SMALL_BUDGET)
    message = str(info.value)
    assert "Its worst entries" in message
    assert "(299,)  (299,)" in message  # the entry at its place in the whole block


def test_forward_mode_is_decided_in_chunks_too(chunked, sin_with):
    x = _input()
    kw = dict(check_forward_ad=True, check_backward_ad=False, check_undefined_grad=False, engine="batched",
              memory_budget=SMALL_BUDGET)
    assert agcheck.gradcheck(sin_with(1.0, forward=True), (x,), **kw)
    with pytest.raises(agcheck.GradcheckError,
                       match="Jacobian computed with forward mode mismatch for output 0 with respect to input 0,"):
        agcheck.gradcheck(sin_with(2.0, forward=True), (x,), **kw)


def test_fast_mode_does_not_recompute_jacobians_beyond_the_budget(sin_with):
    x = _input()
    assert agcheck.gradcheck(sin_with(1.0), (x,), fast_mode=True, memory_budget=SMALL_BUDGET)
    with pytest.raises(agcheck.GradcheckError, match="Jacobian mismatch for output 0 with respect to input 0") as info:
        agcheck.gradcheck(sin_with(2.0), (x,), fast_mode=True, memory_budget=SMALL_BUDGET)
    assert "are not recomputed for this message" in str(info.value)


def test_no_differentiable_outputs_are_checked_in_chunks():
    x = _input()
    assert agcheck.gradcheck(lambda v: torch.zeros_like(v).detach(), (x,), memory_budget=SMALL_BUDGET)
    with pytest.raises(agcheck.GradcheckError, match="Numerical gradient for function expected to be zero"):
        agcheck.gradcheck(lambda v: v.detach().sin(), (x,), memory_budget=SMALL_BUDGET)


def test_within_the_budget_torchs_matrices_are_printed_as_before(chunked, sin_with):
    x = _input(6)
    with pytest.raises(agcheck.GradcheckError, match=r"numerical:tensor\(") as info:
        agcheck.gradcheck(sin_with(2.0), (x,), engine="batched")
    assert not chunked and "compared in chunks" not in str(info.value)
