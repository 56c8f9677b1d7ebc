"""Backward passes batched by ``torch.func.vmap`` where torch's older batching cannot.

``torch.autograd.grad(..., is_grads_batched=True)`` batches a backward through torch's
first vmap, which has no batching rule for ``einsum`` (among others); ``torch.func.vmap``
runs the same backward over stacked cotangents. The engine's VJPs take that route where
the first one raises, and gradgradcheck's cotangents are moved in batches by one plain
forward and one vmapped backward, where ``fn`` itself cannot be vmapped (a custom Function
without ``setup_context``). tad-dftd3's C6 model is such a function: its checks looped
over every VJP and every cotangent element.
"""
import pytest
import torch

import agcheck
from agcheck.gradgradcheck import _vjp_problem

from .helpers import Cube, Square, make, run_check as run


class EinsumProduct(torch.autograd.Function):
    """``a @ b`` (real or complex) without a vmap rule (no ``setup_context``), its
    backward's products by ``torch.einsum``, with the conjugates torch's convention asks
    for complex inputs. ``factor`` scales the gradient of ``a`` (1.0 is correct);
    ``detached`` leaves ``b`` out of that gradient's graph, so that its own derivative (a
    second derivative of ``a @ b``) misses a term. Backward calls are counted."""

    factor = 1.0
    detached = False
    calls = 0

    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return a @ b

    @staticmethod
    def backward(ctx, g):
        EinsumProduct.calls += 1
        a, b = ctx.saved_tensors
        b_in_grad_a = b.detach() if EinsumProduct.detached else b
        return (torch.einsum("ik,jk->ij", g, b_in_grad_a.conj()) * EinsumProduct.factor,
                torch.einsum("ij,ik->jk", a.conj(), g))


def product_tanh(a, b):
    return torch.tanh(EinsumProduct.apply(a, b))


@pytest.fixture(autouse=True)
def _batching_pays(monkeypatch):
    """Batched VJPs (and vmapped VJP functions), however small the check."""
    from agcheck.backends import torch_batched
    from agcheck.engine import cost

    monkeypatch.setattr(cost, "BATCHED_VJPS_FROM_CALLS", 0)
    monkeypatch.setattr(torch_batched, "VMAPPED_VJP_FROM_ELEMENTS", 0)
    monkeypatch.setattr(torch_batched, "VMAPPED_COTANGENTS_FROM_ELEMENTS", 0)


def test_is_grads_batched_has_no_rule_for_einsum():
    # the premise of the tests below, as torch 2.13 has it
    a, b = make(4, 4), make(4, 4, seed=1)
    y = product_tanh(a, b)
    with pytest.raises(RuntimeError, match="einsum"):
        torch.autograd.grad(y, (a, b), torch.ones(2, *y.shape, dtype=y.dtype), is_grads_batched=True)


@pytest.mark.parametrize("factor", [1.0, 1.01])
def test_vjps_batch_through_torch_func_where_is_grads_batched_lacks_a_rule(factor, monkeypatch):
    monkeypatch.setattr(EinsumProduct, "factor", factor)
    a, b = make(16, 16), make(16, 16, seed=1)
    EinsumProduct.calls = 0
    r = run(product_tanh, (a, b), engine="batched")
    calls = EinsumProduct.calls
    assert r.verdict is torch.autograd.gradcheck(product_tanh, (a, b), raise_exception=False) is (factor == 1.0)
    vjp_events = [e for e in r.engine_log if e.path == "vjp"]
    assert not [e for e in vjp_events if "failed" in e.detail]
    if factor == 1.0:
        # 256 output elements, two passes: one backward per column would be 512 calls
        assert calls < 256


