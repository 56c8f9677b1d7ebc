"""A user's code, type-checked against agcheck's real signatures (mypy, run by .ci/run).

It is never run: it only has to type-check. A wrong keyword type here, or a signature that
no longer accepts the documented calls, fails the type check.
"""
from __future__ import annotations

import numpy as np
import torch

import agcheck


def checks(x: torch.Tensor) -> bool:
    ok: bool = agcheck.gradcheck(torch.sin, (x,), eps="auto", atol=1e-6, fast_mode=True)
    ok &= agcheck.gradcheck(torch.sin, (x,), eps=1e-6, engine="reference", stencil="five-point",
                            fast_tolerance="probe", memory_budget=1 << 20)
    ok &= agcheck.gradgradcheck(torch.sin, (x,), order=3, check_fwd_over_rev=True)
    try:
        agcheck.gradcheck(torch.sin, (x,))
    except agcheck.GradcheckError as error:
        print(error.report.summary())
    result = agcheck.crosscheck(np.sin, (np.ones(3),), backends=["numpy"], raise_exception=False)
    return ok and bool(result)


def jacobians(x: torch.Tensor) -> None:
    n = agcheck.numerical_jacobian(torch.sin, (x,))
    a = agcheck.analytical_jacobian(torch.sin, (x,))
    print(n, a)
