"""The JAX backend's array helpers: ownership, dtypes, the host views of CPU arrays,
cotangents and tangents in torch's convention, and ``fn``'s outputs as a flat tuple.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from agcheck.backends.host_checks import HostNamespace


def owns(x) -> bool:
    """Is ``x`` a JAX array (a concrete array or a tracer)?"""
    return isinstance(x, jax.Array)


def _is_inexact(x) -> bool:
    return owns(x) and jnp.issubdtype(x.dtype, jnp.inexact)


def _is_complex_dtype(dtype) -> bool:
    return jnp.issubdtype(dtype, jnp.complexfloating)


def _x64_enabled() -> bool:
    return bool(jax.config.jax_enable_x64)


def _device_of(x):
    """The single device of a concrete array (None for tracers or sharded arrays)."""
    try:
        devices = x.devices()
    except Exception:
        return None
    return next(iter(devices)) if len(devices) == 1 else None


def _host(x):
    """A NumPy view of ``x`` when it is a concrete JAX array on the CPU, else None.

    JAX compiles every primitive for every new shape when run eagerly (tens of ms each);
    the bookkeeping algebra of a check (reshapes, stacks, comparisons) is therefore done
    on such NumPy views (zero-copy), and results go back by ``jax.device_put``, which
    compiles nothing. Tracers and arrays on accelerators take the ``jax.numpy`` path and
    stay on their device.
    """
    if isinstance(x, np.ndarray):
        return x
    if not owns(x) or isinstance(x, jax.core.Tracer):
        return None
    device = _device_of(x)
    if device is None or device.platform != "cpu":
        return None
    return np.asarray(x)


def _back(values, like=None):
    """A NumPy result as a JAX array, on ``like``'s device when ``like`` is committed to one.

    ``jax.device_put`` rather than ``jnp.asarray``: the latter stages a copy that is
    compiled anew for every shape.
    """
    return jax.device_put(np.asarray(values), _committed_device(like))


#: the core's algebra: NumPy on the views of CPU arrays, jax.numpy for the others (see _host)
_XP = HostNamespace(_host, lambda values, like, dtype: _back(values, like), native=jnp)


def _committed_device(like):
    """``like``'s device where ``like`` is a concrete array committed to one, else None
    (the default device, uncommitted): a committed argument is a new cache key for every
    jitted function it meets, so each would compile again."""
    if like is None or not owns(like) or isinstance(like, jax.core.Tracer) or not getattr(like, "committed", True):
        return None
    return _device_of(like)


def _moved_entries(entries: np.ndarray, step, sign):
    """``entries - step`` or ``entries + step`` in their dtype, the step rounded to that dtype
    first, as JAX rounds a weak scalar (the element move of slow mode, on the host)."""
    delta = entries.dtype.type(step)
    return entries - delta if sign < 0 else entries + delta


def _joined(on_host, on_device, arrays, axis):
    """``arrays`` joined along ``axis``: by NumPy where all are on the host, else by JAX."""
    arrays = list(arrays)
    hosts = [_host(a) for a in arrays]
    if all(h is not None for h in hosts):
        return _back(on_host(hosts, axis=axis), arrays[0])
    return on_device(arrays, axis=axis)


def _conj(x):
    h = _host(x)
    if h is not None:
        return _back(np.conj(h), x)
    return jnp.conj(x)


def _astype(x, dtype):
    h = _host(x)
    if h is not None:
        return _back(h.astype(np.dtype(dtype)), x)
    return x.astype(dtype)


def _to_torch_convention(g):
    """A gradient from JAX's VJP, conjugated into torch's convention (None for float0)."""
    if g is None or g.dtype == jax.dtypes.float0:
        return None
    return _conj(g) if _is_complex_dtype(g.dtype) else g


def _zero_cotangent(o):
    """A zero cotangent for output ``o``: float0 for integer and boolean outputs."""
    if jnp.issubdtype(o.dtype, jnp.inexact):
        return _zeros_like(o)
    return np.zeros(o.shape, dtype=jax.dtypes.float0)


def _as_cotangent(c, o):
    """The cotangent ``c`` of output ``o``, in JAX's convention (conjugated) and dtype."""
    if not jnp.issubdtype(o.dtype, jnp.inexact):
        return np.zeros(o.shape, dtype=jax.dtypes.float0)
    if not owns(c):
        c = jnp.asarray(c)
    if c.dtype != o.dtype:
        c = _astype(c, o.dtype)
    return _conj(c) if _is_complex_dtype(c.dtype) else c


def _zeros_like(x):
    h = _host(x)
    return _back(np.zeros(h.shape, h.dtype), x) if h is not None else jnp.zeros_like(x)


def _tangent_for(t, x):
    """A tangent for primal ``x``: zeros for an undefined (None) tangent, ``x``'s dtype."""
    if t is None:
        return _zeros_like(x)
    if not owns(t):
        t = jnp.asarray(t)
    if t.dtype != x.dtype:
        t = _astype(t, x.dtype)
    if tuple(t.shape) != tuple(x.shape):
        t = jnp.reshape(t, x.shape)
    return t


def _output_tangent(primal, tangent):
    """A JVP result as an array of the primal's dtype (float0 tangents become zeros)."""
    if tangent is None or tangent.dtype == jax.dtypes.float0:
        return _zeros_like(primal)
    return tangent


class _Outputs:
    """Splits ``fn``'s outputs into the arrays JAX differentiates and everything else.

    JAX transformations only accept arrays as outputs; anything else ``fn`` returns is
    recorded on the side (the function is traced once, eagerly) and put back into place,
    so that the core reports a non-array output as torch does.
    """

    def __init__(self, as_tuple):
        self.as_tuple = as_tuple
        self.positions: list[int] | None = None
        self.others: dict[int, object] = {}
        self.n = 0

    def arrays_of(self, outs) -> tuple:
        outs = self.as_tuple(outs)
        self.n = len(outs)
        self.positions = [k for k, o in enumerate(outs) if owns(o)]
        self.others = {k: o for k, o in enumerate(outs) if not owns(o)}
        return tuple(outs[k] for k in self.positions)

    def rebuild(self, arrays) -> tuple:
        full = [None] * self.n
        for k, a in zip(self.positions, arrays):
            full[k] = a
        for k, o in self.others.items():
            full[k] = o
        return tuple(full)


def _is_none(value) -> bool:
    return value is None


def _with_replaced(args: tuple, positions, values) -> tuple:
    new = list(args)
    for p, v in zip(positions, values):
        new[p] = v
    return tuple(new)


#: dtypes whose finite differences are combined on the host (IEEE arithmetic, in the dtype itself)
_HOST_ARITHMETIC = frozenset(np.dtype(name) for name in ("float32", "float64"))
#: dtypes in which one addition or subtraction rounds alike in NumPy and XLA (IEEE-754,
#: correctly rounded); the others' moved entries are computed by JAX
_HOST_MOVED = frozenset(np.dtype(name) for name in ("float32", "float64", "complex64", "complex128"))
