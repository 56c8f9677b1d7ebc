"""``wrt=``: the positions of the inputs to differentiate, for backends whose arrays do
not say it themselves (JAX, TensorFlow)."""
from __future__ import annotations

import copy

import numpy as np


def normalize_wrt(wrt) -> tuple | None:
    """``wrt`` (an int, a tuple or list of ints, or ``None``) as a tuple of ints."""
    if wrt is None:
        return None
    items = (wrt,) if not isinstance(wrt, (tuple, list)) else tuple(wrt)
    for w in items:
        if isinstance(w, bool) or not isinstance(w, (int, np.integer)):
            raise TypeError(f"wrt must be an int or a tuple of ints, got {wrt!r}")
    items = tuple(int(w) for w in items)
    if not items:
        raise ValueError("wrt must name at least one input position, got an empty tuple")
    return items


def resolve_wrt(wrt: tuple, n_args: int) -> tuple:
    """The positions of ``wrt`` among ``n_args`` arguments (negative ones from the end)."""
    resolved = []
    for w in wrt:
        k = w + n_args if w < 0 else w
        if not 0 <= k < n_args:
            raise ValueError(f"wrt position {w} is out of range for {n_args} input(s)")
        if k in resolved:
            raise ValueError(f"wrt names input {k} more than once: {wrt!r}")
        resolved.append(k)
    return tuple(resolved)


class TakesWrt:
    """``with_options(wrt=...)`` for a backend whose checked inputs may be named by position:
    a per-call copy (``prepare()`` records state on it) with ``wrt`` set."""

    def with_options(self, **options):
        unknown = sorted(set(options) - {"wrt"})
        if unknown:
            raise TypeError(f"the {self.name!r} backend takes the extra keyword wrt= only, got {unknown}")
        new = copy.copy(self)
        new._per_call_copy()
        if "wrt" in options:
            new.wrt = normalize_wrt(options["wrt"])
            new._prepared = new._prepared_checked = None
        return new

    def _per_call_copy(self) -> None:
        """Make what a copy must not share with the backend it was copied from."""
