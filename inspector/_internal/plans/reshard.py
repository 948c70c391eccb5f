"""Re-shard a checkpoint whose tensors collapsed into one file (seed automodel-2289), or convert
a `.bin` checkpoint, into safetensors shards by huggingface_hub's rules (greedy in key order,
decimal units, an oversized tensor alone). The consolidation engine copies into a staging
folder; old files move to the backup and new ones into place as one journaled batch of
renames: nothing is modified in place or deleted.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from inspector._internal.checkpoint.read_problems import FileRole
from inspector._internal.checkpoint.scanned import LayoutName, ScannedCheckpoint
from inspector._internal.common.display import MESSAGE_LIMIT, legible
from inspector._internal.common.filenames import BIN_INDEX_NAME, INDEX_NAME
from inspector._internal.common.text import examples
from inspector._internal.common.units import SHARD_SPLIT_SIZE, parse_size
from inspector._internal.execution.atomic import (
    STAGING,
    apply_renames,
    folder_lock,
    fresh_staging,
    new_backup_dir,
    recover_folder,
)
from inspector._internal.integrity.refresh import refresh_manifest
from inspector._internal.plans.consolidate import ConsolidationPlan, plan_consolidation
from inspector._internal.plans.consolidate.plan import as_single_chunks
from inspector._internal.plans.repair import (
    FileWrite,
    RepairResult,
    read_current_text,
    rechecked,
    unowned_target,
)
from inspector.errors import PlanRefusedError

__all__ = ["STAGING", "ReshardPlan", "as_single_chunks", "plan_reshard"]

_LAYOUTS = (LayoutName.HF_SHARDED, LayoutName.SAFETENSORS_SINGLE, LayoutName.PYTORCH_BIN)


@dataclass(frozen=True)
class ReshardPlan:
    """Which shards are retired, which are written, and the index that results."""

    root: Path
    copy: ConsolidationPlan | None = None
    retired: tuple[str, ...] = ()
    index: FileWrite | None = None
    refused: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def empty(self) -> bool:
        return self.copy is None

    @property
    def writes(self) -> tuple[FileWrite, ...]:
        return (self.index,) if self.index else ()

    def describe(self) -> str:
        if self.copy is None:
            lines = [f"{self.root}: nothing to re-shard"]
        else:
            outs = self.copy.outputs
            index = (
                [f"  rewrite {INDEX_NAME}", *(f"    - {c}" for c in self.index.changes)]
                if self.index
                else [f"  no index: one file, as save_pretrained writes it ({outs[0].name})"]
            )
            lines = [
                f"re-shard plan for {self.root}",
                f"  retire {', '.join(self.retired)} (moved to the backup folder, not deleted)",
                f"  write {len(outs)} shards ({self.copy.assignment}):",
                *(f"    {o.name}: {len(o.tensors)} tensors, {o.size:,} bytes" for o in outs),
                *index,
                *(f"  note: {n}" for n in self.copy.notes),
            ]
        lines += [f"  REFUSED: {r}" for r in self.refused]
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(legible(line, limit=MESSAGE_LIMIT) for line in lines)

    def diff(self) -> str:
        return self.index.diff() if self.index else ""

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
    ) -> RepairResult:
        """Copy into staging, then swap in one journaled batch; re-scan and re-check.

        The retired shards always go to the backup folder (`backup` is accepted for symmetry
        with other plans): re-sharding never deletes tensor data. `model`,
        `trust_remote_code` and `cache` are as in `check`, for the re-check.
        """

        if self.copy is None:
            return RepairResult(
                (),
                None,
                rechecked(self.root, model=model, trust_remote_code=trust_remote_code, cache=cache),
            )
        with folder_lock(self.root):
            leftovers = recover_folder(self.root).leftovers
            # A planted link named like the staging folder would send the copy out of the
            # checkpoint: fresh_staging refuses it and creates a real folder.
            staging = fresh_staging(self.root)
            try:
                self.copy.execute(progress=progress, verify=False)
            except BaseException:
                # A copy that failed (a source cut short while it was read) leaves nothing.
                shutil.rmtree(staging, ignore_errors=True)
                raise
            backup_dir = new_backup_dir(self.root)
            rel_backup = backup_dir.relative_to(self.root).as_posix()
            old = (*self.retired, INDEX_NAME, BIN_INDEX_NAME)
            moves = [(f, f"{rel_backup}/{f}") for f in old]
            moves = [m for m in moves if (self.root / m[0]).exists()]
            index = (self.copy.index_file,) if self.copy.index_file else ()
            new = [(f"{STAGING}/{n}", n) for n in (*(o.name for o in self.copy.outputs), *index)]
            apply_renames(self.root, [*moves, *new])
            shutil.rmtree(staging, ignore_errors=True)
        written = (*(o.name for o in self.copy.outputs), *index)
        refresh_manifest(self.root, written=written)
        remaining = rechecked(
            self.root, model=model, trust_remote_code=trust_remote_code, cache=cache
        )
        return RepairResult(written, backup_dir, remaining, leftovers)


def plan_reshard(
    scanned: ScannedCheckpoint, *, max_shard_size: int | str = SHARD_SPLIT_SIZE
) -> ReshardPlan:
    """Plan splitting the checkpoint's tensors into shards of at most `max_shard_size`."""
    root = scanned.local_path
    if root is None:
        raise PlanRefusedError(
            f"{scanned.path}: re-sharding writes new shards into the checkpoint folder; run "
            "it on a local copy"
        )
    refused = _refusals(scanned)
    if refused:
        return ReshardPlan(root, refused=refused)
    limit = parse_size(max_shard_size)
    converting = scanned.layout is LayoutName.PYTORCH_BIN
    # A `.bin` checkpoint is converted as it is (its tied names and strided views are the
    # consolidation's to decide); others are copied tensor by tensor in model order.
    view = scanned if converting else as_single_chunks(scanned)
    try:
        copy = plan_consolidation(view, root / STAGING, max_shard_size=limit)
    except PlanRefusedError as exc:
        return ReshardPlan(root, refused=(str(exc),))
    # Re-sharding in place keeps the folder's config and tokenizer where they are.
    copy = dataclasses.replace(copy, metadata_files=())
    retired = tuple(s.file for s in scanned.shards)
    if not converting and len(copy.outputs) <= 1 and len(retired) <= 1:
        count = sum(len(s.names) for s in scanned.shards)
        note = f"all {count} tensors fit in one shard of at most {limit:,} bytes"
        return ReshardPlan(root, notes=(note,))
    clash = sorted({o.name for o in copy.outputs} & set(retired))
    if clash:
        why = f"new shard names {examples(clash)} equal existing files; rename them first"
        return ReshardPlan(root, refused=(why,))
    # Every name the swap writes: the index, and new shards where no retired one is.
    unowned = [
        why
        for why in (
            unowned_target(scanned, INDEX_NAME, FileRole.INDEX),
            *(unowned_target(scanned, o.name, None) for o in copy.outputs),
        )
        if why
    ]
    if unowned:
        return ReshardPlan(root, refused=tuple(unowned))
    index = _index_write(scanned, copy) if copy.index_file else None
    return ReshardPlan(root, copy, retired, index)


