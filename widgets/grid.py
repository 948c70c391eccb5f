"""Grids over tables, the same for tensors, files and layers: Perspective's virtualised
datagrid in server mode, sorted by column headers, filtered by the controls above it, with
people's column names and byte sizes drawn as the project writes them (`GridCells`; why:
docs/architecture.md, "widgets/"). `FrameGrid(frame, ...)` is a DataFrame in such a grid
with a text filter, a dropdown per category column and a row count; `widgets.browser`
builds its richer filters on the same pieces.
"""

from __future__ import annotations

import functools
import html
import importlib.util
import itertools
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anywidget
import ipywidgets as w
import traitlets

from inspector.ui import (
    DECIMAL_UNITS,
    InspectorError,
    format_bytes,
    html_text,
    legible,
    name_pattern,
)

from .controls import NOT_DRAWN, close_tree, fixed, still
from .esm import (
    HOLDER_TRAIT,
    PREVIEW_TRAIT,
    ModulePreload,
    holder_trait,
    patient,
    shared_module,
)
from .guard import guarded

if TYPE_CHECKING:
    import pandas as pd

    from .plot import FigureBox

__all__ = [
    "GRID_HEIGHT",
    "PREVIEW_ROWS",
    "PREVIEW_SORTED_ROWS",
    "FiguresAndGrid",
    "FrameGrid",
    "GridCells",
    "arrow_bytes",
    "choice",
    "choose_from",
    "client_loading",
    "free_grid",
    "grid_class",
    "grid_module",
    "is_bytes_column",
    "make_grid",
    "match_expression",
    "preload_grids",
    "preview_anew",
    "preview_html",
    "server_binding_only",
    "table_name",
    "wait_for_quiet_grids",
    "yes_no",
]

ANY = "any"
_TABLE_NUMBERS = itertools.count(1)
GRID_HEIGHT = "560px"
_MATCH = "{column} matches"


def is_bytes_column(name: str) -> bool:
    """True for a column drawn as bytes: `size`, or a name ending in ` size`."""
    return name == "size" or name.endswith(" size")


def yes_no(column: pd.Series) -> pd.Series:
    """A boolean column as the grid shows it: "yes" / "no" (sortable and filterable text)."""
    return column.fillna(False).astype(bool).map({True: "yes", False: "no"}).astype(object)


def match_expression(column: str, text: str, *, regex: bool = False) -> tuple[str, str]:
    """(name, Perspective expression) that is True where `column` matches `text` as the
    tensor browser matches names (`inspector._internal.report.query.name_pattern`: glob, text
    or regex)."""
    pattern = name_pattern(text, regex=regex)
    # A Perspective string literal: backslashes and quotes escaped; RE2 sees the pattern.
    literal = pattern.replace("\\", "\\\\").replace("'", "\\'")
    return _MATCH.format(column=column), f"match(\"{column}\", '{literal}')"


# -- the byte cells ---------------------------------------------------------------------------

