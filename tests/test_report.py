"""Failure reports (agcheck.report, agcheck.report.render): every GradcheckError carries a
structured ``report`` — failing blocks as NumPy arrays with their largest differences,
options, backend, diagnoses, and the context that reproduces the check — with a short text
summary right after torch's first line (torch's full text following it), a
JSON-serialisable dict, and HTML / PNG renderings."""
from __future__ import annotations

import functools
import json
import re
import subprocess
import sys

import numpy as np
import pytest
import torch

import agcheck
from agcheck import GradcheckError, GradcheckOptions
from agcheck.core.jacobian import PROBE_SEED
from agcheck.report import CheckContext, FailureReport, JacobianBlock
from agcheck.report.messages import REPORT_POINTER, batched_mismatch_message, message_with_summary, not_reentrant_message

from .helpers import ScaledSin, SinWithJvp, make

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
IMG = '<img src="data:image/png;base64,'


def raised(fn, inputs, **kw) -> GradcheckError:
    with pytest.raises(GradcheckError) as info:
        agcheck.gradcheck(fn, inputs, **kw)
    return info.value


def scaled(c):
    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x.sin()

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return g * x.cos() * c

    return F.apply


def one_entry_off_matvec(n, seed=0):
    """tanh(a @ x) for an n x n matrix; the backward is off at one entry."""
    gen = torch.Generator().manual_seed(seed)
    a = torch.randn(n, n, dtype=torch.float64, generator=gen) / n ** 0.5

    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            y = torch.tanh(a @ x)
            ctx.save_for_backward(y)
            return y

        @staticmethod
        def backward(ctx, g):
            (y,) = ctx.saved_tensors
            out = a.T @ (g * (1 - y * y))
            out = out.clone()
            out[7] += 0.5 * g[11]
            return out

    return F.apply


# -- the report's content -----------------------------------------------------------------------

@pytest.mark.parametrize("fast", [False, True], ids=["slow", "fast"])
def test_jacobian_report_content(fast):
    x = make(3, 4)
    err = raised(scaled(2.0), (x,), fast_mode=fast, atol=1e-6)
    rep = err.report
    assert isinstance(rep, FailureReport) and rep.check == err.check == "jacobian"
    assert rep.backend == "torch"
    assert rep.options == GradcheckOptions(fast_mode=fast, atol=1e-6).as_dict()
    (block,) = rep.blocks
    assert isinstance(block.numerical, np.ndarray) and isinstance(block.analytical, np.ndarray)
    assert block.numerical.shape == block.analytical.shape == (12, 12)
    expected = torch.diag(x.detach().cos().reshape(-1)).numpy()
    np.testing.assert_allclose(block.numerical, expected, atol=1e-8)
    np.testing.assert_allclose(block.analytical, 2 * expected, atol=1e-12)
    worst = int(np.argmax(np.abs(expected.diagonal())))
    assert block.max_abs_diff == pytest.approx(abs(expected[worst, worst]), rel=1e-6)
    assert block.max_abs_entry.input_index == tuple(np.unravel_index(worst, (3, 4)))
    assert block.max_abs_entry.output_index == block.max_abs_entry.input_index
    assert block.max_rel_diff == pytest.approx(1.0, rel=1e-6)
    assert block.mismatches == 12
    assert (block.fast, block.projection is not None) == (fast, fast)
    assert block.input_shape == (3, 4) and block.output_shape == (3, 4) and block.eps == 1e-6


#: a fixed 24 x 24 matrix: y = W @ x.flatten() for a 6 x 4 input
_W = torch.randn(24, 24, dtype=torch.float64, generator=torch.Generator().manual_seed(7))


class MatVecTransposed(torch.autograd.Function):
    """``W @ x`` on a 6 x 4 input whose backward uses ``W`` where ``W.T`` belongs."""

    @staticmethod
    def forward(ctx, x):
        return (_W @ x.reshape(-1)).reshape(6, 4)

    @staticmethod
    def backward(ctx, g):
        return (_W @ g.reshape(-1)).reshape(6, 4)


