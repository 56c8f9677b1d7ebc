import math

import pytest

import agcheck
from agcheck.options import GradcheckOptions, GradgradcheckOptions


def test_defaults_are_torchs():
    o = GradcheckOptions()
    assert (o.eps, o.atol, o.rtol, o.nondet_tol) == (1e-6, 1e-5, 1e-3, 0.0)
    assert o.raise_exception and o.check_undefined_grad and o.check_backward_ad
    assert not (o.check_grad_dtypes or o.check_batched_grad or o.check_batched_forward_grad
                or o.check_forward_ad or o.fast_mode)
    assert o.masked is None


@pytest.mark.parametrize("kwargs, phrase", [
    (dict(check_forward_ad=False, check_backward_ad=False),
     "Expected at least one of check_forward_ad or check_backward_ad to be True"),
    (dict(check_batched_grad=True, check_backward_ad=False, check_forward_ad=True),
     "Setting check_batched_grad=True requires check_backward_ad to be True"),
    (dict(check_batched_forward_grad=True),
     "Setting check_batched_forward_grad=True requires check_forward_ad to be True"),
])
def test_impossible_combinations_raise_assertion_error(kwargs, phrase):
    with pytest.raises(AssertionError, match=phrase):
        GradcheckOptions(**kwargs)


@pytest.mark.parametrize("kwargs, phrase", [
    (dict(check_fwd_over_rev=False, check_rev_over_rev=False), "at least one of check_fwd_over_rev"),
    (dict(check_rev_over_rev=False, check_fwd_over_rev=True), "check_undefined_grad=True requires"),
    (dict(check_rev_over_rev=False, check_fwd_over_rev=True, check_undefined_grad=False,
          check_batched_grad=True), "check_batched_grad=True requires"),
])
def test_gradgradcheck_combinations(kwargs, phrase):
    with pytest.raises(AssertionError, match=phrase):
        GradgradcheckOptions(**kwargs)


@pytest.mark.parametrize("name, value", [
    ("eps", 0.0), ("eps", -0.0), ("eps", -math.inf), ("eps", math.inf), ("eps", math.nan),
    ("atol", -1.0), ("rtol", -1e-3), ("nondet_tol", -1.0), ("atol", math.nan),
])
def test_bad_numbers_name_the_argument(name, value):
    with pytest.raises(ValueError, match=name):
        GradcheckOptions(**{name: value})


def test_a_negative_eps_is_its_absolute_value():
    assert GradcheckOptions(eps=-1e-6).eps == 1e-6


def test_non_numbers_are_type_errors():
    with pytest.raises(TypeError, match="eps"):
        GradcheckOptions(eps="small")


def test_engine_and_budget_are_validated():
    with pytest.raises(ValueError, match="engine"):
        GradcheckOptions(engine="fastest")
    with pytest.raises(ValueError, match="memory_budget"):
        GradcheckOptions(memory_budget=0)
    assert GradcheckOptions(engine="reference", memory_budget=1 << 20).memory_budget == 1 << 20


@pytest.mark.parametrize("name", ["gradcheck", "gradgradcheck"])
def test_every_torch_keyword_with_torchs_default(name):
    import inspect

    import torch

    import agcheck

    ours = inspect.signature(getattr(agcheck, name)).parameters
    theirs = inspect.signature(getattr(torch.autograd, name)).parameters
    for key, param in theirs.items():
        if key == "func":  # positional: agcheck calls it fn
            continue
        assert key in ours, f"{name} lacks torch's keyword {key}"
        assert ours[key].default == param.default, f"{name}({key}=...) default differs from torch's"


def test_the_same_keywords_give_the_same_validated_options():
    from agcheck.options import gradcheck_options

    a = gradcheck_options(atol=1e-4, fast_mode=True)
    assert a is gradcheck_options(atol=1e-4, fast_mode=True)
    assert a == GradcheckOptions(atol=1e-4, fast_mode=True)
    assert gradcheck_options(atol=1e-4) is not a
    # equal but of another type is validated afresh: True is no byte count, 1 is
    assert gradcheck_options(memory_budget=1).memory_budget == 1
    with pytest.raises(ValueError, match="memory_budget must be a positive number of bytes"):
        gradcheck_options(memory_budget=True)
    with pytest.raises(ValueError, match="eps must be a finite number"):
        gradcheck_options(eps=math.nan)


def test_unhashable_keywords_are_validated_without_the_cache():
    from agcheck.options import gradcheck_options

    with pytest.raises(TypeError, match="atol must be a real number"):
        gradcheck_options(atol=[1e-5])


def test_a_nan_nondet_tol_is_torchs_accept_any_run_to_run_difference(monkeypatch):
    torch = pytest.importorskip("torch")

    from .helpers import NoisySin, ScaledSin

    monkeypatch.setattr(ScaledSin, "factor", 2.0)  # a wrong backward
    x = torch.linspace(0.1, 1, 4, dtype=torch.float64, requires_grad=True)
    cases = [(NoisySin.apply, {}), (NoisySin.apply, {"fast_mode": True}), (torch.sin, {}),
             (lambda v: v.detach() * 2, {}), (ScaledSin.apply, {})]
    verdicts = []
    for fn, kw in cases:
        theirs = torch.autograd.gradcheck(fn, (x,), nondet_tol=math.nan, raise_exception=False, **kw)
        ours = agcheck.gradcheck(fn, (x,), nondet_tol=math.nan, raise_exception=False, **kw)
        assert ours == theirs, (fn, kw)
        verdicts.append(ours)
    assert verdicts[:3] == [True, True, True] and verdicts[4] is False  # a wrong backward still fails
