"""The NumPy / array-API backend: finite differences against hand-written vjp / jvp.

Every group has two halves: correct derivatives pass (slow and fast mode), broken ones
(scaled, transposed, one entry off, not multiplied by the cotangent, missing conj, the
other complex convention, ...) fail with torch's key phrases. A parity group wraps the
same NumPy function and derivatives in a ``torch.autograd.Function`` and asserts that
``torch.autograd.gradcheck`` gives the same verdict.
"""
from __future__ import annotations

import warnings

import numpy as np
import pytest

import agcheck
from agcheck import GradcheckError
from agcheck.backends.numpy_backend import MissingDerivativeError, NumpyBackend

FAST = pytest.mark.parametrize("fast_mode", [False, True], ids=["slow", "fast"])
JACOBIAN = "Jacobian mismatch for output"
FORWARD = "Jacobian computed with forward mode mismatch"


def rng():
    return np.random.default_rng(1234)


# -- a real function of two inputs with two outputs ---------------------------------------------


def f_real(x, y):
    return np.sin(x) * y, np.sum(x * x)


def vjp_real(inputs, cots):
    x, y = inputs
    g0, g1 = cots
    return np.cos(x) * y * g0 + 2 * x * g1, np.sin(x) * g0


def jvp_real(inputs, tangents):
    x, y = inputs
    tx, ty = tangents
    return np.cos(x) * y * tx + np.sin(x) * ty, np.sum(2 * x * tx)


def real_inputs():
    r = rng()
    return r.standard_normal((2, 3)), r.standard_normal((2, 3))


@FAST
def test_correct_real_derivatives_pass(fast_mode):
    x, y = real_inputs()
    assert agcheck.gradcheck(f_real, (x, y), backend="numpy", vjp=vjp_real, jvp=jvp_real,
                             check_forward_ad=True, fast_mode=fast_mode,
                             check_batched_grad=True, check_batched_forward_grad=True)


def _scaled(inputs, cots):
    gx, gy = vjp_real(inputs, cots)
    return 2 * gx, gy


def _swapped(inputs, cots):
    gx, gy = vjp_real(inputs, cots)
    return gy, gx


def _one_entry_off(inputs, cots):
    gx, gy = vjp_real(inputs, cots)
    gy = gy.copy()
    gy[1, 2] += 0.1 * cots[0][1, 2]
    return gx, gy


def _forgets_second_output(inputs, cots):
    x, y = inputs
    g0, _ = cots
    return np.cos(x) * y * g0, np.sin(x) * g0


BROKEN_VJPS = {
    "scaled": (_scaled, "with respect to input 0"),
    "swapped inputs": (_swapped, "with respect to input 0"),
    "one entry off": (_one_entry_off, "with respect to input 1"),
    "ignores an output": (_forgets_second_output, "output 1 with respect to input 0"),
}


@FAST
@pytest.mark.parametrize("name", list(BROKEN_VJPS))
def test_broken_real_vjp_fails(name, fast_mode):
    vjp, phrase = BROKEN_VJPS[name]
    x, y = real_inputs()
    with pytest.raises(GradcheckError, match=JACOBIAN) as info:
        agcheck.gradcheck(f_real, (x, y), backend="numpy", vjp=vjp, fast_mode=fast_mode)
    assert phrase in str(info.value)
    assert agcheck.gradcheck(f_real, (x, y), backend="numpy", vjp=vjp, fast_mode=fast_mode,
                             raise_exception=False) is False


def _jvp_scaled(inputs, tangents):
    a, b = jvp_real(inputs, tangents)
    return a * 1.01, b


def _jvp_wrong_sum(inputs, tangents):
    x, _ = inputs
    tx, _ = tangents
    a, _ = jvp_real(inputs, tangents)
    return a, np.sum(x * tx)  # half the derivative


@FAST
@pytest.mark.parametrize("jvp", [_jvp_scaled, _jvp_wrong_sum], ids=["scaled", "half"])
def test_broken_jvp_fails(jvp, fast_mode):
    x, y = real_inputs()
    with pytest.raises(GradcheckError, match=FORWARD):
        agcheck.gradcheck(f_real, (x, y), backend="numpy", jvp=jvp, check_forward_ad=True,
                          check_backward_ad=False, fast_mode=fast_mode)
    assert agcheck.gradcheck(f_real, (x, y), backend="numpy", jvp=jvp_real, check_forward_ad=True,
                             check_backward_ad=False, fast_mode=fast_mode)


