"""The analytical Jacobian by forward mode, tied to the backward by random projections.

A slow reverse-mode check compares the Jacobian of ``fn``'s backward ``J_b`` (one VJP per
output element, and every one again for reentrancy) with the numerical Jacobian. When
``fn`` has many more output elements than input elements, the same Jacobian costs far
fewer JVPs: one per input element. The forward-mode Jacobian ``J_f`` stands in for
``J_b`` only once the backward is shown to give it: ``ROUNDS`` VJPs with Gaussian
cotangents ``U`` (one row ``u`` each) must reproduce ``U J_f`` to within
``BOUND * atol * |u|`` per input element, and the same VJPs again must give the same
values to within ``min(nondet_tol, BOUND * atol) * |u|`` (reentrancy: torch bounds each
entry by ``nondet_tol``, which a projection shows only when it differs by next to nothing).

An entry of ``J_b`` off by ``atol`` or more (what could change the verdict) moves its
input element's projection by ``|u_j| atol``, ``u_j`` its output element's weight; it stays
within the bound only if ``|u_j| <= BOUND |u|``, for ``m`` output elements a Gaussian
draw below about ``BOUND sqrt(m)``: probability ``1e-4`` for ``m = 10^4``, in each of the
independent projections. Several wrong entries of one input element add with independent
weights, and do not cancel but by chance of the same order. Rounding (about ``1e-16 |u|``
for float64 convolutions) stays far below the bound, which is why the path is taken for
double precision only. What the projections cannot tie (they differ, the backward is
not reentrant, forward mode is missing) leaves the Jacobian to the VJPs, as does a check
whose counts say the path cannot pay: the VJPs it saves (the reverse passes' less the
JVP rows) must be well above the projections' own.
"""
from __future__ import annotations

import numpy as np

from agcheck.backends.base import Capability
from agcheck.core.outcome import EngineEvent
from agcheck.engine.coloured import DenseBlock
from agcheck.engine.cost import INTERMEDIATES

__all__ = ["try_forward_jacobian", "ROUNDS", "BOUND"]

#: VJPs with Gaussian cotangents that tie the backward to the forward-mode Jacobian
ROUNDS = 8
#: a projection may differ from the forward-mode one by this much, times atol and |u|
BOUND = 1e-6
#: forward mode is tried when the outputs hold at least this many times the inputs' elements
_MIN_OUTPUT_SHARE = 2
#: VJPs per output element the reverse first and reentrancy passes cost (the second pass
#: is coloured when it can be, about half the columns on a CNN)
_REVERSE_PASSES = 1.5
PROJECTION_SEED = 4099
#: the VJPs the path may save must be at least this many times the projections' VJPs
_MIN_SAVED_SHARE = 2


class _Declined(Exception):
    """Forward mode cannot stand in for the backward here; the VJPs compute the Jacobian."""


class _Disagreement(Exception):
    """The backward's projections differ from the forward-mode Jacobian's, or from themselves."""


def try_forward_jacobian(p, diff, inputs, vjps) -> dict | None:
    """The analytical Jacobian of every output in ``diff`` by JVPs, once the backward is
    shown to give it; ``None`` when the VJPs should compute it.

    Parameters
    ----------
    p : Problem
        The piece being checked.
    diff : list of int
        The differentiable outputs.
    inputs : list
        The checked inputs (``p.args[q]`` for ``q`` in ``p.checked``).
    vjps : callable
        ``vjps(k, stacked, count)``: per checked input, the VJPs of output ``k`` with each
        of ``count`` stacked cotangents (an array ``(count, *input.shape)``, or ``None``).

    Returns
    -------
    dict or None
        ``{k: [DenseBlock per checked input]}`` (rows: output elements).
    """
    be = p.be
    n_in = sum(be.numel(x) for x in inputs)
    m_total = sum(be.numel(p.outputs[k]) for k in diff)
    if not n_in or m_total < _MIN_OUTPUT_SHARE * n_in or p.opts.engine != "auto":
        return None
    try:
        _require_applicable(p, diff, inputs)
        saved = _REVERSE_PASSES * m_total - n_in
        if saved < _MIN_SAVED_SHARE * 2 * ROUNDS:
            raise _Declined(f"too small: {saved:.0f} VJPs to save against {2 * ROUNDS} for the projections")
        projections = _projections(p, diff, inputs, vjps)
        blocks = _forward_blocks(p, diff, inputs)
        _tie(p, diff, blocks, projections)
    except _Declined as reason:
        p.run.engine_log.append(EngineEvent("forward", "declined", None, str(reason)))
        return None
    except _Disagreement as reason:
        p.run.engine_log.append(EngineEvent("forward", "disagreement", None, str(reason)))
        return None
    p.run.engine_log.append(EngineEvent("forward", "passed"))
    return {k: [DenseBlock(b) for b in blocks[k]] for k in diff}