_UNITS_JS = "[" + ", ".join(f'"{u}"' for u in DECIMAL_UNITS) + "]"
_CELLS_ESM = (
    """
const UNITS = """
    + _UNITS_JS
    + """;
// inspector._internal.common.units.format_bytes: whole bytes below 1 kB, else one decimal,
// decimal units.
function formatBytes(v) {
  if (typeof v !== "number" || !Number.isFinite(v)) return null;
  let value = v;
  for (let i = 0; i < UNITS.length; i++) {
    if (Math.abs(value) < 1000 || i === UNITS.length - 1)
      return i === 0 ? `${Math.trunc(value)} B` : `${value.toFixed(1)} ${UNITS[i]}`;
    value /= 1000;
  }
  return null;
}
const isBytes = (name) => name === "size" || name.endsWith(" size");

function restyle(table) {
  for (const td of table.querySelectorAll("tbody td")) {
    const meta = table.getMeta(td);
    const path = meta && meta.column_header;
    const name = path && path[path.length - 1];
    if (name && isBytes(String(name))) {
      // `value` is the text Perspective drew ("43,680"), `user` the number behind it.
      const raw = meta.user;
      const text = raw === null || raw === undefined || raw === "" ? null : formatBytes(+raw);
      if (text !== null && td.textContent !== text) td.textContent = text;
    }
  }
}

function attach(viewer, tries) {
  if (viewer.__ckptCells) return;
  try {
    // The datagrid plugin element (a child of the viewer once it has drawn) owns the table.
    const plugin = viewer.querySelector("perspective-viewer-datagrid");
    const table =
      plugin &&
      (plugin.regular_table || (plugin.shadowRoot || plugin).querySelector("regular-table"));
    if (!table || !table.addStyleListener) throw new Error("no datagrid yet");
    viewer.__ckptCells = true;
    // Runs after the datagrid's own listener (added first), on every draw and scroll.
    table.addStyleListener(() => restyle(table));
    restyle(table);
  } catch (e) {
    if (tries < 120) setTimeout(() => attach(viewer, tries + 1), 250);
  }
}

export default {
  render({ el }) {
    el.style.display = "none";
    const root = el.closest(".ckpt-grid-box") || el.parentElement || document.body;
    const watch = () => {
      for (const viewer of root.querySelectorAll("perspective-viewer")) attach(viewer, 0);
    };
    const added = new MutationObserver(watch);
    added.observe(root, { childList: true, subtree: true });
    watch();
    return () => added.disconnect();
  },
};
"""
)


class GridCells(anywidget.AnyWidget):
    """Draws the byte columns of the grids in its box (`.ckpt-grid-box`, else its parent
    element) as "22.0 MB"; put one in the box (it draws nothing). The dashboard has one for
    all its tabs, made with it: an anywidget model made while a grid's large module loads
    may miss anywidget's 2 s initialisation window."""

    _esm = patient(_CELLS_ESM)
    # Synced so that the model exists on the page before the first grid (nothing to set).
    version = traitlets.Unicode("1").tag(sync=True)


# -- Perspective's widget, once per kernel ---------------------------------------------------

# perspective-python 5.6 defines the `regular-layout` custom elements without checking whether
# an earlier copy of its module (another grid on the page) already did, and the second grid
# fails to render. Its other elements skip a duplicate registration; this prologue gives these
# three the same treatment.
_DEFINE_ONCE = """
{
  const define = customElements.define.bind(customElements);
  const once = new Set(["regular-layout", "regular-layout-frame", "regular-layout-tab"]);
  if (!customElements.__ckptDefineOnce) {
    customElements.define = (name, cls, options) =>
      once.has(name) && customElements.get(name) ? undefined : define(name, cls, options);
    customElements.__ckptDefineOnce = true;
  }
}
"""
_GRID: type | None = None
_GRID_KIND = "perspective"  # the name `widgets.esm` keys the grids' module with

# perspective-python 5.6's widget module hands the page's viewer a table (`viewer.load(table)`)
# and then restores the widget's state; the viewer's documented way since 4.x is to load the
# client and name the table in `restore` (perspective-viewer's `PerspectiveViewerElement::load`:
# "if you plan to call restore anyway, prefer passing a Client"). The module's one call is
# rewritten so, for the "server" binding the widget uses; any other version is left as it is.
# The module listens to the model's changes only once that `restore` is done, so a change
# that arrives meanwhile (the filter of "show tensor", sent just after the grid is shown) was
# lost and the grid showed every row under "1 of 387 tensors match": the rewritten call
# restores again while the model's state changed during the last restore (at most 5 times).
_LOAD_TABLE = "await n.load(_),await n.restore(Object.fromEntries(Ye.map(b=>[b,e.get(b)])))"
_LOAD_CLIENT = (
    's==="server"?(await n.load(o),await(async()=>{for(let k=null,m,i=0;i<5&&'
    "(m=JSON.stringify(Ye.map(b=>e.get(b))))!==k;i++)k=m,await n.restore({...Object."
    "fromEntries(Ye.map(b=>[b,e.get(b)])),table:a})})()):(" + _LOAD_TABLE + ")"
)


