"""Which bytes of each tensor the value statistics read, and reading them.

`full` streams every byte of every tensor; `sample` reads reproducible stratified windows
(what that guarantees is in docs/values.md). Planned for a whole batch of tensors at once,
without Python work per tensor, so 300,000 tensors take seconds; never memory-mapped; a
tensor that cannot be read comes back as an `Unread`, never skipped silently. How:
docs/architecture.md, "formats/".
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar, Literal, cast

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from inspector._internal.formats.bin_shard import data_unread
from inspector._internal.formats.safetensors import ShardHeader
from inspector._internal.formats.value_decode import Decoder, decoder_for
from inspector._internal.formats.value_segments import (
    PARTIAL,
    Records,
    row_records,
    segment_records,
)
from inspector._internal.formats.value_stats import Accumulator
from inspector._internal.storage import LocalFile, RangeReader, Storage
from inspector.errors import UnsafeFileError

__all__ = ["Mode", "SampleBudget", "Unread", "read_records", "windows_of"]

Mode = Literal["sample", "full"]

_FULL_BLOCK = 16 << 20  # bytes of a local tensor handed to the accumulator at once
_REMOTE_BLOCK = 8 << 20  # bytes per remote request in full mode
_REMOTE_IN_FLIGHT = 4  # remote full-mode requests per file at once (bounded memory)
_REMOTE_FILES = 4  # remote files read at once
_SAMPLE_FILES = 8  # local files sampled at once (their reads overlap on the disk)
_COALESCE_GAP = 4096  # sampled windows closer than this are fetched in one request
_COALESCE_MAX = 1 << 20  # the longest such request
_SAMPLE_BATCH = 4096  # tensors planned, read and reduced at once (bounded memory)
_SMALL_READ = 16 << 10  # ranges up to this long are read with `pread`, longer with `preadv`

if TYPE_CHECKING:
    import pandas as pd


@dataclass(frozen=True)
class SampleBudget:
    """What `sample` reads of each tensor: `windows` windows of `window_bytes` bytes."""

    windows: int = 8
    window_bytes: int = 256

    # A budget is asked for by a person (`check --sample-windows`): past this many windows
    # (1 MiB a tensor at 256 bytes each) a sample costs more than reading in full mode.
    MAX_WINDOWS: ClassVar[int] = 4096

    def __post_init__(self) -> None:
        if (
            not 1 <= self.windows <= self.MAX_WINDOWS
            or self.window_bytes < 8
            or self.window_bytes % 8
        ):
            raise ValueError(
                f"sample budget {self.windows} x {self.window_bytes} bytes: expected 1 to "
                f"{self.MAX_WINDOWS:,} windows of a multiple of 8 bytes"
            )

    @property
    def per_tensor(self) -> int:
        return self.windows * self.window_bytes


@dataclass(frozen=True)
class Unread:
    """A tensor (or its chunk in `file`) whose bytes could not be read: `truncated` when
    they lie past the end of the file, otherwise `why` reading failed."""

    file: str
    name: str
    dtype: str
    truncated: bool
    why: str

    @classmethod
    def past_end(cls, file: str, name: str, dtype: str, span: tuple[int, int], size: int) -> Unread:
        """Bytes [start, end) that lie past the end of the `size`-byte file (it was short
        when it was opened)."""
        start, end = span
        why = f"its bytes {start:,}-{end - 1:,} lie past the end of the {size:,}-byte file"
        return cls(file, name, dtype, True, why)

    @classmethod
    def failed(cls, file: str, name: str, dtype: str, exc: OSError) -> Unread:
        """Bytes whose read failed or came back short (`FileShrankError`)."""
        return cls(file, name, dtype, False, _why(exc))


def read_records(
    storage: Storage,
    shards: Sequence[ShardHeader],
    mode: Mode,
    *,
    local: bool,
    stale: Mapping[str, frozenset[str]],
    budget: SampleBudget = SampleBudget(),
    seed: int = 0,
    workers: int | None = None,
) -> tuple[pd.DataFrame, list[Unread]]:
    """Partial records (`segments.PARTIAL` columns and `name`), one per tensor and file
    holding (a chunk of) it (records of one name add up: `segments.finish`), and the tensors
    whose bytes could not be read. `local`: the storage is a local disk. Of a name several
    shards hold, only the copy a loader keeps (`stale`, file -> the names whose copy there is
    not: `checkpoint.loaded.stale_copies`): statistics of one tensor, not of a mixture."""
    if workers is None:
        # Sampled reads wait on the disk or the network, full reads on the CPU.
        workers = _SAMPLE_FILES if mode == "sample" else (os.cpu_count() or 1)
        workers = workers if local else _REMOTE_FILES
    # A `.bin` file whose stored bytes are not what torch.load gives (`data_unread`: a
    # legacy stream, another byte order) has no values to show; the scan already says why.
    shards = [s for s in shards if s.names and not data_unread(s)]
    found = _Found()
    with ThreadPoolExecutor(max(1, min(workers, len(shards)))) as pool:

        def one(shard: ShardHeader) -> _Found:
            with _File.opened(shard, storage, local) as file:
                if file.problem is not None:
                    found = file.lost()
                elif mode == "sample":
                    found = _sample(file, budget, seed)
                else:
                    found = _full_local(file) if local else _full_remote(file)
            return found.without(stale.get(shard.file, frozenset()))

        for part in pool.map(one, shards):
            found.extend(part)
    return found.frame(), found.unread


@dataclass
class _Found:
    """Partial records of tensors (`names[i]` for row i of the concatenated records) and
    the tensors that could not be read."""

    names: list[str] = field(default_factory=list)
    records: list[Records] = field(default_factory=list)
    unread: list[Unread] = field(default_factory=list)

    def add(self, names: list[str], records: Records) -> None:
        self.names += names
        self.records.append(records)

    def without(self, names: frozenset[str]) -> _Found:
        """These records and problems but those of `names` (copies no loader keeps)."""
        if not names:
            return self
        out = _Found(unread=[u for u in self.unread if u.name not in names])
        at = 0
        for records in self.records:
            n = len(next(iter(records.values())))
            part = self.names[at : at + n]
            at += n
            keep = np.fromiter((name not in names for name in part), bool, n)
            if keep.any():
                out.add(
                    [name for name, k in zip(part, keep, strict=True) if k],
                    {c: v[keep] for c, v in records.items()},
                )
        return out

    def extend(self, other: _Found) -> None:
        self.names += other.names
        self.records += other.records
        self.unread += other.unread

    def frame(self) -> pd.DataFrame:
        columns = {
            c: np.concatenate([r[c] for r in self.records]) if self.records else np.zeros(0)
            for c in PARTIAL
        }
        import pandas as pd

        return pd.DataFrame({"name": self.names, **columns})


class _File:
    """One shard's tensors as arrays (absolute byte offsets, dtypes), and its bytes: ranged
    reads (`read`: `pread` of a local file, the storage's concurrent requests for a remote
    one). Never a memory map: a file cut short while it is read would kill the process with
    SIGBUS where a read returns fewer bytes."""

    def __init__(self, shard: ShardHeader, storage: Storage) -> None:
        self.shard = shard
        self.name = shard.file
        self.storage = storage
        self.start = shard.begins + shard.data_start
        self.end = shard.ends + shard.data_start
        self.size = shard.file_size
        self.problem: str | None = None  # why nothing of the file can be read
        self._reader: RangeReader | None = None

    @classmethod
    @contextmanager
    def opened(cls, shard: ShardHeader, storage: Storage, local: bool) -> Iterator[_File]:
        """The file with its ranged reads (a local one opened once, through the storage's
        rules; a remote one costs no request here)."""
        file = cls(shard, storage)
        if local:
            try:
                file._reader = storage.open(shard.file)
                file.size = file._reader.size()
            except UnsafeFileError as exc:
                file.problem = f"it {exc.reason}"
            except OSError as exc:
                file.problem = _why(exc)
        try:
            yield file
        finally:
            if file._reader is not None:
                file._reader.close()

    def read_into(
        self, starts: np.ndarray, lengths: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """A local file's ranges in one buffer, one system call each (`pread` for short
        ranges, `preadv` straight into the buffer for long ones): (the buffer, the bytes
        each range brought, where each range starts in it); None for a remote file or when
        a read fails (`read` then says which)."""
        reader = self._reader
        if not isinstance(reader, LocalFile):
            return None
        at = np.zeros(len(lengths), np.int64)
        np.cumsum(lengths[:-1], out=at[1:])
        try:
            if len(lengths) and lengths.max() <= _SMALL_READ:  # windows: `pread` costs least
                pieces = reader.read_many(starts.tolist(), lengths.tolist())
                got = np.fromiter(map(len, pieces), np.int64, len(pieces))
                if (got == lengths).all():
                    return np.frombuffer(b"".join(pieces), np.uint8), got, at
                data = np.zeros(int(lengths.sum()), np.uint8)  # a short read at the end
                for p, piece in zip(at.tolist(), pieces, strict=True):
                    data[p : p + len(piece)] = np.frombuffer(piece, np.uint8)
                return data, got, at
            data = np.empty(int(lengths.sum()), np.uint8)
            into = reader.read_many_into(data.data, at.tolist(), starts.tolist(), lengths.tolist())
            got = np.array(into, np.int64)
        except OSError:
            return None
        return data, got, at

    def read(
        self, starts: list[int], lengths: list[int]
    ) -> tuple[list[bytes | OSError | UnsafeFileError], bool]:
        """The bytes of ranges (each range's error in its place; fewer bytes than asked
        only at the end of the file), and whether every range was read."""
        reader = self._reader
        if reader is None:
            out = self.storage.try_read_ranges(
                [(self.name, a, n) for a, n in zip(starts, lengths, strict=True)]
            )
            return out, all(isinstance(piece, bytes) for piece in out)
        if isinstance(reader, LocalFile):
            try:
                return list(reader.read_many(starts, lengths)), True
            except OSError:
                pass  # the slow way below says which range failed
        out = []
        for at, length in zip(starts, lengths, strict=True):
            try:
                out.append(reader.read_range(at, length))
            except OSError as exc:
                out.append(exc)
        return out, all(isinstance(piece, bytes) for piece in out)

    def lost(self) -> _Found:
        """Every tensor of a file that cannot be read at all, and why."""
        return _Found(unread=self.unread(np.arange(len(self.shard.names)), self.problem))

    def unread(self, rows: np.ndarray, why: str | None) -> list[Unread]:
        """`Unread` records of these entries (non-empty ones): past the end of the file
        when they are (whatever `why`), otherwise unreadable because of `why`."""
        dtypes = self.shard.dtype.values
        codes = self.shard.dtype.codes
        out = []
        for row in rows.tolist():
            start, end = int(self.start[row]), int(self.end[row])
            if end <= start:
                continue
            name, dtype = self.shard.names[row], dtypes[codes[row]]
            if self.problem is None and end > self.size:
                out.append(Unread.past_end(self.name, name, dtype, (start, end), self.size))
            else:
                reason = why or "its bytes could not be read"
                out.append(Unread(self.name, name, dtype, False, reason))
        return out


# -- sampling -----------------------------------------------------------------------------------


def windows_of(
    entry_name: str, file: str, start: int, end: int, itemsize: int, budget: SampleBudget, seed: int
) -> list[tuple[int, int]]:
    """(offset, length) of the sampled windows of one tensor stored at [start, end)."""
    size = end - start
    if size <= budget.per_tensor:
        return [(start, size)]
    offsets = _window_offsets(
        np.array([_hash(seed, file, entry_name)], np.uint64),
        np.array([size], np.int64),
        np.array([itemsize], np.int64),
        budget,
    )[0]
    return [(start + int(at), budget.window_bytes) for at in offsets]


def _hash(seed: int, file: str, name: str) -> int:
    """A tensor's 64-bit key, fixed by the seed, the file and the name, from which
    `_window_offsets` draws (splitmix64) where its windows start: two stdlib checksums side
    by side, a fraction of a microsecond each (300,000 tensors per sample). Not a content
    hash: those are `tensordata.tensor_digest`'s alone."""
    key = f"{seed}\0{file}\0{name}".encode()
    return (zlib.crc32(key) << 32) | zlib.adler32(key)


