"""Diagnoses (agcheck.diagnosis): each usual bug is named, and correct functions stay silent.

Every broken function below is a custom ``torch.autograd.Function`` with one deliberate
bug in its backward (or a correct function at a non-differentiable point); the test asserts
the check fails as torch's would, and that the report's diagnosis names the bug with its
evidence. The other half: correct functions, even when a too-tight tolerance makes them
fail, get no structural diagnosis — only a hedged ``noise``.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import agcheck
from agcheck import GradcheckError
from agcheck.diagnosis import Diagnosis, diagnose_block
from agcheck.report import FailureReport, JacobianBlock
from agcheck.diagnosis import probes

from .helpers import Snapshot, make

MODES = [pytest.param(False, id="slow"), pytest.param(True, id="fast")]
#: the diagnoses that claim a specific bug (as opposed to noise / notes)
BUG_KINDS = {"factor", "sign", "transposed", "adjoint", "conjugate", "zero_analytical", "zero_numerical",
             "ignores_grad_output", "ignores_tangent", "few_entries", "localized", "kink", "discontinuity", "precision",
             "swapped", "permuted", "input_statistics", "low_rank", "missing_slice", "constant_term",
             "nondeterministic_fn"}


def failure(fn, inputs, **kw) -> FailureReport:
    with pytest.raises(GradcheckError) as info:
        agcheck.gradcheck(fn, inputs, backend="torch", **kw)
    assert torch.autograd.gradcheck(fn, inputs, raise_exception=False, **_torch_kw(kw)) is False
    return info.value.report


def _torch_kw(kw):
    return {k: v for k, v in kw.items() if k not in ("engine", "stencil", "memory_budget")}


def kinds(report) -> list:
    return [d.kind for d in report.diagnoses]


def the(report, kind) -> Diagnosis:
    found = [d for d in report.diagnoses if d.kind == kind]
    assert found, f"no {kind!r} diagnosis in {kinds(report)}:\n{report.summary()}"
    return found[0]


def function(forward, backward):
    """A one-input autograd.Function from ``forward(x)`` and ``backward(x, grad)``."""

    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return forward(x)

        @staticmethod
        def backward(ctx, grad):
            (x,) = ctx.saved_tensors
            return backward(x, grad)

    return F.apply


def sin_backward_times(c):
    return function(torch.sin, lambda x, g: g * x.cos() * c)


# -- constant factor, sign ------------------------------------------------------------------

@pytest.mark.parametrize("fast", MODES)
def test_factor_two(fast):
    rep = failure(sin_backward_times(2.0), (make(3, 4),), fast_mode=fast)
    d = the(rep, "factor")
    assert "analytical = 2.00 x numerical" in d.message
    assert d.evidence["factor"] == pytest.approx(2.0, rel=1e-6)
    assert kinds(rep) == ["factor"]
    assert "[factor] analytical = 2.00 x numerical" in str(rep.summary())


def test_factor_half_and_message_order():
    with pytest.raises(GradcheckError) as info:
        agcheck.gradcheck(sin_backward_times(0.5), (make(5),))
    text = str(info.value)
    assert text.startswith("Jacobian mismatch for output 0 with respect to input 0")
    assert text.index("Jacobian mismatch") < text.index("agcheck report") < text.index("analytical = 0.50 x numerical")


@pytest.mark.parametrize("fast", MODES)
def test_sign_flipped(fast):
    rep = failure(sin_backward_times(-1.0), (make(2, 3),), fast_mode=fast)
    assert kinds(rep) == ["sign"]
    assert "sign" in the(rep, "sign").message


# -- transposition ---------------------------------------------------------------------------

W = torch.tensor([[1.0, 2.0, 0.5], [-1.0, 0.3, 4.0], [2.5, -0.7, 1.1]], dtype=torch.float64)


@pytest.mark.parametrize("fast", MODES)
def test_transposed_backward_of_square_matmul(fast):
    # x @ W: the correct VJP is g @ W.T; this one uses W
    fn = function(lambda x: x @ W, lambda x, g: g @ W)
    rep = failure(fn, (make(3, 3),), fast_mode=fast)
    assert kinds(rep) == ["transposed"]
    assert "transposed" in the(rep, "transposed").message


def test_transposed_matrix_vector():
    fn = function(lambda x: W @ x, lambda x, g: W @ g)
    rep = failure(fn, (make(3),))
    assert kinds(rep) == ["transposed"]


# -- complex conjugation --------------------------------------------------------------------

WC = torch.tensor([0.5 + 1.5j, -1.0 + 0.25j, 2.0 - 1.0j], dtype=torch.complex128)


@pytest.mark.parametrize("fast", MODES)
def test_conjugated_complex_backward(fast):
    # z * w: the correct VJP (conjugate Wirtinger) is g * conj(w); this one forgets the conj
    fn = function(lambda z: z * WC, lambda z, g: g * WC)
    rep = failure(fn, (make(3, dtype=torch.complex128),), fast_mode=fast)
    assert "conjugate" in kinds(rep), rep.summary()
    assert not set(kinds(rep)) & {"factor", "transposed", "sign"}


def test_a_missing_conjugation_of_a_constant_is_conjugate_not_a_complex_factor():
    # c * z's backward is g * conj(c); g * c makes analytical = (c / conj(c)) x numerical
    # too, a unit complex factor: the conjugation is named
    c = torch.tensor(2 + 1j, dtype=torch.complex128)
    rep = failure(function(lambda z: z * c, lambda z, g: g * c), (make(3, dtype=torch.complex128),))
    assert kinds(rep) == ["conjugate"]
    assert agcheck.gradcheck(function(lambda z: z * c, lambda z, g: g * c.conj()), (make(3, dtype=torch.complex128),))
    # a complex factor that is no conjugation stays a factor
    rep = failure(function(lambda z: z * c, lambda z, g: 1j * g * c.conj()), (make(3, dtype=torch.complex128),))
    assert kinds(rep) == ["factor"]


def test_conjugated_complex_to_real():
    # |z|^2 -> real; correct VJP 2 z g, broken 2 conj(z) g
    fn = function(lambda z: (z * z.conj()).real, lambda z, g: 2 * z.conj() * g)
    rep = failure(fn, (make(4, dtype=torch.complex128),))
    assert kinds(rep) == ["conjugate"]


# -- two inputs' derivatives swapped ---------------------------------------------------------------

class _XTimesYSquared(torch.autograd.Function):
    """``x * y**2``; ``swapped`` returns the two gradients in the wrong order, ``factor``
    scales y's."""

    bug = None

    @staticmethod
    def forward(ctx, x, y):
        ctx.save_for_backward(x, y)
        return x * y ** 2

    @staticmethod
    def backward(ctx, g):
        x, y = ctx.saved_tensors
        gx, gy = g * y ** 2, g * 2 * x * y
        if _XTimesYSquared.bug == "swapped":
            return gy, gx
        if _XTimesYSquared.bug == "factor":
            return gx, 3 * gy
        return gx, gy