def client_loading(source: str) -> str:
    """Perspective's widget module with the viewer loading the client, not the table."""
    return source.replace(_LOAD_TABLE, _LOAD_CLIENT, 1)


# perspective-python 5.6's widget module carries two WebAssembly binaries as base64 text: the
# viewer's client and the engine a page runs when it holds the table itself (`perspective.
# worker()`, the "client-server" binding). A grid of the "server" binding (every grid here:
# the table is in the kernel) never starts that engine, yet each page decoded its 3.5 MB of
# text as the module was evaluated. `server_binding_only` leaves it out: the function that
# hands it over (the argument of `init_server`) rejects instead. Any other version is left as
# it is.
_INIT_SERVER = re.compile(r"\.init_server\((?P<name>[A-Za-z_$][\w$]*)\)")


def server_binding_only(source: str) -> str:
    """Perspective's widget module without the page-side engine's WebAssembly (see above)."""
    found = _INIT_SERVER.search(source)
    if found is None:
        return source
    name = re.escape(found["name"])
    binary = re.compile(
        rf"var (?P<var>[A-Za-z_$][\w$]*)=[A-Za-z_$][\w$]*\(\"[A-Za-z0-9+/=]*\"\);"
        rf"function {name}\(\)\{{return Promise\.resolve\((?P=var)\.buffer\)\}}"
    )
    matches = list(binary.finditer(source))
    if len(matches) != 1:
        return source
    left_out = (
        f"function {found['name']}(){{return Promise.reject(new Error("
        '"the page-side Perspective engine is left out: grids use the server binding"))}'
    )
    match = matches[0]
    return source[: match.start()] + left_out + source[match.end() :]


@functools.cache
def grid_module() -> tuple[str, str]:
    """The grids' real module (Perspective's, as rewritten here) and its style sheet."""
    # The module file itself (anywidget wraps the class attribute in a file watcher), found
    # without importing Perspective (a third of a second of the kernel): the dashboard sends
    # it to the page as the Overview is shown (`preload_grids`).
    spec = importlib.util.find_spec("perspective")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("perspective is not installed: pip install perspective-python")
    package = Path(next(iter(spec.submodule_search_locations)))
    esm = package / "widget" / "static" / "perspective-anywidget.js"
    source = _DEFINE_ONCE + server_binding_only(client_loading(esm.read_text(encoding="utf-8")))
    css = (esm.parent / "perspective-anywidget.css").read_text(encoding="utf-8")
    return source, css


def preload_grids(preload: ModulePreload) -> None:
    """Have `preload` evaluate the grids' module on its page ahead of the first grid."""
    source, css = grid_module()
    preload.start(source, name=_GRID_KIND, css=css)


# When a grid's viewer last asked its table something (`time.monotonic()`), or when a new
# grid's viewer is expected to begin asking: `_VIEWER_START` seconds after it is made (the
# page draws the widget, then its viewer connects).
_HEARD = [0.0]
_VIEWER_START = 1.5


def _heard(*_args: Any, ahead: float = 0.0) -> None:
    _HEARD[0] = max(_HEARD[0], time.monotonic() + ahead)


# The grid's settings its preview follows.
_PREVIEWED = ("columns", "filter", "expressions", "sort")


def _preview_again(change: Mapping[str, Any]) -> None:
    grid = change["owner"]
    table = getattr(grid, "_preview_table", None)
    if table is not None:
        preview_anew(grid, table)


def preview_anew(grid: Any, table: Any) -> None:
    """`grid`'s preview drawn again from the rows `table` holds with the grid's settings:
    after a change of the settings, and after the table's rows are replaced (a re-scan), as
    every new view of the grid (the page reloaded, the notebook's saved state) shows the
    preview until its viewer draws. A re-scan's grid kept the previous checkpoint's first
    rows there, names and all, unless its filter happened to change."""
    try:
        grid._preview = preview_html(table, **{name: getattr(grid, name) for name in _PREVIEWED})
    except Exception:  # PerspectiveError: the viewer shows what is wrong with the settings
        grid._preview = ""


def _viewer_started(grid: Any, *_args: Any) -> None:
    grid._preview_table = None  # the viewer draws from now on: no preview to follow


