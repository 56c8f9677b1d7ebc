"""A small array-API namespace for TensorFlow tensors.

``array_api_compat`` has no namespace for TensorFlow, so code written against the array
API cannot reach TF tensors through it. This adapter covers the names the main job's
catalog uses (elementwise functions, reductions, ``linalg``), with the array API's
keywords (``axis``, ``keepdims``, ``correction``), on top of ``tf.math`` and ``tf.linalg``.
Code that asks ``array_api_compat`` itself still cannot run on TF (see docs/tensorflow.md).
"""
from __future__ import annotations

from types import SimpleNamespace

from agcheck.backends.tensorflow_loading import import_tensorflow

tf = import_tensorflow()

__all__ = ["namespace"]


def _axis(axis):
    return list(axis) if isinstance(axis, tuple) else axis


def _var(x, axis=None, correction=0.0, keepdims=False):
    mean = tf.reduce_mean(x, axis=_axis(axis), keepdims=True)
    squares = tf.reduce_sum(tf.square(x - mean), axis=_axis(axis), keepdims=keepdims)
    count = tf.cast(tf.size(x) // tf.size(mean), x.dtype)  # the elements each mean reduced
    return squares / (count - correction)


def _matrix_transpose(x):
    return tf.linalg.matrix_transpose(x)


def _vector_norm(x, axis=None, keepdims=False, ord=2):
    if ord != 2:
        raise NotImplementedError("the TensorFlow namespace covers vector_norm with ord=2 only")
    return tf.sqrt(tf.reduce_sum(tf.square(tf.abs(x)), axis=_axis(axis), keepdims=keepdims))


def _matrix_norm(x, ord="fro", keepdims=False):
    if ord != "fro":
        raise NotImplementedError("the TensorFlow namespace covers matrix_norm with ord='fro' only")
    return tf.sqrt(tf.reduce_sum(tf.square(tf.abs(x)), axis=[-2, -1], keepdims=keepdims))


def _slogdet(x):
    sign, logabsdet = tf.linalg.slogdet(x)
    return sign, logabsdet


def _cumulative_sum(x, axis=None):
    return tf.math.cumsum(x, axis=0 if axis is None else axis)


_LINALG = SimpleNamespace(
    det=tf.linalg.det,
    inv=tf.linalg.inv,
    solve=tf.linalg.solve,
    cholesky=tf.linalg.cholesky,
    eigvalsh=lambda x: tf.linalg.eigvalsh(x),
    svdvals=lambda x: tf.linalg.svd(x, compute_uv=False),
    slogdet=_slogdet,
    trace=lambda x: tf.linalg.trace(x),
    outer=lambda x, y: tf.tensordot(x, y, axes=0),
    vector_norm=_vector_norm,
    matrix_norm=_matrix_norm,
)

namespace = SimpleNamespace(
    __name__="agcheck.backends.tensorflow_xp",
    sin=tf.sin, cos=tf.cos, tan=tf.tan, exp=tf.exp, expm1=tf.math.expm1, log=tf.math.log,
    log1p=tf.math.log1p, sqrt=tf.sqrt, tanh=tf.tanh, abs=tf.abs, atan2=tf.math.atan2,
    pow=tf.pow, logaddexp=lambda x, y: tf.math.reduce_logsumexp(tf.stack([x, y]), axis=0),
    conj=tf.math.conj, real=tf.math.real, imag=tf.math.imag,
    sum=lambda x, axis=None, keepdims=False: tf.reduce_sum(x, axis=_axis(axis), keepdims=keepdims),
    prod=lambda x, axis=None, keepdims=False: tf.reduce_prod(x, axis=_axis(axis), keepdims=keepdims),
    mean=lambda x, axis=None, keepdims=False: tf.reduce_mean(x, axis=_axis(axis), keepdims=keepdims),
    max=lambda x, axis=None, keepdims=False: tf.reduce_max(x, axis=_axis(axis), keepdims=keepdims),
    var=_var,
    std=lambda x, axis=None, correction=0.0, keepdims=False: tf.sqrt(_var(x, axis, correction, keepdims)),
    squeeze=lambda x, axis: tf.squeeze(x, axis=axis),
    cumulative_sum=_cumulative_sum,
    matmul=tf.linalg.matmul,
    matrix_transpose=_matrix_transpose,
    eye=lambda n, dtype=None: tf.eye(n, dtype=dtype or tf.float64),
    linalg=_LINALG,
)
