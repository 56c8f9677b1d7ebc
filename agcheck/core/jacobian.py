"""Numerical and analytical Jacobians, and their random projections (fast mode).

Laid out as torch lays them out: one ``(input.numel, output.numel)`` matrix per (input,
output) pair, row ``k`` the derivative of the flattened output along input element ``k``.
"""
from __future__ import annotations

from typing import Callable, Sequence

from agcheck.errors import CheckInputError
from agcheck.errors import GradcheckError
from agcheck.report.messages import not_reentrant_message
from agcheck.core.row_block import RowBlock
from agcheck.stencil import STENCILS

__all__ = ["stencil_difference", "numerical_jacobians", "numerical_rows", "numerical_rows_at", "outputs_at_input",
           "numerical_directional", "analytical_jacobians_reverse", "analytical_vjps", "analytical_jacobians_forward",
           "analytical_jvps", "random_vectors", "project_reverse", "GradientShape"]

#: torch.Generator's default seed: fast mode draws the same vectors as torch on the CPU.
PROBE_SEED = 67280421310721


def _check_same_shape_and_dtype(before, after, eps, index=None) -> None:
    if before.shape == after.shape and before.dtype == after.dtype:
        return
    where = f"on index {_called(index)} " if index is not None else ""
    for what, a, b in (("shape", tuple(before.shape), tuple(after.shape)), ("dtype", before.dtype, after.dtype)):
        if a != b:
            raise AssertionError(f"Expected `func` to return outputs with the same {what} when inputs are perturbed "
                                 f"{where}by {eps}, but got: {what}s {a} and {b}.")


def _called(index):
    """``index``, or what it returns where it is a callable."""
    return index() if callable(index) else index


def stencil_difference(be, values: list, eps: float, stencil=STENCILS["central"], index=None, held=(),
                       expected=None) -> list:
    """The stencil's flat derivative estimate of every array output (None otherwise).

    ``values[i]`` are fn's outputs at ``x + stencil.offsets[i] * eps``. Outputs ``held`` are
    checked but left to the caller to combine (None); each output must keep its size in
    ``expected`` (:func:`_traced_sizes`). ``index`` may be a callable, called only for a message.
    """
    result = []
    for k, outs in enumerate(zip(*values)):
        if not be.is_array(outs[0]):
            result.append(None)
            continue
        for other in outs[1:]:
            _check_same_shape_and_dtype(outs[0], other, eps, index)
        if expected is not None and k < len(expected) and expected[k] is not None and \
                be.numel(outs[0]) != expected[k][0]:  # a row of another length (torch: an expand error)
            where = f"element {_called(index)} of the input" if index is not None else "the input"
            raise CheckInputError(
                f"fn's output {k} has shape {tuple(outs[0].shape)} with {where} moved by {eps}, but had shape "
                f"{expected[k][1]} at the check's first call: a checked function's outputs must keep "
                "their shapes from call to call"
            )
        if k in held:
            result.append(None)
            continue
        if be.is_bool(outs[0]):
            outs = [be.as_int(o) for o in outs]
        combined = be.combine(stencil, outs, eps)
        result.append(be.xp(combined).reshape(combined, (-1,)))
    return result


def _moves(stencil, step) -> list:
    """``(step, sign)`` of every point of the stencil, in evaluation order."""
    return [(abs(m) * step if abs(m) != 1 else step, 1 if m > 0 else -1) for m in stencil.offsets]


def _element_moves(stencil, eps, complex_input) -> list:
    """Each element's moves: along the real axis, then (complex input) the imaginary one."""
    return [_moves(stencil, step) for step in ((eps, eps * 1j) if complex_input else (eps,))]


def _traced_sizes(be, outputs) -> list:
    """``(size, shape)`` of each array among ``outputs`` (None for the others)."""
    return [(be.numel(o), tuple(o.shape)) if be.is_array(o) else None for o in outputs]


def _columns_for_element(be, perturber, fn, flat, eps, moves_per_axis, stencil, expected=None):
    return _along_axes(be, [stencil_difference(be, perturber.evaluate_element_moves(fn, flat, moves), eps, stencil,
                                               lambda: perturber.index(flat), expected=expected)
                            for moves in moves_per_axis])


