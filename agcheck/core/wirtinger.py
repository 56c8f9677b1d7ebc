"""The complex split: checks on complex functions run on real-valued pieces of them.

Reverse mode differentiates real-valued functions, so a function with complex outputs
is checked twice: once on the real parts of its complex outputs and once on their
imaginary parts. Forward mode pushes real tangents, so a function with complex inputs is
checked twice: once as a function of the real parts of those inputs (the imaginary parts
held fixed) and once as a function of the imaginary parts.
"""
from __future__ import annotations

from typing import Callable, Sequence

from agcheck.backends.base import InputPart, OutputPart

__all__ = ["output_part", "input_part", "split_inputs"]


def output_part(be, fn: Callable, part: str, shared=None) -> Callable:
    """``fn`` with ``real`` or ``imag`` applied to each of its complex array outputs;
    ``shared``: the :class:`~agcheck.core.shared_evaluations.SharedEvaluations` of the
    two passes."""
    return OutputPart(fn, part, be, shared)


def input_part(be, fn: Callable, complex_positions: Sequence[int], originals: tuple, part: str) -> Callable:
    """``fn`` as a function of the real (or imaginary) parts of its complex inputs.

    The other part of each complex input is held at its original value.
    """
    return InputPart(fn, tuple(complex_positions), originals, part, be)


def split_inputs(be, args: tuple, complex_positions: Sequence[int], part: str) -> tuple:
    """The real (or imaginary) parts of the complex inputs, as new independent inputs."""
    return tuple(
        be.part_as_input(a, part) if k in complex_positions else a for k, a in enumerate(args)
    )
