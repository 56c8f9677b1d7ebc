"""The error agcheck raises when a check fails, the texts of its messages, and the
structured failure report every error carries.

The messages keep the key phrases of ``torch.autograd.gradcheck`` (so tests that match
torch's messages match agcheck's) in agcheck's own words around them. After a failure,
:attr:`GradcheckError.report` (a :class:`FailureReport`) holds what went wrong as data:
the failing Jacobian blocks as NumPy arrays with their largest differences, the options
and backend of the check, and named diagnoses (see :mod:`agcheck.report.diagnosis`); its
:meth:`~FailureReport.summary` is appended to the exception message, after torch's text.

Nothing here runs on the passing path: reports are filled in only once a check failed.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

__all__ = ["GradcheckError", "FailureReport", "JacobianBlock"]

#: worst entries kept per block (summary shows fewer)
TOP_K = 20
#: worst entries shown per block in the text summary
SUMMARY_TOP_K = 5
#: the text summary never has more lines than this
MAX_SUMMARY_LINES = 50
#: blocks up to this many entries carry their arrays in ``to_dict()`` by default
DICT_ARRAY_LIMIT = 10_000
REPORT_FORMAT_VERSION = 1


class GradcheckError(RuntimeError):
    """A gradient check failed.

    Subclass of ``RuntimeError``, raised by :func:`agcheck.gradcheck` and
    :func:`agcheck.gradgradcheck` (unless ``raise_exception=False``).

    Attributes
    ----------
    check : str or None
        Short name of the check that failed (``"jacobian"``, ``"reentrant"``, ...).
    details : dict
        Structured facts about the failure (indices, max difference, ...).
    report : FailureReport
        The structured failure report: failing blocks as NumPy arrays, options, backend,
        diagnoses; ``report.summary()``, ``report.to_dict()``, ``report.save(path)``.
    """

    def __init__(self, message: str, *, check: str | None = None, details: dict | None = None):
        super().__init__(message)
        self.check = check
        self.details = dict(details or {})
        self.report = FailureReport(check=check, message=str(message), details=self.details)


NONDET_HINT = (
    "\n\nIf the backward relies on non-deterministic kernels (atomic adds on GPUs, for "
    "example), this can be expected: pass nondet_tol=<tolerance> to accept run-to-run "
    "differences up to that size."
)

#: torch's note, word for word (suites match it), then the slow-mode Jacobians follow
FAST_MODE_NOTE = (
    "\nThe above quantities relating the numerical and analytical jacobians are computed \n"
    "in fast mode. See: https://github.com/pytorch/pytorch/issues/53876 for more background \n"
    "about fast mode. Below, we recompute numerical and analytical jacobians in slow mode:\n\n"
)

FAST_FAIL_SLOW_OK = (
    "Fast gradcheck failed but element-wise differences are small. This means that the\n"
    "test might've passed in slow_mode!\n\n"
    "To check this function element by element, pass fast_mode=False (for OpInfo-based "
    "tests: gradcheck_fast_mode=False in the OpInfo; for module tests: in the module_test entry)."
)

BATCHED_HINT = (
    "gradcheck or gradgradcheck failed while testing batched gradient computation. "
    "Batched gradients are computed by vmapping the backward computation; an operation "
    "in the backward that vmap cannot batch makes this check fail. Pass "
    "check_batched_grad=False to skip it."
)

BATCHED_FWD_HINT = (
    "gradcheck failed while testing batched gradient computation with forward-mode AD. "
    "Batched forward gradients are computed by vmapping the forward-mode computation; "
    "pass check_batched_forward_grad=False to skip this check."
)

UNDEFINED_GRAD_HINT = (
    'See "Notes about undefined output gradients" in torch\'s tools/autograd/derivatives.yaml, '
    "or pass check_undefined_grad=False."
)


def jacobian_mismatch_message(
    analytical,
    numerical,
    output_idx: int,
    input_idx: int,
    complex_indices,
    test_imag: bool = False,
    forward: bool = False,
) -> str:
    """The message for a numerical/analytical Jacobian disagreement."""
    prefix = ""
    part = _complex_part(output_idx, input_idx, complex_indices, test_imag, forward)
    if part is not None:
        kind = "inputs" if forward else "outputs"
        prefix = f"While considering the {part} part of complex {kind} only, "
    how = "computed with forward mode " if forward else ""
    return (
        f"{prefix}Jacobian {how}mismatch for output {output_idx:d} with respect to input "
        f"{input_idx:d},\nnumerical:{numerical}\nanalytical:{analytical}\n"
    )


def _complex_part(output_idx, input_idx, complex_indices, test_imag, forward) -> str | None:
    """``"real"``/``"imaginary"`` when the failing pair is one half of a complex split."""
    if not complex_indices:
        return None
    concerned = input_idx if forward else output_idx
    if concerned not in complex_indices:
        return None
    return "imaginary" if test_imag else "real"


def not_reentrant_message(nondet_tol: float, observed: float | None = None) -> str:
    seen = "" if observed is None else f" The largest run-to-run difference seen was {observed:.3e}."
    return (
        "Backward is not reentrant, i.e., running backward with same input and "
        "grad_output multiple times gives different values, although analytical "
        f"gradient matches numerical gradient. The tolerance for nondeterminism was {nondet_tol}."
        + seen + NONDET_HINT
    )


def batched_mismatch_message(output_idx, input_idx, got, expected, forward=False) -> str:
    hint = BATCHED_FWD_HINT if forward else BATCHED_HINT
    mode = "forward-mode " if forward else ""
    return (
        f"For output {output_idx} and input {input_idx}:\n\n"
        f"The batched {mode}gradient differs from the gradients computed one at a time. {hint}\n\n"
        f"Got:\n{got}\n\nExpected:\n{expected}"
    )


# -- JSON encoding of numbers and arrays ---------------------------------------------------

def _encode_number(v):
    """A JSON-safe scalar: finite floats as is, non-finite as strings, complex as a dict."""
    if v is None or isinstance(v, (bool, str)):
        return v
    if isinstance(v, (int, np.integer)):
        return int(v)
    if isinstance(v, (complex, np.complexfloating)):
        return {"real": _encode_number(float(v.real)), "imag": _encode_number(float(v.imag))}
    f = float(v)
    if math.isfinite(f):
        return f
    return "nan" if math.isnan(f) else ("inf" if f > 0 else "-inf")


def _decode_number(v):
    if isinstance(v, dict) and set(v) == {"real", "imag"}:
        return complex(_decode_number(v["real"]), _decode_number(v["imag"]))
    if isinstance(v, str) and v in ("nan", "inf", "-inf"):
        return float(v)
    return v


def _encode_array(a: np.ndarray) -> dict:
    a = np.asarray(a)
    if np.iscomplexobj(a):
        body = {"real": _encode_array(a.real)["data"], "imag": _encode_array(a.imag)["data"]}
    else:
        data = a.astype(np.float64).tolist()
        if not np.all(np.isfinite(a)):
            data = _walk(data, _encode_number)
        body = {"data": data}
    return {"dtype": str(a.dtype), "shape": list(a.shape), **body}


def _decode_array(d: dict) -> np.ndarray:
    def load(data):
        return np.asarray(_walk(data, _decode_number), dtype=np.float64).reshape(d["shape"])

    if "real" in d:
        a = load(d["real"]) + 1j * load(d["imag"])
    else:
        a = load(d["data"])
    return a.astype(d["dtype"])


def _walk(data, f):
    if isinstance(data, list):
        return [_walk(x, f) for x in data]
    return f(data)


def jsonable(value, _depth: int = 0):
    """``value`` as plain JSON data (unknown objects become their ``repr``)."""
    if _depth > 8:
        return repr(value)
    if isinstance(value, dict):
        return {str(k): jsonable(v, _depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [jsonable(v, _depth + 1) for v in value]
    if isinstance(value, str):
        return str(value)
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if value is None or isinstance(value, (int, float, complex, np.number)):
        return _encode_number(value)
    if isinstance(value, np.ndarray) and value.size <= DICT_ARRAY_LIMIT:
        return _encode_array(value)
    return repr(value)


def fmt(v) -> str:
    """A short text form of a number for summaries."""
    if v is None:
        return "-"
    if isinstance(v, (complex, np.complexfloating)):
        if v.imag == 0:
            return fmt(v.real)
        return f"{v.real:.6g}{v.imag:+.6g}j"
    if isinstance(v, (float, np.floating)):
        return f"{float(v):.6g}"
    return str(v)


def _index_text(idx) -> str:
    if idx is None:
        return "-"
    if len(idx) == 0:
        return "()"
    return "(" + ", ".join(str(i) for i in idx) + ("," if len(idx) == 1 else "") + ")"


# -- one failing (output, input) block ------------------------------------------------------

@dataclass
class Entry:
    """One entry of a Jacobian block: which input element, which output element."""

    row: int
    col: int
    input_index: tuple
    output_index: tuple
    numerical: Any
    analytical: Any
    abs_diff: float

    def to_dict(self) -> dict:
        return {
            "row": self.row, "col": self.col,
            "input_index": list(self.input_index), "output_index": list(self.output_index),
            "numerical": _encode_number(self.numerical), "analytical": _encode_number(self.analytical),
            "abs_diff": _encode_number(self.abs_diff),
        }

    @classmethod
    def from_dict(cls, d: dict) -> "Entry":
        return cls(d["row"], d["col"], tuple(d["input_index"]), tuple(d["output_index"]),
                   _decode_number(d["numerical"]), _decode_number(d["analytical"]),
                   _decode_number(d["abs_diff"]))

    def where(self) -> str:
        return f"input{_index_text(self.input_index)} / output{_index_text(self.output_index)}"


def _unravel(flat: int, shape) -> tuple:
    if shape is None:
        return (int(flat),)
    shape = tuple(int(s) for s in shape)
    if len(shape) == 0:
        return ()
    try:
        return tuple(int(i) for i in np.unravel_index(int(flat), shape))
    except ValueError:
        return (int(flat),)


@dataclass
class JacobianBlock:
    """One failing (output, input) pair: the numerical and analytical Jacobian blocks and
    how they differ.

    The blocks are laid out as torch lays them out: ``(input.numel, output.numel)``, row
    ``r`` holding the derivatives of the flattened output with respect to input element
    ``r``. In fast mode they are the slow-mode blocks recomputed for the message.
    """

    output: int
    input: int
    shape: tuple
    mode: str = "reverse"  # or "forward"
    part: str | None = None  # "real"/"imaginary" for one half of a complex split
    fast: bool = False
    input_shape: tuple | None = None
    output_shape: tuple | None = None
    input_dtype: str | None = None
    input_double: bool | None = None
    eps: float | None = None
    atol: float = 0.0
    rtol: float = 0.0
    mismatches: int = 0
    max_abs_diff: float = 0.0
    max_abs_entry: Entry | None = None
    max_rel_diff: float | None = None
    max_rel_entry: Entry | None = None
    worst: list = field(default_factory=list)
    #: fast mode: the failing projections v^T J u and their tolerance
    projection: dict | None = None
    numerical: np.ndarray | None = field(default=None, repr=False)
    analytical: np.ndarray | None = field(default=None, repr=False)
    #: ``(eps, rows, stencil) -> ndarray (len(rows), output.numel)``: the numerical rows
    #: recomputed with another step (only until the report is completed)
    resample: Callable | None = field(default=None, repr=False, compare=False)

    @classmethod
    def from_arrays(cls, numerical, analytical, *, output, input, top_k: int = TOP_K, **kw) -> "JacobianBlock":
        n = np.asarray(numerical)
        a = np.asarray(analytical)
        if n.ndim != 2:
            n = n.reshape(a.shape if a.ndim == 2 and a.size == n.size else (n.size, 1))
        if a.shape != n.shape and a.size == n.size:
            a = a.reshape(n.shape)
        block = cls(output=output, input=input, shape=tuple(int(s) for s in n.shape), **kw)
        block.numerical, block.analytical = n, a
        if a.shape == n.shape:
            block._statistics(top_k)
        return block

    def _entry(self, row: int, col: int, diff) -> Entry:
        return Entry(int(row), int(col), _unravel(row, self.input_shape), _unravel(col, self.output_shape),
                     self.numerical[row, col].item(), self.analytical[row, col].item(), float(diff[row, col]))

    def _statistics(self, top_k: int) -> None:
        n, a = self.numerical, self.analytical
        if n.size == 0:
            return
        with np.errstate(invalid="ignore", over="ignore"):
            diff = np.abs(a - n).astype(np.float64)
            bad = ~(diff <= self.atol + self.rtol * np.abs(n))  # NaN counts as bad
        ranked = np.where(np.isnan(diff), np.inf, diff)
        self.mismatches = int(np.count_nonzero(bad))
        flat = int(np.argmax(ranked))
        r, c = divmod(flat, n.shape[1])
        self.max_abs_diff = float(diff[r, c])
        self.max_abs_entry = self._entry(r, c, diff)
        absn = np.abs(n)
        with np.errstate(divide="ignore", invalid="ignore"):
            # relative to |numerical|; infinite where numerical is 0 and analytical is not
            rel = np.where(absn > 0, diff / np.where(absn > 0, absn, 1.0), np.where(diff > 0, np.inf, 0.0))
        rel = np.where(np.isnan(diff), np.nan, rel)
        if np.any(~np.isnan(rel)):
            flat = int(np.nanargmax(rel))
            r, c = divmod(flat, n.shape[1])
            self.max_rel_diff = float(rel[r, c])
            self.max_rel_entry = self._entry(r, c, diff)
        k = min(top_k, ranked.size)
        order = np.argpartition(-ranked.ravel(), k - 1)[:k]
        order = order[np.argsort(-ranked.ravel()[order], kind="stable")]
        self.worst = [self._entry(*divmod(int(f), n.shape[1]), diff) for f in order if ranked.ravel()[f] > 0]

    @property
    def has_arrays(self) -> bool:
        return self.numerical is not None and self.analytical is not None

    @property
    def title(self) -> str:
        bits = [f"{self.mode} mode"]
        if self.part:
            bits.append(f"{self.part} part of complex {'inputs' if self.mode == 'forward' else 'outputs'}")
        if self.fast:
            bits.append("fast mode, full blocks recomputed")
        return f"output {self.output} w.r.t. input {self.input} ({', '.join(bits)})"

    def to_dict(self, include_arrays: bool | None = None) -> dict:
        size = self.shape[0] * self.shape[1] if len(self.shape) == 2 else 0
        keep = self.has_arrays and (size <= DICT_ARRAY_LIMIT if include_arrays is None else include_arrays)
        return {
            "output": self.output, "input": self.input, "shape": list(self.shape),
            "mode": self.mode, "part": self.part, "fast": self.fast,
            "input_shape": None if self.input_shape is None else list(self.input_shape),
            "output_shape": None if self.output_shape is None else list(self.output_shape),
            "input_dtype": self.input_dtype, "input_double": self.input_double,
            "eps": _encode_number(self.eps), "atol": _encode_number(self.atol), "rtol": _encode_number(self.rtol),
            "mismatches": self.mismatches,
            "max_abs_diff": _encode_number(self.max_abs_diff),
            "max_abs_entry": None if self.max_abs_entry is None else self.max_abs_entry.to_dict(),
            "max_rel_diff": _encode_number(self.max_rel_diff),
            "max_rel_entry": None if self.max_rel_entry is None else self.max_rel_entry.to_dict(),
            "worst": [e.to_dict() for e in self.worst],
            "projection": None if self.projection is None else jsonable(self.projection),
            "numerical": _encode_array(self.numerical) if keep else None,
            "analytical": _encode_array(self.analytical) if keep else None,
        }

    @classmethod
    def from_dict(cls, d: dict) -> "JacobianBlock":
        def opt_tuple(v):
            return None if v is None else tuple(v)

        block = cls(
            output=d["output"], input=d["input"], shape=tuple(d["shape"]), mode=d["mode"], part=d["part"],
            fast=d["fast"], input_shape=opt_tuple(d["input_shape"]), output_shape=opt_tuple(d["output_shape"]),
            input_dtype=d["input_dtype"], input_double=d["input_double"], eps=_decode_number(d["eps"]),
            atol=_decode_number(d["atol"]), rtol=_decode_number(d["rtol"]), mismatches=d["mismatches"],
            max_abs_diff=_decode_number(d["max_abs_diff"]),
            max_abs_entry=None if d["max_abs_entry"] is None else Entry.from_dict(d["max_abs_entry"]),
            max_rel_diff=_decode_number(d["max_rel_diff"]),
            max_rel_entry=None if d["max_rel_entry"] is None else Entry.from_dict(d["max_rel_entry"]),
            worst=[Entry.from_dict(e) for e in d["worst"]],
            projection=d["projection"],
        )
        if d.get("numerical") is not None:
            block.numerical = _decode_array(d["numerical"])
            block.analytical = _decode_array(d["analytical"])
        return block

    def summary_lines(self, top_k: int = SUMMARY_TOP_K) -> list:
        rows, cols = self.shape
        total = rows * cols
        lines = [f"{self.title}: Jacobian block {rows} x {cols} (input elements x output elements)"]
        if self.projection is not None:
            p = self.projection
            lines.append(
                f"  fast mode: projection v^T J u numerical {fmt(_decode_number(p.get('numerical')))}, "
                f"analytical {fmt(_decode_number(p.get('analytical')))} (atol for the projection "
                f"{fmt(_decode_number(p.get('atol')))}); the blocks below are the slow-mode ones"
            )
        lines.append(
            f"  {self.mismatches} of {total} {'entry' if total == 1 else 'entries'} outside |analytical - numerical| <= "
            f"atol + rtol * |numerical| (atol={fmt(self.atol)}, rtol={fmt(self.rtol)})"
        )
        e = self.max_abs_entry
        if e is not None:
            lines.append(f"  max abs difference {fmt(self.max_abs_diff)} at {e.where()}: "
                         f"numerical {fmt(e.numerical)}, analytical {fmt(e.analytical)}")
        e = self.max_rel_entry
        if e is not None:
            why = " (numerical is 0 there)" if self.max_rel_diff == math.inf else ""
            lines.append(f"  max rel difference {fmt(self.max_rel_diff)} at {e.where()}{why}")
        shown = self.worst[:top_k]
        if shown and self.mismatches:
            lines.append(f"  worst entries (top {len(shown)}):")
            table = [("input", "output", "numerical", "analytical", "|diff|")]
            table += [(_index_text(w.input_index), _index_text(w.output_index), fmt(w.numerical),
                       fmt(w.analytical), fmt(w.abs_diff)) for w in shown]
            widths = [max(len(r[i]) for r in table) for i in range(5)]
            for r in table:
                lines.append("    " + "  ".join(c.ljust(wd) for c, wd in zip(r, widths)).rstrip())
        return lines


# -- the report --------------------------------------------------------------------------------

#: options shown in the one-line summary even at their defaults
_KEY_OPTIONS = ("eps", "atol", "rtol", "nondet_tol", "fast_mode", "masked")


class FailureReport:
    """What a failed check found, as data.

    Attributes
    ----------
    check : str or None
        The check that failed (``"jacobian"``, ``"jacobian_forward"``, ``"reentrant"``,
        ``"grad_output_scaling"``, ``"batched_grad"``, ``"undefined_grad"``,
        ``"no_differentiable_outputs"``, ...).
    message : str
        The torch-compatible exception message (without the summary).
    backend : str or None
        The backend's name.
    options : dict or None
        The options of the check (:meth:`agcheck.GradcheckOptions.as_dict`).
    details : dict
        Facts of non-Jacobian checks (e.g. ``max_run_to_run_difference`` and
        ``nondet_tol`` for reentrancy).
    blocks : list of JacobianBlock
        The failing Jacobian blocks. The first is the one the message is about (torch's
        checks stop there); in slow mode every other failing (output, input) pair of the
        same comparison follows, in torch's order (at most 16).
    diagnoses : list of agcheck.report.diagnosis.Diagnosis
        Named hypotheses about the bug, each with its evidence.
    notes : list of str
        Anything the report could not do (a diagnosis that failed, arrays omitted, ...).
    """

    def __init__(self, check: str | None = None, message: str = "", details: dict | None = None,
                 backend: str | None = None, options: dict | None = None):
        self.check = check
        self.message = message
        self.details = details if details is not None else {}
        self.backend = backend
        self.options = options
        self.blocks: list[JacobianBlock] = []
        self.diagnoses: list = []
        self.notes: list[str] = []
        self.completed = False

    def __repr__(self) -> str:
        kinds = ", ".join(d.kind for d in self.diagnoses) or "none"
        return f"<FailureReport check={self.check!r} backend={self.backend!r} blocks={len(self.blocks)} diagnoses={kinds}>"

    # -- text ----------------------------------------------------------------------------
    def headline(self) -> str:
        first = next((ln.strip() for ln in self.message.splitlines() if ln.strip()), "")
        return first.rstrip(",")

    def block_of(self, diagnosis) -> str:
        """``"output i / input j: "`` for a diagnosis of a report with several blocks
        (``""`` when there is only one block to be about)."""
        i = getattr(diagnosis, "block", None)
        if len(self.blocks) < 2 or i is None or not 0 <= i < len(self.blocks):
            return ""
        return f"output {self.blocks[i].output} / input {self.blocks[i].input}: "

    def summary(self) -> str:
        """A short text summary (bounded in length however large the Jacobians)."""
        where = f", backend {self.backend}" if self.backend else ""
        lines = [f"agcheck report: check {self.check!r} failed{where}"]
        for block in self.blocks:
            lines += block.summary_lines()
        if self.details and not self.blocks:  # the facts of a check without Jacobian blocks
            lines.append("  " + ", ".join(f"{k}={fmt(v) if isinstance(v, float) else v}"
                                          for k, v in list(self.details.items())[:8]))
        if self.diagnoses:
            lines.append("diagnosis:")
            for d in self.diagnoses[:4]:
                text = d.summary_lines()
                where = self.block_of(d)
                if where and text:
                    text[0] = text[0].replace("- ", "- " + where, 1)
                lines += ["  " + ln for ln in text]
            if len(self.diagnoses) > 4:
                lines.append(f"  ... and {len(self.diagnoses) - 4} more in error.report.diagnoses")
        elif self.completed and self.blocks:
            lines.append("diagnosis: no known pattern (not a constant factor, transposition, sign flip, "
                         "conjugation, a few entries, a kink or finite-difference noise)")
        if self.options:
            shown = [f"{k}={self.options[k]}" for k in _KEY_OPTIONS if k in self.options]
            shown += [f"{k}={v}" for k, v in self.options.items()
                      if k not in _KEY_OPTIONS and k != "raise_exception" and v != _option_default(k)]
            lines.append("options: " + ", ".join(shown))
        for note in self.notes[:3]:
            lines.append(f"note: {note}")
        if len(lines) > MAX_SUMMARY_LINES:
            lines = lines[:MAX_SUMMARY_LINES - 1] + ["... (the rest is in error.report)"]
        if self.blocks:
            lines.append("details: error.report (to_dict(), save('report.html'))")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()

    # -- data ----------------------------------------------------------------------------
    def to_dict(self, include_arrays: bool | None = None) -> dict:
        """The report as JSON-serialisable data.

        ``include_arrays``: ``None`` (default) includes the Jacobian blocks up to
        ``DICT_ARRAY_LIMIT`` entries, ``True`` always, ``False`` never. Complex numbers
        are ``{"real": .., "imag": ..}``, non-finite floats the strings ``"nan"``,
        ``"inf"``, ``"-inf"``.
        """
        return {
            "format": "agcheck-failure-report", "version": REPORT_FORMAT_VERSION,
            "check": self.check, "message": self.message, "backend": self.backend,
            "options": jsonable(self.options) if self.options is not None else None,
            "details": jsonable(self.details),
            "blocks": [b.to_dict(include_arrays) for b in self.blocks],
            "diagnoses": [d.to_dict() for d in self.diagnoses],
            "notes": list(self.notes),
        }

    @classmethod
    def from_dict(cls, d: dict) -> "FailureReport":
        """Rebuild a report from :meth:`to_dict`'s data (e.g. after a JSON round trip)."""
        from agcheck.report.diagnosis import Diagnosis

        rep = cls(check=d["check"], message=d["message"], details=dict(d["details"]),
                  backend=d["backend"], options=d["options"])
        rep.blocks = [JacobianBlock.from_dict(b) for b in d["blocks"]]
        rep.diagnoses = [Diagnosis.from_dict(x) for x in d["diagnoses"]]
        rep.notes = list(d["notes"])
        rep.completed = True
        return rep

    def to_json(self, **kw) -> str:
        return json.dumps(self.to_dict(), allow_nan=False, **kw)

    def save(self, path) -> str:
        """Write the report to ``path``: ``.html`` (self-contained, heatmaps embedded as
        base64 PNG images), ``.png`` (the heatmaps) or ``.json`` (:meth:`to_dict`).

        HTML and PNG need matplotlib (``pip install matplotlib``).
        """
        import os

        path = os.fspath(path)
        ext = os.path.splitext(path)[1].lower()
        if ext == ".json":
            with open(path, "w", encoding="utf-8") as f:
                f.write(self.to_json(indent=1))
            return path
        if ext in (".html", ".htm"):
            from agcheck.report.render import write_html

            write_html(self, path)
            return path
        if ext == ".png":
            from agcheck.report.render import write_png

            write_png(self, path)
            return path
        raise ValueError(f"cannot save a report as {ext or 'a file without extension'!r}: "
                         "use .html, .png or .json")


