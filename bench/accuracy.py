"""Float32 gradient checks: torch's defaults vs agcheck's accuracy recipe.

For each float32 function, over several random inputs, count how often a check passes
the correct derivative (it should) and fails derivatives broken by a small amount (it
should). torch's defaults (eps=1e-6, central differences, atol=1e-5, rtol=1e-3) drown
float32 functions in rounding error; the recipe (eps="auto", stencil="five-point",
atol=1e-4, rtol=1e-3) keeps the finite-difference error below the tolerance.

    python bench/accuracy.py [--seeds 5]
"""
from __future__ import annotations

import argparse
import warnings

import torch

import agcheck

FUNCTIONS = {
    "sin*exp": lambda t: t.sin() * t.exp(),
    "tanh(A@A)": lambda t: torch.tanh(t.reshape(6, 6) @ t.reshape(6, 6)),
    "softmax": lambda t: torch.softmax(t.reshape(4, 9), dim=-1),
    "logsumexp": lambda t: torch.logsumexp(t.reshape(4, 9), dim=-1),
    "cumprod": lambda t: (t * 0.5 + 1).cumprod(0),
    "norm": lambda t: t.reshape(6, 6).norm(dim=1),
    "sigmoid*x": lambda t: torch.sigmoid(t) * t,
    "layer_norm": lambda t: torch.nn.functional.layer_norm(t.reshape(4, 9), (9,)),
}

BREAKAGES = {
    "correct": (1.0, 0.0),
    "scaled x1.01": (1.01, 0.0),
    "scaled x1.003": (1.003, 0.0),
    "scaled x1.001": (1.001, 0.0),
    "one entry +1%": (1.0, 0.01),
}

SETTINGS = {
    "torch defaults": dict(),
    "agcheck recipe": dict(eps="auto", stencil="five-point", atol=1e-4, rtol=1e-3),
}


def broken(fn, factor, entry_shift):
    class Broken(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return fn(x)

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            with torch.enable_grad():
                xx = x.detach().requires_grad_()
                (gx,) = torch.autograd.grad(fn(xx), xx, g)
            gx = gx * factor
            if entry_shift:
                gx = gx.clone()
                gx.view(-1)[0] += entry_shift * gx.abs().max()
            return gx

    return Broken.apply


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=5)
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")
    totals = {s: {b: 0 for b in BREAKAGES} for s in SETTINGS}
    runs = len(FUNCTIONS) * args.seeds
    print(f"float32, {len(FUNCTIONS)} functions x {args.seeds} random inputs = {runs} checks per cell")
    print("cell = checks that FAILED (correct: false alarms, want 0; broken: caught, want all)\n")
    rows = []
    for name, fn in FUNCTIONS.items():
        cells = []
        for setting, kw in SETTINGS.items():
            for bname, (factor, shift) in BREAKAGES.items():
                failed = 0
                for seed in range(args.seeds):
                    gen = torch.Generator().manual_seed(seed)
                    x = torch.randn(36, generator=gen, dtype=torch.float32).requires_grad_()
                    f = fn if bname == "correct" else broken(fn, factor, shift)
                    ok = agcheck.gradcheck(f, (x,), raise_exception=False, **kw)
                    failed += not ok
                totals[setting][bname] += failed
                cells.append(failed)
        rows.append((name, cells))
    w = 15
    print(f"{'':<16}" + "".join(f"{'| ' + s:<{w * len(BREAKAGES)}}" for s in SETTINGS))
    print(f"{'function':<16}" + "".join(f"{b:>{w}}" for _ in SETTINGS for b in BREAKAGES))
    for name, cells in rows:
        print(f"{name:<16}" + "".join(f"{c:>{w}}" for c in cells))
    print(f"{'TOTAL':<16}" + "".join(f"{totals[s][b]:>{w}}" for s in SETTINGS for b in BREAKAGES))
    print(f"\n(out of {runs} per column)")
    for s in SETTINGS:
        fa = totals[s]["correct"]
        caught = sum(v for b, v in totals[s].items() if b != "correct")
        print(f"{s:>16}: false alarms {fa}/{runs}, broken caught {caught}/{runs * (len(BREAKAGES) - 1)}")


if __name__ == "__main__":
    main()
