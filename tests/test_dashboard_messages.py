"""What the dashboard sends the page and does again, counted in-process (issue 35): a widget's
classes and layout go in the state it opens with, a re-scan builds again only the tabs it
must, and the snapshot's figures are not drawn again when they are the same."""

from __future__ import annotations

import collections
import dataclasses
from pathlib import Path

import ipywidgets as w
import pytest
from inspector.widgets import Dashboard

from inspector._internal.common.filenames import SAFETENSORS_WEIGHTS_NAME

DRIFT = "modelopt-1422-sidecar-drift"

# Every dashboard a test makes is closed after it (conftest.py).
pytestmark = pytest.mark.usefixtures("dashboards_closed")


@pytest.fixture
def updates(monkeypatch: pytest.MonkeyPatch) -> collections.Counter[tuple[str, str]]:
    """(widget class, trait) of every update sent to the page from now on: ipywidgets sends
    one message per `send_state` of a widget already open."""
    seen: collections.Counter[tuple[str, str]] = collections.Counter()
    send = w.Widget.send_state

    def counting(self: w.Widget, key: str | None = None) -> None:
        if key is not None:
            seen[(type(self).__name__, str(key))] += 1
        send(self, key)

    monkeypatch.setattr(w.Widget, "send_state", counting)
    return seen


def test_rows_and_buttons_open_with_their_classes_and_widths(demo_checkpoints: Path, updates):
    """The Overview's issue cards and the Findings tab: a row per finding, a button per link.
    Each button sent its class, width and min_width after it opened, each row its two classes
    and its link's flex: 382 updates per build of every tab, 114 now; and 726 widgets opened,
    576 now that the rows share their layouts and styles."""
    dash = Dashboard(demo_checkpoints / DRIFT, progress=False, snapshot=False, model=False)
    findings = dash.panel("Findings")
    rows = _rows(findings.widget)
    assert rows, "the Findings tab lists its findings"
    link = rows[0].children[-1]
    assert "ckpt-finding-link" in link._dom_classes and link.layout.flex == "0 0 auto"
    assert (link.layout.width, link.layout.min_width) == ("auto", "max-content")
    # Every row's layouts and styles are the kernel's shared ones: three models a row, not 8.
    first, second = rows[0], rows[1]
    assert first.layout is second.layout and first.children[0].style is second.children[0].style
    assert first.children[-1].layout is second.children[-1].layout is link.layout
    assert not set(updates) & {
        ("HBox", "_dom_classes"),
        ("Layout", "width"),
        ("Layout", "min_width"),
        ("Layout", "flex"),
    }, updates


def test_a_rescan_builds_again_the_open_tab_and_the_tensors_tab_only(demo_checkpoints: Path):
    """After a re-scan the worker built all six tabs again, sending the page their widgets
    for tabs nobody may open again; now the open tab and `REBUILT`, the others when
    selected (still built then)."""
    dash = Dashboard(demo_checkpoints / DRIFT, progress=False, snapshot=False, model=False)
    dash.select("Files")
    dash.worker_delay = 0  # nothing is clicked after the re-scan: no page to give way to
    dash.refresh()
    dash.wait(60)
    assert set(dash.panels) == {"Files", *Dashboard.REBUILT}
    findings = dash.select("Findings")
    assert dash.panels["Findings"] is findings and _rows(findings.widget)


def _rows(widget: w.Widget) -> list[w.Widget]:
    """The finding rows inside a widget tree."""
    found, stack = [], [widget]
    while stack:
        node = stack.pop()
        if "ckpt-finding" in getattr(node, "_dom_classes", ()):
            found.append(node)
        stack.extend(getattr(node, "children", ()))
    return found