def _along_axes(be, differences: list) -> list:
    """One element's derivative estimates from those along its real and (complex input) imaginary axis."""
    if len(differences) == 1:
        return differences[0]
    d_real, d_imag = differences
    # conjugate Wirtinger derivative of a real-valued function: d/dx + i d/dy
    return [None if r is None else be.plus_imaginary(r, i) for r, i in zip(d_real, d_imag)]


def numerical_rows(be, fn: Callable, args: tuple, position: int, output_position: int, elements, eps: float,
                   stencil) -> list:
    """Rows ``elements`` of output ``output_position``'s numerical Jacobian w.r.t. ``args[position]``,
    computed as the check computes them: one array per element."""
    return numerical_rows_at(be, fn, args, position, output_position, elements, [(eps, stencil)])[0]


#: the key of fn's outputs at the unmoved input among the points numerical_rows_at keeps
UNMOVED = (None, (0.0, -1))


def outputs_at_input(be, fn: Callable, args: tuple, position: int, evaluated: dict | None = None) -> tuple:
    """fn's outputs at the unmoved input, evaluated as ``x - 0`` (bit for bit ``x``) as
    :func:`numerical_rows_at` does; taken from, or kept in, ``evaluated``."""
    if evaluated is not None and UNMOVED in evaluated:
        return evaluated[UNMOVED]
    with be.perturber(args, position) as perturber:
        outs = perturber.evaluate_element_moves(fn, 0, [UNMOVED[1]])[0]
    if evaluated is not None:
        evaluated[UNMOVED] = outs
    return outs


def numerical_rows_at(be, fn: Callable, args: tuple, position: int, output_position: int, elements,
                      steps: Sequence, evaluated: dict | None = None) -> list:
    """:func:`numerical_rows` for each ``(eps, stencil)`` of ``steps``, one list of rows per step.

    A point several steps share is evaluated once per element, ``x`` itself once in all.
    ``evaluated``, where given, keeps fn's outputs at every point for later calls on the
    same ``fn``, ``args`` and ``position``.
    """
    if not steps:
        return []
    complex_input = be.is_complex(args[position])
    plans = [_element_moves(stencil, eps, complex_input) for eps, stencil in steps]
    distinct = [list(dict.fromkeys(move for plan in plans for move in plan[axis])) for axis in range(len(plans[0]))]
    points = {} if evaluated is None else evaluated  # (element, move) -> fn's outputs; x itself is element None
    found = [[] for _ in plans]
    with be.perturber(args, position) as perturber:
        for flat in elements:
            flat = int(flat)

            def index():
                return perturber.index(flat)

            at = []
            for moves in distinct:
                keys = [UNMOVED if move[0] == 0 else (flat, move) for move in moves]
                missing = [(key, move) for key, move in zip(keys, moves) if key not in points]
                missing = list(dict(missing).items())  # x once, where both axes ask for it
                if missing:  # x - 0 is x, bit for bit
                    values = perturber.evaluate_element_moves(fn, flat, [move for _, move in missing])
                    points.update(zip([key for key, _ in missing], values))
                at.append({move: points[key] for key, move in zip(keys, moves)})
            if evaluated is None:  # only x is kept from one element to the next
                for key in [key for key in points if key[0] is not None]:
                    del points[key]
            # every output is checked, as the check checks them; only this block's is combined
            others = set(range(len(at[0][distinct[0][0]]))) - {output_position}
            for rows, plan, (eps, stencil) in zip(found, plans, steps):
                differences = [stencil_difference(be, [at[axis][move] for move in moves], eps, stencil, index, others)
                               for axis, moves in enumerate(plan)]
                rows.append(_along_axes(be, differences)[output_position])
    return found


