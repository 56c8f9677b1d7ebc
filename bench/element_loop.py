"""The element-by-element loop: slow-mode checks of a function nothing batches.

A scalar function of N inputs through a custom autograd Function without ``setup_context``
(``vmap`` refuses it, and its one output has no first dimension to stack): both checkers
move every element alone, 2 N + 1 calls of ``fn``, and what differs is each checker's own
work per element. Prints the median, over alternations in one process, of torch's
checker's CPU time, agcheck's, and their ratio, with the time of the calls of ``fn`` alone
and so each checker's own work per element. ``--e3nn`` checks e3nn's ``soft_unit_step``
(the case from its suite) where e3nn is installed.

    python bench/element_loop.py [--n 1000] [--repeat 21] [--e3nn]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch

import agcheck
from alternation import alternated, cpu_seconds, median_ratio

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tests.helpers import Square  # noqa: E402 - x * x as a custom Function without setup_context


def _function(e3nn: bool):
    if e3nn:
        from e3nn.math import soft_unit_step

        return lambda t: soft_unit_step(t).sum()
    return lambda t: Square.apply(t).sum()


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1000, help="elements of the input")
    ap.add_argument("--repeat", type=int, default=21, help="alternations of the two checkers")
    ap.add_argument("--e3nn", action="store_true", help="e3nn's soft_unit_step instead of x * x")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    fn = _function(args.e3nn)
    x = torch.linspace(-1, 1, args.n, dtype=torch.float64, requires_grad=True)
    checkers = {"torch": torch.autograd.gradcheck, "agcheck": agcheck.gradcheck}
    times = alternated({name: (lambda check=check: check(fn, (x,), check_undefined_grad=False))
                        for name, check in checkers.items()}, args.repeat, warm=3)

    def calls_alone():
        for _ in range(2 * args.n + 1):
            fn(x)

    calls = statistics.median(cpu_seconds(calls_alone) for _ in range(5))
    print(f"{'e3nn soft_unit_step' if args.e3nn else 'custom Function x * x'}, summed, n = {args.n}, "
          f"median of {args.repeat} alternations (CPU ms)")
    print(f"  {2 * args.n + 1} calls of fn alone: {calls * 1e3:.1f} ms")
    for name in checkers:
        median = statistics.median(times[name])
        print(f"  {name:8s} {median * 1e3:7.1f} ms   own work per element {(median - calls) / args.n * 1e6:5.1f} us")
    print(f"  ratio torch / agcheck (median of the alternations): {median_ratio(times['torch'], times['agcheck']):.2f}x")


if __name__ == "__main__":
    main()
