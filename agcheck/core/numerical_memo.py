"""Numerical Jacobians computed by a check's reverse-mode pass, kept for its forward-mode pass.

In slow mode torch's checker computes the finite-difference Jacobians once per mode. For
a piece whose function and arguments are the same objects in both passes (real inputs:
the forward pass splits complex ones into parts, the reverse pass complex outputs), the
numbers are the same: the same evaluations at the same moves with the same eps. The
reverse pass leaves its rows here and the forward pass takes them, so a check with
``check_forward_ad=True`` evaluates ``fn`` for its Jacobians once instead of twice.
"""
from __future__ import annotations

import dataclasses

__all__ = ["MemoRows", "NumericalMemo"]


@dataclasses.dataclass
class MemoRows:
    """One input's numerical Jacobian rows: ``rows`` per floating output position, each a
    whole ``(input numel, output numel)`` backend array; ``bounds`` the row blocks
    ``(start, stop)`` they were computed in (the forward pass computes its JVPs in the
    same blocks); ``exact`` whether they were computed element by element, as the
    reference engine computes them."""

    rows: dict
    bounds: list
    exact: bool


class NumericalMemo:
    """The rows :meth:`put` by a run's reverse-mode pieces, each taken once by :meth:`take`.

    Entries are matched by identity of the function and of every argument, and hold
    references to them (an ``id`` alone could be reused by an object made later)."""

    def __init__(self, wanted: bool):
        #: whether a forward-mode pass will follow (otherwise nothing is kept)
        self.wanted = wanted
        self._entries = []  # [(fn, args, position, MemoRows)]

    def put(self, fn, args, position: int, rows: MemoRows) -> None:
        if self.wanted:
            self._entries.append((fn, tuple(args), position, rows))

    def take(self, fn, args, position: int, exact_only: bool = False) -> MemoRows | None:
        """The rows put for ``fn`` at ``args`` and ``position`` (removed from the memo),
        or ``None``; ``exact_only``: only rows computed element by element."""
        for i, (f, a, p, rows) in enumerate(self._entries):
            if f is fn and p == position and len(a) == len(args) and all(x is y for x, y in zip(a, args)):
                del self._entries[i]  # taken or not, no other piece will ask for them
                return None if exact_only and not rows.exact else rows
        return None

    def clear(self) -> None:
        self._entries.clear()
