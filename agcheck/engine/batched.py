"""The batched slow-mode engine: full Jacobians in chunks, many evaluations per call.

The reference engine (``agcheck.core.jacobian``) moves one input element at a time and runs
one backward per output element, as torch does. This engine reaches the same verdicts
faster and in bounded memory:

* numerical rows come from evaluating ``fn`` on a batch of moved copies of an input at
  once (stacked along ``fn``'s own first dimension, or vmapped), central differences on
  the batch (:mod:`~agcheck.engine.rows`);
* analytical columns come from batched VJPs (many one-hot cotangents at once; where the
  output and every checked input hold the same independent samples, one cotangent serves
  the same position in every sample), forward
  rows from batched JVPs; where the outputs far outnumber the inputs, the whole analytical
  Jacobian comes from batched JVPs once random VJPs tie it to the backward
  (:mod:`~agcheck.engine.forward_jacobian`);
* the two sides are compared chunk by chunk; what is kept whole at most is one side's
  Jacobian, and only when it fits the memory budget (else it is recomputed per block of
  output columns).

It is optimistic: anything it cannot do, or any disagreement it finds, hands the check
back to the reference engine, which then decides the verdict and writes the message. The
rows it computed element by element are handed over, so that a failure does not pay for
them twice; where every row was kept, a disagreement is first confirmed on entries
computed as the reference engine computes them, and the reference engine then gets whole
Jacobians, exact wherever its message prints them (:mod:`~agcheck.engine.failure`), so
that a failure costs about what a pass costs. Before batching an input it probes that a
batched evaluation agrees with plain calls (a function reading its input through a
closure would not see the move) and loops over that input if not.
"""
from __future__ import annotations

import numpy as np

from agcheck.backends.base import Capability
from agcheck.core.row_block import RowBlock
from agcheck.engine import coloured, failure, forward_jacobian
from agcheck.core.outcome import PASSED, EngineEvent, Outcome, undecided
from agcheck.engine.rows import DEFAULT_MEMORY_BUDGET, INTERMEDIATES, Problem, n_in_total

__all__ = ["compare_slow_reverse", "compare_slow_forward", "DEFAULT_MEMORY_BUDGET"]

#: outputs below this many elements get the second analytical pass column by column
_MIN_COLOURED_OUTPUTS = 64
#: the first VJP pass by samples saves ``m - m / B`` VJPs on a passing check. A failing
#: one reuses what the second pass computed one VJP per column (a pass column by column),
#: or computes exactly only the columns its report prints (:func:`failure.decide`), and
#: only where neither serves computes the first pass's columns again, ``m / B`` more: with
#: two samples and a coloured second pass, about the ``2 m`` VJPs of torch's checker then
MIN_VJP_SAMPLES = 2
#: outputs of at least this many elements get batched VJPs where no input can be batched
_MIN_BATCHED_COLUMNS = 8
#: the coloured reentrancy pass is taken when it needs at most this many thirds of the
#: VJPs of the column-by-column pass (a CNN on a small image needs about half)
_MAX_COLOUR_SHARE = 2


class EngineFallback(Exception):
    """Raised inside this module when the batched engine cannot decide a check; its
    entry points turn it into an undecided :class:`Outcome`."""


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
    p = Problem(run, piece.fn, piece.trace, piece.args, piece.checked)
    try:
        _reverse(run, p, piece.diff)
    except EngineFallback as reason:
        if str(reason) != MISMATCH:
            return undecided(str(reason), p.exact_numerical())
        inputs = [piece.args[q] for q in piece.checked]
        if isinstance(reason, _RowsKept):
            try:
                decided = failure.decide(p, reason.diff or piece.diff, reason.analytical, reason.kept, reason.where,
                                         lambda k, c0, c1: _looped_columns(p, k, c0, c1, inputs))
            except EngineFallback:
                decided = None
            if decided is not None:
                return decided
        _finish_rows(p)
        _finish_columns(p, inputs)
        return undecided(str(reason), p.exact_numerical(), p.exact_analytical())
    return PASSED


def _finish_rows(p) -> None:
    """Before a mismatch goes to the reference engine: the rows it would compute one
    element at a time, computed with the samples moved together where they can be
    (:meth:`Problem.finish_rows_by_samples`); what fails on the way is left to it."""
    try:
        p.finish_rows_by_samples()
    except Exception as e:
        if e in p.run.user_errors:
            raise


