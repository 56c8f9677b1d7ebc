"""A failing dense check decided by the batched engine, at about the cost of a pass.

When the batched rows of a check disagree with its analytical Jacobian, the reference
engine used to compute every row and column again one element at a time, so that its
verdict and torch's message were its own. Here the engine keeps every row it computed
and hands the reference engine whole Jacobians instead, after making sure they lead it
to the verdict and message it would reach alone:

* the first failing (output, input) block in torch's order is found on the batched
  numbers, and its worst entry (in the row block seen to differ, when that is in this
  block) is computed again as the reference engine computes it (the input element's row
  by plain calls, the output element's column by one VJP); the failure counts only if an
  entry computed so on both sides still fails;
* every row and column of that block that the message prints (all of them, unless the
  framework's printing summarises the block to its edges) is computed exactly too;
* with these exact numbers in place, the first failing block in torch's order must still
  be that block, else the reference engine decides as before.

Blocks before it pass on the batched numbers, as a passing check does."""
from __future__ import annotations

import numpy as np

from agcheck.core import jacobian as jac
from agcheck.core.numerical_memo import MemoRows
from agcheck.engine.coloured import allclose_like_torch
from agcheck.core.outcome import EngineEvent, Outcome, undecided

__all__ = ["RowStore", "KeptRows", "may_decide", "decide", "decide_forward"]


def may_decide(p) -> bool:
    """Whether a mismatch of this problem can be decided here: whole numerical Jacobians
    fit the memory budget (:attr:`Problem.keep_rows`) and every floating output is real
    (the check's pieces are: a complex output's message splits it in parts). Complex
    inputs are decided as real ones: a row moves an element along both axes, a column is
    one VJP, each computed as the reference engine computes it."""
    return p.keep_rows and not any(p.be.is_complex(p.outputs[k]) for k in p.floats)


def _like(p, q, k):
    """What a row block of input ``q`` and output ``k`` is stored like: the output, or a
    complex input (its rows are complex), as the reference engine stores them."""
    x = p.args[q]
    return x if p.be.is_complex(x) else p.outputs[k]


class RowStore:
    """Row blocks kept for a failure's decision, each key's rows written, in order, into one
    array allocated at its first block (:meth:`Backend.row_block`, on the rows' device).
    Kept as the separate arrays they were computed in, between a batch's large
    temporaries, they would fragment the C allocator (:mod:`agcheck.core.row_block`: a
    passing forward-mode check of 2,000 inputs peaked at 275-342 MB so, against 155 MB
    written into blocks); where arrays are immutable they are kept as computed, and a key's
    rows computed in one array that holds its memory alone are kept as that array
    (:meth:`Backend.owned_rows`)."""

    def __init__(self, be):
        self.be = be
        self._blocks = {}  # key -> array written in place, or None (rows kept as computed)
        self._parts = {}  # key -> [rows] where there is no block
        self._filled = {}  # key -> rows written in order from row 0 (None after a gap)

    def add(self, key, start: int, rows, n_rows: int) -> None:
        """Rows ``start:start + len(rows)`` of ``key`` (an ``(len, m)`` array); a block
        starting at row 0 starts the key afresh (its rows computed again)."""
        be = self.be
        if start == 0:
            self._filled[key] = 0
            self._parts[key] = []
            # rows computed in one block are that block: a copy would hold them twice
            whole = be.owned_rows(rows) if int(rows.shape[0]) == n_rows else None
            if whole is not None:
                self._blocks[key] = whole
                self._filled[key] = n_rows
                return
            self._blocks[key] = be.row_block(n_rows, int(rows.shape[1]), rows, rows.dtype)
        if self._filled.get(key) != start:
            self._filled[key] = None  # a gap: the key's rows are not all kept
            return
        if self._blocks[key] is not None:
            be.write_rows(self._blocks[key], start, rows)
        else:
            self._parts[key].append(rows)
        self._filled[key] = start + int(rows.shape[0])

    def has(self, key) -> bool:
        return key in self._filled

    def block(self, key, n_rows: int):
        """``key``'s ``(n_rows, m)`` block as the backend's array, or ``None`` unless all
        its rows were kept in one."""
        return self._blocks.get(key) if self._filled.get(key) == n_rows else None

    def whole(self, key, n_rows: int) -> np.ndarray | None:
        """``key``'s ``(n_rows, m)`` rows as NumPy (the kept block itself where it is
        one), or ``None`` unless all of them were kept."""
        if self._filled.get(key) != n_rows:
            return None
        block = self._blocks[key]
        if block is not None:
            return self.be.to_numpy(block)
        return np.concatenate([self.be.to_numpy(r) for r in self._parts[key]], axis=0)


