"""Failure reports as a self-contained HTML page (jinja2 templates in ``templates/``) or a
PNG image of heatmaps (matplotlib); both optional dependencies, imported only when rendering.

Large blocks are max-abs pooled to at most :data:`MAX_SIDE` cells per side, so a single
wrong entry stays visible. Imports nothing of the report model, which uses this module.
"""
from __future__ import annotations

import base64
import functools
import io
import json
import math
import os
import textwrap

import numpy as np

from agcheck.report.values import abs_difference, fmt, index_text, unravel

__all__ = ["pool_max_abs", "write_html", "write_png", "render_html", "render_png", "report_fragment", "stylesheet",
           "report_view"]

#: heatmaps have at most this many cells per side
MAX_SIDE = 200
#: blocks up to this size per side get their values written in the cells
ANNOTATE_SIDE = 10
#: worst entries listed in the HTML
HTML_TOP_K = 20

MATPLOTLIB_MISSING = (
    "Saving an agcheck failure report as HTML or PNG draws heatmaps with matplotlib, which is "
    "not installed. Install it with: pip install matplotlib  (or: pip install 'agcheck[report]'). "
    "report.summary(), report.to_dict() and report.save('report.json') work without it."
)


def _matplotlib():
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as e:
        raise ImportError(MATPLOTLIB_MISSING) from e
    return Figure, FigureCanvasAgg


def pool_max_abs(m: np.ndarray, max_side: int = MAX_SIDE):
    """Downsample a matrix to at most ``max_side`` cells per side.

    Each cell of the result is the entry of largest magnitude (sign kept; NaN wins) of its
    tile. Returns ``(pooled, (tile_rows, tile_cols))``.
    """
    m = np.asarray(m)
    rows, cols = m.shape
    fr, fc = max(1, math.ceil(rows / max_side)), max(1, math.ceil(cols / max_side))
    if fr == 1 and fc == 1:
        return m, (1, 1)
    R, C = math.ceil(rows / fr), math.ceil(cols / fc)
    padded = np.zeros((R * fr, C * fc), dtype=m.dtype)
    padded[:rows, :cols] = m
    tiles = padded.reshape(R, fr, C, fc).transpose(0, 2, 1, 3).reshape(R, C, fr * fc)
    key = np.abs(tiles)
    key = np.where(np.isnan(key), np.inf, key)
    pick = key.argmax(axis=2)[..., None]
    return np.take_along_axis(tiles, pick, axis=2)[..., 0], (fr, fc)


def _panels(block):
    """(title, matrix, kind) for each heatmap of a block; kind is 'signed' or 'magnitude'."""
    N, A = block.numerical, block.analytical
    with np.errstate(invalid="ignore", over="ignore"):
        diff = abs_difference(A, N).astype(np.float64)
    if np.iscomplexobj(N) or np.iscomplexobj(A):
        with np.errstate(invalid="ignore"):
            outside = (~(diff <= block.atol + block.rtol * np.abs(N))).astype(np.float64)
        return [
            [("numerical, real part", np.real(N), "signed"), ("analytical, real part", np.real(A), "signed"),
             ("|analytical - numerical|", diff, "magnitude")],
            [("numerical, imaginary part", np.imag(N), "signed"),
             ("analytical, imaginary part", np.imag(A), "signed"),
             ("entries outside tolerance", outside, "mask")],
        ]
    return [[("numerical", N, "signed"), ("analytical", A, "signed"), ("|analytical - numerical|", diff, "magnitude")]]