def test_the_same_snapshot_figures_are_not_drawn_again(demo_checkpoints: Path):
    """A check of the values (same scan) and a re-scan of an unchanged folder make the same
    figures: their PNGs are the last ones, not drawn again by kaleido's browser. A changed
    figure is drawn."""
    from inspector.widgets.snapshot import Snapshot, snapshot_figures
    from inspector.widgets.state import CheckpointState

    drawn: list[int] = []

    def render(figures: list) -> list[bytes]:
        drawn.append(len(figures))
        return [f"png {len(drawn)}".encode() for _ in figures]

    snapshot = Snapshot(render=render)
    state = CheckpointState.load(demo_checkpoints / DRIFT, model=False)
    again = CheckpointState.load(demo_checkpoints / DRIFT, model=False)  # a re-scan
    first = snapshot.render_now(state)
    assert snapshot.render_now(again) == first and len(drawn) == 1
    figures = snapshot_figures(again)
    figures[0][1].update_layout(title="changed")
    assert snapshot._render(figures)[0] != first[0] and len(drawn) == 2


def test_an_unchanged_figure_output_is_not_sent_again(demo_checkpoints: Path, monkeypatch):
    """After a check of the values the snapshot's figure outputs already show the PNGs the
    render hands back: only the snapshot's HTML is sent again, not 3 images of 30-50 kB."""
    from inspector.widgets.snapshot import Snapshot
    from inspector.widgets.state import CheckpointState

    sent: list[dict] = []

    class Handle:
        def update(self, data: dict, raw: bool = True) -> None:
            sent.append(data)

    monkeypatch.setattr("IPython.display.display", lambda data, **_: Handle())
    snapshot = Snapshot(render=lambda figures: [b"png %d" % i for i, _ in enumerate(figures)])
    state = CheckpointState.load(demo_checkpoints / DRIFT, model=False)
    snapshot.show(state)
    snapshot.render_figures(state, current=lambda: True)
    images = [d for d in sent if "image/png" in d]
    assert len(images) == 3 and images[0]["image/png"] == b"png 0"
    sent.clear()
    snapshot.update(state)
    snapshot.render_figures(state, current=lambda: True)
    assert [list(d) for d in sent] == [["text/html"], ["text/html"]], sent


@pytest.fixture
def models(monkeypatch: pytest.MonkeyPatch) -> collections.Counter[str]:
    """Widget models opened and closed from now on ("opened", "closed"), and "open": those
    opened here and not closed since (a model is opened as its widget is made)."""
    seen: collections.Counter[str] = collections.Counter()
    alive: set[int] = set()
    open_, close = w.Widget.open, w.Widget.close

    def opening(self: w.Widget) -> None:
        fresh = self.comm is None
        open_(self)
        if fresh:
            seen["opened"] += 1
            alive.add(id(self))
            seen["open"] = len(alive)

    def closing(self: w.Widget) -> None:
        if self.comm is not None and id(self) in alive:
            seen["closed"] += 1
            alive.discard(id(self))
            seen["open"] = len(alive)
        close(self)

    monkeypatch.setattr(w.Widget, "open", opening)
    monkeypatch.setattr(w.Widget, "close", closing)
    return seen


def test_rescans_leave_no_widget_models_open(demo_checkpoints: Path, models, tmp_path: Path):
    """A re-scan closes every widget of the panels it replaces (a box's `close` closed the box
    alone: a lab session opened 3,823 models and closed 17) and reuses the tabs' spinners:
    the models left open stay the same however many re-scans and pages of findings."""
    dash = Dashboard(demo_checkpoints / DRIFT, progress=False, snapshot=False, model=False)
    dash.worker_delay = 0  # nothing is clicked meanwhile: no page to give way to

    def session() -> int:
        """A re-scan, then the tabs a person opens, a page of findings turned and back."""
        dash.refresh()
        dash.wait(60)
        for title in ("Files", "Findings", "Repair", "Overview"):
            dash.select(title)
        findings = dash.panels["Findings"]
        findings.render(findings.start + 25)
        findings.render(0)
        return models["open"]

    first = session()
    opened = models["opened"]
    assert [session() for _ in range(3)] == [first] * 3, models
    # Each re-scan built its tabs again and closed the old: it now renews them in place.
    assert models["opened"] == opened, models


