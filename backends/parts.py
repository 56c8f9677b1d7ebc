"""Functions the core derives from ``fn`` for complex numbers: typed callables of the
backend contract, so that a backend whose derivatives come from elsewhere can unpack them."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

__all__ = ["OutputPart", "InputPart"]


@dataclass(frozen=True, eq=False)
class OutputPart:
    """``fn`` with ``real`` or ``imag`` applied to its complex outputs (reverse mode of a
    function with complex outputs). A backend whose derivatives come from elsewhere (the
    NumPy backend's user VJPs) unpacks it to find ``fn``; to everyone else it is a function."""

    fn: Callable
    part: str
    backend: Any

    def __call__(self, *args):
        return self.taken(self.fn(*args))

    def taken(self, outputs) -> tuple:
        """This function's part of each complex array among ``fn``'s ``outputs``; the other
        outputs as they are."""
        be = self.backend
        take = be.real if self.part == "real" else be.imag
        return tuple(take(o) if be.is_array(o) and be.is_complex(o) else o for o in be.as_tuple(outputs))


@dataclass(frozen=True, eq=False)
class InputPart:
    """``fn`` as a function of the real (or imaginary) parts of its complex inputs at
    ``positions``, the other part held at its value in ``originals`` (forward mode). A
    backend whose operators do not promote real to complex (TensorFlow) unpacks it and
    rebuilds the complex inputs in its own arithmetic."""

    fn: Callable
    positions: tuple
    originals: tuple
    part: str
    backend: Any

    def __call__(self, *args):
        be = self.backend
        rebuilt = list(args)
        for k in self.positions:
            if self.part == "real":
                rebuilt[k] = be.plus_imaginary(args[k], be.imag(self.originals[k]))
            else:
                rebuilt[k] = be.plus_imaginary(be.real(self.originals[k]), args[k])
        return be.as_tuple(self.fn(*rebuilt))
