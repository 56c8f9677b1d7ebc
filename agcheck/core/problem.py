"""The problem a check works on: the configured backend, and ``fn`` with its inputs as
the core sees them."""
from __future__ import annotations

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
    """NumPy's global random state as it was, whatever the check drew."""
    state = np.random.get_state()
    try:
        yield
    finally:
        np.random.set_state(state)
