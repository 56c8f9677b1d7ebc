"""The MLX backend's batched forms: ``fn`` and its JVPs through ``mx.vmap``.

:class:`MlxBatched` is :class:`~agcheck.backends.mlx_backend.MlxBackend`'s implementation
of the optional protocol :class:`~agcheck.backends.batched_forms.BatchedForms`.
"""
from __future__ import annotations

import mlx.core as mx
import numpy as np

from agcheck.backends.batched_forms import BatchedForms
from agcheck.backends.mlx_arrays import (_as_mx, _back, _evaluated, _moved_entries, _np_dtype, _on_cpu_for, _view,
                                         _with_replaced)

__all__ = ["MlxBatched"]


class MlxBatched(BatchedForms):
    """Batched evaluations and JVPs of the MLX backend, by ``mx.vmap``."""

    # -- batched forms (the batched engine) ---------------------------------------------
    def evaluate_batch(self, fn, args, position, stacked):
        """``fn`` evaluated with ``args[position]`` replaced by each of ``stacked`` (``mx.vmap``)."""
        x = args[position]

        def at(value):
            return tuple(self.as_tuple(fn(*_with_replaced(args, [position], [value]))))

        with _on_cpu_for(args):
            return _evaluated(tuple(mx.vmap(at)(_as_mx(stacked, x.dtype))))

    def element_moves(self, x, flat, step, sign):
        """Copies of ``x``, the ``b``-th with element ``flat[b]`` moved by ``sign * step``,
        computed as the perturber computes it."""
        base = _view(x).reshape(-1)
        index = np.asarray(flat, dtype=np.intp)
        moved = np.repeat(base[None, :], len(flat), axis=0)
        moved[np.arange(len(flat)), index] = _moved_entries(base[index], step, sign)
        return _back(moved.reshape((len(flat), *x.shape)), x.dtype)

    def one_hots(self, like, flat):
        z = np.zeros((len(flat), self.numel(like)), dtype=_np_dtype(like.dtype))
        z[np.arange(len(flat)), np.asarray(flat, dtype=np.intp)] = 1
        return _back(z.reshape((len(flat), *like.shape)), like.dtype)

    def jvp_rows(self, fn, args, checked, j, flat):
        return self.jvp_along(fn, args, checked, j, self.one_hots(args[checked[j]], flat))

    def jvp_along(self, fn, args, checked, j, stacked):
        """JVPs along each of ``stacked`` (tangents of input ``checked[j]``, the others'
        zero): per floating or complex output a ``(len(stacked), numel)`` array."""
        position = list(checked)[j]
        x = args[position]

        def single(t):
            # the other inputs held constant rather than given zero tangents: the same JVP,
            # and MLX 0.32's vmap of a matmul's JVP with a zero tangent fails on broadcasting
            return tuple(self._forward(fn, args, [position], [t])[1])

        b = int(stacked.shape[0])
        with _on_cpu_for(args):
            rows = mx.vmap(single)(_as_mx(stacked, x.dtype))
        return _evaluated([mx.reshape(r, (b, -1)) for r in rows])
