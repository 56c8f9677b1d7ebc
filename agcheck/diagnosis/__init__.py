"""Diagnoses: recognise and name the usual gradient bugs in a failure report.

A diagnosis is a hypothesis with its evidence, never a verdict: the verdict is the
check's. Each one is tested on the failing blocks only (nothing here runs while checks
pass) and fires only when the evidence is strong:

* ``factor`` / ``sign`` / ``transposed`` / ``adjoint`` / ``conjugate`` /
  ``ignores_grad_output`` / ``ignores_tangent`` — the analytical block equals a simple
  transformation of the numerical one (``2 * N``, ``-N``, ``N.T``, ``conj(N)``, ...) to
  within 1 % of the mismatch (and finite-difference noise), far closer than to ``N``
  itself;
* ``zero_analytical`` / ``zero_numerical`` — one side is zero, the other is not;
* ``permuted`` — the analytical block is the numerical one with its rows or columns
  reordered (a flip, roll or index the backward does not undo);
* ``swapped`` — two failing blocks of one output, for two inputs of the same size: each
  analytical block is the other's numerical one (the backward returns its gradients in
  the wrong order);
* ``missing_slice`` — the analytical block is zero on a slice of the output's or the
  input's elements (``output[1, ...]``: a region of interest, a batch element, a band),
  where the numerical one is not, and matches elsewhere;
* ``constant_term`` — ``analytical - numerical`` is a constant times the identity (a term
  ``c * grad_output``, the derivative of ``c * x``, left out or added), or one constant on
  every entry;
* ``few_entries`` / ``localized`` — only a handful of entries (listed), or only the
  entries of a few input or output elements, disagree;
* ``input_statistics`` / ``low_rank`` — where none of the above fits, the mismatch itself
  has a simple form: per output element an affine function of the input's values (the
  derivative through a detached mean and scale is missing), or a rank-1 or rank-2 matrix
  (a term such as softmax's ``-s s^T`` is missing);
* ``kink`` — the numerical derivative at the worst entries changes with the step size
  (re-evaluated with ``eps / 10`` and ``eps * 10``) or differs between the right and left
  one-sided differences even for a small step: the input sits on a non-differentiable
  point;
* ``discontinuity`` — those estimates grow tenfold as the step shrinks tenfold, beyond
  the rounding of the output: fn's value jumps at the input (a step, sorting or argmax
  with ties, eigenvectors of a repeated eigenvalue), whatever the analytical value;
* ``precision`` — the same instability with an input in less than double precision, or
  with a double input whose output holds only float32 values (``fn`` rounds inside; also
  when that rounding leaves the numerical Jacobian zero): finite differences are
  dominated by rounding;
* ``nondeterministic_fn`` — ``fn`` called again at the unmoved input gives another output
  than the check's call there (dropout in training mode, a counter): whatever else the
  block shows is then noise;
* ``noise`` — the mismatch is within what finite differences can resolve (estimates with
  other steps differ by as much): the tolerance is too tight, the gradient likely right;
* ``fast_only`` — fast mode's projection failed but the full blocks agree;
* for the other checks: ``nondeterministic`` (with the run-to-run difference next to
  ``nondet_tol`` and whether it is rounding-sized), ``not_multiplied_by_grad_output``,
  ``batched``, ``undefined_grad``, ``depends_on_input``, ``gradient_shape``.

The structural hypotheses are tried only once the mismatch is known not to be noise or a
kink, so a correct function checked with an absurdly tight tolerance gets ``noise`` and
nothing else.

Diagnosis needs nothing but the report: the one thing it cannot do on data alone,
recomputing numerical entries with other steps, it receives from the caller as a
``resample`` callable per block (:mod:`agcheck.core.report_filling` builds them from the
checked function; see :mod:`agcheck.diagnosis.probes`).

Modules: :mod:`~agcheck.diagnosis.blocks` (one Jacobian block, in order),
:mod:`~agcheck.diagnosis.pairs` (two blocks of one output: swapped inputs),
:mod:`~agcheck.diagnosis.probes` (step-size evidence),
:mod:`~agcheck.diagnosis.structure` (whole-block hypotheses, one function each),
:mod:`~agcheck.diagnosis.slices` (a slice the backward leaves at zero),
:mod:`~agcheck.diagnosis.terms` (the mismatch as a term left out),
:mod:`~agcheck.diagnosis.checks` (the other checks),
:mod:`~agcheck.diagnosis.facts` (what they share).
"""
from __future__ import annotations

import math

from typing import Callable, Mapping

from agcheck.report.model import Diagnosis

from .blocks import diagnose_block
from .checks import CHECK_HANDLERS
from .facts import machine_eps
from .pairs import swapped_inputs
from .probes import PROBED_BLOCKS, probe_rows

__all__ = ["Diagnosis", "diagnose", "diagnose_block", "machine_eps"]


def diagnose(report, resamplers: Mapping[int, Callable] | None = None) -> list:
    """The diagnoses of a failure report (an empty list when no pattern is recognised).

    ``resamplers`` maps the index of a block in ``report.blocks`` to its ``resample``
    callable (blocks without one, and blocks after the first ``PROBED_BLOCKS``, skip the
    step-size probes). The probed blocks of one input share its probe budget
    (:func:`~agcheck.diagnosis.probes.probe_rows`), and a block with failing
    entries in rows an earlier block of its input probed probes those rows only.
    """
    if report.blocks:
        resamplers = resamplers or {}
        probed = {i: resamplers[i] for i in range(min(PROBED_BLOCKS, len(report.blocks))) if i in resamplers}
        sharing = {}
        for i in probed:
            sharing[report.blocks[i].input] = sharing.get(report.blocks[i].input, 0) + 1
        found = []
        for i, block in enumerate(report.blocks):
            rows = probe_rows(math.prod(block.input_shape or ()), sharing.get(block.input, 1))
            found += diagnose_block(block, i, probed.get(i), rows)
        return swapped_inputs(report.blocks, found)
    handler = CHECK_HANDLERS.get(report.check)
    return handler(report) if handler is not None else []
