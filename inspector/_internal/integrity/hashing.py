"""Content hashes of a checkpoint's files and tensors, in one streamed pass per file: each
block feeds the file's SHA-256 and the hash (`tensor_hasher`) of each tensor it holds;
memory is one block per worker. A DCP tensor is assembled from its chunks first, so its hash
is its consolidated output's. Blocks, parallelism and the split over torchrun ranks
(`execution.ranks`): docs/verify.md.
"""

from __future__ import annotations

import hashlib
import math
import os
import threading
from collections.abc import Collection, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from itertools import repeat
from typing import Any

import msgspec

from inspector._internal.checkpoint.loaded import any_loader_shards, loaded_shards, tensor_data
from inspector._internal.checkpoint.scanned import LayoutName, ScannedCheckpoint
from inspector._internal.common.dtypes import nbytes_for
from inspector._internal.common.filenames import BACKUP_DIR, JOURNAL, LOCK, MANIFEST_NAME, STAGING
from inspector._internal.execution.ranks import Distributed
from inspector._internal.formats.bin_shard import data_unread, strides_of
from inspector._internal.formats.tensordata import (
    blocks_digest,
    tensor_digest,
    tensor_hasher,
)
from inspector._internal.integrity.manifest import MAX_FILES, TensorRecord
from inspector._internal.storage import EntryKind, LocalFile, Storage
from inspector.errors import CannotInspectError, UnsafeFileError

__all__ = [
    "BLOCK",
    "FileDigest",
    "Listing",
    "Progress",
    "dcp_digests",
    "hash_files",
    "hashed_tensors",
    "list_files",
    "tensor_copies",
    "tensor_spans",
    "tensors_of",
    "unspanned_digests",
]

BLOCK = 8 << 20
_MAX_DEPTH = 32
# Folders and files that are not the checkpoint: ours (lock, journal, backups, staging, the
# manifest itself), a download's cache (`hf download --local-dir` keeps `.cache/huggingface`)
# and version control.
_SKIP_DIRS = frozenset({BACKUP_DIR, STAGING, ".cache", ".git"})
_SKIP_FILES = frozenset({LOCK, JOURNAL, MANIFEST_NAME})
# Files named like temp files (`.<name>.tmp-<pid>`) are listed like any other: an index may
# name one as a shard, which a loader then reads; a killed run's are `check`'s to report.


@dataclass(frozen=True, slots=True)
class Listing:
    """Files of a checkpoint folder (relative POSIX path -> size, None if the store did not
    say) and entries refused by the storage (path -> why). `sha256` and `blob_sha1` are what
    the store itself records for a file (the Hub's listing), never computed here."""

    files: Mapping[str, int | None]
    refused: Mapping[str, str] = field(default_factory=dict)
    sha256: Mapping[str, str] = field(default_factory=dict)
    blob_sha1: Mapping[str, str] = field(default_factory=dict)


def list_files(storage: Storage, *, keep: Collection[str] = ()) -> Listing:
    """Every file under the storage's root (listings only, no file is read), breadth first,
    at most `MAX_FILES` files and `_MAX_DEPTH` folders deep. `keep`: files a loader reads
    (the scan's shards), listed even where they sit among what is skipped (`.cache`, `.git`,
    our own names): an index may name any file, and its bytes must be compared."""
    files: dict[str, int | None] = {}
    refused: dict[str, str] = {}
    sha256: dict[str, str] = {}
    blob: dict[str, str] = {}
    todo: list[tuple[str, int]] = [("", 0)]
    while todo:
        folder, depth = todo.pop()
        for entry in storage.entries(folder):
            rel = f"{folder}/{entry.name}" if folder else entry.name
            if entry.kind is EntryKind.DIR:
                if entry.name in _SKIP_DIRS and not folder:
                    continue
                if depth + 1 >= _MAX_DEPTH:
                    raise CannotInspectError(
                        f"{storage.path}: folders nest more than {_MAX_DEPTH} levels deep "
                        f"(at {rel}); a checkpoint nests a few: check for a link loop"
                    )
                todo.append((rel, depth + 1))
                continue
            if entry.name in _SKIP_FILES and not folder:
                continue
            if entry.kind is EntryKind.REFUSED:
                refused[rel] = entry.reason or "is refused by the storage"
                continue
            size = entry.size
            if size is None:
                stat = storage.stat(rel)
                size = stat.size if stat is not None else None
            files[rel] = size
            if entry.sha256:
                sha256[rel] = entry.sha256
            if entry.blob_sha1:
                blob[rel] = entry.blob_sha1
            if len(files) > MAX_FILES:
                raise CannotInspectError(
                    f"{storage.path}: more than {MAX_FILES:,} files; a checkpoint holds fewer: "
                    "verify its model folder"
                )
    for rel in keep:
        if rel in files or rel in refused:
            continue
        found = storage.stat(rel)
        if found is not None and found.kind is EntryKind.REFUSED:
            refused[rel] = found.reason or "is refused by the storage"
        elif found is not None and found.kind is EntryKind.FILE:
            files[rel] = found.size
    return Listing(dict(sorted(files.items())), refused, sha256, blob)


