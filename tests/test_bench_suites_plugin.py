"""bench/suites_plugin.py and bench/real_suites.py: the recorder's warm-up, timing, counting and selection, and the report's statistics."""
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


def _busy(seconds):
    import time

    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def test_counting_tallies_the_checked_functions_calls_and_the_time_inside_them(plugin, monkeypatch):
    """With --suite-count-fn each timed run records how often the checker called fn and
    the CPU time inside fn; a call fn makes of itself is counted, not timed twice."""
    def fn(x, inner=None):
        _busy(0.01)
        return inner(x) if inner is not None else x

    def checker(f, inputs, **kwargs):
        for _ in range(3):
            f(*inputs, inner=f)  # a call of fn made inside another
        _busy(0.02)  # the checker's own work
        return True

    monkeypatch.setitem(plugin._STATE, "count_fn", True)
    result, error, run = plugin._timed(checker, (fn, (1.0,)), {})
    assert result is True and error is None
    assert run["fn_calls"] == 6
    # six 10 ms bodies inside fn, the checker's 20 ms outside it
    assert 0.055 <= run["fn_cpu"] <= run["cpu"] - 0.018
    _, _, by_keyword = plugin._timed(lambda func, inputs: func(*inputs), (), {"func": fn, "inputs": (1.0,)})
    assert by_keyword["fn_calls"] == 1
    monkeypatch.setitem(plugin._STATE, "count_fn", False)
    _, _, uncounted = plugin._timed(checker, (fn, (1.0,)), {})
    assert "fn_calls" not in uncounted


class _SlowBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        _busy(0.01)
        return g * 2


def test_counting_tallies_backward_passes_apart_and_bills_each_second_once(plugin, monkeypatch):
    """torch's backward passes (torch.autograd.grad, and agcheck's direct engine calls) are
    tallied beside fn; a backward inside fn is fn's time, and the engine is put back."""
    import agcheck.backends.torch_engine as direct

    engines = (torch.autograd.Variable._execution_engine, direct._ENGINE)

    def fn(x, inner_backward=False):
        y = _SlowBackward.apply(x)
        if inner_backward:
            torch.autograd.grad(y.sum(), x, create_graph=True)
        return y

    def checker(f, inputs, **kwargs):
        x = inputs[0]
        torch.autograd.grad(f(x).sum(), x)  # through torch.autograd.grad
        direct.vjp((f(x),), (x,), (torch.ones(3),))  # through agcheck's direct call
        f(x, inner_backward=True)
        return True

    monkeypatch.setitem(plugin._STATE, "count_fn", True)
    _, error, run = plugin._timed(checker, (fn, (torch.ones(3, requires_grad=True),)), {})
    assert error is None
    assert (run["fn_calls"], run["backward_calls"]) == (3, 3)
    # two 10 ms backward passes outside fn; the third ran inside fn and is fn's time
    assert 0.019 <= run["backward_cpu"] <= 0.03
    assert run["fn_cpu"] >= 0.0095
    assert run["fn_cpu"] + run["backward_cpu"] <= run["cpu"]
    assert (torch.autograd.Variable._execution_engine, direct._ENGINE) == engines


def test_agchecks_direct_engine_is_bound_to_torchs_before_a_counted_run(plugin, monkeypatch):
    """agcheck loaded, its direct-engine module not yet (it is imported on a first check):
    counting imports it first, so that it binds torch's engine and not the stand-in of the
    run being counted, for good."""
    import importlib
    import sys

    engine = torch.autograd.Variable._execution_engine
    monkeypatch.delitem(sys.modules, "agcheck.backends.torch_engine", raising=False)

    def checker(f, inputs, **kwargs):
        importlib.import_module("agcheck.backends.torch_engine")  # as a first check does
        return f(*inputs)

    monkeypatch.setitem(plugin._STATE, "count_fn", True)
    _, error, _ = plugin._timed(checker, (lambda x: x, (1.0,)), {})
    assert error is None
    assert sys.modules["agcheck.backends.torch_engine"]._ENGINE is engine
    assert torch.autograd.Variable._execution_engine is engine


