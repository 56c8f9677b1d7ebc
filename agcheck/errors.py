"""agcheck's exceptions: :class:`GradcheckError` for a failed check, and the errors for
arguments a check cannot take, each also of the type torch's checker raises there, so that
``except`` clauses written for torch keep working."""
from __future__ import annotations

from agcheck.report.model import FailureReport

__all__ = ["GradcheckError", "CheckInputError", "GradOutputsError", "OutputTypeError", "BackendInferenceError"]


class GradcheckError(RuntimeError):
    """A gradient check failed.

    Subclass of ``RuntimeError``, raised by :func:`agcheck.gradcheck` and
    :func:`agcheck.gradgradcheck` (unless ``raise_exception=False``).

    Attributes
    ----------
    check : str or None
        Short name of the check that failed (``"jacobian"``, ``"reentrant"``, ...).
    details : dict
        Structured facts about the failure (indices, max difference, ...).
    report : FailureReport
        The structured failure report: failing blocks as NumPy arrays, options, backend,
        diagnoses; ``report.summary()``, ``report.to_dict()``, ``report.save(path)``.
    """

    def __init__(self, message: str, *, check: str | None = None, details: dict | None = None):
        super().__init__(message)
        self.check = check
        self.details = dict(details or {})
        self.report = FailureReport(check=check, message=str(message), details=self.details)


# the public name, as tracebacks and ``repr`` show it (and as it was before this module)
GradcheckError.__module__ = "agcheck.report"


class CheckInputError(ValueError, RuntimeError):
    """An option out of its range, inputs on two devices, a function that modifies its inputs.

    A ``ValueError``, and a ``RuntimeError``: what torch's checker raises in these cases.
    """


class GradOutputsError(CheckInputError, TypeError):
    """``grad_outputs`` given to gradgradcheck that cannot be ``fn``'s cotangents (empty).

    Also a ``TypeError``, what torch's checker raises then (it calls ``fn`` without its inputs).
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
