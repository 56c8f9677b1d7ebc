"""The main job (``agcheck`` without a subcommand), its catalog and the progress display.

Every gradient test has two halves: each catalog function passes agcheck.gradcheck and
agrees across backends (the whole main job, run once as a subprocess), and each one with
its derivative deliberately scaled by 1.5 fails agcheck.gradcheck. Where a backend skips
a function, a test shows that its reason holds (MLX's float64 exp is float32-accurate, ...).

The whole main job runs once for the module, with no time budget: if that run fails,
``test_whole_main_job`` says how, and the tests that read its table are skipped with a
pointer to it (the run is not repeated).
"""
from __future__ import annotations

import contextlib
import html
import importlib.util
import io
import os
import re
import subprocess
import sys
import time

import numpy as np
import pytest

import agcheck
from agcheck.__main__ import main as agcheck_main
from agcheck.frontends import catalog
from agcheck.frontends import mainjob
from agcheck.frontends import mainjob_checks
from agcheck.progress import Progress

torch = pytest.importorskip("torch")
try:
    import jax
    import jax.numpy as jnp
except ImportError:  # the main job runs without jax; the jax halves skip
    jax = jnp = None

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENTRIES = list(catalog.CATALOG)
IDS = [e.name for e in ENTRIES]
HAS_TF = importlib.util.find_spec("tensorflow") is not None
HAS_MLX = importlib.util.find_spec("mlx") is not None
BACKENDS = (["torch"] + (["jax"] if jax is not None else []) + (["tensorflow"] if HAS_TF else [])
            + (["mlx"] if HAS_MLX else []) + ["numpy"])
needs_mlx = pytest.mark.skipif(not HAS_MLX, reason="needs mlx")
#: a prelude that hides the optional frameworks a test does not want
NO_TF = "sys.modules['tensorflow'] = None; "
NO_MLX = "sys.modules['mlx'] = None; "
#: a safety net against a hung subprocess only (the whole job takes about 30 s of CPU
#: time); a slow machine is not a failure
SAFETY_TIMEOUT_S = 1800
#: the cells of the summary table that are statuses (the kinds and the times are not)
STATUSES = {"pass", "FAIL", "ERROR", "-", "skip", "agree", "DIFFER"}


def _env():
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("COLUMNS", None)
    return env


def _agcheck(*args, cwd, timeout=SAFETY_TIMEOUT_S, prelude=None, env=None):
    """``python -m agcheck ARGS`` (or, with ``prelude``, the same through ``-c`` after it)."""
    if prelude is None:
        cmd = [sys.executable, "-m", "agcheck", *args]
    else:
        code = f"{prelude}\nimport sys\nfrom agcheck.__main__ import main\nsys.exit(main({list(args)!r}))"
        cmd = [sys.executable, "-c", code]
    return subprocess.run(cmd, cwd=cwd, env=env or _env(), capture_output=True, text=True, timeout=timeout)


def _table(stdout: str) -> str:
    """The summary table: from its header line to the first blank line after it."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if re.match(r"function\s+kind\s", line))
    end = next((i for i in range(start + 1, len(lines)) if not lines[i].strip()), len(lines))
    return "\n".join(lines[start:end])


def _rows(stdout: str) -> dict:
    """The summary table's rows: {function: [cells...]}."""
    rows = {}
    for line in _table(stdout).splitlines():
        cells = line.split()
        if cells and cells[0] in IDS + ["exp_broken_backward"]:
            rows[cells[0]] = cells
    return rows


def _statuses(stdout: str, backends=None) -> dict:
    """{function: {backend or "crosscheck": status}} read from the table (the kinds may
    wrap onto a second line, the statuses never do)."""
    columns = list(backends or BACKENDS) + ["crosscheck"]
    out = {}
    for name, cells in _rows(stdout).items():
        found = [c for c in cells[1:] if c in STATUSES]
        assert len(found) == len(columns), (name, cells)
        out[name] = dict(zip(columns, found))
    return out


def _expected(entry, backend: str) -> str:
    """The table's cell for a passing ``entry`` on ``backend``."""
    if entry.exclusion(backend) is not None:
        return "skip"
    return "pass" if entry.supports(backend) else "-"


