"""The notebook UI as seen from the core: `ckpt.browse()`, `ckpt.dashboard()`, `_repr_html_()`
(`html`) and `ckpt.values` (`values`) look their implementation up by name in the
`checkpoint_inspector.ui` entry-point group. Why: the scanned checkpoint sits below the UI,
the renderer and the checks and imports nothing above it; without the `ui` extra the calls
say what to install instead of failing on an import deep inside.
"""

from __future__ import annotations

import html
from collections.abc import Callable
from typing import Any

from inspector._internal.common.lazy import entry_points
from inspector.errors import InspectorError

__all__ = ["UI_GROUP", "core_function", "html_view", "ui_function"]

UI_GROUP = "checkpoint_inspector.ui"
_INSTALL = "pip install 'checkpoint-inspector[ui]'"


def ui_function(name: str) -> Callable[..., Any]:
    """The UI's implementation of `name` (e.g. "browse"); InspectorError saying what to install
    when the UI or one of its libraries is missing."""
    found = entry_points(group=UI_GROUP, name=name)
    if not found:
        raise InspectorError(
            f"{name}() needs the notebook UI, which is not installed; {_INSTALL} "
            "(then restart the kernel)"
        )
    entry = next(iter(found))
    try:
        return entry.load()
    except ModuleNotFoundError as exc:
        raise InspectorError(
            f"{name}() needs {exc.name}, which is not installed; {_INSTALL} "
            "(then restart the kernel)"
        ) from None


def html_view(scanned: object) -> str:
    """The notebook display of `scanned` (the `html` entry of `UI_GROUP`); its escaped repr
    when the package's entry points are not installed (a source tree on `sys.path`)."""
    found = entry_points(group=UI_GROUP, name="html")
    if not found:
        return f"<pre>{html.escape(repr(scanned))}</pre>"
    view: Callable[[object], str] = next(iter(found)).load()
    return view(scanned)


def core_function(name: str) -> Callable[..., Any]:
    """The core's own entry `name` of `UI_GROUP` (code above the scanned checkpoint, e.g.
    "values"); InspectorError saying how to install the entry points when they are missing
    (a source tree on `sys.path` without `pip install -e .`)."""
    found = entry_points(group=UI_GROUP, name=name)
    if not found:
        raise InspectorError(
            f"{name} needs checkpoint-inspector's entry points, which are not installed; "
            "pip install checkpoint-inspector (or `pip install -e .` in a clone)"
        )
    function: Callable[..., Any] = next(iter(found)).load()
    return function
