"""``agcheck.gradcheck``: which checks run, in which order, on which pieces of ``fn``."""
from __future__ import annotations

import contextlib
import difflib
import functools
from dataclasses import fields
from typing import Any, Callable, Iterator, Literal, TypeVar

from agcheck.backends.base import Backend
from agcheck.checks import batched_gradients, grad_output_scaling, jacobian, undefined_grads
from agcheck.core.capabilities import require_capabilities
from agcheck.core.piece import Piece
from agcheck.core.numpy_rng import numpy_rng_preserved
from agcheck.core.input_guard import InputGuard
from agcheck.core.problem import check_output_types, resolve_problem
from agcheck.core.run import CheckRun
from agcheck.core.wirtinger import input_part, output_part, split_inputs
from agcheck.errors import CheckInputError, OutputTypeError
from agcheck.options import GradcheckOptions, gradcheck_options
from agcheck.core.report_filling import complete_report
from agcheck.errors import GradcheckError
from agcheck.warn import warn_caller

__all__ = ["gradcheck", "OutputTypeError", "CostWarning"]


#: slow-mode checks with at least this many Jacobian entries warn with their size
COSTLY_JACOBIAN_ENTRIES = 250_000_000


class CostWarning(UserWarning):
    """A check about to run is very large (a slow-mode check of a big function)."""


F = TypeVar("F", bound=Callable[..., Any])


def takes_torchs_func(entry: F) -> F:
    """``entry``, also taking the checked function by torch's keyword ``func=``
    (``gradcheck(func=f, inputs=x)``, as torch's checkers are called)."""
    @functools.wraps(entry)
    def call(*args, **kwargs):
        if "func" in kwargs:
            if args or "fn" in kwargs:
                raise TypeError(f"{entry.__name__}() got the function twice: as fn and as func (torch's name for it)")
            kwargs["fn"] = kwargs.pop("func")
        return entry(*args, **kwargs)

    return call  # type: ignore[return-value]


