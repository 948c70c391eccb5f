"""checkpoint-inspector: scan, check and repair large model checkpoints from their headers."""

from inspector._internal.checkpoint.scan import scan
from inspector._internal.checkpoint.scanned import ScannedCheckpoint
from inspector._internal.checks import check
from inspector._internal.checks.diff import diff_checkpoints
from inspector._internal.findings.finding import CODES, Finding, Severity, findings_to_frame
from inspector._internal.findings.issues import Problem, group_problems
from inspector._internal.integrity.verify import Verification, verify, write_manifest
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
from inspector._internal.serve.fit import FitResult, ParallelPlan, fit
from inspector.errors import CannotInspectError, InspectorError, PlanRefusedError

__all__ = [
    "CODES",
    "CannotInspectError",
    "ConsolidationOptions",
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

__version__ = "0.1.0"
