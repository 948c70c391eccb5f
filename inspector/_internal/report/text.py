"""`check` results as a JSON-ready dict and as text: the issues, then one line per code.

The dicts keep exact names (the `--json` contract); the text shows every name and message
through `inspector._internal.common.display.legible` (bounded, control characters escaped)."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence
from itertools import groupby
from typing import TYPE_CHECKING, Any

from inspector._internal.checkpoint.scanned import ScannedCheckpoint
from inspector._internal.common.display import MESSAGE_LIMIT, legible
from inspector._internal.common.text import examples, layer_name, plural, shell_word
from inspector._internal.diagnosis.issues import Issue, group_issues
from inspector._internal.findings.codes import code_of
from inspector._internal.findings.finding import Finding, Severity, severity_rank
from inspector._internal.findings.words import FINDING, ISSUE, severity_counts, severity_tally

if TYPE_CHECKING:
    from inspector._internal.load.verdict import LoadVerdict
    from inspector._internal.serve.engine import EngineReport

__all__ = [
    "JSON_NAMES",
    "check_result",
    "code_lines",
    "count_text",
    "engine_lines",
    "finding_lines",
    "fix_once",
    "format_check",
    "format_diff",
    "issue_dict",
    "issue_lines",
    "shared_clause",
]

# A layer key of one expert ("mlp.experts.17.down_proj.weight").
_EXPERT_KEY = re.compile(r"(?:.*\.)?experts\.\d+\.")


# Names listed per list of the load verdict in `check --json` unless `--full` asks for all.
JSON_NAMES = 10


def check_result(
    scanned: ScannedCheckpoint,
    findings: list[Finding],
    *,
    verdict: LoadVerdict | None = None,
    full: bool = False,
    engine: EngineReport | None = None,
    values: Mapping[str, Any] | None = None,
    notes: Sequence[str] = (),
) -> dict[str, Any]:
    """`{"path", "layout", "findings": [...], "counts": {...}}` (the `check --json` contract),
    plus `"load"` (the load verdict, `LoadVerdict.to_dict()` and its one-line `summary`) when
    the model-aware check ran or was skipped, and `"engine"` (`EngineReport.to_dict()` with its
    one-line `summary` lines) with `check --engine`; the engine's findings are among
    `findings`.

    `counts` has one entry per severity and per code; `issues` are the findings grouped by
    root cause, each with its fix (`diagnosis/issues.py`), worst first; `repair_all`
    is the command that repairs every issue `repair` can, when there is one. The verdict's lists
    (missing, unexpected, quantization-expected... names) keep their first `JSON_NAMES` entries,
    with their full counts under `load.counts`, unless `full`; findings are bounded already (the
    fold policy, `inspector._internal.findings.finding.FOLD`). `values`: what `--values` read
    (`inspector._internal.checks.values.values_read`); `notes`: what the checks looked at and
    did not report, with why (`check_notes`).
    """
    # Within a code, the findings about one thing first, the summaries that fold the rest last.
    ordered = sorted(findings, key=lambda f: (severity_rank(f.severity), f.code, f.folded > 0))
    by_severity = severity_tally(ordered)
    result = {
        "path": str(scanned.path),
        "layout": scanned.layout,
        "findings": [f.to_dict() for f in ordered],
        "counts": {
            **{s.value: by_severity.get(s.value, 0) for s in Severity},
            "by_code": dict(Counter(f.code for f in ordered)),
        },
    }
    problems = group_issues(scanned, findings, verdict=verdict)
    result["issues"] = [issue_dict(p) for p in problems]
    if any(p.action.kind in ("repair", "reshard") for p in problems):
        result["repair_all"] = f"ckpt-inspect repair {shell_word(str(scanned.path))}"
    if values is not None:
        result["values"] = dict(values)
    if notes:
        result["notes"] = list(notes)
    if verdict is not None:
        limit = None if full else JSON_NAMES
        load: dict[str, Any] = {"summary": verdict.summary(), **verdict.to_dict(limit=limit)}
        result["load"] = load
    if engine is not None:
        engine_dict: dict[str, Any] = {**engine.to_dict(), "summary": engine_lines(engine)}
        result["engine"] = engine_dict
    return result


def engine_lines(engine: EngineReport) -> list[str]:
    """What `check --engine` ran, one line each: the engine's verdict, what did not run."""
    lines = []
    if engine.verdict is not None and engine.verdict.ran:
        lines.append(engine.verdict.summary())
    lines += engine.notes
    if not lines:
        found = plural(len(engine.findings), "finding")
        lines.append(f"{engine.engine}: {found}" if engine.findings else f"{engine.engine}: ok")
    return lines


