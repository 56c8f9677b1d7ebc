import pytest
import torch

import agcheck

from .helpers import Snapshot, make


def both(fn, inputs, **kw):
    clone = tuple(x.detach().clone().requires_grad_(x.requires_grad) for x in inputs)
    return (agcheck.gradgradcheck(fn, inputs, raise_exception=False, **kw),
            torch.autograd.gradgradcheck(fn, clone, raise_exception=False, **kw))


class CubeWithFlatBackward(torch.autograd.Function):
    """x**3 whose backward is not itself differentiable (detaches x): 2nd derivative wrong."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x ** 3

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * 3 * x.detach() ** 2


@pytest.mark.parametrize("fast_mode", [False, True])
@pytest.mark.parametrize("kw", [{}, {"check_fwd_over_rev": True}, {"gen_non_contig_grad_outputs": True},
                                {"check_batched_grad": True}])
def test_correct_passes_broken_fails_like_torch(fast_mode, kw):
    assert both(lambda a, b: (a * b).sin(), (make(3), make(3, seed=1)), fast_mode=fast_mode, **kw) == (True, True)
    assert both(CubeWithFlatBackward.apply, (make(4),), fast_mode=fast_mode, **kw) == (False, False)


def test_complex_second_derivatives():
    z = make(3, dtype=torch.complex128)
    assert both(lambda t: (t * t.conj()).exp() + t.sin(), (z,)) == (True, True)


def test_given_grad_outputs_and_messages():
    x = make(3)
    go = make(3, seed=5)
    assert agcheck.gradgradcheck(lambda t: t.exp(), (x,), (go,))
    with pytest.raises(agcheck.GradcheckError, match="Jacobian mismatch for output 0 with respect to input 0"):
        agcheck.gradgradcheck(CubeWithFlatBackward.apply, (x,), (go,))


def test_caller_rng_and_inputs_untouched():
    x = make(3, 2)
    snap = Snapshot([x])
    agcheck.gradgradcheck(lambda t: t.tanh(), (x,))
    snap.assert_unchanged()


class CubeNotingGradMode(torch.autograd.Function):
    """x**3 whose backward notes whether it runs recording a graph (``flat``: its own
    backward is not differentiable, so the second derivative is wrong)."""

    modes = []

    @staticmethod
    def forward(ctx, x, flat):
        ctx.save_for_backward(x)
        ctx.flat = flat
        return x ** 3

    @staticmethod
    def backward(ctx, g):
        CubeNotingGradMode.modes.append(torch.is_grad_enabled())
        (x,) = ctx.saved_tensors
        return g * 3 * (x.detach() if ctx.flat else x) ** 2, None


@pytest.mark.parametrize("flat", [False, True])
@pytest.mark.parametrize("order", [2, 3])
def test_evaluations_for_values_record_no_graph_of_the_backward_pass(flat, order):
    # torch's checker records the VJP's backward graph at every evaluation; agcheck only
    # where it differentiates it (the first call, the analytical pass). At order 3 fn's
    # backward runs inside the inner VJP, whose graph the outer one differentiates
    CubeNotingGradMode.modes.clear()
    passed = agcheck.gradgradcheck(lambda t: CubeNotingGradMode.apply(t, flat), (make(4),), order=order,
                                   raise_exception=False)
    assert passed is not flat
    assert True in CubeNotingGradMode.modes
    assert (False in CubeNotingGradMode.modes) is (order == 2)


def test_order_three_catches_a_wrong_third_derivative():
    class SquareBackward(torch.autograd.Function):
        # d/dx of (g * 3x^2) given as g*6x (right), but its own backward says g*5 (wrong)
        @staticmethod
        def forward(ctx, x, g):
            ctx.save_for_backward(x, g)
            return g * 3 * x ** 2

        @staticmethod
        def backward(ctx, gg):
            x, g = ctx.saved_tensors
            return gg * g * 6 * x * Sixth.apply(x), gg * 3 * x ** 2

    class Sixth(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return torch.ones_like(x)

        @staticmethod
        def backward(ctx, g):
            return g * 0.5  # d/dx of 1 is 0: a wrong third derivative

    class Cube(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x ** 3

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return SquareBackward.apply(x, g)

    x = make(3)
    assert agcheck.gradcheck(Cube.apply, (x,))
    assert agcheck.gradgradcheck(Cube.apply, (x,))
    assert not agcheck.gradgradcheck(Cube.apply, (x,), order=3, raise_exception=False)
    assert agcheck.gradgradcheck(lambda t: t ** 3, (x,), order=3)


def test_bad_order():
    with pytest.raises(ValueError, match="order"):
        agcheck.gradgradcheck(lambda t: t, (make(2),), order=0)


@pytest.mark.parametrize("kw", [{"engine": "reference"}, {"engine": "batched"},
                                {"engine": "auto", "memory_budget": 4096},
                                {"stencil": "five-point"}])
def test_engine_keywords_reach_the_check_of_the_vjp(kw):
    # The keywords beyond torch are accepted as in agcheck.gradcheck and do not change verdicts.
    x = make(40)
    assert agcheck.gradgradcheck(lambda t: t.sin() * t, (x,), **kw)
    assert not agcheck.gradgradcheck(CubeWithFlatBackward.apply, (x,), raise_exception=False, **kw)


def test_bad_engine_keyword_is_a_clear_error():
    with pytest.raises(ValueError, match="engine must be"):
        agcheck.gradgradcheck(lambda t: t.sin(), (make(3),), engine="fastest")


def test_a_first_check_in_a_fresh_process_imports_no_sympy():
    """torch's first backward with a cotangent imports sympy (its cotangent checks, about
    0.4 s); agcheck's VJPs skip those checks, so the first check of a process does not pay
    it, and still passes a right second derivative and fails a wrong one."""
    import subprocess
    import sys

    code = (
        "import sys, torch, agcheck\n"
        "from tests.test_gradgradcheck import CubeWithFlatBackward\n"
        "assert 'sympy' not in sys.modules\n"
        "x = torch.rand(20, dtype=torch.float64, requires_grad=True)\n"
        "assert agcheck.gradcheck(lambda t: t.sin() * t, (x,))\n"
        "assert agcheck.gradgradcheck(lambda t: t.sin() * t, (x,))\n"
        "assert not agcheck.gradgradcheck(CubeWithFlatBackward.apply, (x,), raise_exception=False)\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'sympy')[:3])\n"
    )
    root = __import__("pathlib").Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"
