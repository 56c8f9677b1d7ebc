"""What the caller owns is unchanged after any check: passing, failing or interrupted."""
import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import agcheck

from .helpers import ScaledSin, Snapshot, bits, make, property_settings


class Boom(Exception):
    pass


def raise_after(n_calls, exc=Boom):
    calls = {"n": 0}

    def fn(x):
        calls["n"] += 1
        if calls["n"] > n_calls:
            raise exc("interrupted inside fn")
        return x.sin()

    return fn


def count_calls(**kw):
    calls = {"n": 0}

    def fn(x):
        calls["n"] += 1
        return x.sin()

    agcheck.gradcheck(fn, (make(5, 7),), **kw)
    return calls["n"]


@pytest.mark.parametrize("fast_mode", [False, True])
@pytest.mark.parametrize("engine", ["auto", "reference"])
@pytest.mark.parametrize("where", [0.0, 0.1, 0.5, 0.9, 1.0])
def test_inputs_restored_when_fn_raises_mid_perturbation(where, engine, fast_mode, monkeypatch):
    from agcheck.engine import cost

    # "auto" runs the engine, however few calls the loop would make
    monkeypatch.setattr(cost, "ENGINE_FROM_CALLS", 0)
    total = count_calls(engine=engine, fast_mode=fast_mode)
    x = make(5, 7)
    snap = Snapshot([x])
    with pytest.raises(Boom):
        agcheck.gradcheck(raise_after(int(where * (total - 1))), (x,), engine=engine, fast_mode=fast_mode)
    snap.assert_unchanged()


def test_inputs_restored_after_keyboard_interrupt():
    x = make(20)
    snap = Snapshot([x])
    with pytest.raises(KeyboardInterrupt):
        agcheck.gradcheck(raise_after(5, KeyboardInterrupt), (x,), engine="reference")
    snap.assert_unchanged()


@pytest.mark.parametrize("fast_mode", [False, True])
def test_failing_check_leaves_everything_unchanged(fast_mode):
    x = make(6)
    snap = Snapshot([x])
    ScaledSin.factor = 2.0
    try:
        assert agcheck.gradcheck(ScaledSin.apply, (x,), raise_exception=False, fast_mode=fast_mode) is False
    finally:
        ScaledSin.factor = 1.0
    snap.assert_unchanged()


def test_global_rng_untouched_even_by_random_checks():
    x = make(4, 3)
    torch.manual_seed(123)
    np.random.seed(7)
    np_state = np.random.get_state()[1].copy()
    before = torch.get_rng_state()
    assert agcheck.gradcheck(lambda t: t.exp(), (x,), fast_mode=True, check_batched_grad=True,
                             check_forward_ad=True, check_batched_forward_grad=True)
    assert torch.equal(torch.get_rng_state(), before)
    assert np.array_equal(np.random.get_state()[1], np_state)


def test_rng_restored_when_fn_draws_random_numbers():
    x = make(3)
    before = torch.get_rng_state()
    agcheck.gradcheck(lambda t: t * (1 + 0 * torch.rand(())), (x,))
    assert torch.equal(torch.get_rng_state(), before)


def test_grad_does_not_accumulate_even_if_fn_calls_backward():
    x = make(4)
    x.grad = torch.ones(4, dtype=torch.float64)
    held = x.grad

    def fn(t):
        t.sum().backward(retain_graph=True) if t.is_leaf and t.grad is not None else None
        return t * 3

    agcheck.gradcheck(fn, (x,))
    assert x.grad is held and torch.equal(held, torch.ones(4, dtype=torch.float64))


def test_closure_over_module_parameters_is_differentiated():
    lin = torch.nn.Linear(20, 3).double()
    data = torch.randn(5, 20, dtype=torch.float64)
    snap = Snapshot([lin.weight, lin.bias])

    def fn(w, b):  # reads the parameters through the module, not the arguments
        return lin(data).tanh()

    assert agcheck.gradcheck(fn, (lin.weight, lin.bias))
    assert torch.autograd.gradcheck(fn, (lin.weight, lin.bias))
    snap.assert_unchanged()


def test_special_values_restored_bitwise():
    x = torch.tensor([-0.0, 0.0, float("nan"), 1e-310, -1.5], dtype=torch.float64).requires_grad_()
    before = bits(x)
    agcheck.gradcheck(lambda t: t * 2, (x,), raise_exception=False)
    assert torch.equal(bits(x), before)


@property_settings(25)
@given(
    shape=st.lists(st.integers(1, 4), min_size=0, max_size=3),
    complex_input=st.booleans(),
    fast_mode=st.booleans(),
    broken=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_property_inputs_and_state_preserved(shape, complex_input, fast_mode, broken, seed):
    dtype = torch.complex128 if complex_input else torch.float64
    x = make(*shape, dtype=dtype, seed=seed)
    y = make(*shape, dtype=dtype, seed=seed + 1)
    snap = Snapshot([x, y])
    scale = 1.5 if broken else 1.0

    class Mul(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a, b):
            ctx.save_for_backward(a, b)
            return a * b

        @staticmethod
        def backward(ctx, g):
            a, b = ctx.saved_tensors
            return g * b.conj() * scale, g * a.conj()

    got = agcheck.gradcheck(Mul.apply, (x, y), fast_mode=fast_mode, raise_exception=False)
    want = torch.autograd.gradcheck(Mul.apply, (x.detach().clone().requires_grad_(), y.detach().clone().requires_grad_()),
                                    fast_mode=fast_mode, raise_exception=False)
    assert got == want
    snap.assert_unchanged()
