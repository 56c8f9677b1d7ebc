"""The batched slow-mode engine: the reference engine's verdicts, faster, in bounded memory.

Numerical rows come from ``fn`` evaluated on batches of moved copies of an input
(:mod:`~agcheck.engine.rows`); analytical columns from batched VJPs (one cotangent per
element position of all samples where the output and the inputs hold independent samples),
forward rows from batched JVPs, or the whole Jacobian from JVPs where outputs far outnumber
inputs (:mod:`~agcheck.engine.forward_jacobian`). At most one side's Jacobian is kept
whole, and only within the memory budget. Whatever it cannot do, and any disagreement, it
hands back to the reference engine with the rows it computed element by element; where
every row was kept, a mismatch is first confirmed so that a failure costs about what a pass
costs (:mod:`~agcheck.engine.failure`).
"""
from __future__ import annotations

from agcheck.core.outcome import PASSED, Outcome, undecided
from agcheck.engine import coloured, columns, failure, forward_jacobian
from agcheck.engine.columns import EngineFallback
from agcheck.engine.rows import DEFAULT_MEMORY_BUDGET, Problem, n_in_total

__all__ = ["compare_slow_reverse", "EngineFallback", "MISMATCH", "DEFAULT_MEMORY_BUDGET"]

#: outputs of at least this many elements get batched VJPs where no input can be batched
_MIN_BATCHED_COLUMNS = 8


def _require_dense(be, args) -> None:
    """Sparse and opaque layouts are left to the reference engine: it moves stored elements,
    and densifies unmasked inputs."""
    for a in args:
        if be.is_array(a) and be.layout(a) != "dense":
            raise EngineFallback(f"an argument has layout {be.layout(a)!r}")


def compare_slow_reverse(run, piece) -> Outcome:
    """Slow-mode reverse check of one piece: passed, or undecided with a reason."""
    be, opts, args, checked, diff = run.be, run.opts, piece.args, piece.checked, piece.diff
    try:
        _require_dense(be, args)
    except EngineFallback as reason:
        return undecided(str(reason))
    # the paths are chosen in this frame: the probes' calls of fn run one frame below it
    p = Problem(run, piece.fn, piece.trace, args, checked)
    try:
        # compressed differences need a few dozen evaluations: worth it also one call at a time
        if opts.engine == "auto" and coloured.try_compressed_reverse(p, checked, diff):
            run.progress.advance(n_in_total(be, args, checked))
            return PASSED
        n_in = n_in_total(be, args, checked)
        colourable = opts.engine == "auto" and n_in * p.out_numel >= coloured.MIN_ENTRIES
        # inputs are probed only as a path needs them: a check whose first input's rows raise
        # (where torch's checker meets the error) pays no probe of the others; where rows are
        # kept, an unbatchable input's rows are computed before the next input is probed
        batchable = p.keep_rows and (colourable or _columns_may_batch(p, diff))
        if not batchable:
            for q in checked:
                batchable = p.batched_ok(q)
                if batchable:
                    break
                if p.keep_rows:
                    for _ in p.numerical_row_chunks(q, report=False):
                        pass
        if not batchable:
            raise EngineFallback("no input can be moved in batches")
        if not p.keep_rows:
            _reverse_by_column_blocks(p, diff, n_in)
            return PASSED
        # every numerical row first, in torch's order, where the pattern cannot colour them:
        # an evaluation of fn that raises does so before the analytical side is paid
        numerical: dict | None = None
        if not colourable:
            numerical = {}
            for q in checked:
                numerical[q] = list(p.numerical_row_chunks(q))
        _reverse_whole(run, p, diff, colourable, numerical)
    except EngineFallback as reason:
        return _handed_back(p, piece, reason)
    return PASSED


def _handed_back(p, piece, reason: EngineFallback) -> Outcome:
    """The undecided outcome of a check handed back, with what the engine computed; a
    mismatch seen with whole Jacobians at hand is first confirmed."""
    if str(reason) != MISMATCH:
        return undecided(str(reason))
    inputs = [piece.args[q] for q in piece.checked]
    if isinstance(reason, _Decidable):
        try:
            decided = failure.decide(p, reason.diff or piece.diff, reason.analytical, reason.where,
                                     lambda k, c0, c1: columns.looped_columns(p, k, c0, c1, inputs))
        except EngineFallback:
            decided = None
        if decided is not None:
            return decided
    return undecided(str(reason), p.exact_analytical())


#: the reason of an undecided outcome where the engine saw the Jacobians differ
MISMATCH = "Jacobian mismatch"


