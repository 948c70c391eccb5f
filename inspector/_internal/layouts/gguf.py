"""`gguf`: llama.cpp GGUF files, one `.gguf` or the parts of a split model
(`NAME-0000i-of-0000N.gguf`, each a complete GGUF file), read header-only
(`formats.gguf_shard`). A folder that also holds safetensors is left to those layouts."""

from __future__ import annotations

from inspector._internal.checkpoint.scanned import GgufInfo, LayoutName, ScannedCheckpoint
from inspector._internal.common.progress import track
from inspector._internal.formats.gguf_shard import read_gguf_shard
from inspector._internal.layouts._common import (
    ConfigFiles,
    folder_checkpoint,
    list_safetensors,
    read_config_files,
)
from inspector._internal.layouts.base import LayoutReader, ScanOptions
from inspector._internal.storage import EntryKind, Location

__all__ = ["LAYOUT", "detect", "scan"]

NAME = LayoutName.GGUF
SUFFIX = ".gguf"


def _files(folder: Location) -> list[Location]:
    return [
        folder / e.name
        for e in folder.entries()
        if e.name.endswith(SUFFIX) and e.kind is not EntryKind.DIR
    ]


def detect(path: Location) -> bool:
    if path.rel and not path.is_dir():
        return path.name.endswith(SUFFIX)
    return not list_safetensors(path) and bool(_files(path))


def scan(path: Location, options: ScanOptions) -> ScannedCheckpoint:
    """Every `.gguf` file of the folder (or the one file given)."""
    del options  # GGUF headers have their own cap (formats.gguf_header.GGUF_HEADER_CAP)
    lone = bool(path.rel) and not path.is_dir()
    folder = path.parent if lone else path
    paths = [path] if lone else _files(folder)
    shards = tuple(
        read_gguf_shard(p, root=folder) for p in track(paths, desc="GGUF headers", unit="file")
    )
    # config.json beside the GGUF (the model it was converted from) says what the GGUF
    # cannot, such as Llama 3's RoPE scaling (`checks.llama_cpp`); a lone file is read alone.
    configs = ConfigFiles() if lone else read_config_files(folder, root=folder)
    return folder_checkpoint(folder, NAME, GgufInfo(lone_file=lone), shards, configs)


LAYOUT = LayoutReader(NAME, detect, scan)
