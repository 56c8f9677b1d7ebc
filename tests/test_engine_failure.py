"""A failing dense check decided from the batched engine's rows (agcheck.engine.failure):
torch's verdict and torch's message, at about the cost of a pass."""
import math

import pytest
import torch

import agcheck
from agcheck.checks.jacobian import BATCHED_ROWS_NOTE

from .helpers import ScaledSin, SinWithJvp, first_paragraph, make, run_check as run, torch_message, torch_text

_gen = torch.Generator().manual_seed(21)
_A, _B, _C = (torch.randn(50, 50, dtype=torch.float64, generator=_gen) / 7 for _ in range(3))


class _TwoByTwo(torch.autograd.Function):
    """``(tanh(A a + B b), sin(C a))``; the gradient of each (output, input) pair listed
    in ``wrong`` is scaled by 1.5."""

    generate_vmap_rule = True
    wrong = ()
    calls = 0

    @staticmethod
    def forward(a, b):
        _TwoByTwo.calls += 1
        return torch.tanh(_A @ a + _B @ b), torch.sin(_C @ a)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[0], output[0])

    @staticmethod
    def backward(ctx, g0, g1):
        a, y0 = ctx.saved_tensors

        def scale(o, i):
            return 1.5 if (o, i) in _TwoByTwo.wrong else 1.0

        d0 = g0 * (1 - y0 * y0)
        d1 = g1 * torch.cos(_C @ a)
        return scale(0, 0) * (_A.T @ d0) + scale(1, 0) * (_C.T @ d1), scale(0, 1) * (_B.T @ d0)


@pytest.fixture(autouse=True)
def _engine_runs(monkeypatch):
    """The engine runs however few calls the loop would make."""
    from agcheck.engine import cost

    monkeypatch.setattr(cost, "ENGINE_FROM_CALLS", 0)


@pytest.fixture
def print_options():
    """Restores torch's print options after the test."""
    saved = torch._tensor_str.get_printoptions()
    yield
    torch.set_printoptions(**saved)


def _failure_events(r):
    return [(e.decision, e.subject, e.detail) for e in r.engine_log if e.path == "failure"]


@pytest.mark.parametrize("wrong, reported", [
    ((), None),
    (((1, 0),), (1, 0)),
    # the engine meets input 0's rows first (output 1 differs there); torch reports the
    # first failing block of output 0
    (((1, 0), (0, 1)), (0, 1)),
])
def test_the_first_failing_block_in_torchs_order_is_reported_with_torchs_message(wrong, reported, monkeypatch):
    monkeypatch.setattr(_TwoByTwo, "wrong", wrong)
    args = (make(50, seed=1), make(50, seed=2))
    r = run(_TwoByTwo.apply, args)
    assert r.verdict is torch.autograd.gradcheck(_TwoByTwo.apply, args, raise_exception=False) is (not wrong)
    if not wrong:
        assert not r.engine_fallbacks and not _failure_events(r)
        return
    assert _failure_events(r) == [("confirmed", reported[1], f"output {reported[0]}")]
    message = first_paragraph(agcheck.gradcheck, _TwoByTwo.apply, args)
    assert message.startswith(f"Jacobian mismatch for output {reported[0]} with respect to input {reported[1]},")
    assert message == torch_message(_TwoByTwo.apply, args)
    assert message == first_paragraph(agcheck.gradcheck, _TwoByTwo.apply, args, engine="reference")
    # the report says which of its numbers are batched
    with pytest.raises(agcheck.GradcheckError) as info:
        agcheck.gradcheck(_TwoByTwo.apply, args)
    assert BATCHED_ROWS_NOTE in info.value.report.notes
    assert BATCHED_ROWS_NOTE[:40] in str(info.value)


def test_a_failure_costs_a_fraction_of_torchs_evaluations(monkeypatch):
    monkeypatch.setattr(_TwoByTwo, "wrong", ((0, 0),))
    args = (make(50, seed=3), make(50, seed=4))
    _TwoByTwo.calls = 0
    assert not torch.autograd.gradcheck(_TwoByTwo.apply, args, raise_exception=False)
    torch_calls, _TwoByTwo.calls = _TwoByTwo.calls, 0
    r = run(_TwoByTwo.apply, args)
    assert r.verdict is False
    # the printed rows (3 + 3) and the worst entry's row, two evaluations each, the
    # engine's probes and batched calls: not torch's 2 x 100
    assert _TwoByTwo.calls <= 40 < torch_calls, (_TwoByTwo.calls, torch_calls)


