"""Where each tensor is stored: the readable headers indexed by file and by tensor name, and
the index's member names in the form shard `file` fields use. Facts, built once per scan and
shared by the index and sidecar checks, repairs and restores. Pure.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from itertools import repeat
from pathlib import PurePosixPath
from typing import TYPE_CHECKING

from inspector._internal.formats.safetensors import ShardHeader

if TYPE_CHECKING:
    from inspector._internal.checkpoint.scanned import ScannedCheckpoint

__all__ = [
    "HeldTensors",
    "held_of",
    "held_tensors",
    "normalize_member",
    "normalized",
    "normalized_map",
    "shard_names_distinct",
]


@dataclass(frozen=True)
class HeldTensors:
    """Where every tensor name is stored, built once from the readable headers.

    `first` maps each name to the index (in `shards`) of the first shard holding it;
    `copies` lists every holder, only for names held by more than one shard; `distinct` is
    True when no name appears twice at all (not even twice in one header).
    """

    shards: tuple[ShardHeader, ...]
    by_file: dict[str, ShardHeader]
    first: dict[str, int]
    copies: dict[str, list[int]]
    distinct: bool
    # Per file, tensor names whose header entry was malformed (already a finding).
    invalid: dict[str, frozenset[str]]

    # Sets built so far by `present` (a healthy checkpoint needs none of them).
    _sets: dict[str, frozenset[str]] = field(default_factory=dict, repr=False, compare=False)

    def present(self, file: str) -> frozenset[str]:
        """The names `file` holds, as a set (built on first use, then kept)."""
        names = self._sets.get(file)
        if names is None:
            names = self._sets[file] = frozenset(self.by_file[file].names)
        return names

    @property
    def unreadable(self) -> list[str]:
        return [s.file for s in self.shards if not s.readable]

    def holders(self, name: str) -> list[str]:
        """Files holding `name`, in shard order."""
        if name in self.copies:
            return [self.shards[i].file for i in self.copies[name]]
        i = self.first.get(name)
        return [] if i is None else [self.shards[i].file]


def held_tensors(shards: Iterable[ShardHeader]) -> HeldTensors:
    """Index the headers by file and by tensor name (a file listed twice is kept once)."""
    unique: dict[str, ShardHeader] = {}
    for shard in shards:
        unique.setdefault(shard.file, shard)
    ordered = tuple(unique.values())
    first, copies = _first_holders(ordered)
    distinct = len(first) == sum(len(s.names) for s in ordered)
    invalid = {
        s.file: frozenset(
            f.tensor for f in s.findings if f.code == "header-invalid-entry" and f.tensor
        )
        for s in ordered
    }
    return HeldTensors(ordered, unique, first, copies, distinct, invalid)


def _first_holders(ordered: tuple[ShardHeader, ...]) -> tuple[dict[str, int], dict[str, list[int]]]:
    """(first, copies) of `HeldTensors`. Usually no name repeats, which C-level dict updates
    prove (the dict is as long as all name lists together); only then is the per-name pass
    that records every holder needed."""
    first: dict[str, int] = {}
    for i, shard in enumerate(ordered):
        first.update(zip(shard.names, repeat(i)))
    if len(first) == sum(len(s.names) for s in ordered):
        return first, {}
    first = {}
    copies: dict[str, list[int]] = {}
    for i, shard in enumerate(ordered):
        for name in shard.names:
            j = first.setdefault(name, i)
            if j != i:
                copies.setdefault(name, [j]).append(i)
    return first, copies


# The key `held_of` keeps its value under (`ScannedCheckpoint.derived`).
_HELD = "held-tensors"


def held_of(scanned: ScannedCheckpoint) -> HeldTensors:
    """`held_tensors` of a scan, built once and shared by the index and sidecar checks."""
    return scanned.derived(_HELD, lambda: held_tensors(scanned.shards))


def shard_names_distinct(scanned: ScannedCheckpoint) -> bool | None:
    """True when no name is held twice across the scan's shards (each file once), from
    `held_of` when something built it already; None when that is not known for free."""
    held: HeldTensors | None = scanned.derived_if_built(_HELD)
    if held is None or len(held.shards) != len(scanned.shards):
        return None
    return held.distinct


def normalize_member(value: str) -> str:
    """'./a//b.safetensors' -> 'a/b.safetensors', the form shard `file` fields use: the file a
    loader opens at that spelling. A name whose last part is empty or `.` ('a.safetensors/',
    'a.safetensors/.') is left as it is: opening it fails (not a folder), so it never names
    the shard `a.safetensors` (`PurePosixPath` drops that part)."""
    if value.endswith(("/", "/.")):
        return value
    return PurePosixPath(value).as_posix()


def normalized_map(weight_map: Mapping[str, str]) -> dict[str, str]:
    """The weight map with file names normalised; each distinct file is normalised once."""
    renamed = _renamed(weight_map)
    return dict(weight_map) if renamed is None else renamed


def normalized(weight_map: Mapping[str, str]) -> Mapping[str, str]:
    """`normalized_map` without the copy when nothing changes (read-only use only)."""
    renamed = _renamed(weight_map)
    if renamed is not None:
        return renamed
    # A plain dict: millions of lookups through a read-only view cost half as much again.
    # One given as a dict (`IndexDoc.lookup_map`) is shared, not copied.
    return weight_map if type(weight_map) is dict else dict(weight_map)


def _renamed(weight_map: Mapping[str, str]) -> dict[str, str] | None:
    """The weight map with normalised file names, or None when they already are."""
    files = {f: normalize_member(f) for f in set(weight_map.values())}
    if all(k == v for k, v in files.items()):
        return None
    return {tensor: files[f] for tensor, f in weight_map.items()}
