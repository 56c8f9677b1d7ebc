"""The agcheck pytest plugin: an ``agcheck`` fixture, backend parametrization and failure
reports saved next to the test run.

Registered through the ``pytest11`` entry point (``agcheck = "agcheck.frontends.pytest_plugin"``),
so installing agcheck enables it; without the entry point, enable it with
``-p agcheck.frontends.pytest_plugin`` or ``pytest_plugins = ["agcheck.frontends.pytest_plugin"]``.

Fixtures
--------
``agcheck``
    An :class:`AgcheckFixture`: ``agcheck.gradcheck(fn, inputs, **kw)``,
    ``agcheck.gradgradcheck(...)`` and ``agcheck.crosscheck(...)`` with the backend chosen
    on the command line (or by the ``agcheck_backend`` parameter of the test). A failed
    check raises :class:`AgcheckFailure` (an ``AssertionError`` and an
    :class:`agcheck.GradcheckError`) whose message ends with the failure report's
    summary; with a report folder configured the HTML report is saved there and its path
    is named in the message.
``agcheck_backend``
    The name of a backend. Tests that request it run once per backend given with
    ``--agcheck-backend`` (``torch`` when none is given); backends whose framework is not
    installed are skipped.

Options
-------
``--agcheck-backend NAME``
    Backend(s) for the fixtures; repeat it or separate names with commas
    (``--agcheck-backend torch,jax``). Also the ini setting ``agcheck_backend``.
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
``--agcheck-jax-account direction|full``
    How a failing check ``--agcheck-jax`` routes is explained: ``direction`` (the default)
    from the check's own evaluations, ``full`` by the failing level's full Jacobians (their
    report is what ``--agcheck-report-dir`` saves). Also the ini setting
    ``agcheck_jax_account``.
``--agcheck-report-dir DIR``
    Save the report of every failed check (of the fixtures, and of the suite's own checks
    under ``--agcheck-torch`` / ``--agcheck-jax``) as ``DIR/<test id>.html`` (``.json``
    when the HTML report cannot be written, e.g. without matplotlib). Also the ini setting
    ``agcheck_report_dir``.

Nothing here imports torch or jax.
"""
from __future__ import annotations

import os
import re

import pytest

__all__ = ["AgcheckFixture", "AgcheckFailure", "DEFAULT_BACKEND"]

#: the backend of ``agcheck_backend`` when no ``--agcheck-backend`` is given
DEFAULT_BACKEND = "torch"

_REPORT_DIR_KEY = pytest.StashKey[list]() if hasattr(pytest, "StashKey") else None


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
        help="save the report of every failed agcheck check in DIR (HTML, JSON without matplotlib)",
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
        "--agcheck-engine", action="store", default=None, metavar="NAME",
        help="agcheck's engine for the checks routed by --agcheck-torch (auto, batched, reference; "
             "reference evaluates the suite's functions exactly as often as torch's checker)",
    )
    group.addoption(
        "--agcheck-jax-account", action="store", default=None, choices=("direction", "full"),
        help="how agcheck explains a failing check routed by --agcheck-jax: direction (default, from the "
             "check's own evaluations) or full (the failing level's full Jacobians, element by element)",
    )
    parser.addini("agcheck_engine", "agcheck's engine for the checks routed by agcheck_torch", default="")
    parser.addini("agcheck_jax_account", "agcheck's account of failures routed by agcheck_jax (direction, full)",
                  default="")
    parser.addini("agcheck_torch", "route torch.autograd.gradcheck/gradgradcheck to agcheck", type="bool",
                  default=False)
    parser.addini("agcheck_jax", "route jax.test_util.check_grads to agcheck", type="bool", default=False)
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


def configured_backends(config) -> list:
    """The backends named by ``--agcheck-backend`` (or the ini setting), in order."""
    names = _split(config.getoption("agcheck_backend", None))
    if not names:
        names = _split([config.getini("agcheck_backend")])
    return names


