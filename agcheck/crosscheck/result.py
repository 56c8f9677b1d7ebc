"""What :func:`agcheck.crosscheck` found: the table of comparisons and the messages."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from agcheck.errors import GradcheckError

__all__ = ["CrosscheckResult", "Difference", "BackendGradcheck", "QUANTITIES", "DESCRIPTION",
           "CONVENTION_NOTE", "failure_message", "raise_failure"]

QUANTITIES = ("value", "reverse", "forward", "second")
DESCRIPTION = {
    "value": "value",
    "reverse": "reverse-mode derivative",
    "forward": "forward-mode derivative",
    "second": "second derivative",
}
CONVENTION_NOTE = (
    "JAX's reverse-mode convention is the conjugate of torch's "
    "(torch_vjp(v) == conj(jax_vjp(conj(v)))): one port probably applies a VJP written "
    "in the other framework's convention."
)


@dataclass
class Difference:
    """One row of the comparison table: one quantity of one output (and input) on two backends.

    ``where`` names the entry furthest outside tolerance (by ``|diff| - tolerance``), else the
    largest difference; ``max_abs`` is the largest absolute difference over the block.
    """

    quantity: str
    reference: str
    other: str
    output: int
    input: int | None = None
    input2: int | None = None
    max_abs: float = 0.0
    where: str = ""
    reference_value: Any = None
    other_value: Any = None
    n_bad: int = 0
    n_total: int = 0
    ok: bool = True
    conjugate: bool = False
    note: str = ""
    #: index of the entry ``where`` names along each axis of the compared block
    position: dict = field(default_factory=dict, repr=False)
    #: when the disagreement sits on a non-differentiable point: the one-sided slopes there
    kink: str = ""
    #: ``|diff|`` at the entry ``where`` names, and the tolerance there
    difference: float = 0.0
    tolerance: float = 0.0
    #: where the largest absolute difference is, when that entry is within tolerance
    #: (``where`` then names another entry); ``""`` otherwise
    largest_where: str = ""
    #: entries where both backends give NaN (counted as agreeing)
    both_nan: int = 0

    @property
    def label(self) -> str:
        text = f"output {self.output}"
        if self.input is not None:
            text += f" / input {self.input}"
        if self.input2 is not None:
            text += f", input {self.input2}"
        return text

    def verdict(self) -> str:
        """The table's verdict column: ``ok`` or ``DIFFER ...``, with NaN pairs counted."""
        nan = f"both NaN at {self.both_nan}/{self.n_total} entries" if self.both_nan else ""
        if self.ok:
            return f"ok ({nan})" if nan else "ok"
        text = f"DIFFER ({self.n_bad}/{self.n_total} entries) at {self.where}"
        notes = [n for n in (self.note, nan) if n]
        return text + "".join(f" [{n}]" for n in notes)


@dataclass
class BackendGradcheck:
    """``crosscheck(..., gradcheck=True)``: what gradcheck (and gradgradcheck) said on one backend.

    Attributes
    ----------
    backend : str
    status : {"passed", "failed", "skipped"}
    checks : tuple of str
        The checks that ran: ``("gradcheck",)`` or ``("gradcheck", "gradgradcheck")``.
    failed_check : str or None
        ``"gradcheck"`` or ``"gradgradcheck"``: the one that failed.
    kind : str
        What failed within it: ``"reverse mode"``, ``"forward mode"``, ``"second order"``, ...
    headline : str
        The first line of its error message.
    nan : bool
        The failing analytical derivative has NaN entries.
    reason : str
        Why it was skipped.
    """

    backend: str
    status: str
    checks: tuple = ()
    failed_check: str | None = None
    kind: str = ""
    headline: str = ""
    nan: bool = False
    reason: str = ""

    def text(self) -> str:
        """``"passed"``, ``"passed (gradcheck and gradgradcheck)"``, ``"FAILED ..."`` or ``"skipped: ..."``."""
        if self.status == "passed":
            return "passed" if self.checks == ("gradcheck",) else "passed (gradcheck and gradgradcheck)"
        if self.status == "skipped":
            return f"skipped: {self.reason}"
        nan = " (its analytical derivative has NaN entries)" if self.nan else ""
        return f"FAILED {self.failed_check} ({self.kind}): {self.headline}{nan}"

    def derivatives(self, plural: bool = True) -> str:
        """The derivatives its failure puts in doubt, in words."""
        if self.failed_check == "gradgradcheck":
            word = "second derivative"
        else:
            word = {"forward mode": "forward-mode derivative", "reverse mode": "reverse-mode derivative"}.get(
                self.kind, "derivative")
        return word + "s" if plural else word


