"""A short Markdown summary of a scan and its findings, to paste into a bug report. Pure.

A checkpoint chooses its names, and the summary is rendered where people open it (GitHub,
nbconvert's mistune, JupyterLab): every name is an inline code span and every message
escaped Markdown text (`inspector._internal.common.display.legible`, targets "markdown-code" and
"markdown"), so nothing in a name becomes HTML, a link, an image, math or a table cell."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from inspector._internal.checkpoint.scanned import ScannedCheckpoint
from inspector._internal.common.display import MESSAGE_LIMIT, legible, legible_markup
from inspector._internal.common.text import fold_ranges, plural
from inspector._internal.common.units import format_bytes
from inspector._internal.diagnosis.issues import group_issues
from inspector._internal.findings.finding import Finding
from inspector._internal.findings.words import grouped_by_code, severity_counts, severity_tally
from inspector._internal.integrity.verified import verification_line
from inspector._internal.report.fit import fit_markdown
from inspector._internal.report.summary import experts_text, summarize
from inspector._internal.report.text import count_text, fix_once
from inspector._internal.serve.fit import FitResult

if TYPE_CHECKING:
    from inspector._internal.load.verdict import LoadVerdict

__all__ = ["markdown_summary"]


def markdown_summary(
    scanned: ScannedCheckpoint,
    findings: Sequence[Finding],
    *,
    examples: int = 3,
    verdict: LoadVerdict | None = None,
    serving: FitResult | None = None,
) -> str:
    """Layout and counts, the load verdict (will it load? what is missing, unexpected or
    mis-shaped, or why the check was skipped), a table of findings per code (severity,
    count, folded layers, experts and files) and the first `examples` messages of each code;
    with `serving` (a `fit` result), the parallel plans: will it serve?"""
    summary = summarize(scanned, findings=list(findings))
    lines = [f"### Checkpoint inspection: {_code(scanned.path.name)}", ""]
    lines += [*_facts(summary), f"- {_inline(verification_line(scanned))}"]
    if verdict is not None:
        lines += _load_lines(verdict, examples)
    lines += _findings_lines(findings, scanned, verdict, examples)
    if serving is not None:
        lines += ["", *fit_markdown(serving)]
    return "\n".join(lines) + "\n"


def _findings_lines(
    findings: Sequence[Finding],
    scanned: ScannedCheckpoint,
    verdict: LoadVerdict | None,
    examples: int,
) -> list[str]:
    """The issues, the table of findings per code and the first messages of each code."""
    lines: list[str] = []
    groups = grouped_by_code(findings)
    if not groups:
        return ["", "No findings."]
    lines += ["", "**Issues** (findings grouped by root cause, each with its fix)", ""]
    for p in group_issues(scanned, findings, verdict=verdict):
        lines.append(
            f"- **{p.severity}**: {_inline(p.title)}. Impact: {_inline(p.impact)}. "
            f"Fix: {_inline(p.action.text)} ({_code(p.action.command)})"
        )
    lines += [
        "",
        "| severity | code | count | layers | experts | files |",
        "|---|---|---:|---|---|---|",
    ]
    table = scanned.layers
    mtp = set(table.loc[table["is_mtp"], "layer"].astype(int)) if len(table) else set()
    lines += [_table_row(code, items, mtp) for code, items in groups]
    for code, items in groups:
        rows = [f.to_dict() for f in items]
        fix, messages = fix_once(code, [f.message for f in items[:examples]])
        lines += ["", f"**{code}**: {_inline(count_text(rows))}"]
        if fix:
            lines.append(f"- fix: {_inline(fix)}")
        lines += [f"- {_inline(m)}" for m in messages]
        if len(items) > examples:
            more = plural(len(items) - examples, "more finding")
            lines.append(f"- ... {more} (`ckpt-inspect check --verbose` lists every one)")
    return lines


def _facts(summary: dict[str, Any]) -> list[str]:
    s = summary
    layers = f"{s['layers']} decoder ({s['moe_layers']} MoE)"
    if s["mtp_layers"]:
        layers += f" + {s['mtp_layers']} MTP"
    declared = s["config"]["num_layers"]
    if declared is not None and declared != s["layers"]:
        layers += f"; config declares {declared}"
    facts = [
        f"- layout: `{s['layout']}`",
        f"- files: {s['files']:,}; tensors: {s['tensors']:,} ({format_bytes(s['total_bytes'])}); "
        f"parameters: {s['parameters']:,} ({s['parameters_rule']})",
        f"- layers: {layers}",
    ]
    if s["moe_layers"]:
        facts.append(f"- experts: {experts_text(s)}")
    counts = severity_tally(s["findings"])
    facts.append(f"- findings: {severity_counts(counts, zeros=True)}")
    return facts


def _load_lines(verdict: LoadVerdict, examples: int) -> list[str]:
    """'- will it load: ...' and, when it does not, the first keys of each kind."""
    arch = _code(verdict.architecture or "?")
    if verdict.skipped is not None:
        return [f"- will it load: not checked ({_inline(verdict.skipped)})"]
    notes = []
    if verdict.parameters is not None:
        notes.append(verdict.parameters_text())
    if verdict.quantization:
        notes.append(f"quantization: {_inline(verdict.quantization)}")
    if verdict.mtp_skipped:
        notes.append(f"{len(verdict.mtp_skipped):,} MTP tensors transformers skips")
    tail = f" ({'; '.join(notes)})" if notes else ""
    if verdict.loads and not verdict.unexpected:
        return [f"- will it load: yes, as {arch}{tail}"]
    answer = "yes, with tensors it ignores" if verdict.loads else "**no**"
    lines = [f"- will it load: {answer}, as {arch}{tail}"]
    kinds = (
        ("missing", list(verdict.missing)),
        (
            "with another shape",
            [f"{m.key} {list(m.stored)} (expected {list(m.expected)})" for m in verdict.mismatched],
        ),
        ("unexpected", list(verdict.unexpected)),
    )
    for kind, keys in kinds:
        if keys:
            shown = ", ".join(_code(k) for k in keys[:examples])
            more = f" and {len(keys) - examples:,} more" if len(keys) > examples else ""
            lines.append(f"  - {len(keys):,} {kind}: {shown}{more}")
    return lines


def _table_row(code: str, items: list[Finding], mtp: set[int]) -> str:
    numbers = {f.layer for f in items if f.layer is not None}
    decoder = fold_ranges((n for n in numbers if n not in mtp), limit=6)
    extra = fold_ranges((n for n in numbers if n in mtp), limit=6)
    layers = ", ".join(p for p in (decoder, f"MTP {extra}" if extra else "") if p)
    experts = fold_ranges((f.expert for f in items if f.expert is not None), limit=6)
    files = sorted({f.file for f in items if f.file})
    shown = ", ".join(_code(name) for name in files[:2])
    if len(files) > 2:
        shown += f" and {len(files) - 2} more"
    cells = [str(items[0].severity), f"`{code}`", f"{len(items):,}", layers, experts, shown]
    return "| " + " | ".join(_cell(c) for c in cells) + " |"


def _inline(text: str) -> str:
    """A message as one line of escaped Markdown, its `commands` as code spans
    (`legible_markup`). Not cut: a finding's message is bounded already (`MESSAGE_LIMIT`),
    and a message cut short in a bug report loses the part that says what to do."""
    return legible_markup(" ".join(text.split()), target="markdown", limit=MESSAGE_LIMIT)


def _code(name: str) -> str:
    """A name as an inline code span nothing in it can break out of."""
    return legible(name, target="markdown-code")


def _cell(text: str) -> str:
    """A table cell, built from Markdown already escaped (a code span escapes its `|`)."""
    return text or " "
