"""What a loader reads of a checkpoint: the shards in transformers' order, and the copy it keeps
of a name several shards hold. Every reader that takes "the" tensor of a name (load check,
`check --values`, `diff`, `verify`, the manifest, `repair --from`, `tensor_data`) takes it
from here, so all agree on the copy transformers 5 keeps. Pure: headers and the index only.
The rule it mirrors: docs/architecture.md, "checkpoint/".
"""

from __future__ import annotations

import posixpath
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from itertools import repeat
from typing import TYPE_CHECKING

import numpy as np

from inspector._internal.checkpoint.tensor_shards import held_of, normalize_member
from inspector._internal.common.filenames import (
    BIN_INDEX_NAME,
    BIN_WEIGHTS_NAME,
    SAFETENSORS_WEIGHTS_NAME,
)
from inspector._internal.formats.safetensors import ShardHeader
from inspector._internal.formats.tensordata import TensorData

if TYPE_CHECKING:
    from inspector._internal.checkpoint.scanned import IndexDoc, ScannedCheckpoint

__all__ = [
    "WEIGHTS_KEY",
    "Kept",
    "NamedWeights",
    "alone",
    "any_loader_shards",
    "chosen_copies",
    "kept_copies",
    "kept_in",
    "kept_signatures",
    "loaded_shards",
    "named_weights",
    "read_order",
    "stale_copies",
    "tensor_data",
]

# The copy of a name a loader keeps: its shard and the row of its entry there.
Kept = tuple[ShardHeader, int]


def loaded_shards(scanned: ScannedCheckpoint) -> tuple[ShardHeader, ...]:
    """The shards transformers reads, in the order it reads them (`read_order`): of a name
    several of them hold, it keeps the copy of the last. Every shard of a DCP or torch_dist
    checkpoint, whose tensors are assembled from chunks. Where config.json names the weights
    (`named_weights`), what it names: nothing when transformers would not load it or the scan
    did not read it (no verdict then covers other files)."""
    if _chunked(scanned):
        return scanned.shards
    named = named_weights(scanned)
    if named is not None:
        return named.shards
    return read_order(scanned.shards, scanned.index)


# The config.json entry naming the weights transformers reads instead of its usual files.
WEIGHTS_KEY = "transformers_weights"
# What transformers accepts there besides safetensors files and indexes.
_ADAPTER = "adapter_model.bin"


@dataclass(frozen=True, slots=True)
class NamedWeights:
    """What config.json's `transformers_weights` makes transformers read: `shards`, in the
    order it reads them, when it names a file or index the scan read; else none, and
    `problem` says why (transformers refuses the value, or the scan did not read the file)."""

    value: object
    shards: tuple[ShardHeader, ...]
    problem: str | None


def named_weights(scanned: ScannedCheckpoint) -> NamedWeights | None:
    """config.json's `transformers_weights` as transformers 5 takes it
    (`modeling_utils._get_resolved_checkpoint_files`, `transformers_explicit_filename`), or
    None when it names nothing (absent or null): it must end in `.safetensors` or
    `.safetensors.index.json` or be `adapter_model.bin` (else "The transformers file in the
    config seems to be incorrect"), and lie inside the folder once made absolute (else "must
    reference a file inside the model directory"); that file alone is read, or the files that
    index names, whatever else the folder holds. GGUF files and chunked layouts are not read
    by `from_pretrained` this way: None."""
    config = scanned.config
    if config is None or _chunked(scanned) or scanned.layout == "gguf":
        return None
    value = config.get(WEIGHTS_KEY)
    if value is None:
        return None
    if not isinstance(value, str):
        return NamedWeights(value, (), "it is not a file name: transformers fails on it")
    if not value.endswith((".safetensors", ".safetensors.index.json")) and value != _ADAPTER:
        why = "transformers refuses it: neither a .safetensors file nor a safetensors index"
        return NamedWeights(value, (), why)
    # os.path.abspath(os.path.join(folder, value)) must stay in the folder: an absolute
    # value replaces the folder, and '..' is folded before the check.
    member = posixpath.normpath(value)
    if value.startswith("/") or member == ".." or member.startswith("../"):
        why = "transformers refuses it: it is not a file inside the model folder"
        return NamedWeights(value, (), why)
    if value.endswith(".safetensors.index.json"):
        index = scanned.index
        if index is None or index.file != member:
            why = "transformers reads the files that index names, and this tool does not read it"
            return NamedWeights(value, (), why)
        return NamedWeights(value, _index_order(scanned.shards, index), None)
    found = next((s for s in scanned.shards if s.file == member), None)
    if found is None:
        why = "the scan read no such weight file: transformers reads it or fails, unchecked here"
        return NamedWeights(value, (), why)
    return NamedWeights(value, (found,), None)


def read_order(shards: Sequence[ShardHeader], index: IndexDoc | None) -> tuple[ShardHeader, ...]:
    """`loaded_shards` of headers and the index beside them. The one-file weights alone when
    they are there (`alone`); else the files the index names, in the order of their
    spellings sorted, a file spelled twice placed where it is read last; without an index,
    every shard in name order (a lone file, the parts of a GGUF, a folder whose index was
    lost, read as transformers reads the index `repair --only index` rebuilds)."""
    single = alone(shards, index)
    if single is not None:
        return (single,)
    if index is None:
        return tuple(shards)
    return _index_order(shards, index)