@pytest.mark.parametrize("fast", MODES)
@pytest.mark.parametrize("bug", [None, "swapped", "factor"])
def test_gradients_returned_in_the_wrong_order_are_swapped(bug, fast, monkeypatch):
    monkeypatch.setattr(_XTimesYSquared, "bug", bug)
    inputs = (make(4), make(4, seed=1))
    if bug is None:
        assert agcheck.gradcheck(_XTimesYSquared.apply, inputs, fast_mode=fast)
        return
    rep = failure(_XTimesYSquared.apply, inputs, fast_mode=fast)
    if bug == "factor":  # one block wrong, by a factor: no pair to swap
        assert kinds(rep) == ["factor"] and rep.diagnoses[0].block == 0 and rep.blocks[0].input == 1
        return
    if fast:  # fast mode reports the failing block alone: no pair to compare
        assert len(rep.blocks) == 1 and "swapped" not in kinds(rep)
        return
    assert [(b.output, b.input) for b in rep.blocks] == [(0, 0), (0, 1)]
    assert kinds(rep) == ["swapped"]
    d = the(rep, "swapped")
    assert d.evidence["inputs"] == [0, 1] and "wrong order" in d.message


# -- gradients routed to the wrong elements ---------------------------------------------------------

@pytest.mark.parametrize("fast", MODES)
def test_a_backward_that_does_not_undo_a_flip_is_permuted(fast):
    flip = function(lambda x: x.flip(0), lambda x, g: g)  # the backward of flip is flip
    rep = failure(flip, (make(6),), fast_mode=fast)
    assert kinds(rep) == ["permuted"]
    d = the(rep, "permuted")
    assert d.evidence["axis"] == "rows" and d.evidence["order"] == [5, 4, 3, 2, 1, 0] and d.evidence["moved"] == 6
    assert "input(0,) <- input(5,)" in d.message
    assert agcheck.gradcheck(function(lambda x: x.flip(0), lambda x, g: g.flip(0)), (make(6),), fast_mode=fast)


def test_a_backward_that_puts_gradients_one_element_off_is_permuted():
    # x[[0, 2, 4]] whose backward writes into elements 1, 3, 5: the zero rows tie with one
    # another, and still pair up, nearest first
    picked = torch.tensor([0, 2, 4])
    rep = failure(function(lambda x: x[picked], lambda x, g: torch.zeros_like(x).index_put((picked + 1,), g)),
                  (make(6),))
    d = the(rep, "permuted")
    assert kinds(rep) == ["permuted"] and d.evidence["order"] == [1, 0, 3, 2, 5, 4]
    assert agcheck.gradcheck(function(lambda x: x[picked], lambda x, g: torch.zeros_like(x).index_put((picked,), g)),
                             (make(6),))


def test_a_backward_that_reads_grad_output_reversed_is_permuted_by_columns():
    w = torch.linspace(-1, 2, 12, dtype=torch.float64).reshape(3, 4) ** 2
    rep = failure(function(lambda x: w @ x, lambda x, g: w.T @ g.flip(0)), (make(4),))
    d = the(rep, "permuted")
    assert kinds(rep) == ["permuted"] and d.evidence["axis"] == "cols" and d.evidence["order"] == [2, 1, 0]
    assert agcheck.gradcheck(function(lambda x: w @ x, lambda x, g: w.T @ g), (make(4),))


# -- a term left out: the mismatch itself has a simple form ------------------------------------

_W = torch.linspace(-1.5, 2.0, 40, dtype=torch.float64).reshape(4, 10).sin()


def _normalised(x, detach, scale=True):
    """``tanh`` of a linear map of ``x`` normalised per row (the last dimension), with the
    mean and standard deviation detached (as kornia's OriNet normalises its patches) or not."""
    mean, std = x.mean(dim=-1, keepdim=True), x.std(dim=-1, keepdim=True)
    if detach:
        mean, std = mean.detach(), std.detach()
    z = (x - mean) / std if scale else x - mean
    return torch.tanh(z @ _W.T)


@pytest.mark.parametrize("fast", MODES)
@pytest.mark.parametrize("shape", [(10,), (3, 10)], ids=["one", "per-sample"])
def test_a_normalisation_with_detached_statistics_is_input_statistics(fast, shape):
    rep = failure(lambda x: _normalised(x, detach=True), (make(*shape),), fast_mode=fast)
    assert kinds(rep) == ["input_statistics"], rep.summary()
    d = the(rep, "input_statistics")
    assert not d.evidence["constant"] and "detached statistics" in d.message
    assert {f["inputs"] for f in d.evidence["fits"]} == {10}  # each output reaches its own row only
    assert agcheck.gradcheck(lambda x: _normalised(x, detach=False), (make(*shape),), fast_mode=fast)


def test_a_detached_mean_alone_is_a_constant_per_output_element():
    rep = failure(lambda x: _normalised(x, detach=True, scale=False), (make(10),))
    d = the(rep, "input_statistics")
    assert kinds(rep) == ["input_statistics"] and d.evidence["constant"]
    assert all(f["beta"] == 0 for f in d.evidence["fits"])
    assert agcheck.gradcheck(lambda x: _normalised(x, detach=False, scale=False), (make(10),))


def test_a_constant_added_to_the_gradient_is_one_constant_on_every_entry():
    # the backward adds 0.1 whatever grad_output: every entry of the block is 0.1 too large;
    # the same constant for every output element, which input_statistics would call a
    # constant per output element, and a report rebuilt from data a rank-1 term
    rep = failure(function(torch.sin, lambda x, g: g * x.cos() + 0.1), (make(8),))
    d = the(rep, "constant_term")
    assert kinds(rep) == ["constant_term"] and d.evidence["form"] == "every entry"
    assert d.evidence["coefficient"] == pytest.approx(0.1, rel=1e-6)
    assert "adds 0.10 to every element of the gradient" in d.message
    assert agcheck.gradcheck(function(torch.sin, lambda x, g: g * x.cos()), (make(8),))