# -- tensors ----------------------------------------------------------------------------------


def tensors_of(scanned: ScannedCheckpoint) -> dict[str, TensorRecord]:
    """Name -> dtype, shape and file of every logical tensor a loader gets (hash not yet
    known). For DCP the full tensor assembled from its chunks (its first chunk's file);
    otherwise the header entry of the copy transformers keeps (`checkpoint.loaded`: the
    last of the shards it reads, in the order it reads them, that holds the name)."""
    out: dict[str, TensorRecord] = {}
    dcp = scanned.dcp
    if dcp is not None:
        shapes = dcp.full_shapes
        for name, chunks in dcp.chunks.items():
            out[name] = TensorRecord(chunks[0].dtype, tuple(shapes[name]), chunks[0].file)
        return out
    for shard in loaded_shards(scanned):
        for name, dtype, shape in zip(shard.names, shard.dtypes, shard.shapes, strict=True):
            out[name] = TensorRecord(dtype, tuple(shape), shard.file)
    return out


def tensor_copies(scanned: ScannedCheckpoint) -> dict[str, list[TensorRecord]]:
    """Name -> every copy the shards some loader reads hold (`any_loader_shards`), the one
    transformers keeps last, for the names held by more than one of them (usually none: the
    dict is then empty). Which copy a loader keeps depends on the loader, so each is
    compared."""
    if scanned.dcp is not None:
        return {}
    shards = any_loader_shards(scanned)
    first: dict[str, int] = {}
    for i, shard in enumerate(shards):
        first.update(zip(shard.names, repeat(i)))
    if len(first) == sum(len(s.names) for s in shards):  # no name repeats: the usual case
        return {}
    copies: dict[str, list[TensorRecord]] = {}
    seen: dict[str, TensorRecord] = {}
    for shard in shards:
        for name, dtype, shape in zip(shard.names, shard.dtypes, shard.shapes, strict=True):
            record = TensorRecord(dtype, tuple(shape), shard.file)
            before = seen.setdefault(name, record)
            if before is not record:
                copies.setdefault(name, [before]).append(record)
    return copies


def tensor_spans(scanned: ScannedCheckpoint) -> dict[str, list[tuple[str, int, int]]]:
    """file -> (tensor, start, end) absolute byte ranges, sorted and non-overlapping, of the
    tensors whose bytes lie whole in one file, in the shards some loader reads
    (`any_loader_shards`; not DCP): every copy of a name several of them hold, each in its
    own file. Entries that overlap another
    or run past the file are left out (their hash stays unknown; `check` reports them), and
    so are strided `.bin` views, whose bytes are not one run (`unspanned_digests` hashes
    those)."""
    if scanned.dcp is not None:
        return {}
    out: dict[str, list[tuple[str, int, int]]] = {}
    for shard in any_loader_shards(scanned):
        spans: list[tuple[str, int, int]] = []
        base = shard.data_start
        strided = strides_of(shard)
        if data_unread(shard):  # no stored byte is what torch.load gives (`data_unread`)
            continue
        for name, b, e in zip(shard.names, shard.begins.tolist(), shard.ends.tolist(), strict=True):
            if name in strided or b > e or base + e > shard.file_size:
                continue
            spans.append((name, base + b, base + e))
        spans.sort(key=lambda s: (s[1], s[2]))
        kept: list[tuple[str, int, int]] = []
        end = 0
        for span in spans:
            if span[1] < end:  # overlaps the one before: neither is a tensor of its own
                if kept and kept[-1][2] > span[1]:
                    kept.pop()
                continue
            kept.append(span)
            end = span[2]
        out[shard.file] = kept
    return out