def _draw_block(fig, axes_rows, block) -> None:
    """Draw the heatmaps of one block on ``axes_rows`` (one row of three axes per panel row)."""
    from matplotlib.ticker import MaxNLocator

    panel_rows = _panels(block)
    signed = [p[1] for row in panel_rows for p in row if p[2] == "signed"]
    pooled_signed = [pool_max_abs(m)[0] for m in signed]
    finite = [np.abs(p[np.isfinite(p)]) for p in pooled_signed]
    vmax = max([float(f.max()) for f in finite if f.size] + [0.0]) or 1.0
    for axes, row in zip(axes_rows, panel_rows):
        for ax, (title, m, kind) in zip(axes, row):
            pooled, (fr, fc) = pool_max_abs(m)
            r, c = pooled.shape
            # axes in the block's own element indices, also when pooled
            common = dict(aspect="auto", interpolation="nearest",
                          extent=(-0.5, c * fc - 0.5, r * fr - 0.5, -0.5))
            if kind == "signed":
                im = ax.imshow(pooled, cmap="RdBu_r", vmin=-vmax, vmax=vmax, **common)
            elif kind == "mask":
                im = ax.imshow(pooled, cmap="Greys", vmin=0, vmax=1, **common)
            else:
                im = ax.imshow(pooled, cmap="magma", vmin=0, **common)
            fig.colorbar(im, ax=ax, fraction=0.046, pad=0.03)
            pooled_note = f" (max-abs pooled {fr}x{fc} tiles)" if (fr, fc) != (1, 1) else ""
            ax.set_title(f"{title}{pooled_note}", fontsize=9)
            ax.set_xlabel("output element", fontsize=8)
            ax.set_ylabel("input element", fontsize=8)
            ax.tick_params(labelsize=7)
            for axis, shape, size in ((ax.xaxis, block.output_shape, block.shape[1]),
                                      (ax.yaxis, block.input_shape, block.shape[0])):
                multi = shape is not None and len(shape) > 1
                axis.set_major_locator(MaxNLocator(nbins=6 if multi else "auto", integer=True))
                axis.set_major_formatter(_index_formatter(shape, size))
            if block.output_shape is not None and len(block.output_shape) > 1:
                ax.tick_params(axis="x", labelrotation=30)
            if max(r, c) <= ANNOTATE_SIDE and (fr, fc) == (1, 1) and kind != "mask":
                top = vmax if kind == "signed" else (float(np.nanmax(pooled)) if pooled.size else 0.0) or 1.0
                for i in range(r):
                    for j in range(c):
                        v = pooled[i, j]
                        light = abs(v) > 0.6 * top if kind == "signed" else v < 0.6 * top
                        ax.text(j, i, f"{v + 0.0:.3g}", ha="center", va="center", fontsize=7,
                                color="white" if light else "black")
            for e in block.worst[:1]:
                _mark(ax, e, fr, fc, max(r, c))


def _index_formatter(shape, size: int):
    """Tick labels as the tables write indices: a multi-index for arrays of several dimensions."""
    from matplotlib.ticker import FuncFormatter

    def label(value, _position):
        flat = int(round(value))
        if abs(value - flat) > 1e-6 or not 0 <= flat < size:
            return ""
        return index_text(unravel(flat, shape)) if shape is not None and len(shape) > 1 else str(flat)

    return FuncFormatter(label)


