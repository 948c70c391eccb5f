"""The registry of layout readers: each module of `layouts/` exposes `LAYOUT`, an
implementation of the `Layout` protocol (`name`, `detect(path)`, `scan(path, *, options)`).
Detection tries them in `READERS` order: the most specific first. It sits above the readers,
which never import it, and below the scan entry (`scan.entry`) that picks from it.

The registry names the modules, imported when detection reaches them or a layout is asked
for by name: a sharded safetensors folder never imports the `.bin` and GGUF readers (their
pickle and GGUF parsers: 3.5-4 ms of CPU at every scan's start)."""

from __future__ import annotations

import importlib

from inspector._internal.checkpoint.scanned import LayoutName
from inspector._internal.layouts.base import Layout, ScanOptions
from inspector._internal.storage import Location

__all__ = ["READERS", "Layout", "ScanOptions", "detect_layout", "layout_by_name", "reader"]

# Each layout and the module of `inspector._internal.layouts` that reads it, in detection order.
READERS: tuple[tuple[LayoutName, str], ...] = (
    (LayoutName.TORCH_DIST, "torch_dist"),
    (LayoutName.DCP_SHARDED, "dcp_sharded"),
    (LayoutName.MODELOPT_PER_LAYER, "modelopt_per_layer"),
    (LayoutName.HF_SHARDED, "hf_sharded"),
    (LayoutName.SAFETENSORS_SINGLE, "safetensors_single"),
    (LayoutName.PYTORCH_BIN, "pytorch_bin"),
    (LayoutName.GGUF, "gguf"),
)


def reader(module: str) -> Layout:
    """The `LAYOUT` of the reader module `module` (imported on first use)."""
    layout: Layout = importlib.import_module(f"inspector._internal.layouts.{module}").LAYOUT
    return layout


def detect_layout(path: Location) -> Layout | None:
    """The first layout that recognises `path`, or None."""
    for _, module in READERS:
        layout = reader(module)
        if layout.detect(path):
            return layout
    return None


def layout_by_name(name: str) -> Layout:
    """The layout called `name`; a ValueError lists the known names otherwise."""
    for layout_name, module in READERS:
        if name == layout_name:
            return reader(module)
    known = ", ".join(LayoutName)
    raise ValueError(f"unknown layout {name!r}; expected one of {known}")
