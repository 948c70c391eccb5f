"""HTML snippets for notebook display: `ScannedCheckpoint._repr_html_` and the dashboard's
tables. Pure: data in, string out.

No notebook package is imported here: Jupyter calls `_repr_html_` and shows the string, the
dashboard puts the strings in HTML widgets. Every string that comes from the checkpoint (paths,
file and tensor names, messages) is escaped, because a hostile checkpoint chooses those strings.
"""

from __future__ import annotations

import html
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from inspector.findings import CODE_HELP, Finding
from inspector.summary import summarize
from inspector.units import format_bytes

if TYPE_CHECKING:
    import pandas as pd

    from inspector.model import ScannedCheckpoint

__all__ = [
    "STYLE",
    "code_help_html",
    "diff_html",
    "findings_html",
    "frame_html",
    "scanned_html",
    "text_html",
]

_SEVERITIES = ("error", "warning", "info")
_SEVERITY_COLORS = {"error": "#d62728", "warning": "#b07d00", "info": "#1f77b4"}
STYLE = (
    "<style>.ckpt-repr table{border-collapse:collapse;font-size:12px;margin:4px 0 10px}"
    ".ckpt-repr th,.ckpt-repr td{padding:2px 8px;text-align:left;vertical-align:top;"
    "border-bottom:1px solid #e3e3e3}.ckpt-repr th{background:#f6f6f6}"
    ".ckpt-repr .k{color:#666;padding-right:12px}.ckpt-repr code{font-size:12px}"
    ".ckpt-repr td code{white-space:nowrap}"
    ".ckpt-repr td.name{font-family:monospace;word-break:break-all;min-width:14em;max-width:28em}"
    ".ckpt-repr td.msg{min-width:22em}.ckpt-repr .scroll{max-height:560px;overflow:auto}"
    ".ckpt-repr .sev{border-radius:8px;padding:0 6px;color:#fff;font-size:11px}"
    ".ckpt-repr pre{font-size:12px;max-height:480px;overflow:auto;background:#fafafa;"
    "padding:6px;margin:4px 0}.ckpt-repr .add{color:#22863a}.ckpt-repr .del{color:#b31d28}"
    ".ckpt-repr .hunk{color:#6f42c1}</style>"
)


def scanned_html(
    scanned: ScannedCheckpoint, *, findings: Sequence[Finding] | None = None, max_rows: int = 8
) -> str:
    """A summary card of a scan: facts, bytes by dtype, findings by severity (the scan's own
    problems unless `findings` is given) and the first `max_rows` files and findings. Tables
    are cut at `max_rows` rows (a count says how many more), so a 300,000-tensor checkpoint
    displays as fast as a small one."""
    problems = list(scanned.problems if findings is None else findings)
    summary = summarize(scanned, problems=problems)
    files = scanned.files
    parts = [
        f"<b>checkpoint</b> <code>{_e(summary['path'])}</code>",
        _facts_table(summary),
        _dtype_table(summary["dtypes"]),
        _problems_html(problems, max_rows=max_rows),
        _frame_table(
            files,
            columns=["file", "size", "tensors", "first_layer", "last_layer"],
            max_rows=max_rows,
            title="files",
        ),
    ]
    return _wrap("".join(parts))


def frame_html(
    frame: pd.DataFrame | None,
    *,
    columns: Sequence[str] | None = None,
    max_rows: int = 200,
    title: str | None = None,
) -> str:
    """The first `max_rows` rows of `frame` (only the `columns` it has) as an escaped table,
    followed by "... N more rows" when cut."""
    return _wrap(_frame_table(frame, columns=columns, max_rows=max_rows, title=title))


def _frame_table(
    frame: pd.DataFrame | None,
    *,
    columns: Sequence[str] | None,
    max_rows: int,
    title: str | None,
) -> str:
    if frame is None or frame.empty:
        return f"<div class='k'>{_e(title or 'table')}: no rows</div>"
    wanted = [c for c in (columns or frame.columns) if c in frame.columns]
    shown = frame[wanted].head(max_rows)
    table = shown.to_html(index=False, escape=True, border=0, na_rep="")
    head = f"<div>{_e(title)} ({len(frame):,})</div>" if title else ""
    return head + table + _more(len(frame), max_rows, "rows")


def findings_html(frame: pd.DataFrame, *, max_rows: int = 500) -> str:
    """Findings (a `findings_to_frame` frame) as a table, one `<tr class="finding">` per
    finding with `data-code` and `data-severity` attributes; the code cell's tooltip is the
    code's explanation (`CODE_HELP`)."""
    if frame.empty:
        return _wrap("<div class='k'>No findings.</div>")
    rows = []
    for r in frame.head(max_rows).itertuples(index=False):
        sev, code = str(r.severity), str(r.code)
        where = " ".join(
            f"{k} {_e(v)}" for k, v in (("layer", r.layer), ("expert", r.expert)) if not _missing(v)
        )
        rows.append(
            f'<tr class="finding" data-code="{_e(code)}" data-severity="{_e(sev)}">'
            f"<td>{_badge(sev)}</td>"
            f'<td title="{_e(CODE_HELP.get(code, ""))}"><code>{_e(code)}</code></td>'
            f"<td class='msg'>{_e(r.message)}</td><td class='name'>{_e(_blank(r.file))}</td>"
            f"<td class='name'>{_e(_blank(r.tensor))}</td><td>{where}</td></tr>"
        )
    head = (
        "<tr><th>severity</th><th>code</th><th>message</th><th>file</th><th>tensor</th>"
        "<th>where</th></tr>"
    )
    table = f"<div class='scroll'><table>{head}{''.join(rows)}</table></div>"
    return _wrap(table + _more(len(frame), max_rows, "findings"))


