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

__all__ = ["examples", "finding_row"]


def examples(findings: Sequence[Finding], n: int) -> list[Finding]:
    """The first `n` findings that name one thing (folded summaries last)."""
    named = [f for f in findings if f.tensor or f.layer is not None]
    rest = [f for f in findings if not (f.tensor or f.layer is not None)]
    return (named + rest)[:n]


def finding_row(dash: Host, finding: Finding, *, detail: bool = False) -> w.HBox:
    """One finding: its code and message (with `detail`: severity, file and tensor too), and
    a link to what it is about."""
    target = (
        "tensor"
        if finding.tensor
        else "heatmap"
        if finding.layer is not None and len(dash.scanned.experts)
        else "file"
        if finding.file
        else "findings"
    )
    # The row's layouts and styles are the kernel's shared ones (`fixed`): a row was eight
    # widget models, now three (a tab of findings made and drew hundreds).
    link = button(
        f"show {target}", "ckpt-finding-link", icon="arrow-right", flex="0 0 auto", shared=True
    )
    link.on_click(guarded(lambda: dash.follow(finding), dash.notice))
    where = ""
    if detail:
        places = [p for p in (finding.file, finding.tensor) if p]
        where = "".join(
            f"<br><code style='overflow-wrap:anywhere'>{html_text(p)}</code>" for p in places
        )
    badge = severity_badge(finding.severity) + " " if detail else ""
    text = w.HTML(
        f"<div style='font-size:12px;line-height:1.4'>{badge}"
        f"<code>{html_text(finding.code)}</code> "
        f"{markup_html(short(finding.message))}{where}</div>",
        layout=fixed(w.Layout, flex="1 1 auto", min_width="0"),
        style=fixed(HTMLStyle),
    )
    return classed(
        w.HBox,
        "ckpt-finding",
        f"ckpt-code-{finding.code}",
        children=[text, link],
        layout=fixed(w.Layout, align_items="center", width="100%", border_bottom="1px solid #eee"),
    )


def short(text: str, limit: int = 220) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."
