"""Diagnoses: recognise and name the usual gradient bugs in a failure report.

A diagnosis is a hypothesis with its evidence, never a verdict (the verdict is the check's),
tested on the failing blocks only and fired only on strong evidence; docs/reports.md lists
every kind. The structural hypotheses are tried only once the mismatch is known not to be
noise or a kink, so a correct function checked with an absurdly tight tolerance gets
``noise`` and nothing else. Diagnosis needs nothing but the report, plus a ``resample``
callable per block for the step-size probes (:mod:`agcheck.core.report_filling` builds them).

Modules: ``blocks`` (one Jacobian block, in order), ``pairs`` (swapped inputs), ``probes``
(step-size evidence), ``structure`` (whole-block hypotheses), ``slices`` (a slice left at
zero), ``terms`` (the mismatch as a term left out), ``checks`` (the other checks) and
``facts`` (what they share).
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
    """The diagnoses of a failure report (``[]`` when no pattern is recognised).

    ``resamplers`` maps a block's index in ``report.blocks`` to its ``resample`` callable;
    only the first ``PROBED_BLOCKS`` blocks are probed, those of one input sharing its
    budget (:func:`~agcheck.diagnosis.probes.probe_rows`).
    """
    if report.blocks:
        resamplers = resamplers or {}
        probed = {i: resamplers[i] for i in range(min(PROBED_BLOCKS, len(report.blocks))) if i in resamplers}
        sharing: dict = {}
        for i in probed:
            sharing[report.blocks[i].input] = sharing.get(report.blocks[i].input, 0) + 1
        found = []
        for i, block in enumerate(report.blocks):
            rows = probe_rows(math.prod(block.input_shape or ()), sharing.get(block.input, 1))
            found += diagnose_block(block, i, probed.get(i), rows)
        return swapped_inputs(report.blocks, found)
    handler = CHECK_HANDLERS.get(report.check)
    return handler(report) if handler is not None else []
