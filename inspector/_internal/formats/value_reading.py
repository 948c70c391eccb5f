"""Which bytes of each tensor the value statistics read, and reading them.

`full` streams every byte of every tensor; `sample` reads `windows` windows of
`window_bytes` spread over each tensor (stratified: the tensor is cut into `windows` equal
strata and one window is placed at a random element-aligned offset inside each, drawn from
a hash of `seed`, the file and the tensor's name, so a run is reproducible). A tensor no
larger than the whole budget is read whole. What that guarantees is in docs/values.md.

Local files are read through `TensorData` (memory maps: a window is a view, nothing is
copied). Remote files go through the checkpoint's storage: sampled windows as ranged reads
(neighbouring windows of small tensors coalesced into one request), full reads in blocks of
at most `_REMOTE_BLOCK` bytes, a bounded number in flight. Local files are read in parallel
(`workers` threads; numpy releases the GIL for the arithmetic); remote files one after another,
each with the storage's own concurrent ranged reads (`read_ranges` called from several threads
on one remote storage hung).
"""

from __future__ import annotations

import os
from bisect import bisect_right
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Literal

import numpy as np
import pandas as pd
import xxhash

from inspector._internal.checkpoint.scanned import ScannedCheckpoint
from inspector._internal.formats.safetensors import ShardHeader
from inspector._internal.formats.tensordata import TensorData
from inspector._internal.formats.value_decode import Decoder, decoder_for
from inspector._internal.formats.value_segments import PARTIAL, segment_records
from inspector._internal.formats.value_stats import Accumulator
from inspector._internal.storage import Storage

__all__ = ["Mode", "SampleBudget", "read_records", "windows_of"]

Mode = Literal["sample", "full"]

_FULL_BLOCK = 16 << 20  # bytes of a local tensor handed to the accumulator at once
_REMOTE_BLOCK = 8 << 20  # bytes per remote request in full mode
_REMOTE_IN_FLIGHT = 8  # remote requests per file at once (bounded memory)
_COALESCE_GAP = 4096  # sampled windows closer than this are fetched in one request
_COALESCE_MAX = 1 << 20
_BATCH = 256  # ranges handed to the storage at once


@dataclass(frozen=True)
class SampleBudget:
    """What `sample` reads of each tensor: `windows` windows of `window_bytes` bytes."""

    windows: int = 8
    window_bytes: int = 256

    def __post_init__(self) -> None:
        if self.windows < 1 or self.window_bytes < 8 or self.window_bytes % 8:
            raise ValueError(
                f"sample budget {self.windows} x {self.window_bytes} bytes: expected at least "
                "one window of a multiple of 8 bytes"
            )

    @property
    def per_tensor(self) -> int:
        return self.windows * self.window_bytes


@dataclass(frozen=True)
class _Entry:
    name: str
    dtype: str
    start: int  # absolute offset in the file
    end: int


def read_records(
    scanned: ScannedCheckpoint,
    mode: Mode,
    *,
    budget: SampleBudget = SampleBudget(),
    seed: int = 0,
    workers: int | None = None,
) -> pd.DataFrame:
    """Partial records (`segments.PARTIAL` columns and `name`), one per tensor and file
    holding (a chunk of) it; records of one name add up (`segments.finish`)."""
    local = scanned.local_path is not None
    # Remote: one file at a time, each read with the storage's own concurrent ranged reads
    workers = workers or (os.cpu_count() or 1) if local else 1
    shards = [s for s in scanned.shards if s.names]
    storage = scanned.location.storage
    frames: list[pd.DataFrame] = []
    with TensorData(scanned) as data, ThreadPoolExecutor(max(1, min(workers, len(shards)))) as pool:

        def one(shard: ShardHeader) -> pd.DataFrame:
            entries = list(_entries(shard))
            if mode == "full":
                if local:
                    return _full_local(data, shard, {e.name for e in entries})
                return _full_remote(storage, shard.file, entries)
            buf = data.local_bytes(shard.file, scattered=True) if local else None
            return _sample(storage, shard.file, buf, entries, budget, seed)

        frames = [f for f in pool.map(one, shards) if len(f)]
    columns = ["name", *PARTIAL]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=columns)


def _entries(shard: ShardHeader) -> Iterator[_Entry]:
    base = shard.data_start
    for name, dtype, b, e in zip(
        shard.names, shard.dtypes, shard.begins.tolist(), shard.ends.tolist(), strict=True
    ):
        if e > b:
            yield _Entry(name, dtype, base + b, base + e)


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
    return xxhash.xxh3_64_intdigest(f"{seed}\0{file}\0{name}".encode())


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


_SAMPLE_BATCH = 4096  # tensors gathered at once (bounded memory: 4096 x the budget)


