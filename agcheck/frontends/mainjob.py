"""The main job: ``agcheck`` without a subcommand (documented in docs/cli.md).

Every catalog function (:mod:`agcheck.frontends.catalog`) is gradchecked on every installed
backend and crosschecked across them (:mod:`agcheck.frontends.mainjob_checks`); this module
parses the options, prints the table and writes the HTML report (:mod:`~agcheck.frontends.mainjob_html`).
Exit status: 0 all passed, 1 a check failed (wins over an unwritable report), 2 a usage error.
Imports no framework.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

from agcheck.frontends import catalog as _catalog
from agcheck.frontends.command import EXIT_FAIL, EXIT_PASS, EXIT_USAGE, UsageError, check_report_path, version
from agcheck.frontends.mainjob_checks import (
    BACKENDS,
    EntryResult,
    Verdict,
    convert,
    cross_text,
    detect_backends,
    port,  # noqa: F401  (re-exported: agcheck.frontends.mainjob.port)
    run,
    run_entry,  # noqa: F401  (re-exported)
)
from agcheck.frontends.mainjob_html import html_report

__all__ = ["add_arguments", "run_job", "run", "Verdict", "EntryResult", "detect_backends", "html_report",
           "summary_table", "UsageError"]

#: kept for callers of the former name: the catalog's NumPy inputs as a backend's arrays
_convert = convert
DEFAULT_REPORT = "agcheck-report.html"

#: the statuses of the table's cells, and their widest text
STATUS_WIDTH = max(len(t) for t in ("pass", "FAIL", "ERROR", "-", "agree", "DIFFER"))
#: the table's headers when the full ones do not fit the terminal
SHORT_HEADERS = {"tensorflow": "tf", "crosscheck": "cross"}


# -- terminal output ------------------------------------------------------------------------

def _console(stderr: bool = False, plain: bool = False):
    from rich.console import Console

    options = dict(stderr=stderr, highlight=False, soft_wrap=True, no_color=plain or None)
    console = Console(**options)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        # a pipe or a file: rich would assume 80 columns
        console = Console(width=120, **options)
    return console


_STYLE = {"pass": "green", "FAIL": "bold red", "ERROR": "bold red", "-": "dim", "skip": "yellow"}


def _cell(status: str, text: str | None = None):
    from rich.text import Text

    return Text(text if text is not None else status, style=_STYLE.get(status, ""))


def summary_table(results, backends, short: bool = False, tight: bool = False):
    """The summary as a ``rich.table.Table``; names and statuses are never cut. ``short``
    headers (``tf``, ``cross``) and ``tight`` columns make five backends fit 80 columns."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    def header(name):
        return SHORT_HEADERS.get(name, name) if short else name

    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, collapse_padding=True,
                  padding=(0, 0) if tight else (0, 1))
    table.add_column("function", no_wrap=True, min_width=max([len(r.entry.name) for r in results] + [8]))
    table.add_column("kind", min_width=max([len(k) for r in results for k in r.entry.kinds] + [4]))
    for b in backends:
        table.add_column(header(b), no_wrap=True, min_width=max(len(header(b)), STATUS_WIDTH - 1))
    table.add_column(header("crosscheck"), no_wrap=True, min_width=max(len(header("crosscheck")), STATUS_WIDTH))
    table.add_column("time", justify="right", no_wrap=True)
    for r in results:
        cells = [Text(r.entry.name), Text(", ".join(r.entry.kinds))]
        cells += [_cell(r.gradchecks[b].status) for b in backends]
        cells.append(_cell(r.crosscheck.status, cross_text(r.crosscheck)))
        cells.append(Text(f"{r.seconds:.2f}s"))
        table.add_row(*cells)
    return table


def _fitting_table(console, results, backends):
    """The summary table, with short headers, then tight columns, where it does not fit."""
    from rich.measure import Measurement

    unbounded = console.options.update_width(10_000)
    for style in ({}, {"short": True}, {"short": True, "tight": True}):
        table = summary_table(results, backends, **style)
        if Measurement.get(console, unbounded, table).minimum <= console.width:
            break
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


def _indent(text: str, n: int = 4, max_lines: int | None = 14) -> str:
    lines = str(text).rstrip().splitlines()
    if max_lines is not None and len(lines) > max_lines:
        lines = lines[:max_lines] + ["... (the rest is in the HTML report; --verbose prints it all)"]
    return "\n".join(" " * n + ln if ln else "" for ln in lines)


def _failure_text(v: Verdict, verbose: bool = False) -> str:
    report = getattr(v.error, "report", None)
    if verbose and v.detail:
        return v.detail
    if v.status == "FAIL" and report is not None and report.blocks:
        return report.summary()
    if v.status == "ERROR":
        return v.detail
    lines = (v.detail or v.headline).splitlines()
    if lines and lines[0].strip().rstrip(",") == v.headline:  # printed just above
        lines = lines[1:]
    return "\n".join(lines)


