"""`repair` with every part at once: the index, the sidecars and the quantization config in
one plan, or the re-shard when every tensor collapsed into one oversized file.

Why: parts repaired one at a time disagree with those not yet repaired, so what the checks
say next (the preview re-runs them on the planned JSON, `repair.preview_repair`) would be
the step just done. The default of `ckpt-inspect repair` and the dashboard's Repair all.
"""

from __future__ import annotations

from pathlib import Path

from inspector._internal.checkpoint.scanned import LayoutName, ScannedCheckpoint
from inspector._internal.checks.sharding import check_collapsed_shards
from inspector._internal.common.units import SHARD_SPLIT_SIZE, parse_size
from inspector._internal.plans.repair import DuplicatePolicy, RepairPlan, plan_repair
from inspector._internal.plans.reshard import ReshardPlan, plan_reshard

__all__ = ["ALL_PARTS", "needs_reshard", "plan_all"]

# The JSON parts `plan_repair` plans (what `--only` names), all of them.
ALL_PARTS = ("index", "sidecars", "quant-config")
_RESHARDS = (LayoutName.HF_SHARDED, LayoutName.SAFETENSORS_SINGLE)


def needs_reshard(scanned: ScannedCheckpoint, *, max_shard_size: int = SHARD_SPLIT_SIZE) -> bool:
    """Every tensor sits in one file over the split size (`mapping-collapsed` of an HF
    checkpoint): only writing new shards fixes it."""
    return scanned.layout in _RESHARDS and bool(
        check_collapsed_shards(scanned, limit=max_shard_size)
    )


def plan_all(
    scanned: ScannedCheckpoint,
    *,
    duplicates: DuplicatePolicy | None = None,
    max_shard_size: int | str = SHARD_SPLIT_SIZE,
    output_dir: str | Path | None = None,
) -> RepairPlan | ReshardPlan:
    """Every repair that applies: the re-shard when every tensor collapsed into one file over
    the split size (it writes the index of the new shards itself), else the index, the
    sidecars and the quantization config in one `RepairPlan` (the quantization config's
    missing entries come from their sibling experts: review its diff)."""
    limit = parse_size(max_shard_size)
    if output_dir is None and needs_reshard(scanned, max_shard_size=limit) and scanned.local_path:
        reshard = plan_reshard(scanned, max_shard_size=limit)
        if not reshard.empty:
            return reshard
    return plan_repair(scanned, only=set(ALL_PARTS), duplicates=duplicates, output_dir=output_dir)
