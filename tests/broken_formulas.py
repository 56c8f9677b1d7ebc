"""Seeded broken backward formulas over PyTorch's OpInfo database.

For every autograd op of ``op_db`` that supports float64 backward on the CPU and every
float64 sample (``requires_grad=True``) whose tensors requiring grad are exactly the
gradcheck inputs (``tests/opinfo_sweep.py``'s ``skip_reason``), the *correct* function
is built as PyTorch's gradient tests build it (``opinfo_sweep.build_check``: the op,
through ``op.gradcheck_wrapper`` and ``sample.output_process_fn_grad``). Broken versions
wrap it in a custom ``torch.autograd.Function`` whose backward computes the true VJP
(``torch.autograd.grad`` on a recomputation, under ``enable_grad``) and then breaks it:

- ``scaled``: every input's grad times 1.1;
- ``entry``: the first input's grad gets ``1e-2 * max|g| + 1e-2`` added at flat index 0;
- ``sign``: every input's grad negated;
- ``transposed``: the first input's grad transposed (only when it is a square 2-D matrix
  that is not symmetric; otherwise the breakage is not applicable to the sample).

Both ``torch.autograd.gradcheck`` and ``agcheck.gradcheck`` run with default keywords
(default tolerances, no forward AD -- the custom Function has none) and ``fast_mode``
from the mode. Counted per checker: correct samples that fail (false alarms), split into
those torch also fails (excluded from the comparison) and those torch passes, and broken
samples caught.

Script mode::

    python -m tests.broken_formulas                 # all ops, slow mode
    python -m tests.broken_formulas --ops 50 --fast # first 50 ops, fast mode
    python -m tests.broken_formulas --ops sin,matmul --both -v
    python -m tests.broken_formulas --force-engine  # agcheck's engine on every check
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
import time
import warnings
from typing import Callable, Sequence

import torch

try:
    import opinfo_sweep as sweep
except ImportError:  # run from the repository root
    from tests import opinfo_sweep as sweep

BREAKAGES = ("scaled", "entry", "sign", "transposed")
CALL_SEED = 0


# --------------------------------------------------------------------------------------
# broken versions
# --------------------------------------------------------------------------------------


def _flatten(out):
    if isinstance(out, torch.Tensor):
        return [out], True
    if isinstance(out, (tuple, list)) and all(isinstance(o, torch.Tensor) for o in out) and len(out) > 0:
        return list(out), False
    return None, False


def _differentiable(t: torch.Tensor) -> bool:
    return t.dtype.is_floating_point or t.dtype.is_complex


def break_grads(grads: tuple, kind: str) -> tuple:
    """Apply the breakage ``kind`` to a tuple of input grads (entries may be None)."""
    grads = list(grads)
    if kind == "none":
        return tuple(grads)
    if kind == "scaled":
        return tuple(None if g is None else g * 1.1 for g in grads)
    if kind == "sign":
        return tuple(None if g is None else -g for g in grads)
    if kind == "entry":
        g = grads[0]
        if g is None:
            return tuple(grads)
        g = g.clone().contiguous()
        if g.numel():
            g.view(-1)[0] += 1e-2 * float(g.abs().max()) + 1e-2
        grads[0] = g
        return tuple(grads)
    if kind == "transposed":
        g = grads[0]
        if g is not None:
            grads[0] = g.t().contiguous()
        return tuple(grads)
    raise ValueError(kind)


def transposable(fn: Callable, inputs: tuple) -> bool:
    """Whether the first input's grad is a square 2-D matrix that is not symmetric
    (checked on the VJP of a seeded random grad_output)."""
    x = inputs[0]
    if x.dim() != 2 or x.shape[0] != x.shape[1] or x.shape[0] < 2:
        return False
    with torch.enable_grad():
        xs = [t.detach().requires_grad_(True) for t in inputs]
        outs, _ = _flatten(fn(*xs))
        if outs is None:
            return False
        outs = [o for o in outs if _differentiable(o) and o.requires_grad]
        if not outs:
            return False
        gen = torch.Generator().manual_seed(0)
        vs = [torch.randn(o.shape, generator=gen, dtype=o.dtype) for o in outs]
        (g,) = torch.autograd.grad(outs, [xs[0]], vs, allow_unused=True)
    return g is not None and not torch.equal(g, g.t())


def make_broken(fn: Callable, kind: str) -> Callable:
    """fn wrapped in a custom autograd.Function with the true VJP broken by ``kind``."""

    class Broken(torch.autograd.Function):
        @staticmethod
        def forward(ctx, *inputs):
            ctx.save_for_backward(*inputs)
            with torch.no_grad():
                outs, single = _flatten(fn(*inputs))
            if outs is None:
                raise TypeError("output is not a tensor or a sequence of tensors")
            outs = [o.clone() for o in outs]
            nondiff = [o for o in outs if not _differentiable(o)]
            if nondiff:
                ctx.mark_non_differentiable(*nondiff)
            ctx.single = single
            return outs[0] if single else tuple(outs)

        @staticmethod
        def backward(ctx, *grad_outputs):
            saved = ctx.saved_tensors
            with torch.enable_grad():
                xs = [t.detach().requires_grad_(True) for t in saved]
                outs, _ = _flatten(fn(*xs))
                pairs = [(o, g) for o, g in zip(outs, grad_outputs)
                         if _differentiable(o) and o.requires_grad and g is not None]
                if not pairs:
                    return tuple(None for _ in saved)
                grads = torch.autograd.grad([o for o, _ in pairs], xs, [g for _, g in pairs],
                                            allow_unused=True)
            return break_grads(grads, kind)

    def broken(*inputs):
        return Broken.apply(*inputs)

    broken.__name__ = f"{getattr(fn, '__name__', 'fn')}_{kind}"
    return broken


# --------------------------------------------------------------------------------------
# checkers
# --------------------------------------------------------------------------------------


def torch_check(fn, inputs, fast: bool) -> bool:
    return bool(torch.autograd.gradcheck(fn, inputs, raise_exception=False, fast_mode=fast))


def agcheck_check(fn, inputs, fast: bool) -> bool:
    import agcheck

    return bool(agcheck.gradcheck(fn, inputs, backend="torch", raise_exception=False, fast_mode=fast))


CHECKS = {"torch": torch_check, "agcheck": agcheck_check}


def run_one(check, fn, inputs, fast: bool, seed: int) -> str:
    """'pass', 'fail' (returned False), or 'error:<Type>' (raised despite raise_exception=False)."""
    torch.manual_seed(seed)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return "pass" if check(fn, inputs, fast) else "fail"
    except Exception as e:  # noqa: BLE001
        return f"error:{type(e).__name__}"


@dataclasses.dataclass
class Row:
    op: str
    sample: int
    mode: str
    kind: str  # "correct" or a breakage
    torch: str
    agcheck: str

    @property
    def disagree(self) -> bool:
        return (self.torch == "pass") != (self.agcheck == "pass")


@dataclasses.dataclass
class Counts:
    rows: list = dataclasses.field(default_factory=list)
    skipped: int = 0
    seconds: float = 0.0

    def add(self, other: "Counts") -> None:
        self.rows += other.rows
        self.skipped += other.skipped
        self.seconds += other.seconds

    def table(self, mode: str | None = None) -> dict:
        rows = [r for r in self.rows if mode is None or r.mode == mode]
        correct = [r for r in rows if r.kind == "correct"]
        t = {
            "correct samples": len(correct),
            "correct: torch fails (excluded)": sum(r.torch != "pass" for r in correct),
            "correct: agcheck false alarms (torch passes)": sum(r.torch == "pass" and r.agcheck != "pass" for r in correct),
            "correct: agcheck passes where torch fails": sum(r.torch != "pass" and r.agcheck == "pass" for r in correct),
        }
        for kind in BREAKAGES + ("all",):
            b = [r for r in rows if r.kind != "correct" and (kind == "all" or r.kind == kind)]
            t[f"broken {kind}: samples"] = len(b)
            t[f"broken {kind}: torch caught"] = sum(r.torch != "pass" for r in b)
            t[f"broken {kind}: agcheck caught"] = sum(r.agcheck != "pass" for r in b)
            t[f"broken {kind}: torch caught, agcheck missed"] = sum(r.torch != "pass" and r.agcheck == "pass" for r in b)
        return t

    def disagreements(self) -> list:
        return [r for r in self.rows if r.disagree]


def float64_ops(ops=None) -> list:
    return [op for op in sweep.iter_ops(ops) if "float64" in sweep.op_dtypes(op, ("float64",))]


def run_op(op, *, modes=("slow",), limit_samples: int | None = None, samples: Sequence[int] | None = None,
           kinds: Sequence[str] = BREAKAGES, on_row: Callable | None = None) -> Counts:
    c = Counts()
    t0 = time.perf_counter()
    try:
        all_samples = sweep.generate_samples(op, "float64", limit_samples)
    except Exception:  # noqa: BLE001
        c.skipped += 1
        return c
    indices = range(len(all_samples)) if samples is None else [i for i in samples if i < len(all_samples)]
    for i in indices:
        s = all_samples[i]
        if sweep.skip_reason(s) is not None:
            c.skipped += 1
            continue
        fn, inputs = sweep.build_check(op, s)
        if not all(t.dtype == torch.float64 for t in inputs):
            c.skipped += 1
            continue
        try:
            with torch.no_grad():
                outs, _ = _flatten(fn(*inputs))
        except Exception:  # noqa: BLE001
            outs = None
        if outs is None or not any(_differentiable(o) for o in outs):
            c.skipped += 1
            continue
        variants = [("correct", fn)]
        for kind in kinds:
            if kind == "transposed":
                try:
                    if not transposable(fn, inputs):
                        continue
                except Exception:  # noqa: BLE001
                    continue
            variants.append((kind, make_broken(fn, kind)))
        for mode in modes:
            fast = mode == "fast"
            for kind, f in variants:
                res = {}
                for name, check in CHECKS.items():
                    res[name] = run_one(check, f, inputs, fast, CALL_SEED + i)
                row = Row(op.full_name, i, mode, kind, res["torch"], res["agcheck"])
                c.rows.append(row)
                if on_row is not None:
                    on_row(row)
    c.seconds = time.perf_counter() - t0
    return c


def format_table(counts: Counts, modes: Sequence[str]) -> str:
    lines = []
    for mode in modes:
        t = counts.table(mode)
        lines.append(f"== mode: {mode} ==")
        w = max(len(k) for k in t)
        for k, v in t.items():
            lines.append(f"  {k:<{w}}  {v}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.broken_formulas", description=__doc__.splitlines()[0])
    p.add_argument("--ops", default=None,
                   help="N (the first N float64 autograd ops of op_db) or a comma list of op patterns; default all")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--fast", action="store_true", help="fast mode only")
    g.add_argument("--both", action="store_true", help="slow and fast mode")
    p.add_argument("--limit", type=int, default=None, help="samples per op (default all)")
    p.add_argument("--progress", type=int, default=0, help="print the running table every N ops")
    p.add_argument("-v", "--verbose", action="store_true", help="print every disagreement as it happens")
    p.add_argument("--force-engine", action="store_true",
                   help="agcheck's engine on every check (no loop for small checks, VJPs always worth batching)")
    a = p.parse_args(argv)
    if a.force_engine:
        with sweep.forced_engine():
            return _run(a)
    return _run(a)


def _run(a) -> int:
    if a.ops is not None and a.ops.isdigit():
        ops = float64_ops()[: int(a.ops)]
    else:
        ops = float64_ops(a.ops)
    modes = ("slow", "fast") if a.both else ("fast",) if a.fast else ("slow",)
    total = Counts()
    t0 = time.perf_counter()

    def on_row(r: Row):
        if r.disagree and (r.kind != "correct" or r.torch == "pass" or a.verbose):
            print(f"DISAGREE {r.op} sample {r.sample} {r.mode} {r.kind}: torch={r.torch} agcheck={r.agcheck}", flush=True)

    for n, op in enumerate(ops, 1):
        c = run_op(op, modes=modes, limit_samples=a.limit, on_row=on_row)
        total.add(c)
        print(f"[{n}/{len(ops)}] {op.full_name}: {len(c.rows)} checks, {c.seconds:.1f}s "
              f"(total {time.perf_counter() - t0:.0f}s)", file=sys.stderr, flush=True)
        if a.progress and n % a.progress == 0:
            print(f"-- after {n} ops, {time.perf_counter() - t0:.0f}s --")
            print(format_table(total, modes), flush=True)
    print(f"ops: {len(ops)}, samples skipped: {total.skipped}, wall: {time.perf_counter() - t0:.0f}s")
    print(format_table(total, modes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
