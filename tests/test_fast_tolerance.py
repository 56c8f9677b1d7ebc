"""Fast mode's blind spot and ``fast_tolerance="probe"``, which closes it.

torch carries ``atol`` over to a projection ``v^T J u`` scaled by ``sum(u) * sum(v)``,
which grows with the square root of the sizes: for a large Jacobian that is mostly zeros
it exceeds the projection itself, and a derivative off by a factor of 2 passes (under
torch's checker as under agcheck's default). The probe's own norms bound it instead."""
import pytest

import agcheck

torch = pytest.importorskip("torch")


def sin_with_backward(factor, monkeypatch):
    """``sin`` whose backward is scaled by ``factor`` (tests/helpers.py's ScaledSin)."""
    from .helpers import ScaledSin

    monkeypatch.setattr(ScaledSin, "factor", factor)
    return ScaledSin.apply


@pytest.fixture(scope="module")
def large():
    return torch.rand(100_000, dtype=torch.float64, generator=torch.Generator().manual_seed(0)).requires_grad_()


def test_torchs_tolerance_lets_a_factor_of_two_through_at_this_size_as_torch_does(large, monkeypatch):
    wrong = sin_with_backward(2.0, monkeypatch)
    assert torch.autograd.gradcheck(wrong, (large,), fast_mode=True, raise_exception=False)
    assert agcheck.gradcheck(wrong, (large,), fast_mode=True, raise_exception=False)  # torch's verdict kept


def test_the_probes_tolerance_catches_it_and_passes_the_right_derivative(large, monkeypatch):
    with pytest.raises(agcheck.GradcheckError, match="Jacobian mismatch for output 0 with respect to input 0"):
        agcheck.gradcheck(sin_with_backward(2.0, monkeypatch), (large,), fast_mode=True, fast_tolerance="probe")
    assert agcheck.gradcheck(sin_with_backward(1.0, monkeypatch), (large,), fast_mode=True, fast_tolerance="probe")


def test_a_dense_jacobian_passes_under_the_probes_tolerance():
    gen = torch.Generator().manual_seed(1)
    w = torch.randn(400, 400, dtype=torch.float64, generator=gen) / 20
    x = torch.randn(400, dtype=torch.float64, generator=gen).requires_grad_()
    assert agcheck.gradcheck(lambda v: torch.tanh(w @ v), (x,), fast_mode=True, fast_tolerance="probe")
    assert agcheck.gradgradcheck(lambda v: torch.tanh(w @ v), (x,), fast_mode=True, fast_tolerance="probe")


def test_an_unknown_tolerance_is_refused():
    x = torch.rand(3, dtype=torch.float64, requires_grad=True)
    with pytest.raises(ValueError, match="fast_tolerance must be 'torch' or 'probe'"):
        agcheck.gradcheck(torch.sin, (x,), fast_mode=True, fast_tolerance="loose")
