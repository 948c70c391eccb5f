"""plotly's notebook renderers and widget, imported with nbformat put off: plotly reads only
its `__version__` (at each `show`), and importing nbformat cost a kernel 1.6 s or more of CPU
in every notebook that showed a figure; a stand-in answers it from the installed
distribution. Details: docs/architecture.md, "widgets/".
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["import_renderers", "nbformat_put_off"]

_LOCK = threading.Lock()
_NBFORMAT = "nbformat"


class _OnFirstUse:
    """Stands for the module `name`: its version read from its distribution, any other
    attribute from the module, imported then."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attribute: str) -> Any:
        if attribute == "__version__":
            try:
                return importlib.metadata.version(self._name)
            except importlib.metadata.PackageNotFoundError:
                pass  # installed without its metadata: the module knows
        return getattr(importlib.import_module(self._name), attribute)


@contextmanager
def nbformat_put_off() -> Iterator[None]:
    """While held, plotly's optional import of nbformat gets the stand-in (when nbformat is
    installed; when it is not, plotly says it is missing, as it always did)."""
    import plotly.optional_imports as optional

    get_module = optional.get_module
    stand_in = _OnFirstUse(_NBFORMAT)

    def put_off(name: str, should_load: bool = True) -> Any:
        if name == _NBFORMAT and should_load and importlib.util.find_spec(name) is not None:
            return sys.modules.get(name, stand_in)
        return get_module(name, should_load)

    with _LOCK:
        optional.get_module = put_off
        try:
            yield
        finally:
            optional.get_module = get_module


def import_renderers() -> None:
    """Import plotly's renderers now, with nbformat put off, where IPython is loaded (a kernel
    or a shell: a figure made there is likely shown, and IPython is what the renderers' own
    import costs elsewhere); nothing when they are imported already."""
    if "IPython" not in sys.modules or "plotly.io._renderers" in sys.modules:
        return
    with nbformat_put_off():
        importlib.import_module("plotly.io._renderers")