def _finish_columns(p, inputs) -> None:
    """Before a mismatch goes to the reference engine: the columns of a first pass by
    samples, computed again one VJP each (as the reference engine computes its first
    pass), and noted as exact where they reproduce it bit for bit, zeros' signs included
    (then the second pass already checked them for reentrancy); where they do not, or
    something fails on the way, the reference engine computes its two passes itself."""
    be = p.be
    for k, rows in p.sample_columns.items():
        exact = []
        try:
            m = be.numel(p.outputs[k])
            for c0, c1 in _column_blocks(p, m, sum(be.numel(x) for x in inputs)):
                cols = _looped_columns(p, k, c0, c1, inputs)
                if all(_same_bits(be.to_numpy(a).T, r[c0:c1]) for a, r in zip(cols, rows)):
                    exact.append((c0, c1))
        except Exception as e:
            if e in p.run.user_errors:
                raise
        p.note_exact_columns(k, exact, rows)


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return np.array_equal(np.ascontiguousarray(a).view(np.uint8), np.ascontiguousarray(b).view(np.uint8))


#: the reason of an undecided outcome where the engine saw the Jacobians differ
MISMATCH = "Jacobian mismatch"


class _RowsKept(EngineFallback):
    """A mismatch seen with every numerical row and the whole analytical Jacobians at
    hand: for :func:`failure.decide` (reverse mode: ``{output position: [DenseBlock per
    input]}``) or :func:`failure.decide_forward` (forward mode: a :class:`failure.RowStore`
    of JVP rows); ``where`` the row block seen to differ, as
    :attr:`coloured.RowsDiffer.where`."""

    def __init__(self, analytical, kept, where):
        super().__init__(MISMATCH)
        self.analytical, self.kept, self.where = analytical, kept, where
        #: the outputs compared, those ``analytical`` holds (None: all of them)
        self.diff = None


def _reverse(run, p, diff) -> None:
    be, opts = run.be, run.opts
    trace, args, checked = p.trace, p.args, p.checked
    # each input's batched forms are probed where a path first needs them: a check whose
    # first input's rows raise (as torch's checker meets the error, at its first rows)
    # pays no probe of the others
    def any_batchable():
        # where rows are kept, an input that cannot be batched has its rows computed,
        # element by element (the numerical-first path below, or the reference engine,
        # takes them), before the next input is probed
        for q in checked:
            if p.batched_ok(q):
                return True
            if p.keep_rows:
                for _ in p.numerical_row_chunks(q, report=False):
                    pass
        return False

    # compressed differences need a few dozen evaluations: worth it also one call at a time
    if opts.engine == "auto" and coloured.try_compressed_reverse(p, checked, diff):
        run.progress.advance(n_in_total(be, args, checked))
        return
    inputs = [args[q] for q in checked]
    n_in = n_in_total(be, args, checked)
    colourable = opts.engine == "auto" and n_in * p.out_numel >= coloured.MIN_ENTRIES
    if p.keep_rows and (colourable or _columns_may_batch(p, diff) or any_batchable()):
        # the analytical side first where its pattern may let the numerical side be
        # coloured (in batches, or one plain call per colour class where the input cannot
        # be batched); elsewhere every numerical row first, as torch's checker orders
        # them: an evaluation of fn that raises at a step raises before the analytical
        # side is paid. The analytical side is by JVPs where the outputs far outnumber the
        # inputs and the backward is shown to give the same Jacobian, else by VJPs
        numerical = None
        if not colourable:
            numerical = {}
            for q in checked:  # a loop, not a comprehension: one frame less above fn's calls
                numerical[q] = list(p.numerical_row_chunks(q))
        analytical = forward_jacobian.try_forward_jacobian(p, diff, inputs, _projection_vjps(p))
        first = None  # the VJPs' first passes, which the reentrancy passes check
        if analytical is None and numerical is not None and len(diff) > 1 and not opts.raise_exception:
            _compare_output_by_output(run, p, diff, inputs, numerical)
            return
        if analytical is None:
            first = {k: _analytical_first_pass(p, k, inputs) for k in diff}
            analytical = {k: blocks for k, (blocks, _) in first.items()}
        # the reentrancy pass after the numerical side, as torch's checker orders them: an
        # evaluation of fn that raises does so before it is paid; before a mismatch is
        # reported, so that a backward that is not reentrant is reported as that first
        try:
            kept = _compare_with_analytical(run, p, diff, analytical, colourable, numerical)
        except EngineFallback as reason:
            if first is not None:
                _reentrancy_on_mismatch(p, inputs, first, analytical, reason)
            raise
        if first is not None:
            _reentrancy_on_pass(p, inputs, first, analytical, kept)
        _remember_rows(kept, checked)
        return
    if not any_batchable():
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


