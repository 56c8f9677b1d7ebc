"""The Jacobian comparison of one piece: full Jacobians (slow mode) or random projections
``v^T J u`` (fast mode), with torch's messages on a mismatch."""
from __future__ import annotations

import logging
import os
from typing import Callable

import numpy as np

from agcheck.checks import large_blocks, loop_plan, no_differentiable_outputs
from agcheck.core import jacobian as jac
from agcheck.core.piece import Piece
from agcheck.engine import batched as engine
from agcheck.engine import forward_rows
from agcheck.core.outcome import undecided
from agcheck.core.report_filling import attach_jacobian_failure
from agcheck.errors import GradcheckError
from agcheck.report.messages import FAST_FAIL_SLOW_OK, FAST_MODE_NOTE, jacobian_mismatch_message

__all__ = ["check", "MAX_REPORTED_BLOCKS"]

#: a slow-mode failure report holds at most this many failing (output, input) blocks
MAX_REPORTED_BLOCKS = 16

#: an engine error hands the check to the reference engine; errors of these types come from
#: agcheck's own code (frameworks raise RuntimeError or IndexError), and with this environment
#: variable set, as agcheck's tests set it, they are raised instead of hidden by a right verdict
STRICT_ENGINE = "AGCHECK_STRICT_ENGINE"
OWN_ERRORS = (KeyError, AttributeError, NameError, UnboundLocalError, ZeroDivisionError)
#: every such fallback, with its traceback, at DEBUG level
ENGINE_LOG = logging.getLogger("agcheck.engine")

#: the report's note on a failure the batched engine confirmed
BATCHED_ROWS_NOTE = ("the Jacobians' entries that torch's message prints, and the worst one, were computed "
                     "element by element, as torch computes them; the others by batched evaluations, VJPs "
                     "or JVPs, which agree with those to rounding")


def _non_finite_note(be, numerical, analytical) -> str:
    """A note where NaN or Inf, not a wrong formula, makes the Jacobians differ."""
    notes = [name for name, j in (("numerical", numerical), ("analytical", analytical))
             if be.numel(j) and not be.all_finite(j)]
    if not notes:
        return ""
    hint = (
        "fn is not finite (or overflows) within eps of this input: move the input away from "
        "poles and domain edges, or reduce eps"
        if "numerical" in notes
        else "the backward produces NaN/Inf here"
    )
    return f"Note: the {' and '.join(notes)} Jacobian contains NaN or Inf ({hint}).\n"


# -- slow mode: full Jacobians ----------------------------------------------------------
def check(run, piece: Piece) -> None:
    """Compare ``piece``'s analytical derivatives with finite differences."""
    be = run.be
    if run.opts.fast_mode:
        _compare_fast(run, piece)
        return
    if not piece.diff:
        no_differentiable_outputs.check_slow(run, piece)
        return
    n_in = sum(be.numel(x) for x in piece.inputs)
    run.progress.start(n_in, f"{'forward' if piece.forward else 'reverse'}-mode Jacobians")
    try:
        if run.opts.engine == "auto":
            plan = loop_plan.plan(run, piece, n_in)
        else:
            plan = "engine" if run.opts.engine == "batched" else "reference"
        if plan != "reference":
            compare = forward_rows.compare_slow_forward if piece.forward else engine.compare_slow_reverse
            try:
                outcome = compare(run, piece)
            except Exception as error:
                if error in run.user_errors or isinstance(error, OWN_ERRORS) and os.environ.get(STRICT_ENGINE):
                    raise
                ENGINE_LOG.debug("the engine handed the check to the reference engine on %s: %s",
                                 type(error).__name__, error, exc_info=error)
                outcome = undecided(f"{type(error).__name__}: {error}")
            if outcome.passed:
                return
            run.engine_fallbacks.append(outcome)  # the reference engine decides, and explains
            if large_blocks.too_large(run, piece) and all(be.layout(x) == "dense" for x in piece.inputs):
                large_blocks.compare_in_chunks(run, piece)  # within the memory budget
                return
            run.progress.start(n_in, "Jacobians, element by element")
            try:
                _reference_slow(run, piece, whole=outcome.whole, reuse_analytical=outcome.analytical or {})
            except GradcheckError as error:
                if outcome.inexact:
                    error.report.notes.append(BATCHED_ROWS_NOTE)
                raise
            return
        _reference_slow(run, piece)
    finally:
        run.rows.piece_done(piece.forward)


