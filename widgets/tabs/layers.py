"""The Layers tab: bytes and parameters per layer, then every layer in a grid with its findings
counted.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import ipywidgets as w
import pandas as pd

from ..grid import FiguresAndGrid, FrameGrid, yes_no
from ..plot import FigureBox, Figures

if TYPE_CHECKING:
    from ..state import CheckpointState
    from . import Host

__all__ = ["LayersPanel"]


class LayersPanel(FiguresAndGrid):
    """Bytes per layer by dtype, parameters per layer by kind, then every layer in a sortable,
    filterable grid with its findings counted (recounted when the load check's arrive)."""

    def __init__(self, dash: Host) -> None:
        self.dash = dash
        self.scanned = dash.scanned
        drawn = dash.current  # what arrives later is given to `when_checked` below
        self.table = FrameGrid(
            self.frame(drawn),
            title="layers",
            css_class="ckpt-layers-table",
            text="dtypes",
            choices=("kind", "MTP"),
            flags={"with findings": ["findings", ">", 0]},
            sort=[["layer", "asc"]],
            what="layers",
            cells=False,
        )
        self.figures = FigureBox(self.figure_list)
        self.widget = w.VBox([self.figures.box, self.table.widget], layout=w.Layout(width="100%"))
        dash.when_checked(lambda state: self.table.replace(self.frame(state)), drawn=drawn)

    def figure_list(self) -> Figures:
        """The tab's figures (of `scanned`, the scan it shows)."""
        from ..figures import bytes_per_layer, parameters_per_layer

        s = self.scanned
        return [
            (bytes_per_layer(s.tensors), "ckpt-bytes-per-layer"),
            (parameters_per_layer(s.layers), "ckpt-params-per-layer"),
        ]

    @staticmethod
    def frame(state: CheckpointState) -> pd.DataFrame:
        """The layers table as the grid shows it, with the findings about each layer."""
        layers = state.scanned.layers
        counts = state.frame["layer"].dropna().astype("int64").value_counts()
        text = {c: layers[c].astype(str).to_numpy(dtype=object) for c in ("kind", "dtypes")}
        return pd.DataFrame(
            {
                "layer": layers["layer"].astype("int64"),
                "kind": text["kind"],
                "MTP": yes_no(layers["is_mtp"]),
                "findings": layers["layer"].map(counts).fillna(0).astype("int64"),
                "tensors": layers["tensors"].astype("int64"),
                "size": layers["bytes"].astype("int64"),
                "parameters": layers["parameters"].astype("int64"),
                "experts found": layers["experts_found"].astype("int64"),
                "experts expected": layers["experts_expected"].astype("int64"),
                "experts per": layers["experts_source"].astype(str).to_numpy(dtype=object),
                "dtypes": text["dtypes"],
            }
        ).reset_index(drop=True)