@contextlib.contextmanager
def _x64():
    if jax is None:
        yield
        return
    with jax.enable_x64(True):
        yield


# -- the catalog ----------------------------------------------------------------------------

def test_catalog_covers_the_kinds():
    assert len(ENTRIES) >= 30
    assert len(set(IDS)) == len(IDS)
    assert not set(IDS) & set(catalog.KINDS)  # --only takes both
    for e in ENTRIES:
        assert e.kinds and set(e.kinds) <= set(catalog.KINDS), e.name
    for kind in catalog.KINDS:
        assert sum(kind in e.kinds for e in ENTRIES) >= 2, kind
    complex_ = [e for e in ENTRIES if "complex" in e.kinds]
    assert all(any(a.dtype == "complex128" for a in e.args) for e in complex_)
    assert all(a.dtype in ("float64", "complex128") for e in ENTRIES for a in e.args)
    assert sum(e.vjp is not None for e in ENTRIES) >= 10  # the NumPy backend takes part
    assert any(e.reverse_only for e in ENTRIES) and any(e.ports for e in ENTRIES)


def test_catalog_inputs_are_seeded_and_away_from_kinks():
    for e in ENTRIES:
        a, b = e.inputs(), e.inputs()
        assert all(np.array_equal(x, y) for x, y in zip(a, b)), e.name
        for arg, x in zip(e.args, a):
            assert x.shape == arg.shape and x.dtype == np.dtype(arg.dtype), e.name
    by = catalog.by_name()
    assert np.all(by["sqrt"].inputs()[0] >= 0.5)
    assert np.all(by["log1p"].inputs()[0] > -0.5)
    assert np.all(np.abs(by["complex_abs"].inputs()[0]) >= 0.5)
    assert np.all(np.abs(by["vector_norm"].inputs()[0]) >= 0.5)
    x = np.sort(by["max"].inputs()[0], axis=1)
    assert np.min(np.diff(x, axis=1)) > 0.2  # no ties
    (a,) = by["det"].inputs()
    assert np.linalg.cond(a) < 10


def test_select_names_and_kinds():
    assert [e.name for e in catalog.select(["sin", "det"])] == ["sin", "det"]
    assert all("complex" in e.kinds for e in catalog.select(["complex"]))
    with pytest.raises(KeyError, match="nope"):
        catalog.select(["sin", "nope"])


def test_ports_are_built_once_and_only_for_their_frameworks():
    for e in ENTRIES:
        if e.ports is not None:
            assert e.ports("torch") is e.ports("torch"), e.name  # built on first use, then kept
            assert e.ports("cupy") is None and not e.supports("cupy"), e.name


def test_importing_catalog_and_progress_imports_no_framework():
    code = ("import sys, agcheck.frontends.catalog, agcheck.progress, agcheck.frontends.mainjob, "
            "agcheck.frontends.cli\n"
            "bad = [m for m in ('torch', 'jax', 'rich') if m in sys.modules]\n"
            "assert not bad, bad")
    proc = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True, text=True,
                          timeout=SAFETY_TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr


# -- each function with a broken derivative fails gradcheck (the second half) ---------------

def _scaled_torch(fn):
    """``fn`` with value unchanged and derivatives (reverse and forward) scaled by 1.5."""
    def broken(*xs):
        out = fn(*xs)
        outs = out if isinstance(out, tuple) else (out,)
        outs = tuple(y + 0.5 * (y - y.detach()) for y in outs)
        return outs if isinstance(out, tuple) else outs[0]

    return broken


def _scaled_jax(fn):
    def broken(*xs):
        out = fn(*xs)
        outs = out if isinstance(out, tuple) else (out,)
        outs = tuple(y + 0.5 * (y - jax.lax.stop_gradient(y)) for y in outs)
        return outs if isinstance(out, tuple) else outs[0]

    return broken


def _scaled_numpy(derivative):
    def broken(inputs, vectors):
        out = derivative(inputs, vectors)
        if isinstance(out, tuple):
            return tuple(None if g is None else 1.5 * g for g in out)
        return 1.5 * out

    return broken