def _sample(
    storage: Storage,
    file: str,
    buf: np.ndarray | None,
    entries: Sequence[_Entry],
    budget: SampleBudget,
    seed: int,
) -> pd.DataFrame:
    """Sampled records of one file: windows gathered from the memory map (local) or fetched
    with coalesced ranged reads (remote), reduced per tensor by `segment_records`."""
    groups: dict[int, tuple[Decoder, list[_Entry]]] = {}
    for entry in entries:
        decoder = decoder_for(entry.name, entry.dtype) or _BYTES
        groups.setdefault(id(decoder), (decoder, []))[1].append(entry)
    frames = []
    for decoder, members in groups.values():
        for i in range(0, len(members), _SAMPLE_BATCH):
            batch = members[i : i + _SAMPLE_BATCH]
            if buf is not None:
                batch = [e for e in batch if e.end <= len(buf)]
            ranges = _ranges(file, batch, decoder.itemsize, budget, seed)
            pieces = _gather_local(buf, ranges) if buf is not None else None
            if pieces is None:
                pieces = _gather_remote(storage, file, ranges)
            kept = [j for j, p in enumerate(pieces) if len(p)]
            if not kept:
                continue
            raw = np.concatenate([pieces[j] for j in kept])
            lengths = np.array([len(pieces[j]) // decoder.itemsize for j in kept], np.int64)
            starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
            words = raw.view(decoder.word)
            frame = segment_records(words, starts, decoder)
            frame.insert(0, "name", [batch[j].name for j in kept])
            frames.append(frame)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def _ranges(
    file: str, batch: Sequence[_Entry], itemsize: int, budget: SampleBudget, seed: int
) -> list[list[tuple[int, int]]]:
    """Per tensor, its (offset, length) windows in the file, whole elements only."""
    sizes = np.array([(e.end - e.start) - (e.end - e.start) % itemsize for e in batch], np.int64)
    sampled = sizes > budget.per_tensor
    out: list[list[tuple[int, int]]] = [
        [(e.start, int(n))] for e, n in zip(batch, sizes.tolist(), strict=True)
    ]
    rows = np.flatnonzero(sampled)
    if len(rows):
        hashes = np.array([_hash(seed, file, batch[r].name) for r in rows.tolist()], np.uint64)
        offsets = _window_offsets(
            hashes, sizes[rows], np.full(len(rows), itemsize, np.int64), budget
        )
        for r, row in zip(rows.tolist(), offsets.tolist(), strict=True):
            start = batch[r].start
            out[r] = [(start + at, budget.window_bytes) for at in row]
    return out


def _gather_local(buf: np.ndarray, ranges: list[list[tuple[int, int]]]) -> list[np.ndarray]:
    """The bytes of each tensor's windows, copied out of the memory map in one gather."""
    flat = [w for windows in ranges for w in windows]
    if not flat:
        return [np.zeros(0, np.uint8) for _ in ranges]
    at = np.array([w[0] for w in flat], np.int64)
    length = np.array([w[1] for w in flat], np.int64)
    index = np.repeat(at - np.concatenate([[0], np.cumsum(length)[:-1]]), length)
    index += np.arange(int(length.sum()), dtype=np.int64)
    data = buf[index]
    per_tensor = np.array([sum(n for _a, n in windows) for windows in ranges], np.int64)
    return np.split(data, np.cumsum(per_tensor)[:-1])


def _gather_remote(
    storage: Storage, file: str, ranges: list[list[tuple[int, int]]]
) -> list[np.ndarray]:
    """The same bytes fetched with ranged reads, neighbouring windows in one request; a
    tensor whose windows cannot all be read gets none."""
    flat = sorted({w for windows in ranges for w in windows})
    groups = _coalesce(flat)
    fetched: dict[int, bytes] = {}
    for i in range(0, len(groups), _BATCH):
        batch = groups[i : i + _BATCH]
        try:
            blobs = storage.read_ranges([(file, at, length) for at, length in batch])
        except OSError:
            continue
        for (at, _length), blob in zip(batch, blobs, strict=True):
            fetched[at] = blob
    starts = sorted(fetched)
    out = []
    for windows in ranges:
        parts: list[bytes] = []
        for at, length in windows:
            j = bisect_right(starts, at) - 1
            piece = fetched[starts[j]][at - starts[j] : at - starts[j] + length] if j >= 0 else b""
            if len(piece) != length:
                parts = []
                break
            parts.append(piece)
        out.append(np.frombuffer(b"".join(parts), np.uint8))
    return out


_BYTES = Decoder(1, "u1", None)


def _full_local(data: TensorData, shard: ShardHeader, known: set[str]) -> pd.DataFrame:
    rows = []
    for name, dtype, _shape, view in data.shard_entries(shard):
        if not len(view) or name not in known:
            continue
        acc = Accumulator(decoder_for(name, dtype))
        item = acc.decoder.itemsize if acc.decoder is not None else 1
        block = _FULL_BLOCK - _FULL_BLOCK % item
        for at in range(0, len(view), block):
            acc.add(view[at : at + block])
        rows.append({"name": name, **acc.partial()})
    return pd.DataFrame(rows)


def _full_remote(storage: Storage, file: str, entries: Sequence[_Entry]) -> pd.DataFrame:
    rows = []
    for entry in entries:
        acc = Accumulator(decoder_for(entry.name, entry.dtype))
        item = acc.decoder.itemsize if acc.decoder is not None else 1
        block = _REMOTE_BLOCK - _REMOTE_BLOCK % item
        ranges = [
            (file, at, min(block, entry.end - at)) for at in range(entry.start, entry.end, block)
        ]
        try:
            for i in range(0, len(ranges), _REMOTE_IN_FLIGHT):
                for blob in storage.read_ranges(ranges[i : i + _REMOTE_IN_FLIGHT]):
                    acc.add(blob)
        except OSError:
            continue  # unreadable: the tensor gets no statistics
        rows.append({"name": entry.name, **acc.partial()})
    return pd.DataFrame(rows)


def _coalesce(ranges: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sorted (offset, length) ranges joined where the gap between them is small."""
    out: list[tuple[int, int]] = []
    for at, length in ranges:
        if out:
            first, size = out[-1]
            if at - (first + size) <= _COALESCE_GAP and at + length - first <= _COALESCE_MAX:
                out[-1] = (first, max(size, at + length - first))
                continue
        out.append((at, length))
    return out
