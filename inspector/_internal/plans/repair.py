"""Repair plans: rebuild JSON files (the layout's own index, sidecars, the quantization config)
from what is really on disk. Plan, print, then execute.

Planning is pure; `RepairPlan.execute()` is the only writer (folder lock, timestamped backup,
atomic writes through `execution/atomic.py`, a re-scan) and never touches tensor data. A plan
writes only over a file whose role the scan established (`unowned_target`); anything else at
a name it would write is refused in one line and left alone.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from inspector._internal.checkpoint.loaded import kept_in, read_order
from inspector._internal.checkpoint.naming_rules import expert_template
from inspector._internal.checkpoint.parameters import (
    count_parameters,
    parse_count,
    uncounted_elements,
)
from inspector._internal.checkpoint.quant_config import (
    MAX_WILDCARDS,
    exclude_matcher,
    exclude_patterns,
    quant_section,
    quantized_modules,
)
from inspector._internal.checkpoint.read_problems import FileRole
from inspector._internal.checkpoint.scanned import (
    IndexDoc,
    LayoutName,
    PerLayerInfo,
    ScannedCheckpoint,
)
from inspector._internal.checkpoint.tables import rows_named
from inspector._internal.checkpoint.tensor_shards import normalize_member, normalized
from inspector._internal.checks import check
from inspector._internal.common.display import MESSAGE_LIMIT, legible
from inspector._internal.common.filenames import (
    BIN_INDEX_NAME,
    INDEX_NAME,
    QUANT_CONFIG_NAME,
    is_well_known,
    role_of,
)
from inspector._internal.common.text import examples, plural
from inspector._internal.diagnosis.issues import INDEX_REBUILT_FOR, Problem
from inspector._internal.execution.atomic import apply_writes, folder_lock, recover_folder
from inspector._internal.execution.temps import Leftovers, find_leftovers
from inspector._internal.findings.codes import Code, Severity
from inspector._internal.findings.finding import Finding
from inspector._internal.integrity.refresh import refresh_manifest
from inspector._internal.layouts._common import JSON_CAP
from inspector._internal.layouts.modelopt_per_layer import shard_of_sidecar, sidecar_name
from inspector._internal.scan.entry import scan
from inspector._internal.storage import (
    EntryKind,
    Location,
    RemoteURL,
    TooLargeError,
    local_location,
)
from inspector.errors import InspectorError, PlanRefusedError, UnsafeFileError

if TYPE_CHECKING:
    from inspector._internal.load.verdict import LoadVerdict

__all__ = [
    "DuplicatePolicy",
    "FileWrite",
    "RepairPlan",
    "RepairPreview",
    "RepairResult",
    "index_name",
    "plan_index",
    "plan_quant_config",
    "plan_repair",
    "plan_sidecars",
    "preview_repair",
    "read_current_text",
    "rechecked",
    "scanned_after",
    "unowned_target",
]

DuplicatePolicy = Literal["first", "last", "index"]


@dataclass(frozen=True, slots=True)
class FileWrite:
    """One file to (re)write: its current text (None if absent) and the new one."""

    path: str
    old: str | None
    new: str
    changes: tuple[str, ...]

    def diff(self, *, context: int = 2, max_lines: int = 400) -> str:
        lines = list(
            difflib.unified_diff(
                (self.old or "").splitlines(keepends=True),
                self.new.splitlines(keepends=True),
                fromfile=f"a/{self.path}",
                tofile=f"b/{self.path}",
                n=context,
            )
        )
        if len(lines) > max_lines:
            lines = [*lines[:max_lines], f"... {len(lines) - max_lines} more diff lines\n"]
        # One output line per diff line, whatever line break ended it in the file.
        return "".join(legible(line.rstrip("\n"), limit=MESSAGE_LIMIT) + "\n" for line in lines)


@dataclass(frozen=True)
class RepairResult:
    written: tuple[str, ...]
    backup_dir: Path | None
    # None: not re-checked (the files were written to an output folder, the checkpoint
    # itself is unchanged).
    remaining: tuple[Finding, ...] | None
    # The temp files killed runs had left, removed (and those kept, with why).
    leftovers: Leftovers = field(default_factory=Leftovers)


@dataclass(frozen=True)
class RepairPlan:
    """What a repair would write, and what it refuses to decide. `root` is the checkpoint
    (local or remote); the files are written there, or into `output_dir` when one is named
    (always, for a remote checkpoint: its repaired JSON files are written locally)."""

    root: Path | RemoteURL
    writes: tuple[FileWrite, ...] = ()
    refused: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    output_dir: Path | None = None
    # Temp files killed runs left in the folder: `removable` are removed under the lock
    # when the plan runs (judged again then), `kept` are only shown.
    leftovers: Leftovers = field(default_factory=Leftovers)

    @property
    def empty(self) -> bool:
        return not self.writes and not self.leftovers.removable

    def describe(self) -> str:
        """The plan in words: one block per file, the temp files it removes, then
        refusals and notes."""
        if not self.writes and not self.refused and not self.leftovers:
            return f"{self.root}: nothing to repair"
        into = f" (written to {self.output_dir})" if self.output_dir is not None else ""
        lines = [f"repair plan for {self.root}{into}"]
        for w in self.writes:
            lines.append(f"  {'rewrite' if w.old is not None else 'create'} {w.path}")
            lines.extend(f"    - {c}" for c in w.changes)
        lines.extend(f"  {line}" for line in self.leftovers.lines())
        lines.extend(f"  REFUSED: {r}" for r in self.refused)
        lines.extend(f"  note: {n}" for n in self.notes)
        return "\n".join(legible(line, limit=MESSAGE_LIMIT) for line in lines)

    def diff(self) -> str:
        return "".join(w.diff() for w in self.writes)

    def __str__(self) -> str:
        return self.describe()

    def __add__(self, other: RepairPlan) -> RepairPlan:
        return RepairPlan(
            self.root,
            self.writes + other.writes,
            self.refused + other.refused,
            self.notes + other.notes,
            self.output_dir,
            self.leftovers or other.leftovers,
        )

    def preview(
        self,
        scanned: ScannedCheckpoint,
        *,
        findings: Sequence[Finding] | None = None,
        verdict: LoadVerdict | None = None,
        model: bool = True,
        trust_remote_code: bool = False,
        cache: bool = True,
    ) -> RepairPreview:
        """Which findings executing this plan would fix (see `preview_repair`)."""
        return preview_repair(
            self,
            scanned,
            findings=findings,
            verdict=verdict,
            model=model,
            trust_remote_code=trust_remote_code,
            cache=cache,
        )

    def execute(
        self,
        *,
        backup: bool = True,
        model: bool = True,
        trust_remote_code: bool = False,
        cache: bool = True,
    ) -> RepairResult:
        """Write the plan atomically under the folder lock, then re-scan and re-check.

        In place, files changed since the plan was made abort the run: plan again. Into an
        output folder, the new files are written there (a file already there is backed up)
        and nothing is re-checked: the checkpoint itself did not change.

        `model`, `trust_remote_code` and `cache` are as in `check`, for the re-check
        (`model=False`: the plain rules only, without building the model).
        """

        target = self.output_dir if self.output_dir is not None else self.root
        if not isinstance(target, Path):
            raise InspectorError(
                f"{self.root}: a remote checkpoint is not repaired in place; name a local "
                "folder for the repaired files (--output-dir DIR)"
            )
        target.mkdir(parents=True, exist_ok=True)
        leftovers = Leftovers()
        with folder_lock(target):
            if self.output_dir is None:
                # A journal a killed run left is finished first, and its temp files removed.
                paths = [w.path for w in self.writes]
                leftovers = recover_folder(target, writes=paths).leftovers
                folder = local_location(target)
                for w in self.writes:
                    if read_current_text(folder / w.path) != w.old:
                        raise InspectorError(
                            f"{target / w.path} changed since the repair was planned; "
                            "run the repair again to plan from the current files"
                        )
            backup_dir = (
                apply_writes(target, [(w.path, w.new.encode()) for w in self.writes], backup=backup)
                if self.writes
                else None
            )
        written = tuple(w.path for w in self.writes)
        if self.output_dir is not None:
            return RepairResult(written, backup_dir, None)
        refresh_manifest(target, written=written)
        remaining = rechecked(target, model=model, trust_remote_code=trust_remote_code, cache=cache)
        return RepairResult(written, backup_dir, remaining, leftovers)


def rechecked(
    root: Path, *, model: bool, trust_remote_code: bool, cache: bool
) -> tuple[Finding, ...]:
    """The findings of a folder a plan wrote (or left as it was): re-scanned and checked
    (`model`, `trust_remote_code`, `cache`: as in `check`), for the plan's result."""
    return tuple(check(scan(root), model=model, trust_remote_code=trust_remote_code, cache=cache))


