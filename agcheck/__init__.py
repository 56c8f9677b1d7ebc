"""agcheck: a gradient checker for every array framework.

``agcheck.gradcheck`` has the semantics of ``torch.autograd.gradcheck`` (every keyword,
same defaults, same verdicts) on a core that imports no framework; backends supply the
framework-specific parts.

The public names are loaded on first use: ``import agcheck`` alone (as pytest does for
the plugin of every project where agcheck is installed) costs almost nothing.
"""
from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

#: public name -> the module that defines it
_EXPORTS = {
    "gradcheck": "agcheck.gradcheck",
    "CostWarning": "agcheck.gradcheck",
    "gradgradcheck": "agcheck.gradgradcheck",
    "crosscheck": "agcheck.crosscheck",
    "CrosscheckResult": "agcheck.crosscheck",
    "patch_torch": "agcheck.frontends.dropin",
    "patch_jax": "agcheck.frontends.dropin",
    "patch_tensorflow": "agcheck.frontends.dropin",
    "check_grads": "agcheck.frontends.dropin",
    "Patch": "agcheck.frontends.dropin",
    "numerical_jacobian": "agcheck.core.matrices",
    "analytical_jacobian": "agcheck.core.matrices",
    "GradcheckError": "agcheck.errors",
    "GradcheckOptions": "agcheck.options",
    "OutputTypeError": "agcheck.errors",
    "CheckInputError": "agcheck.errors",
    "GradOutputsError": "agcheck.errors",
    "BackendInferenceError": "agcheck.errors",
    "Backend": "agcheck.backends.base",
    "available_backends": "agcheck.backends.registry",
    "get_backend": "agcheck.backends.registry",
    "infer_backend": "agcheck.backends.registry",
    "register_backend": "agcheck.backends.registry",
}

__all__ = list(_EXPORTS)

if TYPE_CHECKING:
    from agcheck.backends.base import Backend
    from agcheck.backends.registry import available_backends, get_backend, infer_backend, register_backend
    from agcheck.core.matrices import analytical_jacobian, numerical_jacobian
    from agcheck.crosscheck import CrosscheckResult, crosscheck
    from agcheck.errors import (BackendInferenceError, CheckInputError, GradcheckError, GradOutputsError,
                                OutputTypeError)
    from agcheck.frontends.dropin import Patch, check_grads, patch_jax, patch_tensorflow, patch_torch
    from agcheck.gradcheck import CostWarning, gradcheck
    from agcheck.gradgradcheck import gradgradcheck
    from agcheck.options import GradcheckOptions


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'agcheck' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))


class _Package(types.ModuleType):
    """Keeps ``agcheck.gradcheck`` (and the other functions named as their modules) a function
    when the import system sets the loaded submodule as an attribute of the package."""

    def __setattr__(self, name: str, value: Any) -> None:
        if isinstance(value, types.ModuleType) and _EXPORTS.get(name) == value.__name__:
            value = getattr(value, name, value)
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
