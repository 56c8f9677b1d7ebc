"""The torch backend: real and complex tensors on any device, strided, sparse (COO, CSR,
CSC, BSR, BSC; see ``torch_sparse``) or MKL-DNN."""
from __future__ import annotations

import copy
import hashlib
import re
import threading
import types
from contextlib import contextmanager

import array_api_compat.torch
import numpy as np
import torch
import torch.autograd.forward_ad as fwAD

from agcheck.backends.base import Backend, OutputPart, Trace, summary_edges
from agcheck.backends.batched_forms import BatchedForms

from agcheck.backends import torch_engine, torch_errors, torch_graph, torch_perturber, torch_sparse
from agcheck.backends.torch_forward_memo import RetainedForward
from agcheck.backends.quiet import ignoring
from agcheck.errors import CheckInputError

__all__ = ["TorchBackend", "BACKEND_CLASS"]


def owns(x) -> bool:
    return isinstance(x, torch.Tensor)


def _is_sparse(x) -> bool:
    return x.layout in (torch.sparse_coo, torch.sparse_csr, torch.sparse_csc, torch.sparse_bsr, torch.sparse_bsc)


#: torch keeps one forward-AD level for the whole process: two threads inside
#: ``dual_level()`` at once fail ("Nested forward mode AD is not supported"), so agcheck's
#: forward-mode work takes its turn (torch's own checker in another thread still collides)
_DUAL_LEVEL_LOCK = threading.RLock()


@contextmanager
def _dual_level():
    """``forward_ad.dual_level()``, one thread at a time."""
    with _DUAL_LEVEL_LOCK, fwAD.dual_level():
        yield


#: functorch's switch for its "performance drop" message, printed by C++ past Python's
#: warning filters; torch has no getter for it (its default is on)
_set_fallback_message = getattr(torch._C._functorch, "_set_vmap_fallback_warning_enabled", None)
_batching_lock = threading.Lock()
_batching_users = 0


@contextmanager
def _quiet_batching():
    """Silence torch's "There is a performance drop because we have not yet implemented
    the batching rule for ..." messages inside agcheck's own vmapped evaluations: they
    are how agcheck computes, not something fn does, and torch's checker (which evaluates
    fn one element at a time there) never causes them. functorch prints them from C++,
    past Python's filters: its switch is off while any thread is inside, and back on (its
    default) after the last; the Python warning of the older vmap is filtered."""
    global _batching_users
    with _batching_lock:
        _batching_users += 1
        if _batching_users == 1 and _set_fallback_message is not None:
            _set_fallback_message(False)
    try:
        with ignoring("There is a performance drop"):
            yield
    finally:
        with _batching_lock:
            _batching_users -= 1
            if _batching_users == 0 and _set_fallback_message is not None:
                _set_fallback_message(True)


def _vmapped_vjps(outputs: tuple, inputs: tuple, stacked_cotangents, position: int = 0,
                  cotangents: tuple | None = None) -> list:
    """VJPs of ``outputs`` (their graph already built) with respect to ``inputs``, one per
    cotangent stacked along the first dimension of ``stacked_cotangents``, by
    ``torch.func.vmap`` over one backward pass: stacked the same way, ``None`` where a
    gradient is undefined. ``cotangents``, when given, holds every output's cotangent, and
    the stacked ones take the place of ``cotangents[position]``."""
    undefined = []

    def one(cotangent):
        given = (cotangent,) if cotangents is None else (*cotangents[:position], cotangent, *cotangents[position + 1:])
        grads = torch_engine.vjp(outputs, inputs, given)
        undefined[:] = [g is None for g in grads]
        return tuple(g for g in grads if g is not None)

    with _quiet_batching():
        defined = iter(torch.func.vmap(one)(stacked_cotangents))
    return [None if missing else next(defined) for missing in undefined]


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


#: from this many entries on, allclose decides finite values in fewer passes than
#: torch.allclose; below it torch.allclose's one call is cheaper (12 against 22 µs)
_FEWER_PASSES_NUMEL = 4096


