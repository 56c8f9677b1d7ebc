"""Slow-mode comparisons too large to hold whole, decided and reported in chunks.

torch holds every Jacobian of a piece as a dense matrix (3.2 GB apiece for 20,000 x 20,000
doubles). Beyond the memory budget, blocks are compared in torch's order, in chunks of
output elements (reverse mode) or input elements (forward mode). The first failing chunk
decides; its message keeps torch's first line and lists the chunk's worst entries instead
of the matrices.
"""
from __future__ import annotations

import numpy as np

from agcheck.core import jacobian as jac
from agcheck.core.report_filling import attach_jacobian_failure
from agcheck.errors import GradcheckError

__all__ = ["too_large", "compare_in_chunks", "row_chunks", "WORST_ENTRIES"]

#: how many of a failing chunk's worst entries the message lists
WORST_ENTRIES = 10
#: the share of the memory budget one chunk's two sides (and the rows they are cut from) take
CHUNK_SHARE = 8


def too_large(run, piece, inputs=None) -> bool:
    """Whether the piece's dense Jacobians, both sides, exceed the budget (``inputs``: indices
    into ``piece.checked``, by default all)."""
    be = run.be
    positions = range(len(piece.checked)) if inputs is None else inputs
    n_in = sum(be.numel(piece.inputs[j]) for j in positions)
    outputs = [piece.outputs[k] for k in (piece.floats if piece.forward else piece.diff)]
    n_out = sum(be.numel(o) for o in outputs)
    itemsize = max([be.itemsize(o) for o in outputs] + [be.itemsize(piece.inputs[j]) for j in positions])
    return 2 * n_in * n_out * itemsize > run.memory_budget


