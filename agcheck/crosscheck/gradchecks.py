"""``crosscheck(..., gradcheck=True)``: gradcheck (and gradgradcheck) on every backend, so
that a disagreement says which side is wrong."""
from __future__ import annotations

from agcheck.crosscheck.sides import BackendPort, second_order_unsupported
from agcheck.gradcheck import gradcheck
from agcheck.gradgradcheck import gradgradcheck
from agcheck.report.errors import GradcheckError

__all__ = ["run_gradchecks"]


def _verdict(side: BackendPort, fast_mode: bool, forward: bool, backward: bool, order: int) -> str:
    with side.context():
        try:
            gradcheck(side.port, side.fresh_args(), backend=side.be, fast_mode=fast_mode,
                      check_forward_ad=forward, check_backward_ad=backward)
            if order == 2 and second_order_unsupported(side) is None:
                gradgradcheck(side.port, side.fresh_args(), backend=side.be, fast_mode=fast_mode)
                return "passed (gradcheck and gradgradcheck)"
            return "passed"
        except GradcheckError as e:
            first = str(e).strip().splitlines()[0].rstrip(",") if str(e).strip() else type(e).__name__
            return f"FAILED: {first}"


def run_gradchecks(sides: list, fast_mode: bool, check_forward_ad: bool, check_backward_ad: bool,
                   order: int) -> dict:
    """Per backend ``"passed"``, ``"FAILED: ..."`` or ``"skipped: ..."``."""
    verdicts = {}
    for side in sides:
        forward = check_forward_ad and side.can("forward")
        backward = check_backward_ad and side.can("reverse")
        if not (forward or backward):
            verdicts[side.name] = "skipped: neither reverse nor forward derivatives available"
            continue
        verdicts[side.name] = _verdict(side, fast_mode, forward, backward, order)
    return verdicts
