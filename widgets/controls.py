"""Controls shared by the dashboard and its panels (`dashboard`, `tabs/`): a module below
both, so neither imports the other to build a button."""

from __future__ import annotations

import threading
from typing import Any, TypeVar

import ipywidgets as w
import traitlets

__all__ = ["NOT_DRAWN", "button", "classed", "close_tree", "fixed", "hidden", "still"]

# The CSS class of a line that stands for a grid or figures until its tab is first shown:
# the dashboard's module preload waits while one shows (`ModulePreload`'s `busy`).
NOT_DRAWN = "ckpt-not-drawn"

_Widget = TypeVar("_Widget", bound=w.DOMWidget)
_Part = TypeVar("_Part", bound=w.Widget)
_FIXED: dict[tuple[type, tuple[tuple[str, Any], ...]], w.Widget] = {}
_FIXED_LOCK = threading.Lock()


def classed(kind: type[_Widget], *classes: str, **kwargs: Any) -> _Widget:
    """`kind(**kwargs)` with the CSS classes `classes` in the state it is opened with.
    `add_class` on a widget already made sends the page one message per class, and a
    dashboard's rows (a finding, a button) did that hundreds of times per build (issue 35)."""
    return kind(_dom_classes=classes, **kwargs)


def fixed(kind: type[_Part], **traits: Any) -> _Part:
    """The kernel's one `kind(**traits)` (a `Layout` or a style), shared by every widget that
    asks for it: for the parts of rows a tab makes by the dozen and never changes (a finding's
    row was eight widget models, five of them a layout or style, each sent to the page). Made
    again if it was closed (`Widget.close_all()`). Never change a shared part."""
    key = (kind, tuple(sorted(traits.items())))
    with _FIXED_LOCK:
        part = _FIXED.get(key)
        if part is None or part.comm is None:
            part = _FIXED[key] = kind(**traits)
        return part


def still(
    kind: type[_Widget],
    *classes: str,
    layout: dict[str, Any] | None = None,
    style: dict[str, Any] | None = None,
    **kwargs: Any,
) -> _Widget:
    """`classed(kind, *classes, **kwargs)` whose layout (of traits `layout`) and style (of
    traits `style`) are the kernel's shared ones (`fixed`): for a control or a line that is
    never hidden, resized or restyled. A widget's own layout and style are two more models
    sent to the page, and a tab made them by the dozen each time it was built (issue 35)."""
    parts: dict[str, Any] = {"layout": fixed(w.Layout, **(layout or {}))}
    trait = kind.class_traits().get("style")
    if isinstance(trait, traitlets.Instance) and isinstance(trait.klass, type):
        parts["style"] = fixed(trait.klass, **(style or {}))
    return classed(kind, *classes, **parts, **kwargs)


def button(
    description: str,
    css_class: str,
    *,
    style: str = "",
    icon: str = "",
    flex: str = "",
    shared: bool = False,
) -> w.Button:
    """A button with a stable CSS class (`style` is an ipywidgets button_style; `flex` its
    layout's, if any). `shared`: its layout and style are the kernel's `fixed` ones (a
    button that is never hidden or restyled, one per row)."""
    # The default width cuts labels such as "Confirm". Given to the layout as it is made, the
    # widths go in its first state: set afterwards, each was one more message to the page.
    widths: dict[str, Any] = {"width": "auto", "min_width": "max-content", "flex": flex or None}
    parts = (
        {"layout": fixed(w.Layout, **widths), "style": fixed(w.ButtonStyle)}
        if shared
        else {"layout": w.Layout(**widths)}
    )
    return classed(
        w.Button, css_class, description=description, button_style=style, icon=icon, **parts
    )


def hidden(widget: w.Widget, hide: bool) -> None:
    """Hide `widget` (or show it again) without removing it from its box."""
    widget.layout.display = "none" if hide else None


def close_tree(widget: w.Widget) -> None:
    """Close `widget`, the widgets it holds (`children`, as deep as they go) and their own
    layouts and styles, but not the kernel's shared parts (`fixed`): a box's `close` closes
    the box alone, and a panel a re-scan replaced left its every widget open in the kernel
    and on the page (issue 35: 3,823 models opened by a session, 17 closed). Call it once no
    box on the page shows `widget` any more."""
    with _FIXED_LOCK:
        shared = {id(part) for part in _FIXED.values()}
    stack = [widget]
    while stack:
        node = stack.pop()
        stack.extend(getattr(node, "children", ()))
        for name in ("layout", "style"):
            part = getattr(node, name, None)
            if isinstance(part, w.Widget) and id(part) not in shared:
                part.close()
        node.close()