def test_printing_every_element_makes_every_row_of_the_failing_input_exact(monkeypatch, print_options):
    monkeypatch.setattr(_TwoByTwo, "wrong", ((0, 0),))
    torch.set_printoptions(threshold=math.inf)
    args = (make(50, seed=5), make(50, seed=6))
    r = run(_TwoByTwo.apply, args)
    assert r.verdict is False
    (event,) = [e for e in r.engine_log if e.path == "failure"]
    assert event.figures["exact_rows"] == 50 and event.figures["exact_columns"] == 50
    message = first_paragraph(agcheck.gradcheck, _TwoByTwo.apply, args)
    assert "..." not in message
    assert message == torch_message(_TwoByTwo.apply, args)


@pytest.mark.parametrize("wrong", [(), ((0, 1),)])
def test_batched_rows_alone_never_fail_a_check(wrong, monkeypatch):
    # batched rows made inexact on purpose: they differ from the analytical Jacobian, but
    # the entry computed again as the reference engine computes it does not, so the
    # reference engine decides (and a wrong backward still fails)
    from agcheck.engine.rows import Problem

    original = Problem._difference_rows

    def off(self, *args):
        return {k: rows + 1e-2 for k, rows in original(self, *args).items()}

    monkeypatch.setattr(Problem, "_difference_rows", off)
    monkeypatch.setattr(_TwoByTwo, "wrong", wrong)
    args = (make(50, seed=7), make(50, seed=8))
    r = run(_TwoByTwo.apply, args)
    assert r.verdict is (not wrong)
    if not wrong:
        assert [d for d, _, _ in _failure_events(r)] == ["unconfirmed"]
        assert [o.reason for o in r.engine_fallbacks] == ["Jacobian mismatch"]


_W = torch.randn(300, 300, dtype=torch.float64, generator=_gen) / 17


class _DenseAndElementwise(torch.autograd.Function):
    """``tanh(W a) + sin(b)``: ``a`` reaches every output (too many colours), ``b`` one
    each (coloured); ``a``'s gradient scaled by ``scale``."""

    generate_vmap_rule = True
    scale = 1.0

    @staticmethod
    def forward(a, b):
        return torch.tanh(_W @ a) + torch.sin(b)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[0], inputs[1])

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved_tensors
        y = torch.tanh(_W @ a)
        return _DenseAndElementwise.scale * (_W.T @ (g * (1 - y * y))), g * torch.cos(b)


@pytest.mark.parametrize("scale", [1.0, 1.2])
def test_a_mismatch_in_the_rows_of_an_input_the_colouring_declined(scale, monkeypatch):
    # the coloured path compares a's rows (it cannot colour a) and colours b; on a's
    # mismatch b's rows are computed for the decision too
    monkeypatch.setattr(_DenseAndElementwise, "scale", scale)
    args = (make(300, seed=9), make(300, seed=10))
    r = run(_DenseAndElementwise.apply, args)
    assert any(e.path == "coloured" for e in r.engine_log)
    assert r.verdict is torch.autograd.gradcheck(_DenseAndElementwise.apply, args, raise_exception=False) \
        is (scale == 1.0)
    if scale == 1.0:
        assert not _failure_events(r)
        return
    assert _failure_events(r) == [("confirmed", 0, "output 0")]
    assert first_paragraph(agcheck.gradcheck, _DenseAndElementwise.apply, args) \
        == torch_message(_DenseAndElementwise.apply, args)


def test_the_torch_backend_reads_torchs_print_options(print_options):
    be = agcheck.get_backend("torch")
    assert be.summarized_edge_items(1000) is None and be.summarized_edge_items(1001) == 3
    torch.set_printoptions(threshold=10, edgeitems=2)
    assert be.summarized_edge_items(10) is None and be.summarized_edge_items(11) == 2
    torch.set_printoptions(profile="full")
    assert be.summarized_edge_items(10 ** 9) is None


_W100 = torch.randn(100, 10, dtype=torch.float64, generator=_gen) / 4


