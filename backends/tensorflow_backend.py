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
import logging
from contextlib import contextmanager

import numpy as np

from agcheck.backends.wrt import TakesWrt, normalize_wrt, resolve_wrt
from agcheck.backends.host_checks import HostChecks, HostNamespace
from agcheck.backends.base import Backend, InputPart, OutputPart, Perturber, Trace
from agcheck.backends.batched_forms import BatchedForms
from agcheck.backends.tensorflow_loading import import_tensorflow

tf = import_tensorflow()  # triton first where it is installed (tensorflow_loading says why)

__all__ = ["TensorFlowBackend", "TfTrace", "TfPerturber", "BACKEND_CLASS", "owns"]

_NONE = tf.UnconnectedGradients.NONE


def owns(x) -> bool:
    """Is ``x`` a TensorFlow tensor or variable (``tf.is_tensor``)?"""
    return isinstance(x, (tf.Tensor, tf.Variable))


def _dtype(x):
    """``x``'s dtype as a ``tf.DType``."""
    return tf.as_dtype(x.dtype)


def _np_dtype(dtype):
    """A NumPy dtype for a ``tf.DType``, a NumPy dtype or anything ``np.dtype`` takes."""
    if isinstance(dtype, tf.DType):
        return np.dtype(dtype.as_numpy_dtype)
    return np.dtype(dtype)


def _is_inexact(x) -> bool:
    return owns(x) and (_dtype(x).is_floating or _dtype(x).is_complex)


def _is_complex_dtype(dtype) -> bool:
    return tf.as_dtype(dtype).is_complex


def _host(x):
    """``x`` as a NumPy array (TensorFlow objects are read; NumPy arrays pass through)."""
    if isinstance(x, np.ndarray):
        return x
    if owns(x):
        return np.asarray(x.numpy() if hasattr(x, "numpy") else x)  # 0-d: an array, not a scalar
    return np.asarray(x)


#: the core's algebra: NumPy on the host (the core computes on NumPy arrays, see the module)
_XP = HostNamespace(_host, lambda values, like, dtype: values, dtype=_np_dtype)


def _device(x) -> str | None:
    return getattr(x, "device", None) or None


def _to_tf(values, dtype=None, like=None):
    """``values`` (NumPy, TensorFlow or Python) as a ``tf.Tensor`` of ``dtype``, placed on
    ``like``'s device when it has one."""
    if isinstance(values, tf.Variable):
        values = values.read_value()
    if isinstance(values, tf.Tensor):
        if dtype is not None and values.dtype != tf.as_dtype(dtype):
            values = tf.cast(values, dtype)
        return values
    array = np.asarray(values)
    if dtype is not None:
        array = array.astype(_np_dtype(dtype), copy=False)
    device = _device(like) if like is not None else None
    if device:
        with tf.device(device):
            return tf.constant(array)
    return tf.constant(array)


class _DropNotes(logging.Filter):
    """Drops two of TensorFlow's log notes that concern how the backend calls it, not the
    user's function: ``tf.vectorized_map`` traces its function anew on every call by design
    ("triggered tf.function retracing"), and ``ForwardAccumulator`` notes that it expects
    floating primals when given a complex one ("watched primal must be floating") although
    its complex JVPs are right (``tests/test_tensorflow_backend.py`` compares them with
    torch's)."""

    NOTES = ("triggered tf.function retracing", "The dtype of the watched primal must be floating")

    def filter(self, record) -> bool:
        message = record.getMessage()
        return not any(note in message for note in self.NOTES)


@contextmanager
def _quiet_notes():
    """Around calls into ``tf.vectorized_map`` and ``ForwardAccumulator``: the notes of
    :class:`_DropNotes` are dropped (the filter is removed afterwards; nothing else of
    TensorFlow's logging changes)."""
    logger = logging.getLogger("tensorflow")
    quiet = _DropNotes()
    logger.addFilter(quiet)
    try:
        yield
    finally:
        logger.removeFilter(quiet)


