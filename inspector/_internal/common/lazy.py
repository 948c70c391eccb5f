"""Public names imported on first use (PEP 562): the module-level `__getattr__` and `__dir__`
of `inspector` and `inspector.ui`, which list many names whose modules import pandas and the
readers, so that importing the facade costs nothing until a name is used. And the entry-point
lookup, whose importlib.metadata is imported only when a lookup is made."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Collection, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from importlib.metadata import EntryPoints

__all__ = ["entry_points", "lazy_names"]


def lazy_names(
    module: str, table: Mapping[str, str], names: Collection[str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """`__getattr__` and `__dir__` for `module`: each name of `table` is imported from the
    module it maps to the first time it is read, then kept in `module`'s namespace."""
    namespace = vars(sys.modules[module])

    def __getattr__(name: str) -> Any:
        source = table.get(name)
        if source is None:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(source), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(names))

    return __getattr__, __dir__


def entry_points(*, group: str, name: str | None = None) -> EntryPoints:
    """The installed entry points of `group` (only those called `name`, if given). Importing
    importlib.metadata costs a process about 25 ms and the lookup about 9 ms more, reading
    every installed distribution's metadata: only plugin commands and the notebook UI need
    them, so a command that needs neither pays nothing."""
    from importlib.metadata import entry_points as installed

    return installed(group=group) if name is None else installed(group=group, name=name)
