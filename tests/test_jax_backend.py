"""The JAX backend: ``agcheck.gradcheck(fn, inputs, backend="jax")``.

Every gradient test has two halves: the correct function passes, and the same function
with a broken derivative (scaled, one entry off, conjugated, not batched correctly, ...)
fails. ``test_crossvalidate_*`` compare the JAX backend's numerical and analytical
Jacobians with the torch backend's on the same function written in both frameworks: they
agree to 1e-10 in float64, which proves that JAX's complex convention is mapped into
torch's.

JAX's 64-bit mode is turned on for each test by a fixture (``jax.enable_x64``), which
also asserts that JAX's configuration is unchanged afterwards.
"""
from __future__ import annotations

import warnings

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

import agcheck  # noqa: E402
from agcheck import GradcheckError, OutputTypeError  # noqa: E402

X64_AT_IMPORT = bool(jax.config.jax_enable_x64)


@pytest.fixture(autouse=True)
def x64():
    """Float64 for the test; JAX's configuration must be as it was afterwards."""
    before = bool(jax.config.jax_enable_x64)
    with jax.enable_x64(True):
        yield
    assert bool(jax.config.jax_enable_x64) == before == X64_AT_IMPORT


def rand(*shape, seed=0, complex=False):
    rng = np.random.default_rng(seed)
    values = rng.standard_normal(shape)
    if complex:
        values = values + 1j * rng.standard_normal(shape)
    return jnp.asarray(values)


def passes(fn, inputs, **kw):
    return agcheck.gradcheck(fn, inputs, backend="jax", **kw)


def fails(fn, inputs, match, **kw):
    with pytest.raises(GradcheckError, match=match):
        agcheck.gradcheck(fn, inputs, backend="jax", **kw)


MODES = [pytest.param(False, id="slow"), pytest.param(True, id="fast")]
JACOBIAN = r"Jacobian mismatch for output \d+ with respect to input \d+"
FORWARD_JACOBIAN = r"Jacobian computed with forward mode mismatch"


# --------------------------------------------------------------------------------------
# functions with hand-written derivatives: correct, and broken in one way each
# --------------------------------------------------------------------------------------


def sin_with_vjp(scale=1.0, off_entry=None):
    """sin with a custom VJP: scaled by ``scale``, or with entry ``off_entry`` wrong."""

    @jax.custom_vjp
    def f(x):
        return jnp.sin(x)

    def bwd(x, g):
        grad = g * jnp.cos(x) * scale
        if off_entry is not None:
            grad = grad.at[off_entry].add(0.1 * g[off_entry])
        return (grad,)

    f.defvjp(lambda x: (jnp.sin(x), x), bwd)
    return f


def sin_with_jvp(scale=1.0):
    @jax.custom_jvp
    def f(x):
        return jnp.sin(x)

    @f.defjvp
    def f_jvp(primals, tangents):
        (x,), (t,) = primals, tangents
        return jnp.sin(x), jnp.cos(x) * t * scale

    return f


def matmul_with_vjp(transposed=False):
    """x @ w with a custom VJP; ``transposed`` gives w's gradient the wrong layout."""

    @jax.custom_vjp
    def f(x, w):
        return x @ w

    def bwd(res, g):
        x, w = res
        gw = x.T @ g
        if transposed:
            gw = jnp.reshape(gw.T, gw.shape)
        return g @ w.T, gw

    f.defvjp(lambda x, w: (x @ w, (x, w)), bwd)
    return f


@pytest.mark.parametrize("fast", MODES)
def test_elementwise(fast):
    x = rand(2, 3)
    assert passes(lambda x: jnp.sin(x) * x, (x,), fast_mode=fast)
    assert passes(sin_with_vjp(), (x,), fast_mode=fast)
    fails(sin_with_vjp(scale=1.1), (x,), JACOBIAN, fast_mode=fast)
    fails(sin_with_vjp(off_entry=(1, 2)), (x,), JACOBIAN, fast_mode=fast)


@pytest.mark.parametrize("fast", MODES)
def test_raise_exception_false_returns_false(fast):
    x = rand(2, 3)
    assert agcheck.gradcheck(sin_with_vjp(scale=1.1), (x,), raise_exception=False, fast_mode=fast) is False
    assert agcheck.gradcheck(sin_with_vjp(), (x,), raise_exception=False, fast_mode=fast) is True


def test_one_entry_off_is_located_in_slow_mode():
    x = rand(2, 3)
    with pytest.raises(GradcheckError) as info:
        passes(sin_with_vjp(off_entry=(0, 1)), (x,))
    numbers = info.value.args[0]
    assert "numerical" in numbers and "analytical" in numbers


@pytest.mark.parametrize("fast", MODES)
def test_matmul_two_inputs(fast):
    x, w = rand(2, 3, seed=1), rand(3, 3, seed=2)
    assert passes(lambda x, w: jnp.tanh(x @ w), (x, w), fast_mode=fast)
    assert passes(matmul_with_vjp(), (x, w), fast_mode=fast)
    fails(matmul_with_vjp(transposed=True), (x, w), "with respect to input 1", fast_mode=fast)


@pytest.mark.parametrize("fast", MODES)
def test_multiple_outputs(fast):
    x, w = rand(2, 3, seed=1), rand(3, 3, seed=2)
    bad = sin_with_vjp(scale=0.5)
    assert passes(lambda x, w: (x @ w, jnp.exp(x), jnp.sum(w)), (x, w), fast_mode=fast)
    fails(lambda x, w: (x @ w, bad(x)), (x, w), "mismatch for output 1 with respect to input 0", fast_mode=fast)


@pytest.mark.parametrize("fast", MODES)
def test_forward_mode(fast):
    x = rand(2, 3)
    kw = dict(check_forward_ad=True, check_backward_ad=False, fast_mode=fast)
    assert passes(lambda x: jnp.sin(x) * x, (x,), **kw)
    assert passes(sin_with_jvp(), (x,), **kw)
    fails(sin_with_jvp(scale=1.1), (x,), FORWARD_JACOBIAN, **kw)


