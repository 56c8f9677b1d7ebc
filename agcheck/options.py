"""The keywords of a check, as one frozen and validated object."""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, fields

from agcheck.errors import CheckInputError

__all__ = ["GradcheckOptions", "GradgradcheckOptions", "gradcheck_options"]


def _check_number(name: str, value, *, positive: bool, magnitude: bool = False, nan_ok: bool = False) -> float:
    """``value`` as a float, > 0 if ``positive`` else >= 0 (``magnitude``: its absolute value;
    ``nan_ok``: NaN passes)."""
    if isinstance(value, (str, bytes)):  # float("1e-6") would take it; torch's checker does not
        raise TypeError(f"{name} must be a real number, got {value!r}")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        try:
            value = float(value)
        except (TypeError, ValueError):
            raise TypeError(f"{name} must be a real number, got {value!r}") from None
    value = abs(float(value)) if magnitude else float(value)
    if math.isnan(value) and nan_ok:
        return value
    if math.isnan(value) or (positive and not math.isfinite(value)):
        raise CheckInputError(f"{name} must be a finite number, got {value!r}")
    if positive and value <= 0:
        raise CheckInputError(f"{name} must be greater than zero, but got {value!r}: it is the "
                              "finite-difference step")
    if not positive and value < 0:
        raise CheckInputError(f"{name} must be greater than or equal to zero, but got {value!r}")
    return value


@dataclass(frozen=True)
class GradcheckOptions:
    """Every keyword of ``torch.autograd.gradcheck``, with torch's defaults."""

    eps: float | str = 1e-6  #: a step, or "auto"
    atol: float = 1e-5
    rtol: float = 1e-3
    raise_exception: bool = True
    nondet_tol: float = 0.0
    check_undefined_grad: bool = True
    check_grad_dtypes: bool = False
    check_batched_grad: bool = False
    check_batched_forward_grad: bool = False
    check_forward_ad: bool = False
    check_backward_ad: bool = True
    fast_mode: bool = False
    masked: bool | None = None
    #: beyond torch: "auto" (batched where it pays) or "reference" (torch's algorithm)
    engine: str = "auto"
    #: beyond torch: bytes the batched engine may use for Jacobians and batches
    memory_budget: int | None = None
    #: beyond torch: "central" (torch's) or "five-point" finite differences
    stencil: str = "central"
    #: beyond torch: show a progress bar while slow-mode Jacobians are computed
    progress: bool = False
    #: beyond torch: fast mode's tolerance of a projection, "torch" (atol * sum(u) * sum(v))
    #: or "probe" (atol * |u| * |v|, the probes' norms)
    fast_tolerance: str = "torch"

    def __post_init__(self):
        # The impossible combinations raise AssertionError, as in torch.
        if not (self.check_forward_ad or self.check_backward_ad):
            raise AssertionError("Expected at least one of check_forward_ad or check_backward_ad to be True")
        if self.check_batched_grad and not self.check_backward_ad:
            raise AssertionError("Setting check_batched_grad=True requires check_backward_ad to be True")
        if self.check_batched_forward_grad and not self.check_forward_ad:
            raise AssertionError("Setting check_batched_forward_grad=True requires check_forward_ad to be True")
        if self.fast_tolerance not in ("torch", "probe"):
            raise ValueError(f"fast_tolerance must be 'torch' or 'probe', got {self.fast_tolerance!r}")
        if self.engine not in ("auto", "batched", "reference"):
            raise ValueError(f"engine must be 'auto', 'batched' or 'reference', got {self.engine!r}")
        if self.memory_budget is not None and (
            isinstance(self.memory_budget, bool) or not isinstance(self.memory_budget, int) or self.memory_budget <= 0
        ):
            raise ValueError(f"memory_budget must be a positive number of bytes, got {self.memory_budget!r}")
        from agcheck.stencil import get_stencil

        get_stencil(self.stencil)
        if not (isinstance(self.eps, str) and self.eps == "auto"):
            # a negative step gives the central differences of its absolute value, as under
            # torch's checker ((a - b) / -2h is (b - a) / 2h; only zeros differ, in sign)
            object.__setattr__(self, "eps", _check_number("eps", self.eps, positive=True, magnitude=True))
        for name in ("atol", "rtol"):
            object.__setattr__(self, name, _check_number(name, getattr(self, name), positive=False))
        # as under torch's checker, a NaN tolerance for nondeterminism accepts any
        # run-to-run difference (every comparison with it is false)
        object.__setattr__(self, "nondet_tol", _check_number("nondet_tol", self.nondet_tol, positive=False,
                                                             nan_ok=True))

    def as_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@functools.lru_cache(maxsize=64, typed=True)
def _validated(**keywords) -> GradcheckOptions:
    return GradcheckOptions(**keywords)


def gradcheck_options(**keywords) -> GradcheckOptions:
    """``GradcheckOptions(**keywords)``, one frozen object per keywords, validated once."""
    try:
        hash(tuple(keywords.values()))
    except TypeError:  # an unhashable value: validated (and refused, or kept) afresh
        return GradcheckOptions(**keywords)
    return _validated(**keywords)


@dataclass(frozen=True)
class GradgradcheckOptions:
    """The keywords specific to ``gradgradcheck``, validated as torch does."""

    gen_non_contig_grad_outputs: bool = False
    check_fwd_over_rev: bool = False
    check_rev_over_rev: bool = True
    check_undefined_grad: bool = True
    check_batched_grad: bool = False

    def __post_init__(self):
        if not (self.check_fwd_over_rev or self.check_rev_over_rev):
            raise AssertionError("Expected at least one of check_fwd_over_rev or check_rev_over_rev to be True")
        if self.check_undefined_grad and not self.check_rev_over_rev:
            raise AssertionError("Setting check_undefined_grad=True requires check_rev_over_rev to be True")
        if self.check_batched_grad and not self.check_rev_over_rev:
            raise AssertionError("Setting check_batched_grad=True requires check_rev_over_rev to be True")
