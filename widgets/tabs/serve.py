"""The dashboard's Serve tab: the parallel plans vLLM and SGLang would start, the fullest GPU's
weights and, on the GPU picked, the longest context that fits. No logic here: each change
calls `serve.fit.fit` once and draws the report's figure and table. "vLLM's own verdict"
calls `inspector.engine_check` in a thread (seconds, mostly vLLM's import: the kernel stays free).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

import ipywidgets as w

from inspector.ui import (
    GPUS,
    KV_CACHE_DTYPES,
    MESSAGE_LIMIT,
    EngineReport,
    FitResult,
    engine_check,
    engine_lines,
    fit,
    fit_notes,
    fit_table,
    frame_html,
    html_text,
    legible,
)

from ..controls import close_tree, fixed, still
from ..figures import serving_plans
from ..guard import guarded

if TYPE_CHECKING:
    from inspector.ui import ScannedCheckpoint

    from . import Host

__all__ = ["ServePanel", "engine_html", "serve_tab"]

_NO_GPU = "no GPU"


class ServePanel:
    """GPU, KV cache dtype and context pickers; the figure of the plans and their table."""

    def __init__(self, scanned: ScannedCheckpoint, *, figure: Any) -> None:
        # `figure` turns a plotly figure into a widget (the dashboard's `figure_widget`).
        self.scanned = scanned
        self._figure = figure
        # Its controls' layouts and styles are the kernel's shared ones (`still`).
        self.gpu = still(
            w.Dropdown, "ckpt-serve-gpu", options=[_NO_GPU, *GPUS], value=_NO_GPU, description="GPU"
        )
        self.kv_dtype = still(
            w.Dropdown, options=list(KV_CACHE_DTYPES), value="auto", description="KV"
        )
        self.context = still(
            w.BoundedIntText,
            "ckpt-serve-context",
            value=0,
            min=0,
            max=1 << 40,
            description="context",
            tooltip="0: the model's own",
        )
        self.status = still(w.HTML, "ckpt-serve-status")
        self._quiet = False  # while `show_scan` sets the pickers: one draw after
        for control in (self.gpu, self.kv_dtype, self.context):
            control.observe(guarded(self._picked, self.status), names="value")
        self.plot = still(w.VBox, "ckpt-serve-plot", layout={"width": "100%"})
        self.table = still(w.HTML, "ckpt-serve-table")
        self.notes = still(w.HTML)
        self.engine_button = still(
            w.Button,
            "ckpt-serve-engine",
            description="vLLM's own verdict",
            tooltip="vLLM's weight loading on a meta model, in a child process (the [vllm] extra)",
        )
        self.engine_out = still(w.HTML, "ckpt-serve-engine-out")
        self.engine_button.on_click(guarded(self.run_engine, self.engine_out))
        self.engine_thread: threading.Thread | None = None
        self.result: FitResult | None = None
        # The plans' table the figure shows: a draw of the same makes no new figure.
        self._drawn: Any = None
        self.widget = w.VBox(
            [
                w.HBox([self.gpu, self.kv_dtype, self.context], layout=fixed(w.Layout)),
                self.status,
                self.plot,
                self.table,
                w.HBox([self.engine_button], layout=fixed(w.Layout)),
                self.engine_out,
                self.notes,
            ],
            layout=w.Layout(width="100%"),
        )
        self.draw()

    def _picked(self) -> None:
        if not self._quiet:
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
        frame = result.frame()
        if self._drawn is None or not frame.equals(self._drawn):
            # A figure is drawn once: the one it replaces is closed (each pick left it open).
            old, self.plot.children = (
                self.plot.children,
                [self._figure(serving_plans(frame), "ckpt-serve")],
            )
            for figure in old:
                close_tree(figure)
            self._drawn = frame
        self.table.value = frame_html(fit_table(result), max_rows=64)
        notes = "".join(f"<li>{html_text(note)}</li>" for note in fit_notes(result))
        self.notes.value = f"<ul style='color:#666'>{notes}</ul>"

    def show_scan(self, scanned: ScannedCheckpoint) -> None:
        """Show `scanned` (a re-scan) in the widgets shown, as a panel made for it shows it:
        the pickers at their first values, the engine's answer gone (unless it still runs)."""
        self.scanned = scanned
        self._quiet = True
        try:
            self.gpu.value, self.kv_dtype.value, self.context.value = _NO_GPU, "auto", 0
        finally:
            self._quiet = False
        if self.engine_thread is None or not self.engine_thread.is_alive():
            self.engine_out.value = ""
        self.draw()

    def run_engine(self) -> None:
        """Start vLLM's own verdict in a thread (`inspector.engine_check`); its lines and
        findings replace the button's output when it ends."""
        if self.engine_thread is not None and self.engine_thread.is_alive():
            return
        self.engine_button.disabled = True
        self.engine_out.value = html_text("vLLM's verdict: running (its import takes seconds)")
        self.engine_thread = threading.Thread(target=self._engine, daemon=True)
        self.engine_thread.start()

    def _engine(self) -> None:
        try:
            self.engine_out.value = engine_html(engine_check(self.scanned, engine="vllm"))
        except Exception as exc:  # shown in the tab, not lost in a thread
            self.engine_out.value = html_text(f"vLLM's verdict failed: {exc}")
        finally:
            self.engine_button.disabled = False


def engine_html(report: EngineReport) -> str:
    """The engine's one-line verdict (or why it did not run) and its findings, escaped."""
    # The lines quote vLLM's exception, which quotes names from the checkpoint.
    items = [
        f"<li>{html_text(legible(line, limit=MESSAGE_LIMIT))}</li>" for line in engine_lines(report)
    ]
    items += [
        f"<li><b>{html_text(f.code)}</b>: {html_text(f.message)}</li>" for f in report.findings
    ]
    return f"<ul>{''.join(items)}</ul>"


class ServeTab(ServePanel):
    """The dashboard's Serve tab: a re-scan is shown in place (`renew`)."""

    def __init__(self, dash: Host) -> None:
        from ..plot import figure_widget

        self.dash = dash
        super().__init__(dash.scanned, figure=figure_widget)

    def renew(self) -> bool:
        self.show_scan(self.dash.scanned)
        return True


def serve_tab(dash: Host) -> ServePanel:
    """The dashboard's Serve tab (`ServeTab`)."""
    return ServeTab(dash)
