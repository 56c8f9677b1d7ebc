"""One piece of ``fn`` as the batched engine sees it, and its numerical rows.

:class:`Problem` probes each input (can it be moved in batches: stacked along ``fn``'s
own first dimension, or under ``vmap``; what does a row cost one at a time), computes the
numerical Jacobian rows in chunks (batched, with batch sizes chosen by
:mod:`~agcheck.engine.cost` and memory measured by :mod:`~agcheck.engine.memory`, or
element by element), and keeps the rows computed element by element for the reference
engine to reuse on a failure.
"""
from __future__ import annotations

import functools
import sys

import numpy as np

from agcheck.backends.base import Capability
from agcheck.core import jacobian as jac
from agcheck.core.row_block import RowBlock
from agcheck.core.shared_evaluations import sharing
from agcheck.core.stencil import STENCILS
from agcheck.engine import cost, memory
from agcheck.core.outcome import EngineEvent

__all__ = ["Problem", "n_in_total", "DEFAULT_MEMORY_BUDGET", "MIN_BATCHED_NUMEL", "INTERMEDIATES"]

#: default bytes that Jacobian storage and batch working sets may take
DEFAULT_MEMORY_BUDGET = 1 << 30
#: below this many elements an input is perturbed element by element (a loop is cheaper)
MIN_BATCHED_NUMEL = 16
#: bytes per element a batched evaluation keeps alive, relative to its inputs and outputs
INTERMEDIATES = 4
PROBE_SEED = 5113
SAMPLES_SEED = 5119
#: one batched call may always take this many bytes (see Problem.batch_bytes)
MIN_BATCH_BYTES = 8 << 20
#: a batch whose rows cost this many times the probe's one-row batch is measured once more
#: before the loop takes over (the first measurement was a moment of load, not the form)
_OUTLIER = 4
#: from this many elements on, the probe's plain calls are timed twice (the best counts)
_RETIMED_NUMEL = 64
#: another path's inexact rows are preferred to the loop moving samples together (exact
#: rows, reused by a failing check) only when they cost this many times less
_EXACT_ROWS_WORTH = 2
#: the element-by-element check costs about this many evaluations per input element
#: (its numerical side, and two analytical passes of about one evaluation each)
_LOOP_EVALUATIONS = 3
#: relative differences below this are taken for rounding (:meth:`Problem._probe_samples`)
_ROUNDING = 1e-10
#: how :meth:`Problem._agreeing_seconds` says that the batched form raised, and that the
#: plain calls it is compared with raised
_RAISED = "raised"
_PLAIN_CALLS_RAISED = "the plain calls raised"


def loop_check_seconds(element_seconds: float | None, numel: int) -> float:
    """What the element-by-element check of an input of ``numel`` elements costs, one
    element's rows taking ``element_seconds`` (infinite where unknown)."""
    return float("inf") if element_seconds is None else _LOOP_EVALUATIONS * element_seconds * numel


