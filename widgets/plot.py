"""Plotly figures as widgets in the dashboard: plotly's own `FigureWidget` (hover, zoom, and the
clicks a heatmap cell answers), with two changes that a dashboard of several figures needs.

- Its module is plotly.js with its widget, 5 MB, evaluated by the page once per figure, and
  its model must load it within anywidget's 2 s or lose every later update: here the module
  is evaluated once per page, when the first figure is drawn (`widgets.esm`).
- It opens its comm before it holds its figure, and sends the data and the layout as updates
  right after. A view that renders before those updates reach it (a figure made while its tab
  is on screen: the page is fast enough to render it at once) draws empty axes, and plotly's
  data handler does nothing when the data arrives later. Here the comm opens once the figure,
  its size policy and its CSS class are set, so the first state holds them all.

The dashboard makes a tab's figures when the tab is first shown, so a figure is never drawn
into a hidden tab with no size, and plotly.js is evaluated only when a figure is wanted (not
while a person opens the Tensors tab). `Autosize` re-measures them as the tab changes size.

Importing plotly's widget (`import_figure_widget`) imports its renderers, which import
nbformat only to check its version when a figure is shown as a MIME bundle (`fig.show()`);
nbformat imports jsonschema, whose format checkers build `rfc3987_syntax`'s lark grammar at
import: 1.8-4.2 s of the kernel's CPU, measured here on different days, for nothing a
dashboard uses. So the renderers get a stand-in that imports nbformat on its first use: a
`fig.show()` still finds it, and pays for it then, as it would have.
"""

from __future__ import annotations

import importlib
import importlib.util
import threading
from pathlib import Path
from typing import Any

import ipywidgets as w

from .esm import SOURCE_TRAIT, shared_module, shared_source

__all__ = ["FigureBox", "figure_widget", "import_figure_widget"]

_FIGURE: type | None = None
_LOCK = threading.Lock()
_IMPORT_LOCK = threading.Lock()


def figure_widget(figure: Any, css_class: str) -> Any:
    """An interactive copy of the plotly `figure` with a stable CSS class, as wide as its
    output (see the module docstring)."""
    layout = {**figure.layout.to_plotly_json(), "autosize": True}
    return _figure_class()(data=figure.data, layout=layout, css_class=css_class)


class _OnFirstUse:
    """Stands for the module `name`, imported at the first attribute asked of it."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attribute: str) -> Any:
        return getattr(importlib.import_module(self._name), attribute)


def import_figure_widget() -> Any:
    """plotly's `FigureWidget`, imported with nbformat put off until a renderer uses it
    (see the module docstring); a plain import when plotly's renderers are imported already
    or nbformat is not installed (plotly then says it is missing, as it always did)."""
    import plotly.optional_imports as optional

    get_module = optional.get_module
    stand_in = _OnFirstUse("nbformat")

    def put_off(name: str, should_load: bool = True) -> Any:
        if name == "nbformat" and should_load and importlib.util.find_spec(name) is not None:
            return stand_in
        return get_module(name, should_load)

    with _IMPORT_LOCK:
        optional.get_module = put_off
        try:
            from plotly.graph_objs._figurewidget import FigureWidget
        finally:
            optional.get_module = get_module
    return FigureWidget


def _figure_class() -> type:
    """`FigureWidget` with the shared module and a first state that holds the figure (built
    once per kernel: importing plotly's widget takes a second)."""
    global _FIGURE
    with _LOCK:
        if _FIGURE is None:
            import plotly

            figure_widget_class = import_figure_widget()

            bundle = Path(plotly.__file__).parent / "package_data" / "widgetbundle.js"
            source = bundle.read_text(encoding="utf-8")
            stub = shared_module(
                source, name="plotly", waiting="Drawing the figure (loading plotly.js)..."
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
                SOURCE_TRAIT: shared_source(source),
                "__init__": __init__,
                "open": open,
                "__doc__": None,
            }
            _FIGURE = type("DashboardFigure", (figure_widget_class,), attributes)
        return _FIGURE


class FigureBox:
    """The figures of a tab, made into widgets when the tab is first shown (`show`); until
    then a line that says so. Safe to show from two threads at once."""

    def __init__(self, figures: list[tuple[Any, str]]) -> None:
        self._figures = figures
        self.widgets: list[Any] = []
        self._lock = threading.Lock()
        self.box = w.VBox(
            [w.HTML("<i style='color:#666'>The figures are drawn when the tab is shown.</i>")],
            layout=w.Layout(width="100%"),
        )

    def show(self) -> list[Any]:
        """The figure widgets (made on the first call), in the order given."""
        with self._lock:
            if not self.widgets:
                self.widgets = [figure_widget(f, css) for f, css in self._figures]
                self.box.children = tuple(self.widgets)
            return self.widgets