def _compare_output_by_output(run, p, diff, inputs, numerical) -> None:
    """Every numerical row at hand, the outputs' analytical Jacobians computed and compared
    one output at a time, in torch's order: a mismatch ends the check before the later
    outputs' VJPs are paid, as torch's checker computes an output's only when its
    comparison comes. Each output's reentrancy pass follows the comparisons, as in
    :func:`_reverse`; on a mismatch, those of the outputs compared so far.

    Only where no failure report is built (``raise_exception=False``): a report compares
    every block, and the engine computes the later outputs' columns (in batches where
    the VJPs batch) for less than the report's loop would."""
    analytical, first, kept = {}, {}, None
    for i, k in enumerate(diff):
        first[k] = _analytical_first_pass(p, k, inputs)
        analytical[k] = first[k][0]
        try:
            kept = _compare_with_analytical(run, p, [k], {k: analytical[k]}, False, numerical)
        except EngineFallback as reason:
            if isinstance(reason, _RowsKept):  # decided on every output compared so far
                reason.diff, reason.analytical = diff[: i + 1], analytical
            _reentrancy_on_mismatch(p, inputs, first, analytical, reason)
            raise
    _reentrancy_on_pass(p, inputs, first, analytical, kept)
    _remember_rows(kept, p.checked)


def _reentrancy_on_mismatch(p, inputs, first, analytical, reason) -> None:
    """On a mismatch (``reason``), the reentrancy passes of the outputs of ``first`` (the
    first passes, in torch's order) up to the one seen to differ: torch's checker checks
    an output's reentrancy just before comparing it and stops at the first output that
    differs, which is no later one. A first pass by samples that a reentrancy pass
    corrected is no longer counted as agreeing (:func:`_failing_again`)."""
    if str(reason) != MISMATCH:
        return
    outputs = list(first)
    if isinstance(reason, _RowsKept):
        outputs = outputs[: outputs.index(reason.where[1]) + 1]
    corrected = [k for k in outputs if _reentrancy_pass(p, k, inputs, *first[k])]
    if corrected and isinstance(reason, _RowsKept):
        _failing_again(p, corrected, analytical, reason.kept)


def _reentrancy_on_pass(p, inputs, first, analytical, kept) -> None:
    """Every output's reentrancy pass after its rows agreed; the outputs whose first pass
    by samples it corrected are compared again (:func:`_compare_again`)."""
    corrected = [k for k in first if _reentrancy_pass(p, k, inputs, *first[k])]
    if corrected:
        _compare_again(p, corrected, analytical, kept)


def _compare_with_analytical(run, p, diff, analytical, colourable, numerical=None):
    """The numerical side against the whole analytical Jacobians ``analytical``: coloured
    by their pattern where ``colourable`` and the pattern allows, else row block by row
    block (``numerical``: per input, its row blocks already computed; else they are
    computed as they are compared). Returns the rows kept (:class:`failure.KeptRows`, or
    None) when they agree; raises :class:`EngineFallback` (``MISMATCH``, or
    :class:`_RowsKept` where the failure can be decided from the rows) when they do not."""
    be, opts, checked = p.be, run.opts, p.checked
    n_in = n_in_total(be, p.args, checked)
    # every row computed is kept where a failure can be decided from them
    kept = failure.KeptRows(p) if failure.may_decide(p) else None
    if colourable:
        try:
            if coloured.try_from_analytical(p, checked, diff, analytical, kept):
                run.progress.advance(n_in)
                return kept
        except coloured.RowsDiffer as differs:
            if kept is None:
                raise EngineFallback(MISMATCH) from None  # decided: no row is computed twice
            for q in checked:  # the coloured inputs' rows, for the failure's decision
                if not kept.has(q):
                    for s, e, rows in p.numerical_row_chunks(q, report=False):
                        kept.add(q, s, e, rows)
            raise _RowsKept(analytical, kept, differs.where) from None
    # rows already computed exactly are reused, here and by the reference engine; the
    # first row block that differs ends the comparison, and the rows still to compute
    # unless every row is kept for deciding the failure (failure.decide)
    differs = None
    for j, q in enumerate(checked):
        for s, e, rows in p.numerical_row_chunks(q) if numerical is None else numerical[q]:
            if kept is not None:
                kept.add(q, s, e, rows)
            if differs is not None:
                continue
            for k in diff:
                if not coloured.allclose_like_torch(analytical[k][j].by_input[s:e], be.to_numpy(rows[k]),
                                                      opts.rtol, opts.atol):
                    differs = _differing_block(kept, (q, k, s, e))
                    break
        if differs is None and kept is not None:
            kept.passed.add(q)
    if differs is not None:
        raise _RowsKept(analytical, kept, differs)
    return kept