# -- what a plan fixes ------------------------------------------------------------------------


@dataclass(frozen=True)
class RepairPreview:
    """The findings a plan fixes, those it leaves, and any it would add: exact, because the
    checks are pure and were re-run on the checkpoint as the plan leaves it (in memory)."""

    fixes: tuple[Finding, ...]
    remains: tuple[Finding, ...]
    introduces: tuple[Finding, ...]

    @property
    def matters(self) -> bool:
        """True when the plan fixes an error or a warning, not only info or cosmetics. (It may
        still add findings, e.g. an index rebuilt without its sidecars now disagrees with
        them: `introduces` lists those.)"""
        return any(f.severity != Severity.INFO for f in self.fixes)

    def issues(self, problems: Sequence[Problem]) -> tuple[list[Problem], list[Problem]]:
        """(the issues this plan fixes, the issues it leaves), of `problems` grouped from the
        findings it was previewed against: an issue is fixed when the plan fixes any of its
        findings, and left while any of them stays, so a partly fixed issue is in both."""
        fixed = set(self.fixes)
        return (
            [p for p in problems if fixed.intersection(p.findings)],
            [p for p in problems if not fixed.issuperset(p.findings)],
        )


def preview_repair(
    plan: RepairPlan,
    scanned: ScannedCheckpoint,
    *,
    findings: Sequence[Finding] | None = None,
    verdict: LoadVerdict | None = None,
    model: bool = True,
    trust_remote_code: bool = False,
    cache: bool = True,
) -> RepairPreview:
    """Which of `findings` (default: `check(scanned, ...)`) the plan fixes, compared by code
    and what they are about (the tensor, else the file; layer, expert), not by message: a
    folded message may change its counts.

    `model`, `trust_remote_code`, `cache` and `verdict` (the load verdict of `scanned`) are
    as in `check`. The checkpoint after the plan gets its own verdict when the plan rewrites what a
    loader reads (the index names the shards it opens, the quantization config says which
    scales belong); a plan that rewrites only sidecars keeps `verdict`.
    """

    options: dict[str, Any] = {
        "model": model,
        "trust_remote_code": trust_remote_code,
        "cache": cache,
    }
    before = list(findings) if findings is not None else check(scanned, verdict=verdict, **options)
    if not plan.writes:
        after = before
    else:
        loader_reads = {w.path for w in plan.writes} & {
            INDEX_NAME,
            BIN_INDEX_NAME,
            QUANT_CONFIG_NAME,
        }
        kept = None if loader_reads else verdict
        after = check(scanned_after(plan, scanned), verdict=kept, **options)
    # The temp files the plan removes are gone after it (the check lists the folder as it is).
    removed = {item.path for item in plan.leftovers.removable}
    after = [f for f in after if not (f.code == Code.TEMP_FILE_LEFT and f.file in removed)]
    keys_after = {_where(f) for f in after}
    keys_before = {_where(f) for f in before}
    return RepairPreview(
        fixes=tuple(f for f in before if _where(f) not in keys_after),
        remains=tuple(f for f in before if _where(f) in keys_after),
        introduces=tuple(f for f in after if _where(f) not in keys_before),
    )


