"""Byte-compile the agcheck a benchmark measures, as installing a package does.

``pip install`` writes ``.pyc`` files for a package's modules; torch's arrive that way. An
editable checkout has none until Python writes them at the first import, and where
``PYTHONDONTWRITEBYTECODE`` is set (it is on the project's machines) Python never does:
every benchmark process then compiled agcheck's source at ``import agcheck`` and at the
first check (its backends are imported lazily), 40-60 ms that no installed agcheck pays.
The benchmarks call :func:`compile_agcheck` before they time anything.
"""
from __future__ import annotations

import subprocess
import sys

_CODE = (
    "import agcheck, compileall, os, sys\n"
    "root = os.path.dirname(os.path.abspath(agcheck.__file__))\n"
    "ok = compileall.compile_dir(root, quiet=1)\n"
    "print(root)\n"
    "sys.exit(0 if ok else 1)\n"
)


def compile_agcheck(python: str = sys.executable, env: dict | None = None) -> str:
    """Write the ``.pyc`` files of the agcheck that ``python`` imports (from ``/``, as the
    benchmarks' worker processes do); return a line for the benchmark's header."""
    proc = subprocess.run([python, "-c", _CODE], capture_output=True, text=True, cwd="/", env=env)
    where = proc.stdout.strip() or "?"
    if proc.returncode != 0:
        return f"agcheck at {where} NOT fully byte-compiled ({proc.stderr.strip()[-200:]})"
    return f"agcheck at {where} byte-compiled, as an installed package is"