@pytest.mark.parametrize("factor", [1.0, 1.1])
def test_a_check_no_input_of_which_can_be_batched_is_decided_from_the_engines_rows(factor, monkeypatch):
    # 10 input elements (too few to batch) and 100 outputs: the engine still takes the
    # analytical side first (its VJPs may batch), loops the rows and keeps them, so a
    # failure is decided from them; every entry is then exact and the report says nothing
    # of batched numbers
    from agcheck.engine import cost

    monkeypatch.setattr(cost, "BATCHED_VJPS_FROM_CALLS", 0)  # however cheap its VJPs
    monkeypatch.setattr(ScaledSin, "factor", factor)
    fn = lambda x: ScaledSin.apply(_W100 @ x)  # noqa: E731
    args = (make(10, seed=11),)
    r = run(fn, args)
    assert [e.decision for e in r.engine_log if e.path == "numerical"] == ["looped"]
    assert r.verdict is torch.autograd.gradcheck(fn, args, raise_exception=False) is (factor == 1.0)
    if factor == 1.0:
        assert not r.engine_fallbacks
        return
    assert _failure_events(r) == [("confirmed", 0, "output 0")]
    with pytest.raises(agcheck.GradcheckError) as info:
        agcheck.gradcheck(fn, args)
    assert BATCHED_ROWS_NOTE not in info.value.report.notes
    assert torch_text(info.value).split("\n\n")[0] == torch_message(fn, args)


# -- forward mode: both sides by rows, so the printed rows decide -------------------------

class _TwoByTwoForward(torch.autograd.Function):
    """``(tanh(A a + B b), sin(C a))`` with a right backward and its own JVP; the JVP of
    each (output, input) pair listed in ``wrong`` is scaled by 1.5."""

    generate_vmap_rule = True
    wrong = ()
    jvps = 0

    @staticmethod
    def forward(a, b):
        return torch.tanh(_A @ a + _B @ b), torch.sin(_C @ a)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[0], output[0])
        ctx.save_for_forward(inputs[0], output[0])

    @staticmethod
    def backward(ctx, g0, g1):
        a, y0 = ctx.saved_tensors
        d0 = g0 * (1 - y0 * y0)
        return _A.T @ d0 + _C.T @ (g1 * torch.cos(_C @ a)), _B.T @ d0

    @staticmethod
    def jvp(ctx, ta, tb):
        _TwoByTwoForward.jvps += 1
        a, y0 = ctx.saved_tensors

        def scale(o, i):
            return 1.5 if (o, i) in _TwoByTwoForward.wrong else 1.0

        d0 = (1 - y0 * y0) * (scale(0, 0) * (_A @ ta) + scale(0, 1) * (_B @ tb))
        return d0, scale(1, 0) * torch.cos(_C @ a) * (_C @ ta)


_FORWARD = dict(check_forward_ad=True, check_backward_ad=False, check_undefined_grad=False,
                check_batched_grad=False)


@pytest.mark.parametrize("wrong, reported", [
    ((), None),
    (((1, 0),), (1, 0)),
    # the engine meets input 0's rows first (output 1 differs there); torch reports the
    # first failing block of output 0
    (((1, 0), (0, 1)), (0, 1)),
])
def test_a_forward_mode_failure_is_decided_from_the_engines_rows_with_torchs_message(wrong, reported, monkeypatch):
    monkeypatch.setattr(_TwoByTwoForward, "wrong", wrong)
    args = (make(50, seed=12), make(50, seed=13))
    r = run(_TwoByTwoForward.apply, args, **_FORWARD)
    assert r.verdict is torch.autograd.gradcheck(_TwoByTwoForward.apply, args, raise_exception=False,
                                                 **_FORWARD) is (not wrong)
    if not wrong:
        assert not r.engine_fallbacks and not _failure_events(r)
        return
    assert _failure_events(r) == [("confirmed", reported[1], f"output {reported[0]}")]
    message = first_paragraph(agcheck.gradcheck, _TwoByTwoForward.apply, args, **_FORWARD)
    assert message.startswith(f"Jacobian computed with forward mode mismatch for output {reported[0]} "
                              f"with respect to input {reported[1]},")
    with pytest.raises(RuntimeError) as info:
        torch.autograd.gradcheck(_TwoByTwoForward.apply, args, **_FORWARD)
    assert message == str(info.value).rstrip("\n")
    assert message == first_paragraph(agcheck.gradcheck, _TwoByTwoForward.apply, args, engine="reference",
                                      **_FORWARD)