# -- matrix product: a transposed gradient ---------------------------------------------------


def f_matmul(a, b):
    return a @ b


def vjp_matmul(inputs, cots):
    a, b = inputs
    (g,) = cots
    return g @ b.T, a.T @ g


def jvp_matmul(inputs, tangents):
    a, b = inputs
    ta, tb = tangents
    return ta @ b + a @ tb


def jvp_matmul_transposed(inputs, tangents):
    a, b = inputs
    ta, tb = tangents
    return ta @ b + a @ tb.T  # the tangent of b transposed


@FAST
def test_matmul_correct_and_transposed(fast_mode):
    r = rng()
    a, b = r.standard_normal((3, 3)), r.standard_normal((3, 3))
    assert agcheck.gradcheck(f_matmul, (a, b), backend="numpy", vjp=vjp_matmul, jvp=jvp_matmul,
                             check_forward_ad=True, fast_mode=fast_mode)
    bad_vjp = lambda inputs, cots: (cots[0] @ inputs[1], inputs[0].T @ cots[0])  # b, not b.T
    with pytest.raises(GradcheckError, match="output 0 with respect to input 0"):
        agcheck.gradcheck(f_matmul, (a, b), backend="numpy", vjp=bad_vjp, fast_mode=fast_mode)
    with pytest.raises(GradcheckError, match=FORWARD + " for output 0 with respect to input 1"):
        agcheck.gradcheck(f_matmul, (a, b), backend="numpy", jvp=jvp_matmul_transposed,
                          check_forward_ad=True, check_backward_ad=False, fast_mode=fast_mode)


# -- complex numbers: torch's convention, JAX's convention, a missing conj --------------------


def _z():
    r = rng()
    return r.standard_normal(4) + 1j * r.standard_normal(4)


def _x():
    return rng().standard_normal(4)


# each case: fn, inputs, torch-convention vjp, JAX-convention vjp, jvp
COMPLEX_CASES = {
    # holomorphic: torch's gradient is c * conj(f'), JAX's ct * f'
    "square": (lambda z: z * z, lambda: (_z(),),
               lambda i, c: (c[0] * np.conj(2 * i[0]),),
               lambda i, c: (c[0] * 2 * i[0],),
               lambda i, t: 2 * i[0] * t[0]),
    # C -> R: |z|^2, torch gives 2 z c, JAX 2 conj(z) c
    "abs squared": (lambda z: (z * np.conj(z)).real, lambda: (_z(),),
                    lambda i, c: (2 * i[0] * c[0],),
                    lambda i, c: (2 * np.conj(i[0]) * c[0],),
                    lambda i, t: 2 * np.real(np.conj(i[0]) * t[0])),
    # R -> C: exp(i x); the gradient of a real input is real in both conventions
    "phase": (lambda x: np.exp(1j * x), lambda: (_x(),),
              lambda i, c: (np.real(c[0] * np.conj(1j * np.exp(1j * i[0]))),),
              lambda i, c: (np.real(c[0] * 1j * np.exp(1j * i[0])),),
              lambda i, t: 1j * np.exp(1j * i[0]) * t[0]),
    # C x R -> C, anti-holomorphic in z: f = conj(z) * x (for conj both conventions agree)
    "conj times real": (lambda z, x: np.conj(z) * x, lambda: (_z(), _x()),
                        lambda i, c: (np.conj(c[0]) * i[1], np.real(c[0] * i[0])),
                        lambda i, c: (np.conj(c[0]) * i[1], np.real(c[0] * np.conj(i[0]))),
                        lambda i, t: np.conj(t[0]) * i[1] + np.conj(i[0]) * t[1]),
}


@FAST
@pytest.mark.parametrize("name", list(COMPLEX_CASES))
def test_complex_torch_convention_passes(name, fast_mode):
    fn, inputs, vjp_t, _, jvp = COMPLEX_CASES[name]
    assert agcheck.gradcheck(fn, inputs(), backend="numpy", vjp=vjp_t, jvp=jvp,
                             check_forward_ad=True, fast_mode=fast_mode)


@FAST
@pytest.mark.parametrize("name", list(COMPLEX_CASES))
def test_complex_jax_convention_passes_when_declared(name, fast_mode):
    fn, inputs, _, vjp_j, _ = COMPLEX_CASES[name]
    assert agcheck.gradcheck(fn, inputs(), backend="numpy", vjp=vjp_j, convention="jax",
                             fast_mode=fast_mode)


