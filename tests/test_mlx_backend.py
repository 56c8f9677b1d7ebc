"""The MLX backend: ``agcheck.gradcheck(fn, inputs, backend="mlx")``.

Every gradient test has two halves: the correct function passes, and the same function
with a broken derivative (an ``mx.custom_function`` whose ``vjp`` or ``jvp`` is scaled by
two, conjugated, or whose second derivative is lost) fails.

MLX 0.32 computes float64 ``sin``, ``cos``, ``exp`` and ``erf`` on the CPU in float32
(ml-explore/mlx#3047): finite differences of those at float64 steps are float32 noise, so
the float64 functions here use ``tanh``, ``log1p``, powers and matrix products, which MLX
computes in float64.
"""
from __future__ import annotations

import subprocess
import sys
import warnings

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core")

import agcheck  # noqa: E402
from agcheck import GradcheckError  # noqa: E402
from agcheck.backends.registry import get_backend  # noqa: E402

MODES = [pytest.param(False, id="slow"), pytest.param(True, id="fast")]
MISMATCH = "Jacobian mismatch for output 0 with respect to input 0"
FORWARD_MISMATCH = "Jacobian computed with forward mode mismatch for output 0 with respect to input 0"
#: float32 steps and tolerances (MLX's complex dtype is complex64)
LOW = {"eps": 1e-3, "atol": 1e-2, "rtol": 1e-2}


def rand(*shape, seed=0, dtype=None, complex=False):
    rng = np.random.default_rng(seed)
    values = rng.standard_normal(shape)
    if complex:
        values = values + 1j * rng.standard_normal(shape)
    return mx.array(values, dtype=dtype or (mx.complex64 if complex else mx.float64))


def passes(fn, inputs, **kw):
    return agcheck.gradcheck(fn, inputs, backend="mlx", **kw)


def fails(fn, inputs, match=MISMATCH, **kw):
    with pytest.raises(GradcheckError, match=match):
        agcheck.gradcheck(fn, inputs, backend="mlx", **kw)


def f(x):
    return mx.tanh(x) * x


def df(x):
    return (1 - mx.tanh(x) ** 2) * x + mx.tanh(x)


def custom(scale_vjp=1.0, scale_jvp=1.0):
    """``f`` as an ``mx.custom_function`` whose vjp and jvp are scaled."""
    @mx.custom_function
    def g(x):
        return f(x)

    @g.vjp
    def g_vjp(primals, cotangent, output):
        return scale_vjp * cotangent * df(primals)

    @g.jvp
    def g_jvp(primals, tangents):
        return scale_jvp * tangents * df(primals)

    return g


def tanh_with_vjp(scale):
    """``mx.tanh`` whose vjp is scaled by ``scale``."""
    @mx.custom_function
    def tanh(x):
        return mx.tanh(x)

    @tanh.vjp
    def tanh_vjp(primals, cotangent, output):
        return scale * cotangent * (1 - output ** 2)

    return tanh


@pytest.fixture(autouse=True)
def _quiet_low_precision():
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Input #.* is not a double precision")
        yield


# -- reverse mode ---------------------------------------------------------------------------
@pytest.mark.parametrize("fast_mode", MODES)
def test_custom_vjp_right_passes_scaled_fails(fast_mode):
    x = rand(3, 4)
    assert passes(f, (x,), fast_mode=fast_mode)
    assert passes(custom(), (x,), fast_mode=fast_mode)
    fails(custom(scale_vjp=2.0), (x,), fast_mode=fast_mode)


def test_message_names_output_and_input_and_prints_both_jacobians():
    x, y = rand(3), rand(3, seed=1)
    with pytest.raises(GradcheckError) as info:
        passes(lambda x, y: (mx.tanh(x) + y, custom(scale_vjp=2.0)(y) * x), (x, y))
    message = str(info.value)
    assert message.startswith("Jacobian mismatch for output 1 with respect to input 1,")
    assert "numerical:array(" in message and "analytical:array(" in message


@pytest.mark.parametrize("engine", ["reference", "batched"])
def test_both_engines_reach_the_same_verdicts(engine):
    w, x = rand(30, 40, seed=3), rand(40)
    assert passes(lambda x: mx.tanh(w @ x), (x,), engine=engine, check_forward_ad=True)
    fails(lambda x: custom(scale_vjp=2.0)(w @ x), (x,), match="Jacobian mismatch", engine=engine)


