"""Small example functions for agcheck's demo (``python -m agcheck``).

Two custom ``torch.autograd.Function`` s with the same forward, ``exp(x)``:

- :class:`Exp` has the correct backward, ``grad_output * exp(x)``;
- :class:`ScaledBackwardExp` has a broken one, scaled by 2 — the kind of slip
  (a factor dropped or doubled in a hand-written formula) that a gradient check
  exists to catch.

This module needs torch; importing it without torch raises ``ImportError``.
"""
from __future__ import annotations

import torch

__all__ = ["Exp", "ScaledBackwardExp", "correct_fn", "broken_fn", "demo_inputs", "EXAMPLES"]


class Exp(torch.autograd.Function):
    """``exp(x)`` with a correct hand-written backward."""

    @staticmethod
    def forward(ctx, x):
        y = torch.exp(x)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad_output):
        (y,) = ctx.saved_tensors
        return grad_output * y


class ScaledBackwardExp(torch.autograd.Function):
    """``exp(x)`` whose backward is wrong by a factor of 2."""

    @staticmethod
    def forward(ctx, x):
        y = torch.exp(x)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad_output):
        (y,) = ctx.saved_tensors
        return 2 * grad_output * y  # the bug: the derivative of exp is exp, not 2 exp


def correct_fn(x):
    """``exp(x)`` through :class:`Exp` (its gradient is right)."""
    return Exp.apply(x)


def broken_fn(x):
    """``exp(x)`` through :class:`ScaledBackwardExp` (its gradient is twice too large)."""
    return ScaledBackwardExp.apply(x)


def demo_inputs(seed: int = 0, size: int = 3):
    """The demo's inputs: one float64 vector that requires grad.

    Drawn from a private generator, so the caller's global RNG state is untouched.
    """
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(size, generator=gen, dtype=torch.float64)
    return (x.requires_grad_(),)


#: (name, function, whether agcheck.gradcheck should pass it)
EXAMPLES = (
    ("exp with a correct backward", correct_fn, True),
    ("exp with its backward scaled by 2", broken_fn, False),
)
