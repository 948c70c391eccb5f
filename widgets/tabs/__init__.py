"""The dashboard's tabs: one table of (title, module, builder), in the order they show.

Adding a tab is adding a module with a builder (a callable that takes the dashboard, as
`Host` describes it, and returns a panel with a `widget`) and a row here. Modules are named
relative to `widgets/` and imported when the tab is first built, so opening the dashboard
imports none of them. A panel may also have `on_shown()` (drawn when first shown: grids,
figures) and `close()` (called when a re-scan replaces it).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

from inspector.ui import scan_figures

if TYPE_CHECKING:
    import ipywidgets as w

    from inspector.ui import Finding, ScannedCheckpoint, TensorQuery

    from ..state import CheckpointState

__all__ = ["TABS", "Host", "Tab", "build"]


class Host(Protocol):
    """The dashboard as a tab sees it: the state to draw, where to say what went wrong, and
    where its links lead."""

    notice: w.HTML  # one line under the header for errors of actions without a status line
    report_dir: Path
    trust_remote_code: bool
    cache: bool
    last_repair: Any

    @property
    def current(self) -> CheckpointState: ...
    @property
    def state(self) -> CheckpointState: ...
    @property
    def scanned(self) -> ScannedCheckpoint: ...
    def refresh(self) -> None: ...
    def check_values(self, mode: Literal["sample", "full"]) -> None: ...
    def when_checked(
        self,
        callback: Callable[[CheckpointState], object],
        *,
        drawn: CheckpointState,
        failed: Callable[[BaseException], object] | None = None,
    ) -> None: ...
    def select(self, title: str) -> Any: ...
    def show_tensors(self, query: TensorQuery) -> Any: ...
    def show_cell(self, layer: int, expert: int | None = None) -> Any: ...
    def show_findings(self, codes: Sequence[str] = ()) -> Any: ...
    def follow(self, finding: Finding) -> Any: ...
    def repair(self, parts: Sequence[str] = ()) -> Any: ...
    def restore(self, source: str = "") -> Any: ...


@dataclass(frozen=True)
class Tab:
    """One tab: its title, the module (relative to `widgets/`) that draws it, the name of
    the builder there, and what its spinner says is being built."""

    title: str
    module: str
    builder: str
    building: Callable[[ScannedCheckpoint], str] = lambda _: "this tab"


# The spinners' counts are the rows of the scan's tables, read from the numpy columns the
# summary is made of (`scan_figures`): the spinners are drawn before the Overview is sent, and
# counting the tables' rows built the tables (0.3 s of CPU and pandas' import at 289,892
# tensors) for tabs not shown yet.
TABS = (
    Tab("Overview", "tabs.overview", "OverviewPanel"),
    Tab(
        "Tensors",
        "browser",
        "tensors_tab",
        lambda s: f"the table of {scan_figures(s).tensors:,} tensors",
    ),
    Tab(
        "Files",
        "tabs.files",
        "FilesPanel",
        lambda s: f"the table of {scan_figures(s).files:,} files",
    ),
    Tab("Experts", "tabs.experts", "ExpertsPanel", lambda _: "the expert heatmap"),
    Tab(
        "Layers",
        "tabs.layers",
        "LayersPanel",
        lambda s: f"the table of {len(scan_figures(s).layer):,} layers",
    ),
    Tab("Values", "tabs.values", "values_tab"),
    Tab("Serve", "tabs.serve", "serve_tab", lambda _: "the parallel plans"),
    Tab("Findings", "tabs.findings", "FindingsPanel"),
    Tab("Repair", "tabs.repair", "RepairPanel"),
    Tab("Consolidate", "tabs.consolidate", "ConsolidatePanel"),
    Tab("Report", "tabs.report", "ReportPanel"),
)


def build(tab: Tab, host: Host) -> Any:
    """The panel of `tab` for `host`, its module imported now (the first time)."""
    widgets = __name__.rpartition(".")[0]  # `inspector.widgets`, or `widgets` in a checkout
    module = importlib.import_module(f"{widgets}.{tab.module}")
    return getattr(module, tab.builder)(host)
