"""Benchmark cases for ``bench/compare.py`` and the worker that runs one of them.

Every case is a builder ``build(quick, opts) -> (fn, inputs, kwargs)`` registered in
:data:`CASES` together with the check it runs (``gradcheck``, ``gradgradcheck`` or the
OpInfo ``sweep``, whose builder returns a list of ``(label, fn, inputs, kwargs)``).
Inputs come from a *local* ``torch.Generator`` with a fixed seed, so the torch side and
the agcheck side (separate processes) check exactly the same numbers.

Worker entry (used by compare.py; one case, one side, one fresh process)::

    python bench/cases.py --worker CASE --side {torch,agcheck} [--quick] [--opinfo-ops N] [--cold]

It prints one line ``@@BENCH@@ {json}`` on stdout with the measurement:

- ``time_s``: ``time.perf_counter()`` around the check call(s) only -- imports, input
  creation, one plain ``torch.autograd.grad`` call (the same on both sides) and a tiny
  warm-up check of the same side happen before the clock starts; with ``--cold`` there
  is no warm-up at all and the timed check is the first of the process;
- ``peak_mb``: peak RSS growth during the check, in MiB (2**20 bytes): ``VmHWM`` read
  from ``/proc/self/status`` after the check minus ``VmRSS`` just before it, with the
  high-water mark reset right before the check by writing ``5`` to
  ``/proc/self/clear_refs`` (Linux).  Without ``clear_refs``: ``ru_maxrss`` growth, which
  is 0 whenever setup peaked higher than the check (``mem_method`` says which was used);
- ``anon_mb``: peak growth of the anonymous part of the RSS during the check (MiB):
  allocations, without the file-backed pages (shared-library code) that ``peak_mb``
  also counts; sampled every 0.2 ms by a separate process (:class:`AnonPoller`), so a
  lower bound; ``file_mb``: the file-backed pages' growth over the check;
- ``cpu_s``: user+system CPU time of the process over the same span (all threads) --
  less sensitive than wall time to other load on the machine, more to thread count;
- ``loadavg_before``: the 1-minute load average when the check started;
- ``verdict``: ``"True"``, ``"False"`` (``raise_exception=False`` is not used, so this
  only appears if a check returns False), the exception's type name, or ``"n/a"`` when
  the side has no such entry point (``agcheck.gradgradcheck`` missing).
"""
from __future__ import annotations

import argparse
import ctypes
import dataclasses
import gc
import itertools
import json
import os
import re
import resource
import sys
import time
from typing import Any, Callable

MARKER = "@@BENCH@@"
SEED = 20240613


# --------------------------------------------------------------------------------------
# memory helpers
# --------------------------------------------------------------------------------------


