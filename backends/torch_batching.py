"""The torch backend's vmap plumbing: torch's batching-fallback messages silenced inside
agcheck's own vmapped calls (:func:`_quiet_batching`), and backward passes vmapped by
``torch.func`` over stacked cotangents (:func:`_vmapped_vjps`).
"""
from __future__ import annotations

import threading
from contextlib import contextmanager

import torch

from agcheck.backends import torch_engine
from agcheck.backends.quiet import ignoring


#: functorch's switch for its "performance drop" message, printed by C++ past Python's
#: warning filters; torch has no getter for it (its default is on)
_set_fallback_message = getattr(torch._C._functorch, "_set_vmap_fallback_warning_enabled", None)
_batching_lock = threading.Lock()
_batching_users = 0


@contextmanager
def _quiet_batching():
    """Silence torch's "There is a performance drop because we have not yet implemented
    the batching rule for ..." messages inside agcheck's own vmapped evaluations: they
    are how agcheck computes, not something fn does, and torch's checker (which evaluates
    fn one element at a time there) never causes them. functorch prints them from C++,
    past Python's filters: its switch is off while any thread is inside, and back on (its
    default) after the last; the Python warning of the older vmap is filtered."""
    global _batching_users
    with _batching_lock:
        _batching_users += 1
        if _batching_users == 1 and _set_fallback_message is not None:
            _set_fallback_message(False)
    try:
        with ignoring("There is a performance drop"):
            yield
    finally:
        with _batching_lock:
            _batching_users -= 1
            if _batching_users == 0 and _set_fallback_message is not None:
                _set_fallback_message(True)


def _vmapped_vjps(outputs: tuple, inputs: tuple, stacked_cotangents, position: int = 0,
                  cotangents: tuple | None = None) -> list:
    """VJPs of ``outputs`` (their graph already built) with respect to ``inputs``, one per
    cotangent stacked along the first dimension of ``stacked_cotangents``, by
    ``torch.func.vmap`` over one backward pass: stacked the same way, ``None`` where a
    gradient is undefined. ``cotangents``, when given, holds every output's cotangent, and
    the stacked ones take the place of ``cotangents[position]``."""
    undefined = []

    def one(cotangent):
        given = (cotangent,) if cotangents is None else (*cotangents[:position], cotangent, *cotangents[position + 1:])
        grads = torch_engine.vjp(outputs, inputs, given)
        undefined[:] = [g is None for g in grads]
        return tuple(g for g in grads if g is not None)

    with _quiet_batching():
        defined = iter(torch.func.vmap(one)(stacked_cotangents))
    return [None if missing else next(defined) for missing in undefined]
