"""Storage: the one way the package reads a checkpoint's files, local or remote.

`open_location(target)` turns a local path or a URL (`s3://`, `gs://`, `hf://`, `https://`)
into a `Location` in a `Storage` rooted at the checkpoint folder: `LocalStorage` enforces the
hostile-input rules in one place, `FsspecStorage` reads remote stores under the server guard
(`guard.py`). The promises: SECURITY.md, 3 and 3b.
"""

from __future__ import annotations

import os
from pathlib import Path

from inspector._internal.common.defaults import DEFAULT_READ_AHEAD
from inspector._internal.storage.base import (
    Entry,
    EntryKind,
    IOStats,
    Location,
    RangeReader,
    RemoteURL,
    Storage,
    TooLargeError,
    check_member,
    member_problem,
)
from inspector._internal.storage.local import (
    LocalFile,
    LocalStorage,
    hf_cache_snapshots,
)
from inspector._internal.storage.options import RemoteOptions
from inspector._internal.storage.urls import REMOTE_SCHEMES, is_remote, scheme_of
from inspector.errors import CannotInspectError, UnsafeFileError

__all__ = [
    "DEFAULT_READ_AHEAD",
    "Entry",
    "EntryKind",
    "IOStats",
    "LocalFile",
    "LocalStorage",
    "Location",
    "RangeReader",
    "RemoteOptions",
    "RemoteURL",
    "Storage",
    "TooLargeError",
    "UnsafeFileError",
    "check_member",
    "hf_cache_snapshots",
    "is_remote",
    "local_location",
    "member_problem",
    "open_location",
]


def open_location(
    target: str | os.PathLike[str] | Location, *, options: RemoteOptions | None = None
) -> Location:
    """The checkpoint `target` names: a local path (a folder or a file in it) or a URL.

    A local target is taken as the user named it (links in its own path are followed, it
    is their choice); inside it, the storage's rules apply. Raises `CannotInspectError`
    when nothing is there."""
    if isinstance(target, Location):
        return target
    scheme = scheme_of(target) if isinstance(target, str) else None
    if scheme in REMOTE_SCHEMES:
        # Only here: remote.py imports asyncio, ssl and the thread pools, which a local
        # checkpoint's command never needs.
        from inspector._internal.storage.remote import open_remote

        return open_remote(str(target), options)
    if scheme == "file":
        target = str(target)[len("file://") :]
    elif scheme is not None:
        raise CannotInspectError(
            f"{target}: unsupported URL scheme; expected a local path, s3://, gs://, hf:// "
            "or https://"
        )
    path = Path(target).expanduser()
    if not path.exists():
        raise CannotInspectError(f"{path}: no such file or folder")
    return local_location(path.resolve())


def local_location(path: str | os.PathLike[str]) -> Location:
    """A local folder as the root of its own storage, or a file in its folder's storage."""
    path = Path(path)
    if path.is_dir():
        return Location(LocalStorage(path))
    return Location(LocalStorage(path.parent)) / path.name
