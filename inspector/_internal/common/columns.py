"""Columns for the scanned model: read-only numpy arrays and coded columns of repeated values.

A checkpoint may hold a million tensors. Keeping one Python object per tensor and field (an
int per offset, a tuple per shape) costs hundreds of bytes per tensor, so the scanned model
keeps numbers in numpy arrays and repeated values (dtypes, shapes, file names) once each, with
a small integer code per row (`Coded`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import count as counter
from typing import Generic, TypeVar

import numpy as np

__all__ = ["Coded", "code_table", "frozen", "int64s"]

T = TypeVar("T", bound=Hashable)

_INT64_MIN, _INT64_MAX = int(np.iinfo(np.int64).min), int(np.iinfo(np.int64).max)


def frozen(array: np.ndarray) -> np.ndarray:
    """`array`, made read-only (records holding it are immutable)."""
    array.flags.writeable = False
    return array


def code_table() -> defaultdict[T, int]:
    """A dict that gives each key it does not hold yet the next code (0, 1, ...), so that
    `map(table.__getitem__, values)` codes values in first-seen order in one C-level pass.
    The codes come from a counter, not from the dict's own `__len__`: a dict whose default
    factory is its own bound method is a reference cycle, which only the collector frees, and
    `check` freezes what the scan left (`cli.args.settled`): every shard's codings stayed
    until the end (a header of 200,000 distinct shapes: 38 MB more at the peak)."""
    return defaultdict(counter().__next__)


def int64s(values: Iterable[int], count: int = -1) -> np.ndarray:
    """A read-only int64 array. Values past int64 (only a hostile header has them; it is
    already a finding) are clamped instead of raising. `np.fromiter` with a known count is
    about twice as fast as `np.asarray` on a list."""
    values = values if isinstance(values, list | tuple) else list(values)
    count = len(values) if count < 0 else count
    try:
        array = np.fromiter(values, dtype=np.int64, count=count)
    except (OverflowError, TypeError):
        array = np.asarray(
            [min(max(int(v), _INT64_MIN), _INT64_MAX) for v in values], dtype=np.int64
        )
    return frozen(array)


@dataclass(frozen=True, slots=True, eq=False)
class Coded(Generic[T]):
    """A column of repeated values: `values` holds each distinct value once, `codes` one
    int32 per row into it. Iterating or indexing gives the values themselves."""

    codes: np.ndarray
    values: tuple[T, ...]

    @classmethod
    def encode(cls, values: Iterable[T], count: int = -1) -> Coded[T]:
        """Code `values` in first-seen order. A dict pass in C: a value the dict does not
        have yet gets the dict's current length as its code."""
        if count < 0:
            values = list(values)
            count = len(values)
        index: defaultdict[T, int] = code_table()
        codes = np.fromiter(map(index.__getitem__, values), dtype=np.int32, count=count)
        return cls(frozen(codes), tuple(index))

    @classmethod
    def of(cls, codes: Sequence[int] | np.ndarray, values: Sequence[T]) -> Coded[T]:
        return cls(frozen(np.asarray(codes, dtype=np.int32)), tuple(values))

    @classmethod
    def concat(cls, columns: Sequence[Coded[T]]) -> Coded[T]:
        """One column of all rows of `columns`, with one merged table of values."""
        index: dict[T, int] = {}
        parts = []
        for column in columns:
            remap = np.fromiter(
                (index.setdefault(v, len(index)) for v in column.values),
                dtype=np.int32,
                count=len(column.values),
            )
            parts.append(remap[column.codes] if len(remap) else column.codes)
        codes = np.concatenate(parts) if parts else np.zeros(0, np.int32)
        return cls(frozen(codes.astype(np.int32, copy=False)), tuple(index))

    def __len__(self) -> int:
        return len(self.codes)

    def __getitem__(self, row: int) -> T:
        return self.values[self.codes[row]]

    def __iter__(self) -> Iterator[T]:
        return iter(self.tolist())

    def tolist(self) -> list[T]:
        return list(map(self.values.__getitem__, self.codes.tolist()))

    def used(self) -> tuple[T, ...]:
        """The values some row has, in table order."""
        present = np.zeros(len(self.values), dtype=bool)
        present[self.codes] = True
        return tuple(v for v, p in zip(self.values, present.tolist(), strict=True) if p)

    def take(self, rows: np.ndarray) -> Coded[T]:
        """The rows `rows` (same table of values)."""
        return Coded(frozen(self.codes[rows]), self.values)
