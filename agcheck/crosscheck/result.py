"""What :func:`agcheck.crosscheck` found: the table of comparisons and the messages."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agcheck.report.errors import GradcheckError

__all__ = ["CrosscheckResult", "Difference", "QUANTITIES", "DESCRIPTION", "CONVENTION_NOTE",
           "raise_failure"]

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
    """One row of the comparison table: one quantity of one output (and input) on two backends."""

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
    #: index of the largest difference along each axis of the compared block
    position: dict = field(default_factory=dict, repr=False)
    #: when the disagreement sits on a non-differentiable point: the one-sided slopes there
    kink: str = ""

    @property
    def label(self) -> str:
        text = f"output {self.output}"
        if self.input is not None:
            text += f" / input {self.input}"
        if self.input2 is not None:
            text += f", input {self.input2}"
        return text


class CrosscheckResult:
    """What :func:`crosscheck` compared, and how close each pair came.

    Truthy when every comparison agreed. Attributes:

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
    gradchecks : dict
        With ``gradcheck=True``: per backend ``"passed"``, ``"FAILED: ..."`` or ``"skipped: ..."``.
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
        self.gradchecks: dict = {}

    @property
    def ok(self) -> bool:
        return all(d.ok for d in self.differences) and not self.failed_gradchecks()

    def __bool__(self) -> bool:
        return self.ok

    def disagreements(self) -> list:
        return [d for d in self.differences if not d.ok]

    def failed_gradchecks(self) -> list:
        return [n for n, s in self.gradchecks.items() if s.startswith("FAILED")]

    def summary(self) -> str:
        mode = "fast mode" if self.fast_mode else "full Jacobians"
        lines = [
            f"crosscheck of {self.function_name} on {', '.join(self.backends)} "
            f"(reference {self.backends[0]}; {mode}; order {self.order}; rtol={self.rtol:g}, atol={self.atol:g})"
        ]
        for name, reason in self.skipped.items():
            lines.append(f"  skipped {name}: {reason}")
        header = f"  {'quantity':<8} {'where':<28} {'pair':<16} {'max |diff|':>11}  verdict"
        lines.append(header)
        for d in self.differences:
            pair = f"{d.reference} vs {d.other}"
            verdict = "ok" if d.ok else f"DIFFER ({d.n_bad}/{d.n_total} entries) at {d.where}"
            if d.note and not d.ok:
                verdict += f" [{d.note}]"
            lines.append(f"  {d.quantity:<8} {d.label:<28} {pair:<16} {d.max_abs:>11.3e}  {verdict}")
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


def disagreement_message(result: CrosscheckResult, first: Difference, gradchecks: dict) -> str:
    """The message of the first disagreement: what differs, by how much, where, and why
    it may (a kink, a complex convention mix-up, the gradchecks' verdicts)."""
    what = DESCRIPTION[first.quantity]
    if first.quantity == "value":
        subject = f"the value of output {first.output}"
    elif first.quantity == "second":
        subject = (f"the {what} of output {first.output} with respect to input {first.input} "
                   f"and input {first.input2}")
    else:
        subject = f"the {what} of output {first.output} with respect to input {first.input}"
    lines = [f"crosscheck: {first.reference} and {first.other} disagree on {subject} [{first.quantity}]."]
    if first.note == "different shapes":
        lines.append(f"The results have different {first.where}.")
    else:
        lines.append(
            f"Largest difference {first.max_abs:.6g} at {first.where}: {first.reference} gives "
            f"{first.reference_value!r}, {first.other} gives {first.other_value!r} "
            f"({first.n_bad} of {first.n_total} entries outside rtol={result.rtol:g}, atol={result.atol:g})."
        )
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
    if gradchecks:
        verdicts = "; ".join(f"{n}: {s}" for n, s in gradchecks.items())
        lines.append(f"gradcheck on each backend: {verdicts}")
        failed = [n for n, s in gradchecks.items() if s.startswith("FAILED")]
        passed = [n for n, s in gradchecks.items() if s == "passed"]
        if failed and passed:
            lines.append(f"=> finite differences side with {', '.join(passed)}: the derivatives of "
                         f"{', '.join(failed)} are the wrong ones.")
    lines.append("")
    lines.append(result.summary())
    return "\n".join(lines)


def _is_complex_pair(d: Difference) -> bool:
    return isinstance(d.reference_value, complex) or isinstance(d.other_value, complex)


def raise_failure(result: CrosscheckResult):
    """Raise the :class:`~agcheck.GradcheckError` of a failed crosscheck: the first
    disagreement between two backends, else the backends whose gradcheck failed."""
    bad = result.disagreements()
    if bad:
        first = bad[0]
        raise GradcheckError(
            disagreement_message(result, first, result.gradchecks),
            check="crosscheck",
            details={"quantity": first.quantity, "backends": (first.reference, first.other),
                     "output": first.output, "input": first.input, "max_abs_diff": first.max_abs,
                     "where": first.where, "conjugate": first.conjugate, "result": result},
        )
    failed = result.failed_gradchecks()
    raise GradcheckError(
        "crosscheck: the backends agree with each other, but gradcheck failed on "
        + ", ".join(failed) + " (the ports may share the same wrong derivative):\n"
        + "\n".join(f"  {n}: {result.gradchecks[n]}" for n in failed) + "\n\n" + result.summary(),
        check="crosscheck_gradcheck",
        details={"failed": failed, "result": result},
    )
