"""The structured failure report every :class:`GradcheckError` carries.

After a failure, :attr:`GradcheckError.report` (a :class:`FailureReport`) holds the failing
Jacobian blocks (:class:`JacobianBlock`), the check's options and backend, named diagnoses
(:class:`Diagnosis`, see :mod:`agcheck.diagnosis`) and what reproduces the check
(:class:`CheckContext`). Modules, each importing only those above it: ``values`` (numbers
and arrays as text and JSON), ``render`` (HTML and PNG), ``model``, ``messages``.
Nothing here runs on the passing path.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from agcheck.report.context import CheckContext
from agcheck.report.model import Diagnosis, Entry, FailureReport, JacobianBlock

if TYPE_CHECKING:
    from agcheck.errors import GradcheckError

__all__ = ["GradcheckError", "FailureReport", "JacobianBlock", "Entry", "Diagnosis", "CheckContext"]


def __getattr__(name: str) -> Any:
    # GradcheckError's module imports this package's model: loaded on first use, not here
    if name == "GradcheckError":
        from agcheck.errors import GradcheckError

        return GradcheckError
    raise AttributeError(f"module 'agcheck.report' has no attribute {name!r}")
