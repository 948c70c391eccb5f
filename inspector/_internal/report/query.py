"""Find tensors: a query over the tensors table (name pattern, dtype, layer, expert, file, kind)
and its export to CSV or Parquet. Pure, except `export_tensors`, which writes the one file asked.

A name with `*`, `?` or `[...]` is a glob over the whole name, other text a substring, with
`regex=True` a regular expression searched anywhere. Patterns are translated to the subset
Python's `re`, RE2 (pyarrow, the notebook's grid) and pandas agree on, so every view of one
query selects the same rows.
"""

from __future__ import annotations

import csv
import importlib.util
import io
import os
import re
import warnings
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING

from inspector._internal.checkpoint.tables import rows_named
from inspector._internal.common.display import CELL_LIMIT, legible
from inspector._internal.common.text import layers_text
from inspector._internal.execution.atomic import write_atomic
from inspector.errors import InspectorError

if TYPE_CHECKING:
    import pandas as pd

    from inspector._internal.checkpoint.scanned import ScannedCheckpoint
    from inspector._internal.findings.finding import Finding
    from inspector._internal.load.verdict import LoadVerdict

__all__ = [
    "EXPORT_COLUMNS",
    "TensorQuery",
    "export_tensors",
    "missing_notes",
    "name_pattern",
    "query_for_finding",
]

# The tensors-table columns an export writes (shape as text, e.g. "[7168, 2048]").
EXPORT_COLUMNS = (
    "name",
    "file",
    "dtype",
    "shape",
    "numel",
    "nbytes",
    "layer",
    "expert",
    "kind",
    "module",
    "param",
)
_GLOB = re.compile(r"[*?\[]")
# `.experts.<id>.` in a stored name; `.experts.` followed by no number: a fused (stacked)
# name as transformers keeps it in memory (`model.layers.40.mlp.experts.down_proj`).
_EXPERT_ID = re.compile(r"\.experts\.(\d+)\.")
_FUSED = re.compile(r"\.experts\.(?!\d+(?:\.|$))")
# Missing experts whose names a note tries against a filter, at most.
_MISSING_CAP = 4096


@dataclass(frozen=True, slots=True)
class TensorQuery:
    """Which tensors to show. Empty fields do not filter; all given fields must hold.

    `names` selects exact tensor names (a finding's tensor, a problem's tensors)."""

    name: str = ""
    regex: bool = False
    dtype: str | None = None
    layer: int | None = None
    expert: int | None = None
    file: str | None = None
    kind: str | None = None
    names: tuple[str, ...] = ()

    def pattern(self) -> str | None:
        """The name filter as a regular expression (searched), None when there is none."""
        return name_pattern(self.name, regex=self.regex) if self.name.strip() else None

    def equalities(self) -> dict[str, object]:
        """The column == value conditions of this query."""
        return {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if f.name in ("dtype", "layer", "expert", "file", "kind")
            and getattr(self, f.name) is not None
        }

    def apply(self, tensors: pd.DataFrame) -> pd.DataFrame:
        """The rows of `tensors` (the tensors table) that match, in table order."""
        mask = None
        for column, value in self.equalities().items():
            hit = (tensors[column] == value).fillna(False).to_numpy(dtype=bool)
            mask = hit if mask is None else mask & hit
        if self.names:
            hit = rows_named(tensors, self.names)
            mask = hit if mask is None else mask & hit
        pattern = self.pattern()
        if pattern is not None:
            # Only the rows that passed the cheap filters go through the regex.
            rows = tensors if mask is None else tensors.loc[mask]
            with warnings.catch_warnings():
                # pandas warns that groups in a user's regex are not extracted: not wanted here.
                warnings.filterwarnings("ignore", "This pattern is interpreted", UserWarning)
                found = rows["name"].astype(str).str.contains(pattern, regex=True)
            return rows.loc[found.to_numpy(dtype=bool)]
        return tensors if mask is None else tensors.loc[mask]

    def describe(self) -> str:
        """'name ~ *.experts.17.*, dtype F8_E4M3, layer 40' (or 'all tensors')."""
        parts = []
        if self.name.strip():
            parts.append(f"name {'~ /' + self.name + '/' if self.regex else '~ ' + self.name}")
        parts += [f"{k} {v}" for k, v in self.equalities().items()]
        if self.names:
            parts.append(f"{len(self.names)} named tensor{'s' if len(self.names) != 1 else ''}")
        return ", ".join(parts) or "all tensors"


