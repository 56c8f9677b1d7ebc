"""Bad input gets a clear error that names the problem (issue 7's list, torch backend)."""
import warnings

import numpy as np
import pytest
import torch

import agcheck

from .helpers import Snapshot, make


def test_fn_that_modifies_its_input_in_place_is_named_and_input_restored():
    x = make(4)
    snap = Snapshot([x])

    def fn(t):
        t.data.mul_(2)  # sneaks past autograd's leaf check
        return t * 1

    with pytest.raises(ValueError, match="fn modified input 0 in place"):
        agcheck.gradcheck(fn, (x,))
    snap.assert_unchanged()


def test_huge_slow_check_warns_with_its_size():
    x = make(20_000, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", agcheck.CostWarning)
        with pytest.raises(agcheck.CostWarning, match=r"20,000 input elements x 20,000 output elements.*fast_mode=True"):
            agcheck.gradcheck(lambda t: t.cumsum(0), (x,))


def test_fast_mode_does_not_warn_about_cost():
    x = make(20_000)
    with warnings.catch_warnings():
        warnings.simplefilter("error", agcheck.CostWarning)
        assert agcheck.gradcheck(lambda t: t.sin(), (x,), fast_mode=True)


def test_non_double_input_warns_like_torch():
    x = make(3, dtype=torch.float32)
    with pytest.warns(UserWarning, match="is not a double precision floating point or complex"):
        agcheck.gradcheck(lambda t: t * 2, (x,), raise_exception=False)


def test_no_input_requires_grad_is_torchs_value_error():
    with pytest.raises(ValueError, match="none of them have requires_grad=True"):
        agcheck.gradcheck(lambda t: t * 2, (make(3, requires_grad=False),))


def test_stride_zero_input_is_torchs_runtime_error():
    x = torch.ones(1, dtype=torch.float64).expand(3).requires_grad_()
    with pytest.raises(RuntimeError, match="has a dimension with stride 0"):
        agcheck.gradcheck(lambda t: t * 2, (x,))


def test_sparse_output_is_torchs_value_error():
    x = make(2, 3)
    with pytest.raises(ValueError, match="Sparse output is not supported at gradcheck yet"):
        agcheck.gradcheck(lambda t: (t * 2).to_sparse(), (x,))


def test_output_shape_changing_under_perturbation():
    x = make(5)
    x0 = float(x[0])

    def fn(t):  # one more output element when t[0] moved up
        return t[: 2 if float(t[0]) >= x0 else 1] * 1

    for engine in ("auto", "reference"):
        with pytest.raises(AssertionError, match="Expected `func` to return outputs with the same shape"):
            agcheck.gradcheck(fn, (x,), engine=engine)


def test_empty_and_zero_dim_inputs_work_as_in_torch():
    for x in (make(0, 3), make()):
        assert agcheck.gradcheck(lambda t: t.exp(), (x,), check_forward_ad=True)
        assert agcheck.gradcheck(lambda t: t.exp(), (x,), fast_mode=True)


@pytest.mark.parametrize("factor", [1.0, 1.1], ids=["right backward", "wrong backward"])
def test_an_empty_inputs_numerical_jacobians_call_fn_for_no_element(factor):
    from agcheck.core.jacobian import numerical_jacobians

    from .parity_cases import unary

    ScaledExp = unary("ScaledExp", torch.exp, torch.exp, bwd=lambda g, x: g * x.exp() * factor)
    calls = []

    def fn(x, empty):
        calls.append(1)
        return ScaledExp.apply(x) + empty.sum(), empty * 2

    x, empty = make(3), make(0, 4)
    outputs = fn(x, empty)
    calls.clear()
    rows = numerical_jacobians(agcheck.get_backend("torch"), fn, (x, empty), 1, outputs, 1e-6)
    assert calls == [] and [tuple(r.shape) for r in rows.values()] == [(0, 3), (0, 0)]
    expected = factor == 1.0
    assert torch.autograd.gradcheck(fn, (x, empty), raise_exception=False) is expected
    assert agcheck.gradcheck(fn, (x, empty), engine="reference", raise_exception=False) is expected


def test_two_frameworks_cannot_mix_when_inferred():
    jnp = pytest.importorskip("jax.numpy")
    with pytest.raises(TypeError, match="mix arrays of several frameworks"):
        agcheck.gradcheck(lambda a, b: a, (make(2), jnp.ones(2)))


def test_inputs_of_the_wrong_type():
    with pytest.raises(TypeError, match="could not infer the backend"):
        agcheck.gradcheck(lambda d: d, {"x": 1})
    assert np is not None


def test_nan_in_the_numerical_jacobian_is_named():
    x = torch.tensor([0.0, 1.0, 2.0], dtype=torch.float64, requires_grad=True)

    class SqrtWithFiniteGrad(torch.autograd.Function):  # sqrt's slope at 0 is infinite
        @staticmethod
        def forward(ctx, t):
            return t.sqrt()

        @staticmethod
        def backward(ctx, g):
            return g * 0.5

    with pytest.raises(agcheck.GradcheckError, match="numerical Jacobian contains NaN or Inf"):
        agcheck.gradcheck(SqrtWithFiniteGrad.apply, (x,))


def test_inputs_on_different_devices_are_named():
    a = make(3)
    b = torch.zeros(3, dtype=torch.float64, device="meta", requires_grad=True)
    with pytest.raises(ValueError, match=r"different devices \(input 0 on cpu, input 1 on meta\)"):
        agcheck.gradcheck(lambda p, q: p * 2, (a, b))


def test_a_shape_change_names_the_moved_element_as_torch_does():
    x = make(2, 3)
    x0 = float(x[0, 1])

    def fn(t):
        return t.flatten()[: 2 if float(t[0, 1]) >= x0 else 1] * 1

    with pytest.raises(AssertionError, match=r"perturbed on index \(0, 1\) by 1e-06, but got: shapes \(1,\) and \(2,\)"):
        agcheck.gradcheck(fn, (x,), engine="reference")


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_an_in_place_change_is_seen_to_the_bit_and_a_same_bits_write_is_not(dtype):
    x = torch.tensor([0.0, 1.0, 2.0], dtype=dtype, requires_grad=True)

    def flips_zero_sign(t):
        t.data[0] = -0.0  # equal as a number, not as bits
        return t * 1

    def rewrites_same_bits(t):
        t.data.copy_(t.data.clone())
        return t * 1

    with pytest.raises(ValueError, match="fn modified input 0 in place"):
        agcheck.gradcheck(flips_zero_sign, (x,), atol=1e-2, rtol=1e-2)
    assert not torch.signbit(x[0])  # restored
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # float32's precision warning
        assert agcheck.gradcheck(rewrites_same_bits, (x,), eps=1e-3, atol=1e-2, rtol=1e-2)
