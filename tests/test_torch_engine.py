"""VJPs through torch's autograd engine called directly (agcheck.backends.torch_engine), and
the one-hot VJP loop of slow mode (TorchTrace.unit_vjps): the gradients of
torch.autograd.grad, bit for bit, and torch's own path wherever the direct call could differ."""
import logging
import warnings

import pytest
import torch

import agcheck
from agcheck.backends import torch_engine
from agcheck.backends.torch_backend import TorchTrace

from .helpers import bits, make

pytestmark = pytest.mark.skipif(not torch_engine.direct_engine_available(),
                                reason="this torch has no direct engine entry point")


def _graph():
    x, w = make(3, 4, seed=1), make(4, seed=2)
    out = (torch.tanh(x @ w) * x.sum(), x.exp().sum(0))
    return out, (x, w)


def _counting_grad(monkeypatch):
    calls = []
    original = torch.autograd.grad

    def counted(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(torch.autograd, "grad", counted)
    return calls


def test_direct_vjps_are_autograd_grads_bit_for_bit(monkeypatch):
    outs, inputs = _graph()
    gen = torch.Generator().manual_seed(7)
    cots = tuple(torch.randn(o.shape, dtype=o.dtype, generator=gen) for o in outs)
    expected = torch.autograd.grad(outs, inputs, cots, retain_graph=True, allow_unused=True)
    calls = _counting_grad(monkeypatch)
    got = torch_engine.vjp(outs, inputs, cots)
    assert calls == []  # the engine was called directly
    assert all(torch.equal(bits(a), bits(b)) for a, b in zip(got, expected))


def test_differentiable_vjps_are_autograd_grads_and_differentiate_again(monkeypatch):
    outs, inputs = _graph()
    gen = torch.Generator().manual_seed(8)
    cots = tuple(torch.randn(o.shape, dtype=o.dtype, generator=gen).requires_grad_() for o in outs)
    expected = torch.autograd.grad(outs, inputs, cots, create_graph=True, allow_unused=True)
    calls = _counting_grad(monkeypatch)
    got = torch_engine.vjp(outs, inputs, cots, create_graph=True)
    assert calls == []
    assert all(g.requires_grad and torch.equal(bits(g.detach()), bits(e.detach())) for g, e in zip(got, expected))
    monkeypatch.undo()
    # the second derivatives (with respect to the inputs and the cotangents) are the same
    w = tuple(torch.randn(g.shape, dtype=g.dtype, generator=gen) for g in got)
    second = torch.autograd.grad(got, inputs + cots, w, retain_graph=True, allow_unused=True)
    second_expected = torch.autograd.grad(expected, inputs + cots, w, allow_unused=True)
    assert all(torch.equal(bits(a), bits(b)) for a, b in zip(second, second_expected))


def test_an_unused_input_gives_none_and_a_freed_graph_is_torchs_error():
    x, unused = make(3, seed=1), make(2, seed=2)
    out = x.sin()
    g = torch_engine.vjp((out,), (x, unused), (torch.ones(3, dtype=x.dtype),), retain_graph=False)
    assert g[1] is None and torch.allclose(g[0], x.detach().cos())
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        torch_engine.vjp((out,), (x,), (torch.ones(3, dtype=x.dtype),))


def test_an_output_without_grad_is_torchs_error():
    x = make(3)
    with pytest.raises(RuntimeError, match="does not require grad"):
        torch_engine.vjp((x.detach() * 2,), (x,), (torch.ones(3, dtype=x.dtype),))


@pytest.mark.parametrize("case", ["shape", "complex", "subclass", "debug-log", "nested"])
def test_what_the_direct_call_cannot_vouch_for_goes_through_autograd_grad(monkeypatch, case):
    x = make(3)
    out, cot = x * 2, torch.ones(3, dtype=x.dtype)
    if case == "shape":
        cot = torch.ones(4, dtype=x.dtype)
    elif case == "complex":
        cot = torch.ones(3, dtype=torch.complex128)
    elif case == "subclass":
        class Tagged(torch.Tensor):
            pass

        cot = cot.as_subclass(Tagged)
    elif case == "nested":  # no single shape to compare a cotangent with
        with warnings.catch_warnings():  # torch: "nested tensors are in prototype stage"
            warnings.simplefilter("ignore", UserWarning)
            x = torch.nested.nested_tensor([torch.ones(2), torch.ones(3)], dtype=torch.float64, requires_grad=True)
            cot = torch.nested.nested_tensor([torch.ones(2), torch.ones(3)], dtype=torch.float64)
        out = x * 2
    logger = logging.getLogger("torch.autograd.graph")
    level = logger.level
    if case == "debug-log":
        logger.setLevel(logging.DEBUG)
    calls = _counting_grad(monkeypatch)
    try:
        if case in ("shape", "complex"):  # torch's own messages
            with pytest.raises(RuntimeError, match="Mismatch in shape" if case == "shape" else "Mismatch in dtype"):
                torch_engine.vjp((out,), (x,), (cot,))
        else:
            (g,) = torch_engine.vjp((out,), (x,), (cot,))
            if case == "nested":
                assert all(torch.equal(t, torch.full_like(t, 2.0)) for t in g.unbind())
            else:
                assert torch.equal(g, torch.full((3,), 2.0, dtype=x.dtype))
    finally:
        logger.setLevel(level)
    assert calls == [1]


def test_one_hot_vjps_are_the_columns_also_when_the_backward_returns_its_cotangent():
    """The loop reuses one cotangent, as torch's checker does: a backward that hands it
    back (clone, view, reshape) must not see its earlier gradients overwritten."""
    x = make(2, 3)
    for fn in (lambda t: t.clone(), lambda t: t.view(3, 2), lambda t: t.reshape(-1) * 1, lambda t: t.t()):
        out = fn(x)
        rows = list(TorchTrace((out,), [x]).unit_vjps(0, range(out.numel()), agcheck.get_backend("torch").one_hot))
        jac = torch.stack([r[0].reshape(-1) for r in rows])
        expected = torch.autograd.functional.jacobian(lambda t: fn(t).reshape(-1), x.detach()).reshape(6, 6)
        assert torch.equal(jac, expected)


class _Passthrough(torch.autograd.Function):
    """Identity whose backward returns grad_output itself (optionally scaled wrongly)."""

    scale = 1.0

    @staticmethod
    def forward(ctx, t):
        return t.clone()

    @staticmethod
    def backward(ctx, g):
        return g if _Passthrough.scale == 1.0 else g * _Passthrough.scale


@pytest.mark.parametrize("scale, passes", [(1.0, True), (1.5, False)])
def test_a_backward_returning_its_cotangent_passes_and_a_wrong_one_fails(monkeypatch, scale, passes):
    monkeypatch.setattr(_Passthrough, "scale", scale)
    x = make(4)
    for engine in ("reference", "auto"):
        if passes:
            assert agcheck.gradcheck(_Passthrough.apply, (x,), engine=engine)
        else:
            with pytest.raises(agcheck.GradcheckError, match="Jacobian mismatch"):
                agcheck.gradcheck(_Passthrough.apply, (x,), engine=engine)


def test_an_entry_point_that_fails_the_known_backward_is_not_used(monkeypatch):
    class Changed:  # an engine whose run_backward takes other arguments
        @staticmethod
        def run_backward(*args):
            raise TypeError("run_backward(): incompatible function arguments")

    monkeypatch.setattr(torch_engine, "_ENGINE", Changed())
    assert torch_engine._direct_call_works() is False
    monkeypatch.undo()
    assert torch_engine._direct_call_works() is True
    with torch.no_grad():  # the probe does not depend on the grad mode it runs under
        assert torch_engine._direct_call_works() is True
    with torch.inference_mode():
        assert torch_engine._direct_call_works() is True
