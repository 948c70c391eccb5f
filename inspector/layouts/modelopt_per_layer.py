"""`modelopt-per-layer`: one shard per decoder layer, each with a `<shard>.json` sidecar
(docs/formats.md, "Model-Optimizer per-layer exports"), usually with a merged
`model.safetensors.index.json`."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from inspector.layouts import hf_sharded
from inspector.layouts._common import read_index_doc, shard_names
from inspector.layouts.base import LayoutReader, ScanOptions
from inspector.model import FileRole, IndexDoc, LayoutName, PerLayerInfo, ScannedCheckpoint

__all__ = ["LAYOUT", "SIDECAR_SUFFIX", "detect", "scan"]

NAME = LayoutName.MODELOPT_PER_LAYER
SIDECAR_SUFFIX = ".safetensors.json"


def detect(path: Path) -> bool:
    return path.is_dir() and bool(_sidecar_paths(path))


def scan(path: Path, options: ScanOptions) -> ScannedCheckpoint:
    """The sharded scan plus every sidecar, keyed by the shard file it describes."""
    base = hf_sharded.scan(path, options)
    sidecars: dict[str, IndexDoc] = {}
    problems = list(base.read_problems)
    names = shard_names(base.shards)
    for sidecar in _sidecar_paths(base.path):
        doc, found = read_index_doc(sidecar, root=base.path, role=FileRole.SIDECAR, names=names)
        problems.extend(found)
        if doc is not None:
            sidecars[sidecar.name.removesuffix(".json")] = doc
    return dataclasses.replace(
        base, layout=NAME, info=PerLayerInfo(sidecars), read_problems=tuple(problems)
    )


def _sidecar_paths(folder: Path) -> list[Path]:
    try:
        names = sorted(e.name for e in os.scandir(folder) if e.name.endswith(SIDECAR_SUFFIX))
    except OSError:
        return []
    return [folder / n for n in names]


LAYOUT = LayoutReader(NAME, detect, scan)
