"""The slow-mode engine in forward mode: numerical rows against batched JVP rows, block by
block within the batch memory."""
from __future__ import annotations

import functools

from agcheck.backends.base import Capability
from agcheck.core.numerical_rows import InputRows
from agcheck.core.outcome import PASSED, Outcome, undecided
from agcheck.engine import coloured, columns, failure
from agcheck.engine.batched import MISMATCH, EngineFallback, _Decidable, _differing_block, _require_dense
from agcheck.engine.rows import Problem, n_in_total

__all__ = ["compare_slow_forward"]


def compare_slow_forward(run, piece) -> Outcome:
    """Slow-mode forward check of one piece: passed, or undecided with a reason."""
    p = None
    try:
        _require_dense(run.be, piece.args)
        p = Problem(run, piece.fn, piece.trace, piece.args, piece.checked)
        if not run.be.supports(Capability.BATCHED_JVP):
            raise EngineFallback("no batched JVP")
        # tried from this frame: its probes' calls of fn run one frame below the next
        if run.opts.engine == "auto" and coloured.try_compressed_forward(
                p, piece.checked, piece.diff, functools.partial(_jvp_signed, p)):
            run.progress.advance(n_in_total(run.be, piece.args, piece.checked))
            return PASSED
        _forward(run, p, piece.diff)
    except EngineFallback as reason:
        if p is not None and str(reason) == MISMATCH:
            if isinstance(reason, _Decidable):
                try:
                    decided = failure.decide_forward(p, piece.diff, reason.analytical, reason.where)
                except EngineFallback:
                    decided = None
                if decided is not None:
                    return decided
        return undecided(str(reason))
    return PASSED


def _jvp_signed(p, j, signs) -> list:
    """The JVPs along the signed moves ``signs`` of input ``p.checked[j]`` (NumPy arrays)."""
    be, x = p.be, p.args[p.checked[j]]
    stacked = be.array_like(signs.astype(be.to_numpy(x).dtype).reshape(len(signs), *x.shape), x)
    return [None if a is None else be.to_numpy(a) for a in be.jvp_along(p.fn, p.args, p.checked, j, stacked)]


def _forward(run, p, diff) -> None:
    be = run.be
    fn, args, checked = p.fn, p.args, p.checked
    # where a failure can be decided from the rows, the first block that differs ends the
    # comparison but not the rows
    decidable = failure.may_decide(p)
    jvp_rows, differs = {}, None
    for j, q in enumerate(checked):
        probe = None
        if q not in p.remembered and not p.batched_ok(q) and be.numel(args[q]):
            # a batched JVP that fails (random ops, no batching rule) fails before a looped
            # numerical side that the reference engine would compute again
            probe = be.jvp_rows(fn, args, checked, j, [0])
        for chunk in p.numerical_row_chunks(q):  # fn's calls run one frame below this one
            for s, e, rows in _jvp_blocks(p, q, chunk):
                # a one-element input's rows are the probe's: its jvp runs once, as in torch
                analytical = probe if probe is not None and (s, e) == (0, 1) else \
                    be.jvp_rows(fn, args, checked, j, list(range(s, e)))
                probe = None
                _keep_jvp_rows(p, analytical, decidable, jvp_rows, j, q, s, e)
                if differs is None:
                    differs = _block_differs(p, diff, analytical, rows, decidable, (q, s, e))
        if differs is None and decidable:
            p.passed.add(q)
    if differs is not None:
        raise _Decidable(jvp_rows, differs)


def _keep_jvp_rows(p, analytical, decidable, jvp_rows, j, q, s, e) -> None:
    """Check the JVP rows ``s:e`` of input ``q`` and, where ``decidable``, keep them
    (undefined ones as zeros)."""
    be = p.be
    if len(analytical) != len(p.floats):
        raise EngineFallback("outputs changed")
    for a, k in zip(analytical, p.floats):
        if p.opts.check_grad_dtypes and be.is_complex(a) != be.is_complex(p.outputs[k]):
            raise EngineFallback("forward gradient dtype differs from its output's")
    if decidable:
        rows = {}
        for i, (a, k) in enumerate(zip(analytical, p.floats)):
            a = be.zeros((e - s, be.numel(p.outputs[k])), like=p.outputs[k]) if a is None else a
            rows[i] = be.xp(a).reshape(a, (e - s, -1))
        jvp_rows.setdefault(j, InputRows(be, be.numel(p.args[q]))).add(s, e, rows, exact=False)


def _block_differs(p, diff, analytical, rows, decidable, where):
    """``(input, output, start, stop)`` of the first output whose JVP rows differ from the
    numerical rows of block ``where`` (input, start, stop), else None."""
    be, opts = p.be, p.opts
    q, s, e = where
    for i, k in enumerate(diff):
        a = analytical[i]  # torch pairs the i-th differentiable output with the i-th floating one
        if a is None:
            a = be.zeros(tuple(rows[k].shape), like=rows[k])
        n_rows = be.to_device_of(rows[k], a)
        if tuple(a.shape) != tuple(n_rows.shape):
            raise EngineFallback(MISMATCH)  # the reference engine reports it as torch does
        if not be.allclose(a, n_rows, opts.rtol, opts.atol):
            return _differing_block(decidable, (q, k, s, e))
    return None


def _jvp_blocks(p, q, chunk):
    """The numerical row block ``chunk`` of input ``q`` cut into blocks one batched JVP
    computes within the batch memory (rows computed element by element come in one block
    of any size)."""
    be = p.be
    n = be.numel(p.args[q])
    estimate = columns.derivative_row_bytes(p, n)
    s, e, rows = chunk
    a = s
    while a < e:
        b = min(e, a + p.chunk_rows(estimate, n))
        yield a, b, rows if (a, b) == (s, e) else {k: r[a - s:b - s] for k, r in rows.items()}
        a = b
