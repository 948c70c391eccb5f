"""The "verified" line of the dashboard's Overview, the HTML report and the Markdown summary:
what was verified, against what, when, or how to verify.

`verify` records each result here (per checkpoint path, in this process); the line shows
the latest one. Without one, it says whether the folder keeps a content manifest and which
command compares the bytes with it. Nothing here reads a file: the manifest's presence comes
from the storage's listing.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Protocol

from inspector._internal.common.display import legible
from inspector._internal.common.filenames import MANIFEST_NAME
from inspector._internal.storage import EntryKind

if TYPE_CHECKING:
    from inspector._internal.checkpoint.scanned import ScannedCheckpoint

__all__ = ["record_verification", "verification_line"]


class _Result(Protocol):
    @property
    def path(self) -> str: ...

    def line(self) -> str: ...


_LATEST: dict[str, _Result] = {}
_LOCK = threading.Lock()


def record_verification(result: _Result) -> None:
    """Keep `result` as the latest verification of its checkpoint (this process only)."""
    with _LOCK:
        _LATEST[result.path] = result


def verification_line(scanned: ScannedCheckpoint) -> str:
    """One line: the latest verification of this checkpoint, or how to get one."""
    path = str(scanned.path)
    with _LOCK:
        latest = _LATEST.get(path)
    if latest is not None:
        return latest.line()
    shown = legible(path, limit=200)
    try:
        entry = scanned.location.storage.stat(MANIFEST_NAME) if not scanned.location.rel else None
    except (OSError, ValueError):
        entry = None
    if entry is not None and entry.kind is EntryKind.FILE:
        return (
            f"not verified yet: the folder keeps {MANIFEST_NAME}; `ckpt-inspect verify {shown}` "
            "compares every file's bytes with it"
        )
    return (
        f"not verified: no {MANIFEST_NAME}; `ckpt-inspect manifest {shown}` records one, "
        f"`ckpt-inspect verify {shown} --against SOURCE` compares with a manifest, hf://org/repo "
        "or another copy"
    )