@pytest.mark.parametrize("entry", ENTRIES, ids=IDS)
def test_broken_derivative_fails_on_torch(entry):
    fn = _scaled_torch(entry.function("torch"))
    inputs = mainjob._convert(entry.inputs(), "torch")
    assert agcheck.gradcheck(entry.function("torch"), inputs, check_forward_ad=entry.forward_ad("torch"))
    assert not agcheck.gradcheck(fn, inputs, raise_exception=False)
    if entry.forward_ad("torch"):
        assert not agcheck.gradcheck(fn, inputs, check_forward_ad=True, check_backward_ad=False,
                                     check_undefined_grad=False, raise_exception=False)


@pytest.mark.skipif(jax is None, reason="needs jax")
@pytest.mark.parametrize("entry", ENTRIES, ids=IDS)
def test_broken_derivative_fails_on_jax(entry):
    with _x64():
        inputs = mainjob._convert(entry.inputs(), "jax")
        broken = jax.jit(_scaled_jax(entry.function("jax")))
        with pytest.raises(agcheck.GradcheckError, match="Jacobian mismatch"):
            agcheck.gradcheck(broken, inputs, backend="jax")


@pytest.mark.parametrize("entry", [e for e in ENTRIES if e.vjp is not None], ids=lambda e: e.name)
def test_broken_derivative_fails_on_numpy(entry):
    inputs = entry.inputs()
    assert agcheck.gradcheck(entry.fn, inputs, backend="numpy", vjp=entry.vjp, jvp=entry.jvp,
                             check_forward_ad=entry.jvp is not None)
    assert not agcheck.gradcheck(entry.fn, inputs, backend="numpy", vjp=_scaled_numpy(entry.vjp),
                                 raise_exception=False)
    if entry.jvp is not None:
        assert not agcheck.gradcheck(entry.fn, inputs, backend="numpy", jvp=_scaled_numpy(entry.jvp),
                                     check_forward_ad=True, check_backward_ad=False, raise_exception=False)


# -- MLX: what it checks, and why it skips the rest -------------------------------------------

MLX_ENTRIES = [e for e in ENTRIES if e.supports("mlx")]
MLX_SKIPPED = [e for e in ENTRIES if e.exclusion("mlx") is not None]
#: the float32 recipe of docs/accuracy.md
FLOAT32 = dict(eps="auto", stencil="five-point", atol=1e-4, rtol=1e-3)


def _mx():
    import mlx.core as mx

    return mx


def _scaled_mlx(fn):
    mx = _mx()

    def broken(*xs):
        out = fn(*xs)
        outs = out if isinstance(out, tuple) else (out,)
        outs = tuple(y + 0.5 * (y - mx.stop_gradient(y)) for y in outs)
        return outs if isinstance(out, tuple) else outs[0]

    return broken


def _largest_difference(values, reference) -> float:
    """The largest difference of ``values`` from NumPy's ``reference``, relative to its size
    (at least 1)."""
    values = values if isinstance(values, tuple) else (values,)
    reference = reference if isinstance(reference, tuple) else (reference,)
    return max(float(np.max(np.abs(np.asarray(v) - r) / np.maximum(1.0, np.abs(r))))
               for v, r in zip(values, reference))


def test_the_catalog_covers_mlx_or_says_why_not():
    """MLX checks the real functions it computes at float64 accuracy and differentiates;
    every other one is skipped for one of three stated reasons."""
    assert len(MLX_ENTRIES) >= 20
    assert "custom" in {k for e in MLX_ENTRIES for k in e.kinds} and "linalg" in {k for e in MLX_ENTRIES for k in e.kinds}
    assert {e.exclusion("mlx") for e in MLX_SKIPPED} == {catalog.MLX_FLOAT32_INSIDE, catalog.MLX_NO_COMPLEX128,
                                                         catalog.MLX_NO_DERIVATIVE}
    assert all(e.supports("mlx") or e.exclusion("mlx") is not None for e in ENTRIES)
    assert all(e.exclusion("mlx") == catalog.MLX_NO_COMPLEX128 for e in ENTRIES if "complex" in e.kinds)
    assert catalog.demo_failure_entry().exclusion("mlx") == catalog.MLX_FLOAT32_INSIDE
    assert all(e.exclusion(b) is None for e in ENTRIES for b in ("torch", "jax", "numpy"))


