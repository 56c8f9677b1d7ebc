"""The problem a check works on: the backend, and ``fn`` with its inputs as the core sees them."""
from __future__ import annotations

from typing import Callable

from agcheck.backends.registry import get_backend, infer_backend
from agcheck.errors import OutputTypeError

__all__ = ["resolve_problem", "check_output_types"]


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


def check_output_types(be, outputs) -> None:
    """Raise :class:`OutputTypeError` unless every output is an array of the backend (torch's
    checker fails with an ``AttributeError``)."""
    for k, o in enumerate(outputs):
        if not be.is_array(o):
            raise OutputTypeError(
                f"fn must return an array or a tuple of arrays, but output {k} is "
                f"{type(o).__name__}: {o!r:.80}"
            )
