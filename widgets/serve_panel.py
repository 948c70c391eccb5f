"""The dashboard's Serve tab: will it serve? The parallel plans vLLM and SGLang would start,
the weights of the fullest GPU of each and, on the GPU picked, the longest context that fits.

No logic here: each change of the GPU, KV cache dtype or context calls
`inspector._internal.serve.fit.fit` once, and the tab draws `widgets.figures.serving_plans` from
`FitResult.frame()` and the table `inspector._internal.report.fit.fit_table`, the figure and
table the HTML report shows.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import ipywidgets as w

from inspector._internal.common.dtypes import KV_CACHE_DTYPES
from inspector._internal.report.fit import fit_notes, fit_table
from inspector._internal.report.html import frame_html, html_text
from inspector._internal.serve.fit import FitResult, fit
from inspector._internal.serve.gpus import GPUS

from .figures import serving_plans
from .guard import guarded

if TYPE_CHECKING:
    from inspector._internal.checkpoint.scanned import ScannedCheckpoint

__all__ = ["ServePanel"]

_NO_GPU = "no GPU"


class ServePanel:
    """GPU, KV cache dtype and context pickers; the figure of the plans and their table."""

    def __init__(self, scanned: ScannedCheckpoint, *, figure: Any) -> None:
        # `figure` turns a plotly figure into a widget (the dashboard's `figure_widget`).
        self.scanned = scanned
        self._figure = figure
        self.gpu = w.Dropdown(options=[_NO_GPU, *GPUS], value=_NO_GPU, description="GPU")
        self.gpu.add_class("ckpt-serve-gpu")
        self.kv_dtype = w.Dropdown(options=list(KV_CACHE_DTYPES), value="auto", description="KV")
        self.context = w.BoundedIntText(
            value=0, min=0, max=1 << 40, description="context", tooltip="0: the model's own"
        ).add_class("ckpt-serve-context")
        self.status = w.HTML().add_class("ckpt-serve-status")
        for control in (self.gpu, self.kv_dtype, self.context):
            control.observe(guarded(self.draw, self.status), names="value")
        self.plot = w.VBox(layout=w.Layout(width="100%")).add_class("ckpt-serve-plot")
        self.table = w.HTML().add_class("ckpt-serve-table")
        self.notes = w.HTML()
        self.result: FitResult | None = None
        self.widget = w.VBox(
            [
                w.HBox([self.gpu, self.kv_dtype, self.context]),
                self.status,
                self.plot,
                self.table,
                self.notes,
            ],
            layout=w.Layout(width="100%"),
        )
        self.draw()

    def draw(self) -> None:
        """Judge the plans for the pickers' values and draw them."""
        gpu = None if self.gpu.value == _NO_GPU else str(self.gpu.value)
        self.result = result = fit(
            self.scanned,
            gpu=gpu,
            kv_dtype=str(self.kv_dtype.value),
            context=int(self.context.value) or None,
        )
        serving = len(result.feasible)
        where = f"on {gpu}" if gpu else "(pick a GPU for the memory verdict)"
        self.status.value = html_text(
            f"parallel plans that serve {where}: {serving:,} of {len(result.plans):,}"
        )
        self.plot.children = [self._figure(serving_plans(result.frame()), "ckpt-serve")]
        self.table.value = frame_html(fit_table(result), max_rows=64)
        notes = "".join(f"<li>{html_text(note)}</li>" for note in fit_notes(result))
        self.notes.value = f"<ul style='color:#666'>{notes}</ul>"
