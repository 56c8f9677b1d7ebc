"""PyTorch's own tests of gradcheck (test/test_autograd.py: test_gradcheck_*,
test_gradgradcheck_* and tests that assert a gradcheck outcome), restated for agcheck.

Every test runs through agcheck's API (``agcheck.gradcheck``) and through torch's names
with agcheck patched in (``agcheck.patch_torch()``: the test calls
``torch.autograd.gradcheck``), and, as in PyTorch, each checks fast and slow mode. A third
run through torch's own checker shows that the restated assertions are torch's. Inputs,
expected verdicts, exception types and matched message phrases are PyTorch's; the code is
written anew.
"""
from __future__ import annotations

import re
import warnings
from contextlib import contextmanager
from itertools import product

import pytest

torch = pytest.importorskip("torch")
import torch.autograd.forward_ad as fwAD  # noqa: E402
from torch.autograd import Function  # noqa: E402

import agcheck  # noqa: E402
from agcheck.backends.torch_backend import mkldnn_forward_ad_message  # noqa: E402

import sys  # noqa: E402

GradcheckError = sys.modules["torch.autograd.gradcheck"].GradcheckError
# torch's own functions (kept in a dict: the patch rebinds module-level names bound to them)
_TORCH = {"gradcheck": sys.modules["torch.autograd.gradcheck"].gradcheck,
          "gradgradcheck": sys.modules["torch.autograd.gradcheck"].gradgradcheck}
MKLDNN = torch.backends.mkldnn.is_available()
BOTH = (True, False)


class Checker:
    """The two entry points under test: ``gradcheck`` and ``gradgradcheck``."""

    def __init__(self, how):
        self.how = how

    def gradcheck(self, fn, inputs, **kw):
        if self.how == "torch":
            return _TORCH["gradcheck"](fn, inputs, **kw)
        if self.how == "api":
            return agcheck.gradcheck(fn, inputs, **kw)
        f = torch.autograd.gradcheck
        assert getattr(f, "agcheck_dropin", None) == "torch"
        return f(fn, inputs, **kw)

    def gradgradcheck(self, fn, inputs, grad_outputs=None, **kw):
        if self.how == "torch":
            return _TORCH["gradgradcheck"](fn, inputs, grad_outputs, **kw)
        if self.how == "api":
            return agcheck.gradgradcheck(fn, inputs, grad_outputs, **kw)
        f = torch.autograd.gradgradcheck
        assert getattr(f, "agcheck_dropin", None) == "torch"
        return f(fn, inputs, grad_outputs, **kw)


@pytest.fixture(params=["api", "patched", "torch"])
def ck(request):
    if request.param != "patched":
        yield Checker(request.param)
        return
    with agcheck.patch_torch():
        yield Checker("patched")


@pytest.fixture(autouse=True)
def _double_default():
    # test_autograd runs with float64 as the default dtype
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.double)
    yield
    torch.set_default_dtype(old)


@contextmanager
def warns_matching(fragment):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield
    assert any(fragment in str(w.message) for w in caught), [str(w.message) for w in caught]


def _plus_hook(x):
    """A clone whose backward adds 1e-2: its Jacobian is off everywhere."""
    y = x.clone()
    y.register_hook(lambda g: g + 1e-2)
    return y


# -- test_gradcheck_single_input -----------------------------------------------------------

def test_single_tensor_input(ck):
    for fast in BOTH:
        assert ck.gradcheck(lambda t: t.mul(5), torch.rand(10, requires_grad=True), fast_mode=fast)
        assert ck.gradgradcheck(lambda t: t.mul(5), torch.rand(10, requires_grad=True), fast_mode=fast)


# -- test_gradcheck_input (sparse layouts) --------------------------------------------------

@pytest.mark.parametrize("layout", [torch.sparse_coo, torch.sparse_csr, torch.sparse_csc, torch.sparse_bsr,
                                    torch.sparse_bsc], ids=str)
