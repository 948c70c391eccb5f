"""The `Layout` protocol every reader implements, and the options a scan takes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from inspector._internal.checkpoint.scanned import LayoutName, ScannedCheckpoint
from inspector._internal.formats.safetensors import DEFAULT_HEADER_CAP
from inspector._internal.storage import Location

__all__ = ["Layout", "LayoutReader", "ScanOptions"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ScanOptions:
    """How a scan reads: `header_cap` bounds every safetensors header it reads.

    `share_names`: an index's (or sidecar's) names take the shards' strings for the names
    they share (`layouts._common.shard_names`): about 100 bytes a tensor less for as long as
    the scan is kept, for a dict of every name (0.1 s of CPU at 300,000 tensors when the
    index is not in the shards' order, as `save_pretrained`'s sorted index is not). Off for
    a scan read once and dropped (`scan.entry.scan_once`)."""

    header_cap: int = DEFAULT_HEADER_CAP
    share_names: bool = True


class Layout(Protocol):
    """An on-disk layout: recognises its folders and reads them into a `ScannedCheckpoint`.

    A reader reads and never judges: what it cannot read is a `ReadProblem` in the result.
    """

    @property
    def name(self) -> LayoutName: ...

    def detect(self, path: Location) -> bool:
        """True when `path` (a folder, or a file in its folder's storage) is a checkpoint of
        this layout. Cheap: names first."""
        ...

    def scan(self, path: Location, *, options: ScanOptions) -> ScannedCheckpoint:
        """Read `path` (headers and side files only), every file through its storage."""
        ...


@dataclass(frozen=True, slots=True)
class LayoutReader:
    """A `Layout` made of a reader module's two functions."""

    name: LayoutName
    detect_fn: Callable[[Location], bool]
    scan_fn: Callable[[Location, ScanOptions], ScannedCheckpoint]

    def detect(self, path: Location) -> bool:
        return self.detect_fn(path)

    def scan(self, path: Location, *, options: ScanOptions) -> ScannedCheckpoint:
        return self.scan_fn(path, options)