class _BatchedForm:
    """One batched computation of a check as a ``tf.function`` of its stacked argument,
    traced once for every batch size.

    Called eagerly, ``tf.vectorized_map`` wraps its work in a new ``tf.function`` on every
    call, so ``fn`` is traced, converted by autograph (which leaves ``fn`` itself as it is:
    ``vectorized_map`` calls it from TensorFlow's own code) and vectorized anew for every
    batch: 15-60 ms for a small function, more than the loop of a small check costs, on
    every batch the engine computes. Here the vectorized computation ``body`` (a function
    of the stacked tensor that calls ``tf.vectorized_map``, which inside a ``tf.function``
    vectorizes in place) is traced once, without autograph, the batch dimension unknown."""

    def __init__(self, body, spec):
        self._body = body
        self._spec = spec
        self._concrete = None

    def __call__(self, stacked):
        if self._concrete is None:
            self._concrete = tf.function(self._body, autograph=False,
                                         input_signature=[self._spec]).get_concrete_function()
        return self._concrete(stacked)


def _stacked_spec(stacked, like):
    """The signature of a stack of ``like``-shaped tensors, any number of them."""
    return tf.TensorSpec((None, *tuple(int(s) for s in like.shape)), stacked.dtype)


def _with_replaced(args, positions, values) -> tuple:
    new = list(args)
    for p, v in zip(positions, values):
        new[p] = v
    return tuple(new)


class _Native:
    """What the core asks TensorFlow to differentiate, in TensorFlow's own arithmetic.

    The core's derived callables (:class:`InputPart`, :class:`OutputPart`) combine arrays
    with Python's operators; ``InputPart`` rebuilds a complex input as ``re + im * 1j``,
    which TensorFlow refuses (it does not promote a float tensor to complex). This backend
    unpacks them and rebuilds each with the same values through ``tf.complex`` /
    ``tf.math.real`` / ``tf.math.imag``.
    """

    def __init__(self, be):
        self.be = be

    def __call__(self, fn):
        be = self.be
        if isinstance(fn, InputPart):
            inner = self(fn.fn)
            positions, originals, part = fn.positions, fn.originals, fn.part

            def rebuilt(*args):
                new = list(args)
                for k in positions:
                    orig = originals[k]
                    moved = _to_tf(args[k], like=orig)
                    if part == "real":
                        new[k] = tf.complex(moved, tf.math.imag(_to_tf(orig)))
                    else:
                        new[k] = tf.complex(tf.math.real(_to_tf(orig)), moved)
                return be.as_tuple(inner(*new))

            return rebuilt
        if isinstance(fn, OutputPart):
            inner = self(fn.fn)
            take = tf.math.real if fn.part == "real" else tf.math.imag

            def part_of(*args):
                return tuple(take(o) if owns(o) and _dtype(o).is_complex else o for o in be.as_tuple(inner(*args)))

            return part_of
        return fn


class TfTrace(Trace):
    """``fn``'s outputs and the persistent ``tf.GradientTape`` that recorded them."""

    def __init__(self, outputs: tuple, tape, sources: list, be):
        super().__init__(outputs)
        self._tape = tape
        self._sources = sources
        self._be = be
        self._batched = {}  # output position -> its _BatchedForm of VJPs

    def _targets(self, output_positions, cotangents):
        targets, grads = [], []
        for p, c in zip(output_positions, cotangents):
            o = self.outputs[p]
            if not _is_inexact(o):
                continue
            targets.append(o)
            grads.append(_to_tf(c, _dtype(o), like=o) if c is not None else tf.zeros_like(o))
            if tuple(grads[-1].shape) != tuple(o.shape):
                grads[-1] = tf.reshape(grads[-1], tf.shape(o))
        return targets, grads

    def vjp(self, output_positions, cotangents) -> list:
        targets, grads = self._targets(output_positions, cotangents)
        if not targets:
            return [None] * len(self._sources)
        result = self._tape.gradient(targets, self._sources, output_gradients=grads, unconnected_gradients=_NONE)
        return [None if g is None else _host(tf.convert_to_tensor(g)) for g in result]

    def vjp_batched(self, output_position, stacked_cotangents) -> list:
        o = self.outputs[output_position]
        stacked = _to_tf(stacked_cotangents, _dtype(o), like=o)
        form = self._batched.get(output_position)
        if form is None:
            tape, sources = self._tape, self._sources

            def single(c):
                grads = tape.gradient(o, sources, output_gradients=c,
                                      unconnected_gradients=tf.UnconnectedGradients.ZERO)
                return [tf.convert_to_tensor(g) for g in grads]

            form = self._batched[output_position] = _BatchedForm(lambda s: tf.vectorized_map(single, s),
                                                                 _stacked_spec(stacked, o))
        try:
            with _quiet_notes():
                batched = form(stacked)
        except Exception as e:  # the backward's failure under vectorized_map: the check's finding
            raise RuntimeError(f"tf.vectorized_map of the gradient failed: {type(e).__name__}: {e}") from e
        return [_host(g) for g in batched]