def test_the_report_splits_each_checkers_time_between_fn_backward_and_its_own_work(real_suites):
    module = real_suites
    records = [_call("a", [1.0, 1.0, 1.0], [0.5, 0.5, 0.5]), _call("b", [2.0, 2.0, 2.0], [2.0, 2.0, 2.0])]
    figures = ((0.4, 0.3, 10, 8, 0.5, 0.1, 4, 2), (1.0, 1.0, 20, 20, 0.5, 0.5, 5, 5))
    for rec, (fw_fn, ag_fn, fw_calls, ag_calls, fw_bw, ag_bw, fw_passes, ag_passes) in zip(records, figures):
        for r in rec["runs_fw"]:
            r.update(fn_cpu=fw_fn, fn_calls=fw_calls, backward_cpu=fw_bw, backward_calls=fw_passes)
        for r in rec["runs"]:
            r.update(fn_cpu=ag_fn, fn_calls=ag_calls, backward_cpu=ag_bw, backward_calls=ag_passes)
    data = {"framework": "torch", "repeat": 3, "runs": {"agcheck": {"records": records}}}
    share = module.analyse(data)["evaluations"]["fast, interleaved"]
    assert share["calls"] == 2
    assert (share["fw_cpu"], share["fw_fn_cpu"], share["fw_fn_calls"]) == (3.0, 1.4, 30)
    assert (share["ag_cpu"], share["ag_fn_cpu"], share["ag_fn_calls"]) == (2.5, 1.3, 28)
    assert (share["fw_backward_cpu"], share["fw_backward_calls"]) == (1.0, 9)
    assert (share["ag_backward_cpu"], share["ag_backward_calls"]) == (0.6, 7)
    assert share["fw_rest"] == pytest.approx(0.6) and share["ag_rest"] == pytest.approx(0.6)
    assert (share["ag_more_fn_calls"], share["ag_fewer_fn_calls"]) == (0, 1)
    assert share["ceiling"] == pytest.approx(3.0 / 1.9)
    # runs recorded without counting give no such figures
    plain = {"framework": "torch", "repeat": 3, "runs": {"agcheck": {"records": [_call("c", [1.0], [1.0])]}}}
    assert module.analyse(plain)["evaluations"] == {}


def test_with_the_control_each_checker_goes_first_once_in_three_repeats(plugin):
    assert plugin._order(0, False, False) == ("inner",)
    assert [plugin._order(r, True, False) for r in range(2)] == [("inner", "fw"), ("fw", "inner")]
    turns = [plugin._order(r, True, True) for r in range(3)]
    assert sorted(t[0] for t in turns) == ["control", "fw", "inner"]
    assert all(sorted(t) == ["control", "fw", "inner"] for t in turns)


def test_the_control_gives_the_framework_checkers_ratio_to_itself(real_suites):
    module = real_suites
    records = [_call("a", [1.0, 1.0, 1.0], [0.5, 0.5, 0.5]), _call("b", [1.0, 1.0, 1.0], [1.0, 1.0, 1.0])]
    records[0]["runs_control"] = [{"wall": t, "cpu": t, "verdict": "pass", "full_gc": 0} for t in (1.0, 1.0, 1.0)]
    records[1]["runs_control"] = [{"wall": t, "cpu": t, "verdict": "pass", "full_gc": 0} for t in (1.3, 1.4, 1.3)]
    control = module.analyse({"framework": "torch", "repeat": 3, "runs": {"agcheck": {"records": records}}})[
        "control_ratios"]["fast/cpu/median"]
    assert control["calls"] == 2
    assert control["min"] == pytest.approx(1 / 1.3)
    assert control["below_0_8"] == 1
    with pytest.raises(SystemExit):
        module.main(["--suite", "roma", "--control"])  # needs --interleave


