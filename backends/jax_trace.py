"""The JAX backend's traces and perturbers.

:class:`JaxTrace` holds ``fn``'s outputs and its pullback (VJPs in torch's convention);
:class:`JaxPerturber` evaluates ``fn`` with one input moved (a new array each time).
"""
from __future__ import annotations

from functools import cached_property

import jax
import jax.numpy as jnp
import numpy as np

from agcheck.backends.base import Perturber, Trace
from agcheck.backends.jax_arrays import (_HOST_MOVED, _as_cotangent, _is_complex_dtype, _moved_entries,
                                         _to_torch_convention, _with_replaced, _zero_cotangent)

__all__ = ["JaxTrace", "JaxPerturber"]


class JaxTrace(Trace):
    """``fn``'s outputs and its JAX pullback at the traced point.

    ``vjp`` returns gradients in torch's convention: ``conj(pullback(conj(v)))``.
    """

    def __init__(self, outputs: tuple, array_positions: list, primal_outputs: tuple, pullback):
        super().__init__(outputs)
        self._array_positions = array_positions
        self._primal_outputs = primal_outputs
        self._pullback = pullback

    def _cotangents(self, given: dict) -> tuple:
        return tuple(
            _as_cotangent(given[k], o) if k in given else _zero_cotangent(o)
            for k, o in zip(self._array_positions, self._primal_outputs)
        )

    def vjp(self, output_positions, cotangents) -> list:
        given = dict(zip(output_positions, cotangents))
        grads = self._pullback(self._cotangents(given))
        return [_to_torch_convention(g) for g in grads]

    def vjp_batched(self, output_position, stacked_cotangents) -> list:
        def single(c):
            grads = self._pullback(self._cotangents({output_position: c}))
            return tuple(jnp.conj(g) if _is_complex_dtype(g.dtype) else g for g in grads)

        return list(jax.vmap(single)(jnp.asarray(stacked_cotangents)))



class JaxPerturber(Perturber):
    """Evaluates ``fn`` on a new argument tuple with ``args[position]`` replaced by a
    moved copy; the original array is never touched (JAX arrays are immutable)."""

    def __init__(self, args: tuple, position: int, as_tuple):
        self.args = args
        self.position = position
        self.x = args[position]
        self.shape = tuple(self.x.shape)
        self.numel = int(self.x.size)
        self._as_tuple = as_tuple

    def index(self, flat: int) -> tuple:
        return tuple(int(i) for i in np.unravel_index(flat, self.shape)) if self.shape else ()

    def _call(self, fn, moved) -> tuple:
        return self._as_tuple(fn(*_with_replaced(self.args, [self.position], [moved])))

    def evaluate_element(self, fn, flat, step, sign) -> tuple:
        # the same arithmetic as torch's in-place move: x[idx] - step, x[idx] + step, in
        # x's dtype; moved on the host where NumPy rounds it as XLA does (an eager scatter
        # costs milliseconds per element)
        index = self.index(flat)
        host = self._host
        if host is None:
            at = self.x.at[index]
            return self._call(fn, at.subtract(step) if sign < 0 else at.add(step))
        moved = host.copy()
        moved[index] = _moved_entries(moved[index], step, sign)
        # on x's sharding only where x is committed to it (see _committed_device)
        sharding = self.x.sharding if getattr(self.x, "committed", False) else None
        return self._call(fn, jax.device_put(moved, sharding))

    @cached_property
    def _host(self):
        """The input as a NumPy array where NumPy moves its entries as XLA does (None
        otherwise), copied once, when an element is first moved."""
        if np.dtype(self.x.dtype) not in _HOST_MOVED:
            return None
        try:
            return np.array(self.x)
        except Exception:  # noqa: BLE001 - a tracer: moved by JAX itself
            return None

    def evaluate_direction(self, fn, step, sign) -> tuple:
        x = self.x
        dtype = np.promote_types(np.dtype(x.dtype), np.dtype(step.dtype))
        if dtype != x.dtype or dtype != step.dtype:  # promoted explicitly: strict promotion refuses it
            x, step = x.astype(dtype), step.astype(dtype)
        moved = x - step if sign < 0 else x + step
        if moved.dtype != self.x.dtype:
            moved = moved.astype(self.x.dtype)
        return self._call(fn, moved)
