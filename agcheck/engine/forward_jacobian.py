"""The analytical Jacobian by forward mode, tied to the backward by random projections.

Where the outputs have many more elements than the inputs, one JVP per input element gives
the Jacobian for far fewer calls than a VJP per output element (twice, with reentrancy).
The forward-mode Jacobian ``J_f`` stands in for the backward's ``J_b`` only once
VJPs with Gaussian cotangents ``U`` (rows ``u``) reproduce ``U J_f`` to within
``BOUND * atol * |u|`` per input element, and again to within
``min(nondet_tol, BOUND * atol) * |u|`` (reentrancy; torch bounds each entry by ``nondet_tol``).

An entry of ``J_b`` off by ``atol`` moves its input element's projection by ``|u_j| atol``;
it stays within the bound only if ``|u_j| <= BOUND |u|``, for ``m`` output elements about
``BOUND sqrt(m)``: probability ``1e-4`` for ``m = 10^4``, in each independent projection.
Rounding (about ``1e-16 |u|`` for float64 convolutions) stays far below the bound, hence
double precision only. Anything the projections cannot tie, or counts that say the path
cannot pay, leaves the Jacobian to the VJPs.
"""
from __future__ import annotations

import numpy as np

from agcheck.backends.base import Capability
from agcheck.core.outcome import EngineEvent
from agcheck.engine.coloured import DenseBlock
from agcheck.engine.columns import derivative_row_bytes

__all__ = ["try_forward_jacobian", "ROUNDS", "BOUND"]

#: VJPs with Gaussian cotangents that tie the backward to the forward-mode Jacobian
ROUNDS = 8
#: a projection may differ from the forward-mode one by this much, times atol and |u|
BOUND = 1e-6
#: forward mode is tried when the outputs hold at least this many times the inputs' elements
_MIN_OUTPUT_SHARE = 2
#: VJPs per output element of the two reverse passes (the second, coloured, about half on a CNN)
_REVERSE_PASSES = 1.5
PROJECTION_SEED = 4099
#: the VJPs the path may save must be at least this many times the projections' VJPs
_MIN_SAVED_SHARE = 2


class _Declined(Exception):
    """Forward mode cannot stand in for the backward here."""

    decision = "declined"


class _Disagreement(Exception):
    """The backward's projections differ from the forward-mode Jacobian's, or from themselves."""

    decision = "disagreement"


def try_forward_jacobian(p, diff, inputs, vjps) -> dict | None:
    """``{k: [DenseBlock per checked input]}``, the Jacobians of the outputs ``diff`` by JVPs
    once the backward is shown to give them, else ``None``; ``vjps(k, stacked, count)``:
    per checked input, the VJPs of output ``k`` with ``count`` stacked cotangents."""
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
    except (_Declined, _Disagreement) as reason:
        p.run.engine_log.append(EngineEvent("forward", reason.decision, None, str(reason)))
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
        if any(_apart(a, b, bound) for a, b in zip(first, second)):
            raise _Disagreement("backward not reentrant on the projections")
        projections[k] = (u, norms, first)
    return projections


def _flat_vjps(p, vjps, k, stacked, inputs) -> list:
    try:
        flat = p.flat_gradients(vjps(k, stacked, ROUNDS), inputs, ROUNDS)
    except Exception as e:  # noqa: BLE001 - the VJP path meets it again, and reports it
        if e in p.run.user_errors:
            raise
        raise _Declined(f"{type(e).__name__}: {e}") from None
    if flat is None:
        raise _Declined("gradient of unexpected shape or dtype")
    return flat


def _forward_blocks(p, diff, inputs) -> dict:
    """``{k: [(m, n) NumPy block per input]}`` by batched JVPs of one-hot tangents."""
    be = p.be
    n_in = sum(be.numel(x) for x in inputs)
    blocks = {k: [np.empty((be.numel(p.outputs[k]), be.numel(x))) for x in inputs] for k in diff}
    size = p.chunk_rows(derivative_row_bytes(p, n_in), n_in)
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
        for j, (block, got) in enumerate(zip(blocks[k], by_backward)):
            if _apart(got, u @ block, BOUND * atol * norms):
                raise _Disagreement(f"output {k}, input {j}: projections differ")


def _apart(a, b, bound) -> bool:
    with np.errstate(invalid="ignore", over="ignore"):
        return bool(a.size and not np.all(np.abs(a - b) <= bound))