@pytest.mark.parametrize("control", [False, True])
def test_an_interleaved_call_times_each_checker_once_per_repeat(plugin, monkeypatch, tmp_path, control):
    import json

    order = []

    def agcheck_like(fn, inputs, **kwargs):
        order.append("inner")
        return True

    def framework(fn, inputs, **kwargs):
        order.append("framework")
        return True

    out = tmp_path / "records.jsonl"
    for key, value in {"out": str(out), "interleave": True, "control": control, "repeat": 3, "warm_fn": False,
                       "force_slow": False, "nodeid": "t", "counters": {}}.items():
        monkeypatch.setitem(plugin._STATE, key, value)
    wrapper = plugin._make_wrapper("gradcheck", agcheck_like, "agcheck-dropin", framework)
    assert wrapper(lambda x: x, (torch.ones(2, requires_grad=True),)) is True
    (record,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(record["runs"]) == len(record["runs_fw"]) == 3
    if control:
        assert len(record["runs_control"]) == 3
        assert order == ["inner", "framework", "framework", "framework", "framework", "inner",
                         "framework", "inner", "framework"]
    else:
        assert "runs_control" not in record
        assert order == ["inner", "framework", "framework", "inner", "inner", "framework"]


def test_every_repeat_runs_on_the_inputs_as_the_test_passed_them(plugin, monkeypatch, tmp_path):
    """torch's checker leaves an input moved when fn raises inside its finite differences;
    the recorder puts it back before the next run, so that every repeat checks the same
    values (and counts how often it had to)."""
    import json

    seen = []

    def leaves_it_moved(fn, inputs, **kwargs):
        seen.append(inputs[0].detach().clone())
        with torch.no_grad():
            inputs[0][0] += 1e-6
        raise RuntimeError("raised at a step")

    out = tmp_path / "records.jsonl"
    for key, value in {"out": str(out), "interleave": False, "control": False, "repeat": 3, "warm_fn": False,
                       "force_slow": False, "nodeid": "t", "counters": {}}.items():
        monkeypatch.setitem(plugin._STATE, key, value)
    x = torch.arange(3.0, dtype=torch.float64).requires_grad_()
    wrapper = plugin._make_wrapper("gradcheck", leaves_it_moved, "torch", None)
    with pytest.raises(RuntimeError, match="raised at a step"):
        wrapper(lambda t: t, (x,))
    assert len(seen) == 3 and all(torch.equal(v, torch.arange(3.0, dtype=torch.float64)) for v in seen)
    (record,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert record["inputs_put_back"] == 2


def test_an_input_holding_nan_is_not_taken_for_a_moved_one(plugin):
    x = torch.tensor([1.0, float("nan")], dtype=torch.float64)
    snapshot = plugin._snapshot((x, torch.tensor([1, 2]), {"flag": torch.tensor([True])}))
    assert not plugin._put_back(snapshot)
    x[0] = 2.0
    assert plugin._put_back(snapshot)
    assert x[0] == 1.0 and torch.isnan(x[1])


def test_the_benchmarks_byte_compile_the_agcheck_their_workers_import(tmp_path):
    """bench/precompile.py compiles the agcheck a worker imports (not this checkout's, when
    PYTHONPATH names another), so no timed process compiles agcheck's source."""
    import importlib.util
    import os
    import shutil

    import agcheck
    import agcheck.backends

    precompile = _load("precompile")
    copy = tmp_path / "agcheck"
    shutil.copytree(Path(agcheck.__file__).parent, copy, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(Path(agcheck.backends.__path__[0]), copy / "backends",  # where a wheel puts them
                    ignore=shutil.ignore_patterns("__pycache__"))
    module = copy / "backends" / "torch_backend.py"
    compiled = Path(importlib.util.cache_from_source(str(module)))
    assert not compiled.exists()
    env = dict(os.environ, PYTHONPATH=str(tmp_path), PYTHONDONTWRITEBYTECODE="1")
    line = precompile.compile_agcheck(env=env)
    assert line == f"agcheck at {copy} byte-compiled, as an installed package is"
    assert compiled.exists()


def test_the_suites_are_timed_with_pytests_rewritten_agcheck_modules_written(tmp_path):
    """agcheck's distribution is a pytest plugin, so pytest compiles its modules through
    the assertion rewriter; bench/precompile.py writes pytest's files for them (as a first
    pytest run does), so that a suite's first check is not billed for it."""
    import os
    import shutil

    import agcheck
    import agcheck.backends

    precompile = _load("precompile")
    copy = tmp_path / "agcheck"
    # the backends of other frameworks are left out: importing them is slow, not the point
    shutil.copytree(Path(agcheck.__file__).parent, copy, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(Path(agcheck.backends.__path__[0]), copy / "backends",  # where a wheel puts them
                    ignore=shutil.ignore_patterns("__pycache__", "jax*", "tensorflow*", "mlx*"))
    cache = copy / "backends" / "__pycache__"
    assert not cache.exists()
    env = dict(os.environ, PYTHONPATH=str(tmp_path), PYTHONDONTWRITEBYTECODE="1")
    line = precompile.prime_pytest_rewrites(env=env)
    assert line == "pytest's rewritten agcheck modules written, as after a first pytest run"
    assert any(f.name.startswith("torch_backend.") and "-pytest-" in f.name for f in cache.iterdir())


def test_busy_loops_spin_for_the_block_and_stop_after_it():
    import os
    import time

    busy = _load("busy")
    with busy.busy_loops(1) as procs:
        (proc,) = procs
        time.sleep(0.3)
        assert proc.poll() is None  # spinning
        with open(f"/proc/{proc.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        assert int(fields[16]) == min(19, os.nice(0) + 10)  # the bench's niceness
        assert int(fields[11]) + int(fields[12]) > 0  # it used CPU time (ticks)
    assert proc.poll() is not None
    with busy.busy_loops(0) as none:
        assert none == []


def test_the_broken_jax_plugin_breaks_the_named_derivatives_for_both_checkers(monkeypatch):
    jax = pytest.importorskip("jax")
    import agcheck
    from jax._src import public_test_util
    from jax._src.interpreters import ad

    jax_check = getattr(public_test_util.check_grads, "agcheck_original", public_test_util.check_grads)
    broken = _load("suites_broken_jax")
    x = np.array([0.3, 1.2], dtype=np.float32)
    for check in (jax_check, agcheck.check_grads):  # the correct derivatives pass
        check(jax.lax.sin, (x,), 1)
        check(jax.lax.exp, (x,), 1)
    saved = dict(ad.primitive_jvps)
    monkeypatch.setenv("SUITES_BROKEN_JAX", "sin:1.1")
    try:
        broken.pytest_configure(None)
        _, tangent = jax.jvp(jax.lax.sin, (x,), (np.ones_like(x),))
        np.testing.assert_allclose(np.asarray(tangent), 1.1 * np.cos(x), rtol=1e-6)
        for check in (jax_check, agcheck.check_grads):
            with pytest.raises(AssertionError):
                check(jax.lax.sin, (x,), 1)
            check(jax.lax.exp, (x,), 1)  # a primitive not named stays as it was
    finally:
        ad.primitive_jvps.clear()
        ad.primitive_jvps.update(saved)
    jax_check(jax.lax.sin, (x,), 1)


def test_interleaved_verdicts_count_a_subclass_of_the_frameworks_exception_as_the_same(real_suites):
    """In one process as across two: agcheck raising a subclass of the framework's exception
    is what an ``except`` sees alike; a pass against a raise is a difference."""
    jax_error = ["builtins.AssertionError", "builtins.Exception", "builtins.BaseException", "builtins.object"]
    ours = ["agcheck.backends.jax_dropin.CheckGradsError"] + jax_error

    def failing(nodeid, agcheck_verdict, agcheck_types):
        record = _call(nodeid, [1.0], [1.0])
        record["mode"] = record["mode_run"] = "-"
        record["runs_fw"][0].update(verdict="raise AssertionError: Not equal", types=jax_error)
        record["runs"][0].update(verdict=agcheck_verdict, types=agcheck_types)
        return record

    records = [failing("same", "raise CheckGradsError: Not equal", ours), failing("differs", "pass", None)]
    data = {"framework": "jax", "repeat": 1, "runs": {"agcheck": {"records": records}}}
    diffs = real_suites.analyse(data)["interleaved_verdict_differences"]
    assert [d["call"] for d in diffs] == ["differs #0"]
