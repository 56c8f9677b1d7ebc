"""What the ``agcheck`` command's parts share: exit statuses, the usage error, the shared
flags and the report-path check. Imports no framework and nothing of the checker."""
from __future__ import annotations

import argparse
import importlib.util
import os

__all__ = ["EXIT_PASS", "EXIT_FAIL", "EXIT_USAGE", "UsageError", "add_shared_flags", "check_report_path",
           "EXIT_STATUS_TEXT", "version"]

EXIT_PASS = 0
EXIT_FAIL = 1
EXIT_USAGE = 2

#: the exit statuses as the help pages give them
EXIT_STATUS_TEXT = ("Exit status: 0 every check passed, 1 a check failed (or the backends disagree), "
                    "2 usage error or the check could not run.")

#: the report formats of ``agcheck check --report`` and whether they need matplotlib
REPORT_FORMATS = {".html": True, ".htm": True, ".png": True, ".json": False}


def version() -> str:
    """agcheck's version, as ``--version`` and the main job's header give it."""
    from agcheck import __version__

    return __version__


class UsageError(Exception):
    """Bad arguments, or a check that could not run: exit status 2."""


def add_shared_flags(parser: argparse.ArgumentParser, *, top: bool) -> None:
    """Add ``--fast``, ``--report``, ``--quiet``, ``--verbose``, ``--plain``. On a subcommand
    they default to ``argparse.SUPPRESS`` so that one given before it (``agcheck --fast check``) is kept."""
    def default(value):
        return value if top else argparse.SUPPRESS

    group = parser.add_argument_group("output and mode (every command)" if top else "output and mode")
    group.add_argument("--fast", "--fast-mode", dest="fast", action="store_true", default=default(False),
                       help="fast mode (fast_mode=True): random projections v^T J u instead of whole Jacobians")
    group.add_argument("--report", metavar="PATH", default=default(None),
                       help="where to write the report (main job: the HTML report, default agcheck-report.html; "
                            "check: the failure report, .html, .png or .json)")
    group.add_argument("--quiet", "-q", action="store_true", default=default(False),
                       help="less output: no progress, no table; the verdict and the failures only")
    group.add_argument("--verbose", "-v", action="store_true", default=default(False),
                       help="more output: the failures' full messages")
    group.add_argument("--plain", action="store_true", default=default(False),
                       help="plain text: no colours, no progress bar")


def check_report_path(path: str, *, formats: dict | None = None) -> str:
    """The absolute ``path``; a usage error where it cannot be written or (with ``formats``,
    suffix -> needs matplotlib) has an unsupported suffix."""
    full = os.path.abspath(path)
    if os.path.isdir(full):
        raise UsageError(f"--report {path}: is a folder; give a file name")
    if formats is not None:
        ext = os.path.splitext(path)[1].lower()
        if ext not in formats:
            raise UsageError(f"--report {path}: cannot write a report as {ext or 'a file without a suffix'!r}; "
                             f"use {', '.join(f for f in formats if f != '.htm')}")
        if formats[ext] and importlib.util.find_spec("matplotlib") is None:
            raise UsageError(f"--report {path}: {ext} reports need matplotlib (pip install 'agcheck[report]'); "
                             "use .json")
    folder = os.path.dirname(full)
    if not os.path.isdir(folder):
        raise UsageError(f"--report {path}: the folder {folder} does not exist")
    if not os.access(folder, os.W_OK) or (os.path.exists(full) and not os.access(full, os.W_OK)):
        raise UsageError(f"--report {path}: cannot write there (permission denied)")
    return full