class KeptRows:
    """Every numerical row block the engine computes, per checked input and floating
    output, written into one block each (:class:`RowStore`)."""

    def __init__(self, p):
        self.p = p
        self._store = RowStore(p.be)
        #: inputs whose kept rows were all compared, and agreed, with every output's
        self.passed = set()
        self._bounds = {}  # per input, the row blocks kept, in order

    def add(self, q, start, stop, rows) -> None:
        if start == 0:  # the input's rows computed again (after a path that gave way)
            self.passed.discard(q)
            self._bounds[q] = []
        self._bounds.setdefault(q, []).append((start, stop))
        n = self.p.be.numel(self.p.args[q])
        for k in self.p.floats:
            self._store.add((q, k), start, rows[k], n)

    def remember(self, q) -> None:
        """Leave input ``q``'s rows, if all were kept in blocks, for the forward-mode pass
        of the same check (:mod:`agcheck.core.numerical_memo`)."""
        p = self.p
        n = p.be.numel(p.args[q])
        blocks = {k: self._store.block((q, k), n) for k in p.floats}
        if n and all(b is not None for b in blocks.values()):
            p.run.numerical_memo.put(p.fn, p.args, q, MemoRows(blocks, list(self._bounds[q]), p.all_rows_exact(q)))

    def has(self, q) -> bool:
        return any(self._store.has((q, k)) for k in self.p.floats)

    def arrays(self) -> dict | None:
        """``{input position: {output position: (n, m) NumPy rows}}``, or ``None`` unless
        every checked input's rows were all kept."""
        p, whole = self.p, {}
        for q in p.checked:
            n = p.be.numel(p.args[q])
            whole[q] = {k: self._store.whole((q, k), n) for k in p.floats}
            if not n or any(rows is None for rows in whole[q].values()):
                return None
        return whole


def decide(p, diff, analytical, kept: KeptRows, where, exact_columns) -> Outcome | None:
    """The undecided outcome that hands the reference engine whole Jacobians leading it to
    its own verdict and message (see the module's docstring), or ``None`` when the
    mismatch is not confirmed that way.

    ``analytical`` is ``{output position: [DenseBlock per checked input]}``, reentrancy
    checked; ``where`` is ``(input position, output position, start, stop)``, the kept
    row block seen to differ; ``exact_columns(k, c0, c1)`` computes output ``k``'s
    columns ``c0:c1`` one VJP each (per checked input, ``(n, c1 - c0)``)."""
    be, run = p.be, p.run
    numerical = kept.arrays()
    if numerical is None:
        return _unconfirmed(run, "rows missing")
    exact_rows = _overlay_exact_rows(p, numerical)
    exact_cols = _overlay_exact_columns(p, diff, analytical)
    failing = _first_failing(p, diff, lambda i, j: analytical[diff[i]][j].by_input, numerical, kept.passed, where)
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
    for c0, c1 in _runs([x for x in cols if not exact_cols[k][x]]):
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
    return undecided("Jacobian mismatch", _whole_rows(p, numerical), columns, whole=True, inexact=inexact)


def decide_forward(p, diff, jvp_rows, kept: KeptRows, where) -> Outcome | None:
    """:func:`decide` for a forward-mode check: the undecided outcome that hands the
    reference engine whole Jacobians (numerical rows, and JVP rows as
    ``{input index: [per floating output matrix]}``) leading it to its own verdict and
    message, or ``None`` when the mismatch is not confirmed so.

    In forward mode both sides are computed by rows (an input element moved, one JVP
    along it), so the entries the message prints are exact once the printed rows (and
    the worst entry's) are computed as the reference engine computes them, on both sides.
    ``jvp_rows`` is a :class:`RowStore` of the JVP rows keyed ``(input index, floating
    output index)``, as batched; ``where`` the row block seen to differ."""
    be, run, opts = p.be, p.run, p.run.opts
    numerical = kept.arrays()
    analytical = _whole_jvp_rows(p, jvp_rows)
    if numerical is None or analytical is None:
        return _unconfirmed(run, "rows missing")
    exact_rows = _overlay_exact_rows(p, numerical)
    failing = _first_failing(p, diff, lambda i, j: analytical[j][i], numerical, kept.passed, where)
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
    return undecided("Jacobian mismatch", _whole_rows(p, numerical), whole, whole=True, inexact=inexact)


def _all_set(flags: dict) -> bool:
    return all(f.all() for f in flags.values())


def _confirmed(run, i, j, exact_rows, exact_columns) -> None:
    run.engine_log.append(EngineEvent("failure", "confirmed", j, f"output {i}", figures={
        "exact_rows": exact_rows, "exact_columns": exact_columns}))


def _whole_rows(p, numerical) -> dict:
    """The kept numerical rows as the reference engine takes them: per input, one block."""
    be = p.be
    return {x: [(0, be.numel(p.args[x]), {k: be.array_like(numerical[x][k], _like(p, x, k)) for k in p.floats})]
            for x in p.checked}