def test_batched_vjps_through_torch_func_give_the_looped_columns():
    # the engine's batched VJPs (by torch.func, is_grads_batched having raised) against
    # one VJP per column
    from agcheck.backends.torch_backend import TorchTrace

    a, b = make(5, 3), make(3, 4, seed=1)
    y = product_tanh(a, b)
    trace = TorchTrace((y,), (a, b))
    stacked = torch.eye(y.numel(), dtype=y.dtype).reshape(y.numel(), *y.shape)
    EinsumProduct.calls = 0
    batched = trace.vjp_many(0, stacked)
    assert EinsumProduct.calls == 2  # is_grads_batched's attempt, then torch.func's one pass
    looped = [torch.stack(cols) for cols in zip(*(torch.autograd.grad(y, (a, b), c, retain_graph=True)
                                                   for c in stacked))]
    for got, expected in zip(batched, looped):
        assert torch.allclose(got, expected, rtol=1e-12, atol=1e-14)
    EinsumProduct.calls = 0
    trace.vjp_many(0, stacked)
    assert EinsumProduct.calls == 1  # straight to torch.func once is_grads_batched has raised


def _gradgrad_run(fn, args, **options):
    be = agcheck.get_backend("torch")
    vjp_fn, vjp_args = _vjp_problem(be, fn, args, None, False, 0)
    return run(vjp_fn, vjp_args, **options), vjp_fn, vjp_args


@pytest.mark.parametrize("detached", [False, True])
def test_gradgradcheck_moves_the_cotangents_in_batches_where_fn_cannot_be_vmapped(detached, monkeypatch):
    monkeypatch.setattr(EinsumProduct, "detached", detached)
    a, b = make(6, 5), make(5, 6, seed=1)
    r, vjp_fn, vjp_args = _gradgrad_run(product_tanh, (a, b), engine="batched")
    numerical = {e.subject: e for e in r.engine_log if e.path == "numerical"}
    # fn's forward cannot run under torch.func (no setup_context): a and b loop ...
    assert numerical[0].decision == numerical[1].decision == "looped"
    # ... while the cotangent of its output moves in batches around one plain forward
    assert numerical[2].decision == "batched" and numerical[2].via == "vmap"
    assert r.verdict is (not detached)
    assert torch.autograd.gradgradcheck(product_tanh, (a, b), raise_exception=False) is (not detached)
    assert agcheck.gradgradcheck(product_tanh, (a, b), raise_exception=False) is (not detached)


def test_the_cotangents_batched_evaluation_equals_plain_evaluations():
    be = agcheck.get_backend("torch")
    a, b = make(4, 3), make(3, 5, seed=1)
    vjp_fn, args = _vjp_problem(be, product_tanh, (a, b), None, False, 0)
    v = args[2].detach()
    moves = torch.stack([v + 0.5, v - 0.25, v * 3])
    batched = be.evaluate_batch(vjp_fn, args, 2, moves)
    for i, move in enumerate(moves):
        plain = vjp_fn(a, b, move.clone().requires_grad_())
        for got, expected in zip(batched, plain):
            assert torch.equal(got[i], expected.detach())


