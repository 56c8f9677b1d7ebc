"""Arguments a check cannot take: the error names the problem, its type is one that
``except`` clauses written for torch's checker catch, and the caller's data is left as it
was. Found by an audit of 289 bad-input cases against torch's checker (2026-11-28)."""
import re

import numpy as np
import pytest
import torch

import agcheck

from .helpers import Cube, Snapshot, Square, first_paragraph, make


@pytest.fixture
def wrong_double_backward():
    Square.factor = 1.1  # Cube's backward is right, its own backward (the second derivative) 10% off
    yield Cube.apply
    Square.factor = 1.0


NOT_ARRAYS = {
    "None": lambda t: None,
    "a float": lambda t: 1.5,
    "a dict": lambda t: {"y": t.sin()},
    "a tuple holding None": lambda t: (t.sin(), None),
}


@pytest.mark.parametrize("given_grad_outputs", [False, True], ids=["random grad_outputs", "given grad_outputs"])
@pytest.mark.parametrize("returns", NOT_ARRAYS)
def test_gradgradcheck_of_a_function_that_returns_no_arrays_raises_as_gradcheck_does(returns, given_grad_outputs):
    fn, x = NOT_ARRAYS[returns], make(4)
    grad_outputs = (make(4, seed=1),) if given_grad_outputs else None
    with pytest.raises(agcheck.OutputTypeError, match="fn must return an array or a tuple of arrays"):
        agcheck.gradcheck(fn, (x,))
    with pytest.raises(agcheck.OutputTypeError, match="fn must return an array or a tuple of arrays"):
        agcheck.gradgradcheck(fn, (x,), grad_outputs)
    with pytest.raises(AttributeError):  # torch's checker: "... has no attribute 'requires_grad'"
        torch.autograd.gradgradcheck(fn, (x,), grad_outputs)


def test_a_wrong_second_derivative_behind_a_dict_no_longer_passes(wrong_double_backward):
    x = make(4)
    with pytest.raises(agcheck.GradcheckError, match="Jacobian mismatch"):
        agcheck.gradgradcheck(wrong_double_backward, (x,))
    # the same function returned in a dict passed (True) before: its outputs were dropped
    with pytest.raises(agcheck.OutputTypeError, match="output 0 is dict"):
        agcheck.gradgradcheck(lambda t: {"y": wrong_double_backward(t)}, (x,))


def test_a_right_second_derivative_passes():
    assert agcheck.gradgradcheck(Cube.apply, (make(4),))


@pytest.mark.parametrize("grad_outputs", [1.0, (None,)], ids=["a float", "None"])
def test_grad_outputs_that_are_not_arrays_are_named(grad_outputs):
    x = make(4)
    with pytest.raises(agcheck.OutputTypeError, match=r"grad_outputs must be arrays.*grad_outputs\[0\] is"):
        agcheck.gradgradcheck(torch.sin, (x,), grad_outputs)
    with pytest.raises(AttributeError):  # torch's checker, on its own terms
        torch.autograd.gradgradcheck(torch.sin, (x,), grad_outputs)


def test_gradgradcheck_of_a_function_that_modifies_its_input_raises_and_restores_it():
    x = make(4)
    snap = Snapshot([x])

    def doubles_its_input(t):
        t.data.mul_(2)  # past autograd's leaf check
        return t * 3

    with pytest.raises(agcheck.CheckInputError, match="fn modified input 0 in place"):
        agcheck.gradgradcheck(doubles_its_input, (x,))
    snap.assert_unchanged()  # torch's checker returns True and leaves x multiplied by 2**17
    assert agcheck.gradgradcheck(lambda t: t * 3, (x,))


