"""Rows computed one at a time are written into one block (agcheck.core.row_block): the
same arrays as stacking them, without small long-lived allocations between fn's calls."""
import numpy as np
import pytest
import torch

import agcheck
from agcheck.core import jacobian as jac
from agcheck.core import row_block
from agcheck.core.row_block import PENDING_ROWS, RowBlock


@pytest.fixture(autouse=True)
def _blocks_at_any_size(request, monkeypatch):
    """The block path at the small sizes these tests use (small blocks are stacked)."""
    if "small_block" not in request.node.name:
        monkeypatch.setattr(row_block, "SMALL_BLOCK_ENTRIES", 0)


def _rows(n, m, dtype=torch.float64):
    g = torch.Generator().manual_seed(3)
    return [torch.randn(m, dtype=dtype, generator=g) for _ in range(n)]


@pytest.mark.parametrize("n", [0, 1, PENDING_ROWS, PENDING_ROWS + 5, 3 * PENDING_ROWS])
def test_torch_rows_land_in_one_block_equal_to_their_stack(n):
    be = agcheck.get_backend("torch")
    like = torch.zeros(7, dtype=torch.float64)
    rows = _rows(n, 7)
    block = RowBlock(be, n, 7, like, torch.float64)
    for r in rows:
        block.add(r)
    got = block.result()
    assert got.shape == (n, 7) and got.dtype == torch.float64
    if n:
        assert torch.equal(got, torch.stack(rows))
        assert got.is_contiguous() and got._base is None  # the block itself, not a stack of pieces


def test_rows_are_converted_to_the_block_dtype():
    be = agcheck.get_backend("torch")
    rows = _rows(3, 4, torch.float32)
    block = RowBlock(be, 3, 4, torch.zeros(4), torch.float64)
    for r in rows:
        block.add(r)
    assert torch.equal(block.result(), torch.stack(rows).double())


def test_fewer_rows_than_announced_give_only_those():
    be = agcheck.get_backend("torch")
    rows = _rows(PENDING_ROWS + 2, 5)
    block = RowBlock(be, 2 * PENDING_ROWS, 5, torch.zeros(5, dtype=torch.float64), torch.float64)
    for r in rows:
        block.add(r)
    assert torch.equal(block.result(), torch.stack(rows))


def test_a_row_of_another_length_is_left_to_the_stack_to_report():
    be = agcheck.get_backend("torch")
    rows = _rows(PENDING_ROWS + 1, 5)
    block = RowBlock(be, PENDING_ROWS + 2, 5, torch.zeros(5, dtype=torch.float64), torch.float64)
    for r in rows:
        block.add(r)
    block.add(torch.zeros(6, dtype=torch.float64))
    with pytest.raises(RuntimeError, match="stack expects each tensor to be equal size"):
        block.result()


def test_numpy_rows_land_in_one_block():
    be = agcheck.get_backend("numpy")
    rows = [np.arange(4.0) + k for k in range(PENDING_ROWS + 3)]
    block = RowBlock(be, len(rows), 4, np.zeros(4), np.float64)
    for r in rows:
        block.add(r)
    assert np.array_equal(block.result(), np.stack(rows))


def test_an_immutable_backend_stacks_its_rows():
    jnp = pytest.importorskip("jax.numpy")
    be = agcheck.get_backend("jax")
    like = jnp.zeros(3)
    assert be.row_block(2, 3, like, like.dtype) is None
    block = RowBlock(be, 2, 3, like, like.dtype)
    block.add(jnp.ones(3))
    block.add(jnp.arange(3.0))
    assert np.array_equal(np.asarray(block.result()), np.stack([np.ones(3), np.arange(3.0)]))


