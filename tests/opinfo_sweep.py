"""The OpInfo sweep: agcheck's verdict against torch's on PyTorch's operator database.

For every op of ``torch.testing._internal.common_methods_invocations.op_db`` that supports
autograd, every dtype of ``float64`` / ``complex128`` that the op supports for backward on
the CPU, and every sample of ``op.sample_inputs("cpu", dtype, requires_grad=True)``, the
function under test is built the way PyTorch's own ``TestGradients._check_helper``
(``torch/testing/_internal/common_utils.py``) builds it:

- the gradcheck inputs are the tensors that require grad among ``sample.input`` (or its
  members when it is a list of tensors), ``sample.args`` and ``sample.kwargs.values()``;
- the function puts them back in place, calls ``op.gradcheck_wrapper(op.get_op(), ...)``
  and passes the result through ``sample.output_process_fn_grad``;
- conjugated samples are included for complex dtypes when ``op.test_conjugated_samples``.

Both checkers get the op's own settings -- ``nondet_tol=op.gradcheck_nondet_tol``,
``check_batched_grad=op.check_batched_grad``, ``check_forward_ad=op.supports_forward_ad``,
``check_batched_forward_grad=op.check_batched_forward_grad`` (only with forward AD),
``check_grad_dtypes=True`` (as PyTorch's helper), ``check_undefined_grad`` left at its
default (True) -- and ``fast_mode`` from the mode being swept (``slow``: False, ``fast``:
True, ``op``: the op's ``gradcheck_fast_mode``, None meaning True as in PyTorch's
testing wrapper).

Each side gets its own freshly generated samples (the generation is seeded, and the two
generations are compared bitwise; if they differ, the second side gets a deep copy of the
first side's samples) and the global RNG is seeded identically (``torch.manual_seed``)
before each call. Outcomes are recorded as ``pass`` or the exception (type and first line
of the message) and compared by *verdict*:

- pass / pass agree;
- a GradcheckError (torch's or agcheck's class) on both sides agrees;
- any other exception of torch agrees when agcheck raises an exception of the same type
  (an instance of torch's exception type that is not a GradcheckError);
- torch's checker crashing inside its own module (not in the op) while agcheck passes
  agrees *by explanation* when torch, rerun on a fresh sample with the function
  restricted to its floating-point and complex outputs, passes (:func:`explain_crash`:
  ``linalg.lstsq``, whose integer ``rank`` output derails torch's Jacobian assembly);
  these are listed apart in the summary;
- a call that exceeded ``--timeout`` on either side is *undecided*, counted apart.

Usage::

    python -m tests.opinfo_sweep --help
    python -m tests.opinfo_sweep --ops sin,linalg.det --fast both
    python -m tests.opinfo_sweep --against torch            # torch against itself
    python -m tests.opinfo_sweep --ops max.reduction_with_dim --dtypes complex128 \
        --fast slow --sample 3 -v                            # one sample, for a repro
    python -m tests.opinfo_sweep --start-at slice -v         # resume at an op (op_db order)
    python -m tests.opinfo_sweep --fast slow --force-engine --engine-fallbacks
                                 # the engine on every check, its fallbacks on errors counted

Slow-mode samples whose dense Jacobians have more than ``--max-slow-entries`` entries
(input elements requiring grad x floating/complex output elements; default
``DEFAULT_MAX_SLOW_ENTRIES``) are reported as skips, not compared: torch's slow-mode
gradcheck holds eight to nine Jacobian-sized buffers at once (about 140 bytes per entry in
complex128), so ``slice``'s second complex128 sample (a 24,000 x 21,600 Jacobian) alone
needs some 70 GB (docs/verification.md). ``--max-slow-entries 0`` compares everything.

The module is importable: :func:`iter_ops`, :func:`run_op`, :class:`Summary` are what
``tests/test_opinfo.py`` uses.
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import copy
import dataclasses
import fnmatch
import json
import logging
import os
import signal
import sys
import threading
import time
import traceback
import warnings
from itertools import chain
from typing import Any, Callable, Iterable, Iterator, Sequence

import torch
from torch.autograd.gradcheck import GradcheckError as TorchGradcheckError

DEVICE = "cpu"
DTYPES = {"float64": torch.float64, "complex128": torch.complex128}
MODES = ("slow", "fast")
ALL_MODES = ("slow", "fast", "op")
SAMPLE_SEED = 1234  # torch.manual_seed before generating an op's samples
CALL_SEED = 0  # torch.manual_seed(CALL_SEED + sample index) before each gradcheck call
#: slow-mode samples with larger dense Jacobians (input x output elements) are skipped:
#: torch's slow gradcheck peaks at ~140 bytes per entry in complex128, ~60 in float64
#: (docs/verification.md), so a sample at the limit needs up to ~7 GB. 47 of op_db's
#: ~24,800 float64/complex128 samples are over it (slice, slice_scatter, sort, msort,
#: grid_sampler_3d, nn.functional.conv_transpose3d); the largest kept is 2.25e7 entries.
DEFAULT_MAX_SLOW_ENTRIES = 50_000_000

# The test names of PyTorch's own gradient tests, to report their skip / xfail marks.
_TORCH_SUITE_TESTS = (
    ("TestGradients", "test_fn_grad"),
    ("TestFwdGradients", "test_forward_mode_AD"),
)


# --------------------------------------------------------------------------------------
# the op database
# --------------------------------------------------------------------------------------


def op_db() -> list:
    from torch.testing._internal.common_methods_invocations import op_db as _op_db

    return list(_op_db)


def autograd_ops() -> list:
    """The ops of op_db that support autograd, in op_db order."""
    return [op for op in op_db() if op.supports_autograd]


def op_dtypes(op, wanted: Iterable[str] = ("float64", "complex128")) -> list[str]:
    """The dtypes (names) among ``wanted`` the op supports for gradcheck on the CPU.

    PyTorch's test_fn_grad runs a dtype when the op supports it and it is among the op's
    backward dtypes (OpInfo has no separate complex-autograd flag: an op without complex
    autograd leaves the complex dtypes out of ``backward_dtypes``).
    """
    supported = op.supported_dtypes(DEVICE)
    backward = op.supported_backward_dtypes(DEVICE)
    out = []
    for name in wanted:
        dt = DTYPES[name]
        if dt not in supported or dt not in backward:
            continue
        out.append(name)
    return out


def _matches(op, pattern: str) -> bool:
    if any(c in pattern for c in "*?["):
        return fnmatch.fnmatchcase(op.full_name, pattern) or fnmatch.fnmatchcase(op.name, pattern)
    return pattern in op.full_name


def iter_ops(ops: str | Sequence[str] | None = None) -> list:
    """Autograd ops selected by ``ops``.

    ``ops``: None (all) or a comma list / sequence of patterns. A pattern equal to an op's
    full name (``name`` or ``name.variant``) selects that op only; else a pattern equal to
    an op's name selects all its variants; a pattern with ``*?[`` is a glob; any other
    pattern is a substring of the full name.
    """
    all_ops = autograd_ops()
    if ops is None:
        return all_ops
    patterns = [p.strip() for p in (ops.split(",") if isinstance(ops, str) else ops) if p.strip()]
    chosen: list = []
    seen: set[str] = set()
    for pat in patterns:
        hits = [op for op in all_ops if op.full_name == pat]
        if not hits:
            hits = [op for op in all_ops if op.name == pat]  # every variant of the op
        if not hits:
            hits = [op for op in all_ops if _matches(op, pat)]
        for op in hits:
            if op.full_name not in seen:
                seen.add(op.full_name)
                chosen.append(op)
    return chosen


def find_op(full_name: str):
    for op in autograd_ops():
        if op.full_name == full_name:
            return op
    raise KeyError(f"no autograd op named {full_name!r} in op_db")


def torch_suite_marks(op, dtype_name: str) -> list[str]:
    """Skip / xfail marks PyTorch's own gradient tests put on (op, dtype) on the CPU."""
    marks = []
    dt = DTYPES[dtype_name]
    for d in getattr(op, "decorators", ()) or ():
        if not hasattr(d, "is_active"):
            continue
        for cls_name, test_name in _TORCH_SUITE_TESTS:
            try:
                active = d.is_active(cls_name, test_name, DEVICE, dt, {})
            except Exception:
                active = False
            if active and d.cls_name == cls_name and d.test_name == test_name:
                kinds = []
                for dec in d.decorators:
                    qn = getattr(dec, "__qualname__", "") or getattr(dec, "__name__", "")
                    kinds.append("xfail" if "expectedFailure" in qn else "skip" if "skip" in qn.lower() else qn)
                marks.append(f"{test_name}:{'/'.join(kinds)}")
    return marks