class ReadsItsCotangent(torch.autograd.Function):
    """``exp``, whose backward reads a value of its cotangent: no vmap can batch it."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.exp()

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * x.exp() * (1.0 if float(g.abs().sum()) >= 0 else 0.0)


def test_vjps_keep_the_batching_that_worked_for_an_output_when_another_output_cannot_batch(monkeypatch):
    # xitorch's eigen-decompositions: is_grads_batched batches the eigenvalues' backward
    # and raises in the eigenvectors'. Had the eigenvectors' failure sent every later
    # batch to torch.func, the reentrancy pass would have computed the eigenvalues'
    # columns otherwise than the first pass did (their batched VJPs then raised there,
    # and the check went back to the reference engine: 10 calls of fn became 202)
    from agcheck.backends import torch_trace

    used = []
    legacy = torch_trace.TorchTrace.vjp_batched
    monkeypatch.setattr(torch_trace.TorchTrace, "vjp_batched",
                        lambda self, *a: used.append("is_grads_batched") or legacy(self, *a))
    vmapped = torch_trace._vmapped_vjps
    monkeypatch.setattr(torch_trace, "_vmapped_vjps", lambda *a, **kw: used.append("torch.func") or vmapped(*a, **kw))
    x = make(6)
    y0, y1 = torch.tanh(2 * x), ReadsItsCotangent.apply(x)
    trace = torch_trace.TorchTrace((y0, y1), (x,))
    stacked = torch.eye(6, dtype=x.dtype)
    first = trace.vjp_many(0, stacked)
    with pytest.raises(RuntimeError):
        trace.vjp_many(1, stacked)
    assert used == ["is_grads_batched", "is_grads_batched"]  # not retried by torch.func
    used.clear()
    again = trace.vjp_many(0, stacked)
    assert used == ["is_grads_batched"] and torch.equal(first[0], again[0])
    # where is_grads_batched raises at once, torch.func batches every later call
    a, b = make(3, 3), make(3, 3, seed=1)
    y = product_tanh(a, b)
    trace = torch_trace.TorchTrace((y,), (a, b))
    ones = torch.eye(9, dtype=y.dtype).reshape(9, 3, 3)
    used.clear()
    trace.vjp_many(0, ones)
    trace.vjp_many(0, ones)
    assert used == ["is_grads_batched", "torch.func", "torch.func"]


@pytest.mark.parametrize("factor", [1.0, 1.01])
def test_complex_outputs_cotangents_move_in_batches_too(factor, monkeypatch):
    # complex outputs are checked in two passes (imaginary, then real parts), each over
    # the VJP function behind a part-taking wrapper: the backend sees through it, so the
    # cotangent moves in batches (not stacked, which cannot fit a VJP's arguments)
    monkeypatch.setattr(EinsumProduct, "factor", factor)
    fn = lambda a, b: torch.tanh(EinsumProduct.apply(a, b))  # noqa: E731
    a = make(6, 5, dtype=torch.complex128)
    b = make(5, 6, seed=1, dtype=torch.complex128)
    r, _, _ = _gradgrad_run(fn, (a, b), engine="batched")
    cotangent = [e for e in r.engine_log if e.path == "numerical" and e.subject == 2]
    assert cotangent and all(e.decision == "batched" and e.via == "vmap" for e in cotangent)
    # stacked copies are refused before any call (without the wrapper seen through, fn ran
    # on them and its backward raised on the cotangents' shapes)
    assert not [e for e in r.engine_log if "stacked: raised RuntimeError" in e.detail]
    assert r.verdict is (factor == 1.0)
    assert torch.autograd.gradgradcheck(fn, (a, b), raise_exception=False) is (factor == 1.0)
    assert agcheck.gradgradcheck(fn, (a, b), raise_exception=False) is (factor == 1.0)


class CountedProduct(EinsumProduct):
    """:class:`EinsumProduct` whose forward calls are counted."""

    forwards = 0

    @staticmethod
    def forward(ctx, a, b):
        CountedProduct.forwards += 1
        return EinsumProduct.forward(ctx, a, b)


@pytest.mark.parametrize("detached", [False, True])
def test_batched_cotangent_moves_take_the_kept_forward(detached, monkeypatch):
    # the cotangents' batches run on fn's forward at the unmoved inputs, kept since the
    # check's first evaluation: no forward of their own (xitorch's small gradgradchecks
    # paid one call of fn more than before for a probe whose backward then raised)
    from agcheck.backends import torch_forward_memo

    monkeypatch.setattr(EinsumProduct, "detached", detached)
    # the memo's digest rule is timed: a loaded machine could close it (its own tests)
    monkeypatch.setattr(torch_forward_memo, "DIGEST_SHARE_LIMIT", float("inf"))
    monkeypatch.setattr(torch_forward_memo, "DIGEST_NEVER_PAYS", float("inf"))
    fn = lambda a, b: torch.tanh(CountedProduct.apply(a, b))  # noqa: E731
    a, b = make(6, 5), make(5, 6, seed=1)
    be = agcheck.get_backend("torch")
    vjp_fn, args = _vjp_problem(be, fn, (a, b), None, False, 0)
    vjp_fn(*args)  # the check's first evaluation: on the forward the cotangents were drawn from
    v = args[2].detach()
    CountedProduct.forwards = 0
    batched = be.evaluate_batch(vjp_fn, args, 2, torch.stack([v + 0.5, v - 0.25]))
    assert CountedProduct.forwards == 0
    plain = vjp_fn(a, b, (v + 0.5).requires_grad_())  # a repeated backward: checked against a fresh one
    assert CountedProduct.forwards == 1 and vjp_fn.forward.validated
    assert all(torch.equal(g[0], p.detach()) for g, p in zip(batched, plain))
    # the inputs moved: a forward of its own, kept for the next batch
    moved = (a + 1).detach().requires_grad_()
    be.evaluate_batch(vjp_fn, (moved, b, args[2]), 2, torch.stack([v, v]))
    be.evaluate_batch(vjp_fn, (moved, b, args[2]), 2, torch.stack([v, v]))
    assert CountedProduct.forwards == 2
    r, _, _ = _gradgrad_run(fn, (a, b), engine="batched")
    assert r.verdict is (not detached)


@pytest.mark.parametrize("factor", [1.0, 1.01])
def test_complex_outputs_vjp_primals_stack_with_their_cotangents_tiled(factor, monkeypatch):
    # a batch of samples and no vmap rule (Cube): copies of the primal laid end to end
    # fit the VJP function with the cotangent, which shares the batch, repeated beside
    # them; tried for complex outputs (both passes), not for real ones, where they are
    # left out without a call (the engine log says why)
    from agcheck.backends import torch_backend

    monkeypatch.setattr(Square, "factor", factor)
    stacked_calls = []
    original = torch_backend.TorchBackend.evaluate_stacked

    def counted(self, fn, args, position, stacked, tiled=()):
        stacked_calls.append(stacked.dtype)
        return original(self, fn, args, position, stacked, tiled)

    monkeypatch.setattr(torch_backend.TorchBackend, "evaluate_stacked", counted)
    forms, details = {}, {}
    for dtype in (torch.complex128, torch.float64):
        r, _, _ = _gradgrad_run(Cube.apply, (make(4, 5, dtype=dtype),), engine="batched")
        forms[dtype] = {(e.decision, e.via, e.figures.get("tiled")) for e in r.engine_log
                        if e.path == "numerical" and e.subject == 0}
        details[dtype] = " ".join(e.detail for e in r.engine_log if e.path == "numerical" and e.subject == 0)
        assert r.verdict is (factor == 1.0)
        assert torch.autograd.gradgradcheck(Cube.apply, (make(4, 5, dtype=dtype),), raise_exception=False) is \
            (factor == 1.0)
    assert ("batched", "stacked", 1) in forms[torch.complex128]
    assert not any(via == "stacked" for _, via, _ in forms[torch.float64])
    assert torch.float64 not in stacked_calls and torch.complex128 in stacked_calls
    assert "stacked with 1 tiled: a VJP of real outputs is not stacked" in details[torch.float64]


def test_an_op_without_a_batching_rule_prints_no_warning_of_agchecks_making():
    """functorch prints "There is a performance drop because we have not yet implemented
    the batching rule" from C++ for an op without a vmap rule, past Python's filters:
    agcheck's own vmapped calls must not make it (torch's checker never does), and a
    vmap of the user's own afterwards still prints it (the switch is back on)."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent("""
        import sys, torch, agcheck

        @torch.library.custom_op("agcheck_test::mysin", mutates_args=())
        def mysin(x: torch.Tensor) -> torch.Tensor:
            return x.sin()

        @torch.library.custom_op("agcheck_test::mycos", mutates_args=())
        def mycos(x: torch.Tensor) -> torch.Tensor:
            return x.cos()

        def setup(ctx, inputs, output):
            ctx.save_for_backward(inputs[0])

        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return g * mycos(x)

        mysin.register_autograd(backward, setup_context=setup)
        x = torch.randn(40, dtype=torch.float64, requires_grad=True)
        assert agcheck.gradcheck(mysin, (x,), engine="batched", check_batched_grad=True)
        sys.stderr.write("== the user's own vmap\\n")
        sys.stderr.flush()
        torch.func.vmap(mysin)(torch.randn(3, 4, dtype=torch.float64))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    ours, _, users = done.stderr.partition("== the user's own vmap")
    assert "performance drop" not in ours
    assert "performance drop" in users
