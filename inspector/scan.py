"""`scan(path)`: find the layout, read every header and JSON file, return the scanned model."""

from __future__ import annotations

import os
from pathlib import Path

from inspector._gc import gc_paused
from inspector.errors import CannotInspectError
from inspector.layouts import ScanOptions, detect_layout, layout_by_name
from inspector.model import ScannedCheckpoint
from inspector.progress import reporting
from inspector.safetensors_header import DEFAULT_HEADER_CAP

__all__ = ["scan"]


def scan(
    path: str | os.PathLike[str],
    *,
    header_cap: int = DEFAULT_HEADER_CAP,
    layout: str | None = None,
    progress: bool = False,
) -> ScannedCheckpoint:
    """Scan a checkpoint folder or a single `.safetensors` file, reading headers only.

    What cannot be read is recorded in the result (`.read_problems`, shown as findings in
    `.problems`); only a path that cannot be inspected at all raises `CannotInspectError`.
    `layout` forces a layout by name. `progress` draws a progress bar over the shard
    headers (`tqdm.auto`).
    """
    target = Path(path).expanduser()
    if not target.exists():
        raise CannotInspectError(f"{target}: no such file or folder")
    target = target.resolve()
    reader = layout_by_name(layout) if layout else detect_layout(target)
    if reader is None:
        raise CannotInspectError(
            f"{target}: no checkpoint found (expected .safetensors files, "
            "model.safetensors.index.json, or a torch_dist folder with .metadata)"
        )
    with gc_paused(), reporting(progress):
        return reader.scan(target, options=ScanOptions(header_cap=header_cap))
