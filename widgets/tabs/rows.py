"""One finding as a row with a link to what it is about, shared by the Overview's issue cards
and the Findings tab.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import ipywidgets as w
from ipywidgets.widgets.widget_string import HTMLStyle

from inspector.ui import Finding, html_text, markup_html, severity_badge

from ..controls import button, classed, fixed
from ..guard import guarded

if TYPE_CHECKING:
    from . import Host

__all__ = ["FindingRow", "examples", "finding_row"]


def examples(findings: Sequence[Finding], n: int) -> list[Finding]:
    """The first `n` findings that name one thing (folded summaries last)."""
    named = [f for f in findings if f.tensor or f.layer is not None]
    rest = [f for f in findings if not (f.tensor or f.layer is not None)]
    return (named + rest)[:n]


class FindingRow:
    """One finding as a row: its code and message (with `detail`: severity, file and tensor
    too), and a link to what it is about. `show` makes it the row of another finding: a page
    of findings turned or filtered updates the rows it shows (a few values each) instead of
    making new ones (three widget models a row, each made and closed on the page: 420 per
    click-through of every tab, issue 35)."""

    def __init__(self, dash: Host, finding: Finding, *, detail: bool = False) -> None:
        self.dash, self.detail, self.finding = dash, detail, finding
        target, text = self._parts(finding)
        # The row's layouts and styles are the kernel's shared ones (`fixed`): a row was eight
        # widget models, now three (a tab of findings made and drew hundreds).
        self.link = button(
            f"show {target}", "ckpt-finding-link", icon="arrow-right", flex="0 0 auto", shared=True
        )
        # The finding the row shows when clicked, not the one it was made for.
        self.link.on_click(guarded(lambda: dash.follow(self.finding), dash.notice))
        self.text = w.HTML(
            text,
            layout=fixed(w.Layout, flex="1 1 auto", min_width="0"),
            style=fixed(HTMLStyle),
        )
        self.widget = classed(
            w.HBox,
            *_classes(finding),
            children=[self.text, self.link],
            layout=fixed(
                w.Layout, align_items="center", width="100%", border_bottom="1px solid #eee"
            ),
        )

    def show(self, finding: Finding) -> None:
        """Make this the row of `finding` (what did not change is not sent again)."""
        self.finding = finding
        target, text = self._parts(finding)
        self.text.value = text
        self.link.description = f"show {target}"
        self.widget._dom_classes = _classes(finding)

    def _parts(self, finding: Finding) -> tuple[str, str]:
        """What the link leads to, and the row's text."""
        dash = self.dash
        target = (
            "tensor"
            if finding.tensor
            else "heatmap"
            if finding.layer is not None and len(dash.scanned.experts)
            else "file"
            if finding.file
            else "findings"
        )
        where = ""
        if self.detail:
            places = [p for p in (finding.file, finding.tensor) if p]
            where = "".join(
                f"<br><code style='overflow-wrap:anywhere'>{html_text(p)}</code>" for p in places
            )
        badge = severity_badge(finding.severity) + " " if self.detail else ""
        text = (
            f"<div style='font-size:12px;line-height:1.4'>{badge}"
            f"<code>{html_text(finding.code)}</code> "
            f"{markup_html(short(finding.message))}{where}</div>"
        )
        return target, text


def finding_row(dash: Host, finding: Finding, *, detail: bool = False) -> w.HBox:
    """One finding's row widget (see `FindingRow`), for a place that never shows another."""
    return FindingRow(dash, finding, detail=detail).widget


def _classes(finding: Finding) -> tuple[str, ...]:
    return ("ckpt-finding", f"ckpt-code-{finding.code}")


def short(text: str, limit: int = 220) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."