def _compare_again(p, corrected, analytical, kept) -> None:
    """The kept numerical rows against the analytical Jacobians of the outputs
    ``corrected`` (whose rows the reentrancy pass replaced by the exact ones) after they
    agreed with the rows first computed; a difference is decided as any mismatch is
    (:class:`_RowsKept`). Without every row kept the reference engine compares, with the
    exact columns noted."""
    failing = _failing_again(p, corrected, analytical, kept)
    if failing is None:
        raise EngineFallback(MISMATCH)
    if failing:
        q, k = failing[0]
        raise _RowsKept(analytical, kept, (q, k, 0, p.be.numel(p.args[q])))


def _failing_again(p, corrected, analytical, kept) -> list | None:
    """The blocks ``(input, output)`` of the outputs ``corrected`` whose kept numerical rows
    differ from the corrected analytical rows; their inputs, which agreed with the rows
    first computed, are no longer counted as agreeing (for :func:`failure.decide`).
    ``None`` where not every row was kept."""
    numerical = kept.arrays() if kept is not None else None
    if numerical is None:
        return None
    opts = p.run.opts
    failing = [(q, k) for j, q in enumerate(p.checked) for k in corrected
               if not coloured.allclose_like_torch(analytical[k][j].by_input, numerical[q][k], opts.rtol, opts.atol)]
    for q, _ in failing:
        kept.passed.discard(q)
    return failing


def _differing_block(kept, where):
    """``where`` (input, output, first row, end row): the first row block whose analytical
    and numerical rows differ. Without rows kept for deciding the failure the engine
    hands the check back at once (``EngineFallback``)."""
    if kept is None:
        raise EngineFallback(MISMATCH)
    return where


def _remember_rows(kept, checked) -> None:
    """After a passing reverse-mode pass: every input's rows that were all kept, for the
    forward-mode pass of the same check."""
    if kept is not None:
        for q in checked:
            kept.remember(q)


def _columns_may_batch(p, diff) -> bool:
    """Whether batched VJPs may save time where no input can be moved in batches: a
    function whose forward cannot be batched (Python control flow on values, writes into
    a preallocated result) often has a backward that can, and its two passes of one VJP
    per output element are then the part of the check worth batching: where VJPs are
    batched (:attr:`Problem._vjp_batched`) and an output has at least
    ``_MIN_BATCHED_COLUMNS`` elements."""
    if p._vjp_batched is False:
        return False
    return max((p.be.numel(p.outputs[k]) for k in diff), default=0) >= _MIN_BATCHED_COLUMNS


def _keep_columns(be, chunks, k, b0, b1):
    # copies, so that the full rows of a chunk are not kept alive by a view
    return [(s, e, {k: be.clone(rows[k][:, b0:b1])}) for s, e, rows in chunks]


def _derivative_row_bytes(p, n_in: int) -> int:
    """The estimated memory of one row of a batched VJP or JVP (a cotangent or tangent of
    ``n_in`` input elements and the outputs, with fn's intermediates, for the evaluation
    and its derivative)."""
    return (n_in + p.out_numel) * p.itemsize * INTERMEDIATES * 2


def _column_blocks(p, m, n_in):
    """``[0, m)`` in blocks of as many columns as one batched VJP takes within the batch
    memory (:meth:`Problem.chunk_rows`)."""
    size = p.chunk_rows(_derivative_row_bytes(p, n_in), m)
    return [(c0, min(m, c0 + size)) for c0 in range(0, m, size)]


def _analytical_columns(p, k, c0, c1, inputs):
    """``J[:, c0:c1]`` for every input: one batched VJP of one-hot cotangents, or one VJP
    per column where the backend has no batched VJPs or they failed."""
    return _columns_and_how(p, k, c0, c1, inputs)[0]


def _columns_and_how(p, k, c0, c1, inputs, cotangents=None):
    """:func:`_analytical_columns`, and whether they were computed one VJP per column
    (as the reference engine computes them, bit for bit). ``cotangents(c0, c1)``, when
    given, stacks the cotangents of columns ``c0:c1`` in place of one-hots."""
    if p._vjp_batched is not False:
        cols = _unless_batching_fails(p, _batched_columns, p, k, c0, c1, inputs, cotangents)
        if cols is not None:
            if p._vjp_batched is None:
                p._vjp_batched = True
                p.run.engine_log.append(EngineEvent("vjp", "batched", None, figures={"columns_per_batch": c1 - c0}))
            return cols, False
    return _looped_columns(p, k, c0, c1, inputs, cotangents), True