def test_a_forward_mode_failure_costs_a_fraction_of_torchs_jvps(monkeypatch):
    monkeypatch.setattr(_TwoByTwoForward, "wrong", ((0, 0),))
    args = (make(50, seed=14), make(50, seed=15))
    _TwoByTwoForward.jvps = 0
    assert not torch.autograd.gradcheck(_TwoByTwoForward.apply, args, raise_exception=False, **_FORWARD)
    torch_jvps, _TwoByTwoForward.jvps = _TwoByTwoForward.jvps, 0
    r = run(_TwoByTwoForward.apply, args, **_FORWARD)
    assert r.verdict is False
    # the printed rows (3 + 3) and the worst entry's, one JVP each, and the batched
    # JVPs (one call per batch): not torch's 100
    assert _TwoByTwoForward.jvps <= 30 < torch_jvps, (_TwoByTwoForward.jvps, torch_jvps)


@pytest.mark.parametrize("wrong", [(), ((0, 1),)])
def test_batched_jvp_rows_alone_never_fail_a_forward_check(wrong, monkeypatch):
    # JVP rows made inexact on purpose: they differ from the numerical Jacobian, but the
    # rows computed again one JVP each do not, so the reference engine decides
    be_type = type(agcheck.get_backend("torch"))
    original = be_type.jvp_rows

    def off(self, *a, **kw):
        return [None if r is None else r + 1e-2 for r in original(self, *a, **kw)]

    monkeypatch.setattr(be_type, "jvp_rows", off)
    monkeypatch.setattr(_TwoByTwoForward, "wrong", wrong)
    args = (make(50, seed=16), make(50, seed=17))
    r = run(_TwoByTwoForward.apply, args, **_FORWARD)
    assert r.verdict is (not wrong)
    if not wrong:
        assert [d for d, _, _ in _failure_events(r)] == ["unconfirmed"]
        assert [o.reason for o in r.engine_fallbacks] == ["Jacobian mismatch"]


# -- complex inputs: rows move an element along both axes, columns are one VJP each -------

_M = torch.randn(40, 40, dtype=torch.complex128, generator=_gen) / 9


def _complex_dense(factor):
    """``exp(M z) * conj(z)`` (complex in, complex out: checked as its real and its
    imaginary part) as a custom Function whose backward is autograd's times ``factor``."""

    def f(z):
        return (_M @ z).exp() * z.conj()

    class ComplexDense(torch.autograd.Function):
        @staticmethod
        def forward(ctx, z):
            ctx.save_for_backward(z)
            return f(z)

        @staticmethod
        def backward(ctx, g):
            (z,) = ctx.saved_tensors
            with torch.enable_grad():
                z_ = z.detach().requires_grad_()
                (gz,) = torch.autograd.grad(f(z_), z_, g)
            return factor * gz

    return ComplexDense.apply


@pytest.mark.parametrize("factor", [1.0, 1.01])
def test_a_failure_with_a_complex_input_is_decided_from_the_engines_rows(factor, monkeypatch):
    from agcheck.engine import cost

    # the input cannot be batched (a custom Function without a vmap rule): the engine's
    # path however cheap the VJPs
    monkeypatch.setattr(cost, "BATCHED_VJPS_FROM_CALLS", 0)
    fn = _complex_dense(factor)
    z = torch.randn(40, dtype=torch.complex128, generator=torch.Generator().manual_seed(18)).requires_grad_()
    r = run(fn, (z,))
    assert r.verdict is torch.autograd.gradcheck(fn, (z,), raise_exception=False) is (factor == 1.0)
    if factor == 1.0:
        assert not r.engine_fallbacks and not _failure_events(r)
        return
    assert ("confirmed", 0, "output 0") in _failure_events(r)
    message = first_paragraph(agcheck.gradcheck, fn, (z,))
    assert message.startswith("While considering the imaginary part of complex outputs only, Jacobian mismatch")
    assert message == torch_message(fn, (z,))
    assert message == first_paragraph(agcheck.gradcheck, fn, (z,), engine="reference")


