"""The batched slow-mode engine: full Jacobians in chunks, many evaluations per call.

The reference engine (``agcheck.core.jacobian``) moves one input element at a time and runs
one backward per output element, as torch does. This engine reaches the same verdicts
faster and in bounded memory:

* numerical rows come from evaluating ``fn`` on a batch of moved copies of an input at
  once (the backend vmaps ``fn``), central differences on the batch;
* analytical columns come from batched VJPs (many one-hot cotangents at once), forward
  rows from batched JVPs;
* the two sides are compared chunk by chunk; what is kept whole at most is one side's
  Jacobian, and only when it fits the memory budget (else it is recomputed per block of
  output columns).

It is optimistic: anything it cannot do, or any disagreement it finds, hands the check
back to the reference engine, which then decides the verdict and writes the message. So a
failure is always the reference engine's failure, and the batched engine only ever
shortens the passing path. Before batching an input it probes that a batched evaluation
sees the input move (a function reading its input through a closure would not) and falls
back for that input if not.
"""
from __future__ import annotations

import time

import numpy as np

from agcheck.backends.base import Capability
from agcheck.core import jacobian as jac
from agcheck.engine import coloured, compressed, cost, memory
from agcheck.engine.outcome import PASSED, EngineEvent, Outcome, undecided

__all__ = ["compare_slow_reverse", "compare_slow_forward", "DEFAULT_MEMORY_BUDGET"]

#: default bytes that Jacobian storage and batch working sets may take
DEFAULT_MEMORY_BUDGET = 1 << 30
#: below this many elements an input is perturbed element by element (a loop is cheaper)
MIN_BATCHED_NUMEL = 16
#: bytes per element a batched evaluation keeps alive, relative to its inputs and outputs
_INTERMEDIATES = 4
PROBE_SEED = 5113
#: one batched call may always take this many bytes (see _Problem.batch_bytes)
MIN_BATCH_BYTES = 8 << 20
#: from this many elements on, the probe's plain calls are timed twice (the best counts)
_RETIMED_NUMEL = 64
#: the element-by-element check costs about this many evaluations per input element
#: (its numerical side, and two analytical passes of about one evaluation each)
_LOOP_EVALUATIONS = 3
#: outputs below this many elements get the second analytical pass column by column
_MIN_COLOURED_OUTPUTS = 64
class EngineFallback(Exception):
    """Raised inside this module when the batched engine cannot decide a check; its
    entry points turn it into an undecided :class:`Outcome`."""