class _Decidable(EngineFallback):
    """A mismatch seen with every numerical row kept and the whole analytical Jacobians at
    hand (reverse mode: ``{k: [DenseBlock per input]}``; forward mode: the JVP rows per input
    index); ``where``: ``(input, output, start, stop)`` of the row block seen to differ."""

    def __init__(self, analytical, where):
        super().__init__(MISMATCH)
        self.analytical, self.where = analytical, where
        #: the outputs compared, those ``analytical`` holds (None: all of them)
        self.diff = None


def _reverse_whole(run, p, diff, colourable, numerical) -> None:
    """Reverse mode with whole Jacobians at hand, compared coloured where ``colourable``,
    else against ``numerical`` (every numerical row, computed first)."""
    inputs = [p.args[q] for q in p.checked]
    analytical = forward_jacobian.try_forward_jacobian(p, diff, inputs, columns.projection_vjps(p))
    first = None
    if analytical is None and numerical is not None and len(diff) > 1 and not run.opts.raise_exception:
        _compare_output_by_output(run, p, diff, inputs, numerical)
        return
    if analytical is None:
        first = {k: columns.analytical_first_pass(p, k, inputs) for k in diff}
        analytical = {k: blocks for k, (blocks, _) in first.items()}
    # the reentrancy pass after the numerical side, as in torch: an evaluation of fn that
    # raises does so before it is paid; and before a mismatch is reported, as in torch
    try:
        _compare_with_analytical(run, p, diff, analytical, colourable, numerical)
    except EngineFallback as reason:
        if first is not None:
            _reentrancy_on_mismatch(p, inputs, first, analytical, reason)
        raise
    if first is not None:
        _reentrancy_on_pass(p, inputs, first, analytical)