def test_sparse_layout_inputs(ck, layout):
    blocked = layout in (torch.sparse_bsr, torch.sparse_bsc)
    shape, blocksize = ((4, 8), (2, 2)) if blocked else ((2, 2), None)
    for fast, masked in product(BOTH, BOTH):
        x = torch.rand(shape).to_sparse(layout=layout, blocksize=blocksize).requires_grad_()
        assert ck.gradcheck(torch.sum, x, masked=masked, check_batched_grad=False, fast_mode=fast)


# -- test_gradcheck_nondeterministic ---------------------------------------------------------

class Jittery(Function):
    @staticmethod
    def forward(ctx, x, jitter=0.0):
        ctx.jitter = jitter
        return x

    @staticmethod
    def backward(ctx, g):
        noise = 1 + torch.rand_like(g) * ctx.jitter
        return Jittery.apply(g, ctx.jitter) * noise, None


def test_nondeterministic_backward(ck):
    x = torch.randn(5, 5, requires_grad=True)
    for fast in BOTH:
        kw = dict(check_batched_grad=False, fast_mode=fast)
        assert ck.gradcheck(lambda t: Jittery.apply(t, 0.0), x, **kw)
        with pytest.raises(RuntimeError, match="Backward is not reentrant"):
            ck.gradcheck(lambda t: Jittery.apply(t, 1e-6), x, **kw)
        with pytest.raises(RuntimeError, match="Backward is not reentrant"):
            ck.gradgradcheck(lambda t: Jittery.apply(t, 1e-12), x, **kw)
        assert ck.gradcheck(lambda t: Jittery.apply(t, 0.0), x, nondet_tol=1e-5, **kw)
        assert ck.gradcheck(lambda t: Jittery.apply(t, 1e-6), x, nondet_tol=1e-5, **kw)
        assert ck.gradgradcheck(lambda t: Jittery.apply(t, 1e-12), x, nondet_tol=1e-5, **kw)


# -- test_gradcheck_validates_inputs ---------------------------------------------------------

def test_validates_inputs(ck):
    for fast in BOTH:
        # seeded: float32 differences of to_dense miss atol=1e-5 for most draws, not all
        gen = torch.Generator().manual_seed(0)
        sparse = torch.rand(10, dtype=torch.float32, generator=gen).requires_grad_().to_sparse()
        common = dict(check_batched_grad=False, fast_mode=fast)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # float32 inputs warn
            assert ck.gradcheck(lambda t: t.to_dense(), (sparse,), atol=1e-1, masked=True, **common)
            assert ck.gradcheck(lambda t: t.to_dense(), (sparse,), masked=False, raise_exception=False,
                                **common) is False
            assert ck.gradcheck(lambda t: t.to_dense(masked_grad=False), (sparse,), masked=False, atol=1e-1,
                                raise_exception=False, **common)
        # no input requires grad: raises even with raise_exception=False
        with pytest.raises(ValueError, match="at least one input tensor to require gradient"):
            ck.gradcheck(lambda t: t, (torch.rand(10),), raise_exception=False, fast_mode=fast)
        single = torch.ones(1, dtype=torch.float32, requires_grad=True)
        with warns_matching("Input #0 requires gradient and is not a double precision"):
            assert ck.gradcheck(lambda t: t, (single,), atol=1e-1, fast_mode=fast)
        expanded = torch.ones(1, requires_grad=True).expand((2, 2))
        with pytest.raises(RuntimeError, match="The 0th input has a dimension with stride 0"):
            ck.gradcheck(lambda t: t, (expanded,), raise_exception=False, fast_mode=fast)


@pytest.mark.skipif(not MKLDNN, reason="MKL-DNN build is disabled")
def test_mkldnn_input_refuses_forward_ad(ck):
    x = torch.ones(1, dtype=torch.float32).to_mkldnn().requires_grad_()
    for fast in BOTH:
        with warns_matching("Input #0 requires gradient and is not a double precision"):
            with pytest.raises(ValueError, match=re.escape(mkldnn_forward_ad_message())):
                ck.gradcheck(lambda t: t.to_dense(), (x,), raise_exception=False, fast_mode=fast,
                             check_forward_ad=True, atol=1e-1, rtol=1e-1)



