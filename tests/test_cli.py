"""The command line (agcheck/frontends/cli.py): the one parser, ``agcheck check`` and
``agcheck crosscheck``, and their exit statuses (0 pass, 1 a check failed, 2 a usage
error or a check that could not run)."""
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


    def exits(x):
        raise SystemExit(0)


    def exits_with_an_error(x):
        raise SystemExit("bye")


    def noisy(x):
        print("CALLED")
        return torch.sin(x)


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
    assert cli.main(["check", "m:f", "--bogus"]) == 2
    assert cli.main(["chekc"]) == 2
    assert "invalid choice: 'chekc'" in capsys.readouterr().err
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    # one parser: the subcommands, the main job's options and the shared flags together
    assert "{check,crosscheck}" in out and "gradcheck a function of yours" in out
    assert "--only" in out and "--demo-failure" in out and "--fast, --fast-mode" in out
    assert "--quiet, -q" in out and "--verbose, -v" in out and "--plain" in out
    assert "2 usage error" in " ".join(out.split())
    for sub in ("check", "crosscheck"):
        assert cli.main([sub, "--help"]) == 0
        out = capsys.readouterr().out
        assert "MODULE:FUNCTION" in out and "--input" in out and "Exit status" in out
        assert "--fast" in out and "--quiet" in out and "--plain" in out and "--report" in out


# -- exit statuses: refused before any work (2), a function that cannot run (2) ------------------

@pytest.mark.parametrize("argv, message", [
    (["check", "{mod}:noisy", "--input", "100000x100000"], "would not fit in a quarter of this machine's memory"),
    (["check", "{mod}:noisy", "-i", "3", "--seed", "-1"], "argument --seed: must be 0 or more, got -1"),
    (["check", "{mod}:noisy", "-i", "3", "--seed", "x"], "argument --seed: not a whole number"),
    (["check", "{mod}:noisy", "-i", "3", "--report", "{tmp}/out.txt"], "cannot write a report as '.txt'"),
    (["check", "{mod}:noisy", "-i", "3", "--report", "{tmp}/no_such_folder/out.json"], "does not exist"),
    (["check", "{mod}:noisy", "-i", "3", "--report", "{tmp}"], "is a folder"),
    (["check", "{mod}:noisy", "-i", "3", "--atol", "-1"], "atol must be greater than or equal to zero"),
    (["check", "{mod}:noisy", "-i", "3", "--eps", "x"], "argument --eps: not a number"),
    (["crosscheck", "{mod}:noisy", "-i", "3", "--rtol", "-1"], "rtol must be"),
    (["--only", "sin", "check", "{mod}:noisy", "-i", "3"], "--only: an option of the main job"),
    (["--no-report", "crosscheck", "{mod}:noisy", "-i", "3"], "--no-report: an option of the main job"),
])
def test_bad_arguments_are_refused_before_any_work(user_module, tmp_path, capsys, argv, message):
    argv = [a.replace("{mod}", str(user_module)).replace("{tmp}", str(tmp_path)) for a in argv]
    assert cli.main(argv) == 2
    captured = capsys.readouterr()
    assert message in captured.err and "Traceback" not in captured.err
    assert "CALLED" not in captured.out  # the function never ran
    assert list(tmp_path.iterdir()) == [user_module]


@pytest.mark.parametrize("name, code", [("exits", "0"), ("exits_with_an_error", "'bye'")])
def test_a_function_raising_system_exit_is_an_error(user_module, capsys, name, code):
    assert cli.main(["check", f"{user_module}:{name}", "-i", "3", "--plain"]) == 2
    err = capsys.readouterr().err
    assert f"the check could not run: SystemExit({code}) was raised" in err