def _mark(ax, entry, fr, fc, cells):
    from matplotlib.patches import Rectangle

    x0, y0 = (entry.col // fc) * fc - 0.5, (entry.row // fr) * fr - 0.5
    ax.add_patch(Rectangle((x0, y0), fc, fr, fill=False, edgecolor="lime", linewidth=1.5))
    if cells > 30:  # a single cell is hard to see: ring it too
        ax.plot([x0 + fc / 2], [y0 + fr / 2], marker="o", markersize=16, markerfacecolor="none",
                markeredgecolor="lime", markeredgewidth=1.5)


def _wrap(text: str, width: int = 150, lines: int = 3) -> str:
    wrapped = textwrap.wrap(text, width)
    if len(wrapped) > lines:
        wrapped = wrapped[:lines]
        wrapped[-1] += " ..."
    return "\n".join(wrapped)


def _count(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


def _figure(report, blocks, header: bool):
    Figure, FigureCanvasAgg = _matplotlib()
    blocks = [b for b in blocks if b.has_arrays and b.numerical.size and b.numerical.shape == b.analytical.shape]
    if not blocks:
        fig = Figure(figsize=(11, 6), dpi=100)
        FigureCanvasAgg(fig)
        fig.text(0.02, 0.98, report.summary(), va="top", ha="left", family="monospace", fontsize=8)
        return fig
    heights = [len(_panels(b)) for b in blocks]
    fig = Figure(figsize=(15, (1.0 if header else 0.0) + sum(h * 3.9 + 0.5 for h in heights)), dpi=100,
                 layout="constrained")
    FigureCanvasAgg(fig)
    if header:
        function = getattr(report.context, "function", None)
        title = (f"agcheck: check {report.check!r} failed" + (f" in {function}" if function else "")
                 + (f" (backend {report.backend})" if report.backend else ""))
        if report.diagnoses:
            d = report.diagnoses[0]
            title += "\n" + _wrap(f"[{d.kind}] {d.message}", 160, 2)
        fig.suptitle(title, x=0.01, ha="left", fontsize=11)
    subfigs = fig.subfigures(len(blocks), 1, height_ratios=heights, squeeze=False)[:, 0]
    for sub, b, k in zip(subfigs, blocks, heights):
        index = next((i for i, rb in enumerate(report.blocks) if rb is b), None)
        kinds = [d.kind for d in report.diagnoses if d.block == index] if len(report.blocks) > 1 else []
        sub.suptitle(f"{b.title}: block {b.shape[0]} x {b.shape[1]}, {_count(b.mismatches, 'entry', 'entries')} "
                     f"outside tolerance, max |diff| {b.max_abs_diff:.3g} (worst entry boxed in green)"
                     + (f"; diagnosis: {', '.join(kinds)}" if kinds else ""), x=0.01, ha="left", fontsize=10)
        axes = sub.subplots(k, 3, squeeze=False)
        _draw_block(sub, axes, b)
    return fig


def _png(report, blocks, header: bool) -> bytes:
    buf = io.BytesIO()
    _figure(report, blocks, header).savefig(buf, format="png")
    return buf.getvalue()


def render_png(report, blocks=None) -> bytes:
    """The report's heatmaps as PNG bytes (a text panel when it has no Jacobian blocks)."""
    return _png(report, report.blocks if blocks is None else blocks, header=True)


def write_png(report, path) -> None:
    data = render_png(report)
    with open(path, "wb") as f:
        f.write(data)


#: the templates of the HTML report and its stylesheet (package data)
TEMPLATES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "templates")

JINJA_MISSING = (
    "Saving an agcheck failure report as HTML fills templates with jinja2, which is not installed. "
    "Install it with: pip install jinja2  (or: pip install 'agcheck[report]'). "
    "report.summary(), report.to_dict() and report.save('report.json') work without it."
)


@functools.lru_cache(maxsize=1)
def _environment():
    try:
        import jinja2
    except ImportError as e:
        raise ImportError(JINJA_MISSING) from e
    return jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True,
                              undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)


def stylesheet() -> str:
    """The one stylesheet of agcheck's HTML pages (the failure report, the main job's page)."""
    with open(os.path.join(TEMPLATES, "agcheck.css"), encoding="utf-8") as f:
        return f.read()


