"""crosscheck's arguments validated: the inputs to differentiate, the tolerances, the backends."""
from __future__ import annotations

from typing import Mapping

import numpy as np

from agcheck.backends.base import Backend, BackendUnavailableError
from agcheck.backends.registry import get_backend

__all__ = ["DEFAULT_TOLERANCES", "validate_order", "as_inputs", "checked_positions", "tolerances",
           "needs_double", "resolve_backends", "ports_of", "require_two", "function_name"]

#: (rtol, atol) by the precision of the inputs
DEFAULT_TOLERANCES = {"float64": (1e-7, 1e-10), "float32": (1e-4, 1e-6)}


def validate_order(order) -> None:
    if isinstance(order, bool) or order not in (1, 2):
        raise ValueError(f"order must be 1 or 2, got {order!r}")


def as_inputs(inputs) -> tuple:
    """The inputs as a tuple (NumPy scalars as 0-d arrays)."""
    if isinstance(inputs, list):
        inputs = tuple(inputs)
    if not isinstance(inputs, tuple):
        inputs = (inputs,)
    return tuple(np.asarray(a) if isinstance(a, np.generic) else a for a in inputs)


def _is_inexact_array(a) -> bool:
    return isinstance(a, np.ndarray) and np.issubdtype(a.dtype, np.inexact)


def checked_positions(np_inputs: tuple, wrt) -> list:
    """The positions of the inputs to differentiate: ``wrt``, else every inexact NumPy array."""
    if wrt is None:
        checked = [k for k, a in enumerate(np_inputs) if _is_inexact_array(a)]
    else:
        positions = (wrt,) if isinstance(wrt, int) else tuple(wrt)
        checked = sorted({p % len(np_inputs) for p in positions})
        for p in checked:
            if not _is_inexact_array(np_inputs[p]):
                raise ValueError(f"wrt position {p} is not a floating point or complex NumPy array")
    if not checked:
        raise ValueError("crosscheck expects at least one floating point or complex NumPy array among the inputs")
    return checked


def tolerances(np_inputs: tuple, checked: list, rtol, atol) -> tuple[float, float]:
    """``(rtol, atol)``: the given ones, else the defaults of the checked inputs' precision."""
    low = [np_inputs[p] for p in checked if np_inputs[p].dtype in (np.float32, np.float16, np.complex64)]
    default_rtol, default_atol = DEFAULT_TOLERANCES["float32" if low else "float64"]
    return (default_rtol if rtol is None else float(rtol),
            default_atol if atol is None else float(atol))


def needs_double(np_inputs: tuple) -> bool:
    """Are some of the arrays 64-bit (so that every framework must compute in 64 bits)?"""
    return any(isinstance(a, np.ndarray) and a.dtype in (np.float64, np.complex128, np.int64)
               for a in np_inputs)


def _backend_of(spec, skipped: dict):
    """``(name, Backend)`` of one entry of ``backends``, or ``None`` when not installed."""
    if isinstance(spec, Backend):
        return spec.name, spec
    if not isinstance(spec, str):
        raise TypeError(f"backends must be names or Backend instances, got {spec!r}")
    try:
        return spec, get_backend(spec)
    except BackendUnavailableError as e:
        skipped[spec] = f"not available ({e})"
        return None


def resolve_backends(backends, backend_options: Mapping, wrt) -> tuple[list, dict]:
    """``(name, Backend)`` pairs for the usable backends, and the skipped ones with reasons.
    Backends taking a ``wrt=`` keyword (all but torch, whose checked inputs are those that
    require grad) get ``wrt``, so that ``gradcheck=True`` checks the same inputs."""
    resolved, skipped, seen = [], {}, set()
    if isinstance(backends, (str, Backend)):
        backends = (backends,)
    for spec in backends:
        found = _backend_of(spec, skipped)
        if found is None:
            continue
        name, be = found
        if name in seen:
            raise ValueError(f"backend {name!r} is listed twice")
        seen.add(name)
        options = dict(backend_options.get(name, {}))
        if options:
            be = be.with_options(**options)
        if wrt is not None and name != "torch":
            try:
                be = be.with_options(wrt=tuple(wrt))
            except TypeError:
                pass  # the backend has no wrt=: crosscheck passes the positions itself
        resolved.append((name, be))
    return resolved, skipped


def ports_of(fn, resolved: list, skipped: dict) -> list:
    """``(name, Backend, port)`` per resolved backend with a port of ``fn`` (others go to ``skipped``)."""
    ports = []
    for name, be in resolved:
        if isinstance(fn, Mapping):
            if name not in fn:
                skipped[name] = "no port of fn given for this backend"
                continue
            port = fn[name]
        else:
            if not be.runs_array_api_code:
                raise ValueError(
                    f"crosscheck: one function reaches the {name!r} backend only through the array API, "
                    f"which {name!r} arrays do not implement (array_api_compat has no namespace for them); "
                    f"give ports instead: crosscheck({{'torch': f_torch, {name!r}: f_{name}, ...}}, inputs)"
                )
            port = fn
        if not callable(port):
            raise TypeError(f"fn for backend {name!r} must be callable, got {type(port).__name__}")
        ports.append((name, be, port))
    return ports


def require_two(ports: list, resolved: list, skipped: dict) -> None:
    """Raise unless at least two backends are left to compare."""
    if len(ports) >= 2:
        return
    requested = [n for n, _ in resolved] + list(skipped)
    reasons = "; ".join(f"{n}: {r}" for n, r in skipped.items()) or "only one backend requested"
    error = BackendUnavailableError if any(r.startswith("not available") for r in skipped.values()) else ValueError
    raise error(f"crosscheck needs at least two backends, {len(ports)} of {requested} usable ({reasons})")


def function_name(fn) -> str:
    name = getattr(fn, "__name__", None) if not isinstance(fn, Mapping) else "the ports of fn"
    return name or "fn"
