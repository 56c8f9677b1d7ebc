"""The MLX backend's traces and perturbers.

:class:`MlxTrace` holds ``fn``'s outputs (each VJP one ``mx.vjp``); :class:`MlxPerturber`
evaluates ``fn`` with one input replaced by a moved copy.
"""
from __future__ import annotations

from functools import cached_property

import mlx.core as mx
import numpy as np

from agcheck.backends.base import Perturber, Trace
from agcheck.backends.mlx_arrays import (_Outputs, _as_mx, _back, _copy, _evaluated, _is_inexact, _moved_entries,
                                         _on_cpu_for, _view, _with_replaced)

__all__ = ["MlxTrace", "MlxPerturber"]


class MlxTrace(Trace):
    """``fn``'s outputs at the traced point; each VJP is one ``mx.vjp`` (``fn`` again)."""

    def __init__(self, outputs: tuple, of_checked: _Outputs, primals: list):
        super().__init__(outputs)
        self._of_checked = of_checked
        self._primals = primals
        self._inexact = [k for k, o in enumerate(outputs) if _is_inexact(o)]

    def _cotangents(self, given: dict) -> list:
        outs = self.outputs
        return [_as_mx(given[k], outs[k].dtype, outs[k].shape) if given.get(k) is not None
                else mx.zeros(outs[k].shape, outs[k].dtype) for k in self._inexact]

    def _vjp(self, given: dict) -> list:
        if not self._inexact:
            return [mx.zeros_like(x) for x in self._primals]
        _, grads = mx.vjp(self._of_checked, self._primals, self._cotangents(given))
        return list(grads)

    def vjp(self, output_positions, cotangents) -> list:
        with _on_cpu_for(self._primals):
            return _evaluated(self._vjp(dict(zip(output_positions, cotangents))))

    def vjp_batched(self, output_position, stacked_cotangents) -> list:
        out = self.outputs[output_position]
        stacked = _as_mx(stacked_cotangents, out.dtype)
        with _on_cpu_for(self._primals):
            return _evaluated(list(mx.vmap(lambda c: tuple(self._vjp({output_position: c})))(stacked)))


class MlxPerturber(Perturber):
    """Evaluates ``fn`` on a new argument tuple with ``args[position]`` replaced by a
    moved copy; the caller's array is never written to."""

    def __init__(self, args: tuple, position: int, as_tuple):
        self.args = args
        self.position = position
        self.x = args[position]
        self.shape = tuple(self.x.shape)
        self.numel = int(self.x.size)
        self._as_tuple = as_tuple

    @cached_property
    def _host(self) -> np.ndarray:
        """The input's values, copied to the host once, when an element is first moved."""
        return _copy(self.x)

    def index(self, flat: int) -> tuple:
        return tuple(int(i) for i in np.unravel_index(flat, self.shape)) if self.shape else ()

    def _call(self, fn, moved: np.ndarray) -> tuple:
        value = _back(moved, self.x.dtype)
        return _evaluated(self._as_tuple(fn(*_with_replaced(self.args, [self.position], [value]))))

    def evaluate_element(self, fn, flat, step, sign) -> tuple:
        moved = self._host.copy()
        view = moved.reshape(-1)
        view[flat] = _moved_entries(view[flat:flat + 1], step, sign)[0]
        return self._call(fn, moved)

    def evaluate_direction(self, fn, step, sign) -> tuple:
        x, step = self._host, _view(step).reshape(self.shape)
        dtype = np.promote_types(x.dtype, step.dtype)
        moved = x.astype(dtype) - step.astype(dtype) if sign < 0 else x.astype(dtype) + step.astype(dtype)
        return self._call(fn, moved.astype(x.dtype))
