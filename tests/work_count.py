"""The work a call does, counted rather than timed: a clock measures the machine's load as
much as the code (the house rule: no timed unit tests; speed goes in benchmarks/).

`calls(fn)` counts the function calls `fn()` makes, Python functions and built-ins alike (the
events `sys.setprofile` sees), so a step taken per name, per tensor or per pair shows as a
count that grows with the input. A test runs the code at two sizes and bounds the growth: a
pass that is linear where it should be constant, or quadratic where it should be linear,
fails at any load and on any machine. Profiling (not tracing) leaves coverage's tracer alone.
A process forked while counting (a sandbox child) is not counted, nor slowed by the count.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def calls(fn: Callable[[], T]) -> tuple[T, int]:
    """`fn()`'s result and the number of function calls it made in this thread."""
    count = 0

    def profile(frame: Any, event: str, arg: Any) -> None:
        nonlocal count
        if event in ("call", "c_call"):
            count += 1

    profile.counting = True  # type: ignore[attr-defined]
    previous = sys.getprofile()
    sys.setprofile(profile)
    try:
        result = fn()
    finally:
        sys.setprofile(previous)
    return result, count


def _not_in_a_child() -> None:
    if getattr(sys.getprofile(), "counting", False):
        sys.setprofile(None)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_not_in_a_child)
