"""The main job: ``agcheck`` (``python -m agcheck``) without a subcommand.

For every function of the bundled catalog (:mod:`agcheck.frontends.catalog`) and every installed
backend it runs :func:`agcheck.gradcheck` (slow mode, reverse and — where the backend
supports it — forward-mode AD), then :func:`agcheck.crosscheck` across those backends.
The NumPy backend takes part for the entries that come with hand-written derivatives.
A progress bar runs while it works (on stderr, when that is a terminal); a summary table
follows, and an HTML report (``agcheck-report.html`` in the current folder by default)
keeps the table and, for every failure, the failure report.

Exit status: 0 when every check passed and the backends agree, 1 otherwise, 2 on a usage
error (bad option, unknown function name, a requested backend that is not installed).

JAX computes in 32 bits unless told otherwise: its checks run inside
``jax.enable_x64(True)`` contexts, so the caller's JAX configuration is left as it was.
"""
from __future__ import annotations

import argparse
import contextlib
import html
import os
import re
import sys
import time
import traceback
import warnings
from dataclasses import dataclass, field

from agcheck.frontends import catalog as _catalog

__all__ = ["main", "build_parser", "run", "Verdict", "EntryResult", "detect_backends", "html_report"]

EXIT_PASS = 0
EXIT_FAIL = 1
EXIT_USAGE = 2

BACKENDS = ("torch", "jax", "numpy")
DEFAULT_REPORT = "agcheck-report.html"


class UsageError(Exception):
    """Bad arguments: exit status 2."""


# -- results --------------------------------------------------------------------------------

@dataclass
class Verdict:
    """The outcome of one check: ``status`` is ``"pass"``, ``"FAIL"`` (a
    :class:`~agcheck.GradcheckError`), ``"ERROR"`` (the check could not run) or ``"-"``
    (not run on this backend)."""

    status: str = "-"
    headline: str = ""
    error: BaseException | None = None
    detail: str = ""
    seconds: float = 0.0
    warnings: list = field(default_factory=list)
    mode: str = ""

    @property
    def ran(self) -> bool:
        return self.status != "-"

    @property
    def ok(self) -> bool:
        return self.status in ("pass", "-")


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

def detect_backends(names=BACKENDS) -> dict:
    """``{name: version}`` of the backends among ``names`` whose framework imports."""
    found = {}
    if "torch" in names:
        try:
            import torch

            found["torch"] = torch.__version__
        except ImportError:
            pass
    if "jax" in names:
        try:
            import jax
            import jax.numpy  # noqa: F401

            found["jax"] = jax.__version__
        except ImportError:
            pass
    if "numpy" in names:
        import numpy

        found["numpy"] = numpy.__version__
    return found


def _x64():
    """A context in which JAX makes 64-bit arrays; the caller's setting is restored after."""
    import jax

    switch = getattr(jax, "enable_x64", None)  # a context manager in recent JAX
    if switch is not None:
        return switch(True)
    from jax.experimental import enable_x64  # older JAX

    return enable_x64()


_JITTED: dict = {}


def port(entry, backend: str):
    """The implementation of ``entry`` the main job runs on ``backend``.

    On JAX that is the entry's function under ``jax.jit``, as JAX code usually runs:
    eagerly every array-API call compiles its own small XLA program, and the checks of one
    function would compile a hundred of them (about ten times slower); derivatives are
    the same either way.
    """
    fn = entry.function(backend)
    if backend != "jax" or fn is None:
        return fn
    key = (entry.name, id(fn))
    if key not in _JITTED:
        import jax

        _JITTED[key] = (fn, jax.jit(fn))  # keep fn alive: its id is part of the key
    return _JITTED[key][1]


def _context(backend: str):
    return _x64() if backend == "jax" else contextlib.nullcontext()


def _convert(arrays, backend: str) -> tuple:
    """The catalog's NumPy inputs as ``backend``'s arrays (torch: tensors requiring grad)."""
    import numpy as np

    if backend == "torch":
        import torch

        out = []
        for a in arrays:
            t = torch.from_numpy(np.array(a, copy=True))
            if t.is_floating_point() or t.is_complex():
                t.requires_grad_(True)
            out.append(t)
        return tuple(out)
    if backend == "jax":
        import jax.numpy as jnp

        return tuple(jnp.asarray(a) for a in arrays)
    return tuple(np.array(a, copy=True) for a in arrays)


