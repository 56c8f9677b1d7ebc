"""The complex split: checks on complex functions run on real-valued pieces of them.

Reverse mode differentiates real-valued functions, so a function with complex outputs
is checked twice: once on the real parts of its complex outputs and once on their
imaginary parts. Forward mode pushes real tangents, so a function with complex inputs is
checked twice: once as a function of the real parts of those inputs (the imaginary parts
held fixed) and once as a function of the imaginary parts.
"""
from __future__ import annotations

from typing import Callable, Sequence

__all__ = ["output_part", "input_part", "split_inputs"]


def output_part(be, fn: Callable, part: str) -> Callable:
    """``fn`` with ``real`` or ``imag`` applied to each of its complex array outputs."""
    take = be.real if part == "real" else be.imag

    def piece(*args):
        outs = be.as_tuple(fn(*args))
        return tuple(take(o) if be.is_array(o) and be.is_complex(o) else o for o in outs)

    # backends whose derivatives come from elsewhere (the user's vjp) read what the piece is
    piece.agcheck_piece = ("outputs", fn, part)
    return piece


def input_part(be, fn: Callable, complex_positions: Sequence[int], originals: tuple, part: str) -> Callable:
    """``fn`` as a function of the real (or imaginary) parts of its complex inputs.

    The other part of each complex input is held at its original value.
    """
    positions = tuple(complex_positions)

    def piece(*args):
        rebuilt = list(args)
        for k in positions:
            if part == "real":
                rebuilt[k] = args[k] + be.imag(originals[k]) * 1j
            else:
                rebuilt[k] = be.real(originals[k]) + args[k] * 1j
        return be.as_tuple(fn(*rebuilt))

    piece.agcheck_piece = ("inputs", fn, positions, originals, part)
    return piece


def split_inputs(be, args: tuple, complex_positions: Sequence[int], part: str) -> tuple:
    """The real (or imaginary) parts of the complex inputs, as new independent inputs."""
    return tuple(
        be.part_as_input(a, part) if k in complex_positions else a for k, a in enumerate(args)
    )
