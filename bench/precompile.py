"""Byte-compile the agcheck a benchmark measures, as installing a package and a first
pytest run do.

``pip install`` writes ``.pyc`` files for a package's modules; torch's arrive that way. An
editable checkout has none until Python writes them at the first import, and where
``PYTHONDONTWRITEBYTECODE`` is set (it is on the project's machines) Python never does:
every benchmark process then compiled agcheck's source at ``import agcheck`` and at the
first check (its backends are imported lazily), 40-60 ms that no installed agcheck pays.

Inside pytest there is a second compiler. agcheck's distribution registers a pytest plugin
(a ``pytest11`` entry point), so pytest puts every module of the distribution through its
assertion rewriter when it is imported, and keeps the result in its own ``.pyc`` files
(``*-pytest-*.pyc``) unless bytecode writing is off; with it off, a suite's first check
paid 30-70 ms parsing and compiling agcheck's backends. A user's second pytest run reads
pytest's cached files; :func:`prime_pytest_rewrites` writes them, so that the suites are
timed as from that second run on.

The benchmarks call these before they time anything.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

_CODE = (
    "import agcheck, agcheck.backends, compileall, os, sys\n"
    "root = os.path.dirname(os.path.abspath(agcheck.__file__))\n"
    "ok = compileall.compile_dir(root, quiet=1)\n"
    "ok = compileall.compile_dir(agcheck.backends.__path__[0], quiet=1) and ok\n"
    "print(root)\n"
    "sys.exit(0 if ok else 1)\n"
)

#: a conftest that imports every agcheck module under pytest's rewriting import hook
_CONFTEST = (
    "import importlib, pkgutil\n"
    "import agcheck, agcheck.backends\n"
    "names = [i.name for i in pkgutil.walk_packages(agcheck.__path__, 'agcheck.')]\n"
    "names += [i.name for i in pkgutil.iter_modules(agcheck.backends.__path__, 'agcheck.backends.')]\n"
    "for name in names:\n"
    "    try:\n"
    "        importlib.import_module(name)\n"
    "    except Exception:\n"
    "        pass  # a backend whose framework is not installed\n"
)


def compile_agcheck(python: str = sys.executable, env: dict | None = None) -> str:
    """Write the ``.pyc`` files of the agcheck that ``python`` imports (from ``/``, as the
    benchmarks' worker processes do); return a line for the benchmark's header."""
    proc = subprocess.run([python, "-c", _CODE], capture_output=True, text=True, cwd="/", env=env)
    where = proc.stdout.strip() or "?"
    if proc.returncode != 0:
        return f"agcheck at {where} NOT fully byte-compiled ({proc.stderr.strip()[-200:]})"
    return f"agcheck at {where} byte-compiled, as an installed package is"


def prime_pytest_rewrites(python: str = sys.executable, env: dict | None = None) -> str:
    """Write pytest's rewritten ``.pyc`` files of every agcheck module ``python`` imports:
    a pytest session, with bytecode writing on, whose conftest imports them all. Returns a
    line for the benchmark's header."""
    env = dict(os.environ if env is None else env)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    with tempfile.TemporaryDirectory(prefix="agcheck-prime-") as folder:
        Path(folder, "conftest.py").write_text(_CONFTEST)
        proc = subprocess.run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--co", folder],
                              capture_output=True, text=True, cwd=folder, env=env)
    # exit status 5: no tests collected, as intended
    if proc.returncode not in (0, 5):
        return f"pytest's rewritten agcheck modules NOT written ({proc.stdout.strip()[-200:]})"
    return "pytest's rewritten agcheck modules written, as after a first pytest run"
