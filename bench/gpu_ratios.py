"""agcheck against torch's checker on a CUDA device: time and peak device memory, one run.

Cases: an elementwise function (slow mode, n = 4,000; the engine's compressed path), a
small MLP (slow, forward and reverse mode), a dense function in fast mode, a failing
check (a doubled backward, slow mode) and a gradgradcheck. Each case runs torch's checker
and agcheck alternately, ``--repeat`` times, after one warm-up each; prints the medians,
their ratio (torch / agcheck: above 1, agcheck is faster) and each checker's peak of
``torch.cuda.max_memory_allocated`` above the inputs.

    python bench/gpu_ratios.py [--repeat 3] [--device cuda]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time


def cases(torch, device):
    gen = torch.Generator(device=device).manual_seed(0)

    def rand(*shape):
        return torch.rand(*shape, dtype=torch.float64, device=device, generator=gen)

    class Doubled(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x.sin()

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return 2 * g * x.cos()

    w1, w2 = rand(64, 32) - 0.5, rand(8, 64) - 0.5

    def mlp(x):
        return torch.tanh(torch.tanh(x @ w1.T) @ w2.T)

    dense = rand(512, 512) / 50
    return [
        ("elementwise n=4000, slow", lambda v: torch.sin(2 * torch.exp(v)), (rand(4000).requires_grad_(),), {}),
        ("MLP 16x32, slow, fwd+rev", mlp, (rand(16, 32).requires_grad_(),), {"check_forward_ad": True}),
        ("dense 512, fast", lambda v: torch.tanh(dense @ v), (rand(512).requires_grad_(),), {"fast_mode": True}),
        ("failing n=500, slow", Doubled.apply, (rand(500).requires_grad_(),), {"raise_exception": False}),
        ("gradgradcheck MLP 4x32", mlp, (rand(4, 32).requires_grad_(),), {"gradgrad": True}),
    ]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args(argv)
    import torch

    import agcheck

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("no CUDA device: nothing measured")
        return 0
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
    print(f"device {args.device} ({torch.cuda.get_device_name() if args.device.startswith('cuda') else 'cpu'}), "
          f"torch {torch.__version__}, agcheck {agcheck.__version__}; medians of {args.repeat}")
    print(f"{'case':<28} {'torch s':>9} {'agcheck s':>10} {'ratio':>6} {'torch MB':>9} {'agcheck MB':>11} verdicts")
    for name, fn, inputs, kw in cases(torch, args.device):
        kw = dict(kw)
        gradgrad = kw.pop("gradgrad", False)
        checkers = {
            "torch": torch.autograd.gradgradcheck if gradgrad else torch.autograd.gradcheck,
            "agcheck": agcheck.gradgradcheck if gradgrad else agcheck.gradcheck,
        }
        times = {k: [] for k in checkers}
        peaks, verdicts = {}, {}
        for k, check in checkers.items():  # warm-up
            check(fn, inputs, **kw)
        for _ in range(args.repeat):
            for k, check in checkers.items():
                if args.device.startswith("cuda"):
                    torch.cuda.reset_peak_memory_stats()
                    base = torch.cuda.memory_allocated()
                sync()
                began = time.perf_counter()
                verdicts[k] = check(fn, inputs, **kw)
                sync()
                times[k].append(time.perf_counter() - began)
                if args.device.startswith("cuda"):
                    peaks[k] = max(peaks.get(k, 0), (torch.cuda.max_memory_allocated() - base) / 2**20)
        t, a = statistics.median(times["torch"]), statistics.median(times["agcheck"])
        print(f"{name:<28} {t:>9.3f} {a:>10.3f} {t / a:>6.2f} {peaks.get('torch', float('nan')):>9.1f} "
              f"{peaks.get('agcheck', float('nan')):>11.1f} {verdicts['torch']}/{verdicts['agcheck']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
