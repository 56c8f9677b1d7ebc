"""``agcheck.crosscheck``: one function (or hand-written ports) across backends.

Two halves everywhere: agreeing functions pass (real and complex, slow and fast, first
and second order), differing ones fail with a message naming the two backends, the
quantity, the output / input and where the largest difference sits. torch vs numpy runs
wherever torch is installed; torch vs jax needs jax and agcheck's jax backend.
"""
from __future__ import annotations

import array_api_compat
import numpy as np
import pytest

import agcheck
from agcheck import CrosscheckResult, GradcheckError
from agcheck.backend import BackendUnavailableError

torch = pytest.importorskip("torch")

FAST = pytest.mark.parametrize("fast_mode", [False, True], ids=["slow", "fast"])


def xp_of(*arrays):
    return array_api_compat.array_namespace(*arrays)


def need_jax():
    pytest.importorskip("jax")
    try:
        agcheck.get_backend("jax")
    except (BackendUnavailableError, ImportError) as e:  # pragma: no cover - depends on the install
        pytest.skip(f"the jax backend is not available: {e}")


# -- functions written once against the array API, and NumPy derivatives for the numpy port ----


def f_real(x, y):
    xp = xp_of(x, y)
    return xp.sin(x) * y, xp.sum(x * x)


def vjp_real(inputs, cots):
    x, y = inputs
    g0, g1 = cots
    return np.cos(x) * y * g0 + 2 * x * g1, np.sin(x) * g0


def jvp_real(inputs, tangents):
    x, y = inputs
    tx, ty = tangents
    return np.cos(x) * y * tx + np.sin(x) * ty, np.sum(2 * x * tx)


NUMPY_REAL = {"numpy": {"vjp": vjp_real, "jvp": jvp_real}}


def f_complex(z, x):
    """C x R -> (C, R): z^2 x and |z|^2."""
    xp = xp_of(z, x)
    return z * z * x, xp.real(z * xp.conj(z))


def vjp_complex_torch(inputs, cots):
    z, x = inputs
    c0, c1 = cots
    return (np.conj(2 * z * x) * c0 + 2 * z * c1,
            np.real(np.conj(z * z) * c0))


def vjp_complex_jax(inputs, cots):
    z, x = inputs
    c0, c1 = cots
    return (2 * z * x * c0 + 2 * np.conj(z) * c1,
            np.real(z * z * c0))


def jvp_complex(inputs, tangents):
    z, x = inputs
    tz, tx = tangents
    return 2 * z * x * tz + z * z * tx, 2 * np.real(np.conj(z) * tz)


def real_inputs():
    r = np.random.default_rng(0)
    return r.standard_normal((2, 3)), r.standard_normal((2, 3))


def complex_inputs():
    r = np.random.default_rng(1)
    return r.standard_normal(3) + 1j * r.standard_normal(3), r.standard_normal(3)


# -- torch vs numpy -------------------------------------------------------------------------------


@FAST
def test_agreeing_real_function_torch_numpy(fast_mode):
    x, y = real_inputs()
    result = agcheck.crosscheck(f_real, (x, y), backends=("torch", "numpy"), backend_options=NUMPY_REAL,
                                fast_mode=fast_mode)
    assert isinstance(result, CrosscheckResult) and result
    assert result.backends == ("torch", "numpy")
    assert "all backends agree" in str(result)
    assert set(result.values) == {"torch", "numpy"}
    np.testing.assert_allclose(result.values["numpy"][0], np.sin(x) * y)
    quantities = {d.quantity for d in result.differences}
    assert quantities == {"value", "reverse", "forward"}
    if not fast_mode:  # full Jacobians: (output elements, input elements)
        assert result.reverse["torch"][(0, 0)].shape == (6, 6)
        np.testing.assert_allclose(result.reverse["torch"][(0, 0)], np.diag((np.cos(x) * y).ravel()))


@FAST
def test_agreeing_complex_function_torch_numpy(fast_mode):
    z, x = complex_inputs()
    assert agcheck.crosscheck(f_complex, (z, x), backends=("torch", "numpy"), fast_mode=fast_mode,
                              backend_options={"numpy": {"vjp": vjp_complex_torch, "jvp": jvp_complex}})
    # a JAX-convention vjp, declared as such, is mapped into torch's convention
    assert agcheck.crosscheck(f_complex, (z, x), backends=("torch", "numpy"), fast_mode=fast_mode,
                              check_forward_ad=False,
                              backend_options={"numpy": {"vjp": vjp_complex_jax, "convention": "jax"}})


