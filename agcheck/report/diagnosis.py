"""Diagnoses: recognise and name the usual gradient bugs in a failure report.

A diagnosis is a hypothesis with its evidence, never a verdict: the verdict is the
check's. Each one is tested on the failing blocks only (nothing here runs while checks
pass) and fires only when the evidence is strong:

* ``factor`` / ``sign`` / ``transposed`` / ``adjoint`` / ``conjugate`` /
  ``ignores_grad_output`` / ``ignores_tangent`` — the analytical block equals a simple
  transformation of the numerical one (``2 * N``, ``-N``, ``N.T``, ``conj(N)``, ...) to
  within 1 % of the mismatch (and finite-difference noise), far closer than to ``N``
  itself;
* ``zero_analytical`` / ``zero_numerical`` — one side is zero, the other is not;
* ``few_entries`` / ``localized`` — only a handful of entries (listed), or only the
  entries of a few input or output elements, disagree;
* ``kink`` — the numerical derivative at the worst entries changes with the step size
  (re-evaluated with ``eps / 10`` and ``eps * 10``) or differs between the right and left
  one-sided differences even for a small step: the input sits on a non-differentiable
  point;
* ``precision`` — the same instability with an input in less than double precision:
  finite differences are dominated by rounding;
* ``noise`` — the mismatch is within what finite differences can resolve (estimates with
  other steps differ by as much): the tolerance is too tight, the gradient likely right;
* ``fast_only`` — fast mode's projection failed but the full blocks agree;
* for the other checks: ``nondeterministic`` (with the run-to-run difference next to
  ``nondet_tol`` and whether it is rounding-sized), ``not_multiplied_by_grad_output``,
  ``batched``, ``undefined_grad``, ``depends_on_input``, ``gradient_shape``.

The structural hypotheses are tried only once the mismatch is known not to be noise or a
kink, so a correct function checked with an absurdly tight tolerance gets ``noise`` and
nothing else.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from agcheck.core.stencil import Stencil

__all__ = ["Diagnosis", "diagnose", "diagnose_block", "numerical_rows"]

#: entries re-evaluated with other steps on a failure
PROBED_ENTRIES = 6
#: blocks larger than this skip the whole-block hypotheses (memory)
STRUCTURE_LIMIT = 20_000_000
#: "a few entries": at most this many (and at most a quarter of the block)
FEW = 10

RIGHT = Stencil("right", (0, 1), (-1.0, 1.0), 0.5)
LEFT = Stencil("left", (-1, 0), (-1.0, 1.0), 0.5)


@dataclass
class Diagnosis:
    """One named hypothesis about a failure.

    Attributes
    ----------
    kind : str
        ``"factor"``, ``"transposed"``, ``"kink"``, ... (see :mod:`agcheck.report.diagnosis`).
    message : str
        The hypothesis and its key evidence, in one sentence or two.
    evidence : dict
        The numbers behind it (JSON-serialisable).
    lines : list of str
        Supporting detail (e.g. the entries concerned), a few lines.
    block : int or None
        The index in ``report.blocks`` of the block it is about.
    """

    kind: str
    message: str
    evidence: dict = field(default_factory=dict)
    lines: list = field(default_factory=list)
    block: int | None = None

    def summary_lines(self, width: int = 110) -> list:
        import textwrap

        head = textwrap.wrap(f"- [{self.kind}] {self.message}", width, subsequent_indent="  ")
        if len(head) > 5:
            head = head[:5]
            head[-1] += " ..."
        return head + ["    " + ln for ln in self.lines[:5]]

    def to_dict(self) -> dict:
        from agcheck.report import jsonable

        return {"kind": self.kind, "message": self.message, "evidence": jsonable(self.evidence),
                "lines": list(self.lines), "block": self.block}

    @classmethod
    def from_dict(cls, d: dict) -> "Diagnosis":
        return cls(d["kind"], d["message"], dict(d["evidence"]), list(d["lines"]), d["block"])


def diagnose(report) -> list:
    """The diagnoses of a failure report (an empty list when no pattern is recognised)."""
    if report.blocks:
        found = []
        for i, block in enumerate(report.blocks):
            found += diagnose_block(block, i)
        return found
    handler = _CHECK_HANDLERS.get(report.check)
    return handler(report) if handler is not None else []


# -- numbers --------------------------------------------------------------------------------

def machine_eps(dtype_name, fallback=None) -> float:
    """The spacing at 1.0 of a dtype given by name (``"torch.float32"``, ``"complex64"``...)."""
    if dtype_name is not None:
        name = str(dtype_name).split(".")[-1]
        if name == "bfloat16":
            return 2.0 ** -7
        try:
            return float(np.finfo(np.dtype(name)).eps)
        except (TypeError, ValueError):
            pass
    if fallback is not None:
        try:
            return float(np.finfo(np.asarray(fallback).dtype).eps)
        except ValueError:
            pass
    return float(np.finfo(np.float64).eps)


def _f(v) -> str:
    from agcheck.report import fmt

    return fmt(v)


def _c(c) -> str:
    if isinstance(c, complex) and c.imag != 0:
        return f"({c.real:.3g}{c.imag:+.3g}j)"
    c = c.real if isinstance(c, complex) else c
    return f"{c:.2f}" if 0.01 <= abs(c) < 1000 else f"{c:.3g}"


def _where(block, r, c) -> str:
    from agcheck.report import _index_text, _unravel

    return f"input{_index_text(_unravel(r, block.input_shape))} / output{_index_text(_unravel(c, block.output_shape))}"


# -- re-evaluating numerical entries --------------------------------------------------------

def numerical_rows(be, fn, args, position: int, output_position: int, rows, eps: float, stencil) -> np.ndarray:
    """Rows ``rows`` of the numerical Jacobian of output ``output_position`` with respect
    to ``args[position]``, computed by the same code as the check's Jacobian with step
    ``eps`` and ``stencil``, as a NumPy array ``(len(rows), output.numel)``."""
    from agcheck.core.jacobian import _columns_for_element

    x = args[position]
    complex_input = be.is_complex(x)
    result = []
    with be.perturber(args, position) as perturber:
        for flat in rows:
            cols = _columns_for_element(be, perturber, fn, int(flat), eps, complex_input, stencil)
            result.append(np.asarray(be.to_numpy(cols[output_position])).reshape(-1))
    return np.stack(result)


@dataclass
class _Probe:
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
    def kink(self) -> bool:
        return self.unstable or self.jump

    @property
    def noise(self) -> bool:
        return not self.kink and self.mismatch <= 2 * self.spread

    def line(self, block) -> str:
        return (f"{_where(block, self.row, self.col)}: central eps/10 {_f(self.small)}, eps {_f(self.numerical)}, "
                f"eps*10 {_f(self.large)}; one-sided right {_f(self.right)}, left {_f(self.left)}; "
                f"analytical {_f(self.analytical)}")

    def noise_line(self, block) -> str:
        return (f"{_where(block, self.row, self.col)}: numerical {_f(self.numerical)}; with eps/10 it moves by "
                f"{abs(self.small - self.numerical):.1e}, with eps*10 by {abs(self.large - self.numerical):.1e}; "
                f"analytical differs by {self.mismatch:.1e}")

    def evidence(self) -> dict:
        return {"row": self.row, "col": self.col, "numerical": self.numerical, "analytical": self.analytical,
                "central_eps_div_10": self.small, "central_eps_times_10": self.large,
                "right": self.right, "left": self.left}


def _probe(block) -> list | None:
    """Re-evaluate the worst mismatching entries with other steps (``None`` if impossible)."""
    if block.resample is None or not block.eps:
        return None
    n, a = block.numerical, block.analytical
    tol = block.atol + block.rtol * np.abs(n)
    chosen = [e for e in block.worst if not (abs(e.analytical - e.numerical) <= tol[e.row, e.col])]
    chosen = chosen[:PROBED_ENTRIES]
    if not chosen:
        return None
    rows = sorted({e.row for e in chosen})
    at = {r: i for i, r in enumerate(rows)}
    eps = block.eps
    small = block.resample(eps / 10, rows)
    large = block.resample(eps * 10, rows)
    right = block.resample(eps / 10, rows, RIGHT)
    left = block.resample(eps / 10, rows, LEFT)
    right_eps = block.resample(eps, rows, RIGHT)
    left_eps = block.resample(eps, rows, LEFT)
    probes = []
    for e in chosen:
        i, c = at[e.row], e.col
        probes.append(_Probe(e.row, c, n[e.row, c].item(), a[e.row, c].item(), small[i, c].item(),
                             large[i, c].item(), right[i, c].item(), left[i, c].item(),
                             right_eps[i, c].item(), left_eps[i, c].item()))
    return probes


# -- Jacobian blocks ------------------------------------------------------------------------

def diagnose_block(block, index: int = 0) -> list:
    """The diagnoses of one failing Jacobian block."""
    if not block.has_arrays:
        return []
    N, A = block.numerical, block.analytical
    if N.shape != A.shape or N.size == 0:
        return []
    found: list[Diagnosis] = []

    def add(kind, message, evidence=None, lines=None):
        found.append(Diagnosis(kind, message, dict(evidence or {}), list(lines or []), index))

    if block.fast and block.mismatches == 0:
        p = block.projection or {}
        add("fast_only",
            "the fast-mode projection v^T J u failed, but the full Jacobians recomputed in slow mode agree "
            "within atol/rtol: the projection's tolerance (atol scaled by sum(u) * sum(v)) is stricter than "
            "the element-wise one here; slow mode (fast_mode=False) passes this pair",
            {"projection": p})
        return found

    finite_n, finite_a = np.isfinite(N), np.isfinite(A)
    if not (finite_n.all() and finite_a.all()):
        side = "numerical" if not finite_n.all() else "analytical"
        bad = np.argwhere(~(finite_n & finite_a))[:5]
        add("non_finite",
            f"the {side} Jacobian has NaN or infinite entries ({int((~(finite_n & finite_a)).sum())} of {N.size})"
            + (": fn is not finite near the input (a pole, log(0), 0/0)" if side == "numerical"
               else ": the backward produces NaN/inf (e.g. 0 * inf, a division by zero)"),
            {"count": int((~(finite_n & finite_a)).sum())},
            [f"{_where(block, r, c)}: numerical {_f(N[r, c].item())}, analytical {_f(A[r, c].item())}"
             for r, c in bad])
        return found

    with np.errstate(over="ignore", invalid="ignore"):
        diff = np.abs(A - N)
    r0 = float(diff.max())
    scale = float(max(np.abs(N).max(), np.abs(A).max()))
    eps = block.eps or 1e-6
    macheps = machine_eps(block.input_dtype, N)
    # the finite-difference error floor, relative to the block's scale
    floor = min(100 * macheps / eps, 1e-2) * scale

    try:
        probes = _probe(block)
    except Exception as ex:  # fn may fail at other steps; the other hypotheses still apply
        probes = None
        add("note", f"could not re-evaluate numerical entries with other steps ({type(ex).__name__}: {ex})")
    if probes:
        smooth = [p.spread for p in probes if not p.kink]
        if smooth:
            floor = max(floor, max(smooth))
        kinks = [p for p in probes if p.kink]
        if kinks:
            lines = [p.line(block) for p in kinks]
            ev = {"entries": [p.evidence() for p in kinks], "eps": eps, "probed": len(probes)}
            if block.input_double is False and not all(p.jump for p in kinks):
                add("precision",
                    f"the numerical derivative at {len(kinks)} of {len(probes)} probed entries changes with the "
                    f"step size, and input {block.input} is {block.input_dtype}: finite differences with "
                    f"eps={_f(eps)} are dominated by rounding in this precision (or the input sits on a kink). "
                    "Check in double precision, or use eps='auto', stencil='five-point' (docs/accuracy.md)",
                    ev, lines)
            else:
                add("kink",
                    f"the numerical derivative at {len(kinks)} of {len(probes)} probed entries changes with the "
                    "step size (eps/10, eps, eps*10) or differs between its right and left one-sided values: "
                    "the input likely sits on a kink/non-differentiable point (e.g. relu at 0, abs at 0, max "
                    "with ties), where finite differences and the analytical derivative legitimately disagree. "
                    "Move the test input away from it",
                    ev, lines)
            if 2 * len(kinks) >= len(probes):
                return found
        elif all(p.noise for p in probes):
            add("noise", _noise_message(block, r0, scale, "estimates with eps/10 and eps*10 differ by as much"),
                {"max_abs_diff": r0, "scale": scale, "spread": max(p.spread for p in probes)},
                [p.noise_line(block) for p in probes[:3]])
            return found
    elif r0 <= floor:
        add("noise", _noise_message(block, r0, scale, f"about 100 * machine epsilon / eps for {block.input_dtype or N.dtype}"),
            {"max_abs_diff": r0, "scale": scale, "floor": floor})
        return found

    if N.size <= STRUCTURE_LIMIT:
        _structure(block, N, A, diff, r0, floor, add)
    else:
        add("note", f"block of {N.size} entries: whole-block hypotheses (factor, transposition...) skipped")
    return found


def _noise_message(block, r0, scale, why) -> str:
    rel = r0 / scale if scale else 0.0
    return (f"the mismatch (max {_f(r0)}, {rel:.1e} of the Jacobian's largest entry) is within the error of "
            f"the finite differences ({why}): the gradient is likely correct and the tolerance "
            f"(atol={_f(block.atol)}, rtol={_f(block.rtol)}) too tight to be met by finite differences")


def _fit(A, X, r0, floor):
    with np.errstate(over="ignore", invalid="ignore"):
        rx = float(np.abs(A - X).max())
    return rx <= max(0.01 * r0, floor) and rx <= 0.1 * r0, rx


def _structure(block, N, A, diff, r0, floor, add) -> None:
    rows, cols = N.shape
    n_max, a_max = float(np.abs(N).max()), float(np.abs(A).max())
    nonzero = int(np.count_nonzero(np.abs(N) > floor))
    evidence_base = {"max_abs_diff": r0, "nonzero_numerical_entries": nonzero}

    if a_max <= floor and n_max > floor:
        add("zero_analytical",
            f"the analytical Jacobian is zero (max |analytical| {_f(a_max)}) while the numerical one is not "
            f"(max {_f(n_max)}): the backward likely returns zeros (or None) for input {block.input}, "
            "or the forward uses a detached copy of it",
            evidence_base)
        return
    if n_max <= floor and a_max > floor:
        add("zero_numerical",
            f"the numerical Jacobian is zero: output {block.output} does not change when input {block.input} "
            f"moves, but the analytical one is not (max |analytical| {_f(a_max)}): the backward likely "
            "returns a gradient for an input the output does not depend on (inputs swapped?)",
            evidence_base)
        return

    explained = False
    denom = float(np.vdot(N, N).real)
    if denom > 0:
        c = complex(np.vdot(N, A)) / denom
        if abs(c.imag) <= 1e-9 * abs(c):
            c = c.real
        ok, rx = _fit(A, c * N, r0, floor)
        weak = " (a single nonzero entry: weak evidence)" if nonzero <= 1 else ""
        if ok and abs(c - 1) > 1e-3:
            ev = dict(evidence_base, factor=c, residual=rx)
            if abs(c + 1) <= 1e-3:
                add("sign", f"analytical = -1 x numerical: the gradient's sign is flipped (all {nonzero} nonzero "
                            f"entries; residual {_f(rx)} vs mismatch {_f(r0)}){weak}", ev)
            else:
                add("factor", f"analytical = {_c(c)} x numerical (numerical = {_c(1 / c)} x analytical), "
                              f"a constant factor over all {nonzero} nonzero entries (residual {_f(rx)} vs "
                              f"mismatch {_f(r0)}){weak}", ev)
            explained = True

    if not explained and np.iscomplexobj(N) and float(np.abs(N.imag).max()) > floor:
        for sign, form in ((1, "conj(numerical)"), (-1, "-conj(numerical)")):
            ok, rx = _fit(A, sign * N.conj(), r0, floor)
            if ok:
                seen = (" (on the imaginary part of a complex output a missing conjugation shows as -conj)"
                        if sign < 0 else "")
                add("conjugate", f"analytical = {form}{seen} (residual {_f(rx)} vs mismatch {_f(r0)}): the "
                                 "backward likely misses (or adds) a complex conjugation, e.g. grad * w instead "
                                 "of grad * w.conj() — agcheck and torch expect the conjugate Wirtinger "
                                 "convention", dict(evidence_base, residual=rx, sign=sign))
                explained = True
                break

    if not explained and rows == cols and rows >= 2:
        ok, rx = _fit(A, N.T, r0, floor)
        if ok:
            add("transposed", f"analytical = numerical transposed (residual {_f(rx)} vs mismatch {_f(r0)}): the "
                              "derivative likely uses a matrix where its transpose belongs (e.g. W instead "
                              "of W.T in the backward of x @ W)", dict(evidence_base, residual=rx))
            explained = True
        elif np.iscomplexobj(N):
            ok, rx = _fit(A, N.conj().T, r0, floor)
            if ok:
                add("adjoint", f"analytical = conjugate transpose of numerical (residual {_f(rx)} vs mismatch "
                               f"{_f(r0)}): a matrix and its adjoint are likely swapped in the backward",
                    dict(evidence_base, residual=rx))
                explained = True

    if not explained and block.mode == "reverse" and cols >= 2:
        ok, rx = _fit(A, np.repeat(N.sum(axis=1, keepdims=True), cols, axis=1), r0, floor)
        if ok:
            add("ignores_grad_output",
                "every column of the analytical Jacobian (the backward for one output element) equals the "
                f"gradient of sum(output {block.output}) (residual {_f(rx)}): the backward likely ignores "
                "grad_output instead of multiplying by it", dict(evidence_base, residual=rx))
            explained = True
    if not explained and block.mode == "forward" and rows >= 2:
        ok, rx = _fit(A, np.repeat(N.sum(axis=0, keepdims=True), rows, axis=0), r0, floor)
        if ok:
            add("ignores_tangent",
                "every row of the forward-mode Jacobian equals the derivative along the all-ones tangent "
                f"(residual {_f(rx)}): the forward-mode rule likely ignores the input tangent",
                dict(evidence_base, residual=rx))
            explained = True
    if explained:
        return

    with np.errstate(invalid="ignore"):
        bad = (diff > block.atol + block.rtol * np.abs(N)) & (diff > floor)
    k = int(np.count_nonzero(bad))
    if not k:
        return
    from agcheck.report import _index_text, _unravel

    bad_rows = np.unique(np.nonzero(bad)[0])
    bad_cols = np.unique(np.nonzero(bad)[1])
    if len(bad_rows) <= 3 and rows >= 4 and 4 * len(bad_rows) <= rows and k >= 2 * len(bad_rows):
        which = ", ".join(_index_text(_unravel(r, block.input_shape)) for r in bad_rows)
        add("localized", f"all {k} wrong entries are derivatives with respect to input element(s) {which} "
                         f"(rows of the block): the gradient of those elements is wrong, the others match",
            {"count": k, "rows": [int(r) for r in bad_rows]})
        return
    if len(bad_cols) <= 3 and cols >= 4 and 4 * len(bad_cols) <= cols and k >= 2 * len(bad_cols):
        which = ", ".join(_index_text(_unravel(c, block.output_shape)) for c in bad_cols)
        add("localized", f"all {k} wrong entries are derivatives of output element(s) {which} (columns of "
                         f"the block): the backward for those output elements is wrong, the others match",
            {"count": k, "cols": [int(c) for c in bad_cols]})
        return
    if k <= FEW and 4 * k <= N.size:
        entries = np.argwhere(bad)
        entries = entries[np.argsort(-diff[bad], kind="stable")]
        lines = [f"{_where(block, r, c)}: numerical {_f(N[r, c].item())}, analytical {_f(A[r, c].item())}, "
                 f"|diff| {_f(diff[r, c])}" for r, c in entries[:FEW]]
        add("few_entries", f"only {k} of {N.size} entries {'is' if k == 1 else 'are'} wrong, the rest match: the derivative is likely "
                           "wrong in one branch or at the edges (a boundary element, a special case)",
            {"count": k, "entries": [[int(r), int(c)] for r, c in entries[:FEW]]}, lines)


# -- the other checks -----------------------------------------------------------------------

def _reentrant(report) -> list:
    d = report.details
    diff, tol = d.get("max_run_to_run_difference"), d.get("nondet_tol", 0.0)
    if diff is None:
        return []
    scale = d.get("gradient_scale")
    rel = diff / scale if scale else None
    macheps = machine_eps(d.get("dtype"))
    ev = {"max_run_to_run_difference": diff, "nondet_tol": tol, "gradient_scale": scale, "relative": rel}
    size = f"largest run-to-run difference {diff:.3e} vs nondet_tol={tol}"
    if rel is not None:
        size += f" ({rel:.1e} of the gradient's largest entry)"
    if rel is not None and rel <= 1e4 * macheps:
        suggest = 10.0 ** np.ceil(np.log10(diff * 2)) if diff > 0 else 0.0
        ev["suggested_nondet_tol"] = suggest
        return [Diagnosis("nondeterministic",
                          f"the backward gives different results on identical calls: {size}. That is "
                          "rounding-sized, typical of non-deterministic kernels (atomic adds, parallel "
                          f"reductions): likely noise, not a bug; nondet_tol={suggest:.0e} would accept it", ev)]
    return [Diagnosis("nondeterministic",
                      f"the backward gives different results on identical calls: {size}. That is far above "
                      "rounding: the backward likely depends on state that changes between calls (random "
                      "numbers, a counter or cache mutated in forward/backward) — a bug rather than noise", ev)]


def _grad_output_scaling(report) -> list:
    d = report.details
    if "not multiplied" in report.message:
        g = d.get("max_abs_gradient")
        size = f" (max |gradient| {_f(g)})" if g is not None else ""
        return [Diagnosis("not_multiplied_by_grad_output",
                          f"with grad_output = 0 the backward returned a non-zero gradient for input "
                          f"{d.get('input', '?')}{size}: the backward likely does not multiply by grad_output "
                          "(returns the derivative of the output itself, e.g. 2 * x instead of 2 * x * grad)",
                          dict(d))]
    return [Diagnosis("gradient_shape", f"the gradient for input {d.get('input', '?')} has the wrong type, "
                                        f"device or size: {report.headline()}", dict(d))]


def _batched(report) -> list:
    d = report.details
    if "max_difference" not in d:
        return [Diagnosis("batched", "vmap could not batch the derivative computation: an operation in it has "
                                     "no batching rule (or works on .item() / Python numbers)", dict(d))]
    return [Diagnosis("batched",
                      f"the vmapped derivative differs from the one computed one cotangent/tangent at a time by "
                      f"up to {_f(d['max_difference'])} (output {d.get('output')}, input {d.get('input')}): an "
                      "operation in it likely mixes the batch (in-place updates, reductions over all "
                      "dimensions, data-dependent Python control flow)", dict(d))]


def _undefined(report) -> list:
    d = report.details
    if report.check == "undefined_tangent":
        return [Diagnosis("undefined_grad", "an undefined (None) input tangent gives other output tangents than "
                                            "a zero one: the forward-mode rule must treat a missing tangent as "
                                            "zero", dict(d))]
    g = d.get("max_abs_gradient")
    if g is None:
        return [Diagnosis("undefined_grad", "the backward fails when output gradients are undefined (None): it "
                                            "must treat them as zeros", dict(d))]
    return [Diagnosis("undefined_grad", f"with undefined (None) output gradients "
                                        f"({d.get('undefined_outputs', 'all')}) the backward returned a non-zero "
                                        f"gradient (max |gradient| {_f(g)}): it must treat them as zeros", dict(d))]


def _no_differentiable_outputs(report) -> list:
    d = report.details
    size = d.get("max_abs_numerical")
    how = f" (numerical derivatives up to {_f(size)})" if size is not None else ""
    return [Diagnosis("depends_on_input",
                      f"fn has no differentiable outputs, but its outputs change when input {d.get('input', '?')} "
                      f"moves{how}: the output is likely computed through a non-differentiable path (detach, "
                      "no_grad, a cast to integer) although it depends on the input", dict(d))]


def _grad_meta(report) -> list:
    return [Diagnosis("gradient_shape", f"the backward returned a gradient of the wrong shape or dtype: "
                                        f"{report.headline()}", dict(report.details))]


_CHECK_HANDLERS = {
    "reentrant": _reentrant,
    "grad_output_scaling": _grad_output_scaling,
    "batched_grad": _batched,
    "batched_forward_grad": _batched,
    "undefined_grad": _undefined,
    "undefined_tangent": _undefined,
    "no_differentiable_outputs": _no_differentiable_outputs,
    "grad_dtype": _grad_meta,
    "grad_size": _grad_meta,
}
