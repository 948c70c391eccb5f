"""Consolidate DCP-sharded safetensors into a Hugging Face checkpoint, or convert a PyTorch
`.bin` checkpoint into one (docs/formats.md). Two steps, so a person reads what will happen
before anything is written: `plan_consolidation(scan(src), dest)`, print it, `.execute()`.

Modules follow the seams of the work: `records` (what a plan is made of and what executing
it returns), `plan` (pure: headers in, a plan out) and `engine` (DEST, the bytes, the run
alone or under torchrun, the recheck).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Unpack

from inspector._internal.plans.consolidate.plan import (
    ConsolidationPlan,
    default_destination,
    plan_consolidation,
    reference_assignment,
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
