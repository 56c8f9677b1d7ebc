"""``jax.test_util.check_grads`` on agcheck: the same checks, tolerances and verdicts, and
on a failure agcheck's report of the failing level in the ``AssertionError``.

What JAX's ``check_grads(f, args, order, modes, atol, rtol, eps)`` checks, and so what
:func:`check_grads` checks (same random directions, same finite differences):

* ``"fwd"``: ``jax.jvp`` of ``f`` along one random tangent (``numpy.random.RandomState(0)``,
  standard normal per leaf) against the central difference ``(f(x + eps t) - f(x - eps
  t)) / (2 eps)``, and the primal output against ``f(x)``;
* ``"rev"``: the VJP against that numerical JVP through the inner products
  ``<t, J^H c>`` and ``<J t, c>`` with a random cotangent ``c`` (the same generator,
  continued);
* ``"lin"``: like ``"fwd"`` with the JVP from ``jax.linearize``;
* ``order > 1``: the same checks of the JVP (as a function of primals and tangents) and of
  ``x -> vjp(f, x)(f(x))``, recursively.

Unlike JAX's, the checks of one level share ``f(*args)`` and the central difference along
their (identical) first tangent, computed once, and the next level on the ``"rev"`` branch
takes its ``f(*args)`` from the ``"rev"`` check's own ``jax.vjp`` (:class:`_LevelEvaluations`).

Tolerances default per dtype (JAX's gradient tolerances: float32 ``2e-3``, float64
``1e-5``, ...); ``atol``/``rtol`` may be numbers or dicts by dtype. Comparisons scale
``atol`` and ``rtol`` by the size of the compared arrays, as JAX's do.

A failure raises JAX's ``AssertionError`` message followed by agcheck's account of the
failing level: by default from the arrays the check compared
(:mod:`agcheck.backends.jax_direction_account`, no further calls of ``f``), with
``account="full"`` from the level's full Jacobians (slow mode, element by element).

``full=True`` (beyond JAX) additionally compares full Jacobians of every level with
:func:`agcheck.gradcheck` / :func:`agcheck.gradgradcheck` (slow mode, JAX backend).
"""
from __future__ import annotations

import importlib
import operator
from functools import partial

import jax
import numpy as np

from agcheck.backends.quiet import ignoring
from agcheck.backends.jax_tolerances import (NARROW_INTS, PRECISION_WARNING, UPCAST, gradient_tolerance,
                                             is_py_scalar, leaf_dtype, tol_for)
from agcheck.backends.jax_direction_account import Evidence, direction_account, inner_product, same_leaves

__all__ = ["check_grads", "CheckGradsError", "DEFAULT_EPS", "gradient_tolerance"]

#: JAX's default finite-difference step for check_grads
DEFAULT_EPS = 1e-4

# -- leaf arithmetic (NumPy, as the reference does it) -----------------------------------------

def _keeping_type(op):
    def apply(*leaves):
        value = np.array(op(*leaves), dtype=leaf_dtype(leaves[0]))
        return value.item() if all(is_py_scalar(v) for v in leaves) else value
    return apply


def _tree(op):
    return partial(jax.tree_util.tree_map, op)


_add = _tree(_keeping_type(operator.add))
_sub = _tree(_keeping_type(operator.sub))
_conj = _tree(_keeping_type(np.conj))


def _difference(a, b):
    dtype = leaf_dtype(a)
    with np.errstate(invalid="ignore"):  # inf - inf counts as no difference
        return np.where(np.equal(a, b), np.array(0, dtype), np.subtract(a, b, dtype=dtype))


def _scale(tree, factor):
    def one(x):
        dtype = leaf_dtype(x)
        value = np.multiply(x, np.array(factor, dtype=dtype), dtype=dtype)
        return value.item() if is_py_scalar(x) else value
    return jax.tree_util.tree_map(one, tree)


def _random_like(rng, x):
    dtype = leaf_dtype(x)
    shape = np.shape(x)

    def normal():
        return np.asarray(rng.randn(*shape), dtype=dtype)

    value = normal() + dtype.type(1j) * normal() if np.issubdtype(dtype, np.complexfloating) else normal()
    return value.item() if is_py_scalar(x) else value


def _central_difference(f, primals, tangents, eps):
    step = _scale(tangents, eps)
    forward = f(*_add(primals, step))
    backward = f(*_sub(primals, step))
    return _scale(jax.tree_util.tree_map(_difference, forward, backward), 0.5 / eps)


