"""The analytical side of the slow-mode engine in reverse mode: Jacobian columns by VJPs
(batched, or one per column), a first pass by samples, and the reentrancy pass."""
from __future__ import annotations

import time

import numpy as np

from agcheck.core.outcome import EngineEvent
from agcheck.engine import coloured, colouring
from agcheck.engine.rows import INTERMEDIATES

__all__ = ["EngineFallback", "MIN_VJP_SAMPLES", "column_blocks", "analytical_columns", "columns_and_how",
           "batched_columns", "looped_columns", "analytical_first_pass", "reentrancy_pass", "first_pass_by_samples",
           "projection_vjps", "vjps_of", "derivative_row_bytes"]


class EngineFallback(Exception):
    """The engine cannot decide a check; its entry points return it as undecided."""


#: outputs below this many elements get the second analytical pass column by column
_MIN_COLOURED_OUTPUTS = 64
#: the pass by samples saves ``m - m / B`` VJPs on a pass; a failure may pay ``m / B`` more,
#: with two samples and a coloured second pass about the ``2 m`` VJPs of torch's checker
MIN_VJP_SAMPLES = 2
#: batched VJPs give way to one per column where those cost under this share of them
#: (:func:`_price_batched_vjps`): away from a tie noise could flip
LOOPED_VJP_MARGIN = 0.7
#: the coloured reentrancy pass is taken when it needs at most this many thirds of the VJPs
#: of the column-by-column pass (a CNN on a small image needs about half)
_MAX_COLOUR_SHARE = 2


def derivative_row_bytes(p, n_in: int) -> int:
    """The estimated bytes of one row of a batched VJP or JVP over ``n_in`` input elements."""
    return (n_in + p.out_numel) * p.itemsize * INTERMEDIATES * 2


def column_blocks(p, m, n_in):
    """``[0, m)`` in blocks of as many columns as one batched VJP takes within the batch memory."""
    size = p.chunk_rows(derivative_row_bytes(p, n_in), m)
    return [(c0, min(m, c0 + size)) for c0 in range(0, m, size)]


def analytical_columns(p, k, c0, c1, inputs):
    """``J[:, c0:c1]`` for every input, by one batched VJP or one VJP per column."""
    return columns_and_how(p, k, c0, c1, inputs)[0]


def columns_and_how(p, k, c0, c1, inputs, cotangents=None):
    """:func:`analytical_columns`, and whether they were computed one VJP per column (as the
    reference engine computes them, bit for bit); ``cotangents(c0, c1)`` replaces one-hots."""
    if p._vjp_batched is not False:
        started = time.thread_time()
        cols = unless_batching_fails(p, batched_columns, p, k, c0, c1, inputs, cotangents)
        if cols is not None:
            if p._vjp_batched is None:
                p._vjp_batched = True
                p.run.engine_log.append(EngineEvent("vjp", "batched", None, figures={"columns_per_batch": c1 - c0}))
            elif not p.vjps_priced and c1 - c0 > 1:  # the second batch: the first may pay one-time imports
                p.vjps_priced = True
                _price_batched_vjps(p, k, c0, c1, inputs, cotangents, time.thread_time() - started)
            return cols, False
    return looped_columns(p, k, c0, c1, inputs, cotangents), True


def _price_batched_vjps(p, k, c0, c1, inputs, cotangents, batched_seconds) -> None:
    """VJPs one per column from now on where one of them, timed on this thread's CPU clock
    right after the batch (the faster of two: the first may meet the batch's freed memory),
    costs under ``LOOPED_VJP_MARGIN`` of the batch's share per column (a batched backward
    of a matrix-vector product or a 3-D convolution: 2.5 to 5 times the loop's)."""
    one = []
    for _ in range(2):
        started = time.thread_time()
        looped_columns(p, k, c0, c0 + 1, inputs, cotangents)
        one.append(time.thread_time() - started)
    if min(one) * (c1 - c0) < LOOPED_VJP_MARGIN * batched_seconds:
        p._vjp_batched = False
        p.run.engine_log.append(EngineEvent("vjp", "looped", None, "one VJP per column costs less than batched ones"))