def test_broken_custom_jvp_breaks_reverse_mode_too():
    # JAX derives the VJP by transposing the custom JVP: the broken JVP shows in both
    x = rand(2, 3)
    assert passes(sin_with_jvp(), (x,), check_forward_ad=True)
    fails(sin_with_jvp(scale=1.1), (x,), JACOBIAN)


def test_not_multiplied_by_grad_output():
    @jax.custom_vjp
    def f(x):
        return jnp.sin(x)

    f.defvjp(lambda x: (jnp.sin(x), x), lambda x, g: (jnp.cos(x),))
    # one element: the Jacobian itself is right, only the scaling by grad_output is wrong
    fails(f, (rand(1),), "backward not multiplied by grad_output")
    assert passes(sin_with_vjp(), (rand(1),))


def test_gradient_dtype():
    # JAX does not cast a custom_vjp's gradient to its input's dtype (torch's engine does)
    f32 = with_vjp(jnp.sin, lambda x, g: ((g * jnp.cos(x)).astype(jnp.float32),))
    x = rand(3)
    assert passes(with_vjp(jnp.sin, lambda x, g: (g * jnp.cos(x),)), (x,), check_grad_dtypes=True)
    fails(f32, (x,), "Analytical gradient has incorrect size", check_grad_dtypes=True)


def test_not_reentrant():
    calls = [0]

    @jax.custom_vjp
    def f(x):
        return jnp.sin(x)

    def bwd(x, g):
        calls[0] += 1  # the backward differs, a little, from call to call
        return (g * jnp.cos(x) * (1 + 1e-12 * calls[0]),)

    f.defvjp(lambda x: (jnp.sin(x), x), bwd)
    x = rand(3)
    fails(f, (x,), "Backward is not reentrant")
    assert passes(f, (x,), nondet_tol=1e-6)


# --------------------------------------------------------------------------------------
# batched gradients (jax.vmap of the VJP / JVP)
# --------------------------------------------------------------------------------------


def _swap_batch(v):
    """Identity on one vector; reverses the batch when vmapped (a batching bug)."""
    v = np.asarray(v)
    return v if v.ndim == 1 else np.ascontiguousarray(v[::-1])


def _callback(v):
    return jax.pure_callback(_swap_batch, jax.ShapeDtypeStruct(v.shape, v.dtype), v, vmap_method="broadcast_all")


def test_batched_backward():
    @jax.custom_vjp
    def f(x):
        return jnp.sin(x)

    f.defvjp(lambda x: (jnp.sin(x), x), lambda x, g: (jnp.cos(x) * _callback(g),))
    x = rand(3)
    assert passes(sin_with_vjp(), (x,), check_batched_grad=True)
    assert passes(f, (x,))  # one at a time the VJP is right
    fails(f, (x,), "batched gradient differs", check_batched_grad=True)


def test_batched_forward():
    @jax.custom_jvp
    def f(x):
        return jnp.sin(x)

    @f.defjvp
    def f_jvp(primals, tangents):
        (x,), (t,) = primals, tangents
        return jnp.sin(x), jnp.cos(x) * _callback(t)

    x = rand(3)
    kw = dict(check_forward_ad=True, check_backward_ad=False)
    assert passes(sin_with_jvp(), (x,), check_batched_forward_grad=True, **kw)
    assert passes(f, (x,), **kw)
    fails(f, (x,), "batched forward-mode gradient differs", check_batched_forward_grad=True, **kw)


# --------------------------------------------------------------------------------------
# pytrees and wrt=
# --------------------------------------------------------------------------------------


def mlp(params, data, scale):
    hidden = jnp.tanh(data @ params["w"] + params["b"])
    return {"out": hidden * scale, "norm": jnp.sum(params["w"] ** 2)}


def test_pytree_inputs_and_outputs():
    params = {"w": rand(3, 2, seed=3), "b": rand(2, seed=4)}
    data = rand(2, 3, seed=5)
    assert passes(mlp, (params, data, 2))
    assert passes(mlp, (params, data, 2), fast_mode=True, check_forward_ad=True)

    bad = sin_with_vjp(scale=1.1)

    def broken(params, data, scale):
        return mlp({"w": params["w"], "b": bad(params["b"])}, data, scale)

    fails(broken, (params, data, 2), JACOBIAN)
    fails(broken, (params, data, 2), JACOBIAN, fast_mode=True)


def test_wrt_chooses_the_checked_inputs():
    params = {"w": rand(3, 2, seed=3), "b": rand(2, seed=4)}
    data = rand(2, 3, seed=5)
    bad = sin_with_vjp(scale=1.1)

    def broken_in_data(params, data, scale):
        return mlp(params, bad(data), scale)

    # only the parameters are checked: the broken data gradient is not looked at
    assert passes(broken_in_data, (params, data, 2), wrt=0)
    assert passes(broken_in_data, (params, data, 2), wrt=(0,), fast_mode=True)
    fails(broken_in_data, (params, data, 2), JACOBIAN, wrt=1)
    fails(broken_in_data, (params, data, 2), JACOBIAN, wrt=(0, -2))


def test_wrt_counts_inputs_in_messages_among_checked_leaves():
    x, y = rand(3, seed=1), rand(3, seed=2)
    bad = sin_with_vjp(scale=2.0)
    # with wrt=1, y is the only (hence the 0th) checked input
    fails(lambda x, y: x * bad(y), (x, y), "with respect to input 0", wrt=1)
    fails(lambda x, y: x * bad(y), (x, y), "with respect to input 1")


def test_wrt_converts_numpy_and_python_numbers():
    x = np.array([0.5, -1.0, 2.0])
    assert passes(lambda x, s: jnp.sin(x) * s, (x, 1.5), wrt=(0, 1))
    fails(lambda x, s: sin_with_vjp(scale=1.1)(x) * s, (x, 1.5), JACOBIAN, wrt=0)


