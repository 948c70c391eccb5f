"""The tensor browser: every tensor in a virtualised grid (a million never travel to the page
at once), filtered by name, dtype, layer, expert, file and kind, exported to CSV or Parquet.

Perspective (the README says why) filters from the same `TensorQuery` the core applies with pandas
(`report.query`); the export writes `query.apply(tensors)`, and a test keeps the two equal.
`browse(scanned, **filters)` is what `ScannedCheckpoint.browse()` calls.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ipywidgets as w
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from inspector.ui import (
    NAME_LIMIT,
    InspectorError,
    ScannedCheckpoint,
    TensorQuery,
    export_tensors,
    html_text,
    legible_each,
    missing_notes,
)

from .controls import NOT_DRAWN, close_tree, fixed, still
from .grid import (
    GridCells,
    arrow_bytes,
    choice,
    choose_from,
    free_grid,
    make_grid,
    match_expression,
    preview_anew,
    table_name,
)
from .guard import guarded

if TYPE_CHECKING:
    from .tabs import Host

__all__ = ["TensorBrowser", "browse", "grid_config", "grid_frame", "tensors_tab"]

# Grid columns in display order; `size` is the tensor's bytes (a number: it sorts as one, and
# is drawn "4.1 GB", see `widgets.grid`), `elements` its numel.
GRID_COLUMNS = [
    "name",
    "dtype",
    "shape",
    "size",
    "elements",
    "layer",
    "expert",
    "kind",
    "file",
    "module",
    "param",
]


def browse(scanned: ScannedCheckpoint, **filters: Any) -> TensorBrowser:
    """A tensor browser over `scanned` (the filters are `TensorQuery` fields)."""
    return TensorBrowser(scanned, query=TensorQuery(**filters))


def grid_frame(tensors: pd.DataFrame) -> pd.DataFrame:
    """The tensors table as the grid shows it: text columns as plain strings, nullable layer
    and expert numbers kept as integers, shapes as text, sizes and element counts as numbers.
    Names are shown legible (`inspector._internal.common.display.legible`: bounded, control
    characters escaped), which leaves every name a writer produces as it is; the export writes
    the exact names."""
    # A 300,000-tensor MoE has a few dozen distinct shapes: format each once.
    shapes: dict[tuple[int, ...], str] = {}
    frame = pd.DataFrame(
        {
            "name": _legible(tensors["name"]),
            "dtype": tensors["dtype"].astype(str).to_numpy(dtype=object),
            "shape": [
                shapes.get(s) or shapes.setdefault(s, "[" + ", ".join(map(str, s)) + "]")
                for s in tensors["shape"]
            ],
            "size": tensors["nbytes"].to_numpy(dtype="int64"),
            "elements": tensors["numel"].to_numpy(dtype="int64"),
            "layer": tensors["layer"].astype("Int64"),
            "expert": tensors["expert"].astype("Int64"),
            "kind": tensors["kind"].astype(str).to_numpy(dtype=object),
            "file": _legible(tensors["file"]),
            "module": _legible(tensors["module"]),
            "param": _legible(tensors["param"]),
        }
    )
    if not len(frame):
        # No tensors (a shard of none): pandas makes the empty text columns floats, and the
        # grid's table would keep them so when a re-scan brings names (`arrow_bytes`).
        for column in _TEXT_COLUMNS:
            frame[column] = frame[column].astype(object)
    return frame


_TEXT_COLUMNS = ("name", "dtype", "shape", "kind", "file", "module", "param")


def _legible(column: pd.Series) -> Any:
    """`legible_each` of the column's values, as a column of the grid's frame. The common
    cases skip a Python string per row (at 300,000 tensors the four name columns took 0.9 s
    through Python lists): a categorical column (files, modules, parameter kinds) has each
    category made legible once; a text column whose every value is short and printable (what
    every writer produces, and then `legible` is each value itself) is kept as it is, which
    one pass over its Arrow data decides."""
    if isinstance(column.dtype, pd.CategoricalDtype):
        codes = column.cat.codes.to_numpy()
        if len(codes) and codes.min() >= 0:
            shown = legible_each(column.cat.categories.astype(str).tolist())
            return np.asarray(shown, dtype=object)[codes]
    elif _shown_as_is(column):
        return column.array
    return legible_each(column.astype(str).tolist())


def _shown_as_is(column: pd.Series) -> bool:
    """Whether `legible` leaves every value of a text column as it is: no value is missing or
    longer than `NAME_LIMIT` characters, and all are printable. A string is printable when
    each of its characters is, so the concatenation of the values, which Arrow holds as one
    UTF-8 range, is tested in one call."""
    try:
        array = pa.array(column.array)
    except (pa.ArrowException, TypeError):
        return False
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    if pa.types.is_string(array.type):
        width: type[np.integer[Any]] = np.int32
    elif pa.types.is_large_string(array.type):
        width = np.int64
    else:
        return False
    if array.null_count or not len(array):
        return not array.null_count
    if pc.max(pc.utf8_length(array)).as_py() > NAME_LIMIT:
        return False
    _, offsets_buffer, data = array.buffers()
    if data is None:  # every value is empty
        return True
    first = array.offset
    offsets = np.frombuffer(offsets_buffer, dtype=width)[first : first + len(array) + 1]
    text = memoryview(data)[int(offsets[0]) : int(offsets[-1])]
    return bytes(text).decode("utf-8").isprintable()


def grid_config(query: TensorQuery) -> dict[str, Any]:
    """The query as Perspective viewer settings: `filter` and `expressions`."""
    filters: list[list[Any]] = [[k, "==", v] for k, v in query.equalities().items()]
    if query.names:
        filters.append(["name", "in", list(query.names)])
    expressions: dict[str, str] = {}
    if query.pattern() is not None:
        name, expression = match_expression("name", query.name, regex=query.regex)
        expressions[name] = expression
        filters.append([name, "==", True])
    return {"filter": filters, "expressions": expressions}


class TensorBrowser:
    """Filter controls, a match count, export buttons and the grid. `query` is the current
    filter; `set_query` changes it (the controls follow). With `defer_grid` the grid widget
    waits for `show_grid` (the table is built at once); `cells=False` inside a dashboard,
    whose `GridCells` draws the byte columns."""

    def __init__(
        self,
        scanned: ScannedCheckpoint,
        *,
        query: TensorQuery | None = None,
        export_dir: str | os.PathLike[str] | None = None,
        defer_grid: bool = False,
        cells: bool = True,
    ) -> None:
        import perspective

        self.scanned = scanned
        self.tensors = scanned.tensors
        self.export_dir = Path(export_dir) if export_dir else Path.cwd()
        # Loaded as a re-scan replaces its rows (`show_scan`), with the same column types.
        frame = arrow_bytes(grid_frame(self.tensors))
        self.table = perspective.table(frame, name=table_name("tensors"))
        # The grid widget is created when it is first shown (see `show_grid`).
        self.grid: Any = None
        self._grid_lock = threading.Lock()
        # Its controls' layouts and styles are the kernel's shared ones (`still`).
        self._grid_box = w.VBox(
            [
                still(
                    w.HTML,
                    NOT_DRAWN,
                    value="<i>The grid is drawn when the tab is shown.</i>",
                )
            ],
            layout=fixed(w.Layout, width="100%"),
        )
        t = self.tensors
        self.count = still(w.HTML, "ckpt-tensor-count")
        self.export_status = still(w.HTML, "ckpt-export-status")
        self.name = still(
            w.Text,
            "ckpt-tensor-name",
            placeholder="name: glob *.experts.17.* or text (tick regex for a regular expression)",
            continuous_update=False,
            layout={"flex": "1 1 auto", "min_width": "20em"},
        )
        self.regex = still(w.Checkbox, description="regex", indent=False, layout={"width": "5em"})
        self.dtype = choice("dtype", _values(t["dtype"]), "ckpt-tensor-dtype")
        self.layer = choice("layer", _numbers(t["layer"]), "ckpt-tensor-layer")
        self.expert = choice("expert", _numbers(t["expert"]), "ckpt-tensor-expert")
        self.kind = choice("kind", _values(t["kind"]), "ckpt-tensor-kind")
        self.file = choice("file", _values(t["file"]), "ckpt-tensor-file", width="22em")
        clear = still(
            w.Button,
            "ckpt-tensor-clear",
            description="Clear",
            icon="times",
            layout={"width": "auto"},
        )
        clear.on_click(guarded(lambda: self.set_query(TensorQuery()), self.count))
        self.export_name = still(
            w.Text,
            value=self._export_base(),
            description="export to",
            layout={"width": "32em"},
        )
        auto = {"width": "auto"}
        csv = still(w.Button, "ckpt-export-csv", description="CSV", icon="download", layout=auto)
        parquet = still(
            w.Button, "ckpt-export-parquet", description="Parquet", icon="download", layout=auto
        )
        csv.on_click(guarded(lambda: self.export("csv"), self.export_status))
        parquet.on_click(guarded(lambda: self.export("parquet"), self.export_status))
        self._controls: tuple[w.Widget, ...] = (self.name, self.regex, self.dtype, self.layer)
        self._controls += (self.expert, self.kind, self.file)
        self._quiet = False
        for control in self._controls:
            control.observe(guarded(self._from_controls, self.count), names="value")
        wrap = fixed(w.Layout, flex_flow="row wrap", align_items="center")
        self.widget = (
            w.VBox(
                [
                    w.HBox([self.name, self.regex, clear], layout=wrap),
                    w.HBox(
                        [self.dtype, self.layer, self.expert, self.kind, self.file], layout=wrap
                    ),
                    self.count,
                    self._grid_box,
                    w.HBox([self.export_name, csv, parquet, self.export_status], layout=wrap),
                    *([GridCells()] if cells else []),
                ],
                layout=w.Layout(width="100%"),
            )
            .add_class("ckpt-tensor-browser")
            .add_class("ckpt-grid-box")
        )
        self.query = TensorQuery()
        self.set_query(query or TensorQuery())
        if not defer_grid:
            self.show_grid()

    def show_scan(self, scanned: ScannedCheckpoint) -> None:
        """Show `scanned` (a re-scan of the same checkpoint) in the widgets shown, as a browser
        made for it shows it: its table's rows replaced (the grid stays, its viewer redraws),
        every tensor selected, the export form as new."""
        if scanned is not self.scanned:
            self.scanned, self.tensors = scanned, scanned.tensors
            self.table.replace(arrow_bytes(grid_frame(self.tensors)))
            t = self.tensors
            for control, options in (
                (self.dtype, _values(t["dtype"])),
                (self.layer, _numbers(t["layer"])),
                (self.expert, _numbers(t["expert"])),
                (self.kind, _values(t["kind"])),
                (self.file, _values(t["file"])),
            ):
                self._quiet = True
                try:
                    choose_from(control, options)
                finally:
                    self._quiet = False
        self.export_name.value = self._export_base()
        self.export_status.value = ""
        self.set_query(TensorQuery())
        with self._grid_lock:
            grid = self.grid
        if grid is not None:
            preview_anew(grid, self.table)

    def _export_base(self) -> str:
        return str(self.export_dir / f"{self.scanned.path.name or 'checkpoint'}-tensors")

    def show_grid(self) -> None:
        """Create the grid on the table (once). A grid created in a hidden tab loads a
        million-row table while it has no size and then draws no rows when shown, and its
        loading stalls the page for the other tabs' widgets: the dashboard builds the table
        in the background and calls this when the Tensors tab is shown. Safe to call from
        two threads at once (a tab click's and the caller of `Dashboard.select`)."""
        with self._grid_lock:
            if self.grid is not None:
                return
            self.grid = make_grid(
                self.table,
                columns=GRID_COLUMNS,
                title=f"tensors of {self.scanned.path.name}",
                css_class="ckpt-tensor-grid",
                **grid_config(self.query),
            )
            # The line that stood for the grid is closed with it gone.
            waiting, self._grid_box.children = self._grid_box.children, [self.grid]
            for line in waiting:
                close_tree(line)

    def on_shown(self) -> None:
        """Its tab is shown (the dashboard's hook): the grid."""
        self.show_grid()

    def set_query(self, query: TensorQuery) -> None:
        """Show the tensors `query` selects; the controls show its fields."""
        self._quiet = True
        try:
            self.name.value, self.regex.value = query.name, query.regex
            for control, value in (
                (self.dtype, query.dtype),
                (self.layer, query.layer),
                (self.expert, query.expert),
                (self.kind, query.kind),
                (self.file, query.file),
            ):
                control.value = value if value in _option_values(control) else None
        finally:
            self._quiet = False
        self._apply(query)

    def matches(self) -> int:
        """How many tensors the current query selects (counted by the grid's engine)."""
        config = grid_config(self.query)
        view = self.table.view(**config)
        try:
            return view.num_rows()
        finally:
            view.delete()

    def export(self, kind: str) -> Path | None:
        """Write the rows the current query selects to `<export to>.csv|.parquet`."""
        base = self.export_name.value.strip()
        target = Path(base if base.endswith(f".{kind}") else f"{base}.{kind}")
        try:
            rows = self.query.apply(self.tensors)
            written = export_tensors(rows, target, format=kind)
        except (InspectorError, OSError) as exc:
            self.export_status.value = f"<span style='color:#d62728'>{html_text(exc)}</span>"
            return None
        self.export_status.value = f"wrote {len(rows):,} rows to <code>{html_text(written)}</code>"
        return written

    def close(self) -> None:
        """Free the grid's table in the kernel."""
        free_grid(self.grid, self.table)

    def _from_controls(self) -> None:
        if self._quiet:
            return
        self._apply(
            TensorQuery(
                name=self.name.value,
                regex=self.regex.value,
                dtype=self.dtype.value,
                layer=self.layer.value,
                expert=self.expert.value,
                kind=self.kind.value,
                file=self.file.value,
                # Exact names (from a finding) stay until the user clears them.
                names=self.query.names,
            )
        )

    def _apply(self, query: TensorQuery) -> None:
        try:
            config = grid_config(query)
        except InspectorError as exc:
            self.count.value = f"<span style='color:#d62728'>{html_text(exc)}</span>"
            return
        with self._grid_lock:  # a grid being created takes this query or gets it here
            self.query = query
            if self.grid is not None:
                self.grid.expressions = config["expressions"]
                self.grid.filter = config["filter"]
        total = len(self.tensors)
        n = self.matches() if config["filter"] else total
        # What the filter would show were the checkpoint whole: a missing expert says so.
        missing = "".join(
            f"<div class='ckpt-tensor-missing' style='color:#d62728'>{html_text(note)}</div>"
            for note in missing_notes(query, self.scanned)
        )
        self.count.value = (
            f"<b>{n:,}</b> of {total:,} tensors match "
            f"<span style='color:#666'>({html_text(query.describe())})</span>{missing}"
        )

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        return self.widget._repr_mimebundle_(**kwargs)


def _option_values(control: w.Dropdown) -> set[Any]:
    return {value for _, value in control.options}


def _values(column: pd.Series) -> list[str]:
    return sorted({str(v) for v in column.dropna().unique()})


def _numbers(column: pd.Series) -> list[int]:
    return sorted({int(v) for v in column.dropna().unique()})


class TensorsTab(TensorBrowser):
    """The dashboard's Tensors tab: its grid is made when the tab is first shown, and a
    re-scan's tensors are shown in it (`renew`)."""

    def __init__(self, dash: Host) -> None:
        self.dash = dash
        super().__init__(dash.scanned, export_dir=dash.report_dir, defer_grid=True, cells=False)

    def renew(self) -> bool:
        """Show the dashboard's scan in place (see `show_scan`)."""
        self.show_scan(self.dash.scanned)
        return True


def tensors_tab(dash: Host) -> TensorBrowser:
    """The dashboard's Tensors tab (`TensorsTab`)."""
    return TensorsTab(dash)