def scanned_after(plan: RepairPlan, scanned: ScannedCheckpoint) -> ScannedCheckpoint:
    """`scanned` as it would be after `plan.execute()`, built in memory: the planned JSON
    texts replace the index, sidecars and quant config, and what the scan could not read in
    the rewritten files is forgotten. Such plans change no shard header or config.json, so
    the tables built from them are shared with `scanned` instead of rebuilt for 300,000
    rows."""
    index, quant, info = scanned.index, scanned.quant_config, scanned.info
    sidecars = dict(scanned.sidecars)
    shards = {s.file for s in scanned.shards}
    rewritten = set()
    for write in plan.writes:
        value = json.loads(write.new)
        rewritten.add(write.path)
        # The writer's `<stem>.json` and `<shard>.json` alike: the one rule of which shard
        # a sidecar describes.
        shard = shard_of_sidecar(write.path, shards)
        if write.path == index_name(scanned):
            index = _doc(write.path, value)
        elif write.path == QUANT_CONFIG_NAME:
            quant = value
        elif shard is not None and isinstance(info, PerLayerInfo):
            sidecars[shard] = _doc(write.path, value)
        else:
            raise ValueError(f"{write.path}: a repair plan writes no such file; cannot preview it")
    if isinstance(info, PerLayerInfo):
        info = PerLayerInfo(sidecars)
    after = dataclasses.replace(
        scanned,
        index=index,
        info=info,
        quant_config=quant,
        read_problems=tuple(p for p in scanned.read_problems if p.file not in rewritten),
        json_files=scanned.json_files | rewritten,
    )
    if "tables" in scanned.__dict__:
        after.__dict__["tables"] = scanned.__dict__["tables"]
    return after


