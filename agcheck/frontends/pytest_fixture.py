"""The ``agcheck`` fixture's object and the ``AgcheckFailure`` it raises, whose report is
saved once the test has failed. Imports no framework."""
from __future__ import annotations

import os
import re
import warnings

import pytest

__all__ = ["AgcheckFixture", "AgcheckReportWarning", "failure_type"]

#: the module users name the failure by (``agcheck.frontends.pytest_plugin.AgcheckFailure``)
PLUGIN_MODULE = "agcheck.frontends.pytest_plugin"


class AgcheckReportWarning(UserWarning):
    """A failure report could not be saved (the test's outcome is unchanged)."""


class Stash:
    """``config.stash`` / ``item.stash`` (pytest >= 7), or an attribute on older pytest."""

    def __init__(self, name: str):
        self.name = name
        self.key = pytest.StashKey[object]() if hasattr(pytest, "StashKey") else None

    def get(self, owner, default=None):
        if self.key is not None and hasattr(owner, "stash"):
            return owner.stash.get(self.key, default)
        return getattr(owner, self.name, default)

    def set(self, owner, value):
        if self.key is not None and hasattr(owner, "stash"):
            owner.stash[self.key] = value
        else:
            setattr(owner, self.name, value)
        return value

    def setdefault(self, owner, factory):
        value = self.get(owner)
        return value if value is not None else self.set(owner, factory())


PENDING = Stash("_agcheck_pending")    # item: the reports of the test's failed checks


# -- the failure type (made when first needed: it subclasses agcheck's GradcheckError) ---------

_FAILURE_TYPE = None


def failure_type() -> type:
    global _FAILURE_TYPE
    if _FAILURE_TYPE is None:
        from agcheck.errors import GradcheckError

        class AgcheckFailure(GradcheckError, AssertionError):
            """A check run through the ``agcheck`` fixture failed.

            Both an ``AssertionError`` (pytest shows it as a test failure) and an
            :class:`agcheck.GradcheckError` (``pytest.raises(agcheck.GradcheckError)`` still
            catches it). ``.report`` is the original error's report, ``.error`` the original
            error, ``.report_path`` where the report was saved (set when the test has failed
            and the report was saved; ``None`` otherwise).
            """

            def __init__(self, message, *, error=None, report_path=None):
                super().__init__(message, check=getattr(error, "check", None),
                                 details=getattr(error, "details", None))
                self.error = error
                self.report_path = report_path
                if error is not None and hasattr(error, "report"):
                    self.report = error.report

        AgcheckFailure.__module__ = PLUGIN_MODULE
        AgcheckFailure.__qualname__ = "AgcheckFailure"
        _FAILURE_TYPE = AgcheckFailure
    return _FAILURE_TYPE


def _slug(nodeid: str) -> str:
    s = re.sub(r"[^A-Za-z0-9_.-]+", "_", nodeid).strip("_.")
    return (s or "test")[-150:]


def warn(message: str) -> None:
    """An :class:`AgcheckReportWarning`; never an exception (``-W error`` included)."""
    try:
        warnings.warn(message, AgcheckReportWarning, stacklevel=3)
    except Warning:
        pass


class Pending:
    """The report of one failed check of a test, saved if the test fails."""

    def __init__(self, report, failure=None):
        self.report = report
        self.failure = failure
        self.path = None
        self.done = False


# -- the fixture object -----------------------------------------------------------------------