def _batched_columns(p, k, c0, c1, inputs, cotangents=None):
    be = p.be
    out = p.outputs[k]
    stacked = be.one_hots(out, list(range(c0, c1))) if cotangents is None else cotangents(c0, c1)
    grads = p.trace.vjp_many(k, stacked)
    cols = []
    for g, x in zip(grads, inputs):
        if g is None:
            cols.append(be.zeros((be.numel(x), c1 - c0), like=x))
            continue
        if tuple(g.shape) != (c1 - c0, *x.shape) or g.dtype != x.dtype:
            raise EngineFallback("gradient of unexpected shape or dtype")
        cols.append(be.transpose(be.reshape(be.to_dense(g), (c1 - c0, be.numel(x)))))
    return cols


def _looped_columns(p, k, c0, c1, inputs, cotangents=None):
    be = p.be
    out = p.outputs[k]
    per_input = [RowBlock(be, c1 - c0, be.numel(x), x, x.dtype) for x in inputs]
    stacked = None if cotangents is None else cotangents(c0, c1)
    for j in range(c0, c1):
        cot = be.one_hot(out, j) if stacked is None else stacked[j - c0]
        grads = p.run.user_errors.call(p.trace.vjp, [k], [cot])
        for i, (g, x) in enumerate(zip(grads, inputs)):
            if g is None:
                g = be.zeros(tuple(x.shape), like=x)
            elif tuple(g.shape) != tuple(x.shape) or g.dtype != x.dtype:
                raise EngineFallback("gradient of unexpected shape or dtype")
            per_input[i].add(be.flatten(be.to_dense(g)))
    return [be.transpose(block.result()) for block in per_input]


def _analytical_first_pass(p, k, inputs):
    """The whole analytical Jacobian of output ``k``, per input a
    :class:`coloured.DenseBlock` (rows: output elements), and how it was computed (for
    :func:`_reentrancy_pass`, which checks it).

    It computes every column (batched one-hot VJPs), or, where every checked input holds
    the same independent samples as the output, one VJP per element position for all
    samples together (:func:`_first_pass_by_samples`); ``how`` is then ``None``, else the
    column blocks ``(c0, c1, looped)`` as computed."""
    rows = _first_pass_by_samples(p, k, inputs)
    how = None
    if rows is None:
        rows, how = _first_pass_by_columns(p, k, inputs)
    return [coloured.DenseBlock(r) for r in rows], how


def _reentrancy_pass(p, k, inputs, blocks, how) -> bool:
    """The second analytical pass over output ``k``, which only has to reproduce the
    first (``blocks``, computed as ``how`` says): coloured where the first pass's pattern
    allows (output elements that share no input element get one VJP, signed, and each
    entry is read off its own slot). Where that does not reproduce the first pass exactly
    (within ``nondet_tol``), it is computed column by column as the first was, and only a
    difference there is a failed reentrancy check (:class:`EngineFallback`). Either
    compares whole gradients, so a backward that reaches another sample (which a first
    pass by samples would not see) does not pass unseen. Once checked, the columns
    computed one VJP each (the first pass's, or the second's after a first pass by
    samples) are noted for a failing check to reuse.

    Returns True where a first pass by samples was corrected (:func:`_exact_second_pass`):
    ``blocks`` then hold the exact Jacobian, to be compared with the numerical side again."""
    exact, corrected = None, False
    if not _coloured_second_pass(p, k, inputs, blocks):
        exact, corrected = _exact_second_pass(p, k, inputs, blocks, how)
    rows = [block.by_output for block in blocks]
    if exact is not None:
        # a pass by samples checked by one VJP per column: those columns are the ones the
        # reference engine would compute, checked against the first pass for reentrancy
        p.note_exact_columns(k, [(0, p.be.numel(p.outputs[k]))], exact)
    elif how is None:
        p.sample_columns[k] = rows  # verified again first, where a failure reuses them
    else:
        p.note_exact_columns(k, [(c0, c1) for c0, c1, looped in how if looped], rows)
    return corrected


def _first_pass_by_columns(p, k, inputs):
    """Every column of output ``k``'s Jacobian by one-hot VJPs: per input its ``(m, n)``
    rows, and the column blocks ``(c0, c1, looped)`` as computed: one VJP each (as the
    reference engine does) or batched."""
    be = p.be
    m = be.numel(p.outputs[k])
    rows, how = None, []
    for c0, c1 in _column_blocks(p, m, sum(be.numel(x) for x in inputs)):
        first, looped = _columns_and_how(p, k, c0, c1, inputs)
        how.append((c0, c1, looped))
        if rows is None:
            rows = [np.empty((m, be.numel(x)), dtype=be.to_numpy(a).dtype) for x, a in zip(inputs, first)]
        for i, a in enumerate(first):
            rows[i][c0:c1] = be.to_numpy(a).T
    if rows is None:  # an empty output
        rows = [np.zeros((0, be.numel(x)), dtype=be.to_numpy(x).dtype) for x in inputs]
    return rows, how


