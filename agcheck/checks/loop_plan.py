"""Whether a slow-mode check goes to the element-by-element loop or to the engine: the
loop's price from the check's first evaluation (and, near the line, a second), against
what the engine's probes would cost; JAX's compilations priced where the engine's programs
are not compiled yet."""
from __future__ import annotations

from typing import Callable

from agcheck.core import jacobian as jac
from agcheck.core.piece import Piece
from agcheck.engine import cost
from agcheck.engine.compilations import COMPILATIONS
from agcheck.core.outcome import EngineEvent

__all__ = ["loop_is_cheap", "checked_function", "compiled_signature"]


def loop_is_cheap(run, piece: Piece, n_in: int) -> bool:
    """Whether the element-by-element check is estimated to cost less than the engine's
    probes would (then it decides at once, and the decision is logged with its figures)."""
    be = run.be
    seconds = getattr(run, "evaluation_seconds", None)
    if seconds is None:
        return False
    n_out = sum(be.numel(piece.outputs[k]) for k in piece.diff)
    # a complex input is moved along its real and its imaginary axis: twice the evaluations
    moved = sum(be.numel(x) * (2 if be.is_complex(x) else 1) for x in piece.inputs)
    estimate = cost.loop_seconds(moved, n_out, seconds)
    figures = {"evaluation": seconds, "loop_estimate": estimate}
    worth = cost.ENGINE_WORTH_SECONDS
    if not be.engine_setup_seconds and worth <= estimate < cost.RETIMED_BELOW * worth and \
            seconds <= estimate / cost.RETIMED_CALLS:
        # one timing decides: a first call that paid a one-time cost (an op's first use in
        # the process) or was interrupted would send a small check to the engine's probes
        again = _evaluation_seconds_again(run, piece)
        if again is not None and again < seconds:
            seconds = figures["evaluation_again"] = again
            estimate = figures["loop_estimate"] = cost.loop_seconds(moved, n_out, seconds)
    if be.engine_setup_seconds:
        signature = compiled_signature(be, piece)
        ran = COMPILATIONS.engine_ran(checked_function(piece), signature)  # its programs are compiled
        setup = figures["engine_setup"] = 0.0 if ran else be.engine_setup_seconds
        if setup and estimate >= worth + setup:
            estimate, seconds, setup = _priced_where_compiled(run, piece, moved, n_out, seconds, signature,
                                                              figures)
        worth += setup
    if piece.forward and cost.JVP_TIMED_FROM_SECONDS <= estimate < worth and \
            2 * moved + n_in >= cost.RETIMED_CALLS:
        # a JVP may cost many evaluations (dual numbers through an op's decomposition): one
        # is timed where the answer can change the choice, and the loop makes enough calls
        # that one more is small beside them
        jvp = _one_jvp_seconds(run, piece)
        if jvp is not None and be.engine_setup_seconds and cost.forward_loop_seconds(moved, n_in, seconds, jvp) >= worth:
            again = _one_jvp_seconds(run, piece)  # the first JVP of a new shape also compiled it
            jvp = min(jvp, again) if again is not None else jvp
        if jvp is not None:
            estimate = figures["loop_estimate"] = cost.forward_loop_seconds(moved, n_in, seconds, jvp)
            figures["jvp"] = jvp
            if estimate >= worth:
                run.engine_log.append(EngineEvent("plan", "engine", None, "a JVP costs more than the estimate assumed",
                                                  figures=figures))
    if estimate >= worth:
        return False
    run.engine_log.append(EngineEvent("plan", "reference", None, "the loop costs less than probing would",
                                      figures=figures))
    return True