# --------------------------------------------------------------------------------------
# samples -> (fn, inputs), as PyTorch's TestGradients._check_helper builds them
# --------------------------------------------------------------------------------------


def _is_tensor_list(x) -> bool:
    from torch.testing._internal.common_utils import is_iterable_of_tensors

    return is_iterable_of_tensors(x)


def _wants_grad(x) -> bool:
    return isinstance(x, torch.Tensor) and x.requires_grad


@contextlib.contextmanager
def _no_test_fn_lookup():
    """op.sample_inputs looks for the running unittest test function by walking the whole
    stack with inspect.stack() (0.1-0.4 s a call under pytest); outside a unittest.TestCase
    it finds none. Answer "none" directly while samples are generated."""
    from torch.testing._internal import common_utils
    from torch.testing._internal.opinfo import core

    saved = [(m, m.extract_test_fn) for m in (common_utils, core) if hasattr(m, "extract_test_fn")]
    for m, _ in saved:
        m.extract_test_fn = lambda: None
    try:
        yield
    finally:
        for m, f in saved:
            m.extract_test_fn = f


def generate_samples(op, dtype_name: str, limit: int | None = None) -> list:
    """The op's samples for ``dtype_name``, seeded so that two calls give the same."""
    dt = DTYPES[dtype_name]
    include_conj = bool(op.test_conjugated_samples and dt.is_complex)
    out: list = []
    if limit is not None and limit <= 0:
        return out
    with _no_test_fn_lookup():
        torch.manual_seed(SAMPLE_SEED)
        it = op.sample_inputs(DEVICE, dt, requires_grad=True, include_conjugated_inputs=include_conj)
        for s in it:
            out.append(s)
            if limit is not None and len(out) >= limit:
                break
    return out


def _gradcheck_args(sample) -> tuple:
    if _is_tensor_list(sample.input):
        all_args = chain(sample.input, sample.args, sample.kwargs.values())
    else:
        all_args = chain((sample.input,), sample.args, sample.kwargs.values())
    return tuple(x for x in all_args if _wants_grad(x))


def _recomposed_count(sample) -> int:
    """How many tensors the recomposition of PyTorch's helper consumes."""

    def count(x):
        if _is_tensor_list(x):
            return sum(1 for t in x if _wants_grad(t))
        return 1 if _wants_grad(x) else 0

    return count(sample.input) + sum(count(a) for a in sample.args) + sum(count(v) for v in sample.kwargs.values())


def skip_reason(sample) -> str | None:
    """Why a sample cannot be gradchecked the way PyTorch's tests gradcheck it, or None."""
    args = _gradcheck_args(sample)
    if not args:
        return "no tensor requiring grad among the sample's input/args/kwargs"
    if _recomposed_count(sample) != len(args):
        return "tensors requiring grad inside a list in args/kwargs (PyTorch's helper does not collect them)"
    if any(t.grad is not None for t in args):
        return "a sampled input already has .grad (tensor reused across samples)"
    return None