# -- comparisons ------------------------------------------------------------------------------

def _leaf_tolerances(a, b, atol, rtol) -> tuple:
    """``(atol, rtol)`` for comparing the arrays ``a`` and ``b``: the larger of their dtypes'
    tolerances, scaled by the arrays' size, as JAX's check scales them."""
    return (max(tol_for(a.dtype, atol), tol_for(b.dtype, atol)) * a.size,
            max(tol_for(a.dtype, rtol), tol_for(b.dtype, rtol)) * b.size)


def _close_leaf(a, b, atol, rtol, err_msg):
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape:
        raise AssertionError()  # JAX's bare assert: no message (pytest would rewrite an assert statement)
    abs_tol, rel_tol = _leaf_tolerances(a, b, atol, rtol)
    float0 = np.dtype(jax.dtypes.float0)
    if a.dtype == float0 and b.dtype == float0:
        np.testing.assert_array_equal(a, b, err_msg=err_msg)
        return
    a, b = (x.astype(np.float32) if x.dtype in UPCAST else
            x.astype(NARROW_INTS[x.dtype]) if x.dtype in NARROW_INTS else x for x in (a, b))
    kw = {}
    if abs_tol:
        kw["atol"] = abs_tol
    if rel_tol:
        kw["rtol"] = rel_tol
    with np.errstate(invalid="ignore"):
        np.testing.assert_allclose(a, b, err_msg=err_msg, **kw)


def _close(xs, ys, atol, rtol, err_msg):
    jax.tree_util.tree_map(partial(_close_leaf, atol=atol, rtol=rtol, err_msg=err_msg), xs, ys)


def _same_dtypes(xs, ys):
    x64 = bool(jax.config.jax_enable_x64)

    def one(x, y):
        dx, dy = leaf_dtype(x), leaf_dtype(y)
        if not x64:
            dx, dy = jax.dtypes.canonicalize_dtype(dx), jax.dtypes.canonicalize_dtype(dy)
        if dx != dy:
            raise AssertionError()  # JAX's bare assert, as above
    jax.tree_util.tree_map(one, xs, ys)


def _label(prefix, err_msg):
    return f"{err_msg} {prefix}" if err_msg else prefix


# -- one level --------------------------------------------------------------------------------

class _LevelEvaluations:
    """The evaluations of ``f`` that the checks of one level share: ``f(*args)``, and the
    central difference along a tangent (every check of a level draws the same first
    tangent from ``RandomState(0)``, so the ``"rev"`` and ``"lin"`` checks reuse what the
    ``"fwd"`` check computed: three calls of ``f`` fewer per level, same numbers). Each is
    computed where a check first needs it, in that check's order; ``value``, where given,
    computes ``f(*args)`` from the level above's work (:meth:`value_of_vjp_at_output`)."""

    def __init__(self, f, args, eps, value=None):
        self.f, self.args, self.eps = f, args, eps
        self._value = None  # (f(*args),) once computed
        self._computes_value = value  # where given, computes f(*args) from a parent's work
        self._difference = None  # (tangent, its central difference) once computed
        self.vjp = None  # (value, pullback) of jax.vjp(f, *args), once the "rev" check made it
        self.forward = None  # (tangent, JVP along it) of the passing "fwd" check

    def value(self):
        if self._value is None:
            compute, self._computes_value = self._computes_value, None
            self._value = (compute() if compute is not None else self.f(*self.args),)
        return self._value[0]

    def value_of_vjp_at_output(self):
        """A function computing ``vjp(f, *args)`` applied to ``f(*args)``, the next level's
        ``f(*args)`` on the ``"rev"`` branch, from the ``"rev"`` check's own ``jax.vjp``
        (``None`` where that check did not run)."""
        if self.vjp is None:
            return None
        (value, pullback), self.vjp = self.vjp, None
        return lambda: pullback(value)

    def central_difference(self, tangent):
        if self._difference is None or not same_leaves(self._difference[0], tangent):
            self._difference = (tangent, _central_difference(self.f, self.args, tangent, self.eps))
        return self._difference[1]


