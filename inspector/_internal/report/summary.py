"""The scan summary: a plain dict (the `--json` contract, exact names) and its readable
rendering (names and messages through `inspector._internal.common.display.legible`).

A scan reads headers and JSON files and runs no check, so its summary never says "no
problems": it says what it could not read (`read_findings`) and that the checks did not run
(`checked: false`, with the command that runs them). The words are
`inspector._internal.findings.words`'."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np

from inspector._internal.checkpoint.parameters import PARAMETER_RULE, scan_parameters
from inspector._internal.checkpoint.scanned import ScannedCheckpoint
from inspector._internal.checkpoint.tables import scan_figures
from inspector._internal.common.display import MESSAGE_LIMIT, legible
from inspector._internal.common.text import layers_text, plural, shell_word
from inspector._internal.common.units import format_bytes
from inspector._internal.findings.finding import Finding, severity_rank
from inspector._internal.findings.words import severity_counts, severity_tally

__all__ = ["experts_text", "format_summary", "has_expert_grid", "summarize"]


def summarize(
    scanned: ScannedCheckpoint, *, findings: list[Finding] | None = None
) -> dict[str, Any]:
    """The scan as one JSON-ready object.

    Keys: path, layout, files, tensors, total_bytes, parameters (values, counted as
    `parameters_rule` says: `inspector._internal.checkpoint.parameters`), layers, moe_layers,
    experts_per_layer, mtp_layers, mtp_layer_numbers, dtypes, experts_found (per MoE layer,
    MTP layers with experts included), config, read_findings (what the scan could
    not read or parse: a part of what `check` reports), checked, check_command; and findings (every
    finding, worst first) when `findings` (from `check`) are given: then `checked` is true.
    """
    # From the numpy columns the tables are built from: a scan that only prints its summary
    # builds no frame and does not import pandas.
    figures = scan_figures(scanned)
    layer, is_mtp = figures.layer, figures.is_mtp
    moe = ~is_mtp & np.asarray([kind == "moe" for kind in figures.kind], dtype=bool)
    found = dict(zip(layer[moe].tolist(), figures.experts_found[moe].tolist(), strict=True))
    # MTP layers with experts count them too, said apart ("layers 1-3 and MTP layer 4").
    mtp_moe = is_mtp & (figures.experts_found > 0)
    found |= dict(
        zip(layer[mtp_moe].tolist(), figures.experts_found[mtp_moe].tolist(), strict=True)
    )
    spec = scanned.spec
    expected = spec.experts_per_layer or (max(found.values()) if found else None)
    read = sorted(scanned.read_findings, key=lambda f: severity_rank(f.severity))
    out = {
        "path": str(scanned.path),
        "layout": scanned.layout,
        "files": figures.files,
        "tensors": figures.tensors,
        "total_bytes": figures.total_bytes,
        "parameters": scan_parameters(scanned),
        "parameters_rule": PARAMETER_RULE,
        "layers": int((~is_mtp).sum()),
        "moe_layers": int(moe.sum()),
        "experts_per_layer": expected,
        "mtp_layers": int(is_mtp.sum()),
        "mtp_layer_numbers": [int(n) for n in layer[is_mtp].tolist()],
        "dtypes": dict(figures.dtype_bytes),
        "experts_found": found,
        "config": {
            "model_type": spec.model_type,
            "num_layers": spec.num_layers,
            "experts_per_layer": spec.experts_per_layer,
            "mtp_layers": spec.mtp_layers,
        },
        "read_findings": [_finding(f) for f in read],
        "checked": findings is not None,
        "check_command": f"ckpt-inspect check {shell_word(str(scanned.path))}",
    }
    if findings is not None:
        ordered = sorted(findings, key=lambda f: severity_rank(f.severity))
        out["findings"] = [_finding(f) for f in ordered]
    return out


def format_summary(summary: dict[str, Any], *, max_findings: int = 20) -> str:
    """A few aligned lines a person reads in a terminal."""
    lines = [
        f"checkpoint  {legible(summary['path'])}",
        f"layout      {summary['layout']}",
        f"files       {summary['files']:,}",
        f"tensors     {summary['tensors']:,}  ({format_bytes(summary['total_bytes'])})",
        f"parameters  {summary['parameters']:,}  ({summary['parameters_rule']})",
        "dtypes      "
        + ", ".join(f"{legible(k)} {format_bytes(v)}" for k, v in summary["dtypes"].items()),
        _layers_line(summary),
    ]
    if summary["moe_layers"]:
        lines.append(_experts_line(summary))
    lines.extend(_finding_lines(summary, max_findings))
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
    return f"experts     {experts_text(summary)}"


def has_expert_grid(scanned: ScannedCheckpoint) -> bool:
    """Whether the experts table has rows: the expert coverage heatmap has cells to show.
    From the summary's figures when a layer holds expert tensors (no table is built: the
    dashboard asks before its Overview and snapshot are sent); else from the table itself,
    as a config that declares experts none of which is stored still has a grid of them,
    all missing."""
    if bool((scan_figures(scanned).experts_found > 0).any()):
        return True  # the rows of those experts
    return bool(len(scanned.experts))


def experts_text(summary: dict[str, Any]) -> str:
    """The experts of the MoE layers (MTP layers said apart) against what is expected of each:
    '512 per MoE layer, all present', or 'expected 512 per MoE layer; found 64 in layers 1-3
    and MTP layer 4 (448 of 512 missing in each)'. The scan, `check`, the Markdown summary and
    the reports say it so (a bare 512 where 448 are missing hides the loss)."""
    found: dict[int, int] = summary["experts_found"]
    expected = summary["experts_per_layer"]
    if not found:
        return "none found"
    mtp = set(summary.get("mtp_layer_numbers", ()))
    counts = Counter(found.values())
    if len(counts) == 1 and expected in counts:
        return f"{expected} per MoE layer, all present"
    parts = []
    for n in sorted(counts):
        layers = [layer for layer, c in found.items() if c == n]
        where = layers_text(layers, mtp=mtp)
        short = ""
        if expected is not None and n < expected:
            each = " in each" if len(layers) > 1 else ""
            short = f" ({expected - n:,} of {expected:,} missing{each})"
        parts.append(f"{n:,} in {where}{short}")
    return f"expected {expected} per MoE layer; found " + "; ".join(parts)


def _finding_lines(summary: dict[str, Any], limit: int) -> list[str]:
    """What the scan could not read, and whether the checks ran (and what they found)."""
    read: list[dict[str, Any]] = summary["read_findings"]
    lines = []
    if read:
        counts = severity_tally(read)
        lines.append(
            f"read        {plural(len(read), 'finding')} while reading files "
            f"({severity_counts(counts)})"
        )
        lines.extend(_listed(read, limit))
    else:
        lines.append("read        every shard header and JSON file was read")
    if not summary["checked"]:
        command = legible(summary["check_command"], limit=MESSAGE_LIMIT)
        lines.append(
            f"checks      not run by scan; `{command}` runs every check "
            "(drift, missing tensors, will it load)"
        )
        return lines
    found: list[dict[str, Any]] = summary["findings"]
    counts = severity_tally(found)
    lines.append(
        f"findings    {plural(len(found), 'finding')} ({severity_counts(counts)})"
        if found
        else "findings    none"
    )
    lines.extend(_listed(found, limit))
    return lines


def _listed(findings: list[dict[str, Any]], limit: int) -> list[str]:
    lines = [
        f"  {f['severity']:<7} {f['code']:<26} {legible(f['message'], limit=MESSAGE_LIMIT)}"
        for f in findings[:limit]
    ]
    if len(findings) > limit:
        lines.append(f"  ... {len(findings) - limit:,} more (use --json for all)")
    return lines


def _finding(f: Finding) -> dict[str, Any]:
    return {
        "code": f.code,
        "severity": str(f.severity),
        "message": f.message,
        "file": f.file,
        "tensor": f.tensor,
        "layer": f.layer,
        "expert": f.expert,
    }
