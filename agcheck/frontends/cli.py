"""The ``agcheck`` command (documented in docs/cli.md): one parser; bare ``agcheck`` runs the
main job (:mod:`agcheck.frontends.mainjob`), ``agcheck check`` and ``agcheck crosscheck``
check a function of your own (``MODULE:FUNCTION``) on random inputs.

Output and mode flags given before a subcommand count for it. Exit status: 0 passed,
1 failed, 2 a usage error or a check that could not run. This module imports no framework.
"""
from __future__ import annotations

import argparse
import sys
import traceback

from agcheck.frontends import mainjob
from agcheck.frontends.cli_inputs import (
    check_tolerances,
    describe_inputs,
    input_specs,
    load_function,
    make_inputs,
    needs_double,
    number_argument,
    numpy_inputs,
    parse_input_spec,
    seed_argument,
)
from agcheck.frontends.command import (
    EXIT_FAIL,
    EXIT_PASS,
    EXIT_STATUS_TEXT,
    EXIT_USAGE,
    REPORT_FORMATS,
    UsageError,
    add_shared_flags,
    check_report_path,
    version,
)

__all__ = ["main", "build_parser", "parse_input_spec", "load_function", "make_inputs", "SUBCOMMANDS", "UsageError"]

#: the subcommands (``agcheck <subcommand> ...``); without one, ``agcheck`` runs the main job
SUBCOMMANDS = ("check", "crosscheck")

# -- output --------------------------------------------------------------------------------

def _rich_console():
    try:
        from rich.console import Console  # optional
    except ImportError:
        return None
    return Console()


def _print_verdict(rows, args) -> None:
    """``rows``: (field, value) pairs of the verdict table (``--quiet``: the verdict alone)."""
    if args.quiet:
        rows = [(k, v) for k, v in rows if k == "verdict"]
    console = None if args.plain else _rich_console()
    if console is not None:
        from rich.table import Table

        table = Table(show_header=False, box=None)
        table.add_column(style="bold")
        table.add_column()
        for k, v in rows:
            style = ""
            if k == "verdict":
                style = "bold green" if v.startswith("PASS") else "bold red"
            table.add_row(k, f"[{style}]{v}[/]" if style else v)
        console.print(table)
        return
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"  {k:<{width}}  {v}")


def _summary_of(error) -> str:
    report = getattr(error, "report", None)
    if report is not None and hasattr(report, "summary"):
        try:
            return report.summary()
        except Exception as e:  # never hide the failure behind a broken report
            return f"(no summary: {e!r})"
    return ""


def _could_not_run(what: str, e: BaseException) -> UsageError:
    if isinstance(e, SystemExit):
        return UsageError(f"{what} could not run: SystemExit({e.code!r}) was raised while it ran "
                          "(by the function, or by code it calls)")
    return UsageError(f"{what} could not run: {type(e).__name__}: {e}".rstrip(": "))


# -- subcommands ---------------------------------------------------------------------------

def _backend_for_check(name: str):
    """The backend ``check`` runs on (one with its own autodiff, installed), else a usage error."""
    from agcheck.backends.base import BackendUnavailableError
    from agcheck.backends.registry import available_backends, canonical_name, get_backend

    name = canonical_name(name)
    if name not in available_backends():
        raise UsageError(f"unknown backend {name!r} (known: {', '.join(available_backends())})")
    if name == "numpy":
        raise UsageError("the numpy backend checks hand-written derivatives (vjp=/jvp=), which the "
                         "command line cannot take: use agcheck.gradcheck from Python")
    try:
        return get_backend(name)
    except BackendUnavailableError as e:
        raise UsageError(f"the {name!r} backend is not installed: {e}") from e


def _run_check(fn, make, gradgrad: bool, kwargs: dict):
    """Run gradcheck (or gradgradcheck) on ``make()``; the GradcheckError, or None if it
    passed. Anything else raised (``SystemExit`` included) is a usage error."""
    from agcheck.backends.base import BackendUnavailableError
    from agcheck.gradcheck import gradcheck
    from agcheck.gradgradcheck import gradgradcheck
    from agcheck.errors import GradcheckError

    try:
        inputs = make()
    except (Exception, SystemExit) as e:
        raise _could_not_run("making the inputs", e) from e
    try:
        (gradgradcheck if gradgrad else gradcheck)(fn, inputs, **kwargs)
    except GradcheckError as e:
        return e
    except BackendUnavailableError as e:
        raise UsageError(str(e)) from e
    except (Exception, SystemExit) as e:
        raise _could_not_run("the check", e) from e
    return None