def test_message_reads_top_down():
    """torch's first line, agcheck's summary (what failed, where, the diagnosis, the worst
    entry) and the pointer to the report, then the rest of torch's text, whole: the 24 x 24
    Jacobians after the summary, not before it."""
    x = make(6, 4)
    err = raised(MatVecTransposed.apply, (x,))
    text, torch_text, rep = str(err), err.report.message, err.report
    with pytest.raises(RuntimeError) as theirs:
        torch.autograd.gradcheck(MatVecTransposed.apply, (x,))
    assert torch_text.rstrip("\n") == str(theirs.value).rstrip("\n")  # the report keeps torch's text as is
    lines = text.splitlines()
    assert lines[0] == "Jacobian mismatch for output 0 with respect to input 0,"
    assert lines[1] == "agcheck report: check 'jacobian' failed in MatVecTransposed.apply, backend torch"
    top = "\n".join(lines[:10])
    assert "[transposed]" in top and "max abs difference" in top
    # the summary, the pointer, a blank line, then torch's text after its first line
    first, rest = torch_text.rstrip("\n").split("\n", 1)
    assert text == f"{first}\n{rep.summary()}\n{REPORT_POINTER}\n\n{rest}"
    assert rest.startswith("numerical:tensor(") and text.count(REPORT_POINTER) == 1
    assert len(lines) > 150 and text.index("numerical:tensor(") > text.index(REPORT_POINTER)
    # torch's phrases stay matchable as pytest.raises(match=...) matches them (re.search)
    assert re.search("Jacobian mismatch for output 0 with respect to input 0", text)
    assert re.search(r"numerical:tensor\(\[\[", text) and re.search(r"\nanalytical:tensor\(", text)


def test_every_check_kind_keeps_torch_first_line_and_its_text():
    """The same layout for every check's message: torch's first line first, the summary
    next, then the rest of torch's text; a one-line message is followed by the summary; a
    first line that opens a printed tensor keeps the message whole before the summary."""
    summary = "agcheck report: check 'x' failed\ndiagnosis: ..."
    reentrant = not_reentrant_message(0.0, 3e-6)
    composed = message_with_summary(reentrant, summary)
    assert composed.splitlines()[0] == reentrant.splitlines()[0]
    assert composed.splitlines()[0].startswith("Backward is not reentrant")
    assert composed.splitlines()[1] == "agcheck report: check 'x' failed"
    assert composed.endswith(reentrant.split("\n", 1)[1].lstrip("\n"))
    batched = batched_mismatch_message(0, 1, "tensor([1.])", "tensor([2.])")
    composed = message_with_summary(batched, summary)
    assert composed.splitlines()[0] == ("For output 0 and input 1: the batched gradient differs from the "
                                        "gradients computed one at a time.")
    assert "gradcheck or gradgradcheck failed while testing batched gradient computation" in composed
    assert composed.index(REPORT_POINTER) < composed.index("Got:\ntensor([1.])")
    assert message_with_summary("backward not multiplied by grad_output", summary) == (
        f"backward not multiplied by grad_output\n{summary}\n{REPORT_POINTER}")
    tangent = "Mismatch in tangent values ... Got: tensor([[1., 2.],\n        [3., 4.]]) but expected: tensor(0.)"
    assert message_with_summary(tangent, summary) == f"{tangent}\n\n{summary}\n{REPORT_POINTER}"


def test_saved_reports_carry_no_python_hint(tmp_path):
    pytest.importorskip("matplotlib")
    err = raised(scaled(2.0), (make(3),))
    assert "details: error.report" in str(err)
    rep = err.report
    assert "error.report" not in rep.summary()
    assert "error.report" not in open(rep.save(tmp_path / "r.html"), encoding="utf-8").read()
    assert "error.report" not in open(rep.save(tmp_path / "r.json"), encoding="utf-8").read()


# -- reproducible reports: function, test, versions, seeds, inputs, code -------------------------

def test_context_names_function_test_versions_and_inputs():
    x, n = make(6, 4), torch.arange(3)
    err = raised(lambda a, b: MatVecTransposed.apply(a), (x, n))
    ctx = err.report.context
    assert isinstance(ctx, CheckContext) and ctx.call == "gradcheck"
    assert ctx.function == "test_context_names_function_test_versions_and_inputs.<locals>.<lambda>"
    assert ctx.module == __name__ and ctx.source.startswith("tests/test_report.py:")
    assert ctx.test == "tests/test_report.py::test_context_names_function_test_versions_and_inputs"
    assert ctx.versions["torch"] == torch.__version__ and ctx.versions["numpy"] == np.__version__
    assert set(ctx.versions) >= {"agcheck", "python"}
    assert ctx.inputs == [
        {"position": 0, "kind": "array", "shape": [6, 4], "dtype": "float64", "checked": True,
         "layout": "dense", "device": "cpu"},
        {"position": 1, "kind": "array", "shape": [3], "dtype": "int64", "checked": False,
         "layout": "dense", "device": "cpu"}]
    assert ctx.function_code == "fn"  # a lambda cannot be imported: the script says to define it
    assert "fn = ...  # test_context_names" in ctx.reproduce and "not importable" in ctx.reproduce
    summary = err.report.summary()
    assert "where: function test_context_names_function_test_versions_and_inputs.<locals>.<lambda>" in summary
    assert "test tests/test_report.py::test_context_names_function_test_versions_and_inputs" in summary
    assert f"torch {torch.__version__}" in summary
    assert "inputs: 0: float64 (6, 4) checked; 1: int64 (3,)" in summary
    data = err.report.to_dict()["context"]
    assert data["function"] == ctx.function and data["reproduce"] == ctx.reproduce
    assert data["inputs"][0]["shape"] == [6, 4]


