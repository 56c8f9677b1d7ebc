"""Finite-difference stencils: where to evaluate ``fn`` and how to combine the values.

``"central"``, ``(f(x+h) - f(x-h)) / 2h``, is computed exactly as torch computes it, so
verdicts match. ``"five-point"``, ``(f(x-2h) - 8 f(x-h) + 8 f(x+h) - f(x+2h)) / 12h``, has a
truncation error falling as ``h**4``: a larger, rounding-safe ``h`` keeps it accurate, which
makes checks of float32 functions meaningful.
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Stencil", "STENCILS", "get_stencil", "auto_eps"]


@dataclass(frozen=True)
class Stencil:
    name: str
    #: multiples of the step at which ``fn`` is evaluated, in evaluation order
    offsets: tuple
    #: weights of those evaluations; the estimate is ``sum(w * f) / h``
    weights: tuple
    #: the exponent ``p`` of the rounding-optimal step ``h ~ machine_eps ** p``
    step_exponent: float

    def combine(self, values: list, eps: float):
        """The derivative estimate from ``values[i] = f(x + offsets[i] * h)``."""
        if self.name == "central":
            minus, plus = values
            return (plus - minus) / (2 * eps)
        total = values[0] * self.weights[0]
        for w, v in zip(self.weights[1:], values[1:]):
            total = total + v * w
        return total / eps


STENCILS = {
    "central": Stencil("central", (-1, 1), (-0.5, 0.5), 1 / 3),
    "five-point": Stencil("five-point", (-2, -1, 1, 2), (1 / 12, -8 / 12, 8 / 12, -1 / 12), 1 / 5),
}


def get_stencil(name: str) -> Stencil:
    try:
        return STENCILS[name]
    except KeyError:
        raise ValueError(f"stencil must be one of {sorted(STENCILS)}, got {name!r}") from None


def auto_eps(machine_eps: float, stencil: Stencil) -> float:
    """The step that balances truncation and rounding error for a stencil and precision."""
    return float(machine_eps) ** stencil.step_exponent
