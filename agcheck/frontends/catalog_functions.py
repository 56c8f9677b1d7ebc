"""The catalog's functions, each written once against the array API, and the hand-written
NumPy derivatives (``*_vjp``, ``*_jvp``, torch's complex convention; see docs/numpy.md)
with which the NumPy backend checks some of them.
"""
from __future__ import annotations

import array_api_compat

from agcheck.backends.registry import infer_backend


def _ns(*arrays):
    try:
        xp = array_api_compat.array_namespace(*arrays)
    except TypeError:  # a framework array_api_compat does not know (TensorFlow)
        return infer_backend(arrays).array_namespace(*arrays)
    if getattr(xp, "__name__", "") == "mlx.core":
        # MLX arrays name mlx.core as their namespace, which is not the standard's
        # (no linalg.vector_norm, var(correction=)): agcheck's adapter over it instead
        from agcheck.backends.mlx_xp import namespace

        return namespace
    return xp


def _real_elementwise(derivative):
    """The NumPy ``vjp`` and ``jvp`` of a real elementwise function of one input, from
    ``derivative(x)``: the cotangent or tangent times the derivative."""

    def vjp(inputs, cots):
        (x,), (g,) = inputs, cots
        return (derivative(x) * g,)

    def jvp(inputs, tangents):
        (x,), (t,) = inputs, tangents
        return derivative(x) * t

    return vjp, jvp


# -- elementwise ----------------------------------------------------------------------------

def sin(x):
    return _ns(x).sin(x)


def exp(x):
    return _ns(x).exp(x)


def tanh(x):
    return _ns(x).tanh(x)


def _tanh_derivative(x):
    y = tanh(x)
    return 1 - y * y


sin_vjp, sin_jvp = _real_elementwise(lambda x: _ns(x).cos(x))
exp_vjp, exp_jvp = _real_elementwise(exp)
tanh_vjp, tanh_jvp = _real_elementwise(_tanh_derivative)


def log1p(x):
    return _ns(x).log1p(x)


def sqrt(x):
    return _ns(x).sqrt(x)


def power(x, y):
    return _ns(x, y).pow(x, y)


def sigmoid(x):
    xp = _ns(x)
    return 1.0 / (1.0 + xp.exp(-x))


def _sigmoid_derivative(x):
    s = sigmoid(x)
    return s * (1 - s)


sigmoid_vjp, sigmoid_jvp = _real_elementwise(_sigmoid_derivative)


def softplus(x):
    xp = _ns(x)
    return xp.log1p(xp.exp(x))


def atan2(y, x):
    return _ns(y, x).atan2(y, x)


def logaddexp(x, y):
    return _ns(x, y).logaddexp(x, y)


def expm1_cos(x, y):
    xp = _ns(x, y)
    return xp.expm1(x) * xp.cos(y)


# -- reductions -----------------------------------------------------------------------------

def sum_squares(x):
    return _ns(x).sum(x * x, axis=1)


def sum_squares_vjp(inputs, cots):
    (x,), (g,) = inputs, cots
    return (2 * x * g[:, None],)


def sum_squares_jvp(inputs, tangents):
    (x,), (t,) = inputs, tangents
    return _ns(x).sum(2 * x * t, axis=1)


def prod(x):
    return _ns(x).prod(x, axis=-1)


def mean_and_var(x):
    xp = _ns(x)
    return xp.mean(x, axis=0), xp.var(x, axis=0, correction=1)


def std(x):
    return _ns(x).std(x, correction=0)


def max_(x):
    return _ns(x).max(x, axis=1)


def cumulative_sum(x):
    return _ns(x).cumulative_sum(x * x, axis=1)


# -- linear algebra -------------------------------------------------------------------------

def matmul(a, b):
    return _ns(a, b).matmul(a, b)


def matmul_vjp(inputs, cots):
    (a, b), (g,) = inputs, cots
    xp = _ns(a, b)
    return xp.matmul(g, xp.matrix_transpose(b)), xp.matmul(xp.matrix_transpose(a), g)


def matmul_jvp(inputs, tangents):
    (a, b), (ta, tb) = inputs, tangents
    xp = _ns(a, b)
    return xp.matmul(ta, b) + xp.matmul(a, tb)


def matrix_norm(a):
    return _ns(a).linalg.matrix_norm(a, ord="fro")


def vector_norm(x):
    return _ns(x).linalg.vector_norm(x, axis=-1)


def vector_norm_vjp(inputs, cots):
    (x,), (g,) = inputs, cots
    return (x / vector_norm(x)[..., None] * g[..., None],)


def vector_norm_jvp(inputs, tangents):
    (x,), (t,) = inputs, tangents
    xp = _ns(x)
    return xp.sum(x * t, axis=-1) / vector_norm(x)


def det(a):
    return _ns(a).linalg.det(a)


def inv(a):
    return _ns(a).linalg.inv(a)


def solve(a, b):
    return _ns(a, b).linalg.solve(a, b)


