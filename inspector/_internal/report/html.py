"""HTML snippets for notebook display: `ScannedCheckpoint._repr_html_` and the dashboard's
tables. Pure: data in, string out.

No notebook package is imported here: Jupyter calls `_repr_html_` and shows the string, the
dashboard puts the strings in HTML widgets. Every string that comes from the checkpoint (paths,
file and tensor names, messages) goes through `inspector._internal.common.display.legible` (bounded,
control characters escaped, HTML-escaped), because a hostile checkpoint chooses those strings.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from inspector._internal.common.display import MESSAGE_LIMIT, NAME_LIMIT, legible, legible_markup
from inspector._internal.common.text import plural
from inspector._internal.common.units import format_bytes
from inspector._internal.diagnosis.issues import Issue, group_issues
from inspector._internal.findings.codes import code_of
from inspector._internal.findings.finding import CODE_HELP, Finding
from inspector._internal.findings.words import severity_tally
from inspector._internal.integrity.verified import verification_line
from inspector._internal.report.summary import experts_text, summarize

if TYPE_CHECKING:
    import pandas as pd

    from inspector._internal.checkpoint.scanned import ScannedCheckpoint
    from inspector._internal.load.verdict import LoadVerdict

__all__ = [
    "BYTE_COLUMNS",
    "STYLE",
    "code_help_html",
    "diff_html",
    "facts_html",
    "findings_html",
    "frame_html",
    "html_text",
    "load_answer",
    "load_verdict_html",
    "markup_html",
    "problem_html",
    "problems_html",
    "scanned_html",
    "severity_badge",
    "text_html",
]

# Columns that hold byte counts: tables show them as "4.1 GB" (decimal, `format_bytes`).
BYTE_COLUMNS = frozenset({"size", "header_bytes", "tensor_bytes", "nbytes", "bytes", "total_bytes"})
_KIND_LABELS = {
    "repair": "fixable here",
    "restore": "restore from a copy",
    "re-export": "re-export",
    "consolidate": "consolidate",
    "reshard": "re-shard",
    "review": "review",
}

_SEVERITIES = ("error", "warning", "info")
_SEVERITY_COLORS = {"error": "#d62728", "warning": "#b07d00", "info": "#1f77b4"}
STYLE = (
    "<style>.ckpt-repr table{border-collapse:collapse;font-size:12px;margin:4px 0 10px}"
    ".ckpt-repr th,.ckpt-repr td{padding:2px 8px;text-align:left;vertical-align:top;"
    "border-bottom:1px solid #e3e3e3}.ckpt-repr th{background:#f6f6f6}"
    ".ckpt-repr .k{color:#666;padding-right:12px}.ckpt-repr code{font-size:12px}"
    ".ckpt-repr td code{white-space:nowrap}"
    ".ckpt-repr td.name{font-family:monospace;min-width:14em;max-width:28em}"
    ".ckpt-repr td.msg{min-width:22em}.ckpt-repr .scroll{max-height:560px;overflow:auto}"
    ".ckpt-repr .sev{border-radius:8px;padding:0 6px;color:#fff;font-size:11px}"
    ".ckpt-repr pre{font-size:12px;max-height:480px;overflow:auto;background:#fafafa;"
    "padding:6px;margin:4px 0}.ckpt-repr .add{color:#22863a}.ckpt-repr .del{color:#b31d28}"
    ".ckpt-repr .hunk{color:#6f42c1}"
    ".ckpt-repr td.name{overflow-wrap:anywhere}"
    ".ckpt-repr .problem td{border-bottom:1px solid #e3e3e3}</style>"
)


def scanned_html(
    scanned: ScannedCheckpoint, *, findings: Sequence[Finding] | None = None, max_rows: int = 8
) -> str:
    """A summary card of a scan: facts, bytes by dtype, the issues (`findings` grouped by
    root cause; without `findings`, what the scan could not read, and that the checks did not
    run) and the first `max_rows` files. Tables are cut at `max_rows` rows (a count says how
    many more), so a 300,000-tensor checkpoint displays as fast as a small one."""
    files = scanned.files
    if findings is None:
        read = list(scanned.read_findings)
        issues = _not_checked(len(read)) + (
            _problems_table(group_issues(scanned, read), len(read), max_rows=max_rows)
            if read
            else ""
        )
    else:
        problems = group_issues(scanned, findings)
        issues = _problems_table(problems, len(findings), max_rows=max_rows)
    parts = [
        facts_html(scanned, findings or ()),
        issues,
        _frame_table(
            files,
            columns=["file", "size", "tensors", "first_layer", "last_layer"],
            max_rows=max_rows,
            title="files",
        ),
    ]
    return _wrap("".join(parts))


def facts_html(scanned: ScannedCheckpoint, findings: Sequence[Finding] = ()) -> str:
    """The checkpoint's path, facts (layout, files, tensors, bytes, parameters, layers) and
    bytes by dtype, as two small tables."""
    summary = summarize(scanned, findings=list(findings))
    return (
        f"<b>checkpoint</b> <code>{_e(summary['path'])}</code>"
        + f"<div class='ckpt-verified'>{markup_html(verification_line(scanned))}</div>"
        + _facts_table(summary)
        + _dtype_table(summary["dtypes"])
    )


def frame_html(
    frame: pd.DataFrame | None,
    *,
    columns: Sequence[str] | None = None,
    max_rows: int = 200,
    title: str | None = None,
) -> str:
    """The first `max_rows` rows of `frame` (only the `columns` it has) as an escaped table;
    byte-count columns (`BYTE_COLUMNS`) read "4.1 GB". A title counts the rows."""
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
    shown = frame[wanted].iloc[:max_rows].copy()
    for column in wanted:  # names and other text: bounded and control characters escaped
        if shown[column].dtype.kind == "O":
            shown[column] = [v if _missing(v) else legible(v) for v in shown[column].tolist()]
    for column in BYTE_COLUMNS & set(wanted):
        shown[column] = [
            "" if _missing(v) else format_bytes(float(v)) for v in shown[column].tolist()
        ]
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
            f"<td class='msg'>{markup_html(r.message)}</td>"
            f"<td class='name'>{_name(_blank(r.file))}</td>"
            f"<td class='name'>{_name(_blank(r.tensor))}</td><td>{where}</td></tr>"
        )
    head = (
        "<tr><th>severity</th><th>code</th><th>message</th><th>file</th><th>tensor</th>"
        "<th>where</th></tr>"
    )
    table = f"<div class='scroll'><table>{head}{''.join(rows)}</table></div>"
    return _wrap(table + _more(len(frame), max_rows, "findings"))


def code_help_html(codes: Iterable[str]) -> str:
    """A table: each code, its one-line explanation (`CODE_HELP`) and its fix (`Code.fix`)."""
    rows = "".join(
        f"<tr><td><code>{_e(c)}</code></td>"
        f"<td>{markup_html(CODE_HELP.get(c, 'no explanation recorded'))}</td>"
        f"<td>{markup_html(_fix_text(c))}</td></tr>"
        for c in codes
    )
    head = "<tr><th>code</th><th>what it means</th><th>what fixes it</th></tr>"
    return _wrap(f"<table>{head}{rows}</table>") if rows else ""


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
    """Preformatted text (plans, results), escaped line by line."""
    return _wrap(f"<pre>{legible(text, target='html', limit=MESSAGE_LIMIT, lines=True)}</pre>")


def _facts_table(s: dict[str, Any]) -> str:
    layers = f"{s['layers']} decoder ({s['moe_layers']} MoE)"
    if s["mtp_layers"]:
        layers += f" + {s['mtp_layers']} MTP"
    rows = [
        ("layout", s["layout"]),
        ("files", f"{s['files']:,}"),
        ("tensors", f"{s['tensors']:,}"),
        ("bytes", format_bytes(s["total_bytes"])),
        ("parameters", f"{s['parameters']:,} ({s['parameters_rule']})"),
        ("layers", layers),
    ]
    if s["moe_layers"]:
        rows.append(("experts", experts_text(s)))
    body = "".join(f'<tr><td class="k">{_e(k)}</td><td>{_e(v)}</td></tr>' for k, v in rows)
    return f"<table>{body}</table>"


def _dtype_table(dtypes: dict[str, int]) -> str:
    if not dtypes:
        return ""
    cells = "".join(
        f"<tr><td>{_e(k)}</td><td>{format_bytes(v)}</td></tr>" for k, v in dtypes.items()
    )
    return f"<table><tr><th>dtype</th><th>bytes</th></tr>{cells}</table>"


def problems_html(
    scanned: ScannedCheckpoint,
    findings: Sequence[Finding],
    *,
    max_rows: int = 50,
    verdict: LoadVerdict | None = None,
) -> str:
    """The findings grouped into problems (`inspector._internal.diagnosis.issues`, with the load
    `verdict` they were checked with): severity, what is wrong, its impact and what fixes it, one
    row per problem, worst first."""
    problems = group_issues(scanned, findings, verdict=verdict)
    return _wrap(_problems_table(problems, len(findings), max_rows=max_rows))


_ANSWER_COLORS = {"yes": "#2ca02c", "ignores": "#b07d00", "no": "#d62728", "unknown": "#7f7f7f"}


def load_answer(verdict: LoadVerdict | None) -> str:
    """The short answer to "will it load?": yes, ignores (loads, but drops stored tensors),
    no, or unknown (not checked)."""
    if verdict is None or verdict.loads is None:
        return "unknown"
    if not verdict.loads:
        return "no"
    return "ignores" if verdict.unexpected else "yes"


def load_verdict_html(verdict: LoadVerdict | None, *, examples: int = 3) -> str:
    """ "Will it load?" (`inspector._internal.load.verdict`): the answer, the architecture and what
    the model code reports, the first `examples` keys of each kind (missing, another shape,
    unexpected) with their counts, MTP tensors transformers skips, or why the check did not
    run. Styles are inline: a saved notebook's static snapshot keeps them."""
    answer = load_answer(verdict)
    label = {
        "yes": "yes",
        "ignores": "yes, ignoring stored tensors",
        "no": "no",
        "unknown": "not checked",
    }[answer]
    badge = (
        f"<span style='background:{_ANSWER_COLORS[answer]};color:#fff;border-radius:8px;"
        f"padding:0 8px'>{_e(label)}</span>"
    )
    head = f"<b>Will it load?</b> {badge}"
    if verdict is None:
        body = " <span style='color:#666'>the load check was off</span>"
        return _load_box(answer, head + body)
    if verdict.skipped is not None:
        skipped = markup_html(verdict.skipped)
        return _load_box(answer, f"{head} <span style='color:#666'>{skipped}</span>")
    notes = []
    if verdict.transformers_version:
        notes.append(f"transformers {verdict.transformers_version}")
    if verdict.parameters is not None:
        notes.append(verdict.parameters_text())
    if verdict.quantization:
        notes.append(f"quantization: {verdict.quantization}")
    tail = f" <span style='color:#666'>({markup_html('; '.join(notes))})</span>" if notes else ""
    head += f" as <code>{_name(verdict.architecture or '?')}</code>{tail}"
    kinds = [
        ("missing", list(verdict.missing), "the model expects them; transformers initialises "
         "them at random"),
        (
            "with another shape",
            [f"{m.key} {list(m.stored)} (expected {list(m.expected)})" for m in verdict.mismatched],
            "loading fails",
        ),
        ("unexpected", list(verdict.unexpected), "stored, and the model would not load them"),
        (
            "MTP tensors transformers skips",
            list(verdict.mtp_skipped),
            "serving engines that predict several tokens load them",
        ),
    ]  # fmt: skip
    items = []
    for kind, keys, why in kinds:
        if not keys:
            continue
        shown = ", ".join(f"<code>{_name(k)}</code>" for k in keys[:examples])
        more = f" and {len(keys) - examples:,} more" if len(keys) > examples else ""
        items.append(
            f"<li data-kind='{_e(kind)}'><b>{len(keys):,} {_e(kind)}</b> "
            f"<span style='color:#666'>({_e(why)})</span>: {shown}{more}</li>"
        )
    listing = f"<ul style='margin:4px 0'>{''.join(items)}</ul>" if items else ""
    return _load_box(answer, head + listing)