def _softmax(backward):
    class Softmax(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            s = torch.softmax(x, 0)
            ctx.save_for_backward(s)
            return s

        @staticmethod
        def backward(ctx, g):
            (s,) = ctx.saved_tensors
            return backward(s, g)

    return Softmax.apply


@pytest.mark.parametrize("fast", MODES)
def test_softmax_without_its_coupling_term_is_low_rank(fast):
    rep = failure(_softmax(lambda s, g: g * s), (make(8),), fast_mode=fast)  # leaves out -s (g . s)
    d = the(rep, "low_rank")
    assert kinds(rep) == ["low_rank"] and d.evidence["rank"] == 1 and "softmax" in d.message
    assert agcheck.gradcheck(_softmax(lambda s, g: s * (g - (g * s).sum())), (make(8),), fast_mode=fast)


def test_an_error_in_a_jacobian_that_has_the_form_itself_is_not_blamed_on_a_term():
    # f = sum(x^2) * w: its Jacobian 2 x w^T is affine in x per output element and of rank one,
    # so a backward adding 1 (the same for every element) is an error of that form whatever its
    # cause: neither hypothesis is evidence here
    w = torch.tensor([1.0, -2.0, 0.5, 3.0], dtype=torch.float64)
    rep = failure(function(lambda x: (x ** 2).sum() * w, lambda x, g: (2 * x + 1) * (g * w).sum()), (make(6),))
    assert not {"input_statistics", "low_rank"} & set(kinds(rep)), rep.summary()
    assert agcheck.gradcheck(function(lambda x: (x ** 2).sum() * w, lambda x, g: 2 * x * (g * w).sum()), (make(6),))


def test_a_dense_error_is_no_term():
    wrong = _W + 0.05 * torch.linspace(0, 1, 40, dtype=torch.float64).reshape(4, 10).cos() ** 3
    rep = failure(function(lambda x: _W @ x, lambda x, g: wrong.T @ g), (make(10),))
    assert not {"input_statistics", "low_rank"} & set(kinds(rep)), rep.summary()
    assert agcheck.gradcheck(function(lambda x: _W @ x, lambda x, g: _W.T @ g), (make(10),))


def test_input_statistics_needs_the_input_values_and_low_rank_only_the_blocks():
    rep = failure(lambda x: _normalised(x, detach=True), (make(10),))
    block = JacobianBlock.from_dict(rep.blocks[0].to_dict())  # a report rebuilt from data: no inputs
    assert "input_statistics" not in [d.kind for d in diagnose_block(block)]
    rep = failure(_softmax(lambda s, g: g * s), (make(8),))
    assert [d.kind for d in diagnose_block(JacobianBlock.from_dict(rep.blocks[0].to_dict()))] == ["low_rank"]


# -- a constant times the identity, or one constant, left out or added ---------------------------

_A = torch.linspace(-1, 1, 25, dtype=torch.float64).reshape(5, 5).cos()


@pytest.mark.parametrize("fast", MODES)
def test_a_forgotten_skip_term_is_a_constant_times_the_identity(fast):
    # A @ x + 2 * x whose backward forgets the 2 * grad of the 2 * x term
    rep = failure(function(lambda x: _A @ x + 2 * x, lambda x, g: _A.T @ g), (make(5),), fast_mode=fast)
    d = the(rep, "constant_term")
    assert kinds(rep) == ["constant_term"] and d.evidence["form"] == "identity"
    assert d.evidence["coefficient"] == pytest.approx(-2.0, rel=1e-6)
    assert "-2.00 x the identity" in d.message and "leaves out a term 2.00 * grad_output" in d.message
    assert agcheck.gradcheck(function(lambda x: _A @ x + 2 * x, lambda x, g: _A.T @ g + 2 * g), (make(5),),
                             fast_mode=fast)


def test_an_elementwise_derivative_off_by_a_constant_is_the_identity_term():
    # x**2 + 2x with the backward of x**2 alone: a diagonal block, every diagonal entry off by
    # -2 (on 5 elements a "few entries" of 25 but for the constant); a skip term added twice: +1
    rep = failure(function(lambda x: x ** 2 + 2 * x, lambda x, g: 2 * x * g), (make(5),))
    assert kinds(rep) == ["constant_term"] and the(rep, "constant_term").evidence["coefficient"] == pytest.approx(-2)
    rep = failure(function(torch.tanh, lambda x, g: g * (1 - x.tanh() ** 2) + g), (make(6),))
    d = the(rep, "constant_term")
    assert d.evidence["coefficient"] == pytest.approx(1.0) and "adds a term 1.00 * grad_output" in d.message
    assert agcheck.gradcheck(function(lambda x: x ** 2 + 2 * x, lambda x, g: (2 * x + 2) * g), (make(5),))


def test_a_forgotten_sum_term_is_one_constant_on_every_entry():
    rep = failure(function(lambda x: x.sin() + 0.5 * x.sum(), lambda x, g: g * x.cos()), (make(6),))
    d = the(rep, "constant_term")
    assert kinds(rep) == ["constant_term"] and d.evidence["form"] == "every entry"
    assert d.evidence["coefficient"] == pytest.approx(-0.5) and "0.50 * x.sum()" in d.message
    assert agcheck.gradcheck(function(lambda x: x.sin() + 0.5 * x.sum(), lambda x, g: g * x.cos() + 0.5 * g.sum()),
                             (make(6),))


def test_a_diagonal_off_by_varying_amounts_or_on_some_elements_is_no_constant_term():
    # the diagonal off by 2 on every element but one: no constant times the identity
    rep = failure(function(lambda x: x ** 2 + 2 * x, lambda x, g: 2 * x * g + 2 * g * (torch.arange(6) == 0)),
                  (make(6),))
    assert "constant_term" not in kinds(rep), rep.summary()
    # exp's backward with x where exp(x) belongs: off by exp(x) - x, not by one constant
    rep = failure(function(torch.exp, lambda x, g: g * x), (make(6),))
    assert "constant_term" not in kinds(rep), rep.summary()
    # and a constant factor stays a factor
    assert kinds(failure(function(lambda x: x ** 2, lambda x, g: 4 * x * g), (make(6),))) == ["factor"]


# -- a slice the backward leaves at zero ---------------------------------------------------------

_V = torch.linspace(-1.3, 0.9, 20, dtype=torch.float64).reshape(4, 5).exp().sin()


def _batched_tanh(dropped=None, scale=0.0):
    """``tanh(x @ V)`` per batch element (the rows of ``x``), its backward multiplying batch
    element ``dropped`` by ``scale``."""

    def backward(x, g):
        out = (g * (1 - torch.tanh(x @ _V) ** 2)) @ _V.T
        if dropped is not None:
            out[dropped] *= scale
        return out

    return function(lambda x: torch.tanh(x @ _V), backward)


@pytest.mark.parametrize("fast", MODES)
def test_a_batch_element_left_without_gradient_is_a_missing_slice(fast):
    rep = failure(_batched_tanh(dropped=1), (make(3, 4),), fast_mode=fast)
    d = the(rep, "missing_slice")
    assert kinds(rep) == ["missing_slice"]
    assert d.evidence["slices"] == {"output": "output[1, ...]", "input": "input[1, ...]"}
    assert d.evidence["elements"] == {"output": 5, "input": 4}
    assert "zero on output[1, ...] (5 of 15 output elements) and input[1, ...]" in d.message
    assert agcheck.gradcheck(_batched_tanh(), (make(3, 4),), fast_mode=fast)


#: regions of interest (rows, columns) of a (channels, 5, 4) input, pooled to one value per
#: channel: a per-RoI average pooling in plain torch, as torchvision's ps_roi_pool pools bins
_ROIS = [(slice(0, 2), slice(0, 2)), (slice(1, 4), slice(1, 3)), (slice(2, 5), slice(0, 4))]


class _RoIPool(torch.autograd.Function):
    dropped = None

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return torch.stack([x[:, r, c].mean(dim=(1, 2)) for r, c in _ROIS])

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        gx = torch.zeros_like(x)
        for k, (r, c) in enumerate(_ROIS):
            if k != _RoIPool.dropped:
                gx[:, r, c] += g[k][:, None, None] / x[:, r, c][0].numel()
        return gx


def test_a_region_of_interest_the_backward_skips_is_a_missing_slice_of_the_output(monkeypatch):
    x = make(2, 5, 4)
    assert agcheck.gradcheck(_RoIPool.apply, (x,))
    monkeypatch.setattr(_RoIPool, "dropped", 1)
    rep = failure(_RoIPool.apply, (x,))
    d = the(rep, "missing_slice")
    assert kinds(rep) == ["missing_slice"] and d.evidence["slices"] == {"output": "output[1, ...]"}
    assert "drops the gradient flowing from those output elements" in d.message


def test_a_band_of_the_input_left_at_zero_is_a_missing_slice_of_the_input():
    def backward(x, g):  # cumsum along the rows: its backward is the reversed cumsum
        out = g.flip(1).cumsum(1).flip(1)
        out[:, 2:4] = 0
        return out

    rep = failure(function(lambda x: x.cumsum(1), backward), (make(2, 6, 3),))
    d = the(rep, "missing_slice")
    assert kinds(rep) == ["missing_slice"] and d.evidence["slices"] == {"input": "input[:, 2:4, ...]"}
    assert agcheck.gradcheck(function(lambda x: x.cumsum(1), lambda x, g: g.flip(1).cumsum(1).flip(1)),
                             (make(2, 6, 3),))


def test_what_is_not_one_zero_slice_is_no_missing_slice():
    # a slice scaled rather than dropped
    rep = failure(_batched_tanh(dropped=1, scale=3.0), (make(3, 4),))
    assert "missing_slice" not in kinds(rep), rep.summary()
    # two batch elements dropped that are not one slice (0 and 2 of 3)
    rep = failure(_batched_tanh(dropped=[0, 2]), (make(3, 4),))
    assert "missing_slice" not in kinds(rep), rep.summary()
    # a dropped slice and another error elsewhere: the blocks do not match outside the slice
    def two_bugs(x, g):
        out = (g * (1 - torch.tanh(x @ _V) ** 2)) @ _V.T
        out[1] = 0
        out[2] *= 2
        return out

    rep = failure(function(lambda x: torch.tanh(x @ _V), two_bugs), (make(3, 4),))
    assert "missing_slice" not in kinds(rep), rep.summary()
    # one element without gradient is no slice: a few entries
    rep = failure(function(torch.sin, lambda x, g: g * x.cos() * (torch.arange(8) != 3)), (make(8),))
    assert kinds(rep) == ["few_entries"], rep.summary()


# -- a few entries wrong -------------------------------------------------------------------------

def test_one_entry_off_is_listed():
    def backward(x, g):
        out = g * x.cos()
        out = out.clone()
        out[1, 2] += 0.25 * g[1, 2]
        return out

    rep = failure(function(torch.sin, backward), (make(3, 4),))
    d = the(rep, "few_entries")
    assert kinds(rep) == ["few_entries"]
    assert d.evidence["count"] == 1
    assert "input(1, 2) / output(1, 2)" in d.lines[0]
    block = rep.blocks[0]
    assert block.max_abs_entry.input_index == (1, 2) and block.max_abs_entry.output_index == (1, 2)
    assert block.max_abs_diff == pytest.approx(0.25, rel=1e-6)


def test_an_elementwise_function_wrong_everywhere_is_not_a_few_entries():
    # exp's backward with x where exp(x) belongs: every derivative of the diagonal block is
    # wrong, 5 of its 25 entries; nothing the report knows fits, and it says so
    rep = failure(function(torch.exp, lambda x, g: g * x), (make(5),))
    assert kinds(rep) == []
    assert "no known pattern" in rep.summary()
    # the other half: wrong in one branch only (abs's backward without the sign), half of
    # the derivatives: a few entries
    x = torch.tensor([0.5, -1.0, 1.5, -2.0, 2.5, 3.0, -0.7, 1.1], dtype=torch.float64, requires_grad=True)
    rep = failure(function(torch.abs, lambda x, g: g.clone()), (x,))
    assert kinds(rep) == ["few_entries"] and the(rep, "few_entries").evidence["count"] == 3
    # and wrong in the branch most elements take, as long as some derivatives are right
    x = torch.tensor([-0.5, -1.0, 1.5, -2.0, 2.5, -3.0, -0.7, 1.1], dtype=torch.float64, requires_grad=True)
    rep = failure(function(lambda t: t ** 3, lambda t, g: g * 3 * t * t.abs()), (x,))
    assert kinds(rep) == ["few_entries"] and the(rep, "few_entries").evidence["count"] == 5
    assert agcheck.gradcheck(function(torch.exp, lambda x, g: g * x.exp()), (make(5),))


def test_one_input_element_wrong_is_localized():
    a = torch.linspace(-1, 1, 36, dtype=torch.float64).reshape(6, 6)

    def backward(x, g):
        out = (g @ a).clone()  # the correct VJP of a @ x is a.T @ g
        out[4] *= 3  # every derivative with respect to x[4] is wrong
        return out

    fn = function(lambda x: a @ x, backward)
    rep = failure(fn, (make(6),))
    d = the(rep, "localized")
    assert d.evidence["rows"] == [4]


# -- grad_output ----------------------------------------------------------------------------

def test_not_multiplied_by_grad_output_scalar_output():
    # the one-hot cotangent of a scalar output is 1, so the Jacobian matches; the zero
    # cotangent of the grad_output check exposes the bug
    fn = function(lambda x: (x * x).sum(), lambda x, g: 2 * x)
    rep = failure(fn, (make(4),))
    assert rep.check == "grad_output_scaling"
    d = the(rep, "not_multiplied_by_grad_output")
    assert rep.details["max_abs_gradient"] > 0
    assert "grad_output" in d.message


@pytest.mark.parametrize("fast", MODES)
def test_grad_output_ignored_shows_in_the_jacobian(fast):
    fn = function(torch.sin, lambda x, g: x.cos())
    rep = failure(fn, (make(2, 3),), fast_mode=fast)
    assert kinds(rep) == ["ignores_grad_output"]


# -- nondeterminism -------------------------------------------------------------------------

def drifting(size):
    calls = [0]

    def backward(x, g):
        calls[0] += 1
        return g * x.cos() * (1 + size * calls[0])

    return function(torch.sin, backward)


def test_nondeterministic_large_is_called_a_bug():
    rep = failure(drifting(1e-3), (make(4),))
    assert rep.check == "reentrant"
    assert rep.details["max_run_to_run_difference"] > 0 and rep.details["nondet_tol"] == 0.0
    d = the(rep, "nondeterministic")
    assert "far above rounding" in d.message
    assert "nondet_tol=0.0" in d.message


def test_nondeterministic_rounding_sized_is_called_noise():
    rep = failure(drifting(1e-15), (make(4),))
    d = the(rep, "nondeterministic")
    assert "rounding-sized" in d.message
    suggested = d.evidence["suggested_nondet_tol"]
    assert suggested >= rep.details["max_run_to_run_difference"]
    # the suggestion is enough (the next check runs twice more: the drift has grown)
    assert agcheck.gradcheck(drifting(1e-15), (make(4),), nondet_tol=suggested * 100)
    summary = rep.summary()
    assert "max_run_to_run_difference" in summary and "nondet_tol" in summary


# -- non-differentiable points --------------------------------------------------------------

def _away_from_zero_but(n, zeros):
    """``n`` values at least 0.5 away from 0, except 0 at the positions ``zeros``."""
    x = torch.linspace(0.5, 3.0, n, dtype=torch.float64) * torch.tensor([1.0, -1.0]).repeat(n)[:n].to(torch.float64)
    x[list(zeros)] = 0.0
    return x.requires_grad_()


def test_relu_at_exactly_zero_is_a_kink():
    # 48 elements: enough for the probes to re-evaluate both failing rows (probe_rows)
    x = _away_from_zero_but(48, [0, 3])
    snap = Snapshot([x])
    rep = failure(torch.relu, (x,))
    snap.assert_unchanged()  # the extra evaluations of the diagnosis leave no trace
    assert kinds(rep) == ["kink"]
    d = the(rep, "kink")
    assert "kink" in d.message and "relu at 0" in d.message
    assert "right 1, left 0" in d.lines[0]
    rows = {e["row"] for e in d.evidence["entries"]}
    assert rows == {0, 3}


def test_relu_within_eps_of_zero_is_a_kink():
    x = torch.tensor([3e-7, 1.0], dtype=torch.float64, requires_grad=True)
    rep = failure(torch.relu, (x,))
    assert kinds(rep) == ["kink"]
    assert "changes with the" in the(rep, "kink").message


def _step_at_zero(analytical_at_zero):
    """``x + step(x)`` (a jump of 1 at 0), whose backward gives ``analytical_at_zero`` at 0
    (as the derivatives of eigenvectors blow up at a repeated eigenvalue) and 1 elsewhere."""
    return function(lambda x: x + (x >= 0).to(x.dtype),
                    lambda x, g: g * torch.where(x == 0, torch.full_like(x, analytical_at_zero), torch.ones_like(x)))


@pytest.mark.parametrize("analytical_at_zero", [1.0, 1e12])
def test_a_jump_in_the_value_is_a_discontinuity_whatever_the_analytical_value(analytical_at_zero):
    # with 1e12 the estimates' spread (4.5e6) is small beside the analytical value: it was
    # taken for noise, which made the numerical Jacobian (1 and 5e5) "zero"
    x = _away_from_zero_but(48, [0, 3])
    rep = failure(_step_at_zero(analytical_at_zero), (x,))
    assert kinds(rep) == ["discontinuity"]
    d = the(rep, "discontinuity")
    assert "jumps at the input" in d.message and d.evidence["jump"] == pytest.approx(1.0, rel=1e-3)
    assert {e["row"] for e in d.evidence["entries"]} == {0, 3}
    # the other half: away from the jump the same function passes
    assert agcheck.gradcheck(_step_at_zero(analytical_at_zero), (_away_from_zero_but(48, []),))


def test_a_smooth_function_with_a_huge_wrong_derivative_is_no_discontinuity():
    rep = failure(sin_backward_times(1e12), (make(3, 4),))
    assert kinds(rep) == ["factor"]


def test_discontinuity_needs_a_jump_beyond_the_rounding_of_the_output():
    def probe(output_value, coarse=0.5e6):
        # central estimates with steps eps/10, eps, 10 eps that scale as 1 / step
        return probes.Probe(0, 0, coarse, 1.0, 10 * coarse, coarse / 10, 0.0, 0.0, 0.0, 0.0, 1e-6, output_value)

    assert probe(1.0).discontinuous and probe(1.0).jump_size == pytest.approx(1.0)
    assert not probe(None).discontinuous  # nothing to tell rounding by
    # one ulp of an output of 1.0 moved by the steps: 1 / step as well, but rounding
    assert not probe(1.0, coarse=2.2e-16 / 2e-6).discontinuous
    assert probe(1e-20, coarse=2.2e-16 / 2e-6).discontinuous  # the same change of an output near 0


def test_kink_in_fast_mode():
    x = torch.tensor([0.0, 1.5, -0.7], dtype=torch.float64, requires_grad=True)
    rep = failure(torch.relu, (x,), fast_mode=True)
    assert kinds(rep) == ["kink"]


# -- silence on correct functions ----------------------------------------------------------------

CORRECT = {
    "sin": (torch.sin, lambda: (make(3, 4),)),
    "matmul": (lambda x: torch.tanh(x @ W), lambda: (make(3, 3),)),
    "exp-sum": (lambda x: torch.exp(x).sum() * x, lambda: (make(5),)),
    "complex": (lambda z: z * z.conj() * WC + z.sin(), lambda: (make(3, dtype=torch.complex128),)),
    "two inputs": (lambda x, y: x * y.sum() + y.cos(), lambda: (make(4), make(4, seed=1))),
}


@pytest.mark.parametrize("name", sorted(CORRECT))
@pytest.mark.parametrize("fast", MODES)
def test_correct_functions_with_absurd_tolerance_get_only_noise(name, fast):
    fn, inputs = CORRECT[name]
    with pytest.raises(GradcheckError) as info:
        agcheck.gradcheck(fn, inputs(), atol=0.0, rtol=0.0, fast_mode=fast)
    rep = info.value.report
    assert not set(kinds(rep)) & BUG_KINDS, rep.summary()
    if rep.blocks and rep.blocks[0].mismatches:  # fast mode's slow blocks may agree exactly
        # one "noise" per failing block (slow mode reports every failing block)
        assert set(kinds(rep)) == {"noise"} and len(kinds(rep)) == len(rep.blocks), rep.summary()
        assert "tolerance" in the(rep, "noise").message


def test_correct_functions_pass_and_build_no_report(monkeypatch):
    import agcheck.report as report

    def boom(*a, **k):
        raise AssertionError("report work on a passing check")

    monkeypatch.setattr(report.FailureReport, "summary", boom)
    for fn, inputs in CORRECT.values():
        assert agcheck.gradcheck(fn, inputs())
        assert agcheck.gradcheck(fn, inputs(), fast_mode=True)


def test_float32_correct_function_is_called_imprecise():
    x = make(3, 3, dtype=torch.float32)
    with pytest.warns(UserWarning):
        with pytest.raises(GradcheckError) as info:
            agcheck.gradcheck(lambda x: torch.tanh(x @ x), (x,))
    rep = info.value.report
    assert kinds(rep) == ["precision"], rep.summary()
    assert "eps='auto'" in rep.diagnoses[0].message


def test_raise_exception_false_skips_the_diagnosis():
    counts = [0]

    def relu(x):
        counts[0] += 1
        return torch.relu(x)

    x = torch.tensor([0.0, 1.0], dtype=torch.float64, requires_grad=True)
    assert agcheck.gradcheck(relu, (x,), raise_exception=False) is False
    quiet = counts[0]
    counts[0] = 0
    with pytest.raises(GradcheckError):
        agcheck.gradcheck(relu, (x,))
    assert counts[0] > quiet  # the diagnosis re-evaluated entries, only when raising


# -- synthetic blocks -----------------------------------------------------------------------------

def block(n, a, **kw):
    kw.setdefault("atol", 1e-5)
    kw.setdefault("rtol", 1e-3)
    return JacobianBlock.from_arrays(np.asarray(n), np.asarray(a), output=0, input=0, **kw)


def test_synthetic_adjoint_and_zero_numerical():
    rng = np.random.default_rng(0)
    n = rng.standard_normal((4, 4)) + 1j * rng.standard_normal((4, 4))
    assert [d.kind for d in diagnose_block(block(n, n.conj().T))] == ["adjoint"]
    assert [d.kind for d in diagnose_block(block(np.zeros((3, 2)), np.ones((3, 2))))] == ["zero_numerical"]


def test_synthetic_fast_only():
    n = np.eye(3)
    b = block(n, n + 1e-9, fast=True, projection={"numerical": 1.0, "analytical": 1.001, "atol": 1e-6})
    assert [d.kind for d in diagnose_block(b)] == ["fast_only"]


def test_synthetic_non_finite():
    n = np.eye(2)
    a = n.copy()
    a[0, 1] = np.nan
    d = diagnose_block(block(n, a))
    assert [x.kind for x in d] == ["non_finite"]
    assert "analytical" in d[0].message


def test_synthetic_no_pattern_says_so():
    rng = np.random.default_rng(3)
    n, a = rng.standard_normal((5, 5)), rng.standard_normal((5, 5))
    b = block(n, a)
    assert diagnose_block(b) == []
    rep = FailureReport(check="jacobian", message="Jacobian mismatch for output 0 with respect to input 0,")
    rep.blocks = [b]
    rep.completed = True
    assert "no known pattern" in rep.summary()


def test_synthetic_kink_from_the_resample_callable():
    """Diagnosis gets numerical rows at other steps only through the caller's callable."""
    asked = []

    def resample(steps, rows):
        asked.extend((eps, tuple(rows), side) for eps, side in steps)
        # a jump: right and left differ
        return [np.full((len(rows), 1), {"central": 0.5, "right": 1.0, "left": 0.0}[side]) for _, side in steps]

    b = block([[0.5]], [[1.0]], eps=1e-6, input_dtype="float64", input_double=True)
    assert [d.kind for d in diagnose_block(b, resample=resample)] == ["kink"]
    assert {side for _, _, side in asked} == {"central", "right", "left"}
    assert sorted({eps for eps, _, _ in asked}) == pytest.approx([1e-7, 1e-6, 1e-5])
    assert [d.kind for d in diagnose_block(b)] == ["factor"]  # without it: no step-size evidence

    def broken(steps, rows):
        raise ValueError("fn fails there")

    found = diagnose_block(b, resample=broken)
    assert [d.kind for d in found] == ["note", "factor"] and "fn fails there" in found[0].message


def test_single_nonzero_entry_factor_is_hedged():
    d = diagnose_block(block([[2.0]], [[6.0]]))
    assert [x.kind for x in d] == ["factor"]
    assert "weak evidence" in d[0].message


def test_other_checks_are_named():
    from agcheck.diagnosis import diagnose

    cases = {
        "batched_grad": ({"output": 0, "input": 0, "max_difference": 0.5}, "batched"),
        "undefined_grad": ({"undefined_outputs": "all", "max_abs_gradient": 1.0}, "undefined_grad"),
        "no_differentiable_outputs": ({"input": 0, "max_abs_numerical": 2.0}, "depends_on_input"),
        "grad_size": ({}, "gradient_shape"),
    }
    for check, (details, kind) in cases.items():
        rep = FailureReport(check=check, message="x", details=details)
        assert [d.kind for d in diagnose(rep)] == [kind]


def test_no_differentiable_outputs_end_to_end():
    rep = failure(lambda x: (x * 2).detach(), (make(3),))
    assert rep.check == "no_differentiable_outputs"
    assert kinds(rep) == ["depends_on_input"]
    assert rep.details["max_abs_numerical"] == pytest.approx(2.0)


@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128])
def test_probes_evaluate_each_distinct_point_once_with_the_rows_of_each_step(dtype):
    """The six step-size probes of an entry share their points: x ± h/10, x ± h and
    x ± 10h are six evaluations of fn per element and axis (not twelve), x itself one for
    all the elements and axes, and each probe's rows are those numerical_rows computes for
    that step alone."""
    from agcheck.backend import get_backend
    from agcheck.core.jacobian import numerical_rows, numerical_rows_at
    from agcheck.stencil import STENCILS
    from agcheck.core.report_filling import ONE_SIDED

    be = get_backend("torch")
    x = make(6, seed=4, dtype=dtype)
    calls = []

    def fn(t):
        calls.append(1)
        return (t.sin() * t[0], t.sum())

    eps = 1e-6
    steps = [(eps / 10, STENCILS["central"]), (eps * 10, STENCILS["central"]), (eps / 10, ONE_SIDED["right"]),
             (eps / 10, ONE_SIDED["left"]), (eps, ONE_SIDED["right"]), (eps, ONE_SIDED["left"])]
    together = numerical_rows_at(be, fn, (x,), 0, 0, [1, 4], steps)
    axes = 2 if dtype.is_complex else 1
    assert len(calls) == 2 * 6 * axes + 1
    for rows, (step, stencil) in zip(together, steps):
        alone = numerical_rows(be, fn, (x,), 0, 0, [1, 4], step, stencil)
        assert len(rows) == 2 and all(torch.equal(a, b) for a, b in zip(rows, alone))
    assert numerical_rows_at(be, fn, (x,), 0, 0, [1], []) == []