def name_pattern(text: str, *, regex: bool = False) -> str:
    """A name filter as a regular expression: a glob (`*`, `?`, `[...]`) matches the whole name,
    plain text is a substring, `regex=True` is taken as written (and must compile)."""
    text = text.strip()
    if regex:
        try:
            re.compile(text)
        except re.error as exc:
            raise InspectorError(
                f"name filter {text!r} is not a regular expression ({exc}); "
                "untick 'regex' to match it as plain text or a glob"
            ) from None
        return text
    if not _GLOB.search(text):
        return re.escape(text)
    out, i = ["^"], 0
    while i < len(text):
        ch = text[i]
        if ch == "*":
            out.append(".*")
        elif ch == "?":
            out.append(".")
        elif ch == "[" and text.find("]", i + 2) != -1:
            # A character class; "[!...]" negates it as in fnmatch.
            end = text.find("]", i + 2)
            body = text[i + 1 : end]
            body = "^" + body[1:] if body.startswith("!") else body
            out.append("[" + body.replace("\\", "\\\\") + "]")
            i = end
        else:
            out.append(re.escape(ch))
        i += 1
    return "".join(out) + "$"


def export_tensors(
    frame: pd.DataFrame, path: str | os.PathLike[str], *, format: str | None = None
) -> Path:
    """Write the rows of a tensors table (e.g. `query.apply(ckpt.tensors)`) to `path` as CSV
    or Parquet (`format`, else the suffix: .csv, .parquet) and return the path. The file is
    written to a temp name and renamed, so a reader never sees half of it.

    Parquet keeps every name exactly. CSV is opened in spreadsheets, so its text cells go
    through `legible` for CSV: a name a spreadsheet would run as a formula (`=HYPERLINK(...)`,
    `=cmd|...`, `+`, `-`, `@SUM(...)`) starts with `'`, control characters (a leading tab or
    carriage return too) are escaped, a cell holds at most `CELL_LIMIT` characters, and every
    text cell is quoted. Healthy names are written unchanged."""

    target = Path(path).expanduser()
    kind = (format or target.suffix.lstrip(".")).lower()
    if kind not in ("csv", "parquet"):
        raise InspectorError(
            f"{target}: cannot tell the export format from {kind or 'no suffix'!r}; "
            "expected a .csv or .parquet file name (or format='csv' / 'parquet')"
        )
    columns = [c for c in EXPORT_COLUMNS if c in frame.columns]
    out = frame[columns].copy()
    if "shape" in out.columns:
        out["shape"] = ["[" + ", ".join(map(str, s)) + "]" for s in out["shape"]]
    for column in ("file", "dtype", "kind", "module", "param"):
        if column in out.columns:
            out[column] = out[column].astype(str)
    if kind == "csv":
        for column in out.columns:
            if out[column].dtype.kind == "O":
                out[column] = out[column].map(_csv_cell)
        data = out.to_csv(index=False, quoting=csv.QUOTE_NONNUMERIC).encode("utf-8")
    else:
        # pandas writes Parquet through pyarrow, and says so less plainly.
        if importlib.util.find_spec("pyarrow") is None:
            raise InspectorError(
                f"{target}: writing Parquet needs pyarrow; pip install pyarrow, or export to .csv"
            )
        buffer = io.BytesIO()
        out.reset_index(drop=True).to_parquet(buffer, index=False)
        data = buffer.getvalue()
    target.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(target, data)
    return target