# -- the command ----------------------------------------------------------------------------

def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the main job's own options (the shared flags come from ``add_shared_flags``)."""
    group = parser.add_argument_group("the main job (agcheck without a subcommand)")
    group.add_argument("--only", action="append", metavar="NAME[,NAME]",
                       help="check only these catalog functions (names or kinds: "
                            + ", ".join(_catalog.KINDS) + "); repeatable")
    group.add_argument("--list", action="store_true", help="list the catalog and exit")
    group.add_argument("--backends", metavar="B[,B]", default=None,
                       help=f"backends to run on, among {', '.join(BACKENDS)} (default: every installed "
                            "one); for crosscheck, the backends compared")
    group.add_argument("--no-report", action="store_true", help="do not write the HTML report")
    group.add_argument("--demo-failure", action="store_true",
                       help="add a deliberately broken function (exp whose torch backward is scaled by 2) "
                            "to show what a failure looks like; the run then exits 1")


#: the main job's own options, and their defaults (given with a subcommand: a usage error)
JOB_ONLY = {"only": None, "list": False, "no_report": False, "demo_failure": False}


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


def _wanted_backends(args) -> list:
    """The backends asked for (every one when ``--backends`` is not given), checked by name."""
    if args.backends is None:
        return list(BACKENDS)
    wanted = list(dict.fromkeys(_split([args.backends])))
    if not wanted:
        raise UsageError(f"--backends needs at least one of {', '.join(BACKENDS)}")
    wanted = ["tensorflow" if b == "tf" else b for b in wanted]
    unknown = [b for b in wanted if b not in BACKENDS]
    if unknown:
        raise UsageError(f"unknown backend {', '.join(unknown)} (choose from {', '.join(BACKENDS)})")
    return [b for b in BACKENDS if b in wanted]


def _choose_backends(args, installed: dict) -> tuple[list, list]:
    """The backends to run on, and notes about the ones missing."""
    notes = []
    if args.backends is not None:
        wanted = _wanted_backends(args)
        missing = [b for b in wanted if b not in installed]
        if missing:
            raise UsageError(f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not installed "
                             f"(pip install 'agcheck[{missing[0]}]')")
        return wanted, notes
    chosen = [b for b in BACKENDS if b in installed]
    frameworks = [b for b in chosen if b != "numpy"]
    missing = [b for b in ("torch", "jax") if b not in installed]
    if not frameworks:
        notes.append("neither torch nor jax is installed: checking only the functions with hand-written "
                     "derivatives, on the NumPy backend (numpy only); install agcheck[torch] or "
                     "agcheck[all] for the whole catalog.")
    elif missing:
        on = frameworks[0] + " alone" if len(frameworks) == 1 else " and ".join(frameworks)
        name = {"torch": "torch", "jax": "JAX"}[missing[0]]
        notes.append(f"{missing[0]} is not installed: checking on {on} (and on NumPy the functions with "
                     f"hand-written derivatives); install agcheck[{missing[0]}] or agcheck[all] to cross-check "
                     f"against {name}.")
    if "mlx" not in installed:
        notes.append("mlx is not installed: not checking on MLX; install agcheck[mlx] or agcheck[all] "
                     "(macOS on Apple silicon, Linux) to check on it and cross-check against it too.")
    return chosen, notes


def _skip_notes(entries: list, backends: list) -> list:
    """One line per backend and reason: the functions that backend does not check, and why."""
    grouped: dict = {}
    for e in entries:
        for b in backends:
            reason = e.exclusion(b)
            if reason is not None:
                grouped.setdefault((b, reason), []).append(e.name)
    return [f"skip on {b}: {', '.join(names)}: {reason}" for (b, reason), names in grouped.items()]


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def _plan(args, entries: list, progress=None) -> tuple[list, list, list, dict]:
    """The backends to run on, the entries that run on them, notes, and the versions."""
    installed = detect_backends(_wanted_backends(args), progress=progress)
    backends, notes = _choose_backends(args, installed)
    runnable = [e for e in entries if any(e.supports(b) for b in backends)]
    # no implementation on any backend (those skipped for a reason are in the skip notes)
    left_out = [e.name for e in entries if e not in runnable and all(e.exclusion(b) is None for b in backends)]
    skips = _skip_notes(entries, backends)
    if not runnable:
        why = (["the NumPy backend checks only the functions with hand-written derivatives"]
               if "numpy" in backends else [])
        raise UsageError(f"none of the selected functions runs on {', '.join(backends)}"
                         + "".join(f"; {line}" for line in why + skips))
    if left_out:
        notes.append(f"{len(left_out)} function(s) have no implementation on {' or '.join(backends)} and are "
                     "not checked: " + ", ".join(left_out[:8]) + (" ..." if len(left_out) > 8 else ""))
    notes += skips
    return backends, runnable, notes, installed


