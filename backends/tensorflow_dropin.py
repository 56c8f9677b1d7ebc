"""``tf.test.compute_gradient`` on agcheck: the same arguments, return layout and numbers,
computed with agcheck's TensorFlow backend. :func:`agcheck.patch_tensorflow`
(``agcheck.frontends.dropin``) installs :func:`dropin_compute_gradient` in its place.

What TensorFlow's ``compute_gradient(f, x, delta=None)`` returns, and so what
:func:`compute_gradient` returns: a tuple ``(theoretical, numerical)`` of tuples of 2-D
NumPy arrays, one per argument in ``x``, of shape ``(y_size, x_size)`` (rows: the
elements of ``y = f(*x)``, columns: those of the argument; a complex number counts as two
reals, its real part first) and of the argument's real dtype. Row ``r`` of
``theoretical`` is the gradient of ``y`` with the one-hot cotangent ``r``; column ``c``
of ``numerical`` is ``(f(x + delta e_c) - f(x - delta e_c)) / (2 delta)``, the element
moved in the argument's own dtype and the quotient taken in ``y``'s (``delta``:
``1/1024`` by default).

How agcheck computes them (:class:`Problem`; TensorFlow calls ``f`` once more for every
row, and twice for every argument entry):

* in *stacked copies*: ``f`` called with copies of the arguments stacked along a new first
  axis, which TensorFlow's operations broadcast over (a function written for ``...``
  shapes takes the stack as it is, eagerly, nothing traced): every moved copy of an
  argument in one call, every gradient row in one backward pass of tiled copies with
  stacked one-hot cotangents. Used only where the copies compared with plain calls give
  their very bits (:meth:`Problem._in_stacks`);
* otherwise *vectorized*, from :data:`BATCHED_EVALUATIONS` evaluations (or
  :data:`BATCHED_ROWS` rows) on: ``tf.vectorized_map`` of ``f`` of real views
  (:meth:`TensorFlowBackend.evaluate_batch`, ``TfTrace.vjp_batched``), which traces ``f``
  once per call (15-60 ms for a small function: the cost of 30 to 60 plain calls);
* otherwise *one at a time*, TensorFlow's arithmetic: one element move per evaluation, one
  ``tape.gradient`` per row from a single evaluation of ``f`` under a persistent tape.

A stacked or vectorized value may round differently from a plain call's by an ulp; where the
two Jacobians differ, their stacked or vectorized entries are computed again one at a time,
so that a difference a suite sees is TensorFlow's arithmetic.

After each call the two Jacobians are compared at tolerances by dtype
(:data:`WARN_TOLERANCES`); where they differ, a warning on the ``agcheck.tensorflow``
logger names the largest difference, and :func:`report` gives agcheck's failure report of
the call.
"""
from __future__ import annotations

import collections
import importlib
import inspect
import logging
import weakref

import numpy as np

from agcheck.backends.registry import get_backend
from agcheck.backends.quiet import ignoring
from agcheck.backends.tensorflow_backend import tf
from agcheck.backends.tensorflow_jacobians import (
    BATCHED_EVALUATIONS,
    BATCHED_ROWS,
    HALF_TOLERANCES,
    WARN_TOLERANCES,
    Problem,
    tolerances_of,
)

__all__ = ["compute_gradient", "dropin_compute_gradient", "report", "targets", "BATCHED_EVALUATIONS",
           "BATCHED_ROWS", "WARN_TOLERANCES"]

LOG = logging.getLogger("agcheck.tensorflow")

#: the module of ``tf.test.compute_gradient`` (``tf.compat.v1.test.compute_gradient`` is
#: another function, of TensorFlow 1's graphs, and is not routed)
_MODULE = importlib.import_module("tensorflow.python.ops.gradient_checker_v2")

#: TensorFlow's step when ``delta`` is not given
DEFAULT_DELTA = 1.0 / 1024
#: the dtypes TensorFlow's checker accepts, for the arguments and for ``f``'s value
_ALLOWED = (tf.float16, tf.bfloat16, tf.float32, tf.float64, tf.complex64, tf.complex128)

#: how many recent calls :func:`report` can explain
RECENT_CALLS = 8


# -- one call ---------------------------------------------------------------------------------

