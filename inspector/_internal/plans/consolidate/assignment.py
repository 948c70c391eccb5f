"""Which output file each tensor goes to: an explicit mapping, the run's recorded mapping, a
reference checkpoint's index, or greedy packing by size (huggingface_hub's splitter rule)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from inspector._internal.checkpoint.naming_rules import HF_SHARD_NUMBER
from inspector._internal.checkpoint.scanned import ScannedCheckpoint
from inspector._internal.common.filenames import INDEX_NAME
from inspector._internal.common.text import examples, plural
from inspector._internal.diagnosis.references import collapsed_mapping, consolidation_reference
from inspector._internal.layouts._common import list_safetensors, read_json, read_shards
from inspector._internal.storage import open_location
from inspector.errors import CannotInspectError, PlanRefusedError

__all__ = ["Choice", "choose_assignment", "reference_assignment"]


@dataclass(frozen=True, slots=True)
class Choice:
    rule: str
    reason: str
    groups: list[list[str]]  # tensor names of output 1, 2, ...
    notes: list[str] = field(default_factory=list)
    # True when the recorded mapping sends everything to one file and this choice follows
    # something else (the caller's mapping or reference, or the upstream model the run names).
    collapse_avoided: bool = False


def choose_assignment(
    scanned: ScannedCheckpoint,
    names: list[str],
    nbytes: dict[str, int],
    mapping: str | os.PathLike[str] | Mapping[str, int] | None,
    reference: str | os.PathLike[str] | None,
    limit: int,
    *,
    files: Mapping[str, int] | None = None,
) -> Choice:
    """The first assignment rule that applies (see `plan_consolidation`); `files` is the
    1-based number of the source file of each tensor where the source's own files are to be
    followed (a `.bin` checkpoint converted without a size limit)."""
    dcp = scanned.dcp
    if dcp is None:
        raise PlanRefusedError(f"{scanned.path}: not DCP-sharded safetensors")
    if mapping is not None:
        table, label = _load_mapping(mapping)
        why = "given by the caller (mapping=...)"
        choice = _from_index(names, table, f"mapping {label}", why)
        return replace(choice, collapse_avoided=_collapsed(scanned))
    # A recorded mapping that sends everything to one file is the automodel-2289 collapse: an
    # explicit reference is then the user's way out, so it wins; without one, the default
    # never writes the collapse its own check reports.
    recorded = dcp.mapping or {}
    collapsed = _collapsed(scanned)
    named = dcp.reference
    if collapsed and reference is None and named is not None and named.index is not None:
        # The upstream model the run names, found on this machine (`find_reference`): its
        # index is the layout the collapsed mapping should have recorded.
        table = _index_table(named.index.weight_map)
        why = (
            f"{dcp.mapping_file} sends every tensor to one file (a collapsed mapping); "
            f"output files follow {named.label} instead"
        )
        choice = _from_index(names, table, f"reference {named.index.file}", why)
        return replace(choice, collapse_avoided=True)
    if reference is None and collapsed_mapping(scanned):
        kept = consolidation_reference(scanned)
        if kept is not None and scanned.index is not None:
            # The reference index the run kept in `.hf_metadata/`: the one the
            # mapping-collapsed finding names.
            table = _index_table(scanned.index.weight_map)
            why = (
                f"{dcp.mapping_file} sends every tensor to one file (mapping-collapsed); "
                f"output files follow {kept.label} instead ({plural(kept.files, 'file')}; "
                f"--reference {kept.path})"
            )
            choice = _from_index(names, table, f"reference {scanned.index.file}", why)
            return replace(choice, collapse_avoided=True)
        groups = _greedy(names, nbytes, limit)
        rule = f"greedy by size in key order, at most {limit:,} bytes per file"
        why = (
            f"{dcp.mapping_file} sends every tensor to one file over the split size "
            "(mapping-collapsed) and no reference index is known: packed like "
            "huggingface_hub's splitter (pass --reference to follow a model's files)"
        )
        return Choice(rule, why, groups, collapse_avoided=True)
    if recorded and not (collapsed and reference is not None):
        why = "the training run recorded the reference model's file for every tensor"
        return _from_index(names, recorded, f"mapping {dcp.mapping_file}", why)
    if reference is not None:
        table, label = reference_assignment(reference)
        why = "no mapping file; output files follow the reference checkpoint's index"
        if collapsed:
            why = (
                f"{dcp.mapping_file} sends every tensor to one file (a collapsed mapping); "
                "output files follow the reference checkpoint's index instead"
            )
        choice = _from_index(names, table, f"reference {label}", why)
        return replace(choice, collapse_avoided=collapsed)
    if files is not None:
        why = (
            "one output file per .bin file, in their order (as the Hub's conversion writes "
            "them); --max-shard-size packs by size instead"
        )
        return _from_index(names, files, "source .bin files", why)
    if scanned.index is not None:
        table = _index_table(scanned.index.weight_map)
        why = "no mapping file; output files follow the reference index kept by the run"
        return _from_index(names, table, f"reference {scanned.index.file}", why)
    groups = _greedy(names, nbytes, limit)
    rule = f"greedy by size in key order, at most {limit:,} bytes per file"
    why = "no mapping, no reference: packed like huggingface_hub's splitter"
    return Choice(rule, why, groups)


def _collapsed(scanned: ScannedCheckpoint) -> bool:
    """The recorded mapping sends every tensor to one file (seed automodel-2289)."""
    recorded = (scanned.dcp.mapping if scanned.dcp is not None else None) or {}
    return bool(recorded) and len(set(recorded.values())) == 1


def _from_index(names: list[str], table: Mapping[str, int], rule: str, why: str) -> Choice:
    """Groups from {fqn: index}: indices renumbered densely, tensors in the table's order,
    tensors the table omits appended to the last file (reported in the notes)."""
    present = set(names)
    order = sorted({i for n, i in table.items() if n in present})
    if not order:
        raise PlanRefusedError(
            f"{rule} names none of the {len(names)} tensors of the source; pass a mapping or "
            "reference that belongs to this model, or neither to pack by size"
        )
    slot = {idx: k for k, idx in enumerate(order)}
    groups: list[list[str]] = [[] for _ in order]
    for name, idx in table.items():
        if name in present:
            groups[slot[idx]].append(name)
    notes: list[str] = []
    unmapped = [n for n in names if n not in table]
    if unmapped:
        groups[-1].extend(unmapped)
        notes.append(
            f"{plural(len(unmapped), 'tensor')} absent from the {rule}: added to the last output "
            f"file: {examples(unmapped)}"
        )
    dangling = [n for n in table if n not in present]
    if dangling:
        notes.append(
            f"{plural(len(dangling), 'name')} in the {rule} not in the source: skipped "
            f"(tied or removed weights?): {examples(dangling)}"
        )
    if len(order) != max(order) or order[0] != 1:
        notes.append(f"output indices {order[0]}..{max(order)} have gaps; files are renumbered")
    return Choice(rule, why, groups, notes)


def _load_mapping(
    mapping: str | os.PathLike[str] | Mapping[str, int],
) -> tuple[dict[str, int], str]:
    if isinstance(mapping, Mapping):
        table, label = dict(mapping), "(in memory)"
    else:
        try:
            value, problem, _ = read_json(open_location(mapping))
        except CannotInspectError as exc:
            raise PlanRefusedError(f"mapping {mapping}: {exc}") from None
        if problem is not None:
            raise PlanRefusedError(
                f"mapping {mapping} {problem}; pass a JSON object {{fqn: index}}"
            )
        table, label = value, str(mapping)
    if not isinstance(table, dict) or not all(
        isinstance(k, str) and type(v) is int and v >= 1 for k, v in table.items()
    ):
        raise PlanRefusedError(
            f"mapping {label} must be a JSON object {{tensor name: 1-based output file index}}"
        )
    return table, label


def reference_assignment(reference: str | os.PathLike[str]) -> tuple[dict[str, int], str]:
    """{fqn: 1-based output index} from an HF checkpoint folder or its index file (local or
    a URL).

    The index of a file comes from `-(\\d+)-of-(\\d+).safetensors` at the end of its name, so
    `model-00002-of-00008.safetensors` and `model.safetensors-00002-of-00008.safetensors` are
    both file 2; names without it fall back to their sorted order.
    """
    try:
        path = open_location(reference)
    except CannotInspectError as exc:
        raise PlanRefusedError(f"reference {reference}: {exc}; pass another --reference") from None
    folder = path.is_dir()
    index_path = path / INDEX_NAME if folder else path
    if index_path.is_file() and index_path.name.endswith(".json"):
        value, problem, _ = read_json(index_path)
        weight_map = value.get("weight_map") if isinstance(value, dict) else None
        if problem is not None or not isinstance(weight_map, dict):
            why = problem or 'is not of the form {"weight_map": {tensor: file}}'
            raise PlanRefusedError(f"reference {index_path} {why}; pass another --reference")
        return _index_table(weight_map), str(index_path)
    if folder:
        weight_map = {}
        files = list_safetensors(path)
        for file, shard in zip(files, read_shards(files, root=path), strict=True):
            for name in shard.names:
                weight_map.setdefault(name, file.name)
        if weight_map:
            return _index_table(weight_map), f"{path} (shard headers)"
    raise PlanRefusedError(
        f"reference {path} is neither an HF checkpoint folder nor an index file; pass the folder "
        f"holding {INDEX_NAME} or .safetensors files"
    )


def _index_table(weight_map: Mapping[str, Any]) -> dict[str, int]:
    """File names to 1-based indices: parsed from `-NNNNN-of-NNNNN.safetensors`, or the sorted
    file order when any name lacks it or two files claim one index."""
    files = sorted({str(f) for f in weight_map.values()})
    parsed = {f: HF_SHARD_NUMBER.search(f) for f in files}
    numbers = {f: int(m.group(1)) for f, m in parsed.items() if m}
    if len(numbers) == len(files) and len(set(numbers.values())) == len(files):
        index_of = numbers
    else:
        index_of = {f: k + 1 for k, f in enumerate(files)}
    return {str(name): index_of[str(f)] for name, f in weight_map.items()}


def _greedy(names: list[str], nbytes: dict[str, int], limit: int) -> list[list[str]]:
    """huggingface_hub's rule: fill in key order; a tensor over the limit gets its own file."""
    groups: list[list[str]] = []
    current: list[str] = []
    size = 0
    for name in names:
        n = nbytes[name]
        if n > limit:
            groups.append([name])
            continue
        if current and size + n > limit:
            groups.append(current)
            current, size = [], 0
        current.append(name)
        size += n
    if current or not groups:
        groups.append(current)
    return groups
