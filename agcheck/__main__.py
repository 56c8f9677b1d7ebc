"""``python -m agcheck`` / the ``agcheck`` command.

One parser (:func:`agcheck.frontends.cli.build_parser`): without a subcommand, ``agcheck``
runs the main job (:mod:`agcheck.frontends.mainjob`): every function of the bundled catalog
(:mod:`agcheck.frontends.catalog`) is gradchecked on every installed backend and crosschecked
across them, with a progress bar, a summary table and an HTML report. ``agcheck check ...``
and ``agcheck crosscheck ...`` check a function of your own (see docs/cli.md). Exit status:
0 when every check passed, 1 when one failed, 2 on a usage error or a check that could not
run.
"""
from __future__ import annotations

import os
import sys


def main(argv=None) -> int:
    """Run ``agcheck`` with ``argv`` (default ``sys.argv[1:]``); return the exit status."""
    # TensorFlow's C++ runtime logs warnings for every traced function (dtype notes,
    # aborted rendezvous) unless told otherwise before it loads: keep the tables readable
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from agcheck.frontends import cli

    return cli.main(sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    sys.exit(main())
