"""`safetensors-single`: one `.safetensors` file, or a folder holding `model.safetensors`."""

from __future__ import annotations

from inspector._internal.checkpoint.scanned import LayoutName, ScannedCheckpoint, SingleFileInfo
from inspector._internal.common.filenames import CONFIG_NAME, INDEX_NAME, QUANT_CONFIG_NAME
from inspector._internal.layouts._common import (
    ConfigFiles,
    folder_checkpoint,
    list_safetensors,
    prefetch,
    read_config_files,
    read_shards,
)
from inspector._internal.layouts.base import LayoutReader, ScanOptions
from inspector._internal.storage import Location

__all__ = ["LAYOUT", "detect", "scan"]

NAME = LayoutName.SAFETENSORS_SINGLE


def detect(path: Location) -> bool:
    if path.rel and not path.is_dir():
        return path.name.endswith(".safetensors")
    if (path / INDEX_NAME).is_file():
        return False
    return len(list_safetensors(path)) == 1


def scan(path: Location, options: ScanOptions) -> ScannedCheckpoint:
    """A lone file is read without the folder's config: the folder may hold more shards."""
    lone = bool(path.rel) and not path.is_dir()
    folder = path.parent if lone else path
    paths = [path] if lone else list_safetensors(folder)
    side = [] if lone else [folder / CONFIG_NAME, folder / QUANT_CONFIG_NAME]
    prefetch(paths, header_cap=options.header_cap, side=side)
    shards = read_shards(paths, root=folder, header_cap=options.header_cap)
    configs = ConfigFiles() if lone else read_config_files(folder, root=folder)
    return folder_checkpoint(folder, NAME, SingleFileInfo(lone_file=lone), shards, configs)


LAYOUT = LayoutReader(NAME, detect, scan)
