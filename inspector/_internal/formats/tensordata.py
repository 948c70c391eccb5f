"""Reading tensor data, only when a user asks for it (`--deep`, `diff --data`, tensor hashes,
consolidation's verification).

Files are opened through the checkpoint's storage (the scan's rules apply). This module sees
the storage and the header columns only, never the scanned checkpoint: which copy of a name
is "the" tensor is decided above it (`checkpoint.loaded.tensor_data` builds a `TensorData`).
Streamed in bounded blocks, never memory-mapped: docs/architecture.md, "formats/".
"""

from __future__ import annotations

import errno
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import NamedTuple, Protocol

import numpy as np
import xxhash

from inspector._internal.common.dtypes import DTYPE_BITS
from inspector._internal.formats.bin_shard import data_unread, strides_of
from inspector._internal.formats.safetensors import ShardHeader
from inspector._internal.storage import LocalFile, Storage
from inspector.errors import FileShrankError, UnsafeFileError

# The tuple `TensorData.shard_entries` yields: name, dtype, shape, the entry's bytes in blocks.
Entry = tuple[str, str, tuple[int, ...], Iterator[memoryview]]

__all__ = [
    "TENSOR_HASH",
    "Chunk",
    "Entry",
    "TensorData",
    "blocks_digest",
    "gather_view",
    "read_view",
    "strided_view",
    "tensor_digest",
    "tensor_hasher",
    "view_runs",
    "view_span",
]

_HASH_BLOCK = 64 << 20
# The project's one content hash of a tensor's row-major bytes (docs/verify.md says why):
# the manifest records it, `verify --level tensor`, `consolidate --verify-data`, `repair
# --from --verify-data`, `diff --data` and `check --deep` compare it.
TENSOR_HASH = "xxh3-128"


def tensor_hasher() -> xxhash.xxh3_128:
    """A fresh `TENSOR_HASH`, for bytes that arrive in pieces (a file streamed in blocks)."""
    return xxhash.xxh3_128()


def tensor_digest(view: memoryview | bytes | np.ndarray) -> str:
    """`TENSOR_HASH` of a whole buffer, fed in blocks so huge tensors never need a copy."""
    mv = (view.data if isinstance(view, np.ndarray) else memoryview(view)).cast("B")
    h = tensor_hasher()
    for start in range(0, len(mv), _HASH_BLOCK):
        h.update(mv[start : start + _HASH_BLOCK])
    return h.hexdigest()


def blocks_digest(blocks: Iterable[memoryview | bytes | np.ndarray]) -> str:
    """`TENSOR_HASH` of bytes that arrive in blocks (the same digest as of the whole)."""
    h = tensor_hasher()
    for block in blocks:
        h.update(block.data if isinstance(block, np.ndarray) else block)
    return h.hexdigest()


# A local tensor is streamed in blocks of this many bytes (a multiple of every element size):
# a block read into a buffer that stays in the CPU's cache is then checked or hashed there,
# about as fast as the same work on the page cache through a memory map (16 MiB: 2x slower).
_BLOCK = 1 << 20
# A remote strided view is fetched as the byte runs that hold its elements, runs closer than
# this merged into one request; past `_MAX_RUNS` requests its whole span is read instead.
_RUN_GAP = 64 << 10
_MAX_RUNS = 4096


def view_span(shape: Sequence[int], strides: Sequence[int]) -> int:
    """Elements of the storage a view touches from its first one (0 when it is empty)."""
    if 0 in shape:
        return 0
    return 1 + sum((n - 1) * s for n, s in zip(shape, strides, strict=True))


def gather_view(
    raw: np.ndarray, shape: Sequence[int], strides: Sequence[int], item: int
) -> np.ndarray:
    """The view's elements in row-major order, as bytes: `raw` holds the storage from the
    view's first element on (at least its span), `strides` are in elements of `item` bytes.
    A byte axis last, so any dtype (complex, float8, bool) is copied bit for bit."""
    return np.ascontiguousarray(strided_view(raw, shape, strides, item)).reshape(-1)


def strided_view(
    raw: np.ndarray, shape: Sequence[int], strides: Sequence[int], item: int
) -> np.ndarray:
    """A read-only numpy view of the view's elements in `raw` (bytes from its first element
    on), shaped `(*shape, item)`: nothing is copied."""
    return np.lib.stride_tricks.as_strided(
        raw,
        shape=(*shape, item),
        strides=(*(s * item for s in strides), 1),
        writeable=False,
    )