@FAST
@pytest.mark.parametrize("name", ["square", "abs squared"])
def test_complex_convention_mixups_fail(name, fast_mode):
    fn, inputs, vjp_t, vjp_j, _ = COMPLEX_CASES[name]
    # a JAX-convention vjp checked as torch's, and the other way round: a missing conj
    with pytest.raises(GradcheckError, match="part of complex outputs only, Jacobian mismatch|" + JACOBIAN):
        agcheck.gradcheck(fn, inputs(), backend="numpy", vjp=vjp_j, fast_mode=fast_mode)
    with pytest.raises(GradcheckError, match=JACOBIAN):
        agcheck.gradcheck(fn, inputs(), backend="numpy", vjp=vjp_t, convention="jax", fast_mode=fast_mode)


@FAST
def test_complex_missing_conj_fails(fast_mode):
    def vjp_no_conj(inputs, cots):  # square's gradient without the conj
        return (cots[0] * 2 * inputs[0],)

    with pytest.raises(GradcheckError, match="While considering the (real|imaginary) part of complex outputs only"):
        agcheck.gradcheck(lambda z: z * z, (_z(),), backend="numpy", vjp=vjp_no_conj, fast_mode=fast_mode)


@FAST
def test_complex_broken_jvp_fails(fast_mode):
    fn, inputs, _, _, _ = COMPLEX_CASES["conj times real"]

    def jvp_without_conj(i, t):
        return t[0] * i[1] + np.conj(i[0]) * t[1]

    with pytest.raises(GradcheckError, match="complex inputs only, Jacobian computed with forward mode mismatch"):
        agcheck.gradcheck(fn, inputs(), backend="numpy", jvp=jvp_without_conj, check_forward_ad=True,
                          check_backward_ad=False, fast_mode=fast_mode)


# -- parity with torch.autograd.gradcheck on the same NumPy code -------------------------------


def _torch_function(fn, vjp, n_inputs):
    torch = pytest.importorskip("torch")

    class Wrapped(torch.autograd.Function):
        @staticmethod
        def forward(ctx, *xs):
            ctx.save_for_backward(*xs)
            arrays = tuple(x.detach().numpy() for x in xs)
            return torch.from_numpy(np.asarray(fn(*arrays)).copy())

        @staticmethod
        def backward(ctx, g):
            arrays = tuple(x.detach().numpy() for x in ctx.saved_tensors)
            grads = vjp(arrays, (g.detach().resolve_conj().numpy(),))
            return tuple(torch.from_numpy(np.asarray(v).copy()) for v in grads)

    return Wrapped.apply


PARITY = {
    "matmul ok": (f_matmul, vjp_matmul, True),
    "matmul transposed": (f_matmul, lambda i, c: (c[0] @ i[1], i[0].T @ c[0]), False),
    "square ok": (COMPLEX_CASES["square"][0], COMPLEX_CASES["square"][2], True),
    "square jax convention": (COMPLEX_CASES["square"][0], COMPLEX_CASES["square"][3], False),
    "abs squared ok": (COMPLEX_CASES["abs squared"][0], COMPLEX_CASES["abs squared"][2], True),
    "abs squared jax convention": (COMPLEX_CASES["abs squared"][0], COMPLEX_CASES["abs squared"][3], False),
}


@FAST
@pytest.mark.parametrize("name", list(PARITY))
def test_same_verdict_as_torch(name, fast_mode):
    torch = pytest.importorskip("torch")
    fn, vjp, expected = PARITY[name]
    if fn is f_matmul:
        r = rng()
        arrays = (r.standard_normal((3, 3)), r.standard_normal((3, 3)))
    else:
        arrays = (_z(),)
    ours = agcheck.gradcheck(fn, arrays, backend="numpy", vjp=vjp, fast_mode=fast_mode, raise_exception=False)
    tensors = tuple(torch.from_numpy(a.copy()).requires_grad_() for a in arrays)
    theirs = torch.autograd.gradcheck(_torch_function(fn, vjp, len(arrays)), tensors, fast_mode=fast_mode,
                                      raise_exception=False)
    assert ours == theirs == expected


# -- the other checks: grad_output scaling, reentrancy, undefined grads, batched -----------------


