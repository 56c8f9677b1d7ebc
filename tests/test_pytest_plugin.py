"""The agcheck pytest plugin (agcheck/frontends/pytest_plugin.py), run through pytester.

Each inner pytest run costs a few seconds, so the tests share few runs.
"""
from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

pytest.importorskip("torch")  # imported here, so the in-process inner runs do not re-import it

HAS_MPL = importlib.util.find_spec("matplotlib") is not None
HAS_JAX = importlib.util.find_spec("jax") is not None
HAS_XDIST = importlib.util.find_spec("xdist") is not None
ROOT = Path(__file__).resolve().parents[1]


def _entry_point_installed() -> bool:
    try:
        eps = importlib.metadata.entry_points(group="pytest11")
    except TypeError:  # Python < 3.10
        eps = importlib.metadata.entry_points().get("pytest11", [])
    return any(ep.value.startswith("agcheck.frontends.pytest_plugin") for ep in eps)


# once pyproject registers the pytest11 entry point the plugin loads by itself (and a
# second registration through -p would be refused)
PLUGIN_ARGS = () if _entry_point_installed() else ("-p", "agcheck.frontends.pytest_plugin")


def run(pytester, *args):
    return pytester.runpytest(*PLUGIN_ARGS, "-p", "no:cacheprovider", *args)


def _reports_saveable() -> bool:
    from agcheck.report import GradcheckError

    err = GradcheckError("x")
    return HAS_MPL and hasattr(err, "report") and hasattr(err.report, "save")


CHECKS = '''
import pytest
import torch
from agcheck.frontends.pytest_plugin import AgcheckFailure


class Twice(torch.autograd.Function):
    """sin with its backward multiplied by 2 by mistake"""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return torch.sin(x)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return 2 * g * torch.cos(x)


def make_input():
    return torch.linspace(-1.0, 1.0, 6, dtype=torch.float64).reshape(2, 3).requires_grad_()


def test_ok(agcheck):
    assert agcheck.gradcheck(torch.sin, (make_input(),))
    assert agcheck.gradgradcheck(lambda x: x.sin() * x, (make_input(),))


def test_bad(agcheck):
    agcheck.gradcheck(Twice.apply, (make_input(),))


def test_raises(agcheck):
    # the fixture shadows the module: the package's names are the fixture's too
    with pytest.raises(agcheck.GradcheckError) as info:
        agcheck.gradcheck(Twice.apply, (make_input(),))
    assert isinstance(info.value, AssertionError)
    assert isinstance(info.value, AgcheckFailure) and agcheck.AgcheckFailure is AgcheckFailure
    from torch.autograd.gradcheck import GradcheckError as TorchGradcheckError
    assert isinstance(info.value, TorchGradcheckError)  # a torch check's failure stays torch's
    assert "Jacobian mismatch" in str(info.value)
    assert info.value.report_path is None  # the test passes: nothing saved
    if hasattr(info.value, "report"):
        assert info.value.report.check == "jacobian"
    assert agcheck.gradcheck(Twice.apply, (make_input(),), raise_exception=False) is False
    import agcheck as package
    assert agcheck.numerical_jacobian is package.numerical_jacobian
    assert agcheck.GradcheckOptions is package.GradcheckOptions
    assert "GradcheckError" in dir(agcheck)
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        agcheck.no_such_name
'''


def test_checks_pass_fail_and_report(pytester, tmp_path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "300")  # the short summary line is not cut
    pytester.makepyfile(test_it=CHECKS)
    out_dir = tmp_path / "reports"
    result = run(pytester, f"--agcheck-report-dir={out_dir}", "-rf")
    result.assert_outcomes(passed=2, failed=1)
    out = result.stdout.str()
    # the failure shows torch's message and the report summary
    assert "Jacobian mismatch for output 0 with respect to input 0" in out
    assert "agcheck report: check 'jacobian' failed" in out
    # pytest's short summary names the failure, not the plugin's module path
    assert ("FAILED test_it.py::test_bad - AgcheckFailure: Jacobian mismatch for output 0 "
            "with respect to input 0 [factor]") in out
    assert "agcheck.frontends.pytest_plu" not in out.split("short test summary info")[1]
    if _reports_saveable():
        files = sorted(p.name for p in out_dir.iterdir())
        # only the failing test saved its report; test_raises expected its failure
        assert files == ["test_it.py_test_bad.html"], files
        assert "<html" in (out_dir / files[0]).read_text(encoding="utf-8").lower()
        assert f"agcheck report saved to {out_dir / files[0]}" in out  # under the failure
        summary = out.split("agcheck reports")[1]
        assert summary.count("saved ") == 1 and "test_raises" not in summary


