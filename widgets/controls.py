"""Controls shared by the dashboard and its panels (`dashboard`, `tabs/`): a module below
both, so neither imports the other to build a button."""

from __future__ import annotations

import ipywidgets as w

__all__ = ["button", "hidden"]


def button(description: str, css_class: str, *, style: str = "", icon: str = "") -> w.Button:
    """A button with a stable CSS class (`style` is an ipywidgets button_style)."""
    widget = w.Button(description=description, button_style=style, icon=icon)
    widget.layout.width = "auto"  # the default width cuts labels such as "Confirm"
    widget.layout.min_width = "max-content"
    return widget.add_class(css_class)


def hidden(widget: w.Widget, hide: bool) -> None:
    """Hide `widget` (or show it again) without removing it from its box."""
    widget.layout.display = "none" if hide else None
