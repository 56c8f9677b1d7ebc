"""The problem a check works on: the configured backend, and ``fn`` with its inputs as
the core sees them."""
from __future__ import annotations

from typing import Callable

from agcheck.backends.registry import get_backend, infer_backend
from agcheck.errors import CheckInputError, OutputTypeError

__all__ = ["resolve_problem", "check_output_types", "restore_if_modified"]


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
    """Raise :class:`~agcheck.errors.OutputTypeError` unless every one of ``fn``'s
    ``outputs`` is an array of the backend (torch's checker fails on them with an
    ``AttributeError``)."""
    for k, o in enumerate(outputs):
        if not be.is_array(o):
            raise OutputTypeError(
                f"fn must return an array or a tuple of arrays, but output {k} is "
                f"{type(o).__name__}: {o!r:.80}"
            )


def restore_if_modified(be, args, positions, before) -> None:
    """Raise :class:`~agcheck.errors.CheckInputError`, the input restored, where ``fn``
    changed one of ``args[positions]`` in place since ``before`` (their ``be.snapshot``)."""
    for p, snap in zip(positions, before):
        if not be.unchanged(args[p], snap):
            be.restore(args[p], snap)
            raise CheckInputError(
                f"fn modified input {p} in place. A gradient check moves each input and "
                "compares results, so fn must leave its inputs unchanged: work on a copy "
                "(e.g. x = x.clone()) inside fn. The input has been restored."
            )
