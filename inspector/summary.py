"""The scan summary: a plain dict (the `--json` contract, exact names) and its readable
rendering (names and messages through `inspector.display.legible`)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from inspector.display import MESSAGE_LIMIT, legible
from inspector.findings import Finding, fold_ranges, severity_rank
from inspector.model import ScannedCheckpoint
from inspector.units import format_bytes

__all__ = ["format_summary", "summarize"]


def summarize(
    scanned: ScannedCheckpoint, *, problems: list[Finding] | None = None
) -> dict[str, Any]:
    """The scan as one JSON-ready object.

    Keys: path, layout, files, tensors, total_bytes, parameters, layers, moe_layers,
    experts_per_layer, mtp_layers, dtypes, experts_found, problems.
    """
    tensors, layers = scanned.tensors, scanned.layers
    decoder = layers[~layers["is_mtp"]] if len(layers) else layers
    moe = decoder[decoder["kind"] == "moe"] if len(decoder) else decoder
    found = dict(zip(moe["layer"].tolist(), moe["experts_found"].tolist(), strict=True))
    spec = scanned.spec
    expected = spec.experts_per_layer or (max(found.values()) if found else None)
    by_dtype = tensors.groupby("dtype", observed=True)["nbytes"].sum().sort_values(ascending=False)
    issues = scanned.problems if problems is None else problems
    return {
        "path": str(scanned.path),
        "layout": scanned.layout,
        "files": len(scanned.files),
        "tensors": len(tensors),
        "total_bytes": int(tensors["nbytes"].sum()),
        "parameters": int(tensors["numel"].sum()),
        "layers": len(decoder),
        "moe_layers": len(moe),
        "experts_per_layer": expected,
        "mtp_layers": int(layers["is_mtp"].sum()) if len(layers) else 0,
        "dtypes": {str(k): int(v) for k, v in by_dtype.items()},
        "experts_found": found,
        "config": {
            "model_type": spec.model_type,
            "num_layers": spec.num_layers,
            "experts_per_layer": spec.experts_per_layer,
            "mtp_layers": spec.mtp_layers,
        },
        "problems": [_problem(f) for f in sorted(issues, key=lambda f: severity_rank(f.severity))],
    }


def format_summary(summary: dict[str, Any], *, max_problems: int = 20) -> str:
    """A few aligned lines a person reads in a terminal."""
    lines = [
        f"checkpoint  {legible(summary['path'])}",
        f"layout      {summary['layout']}",
        f"files       {summary['files']:,}",
        f"tensors     {summary['tensors']:,}  ({format_bytes(summary['total_bytes'])}, "
        f"{summary['parameters']:,} parameters)",
        "dtypes      "
        + ", ".join(f"{legible(k)} {format_bytes(v)}" for k, v in summary["dtypes"].items()),
        _layers_line(summary),
    ]
    if summary["moe_layers"]:
        lines.append(_experts_line(summary))
    lines.extend(_problem_lines(summary["problems"], max_problems))
    return "\n".join(lines)


def _layers_line(summary: dict[str, Any]) -> str:
    layers, moe, mtp = summary["layers"], summary["moe_layers"], summary["mtp_layers"]
    text = f"layers      {layers} decoder ({moe} MoE)"
    if mtp:
        text += f" + {mtp} MTP"
    declared = summary["config"]["num_layers"]
    if declared is not None and declared != layers:
        text += f"; config.json declares {declared}"
    return text


def _experts_line(summary: dict[str, Any]) -> str:
    found: dict[int, int] = summary["experts_found"]
    expected = summary["experts_per_layer"]
    counts = Counter(found.values())
    if len(counts) == 1 and expected in counts:
        return f"experts     {expected} per MoE layer, all present"
    parts = [
        f"{n} in layers {fold_ranges(layer for layer, c in found.items() if c == n)}"
        for n in sorted(counts)
    ]
    return f"experts     expected {expected} per MoE layer; found " + "; ".join(parts)


def _problem_lines(problems: list[dict[str, Any]], limit: int) -> list[str]:
    if not problems:
        return ["problems    none"]
    counts = Counter(p["severity"] for p in problems)
    head = ", ".join(
        f"{counts[s]} {s}{'s' if counts[s] != 1 else ''}"
        for s in ("error", "warning", "info")
        if counts[s]
    )
    lines = [f"problems    {len(problems)} ({head})"]
    for p in problems[:limit]:
        message = legible(p["message"], limit=MESSAGE_LIMIT)
        lines.append(f"  {p['severity']:<7} {p['code']:<26} {message}")
    if len(problems) > limit:
        lines.append(f"  ... {len(problems) - limit} more (use --json for all)")
    return lines


def _problem(f: Finding) -> dict[str, Any]:
    return {
        "code": f.code,
        "severity": str(f.severity),
        "message": f.message,
        "file": f.file,
        "tensor": f.tensor,
        "layer": f.layer,
        "expert": f.expert,
    }