@takes_torchs_func
def gradcheck(fn: Callable[..., Any], inputs: Any, *, backend: str | Backend | None = None,
              eps: float | Literal["auto"] = 1e-6, atol: float = 1e-5, rtol: float = 1e-3,
              raise_exception: bool = True, nondet_tol: float = 0.0, check_undefined_grad: bool = True,
              check_grad_dtypes: bool = False, check_batched_grad: bool = False,
              check_batched_forward_grad: bool = False, check_forward_ad: bool = False,
              check_backward_ad: bool = True, fast_mode: bool = False, masked: bool | None = None,
              engine: Literal["auto", "batched", "reference"] = "auto", memory_budget: int | None = None,
              stencil: Literal["central", "five-point"] = "central", progress: bool = False,
              fast_tolerance: Literal["torch", "probe"] = "torch", **backend_options: Any) -> bool:
    """Check analytical derivatives of ``fn`` against finite differences.

    Same keywords, defaults, verdicts and messages as ``torch.autograd.gradcheck``.

    Parameters
    ----------
    fn : callable
        Takes the members of ``inputs`` as positional arguments and returns an array or
        a tuple (or list) of arrays.
    inputs : array or tuple
        The arguments of ``fn``. Arrays that take part in the check are those the backend
        marks (torch: floating or complex tensors with ``requires_grad=True``); other
        members are passed through unchanged.
    backend : str or Backend, optional
        ``"torch"``, ... By default inferred from the arrays in ``inputs``.
    eps : float or "auto"
        Finite-difference step. ``"auto"`` (beyond torch) picks, per input, the step that
        balances truncation and rounding error for its precision and the stencil
        (``machine_eps ** (1/3)`` for central, ``** (1/5)`` for five-point differences).
    atol, rtol : float
        Tolerances: ``|analytical - numerical| <= atol + rtol * |numerical|``.
    raise_exception : bool
        Raise :class:`GradcheckError`, with its report, on a failed check (else return
        ``False``, and build no report).
    nondet_tol : float
        Tolerance for run-to-run differences of the backward (reentrancy).
    check_undefined_grad : bool
        Check that undefined output gradients (and input tangents) act as zeros.
    check_grad_dtypes : bool
        Check the dtypes of the computed gradients.
    check_batched_grad, check_batched_forward_grad : bool
        Check vmapped (batched) reverse / forward derivatives against unbatched ones.
    check_forward_ad, check_backward_ad : bool
        Check forward-mode / reverse-mode derivatives.
    fast_mode : bool
        Compare random projections ``v^T J u`` instead of full Jacobians.
    masked : bool or None
        For sparse inputs: compare only the specified elements.
    engine : {"auto", "batched", "reference"}
        Beyond torch. ``"batched"`` computes slow-mode Jacobians in batches (many
        evaluations per call, compared chunk by chunk) wherever that pays and hands any
        failure to the reference engine, so verdicts and messages are the reference's
        (a failure it confirmed on entries computed element by element comes with them,
        computed so wherever torch's message prints them).
        ``"auto"`` (default) first tries compressed differences: where each output
        element depends on at most one element of each input (elementwise, broadcast,
        indexing), every entry from ``O(log n)`` evaluations; where the analytical
        Jacobian's pattern is banded or blocked, input elements that never meet are
        moved together. Both are verified over several sign patterns, and anything
        else goes to the batched path (see docs/performance.md). ``"reference"`` runs
        torch's element-by-element algorithm only.
    memory_budget : int, optional
        Beyond torch. Bytes the batched engine may hold in Jacobians and batches
        (default 1 GiB); it recomputes rather than exceed it.
    stencil : {"central", "five-point"}
        Beyond torch. The finite-difference formula: torch's two-point central
        difference, or the fourth-order five-point stencil (more accurate for the same
        step; the recipe for float32 functions, see docs/accuracy.md).
    progress : bool
        Beyond torch. Show a progress bar (on stderr, when it is a terminal; needs
        ``rich``) while slow-mode Jacobians are computed. Quiet by default.
    fast_tolerance : {"torch", "probe"}
        Beyond torch, fast mode only. ``"torch"`` (default) carries ``atol`` over to a
        projection ``v^T J u`` as torch does, scaled by ``sum(u) * sum(v)``: it grows with
        the square root of the sizes, and for a large Jacobian that is mostly zeros
        (elementwise, banded) it exceeds the projection itself, so a wrong derivative can
        pass. ``"probe"`` scales it by the probes' norms instead (``atol`` itself, as for
        one entry): such bugs fail, at no extra cost; a dense Jacobian with finite-difference
        errors of one sign in every entry can then fail where slow mode passes. See
        docs/faq.md.
    **backend_options
        Keywords of the chosen backend (e.g. ``wrt=`` for JAX, ``vjp=``/``jvp=`` for
        NumPy; ``sparse_vjp=`` for torch). A misspelt keyword of gradcheck's is named.
        ``fn`` may also be given as ``func=``, torch's name for it.

    Returns
    -------
    bool
        ``True`` when every check passed; ``False`` on a failure with
        ``raise_exception=False``.

    Raises
    ------
    GradcheckError
        A check failed (a ``RuntimeError``).
    AssertionError, ValueError, RuntimeError, TypeError
        Invalid keyword combinations or inputs, as torch raises them.
    """
    refuse_misspelt("gradcheck", backend_options, GRADCHECK_KEYWORDS)
    opts = gradcheck_options(
        eps=eps, atol=atol, rtol=rtol, raise_exception=raise_exception, nondet_tol=nondet_tol,
        check_undefined_grad=check_undefined_grad, check_grad_dtypes=check_grad_dtypes,
        check_batched_grad=check_batched_grad, check_batched_forward_grad=check_batched_forward_grad,
        check_forward_ad=check_forward_ad, check_backward_ad=check_backward_ad,
        fast_mode=fast_mode, masked=masked, engine=engine, memory_budget=memory_budget,
        stencil=stencil, progress=progress, fast_tolerance=fast_tolerance,
    )
    run = prepared_run(fn, inputs, opts, backend, **backend_options)
    with checking(run, {"fn": fn, "inputs": inputs, "keywords": backend_options}) as verdict:
        all_checks(run, watch_calls=True)  # the checks' calls of fn: from here, not a frame below
    return verdict.passed


