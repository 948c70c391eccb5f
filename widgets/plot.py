"""Plotly figures as widgets in the dashboard: plotly's own `FigureWidget` in the kernel (its
figure, and the clicks a heatmap cell answers), with three changes that a dashboard of several
figures needs.

Its module is evaluated once per page (`widgets.esm`), it is plotly.js's cartesian bundle
with a small front end instead of the whole of plotly.js, and its comm opens only once the
figure is set, so that no figure freezes the page or draws empty axes. The figures behind
these choices: docs/architecture.md, "widgets/".
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import ipywidgets as w

from .controls import NOT_DRAWN, close_tree, still
from .esm import HOLDER_TRAIT, holder_trait, module_holder, shared_module
from .plotlyjs import cartesian_bundle
from .renderers import nbformat_put_off

__all__ = ["FigureBox", "figure_widget", "import_figure_widget", "send_figure_module"]

_FIGURE: type | None = None
_FIGURE_KIND = "plotly"  # the name `widgets.esm` keys the figures' module with
_LOCK = threading.Lock()

# The figure's front end (see the module docstring). The bundle is run inside a function that
# hands it a CommonJS `module` of its own, so no AMD loader on the page takes it; it also sets
# `window.Plotly`, which is put back as it was, so a full plotly.js that another output of the
# notebook loads (3D, maps) is never replaced by this smaller one. The widget's state comes as
# plotly's serializers send it: numeric 1-D arrays as {dtype, shape, buffer} and `Undefined` as
# "_undefined_"; clicks, hovers and selections go back as the points message plotly's widget
# sends (`_js2py_pointsCallback`).
_FRONT = """
const Plotly = (() => {
  const module = { exports: {} };
  const exports = module.exports;
  const define = undefined;
  const kept = Object.getOwnPropertyDescriptor(window, "Plotly");
  (function () {
%(bundle)s
  }).call(window);
  const plotly = module.exports.newPlot ? module.exports : window.Plotly;
  if (kept) Object.defineProperty(window, "Plotly", kept);
  else delete window.Plotly;
  return plotly;
})();

const TYPED = {
  int8: Int8Array, int16: Int16Array, int32: Int32Array, uint8: Uint8Array,
  uint16: Uint16Array, uint32: Uint32Array, float32: Float32Array, float64: Float64Array,
};

function fromKernel(value) {
  if (value === "_undefined_") return undefined;
  if (Array.isArray(value)) return value.map(fromKernel);
  if (value && typeof value === "object") {
    const view = value.buffer;
    if (view instanceof DataView && TYPED[value.dtype]) {
      const bytes = view.buffer.slice(view.byteOffset, view.byteOffset + view.byteLength);
      return new TYPED[value.dtype](bytes);
    }
    if (ArrayBuffer.isView(value) || value instanceof ArrayBuffer) return value;
    const out = {};
    for (const [key, item] of Object.entries(value)) out[key] = fromKernel(item);
    return out;
  }
  return value;
}

function pointsMessage(type, event) {
  const points = { trace_indexes: [], point_indexes: [], xs: [], ys: [] };
  for (const point of event?.points ?? []) {
    points.trace_indexes.push(point.curveNumber);
    points.point_indexes.push(point.pointNumbers ?? point.pointNumber);
    points.xs.push(point.x);
    points.ys.push(point.y);
  }
  const mouse = event?.event;
  const message = { event_type: type, points };
  if (mouse && "button" in mouse) {
    message.device_state = {
      ctrl: mouse.ctrlKey, alt: mouse.altKey, shift: mouse.shiftKey, meta: mouse.metaKey,
      button: mouse.button, buttons: mouse.buttons,
    };
  }
  if (event?.range) {
    const { x, y } = event.range;
    message.selector = { type: "box", selector_state: { xrange: x, yrange: y } };
  } else if (event?.lassoPoints) {
    const { x, y } = event.lassoPoints;
    message.selector = { type: "lasso", selector_state: { xs: x, ys: y } };
  }
  return message;
}

export default {
  async render({ model, el }) {
    const state = (name) => fromKernel(model.get(name));
    await Plotly.newPlot(el, state("_widget_data"), state("_widget_layout"), state("_config"));
    const events = ["click", "hover", "unhover", "selected", "deselect"].map((e) => `plotly_${e}`);
    for (const type of events) {
      el.on(type, (event) => {
        model.set("_js2py_pointsCallback", pointsMessage(type, event));
        model.save_changes();
      });
    }
    return () => Plotly.purge(el);
  },
};
"""


# How plotly's widget sends an edit of a shown figure to the page (none reaches `_FRONT`).
_EDIT_MESSAGES = (
    "_send_restyle_msg",
    "_send_relayout_msg",
    "_send_update_msg",
    "_send_addTraces_msg",
    "_send_deleteTraces_msg",
    "_send_moveTraces_msg",
    "_send_animate_msg",
)


def _drawn_once(*_args: Any, **_kwargs: Any) -> None:
    """Stands for plotly's edit messages on a dashboard figure (see the module docstring)."""
    raise TypeError(
        "a dashboard figure is drawn once from its first state and cannot be edited after it "
        "is made: make a new one with inspector.widgets.plot.figure_widget(figure, css_class)"
    )