def test_reproduce_runs_the_check_again():
    """The script of the report fails the same way when run (random inputs of the failing
    shapes and dtypes: the transposition does not depend on the values)."""
    err = raised(MatVecTransposed.apply, (make(6, 4),), atol=1e-6, check_undefined_grad=False)
    ctx = err.report.context
    assert ctx.function_code == "MatVecTransposed.apply"
    assert ctx.keywords_code == {"atol": "1e-06", "check_undefined_grad": "False"}
    assert ctx.reproduce == (
        "import torch\nimport agcheck\nfrom tests.test_report import MatVecTransposed\n"
        "# inputs of the failing shapes and dtypes; the failing values are not saved\n"
        "inputs = (torch.randn(6, 4, dtype=torch.float64, requires_grad=True),)\n"
        "agcheck.gradcheck(MatVecTransposed.apply, inputs, atol=1e-06, check_undefined_grad=False)\n")
    assert ("reproduce: agcheck.gradcheck(MatVecTransposed.apply, (torch.randn(6, 4, dtype=torch.float64, "
            "requires_grad=True),), atol=1e-06, check_undefined_grad=False)") in err.report.summary()
    with pytest.raises(GradcheckError) as again:
        exec(ctx.reproduce, {})
    assert [d.kind for d in again.value.report.diagnoses] == ["transposed"]


def test_functions_are_named_as_code_imports_them():
    x = make(3)
    assert agcheck.gradcheck(torch.sin, (x,))
    err = raised(functools.partial(lambda a, k: scaled(k)(a), k=2.0), (x,))
    ctx = err.report.context
    assert ctx.function.startswith("functools.partial(") and ctx.function_code == "fn"
    from agcheck.core.report_filling import check_context
    from agcheck.backends.registry import get_backend

    be = get_backend("torch")
    for fn, code, function in ((torch.sin, "torch.sin", "_VariableFunctionsClass.sin"),
                               (torch.nn.functional.relu, "torch.nn.functional.relu", "relu"),
                               (MatVecTransposed.apply, "MatVecTransposed.apply", "MatVecTransposed.apply"),
                               (torch.nn.Linear(2, 2), "fn", "Linear instance")):
        ctx = check_context(be, GradcheckOptions().as_dict(), fn, (x,))
        assert (ctx.function_code, ctx.function) == (code, function)


def test_seeds_are_stated():
    slow = raised(scaled(2.0), (make(3),)).report.context
    assert "none in slow mode" in slow.random and slow.seeds == {"fast_mode_vectors": PROBE_SEED}
    fast = raised(scaled(2.0), (make(3),), fast_mode=True).report
    assert f"seeded {PROBE_SEED} at each check" in fast.context.random
    assert f"random: fast mode's vectors u, v from a private generator seeded {PROBE_SEED}" in fast.summary()
    assert fast.context.keywords_code == {"fast_mode": "True"}


def test_entry_points_can_name_the_callers_function_and_keywords():
    """complete_report takes fn, inputs, the call and its other keywords from the entry
    point (gradgradcheck's are the caller's, not the VJP's the comparison saw; the options
    under gradgradcheck's names; a backend's function keywords by name)."""
    from agcheck.backends.registry import get_backend
    from agcheck.core.report_filling import complete_report

    be, x = get_backend("torch"), make(2, 3)
    err = GradcheckError(not_reentrant_message(0.0, 1e-6), check="reentrant")
    complete_report(err, be, GradcheckOptions(check_forward_ad=True), fn=MatVecTransposed.apply, inputs=(x,),
                    call="gradgradcheck", keywords={"grad_outputs": (make(6, 4),)})
    ctx = err.report.context
    assert ctx.call_code() == ("agcheck.gradgradcheck(MatVecTransposed.apply, (torch.randn(2, 3, "
                               "dtype=torch.float64, requires_grad=True),), check_fwd_over_rev=True, "
                               "grad_outputs=(torch.randn(6, 4, dtype=torch.float64),))")
    assert str(err).splitlines()[:2] == [
        not_reentrant_message(0.0).split("\n")[0],
        "agcheck report: check 'reentrant' failed in MatVecTransposed.apply, backend torch"]
    err = GradcheckError("backward not multiplied by grad_output", check="grad_output_scaling")
    complete_report(err, get_backend("numpy"), GradcheckOptions(), fn=np.sin, inputs=(np.ones(3),),
                    keywords={"vjp": MatVecTransposed.apply})
    assert err.report.context.call_code() == ("agcheck.gradcheck(numpy.sin, (rng.standard_normal((3,)),), "
                                              "vjp=MatVecTransposed.apply, backend='numpy')")
    assert err.report.context.setup[:3] == ["import numpy", "import numpy as np", "rng = np.random.default_rng(0)"]
    # the check's own gradgradcheck: the comparison sees a VJP agcheck built, which is not named
    err = GradcheckError("x", check="reentrant")
    complete_report(err, be, GradcheckOptions())
    assert err.report.context.function is None and "where: function not recorded" in err.report.summary()


