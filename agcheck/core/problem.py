"""The problem a check works on: the configured backend, and ``fn`` with its inputs as
the core sees them."""
from __future__ import annotations

import ctypes
from contextlib import contextmanager
from typing import Callable

import numpy as np

from agcheck.backends.registry import get_backend, infer_backend

__all__ = ["resolve_problem", "numpy_rng_preserved"]


def resolve_problem(fn: Callable, inputs, backend, backend_options: dict):
    """The configured backend, and ``fn`` with its inputs as the core sees them."""
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    if backend is not None:
        be = get_backend(backend, **backend_options)
    else:
        be = infer_backend(inputs, **backend_options)
    fn, args = be.prepare(fn, inputs)
    return be, fn, args


@contextmanager
def numpy_rng_preserved():
    """NumPy's global random state as it was, whatever the check (``fn``) drew.

    The state is read once before; it is written back only when the generator's words
    changed (a 2.5 kB comparison), which is what a check whose ``fn`` draws nothing saves."""
    state = np.random.get_state()
    fingerprint = _mt_words()
    try:
        yield
    finally:
        if fingerprint is None or _mt_words() != fingerprint:
            np.random.set_state(state)


def _mt_words() -> bytes | None:
    """The raw key and position of NumPy's global MT19937 (``None`` if not readable)."""
    try:
        address = np.random.mtrand._rand._bit_generator.ctypes.state_address
    except AttributeError:
        return None
    return ctypes.string_at(address, _MT_BYTES)


#: the MT19937 key (624 32-bit words) and its position (a C int)
_MT_BYTES = 624 * 4 + 4
