"""Errors in the dashboard: shown where the person clicked, never lost in a live kernel.

ipywidgets hides them twice: `with output:` swallows an exception, and a click handler's goes
to the kernel's log. `captured(output, action)` and `guarded(action, status)` (every button's
handler) avoid both; the traps: docs/architecture.md, "widgets/".
"""

from __future__ import annotations

import html
import traceback
from collections.abc import Callable
from typing import Any, TypeVar

import ipywidgets as w

from inspector.ui import InspectorError, html_text, legible

__all__ = ["EXPECTED_ERRORS", "captured", "error_html", "guarded"]

T = TypeVar("T")

# The frames a bug's traceback shows in the page: the innermost, where it was raised (a deep
# recursion would otherwise fill the page); each line is cut by `legible`.
TRACEBACK_FRAMES = 30

# What an action catches and shows: the core's own errors, a value it refused (a bad size)
# and the operating system's (a full disk, a missing folder). Anything else is a bug.
EXPECTED_ERRORS: tuple[type[BaseException], ...] = (InspectorError, ValueError, OSError)


def error_html(exc: BaseException, *, bug: bool = False) -> str:
    """`exc` as one line for the page: its type and the core's message (which names the
    file, the bad value and what to do), legible (`inspector._internal.report.html.html_text`: the
    message may quote a hostile name); a bug says so and carries its traceback behind a
    "details" toggle (legible line by line: it quotes the message and the values too)."""
    prefix = "Unexpected error (a bug; please report it with its details): " if bug else ""
    details = ""
    if bug:
        lines = traceback.format_exception(exc, limit=-TRACEBACK_FRAMES)
        text = legible("".join(lines).rstrip("\n"), target="html", lines=True)
        details = (
            '<details class="ckpt-error-details"><summary>details</summary>'
            '<pre style="white-space:pre-wrap;font-size:11px;max-height:24em;overflow:auto">'
            f"{text}</pre></details>"
        )
    return (
        '<div class="ckpt-error" style="color:#d62728;overflow-wrap:anywhere">'
        f"{html.escape(prefix)}<b>{html.escape(type(exc).__name__)}</b>: "
        f"{html_text(exc)}{details}</div>"
    )


def captured(output: w.Output, action: Callable[[], T]) -> T:
    """`action()` with what it prints (tqdm's progress bars) drawn into `output`; its
    exception, if any, is raised here, outside the Output context that would swallow it."""
    failure: BaseException | None = None
    with output:
        try:
            return action()
        except BaseException as exc:  # re-raised below, where the caller can catch it
            failure = exc
    raise failure if failure is not None else RuntimeError("the output swallowed an error")


def guarded(
    action: Callable[[], object], status: w.HTML, *, clear: bool = False
) -> Callable[..., None]:
    """A click (or change, or figure click) handler that runs `action()` (its arguments are
    ignored) and shows its error in `status`
    instead of losing it in the kernel log. With `clear`, `status` shows nothing but this
    action's error (it is emptied first: the dashboard's notice line)."""

    def handler(*_event: Any) -> None:
        if clear:
            status.value = ""
        try:
            action()
        except EXPECTED_ERRORS as exc:
            status.value = error_html(exc)
        except Exception as exc:
            status.value = error_html(exc, bug=True)
            raise

    return handler