def test_report_folder_errors_do_not_change_outcomes(pytester, tmp_path):
    pytester.makepyfile(test_it=CHECKS)
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    for extra in ((), ("-W", "error::agcheck.frontends.pytest_plugin.AgcheckReportWarning")):
        result = run(pytester, f"--agcheck-report-dir={blocker / 'reports'}", *extra)
        # test_raises still passes, test_bad fails with its mismatch, not NotADirectoryError
        result.assert_outcomes(passed=2, failed=1)
        out = result.stdout.str()
        assert "Jacobian mismatch for output 0 with respect to input 0" in out
        assert "test_it.py:" in out and "AgcheckFailure" in out
        # under the failure, and in the session's list
        assert re.search(r"agcheck report not saved: cannot create the report folder .*NotADirectoryError", out)
        assert re.search(r"agcheck reports -+\nnot saved: test_it.py::test_bad: .*NotADirectoryError", out)
        assert "INTERNALERROR" not in out
        if not extra:
            assert "AgcheckReportWarning" in out  # in the warnings summary
    assert blocker.read_text() == "not a folder"


def test_saving_a_report_never_raises(tmp_path):
    from agcheck.frontends.pytest_plugin import AgcheckFixture, AgcheckReportWarning

    class Report:
        def save(self, path):
            raise PermissionError(13, "Permission denied", path)

    blocker = tmp_path / "f"
    blocker.write_text("")
    fixture = AgcheckFixture(report_dir=str(blocker / "sub"), nodeid="t")
    with pytest.warns(AgcheckReportWarning, match="NotADirectoryError"):
        assert fixture.save_report(Report()) is None
    fixture = AgcheckFixture(report_dir=str(tmp_path / "ok"), nodeid="t")
    with pytest.warns(AgcheckReportWarning, match="PermissionError"):
        assert fixture.save_report(Report()) is None
    assert fixture.saved == []


