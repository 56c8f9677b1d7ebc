"""agcheck's verdict against torch.autograd.gradcheck's on PyTorch's OpInfo database.

The harness is ``tests/opinfo_sweep.py`` (see its docstring for how each sample becomes a
gradcheck call and what "agreement" means). Two tiers:

- ``test_ci_slice``: a fixed, representative slice of op_db -- elementwise, reductions,
  linalg, complex-specific ops, multiple outputs, integer outputs (max / sort / topk ...),
  ops with a ``gradcheck_nondet_tol``, tensor-list inputs, a random op, a masked op, and
  ops on which torch itself fails a check -- a few chosen samples each, slow and fast mode,
  float64 and complex128 where the op supports them. Runs by default.
- ``test_opinfo_sweep``: every autograd op of op_db, every sample, marked ``opinfo``
  (deselected by default): ``pytest -m opinfo -n 2``. Environment knobs:
  ``AGCHECK_OPINFO_FAST`` (both | on | off | op | all; default both),
  ``AGCHECK_OPINFO_DTYPES`` (default ``float64,complex128``),
  ``AGCHECK_OPINFO_LIMIT`` (samples per op and dtype; default all),
  ``AGCHECK_OPINFO_TIMEOUT`` (seconds per gradcheck call; a timeout fails the test),
  ``AGCHECK_OPINFO_JSONL`` (a directory: one JSON line per sample, a file per worker).

Every test asserts that every compared sample agrees and that something was compared.
"""
from __future__ import annotations

import json
import os

import pytest
import torch

try:
    import opinfo_sweep as sweep
except ImportError:  # run from the repository root without tests/ on sys.path
    from tests import opinfo_sweep as sweep


# --------------------------------------------------------------------------------------
# the CI slice: (op full name, sample indices, what it covers)
# --------------------------------------------------------------------------------------