def _check_jvp(shared, f_jvp, atol, rtol, err_msg, evidence):
    """JAX's JVP check of ``shared.f`` at ``shared.args`` (a :class:`_LevelEvaluations`);
    what it computes goes into ``evidence`` (an :class:`Evidence`) for a failure's account."""
    rng = np.random.RandomState(0)
    tangent = jax.tree_util.tree_map(partial(_random_like, rng), shared.args)
    evidence.tangent, evidence.differences = tangent, partial(_central_difference, shared.f, shared.args, tangent)
    value, tangent_out = f_jvp(shared.args, tangent)
    evidence.comparing("dtypes", value, tangent_out)
    _same_dtypes(value, tangent_out)
    expected_value = shared.value()
    evidence.comparing("dtypes", value, expected_value)
    _same_dtypes(value, expected_value)
    expected_tangent = shared.central_difference(tangent)
    evidence.comparing("primal", value, expected_value)
    _close(value, expected_value, atol, rtol, _label("primal", err_msg))
    evidence.comparing("tangent", tangent_out, expected_tangent)
    _close(tangent_out, expected_tangent, atol, rtol, _label("tangent", err_msg))
    shared.forward = (tangent, tangent_out)


def _check_vjp(shared, f_vjp, atol, rtol, err_msg, evidence):
    """JAX's VJP check of ``shared.f`` at ``shared.args`` (a :class:`_LevelEvaluations`);
    what it computes goes into ``evidence`` (an :class:`Evidence`) for a failure's account."""
    draw = partial(_random_like, np.random.RandomState(0))
    value, pullback = f_vjp(*shared.args)
    shared.vjp = (value, pullback)
    evidence.comparing("primal", value, shared.value())
    _close(value, shared.value(), atol, rtol, _label("primal", err_msg))
    tangent = jax.tree_util.tree_map(draw, shared.args)
    tangent_out = shared.central_difference(tangent)
    cotangent = jax.tree_util.tree_map(draw, value)
    pulled = _conj(pullback(_conj(cotangent)))
    evidence.tangent, evidence.cotangent, evidence.forward = tangent, cotangent, shared.forward
    evidence.differences = partial(_central_difference, shared.f, shared.args, tangent)
    projection, expected = inner_product(tangent, pulled), inner_product(tangent_out, cotangent)
    evidence.comparing("projection", projection, expected)
    _close(projection, expected, atol, rtol, _label("cotangent projection", err_msg))


def _jvp_by_linearize(f, primals, tangents):
    value, linear = jax.linearize(f, *primals)
    return value, linear(*tangents)


def _vjp_at_output(f):
    def vjp_of_f(*args):
        value, pullback = jax.vjp(f, *args)
        return pullback(value)
    return vjp_of_f


# -- errors and reports -----------------------------------------------------------------------

class CheckGradsError(AssertionError):
    """A failed :func:`agcheck.check_grads`: JAX's ``AssertionError`` message, then
    agcheck's account of the failing level. ``.level`` says which one (``"VJP of JVP"``,
    ...); ``.account`` is the account from the check's own evaluations
    (:class:`~agcheck.backends.jax_direction_account.DirectionAccount`, by default),
    ``.report`` agcheck's failure report of the level's full Jacobians (``account="full"``);
    the other is ``None``."""

    def __init__(self, message, *, report=None, level=None, account=None):
        super().__init__(message)
        self.report = report
        self.level = level
        self.account = account


#: agcheck's full-Jacobian account of a failing level is skipped above this many entries
REPORT_MAX_ENTRIES = 1_000_000


def _as_jax_arrays(args) -> tuple:
    """``args`` with NumPy leaves as (uncommitted) JAX arrays; ``jax.device_put`` compiles
    nothing, where ``jnp.asarray`` stages a copy compiled anew for every shape."""
    return tuple(jax.tree_util.tree_map(lambda v: jax.device_put(v) if isinstance(v, np.ndarray) else v, args))


