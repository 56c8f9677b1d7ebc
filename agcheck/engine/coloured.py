"""Coloured differences: a Jacobian's entries from a few dozen evaluations.

Input elements that never meet in an output element form a colour class and move together
(Curtis, Powell and Reid), each by ``+h`` or ``-h`` under several sign patterns, so that a
stray entry ``e`` summed into ``a`` shows as ``a + e`` under one and ``a - e`` under another.
One colour where each output element depends on at most one input element, found by
probing (the analytical side is compressed alike); else the colouring of the analytical
Jacobian's pattern. These paths only pass checks: the exact engines decide the rest.
"""
from __future__ import annotations

import time

import numpy as np

from agcheck.core.outcome import EngineEvent
from agcheck.engine.colouring import SIGN_SEED, bits_for, colour_columns, index_signs, rank_in_class

__all__ = ["try_compressed_reverse", "try_compressed_forward", "try_from_analytical", "DenseBlock", "RowsDiffer",
           "allclose_like_torch", "MIN_ENTRIES"]

#: Jacobians of fewer entries (summed over inputs) are left to the exact engine
MIN_ENTRIES = 1 << 16
#: random sign patterns after those of the rank's bits
RANDOM_SIGNS = 12
#: how many times less work (evaluations plus VJPs) compression must take to be tried
_MIN_SAVING = 4
_PROBE_STEP = 2.0 ** -6  # relative size of the probe's moves
_COPY_FACTOR = 4  # bytes of a moved copy's evaluation, in multiples of its input and outputs


class Declined(Exception):
    """No colouring holds, or none pays: the exact engine takes over."""


class RowsDiffer(Exception):
    """Exact rows differ from the analytical Jacobian; ``where``: ``(input, output, start, stop)``."""

    def __init__(self, q, k, start, stop):
        super().__init__(f"input {q}, output {k}, rows {start}:{stop}")
        self.where = (q, k, start, stop)


def allclose_like_torch(a, b, rtol, atol) -> bool:
    """torch.allclose's rule, ``|a - b| <= atol + rtol |b|``, on NumPy arrays."""
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and bool(np.allclose(a, b, rtol=rtol, atol=atol, equal_nan=False))


def _small(values, bound) -> bool:
    return not values.size or bool(np.all(np.abs(values) <= bound))


def _disagreement(n_entries, a_entries, opts, numerical_strays, analytical_strays) -> str:
    """Why the entries read off under every sign pattern do not establish a pass, or ``""``."""
    if not allclose_like_torch(a_entries, n_entries, opts.rtol, opts.atol):
        return "entries differ"
    if not _small(numerical_strays, opts.atol):
        return "numerical derivative where none was expected"
    if not _small(analytical_strays, opts.atol):
        return "analytical derivative where none was expected"
    if not _small(n_entries - n_entries[:1], opts.atol / 2) or not _small(a_entries - a_entries[:1], opts.atol / 2):
        return "sign patterns disagree"
    return ""


def _read_off(compressed, colour, signs, own, other):
    """``(entries, strays)`` of ``compressed`` ``(patterns, colours, size)``: each entry
    ``(own[i], other[i])`` unsigned, and the sums where no entry is."""
    c = 0 if colour is None else colour[own]
    entries = compressed[:, c, other] * signs[:, own]
    expected = np.zeros(compressed.shape[1:], dtype=bool)
    expected[c, other] = True
    return entries, compressed[:, ~expected]


def _attempt(p, path: str, decide, *args) -> bool:
    """Whether ``decide()`` passed (``""``, or the event saying how), logged on ``path``."""
    run = p.run
    try:
        why = decide(*args)  # not through a lambda: one frame less above fn's calls
    except RowsDiffer:
        raise
    except Declined as reason:
        run.engine_log.append(EngineEvent(path, "declined", None, str(reason)))
        return False
    except Exception as reason:  # noqa: BLE001 - the exact engine meets it again, and reports it
        if reason in run.user_errors:
            raise
        run.engine_log.append(EngineEvent(path, "declined", None, f"{type(reason).__name__}: {reason}"))
        return False
    if isinstance(why, EngineEvent):  # passed another way
        run.engine_log.append(why)
        return True
    run.engine_log.append(EngineEvent(path, "disagreement", None, why) if why else EngineEvent(path, "passed"))
    return not why


