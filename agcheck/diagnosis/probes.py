"""Step-size evidence: the worst entries re-evaluated with other steps tell a kink, rounding
(``precision``) and finite-difference ``noise`` apart from a wrong derivative.

``resample(steps, rows)`` (the caller's) returns, per ``(eps, side)`` of ``steps``
(``side``: ``"central"``, the check's stencil, ``"right"`` or ``"left"``), rows ``rows`` of
the block's numerical Jacobian, ``(len(rows), output.numel)``; its optional ``values()`` is
the check's output at the input, ``evaluated_rows()`` the rows whose points it holds.
Without it only the error-floor estimate of noise is made.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from agcheck.report.values import fmt

from .facts import machine_eps, where

__all__ = ["PROBED_ENTRIES", "PROBED_BLOCKS", "PROBE_SHARE", "Probe", "probe", "probe_rows",
           "step_size_evidence", "nondeterministic_fn"]

#: entries re-evaluated with other steps on a failure (six evaluations of fn per input
#: element probed, x ± h/10, x ± h and x ± 10h, and one at x for all of them)
PROBED_ENTRIES = 4
#: failing blocks whose entries are re-evaluated (the others get the structural diagnoses)
PROBED_BLOCKS = 2
#: the probes of one input's blocks cost at most this share of the evaluations of fn the
#: check made for that input's numerical Jacobian (two per element), and one row at least
PROBE_SHARE = 0.25
#: a jump in fn's value is told from rounding when it exceeds this many machine epsilons
#: of the output there
DISCONTINUITY_ROUNDING = 1000


def probe_rows(input_numel: int, blocks: int = 1) -> int:
    """Rows each of ``blocks`` probed blocks of an input of ``input_numel`` elements may
    re-evaluate (1 to ``PROBED_ENTRIES``): a small failure costs little more than the check."""
    budget = int(PROBE_SHARE * 2 * input_numel) // 6
    return max(1, min(PROBED_ENTRIES, budget // max(1, blocks)))


@dataclass
class Probe:
    """One entry's numerical derivative with several steps and stencils."""

    row: int
    col: int
    numerical: complex
    analytical: complex
    small: complex  # central difference with eps / 10
    large: complex  # with eps * 10
    right: complex  # one-sided, step eps / 10
    left: complex
    right_eps: complex  # one-sided, step eps
    left_eps: complex
    eps: float = 0.0
    #: |fn's output| at the entry's output element (None where the caller cannot give it)
    output_value: float | None = None

    @property
    def mismatch(self) -> float:
        return abs(self.analytical - self.numerical)

    @property
    def spread(self) -> float:
        """How much the central estimate moves when the step changes tenfold."""
        return max(abs(self.small - self.numerical), abs(self.large - self.numerical))

    @property
    def scale(self) -> float:
        return max(abs(self.numerical), abs(self.small), abs(self.large), abs(self.analytical))

    @property
    def unstable(self) -> bool:
        return self.spread > 0.1 * self.scale and self.scale > 0

    @property
    def jump(self) -> bool:
        """Right and left derivatives differ, and the gap does not shrink with the step."""
        gap = abs(self.right - self.left)
        size = max(abs(self.right), abs(self.left), abs(self.analytical), abs(self.numerical))
        return size > 0 and gap > 0.1 * size and gap >= 0.5 * abs(self.right_eps - self.left_eps)

    @property
    def discontinuous(self) -> bool:
        """The estimates grow tenfold as the step shrinks tenfold (as ``jump / step``): fn's value
        jumps at the input, by far more than the output's rounding."""
        return self.jump_size is not None

    @property
    def jump_size(self) -> float | None:
        """How far fn's output jumps at the input, where :attr:`discontinuous`."""
        if self.output_value is None or not self.eps:
            return None
        rounding = DISCONTINUITY_ROUNDING * float(np.finfo(np.float64).eps) * self.output_value
        for fine, coarse, width in ((self.small, self.numerical, 2), (self.right, self.right_eps, 1),
                                    (self.left, self.left_eps, 1)):
            if coarse != 0 and abs(fine / coarse - 10) <= 3 and width * self.eps * abs(coarse) > rounding:
                return width * self.eps * abs(coarse)
        return None

    @property
    def steady_jump(self) -> bool:
        """A jump whose gap stays the same (within a factor 2) from step eps to eps/10, as
        at a kink; rounding's gaps grow as the step shrinks, or vanish."""
        gap, gap_eps = abs(self.right - self.left), abs(self.right_eps - self.left_eps)
        return self.jump and 0.5 * gap_eps <= gap <= 2 * gap_eps

    @property
    def kink(self) -> bool:
        return self.unstable or self.jump or self.discontinuous

    @property
    def noise(self) -> bool:
        return not self.kink and self.mismatch <= 2 * self.spread

    def line(self, block) -> str:
        return (f"{where(block, self.row, self.col)}: central eps/10 {fmt(self.small)}, eps {fmt(self.numerical)}, "
                f"eps*10 {fmt(self.large)}; one-sided right {fmt(self.right)}, left {fmt(self.left)}; "
                f"analytical {fmt(self.analytical)}")

    def noise_line(self, block) -> str:
        return (f"{where(block, self.row, self.col)}: numerical {fmt(self.numerical)}; with eps/10 it moves by "
                f"{abs(self.small - self.numerical):.1e}, with eps*10 by {abs(self.large - self.numerical):.1e}; "
                f"analytical differs by {self.mismatch:.1e}")

    def evidence(self) -> dict:
        return {"row": self.row, "col": self.col, "numerical": self.numerical, "analytical": self.analytical,
                "central_eps_div_10": self.small, "central_eps_times_10": self.large,
                "right": self.right, "left": self.left}