def view_runs(
    shape: Sequence[int], strides: Sequence[int], item: int, *, gap: int = _RUN_GAP
) -> list[tuple[int, int]] | None:
    """Sorted, merged byte ranges [start, end) relative to the view's first element that hold
    every element of the view (innermost contiguous dims make one run; runs less than `gap`
    apart are merged), or None when that would take more than `_MAX_RUNS` ranges."""
    if 0 in shape:
        return []
    dims = [(n, s) for n, s in zip(shape, strides, strict=True) if n != 1]
    run = item
    while dims and dims[-1][1] * item == run:
        run *= dims.pop()[0]
    if np.prod([n for n, _ in dims], dtype=np.float64) > 64 * _MAX_RUNS:
        return None
    starts = np.zeros(1, dtype=np.int64)
    for n, s in dims:
        starts = (starts[:, None] + np.arange(n, dtype=np.int64)[None, :] * (s * item)).ravel()
    starts = np.unique(starts)
    ends = starts + run
    reach = np.maximum.accumulate(ends)
    new = np.ones(len(starts), dtype=bool)
    new[1:] = starts[1:] > reach[:-1] + gap
    firsts = np.flatnonzero(new)
    if len(firsts) > _MAX_RUNS:
        return None
    lasts = np.append(firsts[1:], len(starts)) - 1
    return list(zip(starts[firsts].tolist(), reach[lasts].tolist(), strict=True))


class Chunk(Protocol):
    """One stored chunk of a DCP tensor, as this module reads it (`checkpoint.scanned.DcpChunk`)."""

    @property
    def file(self) -> str: ...
    @property
    def offsets(self) -> tuple[int, ...]: ...
    @property
    def shape(self) -> tuple[int, ...]: ...
    @property
    def dtype(self) -> str: ...


