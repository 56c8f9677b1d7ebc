"""Stand-ins for ``torch.autograd.gradcheck`` and ``torch.autograd.gradgradcheck`` that run
agcheck (torch backend), and the originals they replace. :func:`agcheck.patch_torch`
(``agcheck.frontends.dropin``) installs them.

The stand-ins accept exactly torch's arguments (anything else is a ``TypeError``, as it is
for torch's functions) and pass every keyword on; failures are torch's ``GradcheckError``
(see ``torch_errors``).
"""
from __future__ import annotations

import importlib
import inspect

from agcheck.backends import dropin_checkers

__all__ = ["ORIGINALS", "REPLACEMENTS", "gradcheck", "gradgradcheck", "targets"]

#: the module ``torch.autograd.gradcheck`` (the attribute ``torch.autograd.gradcheck`` is
#: the function of the same name)
_MODULE = importlib.import_module("torch.autograd.gradcheck")

GRADCHECK_KEYWORDS = frozenset({
    "eps", "atol", "rtol", "raise_exception", "nondet_tol", "check_undefined_grad", "check_grad_dtypes",
    "check_batched_grad", "check_batched_forward_grad", "check_forward_ad", "check_backward_ad",
    "fast_mode", "masked",
})
GRADGRADCHECK_KEYWORDS = frozenset({
    "eps", "atol", "rtol", "gen_non_contig_grad_outputs", "raise_exception", "nondet_tol",
    "check_undefined_grad", "check_grad_dtypes", "check_batched_grad", "check_fwd_over_rev",
    "check_rev_over_rev", "fast_mode", "masked",
})

#: called as ``observer(kind, check, fn, inputs, kwargs)`` instead of ``check(fn, inputs,
#: **kwargs)`` when set (the drop-in frontend counts checks and saves reports through it)
observer = None

#: agcheck's own keywords (engine, memory_budget, stencil, progress) added to every routed
#: call; set by the outermost ``patch_torch(**keywords)``
defaults: dict = {}
AGCHECK_KEYWORDS = frozenset({"engine", "memory_budget", "stencil", "progress"})


def _run(kind, check, allowed, func, inputs, kwargs):
    unknown = sorted(set(kwargs) - allowed)
    if unknown:
        raise TypeError(f"{kind}() got an unexpected keyword argument {unknown[0]!r}")
    kwargs = dict(defaults, **kwargs, backend="torch")
    if observer is None:
        return check(func, inputs, **kwargs)
    return observer(kind, check, func, inputs, kwargs)


def gradcheck(func, inputs, **kwargs) -> bool:
    """agcheck's :func:`agcheck.gradcheck` (torch backend) in the place of
    ``torch.autograd.gradcheck``: torch's arguments, torch's verdicts and error type."""
    __tracebackhide__ = True
    return _run("gradcheck", dropin_checkers.gradcheck, GRADCHECK_KEYWORDS, func, inputs, kwargs)


def gradgradcheck(func, inputs, grad_outputs=None, **kwargs) -> bool:
    """agcheck's :func:`agcheck.gradgradcheck` (torch backend) in the place of
    ``torch.autograd.gradgradcheck``."""
    __tracebackhide__ = True
    kwargs_ = dict(kwargs)
    if grad_outputs is not None:
        kwargs_["grad_outputs"] = grad_outputs
    return _run("gradgradcheck", dropin_checkers.gradgradcheck, GRADGRADCHECK_KEYWORDS | {"grad_outputs"},
                func, inputs, kwargs_)


gradcheck.agcheck_dropin = "torch"
gradgradcheck.agcheck_dropin = "torch"


def _original(name):
    f = getattr(_MODULE, name)
    return getattr(f, "agcheck_original", f) if getattr(f, "agcheck_dropin", None) else f


#: torch's own functions, captured when this module is first imported
ORIGINALS = {"gradcheck": _original("gradcheck"), "gradgradcheck": _original("gradgradcheck")}
REPLACEMENTS = {"gradcheck": gradcheck, "gradgradcheck": gradgradcheck}
gradcheck.agcheck_original = ORIGINALS["gradcheck"]
gradgradcheck.agcheck_original = ORIGINALS["gradgradcheck"]
for _name, _f in REPLACEMENTS.items():  # introspection (inspect.signature) shows torch's parameters
    try:
        _f.__signature__ = inspect.signature(ORIGINALS[_name])
    except (TypeError, ValueError):
        pass


def targets() -> list:
    """``(original, replacement)`` pairs; every module attribute bound to an original is
    rebound to its replacement while the patch is active."""
    return [(ORIGINALS[name], REPLACEMENTS[name]) for name in ("gradcheck", "gradgradcheck")]


def ensure_bound_modules() -> None:
    """Import the modules that hold torch's functions, so that patching reaches them."""
    importlib.import_module("torch.autograd")


def failure_types() -> tuple:
    """The failures the drop-in observer counts and reports."""
    from agcheck.errors import GradcheckError

    return (GradcheckError,)