class _Call:
    """One ``compute_gradient`` call: ``f``, its arguments as tensors, the step, and what the
    comparison of its Jacobians found (``differs``: a sentence, or ``None``)."""

    def __init__(self, f, xs, delta, y_shape):
        self.f, self.xs, self.delta, self.y_shape = f, xs, delta, y_shape
        self.differs = None
        self.tolerances = HALF_TOLERANCES
        self._key = None

    def keep(self, result) -> None:
        arrays = [a for part in result for a in part]
        if arrays:
            self._key = weakref.ref(arrays[0])

    def returned(self, result) -> bool:
        try:
            first = result[0][0]
        except (TypeError, IndexError, KeyError):
            return False
        return self._key is not None and self._key() is first


_RECENT: "collections.deque[_Call]" = collections.deque(maxlen=RECENT_CALLS)


def compute_gradient(f, x, delta=None):
    """``tf.test.compute_gradient`` computed by agcheck: the theoretical and numerical
    Jacobians of ``f`` at the arguments ``x``.

    Parameters
    ----------
    f : callable
        Takes ``len(x)`` tensors, returns one floating or complex tensor ``y``.
    x : list or tuple
        The arguments, each convertible to a tensor; every one is differentiated.
    delta : float, optional
        The central difference's step (default ``1/1024``).

    Returns
    -------
    tuple
        ``(theoretical, numerical)``, each a tuple of 2-D NumPy arrays, one per argument,
        of shape ``(y_size, x_size)`` (a complex number counts as two reals) and of the
        argument's real dtype: TensorFlow's layout.

    Raises
    ------
    ValueError
        ``x`` is not a list or tuple (TensorFlow's message).
    AssertionError
        An argument or ``y`` is not floating or complex (TensorFlow's message).
    """
    if not isinstance(x, (list, tuple)):
        raise ValueError("`x` must be a list or tuple of values convertible to a Tensor "
                         "(arguments to `f`), not a %s" % type(x))
    if delta is None:
        delta = DEFAULT_DELTA
    xs = [tf.convert_to_tensor(v) for v in x]
    y = f(*xs)
    y_shape, y_dtype = y.shape, tf.as_dtype(y.dtype)
    for i, xi in enumerate(xs):
        if xi.dtype.base_dtype not in _ALLOWED:
            raise AssertionError("Cannot compute gradient for unsupported type %s of argument %s" % (xi.dtype.name, i))
        if y_dtype.base_dtype not in _ALLOWED:
            raise AssertionError("Cannot compute gradient for unsupported type %s of y" % y_dtype.name)
    call = _Call(f, xs, delta, y_shape)
    # a fresh backend: the forms it traces live for this call only
    result = Problem(f, xs, y_shape, y_dtype, delta, get_backend("tensorflow")).jacobians()
    call.keep(result)
    _compare(call, result, y_dtype)
    _RECENT.append(call)
    return result


def _element(index: int, shape, is_complex: bool) -> str:
    """Where entry ``index`` of a flattened real view lies, as ``(i, j)`` (and which part of
    a complex element)."""
    shape = tuple(int(s) for s in shape)
    if is_complex:
        element, part = divmod(index, 2)
        where = np.unravel_index(element, shape) if shape else ()
        return f"{tuple(int(i) for i in where)} {'real' if part == 0 else 'imaginary'} part"
    where = np.unravel_index(index, shape) if shape else ()
    return str(tuple(int(i) for i in where))


def _compare(call, result, y_dtype) -> None:
    """Note (and log) where the theoretical and numerical Jacobians differ beyond the
    tolerances of their dtypes."""
    theoretical, numerical = result
    tolerances = tolerances_of(y_dtype, *(xi.dtype for xi in call.xs))
    if tolerances is None:
        return
    atol, rtol = call.tolerances = tolerances
    for i, (t, n) in enumerate(zip(theoretical, numerical)):
        if not t.size:
            continue
        t64, n64 = t.astype(np.float64), n.astype(np.float64)
        with np.errstate(invalid="ignore"):
            gap = np.abs(t64 - n64)
            bad = ~(gap <= atol + rtol * np.abs(n64))
        count = int(np.count_nonzero(bad))
        if not count:
            continue
        worst = np.where(bad, np.nan_to_num(gap, nan=np.inf), -1.0)
        row, col = np.unravel_index(int(np.argmax(worst)), t.shape)
        xi = call.xs[i]
        call.differs = (
            f"the theoretical and numerical Jacobians of argument {i} differ beyond atol={atol:g}, rtol={rtol:g} "
            f"in {count} of {t.size} entries; the largest difference at row {row} (value element "
            f"{_element(row, call.y_shape, y_dtype.is_complex)}), column {col} (argument element "
            f"{_element(col, xi.shape, xi.dtype.is_complex)}): theoretical {float(t[row, col]):.6g}, numerical "
            f"{float(n[row, col]):.6g}")
        LOG.warning("tf.test.compute_gradient of %s: %s. agcheck's report of this call: "
                    "agcheck.frontends.dropin.tensorflow_report()", _name(call.f), call.differs)
        return