def numerical_jacobians(be, fn: Callable, args: tuple, position: int, outputs: tuple, eps: float,
                        stencil=STENCILS["central"], elements=None, on_element=None) -> dict:
    """``{output position: (input.numel, output.numel) matrix}`` of finite differences, for
    every floating/complex output w.r.t. ``args[position]`` (only rows ``elements`` if given).

    The input is moved in place (closures that read it see the move) and restored. A sparse
    input is moved one stored element at a time (``elements`` then counts stored elements);
    without ``elements``, rows land at their dense elements, the others zero.
    """
    x = args[position]
    moves = _element_moves(stencil, eps, be.is_complex(x))
    float_positions = [k for k, o in enumerate(outputs) if be.is_array(o) and be.is_floating_or_complex(o)]
    if be.numel(x) == 0:  # no element to move, in any layout: no rows, and no call of fn
        return {k: RowBlock(be, 0, be.numel(outputs[k]), outputs[k], _row_dtype(be, x, outputs[k])).result()
                for k in float_positions}
    with be.perturber(args, position) as perturber:
        flats = range(perturber.numel) if elements is None else elements
        if not hasattr(flats, "__len__"):
            flats = list(flats)
        rows = {k: RowBlock(be, len(flats), be.numel(outputs[k]), outputs[k], _row_dtype(be, x, outputs[k]))
                for k in float_positions}
        expected = _traced_sizes(be, outputs)
        for flat in flats:
            cols = _columns_for_element(be, perturber, fn, flat, eps, moves, stencil, expected)
            for k in float_positions:
                rows[k].add(cols[k])
            if on_element is not None:
                on_element()
        placement = getattr(perturber, "dense_rows", lambda: None)() if elements is None else None
    if placement is None:
        return {k: rows[k].result() for k in float_positions}
    return {k: _placed_rows(be, list(rows[k].result()), placement, be.numel(outputs[k]), outputs[k],
                            _row_dtype(be, x, outputs[k]))
            for k in float_positions}


def _row_dtype(be, x, out):
    return x.dtype if be.is_complex(x) else out.dtype


def _placed_rows(be, rows: list, placement, n_cols: int, like, dtype):
    """Stored elements' rows put at their dense rows, the others zero; of two stored elements
    at one dense element (uncoalesced COO), the later wins, as in torch."""
    n_rows, where = placement
    if not rows:
        return be.zeros((n_rows, n_cols), like=like, dtype=dtype)
    xp = be.xp(rows[0])
    zero = xp.zeros_like(rows[0])
    full = [zero] * n_rows
    for row, r in zip(rows, where):
        full[r] = row
    return _cast(be, xp.stack(full, axis=0), dtype)


def numerical_directional(be, fn: Callable, args: tuple, position: int, u, eps: float,
                          stencil=STENCILS["central"]) -> list:
    """Finite-difference ``J u`` for every array output; for a complex input ``u`` is
    ``(u_re, u_im)`` and the result ``J_x u_re + i J_y u_im``."""
    x = args[position]
    with be.perturber(args, position) as perturber:
        def along(step):
            values = []
            for s, sign in _moves(stencil, step):  # a loop: no frame between this one and fn's calls
                values.append(perturber.evaluate_direction(fn, s, sign))
            return stencil_difference(be, values, eps, stencil)

        def shaped(v):  # the probe as the perturber moves the input (a sparse input: its stored values)
            own = getattr(perturber, "direction", None)
            moved = own(v) if own is not None else None
            return be.xp(v).reshape(v, tuple(x.shape)) if moved is None else moved

        if isinstance(u, tuple):  # the imaginary axis moved by d * 1j, as torch computes it
            d = shaped(u[1]) * eps
            return _along_axes(be, [along(shaped(u[0]) * eps), along(be.xp(d).multiply(d, 1j))])
        return along(shaped(u) * eps)


class GradientShape:
    """What went wrong with the gradients' shapes or dtypes while stacking them."""

    def __init__(self):
        self.sizes_ok = True
        self.dtypes_ok = True


def _stack_gradients(be, grads_per_cotangent, n_cots: int, inputs: Sequence, shape_report: GradientShape) -> list:
    """VJPs (an iterable, consumed as it comes) laid out as ``(inputs[i].numel, n_cotangents)`` Jacobians."""
    # filled a cotangent's row at a time, then viewed transposed: far cheaper than strided columns
    sizes = [be.numel(x) for x in inputs]
    blocks = [RowBlock(be, n_cots, n, x, x.dtype) for x, n in zip(inputs, sizes)]
    for grads in grads_per_cotangent:
        for i, (x, g) in enumerate(zip(inputs, grads)):
            if g is None:
                blocks[i].add(be.zeros((sizes[i],), like=x))
                continue
            if g.shape != x.shape and tuple(g.shape) != tuple(x.shape):
                shape_report.sizes_ok = False
            elif g.dtype != x.dtype:
                shape_report.dtypes_ok = False
            dense = be.to_dense(g)
            flat = be.xp(dense).reshape(dense, (-1,))
            if be.numel(flat) != sizes[i]:
                raise AssertionError(f"a gradient has {be.numel(flat)} elements but its input has {sizes[i]}")
            blocks[i].add(_cast(be, flat, x.dtype))
    return [be.xp(m).permute_dims(m, (1, 0)) for m in (block.result() for block in blocks)]


