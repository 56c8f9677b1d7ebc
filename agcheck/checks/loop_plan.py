"""Whether a slow-mode check goes to the element-by-element loop or to the engine: a
function of the check's shapes and of what the backend declares (:mod:`agcheck.engine.cost`),
logged as the plan's first event."""
from __future__ import annotations

from typing import Literal

from agcheck.core.outcome import EngineEvent
from agcheck.core.piece import Piece
from agcheck.engine import cost

__all__ = ["Plan", "plan"]

#: where a slow-mode check goes: the element-by-element loop (``"reference"``, too few
#: calls for the engine to pay) or the engine (``"engine"``)
Plan = Literal["reference", "engine"]


def plan(run, piece: Piece, n_in: int) -> Plan:
    """Where the slow-mode check of ``piece`` goes; the decision is logged with its counts."""
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
    run.engine_log.append(EngineEvent("plan", "reference", None, "the loop makes few calls", figures=figures))
    return "reference"
