"""Statistics of many short tensors at once: the sampled windows of every tensor of a shard
(or its small tensors read whole) laid end to end, reduced per segment with numpy's
`reduceat`. This is what makes `sample` cost microseconds per tensor instead of a Python
loop's hundreds (300,000 tensors in seconds).

A segment's record is partial (sums and counts), so records of one tensor from several
files (DCP chunks) add up; `finish` turns merged records into the statistics columns.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from inspector._internal.formats.value_decode import Decoder

__all__ = ["PARTIAL", "finish", "segment_records"]

# Partial record columns and how records of one tensor merge.
PARTIAL: dict[str, str] = {
    "elements": "sum",
    "decoded": "max",
    "finite": "sum",
    "total": "sum",
    "squares": "sum",
    "low": "min",
    "high": "max",
    "zeros": "sum",
    "nan": "sum",
    "inf": "sum",
    "sub_n": "sum",
    "tiny_n": "sum",
    "huge_n": "sum",
    "absmin": "min",
    "repeat": "max",
    "nonzero_bytes": "max",
}


def segment_records(words: np.ndarray, starts: np.ndarray, decoder: Decoder) -> pd.DataFrame:
    """One partial record per segment `[starts[i], starts[i + 1])` of `words` (raw element
    words of `decoder`'s dtype; every segment non-empty)."""
    n = len(starts)
    lengths = np.diff(np.append(starts, len(words)))
    out: dict[str, np.ndarray] = {"elements": lengths}
    nonzero_word = words != 0
    out["nonzero_bytes"] = np.logical_or.reduceat(nonzero_word, starts) if n else lengths > 0
    if decoder.decode is None:
        out["decoded"] = np.zeros(n, bool)
        out["repeat"] = _repeat(words, np.ones(len(words), bool), starts, lengths)
        for column in PARTIAL:
            out.setdefault(column, np.full(n, np.nan))
        return pd.DataFrame(out)
    with np.errstate(invalid="ignore", over="ignore"):
        x = decoder.decode(words)  # float32 holds every 8/16-bit float exactly
        finite = np.isfinite(x)
        nonfinite = ~finite
        value = np.where(finite, x, 0)
        size = np.abs(value)
        out["decoded"] = np.ones(n, bool)
        out["finite"] = np.add.reduceat(finite, starts)
        out["nan"] = np.add.reduceat(np.isnan(x), starts) if nonfinite.any() else np.zeros(n)
        out["inf"] = np.add.reduceat(np.isinf(x), starts) if nonfinite.any() else np.zeros(n)
        out["total"] = np.add.reduceat(value, starts, dtype=np.float64)
        out["squares"] = np.add.reduceat(np.square(value, dtype=np.float64), starts)
        out["low"] = np.minimum.reduceat(np.where(finite, x, np.inf), starts)
        out["high"] = np.maximum.reduceat(np.where(finite, x, -np.inf), starts)
        out["zeros"] = np.add.reduceat(finite & (value == 0), starts)
        out["sub_n"] = out["finite"]
        out["tiny_n"] = np.add.reduceat((size > 0) & (size < decoder.tiny), starts)
        out["huge_n"] = np.add.reduceat(size >= decoder.huge, starts)
        out["absmin"] = np.minimum.reduceat(np.where(size > 0, size, np.inf), starts)
    out["repeat"] = _repeat(words, finite, starts, lengths)
    return pd.DataFrame(out)


_REPEAT_WORDS = 256


def _repeat(
    words: np.ndarray, finite: np.ndarray, starts: np.ndarray, lengths: np.ndarray
) -> np.ndarray:
    """Per segment: share of its most common non-zero word among its finite words (on at
    most `_REPEAT_WORDS` words of it, evenly spread)."""
    n = len(starts)
    if not n:
        return np.zeros(0)
    # At most _REPEAT_WORDS evenly spread words per segment: the share is estimated.
    take = np.minimum(lengths, _REPEAT_WORDS)
    segment = np.repeat(np.arange(n), take)
    first = np.concatenate([[0], np.cumsum(take)[:-1]])
    j = np.arange(int(take.sum())) - np.repeat(first, take)
    picked = np.repeat(starts, take) + (j * np.repeat(lengths, take)) // np.repeat(take, take)
    words, finite = words[picked], finite[picked]
    starts = first
    keep = finite & (words != 0)
    seg, w = segment[keep], words[keep]
    best = np.zeros(n)
    if len(w):
        order = np.lexsort((w, seg))
        seg, w = seg[order], w[order]
        new_run = np.ones(len(w), bool)
        new_run[1:] = (seg[1:] != seg[:-1]) | (w[1:] != w[:-1])
        run_start = np.flatnonzero(new_run)
        run_len = np.diff(np.append(run_start, len(w)))
        np.maximum.at(best, seg[run_start], run_len)
    denominator = np.add.reduceat(finite, starts).astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(denominator > 0, best / np.maximum(denominator, 1), 0.0)


def finish(records: pd.DataFrame) -> pd.DataFrame:
    """The statistics columns (`TensorStats` fields) from merged partial records."""
    finite = records["finite"].to_numpy(np.float64)
    has = finite > 0
    decoded = records["decoded"].fillna(False).to_numpy(bool)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = records["total"].to_numpy(np.float64) / finite
        var = np.maximum(records["squares"].to_numpy(np.float64) / finite - mean * mean, 0.0)
        low = records["low"].to_numpy(np.float64)
        high = records["high"].to_numpy(np.float64)
        sub = records["sub_n"].to_numpy(np.float64)
        zeros = records["zeros"].to_numpy(np.float64)
        bad = records["nan"].fillna(0).to_numpy() + records["inf"].fillna(0).to_numpy()
        absmin = records["absmin"].to_numpy(np.float64)
        ok = decoded & has
        frame = pd.DataFrame(
            {
                "elements": records["elements"].astype(np.int64).to_numpy(),
                "decoded": decoded,
                "min": np.where(ok, low, np.nan),
                "max": np.where(ok, high, np.nan),
                "mean": np.where(ok, mean, np.nan),
                "std": np.where(ok, np.sqrt(var), np.nan),
                "absmax": np.where(ok, np.maximum(np.abs(low), np.abs(high)), np.nan),
                "zero_frac": np.where(ok, zeros / finite, np.nan),
                "nan": records["nan"].fillna(0).astype(np.int64).to_numpy(),
                "inf": records["inf"].fillna(0).astype(np.int64).to_numpy(),
                "tiny_frac": np.where(
                    decoded, records["tiny_n"].to_numpy(np.float64) / sub, np.nan
                ),
                "huge_frac": np.where(
                    decoded, records["huge_n"].to_numpy(np.float64) / sub, np.nan
                ),
                "repeat_frac": records["repeat"].to_numpy(np.float64),
                "absmin": np.where(decoded & np.isfinite(absmin), absmin, np.nan),
                "all_zero": np.where(
                    decoded,
                    has & (zeros == finite) & (bad == 0),
                    (records["elements"].to_numpy() > 0) & ~records["nonzero_bytes"].to_numpy(bool),
                ),
            },
            index=records.index,
        )
    frame["tiny_frac"] = frame["tiny_frac"].fillna(0.0).where(decoded)
    frame["huge_frac"] = frame["huge_frac"].fillna(0.0).where(decoded)
    return frame


def _column(records: pd.DataFrame, name: str) -> np.ndarray:
    return records[name].to_numpy(np.float64)