def format_check(result: dict[str, Any], *, verbose: bool = False) -> str:
    """`check` as text that fits a screen: the counts, the issues (root causes, each with its
    fix and which findings it explains), then one line per code saying what its count
    counts. `verbose` adds every finding, grouped by code, the fix said once per code."""
    counts = result["counts"]
    lines = [f"{legible(result['path'])} ({result['layout']})"]
    if "load" in result:
        lines.append(f"load check: {legible(result['load']['summary'], limit=MESSAGE_LIMIT)}")
    for line in result.get("engine", {}).get("summary", []):
        lines.append(f"engine check: {legible(line, limit=MESSAGE_LIMIT)}")
    if result.get("values"):
        lines.append(f"values: {legible(result['values']['summary'], limit=MESSAGE_LIMIT)}")
    lines += [f"note: {legible(n, limit=MESSAGE_LIMIT)}" for n in result.get("notes", ())]
    findings = result["findings"]
    if not findings:
        lines.append("no findings")
        return "\n".join(lines)
    issues = result.get("issues", [])
    lines.append(
        f"{plural(len(findings), FINDING)} ({severity_counts(counts, zeros=True)}) "
        f"in {plural(len(issues), ISSUE)}"
    )
    lines += issue_lines(issues)
    if result.get("repair_all"):
        every = legible(result["repair_all"], limit=MESSAGE_LIMIT)
        lines.append(f"repair every issue above that `repair` fixes, at once: {every}")
    lines += code_lines(findings, verbose=verbose)
    return "\n".join(lines)


def code_lines(findings: Sequence[Mapping[str, Any]], *, verbose: bool = False) -> list[str]:
    """One line per code (findings worst first): severity, code and what its count counts,
    '21 findings on 42 tensors (20 one by one, 22 folded into 1)'. With `verbose`, each
    code's findings follow its line, and the fix it shares (`code_of(code).fix`) is said
    once instead of at the end of every message."""
    groups = [(code, list(items)) for code, items in groupby(findings, key=lambda f: f["code"])]
    width = max(len(code) for code, _ in groups)
    how = "" if verbose else " (--verbose lists every finding)"
    lines = ["", f"findings by code{how}:"]
    for code, items in groups:
        lines.append(f"  {items[0]['severity']!s:<8} {code:<{width}}  {count_text(items)}")
        if verbose:
            lines += _verbose_lines(code, items)
    return lines


def count_text(findings: Sequence[Mapping[str, Any]]) -> str:
    """What a code's count of findings stands for: '1 finding', '4 findings, one per layer',
    '21 findings on 42 tensors (20 one by one, 22 folded into 1)' (`Finding.folded`)."""
    n = len(findings)
    singles = [f for f in findings if not f.get("folded")]
    folded = sum(int(f.get("folded") or 0) for f in findings)
    summaries = n - len(singles)
    unit = _unit(singles)
    if not summaries:
        each = f", one per {unit}" if unit and n > 1 else ""
        return f"{plural(n, FINDING)}{each}"
    on = f" on {plural(len(singles) + folded, unit or 'item')}"
    return (
        f"{plural(n, FINDING)}{on} ({len(singles):,} one by one, {folded:,} folded into "
        f"{summaries:,})"
    )


