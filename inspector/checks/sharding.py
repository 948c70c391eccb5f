"""A Hugging Face checkpoint whose tensors all sit in one oversized file: the output of a
consolidation that lost its file assignment (seed automodel-2289). Pure."""

from __future__ import annotations

from inspector.findings import Finding, make_finding
from inspector.model import ScannedCheckpoint

__all__ = ["HF_SHARD_LIMIT", "check_collapsed_shards"]

# huggingface_hub's default `max_shard_size` ("5GB", decimal units).
HF_SHARD_LIMIT = 5 * 10**9


def check_collapsed_shards(
    scanned: ScannedCheckpoint, *, limit: int = HF_SHARD_LIMIT
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
            "mapping-collapsed",
            f"{shard.file}: all {len(shard.names):,} tensors ({size / 1e9:,.1f} GB) are in one "
            f"file, over the {limit / 1e9:g} GB shard size Hugging Face checkpoints are split "
            "at; a consolidation that lost its output mapping writes this (automodel-2289). "
            "Split it with `ckpt-inspect repair --only reshard`",
            file=shard.file,
        )
    ]