def trace_of_product(a, b):
    xp = _ns(a, b)
    return xp.linalg.trace(xp.matmul(a, b))


def outer(x, y):
    return _ns(x, y).linalg.outer(x, y)


def cholesky(x):
    """The Cholesky factor of ``x x^T + 3 I`` (symmetric positive definite for any ``x``)."""
    xp = _ns(x)
    a = xp.matmul(x, xp.matrix_transpose(x)) + 3.0 * xp.eye(x.shape[-1], dtype=x.dtype)
    return xp.linalg.cholesky(a)


def logabsdet(a):
    return _ns(a).linalg.slogdet(a)[1]


def eigvalsh(x):
    """The eigenvalues of the symmetric part of ``x`` (distinct for the catalog's input)."""
    xp = _ns(x)
    return xp.linalg.eigvalsh((x + xp.matrix_transpose(x)) / 2)


def svdvals(a):
    return _ns(a).linalg.svdvals(a)


# -- composite: written from primitives -----------------------------------------------------

def softmax(x):
    xp = _ns(x)
    e = xp.exp(x - xp.max(x, axis=-1, keepdims=True))
    return e / xp.sum(e, axis=-1, keepdims=True)


def softmax_vjp(inputs, cots):
    (x,), (g,) = inputs, cots
    xp = _ns(x)
    s = softmax(x)
    return (s * (g - xp.sum(g * s, axis=-1, keepdims=True)),)


def softmax_jvp(inputs, tangents):
    (x,), (t,) = inputs, tangents
    xp = _ns(x)
    s = softmax(x)
    return s * (t - xp.sum(t * s, axis=-1, keepdims=True))


def logsumexp(x):
    xp = _ns(x)
    m = xp.max(x, axis=-1, keepdims=True)
    return xp.squeeze(m, axis=-1) + xp.log(xp.sum(xp.exp(x - m), axis=-1))


def layer_norm(x, weight, bias):
    xp = _ns(x, weight, bias)
    mu = xp.mean(x, axis=-1, keepdims=True)
    var = xp.var(x, axis=-1, keepdims=True)
    return (x - mu) / xp.sqrt(var + 1e-5) * weight + bias


def mlp(x, w, b, v):
    xp = _ns(x, w, b, v)
    return xp.matmul(xp.tanh(xp.matmul(x, w) + b), v)


# -- complex --------------------------------------------------------------------------------

def abs_squared(z):
    xp = _ns(z)
    return xp.real(z * xp.conj(z))


def abs_squared_vjp(inputs, cots):  # torch's convention: the gradient of |z|^2 is 2 z
    (z,), (g,) = inputs, cots
    return (2 * z * g,)


def abs_squared_jvp(inputs, tangents):
    (z,), (t,) = inputs, tangents
    xp = _ns(z)
    return 2 * xp.real(xp.conj(z) * t)


def mul_conj(z, w):
    return z * _ns(z, w).conj(w)


def mul_conj_vjp(inputs, cots):
    # y = z conj(w): dy/dz = conj(w), dy/d conj(w) = z; torch's VJP is
    # g conj(dy/dz) + conj(g) dy/d conj(z) per input
    (z, w), (g,) = inputs, cots
    xp = _ns(z, w)
    return g * w, xp.conj(g) * z


def mul_conj_jvp(inputs, tangents):
    (z, w), (tz, tw) = inputs, tangents
    xp = _ns(z, w)
    return tz * xp.conj(w) + z * xp.conj(tw)


def complex_exp(z):
    return _ns(z).exp(z)


def complex_exp_vjp(inputs, cots):
    (z,), (g,) = inputs, cots
    xp = _ns(z)
    return (g * xp.conj(xp.exp(z)),)


def complex_exp_jvp(inputs, tangents):
    (z,), (t,) = inputs, tangents
    return _ns(z).exp(z) * t


def real_times_imag(z):
    xp = _ns(z)
    return xp.real(z) * xp.imag(z)


def complex_abs(z):
    return _ns(z).abs(z)


def complex_matmul(a, b):
    return _ns(a, b).matmul(a, b)


def z_sin_z(z):
    return z * _ns(z).sin(z)


def real_of_exp_times(z, w):
    """A real output of a complex and a real input: ``real(exp(z) * w)``."""
    xp = _ns(z, w)
    return xp.real(xp.exp(z) * w)


# -- custom derivatives: the forward computations (the ports: catalog_ports) ----------------

def softplus_custom(x):
    """``log(1 + exp(x))``; its derivatives are hand-written on every backend."""
    return softplus(x)


softplus_custom_vjp, softplus_custom_jvp = _real_elementwise(sigmoid)


def cube_custom_vjp(x):
    """``x ** 3``; reverse mode hand-written (a ``jax.custom_vjp`` has no forward mode)."""
    return x * x * x


def cube_custom_vjp_vjp(inputs, cots):
    (x,), (g,) = inputs, cots
    return (3 * x * x * g,)