def _header(args, backends: list, runnable: list, installed: dict) -> str:
    def count(b):
        n = sum(1 for e in runnable if e.supports(b))
        if b == "numpy" and len(backends) > 1:
            return f" ({n} functions with hand-written derivatives)"
        skipped = sum(1 for e in runnable if e.exclusion(b) is not None)
        return f" ({_plural(n, 'function')}, {skipped} skipped)" if skipped else ""

    versions = ", ".join(f"{b} {installed[b]}{count(b)}" for b in backends)
    mode = "fast mode" if args.fast else "slow mode"
    header = f"agcheck {version()} main job: {len(runnable)} functions on {versions}\n"
    if len(backends) > 1:
        header += (f"gradcheck in {mode} (reverse and forward AD) on each backend, crosscheck "
                   f"({'fast mode' if args.fast else 'full Jacobians'}) across them")
    else:
        header += f"gradcheck in {mode} (reverse and forward AD); one backend, so no crosscheck"
    return header


def _verdict_line(results: list, elapsed: float) -> str:
    failed = [r for r in results if not r.ok]
    n_checks = sum(sum(v.ran for v in r.gradchecks.values()) + r.crosscheck.ran for r in results)
    n_skipped = sum(v.status == "skip" for r in results for v in r.gradchecks.values())
    skipped = f", {n_skipped} skipped for the reasons above" if n_skipped else ""
    if failed:
        return (f"FAILED: {len(failed)} of {_plural(len(results), 'function')} "
                f"({', '.join(r.entry.name for r in failed)}); {n_checks} checks{skipped} in {elapsed:.1f}s")
    return (f"all {_plural(len(results), 'function')} passed ({_plural(n_checks, 'check')}{skipped}) "
            f"in {elapsed:.1f}s")


def _print_results(console, args, results: list, backends: list, verdict: str) -> None:
    failed = [r for r in results if not r.ok]
    if not args.quiet:
        console.print()
        console.print(_fitting_table(console, results, backends))
    if failed:
        console.print()
        for r in failed:
            for label, v in r.failures():
                console.print(f"{r.entry.name}: {label}: {v.status}: {v.headline}", markup=False)
                if not args.quiet:
                    console.print(_indent(_failure_text(v, args.verbose), max_lines=None if args.verbose else 14),
                                  markup=False)
                    console.print()
    console.print(verdict, markup=False, style="bold red" if failed else "bold green")


def _write_report(console, path: str, results: list, backends: list, meta: dict) -> bool:
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(html_report(results, backends, meta))
    except OSError as e:
        print(f"agcheck: error: could not write the report to {path}: {e}", file=sys.stderr)
        return False
    console.print(f"report: {path}", markup=False)
    return True


def _loading_line(args) -> str:
    wanted = _wanted_backends(args)
    frameworks = [b for b in wanted if b != "numpy"]
    what = ", ".join(frameworks) if frameworks else "numpy"
    return f"agcheck {version()}: loading {what} (importing the frameworks takes a few seconds) ..."


def run_job(args) -> int:
    """Run the main job on parsed arguments; the exit status. Raises ``UsageError``."""
    from agcheck.progress import Progress

    console = _console(plain=args.plain)
    entries = _select(args)
    if args.list:
        console.print(catalog_table(entries))
        console.print(f"{len(entries)} functions; kinds: {', '.join(_catalog.KINDS)}", markup=False)
        return EXIT_PASS
    report = None if args.no_report else check_report_path(args.report or DEFAULT_REPORT)
    show = not args.quiet
    if show:  # at once: the frameworks' imports take seconds
        print(_loading_line(args), file=sys.stderr, flush=True)
    with Progress(enabled=show and not args.plain, console=_console(stderr=True)) as progress:
        backends, runnable, notes, installed = _plan(args, entries, progress)
    header = _header(args, backends, runnable, installed)
    if show:
        console.print(header, markup=False)
        for note in notes:
            console.print(note, markup=False)

    start = time.perf_counter()
    with Progress(enabled=show and not args.plain, console=_console(stderr=True)) as progress:
        results = run(runnable, backends, fast_mode=args.fast, progress=progress)
    verdict = _verdict_line(results, time.perf_counter() - start)
    _print_results(console, args, results, backends, verdict)
    status = EXIT_FAIL if any(not r.ok for r in results) else EXIT_PASS
    if report is not None:
        meta = {"header": header, "notes": notes, "verdict": verdict,
                "footer": f"written by agcheck {version()} on {time.strftime('%Y-%m-%d %H:%M:%S')}"}
        if not _write_report(console, report, results, backends, meta) and status == EXIT_PASS:
            status = EXIT_USAGE
    return status