# -- running --------------------------------------------------------------------------------

def _first_line(text: str) -> str:
    for line in str(text).splitlines():
        if line.strip():
            return line.strip().rstrip(",")
    return ""


def _capture(verdict: Verdict, call) -> Verdict:
    from agcheck.report.errors import GradcheckError

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
            inputs = _convert(entry.inputs(), backend)
            gradcheck(port(entry, backend), inputs, backend=backend, fast_mode=fast_mode,
                      check_forward_ad=forward, **entry.backend_options(backend))

    return _capture(verdict, call)


def _crosscheck(entry, backends: list, fast_mode: bool) -> Verdict:
    from agcheck.crosscheck import crosscheck

    if len(backends) < 2:
        return Verdict(headline="fewer than two backends")
    fn = {b: port(entry, b) for b in backends}
    # forward mode is compared where every framework port has it (the NumPy backend
    # without a jvp is left out of that comparison by crosscheck itself, with a note)
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


def run_entry(entry, backends: list, fast_mode: bool = False, progress=None) -> EntryResult:
    """gradcheck ``entry`` on each of ``backends`` it supports, then crosscheck them."""
    start = time.perf_counter()
    verdicts = {}
    for b in backends:
        if not entry.supports(b) or entry.function(b) is None:
            verdicts[b] = Verdict()
            continue
        if progress is not None:
            progress.update(description=f"{entry.name}: gradcheck on {b}")
        verdicts[b] = _gradcheck(entry, b, fast_mode)
    usable = [b for b in backends if verdicts[b].ran]
    if progress is not None and len(usable) >= 2:
        progress.update(description=f"{entry.name}: crosscheck")
    cross = _crosscheck(entry, usable, fast_mode)
    return EntryResult(entry, verdicts, cross, time.perf_counter() - start)


def run(entries, backends, *, fast_mode: bool = False, progress=None) -> list:
    """Run the main job on ``entries`` over ``backends``; one :class:`EntryResult` each."""
    results = []
    if progress is not None:
        progress.start(len(entries), "main job")
    for entry in entries:
        results.append(run_entry(entry, list(backends), fast_mode, progress))
        if progress is not None:
            progress.advance()
    return results


# -- terminal output ------------------------------------------------------------------------

def _console(stderr: bool = False):
    from rich.console import Console

    console = Console(stderr=stderr, highlight=False, soft_wrap=True)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        # a pipe or a file: rich would assume 80 columns; leave room for the table
        console = Console(stderr=stderr, highlight=False, soft_wrap=True, width=120)
    return console


_STYLE = {"pass": "green", "FAIL": "bold red", "ERROR": "bold red", "-": "dim"}


def _cell(status: str, text: str | None = None):
    from rich.text import Text

    return Text(text if text is not None else status, style=_STYLE.get(status, ""))


def _cross_text(v: Verdict) -> str:
    return {"pass": "agree", "FAIL": "DIFFER", "ERROR": "ERROR", "-": "-"}[v.status]


