"""A Hugging Face checkpoint whose tensors all sit in one oversized file: the output of a
consolidation that lost its file assignment (seed automodel-2289). Pure."""

from __future__ import annotations

from inspector._internal.checkpoint.scanned import ScannedCheckpoint
from inspector._internal.common.display import legible
from inspector._internal.common.units import SHARD_SPLIT_SIZE, format_bytes
from inspector._internal.findings.codes import Code, code_set
from inspector._internal.findings.finding import Finding, make_finding

__all__ = ["CODES", "check_collapsed_shards"]

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