def test_a_rescan_renews_the_files_tab_in_its_grid_and_figure(demo_checkpoints: Path, models):
    """The Files tab shown, a re-scan: the same panel, its grid and its figure (an unchanged
    folder makes the same figure) show the re-scan, its table's rows replaced; nothing is
    made again for the page (a new grid's viewer took 1-3 s to start)."""
    dash = Dashboard(demo_checkpoints / DRIFT, progress=False, snapshot=False, model=False)
    files = dash.select("Files")
    grid, figures = files.table.grid, list(files.figures.widgets)
    files.table.flags["with findings"].value = True
    assert grid is not None and figures and files.table.config["filter"]
    opened = _rescanned(dash, models)
    assert dash.select("Files") is files and files.scanned is dash.scanned
    assert files.table.grid is grid and files.figures.widgets == figures and grid.comm is not None
    assert files.table.config["filter"] == [] and grid.filter == []  # as a tab built now
    assert files.table.table.size() == len(dash.scanned.files)
    assert models["opened"] == opened, models


def test_the_overview_is_updated_in_place_and_only_for_what_changed(
    demo_checkpoints: Path, models, updates
):
    """The checks publish a state per stage (the deferred rules', the load verdict): the
    Overview was built whole again for each. It is now the same panel, sends nothing for a
    state that changes nothing it shows, and for one that does, its changed parts only."""
    from inspector.widgets.state import CheckpointState

    dash = Dashboard(demo_checkpoints / DRIFT, progress=False, snapshot=False, model=False)
    overview = dash.panel("Overview")
    redrawn, opened, sent = overview.redrawn, models["opened"], updates.total()
    same = CheckpointState.checked(dash.current.scanned, None, values=dash.values)
    overview.update(same)  # what `when_checked` hands it when a stage publishes
    assert dash.panel("Overview") is overview
    assert (overview.redrawn, models["opened"], updates.total()) == (redrawn, opened, sent)
    # A state without one of the issues: its card is closed, the others kept as they were.
    cards = dict(overview.cards)
    gone, *kept = cards
    fewer = dataclasses.replace(same, problems=tuple(kept))
    overview.update(fewer)
    assert overview.redrawn == redrawn + 1 and overview.cards == [(p, cards[p]) for p in kept]
    assert cards[gone].comm is None and models["opened"] == opened
    overview.update(same)  # back: one card made, nothing else
    assert [p for p, _ in overview.cards] == [gone, *kept]
    assert dict(overview.cards)[gone] is not cards[gone] and models["opened"] > opened


def test_a_closed_dashboard_leaves_no_widget_model_open(demo_checkpoints: Path, tmp_path: Path):
    """Every tab built and shown, the values checked, a re-scan (the panels renewed in place),
    then `close`: every widget model the dashboard opened is closed, but the kernel's shared
    layouts and styles (`controls.fixed`), which other dashboards use too."""
    from inspector.widgets import controls
    from ipywidgets.widgets.widget import _instances

    before = set(_instances)
    dash = Dashboard(demo_checkpoints / DRIFT, progress=False, snapshot=False, model=False)
    dash.worker_delay = 0  # nothing is clicked meanwhile: no page to give way to
    for title in Dashboard.TABS:
        dash.select(title)
    dash.check_values("sample")
    dash.refresh()
    dash.wait(60)
    for title in Dashboard.TABS:
        dash.select(title)
    shown = len(set(_instances) - before)
    dash.close()
    shared = {id(part) for part in controls._FIXED.values()}
    left = [
        f"{type(_instances[key]).__name__} {_instances[key].get_state()}"
        for key in set(_instances) - before
        if id(_instances[key]) not in shared
    ]
    assert shown > 100 and left == [], "\n".join(left)


