"""A failing dense check decided by the batched engine, at about the cost of a pass.

The engine hands the reference engine whole Jacobians that lead it to the verdict and
message it would reach alone:

* the first failing (output, input) block in torch's order is found on the batched
  numbers; its worst entry is computed again as the reference engine computes it (row by
  plain calls, column by one VJP), and the failure counts only if it still fails;
* every row and column of that block that the message prints is computed exactly too;
* with these in place, the first failing block must still be that block, else the
  reference engine decides alone.

Blocks before it pass on the batched numbers, as a passing check does."""
from __future__ import annotations

import numpy as np

from agcheck.core import jacobian as jac
from agcheck.core.numerical_rows import runs
from agcheck.engine.coloured import allclose_like_torch
from agcheck.core.outcome import EngineEvent, Outcome, undecided

__all__ = ["may_decide", "whole_numerical", "decide", "decide_forward"]


def may_decide(p) -> bool:
    """Whether a mismatch can be decided here: whole numerical Jacobians fit the memory
    budget and every floating output is real (a complex output's message splits it in
    parts; complex inputs are decided as real ones)."""
    return p.keep_rows and not any(p.be.is_complex(p.outputs[k]) for k in p.floats)


def whole_numerical(p) -> dict | None:
    """``{q: {k: (n, m) NumPy rows}}`` from the kept rows, or ``None`` unless all are kept."""
    whole = {}
    for q in p.checked:
        kept = p.kept_rows(q)
        whole[q] = None if kept is None else kept.numpy()
        if whole[q] is None:
            return None
    return whole


def decide(p, diff, analytical, where, exact_columns) -> Outcome | None:
    """The undecided outcome handing the reference engine whole Jacobians, or ``None`` where
    the mismatch is not confirmed. ``analytical``: ``{k: [DenseBlock per input]}``;
    ``where``: ``(q, k, start, stop)`` of the row block seen to differ;
    ``exact_columns(k, c0, c1)``: output ``k``'s columns ``c0:c1`` one VJP each."""
    be, run = p.be, p.run
    numerical = whole_numerical(p)
    if numerical is None:
        return _unconfirmed(run, "rows missing")
    exact_rows = _exact_rows(p)
    exact_cols = _overlay_exact_columns(p, diff, analytical)
    failing = _first_failing(p, diff, lambda i, j: analytical[diff[i]][j].by_input, numerical, where)
    if failing is None:  # the block seen to differ is not among those kept
        return _unconfirmed(run, "rows missing")
    i, j = failing
    k, q = diff[i], p.checked[j]
    a = analytical[k][j].by_input
    r, c = _worst_entry(p, a, numerical[q][k], where, (q, k))
    edge = be.summarized_edge_items(a.size)
    rows = sorted(set(_printed(a.shape[0], edge)) | {r})
    cols = sorted(set(_printed(a.shape[1], edge)) | {c})
    _compute_exact_rows(p, q, rows, numerical, exact_rows)
    for c0, c1 in _unset(cols, exact_cols[k]):
        for block, computed in zip(analytical[k], exact_columns(k, c0, c1)):
            block.by_output[c0:c1] = be.to_numpy(computed).T
        exact_cols[k][c0:c1] = True
    if _moved_first_failing(p, diff, analytical, numerical, (i, j), rows, cols):
        return _unconfirmed(run, "the exact rows and columns move the first failing block")
    exact = np.ix_(np.flatnonzero(exact_rows[q]), np.flatnonzero(exact_cols[k]))
    if _allclose(be, a[exact], numerical[q][k][exact], p.args[q], run.opts):
        return _unconfirmed(run, "no entry computed exactly fails")
    _confirmed(run, i, j, int(exact_rows[q].sum()), int(exact_cols[k].sum()))
    columns = {kk: ([(0, be.numel(p.outputs[kk]))], [block.by_output for block in analytical[kk]]) for kk in diff}
    inexact = not (_all_set(exact_rows) and _all_set(exact_cols))
    return undecided("Jacobian mismatch", columns, whole=True, inexact=inexact)