def test_the_batched_engine_uses_the_batched_forms(monkeypatch):
    from agcheck.backends import mlx_backend

    calls = {"evaluate_batch": 0, "jvp_along": 0, "vjp_batched": 0}

    def spy(cls, name):
        original = getattr(cls, name)

        def counted(*a, **k):
            calls[name] += 1
            return original(*a, **k)

        monkeypatch.setattr(cls, name, counted)

    spy(mlx_backend.MlxBackend, "evaluate_batch")
    spy(mlx_backend.MlxBackend, "jvp_along")
    spy(mlx_backend.MlxTrace, "vjp_batched")
    # 160 outputs: the loop of VJPs makes 320 calls, past cost.BATCHED_VJPS_FROM_CALLS
    w, b = rand(160, 40, seed=3), rand(160, seed=4)
    # the JVP of a matrix product beside a bias: MLX 0.32's vmap fails on it with a zero tangent
    assert passes(lambda x, w: mx.tanh(w @ x + b), (rand(40), w), engine="batched", check_forward_ad=True)
    assert all(calls.values()), calls


@pytest.mark.parametrize("fast_mode", MODES)
def test_several_outputs_integer_outputs_and_unused_inputs(fast_mode):
    x, y, unused = rand(4), rand(4, seed=1), rand(2, seed=2)

    def g(x, y, unused):
        return mx.tanh(x) * y, mx.argmax(x), x > 0, mx.sum(mx.log1p(y * y)), mx.ones((2,), dtype=mx.float64)

    assert passes(g, (x, y, unused), fast_mode=fast_mode, check_forward_ad=True)
    # outputs are counted among the differentiable ones, as torch counts them
    fails(lambda x, y, unused: (mx.argmax(x), mx.tanh(x) * custom(scale_vjp=2.0)(y)), (x, y, unused),
          match="Jacobian mismatch for output 0 with respect to input 1", fast_mode=fast_mode)


def test_checks_beside_the_jacobian():
    x = rand(5)
    assert passes(f, (x,), check_batched_grad=True, check_undefined_grad=True, check_grad_dtypes=True,
                  nondet_tol=0.0)
    assert passes(f, (x,), check_forward_ad=True, check_batched_forward_grad=True, check_backward_ad=True)
    assert passes(f, (x,), stencil="five-point")
    assert passes(mx.compile(f), (x,), check_forward_ad=True)
    fails(mx.compile(custom(scale_vjp=2.0)), (x,))


# -- forward mode ---------------------------------------------------------------------------
@pytest.mark.parametrize("fast_mode", MODES)
def test_forward_mode_right_passes_broken_fails(fast_mode):
    x = rand(3, 2)
    forward_only = {"check_forward_ad": True, "check_backward_ad": False, "check_undefined_grad": False}
    assert passes(f, (x,), fast_mode=fast_mode, **forward_only)
    assert passes(custom(), (x,), fast_mode=fast_mode, **forward_only)
    # forward mode reads the jvp alone: a broken vjp does not matter there
    assert passes(custom(scale_vjp=2.0), (x,), fast_mode=fast_mode, **forward_only)
    fails(custom(scale_jvp=2.0), (x,), match=FORWARD_MISMATCH, fast_mode=fast_mode, **forward_only)
    fails(custom(scale_jvp=2.0), (x,), match=FORWARD_MISMATCH, fast_mode=fast_mode, check_forward_ad=True)


# -- second order ---------------------------------------------------------------------------
def cube_losing_its_second_derivative():
    @mx.custom_function
    def cube(x):
        return x ** 3

    @cube.vjp
    def cube_vjp(primals, cotangent, output):
        return cotangent * 3 * mx.stop_gradient(primals) ** 2  # right, but constant in x

    return cube


@pytest.mark.parametrize("fast_mode", MODES)
def test_gradgradcheck_right_passes_wrong_second_derivative_fails(fast_mode):
    x, y = rand(4), rand(4, seed=1)
    assert agcheck.gradgradcheck(lambda x, y: (mx.tanh(x) * y, mx.sum(x ** 3)), (x, y), fast_mode=fast_mode)
    assert agcheck.gradgradcheck(lambda x: x ** 3, (x,), fast_mode=fast_mode, check_fwd_over_rev=True)
    cube = cube_losing_its_second_derivative()
    assert passes(cube, (x,), fast_mode=fast_mode)  # the first derivative is right
    with pytest.raises(GradcheckError, match=MISMATCH):
        agcheck.gradgradcheck(cube, (x,), fast_mode=fast_mode)
    v = rand(4, seed=5)
    assert agcheck.gradgradcheck(f, (x,), grad_outputs=(v,))


