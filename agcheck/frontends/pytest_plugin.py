"""The agcheck pytest plugin: an ``agcheck`` fixture, backend parametrization and failure
reports saved next to the test run.

Registered through the ``pytest11`` entry point (``agcheck = "agcheck.frontends.pytest_plugin"``),
so installing agcheck enables it; without the entry point, enable it with
``-p agcheck.frontends.pytest_plugin`` or ``pytest_plugins = ["agcheck.frontends.pytest_plugin"]``.

Every pytest run of a project that has agcheck installed loads this module, so it imports
nothing of agcheck's checker and no framework itself: they are imported when a fixture
runs a check or an option asks for them.

Fixtures
--------
``agcheck``
    An :class:`AgcheckFixture`: ``agcheck.gradcheck(fn, inputs, **kw)``,
    ``agcheck.gradgradcheck(...)`` and ``agcheck.crosscheck(...)`` with the backend chosen
    on the command line (or by the ``agcheck_backend`` parameter of the test). Every other
    public name of the package is the package's (``agcheck.GradcheckError``, ...), so the
    fixture stands in for the module it shadows. A failed check raises
    :class:`AgcheckFailure` (an ``AssertionError`` and an :class:`agcheck.GradcheckError`)
    whose message ends with the failure report's summary.
``agcheck_backend``
    The name of a backend. Tests that request it run once per backend given with
    ``--agcheck-backend`` (``torch`` when none is given); backends whose framework is not
    installed are skipped.

Options
-------
``--agcheck-backend NAME``
    Backend(s) for the fixtures; repeat it or separate names with commas
    (``--agcheck-backend torch,jax``). Also the ini setting ``agcheck_backend``. The
    selected backend applies to checks whose inputs it can take: a check whose inputs are
    arrays of another framework (torch tensors under ``--agcheck-backend jax``) runs on
    that framework's backend, and one given NumPy derivatives (``vjp=``/``jvp=``) on the
    NumPy backend.
``--agcheck-torch``
    Route ``torch.autograd.gradcheck`` / ``gradgradcheck`` (and every name bound to them,
    also by conftest files and test modules) to agcheck for the whole run; the patch is
    installed before the initial conftest files are imported. Failures keep torch's
    message and error type and add agcheck's report summary; the terminal summary counts
    the checks that went through agcheck. Also the ini setting ``agcheck_torch = true``.
``--agcheck-engine NAME``
    agcheck's engine for the checks ``--agcheck-torch`` routes (``reference``: torch's
    element-by-element algorithm, so the suite's functions run as often as under torch).
    Also the ini setting ``agcheck_engine``.
``--agcheck-jax``
    The same for ``jax.test_util.check_grads`` (ini: ``agcheck_jax = true``).
``--agcheck-tf``
    Route ``tf.test.compute_gradient`` (and every name bound to it) to agcheck's Jacobians:
    the same return layout and numbers; where the two Jacobians of a call differ, a warning
    (logger ``agcheck.tensorflow``, shown with a failing test's captured log) names the
    largest difference. Also the ini setting ``agcheck_tf = true``.
``--agcheck-jax-account direction|full``
    How a failing check ``--agcheck-jax`` routes is explained: ``direction`` (the default)
    from the check's own evaluations, ``full`` by the failing level's full Jacobians (their
    report is what ``--agcheck-report-dir`` saves). Also the ini setting
    ``agcheck_jax_account``.
``--agcheck-report-dir DIR``
    For every test that fails, save the reports of its failed checks (of the fixtures,
    and of the suite's own checks under ``--agcheck-torch`` / ``--agcheck-jax``) as
    ``DIR/<test id>.html`` (``.json`` when the HTML report cannot be written, e.g. without
    matplotlib). A test that expects the failure (``pytest.raises``) and passes saves
    nothing. A report that cannot be saved is an :class:`AgcheckReportWarning`, never a
    change of the test's outcome. Also the ini setting ``agcheck_report_dir``.

Every option is checked when pytest starts: an unknown backend or engine is a
``pytest.UsageError``. Nothing here imports torch or jax.
"""
from __future__ import annotations

import difflib
import os
import re
import sys
import warnings

import pytest