def build_check(op, sample) -> tuple[Callable, tuple]:
    """(fn, gradcheck inputs) for one sample, as PyTorch's _check_helper builds them."""
    variant = op.get_op()
    gradcheck_args = _gradcheck_args(sample)

    def put_back(inputs, x, idx):
        if _is_tensor_list(x):
            rebuilt = []
            for t in x:
                if _wants_grad(t):
                    rebuilt.append(inputs[idx])
                    idx += 1
                else:
                    rebuilt.append(t)
            return rebuilt, idx
        if _wants_grad(x):
            return inputs[idx], idx + 1
        return x, idx

    def fn(*inputs):
        idx = 0
        first, idx = put_back(inputs, sample.input, idx)
        positional = [first]
        for a in sample.args:
            a, idx = put_back(inputs, a, idx)
            positional.append(a)
        kwargs = {}
        for k, v in sample.kwargs.items():
            kwargs[k], idx = put_back(inputs, v, idx)
        out = op.gradcheck_wrapper(variant, *positional, **kwargs)
        if sample.output_process_fn_grad is not None:
            return sample.output_process_fn_grad(out)
        return out

    fn.__name__ = f"opinfo_{op.formatted_name}"
    return fn, gradcheck_args


def slow_jacobian_entries(fn, inputs) -> int:
    """Entries of the dense Jacobians a slow-mode gradcheck of ``fn`` builds: elements of
    the inputs requiring grad times elements of the floating / complex outputs (one
    evaluation of ``fn``, without grad)."""
    n_in = sum(t.numel() for t in inputs if isinstance(t, torch.Tensor) and t.requires_grad)
    with torch.no_grad():
        outs = fn(*inputs)
    outs = outs if isinstance(outs, (tuple, list)) else (outs,)
    n_out = sum(o.numel() for o in outs if isinstance(o, torch.Tensor) and (o.is_floating_point() or o.is_complex()))
    return n_in * n_out


def too_large_for_slow_mode(fn, inputs, max_entries: int | None) -> int | None:
    """The Jacobian entries of a slow-mode check of ``fn`` when they exceed
    ``max_entries`` (the sample is to be skipped), else None."""
    if not max_entries:
        return None
    try:
        entries = slow_jacobian_entries(fn, inputs)
    except Exception:  # noqa: BLE001 - the checkers will meet it and report it
        return None
    return entries if entries > max_entries else None


def check_kwargs(op, mode: str) -> dict:
    """The gradcheck keywords for ``op`` in ``mode`` (slow / fast / op)."""
    if mode == "slow":
        fast = False
    elif mode == "fast":
        fast = True
    elif mode == "op":
        fast = True if op.gradcheck_fast_mode is None else bool(op.gradcheck_fast_mode)
    else:
        raise ValueError(f"unknown mode {mode!r}")
    fwd = bool(op.supports_forward_ad)
    return dict(
        check_batched_grad=bool(op.check_batched_grad),
        check_grad_dtypes=True,
        nondet_tol=op.gradcheck_nondet_tol,
        fast_mode=fast,
        check_forward_ad=fwd,
        check_backward_ad=True,
        check_batched_forward_grad=bool(op.check_batched_forward_grad) if fwd else False,
    )


# --------------------------------------------------------------------------------------
# sample identity (to tell whether two generations are the same)
# --------------------------------------------------------------------------------------


def _leaves(x) -> Iterator:
    if isinstance(x, torch.Tensor):
        yield x
    elif isinstance(x, dict):
        for k, v in x.items():
            yield k
            yield from _leaves(v)
    elif isinstance(x, (list, tuple)):
        yield type(x)
        for v in x:
            yield from _leaves(v)
    else:
        yield x


def _same_tensor(a: torch.Tensor, b: torch.Tensor) -> bool:
    try:
        if (a.dtype, a.shape, a.layout, a.requires_grad) != (b.dtype, b.shape, b.layout, b.requires_grad):
            return False
        if a.layout == torch.strided:
            if a.stride() != b.stride() or a.storage_offset() != b.storage_offset():
                return False
            if a.is_conj() != b.is_conj() or a.is_neg() != b.is_neg():
                return False
            if (a.grad_fn is None) != (b.grad_fn is None):
                return False
        with torch.no_grad():
            x, y = a.detach(), b.detach()
            if x.layout != torch.strided:
                x, y = x.to_dense(), y.to_dense()
            torch.testing.assert_close(
                x.resolve_conj().resolve_neg(), y.resolve_conj().resolve_neg(), rtol=0, atol=0, equal_nan=True
            )
            return True
    except Exception:
        return False


def same_samples(s1: Sequence, s2: Sequence) -> bool:
    if len(s1) != len(s2):
        return False
    for a, b in zip(s1, s2):
        la = list(_leaves((a.input, a.args, a.kwargs)))
        lb = list(_leaves((b.input, b.args, b.kwargs)))
        if len(la) != len(lb):
            return False
        for x, y in zip(la, lb):
            if isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor):
                if not (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) and _same_tensor(x, y)):
                    return False
            else:
                try:
                    if x != y and x is not y:
                        return False
                except Exception:
                    if type(x) is not type(y):
                        return False
    return True


def describe_sample(sample) -> str:
    """A short one-line description: shapes/dtypes of tensors, repr of the rest."""

    def d(x):
        if isinstance(x, torch.Tensor):
            flags = []
            if x.requires_grad:
                flags.append("rg")
            if x.layout != torch.strided:
                flags.append(str(x.layout).replace("torch.", ""))
            elif not x.is_contiguous():
                flags.append(f"stride={tuple(x.stride())}")
            if x.is_conj():
                flags.append("conj")
            dt = str(x.dtype).replace("torch.", "")
            return f"T{tuple(x.shape)}:{dt}" + (f"[{','.join(flags)}]" if flags else "")
        if isinstance(x, (list, tuple)):
            inner = ", ".join(d(v) for v in x)
            return f"[{inner}]" if isinstance(x, list) else f"({inner})"
        if isinstance(x, dict):
            return "{" + ", ".join(f"{k}={d(v)}" for k, v in x.items()) + "}"
        r = repr(x)
        return r if len(r) <= 60 else r[:57] + "..."

    parts = [d(sample.input)]
    parts += [d(a) for a in sample.args]
    parts += [f"{k}={d(v)}" for k, v in sample.kwargs.items()]
    s = ", ".join(parts)
    if sample.output_process_fn_grad is not None:
        name = getattr(sample.output_process_fn_grad, "__name__", "fn")
        s += f" | output_process_fn_grad={name}"
    if getattr(sample, "name", ""):
        s += f" | name={sample.name!r}"
    return s


