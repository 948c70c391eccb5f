"""`hf-sharded`: `model.safetensors.index.json` plus shards (FORMATS.md section 2).

Also takes a folder of several `.safetensors` files without an index, so that a checkpoint
whose index was lost is still inspected.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath

from inspector.checks.index import check_index
from inspector.checks.sharding import check_collapsed_shards
from inspector.findings import Finding
from inspector.layouts._common import (
    INDEX_NAME,
    list_safetensors,
    read_config_files,
    read_index_doc,
    read_shards,
)
from inspector.model import ScannedCheckpoint

NAME = "hf-sharded"


def detect(path: Path) -> bool:
    if not path.is_dir():
        return path.name == INDEX_NAME
    return (path / INDEX_NAME).is_file() or len(list_safetensors(path)) > 1


def scan(path: Path, *, header_cap: int) -> ScannedCheckpoint:
    """Read the index, every shard it names that exists, and every stray shard on disk."""
    folder = path.parent if path.is_file() else path
    index, problems = None, []
    if (folder / INDEX_NAME).is_file():
        index, problems = read_index_doc(folder / INDEX_NAME, root=folder)
    paths = {p.name: p for p in list_safetensors(folder)}
    # Index entries may live in sub-folders; they were checked to stay inside the folder.
    # Normalised so that './model-1.safetensors' is not read a second time as another shard.
    for file in sorted(
        {PurePosixPath(f).as_posix() for f in set(index.weight_map.values())} if index else ()
    ):
        candidate = folder / file
        if file not in paths and candidate.is_file():
            paths[file] = candidate
    shards = read_shards([paths[k] for k in sorted(paths)], root=folder, header_cap=header_cap)
    config, quant, spec, found, config_problems = read_config_files(folder, root=folder)
    for shard in shards:
        problems.extend(shard.findings)
    problems.extend(config_problems)
    return ScannedCheckpoint(
        path=folder,
        layout=NAME,
        shards=shards,
        index=index,
        config=config,
        quant_config=quant,
        spec=spec,
        problems=problems,
        json_files=frozenset(
            found | ({INDEX_NAME} if index or (folder / INDEX_NAME).is_file() else set())
        ),
    )


def check(scanned: ScannedCheckpoint) -> list[Finding]:
    """Index drift: the index against the shard headers (only duplicates without an index),
    and every tensor collapsed into one oversized file."""
    return [*check_index(scanned.shards, scanned.index), *check_collapsed_shards(scanned)]