def _reference_slow(run, piece: Piece, whole: bool = False, reuse_analytical: dict | None = None) -> None:
    """torch's element-by-element comparison, block by block in torch's order, taking the run's
    exact rows (all where ``whole``) and the columns ``reuse_analytical``; a reverse-mode pass
    leaves its rows for the forward-mode pass that follows."""
    opts = run.opts
    moved = run.numerical_args(piece.args)
    numerical = []
    for p in piece.checked:  # a loop: no frame between this one and fn's calls
        numerical.append(_numerical_jacobians(run, piece, moved, p, whole))
    pair = _analytical_pairs(run, piece, reuse_analytical or {})
    for i, k in enumerate(piece.diff):
        pair.compute(i, checks=True)
        for j in range(len(piece.checked)):
            try:
                assert_close(run, piece, pair(i, j), numerical[j][k], i, j, opts.atol, output_position=k)
            except GradcheckError as error:
                if opts.raise_exception:  # a report no one sees is not built
                    _report_other_blocks(run, piece, error, pair, numerical, (i, j))
                raise
    if not piece.forward and run.rows.wanted:
        for p, rows in zip(piece.checked, numerical):
            n = run.be.numel(piece.args[p])
            run.rows.of(piece.fn, piece.args, p, n).add(0, n, rows, exact=True)


def _numerical_jacobians(run, piece: Piece, moved, p, whole: bool) -> dict:
    """``{output position: Jacobian}`` of input ``p``, element by element, taking the run's
    exact rows (all of them where ``whole``: the engine's inputs are dense)."""
    be = run.be
    # fn is called one frame below this one (no closure between)
    problem = (be, piece.fn, moved, p, piece.outputs, run.eps_for(piece.args[p]), run.stencil)
    kept = run.rows.of(piece.fn, piece.args, p)
    blocks = [] if kept is None else kept.blocks(exact_only=not whole)
    if not blocks:
        return jac.numerical_jacobians(*problem, on_element=run.progress.advance)
    n, done, parts = be.numel(piece.args[p]), 0, []
    for start, stop, computed in blocks:
        if start > done:
            parts.append(jac.numerical_jacobians(*problem, elements=range(done, start), on_element=run.progress.advance))
        parts.append(computed)
        run.progress.advance(stop - start)
        done = stop
    if done < n:
        parts.append(jac.numerical_jacobians(*problem, elements=range(done, n), on_element=run.progress.advance))
    x = piece.args[p]
    joined = {}
    for k in parts[0]:
        like = piece.outputs[k] if not be.is_complex(x) else x
        joined[k] = be.array_like(np.concatenate([be.to_numpy(part[k]) for part in parts], axis=0), like)
    return joined