def code_help_html(codes: Iterable[str]) -> str:
    """A two-column table: each code and its one-line explanation (`CODE_HELP`)."""
    rows = "".join(
        f"<tr><td><code>{_e(c)}</code></td>"
        f"<td>{_e(CODE_HELP.get(c, 'no explanation recorded'))}</td></tr>"
        for c in codes
    )
    return (
        _wrap(f"<table><tr><th>code</th><th>what it means</th></tr>{rows}</table>") if rows else ""
    )


def diff_html(diff: str, *, max_chars: int = 200_000) -> str:
    """A unified diff in a `<pre>`, added lines green and removed ones red."""
    if len(diff) > max_chars:
        diff = diff[:max_chars] + f"\n... {len(diff) - max_chars:,} more characters\n"
    lines = []
    for line in diff.splitlines():
        css = ""
        if line.startswith("@@"):
            css = "hunk"
        elif line.startswith("+") and not line.startswith("+++"):
            css = "add"
        elif line.startswith("-") and not line.startswith("---"):
            css = "del"
        lines.append(f'<span class="{css}">{_e(line)}</span>' if css else _e(line))
    return _wrap("<pre>" + "\n".join(lines) + "</pre>")


def text_html(text: str) -> str:
    """Preformatted text (plans, results), escaped."""
    return _wrap(f"<pre>{_e(text)}</pre>")


def _facts_table(s: dict[str, Any]) -> str:
    layers = f"{s['layers']} decoder ({s['moe_layers']} MoE)"
    if s["mtp_layers"]:
        layers += f" + {s['mtp_layers']} MTP"
    rows = [
        ("layout", s["layout"]),
        ("files", f"{s['files']:,}"),
        ("tensors", f"{s['tensors']:,}"),
        ("bytes", format_bytes(s["total_bytes"])),
        ("parameters", f"{s['parameters']:,}"),
        ("layers", layers),
    ]
    if s["moe_layers"]:
        rows.append(("experts per MoE layer", str(s["experts_per_layer"])))
    body = "".join(f'<tr><td class="k">{_e(k)}</td><td>{_e(v)}</td></tr>' for k, v in rows)
    return f"<table>{body}</table>"


def _dtype_table(dtypes: dict[str, int]) -> str:
    if not dtypes:
        return ""
    cells = "".join(
        f"<tr><td>{_e(k)}</td><td>{format_bytes(v)}</td></tr>" for k, v in dtypes.items()
    )
    return f"<table><tr><th>dtype</th><th>bytes</th></tr>{cells}</table>"


def _problems_html(problems: list[Finding], *, max_rows: int) -> str:
    """Findings counted by severity, then one row per code (worst first) with its count and
    first message."""
    if not problems:
        return '<div style="color:#2ca02c">findings: none</div>'
    counts = Counter(str(p.severity) for p in problems)
    badges = " ".join(f"{counts[s]:,} {_badge(s)}" for s in _SEVERITIES if counts[s])
    rank = {s: i for i, s in enumerate(_SEVERITIES)}
    per_code = Counter(p.code for p in problems)
    first: dict[str, Finding] = {}
    for p in sorted(problems, key=lambda p: (rank.get(str(p.severity), 3), p.code)):
        first.setdefault(p.code, p)
    rows = "".join(
        f"<tr><td>{_badge(p.severity)}</td><td><code>{_e(code)}</code></td>"
        f"<td>{per_code[code]:,}</td><td>{_e(p.message)}</td></tr>"
        for code, p in list(first.items())[:max_rows]
    )
    head = "<tr><th>severity</th><th>code</th><th>count</th><th>first message</th></tr>"
    more = _more(len(first), max_rows, "codes")
    return f"<div>findings: {badges}</div><table>{head}{rows}</table>{more}"


def _badge(severity: object) -> str:
    sev = str(severity)
    color = _SEVERITY_COLORS.get(sev, "#7f7f7f")
    return f'<span class="sev" style="background:{color}">{_e(sev)}</span>'


def _more(total: int, shown: int, what: str) -> str:
    return f"<div class='k'>... {total - shown:,} more {_e(what)}</div>" if total > shown else ""


def _wrap(body: str) -> str:
    return f'{STYLE}<div class="ckpt-repr">{body}</div>'


def _missing(value: object) -> bool:
    try:
        return value is None or bool(value != value)  # NaN and pandas.NA
    except TypeError:
        return True


def _blank(value: object) -> object:
    return "" if _missing(value) else value


def _e(value: object) -> str:
    return html.escape(str(value))
