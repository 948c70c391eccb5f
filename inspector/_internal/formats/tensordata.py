"""Reading tensor data, only when a user asks for it (`--deep`, `diff --data`, consolidation).

Files are opened through the checkpoint's storage (the scan's rules apply). Local shards are
memory-mapped read-only; a tensor is a view into the map, so memory stays bounded by what the
OS pages in. Remote tensors are fetched one at a time with ranged reads (large ones in 8 MiB
blocks, concurrently). DCP tensors are assembled from their chunks, one tensor at a time.
A strided `.bin` view (a transposed or sliced tensor `torch.save` kept as it was) is gathered
from its storage record element by element into row-major order: exactly the elements the
view covers, what `torch.load(...).contiguous()` holds; remotely only the byte runs holding
them are fetched. Every range is checked against the file size before it is touched.
"""

from __future__ import annotations

import contextlib
import mmap
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager

import numpy as np
import xxhash

from inspector._internal.checkpoint.scanned import DcpChunk, ScannedCheckpoint
from inspector._internal.common.dtypes import DTYPE_BITS
from inspector._internal.formats.bin_shard import data_unread, strides_of
from inspector._internal.formats.safetensors import ShardHeader
from inspector._internal.storage import LocalFile, Storage
from inspector.errors import UnsafeFileError

