"""The torch backend's traces and perturbers.

:class:`TorchTrace` holds outputs carrying torch's autograd graph (VJPs by its engine,
batched by ``is_grads_batched`` or ``torch.func``); :class:`TorchPerturber` moves a strided
input's ``.data`` in place.
"""
from __future__ import annotations

import torch

from agcheck.backends import torch_engine, torch_graph, torch_perturber
from agcheck.backends.base import Trace
from agcheck.backends.torch_batching import _quiet_batching, _vmapped_vjps

__all__ = ["TorchTrace", "TorchPerturber"]


def _fresh(t):
    """``t``, or a copy of it when it is a view (of the flat vector the core drew): user code
    (a custom Function's jvp or backward) gets tensors of its own, as torch's checker hands
    it, so checks of view relations in torch ("the jvp is not returning a view of the given
    grad input") see what they would under torch. Batched (vmapped) tangents pass as they are."""
    if t is None or not isinstance(t, torch.Tensor) or not t._is_view():
        return t
    if torch._C._functorch.is_batchedtensor(t) or t.layout != torch.strided:
        return t
    return t.clone(memory_format=torch.contiguous_format)


#: a graph property not yet looked up (``None`` is an answer)
_UNSEARCHED = object()
#: batched VJPs that would first import torch._dynamo are refused for outputs of fewer
#: elements: their loop of VJPs (two per element) costs less than the import
IMPORT_FROM_ELEMENTS = 128

class TorchTrace(Trace):
    """Outputs carrying torch's autograd graph, differentiated by its engine (``torch_engine``)."""

    def __init__(self, outputs: tuple, inputs):
        super().__init__(outputs)
        self.inputs = tuple(inputs)
        self._obstacle = self._importing = _UNSEARCHED
        self._vjps_by = None  # how vjp_many batches: "is_grads_batched" or "torch.func", once seen

    def vjp(self, output_positions, cotangents) -> list:
        outs = tuple(self.outputs[p] for p in output_positions)
        return list(torch_engine.vjp(outs, self.inputs, tuple(_fresh(c) for c in cotangents)))

    def unit_vjps(self, output_position, columns, one_hot):
        out = self.outputs[output_position]
        if out.layout != torch.strided:
            yield from super().unit_vjps(output_position, columns, one_hot)
            return
        # torch's checker's loop: one cotangent, set to each one-hot in turn, and a copy of
        # each gradient (which may be that very cotangent, or a view of it)
        cotangent = torch.zeros_like(out, memory_format=torch.legacy_contiguous_format)
        flat = cotangent.view(-1)
        outs, cotangents = (out,), (cotangent,)
        for j in columns:
            flat.zero_()
            flat[j] = 1
            grads = torch_engine.vjp(outs, self.inputs, cotangents)
            yield [None if g is None else g.clone() for g in grads]

    def vjp_batched(self, output_position, stacked_cotangents) -> list:
        # what autograd.grad(is_grads_batched=True) runs (torch's first vmap over one
        # backward pass), without its checks of the cotangents' shapes, whose first use
        # in a process imports sympy (0.3-0.7 s): the stacked cotangents are the output's
        from torch._vmap_internals import _vmap

        outputs = (self.outputs[output_position],)

        def one(cotangent):
            return torch_engine.vjp(outputs, self.inputs, (cotangent,))

        with _quiet_batching():
            return list(_vmap(one, 0, 0, allow_none_pass_through=True)(stacked_cotangents))

    def vjp_many(self, output_position, stacked_cotangents) -> list:
        # autograd.grad(is_grads_batched=True) batches through torch's first vmap, which
        # lacks rules that torch.func.vmap has (einsum, among others): where its first
        # call raises, torch.func.vmap runs the same backward over the cotangents, for
        # every later call too, so that a block computed again (the reentrancy pass) is
        # computed as it was. Where is_grads_batched has worked, a later failure is that
        # block's (a backward that branches on its cotangents' values): raised
        out = self.outputs[output_position]
        if out.numel() < IMPORT_FROM_ELEMENTS and torch_graph.dynamo_pending():
            if self._importing is _UNSEARCHED:
                self._importing = torch_graph.importing_node(self.outputs)
            if self._importing:  # the engine loops instead
                raise NotImplementedError(f"{self._importing}'s batched backward would import torch._dynamo")
        if self._vjps_by != "torch.func":
            try:
                grads = self.vjp_batched(output_position, stacked_cotangents)
            except RuntimeError:
                if self._vjps_by == "is_grads_batched":
                    raise
                self._vjps_by = "torch.func"
            else:
                self._vjps_by = "is_grads_batched"
                return grads
        return _vmapped_vjps((out,), self.inputs, stacked_cotangents)

    def batching_obstacle(self) -> str | None:
        if self._obstacle is _UNSEARCHED:  # the graph is searched once
            self._obstacle = torch_graph.vmap_obstacle(self.outputs)
        return self._obstacle


class TorchPerturber(torch_perturber.InPlacePerturber):
    """Moves ``x.data`` in place: closures over ``x`` see the move, autograd graphs that
    saved ``x`` stay valid (the version counter of ``.data`` is separate)."""

    def __init__(self, x: torch.Tensor, as_tuple):
        self.data = x.data
        self.shape = tuple(x.shape)
        self.numel = x.numel()
        self._flat = self.data.view(-1) if self.data.is_contiguous() else None
        self._as_tuple = as_tuple
        self._original = None
        self.args = None

    def evaluate_direction(self, fn, step, sign) -> tuple:
        # the whole input moves: keep one copy of it for every direction evaluated
        if self._original is None:
            self._original = self.data.clone()
        try:
            if isinstance(step, torch.Tensor) and step.dtype == self.data.dtype and step.device == self.data.device:
                torch.add(self._original, step, alpha=-1 if sign < 0 else 1, out=self.data)  # no temporary
            else:
                self.data.copy_(self._original - step if sign < 0 else self._original + step)
            token = torch_perturber.VALUES_ONLY.set(True)
            try:  # fn is called from this frame
                return torch_perturber.detached_outputs(self._as_tuple, fn(*self._arguments()))
            finally:
                torch_perturber.VALUES_ONLY.reset(token)
        finally:
            self.data.copy_(self._original)