def configured_report_dir(config) -> str | None:
    d = config.getoption("agcheck_report_dir", None) or config.getini("agcheck_report_dir") or None
    if d and not os.path.isabs(d):
        d = os.path.join(str(config.invocation_params.dir), d)
    return d


def _installed(name: str) -> bool | None:
    """Whether the backend's framework is installed (``None``: unknown backend)."""
    from agcheck.backends.registry import available_backends

    return available_backends().get(name)


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
    )


def _saved_list(config) -> list:
    if _REPORT_DIR_KEY is not None:
        return config.stash.setdefault(_REPORT_DIR_KEY, [])
    if not hasattr(config, "_agcheck_saved"):
        config._agcheck_saved = []
    return config._agcheck_saved


# -- the fixture object -----------------------------------------------------------------------

def _make_failure_type():
    from agcheck.report.errors import GradcheckError

    class AgcheckFailure(GradcheckError, AssertionError):
        """A check run through the ``agcheck`` fixture failed.

        Both an ``AssertionError`` (pytest shows it as a test failure) and an
        :class:`agcheck.GradcheckError` (``pytest.raises(agcheck.GradcheckError)`` still
        catches it). ``.report`` is the original error's report, ``.error`` the original
        error, ``.report_path`` where the report was saved (or ``None``).
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
    return AgcheckFailure


AgcheckFailure = _make_failure_type()


def _slug(nodeid: str) -> str:
    s = re.sub(r"[^A-Za-z0-9_.-]+", "_", nodeid).strip("_.")
    return (s or "test")[-150:]


class AgcheckFixture:
    """What the ``agcheck`` fixture returns.

    Attributes
    ----------
    backend : str or None
        The backend passed to every check (``None``: inferred from the inputs). A
        ``backend=`` keyword of a call wins.
    report_dir : str or None
        Where reports of failed checks are saved.
    saved : list of str
        Reports saved so far (in this session).
    """

    def __init__(self, backend=None, report_dir=None, nodeid="test", crosscheck_backends=(), saved=None):
        self.backend = backend
        self.report_dir = report_dir
        self.nodeid = nodeid
        self.crosscheck_backends = list(crosscheck_backends)
        self.saved = saved if saved is not None else []
        self._count = 0

    def __repr__(self) -> str:
        return f"<agcheck fixture backend={self.backend!r} report_dir={self.report_dir!r}>"

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

    def _run(self, check, fn, inputs, kwargs):
        __tracebackhide__ = True
        if "backend" not in kwargs and self.backend is not None:
            kwargs["backend"] = self.backend
        return self._call(check, fn, inputs, kwargs)

    def _call(self, check, fn, inputs, kwargs):
        __tracebackhide__ = True
        from agcheck.report.errors import GradcheckError

        try:
            return check(fn, inputs, **kwargs)
        except GradcheckError as e:
            if isinstance(e, AgcheckFailure):
                raise
            failure = self.failure(e)
        raise failure

    # -- failures ----------------------------------------------------------------------
    def failure(self, error) -> "AgcheckFailure":
        """The :class:`AgcheckFailure` for ``error``: its message, the report summary (when
        the message does not already end with it) and the saved report's path."""
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
        path = self.save_report(report)
        if path:
            message = message.rstrip("\n") + f"\n\nagcheck report saved to {path}"
        failure = AgcheckFailure(message, error=error, report_path=path)
        if any(c.__module__ == "torch.autograd.gradcheck" for c in type(error).__mro__):
            from agcheck.backends.torch_errors import adopt  # torch is imported: the error is torch's

            adopt(failure)  # still caught by torch's GradcheckError, as the error it replaces
        return failure

    def save_report(self, report) -> str | None:
        """Save ``report`` in the report folder (if one is configured and the report can be
        saved); the path written, or ``None``."""
        if not self.report_dir or report is None or not hasattr(report, "save"):
            return None
        os.makedirs(self.report_dir, exist_ok=True)
        self._count += 1
        stem = _slug(self.nodeid) + ("" if self._count == 1 else f"-{self._count}")
        base = os.path.join(self.report_dir, stem)
        for ext in (".html", ".json"):
            try:
                path = report.save(base + ext)
            except Exception:
                continue
            path = os.fspath(path) if path else base + ext
            self.saved.append(path)
            return path
        return None


