"""Evaluations shared by the two passes over a function with complex outputs.

Reverse mode checks such a function twice, as torch does: on the imaginary parts of its
outputs, then on the real parts, moving the same inputs by the same steps. The first
pass keeps the other part of its numerical evaluations, keyed by a digest of the moving
inputs' values (every other argument must be the very object given); the second takes
them instead of calling fn. Traced calls always call fn.

Digests (of CPU arrays only) and evaluations are timed on the thread's CPU clock, which a
busy machine's waits do not inflate.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Callable, Sequence

__all__ = ["SharedEvaluations", "sharing"]

#: sharing stops once a first pass's digests cost this fraction of its evaluations (each
#: move is digested in both passes and saves one evaluation: below one half, sharing pays)
DIGEST_SHARE_LIMIT = 0.4
#: evaluations timed before that rule applies
DIGEST_TIMED_CALLS = 4
#: evaluations timed for that rule (sizes hold through a pass: later ones pay no clock readings)
DIGEST_RULE_CALLS = 64


class SharedEvaluations:
    """The evaluations the ``first`` part's pass (``"imag"``, torch's order) keeps for the other
    part's pass: at most ``budget_bytes`` of outputs, keyed on the ``moving`` arguments."""

    def __init__(self, be, args: tuple, moving: Sequence[int], first: str, budget_bytes: int):
        self.be, self.args, self.first = be, tuple(args), first
        self.moving = frozenset(moving)
        self.budget_bytes = budget_bytes
        self.active = 0  # > 0 inside numerical evaluations
        self.enabled = True
        self.full = False  # the budget is spent: the first pass keeps nothing more
        self.kept_bytes = 0
        self.kept_calls = 0
        self.served = 0
        self._kept = {}
        self._digest_seconds = 0.0
        self._evaluation_seconds = 0.0
        self._clock = time.thread_time

    def evaluate(self, part_fn, args: tuple) -> tuple:
        """``part_fn(*args)``: kept for the other part in the first pass, taken in the second."""
        keeping = part_fn.part == self.first
        if not self.enabled or (keeping and self.full) or (not keeping and not self._kept):
            return part_fn.taken(part_fn.fn(*args))
        timed = keeping and self.kept_calls < DIGEST_RULE_CALLS
        began = self._clock() if timed else 0.0
        key = self._key(args)
        digested = self._clock() if timed else 0.0
        if key is None:
            return part_fn.taken(part_fn.fn(*args))
        if not keeping:
            kept = self._kept.pop(key, None)
            if kept is None:
                return part_fn.taken(part_fn.fn(*args))
            self.kept_bytes -= kept[1]
            self.served += 1
            return kept[0]
        outputs = self.be.as_tuple(part_fn.fn(*args))
        if timed:
            self._evaluation_seconds += self._clock() - digested
            self._digest_seconds += digested - began
        self._keep(key, part_fn.taken(outputs, "real" if self.first == "imag" else "imag"))
        return part_fn.taken(outputs)

    def _key(self, args: tuple):
        be, given = self.be, self.args
        if len(args) != len(given):
            return None
        key = []
        for p, (a, g) in enumerate(zip(args, given)):
            if p in self.moving and be.is_array(a):
                digest = be.content_digest(a)
                if digest is None:
                    return None
                key.append(digest)
            elif a is not g:
                return None
        return tuple(key)

    def _keep(self, key, outputs: tuple) -> None:
        be = self.be
        self.kept_calls += 1
        if self.kept_calls >= DIGEST_TIMED_CALLS and \
                self._digest_seconds > DIGEST_SHARE_LIMIT * self._evaluation_seconds:
            self.close()  # digests cost more than the evaluations they would save
            return
        size = sum(be.numel(o) * be.itemsize(o) for o in outputs if be.is_array(o))
        if self.kept_bytes + size > self.budget_bytes:
            self.full = True
            return
        kept = tuple(be.snapshot(o) if be.is_array(o) else o for o in outputs)
        previous = self._kept.get(key)
        if previous is not None:
            self.kept_bytes -= previous[1]
        self._kept[key] = (kept, size)
        self.kept_bytes += size

    def close(self) -> None:
        """Stop sharing and drop what was kept."""
        self.enabled = False
        self._kept.clear()
        self.kept_bytes = 0


@contextmanager
def sharing(fn: Callable):
    """Mark evaluations of ``fn`` inside this block as numerical ones, shared where ``fn`` has
    :class:`SharedEvaluations`."""
    shared = getattr(fn, "shared", None)
    if shared is None:
        yield
        return
    shared.active += 1
    try:
        yield
    finally:
        shared.active -= 1
