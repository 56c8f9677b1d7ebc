"""The bundled catalog of functions that the main job (``python -m agcheck``) checks.

Every function is written once against the array API: it takes arrays, finds their
namespace with ``array_api_compat.array_namespace`` and calls only functions of the
standard (and its ``linalg`` extension), so the same code runs on torch tensors, JAX
arrays and NumPy arrays (on TensorFlow and MLX arrays through agcheck's small namespaces,
:mod:`agcheck.backends.tensorflow_xp` and :mod:`agcheck.backends.mlx_xp`). The exceptions
are the ``custom`` entries, whose derivatives are hand-written per framework (a
``torch.autograd.Function``, a ``jax.custom_jvp`` / ``jax.custom_vjp``, a
``tf.custom_gradient``, an ``mx.custom_function``, a NumPy VJP/JVP): they give one port
per backend.

An entry a backend cannot check as written names that backend in ``not_on``, with the
reason (the main job shows the reason, never a silent pass): MLX computes float64 ``sin``,
``cos`` and ``exp`` at float32 accuracy, has no complex128 and no derivatives of some of
``mx.linalg``.

Each :class:`Entry` has a name, the function (or its ports), an input builder (shapes,
dtypes, how the values are drawn and a seed — chosen away from the points where the
frameworks legitimately differ: kinks, ties, zeros of norms, see docs/crosscheck.md), the
kinds it belongs to and, for some, hand-written NumPy derivatives (``vjp=``/``jvp=``) so
that the NumPy backend takes part too.

Importing this module imports neither torch nor jax: the framework-specific ports are
built on first use.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Callable

import array_api_compat
import numpy as np

from agcheck.backends.registry import infer_backend

__all__ = ["Arg", "Entry", "CATALOG", "KINDS", "by_name", "select", "demo_failure_entry",
           "MLX_FLOAT32_INSIDE", "MLX_NO_COMPLEX128", "MLX_NO_DERIVATIVE"]

#: the kinds of catalog entries, in display order
KINDS = ("elementwise", "reduction", "linalg", "composite", "complex", "custom")

#: why an entry is not checked on MLX (``Entry.not_on``), measured with mlx 0.32.4 on the CPU
MLX_FLOAT32_INSIDE = ("MLX computes float64 sin, cos and exp (so also its sigmoid and logaddexp) at float32 "
                      "accuracy (ml-explore/mlx#3047), too coarse for float64 finite differences")
MLX_NO_COMPLEX128 = "MLX has no complex128, and complex64 is too coarse for float64 finite differences"
MLX_NO_DERIVATIVE = ("MLX does not differentiate mx.linalg.inv, solve, cholesky, eigvalsh and svd "
                     "(no VJP)")
#: entries with a complex128 argument cannot run on these backends at that precision
_NO_COMPLEX128 = {"mlx": MLX_NO_COMPLEX128}


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


# -- inputs ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Arg:
    """One positional argument: its shape, dtype and how its values are drawn.

    ``sample``:

    - ``"normal"``: standard normal entries (real and imaginary parts for complex);
    - ``"uniform"``: uniform in ``[low, high)``;
    - ``"positive"``: uniform in ``[0.5, 2)``;
    - ``"nonzero"``: magnitude uniform in ``[0.5, 1.5)``, random sign;
    - ``"distinct"``: a shuffled grid with spacing 0.5 plus noise below 0.1, so the
      entries are at least 0.3 apart (no ties for ``max``);
    - ``"well_conditioned"``: ``2 I + 0.3 N`` for square matrices (away from singular);
    - ``"annulus"``: complex entries of magnitude in ``[0.5, 2)`` (away from ``|z| = 0``).
    """

    shape: tuple
    dtype: str = "float64"
    sample: str = "normal"
    low: float = 0.0
    high: float = 1.0

    def describe(self) -> str:
        shape = "x".join(map(str, self.shape)) or "scalar"
        extra = "" if self.sample == "normal" else f" {self.sample}"
        if self.sample == "uniform":
            extra = f" in [{self.low:g}, {self.high:g})"
        return f"{shape} {self.dtype}{extra}"

    def draw(self, rng: np.random.Generator) -> np.ndarray:
        shape, complex_ = self.shape, self.dtype.startswith("complex")
        s = self.sample
        if s == "normal":
            a = rng.standard_normal(shape)
            if complex_:
                a = a + 1j * rng.standard_normal(shape)
        elif s in ("uniform", "positive"):
            low, high = (0.5, 2.0) if s == "positive" else (self.low, self.high)
            a = rng.uniform(low, high, shape)
        elif s == "nonzero":
            a = rng.uniform(0.5, 1.5, shape) * rng.choice([-1.0, 1.0], shape)
        elif s == "distinct":
            n = math.prod(shape)
            a = (rng.permutation(n) * 0.5 - 0.25 * n + rng.uniform(-0.1, 0.1, n)).reshape(shape)
        elif s == "well_conditioned":
            n = shape[-1]
            a = 2.0 * np.eye(n) + 0.3 * rng.standard_normal(shape)
        elif s == "annulus":
            a = rng.uniform(0.5, 2.0, shape) * np.exp(1j * rng.uniform(0, 2 * np.pi, shape))
        else:
            raise ValueError(f"unknown sample {s!r}")
        if np.iscomplexobj(a) and not complex_:
            raise ValueError(f"sample {s!r} gives complex values, dtype is {self.dtype}")
        return np.ascontiguousarray(np.asarray(a, dtype=self.dtype))


# -- entries --------------------------------------------------------------------------------

@dataclass(frozen=True)
class Entry:
    """One catalog function.

    name : str
        Unique, and not a kind name (``--only`` takes both).
    kinds : tuple of str
        Some of :data:`KINDS`.
    args : tuple of Arg
        The positional arguments; :meth:`inputs` draws them from ``seed``.
    fn : callable
        The function, written against the array API (for ``custom`` entries: the plain
        forward computation, which the NumPy backend runs).
    ports : callable, optional
        ``ports(backend_name) -> callable`` for entries with framework-specific code
        (hand-written derivatives); ``None`` for an unsupported backend.
    vjp, jvp : callable, optional
        Hand-written derivatives of ``fn`` for the NumPy backend (torch's complex
        convention; see docs/numpy.md). The NumPy backend checks only entries that have them.
    reverse_only : frozenset of str
        Backends on which only reverse mode is checked (e.g. a ``jax.custom_vjp`` has no
        forward mode).
    not_on : tuple of (str, str)
        ``(backend, reason)`` pairs: the backends that cannot check ``fn`` as written, and
        why (TensorFlow refuses mixed real/complex arithmetic through Python's operators;
        MLX computes float64 ``exp`` at float32 accuracy). Entries with a complex128
        argument are also excluded on MLX (:meth:`exclusion`).
    """

    name: str
    kinds: tuple
    args: tuple
    fn: Callable
    seed: int = 0
    description: str = ""
    ports: Callable | None = None
    vjp: Callable | None = None
    jvp: Callable | None = None
    reverse_only: frozenset = field(default_factory=frozenset)
    not_on: tuple = ()

    def inputs(self) -> tuple:
        """The inputs as NumPy arrays (fresh copies, the same on every call)."""
        rng = np.random.default_rng(self.seed)
        return tuple(a.draw(rng) for a in self.args)

    def describe_inputs(self) -> str:
        return ", ".join(a.describe() for a in self.args)

    def function(self, backend: str) -> Callable | None:
        """The implementation to run on ``backend`` (``None`` if the entry has none)."""
        if backend == "numpy":
            return self.fn if (self.vjp is not None or self.jvp is not None) else None
        if self.ports is not None:
            return self.ports(backend)
        return self.fn

    def exclusion(self, backend: str) -> str | None:
        """Why ``backend`` cannot check this entry, though it has an implementation there
        (``None`` when it can, or has none)."""
        for name, reason in self.not_on:
            if name == backend:
                return reason
        if backend in _NO_COMPLEX128 and any(a.dtype == "complex128" for a in self.args):
            return _NO_COMPLEX128[backend]
        return None

    def supports(self, backend: str) -> bool:
        if backend == "numpy":
            return self.vjp is not None or self.jvp is not None
        if self.exclusion(backend) is not None:
            return False
        if self.ports is not None:
            return self.ports(backend) is not None
        return backend in ("torch", "jax", "tensorflow", "mlx")

    def forward_ad(self, backend: str) -> bool:
        """Is forward-mode AD checked on ``backend``?"""
        if backend in self.reverse_only:
            return False
        if backend == "numpy":
            return self.jvp is not None
        return True

    def backend_options(self, backend: str) -> dict:
        if backend == "numpy":
            return {"vjp": self.vjp, "jvp": self.jvp}
        return {}


# -- elementwise ----------------------------------------------------------------------------

def sin(x):
    return _ns(x).sin(x)


def sin_vjp(inputs, cots):
    (x,), (g,) = inputs, cots
    return (_ns(x).cos(x) * g,)


def sin_jvp(inputs, tangents):
    (x,), (t,) = inputs, tangents
    return _ns(x).cos(x) * t


def exp(x):
    return _ns(x).exp(x)


def exp_vjp(inputs, cots):
    (x,), (g,) = inputs, cots
    return (_ns(x).exp(x) * g,)


def exp_jvp(inputs, tangents):
    (x,), (t,) = inputs, tangents
    return _ns(x).exp(x) * t


def tanh(x):
    return _ns(x).tanh(x)


def tanh_vjp(inputs, cots):
    (x,), (g,) = inputs, cots
    y = _ns(x).tanh(x)
    return ((1 - y * y) * g,)


def tanh_jvp(inputs, tangents):
    (x,), (t,) = inputs, tangents
    y = _ns(x).tanh(x)
    return (1 - y * y) * t


def log1p(x):
    return _ns(x).log1p(x)


def sqrt(x):
    return _ns(x).sqrt(x)


def power(x, y):
    return _ns(x, y).pow(x, y)


def sigmoid(x):
    xp = _ns(x)
    return 1.0 / (1.0 + xp.exp(-x))


def sigmoid_vjp(inputs, cots):
    (x,), (g,) = inputs, cots
    s = sigmoid(x)
    return (s * (1 - s) * g,)


def sigmoid_jvp(inputs, tangents):
    (x,), (t,) = inputs, tangents
    s = sigmoid(x)
    return s * (1 - s) * t


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


# -- custom derivatives ---------------------------------------------------------------------

def softplus_custom(x):
    """``log(1 + exp(x))``; its derivatives are hand-written on every backend."""
    return softplus(x)


def softplus_custom_vjp(inputs, cots):
    (x,), (g,) = inputs, cots
    return (sigmoid(x) * g,)


def softplus_custom_jvp(inputs, tangents):
    (x,), (t,) = inputs, tangents
    return sigmoid(x) * t


@functools.lru_cache(maxsize=None)
def _softplus_ports(backend: str):
    if backend == "torch":
        import torch

        class Softplus(torch.autograd.Function):
            """softplus with a hand-written backward and forward-mode jvp"""

            @staticmethod
            def forward(ctx, x):
                ctx.save_for_backward(x)
                ctx.save_for_forward(x)
                return torch.log1p(torch.exp(x))

            @staticmethod
            def backward(ctx, g):
                (x,) = ctx.saved_tensors
                return g * torch.sigmoid(x)

            @staticmethod
            def jvp(ctx, t):
                (x,) = ctx.saved_tensors
                return t * torch.sigmoid(x)

        def softplus_torch(x):
            return Softplus.apply(x)

        return softplus_torch
    if backend == "jax":
        import jax
        import jax.numpy as jnp

        @jax.custom_jvp
        def softplus_jax(x):
            return jnp.log1p(jnp.exp(x))

        @softplus_jax.defjvp
        def _softplus_jax_jvp(primals, tangents):
            (x,), (t,) = primals, tangents
            return softplus_jax(x), t / (1 + jnp.exp(-x))

        return softplus_jax
    if backend == "tensorflow":
        from agcheck.backends.tensorflow_loading import import_tensorflow

        tf = import_tensorflow()

        @tf.custom_gradient
        def softplus_tf(x):
            def backward(g):
                return g * tf.sigmoid(x)

            return tf.math.log1p(tf.exp(x)), backward

        return softplus_tf
    if backend == "mlx":
        import mlx.core as mx

        @mx.custom_function
        def softplus_mlx(x):
            return mx.log1p(mx.exp(x))

        @softplus_mlx.vjp
        def _softplus_mlx_vjp(primals, cotangent, output):  # one input: primals is the array
            return cotangent * mx.sigmoid(primals)

        @softplus_mlx.jvp
        def _softplus_mlx_jvp(primals, tangents):
            return tangents * mx.sigmoid(primals)

        return softplus_mlx
    return None


def cube_custom_vjp(x):
    """``x ** 3``; reverse mode hand-written (a ``jax.custom_vjp`` has no forward mode)."""
    return x * x * x


def cube_custom_vjp_vjp(inputs, cots):
    (x,), (g,) = inputs, cots
    return (3 * x * x * g,)


@functools.lru_cache(maxsize=None)
def _cube_ports(backend: str):
    if backend == "torch":
        import torch

        class Cube(torch.autograd.Function):
            """x ** 3 with a hand-written backward only"""

            @staticmethod
            def forward(ctx, x):
                ctx.save_for_backward(x)
                return x * x * x

            @staticmethod
            def backward(ctx, g):
                (x,) = ctx.saved_tensors
                return 3 * x * x * g

        def cube_torch(x):
            return Cube.apply(x)

        return cube_torch
    if backend == "jax":
        import jax

        @jax.custom_vjp
        def cube_jax(x):
            return x * x * x

        cube_jax.defvjp(lambda x: (x * x * x, x), lambda x, g: (3 * x * x * g,))
        return cube_jax
    if backend == "tensorflow":
        from agcheck.backends.tensorflow_loading import import_tensorflow

        tf = import_tensorflow()

        @tf.custom_gradient
        def cube_tf(x):
            return x * x * x, lambda g: 3 * x * x * g

        return cube_tf
    if backend == "mlx":
        import mlx.core as mx

        @mx.custom_function
        def cube_mlx(x):
            return x * x * x

        @cube_mlx.vjp
        def _cube_mlx_vjp(primals, cotangent, output):  # one input: primals is the array
            return 3 * primals * primals * cotangent

        return cube_mlx
    return None


# -- the catalog ----------------------------------------------------------------------------

def _e(name, kinds, args, fn, seed, description, **kw) -> Entry:
    kinds = tuple(kinds.split())
    return Entry(name=name, kinds=kinds, args=tuple(args), fn=fn, seed=seed, description=description, **kw)


#: most entries take 3 x 4 arrays: JAX compiles its helper programs once per shape
R34 = Arg((3, 4))
_MLX_F32 = (("mlx", MLX_FLOAT32_INSIDE),)
_MLX_NO_D = (("mlx", MLX_NO_DERIVATIVE),)

CATALOG: tuple = (
    # elementwise
    _e("sin", "elementwise", [R34], sin, 1, "sin(x)", vjp=sin_vjp, jvp=sin_jvp, not_on=_MLX_F32),
    _e("exp", "elementwise", [R34], exp, 2, "exp(x)", vjp=exp_vjp, jvp=exp_jvp, not_on=_MLX_F32),
    _e("tanh", "elementwise", [R34], tanh, 3, "tanh(x)", vjp=tanh_vjp, jvp=tanh_jvp),
    _e("log1p", "elementwise", [Arg((3, 4), sample="uniform", low=-0.5, high=2.0)], log1p, 4, "log1p(x), x > -0.5"),
    _e("sqrt", "elementwise", [Arg((3, 4), sample="positive")], sqrt, 5, "sqrt(x), x > 0"),
    _e("pow", "elementwise", [Arg((3, 4), sample="positive"), R34], power, 6, "x ** y, x > 0"),
    _e("sigmoid", "elementwise", [R34], sigmoid, 7, "1 / (1 + exp(-x))", vjp=sigmoid_vjp, jvp=sigmoid_jvp,
       not_on=_MLX_F32),
    _e("atan2", "elementwise", [R34, Arg((3, 4), sample="positive")], atan2, 9, "atan2(y, x), x > 0"),
    _e("logaddexp", "elementwise", [R34, R34], logaddexp, 11, "logaddexp(x, y)", not_on=_MLX_F32),
    _e("expm1_cos", "elementwise", [R34, R34], expm1_cos, 13, "expm1(x) * cos(y)", not_on=_MLX_F32),
    # reductions
    _e("sum_squares", "reduction", [R34], sum_squares, 20, "sum(x * x, axis=1)",
       vjp=sum_squares_vjp, jvp=sum_squares_jvp),
    _e("prod", "reduction", [Arg((3, 4), sample="nonzero")], prod, 22, "prod(x, axis=-1), no zeros"),
    _e("mean_and_var", "reduction", [R34], mean_and_var, 23, "(mean, var(correction=1)) along axis 0"),
    _e("std", "reduction", [R34], std, 24, "std(x, correction=0) of all entries"),
    _e("max", "reduction", [Arg((3, 4), sample="distinct")], max_, 25, "max(x, axis=1), no ties"),
    _e("cumulative_sum", "reduction", [R34], cumulative_sum, 26, "cumulative_sum(x * x, axis=1)"),
    # linear algebra
    _e("matmul", "linalg", [R34, Arg((4, 3))], matmul, 30, "a @ b", vjp=matmul_vjp, jvp=matmul_jvp),
    _e("matrix_norm", "linalg", [R34], matrix_norm, 31, "Frobenius norm"),
    _e("vector_norm", "linalg", [Arg((3, 4), sample="nonzero")], vector_norm, 32, "2-norm of each row, away from 0",
       vjp=vector_norm_vjp, jvp=vector_norm_jvp),
    _e("det", "linalg", [Arg((3, 3), sample="well_conditioned")], det, 33, "det(a), well conditioned"),
    _e("inv", "linalg", [Arg((3, 3), sample="well_conditioned")], inv, 34, "inv(a), well conditioned",
       not_on=_MLX_NO_D),
    _e("solve", "linalg", [Arg((3, 3), sample="well_conditioned"), R34], solve, 35,
       "solve(a, b), well conditioned", not_on=_MLX_NO_D),
    _e("trace_of_product", "linalg", [Arg((3, 3)), Arg((3, 3))], trace_of_product, 36, "trace(a @ b)"),
    _e("outer", "linalg", [Arg((3,)), Arg((4,))], outer, 37, "outer(x, y)"),
    _e("cholesky", "linalg", [Arg((3, 3))], cholesky, 38, "cholesky(x x^T + 3 I)", not_on=_MLX_NO_D),
    _e("logabsdet", "linalg", [Arg((3, 3), sample="well_conditioned")], logabsdet, 39, "slogdet(a)[1]"),
    _e("eigvalsh", "linalg", [Arg((3, 3))], eigvalsh, 40, "eigvalsh((x + x^T) / 2), distinct eigenvalues",
       not_on=_MLX_NO_D),
    _e("svdvals", "linalg", [R34], svdvals, 41, "singular values, distinct", not_on=_MLX_NO_D),
    # composite functions written from primitives
    _e("softmax", "composite", [R34], softmax, 50, "softmax along the last axis (max-shifted)",
       vjp=softmax_vjp, jvp=softmax_jvp, not_on=_MLX_F32),
    _e("logsumexp", "composite", [R34], logsumexp, 52, "logsumexp along the last axis (max-shifted)",
       not_on=_MLX_F32),
    _e("layer_norm", "composite", [R34, Arg((4,)), Arg((4,))], layer_norm, 53,
       "layer normalisation with weight and bias"),
    _e("mlp", "composite linalg", [R34, Arg((4, 4)), Arg((4,)), Arg((4, 3))], mlp, 54, "tanh(x @ w + b) @ v"),
    # complex
    _e("abs_squared", "complex", [Arg((4,), "complex128")], abs_squared, 60, "real(z * conj(z)): C -> R",
       vjp=abs_squared_vjp, jvp=abs_squared_jvp),
    _e("mul_conj", "complex", [Arg((4,), "complex128"), Arg((4,), "complex128")], mul_conj, 61,
       "z * conj(w): not holomorphic", vjp=mul_conj_vjp, jvp=mul_conj_jvp),
    _e("complex_exp", "complex elementwise", [Arg((4,), "complex128")], complex_exp, 62, "exp(z)",
       vjp=complex_exp_vjp, jvp=complex_exp_jvp),
    _e("real_times_imag", "complex", [Arg((4,), "complex128")], real_times_imag, 63, "real(z) * imag(z)"),
    _e("complex_abs", "complex", [Arg((4,), "complex128", "annulus")], complex_abs, 64, "abs(z), |z| >= 0.5"),
    _e("complex_matmul", "complex linalg", [Arg((2, 2), "complex128"), Arg((2, 2), "complex128")],
       complex_matmul, 65, "a @ b, complex"),
    _e("z_sin_z", "complex elementwise", [Arg((4,), "complex128")], z_sin_z, 66, "z * sin(z): holomorphic"),
    _e("real_of_exp_times", "complex", [Arg((4,), "complex128"), Arg((4,))], real_of_exp_times, 68,
       "real(exp(z) * w), w real",
       not_on=(("tensorflow", "TensorFlow refuses mixed real and complex arithmetic through Python's operators"),)),
    # hand-written derivatives
    _e("softplus_custom", "custom elementwise", [R34], softplus_custom, 70,
       "softplus: torch.autograd.Function (backward + jvp), jax.custom_jvp, tf.custom_gradient "
       "(reverse mode: TF's forward mode does not use custom gradients), mx.custom_function (vjp + jvp), "
       "NumPy vjp + jvp",
       ports=_softplus_ports, vjp=softplus_custom_vjp, jvp=softplus_custom_jvp,
       reverse_only=frozenset({"tensorflow"}), not_on=_MLX_F32),
    _e("cube_custom_vjp", "custom elementwise", [R34], cube_custom_vjp, 71,
       "x ** 3: torch.autograd.Function, jax.custom_vjp, tf.custom_gradient and mx.custom_function "
       "(reverse mode only), NumPy vjp",
       ports=_cube_ports, vjp=cube_custom_vjp_vjp, reverse_only=frozenset({"torch", "jax", "tensorflow", "mlx"})),
)


def by_name() -> dict:
    return {e.name: e for e in CATALOG}


def select(names, entries=CATALOG) -> list:
    """The entries named in ``names`` (entry names or kind names), in catalog order.

    Raises ``KeyError`` listing the names that match nothing.
    """
    wanted = [n.strip() for n in names if n.strip()]
    unknown = [n for n in wanted if n not in KINDS and all(e.name != n for e in entries)]
    if unknown:
        raise KeyError(", ".join(unknown))
    return [e for e in entries if e.name in wanted or any(k in wanted for k in e.kinds)]


# -- a deliberately broken entry (agcheck --demo-failure) -----------------------------------

def exp_broken_vjp(inputs, cots):
    (x,), (g,) = inputs, cots
    return (_ns(x).exp(x) * g,)  # the NumPy port is right: only torch's is broken


@functools.lru_cache(maxsize=None)
def _broken_exp_ports(backend: str):
    if backend == "torch":
        import torch

        class ScaledBackwardExp(torch.autograd.Function):
            """exp whose backward and jvp are wrong by a factor of 2"""

            @staticmethod
            def forward(ctx, x):
                y = torch.exp(x)
                ctx.save_for_backward(y)
                ctx.save_for_forward(y)
                return y

            @staticmethod
            def backward(ctx, g):
                (y,) = ctx.saved_tensors
                return 2 * g * y  # the bug: the derivative of exp is exp, not 2 exp

            @staticmethod
            def jvp(ctx, t):
                (y,) = ctx.saved_tensors
                return 2 * t * y

        def exp_broken_torch(x):
            return ScaledBackwardExp.apply(x)

        return exp_broken_torch
    if backend == "jax":
        import jax.numpy as jnp

        return jnp.exp
    if backend == "mlx":
        import mlx.core as mx

        return mx.exp
    return None


def demo_failure_entry() -> Entry:
    """``exp`` whose torch port (an ``autograd.Function``) has its derivatives scaled by 2:
    gradcheck fails on torch, passes elsewhere, and the backends disagree."""
    return _e("exp_broken_backward", "custom elementwise", [Arg((3,))], exp, 99,
              "DELIBERATELY BROKEN: torch autograd.Function with backward and jvp scaled by 2",
              ports=_broken_exp_ports, vjp=exp_broken_vjp, not_on=_MLX_F32)