def _evaluate(p, q, move_rows, n_rows, outputs, reduce=None, group=1) -> dict:
    """``{k: NumPy array}``: ``fn`` at ``n_rows`` moves of ``args[q]`` (``move_rows(start, stop,
    as_deltas)``), a row per move or per ``group`` that ``reduce`` combines; batched, or one
    plain call each where ``args[q]`` cannot be batched."""
    be, x = p.be, p.args[q]
    per_row = (be.numel(x) + p.out_numel) * p.itemsize * _COPY_FACTOR
    batched = p.batched_ok(q)
    size = max(group, p.chunk_rows(per_row, n_rows, q) // group * group)  # MAX_BATCH copies at most, fewer functional
    parts = {k: [] for k in outputs}
    for start in range(0, n_rows, size):
        stop = min(n_rows, start + size)
        if batched:
            began = time.thread_time()
            stacked = be.array_like(move_rows(start, stop, False).reshape(stop - start, *x.shape), x)
            outs = p.evaluators[q](stacked)
            outs = {k: be.to_numpy(outs[k]).reshape(stop - start, -1) for k in outputs}
            # after the first chunk, plain calls where they cost less than batched copies
            batched = start > 0 or not p.plain_calls_cheaper(q, time.thread_time() - began, stop - start)
        else:
            outs = p.evaluate_looped(q, move_rows(start, stop, True), outputs)
        for k in outputs:
            parts[k].append(outs[k] if reduce is None else reduce(outs[k]))
    return {k: np.concatenate(v) if len(v) > 1 else v[0] for k, v in parts.items()}


def _differences(p, q, colour, n_colours, signs, outputs) -> dict:
    """``{k: (patterns, n_colours, m)}``: quotients of ``fn`` along each colour class of
    ``args[q]`` moved by each sign pattern; a complex input's on both axes."""
    stencil, eps = p.run.stencil, p.run.eps_for(p.args[q])
    xs = p.be.to_numpy(p.args[q]).reshape(-1)
    points = len(stencil.offsets)
    n_rows = signs.shape[0] * n_colours * points

    def reduce(o):
        o = o.reshape(-1, points, o.shape[-1])
        return stencil.combine([o[:, i] for i in range(points)], eps)

    # called from this frame, not through a helper: fn's calls one frame below it
    rows = _evaluate(p, q, _signed_moves(xs, stencil, eps, colour, n_colours, signs), n_rows, outputs, reduce, points)
    if np.iscomplexobj(xs):
        imag = _evaluate(p, q, _signed_moves(xs, stencil, eps * 1j, colour, n_colours, signs), n_rows, outputs,
                         reduce, points)
        rows = {k: (rows[k] + imag[k] * 1j).astype(xs.dtype) for k in rows}
    return {k: v.reshape(signs.shape[0], n_colours, -1) for k, v in rows.items()}


def _signed_moves(xs, stencil, step, colour, n_colours, signs):
    """``move_rows(start, stop, as_deltas)`` for :func:`_evaluate`."""
    points, offsets = len(stencil.offsets), np.asarray(stencil.offsets)

    def move_rows(start, stop, as_deltas):
        # row i: sign pattern i // (C P), colour (i // P) % C, stencil point i % P; moves of
        # +h or -h as the reference engine's (x + (-h) is x - h to the bit)
        i = np.arange(start, stop)
        m = offsets[i % points]
        h = np.where(np.abs(m) == 1, step, np.abs(m) * step).astype(xs.dtype)[:, None]
        deltas = np.where((signs[i // (n_colours * points)] > 0) == (m > 0)[:, None], h, -h)
        if n_colours == 1:
            return deltas if as_deltas else xs + deltas
        moved = colour == ((i // points) % n_colours)[:, None]
        return np.where(moved, deltas, 0) if as_deltas else np.where(moved, xs + deltas, xs)

    return move_rows


class _Pattern:
    """Which element of one input each output element depends on (``dep``; ``-1``: none),
    and a colouring of the output elements: those sharing an input element differ."""

    def __init__(self, dep: np.ndarray):
        self.dep = dep
        self.rows = np.flatnonzero(dep >= 0)
        self.colour = np.zeros(len(dep), dtype=np.int64)
        self.colour[self.rows] = rank_in_class(dep[self.rows])
        self.n_colours = int(self.colour.max()) + 1 if len(dep) else 1


def _probe(p, q, outputs) -> dict:
    """``{k: _Pattern}`` for ``args[q]``, found by moving each half of its elements by index
    bit; :class:`Declined` where an output element depends on several."""
    xs = p.be.to_numpy(p.args[q]).reshape(-1)
    n = len(xs)
    step = _PROBE_STEP * np.maximum(np.abs(xs), 1.0)
    bits = bits_for(n)
    on = (np.arange(n)[None, :] >> np.arange(bits)[:, None]) & 1
    masks = np.concatenate([np.zeros((1, n)), np.stack([on, 1 - on], axis=1).reshape(2 * bits, n)])

    def move_rows(start, stop, as_deltas):
        deltas = (step * masks[start:stop]).astype(xs.dtype, copy=False)
        return deltas if as_deltas else (xs + deltas).astype(xs.dtype, copy=False)

    outs = _evaluate(p, q, move_rows, len(masks), outputs)
    patterns = {}
    for k in outputs:
        base = outs[k][0]  # changed: neither equal nor both NaN
        high, low = (~((o == base) | np.isnan(o) & np.isnan(base)) for o in (outs[k][1::2], outs[k][2::2]))
        either = high | low
        if (high & low).any():
            raise Declined("not compressible: an output element depends on several input elements")
        empty = ~either.any(axis=0)
        if not (empty | either.all(axis=0)).all():
            raise Declined("not compressible: dependence not seen consistently")
        dep = (high.astype(np.int64) << np.arange(bits)[:, None]).sum(axis=0)
        dep[empty] = -1
        if (dep >= n).any():
            raise Declined("not compressible: dependence decoded out of range")
        patterns[k] = _Pattern(dep)
    return patterns


def try_compressed_reverse(p, checked, diff) -> bool:
    """Whether a slow reverse-mode check passed by compressed differences."""
    be = p.be
    entries = sum(be.numel(p.args[q]) for q in checked) * sum(be.numel(p.outputs[k]) for k in diff)
    return entries >= MIN_ENTRIES and _attempt(p, "compressed", _compressed_reverse, p, checked, diff)


def _compressed_reverse(p, checked, diff) -> str:
    be = p.be
    patterns = {}
    for q in checked:  # loops, not comprehensions: one frame less above fn's calls
        patterns[q] = _probe(p, q, diff)
    sizes = [be.numel(p.args[q]) for q in checked] + [be.numel(p.outputs[k]) for k in diff]
    n_patterns = 1 + max(bits_for(s) for s in sizes) + RANDOM_SIGNS
    if not _reverse_worth_it(p, checked, diff, patterns, n_patterns):
        raise Declined("not worth it")
    rng = np.random.default_rng(SIGN_SEED)
    col_signs = {q: index_signs(be.numel(p.args[q]), n_patterns, rng) for q in checked}
    numerical = {}
    for q in checked:
        numerical[q] = _differences(p, q, None, 1, col_signs[q], diff)
    for k in diff:
        row_signs = index_signs(be.numel(p.outputs[k]), n_patterns, rng)
        why = _compressed_output(p, k, checked, patterns, {q: numerical[q][k] for q in checked}, col_signs, row_signs)
        if why:
            return why
    return ""


def _compressed_output(p, k, checked, patterns, numerical, col_signs, row_signs) -> str:
    """Output ``k``'s blocks, against VJPs computed twice, shared where output colourings coincide."""
    vjps = {}
    for j, q in enumerate(checked):
        pat = patterns[q][k]
        key = pat.colour.tobytes()
        if key not in vjps:
            vjps[key] = [_compressed_vjps(p, k, checked, pat, row_signs) for _ in range(2)]
        first, second = (v[j] for v in vjps[key])
        with np.errstate(invalid="ignore", over="ignore"):
            if first.size and np.max(np.abs(first - second)) > p.opts.nondet_tol:
                return "backward not reentrant"
        n = _read_off(numerical[q], None, col_signs[q], pat.dep[pat.rows], pat.rows)
        a = _read_off(first, pat.colour, row_signs, pat.rows, pat.dep[pat.rows])
        why = _disagreement(n[0], a[0], p.opts, n[1], a[1])
        if why:
            return f"output {k}, input {q}: {why}"
    return ""


def _reverse_worth_it(p, checked, diff, patterns, n_patterns) -> bool:
    """Compressed work ``_MIN_SAVING`` times below the exact engine's, its largest batch of
    cotangents within the memory budget."""
    be = p.be
    points = len(p.run.stencil.offsets) * (2 if any(be.is_complex(p.args[q]) for q in checked) else 1)
    exact = sum(2 * be.numel(p.args[q]) for q in checked) + 2 * sum(be.numel(p.outputs[k]) for k in diff)
    colours = 0
    for k in diff:
        widest = max(patterns[q][k].n_colours for q in checked)
        if n_patterns * widest * be.numel(p.outputs[k]) * p.itemsize > p.budget // 4:
            return False
        colours += sum(patterns[q][k].n_colours for q in checked)
    compressed = sum(2 * bits_for(be.numel(p.args[q])) + 1 for q in checked) + n_patterns * (
        points * len(checked) + 2 * colours)
    return compressed * _MIN_SAVING <= exact


def _compressed_vjps(p, k, checked, pat, signs) -> list:
    """Per checked input, ``(patterns, colours, n)``: VJPs of the signed colour classes of
    output ``k``'s elements."""
    be, out = p.be, p.outputs[k]
    n_patterns, m = signs.shape
    count = n_patterns * pat.n_colours
    cot = np.zeros((n_patterns, pat.n_colours, m))
    cot[:, pat.colour, np.arange(m)] = signs
    stacked = be.array_like(cot.reshape(count, *out.shape).astype(be.to_numpy(out).dtype), out)
    try:
        grads = p.vjps(k, stacked, count, batched=p._vjp_batched is not False)
    except ValueError as e:
        if e in p.run.user_errors:
            raise
        raise Declined(f"not compressible: {e}") from None
    flat = p.flat_gradients(grads, [p.args[q] for q in checked], count)
    if flat is None:
        raise Declined("not compressible: gradient of unexpected shape or dtype")
    return [f.reshape(n_patterns, pat.n_colours, -1) for f in flat]


def try_compressed_forward(p, checked, diff, jvp_signed) -> bool:
    """:func:`try_compressed_reverse` in forward mode: ``jvp_signed(j, signs)`` gives the JVPs
    along the signed moves, per floating output a ``(patterns, m)`` NumPy array."""
    be = p.be
    if any(be.is_complex(p.args[q]) for q in checked):
        return False  # forward-mode rows of complex inputs pair two directions: the exact engine's
    for q in checked:  # a loop: the probes' calls of fn run one frame below this one
        if not p.batched_ok(q):
            return False
    entries = sum(be.numel(p.args[q]) for q in checked) * sum(be.numel(p.outputs[k]) for k in p.floats)
    return entries >= MIN_ENTRIES and _attempt(p, "compressed", _compressed_forward, p, checked, diff, jvp_signed)


def _compressed_forward(p, checked, diff, jvp_signed) -> str:
    be = p.be
    patterns = {q: _probe(p, q, p.floats) for q in checked}
    n_patterns = 1 + max(bits_for(be.numel(p.args[q])) for q in checked) + RANDOM_SIGNS
    exact = sum(2 * be.numel(p.args[q]) for q in checked)
    if sum(2 * bits_for(be.numel(p.args[q])) + 1 + 3 * n_patterns for q in checked) * _MIN_SAVING > exact:
        raise Declined("not worth it")
    rng = np.random.default_rng(SIGN_SEED)
    for j, q in enumerate(checked):
        signs = index_signs(be.numel(p.args[q]), n_patterns, rng)
        numerical = _differences(p, q, None, 1, signs, p.floats)
        analytical = jvp_signed(j, signs)
        if len(analytical) != len(p.floats):
            raise Declined("not compressible: outputs changed")
        for i, k in enumerate(diff):  # torch pairs the i-th differentiable output with the i-th floating one
            num = numerical[k]
            ana = np.zeros_like(num) if analytical[i] is None else analytical[i][:, None]
            if ana.shape != num.shape:
                return "entries differ"
            pat = patterns[q][k]
            n, a = (_read_off(d, None, signs, pat.dep[pat.rows], pat.rows) for d in (num, ana))
            why = _disagreement(n[0], a[0], p.opts, n[1], a[1])
            if why:
                return why
    return ""


class DenseBlock:
    """One analytical Jacobian block: ``by_output`` ``(m, n)``, C-contiguous (column blocks
    are written, and the pattern read, without strided copies); ``by_input`` its transpose."""

    def __init__(self, by_output: np.ndarray):
        self.by_output = by_output
        self._pattern = None

    @property
    def by_input(self) -> np.ndarray:
        return self.by_output.T

    def widest(self, axis: int) -> int:
        """The most nonzero (or NaN) entries of an output element's row (``axis=1``) or an
        input element's column (``axis=0``): the fewest colours, known without the pattern."""
        return int(np.count_nonzero(self.by_output, axis=axis).max()) if self.by_output.size else 0

    def forget_pattern(self) -> None:  # rows were written since the pattern was read
        self._pattern = None

    def pattern(self):
        """``(output indices, input indices)`` of the nonzero (or NaN) entries."""
        if self._pattern is None:
            self._pattern = np.divmod(np.flatnonzero(self.by_output != 0), self.by_output.shape[1])
        return self._pattern


def try_from_analytical(p, checked, diff, analytical, decidable=False) -> bool:
    """Whether the numerical side, coloured (exact rows where an input cannot be), matched
    ``analytical[k][j]`` under every sign pattern; :class:`RowsDiffer` at the first exact row
    block that differs (where ``decidable``, once that input's rows are all computed)."""
    return _attempt(p, "coloured", _from_analytical, p, checked, diff, analytical, decidable)


def _from_analytical(p, checked, diff, analytical, decidable):
    coloured = 0
    for j, q in enumerate(checked):
        jac = {k: analytical[k][j] for k in diff}
        try:
            why = _coloured_input(p, q, diff, jac)
        except Declined as reason:  # this input's rows exactly, the others' still coloured
            p.run.engine_log.append(EngineEvent("coloured", "declined", q, str(reason)))
            _exact_rows_against(p, q, diff, jac, decidable)
            continue
        if why:
            return f"input {q}, {why}"
        coloured += 1
    return "" if coloured else EngineEvent("exact", "passed", None, "rows against the full analytical Jacobian")


def _exact_rows_against(p, q, diff, jac, decidable) -> None:
    """Input ``q``'s rows, computed exactly, against ``jac`` (:func:`try_from_analytical`)."""
    opts, differs = p.opts, None
    for s, e, rows in p.numerical_row_chunks(q, report=False):
        if s == 0:  # the input's rows computed again: not agreeing until compared
            p.passed.discard(q)
        differs = differs or next((RowsDiffer(q, k, s, e) for k in diff if not allclose_like_torch(
            jac[k].by_input[s:e], p.be.to_numpy(rows[k]), opts.rtol, opts.atol)), None)
        if differs is not None and not decidable:
            break
    if differs is not None:
        raise differs
    if decidable:
        p.passed.add(q)


def _colouring(p, q, diff, jac):
    """``(colour per element of args[q], {k: (input indices, output indices)})`` of the
    pattern of ``jac``; :class:`Declined` where it cannot pay."""
    n = p.be.numel(p.args[q])
    if p.be.is_complex(p.args[q]):
        raise Declined("not compressible: complex input")
    limit = n // 4
    if not limit or max(jac[k].widest(axis=1) for k in diff) > limit:  # before the pattern's indices
        raise Declined("not compressible: too many colours")
    entries = {k: jac[k].pattern()[::-1] for k in diff}
    offsets = np.cumsum([0] + [jac[k].by_output.shape[0] for k in diff])
    rows = np.concatenate([entries[k][1] + offsets[i] for i, k in enumerate(diff)])
    cols = np.concatenate([entries[k][0] for k in diff])
    colour = colour_columns(rows, cols, n, limit)
    if colour is None:
        raise Declined("not compressible: too many colours")
    return colour, entries


def _coloured_input(p, q, diff, jac) -> str:
    """Input ``q``'s rows by coloured differences against ``jac``: ``""``, or the disagreement."""
    colour, entries = _colouring(p, q, diff, jac)
    n, n_colours = len(colour), int(colour.max()) + 1
    rank = rank_in_class(colour)
    n_patterns = 1 + bits_for(int(rank.max()) + 1) + RANDOM_SIGNS
    points = len(p.run.stencil.offsets)
    moves = n_patterns * n_colours * points
    if 2 * moves > points * n or moves * (n + p.out_numel) * p.itemsize > p.budget // 2:
        raise Declined("not compressible: not worth it")
    if p.samples_loop_cheaper(q, moves):
        raise Declined("not compressible: the loop moving samples together is cheaper")
    signs = index_signs(int(rank.max()) + 1, n_patterns, np.random.default_rng(SIGN_SEED))[:, rank]
    differences = _differences(p, q, colour, n_colours, signs, diff)
    for k in diff:
        c_idx, r_idx = entries[k]
        n_entries, strays = _read_off(differences[k], colour, signs, c_idx, r_idx)
        a_entries = np.broadcast_to(jac[k].by_output[r_idx, c_idx], n_entries.shape)
        why = _disagreement(n_entries, a_entries, p.opts, strays, np.empty(0))
        if why:
            return f"output {k}: {why}"
    return ""
