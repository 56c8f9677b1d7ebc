"""A function without differentiable outputs must not change when its inputs move."""
from __future__ import annotations

from agcheck.checks.large_blocks import row_chunks
from agcheck.core.jacobian import numerical_directional, numerical_jacobians
from agcheck.errors import GradcheckError

MESSAGE = "Numerical gradient for function expected to be zero"


def check_slow(run, piece) -> None:
    """Every finite-difference Jacobian entry must be exactly zero (dense inputs in chunks of rows)."""
    be, fn, args, checked, outputs = run.be, piece.fn, piece.args, piece.checked, piece.outputs
    eps_for, stencil = run.eps_for, run.stencil
    width = sum(be.numel(o) * be.itemsize(o) for o in outputs if be.is_array(o) and be.is_floating_or_complex(o))
    for pos in checked:
        x = args[pos]
        chunks = row_chunks(run, be.numel(x), 2 * width) if be.layout(x) == "dense" else [None]
        for rows in chunks:
            for jac in numerical_jacobians(be, fn, args, pos, outputs, eps_for(x), stencil, elements=rows).values():
                xp = be.xp(jac)
                nonzero = int(xp.count_nonzero(jac))
                if nonzero > 0:
                    raise GradcheckError(MESSAGE, check="no_differentiable_outputs",
                                         details={"input": checked.index(pos),
                                                  "max_abs_numerical": float(xp.max(xp.abs(jac))),
                                                  "nonzero_entries": nonzero})


def check_fast(run, piece, all_u) -> None:
    """Every finite-difference derivative along the probes ``all_u`` must be within ``nondet_tol`` of zero."""
    be, fn, args, checked = run.be, piece.fn, piece.args, piece.checked
    eps_for, stencil, tol = run.eps_for, run.stencil, run.opts.nondet_tol
    for pos, u in zip(checked, all_u):
        for jvp in numerical_directional(be, fn, args, pos, u, eps_for(args[pos]), stencil):
            if jvp is None or be.numel(jvp) == 0:
                continue
            xp = be.xp(jvp)
            largest = float(xp.max(xp.abs(jvp)))
            if largest > tol:
                raise GradcheckError(MESSAGE, check="no_differentiable_outputs",
                                     details={"input": checked.index(pos), "max_abs_numerical": largest,
                                              "tolerance": tol})