class CrosscheckResult:
    """What :func:`crosscheck` compared, and how close each pair came.

    Truthy when every comparison agreed (and every gradcheck passed), falsy otherwise;
    ``result == False`` and ``result == True`` compare that verdict. Attributes:

    backends : tuple of str
        The backends compared (the first is the reference).
    skipped : dict
        Backends left out, with the reason.
    notes : list of str
        Quantities that could not be compared, and why.
    values, reverse, forward, second : dict
        Per backend: the outputs (NumPy), and the derivative blocks (NumPy arrays keyed
        by ``(output, input)`` or ``(output, input, input)``).
    differences : list of Difference
        The table of comparisons.
    nearby : list of Difference
        When the values agree but derivatives do not: the values compared again at
        inputs moved slightly off the given ones (``[]`` when not compared).
    gradchecks : dict
        With ``gradcheck=True``: per backend ``"passed"``, ``"FAILED <check> (<what>): ..."``
        or ``"skipped: ..."`` (the text of :attr:`gradcheck_results`).
    gradcheck_results : dict
        With ``gradcheck=True``: per backend a :class:`BackendGradcheck`.
    rtol, atol : float
        The tolerances used.
    """

    def __init__(self, backends, skipped, rtol, atol, fast_mode, order, name="fn"):
        self.backends = tuple(backends)
        self.skipped = dict(skipped)
        self.rtol, self.atol = rtol, atol
        self.fast_mode, self.order = fast_mode, order
        self.function_name = name
        self.notes: list[str] = []
        self.values: dict = {}
        self.reverse: dict = {}
        self.forward: dict = {}
        self.second: dict = {}
        self.differences: list[Difference] = []
        self.nearby: list[Difference] = []
        self.nearby_step: float = 0.0
        self.gradcheck_results: dict = {}

    @property
    def gradchecks(self) -> dict:
        return {n: v.text() for n, v in self.gradcheck_results.items()}

    @property
    def ok(self) -> bool:
        return all(d.ok for d in self.differences) and not self.failed_gradchecks()

    def __bool__(self) -> bool:
        return self.ok

    def __eq__(self, other):
        if isinstance(other, bool):
            return self.ok is other
        return NotImplemented

    __hash__ = object.__hash__

    def disagreements(self) -> list:
        return [d for d in self.differences if not d.ok]

    def failed_gradchecks(self) -> list:
        return [n for n, v in self.gradcheck_results.items() if v.status == "failed"]

    @property
    def message(self) -> str:
        """The explanation of a failure (what :class:`~agcheck.GradcheckError` would say),
        ``""`` when every comparison agreed."""
        return "" if self.ok else failure_message(self)

    def summary(self) -> str:
        mode = "fast mode" if self.fast_mode else "full Jacobians"
        lines = [
            f"crosscheck of {self.function_name} on {', '.join(self.backends)} "
            f"(reference {self.backends[0]}; {mode}; order {self.order}; rtol={self.rtol:g}, atol={self.atol:g})"
        ]
        for name, reason in self.skipped.items():
            lines.append(f"  skipped {name}: {reason}")
        lines.append(f"  {'quantity':<8} {'where':<28} {'pair':<16} {'max |diff|':>11}  verdict")
        lines += [_row(d) for d in self.differences]
        if self.nearby:
            lines.append(f"  at nearby inputs (the checked ones moved by about {self.nearby_step:g} of their size):")
            lines += [_row(d) for d in self.nearby]
        for note in self.notes:
            lines.append(f"  note: {note}")
        for name, status in self.gradchecks.items():
            lines.append(f"  gradcheck on {name}: {status}")
        lines.append("  => " + ("all backends agree" if self.ok else "DISAGREEMENT"))
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()

    def __repr__(self) -> str:
        return (f"<CrosscheckResult {'ok' if self.ok else 'FAILED'}: {len(self.differences)} comparisons "
                f"over {', '.join(self.backends)}>")


