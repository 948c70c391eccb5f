"""Statistics of many short tensors at once, with no Python loop per tensor (300,000 tensors
in seconds): `row_records` for sampled windows, `segment_records` for whole tensors laid end
to end. Records are partial sums, so one tensor's chunks add up; `finish` makes the columns.
The method: docs/architecture.md, "formats/".
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from inspector._internal.formats.value_decode import Decoder

__all__ = ["PARTIAL", "Records", "finish", "row_records", "segment_records"]

if TYPE_CHECKING:
    import pandas as pd

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


Records = dict[str, np.ndarray]  # PARTIAL columns, one entry per tensor


def row_records(words: np.ndarray, decoder: Decoder) -> Records:
    """One partial record per row of `words` (n tensors x the raw element words read of
    each, in `decoder`'s dtype; rows non-empty)."""
    n, length = words.shape
    if decoder.itemsize == 1 and decoder.decode is not None:
        return _byte_records(_histograms(words.ravel(), length), decoder)
    out: dict[str, np.ndarray] = {"elements": np.full(n, length, np.int64)}
    if decoder.decode is None:
        out["decoded"] = np.zeros(n, bool)
        out["nonzero_bytes"] = (words != 0).any(axis=1)
        sub = words[:, :: _stride(length)]
        out["repeat"] = _repeat_rows(sub, None) / sub.shape[1]
        return _fill(out, n)
    assert decoder.decode is not None
    with np.errstate(invalid="ignore", over="ignore"):
        x = decoder.decode(words)
        # Sums in float64 from the decoded values (exact for every 8/16-bit float); a NaN
        # or Inf makes its row's sums non-finite, and only such rows are looked at again.
        total = x.sum(axis=1, dtype=np.float64)
        squares = np.einsum("ij,ij->i", x, x, dtype=np.float64)
        low, high = x.min(axis=1), x.max(axis=1)
        count = np.full(n, length, np.int64)
        nan, inf = np.zeros(n, np.int64), np.zeros(n, np.int64)
        finite: np.ndarray | None = None
        bad = np.flatnonzero(~np.isfinite(total + squares))
        if len(bad):
            finite = np.isfinite(x)
            part, ok = x[bad], finite[bad]
            value = np.where(ok, part, 0).astype(np.float64)
            count[bad] = ok.sum(axis=1)
            nan[bad] = np.isnan(part).sum(axis=1)
            inf[bad] = np.isinf(part).sum(axis=1)
            total[bad] = value.sum(axis=1)
            squares[bad] = np.einsum("ij,ij->i", value, value)
            low[bad] = np.where(ok, part, np.inf).min(axis=1)
            high[bad] = np.where(ok, part, -np.inf).max(axis=1)
        out["decoded"] = np.ones(n, bool)
        out["finite"], out["nan"], out["inf"] = count, nan, inf
        out["total"], out["squares"], out["low"], out["high"] = total, squares, low, high
        out["zeros"] = (x == 0).sum(axis=1)
        out["nonzero_bytes"] = out["zeros"] < length  # (all_zero of decoded rows: zeros)
        # The signatures of never-written memory, on an evenly strided subsample.
        step = _stride(length)
        sub, sub_ok = x[:, ::step], None if finite is None else finite[:, ::step]
        size = np.abs(sub if sub_ok is None else np.where(sub_ok, sub, 0))
        sub_n = np.full(n, sub.shape[1], np.int64) if sub_ok is None else sub_ok.sum(axis=1)
        out["sub_n"] = sub_n
        out["tiny_n"] = ((size > 0) & (size < decoder.tiny)).sum(axis=1)
        out["huge_n"] = (size >= decoder.huge).sum(axis=1)
        out["absmin"] = np.where(size > 0, size, np.inf).min(axis=1)
        best = _repeat_rows(words[:, ::step], sub_ok)
        out["repeat"] = np.where(sub_n > 0, best / np.maximum(sub_n, 1), 0.0)
    return out


_REPEAT_WORDS = 256


def _stride(length: int) -> int:
    """Step of the evenly strided subsample of at most `_REPEAT_WORDS` words of a row."""
    return max(1, -(-length // _REPEAT_WORDS))


def _repeat_rows(words: np.ndarray, keep: np.ndarray | None) -> np.ndarray:
    """Per row: how often its most common non-zero word occurs (among `keep`)."""
    if keep is not None:
        words = np.where(keep, words, 0)
    n, length = words.shape
    if not n or not length:
        return np.zeros(n, np.int64)
    flat = np.sort(words, axis=1, kind="stable").ravel()  # radix sort for 16-bit words
    first = np.ones(len(flat), bool)  # where a run of equal words starts (and every row)
    np.not_equal(flat[1:], flat[:-1], out=first[1:])
    first[::length] = True
    start = np.flatnonzero(first)
    run = np.diff(start, append=len(flat))
    run[flat[start] == 0] = 0
    return np.maximum.reduceat(run, np.searchsorted(start, np.arange(n) * length))


def _histograms(data: np.ndarray, lengths: np.ndarray | int) -> np.ndarray:
    """(n, 256) counts of each byte value per segment, for segments of `lengths` bytes laid
    end to end in `data` (n = len(lengths), or n rows of `lengths` bytes each)."""
    index: np.ndarray
    if isinstance(lengths, int):
        n = len(data) // lengths
        index = data.reshape(n, lengths).astype(np.intp)
        index += (np.arange(n, dtype=np.intp) * 256)[:, None]
    else:
        n = len(lengths)
        index = np.repeat(np.arange(n, dtype=np.intp) * 256, lengths)
        index += data
    return np.bincount(index.ravel(), minlength=n * 256).reshape(n, 256)


_CODES = np.arange(256, dtype=np.uint8)


def _byte_records(counts: np.ndarray, decoder: Decoder) -> dict[str, np.ndarray]:
    """Partial records of one-byte words from their per-tensor histograms: each statistic is
    the counts weighted by what each of the 256 bytes decodes to."""
    n = len(counts)
    elements = counts.sum(axis=1)
    present = counts > 0
    out: dict[str, np.ndarray] = {
        "elements": elements,
        "nonzero_bytes": np.asarray(present[:, 1:].any(axis=1)),
    }
    if decoder.decode is None:
        out["decoded"] = np.zeros(n, bool)
        out["repeat"] = counts[:, 1:].max(axis=1) / np.maximum(elements, 1)
        return _fill(out, n)
    value = decoder.decode(_CODES).astype(np.float64)
    finite = np.isfinite(value)
    clean = np.where(finite, value, 0.0)
    size = np.abs(clean)
    # One matrix product for every count and sum (float64 holds counts exactly).
    columns = np.stack(
        [
            finite,
            np.isnan(value),
            np.isinf(value),
            clean,
            clean * clean,
            finite & (value == 0),
            (size > 0) & (size < decoder.tiny),
            size >= decoder.huge,
        ],
        axis=1,
    ).astype(np.float64)
    sums = counts.astype(np.float64) @ columns
    count = sums[:, 0].astype(np.int64)
    out["decoded"] = np.ones(n, bool)
    out["finite"] = count
    out["nan"] = sums[:, 1].astype(np.int64)
    out["inf"] = sums[:, 2].astype(np.int64)
    out["total"] = sums[:, 3]
    out["squares"] = sums[:, 4]
    out["zeros"] = sums[:, 5].astype(np.int64)
    out["sub_n"] = count
    out["tiny_n"] = sums[:, 6].astype(np.int64)
    out["huge_n"] = sums[:, 7].astype(np.int64)
    out["low"], out["high"] = _extremes(present, value, finite)
    out["absmin"] = _extremes(present, size, finite & (size > 0))[0]
    best = np.where(finite & (_CODES != 0), counts, 0).max(axis=1)
    out["repeat"] = np.where(count > 0, best / np.maximum(count, 1), 0.0)
    return out


def _extremes(
    present: np.ndarray, value: np.ndarray, eligible: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Per row, the smallest and largest `value` among the eligible byte codes present
    (inf and -inf where none is)."""
    codes = np.flatnonzero(eligible)
    codes = codes[np.argsort(value[codes], kind="stable")]
    if not len(codes):
        n = len(present)
        return np.full(n, np.inf), np.full(n, -np.inf)
    ranked = present[:, codes]  # columns from the smallest value to the largest
    has = ranked.any(axis=1)
    low = value[codes[ranked.argmax(axis=1)]]
    high = value[codes[len(codes) - 1 - ranked[:, ::-1].argmax(axis=1)]]
    return np.where(has, low, np.inf), np.where(has, high, -np.inf)


def _fill(out: dict[str, np.ndarray], n: int) -> dict[str, np.ndarray]:
    """The columns an undecoded dtype has no value for, as NaN."""
    for column in PARTIAL:
        out.setdefault(column, np.full(n, np.nan))
    return out


def segment_records(words: np.ndarray, starts: np.ndarray, decoder: Decoder) -> Records:
    """One partial record per segment `[starts[i], starts[i + 1])` of `words` (raw element
    words of `decoder`'s dtype; every segment non-empty)."""
    n = len(starts)
    lengths = np.diff(np.append(starts, len(words)))
    if decoder.itemsize == 1 and n:
        return _byte_records(_histograms(words, lengths), decoder)
    out: dict[str, np.ndarray] = {"elements": lengths}
    nonzero_word = words != 0
    out["nonzero_bytes"] = np.logical_or.reduceat(nonzero_word, starts) if n else lengths > 0
    if decoder.decode is None:
        out["decoded"] = np.zeros(n, bool)
        out["repeat"] = _repeat(words, np.ones(len(words), bool), starts, lengths)
        return _fill(out, n)
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
    return out


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
    # Here, not at the top: `check` without `--values` imports this module and reads no value.
    import pandas as pd

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