class _analytical_pairs:
    """The analytical block of (differentiable output ``i``, checked input ``j``); forward mode
    pairs the i-th differentiable output with the i-th floating one, as torch does."""

    def __init__(self, run, piece: Piece, reuse: dict | None = None):
        self.run, self.piece, self.computed = run, piece, {}
        self.reuse = reuse or {}  # Outcome.analytical
        if piece.forward:
            self.forward = jac.analytical_jacobians_forward(run.be, piece.fn, piece.args, piece.checked,
                                                            check_grad_dtypes=run.opts.check_grad_dtypes,
                                                            reuse=self.reuse, outputs=piece.outputs)

    def compute(self, i, checks) -> None:
        if self.piece.forward:
            return
        be, opts, piece = self.run.be, self.run.opts, self.piece
        k = piece.diff[i]
        kw = dict(nondet_tol=opts.nondet_tol, check_grad_dtypes=opts.check_grad_dtypes) if checks else dict(checks=False)
        if k not in self.reuse:
            self.computed[i] = jac.analytical_jacobians_reverse(be, piece.trace, k, piece.inputs, **kw)
            return
        ranges, rows = self.reuse[k]
        missing = np.ones(be.numel(piece.outputs[k]), dtype=bool)
        for c0, c1 in ranges:
            missing[c0:c1] = False
        missing = np.flatnonzero(missing)
        computed = jac.analytical_jacobians_reverse(be, piece.trace, k, piece.inputs, columns=missing.tolist(), **kw) \
            if len(missing) else None
        whole = []
        for j, (x, r) in enumerate(zip(piece.inputs, rows)):
            if computed is not None:
                r = r.copy()
                r[missing] = be.to_numpy(computed[j]).T
            whole.append(be.transpose(be.array_like(r, x)))
        self.computed[i] = whole

    def __call__(self, i, j):
        if self.piece.forward:
            return self.forward[j][i]
        if i not in self.computed:  # a later output's Jacobians, only for the report
            self.compute(i, checks=False)
        return self.computed[i][j]


def _report_other_blocks(run, piece: Piece, error, pair, numerical, failed) -> None:
    """Add the other failing blocks of a slow-mode comparison to the first's report; never raises."""
    be, opts = run.be, run.opts
    try:
        for i, k in enumerate(piece.diff):
            for j in range(len(piece.checked)):
                if (i, j) == failed:
                    continue
                if len(error.report.blocks) >= MAX_REPORTED_BLOCKS:
                    error.report.notes.append(f"only the first {MAX_REPORTED_BLOCKS} failing blocks are reported")
                    return
                a = pair(i, j)
                n = be.to_device_of(numerical[j][k], a)
                if be.allclose(a, n, opts.rtol, opts.atol):
                    continue
                attach_jacobian_failure(error, run, a, n, output=i, input=j, complex_indices=piece.complex_indices,
                                        test_imag=piece.test_imag, forward=piece.forward,
                                        where=(piece.fn, piece.args, piece.checked[j], piece.outputs, k))
    except Exception as ex:  # noqa: BLE001 - the first failure is what is raised
        error.report.notes.append(f"other blocks not compared: {type(ex).__name__}: {ex}")


def assert_close(run, piece: Piece, a, n, out_idx, in_idx, atol, *, output_position,
                 explain: Callable | None = None) -> None:
    """Raise torch's Jacobian-mismatch error unless ``a`` and ``n`` agree; ``explain()`` gives
    a fast-mode failure's extra text and full blocks (only where ``raise_exception``)."""
    be = run.be
    n = be.to_device_of(n, a)
    if be.allclose(a, n, run.opts.rtol, atol):
        return
    message = jacobian_mismatch_message(a, n, out_idx, in_idx, piece.complex_indices, piece.test_imag, piece.forward)
    message += _non_finite_note(be, n, a)
    blocks, projection = (a, n), None
    if explain is not None and run.opts.raise_exception:
        text, whole = explain()
        message += text
        blocks = whole or blocks
        projection = {"numerical": n, "analytical": a, "atol": atol}
    error = GradcheckError(
        message,
        check="jacobian_forward" if piece.forward else "jacobian",
        details={"output": out_idx, "input": in_idx, "imaginary_part": bool(piece.test_imag)},
    )
    if run.opts.raise_exception:  # a report no one sees is not built
        attach_jacobian_failure(error, run, *blocks, output=out_idx, input=in_idx,
                                complex_indices=piece.complex_indices, test_imag=piece.test_imag,
                                forward=piece.forward,
                                where=(piece.fn, piece.args, piece.checked[in_idx], piece.outputs, output_position),
                                projection=projection)
    raise error


