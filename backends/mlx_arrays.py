"""The MLX backend's array helpers: dtypes both ways, NumPy views and copies of MLX arrays
and MLX arrays made from them, the CPU stream for float64, and ``fn``'s checked outputs.
"""
from __future__ import annotations

import contextlib

import mlx.core as mx
import numpy as np

from agcheck.backends.host_checks import HostNamespace


_NAMES = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
          "float16", "float32", "float64", "complex64")
#: NumPy dtype -> MLX dtype (complex128, which MLX lacks, becomes complex64)
_TO_MX = {np.dtype(n): getattr(mx, "bool_" if n == "bool" else n) for n in _NAMES}
_TO_MX[np.dtype("complex128")] = mx.complex64
#: MLX dtype -> NumPy dtype (bfloat16, which NumPy lacks, is read as float32)
_TO_NP = {v: k for k, v in _TO_MX.items() if k != np.dtype("complex128")}
_TO_NP[mx.bfloat16] = np.dtype("float32")


def owns(x) -> bool:
    """Is ``x`` an MLX array?"""
    return isinstance(x, mx.array)


def _is_inexact(x) -> bool:
    return owns(x) and mx.issubdtype(x.dtype, mx.inexact)


def _np_dtype(dtype) -> np.dtype:
    return _TO_NP[dtype] if isinstance(dtype, mx.Dtype) else np.dtype(dtype)


def _mx_dtype(dtype):
    if isinstance(dtype, mx.Dtype):
        return dtype
    try:
        return _TO_MX[np.dtype(dtype)]
    except KeyError:
        raise TypeError(f"MLX has no dtype for NumPy's {np.dtype(dtype)}") from None


def _view(x) -> np.ndarray:
    """The values of ``x`` as a NumPy array, for reading only: an MLX array's own memory
    where NumPy can read it (bfloat16 is copied as float32); NumPy arrays as they are."""
    if owns(x) and x.dtype == mx.bfloat16:
        x = x.astype(mx.float32)
    return np.asarray(x)


def _copy(x) -> np.ndarray:
    """A NumPy copy of ``x`` (a view of an MLX array's memory would write into it)."""
    return np.array(_view(x), copy=True)


def _back(values, dtype=None):
    """NumPy ``values`` as a new MLX array of ``dtype`` (by default the MLX dtype of the
    values' own), cast as NumPy casts. Making an array computes nothing on any device."""
    values = np.asarray(values)
    target = _mx_dtype(values.dtype if dtype is None else dtype)
    if target != mx.bfloat16:
        values = values.astype(_np_dtype(target), copy=False)
    return mx.array(values, dtype=target)


def _back_like(values, like=None, dtype=None):
    """A NumPy result of the core's algebra as an MLX array: of ``dtype`` when one was asked
    for, else of ``like``'s dtype where ``like``'s values were read in the result's (a
    bfloat16 array stays bfloat16)."""
    values = np.asarray(values)
    if dtype is None and owns(like) and _np_dtype(like.dtype) == values.dtype:
        dtype = like.dtype
    return _back(values, dtype)


#: the core's algebra: NumPy on the arrays' host views, results made MLX arrays
_XP = HostNamespace(_view, _back_like, dtype=_np_dtype)


def _as_mx(x, dtype=None, shape=None):
    """``x`` (MLX, NumPy or a Python number) as an MLX array of ``dtype`` and ``shape``."""
    if owns(x):
        if dtype is not None and x.dtype != dtype:
            x = x.astype(dtype)
    else:
        x = _back(x, dtype)
    if shape is not None and tuple(x.shape) != tuple(shape):
        x = mx.reshape(x, tuple(shape))
    return x


def _on_cpu_for(arrays):
    """``mx.stream(mx.cpu)`` where an MLX array among ``arrays`` is float64 (which MLX
    computes on the CPU only), else a context that does nothing."""
    if any(owns(a) and a.dtype == mx.float64 for a in arrays):
        return mx.stream(mx.cpu)
    return contextlib.nullcontext()


def _evaluated(values):
    """``values`` (a list or tuple) with its MLX arrays evaluated: MLX is lazy, and the work
    of a call (and any error it raises) belongs to that call, not to a later read."""
    arrays = [v for v in values if owns(v)]
    if arrays:
        mx.eval(arrays)
    return values


def _with_replaced(args, positions, values) -> tuple:
    new = list(args)
    for p, v in zip(positions, values):
        new[p] = v
    return tuple(new)


def _moved_entries(entries: np.ndarray, step, sign):
    """``entries - step`` or ``entries + step`` in their dtype, the step rounded to that
    dtype first, as MLX rounds a Python scalar (the element move of slow mode)."""
    delta = entries.dtype.type(step)
    return entries - delta if sign < 0 else entries + delta


class _Outputs:
    """``fn`` as MLX's transformations take it: a function of the checked inputs alone
    returning the list of its floating and complex MLX outputs (what is differentiated);
    the positions of those among everything ``fn`` returns are recorded at each call."""

    def __init__(self, fn, args, positions, as_tuple):
        self.fn, self.args, self.positions, self.as_tuple = fn, args, list(positions), as_tuple
        self.inexact: list[int] = []
        self.arrays: list = []  # shapes and dtypes of every MLX output of the last call

    def __call__(self, *values) -> list:
        outs = self.as_tuple(self.fn(*_with_replaced(self.args, self.positions, values)))
        self.inexact = [k for k, o in enumerate(outs) if _is_inexact(o)]
        self.arrays = [(k, tuple(o.shape), o.dtype) for k, o in enumerate(outs) if owns(o)]
        return [outs[k] for k in self.inexact]
