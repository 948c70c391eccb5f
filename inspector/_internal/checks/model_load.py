"""Findings from the load verdict (`inspector._internal.load.verdict`): what the model code would
load. Pure.

Codes: load-missing-tensor, load-unexpected-tensor, load-shape-mismatch. One finding per
tensor up to the fold policy (`inspector._internal.findings.finding.FOLD`), then one summary per
file (missing tensors have no file) that names the layers and a few examples. A skipped verdict
gives no finding; its reason is in the verdict (Markdown summary, dashboard, `check --json`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from inspector._internal.checkpoint.naming import layer_expert_numbers
from inspector._internal.checkpoint.places import describe_names
from inspector._internal.checkpoint.scanned import ScannedCheckpoint
from inspector._internal.common.display import legible
from inspector._internal.common.text import examples, fold_ranges, layers_text
from inspector._internal.findings.codes import Code, code_set
from inspector._internal.findings.finding import Finding, besides, fold, make_finding
from inspector._internal.load.records import ShapeMismatch
from inspector._internal.load.verdict import LoadVerdict, stored_files

__all__ = ["CODES", "add_load_findings", "check_load"]

CODES = code_set(Code.LOAD_MISSING_TENSOR, Code.LOAD_UNEXPECTED_TENSOR, Code.LOAD_SHAPE_MISMATCH)

_EXPERT = re.compile(r"\.experts\.(\d+)\.")


def check_load(scanned: ScannedCheckpoint, verdict: LoadVerdict) -> list[Finding]:
    """The verdict's missing, unexpected and mismatched keys as findings."""
    if not verdict.ran:
        return []
    behind = {m.key: verdict.sources.get(m.key, (m.key,)) for m in verdict.mismatched}
    behind.update((k, verdict.sources.get(k, (k,))) for k in verdict.unexpected)
    files = stored_files(scanned, (n for names in behind.values() for n in names))
    report = _Report(scanned, verdict, behind, files)
    return report.missing() + report.unexpected() + report.mismatched()


def add_load_findings(
    scanned: ScannedCheckpoint, verdict: LoadVerdict, findings: list[Finding]
) -> list[Finding]:
    """The model rule (`inspector._internal.checks.registry`): `findings` and the verdict's."""
    return [*findings, *check_load(scanned, verdict)]


