"""Executing a consolidation plan: DEST, the copy engine, the run alone or under torchrun,
the recheck.

DEST may be an existing checkpoint, or a path where someone planted a link: it is opened
once without following a link, every write goes through that descriptor, and nothing is
written until every entry of DEST is this very plan's own output (else refused, or with
`overwrite` moved into a backup; SECURITY.md, 4). Each output is written as
`<name>.partial` and renamed when complete; memory stays bounded by the block size (a
strided view: by its storage) and no source is memory-mapped, so a shard cut short while
it is copied is an `InspectorError` naming the shard and the byte, not a SIGBUS. Output i
is written by rank i % world_size; rank 0 writes the index last, then re-scans DEST.
How each piece is copied and what counts as our own output: docs/architecture.md, "plans/".
"""

from __future__ import annotations

import contextlib
import errno
import math
import os
import stat
import threading
import time
from collections.abc import Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from inspector._internal.checkpoint.loaded import tensor_data
from inspector._internal.checks import check
from inspector._internal.common.display import legible
from inspector._internal.common.dtypes import DTYPE_BITS
from inspector._internal.common.filenames import INDEX_NAME, MANIFEST_NAME
from inspector._internal.common.text import examples, plural
from inspector._internal.execution.atomic import (
    BACKUP_DIR,
    new_backup_dir,
    open_fresh,
    write_atomic,
)
from inspector._internal.execution.ranks import Distributed
from inspector._internal.execution.temps import (
    Leftovers,
    find_leftovers,
    parse_temp_name,
    remove_leftovers,
)
from inspector._internal.findings.codes import Code
from inspector._internal.findings.finding import Finding, make_finding
from inspector._internal.formats.casting import cast_bytes
from inspector._internal.formats.tensordata import read_view, tensor_digest, view_span
from inspector._internal.plans.consolidate.records import (
    METADATA_CAP,
    ConsolidationResult,
    Execution,
    OutputFile,
    Piece,
    PlannedTensor,
    PlanView,
    index_bytes,
)
from inspector._internal.scan.entry import scan
from inspector._internal.storage import (
    LocalFile,
    Location,
    RangeReader,
    Storage,
    TooLargeError,
)
from inspector.errors import (
    FileShrankError,
    InspectorError,
    PlanRefusedError,
    UnsafeFileError,
    UnsafeInputError,
)

