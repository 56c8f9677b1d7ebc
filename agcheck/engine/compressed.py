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

from agcheck.engine import cost
from agcheck.core.outcome import EngineEvent

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


class NotCompressible(Exception):
    """The hypothesis does not hold or does not pay; the exact engine takes over."""


def bits_for(n: int) -> int:
    return max(1, math.ceil(math.log2(max(n, 2))))


def index_signs(count: int, n_rounds: int, rng) -> np.ndarray:
    """(n_rounds, count) signs: all +1, then one round per index bit, then random."""
    signs = np.empty((n_rounds, count), dtype=np.int8)
    signs[0] = 1
    index = np.arange(count)
    b = 0
    for r in range(1, n_rounds):
        if b < bits_for(count) and (1 << b) < count:
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


class CompressedSides:
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
        bits = bits_for(n)
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
                raise NotCompressible("an output element depends on several input elements")
            empty = ~either.any(axis=0)
            if not (empty | either.all(axis=0)).all():
                raise NotCompressible("dependence not seen consistently")
            dep = (high.astype(np.int64) << np.arange(bits)[:, None]).sum(axis=0)
            dep[empty] = -1
            if (dep >= n).any():
                raise NotCompressible("dependence decoded out of range")
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

        return self.evaluate(q, move_rows, signs.shape[0] * points, reduce=stencil_reduce(stencil, eps), group=points)

    def evaluate(self, q, move_rows, n_rows, reduce=None, group=1, after_chunk=None) -> dict:
        """``{k: NumPy array}``: ``fn`` at ``n_rows`` moves of ``args[q]``, one row per move
        (``(n_rows, m)``), or per ``group`` of moves when ``reduce`` combines each group.

        ``move_rows(start, stop, as_deltas)`` builds moves ``start:stop`` as flat NumPy rows:
        the moved input, or (``as_deltas``) the move itself. Moves are built and evaluated a
        chunk at a time, in vmapped batches that fit the memory budget; where ``args[q]``
        cannot be batched, one plain call per move, moving the input by its delta.
        ``after_chunk(seconds_per_move, moves_left)``, when given, is told what each chunk
        cost a move when more chunks follow (it may raise :class:`NotCompressible`); the
        chunks then start at ``cost.RAMP[-1]`` moves and double, so that a pass that
        gives way has paid little."""
        be, p = self.be, self.p
        x = p.args[q]
        batched = p.batched_ok(q)
        per_row = max((be.numel(x) + p.out_numel) * p.itemsize * 4, p.copy_bytes(q))
        size = max(1, p.batch_bytes // max(per_row, 1))
        size = max(group, size // group * group)
        chunk = size if after_chunk is None else max(group, min(size, cost.RAMP[-1] // group * group))
        parts = {k: [] for k in self.diff}
        start = 0
        while start < n_rows:
            stop = min(n_rows, start + chunk)
            watch = p.run.stopwatch()
            if batched:
                rows = move_rows(start, stop, False)
                stacked = be.reshape(be.array_like(rows, x), (stop - start, *x.shape))
                outs = p.evaluate(q, stacked)
                outs = {k: be.to_numpy(outs[k]).reshape(stop - start, -1) for k in self.diff}
            else:
                outs = p.evaluate_looped(q, move_rows(start, stop, True), self.diff)
            for k in self.diff:
                parts[k].append(outs[k] if reduce is None else reduce(outs[k]))
            if stop < n_rows and after_chunk is not None:
                after_chunk(watch.seconds() / (stop - start), n_rows - stop)
            start, chunk = stop, min(size, 2 * chunk)
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
        # a few dozen VJPs: batched, unless the first batched one would pay a one-time
        # setup (torch: importing sympy, 0.3-0.7 s) that plain VJPs have not yet cost
        batched = cost.setup_worth_paying(be.batched_vjp_setup_cost(self.p.trace))
        watch = self.p.run.stopwatch()
        try:
            grads = self.p.vjps(k, stacked, n_rounds * n_colours, batched=batched)
        except ValueError as e:
            if e in self.p.run.user_errors:
                raise
            raise NotCompressible(str(e)) from None
        if not batched:
            cost.spent_instead_of_setup(watch.seconds())
        result = []
        for g, q in zip(grads, self.checked):
            x = self.p.args[q]
            n = be.numel(x)
            if g is None:
                result.append(np.zeros((n_rounds, n_colours, n), dtype=be.to_numpy(x).dtype))
                continue
            if tuple(g.shape) != (n_rounds * n_colours, *x.shape) or g.dtype != x.dtype:
                raise NotCompressible("gradient of unexpected shape or dtype")
            result.append(be.to_numpy(be.to_dense(g)).reshape(n_rounds, n_colours, n))
        return result


def stencil_reduce(stencil, eps):
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


def all_small(values, bound) -> bool:
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
    compressed = sum(2 * bits_for(be.numel(p.args[q])) + 1 for q in checked) + n_rounds * (
        points * len(checked) + 2 * colours)
    return compressed * _MIN_SAVING <= exact


def try_compressed_reverse(p, checked, diff) -> bool:
    """Decide a slow reverse-mode comparison by compressed differences if it holds.

    Returns True when every entry matched in every round; False when the hypothesis
    does not apply, does not pay, or anything disagreed (the exact engine then decides)."""
    be, run = p.be, p.run
    entries = sum(be.numel(p.args[q]) for q in checked) * sum(be.numel(p.outputs[k]) for k in diff)
    if entries < MIN_ENTRIES:
        return False
    side = CompressedSides(p, checked, diff)
    try:
        patterns = {q: side.probe(q) for q in checked}
        n_rounds = 1 + max(bits_for(be.numel(x)) for x in [p.args[q] for q in checked] + [p.outputs[k] for k in diff])
        n_rounds += RANDOM_ROUNDS
        points = len(run.stencil.offsets) * (2 if any(be.is_complex(p.args[q]) for q in checked) else 1)
        if not _worth_it(p, checked, diff, patterns, n_rounds, points):
            run.engine_log.append(EngineEvent("compressed", "declined", None, "not worth it"))
            return False
        ok, why = _check(side, patterns, n_rounds)
    except NotCompressible as reason:
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
        col_signs[q] = index_signs(p.be.numel(p.args[q]), n_rounds, side.rng)
        numerical[q] = side.numerical(q, col_signs[q])
    for k in side.diff:
        m = p.be.numel(side.outputs[k])
        row_signs = index_signs(m, n_rounds, side.rng)
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
                with np.errstate(invalid="ignore", over="ignore"):
                    apart = first[j].size and np.max(np.abs(first[j] - second[j])) > opts.nondet_tol
                if apart:
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
    if not all_small(num[:, empty_rows], atol):
        return False, "numerical derivative where none was expected"
    filled = np.zeros(ana.shape[1:], dtype=bool)
    filled[colour, dep] = True
    if not all_small(ana[:, ~filled], atol):
        return False, "analytical derivative where none was expected"
    if not all_small(n_entries - n_entries[:1], tau) or not all_small(a_entries - a_entries[:1], tau):
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
    side = CompressedSides(p, checked, p.floats)
    try:
        patterns = {q: side.probe(q) for q in checked}
        n_rounds = 1 + max(bits_for(be.numel(p.args[q])) for q in checked) + RANDOM_ROUNDS
        exact = sum(2 * be.numel(p.args[q]) for q in checked)
        compressed = sum(2 * bits_for(be.numel(p.args[q])) + 1 + 3 * n_rounds for q in checked)
        if compressed * _MIN_SAVING > exact:
            run.engine_log.append(EngineEvent("compressed", "declined", None, "not worth it"))
            return False
        for j, q in enumerate(checked):
            signs = index_signs(be.numel(p.args[q]), n_rounds, side.rng)
            numerical = side.numerical(q, signs)
            analytical = jvp_signed(j, signs)
            if len(analytical) != len(p.floats):
                raise NotCompressible("outputs changed")
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
                if not all_small(num[:, empty], opts.atol) or not all_small(ana[:, empty], opts.atol):
                    return _forward_done(run, False, "derivative where none was expected")
                tau = opts.atol / 2
                if not all_small(n_entries - n_entries[:1], tau) or not all_small(a_entries - a_entries[:1], tau):
                    return _forward_done(run, False, "rounds disagree")
    except NotCompressible as reason:
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