def _zeros_like(x):
    """Zeros shaped like ``x``: contiguous for a strided tensor (as torch's gradcheck makes
    them), in ``x``'s layout for a sparse one, strided for MKL-DNN (which has no zeros)."""
    if x.layout == torch._mkldnn:
        return torch.zeros(tuple(x.shape), dtype=x.dtype, device=x.device)
    if x.layout != torch.strided:
        return torch.zeros_like(x)
    return torch.zeros_like(x, memory_format=torch.legacy_contiguous_format)


#: the core's algebra: array_api_compat's torch namespace, with torch's gradcheck zeros
_XP = types.SimpleNamespace(**{**vars(array_api_compat.torch), "zeros_like": _zeros_like})


#: a graph property not yet looked up (``None`` is an answer)
_UNSEARCHED = object()

#: torch dtypes without a NumPy counterpart, and the wider ones their values convert to exactly
_WIDENED_FOR_NUMPY = {torch.bfloat16: torch.float32, torch.complex32: torch.complex64}


class TorchTrace(Trace):
    """Outputs carrying torch's autograd graph, differentiated by its engine (``torch_engine``)."""

    def __init__(self, outputs: tuple, inputs):
        super().__init__(outputs)
        self.inputs = tuple(inputs)
        self._obstacle = _UNSEARCHED
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
        with _quiet_batching():
            return list(torch.autograd.grad(
                self.outputs[output_position], self.inputs, stacked_cotangents,
                retain_graph=True, allow_unused=True, is_grads_batched=True,
            ))

    def vjp_many(self, output_position, stacked_cotangents) -> list:
        # autograd.grad(is_grads_batched=True) batches through torch's first vmap, which
        # lacks rules that torch.func.vmap has (einsum, among others): where its first
        # call raises, torch.func.vmap runs the same backward over the cotangents, for
        # every later call too, so that a block computed again (the reentrancy pass) is
        # computed as it was. Where is_grads_batched has worked, a later failure is that
        # block's (a backward that branches on its cotangents' values): raised
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
        return _vmapped_vjps((self.outputs[output_position],), self.inputs, stacked_cotangents)

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
            return self._call(fn)
        finally:
            self.data.copy_(self._original)