def test_the_docs_say_what_mlx_checks_and_skips():
    def read(page):
        with open(os.path.join(ROOT, page), encoding="utf-8") as f:
            return " ".join(f.read().split())

    cli, readme = read("docs/cli.md"), read("README.md")
    assert f"MLX (0.32.4, CPU) checks {len(MLX_ENTRIES)} of the {len(ENTRIES)} functions" in cli
    assert f"MLX checks the {len(MLX_ENTRIES)} functions" in readme
    for reason in (catalog.MLX_FLOAT32_INSIDE, catalog.MLX_NO_DERIVATIVE):
        names = [e.name for e in MLX_SKIPPED if e.exclusion("mlx") == reason]
        assert "| " + ", ".join(f"`{n}`" for n in names) + " |" in cli, names
    complex_ = [e for e in MLX_SKIPPED if e.exclusion("mlx") == catalog.MLX_NO_COMPLEX128]
    assert complex_ == [e for e in ENTRIES if "complex" in e.kinds] and len(complex_) == 8
    assert "| the eight `complex` functions |" in cli


@needs_mlx
@pytest.mark.parametrize("entry", MLX_ENTRIES, ids=lambda e: e.name)
def test_mlx_computes_each_function_it_checks_as_numpy_does(entry):
    """agcheck.backends.mlx_xp maps each array-API name the catalog uses to the MLX
    operation that computes it, at float64 accuracy (what a float64 check needs)."""
    mx = _mx()
    inputs = entry.inputs()
    with mx.stream(mx.cpu):
        values = entry.function("mlx")(*mainjob._convert(inputs, "mlx"))
    assert _largest_difference(values, entry.fn(*inputs)) < 1e-13


@needs_mlx
@pytest.mark.parametrize("entry", MLX_ENTRIES, ids=lambda e: e.name)
def test_broken_derivative_fails_on_mlx(entry):
    mx = _mx()
    inputs = mainjob._convert(entry.inputs(), "mlx")
    forward = entry.forward_ad("mlx")
    assert agcheck.gradcheck(mainjob.port(entry, "mlx"), inputs, backend="mlx", check_forward_ad=forward)
    broken = mx.compile(_scaled_mlx(entry.function("mlx")))
    with pytest.raises(agcheck.GradcheckError, match="Jacobian mismatch"):
        agcheck.gradcheck(broken, inputs, backend="mlx")
    if forward:
        assert not agcheck.gradcheck(broken, inputs, backend="mlx", check_forward_ad=True, check_backward_ad=False,
                                     check_undefined_grad=False, raise_exception=False)


@needs_mlx
@pytest.mark.parametrize("entry", MLX_SKIPPED + [catalog.demo_failure_entry()], ids=lambda e: e.name)
def test_each_reason_mlx_skips_a_function_for_holds(entry):
    """Each skip is needed (with mlx 0.32.4): the function's float64 values are
    float32-accurate and fail a float64 check, or MLX does not differentiate it, or it
    has complex128 inputs, which MLX cannot hold. Once MLX fixes one, this says so: lift
    the skip in agcheck/frontends/catalog.py."""
    import warnings

    mx = _mx()
    reason = entry.exclusion("mlx")
    fn = entry.ports("mlx") if entry.ports is not None else entry.fn
    if reason == catalog.MLX_NO_COMPLEX128:
        assert not hasattr(mx, "complex128")  # complex128 inputs become complex64
        assert mx.complex64 in {a.dtype for a in mainjob._convert(entry.inputs(), "mlx")}
        return
    inputs = entry.inputs()
    with mx.stream(mx.cpu):
        converted = mainjob._convert(inputs, "mlx")
        if reason == catalog.MLX_FLOAT32_INSIDE:
            assert _largest_difference(fn(*converted), entry.fn(*inputs)) > 1e-10  # float32 rounding
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                assert not agcheck.gradcheck(fn, converted, backend="mlx", raise_exception=False)
        else:
            assert reason == catalog.MLX_NO_DERIVATIVE
            assert _largest_difference(fn(*converted), entry.fn(*inputs)) < 1e-13  # computed, but
            with pytest.raises(ValueError, match="(?i)vjp"):  # not differentiated
                mx.vjp(lambda *xs: [fn(*xs)], list(converted), [fn(*converted)])