_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _window_offsets(
    hashes: np.ndarray, sizes: np.ndarray, itemsize: np.ndarray, budget: SampleBudget
) -> np.ndarray:
    """(n, windows) byte offsets of the windows inside each tensor: one uniformly drawn
    element-aligned offset per stratum, from splitmix64 of the tensor's hash."""
    k = np.arange(budget.windows, dtype=np.uint64)
    with np.errstate(over="ignore"):
        z = hashes[:, None] + (k + np.uint64(1)) * _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    uniform = (z >> np.uint64(11)).astype(np.float64) / float(1 << 53)
    stratum = sizes // budget.windows
    stratum -= stratum % itemsize  # every window starts on an element
    room = np.maximum(stratum - budget.window_bytes, 0)
    at = np.floor(uniform * (room + 1)[:, None]).astype(np.int64)
    at -= at % itemsize[:, None]
    return np.arange(budget.windows, dtype=np.int64) * stratum[:, None] + at


@dataclass
class _Group:
    """The tensors of one batch read with one decoder: `sampled` rows (entry indices) with
    their (rows, windows) window offsets, and `whole` rows read whole."""

    decoder: Decoder
    sampled: np.ndarray
    offsets: np.ndarray
    whole: np.ndarray


_BYTES = Decoder(1, "u1", None)


