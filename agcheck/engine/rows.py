"""One piece of ``fn`` as the batched engine sees it, and its numerical rows.

:class:`Problem` probes each input (can it be moved in batches, agreeing with plain
calls?), computes the rows in chunks (batched, sized by :mod:`~agcheck.engine.cost`; or
element by element, samples moved together where independent: :mod:`~agcheck.engine.samples`)
and keeps them in the run's rows where whole Jacobians fit. Choices follow from shapes, the
traced graph and the backend's forms; the timings are ratios of two CPU times taken a moment
apart (:meth:`Problem._samples_pay`, :meth:`Problem.plain_calls_cheaper`).
"""
from __future__ import annotations

import functools
import time

import numpy as np

from agcheck.backends.base import Capability
from agcheck.core import jacobian as jac
from agcheck.core.outcome import EngineEvent
from agcheck.core.row_block import RowBlock
from agcheck.core.run import DEFAULT_MEMORY_BUDGET
from agcheck.stencil import STENCILS
from agcheck.engine import cost
from agcheck.engine.cost import INTERMEDIATES
from agcheck.engine.samples import SampleRows

__all__ = ["Problem", "n_in_total", "DEFAULT_MEMORY_BUDGET", "MIN_BATCHED_NUMEL", "INTERMEDIATES"]

#: below this many elements an input is perturbed element by element (a loop is cheaper)
MIN_BATCHED_NUMEL = 16
PROBE_SEED = 5113
#: one batched call may always take this many bytes (see Problem.batch_bytes)
MIN_BATCH_BYTES = 8 << 20
#: after a first batched chunk, the rest move by samples, or plain calls, where that costs
#: under this share of the batched calls (:meth:`Problem._samples_pay`,
#: :meth:`Problem.plain_calls_cheaper`): away from a tie noise could flip
SAMPLES_MARGIN = 0.7
#: how :meth:`Problem._disagreement` says that the batched form, or the plain calls, raised
_RAISED = "raised"
_PLAIN_CALLS_RAISED = "the plain calls raised"


