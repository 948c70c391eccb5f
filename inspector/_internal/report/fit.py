"""`fit` results as text (the CLI) and as Markdown lines (the summary for bug reports): one
row per parallel plan, the findings that decide each, and what the figures rest on.

Findings every plan shares (a config value that could not be used) are said once; each plan
then lists its own. Messages are bounded and escaped (`legible`) like every finding."""

from __future__ import annotations

import pandas as pd

from inspector._internal.common.display import MESSAGE_LIMIT, legible
from inspector._internal.common.units import format_bytes
from inspector._internal.findings.finding import Finding
from inspector._internal.findings.words import plural
from inspector._internal.serve.fit import (
    ACTIVATION_TOKENS,
    FIXED_OVERHEAD,
    FitResult,
    ParallelPlan,
)

__all__ = ["fit_markdown", "fit_notes", "fit_table", "fit_text", "shared_findings"]

_COLUMNS = ("plan", "GPUs", "feasible", "weights/GPU", "KV/token/GPU", "longest context")


def shared_findings(result: FitResult) -> tuple[Finding, ...]:
    """The findings every plan has (config facts), in the order of the first plan; none when
    there is one plan (its findings are its own)."""
    if len(result.plans) < 2:
        return ()
    rest = [set(p.findings) for p in result.plans[1:]]
    return tuple(f for f in result.plans[0].findings if all(f in r for r in rest))


def fit_text(result: FitResult, *, path: str) -> str:
    """The plans as a table, then the findings of each, then how the figures are made."""
    lines = [f"{legible(path)}: {_heading(result)}"]
    rows = [_row(p) for p in result.plans]
    widths = [max(len(r[i]) for r in [_COLUMNS, *rows]) for i in range(len(_COLUMNS))]
    for row in [_COLUMNS, *rows]:
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    shared = shared_findings(result)
    if shared:
        lines.append("\nevery plan:")
        lines += [_finding_line(f) for f in shared]
    for plan in result.plans:
        own = [f for f in plan.findings if f not in shared]
        if own:
            lines.append(f"\n{plan.label}:")
            lines += [_finding_line(f) for f in own]
    lines.append("")
    lines += _notes(result)
    return "\n".join(lines)


def fit_table(result: FitResult) -> pd.DataFrame:
    """The plans as the HTML report and the dashboard list them: the text table's columns
    and, per plan, the findings that decide it (code: message)."""
    rows = [
        (*_row(p), "; ".join(f"{f.code}: {f.message}" for f in p.findings)) for p in result.plans
    ]
    return pd.DataFrame(rows, columns=[*_COLUMNS, "findings"])


def fit_notes(result: FitResult) -> list[str]:
    """How the figures are made (the text's and the Markdown's closing lines)."""
    return _notes(result)


def fit_markdown(result: FitResult) -> list[str]:
    """A short Markdown section: the plans as a table with the codes that decide each, one
    example message of each code, and how the figures are made (every message escaped
    Markdown text)."""
    # The table and the notes are the project's own words and numbers; only the messages
    # carry what config.json says, escaped.
    lines = [f"**Will it serve?** {_heading(result)}", ""]
    lines.append("| " + " | ".join((*_COLUMNS, "findings")) + " |")
    lines.append("|---|---:|---|---:|---:|---:|---|")
    for plan in result.plans:
        codes = ", ".join(dict.fromkeys(f.code for f in plan.findings))
        lines.append("| " + " | ".join((*_row(plan), codes)) + " |")
    first: dict[str, Finding] = {}
    for plan in result.plans:
        for finding in plan.findings:
            first.setdefault(finding.code, finding)
    lines.append("")
    lines += [f"- `{code}`, e.g.: {_md(f.message)}" for code, f in first.items()]
    lines += [f"- {note}" for note in _notes(result)]
    return lines


def _heading(result: FitResult) -> str:
    plans = plural(len(result.plans), "parallel plan")
    kv = f"KV cache {result.kv_dtype}"
    if result.gpu is None:
        return (
            f"{plans}; {kv}; no GPU given (--gpu or --gpu-memory for the memory verdict and "
            "the longest context)"
        )
    budget = format_bytes(result.budget_bytes or 0)
    share = f"{result.gpu_memory_utilization:g}"
    context = f"; context {result.context:,}" if result.context else ""
    return f"{plans} on {result.gpu} ({budget} usable at {share}); {kv}{context}"


def _row(plan: ParallelPlan) -> tuple[str, ...]:
    kv = plan.kv_bytes_per_token_per_rank
    context = plan.max_context_tokens
    return (
        plan.label,
        f"{plan.gpus:,}",
        "yes" if plan.feasible else "no",
        format_bytes(plan.weights_bytes_per_rank),
        "-" if kv is None else format_bytes(kv),
        "-" if context is None else f"{context:,}",
    )


def _finding_line(finding: Finding) -> str:
    message = legible(finding.message, limit=MESSAGE_LIMIT)
    return f"  {finding.severity} {finding.code}: {message}"


def _notes(result: FitResult) -> list[str]:
    """How the figures are made, with the numbers of the first plan that has them."""
    notes = [
        "weights/GPU: the stored tensors placed as vLLM places them (the fullest GPU; MTP "
        "layers counted on the last stage)",
    ]
    plan = next((p for p in result.plans if p.kv is not None), None)
    if plan is not None and plan.kv is not None:
        windows = [w for cost in plan.kv for w in cost.windows]
        state = max(cost.state for cost in plan.kv)
        extra = "".join(
            f"; plus {format_bytes(size)} per token within the {window:,}-token window"
            for window, size in windows[:1]
        )
        if state:
            extra += f"; plus {format_bytes(state)} of recurrent state per sequence"
        notes.append(f"KV/token/GPU ({plan.label}): per token of context past every window{extra}")
    if result.gpu is not None:
        fixed = format_bytes(FIXED_OVERHEAD)
        notes.append(
            f"the memory verdict sets aside an estimate per GPU: {fixed} for CUDA graphs, "
            f"NCCL and the CUDA context, and the activations of {ACTIVATION_TOKENS:,} tokens "
            "(vLLM measures these at start-up)"
        )
    return notes


def _md(text: str) -> str:
    return legible(" ".join(text.split()), target="markdown", limit=MESSAGE_LIMIT)
