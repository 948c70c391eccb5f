"""Errors in the dashboard: shown where the person clicked, never lost in a live kernel.

Two traps of ipywidgets in a running kernel, and the one pattern that avoids both:

- `with output:` (an `ipywidgets.Output` context, where progress bars are drawn) swallows
  the exception raised inside it: `Output.__exit__` prints the traceback into the output and
  returns True whenever IPython is running. An `except` written after the `with` block never
  runs there (it does in a plain Python test, which is how such code passes its tests).
  `captured(output, action)` runs `action` inside the context but re-raises its exception
  outside it.
- An exception raised by a button's click handler goes to the kernel's log (JupyterLab's log
  console), not to the page: the person sees nothing happen. `guarded(action, status)` is
  the click handler every dashboard button uses: it runs `action`, shows an error the core
  raises on purpose (a refused plan, a bad size, an unreadable file) in `status` as the
  core's message, and shows anything else as the bug it is (then re-raises it for the log).
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