def test_vjp_not_multiplied_by_cotangent_fails():
    x = _x()

    def vjp(inputs, cots):
        # correct for every non-zero cotangent, but not zero for a zero one
        return (np.cos(inputs[0]) * cots[0] + (0.0 if np.any(cots[0]) else 1e-3),)

    with pytest.raises(GradcheckError, match="backward not multiplied by grad_output"):
        agcheck.gradcheck(np.sin, (x,), backend="numpy", vjp=vjp)


def test_nondeterministic_vjp_fails_and_nondet_tol_accepts_it():
    x = _x()
    noise = np.random.default_rng(7)

    def vjp(inputs, cots):
        return (np.cos(inputs[0]) * cots[0] * (1 + 1e-9 * noise.random()),)

    with pytest.raises(GradcheckError, match="Backward is not reentrant"):
        agcheck.gradcheck(np.sin, (x,), backend="numpy", vjp=vjp)
    assert agcheck.gradcheck(np.sin, (x,), backend="numpy", vjp=vjp, nondet_tol=1e-6)


def test_undefined_gradients_are_none_or_zero():
    r = rng()
    x, unused = r.standard_normal(3), r.standard_normal(3)

    def fn(x, unused):
        return np.exp(x)

    assert agcheck.gradcheck(fn, (x, unused), backend="numpy",
                             vjp=lambda i, c: (np.exp(i[0]) * c[0], None),
                             jvp=lambda i, t: np.exp(i[0]) * t[0], check_forward_ad=True)
    # a gradient for the unused input that is not zero: the Jacobian check catches it
    with pytest.raises(GradcheckError, match="with respect to input 1"):
        agcheck.gradcheck(fn, (x, unused), backend="numpy",
                          vjp=lambda i, c: (np.exp(i[0]) * c[0], c[0] * 0.5))


def test_integer_outputs_get_no_cotangent():
    x = _x()
    seen = []

    def fn(x):
        return np.tanh(x), np.argsort(x)

    def vjp(inputs, cots):
        seen.append(cots[1])
        return (cots[0] * (1 - np.tanh(inputs[0]) ** 2),)

    assert agcheck.gradcheck(fn, (x,), backend="numpy", vjp=vjp)
    assert seen and all(c is None for c in seen)


@FAST
def test_batched_checks_loop(fast_mode):
    z = _z()
    fn, _, vjp, _, jvp = COMPLEX_CASES["square"]
    assert agcheck.gradcheck(fn, (z,), backend="numpy", vjp=vjp, jvp=jvp, check_forward_ad=True,
                             check_batched_grad=True, check_batched_forward_grad=True, fast_mode=fast_mode)


# -- configuration, inputs, errors ----------------------------------------------------------------


def test_missing_vjp_is_a_clear_error():
    x = _x()
    with pytest.raises(MissingDerivativeError, match=r"backend='numpy' needs vjp=\.\.\. for reverse-mode checks"):
        agcheck.gradcheck(np.sin, (x,), backend="numpy", jvp=lambda i, t: np.cos(i[0]) * t[0])
    # also with raise_exception=False: a configuration error, not a failed check
    with pytest.raises(MissingDerivativeError):
        agcheck.gradcheck(np.sin, (x,), backend="numpy", raise_exception=False)
    with pytest.raises(MissingDerivativeError, match=r"needs jvp=\.\.\. for forward-mode checks"):
        agcheck.gradcheck(np.sin, (x,), backend="numpy", vjp=lambda i, c: (np.cos(i[0]) * c[0],),
                          check_forward_ad=True)
    assert agcheck.gradcheck(np.sin, (x,), backend="numpy", jvp=lambda i, t: np.cos(i[0]) * t[0],
                             check_forward_ad=True, check_backward_ad=False)


def test_inference_picks_numpy_for_numpy_arrays():
    x = _x()
    assert agcheck.gradcheck(np.sin, (x,), vjp=lambda i, c: (np.cos(i[0]) * c[0],))
    assert agcheck.gradcheck(np.sin, x, vjp=lambda i, c: np.cos(i[0]) * c[0])  # a bare array, a bare gradient


def test_bad_options():
    with pytest.raises(ValueError, match="convention"):
        agcheck.gradcheck(np.sin, (_x(),), backend="numpy", convention="tensorflow")
    with pytest.raises(TypeError, match="vjp must be callable"):
        agcheck.gradcheck(np.sin, (_x(),), backend="numpy", vjp=3)
    with pytest.raises(TypeError, match="takes the keywords"):
        agcheck.gradcheck(np.sin, (_x(),), backend="numpy", vjpp=np.cos)
    with pytest.raises(ValueError, match="at least one floating point or complex input"):
        agcheck.gradcheck(lambda n: n * 1.0, (np.arange(3),), backend="numpy", vjp=lambda i, c: ())