def test_wrt_errors():
    x = rand(3)
    with pytest.raises(ValueError, match="out of range"):
        passes(lambda x, n: x * n, (x, 2), wrt=2)
    with pytest.raises(ValueError, match="no floating point or complex"):
        passes(lambda x, n: x * n, (x, jnp.arange(3)), wrt=1)
    with pytest.raises(ValueError, match="more than once"):
        passes(lambda x, n: x * n, (x, 2), wrt=(0, -2))
    with pytest.raises(TypeError, match="wrt"):
        passes(lambda x: x, (x,), wrt="x")
    with pytest.raises(TypeError, match="wrt"):
        passes(lambda x: x, (x,), wrtt=0)


def test_no_checked_inputs_and_bad_outputs():
    with pytest.raises(ValueError, match="at least one input"):
        passes(lambda n: n * 2, (jnp.arange(3),))
    with pytest.raises(OutputTypeError):
        passes(lambda x: (jnp.sin(x), "not an array"), (rand(3),))


def test_backend_inferred_from_jax_inputs():
    x = rand(3)
    assert agcheck.gradcheck(lambda x: jnp.sin(x), (x,))
    with pytest.raises(GradcheckError):
        agcheck.gradcheck(sin_with_vjp(scale=1.1), (x,))
    assert agcheck.gradcheck(lambda p: jnp.sin(p["x"]), ({"x": x},))


# --------------------------------------------------------------------------------------
# complex numbers: JAX's VJP is the conjugate of torch's; the backend maps it
# --------------------------------------------------------------------------------------


def with_vjp(primal, bwd):
    f = jax.custom_vjp(primal)
    f.defvjp(lambda *a: (primal(*a), a), lambda res, g: bwd(*res, g))
    return f


def test_trace_vjp_is_in_torch_convention():
    z = jnp.asarray([1 + 2j, 3 - 1j])
    be = agcheck.get_backend("jax")
    fn, args = be.prepare(lambda z: jnp.sum(jnp.imag(z)), (z,))
    grad = be.trace(fn, args, [0]).vjp([0], [jnp.ones(())])[0]
    np.testing.assert_array_equal(np.asarray(grad), [1j, 1j])  # torch's answer
    # JAX's own answer is the conjugate
    np.testing.assert_array_equal(np.asarray(jax.grad(lambda z: jnp.sum(jnp.imag(z)))(z)), [-1j, -1j])


@pytest.mark.parametrize("fast", MODES)
def test_complex_to_real(fast):
    z = rand(3, complex=True)

    def im(z):
        return jnp.imag(z) * 2.0

    # JAX's convention for C -> R: the cotangent of Im(z) is -1j
    right = with_vjp(im, lambda z, g: (g * -2j,))
    conjugated = with_vjp(im, lambda z, g: (g * 2j,))
    assert passes(im, (z,), fast_mode=fast)
    assert passes(right, (z,), fast_mode=fast)
    fails(conjugated, (z,), JACOBIAN, fast_mode=fast)

    def sq(z):
        return jnp.real(z * jnp.conj(z))

    assert passes(with_vjp(sq, lambda z, g: (2 * g * jnp.conj(z),)), (z,), fast_mode=fast)
    fails(with_vjp(sq, lambda z, g: (2 * g * z,)), (z,), JACOBIAN, fast_mode=fast)


@pytest.mark.parametrize("fast", MODES)
def test_complex_to_complex(fast):
    z = rand(3, complex=True)

    def cube(z):
        return z * z * z

    right = with_vjp(cube, lambda z, g: (g * 3 * z * z,))  # JAX: g times f'(z)
    conjugated = with_vjp(cube, lambda z, g: (g * jnp.conj(3 * z * z),))  # torch's formula
    assert passes(lambda z: z * z * jnp.conj(z) + 1j * z, (z,), fast_mode=fast)
    assert passes(right, (z,), fast_mode=fast)
    fails(conjugated, (z,), "While considering the (real|imaginary) part of complex outputs only", fast_mode=fast)


@pytest.mark.parametrize("fast", MODES)
def test_real_to_complex(fast):
    x = rand(3)
    c = 1.0 + 2.0j

    def rot(x):
        return x * c

    right = with_vjp(rot, lambda x, g: (jnp.real(g * c),))
    conjugated = with_vjp(rot, lambda x, g: (jnp.real(g * jnp.conj(c)),))
    assert passes(lambda x: jnp.exp(1j * x) * x, (x,), fast_mode=fast)
    assert passes(right, (x,), fast_mode=fast)
    fails(conjugated, (x,), "part of complex outputs only", fast_mode=fast)


@pytest.mark.parametrize("fast", MODES)
def test_complex_forward_mode(fast):
    z = rand(3, complex=True)

    @jax.custom_jvp
    def cube(z):
        return z * z * z

    conj_tangent = [False]

    @cube.defjvp
    def cube_jvp(primals, tangents):
        (z,), (t,) = primals, tangents
        d = 3 * z * z
        return cube(z), (jnp.conj(d) if conj_tangent[0] else d) * t

    kw = dict(check_forward_ad=True, fast_mode=fast, check_batched_forward_grad=True)
    assert passes(lambda z: z * jnp.conj(z) * z, (z,), **kw)
    assert passes(cube, (z,), **kw)
    conj_tangent[0] = True
    fails(cube, (z,), "part of complex inputs only", check_backward_ad=False, **kw)


def test_complex_batched_grad():
    z = rand(3, complex=True)
    assert passes(lambda z: z * jnp.conj(z) * z, (z,), check_batched_grad=True)
    assert passes(lambda z, x: jnp.sin(z) * x, (z, rand(3)), check_batched_grad=True, fast_mode=True)


# --------------------------------------------------------------------------------------
# second order
# --------------------------------------------------------------------------------------


