"""One module per on-disk layout. Each has `NAME`, `detect(path) -> bool` and
`scan(path, *, header_cap) -> ScannedCheckpoint`. Detection tries them in `LAYOUTS` order:
the most specific first."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

from inspector.layouts import (
    dcp_sharded,
    hf_sharded,
    modelopt_per_layer,
    safetensors_single,
    torch_dist,
)

__all__ = ["LAYOUTS", "detect_layout", "layout_by_name"]

LAYOUTS: tuple[ModuleType, ...] = (
    torch_dist,
    dcp_sharded,
    modelopt_per_layer,
    hf_sharded,
    safetensors_single,
)


def detect_layout(path: Path) -> ModuleType | None:
    """The first layout module that recognises `path`, or None."""
    for module in LAYOUTS:
        if module.detect(path):
            return module
    return None


def layout_by_name(name: str) -> ModuleType:
    for module in LAYOUTS:
        if name == module.NAME:
            return module
    known = ", ".join(m.NAME for m in LAYOUTS)
    raise ValueError(f"unknown layout {name!r}; expected one of {known}")
