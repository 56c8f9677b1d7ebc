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

JAX computes in 32 bits unless told otherwise: its checks run inside the backend's
``precision(True)`` context (``jax.enable_x64``), so the caller's JAX configuration is left
as it was. The checks themselves live in :mod:`agcheck.frontends.mainjob_checks`, the HTML
report in :mod:`agcheck.frontends.mainjob_html`; this module is the command (options, the
terminal's table) and imports no framework.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

from agcheck.frontends import catalog as _catalog
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

__all__ = ["main", "build_parser", "run", "Verdict", "EntryResult", "detect_backends", "html_report"]

EXIT_PASS = 0
EXIT_FAIL = 1
EXIT_USAGE = 2

#: kept for callers of the former name: the catalog's NumPy inputs as a backend's arrays
_convert = convert
DEFAULT_REPORT = "agcheck-report.html"


class UsageError(Exception):
    """Bad arguments: exit status 2."""


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
        cells.append(_cell(r.crosscheck.status, cross_text(r.crosscheck)))
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
                        help="backends to run on, among torch, jax, tensorflow, numpy (default: every installed one)")
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
            raise UsageError("--backends needs at least one of torch, jax, tensorflow, numpy")
        unknown = [b for b in wanted if b not in BACKENDS]
        if unknown:
            raise UsageError(f"unknown backend {', '.join(unknown)} (choose from {', '.join(BACKENDS)})")
        missing = [b for b in wanted if b not in installed]
        if missing:
            raise UsageError(f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not installed "
                             f"(pip install 'agcheck[{missing[0]}]')")
        return [b for b in BACKENDS if b in wanted], notes
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


def _plan(args, entries: list) -> tuple[list, list, list, dict]:
    """The backends to run on, the entries that run on them, notes, and the versions."""
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
    return backends, runnable, notes, installed


def _header(args, backends: list, runnable: list, installed: dict) -> str:
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
    return header


def _verdict_line(results: list, elapsed: float) -> str:
    failed = [r for r in results if not r.ok]
    n_checks = sum(sum(v.ran for v in r.gradchecks.values()) + r.crosscheck.ran for r in results)
    if failed:
        return (f"FAILED: {len(failed)} of {_plural(len(results), 'function')} "
                f"({', '.join(r.entry.name for r in failed)}); {n_checks} checks in {elapsed:.1f}s")
    return f"all {_plural(len(results), 'function')} passed ({_plural(n_checks, 'check')}) in {elapsed:.1f}s"


def _print_results(console, args, results: list, backends: list, verdict: str) -> None:
    failed = [r for r in results if not r.ok]
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


def _write_report(console, args, results: list, backends: list, meta: dict) -> None:
    path = os.path.abspath(args.report)
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(html_report(results, backends, meta))
        console.print(f"report: {path}", markup=False)
    except OSError as e:
        print(f"agcheck: could not write the report to {args.report}: {e}", file=sys.stderr)


def _main(args) -> int:
    from agcheck.progress import Progress

    console = _console()
    entries = _select(args)
    if args.list:
        console.print(catalog_table(entries))
        console.print(f"{len(entries)} functions; kinds: {', '.join(_catalog.KINDS)}", markup=False)
        return EXIT_PASS
    backends, runnable, notes, installed = _plan(args, entries)
    header = _header(args, backends, runnable, installed)
    if not args.quiet:
        console.print(header, markup=False)
        for note in notes:
            console.print(note, markup=False)

    start = time.perf_counter()
    with Progress(enabled=not args.quiet, console=_console(stderr=True)) as progress:
        results = run(runnable, backends, fast_mode=args.fast_mode, progress=progress)
    verdict = _verdict_line(results, time.perf_counter() - start)
    _print_results(console, args, results, backends, verdict)
    if not args.no_report:
        meta = {"header": header, "notes": notes, "verdict": verdict,
                "footer": f"written by agcheck {_version()} on {time.strftime('%Y-%m-%d %H:%M:%S')}"}
        _write_report(console, args, results, backends, meta)
    return EXIT_FAIL if any(not r.ok for r in results) else EXIT_PASS


if __name__ == "__main__":
    sys.exit(main())
