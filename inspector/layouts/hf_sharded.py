"""`hf-sharded`: `model.safetensors.index.json` plus shards (docs/formats.md, "Hugging Face
sharded checkpoints").

Also takes a folder of several `.safetensors` files without an index, so that a checkpoint
whose index was lost is still inspected.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath

from inspector.layouts._common import (
    INDEX_NAME,
    list_safetensors,
    read_config_files,
    read_index_doc,
    read_shards,
)
from inspector.layouts.base import LayoutReader, ScanOptions
from inspector.model import IndexDoc, LayoutName, ReadProblem, ScannedCheckpoint, ShardedInfo

__all__ = ["LAYOUT", "detect", "scan"]

NAME = LayoutName.HF_SHARDED


def detect(path: Path) -> bool:
    if not path.is_dir():
        return path.name == INDEX_NAME
    return (path / INDEX_NAME).is_file() or len(list_safetensors(path)) > 1


def scan(path: Path, options: ScanOptions) -> ScannedCheckpoint:
    """Read the index, every shard it names that exists, and every stray shard on disk."""
    folder = path.parent if path.is_file() else path
    index: IndexDoc | None = None
    problems: list[ReadProblem] = []
    has_index = (folder / INDEX_NAME).is_file()
    if has_index:
        index, problems = read_index_doc(folder / INDEX_NAME, root=folder)
    paths = {p.name: p for p in list_safetensors(folder)}
    # Index entries may live in sub-folders; they were checked to stay inside the folder.
    # Normalised so that './model-1.safetensors' is not read a second time as another shard.
    named = {PurePosixPath(f).as_posix() for f in index.files.values} if index else set()
    for file in sorted(named):
        candidate = folder / file
        if file not in paths and candidate.is_file():
            paths[file] = candidate
    shards = read_shards(
        [paths[k] for k in sorted(paths)], root=folder, header_cap=options.header_cap
    )
    configs = read_config_files(folder, root=folder)
    return ScannedCheckpoint(
        path=folder,
        layout=NAME,
        info=ShardedInfo(),
        shards=shards,
        index=index,
        config=configs.config,
        quant_config=configs.quant,
        spec=configs.spec,
        read_problems=(*problems, *configs.problems),
        json_files=configs.found | ({INDEX_NAME} if has_index else set()),
    )


LAYOUT = LayoutReader(NAME, detect, scan)