@needs_mlx
def test_the_mlx_ports_are_right_in_float32():
    """The hand-written MLX ports: softplus (skipped by the main job, float64 exp being
    float32-accurate) passes in float32 with float32's recipe and its broken copy fails;
    cube's vjp passes in float64."""
    import warnings

    mx = _mx()
    by = catalog.by_name()
    softplus = by["softplus_custom"].ports("mlx")
    (x,) = (mx.array(a, dtype=mx.float32) for a in by["softplus_custom"].inputs())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "not double precision"
        assert agcheck.gradcheck(softplus, (x,), check_forward_ad=True, **FLOAT32)
        assert not agcheck.gradcheck(_scaled_mlx(softplus), (x,), raise_exception=False, **FLOAT32)
    cube = by["cube_custom_vjp"]
    assert agcheck.gradcheck(cube.ports("mlx"), mainjob._convert(cube.inputs(), "mlx"))


# -- the whole main job, once (the first half: everything passes and agrees) ----------------

class WholeJob:
    """The one run of the whole main job: its process, or why it did not finish."""

    def __init__(self, cwd):
        self.cwd = cwd
        self.proc = None
        self.problem = None
        start = time.perf_counter()
        try:
            self.proc = _agcheck(cwd=cwd)
        except subprocess.TimeoutExpired as e:
            self.problem = f"the main job did not finish within the {SAFETY_TIMEOUT_S} s safety net:\n{e.stdout}"
        self.elapsed = time.perf_counter() - start
        if self.proc is not None and self.proc.returncode != 0:
            self.problem = (f"the main job exited {self.proc.returncode}:\n{self.proc.stdout}\n{self.proc.stderr}")

    def table(self) -> str:
        """The run's output, for the tests that read its table: skipped if the run failed
        (test_whole_main_job reports why)."""
        if self.problem is not None:
            pytest.skip("the whole main job's run failed: see test_whole_main_job")
        return self.proc.stdout


@pytest.fixture(scope="module")
def whole_job(tmp_path_factory):
    return WholeJob(tmp_path_factory.mktemp("mainjob"))


def test_whole_main_job(whole_job):
    print(f"whole main job: {whole_job.elapsed:.1f}s")
    assert whole_job.problem is None, whole_job.problem
    out, cwd = whole_job.proc.stdout, whole_job.cwd
    assert re.search(r"function\s+kind\s+torch\s+" + (r"jax\s+" if jax is not None else "")
                     + (r"tensorflow\s+" if HAS_TF else "") + (r"mlx\s+" if HAS_MLX else "")
                     + r"numpy\s+crosscheck\s+time", out)
    assert f"all {len(ENTRIES)} functions passed" in out
    assert "\x1b[" not in out  # a pipe gets plain text
    assert "loading torch" in whole_job.proc.stderr.splitlines()[0]  # said at once
    report = cwd / mainjob.DEFAULT_REPORT
    assert report.exists()
    text = report.read_text(encoding="utf-8")
    assert text.startswith("<!doctype html>") and "all checks passed" in text
    assert all(f"<b>{name}</b>" in text for name in IDS)
    assert "<script src" not in text and "<link" not in text  # self-contained
    if HAS_MLX:  # every function MLX skips is named with its reason, on the terminal and in the report
        skipped = [e for e in ENTRIES if e.exclusion("mlx") is not None]
        assert skipped and re.search(rf", {len(skipped) + HAS_TF} skipped for the reasons above\)", out)
        for reason in {e.exclusion("mlx") for e in skipped}:
            names = ", ".join(e.name for e in skipped if e.exclusion("mlx") == reason)
            assert f"skip on mlx: {names}: {reason}" in out
            assert html.escape(f"skip on mlx: {names}: {reason}") in text