def _load_box(answer: str, body: str) -> str:
    return (
        f"<div class='ckpt-load' data-loads='{answer}' style='border-left:4px solid "
        f"{_ANSWER_COLORS[answer]};padding:4px 10px;margin:6px 0'>{body}</div>"
    )


def problem_html(problem: Issue) -> str:
    """One issue (`Issue`): badge and title, impact, and the action with its command."""
    action = problem.action
    tag = _KIND_LABELS.get(action.kind, action.kind)
    return _wrap(
        f"<div class='problem' data-problem='{_e(problem.key)}'>{_badge(problem.severity)} "
        f"<b>{markup_html(problem.title)}</b><br><span class='k'>impact</span> "
        f"{markup_html(problem.impact)}<br>"
        f"<span class='k'>fix ({_e(tag)})</span> {markup_html(action.text)} "
        f"<code>{_e(action.command)}</code></div>"
    )


def _not_checked(read: int) -> str:
    """A scan alone ran no check: it says so instead of "no issues"."""
    what = f"{plural(read, 'finding')} while reading files; " if read else "every file was read; "
    return (
        f"<div class='k'>{_e(what)}the checks did not run: <code>check(scan(path))</code> or "
        "<code>ckpt-inspect check PATH</code> runs them</div>"
    )


def _problems_table(problems: Sequence[Issue], n_findings: int, *, max_rows: int) -> str:
    if not problems:
        return '<div style="color:#2ca02c"><b>No issues found.</b></div>'
    counts = severity_tally(problems)
    badges = " ".join(_badge(s, plural(counts[s], s)) for s in _SEVERITIES if counts[s])
    rows = "".join(
        f"<tr class='problem' data-problem='{_e(p.key)}'><td>{_badge(p.severity)}</td>"
        f"<td><b>{markup_html(p.title)}</b></td><td>{markup_html(p.impact)}</td>"
        f"<td>{markup_html(p.action.text)}<br><code>{_e(p.action.command)}</code> "
        f"<span class='k'>({_e(_KIND_LABELS.get(p.action.kind, p.action.kind))})</span></td>"
        f"<td>{len(p.findings):,}</td></tr>"
        for p in problems[:max_rows]
    )
    head = (
        "<tr><th>severity</th><th>issue</th><th>impact</th><th>what fixes it</th>"
        "<th>findings</th></tr>"
    )
    return (
        f"<div>{_e(plural(len(problems), 'issue'))}: {badges} "
        f"<span class='k'>({_e(plural(n_findings, 'finding'))})</span></div>"
        f"<table>{head}{rows}</table>"
        f"{_more(len(problems), max_rows, plural(2, 'issue', number=False))}"
    )