def summary_table(results, backends):
    """The summary as a ``rich.table.Table``."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    table.add_column("function", no_wrap=True, min_width=max([len(r.entry.name) for r in results] + [8]))
    table.add_column("kind", no_wrap=True)
    for b in backends:
        table.add_column(b, no_wrap=True)
    table.add_column("crosscheck", no_wrap=True)
    table.add_column("time", justify="right", no_wrap=True)
    for r in results:
        cells = [Text(r.entry.name), Text(", ".join(r.entry.kinds))]
        cells += [_cell(r.gradchecks[b].status) for b in backends]
        cells.append(_cell(r.crosscheck.status, _cross_text(r.crosscheck)))
        cells.append(Text(f"{r.seconds:.2f}s"))
        table.add_row(*cells)
    return table


def catalog_table(entries):
    from rich import box
    from rich.table import Table
    from rich.text import Text

    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    # names are never cut, however narrow the terminal: the other columns wrap instead
    table.add_column("function", no_wrap=True, min_width=max([len(e.name) for e in entries] + [8]))
    table.add_column("kind", no_wrap=True, min_width=max([len(", ".join(e.kinds)) for e in entries] + [4]))
    for name in ("inputs", "numpy derivatives", "what"):
        table.add_column(name)
    for e in entries:
        numpy = " + ".join(n for n, f in (("vjp", e.vjp), ("jvp", e.jvp)) if f is not None) or "-"
        table.add_row(Text(e.name), Text(", ".join(e.kinds)), Text(e.describe_inputs()), Text(numpy),
                      Text(e.description))
    return table


def _indent(text: str, n: int = 4, max_lines: int = 14) -> str:
    lines = str(text).rstrip().splitlines()
    if len(lines) > max_lines:
        lines = lines[:max_lines] + ["... (the rest is in the HTML report)"]
    return "\n".join(" " * n + ln if ln else "" for ln in lines)


def _failure_text(v: Verdict) -> str:
    report = getattr(v.error, "report", None)
    if v.status == "FAIL" and report is not None and report.blocks:
        return report.summary()
    if v.status == "ERROR":
        return v.detail
    lines = (v.detail or v.headline).splitlines()
    if lines and lines[0].strip().rstrip(",") == v.headline:  # printed just above
        lines = lines[1:]
    return "\n".join(lines)


# -- HTML -----------------------------------------------------------------------------------

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:24px auto;max-width:1400px;color:#222;padding:0 16px}
h1{font-size:22px;margin-bottom:4px} h2{font-size:18px;margin-top:28px;border-bottom:1px solid #ddd}
h3{font-size:15px} .meta{color:#555}
pre{background:#f6f6f6;padding:10px;overflow-x:auto;font-size:12px;max-height:480px}
table{border-collapse:collapse;font-size:13px;margin:8px 0} td,th{border:1px solid #ddd;padding:3px 8px;text-align:left}
th{background:#f0f0f0} td.num{font-family:ui-monospace,monospace;text-align:right}
td.pass{background:#e6f6e6;color:#1a6b1a} td.FAIL,td.ERROR{background:#fde4e4;color:#a40000;font-weight:bold}
td.skip{color:#999} .verdict-ok{color:#1a6b1a} .verdict-bad{color:#a40000}
.diag{background:#fff7e0;border-left:4px solid #e0a000;padding:8px 12px;margin:8px 0}
.diag b{font-family:ui-monospace,monospace} .diag ul{margin:4px 0;font-size:12px;font-family:ui-monospace,monospace}
section.failure{border:1px solid #e3b4b4;border-radius:4px;padding:4px 16px;margin:16px 0}
img{max-width:100%;border:1px solid #eee}
"""


def _e(x) -> str:
    return html.escape(str(x))


def _rendered_report(v: Verdict, n: int) -> str:
    """The failure report of ``v`` as an HTML fragment (agcheck.report.render's page when it can
    be drawn, the text otherwise)."""
    report = getattr(v.error, "report", None)
    if v.status == "FAIL" and report is not None and report.blocks:
        try:
            from agcheck.report.render import render_html

            page = render_html(report)
        except ImportError:
            return ("<p><i>Heatmaps need matplotlib (pip install matplotlib, or agcheck[report]); "
                    "the report as text:</i></p><pre>" + _e(report.summary()) + "</pre>"
                    "<h4>Message</h4><pre>" + _e(v.detail) + "</pre>")
        except Exception as ex:  # never lose the failure behind a rendering problem
            return (f"<p><i>the report could not be rendered ({_e(type(ex).__name__)}: {_e(ex)})</i></p>"
                    "<pre>" + _e(v.detail) + "</pre>")
        body = page.split("<body>", 1)[-1].rsplit("</body>", 1)[0]
        for level in (3, 2, 1):  # nest the page's headings under the failure's own
            body = body.replace(f"<h{level}>", f"<h{level + 2}>").replace(f"</h{level}>", f"</h{level + 2}>")
        return body.replace('id="agcheck-report"', f'id="agcheck-report-{n}"')
    return "<pre>" + _e(v.detail or v.headline) + "</pre>"