def test_complex_split_is_recorded():
    w = torch.tensor([0.5 + 1.5j, -1.0 + 0.25j], dtype=torch.complex128)

    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, z):
            return z * w

        @staticmethod
        def backward(ctx, g):
            return g * w  # the conjugation is missing

    err = raised(F.apply, (make(2, dtype=torch.complex128),))
    assert str(err).startswith("While considering the imaginary part of complex outputs only")
    (block,) = err.report.blocks
    assert block.part == "imaginary" and np.iscomplexobj(block.numerical)


def test_forward_mode_report(monkeypatch):
    monkeypatch.setattr(SinWithJvp, "factor", 3.0)
    err = raised(SinWithJvp.apply, (make(4),), check_forward_ad=True, check_backward_ad=False)
    assert err.check == "jacobian_forward"
    assert err.report.blocks[0].mode == "forward"
    assert [d.kind for d in err.report.diagnoses] == ["factor"]


def test_reentrancy_report_has_the_size_next_to_nondet_tol():
    calls = [0]

    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x.sin()

        @staticmethod
        def backward(ctx, g):
            calls[0] += 1
            (x,) = ctx.saved_tensors
            return g * x.cos() + 1e-6 * calls[0]

    err = raised(F.apply, (make(3),), nondet_tol=1e-9)
    rep = err.report
    assert str(err).startswith("Backward is not reentrant")
    assert rep.check == "reentrant" and not rep.blocks
    assert rep.details["nondet_tol"] == 1e-9
    # 3 output elements: the second Jacobian's backward calls are 3 later than the first's
    assert rep.details["max_run_to_run_difference"] == pytest.approx(3e-6, rel=1e-3)
    summary = rep.summary()
    assert "nondet_tol=1e-09" in summary and "3.000e-06" in summary


def test_grad_output_scaling_report():
    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return (x * x).sum()

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return 2 * x

    x = make(3)
    err = raised(F.apply, (x,))
    assert str(err).startswith("backward not multiplied by grad_output")
    assert err.report.details["max_abs_gradient"] == pytest.approx(2 * float(x.detach().abs().max()))


def test_raise_exception_false_still_returns_false():
    assert agcheck.gradcheck(scaled(2.0), (make(3),), raise_exception=False) is False


def test_other_backends_give_numpy_blocks():
    def f(x):
        return np.sin(x)

    def vjp(inputs, cots):
        (x,), (g,) = inputs, cots
        return (3 * np.cos(x) * g,)

    x = np.linspace(0.1, 1.0, 4)
    err = raised(f, (x,), backend="numpy", vjp=vjp)
    (block,) = err.report.blocks
    assert err.report.backend == "numpy"
    assert isinstance(block.numerical, np.ndarray) and block.numerical.shape == (4, 4)
    assert [d.kind for d in err.report.diagnoses] == ["factor"]


# -- to_dict / JSON ---------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128])
def test_to_dict_json_round_trip(dtype):
    x = make(2, 3, dtype=dtype)
    if dtype.is_complex:
        err = raised(lambda z: z * z.detach().conj(), (x,))  # complex blocks, and a conjugation
    else:
        err = raised(scaled(2.0), (x,))
    rep = err.report
    data = rep.to_dict()
    text = json.dumps(data, allow_nan=False)
    back = FailureReport.from_dict(json.loads(text))
    assert back.to_dict() == data
    assert back.summary() == rep.summary()
    np.testing.assert_array_equal(back.blocks[0].numerical, rep.blocks[0].numerical)
    assert back.blocks[0].numerical.dtype == rep.blocks[0].numerical.dtype


def test_to_dict_handles_non_finite_and_every_check():
    n = np.array([[1.0, np.nan], [np.inf, 0.0]])
    block = JacobianBlock.from_arrays(n, n * 2, output=0, input=1, atol=1e-5, rtol=1e-3)
    rep = FailureReport(check="jacobian", message="Jacobian mismatch for output 0 with respect to input 1,",
                        details={"obj": object(), "arr": np.arange(3), "t": (1, 2)})
    rep.blocks = [block]
    from agcheck.diagnosis import diagnose

    rep.diagnoses = diagnose(rep)
    data = json.loads(json.dumps(rep.to_dict(), allow_nan=False))
    back = FailureReport.from_dict(data)
    assert np.isnan(back.blocks[0].numerical[0, 1]) and np.isinf(back.blocks[0].numerical[1, 0])
    assert [d.kind for d in back.diagnoses] == ["non_finite"]
    # crosscheck-style errors without blocks are serialisable too
    json.dumps(GradcheckError("x", check="crosscheck", details={"result": object()}).report.to_dict())


