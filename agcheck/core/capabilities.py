"""Which optional parts of the backend contract the options of a check need."""
from __future__ import annotations

from agcheck.backends.base import Capability

__all__ = ["required_capabilities", "require_capabilities"]


def required_capabilities(opts) -> list[tuple[str, str]]:
    """``(capability, keyword)`` for each optional part ``opts`` needs, in the order the checks
    run (the first missing one is reported)."""
    needed = []
    if opts.check_backward_ad:
        needed.append((Capability.REVERSE, "check_backward_ad"))
    if opts.check_forward_ad:
        needed.append((Capability.FORWARD, "check_forward_ad"))
    if opts.masked:
        needed.append((Capability.MASKED, "masked"))
    if opts.check_batched_grad:
        needed.append((Capability.BATCHED_GRAD, "check_batched_grad"))
    if opts.check_batched_forward_grad:
        needed.append((Capability.BATCHED_FORWARD, "check_batched_forward_grad"))
    if opts.check_undefined_grad and (opts.check_backward_ad or opts.check_forward_ad):
        needed.append((Capability.UNDEFINED_GRAD, "check_undefined_grad"))
    return needed


def require_capabilities(be, opts) -> None:
    """Refuse, before any work, a check that ``be`` cannot run (never pass it silently)."""
    for capability, keyword in required_capabilities(opts):
        if not be.supports(capability):
            raise be.refusal(capability, keyword)
