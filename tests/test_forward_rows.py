"""The reference engine's forward-mode rows (``Backend.jvp_elements``) and fast mode's
projections (``Backend.jvp_each``): the torch backend makes the dual inputs once and writes
each element's one (each input's probe vector) into its input's tangent, as torch's checker
does, where the generic form makes new duals for every element (input). The results are
the same, the verdicts torch's, and nothing of the dual level outlives the loop."""
import pytest
import torch
import torch.autograd.forward_ad as fwAD

import agcheck
from agcheck.backends.base import Backend
from agcheck.core.jacobian import analytical_jacobians_forward, analytical_jvps, analytical_rows_forward

from .helpers import make
from .parity_cases import Sin, unary

BE = agcheck.get_backend("torch")


#: parity_cases.Sin with its jvp 5% too large
_WrongJvpSin = unary("WrongJvpSin", torch.sin, torch.cos, jvp=lambda t, x: t * x.cos() * 1.05)


def _generic_rows(fn, args, checked, i, elements):
    received = []
    Backend.jvp_elements(BE, fn, args, checked, [(i, elements)], lambda _, result: received.append(result))
    return received


def _shared_rows(fn, args, checked, i, elements):
    received = []
    BE.jvp_elements(fn, args, checked, [(i, elements)], lambda _, result: received.append(result))
    return received


@pytest.fixture
def made(monkeypatch):
    """One entry per ``make_dual`` call while the test runs."""
    calls = []
    original = fwAD.make_dual
    monkeypatch.setattr(fwAD, "make_dual", lambda *a, **k: (calls.append(1), original(*a, **k))[1])
    return calls


def _same(a, b):
    assert len(a) == len(b)
    for row_a, row_b in zip(a, b):
        assert len(row_a) == len(row_b)
        for (pa, ta), (pb, tb) in zip(row_a, row_b):
            assert torch.equal(pa, pb)
            assert (ta is None) == (tb is None)
            if ta is not None:
                assert torch.equal(ta, tb)


