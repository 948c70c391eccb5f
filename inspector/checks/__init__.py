"""Drift checks: every finding a checkpoint has, from scanned data. Pure functions only."""

from __future__ import annotations

from typing import TYPE_CHECKING

from inspector.checks.quant import check_quant_config
from inspector.checks.structure import check_structure
from inspector.findings import Finding, severity_rank
from inspector.layouts import layout_by_name
from inspector.model import ScannedCheckpoint

if TYPE_CHECKING:
    from inspector.model_load import LoadVerdict

__all__ = ["check"]


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
    layout = layout_by_name(scanned.layout)
    found: list[Finding] = [
        *scanned.problems,
        *layout.check(scanned),
        *check_structure(scanned),
        *check_quant_config(scanned),
    ]
    if model:
        from inspector.checks.index import reconcile_total_parameters
        from inspector.checks.load import check_load
        from inspector.model_load import load_verdict

        verdict = verdict or load_verdict(scanned, trust_remote_code=trust_remote_code)
        found = reconcile_total_parameters(found, scanned.index, verdict.parameters)
        found += check_load(scanned, verdict)
    if deep:
        from inspector.deep import deep_check

        found += deep_check(scanned)
    unique = list(dict.fromkeys(found))
    return sorted(
        unique, key=lambda f: (severity_rank(f.severity), f.code, f.file or "", f.tensor or "")
    )
