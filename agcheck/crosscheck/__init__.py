"""``agcheck.crosscheck``: the same function (or hand-written ports of it) across frameworks.

:func:`crosscheck` evaluates the function on each backend (inputs given once, as NumPy
arrays) and compares against the first backend its values, reverse-mode derivatives (in
torch's complex convention), forward-mode derivatives and, with ``order=2``, second
derivatives: full Jacobians, or VJPs/JVPs of random probes in fast mode. Everything goes
through the generic :class:`~agcheck.backend.Backend` interface, so importing this package
imports neither torch nor jax. Modules: ``arguments`` (validation, tolerances, backends),
``sides`` (one backend's quantities), ``compare`` (two sides compared), ``kinks`` (one-sided
slopes at a disagreeing entry), ``nearby`` (values at nearby inputs), ``gradchecks``
(``gradcheck=True``) and ``result`` (:class:`CrosscheckResult` and the failure messages).
"""
from __future__ import annotations

from typing import Mapping, Sequence

from agcheck.crosscheck.arguments import (
    DEFAULT_TOLERANCES,
    as_inputs,
    checked_positions,
    function_name,
    needs_double,
    ports_of,
    require_two,
    resolve_backends,
    tolerances,
    validate_order,
)
from agcheck.crosscheck.compare import fill_table
from agcheck.crosscheck.gradchecks import run_gradchecks
from agcheck.crosscheck.nearby import compare_nearby
from agcheck.crosscheck.result import QUANTITIES, BackendGradcheck, CrosscheckResult, Difference, raise_failure
from agcheck.crosscheck.sides import (
    BackendPort,
    draw_probes,
    forward_derivatives,
    reverse_derivatives,
    second_derivatives,
    second_order_unsupported,
    value_arrays,
)

__all__ = ["crosscheck", "CrosscheckResult", "Difference", "BackendGradcheck", "DEFAULT_TOLERANCES"]


def crosscheck(
    fn,
    inputs,
    *,
    backends: Sequence | None = None,
    rtol: float | None = None,
    atol: float | None = None,
    fast_mode: bool = False,
    check_forward_ad: bool = True,
    check_backward_ad: bool = True,
    order: int = 1,
    raise_exception: bool = True,
    gradcheck: bool = False,
    wrt=None,
    backend_options: Mapping[str, Mapping] | None = None,
):
    """Check that ``fn`` computes the same values and derivatives on several backends.

    Parameters
    ----------
    fn : callable or mapping
        One function written against the array API (it receives each backend's arrays
        and may call ``array_api_compat.array_namespace`` on them), or a mapping
        ``{backend_name: callable}`` of hand-written ports.
    inputs : NumPy array or tuple
        The arguments, NumPy arrays converted for each backend (other values passed
        through); the floating point and complex arrays are differentiated (or those at ``wrt``).
    backends : sequence, optional
        Backend names (or configured :class:`~agcheck.backend.Backend` instances), the
        first the reference. Backends not installed are skipped (noted in the result).
        Default: the ports' backends when ``fn`` is a mapping, else ``("torch", "jax")``.
    rtol, atol : float, optional
        ``|other - reference| <= atol + rtol * |reference|``. Defaults by the inputs'
        precision: float64/complex128 ``rtol=1e-7, atol=1e-10``; float32/complex64
        ``rtol=1e-4, atol=1e-6``.
    fast_mode : bool
        Compare VJPs/JVPs of random cotangents/tangents (one per output / input) instead
        of full Jacobians.
    check_forward_ad, check_backward_ad : bool
        Compare forward-mode / reverse-mode derivatives.
    order : {1, 2}
        ``2`` also compares second derivatives (torch and JAX, through their own autodiff).
    raise_exception : bool
        Raise :class:`~agcheck.GradcheckError` on a disagreement; with ``False``, return
        the (falsy) result instead, its explanation in ``result.message``.
    gradcheck : bool
        Also run :func:`agcheck.gradcheck` (and with ``order=2`` :func:`agcheck.gradgradcheck`)
        on every backend, so that a disagreement says which side finite differences support.
    wrt : int or sequence of int, optional
        Positions of the inputs to differentiate (default: every floating/complex array).
    backend_options : mapping, optional
        Per backend name, the keywords of that backend (``{"numpy": {"vjp": ..., "jvp": ...}}``).

    Returns
    -------
    CrosscheckResult
        Truthy when the backends agree, falsy with ``raise_exception=False`` on a
        disagreement; ``print(result)`` shows the table of differences.

    Raises
    ------
    GradcheckError
        Two backends disagree (the message says on what, by how much and where), or a
        backend failed ``gradcheck``.
    BackendUnavailableError
        Fewer than two of the requested backends are installed.
    """
    validate_order(order)
    np_inputs = as_inputs(inputs)
    checked = checked_positions(np_inputs, wrt)
    rtol, atol = tolerances(np_inputs, checked, rtol, atol)
    if backends is None:
        backends = tuple(fn) if isinstance(fn, Mapping) else ("torch", "jax")
    resolved, skipped = resolve_backends(backends, dict(backend_options or {}), None if wrt is None else checked)
    ports = ports_of(fn, resolved, skipped)
    require_two(ports, resolved, skipped)
    double = needs_double(np_inputs)
    sides = [BackendPort(name, be, port, np_inputs, checked, double) for name, be, port in ports]
    result = CrosscheckResult([s.name for s in sides], skipped, rtol, atol, fast_mode, order, function_name(fn))

    computed = _compute(sides, result, np_inputs, checked, fast_mode, check_forward_ad, check_backward_ad, order)
    fill_table(result, computed, sides)
    compare_nearby(result, sides, np_inputs, checked)
    if gradcheck:
        result.gradcheck_results = run_gradchecks(sides, fast_mode, check_forward_ad, check_backward_ad, order)
    if result.ok or not raise_exception:
        return result
    raise_failure(result)


