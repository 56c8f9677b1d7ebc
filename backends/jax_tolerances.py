"""The tolerances of ``jax.test_util.check_grads`` by dtype, as agcheck's drop-in
(:mod:`agcheck.backends.jax_dropin`) applies them, and the dtypes of its leaves."""
from __future__ import annotations

import jax
import numpy as np

__all__ = ["gradient_tolerance", "tol_for", "leaf_dtype", "is_py_scalar", "UPCAST", "NARROW_INTS", "PRECISION_WARNING"]

#: gradcheck's warning for inputs below double precision (JAX's checks run in any)
PRECISION_WARNING = r"Input #\d+ requires gradient and is not a double precision"


def _named(name):
    """The NumPy dtype called ``name`` (ml_dtypes' extended ones included), or None."""
    try:
        import ml_dtypes  # JAX's own dependency: bfloat16, float8_*, int4, ...
    except ImportError:  # pragma: no cover
        ml_dtypes = None
    kind = getattr(ml_dtypes, name, None) if ml_dtypes is not None else None
    try:
        return np.dtype(kind if kind is not None else name)
    except TypeError:
        return None  # a dtype this installation does not have


def _dtype_table(entries: dict) -> dict:
    return {_named(name): value for name, value in entries.items() if _named(name) is not None}


_LOW_PRECISION = ("float8_e3m4", "float8_e4m3", "float8_e4m3b11fnuz", "float8_e4m3fn", "float8_e4m3fnuz",
                  "float8_e5m2", "float8_e5m2fnuz")

#: tolerances of values (used where the gradient table has no entry: integers, bool, float0)
_VALUE_TOL = _dtype_table({
    "bool": 0, "int8": 0, "int16": 0, "int32": 0, "int64": 0, "uint8": 0, "uint16": 0, "uint32": 0, "uint64": 0,
    "int2": 0, "int4": 0, "uint2": 0, "uint4": 0, "int1": 0, "uint1": 0,
    "float4_e2m1fn": 1.0, "float8_e8m0fnu": 1.0, **{n: 0.1 for n in _LOW_PRECISION},
    "bfloat16": 1e-2, "float16": 1e-3, "float32": 1e-6, "float64": 1e-15, "complex64": 1e-6, "complex128": 1e-15,
})
_VALUE_TOL[np.dtype(jax.dtypes.float0)] = 0

#: default tolerances of derivatives by dtype
_GRAD_TOL = _dtype_table({
    "float4_e2m1fn": 1.0, "float8_e8m0fnu": 1.0, **{n: 0.1 for n in _LOW_PRECISION},
    "bfloat16": 0.1, "float16": 1e-2, "float32": 2e-3, "float64": 1e-5, "complex64": 1e-3, "complex128": 1e-5,
})

#: dtypes whose values are compared in float32, and narrow integers widened to a byte
UPCAST = {_named(n) for n in ("bfloat16", "float4_e2m1fn", "float8_e8m0fnu", *_LOW_PRECISION)} - {None}
NARROW_INTS = {_named(n): np.int8 if n.startswith("int") else np.uint8
                for n in ("int1", "int2", "int4", "uint1", "uint2", "uint4") if _named(n) is not None}

_PY_SCALAR_DTYPES = {bool: np.dtype(bool), int: np.dtype(np.int64), float: np.dtype(np.float64),
                     complex: np.dtype(np.complex128)}


def gradient_tolerance(tol=None) -> dict | float:
    """The tolerance table a check uses: the default gradient tolerances, overridden by
    ``tol`` (a dict by dtype), or the number ``tol`` itself."""
    if tol is None:
        return dict(_GRAD_TOL)
    if not isinstance(tol, dict):
        return tol
    table = dict(_GRAD_TOL)
    table.update({np.dtype(k): v for k, v in tol.items()})
    return table


def tol_for(dtype, tol) -> float:
    """The tolerance for ``dtype`` from a number or a table of :func:`gradient_tolerance`."""
    if not isinstance(tol, dict):
        return tol
    dtype = np.dtype(jax.dtypes.canonicalize_dtype(np.dtype(dtype)))
    return tol[dtype] if dtype in tol else _VALUE_TOL[dtype]


def is_py_scalar(v) -> bool:
    return isinstance(v, (bool, int, float, complex)) and not isinstance(v, np.generic)


def leaf_dtype(x) -> np.dtype:
    if hasattr(x, "dtype"):
        return np.dtype(x.dtype)
    if type(x) in _PY_SCALAR_DTYPES:
        return _PY_SCALAR_DTYPES[type(x)]
    return np.asarray(x).dtype
