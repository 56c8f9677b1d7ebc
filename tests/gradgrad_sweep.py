"""The gradgradcheck OpInfo sweep: agcheck.gradgradcheck against torch.autograd.gradgradcheck.

Every op of ``op_db`` with ``supports_gradgrad``, float64 and complex128 where the op
supports them for backward on the CPU, every sample. Each sample becomes a call the way
PyTorch's ``TestGradients._check_helper`` builds it for its gradgrad tests (the function
and inputs of ``tests/opinfo_sweep.build_check``), with the op's own settings:

- ``bwgrad_bwgrad`` (every op): ``check_batched_grad=op.check_batched_gradgrad``,
  ``check_grad_dtypes=True``, ``nondet_tol=op.gradcheck_nondet_tol``;
- ``fwgrad_bwgrad`` (ops with ``supports_fwgrad_bwgrad``): the same with
  ``check_fwd_over_rev=True, check_rev_over_rev=False, check_batched_grad=False,
  check_undefined_grad=False``;
- ``gen_non_contig_grad_outputs`` False (PyTorch also runs True; ``--non-contig`` adds it);
- ``fast_mode`` from the mode swept (``slow`` / ``fast`` / ``op``: the op's
  ``gradcheck_fast_mode``, None meaning True as in PyTorch's testing wrapper).

Verdicts are compared as in ``tests/opinfo_sweep.py`` (pass / GradcheckError / the same
exception type; timeouts are undecided). Both sides get freshly generated samples and the
same global seed before each call. The random ``grad_outputs`` are *not* the same:
torch draws them from the global RNG, agcheck from a private generator (the caller's RNG
state is never touched), so a disagreement can come from a different draw of
``grad_outputs`` (near a tolerance boundary or a kink). A disagreement is therefore rerun
with the *same* ``grad_outputs`` given to both checkers, for ``SHARED_DRAWS`` draws: if
they agree on every draw the call counts as an agreement *by explanation* (listed apart,
with the verdicts per draw); otherwise it stays a disagreement.

Usage::

    python -m tests.gradgrad_sweep --help
    python -m tests.gradgrad_sweep --ops sin,mm --modes slow,fast
    python -m tests.gradgrad_sweep --jsonl /tmp/gg.jsonl        # everything, one JSON line per call
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import sys
import time
from typing import Callable, Sequence

import torch

try:
    from . import opinfo_sweep as sweep
except ImportError:  # run from inside tests/
    import opinfo_sweep as sweep

VARIANTS = ("bwgrad_bwgrad", "fwgrad_bwgrad")
MODES = ("slow", "fast")


def gradgrad_ops(ops=None) -> list:
    """The autograd ops of op_db (selected by ``ops`` as in opinfo_sweep) that support gradgrad."""
    return [op for op in sweep.iter_ops(ops) if op.supports_gradgrad]


def variants_of(op) -> list[str]:
    return ["bwgrad_bwgrad"] + (["fwgrad_bwgrad"] if op.supports_fwgrad_bwgrad else [])


def gradgrad_kwargs(op, mode: str, variant: str, non_contig: bool = False) -> dict:
    """The gradgradcheck keywords PyTorch's gradgrad tests pass for ``op``."""
    if mode == "slow":
        fast = False
    elif mode == "fast":
        fast = True
    elif mode == "op":
        fast = True if op.gradcheck_fast_mode is None else bool(op.gradcheck_fast_mode)
    else:
        raise ValueError(f"unknown mode {mode!r}")
    kw = dict(
        gen_non_contig_grad_outputs=non_contig,
        check_batched_grad=bool(op.check_batched_gradgrad),
        check_grad_dtypes=True,
        nondet_tol=op.gradcheck_nondet_tol,
        fast_mode=fast,
    )
    if variant == "fwgrad_bwgrad":
        kw.update(check_fwd_over_rev=True, check_rev_over_rev=False, check_batched_grad=False,
                  check_undefined_grad=False)
    elif variant != "bwgrad_bwgrad":
        raise ValueError(f"unknown variant {variant!r}")
    return kw


def slow_jacobian_entries(fn, inputs) -> int:
    """Entries of the Jacobians a slow-mode gradgradcheck of ``fn`` builds: its VJP takes
    the inputs and one cotangent per output element and returns one gradient per input."""
    n_in = sum(t.numel() for t in inputs if isinstance(t, torch.Tensor))
    with torch.no_grad():
        outs = fn(*inputs)
    outs = outs if isinstance(outs, (tuple, list)) else (outs,)
    n_out = sum(o.numel() for o in outs if isinstance(o, torch.Tensor) and (o.is_floating_point() or o.is_complex()))
    return (n_in + n_out) * n_in