def _compute(sides, result, np_inputs, checked, fast_mode, check_forward_ad, check_backward_ad, order) -> dict:
    """``{quantity: {backend: {key: LabelledArray}}}``, also stored on ``result`` as NumPy
    arrays, with a note for what could not be computed."""
    computed: dict = {q: {} for q in QUANTITIES}
    for side in sides:  # values first: they fix the shapes of fast mode's probes
        with side.context():
            side.setup()
        computed["value"][side.name] = value_arrays(side)
        result.values[side.name] = tuple(side.output_numpy(o) for o in side.outputs)
    probes = draw_probes(sides[0], np_inputs, checked) if fast_mode else {}
    for side in sides:
        with side.context():
            _derivatives(side, computed, result.notes, fast_mode, probes, check_forward_ad, check_backward_ad, order)
    for q in ("reverse", "forward", "second"):
        for n, blocks in computed[q].items():
            getattr(result, q)[n] = {key: b.data for key, b in blocks.items()}
    return computed


def _derivatives(side, computed, notes, fast_mode, probes, check_forward_ad, check_backward_ad, order) -> None:
    """The derivatives ``side`` can compute, into ``computed``; a note for each it cannot."""
    if check_backward_ad:
        if side.can("reverse"):
            computed["reverse"][side.name] = reverse_derivatives(side, fast_mode, probes)
        else:
            notes.append(f"{side.name}: reverse-mode derivatives not compared (no vjp given)")
    if check_forward_ad:
        if side.can("forward"):
            computed["forward"][side.name] = forward_derivatives(side, fast_mode, probes)
        else:
            notes.append(f"{side.name}: forward-mode derivatives not compared (no jvp given)")
    if order == 2:
        reason = second_order_unsupported(side)
        if reason is None:
            computed["second"][side.name] = second_derivatives(side, fast_mode, probes)
        else:
            notes.append(f"{side.name}: second derivatives not compared ({reason})")
