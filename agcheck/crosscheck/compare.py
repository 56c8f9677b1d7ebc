"""What two backends computed, compared block by block against the reference backend, with
what a difference can be: a complex conjugate, the other complex convention, a kink."""
from __future__ import annotations

import numpy as np

from agcheck.crosscheck.kinks import kink_hint
from agcheck.crosscheck.labelled import LabelledArray
from agcheck.crosscheck.result import DESCRIPTION, CrosscheckResult, Difference

__all__ = ["compare", "convention_mixup", "fill_table"]


def _scalar(v):
    return v.item() if isinstance(v, np.generic) else v


def _close(x, y, rtol, atol) -> bool:
    with np.errstate(invalid="ignore", over="ignore"):
        return bool(np.all((np.abs(x - y) <= atol + rtol * np.abs(x)) | (x == y)))


def _compare_objects(d: Difference, x: np.ndarray, y: np.ndarray) -> Difference:
    """Values that are not arrays of numbers: equal or not."""
    bad = ~np.array([u == v for u, v in zip(x.reshape(-1), y.reshape(-1))])
    d.n_bad = int(bad.sum())
    d.ok = d.n_bad == 0
    return d


def compare(quantity, ref: str, other: str, key: tuple, a: LabelledArray, b: LabelledArray,
            rtol, atol, exact=False) -> Difference:
    """One row of the table: ``b`` (from ``other``) against ``a`` (from ``ref``).

    An entry is outside tolerance when ``|b - a| > atol + rtol * |a|`` (``exact``: when they
    differ), when one alone is NaN, or at different infinities. NaN against NaN agrees (the
    frameworks fail alike) and is counted in ``both_nan``.
    """
    d = Difference(quantity, ref, other, key[0], key[1] if len(key) > 1 else None, key[2] if len(key) > 2 else None)
    x, y = a.data, b.data
    if x.shape != y.shape:
        d.ok, d.where = False, f"shapes {x.shape} ({ref}) and {y.shape} ({other})"
        d.max_abs = float("inf")
        d.note = "different shapes"
        return d
    d.n_total = int(x.size)
    if x.size == 0:
        return d
    if x.dtype == object or y.dtype == object:
        return _compare_objects(d, x, y)
    xf, yf = x.reshape(-1), y.reshape(-1)
    inexact = np.issubdtype(np.result_type(xf, yf), np.inexact)
    both_nan = np.isnan(xf) & np.isnan(yf) if inexact else np.zeros(xf.shape, bool)
    with np.errstate(invalid="ignore", over="ignore"):
        equal = (xf == yf) | both_nan
        diff = np.where(equal, 0.0, np.abs(xf.astype(np.result_type(xf, yf, np.float64)) - yf))
        tol = np.zeros(xf.shape) if exact else atol + rtol * np.abs(xf)
        one_nan = np.isnan(diff)
        bad = ~equal & (one_nan | np.isinf(diff) | ~(diff <= tol))
        excess = np.where(one_nan | np.isinf(diff), np.inf, diff - tol)
    by_size = np.where(one_nan, np.inf, diff)
    largest = int(np.argmax(by_size))
    worst = int(np.argmax(np.where(bad, excess, -np.inf))) if bad.any() else largest
    d.max_abs = float("nan") if one_nan.any() else float(diff[largest])
    d.difference, d.tolerance = float(diff[worst]), float(tol[worst])
    d.n_bad, d.both_nan = int(bad.sum()), int(both_nan.sum())
    d.ok = d.n_bad == 0
    d.where = a.describe(worst)
    d.position = a.indices(worst)
    if worst != largest and by_size[largest] > by_size[worst]:
        d.largest_where = a.describe(largest)
    d.reference_value, d.other_value = _scalar(xf[worst]), _scalar(yf[worst])
    if not d.ok:
        if (np.iscomplexobj(xf) or np.iscomplexobj(yf)) and _close(xf, np.conj(yf), rtol, atol):
            d.conjugate = True
            d.note = f"{other}'s result is the complex conjugate of {ref}'s"
        elif quantity == "reverse" and convention_mixup(a, x, y, rtol, atol):
            d.conjugate = True
            d.note = f"{other}'s result is {ref}'s in the other complex convention"
    return d


def convention_mixup(block: LabelledArray, x, y, rtol, atol) -> bool:
    """Is ``y`` what ``x`` becomes in the other reverse-mode convention, ``conj(vjp(conj(v)))``?
    The VJP being real-linear, that is the conjugate for a real cotangent, minus it for an imaginary one."""
    if not block.axes or block.axes[0][0] != "cotangent" or x.shape[0] != 2:
        return False
    return _close(x[0], np.conj(y[0]), rtol, atol) and _close(x[1], -np.conj(y[1]), rtol, atol)


def _compare_values(result: CrosscheckResult, computed: dict, sides: list) -> None:
    ref = sides[0].name
    value_ref = computed["value"][ref]
    for side in sides[1:]:
        other = computed["value"][side.name]
        if len(other) != len(value_ref):
            result.differences.append(Difference(
                "value", ref, side.name, 0, ok=False, max_abs=float("inf"),
                where=f"{len(value_ref)} outputs ({ref}) and {len(other)} outputs ({side.name})",
                note="different shapes"))
            continue
        for key in value_ref:
            a, b = value_ref[key], other[key]
            exact = not (np.issubdtype(a.data.dtype, np.inexact) and np.issubdtype(b.data.dtype, np.inexact))
            result.differences.append(compare("value", ref, side.name, key, a, b, result.rtol, result.atol, exact))


def _compare_derivatives(result: CrosscheckResult, quantity: str, by_backend: dict, sides: list) -> None:
    have = [s.name for s in sides if s.name in by_backend]
    if len(have) < 2:
        if len(have) == 1:
            result.notes.append(f"{DESCRIPTION[quantity]}s computed on {have[0]} only: nothing to compare them with")
        return
    base = have[0]
    for n in have[1:]:
        for key, block in by_backend[base].items():
            other = by_backend[n].get(key)
            if other is None:
                result.differences.append(Difference(
                    quantity, base, n, key[0], key[1], key[2] if len(key) > 2 else None, ok=False,
                    max_abs=float("inf"), where=f"missing on {n}", note="different shapes"))
                continue
            d = compare(quantity, base, n, key, block, other, result.rtol, result.atol)
            if not d.ok:
                d.kink = kink_hint(next(s for s in sides if s.name == base), d)
                if d.kink and not d.note:
                    d.note = "kink"
            result.differences.append(d)


def fill_table(result: CrosscheckResult, computed: dict, sides: list) -> None:
    """Compare every quantity of every backend with the first one that computed it."""
    _compare_values(result, computed, sides)
    for q in ("reverse", "forward", "second"):
        _compare_derivatives(result, q, computed[q], sides)
