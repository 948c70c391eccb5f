"""The notebook dashboard: `Dashboard(path_or_scanned)` shows a checkpoint in eleven tabs.

The widgets hold no logic: every action is one call into the core (`inspector.ui`). Tabs
are built ahead of the first click by a background worker and the costly parts wait until a
tab is first shown, so a 300,000-tensor checkpoint opens after one scan and the plain checks;
the load verdict is computed meanwhile (`dash.current` is what is on screen, `dash.state`
waits for the verdict). Details: docs/architecture.md, "widgets/".
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import ipywidgets as w

from inspector.ui import (
    ISSUE,
    Finding,
    Location,
    RemoteURL,
    ScannedCheckpoint,
    TensorQuery,
    html_text,
    plural,
    query_for_finding,
    severity_counts,
    severity_tally,
    start_verdict_for,
    start_verdict_process,
    verdict_apart,
)

from .controls import NOT_DRAWN, button, classed, close_tree, still
from .esm import ModulePreload
from .grid import GridCells, preload_grids, wait_for_quiet_grids
from .guard import EXPECTED_ERRORS, captured, error_html, guarded
from .plot import import_figure_widget, send_figure_module
from .snapshot import headless
from .state import (
    CheckpointState,
    load_with_progress,
    resolve,
    shell,
    still_checking,
    thread,
    values_read,
)
from .tabs import TABS as TAB_ROWS
from .tabs import build

if TYPE_CHECKING:
    pass

__all__ = ["CheckpointState", "Dashboard"]

_ALL = "all"
_TENSOR_COLUMNS = ["name", "file", "dtype", "shape", "numel", "nbytes"]
_FINDINGS_PER_PROBLEM = 3
# The longest the load check waits for the Overview to be sent, in a kernel (a dashboard made
# but not displayed, or whose `widget` is displayed by hand, starts it after this).
_VERDICT_HOLD = 3.0
# The plain rules a watched dashboard runs after its Overview is sent, not before: the costliest
# of them (at 289,892 tensors, 0.3-0.5 s of a 2.2-3.2 s Overview in a fresh kernel, load 3).
# What the Overview's facts read (the tables, the parameter count) is built before it anyway.
# Their findings show when they arrive, as the load verdict's do.
DEFERRED_RULES = ("index", "structure")
# Whether the load check's child is started as the scan starts (True) or once the Overview's
# messages are sent (False, see `_start_checks`); benchmarks/bench_overview.py --orders
# measures both side by side.
VERDICT_WITH_SCAN = False
# The longest the background worker waits for what a person asked for before it goes on.
_YIELD_SECONDS = 30.0
# The background worker waits for the grids to have been quiet this long (seconds), at most
# `_GRID_QUIET_LIMIT` at a time (`_yield_to_asked`).
_GRID_QUIET = 0.5
_GRID_QUIET_LIMIT = 5.0
_PAGE = 25


class Dashboard:
    """An ipywidgets app over one checkpoint; display it as the last expression of a cell.

    Tabs: Overview, Tensors, Files, Experts, Layers, Values, Serve, Findings, Repair,
    Consolidate, Report.
    `refresh()` re-scans the folder and redraws every tab (the Repair tab calls it after
    writing). Navigation: `show_tensors`, `show_cell`, `show_findings`, `repair`.
    `model=False` turns the load check off; `trust_remote_code` lets it build a model whose
    code ships in the checkpoint folder (see
    `inspector._internal.load.verdict`); `cache=False` computes the verdict again instead of
    taking the one kept in the user's cache (`inspector._internal.load.cache`: a kept
    verdict shows without starting the load check's process). `wait=True` makes the
    cell wait for the load check and the snapshot's figures before it ends, as it does by
    itself when the notebook is executed headless (nbclient, `jupyter nbconvert --execute`,
    papermill): the saved notebook then holds the finished snapshot.
    """

    TABS = tuple(tab.title for tab in TAB_ROWS)

    # The tabs the background worker builds ahead of the first click, the tensor table
    # (seconds at 1M tensors) first. Every tab is drawn from the plain checks' state
    # (`current`) and takes the load check's findings when they arrive (`when_checked`): none
    # waits for the load check to show (the Findings tab did, 3.5-7 s on the 1422 demo). A
    # click never waits for the worker: a tab not built yet shows a spinner and is built in
    # a thread of its own (`_on_select`).
    PREBUILT = ("Tensors", "Layers", "Files", "Experts", "Findings", "Repair")
    # The tabs it builds again after a re-scan or a check of the values replaced the state
    # (`_replace`): only the one whose build takes seconds on a large checkpoint. The others
    # are built when next selected, as after a first click: building all six again sent the
    # page their widget models at each re-scan, for tabs a person may never open again
    # (issue 35: the lab clicks test's page opened 3,823 widget models, 3,250 now).
    REBUILT = ("Tensors",)
    # Seconds between showing the Overview and building the other tabs (see `_start_worker`);
    # a test that clicks nothing meanwhile sets its dashboard's to 0 rather than wait.
    worker_delay = 1.5

    def __init__(
        self,
        source: str | os.PathLike[str] | ScannedCheckpoint,
        *,
        report_dir: str | os.PathLike[str] | None = None,
        progress: bool = True,
        snapshot: bool = True,
        model: bool = True,
        trust_remote_code: bool = False,
        cache: bool = True,
        wait: bool | None = None,
    ) -> None:
        self.model, self.trust_remote_code, self.cache = model, trust_remote_code, cache
        # Set by the Values tab: every later check (the load verdict's, a re-scan) reads
        # the values too, so their findings stay with the others.
        self.values = values_read(source)
        # Whether displaying waits for the finished snapshot; None: when the run is headless.
        self.wait_when_headless = wait
        self._headless = False
        if model and VERDICT_WITH_SCAN:
            start_verdict_process()  # its imports at its own priority (nice 5), on another core
        # The plain checks now (in a watched kernel without the costliest rules); the rest
        # and the load verdict in a thread (see the module docstring and `_start_checks`).
        self.current = load_with_progress(
            source,
            progress=progress,
            pending=model,
            values=self.values,
            skip=DEFERRED_RULES if _watched(wait) else (),
        )
        self._complete: Future[CheckpointState] = Future()
        if not model and not self.current.unchecked:
            self._complete.set_result(self.current)
        # Set once every plain rule's findings are shown: the background worker's imports and
        # tabs wait for it (they held the GIL the deferred rules need: their issues reached
        # the Overview 2-5 s after it instead of well under 1 s, load 11-13).
        self._plain_shown = threading.Event()
        if not self.current.unchecked:
            self._plain_shown.set()
        self.report_dir = Path(report_dir) if report_dir else Path.cwd()
        self.panels: dict[str, Any] = {}
        self._spinners: dict[str, w.HTML] = {}
        self.last_repair: Any = None
        self.widget = self._layout()
        self._snapshot = None
        if snapshot:
            from .snapshot import Snapshot

            self._snapshot = Snapshot()
        self._make_locks()
        self._draw()
        if model or self.current.unchecked:
            self._start_checks()

    def _layout(self) -> w.VBox:
        """The header with the Re-scan button, the notice and progress lines, the tabs."""
        self.header = w.HTML(layout=w.Layout(flex="1 1 auto", min_width="0")).add_class(
            "ckpt-header"
        )
        # The tabs' boxes and spinners share the kernel's layout and style (`still`).
        self.tab = w.Tab(children=[still(w.VBox) for _ in self.TABS]).add_class("ckpt-tabs")
        self.tab.titles = self.TABS
        # What went wrong with the last action that has no status line of its own (a
        # re-scan, a button of the Overview, building a tab): one line under the header.
        self.notice = classed(w.HTML, "ckpt-notice")
        self.tab.observe(guarded(self._on_select, self.notice, clear=True), names="selected_index")
        self.rescan = rescan = button(
            "Re-scan", "ckpt-rescan-button", icon="refresh", flex="0 0 auto"
        )
        rescan.on_click(guarded(self.refresh, self.notice, clear=True))
        # The re-scan's progress bar is drawn here (tqdm.auto writes into the Output widget).
        self.progress = w.Output().add_class("ckpt-progress")
        top = w.HBox(
            [self.header, rescan],
            layout=w.Layout(justify_content="space-between", align_items="center", width="100%"),
        )
        from .autosize import Autosize

        # Eleven tabs do not fit JupyterLab's fixed tab width: each tab takes its title's
        # width and the bar wraps, so no title is cut to an ellipsis. The spinners stand
        # still for a person who asked for less motion (Font Awesome's `fa-spin` ignores
        # the setting): a spinner turns for as long as a tab, a plan or a check is built.
        tab_style = w.HTML(
            # As specific as ipywidgets' own rule for the tab width, and later.
            "<style>.ckpt-dashboard .jupyter-widgets.widget-tab.ckpt-tabs > .lm-TabBar"
            " .lm-TabBar-content{flex-wrap:wrap}"
            ".ckpt-dashboard .jupyter-widgets.widget-tab.ckpt-tabs > .lm-TabBar"
            " .lm-TabBar-tab{flex:0 0 auto;min-width:fit-content}"
            "@media (prefers-reduced-motion: reduce){.ckpt-dashboard .fa-spin{animation:none}}"
            "</style>",
            layout=w.Layout(display="none"),
        )
        # Evaluates the grids' module on the page once it rests after the Overview, ahead of
        # the first grid a click shows (started by `_ipython_display_`).
        # Not while a tab is built (its spinner) or its grid or figure waits to be drawn.
        self._preload = ModulePreload(busy=f".ckpt-tab-loading, .{NOT_DRAWN}, .ckpt-module-loading")
        return w.VBox(
            [
                top,
                self.notice,
                self.progress,
                tab_style,
                self.tab,
                Autosize(),
                GridCells(),
                self._preload,
            ],
            layout=w.Layout(width="100%"),
        ).add_class("ckpt-dashboard")

    def _make_locks(self) -> None:
        """The locks, futures and events the threads that build panels and get the load
        verdict share."""
        # Panels are built by the background worker ahead of a click, by a thread a click
        # starts, or by a caller of `panel`; `_pending` holds one future per panel, claimed
        # under the lock by whoever builds it first, so none is built twice and nobody holds
        # the lock while building. The load verdict is published under its own lock.
        self._lock = threading.RLock()
        self._state_lock = threading.Lock()
        self._pending: dict[str, Future[Any]] = {}
        # The panels a re-scan left to be renewed rather than built again (`_replace`).
        self._kept: dict[str, Any] = {}
        self._generation = 0
        # Work a person asked for that is under way (see `_asked`).
        self._asked_count = 0
        self._asked_done = threading.Condition()
        self.worker: threading.Thread | None = None
        self.verdict_worker: threading.Thread | None = None
        # The threads tab clicks started (`_on_select`).
        self._clicks: list[threading.Thread] = []
        # Called with each state `_publish` shows (see `when_checked`).
        self._checked_callbacks: list[
            tuple[
                int,
                Callable[[CheckpointState], object],
                Callable[[BaseException], object] | None,
            ]
        ] = []
        # Held while they are called, so that a later state is never overwritten by an earlier.
        self._telling = threading.RLock()
        # Set once the Overview's messages are sent (`_ipython_display_`); until then the load
        # check waits (see `_start_verdict`). Outside a kernel nothing is sent: it is set.
        self._overview_sent = threading.Event()
        if getattr(shell(), "kernel", None) is None:
            self._overview_sent.set()

    @property
    def state(self) -> CheckpointState:
        """The checkpoint's state with the load verdict's findings and problems; waits for
        the load check when it is still running (a few seconds on a large MoE)."""
        self._overview_sent.set()  # whoever asks for it waits for nothing else
        return self._complete.result()

    @property
    def scanned(self) -> ScannedCheckpoint:
        return self.current.scanned

    @property
    def path(self) -> Path | RemoteURL:
        return self.current.scanned.path

    def refresh(self) -> None:
        """Re-scan and re-check the folder (a remote one through the same storage, listed
        afresh; the load check too: its model is cached by now), then redraw the open tab;
        other tabs are rebuilt when next selected. The saved snapshot follows. When the
        scan fails (the folder is gone), the error is raised and the dashboard keeps showing
        the previous state."""
        self.progress.clear_output()
        try:
            state = captured(
                self.progress,
                lambda: CheckpointState.load(
                    Location(self.scanned.location.storage.fresh()),
                    values=self.values,
                    progress=True,
                    model=self.model,
                    trust_remote_code=self.trust_remote_code,
                    cache=self.cache,
                ),
            )
        finally:
            self.progress.clear_output()
        self._replace(state)

    def check_values(self, mode: Literal["sample", "full"]) -> None:
        """Read the tensors' values (`sample`: a few windows of each; `full`: every byte)
        and check them with everything else (after the load check, waited for): their
        findings join the Overview's issues and the Findings tab, and the open tab is
        redrawn. Later re-scans read them again."""
        self.values = mode
        self.progress.clear_output()
        try:
            done = self.state
            state = captured(
                self.progress,
                lambda: CheckpointState.checked(
                    done.scanned, done.verdict, values=mode, progress=True
                ),
            )
        finally:
            self.progress.clear_output()
        self._replace(state)

    def _replace(self, state: CheckpointState) -> None:
        """Show `state` instead of the current one: every panel is drawn again (the open one
        now, the others when next selected). A panel that can (`renew`) shows it in the
        widgets it already has; the others are closed and built again."""
        with self._lock, self._state_lock:
            # Renewed when next built (`_build`): a check of the values or a re-scan built
            # every tab anew, its widgets and their views made again on the page for a few
            # changed values (issue 35: 1,146 models opened per click-through of the lab
            # test, most of them by the 4 rebuilds).
            for title, panel in self.panels.items():
                if hasattr(panel, "renew"):
                    self._kept[title] = panel
            old = [p for t, p in self.panels.items() if self._kept.get(t) is not p]
            self.panels.clear()
            self._pending.clear()
            self._generation += 1
            self._checked_callbacks.clear()
            self.current = state
            if self._complete.done():
                self._complete = Future()
            self._complete.set_result(state)
        self._draw(closing=old)
        if self._snapshot is not None:
            self._snapshot.update(self.state)
            if self._headless:
                generation = self._generation
                self._snapshot.render_figures(state, current=lambda: generation == self._generation)
                return
        self._start_worker(self.REBUILT)

    def _start_checks(self) -> None:
        """Run the plain rules the Overview was shown without (`DEFERRED_RULES`), then get the
        load verdict, from a thread; each time check with what is known and redraw what shows
        the state (header, Overview, snapshot).

        For a local folder the verdict is computed by a child process
        (`inspector._internal.load.child`): its imports of transformers and torch and the
        model build (10 s of CPU at 300,000 tensors) used to hold this kernel's GIL, so a
        tab clicked meanwhile answered late; the thread only waits for the child's answer.
        A remote checkpoint's verdict is computed in the thread; a verdict kept in the user's
        cache is read there, and no child is started. Either way the thread waits
        until the Overview's messages are sent (`_overview_sent`, at most `_VERDICT_HOLD`
        seconds): work that holds the GIL as the Overview is displayed starves the kernel's
        IOPub thread, which sends the Overview's widgets to the page (measured at 300,000
        tensors: 20 ms of the snapshot's work took 0.2-0.5 s). The child starts then too,
        before the deferred rules run (its imports use the other core meanwhile):
        started with the scan, its imports slowed the scan and the page on the 2 shared cores
        (measured side by side at 300,000 tensors: Overview 5.50-6.31 s against 6.35-7.28 s,
        for a verdict 2-3 s later)."""
        generation, first = self._generation, self.current

        def work() -> None:
            self._overview_sent.wait(_VERDICT_HOLD)
            plain = first
            try:
                if self.model:  # its imports on the other core while the deferred rules run
                    start_verdict_for(
                        plain.scanned, trust_remote_code=self.trust_remote_code, cache=self.cache
                    )
                if plain.unchecked:
                    try:
                        plain = CheckpointState.checked(
                            plain.scanned, None, values=self.values, pending=self.model
                        )
                        if not self._publish(plain, generation, final=not self.model):
                            return
                    finally:
                        self._plain_shown.set()
                if not self.model:
                    return
                verdict = verdict_apart(
                    plain.scanned, trust_remote_code=self.trust_remote_code, cache=self.cache
                )
                state = CheckpointState.checked(plain.scanned, verdict, values=self.values)
            except BaseException as exc:  # a bug: `state` raises it where it is asked for
                with self._state_lock:
                    if generation != self._generation:
                        raise  # a re-scan replaced the state: nobody waits for this one
                    self._complete.set_exception(exc)
                    failed = [f for g, _, f in self._checked_callbacks if g == generation and f]
                for tell in failed:
                    guarded(partial(tell, exc), self.notice)()
                raise
            self._publish(state, generation, final=True)

        self.verdict_worker = thread(work, "ckpt-load-verdict")
        self.verdict_worker.start()

    def _publish(self, state: CheckpointState, generation: int, *, final: bool) -> bool:
        """Show `state` (more of the checks' findings, or the load verdict's) in what shows
        `current`; `final`: it is the one `state` waits for. False when a re-scan replaced
        the state meanwhile (then nothing is shown)."""
        with self._state_lock:
            if generation != self._generation:
                return False
            self.current = state
            if final:
                self._complete.set_result(state)
            callbacks = [c for g, c, _ in self._checked_callbacks if g == generation]
        self._tell_checked(callbacks, generation)
        # The header is redrawn; the panels drawn from an earlier state update themselves in
        # place (`when_checked`: the Overview, the Findings tab, the Files and Layers tabs'
        # counts). The Overview was built whole again for each state, its widgets left open
        # (issue 35).
        with self._lock:
            if generation != self._generation:
                return False
            self._draw_header()
        if self._snapshot is not None:
            self._snapshot.update(state)
        return True

    def select(self, title: str) -> Any:
        """Open the tab called `title` and return its panel (built if needed)."""
        self.tab.selected_index = self.TABS.index(title)
        return self._shown(title)

    def _shown(self, title: str) -> Any:
        """The panel of the tab just shown; one that draws on being shown (grids, figures,
        the repair plan) is told."""
        with self._asked():
            return _on_shown(self.panel(title))

    @contextmanager
    def _asked(self) -> Iterator[None]:
        """Around work a person asked for (a tab clicked, a link followed): the background
        worker starts no other tab meanwhile (`_yield_to_asked`)."""
        with self._asked_done:
            self._asked_count += 1
        try:
            yield
        finally:
            with self._asked_done:
                self._asked_count -= 1
                self._asked_done.notify_all()

    def _yield_to_asked(self) -> None:
        """The background worker waits here before each tab it builds ahead: while a tab a
        person clicked is built and drawn, a tab nobody asked for yet would share the
        kernel's one interpreter (the GIL) with it. An import the worker has begun cannot
        be paused (plotly's widget, the longest). At most `_YIELD_SECONDS`, so that a stuck
        action never stops the worker."""
        with self._asked_done:
            self._asked_done.wait_for(lambda: self._asked_count == 0, timeout=_YIELD_SECONDS)
        # A grid just shown is still starting on the page: its viewer's requests, answered
        # here one after the other, waited on the worker's work.
        wait_for_quiet_grids(_GRID_QUIET, limit=_GRID_QUIET_LIMIT)

    def panel(self, title: str) -> Any:
        """The panel object of tab `title`, built on first use (here, or by the thread that
        is building it already: then this waits for it)."""
        future, mine, generation = self._claim(title)
        if mine:
            self._build(title, future, generation)
        return future.result()

    def _claim(self, title: str) -> tuple[Future[Any], bool, int]:
        """The future of panel `title`; True when the caller must build it."""
        with self._lock:
            future = self._pending.get(title)
            if future is not None:
                return future, False, self._generation
            future = self._pending[title] = Future()
            return future, True, self._generation

    def _build(self, title: str, future: Future[Any], generation: int) -> None:
        """Build panel `title`, put it in its tab (unless a re-scan replaced the state
        meanwhile) and resolve `future` with it."""
        with self._lock:
            kept = self._kept.pop(title, None)
        try:
            if kept is not None and kept.renew():
                panel = kept
            else:
                if kept is not None:
                    _close(kept)  # no tab shows it: its tab holds the spinner
                panel = build(TAB_ROWS[self.TABS.index(title)], self)
        except BaseException as exc:
            with self._lock:
                if self._pending.get(title) is future:
                    del self._pending[title]  # the next click tries again
            future.set_exception(exc)
            raise
        with self._lock:
            current = generation == self._generation and self._pending.get(title) is future
            if current:
                self.panels[title] = panel
                self.tab.children[self.TABS.index(title)].children = [panel.widget]
            # A later re-scan's state is shown: renewed when next built, or closed.
            keep = not current and hasattr(panel, "renew") and title not in self._kept
            if keep:
                self._kept[title] = panel
        if not current and not keep:
            _close(panel)
        future.set_result(panel)

    def _on_select(self) -> None:
        """A tab was clicked: show its panel, built by a thread (a spinner shows at once
        while it builds it, or waits for the worker that is building it), which then tells
        the panel it is shown (it makes its grid and figures, or plans the repair, the first
        time). The kernel answers the next click meanwhile."""
        index = self.tab.selected_index
        if index is None:
            return
        title = self.TABS[index]
        box = self.tab.children[index]
        with self._lock:
            built = self.panels.get(title)
            claimed = self._pending.get(title)
            mine = built is None and claimed is None
            future: Future[Any] = self._pending.setdefault(title, claimed or Future())
            generation = self._generation
            if built is None:
                box.children = [self._loading(title)]

        def build() -> None:
            try:
                with self._asked():
                    if mine:
                        self._build(title, future, generation)
                    panel = future.result()
                    if self.tab.selected_index == index:
                        _on_shown(panel)
            except Exception as exc:
                expected = isinstance(exc, EXPECTED_ERRORS)
                if built is None:
                    box.children = [w.HTML(error_html(exc, bug=not expected))]
                else:
                    self.notice.value = error_html(exc, bug=not expected)
                if not expected:
                    raise

        builder = thread(build, f"ckpt-build-{title}")
        with self._lock:  # for `close`, which waits for them
            self._clicks = [t for t in self._clicks if t.is_alive()]
            self._clicks.append(builder)
        builder.start()

    def when_checked(
        self,
        callback: Callable[[CheckpointState], object],
        *,
        drawn: CheckpointState,
        failed: Callable[[BaseException], object] | None = None,
    ) -> None:
        """Call `callback(state)` each time more findings arrive (the deferred rules', the
        load check's) for a panel drawn from state `drawn`, or `failed(exc)` when the checks
        raised instead (a bug: a panel waiting for them says so rather than spin forever);
        nothing for a state a re-scan replaced meanwhile. What arrived while the panel was
        built (after it read `drawn`, before it asked) is given now: the checks may finish
        in between, and the panel then kept the earlier findings for good."""
        with self._state_lock:
            generation, current = self._generation, self.current
            late = current is not drawn
            broken = self._complete.exception() if self._complete.done() else None
            if (current.pending or current.unchecked) and broken is None:
                self._checked_callbacks.append((generation, callback, failed))
        if late:
            self._tell_checked([callback], generation)
        if broken is not None and failed is not None and current.pending:
            guarded(partial(failed, broken), self.notice)()

    def _tell_checked(
        self, callbacks: Sequence[Callable[[CheckpointState], object]], generation: int
    ) -> None:
        """Call each of `callbacks` with the current state, one caller at a time (the checks'
        thread and a panel's `when_checked`): the latest state is the last one given."""
        with self._telling:
            with self._state_lock:
                if generation != self._generation:
                    return
                state = self.current
            for callback in callbacks:
                guarded(partial(callback, state), self.notice)()

    def wait(self, timeout: float | None = None) -> None:
        """Until the load check is done and the background worker has built every tab and
        rendered the snapshot's figures (scripts and tests; a person never needs to)."""
        self._overview_sent.set()
        self._complete.exception(timeout)
        if self.verdict_worker is not None:
            self.verdict_worker.join(timeout)  # it redraws the Overview after publishing
        if self.worker is not None:
            self.worker.join(timeout)

    def close(self, timeout: float | None = 60) -> None:
        """Close every widget the dashboard made (its panels, their grids' tables, its tabs
        and header), once the threads it started for the load check and the tabs built ahead
        have ended (at most `timeout` seconds each): the kernel and the page then hold none of
        its widget models. A script or test that makes dashboards closes each it is done with."""
        with self._lock, self._state_lock:
            self._generation += 1  # the threads publish and build nothing more
            self._checked_callbacks.clear()
        self._overview_sent.set()
        with self._lock:
            clicks = list(self._clicks)
        for worker in (self.verdict_worker, self.worker, *clicks):
            if worker is not None and worker is not threading.current_thread():
                worker.join(timeout)
        with self._lock:
            panels = [*self.panels.values(), *self._kept.values()]
            self.panels.clear()
            self._kept.clear()
            self._pending.clear()
        for panel in panels:
            _close(panel)
        close_tree(self.widget)
        for spinner in self._spinners.values():
            close_tree(spinner)

    def _start_worker(self, tabs: Sequence[str] | None = None) -> None:
        """After the Overview is on screen: import what the other tabs need at once, build
        `tabs` (`PREBUILT` when None) ahead of the first click, then render the snapshot's
        figures."""
        generation = self._generation
        ahead = self.PREBUILT if tabs is None else tuple(tabs)
        started = time.monotonic()

        def work() -> None:
            self._plain_shown.wait(_YIELD_SECONDS)  # the Overview's issues come first
            # Importing Perspective's and plotly's widgets takes a second or more, in the
            # kernel only once. Started now, they are done before most first clicks.
            self._yield_to_asked()
            import perspective.widget  # noqa: F401

            self._yield_to_asked()
            import_figure_widget()
            self._yield_to_asked()
            from .figures import prepare_template

            prepare_template()

            # The delay lets the Overview's widgets reach the page and paint before the
            # worker's widgets compete with them for the page.
            time.sleep(max(0.0, self.worker_delay - (time.monotonic() - started)))
            for title in ahead:
                self._yield_to_asked()
                if generation != self._generation:
                    return
                self.panel(title)
            state = self.state  # with the load verdict: the snapshot lists its findings too
            self._yield_to_asked()
            if self._snapshot is not None:
                self._snapshot.render_figures(state, current=lambda: generation == self._generation)

        self.worker = thread(work, "ckpt-prebuild")
        self.worker.start()

    # -- navigation: where the Overview's and the findings' links lead ---------------------

    def show_tensors(self, query: TensorQuery) -> Any:
        """The Tensors tab, filtered by `query`."""
        browser = self.select("Tensors")
        browser.set_query(query)
        return browser

    def show_cell(self, layer: int, expert: int | None = None) -> Any:
        """The Experts tab zoomed into `layer` (and `expert`, if given)."""
        experts = self.select("Experts")
        experts.show(layer, expert)
        return experts

    def show_findings(self, codes: Sequence[str] = ()) -> Any:
        """The Findings tab, showing the findings of `codes` (all when empty)."""
        panel = self.select("Findings")
        panel.show_codes(codes)
        return panel

    def follow(self, finding: Finding) -> Any:
        """Open what a finding is about: its tensor (as stored: a model key of the load check
        or a fused expert name shows the stored tensors behind it), its heatmap cell or its
        file."""
        shards = set(self.scanned.files["file"].astype(str)) if len(self.scanned.files) else set()
        if finding.tensor:
            verdict = self.current.verdict
            return self.show_tensors(query_for_finding(finding, self.scanned.tensors, verdict))
        if finding.layer is not None and len(self.scanned.experts):
            return self.show_cell(finding.layer, finding.expert)
        if finding.file in shards:
            return self.show_tensors(TensorQuery(file=finding.file))
        return self.show_findings((finding.code,))

    def repair(self, parts: Sequence[str] = ()) -> Any:
        """The Repair tab with a plan of `parts` (all when empty), asking for confirmation."""
        panel = self.panel("Repair")
        panel.use_parts(tuple(parts))  # before the tab shows: it is planned once
        self.select("Repair")
        panel.ask()
        return panel

    def restore(self, source: str = "") -> Any:
        """The Repair tab planning to copy lost tensors back from `source` (the candidate
        reference when known; otherwise the field waits for one)."""
        panel = self.panel("Repair")
        if source:
            panel.use_restore(source)
        self.select("Repair")
        if source:
            panel.ask()
        return panel

    # -- drawing -----------------------------------------------------------------------------

    def _draw(self, *, closing: Sequence[Any] = ()) -> None:
        """Draw the header and a spinner in every tab, close the panels of `closing` (those
        a re-scan replaced), then build the open tab's panel."""
        self._draw_header()
        # Every tab holds its spinner until its panel is built: a click shows it at once,
        # from the page alone, however busy the kernel is.
        for title, box in zip(self.TABS, self.tab.children, strict=True):
            box.children = [self._loading(title)]
        # Closed only once no tab shows them: a closed widget still in a tab's children is a
        # view of a model the page no longer has ("widget model not found" in its console).
        for panel in closing:
            _close(panel)
        self._shown(self.TABS[self.tab.selected_index or 0])

    def _loading(self, title: str) -> w.HTML:
        """What tab `title` shows while it is built: a spinner and what is being built. One
        per tab for the dashboard's life, its words set again: a new one per tab at each
        re-scan was eleven widgets (and their layouts and styles) left open each time."""
        what = TAB_ROWS[self.TABS.index(title)].building(self.current.scanned)
        spinner = self._spinners.get(title)
        if spinner is None:
            spinner = self._spinners[title] = still(w.HTML)
        spinner.value = (
            "<div class='ckpt-tab-loading' style='padding:16px;color:#555'>"
            "<i class='fa fa-spinner fa-spin' style='margin-right:6px'></i>"
            f"Building {html_text(what)}...</div>"
        )
        return spinner

    def _draw_header(self) -> None:
        s, problems = self.current.scanned, self.current.problems
        counts = severity_tally(problems)
        verdict = (
            f"{plural(len(problems), ISSUE)} ({severity_counts(counts)})"
            if problems
            else "<span style='color:#2ca02c'>no issues</span>"
        )
        if self.current.unchecked:
            verdict += f" <i style='color:#666'>({html_text(still_checking(self.current))})</i>"
        elif self.current.pending:
            verdict += " <i style='color:#666'>(checking whether it loads...)</i>"
        self.header.value = (
            f"<div style='overflow-wrap:anywhere'><b>{_esc(s.path.name)}</b> &nbsp; "
            f"<code>{_esc(s.path)}</code> &nbsp; layout <b>{_esc(s.layout)}</b> &nbsp; "
            f"{verdict}</div>"
        )
        titles = list(self.TABS)
        # Short enough for the tab (JupyterLab cuts titles past ~16 characters); while the
        # load check runs, the count may still grow: "...".
        more = "..." if self.current.pending or self.current.unchecked else ""
        titles[self.TABS.index("Findings")] = f"Findings ({len(self.current.findings):,}{more})"
        self.tab.titles = tuple(titles)

    def _ipython_display_(self) -> None:
        """The live widget, then (when enabled) the static snapshot as further outputs. In
        a headless run the cell waits for the load check and renders the figures before it
        ends (see `widgets.snapshot`); the other tabs are built when first shown."""
        from IPython.display import display

        display(self._widget_bundle(), raw=True)
        self._headless = (
            self.wait_when_headless if self.wait_when_headless is not None else headless()
        )
        if self._headless:
            self._overview_sent.set()  # nobody watches: the load check goes at once
            snapshot, rendered = self._snapshot, Future[tuple[list[bytes], str]]()
            if snapshot is not None:
                # kaleido's browser renders the figures while the load check builds the model.
                plain = self.current
                render = thread(
                    lambda: resolve(rendered, lambda: snapshot.render_now(plain)), "ckpt-png"
                )
                render.start()
            self._complete.exception()  # the load verdict; a bug in it is raised by `state`
            if self.verdict_worker is not None:
                self.verdict_worker.join()  # it updates what shows `current`
            if snapshot is not None:
                snapshot.show(self.state, rendered=rendered.result())
            return
        if self._snapshot is not None:
            self._snapshot.show(self.current)
        # The threads that import seconds' worth of modules (the load check's, the worker's)
        # start once the Overview and the snapshot are on their way to the page.
        _iopub_sent()
        # Then the grids' module, which the page evaluates when it rests after painting the
        # Overview (the first grid a click shows cost 2-4 s of the page: Perspective's
        # evaluation, then its WebAssembly's set-up), and the figures' (sent, evaluated by
        # the first figure: `send_figure_module`).
        try:
            preload_grids(self._preload)
            send_figure_module()
        except (OSError, ImportError):
            # A Perspective or plotly.js missing or laid out otherwise: the Overview stays;
            # the first grid or figure says what is wrong when its tab is opened.
            pass
        self._overview_sent.set()
        self._start_worker()

    def _widget_bundle(self) -> dict[str, Any]:
        bundle = self.widget._repr_mimebundle_()
        data = bundle[0] if isinstance(bundle, tuple) else bundle
        # What a viewer without the widget manager shows in place of the live dashboard.
        data["text/plain"] = (
            f"Checkpoint dashboard of {self.path} (interactive: needs the running kernel; "
            "the static snapshot below shows what was found)"
        )
        return data

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        from .snapshot import snapshot_html

        return {**self._widget_bundle(), "text/html": snapshot_html(self.current)}


# -- helpers ----------------------------------------------------------------------------------


def _iopub_sent(timeout: float = 10.0) -> None:
    """Wait until the kernel's IOPub thread has sent every message queued so far (it sends
    them in order; nothing to wait for outside a kernel)."""
    kernel = getattr(shell(), "kernel", None)
    schedule = getattr(getattr(kernel, "iopub_thread", None), "schedule", None)
    if schedule is None:
        return
    sent = threading.Event()
    schedule(sent.set)
    sent.wait(timeout)


def _on_shown(panel: Any) -> Any:
    """Tell a panel that draws on being shown (a grid, a figure, the repair plan) that its tab
    is shown."""
    shown = getattr(panel, "on_shown", None)
    if shown is not None:
        shown()
    return panel


def _close(panel: Any) -> None:
    """Close a panel a re-scan replaced: what it frees itself (`close`: a grid's table) and
    every widget of its tree (`close_tree`): closing its grid alone left the rest open in the
    kernel and on the page (issue 35)."""
    close = getattr(panel, "close", None)
    if close is not None:
        close()
    widget = getattr(panel, "widget", None)
    if isinstance(widget, w.Widget):
        close_tree(widget)


def _watched(wait: bool | None) -> bool:
    """Whether a person watches the cell that makes the dashboard (a kernel, not headless,
    not asked to wait): only then is its Overview shown before every plain rule ran."""
    if getattr(shell(), "kernel", None) is None:
        return False
    return not (wait if wait is not None else headless())


def _esc(value: object) -> str:
    return html_text(value)
