"""Peak memory of one OpInfo sample under one checker (issue #7's OOM investigation).

Builds the sample as ``tests/opinfo_sweep.py`` does (``build_check``, the op's slow-mode
keywords), runs one checker on it in this process, and prints the sizes, the resident
memory before the check (after importing torch, op_db and agcheck) and the peak
(``getrusage().ru_maxrss``). Run each checker in its own process, under a cap::

    (ulimit -v 16000000; python -m tests.opinfo_peak torch slice complex128 1 --shape 20,30,16)
    (ulimit -v 16000000; python -m tests.opinfo_peak agcheck slice complex128 1)

``--shape`` replaces the sample's input by a seeded random tensor of that shape (the same
op and arguments at a smaller size); ``--mode fast`` measures fast mode. agcheck's engine
chooses between batched and element-by-element evaluation from timings;
``--pin-engine batched`` (or ``loop``) pins that choice (measurement only: it sets the
engine's ``cost.CLEARLY_SLOWER`` threshold).
"""
from __future__ import annotations

import argparse
import resource
import sys
import time
import warnings

import torch

try:
    from . import opinfo_sweep as sweep
except ImportError:  # run from inside tests/
    import opinfo_sweep as sweep


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.opinfo_peak", description=__doc__.split("\n\n")[0])
    ap.add_argument("checker", choices=["torch", "agcheck", "none"])
    ap.add_argument("op", help="op full name, e.g. slice")
    ap.add_argument("dtype", choices=sorted(sweep.DTYPES))
    ap.add_argument("index", type=int, help="sample index")
    ap.add_argument("--shape", default=None, help="replace the sample's input by one of this shape, e.g. 20,30,16")
    ap.add_argument("--mode", default="slow", choices=sweep.ALL_MODES)
    ap.add_argument("--pin-engine", default=None, choices=["batched", "loop"],
                    help="pin agcheck's timing-based choice between batched and looped evaluation")
    args = ap.parse_args(argv)
    if args.pin_engine:
        from agcheck.engine import cost

        if not hasattr(cost, "CLEARLY_SLOWER"):
            ap.error("--pin-engine: this agcheck's engine has no CLEARLY_SLOWER threshold")
        cost.CLEARLY_SLOWER = float("inf") if args.pin_engine == "batched" else 0.0

    op = sweep.find_op(args.op)
    sample = sweep.generate_samples(op, args.dtype, args.index + 1)[args.index]
    if args.shape:
        shape = tuple(int(s) for s in args.shape.split(","))
        gen = torch.Generator().manual_seed(0)
        sample.input = torch.randn(shape, dtype=sweep.DTYPES[args.dtype], generator=gen).requires_grad_()
    fn, inputs = sweep.build_check(op, sample)
    kw = sweep.check_kwargs(op, args.mode)
    n_in = sum(t.numel() for t in inputs)
    entries = sweep.slow_jacobian_entries(fn, inputs)
    import agcheck  # noqa: F401 - imported on every side, so that the baselines compare

    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    t0 = time.perf_counter()
    status = "pass"
    if args.checker != "none":
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                ok = sweep.CHECKERS[args.checker](fn, inputs, raise_exception=True, **kw)
            status = "pass" if ok else "returned False"
        except Exception as e:  # noqa: BLE001 - the outcome is reported
            status = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:160]}"
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(f"{args.checker} {args.op} {args.dtype} #{args.index} {args.mode}: {sweep.describe_sample(sample)[:70]}\n"
          f"  input elements {n_in}, Jacobian entries {entries:.3e} (output elements {entries // max(n_in, 1)})\n"
          f"  rss before {base / 2**20:.2f} GiB, peak {peak / 2**20:.2f} GiB, check {(peak - base) / 2**20:.2f} GiB, "
          f"{time.perf_counter() - t0:.1f} s, {status}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