def html_report(results, backends, meta: dict) -> str:
    """The main job's self-contained HTML report."""
    ok = all(r.ok for r in results)
    failed = [r for r in results if not r.ok]
    title = "agcheck main job: " + ("all checks passed" if ok else f"{len(failed)} of {len(results)} functions FAILED")
    parts = [f"<!doctype html><html lang=en><head><meta charset=utf-8><title>{_e(title)}</title>"
             f"<style>{_CSS}</style></head><body>"]
    header = "<br>".join(_e(line) for line in str(meta.get("header", "")).splitlines())
    parts.append(f"<h1>agcheck main job</h1><p class=meta>{header}</p>")
    for note in meta.get("notes", ()):
        parts.append(f"<p class=meta>{_e(note)}</p>")
    css = "verdict-ok" if ok else "verdict-bad"
    parts.append(f"<p class={css}><b>{_e(meta.get('verdict', title))}</b></p>")

    parts.append("<h2>Summary</h2><table><tr><th>function</th><th>kind</th><th>inputs</th>"
                 + "".join(f"<th>{_e(b)}</th>" for b in backends)
                 + "<th>crosscheck</th><th>time</th></tr>")
    anchors = {}
    for i, r in enumerate(results):
        for label, _ in r.failures():
            anchors[(r.entry.name, label)] = f"f{i}-{re.sub(r'[^a-z0-9]+', '-', label)}"
    for r in results:
        row = [f"<td><b>{_e(r.entry.name)}</b><br><small>{_e(r.entry.description)}</small></td>",
               f"<td>{_e(', '.join(r.entry.kinds))}</td>", f"<td><small>{_e(r.entry.describe_inputs())}</small></td>"]
        for b in backends:
            v = r.gradchecks[b]
            row.append(_status_td(v, v.status, anchors.get((r.entry.name, f"gradcheck on {b}"))))
        row.append(_status_td(r.crosscheck, _cross_text(r.crosscheck), anchors.get((r.entry.name, "crosscheck"))))
        row.append(f"<td class=num>{r.seconds:.2f}s</td>")
        parts.append("<tr>" + "".join(row) + "</tr>")
    parts.append("</table>")

    if failed:
        parts.append("<h2>Failures</h2>")
        n = 0
        for r in failed:
            for label, v in r.failures():
                n += 1
                parts.append(f"<section class=failure id={anchors[(r.entry.name, label)]}>"
                             f"<h2>{_e(r.entry.name)}: {_e(label)} — {_e(v.status)}</h2>"
                             f"<p class=meta>{_e(v.headline)}</p>"
                             f"<p class=meta>inputs: {_e(r.entry.describe_inputs())} (seed {r.entry.seed}); "
                             f"{_e(v.mode)}</p>")
                parts.append(_rendered_report(v, n))
                parts.append("</section>")

    parts.append("<h2>Details of every check</h2><table><tr><th>function</th><th>check</th><th>verdict</th>"
                 "<th>mode</th><th>time</th><th>warnings</th></tr>")
    for r in results:
        checks = [(f"gradcheck on {b}", v) for b, v in r.gradchecks.items() if v.ran]
        if r.crosscheck.ran:
            checks.append(("crosscheck", r.crosscheck))
        for label, v in checks:
            parts.append(f"<tr><td>{_e(r.entry.name)}</td><td>{_e(label)}</td>"
                         f"<td class={_e(v.status)}>{_e(v.status)}</td><td>{_e(v.mode)}</td>"
                         f"<td class=num>{v.seconds:.3f}s</td><td><small>{_e('; '.join(v.warnings))}</small></td></tr>")
    parts.append("</table>")
    parts.append(f"<p class=meta>{_e(meta.get('footer', ''))}</p></body></html>")
    return "".join(parts)


def _status_td(v: Verdict, text: str, anchor: str | None) -> str:
    css = v.status if v.status != "-" else "skip"
    title = f' title="{_e(v.headline)}"' if v.headline else ""
    inner = f'<a href="#{anchor}">{_e(text)}</a>' if anchor else _e(text)
    return f"<td class={css}{title}>{inner}</td>"


# -- the command ----------------------------------------------------------------------------