def _doc(path: str, value: dict[str, Any]) -> IndexDoc:
    # Our own output (`plan_index`, `plan_sidecars`): an object whose weight_map holds safe
    # names of existing shards, so none of the reader's defences apply.
    document = {k: None if k in ("weight_map", "metadata") else v for k, v in value.items()}
    return IndexDoc.from_map(path, value["weight_map"], value.get("metadata") or {}, document)


def _where(f: Finding) -> tuple[object, ...]:
    # A finding about a tensor is that tensor's, whichever file it names (a duplicate names
    # the holder the index points at, which the repair may change); others are their file's.
    return (
        (f.code, f.tensor, f.layer, f.expert) if f.tensor else (f.code, f.file, f.layer, f.expert)
    )


# -- planning ------------------------------------------------------------------------------


def plan_repair(
    scanned: ScannedCheckpoint,
    *,
    only: set[str] | None = None,
    duplicates: DuplicatePolicy | None = None,
    quant_config: bool = False,
    output_dir: str | Path | None = None,
) -> RepairPlan:
    """Every JSON repair that applies to this checkpoint (`only` picks among index, sidecars,
    quant-config); quant-config is opt-in (named in `only`, or `quant_config=True`).
    Re-sharding a collapsed checkpoint is `inspector._internal.plans.reshard.plan_reshard`.

    `output_dir` writes the repaired files into that local folder instead of the checkpoint;
    a remote checkpoint needs one (its files are never uploaded)."""
    if output_dir is None and scanned.local_path is None:
        raise PlanRefusedError(
            f"{scanned.path}: a remote checkpoint is not repaired in place; name a local "
            "folder for the repaired JSON files (--output-dir DIR) and upload them yourself"
        )
    plan = RepairPlan(scanned.path)
    wanted = only or {"index", "sidecars", "quant-config"}
    if "index" in wanted and scanned.layout in INDEX_REBUILT_FOR:
        plan = plan + plan_index(scanned, duplicates=duplicates)
    if "sidecars" in wanted and scanned.layout is LayoutName.MODELOPT_PER_LAYER:
        plan = plan + plan_sidecars(scanned)
    if "quant-config" in wanted and (quant_config or (only and "quant-config" in only)):
        plan = plan + plan_quant_config(scanned)
    if output_dir is not None:
        plan = dataclasses.replace(plan, output_dir=Path(output_dir).expanduser().resolve())
    elif isinstance(scanned.path, Path):
        # What the run would remove under the lock (judged again then).
        paths = [w.path for w in plan.writes]
        plan = dataclasses.replace(
            plan, leftovers=find_leftovers(scanned.path, writes=paths, locked=True)
        )
    return plan


def index_name(scanned: ScannedCheckpoint) -> str:
    """The index file of this checkpoint's layout: `pytorch_model.bin.index.json` for `.bin`
    files, `model.safetensors.index.json` otherwise."""
    return BIN_INDEX_NAME if scanned.layout is LayoutName.PYTORCH_BIN else INDEX_NAME