CI_SLICE: list[tuple[str, tuple[int, ...], str]] = [
    # elementwise, unary and binary
    ("exp", (0, 1), "unary elementwise"),
    ("sigmoid", (0, 1), "unary elementwise"),
    ("nn.functional.relu", (0, 1), "kink at zero, float only"),
    ("mul", (0, 1, 2), "binary, broadcasting"),
    ("div.no_rounding_mode", (0, 1), "binary"),
    ("pow", (0, 1), "binary, two differentiable inputs"),
    ("atan2", (0, 1), "binary, float only"),
    ("where", (0, 2), "bool condition input"),
    ("clamp", (0, 2), "kinks (min/max)"),
    # complex-specific
    ("abs", (1,), "C->R"),
    ("angle", (1,), "C->R, non-holomorphic"),
    ("sgn", (1,), "complex sign"),
    ("conj_physical", (1,), "conjugation"),
    ("real", (0, 1), "C->R view"),
    ("imag", (0, 1), "C->R view, complex only"),
    ("view_as_real", (0, 1), "complex -> real view, complex only"),
    ("view_as_complex", (0,), "real -> complex view, float only"),
    ("polar", (0, 1), "R->C, two inputs"),
    # reductions and scans
    ("sum", (0, 1, 2), "reduction"),
    ("prod", (0,), "reduction, nondet_tol 1e-12, op fast mode"),
    ("mean", (0, 1), "reduction"),
    ("std", (0, 3), "reduction with correction"),
    ("logsumexp", (0, 1), "reduction, the op turns fast mode off"),
    ("norm.inf", (0,), "kinks, the op turns fast mode off"),
    ("linalg.vector_norm", (0, 1), "norm"),
    ("cumsum", (2,), "scan"),
    ("cumprod", (0,), "scan, the op turns fast mode off"),
    # linalg
    ("mm", (3,), "matmul"),
    ("trace", (0,), "matrix -> scalar"),
    ("linalg.det", (0, 1), "linalg"),
    ("linalg.inv", (1, 2), "linalg"),
    ("linalg.solve", (0,), "linalg, two inputs"),
    ("linalg.slogdet", (0, 1), "two outputs (sign, logabsdet)"),
    ("linalg.eigh", (0, 1), "hermitian wrapper, two outputs"),
    ("linalg.svd", (0, 1), "three outputs, output_process_fn_grad"),
    ("linalg.qr", (2,), "two outputs"),
    ("cholesky", (1,), "hermitian wrapper"),
    ("linalg.eig", (0, 1), "complex outputs from a real input"),
    ("linalg.pinv.hermitian", (0, 1), "hermitian wrapper"),
    ("linalg.lstsq", (0, 16), "several outputs, some not differentiable; #16: torch's checker crashes (explained)"),
    ("linalg.multi_dot", (0, 1), "tensor-list input, nondet_tol"),
    # multiple outputs, integer outputs
    ("max.reduction_with_dim", (1,), "values + int64 indices"),
    ("sort", (1, 2), "values + int64 indices"),
    ("topk", (1, 2), "values + int64 indices"),
    ("kthvalue", (0, 1), "values + int64 indices"),
    ("aminmax", (0,), "two outputs"),
    ("cummax", (0, 1), "int64 indices, nondet_tol"),
    ("unbind", (0,), "tuple of views"),
    ("split", (3,), "tuple of views"),
    # indexing, nondet_tol
    ("gather", (0, 1), "int64 index input, nondet_tol"),
    ("index_add", (0, 1), "nondet_tol, two differentiable inputs"),
    ("take_along_dim", (0, 1), "nondet_tol"),
    ("addr", (1,), "nondet_tol"),
    ("nn.functional.embedding", (0, 1), "integer input first"),
    # tensor lists, views, nn, random, masked, sparse
    ("cat", (0, 1), "tensor-list input"),
    ("stack", (0, 1), "tensor-list input"),
    ("expand", (0, 1), "broadcasting view"),
    ("nn.functional.linear", (0, 1), "nn, nondet_tol"),
    ("nn.functional.avg_pool1d", (0, 2), "nn, nondet_tol"),
    ("nn.functional.layer_norm", (0,), "nn, several inputs"),
    ("nn.functional.cross_entropy", (0, 1), "nn, int64 target"),
    ("nn.functional.binary_cross_entropy", (0, 1), "the op turns fast mode off"),
    ("nn.functional.dropout", (0, 1), "random op under wrapper_set_seed"),
    ("softmax", (1,), "softmax"),
    ("masked.sum", (0, 1), "masked gradcheck wrapper"),
    ("masked.normalize", (0,), "masked wrapper, op fast mode"),
    ("to_sparse", (0,), "sparse output"),
    ("addmm", (4, 5), "leaf input with the conj bit set, transposed (conj view of a plain tensor)"),
    ("float", (2,), "output of another dtype than the input (float64 -> float32)"),
    # torch itself fails a check on these
    ("cov", (0, 2), "torch: batched-grad failure, and a RuntimeError in fast mode (#2)"),
    ("as_strided_scatter", (0,), "torch: Jacobian mismatch (xfail in PyTorch)"),
    ("bernoulli", (0,), "torch: batched gradients of a random op"),
    ("logcumsumexp", (0,), "torch: forward-AD mismatch for complex (xfail in PyTorch)"),
    ("native_batch_norm", (5,), "torch: IndexError while reporting a fast-mode forward-AD failure"),
]

CI_MODES = ("slow", "fast")
CI_DTYPES = ("float64", "complex128")


# --------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------


