"""Which bytes of each tensor the value statistics read, and reading them.

`full` streams every byte of every tensor; `sample` reads `windows` windows of
`window_bytes` spread over each tensor (stratified: the tensor is cut into `windows` equal
strata and one window is placed at a random offset inside each, seeded by the tensor's name
and `seed`, so a run is reproducible). A tensor no larger than the whole budget is read
whole. What that guarantees is in docs/values.md.

Local files are read through `TensorData` (memory maps: a window is a view, nothing is
copied). Remote files go through the checkpoint's storage: sampled windows as ranged reads
(neighbouring windows of small tensors coalesced into one request), full reads in blocks of
at most `_REMOTE_BLOCK` bytes, a bounded number in flight. Files are read in parallel
(`workers` threads; numpy releases the GIL for the arithmetic).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Literal

import numpy as np
import xxhash

from inspector.model import ScannedCheckpoint
from inspector.safetensors_header import ShardHeader
from inspector.storage import Storage
from inspector.tensordata import TensorData
from inspector.values.decode import decoder_for
from inspector.values.stats import Accumulator

__all__ = ["Mode", "SampleBudget", "read_accumulators"]

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


def read_accumulators(
    scanned: ScannedCheckpoint,
    mode: Mode,
    *,
    budget: SampleBudget = SampleBudget(),
    seed: int = 0,
    workers: int | None = None,
) -> dict[str, Accumulator]:
    """One accumulator per tensor name over every file holding (a chunk of) it."""
    local = scanned.local_path is not None
    workers = workers or (os.cpu_count() or 1 if local else 8)
    shards = [s for s in scanned.shards if s.names]

    out: dict[str, Accumulator] = {}
    with TensorData(scanned) as data, ThreadPoolExecutor(max(1, min(workers, len(shards)))) as pool:

        def one(shard: ShardHeader) -> dict[str, Accumulator]:
            entries = list(_entries(shard))
            if local:
                return _read_local(data, shard, entries, mode, budget, seed)
            storage = scanned.location.storage
            return _read_remote(storage, shard.file, entries, mode, budget, seed)

        for found in pool.map(one, shards):
            for name, acc in found.items():
                if name in out:
                    out[name].merge(acc)
                else:
                    out[name] = acc
    return out


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
    rng = np.random.default_rng(xxhash.xxh3_64_intdigest(f"{seed}\0{file}\0{entry_name}".encode()))
    stratum = size // budget.windows
    width = min(budget.window_bytes, stratum - stratum % itemsize or itemsize)
    out = []
    for i in range(budget.windows):
        room = max(stratum - width, 0)
        at = int(rng.integers(0, room + 1)) if room else 0
        at -= at % itemsize
        out.append((start + i * stratum + at, width))
    return out


def _width(entry: _Entry) -> int:
    decoder = decoder_for(entry.name, entry.dtype)
    return decoder.itemsize if decoder is not None else 1


def _read_local(
    data: TensorData,
    shard: ShardHeader,
    entries: Sequence[_Entry],
    mode: Mode,
    budget: SampleBudget,
    seed: int,
) -> dict[str, Accumulator]:
    out: dict[str, Accumulator] = {}
    known = {e.name for e in entries}
    for name, dtype, _shape, view in data.shard_entries(shard):
        if not len(view) or name not in known:
            continue
        acc = Accumulator(decoder_for(name, dtype))
        item = acc.decoder.itemsize if acc.decoder is not None else 1
        if mode == "full":
            block = _FULL_BLOCK - _FULL_BLOCK % item
            for at in range(0, len(view), block):
                acc.add(view[at : at + block])
        else:
            for at, length in windows_of(name, shard.file, 0, len(view), item, budget, seed):
                acc.add(view[at : at + length])
        _merge_into(out, name, acc)
    return out


def _merge_into(out: dict[str, Accumulator], name: str, acc: Accumulator) -> None:
    if name in out:
        out[name].merge(acc)
    else:
        out[name] = acc


def _read_remote(
    storage: Storage,
    file: str,
    entries: Sequence[_Entry],
    mode: Mode,
    budget: SampleBudget,
    seed: int,
) -> dict[str, Accumulator]:
    out: dict[str, Accumulator] = {}
    if mode == "full":
        for entry in entries:
            acc = Accumulator(decoder_for(entry.name, entry.dtype))
            item = _width(entry)
            block = _REMOTE_BLOCK - _REMOTE_BLOCK % item
            ranges = [
                (file, at, min(block, entry.end - at))
                for at in range(entry.start, entry.end, block)
            ]
            try:
                for i in range(0, len(ranges), _REMOTE_IN_FLIGHT):
                    for data in storage.read_ranges(ranges[i : i + _REMOTE_IN_FLIGHT]):
                        acc.add(data)
            except OSError:
                continue  # unreadable: the tensor gets no statistics
            _merge_into(out, entry.name, acc)
        return out
    wanted: list[tuple[_Entry, int, int]] = [
        (entry, at, length)
        for entry in entries
        for at, length in windows_of(
            entry.name, file, entry.start, entry.end, _width(entry), budget, seed
        )
    ]
    wanted.sort(key=lambda w: w[1])
    groups = _coalesce([(at, length) for _e, at, length in wanted])
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
    for entry, at, length in wanted:
        j = int(np.searchsorted(starts, at, side="right")) - 1
        if j < 0:
            continue
        blob = fetched[starts[j]]
        piece = blob[at - starts[j] : at - starts[j] + length]
        if len(piece) != length:
            continue
        acc = out.get(entry.name) or Accumulator(decoder_for(entry.name, entry.dtype))
        acc.add(piece)
        out[entry.name] = acc
    return out


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