class TensorData(AbstractContextManager["TensorData"]):
    """Byte access to the tensors of a checkpoint's files. Use as a context manager.

    `storage` opens the files, `shards` are their headers; a DCP tensor is assembled from
    `chunks` (name -> its chunks) into `full_shapes`; `where` gives, by name, the shard and
    row of the copy a loader keeps (called once, when a tensor is first asked for by name).

    Reads raise nothing: a tensor that cannot be read is None (`tensor_bytes`,
    `tensor_hash`), except the blocks of `shard_entries` and `tensor_blocks`, which raise
    `OSError` when a read fails or comes back short (`FileShrankError`: the file got shorter
    since it was opened), for callers that report why."""

    def __init__(
        self,
        storage: Storage,
        shards: Sequence[ShardHeader],
        *,
        where: Callable[[], Mapping[str, tuple[ShardHeader, int]]],
        chunks: Mapping[str, Sequence[Chunk]] | None = None,
        full_shapes: Mapping[str, tuple[int, ...]] | None = None,
    ) -> None:
        self.storage = storage
        self._shards = {shard.file: shard for shard in shards}
        self.chunks = chunks or {}
        self._full_shapes = full_shapes or {}
        self._find = where
        self._sources: dict[str, _Source | None] = {}
        self._problems: dict[str, str] = {}
        # Where each tensor is (`where`), built when a tensor is first asked for by name
        # (reading whole shards does not need it).
        self._where: Mapping[str, tuple[ShardHeader, int]] | None = None
        # Reused by every read (fresh buffers would cost their page faults each time).
        self._buffers: dict[tuple[str, int], memoryview] = {}

    # -- raw entries of one shard -------------------------------------------------------

    def shard_entries(self, shard: ShardHeader) -> Iterator[Entry]:
        """(name, dtype, shape, blocks) of every entry of `shard` whose bytes lie inside the
        file as it was opened (`size`), in file order: `blocks` reads the entry's row-major
        bytes when iterated (before the next entry is asked for), block by block, each valid
        until the next is read, and raises `OSError` when a read fails or comes back short.
        Entries smaller than a block are read many at a time (one read of the file per
        block's worth of them)."""
        source = None if data_unread(shard) else self._source(shard.file)
        if source is None:
            return
        strided = strides_of(shard)
        names, dtypes, shapes = shard.names, shard.dtypes, shard.shapes
        order = np.argsort(shard.begins, kind="stable")
        starts = shard.begins[order] + shard.data_start
        ends = shard.ends[order] + shard.data_start
        small = (starts <= ends) & (ends - starts <= source.block) & (ends <= source.size)
        if strided:
            small &= ~np.isin(np.asarray(names, dtype=object)[order], list(strided))
        window = _Window(source, self._buffer("window", source.block), starts[small], ends[small])
        for row, start, end, few in zip(
            order.tolist(), starts.tolist(), ends.tolist(), small.tolist(), strict=True
        ):
            name = names[row]
            if few:
                yield name, dtypes[row], shapes[row], window.entry(start, end)
            elif name in strided:
                found = _strided(source, start, end - start, shapes[row], strided[name])
                if found is not None:
                    yield name, dtypes[row], shapes[row], iter(found)
            elif end <= source.size:
                buffer = self._buffer("blocks", source.block)
                yield name, dtypes[row], shapes[row], source.blocks(start, end, buffer)

    def size(self, file: str) -> int | None:
        """`file`'s size when it was opened for reading, or None when it cannot be read."""
        source = self._source(file)
        return None if source is None else source.size

    # -- logical tensors ----------------------------------------------------------------

    def tensor_blocks(self, name: str) -> Iterable[memoryview] | None:
        """Row-major bytes of the full logical tensor in blocks (a safetensors tensor
        streamed, block after block, each valid until the next is read; a DCP tensor
        assembled from its chunks and a strided view gathered, whole), or None when it is
        not found or lies outside its file. Iterating raises `OSError` when a read fails or
        comes back short."""
        found = self._locate(name)
        if isinstance(found, _Run):
            buffer = self._buffer("blocks", found.source.block)
            return found.source.blocks(found.start, found.end, buffer)
        return found

    def tensor_bytes(self, name: str) -> memoryview | None:
        """Row-major bytes of the full logical tensor in one buffer, or None if it cannot be
        read. The buffer holds the whole tensor: `tensor_hash` streams instead."""
        found = self._locate(name)
        try:
            if isinstance(found, _Run):
                out = np.empty(found.end - found.start, dtype=np.uint8)
                found.source.read_into(out.data, found.start)
                return out.data
            parts = None if found is None else list(found)
        except OSError:
            return None
        if parts is None:
            return None
        return parts[0] if len(parts) == 1 else memoryview(b"".join(parts))

    def _locate(self, name: str) -> _Run | Iterable[memoryview] | None:
        """Where the tensor's bytes are: one run of a file, or (DCP, strided views) its bytes
        to be assembled or gathered; None when it is not found or lies outside its file. Of
        a name several shards hold, the copy a loader keeps (`where`)."""
        if name in self.chunks:
            whole = self._assemble(name, self.chunks[name], self._full_shapes[name])
            return None if whole is None else (whole,)
        if self._where is None:
            self._where = self._find()
        where = self._where.get(name)
        if where is None:
            return None
        shard, i = where
        source = None if data_unread(shard) else self._source(shard.file)
        if source is None:
            return None
        start = shard.data_start + int(shard.begins[i])
        end = shard.data_start + int(shard.ends[i])
        strides = strides_of(shard).get(name)
        if strides is not None:  # a strided view saved by torch.save: gathered
            return _strided(source, start, end - start, shard.shapes[i], strides)
        return _Run(source, start, end) if end <= source.size else None

    def tensor_hash(self, name: str) -> str | None:
        """`TENSOR_HASH` of the tensor's row-major bytes, streamed (None: cannot be read)."""
        blocks = self.tensor_blocks(name)
        if blocks is None:
            return None
        try:
            return blocks_digest(blocks)
        except OSError:
            return None

    def _assemble(
        self, name: str, chunks: Sequence[Chunk], shape: tuple[int, ...]
    ) -> memoryview | None:
        bits = DTYPE_BITS.get(chunks[0].dtype)
        if bits is None or bits % 8:
            return None  # sub-byte dtypes cannot be placed element-wise
        item = bits // 8
        full = np.zeros((*shape, item), dtype=np.uint8)
        for chunk in chunks:
            shard = self._shards.get(chunk.file)
            idx = shard.names.index(name) if shard is not None and name in shard.names else -1
            source = self._source(chunk.file) if idx >= 0 else None
            if source is None or shard is None:
                return None
            start = shard.data_start + int(shard.begins[idx])
            end = shard.data_start + int(shard.ends[idx])
            if end > source.size or end - start != item * int(np.prod(chunk.shape, dtype=np.int64)):
                return None
            src = np.empty(end - start, dtype=np.uint8)
            try:
                source.read_into(src.data, start)
            except OSError:
                return None
            where = tuple(slice(o, o + n) for o, n in zip(chunk.offsets, chunk.shape, strict=True))
            full[where] = src.reshape(*chunk.shape, item)
        return full.reshape(-1).data

    # -- files ----------------------------------------------------------------------------

    def problem(self, file: str) -> str | None:
        """Why `file`'s bytes cannot be read at all (it cannot be opened), or None."""
        self._source(file)
        return self._problems.get(file)

    def _source(self, file: str) -> _Source | None:
        if file not in self._sources:
            source = _open_source(self.storage, file)
            if isinstance(source, str):
                self._problems[file] = source
                source = None
            self._sources[file] = source
        return self._sources[file]

    def _buffer(self, kind: str, size: int) -> memoryview:
        """The reused buffer `kind` ("window": small entries read many at a time, "blocks":
        a larger tensor's blocks) of `size` bytes, made on first use."""
        key = (kind, size)
        if key not in self._buffers:
            self._buffers[key] = np.empty(size, dtype=np.uint8).data
        return self._buffers[key]

    def close(self) -> None:
        for source in self._sources.values():
            if source is not None:
                source.close()
        self._sources.clear()
        self._buffers.clear()

    def __exit__(self, *exc: object) -> None:
        self.close()


