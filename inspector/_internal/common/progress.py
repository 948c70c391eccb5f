"""Progress bars for long scans and checks, off unless asked for (`scan(..., progress=True)`).

One switch, set by the public entry points and read where the work loops: `reporting(True)`
turns it on for the calls inside the `with` block, `track(items)` wraps a loop in a `tqdm.auto`
bar (a widget in a notebook, text on a terminal) only while it is on. A context variable, so
the layout modules need no extra parameter and concurrent scans in other threads are unaffected.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TypeVar

__all__ = ["reporting", "track"]

T = TypeVar("T")

_ON: ContextVar[bool] = ContextVar("inspector_progress", default=False)


@contextmanager
def reporting(enabled: bool) -> Iterator[None]:
    """Show progress bars for the work done inside the block (when `enabled`)."""
    token = _ON.set(enabled or _ON.get())
    try:
        yield
    finally:
        _ON.reset(token)


def track(
    items: Iterable[T], *, desc: str, total: int | None = None, unit: str = "it"
) -> Iterable[T]:
    """`items`, drawn as a progress bar while `reporting` is on. The bar goes away when done
    (`leave=False`): it is a sign of life, not a result."""
    if not _ON.get():
        return items
    from tqdm.auto import tqdm

    return tqdm(items, desc=desc, total=total, unit=unit, leave=False, dynamic_ncols=True)
