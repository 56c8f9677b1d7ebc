"""The main job's checks: gradcheck of one catalog entry on each backend and crosscheck
across them, each captured as a :class:`Verdict`. Every check runs inside the backend's
``precision(True)`` on the port under its ``compiled``. Imports no framework.
"""
from __future__ import annotations

import time
import traceback
import warnings
from dataclasses import dataclass, field

import numpy as np

from agcheck.backends.base import BackendUnavailableError
from agcheck.backends.registry import get_backend

__all__ = ["Verdict", "EntryResult", "BACKENDS", "detect_backends", "port", "convert", "run_entry", "run",
           "cross_text", "time_left"]

#: in the table's order; NumPy (hand-written derivatives only) last
BACKENDS = ("torch", "jax", "tensorflow", "mlx", "numpy")


# -- results --------------------------------------------------------------------------------

@dataclass
class Verdict:
    """One check's outcome; ``status``: ``"pass"``, ``"FAIL"`` (a GradcheckError), ``"ERROR"``
    (could not run), ``"-"`` (no implementation) or ``"skip"`` (the reason is ``headline``)."""

    status: str = "-"
    headline: str = ""
    error: BaseException | None = None
    detail: str = ""
    seconds: float = 0.0
    warnings: list = field(default_factory=list)
    mode: str = ""

    @property
    def ran(self) -> bool:
        return self.status not in ("-", "skip")

    @property
    def ok(self) -> bool:
        return self.status in ("pass", "-", "skip")


@dataclass
class EntryResult:
    entry: object
    gradchecks: dict
    crosscheck: Verdict
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return all(v.ok for v in self.gradchecks.values()) and self.crosscheck.ok

    def failures(self) -> list:
        """``(label, verdict)`` of every failed check."""
        out = [(f"gradcheck on {b}", v) for b, v in self.gradchecks.items() if not v.ok]
        if not self.crosscheck.ok:
            out.append(("crosscheck", self.crosscheck))
        return out


# -- backends -------------------------------------------------------------------------------

def detect_backends(names=BACKENDS, progress=None) -> dict:
    """``{name: version}`` of the backends among ``names`` whose framework imports."""
    names = [name for name in BACKENDS if name in names]
    found = {}
    if progress is not None:
        progress.start(len(names), "loading")
    for name in names:
        if progress is not None:
            progress.update(description=f"loading {name}")
        try:
            found[name] = get_backend(name).framework_version()
        except (BackendUnavailableError, ImportError):
            pass
        if progress is not None:
            progress.advance()
    return found


_COMPILED: dict = {}


def port(entry, backend: str):
    """``entry``'s function on ``backend`` under the backend's ``compiled`` (``jax.jit``,
    ``mx.compile``): eager JAX compiles a small XLA program per array-API call, about ten
    times slower over a function's checks."""
    fn = entry.function(backend)
    if fn is None:
        return fn
    key = (backend, entry.name, id(fn))
    if key not in _COMPILED:
        _COMPILED[key] = (fn, get_backend(backend).compiled(fn))  # keep fn alive: its id is part of the key
    return _COMPILED[key][1]


def _context(backend: str):
    """The backend's float64 setting (JAX's 64-bit mode; MLX computes float64 on its CPU stream only)."""
    return get_backend(backend).precision(True)


def convert(arrays, backend: str) -> tuple:
    """The catalog's NumPy inputs as ``backend``'s arrays (torch: tensors requiring grad)."""
    be = get_backend(backend)
    out = []
    for a in arrays:
        a = np.asarray(a)
        out.append(be.from_numpy(a, checked=bool(np.issubdtype(a.dtype, np.inexact))))
    return tuple(out)


# -- running --------------------------------------------------------------------------------

def _first_line(text: str) -> str:
    for line in str(text).splitlines():
        if line.strip():
            return line.strip().rstrip(",")
    return ""


def _capture(verdict: Verdict, call) -> Verdict:
    from agcheck.errors import GradcheckError

    start = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            call()
            verdict.status = "pass"
        except GradcheckError as e:
            verdict.status, verdict.error = "FAIL", e
            report = getattr(e, "report", None)
            verdict.headline = report.headline() if report is not None else _first_line(e)
            verdict.detail = str(e)
        except Exception as e:  # the check could not run: a verdict of its own
            verdict.status, verdict.error = "ERROR", e
            verdict.headline = f"{type(e).__name__}: {_first_line(e)}"
            verdict.detail = traceback.format_exc()
    verdict.seconds = time.perf_counter() - start
    verdict.warnings = sorted({f"{w.category.__name__}: {_first_line(w.message)}" for w in caught})
    return verdict


