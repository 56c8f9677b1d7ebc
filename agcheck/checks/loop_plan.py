"""Whether a slow-mode check goes to the element-by-element loop or to the engine: a
function of the check's shapes and of what the backend declares (:mod:`agcheck.engine.cost`),
logged as the plan's first event. A loop of few calls, but not very few, is priced in
calls of a reference function timed beside one call of ``fn``: a ratio, never seconds."""
from __future__ import annotations

import time
from typing import Literal

from agcheck.core.outcome import EngineEvent
from agcheck.core.piece import Piece
from agcheck.engine import cost

__all__ = ["Plan", "plan", "call_in_reference_calls"]

#: where a slow-mode check goes: the element-by-element loop (``"reference"``, too few
#: calls for the engine to pay), the engine (``"engine"``), or the engine because the
#: loop's calls are dear (``"dear"``: the engine then batches even a short loop of VJPs)
Plan = Literal["reference", "engine", "dear"]


def plan(run, piece: Piece, n_in: int) -> Plan:
    """Where the slow-mode check of ``piece`` goes; the decision is logged, with its
    figures (the counts: a timed ratio decides only within ``cost.timed_band`` and is not
    logged)."""
    be = run.be
    n_out = sum(be.numel(piece.outputs[k]) for k in piece.diff)
    # a complex input is moved along its real and its imaginary axis: twice the evaluations
    moved = sum(be.numel(x) * (2 if be.is_complex(x) else 1) for x in piece.inputs)
    calls = cost.loop_calls(moved, n_in, n_out, forward=piece.forward)
    limit = cost.engine_from_calls(be.whole_batches)
    figures = {"loop_calls": calls, "engine_from_calls": limit}
    if calls >= limit:
        run.engine_log.append(EngineEvent("plan", "engine", None, "the loop makes many calls", figures=figures))
        return "engine"
    if calls in cost.timed_band(be.whole_batches) and cost.loop_is_dear(calls, call_in_reference_calls(run, piece)):
        run.engine_log.append(EngineEvent("plan", "engine", None, "the loop makes dear calls", figures=figures))
        return "dear"
    run.engine_log.append(EngineEvent("plan", "reference", None, "the loop makes few calls", figures=figures))
    return "reference"


def call_in_reference_calls(run, piece: Piece) -> float:
    """One call of ``fn`` as the loop makes it (the first element of the first checked
    input moved by one step, through the guarded ``fn``: ``cost.TIMED_CALLS`` calls more),
    in units of the same call of a reference function (``x + x`` of that input, the same
    backend's operation) timed just before it; the fastest call of each counts. 0 where
    no element can be moved."""
    be = run.be
    moved = run.numerical_args(piece.args)
    for p in piece.checked:
        with be.perturber(moved, p) as perturber:
            if not perturber.numel:
                continue
            step = run.eps_for(piece.args[p])

            def reference(*args):
                return args[p] + args[p]

            # the calls of fn alternate with the reference's last ones: both meet the same load
            t_reference, t_fn = [], []
            for i in range(cost.REFERENCE_REPEATS):
                t_reference.append(_thread_seconds(perturber.evaluate_element, reference, 0, step, 1))
                if i >= cost.REFERENCE_REPEATS - cost.TIMED_CALLS:
                    t_fn.append(_thread_seconds(perturber.evaluate_element, piece.fn, 0, step, 1))
            return min(t_fn) / max(min(t_reference), 1e-9)
    return 0.0


def _thread_seconds(call, *args) -> float:
    """The CPU seconds of this thread ``call(*args)`` took (another process's load is not
    counted)."""
    start = time.thread_time()
    call(*args)
    return time.thread_time() - start