def decide_forward(p, diff, jvp_rows, where) -> Outcome | None:
    """:func:`decide` in forward mode, ``jvp_rows`` an :class:`InputRows` per input index.
    Both sides are rows there, so the printed entries are exact once the printed rows (and
    the worst entry's) are computed as the reference engine computes them."""
    be, run, opts = p.be, p.run, p.run.opts
    numerical = whole_numerical(p)
    analytical = _whole_jvp_rows(p, jvp_rows)
    if numerical is None or analytical is None:
        return _unconfirmed(run, "rows missing")
    exact_rows = _exact_rows(p)
    failing = _first_failing(p, diff, lambda i, j: analytical[j][i], numerical, where)
    if failing is None:
        return _unconfirmed(run, "rows missing")
    i, j = failing
    k, q = diff[i], p.checked[j]
    a = analytical[j][i]
    r, _ = _worst_entry(p, a, numerical[q][k], where, (q, k))
    rows = sorted(set(_printed(a.shape[0], be.summarized_edge_items(a.size))) | {r})
    _compute_exact_rows(p, q, rows, numerical, exact_rows)
    exact_jvps = {jj: np.zeros(be.numel(p.args[x]), dtype=bool) for jj, x in enumerate(p.checked)}
    if not _compute_exact_jvps(p, j, rows, analytical, exact_jvps):
        return _unconfirmed(run, "outputs changed")
    # the rows replaced also belong to earlier outputs' blocks of this input
    if any(not allclose_like_torch(analytical[j][before][rows], numerical[q][diff[before]][rows], opts.rtol, opts.atol)
           for before in range(i)):
        return _unconfirmed(run, "the exact rows move the first failing block")
    both = np.flatnonzero(exact_rows[q] & exact_jvps[j])
    if _allclose(be, a[both], numerical[q][k][both], p.args[q], opts):
        return _unconfirmed(run, "no entry computed exactly fails")
    _confirmed(run, i, j, len(both), 0)
    whole = {jj: [be.array_like(m, p.outputs[kk]) for m, kk in zip(analytical[jj], p.floats)] for jj in analytical}
    inexact = not (_all_set(exact_rows) and _all_set(exact_jvps))
    return undecided("Jacobian mismatch", whole, whole=True, inexact=inexact)


def _all_set(flags: dict) -> bool:
    return all(f.all() for f in flags.values())


def _confirmed(run, i, j, exact_rows, exact_columns) -> None:
    run.engine_log.append(EngineEvent("failure", "confirmed", j, f"output {i}", figures={
        "exact_rows": exact_rows, "exact_columns": exact_columns}))


def _worst_entry(p, a, n, where, block) -> tuple[int, int]:
    """``(row, column)`` of the entry of ``a`` exceeding ``atol + rtol |n|`` the most (NaN
    first), within the row block seen to differ where it is ``block``'s."""
    start, stop = where[2:] if block == where[:2] else (0, a.shape[0])
    opts = p.run.opts
    with np.errstate(invalid="ignore", over="ignore"):
        excess = np.abs(a[start:stop] - n[start:stop]) - (opts.atol + opts.rtol * np.abs(n[start:stop]))
    excess = np.where(np.isnan(excess), np.inf, excess)
    r, c = np.unravel_index(int(np.argmax(excess)), excess.shape)
    return int(r) + start, int(c)


def _compute_exact_rows(p, q, rows, numerical, exact_rows) -> None:
    """Input ``q``'s ``rows`` not yet exact, computed exactly into ``numerical``."""
    for start, stop in _unset(rows, exact_rows[q]):
        for s, e, computed in p.rows_element_by_element(q, start, stop):
            for k in p.floats:
                numerical[q][k][s:e] = p.be.to_numpy(computed[k])
            exact_rows[q][s:e] = True


