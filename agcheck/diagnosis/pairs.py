"""``swapped``: two failing blocks of one output whose derivatives with respect to two inputs
are swapped. A pair that fits replaces the blocks' whole-block diagnoses (misleading block
by block); blocks settled by the step-size probes are left alone."""
from __future__ import annotations

import numpy as np

from agcheck.report.model import Diagnosis
from agcheck.report.values import fmt

from .blocks import STRUCTURE_LIMIT
from .facts import BlockFacts

__all__ = ["swapped_inputs"]

#: the kinds :func:`~agcheck.diagnosis.structure.structure` names, which a swap may replace
#: (not its "precision", which the step-size probes name too)
STRUCTURAL = {"factor", "sign", "transposed", "adjoint", "conjugate", "ignores_grad_output", "ignores_tangent",
              "permuted", "zero_analytical", "zero_numerical", "few_entries", "localized", "missing_slice",
              "constant_term", "input_statistics", "low_rank"}


def swapped_inputs(blocks: list, found: list) -> list:
    """``found`` with each pair of blocks whose analytical blocks are each other's numerical
    ones diagnosed ``swapped`` instead."""
    by_block = {}
    for d in found:
        by_block.setdefault(d.block, []).append(d)
    swaps, paired = [], set()
    for i, a in enumerate(blocks):
        for j in range(i + 1, len(blocks)):
            if i in paired or j in paired or not _comparable(a, blocks[j]):
                continue
            if any(d.kind not in STRUCTURAL for d in by_block.get(i, []) + by_block.get(j, [])):
                continue
            swap = _swap(a, blocks[j], i, j)
            if swap is not None:
                swaps.append(swap)
                paired.update((i, j))
    if not swaps:
        return found
    return [d for d in found if d.block not in paired] + swaps


def _comparable(a, b) -> bool:
    return (a.has_arrays and b.has_arrays and a.output == b.output and a.input != b.input and a.mode == b.mode
            and a.part == b.part and a.numerical.shape == b.numerical.shape == a.analytical.shape == b.analytical.shape
            and a.numerical.size <= STRUCTURE_LIMIT)


def _swap(a, b, i: int, j: int):
    fa, fb = BlockFacts.of(a, i), BlockFacts.of(b, j)
    ok_a, ra = fa.fit(b.numerical)
    ok_b, rb = fb.fit(a.numerical)
    if not (ok_a and ok_b):
        return None
    with np.errstate(over="ignore", invalid="ignore"):
        apart = float(np.max(np.abs(a.numerical - b.numerical)))
    if not apart > max(fa.floor, fb.floor):  # equal derivatives: nothing to swap
        return None
    return Diagnosis(
        "swapped",
        f"the derivatives with respect to inputs {a.input} and {b.input} are swapped: output {a.output}'s analytical "
        f"block for input {a.input} is the numerical one for input {b.input}, and the other way round (residuals "
        f"{fmt(ra)} and {fmt(rb)} against mismatches {fmt(fa.r0)} and {fmt(fb.r0)}): the backward likely returns "
        "its gradients in the wrong order",
        {"inputs": [a.input, b.input], "residuals": [ra, rb], "max_abs_diff": [fa.r0, fb.r0]}, [], i)