def test_wrt_selects_inputs():
    r = rng()
    x, y = r.standard_normal(3), r.standard_normal(3)

    def vjp(inputs, cots):
        return (np.sin(inputs[0]) * cots[0],)  # d/dy only

    assert agcheck.gradcheck(f_real, (x, y), backend="numpy", wrt=1,
                             vjp=lambda i, c: (np.sin(i[0]) * c[0],))
    # one gradient per argument is accepted too
    assert agcheck.gradcheck(f_real, (x, y), backend="numpy", wrt=[1],
                             vjp=lambda i, c: (None, np.sin(i[0]) * c[0]))
    with pytest.raises(ValueError, match="wrt position 2"):
        agcheck.gradcheck(f_real, (x, y, 3), backend="numpy", wrt=2, vjp=vjp)
    with pytest.raises(GradcheckError, match="with respect to input 0"):
        agcheck.gradcheck(f_real, (x, y), backend="numpy", wrt=1, vjp=lambda i, c: (np.cos(i[0]) * c[0],))


def test_wrong_shape_and_dtype_of_gradient():
    x = rng().standard_normal((2, 3))
    with pytest.raises(GradcheckError, match=r"vjp returned a gradient of shape \(3, 2\)"):
        agcheck.gradcheck(np.sin, (x,), backend="numpy", vjp=lambda i, c: ((np.cos(i[0]) * c[0]).T,))
    with pytest.raises(GradcheckError, match="complex gradient"):
        agcheck.gradcheck(np.sin, (x,), backend="numpy", vjp=lambda i, c: (np.cos(i[0]) * c[0] + 0j,))
    with pytest.raises(ValueError, match="vjp returned 3 gradients"):
        agcheck.gradcheck(np.sin, (x,), backend="numpy", vjp=lambda i, c: (c[0], c[0], c[0]))


def test_inputs_and_global_rng_untouched():
    r = rng()
    x, y = r.standard_normal((2, 3)), r.standard_normal((2, 3))
    before = (x.copy(), y.copy())
    np.random.seed(5)
    state = np.random.get_state()
    assert agcheck.gradcheck(f_real, (x, y), backend="numpy", vjp=vjp_real, jvp=jvp_real,
                             check_forward_ad=True, fast_mode=True, check_batched_grad=True)
    assert agcheck.gradcheck(f_real, (x, y), backend="numpy", vjp=vjp_real)
    assert np.array_equal(x.view(np.int64), before[0].view(np.int64))
    assert np.array_equal(y.view(np.int64), before[1].view(np.int64))
    after = np.random.get_state()
    assert after[0] == state[0] and np.array_equal(after[1], state[1]) and after[2:] == state[2:]


def test_read_only_inputs_are_fine():
    x = _x()
    x.setflags(write=False)
    assert agcheck.gradcheck(np.sin, (x,), backend="numpy", vjp=lambda i, c: (np.cos(i[0]) * c[0],))


def test_float32_warns_like_torch():
    x = _x().astype(np.float32)
    with pytest.warns(UserWarning, match="not a double precision"):
        agcheck.gradcheck(np.sin, (x,), backend="numpy", vjp=lambda i, c: (np.cos(i[0]) * c[0],),
                          atol=1e-2, rtol=1e-2, eps=1e-3)


