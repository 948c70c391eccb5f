"""Per-tensor value statistics, accumulated block by block so memory stays bounded.

An `Accumulator` decodes raw bytes (`value_decode`) and keeps partial records that add up
across chunks and files (`value_segments.finish`). What is exact and what is subsampled, and
why the work is cut in cache-sized pieces: docs/architecture.md, "formats/".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from inspector._internal.formats.value_decode import Decoder
from inspector._internal.formats.value_segments import finish

__all__ = ["Accumulator", "TensorStats"]

if TYPE_CHECKING:
    pass

_PIECE = 1 << 16  # elements per pass: 256 KiB of float32, inside L2
_SUBSAMPLE = 256  # words per block kept for the signature shares
_WORDS_KEPT = 8192  # words per tensor at most


@dataclass(frozen=True)
class TensorStats:
    """What the values of one tensor look like (statistics over the finite elements read)."""

    elements: int  # elements read (all of them in full mode)
    decoded: bool
    min: float
    max: float
    mean: float
    std: float
    absmax: float
    zero_frac: float
    nan: int
    inf: int
    tiny_frac: float  # share of subnormal (non-zero) values
    huge_frac: float  # share of magnitudes no real weight reaches
    repeat_frac: float  # share of the most common non-zero raw word
    absmin: float  # smallest non-zero magnitude (among the subsampled words)
    all_zero: bool  # every byte read is zero


@dataclass
class Accumulator:
    decoder: Decoder | None
    count: int = 0
    finite: int = 0
    total: float = 0.0
    squares: float = 0.0
    low: float = float("inf")
    high: float = float("-inf")
    zeros: int = 0
    nan: int = 0
    inf: int = 0
    nonzero_bytes: bool = False
    words: list[np.ndarray] = field(default_factory=list)
    kept: int = 0

    def add(self, data: memoryview | bytes | np.ndarray) -> None:
        """Take the raw bytes of whole elements of the tensor."""
        raw = np.frombuffer(data, dtype=np.uint8)
        if self.decoder is not None:
            size = self.decoder.itemsize
            raw = raw[: len(raw) - len(raw) % size]
        if self.decoder is None or self.decoder.decode is None:
            # Undecoded: elements are the dtype's words (bytes for an unknown dtype), as in
            # sample mode.
            words = raw if self.decoder is None else raw.view(self.decoder.word)
            self.count += len(words)
            self.nonzero_bytes = self.nonzero_bytes or bool(raw.any())
            self._keep(words)
            return
        words = raw.view(self.decoder.word)
        self._keep(words)
        for start in range(0, len(words), _PIECE):
            self._piece(words[start : start + _PIECE])

    def _keep(self, words: np.ndarray) -> None:
        if self.kept >= _WORDS_KEPT or not len(words):
            return
        step = max(1, len(words) // _SUBSAMPLE)
        sub = words[::step][: _WORDS_KEPT - self.kept].copy()
        self.words.append(sub)
        self.kept += len(sub)

    def _piece(self, words: np.ndarray) -> None:
        assert self.decoder is not None and self.decoder.decode is not None
        x = self.decoder.decode(words)
        self.count += len(x)
        with np.errstate(over="ignore", invalid="ignore"):
            total = float(x.sum(dtype=np.float64 if x.dtype == np.float64 else np.float32))
        with np.errstate(over="ignore", invalid="ignore"):
            squares = float(np.dot(x, x))
        if not (np.isfinite(total) and np.isfinite(squares)):
            nan = np.isnan(x)
            inf = np.isinf(x)
            self.nan += int(np.count_nonzero(nan))
            self.inf += int(np.count_nonzero(inf))
            x = x[~(nan | inf)]
            # float64 sums: finite values too large for float32 squares must not become Inf
            wide = x.astype(np.float64)
            total, squares = float(wide.sum()), float(np.dot(wide, wide))
        if not len(x):
            return
        self.finite += len(x)
        self.total += total
        self.squares += squares
        self.zeros += len(x) - int(np.count_nonzero(x))
        self.low = min(self.low, float(x.min()))
        self.high = max(self.high, float(x.max()))

    def partial(self) -> dict[str, float | int | bool]:
        """This tensor's partial record (the columns of
        `inspector._internal.formats.value_segments.PARTIAL`)."""
        words = np.concatenate(self.words) if self.words else np.zeros(0, np.uint8)
        dec = self.decoder
        decoded = dec is not None and dec.decode is not None
        record: dict[str, float | int | bool] = {
            "elements": self.count,
            "decoded": decoded and self.count > 0,
            "finite": self.finite,
            "total": self.total,
            "squares": self.squares,
            "low": self.low,
            "high": self.high,
            "zeros": self.zeros,
            "nan": self.nan,
            "inf": self.inf,
            "nonzero_bytes": self.nonzero_bytes,
            "sub_n": 0,
            "tiny_n": 0,
            "huge_n": 0,
            "absmin": np.inf,
            "repeat": _repeat_share(words),
        }
        if dec is not None and dec.decode is not None and len(words):
            with np.errstate(invalid="ignore", over="ignore"):
                x = dec.decode(words).astype(np.float64)
            finite = np.isfinite(x)
            # NaN/Inf words are reported as such, not as a repeated pattern
            size = np.abs(x[finite])
            nonzero = size[size > 0]
            record.update(
                sub_n=len(size),
                tiny_n=int(np.count_nonzero((size > 0) & (size < dec.tiny))),
                huge_n=int(np.count_nonzero(size >= dec.huge)),
                absmin=float(nonzero.min()) if len(nonzero) else np.inf,
                repeat=_repeat_share(words[finite]),
            )
        return record

    def result(self) -> TensorStats:
        """The statistics of everything added (as one row of `ckpt.values`)."""
        import pandas as pd  # here: `check` without `--values` imports this module

        row = finish(pd.DataFrame([self.partial()])).iloc[0]
        return TensorStats(**{f: row[f] for f in TensorStats.__dataclass_fields__})


def _repeat_share(words: np.ndarray) -> float:
    """Share of the most common non-zero word among `words` (0 when all are zero)."""
    if not len(words):
        return 0.0
    values, counts = np.unique(words, return_counts=True)
    counts = counts[values != 0]
    return float(counts.max() / len(words)) if len(counts) else 0.0
