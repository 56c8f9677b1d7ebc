"""``python -m agcheck`` / the ``agcheck`` command.

``agcheck check ...`` and ``agcheck crosscheck ...`` are handed to :mod:`agcheck.cli`
(checking a function of your own; see docs/cli.md). Without a subcommand, ``agcheck``
runs a short demonstration: it checks two custom ``torch.autograd.Function`` s (see
:mod:`agcheck.examples`) with :func:`agcheck.gradcheck`, one with a correct backward,
which must pass, and one whose backward is scaled by 2, which must fail. The demo's exit
status: 0 when both verdicts are the expected ones, 1 otherwise, 2 when torch is not
installed or on a usage error.
"""
from __future__ import annotations

import argparse
import sys

EXIT_OK = 0
EXIT_UNEXPECTED = 1
EXIT_NO_TORCH = 2  # also a usage error, as argparse reports it

TORCH_MISSING = (
    "agcheck: the demo checks PyTorch functions, but torch is not installed.\n"
    "Install agcheck with its torch extra:\n"
    "    pip install 'agcheck[torch]'\n"
    "(from a clone: pip install -c constraints.txt -e '.[torch]')"
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="agcheck",
        description=(
            "agcheck: a gradient checker with the semantics of torch.autograd.gradcheck. "
            "Without options, runs a demo: a function with a correct backward must pass "
            "the check and the same function with its backward scaled by 2 must fail."
        ),
        epilog=(
            "Check a function of your own: agcheck check MODULE:FUNCTION --input SHAPE[:DTYPE] ... "
            "or agcheck crosscheck MODULE:FUNCTION ... (see agcheck check --help). "
            "Demo exit status: 0 if both verdicts are as expected, 1 if not, 2 if torch is missing."
        ),
    )
    parser.add_argument(
        "--fast-mode",
        action="store_true",
        help="run the checks with fast_mode=True (random projections v^T J u)",
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="seed of the demo's input (default: %(default)s)"
    )
    parser.add_argument(
        "--lines",
        type=int,
        default=8,
        metavar="N",
        help="how many lines of a failure message to print (default: %(default)s; 0 for all)",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    return parser


def _version() -> str:
    try:
        from . import __version__

        return __version__
    except Exception:  # the core failed to import; --version should still answer
        return "unknown"


def _first_lines(text: str, n: int) -> list[str]:
    lines = text.rstrip("\n").splitlines()
    if n <= 0 or len(lines) <= n:
        return lines
    return lines[:n] + [f"... ({len(lines) - n} more lines in the GradcheckError message)"]


def _diagnosis_lines(text: str) -> list[str]:
    """The "diagnosis:" block of agcheck's report (beyond torch), if the message has one."""
    lines = text.splitlines()
    for start, line in enumerate(lines):
        if line.startswith("diagnosis:"):
            block = [line]
            for follow in lines[start + 1:]:
                if not follow.startswith(" "):
                    break
                block.append(follow)
            return block
    return []


def _subcommands() -> tuple:
    try:
        from .cli import SUBCOMMANDS
    except ImportError:  # no command line module: the demo only
        return ()
    return tuple(SUBCOMMANDS)


def main(argv=None) -> int:
    """Run ``agcheck`` with ``argv`` (default ``sys.argv[1:]``); return the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in _subcommands():
        from . import cli

        return cli.main(argv)

    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exit_:  # --help / --version (0) or a usage error (2)
        return 0 if exit_.code in (0, None) else EXIT_NO_TORCH

    try:
        import torch
    except ImportError:
        print(TORCH_MISSING, file=sys.stderr)
        return EXIT_NO_TORCH

    import agcheck
    from agcheck import examples

    mode = "fast mode" if args.fast_mode else "slow mode"
    print(f"agcheck {agcheck.__version__} demo (torch {torch.__version__}, {mode})")
    print()

    all_as_expected = True
    for number, (name, fn, should_pass) in enumerate(examples.EXAMPLES, start=1):
        inputs = examples.demo_inputs(args.seed)
        message = None
        try:
            passed = agcheck.gradcheck(fn, inputs, raise_exception=True, fast_mode=args.fast_mode)
        except agcheck.GradcheckError as err:
            passed = False
            message = str(err)
        except Exception as err:  # not a verdict: the check itself broke
            passed = None
            message = f"{type(err).__name__}: {err}"

        verdict = {True: "PASS", False: "FAIL", None: "ERROR"}[passed]
        expected = "PASS" if should_pass else "FAIL"
        as_expected = passed is not None and passed == should_pass
        all_as_expected = all_as_expected and as_expected
        mark = "as expected" if as_expected else "UNEXPECTED"
        print(f"[{number}] {name}: {verdict} (expected {expected}, {mark})")
        if message:
            shown = _first_lines(message, args.lines)
            for line in shown:
                print(f"    {line}" if line else "")
            diagnosis = _diagnosis_lines(message)
            if diagnosis and diagnosis[0] not in shown:
                for line in diagnosis:
                    print(f"    {line}")
        print()

    if all_as_expected:
        print("demo OK: agcheck passed the correct backward and caught the broken one.")
        return EXIT_OK
    print("demo FAILED: a verdict was not the expected one.", file=sys.stderr)
    return EXIT_UNEXPECTED


if __name__ == "__main__":
    sys.exit(main())