def _decoders(shard: ShardHeader) -> Iterator[tuple[Decoder, np.ndarray]]:
    """(decoder, entry indices) of every dtype of a shard (`U8` `*scales` apart)."""
    codes = shard.dtype.codes
    for code, dtype in enumerate(shard.dtype.values):
        rows = np.flatnonzero(codes == code)
        if not len(rows):
            continue
        if dtype == "U8":  # MXFP4 scales are E8M0 stored as U8: decoded by name
            scales = np.array([shard.names[r].endswith("scales") for r in rows.tolist()], bool)
            parts = [(rows[scales], "x.scales"), (rows[~scales], "x")]
        else:
            parts = [(rows, "x")]
        for part, name in parts:
            if len(part):
                yield decoder_for(name, dtype) or _BYTES, part


def _plan(
    file: _File, rows: np.ndarray, decoder: Decoder, budget: SampleBudget, seed: int
) -> _Group:
    """Which bytes of tensors `rows` (one decoder) `sample` reads."""
    item = decoder.itemsize
    size = file.end[rows] - file.start[rows]
    size -= size % item  # whole elements only
    rows = rows[size > 0]
    size = size[size > 0]
    big = size > budget.per_tensor
    sampled = rows[big]
    names = file.shard.names
    hashes = np.fromiter(
        (_hash(seed, file.name, names[r]) for r in sampled.tolist()), np.uint64, len(sampled)
    )
    offsets = _window_offsets(hashes, size[big], np.full(len(sampled), item, np.int64), budget)
    return _Group(decoder, sampled, offsets + file.start[sampled][:, None], rows[~big])


