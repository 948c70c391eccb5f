"""One HTML report of a scanned checkpoint, in one file, its figures embedded (offline, the
default), from the CDN (`report --light`) or as PNG (docs/architecture.md, "widgets/").

All text from the checkpoint (file and tensor names, messages) is escaped, because a hostile
checkpoint chooses those strings.
"""

from __future__ import annotations

import base64
import hashlib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import plotly.graph_objects as go
import plotly.offline

from inspector.ui import (
    NAME_LIMIT,
    SEVERITY_ORDER,
    Finding,
    FitResult,
    ScannedCheckpoint,
    computed_value_table,
    experts_text,
    findings_to_frame,
    fit,
    fit_notes,
    fit_table,
    fold_ranges,
    format_bytes,
    frame_html,
    group_problems,
    grouped_by_code,
    html_text,
    load_verdict_html,
    markup_html,
    plural,
    severity_tally,
    summarize,
    verification_line,
    write_atomic,
)

from .figures import (
    bytes_per_layer,
    expert_coverage_heatmap,
    findings_by_code,
    parameters_per_layer,
    serving_plans,
    shard_size_distribution,
    values_heatmap,
)
from .plotlyjs import cartesian_bundle

if TYPE_CHECKING:
    from inspector.ui import LoadVerdict

__all__ = ["FIGURE_MODES", "render_html_report", "write_html_report"]

Figures = Literal["embedded", "cdn", "png"]
FIGURE_MODES: tuple[Figures, ...] = ("embedded", "cdn", "png")

# Rows shown per finding code; the rest are counted (the JSON output of `check` has them all).
_ROWS_PER_CODE = 200
# Plotly figure options: no logo link, and no server URL so the page names no host at all.
_PLOT_CONFIG = {"displaylogo": False, "responsive": True, "plotlyServerURL": ""}

_CSS = """
:root { --err:#d62728; --warn:#b07d00; --info:#1f77b4; --ok:#2ca02c; --line:#e3e3e3; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color:#222;
       margin: 0 auto; max-width: 1200px; padding: 24px; }
h1 { font-size: 22px; margin: 0 0 4px; } h2 { font-size: 18px; margin: 28px 0 8px;
     border-bottom: 1px solid var(--line); padding-bottom: 4px; }
.path { color:#666; font-family: ui-monospace, monospace; overflow-wrap: anywhere; }
.cards { display: flex; flex-wrap: wrap; gap: 8px; margin: 12px 0; }
.card { border: 1px solid var(--line); border-radius: 6px; padding: 8px 12px; min-width: 110px; }
.card b { display: block; font-size: 18px; } .card span { color: #666; font-size: 12px; }
.badge { border-radius: 10px; padding: 1px 8px; color: #fff; font-size: 12px; }
.sev-error .badge, .badge.sev-error { background: var(--err); }
.sev-warning .badge, .badge.sev-warning { background: var(--warn); }
.sev-info .badge, .badge.sev-info { background: var(--info); }
.badge.ok { background: var(--ok); }
table { border-collapse: collapse; width: 100%; font-size: 13px; }
th, td { text-align: left; padding: 4px 8px; border-bottom: 1px solid var(--line);
         vertical-align: top; }
th { background: #f6f6f6; position: sticky; top: 0; }
/* Names wrap after their dots, dashes, slashes and underscores (<wbr>), never inside a word:
   `anywhere` would let the column shrink to one letter and cut "safetensors" in two. */
td.name { font-family: ui-monospace, monospace; overflow-wrap: break-word; word-break: normal; }
.problem td { vertical-align: top; } .problem code { font-size: 12px; }
tr.group td { background: #fafafa; font-weight: 600; padding-top: 10px; }
tr.more td { color: #666; font-style: italic; }
.figure { margin: 8px 0 16px; } .figure img { max-width: 100%; height: auto; }
.note { border-left: 4px solid var(--info); padding: 4px 10px; background: #f4f8fc; }
.cdn-missing { display: none; color: var(--err); }
.no-plotly .cdn-missing { display: block; }
.muted { color: #666; }
"""