def probe(block, resample: Callable | None, max_rows: int = PROBED_ENTRIES) -> list | None:
    """Re-evaluate up to ``PROBED_ENTRIES`` worst mismatching entries, in at most ``max_rows``
    rows, with other steps (``None`` if impossible). Failing entries in rows whose points
    ``resample`` already holds are preferred: they cost no new evaluation of fn."""
    if resample is None or not block.eps:
        return None
    n, a = block.numerical, block.analytical
    tol = block.atol + block.rtol * np.abs(n)
    evaluated_rows = getattr(resample, "evaluated_rows", None)
    free = evaluated_rows() if evaluated_rows is not None else set()
    chosen = _failing_in(n, a, tol, free) or _worst_failing(block, tol, max_rows)
    if not chosen:
        return None
    rows = sorted({r for r, _ in chosen})
    at = {r: i for i, r in enumerate(rows)}
    eps = block.eps
    small, large, right, left, right_eps, left_eps = resample(
        [(eps / 10, "central"), (eps * 10, "central"), (eps / 10, "right"), (eps / 10, "left"),
         (eps, "right"), (eps, "left")], rows)
    values = _output_magnitudes(resample, n.shape[1])
    probes = []
    for r, c in chosen:
        i = at[r]
        probes.append(Probe(r, c, n[r, c].item(), a[r, c].item(), small[i, c].item(),
                            large[i, c].item(), right[i, c].item(), left[i, c].item(),
                            right_eps[i, c].item(), left_eps[i, c].item(), float(eps),
                            None if values is None else float(values[c])))
    return probes


def _worst_failing(block, tol, max_rows: int) -> list:
    """``(row, col)`` of the block's worst failing entries, in at most ``max_rows`` rows."""
    chosen, kept = [], set()
    for e in block.worst:
        if len(chosen) == PROBED_ENTRIES:
            break
        if abs(e.analytical - e.numerical) <= tol[e.row, e.col] or (e.row not in kept and len(kept) == max_rows):
            continue
        chosen.append((e.row, e.col))
        kept.add(e.row)
    return chosen