def test_a_rescan_renews_the_experts_tab_in_place(demo_checkpoints: Path, models):
    """The Experts tab shown, a re-scan: the same panel, its pickers and the heatmap (the
    same figure for an unchanged folder, still answering clicks) show the re-scan; only the
    zoom into the opening layer is drawn again (1 figure), the one it replaces closed."""
    dash = Dashboard(demo_checkpoints / DRIFT, progress=False, snapshot=False, model=False)
    experts = dash.select("Experts")
    heatmap, zoom = experts.figure, experts.zoom.children[0]
    experts.show(experts.layer.options[-1], 1)
    assert heatmap is not None and experts.details.value
    opened = _rescanned(dash, models)
    assert dash.select("Experts") is experts and experts.scanned is dash.scanned
    assert experts.figure is heatmap and experts.heatmap.widgets == [heatmap]
    assert experts.details.value == "" and experts.layer.value == experts.opening
    assert experts.zoom.children[0] is not zoom and zoom.comm is None
    assert models["opened"] == opened + 1, models


def _rescanned(dash: Dashboard, models: collections.Counter[str]) -> int:
    """Re-scan `dash` once the Tensors tab (which a re-scan draws again at once: `REBUILT`)
    is built; the models opened before the re-scan."""
    dash.panel("Tensors")
    opened = models["opened"]
    dash.worker_delay = 0  # nothing is clicked after the re-scan: no page to give way to
    dash.refresh()
    dash.wait(60)
    return opened


def test_a_rescan_previews_the_new_rows_in_the_grids_it_keeps(tmp_path: Path):
    """The Tensors and Files grids are kept by a re-scan, their tables' rows replaced; the
    HTML preview a new view of a grid shows until its viewer draws (the page reloaded, the
    notebook's saved state) kept the previous checkpoint's rows: its tensor and file names.
    Here the folder (safetensors' `save_file`) holds another checkpoint at the re-scan."""
    import numpy as np
    from safetensors.numpy import save_file

    folder = tmp_path / "ckpt"
    folder.mkdir()
    one = np.zeros((2, 2), np.float32)
    save_file({"first_checkpoint.<b>x</b>.weight": one}, str(folder / "first.safetensors"))
    dash = Dashboard(folder, progress=False, snapshot=False, model=False)
    dash.worker_delay = 0

    def previews() -> list[str]:
        tensors, files = dash.select("Tensors"), dash.select("Files")
        return [tensors.grid._preview, files.table.grid._preview]

    old = ("first_checkpoint", "first.safetensors")
    before = previews()
    assert [o in p for o, p in zip(old, before, strict=True)] == [True, True], before
    assert "<b>x" not in before[0] and "&lt;b&gt;x" in before[0]
    (folder / "first.safetensors").unlink()
    save_file({"second_checkpoint.weight": one}, str(folder / "second.safetensors"))
    dash.refresh()
    dash.wait(60)
    after = previews()
    assert not any(o in p for o in old for p in after), after
    assert "second_checkpoint" in after[0] and "second.safetensors" in after[1], after


def test_a_rescan_of_a_folder_that_held_no_tensors_renews_the_tensors_tab(tmp_path: Path):
    """A folder whose one shard holds no tensor (safetensors' `save_file({})`, as a download
    in progress may leave it), then a checkpoint: the Tensors tab's table was made with float
    columns where names go (pandas' type for an empty column), and the re-scan's rows could
    not replace them ("Could not fill column `param` with t_dtype: `float64`"): the tab was
    never renewed."""
    import numpy as np
    from safetensors.numpy import save_file

    folder = tmp_path / "ckpt"
    folder.mkdir()
    save_file({}, str(folder / SAFETENSORS_WEIGHTS_NAME))
    dash = Dashboard(folder, progress=False, snapshot=False, model=False)
    dash.worker_delay = 0
    tensors = dash.select("Tensors")
    assert tensors.table.size() == 0
    one = np.zeros((2, 2), np.float32)
    save_file({"a.weight": one, "b.bias": one}, str(folder / SAFETENSORS_WEIGHTS_NAME))
    dash.refresh()
    dash.wait(60)
    assert dash.select("Tensors") is tensors and tensors.scanned is dash.scanned
    assert tensors.table.size() == 2
    assert "a.weight" in tensors.grid._preview
