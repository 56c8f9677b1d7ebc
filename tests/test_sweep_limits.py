"""The OpInfo sweeps' memory guards (issue #7): samples too large for a slow-mode check are
skipped and reported as skips, never compared and never counted as agreements; a failed
checker's frames (which hold its Jacobians) are released before the other checker runs.

The checkers here are stand-ins that never compute a Jacobian: if a guard failed, the
huge sample would reach a stand-in (and fail the test), not torch.
"""
from __future__ import annotations

import weakref

import pytest
import torch

from tests import gradgrad_sweep as gg
from tests import opinfo_sweep as sweep


def must_not_run(fn, inputs, **kw):
    raise AssertionError("a checker ran on a sample the guard should have skipped")


def passes(fn, inputs, **kw):
    return True


# slice's complex128 sample 1: T(20, 30, 40) sliced to T(20, 27, 40), a 24,000 x 21,600
# Jacobian (5.2e8 entries): the sample behind the sweep's out-of-memory kill
SLICE_BIG = dict(dtypes=("complex128",), samples=(1,))


def test_oversized_slow_sample_is_a_skip_not_an_agreement():
    s = sweep.run_op(sweep.find_op("slice"), modes=("slow",), reference=must_not_run, against=must_not_run,
                     **SLICE_BIG)
    assert s.results == []
    (skip,) = s.skips
    assert (skip.op, skip.dtype, skip.index) == ("slice", "complex128", 1)
    assert "--max-slow-entries" in skip.reason and skip.detail.startswith(f"{24_000 * 21_600} entries")
    assert "skipped samples: 1" in s.format()


def test_fast_mode_and_no_limit_compare_the_sample():
    s = sweep.run_op(sweep.find_op("slice"), modes=("fast",), reference=passes, against=passes, **SLICE_BIG)
    assert [r.agree for r in s.results] == [True] and s.skips == []
    s = sweep.run_op(sweep.find_op("slice"), modes=("slow",), reference=passes, against=passes,
                     max_slow_entries=0, **SLICE_BIG)
    assert [r.agree for r in s.results] == [True]


def test_small_samples_are_compared_under_the_default_limit():
    s = sweep.run_op(sweep.find_op("slice"), modes=("slow",), dtypes=("complex128",), samples=(0,),
                     reference=passes, against=passes)
    assert len(s.results) == 1 and s.skips == []


def test_gradgrad_sweep_skips_oversized_slow_samples():
    s = gg.run_op(sweep.find_op("sin"), dtypes=("float64",), modes=("slow", "fast"), variants=("bwgrad_bwgrad",),
                  samples=(0,), max_slow_entries=1, reference=must_not_run, candidate=passes)
    # slow: skipped; fast: compared (the stand-in reference raises, so they disagree)
    assert [r.mode for r in s.results] == ["fast"]
    assert [sk.index for sk in s.skips] == [0] and "--max-slow-entries" in s.skips[0].reason


def test_failed_checker_releases_its_frames():
    held = {}

    def crashing(fn, inputs, **kw):
        jacobian = torch.empty(1000)  # stands for the gigabytes a slow check holds
        held["ref"] = weakref.ref(jacobian)
        raise RuntimeError("boom")

    out = sweep.run_checker(crashing, None, (), {}, 0, None)
    assert out.kind == "exception" and out.exc_type == "RuntimeError"
    assert out.exc.__traceback__ is None and held["ref"]() is None
    assert not out.in_torch_gradcheck


def test_crash_inside_torch_gradcheck_is_still_recognised():
    # torch's own gradcheck raises from its module (here: fn returns a non-tensor), and the
    # verdict rules need to know that after the traceback was dropped
    x = torch.ones(2, dtype=torch.float64, requires_grad=True)
    out = sweep.run_checker(sweep.torch_gradcheck, lambda t: [t.sum().item()], (x,), {}, 0, None)
    assert out.exc_type == "AttributeError" and out.exc.__traceback__ is None
    assert out.in_torch_gradcheck and sweep.torch_checker_crashed(out)


def test_start_at_resumes_the_op_list(capsys):
    assert sweep.main(["--ops", "sin,cos,tan", "--start-at", "cos", "--list-ops"]) == 0
    listed = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
    assert listed == ["cos", "tan"]
    with pytest.raises(SystemExit):
        sweep.main(["--ops", "sin", "--start-at", "cos", "--list-ops"])


def test_the_sweep_forces_the_engine_and_counts_its_fallbacks(capsys):
    # bernoulli draws random numbers, which vmap refuses: with the engine forced on the
    # check, it falls back on that error of torch's, and the count says where; the forcing
    # and the logger are undone after the sweep
    import logging

    from agcheck.engine import cost

    before = cost.ENGINE_FROM_CALLS, cost.BATCHED_VJPS_FROM_CALLS, logging.getLogger("agcheck.engine").level
    assert sweep.main(["--ops", "bernoulli", "--dtypes", "float64", "--fast", "slow", "--limit-samples", "1",
                       "--force-engine", "--engine-fallbacks"]) == 0
    out = capsys.readouterr().out
    assert "engine fallbacks on exceptions: 1" in out
    assert "RuntimeError: vmap: We do not yet support calling random operations inside of vmap" in out
    after = cost.ENGINE_FROM_CALLS, cost.BATCHED_VJPS_FROM_CALLS, logging.getLogger("agcheck.engine").level
    assert after == before and not logging.getLogger("agcheck.engine").handlers


def test_the_gradgrad_sweep_forces_the_engine_and_undoes_it(monkeypatch, capsys):
    from agcheck.engine import cost

    before = cost.ENGINE_FROM_CALLS, cost.BATCHED_VJPS_FROM_CALLS
    seen, real_run_op = [], gg.run_op

    def run_op(op, **kw):
        seen.append((cost.ENGINE_FROM_CALLS, cost.BATCHED_VJPS_FROM_CALLS))
        return real_run_op(op, **kw)

    monkeypatch.setattr(gg, "run_op", run_op)
    import logging

    argv = ["--ops", "sin", "--dtypes", "float64", "--modes", "slow", "--variants", "bwgrad_bwgrad", "--limit", "1"]
    level = logging.getLogger("agcheck.engine").level
    assert gg.main(argv + ["--force-engine", "--engine-fallbacks"]) == 0
    assert seen == [(0.0, 0.0)] and (cost.ENGINE_FROM_CALLS, cost.BATCHED_VJPS_FROM_CALLS) == before
    out = capsys.readouterr().out
    assert "agreements: 1 " in out and "engine fallbacks on exceptions: 0" in out
    assert logging.getLogger("agcheck.engine").level == level and not logging.getLogger("agcheck.engine").handlers
    assert gg.main(argv) == 0 and seen[-1] == before