def _checked_gradients(be, compute: Callable, n_cots: int, inputs, nondet_tol, check_grad_dtypes):
    """The stacked VJPs of ``compute()``, computed twice: shapes, dtypes and reentrancy checked."""
    report = GradientShape()
    first = _stack_gradients(be, compute(), n_cots, inputs, report)
    second = _stack_gradients(be, compute(), n_cots, inputs, GradientShape())
    # torch swaps its two flags here: a size problem reports as a dtype mismatch (and only
    # with check_grad_dtypes), a dtype problem as an incorrect size. Kept for parity.
    if not report.sizes_ok and check_grad_dtypes:
        raise GradcheckError("Gradient has dtype mismatch", check="grad_dtype")
    if not report.dtypes_ok:
        raise GradcheckError("Analytical gradient has incorrect size", check="grad_size")
    for i, (a, b) in enumerate(zip(first, second)):
        if be.numel(a) == 0:
            continue
        diff = be.max_abs_difference(a, b)
        if diff > nondet_tol:
            raise GradcheckError(
                not_reentrant_message(nondet_tol, float(diff)),
                check="reentrant",
                details={"max_run_to_run_difference": float(diff), "nondet_tol": nondet_tol, "input": i,
                         "gradient_scale": float(be.xp(a).max(be.xp(a).abs(a))), "dtype": be.dtype_name(a)},
            )
    return first


def analytical_jacobians_reverse(be, trace, output_position: int, inputs: Sequence, *, nondet_tol=0.0,
                                 check_grad_dtypes=False, checks=True, columns=None) -> list:
    """One ``(input.numel, output.numel)`` reverse-mode Jacobian per input, one VJP per output
    element (only ``columns`` if given); run twice for reentrancy where ``checks``."""
    out = trace.outputs[output_position]
    columns = range(be.numel(out)) if columns is None else columns
    n = len(columns)

    def rows():
        return trace.unit_vjps(output_position, columns, be.one_hot)

    if not checks:
        return _stack_gradients(be, rows(), n, inputs, GradientShape())
    return _checked_gradients(be, rows, n, inputs, nondet_tol, check_grad_dtypes)


def analytical_vjps(be, trace, output_position: int, v, inputs: Sequence, *, nondet_tol, check_grad_dtypes) -> list:
    """``v^T J`` for one output and every input, flat (checked like the full Jacobian)."""
    out = trace.outputs[output_position]
    cot = be.xp(v).reshape(v, tuple(out.shape))
    stacked = _checked_gradients(be, lambda: [trace.vjp([output_position], [cot])], 1, inputs,
                                 nondet_tol, check_grad_dtypes)
    return [be.xp(j).reshape(j, (-1,)) for j in stacked]


def project_reverse(be, vJ, u):
    """``(v^T J) u`` for a real input, and the real/imaginary split for a complex one."""
    if isinstance(u, tuple):
        return be.plus_imaginary(be.dot(be.real(vJ), u[0]), be.dot(be.imag(vJ), u[1]))
    return be.dot(vJ, u)


def _check_forward_dtypes(be, results) -> None:
    for primal, tangent in results:
        if tangent is not None and be.is_complex(primal) != be.is_complex(tangent):
            raise GradcheckError("Forward AD gradient has dtype mismatch.", check="grad_dtype")


def _flat_tangent(be, primal, tangent):
    if tangent is None:
        return be.zeros((be.numel(primal),), like=primal)
    return _cast(be, be.xp(tangent).reshape(tangent, (-1,)), primal.dtype)


def _cast(be, a, dtype):
    """``a`` in ``dtype`` (``a`` itself where it already is)."""
    return a if a.dtype == dtype else be.xp(a).astype(a, dtype)