def _failing_in(n, a, tol, rows) -> list:
    """``(row, col)`` of the worst failing entries in ``rows``, worst first."""
    found = []
    for r in sorted(rows):
        if r >= n.shape[0]:
            continue
        with np.errstate(over="ignore", invalid="ignore"):
            d = np.abs(a[r] - n[r])
        bad = np.flatnonzero(d > tol[r])
        found += [(float(d[c]), r, int(c)) for c in bad[np.argsort(-d[bad])[:PROBED_ENTRIES]]]
    found.sort(key=lambda t: -t[0])
    return [(r, c) for _, r, c in found[:PROBED_ENTRIES]]


def _output_magnitudes(resample, columns: int):
    """``|fn's output at the input|`` per output element from ``resample.values()``, or None."""
    values = getattr(resample, "values", None)
    if values is None:
        return None
    try:
        out = np.abs(np.asarray(values())).reshape(-1)
    except Exception:  # noqa: BLE001 - a hint for the kink test, never a reason to lose the probes
        return None
    return out if out.size == columns else None


def step_size_evidence(facts, resample: Callable | None, max_rows: int = PROBED_ENTRIES) -> tuple:
    """``(diagnoses, settled)``: what the step sizes say about a block, and whether that settles
    it (a noise or mostly-kink verdict). Raises ``facts.floor`` to the smooth entries' spread."""
    found = []
    try:
        probes = probe(facts.block, resample, max_rows)
    except Exception as ex:  # fn may fail at other steps; the other hypotheses still apply
        probes = None
        found.append(facts.diagnosis(
            "note", f"could not re-evaluate numerical entries with other steps ({type(ex).__name__}: {ex})"))
    if not probes:
        if facts.r0 <= facts.floor:
            found.append(floor_noise(facts))
            return found, True
        return found, False
    smooth = [p.spread for p in probes if not p.kink]
    if smooth:
        facts.floor = max(facts.floor, max(smooth))
    kinks = [p for p in probes if p.kink]
    if kinks:
        found.append(kink(facts, probes, kinks))
        return found, 2 * len(kinks) >= len(probes)
    if all(p.noise for p in probes):
        found.append(probed_noise(facts, probes))
        return found, True
    return found, False


#: outputs of two identical calls that differ by more than this many machine epsilons
#: (relative to the output's largest entry) come from a function that is not deterministic
REPEAT_TOLERANCE = 1000


def nondeterministic_fn(facts, resample: Callable | None):
    """``nondeterministic_fn``: ``fn`` called again at the unmoved input gives another output
    (``None`` when it does not, or cannot be asked)."""
    unmoved = getattr(resample, "unmoved", None)
    if unmoved is None:
        return None
    try:
        checked, again = unmoved()
    except Exception:  # noqa: BLE001 - fn may fail again; the other hypotheses still apply
        return None
    if checked.shape != again.shape or checked.size == 0:
        return None
    with np.errstate(over="ignore", invalid="ignore"):
        diff = float(np.max(np.abs(again - checked)))
    scale = float(np.max(np.abs(checked)))
    eps = float(np.finfo(checked.dtype).eps) if np.issubdtype(checked.dtype, np.inexact) else 0.0
    if not diff > REPEAT_TOLERANCE * eps * max(scale, np.finfo(np.float64).tiny):
        return None
    block = facts.block
    return facts.diagnosis(
        "nondeterministic_fn",
        f"fn gives different outputs on identical calls: called again at the unmoved input, output "
        f"{block.output} moved by up to {fmt(diff)} ({diff / scale if scale else math.inf:.1e} of its largest "
        "entry). Finite differences of such a function measure its randomness, not its derivative: fn likely "
        "draws random numbers (dropout or another layer in training mode: call model.eval(); random "
        "augmentation) or depends on state that changes between calls (a counter, a cache)",
        {"max_abs_difference": diff, "scale": scale})


