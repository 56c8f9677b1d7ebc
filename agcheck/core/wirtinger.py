"""The complex split: checks on complex functions run on real-valued pieces of them.

Reverse mode checks complex outputs on their real and imaginary parts in turn; forward
mode checks complex inputs as functions of their real parts, then of their imaginary parts.
"""
from __future__ import annotations

from typing import Callable, Sequence

from agcheck.backends.base import InputPart, OutputPart

__all__ = ["output_part", "input_part", "split_inputs"]


def output_part(be, fn: Callable, part: str) -> Callable:
    """``fn`` with ``real`` or ``imag`` applied to each of its complex array outputs."""
    return OutputPart(fn, part, be)


def input_part(be, fn: Callable, complex_positions: Sequence[int], originals: tuple, part: str) -> Callable:
    """``fn`` of the real (or imaginary) parts of its complex inputs, the other part held."""
    return InputPart(fn, tuple(complex_positions), originals, part, be)


def split_inputs(be, args: tuple, complex_positions: Sequence[int], part: str) -> tuple:
    """The real (or imaginary) parts of the complex inputs, as new independent inputs."""
    return tuple(be.part_as_input(a, part) if k in complex_positions else a for k, a in enumerate(args))
