"""Ports that agree at the inputs given but are different functions off them (a port that
normalises a quaternion and one that assumes it normalised agree on unit quaternions only;
their derivatives then differ legitimately, and gradcheck passes on both). Values that
differ at inputs moved by a seeded random step show it."""
from __future__ import annotations

import numpy as np

from agcheck.crosscheck.compare import compare
from agcheck.crosscheck.result import CrosscheckResult
from agcheck.crosscheck.sides import CROSSCHECK_SEED, labelled_value

__all__ = ["NEARBY_STEP", "compare_nearby"]

#: the step, relative to each entry's size (at least 1), of the nearby inputs
NEARBY_STEP = 1e-3


def _nearby_inputs(np_inputs: tuple, checked: list) -> tuple:
    gen = np.random.Generator(np.random.PCG64(CROSSCHECK_SEED + 1))
    moved = list(np_inputs)
    for p in checked:
        x = np.asarray(np_inputs[p])
        step = gen.standard_normal(x.shape)
        if np.iscomplexobj(x):
            step = step + 1j * gen.standard_normal(x.shape)
        moved[p] = (x + NEARBY_STEP * np.maximum(1.0, np.abs(x)) * step).astype(x.dtype)
    return tuple(moved)


def compare_nearby(result: CrosscheckResult, sides: list, np_inputs: tuple, checked: list) -> None:
    """When only derivatives disagree: each disagreeing pair's values compared again at nearby
    inputs, into ``result.nearby``."""
    bad = result.disagreements()
    if not bad or any(d.quantity == "value" for d in bad):
        return
    by_name = {s.name: s for s in sides}
    pairs = list(dict.fromkeys((d.reference, d.other) for d in bad))
    moved = _nearby_inputs(np_inputs, checked)
    rows = []
    for ref, other in pairs:
        try:
            computed = []
            for name in (ref, other):
                with by_name[name].context():
                    computed.append(by_name[name].values_at(moved))
        except Exception:  # the comparison is a hint only
            continue
        for k, (a, b) in enumerate(zip(*computed)):
            a, b = labelled_value(a, k), labelled_value(b, k)
            if not (np.issubdtype(a.data.dtype, np.inexact) and np.issubdtype(b.data.dtype, np.inexact)):
                continue
            rows.append(compare("value", ref, other, (k,), a, b, result.rtol, result.atol))
    result.nearby = rows
    result.nearby_step = NEARBY_STEP if rows else 0.0
