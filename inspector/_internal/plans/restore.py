"""`repair --from REF`: copy back the tensors a checkpoint lost, from a reference that has them.

Only what is safe to put back as the reference stores it is restored; the rest is refused
with the reason. Executing writes one new shard and rewrites the index as one journaled
batch, never opening an existing shard for writing. The rules: docs/architecture.md, "plans/".
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import shutil
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from inspector._internal.checkpoint.loaded import kept_signatures
from inspector._internal.checkpoint.parameters import PARAMETER_RULE, parameters_of, parse_count
from inspector._internal.checkpoint.places import describe_names
from inspector._internal.checkpoint.read_problems import FileRole
from inspector._internal.checkpoint.scanned import LayoutName, ScannedCheckpoint
from inspector._internal.common.display import MESSAGE_LIMIT, legible
from inspector._internal.common.filenames import INDEX_NAME
from inspector._internal.common.text import examples, plural, shell_word
from inspector._internal.execution.atomic import (
    STAGING,
    apply_writes,
    folder_lock,
    fresh_staging,
    recover_folder,
)
from inspector._internal.execution.temps import Leftovers
from inspector._internal.findings.finding import Finding
from inspector._internal.integrity.refresh import refresh_manifest
from inspector._internal.layouts.modelopt_per_layer import sidecar_name
from inspector._internal.plans.consolidate import ConsolidationPlan, plan_consolidation
from inspector._internal.plans.consolidate.plan import as_single_chunks
from inspector._internal.plans.repair import (
    FileWrite,
    read_current_text,
    rechecked,
    unowned_target,
)
from inspector._internal.storage import RemoteURL, local_location
from inspector.errors import InspectorError, PlanRefusedError

__all__ = ["RestorePlan", "RestoreResult", "plan_restore"]
_LAYOUTS = (LayoutName.HF_SHARDED, LayoutName.MODELOPT_PER_LAYER)
# Every number that is a whole dotted component: a tensor's template across layers/experts.
_NUMBER = re.compile(r"(?<=\.)\d+(?=\.|$)")
_SHARD_PREFIX = re.compile(r"^(.*?)-\d+-of-\d+\.safetensors$")
# Refusal reasons listed one per line; the rest are one line.
_REFUSAL_LINES = 20


@dataclass(frozen=True)
class RestoreResult:
    """What `RestorePlan.execute` wrote, where the replaced files went, what remains."""

    written: tuple[str, ...]
    backup_dir: Path | None
    remaining: tuple[Finding, ...]
    data_checked: int = 0
    # The temp files killed runs had left, removed (and those kept, with why).
    leftovers: Leftovers = field(default_factory=Leftovers)


@dataclass(frozen=True)
class RestorePlan:
    """The tensors to copy from the reference, the new shard, and the JSON that changes."""

    root: Path
    reference: Path | RemoteURL
    shard: str | None = None
    copy: ConsolidationPlan | None = None
    writes: tuple[FileWrite, ...] = ()
    restored: tuple[str, ...] = ()
    refused: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    verify_data: bool = False

    @property
    def empty(self) -> bool:
        return self.copy is None

    def describe(self) -> str:
        if self.copy is None:
            lines = [f"{self.root}: nothing to restore from {self.reference}"]
        else:
            out = self.copy.outputs[0]
            lines = [
                f"restore plan for {self.root} from {self.reference}",
                f"  create {self.shard}: {plural(len(self.restored), 'tensor')}, "
                f"{out.data_bytes:,} bytes copied from the reference "
                f"({describe_names(list(self.restored))})",
            ]
            for w in self.writes:
                lines.append(f"  {'rewrite' if w.old is not None else 'create'} {w.path}")
                lines.extend(f"    - {c}" for c in w.changes)
            if self.verify_data:
                lines.append("  verify: every copied tensor's bytes against the reference")
        lines += [f"  REFUSED: {r}" for r in self.refused]
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(legible(line, limit=MESSAGE_LIMIT) for line in lines)

    def diff(self) -> str:
        return "".join(w.diff() for w in self.writes)

    def __str__(self) -> str:
        return self.describe()

    def execute(
        self,
        *,
        backup: bool = True,
        progress: bool = False,
        model: bool = True,
        trust_remote_code: bool = False,
        cache: bool = True,
    ) -> RestoreResult:
        """Copy into staging, verify if asked, then move the shard in and rewrite the JSON as
        one journaled batch; re-scan and re-check (`model`, `trust_remote_code`, `cache`:
        as in `check`). JSON changed since planning aborts."""

        if self.copy is None or self.shard is None:
            return RestoreResult(
                (),
                None,
                rechecked(self.root, model=model, trust_remote_code=trust_remote_code, cache=cache),
            )
        staging = self.root / STAGING
        with folder_lock(self.root):
            leftovers = recover_folder(self.root, writes=[w.path for w in self.writes]).leftovers
            for w in self.writes:
                if read_current_text(local_location(self.root) / w.path) != w.old:
                    raise InspectorError(
                        f"{self.root / w.path} changed since the restore was planned; plan again"
                    )
            if (self.root / self.shard).exists():
                raise InspectorError(f"{self.root / self.shard} exists now; plan again")
            fresh_staging(self.root)
            try:
                copied = self.copy.execute(
                    progress=progress, verify=False, verify_data=self.verify_data
                )
                if copied.data_mismatches:
                    raise InspectorError(
                        f"the copies of {plural(len(copied.data_mismatches), 'tensor')} differ "
                        f"from {self.reference} ({examples(list(copied.data_mismatches))}); "
                        "nothing was changed in the checkpoint"
                    )
                source = f"{STAGING}/{self.shard}"
                backup_dir = apply_writes(
                    self.root,
                    [(w.path, w.new.encode()) for w in self.writes],
                    backup=backup,
                    moves=[(source, self.shard)],
                )
            finally:
                shutil.rmtree(staging, ignore_errors=True)
        written = (self.shard, *(w.path for w in self.writes))
        refresh_manifest(self.root, written=written)
        remaining = rechecked(
            self.root, model=model, trust_remote_code=trust_remote_code, cache=cache
        )
        return RestoreResult(written, backup_dir, remaining, copied.data_checked, leftovers)


def plan_restore(
    scanned: ScannedCheckpoint, reference: ScannedCheckpoint, *, verify_data: bool = False
) -> RestorePlan:
    """Plan copying what `scanned` lost back from `reference` (see the module docstring).
    The checkpoint must be local (the shard is written into it); the reference may be
    remote (its tensors are then read with ranged requests)."""
    root = scanned.local_path
    if root is None:
        raise PlanRefusedError(
            f"{scanned.path}: restoring writes a new shard into the checkpoint folder; run it "
            "on a local copy (the reference may stay remote)"
        )
    base = RestorePlan(root, reference.path, verify_data=verify_data)
    refused = _refusals(scanned, reference)
    if refused:
        return dataclasses.replace(base, refused=refused)
    ours = {n: (d, tuple(s)) for sh in scanned.shards for n, d, s in _entries(sh)}
    # What a loader gets from the reference: of a name several of its shards hold, the copy
    # it keeps, the one copied (`as_single_chunks`) and compared (`--verify-data`).
    theirs = kept_signatures(reference)
    lost = sorted(n for n in theirs if n not in ours)
    restored, refusals, notes = _choose(scanned, reference, lost, ours, theirs)
    if not restored:
        return dataclasses.replace(base, refused=tuple(refusals), notes=tuple(notes))
    shard = _new_shard_name(scanned)
    per_layer = scanned.layout is LayoutName.MODELOPT_PER_LAYER
    sidecar = sidecar_name(shard, scanned.sidecars) if per_layer else None
    unowned = [
        why
        for why in (
            unowned_target(scanned, INDEX_NAME, FileRole.INDEX),
            unowned_target(scanned, shard, None),
            unowned_target(scanned, sidecar, FileRole.SIDECAR, shard=shard) if sidecar else None,
        )
        if why
    ]
    if unowned:
        return dataclasses.replace(base, refused=(*refusals, *unowned), notes=tuple(notes))
    try:
        copy = _copy_plan(reference, restored, root / STAGING, shard)
    except PlanRefusedError as exc:
        return dataclasses.replace(base, refused=(*refusals, str(exc)), notes=tuple(notes))
    sizes = {t.name: (t.end - t.begin, math.prod(t.shape)) for t in copy.outputs[0].tensors}
    # What the index will list: the project's one parameter plural of it (values).
    after = {**ours, **{t.name: (t.out_dtype, t.shape) for t in copy.outputs[0].tensors}}
    params = parameters_of(
        list(after),
        [d for d, _ in after.values()],
        [s for _, s in after.values()],
        config=scanned.config,
    )
    writes = [_index_write(scanned, shard, restored, sizes, params)]
    if sidecar is not None:
        writes.append(_sidecar_write(sidecar, shard, restored, sizes))
    return RestorePlan(
        root,
        reference.path,
        shard,
        copy,
        tuple(writes),
        tuple(restored),
        tuple(refusals),
        tuple(notes),
        verify_data,
    )


# -- what to restore -------------------------------------------------------------------------


def _refusals(scanned: ScannedCheckpoint, reference: ScannedCheckpoint) -> tuple[str, ...]:
    out = []
    if scanned.layout not in _LAYOUTS:
        hint = (
            " (loaders read model.safetensors alone, so it cannot gain a shard without being "
            "renamed: re-shard it first with `ckpt-inspect repair --only reshard`)"
            if scanned.layout == "safetensors-single"
            else ""
        )
        out.append(f"{scanned.path}: the {scanned.layout} layout cannot be restored into{hint}")
    elif scanned.index is None:
        out.append(
            f"{scanned.path}: no {INDEX_NAME} to add the restored shard to; rebuild it first "
            "(ckpt-inspect repair --only index)"
        )
    if reference.layout not in (*_LAYOUTS, "safetensors-single"):
        out.append(
            f"{reference.path}: a {reference.layout} reference cannot be copied from; consolidate "
            "or convert it to safetensors first"
        )
    for ckpt in (scanned, reference):
        bad = [
            s.file
            for s in ckpt.shards
            if not s.readable or any(f.code.startswith("header-") for f in s.findings)
        ]
        if bad:  # one line however many: `check` lists them all
            out.append(
                f"{plural(len(bad), 'shard')} of {ckpt.path} with an unreadable or invalid "
                f"header ({examples(bad)}); fix them first (`ckpt-inspect check "
                f"{shell_word(str(ckpt.path))}` lists them all)"
            )
    if (
        isinstance(scanned.path, Path)
        and isinstance(reference.path, Path)
        and scanned.path.resolve() == reference.path.resolve()
    ):
        out.append(f"{reference.path}: the reference is the checkpoint itself")
    return tuple(out)


def _entries(shard):  # (name, dtype, shape) of a readable shard
    return zip(shard.names, shard.dtypes, shard.shapes, strict=True)


def _template(name: str) -> str:
    return _NUMBER.sub("#", name)


def _choose(
    scanned: ScannedCheckpoint,
    reference: ScannedCheckpoint,
    lost: list[str],
    ours: dict[str, tuple[str, tuple[int, ...]]],
    theirs: dict[str, tuple[str, tuple[int, ...]]],
) -> tuple[list[str], list[str], list[str]]:
    """(names to restore, refusals, notes)."""
    t = reference.tensors
    rows = t[t["name"].isin(lost)]
    kind = dict(zip(rows["name"], rows["kind"].astype(str), strict=True))
    mtp = set(rows.loc[rows["is_mtp"], "name"])
    in_layer = set(rows.loc[rows["layer"].notna(), "name"])
    siblings: dict[str, set[tuple[str, tuple[int, ...]]]] = defaultdict(set)
    for name, sig in ours.items():
        siblings[_template(name)].add(sig)
    tied = bool((scanned.config or {}).get("tie_word_embeddings"))
    restored: list[str] = []
    refused: dict[str, list[str]] = defaultdict(list)
    formats: dict[str, str] = {}
    notes: list[str] = []
    for name in lost:
        if name in mtp:
            restored.append(name)
        elif kind.get(name) == "output_head":
            if tied:
                notes.append(
                    f"{legible(name)} not restored: config.json ties it to the input embedding"
                )
            else:
                restored.append(name)
        elif name in in_layer:
            template = _template(name)
            found = siblings.get(template)
            if not found:
                refused["no sibling in the checkpoint shows its stored format"].append(name)
            elif theirs[name] not in found:
                if template not in formats:  # described once per template, a few formats
                    formats[template] = examples([f"{d} {list(s)}" for d, s in sorted(found)])
                refused[
                    "the reference stores it as "
                    f"{theirs[name][0]} {list(theirs[name][1])}, its siblings in the checkpoint "
                    f"are {formats[template]}"
                ].append(name)
            else:
                restored.append(name)
        else:
            restored.append(name)
    groups = list(refused.items())
    lines = [
        f"{plural(len(names), 'tensor')} not restored, {why}: {describe_names(names)}"
        for why, names in groups[:_REFUSAL_LINES]
    ]
    if len(groups) > _REFUSAL_LINES:
        rest = [n for _, names in groups[_REFUSAL_LINES:] for n in names]
        lines.append(
            f"{plural(len(rest), 'tensor')} more not restored, for "
            f"{len(groups) - _REFUSAL_LINES:,} more reasons like those above: "
            f"{describe_names(rest)}"
        )
    return restored, lines, notes


# -- the new shard and the JSON --------------------------------------------------------------


def _new_shard_name(scanned: ScannedCheckpoint) -> str:
    """`<prefix>-restored-00001.safetensors` after the shards' own prefix (`model`), the first
    number free (and its sidecar name too, in a per-layer export): listed by the index,
    loaded by every loader, never a DCP rank file name."""
    prefixes = {m.group(1) for s in scanned.shards if (m := _SHARD_PREFIX.match(s.file))}
    prefix = prefixes.pop() if len(prefixes) == 1 else "model"
    assert scanned.index is not None  # refused without one (`_refusals`)
    taken = {s.file for s in scanned.shards} | set(scanned.index.weight_map.values())
    n = 1
    while (name := f"{prefix}-restored-{n:05d}.safetensors") in taken or any(
        (scanned.location / f).stat() is not None for f in _files_of(name, scanned)
    ):
        n += 1
    return name


def _files_of(shard: str, scanned: ScannedCheckpoint) -> list[str]:
    """The files a restored `shard` adds: itself, and its sidecar in a per-layer export."""
    if scanned.layout is LayoutName.MODELOPT_PER_LAYER:
        return [shard, sidecar_name(shard, scanned.sidecars)]
    return [shard]


def _copy_plan(
    reference: ScannedCheckpoint, names: list[str], dest: Path, shard: str
) -> ConsolidationPlan:
    """The consolidation engine's plan for copying `names` from the reference into one file."""
    view = as_single_chunks(reference, only=set(names))
    # One output file whatever the size: the restore adds exactly one shard, staged under
    # the name it will have in the checkpoint (the journal moves a staged file to its own name).
    plan = plan_consolidation(view, dest, max_shard_size=1 << 62)
    (output,) = plan.outputs
    return dataclasses.replace(plan, outputs=(dataclasses.replace(output, name=shard),))


