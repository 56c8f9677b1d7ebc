"""agcheck: a gradient checker for every array framework.

``agcheck.gradcheck`` has the semantics of ``torch.autograd.gradcheck`` (every keyword,
same defaults, same verdicts) on a core that imports no framework; backends supply the
framework-specific parts.
"""
from agcheck.backends.base import Backend
from agcheck.backends.registry import available_backends, get_backend, infer_backend, register_backend
from agcheck.crosscheck import CrosscheckResult, crosscheck
from agcheck.errors import BackendInferenceError, CheckInputError, GradOutputsError, OutputTypeError
from agcheck.gradcheck import CostWarning, gradcheck
from agcheck.gradgradcheck import gradgradcheck
from agcheck.frontends.dropin import Patch, check_grads, patch_jax, patch_torch
from agcheck.core.matrices import analytical_jacobian, numerical_jacobian
from agcheck.options import GradcheckOptions
from agcheck.report import GradcheckError

__version__ = "0.1.0"

__all__ = [
    "gradcheck",
    "gradgradcheck",
    "crosscheck",
    "patch_torch",
    "patch_jax",
    "check_grads",
    "Patch",
    "numerical_jacobian",
    "analytical_jacobian",
    "CrosscheckResult",
    "GradcheckError",
    "GradcheckOptions",
    "OutputTypeError",
    "CheckInputError",
    "GradOutputsError",
    "BackendInferenceError",
    "CostWarning",
    "Backend",
    "available_backends",
    "get_backend",
    "infer_backend",
    "register_backend",
]
