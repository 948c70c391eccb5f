"""`hf-sharded`: `model.safetensors.index.json` plus shards (docs/formats.md, "Hugging Face
sharded checkpoints").

Also takes a folder of several `.safetensors` files without an index, so that a checkpoint
whose index was lost is still inspected.
"""

from __future__ import annotations

from pathlib import PurePosixPath

from inspector._internal.checkpoint.read_problems import ReadProblem
from inspector._internal.checkpoint.scanned import (
    IndexDoc,
    LayoutName,
    ScannedCheckpoint,
    ShardedInfo,
)
from inspector._internal.common.filenames import (
    CONFIG_NAME,
    INDEX_NAME,
    QUANT_CONFIG_NAME,
    is_well_known,
)
from inspector._internal.layouts._common import (
    folder_checkpoint,
    list_safetensors,
    prefetch,
    read_config_files,
    read_index_doc,
    read_shards,
    shard_names,
)
from inspector._internal.layouts.base import LayoutReader, ScanOptions
from inspector._internal.storage import Location

__all__ = ["LAYOUT", "detect", "scan", "side_files"]

NAME = LayoutName.HF_SHARDED


def detect(path: Location) -> bool:
    if not path.is_dir():
        return path.name == INDEX_NAME
    return (path / INDEX_NAME).is_file() or len(list_safetensors(path)) > 1


def scan(path: Location, options: ScanOptions) -> ScannedCheckpoint:
    """Read every shard on disk, the index, and every other shard the index names."""
    folder = path if path.is_dir() else path.parent
    cap = options.header_cap
    paths = {p.name: p for p in list_safetensors(folder)}
    prefetch(list(paths.values()), header_cap=cap, side=side_files(folder))
    by_file = dict(
        zip(paths, read_shards(list(paths.values()), root=folder, header_cap=cap), strict=True)
    )
    index: IndexDoc | None = None
    problems: list[ReadProblem] = []
    has_index = (folder / INDEX_NAME).is_file()
    if has_index:
        names = shard_names(tuple(by_file.values())) if options.share_names else None
        index, problems = read_index_doc(
            folder / INDEX_NAME, root=folder, names=names, shard_files=tuple(paths)
        )
        del names
    # Index entries may live in sub-folders; they were checked to stay inside the folder.
    # Normalised so that './model-1.safetensors' is not read a second time as another shard.
    # A file whose name gives it another role (config.json, the index) is never a shard: the
    # entry naming it is wrong (index-wrong-file), the file is not damaged.
    named = {PurePosixPath(f).as_posix() for f in index.files.values} if index else set()
    extra = [
        f
        for f in sorted(named)
        if f not in by_file and not is_well_known(f) and (folder / f).is_file()
    ]
    more = read_shards([folder / f for f in extra], root=folder, header_cap=cap)
    by_file.update(zip(extra, more, strict=True))
    shards = tuple(by_file[k] for k in sorted(by_file))
    configs = read_config_files(folder, root=folder)
    own = frozenset({INDEX_NAME} if has_index else ())
    return folder_checkpoint(
        folder, NAME, ShardedInfo(), shards, configs, index=index, problems=problems, json_files=own
    )


def side_files(folder: Location) -> list[Location]:
    """The JSON files a sharded scan reads whole (fetched with the headers, remotely)."""
    return [folder / n for n in (INDEX_NAME, CONFIG_NAME, QUANT_CONFIG_NAME)]


LAYOUT = LayoutReader(NAME, detect, scan)
