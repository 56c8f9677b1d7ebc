"""Fast-mode gradgradchecks of small functions: what each checker costs per call.

A dozen-element gradgradcheck in fast mode calls the VJP function six or seven times;
what differs between the checkers is their own work around those calls (agcheck's forward
memo digests the inputs to reuse forwards, which pays only where forwards cost more than
digests). Alternates torch's checker and agcheck on each case in one process and prints
the medians of their CPU times and of the ratios.

    python bench/small_gradgrad.py [--repeat 61]
"""
from __future__ import annotations

import argparse
import statistics

import torch
import torch.nn.functional as F

import agcheck
from alternation import alternated, median_ratio

VARIANTS = {
    "rev-over-rev": dict(check_fwd_over_rev=False, check_rev_over_rev=True),
    "fwd-over-rev": dict(check_fwd_over_rev=True, check_rev_over_rev=False, check_undefined_grad=False),
}


def _cases():
    def leaf(*shape, seed):
        g = torch.Generator().manual_seed(seed)
        return torch.randn(*shape, dtype=torch.float64, generator=g).requires_grad_()

    x, y, image = leaf(3, 4, seed=1), leaf(3, 4, seed=2), leaf(1, 2, 3, 6, seed=3)
    return {
        "sin 3x4": (torch.sin, (x,)),
        "mul 3x4": (torch.mul, (x, y)),
        "max_pool2d 1x2x3x6": (lambda t: F.max_pool2d(t, kernel_size=3, stride=2, ceil_mode=True), (image,)),
        "adaptive_max_pool2d": (lambda t: F.adaptive_max_pool2d(t, (2, 3)), (image,)),
        "masked_fill 1x2x3x6": (lambda t: t.masked_fill(t > 0, 10.0), (image,)),
    }


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=61, help="alternations of the two checkers per case")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    print(f"fast-mode gradgradcheck, median of {args.repeat} alternations (CPU ms)")
    for variant, options in VARIANTS.items():
        for name, (fn, inputs) in _cases().items():
            times = alternated({side: (lambda check=check: check(fn, inputs, fast_mode=True, **options))
                                for side, check in (("torch", torch.autograd.gradgradcheck),
                                                    ("agcheck", agcheck.gradgradcheck))}, args.repeat)
            torch_s, agcheck_s = times["torch"], times["agcheck"]
            print(f"  {variant:13s} {name:20s} torch {statistics.median(torch_s) * 1e3:6.3f}  "
                  f"agcheck {statistics.median(agcheck_s) * 1e3:6.3f}  ratio {median_ratio(torch_s, agcheck_s):.2f}x")


if __name__ == "__main__":
    main()
