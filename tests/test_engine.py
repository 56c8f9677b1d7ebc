"""The batched engine: same verdicts as the reference engine, on the paths it claims."""
import time

import pytest
import torch

import agcheck
from agcheck.engine import cost, forward_jacobian
from agcheck.core.outcome import EngineEvent

from .helpers import OneEntryOff, ScaledSin, SinWithJvp, busy, first_paragraph, make, reference_takes, run_check as run, \
    torch_message, torch_text


@pytest.fixture(autouse=True)
def _engine_always_runs(monkeypatch):
    """These tests are about the engine's paths: it runs however little the loop would
    cost (the plan that sends such checks to the reference engine is tested on its own)."""

    monkeypatch.setattr(cost, "ENGINE_FROM_CALLS", 0)


def paths(r):
    """How the inputs were moved (the numerical side's events of the engine log)."""
    return {(e.decision, e.detail) if e.detail else e.decision for e in r.engine_log if e.path == "numerical"}


def test_vmappable_inputs_are_batched_and_pass():
    r = run(lambda a, b: torch.tanh(a @ b), (make(24, 24), make(24, 24, seed=1)))
    assert r.verdict and "batched" in paths(r) and not r.engine_fallbacks
    # a's rows are independent samples of tanh(a @ b)
    assert paths(r) <= {"batched", "by samples"}


def test_tiny_inputs_use_the_loop():
    r = run(lambda a: a.exp(), (make(3),), engine="batched")
    assert r.verdict and paths(r) == {"looped"}
    assert [o.reason for o in r.engine_fallbacks] == ["no input can be moved in batches"]


@pytest.mark.parametrize("vjps_may_batch", [True, False])
@pytest.mark.parametrize("moved_raises", [True, False])
def test_an_input_is_probed_only_when_its_rows_are_reached(moved_raises, vjps_may_batch, monkeypatch):
    # torch's checker meets an error of fn at the first input's rows; agcheck's probes of
    # the later inputs (a vmapped backward each, for gradgradcheck's cotangents) are not
    # paid before them: on the engine's numerical-first path (VJPs worth batching), and
    # where the engine asks whether any input can be batched at all (an input that
    # cannot has its rows computed before the next is probed)
    from agcheck.engine.rows import Problem as _Problem

    monkeypatch.setattr(cost, "BATCHED_VJPS_FROM_CALLS", 0 if vjps_may_batch else float("inf"))
    probed = []
    original = _Problem._log_batching  # once per input probed

    def spied(self, pos):
        probed.append(pos)
        return original(self, pos)

    monkeypatch.setattr(_Problem, "_log_batching", spied)
    x, y = make(16), make(16, seed=1)
    start = float(x[1])

    def fn(a, b):
        # vmap cannot run float() on a batch; a plain call moving a[1] raises, as under torch
        if moved_raises and float(a[1]) != start:
            raise ValueError("a[1] moved")
        return ScaledSin.apply(a) * b

    if moved_raises:
        with pytest.raises(ValueError, match=r"a\[1\] moved"):
            torch.autograd.gradcheck(fn, (x.detach().clone().requires_grad_(), y))  # leaves its a moved
        with pytest.raises(ValueError, match=r"a\[1\] moved"):
            agcheck.gradcheck(fn, (x, y), backend="torch")
        assert probed == [0]
    else:
        assert run(fn, (x, y)).verdict and probed == [0, 1]
        monkeypatch.setattr(ScaledSin, "factor", 1.1)
        assert not run(fn, (x, y)).verdict


@pytest.mark.parametrize("factor", [1.0, 1.1])
def test_rows_computed_before_no_input_is_found_batchable_are_not_computed_again(factor, monkeypatch):
    # neither input can be batched (vmap: float() of a batch; stacked: W @ copies end to
    # end): each input's rows are computed before the next is probed, and the reference
    # engine, which then decides, takes them instead of moving every element again
    import agcheck.checks.jacobian as reference

    monkeypatch.setattr(cost, "BATCHED_VJPS_FROM_CALLS", 1 << 62)  # not the numerical-first path
    monkeypatch.setattr(ScaledSin, "factor", factor)
    w, calls, in_reference = make(16, 16, seed=2).detach(), [], []

    def fn(a, b):
        calls.append(1)
        y = (w @ ScaledSin.apply(a)) * b
        return y * (1.0 if float(y.detach().sum()) > -1e9 else 2.0)

    original = reference._reference_slow

    def counted(*args, **kwargs):
        before = len(calls)
        try:
            return original(*args, **kwargs)
        finally:
            in_reference.append(len(calls) - before)

    monkeypatch.setattr(reference, "_reference_slow", counted)
    taken = reference_takes(monkeypatch)
    r = run(fn, (make(16), make(16, seed=1)), engine="batched")
    assert r.verdict is (factor == 1.0)
    assert [o.reason for o in r.engine_fallbacks] == ["no input can be moved in batches"]
    assert {q for q, blocks in taken.items() if blocks} == {0, 1} and in_reference == [0]


@pytest.mark.parametrize("factor", [1.0, 1.1])
def test_a_check_whose_loop_makes_few_calls_goes_to_the_reference_at_once(factor, monkeypatch):

    monkeypatch.setattr(ScaledSin, "factor", factor)
    monkeypatch.setattr(cost, "ENGINE_FROM_CALLS", 10_000)
    r = run(ScaledSin.apply, (make(5, 7),))
    (plan,) = [e for e in r.engine_log if e.path == "plan"]
    assert plan.decision == "reference"
    # two evaluations per input element, two VJPs per output element
    assert plan.figures == {"loop_calls": 4 * 35, "engine_from_calls": 10_000}
    assert not paths(r) and not r.engine_fallbacks  # no probe, no batch: the engine never ran
    assert r.verdict is (factor == 1.0)
    # a check whose loop makes more calls is left to the engine
    monkeypatch.setattr(cost, "ENGINE_FROM_CALLS", 4 * 35)
    big = run(ScaledSin.apply, (make(5, 7),))
    assert [e.decision for e in big.engine_log if e.path == "plan"] == ["engine"] and paths(big)
    assert big.verdict is (factor == 1.0)


def test_as_shipped_a_few_elements_go_to_the_loop_and_a_few_hundred_to_the_engine(monkeypatch):
    # the reference loop costs less than the engine's probes below some 100 calls: 8
    # elements (32 calls) take the loop, 256 (1,024 calls) the engine

    monkeypatch.undo()  # the limit as shipped, not the module fixture's
    assert 4 * 8 < cost.ENGINE_FROM_CALLS <= 4 * 256
    for factor in (1.0, 1.1):
        monkeypatch.setattr(ScaledSin, "factor", factor)
        small = run(ScaledSin.apply, (make(2, 4),))
        (plan,) = [e for e in small.engine_log if e.path == "plan"]
        assert plan.decision == "reference" and plan.figures["loop_calls"] == 32
        assert small.verdict is (factor == 1.0)
        large = run(ScaledSin.apply, (make(16, 16),))
        assert [e.decision for e in large.engine_log if e.path == "plan"] == ["engine"] and paths(large)
        assert large.verdict is (factor == 1.0)


@pytest.mark.parametrize("factor", [1.0, 1.1], ids=["right backward", "wrong backward"])
def test_the_plan_follows_from_the_shapes_however_slow_fn_is(factor, monkeypatch):
    """A function slow on its first call, or on every call, gets the plan its shapes give
    (no call is timed): the verdict is the reference's either way."""

    monkeypatch.undo()  # the limit as shipped, not the module fixture's
    monkeypatch.setattr(ScaledSin, "factor", factor)
    slowed = []

    def fn(t, every_call):
        if every_call or not slowed:
            slowed.append(1)
            busy(0.0005)
        return ScaledSin.apply(t)

    plans = []
    for every_call in (False, True):
        for shape in ((2, 4), (16, 16)):
            r = run(lambda t: fn(t, every_call), (make(*shape),))
            plans.append([(e.decision, e.figures) for e in r.engine_log if e.path == "plan"])
            assert r.verdict is (factor == 1.0)
    small = [("reference", {"loop_calls": 32, "engine_from_calls": cost.ENGINE_FROM_CALLS})]
    large = [("engine", {"loop_calls": 1024, "engine_from_calls": cost.ENGINE_FROM_CALLS})]
    assert plans == [small, large, small, large]


def test_closure_is_detected_and_falls_back():
    lin = torch.nn.Linear(30, 4).double()
    data = torch.randn(3, 30, dtype=torch.float64)
    r = run(lambda w: lin(data), (lin.weight,))
    (looped,) = [e for e in r.engine_log if e.path == "numerical"]
    # vmap's copies do not reach the output: their quotient differs from the plain calls'
    assert r.verdict and looped.decision == "looped" and "vmap: differs from plain calls" in looped.detail