def test_vjp_of_vjp_is_the_second_derivative():
    be = get_backend("mlx")
    x = rand(3)
    c = np.array([1.0, -2.0, 0.5])
    hessians = be.vjp_of_vjp(lambda x: x ** 3, (x,), [0], 0, np.ones(3), [[c]])
    np.testing.assert_allclose(hessians[(0, 0)], [6 * np.asarray(x) * c], rtol=1e-12)


# -- complex --------------------------------------------------------------------------------
def test_complex_convention_is_torchs():
    """Measured: MLX's VJP of Im(z) with the cotangent v is 1j * v, and of z * z it is
    v * conj(2 z), as torch's (JAX's is the conjugate). The backend maps nothing."""
    z = mx.array([0.7 + 0.3j, -1.1 + 2.0j], dtype=mx.complex64)
    v = mx.array([0.5 - 1.5j, 2.0 + 0.25j], dtype=mx.complex64)
    zn, vn = np.asarray(z), np.asarray(v)
    (g,) = mx.vjp(lambda z: [mx.imag(z)], [z], [mx.real(v)])[1]
    np.testing.assert_allclose(np.asarray(g), 1j * vn.real)
    (g,) = mx.vjp(lambda z: [z * z], [z], [v])[1]
    np.testing.assert_allclose(np.asarray(g), vn * np.conj(2 * zn), rtol=1e-6)
    be = get_backend("mlx")
    fn, args = be.prepare(lambda z: z * z * mx.conj(z), (z,))
    (g,) = be.trace(fn, args, [0]).vjp([0], [v])
    want = vn * np.conj(2 * zn * np.conj(zn)) + np.conj(vn) * zn * zn  # torch's convention
    np.testing.assert_allclose(np.asarray(g), want, rtol=1e-5)
    torch = pytest.importorskip("torch")
    zt = torch.tensor(zn, requires_grad=True)
    (gt,) = torch.autograd.grad(zt * zt * zt.conj(), zt, torch.tensor(vn))
    np.testing.assert_allclose(np.asarray(g), gt.resolve_conj().numpy(), rtol=1e-5)


COMPLEX = [
    ("z*z*conj(z)", lambda z: z * z * mx.conj(z)),
    ("1/z", lambda z: 1 / z),
    ("abs(z)", lambda z: mx.abs(z)),
    ("real(z)*imag(z)", lambda z: mx.real(z) * mx.imag(z)),
]


@pytest.mark.parametrize("fast_mode", MODES)
@pytest.mark.parametrize("name,g", COMPLEX, ids=[c[0] for c in COMPLEX])
def test_complex_functions(name, g, fast_mode):
    z = rand(3, complex=True) + 2.0
    assert passes(g, (z,), fast_mode=fast_mode, check_forward_ad=True, **LOW)


def conjugated_square():
    """``z * z`` whose vjp is written in JAX's convention (the conjugate of MLX's)."""
    @mx.custom_function
    def square(z):
        return z * z

    @square.vjp
    def square_vjp(primals, cotangent, output):
        return cotangent * 2 * primals  # MLX (and torch) want cotangent * conj(2 z)

    return square


@pytest.mark.parametrize("fast_mode", MODES)
def test_complex_vjp_in_the_other_convention_fails(fast_mode):
    z = rand(3, complex=True)
    assert passes(lambda z: z * z, (z,), fast_mode=fast_mode, **LOW)
    fails(conjugated_square(), (z,), match="Jacobian mismatch", fast_mode=fast_mode, **LOW)


def test_complex_outputs_of_real_inputs_and_gradgradcheck():
    x = rand(3, dtype=mx.float32)
    assert passes(lambda x: x * (1 + 2j) * x, (x,), check_forward_ad=True, **LOW)
    z = rand(3, complex=True)
    assert agcheck.gradgradcheck(lambda z: z * z * mx.conj(z), (z,), **LOW)