# -- fast mode: random projections ------------------------------------------------------
def _compare_fast(run, piece: Piece) -> None:
    be, opts = run.be, run.opts
    forward, inputs = piece.forward, piece.inputs
    all_v, all_u = jac.random_vectors(be, inputs, None if forward else [piece.outputs[k] for k in piece.diff])
    numerical = _numerical_projections(run, piece, all_v, all_u)
    if forward:
        analytical = jac.analytical_jvps(be, piece.fn, piece.args, piece.checked, all_u,
                                         check_grad_dtypes=opts.check_grad_dtypes)
    else:
        if not piece.diff:
            no_differentiable_outputs.check_fast(run, piece, all_u)
        analytical = []
        for k, v in zip(piece.diff, all_v):
            vjs = jac.analytical_vjps(be, piece.trace, k, v, inputs, nondet_tol=opts.nondet_tol,
                                      check_grad_dtypes=opts.check_grad_dtypes)
            analytical.append([jac.project_reverse(be, vj, u) for vj, u in zip(vjs, all_u)])

    for i, per_input in enumerate(numerical):
        for j, n in enumerate(per_input):
            a = analytical[i][j] if forward else analytical[j][i]
            atol = opts.atol * (2 if isinstance(all_u[i], tuple) else 1) if opts.fast_tolerance == "probe" else \
                jac.adjusted_atol(be, opts.atol, all_u[i], None if forward else all_v[j])
            output_position = piece.floats[j] if forward else piece.diff[j]

            def explain(i=i, output_position=output_position):
                return _slow_explanation(run, piece, i, output_position)

            assert_close(run, piece, a, n, j, i, atol, output_position=output_position, explain=explain)


def _numerical_projections(run, piece: Piece, all_v, all_u) -> list:
    """Per checked input, the finite-difference ``J u`` (forward) or ``v^T J u`` (reverse) of
    each floating output; the differentiable outputs' probes pair with the floating outputs
    in order, as in torch."""
    be = run.be
    numerical = []
    moved = run.numerical_args(piece.args)
    for p, u in zip(piece.checked, all_u):
        jus = jac.numerical_directional(be, piece.fn, moved, p, u, run.eps_for(piece.args[p]), run.stencil)
        float_jus = [jus[k] for k in piece.floats]
        if piece.forward:
            numerical.append(float_jus)
        else:
            numerical.append([be.dot(v, ju) for v, ju in zip(all_v, float_jus)])
    return numerical


def _slow_explanation(run, piece: Piece, input_index, output_position) -> tuple[str, tuple | None]:
    """A fast-mode failure's full Jacobians recomputed: the text, and ``(analytical, numerical)``
    (``None`` beyond the memory budget)."""
    be, opts = run.be, run.opts
    pos = piece.checked[input_index]
    if large_blocks.too_large(run, piece, inputs=[input_index]):
        n, m = be.numel(piece.args[pos]), be.numel(piece.outputs[output_position])
        return (f"\nThe slow-mode Jacobians ({n:,} x {m:,} entries) are not recomputed for this message: they "
                f"exceed memory_budget ({run.memory_budget:,} bytes). fast_mode=False compares them "
                "in chunks and names the worst entries.\n"), None
    numerical = jac.numerical_jacobians(be, piece.fn, piece.args, pos, piece.outputs, run.eps_for(piece.args[pos]),
                                        run.stencil)[output_position]
    if piece.forward:
        analytical = jac.analytical_jacobians_forward(be, piece.fn, piece.args, [pos], outputs=piece.outputs)[0][
            piece.floats.index(output_position)]
    else:
        analytical = jac.analytical_jacobians_reverse(be, piece.trace, output_position, piece.inputs,
                                                      checks=False)[input_index]
    numerical = be.to_device_of(numerical, analytical)
    max_diff = be.max_abs_difference(numerical, analytical) if be.numel(analytical) else 0.0
    text = (
        FAST_MODE_NOTE
        + f"Numerical:\n {numerical}\nAnalytical:\n{analytical}\n\n"
        + f"The max per-element difference (slow mode) is: {max_diff}.\n"
    )
    if be.allclose(analytical, numerical, opts.rtol, opts.atol):
        text += FAST_FAIL_SLOW_OK
    return text, (analytical, numerical)
