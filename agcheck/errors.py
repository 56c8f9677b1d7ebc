"""The exceptions for arguments a check cannot take (a failed check raises
:class:`agcheck.GradcheckError` instead).

Their types keep ``except`` clauses written for torch's checker working: where torch's
checker fails on such arguments with a ``RuntimeError`` of its own (a negative ``atol``,
``eps=0``, inputs on two devices), agcheck names the problem with an error that is a
``RuntimeError`` too.
"""
from __future__ import annotations

__all__ = ["CheckInputError", "GradOutputsError", "OutputTypeError", "BackendInferenceError"]


class CheckInputError(ValueError, RuntimeError):
    """An option, an input or the checked function that the check cannot work with: an
    option out of its range, inputs on two devices, a function that modifies its inputs.

    A ``ValueError``, and a ``RuntimeError``: what torch's checker raises in these cases
    (a message of its own, or a failed check).
    """


class GradOutputsError(CheckInputError, TypeError):
    """``grad_outputs`` given to gradgradcheck that cannot be ``fn``'s cotangents: an empty
    tuple or list.

    Also a ``TypeError``, what torch's checker raises then (it calls ``fn`` without its
    inputs).
    """


class OutputTypeError(TypeError, AttributeError):
    """``fn`` returned something that is not an array (or a tuple/list of arrays).

    Also an ``AttributeError``, the type torch raises in this case.
    """


class BackendInferenceError(TypeError, ValueError):
    """No backend can be inferred: no input is an array of a known framework.

    A ``TypeError``, and a ``ValueError``: what torch's checker raises for such inputs
    ("expects at least one input tensor to require gradient").
    """