def _refusals(scanned: ScannedCheckpoint) -> tuple[str, ...]:
    if scanned.layout not in _LAYOUTS:
        dcp = scanned.layout is LayoutName.DCP_SHARDED
        hint = " (use `ckpt-inspect consolidate`)" if dcp else ""
        return (f"{scanned.path}: layout {scanned.layout} cannot be re-sharded{hint}",)
    bad = [s.file for s in scanned.shards if not s.readable or s.findings]
    if bad:
        return (f"shards {examples(bad)} have integrity findings; fix them before re-sharding",)
    seen: set[str] = set()
    dup: list[str] = []
    for name in (n for s in scanned.shards for n in s.names):
        (dup.append if name in seen else seen.add)(name)
    if dup:
        why = f"tensors {examples(dup)} are in several shards; repair the index first"
        return (f"{why} (ckpt-inspect repair --only index --duplicates ...)",)
    return ()


def _index_write(scanned: ScannedCheckpoint, copy: ConsolidationPlan) -> FileWrite:
    old = read_current_text(scanned.location / INDEX_NAME)
    metadata = dict(scanned.index.metadata) if scanned.index else {}
    metadata.update(total_size=copy.total_size, total_parameters=copy.total_parameters)
    new = json.dumps({"metadata": metadata, "weight_map": copy.weight_map}, indent=2) + "\n"
    files = sorted(set(copy.weight_map.values()))
    change = f"{len(copy.weight_map)} tensors mapped to {len(files)} shards ({examples(files)})"
    return FileWrite(INDEX_NAME, old, new, (change,))
