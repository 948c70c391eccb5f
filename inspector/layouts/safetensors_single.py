"""`safetensors-single`: one `.safetensors` file, or a folder holding `model.safetensors`."""

from __future__ import annotations

from pathlib import Path

from inspector.layouts._common import (
    INDEX_NAME,
    ConfigFiles,
    list_safetensors,
    read_config_files,
    read_shards,
)
from inspector.layouts.base import LayoutReader, ScanOptions
from inspector.model import LayoutName, ScannedCheckpoint, SingleFileInfo

__all__ = ["LAYOUT", "detect", "scan"]

NAME = LayoutName.SAFETENSORS_SINGLE


def detect(path: Path) -> bool:
    if path.is_file():
        return path.name.endswith(".safetensors")
    if (path / INDEX_NAME).is_file():
        return False
    return len(list_safetensors(path)) == 1


def scan(path: Path, options: ScanOptions) -> ScannedCheckpoint:
    """A lone file is read without the folder's config: the folder may hold more shards."""
    lone = path.is_file()
    folder = path.parent if lone else path
    paths = [path] if lone else list_safetensors(folder)
    shards = read_shards(paths, root=folder, header_cap=options.header_cap)
    configs = ConfigFiles() if lone else read_config_files(folder, root=folder)
    return ScannedCheckpoint(
        path=folder,
        layout=NAME,
        info=SingleFileInfo(lone_file=lone),
        shards=shards,
        config=configs.config,
        quant_config=configs.quant,
        spec=configs.spec,
        read_problems=configs.problems,
        json_files=configs.found,
    )


LAYOUT = LayoutReader(NAME, detect, scan)
