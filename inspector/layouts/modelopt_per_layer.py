"""`modelopt-per-layer`: one shard per decoder layer, each with a `<shard>.json` sidecar
(FORMATS.md section 3), usually with a merged `model.safetensors.index.json`."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from inspector.checks.index import check_index, held_tensors
from inspector.checks.sidecars import check_sidecars
from inspector.findings import Finding
from inspector.layouts import hf_sharded
from inspector.layouts._common import read_index_doc
from inspector.model import IndexDoc, ScannedCheckpoint

NAME = "modelopt-per-layer"
SIDECAR_SUFFIX = ".safetensors.json"


def detect(path: Path) -> bool:
    return path.is_dir() and bool(_sidecar_paths(path))


def scan(path: Path, *, header_cap: int) -> ScannedCheckpoint:
    """The sharded scan plus every sidecar, keyed by the shard file it describes."""
    base = hf_sharded.scan(path, header_cap=header_cap)
    sidecars: dict[str, IndexDoc] = {}
    problems = list(base.problems)
    for sidecar in _sidecar_paths(base.path):
        doc, found = read_index_doc(sidecar, root=base.path, unreadable_code="sidecar-unreadable")
        problems.extend(found)
        if doc is not None:
            sidecars[sidecar.name.removesuffix(".json")] = doc
    return dataclasses.replace(base, layout=NAME, sidecars=sidecars, problems=problems)


def check(scanned: ScannedCheckpoint) -> list[Finding]:
    """Index drift plus sidecar drift (each sidecar against its shard and the index)."""
    unreadable = {
        f.file.removesuffix(".json")
        for f in scanned.problems
        if f.code == "sidecar-unreadable" and f.file
    }
    held = held_tensors(scanned.shards)
    return check_index(scanned.shards, scanned.index, held=held) + check_sidecars(
        scanned.shards, scanned.sidecars, scanned.index, unreadable=unreadable, held=held
    )


def _sidecar_paths(folder: Path) -> list[Path]:
    try:
        names = sorted(e.name for e in os.scandir(folder) if e.name.endswith(SIDECAR_SUFFIX))
    except OSError:
        return []
    return [folder / n for n in names]