def _name(f) -> str:
    return getattr(f, "__qualname__", None) or getattr(f, "__name__", None) or type(f).__name__


def report(result=None, *, atol=None, rtol=None):
    """agcheck's failure report of a recent ``compute_gradient`` call.

    Parameters
    ----------
    result : tuple, optional
        What the call returned (one of the last :data:`RECENT_CALLS`); by default the
        latest call.
    atol, rtol : float, optional
        The tolerances of the check; by default those of the comparison after the call
        (:data:`WARN_TOLERANCES` by dtype).

    Returns
    -------
    FailureReport or None
        The report of :func:`agcheck.gradcheck` on the call's ``f``, arguments and step
        (``eps=delta``), or ``None`` where that check passes.

    Raises
    ------
    LookupError
        No such call was routed to agcheck.
    """
    call = _find(result)
    from agcheck.backends.dropin_checkers import gradcheck
    from agcheck.errors import GradcheckError

    default_atol, default_rtol = call.tolerances
    with ignoring(r"Input #\d+ requires gradient and is not a double precision"):
        try:
            gradcheck(call.f, tuple(call.xs), backend="tensorflow", eps=call.delta,
                      atol=default_atol if atol is None else atol, rtol=default_rtol if rtol is None else rtol)
        except GradcheckError as error:
            return error.report
    return None


def _find(result) -> _Call:
    calls = list(_RECENT)
    if result is None:
        if not calls:
            raise LookupError("no tf.test.compute_gradient call has gone through agcheck yet")
        return calls[-1]
    for call in reversed(calls):
        if call.returned(result):
            return call
    raise LookupError(f"this result is not one of the last {RECENT_CALLS} tf.test.compute_gradient calls "
                      "that went through agcheck")


def differs(result) -> bool:
    """Whether the call that returned ``result`` found its two Jacobians different."""
    try:
        return _find(result).differs is not None
    except LookupError:
        return False


# -- the drop-in --------------------------------------------------------------------------------

#: called as ``observer(kind, check, fn, inputs, kwargs)`` when set (see agcheck.frontends.dropin)
observer = None


def dropin_compute_gradient(f, x, delta=None):
    """agcheck's :func:`compute_gradient` in the place of ``tf.test.compute_gradient``."""
    __tracebackhide__ = True
    if observer is None:
        return compute_gradient(f, x, delta)
    return observer("compute_gradient", compute_gradient, f, x, {"delta": delta})


dropin_compute_gradient.agcheck_dropin = "tensorflow"
_ORIGINAL = getattr(_MODULE.compute_gradient, "agcheck_original", _MODULE.compute_gradient)
dropin_compute_gradient.agcheck_original = _ORIGINAL
try:
    dropin_compute_gradient.__signature__ = inspect.signature(_ORIGINAL)
except (TypeError, ValueError):  # pragma: no cover
    pass


def targets() -> list:
    """``(original, replacement)``: every module attribute bound to TensorFlow's function
    (``tf.test``, ``tf.compat.v2.test``, ``gradient_checker_v2``, names imported from them)
    is rebound while the patch is active."""
    return [(_ORIGINAL, dropin_compute_gradient)]


def ensure_bound_modules() -> None:
    """Import the modules that hold TensorFlow's function, so that patching reaches them."""
    importlib.import_module("tensorflow.python.ops.gradient_checker_v2")


def failure_types() -> tuple:
    """``compute_gradient`` raises no failure: the suite compares what it returns."""
    return ()


def failed(result) -> bool:
    """A call counts as failed when its two Jacobians differ (:func:`differs`)."""
    return differs(result)
