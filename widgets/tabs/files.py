"""The Files tab: shard sizes with their outliers, then every file in a grid with its findings
counted.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import ipywidgets as w
import pandas as pd

from inspector.ui import findings_per_file, legible_each

from ..grid import FiguresAndGrid, FrameGrid, yes_no
from ..plot import FigureBox, Figures

if TYPE_CHECKING:
    from ..state import CheckpointState
    from . import Host

__all__ = ["FilesPanel"]


class FilesPanel(FiguresAndGrid):
    """Shard-size distribution with outliers, then every file in a sortable, filterable grid:
    sizes, what it stores, and how many findings name it (`findings_per_file`: the counts
    agree with the findings; recounted when the load check's findings arrive)."""

    def __init__(self, dash: Host) -> None:
        self.dash = dash
        self.scanned = dash.scanned
        # Made when the tab is shown, after its grid: the first figure of a kernel took
        # 0.6-1.9 s (plotly's template, see `figures.prepare_template`) of a first click.
        self.figures = FigureBox(self.figure_list)
        drawn = dash.current  # what arrives later is given to `when_checked` below
        self.table = FrameGrid(
            self.frame(drawn),
            title="files",
            css_class="ckpt-files-table",
            text="file",
            flags={
                "with findings": ["findings", ">", 0],
                "size outliers": ["outlier", "==", "yes"],
            },
            sort=[["findings", "desc"], ["outlier", "desc"], ["file", "asc"]],
            what="files",
            cells=False,
        )
        self.widget = w.VBox([self.figures.box, self.table.widget], layout=w.Layout(width="100%"))
        dash.when_checked(lambda state: self.table.replace(self.frame(state)), drawn=drawn)

    def figure_list(self) -> Figures:
        """The tab's figure (of `scanned`, the scan it shows)."""
        from ..figures import shard_size_distribution

        return [(shard_size_distribution(self.scanned.files), "ckpt-shard-sizes")]

    def frame(self, state: CheckpointState) -> pd.DataFrame:
        """The files table as the grid shows it, with the findings of `state` counted."""
        from ..figures import expected_small, shard_size_outliers

        f = state.scanned.files
        outliers = (
            shard_size_outliers(f["size"].fillna(0), small_ok=expected_small(f))
            if len(f)
            else pd.Series(False, index=f.index)
        )
        counts = findings_per_file(state.findings, f["file"].astype(str))
        return pd.DataFrame(
            {
                "file": legible_each(f["file"].astype(str).tolist()),
                "findings": f["file"].astype(str).map(counts).fillna(0).astype("int64"),
                "size": f["size"].astype("Int64"),
                "outlier": yes_no(outliers),
                "tensors": f["tensors"].astype("int64"),
                "data size": f["tensor_bytes"].astype("int64"),
                "header size": f["header_bytes"].astype("Int64"),
                "first layer": f["first_layer"].astype("Int64"),
                "last layer": f["last_layer"].astype("Int64"),
                "layers": f["layers"].astype("int64"),
                "readable": yes_no(f["readable"]),
            }
        ).reset_index(drop=True)