class TfPerturber(Perturber):
    """Moves ``args[position]`` for one evaluation of ``fn``: a ``tf.Variable`` in place
    (assigned back bitwise in a ``finally``), a ``tf.Tensor`` by passing a moved copy.
    Returns the outputs as NumPy arrays (non-array outputs as they are)."""

    def __init__(self, args: tuple, position: int, be):
        self.args = tuple(args)
        self.position = position
        self.x = args[position]
        self.shape = tuple(int(s) for s in self.x.shape)
        self.numel = int(np.prod(self.shape, dtype=np.int64)) if self.shape else 1
        self._original = _host(self.x).copy()
        self._be = be
        self._native = _Native(be)

    def index(self, flat: int) -> tuple:
        return tuple(int(i) for i in np.unravel_index(flat, self.shape)) if self.shape else ()

    def _evaluate(self, fn, moved: np.ndarray) -> tuple:
        fn = self._native(fn)
        x = self.x
        if isinstance(x, tf.Variable):
            x.assign(moved)
            try:
                outs = self._be.as_tuple(fn(*self.args))
                return tuple(_host(o) if owns(o) else o for o in outs)
            finally:
                x.assign(self._original)
        value = _to_tf(moved, like=x)
        outs = self._be.as_tuple(fn(*_with_replaced(self.args, [self.position], [value])))
        return tuple(_host(o) if owns(o) else o for o in outs)

    def evaluate_element(self, fn, flat, step, sign) -> tuple:
        moved = self._original.copy()
        view = moved.reshape(-1)
        # the same arithmetic as torch's in-place move: x[idx] - step, x[idx] + step
        view[flat] = view[flat] - step if sign < 0 else view[flat] + step
        return self._evaluate(fn, moved)

    def evaluate_direction(self, fn, step, sign) -> tuple:
        step = _host(step)
        moved = self._original - step if sign < 0 else self._original + step
        return self._evaluate(fn, moved.astype(self._original.dtype, copy=False).reshape(self._original.shape))


