"""The error agcheck raises when a check fails, and the structured failure report every
error carries.

After a failure, :attr:`GradcheckError.report` (a :class:`FailureReport`) holds what went
wrong as data: the failing Jacobian blocks (:class:`JacobianBlock`) as NumPy arrays with
their largest differences, the options and backend of the check, and named diagnoses
(:class:`Diagnosis`, see :mod:`agcheck.report.diagnosis`), and what reproduces the check
(:class:`CheckContext`: function, test, versions, seeds, inputs, code); its
:meth:`~FailureReport.summary` follows torch's first line in the exception message, before
the rest of torch's text.

The modules, each importing only those above it:

* :mod:`agcheck.report.values` — numbers, indices and arrays as text and JSON data;
* :mod:`agcheck.report.render` — HTML (jinja2 templates in ``templates/``) and PNG
  (matplotlib), both imported when rendering;
* :mod:`agcheck.report.model` — the report as data: ``FailureReport``, ``JacobianBlock``,
  ``Entry``, ``Diagnosis``, ``CheckContext``;
* :mod:`agcheck.report.errors` — ``GradcheckError`` and the texts of its messages (what
  the checks, the core and the backends import);
* :mod:`agcheck.report.diagnosis` — the hypotheses, on report data alone;
* :mod:`agcheck.report.collect` — filling in a report after a failure (the only one that
  imports ``agcheck.core``; not imported here, so that the core can import the errors).

Nothing here runs on the passing path: reports are filled in only once a check failed.
"""
from __future__ import annotations

from agcheck.report.errors import GradcheckError
from agcheck.report.context import CheckContext
from agcheck.report.model import Diagnosis, Entry, FailureReport, JacobianBlock

__all__ = ["GradcheckError", "FailureReport", "JacobianBlock", "Entry", "Diagnosis", "CheckContext"]