def test_the_mkldnn_forward_ad_message_is_worded_as_each_torch_release_words_it():
    # torch 2.13 raises "not support for", 2.14 "not supported for" (the installed torch's
    # own wording is checked against it above, on both checkers)
    assert mkldnn_forward_ad_message("2.13.0+cpu") == "MKLDNN inputs are not support for forward AD gradcheck."
    assert mkldnn_forward_ad_message("2.14.1+cu130") == "MKLDNN inputs are not supported for forward AD gradcheck."
    assert mkldnn_forward_ad_message("3.0.0") == "MKLDNN inputs are not supported for forward AD gradcheck."


# -- test_gradcheck_test_outputs -------------------------------------------------------------

@pytest.mark.skipif(not MKLDNN, reason="MKL-DNN build is disabled")
def test_unsupported_outputs(ck):
    for fast in BOTH:
        # seeded: float32 differences of to_dense miss atol=1e-5 for most draws, not all
        gen = torch.Generator().manual_seed(0)
        sparse = torch.rand(10, dtype=torch.float32, generator=gen).requires_grad_().to_sparse()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with pytest.raises(ValueError, match="Sparse output is not supported at gradcheck yet"):
                ck.gradcheck(lambda t: t, (sparse,), masked=True, check_batched_grad=False,
                             raise_exception=False, fast_mode=fast)
            root = torch.randn(4, 5, dtype=torch.float32, requires_grad=True)
            with pytest.raises(ValueError, match="MKLDNN output is not supported at gradcheck yet"):
                ck.gradcheck(lambda t: t.to_mkldnn(), (root,), check_batched_grad=False,
                             raise_exception=False, fast_mode=fast)


# -- test_gradcheck_check_no_differentiable_outputs ------------------------------------------

def test_no_differentiable_outputs(ck):
    x = torch.ones((1,), requires_grad=True)
    for fast in BOTH:
        with pytest.raises(RuntimeError, match="Numerical gradient for function expected to be zero"):
            ck.gradcheck(lambda t: torch.tensor([t]), x, fast_mode=fast)
        assert ck.gradcheck(lambda t: torch.tensor([t]), x, raise_exception=False, fast_mode=fast) is False
        assert ck.gradcheck(lambda t: (), (x,), fast_mode=fast)


# -- test_gradcheck_check_batched_grad --------------------------------------------------------

def test_batched_grad_failure(ck):
    for fast in BOTH:
        x = torch.rand(10, requires_grad=True).to_sparse()
        kw = dict(masked=True, check_batched_grad=True, fast_mode=fast)
        with pytest.raises(RuntimeError, match="gradcheck or gradgradcheck failed while testing batched gradient"):
            ck.gradcheck(lambda t: t.to_dense(), (x,), **kw)
        assert ck.gradcheck(lambda t: t.to_dense(), (x,), raise_exception=False, **kw) is False


# -- test_gradcheck_backward_mul_by_grad_output ----------------------------------------------

class SparseGrad(Function):
    @staticmethod
    def forward(ctx, x):
        return x

    @staticmethod
    def backward(ctx, g):
        return g.to_sparse()


