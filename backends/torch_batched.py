"""The torch backend's batched forms: ``fn`` vmapped over moved inputs, stacked along its
own first dimension, and its JVPs vmapped over tangents.

:class:`TorchBatched` is :class:`~agcheck.backends.torch_backend.TorchBackend`'s
implementation of the optional protocol :class:`~agcheck.backends.batched_forms.BatchedForms`,
with its batched JVPs and the obstacles that rule a form out before any call.
"""
from __future__ import annotations

import torch

from agcheck.backends import torch_graph, torch_perturber
from agcheck.backends.batched_forms import BatchedForms
from agcheck.backends.torch_batching import _quiet_batching
from agcheck.backends.torch_second_order import _vjp_function

__all__ = ["TorchBatched", "VMAPPED_VJP_FROM_ELEMENTS", "VMAPPED_COTANGENTS_FROM_ELEMENTS"]


#: a VJP function (gradgradcheck's) is vmapped only where its checked inputs hold at least
#: this many elements, until the process has imported torch._dynamo: vmapping it goes
#: through torch.func, whose first use imports it (about 1.2 s, with sympy), which the
#: loop of a smaller check does not repay
VMAPPED_VJP_FROM_ELEMENTS = 2000
#: the same for its cotangents, which move by a vmapped backward pass alone (whose first
#: use imports sympy, 0.3-0.7 s)
VMAPPED_COTANGENTS_FROM_ELEMENTS = 128