@pytest.mark.parametrize("entry", ENTRIES, ids=IDS)
def test_every_function_passes_and_agrees_across_backends(whole_job, entry):
    cells = _statuses(whole_job.table()).get(entry.name)
    assert cells is not None, whole_job.proc.stdout
    for b in BACKENDS:
        assert cells[b] == _expected(entry, b), (b, cells)
    # compared wherever two of the installed backends check it (torch alone: nothing to compare)
    assert cells["crosscheck"] == ("agree" if sum(map(entry.supports, BACKENDS)) >= 2 else "-"), cells


def test_the_run_s_failure_is_reported_once_and_the_readers_skip(tmp_path, monkeypatch):
    """A failed run of the whole job is one failure (test_whole_main_job's), not one per test."""
    def failed(*args, **kwargs):
        raise subprocess.TimeoutExpired(cmd="agcheck", timeout=SAFETY_TIMEOUT_S, output="half a table")

    monkeypatch.setattr(sys.modules[__name__], "_agcheck", failed)
    run = WholeJob(tmp_path)
    assert "did not finish" in run.problem and "half a table" in run.problem
    with pytest.raises(pytest.skip.Exception, match="see test_whole_main_job"):
        run.table()


# -- subsets, failures, options -------------------------------------------------------------

def test_subset(tmp_path):
    proc = _agcheck("--only", "sin,det,abs_squared,softplus_custom", "--report", "out.html", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = _statuses(proc.stdout)
    assert set(rows) == {"sin", "det", "abs_squared", "softplus_custom"}
    assert rows["sin"]["torch"] == "pass" and rows["sin"]["crosscheck"] == "agree"
    assert "all 4 functions passed" in proc.stdout
    assert not (tmp_path / mainjob.DEFAULT_REPORT).exists()
    text = (tmp_path / "out.html").read_text(encoding="utf-8")
    assert all(name in text for name in rows)
    assert "cholesky" not in text


def test_demo_failure_exits_1_with_the_report(tmp_path):
    proc = _agcheck("--only", "exp", "--demo-failure", cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    out = proc.stdout
    row = _statuses(out)["exp_broken_backward"]
    # torch is wrong, not jax/numpy (the demo has no TensorFlow port; MLX's exp is float32-accurate)
    assert row == {**{b: "pass" for b in BACKENDS}, "torch": "FAIL", "crosscheck": "DIFFER",
                   **({"tensorflow": "-"} if HAS_TF else {}), **({"mlx": "skip"} if HAS_MLX else {})}
    exp = _statuses(out)["exp"]
    assert exp == {**{b: _expected(catalog.by_name()["exp"], b) for b in BACKENDS}, "crosscheck": "agree"}
    assert "Jacobian mismatch for output 0 with respect to input 0" in out
    assert "[factor] analytical = 2.00 x numerical" in out
    assert "FAILED: 1 of 2 functions (exp_broken_backward)" in out
    text = (tmp_path / mainjob.DEFAULT_REPORT).read_text(encoding="utf-8")
    assert "exp_broken_backward: gradcheck on torch" in text and "exp_broken_backward: crosscheck" in text
    assert "[factor]" in text and "Jacobian mismatch" in text
    if _has("matplotlib"):
        assert "data:image/png;base64," in text  # the failure report's heatmaps


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def test_usage_errors_and_list(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    main = agcheck_main

    for argv, message in [(["--only", "nope"], "unknown function or kind: nope"),
                          (["--only", ","], "--only needs"),
                          (["--backends", "pytorch"], "unknown backend pytorch"),
                          (["--backends", ""], "--backends needs"),
                          (["--bogus"], "unrecognized arguments"),
                          (["--report", str(tmp_path)], "is a folder"),
                          (["--report", str(tmp_path / "missing" / "r.html")], "does not exist")]:
        assert main(argv) == 2, argv
        assert message in capsys.readouterr().err
    assert main(["--list"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in IDS) and f"{len(ENTRIES)} functions" in out
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "--demo-failure" in out and "{check,crosscheck}" in out
    assert list(tmp_path.iterdir()) == []  # --list and --help write no report


def test_a_report_that_cannot_be_written(capsys, tmp_path, monkeypatch):
    """Refused before the run when its folder is missing (nothing is loaded); exit 2 when the
    writing fails afterwards, the checks having passed."""
    monkeypatch.chdir(tmp_path)
    loaded = []
    monkeypatch.setattr(mainjob, "detect_backends", lambda *a, **k: loaded.append(a) or {})
    assert agcheck_main(["--only", "sin", "--report", "missing/r.html"]) == 2
    assert "the folder" in capsys.readouterr().err and not loaded
    monkeypatch.undo()
    monkeypatch.chdir(tmp_path)

    def unwritable(*args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(mainjob, "html_report", unwritable)
    assert agcheck_main(["--only", "sin", "--backends", "numpy", "-q", "--report", "r.html"]) == 2
    captured = capsys.readouterr()
    assert "all 1 function passed" in captured.out
    assert "could not write the report" in captured.err and "No space left" in captured.err


def test_something_is_said_before_the_frameworks_load(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    said = []
    detect = mainjob.detect_backends

    def detect_later(*args, **kwargs):
        said.append(capsys.readouterr().err)  # what the user saw before the imports began
        return detect(*args, **kwargs)

    monkeypatch.setattr(mainjob, "detect_backends", detect_later)
    assert agcheck_main(["--only", "sin", "--backends", "torch,numpy", "--no-report"]) == 0
    assert said and "loading torch (importing the frameworks takes a few seconds)" in said[0]
    assert agcheck_main(["--only", "sin", "--backends", "numpy", "--no-report", "-q"]) == 0
    assert "loading" not in said[-1] + capsys.readouterr().err  # --quiet says nothing


def test_the_progress_label_estimates_the_time_left():
    assert mainjob_checks.time_left(0, 10, 0.0) == ""  # nothing to go on yet
    assert mainjob_checks.time_left(2, 10, 4.0) == " (about 16 s left)"
    assert mainjob_checks.time_left(1, 100, 60.0) == " (about 99 min left)"
    assert mainjob_checks.time_left(10, 10, 4.0) == ""

    class Recorder:
        def __init__(self):
            self.labels = []

        def start(self, total, description=""):
            self.labels.append(description)

        def update(self, description=None, **kw):
            self.labels.append(description)

        def advance(self, n=1):
            pass

    bar = Recorder()
    entries = [e for e in ENTRIES if e.vjp is not None][:3]
    results = mainjob_checks.run(entries, ["numpy"], progress=bar)
    assert all(r.ok for r in results)
    first = [label for label in bar.labels if label.startswith(entries[0].name)]
    later = [label for label in bar.labels if label.startswith(entries[1].name)]
    assert first and "left)" not in first[0]
    assert later and later[0].endswith(" s left)")


def test_the_table_reads_at_80_columns(tmp_path):
    env = dict(_env(), COLUMNS="80")
    proc = _agcheck("--only", "sin,tanh,softplus_custom,complex_abs", "--demo-failure", "--no-report", cwd=tmp_path,
                    env=env)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    table = _table(proc.stdout)
    assert max(len(line.rstrip()) for line in table.splitlines()) <= 80, table
    header = table.splitlines()[0].split()
    assert header[:3] == ["function", "kind", "torch"] and header[-2:] in (["crosscheck", "time"],
                                                                            ["cross", "time"])
    rows = _statuses(proc.stdout)  # every status whole: "pass", never "pa..."
    assert rows["tanh"] == {**{b: "pass" for b in BACKENDS}, "crosscheck": "agree"}
    sin = catalog.by_name()["sin"]
    assert rows["sin"] == {**{b: _expected(sin, b) for b in BACKENDS}, "crosscheck": "agree"}
    assert rows["exp_broken_backward"]["torch"] == "FAIL"
    assert rows["exp_broken_backward"]["crosscheck"] == "DIFFER"
    assert "..." not in table and "…" not in table


def test_subcommands_still_dispatched(capsys):
    main = agcheck_main

    assert main(["check", "--help"]) == 0
    assert "MODULE:FUNCTION" in capsys.readouterr().out
    assert main(["crosscheck", "nocolon", "-i", "3"]) == 2
    assert "MODULE:FUNCTION" in capsys.readouterr().err


def test_quiet_and_no_report(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert agcheck_main(["--only", "sin", "--backends", "torch,numpy", "--quiet", "--no-report"]) == 0
    out = capsys.readouterr().out
    assert "all 1 function passed" in out and "function" not in out.split("all")[0]
    assert list(tmp_path.iterdir()) == []


def test_without_jax_runs_on_torch_alone(tmp_path):
    proc = _agcheck("--only", "sin,det", "--no-report", cwd=tmp_path,
                    prelude="import sys; " + NO_TF + NO_MLX + "sys.modules['jax'] = None")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "jax is not installed: checking on torch alone" in proc.stdout
    assert "mlx is not installed: not checking on MLX; install agcheck[mlx]" in proc.stdout
    assert "jax" not in proc.stdout.split("function", 1)[1].splitlines()[0]  # no jax column
    assert _statuses(proc.stdout, ["torch", "numpy"])["det"] == {"torch": "pass", "numpy": "-", "crosscheck": "-"}
    proc = _agcheck("--backends", "jax", cwd=tmp_path, prelude="import sys; " + NO_TF + "sys.modules['jax'] = None")
    assert proc.returncode == 2 and "jax is not installed" in proc.stderr
    proc = _agcheck("--backends", "torch,mlx", cwd=tmp_path, prelude="import sys; " + NO_MLX)
    assert proc.returncode == 2 and "mlx is not installed (pip install 'agcheck[mlx]')" in proc.stderr


def test_without_torch_and_jax_runs_numpy_only(tmp_path):
    proc = _agcheck("--no-report", cwd=tmp_path,
                    prelude="import sys; " + NO_TF + NO_MLX + "sys.modules['jax'] = None; sys.modules['torch'] = None")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "neither torch nor jax is installed" in proc.stdout and "numpy only" in proc.stdout
    n = sum(e.vjp is not None or e.jvp is not None for e in ENTRIES)
    assert f"all {n} functions passed" in proc.stdout


@pytest.mark.skipif(jax is None, reason="needs jax")
@pytest.mark.parametrize("setting", [None, False, True])
def test_jax_config_is_restored(setting, tmp_path, monkeypatch, capsys):
    """The main job switches x64 on only inside contexts: the caller's setting survives."""
    monkeypatch.chdir(tmp_path)
    outer = contextlib.nullcontext() if setting is None else jax.enable_x64(setting)
    with outer:
        before = bool(jax.config.jax_enable_x64)
        assert agcheck_main(["--only", "abs_squared,softplus_custom", "--no-report", "-q"]) == 0
        assert bool(jax.config.jax_enable_x64) == before
        assert jnp.asarray(1.0).dtype == (jnp.float64 if before else jnp.float32)
    capsys.readouterr()


# -- the progress display -------------------------------------------------------------------

def test_progress_disabled_is_silent():
    buf = io.StringIO()
    with Progress(enabled=False, file=buf) as p:
        p.start(3, "x")
        p.advance()
        p.update(description="y")
        p.advance(2)
    assert buf.getvalue() == "" and p.completed == 3 and p.total == 3


def test_progress_draws_on_a_terminal_and_not_in_a_pipe():
    from rich.console import Console

    buf = io.StringIO()
    with Progress(console=Console(file=buf, force_terminal=True, width=80), transient=False) as p:
        p.start(4, "checking")
        p.advance()
        p.update(description="checking more")
        p.advance(3)
    assert "checking more" in buf.getvalue() and "4/4" in buf.getvalue()
    pipe = io.StringIO()  # not a terminal: rich draws nothing, a transient bar leaves nothing
    with Progress(file=pipe) as p:
        p.start(2, "quiet")
        p.advance(2)
    assert pipe.getvalue() == ""
    p.start(5, "again")  # restartable after close
    assert p.completed == 0 and p.total == 5
    p.close()
    p.close()  # idempotent
