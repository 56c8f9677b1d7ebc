"""Numerical rows of inputs whose first dimension holds independent samples
(``Problem.samples``): an element and its counterparts in the other samples move in one
call, and each sample's outputs give its own row, bitwise as a call moving the element
alone gives it; a function that mixes samples is found out and moved element by element."""

import pytest
import torch

import agcheck
from agcheck.core import jacobian as jac
from agcheck.engine import cost
from agcheck.engine.rows import Problem
from agcheck.core.run import CheckRun
from agcheck.options import GradcheckOptions
from .helpers import ScaledSin, busy, reference_takes, run_check

B, SIDE = 3, 10


@pytest.fixture(autouse=True)
def _engine_always_runs(monkeypatch):
    monkeypatch.setattr(cost, "ENGINE_FROM_CALLS", 0)


def _weights():
    g = torch.Generator().manual_seed(0)
    return torch.randn(SIDE * SIDE, SIDE * SIDE, dtype=torch.float64, generator=g) / SIDE


W = _weights()


class _NotBatchable(torch.autograd.Function):
    """``tanh(W x_s)`` for each sample ``s``, refusing batched forms (no vmap rule, and a
    first dimension other than B's), so that its input is moved one call at a time;
    ``scale`` breaks the backward."""

    scale = 1.0

    @staticmethod
    def forward(ctx, x):
        if x.shape[0] != B:
            raise ValueError("B samples only")
        y = torch.tanh(x.reshape(B, -1) @ W.T).reshape(x.shape)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        return ((g * (1 - y * y)).reshape(B, -1) @ W).reshape(g.shape) * _NotBatchable.scale