@FAST
def test_convention_mixup_is_named(fast_mode):
    z, x = complex_inputs()
    with pytest.raises(GradcheckError) as info:
        agcheck.crosscheck(f_complex, (z, x), backends=("torch", "numpy"), fast_mode=fast_mode,
                           check_forward_ad=False, backend_options={"numpy": {"vjp": vjp_complex_jax}})
    message = str(info.value)
    assert "torch and numpy disagree on the reverse-mode derivative of output 0 with respect to input 0" in message
    assert "in the other complex convention" in message
    assert info.value.details["conjugate"] is True


def test_conjugate_of_a_real_output_gradient_is_named():
    z, x = complex_inputs()

    def vjp(inputs, cots):  # |z|^2's gradient in JAX's convention, declared as torch's
        return (2 * np.conj(inputs[0]) * cots[0],)

    with pytest.raises(GradcheckError, match="exactly the complex conjugate of the torch result"):
        agcheck.crosscheck(lambda z: xp_of(z).real(z * xp_of(z).conj(z)), (z,), backends=("torch", "numpy"),
                           check_forward_ad=False, backend_options={"numpy": {"vjp": vjp}})


def test_ports_that_differ_in_value():
    x, y = real_inputs()
    ports = {
        "torch": f_real,
        "numpy": lambda x, y: (np.sin(x) * y, np.sum(x * x) + 1e-6),
    }
    with pytest.raises(GradcheckError) as info:
        agcheck.crosscheck(ports, (x, y), backends=("torch", "numpy"), backend_options=NUMPY_REAL)
    message = str(info.value)
    assert "torch and numpy disagree on the value of output 1 [value]" in message
    assert "Largest difference 1e-06" in message
    assert info.value.details["quantity"] == "value"


def test_ports_that_differ_only_in_the_derivative_at_a_kink():
    """|x| at 0: torch's derivative is sign(0) = 0; a NumPy port whose vjp uses
    ``where(x >= 0, 1, -1)`` says 1. Values agree; the reverse Jacobian differs at the kink,
    and crosscheck says so."""
    x = np.array([-1.5, 0.0, 2.0])

    def vjp(inputs, cots):
        return (np.where(inputs[0] >= 0, 1.0, -1.0) * cots[0],)

    def vjp_sign(inputs, cots):
        return (np.sign(inputs[0]) * cots[0],)

    fn = lambda x: xp_of(x).abs(x)
    assert agcheck.crosscheck(fn, (x,), backends=("torch", "numpy"), check_forward_ad=False,
                              backend_options={"numpy": {"vjp": vjp_sign}})
    with pytest.raises(GradcheckError) as info:
        agcheck.crosscheck(fn, (x,), backends=("torch", "numpy"), check_forward_ad=False,
                           backend_options={"numpy": {"vjp": vjp}})
    message = str(info.value)
    assert "reverse-mode derivative of output 0 with respect to input 0" in message
    assert "output 0 element [1], input 0 element [1]" in message
    assert "torch gives 0.0, numpy gives 1.0" in message
    assert "sits on a kink" in message and "-1 (left) and 1 (right)" in message
    # away from the kink the two agree
    assert agcheck.crosscheck(fn, (np.array([-1.5, 0.5, 2.0]),), backends=("torch", "numpy"),
                              check_forward_ad=False, backend_options={"numpy": {"vjp": vjp}})


def test_forward_mode_disagreement():
    x, y = real_inputs()

    def jvp_half(inputs, tangents):
        a, b = jvp_real(inputs, tangents)
        return a, b / 2

    with pytest.raises(GradcheckError, match=r"forward-mode derivative of output 1 with respect to input 0 \[forward\]"):
        agcheck.crosscheck(f_real, (x, y), backends=("torch", "numpy"),
                           backend_options={"numpy": {"vjp": vjp_real, "jvp": jvp_half}})


def test_approximate_derivative_caught_by_tight_tolerances_but_not_by_gradcheck():
    """A vjp computed by a forward difference is right to ~1e-6: gradcheck (rtol 1e-3)
    passes it, crosscheck's float64 tolerances (rtol 1e-7) do not."""
    x = np.linspace(0.3, 2.0, 4)

    def vjp_fd(inputs, cots):
        h = 1e-5
        x = inputs[0]
        return ((np.log1p(np.exp(x + h)) - np.log1p(np.exp(x))) / h * cots[0],)

    softplus = lambda x: xp_of(x).log(1 + xp_of(x).exp(x))
    assert agcheck.gradcheck(lambda x: np.log1p(np.exp(x)), (x,), backend="numpy", vjp=vjp_fd)
    with pytest.raises(GradcheckError) as info:
        agcheck.crosscheck(softplus, (x,), backends=("torch", "numpy"), check_forward_ad=False,
                           gradcheck=True, backend_options={"numpy": {"vjp": vjp_fd}})
    message = str(info.value)
    assert "reverse-mode derivative" in message
    assert "torch: passed; numpy: passed" in message
    # the same comparison with gradcheck-like tolerances passes
    assert agcheck.crosscheck(softplus, (x,), backends=("torch", "numpy"), check_forward_ad=False,
                              rtol=1e-3, atol=1e-5, backend_options={"numpy": {"vjp": vjp_fd}})


