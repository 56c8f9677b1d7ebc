"""The backward must be multiplied by grad_output: zero cotangents give zero gradients."""
from __future__ import annotations

from agcheck.errors import GradcheckError


def check(run, piece) -> None:
    """Zero cotangents must give zero gradients of the input's type, device, size and layout."""
    be, masked = run.be, run.opts.masked
    outs = [piece.outputs[p] for p in piece.diff]
    grads = piece.trace.vjp(piece.diff, [be.xp(o).zeros_like(o) for o in outs])
    for i, (g, x) in enumerate(zip(grads, piece.inputs)):
        if g is None:
            continue
        problem = be.gradient_layout_problem(g, x)
        if problem:
            raise GradcheckError(problem, check="grad_layout")
        g, x = be.to_dense(g), be.to_dense(x)
        xp = be.xp(g)
        if masked:
            scaled = be.allclose(g, xp.zeros_like(g), rtol=1e-5, atol=1e-8)
        else:
            scaled = not bool(xp.any(g))
        if not scaled:
            raise GradcheckError("backward not multiplied by grad_output", check="grad_output_scaling",
                                 details={"input": i, "max_abs_gradient": float(xp.max(xp.abs(g)))})
        if g.dtype != x.dtype:
            raise GradcheckError("grad is incorrect type", check="grad_output_scaling", details={"input": i})
        if not be.same_device(g, x):
            raise GradcheckError("grad is incorrect device", check="grad_output_scaling", details={"input": i})
        if tuple(g.shape) != tuple(x.shape):
            raise GradcheckError("grad is incorrect size", check="grad_output_scaling", details={"input": i})
