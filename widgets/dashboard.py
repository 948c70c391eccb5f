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
from contextvars import copy_context
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import ipywidgets as w
import pandas as pd

from inspector.ui import (
    FINDING,
    ISSUE,
    Finding,
    Location,
    Problem,
    RemoteURL,
    ScannedCheckpoint,
    TensorQuery,
    check,
    code_help_html,
    computed_value_table,
    facts_html,
    findings_html,
    findings_per_file,
    findings_to_frame,
    frame_html,
    group_problems,
    html_text,
    known_verdict,
    layer_name,
    legible_each,
    load_verdict_html,
    markup_html,
    plural,
    problem_html,
    query_for_finding,
    restore_reference,
    scan,
    severity_badge,
    severity_counts,
    severity_rank,
    severity_tally,
    verdict_apart,
)

from .controls import button
from .grid import FrameGrid, GridCells, yes_no
from .guard import EXPECTED_ERRORS, captured, error_html, guarded
from .plot import FigureBox, figure_widget, import_figure_widget
from .snapshot import headless

if TYPE_CHECKING:
    from inspector.ui import LoadVerdict

__all__ = ["CheckpointState", "Dashboard"]

_ALL = "all"
_TENSOR_COLUMNS = ["name", "file", "dtype", "shape", "numel", "nbytes"]
_FINDINGS_PER_PROBLEM = 3
_WORKER_DELAY = 1.5  # seconds between showing the Overview and building the other tabs
# The longest the load check waits for the Overview to be sent, in a kernel (a dashboard made
# but not displayed, or whose `widget` is displayed by hand, starts it after this).
_VERDICT_HOLD = 3.0
# The longest the background worker waits for what a person asked for before it goes on.
_YIELD_SECONDS = 30.0
_PAGE = 25


