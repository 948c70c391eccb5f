"""Drift checks: every finding a checkpoint has, from scanned data. Pure functions only."""

from __future__ import annotations

from inspector.checks.quant import check_quant_config
from inspector.checks.structure import check_structure
from inspector.findings import Finding, severity_rank
from inspector.layouts import layout_by_name
from inspector.model import ScannedCheckpoint
from inspector.progress import reporting, track

__all__ = ["check"]


def check(
    scanned: ScannedCheckpoint, *, deep: bool = False, progress: bool = False
) -> list[Finding]:
    """All findings: those met while scanning, the layout's drift checks, structural checks,
    and with `deep=True` the ones that need tensor data (zeros, NaN/Inf, duplicate bytes).

    Sorted worst first, then by code and file; exact duplicates are dropped. `progress`
    draws a progress bar over the check stages (`tqdm.auto`).
    """
    layout = layout_by_name(scanned.layout)
    stages = [layout.check, check_structure, check_quant_config]
    if deep:
        from inspector.deep import deep_check

        stages.append(deep_check)
    found: list[Finding] = list(scanned.problems)
    with reporting(progress):
        for stage in track(stages, desc="checks", unit="stage"):
            found += stage(scanned)
    unique = list(dict.fromkeys(found))
    return sorted(
        unique, key=lambda f: (severity_rank(f.severity), f.code, f.file or "", f.tensor or "")
    )