# -- drop-in: the suite's own gradcheck calls through agcheck -----------------------------------

def _wanted_patches(config) -> list:
    wanted = []
    for framework in ("torch", "jax"):
        flag = config.getoption(f"agcheck_{framework}", None)
        if flag is None:
            try:
                flag = config.getini(f"agcheck_{framework}")
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
        self.nodeid = None
        self.counts = {}

    def install(self) -> None:
        from agcheck.frontends import dropin

        for framework in _wanted_patches(self.config):
            if framework in self.patches:
                continue
            if _installed(framework) is False:
                raise pytest.UsageError(f"--agcheck-{framework} needs {framework}, which is not installed")
            if framework == "torch":
                engine = self.config.getoption("agcheck_engine", None) or self.config.getini("agcheck_engine")
                patch = dropin.patch_torch(**({"engine": engine} if engine else {}))
            else:
                account = self.config.getoption("agcheck_jax_account", None) or self.config.getini(
                    "agcheck_jax_account")
                try:
                    patch = dropin.patch_jax(**({"account": account} if account else {}))
                except ValueError as error:  # the ini setting's value (the option's is checked by argparse)
                    raise pytest.UsageError(f"agcheck_jax_account: {error}") from None
            self.patches[framework] = patch
        if self.patches:
            dropin.add_failure_listener(self.on_failure)

    def restore(self) -> None:
        from agcheck.frontends import dropin

        dropin.remove_failure_listener(self.on_failure)
        for patch in self.patches.values():
            patch.restore()

    def on_failure(self, framework, kind, error):
        directory = configured_report_dir(self.config)
        report = getattr(error, "report", None)
        if not directory or report is None or not hasattr(report, "save"):
            return None
        nodeid = self.nodeid or "session"
        n = self.counts[nodeid] = self.counts.get(nodeid, 0) + 1
        saver = AgcheckFixture(report_dir=directory, nodeid=nodeid, saved=_saved_list(self.config))
        saver._count = n - 1
        return saver.save_report(report)


_DROPIN_KEY = pytest.StashKey[_DropinSession]() if hasattr(pytest, "StashKey") else None


def _dropin_session(config, create=False):
    if _DROPIN_KEY is not None:
        session = config.stash.get(_DROPIN_KEY, None)
        if session is None and create:
            session = config.stash[_DROPIN_KEY] = _DropinSession(config)
        return session
    if create and not hasattr(config, "_agcheck_dropin"):
        config._agcheck_dropin = _DropinSession(config)
    return getattr(config, "_agcheck_dropin", None)


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config, parser, args):
    """Patch before the suite's conftest files (and so its test modules) are imported."""
    if _wanted_patches(early_config):
        _dropin_session(early_config, create=True).install()


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    """The same for a plugin registered after the initial conftests (``-p`` in a conftest)."""
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


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    session = _dropin_session(item.config)
    if session is not None:
        session.nodeid = item.nodeid
    try:
        yield
    finally:
        if session is not None:
            session.nodeid = None


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    session = _dropin_session(config)
    if session is not None and session.patches:
        parts = []
        for framework, patch in session.patches.items():
            name = "torch gradcheck/gradgradcheck" if framework == "torch" else "jax check_grads"
            parts.append(f"{patch.checks} {name} call{'s' if patch.checks != 1 else ''} went through agcheck"
                         f" ({patch.failures} failed)")
        terminalreporter.write_sep("-", "agcheck drop-in")
        for line in parts:
            terminalreporter.write_line(line)
    saved = _saved_list(config)
    if saved:
        terminalreporter.write_sep("-", "agcheck reports")
        for path in saved:
            terminalreporter.write_line(f"saved {path}")
