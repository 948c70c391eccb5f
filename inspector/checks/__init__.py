"""Every judgement about a checkpoint lives here, one module per concern; the layout readers
only read. `check(scanned)` runs the scan's problems and every rule registered for the
layout (`inspector.checks.registry`). Pure functions only."""

from __future__ import annotations

from inspector.checks.registry import RULES, Rule, rules_for
from inspector.findings import Finding, sort_findings
from inspector.model import ScannedCheckpoint

__all__ = ["RULES", "Rule", "check", "check_layout", "rules_for"]


def check(scanned: ScannedCheckpoint, *, deep: bool = False) -> list[Finding]:
    """All findings: those met while scanning, the layout's drift checks, structural checks,
    and with `deep=True` the ones that need tensor data (zeros, NaN/Inf, duplicate bytes).

    Sorted worst first, then by code and file; exact duplicates are dropped.
    """
    found: list[Finding] = list(scanned.problems)
    for rule in rules_for(scanned.layout):
        found.extend(rule.run(scanned))
    if deep:
        from inspector.deep import deep_check

        found += deep_check(scanned)
    return sort_findings(found)


def check_layout(scanned: ScannedCheckpoint) -> list[Finding]:
    """Only the rules registered for this layout by name (not the structure and quant-config
    rules every layout runs), unsorted; the scan's own problems are not included."""
    return [
        f
        for rule in rules_for(scanned.layout)
        if rule.layouts is not None
        for f in rule.run(scanned)
    ]