def dcp_digests(
    scanned: ScannedCheckpoint,
    records: Mapping[str, TensorRecord],
    *,
    ranks: Distributed | None = None,
) -> dict[str, str | None]:
    """Content hashes of the tensors `records` names, read one at a time (`TensorData`): DCP
    tensors assembled from their chunks, strided `.bin` views gathered from their storage
    (None: unreadable). With `ranks`, each tensor by one rank (shares balanced by the
    tensor's bytes), and every rank gets them all."""
    ranks = ranks or Distributed.alone()
    names = list(records)
    if ranks.world_size > 1:
        sized = [(n, nbytes_for(records[n].dtype, math.prod(records[n].shape)) or 0) for n in names]
        names = [name for name, _ in _agreed(ranks, sized)]
    out: dict[str, str | None] = {}
    with tensor_data(scanned) as data:
        for name in names:
            raw = data.tensor_bytes(name)
            out[name] = None if raw is None else tensor_digest(raw)
    if ranks.world_size == 1:
        return out
    gathered: dict[str, str | None] = {}
    for part in ranks.all_gather_bytes(msgspec.json.encode(out)):
        gathered.update(msgspec.json.decode(part, type=dict[str, str | None]))
    return gathered


def unspanned_digests(
    scanned: ScannedCheckpoint,
    digests: Mapping[str, Mapping[str, str | None]],
    *,
    ranks: Distributed | None = None,
) -> dict[str, dict[str, str | None]]:
    """`.bin` files only: file -> name -> the content hash span hashing could not give to a
    tensor of a shard some loader reads (`digests`: what it gave, by file), read entry by
    entry.
    A `torch.save` file legitimately holds strided views and several names on one storage
    (tied weights, slices of one buffer), whose byte ranges overlap; each is still one tensor
    with values of its own. (In a safetensors file overlapping entries are damage, and stay
    unhashed.) With `ranks`, each shard's missing entries are read by one rank."""
    if scanned.layout != LayoutName.PYTORCH_BIN:
        return {}
    ranks = ranks or Distributed.alone()
    shards = {s.file: s for s in any_loader_shards(scanned)}
    missing = {
        file: {n for n in s.names if digests.get(file, {}).get(n) is None}
        for file, s in shards.items()
    }
    jobs = [(file, int(shards[file].tensor_bytes)) for file, names in missing.items() if names]
    if ranks.world_size > 1:
        jobs = _agreed(ranks, jobs)
    out: dict[str, dict[str, str | None]] = {}
    with tensor_data(scanned) as data:
        for file, _ in jobs:
            shard, names = shards.get(file), missing.get(file, set())
            if shard is None:
                continue
            got: dict[str, str | None] = dict.fromkeys(names)
            for name, _dtype, _shape, blocks in data.shard_entries(shard):
                if name in names:
                    try:
                        got[name] = blocks_digest(blocks)
                    except OSError:
                        got[name] = None
            out[file] = got
    if ranks.world_size == 1:
        return out
    gathered: dict[str, dict[str, str | None]] = {}
    for part in ranks.all_gather_bytes(msgspec.json.encode(out)):
        gathered.update(msgspec.json.decode(part, type=dict[str, dict[str, str | None]]))
    return gathered