def wait_for_quiet_grids(quiet: float, *, limit: float) -> None:
    """Until no grid has been made (see `_VIEWER_START`) or asked its table anything for
    `quiet` seconds, at most `limit` seconds: a viewer that starts asks its table a dozen
    things in turn, each answered by this kernel, and work that holds the interpreter
    meanwhile delays each."""
    end = time.monotonic() + limit
    while (now := time.monotonic()) < end and (left := _HEARD[0] + quiet - now) > 0:
        time.sleep(min(left, end - now))


def grid_class() -> type:
    """PerspectiveWidget whose module is evaluated once per page (`widgets.esm`) and
    whose first state names its table (built once per kernel)."""
    global _GRID
    if _GRID is None:
        from perspective.widget import PerspectiveWidget

        source, css = grid_module()
        stub = shared_module(source, name=_GRID_KIND, waiting="Loading the grid...")

        def __init__(
            self: Any,
            data: Any,
            *,
            layout: Any = None,
            classes: Sequence[str] = (),
            preview: str = "",
            **kwargs: Any,
        ) -> None:
            # The table's name, the size and the CSS classes go into the widget's first state.
            # Perspective's view reads the name when it renders, which on a busy page can come
            # before a later update; and every later update waits for the model's module and
            # is lost when that took over anywidget's 2 s (`widgets.esm`), so a size or class
            # set after creation may never reach the page (no height and no rows then).
            self.table_name = data.get_name()
            if layout is not None:
                self.layout = layout
            self._dom_classes = tuple(classes)
            self._preview = preview
            PerspectiveWidget.__init__(self, data, **kwargs)
            _heard(ahead=_VIEWER_START)
            self.on_msg(_heard)
            if preview:
                # Until the page's viewer first asks the table something, a change of the
                # filter or the sort changes the preview too (see `_preview_again`).
                self._preview_table = data
                self.observe(_preview_again, names=list(_PREVIEWED))
                self.on_msg(_viewer_started)

        attributes = {
            "_esm": stub,
            "_css": "",
            HOLDER_TRAIT: holder_trait(source, css=css),
            # HTML the stub shows until the viewer has drawn (`preview_html`), in the first state.
            PREVIEW_TRAIT: traitlets.Unicode("").tag(sync=True),
            "__init__": __init__,
        }
        _GRID = type("TensorGrid", (PerspectiveWidget,), attributes)
    return _GRID


# How many rows a grid's preview holds: more than a `GRID_HEIGHT` grid shows.
PREVIEW_ROWS = 25
# The most rows a table may have for a sorted or filtered preview: the kernel sorts or
# filters the whole table for it, as the viewer does again (300,000 tensors sorted by name:
# 1.2 CPU-s; unsorted and unfiltered, 0.14 CPU-s at any size).
PREVIEW_SORTED_ROWS = 50_000
# The page's grid, as Perspective's "Pro Light" theme draws it (near enough for a second).
_PREVIEW_STYLE = (
    "<style>.ckpt-grid-preview{border-collapse:collapse;font:11px monospace;color:#161616;"
    "white-space:nowrap;margin:48px 0 0 14px}.ckpt-grid-preview th{text-align:left;"
    "font-weight:400;padding:6px 4px;border-bottom:1px solid #ccc}.ckpt-grid-preview td{"
    "padding:4px 4px;border-bottom:1px solid #eee}.ckpt-grid-preview td.n{text-align:right;"
    "color:#1078d1}</style>"
)


def _preview_cell(column: str, value: Any) -> str:
    if value is None:
        return "<td class='n'>-</td>"  # as the grid draws a missing value
    if isinstance(value, bool) or not isinstance(value, int | float):
        return f"<td>{legible(value, target='html')}</td>"
    if is_bytes_column(column):
        text = format_bytes(value)
    elif isinstance(value, int):
        text = f"{value:,}"
    else:
        text = f"{value:,.2f}"
    return f"<td class='n'>{html.escape(text)}</td>"


