"""Is a disagreement on a kink? One-sided slopes at the entry where two backends differ:
left and right slopes that differ by an amount that does not shrink with the step mean each
framework picks its own subgradient, and finite differences cannot decide between them."""
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
    """``(left, right)`` slopes of ``s`` at 0 when 0 is a kink of it, else (or if the probe fails) ``None``.

    Slopes over ``[-2h, -h]``, ``[h, 2h]`` and ``[-3h, -2h]``, ``[2h, 3h]``, never at 0 itself.
    Near a smooth point the right-left gap grows with the distance from 0 (3h s'' then
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


def _at(a: np.ndarray, flat: int) -> list:
    return [int(v) for v in np.unravel_index(flat, a.shape)] if a.shape else []


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
    return (f"input {d.input} element {_at(x, i)} sits on a kink of output {d.output}: "
            f"the one-sided slopes there are {slopes[0]:.6g} (left) and {slopes[1]:.6g} (right), so the "
            f"derivative is not defined and each framework picks its own subgradient "
            f"({d.reference}: {d.reference_value!r}, {d.other}: {d.other_value!r}). Check the "
            f"derivatives away from the kink, or decide which subgradient the ports must share.")


def _second_order(side: BackendPort, d: Difference) -> str:
    """A kink of the first derivative ``d f_k[r] / d x_j1[g]`` along ``x_j2[i]`` (reference's reverse mode)."""
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
    of = f"output {d.output} element {_at(out, r)}" if out.shape else f"output {d.output}"
    return (f"input {d.input2} element {_at(x2, i)} sits on a kink of the first derivative of {of} with "
            f"respect to input {d.input} element {_at(x1, g)}: its one-sided slopes there are "
            f"{slopes[0]:.6g} (left) and {slopes[1]:.6g} (right), so the second derivative is not defined "
            f"and each framework picks its own value ({d.reference}: {d.reference_value!r}, {d.other}: "
            f"{d.other_value!r}). Check the second derivatives away from the kink, or decide which value "
            f"the ports must share.")


def kink_hint(side: BackendPort, d: Difference) -> str:
    """The kink at the entry ``d`` names, in words (``""`` when not on one), probed on ``side``
    (``d``'s reference): first derivatives through the values, second ones through the first.
    Only full Jacobians of real inputs locate an entry."""
    if d.input is None:
        return ""
    if d.quantity in ("reverse", "forward"):
        return _first_order(side, d)
    if d.quantity == "second":
        return _second_order(side, d)
    return ""