def _priced_where_compiled(run, piece: Piece, moved: int, n_out: int, seconds: float, signature,
                           figures: dict) -> tuple:
    """``(loop estimate, seconds of one evaluation, engine set-up)`` on a backend that
    compiles every new program, where the engine has not run for ``fn`` at ``signature``:
    the check's first evaluation, which compiled ``fn``, timed again warm; the engine's
    set-up priced from that compilation, or from the one seen first
    (``cost.ENGINE_COMPILATIONS``, :mod:`agcheck.engine.compilations`); the loop priced
    from its own calls, timed."""
    compiled = 0.0
    again = _evaluation_seconds_again(run, piece)
    if again is not None and again < seconds:
        compiled = seconds - again
        seconds = figures["evaluation_again"] = again
    compiled = COMPILATIONS.price(checked_function(piece), signature, compiled)
    setup = max(run.be.engine_setup_seconds, cost.ENGINE_COMPILATIONS * compiled)
    if compiled:
        figures["compilation"], figures["engine_setup"] = compiled, setup
    estimate = cost.loop_seconds(moved, n_out, seconds)
    calls = _loop_call_seconds(run, piece)
    if calls is not None:
        seconds, backward = calls
        figures["element_evaluation"] = seconds
        if backward is not None:
            figures["unit_vjp"] = backward
        estimate = cost.loop_seconds(moved, n_out, seconds) if backward is None else \
            cost.measured_loop_seconds(2 * moved, 2 * n_out, seconds, backward)
    figures["loop_estimate"] = estimate
    return estimate, seconds, setup


def checked_function(piece: Piece):
    """The user's function behind the piece's (a backend's wrapper of it, made anew for
    every check, names it as ``__wrapped__``)."""
    return getattr(piece.fn, "__wrapped__", piece.fn)


def compiled_signature(be, piece: Piece) -> tuple:
    """What the engine's compiled programs of the piece are specialised on: which arguments
    it is checked in, their shapes and dtypes (other arguments: their values, or types).
    Both modes share it: their batched evaluations are the same programs."""
    def of(a):
        if be.is_array(a):
            return tuple(a.shape), be.dtype_name(a)
        return a if isinstance(a, (bool, int, float, complex, str, type(None))) else type(a).__name__

    return tuple(piece.checked), tuple(of(a) for a in piece.args)


def _loop_call_seconds(run, piece: Piece) -> tuple | None:
    """Seconds of one evaluation of ``fn`` with an element moved, and of one VJP of a
    one-hot cotangent (None in forward mode), as the loop makes them (the calls alone: no
    row is assembled, which would be a new shape to compile), each timed on its second
    call (the first may compile a program the check's traced evaluation did not); None
    where they cannot be had."""
    be, p = run.be, piece.checked[0]
    x = piece.args[p]
    if be.numel(x) == 0 or not piece.diff:
        return None
    moved = run.numerical_args(piece.args)

    def element():
        jac.evaluate_moved_element(be, piece.fn, moved, p, run.eps_for(x), run.stencil)

    def unit_vjp():
        next(iter(piece.trace.unit_vjps(piece.diff[0], [0], be.one_hot)))

    evaluation = _warm_seconds(run, element)
    if evaluation is None or piece.forward:
        return None if evaluation is None else (evaluation, None)
    backward = _warm_seconds(run, unit_vjp)
    return None if backward is None else (evaluation, backward)


def _warm_seconds(run, call: Callable) -> float | None:
    """:func:`_seconds_of` the second of two calls (the first may compile)."""
    return None if _seconds_of(run, call) is None else _seconds_of(run, call)


def _seconds_of(run, call: Callable) -> float | None:
    """Seconds of work ``call()`` took (as the engine's stopwatch counts them); None where
    it raised an error of agcheck's own making (one of ``fn``'s or its backward's
    propagates: the loop raises it where torch's checker would)."""
    watch = run.stopwatch()
    try:
        call()
    except Exception as error:  # noqa: BLE001 - see the docstring
        if error in run.user_errors:
            raise
        return None
    return watch.seconds()


def _evaluation_seconds_again(run, piece: Piece) -> float | None:
    """Seconds of a second evaluation of the piece with its graph, as the check's first
    was timed (an error of ``fn``'s there propagates, as from any of its calls)."""
    return _seconds_of(run, lambda: run.user_errors.call(run.be.trace, piece.fn, piece.args, piece.checked))


def _one_jvp_seconds(run, piece: Piece) -> float | None:
    """Seconds of one JVP of the piece (its first input's first element), as the forward
    loop computes each; None where it cannot be had."""
    return _seconds_of(run, lambda: jac.analytical_rows_forward(run.be, piece.fn, piece.args, piece.checked, 0, [0]))
