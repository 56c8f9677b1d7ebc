"""How deep below ``agcheck.gradcheck`` the checked function runs: user code that walks
the stack (torch.manual_seed does, while CUDA is not initialised) pays for every frame,
and a traceback from inside ``fn`` reads from the top. torch's own checker calls ``fn``
10 frames below its entry point; agcheck stays within 12 on every engine."""
import inspect

import pytest
import torch

import agcheck

MAX_FRAMES = 12


def _deepest_call(**options) -> int:
    depths = []

    def fn(x):
        depths.append(len(inspect.stack(0)))
        return torch.sin(2 * torch.exp(x))

    top = len(inspect.stack(0)) + 1  # this frame's callee: agcheck.gradcheck
    x = torch.randn(50, dtype=torch.float64, requires_grad=True)
    assert agcheck.gradcheck(fn, (x,), **options)
    return max(depths) - top


@pytest.mark.parametrize("options", [{}, {"engine": "reference"}, {"fast_mode": True},
                                     {"check_forward_ad": True, "check_backward_ad": False}],
                         ids=["default", "reference", "fast", "forward"])
def test_fn_runs_at_most_twelve_frames_below_gradcheck(options):
    depth = _deepest_call(**options)
    assert 0 < depth <= MAX_FRAMES, f"fn ran {depth} frames below gradcheck"
