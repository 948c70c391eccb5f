"""Issues: findings grouped into root causes, each with its impact and the action that fixes it.

A check reports every symptom (one index gap can be 44 findings); `group_issues` makes one
issue per cause, with its fix. Pure; the counts in titles come from the scanned data, since
findings are folded. Whether a plan fixes an issue is `plans.repair.preview_repair`'s to say.
Example and grouping: docs/architecture.md, "diagnosis/".
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter, defaultdict
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from inspector._internal.checkpoint.naming import layer_expert_numbers
from inspector._internal.checkpoint.scanned import LayoutName, ScannedCheckpoint
from inspector._internal.checkpoint.tables import scan_columns
from inspector._internal.checks.index import unlisted_names
from inspector._internal.checks.sidecars import CODES as SIDECAR_CODES
from inspector._internal.common.display import MESSAGE_LIMIT, legible
from inspector._internal.common.filenames import CONFIG_NAME, INDEX_NAME, QUANT_CONFIG_NAME
from inspector._internal.common.text import (
    cut_at_word,
    examples,
    fold_ranges,
    layers_text,
    plural,
    shell_word,
)
from inspector._internal.common.units import format_bytes
from inspector._internal.diagnosis.references import consolidation_reference, restore_reference
from inspector._internal.findings.codes import Code, FixKind, Severity, code_of, severity_rank
from inspector._internal.findings.finding import Finding

if TYPE_CHECKING:
    from inspector._internal.load.verdict import LoadVerdict

__all__ = [
    "INDEX_REBUILT_FOR",
    "Action",
    "ActionKind",
    "Issue",
    "Problem",
    "group_issues",
    "group_problems",
]

# The kinds of fix a code names (`Code.fix`).
ActionKind = FixKind


@dataclass(frozen=True, slots=True)
class Action:
    """What fixes an issue: in words, as a command, and (for `repair`) which plan parts."""

    kind: ActionKind
    text: str
    command: str
    # Parts of `plan_repair(only=...)` ("index", "sidecars", "quant-config") for kind "repair".
    parts: tuple[str, ...] = ()

    @property
    def here(self) -> bool:
        """True when `ckpt-inspect repair` (the dashboard's Repair tab) carries it out."""
        return self.kind == "repair"


@dataclass(frozen=True, slots=True)
class Issue:
    """One root cause. `tensors`, `files` and `cells` say where it shows: tensor names (all of
    them when known), files, and (layer, expert) cells of the expert heatmap (expert None:
    the whole layer)."""

    key: str
    severity: Severity
    title: str
    impact: str
    action: Action
    findings: tuple[Finding, ...]
    tensors: tuple[str, ...] = ()
    files: tuple[str, ...] = ()
    cells: tuple[tuple[int, int | None], ...] = ()

    @property
    def codes(self) -> tuple[str, ...]:
        """The distinct codes of its findings, in first-seen order."""
        return tuple(dict.fromkeys(f.code for f in self.findings))

    @property
    def repairable(self) -> bool:
        return self.action.here


# Codes whose findings name the shard, not the index, that they point at.
_NAMES_THE_SHARD = frozenset({Code.INDEX_DANGLING_TENSOR, Code.INDEX_WRONG_FILE})
# Codes of a root cause that code beside its rule in `_RULES` needs too: the sidecar rule's,
# and a sidecar the scan could not read.
_SIDECARS = SIDECAR_CODES | {Code.SIDECAR_UNREADABLE}
_EXPERTS = frozenset({Code.EXPERT_MISSING, Code.EXPERT_INCOMPLETE, Code.EXPERT_SHAPE_MISMATCH})
_MAX_LISTED = 3
# Layouts `repair --from REF` restores tensors into (`inspector._internal.plans.restore`).
_RESTORES_INTO = frozenset({LayoutName.HF_SHARDED, LayoutName.MODELOPT_PER_LAYER})
_EXPERT_NUMBER = re.compile(r"\.experts\.\d+\.")
# Layouts a training job writes itself (Megatron torch_dist, PyTorch DCP): no exporter made
# them, the job that saved them saves them again.
_TRAINING_LAYOUTS = frozenset({LayoutName.TORCH_DIST, LayoutName.DCP_SHARDED})
_RESAVE = "re-save from the training job"
_TOTALS = frozenset({Code.TOTAL_SIZE_MISMATCH, Code.TOTAL_PARAMETERS_MISMATCH})


def group_issues(
    scanned: ScannedCheckpoint,
    findings: Iterable[Finding],
    *,
    verdict: LoadVerdict | None = None,
) -> tuple[Issue, ...]:
    """The findings of `scanned` as issues, worst first (then the ones fixable here first).

    Every finding belongs to exactly one issue; a finding no rule explains becomes an issue
    of its own code, titled by the code's help text. `verdict` is the load verdict the
    findings were checked with (`check(..., verdict=...)`): the load issues then count and
    list every key it reports, not only the findings listed before the fold.
    """
    pending = list(dict.fromkeys(findings))
    ctx = _Context(scanned, verdict)
    issues: list[Issue] = []
    for rule in _RULES:
        mine = [f for f in pending if rule.takes(f)]
        issue = _build(rule, ctx, mine, pending) if mine else None
        if issue is not None:
            issues.append(issue)
            claimed = set(issue.findings)
            pending = [f for f in pending if f not in claimed]
    issues.extend(_per_code(ctx, pending))
    return tuple(
        sorted(
            map(_legible, issues),
            key=lambda p: (severity_rank(p.severity), not p.repairable, -len(p.findings), p.key),
        )
    )


def _legible(issue: Issue) -> Issue:
    """The issue's words as people read them (`legible`: bounded, control characters
    escaped), whatever names the rules put in them; its tensors and files stay exact."""
    action = issue.action
    return dataclasses.replace(
        issue,
        title=legible(issue.title, limit=MESSAGE_LIMIT),
        impact=legible(issue.impact, limit=MESSAGE_LIMIT),
        action=dataclasses.replace(
            action,
            text=legible(action.text, limit=MESSAGE_LIMIT),
            command=legible(action.command, limit=MESSAGE_LIMIT),
        ),
    )


# -- the scanned data the rules need --------------------------------------------------------


@dataclass
class _Context:
    """The scanned checkpoint plus lookups built on first use (a 300,000-tensor checkpoint
    builds none of them when it has no finding that needs them)."""

    scanned: ScannedCheckpoint
    verdict: LoadVerdict | None = None
    _mtp: frozenset[str] | None = field(default=None, repr=False)
    _held: dict[str, frozenset[str]] | None = field(default=None, repr=False)
    # Missing keys (of the verdict) that an issue other than the load one explains.
    explained: set[str] = field(default_factory=set, repr=False)

    @property
    def path(self) -> str:
        return legible(shell_word(str(self.scanned.path)))

    def sizes(self, names: Collection[str]) -> dict[str, int]:
        """Bytes of each of `names` that a shard header holds (the first holder wins). Only
        the shards holding one of them are walked name by name: an issue names a few
        tensors, and a dict of every name cost half a second at 300,000 tensors."""
        wanted = set(names)
        sizes: dict[str, int] = {}
        for shard in self.scanned.shards:
            if not wanted:
                break
            hit = wanted.intersection(shard.names)  # C-level: hashes the shard's names
            if not hit:
                continue
            sizes_here = (shard.ends - shard.begins).tolist()
            for name, size in zip(shard.names, sizes_here, strict=True):
                if name in hit:
                    sizes.setdefault(name, size)
            wanted -= hit
        return sizes

    def mtp(self) -> frozenset[str]:
        """Names of the MTP tensors (the tensors table knows every spelling)."""
        if self._mtp is None:
            columns = scan_columns(self.scanned)
            names = columns.tensors.names
            mtp = np.flatnonzero(columns.numbering.is_mtp).tolist()
            self._mtp = frozenset(map(names.__getitem__, mtp))
        return self._mtp

    def held(self) -> dict[str, frozenset[str]]:
        """Shard file -> the tensor names its header holds (readable shards only)."""
        if self._held is None:
            shards = self.scanned.shards
            self._held = {s.file: frozenset(s.names) for s in shards if s.readable}
        return self._held

    def load_claim(
        self, pending: list[Finding], cause: Callable[[str], bool], code: Code
    ) -> list[Finding]:
        """The load check's findings of `code` that `cause` explains (it is given the key, or
        the stored name a finding carries). A folded summary finding names no key: it goes
        with the cause when the verdict shows that `cause` explains every key of its kind."""
        mine = [f for f in pending if f.code == code]
        if not mine:
            return []
        claimed = [f for f in mine if f.tensor is not None and cause(f.tensor)]
        if self.verdict is not None:
            every = _verdict_keys(self.verdict, code)
            keys = [k for k in every if cause(k)]
            self.explained.update(keys)
            if len(keys) == len(every):
                claimed += [f for f in mine if f.tensor is None]
        return claimed

    def among(self, names: Collection[str]) -> Callable[[str], bool]:
        """A `load_claim` cause: the key is one of `names` (stored tensor names), or the
        checkpoint spells it as some of them (`stored_as`: a model's stacked experts key is
        stored as `...experts.*.down_proj.weight`)."""
        stored_as = self.verdict.stored_as if self.verdict is not None else {}
        templates: set[str] | None = None

        def explains(key: str) -> bool:
            nonlocal templates
            if key in names:
                return True
            spelled = stored_as.get(key)
            if spelled is None:
                return False
            if templates is None:
                templates = {_EXPERT_NUMBER.sub(".experts.*.", n) for n in names}
            return any(p in templates for p in spelled.split(" and "))

        return explains

    def candidate(self) -> str:
        """' (a candidate: <what and where>)' when a checkpoint on this machine may hold what
        this one lost (`restore_reference`), else ''."""
        ref = restore_reference(self.scanned)
        return f" (a candidate: {ref.label})" if ref is not None else ""

    def source(self) -> str:
        """That checkpoint's path as a command names it, else REF."""
        ref = restore_reference(self.scanned)
        return shell_word(ref.path) if ref is not None else "REF"

    def restore_command(self) -> str:
        return f"ckpt-inspect repair {self.path} --from {self.source()}"

    def copy_command(self, files: Sequence[str]) -> str:
        """`cp REF/<file> PATH/<file>` for the first files (the reference's when known)."""
        source, root = self.source(), self.path
        shown = [f"cp {source}/{shell_word(f)} {root}/{shell_word(f)}" for f in files[:_MAX_LISTED]]
        more = f"; ... ({len(files) - _MAX_LISTED} more)" if len(files) > _MAX_LISTED else ""
        return "; ".join(shown) + more

    def describe(self, names: Sequence[str]) -> str:
        """'42 MTP tensors (17.1 kB)' / '3 tensors (1.2 GB)': count, kind and bytes."""
        sizes = self.sizes(names)
        total = sum(sizes.get(n, 0) for n in names)
        mtp = self.mtp()
        n_mtp = sum(1 for n in names if n in mtp)
        what = "MTP tensors" if n_mtp == len(names) and names else "tensors"
        if 0 < n_mtp < len(names):
            what = f"tensors ({n_mtp} of them MTP)"
        if len(names) == 1:
            what = what.replace("tensors", "tensor", 1)
        return f"{len(names):,} {what} ({format_bytes(total)})"


# -- grouping rules --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Rule:
    """One root cause as a row: the findings it takes first (`takes`), its issue's key,
    severity (None: its findings' worst), words and action (`Action`'s fields; a "repair"
    names as command the plan part it runs, `_repair`). The words are format strings over a
    `_Facts` of its findings; `facts` computes what this cause alone needs (None: not this
    cause after all). Each later rule sees only the findings the earlier ones left."""

    key: str
    takes: Callable[[Finding], bool]
    title: str = ""
    impact: str = ""
    kind: ActionKind = "review"
    text: str = ""
    command: str = ""
    _: KW_ONLY
    severity: Severity | None = Severity.ERROR
    facts: Callable[[_Facts], dict[str, Any] | None] | None = None
    # The issue lists its findings' tensors (False: none; `facts` may name others).
    tensors: bool = True


class _Facts(dict[str, Any]):
    """The values a rule's words are written with: what its `facts` gave, else on first use
    one of `_COMMON` (a title that names no reference never looks for one)."""

    def __init__(self, ctx: _Context, mine: list[Finding], pending: list[Finding]) -> None:
        super().__init__()
        self.ctx, self.scanned, self.mine, self.pending = ctx, ctx.scanned, mine, pending

    def __missing__(self, name: str) -> Any:
        value = self[name] = _COMMON[name](self)
        return value


_COMMON: dict[str, Callable[[_Facts], Any]] = {
    "path": lambda x: x.ctx.path,
    "candidate": lambda x: x.ctx.candidate(),
    "restore_command": lambda x: x.ctx.restore_command(),
    "findings": lambda x: x.mine,
    "files": lambda x: sorted({f.file for f in x.mine if f.file}),
    "tensors": lambda x: sorted({f.tensor for f in x.mine if f.tensor}),
    "cells": lambda x: (),
    "shown": lambda x: examples(x["files"], limit=_MAX_LISTED),
    "them": lambda x: "them" if len(x["files"]) != 1 else "it",
    "codes": lambda x: _codes_text(Counter(f.code for f in x.mine)),
    "config": lambda x: CONFIG_NAME,
}


def _build(rule: _Rule, ctx: _Context, mine: list[Finding], pending: list[Finding]) -> Issue | None:
    x = _Facts(ctx, mine, pending)
    own = rule.facts(x) if rule.facts is not None else {}
    if own is None:
        return None
    x.update(own)
    if "action" not in x:
        text, command = rule.text.format_map(x), rule.command.format_map(x)
        kind = rule.kind
        x["action"] = (
            _repair(ctx, command, text) if kind == "repair" else Action(kind, text, command)
        )
    return Issue(
        key=rule.key,
        severity=rule.severity if rule.severity is not None else _worst(x.mine),
        title=x["title"] if "title" in x else rule.title.format_map(x),
        impact=x["impact"] if "impact" in x else rule.impact.format_map(x),
        action=x["action"],
        findings=tuple(x["findings"]),
        tensors=tuple(x["tensors"]) if rule.tensors else (),
        files=tuple(x["files"]),
        cells=tuple(x["cells"]),
    )


def _index_misses(x: _Facts) -> dict[str, Any] | None:
    """Shards hold tensors the index does not list (and the stale totals that follow)."""
    index = x.scanned.index
    if index is None:
        return None
    # Names the readable shards hold and the index lacks: the index rule's, kept with the scan.
    missing = unlisted_names(x.scanned)
    if not missing:
        # An unindexed file whose every tensor the index lists from another shard: the index
        # misses nothing ("misses 0 tensors" said otherwise), so the file's finding is told
        # in its own words (or by a later rule), at its own severity.
        return None
    pending = x.pending
    # The totals are short by exactly these tensors' bytes: the same cause, not a second one.
    totals = [f for f in pending if f.code in _TOTALS]
    # A loader reads only the shards the index names: the model's "missing" tensors that such
    # a shard holds are these same tensors, not a loss.
    unseen = x.ctx.load_claim(pending, x.ctx.among(set(missing)), Code.LOAD_MISSING_TENSOR)
    # Sidecars that list what their shards hold and disagree with the index say the same:
    # the index is the stale one (after `repair --only sidecars`, advising the sidecars
    # again would send the user round in a circle).
    if not any(f.code in _SIDECARS and f.code != Code.SIDECAR_INDEX_DISAGREE for f in pending):
        totals += [f for f in pending if f.code == Code.SIDECAR_INDEX_DISAGREE]
    described = x.ctx.describe(missing)
    return {
        "index": index.file,
        "title": f"{index.file} misses {described.split(' (')[0]}{_where(missing)}",
        "seen": " (the load check reports them missing)" if unseen else "",
        "described": described,
        "findings": x.mine + totals + unseen,
        "tensors": missing,
    }


def _sidecars(x: _Facts) -> dict[str, Any]:
    """Per-layer sidecars that do not describe their shards."""
    held = x.ctx.held()
    unlisted = sorted(
        {
            n
            for shard, doc in x.scanned.sidecars.items()
            for n in held.get(shard, frozenset()) - doc.weight_map.keys()
        }
    )
    # The sidecar files themselves (a disagreement finding may name the index instead).
    sidecars = [f for f in x["files"] if f.endswith(".safetensors.json")]
    which = sidecars[0] if len(sidecars) == 1 else f"{len(sidecars)} sidecars"
    if not sidecars:
        which = "the sidecars"
    facts: dict[str, Any] = {"tensors": unlisted, "files": sidecars}
    if not unlisted:
        return facts | {"title": f"{which} disagree with their shards ({x['codes']})"}
    index = x.scanned.index
    same = index is not None and not (set(unlisted) & index.weight_map.keys())
    title = f"{which} {'misses' if len(sidecars) == 1 else 'miss'} "
    title += f"{'the same ' if same else ''}{x.ctx.describe(unlisted).split(' (')[0]}"
    impact = f"{x.ctx.describe(unlisted)} unlisted: tools that read the per-layer sidecars "
    impact += "(Model-Optimizer re-import, per-layer loaders) miss them"
    return facts | {"title": title + _where(unlisted), "impact": impact}


def _shards_gone(x: _Facts) -> dict[str, Any]:
    """The index names shards that are not on disk: their tensors are gone."""
    index = x.scanned.index
    on_disk = {s.file for s in x.scanned.shards}
    gone = sorted({f for f in (index.weight_map.values() if index else ()) if f not in on_disk})
    lost = sorted(n for n, f in index.weight_map.items() if f in set(gone)) if index else []
    # Same-named dangling tensors are the missing files' contents, not a second issue...
    lost_set = set(lost)
    dangling = [
        f for f in x.pending if f.code == Code.INDEX_DANGLING_TENSOR and f.tensor in lost_set
    ]
    # ...nor are the model's missing tensors that those files held.
    dangling += x.ctx.load_claim(x.pending, x.ctx.among(lost_set), Code.LOAD_MISSING_TENSOR)
    return {
        "gone": plural(len(gone), "shard file"),
        "are": "are" if len(gone) != 1 else "is",
        "lost": plural(len(lost), "tensor"),
        "findings": x.mine + dangling,
        "tensors": lost,
        "files": gone,
    }


# The index's words by what is wrong with it: its totals only (cosmetic), unreadable, other.
_STALE_INDEX = {
    "totals": (
        "{index} has stale totals ({codes})",
        "cosmetic: loaders do not use the totals, but size checks and tools that pre-allocate "
        "from them do",
    ),
    "unreadable": ("{index} cannot be read", "no loader can open the checkpoint through its index"),
    "wrong": (
        "{index} points at the wrong places ({codes})",
        "loading fails, or reads tensors from files that do not hold them",
    ),
}


def _index_stale(x: _Facts) -> dict[str, Any]:
    """The index is unreadable, points wrong, or carries stale totals."""
    codes = {f.code for f in x.mine}
    state = "unreadable" if Code.INDEX_UNREADABLE in codes else "wrong"
    # A dangling or misplaced tensor's finding names the shard the index points at, not the
    # index: the title and the fix name the index ('rebuild model-00001-of-00004.safetensors
    # from the shard headers' was said of a shard).
    x["index"] = next(
        (f.file for f in x.mine if f.file and f.code not in _NAMES_THE_SHARD),
        x.scanned.index.file if x.scanned.index else INDEX_NAME,
    )
    title, impact = _STALE_INDEX["totals" if codes <= _TOTALS else state]
    return {"files": [x["index"]], "title": title.format_map(x), "impact": impact}


def _shards_damaged(x: _Facts) -> dict[str, Any]:
    files = x["files"]
    counts = x.scanned.files.set_index("file")["tensors"] if len(x.scanned.files) else None
    held = sum(int(counts.get(f, 0)) for f in files) if counts is not None else 0
    facts: dict[str, Any] = {"n": len(files), "s_are": "s are" if len(files) != 1 else " is"}
    facts |= {"held": held, "copy": x.ctx.copy_command(files)}
    if _worst(x.mine) != Severity.ERROR:
        facts["impact"] = "strict readers reject the file; lenient ones load it"
    return facts


def _files_unsafe(x: _Facts) -> dict[str, Any]:
    """Files not read because they are no regular file of the folder (a link out of it, a
    FIFO, a device): what the index maps to them is 'in no shard' for that reason alone, so
    those dangling findings are this issue's, not a stale index (rebuilding the index
    would drop the tensors; `repair` refuses it)."""
    unread = set(x["files"])
    dangling = [f for f in x.pending if f.code == Code.INDEX_DANGLING_TENSOR and f.file in unread]
    return {
        "findings": x.mine + dangling,
        "n_files": plural(len(unread), "file"),
        "unsafe": Code.FILE_UNSAFE.fix.text,
    }


def _experts(x: _Facts) -> dict[str, Any]:
    x.mine = x.mine + _load_of_experts(x.ctx, x.pending)
    facts: dict[str, Any] = {
        "action": _lost_tensors_action(
            x.ctx,
            "copy them back from a checkpoint that holds them in this format (the export's "
            "source, another export of the same model): an expert is restored where its "
            "siblings here share its dtype and shape",
            "re-export from the training checkpoint (expert-parallel: with global ids)",
        ),
        # The structure findings' tensors: the load check's are model keys, not stored.
        "tensors": sorted({f.tensor for f in x.mine if f.tensor and f.code in _EXPERTS}),
        "title": plural(len(x.mine), "expert finding"),
        "impact": "experts are missing or incomplete",
    }
    columns = scan_columns(x.scanned)
    experts = columns.experts
    layer, missing = experts["layer"], experts["missing"]
    if not len(layer):
        return facts
    partial = ~missing & (experts["tensors_found"] < experts["tensors_expected"])
    layers, per_layer = np.unique(layer[missing], return_counts=True)
    expected = int(np.unique(layer, return_counts=True)[1].max())
    pairs = zip(layer[partial].tolist(), experts["expert"][partial].tolist(), strict=True)
    cells: list[tuple[int, int | None]] = [(n, None) for n in layers.tolist()]
    facts["cells"] = cells + list(pairs)[:1000]
    # Bytes that should be there: each missing expert weighs what its present siblings do.
    present = experts["bytes"][~missing]
    mean = float(present.mean()) if len(present) else 0.0
    n_missing, n_partial = int(missing.sum()), int(partial.sum())
    parts = []
    if n_missing:
        counts = set(per_layer.tolist())
        each = f"{counts.pop()} of {expected}" if len(counts) == 1 else "some"
        table = columns.layers
        mtp = set(table["layer"][table["is_mtp"]].tolist())
        parts.append(f"{each} experts missing in {_moe_layers(layers.tolist(), mtp)}")
    if n_partial:
        parts.append(f"{plural(n_partial, 'expert')} incomplete")
    facts["title"] = "; ".join(parts) or "experts differ from their siblings"
    facts["impact"] = (
        f"{plural(n_missing, 'expert')} (about {format_bytes(mean * n_missing)}) never "
        "written: the model cannot be loaded as its config declares"
        if n_missing
        else "some experts lack tensors or have odd shapes: loading fails for them"
    )
    return facts


def _quant(file: str) -> Callable[[_Facts], dict[str, Any]]:
    """Facts of the quantized modules a quantization config (`file`) leaves out."""
    return lambda x: {"modules": plural(len(x.mine), "quantized module"), "files": [file]}


def _consolidation(x: _Facts) -> dict[str, Any] | None:
    """A DCP run's recorded mapping sends every tensor to one file: consolidate following
    a reference instead (the one on this machine when known)."""
    if x.scanned.dcp is None:
        return None
    ref = consolidation_reference(x.scanned)
    text = (
        "consolidate with the reference model's index instead of the recorded mapping; "
        "without one, consolidation packs by size (5 GB per file)"
        if ref is None
        else f"consolidate following {ref.label} ({plural(ref.files, 'file')}) instead of "
        "the recorded mapping: `ckpt-inspect consolidate` and the Consolidate tab do by default"
    )
    source = "REF" if ref is None else shell_word(ref.path)
    command = f"ckpt-inspect consolidate {x['path']} DEST --reference {source}"
    return {"action": Action("consolidate", text, command)}


def _load(x: _Facts) -> dict[str, Any]:
    """The load check's findings of one code (each load rule takes one) that no other issue
    explains. Their keys: every one of the verdict's when given (but those another issue
    claimed: only missing and mismatched keys can be, `_Context.load_claim`), else the
    findings' (those listed before the fold: 'more than 200 tensors')."""
    v, code = x.ctx.verdict, x.mine[0].code
    if v is not None:
        claimed = () if code == Code.LOAD_UNEXPECTED_TENSOR else x.ctx.explained
        keys: Sequence[str] = [k for k in _verdict_keys(v, code) if k not in claimed]
        count = plural(len(keys), "tensor")
    else:
        keys = sorted({f.tensor for f in x.mine if f.tensor})
        count = plural(len(keys), "tensor")
        if any(f.tensor is None for f in x.mine):
            count = f"more than {len(keys):,} tensors" if keys else "tensors"
    # The class config.json names, which the load check builds.
    names = (x.scanned.config or {}).get("architectures")
    first = names[0] if isinstance(names, list) and names else None
    model = (v.architecture if v is not None else None) or (
        first if isinstance(first, str) else None
    )
    numbered = layer_expert_numbers(list(keys))
    cells = list(dict.fromkeys((n, e) for n, e in numbered if n is not None))[:1000]
    facts = {"model": legible(model or "the model"), "count": count, "cells": cells}
    facts["named"] = f" ({', '.join(map(legible, keys))})" if 0 < len(keys) <= 2 else _where(keys)
    if code == Code.LOAD_MISSING_TENSOR:
        # The tensors are not in the checkpoint: the browser cannot show them, the heatmap
        # shows their layers.
        return facts | {"tensors": (), "files": (), "untied": _untied(x.scanned.config, keys)}
    # The stored tensors behind the model keys (what the tensor browser can show).
    sources = v.sources if v is not None else {}
    stored = {n for k in keys for n in sources.get(k, (k,))}
    return facts | {"tensors": sorted(stored | {f.tensor for f in x.mine if f.tensor})}


def _load_of_experts(ctx: _Context, pending: list[Finding]) -> list[Finding]:
    """The load check's findings that experts the structure check found missing or
    incomplete explain (one cause: the experts were never written): their missing tensors,
    and the stacked expert tensors of their layers, which come out short (transformers
    stacks a layer's experts into one tensor per projection)."""
    codes = (Code.LOAD_MISSING_TENSOR, Code.LOAD_SHAPE_MISMATCH)
    if not any(f.code in codes for f in pending):
        return []  # what `load_claim` gives then, without the experts' columns
    experts = scan_columns(ctx.scanned).experts
    layer, missing = experts["layer"], experts["missing"]
    short = missing | (experts["tensors_found"] < experts["tensors_expected"])
    cells = set(zip(layer[short].tolist(), experts["expert"][short].tolist(), strict=True))
    layers = {n for n, _ in cells}
    if not cells:
        return []
    # The layers whose every expert row is missing.
    distinct, at = np.unique(layer, return_inverse=True)
    present = np.bincount(at.reshape(-1), weights=~missing, minlength=len(distinct))
    empty = set(distinct[present == 0].tolist())

    def of_a_short_expert(key: str) -> bool:
        layer, expert = layer_expert_numbers([key])[0]
        # A stacked key (no expert number) is missing when its layer has no expert at all.
        stacked = expert is None and ".experts." in key and layer in empty
        return (layer, expert) in cells or stacked

    def stacked_in_a_short_layer(key: str) -> bool:
        layer, expert = layer_expert_numbers([key])[0]
        return ".experts." in key and layer in layers and expert is None

    return [
        *ctx.load_claim(pending, of_a_short_expert, Code.LOAD_MISSING_TENSOR),
        *ctx.load_claim(pending, stacked_in_a_short_layer, Code.LOAD_SHAPE_MISMATCH),
    ]


def _verdict_keys(verdict: LoadVerdict, code: str) -> tuple[str, ...]:
    """The verdict's keys behind the load findings of `code`."""
    if code == Code.LOAD_MISSING_TENSOR:
        return verdict.missing
    if code == Code.LOAD_SHAPE_MISMATCH:
        return tuple(m.key for m in verdict.mismatched)
    return verdict.unexpected


def _untied(config: Mapping[str, Any] | None, keys: Sequence[str]) -> str:
    """The advice to add when lm_head is lost and config.json unties it, else ''."""
    head = any(k.rpartition(".")[0].endswith("lm_head") for k in keys)
    if head and (config or {}).get("tie_word_embeddings") is False:
        return (
            "; config.json unties the output head from the input embedding: restore lm_head, "
            "or set tie_word_embeddings true if the model was trained tied"
        )
    return ""


def _per_code(ctx: _Context, pending: list[Finding]) -> list[Issue]:
    """What no rule explains: one issue per code, in the code's own words."""
    by_code: dict[str, list[Finding]] = defaultdict(list)
    for f in pending:
        by_code[f.code].append(f)
    out = []
    for code, items in by_code.items():
        known = _known(code)
        kind, text = (known.fix.kind, known.fix.text) if known else ("review", "")
        help_text = known.help if known else items[0].message
        first = help_text.split("; ")[0].split(": ")[0].rstrip(".")
        layers = sorted({f.layer for f in items if f.layer is not None})
        title = (
            _lead(items[0], first)
            if len(items) == 1
            else f"{len(items):,} x {code}: {first[0].lower()}{first[1:]}"
        )
        action = Action(kind, text or help_text.rstrip("."), _command(ctx, kind))
        if known in _RESTORABLE:
            action = _lost_tensors_action(ctx, _RESTORABLE[known], text)
        out.append(
            Issue(
                key=code,
                severity=_worst(items),
                title=title,
                impact=first,
                action=action,
                findings=tuple(items),
                tensors=tuple(sorted({f.tensor for f in items if f.tensor})),
                files=tuple(sorted({f.file for f in items if f.file})),
                cells=tuple((layer, None) for layer in layers),
            )
        )
    return out


# A title of one finding is its message's first clause, whole: a sentence cut mid-way ("has
# no ... (68 more characters)") says neither what is wrong nor where the rest is. Past this
# length (a message quoting huge names) the title is the file and what the code means.
_TITLE_LIMIT = 400


def _lead(finding: Finding, meaning: str) -> str:
    """The title of an issue of one finding: its message's first clause, or, when that is
    longer than `_TITLE_LIMIT`, the finding's file and the code's meaning (the project's own
    words, so its asides can go), cut at a word only if the file name is huge."""
    lead = _first_clause(finding.message)
    if len(lead) <= _TITLE_LIMIT:
        return lead
    meaning = re.sub(r" \([^()]*\)", "", meaning)
    text = f"{finding.file}: {meaning[0].lower()}{meaning[1:]}" if finding.file else meaning
    return cut_at_word(text, _TITLE_LIMIT)


def _first_clause(message: str) -> str:
    """`message` up to its first "; " outside parentheses: a "; " inside an aside ("1 tensor
    (layers 0; e.g. x)") does not end the clause, and cutting there left a title with an
    unclosed parenthesis."""
    depth = 0
    for i, char in enumerate(message):
        if char == "(":
            depth += 1
        elif char == ")":
            depth = max(depth - 1, 0)
        elif char == ";" and not depth and message.startswith("; ", i):
            return message[:i]
    return message


def _codes(*codes: Code) -> Callable[[Finding], bool]:
    wanted = frozenset(codes)
    return lambda f: f.code in wanted


def _quant_file(in_config: bool) -> Callable[[Finding], bool]:
    return lambda f: (
        f.code == Code.QUANT_CONFIG_MISSING_LAYER and (f.file == CONFIG_NAME) == in_config
    )


_REVIEW_LOAD = "ckpt-inspect diff REF {path} --reference"
_QUANT_IMPACT = "loaders treat those modules as unquantized and misread their weights"

# The grouping rules, in the order they claim findings.
_RULES: tuple[_Rule, ...] = (
    _Rule(
        "shards-damaged",
        _codes(
            Code.HEADER_UNREADABLE,
            Code.HEADER_INVALID_ENTRY,
            Code.HEADER_DUPLICATE_KEY,
            Code.UNKNOWN_DTYPE,
            Code.SIZE_MISMATCH,
            Code.OFFSET_INVALID,
            Code.FILE_TRUNCATED,
            Code.TRAILING_BYTES,
        ),
        "{n} shard{s_are} damaged: {shown} ({codes})",
        "{held:,} tensors in {them} cannot be trusted",
        "restore",
        "copy {shown} again from the source{candidate}, or re-export {them}; nothing here "
        "rewrites shard data",
        "{copy}",
        severity=None,
        facts=_shards_damaged,
        tensors=False,
    ),
    _Rule(
        "shard-files-missing",
        _codes(Code.INDEX_MISSING_FILE),
        "{gone} named by the index {are} not on disk: {shown}",
        "{lost} lost: loading fails or leaves them uninitialised",
        "restore",
        "copy {shown} again from the source (rebuilding the index would only hide the "
        "loss), or restore their tensors from a reference copy{candidate}",
        "{restore_command}",
        facts=_shards_gone,
    ),
    _Rule(
        "files-unsafe",
        _codes(Code.FILE_UNSAFE),
        "{n_files} not read: not a regular file inside the checkpoint folder (a link out of "
        "it, a FIFO, a device): {shown}",
        "what they hold is not checked, and a loader that follows them reads files outside "
        "the checkpoint",
        "review",
        "{unsafe}",
        "ckpt-inspect check {path}",
        facts=_files_unsafe,
        tensors=False,
    ),
    _Rule(
        "temp-files-left",
        _codes(Code.TEMP_FILE_LEFT),
        "{n_files} left by killed runs (or named like their temp files): {shown}",
        "their bytes take disk space nobody sees",
        "review",
        "{left}",
        "ckpt-inspect repair {path} --recover",
        severity=Severity.WARNING,
        facts=lambda x: {
            "n_files": plural(len(x["files"]) or len(x.mine), "entry", many="entries"),
            "left": Code.TEMP_FILE_LEFT.fix.text.replace("PATH", str(x.ctx.path)),
        },
        tensors=False,
    ),
    _Rule(
        "index-misses-tensors",
        _codes(Code.UNINDEXED_TENSOR, Code.UNINDEXED_FILE),
        impact="{described} invisible to loaders: a model loaded through the index silently "
        "lacks them{seen}",
        kind="repair",
        text="rebuild {index} from the shard headers",
        command="index",
        facts=_index_misses,
    ),
    _Rule(
        "index-stale",
        _codes(
            Code.INDEX_UNREADABLE,
            Code.INDEX_UNSAFE_PATH,
            Code.INDEX_DANGLING_TENSOR,
            Code.INDEX_WRONG_FILE,
            Code.TOTAL_SIZE_MISMATCH,
            Code.TOTAL_PARAMETERS_MISMATCH,
        ),
        kind="repair",
        text="rebuild {index} from the shard headers",
        command="index",
        severity=None,
        facts=_index_stale,
    ),
    _Rule(
        "duplicate-tensors",
        _codes(Code.DUPLICATE_TENSOR),
        "{n:,} tensor names are stored in more than one shard",
        "loaders keep whichever copy they read last",
        "repair",
        "decide which copy is right (duplicates policy: first, last or the index's), "
        "then rebuild the index",
        "index",
        facts=lambda x: {"n": len(x["tensors"]) or len(x.mine)},
    ),
    _Rule(
        "sidecars-disagree",
        _codes(*_SIDECARS),
        impact="per-layer loaders read wrong or incomplete tensor lists",
        kind="repair",
        text="rebuild each sidecar from its shard's header",
        command="sidecars",
        severity=None,
        facts=_sidecars,
    ),
    _Rule(
        "config-unreadable",
        _codes(Code.CONFIG_UNREADABLE),
        "{config} is not valid JSON (truncated or overwritten)",
        "transformers cannot load the model (AutoConfig fails); the checks here use what its "
        "readable part says",
        "restore",
        "restore {config} from the training run or the original model{candidate}; it "
        "cannot be rebuilt from the shards",
        "{copy}",
        facts=lambda x: {"copy": x.ctx.copy_command([CONFIG_NAME])},
        tensors=False,
    ),
    _Rule("experts-missing", _codes(*_EXPERTS), facts=_experts),
    # A compressed-tensors config.json is the model's own config, which no repair rewrites:
    # the fix is a choice left to the person. hf_quant_config.json's are repaired here.
    _Rule(
        "quant-config-missing-layers-config",
        _quant_file(in_config=True),
        "{config}'s quantization_config leaves out {modules}",
        _QUANT_IMPACT,
        "review",
        "take the modules out of {config}'s ignore list (or add them to a group's "
        "targets), or re-export them unquantized",
        "ckpt-inspect check {path}",
        facts=_quant(CONFIG_NAME),
    ),
    _Rule(
        "quant-config-missing-layers",
        _quant_file(in_config=False),
        "hf_quant_config.json lacks {modules}",
        _QUANT_IMPACT,
        "repair",
        "add the missing quantized_layers entries from their sibling experts' configs "
        "(opt-in: review the diff)",
        "quant-config",
        facts=_quant(QUANT_CONFIG_NAME),
    ),
    _Rule(
        "dcp-chunks-broken",
        _codes(
            Code.DCP_SHARDING_INFO_MISSING,
            Code.DCP_COVERAGE_GAP,
            Code.DCP_CHUNK_OVERLAP,
            Code.DCP_DTYPE_CONFLICT,
        ),
        "DCP chunks do not tile {n:,} tensors ({codes})",
        "consolidation refuses; a rank's file is missing or short",
        "restore",
        "copy the missing or short rank files again, or re-save the checkpoint",
        _RESAVE,
        facts=lambda x: {"n": len({f.tensor for f in x.mine})},
    ),
    # One file takes every tensor: a plain checkpoint, or a DCP run's recorded mapping.
    _Rule(
        "shards-collapsed",
        _codes(Code.MAPPING_COLLAPSED),
        "every tensor sits in one file over the 5 GB split size",
        "loaders read one huge file; hubs and tools expect shards",
        "reshard",
        "split it into shards of at most 5 GB",
        "ckpt-inspect repair {path} --only reshard",
        severity=Severity.WARNING,
        facts=lambda x: {} if x.scanned.dcp is None else None,
        tensors=False,
    ),
    _Rule(
        "mapping-collapsed",
        _codes(Code.MAPPING_COLLAPSED),
        "the recorded file-index mapping sends every tensor to one output file",
        "a consolidation that follows it writes one huge file instead of the reference "
        "model's shards",
        severity=Severity.WARNING,
        facts=_consolidation,
        tensors=False,
    ),
    _Rule(
        "load-missing-tensors",
        _codes(Code.LOAD_MISSING_TENSOR),
        "{model} expects {count} the checkpoint does not hold{named}",
        "transformers initialises them at random (silently, with a warning in a log); serving "
        "engines refuse the checkpoint or load garbage",
        "restore",
        "copy them back from a reference that holds them (the checkpoint this one was made "
        "from, or the original model){candidate}; a reference of another dtype is refused "
        "where the copy would not match its siblings{untied}",
        "{restore_command}",
        facts=_load,
    ),
    _Rule(
        "load-shape-mismatch",
        _codes(Code.LOAD_SHAPE_MISMATCH),
        "{count} stored with another shape than {model} expects{named}",
        "loading fails (with ignore_mismatched_sizes, transformers re-initialises them at random)",
        "review",
        "compare {config} (hidden and expert sizes, head counts) with the model these "
        "weights come from: a wrong config is fixed there, a wrong tensor by re-exporting",
        _REVIEW_LOAD,
        facts=_load,
    ),
    _Rule(
        "load-unexpected-tensors",
        _codes(Code.LOAD_UNEXPECTED_TENSOR),
        "{count} {model} would not load{named}",
        "transformers drops them and strict loaders refuse the checkpoint: {config} may name "
        "the wrong architecture or sizes, or they are strays",
        "review",
        "check that {config} describes the model these weights belong to; remove stray "
        "tensors only once sure they are not needed",
        _REVIEW_LOAD,
        severity=Severity.WARNING,
        facts=_load,
    ),
)


# -- helpers ---------------------------------------------------------------------------------


# The layouts whose index `repair --only index` rebuilds (`inspector._internal.plans.repair`
# plans it for these only): `model.safetensors.index.json` of sharded safetensors, and
# `pytorch_model.bin.index.json` of sharded `.bin` checkpoints.
INDEX_REBUILT_FOR = frozenset(
    {LayoutName.HF_SHARDED, LayoutName.MODELOPT_PER_LAYER, LayoutName.PYTORCH_BIN}
)


def _repair(ctx: _Context, part: str, text: str) -> Action:
    if part == "index" and ctx.scanned.layout not in INDEX_REBUILT_FOR:
        return Action(
            "re-export",
            "re-save the model with save_pretrained, which writes the shards and their index "
            "together (ckpt-inspect rebuilds the index of sharded safetensors and .bin "
            "checkpoints only)",
            _reexport(ctx),
        )
    return Action("repair", text, f"ckpt-inspect repair {ctx.path} --only {part}", (part,))


# Codes whose tensors `repair --from REF` copies back from a reference (what it restores,
# `inspector._internal.plans.restore`), with what the reference must hold.
_RESTORABLE: dict[Code, str] = {
    Code.LAYER_MISSING: "the layer's weights are not in this folder: copy them back from a "
    "checkpoint that holds them in this format (the one this export was made from)",
    Code.MTP_MISSING: "copy the MTP layers back from the checkpoint this one was made from "
    "(transformers drops them on save; serving engines load them)",
}


def _lost_tensors_action(ctx: _Context, restore: str, otherwise: str) -> Action:
    """`repair --from REF` for tensors a reference can supply (a layout restores into:
    `inspector._internal.plans.restore`), naming the candidate reference when one is known;
    `otherwise` (re-export) where it cannot."""
    if ctx.scanned.layout in _RESTORES_INTO and ctx.scanned.local_path is not None:
        text = restore + ctx.candidate() + (f"; or {otherwise}" if otherwise else "")
        return Action("restore", text, ctx.restore_command())
    return Action("re-export", otherwise or restore, _reexport(ctx))


def _command(ctx: _Context, kind: ActionKind) -> str:
    return {
        "restore": ctx.restore_command(),
        "re-export": _reexport(ctx),
        "consolidate": f"ckpt-inspect consolidate {ctx.path} DEST --reference REF",
    }.get(kind, f"ckpt-inspect check {ctx.path}")


def _reexport(ctx: _Context) -> str:
    """What a re-export is for this checkpoint: the exporter run again, or for a training
    checkpoint the training job's save (the rerun-drift of torch_dist is fixed there)."""
    return _RESAVE if ctx.scanned.layout in _TRAINING_LAYOUTS else "re-run the exporter"


def _known(code: str) -> Code | None:
    try:
        return code_of(code)
    except ValueError:  # a finding built by hand with a code of its own
        return None


def _worst(findings: Iterable[Finding]) -> Severity:
    return min((Severity(f.severity) for f in findings), key=severity_rank)


def _codes_text(codes: Counter) -> str:
    return ", ".join(f"{code} x{n}" if n > 1 else str(code) for code, n in codes.most_common())


def _moe_layers(layers: Sequence[int], mtp: Collection[int]) -> str:
    """'3 MoE layers (1-3) and MTP layer 4': MTP layers said apart, as the scan counts them
    (`inspector._internal.findings.words`, one layer numbering)."""
    decoder = [n for n in layers if n not in mtp]
    parts = [f"{plural(len(decoder), 'MoE layer')} ({fold_ranges(decoder, limit=6)})"]
    extra = [n for n in layers if n in mtp]
    if extra:
        parts = parts[:1] if decoder else []
        parts.append(layers_text(extra, limit=6, mtp=extra))
    return " and ".join(parts)


def _where(names: Sequence[str]) -> str:
    """': mtp.layers.0.*' when every name shares a dotted prefix of two parts or more."""
    if not names:
        return ""
    first, last = min(names), max(names)
    common = []
    for a, b in zip(first.split("."), last.split("."), strict=False):
        if a != b:
            break
        common.append(a)
    return f" ({legible('.'.join(common))}.*)" if len(common) >= 2 and len(names) > 1 else ""


# The public names (`inspector.Problem`, `inspector.group_problems`, docs/python.md) of an
# issue, kept as they are; the notebook UI imports them too.
Problem = Issue
group_problems = group_issues