def test_gradgradcheck():
    x, w = rand(2, 3, seed=1), rand(3, 3, seed=2)
    assert agcheck.gradgradcheck(lambda x, w: jnp.sin(x @ w), (x, w), backend="jax")
    assert agcheck.gradgradcheck(lambda x, w: jnp.sin(x @ w), (x, w), wrt=1, check_fwd_over_rev=True)
    w = rand(2, 3, seed=2)

    # first derivative right, second wrong: cos(x) is a constant to the second derivative
    stopped = with_vjp(jnp.sin, lambda x, g: (g * jax.lax.stop_gradient(jnp.cos(x)),))
    assert passes(stopped, (x,))
    with pytest.raises(GradcheckError, match=JACOBIAN):
        agcheck.gradgradcheck(stopped, (x,), backend="jax")
    # ... and through wrt=: the broken function of w is not checked with wrt=0
    assert agcheck.gradgradcheck(lambda x, w: jnp.sin(x) * stopped(w), (x, w), wrt=0)
    with pytest.raises(GradcheckError, match=JACOBIAN):
        agcheck.gradgradcheck(lambda x, w: jnp.sin(x) * stopped(w), (x, w), wrt=1)


def test_gradgradcheck_complex():
    z = rand(3, complex=True)
    assert agcheck.gradgradcheck(lambda z: z * z * jnp.conj(z), (z,), check_fwd_over_rev=True)
    broken = with_vjp(lambda z: z * z, lambda z, g: (g * 2 * jax.lax.stop_gradient(z),))
    with pytest.raises(GradcheckError):
        agcheck.gradgradcheck(broken, (z,))


# --------------------------------------------------------------------------------------
# precision, configuration, inputs and RNG untouched
# --------------------------------------------------------------------------------------


def test_float32_warns_how_to_enable_x64():
    with jax.enable_x64(False):
        x = jnp.asarray([0.5, -1.0, 2.0])
        assert x.dtype == jnp.float32
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            assert passes(jnp.sin, (x,), eps=1e-2, atol=1e-2, rtol=1e-2)
        texts = " ".join(str(w.message) for w in record)
        assert "not a double precision" in texts  # the core's warning, as torch's
        assert "jax_enable_x64" in texts and "jax.enable_x64(True)" in texts  # the backend's hint
        assert not jax.config.jax_enable_x64
    assert jax.config.jax_enable_x64


def test_float32_with_x64_on_warns_without_the_hint():
    x = jnp.asarray([0.5, -1.0, 2.0], dtype=jnp.float32)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        passes(jnp.sin, (x,), eps=1e-2, atol=1e-2, rtol=1e-2)
    texts = [str(w.message) for w in record]
    assert any("not a double precision" in t for t in texts)
    assert not any("jax_enable_x64" in t for t in texts)


def test_float64_does_not_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert passes(jnp.sin, (rand(3),))


def test_config_and_inputs_unchanged():
    params = {"w": rand(3, 2, seed=3), "b": rand(2, seed=4)}
    data = np.asarray(rand(2, 3, seed=5))
    before = {k: np.asarray(v).copy() for k, v in params.items()}
    data_before = data.copy()
    keys, np_state = list(params), np.random.get_state()
    x64 = jax.config.jax_enable_x64

    passes(mlp, (params, data, 2), wrt=(0, 1), check_forward_ad=True, fast_mode=True)
    with pytest.raises(GradcheckError):
        passes(sin_with_vjp(scale=2.0), (params["b"],))

    assert list(params) == keys
    for k, v in params.items():
        np.testing.assert_array_equal(np.asarray(v), before[k])
    np.testing.assert_array_equal(data, data_before)
    assert jax.config.jax_enable_x64 == x64
    state = np.random.get_state()
    assert state[0] == np_state[0] and np.array_equal(state[1], np_state[1]) and state[2:] == np_state[2:]


def test_masked_is_refused():
    # JAX has no sparse layouts: masked=True has nothing to select
    with pytest.raises(ValueError, match="masked=True"):
        passes(jnp.sin, (rand(3),), masked=True)
    with pytest.raises(ValueError, match="masked=True"):
        agcheck.gradgradcheck(jnp.sin, (rand(3),), masked=True)
    assert passes(jnp.sin, (rand(3),), masked=False)
    fails(sin_with_vjp(scale=1.1), (rand(3),), JACOBIAN, masked=False)


def test_allclose_semantics():
    be = agcheck.get_backend("jax")
    a = jnp.asarray([1.0, jnp.inf, 3.0])
    assert be.allclose(a, a, rtol=0, atol=0)
    assert not be.allclose(jnp.asarray([jnp.nan]), jnp.asarray([jnp.nan]), rtol=1, atol=1)
    assert be.allclose(jnp.asarray([1.0 + 1e-6]), jnp.asarray([1.0], dtype=jnp.float32), rtol=0, atol=1e-5)
    assert not be.allclose(jnp.asarray([1.1]), jnp.asarray([1.0]), rtol=0.05, atol=0.0)
    assert be.allclose(jnp.asarray([1.0 + 1j]), jnp.asarray([1.0]), rtol=0, atol=1.0)


# --------------------------------------------------------------------------------------
# cross-validation with the torch backend: the same Jacobians, to 1e-10
# --------------------------------------------------------------------------------------


def _pairs():
    """(name, jax fn, torch fn, input specs); a spec is a shape and whether it is complex."""
    import torch

    return [
        ("elementwise", lambda x: x * x * x - 2 * x, lambda x: x * x * x - 2 * x, [((2, 3), False)]),
        ("matmul", lambda x, w: jnp.tanh(x @ w), lambda x, w: torch.tanh(x @ w), [((2, 3), False), ((3, 2), False)]),
        ("outputs", lambda x, w: (x @ w, jnp.exp(x) * 2), lambda x, w: (x @ w, torch.exp(x) * 2),
         [((2, 3), False), ((3, 2), False)]),
        ("c_to_r", lambda z: jnp.real(z * jnp.conj(z)) + 3 * jnp.imag(z),
         lambda z: torch.real(z * z.conj()) + 3 * torch.imag(z), [((3,), True)]),
        ("c_to_c", lambda z: z * z * jnp.conj(z) + 1j * z, lambda z: z * z * z.conj() + 1j * z, [((3,), True)]),
        ("r_to_c", lambda x: jnp.exp(1j * x) * x, lambda x: torch.exp(1j * x) * x, [((3,), False)]),
        ("mixed", lambda z, x: (z * x, jnp.abs(z) * x), lambda z, x: (z * x, torch.abs(z) * x),
         [((3,), True), ((3,), False)]),
    ]


