"""The command line (agcheck/cli.py): ``agcheck check`` and ``agcheck crosscheck``."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest

from agcheck.frontends import cli

pytest.importorskip("torch")

HAS_JAX = importlib.util.find_spec("jax") is not None
HAS_MPL = importlib.util.find_spec("matplotlib") is not None
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

USER_MODULE = textwrap.dedent('''
    import torch


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


    def good(x, w):
        return torch.tanh(x @ w)


    def good_complex(z):
        return (z * z.conj()).real + torch.sin(z).real


    def bad(x):
        return Twice.apply(x)


    def xp_sin(x):
        import array_api_compat

        xp = array_api_compat.array_namespace(x)
        return xp.sin(x) * x


    def ports_disagree(x):
        import array_api_compat

        xp = array_api_compat.array_namespace(x)
        if "jax" in type(x).__module__:
            import jax

            @jax.custom_vjp
            def f(x):
                return xp.sin(x)

            f.defvjp(lambda x: (xp.sin(x), x), lambda x, g: (2 * g * xp.cos(x),))
            return f(x)
        return xp.sin(x)


    NOT_CALLABLE = 3
''')


@pytest.fixture
def user_module(tmp_path):
    path = tmp_path / "userops.py"
    path.write_text(USER_MODULE)
    return path


# -- input specs -------------------------------------------------------------------------------

def test_parse_input_spec():
    assert cli.parse_input_spec("3x4") == ((3, 4), "float64")
    assert cli.parse_input_spec("4:complex128") == ((4,), "complex128")
    assert cli.parse_input_spec("scalar:float32") == ((), "float32")
    assert cli.parse_input_spec("2x3x1") == ((2, 3, 1), "float64")
    for bad in ("3y4", "3x4:float128", "", ":float64", "3x-1"):
        with pytest.raises(cli.UsageError):
            cli.parse_input_spec(bad)


def test_make_inputs_torch_seeded():
    import torch

    specs = [((3, 4), "float64"), ((4,), "complex128"), ((2,), "int64")]
    a = cli.make_inputs(specs, "torch", seed=1)
    b = cli.make_inputs(specs, "torch", seed=1)
    assert [t.dtype for t in a] == [torch.float64, torch.complex128, torch.int64]
    assert [tuple(t.shape) for t in a] == [(3, 4), (4,), (2,)]
    assert a[0].requires_grad and a[1].requires_grad and not a[2].requires_grad
    assert all(torch.equal(x.detach(), y.detach()) for x, y in zip(a, b))
    c = cli.make_inputs(specs, "torch", seed=2)
    assert not torch.equal(a[0].detach(), c[0].detach())


# -- agcheck check (in process) ----------------------------------------------------------------

def test_check_passes(user_module, capsys):
    rc = cli.main(["check", f"{user_module}:good", "--input", "3x4", "--input", "4x2", "--plain"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "PASSED" in out and "3x4 float64, 4x2 float64" in out


def test_check_complex_fast_forward(user_module, capsys):
    rc = cli.main(["check", f"{user_module}:good_complex", "--input", "4:complex128", "--fast", "--forward",
                   "--plain"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "fast, reverse + forward" in out


def test_check_fails_with_summary_and_report(user_module, tmp_path, capsys):
    report = tmp_path / "out.html"
    rc = cli.main(["check", f"{user_module}:bad", "--input", "2x3", "--report", str(report), "--plain"])
    out = capsys.readouterr().out
    assert rc == 1
    assert "FAILED" in out and "Jacobian mismatch" in out
    assert "agcheck report: check 'jacobian' failed" in out
    if HAS_MPL:
        assert report.exists() and "<html" in report.read_text(encoding="utf-8").lower()
        assert "report saved to" in out


def test_check_module_by_dotted_name(user_module, monkeypatch, capsys):
    monkeypatch.chdir(user_module.parent)
    monkeypatch.syspath_prepend(str(user_module.parent))
    assert cli.main(["check", "userops:good", "-i", "2x3", "-i", "3", "--plain"]) == 0
    assert "PASSED" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["check", "nocolon", "-i", "3"], "MODULE:FUNCTION"),
    (["check", "no_such_module_xyz:f", "-i", "3"], "cannot import module"),
    (["check", "{mod}:missing", "-i", "3"], "has no attribute"),
    (["check", "{mod}:NOT_CALLABLE", "-i", "3"], "not callable"),
    (["check", "{mod}:good", "-i", "3x4"], "could not run"),  # good takes two arguments
    (["check", "{mod}:good"], "--input"),
    (["check", "{mod}:good", "-i", "3x4", "-i", "4", "--backend", "nosuch"], "unknown backend"),
    (["crosscheck", "{mod}:xp_sin", "-i", "3", "--backends", "torch"], "at least two"),
])
def test_usage_errors(user_module, capsys, argv, message):
    argv = [a.replace("{mod}", str(user_module)) for a in argv]
    assert cli.main(argv) == 2
    assert message in capsys.readouterr().err


def test_argparse_errors_and_help(capsys):
    assert cli.main([]) == 2
    assert cli.main(["check", "m:f", "--bogus"]) == 2
    capsys.readouterr()
    assert cli.main(["--help"]) == 0
    assert "crosscheck" in capsys.readouterr().out
    for sub in ("check", "crosscheck"):
        assert cli.main([sub, "--help"]) == 0
        out = capsys.readouterr().out
        assert "MODULE:FUNCTION" in out and "--input" in out and "Exit status" in out


# -- agcheck crosscheck ------------------------------------------------------------------------

@pytest.mark.skipif(not HAS_JAX, reason="needs jax")
def test_crosscheck(user_module, capsys):
    rc = cli.main(["crosscheck", f"{user_module}:xp_sin", "-i", "3", "--backends", "torch,jax", "--plain"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "all backends agree" in out
    rc = cli.main(["crosscheck", f"{user_module}:ports_disagree", "-i", "3", "--no-forward", "--plain"])
    out = capsys.readouterr().out
    assert rc == 1, out
    assert "torch and jax disagree" in out and "DISAGREEMENT" in out


# -- python -m agcheck.frontends.cli (subprocess) --------------------------------------------------------

def _run(*args, cwd):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "agcheck.frontends.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=240)


def test_subprocess_failure_and_usage(user_module):
    proc = _run("check", "userops:bad", "--input", "2x3", cwd=user_module.parent)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "FAILED" in proc.stdout and "Jacobian mismatch" in proc.stdout
    assert "agcheck report: check 'jacobian' failed" in proc.stdout
    proc = _run("check", "userops.py:good", "--input", "3xq", cwd=user_module.parent)
    assert proc.returncode == 2
    assert "--input" in proc.stderr



@pytest.mark.skipif(not HAS_JAX, reason="needs jax")
def test_jax_configuration_is_restored_after_an_in_process_command(user_module, capsys):
    import jax

    before = bool(jax.config.jax_enable_x64)
    jax.config.update("jax_enable_x64", False)
    try:
        rc = cli.main(["check", f"{user_module}:xp_sin", "-i", "3", "--backend", "jax", "--plain"])
        assert rc == 0
        assert bool(jax.config.jax_enable_x64) is False
    finally:
        jax.config.update("jax_enable_x64", before)