def _strided(
    source: _Source, start: int, nbytes: int, shape: Sequence[int], strides: Sequence[int]
) -> Iterable[memoryview] | None:
    """The row-major bytes of the strided view whose first element is at `start` and whose
    elements take `nbytes`, gathered when iterated (one block); None when its span runs past
    the file or its sizes disagree."""
    numel = int(np.prod(shape, dtype=np.int64))
    if numel == 0:
        return (memoryview(b""),)
    item = nbytes // numel
    span = view_span(shape, strides) * item
    if item <= 0 or nbytes != numel * item or start + span > source.size:
        return None
    runs = view_runs(shape, strides, item)

    def gathered() -> Iterator[memoryview]:
        raw = source.span(start, span, runs)
        yield gather_view(raw, shape, strides, item).data

    return gathered()


class _Run(NamedTuple):
    """Bytes [start, end) of one file."""

    source: _Source
    start: int
    end: int


class _Source:
    """Bytes of one file: `size` (when it was opened), `read_into(buffer, offset)` (exactly
    `len(buffer)` bytes, else `OSError`) and what is built on it; `block`, the bytes it is
    best read in."""

    size = 0
    block = _BLOCK

    def read_into(self, buffer: memoryview, offset: int) -> None:
        raise NotImplementedError

    def blocks(self, start: int, end: int, buffer: memoryview) -> Iterator[memoryview]:
        """Bytes [start, end) in blocks of at most `len(buffer)` bytes, read into `buffer`
        when iterated: a block is valid until the next one is read."""
        for at in range(start, end, len(buffer)):
            block = buffer[: min(len(buffer), end - at)]
            self.read_into(block, at)
            yield block

    def span(self, start: int, length: int, runs: list[tuple[int, int]] | None) -> np.ndarray:
        """`length` bytes from `start` as a byte array where at least the bytes of `runs`
        (relative ranges; None: all of them) are the file's; zeros elsewhere (those pages
        are never touched, so never allocated)."""
        out = np.zeros(length, dtype=np.uint8)
        for lo, hi in [(0, length)] if runs is None else runs:
            self.read_into(out.data[lo:hi], start + lo)
        return out

    def close(self) -> None:
        pass


class _Window:
    """A block of one file read once for the small entries inside it (`starts`, `ends`: all
    of them, in file order; most are in the block read for an earlier one). A read covers
    the small entries that fit in the buffer from where it starts, no further (not the
    first bytes of a large entry after them, read on its own). A read that comes back short
    keeps what it brought: the entries inside that part are still served."""

    def __init__(
        self, source: _Source, buffer: memoryview, starts: np.ndarray, ends: np.ndarray
    ) -> None:
        self.source, self.buffer = source, buffer
        self.starts, self.ends = starts, ends
        self.start = self.got = 0
        self.error: OSError | None = None

    def entry(self, start: int, end: int) -> Iterator[memoryview]:
        """Bytes [start, end) (at most a block), read when iterated; `OSError` when the
        file could not be read that far."""
        if not (self.start <= start and end <= self.start + self.got):
            self._load(start)
        if end > self.start + self.got:
            assert self.error is not None  # a load stops short only on an error
            raise self.error
        yield self.buffer[start - self.start : end - self.start]

    def _load(self, start: int) -> None:
        limit = start + len(self.buffer)
        lo, hi = np.searchsorted(self.starts, [start, limit], side="left").tolist()
        within = self.ends[lo:hi]
        n = int(within[within <= limit].max()) - start  # the entry asked for is among them
        self.start, self.got, self.error = start, 0, None
        try:
            self.source.read_into(self.buffer[:n], start)
            self.got = n
        except FileShrankError as exc:  # the bytes before where it ended were read
            self.got, self.error = max(0, exc.at - start), exc
        except OSError as exc:
            self.error = exc