def _sample(file: _File, budget: SampleBudget, seed: int) -> _Found:
    """Sampled records of one file, a batch of tensors at a time."""
    found = _Found()
    for decoder, rows in _decoders(file.shard):
        for i in range(0, len(rows), _SAMPLE_BATCH):
            group = _plan(file, rows[i : i + _SAMPLE_BATCH], decoder, budget, seed)
            got = _Bytes.fetch(file, group, budget)
            _reduce(file, group, got, budget, found)
    return found


def _reduce(file: _File, group: _Group, got: _Bytes, budget: SampleBudget, found: _Found) -> None:
    """Records of a group's tensors from the bytes read; the tensors some bytes of which
    could not be read are `Unread`."""
    names = file.shard.names
    decoder = group.decoder
    if len(group.sampled):
        where, why = got.locate(group.offsets.ravel(), budget.window_bytes)
        where, why = where.reshape(group.offsets.shape), why.reshape(group.offsets.shape)
        ok = (why < 0).all(axis=1)
        found.unread += _lost(file, group.sampled[~ok], why[~ok].max(axis=1), got)
        if ok.any():
            words = _gather(got.data, where[ok].ravel(), budget.window_bytes)
            words = words.reshape(int(ok.sum()), -1).view(decoder.word)
            found.add([names[r] for r in group.sampled[ok].tolist()], row_records(words, decoder))
    if len(group.whole):
        start = file.start[group.whole]
        length = file.end[group.whole] - start
        length -= length % decoder.itemsize
        where, why = got.locate(start, length)
        ok = why < 0
        found.unread += _lost(file, group.whole[~ok], why[~ok], got)
        if ok.any():
            first, length = where[ok], length[ok]
            index = np.repeat(first - np.concatenate([[0], np.cumsum(length)[:-1]]), length)
            index += np.arange(int(length.sum()), dtype=np.int64)
            words = got.data[index].view(decoder.word)
            starts = np.concatenate([[0], np.cumsum(length // decoder.itemsize)[:-1]])
            records = segment_records(words, starts.astype(np.int64), decoder)
            found.add([names[r] for r in group.whole[ok].tolist()], records)


def _gather(data: np.ndarray, where: np.ndarray, width: int) -> np.ndarray:
    """(len(where), width) bytes of `data` from each position; a view when they are laid
    end to end already (windows read one request each), a copy otherwise."""
    n = len(where)
    if n and where[0] == 0 and len(data) >= n * width:
        laid = np.arange(0, n * width, width, dtype=np.int64)
        if np.array_equal(where, laid):
            return data[: n * width].reshape(n, width)
    return sliding_window_view(data, width)[where]


def _lost(file: _File, rows: np.ndarray, problems: np.ndarray, got: _Bytes) -> list[Unread]:
    out: list[Unread] = []
    for problem in np.unique(problems).tolist():
        mine = rows[problems == problem]
        out += file.unread(mine, got.why(problem))
    return out


_PAST_END = 0  # problem code: past the end of what the file holds


@dataclass
class _Bytes:
    """The bytes of one file a batch reads, and where each range is in `data`: the pieces
    read (one buffer for a local file) or fetched from a remote store, laid end to end."""

    data: np.ndarray
    starts: np.ndarray  # file offset of each piece (sorted)
    got: np.ndarray  # bytes each piece brought
    at: np.ndarray  # where each piece is in `data`
    problems: tuple[str, ...] = ("past the end of the file",)

    @classmethod
    def fetch(cls, file: _File, group: _Group, budget: SampleBudget) -> _Bytes:
        """Fetch a group's windows and whole tensors, neighbours joined into one request."""
        wstart = group.offsets.ravel()
        starts = np.concatenate([wstart, file.start[group.whole]])
        ends = np.concatenate([wstart + budget.window_bytes, file.end[group.whole]])
        keep = ends <= file.size  # bytes past the end are not asked for
        starts, ends = starts[keep], ends[keep]
        first, last = _coalesce(starts, ends)
        direct = file.read_into(first, last - first)
        if direct is not None:
            data, got, at = direct
            return cls(data, first, got, at)
        pieces, complete = file.read(first.tolist(), (last - first).tolist())
        refused = not complete and len(pieces) > 64 and not any(type(p) is bytes for p in pieces)
        if not complete and not refused:  # a failed request's ranges again, one by one:
            first, pieces = _one_by_one(file, starts, ends, first, last, pieces)  # only bad fail
        problems = ["past the end of the file"]
        blobs: list[bytes] = []
        if complete:
            blobs = cast(list[bytes], pieces)
            got = np.fromiter(map(len, blobs), np.int64, len(blobs))
        else:
            lengths = []
            for piece in pieces:
                if isinstance(piece, bytes):
                    blobs.append(piece)
                    lengths.append(len(piece))
                else:
                    problems.append(_reason(piece))
                    lengths.append(1 - len(problems))  # negative: which problem
            got = np.array(lengths, np.int64)
        at = np.concatenate([[0], np.cumsum(np.maximum(got, 0))[:-1]]).astype(np.int64)
        data = np.frombuffer(b"".join(blobs), np.uint8) if blobs else np.zeros(0, np.uint8)
        return cls(data, first, got, at, tuple(problems))

    def locate(
        self, offsets: np.ndarray, length: np.ndarray | int
    ) -> tuple[np.ndarray, np.ndarray]:
        """Per range (file offset, length): its position in `data` and -1, or 0 and the
        index of its problem (`why`)."""
        end = offsets + length
        if len(self.starts) == 0:  # every range asked for lies past the end of the file
            none = np.zeros(np.shape(offsets), np.int64)
            return none, none + _PAST_END
        piece = np.searchsorted(self.starts, offsets, side="right") - 1
        inside = piece >= 0
        piece = np.maximum(piece, 0)
        got = self.got[piece]
        ok = inside & (got >= 0) & (end <= self.starts[piece] + np.maximum(got, 0))
        problem = np.where(got < 0, -got, _PAST_END)
        return np.where(ok, self.at[piece] + offsets - self.starts[piece], 0), np.where(
            ok, -1, problem
        )

    def why(self, problem: int) -> str | None:
        return None if problem == _PAST_END else self.problems[problem]


def _one_by_one(
    file: _File,
    starts: np.ndarray,
    ends: np.ndarray,
    first: np.ndarray,
    last: np.ndarray,
    pieces: list[bytes | OSError | UnsafeFileError],
) -> tuple[np.ndarray, list[bytes | OSError | UnsafeFileError]]:
    """The pieces with each failed one replaced by its ranges read one at a time, so that
    a bad sector or a refused range costs only the tensors it holds (piece starts stay
    sorted)."""
    order = np.argsort(starts, kind="stable")
    starts, ends = starts[order], ends[order]
    out_first: list[int] = []
    out: list[bytes | OSError | UnsafeFileError] = []
    for i, piece in enumerate(pieces):
        if isinstance(piece, bytes):
            out_first.append(int(first[i]))
            out.append(piece)
            continue
        lo, hi = np.searchsorted(starts, [first[i], last[i]], side="left")
        a, b = starts[lo:hi], ends[lo:hi]
        again, _ = file.read(a.tolist(), (b - a).tolist())
        out_first += a.tolist()
        out += again
    return np.array(out_first, np.int64), out


def _why(exc: OSError) -> str:
    return exc.strerror or str(exc) or type(exc).__name__


def _coalesce(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Disjoint [start, end) ranges (any order) joined where the gap between neighbours is
    at most `_COALESCE_GAP`, into pieces of at most `_COALESCE_MAX` bytes (a range is never
    cut): the pieces' starts (sorted) and ends."""
    if not len(starts):
        return starts, ends
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
    reach = np.maximum.accumulate(e)
    new = np.ones(len(s), bool)
    new[1:] = s[1:] > reach[:-1] + _COALESCE_GAP
    run = np.cumsum(new) - 1
    base = s[new][run]  # start of each range's run
    part = (s - base) // _COALESCE_MAX  # long runs cut into pieces
    new[1:] |= (run[1:] != run[:-1]) | (part[1:] != part[:-1])
    first = np.flatnonzero(new)
    return s[first], np.maximum.reduceat(e, first)


# -- full -----------------------------------------------------------------------------------


def _full_local(file: _File) -> _Found:
    """Every tensor of a local file, read block by block into one buffer (`preadv`, no copy).
    A tensor whose read fails, or comes back short because the file shrank since the scan,
    is unread with the reason; the other tensors are read."""
    shard, reader = file.shard, file._reader
    assert isinstance(reader, LocalFile)
    found = _Found(unread=file.unread(np.flatnonzero(file.end > file.size), None))
    buffer = np.empty(_FULL_BLOCK, np.uint8)
    names, rows = [], []
    for row in np.flatnonzero(file.end <= file.size).tolist():
        start, end = int(file.start[row]), int(file.end[row])
        if end <= start:
            continue
        dtype = shard.dtype.values[shard.dtype.codes[row]]
        acc = Accumulator(decoder_for(shard.names[row], dtype))
        item = acc.decoder.itemsize if acc.decoder is not None else 1
        block = _FULL_BLOCK - _FULL_BLOCK % item
        why = None
        for at in range(start, end, block):
            length = min(block, end - at)
            try:
                reader.read_into(buffer.data[:length], at)
            except OSError as exc:  # FileShrankError: it got shorter while it was read
                why = _why(exc)
                break
            acc.add(buffer[:length])
        if why is not None:
            found.unread += file.unread(np.array([row]), why)
            continue
        names.append(shard.names[row])
        rows.append(acc.partial())
    if rows:
        found.add(names, _columns(rows))
    return found


def _columns(rows: list[dict[str, float | int | bool]]) -> Records:
    return {c: np.array([r[c] for r in rows]) for c in PARTIAL}


def _full_remote(file: _File) -> _Found:
    """Every tensor of a remote file: the spans its tensors cover streamed in
    `_REMOTE_BLOCK` ranged reads, `_REMOTE_IN_FLIGHT` at a time, each block's bytes handed
    to the tensors it holds in file order; a tensor's record is made as soon as its last
    block is in (bounded memory)."""
    shard = file.shard
    rows = np.flatnonzero((file.end > file.start) & (file.end <= file.size))
    found = _Found(unread=file.unread(np.flatnonzero(file.end > file.size), None))
    if not len(rows):
        return found
    first, last = _coalesce(file.start[rows], file.end[rows])
    blocks = [
        (at, min(at + _REMOTE_BLOCK, end))
        for start, end in zip(first.tolist(), last.tolist(), strict=True)
        for at in range(start, end, _REMOTE_BLOCK)
    ]
    block_start = np.array([a for a, _ in blocks], np.int64)
    block_end = np.array([b for _, b in blocks], np.int64)
    # Each tensor's blocks: from the one holding its first byte to the one holding its last.
    lo = np.searchsorted(block_end, file.start[rows], side="right")
    hi = np.searchsorted(block_start, file.end[rows], side="left") - 1
    pieces: list[list[int]] = [[] for _ in blocks]
    for row, k0, k1 in zip(rows.tolist(), lo.tolist(), hi.tolist(), strict=True):
        for k in range(k0, k1 + 1):
            pieces[k].append(row)
    accs: dict[int, Accumulator] = {}
    failed: dict[int, str] = {}
    names, records = [], []
    for i in range(0, len(blocks), _REMOTE_IN_FLIGHT):
        batch = blocks[i : i + _REMOTE_IN_FLIGHT]
        got, _ = file.read([a for a, _ in batch], [b - a for a, b in batch])
        for k, ((a, b), piece) in enumerate(zip(batch, got, strict=True), start=i):
            for row in pieces[k]:
                if row in failed:
                    continue
                start, end = int(file.start[row]), int(file.end[row])
                if not isinstance(piece, bytes) or len(piece) < min(end, b) - a:
                    failed[row] = _reason(piece)
                    accs.pop(row, None)
                    continue
                acc = accs.get(row)
                if acc is None:
                    dtype = shard.dtype.values[shard.dtype.codes[row]]
                    acc = accs[row] = Accumulator(decoder_for(shard.names[row], dtype))
                acc.add(memoryview(piece)[max(start, a) - a : min(end, b) - a])
                if end <= b:  # its last block
                    names.append(shard.names[row])
                    records.append(accs.pop(row).partial())
    for row, why in failed.items():
        found.unread += file.unread(np.array([row]), why)
    if records:
        found.add(names, _columns(records))
    return found


def _reason(piece: bytes | OSError | UnsafeFileError) -> str:
    if isinstance(piece, UnsafeFileError):
        return f"it {piece.reason}"
    if isinstance(piece, OSError):
        return _why(piece)
    return f"the read brought {len(piece):,} bytes, fewer than asked"