class _ScaledExpPair(torch.autograd.Function):
    """``(exp(x), 2 exp(x))`` with a backward scaled by ``factor`` (1: correct)."""

    factor = 1.0

    @staticmethod
    def forward(ctx, x):
        y = x.exp()
        ctx.save_for_backward(y)
        return y, 2 * y

    @staticmethod
    def backward(ctx, g0, g1):
        (y,) = ctx.saved_tensors
        return (g0 + 2 * g1) * y * _ScaledExpPair.factor


def _pair_relu(x):
    return torch.relu(x), 3 * torch.relu(x)


@pytest.mark.parametrize("case", ["factor", "kink"])
def test_the_blocks_of_one_input_share_their_probed_points(case, monkeypatch):
    """Two failing blocks of one input (two outputs, the same worst rows) are probed at
    the same points: fn is called once per point, not once per block, and the diagnoses
    are those of probing each block on its own."""
    import agcheck.core.report_filling as collect

    calls = []
    # 48 elements: the two blocks' probe budget holds two rows each (probe_rows)
    if case == "factor":
        x = make(48, seed=3)

        def fn(t):
            calls.append(1)
            return _ScaledExpPair.apply(t)
        monkeypatch.setattr(_ScaledExpPair, "factor", 1.1)
    else:
        x = _away_from_zero_but(48, [0, 2])

        def fn(t):
            calls.append(1)
            return _pair_relu(t)

    def report(shared):
        monkeypatch.setattr(collect, "SHARED_OUTPUT_ELEMENTS", 32768 if shared else 0)
        calls.clear()
        with pytest.raises(GradcheckError) as info:
            agcheck.gradcheck(fn, (x,), engine="reference")
        return info.value.report, len(calls)

    alone, calls_alone = report(shared=False)
    together, calls_together = report(shared=True)
    assert [(b.output, b.input) for b in together.blocks] == [(0, 0), (1, 0)]
    assert [(d.kind, d.message, d.evidence) for d in together.diagnoses] == \
        [(d.kind, d.message, d.evidence) for d in alone.diagnoses]
    assert kinds(together) == [case, case]
    # each block probes two rows (the kink's two zeros; the factor's two worst entries)
    assert probes.probe_rows(48, 2) == 2
    # the second block's points and x, all shared; unshared, each block also calls fn at x
    # once more to see whether fn gives the check's output there again
    assert calls_alone - calls_together == 6 * 2 + 1 + 2


