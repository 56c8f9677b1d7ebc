"""A function that writes into a checked input at any of its calls is named (which call,
which input, by how much), the input comes back bitwise, and the mismatch such a run
causes is not blamed on the derivative (agcheck.core.input_guard)."""
import pytest

import agcheck

torch = pytest.importorskip("torch")

MODES = {
    "slow": {},
    "fast": {"fast_mode": True},
    "reference": {"engine": "reference"},
    "forward": {"check_forward_ad": True, "check_backward_ad": False},
}


def scaling_at_call(k, factor=1.5):
    """``sin``, which on its ``k``-th call scales its input in place under no_grad (a
    lazily initialised normalisation, a clamp_ that fires for some moves only)."""
    calls = [0]

    def f(x):
        calls[0] += 1
        if calls[0] == k:
            with torch.no_grad():
                x.mul_(factor)
        return x.sin()

    return f


def _input():
    return torch.linspace(-1, 1, 6, dtype=torch.float64).requires_grad_()


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("k", [1, 2, 3, 5, 9])
def test_a_change_at_any_call_is_named_and_undone(mode, k):
    x = _input()
    before = x.detach().clone()
    calls = [0]

    def count(x):
        calls[0] += 1
        return x.sin()

    assert agcheck.gradcheck(count, (x,), **MODES[mode])  # the well-behaved function passes
    if k > calls[0]:
        pytest.skip(f"{mode} mode calls fn {calls[0]} times")
    with pytest.raises(agcheck.CheckInputError) as info:
        agcheck.gradcheck(scaling_at_call(k), (x,), **MODES[mode])
    message = str(info.value)
    assert message.startswith("fn modified input 0 in place")
    assert ("at its first call" if k == 1 else f"at its call {k} in this check") in message
    assert torch.equal(x.detach(), before)
    assert not isinstance(info.value, agcheck.GradcheckError)


def test_the_message_says_by_how_much():
    x = _input()
    with pytest.raises(agcheck.CheckInputError, match=r"elements changed, by up to 0\.5\b"):
        agcheck.gradcheck(scaling_at_call(3), (x,), engine="reference")


def test_a_change_is_named_with_raise_exception_false_too():
    x = _input()
    before = x.detach().clone()
    with pytest.raises(agcheck.CheckInputError, match="at its call 4"):
        agcheck.gradcheck(scaling_at_call(4), (x,), raise_exception=False)
    assert torch.equal(x.detach(), before)


def test_gradgradcheck_names_a_later_change_and_restores_the_input():
    x = _input()
    before = x.detach().clone()
    calls = [0]

    def f(x):
        calls[0] += 1
        if calls[0] == 4:
            with torch.no_grad():
                x.mul_(1.5)
        return (x ** 3).sin()

    with pytest.raises(agcheck.CheckInputError, match="fn modified input 0 in place at a later call"):
        agcheck.gradgradcheck(f, (x,))
    assert torch.equal(x.detach(), before)
    assert agcheck.gradgradcheck(lambda x: (x ** 3).sin(), (x,))


def test_an_interrupt_propagates_with_the_input_restored():
    x = _input()
    before = x.detach().clone()
    calls = [0]

    def f(x):
        calls[0] += 1
        if calls[0] == 3:
            with torch.no_grad():
                x.mul_(2.0)
        if calls[0] == 5:
            raise KeyboardInterrupt
        return x.sin()

    with pytest.raises(KeyboardInterrupt):
        agcheck.gradcheck(f, (x,), engine="reference")
    assert torch.equal(x.detach(), before)


def test_a_write_past_the_version_counter_is_still_found_at_the_end():
    """``x.data.mul_`` moves no version counter: the comparison at the check's end finds it."""
    x = _input()
    before = x.detach().clone()
    calls = [0]

    def f(v):
        calls[0] += 1
        if calls[0] == 3:
            v.data.mul_(1.5)
        return v.sin()

    with pytest.raises(agcheck.CheckInputError, match="fn modified input 0 in place at a later call"):
        agcheck.gradcheck(f, (x,), engine="reference")
    assert torch.equal(x.detach(), before)