def _statistics_entry_by_entry(n, a, atol, rtol):
    """The block statistics, one entry at a time: mismatches (NaN counts), the largest
    absolute difference (NaN ranks first), the largest relative one (infinite where the
    numerical entry is 0 and the analytical is not, 0 where both are; NaN entries skipped)."""
    mismatches, best_abs, best_rel = 0, None, None
    for (r, c), nv in np.ndenumerate(n):
        d = abs(a[r, c] - nv)
        if not d <= atol + rtol * abs(nv):
            mismatches += 1
        rank = np.inf if np.isnan(d) else d
        if best_abs is None or rank > best_abs[0]:
            best_abs = (rank, (r, c))
        if np.isnan(d):
            continue
        with np.errstate(invalid="ignore"):
            rel = d / abs(nv) if abs(nv) > 0 else (np.inf if d > 0 else 0.0)
        if not np.isnan(rel) and (best_rel is None or rel > best_rel[0]):
            best_rel = (rel, (r, c))
    return mismatches, best_abs[1], None if best_rel is None else best_rel


@pytest.mark.parametrize("seed", range(12))
def test_block_statistics_agree_with_an_entry_by_entry_reading(seed):
    rng = np.random.default_rng(seed)
    n = rng.standard_normal((7, 5)) * 10.0 ** rng.integers(-6, 3, size=(7, 5))
    a = n * (1 + rng.choice([0.0, 1e-5, 1e-2], size=n.shape))
    specials = [0.0, -0.0, np.inf, -np.inf, np.nan]
    for _ in range(seed % 4 + 1):  # zeros, infinities, NaN on either side
        r, c = rng.integers(7), rng.integers(5)
        n[r, c] = specials[rng.integers(len(specials))]
        a[r, c] = specials[rng.integers(len(specials))] if rng.random() < 0.5 else a[r, c]
    block = JacobianBlock.from_arrays(n, a, output=0, input=0, atol=1e-5, rtol=1e-3)
    mismatches, worst_abs, best_rel = _statistics_entry_by_entry(n, a, 1e-5, 1e-3)
    assert block.mismatches == mismatches
    assert (block.max_abs_entry.row, block.max_abs_entry.col) == worst_abs
    if best_rel is None:
        assert block.max_rel_diff is None
    else:
        assert block.max_rel_diff == best_rel[0]
        assert (block.max_rel_entry.row, block.max_rel_entry.col) == best_rel[1]


def test_large_blocks_leave_arrays_out_of_the_dict_by_default():
    n = np.zeros((200, 200))
    block = JacobianBlock.from_arrays(n, n + 1, output=0, input=0)
    assert block.to_dict()["numerical"] is None
    assert block.to_dict(include_arrays=True)["numerical"]["shape"] == [200, 200]


# -- large Jacobians ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def big_failure():
    x = make(300, seed=3)
    with pytest.raises(GradcheckError) as info:
        agcheck.gradcheck(one_entry_off_matvec(300), (x,))
    return info.value


def test_summary_of_a_300x300_failure_is_short(big_failure):
    rep = big_failure.report
    assert rep.blocks[0].shape == (300, 300)
    summary = rep.summary()
    assert len(summary.splitlines()) < 60
    assert len(summary) < 6000
    (d,) = rep.diagnoses
    assert d.kind == "few_entries" and "input(7,) / output(11,)" in d.lines[0]
    assert rep.blocks[0].max_abs_entry.input_index == (7,)


def test_html_and_png_of_a_300x300_failure(big_failure, tmp_path):
    pytest.importorskip("matplotlib")
    rep = big_failure.report
    html_path = rep.save(tmp_path / "big.html")
    text = open(html_path, encoding="utf-8").read()
    assert text.count(IMG) == 1
    assert "max-abs pooled 2x2 tiles" not in text  # the pooling note is inside the image
    assert len(text) < 2_000_000  # never the whole Jacobian
    png = open(rep.save(tmp_path / "big.png"), "rb").read()
    assert png.startswith(PNG_SIGNATURE)