def erf_approx(x):
    """Abramowitz & Stegun 7.1.26 (x >= 0): |error| <= 1.5e-7."""
    p, a = 0.3275911, (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)
    t = 1 / (1 + p * x)
    return 1 - t * (a[0] + t * (a[1] + t * (a[2] + t * (a[3] + t * a[4])))) * np.exp(-x * x)


def test_approximate_formula_in_value():
    """A 1.5e-7-accurate erf against the exact one: within gradcheck's atol (1e-5), outside
    crosscheck's float64 tolerances."""
    x = np.linspace(0.1, 2.0, 8)
    ports = {"torch": torch.erf, "numpy": erf_approx}
    with pytest.raises(GradcheckError) as info:
        agcheck.crosscheck(ports, (x,), backends=("torch", "numpy"), check_backward_ad=False,
                           check_forward_ad=False)
    assert "disagree on the value of output 0 [value]" in str(info.value)
    assert agcheck.crosscheck(ports, (x,), backends=("torch", "numpy"), check_backward_ad=False,
                              check_forward_ad=False, atol=1e-5, rtol=1e-3)


def test_gradcheck_names_the_wrong_side():
    x, y = real_inputs()

    def vjp_scaled(inputs, cots):
        gx, gy = vjp_real(inputs, cots)
        return gx * 1.5, gy

    with pytest.raises(GradcheckError) as info:
        agcheck.crosscheck(f_real, (x, y), backends=("torch", "numpy"), gradcheck=True, check_forward_ad=False,
                           backend_options={"numpy": {"vjp": vjp_scaled}})
    message = str(info.value)
    assert "numpy: FAILED gradcheck (reverse mode): Jacobian mismatch for output 0 with respect to input 0" in message
    assert ("finite differences side with torch: numpy failed gradcheck (reverse mode), so the reverse-mode "
            "derivatives of numpy are the wrong ones") in message
    assert "kink" not in message