def batched_columns(p, k, c0, c1, inputs, cotangents=None):
    """``J[:, c0:c1]`` of output ``k`` per input, by one batched VJP."""
    return _vjp_columns(p, k, c0, c1, inputs, cotangents, batched=True)


def looped_columns(p, k, c0, c1, inputs, cotangents=None):
    """``J[:, c0:c1]`` of output ``k`` per input, by one VJP per column."""
    return _vjp_columns(p, k, c0, c1, inputs, cotangents, batched=False)


def _vjp_columns(p, k, c0, c1, inputs, cotangents, batched):
    be, count = p.be, c1 - c0
    stacked = be.one_hots(p.outputs[k], list(range(c0, c1))) if cotangents is None else cotangents(c0, c1)
    try:
        grads = p.vjps(k, stacked, count, batched)
    except ValueError as e:  # the looped VJPs of one input differ in shape
        if batched or e in p.run.user_errors:
            raise
        raise EngineFallback("gradient of unexpected shape or dtype") from None
    cols = []
    for g, x in zip(grads, inputs):
        if g is None:
            cols.append(be.zeros((be.numel(x), count), like=x))
            continue
        if tuple(g.shape) != (count, *x.shape) or g.dtype != x.dtype:
            raise EngineFallback("gradient of unexpected shape or dtype")
        dense = be.to_dense(g)
        cols.append(be.xp(dense).permute_dims(be.xp(dense).reshape(dense, (count, be.numel(x))), (1, 0)))
    return cols


def analytical_first_pass(p, k, inputs):
    """Output ``k``'s Jacobian, a :class:`coloured.DenseBlock` per input, and ``how``: the
    column blocks ``(c0, c1, looped)`` as computed, or ``None`` for a pass by samples."""
    rows = first_pass_by_samples(p, k, inputs)
    how = None
    if rows is None:
        rows, how = first_pass_by_columns(p, k, inputs)
    return [coloured.DenseBlock(r) for r in rows], how


def reentrancy_pass(p, k, inputs, blocks, how) -> bool:
    """The second pass over output ``k``, which has to reproduce ``blocks``: coloured where
    the pattern allows, else column by column as the first pass was computed (only a
    difference there fails the check). Both compare whole gradients, so a backward that
    reaches another sample does not pass unseen. The columns computed one VJP each are
    noted for a failing check. True where a pass by samples was corrected."""
    exact, corrected = None, False
    if not coloured_second_pass(p, k, inputs, blocks):
        exact, corrected = exact_second_pass(p, k, inputs, blocks, how)
    rows = [block.by_output for block in blocks]
    if exact is not None:
        p.note_exact_columns(k, [(0, p.be.numel(p.outputs[k]))], exact)
    elif how is not None:
        p.note_exact_columns(k, [(c0, c1) for c0, c1, looped in how if looped], rows)
    return corrected


def first_pass_by_columns(p, k, inputs):
    """Output ``k``'s Jacobian by one-hot VJPs, per input ``(m, n)`` rows, and the column
    blocks ``(c0, c1, looped)`` as computed."""
    be = p.be
    m = be.numel(p.outputs[k])
    rows, how = None, []
    for c0, c1 in column_blocks(p, m, sum(be.numel(x) for x in inputs)):
        first, looped = columns_and_how(p, k, c0, c1, inputs)
        how.append((c0, c1, looped))
        if rows is None:
            rows = [np.empty((m, be.numel(x)), dtype=be.to_numpy(a).dtype) for x, a in zip(inputs, first)]
        for i, a in enumerate(first):
            rows[i][c0:c1] = be.to_numpy(a).T
    if rows is None:  # an empty output
        rows = [np.zeros((0, be.numel(x)), dtype=be.to_numpy(x).dtype) for x in inputs]
    return rows, how


def output_samples(p, k) -> int | None:
    """``B`` when output ``k`` and every checked input hold ``B >= MIN_VJP_SAMPLES``
    independent samples along their first dimension, else ``None``."""
    shape = tuple(p.outputs[k].shape)
    m = p.be.numel(p.outputs[k])
    if not shape or shape[0] < MIN_VJP_SAMPLES:
        return None
    b = shape[0]
    # the inputs' shapes first (no call of fn), then the probes, where the VJPs the pass
    # saves outnumber the probes' calls of fn
    if not all(p._sample_candidate(q) == b for q in p.checked):
        return None
    if m - m // b < (b + 1) * sum(1 for q in p.checked if not p.samples_probed(q)):
        return None
    return b if all(p.samples(q) == b for q in p.checked) else None