def _version() -> str:
    try:
        from agcheck import __version__

        return __version__
    except Exception:
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="agcheck",
        description=(
            "agcheck: a gradient checker with the semantics of torch.autograd.gradcheck. "
            "Without a subcommand, runs the main job: every function of the bundled catalog "
            "(written once against the array API) is gradchecked on every installed backend "
            "(torch, jax; numpy for the functions with hand-written derivatives) and "
            "crosschecked across them; a summary table is printed and an HTML report written."
        ),
        epilog=(
            "Subcommands: agcheck check MODULE:FUNCTION --input SHAPE[:DTYPE] ... and "
            "agcheck crosscheck MODULE:FUNCTION ... check a function of your own "
            "(see agcheck check --help). "
            "Exit status: 0 every check passed, 1 a check failed, 2 usage error."
        ),
    )
    parser.add_argument("--fast-mode", action="store_true",
                        help="fast mode for gradcheck and crosscheck (random projections v^T J u)")
    parser.add_argument("--only", action="append", metavar="NAME[,NAME]",
                        help="check only these catalog functions (names or kinds: "
                             + ", ".join(_catalog.KINDS) + "); repeatable")
    parser.add_argument("--list", action="store_true", help="list the catalog and exit")
    parser.add_argument("--backends", metavar="B[,B]", default=None,
                        help="backends to run on, among torch, jax, numpy (default: every installed one)")
    parser.add_argument("--report", metavar="PATH", default=DEFAULT_REPORT,
                        help="where to write the HTML report (default: %(default)s)")
    parser.add_argument("--no-report", action="store_true", help="do not write the HTML report")
    parser.add_argument("--quiet", "-q", action="store_true",
                        help="no progress bar and no table: only the verdict and the failures")
    parser.add_argument("--demo-failure", action="store_true",
                        help="add a deliberately broken function (exp whose torch backward is scaled by 2) "
                             "to show what a failure looks like; the run then exits 1")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    return parser


def _split(values) -> list:
    out = []
    for v in values or ():
        out += [p.strip() for p in v.split(",") if p.strip()]
    return out


def _select(args) -> list:
    entries = list(_catalog.CATALOG)
    if args.only is not None:
        names = _split(args.only)
        if not names:
            raise UsageError("--only needs at least one function name (see agcheck --list)")
        try:
            entries = _catalog.select(names, entries)
        except KeyError as e:
            raise UsageError(f"unknown function or kind: {e.args[0]} (see agcheck --list)") from None
    if args.demo_failure:  # asked for explicitly: added whatever --only selects
        entries.append(_catalog.demo_failure_entry())
    return entries


def _choose_backends(args, installed: dict) -> tuple[list, list]:
    """The backends to run on, and notes about the ones missing."""
    notes = []
    if args.backends is not None:
        wanted = list(dict.fromkeys(_split([args.backends])))
        if not wanted:
            raise UsageError("--backends needs at least one of torch, jax, numpy")
        unknown = [b for b in wanted if b not in BACKENDS]
        if unknown:
            raise UsageError(f"unknown backend {', '.join(unknown)} (choose from {', '.join(BACKENDS)})")
        missing = [b for b in wanted if b not in installed]
        if missing:
            raise UsageError(f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not installed "
                             f"(pip install 'agcheck[{missing[0]}]')")
        return [b for b in BACKENDS if b in wanted], notes
    chosen = [b for b in BACKENDS if b in installed]
    if "torch" in installed and "jax" not in installed:
        notes.append("jax is not installed: checking on torch alone (and on NumPy the functions with "
                     "hand-written derivatives); install agcheck[jax] or agcheck[all] to cross-check "
                     "against JAX.")
    elif "jax" in installed and "torch" not in installed:
        notes.append("torch is not installed: checking on jax alone (and on NumPy the functions with "
                     "hand-written derivatives); install agcheck[torch] or agcheck[all] to cross-check "
                     "against torch.")
    elif "torch" not in installed and "jax" not in installed:
        notes.append("neither torch nor jax is installed: checking only the functions with hand-written "
                     "derivatives, on the NumPy backend (numpy only); install agcheck[torch] or "
                     "agcheck[all] for the whole catalog.")
    return chosen, notes