def _row(d: Difference) -> str:
    pair = f"{d.reference} vs {d.other}"
    size = "both NaN" if d.n_total and d.both_nan == d.n_total else f"{d.max_abs:.3e}"
    return f"  {d.quantity:<8} {d.label:<28} {pair:<16} {size:>11}  {d.verdict()}"


def _subject(d: Difference) -> str:
    what = DESCRIPTION[d.quantity]
    if d.quantity == "value":
        return f"the value of output {d.output}"
    if d.quantity == "second":
        return f"the {what} of output {d.output} with respect to input {d.input} and input {d.input2}"
    return f"the {what} of output {d.output} with respect to input {d.input}"


def _where_line(result: CrosscheckResult, d: Difference) -> str:
    counts = f"({d.n_bad} of {d.n_total} entries outside rtol={result.rtol:g}, atol={result.atol:g})"
    gives = f"{d.reference} gives {d.reference_value!r}, {d.other} gives {d.other_value!r}"
    if math.isnan(d.difference):
        return f"NaN against a number at {d.where}: {gives} {counts}."
    if not d.largest_where:
        return f"Largest difference {d.max_abs:.6g} at {d.where}: {gives} {counts}."
    return (f"Furthest outside tolerance: difference {d.difference:.6g} (allowed {d.tolerance:.3g}) at "
            f"{d.where}: {gives} {counts}. The largest absolute difference, {d.max_abs:.6g} at "
            f"{d.largest_where}, is within tolerance there.")


def _is_nan(v) -> bool:
    try:
        return math.isnan(abs(v)) if isinstance(v, complex) else math.isnan(v)
    except TypeError:
        return False


def _nearby_lines(result: CrosscheckResult) -> list:
    """What the values at nearby inputs say about a derivative disagreement."""
    if not result.nearby_step or any(d.quantity == "value" for d in result.disagreements()):
        return []
    differ = [d for d in result.nearby if not d.ok]
    step = f"each checked input moved by about {result.nearby_step:g} of its size"
    if differ:
        d = differ[0]
        return [f"The values agree at the inputs given but not at nearby ones ({step}): output {d.output} "
                f"differs by up to {d.max_abs:.3g} between {d.reference} and {d.other} there. The ports are "
                f"different functions that coincide at these inputs (for example one normalises its input "
                f"— a unit quaternion, a unit vector — and the other assumes it is normalised), so their "
                f"derivatives differ: decide which function the ports must compute."]
    if any(d.kink or d.conjugate for d in result.disagreements()):
        return []  # said more precisely already
    return [f"The values also agree at nearby inputs ({step}): the ports compute the same function "
            f"there and differ in how they differentiate it."]


def _conclusion(result: CrosscheckResult) -> list:
    """What the gradchecks' verdicts conclude about a disagreement."""
    verdicts = result.gradcheck_results
    if not verdicts:
        return []
    lines = ["gradcheck on each backend: " + "; ".join(f"{n}: {v.text()}" for n, v in verdicts.items())]
    failed = [v for v in verdicts.values() if v.status == "failed"]
    passed = [n for n, v in verdicts.items() if v.status == "passed"]
    kinks = [d for d in result.disagreements() if d.kink]
    if kinks:
        text = ("=> finite differences cannot decide at a kink: the derivative is not defined there and "
                "the frameworks chose different values for it (different subgradients); gradcheck's central "
                "difference is the mean of the one-sided slopes, one choice among them, so a gradcheck "
                "failing there does not make a side wrong.")
        others = [d for d in result.disagreements() if not d.kink]
        if others:
            text += (f" {len(others)} disagreement(s) are not at a kink ("
                     + "; ".join(f"{d.quantity} {d.label}" for d in others[:4])
                     + "): check those at inputs away from the kink to see which side finite differences support.")
        return lines + [text]
    if failed and passed:
        for v in failed:
            text = (f"=> finite differences side with {', '.join(passed)}: {v.backend} failed "
                    f"{v.failed_check} ({v.kind}), so the {v.derivatives()} of {v.backend} are the wrong ones.")
            nan = _nan_entry(result, v.backend)
            if nan is not None or v.nan:
                at = f" (at {nan.where})" if nan is not None else ""
                text += (f" Its {v.derivatives(False)} is NaN{at} where finite differences give a number: a "
                         f"0/0 or inf*0 in its derivative formula (as at a removable singularity: a zero "
                         f"vector, a zero rotation).")
            lines.append(text)
        return lines
    if failed:
        return lines + ["=> gradcheck failed on every backend: finite differences side with none of them."]
    if all(v.status == "passed" for v in verdicts.values()):
        functions_differ = (any(d.quantity == "value" for d in result.disagreements())
                            or any(not d.ok for d in result.nearby))
        if functions_differ:
            lines.append("=> gradcheck passed on every backend: each port's derivatives agree with finite "
                         "differences of its own function, and the ports are different functions (their "
                         "values differ), so neither side's derivatives are wrong for its own function.")
        else:
            lines.append("=> gradcheck passed on every backend: the derivatives differ by less than "
                         "gradcheck's tolerances can see, so finite differences cannot say which side is right.")
    return lines


