"""The JAX backend's batched forms: ``fn`` vmapped over moved inputs and tangents.

:class:`JaxBatched` is :class:`~agcheck.backends.jax_backend.JaxBackend`'s implementation
of the optional protocol :class:`~agcheck.backends.batched_forms.BatchedForms`.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from agcheck.backends.batched_forms import BatchedForms
from agcheck.backends.jax_arrays import _HOST_MOVED, _XP, _back, _host, _moved_entries, _with_replaced, _zeros_like

__all__ = ["JaxBatched"]


class JaxBatched(BatchedForms):
    """Batched evaluations and JVPs of the JAX backend, by ``jax.vmap``."""

    # -- batched forms (the batched engine) ---------------------------------------------
    def evaluate_batch(self, fn, args, position, stacked):
        """``fn`` evaluated with ``args[position]`` replaced by each of ``stacked`` (vmapped)."""

        def at(value):
            return tuple(self.as_tuple(fn(*_with_replaced(args, [position], [value]))))

        return tuple(jax.vmap(at)(stacked))

    def element_moves(self, x, flat, step, sign):
        """Copies of ``x``, the ``b``-th with element ``flat[b]`` moved by ``sign * step``,
        computed as the element-by-element perturbation computes it (``x[k] - step``)."""
        b = len(flat)
        h = _host(x)
        if h is not None and h.dtype in _HOST_MOVED:  # on the host, as evaluate_element moves
            base = h.reshape(-1)
            index = np.asarray(flat, dtype=np.intp)
            moved = np.broadcast_to(base, (b, base.size)).copy()
            moved[np.arange(b), index] = _moved_entries(base[index], step, sign)
            return _back(moved.reshape((b, *x.shape)), x)
        base = jnp.reshape(x, (-1,))
        index = jnp.asarray(flat, dtype=jnp.int32 if base.size < 2**31 else jnp.int64)
        entries = base[index]
        moved_entries = entries - step if sign < 0 else entries + step
        moved = jnp.broadcast_to(base, (b, base.size)).at[jnp.arange(b), index].set(moved_entries.astype(x.dtype))
        return jnp.reshape(moved, (b, *x.shape))

    def one_hots(self, like, flat):
        b = len(flat)
        if _host(like) is not None:
            z = np.zeros((b, self.numel(like)), dtype=np.dtype(like.dtype))
            z[np.arange(b), np.asarray(flat, dtype=np.intp)] = 1
            return _back(z.reshape((b, *like.shape)), like)
        z = jnp.zeros((b, self.numel(like)), dtype=like.dtype)
        z = z.at[jnp.arange(b), jnp.asarray(flat)].set(1)
        return jnp.reshape(z, (b, *like.shape))

    def jvp_rows(self, fn, args, checked, j, flat):
        """Forward-mode Jacobian rows ``flat`` of input ``checked[j]``: one batched JVP.

        Returns, per floating output, a ``(len(flat), output.numel)`` array."""
        return self.jvp_along(fn, args, checked, j, self.one_hots(args[checked[j]], flat))

    def jvp_along(self, fn, args, checked, j, stacked):
        """JVPs of ``fn`` along each of ``stacked`` (tangents of input ``checked[j]``, the
        other inputs' tangents zero): per floating output a ``(len(stacked), numel)`` array."""
        zero = [_zeros_like(args[q]) for q in checked]

        def single(t):
            tangents = list(zero)
            tangents[j] = t
            return tuple(d for _, d in self.jvp(fn, args, checked, tangents))

        rows = jax.vmap(single)(stacked)
        return [_XP.reshape(r, (stacked.shape[0], -1)) for r in rows]