def write_html_report(
    scanned: ScannedCheckpoint,
    findings: Sequence[Finding],
    path: str | os.PathLike[str],
    *,
    verdict: LoadVerdict | None = None,
    figures: Figures = "embedded",
    serving: FitResult | None = None,
) -> Path:
    """Write the report to `path` atomically (temp file, then rename) and return the path.
    `figures` says how the figures are drawn (see the module docstring); `serving` is the
    `fit` result the "Will it serve?" section shows (default: `fit(scanned)`)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    html_text = render_html_report(
        scanned, findings, verdict=verdict, figures=figures, serving=serving
    )
    write_atomic(target, html_text.encode("utf-8"))
    return target


def render_html_report(
    scanned: ScannedCheckpoint,
    findings: Sequence[Finding],
    *,
    verdict: LoadVerdict | None = None,
    figures: Figures = "embedded",
    serving: FitResult | None = None,
) -> str:
    """The report as one HTML string (with plotly.js unless `figures` says otherwise). With
    the load `verdict` the findings were checked with, it says whether the model code would
    load the checkpoint; `serving` (default: `fit(scanned)`, the matrix without a GPU) gives
    the parallel plans of "Will it serve?"."""
    if figures not in FIGURE_MODES:
        raise ValueError(f"figures={figures!r}: expected one of {', '.join(FIGURE_MODES)}")
    summary = summarize(scanned, findings=list(findings))
    serving = serving if serving is not None else fit(scanned)
    charts = [
        ("findings-chart", "", findings_by_code(findings_to_frame(findings)) if findings else None),
        (
            "expert-heatmap",
            "Expert coverage",
            expert_coverage_heatmap(scanned.experts, tensors=scanned.tensors),
        ),
        ("shard-sizes", "Shard sizes", shard_size_distribution(scanned.files)),
        ("bytes-per-layer", "Bytes per layer", bytes_per_layer(scanned.tensors)),
        ("parameters-per-layer", "Parameters per layer", parameters_per_layer(scanned.layers)),
        ("serving-plans", "", serving_plans(serving.frame())),
    ]
    values = computed_value_table(scanned)  # only when a check read them: reports read no data
    if values is not None:
        charts.append(("values-heatmap", "Tensor values", values_heatmap(values, metric="std")))
    drawn = _draw(figures, [(name, fig) for name, _, fig in charts if fig is not None])
    sections = [
        _summary_section(summary),
        f"<p class='verified'>{_m(verification_line(scanned))}</p>",
        _load_section(verdict),
        _problems_section(scanned, findings, verdict),
        _findings_section(scanned, findings, drawn.get("findings-chart", "")),
        _serving_section(serving, drawn["serving-plans"]),
        *(_figure_section(name, title, drawn[name]) for name, title, _ in charts[1:] if title),
    ]
    title = f"Checkpoint report: {scanned.path.name}"
    return (
        "<!DOCTYPE html>\n<html lang='en'>\n<head>\n<meta charset='utf-8'>\n"
        f"<title>{_e(title)}</title>\n<style>{_CSS}</style>\n{_plotly_script(figures)}"
        f"</head>\n<body>\n<h1>{_e(title)}</h1>\n<div class='path'>{_e(str(scanned.path))}</div>\n"
        + _figures_note(figures)
        + "\n".join(sections)
        + "\n</body>\n</html>\n"
    )


def _plotly_script(figures: Figures) -> str:
    """The `<script>` that brings plotly.js: embedded, from its CDN (pinned to the version
    plotly.py bundles, with that file's SRI hash), or none for PNG figures."""
    if figures == "png":
        return ""
    if figures == "embedded":
        return f"<script type='text/javascript'>{cartesian_bundle()}</script>\n"
    digest = hashlib.sha384(plotly.offline.get_plotlyjs().encode("utf-8")).digest()
    integrity = "sha384-" + base64.b64encode(digest).decode("ascii")
    return (
        f"<script charset='utf-8' src='{_e(plotly_cdn_url())}' integrity='{integrity}' "
        "crossorigin='anonymous' "
        "onerror=\"document.documentElement.classList.add('no-plotly')\"></script>\n"
    )


def plotly_cdn_url() -> str:
    """Where the light report loads plotly.js from: the version plotly.py bundles."""
    return f"https://cdn.plot.ly/plotly-{plotly.offline.get_plotlyjs_version()}.min.js"


def _figures_note(figures: Figures) -> str:
    """What the reader needs to know about the figures of a report that does not embed
    plotly.js."""
    if figures == "cdn":
        url = _e(plotly_cdn_url())
        return (
            "<p class='note' id='figures-note'>Light report: the interactive figures load "
            f"plotly.js from <code>{url}</code> and need internet access. "
            "<span class='cdn-missing'><b>plotly.js could not be loaded: the figures are "
            "missing.</b> Write the full report (<code>ckpt-inspect report PATH</code>, "
            "plotly.js embedded) to read it offline.</span></p>\n"
        )
    if figures == "png":
        return (
            "<p class='note' id='figures-note'>Figures are PNG images (not interactive); "
            "<code>ckpt-inspect report PATH</code> writes them interactive.</p>\n"
        )
    return ""


def _draw(figures: Figures, charts: list[tuple[str, go.Figure]]) -> dict[str, str]:
    """Each chart's HTML by name: a plotly `<div>` or a PNG `<img>`."""
    if figures != "png":
        return {name: _figure_div(f"{name}-figure", fig) for name, fig in charts}
    from .snapshot import render_pngs

    pngs = render_pngs(charts)
    return {
        name: f"<div class='figure' id='{name}-figure'><img alt='{_e(name)}' "
        f"src='data:image/png;base64,{base64.b64encode(png).decode('ascii')}'></div>"
        for (name, _), png in zip(charts, pngs, strict=True)
    }


# -- sections ----------------------------------------------------------------------------------


def _summary_section(summary: dict[str, Any]) -> str:
    layers = f"{summary['layers']:,}"
    if summary["mtp_layers"]:
        layers += f" + {summary['mtp_layers']} MTP"
    cards = [
        ("layout", summary["layout"]),
        ("files", f"{summary['files']:,}"),
        ("tensors", f"{summary['tensors']:,}"),
        ("bytes", format_bytes(summary["total_bytes"])),
        ("parameters", f"{summary['parameters']:,}"),
        ("layers", layers),
        ("MoE layers", f"{summary['moe_layers']:,}"),
        ("experts", _experts_text(summary)),
    ]
    body = "".join(f"<div class='card'><b>{_e(v)}</b><span>{_e(k)}</span></div>" for k, v in cards)
    dtypes = ", ".join(f"{k} {format_bytes(v)}" for k, v in summary["dtypes"].items())
    return (
        f"<section id='summary'>\n<h2>Summary</h2>\n<div class='cards'>{body}</div>\n"
        f"<p><span class='muted'>dtypes:</span> {_e(dtypes or 'none')}</p>\n"
        f"<p><span class='muted'>parameters:</span> {_e(summary['parameters_rule'])}</p>\n"
        f"<p>{_severity_badges(summary['findings'])}</p>\n</section>"
    )


def _load_section(verdict: LoadVerdict | None) -> str:
    """Will it load? Absent when the load check did not run (a report without `verdict`)."""
    if verdict is None:
        return ""
    return f"<section id='load'>\n<h2>Will it load?</h2>\n{load_verdict_html(verdict)}\n</section>"


def _problems_section(
    scanned: ScannedCheckpoint, findings: Sequence[Finding], verdict: LoadVerdict | None
) -> str:
    """The findings grouped into issues (root causes): what is wrong, its impact, what fixes
    it."""
    problems = group_problems(scanned, findings, verdict=verdict)
    head = "<section id='problems'>\n<h2>Issues</h2>\n"
    if not problems:
        return head + "<p class='muted'>No issues.</p>\n</section>"
    rows = "".join(
        f"<tr class='problem sev-{p.severity}' data-problem='{_e(p.key)}'>"
        f"<td><span class='badge'>{p.severity}</span></td><td><b>{_m(p.title)}</b></td>"
        f"<td>{_m(p.impact)}</td><td>{_m(p.action.text)}<br><code>{_e(p.action.command)}"
        f"</code></td><td>{len(p.findings):,}</td></tr>"
        for p in problems
    )
    columns = "".join(
        f"<th>{c}</th>" for c in ("severity", "issue", "impact", "what fixes it", "findings")
    )
    return (
        f"{head}<table id='problems-table'>\n<thead><tr>{columns}</tr></thead>\n"
        f"<tbody>{rows}</tbody>\n</table>\n</section>"
    )


def _serving_section(serving: FitResult, chart: str) -> str:
    """Will it serve? The parallel plans vLLM and SGLang would start, the weights and KV
    cache per GPU (`fit`), the figure, the table and how the figures are made."""
    notes = "".join(f"<li>{_e(note)}</li>" for note in fit_notes(serving))
    command = "ckpt-inspect fit PATH --gpu H100-80GB"
    gpu = (
        f"on {_e(serving.gpu)}"
        if serving.gpu is not None
        else f"without a GPU (<code>{_e(command)}</code> adds the memory verdict)"
    )
    return (
        f"<section id='serving'>\n<h2>Will it serve?</h2>\n<p>Parallel plans {gpu}.</p>\n"
        f"{chart}\n{frame_html(fit_table(serving), max_rows=64)}\n<ul class='muted'>{notes}</ul>"
        "\n</section>"
    )


def _experts_text(summary: dict[str, Any]) -> str:
    # As the scan and the Markdown summary say it: the layers that lack experts, how many.
    return experts_text(summary)


def _severity_badges(findings: list[dict[str, Any]]) -> str:
    if not findings:
        return "<span class='badge ok'>no findings</span>"
    counts = severity_tally(findings)
    return " ".join(
        f"<span class='badge sev-{s}'>{_e(plural(counts[s], s))}</span>"
        for s in SEVERITY_ORDER
        if counts[s]
    )


def _findings_section(scanned: ScannedCheckpoint, findings: Sequence[Finding], chart: str) -> str:
    head = "<section id='findings'>\n<h2>Findings</h2>\n"
    if not findings:
        return head + "<p class='muted' id='no-findings'>No findings.</p>\n</section>"
    missing = _missing_experts(scanned)
    rows: list[str] = []
    for code, items in grouped_by_code(findings):
        severity = str(items[0].severity)
        rows.append(
            f"<tr class='group sev-{severity}' data-code='{_e(code)}'><td colspan='7'>"
            f"<span class='badge'>{severity}</span> {_e(code)} ({len(items):,})</td></tr>"
        )
        rows.extend(_finding_row(f, missing) for f in items[:_ROWS_PER_CODE])
        if len(items) > _ROWS_PER_CODE:
            rest = len(items) - _ROWS_PER_CODE
            rows.append(
                f"<tr class='more'><td colspan='7'>... {rest:,} more {_e(code)} findings "
                "(run ckpt-inspect check --json for all)</td></tr>"
            )
    columns = "".join(
        f"<th>{c}</th>"
        for c in ("severity", "code", "message", "file", "tensor", "layer", "experts")
    )
    return (
        f"{head}{chart}\n<table id='findings-table'>\n<thead><tr>{columns}</tr></thead>\n"
        f"<tbody>\n{chr(10).join(rows)}\n</tbody>\n</table>\n</section>"
    )


def _missing_experts(scanned: ScannedCheckpoint) -> dict[int, str]:
    """Per MoE layer, its missing expert ids folded ("17-19"), from the experts table the
    `expert-missing` finding was made from."""
    experts = scanned.experts
    if experts.empty:
        return {}
    lost = experts[experts["missing"]]
    by_layer: dict[int, list[int]] = {}
    for layer, expert in zip(lost["layer"].tolist(), lost["expert"].tolist(), strict=True):
        by_layer.setdefault(int(layer), []).append(int(expert))
    return {layer: fold_ranges(ids) for layer, ids in sorted(by_layer.items())}


def _experts_cell(f: Finding, missing: dict[int, str]) -> str:
    """The expert(s) a finding is about: its own, or for a layer that lost several, which."""
    if f.expert is not None:
        return str(f.expert)
    if f.code == "expert-missing" and f.layer is not None:
        return _e(missing.get(f.layer, ""))
    return ""


def _finding_row(f: Finding, missing: dict[int, str]) -> str:
    cells = (
        f"<td><span class='badge'>{f.severity}</span></td>",
        f"<td>{_e(f.code)}</td>",
        f"<td>{_m(f.message)}</td>",
        f"<td class='name'>{_name(f.file or '')}</td>",
        f"<td class='name'>{_name(f.tensor or '')}</td>",
        f"<td>{'' if f.layer is None else f.layer}</td>",
        f"<td class='experts'>{_experts_cell(f, missing)}</td>",
    )
    return f"<tr class='finding sev-{f.severity}' data-code='{_e(f.code)}'>{''.join(cells)}</tr>"


def _figure_section(section_id: str, title: str, drawn: str) -> str:
    return f"<section id='{section_id}'>\n<h2>{_e(title)}</h2>\n{drawn}\n</section>"


def _figure_div(div_id: str, fig: go.Figure) -> str:
    # plotly.js is in the page head already: each figure carries only its data and layout.
    body = fig.to_html(full_html=False, include_plotlyjs=False, div_id=div_id, config=_PLOT_CONFIG)
    return f"<div class='figure'>{body}</div>"


def _e(value: object) -> str:
    return html_text(value)


def _m(value: object) -> str:
    """A message of the project's: its `commands` as `<code>` (`markup_html`)."""
    return markup_html(value)


def _name(value: str) -> str:
    """A file or tensor name, escaped, that wraps after its dots, dashes, slashes and
    underscores instead of in the middle of a word."""
    text = html_text(value, limit=NAME_LIMIT)
    for sep in (".", "-", "/", "_"):
        text = text.replace(sep, sep + "<wbr>")
    return text
