"""The notebook dashboard: `Dashboard(path_or_scanned)` shows a checkpoint in eight tabs.

The widgets hold no logic. Every action is one call into `inspector` (scan, check, plan a
repair, execute it, plan and run a consolidation, write a report); figures come from
`widgets.figures`, tables from `inspector.html_repr`. Tabs other than Overview are built the
first time they are selected, so a 300,000-tensor checkpoint opens after one scan and one check.

Key widgets carry stable CSS classes (`ckpt-*`) so a browser test can find them.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ipywidgets as w
import pandas as pd
import plotly.graph_objects as go
from inspector.widgets.figures import (
    bytes_per_layer,
    expert_coverage_heatmap,
    findings_by_code,
    parameters_per_layer,
    shard_size_distribution,
    shard_size_outliers,
)

from inspector.checks import check
from inspector.findings import Finding, findings_to_frame
from inspector.html_repr import code_help_html, findings_html, frame_html, scanned_html
from inspector.model import ScannedCheckpoint
from inspector.scan import scan
from inspector.storage import Location, RemoteURL

__all__ = ["CheckpointState", "Dashboard"]

_ALL = "all"
_TENSOR_COLUMNS = ["name", "file", "dtype", "shape", "numel", "nbytes"]
_FILE_COLUMNS = ["file", "size", "tensors", "tensor_bytes", "first_layer", "last_layer", "problems"]


@dataclass(frozen=True)
class CheckpointState:
    """One scan of the checkpoint and its findings; replaced as a whole on refresh."""

    scanned: ScannedCheckpoint
    findings: tuple[Finding, ...]
    frame: pd.DataFrame  # the findings as `findings_to_frame` returns them

    @classmethod
    def load(
        cls, source: str | os.PathLike[str] | Location | ScannedCheckpoint, *, deep: bool = False
    ) -> CheckpointState:
        """Scan `source` (unless it is already a scan) and run every check."""
        scanned = source if isinstance(source, ScannedCheckpoint) else scan(source)
        findings = tuple(check(scanned, deep=deep))
        return cls(scanned, findings, findings_to_frame(findings))


class Dashboard:
    """An ipywidgets app over one checkpoint; display it as the last expression of a cell.

    Tabs: Overview, Files, Experts, Layers, Drift, Repair, Consolidate, Report. `refresh()`
    re-scans the folder and redraws every tab (the Repair tab calls it after writing).
    """

    TABS = ("Overview", "Files", "Experts", "Layers", "Drift", "Repair", "Consolidate", "Report")

    def __init__(
        self,
        source: str | os.PathLike[str] | ScannedCheckpoint,
        *,
        report_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        from inspector.widgets.actions import ConsolidatePanel, RepairPanel, ReportPanel

        self.state = CheckpointState.load(source)
        self.report_dir = Path(report_dir) if report_dir else Path.cwd()
        # Panel builders by tab title; a tab's content is built on first selection.
        self._builders: dict[str, Callable[[], Any]] = {
            "Overview": lambda: OverviewPanel(self),
            "Files": lambda: FilesPanel(self),
            "Experts": lambda: ExpertsPanel(self),
            "Layers": lambda: LayersPanel(self),
            "Drift": lambda: DriftPanel(self),
            "Repair": lambda: RepairPanel(self),
            "Consolidate": lambda: ConsolidatePanel(self),
            "Report": lambda: ReportPanel(self),
        }
        self.panels: dict[str, Any] = {}
        self.last_repair: Any = None
        self.header = w.HTML().add_class("ckpt-header")
        self.tab = w.Tab(children=[w.VBox() for _ in self.TABS]).add_class("ckpt-tabs")
        self.tab.titles = self.TABS
        self.tab.observe(self._on_select, names="selected_index")
        rescan = button("Re-scan", "ckpt-rescan-button", icon="refresh")
        rescan.on_click(lambda _: self.refresh())
        top = w.HBox([self.header, rescan], layout=w.Layout(justify_content="space-between"))
        self.widget = w.VBox([top, self.tab]).add_class("ckpt-dashboard")
        self._draw()

    @property
    def scanned(self) -> ScannedCheckpoint:
        return self.state.scanned

    @property
    def path(self) -> Path | RemoteURL:
        return self.state.scanned.path

    def refresh(self) -> None:
        """Re-scan and re-check the folder (a remote one through the same storage, listed
        afresh), then redraw the open tab; other tabs are rebuilt when next selected."""
        self.state = CheckpointState.load(Location(self.scanned.location.storage.fresh()))
        self.panels.clear()
        self._draw()

    def select(self, title: str) -> Any:
        """Open the tab called `title` and return its panel (built if needed)."""
        self.tab.selected_index = self.TABS.index(title)
        return self.panel(title)

    def panel(self, title: str) -> Any:
        """The panel object of tab `title`, built on first use."""
        if title not in self.panels:
            panel = self._builders[title]()
            self.panels[title] = panel
            self.tab.children[self.TABS.index(title)].children = [panel.widget]
        return self.panels[title]

    def _draw(self) -> None:
        s, frame = self.state.scanned, self.state.frame
        counts = frame["severity"].value_counts()
        verdict = ", ".join(f"{int(counts.get(k, 0))} {k}" for k in ("error", "warning", "info"))
        self.header.value = (
            f"<b>{_esc(s.path.name)}</b> &nbsp; <code>{_esc(s.path)}</code> &nbsp; "
            f"layout <b>{_esc(s.layout)}</b> &nbsp; findings: {verdict}"
        )
        drift = self.TABS.index("Drift")
        titles = list(self.TABS)
        titles[drift] = f"Drift ({len(frame)})"
        self.tab.titles = tuple(titles)
        for box in self.tab.children:
            box.children = []
        self.panel(self.TABS[self.tab.selected_index or 0])

    def _on_select(self, change: dict[str, Any]) -> None:
        if change["new"] is not None:
            self.panel(self.TABS[change["new"]])

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        return self.widget._repr_mimebundle_(**kwargs)


# -- read-only tabs ---------------------------------------------------------------------------


class OverviewPanel:
    """Layout, shards, tensors, parameters and bytes by dtype, findings by severity and code."""

    def __init__(self, dash: Dashboard) -> None:
        state = dash.state
        summary = w.HTML(scanned_html(state.scanned, findings=state.findings, max_rows=10))
        by_code = figure_widget(findings_by_code(state.frame), "ckpt-findings-by-code")
        self.widget = w.VBox([summary.add_class("ckpt-overview"), by_code])


class FilesPanel:
    """Shard-size distribution with outliers, then the files table (outliers first)."""

    def __init__(self, dash: Dashboard) -> None:
        files = dash.scanned.files
        figure = figure_widget(shard_size_distribution(files), "ckpt-shard-sizes")
        if not files.empty:
            files = files.assign(outlier=shard_size_outliers(files["size"].fillna(0)))
            files = files.sort_values("outlier", ascending=False, kind="stable")
        table = frame_html(files, columns=["outlier", *_FILE_COLUMNS], max_rows=300, title="files")
        self.widget = w.VBox([figure, w.HTML(table).add_class("ckpt-files-table")])


class LayersPanel:
    """Bytes per layer by dtype, parameters per layer by kind, and the layers table."""

    def __init__(self, dash: Dashboard) -> None:
        s = dash.scanned
        self.widget = w.VBox(
            [
                figure_widget(bytes_per_layer(s.tensors), "ckpt-bytes-per-layer"),
                figure_widget(parameters_per_layer(s.layers), "ckpt-params-per-layer"),
                w.HTML(frame_html(s.layers, max_rows=400, title="layers")).add_class(
                    "ckpt-layers-table"
                ),
            ]
        )


class ExpertsPanel:
    """Layer x expert coverage heatmap. Hover tells what a cell lacks; clicking a cell (or the
    layer / expert picker below it) lists that expert's tensors and findings."""

    def __init__(self, dash: Dashboard) -> None:
        self.dash = dash
        s = dash.scanned
        self.figure = figure_widget(
            expert_coverage_heatmap(s.experts, tensors=s.tensors), "ckpt-expert-heatmap"
        )
        layers = sorted({int(v) for v in s.experts["layer"].dropna()}) if len(s.experts) else []
        self.layer = w.Dropdown(options=layers, description="layer").add_class("ckpt-layer-pick")
        top = int(s.experts["expert"].max()) if len(s.experts) else 0
        self.expert = w.BoundedIntText(min=0, max=max(top, 0), description="expert")
        self.expert.add_class("ckpt-expert-pick")
        show = w.Button(description="Show tensors").add_class("ckpt-show-expert")
        show.on_click(lambda _: self.show(self.layer.value, self.expert.value))
        self.details = w.HTML().add_class("ckpt-expert-details")
        if self.figure.data:
            self.figure.data[0].on_click(self._on_click)
        picker = w.HBox([self.layer, self.expert, show])
        self.widget = w.VBox([self.figure, picker, self.details])

    def show(self, layer: int | None, expert: int | None) -> None:
        """List the tensors, the expert-table row and the findings of (layer, expert)."""
        if layer is None or expert is None:
            self.details.value = "<i>No MoE layer in this checkpoint.</i>"
            return
        s, frame = self.dash.scanned, self.dash.state.frame
        t = s.tensors
        mine = t[(t["layer"] == layer) & (t["expert"] == expert)]
        row = s.experts[(s.experts["layer"] == layer) & (s.experts["expert"] == expert)]
        # Findings about this expert, and about its whole layer (e.g. "experts 64-511 missing").
        same_layer = (frame["layer"] == layer).fillna(False)
        mine_or_all = (frame["expert"] == expert).fillna(False) | frame["expert"].isna()
        notes = frame[same_layer & mine_or_all]
        self.details.value = (
            f"<h4>layer {layer}, expert {expert}</h4>"
            + frame_html(row, max_rows=1, title="coverage")
            + frame_html(mine, columns=_TENSOR_COLUMNS, max_rows=200, title="tensors")
            + (findings_html(notes, max_rows=50) if len(notes) else "")
        )

    def _on_click(self, trace: Any, points: Any, _state: Any) -> None:
        # Cell heatmaps have expert numbers on x; binned ones a label "first-last".
        if not points.xs:
            return
        layer = int(points.ys[0])
        x = points.xs[0]
        expert = int(str(x).split("-")[0]) if isinstance(x, str) else int(x)
        if layer in self.layer.options:
            self.layer.value = layer
        self.expert.value = min(max(expert, self.expert.min), self.expert.max)
        self.show(layer, expert)