def _output_samples(p, k) -> int | None:
    """``B`` when output ``k`` and every checked input hold ``B >= MIN_VJP_SAMPLES``
    independent samples along their first dimension (:meth:`Problem.samples`), else
    ``None``."""
    shape = tuple(p.outputs[k].shape)
    m = p.be.numel(p.outputs[k])
    if not shape or shape[0] < MIN_VJP_SAMPLES:
        return None
    b = shape[0]
    # every input's form first (no call of fn), then the probes, where the VJPs the pass
    # saves outnumber the calls of fn the probes still to make would take
    if not all(p._sample_candidate(q) == b for q in p.checked):
        return None
    if m - m // b < (b + 1) * sum(1 for q in p.checked if not p.samples_probed(q)):
        return None
    return b if all(p.samples(q) == b for q in p.checked) else None


def _first_pass_by_samples(p, k, inputs):
    """The first pass's rows with one VJP per element position of a sample: its cotangent
    is 1 at that position in every sample, and each sample's inputs get that sample's row
    (unsigned, so that every bit, zeros' signs too, is what a one-hot VJP would give a
    backward that keeps the samples apart). ``None`` where the samples are not
    independent. The VJPs are batched or looped as the pass by columns would take them.

    Entries between different samples are taken as zero: the second pass, which compares
    whole gradients with these rows, is what would see a backward that is not."""
    be, out = p.be, p.outputs[k]
    b = _output_samples(p, k)
    if b is None:
        return None
    m = be.numel(out)
    per = m // b
    dtype = be.to_numpy(out).dtype

    def merged(c0, c1):
        cot = np.zeros((c1 - c0, b, per), dtype=dtype)
        cot[np.arange(c1 - c0), :, c0 + np.arange(c1 - c0)] = 1
        return be.reshape(be.array_like(cot, out), (c1 - c0, *out.shape))

    rows = [np.zeros((m, be.numel(x)), dtype=be.to_numpy(x).dtype) for x in inputs]

    def write(cols, c0, c1):
        for i, (a, x) in enumerate(zip(cols, inputs)):
            n_per = be.numel(x) // b
            g = be.to_numpy(a).T.reshape(c1 - c0, b, n_per)
            for s in range(b):
                rows[i][s * per + c0:s * per + c1, s * n_per:(s + 1) * n_per] = g[:, s]

    batched = []
    for c0, c1 in _column_blocks(p, per, sum(be.numel(x) for x in inputs)):
        cols, looped = _columns_and_how(p, k, c0, c1, inputs, merged)
        if not looped:
            batched.append((c0, c1))
        write(cols, c0, c1)
    if batched and p._vjp_batched is False:
        # the loop won after these blocks were batched to price it: one VJP per position
        # again, so that the second pass (one VJP per column, or coloured) can reproduce
        # the whole pass bit for bit where the backward keeps the samples apart
        for c0, c1 in batched:
            write(_looped_columns(p, k, c0, c1, inputs, merged), c0, c1)
    p.run.engine_log.append(EngineEvent("vjp", "by samples", None, figures={"samples": b}))
    return rows