def _status_kb(key: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            m = re.search(rf"^{key}:\s+(\d+)\s+kB", f.read(), re.M)
        return int(m.group(1)) if m else None
    except OSError:
        return None


def _reset_hwm() -> bool:
    """Reset the kernel's peak-RSS counter (VmHWM) to the current RSS."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _trim() -> None:
    """Collect garbage and return freed heap memory to the OS, so that memory setup
    freed but malloc kept does not hide the check's own growth."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


_ANON_POLLER = r"""
import os, re, select, sys
fd = os.open(f"/proc/{sys.argv[1]}/status", os.O_RDONLY)
pattern = re.compile(rb"RssAnon:\s+(\d+)")
def anon():
    m = pattern.search(os.pread(fd, 8192, 0))
    return int(m.group(1)) if m else 0
peak = anon()
while True:
    ready, _, _ = select.select([0], [], [], 0.0002)
    if not ready:
        peak = max(peak, anon())
        continue
    command = os.read(0, 64).decode().strip()
    if command == "reset":
        peak = anon()
    elif command == "peak":
        peak = max(peak, anon())
    else:
        break
    os.write(1, f"{peak}\n".encode())
"""


class AnonPoller:
    """Peak anonymous RSS (kB: heap and other allocations, not code pages) of this process,
    sampled every 0.2 ms by a separate process reading ``/proc/PID/status``, so that the
    sampling takes neither this interpreter's GIL nor its core (with one torch thread).
    A lower bound: an allocation that lives less than a sampling interval may be missed.
    ``None`` everywhere where ``/proc`` or the subprocess is unavailable."""

    def __init__(self) -> None:
        import subprocess

        self.proc = None
        if _status_kb("RssAnon") is None:
            return
        try:
            self.proc = subprocess.Popen([sys.executable, "-c", _ANON_POLLER, str(os.getpid())],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        except OSError:
            self.proc = None

    def _ask(self, command: str) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return None
        self.proc.stdin.write(f"{command}\n".encode())
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        return int(line) if line.strip() else None

    def reset(self) -> int | None:
        """Start a new peak at the current anonymous RSS; return it (kB)."""
        return self._ask("reset")

    def peak(self) -> int | None:
        """The largest anonymous RSS (kB) sampled since ``reset()``."""
        return self._ask("peak")

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=5)


class PeakMeter:
    """Peak RSS growth (kB) of the code between ``start()`` and ``stop()``; with a
    poller, also the peak growth of its anonymous part (``anon_growth()``)."""

    def __init__(self, poller: AnonPoller | None = None) -> None:
        self.poller = poller
        self.anon0 = None

    def start(self) -> None:
        _trim()
        self.hwm_reset = _reset_hwm()
        if self.poller is not None:
            self.anon0 = self.poller.reset()
        self.rss0 = _status_kb("VmRSS")
        self.file0 = _status_kb("RssFile")
        self.maxrss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

    def file_growth(self) -> int | None:
        """Growth (kB) of the file-backed resident pages since ``start()``: code and data of
        shared libraries touched for the first time (e.g. torch's vmap kernels), which the
        peak counts although no allocation made them; ``None`` where not reported."""
        now = _status_kb("RssFile")
        return None if now is None or self.file0 is None else max(now - self.file0, 0)

    def anon_growth(self) -> int | None:
        """Peak growth (kB) of the anonymous resident pages since ``start()``, as the
        poller sampled it; ``None`` without a poller."""
        if self.poller is None or self.anon0 is None:
            return None
        peak = self.poller.peak()
        return None if peak is None else max(peak - self.anon0, 0)

    def stop(self) -> tuple[int, str]:
        if self.hwm_reset and self.rss0 is not None:
            hwm = _status_kb("VmHWM")
            if hwm is not None:
                return max(hwm - self.rss0, 0), "VmHWM-after (reset via clear_refs) - VmRSS-before"
        maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return max(maxrss - self.maxrss0, 0), "ru_maxrss-after - ru_maxrss-before (lower bound)"


# --------------------------------------------------------------------------------------
# cases
# --------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    check: str  # "gradcheck" | "gradgradcheck" | "sweep"
    build: Callable[[bool, dict], Any]
    describe: Callable[[bool, dict], str]
    big: bool = False  # slow/heavy on the torch side in the full run


def _gen():
    import torch

    g = torch.Generator().manual_seed(SEED)
    return g


def _randn(shape, dtype=None, *, g):
    import torch

    dtype = dtype or torch.float64
    return torch.randn(shape, generator=g, dtype=dtype).requires_grad_(True)


def _sin2(t):
    return t.sin() * 2


def _elementwise(n_full: int, n_quick: int):
    def build(quick, opts):
        n = n_quick if quick else n_full
        return _sin2, (_randn((n,), g=_gen()),), {}

    def describe(quick, opts):
        return f"sin(t)*2, n={n_quick if quick else n_full}, slow"

    return build, describe


def _matmul_tanh_fn(a, b):
    import torch

    return torch.tanh(a @ b)


def _build_matmul_tanh(quick, opts):
    n = 16 if quick else 48
    g = _gen()
    return _matmul_tanh_fn, (_randn((n, n), g=g), _randn((n, n), g=g)), {}


def _mlp_fn(x, w1, b1, w2, b2):
    import torch

    return torch.tanh(x @ w1.T + b1) @ w2.T + b2


def _build_mlp(quick, opts):
    g = _gen()
    batch, d_in, d_hid, d_out = 4, 8, 16, 4
    inputs = (
        _randn((batch, d_in), g=g),
        _randn((d_hid, d_in), g=g),
        _randn((d_hid,), g=g),
        _randn((d_out, d_hid), g=g),
        _randn((d_out,), g=g),
    )
    return _mlp_fn, inputs, {"check_forward_ad": True, "check_backward_ad": True}


def _complex_fn(z):
    return z * z.conj() + z.exp()


def _build_complex(quick, opts):
    import torch

    n = 200 if quick else 600
    return _complex_fn, (_randn((n,), torch.complex128, g=_gen()),), {}


def _gradgrad_fn(t):
    return t.sin() * t


def _build_gradgrad(quick, opts):
    n = 100 if quick else 300
    return _gradgrad_fn, (_randn((n,), g=_gen()),), {}


def _build_gradgrad_abs(quick, opts):
    import torch

    n = 40 if quick else 100
    gen = _gen()
    w = torch.randn(n, n, dtype=torch.float64, generator=gen) / n ** 0.5
    # abs's backward multiplies by sgn, so the VJP's graph holds SgnBackward0, whose
    # batched backward imports torch._dynamo on its first use (torch 2.13)
    return (lambda x: torch.tanh(w @ x).abs() * x), (_randn((n,), g=gen),), {}


def _build_fast(quick, opts):
    n = 10**5 if quick else 10**6
    return _sin2, (_randn((n,), g=_gen()),), {"fast_mode": True}


def _conv_net(channels, kernel):
    """A small dense CNN (conv / eval-mode batch norm / ReLU), weights from the local
    generator: the kind of image model whose slow checks the batched path used to lose."""
    import torch

    g = _gen()
    layers, c_in = [], 1
    for c_out in channels:
        conv = torch.nn.Conv2d(c_in, c_out, kernel, padding=kernel // 2).double()
        with torch.no_grad():
            conv.weight.copy_(torch.randn(conv.weight.shape, dtype=torch.float64, generator=g) * 0.3)
            conv.bias.copy_(torch.randn(conv.bias.shape, dtype=torch.float64, generator=g) * 0.1)
        layers += [conv, torch.nn.BatchNorm2d(c_out, affine=False).double(), torch.nn.ReLU()]
        c_in = c_out
    return torch.nn.Sequential(*layers[:-2]).eval()


def _build_keynet_like(quick, opts):
    side = 12 if quick else 24
    net = _conv_net((4, 4, 1), 5)
    return net, (_randn((1, 1, side, side), g=_gen()),), {}


def _build_samples_cnn(quick, opts, wrong=False):
    """A CNN on two independent samples (2x1xSxS), as kornia's HardNet and HyNet checks
    have: batched rows cost what single calls cost, so the engine moves both samples in
    one call. ``wrong``: the backward of one output entry is 10% off (fails under both)."""
    import torch

    side = 16 if quick else 32
    net = _conv_net((8, 8, 1), 3)

    class OneEntryOff(torch.autograd.Function):
        @staticmethod
        def forward(ctx, y):
            return y.clone()

        @staticmethod
        def backward(ctx, g):
            g = g.clone()
            g[..., 0, 0] *= 1.1
            return g

    fn = (lambda x: OneEntryOff.apply(net(x))) if wrong else net
    return fn, (_randn((2, 1, side, side), g=_gen()),), {}


def _build_samples_cnn_wrong(quick, opts):
    return _build_samples_cnn(quick, opts, wrong=True)


def _off_by_a_percent(forward, derivative):
    """``forward`` as a vmappable custom Function whose backward, the VJP
    ``derivative(x, g)``, is made 1% too large (fails under both checkers)."""
    import torch

    class OnePercentOff(torch.autograd.Function):
        generate_vmap_rule = True

        @staticmethod
        def forward(x):
            return forward(x)

        @staticmethod
        def setup_context(ctx, inputs, output):
            ctx.save_for_backward(inputs[0])

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return 1.01 * derivative(x, g)

    return OnePercentOff.apply


def _build_exp_wrong(quick, opts):
    import torch

    fn = _off_by_a_percent(torch.exp, lambda x, g: g * torch.exp(x))
    return fn, (_randn((500 if quick else 2000,), g=_gen()),), {}


def _build_dense_wrong(quick, opts):
    import torch

    n = 150 if quick else 400
    gen = _gen()
    w = torch.randn(n, n, dtype=torch.float64, generator=gen) / n ** 0.5

    def derivative(x, g):
        y = torch.tanh(w @ x)
        return w.T @ (g * (1 - y * y))

    return _off_by_a_percent(lambda x: torch.tanh(w @ x), derivative), (_randn((n,), g=gen),), {}


def _build_complex_wrong(quick, opts):
    import torch

    n = 200 if quick else 600

    def derivative(z, g):  # torch's convention: g conj(df/dz) + conj(g) df/dconj(z)
        return g * (z + z.exp().conj()) + g.conj() * z

    return _off_by_a_percent(_complex_fn, derivative), (_randn((n,), torch.complex128, g=_gen()),), {}


def _tangent_off_by_a_percent(forward, derivative, tangent):
    """``forward`` as a custom Function with a right backward (the VJP ``derivative(x, g)``)
    and a JVP ``tangent(x, t)`` made 1% too large (fails a forward-mode check)."""
    import torch

    class TangentOff(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            ctx.save_for_forward(x)
            return forward(x)

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return derivative(x, g)

        @staticmethod
        def jvp(ctx, t):
            (x,) = ctx.saved_tensors
            return 1.01 * tangent(x, t)

    return TangentOff.apply


def _build_forward_wrong(quick, opts):
    import torch

    n = 100 if quick else 300
    gen = _gen()
    w = torch.randn(n, n, dtype=torch.float64, generator=gen) / n ** 0.5

    def derivative(x, g):
        y = torch.tanh(w @ x)
        return w.T @ (g * (1 - y * y))

    def tangent(x, t):
        y = torch.tanh(w @ x)
        return (1 - y * y) * (w @ t)

    fn = _tangent_off_by_a_percent(lambda x: torch.tanh(w @ x), derivative, tangent)
    return fn, (_randn((n,), g=gen),), {"check_forward_ad": True, "check_backward_ad": False,
                                         "check_undefined_grad": False, "check_batched_grad": False}


def _build_small_fast(quick, opts):
    net = _conv_net((4, 4), 3)
    return net, (_randn((2, 1, 8, 8), g=_gen()),), {"fast_mode": True}


def _flip_scale(t):
    return t.flip(-1) * t.sum()


def _build_small_slow(quick, opts):
    return _flip_scale, (_randn((3, 3), g=_gen()),), {}


# ---- OpInfo sweep --------------------------------------------------------------------


def select_opinfo_ops(n_ops: int):
    """A fixed, deterministic subset of ``op_db``: the float64 ops with autograd on CPU,
    sorted by (name, variant), every ``k``-th so the subset spreads over the alphabet."""
    import torch
    from torch.testing._internal.common_methods_invocations import op_db

    f64 = torch.float64
    eligible = [
        op
        for op in op_db
        if op.supports_autograd
        and op.supports_dtype(f64, "cpu")
        and f64 in op.supported_backward_dtypes("cpu")
    ]
    eligible.sort(key=lambda op: (op.name, op.variant_test_name))
    n_ops = min(n_ops, len(eligible))
    if n_ops <= 0:
        return []
    step = len(eligible) / n_ops
    return [eligible[int(i * step)] for i in range(n_ops)]


def _sweep_helpers():
    """``tests/opinfo_sweep.py`` (the verdict sweep) when it offers what the bench needs:
    ``generate_samples``, ``skip_reason``, ``build_check`` and ``check_kwargs`` -- then the
    bench times exactly the calls the verdict sweep makes.  None otherwise (own loop)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if not os.path.exists(os.path.join(root, "tests", "opinfo_sweep.py")):
        return None
    if root not in sys.path:
        sys.path.insert(0, root)
    try:
        import importlib

        mod = importlib.import_module("tests.opinfo_sweep")
    except Exception:  # noqa: BLE001 -- a broken helper must not break the bench
        return None
    needed = ("generate_samples", "skip_reason", "build_check", "check_kwargs")
    return mod if all(callable(getattr(mod, n, None)) for n in needed) else None


def opinfo_kwargs(op) -> dict:
    """Own-loop gradcheck keywords for ``op`` (slow mode), after torch's
    ``TestGradients._check_helper`` plus forward AD where the op supports it -- the same
    keywords as ``tests/opinfo_sweep.check_kwargs(op, "slow")``."""
    fwd = bool(op.supports_forward_ad)
    return {
        "check_batched_grad": bool(op.check_batched_grad),
        "check_grad_dtypes": True,
        "nondet_tol": op.gradcheck_nondet_tol,
        "fast_mode": False,
        "check_forward_ad": fwd,
        "check_backward_ad": True,
        "check_batched_forward_grad": bool(op.check_batched_forward_grad) if fwd else False,
    }


def _opinfo_fn_and_inputs(op, sample):
    """(fn, gradcheck_args) for one sample, as in torch's ``_check_helper``: the tensors
    that require grad become positional inputs, everything else is closed over."""
    import torch
    from torch.testing._internal.common_utils import is_iterable_of_tensors

    variant = op.get_op()
    if is_iterable_of_tensors(sample.input):
        all_args = tuple(itertools.chain(sample.input, sample.args, sample.kwargs.values()))
    else:
        all_args = tuple(itertools.chain((sample.input,), sample.args, sample.kwargs.values()))
    gradcheck_args = tuple(x for x in all_args if isinstance(x, torch.Tensor) and x.requires_grad)

    def recompose(inputs, inp, idx):
        if is_iterable_of_tensors(inp):
            out = []
            for x in inp:
                if isinstance(x, torch.Tensor) and x.requires_grad:
                    out.append(inputs[idx])
                    idx += 1
                else:
                    out.append(x)
            return out, idx
        if isinstance(inp, torch.Tensor) and inp.requires_grad:
            return inputs[idx], idx + 1
        return inp, idx

    def fn(*inputs):
        idx = 0
        first, idx = recompose(inputs, sample.input, idx)
        positional = [first]
        for x in sample.args:
            v, idx = recompose(inputs, x, idx)
            positional.append(v)
        kwargs = {}
        for k, x in sample.kwargs.items():
            kwargs[k], idx = recompose(inputs, x, idx)
        out = op.gradcheck_wrapper(variant, *positional, **kwargs)
        if sample.output_process_fn_grad is not None:
            return sample.output_process_fn_grad(out)
        return out

    return fn, gradcheck_args


def build_opinfo_sweep(n_ops: int, samples_per_op: int = 2, source: str = "auto"):
    """``(source, [(label, fn, inputs, kwargs), ...])``: the first ``samples_per_op``
    float64 samples of each selected op (global RNG seeded before each op's generation,
    so both processes draw the same), slow mode, the op's own settings.

    ``source``: "auto" (tests/opinfo_sweep.py when usable, else own loop), "sweep", "own".
    """
    import torch

    helper = _sweep_helpers() if source in ("auto", "sweep") else None
    if source == "sweep" and helper is None:
        raise RuntimeError("tests/opinfo_sweep.py is missing or lacks the needed functions")
    items = []
    for op in select_opinfo_ops(n_ops):
        label = op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")
        if helper is not None:
            kwargs = helper.check_kwargs(op, "slow")
            samples = helper.generate_samples(op, "float64", limit=samples_per_op)
            for j, sample in enumerate(samples):
                if helper.skip_reason(sample) is not None:
                    continue
                fn, args = helper.build_check(op, sample)
                items.append((f"{label}[{j}]", fn, args, kwargs))
            continue
        kwargs = opinfo_kwargs(op)
        torch.manual_seed(SEED)
        samples = op.sample_inputs("cpu", torch.float64, requires_grad=True)
        for j, sample in enumerate(itertools.islice(samples, samples_per_op)):
            fn, args = _opinfo_fn_and_inputs(op, sample)
            if not args:
                continue
            items.append((f"{label}[{j}]", fn, args, kwargs))
    return ("tests/opinfo_sweep.py" if helper is not None else "own loop"), items


def _build_sweep(quick, opts):
    return build_opinfo_sweep(opts.get("opinfo_ops", 10 if quick else 60), 2, opts.get("opinfo_source", "auto"))


def _describe_sweep(quick, opts):
    return f"op_db float64, {opts.get('opinfo_ops', 10 if quick else 60)} ops x <=2 samples, slow"


_ew1 = _elementwise(1000, 300)
_ew2 = _elementwise(4000, 800)
_ew3 = _elementwise(12000, 1500)

CASES: dict[str, Case] = {
    c.name: c
    for c in [
        Case("elementwise_1k", "gradcheck", *_ew1),
        Case("elementwise_4k", "gradcheck", *_ew2),
        Case("elementwise_12k", "gradcheck", *_ew3, big=True),
        Case("matmul_tanh", "gradcheck", _build_matmul_tanh,
             lambda q, o: f"tanh(a@b), 2x {16 if q else 48}x{16 if q else 48}, slow"),
        Case("mlp_fwd_bwd", "gradcheck", _build_mlp,
             lambda q, o: "MLP 8->16->4 batch 4, 5 inputs, fwd+bwd AD, slow"),
        Case("complex", "gradcheck", _build_complex,
             lambda q, o: f"z*conj(z)+exp(z), c128 n={200 if q else 600}, slow"),
        Case("gradgrad", "gradgradcheck", _build_gradgrad,
             lambda q, o: f"gradgradcheck sin(t)*t, n={100 if q else 300}, slow"),
        Case("gradgrad_abs", "gradgradcheck", _build_gradgrad_abs,
             lambda q, o: f"gradgradcheck |tanh(W x)| * x, n={40 if q else 100}, slow"),
        Case("fast_1m", "gradcheck", _build_fast,
             lambda q, o: f"sin(t)*2, n={10**5 if q else 10**6}, fast_mode"),
        Case("keynet_like", "gradcheck", _build_keynet_like,
             lambda q, o: f"3 conv 5x5 + BN + ReLU on 1x1x{12 if q else 24}^2, slow"),
        Case("samples_cnn", "gradcheck", _build_samples_cnn,
             lambda q, o: f"3 conv 3x3 + BN + ReLU on 2x1x{16 if q else 32}^2 (two samples), slow"),
        Case("samples_cnn_wrong", "gradcheck", _build_samples_cnn_wrong,
             lambda q, o: "the same with one backward entry 10% off (fails), slow"),
        Case("exp_wrong", "gradcheck", _build_exp_wrong,
             lambda q, o: f"exp, its backward 1% off, n={500 if q else 2000} (fails), slow"),
        Case("dense_wrong", "gradcheck", _build_dense_wrong,
             lambda q, o: f"tanh(W x), its backward 1% off, n={150 if q else 400} (fails), slow"),
        Case("complex_wrong", "gradcheck", _build_complex_wrong,
             lambda q, o: f"z*conj(z)+exp(z), its backward 1% off, c128 n={200 if q else 600} (fails), slow"),
        Case("forward_wrong", "gradcheck", _build_forward_wrong,
             lambda q, o: f"tanh(W x), its JVP 1% off, n={100 if q else 300} (fails), forward AD, slow"),
        Case("small_fast", "gradcheck", _build_small_fast,
             lambda q, o: "2 conv 3x3 + BN on 2x1x8x8, fast_mode"),
        Case("small_slow", "gradcheck", _build_small_slow,
             lambda q, o: "flip(t) * t.sum() on 3x3 (a millisecond check), slow"),
        Case("opinfo_sweep", "sweep", _build_sweep, _describe_sweep),
    ]
}


# --------------------------------------------------------------------------------------
# worker
# --------------------------------------------------------------------------------------


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _loadavg() -> float | None:
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def _verdict(call) -> str:
    try:
        r = call()
    except Exception as e:  # noqa: BLE001 -- the verdict *is* the exception type
        return type(e).__name__
    return "True" if r is True else ("False" if r is False else f"returned {r!r}")


def _entry(side: str, check: str):
    import torch

    if side == "torch":
        return torch.autograd.gradgradcheck if check == "gradgradcheck" else torch.autograd.gradcheck
    import agcheck

    if check == "gradgradcheck":
        f = getattr(agcheck, "gradgradcheck", None)
        return None if f is None else (lambda fn, inputs, **kw: f(fn, inputs, backend="torch", **kw))
    return lambda fn, inputs, **kw: agcheck.gradcheck(fn, inputs, backend="torch", **kw)


def _neutral_warm_up() -> None:
    """One plain backward with an explicit cotangent (``torch.autograd.grad(y, x, v)``,
    as ``y.backward(v)`` does), the same on both sides.  torch's first such call imports
    sympy (``_make_grads`` -> ``torch.fx.experimental.symbolic_shapes``: about 0.5 s and
    40 MB); torch's own checker reaches it in its warm-up check, agcheck's VJPs do not, and
    a case whose check imports ``torch._dynamo`` (which needs sympy) would otherwise bill
    that import to agcheck alone.  NumPy's random module is imported too, on both sides:
    agcheck's engine draws its signs and projections from it and imports it at its first
    check (6-8 ms, 0.5 MB), which the tiny warm-up check, too small for the engine, does
    not reach (torch's checker never needs it, and a torch ``_dynamo`` import makes it in
    either side's timed check).  ``--cold`` shows the first check without any warm-up."""
    import numpy.random  # noqa: F401
    import torch

    x = torch.ones(2, dtype=torch.float64, requires_grad=True)
    y = x * x
    torch.autograd.grad(y, x, torch.ones_like(y))


def _warm_up(entry, kwargs: dict) -> None:
    """The neutral warm-up, then one tiny check (n=3) with the case's keywords on the
    same side, so lazy imports and first-call costs of either library are not billed to
    the case."""
    import torch

    _neutral_warm_up()
    x = torch.randn(3, dtype=torch.float64, generator=torch.Generator().manual_seed(0)).requires_grad_(True)
    _verdict(lambda: entry(_gradgrad_fn, (x,), **kwargs))


def run_worker(name: str, side: str, quick: bool, opts: dict, cold: bool = False) -> dict:
    """Run case ``name`` on ``side`` and return its record; ``cold``: no warm-up at all,
    the timed check is the first of the process (after the imports of torch, agcheck
    and what building the case needs: the OpInfo sweep's op_db)."""
    import torch

    import agcheck  # noqa: F401 -- imported on both sides so the baselines match

    case = CASES[name]
    entry = _entry(side, case.check)
    res: dict[str, Any] = {
        "case": name, "side": side, "quick": quick, "detail": case.describe(quick, opts),
        "torch_threads": torch.get_num_threads(), "pid": os.getpid(), "cold": cold,
    }
    warm_up = (lambda entry, kwargs: None) if cold else _warm_up
    if entry is None:
        res.update(verdict="n/a", time_s=None, peak_mb=None, mem_method=None)
        return res

    if case.check == "sweep":
        source, items = case.build(quick, opts)
        res["sweep_source"] = source
        poller = AnonPoller()
        meter = PeakMeter(poller)
        warm_up(entry, {"check_forward_ad": True, "check_batched_grad": True})
        total = 0.0
        cpu = 0.0
        peak = 0
        anon_peak = None
        res["loadavg_before"] = _loadavg()
        verdicts = []
        per_item = []
        for i, (label, fn, inputs, kwargs) in enumerate(items):
            torch.manual_seed(SEED + i)  # fast-mode / batched checks may draw from it
            meter.start()
            c0 = _cpu_s()
            t0 = time.perf_counter()
            v = _verdict(lambda: entry(fn, inputs, **kwargs))
            dt = time.perf_counter() - t0
            cpu += _cpu_s() - c0
            kb, method = meter.stop()
            anon_kb = meter.anon_growth()
            total += dt
            peak = max(peak, kb)
            if anon_kb is not None:
                anon_peak = max(anon_peak or 0, anon_kb)
            verdicts.append(v)
            per_item.append({"label": label, "verdict": v, "time_s": dt, "peak_mb": kb / 1024})
        n_true = sum(v == "True" for v in verdicts)
        warm = []
        for i, (label, fn, inputs, kwargs) in enumerate([] if cold else items):  # again, in the same process
            torch.manual_seed(SEED + i)
            c0 = _cpu_s()
            _verdict(lambda: entry(fn, inputs, **kwargs))
            warm.append(_cpu_s() - c0)
        res["warm_cpu_s"] = None if cold else sum(warm)
        poller.close()
        res.update(
            time_s=total, cpu_s=cpu, peak_mb=peak / 1024,
            anon_mb=None if anon_peak is None else anon_peak / 1024, mem_method=(method + ", max over samples") if items else None,
            verdict=f"{n_true}/{len(verdicts)} True", verdicts=verdicts, items=per_item,
        )
        return res

    fn, inputs, kwargs = case.build(quick, opts)
    res["kwargs"] = {k: repr(v) for k, v in kwargs.items()}
    poller = AnonPoller()
    meter = PeakMeter(poller)
    warm_up(entry, kwargs)
    torch.manual_seed(SEED)  # fast mode may draw its random vectors from the global RNG
    res["loadavg_before"] = _loadavg()
    meter.start()
    c0 = _cpu_s()
    t0 = time.perf_counter()
    v = _verdict(lambda: entry(fn, inputs, **kwargs))
    dt = time.perf_counter() - t0
    cpu = _cpu_s() - c0
    kb, method = meter.stop()
    file_kb = meter.file_growth()
    anon_kb = meter.anon_growth()
    poller.close()
    res.update(time_s=dt, cpu_s=cpu, peak_mb=kb / 1024, mem_method=method, verdict=v,
               file_mb=None if file_kb is None else file_kb / 1024,
               anon_mb=None if anon_kb is None else anon_kb / 1024)
    if cold:
        return res
    # the same check again in the same process: what a test suite that runs many checks
    # pays per check once both libraries' lazy imports and first-call costs are behind it
    torch.manual_seed(SEED)
    c0 = _cpu_s()
    _verdict(lambda: entry(fn, inputs, **kwargs))
    res["warm_cpu_s"] = _cpu_s() - c0
    return res


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--worker", required=True, choices=sorted(CASES))
    p.add_argument("--side", required=True, choices=["torch", "agcheck"])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--opinfo-ops", type=int, default=None)
    p.add_argument("--opinfo-source", choices=["auto", "sweep", "own"], default="auto")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    p.add_argument("--cold", action="store_true", help="no warm-up: time the process's first check")
    a = p.parse_args(argv)
    if a.threads is not None:
        import torch

        torch.set_num_threads(a.threads)
    opts = {"opinfo_source": a.opinfo_source}
    if a.opinfo_ops is not None:
        opts["opinfo_ops"] = a.opinfo_ops
    res = run_worker(a.worker, a.side, a.quick, opts, cold=a.cold)
    sys.stdout.flush()
    print(MARKER, json.dumps(res), flush=True)
    return 0


if __name__ == "__main__":
    # make ``import agcheck`` find the checkout even when run from elsewhere
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    sys.exit(main())
