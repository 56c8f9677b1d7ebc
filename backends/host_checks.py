"""The comparisons of a backend whose arrays are read on the host as NumPy arrays
(TensorFlow's and MLX's): one implementation of ``max_abs``, ``all_zero``,
``count_nonzero``, ``all_finite`` and ``allclose`` over the backend's own view."""
from __future__ import annotations

import numpy as np

__all__ = ["HostChecks"]


class HostChecks:
    """Mixed into a :class:`~agcheck.backends.base.Backend` whose ``host(x)`` gives ``x`` as a
    NumPy array (a view where it can)."""

    @staticmethod
    def host(x) -> np.ndarray:
        raise NotImplementedError

    def max_abs(self, x):
        h = self.host(x)
        return float(np.max(np.abs(h))) if h.size else 0.0

    def all_zero(self, x) -> bool:
        return bool(np.all(self.host(x) == 0))

    def count_nonzero(self, x) -> int:
        return int(np.count_nonzero(self.host(x)))

    def all_finite(self, x) -> bool:
        return bool(np.all(np.isfinite(self.host(x))))

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