def test_not_vmappable_falls_back_to_the_loop():
    r = run(lambda t: t * float(t.sum().item()), (make(40),))
    (looped,) = [e for e in r.engine_log if e.path == "numerical"]
    assert looped.decision == "looped" and "vmap: raised RuntimeError" in looped.detail
    assert r.verdict == torch.autograd.gradcheck(lambda t: t * float(t.sum().item()), (make(40),),
                                                 raise_exception=False)


def test_a_batched_mismatch_is_judged_and_reported_by_the_reference():
    r = run(OneEntryOff.apply, (make(40),))
    # vmapped (a vector input): after the first batches the timings may send the rest of
    # the rows to the loop, which is as exact
    assert "batched" in paths(r)
    assert r.verdict is False and r.engine_fallbacks
    with pytest.raises(agcheck.GradcheckError, match="Jacobian mismatch for output 0 with respect to input 0"):
        agcheck.gradcheck(OneEntryOff.apply, (make(40),))


@pytest.mark.parametrize("budget", [None, 20_000, 300])
def test_small_memory_budgets_recompute_but_agree(budget):
    fn = lambda a, b: (a @ b).sin()
    ok = run(fn, (make(12, 12), make(12, 12, seed=3)), memory_budget=budget)
    assert ok.verdict and not ok.engine_fallbacks and "batched" in paths(ok)
    # a's rows are independent samples of sin(a @ b)
    assert paths(ok) <= {"batched", "by samples"}
    bad = run(OneEntryOff.apply, (make(40),), memory_budget=budget)
    assert bad.verdict is False


class ScaledExp(torch.autograd.Function):
    """exp with backward and jvp scaled by ``factor`` (1.0 is correct)."""

    factor = 1.0

    @staticmethod
    def forward(ctx, x):
        y = x.exp()
        ctx.save_for_backward(y)
        ctx.save_for_forward(y)
        return y

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        return g * y.conj() * ScaledExp.factor

    @staticmethod
    def jvp(ctx, t):
        (y,) = ctx.saved_tensors
        return t * y * ScaledExp.factor


@pytest.mark.parametrize("backward_factor", [1.0, 1.01])
def test_complex_rows_are_batched_as_one_call_holds_them(backward_factor, monkeypatch):
    # a complex input's real and imaginary moves are evaluated in two calls, one after
    # the other: a batch of rows may take what one call of its copies takes, not half
    from agcheck.engine import rows

    sizes = []
    original = rows.Problem._element_moves

    def recording(self, pos, start, stop, step):
        if not isinstance(step, complex):  # the real moves of each batch of rows
            sizes.append(stop - start)
        return original(self, pos, start, stop, step)

    monkeypatch.setattr(rows.Problem, "_element_moves", recording)
    monkeypatch.setattr(ScaledExp, "factor", backward_factor)
    z = torch.randn(200, dtype=torch.complex128, generator=torch.Generator().manual_seed(4), requires_grad=True)
    r = run(lambda t: ScaledExp.apply(t) * t.conj(), (z,), memory_budget=4 << 20)
    assert r.verdict is (backward_factor == 1.0)
    # a quarter of 4 MiB per call, (200 + 200) elements x 16 bytes x 4 x 2 points a row:
    # every batch that size, the last one the rest
    assert sizes[:10] == [(1 << 20) // ((200 + 200) * 16 * rows.INTERMEDIATES * 2)] * 10 == [20] * 10


@pytest.mark.parametrize("kw", [{}, {"check_forward_ad": True, "check_backward_ad": False}])
@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128])
def test_auto_and_reference_agree(kw, dtype):
    fn = lambda a, b: (a * b.exp(), (a @ b.T).sum(0))
    inputs = lambda: (make(6, 6, dtype=dtype), make(6, 6, dtype=dtype, seed=4))
    for engine in ("auto", "reference"):
        assert agcheck.gradcheck(fn, inputs(), engine=engine, **kw)
    ScaledExp.factor = 1.1
    try:
        for engine in ("auto", "reference"):
            with pytest.raises(agcheck.GradcheckError, match="Jacobian"):
                agcheck.gradcheck(lambda a, b: a * ScaledExp.apply(b), inputs(), engine=engine, **kw)
    finally:
        ScaledExp.factor = 1.0


def test_nondeterministic_backward_is_caught_by_both_engines():
    gen = torch.Generator().manual_seed(0)

    class Noisy(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return g * (2 + 1e-9 * torch.rand(g.shape, generator=gen, dtype=g.dtype))

    for engine in ("auto", "reference"):
        with pytest.raises(agcheck.GradcheckError, match="Backward is not reentrant"):
            agcheck.gradcheck(Noisy.apply, (make(30),), engine=engine)
        assert agcheck.gradcheck(Noisy.apply, (make(30),), engine=engine, nondet_tol=1e-6)


def _delayed(monkeypatch, name, delay, owner=None):
    """Make the engine's batched call ``name`` run ``delay()`` first on every call (a slow
    op works: ``busy``; a process on a busy machine waits: ``time.sleep``); count the calls."""
    import agcheck.engine.columns as engine

    owner = owner or engine
    original, calls = getattr(owner, name), []

    def delayed(*args, **kwargs):
        calls.append(1)
        delay()
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, delayed)
    return calls


def _sines(broken, dense=False):
    """Thirty sines (the last one's backward one entry off when ``broken``), after a dense
    64x64 map when ``dense``: each plain call costs thirty small ops, which batched calls
    share among their rows."""
    last = OneEntryOff.apply if broken else torch.sin
    w = make(64, 64, seed=3).detach() / 8

    def fn(x):
        x = w @ x if dense else x
        for _ in range(29):
            x = torch.sin(x)
        return last(x)

    return fn


def plan(r) -> list:
    """The engine's decisions, as the check's record holds them."""
    return [(e.path, e.decision, e.subject, e.detail, e.via, e.figures) for e in r.engine_log]


@pytest.mark.parametrize("call, delay", [("rows", "busy"), ("rows", "waiting"), ("columns", "waiting")])
@pytest.mark.parametrize("broken", [False, True])
def test_slow_or_delayed_batched_calls_leave_the_plan_as_it_was(broken, call, delay, monkeypatch):
    """The plan follows from the check, not from the time its calls take: batched rows
    that work 50 ms more per call (a pathologically slow batched form), or batched rows or
    VJPs that wait that long (a process on a busy machine), get the plan of the same check
    without the delay, and the reference's verdict."""
    from agcheck.engine.rows import Problem as _Problem

    monkeypatch.setattr(cost, "BATCHED_VJPS_FROM_CALLS", 0)  # the VJPs of 64 outputs batched too
    fn = _sines(broken, dense=True)
    quiet = run(fn, (make(64),), engine="batched")
    owner, name = (_Problem, "_element_moves") if call == "rows" else (None, "batched_columns")
    calls = _delayed(monkeypatch, name, (lambda: busy(0.05)) if delay == "busy" else (lambda: time.sleep(0.05)), owner)
    delayed = run(fn, (make(64),), engine="batched")
    assert calls and plan(delayed) == plan(quiet)
    assert delayed.verdict is quiet.verdict is (not broken)
    assert delayed.verdict is torch.autograd.gradcheck(fn, (make(64),), raise_exception=False)
    if not broken:
        assert "batched" in paths(delayed) and ("vjp", "batched") in {(e.path, e.decision) for e in delayed.engine_log}


@pytest.mark.parametrize("broken", [False, True])
def test_batched_vjps_dearer_than_one_per_column_give_way_to_the_loop(broken, monkeypatch):
    """Batched VJPs that work 50 ms more per call (as a batched backward of a 3-D
    convolution costs 2.5 times the loop's per column) give way to one VJP per column at
    the second batch, priced against one VJP timed right after it on the same clock; time
    spent waiting counts for nothing (above). The verdict is the reference's."""

    monkeypatch.setattr(cost, "BATCHED_VJPS_FROM_CALLS", 0)
    fn = _sines(broken, dense=True)
    quiet = run(fn, (make(64),), engine="batched")
    _delayed(monkeypatch, "batched_columns", lambda: busy(0.05))
    slow = run(fn, (make(64),), engine="batched")
    looped = [e.detail for e in slow.engine_log if (e.path, e.decision) == ("vjp", "looped")]
    assert looped == ["one VJP per column costs less than batched ones"]
    assert ("vjp", "looped") not in {(e.path, e.decision) for e in quiet.engine_log}
    assert slow.verdict is quiet.verdict is (not broken)
    assert slow.verdict is torch.autograd.gradcheck(fn, (make(64),), raise_exception=False)


