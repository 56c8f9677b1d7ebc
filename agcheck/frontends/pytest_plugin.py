"""The agcheck pytest plugin: the ``agcheck`` and ``agcheck_backend`` fixtures, the
``--agcheck-*`` options (documented in docs/pytest.md) and failure reports saved for failing tests.

Registered through the ``pytest11`` entry point, or with ``-p agcheck.frontends.pytest_plugin``.
Every pytest run where agcheck is installed loads this module, so it imports neither
agcheck's checker nor a framework until a check or an option needs them.
"""
from __future__ import annotations

import sys

import pytest

from agcheck.frontends.pytest_options import (
    JAX_ACCOUNTS,
    configured_backends,
    configured_report_dir,
    installed,
    option_value,
    setting,
    validate_options,
)
from agcheck.frontends.pytest_fixture import (
    PENDING,
    AgcheckFixture,
    AgcheckReportWarning,
    Pending,
    Stash,
    failure_type,
    pending,
    warn,
)

__all__ = ["AgcheckFixture", "AgcheckFailure", "AgcheckReportWarning", "DEFAULT_BACKEND", "configured_backends",
           "configured_report_dir"]

#: the backend of ``agcheck_backend`` when no ``--agcheck-backend`` is given
DEFAULT_BACKEND = "torch"

#: the name of the test report's ``user_properties`` entry naming a saved report (it also
#: carries the list from pytest-xdist's workers to the run's terminal summary)
REPORT_PROPERTY = "agcheck_report"
#: the same for a report that could not be saved (the reason)
UNSAVED_PROPERTY = "agcheck_report_not_saved"


def __getattr__(name):
    if name == "AgcheckFailure":
        return failure_type()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


_REPORTS = Stash("_agcheck_reports")    # config: the reports saved (and not) in this run
_DROPIN = Stash("_agcheck_dropin")      # config: the drop-in session


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
        "--agcheck-jax-account", action="store", default=None, choices=JAX_ACCOUNTS,
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
        reason = f"agcheck backend {name!r}: its framework is not installed"
        marks = pytest.mark.skip(reason=reason) if installed(name) is False else ()
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
        saved=_reports(request.config).saved,
        item=request.node,
    )


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
        warn(f"agcheck: the failure report of {item.nodeid} could not be handled: {type(e).__name__}: {e}")


def _save_pending(item, report) -> None:
    entries = [p for p in PENDING.get(item, None) or () if not p.done]
    if not entries:
        return
    saver = AgcheckFixture(report_dir=configured_report_dir(item.config), nodeid=item.nodeid,
                           saved=_reports(item.config).saved)
    saver._count = sum(1 for p in PENDING.get(item) if p.done and p.path)
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
    if "agcheck.errors" not in sys.modules:  # no agcheck error was ever made
        return False
    from agcheck.errors import GradcheckError

    return isinstance(exc, GradcheckError)


def crash_line(exc) -> str:
    """Short-summary line of an agcheck failure, e.g. ``AgcheckFailure: Jacobian mismatch
    for output 0 with respect to input 0 [factor]`` (class, headline, diagnoses)."""
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
        PENDING.set(item, None)  # the failures' reports (and their arrays) are not kept


# -- drop-in: the suite's own gradcheck calls through agcheck -----------------------------------

#: the drop-in options' names (``--agcheck-NAME``, ini ``agcheck_NAME``) by framework
_DROPIN_FLAGS = {"torch": "torch", "jax": "jax", "tensorflow": "tf"}


def _wanted_patches(config) -> list:
    wanted = []
    for framework, flag_name in _DROPIN_FLAGS.items():
        flag = option_value(config, f"agcheck_{flag_name}")
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
            if installed(framework) is False:
                raise pytest.UsageError(f"--agcheck-{_DROPIN_FLAGS[framework]} needs {framework}, "
                                        "which is not installed")
            if framework == "torch":
                engine = setting(self.config, "engine")
                patch = dropin.patch_torch(**({"engine": engine} if engine else {}))
            elif framework == "tensorflow":
                patch = dropin.patch_tensorflow()
            else:
                account = setting(self.config, "jax_account")
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
        """Within a test, keep the report to save if the test fails; outside one (at
        collection), save it now and return its path for the message."""
        directory = configured_report_dir(self.config)
        report = getattr(error, "report", None)
        if not directory or report is None or not hasattr(report, "save"):
            return None
        if self.item is not None:
            pending(self.item).append(Pending(report))
            return None
        saver = AgcheckFixture(report_dir=directory, nodeid="session", saved=_reports(self.config).saved)
        saver._count = len(_reports(self.config).saved)
        return saver.save_report(report)


def _dropin_session(config, create=False):
    session = _DROPIN.get(config)
    if session is None and create:
        session = _DROPIN.set(config, _DropinSession(config))
    return session


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config, parser, args):
    """Check the options; patch before the suite's conftests (and test modules) are imported."""
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
        terminalreporter.write_sep("-", "agcheck drop-in")
        for framework, patch in session.patches.items():
            name = {"torch": "torch gradcheck/gradgradcheck", "jax": "jax check_grads",
                    "tensorflow": "tf.test.compute_gradient"}[framework]
            failed = "with Jacobians that differ" if framework == "tensorflow" else "failed"
            terminalreporter.write_line(f"{patch.checks} {name} call{'s' if patch.checks != 1 else ''} went through"
                                        f" agcheck ({patch.failures} {failed})")
    reports = _REPORTS.get(config)
    saved, unsaved = (reports.saved, reports.unsaved) if reports is not None else ([], [])
    if saved or unsaved:
        terminalreporter.write_sep("-", "agcheck reports")
        for path in saved:
            terminalreporter.write_line(f"saved {path}")
        for why in unsaved:
            terminalreporter.write_line(f"not saved: {why}")