class TensorFlowBackend(BatchedForms, HostChecks, TakesWrt, Backend):
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

    def _form(self, key, held: tuple, body, spec) -> _BatchedForm:
        """The batched form ``key`` of this check, traced on its first use: ``held`` (the
        function and the arguments that ``body`` closes over) must be the very objects it
        was made with, else it is made anew. Forms live as long as the check's backend (one
        check): a function that reads values it does not take as arguments is traced anew
        by the next check."""
        entry = self._forms.get(key)
        if entry is not None and len(entry[0]) == len(held) and all(a is b for a, b in zip(entry[0], held)):
            return entry[1]
        form = _BatchedForm(body, spec)
        self._forms[key] = (held, form)
        return form

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

    def _jvp_stack(self, fn, args, positions, j, stacked):
        """``tf.vectorized_map`` of the JVP along each of ``stacked`` (tangents of
        ``args[positions[j]]``, the others zero): stacked tangents of every array output."""
        x = args[positions[j]]
        stacked = _to_tf(stacked, _dtype(x), like=x)
        native = self._native(fn)

        def single(t):
            primals = [args[p] for p in positions]
            tangents = [t if i == j else tf.zeros_like(_to_tf(args[p])) for i, p in enumerate(positions)]
            with tf.autodiff.ForwardAccumulator(primals, tangents) as acc:
                outs = self.as_tuple(native(*args))
            return [acc.jvp(o, unconnected_gradients=tf.UnconnectedGradients.ZERO)
                    for o in outs if _is_inexact(o)]

        form = self._form(("jvp", id(fn), tuple(positions), j), (fn, *args),
                          lambda s: tf.vectorized_map(single, s), _stacked_spec(stacked, x))
        try:
            with _quiet_notes():
                return [_host(r) for r in form(stacked)]
        except Exception as e:  # fn or its derivative under vectorized_map: the check's finding
            raise RuntimeError(
                f"tf.vectorized_map of the forward-mode derivative failed: {type(e).__name__}: {e}") from e

    def jvp_batched(self, fn, args, position, stacked_tangents) -> tuple:
        return tuple(self._jvp_stack(fn, args, [position], 0, stacked_tangents))

    def vjp_with_undefined_outputs(self, fn, args, checked, undefined, trace=None) -> list:
        # TensorFlow has no undefined output gradients: an output nobody differentiates
        # gets zero output_gradients (that is what a tf.custom_gradient receives), so every
        # output is back-propagated with zeros; unconnected inputs give None (undefined)
        trace = trace if trace is not None else self.trace(fn, args, checked)
        positions = [k for k, o in enumerate(trace.outputs) if _is_inexact(o)]
        return trace.vjp(positions, [None] * len(positions))

    # -- batched forms (the batched engine) ---------------------------------------------
    def evaluate_batch(self, fn, args, position, stacked):
        """``fn`` evaluated with ``args[position]`` replaced by each of ``stacked``
        (``tf.vectorized_map``); per output, the stacked results as NumPy arrays."""
        x = args[position]
        stacked = _to_tf(stacked, _dtype(x), like=x)
        native = self._native(fn)

        def at(value):
            return tuple(self.as_tuple(native(*_with_replaced(args, [position], [value]))))

        form = self._form(("evaluate", id(fn), position), (fn, *args), lambda s: tf.vectorized_map(at, s),
                          _stacked_spec(stacked, x))
        with _quiet_notes():
            return tuple(_host(o) for o in form(stacked))

    def element_moves(self, x, flat, step, sign):
        """Copies of ``x`` (NumPy), the ``b``-th with element ``flat[b]`` moved by
        ``sign * step``, computed as the perturber computes it (``x[k] - step``)."""
        base = _host(x).reshape(-1)
        index = np.asarray(flat, dtype=np.int64)
        moved = np.repeat(base[None, :], len(flat), axis=0)
        entries = base[index]
        moved[np.arange(len(flat)), index] = entries - step if sign < 0 else entries + step
        return moved.reshape(len(flat), *tuple(int(s) for s in x.shape))

    def one_hots(self, like, flat):
        n = self.numel(like)
        z = np.zeros((len(flat), n), dtype=_np_dtype(self._kind(like)))
        z[np.arange(len(flat)), np.asarray(flat, dtype=np.int64)] = 1
        return z.reshape(len(flat), *tuple(int(s) for s in like.shape))

    def jvp_rows(self, fn, args, checked, j, flat):
        return self.jvp_along(fn, args, checked, j, self.one_hots(args[checked[j]], flat))

    def jvp_along(self, fn, args, checked, j, stacked):
        rows = self._jvp_stack(fn, args, list(checked), j, stacked)
        b = int(stacked.shape[0])
        return [r.reshape(b, -1) for r in rows]

    # -- second order -----------------------------------------------------------------
    def random_cotangent(self, like, generator, noncontiguous):
        """Uniform values in [-1, 1) shaped like ``like`` (float64 for non-floating
        outputs), as a ``tf.Tensor``; ``noncontiguous`` has no meaning for TensorFlow's
        tensors (no strides) and is ignored."""
        kind = self._kind(like) if self.is_floating_or_complex(like) else tf.float64
        shape = tuple(int(s) for s in like.shape)
        real = kind.real_dtype
        values = generator.uniform(shape, minval=-1.0, maxval=1.0, dtype=tf.float64)
        if kind.is_complex:
            values = tf.complex(values, generator.uniform(shape, minval=-1.0, maxval=1.0, dtype=tf.float64))
            return tf.cast(values, kind)
        return tf.cast(values, real)

    def differentiable_vjp(self, fn, n_inputs, input_positions, cotangent_positions, evaluated=None,
                           few_calls=False, evaluated_seconds=None):
        """The VJP of ``fn`` as a function of ``(*inputs, *cotangents)``, computed with a
        tape inside the caller's tapes (and forward accumulators), so that it can be
        differentiated again; inputs with an unconnected gradient are left out, as
        torch leaves out undefined ones."""
        ordered = sorted(set(input_positions))
        native = self._native

        def vjp_of_fn(*args):
            primals, cotangents = args[:n_inputs], args[n_inputs:]
            sources = [primals[k] for k in ordered]
            with tf.GradientTape(watch_accessed_variables=False) as tape:
                for s in sources:
                    tape.watch(s)
                outs = [o for o in self.as_tuple(native(fn)(*primals)) if _is_inexact(o)]
            grads = [_to_tf(c, _dtype(o), like=o) for c, o in zip(cotangents, outs)]
            result = tape.gradient(outs, sources, output_gradients=grads, unconnected_gradients=_NONE)
            return tuple(tf.convert_to_tensor(g) for g in result if g is not None)

        return vjp_of_fn

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

    def vjp_of_vjp(self, fn, args, checked, output, cotangent, gradient_cotangents) -> dict:
        """Second derivatives through nested ``tf.GradientTape``s: the VJP of output
        ``output`` with ``cotangent``, computed inside a persistent outer tape, then the
        VJP of each gradient with each of ``gradient_cotangents``. TensorFlow's complex
        convention is torch's at both levels, so nothing is mapped; an unconnected
        derivative is zeros."""
        fn = self._native(fn)
        sources = [args[p] for p in checked]
        shapes = [tuple(int(s) for s in x.shape) for x in sources]
        sizes = [int(np.prod(s, dtype=np.int64)) if s else 1 for s in shapes]
        dtypes = [_np_dtype(_dtype(x)) for x in sources]
        with tf.GradientTape(persistent=True, watch_accessed_variables=False) as outer:
            for x in sources:
                outer.watch(x)
            with tf.GradientTape(watch_accessed_variables=False) as inner:
                for x in sources:
                    inner.watch(x)
                out = self.as_tuple(fn(*args))[output]
            if _is_inexact(out):
                w = _to_tf(np.asarray(cotangent), _dtype(out), like=out)
                grads = inner.gradient(out, sources, output_gradients=tf.reshape(w, tf.shape(out)),
                                       unconnected_gradients=_NONE)
            else:
                grads = [None] * len(sources)
        result = {}
        for j1, g in enumerate(grads):
            for j2, x2 in enumerate(sources):
                rows = []
                for c in gradient_cotangents[j1]:
                    h = None
                    if g is not None:
                        c = _to_tf(np.asarray(c).reshape(shapes[j1]), g.dtype, like=g)
                        h = outer.gradient(g, x2, output_gradients=c, unconnected_gradients=_NONE)
                    rows.append(np.zeros(sizes[j2], dtype=dtypes[j2]) if h is None
                                else _host(tf.convert_to_tensor(h)).reshape(-1))
                result[(j1, j2)] = np.stack(rows, 0) if rows else np.zeros((0, sizes[j2]), dtypes[j2])
        del outer
        return result

    def compiled(self, fn):
        """``fn`` itself: TensorFlow 2 runs eagerly unless the user wraps a function in
        ``tf.function`` (which the backend then checks as it is); derivatives are the
        same either way."""
        return fn


BACKEND_CLASS = TensorFlowBackend
