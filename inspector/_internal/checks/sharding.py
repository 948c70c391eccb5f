"""A Hugging Face checkpoint whose tensors all sit in one oversized file: the output of a
consolidation that lost its file assignment (seed automodel-2289). Pure."""

from __future__ import annotations

from inspector._internal.checkpoint.scanned import ScannedCheckpoint
from inspector._internal.common.display import legible
from inspector._internal.common.filenames import SAFETENSORS_WEIGHTS_NAME
from inspector._internal.common.units import SHARD_SPLIT_SIZE, SINGLE_FILE_SIZE, format_bytes
from inspector._internal.findings.codes import Code, code_set
from inspector._internal.findings.finding import Finding, make_finding

__all__ = ["CODES", "check_collapsed_shards", "collapse_note"]

CODES = code_set(Code.MAPPING_COLLAPSED)


def check_collapsed_shards(
    scanned: ScannedCheckpoint, *, limit: int = SHARD_SPLIT_SIZE
) -> list[Finding]:
    """`mapping-collapsed` when every tensor is in a single file over `limit` bytes."""
    readable = [s for s in scanned.shards if s.readable and s.names]
    if len(readable) != 1 or len(readable[0].names) < 2:
        return []
    shard = readable[0]
    size = shard.tensor_bytes
    if size <= limit:
        return []
    if (
        scanned.index is None
        and shard.file == SAFETENSORS_WEIGHTS_NAME
        and size <= max(limit, SINGLE_FILE_SIZE)
    ):
        # What transformers 5's save_pretrained writes for a model under its 50 GB default:
        # one model.safetensors, no index; nothing was lost.
        return []
    return [
        make_finding(
            Code.MAPPING_COLLAPSED,
            f"{legible(shard.file)}: all {len(shard.names):,} tensors ({format_bytes(size)}) are "
            "in one "
            f"file, over the {format_bytes(limit)} shard size Hugging Face checkpoints are split "
            "at; a consolidation that lost its output mapping writes this (automodel-2289). "
            "Split it with `ckpt-inspect repair --only reshard`",
            file=shard.file,
        )
    ]


def collapse_note(scanned: ScannedCheckpoint, *, limit: int = SHARD_SPLIT_SIZE) -> str | None:
    """Why one file that an index names alone is not a finding (the demo
    automodel-2289-collapsed: a consolidation put all 173 tensors of a 4-shard model in one
    78 kB file): under the split size one file loads like shards, so `check` reports nothing
    and says so, instead of a silent "no findings". None when the checkpoint is not one
    indexed file under `limit` (over it, `mapping-collapsed` is the finding)."""
    readable = [s for s in scanned.shards if s.readable and s.names]
    if scanned.index is None or len(readable) != 1 or len(readable[0].names) < 2:
        return None
    shard = readable[0]
    if shard.tensor_bytes > limit or set(scanned.index.weight_map.values()) != {shard.file}:
        return None
    return (
        f"all {len(shard.names):,} tensors are in one file, {legible(shard.file)} "
        f"({format_bytes(shard.tensor_bytes)}), that {legible(scanned.index.file)} names "
        f"alone: not a finding under the {format_bytes(limit)} size checkpoints are split at "
        "(one such file loads like shards); over it, `check` reports mapping-collapsed (a "
        "consolidation that lost its output mapping, seed automodel-2289)"
    )
