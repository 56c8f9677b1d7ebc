"""The diagnoses of one failing Jacobian block, in the order the evidence allows: a fast-mode
projection that the full blocks do not confirm, non-finite entries, then the step-size
evidence (kink, precision, noise), and only then the whole-block hypotheses."""
from __future__ import annotations

from typing import Callable

import numpy as np

from agcheck.report.model import Diagnosis

from .facts import BlockFacts, entry_text
from .probes import PROBED_ENTRIES, nondeterministic_fn, step_size_evidence
from .structure import structure

__all__ = ["STRUCTURE_LIMIT", "diagnose_block"]

#: blocks larger than this skip the whole-block hypotheses (memory)
STRUCTURE_LIMIT = 20_000_000


def diagnose_block(block, index: int = 0, resample: Callable | None = None,
                   max_rows: int = PROBED_ENTRIES) -> list:
    """The diagnoses of one failing Jacobian block (``report.blocks[index]``).

    ``resample`` recomputes at most ``max_rows`` numerical rows with other steps (see
    :mod:`agcheck.diagnosis.probes`); without it the kink test is skipped.
    """
    if not block.has_arrays:
        return []
    N, A = block.numerical, block.analytical
    if N.shape != A.shape or N.size == 0:
        return []
    if block.fast and block.mismatches == 0:
        return [_fast_only(block, index)]
    if not (np.isfinite(N).all() and np.isfinite(A).all()):
        return [_non_finite(block, index)]
    facts = BlockFacts.of(block, index)
    facts.inputs = _input_values(resample)
    found, settled = step_size_evidence(facts, resample, max_rows)
    changing = nondeterministic_fn(facts, resample)
    if changing is not None:  # what the steps or the block's structure say is then noise
        return [changing]
    if settled:
        return found
    if N.size <= STRUCTURE_LIMIT:
        return found + structure(facts)
    return found + [facts.diagnosis(
        "note", f"block of {N.size} entries: whole-block hypotheses (factor, transposition...) skipped")]


def _input_values(resample: Callable | None):
    """The checked input's values from ``resample.input_values()``, or None."""
    values = getattr(resample, "input_values", None)
    if values is None:
        return None
    try:
        return np.asarray(values()).reshape(-1)
    except Exception:  # noqa: BLE001 - a hint for one hypothesis, never a reason to lose the others
        return None


def _fast_only(block, index: int):
    p = block.projection or {}
    return Diagnosis(
        "fast_only",
        "the fast-mode projection v^T J u failed, but the full Jacobians recomputed in slow mode agree "
        "within atol/rtol: the projection's tolerance (atol scaled by sum(u) * sum(v)) is stricter than "
        "the element-wise one here; slow mode (fast_mode=False) passes this pair",
        {"projection": p}, [], index)


def _non_finite(block, index: int):
    N, A = block.numerical, block.analytical
    finite_n = np.isfinite(N)
    side = "numerical" if not finite_n.all() else "analytical"
    bad = ~(finite_n & np.isfinite(A))
    count = int(bad.sum())
    why = (": fn is not finite near the input (a pole, log(0), 0/0)" if side == "numerical"
           else ": the backward produces NaN/inf (e.g. 0 * inf, a division by zero)")
    return Diagnosis("non_finite", f"the {side} Jacobian has NaN or infinite entries ({count} of {N.size})" + why,
                     {"count": count}, [entry_text(block, r, c) for r, c in np.argwhere(bad)[:5]], index)
