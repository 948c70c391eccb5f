"""The core as the notebook UI sees it: the one module `inspector.widgets` imports from the
core (a test keeps it so). The dashboard, the HTML report and the snapshot show what these
functions compute and hold no rule of their own; a fact the UI needs that the core does not
compute yet is added to the core and named here, never derived in the UI.

Each name is imported from its module on first use (PEP 562, as `inspector/__init__.py` does):
`ckpt-inspect report --help` reads the option builders here without loading the scan, the
checks, the plans and the renderers (pandas included), which the UI needs once it runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from inspector._internal.common.lazy import lazy_names
from inspector.errors import InspectorError, PlanRefusedError

if TYPE_CHECKING:
    from inspector._internal.checkpoint.scanned import ScannedCheckpoint
    from inspector._internal.checkpoint.tables import scan_figures
    from inspector._internal.checks import check, rules_for
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
    from inspector._internal.common.gc import gc_paused
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
        grouped_by_code,
        severity_counts,
        severity_tally,
    )
    from inspector._internal.integrity.verified import verification_line
    from inspector._internal.load.child import (
        start_verdict_for,
        start_verdict_process,
        verdict_apart,
    )
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
    from inspector._internal.report.summary import experts_text, has_expert_grid, summarize
    from inspector._internal.report.text import engine_lines
    from inspector._internal.scan.entry import scan
    from inspector._internal.serve.engine import EngineReport, engine_check
    from inspector._internal.serve.fit import FitResult, fit
    from inspector._internal.serve.gpus import GPUS
    from inspector._internal.storage import Location, RemoteURL

# Each name and the module that defines it.
_LAZY: dict[str, str] = {
    "DECIMAL_UNITS": "inspector._internal.common.units",
    "EXIT_CANNOT": "inspector._internal.cli.args",
    "EXIT_OK": "inspector._internal.cli.args",
    "EngineReport": "inspector._internal.serve.engine",
    "FINDING": "inspector._internal.findings.words",
    "Finding": "inspector._internal.findings.finding",
    "FitResult": "inspector._internal.serve.fit",
    "GPUS": "inspector._internal.serve.gpus",
    "ISSUE": "inspector._internal.findings.words",
    "KV_CACHE_DTYPES": "inspector._internal.common.dtypes",
    "LoadVerdict": "inspector._internal.load.verdict",
    "Location": "inspector._internal.storage",
    "MESSAGE_LIMIT": "inspector._internal.common.display",
    "NAME_LIMIT": "inspector._internal.common.display",
    "Problem": "inspector._internal.diagnosis.issues",
    "RemoteURL": "inspector._internal.storage",
    "RepairPlan": "inspector._internal.plans.repair",
    "RestorePlan": "inspector._internal.plans.restore",
    "SEVERITY_ORDER": "inspector._internal.findings.words",
    "SHARD_SPLIT_SIZE": "inspector._internal.common.units",
    "ScannedCheckpoint": "inspector._internal.checkpoint.scanned",
    "TensorQuery": "inspector._internal.report.query",
    "add_model_arguments": "inspector._internal.cli.args",
    "add_path_arguments": "inspector._internal.cli.args",
    "check": "inspector._internal.checks",
    "code_help_html": "inspector._internal.report.html",
    "computed_value_table": "inspector._internal.checks.values",
    "consolidation_reference": "inspector._internal.diagnosis.references",
    "default_destination": "inspector._internal.plans.consolidate",
    "diff_html": "inspector._internal.report.html",
    "engine_check": "inspector._internal.serve.engine",
    "engine_lines": "inspector._internal.report.text",
    "experts_text": "inspector._internal.report.summary",
    "export_tensors": "inspector._internal.report.query",
    "facts_html": "inspector._internal.report.html",
    "findings_html": "inspector._internal.report.html",
    "findings_per_file": "inspector._internal.findings.finding",
    "findings_to_frame": "inspector._internal.findings.finding",
    "fit": "inspector._internal.serve.fit",
    "fit_notes": "inspector._internal.report.fit",
    "fit_table": "inspector._internal.report.fit",
    "fold_ranges": "inspector._internal.common.text",
    "format_bytes": "inspector._internal.common.units",
    "gc_paused": "inspector._internal.common.gc",
    "frame_html": "inspector._internal.report.html",
    "group_problems": "inspector._internal.diagnosis.issues",
    "grouped_by_code": "inspector._internal.findings.words",
    "has_expert_grid": "inspector._internal.report.summary",
    "html_text": "inspector._internal.report.html",
    "known_verdict": "inspector._internal.load.verdict",
    "layer_name": "inspector._internal.common.text",
    "legible": "inspector._internal.common.display",
    "legible_each": "inspector._internal.common.display",
    "load_verdict_html": "inspector._internal.report.html",
    "markdown_summary": "inspector._internal.report.markdown",
    "markup_html": "inspector._internal.report.html",
    "missing_notes": "inspector._internal.report.query",
    "name_pattern": "inspector._internal.report.query",
    "plan_all": "inspector._internal.plans.repair_all",
    "plan_consolidation": "inspector._internal.plans.consolidate",
    "plan_repair": "inspector._internal.plans.repair",
    "plan_restore": "inspector._internal.plans.restore",
    "plural": "inspector._internal.common.text",
    "preview_repair": "inspector._internal.plans.repair",
    "problem_html": "inspector._internal.report.html",
    "problems_html": "inspector._internal.report.html",
    "query_for_finding": "inspector._internal.report.query",
    "restore_reference": "inspector._internal.diagnosis.references",
    "rules_for": "inspector._internal.checks",
    "scale_for": "inspector._internal.common.units",
    "scan": "inspector._internal.scan.entry",
    "scan_figures": "inspector._internal.checkpoint.tables",
    "scan_from_args": "inspector._internal.cli.args",
    "severity_badge": "inspector._internal.report.html",
    "severity_counts": "inspector._internal.findings.words",
    "severity_rank": "inspector._internal.findings.finding",
    "severity_tally": "inspector._internal.findings.words",
    "start_verdict_for": "inspector._internal.load.child",
    "start_verdict_process": "inspector._internal.load.child",
    "summarize": "inspector._internal.report.summary",
    "text_html": "inspector._internal.report.html",
    "value_table": "inspector._internal.checks.values",
    "verdict_apart": "inspector._internal.load.child",
    "verdict_from_args": "inspector._internal.cli.args",
    "verification_line": "inspector._internal.integrity.verified",
    "write_atomic": "inspector._internal.execution.atomic",
}

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
    "gc_paused",
    "group_problems",
    "grouped_by_code",
    "has_expert_grid",
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
    "rules_for",
    "scale_for",
    "scan",
    "scan_figures",
    "scan_from_args",
    "severity_badge",
    "severity_counts",
    "severity_rank",
    "severity_tally",
    "start_verdict_for",
    "start_verdict_process",
    "summarize",
    "text_html",
    "value_table",
    "verdict_apart",
    "verdict_from_args",
    "verification_line",
    "write_atomic",
]


__getattr__, __dir__ = lazy_names(__name__, _LAZY, __all__)
