"""The checkers the drop-ins route to, handed in from above.

The framework side of a drop-in (``torch_dropin``, ``jax_dropin``, ``tensorflow_dropin``)
calls :func:`agcheck.gradcheck` and :func:`agcheck.gradgradcheck`, which live in a layer
above the backends. :mod:`agcheck.frontends.dropin` hands them in with :func:`install`
when it is imported (before any drop-in is used), so that imports go one way.
"""
from __future__ import annotations

from typing import Callable

__all__ = ["install", "gradcheck", "gradgradcheck"]

_CHECKERS: dict[str, Callable] = {}


def install(gradcheck: Callable, gradgradcheck: Callable) -> None:
    """Set the checkers the drop-ins call."""
    _CHECKERS.update(gradcheck=gradcheck, gradgradcheck=gradgradcheck)


def _checker(name: str) -> Callable:
    try:
        return _CHECKERS[name]
    except KeyError:
        raise RuntimeError(f"agcheck's drop-ins have no {name} to call: import agcheck.frontends.dropin "
                           "(agcheck.patch_torch, patch_jax, patch_tensorflow) first") from None


def gradcheck(*args, **kwargs):
    """:func:`agcheck.gradcheck`, as installed."""
    __tracebackhide__ = True
    return _checker("gradcheck")(*args, **kwargs)


def gradgradcheck(*args, **kwargs):
    """:func:`agcheck.gradgradcheck`, as installed."""
    __tracebackhide__ = True
    return _checker("gradgradcheck")(*args, **kwargs)