__all__ = [
    "TENSOR_HASH",
    "TensorData",
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


class TensorData(AbstractContextManager["TensorData"]):
    """Byte access to the tensors of a scanned checkpoint. Use as a context manager."""

    def __init__(self, scanned: ScannedCheckpoint) -> None:
        self.scanned = scanned
        self._maps: dict[str, _Source | None] = {}
        self._problems: dict[str, str] = {}
        # Where each tensor is, built when a tensor is first asked for by name (reading
        # whole shards does not need it).
        self._where: dict[str, tuple[ShardHeader, int]] | None = None

    # -- raw entries of one shard -------------------------------------------------------

    def shard_entries(
        self, shard: ShardHeader
    ) -> Iterator[tuple[str, str, tuple[int, ...], memoryview]]:
        """(name, dtype, shape, bytes) of every entry of `shard` whose bytes are on disk."""
        buf = None if data_unread(shard) else self._map(shard.file)
        if buf is None:
            return
        base = shard.data_start
        strided = strides_of(shard)
        for name, dtype, shape, b, e in zip(
            shard.names,
            shard.dtypes,
            shard.shapes,
            shard.begins.tolist(),
            shard.ends.tolist(),
            strict=True,
        ):
            if name in strided:
                view = _gathered(buf, base + b, e - b, shape, strided[name])
            else:
                view = buf.view(base + b, base + e) if base + e <= buf.size else None
            if view is not None:
                yield name, dtype, shape, view

    def local_bytes(self, file: str, *, scattered: bool = False) -> np.ndarray | None:
        """The whole of a local, memory-mapped `file` as a read-only uint8 array (no copy),
        or None for a remote or unreadable file (read those with ranged reads). With
        `scattered`, the OS is told reads will be small and far apart (no read-ahead: a
        sampled window then costs one page, not the read-ahead window around it)."""
        source = self._map(file)
        if not isinstance(source, _Mapped):
            return None
        if scattered and hasattr(mmap, "MADV_RANDOM"):
            source.map.madvise(mmap.MADV_RANDOM)
        return np.frombuffer(source.map, dtype=np.uint8)

    # -- logical tensors ----------------------------------------------------------------

    def tensor_bytes(self, name: str) -> memoryview | None:
        """Row-major bytes of the full logical tensor, or None if it cannot be read.

        Safetensors layouts give a zero-copy view; DCP chunks are assembled into one buffer.
        """
        dcp = self.scanned.dcp
        if dcp is not None and name in dcp.chunks:
            return self._assemble(name, dcp.chunks[name], dcp.full_shapes[name])
        if self._where is None:
            self._where = {}
            for shard in self.scanned.shards:
                for i, tensor in enumerate(shard.names):
                    self._where.setdefault(tensor, (shard, i))
        where = self._where.get(name)
        if where is None:
            return None
        shard, i = where
        buf = None if data_unread(shard) else self._map(shard.file)
        start = shard.data_start + int(shard.begins[i])
        end = shard.data_start + int(shard.ends[i])
        strides = strides_of(shard).get(name)
        if buf is None:
            return None
        if strides is not None:  # a strided view saved by torch.save: gathered
            return _gathered(buf, start, end - start, shard.shapes[i], strides)
        if end > buf.size:
            return None
        return buf.view(start, end)

    def tensor_hash(self, name: str) -> str | None:
        data = self.tensor_bytes(name)
        return None if data is None else tensor_digest(data)

    def _assemble(
        self, name: str, chunks: Sequence[DcpChunk], shape: tuple[int, ...]
    ) -> memoryview | None:
        bits = DTYPE_BITS.get(chunks[0].dtype)
        if bits is None or bits % 8:
            return None  # sub-byte dtypes cannot be placed element-wise
        item = bits // 8
        full = np.zeros((*shape, item), dtype=np.uint8)
        for chunk in chunks:
            shard = self.scanned.shard(chunk.file)
            idx = shard.names.index(name) if shard is not None and name in shard.names else -1
            buf = self._map(chunk.file) if idx >= 0 else None
            if buf is None or shard is None:
                return None
            start = shard.data_start + int(shard.begins[idx])
            end = shard.data_start + int(shard.ends[idx])
            if end > buf.size or end - start != item * int(np.prod(chunk.shape, dtype=np.int64)):
                return None
            view = buf.view(start, end)
            if view is None:
                return None
            src = np.frombuffer(view, dtype=np.uint8)
            where = tuple(slice(o, o + n) for o, n in zip(chunk.offsets, chunk.shape, strict=True))
            full[where] = src.reshape(*chunk.shape, item)
        return full.reshape(-1).data

    # -- files ----------------------------------------------------------------------------

    def problem(self, file: str) -> str | None:
        """Why `file`'s bytes cannot be read at all (it cannot be opened or mapped), or None."""
        self._map(file)
        return self._problems.get(file)

    def _map(self, file: str) -> _Source | None:
        if file not in self._maps:
            storage = self.scanned.location.storage
            source = _open_source(storage, file)
            if isinstance(source, str):
                self._problems[file] = source
                source = None
            self._maps[file] = source
        return self._maps[file]

    def close(self) -> None:
        for m in self._maps.values():
            if m is not None:
                m.close()
        self._maps.clear()

    def __exit__(self, *exc: object) -> None:
        self.close()


def _gathered(
    buf: _Source, start: int, nbytes: int, shape: Sequence[int], strides: Sequence[int]
) -> memoryview | None:
    """The row-major bytes of the strided view whose first element is at `start` and whose
    elements take `nbytes` (None when its span runs past the file or cannot be read)."""
    numel = int(np.prod(shape, dtype=np.int64))
    if numel == 0:
        return memoryview(b"")
    item = nbytes // numel
    span = view_span(shape, strides) * item
    if item <= 0 or nbytes != numel * item or start + span > buf.size:
        return None
    runs = view_runs(shape, strides, item) if isinstance(buf, _Ranged) else None
    raw = buf.span(start, span, runs)
    return None if raw is None else gather_view(raw, shape, strides, item).data


class _Source:
    """Bytes of one file: `size`, and `view(start, end)` (None when it cannot be read)."""

    size = 0

    def view(self, start: int, end: int) -> memoryview | None:
        raise NotImplementedError

    def span(
        self, start: int, length: int, runs: list[tuple[int, int]] | None
    ) -> np.ndarray | None:
        """`length` bytes from `start` as a byte array where at least the bytes of `runs`
        (relative ranges; None: all of them) are the file's."""
        view = self.view(start, start + length)
        return None if view is None else np.frombuffer(view, dtype=np.uint8)

    def close(self) -> None:
        pass


class _Mapped(_Source):
    def __init__(self, mapped: mmap.mmap) -> None:
        self.map = mapped
        self.size = len(mapped)

    def view(self, start: int, end: int) -> memoryview:
        return memoryview(self.map)[start:end]

    def close(self) -> None:
        # A view may still be alive; the map is then freed with it.
        with contextlib.suppress(BufferError):
            self.map.close()


_REMOTE_BLOCK = 8 << 20


class _Ranged(_Source):
    def __init__(self, storage: Storage, file: str, size: int) -> None:
        self.storage, self.file, self.size = storage, file, size

    def view(self, start: int, end: int) -> memoryview | None:
        blocks = [
            (self.file, at, min(_REMOTE_BLOCK, end - at)) for at in range(start, end, _REMOTE_BLOCK)
        ]
        try:
            data = b"".join(self.storage.read_ranges(blocks))
        except OSError:
            return None
        return memoryview(data) if len(data) == end - start else None

    def span(
        self, start: int, length: int, runs: list[tuple[int, int]] | None
    ) -> np.ndarray | None:
        if runs is None:
            return super().span(start, length, runs)
        try:
            return read_runs(self.storage, self.file, start, length, runs)
        except OSError:
            return None


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
    """The file through its storage; why not for a refused or unreadable file (an empty
    file has no bytes: None)."""
    try:
        reader = storage.open(file)
    except UnsafeFileError as exc:
        return f"it {exc.reason}"
    except OSError as exc:
        return exc.strerror or str(exc)
    try:
        if not isinstance(reader, LocalFile):
            return _Ranged(storage, file, reader.size()) if reader.size() else None
        if reader.size() == 0:
            return None
        return _Mapped(mmap.mmap(reader.fileno(), 0, access=mmap.ACCESS_READ))
    except (OSError, ValueError) as exc:
        return getattr(exc, "strerror", None) or str(exc)
    finally:
        reader.close()
