"""The agcheck command line: check a function of your own from the shell.

::

    agcheck check mymodule:myfn --input 3x4 --input 4:complex128 [--backend torch]
                  [--fast] [--forward] [--report out.html]
    agcheck crosscheck mymodule:myfn --input 3x4 [--backends torch,jax]

``MODULE:FUNCTION`` names a function by its module (a dotted name importable from the
current directory, or a path to a ``.py`` file) and its name in that module (dotted
attributes allowed: ``mod:Class.method``). Inputs are drawn at random (seeded with
``--seed``) with the given shapes and dtypes (default ``float64``): standard normal
entries, for torch tensors that require grad (floating/complex), for JAX ``jax.numpy``
arrays (64-bit mode switched on for the check when an input is 64-bit, and the caller's
setting restored afterwards), for crosscheck NumPy arrays. The arrays are made through
the backends' ``from_numpy``; this module imports no framework.

Exit status: 0 when the check passed, 1 when it failed, 2 on a usage error (bad
arguments, a module or function that cannot be imported, a backend that is not
installed, or a function that cannot run on the inputs).

:func:`main` takes the arguments (``argv``, without the program name) and returns the
exit status; ``python -m agcheck.frontends.cli check ...`` runs it.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys

__all__ = ["main", "build_parser", "parse_input_spec", "load_function", "make_inputs", "SUBCOMMANDS"]

EXIT_PASS = 0
EXIT_FAIL = 1
EXIT_USAGE = 2

#: the subcommands this module handles (``agcheck <subcommand> ...``)
SUBCOMMANDS = ("check", "crosscheck")

DTYPES = ("float64", "float32", "complex128", "complex64", "float16", "int64", "int32", "bool")


class UsageError(Exception):
    """Bad arguments: exit status 2."""


# -- arguments -----------------------------------------------------------------------------

def parse_input_spec(spec: str) -> tuple[tuple, str]:
    """``"3x4"`` -> ``((3, 4), "float64")``; ``"4:complex128"``; ``"scalar"`` or ``"()"``
    for a 0-d array (``"scalar:float32"``)."""
    text = spec.strip()
    shape_text, _, dtype = text.partition(":")
    dtype = (dtype.strip() or "float64").lower()
    if dtype not in DTYPES:
        raise UsageError(f"--input {spec!r}: unknown dtype {dtype!r} (choose from {', '.join(DTYPES)})")
    shape_text = shape_text.strip().lower()
    if shape_text in ("scalar", "()", ""):
        if shape_text == "":
            raise UsageError(f"--input {spec!r}: missing shape (e.g. 3x4, 5 or scalar)")
        return (), dtype
    shape = []
    for part in shape_text.replace(",", "x").split("x"):
        part = part.strip()
        if not part.isdigit():
            raise UsageError(f"--input {spec!r}: a shape is sizes separated by 'x' (e.g. 3x4), got {shape_text!r}")
        shape.append(int(part))
    return tuple(shape), dtype


def _input_specs(values) -> list:
    if not values:
        raise UsageError("give at least one --input (e.g. --input 3x4 or --input 4:complex128)")
    return [parse_input_spec(v) for v in values]


def load_function(target: str):
    """The function named by ``MODULE:FUNCTION`` (``MODULE`` a dotted name or a ``.py`` path)."""
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise UsageError(f"expected MODULE:FUNCTION (e.g. mypkg.ops:my_fn or ops.py:my_fn), got {target!r}")
    if module_name.endswith(".py") or os.sep in module_name or "/" in module_name:
        path = os.path.abspath(module_name)
        if not os.path.isfile(path):
            raise UsageError(f"no such file: {module_name}")
        name = "_agcheck_user_" + os.path.splitext(os.path.basename(path))[0]
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.path.insert(0, os.path.dirname(path))
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except Exception as e:
            raise UsageError(f"importing {module_name} failed: {type(e).__name__}: {e}") from e
        finally:
            sys.path.remove(os.path.dirname(path))
    else:
        if "" not in sys.path and os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())  # as `python -m` does: modules of the current folder
        try:
            module = importlib.import_module(module_name)
        except ImportError as e:
            raise UsageError(f"cannot import module {module_name!r}: {e}") from e
        except Exception as e:
            raise UsageError(f"importing {module_name} failed: {type(e).__name__}: {e}") from e
    obj = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise UsageError(f"module {module_name!r} has no attribute {attr!r}") from None
    if not callable(obj):
        raise UsageError(f"{target} is not callable (it is a {type(obj).__name__})")
    return obj


def _numpy_inputs(specs, seed: int) -> list:
    import numpy as np

    rng = np.random.default_rng(seed)
    arrays = []
    for shape, dtype in specs:
        if dtype.startswith("complex"):
            a = (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)
        elif dtype == "bool":
            a = rng.integers(0, 2, size=shape).astype(bool)
        elif dtype.startswith("int"):
            a = rng.integers(-5, 6, size=shape).astype(dtype)
        else:
            a = rng.standard_normal(shape).astype(dtype)
        arrays.append(np.asarray(a))
    return arrays


def make_inputs(specs, backend: str, seed: int = 0) -> tuple:
    """Random inputs of the given ``(shape, dtype)`` specs for ``backend``: the backend's
    arrays (made with its ``from_numpy``), the floating point and complex ones marked for
    differentiation (torch: ``requires_grad``).

    JAX computes in 32 bits unless told otherwise: make 64-bit JAX inputs, and run the
    check, inside the backend's ``precision(True)`` context, as the ``check`` command does.
    """
    import numpy as np

    from agcheck.backends.registry import get_backend

    be = get_backend(backend)
    return tuple(be.from_numpy(a, checked=bool(np.issubdtype(a.dtype, np.inexact)))
                 for a in _numpy_inputs(specs, seed))


def _double(specs) -> bool:
    """Are some inputs 64-bit (so that JAX must compute in 64 bits)?"""
    return any(dtype in ("float64", "complex128", "int64") for _, dtype in specs)


def _describe_inputs(specs) -> str:
    return ", ".join(f"{'x'.join(map(str, s)) or 'scalar'} {d}" for s, d in specs)


# -- output --------------------------------------------------------------------------------

def _rich_console():
    try:
        from rich.console import Console  # optional
    except ImportError:
        return None
    return Console()


def _print_verdict(rows, plain: bool) -> None:
    """``rows``: (field, value) pairs of the verdict table."""
    console = None if plain else _rich_console()
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


def _run_check(fn, inputs, gradgrad: bool, kwargs: dict):
    """Run gradcheck (or gradgradcheck); the GradcheckError if it failed, else None."""
    from agcheck.backends.base import BackendUnavailableError
    from agcheck.gradcheck import gradcheck
    from agcheck.gradgradcheck import gradgradcheck
    from agcheck.report.errors import GradcheckError

    try:
        (gradgradcheck if gradgrad else gradcheck)(fn, inputs, **kwargs)
    except GradcheckError as e:
        return e
    except BackendUnavailableError as e:
        raise UsageError(str(e)) from e
    except Exception as e:
        raise UsageError(f"the check could not run: {type(e).__name__}: {e}") from e
    return None


def _check_failed(args, rows: list, error) -> int:
    """Print the failure (and save its report when asked); exit status 1."""
    headline = getattr(getattr(error, "report", None), "headline", None)
    first = headline() if callable(headline) else str(error).strip().splitlines()[0]
    rows.append(("verdict", f"FAILED ({getattr(error, 'check', None) or 'check'}): {first}"))
    _print_verdict(rows, args.plain)
    summary = _summary_of(error)
    print()
    print(summary if summary else str(error))
    if args.verbose and summary:
        print()
        print(str(error))
    if args.report:
        report = getattr(error, "report", None)
        if report is None or not hasattr(report, "save"):
            print("no report written: this agcheck's errors carry no savable report", file=sys.stderr)
        else:
            try:
                path = report.save(args.report)
                print(f"report saved to {path or args.report}")
            except Exception as e:
                print(f"could not save the report to {args.report}: {type(e).__name__}: {e}", file=sys.stderr)
    return EXIT_FAIL


def _check(args) -> int:
    specs = _input_specs(args.input)
    fn = load_function(args.target)
    be = _backend_for_check(args.backend)
    kwargs = dict(backend=args.backend, fast_mode=args.fast, check_forward_ad=args.forward)
    for name in ("eps", "atol", "rtol"):
        if getattr(args, name) is not None:
            kwargs[name] = getattr(args, name)
    if args.gradgrad:
        kwargs["check_fwd_over_rev"] = kwargs.pop("check_forward_ad")
    modes = ["reverse"] + (["forward"] if args.forward else [])
    rows = [("function", args.target), ("check", "gradgradcheck" if args.gradgrad else "gradcheck"),
            ("backend", args.backend), ("inputs", _describe_inputs(specs)),
            ("mode", f"{'fast' if args.fast else 'slow'}, {' + '.join(modes)}; seed {args.seed}")]
    # JAX computes in 32 bits unless told otherwise: 64-bit inputs switch its 64-bit mode
    # on for the inputs and the check, and the caller's setting comes back afterwards
    with be.precision(_double(specs)):
        error = _run_check(fn, make_inputs(specs, args.backend, args.seed), args.gradgrad, kwargs)
    if error is not None:
        return _check_failed(args, rows, error)
    rows.append(("verdict", "PASSED"))
    _print_verdict(rows, args.plain)
    if args.report:
        print(f"no report written to {args.report}: the check passed")
    return EXIT_PASS


def _crosscheck(args) -> int:
    from agcheck.backends.base import BackendUnavailableError
    from agcheck.crosscheck import crosscheck
    from agcheck.report.errors import GradcheckError

    specs = _input_specs(args.input)
    fn = load_function(args.target)
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    if len(backends) < 2:
        raise UsageError(f"--backends needs at least two backends, got {args.backends!r}")
    inputs = tuple(_numpy_inputs(specs, args.seed))
    kwargs = dict(backends=backends, fast_mode=args.fast, order=args.order, gradcheck=args.gradcheck,
                  check_forward_ad=not args.no_forward)
    for name in ("atol", "rtol"):
        if getattr(args, name) is not None:
            kwargs[name] = getattr(args, name)
    rows = [("function", args.target), ("check", "crosscheck"), ("backends", ", ".join(backends)),
            ("inputs", _describe_inputs(specs)),
            ("mode", f"{'fast' if args.fast else 'full Jacobians'}, order {args.order}; seed {args.seed}")]
    try:
        result = crosscheck(fn, inputs, **kwargs)
    except GradcheckError as e:
        res = getattr(e, "details", {}).get("result")
        first = str(e).strip().splitlines()[0]
        rows.append(("verdict", f"FAILED: {first}"))
        _print_verdict(rows, args.plain)
        print()
        print(str(e) if res is None or args.verbose else "\n".join(str(e).strip().splitlines()[1:]))
        return EXIT_FAIL
    except (BackendUnavailableError, ValueError, TypeError) as e:
        raise UsageError(str(e)) from e
    except Exception as e:
        raise UsageError(f"the crosscheck could not run: {type(e).__name__}: {e}") from e
    rows.append(("verdict", "PASSED (all backends agree)"))
    _print_verdict(rows, args.plain)
    print()
    print(result.summary())
    return EXIT_PASS


# -- parser --------------------------------------------------------------------------------

def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("target", metavar="MODULE:FUNCTION",
                   help="the function: a module (dotted name, or path to a .py file) and a name in it")
    p.add_argument("--input", "-i", action="append", metavar="SHAPE[:DTYPE]",
                   help="one positional argument of the function, e.g. 3x4, 5, scalar, 4:complex128 "
                        "(dtype default float64); repeat for several arguments")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default: %(default)s)")
    p.add_argument("--fast", action="store_true", help="fast mode: random projections v^T J u")
    p.add_argument("--atol", type=float, default=None, help="absolute tolerance")
    p.add_argument("--rtol", type=float, default=None, help="relative tolerance")
    p.add_argument("--plain", action="store_true", help="plain text output (no rich table)")
    p.add_argument("--verbose", "-v", action="store_true", help="also print the full error message")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="agcheck",
        description="Check the derivatives of a function of yours from the command line.",
        epilog="Exit status: 0 pass, 1 failure, 2 usage error.",
    )
    sub = parser.add_subparsers(dest="command", metavar="{check,crosscheck}")
    sub.required = True

    p = sub.add_parser(
        "check", help="gradcheck a function on random inputs",
        description="Run agcheck.gradcheck (or gradgradcheck) on MODULE:FUNCTION with random inputs "
                    "of the given shapes and dtypes.",
        epilog="Example: agcheck check ops.py:my_fn --input 3x4 --input 4:complex128 --forward\n"
               "Exit status: 0 pass, 1 failure, 2 usage error.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _common(p)
    p.add_argument("--backend", "-b", default="torch",
                   help="torch, jax or tensorflow (default: %(default)s)")
    p.add_argument("--forward", action="store_true", help="also check forward-mode AD (check_forward_ad)")
    p.add_argument("--gradgrad", action="store_true", help="check second derivatives (gradgradcheck)")
    p.add_argument("--eps", type=float, default=None, help="finite-difference step (default 1e-6)")
    p.add_argument("--report", metavar="PATH", default=None,
                   help="on failure, save the report here (.html, .png or .json)")
    p.set_defaults(run=_check)

    p = sub.add_parser(
        "crosscheck", help="compare values and derivatives of a function across backends",
        description="Run agcheck.crosscheck on MODULE:FUNCTION (written against the array API) with "
                    "random NumPy inputs converted for each backend.",
        epilog="Example: agcheck crosscheck ops.py:my_fn --input 3x4 --backends torch,jax\n"
               "Exit status: 0 the backends agree, 1 they disagree, 2 usage error.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _common(p)
    p.add_argument("--backends", default="torch,jax",
                   help="comma-separated backends, the first is the reference (default: %(default)s)")
    p.add_argument("--order", type=int, choices=(1, 2), default=1, help="2 also compares second derivatives")
    p.add_argument("--gradcheck", action="store_true", help="also gradcheck every backend")
    p.add_argument("--no-forward", action="store_true",
                   help="do not compare forward-mode derivatives (e.g. for jax.custom_vjp functions)")
    p.set_defaults(run=_crosscheck)
    return parser


def main(argv=None) -> int:
    """Run the command line with ``argv`` (default ``sys.argv[1:]``); the exit status."""
    parser = build_parser()
    try:
        args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    except SystemExit as e:  # --help (0) or an argparse usage error (2)
        return EXIT_USAGE if e.code not in (0, None) else EXIT_PASS
    try:
        return args.run(args)
    except UsageError as e:
        print(f"agcheck {args.command}: error: {e}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