class DriftPanel:
    """The findings table, filterable by severity and code, with every shown code explained."""

    def __init__(self, dash: Dashboard) -> None:
        self.frame = dash.state.frame
        codes = self.frame["code"].astype(str).value_counts()
        self.severity = w.ToggleButtons(
            options=[_ALL, "error", "warning", "info"], description="severity"
        ).add_class("ckpt-severity-filter")
        self.code = w.Dropdown(
            options=[(_ALL, _ALL)] + [(f"{c} ({n})", c) for c, n in sorted(codes.items())],
            description="code",
        ).add_class("ckpt-code-filter")
        self.table = w.HTML().add_class("ckpt-findings-table")
        self.help = w.HTML().add_class("ckpt-code-help")
        for control in (self.severity, self.code):
            control.observe(lambda _: self.render(), names="value")
        self.render()
        self.widget = w.VBox([w.HBox([self.severity, self.code]), self.table, self.help])

    def render(self) -> None:
        """Redraw the table for the current filters."""
        shown = self.frame
        if self.severity.value != _ALL:
            shown = shown[shown["severity"] == self.severity.value]
        if self.code.value != _ALL:
            shown = shown[shown["code"] == self.code.value]
        self.table.value = findings_html(shown)
        self.help.value = code_help_html(sorted(shown["code"].astype(str).unique()))


# -- helpers ----------------------------------------------------------------------------------


def figure_widget(figure: go.Figure, css_class: str) -> go.FigureWidget:
    """An interactive copy of `figure` with a stable CSS class."""
    widget = go.FigureWidget(figure)
    widget.add_class(css_class)
    return widget


def button(description: str, css_class: str, *, style: str = "", icon: str = "") -> w.Button:
    """A button with a stable CSS class (`style` is an ipywidgets button_style)."""
    widget = w.Button(description=description, button_style=style, icon=icon)
    widget.layout.width = "auto"  # the default width cuts labels such as "Confirm"
    return widget.add_class(css_class)


def _esc(value: object) -> str:
    import html

    return html.escape(str(value))
