"""The dashboard's state: one scan of the checkpoint with its findings, problems and load
verdict (`CheckpointState`, replaced as a whole on a re-scan), how the dashboard first loads
it, and the threads that compute it. Below every tab: a tab reads the state, never builds it.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import Future
from contextvars import copy_context
from dataclasses import dataclass, replace
from functools import cached_property
from typing import TYPE_CHECKING, Any, Literal

import ipywidgets as w

from inspector.ui import (
    Finding,
    Location,
    Problem,
    ScannedCheckpoint,
    check,
    findings_to_frame,
    group_problems,
    known_verdict,
    rules_for,
    scan,
    verdict_apart,
)

from .guard import captured

if TYPE_CHECKING:
    import pandas as pd

    from inspector.ui import LoadVerdict

__all__ = [
    "CheckpointState",
    "load_with_progress",
    "resolve",
    "shell",
    "still_checking",
    "thread",
    "values_read",
]


@dataclass(frozen=True)
class CheckpointState:
    """One scan of the checkpoint, its findings and their problems, and the load verdict
    they were checked with; replaced as a whole on refresh.

    `verdict` is None when the load check is off, or (`pending`) still running: then the
    findings are the plain checks' only. `unchecked` names the plain rules not run yet (the
    dashboard's first Overview shows before its costliest rules ran): their findings are
    still to come."""

    scanned: ScannedCheckpoint
    findings: tuple[Finding, ...]
    problems: tuple[Problem, ...]
    verdict: LoadVerdict | None = None
    pending: bool = False
    unchecked: tuple[str, ...] = ()

    @cached_property
    def frame(self) -> pd.DataFrame:
        """The findings as `findings_to_frame` returns them, made when a tab first reads
        them: the Overview shows none of it, and made with the state it cost pandas' import
        (0.3-1.3 s of a fresh kernel) before the Overview was sent."""
        return findings_to_frame(self.findings)

    @classmethod
    def load(
        cls,
        source: str | os.PathLike[str] | Location | ScannedCheckpoint,
        *,
        deep: bool = False,
        values: Literal["sample", "full"] | None = None,
        progress: bool = False,
        model: bool = True,
        trust_remote_code: bool = False,
        cache: bool = True,
        skip: tuple[str, ...] = (),
    ) -> CheckpointState:
        """Scan `source` (unless it is already a scan), compute the load verdict (with
        `model`; `cache` as in `load_verdict`: the verdict kept in the user's cache for this
        very checkpoint is taken, and no process is started for it), run every check with it
        (the value checks too, with `values`), group the findings. The plain checks run once while
        the load check's child process computes the verdict: what they derive (tables, counts, the
        index view) is kept with the scan, so the checks with the verdict re-run only the plain
        rules themselves (0.3-0.4 s at 300,000 tensors) and add the model rules. Tensor data
        (`deep`, `values`) is read only then, once. Without `model`, `skip` names plain rules
        left for later (`unchecked`)."""
        scanned = (
            source if isinstance(source, ScannedCheckpoint) else scan(source, progress=progress)
        )
        # A verdict known at no cost (kept in the cache, or a skip the files decide) needs no
        # child to wait for, nor the plain checks run meanwhile: they would run twice.
        verdict = (
            known_verdict(scanned, trust_remote_code=trust_remote_code, cache=cache)
            if model
            else None
        )
        if model and verdict is None:
            asked: Future[LoadVerdict] = Future()
            child = thread(
                lambda: resolve(
                    asked,
                    lambda: verdict_apart(
                        scanned, trust_remote_code=trust_remote_code, cache=cache
                    ),
                ),
                "ckpt-load-verdict",
            )
            child.start()
            check(scanned, model=False)
            verdict = asked.result()
        skip = () if model else skip
        return cls.checked(scanned, verdict, deep=deep, values=values, progress=progress, skip=skip)

    @classmethod
    def checked(
        cls,
        scanned: ScannedCheckpoint,
        verdict: LoadVerdict | None,
        *,
        deep: bool = False,
        values: Literal["sample", "full"] | None = None,
        progress: bool = False,
        pending: bool = False,
        skip: tuple[str, ...] = (),
    ) -> CheckpointState:
        """The state of `scanned` checked with `verdict` (None: without the model rules) and,
        with `values`, its tensors' values (read once per scan and mode: see
        `inspector._internal.checks.values`); the plain rules `skip` names are left out."""
        findings = tuple(
            check(
                scanned,
                deep=deep,
                values=values,
                model=verdict is not None,
                verdict=verdict,
                progress=progress,
                skip=skip,
            )
        )
        problems = group_problems(scanned, findings, verdict=verdict)
        unchecked = tuple(r.name for r in rules_for(scanned.layout) if r.name in skip)
        return cls(scanned, findings, problems, verdict, pending, unchecked)


def still_checking(state: CheckpointState) -> str:
    """What `state` is still checked for, in words ("checking the index and the
    structure...")."""
    return f"checking the {' and the '.join(state.unchecked)}..."


def values_read(
    source: str | os.PathLike[str] | ScannedCheckpoint,
) -> Literal["sample", "full"] | None:
    """The values mode a check already read for a scan passed in (`check(scanned,
    values=...)` before the dashboard), so that their findings show with the others."""
    if not isinstance(source, ScannedCheckpoint):
        return None
    # Here: its module (the value checks) imports pandas, which the Overview needs not.
    from inspector.ui import computed_value_table

    table = computed_value_table(source)
    if table is None or not len(table):
        return None
    return "full" if (table["mode"] == "full").any() else "sample"


def load_with_progress(
    source: str | os.PathLike[str] | ScannedCheckpoint,
    *,
    progress: bool,
    pending: bool,
    values: Literal["sample", "full"] | None = None,
    skip: tuple[str, ...] = (),
) -> CheckpointState:
    """The state of the plain checks (the load verdict `pending`, or off; the rules `skip`
    names left for later); in a notebook,
    with progress bars in the cell while the scan and the checks run. The bars are drawn
    into an Output widget whose place in the cell is emptied afterwards, so the saved
    notebook keeps no dead progress widgets."""

    def load(progress: bool) -> CheckpointState:
        state = CheckpointState.load(
            source, progress=progress, model=False, values=values, skip=skip
        )
        return replace(state, pending=pending)

    kernel = getattr(shell(), "kernel", None)
    if not progress or kernel is None:
        return load(False)
    from IPython.display import display

    bars = w.Output()
    handle = display(bars, display_id=True)
    try:
        return captured(bars, lambda: load(True))
    finally:
        bars.close()
        handle.update({"text/plain": ""}, raw=True)


def shell() -> Any:
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    return get_ipython()


def thread(target: Callable[[], None], name: str) -> threading.Thread:
    """A daemon thread whose widget messages keep the parent of the message that started it
    (the cell, or the click). Without its own context a thread's messages take the parent of
    whatever message the kernel handles at the moment (ipykernel's shell context); when that
    handler draws progress bars into an `Output` (`captured`: a consolidation, a refresh,
    the next dashboard's scan), the page's Output swallows every message with that parent,
    so a grid or figure the thread created or updated meanwhile never appeared."""
    return threading.Thread(target=copy_context().run, args=(target,), name=name, daemon=True)


def resolve(future: Future[Any], work: Callable[[], Any]) -> None:
    """Resolve `future` with `work()`, or with the exception it raised."""
    try:
        future.set_result(work())
    except BaseException as exc:
        future.set_exception(exc)
