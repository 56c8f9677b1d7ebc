"""Element-by-element numerical Jacobians combine their differences a chunk at a time
(agcheck.core.held_differences): the same bits as one element at a time, fewer array
operations per element."""
import numpy as np
import pytest
import torch

import agcheck
from torch.autograd.gradcheck import GradcheckError
from agcheck.core import held_differences
from agcheck.core import jacobian as jac
from agcheck.stencil import STENCILS

from .helpers import Square

N = 2 * held_differences.HELD_ELEMENTS + 7  # two full chunks and a partial one


def _outputs(t):
    """Real outputs of several shapes, a complex one (combined element by element), an
    integer, a bool and a non-array."""
    s = torch.sin(t)
    # the complex output from a dtype with a complex counterpart (torch 2.14 makes bfloat16
    # times a complex scalar a complex bfloat16, which has no multiplication on the CPU)
    c = s[:4].to(torch.promote_types(s.dtype, torch.float32)) * (1 + 2j)
    return (s.sum() * 3.7, torch.outer(s[:3], t[:5]).exp(), c.cumsum(0), (t > 0).sum(), t > 0.5, "label")


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("stencil", sorted(STENCILS))
def test_held_rows_hold_the_same_bits_as_rows_combined_one_element_at_a_time(dtype, stencil):
    be = agcheck.get_backend("torch")
    x = torch.randn(N, dtype=torch.float64).to(dtype).requires_grad_()
    eps = 1e-2 if dtype != torch.float64 else 1e-6
    outputs = _outputs(x)
    held = jac.numerical_jacobians(be, _outputs, (x,), 0, outputs, eps, STENCILS[stencil])
    assert sorted(held) == [0, 1, 2]
    for k, matrix in held.items():
        one_by_one = jac.numerical_rows(be, _outputs, (x,), 0, k, range(N), eps, STENCILS[stencil])
        expected = torch.stack(one_by_one).to(matrix.dtype)
        assert matrix.shape == expected.shape and matrix.dtype == expected.dtype
        assert torch.equal(torch.view_as_real(matrix) if matrix.is_complex() else matrix,
                           torch.view_as_real(expected) if expected.is_complex() else expected), k


def test_fewer_array_operations_per_element(monkeypatch):
    """One combination per chunk of elements, not one per element."""
    be = agcheck.get_backend("torch")
    x = torch.randn(N, dtype=torch.float64, requires_grad=True)
    combined = []
    central = STENCILS["central"]
    original = type(central).combine
    monkeypatch.setattr(type(central), "combine", lambda self, values, eps: (combined.append(values[0].shape),
                                                                            original(self, values, eps))[1])
    jac.numerical_jacobians(be, lambda t: torch.sin(t).sum(), (x,), 0, (torch.sin(x).sum(),), 1e-6)
    assert [s[0] for s in combined] == [held_differences.HELD_ELEMENTS] * 2 + [7]


def test_an_output_that_changes_shape_between_elements_starts_a_new_chunk():
    """Rows of each shape are combined apart (the rows then report the change, as before)."""
    be = agcheck.get_backend("torch")
    from agcheck.core.row_block import RowBlock

    chunks = []

    class Recording(RowBlock):
        def add_rows(self, rows):
            chunks.append(tuple(rows.shape))
            super().add_rows(rows)

    held = held_differences.HeldDifferences(be, STENCILS["central"], 0.5, {0: Recording(be, 4, 3, torch.zeros(3),
                                                                                        torch.float64)})
    for n in (3, 3, 2, 2):
        held.add([(torch.zeros(n, dtype=torch.float64),), (torch.ones(n, dtype=torch.float64),)])
    held.flush()
    assert chunks == [(2, 3), (2, 2)]


@pytest.mark.parametrize("factor, passes", [(1.0, True), (1.025, False)])
def test_a_loop_of_held_differences_passes_a_right_backward_and_fails_a_wrong_one(monkeypatch, factor, passes):
    """x * x through a custom Function without functorch support: nothing batches it,
    every element is moved and evaluated on its own."""
    monkeypatch.setattr(Square, "factor", factor)
    x = torch.linspace(-1, 1, 3 * held_differences.HELD_ELEMENTS, dtype=torch.float64, requires_grad=True)

    def fn(t):
        return Square.apply(t).sum()

    assert agcheck.gradcheck(fn, (x,), raise_exception=False) is passes
    assert torch.autograd.gradcheck(fn, (x,), raise_exception=False) is passes
    if not passes:
        with pytest.raises(GradcheckError, match="Jacobian mismatch for output 0"):
            agcheck.gradcheck(fn, (x,))


def test_numpy_rows_are_held_too():
    be = agcheck.get_backend("numpy")
    x = np.linspace(-1.0, 1.0, N)

    def fn(t):
        return np.sin(t).cumsum()

    held = jac.numerical_jacobians(be, fn, (x,), 0, (fn(x),), 1e-6)[0]
    one_by_one = np.stack(jac.numerical_rows(be, fn, (x,), 0, 0, range(N), 1e-6, STENCILS["central"]))
    assert np.array_equal(held, one_by_one)