def _script_json(data) -> str:
    """``data`` as JSON safe inside ``<script>``: ``<``, ``>``, ``&`` (only ever in strings)
    written as JSON escapes, so no ``</script>`` or ``<!--`` can end it."""
    text = json.dumps(data, allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _block_view(report, block) -> dict:
    facts = [
        ("block shape", f"{block.shape[0]} x {block.shape[1]} (input elements x output elements)"),
        ("input shape / dtype", f"{block.input_shape} / {block.input_dtype}"),
        ("output shape", f"{block.output_shape}"),
        ("entries outside tolerance", f"{block.mismatches} (atol={fmt(block.atol)}, rtol={fmt(block.rtol)})"),
    ]
    if block.max_abs_entry is not None:
        e = block.max_abs_entry
        facts.append(("max abs difference", f"{fmt(block.max_abs_diff)} at {e.where()} "
                                            f"(numerical {fmt(e.numerical)}, analytical {fmt(e.analytical)})"))
    if block.max_rel_entry is not None:
        facts.append(("max rel difference", f"{fmt(block.max_rel_diff)} at {block.max_rel_entry.where()}"))
    if block.projection:
        facts.append(("fast-mode projection", ", ".join(f"{k} {fmt(v) if not isinstance(v, dict) else v}"
                                                        for k, v in block.projection.items())))
    image = None
    if block.has_arrays and block.numerical.size:
        image = base64.b64encode(_png(report, [block], header=False)).decode("ascii")

    def outside(w):
        return "yes" if not (w.abs_diff <= block.atol + block.rtol * abs(w.numerical)) else "no"

    worst = [(index_text(w.input_index), index_text(w.output_index), fmt(w.numerical), fmt(w.analytical),
              fmt(w.abs_diff), outside(w)) for w in block.worst[:HTML_TOP_K]]
    return {"title": block.title, "facts": facts, "image": image, "worst": worst}


def _context_view(context) -> dict | None:
    if context is None:
        return None
    facts = [("call", context.call), ("function", context.function_text())]
    if context.test:
        facts.append(("test", context.test))
    facts += [("versions", ", ".join(f"{k} {v}" for k, v in context.versions.items())),
              ("random", context.random)]
    inputs = [(d["position"], index_text(d["shape"]), d["dtype"], "yes" if d.get("checked") else "no",
               d.get("layout", "-"), d.get("device", "-")) if d.get("kind") == "array" else
              (d["position"], "-", d.get("type", "-"), "no", "-", d.get("text", "-")) for d in context.inputs]
    return {"facts": facts, "inputs": inputs, "reproduce": context.reproduce}


def report_view(report) -> dict:
    """What the HTML templates show of ``report``: strings and tables (escaped by the
    templates), the heatmaps as base64 PNG, the data as script-safe JSON."""
    import markupsafe  # jinja2's own dependency

    function = report.context.function if report.context is not None else None
    message = report.message.splitlines()
    shown = "\n".join(message[:60]) + (f"\n... ({len(message) - 60} more lines)" if len(message) > 60 else "")
    return {
        "title": f"agcheck report: {report.check} failed" + (f" in {function}" if function else ""),
        "check": report.check, "backend": report.backend, "function": function,
        "test": report.context.test if report.context is not None else None, "headline": report.headline(),
        "diagnoses": [{"where": report.block_of(d), "kind": d.kind, "message": d.message, "lines": d.lines[:10]}
                      for d in report.diagnoses],
        "blocks": [_block_view(report, b) for b in report.blocks],
        "facts": list(report.details.items()) if report.details and not report.blocks else [],
        "context": _context_view(report.context),
        "options": list(report.options.items()) if report.options else [],
        "message": shown, "summary": report.summary(), "notes": list(report.notes),
        "data": markupsafe.Markup(_script_json(report.to_dict(include_arrays=False))),
    }


def report_fragment(report, level: int = 1, ident: str = "agcheck-report") -> str:
    """The report as HTML to place in a page: headings from ``<h{level}>`` down, its data
    as JSON in ``<script type="application/json" id="{ident}">``."""
    _matplotlib()
    return _environment().get_template("report_body.html").render(v=report_view(report), level=level, ident=ident)


def render_html(report) -> str:
    """The report as one self-contained HTML page (images embedded as base64 PNG)."""
    _matplotlib()
    return _environment().get_template("report.html").render(v=report_view(report), css=stylesheet(), level=1,
                                                             ident="agcheck-report")


def write_html(report, path) -> None:
    text = render_html(report)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