def _unit(findings: Sequence[Mapping[str, Any]]) -> str:
    """What each of `findings` is about, when they share it: 'tensor', 'layer' or 'file'."""
    for field, unit in (("tensor", "tensor"), ("layer", "layer"), ("file", "file")):
        if findings and all(f.get(field) is not None for f in findings):
            if unit == "file" and len({f["file"] for f in findings}) != len(findings):
                return ""
            return unit
    return ""


def _verbose_lines(code: str, items: Sequence[Mapping[str, Any]]) -> list[str]:
    fix, messages = fix_once(code, [str(f["message"]) for f in items])
    lines = [f"      fix: {legible(fix, limit=MESSAGE_LIMIT)}"] if fix else []
    lines += [f"      - {legible(m, limit=MESSAGE_LIMIT)}" for m in messages]
    return lines


def fix_once(code: str, messages: Sequence[str]) -> tuple[str, list[str]]:
    """(the fix of a code's findings, their messages without it): the remedy the messages
    share (`shared_clause`), else the code's own (`Code.fix`), said once per code instead of
    once per tensor. A lone finding's message says its own remedy: ('', [it])."""
    if len(messages) < 2:
        return "", list(messages)
    shared, out = shared_clause(messages)
    if shared:
        return shared, out
    try:
        return code_of(code).fix.text, out
    except ValueError:  # a finding built by hand with a code of its own
        return "", out


def shared_clause(messages: Sequence[str]) -> tuple[str, list[str]]:
    """The remedy several messages of one code end with ('...; regenerate the sidecar from the
    shard'), said once: (that clause, the messages without it). ('', the messages) when fewer
    than two share their last clause, or cutting it would split a bracket."""
    tails = Counter(m.rsplit("; ", 1)[1] for m in messages if "; " in m)
    if not tails:
        return "", list(messages)
    clause, n = tails.most_common(1)[0]
    if n < 2 or not _balanced(clause):
        return "", list(messages)
    out = []
    for m in messages:
        head, sep, tail = m.rpartition("; ")
        out.append(head if sep and tail == clause and _balanced(head) else m)
    return clause, out


def _balanced(text: str) -> bool:
    return text.count("(") == text.count(")") and text.count("'") % 2 == 0


def finding_lines(findings: Sequence[Mapping[str, Any]], *, per_code: int = 10) -> list[str]:
    """Findings (`Finding.to_dict()`, worst first) as text, grouped by code: a heading with
    the severity and the count, at most `per_code` messages, then how many more (`verify`)."""
    lines: list[str] = []
    for code, group in groupby(findings, key=lambda f: f["code"]):
        items = list(group)
        lines.append(f"\n{str(items[0]['severity']).upper()} {code} ({count_text(items)})")
        lines.extend(f"  - {legible(f['message'], limit=MESSAGE_LIMIT)}" for f in items[:per_code])
        if len(items) > per_code:
            lines.append(f"  ... {len(items) - per_code} more (use --json for all)")
    return lines


def issue_dict(problem: Issue) -> dict[str, Any]:
    """One issue (`Issue`) as JSON: what, how bad, its impact and its fix, and how many
    findings of each code it explains."""
    return {
        "key": problem.key,
        "severity": str(problem.severity),
        "title": problem.title,
        "impact": problem.impact,
        "fix": problem.action.text,
        "fix_kind": problem.action.kind,
        "command": problem.action.command,
        "findings": len(problem.findings),
        "codes": list(problem.codes),
        "by_code": dict(Counter(f.code for f in problem.findings)),
    }


def issue_lines(issues: list[dict[str, Any]]) -> list[str]:
    """The issues as text: severity and title, then the fix, its command and the findings it
    explains (their counts add up to the findings' count), indented."""
    if not issues:
        return []
    lines = ["", f"{plural(len(issues), ISSUE)} (findings grouped by root cause):"]
    for i in issues:
        lines.append(f"  {i['severity']:<7} {legible(i['title'], limit=MESSAGE_LIMIT)}")
        lines.append(f"          fix: {legible(i['fix'], limit=MESSAGE_LIMIT)}")
        lines.append(f"          {legible(i['command'], limit=MESSAGE_LIMIT)}")
        by_code = i.get("by_code")
        if by_code:
            codes = ", ".join(f"{code} x{n}" for code, n in by_code.items())
            lines.append(f"          explains {plural(i['findings'], FINDING)}: {codes}")
    return lines