class TorchBackend(BatchedForms, Backend):
    """Dense real and complex torch tensors, on any device (CPU, CUDA, ...)."""

    name = "torch"
    capabilities = frozenset({"reverse", "forward", "batched", "batched_forward", "undefined_grad", "sparse", "masked",
                              "second_order", "batched_evaluation", "batched_jvp", "stacked_evaluation",
                              "functional_batched_evaluation"})
    no_checked_inputs_message = (
        "gradcheck expects at least one input tensor to require gradient, "
        "but none of them have requires_grad=True."
    )

    #: gradgradcheck of sparse (or MKL-DNN) inputs: the VJP function's gradients keep the
    #: input's layout ("raise": torch's behaviour, gradcheck then rejects the sparse output
    #: with a ValueError) or are returned dense ("dense", beyond torch; see docs/sparse.md)
    sparse_vjp = "raise"

    def with_options(self, **options) -> "TorchBackend":
        if not options:
            return self
        unknown = sorted(set(options) - {"sparse_vjp"})
        if unknown:
            raise TypeError(f"unexpected keyword argument(s) {', '.join(map(repr, unknown))}: not a keyword of "
                            "gradcheck, and the 'torch' backend takes sparse_vjp= only")
        mode = options["sparse_vjp"]
        if mode not in ("raise", "dense"):
            raise ValueError(f"sparse_vjp must be 'raise' or 'dense', got {mode!r}")
        new = copy.copy(self)
        new.sparse_vjp = mode
        return new

    def adopt_error(self, error):
        return torch_errors.adopt(error)

    # -- inspection -------------------------------------------------------------------
    def owns(self, x) -> bool:
        return owns(x)

    def is_checked(self, x) -> bool:
        return isinstance(x, torch.Tensor) and x.requires_grad

    def is_complex(self, x) -> bool:
        return isinstance(x, torch.Tensor) and x.is_complex()

    def is_floating_or_complex(self, x) -> bool:
        return isinstance(x, torch.Tensor) and (x.is_floating_point() or x.is_complex())

    def is_double_precision(self, x) -> bool:
        return x.dtype in (torch.float64, torch.complex128)

    def is_differentiable_output(self, x) -> bool:
        return isinstance(x, torch.Tensor) and x.requires_grad

    def is_bool(self, x) -> bool:
        return x.dtype == torch.bool

    def numel(self, x) -> int:
        return x.numel()

    def machine_epsilon(self, x) -> float:
        return torch.finfo(x.dtype).eps

    def itemsize(self, x) -> int:
        return x.element_size()

    # -- validation -------------------------------------------------------------------
    def validate_input(self, idx: int, x) -> None:
        if x.device.type == "meta":
            raise CheckInputError(
                f"input {idx} is on the meta device, which holds shapes but no values: finite "
                "differences need an input with values (create it on the CPU or an accelerator)"
            )
        # a sparse input's stored values must not overlap either; MKL-DNN is opaque
        content = x if x.layout == torch.strided else torch_sparse.validated_content(idx, x)
        if content is None:
            return
        if any(st == 0 and sz > 1 for st, sz in zip(content.stride(), content.shape)):
            raise RuntimeError(
                f"The {idx}th input has a dimension with stride 0. Finite differences need "
                "every element to have its own memory (an expanded tensor moves many elements "
                "at once); call .contiguous() on the input before checking it."
            )

    def validate_outputs(self, outputs) -> None:
        for o in outputs:
            if _is_sparse(o):
                raise ValueError(
                    "Sparse output is not supported at gradcheck yet. "
                    "Please call to_dense(masked_grad=...) on the output of fn for gradcheck."
                )
            if o.layout == torch._mkldnn:
                raise ValueError(
                    "MKLDNN output is not supported at gradcheck yet. "
                    "Please call to_dense(masked_grad=...) on the output of fn for gradcheck."
                )

    @contextmanager
    def preserve_state(self, args):
        cpu_state = torch.get_rng_state()
        cuda_devices = sorted({a.device.index or 0 for a in args if isinstance(a, torch.Tensor) and a.is_cuda})
        cuda_states = [(d, torch.cuda.get_rng_state(d)) for d in cuda_devices]
        leaves = [a for a in args if isinstance(a, torch.Tensor) and a.is_leaf]
        saved = [(a, a.requires_grad, a.grad, None if a.grad is None else a.grad.clone()) for a in leaves]
        try:
            yield
        finally:
            torch.set_rng_state(cpu_state)
            for d, state in cuda_states:
                torch.cuda.set_rng_state(state, d)
            for a, requires_grad, grad, grad_value in saved:
                if a.requires_grad != requires_grad:
                    a.requires_grad_(requires_grad)
                if a.grad is not grad:
                    a.grad = grad
                if grad is not None and grad.layout == torch.strided and not torch.equal(grad, grad_value):
                    with torch.no_grad():
                        grad.copy_(grad_value)

    # -- evaluation -------------------------------------------------------------------
    def trace(self, fn, args, checked) -> TorchTrace:
        return TorchTrace(self.as_tuple(fn(*args)), [args[p] for p in checked])

    @contextmanager
    def perturber(self, args, position):
        x = args[position]
        if x.layout != torch.strided:  # sparse: move stored values; MKL-DNN: a strided copy
            with torch_sparse.perturber(args, position, self.as_tuple) as p:
                yield p
            return
        # every evaluation restores the input in its own ``finally``
        perturber = TorchPerturber(x, self.as_tuple)
        perturber.args = args
        yield perturber

    def _dual_args(self, args, tangents_by_position, detach_others=False):
        new = list(args)
        for k, a in enumerate(args):
            if k in tangents_by_position:
                if a.layout == torch._mkldnn:
                    raise ValueError(mkldnn_forward_ad_message())
                if torch_sparse.is_sparse(a):
                    torch_sparse.reject_forward_ad(a)
                t = _fresh(tangents_by_position[k])
                new[k] = a.detach() if t is None else fwAD.make_dual(a.detach(), t)
            elif detach_others and isinstance(a, torch.Tensor):
                new[k] = a.detach()
        return new

    def jvp(self, fn, args, checked, tangents) -> list:
        with _dual_level():
            return self._primals_and_tangents(fn(*self._dual_args(args, dict(zip(checked, tangents)))))

    def _primals_and_tangents(self, outputs) -> list:
        result = []
        for o in self.as_tuple(outputs):
            if self.is_floating_or_complex(o):
                primal, tangent = fwAD.unpack_dual(o)
                result.append((primal.detach(), None if tangent is None else tangent.clone()))
        return result

    @contextmanager
    def _zero_tangent_duals(self, args, checked):
        """``args`` with each checked input a dual of zero tangent, inside a dual level: the
        loops write their tangents into the duals' own."""
        with _dual_level():
            yield self._dual_args(args, {p: torch.zeros_like(args[p]) for p in checked})

    def jvp_elements(self, fn, args, checked, wanted, receive) -> None:
        # as torch's checker does: the dual inputs made once for all the inputs, with zero
        # tangents, and each element's one written into its input's tangent for one evaluation
        if any(args[p].layout != torch.strided for p in checked):
            super().jvp_elements(fn, args, checked, wanted, receive)
            return
        with self._zero_tangent_duals(args, checked) as duals:
            for i, elements in wanted:
                tangent = fwAD.unpack_dual(duals[checked[i]]).tangent  # the dual's own, maybe restrided
                if tangent.is_contiguous():
                    target, place = tangent.view(-1), int
                else:
                    target, place = tangent, lambda flat: tuple(int(k) for k in np.unravel_index(flat, tangent.shape))
                for flat in elements:
                    at = place(flat)
                    target[at] = 1
                    try:
                        result = self._primals_and_tangents(fn(*duals))
                    finally:
                        target[at] = 0
                    receive(i, result)

    def jvp_each(self, fn, args, checked, tangents, receive) -> None:
        # as torch's fast mode does: the dual inputs made once, with zero tangents, and each
        # input's tangent copied into its dual's own for one evaluation
        if any(args[p].layout != torch.strided for p in checked):
            super().jvp_each(fn, args, checked, tangents, receive)
            return
        with self._zero_tangent_duals(args, checked) as duals:
            for p, t in zip(checked, tangents):
                own = fwAD.unpack_dual(duals[p]).tangent
                own.copy_(t)
                try:
                    result = self._primals_and_tangents(fn(*duals))
                finally:
                    own.zero_()
                receive(result)

    def jvp_wrt(self, fn, args, position, tangent) -> tuple:
        with _dual_level():
            outs = self.as_tuple(fn(*self._dual_args(args, {position: tangent}, detach_others=True)))
            result = []
            for o in outs:
                if o is None:
                    continue
                primal, t = fwAD.unpack_dual(o)
                if t is None:
                    t = torch.zeros([], dtype=primal.dtype, device=primal.device).expand(primal.shape)
                result.append(t)
            return tuple(result)

    def jvp_batched(self, fn, args, position, stacked_tangents) -> tuple:
        from torch._vmap_internals import _vmap

        with _quiet_batching():
            return _vmap(lambda t: self.jvp_wrt(fn, args, position, t))(stacked_tangents)

    def vjp_with_undefined_outputs(self, fn, args, checked, undefined, trace=None) -> list:
        outputs = trace.outputs if trace is not None else self.as_tuple(fn(*args))
        outs = [o for o in outputs if isinstance(o, torch.Tensor) and o.requires_grad]
        make_undefined = torch._C._functions.UndefinedGrad()
        marked = [make_undefined(o) if undefined == "all" or k in undefined else o for k, o in enumerate(outs)]
        zeros = [torch.zeros_like(o, memory_format=torch.legacy_contiguous_format) for o in marked]
        # a trace's graph may be differentiated again (one undefined output at a time)
        return list(torch_engine.vjp(tuple(marked), tuple(args[p] for p in checked), tuple(zeros),
                                     retain_graph=trace is not None))

    # -- batched forms (the batched engine) ---------------------------------------------
    def evaluate_batch(self, fn, args, position, stacked):
        """``fn`` evaluated with ``args[position]`` replaced by each of ``stacked`` (vmapped)."""
        return self._vmapped(fn, args, position, stacked, functional=False)

    def evaluate_batch_functional(self, fn, args, position, stacked):
        """:meth:`evaluate_batch` through ``torch.func.functionalize``: writes into tensors
        fn creates become out-of-place ops, which vmap batches where it refuses the in-place
        ones ("vmap: inplace arithmetic ... is not possible")."""
        return self._vmapped(fn, args, position, stacked, functional=True)

    def _vmapped(self, fn, args, position, stacked, functional):
        vjp_fn = _vjp_function(fn)
        if vjp_fn is not None and position >= vjp_fn.n_inputs:
            if functional:
                # fn's forward runs plainly there, so its writes need no functionalizing
                raise ValueError("cotangents move by the vmapped backward pass alone")
            grads = vjp_fn.over_cotangents(args, position, stacked)
            return grads if vjp_fn is fn else fn.taken(grads)

        def at(value):
            moved = list(args)
            moved[position] = value
            return self.as_tuple(fn(*moved))

        batched = torch.func.vmap(torch.func.functionalize(at) if functional else at)
        with _quiet_batching():
            return tuple(o.detach() for o in batched(stacked))

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

    def array_like(self, values, like):
        return torch.as_tensor(values, device=like.device)

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
            # use imports torch._dynamo (about 1.2 s): a smaller check's loop does not repay them
            least = VMAPPED_VJP_FROM_ELEMENTS if position < vjp_fn.n_inputs else VMAPPED_COTANGENTS_FROM_ELEMENTS
            if sum(x.numel() for x in trace.inputs) < least:
                return f"a VJP of fewer than {least} elements is not vmapped"
        if vjp_fn is not None and position >= vjp_fn.n_inputs:
            return None  # fn's forward runs plainly there: only its backward pass is vmapped
        return trace.batching_obstacle()

    # -- array algebra ----------------------------------------------------------------
    def real(self, x):
        return torch.real(x)

    def imag(self, x):
        return torch.imag(x)

    def part_as_input(self, x, part):
        piece = x.real if part == "real" else x.imag
        return piece.detach().clone().requires_grad_(x.requires_grad)

    def row_block(self, n_rows, n_cols, like, dtype):
        if like.layout != torch.strided:
            return None
        return torch.empty((n_rows, n_cols), dtype=dtype, device=like.device)

    def owned_rows(self, rows):
        if rows.layout != torch.strided or not rows.is_contiguous() or rows.is_conj() or rows.is_neg() \
                or rows.untyped_storage().nbytes() != rows.numel() * rows.element_size():
            return None
        return rows.detach()

    def write_rows(self, block, start, rows):
        rows = [(r if r.dtype == block.dtype else r.to(block.dtype)).detach() for r in rows]
        torch.stack(rows, out=block[start:start + len(rows)])

    def xp(self, x):
        return _XP

    def zeros(self, shape, like, dtype=None):
        return torch.zeros(tuple(shape), dtype=dtype or like.dtype, device=like.device)

    def one_hot(self, like, flat):
        z = torch.zeros(like.shape, dtype=like.dtype, device=like.device)
        z.view(-1)[flat] = 1
        return z

    def all_finite(self, x) -> bool:
        if not (x.dtype.is_floating_point or x.dtype.is_complex):
            return True
        # a finite sum needs every element finite (NaN and infinities reach it); only a
        # sum that overflows or is not finite needs the elementwise pass
        if x.numel() >= _FEWER_PASSES_NUMEL and bool(torch.isfinite(x.sum())):
            return True
        return bool(torch.isfinite(x).all())

    def summarized_edge_items(self, numel: int) -> int | None:
        # torch prints the edges of a tensor above the threshold, formatted from them alone
        options = getattr(torch._tensor_str, "get_printoptions", None)
        return None if options is None else summary_edges(options(), numel)

    def allclose(self, a, b, rtol, atol) -> bool:
        dtype = torch.promote_types(a.dtype, b.dtype)
        a, b = a.to(dtype), b.to(dtype)
        inexact = a.dtype.is_floating_point or a.dtype.is_complex
        if a.numel() >= _FEWER_PASSES_NUMEL and a.shape == b.shape and inexact:
            # torch.allclose's rule on finite differences (|a - b| <= atol + |rtol * b|, in
            # its order of operations, so the same bits: for complex b, |rtol * b| and
            # rtol * |b| round differently, and |b| alone may overflow), in fewer passes;
            # NaN and infinities are decided by torch.allclose itself
            diff = (a - b).abs()
            if bool(torch.isfinite(diff.max())):
                bound = (b * rtol).abs_() if b.dtype.is_floating_point else (b * rtol).abs()
                return bool(diff.le_(bound.add_(atol)).all())
        return bool(torch.allclose(a, b, rtol, atol))

    def same_device(self, a, b) -> bool:
        return a.device == b.device

    def to_device_of(self, x, like):
        return x.to(like.device)

    def layout(self, x) -> str:
        return torch_sparse.layout_name(x)

    def densify(self, x):
        return torch_sparse.densify(x)

    def to_dense(self, x):
        return x if x.layout == torch.strided else x.to_dense()

    def gradient_layout_problem(self, g, x):
        if g.layout == torch.strided:
            return None
        if g.layout != x.layout:
            return f"grad is incorrect layout ({g.layout} is not {x.layout})"
        if _is_sparse(g):
            kind = str(g.layout).replace("torch.", "").replace("_coo", "")
            if g.sparse_dim() != x.sparse_dim():
                return f"grad is {kind} tensor, but has incorrect sparse_dim {g.sparse_dim()}, expected {x.sparse_dim()}"
            if g.dense_dim() != x.dense_dim():
                return f"grad is {kind} tensor, but has incorrect dense_dim {g.dense_dim()}, expected {x.dense_dim()}"
        return None

    def modification_count(self, x):
        return None if x.is_inference() else x._version

    def snapshot(self, x):
        return x.detach().clone() if x.layout == torch.strided else torch_sparse.snapshot(x)

    def content_digest(self, x):
        # dense CPU tensors only: elsewhere reading the values means a copy to the host
        if type(x) is not torch.Tensor and type(x) is not torch.nn.Parameter:
            return None
        if x.layout != torch.strided or x.device.type != "cpu" or torch._C._functorch.is_functorch_wrapped_tensor(x):
            return None
        if fwAD._current_level >= 0 and fwAD.unpack_dual(x).tangent is not None:
            return None  # a dual tensor: its values alone do not make it
        data = x.detach()
        if data.is_conj() or data.is_neg():
            data = data.resolve_conj().resolve_neg()
        if not data.is_contiguous():
            data = data.contiguous()
        values = None
        if data.dtype not in _NOT_IN_NUMPY:
            try:
                values = data.numpy()  # its bytes as they are, without a reshaped byte view
            except TypeError:
                _NOT_IN_NUMPY.add(data.dtype)
        if values is None:  # a dtype NumPy lacks (bfloat16, float8): the bytes as uint8
            values = data.reshape(-1).view(torch.uint8).numpy()
        return tuple(data.shape), data.dtype, hashlib.blake2b(values, digest_size=16).digest()

    def unchanged(self, x, snapshot) -> bool:
        if x.layout != torch.strided:  # indices and values, bitwise
            return torch_sparse.unchanged(x, snapshot)
        return snapshot is None or _bitwise_equal(x.detach(), snapshot)

    def restore(self, x, snapshot) -> None:
        if x.layout != torch.strided:
            torch_sparse.restore(x, snapshot)
        elif snapshot is not None:
            with torch.no_grad():
                x.data.copy_(snapshot)

    def to_numpy(self, x):
        x = self.to_dense(x).detach()
        if x._is_zerotensor():  # an efficient zero (the gradient of sgn, say): no storage to read
            x = torch.zeros(x.shape, dtype=x.dtype)
        if x.is_conj():
            x = x.resolve_conj()
        if x.is_neg():  # a lazily negated view (of a conjugate's imaginary part, say)
            x = x.resolve_neg()
        if x.dtype in _WIDENED_FOR_NUMPY:  # dtypes NumPy has no counterpart for: exactly widened
            x = x.to(_WIDENED_FOR_NUMPY[x.dtype])
        return x.cpu().numpy()

    # -- randomness -------------------------------------------------------------------
    def generator(self, like, seed):
        device = like.device if isinstance(like, torch.Tensor) else torch.device("cpu")
        gen = torch.Generator(device=device)
        gen.manual_seed(seed)
        return gen

    def uniform_unit_vector(self, like, generator, real):
        # torch's probes drop the imaginary part of complex128 / complex64 only: a complex32
        # input keeps a complex32 probe (whose normalisation torch cannot compute on the CPU)
        dtype = _REAL_PROBE_DTYPES.get(like.dtype, like.dtype) if real else like.dtype
        if torch_sparse.is_sparse(like):  # random at the specified elements, zero elsewhere
            return torch_sparse.probe_vector(like, generator, dtype)
        vec = torch.rand(like.numel(), generator=generator, device=generator.device)
        vec = vec.to(dtype=dtype, device=like.device)
        vec /= vec.norm()
        return vec

    def normal_like(self, like, generator):
        sample = torch.randn(tuple(like.shape), generator=generator, device=generator.device, dtype=like.dtype)
        return sample.to(like.device)

    # -- conversion, precision, second derivatives (crosscheck and the frontends) -------
    def from_numpy(self, values, *, checked: bool = False, like=None):
        """A tensor with the values of the NumPy array ``values`` (a copy), cast to
        ``like``'s dtype and moved to its device when ``like`` is given, and requiring
        grad when ``checked``."""
        values = np.asarray(values)
        if like is not None:
            values = np.asarray(values, dtype=_numpy_dtype(like))
        t = torch.from_numpy(np.array(values, copy=True))
        if like is not None:
            t = t.to(like.device)
        return t.requires_grad_(True) if checked else t

    # precision(): torch keeps the precision of its data; the base class's does nothing

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

    # compiled(): agcheck runs torch code eagerly; the base class's returns fn itself


