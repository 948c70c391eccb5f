"""The notebook UI as seen from the core: `ckpt.browse()` and `ckpt.dashboard()` look their
implementation up by name in the `checkpoint_inspector.ui` entry-point group, which the `ui`
extra's package (`inspector.widgets`) fills. The core never imports the UI package itself, and
without the extra the calls say what to install instead of failing on an import deep inside.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Any

from inspector.errors import InspectorError

__all__ = ["UI_GROUP", "ui_function"]

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
