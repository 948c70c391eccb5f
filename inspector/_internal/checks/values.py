"""Are the values sane? Per-tensor value statistics, sampled or full, judged against siblings.

`value_table(scanned, mode)` reads (`formats.value_reading`), decodes and summarises
(`formats.value_stats`) each tensor and judges it against its siblings (`values_judge`);
`scanned.values` keeps it. `values_check` turns it into the `tensor-*` value findings.
docs/values.md describes the sampling and what it guarantees.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from inspector._internal.checkpoint.loaded import stale_copies
from inspector._internal.checkpoint.scanned import ScannedCheckpoint
from inspector._internal.checks.deep import zero_allowed
from inspector._internal.checks.unread import UNREAD_FOLDS, unread_verdict
from inspector._internal.checks.values_judge import judge, sibling_key
from inspector._internal.common.display import legible
from inspector._internal.common.dtypes import nbytes_for
from inspector._internal.common.units import format_bytes
from inspector._internal.findings.codes import Code, code_of, code_set
from inspector._internal.findings.finding import Finding, fold_findings, make_finding
from inspector._internal.formats.value_reading import Mode, SampleBudget, Unread, read_records
from inspector._internal.formats.value_segments import PARTIAL, finish
from inspector._internal.formats.value_stats import TensorStats

__all__ = [
    "CODES",
    "MODES",
    "Mode",
    "SampleBudget",
    "TensorStats",
    "cached_value_table",
    "computed_value_table",
    "sibling_key",
    "value_table",
    "values_check",
    "values_read",
]

MODES: tuple[Mode, ...] = ("sample", "full")
CODES = code_set(
    Code.TENSOR_NONFINITE,
    Code.TENSOR_ALL_ZERO,
    Code.TENSOR_UNINITIALISED,
    Code.TENSOR_VALUES_OUTLIER,
    Code.TENSOR_UNREADABLE,
    Code.FILE_TRUNCATED,
)
_STATS = list(TensorStats.__dataclass_fields__)
_NAMING = ["layer", "expert", "kind"]


def value_table(
    scanned: ScannedCheckpoint,
    mode: Mode = "sample",
    *,
    budget: SampleBudget | None = None,
    seed: int = 0,
    workers: int | None = None,
) -> pd.DataFrame:
    """One row per tensor whose bytes could be read: name, file, dtype, numel, layer,
    expert, kind, the statistics (`TensorStats` fields), `mode`, the sibling judgement
    (`siblings`, `sibling_std`, `sibling_absmax`) and `finding` (a code or "") with `why`.
    Computed once per mode, budget and seed and kept with the scan (`workers` only changes
    the speed; a table read with it set is not kept)."""
    if mode not in MODES:
        raise ValueError(f"values mode {mode!r}: expected one of {', '.join(MODES)}")
    if workers is not None:
        return _build(scanned, mode, budget, seed, workers)
    key = f"values:{mode}"
    if mode == "sample" and (budget not in (None, SampleBudget()) or seed):
        chosen = budget or SampleBudget()
        key += f":{chosen.windows}x{chosen.window_bytes}:seed{seed}"
    return scanned.derived(key, lambda: _build(scanned, mode, budget, seed, None))


def computed_value_table(scanned: ScannedCheckpoint) -> pd.DataFrame | None:
    """The table a check already computed for this scan (full preferred), or None: reports
    show values only when they were asked for, they never read tensor data themselves."""
    memo = scanned.__dict__.get("_derived", {})
    for mode in ("full", "sample"):  # the last table read of the mode (any budget and seed)
        keys = [k for k in memo if k == f"values:{mode}" or k.startswith(f"values:{mode}:")]
        if keys:
            table: pd.DataFrame = memo[keys[-1]]
            return table
    return None


def cached_value_table(scanned: ScannedCheckpoint) -> pd.DataFrame:
    """The table a check already computed (full preferred), else a sampled one."""
    table = computed_value_table(scanned)
    return value_table(scanned, "sample") if table is None else table


def _build(
    scanned: ScannedCheckpoint,
    mode: Mode,
    budget: SampleBudget | None,
    seed: int,
    workers: int | None,
) -> pd.DataFrame:
    records, unread = read_records(
        scanned.location.storage,
        scanned.shards,
        mode,
        local=scanned.local_path is not None,
        stale=stale_copies(scanned),
        budget=budget or SampleBudget(),
        seed=seed,
        workers=workers,
    )
    lost = {u.name for u in unread}
    if lost:  # a tensor with a chunk that cannot be read has no statistics at all
        records = records[~records["name"].isin(lost)]
    names = records["name"].tolist()
    if len(set(names)) != len(names):  # DCP chunks of one tensor (copies were left out)
        records = records.groupby("name", sort=False).agg(PARTIAL).reset_index()
    stats = pd.concat(
        [records[["name"]].reset_index(drop=True), finish(records.reset_index(drop=True))], axis=1
    )
    tensors = scanned.tensors
    columns = ["name", "file", "dtype", "numel", *[c for c in _NAMING if c in tensors]]
    # Each record's row of `ckpt.tensors` (for a name in several files, the row of the copy
    # read: `stale_copies` names the others): a dict lookup, where a join on 300,000
    # strings costs seconds.
    listed = tensors["name"].tolist()
    row = dict(zip(reversed(listed), range(len(listed) - 1, -1, -1), strict=True))
    stale = stale_copies(scanned)
    if stale:
        files = tensors["file"].astype(str).tolist()
        row = {
            listed[i]: i
            for i in range(len(listed) - 1, -1, -1)
            if listed[i] not in stale.get(files[i], ())
        }
    names = stats["name"].tolist()
    at = np.fromiter(map(row.get, names, [-1] * len(names)), np.int64, len(names))
    table = tensors[columns[1:]].iloc[np.maximum(at, 0)].reset_index(drop=True)
    table.loc[at < 0, columns[1:]] = None
    table.insert(0, "name", names)
    table = pd.concat([table, stats[_STATS].reset_index(drop=True)], axis=1)
    info = tensors[columns].drop_duplicates("name").set_index("name") if unread else None
    table.insert(len(columns), "mode", mode)
    table = judge(table)
    if info is not None:
        table = pd.concat([table, _unread_rows(unread, info, mode)], ignore_index=True)
    return table.sort_values("name", kind="stable").reset_index(drop=True)


def _unread_rows(unread: list[Unread], info: pd.DataFrame, mode: Mode) -> pd.DataFrame:
    """One row per tensor whose bytes could not be read: no statistics, the finding that
    says so (`file-truncated` for bytes past the end of the file, else `tensor-unreadable`)
    and why."""
    first = {u.name: u for u in reversed(unread)}  # the first problem of each tensor
    rows = []
    for name, u in sorted(first.items()):
        code, why = unread_verdict(u)
        rows.append(
            {
                "name": name,
                "file": u.file,
                "dtype": u.dtype,
                "mode": mode,
                "elements": 0,
                "decoded": False,
                "all_zero": False,
                "nan": 0,
                "inf": 0,
                "siblings": 0,
                "siblings_zero": False,
                "finding": code.value,
                "why": why,
            }
        )
    frame = pd.DataFrame(rows)
    for column in ("numel", *_NAMING):
        if column in info:
            frame[column] = frame["name"].map(info[column])
    return frame


def values_check(
    scanned: ScannedCheckpoint,
    mode: Mode = "sample",
    *,
    budget: SampleBudget | None = None,
    seed: int = 0,
) -> list[Finding]:
    """Findings from the value table: NaN/Inf, all-zero, never-written and outlier tensors."""
    table = value_table(scanned, mode, budget=budget, seed=seed)
    read = "sampled values" if mode == "sample" else "values"
    by_code: dict[Code, list[Finding]] = {code: [] for code in CODES}
    flagged = (
        (table["nan"] > 0)
        | (table["inf"] > 0)
        | table["all_zero"].astype(bool)
        | (table["finding"] != "")
    )
    for row in table[flagged.to_numpy()].itertuples(index=False):
        file, name = str(row.file), str(row.name)
        where = f"{legible(file)}: tensor '{legible(name)}' ({row.dtype})"
        layer = _int(getattr(row, "layer", None))
        expert = _int(getattr(row, "expert", None))
        found: list[tuple[Code, str]] = []
        if row.nan or row.inf:
            found.append(
                (
                    Code.TENSOR_NONFINITE,
                    f"{where} holds {row.nan:,} NaN and {row.inf:,} Inf among {row.elements:,} "
                    f"{read}",
                )
            )
        if row.all_zero and not (zero_allowed(name) or row.siblings_zero):
            found.append(
                (
                    Code.TENSOR_ALL_ZERO,
                    f"{where}: all {row.elements:,} {read} are zero; a weight that was never "
                    "written reads back as zeros (check the exporter's expert and rank coverage)",
                )
            )
        if row.finding:
            code = code_of(str(row.finding))
            found.append((code, f"{where}: {row.why}"))
        for code, message in found:
            by_code[code].append(
                make_finding(code, message, file=file, tensor=name, layer=layer, expert=expert)
            )
    out: list[Finding] = []
    for code, what in (
        (Code.TENSOR_NONFINITE, "tensors holding NaN or Inf"),
        (Code.TENSOR_ALL_ZERO, "tensors that are all zeros"),
        (Code.TENSOR_UNINITIALISED, "tensors that look never written"),
        (Code.TENSOR_VALUES_OUTLIER, "tensors whose values are out of line with their siblings"),
        *UNREAD_FOLDS,
    ):
        out += fold_findings(by_code[code], what)
    return out


def values_read(
    scanned: ScannedCheckpoint,
    mode: Mode = "sample",
    *,
    budget: SampleBudget | None = None,
    seed: int = 0,
) -> dict[str, Any]:
    """What `values_check` read, for a person to see even when it found nothing: how many
    tensors, how many bytes of how many, and the method. `{"mode", "tensors", "of_tensors",
    "unreadable", "bytes_read", "of_bytes", "windows", "window_bytes", "seed", "summary"}`
    (`summary` is the line `check` prints). Reads nothing: the value table is kept with the
    scan."""
    table = value_table(scanned, mode, budget=budget, seed=seed)
    lost = table["finding"].isin([c.value for c, _ in UNREAD_FOLDS]) & (table["elements"] == 0)
    read = table[~lost.to_numpy()]
    per_dtype = read.groupby("dtype", observed=True)["elements"].sum()
    bytes_read = sum(nbytes_for(str(d), int(n)) or 0 for d, n in per_dtype.items())
    tensors = scanned.tensors
    # Every stored piece of the tensors read: DCP chunks, copies in two shards.
    of_bytes = int(tensors.loc[tensors["name"].isin(set(read["name"])), "nbytes"].sum())
    whole = tensors.drop_duplicates("name")
    chosen = budget or SampleBudget()
    if mode == "sample":
        how = (
            f"sampled: {chosen.windows} windows of {chosen.window_bytes} bytes a tensor, seed "
            f"{seed}; a tensor no larger is read whole"
        )
    else:
        how = "full: every byte"
    unreadable = int(lost.sum())
    cannot = f"; {unreadable:,} could not be read" if unreadable else ""
    summary = (
        f"read {len(read):,} of {len(whole):,} tensors, {format_bytes(bytes_read)} of their "
        f"{format_bytes(of_bytes)} ({how}){cannot}"
    )
    return {
        "mode": mode,
        "tensors": len(read),
        "of_tensors": len(whole),
        "unreadable": unreadable,
        "bytes_read": int(bytes_read),
        "of_bytes": of_bytes,
        "windows": chosen.windows if mode == "sample" else None,
        "window_bytes": chosen.window_bytes if mode == "sample" else None,
        "seed": seed if mode == "sample" else None,
        "summary": summary,
    }


def _int(value: object) -> int | None:
    if value is None or pd.isna(value):  # type: ignore[call-overload]
        return None
    number = int(value)  # type: ignore[call-overload]
    return number if number >= 0 else None