@pytest.mark.parametrize("args, ini, message", [
    (["--agcheck-backend", "troch"], None, "unknown backend 'troch' (choose from torch, jax"),
    (["--agcheck-backend", "torch,bogus"], None, "unknown backend 'bogus'"),
    (["--agcheck-engine=bogus"], None, "engine must be 'auto', 'batched' or 'reference', got 'bogus'"),
    ([], "agcheck_engine = fastest", "got 'fastest'"),
    ([], "agcheck_backend = jaxx", "did you mean 'jax'?"),
    ([], "agcheck_jax_account = partial", "unknown account 'partial' (choose from direction, full)"),
    (["--agcheck-jax-account=partial"], None, "invalid choice: 'partial'"),
])
def test_bad_options_stop_pytest_at_start_up(pytester, args, ini, message):
    pytester.makepyfile(test_it="def test_never_runs(agcheck):\n    raise AssertionError('ran')\n")
    if ini:
        pytester.makeini(f"[pytest]\n{ini}\n")
    result = run(pytester, *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert message in result.stderr.str()
    assert "ran" not in result.stdout.str()


def test_good_options_and_aliases_are_accepted(pytester):
    pytester.makepyfile(test_it="def test_runs(agcheck):\n    print('BACKEND=' + str(agcheck.backend))\n")
    pytester.makeini("[pytest]\nagcheck_engine = reference\nagcheck_jax_account = full\n")
    result = run(pytester, "-s", "--agcheck-backend", "torch,tf", "--agcheck-engine", "batched")
    result.assert_outcomes(passed=1)
    assert "BACKEND=torch" in result.stdout.str()


def test_backend_parametrization(pytester):
    pytester.makepyfile(test_it='''
import numpy as np

def test_which(agcheck_backend, agcheck):
    assert agcheck.backend == agcheck_backend
    print("BACKEND=" + agcheck_backend)

def test_plain(agcheck):
    print("PLAIN=" + str(agcheck.backend))
    assert "saved" not in repr(agcheck)

def test_sin(agcheck_backend, agcheck):
    x = np.linspace(-1.0, 1.0, 6).reshape(2, 3)
    if agcheck_backend == "torch":
        import torch
        assert agcheck.gradcheck(torch.sin, (torch.tensor(x, requires_grad=True),))
    elif agcheck_backend == "jax":
        import jax  # only with --agcheck-backend jax
        jax.config.update("jax_enable_x64", True)
        import jax.numpy as jnp
        assert agcheck.gradcheck(jnp.sin, (jnp.asarray(x),))
''')
    from agcheck.backends import registry as be

    # a registered backend whose framework is missing is skipped
    be.register_backend("fakefw", "agcheck.backends.fakefw_backend", "agcheck_no_such_framework", "fakefw")
    try:
        result = run(pytester, "-s", "-v", "-rs", "--agcheck-backend", "torch,fakefw",
                     "--agcheck-backend", "torch", "--agcheck-backend", "numpy")
    finally:
        del be._REGISTRY["fakefw"]
    out = result.stdout.str()
    # torch, fakefw (skipped), numpy; "torch" given twice counts once
    result.assert_outcomes(passed=5, skipped=2)
    result.stdout.fnmatch_lines(["*test_which?torch?*", "*test_which?numpy?*", "*test_sin?torch?*"])
    assert "BACKEND=torch" in out and "BACKEND=numpy" in out
    assert "PLAIN=torch" in out  # tests not parametrized use the first backend
    assert "its framework is not installed" in out


def test_default_backend(pytester):
    pytester.makepyfile(test_it='''
def test_which(agcheck_backend, agcheck):
    print("BACKEND=" + agcheck_backend)

def test_plain(agcheck):
    print("PLAIN=" + str(agcheck.backend))
''')
    result = run(pytester, "-s")
    result.assert_outcomes(passed=2)
    out = result.stdout.str()
    assert "BACKEND=torch" in out and "PLAIN=None" in out  # default: torch / inferred


# -- which backend a check of the fixture runs on ------------------------------------------------

def test_backend_for_follows_the_inputs():
    import numpy as np
    import torch

    from agcheck.frontends.pytest_plugin import AgcheckFixture

    t = (torch.ones(3, dtype=torch.float64, requires_grad=True),)
    n = (np.ones(3),)
    for selected in ("jax", "numpy", "tensorflow"):
        fixture = AgcheckFixture(backend=selected)
        assert fixture.backend_for(t) is None  # torch tensors: torch, inferred
        assert fixture.backend_for(n) == selected  # NumPy arrays: the selected backend
        assert fixture.backend_for(t, backend="numpy") == "numpy"  # the call's keyword wins
        assert fixture.backend_for(n, vjp=lambda *a: a) is None  # NumPy derivatives: numpy
    fixture = AgcheckFixture(backend="torch")
    assert fixture.backend_for(t) == "torch" and fixture.backend_for(n) == "torch"
    assert fixture.backend_for((1.0, "x")) == "torch"  # nothing to infer from: the selection
    assert AgcheckFixture().backend_for(t) is None


@pytest.mark.skipif(not HAS_JAX, reason="needs jax")
def test_a_forced_backend_leaves_other_frameworks_tests_alone(pytester):
    pytester.makepyfile(test_it='''
import numpy as np
import torch


def test_torch(agcheck):
    x = torch.linspace(-1, 1, 5, dtype=torch.float64, requires_grad=True)
    assert agcheck.gradcheck(torch.sin, (x,))
    assert agcheck.backend_for((x,)) is None


def test_jax(agcheck):
    import jax
    import jax.numpy as jnp

    with jax.enable_x64(True):
        assert agcheck.gradcheck(jnp.sin, (jnp.linspace(-1.0, 1.0, 5),))
    assert agcheck.backend_for((np.ones(3),)) == "jax"
''')
    result = run(pytester, "--agcheck-backend", "jax")
    result.assert_outcomes(passed=2)


# -- pytest-xdist ----------------------------------------------------------------------------------

@pytest.mark.skipif(not HAS_XDIST, reason="needs pytest-xdist")
def test_xdist_workers_hand_their_reports_to_the_summary(pytester, tmp_path):
    if not _reports_saveable():
        pytest.skip("reports need matplotlib to be saved as HTML")
    pytester.makepyfile(test_it=CHECKS)
    out_dir = tmp_path / "reports"
    result = run(pytester, "-n", "2", f"--agcheck-report-dir={out_dir}")
    result.assert_outcomes(passed=2, failed=1)
    out = result.stdout.str()
    path = out_dir / "test_it.py_test_bad.html"
    assert path.exists() and sorted(p.name for p in out_dir.iterdir()) == [path.name]
    assert f"saved {path}" in out.split("agcheck reports")[1]
    assert "AgcheckFailure: Jacobian mismatch" in out


# -- the documentation's examples -------------------------------------------------------------------

def _doc_blocks(page: str) -> list:
    """The ``python`` blocks of a page that are not marked ``<!-- fragment -->``."""
    text = (ROOT / page).read_text(encoding="utf-8")
    blocks = []
    for m in re.finditer(r"(?:^(<!-- fragment -->)\n)?^```python\n(.*?)^```", text, re.S | re.M):
        if not m.group(1):
            blocks.append(m.group(2))
    return blocks


def test_the_pages_fixture_examples_pass_under_pytest(pytester):
    blocks = _doc_blocks("docs/pytest.md")
    assert len(blocks) >= 2
    pytester.makepyfile(**{f"test_docs_{i}": code for i, code in enumerate(blocks)})
    result = run(pytester, "-v")
    outcomes = result.parseoutcomes()
    assert outcomes.get("passed", 0) >= 3 and not outcomes.get("failed") and not outcomes.get("errors"), \
        result.stdout.str()


# -- loading the plugin is light ------------------------------------------------------------------

def _modules_after(code: str) -> set:
    proc = subprocess.run([sys.executable, "-c", code + "\nimport sys; print(' '.join(sorted(sys.modules)))"],
                          capture_output=True, text=True, timeout=600, cwd=str(ROOT))
    assert proc.returncode == 0, proc.stderr
    return set(proc.stdout.split())


HEAVY = ("torch", "jax", "tensorflow", "matplotlib", "rich", "agcheck.gradcheck", "agcheck.crosscheck",
         "agcheck.engine.batched", "agcheck.report.render")


def test_the_plugin_module_adds_no_import_of_its_own():
    """What loading the plugin imports beyond the package ``agcheck`` itself: nothing of
    agcheck's, no framework (the checker is imported when a check runs)."""
    before = _modules_after("import agcheck")
    after = _modules_after("import agcheck, agcheck.frontends.pytest_plugin")
    plugin = {"agcheck.frontends", "agcheck.frontends.pytest_plugin", "agcheck.frontends.pytest_options",
              "agcheck.frontends.pytest_fixture"}
    added = sorted(after - before - plugin)
    assert not [m for m in added if m.startswith("agcheck") or m.split(".")[0] in HEAVY], added


def test_loading_the_plugin_imports_no_checker_and_no_framework():
    loaded = _modules_after("import agcheck.frontends.pytest_plugin")
    assert not [m for m in HEAVY if m in loaded]


def test_a_plain_pytest_run_imports_no_framework(tmp_path):
    """A project that has agcheck installed and does not use it: ``pytest --co`` there
    loads the plugin and imports no framework."""
    (tmp_path / "test_plain.py").write_text("def test_x():\n    pass\n")
    code = textwrap.dedent(f"""
        import sys, pytest
        rc = pytest.main({list(PLUGIN_ARGS) + ["-p", "no:cacheprovider", "--co", "-q", str(tmp_path)]!r})
        assert rc == 0, rc
        assert "agcheck.frontends.pytest_plugin" in sys.modules
        bad = [m for m in ("torch", "jax", "tensorflow", "matplotlib") if m in sys.modules]
        assert not bad, bad
    """)
    env = dict(os.environ)
    env.pop("PYTEST_ADDOPTS", None)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                          cwd=str(tmp_path), env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
