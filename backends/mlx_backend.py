"""The MLX backend: dense real and complex ``mlx.core.array`` inputs.

Reverse mode goes through ``mx.vjp``, forward mode through ``mx.jvp``, batched forms
through ``mx.vmap``, second derivatives through ``mx.vjp`` of ``mx.vjp``; functions made
with ``mx.custom_function`` are differentiated by their own ``vjp`` / ``jvp``.

What differs from the torch backend:

* *which inputs are checked*: every floating or complex MLX array among the arguments,
  or the arguments named by ``wrt=`` (as on JAX and TensorFlow);
* *no retained graph*: MLX has no pullback to keep (``mx.vjp`` takes the cotangents
  with the primals), so every VJP evaluates ``fn`` again;
* *perturbation*: ``fn`` is called with a moved copy of the input (``x[k] - step``,
  ``x[k] + step`` in the input's dtype); the caller's array is never written to;
* *precision*: MLX computes float64 on the CPU only (no complex128 at all), so a check
  whose inputs hold float64 arrays runs on the CPU stream (:meth:`MlxBackend.preserve_state`,
  :meth:`MlxBackend.precision`), whatever the default device;
* *complex numbers*: MLX's VJP convention is torch's (measured in ``docs/mlx.md``: the
  VJP of ``Im(z)`` with cotangent ``v`` is ``1j * v``, of ``z * z`` it is
  ``v * conj(2 z)``), and JVPs agree, so nothing is mapped;
* *undefined gradients*: MLX has none; an unused input gets a zero gradient, and
  ``check_undefined_grad`` back-propagates zero cotangents (as on JAX).

The core computes with MLX arrays (their dtypes compare among themselves); the
bookkeeping algebra (one-hots, reductions, comparisons) is done on NumPy copies and the
results made MLX arrays again, which computes nothing on any device.
"""
from __future__ import annotations

import contextlib
import hashlib
from contextlib import contextmanager

import mlx.core as mx
import numpy as np

from agcheck.backends.host_checks import HostChecks
from agcheck.backends.base import Backend
from agcheck.backends.mlx_arrays import (_XP, _Outputs, _as_mx, _back, _copy, _evaluated, _is_inexact, _mx_dtype,
                                         _np_dtype, _on_cpu_for, _view, _with_replaced, owns)
from agcheck.backends.mlx_batched import MlxBatched
from agcheck.backends.mlx_trace import MlxPerturber, MlxTrace
from agcheck.backends.wrt import TakesWrt, normalize_wrt, resolve_wrt

__all__ = ["MlxBackend", "MlxTrace", "MlxPerturber", "BACKEND_CLASS", "owns"]