class TorchBatched(BatchedForms):
    """Batched evaluations and JVPs of the torch backend (``torch.func.vmap``, torch's
    older vmap for JVPs)."""

    def jvp_batched(self, fn, args, position, stacked_tangents) -> tuple:
        from torch._vmap_internals import _vmap

        with _quiet_batching():
            return _vmap(lambda t: self.jvp_wrt(fn, args, position, t))(stacked_tangents)

    # -- batched forms (the batched engine) ---------------------------------------------
    def evaluate_batch(self, fn, args, position, stacked, functional=False):
        """``fn`` evaluated with ``args[position]`` replaced by each of ``stacked`` (vmapped;
        ``functional``: through ``torch.func.functionalize``, see
        :meth:`evaluate_batch_functional`)."""
        vjp_fn = _vjp_function(fn)
        if vjp_fn is not None and position >= vjp_fn.n_inputs:
            if functional:
                # fn's forward runs plainly there, so its writes need no functionalizing
                raise ValueError("cotangents move by the vmapped backward pass alone")
            grads = vjp_fn.over_cotangents(args, position, stacked)
            return grads if vjp_fn is fn else fn.taken(grads)
        moved = list(args)
        moved[position] = stacked
        # fn itself is vmapped, the other arguments unbatched: no frame between vmap and fn
        batched = torch.func.vmap(torch.func.functionalize(fn) if functional else fn,
                                  in_dims=tuple(0 if q == position else None for q in range(len(args))))
        with _quiet_batching():
            return tuple(o.detach() for o in self.as_tuple(batched(*moved)))

    def evaluate_batch_functional(self, fn, args, position, stacked):
        """:meth:`evaluate_batch` through ``torch.func.functionalize``: writes into tensors
        fn creates become out-of-place ops, which vmap batches where it refuses the in-place
        ones ("vmap: inplace arithmetic ... is not possible")."""
        return self.evaluate_batch(fn, args, position, stacked, functional=True)

    def evaluate_stacked(self, fn, args, position, stacked, tiled=()):
        x = args[position]
        b = stacked.shape[0]
        if x.dim() == 0 or x.layout != torch.strided:
            raise ValueError("only a strided input with a first dimension can be stacked")
        obstacle = self.stacking_obstacle(fn, position, tiled)
        if obstacle:
            raise ValueError(obstacle)
        moved = list(args)
        moved[position] = stacked.reshape(b * x.shape[0], *x.shape[1:])
        for q in tiled:
            other = args[q]
            if not isinstance(other, torch.Tensor) or other.dim() == 0 or other.layout != torch.strided \
                    or other.shape[0] != x.shape[0]:
                raise ValueError("only strided arguments sharing the input's first dimension can be tiled")
            # detached, as the moved copies are: the evaluation records no graph through them
            moved[q] = other.detach().repeat(b, *([1] * (other.dim() - 1)))
        token = torch_perturber.VALUES_ONLY.set(True)
        try:
            outs = self.as_tuple(fn(*moved))
        finally:
            torch_perturber.VALUES_ONLY.reset(token)
        split = []
        for o in outs:
            if not isinstance(o, torch.Tensor) or o.dim() == 0 or o.shape[0] % b:
                raise ValueError("an output is not the copies' results end to end")
            split.append(o.detach().reshape(b, o.shape[0] // b, *o.shape[1:]))
        return tuple(split)

    def element_moves(self, x, flat, step, sign):
        """Copies of ``x``, the ``b``-th with element ``flat[b]`` moved by ``sign * step``,
        computed as the in-place perturbation computes it (``x[k] - step``)."""
        base = x.detach().reshape(-1)
        index = torch.tensor(flat, device=x.device, dtype=torch.long)
        entries = base[index]
        moved_entries = entries - step if sign < 0 else entries + step
        moved = base.unsqueeze(0).repeat(len(flat), 1)
        moved[torch.arange(len(flat), device=x.device), index] = moved_entries
        return moved.reshape(len(flat), *x.shape)

    def one_hots(self, like, flat):
        z = torch.zeros((len(flat), like.numel()), dtype=like.dtype, device=like.device)
        z[torch.arange(len(flat), device=like.device), torch.tensor(flat, device=like.device, dtype=torch.long)] = 1
        return z.reshape(len(flat), *like.shape)

    def jvp_rows(self, fn, args, checked, j, flat):
        """Forward-mode Jacobian rows ``flat`` of input ``checked[j]``: one batched JVP.

        Returns, per floating output, a ``(len(flat), output.numel)`` array."""
        return self.jvp_along(fn, args, checked, j, self.one_hots(args[checked[j]], flat))

    def jvp_along(self, fn, args, checked, j, stacked):
        """JVPs of ``fn`` along each of ``stacked`` (tangents of input ``checked[j]``, the
        other inputs' tangents zero): per floating output a ``(len(stacked), numel)`` array."""
        from torch._vmap_internals import _vmap

        zero = [torch.zeros_like(args[q]) for q in checked]

        def single(t):
            tangents = list(zero)
            tangents[j] = t
            return tuple(
                torch.zeros_like(p) if d is None else d for p, d in self.jvp(fn, args, checked, tangents)
            )

        with _quiet_batching():
            rows = _vmap(single)(stacked)
        return [r.reshape(len(stacked), -1) for r in self.as_tuple(rows)]

    def stacking_obstacle(self, fn, position, tiled=()):
        vjp_fn = _vjp_function(fn)
        if vjp_fn is not None and (not tiled or vjp_fn is fn):
            # copies of one primal or cotangent alone never match the arguments that share
            # its first dimension; tiled beside them they fit, and pay for complex outputs
            # (two passes, two moves per element), not for real ones, where the probe cost
            # the checks that raise at a step more than it gave the others (xitorch)
            return "a VJP's primals and cotangents are not stacked one at a time" if not tiled else \
                "a VJP of real outputs is not stacked"
        return None

    def batching_obstacle(self, fn, position, trace):
        vjp_fn = _vjp_function(fn)
        if vjp_fn is not None:
            # a vmapped VJP is a batched backward (its first use in a process imports
            # sympy: 0.3-0.7 s); moving a primal also goes through torch.func, whose first
            # use imports torch._dynamo (about 1.2 s): a smaller check's loop does not repay
            # them, unless the process has paid them already (torch._dynamo brings sympy)
            least = VMAPPED_VJP_FROM_ELEMENTS if position < vjp_fn.n_inputs else VMAPPED_COTANGENTS_FROM_ELEMENTS
            if torch_graph.dynamo_pending() and sum(x.numel() for x in trace.inputs) < least:
                return f"a VJP of fewer than {least} elements is not vmapped"
        if vjp_fn is not None and position >= vjp_fn.n_inputs:
            return None  # fn's forward runs plainly there: only its backward pass is vmapped
        return trace.batching_obstacle()
