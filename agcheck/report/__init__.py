"""The error agcheck raises when a check fails, and the structured failure report every
error carries.

After a failure, :attr:`GradcheckError.report` (a :class:`FailureReport`) holds what went
wrong as data: the failing Jacobian blocks (:class:`JacobianBlock`) as NumPy arrays with
their largest differences, the options and backend of the check, and named diagnoses
(:class:`Diagnosis`, see :mod:`agcheck.diagnosis`), and what reproduces the check
(:class:`CheckContext`: function, test, versions, seeds, inputs, code); its
:meth:`~FailureReport.summary` follows torch's first line in the exception message, before
the rest of torch's text.

The modules, each importing only those above it:

* :mod:`agcheck.report.values` — numbers, indices and arrays as text and JSON data;
* :mod:`agcheck.report.render` — HTML (jinja2 templates in ``templates/``) and PNG
  (matplotlib), both imported when rendering;
* :mod:`agcheck.report.model` — the report as data: ``FailureReport``, ``JacobianBlock``,
  ``Entry``, ``Diagnosis``, ``CheckContext``;
* :mod:`agcheck.report.messages` — the texts of a failed check's messages.

The error itself is :class:`agcheck.errors.GradcheckError` (also importable from here);
the hypotheses live in :mod:`agcheck.diagnosis`, and :mod:`agcheck.core.report_filling`
fills a report in after a failure. Nothing here runs on the passing path.
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