def test_pooling_keeps_a_single_outlier():
    from agcheck.report.render import pool_max_abs

    m = np.zeros((1000, 450))
    m[737, 21] = -5.0
    pooled, tiles = pool_max_abs(m)
    assert pooled.shape[0] <= 200 and pooled.shape[1] <= 200 and tiles == (5, 3)
    assert pooled.min() == -5.0 and np.count_nonzero(pooled) == 1
    assert pooled[737 // 5, 21 // 3] == -5.0


# -- rendering ----------------------------------------------------------------------------------

def test_save_html_png_json(tmp_path):
    pytest.importorskip("matplotlib")
    rep = raised(scaled(2.0), (make(3, 2),)).report
    html_text = open(rep.save(tmp_path / "r.html"), encoding="utf-8").read()
    assert html_text.startswith("<!doctype html>") and IMG in html_text
    assert "analytical = 2.00 x numerical" in html_text
    assert "<script src" not in html_text and "http" not in html_text  # self-contained
    assert open(rep.save(tmp_path / "r.png"), "rb").read().startswith(PNG_SIGNATURE)
    data = json.load(open(rep.save(tmp_path / "r.json")))
    assert data["check"] == "jacobian"
    with pytest.raises(ValueError, match="html, .png or .json"):
        rep.save(tmp_path / "r.txt")


def test_save_non_jacobian_report(tmp_path):
    pytest.importorskip("matplotlib")
    err = raised(lambda x: (x * 2).detach(), (make(3),))
    html_text = open(err.report.save(tmp_path / "r.html"), encoding="utf-8").read()
    assert "depends_on_input" in html_text and "max_abs_numerical" in html_text
    assert open(err.report.save(tmp_path / "r.png"), "rb").read().startswith(PNG_SIGNATURE)


def test_missing_matplotlib_names_the_install_command(monkeypatch, tmp_path):
    rep = raised(scaled(2.0), (make(3),)).report
    for name in ("matplotlib", "matplotlib.figure", "matplotlib.backends.backend_agg"):
        monkeypatch.setitem(sys.modules, name, None)
    for ext in ("html", "png"):
        with pytest.raises(ImportError, match="pip install matplotlib"):
            rep.save(tmp_path / f"r.{ext}")
    rep.save(tmp_path / "r.json")  # no plotting needed


def test_heatmap_axes_use_the_tables_multi_indices():
    """Tick labels name elements as the tables do: ``(1, 1)`` in a 6 x 4 array, ``5`` in a
    vector, nothing between elements or outside the block."""
    pytest.importorskip("matplotlib")
    from agcheck.report import render

    label = render._index_formatter((6, 4), 24)
    assert [label(v, None) for v in (0, 5, 23, 24, 2.5, -1)] == ["(0, 0)", "(1, 1)", "(5, 3)", "", "", ""]
    assert render._index_formatter((24,), 24)(5, None) == "5"
    rep = raised(MatVecTransposed.apply, (make(6, 4),)).report
    fig = render._figure(rep, rep.blocks, header=False)
    fig.canvas.draw()
    ax = fig.subfigs[0].axes[0]
    for ticks in (ax.get_xticklabels(), ax.get_yticklabels()):
        shown = [t.get_text() for t in ticks if t.get_text()]
        assert shown and "(0, 0)" in shown and all(re.fullmatch(r"\(\d, \d\)", t) for t in shown)
    worst = rep.blocks[0].worst[0]
    assert re.fullmatch(r"\(\d, \d\)", render.index_text(worst.input_index))  # the tables' notation


def test_html_is_escaped_and_the_report_body_embeds_in_other_pages():
    pytest.importorskip("matplotlib")
    pytest.importorskip("jinja2")
    from agcheck.report.render import render_html, report_fragment, stylesheet

    rep = raised(lambda a: scaled(2.0)(a), (make(3),)).report  # its name holds <locals> and <lambda>
    page = render_html(rep)
    head, script = page.split('<script type="application/json" id="agcheck-report">')
    assert "&lt;locals&gt;.&lt;lambda&gt;" in head and "<lambda>" not in head
    data = script.split("</script>")[0]
    assert "<" not in data and json.loads(data)["context"]["function"] == rep.context.function
    assert stylesheet() in page and page.count("<style>") == 1
    assert "<h2>Reproduce</h2>" in head and "agcheck.gradcheck(fn, inputs)" in head
    assert f"torch {torch.__version__}" in head
    fragment = report_fragment(rep, level=3, ident="agcheck-report-7")
    assert fragment.lstrip().startswith("<h3>agcheck failure report</h3>") and "<h4>Diagnosis</h4>" in fragment
    assert "<body" not in fragment and "<style" not in fragment and 'id="agcheck-report-7"' in fragment


def test_missing_jinja2_names_the_install_command(monkeypatch, tmp_path):
    pytest.importorskip("matplotlib")
    from agcheck.report import render

    rep = raised(scaled(2.0), (make(3),)).report
    render._environment.cache_clear()
    monkeypatch.setitem(sys.modules, "jinja2", None)
    try:
        with pytest.raises(ImportError, match="pip install jinja2"):
            rep.save(tmp_path / "r.html")
        rep.save(tmp_path / "r.png")  # no templates needed
    finally:
        render._environment.cache_clear()


def test_core_imports_no_plotting_or_framework():
    code = ("import sys, agcheck, agcheck.report, agcheck.diagnosis, agcheck.report.render, "
            "agcheck.core.report_filling; "
            "bad = [m for m in ('matplotlib', 'torch', 'jax') if m in sys.modules]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_error_constructed_anywhere_has_a_report():
    err = GradcheckError("Backward is not reentrant", check="reentrant",
                         details={"max_run_to_run_difference": 1e-3, "nondet_tol": 0.0})
    assert err.report.check == "reentrant" and err.report.details is err.details
    assert "reentrant" in err.report.summary()


def test_scaled_sin_helper_reports_factor():
    ScaledSin.factor = 3.0
    try:
        rep = raised(ScaledSin.apply, (make(2, 2),)).report
    finally:
        ScaledSin.factor = 1.0
    assert "analytical = 3.00 x numerical" in rep.diagnoses[0].message


# -- several failing blocks ------------------------------------------------------------------

def _two_by_two(grad_x_scale=1.0, grad_y_sign=1.0):
    """(x * y, x + y) with a backward whose d(x*y)/dx is scaled and d(x+y)/dy sign-flipped."""

    class TwoByTwo(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, y):
            ctx.save_for_backward(x, y)
            ctx.save_for_forward(x, y)
            return x * y, x + y

        @staticmethod
        def backward(ctx, g1, g2):
            x, y = ctx.saved_tensors
            return grad_x_scale * g1 * y + g2, g1 * x + grad_y_sign * g2

        @staticmethod
        def jvp(ctx, tx, ty):
            x, y = ctx.saved_tensors
            return grad_x_scale * tx * y + x * ty, tx + grad_y_sign * ty

    return TwoByTwo.apply


def _xy():
    g = torch.Generator().manual_seed(5)
    return tuple(torch.randn(4, dtype=torch.float64, generator=g).requires_grad_() for _ in range(2))


@pytest.mark.parametrize("forward", [False, True])
def test_every_failing_block_is_reported_with_its_own_diagnosis(forward):
    fn = _two_by_two(grad_x_scale=2.0, grad_y_sign=-1.0)
    kw = dict(check_forward_ad=True, check_backward_ad=False) if forward else {}
    with pytest.raises(GradcheckError) as info:
        agcheck.gradcheck(fn, _xy(), **kw)
    with pytest.raises(RuntimeError) as torch_info:
        torch.autograd.gradcheck(fn, _xy(), **kw)
    rep = info.value.report
    assert [(b.output, b.input) for b in rep.blocks] == [(0, 0), (1, 1)]
    assert [(d.kind, d.block) for d in rep.diagnoses] == [("factor", 0), ("sign", 1)]
    # the message is the first block's, as torch's is
    phrase = "mismatch for output 0 with respect to input 0"
    assert phrase in str(info.value) and phrase in str(torch_info.value)
    assert ("forward mode" in str(info.value)) == ("forward mode" in str(torch_info.value)) == forward
    summary = rep.summary()
    assert "output 0 / input 0: [factor]" in summary and "output 1 / input 1: [sign]" in summary
    again = FailureReport.from_dict(json.loads(rep.to_json()))
    assert [(b.output, b.input) for b in again.blocks] == [(0, 0), (1, 1)]


def test_one_wrong_block_gives_one_block():
    with pytest.raises(GradcheckError) as info:
        agcheck.gradcheck(_two_by_two(grad_y_sign=-1.0), _xy())
    rep = info.value.report
    assert [(b.output, b.input) for b in rep.blocks] == [(1, 1)]
    assert "output 1 / input 1:" not in rep.summary()  # one block: no need to say which
    assert agcheck.gradcheck(_two_by_two(), _xy())


def test_several_blocks_render_to_html_and_png(tmp_path):
    pytest.importorskip("matplotlib")
    with pytest.raises(GradcheckError) as info:
        agcheck.gradcheck(_two_by_two(grad_x_scale=2.0, grad_y_sign=-1.0), _xy())
    rep = info.value.report
    html = open(rep.save(tmp_path / "r.html"), encoding="utf-8").read()
    assert html.count("<h2>output ") == 2 and "output 1 / input 1: <b>[sign]</b>" in html
    png = open(rep.save(tmp_path / "r.png"), "rb").read()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"


def test_an_error_while_comparing_other_blocks_becomes_a_note():
    class Flaky(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * 2, x * 3

        @staticmethod
        def backward(ctx, g1, g2):
            if g2.abs().sum() > 0:  # output 1's VJPs: computed only for the report
                raise ValueError("boom")
            return 4 * g1 + 3 * g2  # output 0's derivative is wrong (4 instead of 2)

    x = torch.randn(4, dtype=torch.float64).requires_grad_()
    with pytest.raises(GradcheckError) as info:
        agcheck.gradcheck(Flaky.apply, (x,), engine="reference", check_undefined_grad=False)
    rep = info.value.report
    assert [(b.output, b.input) for b in rep.blocks] == [(0, 0)]
    assert any("other blocks not compared: ValueError: boom" in n for n in rep.notes)


def test_abs_difference_holds_one_temporary_and_leaves_its_arguments():
    """|a - b| for the report's statistics and diagnoses: the values np.abs(a - b) gives,
    with one array of their size allocated (the difference, made absolute in place), where
    np.abs(a - b) holds two at its peak."""
    import tracemalloc

    from agcheck.report.values import abs_difference

    rng = np.random.default_rng(0)
    a, b = rng.standard_normal(100_000), rng.standard_normal(100_000)
    a0, b0 = a.copy(), b.copy()

    def peak(f):
        tracemalloc.start()
        try:
            f()
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    assert np.array_equal(abs_difference(a, b), np.abs(a - b))
    assert np.array_equal(a, a0) and np.array_equal(b, b0)
    assert peak(lambda: abs_difference(a, b)) < 1.2 * a.nbytes < 1.8 * a.nbytes < peak(lambda: np.abs(a - b))
    z, w = a + 1j * b, b - 2j * a
    assert np.array_equal(abs_difference(z, w), np.abs(z - w)) and abs_difference(z, w).dtype == np.float64


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.complex128])
@pytest.mark.parametrize("shapes", [((6,), (2, 3)), ((3, 2), (6,)), ((1, 2, 3), (3, 1, 2)), (None, None)])
def test_entries_read_their_element_and_its_multi_index(dtype, shapes):
    """Each entry the statistics gather (worst, max abs, max rel) is the element it names:
    its values read one by one, its multi-indices those of np.unravel_index."""
    rng = np.random.default_rng(1)
    n = rng.standard_normal((6, 6)).astype(dtype)
    a = (n * (1 + rng.standard_normal((6, 6)) * 1e-2)).astype(dtype)
    n[2, 3] = 0
    input_shape, output_shape = shapes
    block = JacobianBlock.from_arrays(n, a, output=0, input=0, atol=1e-5, rtol=1e-3,
                                      input_shape=input_shape, output_shape=output_shape)
    entries = block.worst + [block.max_abs_entry, block.max_rel_entry]
    assert len(block.worst) == 20
    assert block.max_rel_entry.row == 2 and block.max_rel_entry.col == 3 and block.max_rel_diff == np.inf
    for e in entries:
        assert e.numerical == n[e.row, e.col].item() and type(e.numerical) is type(n[e.row, e.col].item())
        assert e.analytical == a[e.row, e.col].item()
        assert e.abs_diff == float(abs(a[e.row, e.col] - n[e.row, e.col]))
        for flat, shape, index in ((e.row, input_shape, e.input_index), (e.col, output_shape, e.output_index)):
            assert index == (tuple(int(i) for i in np.unravel_index(flat, shape)) if shape else (flat,))


def test_unravel_all_is_unravel_of_each():
    from agcheck.report.values import unravel, unravel_all

    for shape in [None, (), (5,), (2, 3), (3, 1, 4), (2, 0, 3)]:
        size = int(np.prod(shape)) if shape else 3
        for flat in (list(range(size)), list(range(-2, size + 3)), []):
            assert unravel_all(flat, shape) == [unravel(f, shape) for f in flat]
        for f in range(size):
            if shape:
                assert unravel(f, shape) == tuple(int(i) for i in np.unravel_index(f, shape))
    assert unravel(7, (2, 3)) == (7,) and unravel(-1, (2, 3)) == (-1,) and unravel(4, ()) == ()


@pytest.mark.parametrize("width", [20, 60, 110])
def test_diagnosis_lines_are_wrapped_as_textwrap_wraps_them(width):
    """The report wraps its one-paragraph diagnosis messages itself (textwrap costs 60 µs
    a message): the lines of ``textwrap.wrap`` breaking only between words (a long word
    kept on a line of its own, no break after a hyphen), whitespace runs as one space."""
    import textwrap

    from agcheck.report.values import wrap_words
    messages = [d.message for d in raised(scaled(2.0), (make(6),)).report.diagnoses]
    messages += [d.message for d in raised(torch.relu, (torch.zeros(3, dtype=torch.float64, requires_grad=True),))
                 .report.diagnoses]
    assert len(messages) >= 2
    for m in messages:
        assert wrap_words(f"- [x] {m}", width, "  ") == textwrap.wrap(
            f"- [x] {m}", width, subsequent_indent="  ", break_long_words=False, break_on_hyphens=False)
    assert wrap_words("a " + "b" * 30 + "  c\nd", 10, "  ") == ["a", "  " + "b" * 30, "  c d"]
    assert wrap_words("", 10) == []