def test_the_numerical_jacobian_is_written_block_by_block(monkeypatch):
    """The element-by-element Jacobian goes through write_rows (a few rows at a time),
    never through one stack of every row, and is the same matrix."""
    be = agcheck.get_backend("torch")
    x = torch.randn(3 * PENDING_ROWS, dtype=torch.float64, requires_grad=True)

    def fn(t):
        return torch.sin(t).cumsum(0)[::2]

    writes, stacks = [], []
    xp = be.xp(x)  # the core's algebra: the backend's namespace for torch tensors
    original_write, original_stack = type(be).write_rows, xp.stack
    monkeypatch.setattr(type(be), "write_rows", lambda self, b, s, r: (writes.append(len(r)),
                                                                      original_write(self, b, s, r))[1])
    monkeypatch.setattr(xp, "stack", lambda a, axis=0: (stacks.append(len(a)), original_stack(a, axis=axis))[1])
    outputs = (fn(x),)
    got = jac.numerical_jacobians(be, fn, (x,), 0, outputs, 1e-6)[0]
    assert writes == [PENDING_ROWS] * 3
    assert all(k < x.numel() for k in stacks)  # no stack of all the rows
    expected = torch.autograd.functional.jacobian(fn, x.detach()).T
    assert torch.allclose(got, expected, atol=1e-7)


def test_a_check_through_row_blocks_still_catches_a_wrong_backward():
    class Wrong(torch.autograd.Function):
        @staticmethod
        def forward(ctx, t):
            ctx.save_for_backward(t)
            return torch.sin(t).cumsum(0)

        @staticmethod
        def backward(ctx, g):
            (t,) = ctx.saved_tensors
            return g.flip(0).cumsum(0).flip(0) * torch.cos(t) * 1.01

    def right(t):
        return torch.sin(t).cumsum(0)

    x = torch.randn(2 * PENDING_ROWS + 3, dtype=torch.float64, requires_grad=True)
    for engine in ("reference", "auto"):
        assert agcheck.gradcheck(right, (x,), engine=engine)
        assert agcheck.gradcheck(right, (x,), engine=engine, check_forward_ad=True, check_backward_ad=False)
        assert not agcheck.gradcheck(Wrong.apply, (x,), engine=engine, raise_exception=False)


def test_a_small_block_is_stacked_at_the_end_and_equal(monkeypatch):
    be = agcheck.get_backend("torch")
    n, m = 5, 7
    assert n * m < row_block.SMALL_BLOCK_ENTRIES
    writes = []
    monkeypatch.setattr(type(be), "write_rows", lambda self, b, s, r: writes.append(len(r)))
    rows = _rows(n, m, torch.float32)
    block = RowBlock(be, n, m, torch.zeros(m), torch.float64)
    for r in rows:
        block.add(r)
    got = block.result()
    assert writes == []
    assert got.dtype == torch.float64 and torch.equal(got, torch.stack(rows).double())


@pytest.mark.parametrize("backend", ["torch", "numpy"])
def test_rows_computed_in_one_array_are_kept_as_that_array_and_views_are_copied(backend):
    from agcheck.core.numerical_rows import InputRows

    be = agcheck.get_backend(backend)
    whole = torch.arange(12.0, dtype=torch.float64).reshape(4, 3)
    if backend == "numpy":
        whole = whole.numpy().copy()
    store = InputRows(be, 4)
    store.add(0, 4, {"whole": whole, "view": whole[:, :2]}, exact=False)
    assert store.numpy()["whole"] is whole or np.shares_memory(store.numpy()["whole"], be.to_numpy(whole))
    # a view into a larger array: kept as a copy, not the array it views
    bigger = whole[:, :2]
    kept = store.rows(0, 4)["view"]
    assert np.array_equal(be.to_numpy(kept), be.to_numpy(bigger))
    bigger[0, 0] = -1.0
    assert be.to_numpy(kept)[0, 0] == 0.0
    parts = InputRows(be, 4)
    parts.add(0, 2, {0: whole[:2]}, exact=False)
    parts.add(2, 4, {0: whole[2:]}, exact=False)
    assert np.array_equal(parts.numpy()[0], be.to_numpy(whole))
