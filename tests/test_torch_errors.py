"""Failures on the torch backend are torch's GradcheckError too (issue 13, item 1)."""
import pickle

import pytest

torch = pytest.importorskip("torch")
from torch.autograd.gradcheck import GradcheckError as TorchGradcheckError  # noqa: E402

import agcheck  # noqa: E402
# imported here, at collection: an in-process pytester run elsewhere in the session would
# otherwise import (and drop) these modules first, leaving two copies of the error class
import agcheck.backends.torch_backend  # noqa: E402,F401


class Tripled(torch.autograd.Function):
    """Forward doubles, backward claims three: every check of it fails."""

    @staticmethod
    def forward(ctx, x):
        return 2 * x

    @staticmethod
    def backward(ctx, g):
        return 3 * g

    @staticmethod
    def jvp(ctx, t):
        return 3 * t


def _x():
    return torch.randn(4, dtype=torch.float64, requires_grad=True)


@pytest.mark.parametrize("fast_mode", [False, True])
@pytest.mark.parametrize("mode", ["reverse", "forward"])
def test_gradcheck_failure_is_torch_error(fast_mode, mode):
    kw = {"check_forward_ad": True, "check_backward_ad": False} if mode == "forward" else {}
    with pytest.raises(TorchGradcheckError) as info:
        agcheck.gradcheck(Tripled.apply, (_x(),), fast_mode=fast_mode, **kw)
    e = info.value
    assert isinstance(e, agcheck.GradcheckError) and isinstance(e, RuntimeError)
    assert "Jacobian" in str(e) and "mismatch for output 0 with respect to input 0" in str(e)
    assert e.report is not None and e.report.blocks
    assert e.__traceback__ is not None


@pytest.mark.parametrize("fast_mode", [False, True])
def test_gradgradcheck_failure_is_torch_error(fast_mode):
    class BadSquare(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * x

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return g * 2 * x.detach() * 1.0 + 0 * x  # first order right, second order wrong

    with pytest.raises(TorchGradcheckError) as info:
        agcheck.gradgradcheck(BadSquare.apply, (_x(),), fast_mode=fast_mode)
    assert isinstance(info.value, agcheck.GradcheckError)


def test_other_checks_and_pickling():
    class Nondet(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, g):
            return g * (1 + 1e-3 * torch.rand(()))

    with pytest.raises(TorchGradcheckError, match="Backward is not reentrant"):
        agcheck.gradcheck(Nondet.apply, (_x(),), atol=1e-2)
    with pytest.raises(TorchGradcheckError) as info:
        agcheck.gradcheck(Tripled.apply, (_x(),))
    again = pickle.loads(pickle.dumps(info.value))
    assert isinstance(again, TorchGradcheckError) and isinstance(again, agcheck.GradcheckError)
    assert again.report.blocks


def test_raise_exception_false_and_other_backends():
    assert agcheck.gradcheck(Tripled.apply, (_x(),), raise_exception=False) is False
    np = pytest.importorskip("numpy")
    x = np.linspace(0.1, 1.0, 4)
    with pytest.raises(agcheck.GradcheckError) as info:
        agcheck.gradcheck(np.sin, (x,), backend="numpy", vjp=lambda x, g: 2 * np.cos(x) * g)
    assert not isinstance(info.value, TorchGradcheckError)


def test_the_raised_class_is_named_as_torchs():
    # tracebacks, pytest's failure lines and tools comparing exception names see the same
    # name as under torch's checker
    assert agcheck.gradcheck(lambda t: 2 * t, (_x(),))
    with pytest.raises(TorchGradcheckError) as info:
        agcheck.gradcheck(Tripled.apply, (_x(),))
    assert type(info.value).__name__ == "GradcheckError"
    assert TorchGradcheckError.__name__ == "GradcheckError"  # torch's own