def test_rows_and_columns_are_batched_as_the_memory_budget_allows(monkeypatch):
    """Every batched call takes as many rows (or VJP columns) as a quarter of the memory
    budget holds at the bytes the shapes imply (input and outputs, ``INTERMEDIATES`` times
    over, per stencil point), at most ``MAX_BATCH``; the last one takes the rest."""
    import agcheck.engine.columns as engine
    from agcheck.engine.rows import Problem as _Problem

    monkeypatch.setattr(cost, "BATCHED_VJPS_FROM_CALLS", 0)
    rows, columns = [], []
    element_moves, batched_columns = _Problem._element_moves, engine.batched_columns

    def counted_rows(self, pos, start, stop, step):  # the moves of one batched call of rows
        rows.append(stop - start)
        return element_moves(self, pos, start, stop, step)

    def counted_columns(p, k, c0, c1, *args, **kwargs):
        columns.append(c1 - c0)
        return batched_columns(p, k, c0, c1, *args, **kwargs)

    monkeypatch.setattr(_Problem, "_element_moves", counted_rows)
    monkeypatch.setattr(engine, "batched_columns", counted_columns)
    w = make(300, 300, seed=3).detach() / 20
    fn = lambda x: torch.sin(w @ x)
    for budget, size in ((None, 8 << 20), (4 << 20, 1 << 20)):
        rows.clear(), columns.clear()
        r = run(fn, (make(300),), engine="batched", memory_budget=budget)
        assert r.verdict
        # a call may take a Jacobian's bytes, at least 8 MiB, at most a quarter of the
        # budget; a row: (300 + 300) elements x 8 bytes x 4 x 2 points; a column: the
        # same (a cotangent and a gradient, with the evaluation's intermediates)
        per_row = per_column = min(size // (600 * 8 * cost.INTERMEDIATES * 2), cost.MAX_BATCH)
        assert rows == [per_row] * (300 // per_row) + ([300 % per_row] if 300 % per_row else [])
        assert max(columns) == per_column and set(columns) <= {per_column, 300 % per_column}


def test_vjps_are_batched_where_their_loop_makes_many_calls(monkeypatch):
    """Batched VJPs are used where the loop of VJPs makes ``BATCHED_VJPS_FROM_CALLS`` calls
    or more (two per output element): a first batched backward may import code that a
    shorter loop would not repay. Either way the verdict is the reference's."""

    for broken in (False, True):
        fn = _sines(broken, dense=True)
        for limit, batched in ((2 * 64, True), (2 * 64 + 1, False)):
            monkeypatch.setattr(cost, "BATCHED_VJPS_FROM_CALLS", limit)
            calls = []
            with monkeypatch.context() as m:
                calls = _delayed(m, "batched_columns", lambda: None)
                r = run(fn, (make(64),), engine="batched")
            assert r.verdict is (not broken)
            assert bool(calls) is batched
            assert (("vjp", "batched") in {(e.path, e.decision) for e in r.engine_log}) is batched


def test_forward_mode_on_an_unbatchable_fn_evaluates_it_as_often_as_torch():
    """Where batched JVPs fail too, the forward engine hands over before it computes a
    looped numerical Jacobian that the reference engine would compute again."""

    def counting(fn):
        calls = []

        def wrapped(t):
            calls.append(1)
            return fn(t)

        return wrapped, calls

    m = make(40, 5, seed=2, requires_grad=False)
    # dense (not compressible); a random op (with no effect) keeps vmap out, also of JVPs
    not_vmappable = lambda t: t.sin() @ m + 0 * torch.rand(())  # noqa: E731
    x = make(40)
    ours, our_calls = counting(not_vmappable)
    theirs, their_calls = counting(not_vmappable)
    assert agcheck.gradcheck(ours, (x,), check_forward_ad=True)
    assert torch.autograd.gradcheck(theirs, (x.detach().clone().requires_grad_(),), check_forward_ad=True)
    assert len(our_calls) <= len(their_calls) + 10  # a few probe evaluations

    broken = lambda t: ScaledSin.apply(t) @ m + 0 * torch.rand(())  # noqa: E731
    ScaledSin.factor = 1.1
    try:
        assert agcheck.gradcheck(broken, (x,), check_forward_ad=True, raise_exception=False) is False
    finally:
        ScaledSin.factor = 1.0


class _CountedDense(torch.autograd.Function):
    """tanh(W x) with a hand-written backward scaled by ``scale`` (1: right, 2: wrong); no
    batching rule, so the engine moves its input element by element."""

    calls = 0
    scale = 1.0
    W = torch.randn(260, 260, dtype=torch.float64, generator=torch.Generator().manual_seed(3))

    @staticmethod
    def forward(ctx, x):
        _CountedDense.calls += 1
        y = torch.tanh(_CountedDense.W @ x)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        return _CountedDense.scale * (_CountedDense.W.T @ (g * (1 - y * y)))


def _calls(check, x, **kw):
    _CountedDense.calls = 0
    verdict = check(_CountedDense.apply, (x,), raise_exception=False, **kw)
    return _CountedDense.calls, verdict


def _message(check, x, **kw):
    return first_paragraph(check, _CountedDense.apply, (x,), **kw)


@pytest.mark.parametrize("scale", [1.0, 2.0])
def test_a_dense_check_evaluates_fn_about_as_often_as_torch_passing_or_failing(scale, monkeypatch):
    # a failing check used to compute the numerical Jacobian two or three times (the engine's
    # pass, then the reference engine's); it now reuses rows computed element by element
    monkeypatch.setattr(_CountedDense, "scale", scale)
    x = make(260, seed=4)
    torch_calls, torch_verdict = _calls(torch.autograd.gradcheck, x)
    calls, verdict = _calls(agcheck.gradcheck, x)
    assert verdict is torch_verdict is (scale == 1.0)
    assert calls <= 1.05 * torch_calls, (calls, torch_calls)
    if scale != 1.0:
        # the reused numbers are the reference engine's, bit for bit
        message = _message(agcheck.gradcheck, x)
        assert message == _message(agcheck.gradcheck, x, engine="reference")
        assert message.startswith("Jacobian mismatch for output 0 with respect to input 0")


class _TanhMatmulThroughLists(torch.autograd.Function):
    """tanh(a @ b) whose backward goes through Python lists, which no vmap can batch;
    its cotangent scaled by ``scale`` (1.0 is correct)."""

    scale = 1.0

    @staticmethod
    def forward(ctx, a, b):
        y = torch.tanh(a @ b)
        ctx.save_for_backward(a, b, y)
        return y

    @staticmethod
    def backward(ctx, g):
        a, b, y = ctx.saved_tensors
        d = torch.tensor(g.tolist(), dtype=g.dtype) * _TanhMatmulThroughLists.scale * (1 - y * y)
        return d @ b.T, a.T @ d


@pytest.mark.parametrize("scale", [1.0, 1.1])
def test_a_backward_that_cannot_be_batched_is_looped_and_the_engine_still_decides(scale, monkeypatch):
    # it used to hand the whole check back to the reference engine (roma's Procrustes
    # functions: torch's time, where the numerical side batches and the second VJP pass
    # is coloured)

    monkeypatch.setattr(cost, "BATCHED_VJPS_FROM_CALLS", 0)  # batched VJPs tried, however few
    monkeypatch.setattr(_TanhMatmulThroughLists, "scale", scale)
    args = (make(20, 20), make(20, 20, seed=1))
    r = run(_TanhMatmulThroughLists.apply, args)
    assert EngineEvent("vjp", "looped", None, "batched VJPs failed (RuntimeError)") in r.engine_log
    assert r.verdict is (scale == 1.0)
    assert r.verdict is torch.autograd.gradcheck(_TanhMatmulThroughLists.apply, args, raise_exception=False)
    if scale == 1.0:
        assert not r.engine_fallbacks  # the engine decided
        return
    messages = [first_paragraph(agcheck.gradcheck, _TanhMatmulThroughLists.apply, args, engine=engine)
                for engine in ("auto", "reference")]
    assert messages[0] == messages[1] and messages[0].startswith("Jacobian mismatch for output 0")


_OUTER_WEIGHTS = torch.linspace(-1, 1, 40, dtype=torch.float64)


class _OuterSinThroughLists(torch.autograd.Function):
    """``sin(x)`` times 40 weights (40 outputs per input element), with a forward-mode
    formula and a backward through Python lists that no vmap can batch; the backward
    scaled by ``scale`` (1.0 is correct); counts its backward calls."""

    generate_vmap_rule = True
    scale = 1.0
    backwards = 0

    @staticmethod
    def forward(x):
        return torch.sin(x)[:, None] * _OUTER_WEIGHTS

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[0])
        ctx.save_for_forward(inputs[0])

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        _OuterSinThroughLists.backwards += 1
        g = torch.tensor(g.tolist(), dtype=g.dtype)
        return _OuterSinThroughLists.scale * (g * _OUTER_WEIGHTS).sum(1) * torch.cos(x)

    @staticmethod
    def jvp(ctx, t):
        (x,) = ctx.saved_tensors
        return (torch.cos(x) * t)[:, None] * _OUTER_WEIGHTS


@pytest.mark.parametrize("scale", [1.0, 1.1])
def test_forward_mode_projections_loop_a_backward_that_cannot_be_batched(scale, monkeypatch):
    # the projections that tie forward mode to the backward used to give up on a batching
    # failure, and the Jacobian then cost one looped VJP per output element (1,600 here)

    monkeypatch.setattr(cost, "BATCHED_VJPS_FROM_CALLS", 0)  # batched VJPs tried, however few
    monkeypatch.setattr(_OuterSinThroughLists, "scale", scale)
    monkeypatch.setattr(_OuterSinThroughLists, "backwards", 0)
    args = (make(40, seed=3),)
    r = run(_OuterSinThroughLists.apply, args)
    backwards = _OuterSinThroughLists.backwards
    failed = EngineEvent("vjp", "looped", None, "batched VJPs failed (RuntimeError)")
    assert r.engine_log.count(failed) == 1
    forward = next(e for e in r.engine_log if e.path == "forward")
    assert r.verdict is (scale == 1.0)
    assert r.verdict is torch.autograd.gradcheck(_OuterSinThroughLists.apply, args, raise_exception=False)
    if scale == 1.0:
        assert forward.decision == "passed" and not r.engine_fallbacks
        assert backwards <= 4 * forward_jacobian.ROUNDS, backwards
        return
    assert forward.decision == "disagreement"
    messages = [first_paragraph(agcheck.gradcheck, _OuterSinThroughLists.apply, args, engine=engine)
                for engine in ("auto", "reference")]
    assert messages[0] == messages[1] and messages[0].startswith("Jacobian mismatch for output 0")


@pytest.mark.parametrize("factor", [1.0, 1.1])
def test_a_dense_cnn_is_batched_in_calls_the_memory_budget_sizes(factor, monkeypatch):
    # torch's float64 CPU convolution runs a batch sample by sample: batched rows cost
    # about what looped ones do, and the plan batches them all the same, in calls of the
    # size the shapes and the budget give (no batch is timed)

    conv = torch.nn.Conv2d(1, 2, 3, padding=1).double()
    monkeypatch.setattr(ScaledSin, "factor", factor)
    fn = lambda t: ScaledSin.apply(conv(t))  # noqa: E731
    r = run(fn, (make(1, 1, 12, 12),), engine="batched")
    (event,) = [e for e in r.engine_log if e.path == "numerical" and e.decision == "batched"]
    # a row: (144 + 288) elements x 8 bytes x 4, two points; a call: 8 MiB at least
    assert event.figures["rows_per_batch"] == min(144, cost.MAX_BATCH, (8 << 20) // (432 * 8 * 4 * 2))
    assert r.verdict is (factor == 1.0)
    assert r.verdict is torch.autograd.gradcheck(fn, (make(1, 1, 12, 12),), raise_exception=False)


# -- how a batched input is evaluated: stacked on fn's own first dimension, or vmapped ----

def _via(r):
    return {e.via for e in r.engine_log if e.path == "numerical" and e.decision == "batched"}


def _stacked_positions(monkeypatch) -> list:
    """The input positions of every stacked evaluation from now on, in call order."""
    from agcheck.backends.torch_backend import TorchBackend

    stacked = []
    original = TorchBackend.evaluate_stacked
    monkeypatch.setattr(TorchBackend, "evaluate_stacked",
                        lambda self, fn, args, pos, *a, **kw: (stacked.append(pos),
                                                               original(self, fn, args, pos, *a, **kw))[1])
    return stacked


W16 = torch.randn(16, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(9))


@pytest.mark.parametrize("factor", [1.0, 1.1])
def test_a_fn_of_independent_samples_is_evaluated_stacked_even_without_a_vmap_rule(factor, monkeypatch):
    # ScaledSin has no vmap rule; the samples (rows of x) are independent, so the moved
    # copies can be laid end to end along the first dimension and evaluated in one call

    monkeypatch.setattr(ScaledSin, "factor", factor)
    fn = lambda x: ScaledSin.apply(x @ W16)  # noqa: E731
    r = run(fn, (make(8, 16),), engine="batched")
    assert _via(r) == {"stacked"}
    assert r.verdict is (factor == 1.0)
    assert r.verdict is torch.autograd.gradcheck(fn, (make(8, 16),), raise_exception=False)
    event = next(e for e in r.engine_log if e.path == "numerical" and e.decision == "batched")
    assert event.via == "stacked" and event.figures["rows_per_batch"] == min(8 * 16, cost.MAX_BATCH)


@pytest.mark.parametrize("broken", [False, True])
def test_a_fn_that_mixes_its_samples_is_not_stacked(broken):
    # the stacked probe sees each copy's result depend on the others (a mean over the
    # first dimension): vmap evaluates the copies apart instead
    inner = OneEntryOff.apply if broken else torch.sin
    fn = lambda t: inner(t - t.mean(0))  # noqa: E731
    r = run(fn, (make(6, 10),), engine="batched")
    assert _via(r) == {"vmap"}
    assert r.verdict is (not broken)
    assert r.verdict is torch.autograd.gradcheck(fn, (make(6, 10),), raise_exception=False)


@pytest.mark.parametrize("broken", [False, True])
def test_a_vector_input_is_vmapped_before_its_copies_are_laid_end_to_end(broken, monkeypatch):
    # W16 @ x on 16 elements: copies laid end to end make a 32-vector that W16 cannot
    # multiply (the op would raise); vmap batches it, and is tried first on a vector
    stacked = _stacked_positions(monkeypatch)
    inner = OneEntryOff.apply if broken else torch.sin
    fn = lambda x: inner(W16 @ x)  # noqa: E731
    r = run(fn, (make(16),), engine="batched")
    assert _via(r) == {"vmap"} and not stacked
    assert r.verdict is (not broken)
    assert r.verdict is torch.autograd.gradcheck(fn, (make(16),), raise_exception=False)


@pytest.mark.parametrize("broken", [False, True])
def test_a_weight_is_vmapped_first_and_a_batch_is_stacked_first(broken, monkeypatch):
    # x (4 samples) carries its first dimension to the output (4 x 16): its copies are
    # stacked; w's first dimension (16) is no output's, its copies would not fit x
    stacked = _stacked_positions(monkeypatch)
    inner = OneEntryOff.apply if broken else torch.sin
    fn = lambda x, w: inner(x @ w.T)  # noqa: E731
    inputs = (make(4, 8), make(16, 8, seed=1))
    r = run(fn, inputs, engine="batched")
    via = {e.subject: e.via for e in r.engine_log if e.path == "numerical" and e.decision == "batched"}
    assert via == {0: "stacked", 1: "vmap"} and 1 not in stacked
    assert r.verdict is (not broken)
    assert r.verdict is torch.autograd.gradcheck(fn, inputs, raise_exception=False)


def test_a_vector_input_that_vmap_cannot_batch_is_still_stacked():
    # ScaledSin has no vmap rule; elementwise, its copies laid end to end are its batch
    fn = lambda x: ScaledSin.apply(x) * 2  # noqa: E731
    r = run(fn, (make(40),), engine="batched")
    assert _via(r) == {"stacked"} and r.verdict


def _counted(fn):
    calls = []

    def counted(*args):
        calls.append(1)
        return fn(*args)

    return counted, calls


@pytest.mark.parametrize("factor", [1.0, 1.1])
def test_a_scalar_loss_that_vmap_cannot_batch_costs_no_probe_call(factor, monkeypatch):
    # a loss (one number) through a custom Function without a vmap rule: stacked copies
    # have no output dimension to come back on, vmap would raise on the Function; the
    # trace shows both, so fn is called for the loop only (torch's checker: one more)
    monkeypatch.setattr(ScaledSin, "factor", factor)
    fn, calls = _counted(lambda x: ScaledSin.apply(x).square().sum())
    r = run(fn, (make(5, 8),))
    assert len(calls) == 1 + 2 * 40
    looped = next(e for e in r.engine_log if e.path == "numerical")
    assert looped.decision == "looped" and "ScaledSin" in looped.detail and "no first dimension" in looped.detail
    assert r.verdict is (factor == 1.0)
    assert r.verdict is torch.autograd.gradcheck(fn, (make(5, 8),), raise_exception=False)


@pytest.mark.parametrize("factor", [1.0, 1.1])
def test_an_input_whose_batched_forms_all_raise_costs_no_plain_probe_call(factor, monkeypatch):
    # w @ x mixes x's rows, and ScaledSin has no vmap rule: copies laid end to end make a
    # 12 x 8 matrix that w cannot multiply (the op raises), and the trace rules vmap out.
    # The probe's two plain calls (which time one element's rows and judge a batched
    # form's results) judge nothing here, so they are not made: xitorch's gradgradchecks
    # that raise at a step paid them per input before the step that raised
    from agcheck.core import jacobian

    monkeypatch.setattr(ScaledSin, "factor", factor)
    directional = []
    original = jacobian.numerical_directional
    monkeypatch.setattr(jacobian, "numerical_directional", lambda *a, **kw: directional.append(1) or original(*a, **kw))
    w = torch.randn(6, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(20))
    stacked = _stacked_positions(monkeypatch)
    fn, calls = _counted(lambda x: ScaledSin.apply(w @ x))
    x = make(6, 8, seed=21)
    r = run(fn, (x,), engine="batched")
    assert stacked == [0] and not directional
    ours = len(calls)
    assert r.verdict is torch.autograd.gradcheck(fn, (x,), raise_exception=False)
    # beside the calls torch's checker makes: the stacked call that raised and, where the
    # engine loops itself, the samples' probe (unmoved, and the first row moved: the
    # others' outputs move too); before, two plain calls more
    assert ours - (len(calls) - ours) <= 1 + 2
    looped = next(e for e in r.engine_log if e.path == "numerical")
    assert looped.decision == "looped" and not looped.figures
    assert r.verdict is (factor == 1.0)


@pytest.mark.parametrize("factor", [1.0, 1.1])
def test_the_engine_log_says_why_each_batched_form_was_not_taken(factor, monkeypatch):
    # a looped input's event names every form left out or rejected, and why: vmap by the
    # trace (ScaledSin has no vmap rule), stacked copies by the call that raised (w cannot
    # multiply 12 rows) or by the plain calls they differ from (a mean over the copies)
    monkeypatch.setattr(ScaledSin, "factor", factor)
    w = torch.randn(6, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(20))
    cases = [(lambda t: ScaledSin.apply(w @ t), make(6, 8, seed=21), "stacked: raised RuntimeError"),
             (lambda t: ScaledSin.apply(t - t.mean(0)), make(6, 10, seed=22), "stacked: differs from plain calls")]
    for fn, x, why in cases:
        r = run(fn, (x,), engine="batched")
        looped = next(e for e in r.engine_log if e.path == "numerical")
        assert looped.decision == "looped" and why in looped.detail
        assert "vmap: custom Function ScaledSin" in looped.detail
        assert r.verdict is (factor == 1.0)
        assert r.verdict is torch.autograd.gradcheck(fn, (x,), raise_exception=False)


@pytest.mark.parametrize("broken", [False, True])
def test_a_scalar_loss_is_still_vmapped_where_nothing_stands_in_the_way(broken, monkeypatch):
    # the same shape of loss through ops (and a Function) vmap batches: vmapped, never stacked
    stacked = _stacked_positions(monkeypatch)
    inner = OneEntryOff.apply if broken else torch.sin
    fn = lambda x: inner(x).square().sum()  # noqa: E731
    r = run(fn, (make(5, 8),), engine="batched")
    assert _via(r) == {"vmap"} and not stacked
    assert r.verdict is (not broken)
    assert r.verdict is torch.autograd.gradcheck(fn, (make(5, 8),), raise_exception=False)


def _written_into_zeros(inner):
    """A loss that writes its pieces into a tensor it creates (as transforms on grids
    often do): vmap refuses the write of batched values into the unbatched zeros."""

    def fn(x):
        out = torch.zeros(2, x.shape[-1], dtype=x.dtype)
        out[0] = inner(x).sum(0)
        out[1] = (x * x).sum(0)
        return out.square().sum()

    return fn


def _functional_calls(monkeypatch) -> list:
    """The copies of each call of the torch backend's functionalized batched evaluation
    from now on."""
    calls = []
    backend = type(agcheck.get_backend("torch"))
    original = backend.evaluate_batch_functional
    monkeypatch.setattr(backend, "evaluate_batch_functional",
                        lambda self, *a: calls.append(a[3].shape[0]) or original(self, *a))
    return calls


def _sin_one_percent_off(t):
    """sin's values with 1.01 * cos as derivative, from plain ops (a custom Function would
    stop functionalize)."""
    return t.sin() + 0.01 * (t.sin() - t.sin().detach())


@pytest.mark.parametrize("broken", [False, True])
def test_a_loss_that_writes_into_a_tensor_it_creates_is_vmapped_functionalized(broken, monkeypatch):
    # no first output dimension (stacking is out); plain vmap raises on the in-place write;
    # through functionalize the writes are out-of-place and the copies batch
    fn = _written_into_zeros(_sin_one_percent_off if broken else torch.sin)
    with pytest.raises(RuntimeError, match="vmap"):
        torch.func.vmap(fn)(make(2, 5, 8))
    functional = _functional_calls(monkeypatch)
    r = run(fn, (make(5, 8),), engine="batched")
    assert _via(r) == {"functional"} and len(functional) >= 2  # the probe, then the rows
    # vmap's per-sample fallback copies the whole batch per sample: small calls
    assert functional[1:] == [cost.FUNCTIONAL_MAX_COPIES] * (80 // cost.FUNCTIONAL_MAX_COPIES)
    assert r.verdict is (not broken)
    assert r.verdict is torch.autograd.gradcheck(fn, (make(5, 8),), raise_exception=False)


def test_the_functionalized_form_is_tried_only_where_vmap_raised(monkeypatch):
    tried = _functional_calls(monkeypatch)
    r = run(lambda x: x.sin().square().sum(), (make(5, 8),), engine="batched")
    assert _via(r) == {"vmap"} and not tried and r.verdict


@pytest.mark.parametrize("broken", [False, True])
def test_a_loss_neither_batched_form_can_evaluate_is_looped(broken, monkeypatch):
    # .item() inside: vmap raises, and so does its functionalized form; the loop decides
    inner = _sin_one_percent_off if broken else torch.sin

    def fn(x):
        scale = 1.0 if x.sum().item() > -1e9 else 2.0
        return _written_into_zeros(inner)(x) * scale

    tried = _functional_calls(monkeypatch)
    r = run(fn, (make(5, 8),), engine="batched")
    assert not _via(r) and len(tried) == 1  # the probe's call, which raised
    assert [e.decision for e in r.engine_log if e.path == "numerical"] == ["looped"]
    assert r.verdict is (not broken)
    assert r.verdict is torch.autograd.gradcheck(fn, (make(5, 8),), raise_exception=False)


W44 = torch.randn(44, 44, dtype=torch.float64, generator=torch.Generator().manual_seed(10))


@pytest.mark.parametrize("factor", [1.0, 1.1])
def test_inputs_sharing_one_sample_are_stacked_with_the_others_repeated(factor, monkeypatch):
    # a batch of one sample in two arguments that must agree on it (torch.cat), and no
    # vmap rule (ScaledSin): the moved copies of one input are laid end to end with the
    # other input repeated beside them, as in kornia's batch-of-one checks
    monkeypatch.setattr(ScaledSin, "factor", factor)
    fn = lambda a, b: ScaledSin.apply(torch.cat([a, b], 1) @ W44)  # noqa: E731
    inputs = (make(1, 20), make(1, 24, seed=1))
    r = run(fn, inputs, engine="batched")
    assert _via(r) == {"stacked"}
    batched = [e for e in r.engine_log if e.path == "numerical" and e.decision == "batched"]
    assert {e.subject for e in batched} == {0, 1} and all(e.figures["tiled"] == 1 for e in batched)
    assert r.verdict is (factor == 1.0)
    assert r.verdict is torch.autograd.gradcheck(fn, inputs, raise_exception=False)
    if factor != 1.0:
        assert first_paragraph(agcheck.gradcheck, fn, inputs) == torch_message(fn, inputs)


@pytest.mark.parametrize("broken", [False, True])
def test_repeating_the_other_inputs_is_refused_where_fn_mixes_the_copies(broken):
    # untiled, the copies of a do not fit b; tiled, the mean over a's first dimension
    # mixes a's copies: the probe sees it and vmap evaluates them apart instead (b's
    # copies meet a repeated, whose mean is a's own: they are stacked)
    inner = OneEntryOff.apply if broken else torch.sin
    fn = lambda a, b: inner(a + b - a.mean(0))  # noqa: E731
    inputs = (make(6, 10), make(6, 10, seed=1))
    r = run(fn, inputs, engine="batched")
    batched = {e.subject: e for e in r.engine_log if e.path == "numerical" and e.decision == "batched"}
    assert batched[0].via == "vmap" and "tiled" not in batched[0].figures
    assert batched[1].via == "stacked" and batched[1].figures["tiled"] == 1
    assert r.verdict is (not broken)
    assert r.verdict is torch.autograd.gradcheck(fn, inputs, raise_exception=False)


class _DenseWithJvp(torch.autograd.Function):
    """tanh(W x) with a hand-written forward derivative scaled by ``scale`` (1: right);
    vmappable, so the forward engine's batched JVPs work."""

    generate_vmap_rule = True
    calls = 0
    scale = 1.0
    W = torch.randn(120, 120, dtype=torch.float64, generator=torch.Generator().manual_seed(5))

    @staticmethod
    def forward(x):
        _DenseWithJvp.calls += 1
        return torch.tanh(_DenseWithJvp.W @ x)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_forward(output)
        ctx.y = output

    @staticmethod
    def jvp(ctx, t):
        return _DenseWithJvp.scale * (1 - ctx.y * ctx.y) * (_DenseWithJvp.W @ t)

    @staticmethod
    def backward(ctx, g):
        return _DenseWithJvp.W.T @ (g * (1 - ctx.y * ctx.y))


@pytest.mark.parametrize("scale", [1.0, 2.0])
def test_a_failing_forward_check_reuses_the_rows_the_engine_computed(scale, monkeypatch):
    # the numerical rows are computed element by element (the probe is made to find the
    # input unbatchable), the JVPs batched: on a mismatch the reference engine gets the rows
    from agcheck.engine.rows import Problem as _Problem

    monkeypatch.setattr(_Problem, "_batched_forms", lambda self, pos: [])
    monkeypatch.setattr(_DenseWithJvp, "scale", scale)
    kw = dict(check_forward_ad=True, check_backward_ad=False, check_undefined_grad=False, raise_exception=False)
    x = make(120, seed=6)
    _DenseWithJvp.calls = 0
    torch_verdict = torch.autograd.gradcheck(_DenseWithJvp.apply, (x,), **kw)
    torch_calls = _DenseWithJvp.calls
    _DenseWithJvp.calls = 0
    taken = reference_takes(monkeypatch)
    r = run(_DenseWithJvp.apply, (x,), **kw)
    assert r.verdict is torch_verdict is (scale == 1.0)
    assert _DenseWithJvp.calls <= 1.05 * torch_calls, (_DenseWithJvp.calls, torch_calls)
    if scale != 1.0:
        assert [o.reason for o in r.engine_fallbacks] == ["Jacobian mismatch"] and taken[0]
        strict = {k: v for k, v in kw.items() if k != "raise_exception"}
        with pytest.raises(RuntimeError) as ours:
            agcheck.gradcheck(_DenseWithJvp.apply, (x,), **strict)
        with pytest.raises(RuntimeError) as reference:
            agcheck.gradcheck(_DenseWithJvp.apply, (x,), engine="reference", **strict)
        assert torch_text(ours.value).split("\n\n")[0] == torch_text(reference.value).split("\n\n")[0]


class _DenseVmappable(torch.autograd.Function):
    """tanh(W x) with a vmap rule; the backward is scaled by ``scale`` (1: right) for the
    input elements from ``wrong_from`` on, so that a mismatch shows in the rows chosen.
    ``calls`` counts the forward evaluations."""

    generate_vmap_rule = True
    scale = 1.0
    wrong_from = 0
    calls = 0
    W = torch.randn(150, 150, dtype=torch.float64, generator=torch.Generator().manual_seed(8))

    @staticmethod
    def forward(x):
        _DenseVmappable.calls += 1
        return torch.tanh(_DenseVmappable.W @ x)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(output)

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        grad = _DenseVmappable.W.T @ (g * (1 - y * y))
        k = _DenseVmappable.wrong_from
        if k == 0:  # (an empty slice has no batching rule under vmap)
            return _DenseVmappable.scale * grad
        return torch.cat([grad[..., :k], _DenseVmappable.scale * grad[..., k:]], dim=-1)


@pytest.mark.parametrize("scale", [1.0, 2.0])
def test_a_mismatch_is_decided_from_the_batched_rows_and_the_printed_rows(scale, monkeypatch):
    # a dense Jacobian, rows batched: a wrong backward shows in the first row block; the
    # engine still computes every row once, batched, and then only the rows torch's
    # message prints (and the worst entry's) one element at a time, not all 150
    from agcheck.engine.rows import Problem as _Problem

    monkeypatch.setattr(_DenseVmappable, "scale", scale)
    rows = []
    original = _Problem._element_moves

    def counted(self, pos, start, stop, step):  # the moves of one batched call of rows
        rows.append(stop - start)
        return original(self, pos, start, stop, step)

    monkeypatch.setattr(_Problem, "_element_moves", counted)
    x = make(150, seed=9)
    _DenseVmappable.calls = 0
    assert torch.autograd.gradcheck(_DenseVmappable.apply, (x,), raise_exception=False) is (scale == 1.0)
    torch_calls = _DenseVmappable.calls
    _DenseVmappable.calls = 0
    taken = reference_takes(monkeypatch)
    r = run(_DenseVmappable.apply, (x,))
    assert r.verdict is (scale == 1.0)
    assert sum(rows) == 150  # every row, once
    if scale == 1.0:
        return
    (fallback,) = r.engine_fallbacks
    assert fallback.reason == "Jacobian mismatch"
    assert [(s, e) for s, e, _ in taken[0]] == [(0, 150)]
    (confirmed,) = [e for e in r.engine_log if e.path == "failure"]
    assert confirmed.decision == "confirmed"
    assert confirmed.figures["exact_rows"] <= 7  # torch prints 3 + 3 rows, and the worst one
    assert _DenseVmappable.calls <= torch_calls // 10, (_DenseVmappable.calls, torch_calls)
    assert first_paragraph(agcheck.gradcheck, _DenseVmappable.apply, (x,)) \
        == first_paragraph(agcheck.gradcheck, _DenseVmappable.apply, (x,), engine="reference") \
        == torch_message(_DenseVmappable.apply, (x,))


@pytest.mark.parametrize("scale", [1.0, 1.5])
def test_a_failing_check_reuses_the_rows_looped_where_the_input_was_not_batched(scale, monkeypatch):
    # the rows are computed element by element (the probe is made to find the input
    # unbatchable): on the late mismatch, the reference engine takes them as they are
    from agcheck.engine.rows import Problem as _Problem

    monkeypatch.setattr(_Problem, "_batched_forms", lambda self, pos: [])
    monkeypatch.setattr(_DenseVmappable, "scale", scale)
    monkeypatch.setattr(_DenseVmappable, "wrong_from", 100)  # late rows only
    x = make(150, seed=11)
    _DenseVmappable.calls = 0
    torch_verdict = torch.autograd.gradcheck(_DenseVmappable.apply, (x,), raise_exception=False)
    torch_calls = _DenseVmappable.calls
    _DenseVmappable.calls = 0
    taken = reference_takes(monkeypatch)
    r = run(_DenseVmappable.apply, (x,), raise_exception=False)
    assert r.verdict is torch_verdict is (scale == 1.0)
    assert "looped" in paths(r)
    if scale != 1.0:
        assert [(s, e) for s, e, _ in taken[0]] == [(0, 150)]
        # torch's evaluations, and the engine's few probes besides
        assert _DenseVmappable.calls <= torch_calls + 20, (_DenseVmappable.calls, torch_calls)
        with pytest.raises(RuntimeError) as ours:
            agcheck.gradcheck(_DenseVmappable.apply, (x,))
        with pytest.raises(RuntimeError) as reference:
            agcheck.gradcheck(_DenseVmappable.apply, (x,), engine="reference")
        assert torch_text(ours.value).split("\n\n")[0] == torch_text(reference.value).split("\n\n")[0]


def test_a_failing_check_reuses_the_analytical_columns_computed_one_by_one(monkeypatch):
    # VJPs not batched (as for a check whose VJP loop makes few calls): every column is one
    # VJP, as the reference engine computes it, and checked for reentrancy by the engine's
    # second pass: on the mismatch, the reference engine computes no column again, and its
    # message is the one it gives alone

    monkeypatch.setattr(cost, "BATCHED_VJPS_FROM_CALLS", 1 << 62)
    backward_calls = []
    original_backward = _DenseVmappable.backward

    def counted(ctx, g):
        backward_calls.append(1)
        return original_backward(ctx, g)

    monkeypatch.setattr(_DenseVmappable, "backward", staticmethod(counted))
    monkeypatch.setattr(_DenseVmappable, "scale", 1.5)
    monkeypatch.setattr(_DenseVmappable, "wrong_from", 100)
    x = make(150, seed=12)
    assert not torch.autograd.gradcheck(_DenseVmappable.apply, (x,), raise_exception=False)
    torch_backwards = len(backward_calls)
    backward_calls.clear()
    r = run(_DenseVmappable.apply, (x,), raise_exception=False)
    assert r.verdict is False
    # the engine's first pass and reentrancy pass, and the failure's few printed columns
    # (torch: two passes over all 150 columns)
    assert len(backward_calls) <= torch_backwards + 10, (len(backward_calls), torch_backwards)
    (fallback,) = r.engine_fallbacks
    ranges, rows = fallback.analytical[0]
    assert ranges == [(0, 150)]
    expected = torch.autograd.functional.jacobian(_DenseVmappable.apply, x.detach())
    assert torch.equal(torch.as_tensor(rows[0]), expected)  # rows: output elements
    with pytest.raises(RuntimeError) as ours:
        agcheck.gradcheck(_DenseVmappable.apply, (x,))
    with pytest.raises(RuntimeError) as reference:
        agcheck.gradcheck(_DenseVmappable.apply, (x,), engine="reference")
    with pytest.raises(RuntimeError) as torchs:
        torch.autograd.gradcheck(_DenseVmappable.apply, (x,))
    assert torch_text(ours.value).split("\n\n")[0] == torch_text(reference.value).split("\n\n")[0]
    assert ours.value.report.message.startswith(str(torchs.value))


def test_a_backward_that_is_not_reentrant_is_not_reused(monkeypatch):
    # the engine's reentrancy pass finds the columns differ: nothing analytical is handed
    # over, and the reference engine reports torch's reentrancy failure
    state = {"n": 0}
    original_backward = _DenseVmappable.backward

    def drifting(ctx, g):
        state["n"] += 1
        return original_backward(ctx, g) * (1 + 1e-9 * state["n"])

    monkeypatch.setattr(_DenseVmappable, "backward", staticmethod(drifting))
    x = make(150, seed=13)
    r = run(_DenseVmappable.apply, (x,), raise_exception=False)
    assert r.verdict is False
    assert all(o.analytical is None for o in r.engine_fallbacks)
    with pytest.raises(RuntimeError, match="Backward is not reentrant"):
        agcheck.gradcheck(_DenseVmappable.apply, (x,))
    with pytest.raises(RuntimeError, match="Backward is not reentrant"):
        torch.autograd.gradcheck(_DenseVmappable.apply, (x,))


@pytest.mark.parametrize("vjps_from", [0, 1 << 62])
@pytest.mark.parametrize("factor", [1.0, 1.1])
def test_a_small_check_makes_no_more_backward_calls_than_torchs(vjps_from, factor, monkeypatch):
    # 10 inputs (too few to batch), 20 outputs: whether batched VJPs are tried or not, no
    # VJP is spent on anything but the Jacobian's columns, so the check makes no more
    # backward calls than torch's (torchdiffeq's adjoint checks, whose backward costs 8
    # evaluations, once paid 2 VJPs of 22 to time the loop)

    monkeypatch.setattr(cost, "BATCHED_VJPS_FROM_CALLS", vjps_from)
    monkeypatch.setattr(ScaledSin, "factor", factor)
    w = torch.randn(20, 10, dtype=torch.float64, generator=torch.Generator().manual_seed(12))
    fn = lambda x: ScaledSin.apply(w @ x)  # noqa: E731
    x = make(10, seed=13)
    ScaledSin.calls = 0
    torch_verdict = torch.autograd.gradcheck(fn, (x,), raise_exception=False)
    torch_calls, ScaledSin.calls = ScaledSin.calls, 0
    r = run(fn, (x,))
    assert r.verdict is torch_verdict is (factor == 1.0)
    if factor == 1.0:
        assert ScaledSin.calls <= torch_calls, (ScaledSin.calls, torch_calls)
    if vjps_from:
        assert not [e for e in r.engine_log if e.path == "vjp" and e.decision == "batched"]


@pytest.mark.parametrize("factor", [1.0, 1.1])
def test_a_check_no_input_of_which_can_be_batched_and_whose_vjps_are_cheap_tries_no_batched_vjp(factor, monkeypatch):
    # 7 elements: 14 VJPs, fewer than cost.BATCHED_VJPS_FROM_CALLS; no input can be
    # batched either: the reference engine decides
    monkeypatch.setattr(ScaledSin, "factor", factor)
    from agcheck.backends import torch_backend

    batched = []
    original = torch_backend.TorchTrace.vjp_many
    monkeypatch.setattr(torch_backend.TorchTrace, "vjp_many",
                        lambda self, *a, **kw: batched.append(1) or original(self, *a, **kw))
    fn = lambda t: ScaledSin.apply(t.flip(0) * t.sum())  # noqa: E731
    x = make(7, seed=14)
    # the engine prices the VJP passes from the check's first evaluation: fn warmed, so
    # that a first call's one-time costs in a fresh test worker cannot tip the estimate
    # (this test failed once under xdist, and never alone)
    torch.autograd.grad(fn(x).sum(), x)
    r = run(fn, (x,))
    assert not batched
    assert [o.reason for o in r.engine_fallbacks] == ["no input can be moved in batches"]
    assert r.verdict is torch.autograd.gradcheck(fn, (x,), raise_exception=False) is (factor == 1.0)


@pytest.mark.parametrize("factor", [1.0, 1.01])
def test_the_reentrancy_pass_computes_each_block_as_the_first_pass_did(factor, monkeypatch):
    # the first pass takes its first columns one VJP each (timed), the rest batched; a
    # second pass that batched them all would differ from the first where a batched VJP
    # rounds differently from a plain one (as kornia's homography backward does, by an
    # ulp), which nondet_tol = 0 takes for a backward that is not reentrant: the check
    # went back to the reference engine, at 0.9x torch's time
    from agcheck.backends import torch_backend

    monkeypatch.setattr(cost, "BATCHED_VJPS_FROM_CALLS", 0)
    batched_vjp = torch_backend.TorchTrace.vjp_many

    def rounding_differently(self, k, stacked):
        return [None if g is None else g * (1 + 2.0 ** -52) for g in batched_vjp(self, k, stacked)]

    monkeypatch.setattr(torch_backend.TorchTrace, "vjp_many", rounding_differently)
    monkeypatch.setattr(ScaledSin, "factor", factor)
    w = torch.randn(12, 30, dtype=torch.float64, generator=torch.Generator().manual_seed(15))
    fn = lambda x: ScaledSin.apply(w @ x)  # noqa: E731
    x = make(30, seed=16)
    r = run(fn, (x,), engine="batched")
    assert r.verdict is torch.autograd.gradcheck(fn, (x,), raise_exception=False) is (factor == 1.0)
    if factor == 1.0:
        assert not r.engine_fallbacks


def _raising_at_the_last_step(x, raising=True):
    """``sin(t * t.sum())`` through :class:`ScaledSin`; with ``raising``, it raises where
    the last element of ``x`` alone is stepped up, as a solver raises where a perturbed matrix
    turns singular (xitorch's degenerate eigenvalues). A Python test on the value: vmap
    cannot batch it, so the numerical side loops."""
    edge, others = float(x[-1].detach()) + 0.5e-6, x[:-1].detach().clone()

    def fn(t):
        # only the last element's own step: compressed differences, which move every
        # element at once, do not raise
        if raising and float(t[-1].detach()) > edge and torch.equal(t[:-1].detach(), others):
            raise RuntimeError("singular where the last element steps up")
        return ScaledSin.apply(t * t.sum())

    return fn


@pytest.mark.parametrize("factor", [1.0, 1.01])
@pytest.mark.parametrize("n", [40, 256])
def test_an_evaluation_that_raises_on_the_numerical_side_raises_before_the_analytical_side_is_paid(
        n, factor, monkeypatch):
    # torch's checker computes the numerical side first: where fn raises at a step
    # (xitorch's degenerate eigenvalues make a solve singular), it raises after a few
    # evaluations. agcheck's engine computed both analytical passes first, and took 2-11x
    # torch's time on those checks. Now the numerical side goes first wherever the
    # analytical pattern cannot colour it (n = 40); where it may (n = 256: 65,536
    # entries), the first analytical pass goes first, and its reentrancy pass after the
    # numerical side
    from agcheck.backends import torch_backend
    from agcheck.engine import columns, coloured, cost

    def unbatchable(self, *a, **kw):
        raise RuntimeError("no batched VJPs here")

    assert (n * n >= coloured.MIN_ENTRIES) is (n == 256)
    monkeypatch.setattr(cost, "BATCHED_VJPS_FROM_CALLS", 0)  # the engine's batched path
    # one VJP per column whatever batching this process has paid for: the counts are exact
    monkeypatch.setattr(torch_backend.TorchTrace, "vjp_many", unbatchable)
    monkeypatch.setattr(ScaledSin, "factor", factor)
    passes = []
    reentrancy_pass = columns.reentrancy_pass
    monkeypatch.setattr(columns, "reentrancy_pass", lambda p, k, *a: passes.append(k) or reentrancy_pass(p, k, *a))
    x = make(n, seed=17)
    fn = _raising_at_the_last_step(x)
    moved = x.detach().clone().requires_grad_()
    with pytest.raises(RuntimeError, match="singular where the last element steps up"):
        torch.autograd.gradcheck(fn, (moved,))
    assert not torch.equal(moved, x)  # torch's checker leaves the input at the step that raised
    kept = x.detach().clone()
    calls = ScaledSin.calls
    with pytest.raises(RuntimeError, match="singular where the last element steps up"):
        agcheck.gradcheck(fn, (x,))
    assert torch.equal(x, kept)  # agcheck puts it back
    assert passes == []
    if n == 40:
        assert ScaledSin.calls == calls  # no VJP at all
    else:
        assert n <= ScaledSin.calls - calls < 2 * n  # the first pass's columns only
    # the same function without the raise: the reentrancy pass runs (also before a
    # mismatch is handed on), and the verdicts are torch's
    r = run(_raising_at_the_last_step(x, raising=False), (x,))
    assert passes == [0]
    assert r.verdict is (factor == 1.0)


def test_a_backward_both_wrong_and_not_reentrant_is_reported_as_not_reentrant_first(monkeypatch):
    # torch's checker runs the reentrancy check before it compares the Jacobians; the
    # deferred pass runs before a mismatch is reported, so the first error is the same

    monkeypatch.setattr(cost, "BATCHED_VJPS_FROM_CALLS", 0)
    gen = torch.Generator().manual_seed(18)

    class NoisyAndWrong(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x.sin()

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return g * x.cos() * 1.01 * (1 + 1e-9 * torch.rand(g.shape, generator=gen, dtype=g.dtype))

    fn = lambda t: NoisyAndWrong.apply(t * t.sum())  # noqa: E731
    x = make(40, seed=19)
    with pytest.raises(RuntimeError, match="Backward is not reentrant"):
        torch.autograd.gradcheck(fn, (x,))
    with pytest.raises(agcheck.GradcheckError, match="Backward is not reentrant"):
        agcheck.gradcheck(fn, (x,))


class _TimesSum(torch.autograd.Function):
    """``x * x.sum()`` (no two elements independent, no vmap rule: neither batched form
    moves it), its backward scaled by ``factor``."""

    factor = 1.0

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x.sum()

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return (g * x.sum() + (g * x).sum()) * _TimesSum.factor


class _CosTimesSum(torch.autograd.Function):
    """``cos(x) * x.sum()``, right, its backward calls counted in ``calls``."""

    calls = 0

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.cos() * x.sum()

    @staticmethod
    def backward(ctx, g):
        _CosTimesSum.calls += 1
        (x,) = ctx.saved_tensors
        return -g * x.sin() * x.sum() + (g * x.cos()).sum()


@pytest.mark.parametrize("raise_exception", [False, True])
@pytest.mark.parametrize("factor", [1.0, 1.1])
def test_a_mismatch_stops_before_the_later_outputs_vjps_as_far_as_the_report_allows(factor, raise_exception, monkeypatch):
    # every numerical row first (the input cannot be batched), then the VJPs: where output
    # 0 already differs, torch's checker never computes output 1's; neither does agcheck
    # when no report is built (tad-mctc's degenerate eigensolver checks, two outputs:
    # 0.83x -> 0.97x); a report compares every block, and takes output 1's columns from
    # the engine
    # (with a report, only output 1's reentrancy pass is saved: torch's checker checks an
    # output's reentrancy just before comparing it, and stops at output 0)
    from agcheck.engine import columns, cost

    monkeypatch.setattr(cost, "BATCHED_VJPS_FROM_CALLS", 0)  # the numerical-first path
    monkeypatch.setattr(_TimesSum, "factor", factor)
    reentrancy_checked, original = [], columns.reentrancy_pass

    def spied(p, k, *rest):
        reentrancy_checked.append(k)
        return original(p, k, *rest)

    monkeypatch.setattr(columns, "reentrancy_pass", spied)
    x = make(12, seed=3)

    def fn(t):
        return _TimesSum.apply(t), _CosTimesSum.apply(t)

    passes = factor == 1.0
    assert torch.autograd.gradcheck(fn, (x,), raise_exception=False) is passes
    _CosTimesSum.calls = 0
    if raise_exception and not passes:
        with pytest.raises(agcheck.GradcheckError, match="Jacobian mismatch for output 0 with respect to input 0"):
            agcheck.gradcheck(fn, (x,), engine="batched")
    else:
        assert agcheck.gradcheck(fn, (x,), engine="batched", raise_exception=raise_exception) is passes
    assert (_CosTimesSum.calls == 0) is (not passes and not raise_exception), _CosTimesSum.calls
    assert reentrancy_checked == ([0, 1] if passes else [0])


def test_a_wrong_later_output_fails_when_compared_output_by_output(monkeypatch):

    monkeypatch.setattr(cost, "BATCHED_VJPS_FROM_CALLS", 0)
    x = make(12, seed=3)

    def fn(t):  # output 1's backward 10% off
        return _CosTimesSum.apply(t), _TimesSum.apply(t)

    monkeypatch.setattr(_TimesSum, "factor", 1.1)
    assert torch.autograd.gradcheck(fn, (x,), raise_exception=False) is False
    r = run(fn, (x,), engine="batched", raise_exception=False)
    assert r.verdict is False
    # decided from the engine's rows and both outputs' columns, not handed back on an error
    assert [o.reason for o in r.engine_fallbacks] == ["Jacobian mismatch"]
    assert [e.detail for e in r.engine_log if e.path == "failure"] == ["output 1"]
    monkeypatch.setattr(_TimesSum, "factor", 1.0)
    assert run(fn, (x,), engine="batched", raise_exception=False).verdict is True


@pytest.mark.parametrize("factor", [1.0, 1.1])
@pytest.mark.parametrize("jvp_seconds", [0.0, 0.01], ids=["cheap JVP", "dear JVP"])
def test_a_forward_check_is_planned_from_its_calls_however_dear_a_jvp(jvp_seconds, factor, monkeypatch):
    # forward mode's loop makes two evaluations and one JVP per input element: 18 calls
    # for 6 elements, the same plan whatever a JVP costs

    monkeypatch.setattr(cost, "ENGINE_FROM_CALLS", 18)
    monkeypatch.setattr(SinWithJvp, "factor", factor)
    monkeypatch.setattr(SinWithJvp, "jvp_seconds", jvp_seconds)
    options = dict(check_forward_ad=True, check_backward_ad=False, check_undefined_grad=False)
    for n, decision in ((6, "engine"), (5, "reference")):
        x = make(n, seed=5)
        assert torch.autograd.gradcheck(SinWithJvp.apply, (x,), raise_exception=False, **options) is (factor == 1.0)
        r = run(SinWithJvp.apply, (x,), **options)
        (plan,) = [e for e in r.engine_log if e.path == "plan"]
        assert plan.figures == {"loop_calls": 3 * n, "engine_from_calls": 18} and plan.decision == decision
        assert r.verdict is (factor == 1.0)


def test_an_error_of_the_engines_own_code_fails_agcheck_tests_and_never_a_users_check(monkeypatch):
    # the engine hands what it cannot decide to the reference engine, also on an error of
    # its own, which keeps the verdict right and hides the bug (a KeyError once sent every
    # mismatch in a later output to the loop): agcheck's tests raise it
    import agcheck.checks.jacobian as reference
    from agcheck.engine import batched

    def broken(run, piece):
        raise KeyError(0)

    monkeypatch.setattr(batched, "compare_slow_reverse", broken)
    x = make(8)
    with pytest.raises(KeyError):
        run(torch.sin, (x,), engine="batched")
    monkeypatch.delenv(reference.STRICT_ENGINE)
    r = run(torch.sin, (x,), engine="batched")
    assert r.verdict and [o.reason for o in r.engine_fallbacks] == ["KeyError: 0"]


def test_a_fallback_on_an_error_is_logged_with_its_exception(monkeypatch, caplog):
    # a framework's error in the engine (a missing batching rule, say) is expected and the
    # reference engine then decides; each such fallback is on the agcheck.engine logger at
    # DEBUG level, with its traceback, for sweeps that count them (tests/opinfo_sweep.py
    # --engine-fallbacks)
    from agcheck.engine import batched

    x = make(8)
    with caplog.at_level("DEBUG", logger="agcheck.engine"):
        assert run(torch.sin, (x,), engine="batched").verdict
    assert not caplog.records  # decided by the engine: nothing to log

    def broken(run, piece):
        raise RuntimeError("Batching rule not implemented for aten::something")

    monkeypatch.setattr(batched, "compare_slow_reverse", broken)
    with caplog.at_level("DEBUG", logger="agcheck.engine"):
        r = run(torch.sin, (x,), engine="batched")
    assert r.verdict and [o.reason for o in r.engine_fallbacks] == ["RuntimeError: Batching rule not implemented for aten::something"]
    (record,) = caplog.records
    assert record.name == "agcheck.engine" and record.levelname == "DEBUG"
    assert isinstance(record.exc_info[1], RuntimeError) and "aten::something" in record.getMessage()
