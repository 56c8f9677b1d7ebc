"""The torch backend's in-place perturbation: entries of an input moved where they live
(a function that reads the input through a closure sees the move, as in torch's checker)
and restored exactly; the dense perturber and the sparse and MKL-DNN ones
(:mod:`agcheck.backends.torch_sparse`) build on it."""
from __future__ import annotations

import contextvars

import numpy as np
import torch

from agcheck.backends.base import Perturber

__all__ = ["VALUES_ONLY", "detached_outputs", "InPlacePerturber"]


#: True while a perturber evaluates ``fn`` for its values alone: a VJP function of the
#: backend's (:meth:`~agcheck.backends.torch_backend.TorchBackend.differentiable_vjp`)
#: then runs its backward pass without recording a graph of it, which nothing would
#: differentiate (the values are the same; torch's checker records that graph every time)
VALUES_ONLY = contextvars.ContextVar("agcheck_values_only", default=False)


def detached_outputs(as_tuple, outs) -> tuple:
    return tuple([o.detach().clone() if isinstance(o, torch.Tensor) else o for o in as_tuple(outs)])


class InPlacePerturber(Perturber):
    """Moves entries of ``self.data`` in place and evaluates ``fn`` through ``_call``."""

    args: tuple
    data: torch.Tensor
    _flat: torch.Tensor | None
    _as_tuple: object

    def _entry(self, flat: int) -> torch.Tensor:
        if self._flat is not None:
            return self._flat[flat]
        return self.data[tuple(int(i) for i in np.unravel_index(flat, tuple(self.data.shape)))]

    def index(self, flat: int) -> tuple:
        return tuple(int(i) for i in np.unravel_index(flat, self.shape)) if self.shape else ()

    def _arguments(self) -> tuple:
        """The arguments ``fn`` is called with (the moved input in place)."""
        return self.args

    def _call(self, fn) -> tuple:
        token = VALUES_ONLY.set(True)
        try:
            return detached_outputs(self._as_tuple, fn(*self._arguments()))
        finally:
            VALUES_ONLY.reset(token)

    def evaluate_element(self, fn, flat, step, sign) -> tuple:
        # fn is called from this frame: user code that walks the stack (torch.manual_seed
        # does, three times, while CUDA is not initialised) pays for every frame above it
        target = self._entry(flat)
        original = target.clone()
        token = VALUES_ONLY.set(True)
        try:
            target.copy_(original - step if sign < 0 else original + step)
            return detached_outputs(self._as_tuple, fn(*self._arguments()))
        finally:
            VALUES_ONLY.reset(token)
            target.copy_(original)

    def evaluate_element_moves(self, fn, flat, moves) -> list:
        # as evaluate_element, with the entry found and saved once for all the moves, and
        # each moved value written into it directly (the same sum, with no temporary)
        target = self._entry(flat)
        original = target.clone()
        values = []
        token = VALUES_ONLY.set(True)
        try:
            for step, sign in moves:
                (torch.sub if sign < 0 else torch.add)(original, step, out=target)
                values.append(detached_outputs(self._as_tuple, fn(*self._arguments())))
            return values
        finally:
            VALUES_ONLY.reset(token)
            target.copy_(original)

    def evaluate_elements(self, fn, flats, deltas) -> tuple:
        """Outputs of ``fn`` with each element ``flats[i]`` moved to ``x - deltas[i]``
        (Python floats) and the others untouched: a few entries written, not the whole
        input, as in :meth:`evaluate_element`."""
        if self._flat is not None:
            flat = self._flat
            index = torch.as_tensor(flats, dtype=torch.long, device=flat.device)
            originals = flat[index]
            try:
                flat[index] = originals - torch.as_tensor(deltas, dtype=flat.dtype, device=flat.device)
                return self._call(fn)
            finally:
                flat[index] = originals
        targets = [self._entry(f) for f in flats]
        originals = [t.clone() for t in targets]
        try:
            for t, o, d in zip(targets, originals, deltas):
                t.copy_(o - d)
            return self._call(fn)
        finally:
            for t, o in zip(targets, originals):
                t.copy_(o)

    def evaluate_direction(self, fn, step, sign) -> tuple:
        original = self.data.clone()
        try:
            self.data.copy_(original - step if sign < 0 else original + step)
            return self._call(fn)
        finally:
            self.data.copy_(original)