@dataclass(frozen=True)
class CheckpointState:
    """One scan of the checkpoint, its findings and their problems, and the load verdict
    they were checked with; replaced as a whole on refresh.

    `verdict` is None when the load check is off, or (`pending`) still running: then the
    findings are the plain checks' only."""

    scanned: ScannedCheckpoint
    findings: tuple[Finding, ...]
    frame: pd.DataFrame  # the findings as `findings_to_frame` returns them
    problems: tuple[Problem, ...]
    verdict: LoadVerdict | None = None
    pending: bool = False

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
    ) -> CheckpointState:
        """Scan `source` (unless it is already a scan), compute the load verdict (with
        `model`; `cache` as in `load_verdict`: the verdict kept in the user's cache for this
        very checkpoint is taken, and no process is started for it), run every check with it
        (the value checks too, with `values`), group the findings. The plain checks run once while
        the load check's child process computes the verdict: what they derive (tables, counts, the
        index view) is kept with the scan, so the checks with the verdict re-run only the plain
        rules themselves (0.3-0.4 s at 300,000 tensors) and add the model rules. Tensor data
        (`deep`, `values`) is read only then, once."""
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
            thread = _thread(
                lambda: _resolve(
                    asked,
                    lambda: verdict_apart(
                        scanned, trust_remote_code=trust_remote_code, cache=cache
                    ),
                ),
                "ckpt-load-verdict",
            )
            thread.start()
            check(scanned, model=False)
            verdict = asked.result()
        return cls.checked(scanned, verdict, deep=deep, values=values, progress=progress)

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
    ) -> CheckpointState:
        """The state of `scanned` checked with `verdict` (None: without the model rules) and,
        with `values`, its tensors' values (read once per scan and mode: see
        `inspector._internal.checks.values`)."""
        findings = tuple(
            check(
                scanned,
                deep=deep,
                values=values,
                model=verdict is not None,
                verdict=verdict,
                progress=progress,
            )
        )
        problems = group_problems(scanned, findings, verdict=verdict)
        return cls(scanned, findings, findings_to_frame(findings), problems, verdict, pending)


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

    TABS = (
        "Overview",
        "Tensors",
        "Files",
        "Experts",
        "Layers",
        "Values",
        "Serve",
        "Findings",
        "Repair",
        "Consolidate",
        "Report",
    )

    # The tabs the background worker builds ahead of the first click. Those drawn from the
    # plain checks come first (the tensor table, seconds at 1M tensors, first of all); those
    # that list the load check's findings wait for it. A click never waits for the worker: a
    # tab not built yet shows a spinner and is built in a thread of its own (`_on_select`).
    PREBUILT = ("Tensors", "Layers", "Files", "Experts")
    PREBUILT_WITH_VERDICT = ("Findings", "Repair")

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
        from .actions import ConsolidatePanel, RepairPanel, ReportPanel
        from .browser import TensorBrowser
        from .serve_panel import ServePanel
        from .values_panel import ValuesPanel

        self.model, self.trust_remote_code, self.cache = model, trust_remote_code, cache
        # Set by the Values tab: every later check (the load verdict's, a re-scan) reads
        # the values too, so their findings stay with the others.
        self.values = _values_read(source)
        # Whether displaying waits for the finished snapshot; None: when the run is headless.
        self.wait_when_headless = wait
        self._headless = False
        # The plain checks now; the load verdict in a thread (see the module docstring).
        self.current = _load_with_progress(
            source, progress=progress, pending=model, values=self.values
        )
        self._complete: Future[CheckpointState] = Future()
        if not model:
            self._complete.set_result(self.current)
        self.report_dir = Path(report_dir) if report_dir else Path.cwd()
        self._builders: dict[str, Callable[[], Any]] = {
            "Overview": lambda: OverviewPanel(self),
            "Tensors": lambda: TensorBrowser(
                self.scanned, export_dir=self.report_dir, defer_grid=True, cells=False
            ),
            "Files": lambda: FilesPanel(self),
            "Experts": lambda: ExpertsPanel(self),
            "Layers": lambda: LayersPanel(self),
            "Values": lambda: ValuesPanel(
                self.scanned, figure=figure_widget, check_values=self.check_values
            ),
            "Serve": lambda: ServePanel(self.scanned, figure=figure_widget),
            "Findings": lambda: FindingsPanel(self),
            "Repair": lambda: RepairPanel(self),
            "Consolidate": lambda: ConsolidatePanel(self),
            "Report": lambda: ReportPanel(self),
        }
        self.panels: dict[str, Any] = {}
        self.last_repair: Any = None
        self.header = w.HTML(layout=w.Layout(flex="1 1 auto", min_width="0")).add_class(
            "ckpt-header"
        )
        self.tab = w.Tab(children=[w.VBox() for _ in self.TABS]).add_class("ckpt-tabs")
        self.tab.titles = self.TABS
        # What went wrong with the last action that has no status line of its own (a
        # re-scan, a button of the Overview, building a tab): one line under the header.
        self.notice = w.HTML().add_class("ckpt-notice")
        self.tab.observe(guarded(self._on_select, self.notice, clear=True), names="selected_index")
        self.rescan = rescan = button("Re-scan", "ckpt-rescan-button", icon="refresh")
        rescan.layout.flex = "0 0 auto"
        rescan.on_click(guarded(self.refresh, self.notice, clear=True))
        # The re-scan's progress bar is drawn here (tqdm.auto writes into the Output widget).
        self.progress = w.Output().add_class("ckpt-progress")
        top = w.HBox(
            [self.header, rescan],
            layout=w.Layout(justify_content="space-between", align_items="center", width="100%"),
        )
        from .autosize import Autosize

        # Eleven tabs do not fit JupyterLab's fixed tab width: each tab takes its title's
        # width and the bar wraps, so no title is cut to an ellipsis.
        tab_style = w.HTML(
            # As specific as ipywidgets' own rule for the tab width, and later.
            "<style>.ckpt-dashboard .jupyter-widgets.widget-tab.ckpt-tabs > .lm-TabBar"
            " .lm-TabBar-content{flex-wrap:wrap}"
            ".ckpt-dashboard .jupyter-widgets.widget-tab.ckpt-tabs > .lm-TabBar"
            " .lm-TabBar-tab{flex:0 0 auto;min-width:fit-content}</style>",
            layout=w.Layout(display="none"),
        )
        self.widget = w.VBox(
            [top, self.notice, self.progress, tab_style, self.tab, Autosize(), GridCells()],
            layout=w.Layout(width="100%"),
        ).add_class("ckpt-dashboard")
        self._snapshot = None
        if snapshot:
            from .snapshot import Snapshot

            self._snapshot = Snapshot()
        # Panels are built by the background worker ahead of a click, by a thread a click
        # starts, or by a caller of `panel`; `_pending` holds one future per panel, claimed
        # under the lock by whoever builds it first, so none is built twice and nobody holds
        # the lock while building. The load verdict is published under its own lock.
        self._lock = threading.RLock()
        self._state_lock = threading.Lock()
        self._pending: dict[str, Future[Any]] = {}
        self._generation = 0
        # Work a person asked for that is under way (see `_asked`).
        self._asked_count = 0
        self._asked_done = threading.Condition()
        self.worker: threading.Thread | None = None
        self.verdict_worker: threading.Thread | None = None
        # Set once the Overview's messages are sent (`_ipython_display_`); until then the load
        # check waits (see `_start_verdict`). Outside a kernel nothing is sent: it is set.
        self._overview_sent = threading.Event()
        if getattr(_shell(), "kernel", None) is None:
            self._overview_sent.set()
        self._draw()
        if model:
            self._start_verdict()

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
        """Show `state` instead of the current one: every panel is rebuilt (the open one
        now, the others when next selected)."""
        for panel in self.panels.values():
            close = getattr(panel, "close", None)
            if close is not None:
                close()
        with self._lock, self._state_lock:
            self.panels.clear()
            self._pending.clear()
            self._generation += 1
            self.current = state
            if self._complete.done():
                self._complete = Future()
            self._complete.set_result(state)
        self._draw()
        if self._snapshot is not None:
            self._snapshot.update(self.state)
            if self._headless:
                generation = self._generation
                self._snapshot.render_figures(state, current=lambda: generation == self._generation)
                return
        self._start_worker()

    def _start_verdict(self) -> None:
        """Get the load verdict from a thread, then check with it and redraw what shows
        the plain checks' state (header, Overview, snapshot).

        For a local folder the verdict is computed by a child process
        (`inspector._internal.load.child`): its imports of transformers and torch and the
        model build (10 s of CPU at 300,000 tensors) used to hold this kernel's GIL, so a
        tab clicked meanwhile answered late; the thread only waits for the child's answer.
        A remote checkpoint's verdict is computed in the thread; a verdict kept in the user's
        cache is read there, and no child is started. Either way the thread waits
        until the Overview's messages are sent (`_overview_sent`, at most `_VERDICT_HOLD`
        seconds): work that holds the GIL as the Overview is displayed starves the kernel's
        IOPub thread, which sends the Overview's widgets to the page (measured at 300,000
        tensors: 20 ms of the snapshot's work took 0.2-0.5 s). The child starts then too:
        started with the scan, its imports slowed the scan and the page on the 2 shared cores
        (measured side by side at 300,000 tensors: Overview 5.50-6.31 s against 6.35-7.28 s,
        for a verdict 2-3 s later)."""
        generation, plain = self._generation, self.current

        def work() -> None:
            self._overview_sent.wait(_VERDICT_HOLD)
            try:
                verdict = verdict_apart(
                    plain.scanned, trust_remote_code=self.trust_remote_code, cache=self.cache
                )
                state = CheckpointState.checked(plain.scanned, verdict, values=self.values)
            except BaseException as exc:  # a bug: `state` raises it where it is asked for
                with self._state_lock:
                    if generation == self._generation:
                        self._complete.set_exception(exc)
                raise
            with self._state_lock:
                if generation != self._generation:
                    return  # a refresh replaced the state meanwhile
                self.current = state
                self._complete.set_result(state)
            # What shows `current` is redrawn: the Overview; the Files and Layers tabs update
            # their findings counts themselves (see `on_verdict`); the rest waited for it.
            with self._lock:
                if generation != self._generation:
                    return
                self._draw_header()
                self.panels.pop("Overview", None)
                self._pending.pop("Overview", None)
            self.panel("Overview")
            if self._snapshot is not None:
                self._snapshot.update(state)

        self.verdict_worker = _thread(work, "ckpt-load-verdict")
        self.verdict_worker.start()

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
        try:
            panel = self._builders[title]()
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
        if not current and hasattr(panel, "close"):
            panel.close()
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
                box.children = [_loading(self, title)]

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

        _thread(build, f"ckpt-build-{title}").start()

    def when_checked(self, callback: Callable[[CheckpointState], object]) -> None:
        """Call `callback(state)` when the load check's findings arrive, for a panel drawn
        from the plain checks' state; nothing when they are in already (or the check is off),
        nor for a state a re-scan replaced meanwhile."""
        if not self.current.pending:
            return
        generation, complete = self._generation, self._complete

        def done(future: Future[CheckpointState]) -> None:
            if future.exception() is None and generation == self._generation:
                guarded(lambda: callback(future.result()), self.notice)()

        complete.add_done_callback(done)

    def wait(self, timeout: float | None = None) -> None:
        """Until the load check is done and the background worker has built every tab and
        rendered the snapshot's figures (scripts and tests; a person never needs to)."""
        self._overview_sent.set()
        self._complete.exception(timeout)
        if self.verdict_worker is not None:
            self.verdict_worker.join(timeout)  # it redraws the Overview after publishing
        if self.worker is not None:
            self.worker.join(timeout)

    def _start_worker(self) -> None:
        """After the Overview is on screen: import what the other tabs need at once, build
        them ahead of the first click, then render the snapshot's figures."""
        generation = self._generation
        started = time.monotonic()

        def work() -> None:
            # Importing Perspective's and plotly's widgets takes a second or more, in the
            # kernel only once. Started now, they are done before most first clicks.
            self._yield_to_asked()
            import perspective.widget  # noqa: F401

            self._yield_to_asked()
            import_figure_widget()

            # The delay lets the Overview's widgets reach the page and paint before the
            # worker's widgets compete with them for the page.
            time.sleep(max(0.0, _WORKER_DELAY - (time.monotonic() - started)))
            for title in self.PREBUILT:
                self._yield_to_asked()
                if generation != self._generation:
                    return
                self.panel(title)
            state = self.state  # with the load verdict: these tabs list its findings too
            for title in self.PREBUILT_WITH_VERDICT:
                self._yield_to_asked()
                if generation != self._generation:
                    return
                self.panel(title)
            self._yield_to_asked()
            if self._snapshot is not None:
                self._snapshot.render_figures(state, current=lambda: generation == self._generation)

        self.worker = _thread(work, "ckpt-prebuild")
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

    def _draw(self) -> None:
        self._draw_header()
        # Every tab holds its spinner until its panel is built: a click shows it at once,
        # from the page alone, however busy the kernel is.
        for title, box in zip(self.TABS, self.tab.children, strict=True):
            box.children = [_loading(self, title)]
        self._shown(self.TABS[self.tab.selected_index or 0])

    def _draw_header(self) -> None:
        s, problems = self.current.scanned, self.current.problems
        counts = severity_tally(problems)
        verdict = (
            f"{plural(len(problems), ISSUE)} ({severity_counts(counts)})"
            if problems
            else "<span style='color:#2ca02c'>no issues</span>"
        )
        if self.current.pending:
            verdict += " <i style='color:#666'>(checking whether it loads...)</i>"
        self.header.value = (
            f"<div style='overflow-wrap:anywhere'><b>{_esc(s.path.name)}</b> &nbsp; "
            f"<code>{_esc(s.path)}</code> &nbsp; layout <b>{_esc(s.layout)}</b> &nbsp; "
            f"{verdict}</div>"
        )
        titles = list(self.TABS)
        # Short enough for the tab (JupyterLab cuts titles past ~16 characters); while the
        # load check runs, the count may still grow: "...".
        more = "..." if self.current.pending else ""
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
                render = _thread(
                    lambda: _resolve(rendered, lambda: snapshot.render_now(plain)), "ckpt-png"
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


# -- read-only tabs ---------------------------------------------------------------------------


class OverviewPanel:
    """Issues first (what is wrong, its impact, what fixes it, with buttons that fix it or
    show it), then whether the model code would load the checkpoint, then its facts. Drawn
    from `dash.current`: while the load check runs it says so, and is redrawn when done."""

    def __init__(self, dash: Dashboard) -> None:
        state = dash.current
        problems = state.problems
        findings = plural(len(state.findings), FINDING)
        if problems:
            head = (
                f"<h3 style='margin:4px 0'>{plural(len(problems), ISSUE)} "
                f"<span style='font-weight:normal;color:#666'>({findings})</span></h3>"
            )
        else:
            head = (
                "<h3 style='margin:4px 0;color:#2ca02c'>No issues found</h3>"
                f"<div style='color:#666'>{findings}</div>"
            )
        cards = [_problem_card(dash, p) for p in problems]
        actions = []
        if any(p.action.kind in ("repair", "reshard") for p in problems):
            fix_all = button("Repair all", "ckpt-repair-all", style="warning", icon="wrench")
            fix_all.on_click(guarded(lambda: dash.repair(("all",)), dash.notice))
            actions.append(fix_all)
        self.widget = w.VBox(
            [
                w.HTML(head).add_class("ckpt-overview-verdict"),
                w.HBox(actions),
                _load_box(dash, state),
                *cards,
                w.HTML(facts_html(state.scanned, state.findings)).add_class("ckpt-facts"),
            ],
            layout=w.Layout(width="100%"),
        ).add_class("ckpt-overview")


def _load_box(dash: Dashboard, state: CheckpointState) -> w.VBox:
    """ "Will it load?": the verdict in words, and a button per kind of key that shows the
    stored tensors behind it (the findings, for missing ones: no tensor holds them)."""
    if state.pending:
        text = (
            "<div class='ckpt-load' data-loads='pending' style='border-left:4px solid #7f7f7f;"
            "padding:4px 10px;margin:6px 0'><b>Will it load?</b> <i>checking: building the "
            "model config.json describes (no weights) and matching it with the stored "
            "tensors...</i></div>"
        )
        return w.VBox([w.HTML(text)]).add_class("ckpt-load-verdict")
    v = state.verdict
    buttons: list[w.Button] = []
    if v is not None and v.ran:
        if v.missing:
            missing = button(f"Missing ({len(v.missing):,})", "ckpt-load-missing", icon="list")
            missing.on_click(
                guarded(lambda: dash.show_findings(("load-missing-tensor",)), dash.notice)
            )
            buttons.append(missing)
        kinds = (
            ("Another shape", "ckpt-load-mismatched", [m.key for m in v.mismatched]),
            ("Unexpected", "ckpt-load-unexpected", list(v.unexpected)),
        )
        for label, css, keys in kinds:
            if keys:
                names = tuple(dict.fromkeys(n for k in keys for n in v.sources.get(k, (k,))))
                buttons.append(_tensors_button(dash, f"{label} ({len(keys):,})", css, names))
        if v.mtp_skipped:
            label = f"MTP skipped ({len(v.mtp_skipped):,})"
            buttons.append(_tensors_button(dash, label, "ckpt-load-mtp", v.mtp_skipped))
    box = w.VBox(
        [w.HTML(load_verdict_html(v)), w.HBox(buttons, layout=w.Layout(flex_flow="row wrap"))],
        layout=w.Layout(width="100%"),
    )
    return box.add_class("ckpt-load-verdict")


def _tensors_button(dash: Dashboard, label: str, css: str, names: Sequence[str]) -> w.Button:
    show = button(label, css, icon="table")
    query = TensorQuery(names=tuple(names))
    show.on_click(guarded(lambda: dash.show_tensors(query), dash.notice))
    return show


def _problem_card(dash: Dashboard, problem: Problem) -> w.VBox:
    """A problem: its text, a button per way to act on it, and its first findings as links."""
    buttons: list[w.Button] = []
    action = problem.action
    if action.kind == "repair":
        fix = button(
            f"Repair: {', '.join(action.parts)}",
            "ckpt-problem-repair",
            style="warning",
            icon="wrench",
        )
        fix.on_click(guarded(lambda: dash.repair(action.parts), dash.notice))
        buttons.append(fix)
    elif action.kind == "restore" and " --from " in action.command:
        found = restore_reference(dash.scanned)
        back = button("Restore from...", "ckpt-problem-restore", style="warning", icon="download")
        back.on_click(
            guarded(lambda: dash.restore(found.path if found is not None else ""), dash.notice)
        )
        buttons.append(back)
    elif action.kind == "reshard":
        split = button("Repair: reshard", "ckpt-problem-reshard", style="warning", icon="wrench")
        split.on_click(guarded(lambda: dash.repair(("all",)), dash.notice))
        buttons.append(split)
    elif action.kind == "consolidate":
        go = button("Consolidate...", "ckpt-problem-consolidate", icon="compress")
        go.on_click(guarded(lambda: dash.select("Consolidate"), dash.notice))
        buttons.append(go)
    if problem.tensors:
        names = problem.tensors
        show = button(f"Tensors ({len(names):,})", "ckpt-problem-tensors", icon="table")
        show.on_click(guarded(lambda: dash.show_tensors(TensorQuery(names=names)), dash.notice))
        buttons.append(show)
    if problem.cells and len(dash.scanned.experts):
        layer, expert = problem.cells[0]
        cell = button("On the heatmap", "ckpt-problem-heatmap", icon="th")
        cell.on_click(guarded(lambda: dash.show_cell(layer, expert), dash.notice))
        buttons.append(cell)
    codes = problem.codes
    listing = button(f"Findings ({len(problem.findings):,})", "ckpt-problem-findings", icon="list")
    listing.on_click(guarded(lambda: dash.show_findings(codes), dash.notice))
    buttons.append(listing)
    rows = [_finding_row(dash, f) for f in _examples(problem.findings, _FINDINGS_PER_PROBLEM)]
    box = w.VBox(
        [
            w.HTML(problem_html(problem)),
            w.HBox(buttons, layout=w.Layout(flex_flow="row wrap")),
            *rows,
        ],
        layout=w.Layout(
            border="1px solid #e3e3e3", padding="6px 10px", margin="4px 0", width="100%"
        ),
    ).add_class("ckpt-problem")
    box.add_class(f"ckpt-problem-{problem.key}")
    return box


def _worst_layer(findings: Sequence[Finding], layers: Sequence[int]) -> int:
    """The layer the Experts tab opens on: the first of `layers` with the worst finding
    about it (an `expert-missing` error in layer 40 beats an info note in layer 3), else
    the first layer."""
    candidates = [
        (severity_rank(f.severity), f.layer)
        for f in findings
        if f.layer is not None and f.layer in layers
    ]
    return min(candidates)[1] if candidates else layers[0]


def _examples(findings: Sequence[Finding], n: int) -> list[Finding]:
    """The first `n` findings that name one thing (folded summaries last)."""
    named = [f for f in findings if f.tensor or f.layer is not None]
    rest = [f for f in findings if not (f.tensor or f.layer is not None)]
    return (named + rest)[:n]


def _finding_row(dash: Dashboard, finding: Finding, *, detail: bool = False) -> w.HBox:
    """One finding: its code and message (with `detail`: severity, file and tensor too), and
    a link to what it is about."""
    target = (
        "tensor"
        if finding.tensor
        else "heatmap"
        if finding.layer is not None and len(dash.scanned.experts)
        else "file"
        if finding.file
        else "findings"
    )
    link = button(f"show {target}", "ckpt-finding-link", icon="arrow-right")
    link.layout.flex = "0 0 auto"
    link.on_click(guarded(lambda: dash.follow(finding), dash.notice))
    where = ""
    if detail:
        places = [p for p in (finding.file, finding.tensor) if p]
        where = "".join(
            f"<br><code style='overflow-wrap:anywhere'>{_esc(p)}</code>" for p in places
        )
    badge = severity_badge(finding.severity) + " " if detail else ""
    text = w.HTML(
        f"<div style='font-size:12px;line-height:1.4'>{badge}<code>{_esc(finding.code)}</code> "
        f"{markup_html(_short(finding.message))}{where}</div>",
        layout=w.Layout(flex="1 1 auto", min_width="0"),
    )
    row = w.HBox(
        [text, link],
        layout=w.Layout(align_items="center", width="100%", border_bottom="1px solid #eee"),
    )
    return row.add_class("ckpt-finding").add_class(f"ckpt-code-{finding.code}")


class _FiguresAndGrid:
    """A tab of figures (`figures`, a FigureBox) above a grid (`table`, a FrameGrid): both
    drawn when the tab is first shown, the grid closed with the tab."""

    figures: FigureBox
    table: FrameGrid

    def on_shown(self) -> None:
        self.figures.show()
        self.table.show_grid()

    def close(self) -> None:
        self.table.close()


class FilesPanel(_FiguresAndGrid):
    """Shard-size distribution with outliers, then every file in a sortable, filterable grid:
    sizes, what it stores, and how many findings name it (`findings_per_file`: the counts
    agree with the findings; recounted when the load check's findings arrive)."""

    def __init__(self, dash: Dashboard) -> None:
        from .figures import (
            expected_small,
            shard_size_distribution,
            shard_size_outliers,
        )

        self.dash = dash
        files = dash.scanned.files
        self.figures = FigureBox([(shard_size_distribution(files), "ckpt-shard-sizes")])
        self.outliers = (
            shard_size_outliers(files["size"].fillna(0), small_ok=expected_small(files))
            if len(files)
            else pd.Series(False, index=files.index)
        )
        self.table = FrameGrid(
            self.frame(dash.current),
            title="files",
            css_class="ckpt-files-table",
            text="file",
            flags={
                "with findings": ["findings", ">", 0],
                "size outliers": ["outlier", "==", "yes"],
            },
            sort=[["findings", "desc"], ["outlier", "desc"], ["file", "asc"]],
            what="files",
            cells=False,
        )
        self.widget = w.VBox([self.figures.box, self.table.widget], layout=w.Layout(width="100%"))
        dash.when_checked(lambda state: self.table.replace(self.frame(state)))

    def frame(self, state: CheckpointState) -> pd.DataFrame:
        """The files table as the grid shows it, with the findings of `state` counted."""
        f = state.scanned.files
        counts = findings_per_file(state.findings, f["file"].astype(str))
        return pd.DataFrame(
            {
                "file": legible_each(f["file"].astype(str).tolist()),
                "findings": f["file"].astype(str).map(counts).fillna(0).astype("int64"),
                "size": f["size"].astype("Int64"),
                "outlier": yes_no(self.outliers),
                "tensors": f["tensors"].astype("int64"),
                "data size": f["tensor_bytes"].astype("int64"),
                "header size": f["header_bytes"].astype("Int64"),
                "first layer": f["first_layer"].astype("Int64"),
                "last layer": f["last_layer"].astype("Int64"),
                "layers": f["layers"].astype("int64"),
                "readable": yes_no(f["readable"]),
            }
        ).reset_index(drop=True)


class LayersPanel(_FiguresAndGrid):
    """Bytes per layer by dtype, parameters per layer by kind, then every layer in a sortable,
    filterable grid with its findings counted (recounted when the load check's arrive)."""

    def __init__(self, dash: Dashboard) -> None:
        from .figures import bytes_per_layer, parameters_per_layer

        s = dash.scanned
        self.table = FrameGrid(
            self.frame(dash.current),
            title="layers",
            css_class="ckpt-layers-table",
            text="dtypes",
            choices=("kind", "MTP"),
            flags={"with findings": ["findings", ">", 0]},
            sort=[["layer", "asc"]],
            what="layers",
            cells=False,
        )
        self.figures = FigureBox(
            [
                (bytes_per_layer(s.tensors), "ckpt-bytes-per-layer"),
                (parameters_per_layer(s.layers), "ckpt-params-per-layer"),
            ]
        )
        self.widget = w.VBox([self.figures.box, self.table.widget], layout=w.Layout(width="100%"))
        dash.when_checked(lambda state: self.table.replace(self.frame(state)))

    @staticmethod
    def frame(state: CheckpointState) -> pd.DataFrame:
        """The layers table as the grid shows it, with the findings about each layer."""
        layers = state.scanned.layers
        counts = state.frame["layer"].dropna().astype("int64").value_counts()
        text = {c: layers[c].astype(str).to_numpy(dtype=object) for c in ("kind", "dtypes")}
        return pd.DataFrame(
            {
                "layer": layers["layer"].astype("int64"),
                "kind": text["kind"],
                "MTP": yes_no(layers["is_mtp"]),
                "findings": layers["layer"].map(counts).fillna(0).astype("int64"),
                "tensors": layers["tensors"].astype("int64"),
                "size": layers["bytes"].astype("int64"),
                "parameters": layers["parameters"].astype("int64"),
                "experts found": layers["experts_found"].astype("int64"),
                "experts expected": layers["experts_expected"].astype("int64"),
                "experts per": layers["experts_source"].astype(str).to_numpy(dtype=object),
                "dtypes": text["dtypes"],
            }
        ).reset_index(drop=True)


class ExpertsPanel:
    """Layer x expert coverage heatmap over the whole model; below it one layer zoomed in (a
    cell per expert, labelled with its id). Clicking either, or the layer / expert picker,
    lists that expert's tensors and findings. The figure widgets are made when the tab is
    first shown (`on_shown`; `figure` is None until then)."""

    def __init__(self, dash: Dashboard) -> None:
        from .figures import expert_coverage_heatmap

        self.dash = dash
        s = dash.scanned
        self.heatmap = FigureBox(
            [(expert_coverage_heatmap(s.experts, tensors=s.tensors), "ckpt-expert-heatmap")]
        )
        self.figure: Any = None
        self._shown = threading.Lock()
        layers = sorted({int(v) for v in s.experts["layer"].dropna()}) if len(s.experts) else []
        self.layer = w.Dropdown(options=layers, description="layer").add_class("ckpt-layer-pick")
        top = int(s.experts["expert"].max()) if len(s.experts) else 0
        self.expert = w.BoundedIntText(min=0, max=max(top, 0), description="expert")
        self.expert.add_class("ckpt-expert-pick")
        show = w.Button(description="Show tensors").add_class("ckpt-show-expert")
        show.on_click(
            guarded(lambda: self.show(self.layer.value, self.expert.value), self.dash.notice)
        )
        self.zoom = w.VBox(layout=w.Layout(width="100%")).add_class("ckpt-expert-zoom")
        self.zoomed: int | None = None
        self.details = w.HTML().add_class("ckpt-expert-details")
        picker = w.HBox([self.layer, self.expert, show])
        self.widget = w.VBox(
            [self.heatmap.box, picker, self.zoom, self.details], layout=w.Layout(width="100%")
        )
        self.opening: int | None = None
        if layers:
            self.layer.value = self.opening = _worst_layer(dash.current.findings, layers)

    def on_shown(self) -> None:
        """Make the heatmap (clicks on it show an expert) and the zoom into the opening layer
        (once)."""
        with self._shown:
            if self.figure is not None:
                return
            (figure,) = self.heatmap.show()
            if figure.data:
                figure.data[0].on_click(
                    lambda *args: guarded(lambda: self._on_click(*args), self.dash.notice)()
                )
            self.figure = figure
            if self.opening is not None and self.zoomed is None:
                self._zoom_into(self.opening)

    def show(self, layer: int | None, expert: int | None) -> None:
        """Zoom into `layer`, point the pickers at (layer, expert), and list that expert's
        tensors and findings (or, without an expert, the layer's findings)."""
        if layer is None:
            self.details.value = "<i>No MoE layer in this checkpoint.</i>"
            return
        if layer in self.layer.options:
            self.layer.value = layer
        if expert is not None:
            self.expert.value = min(max(expert, self.expert.min), self.expert.max)
        self._zoom_into(layer)
        s, frame = self.dash.scanned, self.dash.current.frame
        same_layer = (frame["layer"] == layer).fillna(False)
        # The one layer numbering (MTP layers after the decoder's, said "MTP layer").
        name = layer_name(layer, mtp=layer in set(s.layers.loc[s.layers["is_mtp"], "layer"]))
        if expert is None:
            notes = frame[same_layer]
            self.details.value = f"<h4>{name}</h4>" + (
                findings_html(notes, max_rows=50) if len(notes) else "<i>No findings.</i>"
            )
            return
        t = s.tensors
        mine = t[(t["layer"] == layer) & (t["expert"] == expert)]
        row = s.experts[(s.experts["layer"] == layer) & (s.experts["expert"] == expert)]
        # Findings about this expert, and about its whole layer (e.g. "experts 64-511 missing").
        mine_or_all = (frame["expert"] == expert).fillna(False) | frame["expert"].isna()
        notes = frame[same_layer & mine_or_all]
        self.details.value = (
            f"<h4>{name}, expert {expert}</h4>"
            + frame_html(row, max_rows=1, title="coverage")
            + frame_html(mine, columns=_TENSOR_COLUMNS, max_rows=200, title="tensors")
            + (findings_html(notes, max_rows=50) if len(notes) else "")
        )

    def _zoom_into(self, layer: int) -> None:
        from .figures import expert_layer_grid

        if layer == self.zoomed:
            return
        s = self.dash.scanned
        grid = figure_widget(
            expert_layer_grid(s.experts, layer, tensors=s.tensors), "ckpt-expert-layer"
        )
        if grid.data:
            grid.data[0].on_click(
                lambda *args: guarded(lambda: self._on_zoom_click(*args), self.dash.notice)()
            )
        self.zoom.children = [grid]
        self.zoomed = layer

    def _on_click(self, trace: Any, points: Any, _state: Any) -> None:
        # Cell heatmaps have expert numbers on x; binned ones a label "first-last".
        if not points.xs:
            return
        layer = int(points.ys[0])
        x = points.xs[0]
        expert = int(str(x).split("-")[0]) if isinstance(x, str) else int(x)
        if self._recorded(layer, expert):
            self.show(layer, expert)

    def _on_zoom_click(self, trace: Any, points: Any, _state: Any) -> None:
        # Rows are labelled "first-last" expert; columns are the offset within the row. The
        # last row's cells past the layer's last expert are empty: a click there is no expert.
        if not points.xs or self.zoomed is None:
            return
        first = int(str(points.ys[0]).split("-")[0])
        expert = first + int(points.xs[0])
        if self._recorded(self.zoomed, expert):
            self.show(self.zoomed, expert)

    def _recorded(self, layer: int, expert: int) -> bool:
        """True when the scan knows expert `expert` of `layer` (found or missing): a figure's
        empty cell is not one."""
        e = self.dash.scanned.experts
        return bool(((e["layer"] == layer) & (e["expert"] == expert)).any())


class FindingsPanel:
    """The findings, filterable by severity and code, a page at a time; every finding links
    to its tensor, heatmap cell or file, and every shown code is explained."""

    def __init__(self, dash: Dashboard) -> None:
        self.dash = dash
        self.findings = dash.state.findings
        self.frame = dash.state.frame
        codes = self.frame["code"].astype(str).value_counts()
        self.severity = w.ToggleButtons(
            options=[_ALL, "error", "warning", "info"], description="severity"
        ).add_class("ckpt-severity-filter")
        self.code = w.Dropdown(
            options=[(_ALL, _ALL)] + [(f"{c} ({n})", c) for c, n in sorted(codes.items())],
            description="code",
        ).add_class("ckpt-code-filter")
        self.rows = w.VBox(layout=w.Layout(width="100%")).add_class("ckpt-findings-table")
        self.help = w.HTML().add_class("ckpt-code-help")
        self.prev = button("Previous", "ckpt-page-prev", icon="chevron-left")
        self.next = button("Next", "ckpt-page-next", icon="chevron-right")
        self.where = w.HTML()
        self.start = 0
        self.prev.on_click(guarded(lambda: self.render(self.start - _PAGE), self.dash.notice))
        self.next.on_click(guarded(lambda: self.render(self.start + _PAGE), self.dash.notice))
        self.codes: tuple[str, ...] = ()
        for control in (self.severity, self.code):
            control.observe(guarded(lambda: self.render(0), dash.notice), names="value")
        self.render(0)
        self.widget = w.VBox(
            [
                w.HBox([self.severity, self.code], layout=w.Layout(flex_flow="row wrap")),
                self.rows,
                w.HBox([self.prev, self.next, self.where], layout=w.Layout(align_items="center")),
                self.help,
            ],
            layout=w.Layout(width="100%"),
        )

    def show_codes(self, codes: Sequence[str]) -> None:
        """Show only the findings of `codes` (one code also sets the code filter)."""
        self.codes = tuple(codes)
        self.severity.value = _ALL
        self.code.value = codes[0] if len(codes) == 1 else _ALL
        self.render(0)

    def shown(self) -> list[int]:
        """Positions (in `findings`, worst first) of the findings the filters let through."""
        out = []
        for i, f in enumerate(self.findings):
            if self.severity.value != _ALL and str(f.severity) != self.severity.value:
                continue
            if self.code.value != _ALL and f.code != self.code.value:
                continue
            if self.codes and self.code.value == _ALL and f.code not in self.codes:
                continue
            out.append(i)
        return out

    def render(self, start: int = 0) -> None:
        """Redraw the page of findings that begins at `start` for the current filters."""
        shown = self.shown()
        last = max(0, (len(shown) - 1) // _PAGE * _PAGE)
        self.start = min(max(0, start), last)
        page = shown[self.start : self.start + _PAGE]
        self.rows.children = [
            _finding_row(self.dash, self.findings[i], detail=True) for i in page
        ] or [w.HTML("<i>No findings.</i>")]
        end = self.start + len(page)
        self.where.value = f"findings {self.start + 1 if page else 0:,}-{end:,} of {len(shown):,}"
        self.prev.disabled = self.start == 0
        self.next.disabled = end >= len(shown)
        codes = sorted({self.findings[i].code for i in shown})
        self.help.value = code_help_html(codes)


# -- helpers ----------------------------------------------------------------------------------


def _values_read(
    source: str | os.PathLike[str] | ScannedCheckpoint,
) -> Literal["sample", "full"] | None:
    """The values mode a check already read for a scan passed in (`check(scanned,
    values=...)` before the dashboard), so that their findings show with the others."""
    if not isinstance(source, ScannedCheckpoint):
        return None
    table = computed_value_table(source)
    if table is None or not len(table):
        return None
    return "full" if (table["mode"] == "full").any() else "sample"


def _load_with_progress(
    source: str | os.PathLike[str] | ScannedCheckpoint,
    *,
    progress: bool,
    pending: bool,
    values: Literal["sample", "full"] | None = None,
) -> CheckpointState:
    """The state of the plain checks (the load verdict `pending`, or off); in a notebook,
    with progress bars in the cell while the scan and the checks run. The bars are drawn
    into an Output widget whose place in the cell is emptied afterwards, so the saved
    notebook keeps no dead progress widgets."""

    def load(progress: bool) -> CheckpointState:
        state = CheckpointState.load(source, progress=progress, model=False, values=values)
        return replace(state, pending=pending)

    kernel = getattr(_shell(), "kernel", None)
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


def _shell() -> Any:
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    return get_ipython()


def _iopub_sent(timeout: float = 10.0) -> None:
    """Wait until the kernel's IOPub thread has sent every message queued so far (it sends
    them in order; nothing to wait for outside a kernel)."""
    kernel = getattr(_shell(), "kernel", None)
    schedule = getattr(getattr(kernel, "iopub_thread", None), "schedule", None)
    if schedule is None:
        return
    sent = threading.Event()
    schedule(sent.set)
    sent.wait(timeout)


def _thread(target: Callable[[], None], name: str) -> threading.Thread:
    """A daemon thread whose widget messages keep the parent of the message that started it
    (the cell, or the click). Without its own context a thread's messages take the parent of
    whatever message the kernel handles at the moment (ipykernel's shell context); when that
    handler draws progress bars into an `Output` (`captured`: a consolidation, a refresh,
    the next dashboard's scan), the page's Output swallows every message with that parent,
    so a grid or figure the thread created or updated meanwhile never appeared."""
    return threading.Thread(target=copy_context().run, args=(target,), name=name, daemon=True)


def _resolve(future: Future[Any], work: Callable[[], Any]) -> None:
    """Resolve `future` with `work()`, or with the exception it raised."""
    try:
        future.set_result(work())
    except BaseException as exc:
        future.set_exception(exc)


def _on_shown(panel: Any) -> Any:
    """Tell a panel that draws on being shown (a grid, a figure, the repair plan) that its tab
    is shown."""
    shown = getattr(panel, "on_shown", None)
    if shown is not None:
        shown()
    return panel


def _loading(dash: Dashboard, title: str) -> w.HTML:
    """What a tab shows while it is built: a spinner and what is being built."""
    s = dash.current.scanned
    what = {
        "Tensors": f"the table of {len(s.tensors):,} tensors",
        "Files": f"the table of {len(s.files):,} files",
        "Layers": f"the table of {len(s.layers):,} layers",
        "Experts": "the expert heatmap",
        "Serve": "the parallel plans",
    }.get(title, "this tab")
    waits = title in Dashboard.PREBUILT_WITH_VERDICT and dash.current.pending
    note = " (it lists the load check's findings: waiting for the load check)" if waits else ""
    return w.HTML(
        "<div class='ckpt-tab-loading' style='padding:16px;color:#555'>"
        "<i class='fa fa-spinner fa-spin' style='margin-right:6px'></i>"
        f"Building {html_text(what)}...{html_text(note)}</div>"
    )


def _short(text: str, limit: int = 220) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def _esc(value: object) -> str:
    return html_text(value)
