"""agcheck.gradgradcheck's verdict against torch.autograd.gradgradcheck's on OpInfo ops.

The harness is ``tests/gradgrad_sweep.py`` (how a sample becomes a gradgradcheck call, the
op's settings, what "agreement" means). Two tiers:

- ``test_gradgrad_ci_slice``: ten ops (elementwise, binary, complex, reduction, scan,
  matmul with a conjugated sample, linalg, nn), one or two samples each, slow and fast
  mode (fast only for the unary ops, whose samples are 20 x 20), float64 and complex128,
  reverse-over-reverse and forward-over-reverse;
- ``test_gradgrad_opinfo_sweep``: every op of op_db with ``supports_gradgrad``, marked
  ``opinfo`` (deselected by default): ``pytest -m opinfo -n 2 tests/test_gradgrad_opinfo.py``.
  Environment knobs: ``AGCHECK_GRADGRAD_MODES`` (comma list of slow, fast, op; default
  ``slow,fast``), ``AGCHECK_GRADGRAD_LIMIT`` (samples per op and dtype; default all),
  ``AGCHECK_GRADGRAD_TIMEOUT`` (seconds per call), ``AGCHECK_GRADGRAD_MAX_SLOW_ENTRIES``
  (slow-mode samples whose Jacobians have more entries are skipped; default 2e7, a few
  hundred MB per Jacobian), ``AGCHECK_OPINFO_DTYPES``,
  ``AGCHECK_GRADGRAD_JSONL`` (a directory: one JSON line per call, a file per worker).
"""
from __future__ import annotations

import json
import os

import pytest
import torch

try:
    from . import gradgrad_sweep as gg
except ImportError:  # run from inside tests/
    import gradgrad_sweep as gg

# (op full name, sample indices, modes, what it covers). The unary ops' samples are 20 x 20:
# slow-mode second derivatives of those take seconds each, so they run in fast mode only.
BOTH = ("slow", "fast")
CI_SLICE: list[tuple[str, tuple[int, ...], tuple[str, ...], str]] = [
    ("sin", (0,), ("fast",), "unary elementwise"),
    ("sgn", (1,), ("fast",), "complex sign"),
    ("abs", (1,), ("fast",), "C->R, kink"),
    ("mul", (0, 1), BOTH, "binary, two differentiable inputs"),
    ("div.no_rounding_mode", (0,), BOTH, "binary, second derivative in both inputs"),
    ("sum", (0, 1), BOTH, "reduction (zero second derivative)"),
    ("cumsum", (2,), BOTH, "scan"),
    ("mm", (1,), BOTH, "matmul; a conjugated input (complex), an empty one (float)"),
    ("linalg.det", (0,), BOTH, "linalg"),
    ("nn.functional.softplus", (0,), BOTH, "nn, float only"),
]
CI_DTYPES = ("float64", "complex128")


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


def _find(name):
    for op in gg.gradgrad_ops():
        if op.full_name == name:
            return op
    raise KeyError(name)


def _assert_all_agree(summary: gg.GGSummary) -> None:
    assert summary.results, "no call was compared:\n" + summary.format()
    bad = summary.disagreements + summary.undecided
    assert not bad, "agcheck and torch disagree:\n" + summary.format()


def test_ci_slice_is_well_formed():
    names = [n for n, _, _, _ in CI_SLICE]
    assert len(names) == len(set(names))
    known = {op.full_name for op in gg.gradgrad_ops()}
    assert set(names) <= known, set(names) - known


def test_kwargs_are_pytorchs():
    op = _find("sin")
    kw = gg.gradgrad_kwargs(op, "fast", "bwgrad_bwgrad")
    assert kw["fast_mode"] is True and kw["check_grad_dtypes"] is True
    assert kw["check_batched_grad"] == bool(op.check_batched_gradgrad)
    fw = gg.gradgrad_kwargs(op, "slow", "fwgrad_bwgrad", non_contig=True)
    assert fw["check_fwd_over_rev"] and not fw["check_rev_over_rev"] and not fw["check_undefined_grad"]
    assert fw["gen_non_contig_grad_outputs"] is True and fw["fast_mode"] is False


def test_harness_reports_a_disagreement():
    def always_fails(fn, inputs, **kw):
        raise gg.sweep.TorchGradcheckError("always fails")

    s = gg.run_op(_find("sin"), samples=(0,), dtypes=("float64",), modes=("fast",),
                  variants=("bwgrad_bwgrad",), candidate=always_fails)
    assert s.results and len(s.disagreements) == len(s.results)
    assert "disagreements:" in s.format()