#: the finite-difference step of the cross-validation: large enough that a one-ulp
#: difference between the two frameworks' evaluations of fn (tanh, exp, matmul
#: summation order) stays below 1e-10 after division by 2 * EPS
EPS = 1e-4


def _jacobians(be, fn, args):
    """Everything the core compares: numerical and analytical Jacobians (reverse, on the
    real/imaginary pieces for complex outputs, and forward), and a complex-cotangent VJP."""
    from agcheck.core import jacobian as jac
    from agcheck.core.wirtinger import output_part

    result = {}
    checked = be.checked_positions(args)
    inputs = [args[p] for p in checked]
    full = be.trace(fn, args, checked)
    pieces = {"whole": fn}
    if any(be.is_complex(o) for o in full.outputs):
        pieces = {"real": output_part(be, fn, "real"), "imag": output_part(be, fn, "imag")}
    for name, piece in pieces.items():
        trace = be.trace(piece, args, checked)
        for p in checked:
            for k, j in jac.numerical_jacobians(be, piece, args, p, trace.outputs, EPS).items():
                result[f"{name} numerical out{k} in{p}"] = be.to_numpy(j)
        for k in range(len(trace.outputs)):
            for i, j in enumerate(jac.analytical_jacobians_reverse(be, trace, k, inputs)):
                result[f"{name} reverse out{k} in{i}"] = be.to_numpy(j)
    for k, o in enumerate(full.outputs):
        for i, j in enumerate(jac.analytical_jacobians_reverse(be, full, k, inputs)):
            result[f"full reverse out{k} in{i}"] = be.to_numpy(j)
        shape = tuple(o.shape)
        v = np.random.default_rng(k).standard_normal(shape) + 1j * np.random.default_rng(k + 9).standard_normal(shape)
        v = v if be.is_complex(o) else v.real
        grads = full.vjp([k], [_like(be, v, o)])
        for i, (g, x) in enumerate(zip(grads, inputs)):
            # torch's None (an unused input) is JAX's zero gradient
            result[f"vjp out{k} in{i}"] = np.zeros(x.shape, be.to_numpy(x).dtype) if g is None else be.to_numpy(g)
    for i, per_output in enumerate(jac.analytical_jacobians_forward(be, fn, args, checked)):
        for k, j in enumerate(per_output):
            result[f"forward out{k} in{i}"] = be.to_numpy(j)
    return result


def _like(be, values, like):
    if be.name == "torch":
        import torch

        return torch.as_tensor(values, dtype=like.dtype)
    return jnp.asarray(values, dtype=like.dtype)


@pytest.mark.parametrize("name", ["elementwise", "matmul", "outputs", "c_to_r", "c_to_c", "r_to_c", "mixed"])
def test_crossvalidate_jacobians_with_torch(name):
    torch = pytest.importorskip("torch")
    _, jfn, tfn, specs = next(p for p in _pairs() if p[0] == name)
    values = [np.asarray(rand(*shape, seed=s, complex=c)) for s, (shape, c) in enumerate(specs)]
    jbe, tbe = agcheck.get_backend("jax"), agcheck.get_backend("torch")
    jfn, jargs = jbe.prepare(jfn, tuple(jnp.asarray(v) for v in values))
    tfn, targs = tbe.prepare(tfn, tuple(torch.tensor(v, requires_grad=True) for v in values))
    from_jax, from_torch = _jacobians(jbe, jfn, jargs), _jacobians(tbe, tfn, targs)
    assert from_jax.keys() == from_torch.keys()
    for key in from_torch:
        assert from_jax[key].dtype == from_torch[key].dtype, key
        np.testing.assert_allclose(from_jax[key], from_torch[key], rtol=1e-10, atol=1e-10, err_msg=key)
    # and both verdicts are a pass
    assert agcheck.gradcheck(jfn, jargs, backend=jbe, check_forward_ad=True)


def test_crossvalidate_verdicts_of_broken_complex_vjp_with_torch():
    torch = pytest.importorskip("torch")
    z = rand(3, complex=True)

    class Cube(torch.autograd.Function):
        @staticmethod
        def forward(ctx, z):
            ctx.save_for_backward(z)
            return z * z * z

        @staticmethod
        def backward(ctx, g):
            (z,) = ctx.saved_tensors
            return g * (3 * z * z).conj()  # torch's convention: g times conj(f'(z))

    zt = torch.tensor(np.asarray(z), requires_grad=True)
    assert torch.autograd.gradcheck(Cube.apply, (zt,))
    assert agcheck.gradcheck(Cube.apply, (zt,))
    # the same formula in a JAX custom_vjp is wrong (it is torch's, not JAX's, convention)
    torch_formula = with_vjp(lambda z: z * z * z, lambda z, g: (g * jnp.conj(3 * z * z),))
    assert agcheck.gradcheck(torch_formula, (z,), raise_exception=False) is False


