"""``crosscheck(..., gradcheck=True)``: gradcheck (and gradgradcheck) on every backend, so that
a disagreement says which side finite differences support."""
from __future__ import annotations

import numpy as np

from agcheck.crosscheck.result import BackendGradcheck
from agcheck.crosscheck.sides import BackendPort, second_order_unsupported
from agcheck.gradcheck import gradcheck
from agcheck.gradgradcheck import gradgradcheck
from agcheck.errors import GradcheckError

__all__ = ["run_gradchecks", "FAILED_PART"]

#: what a failing check (``GradcheckError.check``) compared, in words
FAILED_PART = {
    "jacobian": "reverse mode",
    "jacobian_forward": "forward mode",
    "batched_grad": "batched reverse mode",
    "batched_forward_grad": "batched forward mode",
    "undefined_grad": "undefined gradients",
    "undefined_tangent": "undefined tangents",
    "no_differentiable_outputs": "non-differentiable outputs",
    "grad_output_scaling": "gradient scaling",
    "grad_layout": "gradient layout",
    "reentrant": "reentrancy",
}


def _failure(side: BackendPort, check: str, checks: tuple, error: GradcheckError) -> BackendGradcheck:
    text = str(error).strip()
    headline = text.splitlines()[0].rstrip(",") if text else type(error).__name__
    part = FAILED_PART.get(error.check or "", error.check or "check")
    if check == "gradgradcheck":
        part = "second order" if error.check == "jacobian" else f"second order, {part}"
    nan = False
    for block in getattr(getattr(error, "report", None), "blocks", [])[:1]:
        analytical = getattr(block, "analytical", None)
        if analytical is not None:
            with np.errstate(invalid="ignore"):
                nan = bool(np.isnan(np.asarray(analytical)).any())
    return BackendGradcheck(side.name, "failed", checks, check, part, headline, nan)


def _verdict(side: BackendPort, fast_mode: bool, forward: bool, backward: bool, order: int) -> BackendGradcheck:
    second = order == 2 and second_order_unsupported(side) is None
    checks = ("gradcheck", "gradgradcheck") if second else ("gradcheck",)
    with side.context():
        try:
            gradcheck(side.port, side.fresh_args(), backend=side.be, fast_mode=fast_mode,
                      check_forward_ad=forward, check_backward_ad=backward)
        except GradcheckError as e:
            return _failure(side, "gradcheck", checks, e)
        if second:
            try:
                gradgradcheck(side.port, side.fresh_args(), backend=side.be, fast_mode=fast_mode)
            except GradcheckError as e:
                return _failure(side, "gradgradcheck", checks, e)
    return BackendGradcheck(side.name, "passed", checks)


def run_gradchecks(sides: list, fast_mode: bool, check_forward_ad: bool, check_backward_ad: bool,
                   order: int) -> dict:
    """Per backend a :class:`BackendGradcheck`: passed, failed or skipped."""
    verdicts = {}
    for side in sides:
        forward = check_forward_ad and side.can("forward")
        backward = check_backward_ad and side.can("reverse")
        if not (forward or backward):
            verdicts[side.name] = BackendGradcheck(side.name, "skipped",
                                                   reason="neither reverse nor forward derivatives available")
            continue
        verdicts[side.name] = _verdict(side, fast_mode, forward, backward, order)
    return verdicts
