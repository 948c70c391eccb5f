"""Keeping a content manifest true after checkpoint-inspector rewrites files (repair,
re-sharding, restore from a reference, consolidation).

Only the files a write changed are hashed again; every other file keeps its recorded entry.
A tensor keeps the content hash the manifest recorded before the write whenever its name,
dtype and shape are unchanged: re-sharding, rebuilding an index or consolidating never
change a tensor's values, so the refreshed manifest still says what the values were, and
`verify --level tensor` catches a tensor whose bytes changed on the way. Tensors that are
new (restored from a reference) are hashed from what was written.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from inspector._internal.common.display import legible
from inspector._internal.common.filenames import MANIFEST_NAME
from inspector._internal.execution.atomic import write_atomic
from inspector._internal.integrity.hashing import hash_files, list_files, tensor_spans, tensors_of
from inspector._internal.integrity.manifest import (
    MANIFEST_CAP,
    FileRecord,
    Manifest,
    ManifestError,
    TensorRecord,
    manifest_bytes,
    parse_manifest,
)
from inspector._internal.scan.entry import scan
from inspector._internal.storage import LocalStorage, Storage, TooLargeError
from inspector.errors import CannotInspectError, UnsafeFileError

__all__ = ["read_kept_manifest", "refresh_manifest", "source_manifest"]


def read_kept_manifest(folder: Path) -> Manifest | None:
    """The manifest kept in `folder`, or None (absent, or not one we can use: then it is
    left as it is, and `verify` reports it)."""
    return source_manifest(LocalStorage(folder))


def source_manifest(storage: Storage) -> Manifest | None:
    """The manifest kept at the root of `storage` (local or remote), or None."""
    try:
        return parse_manifest(storage.read_bytes(MANIFEST_NAME, cap=MANIFEST_CAP))
    except (OSError, ValueError, TooLargeError, ManifestError, UnsafeFileError):
        return None


def refresh_manifest(
    folder: Path, *, written: Iterable[str], previous: Manifest | None = None, created: str = ""
) -> Path | None:
    """Bring `folder`'s manifest up to date after `written` files were rewritten; `previous`
    is the manifest to start from (default: the one kept in the folder; a consolidation
    passes its source's). Returns the manifest's path, or None when there was none."""
    old = previous if previous is not None else read_kept_manifest(folder)
    if old is None:
        return None
    storage = LocalStorage(folder)
    listing = list_files(storage)
    changed = set(written)
    # Only what this write produced is hashed again: a file that changed otherwise (damaged,
    # truncated) keeps its recorded entry, so that `verify` still reports it.
    stale = {rel for rel in listing.files if rel in changed or rel not in old.files}
    scanned = scan(folder)
    records = tensors_of(scanned)
    spans = {f: s for f, s in tensor_spans(scanned).items() if f in stale}
    jobs = [(rel, int(listing.files[rel] or 0)) for rel in sorted(stale)]
    done = hash_files(storage, jobs, sha256=True, spans=spans)
    for d in done.values():
        if d.error is not None or d.sha256 is None:  # a manifest never records a file unhashed
            raise CannotInspectError(
                f"{folder}/{legible(d.file)} {d.error or 'was not hashed'}; the manifest was "
                f"not refreshed: write it again with `ckpt-inspect manifest {folder}`"
            )
    files = {
        rel: FileRecord(int(size or 0), done[rel].sha256) if rel in stale else old.files[rel]
        for rel, size in listing.files.items()
    }
    # By file: a name several shards hold has one hash per copy, and the record is the copy
    # a loader gets (`tensors_of`).
    fresh = {rel: d.tensors for rel, d in done.items()}
    tensors: dict[str, TensorRecord] = {}
    for name, r in records.items():
        if r.file not in files:
            continue
        before = old.tensors.get(name)
        if before is not None and (before.dtype, before.shape) == (r.dtype, r.shape):
            digest = before.hash
        elif r.file in stale:
            digest = fresh.get(r.file, {}).get(name)
        else:
            digest = None
        tensors[name] = TensorRecord(r.dtype, r.shape, r.file, digest)
    manifest = Manifest(files, tensors, created=created or old.created, tool=old.tool)
    dest = folder / MANIFEST_NAME
    write_atomic(dest, manifest_bytes(manifest))
    return dest
