"""The dashboard's Values view: value statistics of every tensor
(`inspector._internal.checks.values`) as the layer x tensor-kind heatmap of
`widgets.figures.values_heatmap` (std or absmax), outliers marked; a click on a cell shows that
tensor's row of `ckpt.values`.

Nothing is read until asked: the table a `check(values=...)` already computed is shown at once,
otherwise the Sample and Full buttons each call `inspector._internal.checks.values.value_table`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

import ipywidgets as w
import pandas as pd

from inspector.ui import computed_value_table, frame_html, value_table

from ..controls import close_tree, fixed, still
from ..figures import METRICS, values_heatmap
from ..guard import captured, guarded

if TYPE_CHECKING:
    from inspector.ui import ScannedCheckpoint

    from . import Host

__all__ = ["ValuesPanel", "values_tab"]

_ROW_COLUMNS = [
    "name",
    "dtype",
    "mode",
    "elements",
    "min",
    "max",
    "mean",
    "std",
    "absmax",
    "zero_frac",
    "nan",
    "inf",
    "sibling_std",
    "sibling_absmax",
    "finding",
    "why",
]


class ValuesPanel:
    """Metric picker, Sample / Full buttons, the heatmap and the clicked tensor's row."""

    def __init__(
        self,
        scanned: ScannedCheckpoint,
        *,
        figure: Any,
        check_values: Callable[[Literal["sample", "full"]], None] | None = None,
    ) -> None:
        # `figure` turns a plotly figure into a widget (the dashboard's `figure_widget`);
        # `check_values` reads and checks the values (the dashboard's, whose findings then
        # show everywhere); without it the panel reads them into its own table.
        self.scanned = scanned
        self._figure = figure
        self._check_values = check_values
        self.table: pd.DataFrame | None = computed_value_table(scanned)
        # The (table, metric) the heatmap shows: a draw of the same makes no new figure.
        self._drawn: tuple[pd.DataFrame | None, str] | None = None
        # Its controls' layouts and styles are the kernel's shared ones (`still`).
        self.metric = still(
            w.ToggleButtons,
            "ckpt-values-metric",
            options=list(METRICS),
            value="std",
            description="colour",
        )
        self.status = still(w.HTML, "ckpt-values-status")
        # Every handler through `guarded`: in a live kernel an error would otherwise reach
        # only the kernel log, and the click would seem to do nothing.
        self.metric.observe(guarded(self._draw, self.status), names="value")
        self.sample = still(w.Button, "ckpt-values-sample", description="Sample values")
        self.full = still(w.Button, "ckpt-values-full", description="Read all values")
        self.sample.on_click(guarded(lambda: self.compute("sample"), self.status))
        self.full.on_click(guarded(lambda: self.compute("full"), self.status))
        self.progress = still(w.Output)  # the read's progress bar (tqdm)
        self.plot = still(w.VBox, "ckpt-values-plot", layout={"width": "100%"})
        self.details = still(w.HTML, "ckpt-values-details")
        self.widget = w.VBox(
            [
                w.HBox([self.metric, self.sample, self.full], layout=fixed(w.Layout)),
                self.status,
                self.progress,
                self.plot,
                self.details,
            ],
            layout=w.Layout(width="100%"),
        )
        self._draw()

    def compute(self, mode: str) -> None:
        """Read the values (`sample` or `full`) and redraw."""
        self.status.value = f"<i>Reading values ({mode})...</i>"
        self.progress.clear_output()
        read: Literal["sample", "full"] = "full" if mode == "full" else "sample"
        if self._check_values is not None:
            self._check_values(read)  # the dashboard redraws this tab from the new state
            self.table = computed_value_table(self.scanned)
            return
        self.table = captured(self.progress, lambda: value_table(self.scanned, read))
        self.progress.clear_output()
        self._draw()

    def show_scan(self, scanned: ScannedCheckpoint) -> None:
        """Show `scanned` and the values read for it (a check of the values, a re-scan) in the
        widgets shown, as a panel made for it shows them."""
        self.scanned = scanned
        self.table = computed_value_table(scanned)
        self.details.value = ""
        if self.progress.outputs:  # a clear of nothing is one more message for the page
            self.progress.clear_output()
        if self.metric.value != "std":
            self._drawn = None
            self.metric.value = "std"  # draws (its observer)
        self._draw()

    def show(self, name: str) -> None:
        """Show the row of tensor `name`."""
        if self.table is None:
            return
        row = self.table[self.table["name"] == name]
        self.details.value = frame_html(row, columns=_ROW_COLUMNS, max_rows=1, title=name)

    def _draw(self) -> None:
        drawn, self._drawn = self._drawn, (self.table, str(self.metric.value))
        if self.table is None:
            self.status.value = (
                "<i>No values read yet: sample a few windows of every tensor, or read them "
                "all (see docs/values.md).</i>"
            )
            self._plot(())
            return
        flagged = int((self.table["finding"] != "").sum())
        mode = str(self.table["mode"].iat[0]) if len(self.table) else "-"
        self.status.value = (
            f"{len(self.table):,} tensors ({mode}); {flagged:,} out of line with their siblings"
        )
        if drawn is not None and drawn[0] is self.table and drawn[1] == self._drawn[1]:
            return  # the heatmap shown is this one
        widget = self._figure(values_heatmap(self.table, metric=self.metric.value), "ckpt-values")
        for trace in widget.data:
            trace.on_click(lambda *args: guarded(lambda: self._on_click(*args), self.status)())
        self._plot((widget,))

    def _plot(self, figures: tuple[Any, ...]) -> None:
        """Show `figures` in place of the heatmap shown, which is closed (a figure is drawn
        once: each metric or table drawn left the last one open in the kernel and page)."""
        old, self.plot.children = self.plot.children, figures
        for figure in old:
            if figure not in figures:
                close_tree(figure)

    def _on_click(self, trace: Any, points: Any, _state: Any) -> None:
        if not points.point_inds:
            return
        index = points.point_inds[0]
        data = trace.customdata
        name = data[index[0]][index[1]] if isinstance(index, (list, tuple)) else data[index]
        if name:
            self.show(str(name))


class ValuesTab(ValuesPanel):
    """The dashboard's Values tab: the values it reads are checked with everything else, and
    the state that check (or a re-scan) makes is shown in place (`renew`)."""

    def __init__(self, dash: Host) -> None:
        from ..plot import figure_widget

        self.dash = dash
        super().__init__(dash.scanned, figure=figure_widget, check_values=dash.check_values)

    def renew(self) -> bool:
        self.show_scan(self.dash.scanned)
        return True


def values_tab(dash: Host) -> ValuesPanel:
    """The dashboard's Values tab (`ValuesTab`)."""
    return ValuesTab(dash)
