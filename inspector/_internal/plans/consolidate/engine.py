"""The copy engine: writes one planned output file.

Memory stays bounded by the block size (a strided view: by its storage), never by the model,
and no source is memory-mapped, so a shard cut short while it is copied is an
`InspectorError` naming the shard and the byte where it ended, not a SIGBUS. Each output is
written as `<name>.partial` and renamed when complete. How each kind of piece is copied,
locally and remotely: docs/architecture.md, "plans/".
"""

from __future__ import annotations

import errno
import math
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from inspector._internal.common.display import legible
from inspector._internal.common.dtypes import DTYPE_BITS
from inspector._internal.common.filenames import INDEX_NAME
from inspector._internal.formats.casting import cast_bytes
from inspector._internal.formats.tensordata import read_view, view_span
from inspector._internal.plans.consolidate.dest import Dest
from inspector._internal.plans.consolidate.records import (
    METADATA_CAP,
    OutputFile,
    Piece,
    PlannedTensor,
    PlanView,
    index_bytes,
)
from inspector._internal.storage import (
    LocalFile,
    RangeReader,
    Storage,
    TooLargeError,
)
from inspector.errors import FileShrankError, InspectorError

__all__ = [
    "AGAIN",
    "BLOCK_BYTES",
    "Finisher",
    "Progress",
    "SourceFiles",
    "copy_metadata",
    "write_index",
    "write_output",
]


# Rows of a non-contiguous tensor are assembled in blocks of about this many bytes, so memory
# is bounded by the block, not by the largest tensor. Each block is read, placed and written
# once, so it should stay in the CPU caches: on the 512 MB DCP benchmark 1 MB blocks copy in
# 0.55 s where 8 MB blocks took 0.72 s (and 8 MB beat 64 MB by 20%).
BLOCK_BYTES = 1 << 20


# Where the kernel cannot copy: reading and writing 1 MB at a time ran at `cat`'s speed, 8 MB
# at half of it (the buffer falls out of the caches between the read and the write).
_COPY_BLOCK = 1 << 20
# What to do about a source that ended early (consolidate, repair --from, re-shard).
AGAIN = "run the command again once the source file is complete"
# One ranged read of a remote source: large enough to stream at full speed, small enough
# that max_concurrency of them in flight stay a few hundred MB.
_REMOTE_BLOCK = 8 << 20
# A remote strided view up to this size is fetched once, not once per block of rows (a
# transposed weight's rows are spread over its whole storage).
_STRIDED_WHOLE = 256 << 20


