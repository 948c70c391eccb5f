"""The core as the notebook UI sees it: the one module `inspector.widgets` imports from the
core (a test keeps it so). The dashboard, the HTML report and the snapshot show what these
functions compute and hold no rule of their own; a fact the UI needs that the core does not
compute yet is added to the core and named here, never derived in the UI.

Importing it loads the scan, the checks, the plans and the renderers (pandas included): the
UI needs them all, and `import inspector` stays light without it.
"""

from __future__ import annotations

from inspector._internal.checkpoint.scanned import ScannedCheckpoint
from inspector._internal.checks import check
from inspector._internal.checks.values import computed_value_table, value_table
from inspector._internal.cli.args import (
    EXIT_CANNOT,
    EXIT_OK,
    add_model_arguments,
    add_path_arguments,
    scan_from_args,
    verdict_from_args,
)
from inspector._internal.common.display import MESSAGE_LIMIT, NAME_LIMIT, legible, legible_each
from inspector._internal.common.dtypes import KV_CACHE_DTYPES
from inspector._internal.common.text import fold_ranges, layer_name, plural
from inspector._internal.common.units import (
    DECIMAL_UNITS,
    SHARD_SPLIT_SIZE,
    format_bytes,
    scale_for,
)
from inspector._internal.diagnosis.issues import Problem, group_problems
from inspector._internal.diagnosis.references import consolidation_reference, restore_reference
from inspector._internal.execution.atomic import write_atomic
from inspector._internal.findings.finding import (
    Finding,
    findings_per_file,
    findings_to_frame,
    severity_rank,
)
from inspector._internal.findings.words import (
    FINDING,
    ISSUE,
    SEVERITY_ORDER,
    severity_counts,
    severity_tally,
)
from inspector._internal.integrity.verified import verification_line
from inspector._internal.load.child import verdict_apart
from inspector._internal.load.verdict import LoadVerdict, known_verdict
from inspector._internal.plans.consolidate import default_destination, plan_consolidation
from inspector._internal.plans.repair import RepairPlan, plan_repair, preview_repair
from inspector._internal.plans.repair_all import plan_all
from inspector._internal.plans.restore import RestorePlan, plan_restore
from inspector._internal.report.fit import fit_notes, fit_table
from inspector._internal.report.html import (
    code_help_html,
    diff_html,
    facts_html,
    findings_html,
    frame_html,
    html_text,
    load_verdict_html,
    markup_html,
    problem_html,
    problems_html,
    severity_badge,
    text_html,
)
from inspector._internal.report.markdown import markdown_summary
from inspector._internal.report.query import (
    TensorQuery,
    export_tensors,
    missing_notes,
    name_pattern,
    query_for_finding,
)
from inspector._internal.report.summary import experts_text, summarize
from inspector._internal.report.text import engine_lines
from inspector._internal.scan.entry import scan
from inspector._internal.serve.engine import EngineReport, engine_check
from inspector._internal.serve.fit import FitResult, fit
from inspector._internal.serve.gpus import GPUS
from inspector._internal.storage import Location, RemoteURL
from inspector.errors import InspectorError, PlanRefusedError

__all__ = [
    "DECIMAL_UNITS",
    "EXIT_CANNOT",
    "EXIT_OK",
    "FINDING",
    "GPUS",
    "ISSUE",
    "KV_CACHE_DTYPES",
    "MESSAGE_LIMIT",
    "NAME_LIMIT",
    "SEVERITY_ORDER",
    "SHARD_SPLIT_SIZE",
    "EngineReport",
    "Finding",
    "FitResult",
    "InspectorError",
    "LoadVerdict",
    "Location",
    "PlanRefusedError",
    "Problem",
    "RemoteURL",
    "RepairPlan",
    "RestorePlan",
    "ScannedCheckpoint",
    "TensorQuery",
    "add_model_arguments",
    "add_path_arguments",
    "check",
    "code_help_html",
    "computed_value_table",
    "consolidation_reference",
    "default_destination",
    "diff_html",
    "engine_check",
    "engine_lines",
    "experts_text",
    "export_tensors",
    "facts_html",
    "findings_html",
    "findings_per_file",
    "findings_to_frame",
    "fit",
    "fit_notes",
    "fit_table",
    "fold_ranges",
    "format_bytes",
    "frame_html",
    "group_problems",
    "html_text",
    "known_verdict",
    "layer_name",
    "legible",
    "legible_each",
    "load_verdict_html",
    "markdown_summary",
    "markup_html",
    "missing_notes",
    "name_pattern",
    "plan_all",
    "plan_consolidation",
    "plan_repair",
    "plan_restore",
    "plural",
    "preview_repair",
    "problem_html",
    "problems_html",
    "query_for_finding",
    "restore_reference",
    "scale_for",
    "scan",
    "scan_from_args",
    "severity_badge",
    "severity_counts",
    "severity_rank",
    "severity_tally",
    "summarize",
    "text_html",
    "value_table",
    "verdict_apart",
    "verdict_from_args",
    "verification_line",
    "write_atomic",
]
