"""The registry of layout readers: each module of `layouts/` exposes `LAYOUT`, an
implementation of the `Layout` protocol (`name`, `detect(path)`, `scan(path, *, options)`).
Detection tries them in `LAYOUTS` order: the most specific first. It sits above the readers,
which never import it, and below the scan entry (`scan.entry`) that picks from it."""

from __future__ import annotations

from inspector._internal.checkpoint.scanned import LayoutName
from inspector._internal.layouts import (
    dcp_sharded,
    gguf,
    hf_sharded,
    modelopt_per_layer,
    pytorch_bin,
    safetensors_single,
    torch_dist,
)
from inspector._internal.layouts.base import Layout, ScanOptions
from inspector._internal.storage import Location

__all__ = ["LAYOUTS", "Layout", "ScanOptions", "detect_layout", "layout_by_name"]

LAYOUTS: tuple[Layout, ...] = (
    torch_dist.LAYOUT,
    dcp_sharded.LAYOUT,
    modelopt_per_layer.LAYOUT,
    hf_sharded.LAYOUT,
    safetensors_single.LAYOUT,
    pytorch_bin.LAYOUT,
    gguf.LAYOUT,
)


def detect_layout(path: Location) -> Layout | None:
    """The first layout that recognises `path`, or None."""
    for layout in LAYOUTS:
        if layout.detect(path):
            return layout
    return None


def layout_by_name(name: str) -> Layout:
    """The layout called `name`; a ValueError lists the known names otherwise."""
    for layout in LAYOUTS:
        if name == layout.name:
            return layout
    known = ", ".join(LayoutName)
    raise ValueError(f"unknown layout {name!r}; expected one of {known}")