def hashed_tensors(
    scanned: ScannedCheckpoint,
    by_file: Mapping[str, Mapping[str, str | None]],
    *,
    ranks: Distributed | None = None,
) -> tuple[dict[str, TensorRecord], dict[str, list[TensorRecord]]]:
    """The tensors a loader gets (`tensors_of`), each with its content hash (None:
    unreadable), and every copy of the names several shards it reads hold
    (`tensor_copies`), each with its own. `by_file` is what span hashing gave (file -> name
    -> hash, `hash_files`); the `.bin` entries it could not give are read here
    (`unspanned_digests`), DCP tensors assembled from their chunks (`dcp_digests`)."""
    records = tensors_of(scanned)
    if scanned.dcp is not None:
        digests = dcp_digests(scanned, records, ranks=ranks)
        return {n: replace(r, hash=digests.get(n)) for n, r in records.items()}, {}
    merged = {file: dict(found) for file, found in by_file.items()}
    for file, found in unspanned_digests(scanned, merged, ranks=ranks).items():
        merged.setdefault(file, {}).update(found)

    def hashed(name: str, record: TensorRecord) -> TensorRecord:
        return replace(record, hash=merged.get(record.file, {}).get(name))

    copies = {n: [hashed(n, c) for c in cs] for n, cs in tensor_copies(scanned).items()}
    return {n: hashed(n, r) for n, r in records.items()}, copies


# -- files ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FileDigest:
    """What reading one file gave: its SHA-256 (when asked), the content hash of each of its
    tensors, the bytes read, or why it could not be read (`error`, `unsafe` for a refusal)."""

    file: str
    sha256: str | None = None
    blob_sha1: str | None = None
    tensors: Mapping[str, str] = field(default_factory=dict)
    read: int = 0
    error: str | None = None
    unsafe: bool = False


class Progress:
    """A byte progress bar shared by the workers (tqdm.auto; nothing when off)."""

    def __init__(self, total: int, desc: str, enabled: bool) -> None:
        self._bar: Any = None
        self._lock = threading.Lock()
        if enabled and total:
            from tqdm.auto import tqdm

            self._bar = tqdm(
                total=total, desc=desc, unit="B", unit_scale=True, leave=False, dynamic_ncols=True
            )

    def update(self, n: int) -> None:
        if self._bar is not None:
            with self._lock:
                self._bar.update(n)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def hash_files(
    storage: Storage,
    jobs: Sequence[tuple[str, int]],
    *,
    sha256: bool,
    spans: Mapping[str, Sequence[tuple[str, int, int]]] | None = None,
    blob_sha1: frozenset[str] = frozenset(),
    workers: int | None = None,
    progress: bool = False,
    desc: str = "hashing",
    ranks: Distributed | None = None,
) -> dict[str, FileDigest]:
    """Read each (file, size) of `jobs` once: its SHA-256 when `sha256`, the git blob SHA-1
    for the files in `blob_sha1` (what the Hub records for files kept in git), and the
    content hash of the tensors `spans` places in it. Files in parallel, largest first.
    With `ranks`, each file is read by one rank (shares balanced by bytes) and every rank
    gets every file's digest."""
    ranks = ranks or Distributed.alone()
    if ranks.world_size > 1:
        jobs = _agreed(ranks, jobs)
        progress = progress and ranks.lead
    spans = spans or {}
    if workers is None:
        workers = (os.cpu_count() or 1) if storage.is_local else 16
    order = sorted(jobs, key=lambda j: -j[1])
    bar = Progress(sum(size for _, size in order), desc, progress)

    def one(job: tuple[str, int]) -> FileDigest:
        rel, size = job
        return _hash_one(
            storage,
            rel,
            size,
            sha256=sha256,
            blob=rel in blob_sha1,
            spans=spans.get(rel, ()),
            bar=bar,
        )

    try:
        if workers <= 1 or len(order) <= 1:
            results = [one(j) for j in order]
        else:
            with ThreadPoolExecutor(max_workers=min(workers, len(order))) as pool:
                results = list(pool.map(one, order))
    finally:
        bar.close()
    if ranks.world_size == 1:
        return {r.file: r for r in results}
    out: dict[str, FileDigest] = {}
    for part in ranks.all_gather_bytes(msgspec.json.encode(results)):
        for digest in msgspec.json.decode(part, type=list[FileDigest]):
            out[digest.file] = digest
    return out


