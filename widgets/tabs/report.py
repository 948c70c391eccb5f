"""The Report tab: write the one-file HTML report and show the Markdown summary."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import ipywidgets as w

from inspector.ui import (
    fit,
    html_text,
    markdown_summary,
)

from ..controls import button, classed, fixed, hidden, still
from ..guard import EXPECTED_ERRORS, error_html, guarded
from ..report import write_html_report

if TYPE_CHECKING:
    from ..state import CheckpointState
    from . import Host

__all__ = ["ReportPanel"]


class ReportPanel:
    """Buttons that write the self-contained HTML report and show the Markdown summary; the
    report's figures are interactive with plotly.js embedded (offline, about 1.5 MB), loaded
    from its CDN (small enough to attach) or PNG images."""

    def __init__(self, dash: Host) -> None:
        self.dash = dash
        # Its controls' layouts and styles are the kernel's shared ones (`still`), but the
        # summary's, which is hidden until asked for.
        self.path = still(
            w.Text, value=self._default_path(), description="file", layout={"width": "90%"}
        )
        self.status = still(w.HTML, "ckpt-report-status")
        write = button("Write HTML report", "ckpt-report-button", icon="file", shared=True)
        write.on_click(guarded(lambda: self.write_report(), self.status))
        summary = button("Markdown summary", "ckpt-markdown-button", icon="list", shared=True)
        summary.on_click(guarded(lambda: self.show_markdown(), self.status))
        self.figures = still(
            w.Dropdown,
            "ckpt-report-figures",
            options=[
                ("interactive, plotly.js embedded (offline, ~1.5 MB)", "embedded"),
                ("light: plotly.js from its CDN (to attach)", "cdn"),
                ("PNG images (offline, not interactive)", "png"),
            ],
            value="embedded",
            description="figures",
            layout={"width": "28em"},
        )
        self.markdown = classed(
            w.Textarea,
            "ckpt-markdown",
            layout=w.Layout(width="100%", height="320px", display="none"),
        )
        self.widget = w.VBox(
            [
                self.path,
                w.HBox([write, summary, self.figures], layout=fixed(w.Layout)),
                self.status,
                self.markdown,
            ],
            layout=fixed(w.Layout),
        )

    def renew(self) -> bool:
        """The panel as a tab built now shows it (after a re-scan or a check of the values),
        in the widgets shown: nothing written yet, the summary hidden."""
        self.path.value = self._default_path()
        self.status.value = ""
        self.figures.value = "embedded"
        self.markdown.value = ""
        hidden(self.markdown, True)
        return True

    def _default_path(self) -> str:
        name = self.dash.scanned.path.name or "checkpoint"
        return str(self.dash.report_dir / f"{name}-report.html")

    def write_report(self) -> Path | None:
        """Write the HTML report to the path in the form; returns it, None on failure."""
        state = self._checked()
        try:
            target = write_html_report(
                state.scanned,
                state.findings,
                self.path.value.strip(),
                verdict=state.verdict,
                figures=self.figures.value,
            )
        except EXPECTED_ERRORS as exc:
            self.status.value = error_html(exc)
            return None
        size = target.stat().st_size
        self.status.value = f"Wrote <code>{html_text(target)}</code> ({size:,} bytes)."
        return target

    def show_markdown(self) -> str:
        """Show the Markdown summary (to paste into a bug report) and return it."""
        state = self._checked()
        self.status.value = ""
        text = markdown_summary(
            state.scanned, state.findings, verdict=state.verdict, serving=fit(state.scanned)
        )
        self.markdown.value = text
        hidden(self.markdown, False)
        return text

    def _checked(self) -> CheckpointState:
        """The state with the load verdict, which the report and the summary carry; while
        the load check runs, the status says that the click waits for it (it said nothing)."""
        if self.dash.current.pending:
            self.status.value = (
                "<span class='ckpt-report-waiting' style='color:#555'>"
                "<i class='fa fa-spinner fa-spin' style='margin-right:6px'></i>"
                "Waiting for the load check: the report says whether the model loads...</span>"
            )
        return self.dash.state