def preview_html(table: Any, *, columns: Sequence[str], **config: Any) -> str:
    """The first `PREVIEW_ROWS` rows the grid on `table` with `config` (sort, filter,
    expressions) draws, as a plain HTML table: the page shows it at once, while the grid's
    viewer starts (its WebAssembly, then about twelve requests to the table in turn, 1-3 s
    on a busy machine). Every value escaped, names as `legible` shows them. Empty (no
    preview) for a sorted or filtered table of over `PREVIEW_SORTED_ROWS` rows."""
    options = {k: v for k, v in config.items() if k in ("sort", "filter", "expressions") and v}
    if (options.get("sort") or options.get("filter")) and table.size() > PREVIEW_SORTED_ROWS:
        return ""  # the viewer draws in about the time the preview would take
    view = table.view(columns=list(columns), **options)
    try:
        data = view.to_columns(end_row=PREVIEW_ROWS)
    finally:
        view.delete()
    head = "".join(f"<th>{legible(c, target='html')}</th>" for c in columns)
    rows = "".join(
        "<tr>" + "".join(_preview_cell(c, data[c][i]) for c in columns) + "</tr>"
        for i in range(len(data[columns[0]]) if columns else 0)
    )
    return (
        f"{_PREVIEW_STYLE}<table class='ckpt-grid-preview'><thead><tr>{head}</tr></thead>"
        f"<tbody>{rows}</tbody></table>"
    )


def make_grid(table: Any, *, columns: Sequence[str], title: str, css_class: str, **config: Any):
    """A datagrid on the Perspective `table`, `GRID_HEIGHT` tall, with CSS class `css_class`,
    drawn first as its first rows in plain HTML (`preview_html`) while its viewer starts."""
    return grid_class()(
        table,
        preview=preview_html(table, columns=columns, **config),
        # Perspective's CSS gives its container `flex: 1`, which collapses it to nothing
        # inside a VBox: a fixed flex basis keeps the grid at its height.
        layout=w.Layout(width="100%", height=GRID_HEIGHT, flex="0 0 auto"),
        classes=(css_class,),
        plugin="Datagrid",
        columns=list(columns),
        settings=False,
        theme="Pro Light",
        title=title,
        **config,
    )


def choice(label: str, options: Sequence[Any], css: str, *, width: str = "12em") -> w.Dropdown:
    """A filter dropdown: `any`, then each option (shown legible: a file name may be hostile)."""
    return still(
        w.Dropdown,
        css,
        options=_choices(options),
        value=None,
        description=label,
        layout={"width": width},
        style={"description_width": "auto"},
    )


def choose_from(control: w.Dropdown, options: Sequence[Any]) -> None:
    """Offer `options` in a dropdown of `choice` (sent only when they changed), `any` chosen."""
    offered = _choices(options)
    if list(control.options) != offered:
        control.options = offered
    control.value = None


def _choices(options: Sequence[Any]) -> list[tuple[str, Any]]:
    return [(ANY, None), *((legible(v), v) for v in options)]


# -- a DataFrame in a grid --------------------------------------------------------------------