def _agreed(ranks: Distributed, items: Sequence[tuple[str, int]]) -> list[tuple[str, int]]:
    """This rank's share of rank 0's `items` (what to read, with its bytes): rank 0's list is
    the one split, so an item two ranks listed differently (a file written meanwhile) is
    still read by exactly one rank. Ranks exchange JSON, never pickles."""
    theirs = ranks.broadcast_bytes(msgspec.json.encode(list(items)) if ranks.lead else b"")
    return ranks.share(msgspec.json.decode(theirs, type=list[tuple[str, int]]))


def _hash_one(
    storage: Storage,
    rel: str,
    size: int,
    *,
    sha256: bool,
    blob: bool,
    spans: Sequence[tuple[str, int, int]],
    bar: Progress,
) -> FileDigest:
    sha = hashlib.sha256() if sha256 else None
    git = hashlib.sha1(b"blob %d\x00" % size, usedforsecurity=False) if blob else None
    feed = _TensorFeed(spans)
    read = 0
    try:
        for block in _blocks(storage, rel, size):
            if sha is not None:
                sha.update(block)
            if git is not None:
                git.update(block)
            feed.update(read, block)
            read += len(block)
            bar.update(len(block))
    except UnsafeFileError as exc:
        return FileDigest(rel, read=read, error=exc.reason, unsafe=True)
    except OSError as exc:
        return FileDigest(rel, read=read, error=f"cannot be read ({exc.strerror or exc})")
    if read != size:
        return FileDigest(rel, read=read, error=f"ended after {read:,} of {size:,} bytes")
    return FileDigest(
        rel,
        sha256=sha.hexdigest() if sha is not None else None,
        blob_sha1=git.hexdigest() if git is not None else None,
        tensors=feed.finish(size),
        read=read,
    )


def _blocks(storage: Storage, rel: str, size: int) -> Iterator[memoryview]:
    """The file's bytes in blocks of `BLOCK`, up to `size` (a file that grew is read to the
    size it was listed with; one that shrank ends early)."""
    with storage.open(rel) as reader:
        if isinstance(reader, LocalFile):
            buf = bytearray(min(BLOCK, max(size, 1)))
            view = memoryview(buf)
            fd = reader.fileno()
            at = 0
            while at < size:
                n = os.preadv(fd, [view[: min(BLOCK, size - at)]], at)
                if n == 0:
                    return
                yield view[:n]
                at += n
            return
        at = 0
        while at < size:
            data = reader.read_range(at, min(BLOCK, size - at))
            if not data:
                return
            yield memoryview(data)
            at += len(data)


class _TensorFeed:
    """Feeds each block's bytes to the hashes of the tensors they belong to. Spans are sorted
    and disjoint, so one tensor is open at a time: linear in the file's size."""

    def __init__(self, spans: Sequence[tuple[str, int, int]]) -> None:
        self._spans = spans
        self._next = 0
        self._open: tuple[str, int, Any] | None = None
        self.done: dict[str, str] = {}

    def update(self, pos: int, block: memoryview) -> None:
        end = pos + len(block)
        at = pos
        while True:
            if self._open is not None:
                name, stop, h = self._open
                take = min(stop, end)
                if take > at:
                    h.update(block[at - pos : take - pos])
                    at = take
                if take < stop:
                    return
                self.done[name] = h.hexdigest()
                self._open = None
            if self._next >= len(self._spans) or self._spans[self._next][1] >= end:
                return
            name, start, stop = self._spans[self._next]
            self._next += 1
            at = max(at, start)
            self._open = (name, stop, tensor_hasher())

    def finish(self, size: int) -> dict[str, str]:
        """Hashes of every tensor read whole (empty tensors at the very end included)."""
        while self._next < len(self._spans) and self._spans[self._next][1] >= size:
            name, start, stop = self._spans[self._next]
            self._next += 1
            if start == stop == size:
                self.done[name] = tensor_hasher().hexdigest()
        return self.done
