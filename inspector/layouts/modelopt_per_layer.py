"""`modelopt-per-layer`: one shard per decoder layer, each with a `<shard>.json` sidecar
(docs/formats.md, "Model-Optimizer per-layer exports"), usually with a merged
`model.safetensors.index.json`."""

from __future__ import annotations

import dataclasses

from inspector.layouts import hf_sharded
from inspector.layouts._common import list_safetensors, prefetch, read_index_doc, shard_names
from inspector.layouts.base import LayoutReader, ScanOptions
from inspector.model import FileRole, IndexDoc, LayoutName, PerLayerInfo, ScannedCheckpoint
from inspector.storage import EntryKind, Location

__all__ = ["LAYOUT", "SIDECAR_SUFFIX", "detect", "scan"]

NAME = LayoutName.MODELOPT_PER_LAYER
SIDECAR_SUFFIX = ".safetensors.json"


def detect(path: Location) -> bool:
    return path.is_dir() and bool(_sidecar_paths(path))


def scan(path: Location, options: ScanOptions) -> ScannedCheckpoint:
    """The sharded scan plus every sidecar, keyed by the shard file it describes."""
    folder = path if path.is_dir() else path.parent
    # Remote: headers, index, configs and sidecars in one batch of concurrent requests.
    side = [*hf_sharded.side_files(folder), *_sidecar_paths(folder)]
    prefetch(list_safetensors(folder), header_cap=options.header_cap, side=side)
    base = hf_sharded.scan(path, options)
    sidecars: dict[str, IndexDoc] = {}
    problems = list(base.read_problems)
    names = shard_names(base.shards)
    folder = base.location
    for sidecar in _sidecar_paths(folder):
        doc, found = read_index_doc(sidecar, root=folder, role=FileRole.SIDECAR, names=names)
        problems.extend(found)
        if doc is not None:
            sidecars[sidecar.name.removesuffix(".json")] = doc
    return dataclasses.replace(
        base, layout=NAME, info=PerLayerInfo(sidecars), read_problems=tuple(problems)
    )


def _sidecar_paths(folder: Location) -> list[Location]:
    """Sidecars in `folder`, including entries the storage refuses (reported when read)."""
    return [
        folder / e.name
        for e in folder.entries()
        if e.name.endswith(SIDECAR_SUFFIX) and e.kind is not EntryKind.DIR
    ]


LAYOUT = LayoutReader(NAME, detect, scan)