class FrameGrid:
    """`frame` (its columns already named and typed for people) in a sortable grid, with a
    text filter over column `text` (glob, plain text or, ticked, a regular expression), a
    dropdown per column of `choices`, a toggle per (label, filter) of `flags` (a Perspective
    filter such as `["findings", ">", 0]`) and the number of rows shown; `cells=False` when a
    `GridCells` around it draws its byte columns already (the dashboard's). The grid widget is
    created by `show_grid` (the dashboard calls it when the tab is shown: a grid created in
    a hidden tab has no size to draw rows into)."""

    def __init__(
        self,
        frame: pd.DataFrame,
        *,
        title: str,
        css_class: str,
        text: str,
        choices: Sequence[str] = (),
        flags: Mapping[str, list[Any]] | None = None,
        sort: Sequence[Sequence[str]] = (),
        what: str = "rows",
        cells: bool = True,
    ) -> None:
        import perspective

        self.frame, self.title, self.css_class, self.what = frame, title, css_class, what
        self.text_column, self.sort = text, [list(s) for s in sort]
        self.table = perspective.table(arrow_bytes(frame), name=table_name(css_class))
        self.grid: Any = None
        self._lock = threading.Lock()
        # Its controls' layouts and styles are the kernel's shared ones (`still`).
        self.count = still(w.HTML, f"{css_class}-count")
        self.text = still(
            w.Text,
            f"{css_class}-text",
            placeholder=f"{text}: glob, text, or tick regex",
            continuous_update=False,
            layout={"flex": "1 1 auto", "min_width": "16em"},
        )
        self.regex = still(w.Checkbox, description="regex", indent=False, layout={"width": "5em"})
        self.choices = {
            c: choice(c, sorted(frame[c].dropna().unique().tolist()), f"{css_class}-{_css(c)}")
            for c in choices
        }
        self.flags = {
            label: still(
                w.ToggleButton, f"{css_class}-flag", description=label, layout={"width": "auto"}
            )
            for label in (flags or {})
        }
        self._flag_filters = dict(flags or {})
        for control in (self.text, self.regex, *self.choices.values(), *self.flags.values()):
            control.observe(guarded(self.apply, self.count), names="value")
        self._box = w.VBox(
            [
                still(
                    w.HTML,
                    NOT_DRAWN,
                    value=f"<i>The {html.escape(what)} table is drawn when the tab is shown.</i>",
                )
            ],
            layout=fixed(w.Layout, width="100%"),
        )
        wrap = fixed(w.Layout, flex_flow="row wrap", align_items="center")
        self.widget = w.VBox(
            [
                w.HBox(
                    [self.text, self.regex, *self.choices.values(), *self.flags.values()],
                    layout=wrap,
                ),
                self.count,
                self._box,
                *([GridCells()] if cells else []),
            ],
            layout=w.Layout(width="100%"),
        ).add_class("ckpt-grid-box")
        self.config: dict[str, Any] = {"filter": [], "expressions": {}}
        self.apply()

    def replace(self, frame: pd.DataFrame) -> None:
        """Show `frame` (same columns) instead: the grid keeps its sort and filters."""
        self.frame = frame
        self.table.replace(arrow_bytes(frame))
        self.apply()
        self._preview_anew()

    def reset(self, frame: pd.DataFrame) -> None:
        """Show `frame` with no filter, as a grid made for it shows it (a re-scan's or a check
        of the values' table, in the widgets shown)."""
        if not frame.equals(self.frame):
            self.frame = frame
            self.table.replace(arrow_bytes(frame))
        self.text.value, self.regex.value = "", False
        for column, control in self.choices.items():
            choose_from(control, sorted(frame[column].dropna().unique().tolist()))
        for toggle in self.flags.values():
            toggle.value = False
        self.apply()
        self._preview_anew()

    def _preview_anew(self) -> None:
        """The grid's preview from the rows its table now holds (`preview_anew`)."""
        with self._lock:
            grid = self.grid
        if grid is not None:
            preview_anew(grid, self.table)

    def show_grid(self) -> None:
        """Create the grid widget (once; safe from two threads at once)."""
        with self._lock:
            if self.grid is not None:
                return
            self.grid = make_grid(
                self.table,
                columns=list(self.frame.columns),
                title=self.title,
                css_class=self.css_class,
                sort=self.sort,
                filter=self.config["filter"],
                expressions=self.config["expressions"],
            )
            # The line that stood for the grid is closed with it gone (issue 35).
            waiting, self._box.children = self._box.children, [self.grid]
            for line in waiting:
                close_tree(line)

    def apply(self) -> None:
        """Filter the grid by the controls and count the rows shown."""
        filters: list[list[Any]] = []
        expressions: dict[str, str] = {}
        if self.text.value.strip():
            try:
                name, expression = match_expression(
                    self.text_column, self.text.value, regex=self.regex.value
                )
            except InspectorError as exc:
                self.count.value = f"<span style='color:#d62728'>{html_text(exc)}</span>"
                return
            expressions[name] = expression
            filters.append([name, "==", True])
        for column, control in self.choices.items():
            if control.value is not None:
                filters.append([column, "==", control.value])
        for label, toggle in self.flags.items():
            if toggle.value:
                filters.append(list(self._flag_filters[label]))
        with self._lock:  # a grid being created takes these filters or gets them here
            self.config = {"filter": filters, "expressions": expressions}
            if self.grid is not None:
                self.grid.expressions = expressions
                self.grid.filter = filters
        self.count.value = (
            f"<b>{self.matches():,}</b> of {len(self.frame):,} {html.escape(self.what)} "
            "<span style='color:#666'>(click a column header to sort)</span>"
        )

    def matches(self) -> int:
        """How many rows the current filters let through (counted by the grid's engine)."""
        if not self.config["filter"]:
            return len(self.frame)
        view = self.table.view(**self.config)
        try:
            return view.num_rows()
        finally:
            view.delete()

    def rows(self) -> pd.DataFrame:
        """The rows the grid shows, in its sort order (what a test or an export reads)."""
        import pandas as pd  # here: the dashboard imports this module (`GridCells`) to start

        view = self.table.view(**self.config, sort=self.sort)
        try:
            return pd.DataFrame(view.to_columns())[list(self.frame.columns)]
        finally:
            view.delete()

    def close(self) -> None:
        """Free the grid's table in the kernel."""
        free_grid(self.grid, self.table)


