"""Failing checks of small functions: what each checker costs per failure.

On a millisecond check that fails, torch's checker formats its message and raises; agcheck
formats the same message and adds its report: the failing block's statistics and worst
entries, and a diagnosis that re-evaluates up to four of the worst entries with other
steps (six calls of ``fn`` per input element probed, and one at the input itself; at most
a quarter of the check's own calls, one element at least). This
prints, for a few small failures, the medians of torch's checker's CPU time, agcheck's,
and agcheck's with ``raise_exception=False`` (the verdict alone: no report is built), alternating the checkers
in one process.

    python bench/small_failures.py [--repeat 41]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch

import agcheck
from alternation import alternated, median_ratio

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tests.helpers import ScaledSin  # noqa: E402 - sin with a scaled backward, as a custom Function


def _cases():
    def leaf(n, seed):
        g = torch.Generator().manual_seed(seed)
        return torch.randn(n, dtype=torch.float64, generator=g).requires_grad_()

    ScaledSin.factor = 1.1  # a backward 10% too large
    zeros = torch.zeros(5, dtype=torch.float64, requires_grad=True)
    both = dict(check_fwd_over_rev=True, check_rev_over_rev=True)

    def pair(t):  # two outputs, both wrong: two failing blocks of one input
        y = ScaledSin.apply(t)
        return y, 2 * y

    return {
        "wrong sin n=5, slow": ("gradcheck", ScaledSin.apply, (leaf(5, 1),), {}),
        "wrong sin n=5, fast": ("gradcheck", ScaledSin.apply, (leaf(5, 1),), {"fast_mode": True}),
        "wrong sin n=50, slow": ("gradcheck", ScaledSin.apply, (leaf(50, 2),), {}),
        "wrong sin n=50, fast": ("gradcheck", ScaledSin.apply, (leaf(50, 2),), {"fast_mode": True}),
        "wrong (sin, 2 sin) n=5, slow": ("gradcheck", pair, (leaf(5, 1),), {}),
        "norm at 0, gradgradcheck": ("gradgradcheck", torch.linalg.norm, (zeros,), both),
    }


def _failing(check, fn, args, options):
    def call():
        try:
            check(fn, args, **options)
        except RuntimeError:  # the failure is the point (GradcheckError is a RuntimeError)
            pass

    return call


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=41, help="alternations of the checkers per case")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    print(f"failing checks, median of {args.repeat} alternations (CPU ms); every call fails under both checkers")
    for name, (kind, fn, inputs, options) in _cases().items():
        reference, ours = getattr(torch.autograd, kind), getattr(agcheck, kind)
        silent = dict(options, raise_exception=False)
        assert reference(fn, inputs, raise_exception=False, **options) is False
        assert ours(fn, inputs, **silent) is False
        times = alternated({"torch": _failing(reference, fn, inputs, options),
                            "agcheck": _failing(ours, fn, inputs, options),
                            "silent": _failing(ours, fn, inputs, silent)}, args.repeat)
        torch_s, agcheck_s, verdict_s = times["torch"], times["agcheck"], times["silent"]
        print(f"  {name:26s} torch {statistics.median(torch_s) * 1e3:6.2f}  agcheck {statistics.median(agcheck_s) * 1e3:6.2f}"
              f" ({median_ratio(torch_s, agcheck_s):.2f}x)  raise_exception=False {statistics.median(verdict_s) * 1e3:6.2f}"
              f" ({median_ratio(torch_s, verdict_s):.2f}x)")


if __name__ == "__main__":
    main()