def test_shared_wrong_derivative_fails_gradcheck():
    """Two ports agreeing with each other, both wrong: only gradcheck=True can tell."""
    x = np.linspace(0.1, 1.0, 3)

    class WrongSquare(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * x

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return 3 * x * g

    ports = {"torch": WrongSquare.apply, "numpy": lambda x: x * x}
    options = {"numpy": {"vjp": lambda i, c: (3 * i[0] * c[0],)}}
    assert agcheck.crosscheck(ports, (x,), backends=("torch", "numpy"), check_forward_ad=False,
                              backend_options=options)
    with pytest.raises(GradcheckError, match="the backends agree with each other, but gradcheck failed on torch, numpy"):
        agcheck.crosscheck(ports, (x,), backends=("torch", "numpy"), check_forward_ad=False, gradcheck=True,
                           backend_options=options)


def test_raise_exception_false_returns_a_falsy_result_with_the_table():
    x, y = real_inputs()
    ports = {"torch": f_real, "numpy": lambda x, y: (np.sin(x) * y * 2, np.sum(x * x))}
    result = agcheck.crosscheck(ports, (x, y), backends=("torch", "numpy"), backend_options=NUMPY_REAL,
                                raise_exception=False)
    assert isinstance(result, CrosscheckResult)
    assert not result and result == False and result != True  # noqa: E712 - the comparison is the API
    assert "torch and numpy disagree on the value of output 0 [value]" in result.message
    assert "DISAGREEMENT" in str(result) and "DISAGREEMENT" in result.message
    assert [d.quantity for d in result.disagreements()][0] == "value"
    # the same as the error raised without raise_exception=False
    with pytest.raises(GradcheckError) as info:
        agcheck.crosscheck(ports, (x, y), backends=("torch", "numpy"), backend_options=NUMPY_REAL)
    assert str(info.value) == result.message
    # agreeing ports: truthy, == True, no message
    good = agcheck.crosscheck(f_real, (x, y), backends=("torch", "numpy"), backend_options=NUMPY_REAL,
                              raise_exception=False)
    assert good and good == True and good != False and good.message == ""  # noqa: E712


def test_missing_numpy_derivatives_are_noted_not_passed():
    x, y = real_inputs()
    result = agcheck.crosscheck(f_real, (x, y), backends=("torch", "numpy"), order=2)
    text = str(result)
    assert "numpy: reverse-mode derivatives not compared (no vjp given)" in text
    assert "numpy: forward-mode derivatives not compared (no jvp given)" in text
    assert "second derivatives not compared" in text
    assert {d.quantity for d in result.differences} == {"value"}


def test_unavailable_and_unknown_backends():
    x, y = real_inputs()
    agcheck.register_backend("nosuchfw", "agcheck.backends.nosuchfw_backend", "nosuchfw_not_installed", "nosuchfw")
    try:
        result = agcheck.crosscheck(f_real, (x, y), backends=("torch", "numpy", "nosuchfw"),
                                    backend_options=NUMPY_REAL)
        assert "nosuchfw" in result.skipped and "not installed" in result.skipped["nosuchfw"]
        assert "skipped nosuchfw" in str(result)
        with pytest.raises(BackendUnavailableError, match="at least two backends"):
            agcheck.crosscheck(f_real, (x, y), backends=("torch", "nosuchfw"))
    finally:
        from agcheck.backends import registry

        registry._REGISTRY.pop("nosuchfw", None)
    with pytest.raises(ValueError, match="unknown backend"):
        agcheck.crosscheck(f_real, (x, y), backends=("torch", "tensorflowish"))
    with pytest.raises(ValueError, match="at least two backends"):
        agcheck.crosscheck(f_real, (x, y), backends=("torch",))
    with pytest.raises(ValueError, match="listed twice"):
        agcheck.crosscheck(f_real, (x, y), backends=("torch", "torch"))
    with pytest.raises(ValueError, match="order must be 1 or 2"):
        agcheck.crosscheck(f_real, (x, y), backends=("torch", "numpy"), order=3)


def test_port_missing_from_mapping_is_skipped():
    x, y = real_inputs()
    with pytest.raises(ValueError, match="no port of fn given"):
        agcheck.crosscheck({"torch": f_real}, (x, y), backends=("torch", "numpy"))


def test_float32_tolerances_and_integer_outputs():
    x = np.linspace(-1, 1, 5).astype(np.float32)

    def fn(x):
        xp = xp_of(x)
        return xp.tanh(x), xp.argsort(x)

    result = agcheck.crosscheck(fn, (x,), backends=("torch", "numpy"), check_forward_ad=False,
                                backend_options={"numpy": {"vjp": lambda i, c: (c[0] * (1 - np.tanh(i[0]) ** 2),)}})
    assert (result.rtol, result.atol) == agcheck.crosscheck.__globals__["DEFAULT_TOLERANCES"]["float32"]
    ports = {"torch": fn, "numpy": lambda x: (np.tanh(x), np.argsort(-x))}
    with pytest.raises(GradcheckError, match="disagree on the value of output 1"):
        agcheck.crosscheck(ports, (x,), backends=("torch", "numpy"), check_backward_ad=False, check_forward_ad=False)


def test_wrt_and_pass_through_arguments():
    x, y = real_inputs()

    def fn(x, y, scale):
        return f_real(x, y)[0] * scale

    result = agcheck.crosscheck(fn, (x, y, 2.0), backends=("torch", "numpy"), wrt=1, check_forward_ad=False,
                                backend_options={"numpy": {"vjp": lambda i, c: (np.sin(i[0]) * 2.0 * c[0],)}},
                                gradcheck=True)
    assert set(result.reverse["torch"]) == {(0, 0)}
    assert result.gradchecks == {"torch": "passed", "numpy": "passed"}
    assert all(v.status == "passed" and v.checks == ("gradcheck",) for v in result.gradcheck_results.values())


def test_inputs_are_not_modified():
    x, y = real_inputs()
    before = x.copy(), y.copy()
    agcheck.crosscheck(f_real, (x, y), backends=("torch", "numpy"), backend_options=NUMPY_REAL, gradcheck=True)
    assert np.array_equal(x, before[0]) and np.array_equal(y, before[1])


def test_core_does_not_import_frameworks():
    import subprocess
    import sys

    code = ("import sys, agcheck, agcheck.crosscheck; "
            "print('torch' in sys.modules, 'jax' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


# -- torch vs jax ------------------------------------------------------------------------------


@FAST
def test_torch_jax_agree_on_real_and_complex_functions(fast_mode):
    need_jax()
    x, y = real_inputs()
    result = agcheck.crosscheck(f_real, (x, y), fast_mode=fast_mode, order=2)
    assert result and result.backends == ("torch", "jax")
    assert {d.quantity for d in result.differences} == {"value", "reverse", "forward", "second"}
    z, w = complex_inputs()
    assert agcheck.crosscheck(f_complex, (z, w), fast_mode=fast_mode, order=2)


def test_torch_jax_with_numpy_port_and_gradcheck():
    need_jax()
    z, x = complex_inputs()
    result = agcheck.crosscheck(f_complex, (z, x), backends=("torch", "jax", "numpy"), gradcheck=True,
                                backend_options={"numpy": {"vjp": vjp_complex_jax, "jvp": jvp_complex,
                                                           "convention": "jax"}})
    assert result.gradchecks == {"torch": "passed", "jax": "passed", "numpy": "passed"}


KINKS = {
    # function, input, the entry where they differ first, jax's derivative there
    "abs at 0": (lambda x: xp_of(x).abs(x), np.array([-1.0, 0.0, 2.0]), 1, 1.0),
    "clip at its bounds": (lambda x: xp_of(x).clip(x, 0.0, 1.0), np.array([0.0, 0.5, 1.0]), 0, 0.5),
}


def _torch_derivative(fn, x, entry) -> float:
    """The installed torch's derivative of the elementwise ``fn`` at ``x[entry]`` (torch
    2.13 gives clamp's bounds 1, torch 2.14 gives them 0; both differ from JAX's 0.5)."""
    t = torch.tensor(x, requires_grad=True)
    (g,) = torch.autograd.grad(fn(t).sum(), t)
    return float(g[entry])


@pytest.mark.parametrize("name", list(KINKS))
def test_torch_jax_diverge_at_kinks(name):
    need_jax()
    fn, x, entry, jax_says = KINKS[name]
    torch_says = _torch_derivative(fn, x, entry)
    assert torch_says != jax_says
    with pytest.raises(GradcheckError) as info:
        agcheck.crosscheck(fn, (x,), gradcheck=True)
    message = str(info.value)
    assert "torch and jax disagree on the reverse-mode derivative of output 0 with respect to input 0" in message
    assert f"torch gives {torch_says!r}, jax gives {jax_says!r}" in message
    assert "sits on a kink" in message
    # the same functions agree away from the kinks
    assert agcheck.crosscheck(fn, (x + 0.25,))


def test_torch_jax_diverge_on_norm_at_zero():
    """torch's vector_norm has gradient 0 at the zero vector; JAX's is NaN."""
    need_jax()
    fn = lambda x: xp_of(x).linalg.vector_norm(x)
    with pytest.raises(GradcheckError, match="torch gives 0.0, jax gives nan"):
        agcheck.crosscheck(fn, (np.zeros(3),), check_forward_ad=False)


def test_torch_jax_hand_written_ports_conjugate():
    """A JAX port whose custom_vjp uses torch's formula for |z|^2 (2 z g instead of 2 conj(z) g)."""
    need_jax()
    import jax
    import jax.numpy as jnp

    @jax.custom_vjp
    def abs2(z):
        return jnp.real(z * jnp.conj(z))

    abs2.defvjp(lambda z: (abs2(z), z), lambda z, g: (2 * z * g,))
    z, _ = complex_inputs()
    ports = {"torch": lambda z: torch.abs(z) ** 2, "jax": abs2}
    with pytest.raises(GradcheckError) as info:
        agcheck.crosscheck(ports, (z,), check_forward_ad=False, gradcheck=True)
    message = str(info.value)
    assert "jax result is exactly the complex conjugate of the torch result" in message
    assert "jax: FAILED" in message


def test_torch_jax_second_order_only_difference():
    """First derivatives agree, second ones do not: a custom_vjp whose backward is not
    differentiable (stop_gradient) gives zero second derivatives in JAX."""
    need_jax()
    import jax

    @jax.custom_vjp
    def cube(x):
        return x ** 3

    cube.defvjp(lambda x: (cube(x), x), lambda x, g: (jax.lax.stop_gradient(3 * x ** 2) * g,))
    ports = {"torch": lambda x: x ** 3, "jax": cube}
    x = np.array([0.5, -1.0, 2.0])
    assert agcheck.crosscheck(ports, (x,), check_forward_ad=False)
    with pytest.raises(GradcheckError, match=r"second derivative of output 0 with respect to input 0 and input 0 \[second\]"):
        agcheck.crosscheck(ports, (x,), check_forward_ad=False, order=2)