def plan_index(
    scanned: ScannedCheckpoint, *, duplicates: DuplicatePolicy | None = None
) -> RepairPlan:
    """Rebuild the index (`index_name`) from the shard headers.

    Tensors added, removed and moved are listed; `total_size` and `total_parameters` are
    recomputed; other metadata keys are kept. A tensor in two shards with different dtype or
    shape is refused unless `duplicates` says which copy to keep.
    """
    refused = _unreadable_shards(scanned)
    if refused:
        return RepairPlan(scanned.path, refused=refused)
    name = index_name(scanned)
    unowned = unowned_target(scanned, name, FileRole.INDEX)
    if unowned:
        return RepairPlan(scanned.path, refused=(unowned,))
    old_map = _read_map(scanned.index)
    chosen, refused, notes = _choose_files(scanned, old_map, duplicates)
    if refused:
        return RepairPlan(scanned.path, refused=refused, notes=notes)
    sizes = _tensor_sizes(scanned)
    metadata = dict(scanned.index.metadata) if scanned.index else {}
    old_meta = dict(metadata)
    metadata["total_size"] = sum(sizes[n][0] for n in chosen)
    huge = sorted(n for n in chosen if sizes[n][1] >= 2**63)
    if huge:
        why = (
            f"tensor shapes {examples(huge)} multiply out past 2**63 elements, which no file "
            "holds (see size-mismatch); fix or remove those shards before rebuilding the index"
        )
        return RepairPlan(scanned.path, refused=(why,), notes=notes)
    metadata["total_parameters"] = _total_parameters(scanned, old_map, chosen, sizes)
    raw = dict(scanned.index.raw) if scanned.index else {}
    raw["metadata"] = metadata
    raw["weight_map"] = _keep_order(old_map, chosen)
    new = json.dumps(raw, indent=2) + "\n"
    old = read_current_text(scanned.location / name)
    if old is not None and _same_json(old, raw):
        return RepairPlan(scanned.path, notes=notes)
    changes = (
        _map_changes(old_map, chosen)
        + _meta_changes(old_meta, metadata)
        + _respelled(scanned.index.files.values if scanned.index else ())
    )
    return RepairPlan(scanned.path, (FileWrite(name, old, new, tuple(changes)),), notes=notes)


def _total_parameters(
    scanned: ScannedCheckpoint,
    old_map: Mapping[str, str],
    chosen: Mapping[str, str],
    sizes: dict[str, tuple[int, int]],
) -> int:
    """`total_parameters` of the rebuilt index: the parameters the project counts
    (`inspector._internal.checkpoint.parameters`, the number the scan, the reports and the load
    check show), or the stated one when the index keeps its tensors and states them right the way
    its writer counts (`Uncounted.WAYS`): a healthy file is not rewritten for a convention."""
    tensors = scanned.tensors
    stated = parse_count(scanned.index.metadata.get("total_parameters")) if scanned.index else None
    if stated is not None and old_map.keys() == chosen.keys():
        before = uncounted_elements(tensors, chosen.keys(), config=scanned.config)
        if stated in before.counts(sum(sizes[n][1] for n in chosen)):
            return stated
    return count_parameters(tensors[rows_named(tensors, chosen.keys())], config=scanned.config)


def plan_sidecars(scanned: ScannedCheckpoint) -> RepairPlan:
    """Rebuild each per-layer JSON sidecar from its shard's header (in place; a missing one
    is named as its siblings are)."""
    writes = []
    refused = []
    for shard in scanned.shards:
        if not shard.readable:
            continue
        rel = sidecar_name(shard.file, scanned.sidecars)
        unowned = unowned_target(scanned, rel, FileRole.SIDECAR, shard=shard.file)
        if unowned:
            refused.append(unowned)
            continue
        existing = scanned.sidecars.get(shard.file)
        raw = dict(existing.raw) if existing else {}
        metadata = dict(existing.metadata) if existing else {}
        metadata["total_size"] = shard.tensor_bytes
        raw["metadata"] = metadata
        raw["weight_map"] = {n: shard.file for n in sorted(shard.names)}
        old = read_current_text(scanned.location / rel)
        if old is not None and _same_json(old, raw):
            continue
        old_map = _read_map(existing)
        changes = _map_changes(old_map, raw["weight_map"])
        changes += _respelled(existing.files.values if existing else ())
        old_size = existing.metadata.get("total_size") if existing else None
        if old_size != metadata["total_size"]:
            changes.append(f"total_size {old_size} -> {metadata['total_size']}")
        writes.append(
            FileWrite(rel, old, json.dumps(raw, indent=4) + "\n", tuple(changes or ["rewrite"]))
        )
    return RepairPlan(scanned.path, tuple(writes), refused=tuple(refused))