def _option_default(name):
    from agcheck.options import GradcheckOptions

    return getattr(GradcheckOptions, name, None)


# -- filling in reports (only ever after a failure) -----------------------------------------

def attach_jacobian_failure(error: GradcheckError, run, analytical, numerical, *, output: int, input: int,
                            complex_indices, test_imag: bool, forward: bool, where=None, projection=None) -> None:
    """Record the failing block of a Jacobian comparison in ``error.report``.

    ``run`` is the gradcheck run (backend, options, stencil); ``where`` is
    ``(fn, args, position, outputs, output_position)`` for recomputing numerical entries
    with other steps during diagnosis. Never raises: a problem becomes a note.
    """
    rep = error.report
    try:
        be, opts = run.be, run.opts
        kw = dict(mode="forward" if forward else "reverse", fast=projection is not None,
                  part=_complex_part(output, input, complex_indices, test_imag, forward),
                  atol=float(opts.atol), rtol=float(opts.rtol))
        if where is not None:
            fn, args, position, outputs, output_position = where
            x, out = args[position], outputs[output_position]
            kw.update(input_shape=tuple(int(s) for s in x.shape), output_shape=tuple(int(s) for s in out.shape),
                      input_dtype=be.dtype_name(x), input_double=bool(be.is_double_precision(x)),
                      eps=float(run.eps_for(x)))
            kw["resample"] = _resampler(run, fn, args, position, output_position)
        if projection is not None:
            kw["projection"] = {k: _to_scalar(be, v) for k, v in projection.items()}
        block = JacobianBlock.from_arrays(be.to_numpy(numerical), be.to_numpy(analytical),
                                          output=output, input=input, **kw)
        rep.blocks.append(block)
    except Exception as ex:  # the report must never hide the failure itself
        rep.notes.append(f"could not record the Jacobian blocks: {type(ex).__name__}: {ex}")