def first_pass_by_samples(p, k, inputs):
    """The first pass's rows by one VJP per element position, 1 at it in every sample, or
    ``None`` where the samples are not independent. Unsigned, so that every bit, zeros'
    signs too, is a one-hot VJP's; entries between samples are taken as zero (the second
    pass, comparing whole gradients, would see a backward that mixes samples)."""
    be, out = p.be, p.outputs[k]
    b = output_samples(p, k)
    if b is None:
        return None
    m = be.numel(out)
    per = m // b
    dtype = be.to_numpy(out).dtype

    def merged(c0, c1):
        cot = np.zeros((c1 - c0, b, per), dtype=dtype)
        cot[np.arange(c1 - c0), :, c0 + np.arange(c1 - c0)] = 1
        return be.array_like(cot.reshape(c1 - c0, *out.shape), out)

    rows = [np.zeros((m, be.numel(x)), dtype=be.to_numpy(x).dtype) for x in inputs]

    def write(cols, c0, c1):
        for i, (a, x) in enumerate(zip(cols, inputs)):
            n_per = be.numel(x) // b
            g = be.to_numpy(a).T.reshape(c1 - c0, b, n_per)
            for s in range(b):
                rows[i][s * per + c0:s * per + c1, s * n_per:(s + 1) * n_per] = g[:, s]

    batched = []
    for c0, c1 in column_blocks(p, per, sum(be.numel(x) for x in inputs)):
        cols, looped = columns_and_how(p, k, c0, c1, inputs, merged)
        if not looped:
            batched.append((c0, c1))
        write(cols, c0, c1)
    if batched and p._vjp_batched is False:
        # the loop won after these blocks were batched to price it: looped again, so that
        # the second pass can reproduce the whole pass bit for bit
        for c0, c1 in batched:
            write(looped_columns(p, k, c0, c1, inputs, merged), c0, c1)
    p.run.engine_log.append(EngineEvent("vjp", "by samples", None, figures={"samples": b}))
    return rows


def exact_second_pass(p, k, inputs, blocks, how=None) -> tuple[list | None, bool]:
    """The reentrancy pass column by column, each block computed as ``how`` says the first
    was (batched and looped VJPs may round differently, which ``nondet_tol = 0`` would take
    for a backward that is not reentrant); returns ``(exact rows or None, corrected)``.

    Without ``how`` (a pass by samples, computed differently) a block that differs is
    computed once more: only if those two differ is the backward not reentrant, else they
    replace the first pass's rows (``corrected``); its exact rows are returned where every
    block was computed one VJP per column."""
    m = p.be.numel(p.outputs[k])
    by_samples = how is None
    if by_samples:
        how = ((c0, c1, None) for c0, c1 in column_blocks(p, m, sum(p.be.numel(x) for x in inputs)))
    exact = [np.empty_like(block.by_output) for block in blocks] if by_samples else None
    corrected = False
    for c0, c1, looped in how:
        if looped is None:
            second, looped = columns_and_how(p, k, c0, c1, inputs)
            if not looped:
                exact = None
        else:
            second = columns_as_computed(p, k, c0, c1, inputs, looped)
        second = [p.be.to_numpy(a).T for a in second]
        if differ(p, [block.by_output[c0:c1] for block in blocks], second):
            if not by_samples:
                raise EngineFallback("backward not reentrant")
            third = [p.be.to_numpy(a).T for a in columns_as_computed(p, k, c0, c1, inputs, looped)]
            if differ(p, second, third):
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


def columns_as_computed(p, k, c0, c1, inputs, looped):
    """Columns ``c0:c1`` of output ``k`` one VJP each (``looped``) or batched."""
    if looped:
        return looped_columns(p, k, c0, c1, inputs)
    second = unless_batching_fails(p, batched_columns, p, k, c0, c1, inputs)
    if second is None:
        raise EngineFallback("batched VJPs failed in the reentrancy pass")
    return second