def _exact_second_pass(p, k, inputs, blocks, how=None) -> tuple[list | None, bool]:
    """The reentrancy pass column by column, each block computed as the first pass
    computed it (``how``: its ``(c0, c1, looped)`` blocks), so that a deterministic
    backward reproduces it bit for bit: a batched VJP and one VJP per column may round
    differently, which ``nondet_tol = 0`` would take for a backward that is not
    reentrant. Without ``how`` (a first pass by samples) the blocks are chosen anew, and
    where every one was computed one VJP per column, as the reference engine computes
    its first pass, their rows (per input, ``(m, n)``) are returned; else ``None``.

    A first pass by samples computed its columns differently (merged cotangents, some
    blocks batched while the loop was priced), so a block that differs from it is
    computed once more, as this pass computed it: only where those two differ is the
    backward not reentrant. Where they agree, the block's rows replace the first pass's
    (theirs are the exact Jacobian) and the second value returned is True."""
    m = p.be.numel(p.outputs[k])
    by_samples = how is None
    if by_samples:
        how = ((c0, c1, None) for c0, c1 in _column_blocks(p, m, sum(p.be.numel(x) for x in inputs)))
    exact = [np.empty_like(block.by_output) for block in blocks] if by_samples else None
    corrected = False
    for c0, c1, looped in how:
        if looped is None:
            second, looped = _columns_and_how(p, k, c0, c1, inputs)
            if not looped:
                exact = None
        else:
            second = _columns_as_computed(p, k, c0, c1, inputs, looped)
        second = [p.be.to_numpy(a).T for a in second]
        if _differ(p, [block.by_output[c0:c1] for block in blocks], second):
            if not by_samples:
                raise EngineFallback("backward not reentrant")
            third = [p.be.to_numpy(a).T for a in _columns_as_computed(p, k, c0, c1, inputs, looped)]
            if _differ(p, second, third):
                raise EngineFallback("backward not reentrant")
            for block, a2 in zip(blocks, second):
                block.by_output[c0:c1] = a2
                block.forget_pattern()
            corrected = True
        if exact is not None:
            for i, a2 in enumerate(second):
                exact[i][c0:c1] = a2
    if corrected:
        p.run.engine_log.append(EngineEvent("vjp", "corrected", None, "the pass by samples rounded differently"))
    return exact, corrected


def _columns_as_computed(p, k, c0, c1, inputs, looped):
    """Columns ``c0:c1`` of output ``k`` one VJP each (``looped``) or batched."""
    if looped:
        return _looped_columns(p, k, c0, c1, inputs)
    second = _unless_batching_fails(p, _batched_columns, p, k, c0, c1, inputs)
    if second is None:
        raise EngineFallback("batched VJPs failed in the reentrancy pass")
    return second


def _differ(p, first, second) -> bool:
    """Whether two passes' rows of one column block (per input) differ by more than
    ``nondet_tol``."""
    with np.errstate(invalid="ignore", over="ignore"):  # inf - inf is NaN, quietly
        return any(a.size and np.max(np.abs(a - b)) > p.opts.nondet_tol for a, b in zip(first, second))


def _coloured_second_pass(p, k, inputs, blocks) -> bool:
    """The reentrancy pass by coloured VJPs; True when it reproduced the first pass."""
    be, out = p.be, p.outputs[k]
    m = be.numel(out)
    if m < _MIN_COLOURED_OUTPUTS:
        return False
    rng = np.random.default_rng(coloured.SIGN_SEED)
    by_colouring = {}
    limit = _MAX_COLOUR_SHARE * m // 3
    for i, block in enumerate(blocks):
        colour = None
        if block.widest(axis=0) <= limit:  # else no colouring can do (known without the pattern)
            out_idx, in_idx = block.pattern()
            colour = coloured.colour_columns(in_idx, out_idx, m, limit)
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
        with np.errstate(invalid="ignore", over="ignore"):
            apart = got.size and not np.max(np.abs(got - expected)) <= p.opts.nondet_tol
        if apart:
            return False
    return True


def _projection_vjps(p):
    """``vjps(k, stacked, count)`` for the forward-mode path's few cotangents: batched,
    unless a batched VJP failed."""
    return lambda k, stacked, count: _vjps_of(p, k, stacked, count, batched=p._vjp_batched is not False)


def _unless_batching_fails(p, call, *args):
    """``call(*args)`` (a batched VJP), or ``None`` where the backward cannot run batched
    (an op without a batching rule, a custom Function that is not vmappable): its VJPs
    are then computed one at a time from now on, as the reference engine computes them,
    and a backward that fails outright fails there too."""
    try:
        return call(*args)
    except EngineFallback:
        raise
    except Exception as e:  # noqa: BLE001 - looped by the caller, where a real failure recurs
        if e in p.run.user_errors:
            raise
        p._vjp_batched = False
        p.run.engine_log.append(EngineEvent("vjp", "looped", None, f"batched VJPs failed ({type(e).__name__})"))
        return None


def _vjps_of(p, k, stacked, count, batched=None) -> list:
    """VJPs of output ``k`` with each of ``count`` stacked cotangents, batched or looped
    as the first pass found cheaper (or as ``batched`` says, unless batching fails)."""
    if batched is None:
        batched = p._vjp_batched is not False
    try:
        grads = _unless_batching_fails(p, p.vjps, k, stacked, count, True) if batched else None
        return p.vjps(k, stacked, count, False) if grads is None else grads
    except ValueError as e:
        if e in p.run.user_errors:
            raise
        raise EngineFallback(str(e)) from None


