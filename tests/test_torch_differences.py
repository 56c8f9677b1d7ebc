"""What PyTorch's own tests of gradcheck see, closed (issue 13, item 5): exact warning and
note texts, fresh tangents, no warnings from agcheck's batching, and torch's count of
calls into a custom Function's jvp."""
from __future__ import annotations

import re
import warnings

import pytest

torch = pytest.importorskip("torch")

import agcheck  # noqa: E402

TORCH_GRADCHECK = torch.autograd.gradcheck


def _torch_source_sentence(start: str) -> str:
    """A string literal run from the installed torch's gradcheck.py, joined."""
    import inspect
    import torch.autograd.gradcheck  # noqa: F401

    src = inspect.getsource(__import__("sys").modules["torch.autograd.gradcheck"])
    i = src.index(start)
    # the parenthesised implicit concatenation that starts at ``start``
    block = src[src.rindex("(", 0, i):src.index(")", i)]
    return "".join(eval(p) for p in re.findall(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'', block))


def _hooked(x):
    y = x.clone()
    y.register_hook(lambda g: g + 1e-2)  # backward not quite right
    return y


def test_undefined_grad_warning_is_torchs_sentence():
    expected = _torch_source_sentence('"Backwards compatibility: New undefined gradient support checking "')

    def fn(x):
        def hook(g):
            if g is None:
                raise RuntimeError("x is undefined")
        y = x.clone()
        y.register_hook(hook)
        return y

    x = torch.ones(1, dtype=torch.double, requires_grad=True)
    for fast_mode in (False, True):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with pytest.raises(RuntimeError, match="Expected backward function to handle undefined output grads"):
                agcheck.gradcheck(fn, (x,), fast_mode=fast_mode)
        texts = [str(w.message) for w in caught if issubclass(w.category, UserWarning)]
        assert expected in texts


def test_fast_mode_note_is_torchs_text_where_torch_puts_it():
    x = torch.ones(2, 2, dtype=torch.double, requires_grad=True)
    messages = []
    for check in (TORCH_GRADCHECK, agcheck.gradcheck):
        with pytest.raises(RuntimeError) as info:
            check(_hooked, (x,), fast_mode=True)
        messages.append(str(info.value))
    torch_msg, ours = messages
    note_start = torch_msg.index("\nThe above quantities")
    note_end = torch_msg.index("Numerical:\n")
    note = torch_msg[note_start:note_end]
    assert "issues/53876" in note
    assert note in ours
    # after torch's projections and before the slow-mode Jacobians, as in torch
    assert ours.index("analytical:") < ours.index(note) < ours.index("Numerical:\n")
    assert ours.index(note) + len(note) == ours.index("Numerical:\n")


def test_fast_fail_slow_ok_keeps_torchs_first_sentence():
    from agcheck.report.messages import FAST_FAIL_SLOW_OK

    import sys
    torch_text = sys.modules["torch.autograd.gradcheck"].FAST_FAIL_SLOW_OK_MSG
    first = torch_text[: torch_text.index("!") + 1]
    assert FAST_FAIL_SLOW_OK.startswith(first)


@pytest.mark.parametrize("fast_mode", [False, True])
@pytest.mark.parametrize("how,message", [
    ("ok", None),
    ("clone", "jvp is not returning a view"),
    ("not_a_view_of_inp", "jvp is not returning a view of the given grad input"),
    ("not_a_view_of_inp_base", "jvp is not returning a view of the same base as the given grad input"),
])
def test_jvp_gets_fresh_tangents(how, message, fast_mode):
    # a view-returning custom Function whose jvp returns a view of something other than
    # the tangent it was given: torch's view checks must see the tangent torch would pass
    from .test_torch_gradcheck_suite import NarrowView

    def fn(x):
        if how == "not_a_view_of_inp_base":
            x = x.view_as(x)
        return NarrowView.apply(x, how)

    x = torch.rand(4, 4, dtype=torch.double, requires_grad=True)
    if message is None:
        assert agcheck.gradcheck(fn, x, check_forward_ad=True, fast_mode=fast_mode)
        return
    with pytest.raises(RuntimeError) as ours:
        agcheck.gradcheck(fn, x, check_forward_ad=True, fast_mode=fast_mode)
    with pytest.raises(RuntimeError) as theirs:
        TORCH_GRADCHECK(fn, x, check_forward_ad=True, fast_mode=fast_mode)
    assert message in str(theirs.value)
    assert str(ours.value) == str(theirs.value)


