"""The backend verbs used outside the core: ``from_numpy``, ``precision``, ``vjp_of_vjp``,
``framework_version`` and ``compiled`` (crosscheck and the frontends go through them and
import no framework).

Two halves: a correct second derivative matches the analytic one (d²/dx² sin = -sin), and
a wrong one (a backward that is not differentiable) is told apart from it.
"""
from __future__ import annotations

import numpy as np
import pytest

from agcheck.backends.base import Backend
from agcheck.backends.registry import get_backend

torch = pytest.importorskip("torch")

try:
    import jax
    import jax.numpy as jnp

    get_backend("jax")
except ImportError:  # pragma: no cover - depends on the install
    jax = jnp = None

needs_jax = pytest.mark.skipif(jax is None, reason="needs jax")
ALL = ["torch", pytest.param("jax", marks=needs_jax), "numpy"]

X = np.array([0.3, -1.2, 2.0])


def _x64_setting() -> bool:
    return bool(jax.config.jax_enable_x64)


# -- from_numpy -----------------------------------------------------------------------------


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.complex128, np.int64])
def test_from_numpy_round_trip(name, dtype):
    be = get_backend(name)
    values = (X * (1 + 1j) if np.issubdtype(dtype, np.complexfloating) else X * 3).astype(dtype)
    with be.precision(True):
        a = be.from_numpy(values)
        assert be.owns(a)
        back = np.asarray(be.to_numpy(a))
    assert back.dtype == values.dtype
    assert np.array_equal(back, values)


@pytest.mark.parametrize("name", ALL)
def test_from_numpy_copies(name):
    be = get_backend(name)
    values = X.copy()
    with be.precision(True):
        a = be.from_numpy(values)
    values[0] = 99.0
    assert np.asarray(be.to_numpy(a))[0] == X[0]


def test_from_numpy_checked_marks_torch_tensors_for_differentiation():
    be = get_backend("torch")
    assert be.from_numpy(X, checked=True).requires_grad
    assert not be.from_numpy(X).requires_grad
    assert not be.from_numpy(X, checked=False).requires_grad


@pytest.mark.parametrize("name", ALL)
def test_from_numpy_like_takes_the_dtype(name):
    be = get_backend(name)
    with be.precision(True):
        like = be.from_numpy(np.zeros(2, dtype=np.complex64))
        a = be.from_numpy(np.array([1.5, -2.0]), like=like)
        back = np.asarray(be.to_numpy(a))
    assert back.dtype == np.complex64
    assert np.array_equal(back, np.array([1.5, -2.0], dtype=np.complex64))


def test_from_numpy_is_declared_on_the_contract():
    class NoConversion(Backend):
        name = "noconversion"

    with pytest.raises(TypeError, match="from_numpy"):
        NoConversion().from_numpy(X)


# -- precision ------------------------------------------------------------------------------


@needs_jax
@pytest.mark.parametrize("caller", [False, True])
def test_jax_precision_restores_the_callers_setting(caller):
    be = get_backend("jax")
    with jax.enable_x64(caller):
        with be.precision(True):
            assert _x64_setting() is True
            assert be.from_numpy(X).dtype == jnp.float64
        assert _x64_setting() is caller


@needs_jax
@pytest.mark.parametrize("caller", [False, True])
def test_jax_precision_restores_the_callers_setting_when_the_body_raises(caller):
    be = get_backend("jax")
    with jax.enable_x64(caller):
        with pytest.raises(KeyError):
            with be.precision(True):
                assert _x64_setting() is True
                raise KeyError("inside")
        assert _x64_setting() is caller


@needs_jax
@pytest.mark.parametrize("caller", [False, True])
def test_jax_precision_single_leaves_the_setting_alone(caller):
    be = get_backend("jax")
    with jax.enable_x64(caller):
        with be.precision(False):
            assert _x64_setting() is caller
        assert _x64_setting() is caller


@pytest.mark.parametrize("name", ["torch", "numpy"])
def test_precision_does_nothing_where_data_keep_their_precision(name):
    be = get_backend(name)
    with be.precision(True):
        assert np.asarray(be.to_numpy(be.from_numpy(X.astype(np.float32)))).dtype == np.float32
    with pytest.raises(ValueError):
        with be.precision(True):
            raise ValueError("passes through")


# -- second derivatives ---------------------------------------------------------------------


def _sin(x):
    import array_api_compat

    return array_api_compat.array_namespace(x).sin(x)


def _one_hots(x: np.ndarray) -> list:
    return [np.eye(x.size, dtype=x.dtype)[i].reshape(x.shape) for i in range(x.size)]


def _hessian_diagonal(name, fn, x=X) -> np.ndarray:
    """d/dx_i of (d sin(x)_i/dx_i) through vjp_of_vjp: w = e_i, c = e_i."""
    be = get_backend(name)
    diagonal = []
    with be.precision(True):
        for e in _one_hots(x):
            args = (be.from_numpy(x, checked=True),)
            second = be.vjp_of_vjp(fn, args, [0], 0, e, [[e]])
            assert set(second) == {(0, 0)} and second[(0, 0)].shape == (1, x.size)
            diagonal.append(second[(0, 0)][0] @ e)
    return np.array(diagonal)


