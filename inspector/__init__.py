"""checkpoint-inspector: scan, check and repair large model checkpoints from their headers."""

from inspector.checks import check

# `inspector.consolidate` stays the module (a same-named function here would shadow it).
from inspector.consolidate import plan_consolidation
from inspector.diff import diff_checkpoints
from inspector.errors import CannotInspectError, InspectorError, PlanRefusedError
from inspector.findings import CODES, Finding, Severity, findings_to_frame
from inspector.integrity import Verification, verify, write_manifest
from inspector.model import ScannedCheckpoint
from inspector.model_load import LoadVerdict, load_verdict
from inspector.repair import plan_repair
from inspector.reshard import plan_reshard
from inspector.restore import plan_restore
from inspector.scan import scan

__all__ = [
    "CODES",
    "CannotInspectError",
    "Finding",
    "InspectorError",
    "LoadVerdict",
    "PlanRefusedError",
    "ScannedCheckpoint",
    "Severity",
    "Verification",
    "check",
    "diff_checkpoints",
    "findings_to_frame",
    "load_verdict",
    "plan_consolidation",
    "plan_repair",
    "plan_reshard",
    "plan_restore",
    "scan",
    "verify",
    "write_manifest",
]

__version__ = "0.1.0"
