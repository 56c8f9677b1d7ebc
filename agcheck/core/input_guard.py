"""Checked inputs that ``fn`` changes in place, at any of its calls: found, named, undone.

A function that writes into its input (a lazily initialised normalisation, a ``clamp_``
under ``no_grad`` that fires for some moves only) makes every later comparison meaningless.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from agcheck.errors import CheckInputError

__all__ = ["InputGuard"]


class InputGuard:
    """The checked inputs ``args[positions]`` of one check, watched for in-place changes.

    ``snapshots`` (``{position: snapshot}``), taken before a call of ``fn`` the caller made,
    stand for the guard's own, so that a change that call made is found too.
    """

    def __init__(self, be, args: tuple, positions, snapshots: dict | None = None):
        self.be, self.args, self.positions = be, args, list(positions)
        taken = snapshots or {}
        self.snapshots = [taken[p] if p in taken else be.snapshot(args[p]) for p in self.positions]
        #: calls of the watched fn; the first that moved an input's modification count, and those inputs
        self.calls = 0
        self.changed_at: int | None = None
        self.written: list[int] = []
        self._reported = False
        #: whether every call of fn is watched (then a stage whose calls moved no count needs no
        #: comparison: the last one, always made, still finds writes past the counts)
        self.watching = False
        #: what the check was doing when the guard last found the inputs unchanged
        self.stage = "its first call"

    def watch(self, fn: Callable) -> Callable:
        """``fn``, noting the first call that moved an input's modification count (``fn`` itself
        where the backend keeps none)."""
        be, args = self.be, self.args
        counted = [p for p in self.positions if be.modification_count(args[p]) is not None]
        if not counted:
            return fn
        self.watching = True

        def counts():
            return [be.modification_count(args[p]) for p in counted]

        def watched(*a):
            self.calls += 1
            before = counts()
            out = fn(*a)
            if self.changed_at is None:
                after = counts()
                if after != before:
                    self.changed_at = self.calls
                    self.written = [p for p, b, c in zip(counted, before, after) if b != c]
            return out

        watched.__wrapped__ = fn  # type: ignore[attr-defined]
        watched.__name__ = getattr(fn, "__name__", "fn")
        return watched

    def checkpoint(self, next_stage: str) -> None:
        """:meth:`verify`, unless every call so far was watched and none moved a count."""
        if self.watching and self.changed_at is None:
            self.stage = next_stage
            return
        self.verify(next_stage)

    def verify(self, next_stage: str | None = None, cause: BaseException | None = None) -> None:
        """Restore bitwise every checked input ``fn`` changed and raise :class:`CheckInputError`
        naming it; an interrupt (``cause``) is left to propagate, the inputs restored."""
        be = self.be
        changed = []  # (position, how it changed)
        for p, snap in zip(self.positions, self.snapshots):
            x = self.args[p]
            if not be.unchanged(x, snap):
                changed.append((p, _how_much(be, x, snap)))
                be.restore(x, snap)
            elif p in self.written:  # written by fn, then put back by the check's own restore
                changed.append((p, "its values were written over (the check's restore of a move undid them)"))
        if changed and not self._reported and (cause is None or isinstance(cause, Exception)):
            self._reported = True
            raise CheckInputError(self._message(changed)) from cause
        if next_stage is not None:
            self.stage = next_stage

    def _message(self, changed: list) -> str:
        if self.changed_at is not None:
            when = (f"at its call {self.changed_at} in this check" if self.changed_at > 1 else "at its first call")
        elif self.stage == "its first call":
            when = "at its first call"
        else:
            when = f"at a later call, during {self.stage}"
        (first, how), others = changed[0], [p for p, _ in changed[1:]]
        also = f" (and {', '.join(f'input {p}' for p in others)})" if others else ""
        return (
            f"fn modified input {first} in place{also} {when}: {how or 'its values changed'}. A gradient check "
            "moves each input and compares results, so fn must leave its inputs unchanged: work on a copy "
            "(x = x.clone() in torch, x.copy() in NumPy) inside fn. The input has been restored, and the check "
            "stopped: a mismatch after the change would come from the changed input, not from the derivative."
        )


def _how_much(be, x, snapshot) -> str:
    """``"k of n elements changed, by up to d"``; empty where it cannot say (a sparse snapshot)."""
    try:
        now, then = np.asarray(be.to_numpy(x)), np.asarray(be.to_numpy(snapshot))
    except Exception:  # the figure is a courtesy of the message: never a new error
        return ""
    if now.shape != then.shape:
        return f"its shape changed from {then.shape} to {now.shape}"
    with np.errstate(invalid="ignore"):
        moved = ~((now == then) | (np.isnan(now) & np.isnan(then)))
        by = np.abs(now[moved] - then[moved])
    largest = float(np.nanmax(by)) if by.size and not np.all(np.isnan(by)) else float("nan")
    return f"{int(moved.sum())} of {now.size} elements changed, by up to {largest:.3g}"