def _gradcheck(entry, backend: str, fast_mode: bool) -> Verdict:
    from agcheck.gradcheck import gradcheck

    forward = entry.forward_ad(backend)
    verdict = Verdict(mode=f"{'fast' if fast_mode else 'slow'} mode, reverse" + (" + forward" if forward else ""))

    def call():
        with _context(backend):
            inputs = convert(entry.inputs(), backend)
            gradcheck(port(entry, backend), inputs, backend=backend, fast_mode=fast_mode,
                      check_forward_ad=forward, **entry.backend_options(backend))

    return _capture(verdict, call)


def _crosscheck(entry, backends: list, fast_mode: bool) -> Verdict:
    from agcheck.crosscheck import crosscheck

    if len(backends) < 2:
        return Verdict(headline="fewer than two backends")
    fn = {b: port(entry, b) for b in backends}
    # crosscheck itself leaves a NumPy backend without a jvp out of the forward comparison
    forward = all(entry.forward_ad(b) for b in backends if b != "numpy")
    options = {b: entry.backend_options(b) for b in backends if entry.backend_options(b)}
    verdict = Verdict(mode=f"{', '.join(backends)}; {'fast mode' if fast_mode else 'full Jacobians'}, reverse"
                           + (" + forward" if forward else ""))
    result = {}

    def call():
        result["r"] = crosscheck(fn, entry.inputs(), backends=backends, fast_mode=fast_mode,
                                 check_forward_ad=forward, backend_options=options or None)

    _capture(verdict, call)
    if verdict.status == "pass" and "r" in result:
        verdict.detail = result["r"].summary()
    # the ports are given as a mapping (jax's is jitted): name the function in the table
    verdict.detail = verdict.detail.replace("crosscheck of the ports of fn ", f"crosscheck of {entry.name} ")
    return verdict


def run_entry(entry, backends: list, fast_mode: bool = False, progress=None, note: str = "") -> EntryResult:
    """gradcheck ``entry`` on each of ``backends`` it supports, then crosscheck them; ``note``
    (the time left) follows each label on ``progress``."""
    start = time.perf_counter()
    verdicts = {}
    for b in backends:
        reason = entry.exclusion(b)
        if reason is not None:
            verdicts[b] = Verdict(status="skip", headline=reason, mode="not checked")
            continue
        if not entry.supports(b) or entry.function(b) is None:
            verdicts[b] = Verdict()
            continue
        if progress is not None:
            progress.update(description=f"{entry.name}: gradcheck on {b}{note}")
        verdicts[b] = _gradcheck(entry, b, fast_mode)
    usable = [b for b in backends if verdicts[b].ran]
    if progress is not None and len(usable) >= 2:
        progress.update(description=f"{entry.name}: crosscheck{note}")
    cross = _crosscheck(entry, usable, fast_mode)
    return EntryResult(entry, verdicts, cross, time.perf_counter() - start)


def time_left(done: int, total: int, elapsed: float) -> str:
    """The progress label's estimate of the time left (``""`` before the first is done)."""
    if done <= 0 or done >= total:
        return ""
    left = elapsed / done * (total - done)
    if left < 60:
        return f" (about {max(1, round(left))} s left)"
    return f" (about {round(left / 60)} min left)"


def run(entries, backends, *, fast_mode: bool = False, progress=None) -> list:
    """Run the main job on ``entries`` over ``backends``; one :class:`EntryResult` each."""
    results = []
    if progress is not None:
        progress.start(len(entries), "main job")
    start = time.perf_counter()
    for entry in entries:
        note = time_left(len(results), len(entries), time.perf_counter() - start)
        results.append(run_entry(entry, list(backends), fast_mode, progress, note))
        if progress is not None:
            progress.advance()
    return results


def cross_text(v: Verdict) -> str:
    """The crosscheck column's text of ``v``."""
    return {"pass": "agree", "FAIL": "DIFFER", "ERROR": "ERROR", "-": "-", "skip": "skip"}[v.status]