def _worst_entry(p, a, n, where, block) -> tuple[int, int]:
    """``(row, column)`` of the entry of ``a`` (against ``n``) exceeding ``atol + rtol |n|``
    the most (any NaN first), within the row block seen to differ where it is ``block``'s."""
    start, stop = where[2:] if block == where[:2] else (0, a.shape[0])
    opts = p.run.opts
    with np.errstate(invalid="ignore", over="ignore"):
        excess = np.abs(a[start:stop] - n[start:stop]) - (opts.atol + opts.rtol * np.abs(n[start:stop]))
    excess = np.where(np.isnan(excess), np.inf, excess)
    r, c = np.unravel_index(int(np.argmax(excess)), excess.shape)
    return int(r) + start, int(c)


def _compute_exact_rows(p, q, rows, numerical, exact_rows) -> None:
    """Input ``q``'s ``rows`` not yet exact, computed as the reference engine computes them,
    in place in ``numerical``."""
    for start, stop in _runs([x for x in rows if not exact_rows[q][x]]):
        for s, e, computed in p.rows_element_by_element(q, start, stop):
            for k in p.floats:
                numerical[q][k][s:e] = p.be.to_numpy(computed[k])
            exact_rows[q][s:e] = True


def _compute_exact_jvps(p, j, rows, analytical, exact_jvps) -> bool:
    """Input ``p.checked[j]``'s JVP ``rows``, computed as the reference engine computes them,
    in place in ``analytical``; False where the outputs changed."""
    be, opts = p.be, p.run.opts
    for s, e in _runs(rows):
        exact = p.run.user_errors.call(jac.analytical_rows_forward, be, p.fn, p.args, p.checked, j, range(s, e),
                                       check_grad_dtypes=opts.check_grad_dtypes)
        if exact is None or len(exact) != len(p.floats):
            return False
        for ii, block in enumerate(exact):
            analytical[j][ii][s:e] = be.to_numpy(block).reshape(e - s, -1)
        exact_jvps[j][s:e] = True
    return True


def _overlay_exact_columns(p, diff, analytical) -> dict:
    """Lays the columns the engine computed as the reference engine does over the
    ``analytical`` Jacobians (in place); per output, which columns are so exact."""
    exact_cols = {k: np.zeros(p.be.numel(p.outputs[k]), dtype=bool) for k in diff}
    for k, (ranges, rows) in (p.exact_analytical() or {}).items():
        for c0, c1 in ranges if k in exact_cols else ():
            for block, r in zip(analytical[k], rows):
                block.by_output[c0:c1] = r[c0:c1]
            exact_cols[k][c0:c1] = True
    return exact_cols


def _overlay_exact_rows(p, numerical) -> dict:
    """Lays the rows the engine computed as the reference engine does over the kept
    ``numerical`` rows (in place); per input, which rows are so exact."""
    be = p.be
    exact_rows = {q: np.zeros(be.numel(p.args[q]), dtype=bool) for q in p.checked}
    for q, blocks in (p.exact_numerical() or {}).items():
        for start, stop, rows in blocks:
            for k in p.floats:
                numerical[q][k][start:stop] = be.to_numpy(rows[k])
            exact_rows[q][start:stop] = True
    return exact_rows


def _whole_jvp_rows(p, jvp_rows: RowStore) -> dict | None:
    """``{input index: [per floating output (n, m) NumPy matrix]}`` from the kept JVP
    rows, or ``None`` unless every row was kept."""
    whole = {}
    for j, q in enumerate(p.checked):
        n = p.be.numel(p.args[q])
        whole[j] = [jvp_rows.whole((j, i), n) for i in range(len(p.floats))]
        if not n or any(rows is None for rows in whole[j]):
            return None
    return whole


def _unconfirmed(run, why: str) -> None:
    run.engine_log.append(EngineEvent("failure", "unconfirmed", None, why))
    return None


def _first_failing(p, diff, analytical, numerical, passed, where) -> tuple[int, int] | None:
    """``(output index, input index)`` of the first block in torch's order whose
    Jacobians (``analytical(i, j)``, ``numerical[q][k]``) differ (torch's rule, as the
    engine's passes apply it): blocks of the ``passed`` inputs agree, the block of
    ``where`` differs, the others are compared."""
    opts = p.run.opts
    for i, k in enumerate(diff):
        for j, q in enumerate(p.checked):
            if q not in passed and ((q, k) == where[:2] or not allclose_like_torch(
                    analytical(i, j), numerical[q][k], opts.rtol, opts.atol)):
                return i, j
    return None


def _moved_first_failing(p, diff, analytical, numerical, failing, rows, cols) -> bool:
    """Whether a block before ``failing`` in torch's order fails once ``rows`` of its
    input and ``cols`` of its output are computed again: the other blocks sharing them."""
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


def _runs(indices) -> list[tuple[int, int]]:
    """Sorted indices as ``(start, stop)`` runs of consecutive ones."""
    runs = []
    for x in indices:
        if runs and runs[-1][1] == x:
            runs[-1] = (runs[-1][0], x + 1)
        else:
            runs.append((x, x + 1))
    return runs