def torch_gradgradcheck(fn, inputs, **kw):
    return torch.autograd.gradgradcheck(fn, inputs, **kw)


def agcheck_gradgradcheck(fn, inputs, **kw):
    import agcheck

    return agcheck.gradgradcheck(fn, inputs, backend="torch", **kw)


@dataclasses.dataclass
class GGResult:
    op: str
    dtype: str
    mode: str
    variant: str
    non_contig: bool
    index: int
    sample: str
    ref: sweep.Outcome
    cand: sweep.Outcome
    agree: bool | None
    #: why a verdict mismatch under different random draws counts as agreement
    explanation: str = ""

    @property
    def status(self) -> str:
        return "agree" if self.agree else "undecided" if self.agree is None else "DISAGREE"

    def line(self) -> str:
        nc = " non-contig" if self.non_contig else ""
        return (f"{self.status:9s} {self.op} {self.dtype} {self.mode} {self.variant}{nc} #{self.index}: "
                f"torch={self.ref.short()} | agcheck={self.cand.short()}"
                + (f" [explained: {self.explanation}]" if self.explanation else ""))

    def to_json(self) -> dict:
        return {"op": self.op, "dtype": self.dtype, "mode": self.mode, "variant": self.variant,
                "non_contig": self.non_contig, "index": self.index, "sample": self.sample,
                "torch": self.ref.to_json(), "agcheck": self.cand.to_json(), "status": self.status,
                "explanation": self.explanation}


@dataclasses.dataclass
class GGSummary:
    results: list = dataclasses.field(default_factory=list)
    skips: list = dataclasses.field(default_factory=list)
    wall_seconds: float = 0.0

    def extend(self, other: "GGSummary") -> None:
        self.results += other.results
        self.skips += other.skips
        self.wall_seconds += other.wall_seconds

    @property
    def disagreements(self) -> list:
        return [r for r in self.results if r.agree is False]

    @property
    def undecided(self) -> list:
        return [r for r in self.results if r.agree is None]

    @property
    def explained(self) -> list:
        return [r for r in self.results if r.agree is True and r.explanation]

    def format(self, max_list: int | None = 50) -> str:
        n = len(self.results)
        agree = sum(r.agree is True for r in self.results)
        ops = len({r.op for r in self.results})
        out = [
            "OpInfo gradgrad sweep: torch.autograd.gradgradcheck vs agcheck.gradgradcheck",
            f"calls compared: {n} (ops: {ops}), agreements: {agree} ({100.0 * agree / max(n, 1):.2f}%; "
            f"{len(self.explained)} by explanation), "
            f"disagreements: {len(self.disagreements)}, undecided (timeouts): {len(self.undecided)}, "
            f"skips: {len(self.skips)}, wall: {self.wall_seconds:.0f} s",
            "",
            f"{'variant':14s} {'mode':5s} {'dtype':10s} {'calls':>6s} {'agree':>6s} {'disagree':>8s} "
            f"{'torch-fails':>11s} {'torch s':>8s} {'agcheck s':>9s}",
        ]
        keys = sorted({(r.variant, r.mode, r.dtype) for r in self.results})
        for variant, mode, dt in keys:
            rs = [r for r in self.results if (r.variant, r.mode, r.dtype) == (variant, mode, dt)]
            out.append(
                f"{variant:14s} {mode:5s} {dt:10s} {len(rs):6d} {sum(r.agree is True for r in rs):6d} "
                f"{sum(r.agree is False for r in rs):8d} {sum(r.ref.kind != 'pass' for r in rs):11d} "
                f"{sum(r.ref.seconds for r in rs):8.1f} {sum(r.cand.seconds for r in rs):9.1f}"
            )
        if self.disagreements:
            out += ["", "disagreements:"]
            shown = self.disagreements if max_list is None else self.disagreements[:max_list]
            for r in shown:
                out.append("  " + r.line())
                out.append(f"      sample: {r.sample}")
            if max_list is not None and len(self.disagreements) > max_list:
                out.append(f"  ... and {len(self.disagreements) - max_list} more")
        if self.explained:
            out += ["", "agreements by explanation (the verdict depends on the random grad_outputs):"]
            out += ["  " + r.line() for r in self.explained]
        if self.undecided:
            out += ["", "undecided (timeouts):"] + ["  " + r.line() for r in self.undecided]
        return "\n".join(out)


#: draws of shared grad_outputs tried before a mismatch counts as a draw-dependent verdict
SHARED_DRAWS = 3
SHARED_DRAWS_SEED = 4242


