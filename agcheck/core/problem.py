"""The problem a check works on: the configured backend, and ``fn`` with its inputs as
the core sees them."""
from __future__ import annotations

from typing import Callable

from agcheck.backends.registry import get_backend, infer_backend

__all__ = ["resolve_problem"]


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
