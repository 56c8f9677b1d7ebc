"""The function (``MODULE:FUNCTION``) and random inputs (``--input 3x4``, ``4:complex128``) of
``agcheck check`` and ``agcheck crosscheck``, refused with a usage error before any work.
Imports no framework: arrays are made through the backends' ``from_numpy``."""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import math
import os
import sys

from agcheck.frontends.command import UsageError

__all__ = ["DTYPES", "parse_input_spec", "input_specs", "load_function", "make_inputs", "numpy_inputs",
           "seed_argument", "number_argument", "check_tolerances", "needs_double", "describe_inputs"]

DTYPES = ("float64", "float32", "complex128", "complex64", "float16", "int64", "int32", "bool")
_ITEMSIZE = {"float64": 8, "float32": 4, "complex128": 16, "complex64": 8, "float16": 2, "int64": 8, "int32": 4,
             "bool": 1}


def parse_input_spec(spec: str) -> tuple[tuple, str]:
    """``"3x4"`` -> ``((3, 4), "float64")``; ``"4:complex128"``; ``"scalar"`` or ``"()"``
    for a 0-d array (``"scalar:float32"``)."""
    text = spec.strip()
    shape_text, _, dtype = text.partition(":")
    dtype = (dtype.strip() or "float64").lower()
    if dtype not in DTYPES:
        raise UsageError(f"--input {spec!r}: unknown dtype {dtype!r} (choose from {', '.join(DTYPES)})")
    shape_text = shape_text.strip().lower()
    if not shape_text:
        raise UsageError(f"--input {spec!r}: missing shape (e.g. 3x4, 5 or scalar)")
    if shape_text in ("scalar", "()"):
        return (), dtype
    shape = []
    for part in shape_text.replace(",", "x").split("x"):
        part = part.strip()
        if not part.isdigit():
            raise UsageError(f"--input {spec!r}: a shape is sizes separated by 'x' (e.g. 3x4), got {shape_text!r}")
        shape.append(int(part))
    return tuple(shape), dtype


def _memory_bytes() -> int | None:
    """This machine's physical memory (``None`` when the system does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def _size(n: float) -> str:
    for unit in ("bytes", "KB", "MB", "GB", "TB"):
        if n < 1024 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TB"


def input_specs(values) -> list:
    """The parsed ``--input`` specs; inputs must fit in a quarter of this machine's memory (a
    check holds several copies of them, and its Jacobians are larger still)."""
    if not values:
        raise UsageError("give at least one --input (e.g. --input 3x4 or --input 4:complex128)")
    specs = [parse_input_spec(v) for v in values]
    total = 0
    memory = _memory_bytes()
    for v, (shape, dtype) in zip(values, specs):
        n = math.prod(shape)
        total += n * _ITEMSIZE[dtype]
        if memory is not None and total > memory // 4:
            raise UsageError(f"--input {v}: {n:,} elements ({_size(n * _ITEMSIZE[dtype])} as {dtype}); the inputs "
                             f"would not fit in a quarter of this machine's memory ({_size(memory)}), and a gradient "
                             "check needs many times its inputs' size")
    return specs


def seed_argument(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def number_argument(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None


def check_tolerances(args, names) -> None:
    """Refuse bad ``--eps/--atol/--rtol`` before any work (the checker's own validation)."""
    given = {n: getattr(args, n) for n in names if getattr(args, n, None) is not None}
    if not given:
        return
    from agcheck.options import GradcheckOptions

    try:
        GradcheckOptions(**given)
    except (ValueError, TypeError) as e:
        raise UsageError(str(e)) from None


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
        except (Exception, SystemExit) as e:
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
        except (Exception, SystemExit) as e:
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


def numpy_inputs(specs, seed: int) -> list:
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
    """Random ``backend`` arrays for ``(shape, dtype)`` specs, the inexact ones checked.

    Make 64-bit JAX inputs (and run the check) inside the backend's ``precision(True)``.
    """
    from agcheck.frontends.mainjob_checks import convert

    return convert(numpy_inputs(specs, seed), backend)


def needs_double(specs) -> bool:
    """Are some inputs 64-bit (so that JAX must compute in 64 bits)?"""
    return any(dtype in ("float64", "complex128", "int64") for _, dtype in specs)


def describe_inputs(specs) -> str:
    return ", ".join(f"{'x'.join(map(str, s)) or 'scalar'} {d}" for s, d in specs)
