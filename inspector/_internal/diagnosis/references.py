"""Which reference can fix a checkpoint: the file layout a consolidation should follow, and a
checkpoint that may hold the tensors a checkpoint lost (`repair --from REF`).

A finding that names its fix should name the reference too when one is known, and the
default consolidation must not write the collapse its own check reports. Looking a name up
costs a few `stat` calls, once per scan; remote checkpoints use only what their scan found.
The order of the references: docs/architecture.md, "diagnosis/".
"""

from __future__ import annotations

from dataclasses import dataclass

from inspector._internal.checkpoint.scanned import ScannedCheckpoint
from inspector._internal.common.units import SHARD_SPLIT_SIZE
from inspector._internal.layouts.dcp_sharded import resolve_reference

__all__ = [
    "Reference",
    "collapsed_mapping",
    "consolidation_reference",
    "layout_reference",
    "restore_reference",
]


@dataclass(frozen=True, slots=True)
class Reference:
    """A reference for a fix: where it is (a folder or an index file, local path or URL),
    and in words what it is and who named it."""

    path: str
    label: str
    # How many files its index names (0: unknown, or no index).
    files: int = 0


def collapsed_mapping(scanned: ScannedCheckpoint) -> bool:
    """The run's recorded file-index mapping sends every tensor to one output file although
    something says it should not: the upstream model or the kept reference index names
    several files, or one file would pass the split size (what `mapping-collapsed` reports
    of a DCP checkpoint)."""
    dcp = scanned.dcp
    mapping = (dcp.mapping if dcp is not None else None) or {}
    if len(mapping) < 2 or len(set(mapping.values())) != 1:
        return False
    if _index_files(scanned) > 1 or _upstream_files(scanned) > 1:
        return True
    total = int(scanned.tensors["nbytes"].sum()) if len(scanned.tensors) else 0
    return total > SHARD_SPLIT_SIZE


def consolidation_reference(scanned: ScannedCheckpoint) -> Reference | None:
    """The reference a consolidation of `scanned` should follow instead of a collapsed
    mapping (`collapsed_mapping`): the upstream model the run names, else the index kept in
    `.hf_metadata/` (`layout_reference`); None when the mapping is not collapsed or no
    reference names several files (then packing by size is the way out)."""
    if not collapsed_mapping(scanned):
        return None
    found = layout_reference(scanned)
    return found if found is not None and found.files > 1 else None


def layout_reference(scanned: ScannedCheckpoint) -> Reference | None:
    """The file layout a consolidated DCP checkpoint should have: the index of the upstream
    model the run names (found on this machine), else the reference index the run kept in
    `.hf_metadata/`; None when neither is known."""
    dcp = scanned.dcp
    if dcp is None:
        return None
    upstream = dcp.reference
    if upstream is not None and upstream.index is not None:
        return Reference(upstream.path, upstream.label, _upstream_files(scanned))
    index = scanned.index
    if index is not None:
        where = f"{str(scanned.path).rstrip('/')}/{index.file}"
        label = f"the reference index {index.file} the run kept"
        return Reference(where, label, _index_files(scanned))
    return None


def restore_reference(scanned: ScannedCheckpoint) -> Reference | None:
    """A checkpoint that may hold what `scanned` lost: the upstream model a DCP run names
    (found by its scan), or the model config.json's `_name_or_path` names, when it is a
    checkpoint folder on this machine (beside this one, or in the Hugging Face cache) and
    not this checkpoint itself."""
    return scanned.derived("restore-reference", lambda: _restore_reference(scanned))


def _restore_reference(scanned: ScannedCheckpoint) -> Reference | None:
    dcp = scanned.dcp
    if dcp is not None and dcp.reference is not None:
        return Reference(dcp.reference.path, dcp.reference.label)
    folder = scanned.local_path
    name = (scanned.config or {}).get("_name_or_path")
    if folder is None or not isinstance(name, str) or not name:
        return None
    folder = folder if folder.is_dir() else folder.parent
    found = resolve_reference(name, folder)
    if found is None:
        return None
    label = f"the model config.json names ({name!r}, _name_or_path), found at {found}"
    return Reference(str(found), label)


def _index_files(scanned: ScannedCheckpoint) -> int:
    index = scanned.index
    return len(index.files.used()) if index is not None and scanned.dcp is not None else 0


def _upstream_files(scanned: ScannedCheckpoint) -> int:
    dcp = scanned.dcp
    upstream = dcp.reference if dcp is not None else None
    if upstream is None or upstream.index is None:
        return 0
    return len(upstream.index.files.used())