@pytest.fixture(scope="module", autouse=True)
def _one_thread_per_worker():
    """Under pytest-xdist, one intra-op thread per worker (the workers are the parallelism)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        old = torch.get_num_threads()
        torch.set_num_threads(1)
        yield
        torch.set_num_threads(old)
    else:
        yield


def _assert_all_agree(summary: sweep.Summary) -> None:
    assert summary.results, "no sample was compared:\n" + summary.format()
    bad = summary.disagreements + summary.undecided
    assert not bad, "agcheck and torch disagree:\n" + summary.format()


def _jsonl_sink():
    out_dir = os.environ.get("AGCHECK_OPINFO_JSONL")
    if not out_dir:
        return None
    os.makedirs(out_dir, exist_ok=True)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    path = os.path.join(out_dir, f"opinfo_{worker}.jsonl")

    def write(record: dict) -> None:
        with open(path, "a") as f:
            f.write(json.dumps(record) + "\n")

    return write


# --------------------------------------------------------------------------------------
# the harness itself (cheap; no agcheck needed)
# --------------------------------------------------------------------------------------


def _outcome(kind, exc=None):
    o = sweep.Outcome(kind)
    if exc is not None:
        o.exc, o.exc_type = exc, type(exc).__name__
    return o


def test_verdict_rules():
    from torch.autograd.gradcheck import GradcheckError as TorchGCE

    agree = sweep.verdicts_agree
    assert agree(_outcome("pass"), _outcome("pass"))
    assert not agree(_outcome("pass"), _outcome("gradcheck_error", RuntimeError("x")))
    assert agree(_outcome("gradcheck_error", TorchGCE("a")), _outcome("gradcheck_error", RuntimeError("b")))
    assert not agree(_outcome("gradcheck_error", TorchGCE("a")), _outcome("pass"))
    # torch's non-GradcheckError: the same type (or a subclass) on the other side
    assert agree(_outcome("exception", NotImplementedError("a")), _outcome("exception", NotImplementedError("b")))
    assert not agree(_outcome("exception", NotImplementedError("a")), _outcome("exception", ValueError("b")))
    assert not agree(_outcome("exception", RuntimeError("a")), _outcome("gradcheck_error", TorchGCE("b")))
    assert agree(_outcome("exception", AttributeError("a")), _outcome("exception", type("Sub", (AttributeError,), {})("b")))
    # a timeout on either side is undecided
    assert agree(_outcome("timeout"), _outcome("pass")) is None


def test_explained_crash_rules():
    crashed = _outcome("exception", RuntimeError("expanded size"))
    crashed.in_torch_gradcheck = True
    calls = []

    def rerun(kind):
        def run():
            calls.append(kind)
            return _outcome(kind)
        return run

    assert sweep.explain_crash(crashed, _outcome("pass"), rerun("pass"))
    # torch fails on the differentiable outputs too: agcheck's pass stays a disagreement
    assert sweep.explain_crash(crashed, _outcome("pass"), rerun("gradcheck_error")) == ""
    assert calls == ["pass", "gradcheck_error"]
    # only a crash inside torch's checker, beside agcheck's pass, is looked at
    in_op = _outcome("exception", RuntimeError("in the op"))
    assert sweep.explain_crash(in_op, _outcome("pass"), rerun("pass")) == ""
    assert sweep.explain_crash(crashed, _outcome("gradcheck_error", RuntimeError("x")), rerun("pass")) == ""
    assert calls == ["pass", "gradcheck_error"]


def test_explained_crash_of_lstsq_and_a_broken_lstsq():
    """linalg.lstsq: torch's checker crashes on its integer output, agcheck passes, and
    the harness confirms agcheck with torch on the floating outputs alone; a broken
    backward for the solution fails on both sides."""
    op = sweep.find_op("linalg.lstsq")
    s = sweep.run_op(op, dtypes=("float64",), modes=("slow",), samples=(16,))
    [r] = s.results
    assert r.ref.kind == "exception" and r.cand.kind == "pass"
    assert r.agree is True and "differentiable outputs alone" in r.explanation
    assert "agreements by explanation" in s.format()

    import agcheck

    class ScaledGrad(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, g):
            return 1.5 * g

    fn, inputs = sweep.build_check(op, sweep.generate_samples(op, "float64", 17)[16])

    def broken(*args):
        out = fn(*args)
        return (ScaledGrad.apply(out[0]),) + tuple(out[1:])

    assert not agcheck.gradcheck(broken, inputs, raise_exception=False)
    assert not torch.autograd.gradcheck(sweep.differentiable_outputs_only(broken), inputs, raise_exception=False)


def test_is_gradcheck_error_knows_both_classes():
    from torch.autograd.gradcheck import GradcheckError as TorchGCE

    import agcheck

    assert sweep.is_gradcheck_error(TorchGCE("x"))
    assert sweep.is_gradcheck_error(agcheck.GradcheckError("x"))
    assert not sweep.is_gradcheck_error(RuntimeError("x"))


def test_harness_torch_against_itself():
    """The harness is deterministic: torch agrees with torch, also on a random op and on
    an op where torch's verdict is a failure."""
    s = sweep.Summary(against="torch")
    for name in ("exp", "nn.functional.dropout", "cov"):
        s.extend(sweep.run_op(sweep.find_op(name), samples=(0, 2), against="torch"))
    _assert_all_agree(s)
    assert any(r.ref.kind != "pass" for r in s.results), "cov's forward AD failure should be among the samples"