class _WeightedSinPair(torch.autograd.Function):
    """``(sin(x), w * sin(x))``, ``w`` weighting other elements than ``|cos(x)|`` does, with
    a backward scaled by ``factor`` (1: correct)."""

    factor = 1.0

    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return x.sin(), w * x.sin()

    @staticmethod
    def backward(ctx, g0, g1):
        x, w = ctx.saved_tensors
        return (g0 + w * g1) * x.cos() * _WeightedSinPair.factor, None


@pytest.mark.parametrize("factor", [1.0, 1.1], ids=["right backward", "wrong backward"])
def test_a_second_block_failing_in_the_rows_already_probed_probes_only_those(factor, monkeypatch):
    """The second output's worst rows are not the first's, but it fails in the first's
    rows too: its entries there are probed, at no new evaluation of fn."""
    import agcheck.core.report_filling as collect

    monkeypatch.setattr(_WeightedSinPair, "factor", factor)
    x = make(48, seed=3)
    w = 1.0 / (x.detach().cos() ** 2 + 0.01)  # |w cos(x)| is largest where |cos(x)| is 0.1
    calls = []

    def fn(t):
        calls.append(1)
        return _WeightedSinPair.apply(t, w)

    if factor == 1.0:
        assert agcheck.gradcheck(fn, (x,)) and torch.autograd.gradcheck(fn, (x,))
        return

    def report(shared):
        monkeypatch.setattr(collect, "SHARED_OUTPUT_ELEMENTS", 32768 if shared else 0)
        assert agcheck.gradcheck(fn, (x,), engine="reference", raise_exception=False) is False
        checked = len(calls)
        with pytest.raises(GradcheckError) as info:
            agcheck.gradcheck(fn, (x,), engine="reference")
        return info.value.report, len(calls) - 2 * checked

    rep, probing = report(shared=True)
    assert kinds(rep) == ["factor", "factor"]
    first, second = (sorted(set(np.argsort(-np.abs(b.analytical - b.numerical).max(axis=1))[:2].tolist()))
                     for b in rep.blocks)
    assert first != second  # the blocks' own worst rows differ
    assert probes.probe_rows(48, 2) == 2
    assert probing == 6 * 2 + 1  # the first block's two rows and x; nothing for the second
    calls.clear()
    alone, probing_alone = report(shared=False)  # unshared points are not free: each block its own rows
    assert kinds(alone) == ["factor", "factor"]
    assert probing_alone == 2 * (6 * 2 + 1) + 2