class Progress:
    """A byte counter with an optional tqdm bar (tqdm.auto also renders in notebooks), and the
    one clock of the copy: the bar's rate and the result's (`seconds`) are both bytes copied
    over the seconds from the first byte to the last file sealed, in decimal MB as
    `format_bytes` says sizes. The bar showed 31.7 MB/s (binary units, a recent average)
    where the result said 3.8 MB/s (the whole run, planning and verification included)."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.lock = threading.Lock()
        self.done = 0
        self.bar = None
        self.seconds = 0.0
        if enabled:
            from tqdm.auto import tqdm

            # smoothing=0: the average since the start, the rate the result reports.
            self.bar = tqdm(
                total=total,
                unit="B",
                unit_scale=True,
                unit_divisor=1000,
                smoothing=0,
                desc="consolidate",
            )
        # Started once the bar is there (importing tqdm takes a tenth of a second).
        self.started = time.perf_counter()

    def add(self, n: int) -> None:
        with self.lock:
            self.done += n
            if self.bar is not None:
                self.bar.update(n)

    def close(self) -> None:
        self.seconds = time.perf_counter() - self.started
        if self.bar is not None:
            self.bar.close()


class Finisher:
    """fsync + rename of finished outputs on a thread of its own, so the disk writes one file
    back while the next is being copied. At most `depth` files wait (bounded open files)."""

    def __init__(self, dest: Dest, *, fsync: bool = True, depth: int = 4) -> None:
        self.dest = dest
        self.fsync = fsync
        self.pool = ThreadPoolExecutor(max_workers=1)
        self.slots = threading.BoundedSemaphore(depth)
        self.pending: list[Any] = []

    def submit(self, fd: int, partial: str, final: str) -> None:
        self.slots.acquire()
        self.pending.append(self.pool.submit(self._finish, fd, partial, final))

    def _finish(self, fd: int, partial: str, final: str) -> None:
        try:
            try:
                if self.fsync:
                    os.fsync(fd)
            except BaseException:
                self.dest.remove(partial)  # never left behind half-durable
                raise
            finally:
                os.close(fd)
            # Only a complete (and, by default, durable) file ever gets its final name.
            self.dest.rename(partial, final)
            if self.fsync:
                self.dest.sync()
        finally:
            self.slots.release()

    def wait(self) -> None:
        self.pool.shutdown(wait=True)
        for future in self.pending:
            future.result()


def write_output(plan: PlanView, output: OutputFile, bar: Progress, finisher: Finisher) -> None:
    """Header first, data at final offsets into `<name>.partial`; the finisher then fsyncs and
    renames it, so a crash never leaves a partly written file under the final name. When the
    copy fails the partial file is removed (a source that got shorter while it was read is an
    `InspectorError` saying which and what to do)."""
    partial = output.name + ".partial"
    sources = SourceFiles(plan.source_storage)
    # Created afresh in DEST's descriptor: a stale file or a link planted under the
    # partial name is removed first, never written through (O_EXCL | O_NOFOLLOW).
    try:
        fd = finisher.dest.open_partial(partial)
    except BaseException:
        sources.close()
        raise
    try:
        _pwrite_all(fd, output.header, 0)
        bar.add(len(output.header))
        # Size the file up front so every tensor lands at its final offset in any order.
        os.ftruncate(fd, output.size)
        base = len(output.header)
        if not sources.local:
            _fetch_contiguous(sources, fd, base, [t for t in output.tensors if t.contiguous], bar)
        for tensor in output.tensors:
            if tensor.contiguous:
                if sources.local:
                    _copy_pieces(sources, fd, base + tensor.begin, tensor, bar)
            else:
                _assemble(sources, fd, base + tensor.begin, tensor, bar)
    except FileShrankError as exc:
        _discard(finisher.dest, fd, partial)
        raise InspectorError(
            f"{exc.filename}: {exc.strerror} (another process cut it short, or is still "
            f"writing it); {output.name} was not written: {AGAIN}"
        ) from None
    except OSError as exc:
        _discard(finisher.dest, fd, partial)
        if exc.filename is None:  # a write by descriptor: name the file (ENOSPC, EFBIG...)
            raise OSError(exc.errno, exc.strerror, str(plan.dest / partial)) from exc
        raise
    except BaseException:
        _discard(finisher.dest, fd, partial)
        raise
    finally:
        sources.close()
    finisher.submit(fd, partial, output.name)


def _discard(dest: Dest, fd: int, partial: str) -> None:
    """Close and remove an output whose copy failed: nothing half-written stays in DEST."""
    os.close(fd)
    dest.remove(partial)


class SourceFiles:
    """The source files, opened through the plan's storage on first use, so consolidation
    reads only what the scan was allowed to read (regular files inside the folder; the
    storage refuses anything else, as it did for the scan). Local files give descriptors for
    kernel copies and `preadv`; remote ones are read by ranges."""

    def __init__(self, storage: Storage) -> None:
        self.storage = storage
        self.local = storage.is_local
        self.readers: dict[str, RangeReader] = {}
        self._lock = threading.Lock()

    def reader(self, file: str) -> RangeReader:
        with self._lock:
            if file not in self.readers:
                self.readers[file] = self.storage.open(file)
            return self.readers[file]

    def local_file(self, file: str) -> LocalFile:
        reader = self.reader(file)
        if not isinstance(reader, LocalFile):
            raise InspectorError(f"{file}: not a local file; it is read by ranges")
        return reader

    def read(self, file: str, offset: int, count: int) -> bytes:
        """Exactly `count` bytes from `offset` (a source that ends early is an error)."""
        data = self.storage.read_range(file, offset, count)
        if len(data) != count:
            raise InspectorError(
                f"{legible(file)}: the source file ended at byte {offset + len(data):,}, "
                f"{count - len(data):,} bytes early; {AGAIN}"
            )
        return data

    def close(self) -> None:
        for reader in self.readers.values():
            reader.close()
        self.readers.clear()


def _fetch_contiguous(
    sources: SourceFiles, fd: int, base: int, tensors: list[PlannedTensor], bar: Progress
) -> None:
    """Remote source: every byte range of the contiguous tensors, in blocks fetched
    concurrently (bounded by the storage) and written at their final offsets."""
    blocks: list[tuple[str, int, int, int]] = []
    for tensor in tensors:
        for piece in tensor.pieces:
            if piece.dst_offset is None:
                raise InspectorError(f"{tensor.name}: a piece of a contiguous tensor has no offset")
            dst = base + tensor.begin + piece.dst_offset
            for at in range(0, piece.nbytes, _REMOTE_BLOCK):
                n = min(_REMOTE_BLOCK, piece.nbytes - at)
                blocks.append((piece.file, piece.src_offset + at, dst + at, n))

    def one(block: tuple[str, int, int, int]) -> None:
        file, src, dst, n = block
        _pwrite_all(fd, sources.read(file, src, n), dst)
        bar.add(n)

    sources.storage.map(one, blocks)


def _copy_pieces(
    sources: SourceFiles, fd: int, start: int, tensor: PlannedTensor, bar: Progress
) -> None:
    for piece in tensor.pieces:
        if piece.dst_offset is None:
            raise InspectorError(f"{tensor.name}: a piece of a contiguous tensor has no offset")
        source = sources.local_file(piece.file)
        _copy_range(source, piece.src_offset, fd, start + piece.dst_offset, piece.nbytes)
        bar.add(piece.nbytes)


_KERNEL_COPY = {"ok": hasattr(os, "copy_file_range")}


def _copy_range(source: LocalFile, src_off: int, dst: int, dst_off: int, count: int) -> None:
    """Copy bytes file to file in the kernel; where it cannot, blocks read with `preadv` into
    one reused buffer and written. A source that ends early is a `FileShrankError`."""
    src = source.fileno()
    while count > 0 and _KERNEL_COPY["ok"]:
        try:
            n = os.copy_file_range(src, dst, min(count, 1 << 30), src_off, dst_off)
        except OSError as exc:
            if exc.errno not in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
                raise
            _KERNEL_COPY["ok"] = False  # e.g. across file systems: fall back for good
            break
        if n == 0:
            raise FileShrankError(source.name, min(src_off, os.fstat(src).st_size))
        src_off, dst_off, count = src_off + n, dst_off + n, count - n
    while count > 0:
        block = _buffer("copy", min(count, _COPY_BLOCK))
        source.read_into(block.data, src_off)
        _pwrite_all(dst, block, dst_off)
        src_off, dst_off, count = src_off + len(block), dst_off + len(block), count - len(block)


def _assemble(
    sources: SourceFiles, fd: int, start: int, tensor: PlannedTensor, bar: Progress
) -> None:
    """Place non-contiguous chunks (and casts) block by block of leading-dim rows: per chunk
    and block, one read of its rows and one strided numpy assignment."""
    shape = tensor.shape or (1,)  # a 0-d tensor is one row of one element
    item = DTYPE_BITS[tensor.dtype] // 8
    out_item = DTYPE_BITS[tensor.out_dtype] // 8
    row_bytes = math.prod(shape[1:]) * item
    rows_per_block = max(1, BLOCK_BYTES // max(1, row_bytes))
    block = _buffer("block", min(rows_per_block, shape[0]) * row_bytes)
    whole = _whole_strided(sources, tensor, item)
    for r0 in range(0, shape[0], rows_per_block):
        r1 = min(shape[0], r0 + rows_per_block)
        if tensor.partial:  # the reused buffer holds the last tensor's rows where no chunk is
            block[: (r1 - r0) * row_bytes] = 0
        view = _byte_view(block[: (r1 - r0) * row_bytes], r1 - r0, shape, item)
        if whole is not None:
            block[: (r1 - r0) * row_bytes] = whole[r0 * row_bytes : r1 * row_bytes]
        elif sources.local:
            for piece in tensor.pieces:
                _place_rows(sources, piece, view, (r0, r1), item)
        else:
            _place_remote_rows(sources, tensor.pieces, view, (r0, r1), item)
        data = block[: (r1 - r0) * row_bytes]
        if tensor.out_dtype != tensor.dtype:
            data = cast_bytes(data, tensor.dtype, tensor.out_dtype)
        _pwrite_all(fd, data, start + r0 * (row_bytes // item) * out_item)
        bar.add(len(data))


_THREAD_BUFFERS = threading.local()


def _buffer(kind: str, nbytes: int) -> np.ndarray:
    """A reusable byte buffer of this thread ("block" for assembled rows, "scratch" for the
    chunk rows read into it, "copy" for byte copies the kernel cannot do). Reuse saves the
    page faults of fresh allocations, which cost more than the copy itself; each is only
    made when needed."""
    held = getattr(_THREAD_BUFFERS, kind, None)
    if held is None or held.size < nbytes:
        held = np.empty(nbytes, dtype=np.uint8)
        setattr(_THREAD_BUFFERS, kind, held)
    return held[:nbytes]


def _byte_view(buf: np.ndarray, rows: int, shape: tuple[int, ...], item: int) -> np.ndarray:
    """`rows` rows of `shape` as uint8 with the last dim widened to bytes: (r, ..., last*item).
    Contiguous byte runs in the innermost dim let numpy copy whole runs, not single bytes."""
    if len(shape) <= 1:
        return buf.reshape(rows, item)
    return buf.reshape(rows, *shape[1:-1], shape[-1] * item)


def _rows_of(piece: Piece, rows: tuple[int, int], item: int) -> tuple[int, int, int, int] | None:
    """(lo, hi, start, size): the chunk's rows inside block `rows` and their byte range in
    the source (the chunk is row-major in its own shape, so they are one range); None when
    the chunk has no row in the block."""
    r0, r1 = rows
    offsets, shape = (piece.offsets, piece.shape) if piece.shape else ((0,), (1,))
    lo, hi = max(r0, offsets[0]), min(r1, offsets[0] + shape[0])
    if lo >= hi:
        return None
    row_bytes = math.prod(shape[1:]) * item
    return lo, hi, piece.src_offset + (lo - offsets[0]) * row_bytes, (hi - lo) * row_bytes


def _strided_rows(
    piece: Piece, rows: tuple[int, int], item: int
) -> tuple[int, int, tuple[int, ...]]:
    """(start, span, shape): where rows [r0, r1) of a strided view (a piece that is the whole
    tensor) start in the source, the bytes of the storage they span, and their shape."""
    strides = piece.strides or ()
    r0, r1 = rows
    shape = (r1 - r0, *piece.shape[1:])
    return piece.src_offset + r0 * strides[0] * item, view_span(shape, strides) * item, shape


def _whole_strided(sources: SourceFiles, tensor: PlannedTensor, item: int) -> np.ndarray | None:
    """A strided view's row-major bytes, read once: always from a local source (a block of
    a transposed view's rows spans its whole storage, so reading it per block would read the
    storage once per block), from a remote one when its span is small enough (else None:
    each block of rows fetches the runs it needs)."""
    piece = tensor.pieces[0] if len(tensor.pieces) == 1 else None
    if piece is None or piece.strides is None or not piece.shape:
        return None
    start, span, shape = _strided_rows(piece, (0, piece.shape[0]), item)
    if span > _STRIDED_WHOLE and not sources.local:
        return None
    return _fetch_view(sources, piece, start, shape, item)


def _fetch_view(
    sources: SourceFiles, piece: Piece, start: int, shape: tuple[int, ...], item: int
) -> np.ndarray:
    data = read_view(sources.storage, piece.file, start, shape, piece.strides or (), item)
    if data is None:
        raise InspectorError(
            f"{legible(piece.file)}: the source file ended inside the strided view that starts "
            f"at byte {start:,}; {AGAIN}"
        )
    return data


def _place_strided(
    sources: SourceFiles, piece: Piece, view: np.ndarray, rows: tuple[int, int], item: int
) -> None:
    """Rows [r0, r1) of a strided view gathered into the block (`view` holds exactly them)."""
    start, span, shape = _strided_rows(piece, rows, item)
    if span:
        view.reshape(-1)[:] = _fetch_view(sources, piece, start, shape, item)


def _place_rows(
    sources: SourceFiles,
    piece: Piece,
    view: np.ndarray,
    rows: tuple[int, int],
    item: int,
) -> None:
    if piece.strides is not None:
        _place_strided(sources, piece, view, rows, item)
        return
    found = _rows_of(piece, rows, item)
    if found is None:
        return
    lo, hi, start, size = found
    raw = _buffer("scratch", size)
    sources.local_file(piece.file).read_into(raw.data, start)
    _place(piece, view, rows, (lo, hi), raw, item)


def _place_remote_rows(
    sources: SourceFiles,
    pieces: tuple[Piece, ...],
    view: np.ndarray,
    rows: tuple[int, int],
    item: int,
) -> None:
    """Every chunk's rows of one block, fetched at once (one ranged read per chunk); a
    strided view's rows by the runs holding them."""
    for piece in pieces:
        if piece.strides is not None:
            _place_strided(sources, piece, view, rows, item)
    pieces = tuple(p for p in pieces if p.strides is None)
    wanted = [(p, found) for p in pieces if (found := _rows_of(p, rows, item)) is not None]
    datas = sources.storage.map(lambda w: sources.read(w[0].file, w[1][2], w[1][3]), wanted)
    for (piece, (lo, hi, _start, _size)), data in zip(wanted, datas, strict=True):
        _place(piece, view, rows, (lo, hi), np.frombuffer(data, dtype=np.uint8), item)


