"""Rows gathered one at a time into one block allocated before the loop.

Rows kept as separate arrays between fn's large temporaries fragment the C allocator,
which grows by about one temporary per row (a 576-input CNN check: 25 MB in one run,
120 MB in the next); a block leaves nothing behind and saves the final stack's copy.
"""
from __future__ import annotations

__all__ = ["RowBlock"]

#: rows held before one write into the block (a write per row costs more than the row on
#: small checks; a few held rows leave reusable holes only)
PENDING_ROWS = 32
#: blocks of fewer entries are stacked at the end: too small to matter to the allocator,
#: and a block costs more than the stack on small checks
SMALL_BLOCK_ENTRIES = 4096


class RowBlock:
    """``n_rows`` rows of ``n_cols`` entries of ``dtype``, added in order; with immutable
    arrays (JAX, TensorFlow) kept and stacked at the end."""

    def __init__(self, be, n_rows: int, n_cols: int, like, dtype):
        self._be, self._n_cols, self._like, self._dtype = be, n_cols, like, dtype
        small = n_rows * n_cols < SMALL_BLOCK_ENTRIES
        self._block = be.row_block(n_rows, n_cols, like, dtype) if n_rows and not small else None
        self._rows: list = []  # not yet written (all rows, without a block)
        self._written = 0

    def add(self, row) -> None:
        if self._block is not None and self._be.numel(row) != self._n_cols:
            # fn's output changed shape: stacked, so the comparison reports it rather than this copy
            self._rows = [self._block[i] for i in range(self._written)] + self._rows
            self._block = None
        self._rows.append(row)
        if self._block is not None and len(self._rows) == PENDING_ROWS:
            self._flush()

    def _flush(self) -> None:
        if self._rows:
            self._be.write_rows(self._block, self._written, self._rows)
            self._written += len(self._rows)
            self._rows = []

    def result(self):
        """The ``(rows added, n_cols)`` array, in ``dtype``."""
        be = self._be
        if self._block is not None:
            self._flush()
            return self._block if self._written == self._block.shape[0] else self._block[:self._written]
        if not self._rows:
            return be.zeros((0, self._n_cols), like=self._like, dtype=self._dtype)
        xp = be.xp(self._rows[0])
        stacked = xp.stack(self._rows, axis=0)
        return stacked if stacked.dtype == self._dtype else xp.astype(stacked, self._dtype)

