"""Every judgement about a checkpoint lives here, one module per concern; the layout readers
only read. `check(scanned)` runs the scan's problems, every rule registered for the layout
and, with `model=True`, the model rules (`inspector.checks.registry`). Pure functions only."""

from __future__ import annotations

from typing import TYPE_CHECKING

from inspector.checks.registry import (
    MODEL_RULES,
    RULES,
    ModelRule,
    Rule,
    model_rules_for,
    rules_for,
)
from inspector.findings import Finding, sort_findings
from inspector.model import ScannedCheckpoint

if TYPE_CHECKING:
    from inspector.model_load import LoadVerdict

__all__ = [
    "MODEL_RULES",
    "RULES",
    "ModelRule",
    "Rule",
    "check",
    "check_layout",
    "model_rules_for",
    "rules_for",
]


def check(
    scanned: ScannedCheckpoint,
    *,
    deep: bool = False,
    model: bool = True,
    trust_remote_code: bool = False,
    verdict: LoadVerdict | None = None,
) -> list[Finding]:
    """All findings: those met while scanning, the layout's drift checks, structural checks,
    with `model=True` what the model code itself would load (`inspector.model_load`; skipped
    without transformers or for an architecture it does not know; `verdict` reuses one
    computed by the caller), and with `deep=True` the ones that need tensor data (zeros,
    NaN/Inf, duplicate bytes).

    Sorted worst first, then by code and file; exact duplicates are dropped.
    """
    found: list[Finding] = list(scanned.problems)
    for rule in rules_for(scanned.layout):
        found.extend(rule.run(scanned))
    model_rules = model_rules_for(scanned.layout) if model else ()
    if model_rules:
        from inspector.model_load import load_verdict

        # Built once for every model rule: building the model is the expensive part.
        verdict = verdict or load_verdict(scanned, trust_remote_code=trust_remote_code)
        for model_rule in model_rules:
            found = model_rule.run(scanned, verdict, found)
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