class AgcheckFixture:
    """What the ``agcheck`` fixture returns.

    It stands in for the package: ``gradcheck``, ``gradgradcheck`` and ``crosscheck`` run
    with the selected backend and raise :class:`AgcheckFailure`; every other public name
    (``agcheck.GradcheckError``, ...) is the package's.

    Attributes
    ----------
    backend : str or None
        The selected backend (``None``: inferred from the inputs); see :meth:`backend_for`.
    report_dir : str or None
        Where reports of failed checks are saved.
    saved : list of str
        Reports saved so far (in this session).
    """

    def __init__(self, backend=None, report_dir=None, nodeid="test", crosscheck_backends=(), saved=None,
                 item=None):
        self.backend = backend
        self.report_dir = report_dir
        self.nodeid = nodeid
        self.crosscheck_backends = list(crosscheck_backends)
        self.saved = saved if saved is not None else []
        self._item = item
        self._count = 0

    def __repr__(self) -> str:
        return f"<agcheck fixture backend={self.backend!r} report_dir={self.report_dir!r}>"

    def __getattr__(self, name):
        # only for names the fixture does not define: the package's public names
        if name.startswith("_"):
            raise AttributeError(name)
        import agcheck as package

        if name in getattr(package, "__all__", ()) or name == "AgcheckFailure":
            return failure_type() if name == "AgcheckFailure" else getattr(package, name)
        raise AttributeError(f"the agcheck fixture has no attribute {name!r} (neither has the agcheck package)")

    def __dir__(self):
        import agcheck as package

        return sorted(set(super().__dir__()) | set(getattr(package, "__all__", ())))

    # -- checks ------------------------------------------------------------------------
    def gradcheck(self, fn, inputs, **kwargs):
        """:func:`agcheck.gradcheck` with this fixture's backend; failures become :class:`AgcheckFailure`."""
        __tracebackhide__ = True
        from agcheck.gradcheck import gradcheck

        return self._run(gradcheck, fn, inputs, kwargs)

    def gradgradcheck(self, fn, inputs, grad_outputs=None, **kwargs):
        """:func:`agcheck.gradgradcheck` with this fixture's backend."""
        __tracebackhide__ = True
        from agcheck.gradgradcheck import gradgradcheck

        if grad_outputs is not None:
            kwargs["grad_outputs"] = grad_outputs
        return self._run(gradgradcheck, fn, inputs, kwargs)

    def crosscheck(self, fn, inputs, **kwargs):
        """:func:`agcheck.crosscheck`; ``backends`` defaults to the ``--agcheck-backend``
        list when it names two or more backends."""
        __tracebackhide__ = True
        from agcheck.crosscheck import crosscheck

        if "backends" not in kwargs and len(self.crosscheck_backends) >= 2:
            kwargs["backends"] = tuple(self.crosscheck_backends)
        return self._call(crosscheck, fn, inputs, kwargs)

    def backend_for(self, inputs, **kwargs):
        """The backend a check of ``inputs`` with keywords ``kwargs`` runs on (``None``: inferred).

        ``kwargs["backend"]`` when given; otherwise the selected backend, unless the inputs
        are arrays of another framework or the check is given NumPy derivatives (``vjp=``/``jvp=``).
        """
        if kwargs.get("backend") is not None:
            return kwargs["backend"]
        if self.backend is None or "vjp" in kwargs or "jvp" in kwargs:
            return None
        from agcheck.backends.registry import canonical_name, infer_backend

        try:
            own = infer_backend(inputs).name
        except Exception:  # no framework's arrays (or a mix): the check says what is wrong
            return self.backend
        if own != canonical_name(self.backend) and own != "numpy":
            return None  # another framework's arrays: inferred from them
        return self.backend

    def _run(self, check, fn, inputs, kwargs):
        __tracebackhide__ = True
        backend = self.backend_for(inputs, **kwargs)
        if backend is not None:
            kwargs["backend"] = backend
        return self._call(check, fn, inputs, kwargs)

    def _call(self, check, fn, inputs, kwargs):
        __tracebackhide__ = True
        from agcheck.errors import GradcheckError

        try:
            return check(fn, inputs, **kwargs)
        except GradcheckError as e:
            if isinstance(e, failure_type()):
                raise
            failure = self.failure(e)
        raise failure

    # -- failures ----------------------------------------------------------------------
    def failure(self, error):
        """The :class:`AgcheckFailure` for ``error``, its message followed by the report summary.
        Within a test the report is saved if the test fails; outside one, at once."""
        message = str(error)
        report = getattr(error, "report", None)
        summary = ""
        if report is not None and hasattr(report, "summary"):
            try:
                summary = report.summary()
            except Exception as exc:  # a broken report must not hide the failure
                summary = f"(the failure report could not be summarised: {exc!r})"
        if summary and summary.strip() not in message:
            message = message.rstrip("\n") + "\n\n" + summary
        if self._item is not None:
            failure = failure_type()(message, error=error)
            if self.report_dir and report is not None and hasattr(report, "save"):
                pending(self._item).append(Pending(report, failure))
        else:
            path = self.save_report(report)
            if path:
                message = message.rstrip("\n") + f"\n\nagcheck report saved to {path}"
            failure = failure_type()(message, error=error, report_path=path)
        if any(c.__module__ == "torch.autograd.gradcheck" for c in type(error).__mro__):
            from agcheck.backends.torch_errors import adopt  # torch is imported: the error is torch's

            adopt(failure)  # still caught by torch's GradcheckError, as the error it replaces
        return failure

    def save_report(self, report) -> str | None:
        """Save ``report`` in the report folder now; the path, or ``None``. A folder or file that
        cannot be written is an :class:`AgcheckReportWarning`, never an exception."""
        path, _ = self._save(report)
        return path

    def _save(self, report) -> tuple:
        """``(path, None)`` or ``(None, why not)``."""
        if not self.report_dir or report is None or not hasattr(report, "save"):
            return None, None
        self._count += 1
        stem = _slug(self.nodeid) + ("" if self._count == 1 else f"-{self._count}")
        base = os.path.join(self.report_dir, stem)
        try:
            os.makedirs(self.report_dir, exist_ok=True)
        except OSError as e:
            why = f"cannot create the report folder {self.report_dir}: {type(e).__name__}: {e}"
            warn(f"agcheck report of {self.nodeid} not saved: {why}")
            return None, why
        problems = []
        for ext in (".html", ".json"):
            try:
                path = report.save(base + ext)
            except Exception as e:  # no matplotlib for HTML, a full disk, ...: the next format
                problems.append(f"{ext}: {type(e).__name__}: {e}")
                continue
            path = os.fspath(path) if path else base + ext
            if path not in self.saved:
                self.saved.append(path)
            return path, None
        why = "; ".join(problems)
        warn(f"agcheck report of {self.nodeid} not saved in {self.report_dir}: {why}")
        return None, why


def pending(item) -> list:
    return PENDING.setdefault(item, list)
