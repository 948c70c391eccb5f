"""`scan(path)`: find the layout, read every header and JSON file, return the scanned model."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from inspector._internal.checkpoint.scanned import ScannedCheckpoint
from inspector._internal.common.defaults import (
    DEFAULT_CONCURRENCY,
    DEFAULT_READ_AHEAD,
    DEFAULT_READ_TIMEOUT,
    DEFAULT_TIMEOUT,
)
from inspector._internal.common.gc import gc_paused
from inspector._internal.common.progress import reporting
from inspector._internal.formats.safetensors import DEFAULT_HEADER_CAP
from inspector._internal.layouts.base import ScanOptions
from inspector._internal.scan.registry import detect_layout, layout_by_name
from inspector._internal.storage import Location, RemoteOptions, open_location
from inspector.errors import CannotInspectError

__all__ = ["scan", "scan_once"]


def scan(
    path: str | os.PathLike[str] | Location,
    *,
    header_cap: int = DEFAULT_HEADER_CAP,
    layout: str | None = None,
    storage_options: Mapping[str, Any] | None = None,
    max_concurrency: int = DEFAULT_CONCURRENCY,
    read_ahead: int = DEFAULT_READ_AHEAD,
    progress: bool | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    read_timeout: float = DEFAULT_READ_TIMEOUT,
    allow_redirects: Sequence[str] = (),
) -> ScannedCheckpoint:
    """Scan a checkpoint folder or a single `.safetensors` file, reading headers only.

    `path` is a local path or a URL: `s3://bucket/prefix`, `gs://bucket/prefix`,
    `hf://org/repo[@revision][/subfolder]`, `https://host/folder/` (remote reads need
    `pip install 'checkpoint-inspector[remote]'`). For remote checkpoints,
    `storage_options` go to the fsspec file system (`endpoint_url`, `anon`, `profile`,
    `token`...), at most `max_concurrency` requests are in flight, each shard header costs
    one ranged read of `read_ahead` bytes (a second only for a longer header), and
    `progress` shows a bar (None: on a terminal or in a notebook, for scans that last).
    Servers are not trusted: a request (a listing, a read of up to 8 MiB) may take at most
    `timeout` seconds with its retries, a connection may bring no byte for at most
    `read_timeout` seconds, and redirects are followed within the origin a request went to
    and to the `allow_redirects` origins only (SECURITY.md).

    What cannot be read is recorded in the result (`.read_problems`, shown as findings in
    `.read_findings`); only a path that cannot be inspected at all raises `CannotInspectError`
    (`RemoteAccessError` when a store refuses us). `layout` forces a layout by name.
    `progress` draws a progress bar over the shard headers (`tqdm.auto`); remotely, over
    the fetches too (None: there, on a terminal or in a notebook, for scans that last).
    """
    remote = RemoteOptions(
        storage_options=dict(storage_options or {}),
        max_concurrency=max_concurrency,
        read_ahead=read_ahead,
        progress=progress,
        timeout=timeout,
        read_timeout=read_timeout,
        allow_redirects=tuple(allow_redirects),
    )
    return _scan(path, layout, ScanOptions(header_cap=header_cap), remote)


def scan_once(
    path: str | os.PathLike[str] | Location,
    *,
    header_cap: int = DEFAULT_HEADER_CAP,
    layout: str | None = None,
    remote: RemoteOptions | None = None,
) -> ScannedCheckpoint:
    """`scan` for a result read once and dropped, as `ckpt-inspect scan` prints its summary
    and ends: the same result, read without giving the index the shards' strings for its
    names (`ScanOptions.share_names`: CPU spent to save memory over a scan's lifetime)."""
    options = ScanOptions(header_cap=header_cap, share_names=False)
    return _scan(path, layout, options, remote or RemoteOptions())


def _scan(
    path: str | os.PathLike[str] | Location,
    layout: str | None,
    options: ScanOptions,
    remote: RemoteOptions,
) -> ScannedCheckpoint:
    target = open_location(path, options=remote)
    reader = layout_by_name(layout) if layout else detect_layout(target)
    if reader is None:
        raise CannotInspectError(
            f"{target}: no checkpoint found (expected .safetensors files, "
            "model.safetensors.index.json, or a torch_dist folder with .metadata)"
        )
    with gc_paused(), reporting(bool(remote.progress)):
        return reader.scan(target, options=options)