def _agcheck_account(f, args, mode, atol, rtol, eps):
    """agcheck's slow-mode check of ``f`` at ``args`` in ``mode``: (text, report)."""
    from agcheck.backends.dropin_checkers import gradcheck
    from agcheck.errors import GradcheckError

    leaves = [x for x in jax.tree_util.tree_leaves(args) if hasattr(x, "dtype")
              and np.issubdtype(np.dtype(x.dtype), np.inexact)]
    if not leaves:
        return "agcheck: no floating point or complex inputs to compare full Jacobians for.", None
    n_in = sum(int(np.size(x)) for x in leaves)
    try:
        n_out = sum(int(np.size(o)) for o in jax.tree_util.tree_leaves(jax.eval_shape(f, *args)))
    except Exception:  # noqa: BLE001
        n_out = 1
    if n_in * n_out > REPORT_MAX_ENTRIES:
        return (f"agcheck: full Jacobians not compared ({n_in} x {n_out} entries is more than "
                f"{REPORT_MAX_ENTRIES:,}).", None)
    dtype = max((np.dtype(x.dtype) for x in leaves), key=lambda d: d.itemsize)
    a = tol_for(dtype, atol)
    r = tol_for(dtype, rtol)
    forward = mode in ("fwd", "lin")
    jargs = _as_jax_arrays(args)
    try:
        with ignoring(PRECISION_WARNING):  # JAX's checks run in any precision: no precision warnings
            gradcheck(f, jargs, backend="jax", eps=eps, atol=a, rtol=r, check_undefined_grad=False,
                      check_forward_ad=forward, check_backward_ad=not forward, engine="reference")
    except GradcheckError as error:
        return "agcheck (full Jacobians of this level, slow mode):\n" + str(error), getattr(error, "report", None)
    except Exception as error:  # noqa: BLE001 - the account is best effort
        return f"agcheck could not compare full Jacobians: {type(error).__name__}: {error}", None
    return (f"agcheck: the full Jacobians of this level agree (atol={a}, rtol={r}, eps={eps}); the random "
            "projection JAX's check compares failed, so the difference is small or concentrated in few "
            "entries, or the finite differences are inaccurate at this step."), None


def _input_elements(args) -> int:
    """The floating-point and complex input elements of a level (what a full account moves)."""
    return sum(int(np.size(x)) for x in jax.tree_util.tree_leaves(args)
               if np.issubdtype(leaf_dtype(x), np.inexact))


def _guarded(kind, f, args, atol, rtol, eps, level, run, account):
    """Run one check (``run(evidence)``); on a failure, re-raise JAX's ``AssertionError`` as
    a :class:`CheckGradsError` with agcheck's account of the level (``account``: ``"direction"``
    from the check's own evaluations, ``"full"`` from the level's full Jacobians)."""
    evidence = Evidence(kind)
    try:
        run(evidence)
    except CheckGradsError:
        raise
    except AssertionError as failure:
        message = str(failure).rstrip("\n")
        if account == "full":
            text, report = _agcheck_account(f, args, kind, atol, rtol, eps)
            raise CheckGradsError(f"{message}\n\n{text}", report=report, level=level) from failure
        try:
            explained = direction_account(evidence, level, partial(_leaf_tolerances, atol=atol, rtol=rtol),
                                          eps, _input_elements(args))
            text = explained.text
        except Exception as error:  # noqa: BLE001 - the account must never hide the failure
            explained, text = None, f"agcheck could not explain this failure: {type(error).__name__}: {error}"
        raise CheckGradsError(f"{message}\n\n{text}", level=level, account=explained) from failure


#: how a failure is explained: "direction" (the check's own evaluations) or "full"
ACCOUNTS = ("direction", "full")


def validate_account(account) -> None:
    """Raise ``ValueError`` unless ``account`` is one of :data:`ACCOUNTS`."""
    if account not in ACCOUNTS:
        raise ValueError(f"account must be one of {ACCOUNTS}, got {account!r}")


# -- the public check -------------------------------------------------------------------------