def _require_applicable(p, diff, inputs) -> None:
    be = p.be
    if not be.supports(Capability.BATCHED_JVP):
        raise _Declined("no batched JVP")
    if not p.opts.atol > 0:
        raise _Declined("atol is 0: the projections' bound would be 0")
    for a in list(inputs) + [p.outputs[k] for k in diff]:
        if be.is_complex(a) or be.itemsize(a) != 8:
            raise _Declined("not double precision real")
    if any(k not in p.floats for k in diff):
        raise _Declined("a differentiable output is not floating")


def _projections(p, diff, inputs, vjps) -> dict:
    """``{k: (U, |u| per row, [U J_b per input])}``, each VJP computed twice (reentrancy)."""
    be, opts = p.be, p.opts
    rng = np.random.default_rng(PROJECTION_SEED)
    projections = {}
    for k in diff:
        out = p.outputs[k]
        u = rng.standard_normal((ROUNDS, be.numel(out)))
        stacked = be.array_like(u.reshape(ROUNDS, *out.shape), out)
        first, second = (_flat_vjps(p, vjps, k, stacked, inputs) for _ in range(2))
        norms = np.linalg.norm(u, axis=1)[:, None]
        bound = min(opts.nondet_tol, BOUND * opts.atol) * norms
        for a, b in zip(first, second):
            with np.errstate(invalid="ignore", over="ignore"):
                apart = a.size and not np.all(np.abs(a - b) <= bound)
            if apart:
                raise _Disagreement("backward not reentrant on the projections")
        projections[k] = (u, norms, first)
    return projections


def _flat_vjps(p, vjps, k, stacked, inputs) -> list:
    be = p.be
    try:
        grads = vjps(k, stacked, ROUNDS)
    except Exception as e:  # noqa: BLE001 - the VJP path meets it again, and reports it
        if e in p.run.user_errors:
            raise
        raise _Declined(f"{type(e).__name__}: {e}") from None
    flat = []
    for g, x in zip(grads, inputs):
        n = be.numel(x)
        if g is None:
            flat.append(np.zeros((ROUNDS, n)))
            continue
        if tuple(g.shape) != (ROUNDS, *x.shape) or g.dtype != x.dtype:
            raise _Declined("gradient of unexpected shape or dtype")
        flat.append(be.to_numpy(be.to_dense(g)).reshape(ROUNDS, n))
    return flat


def _forward_blocks(p, diff, inputs) -> dict:
    """``{k: [(m, n) NumPy block per input]}`` by batched JVPs of one-hot tangents, as many
    rows per call as the memory the shapes imply allows (:meth:`Problem.chunk_rows`)."""
    be = p.be
    n_in = sum(be.numel(x) for x in inputs)
    blocks = {k: [np.empty((be.numel(p.outputs[k]), be.numel(x))) for x in inputs] for k in diff}
    size = p.chunk_rows((n_in + p.out_numel) * p.itemsize * INTERMEDIATES * 2, n_in)
    for j, x in enumerate(inputs):
        for s in range(0, be.numel(x), size):
            e = min(be.numel(x), s + size)
            try:
                rows = be.jvp_rows(p.fn, p.args, p.checked, j, list(range(s, e)))
            except Exception as err:  # noqa: BLE001 - no forward-mode formula, no batching rule...
                raise _Declined(f"{type(err).__name__}: {err}") from None
            if len(rows) != len(p.floats):
                raise _Declined("outputs changed")
            for k in diff:
                r = rows[p.floats.index(k)]
                if tuple(r.shape) != (e - s, be.numel(p.outputs[k])):
                    raise _Declined("JVP rows of unexpected shape")
                blocks[k][j][:, s:e] = be.to_numpy(r).T
    return blocks


def _tie(p, diff, blocks, projections) -> None:
    """The backward's projections ``U J_b`` equal ``U J_f`` to within the bound."""
    atol = p.opts.atol
    for k in diff:
        u, norms, by_backward = projections[k]
        bound = BOUND * atol * norms
        for j, (block, got) in enumerate(zip(blocks[k], by_backward)):
            expected = u @ block
            with np.errstate(invalid="ignore", over="ignore"):
                apart = got.size and not np.all(np.abs(got - expected) <= bound)
            if apart:
                raise _Disagreement(f"output {k}, input {j}: projections differ")