@pytest.mark.parametrize("in_place", [True, False])
def test_kept_rows_are_written_into_one_array_and_a_gap_is_seen(in_place, monkeypatch):
    from agcheck.core.numerical_rows import InputRows

    be = agcheck.get_backend("torch")
    if not in_place:  # a backend whose arrays are immutable: the rows are written into NumPy
        monkeypatch.setattr(type(be), "row_block", lambda self, *a: None)
    rows = torch.arange(12, dtype=torch.float64).reshape(6, 2)
    kept = InputRows(be, 6)
    kept.add(0, 4, {0: rows[:4]}, exact=False)
    assert kept.numpy() is None  # not all kept yet
    kept.add(4, 6, {0: rows[4:]}, exact=False)
    assert (kept.numpy()[0] == rows.numpy()).all()
    assert torch.equal(kept.rows(1, 3)[0], rows[1:3])  # arrays of the rows' framework
    gap = InputRows(be, 6)
    gap.add(0, 2, {0: rows[:2]}, exact=False)
    gap.add(4, 6, {0: rows[4:]}, exact=False)  # rows 2:4 missing
    assert gap.numpy() is None and not gap.complete()
    gap.add(0, 3, {0: rows[:3]}, exact=False)  # computed again from the start
    gap.add(3, 4, {0: rows[3:4]}, exact=True)
    assert (gap.numpy()[0] == rows.numpy()).all() and gap.bounds == [(0, 3), (3, 4)]


class _LoopedForward(torch.autograd.Function):
    """``tanh(W x)`` with its own JVP (scaled by ``factor``) and no vmap rule: no batched
    form of fn, so every numerical row is computed element by element, in one block."""

    factor = 1.0

    @staticmethod
    def forward(ctx, x):
        y = torch.tanh(_A @ x)
        ctx.save_for_forward(y)
        return y

    @staticmethod
    def backward(ctx, g):
        raise NotImplementedError  # a forward-mode check only

    @staticmethod
    def jvp(ctx, t):
        (y,) = ctx.saved_tensors
        return _LoopedForward.factor * (1 - y * y) * (_A @ t)


@pytest.mark.parametrize("factor", [1.0, 1.01])
def test_rows_computed_in_one_block_are_compared_in_jvp_blocks_within_the_budget(factor, monkeypatch):
    # a JVP of all 50 rows at once would hold every tangent and its intermediates; the
    # budget here allows about 16 rows per batched JVP
    monkeypatch.setattr(_LoopedForward, "factor", factor)
    be_type = type(agcheck.get_backend("torch"))
    sizes, original = [], be_type.jvp_rows
    monkeypatch.setattr(be_type, "jvp_rows", lambda self, fn, args, checked, j, flat:
                        (sizes.append(len(flat)), original(self, fn, args, checked, j, flat))[1])
    x = make(50, seed=18)
    r = run(_LoopedForward.apply, (x,), engine="batched", memory_budget=1 << 20, **_FORWARD)
    assert ("numerical", "looped") in {(e.path, e.decision) for e in r.engine_log}
    assert sizes and 1 < max(sizes) < 50, sizes
    assert r.verdict is (factor == 1.0)
    if factor != 1.0:
        with pytest.raises(RuntimeError) as info:
            torch.autograd.gradcheck(_LoopedForward.apply, (x,), **_FORWARD)
        assert first_paragraph(agcheck.gradcheck, _LoopedForward.apply, (x,), engine="batched",
                               memory_budget=1 << 20, **_FORWARD) == str(info.value).rstrip("\n")


@pytest.mark.parametrize("forward", [False, True], ids=["reverse", "forward"])
def test_a_silent_fast_mode_failure_recomputes_no_slow_jacobians(forward):
    # torch's message for a fast-mode failure recomputes both Jacobians element by
    # element; with raise_exception=False nobody sees it, and agcheck does not build it
    wrong = SinWithJvp if forward else ScaledSin
    mode = dict(check_forward_ad=True, check_backward_ad=False, check_undefined_grad=False) if forward else {}
    calls = [0]

    def fn(t):
        calls[0] += 1
        return wrong.apply(t)

    x = make(40)
    try:
        wrong.factor = 1.1
        calls[0] = 0
        assert agcheck.gradcheck(fn, (x,), fast_mode=True, raise_exception=False, **mode) is False
        silent = calls[0]
        calls[0] = 0
        with pytest.raises(agcheck.GradcheckError, match="we recompute numerical and analytical jacobians in slow mode"):
            agcheck.gradcheck(fn, (x,), fast_mode=True, **mode)
        assert silent < 10 <= 2 * 40 <= calls[0]  # the message's numerical Jacobian moved every element
        wrong.factor = 1.0
        assert agcheck.gradcheck(fn, (x,), fast_mode=True, raise_exception=False, **mode) is True
    finally:
        wrong.factor = 1.0
