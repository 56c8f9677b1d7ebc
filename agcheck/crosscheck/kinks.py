"""Is a disagreement on a kink? One-sided slopes at the entry where two backends differ.

A first derivative that two frameworks disagree on is probed through the function's
values; a second derivative through the first derivative (the reference backend's own
reverse mode). Slopes left and right of the point that differ, by an amount that does not
shrink with the step, mean the point is not differentiable there: each framework picks
its own subgradient, and finite differences cannot decide between them.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from agcheck.crosscheck.result import Difference
from agcheck.crosscheck.sides import BackendPort

__all__ = ["kink_hint", "one_sided_slopes"]


def _step(x: np.ndarray, value: float) -> float:
    base = 1e-6 if x.dtype in (np.float64, np.longdouble) else 1e-3
    return base * max(1.0, abs(value))


def one_sided_slopes(s: Callable[[float], float], h: float):
    """``(left, right)`` slopes of the scalar function ``s`` of an offset at offset 0, when
    0 is a kink of ``s``; ``None`` when it is not one (or the probe fails).

    The slopes are taken over ``[-2h, -h]`` and ``[h, 2h]`` and again over ``[-3h, -2h]``
    and ``[2h, 3h]``, never at 0 itself (where a derivative may jump). Near a smooth point
    the gap between the right and left slopes grows with the distance from 0 (3h s'' and
    5h s''); at a kink it is the jump of the slope in both.
    """
    try:
        with np.errstate(all="ignore"):
            v = {t: float(s(t * h)) for t in (-3, -2, -1, 1, 2, 3)}
    except Exception:  # the probe is a hint only
        return None
    left, right = (v[-1] - v[-2]) / h, (v[2] - v[1]) / h
    far_left, far_right = (v[-2] - v[-3]) / h, (v[3] - v[2]) / h
    if not all(np.isfinite([left, right, far_left, far_right])):
        return None
    gap, far_gap = right - left, far_right - far_left
    if abs(gap) <= 1e-3 * (1 + max(abs(left), abs(right))) or abs(far_gap - gap) > 0.5 * abs(gap):
        return None
    return left, right


def _moved(np_inputs: tuple, p: int, i: int, t: float) -> tuple:
    x = np.array(np_inputs[p], copy=True)
    x.reshape(-1)[i] += t
    inputs = list(np_inputs)
    inputs[p] = x
    return tuple(inputs)


def _first_order(side: BackendPort, d: Difference) -> str:
    out_label, in_label = f"output {d.output} element ", f"input {d.input} element "
    if out_label not in d.position or in_label not in d.position:
        return ""
    r, i = d.position[out_label], d.position[in_label]
    p = side.checked[d.input]
    x = np.asarray(side.np_inputs[p])
    if np.iscomplexobj(x) or np.iscomplexobj(side.output_numpy(side.outputs[d.output])):
        return ""

    def s(t):
        out = side.values_at(_moved(side.np_inputs, p, i, t))[d.output]
        return np.asarray(out).reshape(-1)[r]

    with side.context():
        slopes = one_sided_slopes(s, _step(x, x.reshape(-1)[i]))
    if slopes is None:
        return ""
    in_at = [int(v) for v in np.unravel_index(i, x.shape)] if x.shape else []
    return (f"input {d.input} element {in_at} sits on a kink of output {d.output}: "
            f"the one-sided slopes there are {slopes[0]:.6g} (left) and {slopes[1]:.6g} (right), so the "
            f"derivative is not defined and each framework picks its own subgradient "
            f"({d.reference}: {d.reference_value!r}, {d.other}: {d.other_value!r}). Check the "
            f"derivatives away from the kink, or decide which subgradient the ports must share.")


def _second_order(side: BackendPort, d: Difference) -> str:
    """A kink of the first derivative: ``d/dx_j2[i] (d f_k[r] / d x_j1[g])`` probed through
    the reference's reverse mode (full Jacobians of real values only)."""
    labels = (f"output {d.output} element", f"gradient of input {d.input} element", f"input {d.input2} element ")
    if any(label not in d.position for label in labels):
        return ""
    r, g, i = (d.position[label] for label in labels)
    p1, p2 = side.checked[d.input], side.checked[d.input2]
    x1, x2 = np.asarray(side.np_inputs[p1]), np.asarray(side.np_inputs[p2])
    out = side.output_numpy(side.outputs[d.output])
    if np.iscomplexobj(x1) or np.iscomplexobj(x2) or np.iscomplexobj(out):
        return ""

    def s(t):
        return side.gradient_at(_moved(side.np_inputs, p2, i, t), d.output, r, d.input)[g]

    with side.context():
        slopes = one_sided_slopes(s, _step(x2, x2.reshape(-1)[i]))
    if slopes is None:
        return ""

    def at(a, flat):
        return [int(v) for v in np.unravel_index(flat, a.shape)] if a.shape else []

    of = f"output {d.output} element {at(out, r)}" if out.shape else f"output {d.output}"
    return (f"input {d.input2} element {at(x2, i)} sits on a kink of the first derivative of {of} with "
            f"respect to input {d.input} element {at(x1, g)}: its one-sided slopes there are "
            f"{slopes[0]:.6g} (left) and {slopes[1]:.6g} (right), so the second derivative is not defined "
            f"and each framework picks its own value ({d.reference}: {d.reference_value!r}, {d.other}: "
            f"{d.other_value!r}). Check the second derivatives away from the kink, or decide which value "
            f"the ports must share.")


def kink_hint(side: BackendPort, d: Difference) -> str:
    """The kink at the entry ``d`` names, in words (``""`` when it is not on one).

    ``side`` is the backend probed (the reference of ``d``). First derivatives (reverse and
    forward) are probed through the values of output ``d.output``; second derivatives
    through the first derivative. Only full Jacobians of real inputs locate an entry.
    """
    if d.input is None:
        return ""
    if d.quantity in ("reverse", "forward"):
        return _first_order(side, d)
    if d.quantity == "second":
        return _second_order(side, d)
    return ""