def test_backward_multiplied_by_grad_output(ck):
    def wrong_sparse_dims(x):
        def hook(g):
            return g if g is None else g.to_dense().to_sparse(1)
        y = x.clone()
        y.register_hook(hook)
        return y.to_dense()

    def plus_dense(x):
        y = x.clone().to_dense()
        y.register_hook(lambda g: g + 1e-2)
        return y

    for fast in BOTH:
        sparse_kw = dict(atol=1e-1, masked=True, check_batched_grad=False, fast_mode=fast)
        x = torch.ones((2, 2), requires_grad=True).to_sparse()
        with pytest.raises(RuntimeError, match="grad is sparse tensor, but has incorrect sparse_dim"):
            ck.gradcheck(wrong_sparse_dims, (x,), **sparse_kw)
        assert ck.gradcheck(wrong_sparse_dims, (x,), raise_exception=False, **sparse_kw) is False

        x = torch.ones(1, requires_grad=True)
        with pytest.raises(RuntimeError, match="backward not multiplied by grad_output"):
            ck.gradcheck(_plus_hook, (x,), atol=1e-1, fast_mode=fast)
        assert ck.gradcheck(_plus_hook, (x,), atol=1e-1, raise_exception=False, fast_mode=fast) is False

        x = torch.ones(1, requires_grad=True).to_sparse()
        with pytest.raises(RuntimeError, match="backward not multiplied by grad_output"):
            ck.gradcheck(plus_dense, (x,), **sparse_kw)
        assert ck.gradcheck(plus_dense, (x,), raise_exception=False, **sparse_kw) is False

        x = torch.ones(1, requires_grad=True)
        with pytest.raises(RuntimeError, match="grad is incorrect layout"):
            ck.gradcheck(SparseGrad.apply, (x,), check_batched_grad=False, fast_mode=fast)
        assert ck.gradcheck(SparseGrad.apply, (x,), check_batched_grad=False, raise_exception=False,
                            fast_mode=fast) is False


# -- test_gradcheck_undefined_grad ----------------------------------------------------------

def test_undefined_output_grads(ck):
    def fn(x):
        def hook(g):
            if g is None:
                raise RuntimeError("x is undefined")
        y = x.clone()
        y.register_hook(hook)
        return y

    x = torch.ones(1, requires_grad=True)
    for fast in BOTH:
        with warns_matching("Backwards compatibility: New undefined gradient support checking feature"):
            with pytest.raises(RuntimeError, match="Expected backward function to handle undefined output grads"):
                ck.gradcheck(fn, (x,), fast_mode=fast)
            assert ck.gradcheck(fn, (x,), raise_exception=False, fast_mode=fast) is False


# -- test_gradcheck_jacobian_mismatch -------------------------------------------------------

def test_jacobian_mismatch(ck):
    def real_to_complex(x):
        y = torch.complex(x, x)
        y.register_hook(lambda g: g + 1e-2)
        return y

    def complex_to_real(x):
        y = torch.real(x)
        y.register_hook(lambda g: g + 1e-2)
        return y

    for fast in BOTH:
        x = torch.ones(2, 2, requires_grad=True)
        with pytest.raises(RuntimeError, match="Jacobian mismatch for output 0 with respect to input 0"):
            ck.gradcheck(_plus_hook, (x,), fast_mode=fast)
        assert ck.gradcheck(_plus_hook, (x,), raise_exception=False, fast_mode=fast) is False

        z = torch.ones(2, 2, requires_grad=True, dtype=torch.complex128)
        with pytest.raises(RuntimeError, match="While considering the imaginary part of complex outputs only"):
            ck.gradcheck(_plus_hook, (z,), fast_mode=False)
        assert ck.gradcheck(_plus_hook, (z,), raise_exception=False, fast_mode=False) is False

        with pytest.raises(RuntimeError, match="While considering the imaginary part of complex outputs only"):
            ck.gradcheck(real_to_complex, (x,), fast_mode=False)
        assert ck.gradcheck(real_to_complex, (x,), raise_exception=False, fast_mode=False) is False

        with pytest.raises(RuntimeError, match="Jacobian mismatch for output 0 with respect to input 0"):
            ck.gradcheck(complex_to_real, (z,), fast_mode=False)
        assert ck.gradcheck(complex_to_real, (z,), raise_exception=False, fast_mode=False) is False


# -- test_gradcheck_dense_and_sparse_inputs --------------------------------------------------

def test_dense_and_sparse_inputs(ck):
    for fast in BOTH:
        a = torch.rand(2, 2, requires_grad=True)
        b = torch.rand(2, 2).to_sparse().requires_grad_(True)
        assert ck.gradcheck(lambda x, y: x * y.coalesce().to_dense(), (a, b), masked=True,
                            check_batched_grad=False, fast_mode=fast)