def _place(
    piece: Piece,
    view: np.ndarray,
    rows: tuple[int, int],
    got: tuple[int, int],
    raw: np.ndarray,
    item: int,
) -> None:
    r0 = rows[0]
    lo, hi = got
    offsets, shape = (piece.offsets, piece.shape) if piece.shape else ((0,), (1,))
    src = _byte_view(raw, hi - lo, shape, item)
    where = [slice(lo - r0, hi - r0)]
    if len(shape) > 1:
        where += [slice(o, o + n) for o, n in zip(offsets[1:-1], shape[1:-1], strict=True)]
        where.append(slice(offsets[-1] * item, (offsets[-1] + shape[-1]) * item))
    view[tuple(where)] = src


def _pwrite_all(fd: int, data: bytes | np.ndarray, offset: int) -> None:
    view = (memoryview(data) if isinstance(data, bytes) else data.data).cast("B")
    while view:
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n


def copy_metadata(plan: PlanView, dest: Dest) -> tuple[str, ...]:
    """The source's public metadata files (config, tokenizer...) copied into DEST, each
    read through the source storage (a regular file inside the folder, local or remote,
    under the cap) and written atomically."""
    copied = []
    storage = plan.source_storage
    for rel in plan.metadata_files:
        name = Path(rel).name
        try:
            data = storage.read_bytes(rel, cap=METADATA_CAP)
        except TooLargeError as exc:
            raise InspectorError(
                f"{plan.source / rel}: is {exc.size:,} bytes, over the {METADATA_CAP:,}-byte "
                "limit for a metadata file; remove it from .hf_metadata or copy it by hand"
            ) from None
        dest.write(name, data)
        copied.append(name)
    return tuple(copied)


def write_index(plan: PlanView, dest: Dest) -> str:
    dest.write(INDEX_NAME, index_bytes(plan))
    return INDEX_NAME
