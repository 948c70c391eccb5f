"""The Findings tab: every finding, filtered by severity and code, a page at a time."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import ipywidgets as w

from inspector.ui import code_help_html

from ..controls import button
from ..guard import guarded
from .rows import finding_row

if TYPE_CHECKING:
    from . import Host

__all__ = ["FindingsPanel"]

_ALL = "all"
_PAGE = 25


class FindingsPanel:
    """The findings, filterable by severity and code, a page at a time; every finding links
    to its tensor, heatmap cell or file, and every shown code is explained."""

    def __init__(self, dash: Host) -> None:
        self.dash = dash
        self.findings = dash.state.findings
        self.frame = dash.state.frame
        codes = self.frame["code"].astype(str).value_counts()
        self.severity = w.ToggleButtons(
            options=[_ALL, "error", "warning", "info"], description="severity"
        ).add_class("ckpt-severity-filter")
        self.code = w.Dropdown(
            options=[(_ALL, _ALL)] + [(f"{c} ({n})", c) for c, n in sorted(codes.items())],
            description="code",
        ).add_class("ckpt-code-filter")
        self.rows = w.VBox(layout=w.Layout(width="100%")).add_class("ckpt-findings-table")
        self.help = w.HTML().add_class("ckpt-code-help")
        self.prev = button("Previous", "ckpt-page-prev", icon="chevron-left")
        self.next = button("Next", "ckpt-page-next", icon="chevron-right")
        self.where = w.HTML()
        self.start = 0
        self.prev.on_click(guarded(lambda: self.render(self.start - _PAGE), self.dash.notice))
        self.next.on_click(guarded(lambda: self.render(self.start + _PAGE), self.dash.notice))
        self.codes: tuple[str, ...] = ()
        for control in (self.severity, self.code):
            control.observe(guarded(lambda: self.render(0), dash.notice), names="value")
        self.render(0)
        self.widget = w.VBox(
            [
                w.HBox([self.severity, self.code], layout=w.Layout(flex_flow="row wrap")),
                self.rows,
                w.HBox([self.prev, self.next, self.where], layout=w.Layout(align_items="center")),
                self.help,
            ],
            layout=w.Layout(width="100%"),
        )

    def show_codes(self, codes: Sequence[str]) -> None:
        """Show only the findings of `codes` (one code also sets the code filter)."""
        self.codes = tuple(codes)
        self.severity.value = _ALL
        self.code.value = codes[0] if len(codes) == 1 else _ALL
        self.render(0)

    def shown(self) -> list[int]:
        """Positions (in `findings`, worst first) of the findings the filters let through."""
        out = []
        for i, f in enumerate(self.findings):
            if self.severity.value != _ALL and str(f.severity) != self.severity.value:
                continue
            if self.code.value != _ALL and f.code != self.code.value:
                continue
            if self.codes and self.code.value == _ALL and f.code not in self.codes:
                continue
            out.append(i)
        return out

    def render(self, start: int = 0) -> None:
        """Redraw the page of findings that begins at `start` for the current filters."""
        shown = self.shown()
        last = max(0, (len(shown) - 1) // _PAGE * _PAGE)
        self.start = min(max(0, start), last)
        page = shown[self.start : self.start + _PAGE]
        self.rows.children = [
            finding_row(self.dash, self.findings[i], detail=True) for i in page
        ] or [w.HTML("<i>No findings.</i>")]
        end = self.start + len(page)
        self.where.value = f"findings {self.start + 1 if page else 0:,}-{end:,} of {len(shown):,}"
        self.prev.disabled = self.start == 0
        self.next.disabled = end >= len(shown)
        codes = sorted({self.findings[i].code for i in shown})
        self.help.value = code_help_html(codes)
