"""A failing check costs what a passing one costs: memory and time side by side.

An ``autograd.Function`` for ``sin`` of n elements, its backward right or doubled, and a
function with no differentiable outputs, checked by agcheck and by torch's checker, each
check in a fresh process under an address-space limit (``RLIMIT_AS``). Prints the verdict,
CPU seconds and peak resident growth of each.

    python bench/failing_memory.py                      # n = 20,000 under 4 GiB
    python bench/failing_memory.py --n 6000 --limit-gib 2
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import textwrap

CHILD = textwrap.dedent("""
    import json, resource, sys, time
    limit, n, checker, case, fast = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5] == "fast"
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    import torch, agcheck

    class Sin(torch.autograd.Function):
        factor = 2.0 if case == "broken" else 1.0

        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x.sin()

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return Sin.factor * g * x.cos()

    def peak_mb():
        return int(open("/proc/self/status").read().split("VmHWM:")[1].split()[0]) // 1024

    fn = (lambda v: torch.zeros_like(v).detach()) if case == "no outputs" else Sin.apply
    x = torch.rand(n, dtype=torch.float64, generator=torch.Generator().manual_seed(0), requires_grad=True)
    check = agcheck.gradcheck if checker == "agcheck" else torch.autograd.gradcheck
    before, began = peak_mb(), time.process_time()
    try:
        verdict = str(check(fn, (x,), fast_mode=fast, raise_exception=False))
    except (MemoryError, RuntimeError) as e:
        verdict = "out of memory" if "alloc" in str(e) or isinstance(e, MemoryError) else type(e).__name__
    print(json.dumps({"verdict": verdict, "cpu": time.process_time() - began, "peak": peak_mb() - before}))
""")


def run(limit, n, checker, case, mode):
    done = subprocess.run([sys.executable, "-c", CHILD, str(limit), str(n), checker, case, mode],
                          capture_output=True, text=True)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {"verdict": "out of memory" if "alloc" in tail or "MemoryError" in tail else f"died: {tail[:40]}",
                "cpu": float("nan"), "peak": float("nan")}
    return json.loads(lines[-1])


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20_000, help="elements of the input (default 20,000)")
    parser.add_argument("--limit-gib", type=float, default=4.0, help="address-space limit per check (default 4)")
    args = parser.parse_args(argv)
    limit = int(args.limit_gib * (1 << 30))
    print(f"n = {args.n:,}, each check in a fresh process under a {args.limit_gib:g} GiB address-space limit")
    print(f"{'case':<12} {'mode':<5} {'torch verdict':<14} {'agcheck verdict':<16} {'torch cpu':>10} "
          f"{'agcheck cpu':>12} {'torch MB':>9} {'agcheck MB':>11}")
    for case in ("correct", "broken", "no outputs"):
        for mode in ("slow", "fast"):
            theirs = run(limit, args.n, "torch", case, mode)
            ours = run(limit, args.n, "agcheck", case, mode)
            print(f"{case:<12} {mode:<5} {theirs['verdict']:<14} {ours['verdict']:<16} {theirs['cpu']:>9.1f}s "
                  f"{ours['cpu']:>11.1f}s {theirs['peak']:>9.0f} {ours['peak']:>11.0f}", flush=True)


if __name__ == "__main__":
    main()