class Problem:
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
        self._repriced = set()  # inputs whose loop was priced again once batching lost
        self._reference = {}  # per input: the probe's plain difference quotient (None: it raised)
        self._via = {}  # per batched input: "stacked", "vmap" or "functional"
        self._tiled = {}  # per stacked input: the other arguments repeated beside its copies
        self._unbatchable = {}  # per input: why each batched form was left out or rejected
        self._figures = {}  # per probed input: the timings its decision was taken on
        self._vjp_batched = None  # True: being timed; False: found not to pay
        # columns per batched VJP, as the timings chose (whole_batches: the memory budget)
        self._vjp_size = sys.maxsize if self.be.whole_batches else cost.RAMP[0]
        self._vjp_per_col = {}  # seconds per column of each batch size tried
        self._vjp_column_cost = None  # seconds of one VJP (one Jacobian column)
        self._vjp_repriced = False  # the VJP loop was priced again once batching lost
        self._looped = set()  # inputs whose batched rows were found clearly slower
        jacobian_bytes = n_in_total(self.be, args, checked) * self.out_numel * self.itemsize
        #: whether whole numerical Jacobians fit the budget, and so are kept for reuse
        self.keep_rows = jacobian_bytes <= self.budget // 2
        #: what one batched call may take: as much as one Jacobian (which the reference
        #: engine holds), at least MIN_BATCH_BYTES, at most its share of the budget
        self.batch_bytes = min(self.budget // cost.CHUNK_SHARE, max(jacobian_bytes, MIN_BATCH_BYTES))
        self._row_bytes = {}  # per batched input: bytes a row's evaluation took, as measured
        self._copy_bytes = {}  # per probed input: bytes one moved copy took in the probe, as measured
        self._column_bytes = 0  # bytes one batched VJP column took, as measured
        #: bytes one row of a batched JVP took, as measured (forward mode)
        self.jvp_row_bytes = 0
        self._batch_shapes = set()  # (kind, rows) of the batched calls made (see compiles)
        #: per input, its rows computed element by element (as the reference engine
        #: computes them) when all of them were: reused instead of being computed again
        self._exact_rows = {}
        #: per input, every block of rows computed element by element so far, by start
        #: (a failing check hands them to the reference engine, which computes the rest)
        self._exact_blocks = {}
        #: per output, the analytical Jacobian's column ranges computed one VJP per
        #: column (as the reference engine computes them) and reentrancy-checked, with
        #: the Jacobian's rows (one per output element) per checked input
        self._exact_columns = {}
        #: per output, the rows of an analytical first pass by samples, reentrancy-checked
        #: but not computed as the reference engine computes them (one VJP per column)
        self.sample_columns = {}
        #: per input, how many independent samples its first dimension holds (None: not
        #: found independent), as :meth:`samples` found it
        self._samples = {}
        self._sample_base = {}  # per input found to hold samples: fn's floating outputs unmoved (NumPy)
        #: per input, rows another pass of the same check computed (see :meth:`remembered`)
        self._remembered = {}

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
                event = EngineEvent("numerical", "looped", pos, self._unbatchable.get(pos, ""), figures=figures)
            self.run.engine_log.append(event)
        return self._batched[pos]

    def evaluate(self, pos, stacked):
        """``fn`` at each of ``stacked`` (moved copies of ``args[pos]``) in one call, in the
        batched form the probe chose for that input."""
        if self._via[pos] == "stacked":
            return self.be.evaluate_stacked(self.fn, self.args, pos, stacked, self._tiled.get(pos, ()))
        if self._via[pos] == "functional":
            return self.be.evaluate_batch_functional(self.fn, self.args, pos, stacked)
        return self.be.evaluate_batch(self.fn, self.args, pos, stacked)

    def _probe(self, pos) -> bool:
        """Evaluate two moves of ``args[pos]`` (along a random direction) in a batched
        form: ``stacked`` (one plain call, the copies laid along fn's own first
        dimension, and the other arguments that share that dimension repeated beside them
        where the copies alone do not fit) where fn gives each copy its own result, else
        ``vmap`` (``vmap`` first where the input's first dimension is not a batch:
        :meth:`_batch_first`), and ``functional`` (``vmap`` with fn's in-place writes made
        out-of-place) where ``vmap`` raised. The plain calls at the same moves, which time
        one element's rows and which a batched form must agree with, are made only once a
        form has given results of the right shapes (or a form's setup asks what the loop
        costs): a form that raises at once costs no plain call."""
        be, x = self.be, self.args[pos]
        if be.numel(x) < MIN_BATCHED_NUMEL or not be.supports(Capability.BATCHED_EVALUATION):
            return False
        forms = self._batched_forms(pos)
        if not forms:
            return False  # before any call: no batched form can apply
        eps = self.run.eps_for(x)
        u = self._probe_direction(pos)
        step = be.reshape(u, x.shape) * eps
        moved = be.stack([be.astype(x - step, x.dtype), be.astype(x + step, x.dtype)], axis=0)
        raised, rejected = set(), []
        for via, tiled, evaluate in forms:
            name = f"{via} with {len(tiled)} tiled" if tiled else via
            if via == "vmap" and self._setup_outweighs_saving(pos):
                rejected.append(f"{name}: batching setup not worth it")
                continue
            if via == "functional" and "vmap" not in raised:
                continue
            if tiled:
                evaluate = functools.partial(evaluate, tiled=tiled)
            # a backend that compiles each batch shape (whole_batches) adds the compilation's
            # memory to a shape's first call: the probe's shape is new to the check
            measure = not self._setup_pending(via, pos) and not be.whole_batches
            seconds = self._agreeing_seconds(evaluate, pos, moved, eps, measure=measure)
            if isinstance(seconds, str):
                rejected.append(f"{name}: {seconds}")
                if seconds == _PLAIN_CALLS_RAISED:
                    break
                if seconds.startswith(_RAISED):
                    raised.add(via)
                continue
            figures = self._figures.setdefault(pos, {})
            figures[f"{via}_probe"] = seconds
            self._via[pos] = via
            if tiled:
                self._tiled[pos] = tiled
                figures["tiled"] = len(tiled)
            return True
        self._unbatchable[pos] = "; ".join(filter(None, [self._unbatchable.get(pos), *rejected]))
        return False

    def _probe_direction(self, pos):
        """The probe's flat unit direction for ``args[pos]`` (the same on every call)."""
        x = self.args[pos]
        return self.be.uniform_unit_vector(x, self.be.generator(x, PROBE_SEED), real=True)

    def _plain_reference(self, pos):
        """The plain calls' difference quotient along the probe's direction (a list, one
        flat array per output), timed: they set one element's rows' cost one at a time
        (:meth:`element_seconds`). Computed once; ``None`` when they raised an error that
        is not the user's (a user's error propagates)."""
        if pos in self._reference:
            return self._reference[pos]
        be, x = self.be, self.args[pos]
        u, eps = self._probe_direction(pos), self.run.eps_for(x)
        self._reference[pos] = None
        try:
            # the best of two: the first plain calls of a check may pay one-time costs
            timings = []
            for _ in range(2 if be.numel(x) >= _RETIMED_NUMEL else 1):
                seconds, sequential = self._timed_plain_quotient(pos, u, eps)
                timings.append(seconds)
        except Exception as e:
            if e in self.run.user_errors:
                raise
            return None
        loop_row = self._element_cost[pos] = min(timings)
        self._figures.setdefault(pos, {})["loop_row"] = loop_row
        self._reference[pos] = sequential
        return sequential

    def _timed_plain_quotient(self, pos, u, eps) -> tuple:
        """The plain calls' difference quotient along ``u``, and the seconds one element's
        rows take at that rate (twice the calls' for a complex input: its real and
        imaginary parts are moved apart)."""
        watch = self.run.stopwatch()
        quotient = self.run.user_errors.call(jac.numerical_directional, self.be, self.fn, self.args, pos, u, eps,
                                             self.run.stencil)
        return watch.seconds() * (2 if self.be.is_complex(self.args[pos]) else 1), quotient

    def _loop_repriced(self, pos) -> float | None:
        """Seconds one element's rows of ``args[pos]`` take one at a time, measured again
        now (the probe's plain calls once more), or ``None`` where they raise. The loop was
        priced when the input was probed, and batches are measured later: on a machine
        whose load changes in between (other processes' work pollutes caches and shares
        the memory bus), a batch can look no faster than a price taken in a quieter
        moment. Measured again, the two figures are of one moment."""
        x = self.args[pos]
        try:
            seconds, _ = self._timed_plain_quotient(pos, self._probe_direction(pos), self.run.eps_for(x))
        except Exception as e:
            if e in self.run.user_errors:
                raise
            return None
        return seconds

    def element_seconds(self, pos) -> float | None:
        """Seconds one element's rows of ``args[pos]`` take computed one at a time, as the
        probe's plain calls measured them (made now if no probe needed them); ``None``
        when those calls raised."""
        if pos not in self._element_cost:
            self._plain_reference(pos)
        return self._element_cost.get(pos)

    def _batched_forms(self, pos) -> list:
        """The batched forms worth a probe, in the order they are tried: ``(via, tiled,
        evaluate)``. Left out without a call of ``fn`` (the reason noted for the engine's
        log): ``stacked`` where an output has no first dimension to carry the copies end to
        end or ``fn``'s kind rules it out (:meth:`Backend.stacking_obstacle`), ``vmap``
        (and ``functional``, always tried last) where the traced evaluation shows an
        obstacle (:meth:`Backend.batching_obstacle`)."""
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
        """Whether ``args[pos]``'s first dimension looks like a batch that ``fn`` carries
        to its outputs (some output shares it, and it is not a vector's only dimension),
        so that its copies laid end to end along it are tried before ``vmap``. Elsewhere
        (a vector, a weight matrix) stacked copies rarely fit: products and broadcasts
        with the other arguments raise, and a process's first raising op maps megabytes
        of C++ unwinding tables, while ``vmap`` batches those functions too."""
        x = self.args[pos]
        if len(x.shape) < 2:
            return False
        return any(len(self.outputs[k].shape) >= 1 and self.outputs[k].shape[0] == x.shape[0] for k in self.floats)

    def _sharing_first_dimension(self, pos) -> tuple | None:
        """The positions of the other dense arrays among ``fn``'s arguments whose first
        dimension is that of ``args[pos]`` (a batch of samples that ``args[pos]`` may
        share: a batch of images beside a batch of their regions), or ``None`` when there
        are none."""
        be, x = self.be, self.args[pos]
        if not x.shape:
            return None
        found = tuple(q for q, a in enumerate(self.args)
                      if q != pos and be.is_array(a) and be.layout(a) == "dense" and len(a.shape) >= 1
                      and a.shape[0] == x.shape[0])
        return found or None

    def _agreeing_seconds(self, evaluate, pos, moved, eps, measure=True):
        """Seconds of ``evaluate`` at the two probe moves, or why it was not taken (a
        string: it raised, its results have other shapes, its difference quotient differs
        from the plain calls' because fn does not see the batch or mixes the copies, or
        :data:`_PLAIN_CALLS_RAISED`). The memory a copy took is noted
        (:meth:`copy_bytes`)."""
        be = self.be
        try:
            watch = self.run.stopwatch()
            call = memory.measured(evaluate, self.fn, self.args, pos, moved)
            seconds = watch.seconds()
            batched = call.result
        except Exception as e:
            if e in self.run.user_errors:
                raise
            return f"{_RAISED} {type(e).__name__}"
        if any(tuple(batched[k].shape) != (2, *self.outputs[k].shape) for k in self.floats):
            return "results of other shapes"
        sequential = self._plain_reference(pos)
        if sequential is None:
            return _PLAIN_CALLS_RAISED
        for k in self.floats:
            minus, plus = be.unstack(batched[k])
            est = be.flatten(be.combine(STENCILS["central"], [minus, plus], eps))
            ref = sequential[k] if self.run.stencil.name == "central" else est
            if tuple(est.shape) != tuple(ref.shape) or not be.allclose(
                est, ref, self.opts.rtol * 1e-2, self.opts.atol * 1e-2
            ):
                return "differs from plain calls"
        if measure and call.added_peak is not None:
            self._copy_bytes[pos] = call.added_peak // 2
        return seconds

    def _setup_pending(self, via, pos) -> bool:
        """Whether a call in batched form ``via`` moving ``args[pos]`` still pays a
        one-time setup (then its memory is mostly the setup's, and is not taken as a
        measurement)."""
        return via in ("vmap", "functional") and self.be.batch_setup_cost(self.run.fn, pos) > 0

    def compiles(self, kind: str, rows: int) -> bool:
        """Whether a batched call of ``kind`` (``"rows 0"``: numerical rows of input 0,
        ``"vjp 1"``: VJP columns of output 1, ``"jvp 0"``: forward rows of checked input
        0) over ``rows`` rows is the check's first of that size, on a backend that compiles
        each batch shape (:attr:`Backend.whole_batches`): its memory then includes the
        compilation's, and is not taken as a measurement."""
        if not self.be.whole_batches:
            return False
        fresh = (kind, rows) not in self._batch_shapes
        self._batch_shapes.add((kind, rows))
        return fresh

    def copy_bytes(self, pos) -> int:
        """Bytes one evaluation of ``fn`` at a moved copy of ``args[pos]`` took in a
        batched call, as the probe measured it (0 when not measured)."""
        return self._copy_bytes.get(pos, 0)

    def _setup_outweighs_saving(self, pos) -> bool:
        """A batched form of fn that costs a one-time setup (e.g. an import) is used only
        when the element-by-element loop it replaces would take longer than the setup, or
        once the loops run instead have cost the process as much
        (:func:`cost.setup_worth_paying`)."""
        setup = self.be.batch_setup_cost(self.run.fn, pos)
        if not setup or cost.setup_worth_paying(setup):
            return False
        loop = loop_check_seconds(self.element_seconds(pos), self.be.numel(self.args[pos]))
        if loop >= setup:
            return False
        cost.spent_instead_of_setup(loop)
        self.run.engine_log.append(EngineEvent("numerical", "looped", pos, "batching setup not worth it"))
        return True

    def vjps(self, k, stacked, count, batched: bool) -> list:
        """Per checked input, the VJPs of output ``k`` with each of the ``count`` stacked
        cotangents, stacked the same way (``None``: undefined): in one batched call, or
        one plain VJP each. Raises ``ValueError`` when the plain VJPs of an input differ
        in shape."""
        if batched:
            return self.trace.vjp_many(k, stacked)
        be = self.be
        per_input, shapes = None, None
        for c in range(count):
            grads = self.run.user_errors.call(self.trace.vjp, [k], [stacked[c]])
            if per_input is None:
                shapes = [None if g is None else tuple(g.shape) for g in grads]
                per_input = [None if g is None else RowBlock(be, count, be.numel(g), g, g.dtype) for g in grads]
            for i, g in enumerate(grads):
                if g is None:
                    per_input[i] = None  # undefined for one cotangent: None, as for all
                elif per_input[i] is not None:
                    if tuple(g.shape) != shapes[i]:
                        raise ValueError("VJPs of one input differ in shape")
                    per_input[i].add(be.flatten(g))
        return [None if block is None else be.reshape(block.result(), (count, *shape))
                for block, shape in zip(per_input, shapes)]

    def evaluate_looped(self, pos, deltas, outputs) -> dict:
        """``{k: (len(deltas), m) NumPy array}``: ``fn`` with ``args[pos]`` moved by each row
        of ``deltas`` (flat NumPy), one plain call each, through the backend's in-place
        perturber (closures see the move; the input is restored bitwise)."""
        be, x = self.be, self.args[pos]
        parts = {k: [] for k in outputs}
        with be.perturber(self.args, pos) as perturber, sharing(self.fn):
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

    def rows_element_by_element(self, pos, begin, end):
        """Yield row blocks ``(start, stop, {output position: rows})`` covering rows
        ``begin:end`` of ``args[pos]``, computed as the reference engine computes them (an
        element and its counterparts in the other samples at once, where :meth:`samples`
        found them independent), and noted as such."""
        yield from self._noted(pos, self._looped_row_chunks(pos, begin, end, self.run.eps_for(self.args[pos])))

    def finish_rows_by_samples(self) -> None:
        """Compute, element by element with the samples moved together, the numerical rows
        not yet computed exactly, for every checked input whose samples :meth:`samples`
        finds independent: a failing check hands them to the reference engine, which would
        otherwise compute them one element at a time (B times the calls)."""
        if not self.keep_rows:
            return
        for q in self.checked:
            n = self.be.numel(self.args[q])
            if q in self._exact_rows or not n or not self.samples(q):
                continue
            eps, done = self.run.eps_for(self.args[q]), 0
            blocks = self._exact_blocks.get(q, {})
            gaps = []
            for s in sorted(blocks):
                if s > done:
                    gaps.append((done, s))
                done = max(done, blocks[s][1])
            if done < n:
                gaps.append((done, n))
            # all gaps in one pass: a gap in one sample is moved together with its
            # counterparts in the others, not in a call of its own
            for _ in self._sample_row_chunks(q, gaps, eps):  # it notes its blocks itself
                pass

    def note_exact_columns(self, k, ranges, rows) -> None:
        """Note that ``rows`` (per checked input, NumPy ``(output numel, input numel)``)
        hold output ``k``'s analytical Jacobian, exact as the reference engine computes
        it in the column ranges ``ranges``, and checked for reentrancy."""
        if ranges:
            self._exact_columns[k] = (ranges, rows)

    def exact_analytical(self) -> dict | None:
        """``{output position: (column ranges, rows per checked input)}``: what
        :meth:`note_exact_columns` noted; ``None`` when nothing."""
        return dict(self._exact_columns) or None

    def _noted(self, pos, chunks):
        """``chunks`` (computed element by element), each noted as an exact block."""
        for chunk in chunks:
            self._note(pos, chunk)
            yield chunk

    def _note(self, pos, chunk) -> None:
        if self.keep_rows and chunk[1] > chunk[0]:
            self._exact_blocks.setdefault(pos, {})[chunk[0]] = chunk

    def remembered(self, pos):
        """The rows of ``args[pos]`` that the reverse-mode pass of the same check left
        (:mod:`agcheck.core.numerical_memo`; a :class:`MemoRows`, taken from the run's
        memo), or ``None``. Once taken, :meth:`numerical_row_chunks` yields them, in the
        blocks they were computed in. Only a forward-mode pass asks."""
        if pos not in self._remembered:
            self._remembered[pos] = self.run.numerical_memo.take(self.fn, self.args, pos)
        return self._remembered[pos]

    def all_rows_exact(self, pos) -> bool:
        """Whether the rows of ``args[pos]`` were all computed element by element, in one
        pass (the rows :meth:`numerical_row_chunks` yields are then those)."""
        return pos in self._exact_rows

    def _row_chunks(self, pos):
        be, x, eps = self.be, self.args[pos], self.run.eps_for(self.args[pos])
        n = be.numel(x)
        remembered = self._remembered.get(pos)
        if remembered is not None:
            for start, stop in remembered.bounds:
                chunk = (start, stop, {k: rows[start:stop] for k, rows in remembered.rows.items()})
                if remembered.exact:
                    self._note(pos, chunk)
                yield chunk
            return
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
        estimate = max((n + self.out_numel) * self.itemsize * INTERMEDIATES, self.copy_bytes(pos)) * points
        self._row_bytes[pos] = estimate
        looped = self._element_cost.get(pos, float("inf"))
        probe = self._figures.get(pos, {}).get(f"{self._via[pos]}_probe")  # two points of one row
        row_probe = probe * points / 2 * (2 if complex_input else 1) if probe else None
        per_row_of, start, remeasured = {}, 0, False
        size = cost.rows_per_chunk(estimate, self.batch_bytes, n)
        if not be.whole_batches:
            size = min(cost.RAMP[0], size)
        while start < n:
            stop = min(n, start + size)
            setup_pending = self._setup_pending(self._via[pos], pos)
            watch = self.run.stopwatch()
            call = memory.measured(self._batched_rows, pos, list(range(start, stop)), eps, complex_input)
            seconds = watch.seconds()
            compiled = self.compiles(f"rows {pos}", stop - start)  # see the probe
            if call.added_peak is not None and not setup_pending and not compiled:  # memory as measured
                self._row_bytes[pos] = max(self._row_bytes[pos], call.added_peak // (stop - start))
            yield start, stop, call.result
            if stop >= n:
                return
            per_row_of[size] = seconds / size
            slope = cost.slope_per_row(row_probe, 1, seconds, size) if len(per_row_of) == 1 else None
            chunk = cost.rows_per_chunk(self._row_bytes[pos], self.batch_bytes, n)
            ran = size
            size, why = self._next_batch_size(pos, per_row_of, looped, chunk, seconds, slope)
            start = stop
            if size is None and not remeasured and row_probe and per_row_of[ran] > _OUTLIER * row_probe:
                # a batch's rows far dearer than the probe's one-row batch: a moment of load
                # (another process, threads spinning), not the batched form; measured again
                remeasured, size = True, ran
                self.run.engine_log.append(EngineEvent("numerical", "remeasured", pos, "a batch far dearer than its probe",
                                                       via=self._via[pos], figures={
                                                           "batched_row": per_row_of[ran], "probe_row": row_probe}))
                continue
            repriced = None
            if size is None and pos not in self._repriced:
                # before giving the rest of the input to the loop, its price again, now
                self._repriced.add(pos)
                repriced = self._loop_repriced(pos)
                if repriced is not None and repriced > looped:
                    looped = self._element_cost[pos] = repriced
                    size, why = self._next_batch_size(pos, per_row_of, looped, chunk, seconds, slope)
                    if size is not None:
                        self.run.engine_log.append(EngineEvent("numerical", "repriced", pos, "batching goes on",
                                                               via=self._via[pos], figures={
                                                                   "loop_row": looped,
                                                                   "batched_row": per_row_of[max(per_row_of)]}))
            if size is None:
                self._looped.add(pos)
                figures = {"loop_row": looped, "batched_row": per_row_of[max(per_row_of)]}
                if repriced is not None:
                    figures["loop_repriced"] = repriced
                if self._samples.get(pos):
                    figures["samples"] = self._samples[pos]
                self.run.engine_log.append(EngineEvent("numerical", "looped", pos, why, via=self._via[pos],
                                                       figures=figures))
                yield from self._noted(pos, self._looped_row_chunks(pos, stop, n, eps))
                return

    def _next_batch_size(self, pos, per_row_of, looped, chunk, seconds, slope):
        """:func:`cost.next_batch_size`, against the loop's cost per row divided by the
        samples the loop could move together (:meth:`samples`), probed only once batching
        loses against that loop, as batching of dense CNNs does."""
        size, why = cost.next_batch_size(per_row_of, looped, chunk, seconds=seconds, slope=slope)
        candidate = self._sample_candidate(pos)
        refused = pos in self._samples and not self._samples[pos]
        if size is None or not candidate or refused:
            return size, why
        by_samples, _ = cost.next_batch_size(per_row_of, looped / candidate, chunk, seconds=seconds, slope=slope)
        if by_samples is None and self.samples(pos):
            return None, "looped by samples is cheaper"
        return size, why

    def samples(self, pos) -> int | None:
        """``B`` when the first dimension of ``args[pos]`` holds ``B`` samples that ``fn``
        treats independently, so that one plain call moving an element in every sample
        gives each sample's row as a call moving that element alone would (bitwise);
        ``None`` otherwise.

        Required: a real double-precision dense input with ``B >= 2``, every floating
        output led by the same ``B``, and, for each sample in turn, moving all of its
        elements (by ``±eps``) leaves every other sample's outputs bitwise unchanged
        (``B`` plain calls where the first sample's move leaves the others bitwise as
        traced, the traced outputs then standing for the unmoved call; else ``B + 1``,
        their unmoved one kept for the rows; one call where the first sample's move
        changes another sample's outputs by more than rounding against the traced
        outputs). A function that mixes samples (batch statistics, a normalisation over
        the batch) fails that."""
        if pos not in self._samples:
            found = self._samples[pos] = self._probe_samples(pos)
            if found:
                self.run.engine_log.append(EngineEvent("numerical", "by samples", pos, figures={"samples": found}))
        return self._samples[pos]

    def samples_probed(self, pos) -> bool:
        """Whether :meth:`samples` has been asked of ``args[pos]`` (it then makes no call)."""
        return pos in self._samples

    def samples_loop_cheaper(self, pos, seconds: float) -> bool:
        """Whether ``seconds`` of another path's work on ``args[pos]`` cost at least half
        of the loop moving all samples together (:meth:`samples`, probed only then). Half:
        that loop's rows are exact, and a failing check hands them to the reference engine."""
        b = self._sample_candidate(pos)
        loop_row = self.element_seconds(pos) if b else None
        if loop_row is None:
            return False
        by_samples = self.be.numel(self.args[pos]) / b * loop_row
        return seconds * _EXACT_ROWS_WORTH >= by_samples and bool(self.samples(pos))

    def _sample_candidate(self, pos) -> int | None:
        """``B`` when ``args[pos]`` and the outputs have the form :meth:`samples` requires
        and its probe costs well below what moving samples together saves; ``None`` when
        not (no call of ``fn`` is made)."""
        be, x = self.be, self.args[pos]
        shape = tuple(x.shape)
        if not shape or shape[0] < 2 or be.layout(x) != "dense" or be.is_complex(x) or be.itemsize(x) != 8:
            return None
        b, n = shape[0], be.numel(x)
        # the probe's b + 1 calls must cost well below what moving samples together saves
        # (about len(stencil) calls per element)
        if n // b < 2 or 4 * (b + 1) > len(self.run.stencil.offsets) * n:
            return None
        for k in self.floats:
            out = self.outputs[k]
            if len(out.shape) < 1 or out.shape[0] != b or be.is_complex(out) or be.itemsize(out) != 8:
                return None
        return b

    def _probe_samples(self, pos) -> int | None:
        b = self._sample_candidate(pos)
        if b is None:
            return None
        be, x = self.be, self.args[pos]
        n = be.numel(x)
        per_sample = n // b
        eps = self.run.eps_for(x)
        signs = np.random.default_rng(SAMPLES_SEED).choice(np.array([-1.0, 1.0]), size=n)
        traced = {k: be.to_numpy(self.outputs[k]).copy() for k in self.floats}  # kept apart from fn's tensors
        base = None
        try:
            with be.perturber(self.args, pos) as perturber, sharing(self.fn):
                for s in range(b):
                    delta = np.zeros(n)
                    delta[s * per_sample:(s + 1) * per_sample] = eps * signs[s * per_sample:(s + 1) * per_sample]
                    moved = self._moved_outputs(pos, perturber, delta)
                    others = np.arange(b) != s
                    if base is None:
                        # the traced outputs first: where the move reaches another sample by
                        # far more than rounding (a matrix's rows are not samples), no
                        # unmoved call is needed to say so; where it leaves them bitwise
                        # as traced, the traced outputs stand for the unmoved call (each
                        # sample's part of them is then compared bitwise with a plain call
                        # moving another sample, below)
                        if any(moved[k].shape != traced[k].shape or _beyond_rounding(moved[k][others], traced[k][others])
                               for k in self.floats):
                            return None
                        if all(np.array_equal(moved[k][others], traced[k][others], equal_nan=True) for k in self.floats):
                            base = traced
                        else:
                            base = self._moved_outputs(pos, perturber, np.zeros(n))
                    for k in self.floats:
                        if moved[k].shape != base[k].shape or \
                                not np.array_equal(moved[k][others], base[k][others], equal_nan=True):
                            return None
        except Exception as e:
            if e in self.run.user_errors:
                raise
            return None
        self._sample_base[pos] = base
        return b

    def _moved_outputs(self, pos, perturber, delta) -> dict:
        """``{k: NumPy array}``: ``fn``'s floating outputs with ``args[pos]`` moved to
        ``x - delta`` (flat NumPy ``delta``; ``x - 0.0`` keeps every bit of ``x``, where
        ``x + 0.0`` would turn ``-0.0`` into ``0.0``, and ``x - (-h)`` is ``x + h``)."""
        be, x = self.be, self.args[pos]
        step = be.reshape(be.array_like(delta, x), tuple(x.shape))
        outs = self.run.user_errors.call(perturber.evaluate_direction, self.fn, step, -1)
        return {k: be.to_numpy(outs[k]) for k in self.floats}

    def _elements_moved(self, pos, perturber, flats, step) -> dict:
        """:meth:`_moved_outputs` with only the elements ``flats`` moved (by ``step``):
        written one entry each where the perturber can (an in-place one), else as a
        whole-input move."""
        in_place = getattr(perturber, "evaluate_elements", None)
        if in_place is None:
            delta = np.zeros(self.be.numel(self.args[pos]))
            delta[flats] = step
            return self._moved_outputs(pos, perturber, delta)
        outs = self.run.user_errors.call(in_place, self.fn, flats, [step] * len(flats))
        return {k: self.be.to_numpy(outs[k]) for k in self.floats}

    def _sample_row_chunks(self, pos, spans, eps):
        """Rows of the disjoint ``(begin, end)`` ``spans``, each element moved together
        with its counterparts in the other samples that the spans also hold (one plain
        call per stencil point for all of them); each sample's outputs give that sample's
        element's row, and the other samples' entries are what a call moving the element
        alone gives them (:meth:`samples`)."""
        be, x, stencil = self.be, self.args[pos], self.run.stencil
        b, n = self._samples[pos], be.numel(x)
        per_sample = n // b
        out_size = {k: be.numel(self.outputs[k]) // b for k in self.floats}
        moves = [_sample_delta(m, eps) for m in stencil.offsets]
        per_row = max(n + self.out_numel, 1) * self.itemsize * 2 * b
        chunk = cost.rows_per_chunk(per_row, self.budget // cost.CHUNK_SHARE, per_sample)
        with be.perturber(self.args, pos) as perturber, sharing(self.fn):
            # the entries of the samples an element does not reach: the stencil applied to
            # unmoved outputs, as torch computes them (0 for central differences of finite
            # outputs; rounding for the five-point stencil; NaN where an output is infinite)
            base = self._sample_base.get(pos) or self._moved_outputs(pos, perturber, np.zeros(n))
            unreached = {k: _combined(stencil, [base[k]] * len(moves), eps) for k in self.floats}
            for i0 in range(0, per_sample, chunk):
                i1 = min(per_sample, i0 + chunk)
                # (first element of the sample, lo, hi): each span's part in each sample
                ranges = [(s * per_sample, max(begin, s * per_sample + i0), min(end, s * per_sample + i1))
                          for s in range(b) for begin, end in spans]
                ranges = [(first, lo, hi) for first, lo, hi in ranges if lo < hi]
                if not ranges:
                    continue
                rows = {lo: {k: np.tile(unreached[k], (hi - lo, 1)) for k in self.floats} for _, lo, hi in ranges}
                for i in range(i0, i1):
                    moved = [(first + i, lo) for first, lo, hi in ranges if lo <= first + i < hi]
                    if not moved:
                        continue
                    flats = [f for f, _ in moved]
                    values = [self._elements_moved(pos, perturber, flats, step) for step in moves]
                    if any(v[k].shape != tuple(self.outputs[k].shape) for v in values for k in self.floats):
                        # fn changed an output's shape: the element path meets it as torch does
                        alone = self._element_rows(pos, eps, flats)
                        for j, (f, lo) in enumerate(moved):
                            for k in self.floats:
                                rows[lo][k][f - lo] = be.to_numpy(alone[k][j])
                        continue
                    for k in self.floats:
                        row = _combined(stencil, [v[k] for v in values], eps)
                        for f, lo in moved:
                            s = f // per_sample
                            segment = slice(s * out_size[k], (s + 1) * out_size[k])
                            rows[lo][k][f - lo, segment] = row[segment]
                blocks = [(lo, hi, {k: be.array_like(rows[lo][k], self.outputs[k]) for k in self.floats})
                          for _, lo, hi in ranges]
                for block in blocks:  # all noted first: a consumer may stop at the first that differs
                    self._note(pos, block)
                yield from blocks

    def _looped_row_chunks(self, pos, begin, end, eps):
        """Rows ``begin:end`` one element at a time, yielded in chunks so that memory
        follows the chunk, not the Jacobian (an element and its counterparts in the other
        samples at once, where :meth:`samples` found them independent)."""
        be = self.be
        if begin < end and pos not in self._samples and self._square_matrix(pos) and self._sample_candidate(pos):
            # a square matrix's rows are rarely samples: the first element's rows first,
            # as the loop computes them, and where its move reaches another row, the
            # samples' probe is not paid (where the rows are samples, the first element's
            # counterparts in the other rows then cost two calls more)
            first = self._element_rows(pos, eps, range(begin, begin + 1))
            yield begin, begin + 1, first
            if self._reaches_another_sample(pos, begin, first):
                self._samples[pos] = None
            begin += 1
        if begin < end and self.samples(pos):
            yield from self._sample_row_chunks(pos, [(begin, end)], eps)
            return
        per_row = max(be.numel(self.args[pos]) + self.out_numel, 1) * self.itemsize * 2
        chunk = cost.rows_per_chunk(per_row, self.budget // cost.CHUNK_SHARE, max(end - begin, 1))
        for start in range(begin, end, chunk):
            stop = min(end, start + chunk)
            yield start, stop, self._element_rows(pos, eps, range(start, stop))
        if begin == end == 0:
            yield 0, 0, self._element_rows(pos, eps)

    def _element_rows(self, pos, eps, elements=None):
        """Rows of ``args[pos]``'s flat ``elements`` (all where ``None``), each element moved
        alone by plain calls, as the reference engine computes them."""
        return self.run.user_errors.call(jac.numerical_jacobians, self.be, self.fn, self.args, pos, self.outputs,
                                         eps, self.run.stencil, elements=elements)

    def _square_matrix(self, pos) -> bool:
        shape = tuple(self.args[pos].shape)
        return len(shape) == 2 and shape[0] == shape[1]

    def _reaches_another_sample(self, pos, element, rows) -> bool:
        """Whether ``rows`` (of ``args[pos]``'s flat ``element``) hold a finite entry other
        than zero among the outputs of a sample other than the element's, reading the
        first dimension of ``args[pos]`` and of every floating output as samples."""
        b = self._sample_candidate(pos)
        s = element // (self.be.numel(self.args[pos]) // b)
        for k in self.floats:
            entries = self.be.to_numpy(rows[k]).reshape(b, -1)
            others = np.delete(entries, s, axis=0)
            if np.any(np.isfinite(others) & (others != 0)):
                return True
        return False

    def _batched_rows(self, pos, flat, eps, complex_input):
        be, x = self.be, self.args[pos]
        rows = self._difference_rows(pos, flat, eps)
        if complex_input:
            imag = self._difference_rows(pos, flat, eps * 1j)
            rows = {k: be.astype(be.plus_imaginary(rows[k], imag[k]), x.dtype) for k in rows}
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
            rows[k] = be.combine(stencil, be.unstack(o), eps)
        return rows


def _beyond_rounding(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether ``a`` and ``b`` differ by more than rounding could make them: beyond
    :data:`_ROUNDING` relative to each entry, or to the largest finite entry of ``b``."""
    finite = np.abs(b[np.isfinite(b)])
    scale = float(finite.max()) if finite.size else 0.0
    return not np.allclose(a, b, rtol=_ROUNDING, atol=_ROUNDING * scale, equal_nan=True)


def _combined(stencil, values: list, eps) -> np.ndarray:
    """The stencil's derivative estimate from NumPy outputs, flat, with torch's silence
    on infinities and NaN (the same IEEE operations, so the same bits)."""
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        return np.asarray(stencil.combine(values, eps)).reshape(-1)


def _sample_delta(offset, eps) -> float:
    """``d`` such that ``x - d`` is the stencil point ``x + offset * eps`` as torch's
    element move computes it (``x + h`` for a plus point, ``x - h`` for a minus point)."""
    h = eps if abs(offset) == 1 else abs(offset) * eps
    return -h if offset > 0 else h


def n_in_total(be, args, checked) -> int:
    """How many elements the checked inputs hold in all."""
    return sum(be.numel(args[q]) for q in checked)