def differ(p, first, second) -> bool:
    """Whether two passes' rows of one column block differ by more than ``nondet_tol``."""
    with np.errstate(invalid="ignore", over="ignore"):  # inf - inf is NaN, quietly
        return any(a.size and np.max(np.abs(a - b)) > p.opts.nondet_tol for a, b in zip(first, second))


def coloured_second_pass(p, k, inputs, blocks) -> bool:
    """The reentrancy pass by coloured VJPs; True when it reproduced the first pass."""
    be, out = p.be, p.outputs[k]
    m = be.numel(out)
    if m < _MIN_COLOURED_OUTPUTS:
        return False
    rng = np.random.default_rng(colouring.SIGN_SEED)
    by_colouring = {}
    limit = _MAX_COLOUR_SHARE * m // 3
    for i, block in enumerate(blocks):
        colour = None
        if block.widest(axis=0) <= limit:  # else no colouring can do (known without the pattern)
            out_idx, in_idx = block.pattern()
            colour = colouring.colour_columns(in_idx, out_idx, m, limit)
        if colour is None:
            p.run.engine_log.append(EngineEvent("vjp", "column by column", i, "input reaches too many outputs"))
            return False
        by_colouring.setdefault(colour.tobytes(), (colour, []))[1].append(i)
    n_in = sum(be.numel(x) for x in inputs)
    for colour, members in by_colouring.values():
        n_colours = int(colour.max()) + 1
        signs = rng.choice(np.array([-1.0, 1.0]), size=m)
        for c0, c1 in column_blocks(p, n_colours, n_in):
            if not coloured_chunk_matches(p, k, inputs, blocks, members, colour, signs, c0, c1):
                p.run.engine_log.append(EngineEvent("vjp", "column by column", None, "coloured second pass differs"))
                return False
    p.run.engine_log.append(EngineEvent("vjp", "coloured"))
    return True


def coloured_chunk_matches(p, k, inputs, blocks, members, colour, signs, c0, c1) -> bool:
    """Colour classes ``c0:c1`` of the coloured second pass reproduce the first pass."""
    be, out = p.be, p.outputs[k]
    m = be.numel(out)
    count = c1 - c0
    chosen = np.flatnonzero((colour >= c0) & (colour < c1))
    cot = np.zeros((count, m))
    cot[colour[chosen] - c0, chosen] = signs[chosen]
    stacked = be.array_like(cot.astype(be.to_numpy(out).dtype).reshape(count, *out.shape), out)
    grads = vjps_of(p, k, stacked, count)
    flat = p.flat_gradients([grads[i] for i in members], [inputs[i] for i in members], count)
    if flat is None:
        return False
    for i, got in zip(members, flat):
        block = blocks[i]
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


def projection_vjps(p):
    """``vjps(k, stacked, count)`` for the forward-mode path: batched unless batching failed."""
    return lambda k, stacked, count: vjps_of(p, k, stacked, count, batched=p._vjp_batched is not False)


def unless_batching_fails(p, call, *args):
    """``call(*args)`` (a batched VJP), or ``None`` where the backward cannot run batched
    (no batching rule, a Function that is not vmappable): the VJPs are then looped from
    now on, where a backward that fails outright fails again."""
    try:
        return call(*args)
    except EngineFallback:
        raise
    except Exception as e:  # noqa: BLE001 - looped by the caller, where a real failure recurs
        if e in p.run.user_errors:
            raise
        p._vjp_batched = False
        why = f"{type(e).__name__}: {e}" if isinstance(e, NotImplementedError) else type(e).__name__  # a refusal says why
        p.run.engine_log.append(EngineEvent("vjp", "looped", None, f"batched VJPs failed ({why})"))
        return None


def vjps_of(p, k, stacked, count, batched=None) -> list:
    """VJPs of output ``k`` with ``count`` stacked cotangents, batched or looped as the first
    pass found cheaper, or as ``batched`` says."""
    if batched is None:
        batched = p._vjp_batched is not False
    try:
        grads = unless_batching_fails(p, p.vjps, k, stacked, count, True) if batched else None
        return p.vjps(k, stacked, count, False) if grads is None else grads
    except ValueError as e:
        if e in p.run.user_errors:
            raise
        raise EngineFallback(str(e)) from None
