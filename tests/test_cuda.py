"""The same checks on a CUDA device; skipped where none is present."""
import pytest
import torch

import agcheck

from .helpers import ScaledSin, Snapshot, make

pytestmark = pytest.mark.cuda


@pytest.mark.parametrize("fast_mode", [False, True])
def test_cuda_correct_and_broken(fast_mode):
    x = make(50, device="cuda")
    snap = Snapshot([x])
    cuda_rng = torch.cuda.get_rng_state()
    assert agcheck.gradcheck(lambda t: t.sin() * 2, (x,), fast_mode=fast_mode, check_batched_grad=True)
    ScaledSin.factor = 2.0
    try:
        assert not agcheck.gradcheck(ScaledSin.apply, (x,), fast_mode=fast_mode, raise_exception=False)
    finally:
        ScaledSin.factor = 1.0
    snap.assert_unchanged()
    assert torch.equal(torch.cuda.get_rng_state(), cuda_rng)


def test_cuda_gradgradcheck_and_forward():
    z = make(8, dtype=torch.complex128, device="cuda")
    assert agcheck.gradcheck(lambda t: t.exp() * t.conj(), (z,), check_forward_ad=True)
    assert agcheck.gradgradcheck(lambda t: t.exp() * t.conj(), (z,))
