"""A small array-API namespace for MLX arrays.

``array_api_compat`` has no namespace for MLX, so code written against the array API
cannot reach MLX arrays through it. This adapter covers the names the main job's catalog
uses (elementwise functions, reductions, ``linalg``), with the array API's keywords
(``axis``, ``keepdims``, ``correction``), on top of ``mlx.core`` and ``mlx.core.linalg``:
each name is MLX's own operation, so a check of catalog code checks MLX's derivatives.
``mx.linalg`` runs on the CPU alone, so its functions are called on the CPU stream.
Code that asks ``array_api_compat`` itself still cannot run on MLX (see docs/mlx.md).
"""
from __future__ import annotations

from types import SimpleNamespace

import mlx.core as mx

__all__ = ["namespace"]


def _var(x, axis=None, correction=0.0, keepdims=False):
    return mx.var(x, axis=axis, keepdims=keepdims, ddof=int(correction))


def _std(x, axis=None, correction=0.0, keepdims=False):
    return mx.std(x, axis=axis, keepdims=keepdims, ddof=int(correction))


def _cumulative_sum(x, axis=None, include_initial=False):
    if include_initial:
        raise NotImplementedError("the MLX namespace covers cumulative_sum without include_initial only")
    if axis is None and x.ndim != 1:
        raise ValueError("cumulative_sum needs axis= for an array of more than one dimension")
    return mx.cumsum(x, axis=0 if axis is None else axis)


def _vector_norm(x, axis=None, keepdims=False, ord=2):
    return mx.linalg.norm(x, ord=ord, axis=axis, keepdims=keepdims)


def _matrix_norm(x, ord="fro", keepdims=False):
    return mx.linalg.norm(x, ord=ord, axis=(-2, -1), keepdims=keepdims)


def _on_cpu(op):
    """``op`` called on the CPU stream (MLX's linear algebra has no GPU kernels)."""
    def call(*args, **kwargs):
        return op(*args, stream=mx.cpu, **kwargs)

    call.__name__ = getattr(op, "__name__", "linalg")
    return call


_LINALG = SimpleNamespace(
    det=_on_cpu(mx.linalg.det),
    inv=_on_cpu(mx.linalg.inv),
    solve=_on_cpu(mx.linalg.solve),
    cholesky=_on_cpu(mx.linalg.cholesky),
    eigvalsh=_on_cpu(mx.linalg.eigvalsh),
    svdvals=lambda x: mx.linalg.svd(x, compute_uv=False, stream=mx.cpu),
    slogdet=_on_cpu(mx.linalg.slogdet),
    trace=lambda x, offset=0: mx.trace(x, offset=offset, axis1=-2, axis2=-1),
    outer=mx.outer,
    vector_norm=_vector_norm,
    matrix_norm=_matrix_norm,
)

namespace = SimpleNamespace(
    __name__="agcheck.backends.mlx_xp",
    sin=mx.sin, cos=mx.cos, tan=mx.tan, exp=mx.exp, expm1=mx.expm1, log=mx.log, log1p=mx.log1p,
    sqrt=mx.sqrt, tanh=mx.tanh, abs=mx.abs, atan2=mx.arctan2, pow=mx.power, logaddexp=mx.logaddexp,
    conj=mx.conj, real=mx.real, imag=mx.imag,
    sum=lambda x, axis=None, keepdims=False: mx.sum(x, axis=axis, keepdims=keepdims),
    prod=lambda x, axis=None, keepdims=False: mx.prod(x, axis=axis, keepdims=keepdims),
    mean=lambda x, axis=None, keepdims=False: mx.mean(x, axis=axis, keepdims=keepdims),
    max=lambda x, axis=None, keepdims=False: mx.max(x, axis=axis, keepdims=keepdims),
    var=_var,
    std=_std,
    squeeze=lambda x, axis: mx.squeeze(x, axis=axis),
    cumulative_sum=_cumulative_sum,
    matmul=mx.matmul,
    matrix_transpose=lambda x: mx.swapaxes(x, -1, -2),
    eye=lambda n, dtype=None: mx.eye(n, dtype=dtype or mx.float64),
    linalg=_LINALG,
)