__all__ = ["AgcheckFixture", "AgcheckFailure", "AgcheckReportWarning", "DEFAULT_BACKEND", "configured_backends",
           "configured_report_dir"]

#: the backend of ``agcheck_backend`` when no ``--agcheck-backend`` is given
DEFAULT_BACKEND = "torch"

#: the name of the test report's ``user_properties`` entry naming a saved report (it also
#: carries the list from pytest-xdist's workers to the run's terminal summary)
REPORT_PROPERTY = "agcheck_report"
#: the same for a report that could not be saved (the reason)
UNSAVED_PROPERTY = "agcheck_report_not_saved"

_JAX_ACCOUNTS = ("direction", "full")


class AgcheckReportWarning(UserWarning):
    """A failure report could not be saved in the report folder (the test's outcome is
    unchanged)."""


class _Stash:
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


_REPORTS = _Stash("_agcheck_reports")    # config: the reports saved (and not) in this run
_PENDING = _Stash("_agcheck_pending")    # item: the reports of the test's failed checks
_DROPIN = _Stash("_agcheck_dropin")      # config: the drop-in session


# -- options ----------------------------------------------------------------------------------

def pytest_addoption(parser):
    group = parser.getgroup("agcheck", "agcheck gradient checks")
    group.addoption(
        "--agcheck-backend", action="append", default=None, metavar="NAME",
        help="backend for the agcheck fixtures (torch, jax, numpy, ...); repeat it or separate "
             "names with commas to run tests using the agcheck_backend fixture once per backend",
    )
    group.addoption(
        "--agcheck-report-dir", action="store", default=None, metavar="DIR",
        help="save the reports of the failed agcheck checks of every failing test in DIR "
             "(HTML, JSON without matplotlib)",
    )
    group.addoption(
        "--agcheck-torch", action="store_true", default=None,
        help="run torch.autograd.gradcheck / gradgradcheck (and every name bound to them) through agcheck",
    )
    group.addoption(
        "--agcheck-jax", action="store_true", default=None,
        help="run jax.test_util.check_grads (and every name bound to it) through agcheck",
    )
    group.addoption(
        "--agcheck-tf", action="store_true", default=None,
        help="compute tf.test.compute_gradient's Jacobians (and every name bound to it) with agcheck",
    )
    group.addoption(
        "--agcheck-engine", action="store", default=None, metavar="NAME",
        help="agcheck's engine for the checks routed by --agcheck-torch (auto, batched, reference; "
             "reference evaluates the suite's functions exactly as often as torch's checker)",
    )
    group.addoption(
        "--agcheck-jax-account", action="store", default=None, choices=_JAX_ACCOUNTS,
        help="how agcheck explains a failing check routed by --agcheck-jax: direction (default, from the "
             "check's own evaluations) or full (the failing level's full Jacobians, element by element)",
    )
    parser.addini("agcheck_engine", "agcheck's engine for the checks routed by agcheck_torch", default="")
    parser.addini("agcheck_jax_account", "agcheck's account of failures routed by agcheck_jax (direction, full)",
                  default="")
    parser.addini("agcheck_torch", "route torch.autograd.gradcheck/gradgradcheck to agcheck", type="bool",
                  default=False)
    parser.addini("agcheck_jax", "route jax.test_util.check_grads to agcheck", type="bool", default=False)
    parser.addini("agcheck_tf", "route tf.test.compute_gradient to agcheck", type="bool", default=False)
    parser.addini("agcheck_backend", "default backend(s) for the agcheck fixtures (comma-separated)", default="")
    parser.addini("agcheck_report_dir", "folder for the reports of failed agcheck checks", default="")


def _split(values) -> list:
    names = []
    for v in values or ():
        for name in str(v).split(","):
            name = name.strip()
            if name and name not in names:
                names.append(name)
    return names


def _option(config, name: str):
    """``config.getoption(name)``, also while the initial conftests load (when only the
    known arguments are parsed)."""
    value = config.getoption(name, None)
    if value is None:
        value = getattr(getattr(config, "known_args_namespace", None), name, None)
    return value


def configured_backends(config) -> list:
    """The backends named by ``--agcheck-backend`` (or the ini setting), in order."""
    names = _split(_option(config, "agcheck_backend"))
    if not names:
        names = _split([config.getini("agcheck_backend")])
    return names


