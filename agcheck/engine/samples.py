"""Rows of an input whose first dimension holds independent samples: one plain call moves
an element in every sample, and each sample's outputs give its row, bit for bit the row a
call moving the element alone gives (:class:`SampleRows`, part of ``rows.Problem``)."""
from __future__ import annotations

import numpy as np

from agcheck.core import jacobian as jac
from agcheck.core.outcome import EngineEvent
from agcheck.engine import cost

__all__ = ["SampleRows", "BATCHED_MOVES_PER_CALL"]

SAMPLES_SEED = 5119
#: relative differences below this are rounding (:meth:`SampleRows._probe_samples`)
_ROUNDING = 1e-10
#: a batched move is taken to cost this fraction of a plain call where the coloured pass
#: weighs its moves against the loop by samples (:meth:`SampleRows.samples_loop_cheaper`)
BATCHED_MOVES_PER_CALL = 8


class SampleRows:
    """Rows by samples and the element loop; mixed into ``rows.Problem``, whose attributes
    it reads."""

    def samples(self, pos) -> int | None:
        """``B`` where ``args[pos]``'s first dimension holds ``B`` samples fn treats
        independently (each sample's row from a call moving an element in all of them is
        bitwise the element's own row), else ``None``. Probed once: a real float64 dense
        input, every floating output led by ``B``, and moving each sample's elements
        leaves the others' outputs bitwise unchanged (``B`` or ``B + 1`` plain calls; one
        where the first move reaches another sample beyond rounding). Batch statistics
        fail it."""
        if pos not in self._samples:
            found = self._samples[pos] = self._probe_samples(pos)
            if found:
                self.run.engine_log.append(EngineEvent("numerical", "by samples", pos, figures={"samples": found}))
        return self._samples[pos]

    def samples_probed(self, pos) -> bool:
        """Whether :meth:`samples` has been asked of ``args[pos]``."""
        return pos in self._samples

    def samples_loop_cheaper(self, pos, moves: int) -> bool:
        """Whether moving the samples of ``args[pos]`` together (probed only then) costs
        less than ``moves`` batched moves at ``1 / BATCHED_MOVES_PER_CALL`` of a call each."""
        b = self._sample_candidate(pos)
        if not b:
            return False
        calls = self.be.numel(self.args[pos]) // b * len(self.run.stencil.offsets)
        return moves >= BATCHED_MOVES_PER_CALL * calls and bool(self.samples(pos))

    def _sample_candidate(self, pos) -> int | None:
        """``B`` where the shapes have the form :meth:`samples` requires and its probe
        costs well below what it saves, else ``None`` (no call)."""
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
            with be.perturber(self.args, pos) as perturber:
                for s in range(b):
                    delta = np.zeros(n)
                    delta[s * per_sample:(s + 1) * per_sample] = eps * signs[s * per_sample:(s + 1) * per_sample]
                    moved = self._moved_outputs(pos, perturber, delta)
                    others = np.arange(b) != s
                    if base is None:
                        # against the traced outputs first: a move reaching another sample
                        # beyond rounding needs no unmoved call; one leaving them bitwise as
                        # traced lets them stand for it (checked bitwise by later moves)
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
        """``{k: NumPy array}``: fn's floating outputs at ``x - delta`` (``x - 0.0`` keeps
        ``-0.0``, where ``x + 0.0`` would not; ``x - (-h)`` is ``x + h``)."""
        be, x = self.be, self.args[pos]
        step = be.array_like(delta.reshape(tuple(x.shape)), x)
        outs = self.run.user_errors.call(perturber.evaluate_direction, self.fn, step, -1)
        return {k: be.to_numpy(outs[k]) for k in self.floats}

    def _elements_moved(self, pos, perturber, flats, step) -> dict:
        """:meth:`_moved_outputs` with only ``flats`` moved by ``step``: written entry by
        entry where the perturber can, else as a whole-input move."""
        in_place = getattr(perturber, "evaluate_elements", None)
        if in_place is None:
            delta = np.zeros(self.be.numel(self.args[pos]))
            delta[flats] = step
            return self._moved_outputs(pos, perturber, delta)
        outs = self.run.user_errors.call(in_place, self.fn, flats, [step] * len(flats))
        return {k: self.be.to_numpy(outs[k]) for k in self.floats}

    def _sample_row_chunks(self, pos, spans, eps):
        """Rows of the disjoint ``(begin, end)`` ``spans``, each element moved with its
        counterparts in the spans' other samples (a call per stencil point for all);
        entries in samples an element does not reach are an unmoved call's."""
        be, x, stencil = self.be, self.args[pos], self.run.stencil
        b, n = self._samples[pos], be.numel(x)
        per_sample = n // b
        out_size = {k: be.numel(self.outputs[k]) // b for k in self.floats}
        moves = [_sample_delta(m, eps) for m in stencil.offsets]
        per_row = max(n + self.out_numel, 1) * self.itemsize * 2 * b
        chunk = cost.rows_per_chunk(per_row, self.budget // cost.CHUNK_SHARE, per_sample)
        with be.perturber(self.args, pos) as perturber:
            # entries an element does not reach: the stencil over unmoved outputs, as torch's
            # (0 for central differences of finite outputs, NaN where an output is infinite)
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
                for block in blocks:  # all kept first: a consumer may stop at the first that differs
                    self._keep(pos, block, exact=True)
                yield from blocks

    def _looped_row_chunks(self, pos, begin, end, eps):
        """Rows ``begin:end`` one element at a time (with its counterparts in the other
        samples where independent), in chunks: memory follows the chunk."""
        be = self.be
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
        """Rows of ``args[pos]``'s flat ``elements`` (all where ``None``), as the reference
        engine computes them."""
        return self.run.user_errors.call(jac.numerical_jacobians, self.be, self.fn, self.args, pos, self.outputs,
                                         eps, self.run.stencil, elements=elements)


def _beyond_rounding(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether ``a`` and ``b`` differ beyond :data:`_ROUNDING`, relative to each entry or
    to ``b``'s largest finite entry."""
    finite = np.abs(b[np.isfinite(b)])
    scale = float(finite.max()) if finite.size else 0.0
    return not np.allclose(a, b, rtol=_ROUNDING, atol=_ROUNDING * scale, equal_nan=True)


def _combined(stencil, values: list, eps) -> np.ndarray:
    """The stencil's estimate from NumPy outputs, flat, silent on infinities and NaN as
    torch's (the same IEEE operations, the same bits)."""
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        return np.asarray(stencil.combine(values, eps)).reshape(-1)


def _sample_delta(offset, eps) -> float:
    """``d`` with ``x - d`` the stencil point ``x + offset * eps`` as torch computes it."""
    h = eps if abs(offset) == 1 else abs(offset) * eps
    return -h if offset > 0 else h