def test_float32_gradient_cast_like_torchs_engine():
    x = _x().astype(np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # float64 gradients for a float32 input are cast, as torch's autograd engine does
        assert agcheck.gradcheck(np.sin, (x,), backend="numpy", atol=1e-2, rtol=1e-2, eps=1e-3,
                                 vjp=lambda i, c: (np.cos(i[0].astype(np.float64)) * c[0],))


def test_scalar_output_and_numpy_scalars():
    x = _x()
    assert agcheck.gradcheck(lambda x: np.sum(x ** 3), (x,), backend="numpy",
                             vjp=lambda i, c: (3 * i[0] ** 2 * c[0],),
                             jvp=lambda i, t: np.sum(3 * i[0] ** 2 * t[0]), check_forward_ad=True)


def test_gradgradcheck_is_not_supported():
    with pytest.raises(NotImplementedError, match="cannot check second derivatives"):
        agcheck.gradgradcheck(np.sin, (_x(),), backend="numpy", vjp=lambda i, c: (np.cos(i[0]) * c[0],))


def test_other_array_api_namespace():
    """The backend works on any array-API namespace: here torch tensors (no autograd),
    with the function and its vjp written against array_api_compat."""
    torch = pytest.importorskip("torch")
    import array_api_compat

    def fn(x):
        xp = array_api_compat.array_namespace(x)
        return xp.sin(x) * x

    def vjp(inputs, cots):
        xp = array_api_compat.array_namespace(inputs[0])
        x = inputs[0]
        return ((xp.cos(x) * x + xp.sin(x)) * cots[0],)

    x = torch.linspace(-1, 1, 5, dtype=torch.float64)
    before = x.clone()
    assert agcheck.gradcheck(fn, (x,), backend="numpy", vjp=vjp)
    assert agcheck.gradcheck(fn, (x,), backend="numpy", vjp=vjp, fast_mode=True)
    with pytest.raises(GradcheckError, match=JACOBIAN):
        agcheck.gradcheck(fn, (x,), backend="numpy", vjp=lambda i, c: (vjp(i, c)[0] * 1.1,))
    assert torch.equal(x, before)


def test_backend_object_and_capabilities():
    be = agcheck.get_backend("numpy", vjp=vjp_real)
    assert isinstance(be, NumpyBackend)
    assert "reverse" in be.capabilities and "forward" not in be.capabilities
    both = be.with_options(jvp=jvp_real)
    assert {"reverse", "forward"} <= both.capabilities and both.vjp is vjp_real
    assert agcheck.get_backend("numpy") is agcheck.get_backend("numpy")  # the unconfigured instance
    x, y = real_inputs()
    assert agcheck.gradcheck(f_real, (x, y), backend=both, check_forward_ad=True)


def test_allclose_semantics():
    be = NumpyBackend()
    a = np.array([1.0, np.inf, 2.0])
    assert be.allclose(a, a.copy(), 0.0, 0.0)
    assert not be.allclose(np.array([np.nan]), np.array([np.nan]), 1.0, 1.0)
    assert be.allclose(np.array([1.0 + 1e-6]), np.array([1.0]), 1e-5, 0.0)
    assert not be.allclose(np.array([1.1]), np.array([1.0]), 1e-5, 1e-5)
    assert be.allclose(np.array([1.0 + 1e-9j]), np.array([1.0]), 0.0, 1e-8)


def test_fn_modifying_its_input_is_named_and_undone():
    x = _x()
    before = x.copy()

    def fn(x):
        x *= 2
        return x

    with pytest.raises(ValueError, match="fn modified input 0 in place"):
        agcheck.gradcheck(fn, (x,), backend="numpy", vjp=lambda i, c: (2 * c[0],))
    assert np.array_equal(x, before)


def test_five_point_stencil_and_auto_eps_on_float32():
    x = np.linspace(-1, 1, 6).astype(np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert agcheck.gradcheck(np.tanh, (x,), backend="numpy", eps="auto", stencil="five-point",
                                 vjp=lambda i, c: ((1 - np.tanh(i[0]) ** 2) * c[0],))
        assert not agcheck.gradcheck(np.tanh, (x,), backend="numpy", eps="auto", stencil="five-point",
                                     vjp=lambda i, c: ((1 - np.tanh(i[0]) ** 2) * c[0] * 1.01,),
                                     raise_exception=False)


@pytest.mark.parametrize("scale, passes", [(1.0, True), (1.1, False)])
def test_derivatives_written_into_one_reused_buffer_are_copied(scale, passes):
    """A vjp/jvp that fills and returns the same preallocated array at every call (the
    ``out=`` style): each result is copied as it comes, as torch's checker copies each
    gradient, so the right derivative passes and a wrong one fails."""
    grad_buf, tangent_buf = np.empty(4), np.empty(4)

    def vjp(inputs, cotangents):
        np.multiply(np.cos(inputs[0]) * scale, cotangents[0], out=grad_buf)
        return (grad_buf,)

    def jvp(inputs, tangents):
        np.multiply(np.cos(inputs[0]) * scale, tangents[0], out=tangent_buf)
        return (tangent_buf,)

    x = np.random.default_rng(3).standard_normal(4)
    for kw in (dict(), dict(check_forward_ad=True), dict(fast_mode=True)):
        got = agcheck.gradcheck(np.sin, (x,), backend="numpy", vjp=vjp, jvp=jvp, raise_exception=False, **kw)
        assert got is passes, kw