# --------------------------------------------------------------------------------------
# running one checker
# --------------------------------------------------------------------------------------


class CallTimeout(BaseException):
    """Raised in the main thread when a gradcheck call exceeds --timeout.

    A BaseException so that no ``except Exception`` inside a checker swallows it.
    """


@contextlib.contextmanager
def _time_limit(seconds: float | None):
    usable = (
        seconds
        and seconds > 0
        and hasattr(signal, "setitimer")
        and threading.current_thread() is threading.main_thread()
    )
    if not usable:
        yield
        return

    def handler(signum, frame):
        raise CallTimeout(f"exceeded {seconds:g} s")

    old = signal.signal(signal.SIGALRM, handler)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _agcheck_gradcheck_errors() -> tuple:
    try:
        import agcheck

        return (agcheck.GradcheckError,)
    except Exception:
        return ()


def is_gradcheck_error(exc: BaseException) -> bool:
    return isinstance(exc, (TorchGradcheckError,) + _agcheck_gradcheck_errors())


@dataclasses.dataclass
class Outcome:
    kind: str  # "pass" | "false" (returned False) | "gradcheck_error" | "exception" | "timeout"
    exc_type: str = ""
    message: str = ""
    seconds: float = 0.0  # wall clock
    cpu_seconds: float = 0.0  # process CPU time (all threads): robust on a loaded machine
    exc: BaseException | None = dataclasses.field(default=None, repr=False, compare=False)
    #: the exception was raised inside torch/autograd/gradcheck.py itself (read from the
    #: traceback before it is dropped: its frames hold the check's Jacobians)
    in_torch_gradcheck: bool = False

    @property
    def verdict(self) -> str:
        if self.kind == "pass":
            return "pass"
        if self.kind == "gradcheck_error":
            return "GradcheckError"
        if self.kind == "exception":
            return self.exc_type
        return self.kind

    def short(self) -> str:
        if self.kind == "pass":
            return "pass"
        if self.kind == "false":
            return "returned False"
        if self.kind == "timeout":
            return f"timeout ({self.message})"
        return f"{self.exc_type}: {self.message}"

    def to_json(self) -> dict:
        return {
            "kind": self.kind,
            "exc_type": self.exc_type,
            "message": self.message,
            "seconds": round(self.seconds, 4),
            "cpu_seconds": round(self.cpu_seconds, 4),
        }


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    for line in text.splitlines():
        if line.strip():
            return line.strip()[:300]
    return ""


def _qualname(t: type) -> str:
    mod = t.__module__
    return t.__qualname__ if mod in ("builtins", None) else f"{mod}.{t.__qualname__}"


def _raised_in_torch_gradcheck(exc: BaseException | None) -> bool:
    tb = None if exc is None else exc.__traceback__
    last = None
    while tb is not None:
        last = tb.tb_frame.f_code.co_filename
        tb = tb.tb_next
    return bool(last) and last.replace("\\", "/").endswith("torch/autograd/gradcheck.py")


def _drop_frames(exc: BaseException) -> None:
    """Drop the tracebacks of ``exc`` and of the exceptions chained to it: their frames
    keep the failed check's locals alive (a slow-mode check's Jacobians, gigabytes), and
    the outcome is held while the other checker runs."""
    todo, seen = [exc], set()
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        e.__traceback__ = None
        todo += [e.__cause__, e.__context__]


def run_checker(check: Callable, fn: Callable, inputs: tuple, kwargs: dict, seed: int, timeout: float | None) -> Outcome:
    torch.manual_seed(seed)
    c0 = time.process_time()
    t0 = time.perf_counter()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with _time_limit(timeout):
                ok = check(fn, inputs, raise_exception=True, **kwargs)
        return Outcome("pass" if ok else "false", seconds=time.perf_counter() - t0, cpu_seconds=time.process_time() - c0)
    except CallTimeout as e:
        _drop_frames(e)
        return Outcome("timeout", "CallTimeout", str(e), time.perf_counter() - t0, time.process_time() - c0, e)
    except Exception as e:  # noqa: BLE001 - every failure is an outcome
        dt, ct = time.perf_counter() - t0, time.process_time() - c0
        kind = "gradcheck_error" if is_gradcheck_error(e) else "exception"
        inside = _raised_in_torch_gradcheck(e)
        _drop_frames(e)
        return Outcome(kind, _qualname(type(e)), _first_line(e), dt, ct, e, in_torch_gradcheck=inside)


def verdicts_agree(ref: Outcome, cand: Outcome) -> bool | None:
    """True / False, or None (undecided) when either side timed out."""
    if ref.kind == "timeout" or cand.kind == "timeout":
        return None
    if ref.kind in ("pass", "false", "gradcheck_error"):
        return ref.kind == cand.kind
    # torch raised something that is not a GradcheckError
    if torch_checker_crashed(ref) and cand.kind == "gradcheck_error":
        return True  # both reject the sample; torch's checker crashed while doing so
    if cand.kind != "exception" or cand.exc is None or ref.exc is None:
        return False
    return isinstance(cand.exc, type(ref.exc))


def torch_checker_crashed(ref: Outcome) -> bool:
    """torch's exception was raised inside torch's gradcheck module itself (an IndexError
    pairing outputs, a dtype error while building a failure message), not by the op or by
    the function under test. agcheck reports those samples with a GradcheckError instead,
    a deliberate difference (docs/semantics.md)."""
    if ref.kind != "exception" or ref.exc is None:
        return False
    return ref.in_torch_gradcheck or _raised_in_torch_gradcheck(ref.exc)


def differentiable_outputs_only(fn: Callable) -> Callable:
    """``fn`` returning only its floating-point and complex tensor outputs."""

    def restricted(*args):
        out = fn(*args)
        outs = out if isinstance(out, (tuple, list)) else (out,)
        return tuple(o for o in outs if isinstance(o, torch.Tensor) and (o.is_floating_point() or o.is_complex()))

    return restricted


