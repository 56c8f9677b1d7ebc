"""The TensorFlow backend: dense real and complex ``tf.Tensor`` and ``tf.Variable`` inputs.

Reverse mode goes through ``tf.GradientTape`` (cotangents as ``output_gradients``; a
``None`` gradient from the tape is an undefined gradient), forward mode through
``tf.autodiff.ForwardAccumulator``, batched forms through ``tf.vectorized_map`` (each
traced once per check: :class:`_BatchedForm`), second derivatives through nested tapes. ``tf.function`` and ``tf.custom_gradient`` functions are
differentiated as TensorFlow differentiates them.

What differs from the torch backend:

* *which inputs are checked*: every floating or complex ``tf.Tensor`` / ``tf.Variable``
  among the arguments, or the arguments named by ``wrt=`` (as on JAX);
* *perturbation*: a ``tf.Variable`` is moved in place (``assign``) and assigned back
  bitwise afterwards, also when ``fn`` raises, so a function that reads it through a
  closure sees the move; a ``tf.Tensor`` is immutable and is replaced by a moved copy in
  the arguments of that one call;
* *the arrays the core computes with*: TensorFlow's operators do not promote (a float64
  tensor times ``1j`` is a ``TypeError``), while the core combines real and imaginary
  parts with Python's operators. ``fn`` therefore always receives and returns TensorFlow
  objects, but everything this backend computes *for the core* (gradients, tangents,
  finite-difference values, probes, one-hots) is a NumPy array on the host. The
  Jacobians of ``agcheck.numerical_jacobian`` / ``analytical_jacobian`` come back as
  NumPy arrays for the same reason;
* *undefined gradients*: TensorFlow has no "undefined" marker for an output gradient.
  ``check_undefined_grad`` back-propagates zero ``output_gradients`` (what a
  ``tf.custom_gradient`` receives for an output nobody differentiates) and requires zero
  or unconnected (``None``, ``unconnected_gradients=NONE``) input gradients;
* *complex numbers*: TensorFlow's reverse-mode convention is torch's (the gradient of
  ``Im(z)`` is ``1j``; the VJP of ``z * z`` with cotangent ``v`` is ``v * conj(2 z)``), so
  nothing is mapped (the JAX backend has to conjugate).
"""
from __future__ import annotations

import contextlib
from contextlib import contextmanager

import numpy as np

from agcheck.backends.wrt import TakesWrt, normalize_wrt, resolve_wrt
from agcheck.backends.host_checks import HostChecks
from agcheck.backends.base import Backend
from agcheck.backends.tensorflow_arrays import (_XP, _Native, _device, _dtype, _host, _is_inexact, _np_dtype,
                                                _to_tf, owns, tf)
from agcheck.backends.tensorflow_batched import TfBatched, _quiet_notes
from agcheck.backends.tensorflow_second_order import TfSecondOrder
from agcheck.backends.tensorflow_trace import TfPerturber, TfTrace

__all__ = ["TensorFlowBackend", "TfTrace", "TfPerturber", "BACKEND_CLASS", "owns"]


