"""Coloured differences: the numerical side against a full analytical Jacobian.

When the analytical Jacobian is computed in full anyway (it fits the memory budget), its
nonzero pattern tells which input elements never meet in an output element. Those are
moved together (Curtis-Powell-Reid colouring); the finite differences of each colour
class give every entry of the pattern, and the rounds of signs expose a numerical
derivative outside the pattern (a dependence the backward forgot), as in
:mod:`agcheck.engine.compressed`.
"""
from __future__ import annotations

import numpy as np

from agcheck.engine.compressed import RANDOM_ROUNDS, SIGN_SEED, NotCompressible, CompressedSides, bits_for, index_signs, all_small, stencil_reduce, allclose_like_torch
from agcheck.core.outcome import EngineEvent

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

    def widest(self, axis: int) -> int:
        """The most nonzero (or NaN) entries in one output element's row (``axis=1``) or
        one input element's column (``axis=0``): a colouring needs at least that many
        colours, which is known before the pattern's indices are built."""
        if not self.by_output.size:
            return 0
        return int(np.count_nonzero(self.by_output, axis=axis).max())

    def forget_pattern(self) -> None:
        """Rows were written since :meth:`pattern` was read."""
        self._pattern = None

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
    if width > limit:  # the widest row needs that many colours
        return None
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


class RowsDiffer(Exception):
    """Rows computed exactly (element by element, or batched on an input that could not be
    coloured) differ from the analytical Jacobian: the check fails, no other path can
    decide otherwise. ``where`` is ``(input position, output position, start, stop)`` of
    the first row block seen to differ."""

    def __init__(self, q, k, start, stop):
        super().__init__(f"input {q}, output {k}, rows {start}:{stop}")
        self.where = (q, k, start, stop)


def try_from_analytical(p, checked, diff, analytical, kept=None) -> bool:
    """Numerical side by coloured compressed differences, against the full analytical
    Jacobian ``analytical[k][j]`` (a :class:`DenseBlock`, input ``checked[j]``, output ``k``).

    True when every pattern entry matched in every round (inputs that cannot be coloured
    are compared row by row, exactly); False when the colouring could not decide. Raises
    :class:`RowsDiffer` at the first row block that differs, or, given ``kept`` (a
    :class:`~agcheck.engine.failure.KeptRows`, which receives the rows computed), once
    the rest of that input's rows are computed too."""
    be, run, opts = p.be, p.run, p.opts
    coloured = 0
    try:
        for j, q in enumerate(checked):
            jac = {k: analytical[k][j] for k in diff}
            try:
                if not _input_from_analytical(p, q, diff, jac):
                    return False
                coloured += 1
            except NotCompressible as reason:
                # this input's rows exactly, the others' still coloured
                run.engine_log.append(EngineEvent("coloured", "declined", q, f"not compressible: {reason}"))
                differs = None
                for s, e, rows in p.numerical_row_chunks(q, report=False):
                    if kept is not None:
                        kept.add(q, s, e, rows)
                    for k in diff if differs is None else ():
                        if not allclose_like_torch(jac[k].by_input[s:e], be.to_numpy(rows[k]), opts.rtol,
                                                   opts.atol):
                            differs = RowsDiffer(q, k, s, e)
                            break
                    if differs is not None and kept is None:
                        break
                if differs is not None:
                    raise differs
                if kept is not None:
                    kept.passed.add(q)
    except RowsDiffer:
        raise
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
        raise NotCompressible("complex input")
    points = len(run.stencil.offsets)
    limit = n // 4
    if max(jac[k].widest(axis=1) for k in diff) > limit:  # before the pattern's indices
        raise NotCompressible("too many colours")
    rows, cols, offset = [], [], 0
    entries = {k: jac[k].pattern()[::-1] for k in diff}  # input element, output element
    for k in diff:
        c_idx, r_idx = entries[k]
        rows.append(r_idx + offset)
        cols.append(c_idx)
        offset += jac[k].by_output.shape[0]
    rows, cols = np.concatenate(rows), np.concatenate(cols)
    colour = colour_columns(rows, cols, n, limit) if limit else None
    if colour is None:
        raise NotCompressible("too many colours")
    n_colours = int(colour.max()) + 1
    rank = _rank_in_class(colour)
    n_rounds = 1 + bits_for(int(rank.max()) + 1) + RANDOM_ROUNDS
    evaluations = n_rounds * n_colours * points
    if 2 * evaluations > points * n or evaluations * (n + p.out_numel) * p.itemsize > p.budget // 2:
        raise NotCompressible("not worth it")
    rng = np.random.default_rng(SIGN_SEED)
    rank_signs = index_signs(int(rank.max()) + 1, n_rounds, rng)
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

    def give_way(seconds_per_move, moves_left):
        # measured on this pass's own batches, as they grow: a large batch of convolutions
        # costs several times per copy what the batching probe's two copies did
        if p.samples_loop_cheaper(q, seconds_per_move * moves_left):
            raise NotCompressible("the loop moving samples together is cheaper")

    side = CompressedSides(p, [q], diff)
    outs = side.evaluate(q, move_rows, n_rounds * n_colours * points, reduce=stencil_reduce(run.stencil, eps),
                         group=points, after_chunk=give_way)
    tau = opts.atol / 2
    for k in diff:
        diffs = outs[k].reshape(n_rounds, n_colours, -1)  # (R, C, m)
        c_idx, r_idx = entries[k]
        n_entries = diffs[:, colour[c_idx], r_idx] * signs[:, c_idx]
        a_entries = jac[k].by_output[r_idx, c_idx]
        if not allclose_like_torch(np.broadcast_to(a_entries, n_entries.shape), n_entries, opts.rtol, opts.atol):
            run.engine_log.append(EngineEvent("coloured", "disagreement", q, f"output {k}: entries differ"))
            return False
        expected = np.zeros(diffs.shape[1:], dtype=bool)
        expected[colour[c_idx], r_idx] = True
        if not all_small(diffs[:, ~expected], opts.atol):
            run.engine_log.append(EngineEvent("coloured", "disagreement", q, f"output {k}: derivative where none expected"))
            return False
        if not all_small(n_entries - n_entries[:1], tau):
            run.engine_log.append(EngineEvent("coloured", "disagreement", q, f"output {k}: rounds disagree"))
            return False
    return True