def _to_scalar(be, v):
    if isinstance(v, (int, float, complex)):
        return v
    a = np.asarray(be.to_numpy(v))
    return a.item() if a.size == 1 else a


def _resampler(run, fn, args, position, output_position):
    def resample(eps, rows, stencil=None):
        from agcheck.report.diagnosis import numerical_rows

        return numerical_rows(run.be, fn, args, position, output_position, rows, eps,
                              stencil if stencil is not None else run.stencil)

    return resample


def complete_report(error: GradcheckError, backend=None, options=None) -> None:
    """Fill in backend, options and diagnoses, and append the summary to the message.

    Called once, after a failure, while the caller's state is still guarded (diagnosis
    may evaluate ``fn`` a few more times). Never raises.
    """
    rep = getattr(error, "report", None)
    if rep is None or rep.completed:
        return
    try:
        rep.backend = getattr(backend, "name", backend)
        if options is not None:
            rep.options = options.as_dict() if hasattr(options, "as_dict") else dict(options)
        try:
            from agcheck.report.diagnosis import diagnose

            rep.diagnoses = diagnose(rep)
        except Exception as ex:
            rep.notes.append(f"diagnosis failed: {type(ex).__name__}: {ex}")
        rep.completed = True
        summary = rep.summary()
        if error.args and isinstance(error.args[0], str):
            error.args = (error.args[0].rstrip("\n") + "\n\n" + summary,) + tuple(error.args[1:])
    except Exception as ex:
        rep.notes.append(f"report incomplete: {type(ex).__name__}: {ex}")
    finally:
        for block in rep.blocks:
            block.resample = None  # release fn and its inputs
