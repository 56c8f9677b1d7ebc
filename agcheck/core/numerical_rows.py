"""The numerical Jacobian rows of one check, kept once for every pass that reads them.

Rows are kept per function, arguments and input position, marked where computed element
by element (bit for bit the reference engine's), which the reference engine and a
following forward-mode pass take instead of computing them again.

Rows are written into one array per output: kept as separate arrays between a batch's
large temporaries they fragment the C allocator (a forward-mode check of 2,000 inputs
peaked at 275-342 MB so, against 155 MB written into blocks).
"""
from __future__ import annotations

import numpy as np

__all__ = ["NumericalRows", "InputRows", "runs"]


class NumericalRows:
    """A check's rows per ``(fn, args, input position)``, matched by identity (the objects are
    held, so that an ``id`` cannot be reused)."""

    def __init__(self, be, wanted: bool):
        self.be = be
        #: whether a forward-mode pass follows a slow reverse-mode pass (else rows are dropped)
        self.wanted = wanted
        self._entries = []  # [(fn, args, position, InputRows)]

    def of(self, fn, args, position: int, n: int | None = None) -> InputRows | None:
        """The rows kept for input ``position`` of ``fn`` at ``args``: new where there are none
        and ``n`` is given, else ``None``."""
        for f, a, p, rows in self._entries:
            if f is fn and p == position and len(a) == len(args) and all(x is y for x, y in zip(a, args)):
                return rows
        if n is None:
            return None
        rows = InputRows(self.be, n)
        self._entries.append((fn, tuple(args), position, rows))
        return rows

    def piece_done(self, forward: bool) -> None:
        """Drop a piece's rows unless a forward-mode pass may take them."""
        if forward or not self.wanted:
            self.clear()

    def clear(self) -> None:
        self._entries.clear()


class InputRows:
    """One input's ``n`` rows per floating output: which are kept (``filled``), which computed
    element by element (``exact``), and the blocks since the last from row 0 (``bounds``)."""

    def __init__(self, be, n: int):
        self.be, self.n = be, n
        self.filled = np.zeros(n, dtype=bool)
        self.exact = np.zeros(n, dtype=bool)
        self.bounds: list[tuple[int, int]] = []
        self._arrays = {}  # output position -> (n, m) array
        self._like = {}  # output position -> an empty array of the rows' kind, where kept in NumPy

    def add(self, start: int, stop: int, rows: dict, exact: bool) -> None:
        """Rows ``start:stop`` (``{output position: (stop - start, m) array}``)."""
        if start == 0:
            self.bounds = []
        self.bounds.append((start, stop))
        for k, r in rows.items():
            self._write(k, start, r)
        self.filled[start:stop] = True
        self.exact[start:stop] = exact

    def _write(self, k, start, rows) -> None:
        be, n = self.be, self.n
        whole = be.owned_rows(rows) if start == 0 and int(rows.shape[0]) == n else None
        if whole is not None:  # a copy would hold the rows twice
            self._arrays[k] = whole
            self._like.pop(k, None)
            return
        if k not in self._arrays:
            block = be.row_block(n, int(rows.shape[1]), rows, rows.dtype)
            if block is None:  # immutable arrays
                self._like[k] = rows[:0]
                block = np.empty((n, int(rows.shape[1])), dtype=be.to_numpy(rows).dtype)
            self._arrays[k] = block
        if k in self._like:
            self._arrays[k][start:start + int(rows.shape[0])] = be.to_numpy(rows)
        elif int(rows.shape[0]):
            be.write_rows(self._arrays[k], start, rows)

    def complete(self) -> bool:
        return bool(self.filled.all())

    def rows(self, start: int, stop: int) -> dict:
        """``{output position: rows start:stop}``, arrays of the rows' framework."""
        return {k: self.be.array_like(a[start:stop], self._like[k]) if k in self._like else a[start:stop]
                for k, a in self._arrays.items()}

    def blocks(self, exact_only: bool) -> list:
        """``[(start, stop, rows)]``: the runs of kept rows (``exact_only``: of those computed
        element by element), in order."""
        return [(s, e, self.rows(s, e)) for s, e in runs(self.exact if exact_only else self.filled)]

    def numpy(self) -> dict | None:
        """``{output position: (n, m) NumPy rows}``, or ``None`` unless every row is kept."""
        if not self.n or not self.complete():
            return None
        return {k: a if k in self._like else self.be.to_numpy(a) for k, a in self._arrays.items()}


def runs(mask: np.ndarray) -> list[tuple[int, int]]:
    """The ``(start, stop)`` runs of ``True`` in a boolean vector, in order."""
    edges = np.flatnonzero(np.diff(np.concatenate([[False], mask, [False]]).astype(np.int8)))
    return [(int(s), int(e)) for s, e in zip(edges[::2], edges[1::2])]
