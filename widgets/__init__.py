"""Notebook UI and reports for checkpoint-inspector (the `ui` extra), installed as
`inspector.widgets` (the folder is `widgets/` in the repository).

Imports are lazy on purpose: `inspector.widgets.figures` or `.report` needs only plotly, and
ipywidgets is imported only when a widget is first used.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what the lazy names are, for type checkers and the API pages
    from .dashboard import Dashboard
    from .figures import (
        bytes_per_layer,
        expert_coverage_heatmap,
        findings_by_code,
        parameters_per_layer,
        shard_size_distribution,
    )
    from .report import write_html_report

__all__ = [
    "Dashboard",
    "bytes_per_layer",
    "expert_coverage_heatmap",
    "findings_by_code",
    "parameters_per_layer",
    "shard_size_distribution",
    "write_html_report",
]

# Public name -> module that defines it. New UI pieces register here.
_LAZY: dict[str, str] = {
    "Dashboard": "inspector.widgets.dashboard",
    "bytes_per_layer": "inspector.widgets.figures",
    "expert_coverage_heatmap": "inspector.widgets.figures",
    "findings_by_code": "inspector.widgets.figures",
    "parameters_per_layer": "inspector.widgets.figures",
    "shard_size_distribution": "inspector.widgets.figures",
    "write_html_report": "inspector.widgets.report",
}


def __getattr__(name: str) -> Any:
    """Import the defining module on first access (PEP 562)."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'inspector.widgets' has no attribute {name!r}")
    from inspector.ui import gc_paused

    # The dashboard's imports (pandas, ipywidgets, the core: half a second of a fresh kernel's
    # CPU) leave their objects alive; the collector's passes over them meanwhile cost 0.07-0.1
    # s more (two full passes among 170), as the CLI's imports did (`cli.check`).
    with gc_paused():
        value = getattr(import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