@pytest.mark.parametrize("scale", [1.0, 1.01])
def test_a_dense_failure_decided_from_batched_rows_gives_the_reference_engines_message(scale, monkeypatch):
    # NumPy prints jax arrays, so only the printed rows and columns are computed exactly
    from agcheck.engine import cost

    from .helpers import run_check

    monkeypatch.setattr(cost, "ENGINE_FROM_CALLS", 0)  # the engine, however few calls the loop makes
    w = rand(60, 60, seed=3) / 8

    @jax.custom_vjp
    def f(x):
        return jnp.tanh(w @ x)

    def f_fwd(x):
        y = jnp.tanh(w @ x)
        return y, y

    def f_bwd(y, g):
        return (scale * (w.T @ (g * (1 - y * y))),)

    f.defvjp(f_fwd, f_bwd)
    x = rand(60, seed=4)
    r = run_check(f, (x,), backend="jax")
    assert r.verdict is (scale == 1.0)
    if scale == 1.0:
        return
    (event,) = [e for e in r.engine_log if e.path == "failure"]
    assert event.decision == "confirmed" and event.figures["exact_rows"] <= 7
    messages = []
    for engine in ("auto", "reference"):
        with pytest.raises(GradcheckError) as info:
            agcheck.gradcheck(f, (x,), backend="jax", engine=engine)
        messages.append(info.value.report.message.rstrip("\n").split("\n\n")[0])  # torch's text, without the summary
    assert messages[0] == messages[1] and "..." in messages[0]


@pytest.mark.parametrize("scale", [1.0, 1.01])
def test_a_vjp_wrong_in_the_real_parts_pass_only_fails_there(scale):
    """A function with complex outputs is checked on the imaginary parts, then the real
    parts; a VJP 1% off in the real parts' pass only passes the first and fails the second."""
    from agcheck.core.run import CheckRun
    from agcheck.gradcheck import all_checks
    from agcheck.options import GradcheckOptions

    @jax.custom_vjp
    def f(x):
        return jnp.exp(1j * x) * x

    def bwd(x, g):  # JAX's convention: the cotangent pulled back through a real input
        d = 1j * jnp.exp(1j * x) * x + jnp.exp(1j * x)
        in_real_pass = jnp.any(jnp.real(g) != 0)  # the imaginary parts' cotangents are imaginary
        return (jnp.real(g * d) * jnp.where(in_real_pass, scale, 1.0),)

    f.defvjp(lambda x: (f(x), x), bwd)
    x = rand(6, seed=2)
    run = CheckRun(f, (x,), agcheck.get_backend("jax"), GradcheckOptions(engine="reference"))
    if scale == 1.0:
        all_checks(run)  # raises on a failure
    else:
        with pytest.raises(GradcheckError, match="real part of complex outputs only, Jacobian mismatch"):
            all_checks(run)


@pytest.mark.parametrize("scale", [1.0, 1.01])
def test_gradgradcheck_reuses_the_forward_while_only_the_cotangents_move(scale):
    """Concrete evaluations of the VJP with the inputs' values unchanged reuse the last
    forward and its pullback (fewer calls of fn); a second derivative 1% off still fails."""
    calls = []

    @jax.custom_vjp
    def cube(x):
        return x ** 3

    def bwd(x, g):  # right first derivative; the second is ``scale`` times 6 x g
        return (g * 3 * x * (scale * x + (1 - scale) * jax.lax.stop_gradient(x)),)

    cube.defvjp(lambda x: (cube(x), x), bwd)

    def fn(x):
        calls.append(1)
        return cube(x)

    x = rand(5, seed=3)
    if scale == 1.0:
        assert agcheck.gradgradcheck(fn, (x,), backend="jax", engine="reference")
        # 2 x 5 moves of x, each a forward; the cotangent's 10 moves reuse one
        assert len(calls) < 2 * 10
    else:
        with pytest.raises(GradcheckError, match="Jacobian mismatch"):
            agcheck.gradgradcheck(fn, (x,), backend="jax", engine="reference")


@pytest.mark.parametrize("dtype", ["float32", "float64", "complex64", "complex128", "bfloat16", "float16"])
def test_an_element_moved_on_the_host_rounds_as_jax_moves_it(dtype):
    """Slow mode's moved input, x[idx] +- step in x's dtype, is the array JAX's own
    ``x.at[idx].add(step)`` gives, bit for bit (moved by NumPy for the IEEE dtypes, by
    JAX for the others), for steps that are not representable in x's dtype."""
    from agcheck.backends.jax_backend import JaxPerturber

    rng = np.random.default_rng(7)
    values = rng.standard_normal((3, 5)) * np.array([1e-8, 1e-3, 1.0, 1e3, 1e8])
    if dtype.startswith("complex"):
        values = values + 1j * rng.standard_normal((3, 5))
    x = jnp.asarray(values).astype(dtype)
    steps = [1e-6, 1e-3, 0.1, 1 / 3] + ([1e-6j, 1j / 3] if dtype.startswith("complex") else [])
    perturber = JaxPerturber((x,), 0, lambda out: (out,))
    for flat in range(x.size):
        index = np.unravel_index(flat, x.shape)
        for step in steps:
            for sign in (-1, 1):
                (moved,) = perturber.evaluate_element(lambda a: a, flat, step, sign)
                expected = x.at[index].subtract(step) if sign < 0 else x.at[index].add(step)
                assert moved.dtype == x.dtype
                assert np.array_equal(np.asarray(moved).view(np.uint8), np.asarray(expected).view(np.uint8))
    assert (perturber._host is not None) == (dtype in ("float32", "float64", "complex64", "complex128"))
    assert np.array_equal(np.asarray(x), np.asarray(jnp.asarray(values).astype(dtype)))  # x itself unmoved


