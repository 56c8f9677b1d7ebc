"""Concurrent checks on different inputs give the same verdicts as one at a time."""
from concurrent.futures import ThreadPoolExecutor

import torch

import agcheck

from .helpers import make


class Scaled(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, factor):
        ctx.save_for_backward(x)
        ctx.factor = factor
        return x.tanh()

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * (1 - x.tanh() ** 2) * ctx.factor, None


def check(job):
    seed, factor, fast = job
    x = make(30, seed=seed)
    return agcheck.gradcheck(lambda t: Scaled.apply(t, factor), (x,), fast_mode=fast, raise_exception=False)


def test_threads_give_the_sequential_verdicts():
    jobs = [(seed, 1.0 if seed % 2 else 1.5, bool(seed % 3)) for seed in range(16)]
    expected = [check(j) for j in jobs]
    assert expected.count(True) == 8 and expected.count(False) == 8
    with ThreadPoolExecutor(max_workers=4) as pool:
        got = list(pool.map(check, jobs))
    assert got == expected
