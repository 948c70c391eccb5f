"""`modelopt-per-layer`: one shard per decoder layer, each with a JSON sidecar, usually with a
merged `model.safetensors.index.json`. Which file is a shard's sidecar (Model-Optimizer's
one stem for both, `<shard>.json` accepted, a well-known file never): docs/formats.md,
"Model-Optimizer per-layer exports".
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping

from inspector._internal.checkpoint.naming_rules import HF_SHARD_NUMBER
from inspector._internal.checkpoint.read_problems import FileRole
from inspector._internal.checkpoint.scanned import (
    IndexDoc,
    LayoutName,
    PerLayerInfo,
    ScannedCheckpoint,
)
from inspector._internal.common.filenames import is_well_known
from inspector._internal.layouts import hf_sharded
from inspector._internal.layouts._common import (
    list_safetensors,
    prefetch,
    read_index_doc,
    shard_names,
)
from inspector._internal.layouts.base import LayoutReader, ScanOptions
from inspector._internal.storage import EntryKind, Location

__all__ = ["LAYOUT", "SIDECAR_SUFFIX", "detect", "scan", "shard_of_sidecar", "sidecar_name"]

NAME = LayoutName.MODELOPT_PER_LAYER
# The suffix the writer puts after the shard's stem (`model-00001-of-00004.json`).
SIDECAR_SUFFIX = ".json"
_SHARD = ".safetensors"


def detect(path: Location) -> bool:
    return path.is_dir() and bool(_sidecar_paths(path))


def scan(path: Location, options: ScanOptions) -> ScannedCheckpoint:
    """The sharded scan plus every sidecar, keyed by the shard file it describes."""
    folder = path if path.is_dir() else path.parent
    # Remote: headers, index, configs and sidecars in one batch of concurrent requests.
    side = [*hf_sharded.side_files(folder), *_sidecar_paths(folder).values()]
    prefetch(list_safetensors(folder), header_cap=options.header_cap, side=side)
    base = hf_sharded.scan(path, options)
    sidecars: dict[str, IndexDoc] = {}
    problems = list(base.read_problems)
    names = shard_names(base.shards) if options.share_names else None
    folder = base.location
    for shard, sidecar in _sidecar_paths(folder).items():
        doc, found = read_index_doc(sidecar, root=folder, role=FileRole.SIDECAR, names=names)
        problems.extend(found)
        if doc is not None:
            sidecars[shard] = doc
    return dataclasses.replace(
        base, layout=NAME, info=PerLayerInfo(sidecars), read_problems=tuple(problems)
    )


def shard_of_sidecar(name: str, shards: Collection[str] = ()) -> str | None:
    """The shard a JSON file of the folder describes, or None when it is no sidecar:
    `<stem>.json` describes `<stem>.safetensors` when that shard is in `shards` or the stem
    is numbered like a shard (`-00001-of-00004`: its shard may be the one missing);
    `<shard>.safetensors.json` always describes `<shard>.safetensors`. A well-known file
    (`config.json` beside `config.safetensors`) describes none."""
    if is_well_known(name) or not name.endswith(SIDECAR_SUFFIX):
        return None
    stem = name.removesuffix(SIDECAR_SUFFIX)
    if stem.endswith(_SHARD):
        return stem
    shard = stem + _SHARD
    return shard if shard in shards or HF_SHARD_NUMBER.search(shard) else None


def sidecar_name(shard: str, sidecars: Mapping[str, IndexDoc]) -> str:
    """The sidecar file of `shard`: the one on disk; for a shard without one, the naming
    its siblings use, else the writer's `<stem>.json`, unless that is a well-known file
    (`config.safetensors` -> `config.safetensors.json`, never `config.json`)."""
    doc = sidecars.get(shard)
    if doc is not None:
        return doc.file
    if sidecars and all(d.file.endswith(_SHARD + SIDECAR_SUFFIX) for d in sidecars.values()):
        return shard + SIDECAR_SUFFIX
    stem = shard.removesuffix(_SHARD) + SIDECAR_SUFFIX
    return shard + SIDECAR_SUFFIX if is_well_known(stem) else stem


def _sidecar_paths(folder: Location) -> dict[str, Location]:
    """shard file -> its sidecar (the writer's `<stem>.json` when both exist), including
    entries the storage refuses (a FIFO, a link out of the folder: reported when read)."""
    names = sorted(e.name for e in folder.entries() if e.kind is not EntryKind.DIR)
    shards = {n for n in names if n.endswith(_SHARD)}
    found: dict[str, Location] = {}
    # `<shard>.safetensors.json` sorts after `<stem>.json`: the writer's name comes first.
    for name in names:
        shard = shard_of_sidecar(name, shards)
        if shard is not None:
            found.setdefault(shard, folder / name)
    return found


LAYOUT = LayoutReader(NAME, detect, scan)
