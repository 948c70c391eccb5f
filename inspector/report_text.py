"""`check` results as a JSON-ready dict and as text grouped by code, worst first.

The dicts keep exact names (the `--json` contract); the text shows every name and message
through `inspector.display.legible` (bounded, control characters escaped)."""

from __future__ import annotations

from collections import Counter
from itertools import groupby
from typing import TYPE_CHECKING, Any

from inspector.display import MESSAGE_LIMIT, legible
from inspector.findings import Finding, Severity, severity_rank
from inspector.model import ScannedCheckpoint

if TYPE_CHECKING:
    from inspector.model_load import LoadVerdict

__all__ = ["check_result", "format_check", "format_diff"]


def check_result(
    scanned: ScannedCheckpoint, findings: list[Finding], *, verdict: LoadVerdict | None = None
) -> dict[str, Any]:
    """`{"path", "layout", "findings": [...], "counts": {...}}` (the `check --json` contract),
    plus `"load"` (the load verdict, `LoadVerdict.to_dict()` and its one-line `summary`) when
    the model-aware check ran or was skipped.

    `counts` has one entry per severity and per code.
    """
    ordered = sorted(findings, key=lambda f: (severity_rank(f.severity), f.code))
    by_severity = Counter(str(f.severity) for f in ordered)
    result = {
        "path": str(scanned.path),
        "layout": scanned.layout,
        "findings": [f.to_dict() for f in ordered],
        "counts": {
            **{s.value: by_severity.get(s.value, 0) for s in Severity},
            "by_code": dict(Counter(f.code for f in ordered)),
        },
    }
    if verdict is not None:
        load: dict[str, Any] = {"summary": verdict.summary(), **verdict.to_dict()}
        result["load"] = load
    return result


def format_check(result: dict[str, Any], *, per_code: int = 10) -> str:
    """Findings grouped by code, worst first, at most `per_code` messages per code."""
    counts = result["counts"]
    lines = [f"{legible(result['path'])} ({result['layout']})"]
    if "load" in result:
        lines.append(f"load check: {legible(result['load']['summary'], limit=MESSAGE_LIMIT)}")
    if not result["findings"]:
        lines.append("no findings")
        return "\n".join(lines)
    lines.append(f"{counts['error']} errors, {counts['warning']} warnings, {counts['info']} info")
    for code, group in groupby(result["findings"], key=lambda f: f["code"]):
        items = list(group)
        lines.append(f"\n{items[0]['severity'].upper()} {code} ({len(items)})")
        lines.extend(f"  - {legible(f['message'], limit=MESSAGE_LIMIT)}" for f in items[:per_code])
        if len(items) > per_code:
            lines.append(f"  ... {len(items) - per_code} more (use --json for all)")
    return "\n".join(lines)


def format_diff(d: dict[str, Any], *, limit: int = 20) -> str:
    """A `diff` result (CheckpointDiff.to_dict()) as text."""
    lines = [f"A: {legible(d['a'])}", f"B: {legible(d['b'])}"]
    if d["identical"]:
        compared = (
            f", {d['data_compared']:,} tensors have the same bytes" if d["data_compared"] else ""
        )
        return "\n".join([*lines, f"identical tensor names, dtypes and shapes{compared}"])
    for title, names in (("only in A", d["only_a"]), ("only in B", d["only_b"])):
        if names:
            lines.append(f"{title}: {len(names)}")
            lines.extend(f"  {legible(n)}" for n in names[:limit])
            if len(names) > limit:
                lines.append(f"  ... {len(names) - limit} more")
    if d["changed"]:
        lines.append(f"dtype or shape differs: {len(d['changed'])}")
        for c in d["changed"][:limit]:
            lines.append(
                f"  {legible(c['name'])}: {legible(c['a_dtype'])} {list(c['a_shape'])}"
                f" -> {legible(c['b_dtype'])} {list(c['b_shape'])}"
            )
    for layer in d["layers"][:limit]:
        parts = []
        if layer["only_a"]:
            parts.append("only A: " + ", ".join(map(legible, layer["only_a"][:5])))
        if layer["only_b"]:
            parts.append("only B: " + ", ".join(map(legible, layer["only_b"][:5])))
        lines.append(f"layer {layer['layer']} keys differ: " + "; ".join(parts))
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
    return lines