def free_grid(grid: Any, table: Any) -> None:
    """Close `grid` (when there is one) and free its perspective `table` in the kernel."""
    if grid is not None:
        grid.close()
    # The page's grid may still hold a view on the table (the page lets go of it later):
    # the table then stays until the kernel ends. (`delete(lazy=True)` blocks here.)
    try:
        table.delete()
    except Exception as exc:  # PerspectiveError, not importable before perspective is
        if "with views" not in str(exc):
            raise


def table_name(prefix: str) -> str:
    """A name no other table in this kernel's Perspective server has (or had: an `id()` is
    reused once its object is gone, and a grid binds to its table by name)."""
    return f"{prefix}-{next(_TABLE_NUMBERS)}"


def arrow_bytes(frame: pd.DataFrame) -> bytes:
    """`frame` as an Arrow IPC stream, what a Perspective table loads and replaces its rows
    with (without the pandas index, which Perspective would add as a column). A text column
    with no value (an empty table's) is sent as text: Arrow infers the null type, which
    Perspective makes a float column, and a re-scan's rows (a folder that held a shard of no
    tensors, then a checkpoint) could not replace them ("Could not fill column `param` with
    t_dtype: `float64`"): the Tensors tab was never renewed."""
    import pyarrow as pa

    table = pa.Table.from_pandas(frame, preserve_index=False)
    if any(pa.types.is_null(field.type) for field in table.schema):
        table = table.cast(
            pa.schema(
                [
                    field.with_type(pa.string()) if pa.types.is_null(field.type) else field
                    for field in table.schema
                ]
            )
        )
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue().to_pybytes())


def _css(label: str) -> str:
    return "-".join(label.split())


class FiguresAndGrid:
    """A tab of figures (`figures`, a FigureBox) above a grid (`table`, a FrameGrid): both
    drawn when the tab is first shown, the grid first (the rows a person came for; the
    figures may be made then), the grid closed with the tab."""

    figures: FigureBox
    table: FrameGrid
    dash: Any

    def on_shown(self) -> None:
        self.table.show_grid()
        self.figures.show()

    # Set by the tab: the scan it was drawn from, and its table for a state (`renew`).
    scanned: Any = None
    frame: Callable[[Any], pd.DataFrame]

    def renew(self) -> bool:
        """Show the dashboard's state in the widgets shown, as a tab built now shows it: the
        grid's table replaced (its viewer redraws; a new grid's viewer took 1-3 s to start),
        the filters cleared, and after a re-scan each figure that changed made again."""
        dash = self.dash
        state = dash.current
        if state.scanned is not self.scanned:
            self.scanned = state.scanned
            self.figures.renew()
        self.table.reset(self.frame(state))
        dash.when_checked(lambda later: self.table.replace(self.frame(later)), drawn=state)
        return True

    def close(self) -> None:
        self.table.close()