def check_grads(f, args, order, modes=("fwd", "rev"), atol=None, rtol=None, eps=None, *, full=False,
                account=None):
    """Check derivatives of ``f`` at ``args`` up to ``order`` as ``jax.test_util.check_grads``
    does (see the module docstring); ``full=True`` also compares full Jacobians.

    ``account`` says how a failure is explained: ``"direction"`` (the default) from the
    failing check's own evaluations, at no cost; ``"full"`` (the default with ``full=True``)
    by comparing the failing level's full Jacobians, about two evaluations of its function
    per input element."""
    if account is None:
        account = "full" if full else "direction"
    validate_account(account)
    args = tuple(args)
    eps = eps or DEFAULT_EPS
    atol_table = gradient_tolerance(atol)
    rtol_table = gradient_tolerance(rtol)

    def guarded(kind, f, args, name, run):
        _guarded(kind, f, args, atol_table, rtol_table, eps, name, run, account)

    def level(f, args, order, err_msg="", value=None):
        shared = _LevelEvaluations(f, args, eps, value)
        if "fwd" in modes:
            name = f"JVP of {err_msg}" if err_msg else "JVP"
            guarded("fwd", f, args, name,
                    lambda ev: _check_jvp(shared, partial(jax.jvp, f), atol_table, rtol_table, name, ev))
            if order > 1:
                level(partial(jax.jvp, f), (args, args), order - 1, name)
        if "rev" in modes:
            name = f"VJP of {err_msg}" if err_msg else "VJP"
            guarded("rev", f, args, name,
                    lambda ev: _check_vjp(shared, partial(jax.vjp, f), atol_table, rtol_table, name, ev))
            if order > 1:
                level(_vjp_at_output(f), args, order - 1, name, shared.value_of_vjp_at_output())
        if "lin" in modes:
            name = f"LIN of {err_msg}" if err_msg else "LIN"
            guarded("lin", f, args, name,
                    lambda ev: _check_jvp(shared, partial(_jvp_by_linearize, f), atol_table, rtol_table, name, ev))
            if order > 1:
                level(partial(_jvp_by_linearize, f), (args, args), order - 1, name)

    level(f, args, order)
    if full:
        _full_jacobians(f, args, order, modes, atol, rtol, eps)


def _full_jacobians(f, args, order, modes, atol, rtol, eps):
    """Full Jacobians of ``f`` (and of its VJPs up to ``order``) with agcheck, slow mode."""
    from agcheck.backends.dropin_checkers import gradcheck, gradgradcheck
    from agcheck.errors import GradcheckError

    leaves = [x for x in jax.tree_util.tree_leaves(args) if hasattr(x, "dtype")
              and np.issubdtype(np.dtype(x.dtype), np.inexact)]
    dtype = max((np.dtype(x.dtype) for x in leaves), key=lambda d: d.itemsize) if leaves else np.dtype(np.float64)
    a = tol_for(dtype, gradient_tolerance(atol))
    r = tol_for(dtype, gradient_tolerance(rtol))
    forward = "fwd" in modes or "lin" in modes
    reverse = "rev" in modes
    jargs = _as_jax_arrays(args)
    try:
        with ignoring(PRECISION_WARNING):  # JAX's checks run in any precision: no precision warnings
            gradcheck(f, jargs, backend="jax", eps=eps, atol=a, rtol=r, check_undefined_grad=False,
                      check_forward_ad=forward, check_backward_ad=reverse)
            if not reverse:
                return  # higher orders are checked through VJPs
            for k in range(2, order + 1):
                gradgradcheck(f, jargs, backend="jax", eps=eps, atol=a, rtol=r, check_undefined_grad=False,
                              check_fwd_over_rev=forward, check_rev_over_rev=True, order=k)
    except GradcheckError as error:
        raise CheckGradsError(f"full Jacobians (agcheck, slow mode) disagree:\n{error}",
                              report=getattr(error, "report", None), level="full") from error


# -- the drop-in ------------------------------------------------------------------------------

_MODULE = importlib.import_module("jax._src.public_test_util")

#: called as ``observer(kind, check, fn, inputs, kwargs)`` when set (see agcheck.frontends.dropin)
observer = None


#: agcheck's keywords added to every routed call (``patch_jax(account="full")``)
defaults: dict = {}


def dropin_check_grads(f, args, order, modes=("fwd", "rev"), atol=None, rtol=None, eps=None):
    """agcheck's :func:`check_grads` in the place of ``jax.test_util.check_grads``."""
    __tracebackhide__ = True
    kwargs = dict(defaults, order=order, modes=modes, atol=atol, rtol=rtol, eps=eps)
    if observer is None:
        return check_grads(f, args, **kwargs)
    return observer("check_grads", check_grads, f, args, kwargs)


dropin_check_grads.agcheck_dropin = "jax"
_ORIGINAL = getattr(_MODULE.check_grads, "agcheck_original", _MODULE.check_grads)
dropin_check_grads.agcheck_original = _ORIGINAL


def targets() -> list:
    return [(_ORIGINAL, dropin_check_grads)]


def ensure_bound_modules() -> None:
    importlib.import_module("jax.test_util")


def failure_types() -> tuple:
    return (AssertionError,)