def figure_module() -> str:
    """The real module of the dashboard's figures: `_FRONT` with plotly.js's cartesian bundle."""
    return _FRONT % {"bundle": cartesian_bundle()}


def send_figure_module() -> None:
    """Send the figures' module to the page ahead of the first figure, not evaluated there:
    plotly.js's evaluation is one task of 0.8-3 s (idle to load 13), which a click that
    lands in it waits behind, so the first figure still evaluates it once the grids being
    drawn have drawn (`_figure_class`); the 1.5 MB no longer crosses on that click."""
    module_holder(figure_module())


def figure_widget(figure: Any, css_class: str) -> Any:
    """An interactive copy of the plotly `figure` with a stable CSS class, as wide as its
    output (see the module docstring)."""
    layout = {**figure.layout.to_plotly_json(), "autosize": True}
    return _figure_class()(data=figure.data, layout=layout, css_class=css_class)


def import_figure_widget() -> Any:
    """plotly's `FigureWidget`, imported with nbformat put off (`widgets.renderers`)."""
    with nbformat_put_off():
        from plotly.graph_objs._figurewidget import FigureWidget
    return FigureWidget


def _figure_class() -> type:
    """`FigureWidget` with the shared module and a first state that holds the figure (built
    once per kernel: importing plotly's widget takes a second)."""
    global _FIGURE
    with _LOCK:
        if _FIGURE is None:
            figure_widget_class = import_figure_widget()
            source = figure_module()
            # A tab of a grid and figures (Files, Layers) makes its grid first: plotly.js's
            # evaluation (1.7 s of the page on a busy machine) waits for the grid's rows.
            stub = shared_module(
                source,
                name=_FIGURE_KIND,
                waiting="Drawing the figure (loading plotly.js)...",
                after=("perspective",),
            )

            def __init__(self: Any, *, data: Any, layout: Any, css_class: str) -> None:
                self._hold_comm = True  # `open` waits until the figure is set (see below)
                figure_widget_class.__init__(self, data=data, layout=layout)
                self.add_class(css_class)
                # Re-measure on window resize events (which `Autosize` sends when a figure
                # gets its width).
                self._config = {**self._config, "responsive": True}
                self._hold_comm = False
                self.open()

            def open(self: Any) -> None:
                if not getattr(self, "_hold_comm", False):
                    figure_widget_class.open(self)

            attributes = {
                "_esm": stub,
                HOLDER_TRAIT: holder_trait(source),
                "__init__": __init__,
                "open": open,
                "__doc__": None,
                **{name: _drawn_once for name in _EDIT_MESSAGES},
            }
            _FIGURE = type("DashboardFigure", (figure_widget_class,), attributes)
        return _FIGURE


Figures = list[tuple[Any, str]]  # (plotly figure, CSS class) of each figure of a tab


class FigureBox:
    """The figures of a tab, made into widgets when the tab is first shown (`show`); until
    then a line that says so. `figures` may be what makes them, called then too, so that a
    tab is built without paying for figures it may never show. Safe to show from two
    threads at once."""

    def __init__(self, figures: Figures | Callable[[], Figures]) -> None:
        self._figures = figures
        self.widgets: list[Any] = []
        # Each shown figure's JSON (`renew` makes again those that changed).
        self._drawn: list[str] = []
        self._lock = threading.Lock()
        # Marked as not drawn, as the grids' place holder is: the dashboard's module preload
        # waits while it shows, and a page (or a test) can tell it from a drawn figure.
        self.box = w.VBox(
            [
                still(
                    w.HTML,
                    NOT_DRAWN,
                    value="<i style='color:#666'><i class='fa fa-spinner fa-spin'"
                    " style='margin-right:6px'></i>The figures are drawn when the tab is"
                    " shown.</i>",
                )
            ],
            layout=w.Layout(width="100%"),
        )

    def renew(self, figures: Figures | Callable[[], Figures] | None = None) -> None:
        """Show `figures` (when None, those the box's callable makes now: what it reads
        changed, a re-scan) in place of those given before: once shown, each that differs
        from the one shown is made again, the one it replaces closed (a figure is drawn once)."""
        with self._lock:
            if figures is not None:
                self._figures = figures
            if not self.widgets:
                return
            figures = self._figures() if callable(self._figures) else self._figures
            now = [figure.to_json() for figure, _ in figures]
            widgets = [
                widget if drawn == json else figure_widget(figure, css)
                for (figure, css), widget, drawn, json in zip(
                    figures, self.widgets, self._drawn, now, strict=True
                )
            ]
            self._drawn = now
            old, self.widgets = self.widgets, widgets
            self.box.children = tuple(widgets)
            for widget in old:
                if widget not in widgets:
                    close_tree(widget)

    def show(self) -> list[Any]:
        """The figure widgets (made on the first call), in the order given."""
        with self._lock:
            if not self.widgets:
                figures = self._figures() if callable(self._figures) else self._figures
                self.widgets = [figure_widget(f, css) for f, css in figures]
                self._drawn = [figure.to_json() for figure, _ in figures]
                # The line that stood for them is closed with it gone (issue 35).
                waiting, self.box.children = self.box.children, tuple(self.widgets)
                for line in waiting:
                    close_tree(line)
            return self.widgets