@pytest.mark.parametrize("option, phrase", [
    (dict(eps=0), "eps must be greater than zero, but got 0.0"),
    (dict(atol=-1), "atol must be greater than or equal to zero, but got -1"),
    (dict(rtol=-0.5), "rtol must be greater than or equal to zero, but got -0.5"),
    (dict(nondet_tol=-1), "nondet_tol must be greater than or equal to zero"),
])
def test_options_out_of_range_are_named_and_are_runtime_errors_as_under_torch(option, phrase):
    x = make(3)
    with pytest.raises(RuntimeError):  # torch: its own RuntimeError, or a failed check
        torch.autograd.gradcheck(torch.sin, (x,), **option)
    with pytest.raises(agcheck.CheckInputError, match=phrase) as info:
        agcheck.gradcheck(torch.sin, (x,), **option)
    assert isinstance(info.value, ValueError) and isinstance(info.value, RuntimeError)
    assert agcheck.gradcheck(torch.sin, (x,))


@pytest.mark.parametrize("eps, passes", [(-1e-6, True), (-1.0, False)])
def test_a_negative_eps_gives_torchs_verdict_and_numbers(eps, passes):
    x = make(5)
    assert torch.autograd.gradcheck(torch.sin, (x,), eps=eps, raise_exception=False) is passes
    assert agcheck.gradcheck(torch.sin, (x,), eps=eps, raise_exception=False) is passes
    if not passes:  # the same numerical Jacobian in both messages (torch's zeros are -0.0)
        def numerical(message):
            return [float(v) for v in re.findall(r"-?\d+\.\d+", message.split("numerical:")[1].split("analytical:")[0])]

        theirs = numerical(first_paragraph(torch.autograd.gradcheck, torch.sin, (x,), eps=eps))
        ours = numerical(first_paragraph(agcheck.gradcheck, torch.sin, (x,), eps=eps))
        assert len(ours) == 25 and ours == theirs and any(ours)


@pytest.mark.parametrize("option", [dict(eps="1e-6"), dict(atol="0.1"), dict(nondet_tol="0")])
def test_numbers_given_as_strings_are_type_errors_as_under_torch(option):
    x = make(3)
    with pytest.raises(TypeError):
        torch.autograd.gradcheck(torch.sin, (x,), **option)
    with pytest.raises(TypeError, match="must be a real number"):
        agcheck.gradcheck(torch.sin, (x,), **option)


@pytest.mark.parametrize("inputs", [None, (), (1, 2), "abc"], ids=["None", "empty", "ints", "a string"])
def test_inputs_holding_no_array_are_value_errors_as_under_torch(inputs):
    with pytest.raises(ValueError, match="expects at least one input tensor to require gradient"):
        torch.autograd.gradcheck(torch.sin, inputs)
    with pytest.raises(agcheck.BackendInferenceError, match="no input is an array of a known framework") as info:
        agcheck.gradcheck(torch.sin, inputs)
    assert isinstance(info.value, ValueError) and isinstance(info.value, TypeError)


@pytest.mark.parametrize("check", [agcheck.gradcheck, agcheck.gradgradcheck], ids=["gradcheck", "gradgradcheck"])
def test_a_meta_input_is_named(check):
    x = torch.zeros(3, dtype=torch.float64, device="meta", requires_grad=True)
    with pytest.raises(agcheck.CheckInputError, match="input 0 is on the meta device, which holds shapes but no values"):
        check(torch.sin, (x,))
    with pytest.raises(RuntimeError):  # torch's checker: "Tensor.item() cannot be called on meta tensors"
        torch.autograd.gradcheck(torch.sin, (x,))