@pytest.mark.parametrize("dtype", ["float32", "float64", "complex64", "complex128", "bfloat16"])
def test_batched_element_moves_and_one_hots_are_jaxs_own_bits(dtype):
    """The batched engine's moved copies (row ``b``: element ``flat[b]`` +- step) and
    one-hot tangents, made on the host for the IEEE dtypes, are what JAX's scatter gives,
    bit for bit, and come back uncommitted, as x is."""
    be = agcheck.get_backend("jax")
    rng = np.random.default_rng(3)
    values = rng.standard_normal((2, 3, 4)) * 10.0 ** rng.integers(-6, 6, (2, 3, 4))
    if dtype.startswith("complex"):
        values = values + 1j * rng.standard_normal((2, 3, 4))
    x = jnp.asarray(values).astype(dtype)
    flat = [0, 5, 5, 23, 11]
    steps = [1e-6, 1 / 3] + ([1j / 3] if dtype.startswith("complex") else [])
    base = jnp.reshape(x, (-1,))
    for step in steps:
        for sign in (-1, 1):
            moved = be.element_moves(x, flat, step, sign)
            for b, k in enumerate(flat):
                expected = base.at[k].subtract(step) if sign < 0 else base.at[k].add(step)
                assert np.array_equal(np.asarray(moved[b]).reshape(-1).view(np.uint8),
                                      np.asarray(expected).view(np.uint8))
            assert moved.dtype == x.dtype and not moved.committed
    hots = be.one_hots(x, flat)
    assert hots.shape == (len(flat), *x.shape) and hots.dtype == x.dtype and not hots.committed
    assert np.array_equal(np.asarray(hots).reshape(len(flat), -1), np.eye(x.size, dtype=np.float64)[flat])


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("stencil", ["central", "five-point"])
def test_stencil_combined_on_the_host_is_ieee_and_within_an_ulp_of_xlas(dtype, stencil):
    """Finite differences combined by NumPy (JAX backend, real float32/64) are IEEE's
    correctly rounded results, as torch's are: the same dtype, NaN and infinities where
    the same arithmetic on JAX arrays puts them, and finite values within one unit in the
    last place of XLA's (whose division by the step may round the other way)."""
    from agcheck.stencil import STENCILS

    be = agcheck.get_backend("jax")
    rng = np.random.default_rng(11)
    st = STENCILS[stencil]
    values = [rng.standard_normal(400) * 10.0 ** rng.integers(-30, 30, 400) for _ in st.offsets]
    values[0][:3] = [np.inf, np.nan, -np.inf]
    arrays = [jnp.asarray(v).astype(dtype) for v in values]
    for eps in (1e-6, 1e-3, 1 / 3):
        with np.errstate(all="ignore"):
            combined = be.combine(st, arrays, eps)
            ieee = st.combine([np.asarray(a) for a in arrays], eps)
        expected = np.asarray(st.combine(arrays, eps))  # jax.numpy's arithmetic
        assert combined.dtype == expected.dtype == np.dtype(dtype) and not combined.committed
        combined = np.asarray(combined)
        assert np.array_equal(combined.view(np.uint8), ieee.view(np.uint8))
        finite = np.isfinite(expected)
        assert np.array_equal(np.isnan(combined), np.isnan(expected))
        assert np.array_equal(combined[~finite & ~np.isnan(expected)], expected[~finite & ~np.isnan(expected)])
        ulp = np.spacing(np.abs(expected[finite]))
        assert np.all(np.abs(combined[finite] - expected[finite]) <= ulp)


def test_a_failing_accounts_arithmetic_compiles_nothing_of_its_own():
    """agcheck's element-by-element check of a JAX function, as the drop-in runs it for a
    failure's full account (``account="full"``), does its own arithmetic (moves, differences, row stacking, comparisons) on
    the host: with JAX's own check run first (it compiles what ``fn`` needs at this
    shape), no program of that arithmetic is compiled, only ``fn``'s (here ``sin``,
    ``cos`` and ``multiply``). Before, about 20 small programs were compiled per new shape."""
    import logging

    from jax._src import public_test_util

    original = getattr(public_test_util.check_grads, "agcheck_original", public_test_util.check_grads)

    @jax.custom_jvp
    def f(x):
        return jnp.sin(x)

    f.defjvp(lambda p, t: (jnp.sin(p[0]), 1.1 * jnp.cos(p[0]) * t[0]))
    x = np.linspace(-1, 1, 17 * 3).reshape(17, 3)
    with pytest.raises(AssertionError):
        original(f, (x,), 1, ["fwd", "rev"])
    compiled = []

    class Compiles(logging.Handler):
        def emit(self, record):
            message = record.getMessage()
            if message.startswith("Compiling "):
                compiled.append(message.split()[1])

    handler = Compiles()
    logger = logging.getLogger("jax")
    logger.addHandler(handler)
    try:
        with jax.log_compiles(), pytest.raises(AssertionError, match="agcheck"):
            agcheck.check_grads(f, (x,), 1, ["fwd", "rev"], account="full")
    finally:
        logger.removeHandler(handler)
    assert not set(compiled) - {"jit(sin)", "jit(cos)", "jit(multiply)"}, compiled


@pytest.mark.parametrize("scale", [1.0, 1.1])
def test_the_batched_engine_takes_jax_batches_whole(scale, monkeypatch):
    """On JAX every new batch size compiles (whole_batches): the batched engine moves all
    of an input's elements in one batched evaluation, and computes all forward rows in
    one batched JVP, instead of ramping up through sizes that would each compile; the
    right derivative passes and a scaled one fails."""
    from agcheck.backends.jax_backend import JaxBackend

    sizes = {"evaluate": [], "jvp": []}
    evaluate, jvp_along = JaxBackend.evaluate_batch, JaxBackend.jvp_along

    def recorded_evaluate(self, fn, args, position, stacked):
        sizes["evaluate"].append(int(stacked.shape[0]))
        return evaluate(self, fn, args, position, stacked)

    def recorded_jvp(self, fn, args, checked, j, stacked):
        sizes["jvp"].append(int(stacked.shape[0]))
        return jvp_along(self, fn, args, checked, j, stacked)

    monkeypatch.setattr(JaxBackend, "evaluate_batch", recorded_evaluate)
    monkeypatch.setattr(JaxBackend, "jvp_along", recorded_jvp)

    @jax.custom_jvp
    def f(x):
        return jnp.tanh(x)

    f.defjvp(lambda p, t: (jnp.tanh(p[0]), scale * (1 - jnp.tanh(p[0]) ** 2) * t[0]))
    x = rand(40, seed=5)
    if scale == 1.0:
        assert agcheck.gradcheck(f, (x,), backend="jax", engine="batched", check_forward_ad=True)
    else:
        with pytest.raises(GradcheckError, match="Jacobian mismatch"):
            agcheck.gradcheck(f, (x,), backend="jax", engine="batched", check_forward_ad=True)
    # the probe's two moves along a direction, then all 40 elements' two moves at once
    assert max(sizes["evaluate"]) == 2 * 40 and set(sizes["evaluate"]) <= {2, 2 * 40}, sizes
    assert set(sizes["jvp"]) <= {40}, sizes


