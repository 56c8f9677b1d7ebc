"""The torch backend's second order: VJP functions differentiable again.

:class:`TorchSecondOrder` is a mixin of :class:`~agcheck.backends.torch_backend.TorchBackend`:
the random cotangents and the differentiable VJP of gradgradcheck (a
:class:`_DifferentiableVjp`, which the batched forms recognise), and the double backward
crosscheck compares.
"""
from __future__ import annotations

import numpy as np
import torch

from agcheck.backends import torch_engine, torch_perturber
from agcheck.backends.base import OutputPart
from agcheck.backends.torch_arrays import _numpy_dtype
from agcheck.backends.torch_batching import _vmapped_vjps
from agcheck.backends.torch_forward_memo import RetainedForward

__all__ = ["TorchSecondOrder"]


class _DifferentiableVjp:
    """The function :meth:`TorchBackend.differentiable_vjp` returns (a type of its own, so
    that the backend recognises it: its cotangent positions are batched around a plain
    forward, and priced and screened for obstacles as such)."""

    def __init__(self, vjp_of_fn, forward, n_inputs, over_cotangents):
        self._vjp_of_fn = vjp_of_fn
        #: fn's forward, reused while only the cotangents move
        self.forward = forward
        #: the arguments from this position on are cotangents
        self.n_inputs = n_inputs
        #: ``(args, position, stacked)``: the VJPs at each of the cotangents ``stacked``
        #: in place of ``args[position]`` (a cotangent), stacked
        self.over_cotangents = over_cotangents

    def __call__(self, *args):
        return self._vjp_of_fn(*args)


def _vjp_function(fn) -> _DifferentiableVjp | None:
    """The VJP function behind ``fn``: ``fn`` itself, or the one whose real or imaginary
    parts it takes (:class:`OutputPart`, the two passes over complex outputs); ``None``
    where there is none."""
    inner = fn.fn if isinstance(fn, OutputPart) else fn
    return inner if isinstance(inner, _DifferentiableVjp) else None


