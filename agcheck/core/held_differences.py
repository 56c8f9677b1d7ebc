"""Finite differences of consecutive elements, combined a chunk at a time.

Combining each element's evaluations on its own costs as much as a cheap fn (a scalar
function of 1,000 inputs: about a third of the checker's own work per element). One
stacked operation per chunk applies the same arithmetic entry by entry, so each row holds
the same bits (real outputs only: a complex division takes another path through a
vectorised loop than through a scalar one).

A chunk holds evaluations of one shape and dtype, few and small (see
:mod:`agcheck.core.row_block`).
"""
from __future__ import annotations

__all__ = ["HeldDifferences", "HELD_ELEMENTS", "HELD_BYTES"]

#: elements whose evaluations are held before they are combined
HELD_ELEMENTS = 32
#: bytes of evaluations held, at most (real entries: at most 8 bytes each)
HELD_BYTES = 1 << 16


class HeldDifferences:
    """Rows of the real outputs keyed in ``rows``, one per element added, written into ``rows[k]``
    when a chunk is combined (call :meth:`flush` after the last element)."""

    def __init__(self, be, stencil, eps: float, rows: dict):
        self.be, self.stencil, self.eps, self.rows = be, stencil, eps, rows
        self._held = {k: [[] for _ in stencil.offsets] for k in rows}
        self._kind = None  # shape and dtype of each output held
        self._numel = {}  # entries of each output held
        self._count = 0
        self._limit = 1

    def add(self, values: list) -> None:
        """One element's evaluations: ``values[i]`` is fn's outputs at the stencil's ``i``-th point."""
        be = self.be
        first = values[0]
        kind = tuple((tuple(first[k].shape), first[k].dtype) for k in self._held)
        if kind != self._kind:
            self.flush()
            self._kind = kind
            self._numel = {k: be.numel(first[k]) for k in self._held}
            per_element = 8 * len(values) * sum(self._numel.values())
            self._limit = max(1, min(HELD_ELEMENTS, HELD_BYTES // max(per_element, 1)))
        for k, held in self._held.items():
            for at_point, outputs in zip(held, values):
                at_point.append(outputs[k])
        self._count += 1
        if self._count >= self._limit:
            self.flush()

    def flush(self) -> None:
        """Combine the elements held and write their rows."""
        if not self._count:
            return
        be = self.be
        for k, held in self._held.items():
            xp = be.xp(held[0][0])
            combined = be.combine(self.stencil, [xp.stack(at_point, axis=0) for at_point in held], self.eps)
            self.rows[k].add_rows(be.xp(combined).reshape(combined, (self._count, self._numel[k])))
            for at_point in held:
                at_point.clear()
        self._count = 0
