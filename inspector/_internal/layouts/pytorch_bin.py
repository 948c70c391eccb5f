"""`pytorch-bin`: `torch.save` checkpoints, one `.bin`/`.pt` file or `pytorch_model-*.bin`
shards with their index, as transformers 4.x writes them (docs/formats.md, "PyTorch .bin").
Each file is read header-only (`formats.torch_bin`) into the columns a safetensors header
gives (`BinShard`: begin and end are absolute file offsets, `data_start` 0), so every index,
coverage and load check applies unchanged. A folder that also holds safetensors is theirs.
"""

from __future__ import annotations

from pathlib import PurePosixPath

from inspector._internal.checkpoint.scanned import (
    IndexDoc,
    LayoutName,
    PytorchBinInfo,
    ReadProblem,
    ScannedCheckpoint,
)
from inspector._internal.common.filenames import (
    BIN_INDEX_NAME,
    CONFIG_NAME,
    QUANT_CONFIG_NAME,
    is_well_known,
)
from inspector._internal.common.progress import track
from inspector._internal.formats.bin_shard import BinShard, read_bin_shard
from inspector._internal.layouts._common import (
    ConfigFiles,
    folder_checkpoint,
    list_safetensors,
    read_config_files,
    read_index_doc,
    shard_names,
)
from inspector._internal.layouts.base import LayoutReader, ScanOptions
from inspector._internal.storage import EntryKind, Location

__all__ = ["LAYOUT", "BinShard", "detect", "scan"]

NAME = LayoutName.PYTORCH_BIN
# `.bin` files that are not weights (transformers' Trainer pickles its arguments there).
_NOT_WEIGHTS = frozenset({"training_args.bin"})
_SUFFIXES = (".bin", ".pt", ".pth")


def _weight_files(folder: Location) -> list[Location]:
    return [
        folder / e.name
        for e in folder.entries()
        if e.name.endswith(".bin") and e.name not in _NOT_WEIGHTS and e.kind is not EntryKind.DIR
    ]


def detect(path: Location) -> bool:
    if path.rel and not path.is_dir():
        return path.name.endswith(_SUFFIXES) or path.name == BIN_INDEX_NAME
    if list_safetensors(path):
        return False
    return (path / BIN_INDEX_NAME).is_file() or bool(_weight_files(path))


def scan(path: Location, options: ScanOptions) -> ScannedCheckpoint:
    """Read every `.bin` file on disk, the index, and every other file the index names."""
    # Not `options.header_cap`: .bin headers have their own cap (torch_bin.BIN_HEADER_CAP).
    lone = bool(path.rel) and not path.is_dir() and path.name != BIN_INDEX_NAME
    folder = path.parent if bool(path.rel) and not path.is_dir() else path
    paths = {path.name: path} if lone else {p.name: p for p in _weight_files(folder)}
    by_file = {
        name: read_bin_shard(p, root=folder)
        for name, p in track(list(paths.items()), desc="shard headers", unit="file")
    }
    index: IndexDoc | None = None
    problems: list[ReadProblem] = []
    has_index = not lone and (folder / BIN_INDEX_NAME).is_file()
    if has_index:
        names = shard_names(tuple(by_file.values())) if options.share_names else None
        index, problems = read_index_doc(folder / BIN_INDEX_NAME, root=folder, names=names)
    named = {PurePosixPath(f).as_posix() for f in index.files.values} if index else set()
    for f in sorted(named):
        # A file whose name gives it another role is never a shard (see hf_sharded.scan).
        if f not in by_file and not is_well_known(f) and (folder / f).is_file():
            by_file[f] = read_bin_shard(folder / f, root=folder)
    shards = tuple(by_file[k] for k in sorted(by_file))
    configs = read_config_files(folder, root=folder) if not lone else ConfigFiles()
    own = frozenset({BIN_INDEX_NAME} if has_index else ())
    info = PytorchBinInfo(lone_file=lone)
    return folder_checkpoint(
        folder, NAME, info, shards, configs, index=index, problems=problems, json_files=own
    )


def side_files(folder: Location) -> list[Location]:
    """The JSON files a `.bin` scan reads whole."""
    return [folder / n for n in (BIN_INDEX_NAME, CONFIG_NAME, QUANT_CONFIG_NAME)]


LAYOUT = LayoutReader(NAME, detect, scan)