__all__ = [
    "AGAIN",
    "BLOCK_BYTES",
    "Dest",
    "SourceFiles",
    "execute_plan",
    "not_a_folder",
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


# -- DEST, the folder a consolidation writes into ------------------------------------------

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
# Copied metadata files (config, tokenizer) are compared whole; none is near this size.
_COMPARE_CAP = 256 << 20


class Dest:
    """DEST as a descriptor opened without following links; every write goes through it."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self.fd = fd

    @classmethod
    def open(cls, path: Path) -> Dest:
        """Create DEST if needed (its parents are the user's path) and open it as a real
        folder; a link or a file there is refused."""
        path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, 0o755)
        try:
            fd = os.open(path, os.O_RDONLY | _DIRECTORY | _NOFOLLOW)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise UnsafeInputError(not_a_folder(path)) from None
            raise
        return cls(path, fd)

    def close(self) -> None:
        os.close(self.fd)

    def __enter__(self) -> Dest:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def names(self) -> list[str]:
        return sorted(os.listdir(self.fd))

    def lstat(self, name: str) -> os.stat_result | None:
        try:
            return os.stat(name, dir_fd=self.fd, follow_symlinks=False)
        except FileNotFoundError:
            return None

    def read(self, name: str, limit: int) -> bytes | None:
        """At most `limit` bytes of a regular file of DEST (never through a link, never
        blocking on a FIFO), or None when it is not one."""
        try:
            fd = os.open(name, os.O_RDONLY | _NOFOLLOW | _NONBLOCK, dir_fd=self.fd)
        except OSError:
            return None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return None
            return _read_at_most(fd, limit)
        finally:
            os.close(fd)

    def open_partial(self, name: str) -> int:
        """`name` created afresh for writing: a stale file or planted link is removed first."""
        return open_fresh(name, dir_fd=self.fd, flags=os.O_RDWR, mode=0o644)

    def rename(self, src: str, dst: str) -> None:
        os.replace(src, dst, src_dir_fd=self.fd, dst_dir_fd=self.fd)

    def remove(self, name: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=self.fd)

    def write(self, name: str, data: bytes) -> None:
        """Temp file, fsync, rename, all inside DEST."""
        write_atomic(Path(name), data, dir_fd=self.fd)

    def sync(self) -> None:
        with contextlib.suppress(OSError):  # some file systems cannot fsync a folder
            os.fsync(self.fd)

    def clear_leftovers(self, plan: PlanView) -> Leftovers:
        """Remove the temp files a killed run of this plan left for the files it writes
        through one (the index, the copied metadata files, the manifest), when their pid is
        gone; report any other entry named like them. Called by rank 0 once every rank has
        checked DEST and before anything is written: this consolidation owns DEST then (a
        second one writing it at once would clash anyway), so the pid is what is left to
        prove (`execution/temps.py`)."""
        names = {INDEX_NAME, MANIFEST_NAME, *(Path(rel).name for rel in plan.metadata_files)}
        found = find_leftovers(self.path, writes=names, locked=True, dir_fd=self.fd)
        return remove_leftovers(self.path, found, dir_fd=self.fd)

    def retire(self, names: list[str]) -> Path | None:
        """Move `names` (any kind of entry, links included, as they are) into a fresh
        `.ckpt-inspect-backup/<time>/` folder of DEST; returns it, or None if no names."""
        if not names:
            return None
        backup = new_backup_dir(self.path)
        parent = self._subfolder(self.fd, BACKUP_DIR)
        try:
            folder = self._subfolder(parent, backup.name)
            try:
                for name in names:
                    os.rename(name, name, src_dir_fd=self.fd, dst_dir_fd=folder)
                os.fsync(folder)
            finally:
                os.close(folder)
        finally:
            os.close(parent)
        self.sync()
        return backup

    def _subfolder(self, parent: int, name: str) -> int:
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, 0o755, dir_fd=parent)
        try:
            return os.open(name, os.O_RDONLY | _DIRECTORY | _NOFOLLOW, dir_fd=parent)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise UnsafeInputError(
                    f"{self.path / BACKUP_DIR} is a symbolic link or a file, not the backup "
                    "folder ckpt-inspect makes; remove it, then run again"
                ) from None
            raise


def not_a_folder(path: Path) -> str:
    """Why DEST cannot be written into, with what to do (a link, or not a folder)."""
    if os.path.islink(path):
        target = ""
        with contextlib.suppress(OSError):
            target = f" (to {os.readlink(path)})"
        return (
            f"{path}: DEST is a symbolic link{target}; consolidate writes only into a real "
            "folder, never through a link (one planted in a shared or downloaded folder may "
            "point anywhere): pass the folder itself, or remove the link"
        )
    return f"{path}: DEST exists and is not a folder; choose a new or empty folder as DEST"


def is_complete(dest: Dest, output: OutputFile) -> bool:
    """A finished output of this plan: final name, planned size, exactly the planned header."""
    info = dest.lstat(output.name)
    if info is None or not stat.S_ISREG(info.st_mode) or info.st_size != output.size:
        return False
    return dest.read(output.name, len(output.header)) == output.header


@dataclass(frozen=True, slots=True)
class Foreign:
    """An entry of DEST this plan did not write, and whether a name we write replaces it."""

    name: str
    why: str
    replaced: bool


@dataclass(frozen=True, slots=True)
class _Planned:
    """What a file this plan writes holds: `head`, its first bytes (all of them for the
    index and the copied files, the header for an output), its `size`, and `cut` when a
    crash may leave it shorter (a `.partial`, a temp file)."""

    head: bytes
    size: int
    cut: bool = False


def foreign_entries(dest: Dest, plan: PlanView) -> list[Foreign]:
    """Every entry of DEST that is not this plan's own output (see the module docs)."""
    names = dest.names()
    planned = _planned(plan, set(names))
    foreign = []
    for name in names:
        want = planned.get(name) or _temp_of(name, planned)
        why = _not_ours(dest, name, want)
        if why is not None:
            foreign.append(Foreign(name, why, want is not None))
    return foreign


def _planned(plan: PlanView, present: set[str]) -> dict[str, _Planned]:
    out: dict[str, _Planned] = {}
    for output in plan.outputs:
        out[output.name] = _Planned(output.header, output.size)
        # Written header first, then sized: a crash may cut it anywhere.
        out[output.name + ".partial"] = _Planned(output.header, output.size, cut=True)
    if plan.index_file:
        index = index_bytes(plan)
        out[INDEX_NAME] = _Planned(index, len(index))
    for rel in plan.metadata_files:
        name = Path(rel).name
        # Read (remote: fetched) only when DEST holds an entry under its name to compare.
        data = _source_bytes(plan, rel) if name in present else None
        if data is not None:
            out[name] = _Planned(data, len(data))
    return out


def _temp_of(name: str, planned: dict[str, _Planned]) -> _Planned | None:
    """The temp file `write_atomic` writes for the index or a copied file: a prefix."""
    # Exactly the name `write_atomic` gives it (the one parser: look-alike digits are not).
    parsed = parse_temp_name(name)
    want = planned.get(parsed[0]) if parsed else None
    if want is None or want.cut or len(want.head) != want.size:
        return None  # outputs are written as .partial, never through a temp file
    return _Planned(want.head, want.size, cut=True)


def _not_ours(dest: Dest, name: str, want: _Planned | None) -> str | None:
    """Why `name` is not this plan's output, or None when it is."""
    info = dest.lstat(name)
    if info is None:
        return None  # gone meanwhile
    if name == BACKUP_DIR and stat.S_ISDIR(info.st_mode):
        return None  # earlier backups: left as they are, never written into again
    if stat.S_ISLNK(info.st_mode):
        return "a symbolic link"
    if not stat.S_ISREG(info.st_mode):
        return "a folder" if stat.S_ISDIR(info.st_mode) else "not a regular file"
    if want is None:
        # The content manifest (or a temp file of its atomic write) is ours: it is rewritten
        # once the outputs are (`ConsolidationPlan.execute`).
        parsed = parse_temp_name(name)
        ours = name == MANIFEST_NAME or (parsed is not None and parsed[0] == MANIFEST_NAME)
        return None if ours else "not a file this consolidation writes"
    if want.cut:
        got = dest.read(name, min(info.st_size, len(want.head)))
        ok = info.st_size <= want.size and got is not None and want.head.startswith(got)
    else:
        ok = info.st_size == want.size and dest.read(name, len(want.head)) == want.head
    return None if ok else "other content than this plan writes"


def _source_bytes(plan: PlanView, rel: str) -> bytes | None:
    """A source metadata file's bytes, read through the source's storage (a regular file
    inside the folder, local or remote, under the cap), or None."""
    try:
        return plan.source_storage.read_bytes(rel, cap=_COMPARE_CAP)
    except (OSError, TooLargeError, UnsafeFileError):
        return None


def _read_at_most(fd: int, limit: int) -> bytes:
    parts = []
    while limit > 0:
        chunk = os.read(fd, min(limit, 1 << 20))
        if not chunk:
            break
        parts.append(chunk)
        limit -= len(chunk)
    return b"".join(parts)


def refusal(dest: Path, foreign: list[Foreign]) -> PlanRefusedError:
    # What a written file would replace first: that is what the user stands to lose.
    ordered = sorted(foreign, key=lambda f: not f.replaced)
    shown = examples([f"{f.name} ({f.why})" for f in ordered], limit=6)
    return PlanRefusedError(
        f"{dest}: DEST is not empty: {len(foreign)} entr{'y' if len(foreign) == 1 else 'ies'} "
        f"not written by this consolidation: {shown}; consolidate writes only into an empty "
        "folder or one holding its own earlier output of this same plan. Choose an empty "
        "DEST, or pass --overwrite to replace what is there (each replaced entry is first "
        f"moved to {dest / BACKUP_DIR}/<time>/; entries under other names are left alone)"
    )


# -- the recheck of what was written -------------------------------------------------------


def recheck(plan: PlanView, *, checks: bool, data: bool) -> tuple[list[Finding], int, list[str]]:
    """Re-scan DEST and run every check; with `data`, compare content hashes per tensor."""
    written = scan(plan.dest)
    # What consolidation is answerable for; whether the model named by config.json loads the
    # tensors is the same before and after, and is `ckpt-inspect check DEST`'s to say.
    findings = check(written, model=False) if checks else []
    if checks:
        findings += _collapsed_output(plan)
    if not data:
        return findings, 0, []
    source = scan(Location(plan.source_storage))
    mismatches: list[str] = []
    checked = 0
    with tensor_data(source) as src, tensor_data(written) as out:
        for output in plan.outputs:
            for t in output.tensors:
                raw: memoryview | bytes | np.ndarray | None = src.tensor_bytes(t.name)
                if raw is None and t.contiguous:
                    raw = _contiguous_source_bytes(plan.source_storage, t)  # packed F4/F6
                if raw is not None and t.out_dtype != t.dtype:
                    raw = cast_bytes(np.frombuffer(raw, dtype=np.uint8), t.dtype, t.out_dtype)
                expected = None if raw is None else tensor_digest(raw)
                checked += 1
                if expected is None or expected != out.tensor_hash(t.name):
                    mismatches.append(t.name)
    return findings, checked, mismatches


def _collapsed_output(plan: PlanView) -> list[Finding]:
    """`mapping-collapsed` for an output written as one file although the reference the
    source knows names several: the collapse the source's check reports, reproduced (an
    explicit all-in-one mapping does it), is not a clean result."""
    layout = plan.layout
    if layout is None or layout.files < 2 or len(plan.outputs) != 1:
        return []
    n = sum(len(o.tensors) for o in plan.outputs)
    message = (
        f"the output holds all {plural(n, 'tensor')} in {plan.outputs[0].name} although "
        f"{layout.label} names {plural(layout.files, 'file')}: the consolidation followed a "
        f"collapsed assignment ({plan.assignment}); consolidate again with --reference "
        f"{layout.path}"
    )
    return [make_finding(Code.MAPPING_COLLAPSED, message, file=INDEX_NAME)]


def _contiguous_source_bytes(storage: Storage, tensor: PlannedTensor) -> bytes:
    """The tensor's bytes read piece by piece (verification of byte-copied tensors that the
    element-wise assembler cannot place, such as packed sub-byte dtypes)."""
    out = bytearray(tensor.end - tensor.begin)
    sources = SourceFiles(storage)
    try:
        for piece in tensor.pieces:
            data = sources.read(piece.file, piece.src_offset, piece.nbytes)
            at = piece.dst_offset or 0  # set on every piece of a contiguous tensor
            out[at : at + piece.nbytes] = data
    finally:
        sources.close()
    return bytes(out)


# -- running a plan, alone or under torchrun -----------------------------------------------


def _write_all(
    plan: PlanView, todo: list[OutputFile], bar: Progress, finisher: Finisher, workers: int
) -> None:
    """Every output of `todo`, `workers` at a time. The first that fails stops the run: the
    outputs not started are not written (those being written finish), and its error is
    raised."""
    failed = threading.Event()

    def one(output: OutputFile) -> None:
        if failed.is_set():  # taken from the queue after a failure, before it was cancelled
            return
        try:
            write_output(plan, output, bar, finisher)
        except BaseException:
            failed.set()
            raise

    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        futures = [pool.submit(one, o) for o in todo]
        wait(futures, return_when=FIRST_EXCEPTION)
        for future in futures:
            future.cancel()
    for future in futures:
        if not future.cancelled():
            future.result()  # the first failure, in plan order


def execute_plan(plan: PlanView, run: Execution) -> ConsolidationResult:
    started = time.perf_counter()
    dist = Distributed.start(run.rank, run.world_size)
    with Dest.open(plan.dest) as dest:
        # 1. Nothing is written into a DEST that holds anything but this plan's own output,
        # unless `overwrite`: every rank looks before any rank writes.
        foreign = foreign_entries(dest, plan)
        if foreign and not run.overwrite:
            raise refusal(plan.dest, foreign)
        dist.barrier()
        backup = None
        leftovers = Leftovers()
        replaced = tuple(f.name for f in foreign if f.replaced)
        if dist.rank == 0:
            backup = dest.retire(list(replaced))
            leftovers = dest.clear_leftovers(plan)
            # A stale index would make a half-rewritten folder look complete; the new one
            # comes last.
            dest.remove(INDEX_NAME)
        dist.barrier()
        # 2. Which outputs are ours (output i goes to rank i % world_size, as torch does),
        # each written as `<name>.partial` renamed when complete.
        mine = [o for o in plan.outputs if o.index % dist.world_size == dist.rank]
        skipped = [o for o in mine if run.resume and is_complete(dest, o)]
        todo = [o for o in mine if o not in skipped]
        bar = Progress(sum(o.size for o in todo), run.progress)
        try:
            finisher = Finisher(dest, fsync=run.fsync)
            try:
                _write_all(plan, todo, bar, finisher, run.workers)
            finally:
                finisher.wait()
        finally:
            bar.close()
        # 3. Everyone done: rank 0 copies the metadata files and writes the index last.
        dist.barrier()
        index_file: str | None = None
        copied: tuple[str, ...] = ()
        if dist.rank == 0:
            copied = copy_metadata(plan, dest)
            index_file = write_index(plan, dest) if plan.index_file else None
    # Nobody returns before the index exists; rank 0 then verifies alone (it may take long).
    dist.finish()
    findings: Sequence[Finding] = ()
    checked = 0
    mismatches: Sequence[str] = ()
    if dist.rank == 0 and (run.verify or run.verify_data):
        findings, checked, mismatches = recheck(plan, checks=run.verify, data=run.verify_data)
    return ConsolidationResult(
        dest=plan.dest,
        written=tuple(o.name for o in todo),
        skipped=tuple(o.name for o in skipped),
        bytes_written=bar.done,
        seconds=time.perf_counter() - started,
        copy_seconds=bar.seconds,
        index_file=index_file,
        metadata_files=copied,
        rank=dist.rank,
        world_size=dist.world_size,
        verified=dist.rank == 0 and run.verify,
        findings=tuple(findings),
        data_checked=checked,
        data_mismatches=tuple(mismatches),
        partial=plan.partial,
        backup=backup,
        replaced=replaced if backup is not None else (),
        leftovers=leftovers,
    )