def plan_quant_config(scanned: ScannedCheckpoint) -> RepairPlan:
    """Add missing `quantized_layers` entries where every sibling expert of the layer (same
    projection) shares one config; refuse the others."""
    section = quant_section(scanned.quant_config)
    layers = section.get("quantized_layers")
    if section.get("quant_algo") != "MIXED_PRECISION" or not isinstance(layers, Mapping):
        return RepairPlan(scanned.path)
    excluded = exclude_matcher(exclude_patterns(section))
    if excluded is None:
        why = (
            f"{QUANT_CONFIG_NAME}: exclude_modules holds more than {MAX_WILDCARDS:,} wildcard "
            "patterns; which modules it excludes is not decided (see check-budget-exceeded)"
        )
        return RepairPlan(scanned.path, refused=(why,))
    unlisted = [m for m in quantized_modules(scanned) if m not in layers]
    verdicts = list(map(excluded, unlisted))
    missing = [m for m, v in zip(unlisted, verdicts, strict=True) if v is False]
    added, refused = _sibling_configs(missing, layers)
    undecided = [m for m, v in zip(unlisted, verdicts, strict=True) if v is None]
    if undecided:
        refused.insert(
            0,
            f"{QUANT_CONFIG_NAME}: {len(undecided):,} modules ({examples(undecided)}) get no "
            "entry: whether exclude_modules excludes them is not decided (see "
            "quant-pattern-refused)",
        )
    unowned = unowned_target(scanned, QUANT_CONFIG_NAME, FileRole.QUANT_CONFIG)
    if unowned:
        refused.insert(0, unowned)
    if not added or unowned:
        return RepairPlan(scanned.path, refused=tuple(refused))
    new_cfg = json.loads(json.dumps(dict(scanned.quant_config or {})))
    target = new_cfg["quantization"] if isinstance(new_cfg.get("quantization"), dict) else new_cfg
    target["quantized_layers"] = dict(sorted({**layers, **added}.items()))
    old = read_current_text(scanned.location / QUANT_CONFIG_NAME)
    change = f"quantized_layers: {len(added)} entries added ({examples(sorted(added))})"
    write = FileWrite(QUANT_CONFIG_NAME, old, json.dumps(new_cfg, indent=4) + "\n", (change,))
    return RepairPlan(scanned.path, (write,), refused=tuple(refused))


# -- which files a plan may write ----------------------------------------------------------

# The roles a repair writes, and the names each has when the name alone fixes it (the index:
# the layout's own, `index_name`).
_NAMED = {
    FileRole.INDEX: (INDEX_NAME, BIN_INDEX_NAME),
    FileRole.QUANT_CONFIG: (QUANT_CONFIG_NAME,),
}


def unowned_target(
    scanned: ScannedCheckpoint, rel: str, role: FileRole | None, *, shard: str | None = None
) -> str | None:
    """None when a plan may write `rel` (relative to the checkpoint) in `role`; else one
    line saying why not, for the plan's refusals.

    A plan may write over a file only when the scan established its role: the index and the
    quantization config by their well-known names; a sidecar where the scan read `rel` as
    the sidecar of `shard` (or tried to and could not parse it). `role` None is a new file
    the plan creates (a restored shard): only its absence allows it. A well-known name
    (`inspector._internal.common.filenames`) is never written in another role, even where it is
    absent."""
    entry = (scanned.location / rel).stat()
    names = _NAMED.get(role, ()) if role is not None else ()
    named = rel if rel in names else None
    what = f"the {role}" + (f" of {shard}" if shard else "") if role else "a new file"
    if names and named is None:
        raise ValueError(f"{rel}: a repair writes the {role} only as {' or '.join(names)}")
    known = role_of(rel) if named is None else None
    if known is not None:
        return (
            f"{rel} is {known}, never {what}: it is not written (rename "
            f"{shard or 'the file'} if it belongs to this checkpoint, then repair again)"
        )
    # A file the storage refuses (a FIFO, a link out of the folder) stops the whole plan
    # when its old text is read (`read_current_text`), naming why.
    if entry is None or entry.kind is EntryKind.REFUSED:
        return None
    if entry.kind is EntryKind.DIR:
        return f"{rel} is a folder, not {what}: it is not replaced; move it away, then repair again"
    if named is not None:
        return None
    if role is FileRole.SIDECAR and shard is not None and _read_as_sidecar(scanned, rel, shard):
        return None
    return (
        f"{rel} exists and the scan did not read it as {what}: it is not overwritten; move "
        "it away if it is stale, then repair again"
    )