def random_grad_outputs(fn, inputs, seed: int, noncontiguous: bool = False) -> tuple:
    """Cotangents for ``fn``'s outputs that require grad, uniform in [-1, 1) as both
    checkers draw them, from a private generator."""
    out = fn(*inputs)
    outs = out if isinstance(out, (tuple, list)) else (out,)
    gen = torch.Generator().manual_seed(seed)
    grads = []
    for o in outs:
        if not (isinstance(o, torch.Tensor) and o.requires_grad):
            continue
        # rand fills real (and imaginary) parts in [0, 1)
        g = torch.rand(o.shape, dtype=o.dtype, generator=gen) * 2 - (1 + 1j if o.is_complex() else 1)
        if noncontiguous and g.dim() > 0:
            g = torch.stack([g, torch.zeros_like(g)], dim=-1)[..., 0]
        grads.append(g.to(o.device).requires_grad_())
    return tuple(grads)


def explain_by_shared_draws(ref: sweep.Outcome, cand: sweep.Outcome, rerun: Callable[[int], tuple],
                            draws: int = SHARED_DRAWS) -> str:
    """Why a disagreement under different random ``grad_outputs`` counts as agreement, or "".

    ``rerun(seed)`` runs both checkers on a fresh sample with the *same* ``grad_outputs``
    (drawn with ``seed``) and returns their outcomes. Only when they agree on every one of
    ``draws`` draws is the original mismatch put down to the draw; the pattern of verdicts
    is part of the explanation."""
    if sweep.verdicts_agree(ref, cand) is not False:
        return ""
    pattern = []
    for d in range(draws):
        r, c = rerun(SHARED_DRAWS_SEED + d)
        if sweep.verdicts_agree(r, c) is not True:
            return ""
        pattern.append(r.verdict)
    return (f"with the same grad_outputs both agree on {draws} draws "
            f"({', '.join(pattern)}): the verdict depends on the random draw")