class MlxBackend(MlxBatched, HostChecks, TakesWrt, Backend):
    """Dense real and complex MLX arrays; ``wrt=`` picks the checked inputs.

    Options (per call, through :meth:`with_options`):

    wrt : int or tuple of int, optional
        The positions of ``fn``'s arguments to differentiate with respect to. Default:
        every floating or complex MLX array among the arguments.
    """

    name = "mlx"
    host = staticmethod(_view)  # the arrays as NumPy, for HostChecks
    runs_array_api_code = False  # array_api_compat has no namespace for MLX arrays
    capabilities = frozenset({"reverse", "forward", "batched", "batched_forward", "undefined_grad", "second_order",
                              "batched_evaluation", "batched_jvp"})
    no_checked_inputs_message = (
        "gradcheck expects at least one input to differentiate with respect to, but no input "
        "is a floating point or complex MLX array (choose inputs with wrt=...)."
    )

    def __init__(self, wrt=None):
        self.wrt = normalize_wrt(wrt)
        self._prepared: tuple | None = None
        self._prepared_checked: list | None = None

    # -- configuration ----------------------------------------------------------------
    def refusal(self, capability, keyword) -> Exception:
        """``masked`` concerns sparse layouts, which MLX does not have."""
        if capability == "masked":
            return ValueError(
                "masked=True selects the specified elements of sparse inputs, and MLX arrays are "
                "dense: the 'mlx' backend has nothing to mask. Leave masked at its default."
            )
        return super().refusal(capability, keyword)

    @staticmethod
    def _as_mlx_input(a):
        """A NumPy floating/complex array or a Python float/complex named by ``wrt=`` as an
        MLX array (float64 kept; complex128 becomes complex64, MLX's widest)."""
        if isinstance(a, (np.ndarray, np.generic)) and np.issubdtype(a.dtype, np.inexact):
            return _back(a)
        if isinstance(a, (float, complex)) and not isinstance(a, bool):
            return _back(np.asarray(a))
        return a

    def prepare(self, fn, inputs):
        """The arguments as a flat tuple; with ``wrt=``, the named ones converted to MLX
        arrays where they are NumPy arrays or Python numbers, and recorded as the checked
        positions. When ``inputs`` begin with the arguments this instance prepared before
        (gradgradcheck appends cotangents), their checked positions are kept."""
        args = self.as_tuple(inputs)
        prev = self._prepared
        if prev is not None and len(args) >= len(prev) and all(a is b for a, b in zip(args, prev)):
            checked = self.checked_positions(args)
        elif self.wrt is not None:
            named = resolve_wrt(self.wrt, len(args))
            args = tuple(self._as_mlx_input(a) if k in named else a for k, a in enumerate(args))
            for k in named:
                if not _is_inexact(args[k]):
                    raise ValueError(f"wrt names input {k}, which is not a floating point or complex MLX array")
            checked = sorted(named)
        else:
            checked = [k for k, a in enumerate(args) if _is_inexact(a)]
        self._prepared, self._prepared_checked = args, checked
        return fn, args

    def checked_positions(self, args) -> list:
        prev = self._prepared
        if prev is not None and len(args) >= len(prev) and all(a is b for a, b in zip(args, prev)):
            return list(self._prepared_checked) + [k for k in range(len(prev), len(args)) if _is_inexact(args[k])]
        return [k for k, a in enumerate(args) if _is_inexact(a)]

    # -- inspection -------------------------------------------------------------------
    def owns(self, x) -> bool:
        return owns(x)

    def is_checked(self, x) -> bool:
        return _is_inexact(x)

    def is_complex(self, x) -> bool:
        return owns(x) and mx.issubdtype(x.dtype, mx.complexfloating)

    def is_floating_or_complex(self, x) -> bool:
        return _is_inexact(x)

    def is_double_precision(self, x) -> bool:
        return x.dtype == mx.float64  # MLX has no complex128

    def is_differentiable_output(self, x) -> bool:
        # no requires_grad: every floating or complex output is differentiable (one that
        # does not depend on the inputs has a zero Jacobian)
        return _is_inexact(x)

    def is_bool(self, x) -> bool:
        return x.dtype == mx.bool_

    def numel(self, x) -> int:
        return int(x.size)

    def dtype_name(self, x) -> str:
        return str(x.dtype).rsplit(".", 1)[-1]

    def itemsize(self, x) -> int:
        return int(x.dtype.size)

    def machine_epsilon(self, x) -> float:
        return float(mx.finfo(x.dtype).eps)

    # -- validation -------------------------------------------------------------------
    def validate_input(self, idx, x) -> None:
        if x.dtype == mx.bfloat16:
            raise TypeError(
                f"input {idx} is bfloat16, which the 'mlx' backend cannot move by finite differences "
                "(NumPy has no bfloat16); check it as float32 or float64 (x.astype(mx.float64))"
            )

    @contextmanager
    def preserve_state(self, args):
        """For the whole check: the CPU stream where an input holds float64 (MLX computes
        float64 on the CPU only), the caller's default stream again on exit. MLX keeps no
        random state the check could disturb (the backend draws from NumPy generators)."""
        with _on_cpu_for(args):
            yield

    # -- evaluation -------------------------------------------------------------------
    def trace(self, fn, args, checked) -> MlxTrace:
        of_checked = _Outputs(fn, args, checked, self.as_tuple)
        with _on_cpu_for(args):
            outputs = _evaluated(self.as_tuple(fn(*args)))
        return MlxTrace(outputs, of_checked, [args[p] for p in checked])

    @contextmanager
    def perturber(self, args, position):
        yield MlxPerturber(tuple(args), position, self.as_tuple)

    def _forward(self, fn, args, positions, tangents):
        """``(outputs, output tangents, the outputs' structure)`` of ``fn`` with ``tangents``
        on ``args[positions]`` (``None``: a zero tangent), its floating and complex outputs
        only; the structure (:class:`_Outputs`) tells where they were among the others."""
        primals = [args[p] for p in positions]
        carried = [mx.zeros_like(x) if t is None else _as_mx(t, x.dtype, x.shape) for t, x in zip(tangents, primals)]
        of_checked = _Outputs(fn, args, positions, self.as_tuple)
        with _on_cpu_for(args):
            outs, touts = mx.jvp(of_checked, primals, carried)
        return outs, touts, of_checked

    def jvp(self, fn, args, checked, tangents) -> list:
        outs, touts, _ = self._forward(fn, args, checked, tangents)
        _evaluated(outs + touts)
        return list(zip(outs, touts))

    def jvp_wrt(self, fn, args, position, tangent) -> tuple:
        """One tangent per MLX output of ``fn`` (zeros for integer and boolean ones)."""
        _, touts, structure = self._forward(fn, args, [position], [tangent])
        given = dict(zip(structure.inexact, touts))
        return _evaluated(tuple(given.get(k, mx.zeros(shape, dtype)) for k, shape, dtype in structure.arrays))

    def jvp_batched(self, fn, args, position, stacked_tangents) -> tuple:
        x = args[position]
        stacked = _as_mx(stacked_tangents, x.dtype)
        with _on_cpu_for(args):
            return _evaluated(tuple(mx.vmap(lambda t: tuple(self._forward(fn, args, [position], [t])[1]))(stacked)))

    def vjp_with_undefined_outputs(self, fn, args, checked, undefined, trace=None) -> list:
        # MLX has no undefined output gradients: zero cotangents for every output
        trace = trace if trace is not None else self.trace(fn, args, checked)
        return trace.vjp([], [])

    # -- second order -----------------------------------------------------------------
    def random_cotangent(self, like, generator, noncontiguous):
        """Uniform values in [-1, 1) shaped like ``like`` (float64 for non-floating
        outputs); ``noncontiguous`` has no meaning for MLX arrays and is ignored."""
        dtype = like.dtype if _is_inexact(like) else mx.float64
        shape = tuple(like.shape)
        values = generator.random(shape) * 2 - 1
        if mx.issubdtype(dtype, mx.complexfloating):
            values = values + 1j * (generator.random(shape) * 2 - 1)
        return _back(values, dtype)

    def differentiable_vjp(self, fn, n_inputs, input_positions, cotangent_positions, evaluated=None,
                           few_calls=False, evaluated_seconds=None):
        """The VJP of ``fn`` as a function of ``(*inputs, *cotangents)`` (one cotangent per
        floating or complex output, in order), made of MLX operations, so that MLX
        differentiates it again."""
        ordered = sorted(set(input_positions))

        def vjp_of_fn(*args):
            primals, cotangents = args[:n_inputs], args[n_inputs:]
            of_checked = _Outputs(fn, primals, ordered, self.as_tuple)
            xs = [primals[k] for k in ordered]
            with _on_cpu_for(args):
                outs = of_checked(*xs)  # their shapes and dtypes only: MLX evaluates nothing unread
                if not outs:
                    return tuple(mx.zeros_like(x) for x in xs)
                cots = [_as_mx(c, o.dtype, o.shape) for c, o in zip(cotangents, outs)]
                return tuple(mx.vjp(of_checked, xs, cots)[1])

        return vjp_of_fn

    # -- array algebra: NumPy copies made MLX arrays again (see the module's docstring) --
    def xp(self, x):
        return _XP

    def real(self, x):
        # MLX operations where fn's arrays may be traced (OutputPart, InputPart)
        if owns(x):
            with _on_cpu_for([x]):
                return mx.real(x)
        return _back(np.real(_view(x)))

    def imag(self, x):
        if owns(x):
            with _on_cpu_for([x]):
                return mx.imag(x)
        return _back(np.imag(_view(x)))

    def plus_imaginary(self, a, b):
        """``a + 1j * b`` in MLX's arithmetic (differentiable; complex64, MLX's only
        complex dtype)."""
        a, b = _as_mx(a), _as_mx(b)
        with _on_cpu_for([a, b]):
            return a.astype(mx.complex64) + b.astype(mx.complex64) * 1j

    def part_as_input(self, x, part):
        return self.real(x) if part == "real" else self.imag(x)

    def combine(self, stencil, values, eps):
        # on the host: NumPy's correctly rounded IEEE arithmetic in the values' dtype
        values = list(values)
        return _back(stencil.combine([_view(v) for v in values], eps), values[0].dtype if owns(values[0]) else None)

    def zeros(self, shape, like, dtype=None):
        return mx.zeros(tuple(int(s) for s in shape), _mx_dtype(dtype if dtype is not None else like.dtype))

    def one_hot(self, like, flat):
        z = np.zeros(tuple(like.shape), _np_dtype(like.dtype))
        z.reshape(-1)[flat] = 1
        return _back(z, like.dtype)

    def max_abs_difference(self, a, b):
        with np.errstate(invalid="ignore", over="ignore"):
            difference = _view(a) - _view(b)
            return float(np.max(np.abs(difference))) if difference.size else 0.0

    def summarized_edge_items(self, numel: int) -> int | None:
        # MLX prints every dimension longer than 6 as its first and last 3 items (fixed: its
        # print options set the precision only), so an array of up to 6 elements in full
        return 3 if numel > 6 else None

    def device_name(self, x) -> str:
        # arrays live in unified memory; the stream of each operation picks the device
        return str(mx.default_device())

    def same_device(self, a, b) -> bool:
        return True  # MLX arrays live in unified memory; ops choose the device, not the arrays

    def content_digest(self, x):
        try:
            values = np.ascontiguousarray(_view(x))
        except ValueError:  # an array traced by mx.vmap cannot be read
            return None
        digest = hashlib.blake2b(values.view(np.uint8), digest_size=16).digest()
        return tuple(values.shape), str(x.dtype), digest

    def snapshot(self, x):
        """A copy of ``x`` in new memory, an MLX array (the core also keeps outputs so)."""
        return _back(_copy(x), x.dtype)

    def unchanged(self, x, snapshot) -> bool:
        h, s = _view(x), _view(snapshot)
        return h.shape == s.shape and h.dtype == s.dtype and bool(
            np.array_equal(np.ascontiguousarray(h).reshape(-1).view(np.uint8),
                           np.ascontiguousarray(s).reshape(-1).view(np.uint8)))

    def restore(self, x, snapshot) -> None:
        """Write ``snapshot`` back into ``x`` (MLX arrays take item assignment in place)."""
        x[...] = _back(snapshot, x.dtype)

    def to_numpy(self, x):
        return _copy(x)

    def array_like(self, values, like):
        return _back(values)

    # -- randomness -------------------------------------------------------------------
    def generator(self, like, seed):
        """A private NumPy generator (MLX's global random state is untouched)."""
        return np.random.default_rng(seed)

    def uniform_unit_vector(self, like, generator, real):
        dtype = like.dtype
        if real and mx.issubdtype(dtype, mx.complexfloating):
            dtype = mx.float32
        vec = generator.random(self.numel(like))  # drawn in float64, normalized, then cast
        norm = np.linalg.norm(vec)
        return _back(vec / norm if norm > 0 else vec, dtype)

    def normal_like(self, like, generator):
        shape = tuple(like.shape)
        if mx.issubdtype(like.dtype, mx.complexfloating):
            # unit variance overall, as torch's complex randn
            values = (generator.standard_normal(shape) + 1j * generator.standard_normal(shape)) / np.sqrt(2)
        else:
            values = generator.standard_normal(shape)
        return _back(values, like.dtype)

    # -- conversion, precision, second derivatives (crosscheck and the frontends) -------
    def from_numpy(self, values, *, checked: bool = False, like=None):
        """An MLX array with the values of the NumPy array ``values`` (a copy), cast as
        NumPy casts to ``like``'s dtype when ``like`` is given. float64 stays float64;
        complex128 becomes complex64, MLX's widest complex type. ``checked`` has no
        meaning: every floating or complex MLX array takes part in a check by default
        (or those named with ``wrt=``)."""
        return _back(np.array(values, copy=True), like.dtype if like is not None else None)

    def precision(self, double: bool):
        """The CPU stream when ``double`` (MLX computes float64 on the CPU only; the
        caller's default stream comes back on exit); nothing otherwise."""
        return mx.stream(mx.cpu) if double else contextlib.nullcontext()

    def vjp_of_vjp(self, fn, args, checked, output, cotangent, gradient_cotangents) -> dict:
        """``mx.vjp`` of ``mx.vjp``; MLX's complex convention is torch's at both levels, so
        nothing is mapped. An output that is not floating or complex gives zeros."""
        primals = [args[p] for p in checked]
        sizes = [int(x.size) for x in primals]
        with _on_cpu_for(args):
            out = self.as_tuple(fn(*args))[output]
            if not _is_inexact(out):
                return {(j1, j2): np.zeros((len(gradient_cotangents[j1]), sizes[j2]), _np_dtype(primals[j2].dtype))
                        for j1 in range(len(primals)) for j2 in range(len(primals))}
            w = _as_mx(np.asarray(cotangent), out.dtype, out.shape)

            def f_k(*xs):
                return [self.as_tuple(fn(*_with_replaced(args, checked, xs)))[output]]

            def gradients(*xs):
                return list(mx.vjp(f_k, list(xs), [w])[1])

            result = {}
            for j1, x1 in enumerate(primals):
                rows = {j2: [] for j2 in range(len(primals))}
                for c in gradient_cotangents[j1]:
                    cots = [mx.zeros_like(x) for x in primals]
                    cots[j1] = _as_mx(np.asarray(c), x1.dtype, x1.shape)
                    for j2, h in enumerate(mx.vjp(gradients, primals, cots)[1]):
                        rows[j2].append(_copy(h).reshape(-1))
                for j2, x2 in enumerate(primals):
                    result[(j1, j2)] = (np.stack(rows[j2], 0) if rows[j2]
                                        else np.zeros((0, sizes[j2]), _np_dtype(x2.dtype)))
        return result

    def framework_version(self) -> str:
        return str(mx.__version__)

    def compiled(self, fn):
        """``mx.compile(fn)``: MLX code often runs compiled; derivatives are the same."""
        return mx.compile(fn)


BACKEND_CLASS = MlxBackend