def test_harness_reports_a_disagreement():
    """A candidate that gets the verdict wrong is reported, not agreed with."""

    def always_fails(fn, inputs, **kw):
        raise sweep.TorchGradcheckError("always fails")

    s = sweep.run_op(sweep.find_op("exp"), samples=(0,), dtypes=("float64",), against=always_fails)
    assert s.results and len(s.disagreements) == len(s.results)
    text = s.format()
    assert "disagreements:" in text and "--sample 0" in text


def _pinned_torch() -> str | None:
    """The torch release constraints.txt pins (the slice was chosen from its op_db)."""
    try:
        with open(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "constraints.txt")) as f:
            pins = [line.split("==")[1].strip() for line in f if line.strip().startswith("torch==")]
    except OSError:
        return None
    return pins[0] if pins else None


def _skip_where_this_torch_lacks(names) -> None:
    """Skip, naming them, where ops of the slice are not in the installed torch's op_db and
    that torch is not the pinned one (torch 2.14 dropped ``cholesky``, say); under the
    pinned torch every op must be there."""
    missing = sorted(set(names).difference(ALL_OPS))
    pinned = _pinned_torch() if missing else None
    if missing and torch.__version__.split("+")[0] != pinned:
        pytest.skip(f"not in torch {torch.__version__}'s op_db (the slice is of torch {pinned}'s): "
                    + ", ".join(missing))
    assert not missing, missing


def test_ci_slice_is_well_formed():
    names = [n for n, _, _ in CI_SLICE]
    assert len(names) == len(set(names))
    _skip_where_this_torch_lacks(names)


# --------------------------------------------------------------------------------------
# CI slice
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", CI_MODES)
@pytest.mark.parametrize("name,samples,covers", CI_SLICE, ids=[n for n, _, _ in CI_SLICE])
def test_ci_slice(name, samples, covers, mode):
    _skip_where_this_torch_lacks([name])
    op = sweep.find_op(name)
    s = sweep.run_op(op, dtypes=CI_DTYPES, modes=(mode,), samples=samples, against="agcheck")
    _assert_all_agree(s)


# --------------------------------------------------------------------------------------
# the whole sweep (pytest -m opinfo -n 2)
# --------------------------------------------------------------------------------------


def _env_modes() -> tuple[str, ...]:
    return sweep._parse_modes(os.environ.get("AGCHECK_OPINFO_FAST", "both"))


def _env_dtypes() -> tuple[str, ...]:
    return sweep._parse_dtypes(os.environ.get("AGCHECK_OPINFO_DTYPES", "float64,complex128"))


def _env_number(name, kind):
    v = os.environ.get(name)
    return kind(v) if v else None


ALL_OPS = [op.full_name for op in sweep.autograd_ops()]


@pytest.mark.opinfo
@pytest.mark.parametrize("name", ALL_OPS)
def test_opinfo_sweep(name):
    op = sweep.find_op(name)
    dtypes = _env_dtypes()
    write = _jsonl_sink()
    s = sweep.run_op(
        op,
        dtypes=dtypes,
        modes=_env_modes(),
        limit_samples=_env_number("AGCHECK_OPINFO_LIMIT", int),
        timeout=_env_number("AGCHECK_OPINFO_TIMEOUT", float),
        against="agcheck",
        on_result=(lambda r: write(r.to_json())) if write else None,
    )
    if write:
        for sk in s.skips:
            write({"skip": sk.to_json()})
    if not s.results:
        # nothing comparable: say why (e.g. no float64/complex128 backward support)
        reasons = sorted({sk.reason for sk in s.skips})
        pytest.skip(f"{name}: no sample to compare ({'; '.join(reasons) or 'no samples'})")
    _assert_all_agree(s)