#: gradcheck's own keywords, for naming a misspelt one
GRADCHECK_KEYWORDS = ("fn", "inputs", "backend", "func", *(f.name for f in fields(GradcheckOptions)))
#: keywords of the bundled backends (the backend in use refuses those it does not take)
BACKEND_KEYWORDS = ("wrt", "vjp", "jvp", "convention", "sparse_vjp")


def refuse_misspelt(name: str, options: dict, keywords) -> None:
    """A ``TypeError`` naming an extra keyword that is a misspelling of one of ``keywords``
    (``atoll=`` -> "did you mean 'atol'?"); other extra keywords are the backend's to take
    or refuse."""
    for key in options:
        if key in BACKEND_KEYWORDS:
            continue
        close = difflib.get_close_matches(key, keywords, n=1, cutoff=0.75)
        if close:
            raise TypeError(f"{name}() got an unexpected keyword argument {key!r}; did you mean {close[0]!r}?")


def prepared_run(fn: Callable, inputs, opts: GradcheckOptions, backend=None, **backend_options) -> CheckRun:
    """The context of a gradcheck of ``fn`` at ``inputs`` with the keywords ``opts``: the
    backend resolved and able to run the checks asked for."""
    be, fn, args = resolve_problem(fn, inputs, backend, backend_options)
    require_capabilities(be, opts)
    return CheckRun(fn, args, be, opts)


class Verdict:
    """What :func:`checking` concludes: ``passed`` (False: a failure not raised)."""

    passed = True


@contextlib.contextmanager
def checking(run: CheckRun, subject: dict) -> Iterator[Verdict]:
    """Around the checks of ``run`` (:func:`all_checks`): the backend's and NumPy's random
    states kept, the inputs verified at the end (a changed input, not the derivative, is
    then to blame), a raised failure's report filled in (``subject``: the caller's check,
    as :func:`complete_report` names it) or, with ``raise_exception=False``, the failure
    turned into ``passed = False``. The checks run in the caller's frame, not below this
    one."""
    be, opts, verdict = run.be, run.opts, Verdict()
    try:
        with be.preserve_state(run.args), numpy_rng_preserved():
            try:
                yield verdict
            except BaseException as e:
                run.verify_inputs(cause=e)
                if isinstance(e, GradcheckError) and opts.raise_exception:
                    complete_report(e, be, opts, **subject)  # reports are filled in only for a raised failure
                    run.verify_inputs(cause=e)
                raise
            run.verify_inputs()
    except GradcheckError as e:
        if opts.raise_exception:
            be.adopt_error(e)  # torch: also torch.autograd.gradcheck.GradcheckError
            raise
        verdict.passed = False


# -- the order of the checks is torch's -------------------------------------------------
def all_checks(run: CheckRun, snapshots: dict | None = None, watch_calls: bool = False) -> None:
    """Run the checks the options ask for, in torch's order. ``snapshots``
    (``{position: snapshot}``, taken before a call of ``fn`` the caller made) stand for the
    check's own of those inputs, so that a change that call made is found too;
    ``watch_calls``: ``fn`` is the caller's own, its calls watched for in-place writes."""
    be, opts = run.be, run.opts
    try:
        run.checked = _validate_inputs(run)
        guard = run.guard = InputGuard(be, run.args, run.checked, snapshots)
        if watch_calls:
            run.fn = guard.watch(run.fn)
        trace = be.trace(run.fn, run.args, run.checked)
        guard.verify("the comparison of reverse-mode derivatives")
        diff = _differentiable(run, trace.outputs)
        be.validate_outputs([trace.outputs[k] for k in diff])
        if not opts.fast_mode:
            _warn_if_costly(run, trace.outputs)
        # real outputs (the common case) are compared from here: one frame less above fn
        top = Piece.of(be, run.fn, run.args, run.checked, trace)
        if opts.check_backward_ad and any(be.is_complex(o) for o in top.outputs):
            _complex_reverse_mode(run, top)
        elif opts.check_backward_ad:
            jacobian.check(run, top)
        guard.checkpoint("the comparison of forward-mode derivatives")
        if opts.check_forward_ad:
            if any(be.is_complex(a) for a in run.args if be.is_array(a)):
                forward = _complex_forward_mode(run)
            else:
                forward = [Piece.of(be, run.fn, run.args, run.checked, trace, forward=True)]
                jacobian.check(run, forward[0])
            for piece in forward if opts.check_undefined_grad else ():
                undefined_grads.check_forward(run, piece)
        run.rows.clear()
        _later_checks(run, top, guard)
    finally:
        run.rows.clear()  # not kept alive by a raised error's traceback
        run.progress.close()


