"""Algebra on the host for backends whose arrays NumPy can read (JAX's, TensorFlow's, MLX's):
the array API computed by NumPy on host views (:class:`HostNamespace`, what such a backend's
``xp`` returns), and one ``allclose`` over those views (:class:`HostChecks`)."""
from __future__ import annotations

from typing import Callable

import array_api_compat.numpy as host_xp
import numpy as np

__all__ = ["HostChecks", "HostNamespace"]


_SEQUENCES = (list, tuple)
#: per type met: whether its values are arrays (shape and dtype, not a NumPy scalar or a class)
_ARRAY_TYPES: dict = {}


def _is_array(a) -> bool:
    kind = type(a)
    known = _ARRAY_TYPES.get(kind)
    if known is None:
        known = _ARRAY_TYPES[kind] = (hasattr(a, "shape") and hasattr(a, "dtype")
                                      and not isinstance(a, (np.generic, type)))
    return known


class HostNamespace:
    """The array API on the host, for a framework that would compile every new shape or
    that hands the core NumPy arrays.

    Each function computes with NumPy (``array_api_compat``'s namespace) on the host views
    of its array arguments and hands array results back through ``back(result, like)``,
    ``like`` the first array argument (a framework array again, or the NumPy result
    itself); a 0-d result (a reduction, which the core reads as a Python number) stays a
    NumPy value. Where an argument has no host view (``host(x)`` is ``None``: a traced value,
    an array on an accelerator), the framework's own namespace ``native`` computes.

    Parameters
    ----------
    host : callable
        ``x`` as a NumPy array (a view where it can), or ``None``.
    back : callable
        ``back(values, like, dtype)``: a NumPy result as the framework's array (``dtype``:
        the framework dtype the call asked for, or ``None``).
    native : namespace, optional
        The framework's array-API namespace, for arguments without a host view.
    dtype : callable, optional
        A framework dtype as NumPy's (for ``dtype=`` and ``astype``).
    """

    def __init__(self, host: Callable, back: Callable, native=None, dtype: Callable = np.dtype):
        self._host, self._back, self._native, self._dtype = host, back, native, dtype

    def __getattr__(self, name):
        on_host = getattr(host_xp, name)
        if not callable(on_host) or isinstance(on_host, type):  # constants and dtypes
            return on_host
        call = self._function(name, on_host)
        setattr(self, name, call)  # found without __getattr__ from now on
        return call

    def _function(self, name, on_host):
        host, back, to_dtype = self._host, self._back, self._dtype
        native = getattr(self._native, name, None)

        def on_views(args):
            """``args`` with each array (or sequence of arrays) as its host view; ``None``
            where one has none."""
            views, like = [], None
            for a in args:
                if type(a) in _SEQUENCES and a and _is_array(a[0]):
                    hs = [host(e) for e in a]
                    if any(h is None for h in hs):
                        return None, None
                    like = a[0] if like is None else like
                    views.append(hs)
                elif _is_array(a):
                    h = host(a)
                    if h is None:
                        return None, None
                    like = a if like is None else like
                    views.append(h)
                else:
                    views.append(a)
            return views, like

        def call(*args, **kwargs):
            views, like = on_views(args)
            if views is None:
                if native is None:
                    raise TypeError(f"{name} needs the host view of an array that has none")
                return native(*args, **kwargs)
            kwargs.pop("device", None)
            asked = views[1] if name == "astype" else kwargs.get("dtype")
            if asked is not None:
                if name == "astype":
                    views[1] = to_dtype(asked)
                else:
                    kwargs["dtype"] = to_dtype(asked)
            result = on_host(*views, **kwargs)
            if isinstance(result, (list, tuple)):
                return type(result)(back(r, like, asked) for r in result)
            if isinstance(result, np.generic) or (isinstance(result, np.ndarray) and not result.ndim):
                return result  # a reduction, read as a Python number: it stays on the host
            return back(result, like, asked) if isinstance(result, np.ndarray) else result

        call.__name__ = name
        return call


class HostChecks:
    """Mixed into a :class:`~agcheck.backends.base.Backend` whose ``host(x)`` gives ``x`` as a
    NumPy array (a view where it can)."""

    @staticmethod
    def host(x) -> np.ndarray:
        raise NotImplementedError

    def allclose(self, a, b, rtol, atol) -> bool:
        """``|a - b| <= atol + rtol * |b|`` everywhere, after type promotion; NaN fails
        (equal infinities pass, as in torch.allclose)."""
        a, b = self.host(a), self.host(b)
        dtype = np.result_type(a, b)
        if not np.issubdtype(dtype, np.inexact):
            dtype = np.float64
        a, b = a.astype(dtype), b.astype(dtype)
        with np.errstate(invalid="ignore", over="ignore"):
            close = (a == b) | (np.abs(a - b) <= atol + rtol * np.abs(b))
        return bool(np.all(close))
