"""Consolidate DCP-sharded safetensors into a Hugging Face checkpoint (docs/formats.md,
"DCP-sharded safetensors"), or convert a PyTorch `.bin` checkpoint into one ("PyTorch .bin").

Two steps, so a person can read what will happen before anything is written:

    plan = plan_consolidation(scan("ckpt/model"), "ckpt/model-consolidated")
    print(plan)              # outputs, tensor counts, bytes, and why this assignment
    result = plan.execute()  # writes model-*-of-*.safetensors + model.safetensors.index.json

The package follows the seams of the work: `plan` (pure planning and the plan records),
`assignment` (which output file each tensor goes to), `engine` (the byte copying),
`driver` (one process or several under torchrun), `sources` (what is not DCP: one chunk per
tensor, a `.bin` checkpoint's views and tied names), `dest` (the output folder: opened without
following links, refused when it holds anything but this plan's own output unless
`overwrite`) and `verify` (re-scan and hash checks).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Unpack

from inspector._internal.plans.consolidate.assignment import reference_assignment
from inspector._internal.plans.consolidate.plan import (
    ConsolidationPlan,
    default_destination,
    plan_consolidation,
)
from inspector._internal.plans.consolidate.records import (
    ConsolidationOptions,
    ConsolidationResult,
    OutputFile,
    Piece,
    PlannedTensor,
)
from inspector._internal.scan.entry import scan

__all__ = [
    "ConsolidationOptions",
    "ConsolidationPlan",
    "ConsolidationResult",
    "OutputFile",
    "Piece",
    "PlannedTensor",
    "consolidate",
    "default_destination",
    "plan_consolidation",
    "reference_assignment",
]


def consolidate(
    src: str | os.PathLike[str],
    dest: str | os.PathLike[str],
    *,
    mapping: str | os.PathLike[str] | Mapping[str, int] | None = None,
    reference: str | os.PathLike[str] | None = None,
    max_shard_size: int | str | None = None,
    dtype: str | None = None,
    allow_partial: bool = False,
    **options: Unpack[ConsolidationOptions],
) -> ConsolidationResult:
    """Scan `src`, plan and execute in one call (for notebooks and scripts); `options` as
    `ConsolidationPlan.execute` takes them."""
    plan = plan_consolidation(
        scan(src),
        dest,
        mapping=mapping,
        reference=reference,
        max_shard_size=max_shard_size,
        dtype=dtype,
        allow_partial=allow_partial,
    )
    return plan.execute(**options)