CASES = {
    "one input": (lambda x: (x.sin() * x.sum(),), lambda: (make(3, 4),), [0], 0),
    "second of two": (lambda x, y: (x * y.exp(), (x @ y.T).sum()), lambda: (make(2, 3), make(2, 3, seed=1)), [0, 1], 1),
    "non-contiguous": (lambda x: (x.cos() * 2,), lambda: (make(4, 3).detach().T.requires_grad_(),), [0], 0),
    "zero-dim": (lambda x: (x * x, x.expand(3)), lambda: (make(),), [0], 0),
    "complex": (lambda z: (z * z.conj(), (z * 1j).real), lambda: (make(5, dtype=torch.complex128),), [0], 0),
    "outputs that are views": (lambda x: (x.view(-1), x[1:]), lambda: (make(2, 3),), [0], 0),
    "a custom jvp": (lambda x: (Sin.apply(x),), lambda: (make(6),), [0], 0),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_shared_duals_give_the_rows_of_new_duals_per_element(name):
    fn, inputs, checked, i = CASES[name]
    args = inputs()
    elements = range(args[checked[i]].numel())
    _same(_shared_rows(fn, args, checked, i, elements), _generic_rows(fn, args, checked, i, elements))
    assert fwAD._current_level == -1


def test_the_duals_are_made_once_per_input_not_once_per_element(made):
    x, y = make(4), make(4, seed=1)
    rows = analytical_rows_forward(BE, lambda a, b: a * b, (x, y), [0, 1], 0, range(4))
    assert len(made) == 2  # x and y, for all four elements
    assert torch.equal(rows[0], torch.diag(y.detach()))


def test_the_duals_are_made_once_for_all_the_inputs_rows(made):
    x, y = make(3), make(4, seed=1)
    jx, jy = analytical_jacobians_forward(BE, lambda a, b: (a.sum() * b,), (x, y), [0, 1])
    assert len(made) == 2  # x and y, for all seven rows of both (one dual level per input would make four)
    assert torch.equal(jx[0], y.detach().expand(3, 4)) and torch.equal(jy[0], x.detach().sum() * torch.eye(4, dtype=torch.float64))


def test_the_rows_of_several_inputs_are_those_of_each_on_its_own():
    fn, inputs, checked, _ = CASES["second of two"]
    args = inputs()
    wanted = [(0, range(args[0].numel())), (1, range(args[1].numel()))]
    together = []
    BE.jvp_elements(fn, args, checked, wanted, lambda i, result: together.append((i, result)))
    alone = [(i, result) for i, elements in wanted for result in _generic_rows(fn, args, checked, i, elements)]
    assert [i for i, _ in together] == [i for i, _ in alone]
    _same([r for _, r in together], [r for _, r in alone])
    assert fwAD._current_level == -1


def test_an_error_while_receiving_a_row_leaves_no_dual_level_open():
    x = make(3)

    def receive(result):
        raise ArithmeticError("the caller's own check")

    with pytest.raises(ArithmeticError):
        BE.jvp_elements(lambda t: t.sin(), (x,), [0], [(0, range(3))], lambda _, result: receive(result))
    assert fwAD._current_level == -1
    with fwAD.dual_level():  # a new level opens: none was left behind
        pass


def test_an_error_inside_fn_restores_the_tangent_and_closes_the_level():
    x = make(3)
    calls = []

    def fn(t):
        calls.append(1)
        if len(calls) == 2:
            raise ValueError("fn fails at the second element")
        return t * 2

    with pytest.raises(ValueError, match="second element"):
        BE.jvp_elements(fn, (x,), [0], [(0, range(3))], lambda _, result: None)
    assert fwAD._current_level == -1



def _tangents_for(args, checked):
    return [torch.rand(args[p].shape, dtype=args[p].dtype, generator=torch.Generator().manual_seed(7 + k))
            for k, p in enumerate(checked)]


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_shared_duals_give_each_inputs_jvp_of_new_duals(name):
    fn, inputs, checked, _ = CASES[name]
    args = inputs()
    tangents = _tangents_for(args, checked)
    generic, shared = [], []
    Backend.jvp_each(BE, fn, args, checked, tangents, generic.append)
    BE.jvp_each(fn, args, checked, tangents, shared.append)
    assert len(shared) == len(checked)
    _same(shared, generic)
    assert fwAD._current_level == -1


def test_fast_mode_makes_one_dual_per_input_for_all_its_projections(made):
    x, y = make(4), make(4, seed=1)
    u = [torch.arange(1.0, 5.0, dtype=torch.float64), torch.full((4,), 2.0, dtype=torch.float64)]
    (jx,), (jy,) = analytical_jvps(BE, lambda a, b: a * b, (x, y), [0, 1], u)
    assert len(made) == 2  # x and y, for both projections (new duals per input would make four)
    assert torch.equal(jx, y.detach() * u[0]) and torch.equal(jy, x.detach() * u[1])


def test_an_error_inside_fn_during_the_projections_closes_the_level():
    x, y = make(3), make(3, seed=1)
    calls = []

    def fn(a, b):
        calls.append(1)
        if len(calls) == 2:
            raise ValueError("fn fails at the second input's projection")
        return a * b

    with pytest.raises(ValueError, match="second input"):
        BE.jvp_each(fn, (x, y), [0, 1], _tangents_for((x, y), [0, 1]), lambda result: None)
    assert fwAD._current_level == -1


@pytest.mark.parametrize("mode", [dict(engine="reference"), dict(fast_mode=True)],
                         ids=["reference loop", "fast mode"])
@pytest.mark.parametrize("function", [Sin, _WrongJvpSin], ids=["right jvp", "wrong jvp"])
def test_a_wrong_jvp_fails_like_torch(function, mode):
    x = make(5, seed=2)
    kw = dict(check_forward_ad=True, check_backward_ad=False, check_undefined_grad=False,
              fast_mode=mode.get("fast_mode", False))
    expected = function is Sin
    assert torch.autograd.gradcheck(function.apply, (x,), raise_exception=False, **kw) is expected
    assert agcheck.gradcheck(function.apply, (x,), raise_exception=False, **dict(kw, **mode)) is expected
    if not expected:
        with pytest.raises(agcheck.GradcheckError, match="Jacobian computed with forward mode mismatch"):
            agcheck.gradcheck(function.apply, (x,), **dict(kw, **mode))
