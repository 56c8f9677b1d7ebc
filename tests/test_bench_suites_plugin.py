"""bench/suites_plugin.py's untimed warm-up of a checked function (real_suites.py --warm-fn)."""
import importlib.util
import random
from pathlib import Path

import numpy as np
import pytest
import torch

BENCH = Path(__file__).resolve().parent.parent / "bench"


def _load(name):
    """bench/``name``.py as a module of its own (bench/ is not a package)."""
    spec = importlib.util.spec_from_file_location(f"_{name}_under_test", BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def plugin():
    return _load("suites_plugin")


@pytest.fixture(scope="module")
def real_suites():
    return _load("real_suites")


def _states():
    return random.getstate(), np.random.get_state()[1].copy(), torch.get_rng_state().clone()


def _same(a, b):
    return a[0] == b[0] and np.array_equal(a[1], b[1]) and torch.equal(a[2], b[2])


def test_the_warm_up_runs_forward_and_backward_and_leaves_no_trace(plugin):
    calls = {"forward": 0, "backward": 0}

    class Square(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            calls["forward"] += 1
            ctx.save_for_backward(x)
            return x * x

        @staticmethod
        def backward(ctx, g):
            calls["backward"] += 1
            (x,) = ctx.saved_tensors
            return 2 * x * g

    def fn(x, scale):
        # draws from every global RNG, as a random augmentation would
        random.random(), np.random.rand(), torch.rand(1)
        return Square.apply(x) * scale, (x.sum(),)

    x = torch.randn(3, dtype=torch.float64, requires_grad=True)
    before, x_before = _states(), x.detach().clone()
    assert plugin._warm_function(fn, (x, 2.0)) is True
    assert calls == {"forward": 1, "backward": 1}
    assert _same(before, _states())
    assert x.grad is None and torch.equal(x.detach(), x_before)


def test_a_function_that_fails_is_reported_not_raised(plugin):
    def fn(x):
        torch.rand(2)
        raise ValueError("the checker reports this, not the warm-up")

    before = _states()
    assert plugin._warm_function(fn, (torch.ones(2, requires_grad=True),)) is False
    assert _same(before, _states())


def test_a_skip_raised_in_the_warm_up_is_left_to_the_checkers(plugin):
    def fn(x):
        pytest.skip("the checker's own call meets this again")

    try:
        warmed = plugin._warm_function(fn, (torch.ones(2, requires_grad=True),))
    except BaseException as e:  # noqa: BLE001 - a skip escaping would skip this test instead of failing it
        raise AssertionError(f"the warm-up let {type(e).__name__} escape") from None
    assert warmed is False


def test_real_suites_warms_by_default_and_can_be_told_not_to(monkeypatch, real_suites):
    module = real_suites
    seen = []

    def fake_run_suite(*args, warm_fn=False, **kwargs):
        seen.append(warm_fn)
        raise SystemExit(0)

    monkeypatch.setattr(module, "run_suite", fake_run_suite)
    for argv, expected in ((["--suite", "roma"], True), (["--suite", "roma", "--no-warm-fn"], False)):
        with pytest.raises(SystemExit):
            module.main(argv)
        assert seen[-1] is expected


def test_a_timed_run_counts_the_full_collections_inside_it(plugin):
    import gc

    _, _, quiet = plugin._timed(lambda: 1, (), {})
    _, _, collecting = plugin._timed(lambda: gc.collect(), (), {})
    assert quiet["full_gc"] == 0
    assert collecting["full_gc"] == 1


def _call(nodeid, fw_cpu, ag_cpu, full_gc=0):
    runs = [{"wall": t, "cpu": t, "verdict": "pass", "full_gc": full_gc} for t in ag_cpu]
    runs_fw = [{"wall": t, "cpu": t, "verdict": "pass", "full_gc": 0} for t in fw_cpu]
    return {"type": "call", "nodeid": nodeid, "index": 0, "kind": "gradcheck", "checker": "agcheck-dropin",
            "mode": "fast", "mode_run": "fast", "fn": "f", "inputs": [], "digest": "d", "verdict": "pass",
            "runs": runs, "runs_fw": runs_fw}


def test_the_report_gives_the_median_of_the_repeats_and_the_calls_below_0_8(real_suites):
    """The per-call statistics of an interleaved run: best, median and position-balanced
    ratios, and how many calls fall below 0.8x."""
    module = real_suites
    # a: one lucky agcheck run (best 2x, median 0.5x); b: one unlucky run (median 1.25x)
    records = [_call("a", [1.0, 1.0, 1.0], [0.5, 2.0, 2.0], full_gc=1), _call("b", [1.0, 1.0, 1.0], [0.8, 0.8, 3.0])]
    data = {"framework": "torch", "repeat": 3, "runs": {"agcheck": {"records": records}}}
    inter = module.analyse(data)["interleaved_ratios"]
    assert inter["fast/cpu/best"]["min"] == pytest.approx(1.25)
    assert inter["fast/cpu/best"]["below_0_8"] == 0
    assert inter["fast/cpu/median"]["min"] == pytest.approx(0.5)
    assert inter["fast/cpu/median"]["below_0_8"] == 1
    # repeats 1 and 2 summed: a 2 / 4, b 2 / 3.8
    assert inter["fast/cpu/balanced"]["min"] == pytest.approx(0.5)
    assert inter["fast/cpu/balanced"]["max"] == pytest.approx(2 / 3.8)
    full_gc = module.analyse(data)["full_gc"]
    assert full_gc["agcheck"] == {"runs": 6, "with_full_gc": 3}
    assert full_gc["torch, interleaved"] == {"runs": 6, "with_full_gc": 0}


def test_selection_reads_the_test_a_parameterizing_wrapper_stands_for(plugin):
    # parameterized.expand's wrapper keeps the test in ``place_as`` (no ``__wrapped__``):
    # the wrapper's own source names no checker, the test's does
    def test_body():
        return torch.autograd.gradcheck

    def wrapper(*a):
        return test_body(*a)

    def unrelated(*a):
        return a

    wrapper.place_as = test_body
    unrelated.place_as = unrelated
    assert plugin._mentions_checker(wrapper)
    assert not plugin._mentions_checker(unrelated)
