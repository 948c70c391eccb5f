"""checkpoint-inspector: scan, check and repair large model checkpoints from their headers."""

from typing import TYPE_CHECKING, Any

from inspector._internal.common.lazy import lazy_names
from inspector.errors import CannotInspectError, InspectorError, PlanRefusedError

if TYPE_CHECKING:
    __version__: str
    from inspector._internal.checkpoint.scanned import ScannedCheckpoint
    from inspector._internal.checks import check
    from inspector._internal.checks.diff import diff_checkpoints
    from inspector._internal.diagnosis.issues import Problem, group_problems
    from inspector._internal.findings.finding import CODES, Finding, Severity, findings_to_frame
    from inspector._internal.integrity.verify import Verification, verify, write_manifest
    from inspector._internal.load.engine import EngineVerdict
    from inspector._internal.load.verdict import LoadVerdict, load_verdict
    from inspector._internal.plans.consolidate import (
        ConsolidationOptions,
        consolidate,
        plan_consolidation,
    )
    from inspector._internal.plans.repair import plan_repair
    from inspector._internal.plans.repair_all import plan_all
    from inspector._internal.plans.reshard import plan_reshard
    from inspector._internal.plans.restore import plan_restore
    from inspector._internal.report.query import TensorQuery, export_tensors
    from inspector._internal.scan.entry import scan
    from inspector._internal.serve.engine import EngineReport, engine_check
    from inspector._internal.serve.fit import FitResult, ParallelPlan, fit

# Each public name and the module that defines it: imported on first access (PEP 562) so that
# `import inspector` and `ckpt-inspect --version` do not pay for pandas, torch and friends.
_LAZY: dict[str, str] = {
    "CODES": "inspector._internal.findings.finding",
    "ConsolidationOptions": "inspector._internal.plans.consolidate",
    "EngineReport": "inspector._internal.serve.engine",
    "EngineVerdict": "inspector._internal.load.engine",
    "Finding": "inspector._internal.findings.finding",
    "FitResult": "inspector._internal.serve.fit",
    "LoadVerdict": "inspector._internal.load.verdict",
    "ParallelPlan": "inspector._internal.serve.fit",
    "Problem": "inspector._internal.diagnosis.issues",
    "ScannedCheckpoint": "inspector._internal.checkpoint.scanned",
    "Severity": "inspector._internal.findings.finding",
    "TensorQuery": "inspector._internal.report.query",
    "Verification": "inspector._internal.integrity.verify",
    "check": "inspector._internal.checks",
    "consolidate": "inspector._internal.plans.consolidate",
    "diff_checkpoints": "inspector._internal.checks.diff",
    "engine_check": "inspector._internal.serve.engine",
    "export_tensors": "inspector._internal.report.query",
    "findings_to_frame": "inspector._internal.findings.finding",
    "fit": "inspector._internal.serve.fit",
    "group_problems": "inspector._internal.diagnosis.issues",
    "load_verdict": "inspector._internal.load.verdict",
    "plan_all": "inspector._internal.plans.repair_all",
    "plan_consolidation": "inspector._internal.plans.consolidate",
    "plan_repair": "inspector._internal.plans.repair",
    "plan_reshard": "inspector._internal.plans.reshard",
    "plan_restore": "inspector._internal.plans.restore",
    "scan": "inspector._internal.scan.entry",
    "verify": "inspector._internal.integrity.verify",
    "write_manifest": "inspector._internal.integrity.verify",
}

__all__ = [
    "CODES",
    "CannotInspectError",
    "ConsolidationOptions",
    "EngineReport",
    "EngineVerdict",
    "Finding",
    "FitResult",
    "InspectorError",
    "LoadVerdict",
    "ParallelPlan",
    "PlanRefusedError",
    "Problem",
    "ScannedCheckpoint",
    "Severity",
    "TensorQuery",
    "Verification",
    "check",
    "consolidate",
    "diff_checkpoints",
    "engine_check",
    "export_tensors",
    "findings_to_frame",
    "fit",
    "group_problems",
    "load_verdict",
    "plan_all",
    "plan_consolidation",
    "plan_repair",
    "plan_reshard",
    "plan_restore",
    "scan",
    "verify",
    "write_manifest",
]

_public, __dir__ = lazy_names(__name__, _LAZY, [*__all__, "__version__"])


def __getattr__(name: str) -> Any:
    if name != "__version__":
        return _public(name)
    # Looked up when read, not at import: importlib.metadata and the search of the installed
    # distributions cost every command about 25 ms, and only `--version` reads it.
    from importlib import metadata

    try:
        version = metadata.version("checkpoint-inspector")
    except metadata.PackageNotFoundError:  # a source tree that is not installed
        version = "0+unknown"
    globals()["__version__"] = version
    return version