def test_cotangents_handed_to_backward_are_not_views():
    seen = []

    class Spy(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            seen.append(g._is_view())
            return 2 * g

    x = torch.rand(3, 4, dtype=torch.double, requires_grad=True)
    for fast_mode in (False, True):
        agcheck.gradcheck(Spy.apply, (x,), fast_mode=fast_mode, check_undefined_grad=False)
    assert seen and not any(seen)


@pytest.mark.parametrize("kw", [{}, {"check_forward_ad": True}, {"check_batched_grad": True},
                                {"check_forward_ad": True, "check_batched_forward_grad": True}])
def test_no_batching_rule_warnings_from_agcheck(kw):
    def fn(x):  # renorm has no batching rule: vmapping it warns
        return torch.renorm(x.view(6, 10), 2, 0, 1.0)

    x = torch.randn(60, dtype=torch.double, requires_grad=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert agcheck.gradcheck(fn, (x,), **kw)
    assert not [w for w in caught if "performance drop" in str(w.message)]


def test_jvp_call_counts_are_torchs():
    calls = [0]

    class UserFn(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, y):
            return x.clone(), y.clone()

        @staticmethod
        def jvp(ctx, x_t, y_t):
            calls[0] += 1
            return x_t, y_t

    def count(check, y_requires_grad, **kw):
        x = torch.rand(1, dtype=torch.double, requires_grad=True)
        y = torch.rand(1, dtype=torch.double, requires_grad=y_requires_grad)
        calls[0] = 0
        check(UserFn.apply, (x, y), check_forward_ad=True, check_backward_ad=False, check_batched_grad=False, **kw)
        return calls[0]

    configs = [(True, dict(check_undefined_grad=False, check_batched_forward_grad=False)),
               (True, dict(check_undefined_grad=True, check_batched_forward_grad=False)),
               (True, dict(check_undefined_grad=True, check_batched_forward_grad=True)),
               (False, dict(check_undefined_grad=True, check_batched_forward_grad=True))]
    for fast_mode in (False, True):
        ours = [count(agcheck.gradcheck, r, fast_mode=fast_mode, **kw) for r, kw in configs]
        assert ours == [2, 6, 12, 5]
        assert ours == [count(TORCH_GRADCHECK, r, fast_mode=fast_mode, **kw) for r, kw in configs]


@pytest.mark.parametrize("slowed", [False, True], ids=["warm first call", "slow first call"])
def test_a_small_forward_check_times_no_jvp_of_its_own(slowed):
    """A forward-mode check of a few calls priced near the loop's limit (here from a first
    call slowed to some 0.5 ms: 8 calls estimated at about 4 ms) spends no JVP on timing
    one: the calls into the custom Function's jvp stay torch's."""
    from .helpers import busy

    calls, first = [0], [True]

    class UserFn(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, y):
            if slowed and first[0]:
                first[0] = False
                busy(0.0005)
            return x.clone(), y.clone()

        @staticmethod
        def jvp(ctx, x_t, y_t):
            calls[0] += 1
            return x_t, y_t

    def count(check):
        calls[0] = 0
        first[0] = True
        x, y = (torch.rand(1, dtype=torch.double, requires_grad=True) for _ in range(2))
        assert check(UserFn.apply, (x, y), check_forward_ad=True, check_backward_ad=False,
                     check_batched_grad=False, check_undefined_grad=False)
        return calls[0]

    assert count(agcheck.gradcheck) == count(TORCH_GRADCHECK) == 2