def _index_write(
    scanned: ScannedCheckpoint,
    shard: str,
    restored: list[str],
    sizes: dict[str, tuple[int, int]],
    parameters: int,
) -> FileWrite:
    index = scanned.index
    assert index is not None
    raw = dict(index.raw)
    weight_map = dict(index.weight_map)
    moved = [n for n in restored if n in weight_map]
    weight_map.update(dict.fromkeys(restored, shard))
    raw["weight_map"] = weight_map
    metadata = dict(index.metadata)
    changes = [f"{plural(len(restored), 'tensor')} mapped to {shard}: {examples(restored)}"]
    if moved:
        changes.append(f"{len(moved)} of them were listed but held by no shard")
    added_bytes = sum(b for b, _ in sizes.values())
    stated_size = parse_count(metadata.get("total_size"))
    if stated_size is not None:
        metadata["total_size"] = stated_size + added_bytes
        changes.append(f"total_size {stated_size:,} -> {metadata['total_size']:,}")
    stated = parse_count(metadata.get("total_parameters"))
    if stated is not None and stated != parameters:
        metadata["total_parameters"] = parameters
        changes.append(f"total_parameters {stated:,} -> {parameters:,} ({PARAMETER_RULE})")
    raw["metadata"] = metadata
    old = read_current_text(scanned.location / INDEX_NAME)
    return FileWrite(INDEX_NAME, old, json.dumps(raw, indent=2) + "\n", tuple(changes))


def _sidecar_write(
    rel: str, shard: str, restored: list[str], sizes: dict[str, tuple[int, int]]
) -> FileWrite:
    """The new shard's sidecar `rel`, in the per-layer exporter's schema."""
    doc = {
        "metadata": {"total_size": sum(b for b, _ in sizes.values())},
        "weight_map": dict.fromkeys(sorted(restored), shard),
    }
    change = f"sidecar of {shard}: {plural(len(restored), 'tensor')}"
    return FileWrite(rel, None, json.dumps(doc, indent=4) + "\n", (change,))