def _read_as_sidecar(scanned: ScannedCheckpoint, rel: str, shard: str) -> bool:
    """True when the scan read `rel` as the sidecar of `shard`, or tried to and could not
    parse it (a damaged sidecar is what a repair rewrites)."""
    doc = scanned.sidecars.get(shard)
    if doc is not None:
        return doc.file == rel
    shards = {s.file for s in scanned.shards}
    return shard_of_sidecar(rel, shards) == shard and any(
        p.file == rel and p.role is FileRole.SIDECAR for p in scanned.read_problems
    )


# -- helpers -------------------------------------------------------------------------------


def _unreadable_shards(scanned: ScannedCheckpoint) -> tuple[str, ...]:
    # A well-known name (config.json) is never a shard to restore or remove, whatever an
    # index says: rebuilding the index drops the entry naming it.
    bad = [s.file for s in scanned.shards if not s.readable and not is_well_known(s.file)]
    if not bad:
        return ()
    those = "that file" if len(bad) == 1 else "those files"
    return (
        f"{plural(len(bad), 'shard')} with an unreadable header ({', '.join(bad)}): rebuilding "
        f"the index from disk would drop the tensors of {those}; restore or remove "
        f"{'it' if len(bad) == 1 else 'them'} first",
    )


def _choose_files(
    scanned: ScannedCheckpoint, old_map: Mapping[str, str], policy: DuplicatePolicy | None
) -> tuple[dict[str, str], tuple[str, ...], tuple[str, ...]]:
    homes: dict[str, list[tuple[str, str, tuple[int, ...]]]] = defaultdict(list)
    for shard in scanned.shards:
        for name, dtype, shape in zip(shard.names, shard.dtypes, shard.shapes, strict=True):
            homes[name].append((shard.file, dtype, shape))
    chosen: dict[str, str] = {}
    refused: list[str] = []
    notes: list[str] = []
    kept: list[str] = []  # names in several shards, one copy chosen
    for name, places in homes.items():
        if len(places) == 1:
            chosen[name] = places[0][0]
            continue
        agree = len({(d, s) for _, d, s in places}) == 1
        files = [f for f, _, _ in places]
        if not agree and policy is None:
            refused.append(
                f"'{legible(name)}' is in {examples(files)} with different dtype or shape; "
                "choose which copy "
                "the index keeps with --duplicates first|last|index"
            )
            continue
        chosen[name] = _pick(files, old_map.get(name), policy or "index")
        kept.append(name)
    if kept:
        # What transformers loads from the rebuilt index: every copy in the files it names
        # is read, the last kept (`checkpoint.loaded`), whichever file an entry names.
        doc = IndexDoc.from_map(index_name(scanned), chosen)
        loaded = kept_in(read_order(scanned.shards, doc), kept)
        for name in kept:
            pick, holders = chosen[name], [f for f, _, _ in homes[name]]
            note = f"'{legible(name)}' is in {examples(holders)}; the index keeps {legible(pick)}"
            used = loaded[name][0].file if name in loaded else pick
            if used != pick:
                note += (
                    f", but transformers loads the copy in {legible(used)} (it reads every "
                    "file the index names, the last copy kept): remove the other copies"
                )
            notes.append(note)
    return chosen, _at_most(refused, "tensors refused"), _at_most(notes, "duplicates")


def _at_most(lines: list[str], what: str, limit: int = 20) -> tuple[str, ...]:
    """The first `limit` lines and one for the rest: a hostile folder may make 100,000."""
    rest = len(lines) - limit
    return tuple(lines[:limit]) + ((f"... {rest} more {what}",) if rest > 0 else ())


def _keep_order(old: Mapping[str, str], new: dict[str, str]) -> dict[str, str]:
    """The old index's key order for the tensors it had, then the added ones sorted: the
    diff a user reviews shows only what changed."""
    kept = {n: new[n] for n in old if n in new}
    kept.update((n, new[n]) for n in sorted(new.keys() - kept.keys()))
    return kept


def _pick(files: list[str], current: str | None, policy: DuplicatePolicy) -> str:
    if policy == "first":
        return files[0]
    if policy == "last":
        return files[-1]
    return current if current in files else files[-1]


