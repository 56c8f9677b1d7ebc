"""One compared piece of ``fn``, after the complex split."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable


@dataclass(frozen=True, eq=False)
class Piece:
    """A real-valued piece of the function under check, at one point.

    Attributes
    ----------
    fn : callable
        The piece (``fn`` itself, or its real/imaginary part: :mod:`agcheck.core.wirtinger`).
    args : tuple
        Its arguments.
    checked : list of int
        The positions of the checked inputs in ``args``.
    trace : Trace
        ``fn`` evaluated at ``args``, ready for reverse mode.
    forward : bool
        Compared in forward mode (JVPs) rather than reverse mode (VJPs).
    complex_indices : list of int or None
        Which outputs (reverse) or inputs (forward) are complex, for torch's messages.
    test_imag : bool
        This piece is the imaginary part of the complex split.
    diff : list of int
        Positions of the differentiable outputs.
    floats : list of int
        Positions of the floating or complex outputs.
    """

    fn: Callable
    args: tuple
    checked: list
    trace: object
    forward: bool = False
    complex_indices: list | None = None
    test_imag: bool = False
    diff: list = field(default_factory=list)
    floats: list = field(default_factory=list)

    @classmethod
    def of(cls, be, fn, args, checked, trace, *, forward=False, complex_indices=None, test_imag=False) -> "Piece":
        """A piece with its output positions read off ``trace`` through ``be``."""
        outputs = trace.outputs
        return cls(fn, args, list(checked), trace, forward, complex_indices, test_imag,
                   diff=[k for k, o in enumerate(outputs) if be.is_differentiable_output(o)],
                   floats=[k for k, o in enumerate(outputs) if be.is_floating_or_complex(o)])

    @property
    def outputs(self) -> tuple:
        return self.trace.outputs

    @property
    def inputs(self) -> list:
        """The checked inputs themselves."""
        return [self.args[p] for p in self.checked]