def _later_checks(run: CheckRun, top: Piece, guard: InputGuard) -> None:
    """The batched-gradient, grad_output-scaling and undefined-gradient checks, after the
    Jacobians'."""
    opts = run.opts
    guard.checkpoint("the batched forward-mode check")
    if opts.check_batched_forward_grad:
        batched_gradients.check_forward(run, top)
    if not opts.check_backward_ad:
        return
    guard.checkpoint("the batched gradient check")
    if opts.check_batched_grad:
        batched_gradients.check_backward(run, top)
    guard.checkpoint("the check of grad_output scaling and undefined gradients")
    grad_output_scaling.check(run, top)
    if opts.check_undefined_grad:
        undefined_grads.check_backward(run, top)


def _warn_if_costly(run: CheckRun, outputs) -> None:
    be = run.be
    n_in = sum(be.numel(run.args[p]) for p in run.checked)
    n_out = sum(be.numel(o) for o in outputs if be.is_floating_or_complex(o))
    entries = n_in * n_out
    if entries >= COSTLY_JACOBIAN_ENTRIES:
        warn_caller(
            f"slow mode compares full Jacobians: {n_in:,} input elements x {n_out:,} output "
            f"elements = {entries:.2e} entries, each estimated by finite differences. This may "
            "take very long; fast_mode=True compares random projections v^T J u instead, at "
            "the cost of a few evaluations and backward passes.",
            CostWarning,
        )


def _validate_inputs(run: CheckRun) -> list:
    be = run.be
    checked = be.checked_positions(run.args)
    devices: dict[str, int] = {}
    for idx in checked if len(checked) > 1 else ():
        devices.setdefault(be.device_name(run.args[idx]), idx)
    if len(devices) > 1:
        listed = ", ".join(f"input {i} on {d}" for d, i in devices.items())
        raise CheckInputError(
            f"the inputs to differentiate are on different devices ({listed}); "
            "move them to one device before checking"
        )
    for idx in checked:
        x = run.args[idx]
        if not be.is_double_precision(x):
            warn_caller(
                f"Input #{idx} requires gradient and is not a double precision floating point "
                "or complex. Finite differences in lower precision are rarely accurate enough "
                "for the default tolerances; this check will likely fail."
            )
        be.validate_input(idx, x)
    if not checked:
        raise ValueError(be.no_checked_inputs_message)
    return checked


def _differentiable(run: CheckRun, outputs) -> list:
    be = run.be
    check_output_types(be, outputs)
    return [k for k, o in enumerate(outputs) if be.is_differentiable_output(o)]

# -- reverse and forward mode, with the complex split -------------------------------
def _complex_reverse_mode(run: CheckRun, top: Piece) -> None:
    be = run.be
    complex_outputs = [i for i, k in enumerate(top.diff) if be.is_complex(top.outputs[k])]
    for part in ("imag", "real"):  # torch's order, imaginary parts first
        fn = output_part(be, run.fn, part)
        trace = be.trace(fn, run.args, run.checked)
        jacobian.check(run, Piece.of(be, fn, run.args, run.checked, trace,
                                      complex_indices=complex_outputs, test_imag=part == "imag"))


def _complex_forward_mode(run: CheckRun) -> list:
    """The forward-mode comparison over complex inputs, imaginary parts first as torch
    orders them; the pieces compared."""
    be = run.be
    complex_inputs = [k for k, a in enumerate(run.args) if be.is_array(a) and be.is_complex(a)]
    pieces = []
    for part in ("imag", "real"):
        fn = input_part(be, run.fn, complex_inputs, run.args, part)
        args = split_inputs(be, run.args, complex_inputs, part)
        pieces.append(Piece.of(be, fn, args, run.checked, be.trace(fn, args, run.checked), forward=True,
                               complex_indices=complex_inputs, test_imag=part == "imag"))
        jacobian.check(run, pieces[-1])
    return pieces