def query_for_finding(
    finding: Finding, tensors: pd.DataFrame, verdict: LoadVerdict | None = None
) -> TensorQuery:
    """The tensors a finding is about, as the checkpoint stores them: its tensor when it is
    stored; for a model key of the load check, the stored tensors behind it (the verdict's
    `sources`, or how the checkpoint spells a missing key, `stored_as`); for a fused
    transformers name (`...mlp.experts.down_proj`), every expert's tensors of it
    (`...mlp.experts.*.down_proj.*`)."""
    name = finding.tensor or ""
    if not name or bool(tensors["name"].eq(name).any()):
        return TensorQuery(names=(name,)) if name else TensorQuery()
    if verdict is not None and verdict.sources.get(name):
        return TensorQuery(names=tuple(verdict.sources[name]))
    spelled = verdict.stored_as.get(name) if verdict is not None else None
    if spelled:
        globs = [name_pattern(p) for p in spelled.split(" and ")]
        return TensorQuery(name="|".join(f"(?:{g})" for g in globs), regex=True)
    if _FUSED.search(name):
        stem = _FUSED.sub(".experts.*.", name, count=1)
        return TensorQuery(name=f"{stem}.*" if not stem.endswith("*") else stem)
    return TensorQuery(names=(name,))


def missing_notes(query: TensorQuery, scanned: ScannedCheckpoint) -> list[str]:
    """What a filter would show if the checkpoint were whole: the missing experts (the
    experts table's `missing`, from the structure check) whose tensor names the filter
    selects, e.g. 'expert 17 of layer 40 is missing (expert-missing)'. Names are those of a
    sibling expert of the same layer, renumbered. Empty for a query without a filter."""
    if not (query.equalities() or query.names or query.pattern()):
        return []
    experts = scanned.experts
    if not len(experts) or query.kind not in (None, "expert") or query.file is not None:
        return []
    gone = experts[experts["missing"]]
    if query.layer is not None:
        gone = gone[gone["layer"] == query.layer]
    if query.expert is not None:
        gone = gone[gone["expert"] == query.expert]
    if not len(gone) or len(gone) > _MISSING_CAP:
        return []
    siblings = _sibling_names(scanned, set(gone["layer"].tolist()))
    pattern = query.pattern()
    wanted = set(query.names)
    # Named tensors of some experts (a fused name's stored tensors) stand for that
    # projection of every expert of the layer, the missing ones too.
    shapes = {_EXPERT_ID.sub(".experts.*.", n, count=1) for n in wanted}
    found: dict[int, list[int]] = {}
    for layer, expert in zip(gone["layer"].tolist(), gone["expert"].tolist(), strict=True):
        names = [
            (_EXPERT_ID.sub(f".experts.{expert}.", n, count=1), d)
            for n, d in siblings.get(layer, ())
        ]
        hit = any(
            (query.dtype is None or d == query.dtype)
            and (not wanted or _EXPERT_ID.sub(".experts.*.", n, count=1) in shapes)
            and (pattern is None or re.search(pattern, n))
            for n, d in names
        )
        if hit:
            found.setdefault(int(layer), []).append(int(expert))
    # Layers missing the same experts share a note: "expert 70 of layers 1-4 is missing".
    by_ids: dict[tuple[int, ...], list[int]] = {}
    for layer, ids in sorted(found.items()):
        by_ids.setdefault(tuple(ids), []).append(layer)
    notes = []
    table = scanned.layers
    mtp = set(table.loc[table["is_mtp"], "layer"].astype(int)) if len(table) else set()
    for numbers, layers in by_ids.items():
        verb = "is" if len(numbers) == 1 else "are"
        notes.append(
            f"{layers_text(numbers, noun='expert')} of {layers_text(layers, mtp=mtp)} {verb} "
            "missing "
            "(expert-missing)"
        )
    return notes


def _sibling_names(
    scanned: ScannedCheckpoint, layers: set[int]
) -> dict[int, list[tuple[str, str]]]:
    """(name, dtype) of one present expert's tensors in each of `layers`."""
    t = scanned.tensors
    rows = t[t["layer"].isin(layers) & t["expert"].notna()]
    out: dict[int, list[tuple[str, str]]] = {}
    for _, group in rows.groupby("layer", observed=True):
        first = group[group["expert"] == group["expert"].iloc[0]]
        names = first["name"].astype(str).tolist()
        dtypes = first["dtype"].astype(str).tolist()
        out[int(first["layer"].iloc[0])] = list(zip(names, dtypes, strict=True))
    return out


def _csv_cell(value: object) -> object:
    return legible(value, target="csv", limit=CELL_LIMIT) if isinstance(value, str) else value
