"""The bundled catalog of functions that the main job (``python -m agcheck``) checks.

Every function is written once against the array API (``array_api_compat.array_namespace``;
TensorFlow and MLX through :mod:`agcheck.backends.tensorflow_xp` and :mod:`~agcheck.backends.mlx_xp`),
except the ``custom`` entries, whose hand-written derivatives give one port per backend
(:mod:`agcheck.frontends.catalog_ports`). Seeds and samplers keep inputs away from the points
where the frameworks legitimately differ (kinks, ties, zeros of norms: docs/crosscheck.md).
Importing the catalog imports neither torch nor jax.
"""
from __future__ import annotations

from agcheck.frontends import catalog_functions as fns
from agcheck.frontends.catalog_entry import (KINDS, MLX_FLOAT32_INSIDE, MLX_NO_COMPLEX128, MLX_NO_DERIVATIVE, Arg,
                                             Entry)
from agcheck.frontends.catalog_ports import broken_exp_ports, cube_ports, softplus_ports

__all__ = ["Arg", "Entry", "CATALOG", "KINDS", "by_name", "select", "demo_failure_entry",
           "MLX_FLOAT32_INSIDE", "MLX_NO_COMPLEX128", "MLX_NO_DERIVATIVE"]


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
    _e("sin", "elementwise", [R34], fns.sin, 1, "sin(x)", vjp=fns.sin_vjp, jvp=fns.sin_jvp, not_on=_MLX_F32),
    _e("exp", "elementwise", [R34], fns.exp, 2, "exp(x)", vjp=fns.exp_vjp, jvp=fns.exp_jvp, not_on=_MLX_F32),
    _e("tanh", "elementwise", [R34], fns.tanh, 3, "tanh(x)", vjp=fns.tanh_vjp, jvp=fns.tanh_jvp),
    _e("log1p", "elementwise", [Arg((3, 4), sample="uniform", low=-0.5, high=2.0)], fns.log1p, 4,
       "log1p(x), x > -0.5"),
    _e("sqrt", "elementwise", [Arg((3, 4), sample="positive")], fns.sqrt, 5, "sqrt(x), x > 0"),
    _e("pow", "elementwise", [Arg((3, 4), sample="positive"), R34], fns.power, 6, "x ** y, x > 0"),
    _e("sigmoid", "elementwise", [R34], fns.sigmoid, 7, "1 / (1 + exp(-x))", vjp=fns.sigmoid_vjp, jvp=fns.sigmoid_jvp,
       not_on=_MLX_F32),
    _e("atan2", "elementwise", [R34, Arg((3, 4), sample="positive")], fns.atan2, 9, "atan2(y, x), x > 0"),
    _e("logaddexp", "elementwise", [R34, R34], fns.logaddexp, 11, "logaddexp(x, y)", not_on=_MLX_F32),
    _e("expm1_cos", "elementwise", [R34, R34], fns.expm1_cos, 13, "expm1(x) * cos(y)", not_on=_MLX_F32),
    # reductions
    _e("sum_squares", "reduction", [R34], fns.sum_squares, 20, "sum(x * x, axis=1)",
       vjp=fns.sum_squares_vjp, jvp=fns.sum_squares_jvp),
    _e("prod", "reduction", [Arg((3, 4), sample="nonzero")], fns.prod, 22, "prod(x, axis=-1), no zeros"),
    _e("mean_and_var", "reduction", [R34], fns.mean_and_var, 23, "(mean, var(correction=1)) along axis 0"),
    _e("std", "reduction", [R34], fns.std, 24, "std(x, correction=0) of all entries"),
    _e("max", "reduction", [Arg((3, 4), sample="distinct")], fns.max_, 25, "max(x, axis=1), no ties"),
    _e("cumulative_sum", "reduction", [R34], fns.cumulative_sum, 26, "cumulative_sum(x * x, axis=1)"),
    # linear algebra
    _e("matmul", "linalg", [R34, Arg((4, 3))], fns.matmul, 30, "a @ b", vjp=fns.matmul_vjp, jvp=fns.matmul_jvp),
    _e("matrix_norm", "linalg", [R34], fns.matrix_norm, 31, "Frobenius norm"),
    _e("vector_norm", "linalg", [Arg((3, 4), sample="nonzero")], fns.vector_norm, 32,
       "2-norm of each row, away from 0", vjp=fns.vector_norm_vjp, jvp=fns.vector_norm_jvp),
    _e("det", "linalg", [Arg((3, 3), sample="well_conditioned")], fns.det, 33, "det(a), well conditioned"),
    _e("inv", "linalg", [Arg((3, 3), sample="well_conditioned")], fns.inv, 34, "inv(a), well conditioned",
       not_on=_MLX_NO_D),
    _e("solve", "linalg", [Arg((3, 3), sample="well_conditioned"), R34], fns.solve, 35,
       "solve(a, b), well conditioned", not_on=_MLX_NO_D),
    _e("trace_of_product", "linalg", [Arg((3, 3)), Arg((3, 3))], fns.trace_of_product, 36, "trace(a @ b)"),
    _e("outer", "linalg", [Arg((3,)), Arg((4,))], fns.outer, 37, "outer(x, y)"),
    _e("cholesky", "linalg", [Arg((3, 3))], fns.cholesky, 38, "cholesky(x x^T + 3 I)", not_on=_MLX_NO_D),
    _e("logabsdet", "linalg", [Arg((3, 3), sample="well_conditioned")], fns.logabsdet, 39, "slogdet(a)[1]"),
    _e("eigvalsh", "linalg", [Arg((3, 3))], fns.eigvalsh, 40, "eigvalsh((x + x^T) / 2), distinct eigenvalues",
       not_on=_MLX_NO_D),
    _e("svdvals", "linalg", [R34], fns.svdvals, 41, "singular values, distinct", not_on=_MLX_NO_D),
    # composite functions written from primitives
    _e("softmax", "composite", [R34], fns.softmax, 50, "softmax along the last axis (max-shifted)",
       vjp=fns.softmax_vjp, jvp=fns.softmax_jvp, not_on=_MLX_F32),
    _e("logsumexp", "composite", [R34], fns.logsumexp, 52, "logsumexp along the last axis (max-shifted)",
       not_on=_MLX_F32),
    _e("layer_norm", "composite", [R34, Arg((4,)), Arg((4,))], fns.layer_norm, 53,
       "layer normalisation with weight and bias"),
    _e("mlp", "composite linalg", [R34, Arg((4, 4)), Arg((4,)), Arg((4, 3))], fns.mlp, 54, "tanh(x @ w + b) @ v"),
    # complex
    _e("abs_squared", "complex", [Arg((4,), "complex128")], fns.abs_squared, 60, "real(z * conj(z)): C -> R",
       vjp=fns.abs_squared_vjp, jvp=fns.abs_squared_jvp),
    _e("mul_conj", "complex", [Arg((4,), "complex128"), Arg((4,), "complex128")], fns.mul_conj, 61,
       "z * conj(w): not holomorphic", vjp=fns.mul_conj_vjp, jvp=fns.mul_conj_jvp),
    _e("complex_exp", "complex elementwise", [Arg((4,), "complex128")], fns.complex_exp, 62, "exp(z)",
       vjp=fns.complex_exp_vjp, jvp=fns.complex_exp_jvp),
    _e("real_times_imag", "complex", [Arg((4,), "complex128")], fns.real_times_imag, 63, "real(z) * imag(z)"),
    _e("complex_abs", "complex", [Arg((4,), "complex128", "annulus")], fns.complex_abs, 64, "abs(z), |z| >= 0.5"),
    _e("complex_matmul", "complex linalg", [Arg((2, 2), "complex128"), Arg((2, 2), "complex128")],
       fns.complex_matmul, 65, "a @ b, complex"),
    _e("z_sin_z", "complex elementwise", [Arg((4,), "complex128")], fns.z_sin_z, 66, "z * sin(z): holomorphic"),
    _e("real_of_exp_times", "complex", [Arg((4,), "complex128"), Arg((4,))], fns.real_of_exp_times, 68,
       "real(exp(z) * w), w real",
       not_on=(("tensorflow", "TensorFlow refuses mixed real and complex arithmetic through Python's operators"),)),
    # hand-written derivatives
    _e("softplus_custom", "custom elementwise", [R34], fns.softplus_custom, 70,
       "softplus: torch.autograd.Function (backward + jvp), jax.custom_jvp, tf.custom_gradient "
       "(reverse mode: TF's forward mode does not use custom gradients), mx.custom_function (vjp + jvp), "
       "NumPy vjp + jvp",
       ports=softplus_ports, vjp=fns.softplus_custom_vjp, jvp=fns.softplus_custom_jvp,
       reverse_only=frozenset({"tensorflow"}), not_on=_MLX_F32),
    _e("cube_custom_vjp", "custom elementwise", [R34], fns.cube_custom_vjp, 71,
       "x ** 3: torch.autograd.Function, jax.custom_vjp, tf.custom_gradient and mx.custom_function "
       "(reverse mode only), NumPy vjp",
       ports=cube_ports, vjp=fns.cube_custom_vjp_vjp, reverse_only=frozenset({"torch", "jax", "tensorflow", "mlx"})),
)


def by_name() -> dict:
    return {e.name: e for e in CATALOG}


def select(names, entries=CATALOG) -> list:
    """The entries named in ``names`` (entry or kind names), in catalog order; a ``KeyError``
    lists the names that match nothing."""
    wanted = [n.strip() for n in names if n.strip()]
    unknown = [n for n in wanted if n not in KINDS and all(e.name != n for e in entries)]
    if unknown:
        raise KeyError(", ".join(unknown))
    return [e for e in entries if e.name in wanted or any(k in wanted for k in e.kinds)]


# -- a deliberately broken entry (agcheck --demo-failure) -----------------------------------

def demo_failure_entry() -> Entry:
    """``exp`` whose torch port (an ``autograd.Function``) has its derivatives scaled by 2:
    gradcheck fails on torch, passes elsewhere, and the backends disagree."""
    return _e("exp_broken_backward", "custom elementwise", [Arg((3,))], fns.exp, 99,
              "DELIBERATELY BROKEN: torch autograd.Function with backward and jvp scaled by 2",
              ports=broken_exp_ports, vjp=fns.exp_vjp, not_on=_MLX_F32)  # only torch's port is broken