def configured_report_dir(config) -> str | None:
    """The report folder (``--agcheck-report-dir`` or the ini setting), absolute; ``None``
    when none is configured."""
    d = _option(config, "agcheck_report_dir") or config.getini("agcheck_report_dir") or None
    if d and not os.path.isabs(d):
        d = os.path.join(str(config.invocation_params.dir), d)
    return d


def _setting(config, name: str) -> str:
    """``--agcheck-NAME`` or the ini setting ``agcheck_NAME`` (``""`` when neither is set)."""
    value = _option(config, f"agcheck_{name}")
    if value:
        return str(value)
    try:
        return str(config.getini(f"agcheck_{name}") or "").strip()
    except (ValueError, KeyError):
        return ""


def _unknown(kind: str, given: str, known) -> str:
    known = list(known)
    close = difflib.get_close_matches(given, known, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"unknown {kind} {given!r} (choose from {', '.join(known)}){hint}"


def validate_options(config) -> None:
    """Check every agcheck option and ini setting; a ``pytest.UsageError`` naming the first
    bad one. Imports agcheck's registry only when a backend or an engine is named."""
    names = configured_backends(config)
    if names:
        from agcheck.backends.registry import _ALIASES, available_backends, canonical_name

        known = available_backends()
        for name in names:
            if canonical_name(name) not in known:
                raise pytest.UsageError("--agcheck-backend / agcheck_backend: "
                                        + _unknown("backend", name, list(known) + list(_ALIASES)))
    engine = _setting(config, "engine")
    if engine:
        from agcheck.options import GradcheckOptions

        try:
            GradcheckOptions(engine=engine)
        except ValueError as error:
            raise pytest.UsageError(f"--agcheck-engine / agcheck_engine: {error}") from None
    account = _setting(config, "jax_account")
    if account and account not in _JAX_ACCOUNTS:
        raise pytest.UsageError("--agcheck-jax-account / agcheck_jax_account: "
                                + _unknown("account", account, _JAX_ACCOUNTS))


def _installed(name: str) -> bool | None:
    """Whether the backend's framework is installed (``None``: unknown backend)."""
    from agcheck.backends.registry import available_backends, canonical_name

    return available_backends().get(canonical_name(name))


def pytest_generate_tests(metafunc):
    if "agcheck_backend" not in metafunc.fixturenames:
        return
    # a test that parametrizes agcheck_backend itself keeps its own values
    for marker in metafunc.definition.iter_markers("parametrize"):
        argnames = marker.args[0] if marker.args else marker.kwargs.get("argnames", "")
        if isinstance(argnames, str):
            argnames = [a.strip() for a in argnames.split(",")]
        if "agcheck_backend" in argnames:
            return
    names = configured_backends(metafunc.config) or [DEFAULT_BACKEND]
    params = []
    for name in names:
        ok = _installed(name)
        marks = ()
        if ok is False:
            marks = pytest.mark.skip(reason=f"agcheck backend {name!r}: its framework is not installed")
        params.append(pytest.param(name, marks=marks, id=name))
    metafunc.parametrize("agcheck_backend", params)


# -- fixtures ---------------------------------------------------------------------------------

@pytest.fixture
def agcheck_backend(request):
    """The backend of this test run (parametrized over ``--agcheck-backend``)."""
    return getattr(request, "param", None) or (configured_backends(request.config) or [DEFAULT_BACKEND])[0]


@pytest.fixture
def agcheck(request):
    """Gradient checks that report failures in the test output (see :class:`AgcheckFixture`)."""
    if "agcheck_backend" in request.fixturenames:
        backend = request.getfixturevalue("agcheck_backend")
    else:
        names = configured_backends(request.config)
        backend = names[0] if names else None
    return AgcheckFixture(
        backend=backend,
        report_dir=configured_report_dir(request.config),
        nodeid=request.node.nodeid,
        crosscheck_backends=configured_backends(request.config),
        saved=_saved_list(request.config),
        item=request.node,
    )


def _saved_list(config) -> list:
    return _reports(config).saved


# -- the failure type (made when first needed: it subclasses agcheck's GradcheckError) ---------

_FAILURE_TYPE = None


def _failure_type() -> type:
    global _FAILURE_TYPE
    if _FAILURE_TYPE is None:
        from agcheck.report.errors import GradcheckError

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

        AgcheckFailure.__module__ = __name__
        AgcheckFailure.__qualname__ = "AgcheckFailure"
        _FAILURE_TYPE = AgcheckFailure
    return _FAILURE_TYPE


def __getattr__(name):
    if name == "AgcheckFailure":
        return _failure_type()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _slug(nodeid: str) -> str:
    s = re.sub(r"[^A-Za-z0-9_.-]+", "_", nodeid).strip("_.")
    return (s or "test")[-150:]


def _warn(message: str) -> None:
    """An :class:`AgcheckReportWarning`; never an exception (``-W error`` included)."""
    try:
        warnings.warn(message, AgcheckReportWarning, stacklevel=3)
    except Warning:
        pass


class _Pending:
    """The report of one failed check of a test, saved if the test fails."""

    def __init__(self, report, failure=None):
        self.report = report
        self.failure = failure
        self.path = None
        self.done = False


# -- the fixture object -----------------------------------------------------------------------

class AgcheckFixture:
    """What the ``agcheck`` fixture returns.

    The fixture is named after the package and stands in for it: its ``gradcheck``,
    ``gradgradcheck`` and ``crosscheck`` run the package's functions with the selected
    backend and turn failures into :class:`AgcheckFailure`; every other public name
    (``agcheck.GradcheckError``, ``agcheck.numerical_jacobian``, ...) is the package's.

    Attributes
    ----------
    backend : str or None
        The selected backend (``None``: inferred from the inputs). A ``backend=`` keyword
        of a call wins; a check whose inputs are arrays of another framework runs on that
        framework's backend (see :meth:`backend_for`).
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
            return _failure_type() if name == "AgcheckFailure" else getattr(package, name)
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
        """The backend a check of ``inputs`` (with the check's keywords ``kwargs``) runs on.

        ``kwargs["backend"]`` when given; otherwise the selected backend, unless the inputs
        are arrays of another framework (that framework's backend then) or the check is given
        NumPy derivatives (``vjp=``/``jvp=``: the NumPy backend); ``None``: inferred by the
        check from the inputs.
        """
        if kwargs.get("backend") is not None:
            return kwargs["backend"]
        if self.backend is None:
            return None
        if "vjp" in kwargs or "jvp" in kwargs:
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
        from agcheck.report.errors import GradcheckError

        try:
            return check(fn, inputs, **kwargs)
        except GradcheckError as e:
            if isinstance(e, _failure_type()):
                raise
            failure = self.failure(e)
        raise failure

    # -- failures ----------------------------------------------------------------------
    def failure(self, error):
        """The :class:`AgcheckFailure` for ``error``: its message followed by the report
        summary (when the message does not already end with it). Within a test the report
        is saved if the test fails; outside one (no test item), at once."""
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
        path = None
        if self._item is not None:
            failure = _failure_type()(message, error=error)
            if self.report_dir and report is not None and hasattr(report, "save"):
                _pending(self._item).append(_Pending(report, failure))
        else:
            path = self.save_report(report)
            if path:
                message = message.rstrip("\n") + f"\n\nagcheck report saved to {path}"
            failure = _failure_type()(message, error=error, report_path=path)
        if any(c.__module__ == "torch.autograd.gradcheck" for c in type(error).__mro__):
            from agcheck.backends.torch_errors import adopt  # torch is imported: the error is torch's

            adopt(failure)  # still caught by torch's GradcheckError, as the error it replaces
        return failure

    def save_report(self, report) -> str | None:
        """Save ``report`` in the report folder now (if one is configured and the report can
        be saved); the path written, or ``None``. A folder or file that cannot be written
        is an :class:`AgcheckReportWarning`, never an exception."""
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
            _warn(f"agcheck report of {self.nodeid} not saved: {why}")
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
        _warn(f"agcheck report of {self.nodeid} not saved in {self.report_dir}: {why}")
        return None, why


def _pending(item) -> list:
    return _PENDING.setdefault(item, list)


# -- saving the reports of failing tests, and what pytest's lines say ------------------------

@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    try:
        report = outcome.get_result()
        if report.failed:
            _save_pending(item, report)
            if call.excinfo is not None:
                _name_the_failure(call.excinfo.value, report)
    except Exception as e:  # noqa: BLE001 - the plugin's bookkeeping never changes a test's report
        _warn(f"agcheck: the failure report of {item.nodeid} could not be handled: {type(e).__name__}: {e}")


def _save_pending(item, report) -> None:
    entries = [p for p in _PENDING.get(item, None) or () if not p.done]
    if not entries:
        return
    saver = AgcheckFixture(report_dir=configured_report_dir(item.config), nodeid=item.nodeid,
                           saved=_saved_list(item.config))
    saver._count = sum(1 for p in _PENDING.get(item) if p.done and p.path)
    lines = []
    for entry in entries:
        entry.done = True
        path, why = saver._save(entry.report)
        entry.path = path
        if path:
            if entry.failure is not None:
                entry.failure.report_path = path
            report.user_properties.append((REPORT_PROPERTY, path))
            lines.append(f"agcheck report saved to {path}")
        elif why:
            report.user_properties.append((UNSAVED_PROPERTY, f"{item.nodeid}: {why}"))
            lines.append(f"agcheck report not saved: {why}")
    if lines:
        report.sections.append(("agcheck report", "\n".join(lines)))


def _is_agcheck_error(exc) -> bool:
    if "agcheck.report.errors" not in sys.modules:  # no agcheck error was ever made
        return False
    from agcheck.report.errors import GradcheckError

    return isinstance(exc, GradcheckError)


def crash_line(exc) -> str:
    """The line pytest's short test summary gives an agcheck failure: the error's class
    name, the message's first line and the diagnoses' names, e.g. ``AgcheckFailure:
    Jacobian mismatch for output 0 with respect to input 0 [factor]``."""
    report = getattr(exc, "report", None)
    headline = ""
    if report is not None and callable(getattr(report, "headline", None)):
        headline = report.headline()
    if not headline:
        headline = next((ln.strip() for ln in str(exc).splitlines() if ln.strip()), "").rstrip(",")
    kinds = list(dict.fromkeys(getattr(d, "kind", "") for d in getattr(report, "diagnoses", None) or ()))
    kinds = [k for k in kinds if k]
    return f"{type(exc).__name__}: {headline}" + (f" [{', '.join(kinds)}]" if kinds else "")


def _name_the_failure(exc, report) -> None:
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None and _is_agcheck_error(exc):
        crash.message = crash_line(exc)


class _ReportList:
    """The reports of this run: saved (paths) and not saved (why), collected from the test
    reports' ``user_properties`` (this process's tests, or pytest-xdist's workers')."""

    def __init__(self):
        self.saved = []
        self.unsaved = []

    def pytest_runtest_logreport(self, report):
        for name, value in getattr(report, "user_properties", None) or ():
            if name == REPORT_PROPERTY and value not in self.saved:
                self.saved.append(value)
            elif name == UNSAVED_PROPERTY and value not in self.unsaved:
                self.unsaved.append(value)


def _reports(config) -> _ReportList:
    reports = _REPORTS.get(config)
    if reports is None:
        reports = _REPORTS.set(config, _ReportList())
        config.pluginmanager.register(reports, "agcheck-reports")
    return reports


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    session = _dropin_session(item.config)
    if session is not None:
        session.item = item
    try:
        yield
    finally:
        if session is not None:
            session.item = None
        _PENDING.set(item, None)  # the failures' reports (and their arrays) are not kept


# -- drop-in: the suite's own gradcheck calls through agcheck -----------------------------------

#: the drop-in options' names (``--agcheck-NAME``, ini ``agcheck_NAME``) by framework
_DROPIN_FLAGS = {"torch": "torch", "jax": "jax", "tensorflow": "tf"}


def _wanted_patches(config) -> list:
    wanted = []
    for framework, flag_name in _DROPIN_FLAGS.items():
        flag = _option(config, f"agcheck_{flag_name}")
        if flag is None:
            try:
                flag = config.getini(f"agcheck_{flag_name}")
            except (ValueError, KeyError):
                flag = False
        if flag:
            wanted.append(framework)
    return wanted


class _DropinSession:
    """The patches of one pytest run, and the failures they saw."""

    def __init__(self, config):
        self.config = config
        self.patches = {}
        self.item = None
        self.listening = False

    def install(self) -> None:
        from agcheck.frontends import dropin

        for framework in _wanted_patches(self.config):
            if framework in self.patches:
                continue
            if _installed(framework) is False:
                raise pytest.UsageError(f"--agcheck-{_DROPIN_FLAGS[framework]} needs {framework}, "
                                        "which is not installed")
            if framework == "torch":
                engine = _setting(self.config, "engine")
                patch = dropin.patch_torch(**({"engine": engine} if engine else {}))
            elif framework == "tensorflow":
                patch = dropin.patch_tensorflow()
            else:
                account = _setting(self.config, "jax_account")
                patch = dropin.patch_jax(**({"account": account} if account else {}))
            self.patches[framework] = patch
        if self.patches and not self.listening:
            dropin.add_failure_listener(self.on_failure)
            self.listening = True

    def restore(self) -> None:
        from agcheck.frontends import dropin

        dropin.remove_failure_listener(self.on_failure)
        self.listening = False
        for patch in self.patches.values():
            patch.restore()

    def on_failure(self, framework, kind, error):
        """A drop-in check failed: within a test its report is saved if the test fails;
        outside one (at collection), at once (the path is then named in the message)."""
        directory = configured_report_dir(self.config)
        report = getattr(error, "report", None)
        if not directory or report is None or not hasattr(report, "save"):
            return None
        if self.item is not None:
            _pending(self.item).append(_Pending(report))
            return None
        saver = AgcheckFixture(report_dir=directory, nodeid="session", saved=_saved_list(self.config))
        saver._count = len(_saved_list(self.config))
        return saver.save_report(report)


def _dropin_session(config, create=False):
    session = _DROPIN.get(config)
    if session is None and create:
        session = _DROPIN.set(config, _DropinSession(config))
    return session


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config, parser, args):
    """Check the options; patch before the suite's conftest files (and so its test modules)
    are imported."""
    validate_options(early_config)
    if _wanted_patches(early_config):
        _dropin_session(early_config, create=True).install()


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    """The same for a plugin registered after the initial conftests (``-p`` in a conftest)."""
    validate_options(config)
    _reports(config)
    if _wanted_patches(config):
        _dropin_session(config, create=True).install()


def pytest_sessionfinish(session, exitstatus):
    """An xdist worker hands its drop-in counts to the controller."""
    dropin_session = _dropin_session(session.config)
    workeroutput = getattr(session.config, "workeroutput", None)
    if dropin_session is not None and workeroutput is not None:
        workeroutput["agcheck_dropin"] = {f: [p.checks, p.failures] for f, p in dropin_session.patches.items()}


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """The controller adds up its workers' drop-in counts."""
    counts = getattr(node, "workeroutput", {}).get("agcheck_dropin")
    session = _dropin_session(node.config)
    if not counts or session is None:
        return
    for framework, (checks, failures) in counts.items():
        patch = session.patches.get(framework)
        if patch is not None:
            patch.checks += checks
            patch.failures += failures


def pytest_unconfigure(config):
    session = _dropin_session(config)
    if session is not None:
        session.restore()


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    session = _dropin_session(config)
    if session is not None and session.patches:
        parts = []
        for framework, patch in session.patches.items():
            name = {"torch": "torch gradcheck/gradgradcheck", "jax": "jax check_grads",
                    "tensorflow": "tf.test.compute_gradient"}[framework]
            failed = f"{patch.failures} with Jacobians that differ" if framework == "tensorflow" else \
                f"{patch.failures} failed"
            parts.append(f"{patch.checks} {name} call{'s' if patch.checks != 1 else ''} went through agcheck"
                         f" ({failed})")
        terminalreporter.write_sep("-", "agcheck drop-in")
        for line in parts:
            terminalreporter.write_line(line)
    reports = _REPORTS.get(config)
    saved, unsaved = (reports.saved, reports.unsaved) if reports is not None else ([], [])
    if saved or unsaved:
        terminalreporter.write_sep("-", "agcheck reports")
        for path in saved:
            terminalreporter.write_line(f"saved {path}")
        for why in unsaved:
            terminalreporter.write_line(f"not saved: {why}")