# -- precision ------------------------------------------------------------------------------
def test_float32_and_float16_pass_at_their_tolerances_and_warn():
    x = rand(4, dtype=mx.float32)
    with pytest.warns(UserWarning, match="not a double precision"):
        assert passes(f, (x,), **LOW)
    fails(custom(scale_vjp=2.0), (x,), **LOW)
    half = {"eps": 1e-2, "atol": 5e-2, "rtol": 5e-2}
    x = rand(4, dtype=mx.float16)
    assert passes(f, (x,), check_forward_ad=True, **half)
    fails(custom(scale_vjp=2.0), (x,), **half)


def test_float64_runs_on_the_cpu_stream_in_float64():
    seen = []

    def g(x):
        seen.append((mx.default_stream(mx.default_device()).device, x.dtype))
        return mx.tanh(x) * x

    x = rand(3)
    assert passes(g, (x,), check_forward_ad=True, check_grad_dtypes=True)
    assert agcheck.gradgradcheck(g, (x,))
    assert all(device == mx.cpu and dtype == mx.float64 for device, dtype in seen)
    be = get_backend("mlx")
    (grad,) = be.trace(g, (x,), [0]).vjp([0], [np.ones(3)])
    assert grad.dtype == mx.float64
    with be.precision(True):
        assert mx.default_stream(mx.default_device()).device == mx.cpu


# -- what is checked, and errors ----------------------------------------------------------------
def test_a_none_output_is_an_output_type_error():
    x = rand(3)
    with pytest.raises(agcheck.OutputTypeError, match="NoneType"):
        passes(lambda x: None, (x,))
    with pytest.raises(agcheck.OutputTypeError, match="NoneType"):
        passes(lambda x: (mx.tanh(x), None), (x,), check_forward_ad=True)
    with pytest.raises(agcheck.OutputTypeError, match="ndarray"):
        passes(lambda x: np.ones(3), (x,))


def test_which_inputs_are_checked_and_wrt():
    x, n = rand(3), np.array([0.5, -1.0, 2.0])
    counts = mx.array([1, 2, 3])
    assert get_backend("mlx").checked_positions((x, counts, n, 2.0)) == [0]
    assert passes(lambda x, c, n: mx.tanh(x) * c * mx.array(n, dtype=mx.float64), (x, counts, n))
    assert passes(lambda x, n: mx.tanh(x) * n, (x, n), wrt=(0, 1))  # n made an MLX float64 array
    fails(lambda x, y: custom(scale_vjp=2.0)(y) * x, (x, rand(3, seed=1)), wrt=1, match=MISMATCH)
    with pytest.raises(ValueError, match="wrt names input 1"):
        passes(lambda x, c: x * c, (x, counts), wrt=1)
    with pytest.raises(ValueError, match="no input is a floating point or complex MLX array"):
        passes(lambda c: c * 2, (counts,))