_REAL_PROBE_DTYPES = {torch.complex128: torch.float64, torch.complex64: torch.float32}


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


#: tensor dtypes that ``Tensor.numpy()`` refuses (bfloat16, float8, ...), as met
_NOT_IN_NUMPY: set = set()


def mkldnn_forward_ad_message(version: str | None = None) -> str:
    """The text of the ``ValueError`` for an MKL-DNN input under forward mode, worded as
    the installed torch (or ``version``) words it: torch 2.14 corrected "not support" to
    "not supported", and suites match the message of the torch they run with."""
    release = tuple(int(p) for p in re.findall(r"\d+", version or torch.__version__)[:2])
    verb = "supported" if release >= (2, 14) else "support"
    return f"MKLDNN inputs are not {verb} for forward AD gradcheck."


def _vjp_function(fn) -> _DifferentiableVjp | None:
    """The VJP function behind ``fn``: ``fn`` itself, or the one whose real or imaginary
    parts it takes (:class:`OutputPart`, the two passes over complex outputs); ``None``
    where there is none."""
    inner = fn.fn if isinstance(fn, OutputPart) else fn
    return inner if isinstance(inner, _DifferentiableVjp) else None


def _numpy_dtype(x: torch.Tensor) -> np.dtype:
    """The NumPy dtype of a tensor's dtype."""
    return torch.empty((), dtype=x.dtype).numpy().dtype