class Problem(SampleRows):
    """One piece of ``fn`` (after the complex split) and what the engine learned of it."""

    def __init__(self, run, fn, trace, args, checked):
        self.run = run
        self.be, self.opts = run.be, run.opts
        self.fn, self.trace, self.args, self.checked = fn, trace, args, checked
        self.outputs = trace.outputs
        self.floats = [k for k, o in enumerate(self.outputs) if self.be.is_floating_or_complex(o)]
        self.budget = run.memory_budget
        arrays = [args[q] for q in checked] + [self.outputs[k] for k in self.floats]
        self.itemsize = max(self.be.itemsize(a) for a in arrays)
        self.out_numel = sum(self.be.numel(self.outputs[k]) for k in self.floats)
        #: the most rows or columns one batched call takes (:func:`cost.batch_cap`)
        self.max_batch = cost.batch_cap(self.be.whole_batches)
        self._batched = {}
        self._reference = {}  # per input: the probe's plain difference quotient (None: it raised)
        self._plain_seconds = {}  # per input: the CPU seconds of one of the probe's plain calls
        self._via = {}  # per batched input: "stacked", "vmap" or "functional"
        self._tiled = {}  # per stacked input: the other arguments repeated beside its copies
        #: per batched input: its batched form, called with the stacked copies of the input
        self.evaluators = {}
        self._unbatchable = {}  # per input: why each batched form was left out or rejected
        #: whether VJPs are batched: ``None`` until the first batch; ``False`` without
        #: batched VJPs, for a short loop of cheap calls, or after a batched VJP failed
        self._vjp_batched = None if self.be.supports(Capability.BATCHED_GRAD) and (
            2 * self.out_numel >= cost.BATCHED_VJPS_FROM_CALLS) else False
        self.vjps_priced = False  # batched VJPs timed against one per column (columns.py)
        jacobian_bytes = n_in_total(self.be, args, checked) * self.out_numel * self.itemsize
        #: whether whole numerical Jacobians fit the budget, and so are kept for reuse
        self.keep_rows = jacobian_bytes <= self.budget // 2
        #: one batched call's bytes: a Jacobian's (what the reference engine holds), at least
        #: MIN_BATCH_BYTES, at most its share of the budget
        self.batch_bytes = min(self.budget // cost.CHUNK_SHARE, max(jacobian_bytes, MIN_BATCH_BYTES))
        #: the inputs whose rows another pass of the check left complete (forward mode
        #: takes reverse mode's): :meth:`numerical_row_chunks` yields them as they are
        self.remembered = {q for q in checked if (kept := self.kept_rows(q)) is not None and kept.complete()}
        #: the inputs whose rows all agreed in the comparison under way (for failure.decide)
        self.passed = set()
        #: per output: column ranges computed one VJP each, as the reference engine does,
        #: and reentrancy-checked, with the rows per checked input
        self._exact_columns = {}
        #: per input: the independent samples of its first dimension (None: not found)
        self._samples = {}
        self._sample_base = {}  # per input found to hold samples: fn's floating outputs unmoved (NumPy)

    def chunk_rows(self, bytes_per_row: int, n_rows: int, pos=None, copies_per_row: int = 1) -> int:
        """Rows (or columns) one batched call takes within :attr:`batch_bytes`, at most
        ``n_rows`` and :attr:`max_batch`; moving ``args[pos]`` through the ``functional``
        form, at most ``FUNCTIONAL_MAX_COPIES`` copies of ``copies_per_row`` a row."""
        cap = self.max_batch
        if pos is not None and self._via.get(pos) == "functional":
            cap = min(cap or n_rows, max(1, cost.FUNCTIONAL_MAX_COPIES // copies_per_row))
        return cost.rows_per_chunk(bytes_per_row, self.batch_bytes, n_rows, cap)

    # -- numerical side -----------------------------------------------------------------
    def batched_ok(self, pos) -> bool:
        """Can ``args[pos]`` be moved in batches? Probed once, and logged: two moves along a
        random direction are evaluated in each form of :meth:`_batched_forms` in turn
        (``functional`` only where ``vmap`` raised), and the first that agrees with plain
        calls at the same moves is taken. The plain calls are made only once a form gives
        results of the right shapes: a form that raises at once costs none."""
        if pos in self._batched:
            return self._batched[pos]
        be, x = self.be, self.args[pos]
        forms = []
        if be.numel(x) >= MIN_BATCHED_NUMEL and be.supports(Capability.BATCHED_EVALUATION):
            forms = self._batched_forms(pos)  # before any call: no batched form may apply
        eps = self.run.eps_for(x)
        moved = self._probe_moves(pos, eps) if forms else None
        raised, rejected = set(), []
        self._batched[pos] = False
        for via, tiled, evaluate in forms:
            if via == "functional" and "vmap" not in raised:
                continue
            try:  # fn is called one frame below this one
                batched = evaluate(self.fn, self.args, pos, moved, **(
                    {"tiled": tiled} if tiled else {}))
            except Exception as e:
                if e in self.run.user_errors:
                    raise
                why: str | None = f"{_RAISED} {type(e).__name__}"
            else:
                why = self._disagreement(batched, pos, eps)
            if why is None:
                self._batched[pos] = True
                self._via[pos] = via
                if tiled:
                    self._tiled[pos] = tiled
                # bound once: each batched call is then one call of the backend's form
                self.evaluators[pos] = functools.partial(evaluate, self.fn, self.args, pos, **(
                    {"tiled": tiled} if tiled else {}))
                break
            rejected.append(f"{via} with {len(tiled)} tiled: {why}" if tiled else f"{via}: {why}")
            if why == _PLAIN_CALLS_RAISED:
                break
            if why.startswith(_RAISED):
                raised.add(via)
        if not self._batched[pos]:
            self._unbatchable[pos] = "; ".join(filter(None, [self._unbatchable.get(pos), *rejected]))
        self._log_batching(pos)
        return self._batched[pos]

    def _log_batching(self, pos) -> None:
        if self._batched[pos]:
            figures = {"rows_per_batch": self._numerical_chunk_rows(pos)}
            if pos in self._tiled:
                figures["tiled"] = len(self._tiled[pos])
            event = EngineEvent("numerical", "batched", pos, via=self._via[pos], figures=figures)
        else:
            event = EngineEvent("numerical", "looped", pos, self._unbatchable.get(pos, ""))
        self.run.engine_log.append(event)

    def _probe_moves(self, pos, eps):
        """The probe's two moves of ``args[pos]``, stacked."""
        x = self.args[pos]
        xp = self.be.xp(x)
        step = xp.reshape(self._probe_direction(pos), tuple(x.shape)) * eps
        return xp.stack([xp.astype(x - step, x.dtype), xp.astype(x + step, x.dtype)], axis=0)

    def _probe_direction(self, pos):
        """The probe's flat unit direction for ``args[pos]`` (the same on every call)."""
        x = self.args[pos]
        return self.be.uniform_unit_vector(x, self.be.generator(x, PROBE_SEED), real=True)

    def _plain_reference(self, pos):
        """The plain calls' central difference quotient along the probe's direction, one
        flat array per output, computed once (and one call's CPU time noted); ``None``
        where they raised an error not the user's (a user's error propagates)."""
        if pos not in self._reference:
            be, x = self.be, self.args[pos]
            eps = self.run.eps_for(x)
            step = be.xp(x).reshape(self._probe_direction(pos), tuple(x.shape)) * eps
            self._reference[pos] = None
            try:
                with be.perturber(self.args, pos) as perturber:
                    started = time.thread_time()
                    try:  # fn is called one frame below this one
                        minus = perturber.evaluate_direction(self.fn, step, -1)
                        middle = time.thread_time()
                        values = [minus, perturber.evaluate_direction(self.fn, step, 1)]
                    except Exception as e:
                        self.run.user_errors.remember(e)
                        raise
                    # the faster call: a busy machine inflates a single call more than a batch
                    self._plain_seconds[pos] = min(middle - started, time.thread_time() - middle)
                    self._reference[pos] = jac.stencil_difference(be, values, eps)
            except Exception as e:
                if e in self.run.user_errors:
                    raise
        return self._reference[pos]

    def _batched_forms(self, pos) -> list:
        """``(via, tiled, evaluate)`` of the forms worth a probe, in order: ``stacked``
        (copies along fn's first dimension, the arguments sharing it tiled beside them where
        the copies alone do not fit), ``vmap``, ``functional`` (vmap with in-place writes
        made out-of-place). Forms the outputs, fn's kind or the traced graph rule out are
        left out without a call, their reasons noted for the log."""
        be, reasons = self.be, []
        obstacle = be.batching_obstacle(self.fn, pos, self.trace)
        forms = [] if obstacle else [("vmap", (), be.evaluate_batch)]
        if obstacle:
            reasons.append(f"vmap: {obstacle}")
        if be.supports(Capability.STACKED_EVALUATION):
            if all(be.is_array(o) and len(o.shape) >= 1 for o in self.outputs):
                stacked = []
                for tiled in ((), self._sharing_first_dimension(pos)):
                    if tiled is None:
                        continue
                    why = be.stacking_obstacle(self.fn, pos, tiled)
                    if why:
                        reasons.append(f"stacked with {len(tiled)} tiled: {why}" if tiled else f"stacked: {why}")
                    else:
                        stacked.append(("stacked", tiled, be.evaluate_stacked))
                forms = stacked + forms if self._batch_first(pos) else forms + stacked
            else:
                reasons.append("stacked: an output has no first dimension")
        if not obstacle and be.supports(Capability.FUNCTIONAL_BATCHED_EVALUATION):
            # last: its slice writes run through vmap's per-sample fallback
            forms.append(("functional", (), be.evaluate_batch_functional))
        self._unbatchable[pos] = "; ".join(reasons)  # the probe adds the forms it rejects
        return forms

    def _batch_first(self, pos) -> bool:
        """Whether ``args[pos]``'s first dimension looks like a batch fn carries to an
        output (not a vector's only dimension): stacked copies are then tried before
        ``vmap``. Elsewhere they rarely fit, and a process's first raising op maps
        megabytes of C++ unwinding tables."""
        x = self.args[pos]
        if len(x.shape) < 2:
            return False
        return any(len(self.outputs[k].shape) >= 1 and self.outputs[k].shape[0] == x.shape[0] for k in self.floats)

    def _sharing_first_dimension(self, pos) -> tuple | None:
        """Positions of the other dense arguments sharing ``args[pos]``'s first dimension
        (images beside their regions), or ``None``."""
        be, x = self.be, self.args[pos]
        if not x.shape:
            return None
        found = tuple(q for q, a in enumerate(self.args)
                      if q != pos and be.is_array(a) and be.layout(a) == "dense" and len(a.shape) >= 1
                      and a.shape[0] == x.shape[0])
        return found or None

    def _disagreement(self, batched, pos, eps) -> str | None:
        """``None`` where a batched form's results at the probe moves agree with the plain
        calls, else why not (other shapes, a different quotient, the plain calls raised)."""
        be = self.be
        if any(tuple(batched[k].shape) != (2, *self.outputs[k].shape) for k in self.floats):
            return "results of other shapes"
        sequential = self._plain_reference(pos)
        if sequential is None:
            return _PLAIN_CALLS_RAISED
        for k in self.floats:
            minus, plus = be.xp(batched[k]).unstack(batched[k], axis=0)
            est = be.xp(minus).reshape(be.combine(STENCILS["central"], [minus, plus], eps), (-1,))
            ref = sequential[k] if self.run.stencil.name == "central" else est
            if tuple(est.shape) != tuple(ref.shape) or not be.allclose(
                est, ref, self.opts.rtol * 1e-2, self.opts.atol * 1e-2
            ):
                return "differs from plain calls"
        return None

    def copy_bytes(self, pos) -> int:
        """Bytes one moved copy of ``args[pos]`` takes in a batched call: the input and the
        outputs, ``INTERMEDIATES`` times over."""
        return max(self.be.numel(self.args[pos]) + self.out_numel, 1) * self.itemsize * INTERMEDIATES

    def _numerical_chunk_rows(self, pos) -> int:
        """Numerical rows of ``args[pos]`` one batched call takes: a copy per stencil point."""
        points = len(self.run.stencil.offsets)
        return self.chunk_rows(self.copy_bytes(pos) * points, self.be.numel(self.args[pos]), pos, points)

    def vjps(self, k, stacked, count, batched: bool) -> list:
        """Per checked input, the stacked VJPs of output ``k`` with ``count`` stacked
        cotangents (``None``: undefined), batched or one each; ``ValueError`` where one
        input's VJPs differ in shape."""
        if batched:
            return self.trace.vjp_many(k, stacked)
        be = self.be
        per_input, shapes = None, None
        for c in range(count):
            grads = [None if g is None else be.to_dense(g)
                     for g in self.run.user_errors.call(self.trace.vjp, [k], [stacked[c]])]
            if per_input is None:
                shapes = [None if g is None else tuple(g.shape) for g in grads]
                per_input = [None if g is None else RowBlock(be, count, be.numel(g), g, g.dtype) for g in grads]
            for i, g in enumerate(grads):
                if g is None:
                    per_input[i] = None  # undefined for one cotangent: None, as for all
                elif per_input[i] is not None:
                    if tuple(g.shape) != shapes[i]:
                        raise ValueError("VJPs of one input differ in shape")
                    per_input[i].add(be.xp(g).reshape(g, (-1,)))
        results = [None if block is None else block.result() for block in per_input]
        return [None if r is None else be.xp(r).reshape(r, (count, *shape)) for r, shape in zip(results, shapes)]

    def flat_gradients(self, grads, inputs, count) -> list | None:
        """Per input, its ``count`` stacked gradients in ``grads`` as one ``(count, n)``
        NumPy array (zeros where undefined); ``None`` where one has another shape or dtype
        than its input."""
        be, flat = self.be, []
        for g, x in zip(grads, inputs):
            if g is None:
                flat.append(np.zeros((count, be.numel(x)), be.to_numpy(x).dtype))
            elif tuple(g.shape) != (count, *x.shape) or g.dtype != x.dtype:
                return None
            else:
                flat.append(be.to_numpy(be.to_dense(g)).reshape(count, be.numel(x)))
        return flat

    def evaluate_looped(self, pos, deltas, outputs) -> dict:
        """``{k: (len(deltas), m) NumPy array}``: fn with ``args[pos]`` moved by each row of
        ``deltas``, one plain call each through the backend's perturber."""
        be, x = self.be, self.args[pos]
        parts = {k: [] for k in outputs}
        with be.perturber(self.args, pos) as perturber:
            for delta in deltas:
                step = be.array_like(delta.reshape(tuple(x.shape)), x)
                outs = self.run.user_errors.call(perturber.evaluate_direction, self.fn, step, 1)
                for k in outputs:
                    parts[k].append(be.to_numpy(outs[k]).reshape(-1))
        return {k: np.stack(v) for k, v in parts.items()}

    def rows_element_by_element(self, pos, begin, end):
        """Yield and keep row blocks ``(start, stop, {k: rows})`` of rows ``begin:end`` of
        ``args[pos]``, as the reference engine computes them (samples moved together where
        independent)."""
        yield from self._kept(pos, self._looped_row_chunks(pos, begin, end, self.run.eps_for(self.args[pos])))

    def note_exact_columns(self, k, ranges, rows) -> None:
        """Note that ``rows`` (per checked input) hold output ``k``'s analytical Jacobian,
        exact as the reference engine computes it in the column ``ranges``."""
        if ranges:
            self._exact_columns[k] = (ranges, rows)

    def exact_analytical(self) -> dict | None:
        """What :meth:`note_exact_columns` noted, or ``None``."""
        return dict(self._exact_columns) or None

    def kept_rows(self, pos):
        """The run's rows of ``args[pos]`` (an :class:`InputRows`), or ``None``."""
        return self.run.rows.of(self.fn, self.args, pos)

    def _kept(self, pos, chunks):
        """``chunks`` (computed element by element), each kept as such."""
        for chunk in chunks:
            self._keep(pos, chunk, exact=True)
            yield chunk

    def _keep(self, pos, chunk, exact: bool) -> None:
        """Keep the row block ``chunk`` of ``args[pos]`` in the run's rows, where they fit."""
        if self.keep_rows:
            self.run.rows.of(self.fn, self.args, pos, self.be.numel(self.args[pos])).add(*chunk, exact)

    def numerical_row_chunks(self, pos, report=True):
        """Yield ``(start, stop, {k: rows})`` over ``args[pos]``, advancing the progress bar
        where ``report``."""
        be, x, eps = self.be, self.args[pos], self.run.eps_for(self.args[pos])
        n = be.numel(x)
        advance = self.run.progress.advance if report else _ignored
        kept = self.kept_rows(pos)
        reused = kept is not None and kept.complete() and (pos in self.remembered or kept.exact.all())
        if not reused and not self.batched_ok(pos):
            chunks = self._kept(pos, self._looped_row_chunks(pos, 0, n, eps))
            if not self.keep_rows:
                for chunk in chunks:
                    advance(chunk[1] - chunk[0])
                    yield chunk
                return
            for _ in chunks:  # every row first, then as kept
                pass
            kept, reused = self.kept_rows(pos), True
        if reused:
            for start, stop in kept.bounds:
                advance(stop - start)
                yield start, stop, kept.rows(start, stop)
            return
        # batched: every stencil point of every row of a chunk in one call (a complex
        # input: its real moves, then its imaginary ones), called from this frame
        size = self._numerical_chunk_rows(pos)
        samples = self._sample_candidate(pos) if pos in self._plain_seconds else None
        for start in range(0, n, size):
            stop = min(n, start + size)
            parts = []
            started = time.thread_time()
            for step in (eps, eps * 1j) if be.is_complex(x) else (eps,):  # a loop: no frame above fn's calls
                outs = self.evaluators[pos](self._element_moves(pos, start, stop, step))
                parts.append(self._difference_rows(pos, outs, stop - start, eps))
            seconds = time.thread_time() - started  # before the consumer's work on the chunk
            chunk = start, stop, parts[0] if len(parts) == 1 else {
                k: be.xp(x).astype(be.plus_imaginary(parts[0][k], parts[1][k]), x.dtype) for k in parts[0]}
            self._keep(pos, chunk, exact=False)
            advance(stop - start)
            yield chunk
            if samples and stop < n and self._samples_pay(pos, samples, seconds, stop - start, n - stop):
                for block in self._sample_row_chunks(pos, [(stop, n)], eps):  # kept as computed
                    advance(block[1] - block[0])
                    yield block
                return
            samples = None

    def plain_calls_cheaper(self, pos, seconds, calls) -> bool:
        """Whether ``calls`` plain calls (at the probe's faster one) cost under
        ``SAMPLES_MARGIN`` of batched work on ``args[pos]`` that took ``seconds``, CPU times
        a moment apart (a 3-D convolution: 7.4 ms a copy in a batch of 32, 3-4 ms alone)."""
        plain = self._plain_seconds.get(pos)
        return plain is not None and plain * calls < SAMPLES_MARGIN * seconds

    def _samples_pay(self, pos, b, chunk_seconds, chunk_rows, rest) -> bool:
        """Whether the ``rest`` rows of ``args[pos]`` cost less by samples (a call per
        stencil point and element of a sample, after a probe of ``B + 1``) than batched,
        priced by a batched call of ``chunk_rows`` rows against one of the probe's plain
        calls, CPU times a moment apart (the samples probed only then). A batched copy
        evaluates all ``B`` samples: where fn computes much per sample, batching does not
        repay that ``B``-fold work (``b``: the candidate samples, :meth:`_sample_candidate`)."""
        points = len(self.run.stencil.offsets)
        calls = min(self.be.numel(self.args[pos]) // b, rest) * points + b + 1  # an element of each sample a call
        batched_seconds = chunk_seconds * rest / chunk_rows
        return self.plain_calls_cheaper(pos, batched_seconds, calls) and bool(self.samples(pos))

    def _element_moves(self, pos, start, stop, step):
        """Every stencil point of elements ``start:stop`` of ``args[pos]``, stacked."""
        be, x, xp = self.be, self.args[pos], self.be.xp(self.args[pos])
        flat = list(range(start, stop))
        moves = [be.element_moves(x, flat, step if abs(m) == 1 else abs(m) * step, 1 if m > 0 else -1)
                 for m in self.run.stencil.offsets]
        return xp.reshape(xp.stack(moves, axis=0), (len(moves) * len(flat), *x.shape))

    def _difference_rows(self, pos, outs, b, eps) -> dict:
        """``{k: (b, m) rows}``: the stencil's differences of a batched evaluation's outputs."""
        be, stencil, xp = self.be, self.run.stencil, self.be.xp(self.args[pos])
        points = len(stencil.offsets)
        return {k: be.combine(stencil, xp.unstack(xp.reshape(outs[k], (points, b, be.numel(self.outputs[k]))), axis=0),
                              eps) for k in self.floats}


def _ignored(_n) -> None:
    """Progress not reported."""


def n_in_total(be, args, checked) -> int:
    """How many elements the checked inputs hold in all."""
    return sum(be.numel(args[q]) for q in checked)