def _compute_exact_jvps(p, j, rows, analytical, exact_jvps) -> bool:
    """Input ``p.checked[j]``'s JVP ``rows``, computed exactly into ``analytical``; False
    where the outputs changed."""
    be, opts = p.be, p.run.opts
    for s, e in _unset(rows, exact_jvps[j]):
        exact = p.run.user_errors.call(jac.analytical_rows_forward, be, p.fn, p.args, p.checked, j, range(s, e),
                                       check_grad_dtypes=opts.check_grad_dtypes)
        if exact is None or len(exact) != len(p.floats):
            return False
        for ii, block in enumerate(exact):
            analytical[j][ii][s:e] = be.to_numpy(block).reshape(e - s, -1)
        exact_jvps[j][s:e] = True
    return True


def _overlay_exact_columns(p, diff, analytical) -> dict:
    """The exact columns the engine computed, laid over ``analytical``; per output, which
    columns are exact."""
    exact_cols = {k: np.zeros(p.be.numel(p.outputs[k]), dtype=bool) for k in diff}
    for k, (ranges, rows) in (p.exact_analytical() or {}).items():
        for c0, c1 in ranges if k in exact_cols else ():
            for block, r in zip(analytical[k], rows):
                block.by_output[c0:c1] = r[c0:c1]
            exact_cols[k][c0:c1] = True
    return exact_cols


def _exact_rows(p) -> dict:
    """Per input, which of its kept rows are exact."""
    return {q: p.kept_rows(q).exact.copy() for q in p.checked}


def _whole_jvp_rows(p, jvp_rows: dict) -> dict | None:
    """``{j: [(n, m) NumPy rows per floating output]}``, or ``None`` unless every row was kept."""
    whole = {}
    for j in range(len(p.checked)):
        rows = jvp_rows[j].numpy() if j in jvp_rows else None
        if rows is None:
            return None
        whole[j] = [rows[i] for i in range(len(p.floats))]
    return whole


def _unconfirmed(run, why: str) -> None:
    run.engine_log.append(EngineEvent("failure", "unconfirmed", None, why))


def _first_failing(p, diff, analytical, numerical, where) -> tuple[int, int] | None:
    """``(output index, input index)`` of the first block in torch's order that differs:
    the inputs in ``p.passed`` agree, ``where``'s block differs, the others are compared."""
    opts = p.run.opts
    for i, k in enumerate(diff):
        for j, q in enumerate(p.checked):
            if q not in p.passed and ((q, k) == where[:2] or not allclose_like_torch(
                    analytical(i, j), numerical[q][k], opts.rtol, opts.atol)):
                return i, j
    return None


def _moved_first_failing(p, diff, analytical, numerical, failing, rows, cols) -> bool:
    """Whether a block before ``failing`` in torch's order, sharing its ``rows`` or ``cols``,
    fails once they are computed again."""
    opts, (i, j) = p.run.opts, failing
    k, q = diff[i], p.checked[j]
    for before in diff[:i]:
        if not allclose_like_torch(analytical[before][j].by_input[rows], numerical[q][before][rows],
                                   opts.rtol, opts.atol):
            return True
    for jj, qq in enumerate(p.checked[:j]):
        if not allclose_like_torch(analytical[k][jj].by_input[:, cols], numerical[qq][k][:, cols],
                                   opts.rtol, opts.atol):
            return True
    return False


def _allclose(be, a, n, like, opts) -> bool:
    return be.allclose(be.array_like(np.ascontiguousarray(a), like), be.array_like(np.ascontiguousarray(n), like),
                       opts.rtol, opts.atol)


def _printed(size: int, edge: int | None) -> range | list:
    """The indices along a dimension of ``size`` that a message prints."""
    if edge is None or size <= 2 * edge:
        return range(size)
    return list(range(edge)) + list(range(size - edge, size))


def _unset(indices, flags) -> list[tuple[int, int]]:
    """The ``(start, stop)`` runs of ``indices`` whose ``flags`` are not set."""
    mask = np.zeros(flags.shape, dtype=bool)
    mask[indices] = ~flags[indices]
    return runs(mask)