def explain_crash(ref: Outcome, cand: Outcome, rerun: Callable[[], Outcome]) -> str:
    """Why torch's crash beside agcheck's pass still counts as agreement, or "".

    When torch's checker raised from inside its own module (``linalg.lstsq``: an integer
    output between floating ones makes torch's numerical-Jacobian assembly write the
    columns of one output into another's Jacobian) and agcheck passed, ``rerun`` runs
    torch's checker again on the sample's differentiable outputs alone. Its pass is
    torch's verdict on everything that has a derivative, and agcheck's pass agrees with
    it; anything else stays a disagreement."""
    if not (torch_checker_crashed(ref) and cand.kind == "pass"):
        return ""
    again = rerun()
    if again.kind != "pass":
        return ""
    return "torch's checker crashed in its own code; on the differentiable outputs alone torch passes"


def torch_gradcheck(fn, inputs, **kw):
    return torch.autograd.gradcheck(fn, inputs, **kw)


def agcheck_gradcheck(fn, inputs, **kw):
    import agcheck

    return agcheck.gradcheck(fn, inputs, backend="torch", **kw)


# "none": run torch alone (the candidate's outcome is torch's; used to time the sweep).
CHECKERS: dict[str, Callable | None] = {"torch": torch_gradcheck, "agcheck": agcheck_gradcheck, "none": None}


# --------------------------------------------------------------------------------------
# results
# --------------------------------------------------------------------------------------


@dataclasses.dataclass
class SampleResult:
    op: str
    dtype: str
    mode: str
    index: int
    sample: str
    kwargs: dict
    ref: Outcome
    cand: Outcome
    agree: bool | None
    marks: list[str]
    regenerated: bool = True  # False: the candidate got a deep copy (samples not reproducible)
    #: why an agreement that is not a plain match counts as one (see :func:`explain_crash`)
    explanation: str = ""

    @property
    def status(self) -> str:
        return "agree" if self.agree else "undecided" if self.agree is None else "DISAGREE"

    def repro(self, against: str = "agcheck") -> str:
        return (
            f"python -m tests.opinfo_sweep --ops {self.op} --dtypes {self.dtype} --fast {self.mode} "
            f"--sample {self.index} --against {against} -v"
        )

    def line(self) -> str:
        return (
            f"{self.status:9s} {self.op} {self.dtype} {self.mode} #{self.index}: "
            f"torch={self.ref.short()} | cand={self.cand.short()}"
            + (f" [explained: {self.explanation}]" if self.explanation else "")
        )

    def to_json(self) -> dict:
        return {
            "op": self.op,
            "dtype": self.dtype,
            "mode": self.mode,
            "index": self.index,
            "sample": self.sample,
            "kwargs": {k: (v if isinstance(v, (bool, int, float, type(None))) else str(v)) for k, v in self.kwargs.items()},
            "torch": self.ref.to_json(),
            "candidate": self.cand.to_json(),
            "status": self.status,
            "marks": self.marks,
            "regenerated": self.regenerated,
            "explanation": self.explanation,
        }


@dataclasses.dataclass
class Skip:
    op: str
    dtype: str | None
    index: int | None
    reason: str
    detail: str = ""  # e.g. the Jacobian entries of a sample too large for slow mode

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def _counted_by_reason(items, reason_of, max_names: int | None = None) -> list[str]:
    """One line per reason, most frequent first: its count, the reason and its ops."""
    by: dict[str, list] = {}
    for item in items:
        by.setdefault(reason_of(item), []).append(item)
    lines = []
    for reason, group in sorted(by.items(), key=lambda kv: -len(kv[1])):
        names = sorted({item.op for item in group})
        shown = ", ".join(names[:max_names]) + (", ..." if max_names is not None and len(names) > max_names else "")
        lines.append(f"  {len(group):5d}  {reason}  [{shown}]")
    return lines


