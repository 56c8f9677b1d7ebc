"""Reverse-mode products through torch's autograd engine, called directly.

``torch.autograd.grad`` spends about half of a small VJP's time in Python before it reaches
the engine: normalising its arguments, checking each cotangent against its output
(:func:`torch.autograd._make_grads`) and deciding on logging hooks. The VJPs agcheck takes
(one-hot, zero and projection cotangents it built itself, for outputs of plain tensors)
need none of it, so :func:`vjp` hands them to the engine as ``grad`` would, with the same
keyword values (``allow_unused=True``; ``create_graph`` for gradgradcheck's differentiable
VJPs), and the same thread-local context. The cotangent checks are also where torch's
first ``grad`` with a cotangent imports sympy (about 0.4 s), which agcheck's checks then
never pay. Whatever it cannot vouch for goes through ``torch.autograd.grad`` itself:
tensor subclasses (``__torch_function__``), nested tensors, cotangents that do not match
their outputs, autograd debug logging, and a torch without these internals (or whose
entry point fails a tiny known backward at import).
"""
from __future__ import annotations

import contextvars
import logging

import torch
from torch.overrides import has_torch_function

__all__ = ["vjp", "direct_engine_available"]

_ENGINE = getattr(getattr(torch.autograd, "Variable", None), "_execution_engine", None)
_STASH = getattr(torch._C, "_stash_obj_in_tls", None)
_UNSTASH = getattr(torch._C, "_remove_obj_from_tls", None)
_AUTOGRAD_LOG = logging.getLogger("torch.autograd.graph")


def direct_engine_available() -> bool:
    """Whether this torch exposes the engine entry point that :func:`vjp` calls."""
    return _ENGINE is not None and hasattr(_ENGINE, "run_backward") and _STASH is not None and _UNSTASH is not None


def _direct_call_works() -> bool:
    """One tiny backward through the direct call, checked against its known gradient: a
    torch whose entry point takes other arguments leaves every VJP to ``grad``."""
    if not direct_engine_available():
        return False
    try:
        # whatever grad mode the import happens under (a first check inside no_grad)
        with torch.inference_mode(False), torch.enable_grad():
            x = torch.ones(2, dtype=torch.float64, requires_grad=True)
            out, cot = x * x * 3, torch.ones(2, dtype=torch.float64)
            _STASH("context", contextvars.copy_context())
            try:
                (g,) = _ENGINE.run_backward((out,), (cot,), True, True, (x,), True, False)
                (gg,) = _ENGINE.run_backward((g,), (cot,), False, False, (x,), True, False)
            finally:
                _UNSTASH("context")
        six = torch.full((2,), 6.0, dtype=torch.float64)
        return bool(torch.equal(g.detach(), six) and torch.equal(gg, six))
    except Exception:  # noqa: BLE001 - any surprise: torch.autograd.grad for every VJP
        return False


_DIRECT = _direct_call_works()


def _matching(outputs: tuple, cotangents: tuple) -> bool:
    for o, c in zip(outputs, cotangents):
        if (type(c) is not torch.Tensor or o.is_nested or o.shape != c.shape
                or o.dtype.is_complex != c.dtype.is_complex):
            return False
    return len(outputs) == len(cotangents) > 0


def vjp(outputs: tuple, inputs: tuple, cotangents: tuple, retain_graph: bool = True,
        create_graph: bool = False) -> tuple:
    """``torch.autograd.grad(outputs, inputs, cotangents, retain_graph=retain_graph,
    create_graph=create_graph, allow_unused=True)``: one gradient (or ``None``) per input."""
    if (not _DIRECT or has_torch_function(outputs + inputs + cotangents) or not _matching(outputs, cotangents)
            or _AUTOGRAD_LOG.isEnabledFor(logging.DEBUG)):
        return torch.autograd.grad(outputs, inputs, cotangents, retain_graph=retain_graph,
                                   create_graph=create_graph, allow_unused=True)
    # torch.autograd.grad keeps the caller's context for the engine's device threads
    _STASH("context", contextvars.copy_context())
    try:
        return _ENGINE.run_backward(outputs, cotangents, retain_graph, create_graph, inputs, True, False)
    finally:
        _UNSTASH("context")