def run_op(op, *, dtypes: Sequence[str] = ("float64", "complex128"), modes: Sequence[str] = MODES,
           variants: Sequence[str] | None = None, non_contig: Sequence[bool] = (False,),
           samples: Sequence[int] | None = None, limit_samples: int | None = None,
           timeout: float | None = None, max_slow_entries: int | None = None,
           reference: Callable = torch_gradgradcheck,
           candidate: Callable = agcheck_gradgradcheck,
           on_result: Callable[[GGResult], None] | None = None) -> GGSummary:
    """Compare the two gradgradchecks on every (dtype, mode, variant, sample) of one op."""
    summ = GGSummary()
    t0 = time.perf_counter()
    name = op.full_name
    usable = sweep.op_dtypes(op, dtypes)
    for dt in dtypes:
        if dt not in usable:
            summ.skips.append(sweep.Skip(name, dt, None, f"op does not support {dt} for backward on cpu"))
    wanted_variants = [v for v in variants_of(op) if variants is None or v in variants]
    limit = limit_samples
    if samples is not None:
        top = max(samples) + 1 if samples else 0
        limit = top if limit is None else min(limit, top)
    for dt in usable:
        try:
            probe = sweep.generate_samples(op, dt, limit)
        except Exception as e:  # noqa: BLE001
            summ.skips.append(sweep.Skip(name, dt, None, f"sample generation raised {type(e).__name__}"))
            continue
        indices = list(range(len(probe))) if samples is None else [i for i in sorted(set(samples)) if i < len(probe)]
        runnable = []
        for i in indices:
            reason = sweep.skip_reason(probe[i])
            if reason is None:
                runnable.append(i)
            else:
                summ.skips.append(sweep.Skip(name, dt, i, reason))
        del probe
        for mode in modes:
            for variant in wanted_variants:
                for nc in non_contig:
                    kw = gradgrad_kwargs(op, mode, variant, nc)
                    ref_samples = sweep.generate_samples(op, dt, limit)
                    cand_samples = sweep.generate_samples(op, dt, limit)
                    if not sweep.same_samples(ref_samples, cand_samples):
                        for i in runnable:
                            summ.skips.append(sweep.Skip(name, dt, i, "samples not reproducible"))
                        continue
                    for i in runnable:
                        fn_r, in_r = sweep.build_check(op, ref_samples[i])
                        fn_c, in_c = sweep.build_check(op, cand_samples[i])
                        if not kw["fast_mode"] and max_slow_entries:  # "op" mode may be slow too
                            try:
                                entries = slow_jacobian_entries(fn_r, in_r)
                            except Exception:  # noqa: BLE001 - the checkers will meet it
                                entries = 0
                            if entries > max_slow_entries:
                                summ.skips.append(sweep.Skip(
                                    name, dt, i, f"slow-mode Jacobians over --max-slow-entries ({max_slow_entries:.0e})",
                                    detail=f"{entries} entries ({mode} mode, {variant})"))
                                ref_samples[i] = cand_samples[i] = None
                                continue
                        ref = sweep.run_checker(reference, fn_r, in_r, kw, sweep.CALL_SEED + i, timeout)
                        cand = sweep.run_checker(candidate, fn_c, in_c, kw, sweep.CALL_SEED + i, timeout)
                        agree = sweep.verdicts_agree(ref, cand)
                        explanation = ""
                        if agree is False:

                            def rerun(seed, kw=kw, dt=dt, i=i, nc=nc):
                                outcomes = []
                                for check in (reference, candidate):
                                    fn_s, in_s = sweep.build_check(op, sweep.generate_samples(op, dt, limit)[i])
                                    go = random_grad_outputs(fn_s, in_s, seed, nc)
                                    outcomes.append(sweep.run_checker(
                                        check, fn_s, in_s, {**kw, "grad_outputs": go}, sweep.CALL_SEED + i, timeout))
                                return tuple(outcomes)

                            explanation = explain_by_shared_draws(ref, cand, rerun)
                            agree = True if explanation else agree
                        ref.exc = cand.exc = None
                        res = GGResult(name, dt, mode, variant, nc, i, sweep.describe_sample(ref_samples[i]),
                                       ref, cand, agree, explanation)
                        summ.results.append(res)
                        if on_result is not None:
                            on_result(res)
                        ref_samples[i] = cand_samples[i] = None
    summ.wall_seconds = time.perf_counter() - t0
    return summ


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ops", default=None, help="comma list of op names / globs / substrings (default: all)")
    ap.add_argument("--dtypes", default="float64,complex128")
    ap.add_argument("--modes", default="slow,fast", help="comma list of slow, fast, op")
    ap.add_argument("--variants", default="bwgrad_bwgrad,fwgrad_bwgrad")
    ap.add_argument("--non-contig", action="store_true", help="also gen_non_contig_grad_outputs=True")
    ap.add_argument("--sample", default=None, help="sample indices, e.g. 0,2")
    ap.add_argument("--limit", type=int, default=None, help="samples per op and dtype")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per call")
    ap.add_argument("--max-slow-entries", type=float, default=2e7,
                    help="skip (and report as skipped) slow-mode samples whose VJP Jacobians have more "
                         "entries, (inputs + cotangents) x inputs elements (default 2e7; 0: no limit)")
    ap.add_argument("--start-at", default=None, help="skip the ops before this one (resume a sweep)")
    ap.add_argument("--jsonl", default=None, help="write one JSON line per call to this file")
    ap.add_argument("-v", "--verbose", action="store_true", help="print every call")
    ap.add_argument("--force-engine", action="store_true",
                    help="agcheck's engine on every check (no loop for small checks, VJPs always worth batching)")
    ap.add_argument("--engine-fallbacks", action="store_true",
                    help="count the checks the engine handed to the reference engine on an exception, by type "
                         "and by the line of agcheck that met it, and print them after the summary")
    args = ap.parse_args(argv)
    fallbacks = sweep.FallbackCounter() if args.engine_fallbacks else None
    with contextlib.ExitStack() as undo:  # the forced engine and the counter, undone after the sweep
        if args.force_engine:
            undo.enter_context(sweep.forced_engine())
        if fallbacks is not None:
            fallbacks.attach()
            undo.callback(fallbacks.detach)
        status = _run(args, ap)
    if fallbacks is not None:
        print(fallbacks.table())
    return status


def _run(args, ap) -> int:
    import warnings

    warnings.simplefilter("ignore")
    sink = open(args.jsonl, "a") if args.jsonl else None
    total = GGSummary()
    samples = [int(s) for s in args.sample.split(",")] if args.sample else None

    def on_result(r: GGResult) -> None:
        if sink is not None:
            sink.write(json.dumps(r.to_json()) + "\n")
            sink.flush()
        if args.verbose or r.agree is False:
            print(r.line(), flush=True)

    ops = gradgrad_ops(args.ops)
    if args.start_at:
        names = [op.full_name for op in ops]
        if args.start_at not in names:
            ap.error(f"--start-at: {args.start_at!r} is not among the selected ops")
        ops = ops[names.index(args.start_at):]
    for op in ops:
        total.extend(run_op(op, dtypes=args.dtypes.split(","), modes=args.modes.split(","),
                            max_slow_entries=int(args.max_slow_entries) if args.max_slow_entries else None,
                            variants=args.variants.split(","),
                            non_contig=(False, True) if args.non_contig else (False,),
                            samples=samples, limit_samples=args.limit, timeout=args.timeout,
                            on_result=on_result))
    print(total.format())
    if sink is not None:
        sink.close()
    return 1 if total.disagreements else 0


if __name__ == "__main__":
    sys.exit(main())
