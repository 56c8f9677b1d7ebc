"""What every hypothesis about a failing block looks at: the two blocks, their difference,
the finite-difference error floor, and how entries and numbers are written in messages."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from agcheck.report.model import Diagnosis
from agcheck.report.values import abs_difference, fmt, index_text, unravel

__all__ = ["BlockFacts", "machine_eps", "where", "entry_text", "coefficient_text"]


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


def coefficient_text(c) -> str:
    """A fitted factor as a message writes it (``2.00``, ``(1+2j)``, ``1e+04``)."""
    if isinstance(c, complex) and c.imag != 0:
        return f"({c.real:.3g}{c.imag:+.3g}j)"
    c = c.real if isinstance(c, complex) else c
    return f"{c:.2f}" if 0.01 <= abs(c) < 1000 else f"{c:.3g}"


def where(block, r, c) -> str:
    """Entry ``(r, c)`` of a block as ``input(i, j) / output(k,)``."""
    return f"input{index_text(unravel(r, block.input_shape))} / output{index_text(unravel(c, block.output_shape))}"


def entry_text(block, r, c) -> str:
    """Entry ``(r, c)`` of a block with its numerical and analytical values."""
    return (f"{where(block, r, c)}: numerical {fmt(block.numerical[r, c].item())}, "
            f"analytical {fmt(block.analytical[r, c].item())}")


@dataclass
class BlockFacts:
    """A failing block with the numbers the hypotheses share.

    ``floor``, the absolute finite-difference error floor below which differences are no
    evidence, is ``100 * machine epsilon / eps`` times the output's largest entry (else the
    block's), at most 1 % of the block's largest entry; the step-size probes may raise it.
    """

    block: object
    index: int
    N: np.ndarray
    A: np.ndarray
    diff: np.ndarray
    #: the largest mismatch |A - N|
    r0: float
    #: the largest entry of either block
    scale: float
    eps: float
    floor: float
    #: the checked input's values, one per row, where ``resample.input_values`` gives them
    inputs: np.ndarray | None = None

    @classmethod
    def of(cls, block, index: int) -> "BlockFacts":
        N, A = block.numerical, block.analytical
        with np.errstate(over="ignore", invalid="ignore"):
            diff = abs_difference(A, N)
        r0 = float(diff.max())
        scale = float(max(np.abs(N).max(), np.abs(A).max()))
        eps = block.eps or 1e-6
        macheps = machine_eps("float32" if block.output_float32_valued else block.input_dtype, N)
        output_scale = getattr(block, "output_scale", None)
        floor = min(100 * macheps / eps, 1e-2) * scale
        if output_scale is not None and math.isfinite(output_scale):
            floor = min(100 * macheps / eps * output_scale, 1e-2 * scale)
        return cls(block, index, N, A, diff, r0, scale, eps, floor)

    def diagnosis(self, kind: str, message: str, evidence=None, lines=None) -> Diagnosis:
        return Diagnosis(kind, message, dict(evidence or {}), list(lines or []), self.index)

    def fit(self, X):
        """``(ok, residual)``: does ``A`` equal ``X`` to 1 % of the mismatch (or the error floor)?"""
        with np.errstate(over="ignore", invalid="ignore"):
            rx = float(abs_difference(self.A, X).max())
        return rx <= max(0.01 * self.r0, self.floor) and rx <= 0.1 * self.r0, rx

    def entry_text(self, r, c) -> str:
        return entry_text(self.block, r, c)