def _compare_columns(p, k, c0, c1, inputs, numerical, offset=0) -> None:
    be, opts = p.be, p.opts
    first = _analytical_columns(p, k, c0, c1, inputs)
    second = _analytical_columns(p, k, c0, c1, inputs)
    for a1, a2 in zip(first, second):
        if be.numel(a1) and be.max_abs_difference(a1, a2) > opts.nondet_tol:
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
        p = Problem(run, piece.fn, piece.trace, piece.args, piece.checked)
        _forward(run, p, piece.diff)
    except EngineFallback as reason:
        exact = None
        if p is not None and str(reason) == MISMATCH:
            if isinstance(reason, _RowsKept):
                try:
                    decided = failure.decide_forward(p, piece.diff, reason.analytical, reason.kept, reason.where)
                except EngineFallback:
                    decided = None
                if decided is not None:
                    return decided
            _finish_rows(p)
            exact = p.exact_numerical()
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

        if coloured.try_compressed_forward(p, checked, diff, jvp_signed):
            run.progress.advance(n_in_total(be, args, checked))
            return
    # every row computed is kept where a failure can be decided from them: the first row
    # block that differs ends the comparison, not the rows
    kept = failure.KeptRows(p) if failure.may_decide(p) else None
    jvp_rows, differs = failure.RowStore(be), None
    for j, q in enumerate(checked):
        probe = None
        remembered = p.remembered(q)  # the reverse-mode pass's rows
        if remembered is not None and kept is not None:
            kept.add(q, 0, be.numel(args[q]), remembered.rows)
        if remembered is None and not p.batched_ok(q) and be.numel(args[q]):
            # a batched JVP first: if it fails (random ops or ops without a batching rule
            # under vmap), it fails before a looped numerical side that the reference
            # engine would compute again
            probe = be.jvp_rows(fn, args, checked, j, [0])
        for s, e, rows in _jvp_blocks(p, q, p.numerical_row_chunks(q), kept if remembered is None else None):
            # a one-element input's rows are the probe's: its jvp runs once, as in torch
            analytical = probe if probe is not None and (s, e) == (0, 1) else _jvp_rows(p, j, s, e)
            probe = None
            if len(analytical) != len(p.floats):
                raise EngineFallback("outputs changed")
            for a, k in zip(analytical, p.floats):
                if opts.check_grad_dtypes and be.is_complex(a) != be.is_complex(p.outputs[k]):
                    raise EngineFallback("forward gradient dtype differs from its output's")
            if kept is not None:
                for i, (a, k) in enumerate(zip(analytical, p.floats)):
                    a = be.zeros((e - s, be.numel(p.outputs[k])), like=p.outputs[k]) if a is None else a
                    jvp_rows.add((j, i), s, be.reshape(a, (e - s, -1)), be.numel(args[q]))
            if differs is not None:
                continue
            for i, k in enumerate(diff):
                a = analytical[i]  # torch pairs the i-th differentiable output with the i-th floating one
                if a is None:
                    a = be.zeros(tuple(rows[k].shape), like=rows[k])
                n_rows = be.to_device_of(rows[k], a)
                if tuple(a.shape) != tuple(n_rows.shape):
                    raise EngineFallback(MISMATCH)  # the reference engine reports it as torch does
                if not be.allclose(a, n_rows, opts.rtol, opts.atol):
                    differs = _differing_block(kept, (q, k, s, e))
                    break
        if differs is None and kept is not None:
            kept.passed.add(q)
    if differs is not None:
        raise _RowsKept(jvp_rows, kept, differs)


def _jvp_blocks(p, q, chunks, kept):
    """The numerical row blocks ``chunks`` of input ``q`` (each given to ``kept``, when
    not ``None``), cut into the blocks one batched JVP computes within the batch memory
    at the memory the shapes imply for a row (:meth:`Problem.chunk_rows`): rows computed
    one element at a time come in one block of any size, and a JVP of them all at once would hold every
    tangent and its intermediates."""
    be = p.be
    n = be.numel(p.args[q])
    estimate = _derivative_row_bytes(p, n)
    for s, e, rows in chunks:
        if kept is not None:
            kept.add(q, s, e, rows)
        a = s
        while a < e:
            b = min(e, a + p.chunk_rows(estimate, n))
            yield a, b, rows if (a, b) == (s, e) else {k: r[a - s:b - s] for k, r in rows.items()}
            a = b


def _jvp_rows(p, j, s, e):
    """The forward-mode rows ``s:e`` of input ``p.checked[j]`` (one batched JVP)."""
    return p.be.jvp_rows(p.fn, p.args, p.checked, j, list(range(s, e)))