@pytest.mark.parametrize("factor", [1.0, 1.1], ids=["right backward", "wrong backward"])
@pytest.mark.parametrize("n, rows", [(5, 1), (30, 2), (48, 4), (400, 4)])
def test_the_probes_cost_at_most_a_quarter_of_the_checks_evaluations(n, rows, factor, monkeypatch):
    """A failing check's step-size probes re-evaluate at most ``PROBE_SHARE`` of the
    evaluations of fn the check made (two per element), one row at least and four at most,
    each row six evaluations of fn, and fn at the input once."""
    from .helpers import ScaledSin
    monkeypatch.setattr(ScaledSin, "factor", factor)
    calls = []

    def fn(t):
        calls.append(1)
        return ScaledSin.apply(t)

    x = make(n, seed=5)
    assert agcheck.gradcheck(fn, (x,), engine="reference", raise_exception=False) == (factor == 1.0)
    checked = len(calls)
    calls.clear()
    if factor == 1.0:
        assert agcheck.gradcheck(fn, (x,), engine="reference") and len(calls) == checked
        return
    with pytest.raises(GradcheckError) as info:
        agcheck.gradcheck(fn, (x,), engine="reference")
    assert kinds(info.value.report) == ["factor"]
    assert probes.probe_rows(n) == rows
    assert len(calls) - checked == 6 * rows + 1
    assert 6 * rows <= max(6, probes.PROBE_SHARE * 2 * n)