class _Local(_Source):
    """A local file, read with `preadv` through its open descriptor."""

    def __init__(self, reader: LocalFile) -> None:
        self.reader = reader
        self.size = reader.size()

    def read_into(self, buffer: memoryview, offset: int) -> None:
        self.reader.read_into(buffer, offset)

    def close(self) -> None:
        self.reader.close()


_REMOTE_BLOCK = 8 << 20


class _Ranged(_Source):
    """A remote file, read by ranges: a block is fetched as several ranged reads in flight
    at once."""

    block = 8 * _REMOTE_BLOCK

    def __init__(self, storage: Storage, file: str, size: int) -> None:
        self.storage, self.file, self.size = storage, file, size

    def read_into(self, buffer: memoryview, offset: int) -> None:
        end = offset + len(buffer)
        ranges = [
            (self.file, at, min(_REMOTE_BLOCK, end - at))
            for at in range(offset, end, _REMOTE_BLOCK)
        ]
        try:
            datas = self.storage.read_ranges(ranges)
        except UnsafeFileError as exc:
            raise OSError(errno.EACCES, f"it {exc.reason}", self.file) from None
        for (_, at, n), data in zip(ranges, datas, strict=True):
            if len(data) != n:
                raise OSError(errno.EIO, _short(at, len(data), n), self.file)
            buffer[at - offset : at - offset + n] = data

    def span(self, start: int, length: int, runs: list[tuple[int, int]] | None) -> np.ndarray:
        if runs is None:
            return super().span(start, length, runs)
        try:
            raw = read_runs(self.storage, self.file, start, length, runs)
        except UnsafeFileError as exc:
            raise OSError(errno.EACCES, f"it {exc.reason}", self.file) from None
        if raw is None:
            raise OSError(errno.EIO, "a ranged read brought fewer bytes than asked", self.file)
        return raw


def _short(at: int, got: int, asked: int) -> str:
    return f"the read at byte {at:,} brought {got:,} bytes, fewer than the {asked:,} asked"


def read_runs(
    storage: Storage, file: str, start: int, length: int, runs: list[tuple[int, int]]
) -> np.ndarray | None:
    """`length` bytes of `file` from `start`, fetched only where `runs` (ranges relative to
    `start`) lie, in ranged reads of at most 8 MiB; zeros elsewhere (those pages are never
    touched, so never allocated). None when the file ends early."""
    out = np.zeros(length, dtype=np.uint8)
    blocks = [
        (file, start + at, min(_REMOTE_BLOCK, stop - at))
        for lo, stop in runs
        for at in range(lo, stop, _REMOTE_BLOCK)
    ]
    for (_, at, n), data in zip(blocks, storage.read_ranges(blocks), strict=True):
        if len(data) != n:
            return None
        out[at - start : at - start + n] = np.frombuffer(data, dtype=np.uint8)
    return out


def read_view(
    storage: Storage,
    file: str,
    start: int,
    shape: Sequence[int],
    strides: Sequence[int],
    item: int,
) -> np.ndarray | None:
    """The row-major bytes of a strided view of a remote file (first element at `start`):
    only the byte runs holding its elements are fetched (`view_runs`). None when the file
    ends early."""
    span = view_span(shape, strides) * item
    runs = view_runs(shape, strides, item)
    raw = read_runs(storage, file, start, span, [(0, span)] if runs is None else runs)
    return None if raw is None else gather_view(raw, shape, strides, item)


def _open_source(storage: Storage, file: str) -> _Source | str | None:
    """The file through its storage (a local one kept open until `close`); why not for a
    refused or unreadable file (an empty file has no bytes: None)."""
    try:
        reader = storage.open(file)
    except UnsafeFileError as exc:
        return f"it {exc.reason}"
    except OSError as exc:
        return exc.strerror or str(exc)
    try:
        size = reader.size()
    except OSError as exc:
        reader.close()
        return exc.strerror or str(exc)
    if isinstance(reader, LocalFile) and size:
        return _Local(reader)  # kept open: its descriptor is read from
    reader.close()
    return _Ranged(storage, file, size) if size else None
