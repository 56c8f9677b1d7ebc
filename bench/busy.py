"""Busy loops beside a benchmark: the load of a shared machine, made on purpose.

A CI runner that runs tests in parallel, or a laptop doing other work, leaves a
benchmark less than a core. ``busy_loops(n)`` starts ``n`` processes that spin at the
benchmark's own niceness (``nice -n 10``, as ``real_suites.py`` runs the suites), for as
long as the ``with`` block lasts, so that a run can be repeated under the same load.
"""
from __future__ import annotations

import contextlib
import subprocess
import sys

__all__ = ["busy_loops"]

_SPIN = "while True:\n    pass\n"


@contextlib.contextmanager
def busy_loops(n: int, niceness: int = 10):
    """Run ``n`` spinning processes at ``niceness`` while the block runs (none for 0)."""
    procs = [subprocess.Popen(["nice", "-n", str(niceness), sys.executable, "-c", _SPIN],
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
             for _ in range(max(0, n))]
    try:
        yield procs
    finally:
        for proc in procs:
            proc.kill()
        for proc in procs:
            proc.wait()
