"""Slow-mode checks of real vision models at sizes beyond their suites' own tests.

Issue 16 measured a "heavier tier" of kornia's models in slow mode, where agcheck had
been at 0.60x torch's checker's time: a SIFT descriptor of a 32x32 patch, a small
orientation CNN (OriNet) on 2x1x32x32, a 3-D motion blur. kornia's own tests check smaller
inputs (SIFT 15x15, motion blur 1x3x1x4x5), skip the check (OriNet's "jacobian not well
computed") or run it in fast mode (HardNet), so the suite runs of ``bench/real_suites.py``
never check these in slow mode. The two CNNs are checked as kornia's tests build them
(train mode: their dropout draws a new mask at every call, and both checkers fail them)
and as used for inference (eval mode: deterministic).
This script checks them through torch's checker and agcheck on the same inputs, each check
in a fresh process (one evaluation and one backward of the model first, untimed) under an
address-space limit (``--memory-limit``, 16 GiB: torch's checker needs more than 21 GB on
``motion3d``, and running out is then its reported outcome, not the machine's), and
prints CPU seconds, the check's peak resident memory (above the process's before it), the ratio, and both verdicts with the first line
of any error (and the kinds agcheck's report diagnosed).
The CNNs have random weights (``pretrained=False``: no download).

Needs kornia (``bench/suites-requirements.txt``):

    python bench/heavy_models.py [--repeat 1] [--cases sift32,orinet,hardnet,orinet_eval,hardnet_eval,motion3d]
"""
from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time

import torch

import agcheck


def _inputs(shape, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(shape, dtype=torch.float64, generator=g).requires_grad_()


def _cases():
    from kornia.feature import HardNet, OriNet, SIFTDescriptor
    from kornia.filters import motion_blur3d

    torch.manual_seed(0)  # the models' initial weights

    def model(cls, train):
        net = cls(pretrained=False).double()
        return net.train() if train else net.eval()

    patches = (_inputs((2, 1, 32, 32), 2),)
    return {
        "sift32": ("SIFTDescriptor(32) on 1x1x32x32", SIFTDescriptor(32).double(), (_inputs((1, 1, 32, 32), 1),),
                   {"nondet_tol": 1e-4}),
        # as kornia's tests build them (train mode): dropout draws a new mask at every call
        "orinet": ("OriNet, train mode, on 2x1x32x32", model(OriNet, True), patches, {}),
        "hardnet": ("HardNet, train mode, on 2x1x32x32", model(HardNet, True), patches,
                    {"eps": 1e-4, "atol": 1e-4, "nondet_tol": 1e-8}),
        # the same networks as used for inference (deterministic)
        "orinet_eval": ("OriNet, eval mode, on 2x1x32x32", model(OriNet, False), patches, {}),
        "hardnet_eval": ("HardNet, eval mode, on 2x1x32x32", model(HardNet, False), patches,
                         {"eps": 1e-4, "atol": 1e-4, "nondet_tol": 1e-8}),
        "motion3d": ("motion_blur3d, kernel 9, on 1x1x8x16x16",
                     lambda t: motion_blur3d(t, 9, (0.0, 360.0, 150.0), -0.2, "replicate"),
                     (_inputs((1, 1, 8, 16, 16), 3),), {"nondet_tol": 1e-8}),
    }


def _verdict(check, fn, args, options):
    """``(CPU seconds, verdict)``: ``pass``, ``out of memory``, or the error's type and
    first line (and the kinds agcheck's report diagnosed)."""
    start = time.thread_time()
    try:
        check(fn, args, fast_mode=False, **options)
        verdict = "pass"
    except MemoryError:
        verdict = "out of memory"
    except Exception as ex:  # noqa: BLE001 - the verdict is what is measured
        first = str(ex).splitlines()[0] if str(ex) else ""
        verdict = "out of memory" if "can't allocate memory" in first else f"{type(ex).__name__}: {first[:70]}"
        report = getattr(ex, "report", None)  # agcheck's: what its diagnosis named
        if report is not None and report.diagnoses:
            verdict += f" [diagnosis: {', '.join(sorted({d.kind for d in report.diagnoses}))}]"
    return time.thread_time() - start, verdict


def _resident_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _worker(case: str, side: str, limit_gb: float) -> None:
    """One check in this process, under an address-space limit; prints one JSON line."""
    resource.setrlimit(resource.RLIMIT_AS, (int(limit_gb * 2 ** 30),) * 2)
    torch.set_num_threads(1)
    what, fn, inputs, options = _cases()[case]
    out = fn(*inputs)  # the model's first call and backward, untimed
    torch.autograd.grad([o.sum() for o in (out if isinstance(out, tuple) else (out,))], inputs)
    check = torch.autograd.gradcheck if side == "torch" else agcheck.gradcheck
    before = _resident_mb()
    seconds, verdict = _verdict(check, fn, inputs, options)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"seconds": seconds, "verdict": verdict, "peak_mb": peak, "before_mb": before}))