def kink(facts, probes: list, kinks: list):
    """``kink``, or ``precision`` where the probes are unstable rather than jumps and the input
    is below double precision or ``fn`` rounds a double input's output to float32 inside."""
    block = facts.block
    lines = [p.line(block) for p in kinks]
    ev = {"entries": [p.evidence() for p in kinks], "eps": facts.eps, "probed": len(probes)}
    if block.input_double is False and not all(p.jump for p in kinks):
        return facts.diagnosis(
            "precision",
            f"the numerical derivative at {len(kinks)} of {len(probes)} probed entries changes with the "
            f"step size, and input {block.input} is {block.input_dtype}: finite differences with "
            f"eps={fmt(facts.eps)} are dominated by rounding in this precision (or the input sits on a kink). "
            "Check in double precision, or use eps='auto', stencil='five-point' (docs/accuracy.md)",
            ev, lines)
    if block.output_float32_valued and not all(p.steady_jump for p in kinks):
        return facts.diagnosis(
            "precision",
            f"the numerical derivative at {len(kinks)} of {len(probes)} probed entries changes with the "
            f"step size, and output {block.output} holds only float32 values although input {block.input} is "
            f"{block.input_dtype}: fn computes in lower precision inside (a float32 cast, float32 weights or "
            f"buffers), and finite differences with eps={fmt(facts.eps)} are dominated by that rounding. "
            "Compute in double precision throughout, or check with a step suited to float32 "
            f"(eps={fmt(machine_eps('float32') ** (1 / 3))}) and loose tolerances (docs/accuracy.md)",
            {**ev, "output_float32_valued": True}, lines)
    if all(p.discontinuous for p in kinks):
        return discontinuity(facts, probes, kinks)
    return facts.diagnosis(
        "kink",
        f"the numerical derivative at {len(kinks)} of {len(probes)} probed entries changes with the "
        "step size (eps/10, eps, eps*10) or differs between its right and left one-sided values: "
        "the input likely sits on a kink/non-differentiable point (e.g. relu at 0, abs at 0, max "
        "with ties), where finite differences and the analytical derivative legitimately disagree. "
        "Move the test input away from it",
        ev, lines)


def discontinuity(facts, probes: list, jumps: list):
    """``discontinuity``: the estimates grow as ``1 / step``, so fn's value jumps at the input."""
    size = max(p.jump_size for p in jumps)
    return facts.diagnosis(
        "discontinuity",
        f"the numerical derivative at {len(jumps)} of {len(probes)} probed entries grows tenfold each time "
        f"the step shrinks tenfold (eps*10, eps, eps/10): fn's output itself jumps at the input (by about "
        f"{fmt(size)}), so it has no derivative there and finite differences measure jump / step, whatever "
        "the analytical value. Typical causes: a step, rounding or sorting, argmax or top-k with ties, "
        "eigenvectors of a repeated eigenvalue. Move the test input away from it",
        {"entries": [p.evidence() for p in jumps], "eps": facts.eps, "probed": len(probes), "jump": size},
        [p.line(facts.block) for p in jumps])


def probed_noise(facts, probes: list):
    """``noise``: other steps move the estimates by as much as the mismatch."""
    return facts.diagnosis(
        "noise", _noise_message(facts, "estimates with eps/10 and eps*10 differ by as much"),
        {"max_abs_diff": facts.r0, "scale": facts.scale, "spread": max(p.spread for p in probes)},
        [p.noise_line(facts.block) for p in probes[:3]])


def floor_noise(facts):
    """``noise``: the mismatch is below the error floor of finite differences."""
    why = f"about 100 * machine epsilon / eps for {facts.block.input_dtype or facts.N.dtype}"
    return facts.diagnosis("noise", _noise_message(facts, why),
                           {"max_abs_diff": facts.r0, "scale": facts.scale, "floor": facts.floor})


def _noise_message(facts, why) -> str:
    block, r0, scale = facts.block, facts.r0, facts.scale
    rel = r0 / scale if scale else 0.0
    return (f"the mismatch (max {fmt(r0)}, {rel:.1e} of the Jacobian's largest entry) is within the error of "
            f"the finite differences ({why}): the gradient is likely correct and the tolerance "
            f"(atol={fmt(block.atol)}, rtol={fmt(block.rtol)}) too tight to be met by finite differences")
