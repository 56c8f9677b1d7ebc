"""Public Jacobians: the matrices gradcheck compares, on any backend, laid out as it lays
them out (one ``(input.numel, output.numel)`` matrix per checked input and output).
"""
from __future__ import annotations

from typing import Callable

from agcheck.core import jacobian as jac
from agcheck.core.problem import resolve_problem
from agcheck.stencil import get_stencil

__all__ = ["numerical_jacobian", "analytical_jacobian"]


def _checked_problem(fn, inputs, backend, backend_options):
    be, fn, args = resolve_problem(fn, inputs, backend, backend_options)
    checked = be.checked_positions(args)
    if not checked:
        raise ValueError(be.no_checked_inputs_message)
    return be, fn, args, checked


def _complex_outputs_refused(be, outputs) -> None:
    for k, o in enumerate(outputs):
        if be.is_array(o) and be.is_complex(o):
            raise ValueError(
                f"output {k} is complex: a complex output has two real Jacobians (of its real and "
                "imaginary parts); return them as two real outputs, e.g. (out.real, out.imag), "
                "and each gets its own matrix"
            )


def _forward_rows(be, fn, args, checked, i) -> list:
    """Forward-mode Jacobians of the floating outputs w.r.t. ``args[checked[i]]``, one JVP per
    element; a complex input's row is ``J e + i J (i e)``, the numerical ``d/dx + i d/dy``."""
    x = args[checked[i]]
    zero = [be.xp(args[p]).zeros_like(args[p]) for p in checked]

    def tangent_outputs(t):
        tangents = list(zero)
        tangents[i] = t
        return [jac._flat_tangent(be, primal, tangent) for primal, tangent in be.jvp(fn, args, checked, tangents)]

    rows: list | None = None
    for flat in range(be.numel(x)):
        e = be.one_hot(x, flat)
        outs = tangent_outputs(e)
        if be.is_complex(x):
            outs = [a + b * 1j for a, b in zip(outs, tangent_outputs(e * 1j))]
        if rows is None:
            rows = [[] for _ in outs]
        for r, o in zip(rows, outs):
            r.append(o)
    if rows is None:  # an empty input
        primals = [p for p, _ in be.jvp(fn, args, checked, zero)]
        return [be.zeros((0, be.numel(p)), like=p) for p in primals]
    return [be.xp(r[0]).stack(r, axis=0) for r in rows]


def _as_result(be, matrices, as_numpy):
    return tuple(tuple(None if m is None else (be.to_numpy(m) if as_numpy else m) for m in row)
                 for row in matrices)


def numerical_jacobian(fn: Callable, inputs, *, backend=None, eps: float = 1e-6, stencil: str = "central",
                       as_numpy: bool = False, **backend_options) -> tuple:
    """Finite-difference Jacobians of ``fn`` at ``inputs``.

    Each checked input (torch: ``requires_grad``; JAX: inexact arrays or ``wrt=``) is moved
    one element at a time, in place where the framework allows it, and restored bitwise.

    Parameters
    ----------
    fn : callable
        Returns an array or a tuple/list of arrays.
    inputs : array or tuple
        The point at which to differentiate.
    backend : str, optional
        ``"torch"``, ``"jax"``, ``"numpy"``; inferred from ``inputs`` when omitted.
    eps : float
        The step; ``"auto"`` is not accepted here.
    stencil : {"central", "five-point"}
        The finite-difference formula.
    as_numpy : bool
        Return NumPy arrays instead of the backend's arrays.
    **backend_options
        Passed to the backend (e.g. ``wrt=`` for JAX).

    Returns
    -------
    tuple of tuple
        ``result[i][k]``: the ``(input.numel, output.numel)`` Jacobian of output ``k``
        with respect to checked input ``i``; ``None`` for an output that is not a
        floating-point or complex array. For a complex input, row ``i`` is
        ``d/dx + i d/dy`` of element ``i`` (torch's convention).

    Raises
    ------
    ValueError
        ``eps`` not a positive finite number, no checked input, or a complex output.
    """
    import math

    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not math.isfinite(eps) or eps <= 0:
        raise ValueError(f"eps must be a positive finite number, got {eps!r}")
    rule = get_stencil(stencil)
    be, fn, args, checked = _checked_problem(fn, inputs, backend, backend_options)
    with be.preserve_state(args):
        outputs = be.as_tuple(fn(*args))
        _complex_outputs_refused(be, outputs)
        moved = tuple(be.densify(a) if be.is_array(a) else a for a in args)
        result = []
        for pos in checked:
            by_output = jac.numerical_jacobians(be, fn, moved, pos, outputs, float(eps), rule)
            result.append([by_output.get(k) for k in range(len(outputs))])
    return _as_result(be, result, as_numpy)


def analytical_jacobian(fn: Callable, inputs, *, backend=None, mode: str = "reverse", as_numpy: bool = False,
                        **backend_options) -> tuple:
    """Jacobians of ``fn`` at ``inputs`` from its derivatives (backward or forward mode).

    One VJP per output element, or one JVP per input element; undefined gradients count as zero.

    Parameters
    ----------
    fn : callable
        Returns an array or a tuple/list of arrays.
    inputs : array or tuple
        The point at which to differentiate.
    backend : str, optional
        ``"torch"``, ``"jax"``, ``"numpy"`` (with ``vjp=`` / ``jvp=``); inferred from
        ``inputs`` when omitted.
    mode : {"reverse", "forward"}
        Which derivatives to use.
    as_numpy : bool
        Return NumPy arrays instead of the backend's arrays.
    **backend_options
        Passed to the backend.

    Returns
    -------
    tuple of tuple
        ``result[i][k]``, laid out as :func:`numerical_jacobian`'s, so the two compare
        entry by entry.

    Raises
    ------
    ValueError
        An unknown ``mode``, no checked input, or a complex output.
    """
    if mode not in ("reverse", "forward"):
        raise ValueError(f"mode must be 'reverse' or 'forward', got {mode!r}")
    be, fn, args, checked = _checked_problem(fn, inputs, backend, backend_options)
    with be.preserve_state(args):
        inputs_checked = [args[p] for p in checked]
        if mode == "forward":
            outputs = be.as_tuple(fn(*args))
            _complex_outputs_refused(be, outputs)
            floats = [k for k, o in enumerate(outputs) if be.is_array(o) and be.is_floating_or_complex(o)]
            result = []
            for i in range(len(checked)):
                row = [None] * len(outputs)
                for k, m in zip(floats, _forward_rows(be, fn, args, checked, i)):
                    row[k] = m
                result.append(row)
            return _as_result(be, result, as_numpy)
        trace = be.trace(fn, args, checked)
        _complex_outputs_refused(be, trace.outputs)
        result = [[None] * len(trace.outputs) for _ in checked]
        for k, out in enumerate(trace.outputs):
            if not (be.is_array(out) and be.is_floating_or_complex(out)):
                continue
            for i, m in enumerate(jac.analytical_jacobians_reverse(be, trace, k, inputs_checked, checks=False)):
                result[i][k] = m
    return _as_result(be, result, as_numpy)
