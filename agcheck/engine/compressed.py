"""Compressed slow-mode check: every Jacobian entry from a few dozen evaluations.

When each output element of ``fn`` depends on at most one element of an input
(elementwise functions, broadcasting, reshapes, permutations, slicing, indexing), the
input's Jacobian block has at most one nonzero per row. Such a block is determined by
``O(log n)`` evaluations instead of ``2 n``: move *every* element at once, each by ``+eps``
or ``-eps``, and read each output's derivative off the one element it depends on
(Curtis, Powell and Reid's compressed differences, with the sparsity found by probing).
The analytical side is compressed the same way: one VJP sums the rows of a set of output
elements that depend on distinct input elements, so each entry is read off its own slot.

The pattern is a hypothesis, and a wrong pattern or a wrong derivative outside it makes
compressed values sums of several entries. That is what the rounds are for. Every round
moves the elements with other signs (round 0: all ``+``; round ``b``: the sign of bit ``b``
of the element's index; then random signs); a correct pattern gives the same entry in
every round, up to rounding, while a stray entry ``e`` in the sum of entry ``a`` appears
as ``a + e`` in one round and ``a - e`` in another, because two distinct indices differ in
some bit. Every entry must match in every round with torch's tolerances, stray sums where
no entry is expected must be within ``atol``, and rounds must agree to ``atol / 2``.
A single stray entry per row or slot is therefore always caught; several stray entries
that cancel in every round survive each random round with probability at most one half.

This path can only pass a check: the caller runs the exact engine when it returns
``False`` (pattern not found, not worth it, or any disagreement), and the exact engine
hands every failure to the reference engine, which gives torch's verdict and message.
"""
from __future__ import annotations

import math

import numpy as np

from agcheck.engine.outcome import EngineEvent

__all__ = ["try_compressed_reverse", "try_compressed_forward", "MIN_ENTRIES", "RANDOM_ROUNDS"]

#: Jacobians smaller than this (entries, summed over inputs) are left to the exact engine
MIN_ENTRIES = 1 << 16
#: rounds with random signs after the bit rounds
RANDOM_ROUNDS = 12
#: how much cheaper (in evaluations plus VJPs) compression must be to be tried
_MIN_SAVING = 4
#: relative size of the probe's moves
_PROBE_STEP = 2.0 ** -6
SIGN_SEED = 8191


class _NotCompressible(Exception):
    """The hypothesis does not hold or does not pay; the exact engine takes over."""


def _bits(n: int) -> int:
    return max(1, math.ceil(math.log2(max(n, 2))))


def _index_signs(count: int, n_rounds: int, rng) -> np.ndarray:
    """(n_rounds, count) signs: all +1, then one round per index bit, then random."""
    signs = np.empty((n_rounds, count), dtype=np.int8)
    signs[0] = 1
    index = np.arange(count)
    b = 0
    for r in range(1, n_rounds):
        if b < _bits(count) and (1 << b) < count:
            signs[r] = 1 - 2 * ((index >> b) & 1)
            b += 1
        else:
            signs[r] = 1 - 2 * rng.integers(0, 2, size=count)
    return signs


def _changed(base: np.ndarray, moved: np.ndarray) -> np.ndarray:
    same = (moved == base) | (np.isnan(moved) & np.isnan(base))
    return ~same


class _Pattern:
    """Which element of one input each output element depends on (``-1``: none)."""

    def __init__(self, dep: np.ndarray, n_in: int):
        self.dep = dep
        self.n_in = n_in
        rows = np.flatnonzero(dep >= 0)
        order = rows[np.argsort(dep[rows], kind="stable")]
        sorted_dep = dep[order]
        starts = np.r_[0, np.flatnonzero(np.diff(sorted_dep)) + 1] if len(order) else np.zeros(0, dtype=int)
        run_start = np.zeros(len(order), dtype=np.int64)
        if len(order):
            run_start[starts] = starts
            run_start = np.maximum.accumulate(run_start)
        colour = np.zeros(len(dep), dtype=np.int64)
        colour[order] = np.arange(len(order)) - run_start
        #: colour of each output element: outputs sharing an input element differ
        self.colour = colour
        self.n_colours = int(colour.max()) + 1 if len(colour) else 1
        self.rows = rows


