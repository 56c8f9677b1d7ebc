"""Diagnoses of the checks other than the Jacobian comparison: one handler per check, reading
the facts the check put in ``report.details``."""
from __future__ import annotations

import numpy as np

from agcheck.report.model import Diagnosis
from agcheck.report.values import fmt

from .facts import machine_eps

__all__ = ["CHECK_HANDLERS"]


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
        size = f" (max |gradient| {fmt(g)})" if g is not None else ""
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
                      f"up to {fmt(d['max_difference'])} (output {d.get('output')}, input {d.get('input')}): an "
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
                                        f"gradient (max |gradient| {fmt(g)}): it must treat them as zeros", dict(d))]


def _no_differentiable_outputs(report) -> list:
    d = report.details
    size = d.get("max_abs_numerical")
    how = f" (numerical derivatives up to {fmt(size)})" if size is not None else ""
    return [Diagnosis("depends_on_input",
                      f"fn has no differentiable outputs, but its outputs change when input {d.get('input', '?')} "
                      f"moves{how}: the output is likely computed through a non-differentiable path (detach, "
                      "no_grad, a cast to integer) although it depends on the input", dict(d))]


def _grad_meta(report) -> list:
    return [Diagnosis("gradient_shape", f"the backward returned a gradient of the wrong shape or dtype: "
                                        f"{report.headline()}", dict(report.details))]


#: the diagnosis handler of each check (by ``report.check``)
CHECK_HANDLERS = {
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
