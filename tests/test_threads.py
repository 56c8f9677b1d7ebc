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


class ScaledForward(torch.autograd.Function):
    """tanh with a forward-mode derivative scaled by ``factor`` (1.0: correct)."""

    @staticmethod
    def forward(ctx, x, factor):
        ctx.save_for_forward(x)
        ctx.factor = factor
        return x.tanh()

    @staticmethod
    def jvp(ctx, t, _):
        (x,) = ctx.saved_tensors
        return t * (1 - x.tanh() ** 2) * ctx.factor

    @staticmethod
    def backward(ctx, g):
        raise AssertionError("reverse mode is not checked here")


def check_forward(job):
    seed, factor = job
    x = make(20, seed=seed)
    return agcheck.gradcheck(lambda t: ScaledForward.apply(t, factor), (x,), check_forward_ad=True,
                             check_backward_ad=False, check_undefined_grad=False, raise_exception=False)


def test_forward_mode_checks_in_eight_threads_give_the_sequential_verdicts():
    # torch keeps one forward-AD level per process; agcheck's forward-mode work takes turns
    jobs = [(seed, 1.0 if seed % 2 else 1.5) for seed in range(16)]
    expected = [check_forward(j) for j in jobs]
    assert expected.count(True) == 8 and expected.count(False) == 8
    with ThreadPoolExecutor(max_workers=8) as pool:
        got = list(pool.map(check_forward, jobs))
    assert got == expected


def test_concurrent_batched_checks_leave_the_warning_filters_as_they_were():
    import warnings

    def batched(job):
        seed, factor = job
        x = make(12, seed=seed)
        return agcheck.gradcheck(lambda t: Scaled.apply(t, factor), (x,), check_batched_grad=True,
                                 raise_exception=False)

    jobs = [(seed, 1.0 if seed % 2 else 1.5) for seed in range(16)]
    batched(jobs[1])  # the first batched backward imports modules that add filters of their own
    before = list(warnings.filters)
    with ThreadPoolExecutor(max_workers=8) as pool:
        got = list(pool.map(batched, jobs))
    assert got == [batched(j) for j in jobs]
    assert warnings.filters == before


def test_a_warning_of_fn_shows_as_often_as_under_torchs_checker():
    """Python's default filter shows a warning once per location: agcheck's batched calls
    must not reset that registry (``catch_warnings`` does), so ``fn``'s warning prints no
    more often than under torch's checker."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent("""
        import sys, warnings, torch, agcheck
        def f(x):
            warnings.warn("fn says hello")
            return x.sin()
        x = torch.randn(5, dtype=torch.float64, requires_grad=True)
        checker = agcheck.gradcheck if sys.argv[1] == "agcheck" else torch.autograd.gradcheck
        for _ in range(3):
            checker(f, (x,), check_batched_grad=True)
    """)
    counts = {}
    for who in ("agcheck", "torch"):
        done = subprocess.run([sys.executable, "-c", script, who], capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr
        counts[who] = done.stderr.count("fn says hello")
    assert counts["torch"] >= 1
    assert counts["agcheck"] <= counts["torch"], counts