def test_inference_and_inference_does_not_import_mlx():
    x = rand(3)
    assert agcheck.gradcheck(f, (x,))  # backend inferred from the MLX array
    code = (
        "import sys, numpy as np, agcheck\n"
        "assert agcheck.infer_backend((np.ones(3),)).name == 'numpy'\n"
        "assert 'mlx' not in sys.modules, 'inference imported mlx'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_an_input_written_in_place_is_reported_and_restored():
    x = rand(3)
    before = np.array(x)

    def writes(x):
        x[0] = 5.0
        return mx.tanh(x)

    with pytest.raises(agcheck.CheckInputError, match="modified input 0 in place"):
        passes(writes, (x,))
    assert np.array_equal(np.asarray(x), before)


def test_refusals_name_what_mlx_lacks():
    x = rand(3)
    with pytest.raises(ValueError, match="MLX arrays are dense"):
        passes(f, (x,), masked=True)
    with pytest.raises(TypeError, match="bfloat16"):
        passes(f, (x.astype(mx.bfloat16),))


def test_random_states_are_untouched():
    x = rand(4)
    mx.random.seed(3)
    want = np.asarray(mx.random.uniform(shape=(3,)))
    mx.random.seed(3)
    numpy_state = np.random.get_state()[1].copy()
    assert passes(f, (x,), fast_mode=True, check_forward_ad=True)
    assert agcheck.gradgradcheck(f, (x,), fast_mode=True)
    assert np.array_equal(np.asarray(mx.random.uniform(shape=(3,))), want)
    assert np.array_equal(np.random.get_state()[1], numpy_state)


def test_from_numpy_copies_keeps_float64_and_takes_like():
    be = get_backend("mlx")
    values = np.array([1.0, 2.0])
    a = be.from_numpy(values)
    values[0] = 9.0
    assert a.dtype == mx.float64 and np.asarray(a).tolist() == [1.0, 2.0]
    assert be.from_numpy(np.array([1 + 2j])).dtype == mx.complex64  # MLX's widest complex type
    assert be.from_numpy(np.array([1.5]), like=rand(2, dtype=mx.float32)).dtype == mx.float32


# -- crosscheck: torch, JAX and MLX ports --------------------------------------------------------
def _ports():
    torch = pytest.importorskip("torch")
    pytest.importorskip("jax")
    import jax.numpy as jnp

    return {
        "torch": lambda x, y: (torch.tanh(x) * y + torch.log1p(x * x), (x @ y) ** 2),
        "jax": lambda x, y: (jnp.tanh(x) * y + jnp.log1p(x * x), (x @ y) ** 2),
        "mlx": lambda x, y: (mx.tanh(x) * y + mx.log1p(x * x), (x @ y) ** 2),
    }


@pytest.mark.parametrize("fast_mode", MODES)
def test_crosscheck_torch_jax_mlx_agree_and_a_broken_port_is_named(fast_mode):
    ports = _ports()
    rng = np.random.default_rng(0)
    inputs = (rng.standard_normal(3), rng.standard_normal(3))
    result = agcheck.crosscheck(ports, inputs, backends=["torch", "jax", "mlx"], fast_mode=fast_mode)
    assert result and "torch vs mlx" in str(result)
    assert agcheck.crosscheck(ports, inputs, backends=["torch", "jax", "mlx"], order=2, gradcheck=True,
                              fast_mode=fast_mode)
    broken = dict(ports, mlx=lambda x, y: (tanh_with_vjp(2.0)(x) * y + mx.log1p(x * x), (x @ y) ** 2))
    result = agcheck.crosscheck(broken, inputs, backends=["torch", "jax", "mlx"], raise_exception=False,
                                check_forward_ad=False, fast_mode=fast_mode)
    assert not result and "torch and mlx disagree on the reverse-mode derivative" in result.message


def test_crosscheck_complex64_with_torch_and_jax():
    torch = pytest.importorskip("torch")
    pytest.importorskip("jax")
    import jax.numpy as jnp

    rng = np.random.default_rng(1)
    z = (rng.standard_normal(3) + 1j * rng.standard_normal(3)).astype(np.complex64)
    ports = {"torch": lambda z: z * z * torch.conj(z), "jax": lambda z: z * z * jnp.conj(z),
             "mlx": lambda z: z * z * mx.conj(z)}
    assert agcheck.crosscheck(ports, (z,), backends=["torch", "jax", "mlx"], order=2)
    wrong = dict(ports, mlx=lambda z: conjugated_square()(z) * mx.conj(z))
    result = agcheck.crosscheck(wrong, (z,), backends=["torch", "jax", "mlx"], raise_exception=False,
                                check_forward_ad=False)
    assert not result and "torch and mlx disagree" in result.message


# -- the command line ----------------------------------------------------------------------------
MLX_MODULE = '''
import mlx.core as mx


def good(x):
    return mx.tanh(x) * x


@mx.custom_function
def bad(x):
    return mx.tanh(x) * x


@bad.vjp
def bad_vjp(primals, cotangent, output):
    return 2 * cotangent * ((1 - mx.tanh(primals) ** 2) * primals + mx.tanh(primals))  # twice the right one
'''


def test_command_line_checks_an_mlx_function_both_halves(tmp_path, capsys):
    from agcheck.frontends import cli

    (tmp_path / "mlxops.py").write_text(MLX_MODULE)
    good = cli.main(["check", f"{tmp_path / 'mlxops.py'}:good", "--input", "3x4", "--backend", "mlx", "--plain"])
    out = capsys.readouterr().out
    assert good == 0 and "PASSED" in out, out
    bad = cli.main(["check", f"{tmp_path / 'mlxops.py'}:bad", "--input", "5", "--backend", "mlx", "--plain"])
    out = capsys.readouterr().out
    assert bad == 1 and MISMATCH in out and "[factor] analytical = 2.00 x numerical" in out