def format_diff(d: dict[str, Any], *, limit: int = 20) -> str:
    """A `diff` result (CheckpointDiff.to_dict()) as text."""
    lines = [f"A: {legible(d['a'])}", f"B: {legible(d['b'])}"]
    for side in ("a", "b"):
        gone = d.get(f"{side}_missing_shards") or []
        if gone:
            lines.append(
                f"{side.upper()}'s index names {plural(len(gone), 'shard file')} not in its "
                f"folder ({examples(gone)}): their tensors are absent from this comparison"
            )
    if d.get("not_compared"):
        lines.append(
            f"not compared: {plural(len(d['not_compared']), 'tensor')} of B that A's index "
            "maps to its missing shards (not counted as added)"
        )
    if d["identical"]:
        compared = (
            f", {d['data_compared']:,} tensors have the same bytes" if d["data_compared"] else ""
        )
        return "\n".join([*lines, f"identical tensor names, dtypes and shapes{compared}"])
    for side in ("a", "b"):
        names = d[f"only_{side}"]
        if names:
            # By layer and expert ("layer 40: experts 17-19 (36 tensors)"), as `check` says it.
            lines.append(f"only in {side.upper()}: {len(names):,}")
            lines.extend(
                f"  {legible(line, limit=MESSAGE_LIMIT)}" for line in d[f"only_{side}_places"]
            )
    if d["changed"]:
        lines.append(f"dtype or shape differs: {len(d['changed'])}")
        for c in d["changed"][:limit]:
            lines.append(
                f"  {legible(c['name'])}: {legible(c['a_dtype'])} {list(c['a_shape'])}"
                f" -> {legible(c['b_dtype'])} {list(c['b_shape'])}"
            )
    shown = 0
    for layer in d["layers"]:
        # Whole experts lost or added are said above; the rest of a layer's keys here.
        only = {
            side: [k for k in layer[side] if not _EXPERT_KEY.match(k)]
            for side in ("only_a", "only_b")
        }
        parts = [
            f"only {side[-1].upper()}: " + ", ".join(map(legible, keys[:5]))
            for side, keys in only.items()
            if keys
        ]
        if parts and shown < limit:
            name = layer_name(layer["layer"], mtp=layer.get("mtp", False))
            lines.append(f"{name} keys differ: " + "; ".join(parts))
            shown += 1
    if d["data_compared"]:
        lines.append(
            f"content compared: {d['data_compared']:,} tensors, {len(d['data_differs'])} differ"
        )
        lines.extend(f"  bytes differ: {legible(n)}" for n in d["data_differs"][:limit])
    if d["data_unreadable"]:
        lines.append(f"content not readable for {len(d['data_unreadable'])} tensors")
    if d.get("reference") is not None:
        lines += _reference_lines(d)
    return "\n".join(lines)


def _reference_lines(d: dict[str, Any]) -> list[str]:
    """Each difference against the reference A, expected first."""
    classes = sorted(d["reference"], key=lambda c: not c["expected"])
    lines = ["", "against the reference A:"]
    lines += [
        f"  {'expected  ' if c['expected'] else 'UNEXPECTED'} "
        f"{legible(c['detail'], limit=MESSAGE_LIMIT)}"
        for c in classes
    ]
    n = d["unexpected"]
    lines.append(
        f"{n} unexpected difference{'s' if n != 1 else ''}" if n else "every difference is expected"
    )
    if d.get("not_compared"):
        lines.append(
            f"but {plural(len(d['not_compared']), 'tensor')} of B could not be compared: the "
            "reference lacks their shards (exit 1)"
        )
    return lines