def main(argv=None) -> int:
    """Run the main job with ``argv`` (default ``sys.argv[1:]``); the exit status."""
    parser = build_parser()
    try:
        args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    except SystemExit as e:  # --help / --version (0) or an argparse usage error (2)
        return EXIT_PASS if e.code in (0, None) else EXIT_USAGE
    try:
        return _main(args)
    except UsageError as e:
        print(f"agcheck: error: {e}", file=sys.stderr)
        return EXIT_USAGE


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def _main(args) -> int:
    from agcheck.progress import Progress

    console = _console()
    entries = _select(args)
    if args.list:
        console.print(catalog_table(entries))
        console.print(f"{len(entries)} functions; kinds: {', '.join(_catalog.KINDS)}", markup=False)
        return EXIT_PASS

    wanted = BACKENDS if args.backends is None else [b for b in BACKENDS if b in _split([args.backends])]
    installed = detect_backends(wanted)
    backends, notes = _choose_backends(args, installed)
    runnable = [e for e in entries if any(e.supports(b) for b in backends)]
    left_out = [e.name for e in entries if e not in runnable]
    if not runnable:
        raise UsageError(f"none of the selected functions runs on {', '.join(backends)} "
                         "(the NumPy backend checks only the functions with hand-written derivatives)")
    if left_out:
        notes.append(f"{len(left_out)} function(s) need torch or jax and are not checked: "
                     + ", ".join(left_out[:8]) + (" ..." if len(left_out) > 8 else ""))
    numpy_count = sum(1 for e in runnable if e.supports("numpy"))
    versions = ", ".join(f"{b} {installed[b]}" + (f" ({numpy_count} functions with hand-written derivatives)"
                                                   if b == "numpy" and len(backends) > 1 else "")
                         for b in backends)
    mode = "fast mode" if args.fast_mode else "slow mode"
    header = f"agcheck {_version()} main job: {len(runnable)} functions on {versions}\n"
    if len(backends) > 1:
        header += (f"gradcheck in {mode} (reverse and forward AD) on each backend, crosscheck "
                   f"({'fast mode' if args.fast_mode else 'full Jacobians'}) across them")
    else:
        header += f"gradcheck in {mode} (reverse and forward AD); one backend, so no crosscheck"
    if not args.quiet:
        console.print(header, markup=False)
        for note in notes:
            console.print(note, markup=False)

    start = time.perf_counter()
    with Progress(enabled=not args.quiet, console=_console(stderr=True)) as progress:
        results = run(runnable, backends, fast_mode=args.fast_mode, progress=progress)
    elapsed = time.perf_counter() - start

    failed = [r for r in results if not r.ok]
    n_checks = sum(sum(v.ran for v in r.gradchecks.values()) + r.crosscheck.ran for r in results)
    if failed:
        verdict = (f"FAILED: {len(failed)} of {_plural(len(results), 'function')} "
                   f"({', '.join(r.entry.name for r in failed)}); {n_checks} checks in {elapsed:.1f}s")
    else:
        verdict = f"all {_plural(len(results), 'function')} passed ({_plural(n_checks, 'check')}) in {elapsed:.1f}s"

    if not args.quiet:
        console.print()
        console.print(summary_table(results, backends))
    if failed:
        console.print()
        for r in failed:
            for label, v in r.failures():
                console.print(f"{r.entry.name}: {label}: {v.status}: {v.headline}", markup=False)
                if not args.quiet:
                    console.print(_indent(_failure_text(v)), markup=False)
                    console.print()
    console.print(verdict, markup=False, style="bold red" if failed else "bold green")

    if not args.no_report:
        meta = {"header": header, "notes": notes, "verdict": verdict,
                "footer": f"written by agcheck {_version()} on {time.strftime('%Y-%m-%d %H:%M:%S')}"}
        path = os.path.abspath(args.report)
        try:
            with open(path, "w", encoding="utf-8") as f:
                f.write(html_report(results, backends, meta))
            console.print(f"report: {path}", markup=False)
        except OSError as e:
            print(f"agcheck: could not write the report to {args.report}: {e}", file=sys.stderr)
    return EXIT_FAIL if failed else EXIT_PASS


if __name__ == "__main__":
    sys.exit(main())