class TensorFlowBackend(TfBatched, TfSecondOrder, HostChecks, TakesWrt, Backend):
    """Dense real and complex TensorFlow tensors and variables; ``wrt=`` picks the
    checked inputs.

    Options (per call, through :meth:`with_options`):

    wrt : int or tuple of int, optional
        The positions of ``fn``'s arguments to differentiate with respect to. Default:
        every floating or complex ``tf.Tensor`` / ``tf.Variable`` among the arguments.
    """

    name = "tensorflow"
    host = staticmethod(_host)  # the arrays as NumPy, for HostChecks
    runs_array_api_code = False  # array_api_compat has no namespace for TF tensors
    capabilities = frozenset({"reverse", "forward", "batched", "batched_forward", "undefined_grad", "second_order",
                              "batched_evaluation", "batched_jvp"})
    no_checked_inputs_message = (
        "gradcheck expects at least one input to differentiate with respect to, but no input "
        "is a floating point or complex tf.Tensor or tf.Variable (choose inputs with wrt=...)."
    )

    def __init__(self, wrt=None):
        self.wrt = normalize_wrt(wrt)
        self._prepared: tuple | None = None
        self._prepared_checked: list | None = None
        self._native = _Native(self)
        self._forms: dict = {}

    # -- configuration ----------------------------------------------------------------
    def _per_call_copy(self) -> None:
        self._native = _Native(self)
        self._forms = {}  # the batched forms traced for one check (:meth:`_form`)

    def array_namespace(self, *arrays):
        """agcheck's small array-API namespace over ``tf.math`` / ``tf.linalg``."""
        from agcheck.backends.tensorflow_xp import namespace

        return namespace

    def refusal(self, capability, keyword) -> Exception:
        """``masked`` concerns sparse layouts, which TensorFlow's dense tensors do not have."""
        if capability == "masked":
            return ValueError(
                "masked=True selects the specified elements of sparse inputs, and the 'tensorflow' "
                "backend checks dense tf.Tensor / tf.Variable inputs only (tf.sparse.SparseTensor "
                "is not supported): there is nothing to mask. Leave masked at its default."
            )
        return super().refusal(capability, keyword)

    @staticmethod
    def _as_tf_input(a):
        """A NumPy floating/complex array or a Python float/complex named by ``wrt=`` as a
        ``tf.Tensor`` (float64 / complex128 for Python numbers, as NumPy would make them)."""
        if isinstance(a, (np.ndarray, np.generic)) and np.issubdtype(a.dtype, np.inexact):
            return tf.constant(a)
        if isinstance(a, (float, complex)) and not isinstance(a, bool):
            return tf.constant(np.asarray(a))
        return a

    def prepare(self, fn, inputs):
        """The arguments as a flat tuple; with ``wrt=``, the named ones converted to
        ``tf.Tensor`` where they are NumPy arrays or Python numbers, and recorded as the
        checked positions. When ``inputs`` begin with the arguments this instance prepared
        before (gradgradcheck appends cotangents), their checked positions are kept."""
        args = self.as_tuple(inputs)
        prev = self._prepared
        if prev is not None and len(args) >= len(prev) and all(a is b for a, b in zip(args, prev)):
            checked = list(self._prepared_checked) + [k for k in range(len(prev), len(args)) if _is_inexact(args[k])]
        elif self.wrt is not None:
            named = resolve_wrt(self.wrt, len(args))
            args = tuple(self._as_tf_input(a) if k in named else a for k, a in enumerate(args))
            for k in named:
                if not _is_inexact(args[k]):
                    raise ValueError(f"wrt names input {k}, which is not a floating point or complex "
                                     "tf.Tensor or tf.Variable")
            checked = sorted(named)
        else:
            checked = [k for k, a in enumerate(args) if _is_inexact(a)]
        self._prepared = args
        self._prepared_checked = checked
        return fn, args

    def checked_positions(self, args) -> list:
        prev = self._prepared
        if prev is not None and len(args) >= len(prev) and all(a is b for a, b in zip(args, prev)):
            return list(self._prepared_checked) + [k for k in range(len(prev), len(args)) if _is_inexact(args[k])]
        return [k for k, a in enumerate(args) if _is_inexact(a)]

    # -- inspection -------------------------------------------------------------------
    def owns(self, x) -> bool:
        return owns(x)

    def is_array(self, x) -> bool:
        """TensorFlow objects, and the NumPy arrays this backend hands the core."""
        return owns(x) or isinstance(x, np.ndarray)

    def is_checked(self, x) -> bool:
        return _is_inexact(x)

    def _kind(self, x):
        return _dtype(x) if owns(x) else tf.as_dtype(np.asarray(x).dtype)

    def is_complex(self, x) -> bool:
        return self.is_array(x) and self._kind(x).is_complex

    def is_floating_or_complex(self, x) -> bool:
        if not self.is_array(x):
            return False
        kind = self._kind(x)
        return kind.is_floating or kind.is_complex

    def is_double_precision(self, x) -> bool:
        return self._kind(x) in (tf.float64, tf.complex128)

    def is_differentiable_output(self, x) -> bool:
        # TensorFlow has no requires_grad: every floating or complex tensor output is
        # differentiable (one that does not depend on the inputs has a zero Jacobian); a
        # NumPy array returned by fn is a constant to the tape
        return _is_inexact(x)

    def is_bool(self, x) -> bool:
        return self._kind(x) == tf.bool

    def dtype_name(self, x) -> str:
        return self._kind(x).name

    def itemsize(self, x) -> int:
        return int(_np_dtype(self._kind(x)).itemsize)

    def machine_epsilon(self, x) -> float:
        return float(np.finfo(_np_dtype(self._kind(x))).eps)

    # -- evaluation -------------------------------------------------------------------
    def trace(self, fn, args, checked) -> TfTrace:
        fn = self._native(fn)
        sources = [args[p] for p in checked]
        with tf.GradientTape(persistent=True, watch_accessed_variables=False) as tape:
            for s in sources:
                tape.watch(s)
            outputs = self.as_tuple(fn(*args))
        return TfTrace(outputs, tape, sources, self)

    @contextmanager
    def perturber(self, args, position):
        perturber = TfPerturber(tuple(args), position, self)
        try:
            yield perturber
        finally:
            x = perturber.x
            if isinstance(x, tf.Variable) and not self.unchanged(x, perturber._original):
                x.assign(perturber._original)

    def _tangent(self, t, x):
        shape = tuple(int(s) for s in x.shape)
        t = _to_tf(t, _dtype(x), like=x)
        if tuple(t.shape) != shape:
            t = tf.reshape(t, shape)
        return t

    def _forward(self, fn, args, positions, tangents):
        """``fn``'s outputs under a ``ForwardAccumulator`` with ``tangents`` on
        ``args[positions]`` (``None``: no tangent), and the accumulator."""
        fn = self._native(fn)
        primals, carried = [], []
        for p, t in zip(positions, tangents):
            if t is None:
                continue
            primals.append(args[p])
            carried.append(self._tangent(t, args[p]))
        with _quiet_notes():  # the note on complex primals comes from watching them
            acc = tf.autodiff.ForwardAccumulator(primals, carried)
        with acc:
            outs = self.as_tuple(fn(*args))
        return outs, acc

    def jvp(self, fn, args, checked, tangents) -> list:
        outs, acc = self._forward(fn, args, checked, tangents)
        result = []
        for o in outs:
            if self.is_floating_or_complex(o):
                t = acc.jvp(o) if owns(o) else None
                result.append((_host(o), None if t is None else _host(t)))
        return result

    def jvp_wrt(self, fn, args, position, tangent) -> tuple:
        outs, acc = self._forward(fn, args, [position], [tangent])
        result = []
        for o in outs:
            if not self.is_array(o):
                continue
            t = acc.jvp(o, unconnected_gradients=tf.UnconnectedGradients.ZERO) if _is_inexact(o) else None
            result.append(np.zeros(_host(o).shape, _host(o).dtype) if t is None else _host(t))
        return tuple(result)

    def vjp_with_undefined_outputs(self, fn, args, checked, undefined, trace=None) -> list:
        # TensorFlow has no undefined output gradients: an output nobody differentiates
        # gets zero output_gradients (that is what a tf.custom_gradient receives), so every
        # output is back-propagated with zeros; unconnected inputs give None (undefined)
        trace = trace if trace is not None else self.trace(fn, args, checked)
        positions = [k for k, o in enumerate(trace.outputs) if _is_inexact(o)]
        return trace.vjp(positions, [None] * len(positions))

    # -- array algebra: NumPy on the host (see the module's docstring) -------------------
    def xp(self, x):
        return _XP

    def real(self, x):
        return tf.math.real(x) if owns(x) else np.real(_host(x))

    def imag(self, x):
        return tf.math.imag(x) if owns(x) else np.imag(_host(x))

    def part_as_input(self, x, part):
        """The real or imaginary part of the complex ``x`` as a new ``tf.Tensor`` (a copy;
        a closure over a complex ``tf.Variable`` does not see it move)."""
        value = _to_tf(x)
        return tf.identity(tf.math.real(value) if part == "real" else tf.math.imag(value))

    def plus_imaginary(self, a, b):
        return _host(a) + _host(b) * 1j

    def zeros(self, shape, like, dtype=None):
        dtype = _np_dtype(dtype) if dtype is not None else _np_dtype(self._kind(like))
        return np.zeros(tuple(int(s) for s in shape), dtype)

    def one_hot(self, like, flat):
        z = np.zeros(tuple(int(s) for s in like.shape), _np_dtype(self._kind(like)))
        z.reshape(-1)[flat] = 1
        return z

    def device_name(self, x) -> str:
        return _device(x) or "cpu"

    def same_device(self, a, b) -> bool:
        # NumPy arrays (what the backend hands the core) live on the host, as CPU tensors do
        def where(x):
            d = _device(x) if owns(x) else None
            return "CPU" if not d or "CPU" in d.upper() else d

        return where(a) == where(b)

    def to_device_of(self, x, like):
        return x

    def snapshot(self, x):
        return _host(x).copy()

    def unchanged(self, x, snapshot) -> bool:
        h = _host(x)
        return h.shape == snapshot.shape and h.dtype == snapshot.dtype and bool(
            np.array_equal(h.reshape(-1).view(np.uint8), snapshot.reshape(-1).view(np.uint8)))

    def restore(self, x, snapshot) -> None:
        """Assign ``snapshot`` back to a ``tf.Variable`` (tensors are immutable)."""
        if isinstance(x, tf.Variable):
            x.assign(snapshot)

    def to_numpy(self, x):
        return _host(x)

    def array_like(self, values, like):
        """The NumPy array ``values`` as a ``tf.Tensor`` on ``like``'s device."""
        return _to_tf(values, like=like)

    # -- randomness -------------------------------------------------------------------
    def generator(self, like, seed):
        """A private ``tf.random.Generator`` seeded with ``seed`` (TensorFlow's global
        generator and seed are untouched)."""
        return tf.random.Generator.from_seed(int(seed) % (1 << 63))

    def uniform_unit_vector(self, like, generator, real):
        kind = self._kind(like)
        if real and kind.is_complex:
            kind = kind.real_dtype
        n = self.numel(like)
        vec = generator.uniform((n,), dtype=tf.float64).numpy()  # drawn in float64, normalized, then cast
        norm = np.linalg.norm(vec)
        if norm > 0:
            vec = vec / norm
        return vec.astype(_np_dtype(kind))

    def normal_like(self, like, generator):
        kind = self._kind(like)
        shape = tuple(int(s) for s in like.shape)
        if kind.is_complex:
            # unit variance overall, as torch's complex randn
            values = (generator.normal(shape, dtype=tf.float64).numpy()
                      + 1j * generator.normal(shape, dtype=tf.float64).numpy()) / np.sqrt(2)
        else:
            values = generator.normal(shape, dtype=tf.float64).numpy()
        return values.astype(_np_dtype(kind))

    # -- conversion, precision, second derivatives (crosscheck and the frontends) -------
    def from_numpy(self, values, *, checked: bool = False, like=None):
        """A ``tf.Tensor`` with the values of the NumPy array ``values`` (a copy), cast as
        NumPy casts to ``like``'s dtype and placed on its device when ``like`` is given.
        ``checked`` has no meaning: every floating or complex ``tf.Tensor`` takes part in
        a check by default (or those named with ``wrt=``)."""
        values = np.array(values, copy=True)
        if like is not None:
            return _to_tf(values.astype(_np_dtype(self._kind(like)), copy=False), like=like)
        return tf.constant(values)

    def precision(self, double: bool):
        """Nothing to switch: TensorFlow computes in the dtype of its tensors (float64
        data stay float64 without any global setting)."""
        return contextlib.nullcontext()

    def compiled(self, fn):
        """``fn`` itself: TensorFlow 2 runs eagerly unless the user wraps a function in
        ``tf.function`` (which the backend then checks as it is); derivatives are the
        same either way."""
        return fn


BACKEND_CLASS = TensorFlowBackend