def _index_order(shards: Sequence[ShardHeader], index: IndexDoc) -> tuple[ShardHeader, ...]:
    """The files `index` names, in the order transformers reads them (`read_order`)."""
    rank: dict[str, int] = {}
    used = np.unique(index.files.codes).tolist()
    for i, raw in enumerate(sorted({index.files.values[c] for c in used})):
        rank[normalize_member(raw)] = i  # a later reading of the same file wins
    return tuple(sorted((s for s in shards if s.file in rank), key=lambda s: rank[s.file]))


def alone(shards: Sequence[ShardHeader], index: IndexDoc | None) -> ShardHeader | None:
    """The one-file weights transformers reads instead of any index: `model.safetensors`
    when the folder holds it; `pytorch_model.bin` unless a safetensors index comes first."""
    by_file = {s.file: s for s in shards}
    found = by_file.get(SAFETENSORS_WEIGHTS_NAME)
    if found is None and (index is None or index.file == BIN_INDEX_NAME):
        found = by_file.get(BIN_WEIGHTS_NAME)
    return found


def any_loader_shards(scanned: ScannedCheckpoint) -> tuple[ShardHeader, ...]:
    """The shards some loader reads: those huggingface_hub's `load_torch_model` alone reads
    (the files an index names, when a `model.safetensors` beside it is what transformers
    reads), then transformers' (`loaded_shards`). Of a name several of them hold, any copy
    may be the one loaded; the one transformers keeps comes last."""
    mine = loaded_shards(scanned)
    index = scanned.index
    if index is None or _chunked(scanned):
        return mine
    named = {normalize_member(f) for f in index.files.values}
    read = {s.file for s in mine}
    return tuple(s for s in scanned.shards if s.file in named and s.file not in read) + mine


def kept_copies(
    scanned: ScannedCheckpoint, names: Collection[str] | None = None
) -> dict[str, Kept]:
    """Name -> the copy transformers keeps (`loaded_shards`), for every name it loads or
    for `names` only; a name no shard it reads holds is absent. Empty for DCP and
    torch_dist, whose tensors are assembled from chunks."""
    if _chunked(scanned):
        return {}
    return kept_in(loaded_shards(scanned), names)


def kept_in(order: Sequence[ShardHeader], names: Collection[str] | None = None) -> dict[str, Kept]:
    """`kept_copies` of shards read in `order` (`read_order`): the last copy of each name."""
    out: dict[str, Kept] = {}
    if names is None:  # C-level zips: 300,000 names
        for shard in order:
            n = len(shard.names)
            out.update(zip(shard.names, zip(repeat(shard, n), range(n), strict=True), strict=True))
        return out
    wanted = names if isinstance(names, set | frozenset) else set(names)
    for shard in order:
        if wanted.isdisjoint(shard.names):
            continue
        out.update((n, (shard, row)) for row, n in enumerate(shard.names) if n in wanted)
    return out


def chosen_copies(scanned: ScannedCheckpoint) -> dict[str, Kept]:
    """Name -> the copy a reader of "the" tensor takes: the one transformers keeps
    (`kept_copies`); of a name no shard it reads holds, the copy of the last shard by name
    that holds it (as if the index named every file). Empty for DCP and torch_dist."""
    if _chunked(scanned):
        return {}
    order = loaded_shards(scanned)
    if len(order) == len(scanned.shards):
        return kept_in(order)
    out = kept_in(scanned.shards)
    out.update(kept_in(order))
    return out


def kept_signatures(scanned: ScannedCheckpoint) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Name -> (dtype, shape) of the copy transformers keeps of every name it loads
    (`kept_copies`, as columns). Empty for DCP and torch_dist."""
    out: dict[str, tuple[str, tuple[int, ...]]] = {}
    if _chunked(scanned):
        return out
    for shard in loaded_shards(scanned):  # later shards replace earlier copies
        out.update(
            zip(shard.names, zip(shard.dtypes, map(tuple, shard.shapes), strict=True), strict=True)
        )
    return out


def stale_copies(scanned: ScannedCheckpoint) -> dict[str, frozenset[str]]:
    """File -> the names it holds whose copy there is not the one a reader of "the" tensor
    takes (`chosen_copies`): another shard's copy is the one transformers keeps, or, of a
    name no shard it reads holds, another file later by name holds one too. Empty when no
    name is in two shards (the usual case: one C-level pass proves it) and for DCP and
    torch_dist."""
    if _chunked(scanned):
        return {}
    held = held_of(scanned)
    if not held.copies:
        return {}
    kept = kept_copies(scanned, held.copies)
    stale: dict[str, set[str]] = {}
    for name, holders in held.copies.items():
        files = [held.shards[i].file for i in holders]
        keep = kept[name][0].file if name in kept else files[-1]
        for file in files:
            if file != keep:
                stale.setdefault(file, set()).add(name)
    return {file: frozenset(names) for file, names in stale.items()}


def _chunked(scanned: ScannedCheckpoint) -> bool:
    """DCP and torch_dist: each shard holds chunks of the tensors, not copies."""
    return scanned.dcp is not None or scanned.logical is not None


def tensor_data(scanned: ScannedCheckpoint) -> TensorData:
    """Byte access to `scanned`'s tensors, "the" tensor of a name being the copy
    `chosen_copies` names (nothing is read until a tensor is asked for)."""
    dcp = scanned.dcp
    return TensorData(
        scanned.location.storage,
        scanned.shards,
        where=lambda: chosen_copies(scanned),
        chunks=None if dcp is None else dcp.chunks,
        full_shapes=None if dcp is None else dcp.full_shapes,
    )
