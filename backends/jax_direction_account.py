"""agcheck's account of a failing ``check_grads`` level from the check's own evaluations.

JAX's check compares derivatives along one random tangent (and one random cotangent). When
it fails, the arrays it compared already say a good deal: which output differs, on how many
of its elements, where most, and whether the derivative is a simple transformation of the
finite differences (zero, a constant factor, a flipped sign, a conjugate, a few elements).
Where the level's ``"fwd"`` check passed before its ``"rev"`` check failed, the JVP along
the same tangent also tells a wrong reverse rule from a forward rule that is slightly off.

None of this calls ``f`` again (a failing check costs what JAX's costs) but for one question
the arrays cannot answer: where autodiff's side may be right and the finite differences
wrong (the JVP and the VJP agree with each other but not with them, or no
pattern fits), the central difference along the same tangent is taken again at
``10 * eps`` and ``100 * eps`` (four calls of the level's function). Finite differences
whose error shrinks as the step grows, to within the tolerance, are limited by the
rounding of ``f`` at this step (float32, a large value against its change): the step, not
the derivative (``"step_size"``); an error that stays as the step grows is the
derivative's. The full Jacobians of the level (``account="full"``) cost about two
evaluations of the level's function per input element.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import jax
import numpy as np

from agcheck.diagnosis.facts import BlockFacts, coefficient_text
from agcheck.diagnosis.structure import structure
from agcheck.report.values import fmt, index_text, unravel

__all__ = ["Evidence", "DirectionAccount", "STEP_MULTIPLES", "direction_account", "inner_product", "same_leaves"]

#: the larger steps at which a suspect finite difference is taken again, as multiples of eps
STEP_MULTIPLES = (10.0, 100.0)
#: the tangent check's patterns that noisy finite differences could show too (``None``: no
#: pattern): the finite differences are taken again at larger steps
SUSPECT_DIFFERENCES = (None, "few_entries", "localized")
#: finite differences whose error shrinks at least this many times at a larger step (to
#: within the tolerance there) are limited by the step, not the derivative
STEP_SHRINK = 4.0


class Evidence:
    """What one check of a level computed, as it computed it: ``stage`` names the comparison
    under way (``"dtypes"``, ``"primal"``, ``"tangent"``, ``"projection"``) and ``pair`` its
    two sides (autodiff's, then the expected one). On ``"projection"``, ``tangent`` and
    ``cotangent`` are the check's random directions and ``forward`` the level's passing
    ``"fwd"`` check as ``(its tangent, the JVP along it)`` (``None`` where there was none).
    ``differences(step)``, where the check sets it, is the central difference along its
    tangent at another step (two calls of the level's function)."""

    def __init__(self, check: str):
        self.check = check  # "fwd", "rev" or "lin"
        self.stage = None
        self.pair = None
        self.tangent = self.cotangent = None
        self.forward = None
        self.differences = None

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
        ``"conjugate"``, ``"localized"``, ``"few_entries"``, ``"missing_slice"``,
        ``"constant_term"``, ``"non_finite"``, ``"reverse_rule"``, ``"small_forward_error"``,
        ``"step_size"`` (the finite differences, not the derivative); ``None`` when none fits.
    factor : float or complex or None
        ``derived / expected`` where a constant factor fits.
    forward_projection : float or None
        On ``"projection"``: ``<J t, c>`` with ``J t`` from the level's passing JVP check.
    step_errors : list or None
        Where the finite differences were taken again at larger steps: ``(step, error,
        within the tolerance)`` at ``eps`` and at each of :data:`STEP_MULTIPLES` times it,
        the error being the largest difference from autodiff's side.
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
    step_errors: list | None = None
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
    hypotheses (:func:`agcheck.diagnosis.structure.structure`) read."""

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
    if d.kind == "missing_slice" and "output" in d.evidence["slices"]:
        where = d.evidence["slices"]["output"][len("output"):]
        return d.kind, None, (f"{what} is zero on elements {where} of output {block.output}, where {expected_name} "
                              "are not, and they match elsewhere: the rule drops that slice of the output (a batch "
                              "element, a region or index range it skips)")
    if d.kind == "constant_term" and d.evidence["form"] == "every entry":
        c = d.evidence["coefficient"]
        return d.kind, None, (f"{what} = {expected_name} + {coefficient_text(c)} on every element: a term of the rule "
                              "that does not scale with the tangent (a constant added to the derivative)")
    if d.kind in ("localized", "few_entries"):
        cols = d.evidence.get("cols") or sorted({int(c) for _, c in d.evidence.get("entries", ())})
        which = ", ".join(index_text(unravel(c, block.output_shape)) for c in cols)
        return d.kind, None, (f"only element(s) {which} differ, the others match: the rule is wrong there (a "
                              "branch, an edge, a special case)")
    return None, None, None


def _leaf_account(account, evidence, tolerance, eps, what, expected_name, patterns=True):
    """Describe the first differing leaf in ``account.lines``; return the sentence of the
    pattern found (``account.kind``), if any."""
    derived, expected = evidence.pair
    found = _differing_leaf(derived, expected, tolerance)
    if found is None:
        account.lines.append(f"{what} and {expected_name} agree within the tolerance when recomputed here; the "
                             "difference JAX's comparison saw is at its edge")
        return None
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
        return None
    account.kind, account.factor, sentence = _pattern(leaf, eps, what, expected_name)
    return sentence[0].upper() + sentence[1:] + "." if sentence else None


def inner_product(xs, ys):
    """``Re <xs, ys>`` summed over the leaves of two pytrees, in their dtype, as JAX's check
    computes its projections."""
    def one(x, y):
        return np.real(np.dot(np.conj(x).reshape(-1), y.reshape(-1)))
    return jax.tree_util.tree_reduce(np.add, jax.tree_util.tree_map(one, xs, ys))


def _projection_account(account, evidence, tolerance, eps):
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
    atol, rtol = tolerance(*(np.asarray(v) for v in evidence.pair))  # scalars: unscaled

    def agrees_with(value, other):
        return abs(other - value) <= atol + rtol * abs(value)

    agreement = None  # the JVP's agreement with the VJP, where they agree
    if forward is not None:
        account.forward_projection = jvp_projection
        if agrees_with(expected, jvp_projection):
            account.kind = "reverse_rule"
            account.lines.append(
                f"The JVP along the same tangent gives <J t, c> = {fmt(jvp_projection)}, agreeing with finite "
                "differences: the forward derivative is right and the reverse one is wrong (a custom_vjp's "
                "backward, a transpose rule).")
        elif agrees_with(derived, jvp_projection):
            account.kind = "small_forward_error"
            relative = abs(jvp_projection - derived) / max(abs(derived), abs(jvp_projection), np.finfo(float).tiny)
            agreement = "the JVP and the VJP agree with each other"
            account.lines.append(
                f"The JVP along the same tangent gives <J t, c> = {fmt(jvp_projection)}, agreeing with the VJP "
                f"({f'to {relative:.1g} relative' if relative else 'exactly'}), not with finite differences.")
        else:
            account.lines.append(f"The JVP along the same tangent gives <J t, c> = {fmt(jvp_projection)}: it "
                                 "agrees with neither.")
    verdict = None
    if account.kind != "reverse_rule" and evidence.differences is not None:
        def error_of(difference):
            value = float(inner_product(difference, evidence.cotangent))
            return abs(derived - value), agrees_with(value, derived)

        at_eps = (abs(derived - expected), agrees_with(expected, derived))
        verdict = _step_account(account, evidence, eps, at_eps, error_of, "the VJP's projection",
                                agreement, np.asarray(evidence.pair[1]).dtype)
        if verdict == "step":
            return
    if account.kind == "small_forward_error":
        account.lines.append(("It is off" if verdict == "derivative" else "The derivative itself is off")
                             + ", by less than the JVP check's tolerance (which grows with the number of elements "
                             "compared) but more than this projection's.")
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


def _tangent_gap(derived, difference, tolerance):
    """``(largest |derived - difference| over the leaves, within the tolerance)``."""
    gaps = [0.0]
    for a, b in zip(jax.tree_util.tree_leaves(derived), jax.tree_util.tree_leaves(difference)):
        a, b = np.asarray(a), np.asarray(b)
        if a.dtype.kind in "fc" and b.dtype.kind in "fc" and a.shape == b.shape and a.size:
            with np.errstate(invalid="ignore", over="ignore"):
                gap = np.abs(_as_numbers(a) - _as_numbers(b))
            gaps.append(float(np.max(np.where(np.isnan(gap), np.inf, gap))))
    return max(gaps), _differing_leaf(derived, difference, tolerance) is None


def _step_account(account, evidence, eps, at_eps, error_of, what, agreement, dtype, measure="difference"):
    """Take the finite differences again at the larger steps of :data:`STEP_MULTIPLES` and
    say whether the step or the derivative is at fault (``account.step_errors``, and a line
    in ``account.lines``). ``at_eps`` is ``(error, within the tolerance)`` at the check's own
    step, ``error_of(difference)`` the same at another (``measure`` says what the error is).
    Returns ``"step"`` (``account.kind`` is then ``"step_size"``), ``"derivative"``,
    ``"both"`` or ``None`` (no probe made)."""
    errors = [(float(eps), *at_eps)]
    try:
        for multiple in STEP_MULTIPLES:
            errors.append((float(eps) * multiple, *error_of(evidence.differences(eps * multiple))))
    except Exception:  # noqa: BLE001 - f failing at a larger step leaves the account as it was
        return None
    account.step_errors = errors
    figures = measure + " " + ", ".join(f"{error:.2g} at {'eps=' if i == 0 else ''}{step:g}"
                                        for i, (step, error, _) in enumerate(errors))
    error = errors[0][1]
    shrunk = [e for e in errors[1:] if e[1] * STEP_SHRINK <= error] if np.isfinite(error) else []
    if not shrunk:
        account.lines.append(f"The finite differences do not move toward {what} as the step grows ({figures}): "
                             "they are not what is off, the derivative itself is.")
        return "derivative"
    agreeing = [e for e in shrunk if e[2]]
    if not agreeing:
        account.lines.append(f"The finite differences move toward {what} as the step grows ({figures}), but differ "
                             "from it beyond the tolerance at every step: rounding at this step explains part of the "
                             "difference, and the derivative is likely off as well.")
        return "both"
    step = agreeing[0][0]  # the smallest step that agrees
    account.kind = "step_size"
    agree = f"{agreement}, and " if agreement else ""
    wider = (' or in float64 (jax.config.update("jax_enable_x64", True))'
             if np.dtype(dtype).kind in "fc" and np.dtype(dtype).itemsize < (16 if np.dtype(dtype).kind == "c" else 8)
             else "")
    account.lines.append(
        f"The step, not the derivative: {agree}the finite differences move toward {what} as the step grows "
        f"({figures}), agreeing with it within the tolerance at {step:g}. At eps={float(eps):g} "
        f"the rounding of f's values in {dtype} outweighs their change along the tangent (large values, "
        f"cancellation inside f): check with a larger eps (eps={step:g}){wider}.")
    return "step"


def _order_line(level: str, step: bool = False) -> str | None:
    if " of " not in level:
        return None
    outer, inner = level.split(" of ", 1)
    if step:
        return (f"This level checks the {outer} of the {inner} of f, a derivative of order "
                f"{level.count(' of ') + 1}; the {inner} passed its own check.")
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
        sentence = _leaf_account(account, evidence, tolerance, eps, what, "finite differences")
        if account.kind in SUSPECT_DIFFERENCES and account.output is not None and evidence.differences is not None:
            derived, expected = evidence.pair
            dtype = np.asarray(jax.tree_util.tree_leaves(expected)[account.output]).dtype
            if _step_account(account, evidence, eps, _tangent_gap(derived, expected, tolerance),
                             lambda difference: _tangent_gap(derived, difference, tolerance), what, None,
                             dtype, "largest difference") == "step":
                sentence = None
        if sentence:
            account.lines.append(sentence)
    elif evidence.stage == "projection":
        _projection_account(account, evidence, tolerance, eps)
    else:
        account.lines.append("The check failed before comparing anything: an AssertionError raised while f or "
                             "its derivatives were evaluated.")
    order = _order_line(level, account.kind == "step_size")
    if order:
        account.lines.append(order)
    calls = (", no further calls of f" if account.step_errors is None else
             f" and {2 * (len(account.step_errors) - 1)} more calls of the level's function at larger steps")
    account.lines.append(f"(agcheck's account from the check's own evaluations{calls}. The full "
                         f"Jacobians of this level, compared element by element, take about {2 * n_inputs} more "
                         "evaluations of its function and one derivative call per element: "
                         'agcheck.check_grads(..., account="full"), or patch_jax(account="full") / '
                         "pytest --agcheck-jax-account=full.)")
    account.text = "agcheck (along the check's random direction):\n" + "\n".join(
        "  " + line for line in account.lines)
    return account