def _x():
    x = torch.randn(B, 1, SIDE, SIDE, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    x.view(-1)[[5, 140]] = -0.0  # moved rows must keep the other elements' bits, signs of zero too
    return x.requires_grad_()


def _problem(fn, x, **options):
    be = agcheck.get_backend("torch")
    run = CheckRun(fn, (x,), be, GradcheckOptions(**options))
    run.checked = [0]
    return run, Problem(run, fn, be.trace(fn, (x,), [0]), (x,), [0])


@pytest.mark.parametrize("stencil, contiguous", [("central", True), ("five-point", True), ("central", False)])
def test_rows_moved_by_samples_are_the_element_by_element_rows_bitwise(stencil, contiguous):
    kernel = W[:3, :9].reshape(3, 1, 3, 3)
    fn = lambda t: torch.tanh(torch.nn.functional.conv2d(t, kernel, padding=1)).sum(1, keepdim=True) \
        * torch.atan2(t, torch.tensor(-1.0, dtype=t.dtype))  # atan2 sees the sign of 0
    # a contiguous input's moved entries are written at once, another's one by one
    x = _x() if contiguous else _x().detach().transpose(2, 3).requires_grad_()
    run, p = _problem(fn, x, stencil=stencil)
    assert p.samples(0) == B
    eps = run.eps_for(x)
    reference = jac.numerical_jacobians(run.be, fn, (x,), 0, p.outputs, eps, run.stencil)[0]
    for begin, end in [(0, x.numel()), (17, 245)]:
        chunks = sorted(p._looped_row_chunks(0, begin, end, eps), key=lambda c: c[0])
        rows = torch.cat([c[2][0] for c in chunks])
        assert [c[0] for c in chunks][0] == begin and torch.equal(rows, reference[begin:end])


def test_entries_an_element_does_not_reach_are_torchs_even_for_an_infinite_output():
    mask = torch.ones(B, 1, SIDE, SIDE, dtype=torch.float64)
    mask[2, 0, 0, 0] = float("inf")  # torch's rows: inf - inf = NaN there, for every element
    fn = lambda t: t.sin() * mask
    x = _x()
    run, p = _problem(fn, x)
    assert p.samples(0) == B
    eps = run.eps_for(x)
    reference = jac.numerical_jacobians(run.be, fn, (x,), 0, p.outputs, eps, run.stencil)[0]
    rows = torch.cat([c[2][0] for c in sorted(p._looped_row_chunks(0, 0, x.numel(), eps), key=lambda c: c[0])])
    assert torch.equal(rows.isnan(), reference.isnan()) and bool(reference.isnan().any())
    assert torch.equal(rows.nan_to_num(), reference.nan_to_num())


@pytest.mark.parametrize("fn, why", [
    (lambda t: t - t.mean(0, keepdim=True), "mixes samples"),
    (lambda t: torch.nn.functional.batch_norm(t, None, None, training=True), "batch statistics"),
    (lambda t: t.reshape(-1)[:50].sin(), "output not led by the samples"),
    (lambda t: t.transpose(0, 1).sin(), "output led by another dimension"),
])
def test_functions_that_mix_or_lose_the_samples_are_not_moved_by_samples(fn, why):
    run, p = _problem(fn, _x())
    assert p.samples(0) is None, why


@pytest.mark.parametrize("weight, calls", [(1.0, 1), (1e-14, 2)])
def test_a_move_that_reaches_another_sample_beyond_rounding_is_found_in_one_call(weight, calls):
    # the first sample's move against the traced outputs: a mix of samples far above
    # rounding needs no unmoved call to be seen; one within rounding of the traced values
    # is still found bitwise against the unmoved call, as before
    fn, count = _calls(lambda t: t.sin() + weight * t.sum(0, keepdim=True))
    run, p = _problem(fn, _x())
    before = count[0]
    assert p.samples(0) is None
    assert count[0] - before == calls


@pytest.mark.parametrize("traced_apart", [False, True])
def test_the_traced_outputs_stand_for_the_unmoved_call_only_where_plain_calls_give_their_bits(traced_apart):
    # B calls where the first sample's move leaves the others bitwise as traced; where the
    # traced call's bits differ from plain calls' (here by a rounding error in the trace
    # only), the unmoved plain call is made as before and the samples are still found
    first = [True]

    def fn(t):
        y = t.sin()
        if first[0] and traced_apart:
            y = y * (1 + 1e-15)
        first[0] = False
        return y

    counted, count = _calls(fn)
    x = _x()
    run, p = _problem(counted, x)
    before = count[0]
    assert p.samples(0) == B
    assert count[0] - before == (B + 1 if traced_apart else B)
    eps = run.eps_for(x)
    chunks = sorted(p._sample_row_chunks(0, [(0, x.numel())], eps), key=lambda c: c[0])
    reference = jac.numerical_jacobians(run.be, fn, (x,), 0, p.outputs, eps, run.stencil)[0]
    assert torch.equal(torch.cat([c[2][0] for c in chunks]), reference)


@pytest.mark.parametrize("mixed", [False, True])
def test_a_square_matrix_is_moved_by_samples_only_where_its_rows_are_samples(mixed):
    # w @ t mixes t's rows, t @ w does not: the probe's first move shows the mix in one
    # call; where the rows are samples, they are moved together. Rows bitwise torch's
    # either way
    w = torch.randn(6, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    fn, count = _calls((lambda t: ScaledSin.apply(w @ t)) if mixed else (lambda t: ScaledSin.apply(t @ w)))
    x = torch.randn(6, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(4)).requires_grad_()
    run, p = _problem(fn, x)
    eps = run.eps_for(x)
    before = count[0]
    chunks = sorted(p._looped_row_chunks(0, 0, 36, eps), key=lambda c: c[0])
    calls = count[0] - before
    reference = jac.numerical_jacobians(run.be, fn, (x,), 0, p.outputs, eps, run.stencil)[0]
    assert torch.equal(torch.cat([c[2][0] for c in chunks]), reference)
    if mixed:
        assert p.samples(0) is None and calls == 1 + 2 * 36
    else:
        # the probe's 6 (its first move leaves the other rows bitwise as traced), then 2
        # per element of a row
        assert p.samples(0) == 6 and calls == 6 + 2 * 6


def _calls(fn):
    count = [0]

    def counted(*a):
        count[0] += 1
        return fn(*a)

    return counted, count


@pytest.mark.parametrize("scale", [1.0, 1.01])
def test_a_check_moved_by_samples_has_the_reference_verdict_in_a_third_of_the_calls(monkeypatch, scale):
    monkeypatch.setattr(_NotBatchable, "scale", scale)
    fn, count = _calls(_NotBatchable.apply)
    r = run_check(fn, (_x(),))
    by_samples = count[0]
    fn_ref, count_ref = _calls(_NotBatchable.apply)
    reference = run_check(fn_ref, (_x(),), engine="reference")
    assert r.verdict is reference.verdict is (scale == 1.0)
    assert any(e.path == "numerical" and e.decision == "by samples" for e in r.engine_log)
    # 2 calls per element of one sample (100), the probe's B (B + 1 at most), a few more for the trace
    # and the batching probes; the reference makes 2 per element of all samples (300)
    assert by_samples < count_ref[0] / 2
    if scale != 1.0:
        with pytest.raises(agcheck.GradcheckError, match="Jacobian mismatch for output 0 with respect to input 0"):
            agcheck.gradcheck(_NotBatchable.apply, (_x(),))


def test_many_samples_of_few_elements_are_not_probed():
    x = torch.randn(400, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(2)).requires_grad_()
    run, p = _problem(lambda t: t.sin() * t.cos(), x)  # the probe's 401 calls would cost more than it saves
    assert p.samples(0) is None


PER_SAMPLE_SECONDS = 2e-4


def _per_sample_cost(x):
    """``ScaledSin`` (``ScaledSin.factor`` breaks the backward) taking ``PER_SAMPLE_SECONDS``
    per entry of its first dimension, stacked copies included: batched rows cost what rows
    one call at a time cost, as float64 CPU convolutions do, so only moving the samples
    together saves calls."""
    busy(PER_SAMPLE_SECONDS * x.shape[0])
    return ScaledSin.apply(x)


def _counted_check(monkeypatch, scale, **options):
    monkeypatch.setattr(ScaledSin, "factor", scale)
    fn, count = _calls(_per_sample_cost)
    x = torch.randn(4, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(3)).requires_grad_()
    r = run_check(fn, (x,), **options)
    return r, count[0]


@pytest.mark.parametrize("scale", [1.0, 1.01])
def test_a_fn_of_samples_takes_under_half_the_calls_of_the_reference(monkeypatch, scale):
    r, calls = _counted_check(monkeypatch, scale)
    _, reference_calls = _counted_check(monkeypatch, scale, engine="reference")
    assert r.verdict is (scale == 1.0) and bool(r.engine_fallbacks) is (scale != 1.0)
    decisions = [(e.decision, e.detail) for e in r.engine_log if e.path == "numerical"]
    assert ("by samples", "") in decisions and ("batched", "") in decisions
    # the reference: 2 calls per element (128); batched: the probe and a few batches,
    # the samples' probe (5), rows finished by samples on a failure (32), and the trace
    assert calls < reference_calls / 2, (calls, reference_calls)


def test_a_failing_check_hands_over_all_rows_moved_by_samples(monkeypatch):
    taken = reference_takes(monkeypatch)
    r, _ = _counted_check(monkeypatch, 1.01)
    assert len(r.engine_fallbacks) == 1
    blocks = taken[0]
    assert blocks[0][0] == 0 and blocks[-1][1] == 64  # the reference engine computes no row
    assert all(a[1] == b[0] for a, b in zip(blocks, blocks[1:]))
    x = torch.randn(4, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(3)).requires_grad_()
    run, p = _problem(_per_sample_cost, x)
    reference = jac.numerical_jacobians(run.be, _per_sample_cost, (x,), 0, p.outputs, run.eps_for(x),
                                        run.stencil)[0]
    assert torch.equal(torch.cat([rows[0] for _, _, rows in blocks]), reference)
    with pytest.raises(agcheck.GradcheckError) as ours:
        agcheck.gradcheck(_per_sample_cost, (x,))
    with pytest.raises(RuntimeError) as torchs:
        torch.autograd.gradcheck(_per_sample_cost, (x,))
    assert ours.value.report.message.startswith(str(torchs.value))


def test_gaps_in_different_samples_are_moved_together_in_one_pass():
    # a failing check's rows are finished gap by gap; a gap in one sample must share its
    # calls with the counterparts in the other samples' gaps, bitwise as element by element
    fn, count = _calls(_NotBatchable.apply)
    x = _x()
    run, p = _problem(fn, x)
    assert p.samples(0) == B
    eps = run.eps_for(x)
    reference = jac.numerical_jacobians(run.be, _NotBatchable.apply, (x,), 0, p.outputs, eps, run.stencil)[0]
    per_sample = x.numel() // B
    spans = [(3, 40), (per_sample + 30, per_sample + 70), (2 * per_sample + 50, 3 * per_sample)]
    before = count[0]
    chunks = sorted(p._sample_row_chunks(0, spans, eps), key=lambda c: c[0])
    positions = set(range(3, 40)) | set(range(30, 70)) | set(range(50, per_sample))  # 97 of 100
    # 2 per position: the unmoved call is the samples' probe's, kept
    assert count[0] - before == 2 * len(positions)
    for begin, end in spans:
        rows = torch.cat([c[2][0] for c in chunks if begin <= c[0] < end])
        assert torch.equal(rows, reference[begin:end])
    assert sum(c[1] - c[0] for c in chunks) == sum(e - b for b, e in spans)


class _LastColumnOff(torch.autograd.Function):
    """``sin`` whose backward is 1% off on the last element of each sample only (with
    ``scale``), so that the first rows match and the mismatch shows in a later block."""

    scale = 1.0

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.sin()

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        d = g * x.cos()
        d[:, -1] *= _LastColumnOff.scale
        return d


def _late_mismatch(x):
    busy(PER_SAMPLE_SECONDS * x.shape[0])
    return _LastColumnOff.apply(x)


@pytest.mark.parametrize("scale", [1.0, 1.01])
def test_rows_moved_together_are_all_kept_when_a_later_block_differs(monkeypatch, scale):
    # the samples' blocks of one pass are computed together; the first that differs ends
    # the pass, and the other samples' blocks must reach the reference engine, not be
    # computed again (once per sample)
    monkeypatch.setattr(_LastColumnOff, "scale", scale)
    fn, count = _calls(_late_mismatch)
    x = torch.randn(4, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(3)).requires_grad_()
    taken = reference_takes(monkeypatch)
    r = run_check(fn, (x,))
    assert r.verdict is (scale == 1.0)
    assert ("numerical", "by samples") in [(e.path, e.decision) for e in r.engine_log]
    # 2 calls per element of one sample (32), the probes and the trace; 2 more per element
    # of each other sample (96) if their blocks were computed twice
    assert count[0] < 32 + 40, count[0]
    if scale != 1.0:
        assert len(r.engine_fallbacks) == 1
        blocks = taken[0]
        covered = sum(stop - start for start, stop, _ in blocks)
        assert covered >= 48  # samples 1 to 3 at least, exactly
        with pytest.raises(agcheck.GradcheckError) as ours:
            agcheck.gradcheck(_late_mismatch, (x,))
        with pytest.raises(RuntimeError) as torchs:
            torch.autograd.gradcheck(_late_mismatch, (x,))
        assert ours.value.report.message.startswith(str(torchs.value))


def _sample_work(fn):
    """``fn`` counting the samples it evaluates (the entries of its input's first
    dimension, stacked or vmapped copies included): the work of a check's calls."""
    work = [0]

    def counted(x):
        work[0] += x.shape[0] if x.dim() else 1
        return fn(x)

    return counted, work


def _heavy_per_sample(x):
    busy(PER_SAMPLE_SECONDS * x.shape[0])
    return torch.tanh(x @ W[:16, :16])


@pytest.mark.parametrize("scale", [1.0, 1.01])
def test_rows_of_samples_that_cost_what_plain_calls_cost_move_by_samples_after_a_batched_chunk(monkeypatch, scale):
    # every batched copy evaluates all 8 samples at the cost of a plain call: after the
    # first batched chunk the rest of the rows move by samples, an eighth of the work
    monkeypatch.setattr(ScaledSin, "factor", scale)
    fn, work = _sample_work(lambda x: ScaledSin.apply(_heavy_per_sample(x)))
    x = torch.randn(8, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(4)).requires_grad_()
    r = run_check(fn, (x,))
    assert r.verdict is (scale == 1.0)
    decisions = [e.decision for e in r.engine_log if e.path == "numerical"]
    assert decisions[:2] == ["batched", "by samples"], decisions
    # batched rows throughout: 128 rows x 2 points x 8 samples (2,048); here the first
    # chunk's 32 rows (512), 16 elements x 2 points x 8 by samples (256), the probes
    assert work[0] < 1200, work[0]
    if scale != 1.0:
        with pytest.raises(agcheck.GradcheckError, match="Jacobian mismatch for output 0 with respect to input 0"):
            agcheck.gradcheck(lambda x: ScaledSin.apply(_heavy_per_sample(x)), (x,))


@pytest.fixture
def one_thread():
    # with intra-op threads on a loaded machine, a batched call's thread spins while its
    # workers wait for a core, and its CPU time grows tenfold: the plan then moves the
    # samples together (exact rows, the same verdict); pytest-xdist's workers run one thread
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("scale", [1.0, 1.01])
def test_rows_of_samples_that_batching_makes_cheap_stay_batched(monkeypatch, scale, one_thread):
    # a small product per sample: a batched copy costs a sliver of a plain call, so the
    # rows stay batched however many samples each copy evaluates
    monkeypatch.setattr(ScaledSin, "factor", scale)
    fn, work = _sample_work(lambda x: ScaledSin.apply(torch.tanh(x @ W[:16, :16])))
    x = torch.randn(8, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(4)).requires_grad_()
    r = run_check(fn, (x,))
    assert r.verdict is (scale == 1.0)
    assert [e.decision for e in r.engine_log if e.path == "numerical"][0] == "batched"
    # batched rows throughout (a failing check stops at the first block that differs):
    # 128 rows x 2 points x 8 samples
    assert scale != 1.0 or work[0] >= 2048, work[0]