def _reverse_by_column_blocks(p, diff, n_in) -> None:
    """Reverse mode where whole Jacobians do not fit the budget: per block of output columns,
    the numerical rows (recomputed per block) against the analytical columns."""
    be, checked = p.be, p.checked
    inputs = [p.args[q] for q in checked]
    block = max(1, (p.budget // 2) // max(n_in * p.itemsize, 1))
    for k in diff:
        m = be.numel(p.outputs[k])
        for b0 in range(0, m, block):
            b1 = min(m, b0 + block)
            numerical = {q: _keep_columns(be, p.numerical_row_chunks(q, report=(k == diff[0] and b0 == 0)), k, b0, b1)
                         for q in checked}
            for c0, c1 in columns.column_blocks(p, b1 - b0, n_in):
                _compare_columns(p, k, b0 + c0, b0 + c1, inputs, numerical, offset=b0)


def _compare_output_by_output(run, p, diff, inputs, numerical) -> None:
    """The analytical Jacobians computed and compared one output at a time, as torch orders
    them: a mismatch ends the check before later outputs' VJPs are paid. Only without a
    failure report, which compares every block (the engine's columns cost it less)."""
    analytical, first = {}, {}
    for i, k in enumerate(diff):
        first[k] = columns.analytical_first_pass(p, k, inputs)
        analytical[k] = first[k][0]
        try:
            _compare_with_analytical(run, p, [k], {k: analytical[k]}, False, numerical)
        except EngineFallback as reason:
            if isinstance(reason, _Decidable):  # decided on every output compared so far
                reason.diff, reason.analytical = diff[: i + 1], analytical
            _reentrancy_on_mismatch(p, inputs, first, analytical, reason)
            raise
    _reentrancy_on_pass(p, inputs, first, analytical)


def _reentrancy_on_mismatch(p, inputs, first, analytical, reason) -> None:
    """On a mismatch, the reentrancy passes of the outputs up to the one seen to differ, as
    torch checks an output's reentrancy just before comparing it."""
    if str(reason) != MISMATCH:
        return
    outputs = list(first)
    if isinstance(reason, _Decidable):
        outputs = outputs[: outputs.index(reason.where[1]) + 1]
    corrected = [k for k in outputs if columns.reentrancy_pass(p, k, inputs, *first[k])]
    if corrected and isinstance(reason, _Decidable):
        _failing_again(p, corrected, analytical)


def _reentrancy_on_pass(p, inputs, first, analytical) -> None:
    """Every output's reentrancy pass; the outputs whose first pass it corrected are
    compared again."""
    corrected = [k for k in first if columns.reentrancy_pass(p, k, inputs, *first[k])]
    if corrected:
        _compare_again(p, corrected, analytical)


def _compare_with_analytical(run, p, diff, analytical, colourable, numerical=None):
    """The numerical side against the whole Jacobians ``analytical``, coloured where the
    pattern allows, else by row blocks (``numerical``'s, or computed as compared); the
    inputs that agree go in ``p.passed``. Raises ``MISMATCH`` (:class:`_Decidable` where
    the failure can be decided from the rows)."""
    be, opts, checked = p.be, run.opts, p.checked
    decidable = failure.may_decide(p)
    p.passed = set()
    if colourable and _coloured_agree(run, p, diff, analytical, decidable):
        return
    # the first block that differs ends the comparison, and also the rows unless decidable
    differs = None
    for j, q in enumerate(checked):
        p.passed.discard(q)  # its rows computed again
        for s, e, rows in p.numerical_row_chunks(q) if numerical is None else numerical[q]:
            if differs is not None:
                continue
            for k in diff:
                if not coloured.allclose_like_torch(analytical[k][j].by_input[s:e], be.to_numpy(rows[k]),
                                                      opts.rtol, opts.atol):
                    differs = _differing_block(decidable, (q, k, s, e))
                    break
        if differs is None and decidable:
            p.passed.add(q)
    if differs is not None:
        raise _Decidable(analytical, differs)


def _coloured_agree(run, p, diff, analytical, decidable) -> bool:
    """Whether the numerical side, coloured by the analytical pattern, agrees (False where
    it cannot be coloured); raises as :func:`_compare_with_analytical` does."""
    checked = p.checked
    try:
        if coloured.try_from_analytical(p, checked, diff, analytical, decidable):
            run.progress.advance(n_in_total(p.be, p.args, checked))
            return True
    except coloured.RowsDiffer as differs:
        if not decidable:
            raise EngineFallback(MISMATCH) from None  # decided: no row is computed twice
        for q in checked:  # the coloured inputs' rows, for the failure's decision
            if p.kept_rows(q) is None or not p.kept_rows(q).complete():
                for _ in p.numerical_row_chunks(q, report=False):
                    pass
        raise _Decidable(analytical, differs.where) from None
    return False


def _compare_again(p, corrected, analytical) -> None:
    """The kept rows against the outputs ``corrected`` by their reentrancy pass; without
    every row kept the reference engine compares, with the exact columns noted."""
    failing = _failing_again(p, corrected, analytical)
    if failing is None:
        raise EngineFallback(MISMATCH)
    if failing:
        q, k = failing[0]
        raise _Decidable(analytical, (q, k, 0, p.be.numel(p.args[q])))


def _failing_again(p, corrected, analytical) -> list | None:
    """The blocks ``(input, output)`` of the outputs ``corrected`` whose kept rows differ from
    the corrected Jacobians, their inputs taken out of ``p.passed``; ``None`` where not
    every row was kept."""
    numerical = failure.whole_numerical(p) if failure.may_decide(p) else None
    if numerical is None:
        return None
    opts = p.run.opts
    failing = [(q, k) for j, q in enumerate(p.checked) for k in corrected
               if not coloured.allclose_like_torch(analytical[k][j].by_input, numerical[q][k], opts.rtol, opts.atol)]
    for q, _ in failing:
        p.passed.discard(q)
    return failing


def _differing_block(decidable: bool, where):
    """``where``, the first block that differs, or ``MISMATCH`` raised at once where the
    failure cannot be decided from the rows."""
    if not decidable:
        raise EngineFallback(MISMATCH)
    return where


def _columns_may_batch(p, diff) -> bool:
    """Whether batched VJPs may pay where no input can be batched: a forward that cannot be
    batched (control flow on values, writes into a preallocated result) often has a
    backward that can."""
    if p._vjp_batched is False:
        return False
    return max((p.be.numel(p.outputs[k]) for k in diff), default=0) >= _MIN_BATCHED_COLUMNS


def _keep_columns(be, chunks, k, b0, b1):
    # copies, so that the full rows of a chunk are not kept alive by a view
    return [(s, e, {k: be.xp(rows[k]).asarray(rows[k][:, b0:b1], copy=True)}) for s, e, rows in chunks]


def _compare_columns(p, k, c0, c1, inputs, numerical, offset=0) -> None:
    be, opts = p.be, p.opts
    first = columns.analytical_columns(p, k, c0, c1, inputs)
    second = columns.analytical_columns(p, k, c0, c1, inputs)
    for a1, a2 in zip(first, second):
        if be.numel(a1) and be.max_abs_difference(a1, a2) > opts.nondet_tol:
            raise EngineFallback("backward not reentrant")
    for q, a in zip(p.checked, first):
        for s, e, rows in numerical[q]:
            n_block = be.to_device_of(rows[k][:, c0 - offset:c1 - offset], a)
            if not be.allclose(a[s:e], n_block, opts.rtol, opts.atol):
                raise EngineFallback(MISMATCH)
