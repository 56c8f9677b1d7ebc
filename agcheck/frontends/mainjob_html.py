"""The main job's self-contained HTML report: the summary table, every failure with its
report (heatmaps when matplotlib is installed), and the details of every check."""
from __future__ import annotations

import html
import re

from agcheck.frontends.mainjob_checks import Verdict, cross_text
from agcheck.report.render import report_fragment, stylesheet

__all__ = ["html_report"]


def _e(x) -> str:
    return html.escape(str(x))


def _rendered_report(v: Verdict, n: int) -> str:
    """``v``'s failure report as an HTML fragment (as text where it cannot be drawn)."""
    report = getattr(v.error, "report", None)
    if v.status == "FAIL" and report is not None and report.blocks:
        try:
            return report_fragment(report, level=3, ident=f"agcheck-report-{n}")
        except ImportError:
            return ("<p><i>Heatmaps need matplotlib and jinja2 (pip install 'agcheck[report]'); "
                    "the report as text:</i></p><pre>" + _e(report.summary()) + "</pre>"
                    "<h4>Message</h4><pre>" + _e(v.detail) + "</pre>")
        except Exception as ex:  # never lose the failure behind a rendering problem
            return (f"<p><i>the report could not be rendered ({_e(type(ex).__name__)}: {_e(ex)})</i></p>"
                    "<pre>" + _e(v.detail) + "</pre>")
    return "<pre>" + _e(v.detail or v.headline) + "</pre>"


def _summary_html(results, backends, anchors: dict) -> list:
    parts = ["<h2>Summary</h2><table><tr><th>function</th><th>kind</th><th>inputs</th>"
             + "".join(f"<th>{_e(b)}</th>" for b in backends)
             + "<th>crosscheck</th><th>time</th></tr>"]
    for r in results:
        row = [f"<td><b>{_e(r.entry.name)}</b><br><small>{_e(r.entry.description)}</small></td>",
               f"<td>{_e(', '.join(r.entry.kinds))}</td>", f"<td><small>{_e(r.entry.describe_inputs())}</small></td>"]
        for b in backends:
            v = r.gradchecks[b]
            row.append(_status_td(v, v.status, anchors.get((r.entry.name, f"gradcheck on {b}"))))
        row.append(_status_td(r.crosscheck, cross_text(r.crosscheck), anchors.get((r.entry.name, "crosscheck"))))
        row.append(f"<td class=num>{r.seconds:.2f}s</td>")
        parts.append("<tr>" + "".join(row) + "</tr>")
    parts.append("</table>")
    return parts


def _failures_html(failed, anchors: dict) -> list:
    parts = ["<h2>Failures</h2>"] if failed else []
    n = 0
    for r in failed:
        for label, v in r.failures():
            n += 1
            parts.append(f"<section class=failure id={anchors[(r.entry.name, label)]}>"
                         f"<h2>{_e(r.entry.name)}: {_e(label)} — {_e(v.status)}</h2>"
                         f"<p class=meta>{_e(v.headline)}</p>"
                         f"<p class=meta>inputs: {_e(r.entry.describe_inputs())} (seed {r.entry.seed}); "
                         f"{_e(v.mode)}</p>")
            parts.append(_rendered_report(v, n))
            parts.append("</section>")
    return parts


def _details_html(results) -> list:
    parts = ["<h2>Details of every check</h2><table><tr><th>function</th><th>check</th><th>verdict</th>"
             "<th>mode</th><th>time</th><th>warnings</th></tr>"]
    for r in results:
        checks = [(f"gradcheck on {b}", v) for b, v in r.gradchecks.items() if v.ran]
        if r.crosscheck.ran:
            checks.append(("crosscheck", r.crosscheck))
        for label, v in checks:
            parts.append(f"<tr><td>{_e(r.entry.name)}</td><td>{_e(label)}</td>"
                         f"<td class={_e(v.status)}>{_e(v.status)}</td><td>{_e(v.mode)}</td>"
                         f"<td class=num>{v.seconds:.3f}s</td>"
                         f"<td><small>{_e('; '.join(v.warnings))}</small></td></tr>")
    parts.append("</table>")
    return parts


def html_report(results, backends, meta: dict) -> str:
    """The main job's self-contained HTML report."""
    failed = [r for r in results if not r.ok]
    ok = not failed
    title = "agcheck main job: " + ("all checks passed" if ok else f"{len(failed)} of {len(results)} functions FAILED")
    parts = [f"<!doctype html><html lang=en><head><meta charset=utf-8><title>{_e(title)}</title>"
             f"<style>{stylesheet()}</style></head><body>"]
    header = "<br>".join(_e(line) for line in str(meta.get("header", "")).splitlines())
    parts.append(f"<h1>agcheck main job</h1><p class=meta>{header}</p>")
    for note in meta.get("notes", ()):
        parts.append(f"<p class=meta>{_e(note)}</p>")
    css = "verdict-ok" if ok else "verdict-bad"
    parts.append(f"<p class={css}><b>{_e(meta.get('verdict', title))}</b></p>")
    anchors = {}
    for i, r in enumerate(results):
        for label, _ in r.failures():
            anchors[(r.entry.name, label)] = f"f{i}-{re.sub(r'[^a-z0-9]+', '-', label)}"
    parts += _summary_html(results, backends, anchors)
    parts += _failures_html(failed, anchors)
    parts += _details_html(results)
    parts.append(f"<p class=meta>{_e(meta.get('footer', ''))}</p></body></html>")
    return "".join(parts)


def _status_td(v: Verdict, text: str, anchor: str | None) -> str:
    css = v.status if v.status != "-" else "skip"
    title = f' title="{_e(v.headline)}"' if v.headline else ""
    inner = f'<a href="#{anchor}">{_e(text)}</a>' if anchor else _e(text)
    return f"<td class={css}{title}>{inner}</td>"