def test_random_grad_outputs_match_the_outputs():
    x = torch.randn(3, 2, dtype=torch.complex128, requires_grad=True)

    def fn(t):
        return t.abs(), t * 2, t.abs().argmax()

    a = gg.random_grad_outputs(fn, (x,), seed=1)
    b = gg.random_grad_outputs(fn, (x,), seed=1, noncontiguous=True)
    assert [(g.shape, g.dtype) for g in a] == [((3, 2), torch.float64), ((3, 2), torch.complex128)]
    assert all(g.requires_grad for g in a) and not b[1].is_contiguous()
    assert all(torch.equal(g, h) for g, h in zip(a, b))
    z = a[1]
    assert (z.real.abs() <= 1).all() and (z.imag.abs() <= 1).all() and (z.imag < 0).any()


def _outcome(kind):
    return gg.sweep.Outcome(kind)


def test_shared_draw_explanation_rules():
    seeds = []

    def rerun(pattern):
        def run(seed):
            seeds.append(seed)
            return pattern[len(seeds) - 1]
        return run

    fail, ok = _outcome("gradcheck_error"), _outcome("pass")
    both_agree = [(fail, fail), (ok, ok), (fail, fail)]
    text = gg.explain_by_shared_draws(fail, ok, rerun(both_agree))
    assert "3 draws" in text and "GradcheckError, pass, GradcheckError" in text
    seeds.clear()
    # one shared draw on which they still disagree: no explanation, and no further draws
    assert gg.explain_by_shared_draws(fail, ok, rerun([(ok, ok), (fail, ok), (ok, ok)])) == ""
    assert len(seeds) == 2
    seeds.clear()
    # agreements and timeouts are not explained
    assert gg.explain_by_shared_draws(ok, ok, rerun(both_agree)) == "" and not seeds
    assert gg.explain_by_shared_draws(_outcome("timeout"), ok, rerun(both_agree)) == "" and not seeds


def test_draw_dependent_verdict_of_cholesky_inverse_is_explained_and_a_wrong_checker_is_not():
    """cholesky_inverse's forward-over-reverse check fails for some grad_outputs and passes
    for others (on both checkers, given the same ones): sample 6 disagrees under the
    checkers' own draws and is explained by the shared draws. A candidate that passes
    everything is not explained away."""
    op = _find("cholesky_inverse")
    kw = dict(dtypes=("float64",), modes=("slow",), variants=("fwgrad_bwgrad",), samples=(6,))
    s = gg.run_op(op, **kw)
    [r] = s.results
    assert r.ref.kind == "gradcheck_error" and r.cand.kind == "pass"
    assert r.agree is True and "the verdict depends on the random draw" in r.explanation
    assert "agreements by explanation" in s.format()

    def always_passes(fn, inputs, **kw):
        return True

    s = gg.run_op(op, candidate=always_passes, **kw)
    [r] = s.results
    assert r.agree is False and r.explanation == ""


@pytest.mark.parametrize("name,samples,modes,covers", CI_SLICE, ids=[n for n, _, _, _ in CI_SLICE])
def test_gradgrad_ci_slice(name, samples, modes, covers):
    s = gg.run_op(_find(name), dtypes=CI_DTYPES, modes=modes, samples=samples)
    _assert_all_agree(s)


# --------------------------------------------------------------------------------------
# the whole sweep (pytest -m opinfo -n 2 tests/test_gradgrad_opinfo.py)
# --------------------------------------------------------------------------------------


def _env(name, kind, default=None):
    v = os.environ.get(name)
    return kind(v) if v else default


GRADGRAD_OPS = [op.full_name for op in gg.gradgrad_ops()]


@pytest.mark.opinfo
@pytest.mark.parametrize("name", GRADGRAD_OPS)
def test_gradgrad_opinfo_sweep(name):
    modes = tuple(_env("AGCHECK_GRADGRAD_MODES", str, "slow,fast").split(","))
    dtypes = tuple(_env("AGCHECK_OPINFO_DTYPES", str, "float64,complex128").split(","))
    out_dir = _env("AGCHECK_GRADGRAD_JSONL", str)
    sink = None
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
        sink = open(os.path.join(out_dir, f"gradgrad_{os.environ.get('PYTEST_XDIST_WORKER', 'main')}.jsonl"), "a")
    try:
        s = gg.run_op(_find(name), dtypes=dtypes, modes=modes,
                      limit_samples=_env("AGCHECK_GRADGRAD_LIMIT", int),
                      timeout=_env("AGCHECK_GRADGRAD_TIMEOUT", float),
                      max_slow_entries=int(_env("AGCHECK_GRADGRAD_MAX_SLOW_ENTRIES", float, 2e7)),
                      on_result=(lambda r: sink.write(json.dumps(r.to_json()) + "\n")) if sink else None)
    finally:
        if sink is not None:
            sink.close()
    if not s.results:
        reasons = sorted({sk.reason for sk in s.skips})
        pytest.skip(f"{name}: nothing to compare ({'; '.join(reasons) or 'no samples'})")
    _assert_all_agree(s)
