"""The agcheck pytest plugin (agcheck/pytest_plugin.py), run through pytester.

Each inner pytest run costs a few seconds, so the tests share few runs.
"""
from __future__ import annotations

import importlib.metadata
import importlib.util

import pytest

pytest_plugins = ["pytester"]

pytest.importorskip("torch")  # imported here, so the in-process inner runs do not re-import it

HAS_MPL = importlib.util.find_spec("matplotlib") is not None


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
import agcheck as ag
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
    with pytest.raises(ag.GradcheckError) as info:
        agcheck.gradcheck(Twice.apply, (make_input(),))
    assert isinstance(info.value, AssertionError)
    assert isinstance(info.value, AgcheckFailure)
    from torch.autograd.gradcheck import GradcheckError as TorchGradcheckError
    assert isinstance(info.value, TorchGradcheckError)  # a torch check's failure stays torch's
    assert "Jacobian mismatch" in str(info.value)
    if hasattr(info.value, "report"):
        assert info.value.report.check == "jacobian"
    assert agcheck.gradcheck(Twice.apply, (make_input(),), raise_exception=False) is False
'''


def test_checks_pass_fail_and_report(pytester, tmp_path):
    pytester.makepyfile(test_it=CHECKS)
    out_dir = tmp_path / "reports"
    result = run(pytester, f"--agcheck-report-dir={out_dir}")
    result.assert_outcomes(passed=2, failed=1)
    out = result.stdout.str()
    # the failure shows torch's message and the report summary
    assert "Jacobian mismatch for output 0 with respect to input 0" in out
    assert "agcheck report: check 'jacobian' failed" in out
    assert "AgcheckFailure" in out
    if _reports_saveable():
        files = sorted(p.name for p in out_dir.glob("*.html"))
        # test_bad saved one report, test_raises (which caught its failure) another
        assert len(files) == 2, files
        assert any("test_bad" in f for f in files)
        assert "<html" in (out_dir / files[0]).read_text(encoding="utf-8").lower()
        assert "agcheck report saved to" in out
        assert "agcheck reports" in out  # terminal summary section


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