def row_chunks(run, n_rows: int, row_bytes: int):
    """Ranges of rows covering ``n_rows``, each ``row_bytes`` wide, sized to a share of the budget."""
    per = max(1, run.memory_budget // (CHUNK_SHARE * max(1, row_bytes)))
    return [range(s, min(n_rows, s + per)) for s in range(0, n_rows, per)]


def compare_in_chunks(run, piece) -> None:
    """The slow-mode comparison of ``piece`` (dense inputs), chunk by chunk."""
    be, opts = run.be, run.opts
    moved = run.numerical_args(piece.args)
    run.progress.start(sum(be.numel(x) for x in piece.inputs), "Jacobians in chunks (too large to hold whole)")
    if piece.forward:
        for j, p in enumerate(piece.checked):
            _forward_block(run, piece, moved, j, p)
        return
    for i, k in enumerate(piece.diff):
        for j, p in enumerate(piece.checked):
            n, m = be.numel(piece.inputs[j]), be.numel(piece.outputs[k])
            for cols in row_chunks(run, m, 16 * max(1, n)):
                analytical = be.to_numpy(jac.analytical_jacobians_reverse(
                    be, piece.trace, k, piece.inputs, nondet_tol=opts.nondet_tol,
                    check_grad_dtypes=opts.check_grad_dtypes, columns=list(cols))[j])
                numerical = _numerical_columns(run, piece, moved, p, k, cols)
                _raise_if_apart(run, piece, analytical, numerical, i, j, k, (0, cols.start))


def _numerical_columns(run, piece, moved, p, k, cols) -> np.ndarray:
    """Columns ``cols`` of output ``k``'s numerical Jacobian w.r.t. input ``p``, rows in chunks."""
    be = run.be
    n, m = be.numel(piece.args[p]), be.numel(piece.outputs[k])
    eps = run.eps_for(piece.args[p])
    parts = []
    for rows in row_chunks(run, n, 16 * max(1, m)):
        block = jac.numerical_jacobians(be, piece.fn, moved, p, piece.outputs, eps, run.stencil, elements=rows)[k]
        parts.append(np.array(be.to_numpy(block)[:, cols.start:cols.stop]))
        del block
    return np.concatenate(parts, axis=0) if parts else np.zeros((0, len(cols)))


def _forward_block(run, piece, moved, j, p) -> None:
    """Forward mode: rows on both sides (one JVP, one element's moves each), in chunks."""
    be, opts = run.be, run.opts
    x = piece.args[p]
    m = sum(be.numel(piece.outputs[k]) for k in piece.floats)
    for rows in row_chunks(run, be.numel(x), 16 * max(1, m)):
        analytical = jac.analytical_rows_forward(be, piece.fn, piece.args, piece.checked, j, rows,
                                                 check_grad_dtypes=opts.check_grad_dtypes) or []
        numerical = jac.numerical_jacobians(be, piece.fn, moved, p, piece.outputs, run.eps_for(x), run.stencil,
                                            elements=rows)
        for i, k in enumerate(piece.floats):
            _raise_if_apart(run, piece, be.to_numpy(analytical[i]), be.to_numpy(numerical[k]), i, j, k,
                            (rows.start, 0))


def _raise_if_apart(run, piece, analytical, numerical, i, j, k, offset) -> None:
    """Raise torch's mismatch error for block (``i``, ``j``) where the chunk at ``offset`` differs."""
    opts = run.opts
    analytical, numerical = np.asarray(analytical), np.asarray(numerical)
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.abs(analytical - numerical)
        outside = ~(diff <= opts.atol + opts.rtol * np.abs(numerical))
    if not outside.any():
        return
    be = run.be
    x, out = piece.inputs[j], piece.outputs[k]
    shape_in, shape_out = tuple(int(s) for s in x.shape), tuple(int(s) for s in out.shape)
    n, m = be.numel(x), be.numel(out)
    prefix = ""
    if piece.complex_indices and (j if piece.forward else i) in piece.complex_indices:
        part = "imaginary" if piece.test_imag else "real"
        prefix = f"While considering the {part} part of complex {'inputs' if piece.forward else 'outputs'} only, "
    how = "computed with forward mode " if piece.forward else ""
    r0, c0 = offset
    rows, cols = analytical.shape
    lines = [
        f"{prefix}Jacobian {how}mismatch for output {i:d} with respect to input {j:d},",
        f"numerical and analytical: {n:,} x {m:,} entries (input elements x output elements), more than "
        f"memory_budget ({run.memory_budget:,} bytes) holds whole: compared in chunks, not printed.",
        f"The first failing chunk, input elements {r0:,} to {r0 + rows - 1:,} x output elements {c0:,} to "
        f"{c0 + cols - 1:,}: {int(outside.sum()):,} of {outside.size:,} entries outside |analytical - numerical| "
        f"<= atol + rtol * |numerical| (atol={opts.atol}, rtol={opts.rtol}).",
    ]
    reported = opts.raise_exception and offset == (0, 0)  # the chunk sits where the whole block would
    if opts.raise_exception and not reported:
        lines.append(_worst_entries(analytical, numerical, diff, outside, offset, shape_in, shape_out))
    error = GradcheckError("\n".join(lines) + "\n", check="jacobian_forward" if piece.forward else "jacobian",
                           details={"output": i, "input": j, "imaginary_part": bool(piece.test_imag),
                                    "chunk": {"rows": [r0, r0 + rows], "columns": [c0, c0 + cols]}})
    if reported:
        like = x if be.is_complex(x) else out
        attach_jacobian_failure(error, run, be.array_like(analytical, like), be.array_like(numerical, like),
                                output=i, input=j, complex_indices=piece.complex_indices, test_imag=piece.test_imag,
                                forward=piece.forward, where=(piece.fn, piece.args, piece.checked[j], piece.outputs, k))
    raise error


def _worst_entries(analytical, numerical, diff, outside, offset, shape_in, shape_out) -> str:
    """The chunk's worst entries as a table, at their multi-indices in the whole block."""
    r0, c0 = offset
    cols = analytical.shape[1]
    table = [("input", "output", "numerical", "analytical", "|diff|")]
    ranked = np.where(outside, np.nan_to_num(diff, nan=np.inf), -1.0).ravel()
    for flat in np.argsort(ranked)[::-1][:WORST_ENTRIES]:
        if ranked[flat] < 0:
            break
        r, c = divmod(int(flat), cols)
        at_in = tuple(int(v) for v in np.unravel_index(r0 + r, shape_in)) if shape_in else ()
        at_out = tuple(int(v) for v in np.unravel_index(c0 + c, shape_out)) if shape_out else ()
        table.append((str(at_in), str(at_out), f"{numerical[r, c]:.6g}", f"{analytical[r, c]:.6g}", f"{diff[r, c]:.6g}"))
    widths = [max(len(row[c]) for row in table) for c in range(5)]
    rows = ["  " + "  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip() for row in table]
    return "Its worst entries:\n" + "\n".join(rows)