@dataclasses.dataclass
class Summary:
    results: list[SampleResult] = dataclasses.field(default_factory=list)
    skips: list[Skip] = dataclasses.field(default_factory=list)
    against: str = "agcheck"
    wall_seconds: float = 0.0

    def extend(self, other: "Summary") -> None:
        self.results += other.results
        self.skips += other.skips
        self.wall_seconds += other.wall_seconds

    @property
    def agreements(self) -> list[SampleResult]:
        return [r for r in self.results if r.agree is True]

    @property
    def disagreements(self) -> list[SampleResult]:
        return [r for r in self.results if r.agree is False]

    @property
    def explained(self) -> list[SampleResult]:
        return [r for r in self.results if r.agree is True and r.explanation]

    @property
    def undecided(self) -> list[SampleResult]:
        return [r for r in self.results if r.agree is None]

    @property
    def torch_seconds(self) -> float:
        return sum(r.ref.seconds for r in self.results)

    @property
    def cand_seconds(self) -> float:
        return sum(r.cand.seconds for r in self.results)

    @property
    def torch_cpu_seconds(self) -> float:
        return sum(r.ref.cpu_seconds for r in self.results)

    @property
    def cand_cpu_seconds(self) -> float:
        return sum(r.cand.cpu_seconds for r in self.results)

    def table(self) -> list[tuple]:
        keys = sorted({(r.mode, r.dtype) for r in self.results}, key=lambda k: (ALL_MODES.index(k[0]), k[1]))
        rows = []
        for mode, dt in keys:
            rs = [r for r in self.results if r.mode == mode and r.dtype == dt]
            rows.append(
                (
                    mode,
                    dt,
                    len(rs),
                    sum(r.agree is True for r in rs),
                    sum(r.agree is False for r in rs),
                    sum(r.agree is None for r in rs),
                    sum(r.ref.kind != "pass" for r in rs),
                    sum(r.ref.seconds for r in rs),
                    sum(r.cand.seconds for r in rs),
                    sum(r.ref.cpu_seconds for r in rs),
                    sum(r.cand.cpu_seconds for r in rs),
                )
            )
        return rows

    def format(self, max_list: int | None = None) -> str:
        out = []
        n = len(self.results)
        ops = sorted({r.op for r in self.results})
        out.append(f"OpInfo sweep: torch.autograd.gradcheck vs {self.against}")
        out.append(
            f"samples compared: {n} (ops: {len(ops)}), agreements: {len(self.agreements)} "
            f"({len(self.explained)} by explanation), "
            f"disagreements: {len(self.disagreements)}, undecided (timeouts): {len(self.undecided)}, "
            f"skipped samples: {sum(s.index is not None for s in self.skips)}, "
            f"skipped op/dtype pairs: {sum(s.index is None for s in self.skips)}"
        )
        out.append(
            f"torch total: {self.torch_seconds:.1f} s ({self.torch_cpu_seconds:.1f} s CPU), "
            f"{self.against} (candidate) total: {self.cand_seconds:.1f} s ({self.cand_cpu_seconds:.1f} s CPU), "
            f"sweep wall: {self.wall_seconds:.1f} s"
        )
        out.append("")
        out.append(
            f"{'mode':5s} {'dtype':10s} {'samples':>7s} {'agree':>7s} {'disagree':>8s} {'undec':>5s} "
            f"{'torch-fails':>11s} {'torch s':>9s} {'cand s':>9s} {'torch cpu':>9s} {'cand cpu':>9s}"
        )
        for mode, dt, total, ag, dis, und, tf, ts, cs, tc, cc in self.table():
            out.append(
                f"{mode:5s} {dt:10s} {total:7d} {ag:7d} {dis:8d} {und:5d} {tf:11d} {ts:9.1f} {cs:9.1f} {tc:9.1f} {cc:9.1f}"
            )
        if self.skips:
            out.append("")
            out.append("skips by reason:")
            out += _counted_by_reason(self.skips, lambda s: s.reason, max_names=8)
        if self.disagreements:
            out.append("")
            out.append("disagreements:")
            shown = self.disagreements if max_list is None else self.disagreements[:max_list]
            for r in shown:
                out.append("  " + r.line())
                out.append(f"      sample: {r.sample}")
                out.append(f"      kwargs: {r.kwargs}")
                if r.marks:
                    out.append(f"      torch suite marks: {r.marks}")
                out.append(f"      repro:  {r.repro(self.against)}")
            if max_list is not None and len(self.disagreements) > max_list:
                out.append(f"  ... and {len(self.disagreements) - max_list} more")
        if self.explained:
            out.append("")
            out.append("agreements by explanation (torch's checker crashed in its own code):")
            out += _counted_by_reason(self.explained, lambda r: r.explanation)
        if self.undecided:
            out.append("")
            out.append("undecided (timeouts):")
            for r in self.undecided:
                out.append("  " + r.line())
        return "\n".join(out)


# --------------------------------------------------------------------------------------
# the sweep
# --------------------------------------------------------------------------------------


_WARMED: set = set()


def warm_up(*checks: Callable | None) -> None:
    """One tiny gradcheck per checker and process, so that lazy initialisation (vmap,
    forward AD) is not charged to whichever op happens to run first."""
    for check in checks:
        if check is None or check in _WARMED:
            continue
        _WARMED.add(check)
        x = torch.rand(3, dtype=torch.float64, requires_grad=True)
        for fast in (False, True):
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    check(torch.sin, (x,), raise_exception=False, fast_mode=fast, check_forward_ad=True,
                          check_batched_grad=True, check_batched_forward_grad=True)
            except Exception:  # noqa: BLE001 - warming only
                pass


def run_op(
    op,
    *,
    dtypes: Sequence[str] = ("float64", "complex128"),
    modes: Sequence[str] = MODES,
    limit_samples: int | None = None,
    samples: Sequence[int] | None = None,
    against: str | Callable = "agcheck",
    reference: str | Callable = "torch",
    timeout: float | None = None,
    max_slow_entries: int | None = DEFAULT_MAX_SLOW_ENTRIES,
    on_result: Callable[[SampleResult], None] | None = None,
) -> Summary:
    """Compare the two checkers on every (dtype, mode, sample) of one op.

    Slow-mode samples whose dense Jacobians exceed ``max_slow_entries`` entries are
    skipped (a :class:`Skip`, never an agreement); ``None`` or 0 compares every sample."""
    cand_check = CHECKERS[against] if isinstance(against, str) else against
    ref_check = CHECKERS[reference] if isinstance(reference, str) else reference
    summ = Summary(against=against if isinstance(against, str) else getattr(against, "__name__", "candidate"))
    warm_up(ref_check, cand_check)
    t_start = time.perf_counter()
    name = op.full_name
    usable = op_dtypes(op, dtypes)
    for dt in dtypes:
        if dt not in usable:
            summ.skips.append(Skip(name, dt, None, f"op does not support {dt} for backward on cpu"))
    for dt in usable:
        marks = torch_suite_marks(op, dt)
        limit = limit_samples
        if samples is not None:
            wanted = sorted(set(samples))
            top = wanted[-1] + 1 if wanted else 0
            limit = top if limit is None else min(limit, top)
        try:
            probe = generate_samples(op, dt, limit)
        except Exception as e:  # noqa: BLE001
            summ.skips.append(Skip(name, dt, None, f"sample generation raised {type(e).__name__}"))
            continue
        indices = list(range(len(probe))) if samples is None else [i for i in wanted if i < len(probe)]
        if samples is not None and not indices:
            summ.skips.append(Skip(name, dt, None, f"no sample with index in {wanted}"))
            continue
        runnable = []
        for i in indices:
            reason = skip_reason(probe[i])
            if reason is None:
                runnable.append(i)
            else:
                summ.skips.append(Skip(name, dt, i, reason))
        del probe
        if not runnable:
            continue
        for mode in modes:
            kw = check_kwargs(op, mode)
            ref_samples = generate_samples(op, dt, limit)
            cand_samples = generate_samples(op, dt, limit)
            regenerated = same_samples(ref_samples, cand_samples)
            for i in runnable:
                if not regenerated:
                    try:
                        cand_samples[i] = copy.deepcopy(ref_samples[i])
                    except Exception as e:  # noqa: BLE001
                        summ.skips.append(Skip(name, dt, i, f"samples not reproducible and not deep-copyable ({type(e).__name__})"))
                        continue
                fn_r, in_r = build_check(op, ref_samples[i])
                fn_c, in_c = build_check(op, cand_samples[i])
                if not kw["fast_mode"]:  # "op" mode may be slow too
                    entries = too_large_for_slow_mode(fn_r, in_r, max_slow_entries)
                    if entries is not None:
                        summ.skips.append(Skip(
                            name, dt, i, f"slow-mode Jacobians over --max-slow-entries ({max_slow_entries:.0e})",
                            detail=f"{entries} entries ({mode} mode)"))
                        ref_samples[i] = cand_samples[i] = None
                        continue
                desc = describe_sample(ref_samples[i])
                seed = CALL_SEED + i
                ref = run_checker(ref_check, fn_r, in_r, kw, seed, timeout)
                if cand_check is None:
                    cand = dataclasses.replace(ref, seconds=0.0, cpu_seconds=0.0)
                else:
                    cand = run_checker(cand_check, fn_c, in_c, kw, seed, timeout)
                agree = verdicts_agree(ref, cand)
                explanation = ""
                if agree is False and cand_check is not None:

                    def rerun_on_differentiable_outputs():
                        # torch may have crashed with the inputs perturbed: a fresh sample
                        fresh = generate_samples(op, dt, limit)[i]
                        fn_f, in_f = build_check(op, fresh)
                        return run_checker(ref_check, differentiable_outputs_only(fn_f), in_f, kw, seed, timeout)

                    explanation = explain_crash(ref, cand, rerun_on_differentiable_outputs)
                    agree = True if explanation else agree
                # the exceptions' tracebacks hold the samples' tensors and graphs: let them go
                ref.exc = cand.exc = None
                res = SampleResult(name, dt, mode, i, desc, kw, ref, cand, agree, marks, regenerated, explanation)
                summ.results.append(res)
                if on_result is not None:
                    on_result(res)
                # drop references (and autograd graphs) early
                ref_samples[i] = cand_samples[i] = None
    summ.wall_seconds = time.perf_counter() - t_start
    return summ