def _check_failed(args, rows: list, error) -> int:
    """Print the failure (and save its report when asked); exit status 1."""
    headline = getattr(getattr(error, "report", None), "headline", None)
    first = headline() if callable(headline) else str(error).strip().splitlines()[0]
    rows.append(("verdict", f"FAILED ({getattr(error, 'check', None) or 'check'}): {first}"))
    _print_verdict(rows, args)
    summary = _summary_of(error)
    if not args.quiet:
        print()
        print(summary if summary else str(error))
        if args.verbose and summary:
            print()
            print(str(error))
    if args.report:
        report = getattr(error, "report", None)
        if report is None or not hasattr(report, "save"):
            print("agcheck check: no report written: this agcheck's errors carry no savable report", file=sys.stderr)
        else:
            try:
                path = report.save(args.report)
                print(f"report saved to {path or args.report}")
            except Exception as e:
                print(f"agcheck check: error: could not save the report to {args.report}: {type(e).__name__}: {e}",
                      file=sys.stderr)
    return EXIT_FAIL


def _check(args) -> int:
    specs = input_specs(args.input)
    check_tolerances(args, ("eps", "atol", "rtol"))
    if args.report:
        check_report_path(args.report, formats=REPORT_FORMATS)
    if not args.quiet and sys.stderr.isatty():  # at once: importing a framework takes seconds
        print(f"agcheck check: loading {args.backend} and {args.target} ...", file=sys.stderr, flush=True)
    be = _backend_for_check(args.backend)
    fn = load_function(args.target)
    kwargs = dict(backend=args.backend, fast_mode=args.fast, check_forward_ad=args.forward,
                  progress=not (args.quiet or args.plain))
    for name in ("eps", "atol", "rtol"):
        if getattr(args, name) is not None:
            kwargs[name] = getattr(args, name)
    if args.gradgrad:
        kwargs["check_fwd_over_rev"] = kwargs.pop("check_forward_ad")
    modes = ["reverse"] + (["forward"] if args.forward else [])
    rows = [("function", args.target), ("check", "gradgradcheck" if args.gradgrad else "gradcheck"),
            ("backend", args.backend), ("inputs", describe_inputs(specs)),
            ("mode", f"{'fast' if args.fast else 'slow'}, {' + '.join(modes)}; seed {args.seed}")]
    # JAX computes in 32 bits unless told otherwise: 64-bit inputs need its 64-bit mode
    with be.precision(needs_double(specs)):
        error = _run_check(fn, lambda: make_inputs(specs, args.backend, args.seed), args.gradgrad, kwargs)
    if error is not None:
        return _check_failed(args, rows, error)
    rows.append(("verdict", "PASSED"))
    _print_verdict(rows, args)
    if args.report and not args.quiet:
        print(f"no report written to {args.report}: the check passed")
    return EXIT_PASS


def _crosscheck(args) -> int:
    from agcheck.backends.base import BackendUnavailableError
    from agcheck.crosscheck import crosscheck
    from agcheck.errors import GradcheckError

    specs = input_specs(args.input)
    check_tolerances(args, ("atol", "rtol"))
    text = getattr(args, "backends", None) or "torch,jax"
    backends = [b.strip() for b in text.split(",") if b.strip()]
    if len(backends) < 2:
        raise UsageError(f"--backends needs at least two backends, got {text!r}")
    fn = load_function(args.target)
    inputs = tuple(numpy_inputs(specs, args.seed))
    kwargs = dict(backends=backends, fast_mode=args.fast, order=args.order, gradcheck=args.gradcheck,
                  check_forward_ad=not args.no_forward)
    for name in ("atol", "rtol"):
        if getattr(args, name) is not None:
            kwargs[name] = getattr(args, name)
    rows = [("function", args.target), ("check", "crosscheck"), ("backends", ", ".join(backends)),
            ("inputs", describe_inputs(specs)),
            ("mode", f"{'fast' if args.fast else 'full Jacobians'}, order {args.order}; seed {args.seed}")]
    try:
        result = crosscheck(fn, inputs, **kwargs)
    except GradcheckError as e:
        res = getattr(e, "details", {}).get("result")
        first = str(e).strip().splitlines()[0]
        rows.append(("verdict", f"FAILED: {first}"))
        _print_verdict(rows, args)
        if not args.quiet:
            print()
            print(str(e) if res is None or args.verbose else "\n".join(str(e).strip().splitlines()[1:]))
        return EXIT_FAIL
    except (BackendUnavailableError, ValueError, TypeError) as e:
        raise UsageError(str(e)) from e
    except (Exception, SystemExit) as e:
        raise _could_not_run("the crosscheck", e) from e
    rows.append(("verdict", "PASSED (all backends agree)"))
    _print_verdict(rows, args)
    if not args.quiet:
        print()
        print(result.summary())
    return EXIT_PASS


# -- the parser ----------------------------------------------------------------------------

