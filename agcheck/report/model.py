"""The failure report as plain data (NumPy arrays, numbers, strings): :class:`FailureReport`,
its failing :class:`JacobianBlock` entries (:class:`Entry`) and its :class:`Diagnosis` list.
It knows nothing of backends or of how the diagnoses are found."""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from agcheck.report.context import CheckContext
from agcheck.report.render import write_html, write_png
from agcheck.report.values import (DICT_ARRAY_LIMIT, abs_difference, decode_array, decode_number, encode_array,
                                   encode_number, fmt, index_text, jsonable, largest_positions, unravel_all,
                                   wrap_words)

__all__ = ["FailureReport", "JacobianBlock", "Entry", "Diagnosis", "CheckContext"]

#: worst entries kept per block (summary shows fewer)
TOP_K = 20
#: worst entries shown per block in the text summary
SUMMARY_TOP_K = 5
#: the text summary never has more lines than this
MAX_SUMMARY_LINES = 50
REPORT_FORMAT_VERSION = 2


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
            "numerical": encode_number(self.numerical), "analytical": encode_number(self.analytical),
            "abs_diff": encode_number(self.abs_diff),
        }

    @classmethod
    def from_dict(cls, d: dict) -> "Entry":
        return cls(d["row"], d["col"], tuple(d["input_index"]), tuple(d["output_index"]),
                   decode_number(d["numerical"]), decode_number(d["analytical"]),
                   decode_number(d["abs_diff"]))

    def where(self) -> str:
        return f"input{index_text(self.input_index)} / output{index_text(self.output_index)}"


