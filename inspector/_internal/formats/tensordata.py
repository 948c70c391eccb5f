"""Reading tensor data, only when a user asks for it (`--deep`, `diff --data`, consolidation).

Files are opened through the checkpoint's storage (the scan's rules apply). Local shards are
memory-mapped read-only; a tensor is a view into the map, so memory stays bounded by what the
OS pages in. Remote tensors are fetched one at a time with ranged reads (large ones in 8 MiB
blocks, concurrently). DCP tensors are assembled from their chunks, one tensor at a time.
Every range is checked against the file size before it is touched.
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
from inspector._internal.formats.safetensors import ShardHeader
from inspector._internal.storage import LocalFile, Storage
from inspector.errors import UnsafeFileError

__all__ = ["TensorData", "hash_bytes"]

_HASH_BLOCK = 64 << 20


def hash_bytes(view: memoryview | bytes | np.ndarray) -> str:
    """xxh3-64 of a buffer, fed in blocks so huge tensors never need a copy."""
    mv = (view.data if isinstance(view, np.ndarray) else memoryview(view)).cast("B")
    h = xxhash.xxh3_64()
    for start in range(0, len(mv), _HASH_BLOCK):
        h.update(mv[start : start + _HASH_BLOCK])
    return h.hexdigest()


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
        buf = self._map(shard.file)
        if buf is None:
            return
        base = shard.data_start
        for name, dtype, shape, b, e in zip(
            shard.names,
            shard.dtypes,
            shard.shapes,
            shard.begins.tolist(),
            shard.ends.tolist(),
            strict=True,
        ):
            if base + e <= buf.size:
                view = buf.view(base + b, base + e)
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
        buf = self._map(shard.file)
        start = shard.data_start + int(shard.begins[i])
        end = shard.data_start + int(shard.ends[i])
        if buf is None or end > buf.size:
            return None
        return buf.view(start, end)

    def tensor_hash(self, name: str) -> str | None:
        data = self.tensor_bytes(name)
        return None if data is None else hash_bytes(data)

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


class _Source:
    """Bytes of one file: `size`, and `view(start, end)` (None when it cannot be read)."""

    size = 0

    def view(self, start: int, end: int) -> memoryview | None:
        raise NotImplementedError

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