class _Side:
    """The compressed check of one piece, reverse mode."""

    def __init__(self, p, checked, diff):
        self.p, self.be, self.opts, self.run = p, p.be, p.opts, p.run
        self.checked, self.diff = checked, diff
        self.outputs = p.outputs
        self.rng = np.random.default_rng(SIGN_SEED)

    # -- the hypothesis -----------------------------------------------------------------
    def probe(self, q) -> dict:
        """``{output k: _Pattern}`` for input ``args[q]``, found by moving halves of it."""
        be, x = self.be, self.p.args[q]
        n = be.numel(x)
        xs = be.to_numpy(x).reshape(-1)
        step = _PROBE_STEP * np.maximum(np.abs(xs), 1.0)
        bits = _bits(n)
        index = np.arange(n)
        masks = [np.zeros(n)]
        for b in range(bits):
            on = ((index >> b) & 1).astype(float)
            masks += [on, 1.0 - on]
        masks = np.stack(masks)

        def move_rows(start, stop, as_deltas):
            deltas = (step * masks[start:stop]).astype(xs.dtype, copy=False)
            return deltas if as_deltas else (xs + deltas).astype(xs.dtype, copy=False)

        outs = self.evaluate(q, move_rows, len(masks))
        patterns = {}
        for k in self.diff:
            o = outs[k]
            base = o[0]
            high = _changed(base, o[1::2])
            low = _changed(base, o[2::2])
            either = high | low
            if (high & low).any():
                raise _NotCompressible("an output element depends on several input elements")
            empty = ~either.any(axis=0)
            if not (empty | either.all(axis=0)).all():
                raise _NotCompressible("dependence not seen consistently")
            dep = (high.astype(np.int64) << np.arange(bits)[:, None]).sum(axis=0)
            dep[empty] = -1
            if (dep >= n).any():
                raise _NotCompressible("dependence decoded out of range")
            patterns[k] = _Pattern(dep, n)
        return patterns

    # -- numerical side -----------------------------------------------------------------
    def numerical(self, q, signs) -> dict:
        """``{k: (R, m) array}``: difference quotients along the signed all-element moves."""
        be, x, run = self.be, self.p.args[q], self.run
        eps, stencil = run.eps_for(x), run.stencil
        n_rounds = signs.shape[0]
        xs = be.to_numpy(x).reshape(-1)
        rows = self._difference(q, xs, signs, eps, stencil)
        if np.iscomplexobj(xs):
            imag = self._difference(q, xs, signs, eps * 1j, stencil)
            rows = {k: (rows[k] + imag[k] * 1j).astype(xs.dtype) for k in rows}
        return {k: v.reshape(n_rounds, -1) for k, v in rows.items()}

    def _difference(self, q, xs, signs, step, stencil) -> dict:
        eps = self.run.eps_for(self.p.args[q])
        points = len(stencil.offsets)
        offsets = np.asarray(stencil.offsets)

        def move_rows(start, stop, as_deltas):
            # row i: round i // points, stencil point i % points; every element moves by
            # +h or -h, as the sequential perturbation moves one: x + h or x - h
            # (x + (-h) is x - h exactly, so a looped evaluation by deltas agrees)
            i = np.arange(start, stop)
            m = offsets[i % points]
            h = np.where(np.abs(m) == 1, step, np.abs(m) * step).astype(xs.dtype)[:, None]
            deltas = np.where((signs[i // points] > 0) == (m > 0)[:, None], h, -h)
            return deltas if as_deltas else xs + deltas

        return self.evaluate(q, move_rows, signs.shape[0] * points, reduce=_stencil_reduce(stencil, eps), group=points)

    def evaluate(self, q, move_rows, n_rows, reduce=None, group=1) -> dict:
        """``{k: NumPy array}``: ``fn`` at ``n_rows`` moves of ``args[q]``, one row per move
        (``(n_rows, m)``), or per ``group`` of moves when ``reduce`` combines each group.

        ``move_rows(start, stop, as_deltas)`` builds moves ``start:stop`` as flat NumPy rows:
        the moved input, or (``as_deltas``) the move itself. Moves are built and evaluated a
        chunk at a time, in vmapped batches that fit the memory budget; where ``args[q]``
        cannot be batched, one plain call per move, moving the input by its delta."""
        be, p = self.be, self.p
        x = p.args[q]
        batched = p.batched_ok(q)
        per_row = (be.numel(x) + p.out_numel) * p.itemsize * 4
        size = max(1, (p.budget // 4) // max(per_row, 1))
        size = max(group, size // group * group)
        parts = {k: [] for k in self.diff}
        for start in range(0, n_rows, size):
            stop = min(n_rows, start + size)
            if batched:
                chunk = move_rows(start, stop, False)
                stacked = be.reshape(be.array_like(chunk, x), (stop - start, *x.shape))
                outs = be.evaluate_batch(p.fn, p.args, q, stacked)
                outs = {k: be.to_numpy(outs[k]).reshape(stop - start, -1) for k in self.diff}
            else:
                outs = p.evaluate_looped(q, move_rows(start, stop, True), self.diff)
            for k in self.diff:
                parts[k].append(outs[k] if reduce is None else reduce(outs[k]))
        return {k: np.concatenate(v) if len(v) > 1 else v[0] for k, v in parts.items()}

    # -- analytical side ----------------------------------------------------------------
    def analytical(self, k, colour, n_colours, signs) -> list:
        """Per checked input, ``(R, n_colours, n_q)``: VJPs of the signed colour classes."""
        be, out = self.be, self.outputs[k]
        n_rounds, m = signs.shape
        cot = np.zeros((n_rounds, n_colours, m))
        cot[:, colour, np.arange(m)] = signs
        out_np_dtype = be.to_numpy(out).dtype
        stacked = be.reshape(be.array_like(cot.reshape(n_rounds * n_colours, m).astype(out_np_dtype), out),
                             (n_rounds * n_colours, *out.shape))
        grads = self.p.trace.vjp_batched(k, stacked)
        result = []
        for g, q in zip(grads, self.checked):
            x = self.p.args[q]
            n = be.numel(x)
            if g is None:
                result.append(np.zeros((n_rounds, n_colours, n), dtype=be.to_numpy(x).dtype))
                continue
            if tuple(g.shape) != (n_rounds * n_colours, *x.shape) or g.dtype != x.dtype:
                raise _NotCompressible("gradient of unexpected shape or dtype")
            result.append(be.to_numpy(be.to_dense(g)).reshape(n_rounds, n_colours, n))
        return result


def _stencil_reduce(stencil, eps):
    """Combines each run of ``len(stencil.offsets)`` evaluations into a derivative."""
    points = len(stencil.offsets)

    def reduce(o):
        o = o.reshape(-1, points, o.shape[-1])
        return stencil.combine([o[:, i] for i in range(points)], eps)

    return reduce


def allclose_like_torch(a, b, rtol, atol) -> bool:
    """torch.allclose's rule, |a - b| <= atol + rtol |b|, on NumPy arrays."""
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape:
        return False
    return bool(np.allclose(a, b, rtol=rtol, atol=atol, equal_nan=False))


_close = allclose_like_torch


def _small(values, bound) -> bool:
    return not values.size or bool(np.all(np.abs(values) <= bound))


def _worth_it(p, checked, diff, patterns, n_rounds, points) -> bool:
    """Compressed work (evaluations plus VJPs) at least ``_MIN_SAVING`` times below the
    exact engine's, and its largest batch of cotangents within the memory budget."""
    be = p.be
    m_total = sum(be.numel(p.outputs[k]) for k in diff)
    exact = sum(2 * be.numel(p.args[q]) for q in checked) + 2 * m_total
    colours = 0
    for k in diff:
        m = be.numel(p.outputs[k])
        widest = max(patterns[q][k].n_colours for q in checked)
        if n_rounds * widest * m * p.itemsize > p.budget // 4:
            return False
        colours += sum(patterns[q][k].n_colours for q in checked)
    compressed = sum(2 * _bits(be.numel(p.args[q])) + 1 for q in checked) + n_rounds * (
        points * len(checked) + 2 * colours)
    return compressed * _MIN_SAVING <= exact


def try_compressed_reverse(p, checked, diff) -> bool:
    """Decide a slow reverse-mode comparison by compressed differences if it holds.

    Returns True when every entry matched in every round; False when the hypothesis
    does not apply, does not pay, or anything disagreed (the exact engine then decides)."""
    be, opts, run = p.be, p.opts, p.run
    entries = sum(be.numel(p.args[q]) for q in checked) * sum(be.numel(p.outputs[k]) for k in diff)
    if entries < MIN_ENTRIES:
        return False
    side = _Side(p, checked, diff)
    try:
        patterns = {q: side.probe(q) for q in checked}
        n_rounds = 1 + max(_bits(be.numel(x)) for x in [p.args[q] for q in checked] + [p.outputs[k] for k in diff])
        n_rounds += RANDOM_ROUNDS
        points = len(run.stencil.offsets) * (2 if any(be.is_complex(p.args[q]) for q in checked) else 1)
        if not _worth_it(p, checked, diff, patterns, n_rounds, points):
            run.engine_log.append(EngineEvent("compressed", "declined", None, "not worth it"))
            return False
        ok, why = _check(side, patterns, n_rounds)
    except _NotCompressible as reason:
        run.engine_log.append(EngineEvent("compressed", "declined", None, f"not compressible: {reason}"))
        return False
    except Exception as reason:  # noqa: BLE001 - the exact engine meets it again, and reports it
        if reason in run.user_errors:
            raise
        run.engine_log.append(EngineEvent("compressed", "declined", None, f"{type(reason).__name__}: {reason}"))
        return False
    run.engine_log.append(EngineEvent("compressed", "passed") if ok else EngineEvent("compressed", "disagreement", None, why))
    return ok


def _check(side, patterns, n_rounds):
    p, opts = side.p, side.opts
    rtol, atol, tau = opts.rtol, opts.atol, opts.atol / 2
    numerical = {}
    col_signs = {}
    for q in side.checked:
        col_signs[q] = _index_signs(p.be.numel(p.args[q]), n_rounds, side.rng)
        numerical[q] = side.numerical(q, col_signs[q])
    for k in side.diff:
        m = p.be.numel(side.outputs[k])
        row_signs = _index_signs(m, n_rounds, side.rng)
        # VJPs are shared by inputs whose colourings coincide
        by_colouring = {}
        for q in side.checked:
            pat = patterns[q][k]
            by_colouring.setdefault(pat.colour.tobytes(), (pat, []))[1].append(q)
        for pat, qs in by_colouring.values():
            first = side.analytical(k, pat.colour, pat.n_colours, row_signs)
            second = side.analytical(k, pat.colour, pat.n_colours, row_signs)
            for j, q in enumerate(side.checked):
                if q not in qs:
                    continue
                if first[j].size and np.max(np.abs(first[j] - second[j])) > opts.nondet_tol:
                    return False, "backward not reentrant"
                ok, why = _compare_block(patterns[q][k], numerical[q][k], first[j], col_signs[q], row_signs,
                                         rtol, atol, tau)
                if not ok:
                    return False, f"output {k}, input {q}: {why}"
    return True, ""


def _compare_block(pat, num, ana, col_signs, row_signs, rtol, atol, tau):
    """One (output, input) block: ``num`` (R, m) compressed differences, ``ana``
    (R, colours, n) compressed VJPs."""
    rows = pat.rows
    empty_rows = np.flatnonzero(pat.dep < 0)
    dep = pat.dep[rows]
    colour = pat.colour[rows]
    # numerical entry of row i: the compressed difference unsigned by its element's sign
    n_entries = num[:, rows] * col_signs[:, dep]
    a_entries = ana[:, colour, dep] * row_signs[:, rows]
    if not _close(a_entries, n_entries, rtol, atol):
        return False, "entries differ"
    if not _small(num[:, empty_rows], atol):
        return False, "numerical derivative where none was expected"
    filled = np.zeros(ana.shape[1:], dtype=bool)
    filled[colour, dep] = True
    if not _small(ana[:, ~filled], atol):
        return False, "analytical derivative where none was expected"
    if not _small(n_entries - n_entries[:1], tau) or not _small(a_entries - a_entries[:1], tau):
        return False, "rounds disagree"
    return True, ""


def try_compressed_forward(p, checked, diff, jvp_signed) -> bool:
    """Forward-mode counterpart: the analytical side is a JVP along the same signed
    all-element moves, read off like the numerical side. ``jvp_signed(j, signs)`` returns
    per floating output an ``(R, m)`` NumPy array."""
    be, opts, run = p.be, p.opts, p.run
    if not all(p.batched_ok(q) for q in checked):
        return False
    if any(be.is_complex(p.args[q]) for q in checked):
        return False  # forward-mode rows of complex inputs pair two directions; the exact engine does it
    entries = sum(be.numel(p.args[q]) for q in checked) * sum(be.numel(p.outputs[k]) for k in p.floats)
    if entries < MIN_ENTRIES:
        return False
    side = _Side(p, checked, p.floats)
    try:
        patterns = {q: side.probe(q) for q in checked}
        n_rounds = 1 + max(_bits(be.numel(p.args[q])) for q in checked) + RANDOM_ROUNDS
        exact = sum(2 * be.numel(p.args[q]) for q in checked)
        compressed = sum(2 * _bits(be.numel(p.args[q])) + 1 + 3 * n_rounds for q in checked)
        if compressed * _MIN_SAVING > exact:
            run.engine_log.append(EngineEvent("compressed", "declined", None, "not worth it"))
            return False
        for j, q in enumerate(checked):
            signs = _index_signs(be.numel(p.args[q]), n_rounds, side.rng)
            numerical = side.numerical(q, signs)
            analytical = jvp_signed(j, signs)
            if len(analytical) != len(p.floats):
                raise _NotCompressible("outputs changed")
            for i, k in enumerate(diff):
                num = numerical[k]
                ana = analytical[i]
                if ana is None:
                    ana = np.zeros_like(num)
                pat = patterns[q][k]
                rows, empty = pat.rows, np.flatnonzero(pat.dep < 0)
                unsign = signs[:, pat.dep[rows]]
                n_entries, a_entries = num[:, rows] * unsign, ana[:, rows] * unsign
                if ana.shape != num.shape or not _close(a_entries, n_entries, opts.rtol, opts.atol):
                    return _forward_done(run, False, "entries differ")
                if not _small(num[:, empty], opts.atol) or not _small(ana[:, empty], opts.atol):
                    return _forward_done(run, False, "derivative where none was expected")
                tau = opts.atol / 2
                if not _small(n_entries - n_entries[:1], tau) or not _small(a_entries - a_entries[:1], tau):
                    return _forward_done(run, False, "rounds disagree")
    except _NotCompressible as reason:
        run.engine_log.append(EngineEvent("compressed", "declined", None, f"not compressible: {reason}"))
        return False
    except Exception as reason:  # noqa: BLE001
        if reason in run.user_errors:
            raise
        run.engine_log.append(EngineEvent("compressed", "declined", None, f"{type(reason).__name__}: {reason}"))
        return False
    return _forward_done(run, True, "")


def _forward_done(run, ok, why):
    run.engine_log.append(EngineEvent("compressed", "passed") if ok else EngineEvent("compressed", "disagreement", None, why))
    return ok


# -- patterns read off the analytical Jacobian ---------------------------------------------
#
# When the analytical Jacobian is computed in full anyway (it fits the memory budget), its
# nonzero pattern tells which input elements never meet in an output element. Those are
# moved together (Curtis-Powell-Reid colouring); the finite differences of each colour
# class give every entry of the pattern, and the rounds of signs expose a numerical
# derivative outside the pattern (a dependence the backward forgot), as above.

class DenseBlock:
    """One analytical Jacobian block held whole, as NumPy, rows by output element.

    ``by_output`` is ``(m, n)`` (output element, input element), C-contiguous, so that
    a block of output columns is written and its pattern read without strided copies;
    ``by_input`` is the ``(n, m)`` view the comparisons use."""

    def __init__(self, by_output: np.ndarray):
        self.by_output = by_output
        self._pattern = None

    @property
    def by_input(self) -> np.ndarray:
        return self.by_output.T

    def pattern(self):
        """``(output indices, input indices)`` of the nonzero (or NaN) entries."""
        if self._pattern is None:
            flat = np.flatnonzero(self.by_output != 0)
            self._pattern = np.divmod(flat, self.by_output.shape[1])
        return self._pattern


def _valid_colouring(colour, rows, cols) -> bool:
    keys = rows.astype(np.int64) * (int(colour.max()) + 1) + colour[cols]
    return int(np.bincount(keys).max()) <= 1


def colour_columns(rows, cols, n_cols, limit):
    """A colouring of the input elements ``cols`` such that no output element (``rows``)
    meets two of one colour; ``None`` if more than ``limit`` colours are needed.

    Strided colourings (element index modulo, or divided by, the widest row) are tried
    first, as they fit banded and blocked patterns with the fewest colours; otherwise
    greedy colouring."""
    if not len(rows):
        return np.zeros(n_cols, dtype=np.int64)
    width = int(np.bincount(rows).max())
    if width <= limit:
        index = np.arange(n_cols)
        for colour in (index % width, index // -(-n_cols // width)):
            if _valid_colouring(colour, rows, cols):
                return colour
    order = np.argsort(cols, kind="stable")
    rows, cols = rows[order], cols[order]
    bounds = np.searchsorted(cols, np.arange(n_cols + 1))
    used = np.zeros((int(rows.max()) + 1 if len(rows) else 1, limit + 1), dtype=bool)
    colour = np.zeros(n_cols, dtype=np.int64)
    for j in range(n_cols):
        r = rows[bounds[j]:bounds[j + 1]]
        if not len(r):
            continue
        free = np.flatnonzero(~used[r].any(axis=0))
        c = int(free[0])
        if c >= limit:
            return None
        colour[j] = c
        used[r, c] = True
    return colour


def _rank_in_class(colour):
    order = np.argsort(colour, kind="stable")
    ranks = np.empty(len(colour), dtype=np.int64)
    sorted_colour = colour[order]
    starts = np.r_[0, np.flatnonzero(np.diff(sorted_colour)) + 1]
    first = np.zeros(len(colour), dtype=np.int64)
    first[starts] = starts
    first = np.maximum.accumulate(first)
    ranks[order] = np.arange(len(colour)) - first
    return ranks


def try_from_analytical(p, checked, diff, analytical) -> bool:
    """Numerical side by coloured compressed differences, against the full analytical
    Jacobian ``analytical[k][j]`` (a :class:`DenseBlock`, input ``checked[j]``, output ``k``).

    True when every pattern entry matched in every round (inputs that cannot be coloured
    are compared row by row, exactly); False otherwise."""
    be, run, opts = p.be, p.run, p.opts
    coloured = 0
    try:
        for j, q in enumerate(checked):
            jac = {k: analytical[k][j] for k in diff}
            try:
                if not _input_from_analytical(p, q, diff, jac):
                    return False
                coloured += 1
            except _NotCompressible as reason:
                # this input's rows exactly, the others' still coloured
                run.engine_log.append(EngineEvent("coloured", "declined", q, f"not compressible: {reason}"))
                for s, e, rows in p.numerical_row_chunks(q, report=False):
                    for k in diff:
                        if not allclose_like_torch(jac[k].by_input[s:e], be.to_numpy(rows[k]), opts.rtol,
                                                   opts.atol):
                            return False
    except Exception as reason:  # noqa: BLE001 - the exact path meets it again
        if reason in run.user_errors:
            raise
        run.engine_log.append(EngineEvent("coloured", "declined", None, f"{type(reason).__name__}: {reason}"))
        return False
    if not coloured:
        # no input could be coloured, and every input's rows, computed exactly, matched
        run.engine_log.append(EngineEvent("exact", "passed", None, "rows against the full analytical Jacobian"))
        return True
    run.engine_log.append(EngineEvent("coloured", "passed"))
    return True


def _input_from_analytical(p, q, diff, jac) -> bool:
    be, run, opts = p.be, p.run, p.opts
    x = p.args[q]
    n = be.numel(x)
    if be.is_complex(x):
        raise _NotCompressible("complex input")
    points = len(run.stencil.offsets)
    rows, cols, offset = [], [], 0
    entries = {k: jac[k].pattern()[::-1] for k in diff}  # input element, output element
    for k in diff:
        c_idx, r_idx = entries[k]
        rows.append(r_idx + offset)
        cols.append(c_idx)
        offset += jac[k].by_output.shape[0]
    rows, cols = np.concatenate(rows), np.concatenate(cols)
    limit = n // 4
    colour = colour_columns(rows, cols, n, limit) if limit else None
    if colour is None:
        raise _NotCompressible("too many colours")
    n_colours = int(colour.max()) + 1
    rank = _rank_in_class(colour)
    n_rounds = 1 + _bits(int(rank.max()) + 1) + RANDOM_ROUNDS
    evaluations = n_rounds * n_colours * points
    if 2 * evaluations > points * n or evaluations * (n + p.out_numel) * p.itemsize > p.budget // 2:
        raise _NotCompressible("not worth it")
    rng = np.random.default_rng(SIGN_SEED)
    rank_signs = _index_signs(int(rank.max()) + 1, n_rounds, rng)
    signs = rank_signs[:, rank]  # (R, n): each element signed by the bits of its rank in its class
    xs = be.to_numpy(x).reshape(-1)
    eps = run.eps_for(x)
    offsets = np.asarray(run.stencil.offsets)
    by_colour = np.argsort(colour, kind="stable")
    colour_size = np.bincount(colour, minlength=n_colours)
    colour_start = np.cumsum(colour_size) - colour_size

    def move_rows(start, stop, as_deltas):
        # row i: round i // (C P), colour (i // P) % C, stencil point i % P; the elements
        # of that colour move by +h or -h by their signs (x + (-h) is x - h to the bit),
        # the others stay
        i = np.arange(start, stop)
        m = offsets[i % points]
        c = (i // points) % n_colours
        sizes = colour_size[c]
        row = np.repeat(np.arange(stop - start), sizes)
        first = np.repeat(np.cumsum(sizes) - sizes, sizes)
        element = by_colour[np.repeat(colour_start[c], sizes) + np.arange(int(sizes.sum())) - first]
        h = np.where(np.abs(m) == 1, eps, np.abs(m) * eps).astype(xs.dtype)[row]
        forward = (signs[(i // (n_colours * points))[row], element] > 0) == (m[row] > 0)
        out = np.zeros((stop - start, n), dtype=xs.dtype) if as_deltas else np.tile(xs, (stop - start, 1))
        out[row, element] += np.where(forward, h, -h)
        return out

    side = _Side(p, [q], diff)
    outs = side.evaluate(q, move_rows, n_rounds * n_colours * points, reduce=_stencil_reduce(run.stencil, eps),
                         group=points)
    tau = opts.atol / 2
    for k in diff:
        diffs = outs[k].reshape(n_rounds, n_colours, -1)  # (R, C, m)
        c_idx, r_idx = entries[k]
        n_entries = diffs[:, colour[c_idx], r_idx] * signs[:, c_idx]
        a_entries = jac[k].by_output[r_idx, c_idx]
        if not _close(np.broadcast_to(a_entries, n_entries.shape), n_entries, opts.rtol, opts.atol):
            run.engine_log.append(EngineEvent("coloured", "disagreement", q, f"output {k}: entries differ"))
            return False
        expected = np.zeros(diffs.shape[1:], dtype=bool)
        expected[colour[c_idx], r_idx] = True
        if not _small(diffs[:, ~expected], opts.atol):
            run.engine_log.append(EngineEvent("coloured", "disagreement", q, f"output {k}: derivative where none expected"))
            return False
        if not _small(n_entries - n_entries[:1], tau):
            run.engine_log.append(EngineEvent("coloured", "disagreement", q, f"output {k}: rounds disagree"))
            return False
    return True
