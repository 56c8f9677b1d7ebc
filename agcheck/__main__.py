"""``python -m agcheck`` / the ``agcheck`` command.

``agcheck check ...`` and ``agcheck crosscheck ...`` are handed to :mod:`agcheck.frontends.cli`
(checking a function of your own; see docs/cli.md). Without a subcommand, ``agcheck``
runs the main job (:mod:`agcheck.frontends.mainjob`): every function of the bundled catalog
(:mod:`agcheck.frontends.catalog`) is gradchecked on every installed backend and crosschecked
across them, with a progress bar, a summary table and an HTML report. Exit status: 0
when every check passed, 1 when one failed, 2 on a usage error.
"""
from __future__ import annotations

import os
import sys


def _subcommands() -> tuple:
    from agcheck.frontends.cli import SUBCOMMANDS

    return tuple(SUBCOMMANDS)


def main(argv=None) -> int:
    """Run ``agcheck`` with ``argv`` (default ``sys.argv[1:]``); return the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    # TensorFlow's C++ runtime logs warnings for every traced function (dtype notes,
    # aborted rendezvous) unless told otherwise before it loads: keep the tables readable
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if argv and argv[0] in _subcommands():
        from agcheck.frontends import cli

        return cli.main(argv)
    from agcheck.frontends import mainjob

    return mainjob.main(argv)


if __name__ == "__main__":
    sys.exit(main())
