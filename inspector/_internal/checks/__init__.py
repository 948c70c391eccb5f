"""Every judgement about a checkpoint lives here, one module per concern; the layout readers
only read. `check(scanned)` runs the scan's problems, every rule registered for the layout
and, with `model=True`, the model rules (`inspector._internal.checks.registry`). Pure functions
only."""

from __future__ import annotations

from collections.abc import Callable, Collection
from functools import partial
from typing import TYPE_CHECKING, Literal

from inspector._internal.checkpoint.scanned import LayoutName, ScannedCheckpoint
from inspector._internal.checks.deep import deep_check
from inspector._internal.checks.registry import (
    MODEL_RULES,
    RULES,
    ModelRule,
    Rule,
    model_rules_for,
    rules_for,
)
from inspector._internal.checks.tied_head import check_tied_head
from inspector._internal.common.progress import reporting, track
from inspector._internal.findings.codes import Code
from inspector._internal.findings.finding import Finding, sort_findings
from inspector._internal.formats.value_reading import SampleBudget
from inspector._internal.load.verdict import load_verdict

if TYPE_CHECKING:
    from inspector._internal.load.verdict import LoadVerdict

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
    values: Literal["sample", "full"] | None = None,
    model: bool = True,
    trust_remote_code: bool = False,
    verdict: LoadVerdict | None = None,
    cache: bool = True,
    progress: bool = False,
    sample_windows: int | None = None,
    sample_seed: int = 0,
    skip: Collection[str] = (),
) -> list[Finding]:
    """All findings: those met while scanning, the layout's drift checks, structural checks,
    with `model=True` what the model code itself would load (`inspector._internal.load.verdict`;
    skipped without transformers or for an architecture it does not know; `verdict` reuses one
    computed by the caller; `cache` as in `load_verdict`: the verdict kept in the user's cache
    for this very checkpoint is used, `cache=False` computes it again), and with `deep=True`
    the ones that need tensor data (zeros, NaN/Inf, duplicate bytes). `values="sample"` or `"full"`
    reads tensor values for their statistics (`inspector._internal.checks.values`: NaN/Inf,
    all-zero, never-written and outlier tensors against their siblings; the table is then
    `scanned.values`).
    `sample_windows` (default 8) and `sample_seed` (default 0) change what `"sample"` reads
    of each tensor: more windows catch smaller damaged spans, another seed other offsets.
    `skip` names registered rules (`Rule.name`) left out: the dashboard shows its Overview
    before its costliest rules ran, and runs them right after.

    Sorted worst first, then by code and file; exact duplicates are dropped. `progress`
    draws a progress bar over the check stages (`tqdm.auto`).
    """
    # The stages a progress bar counts: each registered rule, the model rules together
    # (one verdict serves them all), then the data checks.
    stages: list[Callable[[list[Finding]], list[Finding]]] = [
        partial(_plain_rule, rule, scanned)
        for rule in rules_for(scanned.layout)
        if rule.name not in skip
    ]
    if scanned.layout != LayoutName.GGUF:
        # A few KB of the head and the embedding (all of both with values="full").
        stages.append(partial(_tied_head, scanned, values or "sample", sample_seed))
    model_rules = model_rules_for(scanned.layout) if model else ()
    if model_rules:
        stages.append(
            partial(_model_rules, model_rules, scanned, verdict, trust_remote_code, cache)
        )
    if deep:
        stages.append(partial(_deep, scanned))
    if values is not None:
        budget = None if sample_windows is None else SampleBudget(windows=sample_windows)
        stages.append(partial(_values, scanned, values, budget, sample_seed))
    found: list[Finding] = list(scanned.read_findings)
    with reporting(progress):
        for stage in track(stages, desc="checks", unit="stage"):
            found = stage(found)
    return sort_findings(found)


def _plain_rule(rule: Rule, scanned: ScannedCheckpoint, found: list[Finding]) -> list[Finding]:
    # Kept with the scan: a rule is a function of the scan alone, and the dashboard checks
    # one scan up to three times (the Overview without its costliest rules, then those rules,
    # then the load verdict's rules), which re-ran every rule each time (0.7-0.9 s at
    # 300,000 tensors).
    return [*found, *scanned.derived(f"rule:{rule.name}", lambda: tuple(rule.run(scanned)))]


def _model_rules(
    rules: tuple[ModelRule, ...],
    scanned: ScannedCheckpoint,
    verdict: LoadVerdict | None,
    trust_remote_code: bool,
    cache: bool,
    found: list[Finding],
) -> list[Finding]:

    # Built once for every model rule: building the model is the expensive part.
    verdict = verdict or load_verdict(scanned, trust_remote_code=trust_remote_code, cache=cache)
    for rule in rules:
        found = rule.run(scanned, verdict, found)
    return found


def _tied_head(
    scanned: ScannedCheckpoint, mode: Literal["sample", "full"], seed: int, found: list[Finding]
) -> list[Finding]:
    return [*found, *check_tied_head(scanned, mode=mode, seed=seed)]


def _deep(scanned: ScannedCheckpoint, found: list[Finding]) -> list[Finding]:
    # The tensors of a file the structure check already found short are not reported again
    # (it names them); those of a file that got shorter since the scan are.
    return [*found, *_unless_short(found, deep_check(scanned))]


def _unless_short(found: list[Finding], new: list[Finding]) -> list[Finding]:
    """`new` without `file-truncated` findings of files `found` already reports short."""
    short = {f.file for f in found if f.code == Code.FILE_TRUNCATED.value}
    return [f for f in new if not (f.code == Code.FILE_TRUNCATED.value and f.file in short)]


def _values(
    scanned: ScannedCheckpoint,
    mode: Literal["sample", "full"],
    budget: SampleBudget | None,
    seed: int,
    found: list[Finding],
) -> list[Finding]:
    # With --deep too, a tensor already reported as zero or NaN is not reported twice; nor
    # are the tensors of a file the structure check already found short (it names them).
    # Imported here: the value rules build frames (pandas), which no other stage needs.
    from inspector._internal.checks.values import values_check

    seen = {(f.code, f.tensor) for f in found if f.tensor}
    new = [
        f
        for f in values_check(scanned, mode, budget=budget, seed=seed)
        if (f.code, f.tensor) not in seen
    ]
    return [*found, *_unless_short(found, new)]


def check_layout(scanned: ScannedCheckpoint) -> list[Finding]:
    """Only the rules registered for this layout by name (not the structure and quant-config
    rules every layout runs), unsorted; the scan's own problems are not included."""
    return [
        f
        for rule in rules_for(scanned.layout)
        if rule.layouts is not None
        for f in rule.run(scanned)
    ]