def _run(case: str, side: str, limit_gb: float) -> dict:
    done = subprocess.run([sys.executable, __file__, "--worker", case, side, str(limit_gb)],
                          capture_output=True, text=True)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode or not lines:  # killed (out of memory beyond the limit) or crashed
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {"seconds": float("nan"), "verdict": f"worker exited {done.returncode}: {tail[:70]}",
                "peak_mb": float("nan"), "before_mb": float("nan")}
    return json.loads(lines[-1])


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=1, help="runs of each checker per case (the order alternates)")
    ap.add_argument("--cases", default=None, help="comma-separated case names (default: all)")
    ap.add_argument("--memory-limit", type=float, default=16.0,
                    help="address-space limit of each check's process, GiB (running out is a reported outcome)")
    ap.add_argument("--worker", nargs=3, metavar=("CASE", "SIDE", "LIMIT"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        case, side, limit = args.worker
        return _worker(case, side, float(limit))
    names = args.cases.split(",") if args.cases else list(_cases())
    sides = ("torch", "agcheck")
    print(f"slow mode, CPU seconds (one thread) and the check's peak resident memory above the process's before it "
          f"(MB), each check in a fresh process limited to "
          f"{args.memory_limit:g} GiB, {args.repeat} run(s) per checker, alternating; ratio = torch / agcheck")
    totals = dict.fromkeys(sides, 0.0)
    for name in names:
        what = _cases()[name][0]
        runs = {side: [] for side in sides}
        for r in range(args.repeat):
            for side in (sides if r % 2 == 0 else sides[::-1]):
                runs[side].append(_run(name, side, args.memory_limit))
        t, a = (statistics.median(x["seconds"] for x in runs[side]) for side in sides)
        mt, ma = (max(x["peak_mb"] - x["before_mb"] for x in runs[side]) for side in sides)  # the check's growth
        verdicts = {side: sorted({x["verdict"] for x in runs[side]}) for side in sides}
        kinds = {side: {v.split(":")[0].split(" [")[0] for v in found} for side, found in verdicts.items()}
        short = [side for side in sides
                 if any(k == "out of memory" or k.startswith("worker exited") for k in kinds[side])]
        if short:  # no verdict, and no ratio, for a check that did not finish
            same = " and ".join(f"{side} did not finish" for side in short)
        else:
            same = "same verdict" if kinds["torch"] == kinds["agcheck"] else "VERDICTS DIFFER"
        ratio = f"{t / a:5.2f}x" if t == t and a == a and not short else "  -  "
        print(f"  {name:12s} {what:44s} torch {t:7.2f} s {mt:7.0f} MB   agcheck {a:7.2f} s {ma:7.0f} MB   "
              f"{ratio}  {same}")
        for side in sides:
            for v in verdicts[side]:
                print(f"      {side:8s} {v}")
        if t == t and a == a and not short:
            totals["torch"] += t
            totals["agcheck"] += a
    if totals["agcheck"] > 0:
        print(f"  total (cases both finished)  torch {totals['torch']:.2f} s  agcheck {totals['agcheck']:.2f} s  "
              f"{totals['torch'] / totals['agcheck']:.2f}x")


if __name__ == "__main__":
    main()