def _function_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("target", metavar="MODULE:FUNCTION",
                   help="the function: a module (dotted name, or path to a .py file) and a name in it")
    p.add_argument("--input", "-i", action="append", metavar="SHAPE[:DTYPE]",
                   help="one positional argument of the function, e.g. 3x4, 5, scalar, 4:complex128 "
                        "(dtype default float64); repeat for several arguments")
    p.add_argument("--seed", type=seed_argument, default=0,
                   help="seed of the random inputs, 0 or more (default: %(default)s)")
    p.add_argument("--atol", type=number_argument, default=None, help="absolute tolerance")
    p.add_argument("--rtol", type=number_argument, default=None, help="relative tolerance")


def build_parser() -> argparse.ArgumentParser:
    """The ``agcheck`` parser: the main job's options, the shared flags, the subcommands."""
    parser = argparse.ArgumentParser(
        prog="agcheck",
        description=(
            "agcheck: a gradient checker with the semantics of torch.autograd.gradcheck. "
            "Without a subcommand, runs the main job: every function of the bundled catalog "
            "(written once against the array API) is gradchecked on every installed backend "
            "(torch, jax, tensorflow, mlx; numpy for the functions with hand-written derivatives) and "
            "crosschecked across them; a summary table is printed and an HTML report written. "
            "The subcommands check a function of your own."
        ),
        epilog="Examples: agcheck --only linalg,softmax; agcheck check ops.py:my_fn --input 3x4; "
               "agcheck crosscheck ops.py:my_fn --input 3 --backends torch,jax. " + EXIT_STATUS_TEXT,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    mainjob.add_arguments(parser)
    add_shared_flags(parser, top=True)
    sub = parser.add_subparsers(dest="command", title="subcommands", metavar="{check,crosscheck}",
                                description="without one, agcheck runs the main job")

    p = sub.add_parser(
        "check", help="gradcheck a function of yours on random inputs",
        description="Run agcheck.gradcheck (or gradgradcheck) on MODULE:FUNCTION with random inputs "
                    "of the given shapes and dtypes.",
        epilog="Example: agcheck check ops.py:my_fn --input 3x4 --input 4:complex128 --forward\n"
               + EXIT_STATUS_TEXT,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _function_arguments(p)
    p.add_argument("--backend", "-b", default="torch",
                   help="torch, jax or tensorflow (default: %(default)s)")
    p.add_argument("--forward", action="store_true", help="also check forward-mode AD (check_forward_ad)")
    p.add_argument("--gradgrad", action="store_true", help="check second derivatives (gradgradcheck)")
    p.add_argument("--eps", type=number_argument, default=None, help="finite-difference step (default 1e-6)")
    add_shared_flags(p, top=False)
    p.set_defaults(run=_check)

    p = sub.add_parser(
        "crosscheck", help="compare values and derivatives of a function of yours across backends",
        description="Run agcheck.crosscheck on MODULE:FUNCTION (written against the array API) with "
                    "random NumPy inputs converted for each backend.",
        epilog="Example: agcheck crosscheck ops.py:my_fn --input 3x4 --backends torch,jax\n"
               "Exit status: 0 the backends agree, 1 they disagree, 2 usage error or the check could not run.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _function_arguments(p)
    p.add_argument("--backends", default=argparse.SUPPRESS,
                   help="comma-separated backends, the first is the reference (default: torch,jax)")
    p.add_argument("--order", type=int, choices=(1, 2), default=1, help="2 also compares second derivatives")
    p.add_argument("--gradcheck", action="store_true", help="also gradcheck every backend")
    p.add_argument("--no-forward", action="store_true",
                   help="do not compare forward-mode derivatives (e.g. for jax.custom_vjp functions)")
    add_shared_flags(p, top=False)
    p.set_defaults(run=_crosscheck)
    return parser


def _job_options_with_a_subcommand(args) -> list:
    return [f"--{name.replace('_', '-')}" for name, default in mainjob.JOB_ONLY.items()
            if getattr(args, name, default) != default]


def main(argv=None) -> int:
    """Run ``agcheck`` with ``argv`` (default ``sys.argv[1:]``); the exit status."""
    parser = build_parser()
    try:
        args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    except SystemExit as e:  # --help / --version (0) or an argparse usage error (2)
        return EXIT_PASS if e.code in (0, None) else EXIT_USAGE
    prog = "agcheck" + (f" {args.command}" if args.command else "")
    try:
        if args.command is None:
            return mainjob.run_job(args)
        misplaced = _job_options_with_a_subcommand(args)
        if misplaced:
            raise UsageError(f"{', '.join(misplaced)}: an option of the main job (agcheck without a "
                             f"subcommand), not of agcheck {args.command}")
        return args.run(args)
    except UsageError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # agcheck's own error: say so, and never as a failed check (1)
        traceback.print_exc()
        print(f"{prog}: error: the command could not run ({type(e).__name__}: {e}); this is a bug of agcheck's",
              file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