def test_a_numpy_vjp_that_writes_into_its_input_fails_at_the_write_and_leaves_the_callers_array():
    x = np.linspace(-1.0, 1.0, 4)
    before = x.copy()

    def writes_into_its_input(inputs, cotangents):
        inputs[0][1] = 5.0
        return (np.cos(inputs[0]) * cotangents[0],)

    with pytest.raises(ValueError, match="read-only"):
        agcheck.gradcheck(np.sin, (x,), backend="numpy", vjp=writes_into_its_input)
    np.testing.assert_array_equal(x, before)
    assert x.flags.writeable  # the caller's array itself is not made read-only
    assert agcheck.gradcheck(np.sin, (x,), backend="numpy", vjp=lambda i, c: (np.cos(i[0]) * c[0],))
    with pytest.raises(agcheck.GradcheckError, match="Jacobian mismatch"):
        agcheck.gradcheck(np.sin, (x,), backend="numpy", vjp=lambda i, c: (1.1 * np.cos(i[0]) * c[0],))


def test_a_numpy_jvp_that_writes_into_its_input_fails_at_the_write():
    x = np.linspace(-1.0, 1.0, 4)
    before = x.copy()

    def writes_into_its_input(inputs, tangents):
        inputs[0] *= 2
        return (np.cos(inputs[0]) * tangents[0],)

    with pytest.raises(ValueError, match="read-only"):
        agcheck.gradcheck(np.sin, (x,), backend="numpy", jvp=writes_into_its_input,
                          check_forward_ad=True, check_backward_ad=False)
    np.testing.assert_array_equal(x, before)
    assert agcheck.gradcheck(np.sin, (x,), backend="numpy", jvp=lambda i, t: (np.cos(i[0]) * t[0],),
                             check_forward_ad=True, check_backward_ad=False)


@pytest.mark.parametrize("grad_outputs", [(), []], ids=["()", "[]"])
def test_empty_grad_outputs_are_named_and_type_errors_as_under_torch(grad_outputs):
    x = make(4)
    with pytest.raises(agcheck.GradOutputsError, match="grad_outputs is empty"):
        agcheck.gradgradcheck(torch.sin, (x,), grad_outputs)
    with pytest.raises(TypeError):  # torch's checker calls fn without its inputs
        torch.autograd.gradgradcheck(torch.sin, (x,), grad_outputs)
    assert agcheck.gradgradcheck(torch.sin, (x,), (make(4, seed=1),))


@pytest.mark.parametrize("mode", ["vjp", "jvp"])
def test_a_numpy_derivative_returning_torch_tensors_is_named(mode):
    x = np.linspace(-1.0, 1.0, 4)

    def as_torch(inputs, vectors):
        return (torch.from_numpy(np.cos(inputs[0]) * vectors[0]),)

    def as_numpy(inputs, vectors):
        return (np.cos(inputs[0]) * vectors[0],)

    forward = dict(check_forward_ad=True, check_backward_ad=False) if mode == "jvp" else {}
    what = "vjp's gradient for input 0" if mode == "vjp" else "jvp's tangent for output 0"
    with pytest.raises(TypeError, match=re.escape(what) + r".* is a torch\.Tensor, but .* numpy\.ndarray"):
        agcheck.gradcheck(np.sin, (x,), backend="numpy", **{mode: as_torch}, **forward)
    assert agcheck.gradcheck(np.sin, (x,), backend="numpy", **{mode: as_numpy}, **forward)


@pytest.mark.parametrize("n", [4, 300], ids=["loop", "engine"])
def test_an_output_that_changes_size_between_calls_is_named_as_a_runtime_error(n):
    def shrinking_after(calls):
        count = [0]

        def fn(t):
            count[0] += 1
            return t.sin() * t.sum() if count[0] <= calls else t[1:].sin() * t.sum()
        return fn

    with pytest.raises(agcheck.CheckInputError, match=r"fn's output 0 has shape \(%d,\) .* but had shape \(%d,\) "
                       r"at the check's first call" % (n - 1, n)):
        agcheck.gradcheck(shrinking_after(1), (make(n),))  # the first call alone at full size
    with pytest.raises(RuntimeError):  # torch's checker: "The expanded size of the tensor ... must match"
        torch.autograd.gradcheck(shrinking_after(1), (make(n),))
    assert agcheck.gradcheck(shrinking_after(10 ** 9), (make(n),))
