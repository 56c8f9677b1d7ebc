"""``missing_slice``: the analytical block is zero on a slice of the output's or the input's
elements (a batch element, a region of interest, a band of rows) where the numerical block
is not, and the two match elsewhere. A slice is the smallest box of multi-indices holding
the lines zero on the analytical side only, grown to whole dimensions where it stays zero.
"""
from __future__ import annotations

import math

import numpy as np

from agcheck.report.values import fmt

from .facts import BlockFacts

__all__ = ["MIN_SLICE", "missing_slice", "slice_text"]

#: a slice holds at least this many elements (one element is a few entries, or localized)
MIN_SLICE = 2


def slice_text(name: str, lo, hi, shape) -> str:
    """The box ``lo <= index < hi`` of ``shape`` as ``output[1, ...]``, ``input[:, 2:4, ...]``, ``input[3:5]``."""
    parts = [":" if (a, b) == (0, n) else str(a) if b == a + 1 else f"{a}:{b}" for a, b, n in zip(lo, hi, shape)]
    trailing = False
    while parts and parts[-1] == ":":
        parts.pop()
        trailing = True
    return f"{name}[{', '.join(parts + (['...'] if trailing else []))}]"


def _shape_of(shape, lines: int) -> tuple:
    shape = tuple(int(s) for s in shape) if shape is not None else ()
    return shape if shape and math.prod(shape) == lines else (lines,)


def _box(dead: np.ndarray, zero: np.ndarray, shape: tuple):
    """``(lo, hi)``: the smallest box of ``shape`` holding the ``dead`` lines, each range grown
    to its whole dimension where all stays ``zero``; ``None`` where the box holds a nonzero line."""
    zero = zero.reshape(shape)
    index = np.unravel_index(np.flatnonzero(dead), shape)
    lo, hi = [int(i.min()) for i in index], [int(i.max()) + 1 for i in index]

    def holds(lo, hi) -> bool:
        return bool(zero[np.ix_(*(np.arange(a, b) for a, b in zip(lo, hi)))].all())

    if not holds(lo, hi):
        return None
    for d in reversed(range(len(shape))):
        wider_lo, wider_hi = lo[:d] + [0] + lo[d + 1:], hi[:d] + [shape[d]] + hi[d + 1:]
        if holds(wider_lo, wider_hi):
            lo, hi = wider_lo, wider_hi
    return lo, hi


def _side(facts: BlockFacts, axis: int, zero: np.ndarray):
    """The slice of the block's rows (``axis`` 0, input) or columns (1, output) where only the
    analytical block is zero, if the blocks match elsewhere: ``(text, elements, lines,
    residual, largest numerical entry there)`` or ``None``."""
    N = facts.N if axis == 0 else facts.N.T
    lines = N.shape[0]
    if not zero.any():
        return None
    dead = zero & (np.abs(N).max(axis=1) > facts.floor)
    if not dead.any():
        return None
    name, shape = ("input", facts.block.input_shape) if axis == 0 else ("output", facts.block.output_shape)
    shape = _shape_of(shape, lines)
    box = _box(dead, zero, shape)
    if box is None:
        return None
    lo, hi = box
    inside = np.zeros(shape, dtype=bool)
    inside[tuple(slice(a, b) for a, b in zip(lo, hi))] = True
    inside = inside.reshape(-1)
    count = int(inside.sum())
    if not MIN_SLICE <= count < lines:
        return None
    X = N.copy()
    X[inside] = 0
    ok, rx = facts.fit(X if axis == 0 else X.T)
    if not ok:
        return None
    return slice_text(name, lo, hi, shape), count, lines, rx, float(np.abs(N[inside]).max())


def missing_slice(facts: BlockFacts, wrong):
    """``missing_slice`` on a slice of at least ``MIN_SLICE`` elements, and not all, of either side."""
    if not wrong.count:
        return None
    magnitude = np.abs(facts.A)
    zero_rows, zero_cols = magnitude.max(axis=1) <= facts.floor, magnitude.max(axis=0) <= facts.floor
    del magnitude
    found = {"output": _side(facts, 1, zero_cols), "input": _side(facts, 0, zero_rows)}
    found = {name: side for name, side in found.items() if side is not None}
    if not found:
        return None
    rx = min(side[3] for side in found.values())
    largest = max(side[4] for side in found.values())
    where = " and ".join(f"{text} ({count} of {lines} {name} elements)"
                         for name, (text, count, lines, _, _) in found.items())
    if len(found) == 2:
        cause = ("the backward likely drops that slice: the same derivatives seen from both sides, as for a batch "
                 "element the backward skips (a loop or mask that stops one short, an index range off by one)")
    elif "output" in found:
        cause = ("the backward likely drops the gradient flowing from those output elements (a region of interest, "
                 "batch element or index range it skips, a loop or mask that stops one short)")
    else:
        cause = ("the backward likely returns no gradient for those input elements (a band, border or batch "
                 "element it leaves at zero, a loop or mask that stops one short)")
    return facts.diagnosis(
        "missing_slice",
        f"the analytical Jacobian is zero on {where}, where the numerical one is not (up to {fmt(largest)}), and "
        f"the two match elsewhere (residual {fmt(rx)} vs mismatch {fmt(facts.r0)}): {cause}",
        {"max_abs_diff": facts.r0, "residual": rx,
         "slices": {name: side[0] for name, side in found.items()},
         "elements": {name: side[1] for name, side in found.items()}})