#: a VJP function (gradgradcheck's) is vmapped only where its checked inputs hold at least
#: this many elements: vmapping it goes through torch.func, whose first use in a process
#: imports torch._dynamo (about 1.2 s), which the loop of a smaller check does not repay
VMAPPED_VJP_FROM_ELEMENTS = 2000
#: the same for its cotangents, which move by a vmapped backward pass alone: from as many
#: elements as the engine's batched VJPs ask calls (``agcheck.engine.cost.BATCHED_VJPS_FROM_CALLS``)
VMAPPED_COTANGENTS_FROM_ELEMENTS = 128


#: real floating dtypes and the integers of their size, whose equality is bitwise equality
_SAME_SIZE_INTS = {torch.float64: torch.int64, torch.float32: torch.int32, torch.float16: torch.int16,
                   torch.bfloat16: torch.int16}


def _bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    bits = _SAME_SIZE_INTS.get(a.dtype)
    if bits is not None and b.dtype == a.dtype and a.is_contiguous() and b.is_contiguous() and \
            not (a.is_neg() or b.is_neg()):
        return torch.equal(a.view(bits), b.view(bits))
    # conjugate / negative views compare by the values they stand for
    a, b = a.resolve_conj().resolve_neg(), b.resolve_conj().resolve_neg()
    if a.is_complex():
        a, b = torch.view_as_real(a), torch.view_as_real(b)
    if a.dtype.is_floating_point:
        bits = {2: torch.int16, 4: torch.int32, 8: torch.int64}.get(a.element_size())
        if bits is not None:
            return torch.equal(a.contiguous().view(bits), b.contiguous().view(bits))
    return torch.equal(a, b)


BACKEND_CLASS = TorchBackend