def test_the_probe_budget_is_shared_by_the_blocks_of_an_input():
    assert [probes.probe_rows(n) for n in (1, 11, 12, 24, 36, 48, 10**6)] == [1, 1, 1, 2, 3, 4, 4]
    assert [probes.probe_rows(n, 2) for n in (1, 24, 36, 48, 96)] == [1, 1, 1, 2, 4]


def test_the_pair_with_a_correct_backward_passes():
    # the other half of the test above: the same function with its true backward
    assert agcheck.gradcheck(_ScaledExpPair.apply, (make(5, seed=3),), engine="reference")
    assert torch.autograd.gradcheck(_ScaledExpPair.apply, (make(5, seed=3),))


@pytest.mark.parametrize("factor", [1.0, 1.1], ids=["right backward", "wrong backward"])
def test_raise_exception_false_builds_no_report_of_the_other_blocks(factor, monkeypatch):
    """With ``raise_exception=False`` no report is seen: the failing block's verdict is
    reached with the backward passes torch's checker makes (one output's columns, twice
    for the reentrancy check), not those the report's other blocks would need."""
    monkeypatch.setattr(_ScaledExpPair, "factor", factor)
    passes = []
    original = _ScaledExpPair.backward
    monkeypatch.setattr(_ScaledExpPair, "backward",
                        staticmethod(lambda ctx, g0, g1: (passes.append(1), original(ctx, g0, g1))[1]))
    x = make(5, seed=3)

    def count(check, **kw):
        passes.clear()
        verdict = check(_ScaledExpPair.apply, (x,), raise_exception=False, **kw)
        return verdict, len(passes)

    torch_verdict, torch_passes = count(torch.autograd.gradcheck)
    assert count(agcheck.gradcheck, engine="reference") == (torch_verdict, torch_passes)
    assert torch_verdict is (factor == 1.0)
    if factor != 1.0:
        passes.clear()
        with pytest.raises(GradcheckError) as info:
            agcheck.gradcheck(_ScaledExpPair.apply, (x,), engine="reference")
        assert len(info.value.report.blocks) == 2 and len(passes) > torch_passes


