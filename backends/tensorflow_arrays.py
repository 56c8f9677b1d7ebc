"""The TensorFlow backend's array helpers: the ``tf`` module, ownership and dtypes, host
(NumPy) views and TensorFlow tensors made from them, and the core's derived callables
rebuilt in TensorFlow's own arithmetic (:class:`_Native`).
"""
from __future__ import annotations

import numpy as np

from agcheck.backends.base import InputPart, OutputPart
from agcheck.backends.host_checks import HostNamespace
from agcheck.backends.tensorflow_loading import import_tensorflow

tf = import_tensorflow()  # triton first where it is installed (tensorflow_loading says why)
_NONE = tf.UnconnectedGradients.NONE


def owns(x) -> bool:
    """Is ``x`` a TensorFlow tensor or variable (``tf.is_tensor``)?"""
    return isinstance(x, (tf.Tensor, tf.Variable))


def _dtype(x):
    """``x``'s dtype as a ``tf.DType``."""
    return tf.as_dtype(x.dtype)


def _np_dtype(dtype):
    """A NumPy dtype for a ``tf.DType``, a NumPy dtype or anything ``np.dtype`` takes."""
    if isinstance(dtype, tf.DType):
        return np.dtype(dtype.as_numpy_dtype)
    return np.dtype(dtype)


def _is_inexact(x) -> bool:
    return owns(x) and (_dtype(x).is_floating or _dtype(x).is_complex)


def _is_complex_dtype(dtype) -> bool:
    return tf.as_dtype(dtype).is_complex


def _host(x):
    """``x`` as a NumPy array (TensorFlow objects are read; NumPy arrays pass through)."""
    if isinstance(x, np.ndarray):
        return x
    if owns(x):
        return np.asarray(x.numpy() if hasattr(x, "numpy") else x)  # 0-d: an array, not a scalar
    return np.asarray(x)


#: the core's algebra: NumPy on the host (the core computes on NumPy arrays, see the module)
_XP = HostNamespace(_host, lambda values, like, dtype: values, dtype=_np_dtype)


def _device(x) -> str | None:
    return getattr(x, "device", None) or None


def _to_tf(values, dtype=None, like=None):
    """``values`` (NumPy, TensorFlow or Python) as a ``tf.Tensor`` of ``dtype``, placed on
    ``like``'s device when it has one."""
    if isinstance(values, tf.Variable):
        values = values.read_value()
    if isinstance(values, tf.Tensor):
        if dtype is not None and values.dtype != tf.as_dtype(dtype):
            values = tf.cast(values, dtype)
        return values
    array = np.asarray(values)
    if dtype is not None:
        array = array.astype(_np_dtype(dtype), copy=False)
    device = _device(like) if like is not None else None
    if device:
        with tf.device(device):
            return tf.constant(array)
    return tf.constant(array)


def _with_replaced(args, positions, values) -> tuple:
    new = list(args)
    for p, v in zip(positions, values):
        new[p] = v
    return tuple(new)


class _Native:
    """What the core asks TensorFlow to differentiate, in TensorFlow's own arithmetic.

    The core's derived callables (:class:`InputPart`, :class:`OutputPart`) combine arrays
    with Python's operators; ``InputPart`` rebuilds a complex input as ``re + im * 1j``,
    which TensorFlow refuses (it does not promote a float tensor to complex). This backend
    unpacks them and rebuilds each with the same values through ``tf.complex`` /
    ``tf.math.real`` / ``tf.math.imag``.
    """

    def __init__(self, be):
        self.be = be

    def __call__(self, fn):
        be = self.be
        if isinstance(fn, InputPart):
            inner = self(fn.fn)
            positions, originals, part = fn.positions, fn.originals, fn.part

            def rebuilt(*args):
                new = list(args)
                for k in positions:
                    orig = originals[k]
                    moved = _to_tf(args[k], like=orig)
                    if part == "real":
                        new[k] = tf.complex(moved, tf.math.imag(_to_tf(orig)))
                    else:
                        new[k] = tf.complex(tf.math.real(_to_tf(orig)), moved)
                return be.as_tuple(inner(*new))

            return rebuilt
        if isinstance(fn, OutputPart):
            inner = self(fn.fn)
            take = tf.math.real if fn.part == "real" else tf.math.imag

            def part_of(*args):
                return tuple(take(o) if owns(o) and _dtype(o).is_complex else o for o in be.as_tuple(inner(*args)))

            return part_of
        return fn
