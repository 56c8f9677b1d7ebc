"""The timed band of the plan: checks whose loop makes fewer calls than
``agcheck.engine.cost.ENGINE_FROM_CALLS`` but at least ``cost.timed_band``'s start have one
call of ``fn`` timed against a reference function's call (``x + x``), and go to the engine
when ``calls * units >= DEAR_CALL * ENGINE_FROM_CALLS`` (``cost.loop_is_dear``).

For cheap and dear functions in the band this prints the loop's calls, the measured units
(median over the repetitions), and agcheck's median CPU time with ``engine="reference"``
(the loop) and ``engine="batched"`` (the engine), alternating in one process, then what
each ``DEAR_CALL`` would give: the total time and the worst engine/loop or loop/engine
ratio of a wrong choice.

    python bench/plan_band.py [--repeat 5] [--cases a,b]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

import agcheck
from agcheck.checks import loop_plan
from agcheck.engine import cost

DEARS = (1, 2, 3, 4, 6, 8, 12, 16)


def _leaf(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, dtype=torch.float64, generator=g).requires_grad_()


class _SvdProcrustes(torch.autograd.Function):
    """A rotation from a matrix through an SVD in a custom Function (as roma's procrustes)."""

    @staticmethod
    def forward(ctx, m):
        u, s, vh = torch.linalg.svd(m)
        r = u @ vh
        ctx.save_for_backward(m)
        return r

    @staticmethod
    def backward(ctx, g):
        (m,) = ctx.saved_tensors
        with torch.enable_grad():
            m = m.detach().requires_grad_()
            u, s, vh = torch.linalg.svd(m)
            (grad,) = torch.autograd.grad(u @ vh, m, g)
        return grad


def _iterated(k):
    def fn(a):
        for _ in range(k):
            a = torch.sin(a) * 1.01
        return a
    return fn


def _cases() -> dict:
    w = _leaf(40, 40, seed=3).detach()
    cases = {}
    for n in (15, 25, 40):
        cases[f"sin {n}"] = (torch.sin, (_leaf(n),))
        cases[f"mlp {n}"] = (lambda a: torch.tanh(w[:a.shape[0], :a.shape[0]] @ a), (_leaf(n),))
    for k in (4, 16, 64):
        cases[f"sin^{k} 20"] = (_iterated(k), (_leaf(20),))
        cases[f"sin^{k} 40"] = (_iterated(k), (_leaf(40),))
    for b in (2, 3, 4):
        cases[f"svd-procrustes {b}x3x3"] = (_SvdProcrustes.apply, (_leaf(b, 3, 3),))
        cases[f"solve {b + 2}"] = (lambda a, b_: torch.linalg.solve(a + 4 * torch.eye(a.shape[0], dtype=a.dtype), b_),
                                   (_leaf(b + 2, b + 2), _leaf(b + 2, 2, seed=1)))
    cases["eigh 5"] = (lambda a: torch.linalg.eigh(a + a.T)[0], (_leaf(5, 5),))
    return cases


class _Recorded:
    """The calls and units of the pieces planned (around the plan's own functions)."""

    def __init__(self):
        self.calls, self.units = [], []
        self._units = loop_plan.call_in_reference_calls
        self._calls = cost.loop_calls

    def __enter__(self):
        def units(run, piece):
            u = self._units(run, piece)
            self.units.append(u)
            return u

        def calls(*a, **k):
            c = self._calls(*a, **k)
            self.calls.append(c)
            return c

        loop_plan.call_in_reference_calls, cost.loop_calls = units, calls
        return self

    def __exit__(self, *exc):
        loop_plan.call_in_reference_calls, cost.loop_calls = self._units, self._calls


def _cpu(fn, args, **options) -> float:
    start = time.thread_time()
    agcheck.gradcheck(fn, args, **options)
    return time.thread_time() - start


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--cases", default="")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    cases = _cases()
    names = a.cases.split(",") if a.cases else list(cases)
    records = []
    print("median CPU ms; units: one call of fn in calls of the reference function")
    for name in names:
        fn, args = cases[name]
        for _ in range(2):
            _cpu(fn, args, engine="reference")
            _cpu(fn, args, engine="batched")
        loop, engine, units = [], [], []
        calls = 0
        for _ in range(a.repeat):
            with _Recorded() as rec:
                agcheck.gradcheck(fn, args)
            calls = max(rec.calls)
            units += rec.units
            loop.append(_cpu(fn, args, engine="reference"))
            engine.append(_cpu(fn, args, engine="batched"))
        r = {"case": name, "calls": calls, "units": statistics.median(units) if units else None,
             "loop": statistics.median(loop), "engine": statistics.median(engine)}
        records.append(r)
        shown = "-" if r["units"] is None else f"{r['units']:6.1f}"
        print(f"  {name:24s} calls {calls:4d} units {shown}  calls*units/ENGINE_FROM_CALLS "
              f"{calls * (r['units'] or 0) / cost.ENGINE_FROM_CALLS:6.1f}  loop {r['loop'] * 1e3:7.2f}  "
              f"engine {r['engine'] * 1e3:7.2f}  engine/loop {r['engine'] / r['loop']:.2f}", flush=True)
    print("\nwith DEAR_CALL at D (a check in the band takes the engine when calls * units >= D * ENGINE_FROM_CALLS):")
    for d in DEARS:
        def chosen(r):
            dear = r["units"] is not None and r["calls"] * r["units"] >= d * cost.ENGINE_FROM_CALLS
            return r["engine"] if dear else r["loop"]

        total = sum(chosen(r) for r in records)
        worst = max(chosen(r) / min(r["loop"], r["engine"]) for r in records)
        mark = "  (as shipped)" if d == cost.DEAR_CALL else ""
        print(f"  D = {d:3d}: total {total * 1e3:8.1f} ms (best {sum(min(r['loop'], r['engine']) for r in records) * 1e3:.1f}), "
              f"worst case {worst:.2f}x its best{mark}")


if __name__ == "__main__":
    main()