def _nan_entry(result: CrosscheckResult, backend: str):
    """The first disagreement where ``backend`` gives NaN and the other backend does not."""
    for d in result.disagreements():
        mine, theirs = ((d.reference_value, d.other_value) if d.reference == backend
                        else (d.other_value, d.reference_value) if d.other == backend else (None, None))
        if _is_nan(mine) and not _is_nan(theirs):
            return d
    return None


def disagreement_message(result: CrosscheckResult, first: Difference) -> str:
    """The message of the first disagreement: what differs, by how much, where, and why it may."""
    lines = [f"crosscheck: {first.reference} and {first.other} disagree on {_subject(first)} [{first.quantity}]."]
    if first.note == "different shapes":
        lines.append(f"The results have different {first.where}.")
    else:
        lines.append(_where_line(result, first))
    if first.kink:
        lines.append(first.kink)
    if first.conjugate and "convention" in first.note:
        lines.append(f"The {first.other} result is exactly the {first.reference} result in the other complex "
                     f"convention (the conjugate for real cotangents, minus the conjugate for imaginary "
                     f"ones), not an unrelated error: {CONVENTION_NOTE}")
    elif first.conjugate:
        lines.append(f"The {first.other} result is exactly the complex conjugate of the {first.reference} "
                     f"result (within tolerance): {CONVENTION_NOTE}")
    elif _is_complex_pair(first) and first.note != "different shapes":
        lines.append("The two results are not complex conjugates of each other either.")
    others = [d for d in result.disagreements() if d is not first]
    if others:
        lines.append(f"{len(others)} more disagreement(s): "
                     + "; ".join(f"{d.quantity} {d.label} ({d.reference} vs {d.other})" for d in others[:6])
                     + ("; ..." if len(others) > 6 else ""))
    lines += _nearby_lines(result)
    lines += _conclusion(result)
    lines.append("")
    lines.append(result.summary())
    return "\n".join(lines)


def _is_complex_pair(d: Difference) -> bool:
    return isinstance(d.reference_value, complex) or isinstance(d.other_value, complex)


def _shared_failure_message(result: CrosscheckResult) -> str:
    failed = result.failed_gradchecks()
    return ("crosscheck: the backends agree with each other, but gradcheck failed on "
            + ", ".join(failed) + " (the ports may share the same wrong derivative):\n"
            + "\n".join(f"  {n}: {result.gradchecks[n]}" for n in failed) + "\n\n" + result.summary())


def failure_message(result: CrosscheckResult) -> str:
    """The explanation of a failed crosscheck: its first disagreement, else the failed gradchecks."""
    bad = result.disagreements()
    return disagreement_message(result, bad[0]) if bad else _shared_failure_message(result)


def raise_failure(result: CrosscheckResult):
    """Raise the :class:`~agcheck.GradcheckError` of a failed crosscheck (see :func:`failure_message`)."""
    bad = result.disagreements()
    if bad:
        first = bad[0]
        raise GradcheckError(
            failure_message(result),
            check="crosscheck",
            details={"quantity": first.quantity, "backends": (first.reference, first.other),
                     "output": first.output, "input": first.input, "max_abs_diff": first.max_abs,
                     "where": first.where, "difference": first.difference, "conjugate": first.conjugate,
                     "kink": bool(first.kink), "result": result},
        )
    failed = result.failed_gradchecks()
    raise GradcheckError(failure_message(result), check="crosscheck_gradcheck",
                         details={"failed": failed, "result": result})