class TorchSecondOrder:
    """Second-order derivatives of the torch backend (capability ``second_order``)."""

    # -- second order -----------------------------------------------------------------
    def random_cotangent(self, like, generator, noncontiguous):
        """Uniform values in [-1, 1) shaped like ``like`` (doubles for non-floating outputs)."""
        dtype = like.dtype if (like.is_floating_point() or like.is_complex()) else torch.float64
        shape = tuple(like.shape)
        spread = noncontiguous and like.numel() > 1
        draw_shape = (*shape[:-1], 2 * shape[-1]) if spread else shape
        values = torch.rand(draw_shape, generator=generator, device=generator.device, dtype=dtype)
        values = (values * 2 - 1).to(like.device)
        if spread:
            values = values[..., ::2]
        return values.requires_grad_(True)

    def differentiable_vjp(self, fn, n_inputs, input_positions, cotangent_positions, evaluated=None,
                           few_calls=False, evaluated_seconds=None):
        """The VJP of ``fn`` as a function of ``(*inputs, *cotangents)``, built with
        ``create_graph=True`` so that it can be differentiated again. Where consecutive
        calls move only the cotangents, ``fn``'s forward (and the one ``evaluated`` holds)
        is reused (:mod:`agcheck.backends.torch_forward_memo`); ``evaluated_seconds`` times
        that one, so that the memo decides at once whether digests pay."""
        inputs_set, cotangents_set = set(input_positions), set(cotangent_positions)
        ordered = sorted(inputs_set)
        densify_grads = self.sparse_vjp == "dense"
        forward = RetainedForward(self, fn, decide_after=1 if few_calls else None)
        if evaluated is not None:
            forward.seed(*evaluated, seconds=evaluated_seconds)

        def batched_vjp_of_fn(args):
            # under vmap (the batched engine's numerical side): the same VJP through
            # torch.func, as autograd.grad cannot run on batched tensors; never
            # differentiated again, and the engine's probe compares it with vjp_of_fn
            def selected(*moved):
                full = list(args[:n_inputs])
                for k, m in zip(ordered, moved):
                    full[k] = m
                return tuple(o for o in self.as_tuple(fn(*full))
                             if isinstance(o, torch.Tensor) and (o.is_floating_point() or o.is_complex()))

            _, pullback = torch.func.vjp(selected, *[args[k] for k in ordered])
            return tuple(pullback(tuple(args[n_inputs:])))

        def primals_of(args):
            return tuple(x.requires_grad_() if k in inputs_set else x for k, x in enumerate(args[:n_inputs]))

        def defined(grads):
            if densify_grads:  # sparse / MKL-DNN gradients as dense outputs (beyond torch)
                grads = [g if g is None or g.layout == torch.strided else g.to_dense() for g in grads]
            return tuple(g for g in grads if g is not None)

        def vjp_of_fn(*args):
            if any(isinstance(a, torch.Tensor) and torch._C._functorch.is_batchedtensor(a) for a in args):
                return batched_vjp_of_fn(args)
            # a perturber's evaluation wants values: no graph of the backward pass. fn
            # itself (a VJP function too, at higher orders) records as usual
            graph = not torch_perturber.VALUES_ONLY.get()
            token = torch_perturber.VALUES_ONLY.set(False)
            try:
                primals = primals_of(args)
                cotangents = tuple(
                    c.requires_grad_() if k in cotangents_set else c for k, c in enumerate(args[n_inputs:])
                )

                def backward(outputs):
                    return defined(torch_engine.vjp(tuple(outputs), tuple(primals[k] for k in ordered), cotangents,
                                                    create_graph=graph))

                return forward.vjp(primals, backward)
            finally:
                torch_perturber.VALUES_ONLY.reset(token)

        def over_cotangents(args, position, stacked):
            # the cotangents at args[position] stacked: fn's forward as a plain call (a
            # custom Function without functorch support runs as it does unbatched; the
            # kept one where the inputs have not moved), then one backward pass vmapped
            # over them
            primals = primals_of(args)
            grads = _vmapped_vjps(tuple(forward.outputs(primals)), tuple(primals[k] for k in ordered),
                                  stacked, position - n_inputs, tuple(args[n_inputs:]))
            return tuple(g.detach() for g in defined(grads))

        return _DifferentiableVjp(vjp_of_fn, forward, n_inputs, over_cotangents)

    def vjp_of_vjp(self, fn, args, checked, output, cotangent, gradient_cotangents) -> dict:
        """Double backward: ``torch.autograd.grad`` with ``create_graph=True``, then
        ``grad`` of each gradient (torch's convention is the reference one)."""
        inputs = [args[p] for p in checked]
        sizes = [x.numel() for x in inputs]
        dtypes = [_numpy_dtype(x) for x in inputs]
        out = self.as_tuple(fn(*args))[output]
        if not (isinstance(out, torch.Tensor) and out.requires_grad):
            return {(j1, j2): np.zeros((len(gradient_cotangents[j1]), sizes[j2]), dtype=dtypes[j2])
                    for j1 in range(len(inputs)) for j2 in range(len(inputs))}
        w = self.from_numpy(cotangent, like=out)
        grads = torch.autograd.grad(out, inputs, w, create_graph=True, allow_unused=True)
        result = {}
        for j1, g in enumerate(grads):
            for j2, x2 in enumerate(inputs):
                rows = []
                for c in gradient_cotangents[j1]:
                    h = None
                    if g is not None and g.requires_grad:
                        (h,) = torch.autograd.grad(g, [x2], self.from_numpy(c, like=g),
                                                   retain_graph=True, allow_unused=True)
                    rows.append(np.zeros(sizes[j2], dtype=dtypes[j2]) if h is None
                                else self.to_numpy(h).reshape(-1))
                result[(j1, j2)] = np.stack(rows, 0)
        return result