class TorchSinStoppedBackward(torch.autograd.Function):
    """sin with a backward whose cos is detached: right first, wrong (zero) second derivative."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return torch.sin(x)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * torch.cos(x).detach()


def _jax_sin_stopped_backward():
    @jax.custom_vjp
    def sin(x):
        return jnp.sin(x)

    sin.defvjp(lambda x: (jnp.sin(x), x), lambda x, g: (jax.lax.stop_gradient(jnp.cos(x)) * g,))
    return sin


@pytest.mark.parametrize("name", ["torch", pytest.param("jax", marks=needs_jax)])
def test_second_derivative_of_sin_is_minus_sin(name):
    assert np.allclose(_hessian_diagonal(name, _sin), -np.sin(X), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("name", ["torch", pytest.param("jax", marks=needs_jax)])
def test_wrong_second_derivative_is_told_apart(name):
    wrong = TorchSinStoppedBackward.apply if name == "torch" else _jax_sin_stopped_backward()
    got = _hessian_diagonal(name, wrong)
    assert np.allclose(got, 0.0)  # the stopped cos has no derivative
    assert not np.allclose(got, -np.sin(X), rtol=1e-7, atol=1e-10)


@pytest.mark.parametrize("name", ["torch", pytest.param("jax", marks=needs_jax)])
def test_second_derivative_of_an_output_independent_of_the_inputs_is_zero(name):
    be = get_backend(name)
    with be.precision(True):
        args = (be.from_numpy(X, checked=True), be.from_numpy(X[:2], checked=True))
        second = be.vjp_of_vjp(lambda x, y: x * x, args, [0, 1], 0, np.ones(3), [_one_hots(X), _one_hots(X[:2])])
    assert sorted(second) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert np.allclose(second[(0, 0)], 2 * np.eye(3))
    assert second[(0, 1)].shape == (3, 2) and not second[(0, 1)].any()
    assert second[(1, 0)].shape == (2, 3) and not second[(1, 0)].any()


@needs_jax
def test_complex_second_derivatives_agree_between_torch_and_jax():
    """JAX's are mapped into torch's convention at both levels, so the two agree."""
    z = np.array([0.5 + 1.0j, -1.5 + 0.25j])
    cots = [[np.array([1.0, 0.0], dtype=complex), np.array([0.0, 1j])]]
    w = np.array([0.3 - 0.7j, 1.1 + 0.2j])
    results = {}
    for name in ("torch", "jax"):
        be = get_backend(name)
        with be.precision(True):
            args = (be.from_numpy(z, checked=True),)
            results[name] = be.vjp_of_vjp(lambda z: z * z * z.conj(), args, [0], 0, w, cots)[(0, 0)]
    assert np.allclose(results["torch"], results["jax"], rtol=1e-12, atol=1e-14)
    assert not np.allclose(results["torch"], np.conj(results["jax"]), rtol=1e-7, atol=1e-10)


def test_numpy_backend_has_no_second_derivatives():
    be = get_backend("numpy")
    assert type(be).vjp_of_vjp is Backend.vjp_of_vjp
    with pytest.raises(NotImplementedError, match="second derivatives"):
        be.vjp_of_vjp(np.sin, (X.copy(),), [0], 0, np.ones(3), [[np.ones(3)]])


# -- version, compilation -------------------------------------------------------------------


@pytest.mark.parametrize("name", ALL)
def test_framework_version(name):
    module = {"torch": "torch", "jax": "jax", "numpy": "numpy"}[name]
    assert get_backend(name).framework_version() == __import__(module).__version__


@pytest.mark.parametrize("name", ALL)
def test_compiled_computes_the_same(name):
    be = get_backend(name)
    compiled = be.compiled(_sin)
    if name == "jax":
        assert compiled is not _sin
    else:
        assert compiled is _sin
    with be.precision(True):
        assert np.allclose(np.asarray(be.to_numpy(compiled(be.from_numpy(X)))), np.sin(X))


# -- all_finite -----------------------------------------------------------------------------


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("n", [7, 10_000])
def test_all_finite_sees_nan_and_infinities_and_not_overflowing_sums(name, n):
    be = get_backend(name)
    values = np.zeros(n)
    assert be.all_finite(be.from_numpy(values))
    values[-2:] = np.finfo(be.to_numpy(be.from_numpy(values)).dtype).max  # finite; their sum overflows
    assert be.all_finite(be.from_numpy(values))
    for bad in (np.nan, np.inf, -np.inf):
        values[1] = bad
        assert not be.all_finite(be.from_numpy(values)), bad
    values[1], values[2] = np.inf, -np.inf  # a NaN sum
    assert not be.all_finite(be.from_numpy(values))
    assert not be.all_finite(be.from_numpy(np.array([0.0, 1j * np.inf] + [0.0] * n)))