def _scaled_square(scale):
    @jax.custom_jvp
    def square(z):
        return z * z

    square.defjvp(lambda p, t: (p[0] * p[0], scale * 2 * p[0] * t[0]))
    return square


_STRICT_CASES = {
    "complex to complex": (lambda f: f, True),
    "complex to real": (lambda f: (lambda z: jnp.real(f(z) * jnp.conj(f(z)))), True),
    "real to complex": (lambda f: (lambda x: f(jax.lax.complex(x, 2 * x))), False),
}


@pytest.mark.parametrize("case", sorted(_STRICT_CASES))
@pytest.mark.parametrize("how", ["reference", "auto", "fast", "forward", "forward fast"])
@pytest.mark.parametrize("scale", [1.0, 1.1])
def test_complex_checks_run_under_strict_dtype_promotion(case, how, scale):
    """Under ``jax_numpy_dtype_promotion="strict"`` (JAX's own test suite runs so) a real
    array does not promote to complex: agcheck's own arithmetic (the imaginary axis of a
    complex input's differences, fast mode's moves along a real direction) promotes
    explicitly, so complex checks run there as anywhere: the right derivative passes, a
    scaled one fails."""
    wrap, complex_input = _STRICT_CASES[case]
    f = wrap(_scaled_square(scale))
    x = rand(5, seed=9, complex=complex_input)
    kw = dict(backend="jax", fast_mode="fast" in how, check_forward_ad=how.startswith("forward"))
    if how in ("reference", "auto"):
        kw["engine"] = how
    with jax.numpy_dtype_promotion("strict"):
        if scale == 1.0:
            assert agcheck.gradcheck(f, (x,), **kw)
        else:
            with pytest.raises(GradcheckError, match="Jacobian mismatch"):
                agcheck.gradcheck(f, (x,), **kw)


def test_a_failing_complex_check_grads_is_accounted_for_under_strict_promotion():
    """The drop-in's full account of a failing level compares full Jacobians under strict dtype
    promotion too (it said it could not, with a TypePromotionError, for complex inputs)."""
    x = rand(2, 3, seed=4, complex=True).astype(jnp.complex64)
    with jax.numpy_dtype_promotion("strict"), pytest.raises(AssertionError) as failure:
        agcheck.check_grads(_scaled_square(1.5), (x,), 1, ["fwd", "rev"], account="full")
    assert "agcheck (full Jacobians of this level, slow mode)" in str(failure.value)
    assert "could not compare" not in str(failure.value)


@pytest.mark.parametrize("committed", [False, True])
def test_moved_copies_and_host_results_are_committed_only_where_the_input_was(committed):
    """A committed argument is a new cache key for every jitted function it meets (each
    would compile again), so slow mode's moved copies and the backend's host results are
    committed to a device only where the input itself was, and then to its device."""
    from agcheck.backends.jax_backend import JaxPerturber

    be = agcheck.get_backend("jax")
    x = jnp.arange(4.0)
    if committed:
        x = jax.device_put(x, jax.devices()[0])
    assert x.committed is committed
    seen = []

    def fn(a):
        seen.append((a.committed, a.devices()))
        return a

    JaxPerturber((x,), 0, lambda out: (out,)).evaluate_element(fn, 1, 0.5, 1)
    assert seen == [(committed, x.devices())]
    xp = be.xp(x)
    for result in (xp.reshape(x, (2, 2)), xp.stack([x, x]), be.one_hot(x, 2), be.element_moves(x, [0, 3], 0.5, -1)):
        assert result.committed is committed and result.devices() == x.devices()


@pytest.mark.parametrize("scale", [1.0, 1.1])
def test_a_jax_check_runs_the_engine_only_from_many_more_loop_calls(scale, monkeypatch):
    """On JAX (``whole_batches``: every new shape compiles) the engine runs from
    ``COMPILED_ENGINE_FACTOR`` times the loop calls it runs from elsewhere: a check of 16
    elements (64 calls, 48 in forward mode) goes to the reference engine at once, and the
    plan says so with its figures, however its first calls compiled. Both verdicts hold
    either way."""
    from agcheck.engine import cost

    from .helpers import run_check

    @jax.custom_jvp
    def f(x):
        return jnp.tanh(x)

    f.defjvp(lambda p, t: (jnp.tanh(p[0]), scale * (1 - jnp.tanh(p[0]) ** 2) * t[0]))
    x = rand(16, seed=2)
    monkeypatch.setattr(cost, "ENGINE_FROM_CALLS", 10)  # 64 calls would take the engine elsewhere
    r = run_check(f, (x,), backend="jax", check_forward_ad=True)  # f never called before: its first calls compile
    plans = [(e.decision, e.figures) for e in r.engine_log if e.path == "plan"]
    limit = 10 * cost.COMPILED_ENGINE_FACTOR
    # reverse mode, then forward mode (a failure in reverse mode ends the check)
    expected = [("reference", {"loop_calls": 64, "engine_from_calls": limit}),
                ("reference", {"loop_calls": 48, "engine_from_calls": limit})]
    assert plans == expected[:2 if scale == 1.0 else 1]
    assert r.verdict is (scale == 1.0)
    monkeypatch.setattr(cost, "ENGINE_FROM_CALLS", 0)
    engine = run_check(f, (x,), backend="jax")
    assert [e.decision for e in engine.engine_log if e.path == "plan"] == ["engine"] and len(engine.engine_log) > 1
    assert engine.verdict is (scale == 1.0)


