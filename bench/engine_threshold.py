"""Where the engine starts to pay: small slow-mode checks under the reference loop and under
the engine, against the loop's call count that decides between them.

A slow-mode check goes to the reference engine at once when its element-by-element loop
would make fewer than ``agcheck.engine.cost.ENGINE_FROM_CALLS`` calls
(``cost.loop_calls``); from there the engine probes its batched paths. For each case (a
few ops at 10 to 160 elements) and mode (gradcheck, gradcheck with forward mode,
gradgradcheck reverse-over-reverse and forward-over-reverse) this times torch's checker,
agcheck with ``engine="reference"`` and agcheck forcing the engine past the threshold
(``ENGINE_FROM_CALLS = 0``), alternating in one process (median CPU time), and prints
the loop's calls beside them. It ends with what each threshold would give over all the
cases: the total against torch's checker, the geometric mean and the lowest per-case
ratio.

    python bench/engine_threshold.py [--modes gc,gcfwd,ggrev,ggfwd] [--repeat 5] [--json F]
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import time

import torch
import torch.nn.functional as F

import agcheck
from agcheck.checks import loop_plan
from agcheck.engine import cost

THRESHOLDS = (50, 100, 150, 200, 250, 300, 400, 600)


def _leaf(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, dtype=torch.float64, generator=g).requires_grad_()


def _cases() -> dict:
    w = _leaf(32, 32, seed=3).detach()
    kernel = _leaf(2, 1, 3, 3, seed=4).detach()
    index = torch.tensor([0, 3, 5, 7])
    cases = {}
    for n in (10, 20, 40, 80, 160):
        cases[f"sin {n}"] = (torch.sin, (_leaf(n),))
        cases[f"logsumexp {n}"] = (lambda a: a.logsumexp(0), (_leaf(n),))
        cases[f"cumsum {n}"] = (lambda a: a.cumsum(0), (_leaf(n),))
    for n in (3, 4, 6, 8):
        cases[f"matmul {n}x{n}"] = (lambda a, b: a @ b, (_leaf(n, n), _leaf(n, n, seed=1)))
        cases[f"softmax {n}x{n}"] = (lambda a: a.softmax(-1), (_leaf(n, n),))
        cases[f"mlp {n}"] = (lambda a: torch.tanh(a @ w[:a.shape[1], :2 * a.shape[1]]), (_leaf(3, n),))
    for s in (4, 6, 8):
        cases[f"conv {s}x{s}"] = (lambda a: F.conv2d(a, kernel, padding=1), (_leaf(1, 1, s, s),))
        cases[f"max_pool {s}x{s}"] = (lambda a: F.max_pool2d(a, 2), (_leaf(1, 2, s, s),))
    for n in (3, 4, 6):
        cases[f"solve {n}x{n}"] = (lambda a, b: torch.linalg.solve(a + 3 * torch.eye(a.shape[0], dtype=a.dtype), b),
                                   (_leaf(n, n), _leaf(n, 2, seed=1)))
    cases["take 3x3"] = (lambda a: torch.take(a, index), (_leaf(3, 3),))
    cases["take 5x5"] = (lambda a: torch.take(a, index), (_leaf(5, 5),))
    return cases


MODES = {
    "gc": ("gradcheck", {}),
    "gcfwd": ("gradcheck", {"check_forward_ad": True}),
    "ggrev": ("gradgradcheck", {}),
    "ggfwd": ("gradgradcheck", {"check_fwd_over_rev": True, "check_rev_over_rev": False, "check_undefined_grad": False}),
}


class _Estimates:
    """The loop's calls of the pieces a check decided on, as the plan logged them
    (recorded around the check's own decision, which it leaves as it is)."""

    def __init__(self):
        self.seen = []
        self._decide = loop_plan.plan

    def __enter__(self):
        def recorded(run, piece, n_in):
            decided = self._decide(run, piece, n_in)
            self.seen.append(run.engine_log[-1].figures["loop_calls"])
            return decided

        loop_plan.plan = recorded
        return self

    def __exit__(self, *exc):
        loop_plan.plan = self._decide


def _cpu_seconds(check, fn, args, options) -> float:
    start = time.thread_time()
    check(fn, args, **options)
    return time.thread_time() - start


def _engine_forced(check):
    def forced(fn, args, **options):
        shipped, cost.ENGINE_FROM_CALLS = cost.ENGINE_FROM_CALLS, 0
        try:
            return check(fn, args, **options)
        finally:
            cost.ENGINE_FROM_CALLS = shipped

    return forced


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--modes", default=",".join(MODES), help="comma-separated: " + ", ".join(MODES))
    ap.add_argument("--repeat", type=int, default=5, help="alternations per case")
    ap.add_argument("--json", help="write the records to this file")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    records = []
    print("median CPU ms; calls = the loop's, per piece decided")
    for mode in args.modes.split(","):
        kind, options = MODES[mode]
        reference_check, ours = getattr(torch.autograd, kind), getattr(agcheck, kind)
        engine = _engine_forced(ours)
        for name, (fn, inputs) in _cases().items():
            loop_options = dict(options, engine="reference")
            for _ in range(2):  # warm all three
                _cpu_seconds(reference_check, fn, inputs, options)
                _cpu_seconds(ours, fn, inputs, loop_options)
                _cpu_seconds(engine, fn, inputs, options)
            with _Estimates() as estimates:
                _cpu_seconds(ours, fn, inputs, options)
            times = {"torch": [], "loop": [], "engine": []}
            for _ in range(args.repeat):
                times["torch"].append(_cpu_seconds(reference_check, fn, inputs, options))
                times["loop"].append(_cpu_seconds(ours, fn, inputs, loop_options))
                times["engine"].append(_cpu_seconds(engine, fn, inputs, options))
            rec = {"mode": mode, "case": name, "estimates": estimates.seen,
                   **{k: statistics.median(v) for k, v in times.items()}}
            records.append(rec)
            shown = " ".join(str(e) for e in rec["estimates"]) or "-"
            print(f"  {mode:5s} {name:14s} calls {shown:11s} torch {rec['torch'] * 1e3:7.2f}  "
                  f"loop {rec['loop'] * 1e3:7.2f}  engine {rec['engine'] * 1e3:7.2f}  "
                  f"engine/loop {rec['engine'] / rec['loop']:.2f}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(records, f)
    print("\nwith the threshold at T (a check takes the engine when its loop makes T calls or more):")
    for T in THRESHOLDS:
        def chosen(r):
            return r["engine"] if max(r["estimates"], default=0) >= T else r["loop"]

        total = sum(r["torch"] for r in records) / sum(chosen(r) for r in records)
        ratios = [r["torch"] / chosen(r) for r in records]
        geomean = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
        mark = "  (as shipped)" if T == cost.ENGINE_FROM_CALLS else ""
        print(f"  T = {T:4d} calls: total {total:.2f}x torch's checker, geometric mean {geomean:.2f}x, "
              f"lowest {min(ratios):.2f}x{mark}")


if __name__ == "__main__":
    main()