def severity_badge(severity: object) -> str:
    """A small coloured label: error, warning or info (inline style: shows everywhere)."""
    return _badge(severity)


def _badge(severity: object, text: str | None = None) -> str:
    sev = str(severity)
    color = _SEVERITY_COLORS.get(sev, "#7f7f7f")
    return f'<span class="sev" style="background:{color}">{_e(text or sev)}</span>'


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


def markup_html(value: object, *, limit: int = MESSAGE_LIMIT) -> str:
    """A message of the project's (a finding, an issue, a fix, the verification line) for
    HTML: `legible_markup`, its `commands` as `<code>` elements, never literal backticks."""
    return legible_markup(value, target="html", limit=limit)


def html_text(value: object, *, limit: int = MESSAGE_LIMIT) -> str:
    """Checkpoint text (a name, a path, a message, an error) for HTML element text or an
    attribute value: `legible` for HTML (at most `limit` characters, control characters
    escaped, `&<>"'` escaped). The dashboard and the report build their HTML with it."""
    return legible(value, target="html", limit=limit)


_e = html_text


def _name(value: object) -> str:
    """A file or tensor name for an element or an attribute value (`legible`)."""
    return legible(value, target="html", limit=NAME_LIMIT)


def _fix_text(code: str) -> str:
    """`kind: what to do` of a known code, "" for an unknown one."""
    try:
        fix = code_of(code).fix
    except ValueError:
        return ""
    return f"{fix.kind}: {fix.text}"
