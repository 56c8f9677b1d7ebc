"""agcheck's account of a failing ``check_grads`` level from the check's own evaluations.

JAX's check compares derivatives along one random tangent (and one random cotangent). When
it fails, the arrays it compared already say a good deal: which output differs, on how many
of its elements, where most, and whether the derivative is a simple transformation of the
finite differences (zero, a constant factor, a flipped sign, a conjugate, a few elements).
Where the level's ``"fwd"`` check passed before its ``"rev"`` check failed, the JVP along
the same tangent also tells a wrong reverse rule from a forward rule that is slightly off.

None of this calls ``f`` again, so a failing check costs what JAX's costs. The full
Jacobians of the level (``account="full"``) cost about two evaluations of the level's
function per input element.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import jax
import numpy as np

from agcheck.report.diagnosis.facts import BlockFacts, coefficient_text
from agcheck.report.diagnosis.structure import structure
from agcheck.report.values import fmt, index_text, unravel

__all__ = ["Evidence", "DirectionAccount", "direction_account", "inner_product", "same_leaves"]


class Evidence:
    """What one check of a level computed, as it computed it: ``stage`` names the comparison
    under way (``"dtypes"``, ``"primal"``, ``"tangent"``, ``"projection"``) and ``pair`` its
    two sides (autodiff's, then the expected one). On ``"projection"``, ``tangent`` and
    ``cotangent`` are the check's random directions and ``forward`` the level's passing
    ``"fwd"`` check as ``(its tangent, the JVP along it)`` (``None`` where there was none)."""

    def __init__(self, check: str):
        self.check = check  # "fwd", "rev" or "lin"
        self.stage = None
        self.pair = None
        self.tangent = self.cotangent = None
        self.forward = None

    def comparing(self, stage: str, derived, expected) -> None:
        self.stage, self.pair = stage, (derived, expected)


def same_leaves(xs, ys) -> bool:
    """Whether the pytrees ``xs`` and ``ys`` have the same structure and equal leaves."""
    flat_x, tree_x = jax.tree_util.tree_flatten(xs)
    flat_y, tree_y = jax.tree_util.tree_flatten(ys)
    return tree_x == tree_y and all(np.array_equal(x, y) for x, y in zip(flat_x, flat_y))


@dataclass
class DirectionAccount:
    """A failing level explained from the check's own evaluations (see the module docstring).

    Attributes
    ----------
    level : str
        JAX's name of the level (``"JVP"``, ``"VJP of JVP"``, ...).
    stage : str
        ``"dtypes"``, ``"primal"``, ``"tangent"`` (the JVP against finite differences) or
        ``"projection"`` (``<t, J^H c>`` against ``<J t, c>``).
    output : int or None
        The first differing output leaf (flattened pytree order).
    compared, differing : int
        Elements of that leaf compared, and outside the tolerance.
    worst_index : tuple or None
        The largest difference's index in the leaf; ``derived`` and ``expected`` its values
        (autodiff's and finite differences' or ``f(*args)``'s).
    kind : str or None
        The pattern found: ``"zero_analytical"``, ``"zero_numerical"``, ``"factor"``, ``"sign"``,
        ``"conjugate"``, ``"localized"``, ``"few_entries"``, ``"non_finite"``,
        ``"reverse_rule"``, ``"small_forward_error"``; ``None`` when none fits.
    factor : float or complex or None
        ``derived / expected`` where a constant factor fits.
    forward_projection : float or None
        On ``"projection"``: ``<J t, c>`` with ``J t`` from the level's passing JVP check.
    text : str
        The account as it appears in the ``AssertionError``.
    """

    level: str
    stage: str
    output: int | None = None
    compared: int = 0
    differing: int = 0
    worst_index: tuple | None = None
    derived: object = None
    expected: object = None
    kind: str | None = None
    factor: float | complex | None = None
    forward_projection: float | None = None
    text: str = ""
    lines: list = field(default_factory=list, repr=False)


def _dtype_name(x) -> str:
    dtype = np.asarray(x).dtype
    return "float0" if dtype == jax.dtypes.float0 else str(dtype)


def _as_numbers(x) -> np.ndarray:
    a = np.asarray(x)
    if a.dtype.kind == "c":
        return a.astype(np.complex128)
    return a.astype(np.float64)


@dataclass
class _LeafPair:
    """One output leaf's two sides as a one-row block, in the form the report's whole-block
    hypotheses (:func:`agcheck.report.diagnosis.structure.structure`) read."""

    output: int
    numerical: np.ndarray  # (1, size): finite differences, or f(*args)
    analytical: np.ndarray  # (1, size): autodiff's side
    output_shape: tuple
    input_dtype: str
    atol: float
    rtol: float
    eps: float = 0.0
    input: int = 0
    input_shape: tuple = ()
    mode: str = "forward"
    output_float32_valued: bool = False


def _differing_leaf(derived, expected, tolerance):
    """The first leaf pair outside the check's tolerance (numpy's ``assert_allclose``, NaN
    equal to NaN), as ``(pair, differing mask)``, or ``None``."""
    pairs = zip(jax.tree_util.tree_leaves(derived), jax.tree_util.tree_leaves(expected))
    for i, (a, b) in enumerate(pairs):
        a, b = np.asarray(a), np.asarray(b)
        if a.dtype.kind not in "fc" and b.dtype.kind not in "fc" or a.shape != b.shape:
            continue
        abs_tol, rel_tol = tolerance(a, b)
        numbers_a, numbers_b = _as_numbers(a).reshape(1, -1), _as_numbers(b).reshape(1, -1)
        both_nan = np.isnan(numbers_a) & np.isnan(numbers_b)
        if both_nan.any():
            numbers_a, numbers_b = np.where(both_nan, 0, numbers_a), np.where(both_nan, 0, numbers_b)
        with np.errstate(invalid="ignore", over="ignore"):
            differs = ~(np.abs(numbers_a - numbers_b) <= abs_tol + rel_tol * np.abs(numbers_b))
        if differs.any():
            return _LeafPair(i, numbers_b, numbers_a, a.shape, str(a.dtype), abs_tol, rel_tol), differs
    return None


def _pattern(block, eps, what, expected_name):
    """``(kind, factor, sentence)`` for a differing leaf (``what`` is autodiff's side)."""
    n, a = block.numerical, block.analytical
    if not (np.isfinite(n).all() and np.isfinite(a).all()):
        bad = "the finite differences" if not np.isfinite(n).all() else what
        return "non_finite", None, (f"non-finite values in {bad}: a singularity or a domain edge within "
                                    f"eps={fmt(eps)} of the inputs, or an overflow in the derivative rule")
    found = structure(BlockFacts.of(block, 0))
    if not found:
        return None, None, None
    d = found[0]
    if d.kind == "zero_analytical":
        return d.kind, None, (f"{what} is zero where {expected_name} are not: the derivative is missing (a custom "
                              "rule returning zeros, a stop_gradient, a path through integers or a "
                              "non-differentiable operation)")
    if d.kind == "zero_numerical":
        return d.kind, None, (f"{expected_name} are zero where {what} is not: f does not change along the "
                              "tangent (a derivative for an input f does not use, or f computing in lower "
                              "precision than its inputs)")
    if d.kind in ("factor", "sign"):
        c = d.evidence["factor"]
        if d.kind == "sign":
            return d.kind, c, f"{what} = -1 x {expected_name} on every element: the derivative's sign is flipped"
        return d.kind, c, (f"{what} = {coefficient_text(c)} x {expected_name} on every element: a constant factor "
                           "in the derivative rule")
    if d.kind == "conjugate":
        return d.kind, None, (f"{what} = conj({expected_name}): a complex conjugation is missing or added in the "
                              "derivative rule")
    if d.kind in ("localized", "few_entries"):
        cols = d.evidence.get("cols") or sorted({int(c) for _, c in d.evidence.get("entries", ())})
        which = ", ".join(index_text(unravel(c, block.output_shape)) for c in cols)
        return d.kind, None, (f"only element(s) {which} differ, the others match: the rule is wrong there (a "
                              "branch, an edge, a special case)")
    return None, None, None


def _leaf_account(account, evidence, tolerance, eps, what, expected_name, patterns=True):
    derived, expected = evidence.pair
    found = _differing_leaf(derived, expected, tolerance)
    if found is None:
        account.lines.append(f"{what} and {expected_name} agree within the tolerance when recomputed here; the "
                             "difference JAX's comparison saw is at its edge")
        return
    leaf, differs = found
    account.output = leaf.output
    account.compared, account.differing = int(differs.size), int(np.count_nonzero(differs))
    with np.errstate(invalid="ignore", over="ignore"):
        gap = np.abs(leaf.analytical - leaf.numerical)
    worst = int(np.argmax(np.where(np.isnan(gap), np.inf, gap)))
    account.worst_index = unravel(worst, leaf.output_shape)
    account.derived, account.expected = leaf.analytical.flat[worst].item(), leaf.numerical.flat[worst].item()
    leaf.eps = eps
    account.lines.append(f"{what[0].upper()}{what[1:]} and {expected_name} differ on {account.differing} of "
                         f"{account.compared} element(s) of output {account.output} (shape "
                         f"{index_text(leaf.output_shape)}); the largest difference at "
                         f"{index_text(account.worst_index)}: {what} {fmt(account.derived)}, {expected_name} "
                         f"{fmt(account.expected)}")
    if not patterns:
        return
    account.kind, account.factor, sentence = _pattern(leaf, eps, what, expected_name)
    if sentence:
        account.lines.append(sentence[0].upper() + sentence[1:] + ".")


def inner_product(xs, ys):
    """``Re <xs, ys>`` summed over the leaves of two pytrees, in their dtype, as JAX's check
    computes its projections."""
    def one(x, y):
        return np.real(np.dot(np.conj(x).reshape(-1), y.reshape(-1)))
    return jax.tree_util.tree_reduce(np.add, jax.tree_util.tree_map(one, xs, ys))


def _projection_account(account, evidence, tolerance):
    derived, expected = (float(np.asarray(v)) for v in evidence.pair)
    account.derived, account.expected, account.compared, account.differing = derived, expected, 1, 1
    account.lines.append(f"<t, J^H c> from the VJP is {fmt(derived)}; <J t, c> from finite differences is "
                         f"{fmt(expected)} (t, c: the check's random tangent and cotangent)")
    forward = evidence.forward
    # both checks of a level draw their first tangent alike; the JVP is used where it did
    forward = forward[1] if forward is not None and same_leaves(forward[0], evidence.tangent) else None
    try:
        jvp_projection = None if forward is None else float(inner_product(forward, evidence.cotangent))
    except (TypeError, ValueError):  # a JVP with float0 tangents (integer outputs) projects nothing
        forward = jvp_projection = None
    if forward is not None:
        atol, rtol = tolerance(*(np.asarray(v) for v in evidence.pair))  # scalars: unscaled

        def agrees_with(value):
            return abs(jvp_projection - value) <= atol + rtol * abs(value)

        account.forward_projection = jvp_projection
        if agrees_with(expected):
            account.kind = "reverse_rule"
            account.lines.append(
                f"The JVP along the same tangent gives <J t, c> = {fmt(jvp_projection)}, agreeing with finite "
                "differences: the forward derivative is right and the reverse one is wrong (a custom_vjp's "
                "backward, a transpose rule).")
        elif agrees_with(derived):
            account.kind = "small_forward_error"
            account.lines.append(
                f"The JVP along the same tangent gives <J t, c> = {fmt(jvp_projection)}, agreeing with the VJP, "
                "not with finite differences: the derivative itself is off, by less than the JVP check's "
                "tolerance (which grows with the number of elements compared) but more than this projection's.")
        else:
            account.lines.append(f"The JVP along the same tangent gives <J t, c> = {fmt(jvp_projection)}: it "
                                 "agrees with neither.")
    if account.kind in (None, "reverse_rule") and expected != 0:
        ratio = derived / expected
        if abs(derived) <= 1e-6 * abs(expected):
            kind, sentence = "zero_analytical", "The VJP's projection is zero: the reverse derivative is missing."
        elif abs(ratio + 1) <= 1e-3:
            kind, sentence = "sign", "The projections differ in sign only: a flipped sign in the derivative."
        else:
            kind, sentence = None, f"The VJP's projection is {coefficient_text(ratio)} x the finite differences'."
        account.kind, account.factor = account.kind or kind, ratio
        account.lines.append(sentence)
    if forward is None:
        account.lines.append('Add "fwd" to modes to tell a wrong reverse rule from a wrong forward one.')


def _order_line(level: str) -> str | None:
    if " of " not in level:
        return None
    outer, inner = level.split(" of ", 1)
    return (f"This level checks the {outer} of the {inner} of f, a derivative of order {level.count(' of ') + 1}: "
            f"the {inner} passed its own check, and the derivative of the {inner} is wrong (a rule built from "
            "a stop_gradient, a custom rule whose own derivative is not right, a non-differentiable step).")


def direction_account(evidence: Evidence, level: str, tolerance, eps, n_inputs: int) -> DirectionAccount:
    """Explain a failing check from ``evidence`` (see the module docstring).

    ``tolerance(a, b)`` gives the check's ``(atol, rtol)`` for comparing arrays ``a`` and
    ``b`` (scaled by their size, as JAX's check scales them); ``eps`` is the
    finite-difference step and ``n_inputs`` the level's input elements."""
    account = DirectionAccount(level=level, stage=evidence.stage or "unknown")
    what = "the JVP" if evidence.check in ("fwd", "lin") else "the VJP"
    if evidence.stage == "dtypes":
        derived, expected = evidence.pair
        dtypes = [(_dtype_name(a), _dtype_name(b)) for a, b in
                  zip(jax.tree_util.tree_leaves(derived), jax.tree_util.tree_leaves(expected))]
        differ = [f"output {i}: {a} against {b}" for i, (a, b) in enumerate(dtypes) if a != b]
        account.lines.append("dtypes differ: " + ("; ".join(differ) or "in the structure of the outputs") + ".")
    elif evidence.stage == "primal":
        _leaf_account(account, evidence, tolerance, eps, f"the primal output of {what}", "f(*args)", patterns=False)
        account.kind = "primal"
        account.lines.append("A primal that differs means f is not deterministic, or a custom rule's forward "
                             "pass computes another value than f.")
    elif evidence.stage == "tangent":
        _leaf_account(account, evidence, tolerance, eps, what, "finite differences")
    elif evidence.stage == "projection":
        _projection_account(account, evidence, tolerance)
    else:
        account.lines.append("The check failed before comparing anything: an AssertionError raised while f or "
                             "its derivatives were evaluated.")
    order = _order_line(level)
    if order:
        account.lines.append(order)
    account.lines.append(f"(agcheck's account from the check's own evaluations, no further calls of f. The full "
                         f"Jacobians of this level, compared element by element, take about {2 * n_inputs} more "
                         "evaluations of its function and one derivative call per element: "
                         'agcheck.check_grads(..., account="full"), or patch_jax(account="full") / '
                         "pytest --agcheck-jax-account=full.)")
    account.text = "agcheck (along the check's random direction):\n" + "\n".join(
        "  " + line for line in account.lines)
    return account