class _Report:
    def __init__(
        self,
        scanned: ScannedCheckpoint,
        verdict: LoadVerdict,
        behind: dict[str, tuple[str, ...]],
        files: dict[str, str],
    ) -> None:
        self.scanned = scanned
        self.verdict = verdict
        self.arch = legible(verdict.architecture or "the model")
        self.behind = behind
        self.files = files

    def file_of(self, key: str) -> str | None:
        return next((self.files[n] for n in self.behind.get(key, ()) if n in self.files), None)

    def by_file(self, keys: Sequence[str]) -> dict[str, list[str]]:
        groups: dict[str, list[str]] = {}
        for key in keys:
            groups.setdefault(self.file_of(key) or "", []).append(key)
        return groups

    def finding(self, code: str, message: str, key: str, file: str | None) -> Finding:
        stored = self.behind.get(key, ())
        tensor = stored[0] if len(stored) == 1 else key
        ((layer, expert),) = layer_expert_numbers([tensor])
        return make_finding(code, message, file=file, tensor=tensor, layer=layer, expert=expert)

    # -- missing ------------------------------------------------------------------------------

    def missing(self) -> list[Finding]:
        v = self.verdict

        def detail(_: str | None, key: str) -> Finding:
            spelled = v.stored_as.get(key)
            where = f" (a checkpoint stores it as {legible(spelled)})" if spelled else ""
            why = v.reasons.get(key)
            if why:  # a quantization scale, or a key transformers cannot convert
                msg = (
                    f"'{legible(key)}'{where} is missing: {why}; restore what is missing "
                    "(ckpt-inspect repair --from REF)"
                )
            else:
                msg = (
                    f"{self.arch} expects '{legible(key)}'{where}, which the checkpoint does "
                    "not hold"
                )
                msg += self._missing_hint(key)
            return self.finding("load-missing-tensor", msg, key, None)

        def summary(_: str | None, rest: Sequence[str], shown: int) -> Finding:
            msg = (
                f"{len(rest):,} more tensors{besides(shown)} {self.arch} expects are missing: "
                f"{describe_names(list(rest))}; transformers initialises them at random"
            )
            return make_finding("load-missing-tensor", msg)

        return fold(list(v.missing), detail, summary)

    def _missing_hint(self, key: str) -> str:
        config = self.scanned.config or {}
        if (
            key.rpartition(".")[0].endswith("lm_head")
            and config.get("tie_word_embeddings") is False
        ):
            return (
                "; config.json sets tie_word_embeddings false, so the output head is not the "
                "input embedding: transformers initialises it at random; restore lm_head "
                "(ckpt-inspect repair --from REF), or set tie_word_embeddings true if the model "
                "was trained tied"
            )
        return (
            "; transformers initialises it at random and serving engines fail or load garbage: "
            "restore it (ckpt-inspect repair --from REF) or check config.json"
        )

    # -- unexpected ---------------------------------------------------------------------------

    def unexpected(self) -> list[Finding]:
        v = self.verdict

        def detail(group: str | None, key: str) -> Finding:
            stored = self.behind.get(key, (key,))
            where = f"{legible(group)} holds" if group else "the checkpoint holds"
            what = f"'{legible(stored[0])}'" if len(stored) == 1 else f"{len(stored)} tensors"
            read = f" (transformers reads it as '{legible(key)}')" if stored != (key,) else ""
            msg = (
                f"{where} {what}{read}, which {self.arch} does not load: transformers drops it "
                "and strict loaders refuse it; remove it, or check that config.json names the "
                "right architecture and sizes"
            )
            return self.finding("load-unexpected-tensor", msg, key, group)

        def summary(group: str | None, rest: Sequence[str], shown: int) -> Finding:
            names = [n for k in rest for n in self.behind.get(k, (k,))]
            where = f" in {legible(group)}" if group else ""
            msg = (
                f"{len(rest):,} more tensors{besides(shown)}{where} that {self.arch} does not "
                "load: "
                f"{describe_names(names)}"
            )
            return make_finding("load-unexpected-tensor", msg, file=group)

        return fold(self.by_file(v.unexpected), detail, summary)

    # -- mismatched ---------------------------------------------------------------------------

    def mismatched(self) -> list[Finding]:
        v = self.verdict
        items = {m.key: m for m in v.mismatched}

        def detail(group: str | None, key: str) -> Finding:
            m = items[key]
            msg = (
                f"'{legible(key)}' is stored as {list(m.stored)}{self._stacked(m)} but {self.arch} "
                f"expects {list(m.expected)}"
            )
            why = v.reasons.get(key)
            msg += f" ({why})" if why else ""
            msg += (
                ": loading fails (or re-initialises it with ignore_mismatched_sizes); fix "
                "config.json or re-export the tensor"
            )
            return self.finding("load-shape-mismatch", msg, key, group)

        def summary(group: str | None, rest: Sequence[str], shown: int) -> Finding:
            where = f" in {legible(group)}" if group else ""
            msg = (
                f"{len(rest):,} more tensors{besides(shown)}{where} have another shape than "
                f"{self.arch} "
                f"expects: {describe_names(list(rest))}"
            )
            return make_finding("load-shape-mismatch", msg, file=group)

        return fold(self.by_file(list(items)), detail, summary)

    def _stacked(self, m: ShapeMismatch) -> str:
        """For a key transformers builds from several stored tensors: which experts."""
        stored = self.behind.get(m.key, ())
        if len(stored) < 2:
            return ""
        ids = {int(x.group(1)) for n in stored if (x := _EXPERT.search(n))}
        if not ids:
            return f" (built from {len(stored)} stored tensors: {examples(list(stored))})"
        declared = self.scanned.spec.experts_per_layer
        absent = set(range(declared)) - ids if declared else set()
        gaps = f"; {layers_text(absent, noun='expert')} missing" if absent else ""
        return (
            f" (stacked by transformers from {len(stored)} stored tensors of experts "
            f"{fold_ranges(ids)}{gaps})"
        )