def _tensor_sizes(scanned: ScannedCheckpoint) -> dict[str, tuple[int, int]]:
    sizes: dict[str, tuple[int, int]] = {}
    for shard in scanned.shards:
        for name, shape, b, e in zip(
            shard.names, shard.shapes, shard.begins.tolist(), shard.ends.tolist(), strict=True
        ):
            sizes.setdefault(name, (e - b, math.prod(shape)))
    return sizes


def _map_changes(old: Mapping[str, str], new: Mapping[str, str]) -> list[str]:
    added = sorted(new.keys() - old.keys())
    removed = sorted(old.keys() - new.keys())
    moved = sorted(n for n in new.keys() & old.keys() if new[n] != old[n])
    out = []
    if added:
        out.append(f"{len(added)} tensors added: {examples(added)}")
    if removed:
        out.append(f"{len(removed)} tensors removed: {examples(removed)}")
    if moved:
        out.append(
            f"{len(moved)} tensors moved: " + examples([f"{n} {old[n]} -> {new[n]}" for n in moved])
        )
    return out


def _meta_changes(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    return [
        f"{k} {old[k]} -> {new[k]}" if k in old else f"{k} {new[k]} added (the index stated none)"
        for k in ("total_size", "total_parameters")
        if k not in old or old[k] != new[k]
    ]


def _sibling_configs(
    missing: list[str], layers: Mapping[str, Any]
) -> tuple[dict[str, Any], list[str]]:
    by_group: dict[str, list[Any]] = defaultdict(list)
    for module, cfg in layers.items():
        by_group[expert_template(module)[0]].append(cfg)
    added: dict[str, Any] = {}
    refused: list[str] = []
    # The distinct configs of each group, serialised once per group (not per module).
    distinct: dict[str, set[str]] = {}
    for module in missing:
        group = expert_template(module)[0]
        if group not in distinct:
            distinct[group] = {json.dumps(c, sort_keys=True) for c in by_group.get(group, [])}
        configs = distinct[group]
        if group != module and len(configs) == 1:
            added[module] = json.loads(next(iter(configs)))
        else:
            why = (
                "is not an expert module"
                if group == module
                else (
                    "has no sibling entries"
                    if not configs
                    else "has siblings with different configs"
                )
            )
            refused.append(f"{QUANT_CONFIG_NAME}: cannot decide the config of {module}: it {why}")
    if len(refused) > 20:
        refused = [*refused[:20], f"... {len(refused) - 20} more modules refused"]
    return added, refused


def _read_map(doc: IndexDoc | None) -> Mapping[str, str]:
    """The weight map of an index or sidecar as the checks read it: `./a`, `.//a` and
    `././/a` all name the shard `a` (`normalize_member`), so a plan compares its choices with
    the files the entries mean, not with how they are spelled. Read-only."""
    return normalized(doc.lookup_map()) if doc is not None else {}


def _respelled(files: Sequence[str]) -> list[str]:
    """The change line for file names a rewrite writes in their normal form (the diff shows
    every such entry changed; no tensor moved)."""
    spelled = [f"{f} -> {normalize_member(f)}" for f in sorted(files) if normalize_member(f) != f]
    return [f"file names written as the shards are named: {examples(spelled)}"] if spelled else []


def _same_json(text: str, value: Any) -> bool:
    """True when the file at `text` already says what `value` says, read as the checks read
    it (its weight map's file names normalised, `_read_map`): a healthy file is not rewritten
    only to respell its entries."""
    try:
        current = json.loads(text)
    except ValueError:
        return False
    wmap = current.get("weight_map") if isinstance(current, dict) else None
    if isinstance(wmap, dict) and all(isinstance(f, str) for f in wmap.values()):
        current["weight_map"] = normalized(wmap)
    return bool(current == value)


def read_current_text(path: Location) -> str | None:
    """The current text of a JSON file a repair replaces (None: absent), read through its
    storage under the JSON cap. A file the storage refuses stops the plan: it is never
    read, and a repair never writes over it."""
    try:
        data = path.read_bytes(cap=JSON_CAP)
    except FileNotFoundError:
        return None
    except UnsafeFileError as exc:
        raise PlanRefusedError(
            f"{path} {exc.reason}; not read: remove it, then repair again"
        ) from None
    except TooLargeError as exc:
        raise PlanRefusedError(f"{path} is {exc.size:,} bytes, over the JSON cap") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return data.decode("utf-8", "replace")
