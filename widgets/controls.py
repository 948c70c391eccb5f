"""Controls shared by the dashboard and its panels (`dashboard`, `tabs/`): a module below
both, so neither imports the other to build a button."""

from __future__ import annotations

from typing import Any, TypeVar

import ipywidgets as w

__all__ = ["button", "classed", "hidden"]

_Widget = TypeVar("_Widget", bound=w.DOMWidget)


def classed(kind: type[_Widget], *classes: str, **kwargs: Any) -> _Widget:
    """`kind(**kwargs)` with the CSS classes `classes` in the state it is opened with.
    `add_class` on a widget already made sends the page one message per class, and a
    dashboard's rows (a finding, a button) did that hundreds of times per build (issue 35)."""
    return kind(_dom_classes=classes, **kwargs)


def button(
    description: str, css_class: str, *, style: str = "", icon: str = "", flex: str = ""
) -> w.Button:
    """A button with a stable CSS class (`style` is an ipywidgets button_style; `flex` its
    layout's, if any)."""
    # The default width cuts labels such as "Confirm". Given to the layout as it is made, the
    # widths go in its first state: set afterwards, each was one more message to the page.
    layout = w.Layout(width="auto", min_width="max-content", flex=flex or None)
    return classed(
        w.Button, css_class, description=description, button_style=style, icon=icon, layout=layout
    )


def hidden(widget: w.Widget, hide: bool) -> None:
    """Hide `widget` (or show it again) without removing it from its box."""
    widget.layout.display = "none" if hide else None