def sweep(
    ops: str | Sequence[str] | None = None,
    *,
    on_op: Callable[[Any, Summary], None] | None = None,
    **kw,
) -> Summary:
    total = Summary(against=kw.get("against", "agcheck") if isinstance(kw.get("against", "agcheck"), str) else "candidate")
    for op in iter_ops(ops):
        s = run_op(op, **kw)
        total.extend(s)
        if on_op is not None:
            on_op(op, s)
    return total


# --------------------------------------------------------------------------------------
# command line
# --------------------------------------------------------------------------------------


def _parse_modes(value: str) -> tuple[str, ...]:
    v = value.strip().lower()
    table = {
        "both": ("slow", "fast"),
        "all": ("slow", "fast", "op"),
        "on": ("fast",),
        "true": ("fast",),
        "fast": ("fast",),
        "off": ("slow",),
        "false": ("slow",),
        "slow": ("slow",),
        "op": ("op",),
    }
    if v in table:
        return table[v]
    raise argparse.ArgumentTypeError(f"--fast: expected on/off/both/op/all, got {value!r}")


def _parse_indices(value: str) -> tuple[int, ...]:
    out: list[int] = []
    try:
        for p in value.split(","):
            p = p.strip()
            if not p:
                continue
            if ":" in p:
                a, b = p.split(":", 1)
                out.extend(range(int(a or 0), int(b)))
            else:
                out.append(int(p))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--sample: expected indices like 3, 0,2 or 1:4, got {value!r}") from None
    return tuple(out)