# -- a double input whose function rounds inside ----------------------------------------------

def _both_pass(fn, x):
    assert agcheck.gradcheck(fn, (x,)) and torch.autograd.gradcheck(fn, (x,))


def _torch_fails_too(fn, x) -> FailureReport:
    """agcheck's report on a check that torch's checker fails as well."""
    with pytest.raises(RuntimeError):
        torch.autograd.gradcheck(fn, (x,))
    return failure(fn, (x,))


def _rounded_inside(dtype):
    """The identity, computed in ``dtype`` inside (as a float32 model fed float64 inputs)."""
    return lambda t: t.to(dtype).to(t.dtype)


@pytest.mark.parametrize("inner", [torch.float32, "float32 output", torch.float64],
                         ids=["float32 inside", "float32 output", "double throughout"])
def test_a_double_input_rounded_to_float32_inside_is_named_precision_not_kink(inner):
    x = make(60, seed=7)
    fn = (lambda t: t.float()) if inner == "float32 output" else _rounded_inside(inner)
    if inner == torch.float64:  # the other half: the same function in double passes both checkers
        return _both_pass(fn, x)
    rep = _torch_fails_too(fn, x)
    assert kinds(rep) == ["precision"]
    d = the(rep, "precision")
    assert "holds only float32 values" in d.message and "torch.float64" in d.message
    assert d.evidence["output_float32_valued"] is True and rep.blocks[0].output_float32_valued is True


def test_a_clamp_to_short_constants_is_not_taken_for_rounding_inside():
    # hardtanh to ±0.5 of inputs far outside: every output is ±0.5, a float32 value; with a
    # backward that is wrong at one entry the diagnosis is the zero numerical Jacobian
    x = torch.tensor([-4.8, 7.4, -0.9, 5.6] * 3, dtype=torch.float64, requires_grad=True)

    class Clamped(torch.autograd.Function):
        @staticmethod
        def forward(ctx, t):
            return torch.nn.functional.hardtanh(t, -0.5, 0.5)

        @staticmethod
        def backward(ctx, g):
            out = torch.zeros_like(g)
            out[0] = g[0]  # the true derivative is zero everywhere here
            return out

    assert agcheck.gradcheck(lambda t: torch.nn.functional.hardtanh(t, -0.5, 0.5), (x,))
    rep = failure(Clamped.apply, (x,))
    assert rep.blocks[0].output_float32_valued is False
    assert kinds(rep) != ["precision"] and "precision" not in kinds(rep)


def test_a_double_input_rounded_to_half_inside_is_named_precision_not_zero_numerical():
    # half's resolution at 1 to 3 (about 1e-3) swallows steps of 1e-6 and 1e-5: the
    # numerical Jacobian is exactly zero
    x = torch.linspace(1.0, 3.0, 20, dtype=torch.float64).requires_grad_()
    rep = failure(_rounded_inside(torch.float16), (x,))
    assert kinds(rep) == ["precision"]
    assert "moves none of its outputs" in the(rep, "precision").message


def test_a_kink_stays_a_kink_when_fn_rounds_to_float32_inside():
    # relu at 0 in float32, plus float32's 0.3 (so that the outputs hold float32 values
    # with long mantissas): the one-sided gap is the same at eps and eps/10, as at any kink
    x = torch.zeros(8, dtype=torch.float64, requires_grad=True)
    rep = failure(lambda t: (torch.relu(t.float()) + 0.3).double(), (x,))
    assert kinds(rep) == ["kink"] and rep.blocks[0].output_float32_valued is True


def test_float32_valued_outputs_are_told_from_double_ones():
    from agcheck.report.values import float32_valued
    g = np.random.default_rng(0)
    a = g.standard_normal(100)
    assert not float32_valued(a)
    assert float32_valued(a.astype(np.float32).astype(np.float64))
    assert not float32_valued(np.arange(10.0))  # integers say nothing
    assert not float32_valued(np.array([0.5, -0.5, 0.75, 3.0]))  # nor constants a clamp returns
    assert float32_valued(a.astype(np.float16).astype(np.float64))
    assert float32_valued(a.astype(np.float32)) and float32_valued(a.astype(np.complex64))  # lower precision
    assert not float32_valued(np.arange(3))  # integer outputs say nothing
    c = (a + 1j * a[::-1]).astype(np.complex64).astype(np.complex128)
    assert float32_valued(c[::2]) and not float32_valued((a + 1j * a[::-1])[::2])


# -- a function that is not deterministic -----------------------------------------------------

@pytest.mark.parametrize("training", [True, False], ids=["dropout on", "dropout off"])
def test_dropout_in_training_mode_is_named_not_a_kink(training):
    x = make(8, seed=9)

    def fn(t):
        return torch.nn.functional.dropout(t.sin(), 0.5, training=training)

    if not training:  # the other half: the same function, deterministic, passes both checkers
        return _both_pass(fn, x)
    rep = _torch_fails_too(fn, x)
    assert kinds(rep) == ["nondeterministic_fn"]
    d = the(rep, "nondeterministic_fn")
    assert "different outputs on identical calls" in d.message and "model.eval()" in d.message
    assert d.evidence["max_abs_difference"] > 0


@pytest.mark.parametrize("shared", [True, False], ids=["probes' call reused", "one call more"])
def test_state_that_changes_between_calls_is_named(shared, monkeypatch):
    # a counter inside fn; where outputs are too large for the probes to keep their points,
    # the repeat costs one call of fn
    import agcheck.core.report_filling as collect
    monkeypatch.setattr(collect, "SHARED_OUTPUT_ELEMENTS", 32768 if shared else 0)
    state = {"calls": 0}

    def fn(t):
        state["calls"] += 1
        return t * (1 + 1e-4 * state["calls"])

    rep = failure(fn, (make(8, seed=10),))
    assert kinds(rep) == ["nondeterministic_fn"]


def test_rounding_sized_differences_between_calls_are_not_called_random(monkeypatch):
    # a backward 10% too large, and a forward that varies between calls by 1e-14 relative
    # (as parallel reductions may): the diagnosis is the factor, not randomness
    from .helpers import ScaledSin
    monkeypatch.setattr(ScaledSin, "factor", 1.1)
    g = torch.Generator().manual_seed(11)

    def fn(t):
        return ScaledSin.apply(t) * (1 + 1e-14 * torch.rand(t.shape, dtype=t.dtype, generator=g))

    rep = failure(fn, (make(8, seed=11),))
    assert kinds(rep) == ["factor"]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bfloat16", "half"])
def test_a_low_precision_output_of_a_double_input_keeps_its_block_and_is_named(dtype):
    # NumPy has no bfloat16: the block is recorded from exactly widened values
    rep = failure(lambda t: t.to(dtype), (make(6, seed=12),))
    assert not rep.notes and len(rep.blocks) == 1
    assert rep.blocks[0].output_float32_valued is True and kinds(rep) == ["precision"]