def test_a_report_with_a_good_suffix_is_written_after_the_failure(user_module, tmp_path, capsys):
    report = tmp_path / "out.json"
    assert cli.main(["check", f"{user_module}:bad", "-i", "3", "--report", str(report), "--plain"]) == 1
    assert report.exists() and '"agcheck-failure-report"' in report.read_text(encoding="utf-8")
    assert cli.main(["check", f"{user_module}:noisy", "-i", "3", "--report", str(tmp_path / "p.json"),
                     "--plain"]) == 0
    assert "no report written" in capsys.readouterr().out and not (tmp_path / "p.json").exists()


def test_an_error_of_agcheck_itself_is_not_a_failed_check(user_module, monkeypatch, capsys):
    def broken(args):
        raise KeyError("a bug")

    monkeypatch.setattr(cli, "_check", broken)
    assert cli.main(["check", f"{user_module}:good", "-i", "3"]) == 2
    err = capsys.readouterr().err
    assert "KeyError" in err and "bug of agcheck's" in err


# -- one vocabulary of flags ---------------------------------------------------------------------

def test_shared_flags_on_every_level(user_module, capsys):
    target = f"{user_module}:good_complex"
    # --fast and --fast-mode are the same flag, before or after the subcommand
    for argv in (["check", target, "-i", "4:complex128", "--fast", "--plain"],
                 ["check", target, "-i", "4:complex128", "--fast-mode", "--plain"],
                 ["--fast", "--plain", "check", target, "-i", "4:complex128"]):
        assert cli.main(argv) == 0, argv
        assert "mode      fast, reverse" in capsys.readouterr().out
    # -q: the verdict alone; -v: the full message after the summary
    assert cli.main(["check", target, "-i", "4:complex128", "-q", "--plain"]) == 0
    assert capsys.readouterr().out.split() == ["verdict", "PASSED"]
    assert cli.main(["-q", "check", f"{user_module}:bad", "-i", "3", "--plain"]) == 1
    out = capsys.readouterr().out
    assert "FAILED (jacobian)" in out and "agcheck report:" not in out and "function" not in out
    assert cli.main(["check", f"{user_module}:bad", "-i", "3", "-v", "--plain"]) == 1
    out = capsys.readouterr().out
    assert "agcheck report:" in out and "numerical:" in out  # the summary, then torch's message


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

def _run(*args, cwd, module="agcheck.frontends.cli"):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    # a safety net against a hung process only, far beyond any run's time
    return subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=1800)


def test_subprocess_failure_and_usage(user_module):
    proc = _run("check", "userops:bad", "--input", "2x3", cwd=user_module.parent)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "FAILED" in proc.stdout and "Jacobian mismatch" in proc.stdout
    assert "agcheck report: check 'jacobian' failed" in proc.stdout
    proc = _run("check", "userops.py:good", "--input", "3xq", cwd=user_module.parent)
    assert proc.returncode == 2
    assert "--input" in proc.stderr
    # python -m agcheck is the same parser; a function raising SystemExit(0) does not exit 0
    proc = _run("check", "userops.py:exits", "--input", "3", cwd=user_module.parent, module="agcheck")
    assert proc.returncode == 2 and "SystemExit(0)" in proc.stderr and "Traceback" not in proc.stderr
    proc = _run("check", "userops.py:good", "--input", "100000x100000", "--seed", "1", cwd=user_module.parent,
                module="agcheck")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr



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


def test_check_asks_for_the_checkers_progress_bar_unless_quiet(user_module, monkeypatch, capsys):
    """The bar itself draws on a terminal only (tests/test_progress_option.py)."""
    seen = []

    def recording(fn, inputs, **kwargs):
        seen.append(kwargs.get("progress"))
        return True

    monkeypatch.setattr(sys.modules["agcheck.gradcheck"], "gradcheck", recording)
    for extra, wanted in (([], True), (["-q"], False), (["--plain"], False)):
        assert cli.main(["check", f"{user_module}:good", "-i", "3x4", "-i", "4x2", *extra]) == 0
        assert seen[-1] is wanted, extra
    capsys.readouterr()