@pytest.mark.skipif(not MKLDNN, reason="MKL-DNN build is disabled")
def test_several_mkldnn_inputs(ck):
    a = torch.rand(10, requires_grad=True)
    b = torch.rand(10, dtype=torch.float32).to_mkldnn().requires_grad_(True)
    c = torch.rand(10, dtype=torch.float32).to_mkldnn().requires_grad_(True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for fast in BOTH:
            assert ck.gradcheck(lambda x, y: x + y.to_dense(), (a, b), atol=1e-1, check_batched_grad=False,
                                fast_mode=fast)
            assert ck.gradcheck(lambda x, y: x + y.to_dense(), (a, c), atol=1e-1, check_batched_grad=False,
                                fast_mode=fast)


# -- test_gradcheck_output_shape_or_dtype_depend_on_values -----------------------------------

def test_outputs_that_change_with_the_perturbation(ck):
    def grows(x):
        return torch.cat([x, x]) if torch.all(x >= 1) else x

    def narrows(x):
        return x.to(torch.float32) if torch.all(x >= 1) else x

    a = torch.ones(1, requires_grad=True)
    for fast in BOTH:
        with pytest.raises(AssertionError, match="return outputs with the same shape when inputs are perturbed"):
            ck.gradcheck(grows, (a,), fast_mode=fast)
        with pytest.raises(AssertionError, match="return outputs with the same dtype when inputs are perturbed"):
            ck.gradcheck(narrows, (a,), fast_mode=fast)


# -- test_gradcheck_complex_non_complex_outputs ----------------------------------------------

def test_complex_and_real_outputs_together(ck):
    a = torch.ones(2, 2, requires_grad=True)
    b = torch.ones(2, 2, requires_grad=True)
    assert ck.gradcheck(lambda x, y: (torch.complex(x, y), x + 1), (a, b))
    c = torch.ones(2, 2, requires_grad=True, dtype=torch.complex128)
    assert ck.gradcheck(lambda z: (z, torch.real(z)), (c))


# -- test_gradcheck_adjusted_atol_complex_inputs ---------------------------------------------

def test_adjusted_atol_for_complex_inputs(ck):
    torch.manual_seed(97)
    z = 1e-2 * torch.rand(2, dtype=torch.complex128)
    z.requires_grad_(True)
    for fast in BOTH:
        assert ck.gradcheck(lambda t: 1.0 / torch.norm(t), (z,), fast_mode=fast, atol=8.3e-6, rtol=1e-9)


# -- test_gradcheck_custom_error -------------------------------------------------------------

def test_error_types(ck):
    def fails(x):
        raise RuntimeError("Not a GradcheckError!")

    x = torch.ones(2, 2, requires_grad=True)
    for fast in BOTH:
        with pytest.raises(GradcheckError, match="Jacobian mismatch for output 0 with respect to input 0"):
            ck.gradcheck(_plus_hook, (x,), fast_mode=fast)
        with pytest.raises(RuntimeError, match="Jacobian mismatch for output 0 with respect to input 0"):
            ck.gradcheck(_plus_hook, (x,), fast_mode=fast)
        assert ck.gradcheck(_plus_hook, (x,), raise_exception=False, fast_mode=fast) is False
        # errors of fn itself are not swallowed by raise_exception=False
        with pytest.raises(RuntimeError, match="Not a GradcheckError!"):
            ck.gradcheck(fails, (x,), fast_mode=fast, raise_exception=False)


# -- test_gradcheck_forward_ad ----------------------------------------------------------------

def test_forward_ad(ck):
    def fn(x, y):
        return x + y, y

    def wrong_tangent(x, y):
        if fwAD._current_level >= 0:  # inside forward AD: scale y's tangent
            primal, tangent = fwAD.unpack_dual(y)
            y = fwAD.make_dual(primal, tangent * 1.1)
        return x + y, y

    def basic_mul(x):
        return torch.view_as_real(torch.resolve_conj(x * 1j))

    message = "Jacobian computed with forward mode mismatch for output 0 with respect to input 1"
    for fast in BOTH:
        x = torch.rand(2, requires_grad=True)
        y = torch.rand(2, requires_grad=True)
        for pair in [(x, y), (torch.rand(2, dtype=torch.cdouble, requires_grad=True), y),
                     (torch.rand(2, dtype=torch.cdouble, requires_grad=True),
                      torch.rand(2, dtype=torch.cdouble, requires_grad=True))]:
            assert ck.gradcheck(fn, pair, check_forward_ad=True, fast_mode=fast)
            with pytest.raises(RuntimeError, match=message):
                ck.gradcheck(wrong_tangent, pair, check_forward_ad=True, fast_mode=fast)
        assert ck.gradcheck(basic_mul, x, check_forward_ad=True, fast_mode=fast)


# -- test_gradcheck_forward_ad_runs_with_no_requires_grad ------------------------------------

def test_forward_ad_inputs_do_not_require_grad(ck):
    seen = []

    class UserFn(Function):
        @staticmethod
        def forward(ctx, x, y):
            if fwAD._current_level >= 0:
                seen.append((x.requires_grad, y.requires_grad))
            return x.clone(), y.clone()

        @staticmethod
        def jvp(ctx, x_t, y_t):
            return x_t, y_t

    base = dict(check_forward_ad=True, check_backward_ad=False, check_batched_grad=False)
    x = torch.rand(2, requires_grad=True)
    y = torch.rand(2, requires_grad=True)
    assert ck.gradcheck(UserFn.apply, (x, y), check_undefined_grad=False, check_batched_forward_grad=False, **base)
    assert ck.gradcheck(UserFn.apply, (x, y), check_undefined_grad=True, check_batched_forward_grad=False, **base)
    assert ck.gradcheck(UserFn.apply, (x, y), check_undefined_grad=True, check_batched_forward_grad=True, **base)
    y = torch.rand(2, requires_grad=False)
    assert ck.gradcheck(UserFn.apply, (x, y), check_undefined_grad=True, check_batched_forward_grad=True, **base)
    assert seen and not any(a or b for a, b in seen)


# -- test_gradcheck_forward_ad_respects_requires_grad ----------------------------------------

def test_forward_ad_jvp_call_counts(ck):
    calls = [0]

    class UserFn(Function):
        @staticmethod
        def forward(ctx, x, y):
            return x.clone(), y.clone()

        @staticmethod
        def jvp(ctx, x_t, y_t):
            calls[0] += 1
            return x_t, y_t

    base = dict(check_forward_ad=True, check_backward_ad=False, check_batched_grad=False)

    def count(y_requires_grad, **kw):
        x = torch.rand(1, requires_grad=True)  # one element: slow and fast mode count alike
        y = torch.rand(1, requires_grad=y_requires_grad)
        calls[0] = 0
        ck.gradcheck(UserFn.apply, (x, y), **base, **kw)
        return calls[0]

    assert count(True, check_undefined_grad=False, check_batched_forward_grad=False) == 2
    assert count(True, check_undefined_grad=True, check_batched_forward_grad=False) == 6
    assert count(True, check_undefined_grad=True, check_batched_forward_grad=True) == 12
    assert count(False, check_undefined_grad=True, check_batched_forward_grad=True) == 5


# -- test_gradcheck_check_forward_or_backward_only -------------------------------------------

class Selective(Function):
    @staticmethod
    def forward(ctx, x, fwd_bad, bwd_bad):
        ctx.fwd_bad, ctx.bwd_bad = fwd_bad, bwd_bad
        return x * 2

    @staticmethod
    def vjp(ctx, g):
        if ctx.bwd_bad:
            raise RuntimeError("FAIL BWD")
        return 2 * g, None, None

    @staticmethod
    def jvp(ctx, t, _a, _b):
        if ctx.fwd_bad:
            raise RuntimeError("FAIL FWD")
        return 2 * t


def test_forward_or_backward_only(ck):
    for fast, fwd, bwd, fwd_bad, bwd_bad in product(BOTH, BOTH, BOTH, BOTH, BOTH):
        x = torch.rand(2, requires_grad=True)

        def run():
            return ck.gradcheck(Selective.apply, (x, fwd_bad, bwd_bad), check_forward_ad=fwd, check_backward_ad=bwd,
                                check_undefined_grad=bwd, check_batched_grad=bwd, fast_mode=fast)

        if not fwd and not bwd:
            with pytest.raises(AssertionError, match="Expected at least one of"):
                run()
            continue
        failing = [m for bad, on, m in ((fwd_bad, fwd, "FAIL FWD"), (bwd_bad, bwd, "FAIL BWD")) if bad and on]
        if not failing:
            assert run()
        else:
            with pytest.raises(RuntimeError, match=failing[-1]):  # backward's failure comes first
                run()


# -- test_gradcheck_forward_ad_batched_grad --------------------------------------------------

class RandomJvp(Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def vjp(ctx, g):
        return g * 2

    @staticmethod
    def jvp(ctx, t):
        torch.randn_like(t)
        return t * 2


def test_forward_ad_batched_grad(ck):
    x = torch.rand(2, requires_grad=True)
    kw = dict(check_forward_ad=True, check_backward_ad=False, check_batched_grad=False, check_undefined_grad=False,
              check_batched_forward_grad=True)
    assert ck.gradcheck(lambda a, b: (a.clone(), a + 1), (x, 1), **kw)  # a non-tensor input
    assert ck.gradcheck(lambda a, c: a.clone(), (x, x.clone()), **kw)  # an unused input: its tangent is None
    with pytest.raises(RuntimeError, match="vmap: We do not yet support calling random operations inside of vmap"):
        ck.gradcheck(RandomJvp.apply, (x,), check_forward_ad=True, check_batched_forward_grad=True)


# -- test_custom_function_non_tensor_inputs_outputs (its gradcheck) --------------------------

class MixedOutputs(Function):
    @staticmethod
    def forward(ctx, t1, t2, scale, t3):
        ctx.scale = scale
        ctx.save_for_backward(t1, t2, t3)
        t4 = (t1 + t2 * t3) * scale
        t5 = (t1 * t2 + t3) * scale
        return scale, t4, None, True, t5, "bar", t1

    @staticmethod
    def backward(ctx, *grads):
        t1, t2, t3 = ctx.saved_tensors
        s = ctx.scale
        g4, g5, g1 = grads[1], grads[4], grads[6]
        return (g4 * s + g5 * t2 * s + g1, g4 * t3 * s + g5 * t1 * s, None, g4 * t2 * s + g5 * s)


def test_custom_function_with_non_tensor_inputs_and_outputs(ck):
    t1, t2, t3 = (torch.rand(10, requires_grad=True) for _ in range(3))

    def fn(a, b, c):
        out = MixedOutputs.apply(a, b, 7, c)
        return out[1], out[4], out[6]

    assert ck.gradcheck(fn, (t1, t2, t3))


# -- test_unrelated_inputs ----------------------------------------------------------------------

def test_unrelated_inputs(ck):
    x = torch.rand(10, requires_grad=True)
    y = torch.rand(10, requires_grad=True)
    assert ck.gradcheck(lambda a, b: a * a, (x, y))
    assert ck.gradgradcheck(lambda a, b: a * a, (x, y))


# -- test_custom_function_forward_mode_wrong_formula -------------------------------------------

class Doubler(Function):
    @staticmethod
    def forward(ctx, x, wrong):
        ctx.wrong = wrong
        return x * 2

    @staticmethod
    def vjp(ctx, g):
        return 2 * g, None

    @staticmethod
    def jvp(ctx, t, _):
        return (3 if ctx.wrong else 2) * t


def test_custom_function_forward_mode_wrong_formula(ck):
    x = torch.rand(10, requires_grad=True)
    for fast in BOTH:
        assert ck.gradcheck(Doubler.apply, (x, False), check_forward_ad=True, fast_mode=fast)
        with pytest.raises(RuntimeError, match="Jacobian computed with forward mode mismatch for output 0"):
            ck.gradcheck(Doubler.apply, (x, True), check_forward_ad=True, fast_mode=fast)


# -- test_custom_function_forward_mode_non_tensor_before_tensor_args ---------------------------

class NonTensorsFirst(Function):
    @staticmethod
    def forward(ctx, n1, x, n2, y):
        return x * 2 + y * 3

    @staticmethod
    def jvp(ctx, n1, x_t, n2, y_t):
        assert n1 is None and n2 is None
        return x_t * 2 + y_t * 3

    @staticmethod
    def vjp(ctx, g):
        return None, g * 2, None, g * 3


def test_custom_function_forward_mode_non_tensor_before_tensor_args(ck):
    x = torch.randn((), requires_grad=True)
    y = torch.randn((), requires_grad=True)
    for fast in BOTH:
        assert ck.gradcheck(NonTensorsFirst.apply, (1, x, 1, y), check_forward_ad=True, check_backward_ad=False,
                            check_batched_grad=False, fast_mode=fast)


# -- test_custom_function_forward_mode_inplace_checks ------------------------------------------

class InPlaceDouble(Function):
    @staticmethod
    def forward(ctx, x, wrong):
        ctx.mark_dirty(x)
        ctx.wrong = wrong
        x.mul_(2)
        return x

    @staticmethod
    def vjp(ctx, g):
        return 2 * g, None

    @staticmethod
    def jvp(ctx, t, _):
        if ctx.wrong:
            return 2 * t  # a new tensor: the tangent must be modified in place
        t.mul_(2)
        return t


def test_custom_function_forward_mode_inplace_checks(ck):
    a = torch.rand(5, requires_grad=True)
    for fast in BOTH:
        assert ck.gradcheck(lambda x, w: InPlaceDouble.apply(x.clone(), w), (a, False), check_forward_ad=True,
                            fast_mode=fast)
        with pytest.raises(RuntimeError, match="inplace custom Function is not modifying the forward mode gradients"):
            ck.gradcheck(lambda x, w: InPlaceDouble.apply(x.clone(), w), (a, True), check_forward_ad=True,
                         fast_mode=fast)


# -- test_custom_function_forward_mode_view_checks ---------------------------------------------

class NarrowView(Function):
    @staticmethod
    def forward(ctx, x, how):
        ctx.how, ctx.shape = how, x.shape
        return x.narrow(0, 0, 2)

    @staticmethod
    def vjp(ctx, g):
        out = g.new_zeros(ctx.shape)
        out.narrow(0, 0, 2).copy_(g)
        return out, None

    @staticmethod
    def jvp(ctx, t, _):
        r = t.narrow(0, 0, 2)
        if ctx.how != "ok":
            r = r.clone()
        if ctx.how in ("not_a_view_of_inp", "not_a_view_of_inp_base"):
            r = r.view_as(r)
        return r


@pytest.mark.parametrize("how,message", [
    ("ok", None),
    ("not_a_view", "jvp is not returning a view"),
    ("not_a_view_of_inp", "jvp is not returning a view of the given"),
    ("not_a_view_of_inp_base", "jvp is not returning a view of the same base"),
])
def test_custom_function_forward_mode_view_checks(ck, how, message):
    def fn(x):
        if how == "not_a_view_of_inp_base":
            x = x.view_as(x)
        return NarrowView.apply(x, how)

    x = torch.rand(4, 4, requires_grad=True)
    for fast in BOTH:
        if message is None:
            assert ck.gradcheck(fn, x, check_forward_ad=True, fast_mode=fast)
        else:
            with pytest.raises(RuntimeError, match=message):
                ck.gradcheck(fn, x, check_forward_ad=True, fast_mode=fast)
