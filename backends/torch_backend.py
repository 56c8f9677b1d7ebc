"""The torch backend: real and complex tensors on any device, strided, sparse (COO, CSR,
CSC, BSR, BSC; see ``torch_sparse``) or MKL-DNN."""
from __future__ import annotations

import copy
import hashlib
import re
import threading
from contextlib import contextmanager

import numpy as np
import torch
import torch.autograd.forward_ad as fwAD

from agcheck.backends.base import Backend, summary_edges

from agcheck.backends import torch_engine, torch_errors, torch_sparse
from agcheck.backends.torch_arrays import (_NOT_IN_NUMPY, _REAL_PROBE_DTYPES, _WIDENED_FOR_NUMPY, _XP, _bitwise_equal,
                                           _is_sparse, _numpy_dtype, owns)
from agcheck.backends.torch_batched import TorchBatched
from agcheck.backends.torch_second_order import TorchSecondOrder
from agcheck.backends.torch_trace import TorchPerturber, TorchTrace, _fresh
from agcheck.errors import CheckInputError

__all__ = ["TorchBackend", "BACKEND_CLASS"]


#: torch keeps one forward-AD level for the whole process: two threads inside
#: ``dual_level()`` at once fail ("Nested forward mode AD is not supported"), so agcheck's
#: forward-mode work takes its turn (torch's own checker in another thread still collides)
_DUAL_LEVEL_LOCK = threading.RLock()


@contextmanager
def _dual_level():
    """``forward_ad.dual_level()``, one thread at a time."""
    with _DUAL_LEVEL_LOCK, fwAD.dual_level():
        yield


#: from this many entries on, allclose decides finite values in fewer passes than
#: torch.allclose; below it torch.allclose's one call is cheaper (12 against 22 µs)
_FEWER_PASSES_NUMEL = 4096



class TorchBackend(TorchBatched, TorchSecondOrder, Backend):
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

    def vjp_with_undefined_outputs(self, fn, args, checked, undefined, trace=None) -> list:
        outputs = trace.outputs if trace is not None else self.as_tuple(fn(*args))
        outs = [o for o in outputs if isinstance(o, torch.Tensor) and o.requires_grad]
        make_undefined = torch._C._functions.UndefinedGrad()
        marked = [make_undefined(o) if undefined == "all" or k in undefined else o for k, o in enumerate(outs)]
        zeros = [torch.zeros_like(o, memory_format=torch.legacy_contiguous_format) for o in marked]
        # a trace's graph may be differentiated again (one undefined output at a time)
        return list(torch_engine.vjp(tuple(marked), tuple(args[p] for p in checked), tuple(zeros),
                                     retain_graph=trace is not None))

    def array_like(self, values, like):
        return torch.as_tensor(values, device=like.device)

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

    # compiled(): agcheck runs torch code eagerly; the base class's returns fn itself



def mkldnn_forward_ad_message(version: str | None = None) -> str:
    """The text of the ``ValueError`` for an MKL-DNN input under forward mode, worded as
    the installed torch (or ``version``) words it: torch 2.14 corrected "not support" to
    "not supported", and suites match the message of the torch they run with."""
    release = tuple(int(p) for p in re.findall(r"\d+", version or torch.__version__)[:2])
    verb = "supported" if release >= (2, 14) else "support"
    return f"MKLDNN inputs are not {verb} for forward AD gradcheck."


BACKEND_CLASS = TorchBackend