def _parse_dtypes(value: str) -> tuple[str, ...]:
    alias = {"double": "float64", "float64": "float64", "f64": "float64", "cdouble": "complex128", "complex128": "complex128", "c128": "complex128"}
    out = []
    for p in value.split(","):
        p = p.strip().lower()
        if not p:
            continue
        if p not in alias:
            raise argparse.ArgumentTypeError(f"--dtypes: unknown dtype {p!r} (float64, complex128)")
        out.append(alias[p])
    return tuple(dict.fromkeys(out))


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m tests.opinfo_sweep",
        description="Compare agcheck.gradcheck's verdicts with torch.autograd.gradcheck's on PyTorch's OpInfo database.",
    )
    ap.add_argument("--fast", type=_parse_modes, default=("slow", "fast"), metavar="MODE",
                    help="fast_mode to sweep: on (fast), off (slow), both (default), op (the op's gradcheck_fast_mode), all")
    ap.add_argument("--ops", default=None, help="comma list of op full names / names, substrings or globs (default: all autograd ops)")
    ap.add_argument("--exclude", default=None, help="comma list of patterns to leave out")
    ap.add_argument("--start-at", default=None, metavar="OP",
                    help="resume: skip the selected ops before the one with this full name (op_db order)")
    ap.add_argument("--limit-samples", type=int, default=None, metavar="N", help="at most N samples per op and dtype")
    ap.add_argument("--sample", type=_parse_indices, default=None, metavar="IDX",
                    help="only the samples with these indices: 3, 0,2,5 or 1:4")
    ap.add_argument("--dtypes", type=_parse_dtypes, default=("float64", "complex128"), help="float64,complex128 (default both)")
    ap.add_argument("--against", choices=sorted(CHECKERS), default="agcheck",
                    help="the checker compared with torch.autograd.gradcheck (torch: validate the harness; none: time torch alone)")
    ap.add_argument("--timeout", type=float, default=None, metavar="S", help="per-call time limit in seconds (timeouts are 'undecided')")
    ap.add_argument("--max-slow-entries", type=float, default=DEFAULT_MAX_SLOW_ENTRIES, metavar="N",
                    help="skip (and report as skipped) slow-mode samples whose dense Jacobians have more "
                         f"than N entries, input x output elements (default {DEFAULT_MAX_SLOW_ENTRIES:.0e}; "
                         "torch needs ~140 bytes per entry in complex128); 0 compares every sample")
    ap.add_argument("--jsonl", default=None, metavar="PATH", help="write one JSON record per sample (and per skip) to PATH")
    ap.add_argument("--list-ops", action="store_true", help="list the selected ops with their dtypes and settings, then exit")
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    ap.add_argument("--device", default="cpu", help="the samples' device (default cpu; cuda on a GPU machine)")
    ap.add_argument("-v", "--verbose", action="count", default=0, help="-v: a line per op; -vv: a line per sample")
    ap.add_argument("--max-list", type=int, default=200, help="disagreements listed in the summary")
    ap.add_argument("--force-engine", action="store_true",
                    help="agcheck's engine on every check (no loop for small checks, VJPs always worth batching)")
    ap.add_argument("--engine-fallbacks", action="store_true",
                    help="count the checks the engine handed to the reference engine on an exception, by type "
                         "and by the line of agcheck that met it, and print them after the summary")
    args = ap.parse_args(argv)

    global DEVICE
    DEVICE = args.device
    if args.threads:
        torch.set_num_threads(args.threads)
    ops = iter_ops(args.ops)
    if args.exclude:
        drop = {op.full_name for op in iter_ops(args.exclude)}
        ops = [op for op in ops if op.full_name not in drop]
    if args.start_at:
        names = [op.full_name for op in ops]
        if args.start_at not in names:
            ap.error(f"--start-at: {args.start_at!r} is not among the selected ops")
        ops = ops[names.index(args.start_at):]
    if args.list_ops:
        for op in ops:
            dts = op_dtypes(op, args.dtypes)
            print(
                f"{op.full_name:50s} dtypes={','.join(dts) or '-':18s} fast_mode={op.gradcheck_fast_mode!s:5s} "
                f"nondet_tol={op.gradcheck_nondet_tol:g} fwd={op.supports_forward_ad} bgrad={op.check_batched_grad} "
                f"bfwd={op.check_batched_forward_grad}"
            )
        return 0
    if args.against == "agcheck":
        import agcheck  # noqa: F401  - fail early when agcheck is not importable
    fallbacks = FallbackCounter() if args.engine_fallbacks else None
    undo = contextlib.ExitStack()  # the forced engine and the counter, undone after the sweep

    jf = open(args.jsonl, "w") if args.jsonl else None
    total = Summary(against=args.against)
    t0 = time.perf_counter()

    def on_result(r: SampleResult):
        if jf:
            jf.write(json.dumps(r.to_json()) + "\n")
            jf.flush()
        if args.verbose >= 2 or (args.verbose and r.agree is not True):
            print("  " + r.line(), flush=True)
            if args.verbose >= 2 or r.agree is False:
                print(f"      sample: {r.sample}", flush=True)

    try:
        if args.force_engine:
            undo.enter_context(forced_engine())
        if fallbacks is not None:
            fallbacks.attach()
            undo.callback(fallbacks.detach)
        for k, op in enumerate(ops):
            s = run_op(
                op,
                dtypes=args.dtypes,
                modes=args.fast,
                limit_samples=args.limit_samples,
                samples=args.sample,
                against=args.against,
                timeout=args.timeout,
                max_slow_entries=int(args.max_slow_entries),
                on_result=on_result,
            )
            total.extend(s)
            if jf:
                for sk in s.skips:
                    jf.write(json.dumps({"skip": sk.to_json()}) + "\n")
                jf.flush()
            if args.verbose:
                print(
                    f"[{k + 1}/{len(ops)}] {op.full_name}: {len(s.results)} compared, {len(s.disagreements)} disagree, "
                    f"{len(s.undecided)} undecided, {len(s.skips)} skips; torch {s.torch_seconds:.2f}s "
                    f"(cpu {s.torch_cpu_seconds:.2f}), {args.against} {s.cand_seconds:.2f}s "
                    f"(cpu {s.cand_cpu_seconds:.2f}), wall {s.wall_seconds:.2f}s",
                    flush=True,
                )
    finally:
        if jf:
            jf.close()
        undo.close()
    total.wall_seconds = time.perf_counter() - t0
    print()
    print(total.format(max_list=args.max_list))
    if fallbacks is not None:
        print()
        print(fallbacks.table())
    return 1 if total.disagreements else 0


@contextlib.contextmanager
def forced_engine():
    """agcheck's engine on every check: no loop for checks estimated to be cheap, VJPs
    always worth batching (the constants restored after)."""
    from agcheck.engine import cost

    saved = cost.ENGINE_FROM_CALLS, cost.BATCHED_VJPS_FROM_CALLS
    cost.ENGINE_FROM_CALLS = cost.BATCHED_VJPS_FROM_CALLS = 0
    try:
        yield
    finally:
        cost.ENGINE_FROM_CALLS, cost.BATCHED_VJPS_FROM_CALLS = saved


class FallbackCounter(logging.Handler):
    """Counts the engine's fallbacks on exceptions (the ``agcheck.engine`` logger's DEBUG
    records) by exception type, first line of the message and the innermost line of
    agcheck's code it passed through: a framework's errors (a missing batching rule) are
    expected there, an error of agcheck's own code is a bug that the fallback hides."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.counts = collections.Counter()
        self._level = logging.NOTSET  # the logger's own, restored by detach()

    def attach(self) -> None:
        log = logging.getLogger("agcheck.engine")
        self._level = log.level
        log.setLevel(logging.DEBUG)
        log.addHandler(self)

    def detach(self) -> None:
        log = logging.getLogger("agcheck.engine")
        log.removeHandler(self)
        log.setLevel(self._level)

    def emit(self, record):
        error = record.exc_info[1] if record.exc_info else None
        where = "?"
        if error is not None:
            ours = [f for f in traceback.extract_tb(error.__traceback__) if f"{os.sep}agcheck{os.sep}" in f.filename]
            if ours:
                where = f"{ours[-1].filename.rsplit(os.sep + 'agcheck' + os.sep, 1)[-1]}:{ours[-1].lineno}"
        first = str(error).strip().splitlines()[0][:100] if error is not None and str(error).strip() else ""
        self.counts[(type(error).__name__ if error else "?", first, where)] += 1

    def table(self) -> str:
        lines = [f"engine fallbacks on exceptions: {sum(self.counts.values())}"]
        for (kind, message, where), n in self.counts.most_common():
            lines.append(f"  {n:5d}  {kind}: {message}  [agcheck/{where}]")
        return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