@dataclass
class JacobianBlock:
    """One failing (output, input) pair: its numerical and analytical Jacobian blocks.

    Laid out as torch's: ``(input.numel, output.numel)``, row ``r`` the derivatives with
    respect to input element ``r``. In fast mode, the slow-mode blocks recomputed.
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
    #: a double-precision input's output holds only float32 values (fn rounds inside)
    output_float32_valued: bool | None = None
    #: the largest |output| at the input: finite differences' rounding error scales with it
    output_scale: float | None = None
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

    def _entries(self, flat, diff) -> list:
        """The entries at flat positions ``flat``, their values gathered at once."""
        rows, cols = np.divmod(np.asarray(flat, dtype=np.int64), self.numerical.shape[1])
        rows_at, cols_at = rows.tolist(), cols.tolist()
        values = zip(rows_at, cols_at, unravel_all(rows_at, self.input_shape), unravel_all(cols_at, self.output_shape),
                     self.numerical[rows, cols].tolist(), self.analytical[rows, cols].tolist(),
                     diff[rows, cols].tolist())
        return [Entry(r, c, i, o, nv, av, float(d)) for r, c, i, o, nv, av, d in values]

    def _statistics(self, top_k: int) -> None:
        n, a = self.numerical, self.analytical
        if n.size == 0:
            return
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            diff = abs_difference(a, n).astype(np.float64, copy=False)
            absn = np.abs(n).astype(np.float64, copy=False)
            nan = np.isnan(diff)
            has_nan = bool(nan.any())
            bound = absn * self.rtol
            bound += self.atol
            self.mismatches = int(diff.size - np.count_nonzero(diff <= bound))  # NaN counts as bad
            del bound
            # relative to |numerical|; infinite where numerical is 0 and analytical is not
            # (written over |numerical|, which is not needed again: one block less held)
            rel = np.divide(diff, absn, out=absn)
            del absn
            np.copyto(rel, 0.0, where=diff == 0)
        ranked = np.where(nan, np.inf, diff) if has_nan else diff
        worst_abs = int(np.argmax(ranked))
        rel_nan = np.isnan(rel)  # NaN entries, and an infinite numerical entry (inf / inf)
        worst_rel = None
        if not rel_nan.all():
            worst_rel = int(np.nanargmax(rel) if rel_nan.any() else np.argmax(rel))
            self.max_rel_diff = float(rel.flat[worst_rel])
        chosen = [worst_abs] + ([] if worst_rel is None else [worst_rel])
        entries = self._entries(chosen + largest_positions(ranked.ravel(), top_k).tolist(), diff)
        self.max_abs_diff = entries[0].abs_diff
        self.max_abs_entry = entries[0]
        if worst_rel is not None:
            self.max_rel_entry = entries[1]
        self.worst = entries[len(chosen):]

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
            "output_float32_valued": self.output_float32_valued,
            "output_scale": encode_number(self.output_scale),
            "eps": encode_number(self.eps), "atol": encode_number(self.atol), "rtol": encode_number(self.rtol),
            "mismatches": self.mismatches,
            "max_abs_diff": encode_number(self.max_abs_diff),
            "max_abs_entry": None if self.max_abs_entry is None else self.max_abs_entry.to_dict(),
            "max_rel_diff": encode_number(self.max_rel_diff),
            "max_rel_entry": None if self.max_rel_entry is None else self.max_rel_entry.to_dict(),
            "worst": [e.to_dict() for e in self.worst],
            "projection": None if self.projection is None else jsonable(self.projection),
            "numerical": encode_array(self.numerical) if keep else None,
            "analytical": encode_array(self.analytical) if keep else None,
        }

    @classmethod
    def from_dict(cls, d: dict) -> "JacobianBlock":
        def opt_tuple(v):
            return None if v is None else tuple(v)

        block = cls(
            output=d["output"], input=d["input"], shape=tuple(d["shape"]), mode=d["mode"], part=d["part"],
            fast=d["fast"], input_shape=opt_tuple(d["input_shape"]), output_shape=opt_tuple(d["output_shape"]),
            input_dtype=d["input_dtype"], input_double=d["input_double"],
            output_float32_valued=d.get("output_float32_valued"), output_scale=decode_number(d.get("output_scale")),
            eps=decode_number(d["eps"]),
            atol=decode_number(d["atol"]), rtol=decode_number(d["rtol"]), mismatches=d["mismatches"],
            max_abs_diff=decode_number(d["max_abs_diff"]),
            max_abs_entry=None if d["max_abs_entry"] is None else Entry.from_dict(d["max_abs_entry"]),
            max_rel_diff=decode_number(d["max_rel_diff"]),
            max_rel_entry=None if d["max_rel_entry"] is None else Entry.from_dict(d["max_rel_entry"]),
            worst=[Entry.from_dict(e) for e in d["worst"]],
            projection=d["projection"],
        )
        if d.get("numerical") is not None:
            block.numerical = decode_array(d["numerical"])
            block.analytical = decode_array(d["analytical"])
        return block

    def summary_lines(self, top_k: int = SUMMARY_TOP_K) -> list:
        rows, cols = self.shape
        total = rows * cols
        lines = [f"{self.title}: Jacobian block {rows} x {cols} (input elements x output elements)"]
        if self.projection is not None:
            p = self.projection
            lines.append(
                f"  fast mode: projection v^T J u numerical {fmt(decode_number(p.get('numerical')))}, "
                f"analytical {fmt(decode_number(p.get('analytical')))} (atol for the projection "
                f"{fmt(decode_number(p.get('atol')))}); the blocks below are the slow-mode ones"
            )
        lines.append(
            f"  {self.mismatches} of {total} {'entry' if total == 1 else 'entries'} outside "
            "|analytical - numerical| <= "
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
            table += [(index_text(w.input_index), index_text(w.output_index), fmt(w.numerical),
                       fmt(w.analytical), fmt(w.abs_diff)) for w in shown]
            widths = [max(len(r[i]) for r in table) for i in range(5)]
            for r in table:
                lines.append("    " + "  ".join(c.ljust(wd) for c, wd in zip(r, widths)).rstrip())
        return lines


@dataclass
class Diagnosis:
    """One named hypothesis about a failure.

    Attributes
    ----------
    kind : str
        ``"factor"``, ``"transposed"``, ``"kink"``, ... (see :mod:`agcheck.diagnosis`).
    message : str
        The hypothesis and its key evidence, in one sentence or two.
    evidence : dict
        The numbers behind it (JSON-serialisable).
    lines : list of str
        Supporting detail (e.g. the entries concerned), a few lines.
    block : int or None
        The index in ``report.blocks`` of the block it is about.
    """

    kind: str
    message: str
    evidence: dict = field(default_factory=dict)
    lines: list = field(default_factory=list)
    block: int | None = None

    def summary_lines(self, width: int = 110) -> list:
        head = wrap_words(f"- [{self.kind}] {self.message}", width, indent="  ")
        if len(head) > 5:
            head = head[:5]
            head[-1] += " ..."
        return head + ["    " + ln for ln in self.lines[:5]]

    def to_dict(self) -> dict:
        return {"kind": self.kind, "message": self.message, "evidence": jsonable(self.evidence),
                "lines": list(self.lines), "block": self.block}

    @classmethod
    def from_dict(cls, d: dict) -> "Diagnosis":
        return cls(d["kind"], d["message"], dict(d["evidence"]), list(d["lines"]), d["block"])


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
    diagnoses : list of Diagnosis
        Named hypotheses about the bug, each with its evidence.
    notes : list of str
        Anything the report could not do (a diagnosis that failed, arrays omitted, ...).
    context : CheckContext or None
        The function, test, versions, seeds and inputs of the check, and the code that
        runs it again (``context.reproduce``).
    """

    def __init__(self, check: str | None = None, message: str = "", details: dict | None = None,
                 backend: str | None = None, options: dict | None = None):
        self.check = check
        self.message = message
        self.details = details if details is not None else {}
        self.backend = backend
        self.options = options
        #: the options' defaults, for the summary to show those that differ
        self.option_defaults: dict = {}
        self.blocks: list[JacobianBlock] = []
        self.diagnoses: list = []
        self.notes: list[str] = []
        self.context: CheckContext | None = None
        self.completed = False

    def __repr__(self) -> str:
        kinds = ", ".join(d.kind for d in self.diagnoses) or "none"
        return (f"<FailureReport check={self.check!r} backend={self.backend!r} blocks={len(self.blocks)} "
                f"diagnoses={kinds}>")

    def headline(self) -> str:
        first = next((ln.strip() for ln in self.message.splitlines() if ln.strip()), "")
        return first.rstrip(",")

    def block_of(self, diagnosis) -> str:
        """``"output i / input j: "`` for a diagnosis, ``""`` when the report has one block."""
        i = getattr(diagnosis, "block", None)
        if len(self.blocks) < 2 or i is None or not 0 <= i < len(self.blocks):
            return ""
        return f"output {self.blocks[i].output} / input {self.blocks[i].input}: "

    def summary(self) -> str:
        """A short text summary: what failed, the diagnoses, the failing blocks, the options and
        how to reproduce; at most ``MAX_SUMMARY_LINES`` lines, the blocks cut first."""
        head = [self._header()] + self._diagnosis_lines()
        body = [ln for block in self.blocks for ln in block.summary_lines()]
        if self.details and not self.blocks:
            body.append("  " + ", ".join(f"{k}={fmt(v) if isinstance(v, float) else v}"
                                         for k, v in list(self.details.items())[:8]))
        tail = []
        if self.options:
            shown = [f"{k}={self.options[k]}" for k in _KEY_OPTIONS if k in self.options]
            shown += [f"{k}={v}" for k, v in self.options.items()
                      if k not in _KEY_OPTIONS and k != "raise_exception" and v != self.option_defaults.get(k)]
            tail.append("options: " + ", ".join(shown))
        if self.context is not None:
            tail += self.context.summary_lines()
        tail += [f"note: {note}" for note in self.notes[:3]]
        room = MAX_SUMMARY_LINES - len(head) - len(tail)
        if len(body) > room:
            body = body[:max(room - 1, 4)] + ["  ... (the rest is in error.report.blocks)"]
        lines = head + body + tail
        if len(lines) > MAX_SUMMARY_LINES:
            lines = lines[:MAX_SUMMARY_LINES - 1] + ["... (the rest is in error.report)"]
        return "\n".join(lines)

    def _header(self) -> str:
        function = self.context.function if self.context is not None else None
        return (f"agcheck report: check {self.check!r} failed" + (f" in {function}" if function else "")
                + (f", backend {self.backend}" if self.backend else ""))

    def _diagnosis_lines(self) -> list:
        if not self.diagnoses:
            if self.completed and self.blocks:
                return ["diagnosis: no known pattern (not a constant factor, transposition, sign flip, "
                        "conjugation, a few entries, a term of low rank or in the input's statistics, a kink "
                        "or finite-difference noise)"]
            return []
        lines = ["diagnosis:"]
        for d in self.diagnoses[:4]:
            text = d.summary_lines()
            where = self.block_of(d)
            if where and text:
                text[0] = text[0].replace("- ", "- " + where, 1)
            lines += ["  " + ln for ln in text]
        if len(self.diagnoses) > 4:
            lines.append(f"  ... and {len(self.diagnoses) - 4} more in error.report.diagnoses")
        return lines

    def __str__(self) -> str:
        return self.summary()

    def to_dict(self, include_arrays: bool | None = None) -> dict:
        """The report as JSON-serialisable data.

        ``include_arrays``: ``None`` (default) includes Jacobian blocks of up to
        ``DICT_ARRAY_LIMIT`` entries, ``True`` all, ``False`` none. Complex numbers are
        ``{"real": .., "imag": ..}``, non-finite floats ``"nan"``, ``"inf"``, ``"-inf"``.
        """
        return {
            "format": "agcheck-failure-report", "version": REPORT_FORMAT_VERSION,
            "check": self.check, "message": self.message, "backend": self.backend,
            "options": jsonable(self.options) if self.options is not None else None,
            "option_defaults": jsonable(self.option_defaults),
            "details": jsonable(self.details),
            "blocks": [b.to_dict(include_arrays) for b in self.blocks],
            "diagnoses": [d.to_dict() for d in self.diagnoses],
            "notes": list(self.notes),
            "context": None if self.context is None else self.context.to_dict(),
        }

    @classmethod
    def from_dict(cls, d: dict) -> "FailureReport":
        """Rebuild a report from :meth:`to_dict`'s data (e.g. after a JSON round trip)."""
        rep = cls(check=d["check"], message=d["message"], details=dict(d["details"]),
                  backend=d["backend"], options=d["options"])
        rep.blocks = [JacobianBlock.from_dict(b) for b in d["blocks"]]
        rep.diagnoses = [Diagnosis.from_dict(x) for x in d["diagnoses"]]
        rep.notes = list(d["notes"])
        rep.option_defaults = dict(d.get("option_defaults") or {})
        rep.context = None if d.get("context") is None else CheckContext.from_dict(d["context"])
        rep.completed = True
        return rep

    def to_json(self, **kw) -> str:
        return json.dumps(self.to_dict(), allow_nan=False, **kw)

    def save(self, path) -> str:
        """Write the report to ``path``: ``.html`` (self-contained, heatmaps embedded),
        ``.png`` (the heatmaps) or ``.json`` (:meth:`to_dict`). HTML and PNG need matplotlib.
        """
        path = os.fspath(path)
        ext = os.path.splitext(path)[1].lower()
        if ext == ".json":
            with open(path, "w", encoding="utf-8") as f:
                f.write(self.to_json(indent=1))
        elif ext in (".html", ".htm"):
            write_html(self, path)
        elif ext == ".png":
            write_png(self, path)
        else:
            raise ValueError(f"cannot save a report as {ext or 'a file without extension'!r}: "
                             "use .html, .png or .json")
        return path

