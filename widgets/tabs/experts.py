"""The Experts tab: the layer x expert coverage heatmap, one layer zoomed in, and an expert's
tensors and findings.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import ipywidgets as w

from inspector.ui import Finding, findings_html, frame_html, layer_name, severity_rank

from ..controls import close_tree, fixed, still
from ..guard import guarded
from ..plot import FigureBox, figure_widget

if TYPE_CHECKING:
    from . import Host

__all__ = ["ExpertsPanel"]

_TENSOR_COLUMNS = ["name", "file", "dtype", "shape", "numel", "nbytes"]


class ExpertsPanel:
    """Layer x expert coverage heatmap over the whole model; below it one layer zoomed in (a
    cell per expert, labelled with its id). Clicking either, or the layer / expert picker,
    lists that expert's tensors and findings. The figure widgets are made when the tab is
    first shown (`on_shown`; `figure` is None until then)."""

    def __init__(self, dash: Host) -> None:
        from ..figures import expert_coverage_heatmap

        self.dash = dash
        s = self.scanned = dash.scanned
        self.heatmap = FigureBox(
            [(expert_coverage_heatmap(s.experts, tensors=s.tensors), "ckpt-expert-heatmap")]
        )
        self.figure: Any = None
        self._shown = threading.Lock()
        layers = sorted({int(v) for v in s.experts["layer"].dropna()}) if len(s.experts) else []
        # Its controls' layouts and styles are the kernel's shared ones (`still`).
        self.layer = still(w.Dropdown, "ckpt-layer-pick", options=layers, description="layer")
        top = int(s.experts["expert"].max()) if len(s.experts) else 0
        self.expert = still(
            w.BoundedIntText, "ckpt-expert-pick", min=0, max=max(top, 0), description="expert"
        )
        show = still(w.Button, "ckpt-show-expert", description="Show tensors")
        show.on_click(
            guarded(lambda: self.show(self.layer.value, self.expert.value), self.dash.notice)
        )
        self.zoom = still(w.VBox, "ckpt-expert-zoom", layout={"width": "100%"})
        self.zoomed: int | None = None
        self.details = still(w.HTML, "ckpt-expert-details")
        picker = w.HBox([self.layer, self.expert, show], layout=fixed(w.Layout))
        self.widget = w.VBox(
            [self.heatmap.box, picker, self.zoom, self.details], layout=w.Layout(width="100%")
        )
        self.opening: int | None = None
        if layers:
            self.layer.value = self.opening = _worst_layer(dash.current.findings, layers)

    def renew(self) -> bool:
        """After a check of the values (the same scan), the panel as a tab built now shows
        it, in the widgets shown: opened on the layer with the worst finding, no expert's
        details. A re-scan's tab is built again (its heatmap is another figure)."""
        if self.dash.scanned is not self.scanned:
            return False
        layers = list(self.layer.options)
        self.details.value = ""
        self.expert.value = 0
        if layers:
            self.layer.value = self.opening = _worst_layer(self.dash.current.findings, layers)
            if self.figure is not None:
                self._zoom_into(self.opening)
        return True

    def on_shown(self) -> None:
        """Make the heatmap (clicks on it show an expert) and the zoom into the opening layer
        (once)."""
        with self._shown:
            if self.figure is not None:
                return
            (figure,) = self.heatmap.show()
            if figure.data:
                figure.data[0].on_click(
                    lambda *args: guarded(lambda: self._on_click(*args), self.dash.notice)()
                )
            self.figure = figure
            if self.opening is not None and self.zoomed is None:
                self._zoom_into(self.opening)

    def show(self, layer: int | None, expert: int | None) -> None:
        """Zoom into `layer`, point the pickers at (layer, expert), and list that expert's
        tensors and findings (or, without an expert, the layer's findings)."""
        if layer is None:
            self.details.value = "<i>No MoE layer in this checkpoint.</i>"
            return
        if layer in self.layer.options:
            self.layer.value = layer
        if expert is not None:
            self.expert.value = min(max(expert, self.expert.min), self.expert.max)
        self._zoom_into(layer)
        s, frame = self.dash.scanned, self.dash.current.frame
        same_layer = (frame["layer"] == layer).fillna(False)
        # The one layer numbering (MTP layers after the decoder's, said "MTP layer").
        name = layer_name(layer, mtp=layer in set(s.layers.loc[s.layers["is_mtp"], "layer"]))
        if expert is None:
            notes = frame[same_layer]
            self.details.value = f"<h4>{name}</h4>" + (
                findings_html(notes, max_rows=50) if len(notes) else "<i>No findings.</i>"
            )
            return
        t = s.tensors
        mine = t[(t["layer"] == layer) & (t["expert"] == expert)]
        row = s.experts[(s.experts["layer"] == layer) & (s.experts["expert"] == expert)]
        # Findings about this expert, and about its whole layer (e.g. "experts 64-511 missing").
        mine_or_all = (frame["expert"] == expert).fillna(False) | frame["expert"].isna()
        notes = frame[same_layer & mine_or_all]
        self.details.value = (
            f"<h4>{name}, expert {expert}</h4>"
            + frame_html(row, max_rows=1, title="coverage")
            + frame_html(mine, columns=_TENSOR_COLUMNS, max_rows=200, title="tensors")
            + (findings_html(notes, max_rows=50) if len(notes) else "")
        )

    def _zoom_into(self, layer: int) -> None:
        from ..figures import expert_layer_grid

        if layer == self.zoomed:
            return
        s = self.dash.scanned
        grid = figure_widget(
            expert_layer_grid(s.experts, layer, tensors=s.tensors), "ckpt-expert-layer"
        )
        if grid.data:
            grid.data[0].on_click(
                lambda *args: guarded(lambda: self._on_zoom_click(*args), self.dash.notice)()
            )
        # A figure is drawn once: the layer it replaces is closed (each zoom left it open).
        old, self.zoom.children = self.zoom.children, [grid]
        for figure in old:
            close_tree(figure)
        self.zoomed = layer

    def _on_click(self, trace: Any, points: Any, _state: Any) -> None:
        # Cell heatmaps have expert numbers on x; binned ones a label "first-last".
        if not points.xs:
            return
        layer = int(points.ys[0])
        x = points.xs[0]
        expert = int(str(x).split("-")[0]) if isinstance(x, str) else int(x)
        if self._recorded(layer, expert):
            self.show(layer, expert)

    def _on_zoom_click(self, trace: Any, points: Any, _state: Any) -> None:
        # Rows are labelled "first-last" expert; columns are the offset within the row. The
        # last row's cells past the layer's last expert are empty: a click there is no expert.
        if not points.xs or self.zoomed is None:
            return
        first = int(str(points.ys[0]).split("-")[0])
        expert = first + int(points.xs[0])
        if self._recorded(self.zoomed, expert):
            self.show(self.zoomed, expert)

    def _recorded(self, layer: int, expert: int) -> bool:
        """True when the scan knows expert `expert` of `layer` (found or missing): a figure's
        empty cell is not one."""
        e = self.dash.scanned.experts
        return bool(((e["layer"] == layer) & (e["expert"] == expert)).any())


def _worst_layer(findings: Sequence[Finding], layers: Sequence[int]) -> int:
    """The layer the Experts tab opens on: the first of `layers` with the worst finding
    about it (an `expert-missing` error in layer 40 beats an info note in layer 3), else
    the first layer."""
    candidates = [
        (severity_rank(f.severity), f.layer)
        for f in findings
        if f.layer is not None and f.layer in layers
    ]
    return min(candidates)[1] if candidates else layers[0]