class _Problem:
    """One piece of ``fn`` (after the complex split) and what the engine learned of it."""

    def __init__(self, run, fn, trace, args, checked):
        self.run = run
        self.be, self.opts = run.be, run.opts
        self.fn, self.trace, self.args, self.checked = fn, trace, args, checked
        self.outputs = trace.outputs
        self.floats = [k for k, o in enumerate(self.outputs) if self.be.is_floating_or_complex(o)]
        self.budget = run.opts.memory_budget or DEFAULT_MEMORY_BUDGET
        arrays = [args[q] for q in checked] + [self.outputs[k] for k in self.floats]
        self.itemsize = max(self.be.itemsize(a) for a in arrays)
        self.out_numel = sum(self.be.numel(self.outputs[k]) for k in self.floats)
        self._batched = {}
        self._element_cost = {}  # seconds one element's rows take one at a time
        self._via = {}  # per batched input: "stacked" or "vmap"
        self._figures = {}  # per probed input: the timings its decision was taken on
        self._vjp_batched = None  # True: being timed; False: found not to pay
        self._vjp_size = cost.RAMP[0]  # columns per batched VJP, as the timings chose
        self._vjp_per_col = {}  # seconds per column of each batch size tried
        self._vjp_column_cost = None  # seconds of one VJP (one Jacobian column)
        self._looped = set()  # inputs whose batched rows were found clearly slower
        jacobian_bytes = n_in_total(self.be, args, checked) * self.out_numel * self.itemsize
        #: whether whole numerical Jacobians fit the budget, and so are kept for reuse
        self.keep_rows = jacobian_bytes <= self.budget // 2
        #: what one batched call may take: as much as one Jacobian (which the reference
        #: engine holds), at least MIN_BATCH_BYTES, at most its share of the budget
        self.batch_bytes = min(self.budget // cost.CHUNK_SHARE, max(jacobian_bytes, MIN_BATCH_BYTES))
        self._row_bytes = {}  # per batched input: bytes a row's evaluation took, as measured
        self._column_bytes = 0  # bytes one batched VJP column took, as measured
        #: per input, its rows computed element by element (as the reference engine
        #: computes them) when all of them were: reused instead of being computed again
        self._exact_rows = {}
        #: per input, every block of rows computed element by element so far, by start
        #: (a failing check hands them to the reference engine, which computes the rest)
        self._exact_blocks = {}

    # -- numerical side -----------------------------------------------------------------
    def batched_ok(self, pos) -> bool:
        """Can ``args[pos]`` be moved in batches? (a batched form agrees with plain calls,
        and fn sees the input move)"""
        if pos not in self._batched:
            self._batched[pos] = self._probe(pos)
            figures = self._figures.get(pos, {})
            if self._batched[pos]:
                event = EngineEvent("numerical", "batched", pos, via=self._via[pos], figures=figures)
            else:
                event = EngineEvent("numerical", "looped", pos, figures=figures)
            self.run.engine_log.append(event)
        return self._batched[pos]

    def evaluate(self, pos, stacked):
        """``fn`` at each of ``stacked`` (moved copies of ``args[pos]``) in one call, in the
        batched form the probe chose for that input."""
        if self._via[pos] == "stacked":
            return self.be.evaluate_stacked(self.fn, self.args, pos, stacked)
        return self.be.evaluate_batch(self.fn, self.args, pos, stacked)

    def _probe(self, pos) -> bool:
        """Time one element's rows by plain calls, then evaluate the same two moves in a
        batched form: ``stacked`` (one plain call, the copies laid along fn's own first
        dimension) where fn gives each copy its own result, else ``vmap``."""
        be, x = self.be, self.args[pos]
        if be.numel(x) < MIN_BATCHED_NUMEL or not be.supports(Capability.BATCHED_EVALUATION):
            return False
        gen = be.generator(x, PROBE_SEED)
        u = be.uniform_unit_vector(x, gen, real=True)
        eps = self.run.eps_for(x)
        try:
            # the best of two: the first plain calls of a check may pay one-time costs
            timings = []
            for _ in range(2 if be.numel(x) >= _RETIMED_NUMEL else 1):
                start = time.perf_counter()
                sequential = self.run.user_errors.call(jac.numerical_directional, be, self.fn, self.args, pos, u,
                                                       eps, self.run.stencil)
                timings.append(time.perf_counter() - start)
        except Exception as e:
            if e in self.run.user_errors:
                raise
            return False
        loop_row = self._element_cost[pos] = min(timings) * (2 if be.is_complex(x) else 1)
        figures = self._figures[pos] = {"loop_row": loop_row}
        step = be.reshape(u, x.shape) * eps
        moved = be.stack([be.astype(x - step, x.dtype), be.astype(x + step, x.dtype)], axis=0)
        forms = [("vmap", be.evaluate_batch)]
        if be.supports(Capability.STACKED_EVALUATION):
            forms.insert(0, ("stacked", be.evaluate_stacked))
        for via, evaluate in forms:
            if via == "vmap" and self._setup_outweighs_saving(pos):
                return False
            seconds = self._agreeing_seconds(evaluate, pos, moved, sequential, eps)
            if seconds is not None:
                figures[f"{via}_probe"] = seconds
                self._via[pos] = via
                return True
        return False

    def _agreeing_seconds(self, evaluate, pos, moved, sequential, eps) -> float | None:
        """Seconds of ``evaluate`` at the two probe moves, or ``None`` when it fails or its
        difference quotient differs from the plain calls' (fn does not see the batch, or
        mixes the copies)."""
        be = self.be
        try:
            start = time.perf_counter()
            batched = evaluate(self.fn, self.args, pos, moved)
            seconds = time.perf_counter() - start
        except Exception as e:
            if e in self.run.user_errors:
                raise
            return None
        for k in self.floats:
            if tuple(batched[k].shape) != (2, *self.outputs[k].shape):
                return None
            minus, plus = batched[k][0], batched[k][1]
            est = be.flatten((plus - minus) / (2 * eps))
            ref = sequential[k] if self.run.stencil.name == "central" else est
            if tuple(est.shape) != tuple(ref.shape) or not be.allclose(
                est, ref, self.opts.rtol * 1e-2, self.opts.atol * 1e-2
            ):
                return None
        return seconds

    def _setup_outweighs_saving(self, pos) -> bool:
        """A batched form of fn that costs a one-time setup (e.g. an import) is used only
        when the element-by-element loop it replaces would take longer than the setup."""
        setup = self.be.batch_setup_cost(self.run.fn)
        loop = _LOOP_EVALUATIONS * self._element_cost[pos] * self.be.numel(self.args[pos])
        if setup and loop < setup:
            self.run.engine_log.append(EngineEvent("numerical", "looped", pos, "batching setup not worth it"))
            return True
        return False

    def evaluate_looped(self, pos, deltas, outputs) -> dict:
        """``{k: (len(deltas), m) NumPy array}``: ``fn`` with ``args[pos]`` moved by each row
        of ``deltas`` (flat NumPy), one plain call each, through the backend's in-place
        perturber (closures see the move; the input is restored bitwise)."""
        be, x = self.be, self.args[pos]
        parts = {k: [] for k in outputs}
        with be.perturber(self.args, pos) as perturber:
            for delta in deltas:
                step = be.reshape(be.array_like(delta, x), tuple(x.shape))
                outs = self.run.user_errors.call(perturber.evaluate_direction, self.fn, step, 1)
                for k in outputs:
                    parts[k].append(be.to_numpy(outs[k]).reshape(-1))
        return {k: np.stack(v) for k, v in parts.items()}

    def numerical_row_chunks(self, pos, report=True):
        """Yield ``(start, stop, {output_position: rows (stop-start, m)})`` over the input
        (and advance the run's progress bar by each chunk's rows when ``report``)."""
        for start, stop, rows in self._row_chunks(pos):
            if report:
                self.run.progress.advance(stop - start)
            yield start, stop, rows

    def exact_numerical(self) -> dict | None:
        """``{input position: [(start, stop, {output position: rows})]}``: the row blocks
        computed element by element so far (the reference engine's numbers, bit for bit),
        in order; ``None`` when there are none."""
        if not self.keep_rows:
            return None
        found = {q: [self._exact_blocks[q][s] for s in sorted(self._exact_blocks[q])]
                 for q in self.checked if self._exact_blocks.get(q)}
        return found or None

    def _noted(self, pos, chunks):
        """``chunks`` (computed element by element), each noted as an exact block."""
        for chunk in chunks:
            if self.keep_rows and chunk[1] > chunk[0]:
                self._exact_blocks.setdefault(pos, {})[chunk[0]] = chunk
            yield chunk

    def _row_chunks(self, pos):
        be, x, eps = self.be, self.args[pos], self.run.eps_for(self.args[pos])
        n = be.numel(x)
        if pos in self._exact_rows:
            yield from self._exact_rows[pos]
            return
        if not self.batched_ok(pos) or pos in self._looped:
            chunks = self._noted(pos, self._looped_row_chunks(pos, 0, n, eps))
            if self.keep_rows:
                chunks = self._exact_rows[pos] = list(chunks)
            yield from chunks
            return
        complex_input = be.is_complex(x)
        points = len(self.run.stencil.offsets)
        estimate = (n + self.out_numel) * self.itemsize * _INTERMEDIATES * points * (2 if complex_input else 1)
        self._row_bytes[pos] = estimate
        looped = self._element_cost.get(pos, float("inf"))
        probe = self._figures.get(pos, {}).get(f"{self._via[pos]}_probe")
        per_row_of, start = {}, 0
        size = min(cost.RAMP[0], cost.rows_per_chunk(estimate, self.batch_bytes, n))
        while start < n:
            stop = min(n, start + size)
            setup_pending = self._via[pos] == "vmap" and be.batch_setup_cost(self.run.fn) > 0
            began = time.perf_counter()
            call = memory.measured(self._batched_rows, pos, list(range(start, stop)), eps, complex_input)
            seconds = time.perf_counter() - began
            if call.added_peak is not None and not setup_pending:  # memory as measured
                self._row_bytes[pos] = max(self._row_bytes[pos], call.added_peak // (stop - start))
            yield start, stop, call.result
            if stop >= n:
                return
            per_row_of[size] = seconds / size
            slope = cost.slope_per_row(probe * (2 if complex_input else 1) if probe else None, 1, seconds, size) \
                if len(per_row_of) == 1 else None
            chunk = cost.rows_per_chunk(self._row_bytes[pos], self.batch_bytes, n)
            size, why = cost.next_batch_size(per_row_of, looped, chunk, seconds=seconds, slope=slope)
            start = stop
            if size is None:
                self._looped.add(pos)
                self.run.engine_log.append(EngineEvent(
                    "numerical", "looped", pos, why, via=self._via[pos],
                    figures={"loop_row": looped, "batched_row": per_row_of[max(per_row_of)]}))
                yield from self._noted(pos, self._looped_row_chunks(pos, stop, n, eps))
                return

    def _looped_row_chunks(self, pos, begin, end, eps):
        """Rows ``begin:end`` one element at a time, yielded in chunks so that memory
        follows the chunk, not the Jacobian."""
        be = self.be
        per_row = max(be.numel(self.args[pos]) + self.out_numel, 1) * self.itemsize * 2
        chunk = cost.rows_per_chunk(per_row, self.budget // cost.CHUNK_SHARE, max(end - begin, 1))
        for start in range(begin, end, chunk):
            stop = min(end, start + chunk)
            yield start, stop, self.run.user_errors.call(jac.numerical_jacobians, be, self.fn, self.args, pos, self.outputs, eps,
                                        self.run.stencil, elements=range(start, stop))
        if begin == end == 0:
            yield 0, 0, self.run.user_errors.call(jac.numerical_jacobians, be, self.fn, self.args, pos, self.outputs, eps,
                                 self.run.stencil)

    def _batched_rows(self, pos, flat, eps, complex_input):
        be, x = self.be, self.args[pos]
        rows = self._difference_rows(pos, flat, eps)
        if complex_input:
            imag = self._difference_rows(pos, flat, eps * 1j)
            rows = {k: be.astype(rows[k] + imag[k] * 1j, x.dtype) for k in rows}
        return rows

    def _difference_rows(self, pos, flat, step):
        be, x = self.be, self.args[pos]
        eps, stencil = self.run.eps_for(x), self.run.stencil
        b = len(flat)
        moves = [be.element_moves(x, flat, step if abs(m) == 1 else abs(m) * step, 1 if m > 0 else -1)
                 for m in stencil.offsets]
        points = len(moves)
        moved = be.reshape(be.stack(moves, axis=0), (points * b, *x.shape))
        outs = self.evaluate(pos, moved)
        rows = {}
        for k in self.floats:
            o = be.reshape(outs[k], (points, b, be.numel(self.outputs[k])))
            rows[k] = stencil.combine([o[i] for i in range(points)], eps)
        return rows


def n_in_total(be, args, checked) -> int:
    return sum(be.numel(args[q]) for q in checked)


def _require_dense(be, args) -> None:
    """Sparse and opaque layouts (torch's sparse and MKL-DNN tensors) are left to the
    reference engine: it moves stored elements, and densifies unmasked inputs."""
    for a in args:
        if be.is_array(a) and be.layout(a) != "dense":
            raise EngineFallback(f"an argument has layout {be.layout(a)!r}")


def compare_slow_reverse(run, piece) -> Outcome:
    """Slow-mode reverse check of one piece, batched: passed, or undecided with a reason."""
    try:
        _require_dense(run.be, piece.args)
    except EngineFallback as reason:
        return undecided(str(reason))
    p = _Problem(run, piece.fn, piece.trace, piece.args, piece.checked)
    try:
        _reverse(run, p, piece.diff)
    except EngineFallback as reason:
        return undecided(str(reason), p.exact_numerical() if str(reason) == MISMATCH else None)
    return PASSED


#: the reason of an undecided outcome where the engine saw the Jacobians differ
MISMATCH = "Jacobian mismatch"


def _reverse(run, p, diff) -> None:
    be, opts = run.be, run.opts
    trace, args, checked = p.trace, p.args, p.checked
    batchable = [p.batched_ok(q) for q in checked]
    # compressed differences need a few dozen evaluations: worth it also one call at a time
    if opts.engine == "auto" and compressed.try_compressed_reverse(p, checked, diff):
        run.progress.advance(n_in_total(be, args, checked))
        return
    inputs = [args[q] for q in checked]
    n_in = sum(be.numel(x) for x in inputs)
    full = n_in * p.out_numel * p.itemsize
    colourable = opts.engine == "auto" and n_in * p.out_numel >= compressed.MIN_ENTRIES
    if full <= p.budget // 2 and (colourable or any(batchable)):
        # the analytical side first: its pattern may let the numerical side be coloured
        # (in batches, or one plain call per colour class where the input cannot be batched)
        analytical = {k: _analytical_full(p, k, inputs) for k in diff}
        if colourable:
            try:
                if coloured.try_from_analytical(p, checked, diff, analytical):
                    run.progress.advance(n_in)
                    return
            except coloured.RowsDiffer:
                raise EngineFallback(MISMATCH) from None  # decided: no row is computed twice
        # rows already computed exactly are reused, here and by the reference engine; the
        # first row block that differs ends the pass
        for j, q in enumerate(checked):
            for s, e, rows in p.numerical_row_chunks(q):
                for k in diff:
                    if not compressed.allclose_like_torch(analytical[k][j].by_input[s:e], be.to_numpy(rows[k]),
                                                          opts.rtol, opts.atol):
                        raise EngineFallback(MISMATCH)
        return
    if not any(batchable):
        raise EngineFallback("no input can be moved in batches")
    for k in diff:
        m = be.numel(trace.outputs[k])
        block = max(1, (p.budget // 2) // max(n_in * p.itemsize, 1))
        for b0 in range(0, m, block):
            b1 = min(m, b0 + block)
            numerical = {q: _keep_columns(be, p.numerical_row_chunks(q, report=(k == diff[0] and b0 == 0)), k, b0, b1)
                         for q in checked}
            for c0, c1 in _column_blocks(p, b1 - b0, n_in):
                _compare_columns(p, k, b0 + c0, b0 + c1, inputs, numerical, offset=b0)


def _keep_columns(be, chunks, k, b0, b1):
    # copies, so that the full rows of a chunk are not kept alive by a view
    return [(s, e, {k: be.clone(rows[k][:, b0:b1])}) for s, e, rows in chunks]


def _column_blocks(p, m, n_in):
    """``[0, m)`` in blocks of the batch size the VJP timings chose so far (small first),
    within the memory budget; read as the blocks are consumed, so that each block's
    timing decides the next block's size."""
    estimate = (n_in + p.out_numel) * p.itemsize * _INTERMEDIATES * 2
    c0 = 0
    while c0 < m:
        chunk = cost.rows_per_chunk(max(estimate, p._column_bytes), p.batch_bytes, m)
        c1 = min(m, c0 + min(chunk, p._vjp_size))
        yield c0, c1
        c0 = c1


def _analytical_columns(p, k, c0, c1, inputs):
    """``J[:, c0:c1]`` for every input: one batched VJP of one-hot cotangents, or one VJP
    per column once batching has been seen to be clearly slower (every batch is timed,
    and its timing sets the next batch's size: :func:`cost.next_batch_size`)."""
    if p._vjp_batched is None:
        p._vjp_batched = not _vjp_setup_outweighs_saving(p, k, c0)
        if not p._vjp_batched:
            p.run.engine_log.append(EngineEvent("vjp", "looped", None, "batching setup not worth it"))
    if p._vjp_batched is False:
        return _looped_columns(p, k, c0, c1, inputs)
    setup_pending = p.be.batched_vjp_setup_cost() > 0  # then the call's memory is mostly the setup's
    began = time.perf_counter()
    call = memory.measured(_batched_columns, p, k, c0, c1, inputs)
    seconds = time.perf_counter() - began
    cols = call.result
    if call.added_peak is not None and not setup_pending:
        p._column_bytes = max(p._column_bytes, call.added_peak // (c1 - c0))
    if p._vjp_column_cost is None:
        # the best of two: a first plain call may pay one-time costs
        p._vjp_column_cost = min(cost.seconds_of(_looped_columns, p, k, c0, c0 + 1, inputs) for _ in range(2))
    if c1 - c0 < p._vjp_size and c1 - c0 < cost.RAMP[0]:
        return cols  # a short last block says little
    p._vjp_per_col[c1 - c0] = seconds / (c1 - c0)
    size, why = cost.next_batch_size(p._vjp_per_col, p._vjp_column_cost, _NO_LIMIT, seconds=seconds)
    if size is None:
        p._vjp_batched = False
        p.run.engine_log.append(EngineEvent("vjp", "looped", None, why, figures={
            "loop_column": p._vjp_column_cost, "batched_column": p._vjp_per_col[c1 - c0]}))
    else:
        p._vjp_size = size
    return cols


#: no limit from the timings (the memory budget sets one)
_NO_LIMIT = 1 << 62


def _vjp_setup_outweighs_saving(p, k, c) -> bool:
    """Batched VJPs that first cost a one-time setup (torch: an import) are used only when
    the VJPs they would replace, one at a time, would take longer than the setup."""
    setup = p.be.batched_vjp_setup_cost()
    if not setup:
        return False
    inputs = [p.args[q] for q in p.checked]
    p._vjp_column_cost = min(cost.seconds_of(_looped_columns, p, k, c, c + 1, inputs) for _ in range(2))
    # every column of every differentiable output, twice (the reentrancy pass)
    return 2 * p.out_numel * p._vjp_column_cost < setup


def _batched_columns(p, k, c0, c1, inputs):
    be = p.be
    out = p.outputs[k]
    grads = p.trace.vjp_batched(k, be.one_hots(out, list(range(c0, c1))))
    cols = []
    for g, x in zip(grads, inputs):
        if g is None:
            cols.append(be.zeros((be.numel(x), c1 - c0), like=x))
            continue
        if tuple(g.shape) != (c1 - c0, *x.shape) or g.dtype != x.dtype:
            raise EngineFallback("gradient of unexpected shape or dtype")
        cols.append(be.transpose(be.reshape(be.to_dense(g), (c1 - c0, be.numel(x)))))
    return cols


def _looped_columns(p, k, c0, c1, inputs):
    be = p.be
    out = p.outputs[k]
    per_input = [[] for _ in inputs]
    for j in range(c0, c1):
        grads = p.run.user_errors.call(p.trace.vjp, [k], [be.one_hot(out, j)])
        for i, (g, x) in enumerate(zip(grads, inputs)):
            if g is None:
                g = be.zeros(tuple(x.shape), like=x)
            elif tuple(g.shape) != tuple(x.shape) or g.dtype != x.dtype:
                raise EngineFallback("gradient of unexpected shape or dtype")
            per_input[i].append(be.flatten(be.to_dense(g)))
    return [be.transpose(be.stack(cols, axis=0)) for cols in per_input]


def _analytical_full(p, k, inputs) -> list:
    """The whole analytical Jacobian of output ``k``, per input a
    :class:`coloured.DenseBlock` (rows: output elements), with the reentrancy check.

    The first pass computes every column (batched one-hot VJPs). The second pass, which
    only has to reproduce the first, is coloured when the first pass's pattern allows:
    output elements that share no input element get one VJP (signed), and each entry is
    read off its own slot. Where that does not reproduce the first pass exactly (within
    ``nondet_tol``), the second pass is computed column by column as the first was, and
    only a difference there is a failed reentrancy check."""
    be = p.be
    m = be.numel(p.outputs[k])
    rows = None
    for c0, c1 in _column_blocks(p, m, sum(be.numel(x) for x in inputs)):
        first = _analytical_columns(p, k, c0, c1, inputs)
        if rows is None:
            rows = [np.empty((m, be.numel(x)), dtype=be.to_numpy(a).dtype) for x, a in zip(inputs, first)]
        for i, a in enumerate(first):
            rows[i][c0:c1] = be.to_numpy(a).T
    if rows is None:  # an empty output
        rows = [np.zeros((0, be.numel(x)), dtype=be.to_numpy(x).dtype) for x in inputs]
    blocks = [coloured.DenseBlock(r) for r in rows]
    if not _coloured_second_pass(p, k, inputs, blocks):
        _exact_second_pass(p, k, inputs, blocks)
    return blocks


def _exact_second_pass(p, k, inputs, blocks) -> None:
    m = p.be.numel(p.outputs[k])
    for c0, c1 in _column_blocks(p, m, sum(p.be.numel(x) for x in inputs)):
        second = _analytical_columns(p, k, c0, c1, inputs)
        for block, a2 in zip(blocks, second):
            a2 = p.be.to_numpy(a2).T
            if a2.size and np.max(np.abs(block.by_output[c0:c1] - a2)) > p.opts.nondet_tol:
                raise EngineFallback("backward not reentrant")


def _coloured_second_pass(p, k, inputs, blocks) -> bool:
    """The reentrancy pass by coloured VJPs; True when it reproduced the first pass."""
    be, out = p.be, p.outputs[k]
    m = be.numel(out)
    if m < _MIN_COLOURED_OUTPUTS:
        return False
    rng = np.random.default_rng(compressed.SIGN_SEED)
    by_colouring = {}
    for i, block in enumerate(blocks):
        out_idx, in_idx = block.pattern()
        colour = coloured.colour_columns(in_idx, out_idx, m, m // 4)
        if colour is None:
            p.run.engine_log.append(EngineEvent("vjp", "column by column", i, "input reaches too many outputs"))
            return False
        by_colouring.setdefault(colour.tobytes(), (colour, []))[1].append(i)
    n_in = sum(be.numel(x) for x in inputs)
    for colour, members in by_colouring.values():
        n_colours = int(colour.max()) + 1
        signs = rng.choice(np.array([-1.0, 1.0]), size=m)
        # as many colour classes per batched VJP as the memory budget allows
        for c0, c1 in _column_blocks(p, n_colours, n_in):
            if not _coloured_chunk_matches(p, k, inputs, blocks, members, colour, signs, c0, c1):
                p.run.engine_log.append(EngineEvent("vjp", "column by column", None, "coloured second pass differs"))
                return False
    p.run.engine_log.append(EngineEvent("vjp", "coloured"))
    return True


def _coloured_chunk_matches(p, k, inputs, blocks, members, colour, signs, c0, c1) -> bool:
    """Colour classes ``c0:c1`` of the coloured second pass reproduce the first pass."""
    be, out = p.be, p.outputs[k]
    m = be.numel(out)
    count = c1 - c0
    chosen = np.flatnonzero((colour >= c0) & (colour < c1))
    cot = np.zeros((count, m))
    cot[colour[chosen] - c0, chosen] = signs[chosen]
    stacked = be.reshape(be.array_like(cot.astype(be.to_numpy(out).dtype), out), (count, *out.shape))
    grads = _vjps_of(p, k, stacked, count)
    for i in members:
        g, block = grads[i], blocks[i]
        n = block.by_output.shape[1]
        if g is None:
            got = np.zeros((count, n), dtype=block.by_output.dtype)
        else:
            if tuple(g.shape) != (count, *inputs[i].shape) or g.dtype != inputs[i].dtype:
                return False
            got = be.to_numpy(be.to_dense(g)).reshape(count, n)
        out_idx, in_idx = block.pattern()
        here = (colour[out_idx] >= c0) & (colour[out_idx] < c1)
        out_idx, in_idx = out_idx[here], in_idx[here]
        expected = np.zeros_like(got)
        expected[colour[out_idx] - c0, in_idx] = signs[out_idx] * block.by_output[out_idx, in_idx]
        if got.size and not np.max(np.abs(got - expected)) <= p.opts.nondet_tol:
            return False
    return True


def _vjps_of(p, k, stacked, count) -> list:
    """VJPs of output ``k`` with each of ``count`` stacked cotangents, batched or looped
    as the first pass found cheaper."""
    be = p.be
    if p._vjp_batched is not False:
        return p.trace.vjp_batched(k, stacked)
    per_input = None
    for c in range(count):
        grads = p.run.user_errors.call(p.trace.vjp, [k], [stacked[c]])
        if per_input is None:
            per_input = [[] for _ in grads]
        for i, g in enumerate(grads):
            per_input[i].append(g)
    return [None if any(g is None for g in gs) else be.stack(gs, axis=0) for gs in per_input]


def _compare_columns(p, k, c0, c1, inputs, numerical, offset=0) -> None:
    be, opts = p.be, p.opts
    first = _analytical_columns(p, k, c0, c1, inputs)
    second = _analytical_columns(p, k, c0, c1, inputs)
    for a1, a2 in zip(first, second):
        if be.numel(a1) and be.max_abs(a1 - a2) > opts.nondet_tol:
            raise EngineFallback("backward not reentrant")
    for q, a in zip(p.checked, first):
        for s, e, rows in numerical[q]:
            n_block = rows[k][:, c0 - offset:c1 - offset]
            n_block = be.to_device_of(n_block, a)
            if not be.allclose(a[s:e], n_block, opts.rtol, opts.atol):
                raise EngineFallback(MISMATCH)


def compare_slow_forward(run, piece) -> Outcome:
    """Slow-mode forward check of one piece, batched by input rows: passed, or undecided
    with a reason."""
    p = None
    try:
        _require_dense(run.be, piece.args)
        p = _Problem(run, piece.fn, piece.trace, piece.args, piece.checked)
        _forward(run, p, piece.diff)
    except EngineFallback as reason:
        exact = p.exact_numerical() if p is not None and str(reason) == MISMATCH else None
        return undecided(str(reason), exact)
    return PASSED


def _forward(run, p, diff) -> None:
    be, opts = run.be, run.opts
    fn, args, checked = p.fn, p.args, p.checked
    if not be.supports(Capability.BATCHED_JVP):
        raise EngineFallback("no batched JVP")
    if opts.engine == "auto":
        def jvp_signed(j, signs):
            x = args[checked[j]]
            stacked = be.reshape(be.array_like(signs.astype(be.to_numpy(x).dtype), x), (len(signs), *x.shape))
            return [None if a is None else be.to_numpy(a) for a in be.jvp_along(fn, args, checked, j, stacked)]

        if compressed.try_compressed_forward(p, checked, diff, jvp_signed):
            run.progress.advance(n_in_total(be, args, checked))
            return
    for j, q in enumerate(checked):
        probe = None
        if not p.batched_ok(q) and be.numel(args[q]):
            # a batched JVP first: if it fails (random ops or ops without a batching rule
            # under vmap), it fails before a looped numerical side that the reference
            # engine would compute again
            probe = be.jvp_rows(fn, args, checked, j, [0])
        for s, e, rows in p.numerical_row_chunks(q):
            # a one-element input's rows are the probe's: its jvp runs once, as in torch
            analytical = probe if probe is not None and (s, e) == (0, 1) else \
                be.jvp_rows(fn, args, checked, j, list(range(s, e)))
            probe = None
            if len(analytical) != len(p.floats):
                raise EngineFallback("outputs changed")
            for a, k in zip(analytical, p.floats):
                if opts.check_grad_dtypes and be.is_complex(a) != be.is_complex(p.outputs[k]):
                    raise EngineFallback("forward gradient dtype differs from its output's")
            for i, k in enumerate(diff):
                a = analytical[i]  # torch pairs the i-th differentiable output with the i-th floating one
                if a is None:
                    a = be.zeros(tuple(rows[k].shape), like=rows[k])
                n_rows = be.to_device_of(rows[k], a)
                if tuple(a.shape) != tuple(n_rows.shape) or not be.allclose(a, n_rows, opts.rtol, opts.atol):
                    raise EngineFallback(MISMATCH)
