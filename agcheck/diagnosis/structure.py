"""Whole-block hypotheses, each a function of :class:`~agcheck.diagnosis.facts.BlockFacts`
returning a :class:`~agcheck.report.model.Diagnosis` or ``None``: the analytical block is a
simple transformation of the numerical one, zero on a slice, wrong in a few entries, rows or
columns, or off by a simple term. :func:`structure` keeps the first that fits.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from agcheck.report.values import fmt, index_text, unravel

from .facts import BlockFacts, coefficient_text
from .slices import missing_slice
from .terms import TERMS, constant_term

__all__ = ["FEW", "structure", "TRANSFORMATIONS", "EXACT", "LOCAL"]

#: "a few entries": at most this many (and at most a quarter of the block)
FEW = 10


def _base(facts: BlockFacts) -> dict:
    return {"max_abs_diff": facts.r0, "nonzero_numerical_entries": _nonzero(facts)}


def _nonzero(facts: BlockFacts) -> int:
    return int(np.count_nonzero(np.abs(facts.N) > facts.floor))


def _derivatives(facts: BlockFacts) -> int:
    """Entries that either side makes nonzero (above the error floor)."""
    return int(np.count_nonzero((np.abs(facts.N) > facts.floor) | (np.abs(facts.A) > facts.floor)))


def zero_analytical(facts: BlockFacts):
    n_max, a_max = float(np.abs(facts.N).max()), float(np.abs(facts.A).max())
    if not (a_max <= facts.floor and n_max > facts.floor):
        return None
    return facts.diagnosis(
        "zero_analytical",
        f"the analytical Jacobian is zero (max |analytical| {fmt(a_max)}) while the numerical one is not "
        f"(max {fmt(n_max)}): the backward likely returns zeros (or None) for input {facts.block.input}, "
        "or the forward uses a detached copy of it",
        _base(facts))


def zero_numerical(facts: BlockFacts):
    n_max, a_max = float(np.abs(facts.N).max()), float(np.abs(facts.A).max())
    if not (n_max <= facts.floor and a_max > facts.floor):
        return None
    if facts.block.output_float32_valued:
        return facts.diagnosis(
            "precision",
            f"the numerical Jacobian is zero although the analytical one is not (max |analytical| {fmt(a_max)}), "
            f"and output {facts.block.output} holds only float32 (or coarser) values although input "
            f"{facts.block.input} is {facts.block.input_dtype}: fn computes in lower precision inside (a cast to "
            f"float32 or half, low-precision weights), and a step of eps={fmt(facts.eps)} moves none of its "
            "outputs. Compute in double precision throughout (docs/accuracy.md)",
            {**_base(facts), "output_float32_valued": True})
    return facts.diagnosis(
        "zero_numerical",
        f"the numerical Jacobian is zero: output {facts.block.output} does not change when input "
        f"{facts.block.input} moves, but the analytical one is not (max |analytical| {fmt(a_max)}): the "
        "backward likely returns a gradient for an input the output does not depend on (inputs swapped?)",
        _base(facts))


def factor(facts: BlockFacts):
    """``factor`` (``analytical = c x numerical``), or ``sign`` for ``c = -1``."""
    N, A, r0 = facts.N, facts.A, facts.r0
    denom = float(np.vdot(N, N).real)
    if not denom > 0:
        return None
    c = complex(np.vdot(N, A)) / denom
    if abs(c.imag) <= 1e-9 * abs(c):
        c = c.real
    ok, rx = facts.fit(c * N)
    if not (ok and abs(c - 1) > 1e-3):
        return None
    if isinstance(c, complex) and conjugate(facts) is not None:
        # a constant Jacobian's conjugate is also a unit complex multiple of it: the likelier bug
        return None
    nonzero = _nonzero(facts)
    weak = " (a single nonzero entry: weak evidence)" if nonzero <= 1 else ""
    ev = dict(_base(facts), factor=c, residual=rx)
    if abs(c + 1) <= 1e-3:
        return facts.diagnosis("sign", f"analytical = -1 x numerical: the gradient's sign is flipped (all {nonzero} "
                                       f"nonzero entries; residual {fmt(rx)} vs mismatch {fmt(r0)}){weak}", ev)
    return facts.diagnosis(
        "factor", f"analytical = {coefficient_text(c)} x numerical (numerical = {coefficient_text(1 / c)} x "
                  f"analytical), a constant factor over all {nonzero} nonzero entries (residual {fmt(rx)} vs "
                  f"mismatch {fmt(r0)}){weak}", ev)


def conjugate(facts: BlockFacts):
    """``analytical = conj(numerical)`` (or ``-conj`` on the imaginary part of an output)."""
    N = facts.N
    if not (np.iscomplexobj(N) and float(np.abs(N.imag).max()) > facts.floor):
        return None
    for sign, form in ((1, "conj(numerical)"), (-1, "-conj(numerical)")):
        ok, rx = facts.fit(sign * N.conj())
        if ok:
            seen = (" (on the imaginary part of a complex output a missing conjugation shows as -conj)"
                    if sign < 0 else "")
            return facts.diagnosis(
                "conjugate", f"analytical = {form}{seen} (residual {fmt(rx)} vs mismatch {fmt(facts.r0)}): the "
                             "backward likely misses (or adds) a complex conjugation, e.g. grad * w instead "
                             "of grad * w.conj() — agcheck and torch expect the conjugate Wirtinger "
                             "convention", dict(_base(facts), residual=rx, sign=sign))
    return None


def _square(facts: BlockFacts) -> bool:
    rows, cols = facts.N.shape
    return rows == cols and rows >= 2


def transposed(facts: BlockFacts):
    if not _square(facts):
        return None
    ok, rx = facts.fit(facts.N.T)
    if not ok:
        return None
    return facts.diagnosis(
        "transposed", f"analytical = numerical transposed (residual {fmt(rx)} vs mismatch {fmt(facts.r0)}): the "
                      "derivative likely uses a matrix where its transpose belongs (e.g. W instead "
                      "of W.T in the backward of x @ W)", dict(_base(facts), residual=rx))


def adjoint(facts: BlockFacts):
    if not (_square(facts) and np.iscomplexobj(facts.N)):
        return None
    ok, rx = facts.fit(facts.N.conj().T)
    if not ok:
        return None
    return facts.diagnosis(
        "adjoint", f"analytical = conjugate transpose of numerical (residual {fmt(rx)} vs mismatch "
                   f"{fmt(facts.r0)}): a matrix and its adjoint are likely swapped in the backward",
        dict(_base(facts), residual=rx))


def ignores_grad_output(facts: BlockFacts):
    N = facts.N
    cols = N.shape[1]
    if not (facts.block.mode == "reverse" and cols >= 2):
        return None
    ok, rx = facts.fit(np.repeat(N.sum(axis=1, keepdims=True), cols, axis=1))
    if not ok:
        return None
    return facts.diagnosis(
        "ignores_grad_output",
        "every column of the analytical Jacobian (the backward for one output element) equals the "
        f"gradient of sum(output {facts.block.output}) (residual {fmt(rx)}): the backward likely ignores "
        "grad_output instead of multiplying by it", dict(_base(facts), residual=rx))


def ignores_tangent(facts: BlockFacts):
    N = facts.N
    rows = N.shape[0]
    if not (facts.block.mode == "forward" and rows >= 2):
        return None
    ok, rx = facts.fit(np.repeat(N.sum(axis=0, keepdims=True), rows, axis=0))
    if not ok:
        return None
    return facts.diagnosis(
        "ignores_tangent",
        "every row of the forward-mode Jacobian equals the derivative along the all-ones tangent "
        f"(residual {fmt(rx)}): the forward-mode rule likely ignores the input tangent",
        dict(_base(facts), residual=rx))


#: blocks whose rows (or columns) are matched up to this many, and with at most this many
#: entries times their rows (columns), are tried for a permutation (one matrix product)
PERMUTED_LINES = 1024
PERMUTED_WORK = 20_000_000


def _matching_lines(A, N):
    """For each row of ``A`` the nearest row of ``N`` (least squares), when that is a
    permutation other than the identity and rows have two entries at least; else ``None``."""
    n = A.shape[0]
    if n < 2 or A.shape[1] < 2 or n > PERMUTED_LINES or n * A.size > PERMUTED_WORK:
        return None
    with np.errstate(over="ignore", invalid="ignore"):
        distance = ((np.abs(A) ** 2).sum(axis=1)[:, None] + (np.abs(N) ** 2).sum(axis=1)[None, :]
                    - 2 * (A @ N.conj().T).real)
    if not np.isfinite(distance).all():
        return None
    order = _nearest_free(distance)
    if order is None or np.array_equal(order, np.arange(n)):
        return None
    return order


def _nearest_free(distance):
    """Each row's column, nearest pairs first, each column taken once; ``None`` after more
    than a few passes over the rows (equal rows, zero rows say, share their nearest)."""
    n = distance.shape[0]
    order, taken, left = np.full(n, -1), np.zeros(n, dtype=bool), n
    for seen, flat in enumerate(np.argsort(distance, axis=None, kind="stable")):
        if seen > 16 * n:
            return None
        i, j = divmod(int(flat), n)
        if order[i] < 0 and not taken[j]:
            order[i], taken[j], left = j, True, left - 1
            if not left:
                return order
    return None


def _moved_text(order, shape, what: str) -> str:
    moved = [i for i in range(len(order)) if order[i] != i]
    pairs = [f"{what}{index_text(unravel(i, shape))} <- {what}{index_text(unravel(int(order[i]), shape))}"
             for i in moved[:4]]
    return ", ".join(pairs) + (f" and {len(moved) - 4} more" if len(moved) > 4 else "")


#: what a reordering along each axis means: (the lines, the shape they index, the elements'
#: name, what is wrong with them, the likely cause)
_REORDERED = {
    "rows": ("rows", "input_shape", "input", "gradients",
             "the backward likely routes gradients to the wrong elements (an index, flip, roll or permutation "
             "it does not undo, or undoes the wrong way)"),
    "cols": ("columns", "output_shape", "output", "derivatives",
             "the backward likely reads grad_output at the wrong elements (an index, flip, roll or permutation "
             "it does not undo)"),
}


def _permuted(facts: BlockFacts, axis: str):
    """``permuted``: the analytical block is the numerical one with its rows or columns reordered."""
    A, N = (facts.A, facts.N) if axis == "rows" else (facts.A.T, facts.N.T)
    order = _matching_lines(A, N)
    if order is None:
        return None
    ok, rx = facts.fit(N[order] if axis == "rows" else N[order].T)
    if not ok:
        return None
    lines, shape, what, derivatives, cause = _REORDERED[axis]
    moved = int(np.count_nonzero(order != np.arange(len(order))))
    return facts.diagnosis(
        "permuted",
        f"analytical = numerical with its {lines} reordered: the {derivatives} of {moved} {what} elements are "
        f"those of other elements ({_moved_text(order, getattr(facts.block, shape), what)}; residual {fmt(rx)} "
        f"vs mismatch {fmt(facts.r0)}): {cause}",
        dict(_base(facts), residual=rx, axis=axis, order=[int(i) for i in order[:64]], moved=moved))


def permuted_rows(facts: BlockFacts):
    return _permuted(facts, "rows")


def permuted_cols(facts: BlockFacts):
    return _permuted(facts, "cols")


#: the transformations tried, in order (``zero_*`` end the search even when later ones fit)
TRANSFORMATIONS = (zero_analytical, zero_numerical, factor, conjugate, transposed, adjoint, ignores_grad_output,
                   ignores_tangent, permuted_rows, permuted_cols)


@dataclass
class WrongEntries:
    """The entries outside tolerance and above the error floor."""

    mask: np.ndarray
    count: int
    rows: np.ndarray
    cols: np.ndarray

    @classmethod
    def of(cls, facts: BlockFacts) -> "WrongEntries":
        block = facts.block
        with np.errstate(invalid="ignore"):
            bad = (facts.diff > block.atol + block.rtol * np.abs(facts.N)) & (facts.diff > facts.floor)
        # the rows and columns holding a wrong entry, without the index arrays of every entry
        return cls(bad, int(np.count_nonzero(bad)), np.flatnonzero(bad.any(axis=1)), np.flatnonzero(bad.any(axis=0)))


def _few_lines(wrong: np.ndarray, total: int, count: int) -> bool:
    """At most 3 of ``total >= 4`` lines (and at most a quarter), each wrong at least twice."""
    return len(wrong) <= 3 and total >= 4 and 4 * len(wrong) <= total and count >= 2 * len(wrong)


def localized_rows(facts: BlockFacts, wrong: WrongEntries):
    if not _few_lines(wrong.rows, facts.N.shape[0], wrong.count):
        return None
    which = ", ".join(index_text(unravel(r, facts.block.input_shape)) for r in wrong.rows)
    return facts.diagnosis(
        "localized", f"all {wrong.count} wrong entries are derivatives with respect to input element(s) {which} "
                     f"(rows of the block): the gradient of those elements is wrong, the others match",
        {"count": wrong.count, "rows": [int(r) for r in wrong.rows]})


def localized_cols(facts: BlockFacts, wrong: WrongEntries):
    if not _few_lines(wrong.cols, facts.N.shape[1], wrong.count):
        return None
    which = ", ".join(index_text(unravel(c, facts.block.output_shape)) for c in wrong.cols)
    return facts.diagnosis(
        "localized", f"all {wrong.count} wrong entries are derivatives of output element(s) {which} (columns of "
                     f"the block): the backward for those output elements is wrong, the others match",
        {"count": wrong.count, "cols": [int(c) for c in wrong.cols]})


def few_entries(facts: BlockFacts, wrong: WrongEntries):
    """``few_entries``: at most ``FEW`` wrong entries and a quarter of the block, not all of its
    nonzero ones (an elementwise function with every derivative wrong is not "a few entries")."""
    k, size = wrong.count, facts.N.size
    if not (k <= FEW and 4 * k <= size and k < _derivatives(facts)):
        return None
    entries = np.argwhere(wrong.mask)
    entries = entries[np.argsort(-facts.diff[wrong.mask], kind="stable")]
    lines = [f"{facts.entry_text(r, c)}, |diff| {fmt(facts.diff[r, c])}" for r, c in entries[:FEW]]
    return facts.diagnosis(
        "few_entries", f"only {k} of {size} entries {'is' if k == 1 else 'are'} wrong, the rest match: the "
                       "derivative is likely wrong in one branch or at the edges (a boundary element, a special "
                       "case)",
        {"count": k, "entries": [[int(r), int(c)] for r, c in entries[:FEW]]}, lines)


#: hypotheses that say exactly what is wrong, tried before the local ones (which would name
#: the same entries less precisely)
EXACT = (missing_slice, constant_term)

#: the local hypotheses, tried in order when no transformation fits
LOCAL = (localized_rows, localized_cols, few_entries)


def structure(facts: BlockFacts) -> list:
    """The first whole-block hypothesis that fits, as a list of at most one diagnosis."""
    for hypothesis in TRANSFORMATIONS:
        found = hypothesis(facts)
        if found is not None:
            return [found]
    wrong = WrongEntries.of(facts)
    if not wrong.count:
        return []
    for hypothesis in EXACT + LOCAL + TERMS:
        found = hypothesis(facts, wrong)
        if found is not None:
            return [found]
    return []