def analytical_jacobians_forward(be, fn, args, checked: Sequence[int], *, check_grad_dtypes=False,
                                 reuse: dict | None = None, outputs: tuple | None = None) -> list:
    """Forward-mode ``[input][float output]`` Jacobians, one JVP per input element.

    ``reuse`` holds whole Jacobians of some inputs, taken as they are; ``outputs`` shape an
    empty input's Jacobians without a call of fn, as torch makes none.
    """
    wanted = [(i, range(be.numel(args[pos]))) for i, pos in enumerate(checked) if not (reuse and i in reuse)]
    computed = _forward_rows(be, fn, args, checked, wanted, check_grad_dtypes)
    jacobians = []
    for i in range(len(checked)):
        if reuse and i in reuse:
            jacobians.append(reuse[i])
            continue
        rows = computed.get(i)
        if rows is None:  # an empty input: no JVP, only the outputs' shapes
            if outputs is None:
                zero_tangents = [be.xp(args[p]).zeros_like(args[p]) for p in checked]
                outputs = tuple(p for p, _ in be.jvp(fn, args, checked, zero_tangents))
            rows = [RowBlock(be, 0, be.numel(o), o, o.dtype).result() for o in outputs if be.is_floating_or_complex(o)]
        jacobians.append(rows)
    return jacobians


def analytical_rows_forward(be, fn, args, checked: Sequence[int], i: int, elements, *,
                            check_grad_dtypes=False) -> list | None:
    """Rows ``elements`` of input ``checked[i]``'s forward-mode Jacobians, one matrix per
    floating output, as :func:`analytical_jacobians_forward` computes them; ``None`` for none."""
    return _forward_rows(be, fn, args, checked, [(i, elements)], check_grad_dtypes).get(i)


def _forward_rows(be, fn, args, checked, wanted, check_grad_dtypes) -> dict:
    """``{i: rows}`` for each ``(i, elements)`` of ``wanted`` with elements, through one ``jvp_elements``."""
    wanted = [(i, elements) for i, elements in ((i, list(elements)) for i, elements in wanted) if elements]
    blocks = {i: [] for i, _ in wanted}
    sizes = {i: len(elements) for i, elements in wanted}

    def receive(i, results):
        if check_grad_dtypes:
            _check_forward_dtypes(be, results)
        rows = blocks[i]
        if not rows:
            rows.extend(RowBlock(be, sizes[i], be.numel(p), p, p.dtype) for p, _ in results)
        for block, (primal, tangent) in zip(rows, results):
            block.add(_flat_tangent(be, primal, tangent))

    if wanted:
        be.jvp_elements(fn, args, checked, wanted, receive)
    return {i: [block.result() for block in rows] for i, rows in blocks.items()}


def analytical_jvps(be, fn, args, checked: Sequence[int], all_u: Sequence, *, check_grad_dtypes=False) -> list:
    """Forward-mode ``J u``: ``[input][float output]`` flat vectors, one JVP per input."""
    tangents = [_cast(be, be.xp(u).reshape(u, tuple(args[p].shape)), args[p].dtype) for p, u in zip(checked, all_u)]
    result = []

    def receive(results):
        if check_grad_dtypes:
            _check_forward_dtypes(be, results)
        result.append([_flat_tangent(be, p, t) for p, t in results])

    be.jvp_each(fn, args, checked, tangents, receive)
    return result


def random_vectors(be, inputs: Sequence, outputs: Sequence | None):
    """Fast mode's probes ``(all_v, all_u)`` from a private generator: one flat unit vector
    per output (``None`` without outputs) and one per input (a pair for a complex input)."""
    gen = be.generator(inputs[0] if inputs else None, PROBE_SEED)
    # a complex input's real part is drawn first, then its imaginary part
    all_u = [tuple(be.uniform_unit_vector(x, gen, real=True) for _ in range(2)) if be.is_complex(x)
             else be.uniform_unit_vector(x, gen, real=True) for x in inputs]
    all_v = None if outputs is None else [be.uniform_unit_vector(o, gen, real=False) for o in outputs]
    return all_v, all_u


def adjusted_atol(be, atol: float, u, v) -> float:
    """``atol`` carried over to ``v^T (A - B) u``: scaled by the real sums of ``u`` and ``v``."""
    def total(x) -> float:
        s = be.xp(x).sum(x)
        return float(be.real(s) if be.is_complex(s) else s)

    return atol * sum(total(p) for p in (u if isinstance(u, tuple) else (u,))) * (1.0 if v is None else total(v))
