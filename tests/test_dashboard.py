"""The dashboard driven without a browser: set widget values, click buttons (their on_click
handlers run), feed the heatmap the click message the frontend sends, and check what the core
did on disk. Every test that writes works on a copy of a demo checkpoint."""

from __future__ import annotations

import json
import re
import shutil
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from inspector.widgets import Dashboard as _Dashboard
from inspector.widgets.dashboard import CheckpointState

from inspector._internal.common.filenames import CONFIG_NAME, INDEX_NAME, SAFETENSORS_WEIGHTS_NAME
from inspector._internal.findings.finding import CODE_HELP, CODES, make_finding
from inspector._internal.plans.consolidate import reference_assignment
from inspector._internal.report.html import scanned_html
from inspector._internal.report.query import TensorQuery
from inspector._internal.scan.entry import scan

pytest.importorskip("ipywidgets")

# Every dashboard a test makes is closed after it (conftest.py).
pytestmark = pytest.mark.usefixtures("dashboards_closed")

DRIFT = "modelopt-1422-sidecar-drift"
EP_COLLISION = "modelopt-1631-ep-collision"
DCP_COLLAPSED = "automodel-2289-dcp-mapping-collapsed"


@pytest.fixture(scope="module")
def demos(tmp_path_factory: pytest.TempPathFactory, copy_demos) -> Path:
    target = tmp_path_factory.mktemp("demos")
    copy_demos(target)
    return target


def Dashboard(source, **options):
    """The dashboard without the notebook-only parts (progress bars, the PNG snapshot), once
    its load check is done (it runs in a thread while the Overview shows). A test about a
    tab's widgets, not about the load check or what its verdict adds (findings, issues, the
    repair's re-check), passes `model=False`: no load-check child builds the model for it,
    and the test does not wait for one."""
    dash = _Dashboard(source, progress=False, snapshot=False, **options)
    dash.wait()
    return dash


def _copy(demos: Path, name: str, tmp_path: Path) -> Path:
    return Path(shutil.copytree(demos / name, tmp_path / name))


def _weight_map(folder: Path) -> dict[str, str]:
    return json.loads((folder / INDEX_NAME).read_text())["weight_map"]


def test_every_code_is_explained():
    assert set(CODE_HELP) == set(CODES)
    assert all(len(text) > 20 for text in CODE_HELP.values())


FINDINGS_TAB = _Dashboard.TABS.index("Findings")


def _texts(widget) -> str:
    """Every HTML value and button label inside a widget tree."""
    out = []
    stack = [widget]
    while stack:
        node = stack.pop()
        value = getattr(node, "value", None)
        if isinstance(value, str):
            out.append(value)
        if getattr(node, "description", None):
            out.append(node.description)
        stack.extend(getattr(node, "children", ()))
    return "\n".join(out)


def _until(condition, timeout: float = 30) -> None:
    """Until `condition()` holds (what a thread a tab click started does), at most `timeout`."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "not within the time"
        time.sleep(0.05)


def _buttons(widget, css: str) -> list:
    return [node for node in _widgets(widget) if css in getattr(node, "_dom_classes", ())]


def _widgets(widget) -> list:
    """`widget` and every widget inside it."""
    found, stack = [], [widget]
    while stack:
        node = stack.pop()
        found.append(node)
        stack.extend(getattr(node, "children", ()))
    return found


def test_opens_with_overview_only_and_lists_problems_not_findings(demos: Path, tmp_path: Path):
    dash = Dashboard(_copy(demos, DRIFT, tmp_path))
    assert list(dash.panels) == ["Overview"]  # the other tabs wait for their first selection
    n = len(dash.state.findings)
    assert n == 44 and dash.tab.titles[FINDINGS_TAB] == f"Findings ({n})"
    overview = _texts(dash.panels["Overview"].widget)
    assert "2 issues" in overview and "44 findings" in overview
    assert "42 MTP tensors (17.1 kB) invisible to loaders" in overview
    assert "misses the same 42 MTP tensors" in overview and "listed above" not in overview
    assert "modelopt-per-layer" in overview  # the facts follow the problems
    assert "2 issues (2 errors)" in dash.header.value
    dash.tab.selected_index = dash.TABS.index("Layers")  # what a click on the tab does
    layers = dash.panel("Layers")  # built by the thread the click started: waits for it
    assert dash.panels["Layers"] is layers
    assert dash.tab.children[4].children == (layers.widget,)


def test_repair_asks_for_confirmation_then_repairs_backs_up_and_refreshes(
    demos: Path, tmp_path: Path
):
    folder = _copy(demos, DRIFT, tmp_path)
    before = (folder / INDEX_NAME).read_text()
    dash = Dashboard(folder)
    drift_before = dash.select("Findings")
    repair = dash.select("Repair")
    assert "mtp.layers.0" in repair.plan_view.value and "+" in repair.plan_view.value
    # 1. Repair only asks; Cancel writes nothing.
    repair.repair.click()
    assert repair.confirm_box.layout.display is None and repair.repair.disabled
    assert "backed up" in repair.question.value
    repair.cancel.click()
    assert repair.confirm_box.layout.display == "none"
    assert (folder / INDEX_NAME).read_text() == before
    # 2. Repair, then Confirm: the index lists the MTP tensors, the old file is backed up.
    repair.repair.click()
    repair.confirm.click()
    assert any(name.startswith("mtp.") for name in _weight_map(folder))
    backups = list((folder / ".ckpt-inspect-backup").iterdir())
    assert len(backups) == 1
    assert (backups[0] / INDEX_NAME).read_text() == before
    # 3. Every tab was refreshed from a re-scan, in the widgets it showed (`renew`).
    assert dash.state.findings == () and dash.tab.titles[FINDINGS_TAB] == "Findings (0)"
    after = dash.panel("Repair")
    assert after is repair and "Repaired." in after.result.value
    assert str(backups[0]) in after.result.value and after.plan.empty and after.repair.disabled
    drift_after = dash.select("Findings")
    assert drift_after is drift_before and "No findings." in _texts(drift_after.rows)
    assert "No issues found" in _texts(dash.panel("Overview").widget)


def test_rescan_button_picks_up_changes_on_disk(demos: Path, tmp_path: Path):
    folder = _copy(demos, DRIFT, tmp_path)
    dash = Dashboard(folder)
    (folder / CONFIG_NAME).write_text('{"model_type": "deepseek_v3", "num_hidden')
    _buttons(dash.widget, "ckpt-rescan-button")[0].click()
    assert "config-unreadable" in {f.code for f in dash.state.findings}
    assert "config.json is not valid JSON" in _texts(dash.panels["Overview"].widget)


def test_repair_of_a_changed_file_is_refused_and_shown(demos: Path, tmp_path: Path):
    folder = _copy(demos, DRIFT, tmp_path)
    repair = Dashboard(folder).select("Repair")
    # Someone rewrites the index between planning and confirming.
    (folder / INDEX_NAME).write_text('{"weight_map": {}}')
    repair.repair.click()
    repair.confirm.click()
    assert "changed since the repair was planned" in repair.result.value
    assert _weight_map(folder) == {}


def test_heatmap_click_lists_the_experts_tensors(demos: Path):
    dash = Dashboard(demos / EP_COLLISION, model=False)
    experts = dash.select("Experts")
    z = np.asarray(experts.figure.data[0].z, dtype=float)
    # MoE layers 1-3 and the MTP layer 4, 512 declared experts each, 64 kept.
    assert experts.figure.data[0].y == ("1", "2", "3", "4") and z.shape == (4, 512)
    assert (z[:, :64] == 2).all() and (z[:, 64:] == 0).all()
    assert "ckpt-expert-heatmap" in experts.figure._dom_classes

    def click(layer: int, expert: int) -> None:
        # The message the plotly frontend sends on a click.
        experts.figure._js2py_pointsCallback = {
            "event_type": "plotly_click",
            "points": {
                "xs": [expert],
                "ys": [str(layer)],
                "point_indexes": [[layer - 1, expert]],
                "trace_indexes": [0],
            },
        }

    click(2, 7)
    assert (experts.layer.value, experts.expert.value) == (2, 7)
    details = experts.details.value
    assert "model.layers.2.mlp.experts.7.down_proj.weight" in details
    assert "model.layers.2.mlp.experts.8." not in details
    # The zoom shows layer 2 with a labelled cell per expert: 16 rows of 32.
    zoom = experts.zoom.children[0]
    assert experts.zoomed == 2 and np.asarray(zoom.data[0].z, dtype=float).shape == (16, 32)
    assert zoom.data[0].text[9][12] == "300" and zoom.data[0].z[9][12] == 0
    click(3, 300)
    assert "expert-missing" in experts.details.value and "64-511" in experts.details.value
    # A click on the zoomed layer's cell (row "288-319", column 12) is expert 300 of layer 3.
    zoom = experts.zoom.children[0]
    zoom._js2py_pointsCallback = {
        "event_type": "plotly_click",
        "points": {
            "xs": [12],
            "ys": ["288-319"],
            "point_indexes": [[9, 12]],
            "trace_indexes": [0],
        },
    }
    assert (experts.layer.value, experts.expert.value) == (3, 300)
    # The picker does the same without the figure.
    experts.layer.value, experts.expert.value = 1, 0
    experts.widget.children[1].children[2].click()
    assert "model.layers.1.mlp.experts.0.gate_proj.weight" in experts.details.value
    # show() moves the pickers too (they used to keep their old values).
    experts.show(3, 5)
    assert (experts.layer.value, experts.expert.value, experts.zoomed) == (3, 5, 3)


def test_drift_filters_by_severity_and_code_pages_and_explains(demos: Path, tmp_path: Path):
    drift = Dashboard(_copy(demos, DRIFT, tmp_path)).select("Findings")
    # 44 findings, 25 a page.
    assert len(drift.rows.children) == 25 and "1-25 of 44" in drift.where.value
    drift.next.click()
    assert len(drift.rows.children) == 19 and drift.next.disabled and not drift.prev.disabled
    drift.severity.value = "warning"
    assert set(_codes(drift)) == {"total-size-mismatch", "sidecar-total-size-mismatch"}
    drift.severity.value = "all"
    drift.code.value = "unindexed-tensor"
    assert set(_codes(drift)) == {"unindexed-tensor"} and "1-21 of 21" in drift.where.value
    help_text = CODE_HELP["unindexed-tensor"].replace("'", "&#x27;")
    assert help_text in drift.help.value and "sidecar-missing" not in drift.help.value


def _codes(drift) -> list[str]:
    return [
        c.removeprefix("ckpt-code-")
        for row in drift.rows.children
        for c in row._dom_classes
        if c.startswith("ckpt-code-")
    ]


def test_consolidate_tab_writes_verified_output(demos: Path, tmp_path: Path):
    folder = _copy(demos, DCP_COLLAPSED, tmp_path)
    form = Dashboard(folder, model=False).select("Consolidate")
    # The default destination is beside the source, not inside it.
    assert form.dest.value == str(tmp_path / f"{DCP_COLLAPSED}-consolidated")
    # A bad size is refused in the panel, nothing is written.
    form.dest.value = str(tmp_path / "out")
    form.max_size.value = "lots"
    form.run.click()
    assert "cannot read size" in form.status.value and not (tmp_path / "out").exists()
    # With the reference model's assignment the output has the reference's 4 files.
    table, _ = reference_assignment(folder / ".hf_metadata" / INDEX_NAME)
    mapping = tmp_path / "mapping.json"
    mapping.write_text(json.dumps(table))
    form.mapping.value, form.max_size.value = str(mapping), "5GB"
    form.verify_data.value, form.workers.value = True, 2
    result = form.execute()
    assert result is not None and result.ok and result.data_checked == len(table)
    written = scan(tmp_path / "out")
    assert len(written.files) == 4 and sorted(_weight_map(tmp_path / "out")) == sorted(table)
    assert "verified: no finding" in form.status.value and not form.run.disabled


def test_consolidate_from_the_overview_prefills_the_reference_the_finding_names(
    demos: Path, tmp_path: Path
):
    """automodel-2289: the Overview's Consolidate... opened a form with an empty reference,
    and its plan wrote the collapse the Overview had just flagged. The form now holds the
    reference index the run kept, its plan has the reference's 4 files, and the issue's fix
    names the same reference."""
    folder = _copy(demos, DCP_COLLAPSED, tmp_path)
    kept = folder / ".hf_metadata" / INDEX_NAME
    dash = Dashboard(folder)
    (issue,) = [p for p in dash.state.problems if p.key == "mapping-collapsed"]
    assert issue.action.command.endswith(f"--reference {kept}")
    (go,) = _buttons(dash.panel("Overview").widget, "ckpt-problem-consolidate")
    go.click()
    assert dash.tab.selected_index == dash.TABS.index("Consolidate")
    form = dash.panels["Consolidate"]
    assert form.reference.value == str(kept)
    assert "mapping-collapsed" in _texts(form.widget) and "names 4 files" in _texts(form.widget)
    form.dest.value = str(tmp_path / "out")
    result = form.execute()
    assert result is not None and result.ok and len(scan(tmp_path / "out").files) == 4
    assert "verified: no finding" in form.status.value


def test_consolidate_into_a_destination_holding_other_files_asks_for_overwrite(
    demos: Path, tmp_path: Path
):
    """The default destination may already hold something: consolidate refuses to write over
    what it did not write, and the panel says how to go on, without a traceback."""
    folder = _copy(demos, DCP_COLLAPSED, tmp_path)
    form = Dashboard(folder, model=False).select("Consolidate")
    dest = Path(form.dest.value)
    dest.mkdir()
    index = dest / INDEX_NAME
    index.write_text('{"weight_map": {}}')  # someone else's index, under a name we write
    (dest / "notes.txt").write_text("mine")
    assert form.execute() is None
    status = form.status.value
    assert "PlanRefusedError" in status and "DEST is not empty: 2 entries" in status
    assert "Nothing was written" in status and "tick <b>overwrite</b>" in status
    assert sorted(p.name for p in dest.iterdir()) == [INDEX_NAME, "notes.txt"]
    assert index.read_text() == '{"weight_map": {}}' and not form.run.disabled
    # Ticked: what a written file replaces is moved to a backup first, the rest left alone.
    form.overwrite.value = True
    result = form.execute()
    assert result is not None and result.ok and result.replaced == (index.name,)
    assert result.backup is not None
    assert (result.backup / index.name).read_text() == '{"weight_map": {}}'
    assert (dest / "notes.txt").read_text() == "mine"
    assert "the originals are in" in form.status.value
    # The folder now holds this plan's own output (and the note): running again is no
    # overwrite of anything it did not write, so it needs no tick.
    (dest / "notes.txt").unlink()
    form.overwrite.value = False
    again = form.execute()
    assert again is not None and again.ok and again.backup is None


def test_consolidate_refuses_other_layouts_in_the_panel(demos: Path):
    form = Dashboard(demos / "healthy-hf-sharded", model=False).select("Consolidate")
    assert "hf-sharded" in form.widget.children[0].value
    assert form.make_plan() is None and "not DCP-sharded" in form.status.value


@pytest.mark.parametrize("demo", [DRIFT, EP_COLLISION, DCP_COLLAPSED])
def test_every_button_shows_its_error_where_it_was_clicked(demos: Path, demo: str):
    """In a live kernel an exception raised by a click handler goes to the kernel log and
    the page shows nothing: every button of every tab runs its action through `guarded`,
    which shows the error in the tab."""
    dash = Dashboard(demos / demo, model=False)
    for title in dash.TABS:
        dash.panel(title)
    import ipywidgets as w

    buttons = [b for b in _widgets(dash.widget) if isinstance(b, w.Button)]
    assert len(buttons) > 10
    bare = [
        b.description
        for b in buttons
        for handler in b._click_handlers.callbacks
        if handler.__qualname__ != "guarded.<locals>.handler"
    ]
    assert not bare, bare


def test_report_tab_writes_html_and_shows_markdown(demos: Path, tmp_path: Path):
    dash = Dashboard(demos / EP_COLLISION, report_dir=tmp_path / "reports", model=False)
    report = dash.select("Report")
    report.widget.children[1].children[0].click()
    target = tmp_path / "reports" / f"{EP_COLLISION}-report.html"
    text = target.read_text()
    assert text.startswith("<!DOCTYPE html>") or "<html" in text[:200]
    assert "expert-missing" in text and str(target) in report.status.value
    report.widget.children[1].children[1].click()
    assert report.markdown.value.startswith("### Checkpoint inspection")
    assert "`expert-missing`" in report.markdown.value and report.markdown.layout.display is None
    # The light report, to attach to a bug report: plotly.js from its CDN, not embedded.
    report.figures.value = "cdn"
    report.widget.children[1].children[0].click()
    assert target.stat().st_size < 500_000 and "cdn.plot.ly" in target.read_text()


def test_torch_dist_checkpoint_opens_every_tab(demos: Path):
    dash = Dashboard(demos / "megatron-4448-rerun-drift")
    for title in dash.TABS:
        dash.select(title)
    assert _codes(dash.panels["Findings"]) == ["torch-dist-common-drift"]
    repair = dash.panels["Repair"]
    assert "nothing to repair" in repair.plan_view.value and repair.repair.disabled
    assert "It cannot fix" in repair.verdict.value and "re-save" in repair.verdict.value


def test_dense_checkpoint_has_no_expert_picker(tmp_path: Path):
    import torch
    from safetensors.torch import save_file

    folder = tmp_path / "dense"
    folder.mkdir()
    state = {f"model.layers.{i}.mlp.up_proj.weight": torch.ones(8, 4) for i in range(3)}
    save_file(state, folder / SAFETENSORS_WEIGHTS_NAME, metadata={"format": "pt"})
    dash = Dashboard(folder, model=False)
    experts = dash.select("Experts")
    assert experts.layer.options == ()
    experts.widget.children[1].children[2].click()
    assert "No MoE layer" in experts.details.value
    assert "No MoE experts" in experts.figure.layout.annotations[0].text
    assert experts.figure.layout.height <= 140  # an empty figure does not take 300 px
    assert "No findings." in _texts(dash.select("Findings").rows)
    assert "No issues found" in _texts(dash.panel("Overview").widget)


def test_repr_html_summarizes_and_escapes(demos: Path):
    scanned = scan(demos / EP_COLLISION)
    card = scanned._repr_html_()
    assert "modelopt-per-layer" in card and "config.json is not valid JSON" in card
    assert "model-00004-of-00004.safetensors" in card and "512" in card
    hostile = make_finding("layer-keyset-outlier", "holds '<script>alert(1)</script>'")
    card = scanned_html(scanned, findings=[hostile])
    assert "<script>alert" not in card and "&lt;script&gt;alert(1)" in card


def test_duplicate_policy_is_chosen_in_the_repair_tab(write_state_dict):
    import torch
    from safetensors.torch import save_file

    state = {f"model.layers.{i}.mlp.up_proj.weight": torch.ones(16, 16) for i in range(4)}
    folder = write_state_dict(state, max_shard_size="2KB")
    # A stray shard holds layer 0's weight again, with another shape.
    name = "model.layers.0.mlp.up_proj.weight"
    save_file({name: torch.zeros(2, 2)}, folder / "stray.safetensors", metadata={"format": "pt"})
    dash = Dashboard(folder)
    repair = dash.select("Repair")
    assert "REFUSED" in repair.plan_view.value and repair.repair.disabled
    repair.duplicates.value = "index"  # keep the copy the index already points to
    _buttons(repair.widget, "ckpt-plan-button")[0].click()
    assert "REFUSED" not in repair.plan_view.value
    # The index already points at that copy: the plan would only add total_parameters, which
    # fixes nothing, so Repair stays disabled and says what would fix the duplicate instead.
    assert repair.repair.disabled and "fixes no error or warning" in repair.verdict.value
    assert "It cannot fix" in repair.verdict.value and "stored in more than one" in (
        repair.verdict.value
    )


def test_duplicate_policy_repairs_an_index_that_lost_the_tensor(write_state_dict):
    import torch
    from safetensors.torch import save_file

    state = {f"model.layers.{i}.mlp.up_proj.weight": torch.ones(16, 16) for i in range(4)}
    folder = write_state_dict(state, max_shard_size="2KB")
    name = "model.layers.0.mlp.up_proj.weight"
    save_file({name: torch.zeros(2, 2)}, folder / "stray.safetensors", metadata={"format": "pt"})
    index = json.loads((folder / INDEX_NAME).read_text())
    home = index["weight_map"].pop(name)
    (folder / INDEX_NAME).write_text(json.dumps(index))
    dash = Dashboard(folder)
    repair = dash.select("Repair")
    assert "REFUSED" in repair.plan_view.value and repair.repair.disabled
    repair.duplicates.value = "first"
    _buttons(repair.widget, "ckpt-plan-button")[0].click()
    assert not repair.repair.disabled and "REFUSED" not in repair.plan_view.value
    assert "This plan fixes" in repair.verdict.value
    repair.repair.click()
    repair.confirm.click()
    assert "Repaired." in dash.panel("Repair").result.value
    assert _weight_map(folder)[name] == home


def test_overview_repair_action_opens_the_planned_repair_and_asks(demos: Path, tmp_path: Path):
    folder = _copy(demos, DRIFT, tmp_path)
    dash = Dashboard(folder)
    overview = dash.panels["Overview"].widget
    (fix_index, _fix_sidecars) = _buttons(overview, "ckpt-problem-repair")[::-1]
    assert fix_index.description == "Repair: index"
    fix_index.click()
    repair = dash.panels["Repair"]
    assert dash.tab.selected_index == dash.TABS.index("Repair") and repair.parts == ("index",)
    assert [w.path for w in repair.plan.writes] == [INDEX_NAME]
    # It says exactly what this plan fixes and what it leaves (the sidecar problem).
    assert "fixes 22 of 44 findings" in repair.verdict.value
    assert "It cannot fix" in repair.verdict.value and "--only sidecars" in repair.verdict.value
    assert "It would add 21 findings" in repair.verdict.value
    assert repair.confirm_box.layout.display is None  # asking already
    repair.confirm.click()
    assert any(n.startswith("mtp.") for n in _weight_map(folder))
    codes = {f.code for f in dash.state.findings}
    # Said beforehand: the sidecar now also disagrees with the rebuilt index.
    assert codes == {
        "sidecar-unlisted-tensor",
        "sidecar-total-size-mismatch",
        "sidecar-index-disagree",
    }
    assert [p.key for p in dash.state.problems] == ["sidecars-disagree"]
    # The remaining problem's action still works from the refreshed Overview.
    (fix,) = _buttons(dash.panel("Overview").widget, "ckpt-problem-repair")
    assert fix.description == "Repair: sidecars"


def test_repair_tab_of_an_unrepairable_checkpoint_says_so_and_is_disabled(demos: Path):
    dash = Dashboard(demos / EP_COLLISION)
    overview = _texts(dash.panels["Overview"].widget)
    assert "448 of 512 experts missing in 3 MoE layers (1-3) and MTP layer 4" in overview
    assert _buttons(dash.panels["Overview"].widget, "ckpt-problem-repair") == []
    repair = dash.select("Repair")
    assert not repair.plan.empty and repair.repair.disabled  # only total_parameters: cosmetic
    verdict = repair.verdict.value
    assert "fixes no error or warning" in verdict and "total_parameters" in verdict
    assert "re-export from the training checkpoint" in verdict
    assert "restore config.json" in verdict and "--from REF" in verdict
    repair.ask()
    assert repair.confirm_box.layout.display == "none"  # nothing to confirm


def test_findings_link_to_their_tensor_heatmap_cell_and_file(demos: Path, tmp_path: Path):
    dash = Dashboard(_copy(demos, DRIFT, tmp_path))
    card = _buttons(dash.panels["Overview"].widget, "ckpt-problem-index-misses-tensors")[0]
    link = _buttons(card, "ckpt-finding-link")[0]
    assert link.description == "show tensor"
    link.click()
    browser = dash.panels["Tensors"]
    assert dash.tab.selected_index == dash.TABS.index("Tensors")
    assert len(browser.query.names) == 1 and browser.query.names[0].startswith("mtp.layers.0.")
    assert browser.matches() == 1 and "<b>1</b> of 387 tensors" in browser.count.value
    # The problem's tensors button selects all 42.
    _buttons(card, "ckpt-problem-tensors")[0].click()
    assert browser.matches() == 42
    # A finding with a layer leads to the heatmap, zoomed into that layer.
    ep = Dashboard(demos / EP_COLLISION)
    missing = next(f for f in ep.state.findings if f.code == "expert-missing")
    experts = ep.follow(missing)
    assert ep.tab.selected_index == ep.TABS.index("Experts") and experts.zoomed == missing.layer
    assert "64-511" in experts.details.value
    # A finding about a shard file shows that file's tensors.
    from inspector._internal.findings.finding import make_finding

    on_file = make_finding("trailing-bytes", "x", file="model-00002-of-00004.safetensors")
    assert dash.follow(on_file).query.file == "model-00002-of-00004.safetensors"


def test_tensor_browser_filters_sorts_and_exports(demos: Path, tmp_path: Path):
    import pandas as pd

    from inspector._internal.report.query import TensorQuery

    dash = Dashboard(demos / EP_COLLISION, report_dir=tmp_path, model=False)
    browser = dash.select("Tensors")
    t = dash.scanned.tensors
    assert browser.matches() == len(t) and "ckpt-tensor-grid" in browser.grid._dom_classes
    browser.name.value = "*.experts.17.*"
    assert browser.grid.filter == [["name matches", "==", True]]
    # Layers 1-3 hold 12 tensors per expert (NVFP4: weight and 3 scales per projection) and
    # the MTP layer's experts 3 (BF16).
    assert browser.matches() == len(TensorQuery(name="*.experts.17.*").apply(t)) == 39
    browser.dtype.value, browser.layer.value = "F8_E4M3", 2
    assert browser.matches() == 3  # the three weight_scale tensors of expert 17 in layer 2
    browser.export_name.value = str(tmp_path / "fp8")
    written = browser.export("csv")
    rows = pd.read_csv(written)
    assert len(rows) == 3 and set(rows["dtype"]) == {"F8_E4M3"} and set(rows["layer"]) == {2}
    assert browser.export("parquet").suffix == ".parquet"
    assert "wrote 3 rows" in browser.export_status.value
    # A bad regex is reported in the panel, the previous filter stays.
    browser.regex.value = True
    browser.name.value = "experts.("
    assert "not a regular expression" in browser.count.value and browser.matches() == 3
    _buttons(browser.widget, "ckpt-tensor-clear")[0].click()
    assert browser.matches() == len(t) and browser.name.value == ""


def test_tensor_grid_is_created_when_its_tab_is_shown(demos: Path):
    """Built ahead of the click, the Tensors tab has its table and controls but no grid: a
    grid created in a hidden tab draws no rows at a million tensors."""
    dash = Dashboard(demos / DRIFT, model=False)
    browser = dash.panel("Tensors")  # what the background worker does
    assert browser.grid is None and browser.matches() == len(dash.scanned.tensors)
    browser.set_query(TensorQuery(name="mtp.*"))
    assert browser.matches() == 42 and browser.grid is None
    dash.tab.selected_index = dash.TABS.index("Tensors")  # a click on the tab
    _until(lambda: browser.grid is not None)  # made by the thread the click started
    assert "ckpt-tensor-grid" in browser.grid._dom_classes
    assert browser.grid.filter == [["name matches", "==", True]]  # the query carried over
    assert browser._grid_box.children == (browser.grid,)


def test_a_grid_first_shows_its_first_rows_as_its_viewer_will_draw_them(
    monkeypatch: pytest.MonkeyPatch,
):
    """A grid's widget carries its first rows as HTML (`preview_html`), which the page shows
    while the viewer starts (1-3 s on a busy machine: issue 34's slow first clicks): the
    viewer's filter and sort (a filter set after the grid was made too), byte columns as the
    grid draws them, and a hostile name escaped, never markup."""
    import html as html_module

    import pandas as pd
    import perspective
    from inspector.widgets import grid as grid_module
    from inspector.widgets.esm import PREVIEW_TRAIT
    from inspector.widgets.grid import (
        PREVIEW_ROWS,
        arrow_bytes,
        make_grid,
        match_expression,
        preview_html,
    )

    hostile = 'model.<img src=x onerror=alert(1)>\x1b[2J"\u202e.weight'
    frame = pd.DataFrame(
        {
            "name": [hostile, *(f"layers.{i}.weight" for i in range(40))],
            "size": [43_680, *range(1000, 41_000, 1000)],
            "layer": [None, *range(40)],
        }
    )
    table = perspective.table(arrow_bytes(frame), name="preview-test-1")
    grid = make_grid(
        table, columns=["name", "size", "layer"], title="t", css_class="ckpt-test-grid"
    )
    shown = getattr(grid, PREVIEW_TRAIT)
    assert "<img" not in shown and "\x1b" not in shown and "&lt;img src=x" in shown
    assert shown.count("<tr>") == PREVIEW_ROWS + 1  # the header and the first rows
    assert "43.7 kB" in shown and ">1.0 kB<" in shown and "43,680" not in shown
    # Made sorted, then filtered as "show tensor" filters it just after: the preview follows
    # (until the viewer first asks the table something).
    grid = make_grid(
        table,
        columns=["name", "size", "layer"],
        title="t",
        css_class="ckpt-test-grid",
        sort=[["size", "desc"]],
    )
    name, expression = match_expression("name", "layers.3*")
    grid.expressions = {name: expression}
    grid.filter = [[name, "==", True]]
    cells = re.findall(r"<tr><td>([^<]*)</td>", getattr(grid, PREVIEW_TRAIT))
    names = [f"layers.{i}.weight" for i in (39, 38, 37, 36, 35, 34, 33, 32, 31, 30, 3)]
    assert [html_module.unescape(c) for c in cells] == names
    grid.close()
    # Over the budget, no sorted or filtered preview (the kernel would sort the whole table
    # for it, then again for the viewer); the table's first rows still come at once.
    monkeypatch.setattr(grid_module, "PREVIEW_SORTED_ROWS", 40)
    sort = {"sort": [["size", "desc"]]}
    assert preview_html(table, columns=["name"], **sort) == ""
    assert "layers.0.weight" in preview_html(table, columns=["name"])


def test_a_rescan_closes_the_old_panels_only_once_no_tab_shows_them(
    demos: Path, monkeypatch: pytest.MonkeyPatch
):
    """A re-scan closed the old panels (their grids' widgets) while the tabs still showed
    them: the page then held views of models the kernel had closed and logged "widget model
    not found". The tabs show spinners first; the panels are closed after. (Every tab now
    renews itself in place, `renew`; one that declines, here the open Experts tab, is closed
    and built again.)"""
    from inspector.widgets import dashboard

    dash = Dashboard(demos / DRIFT)
    old = dash.select("Experts")
    monkeypatch.setattr(old, "renew", lambda: False)
    seen: list[tuple[str, bool]] = []
    close = dashboard._close

    def closing(panel) -> None:
        shown = any(panel.widget in box.children for box in dash.tab.children)
        seen.append((type(panel).__name__, shown))
        close(panel)

    monkeypatch.setattr(dashboard, "_close", closing)
    dash.worker_delay = 0  # nothing is clicked after the re-scan: no page to give way to
    dash.refresh()
    dash.wait(60)
    assert dash.panels["Experts"] is not old  # built again, the old one closed:
    assert ("ExpertsPanel", False) in seen and all(not on_screen for _, on_screen in seen)


def _comm_opens(monkeypatch: pytest.MonkeyPatch) -> dict[str, dict]:
    """The first state of every widget opened from now on, by comm id (filled as they open)."""
    import comm

    opened: dict[str, dict] = {}
    create = comm.create_comm

    def recording(**kwargs):
        made = create(**kwargs)
        opened[made.comm_id] = kwargs["data"]["state"]
        return made

    monkeypatch.setattr(comm, "create_comm", recording)
    return opened


def test_figures_are_made_when_their_tab_is_shown_and_open_holding_their_figure(
    demos: Path, monkeypatch
):
    """A figure made while its tab is on screen used to draw empty axes: plotly's widget
    opened its comm before it held its figure and sent the data as a later update, which a
    busy page's anywidget model lost. Now a tab's figures are made when it is first shown,
    each in one comm_open that holds its data, layout and CSS class, and with a module of a
    few lines: plotly.js travels in its state and the page evaluates it once."""
    opened = _comm_opens(monkeypatch)
    dash = Dashboard(demos / DRIFT, model=False)
    files, layers = dash.panel("Files"), dash.panel("Layers")  # what the worker builds
    assert files.figures.widgets == [] and layers.figures.widgets == []
    dash.select("Files")
    (figure,) = files.figures.widgets
    state = opened[figure.model_id]
    assert state["_widget_data"][0]["type"] == "bar" and len(state["_widget_data"][0]["x"]) == 4
    assert state["_widget_layout"]["title"]["text"].startswith("Shard sizes")
    assert state["_widget_layout"]["autosize"] is True and state["_config"]["responsive"]
    assert "ckpt-shard-sizes" in state["_dom_classes"]
    assert len(state["_esm"]) < 5_000 and state["_module_holder"].startswith("IPY_MODEL_")
    experts = dash.select("Experts")
    heatmap = opened[experts.figure.model_id]
    assert heatmap["_widget_data"][0]["type"] == "heatmap" and heatmap["_esm"] == state["_esm"]
    assert layers.figures.widgets == []  # not shown yet


def test_a_large_module_is_sent_once_per_kernel_however_many_grids_and_figures(
    demos: Path, monkeypatch
):
    """Every grid's first message carried Perspective's whole module and style sheet (6.4 MB)
    and every figure plotly.js (1.55 MB), which the kernel, the server and the page each
    handled again per widget (issue 34 item 2). Now one holder per module per kernel carries
    the text; a grid's or figure's state names it, and a second dashboard reuses it."""
    from inspector.widgets.esm import HOLDER_TRAIT, module_holder
    from inspector.widgets.grid import grid_class
    from inspector.widgets.plot import figure_module

    opened = _comm_opens(monkeypatch)
    for _ in range(2):  # a second view of the checkpoint: its own grids, the same holders
        dash = Dashboard(demos / DRIFT, model=False)
        for tab in ("Tensors", "Files", "Layers"):
            dash.select(tab)
    users = [s for s in opened.values() if HOLDER_TRAIT in s]
    kinds = sorted(s["_anywidget_id"].rsplit(".", 1)[-1] for s in users)
    assert kinds == ["DashboardFigure"] * 6 + ["TensorGrid"] * 6, kinds
    trait = grid_class().class_traits()[HOLDER_TRAIT]
    grid_holder = module_holder(trait.source, trait.css)
    figure_holder = module_holder(figure_module())
    assert "perspective-viewer" in grid_holder.css and len(grid_holder.source) > 2_000_000
    ids = {f"IPY_MODEL_{h.model_id}" for h in (grid_holder, figure_holder)}
    assert {s[HOLDER_TRAIT] for s in users} == ids
    for state in users:
        assert len(json.dumps(state)) < 50_000 and not state.get("_css")
        # A figure's plotly.js waits on the page for the grids being drawn (rows first).
        waits = 'const after = ["perspective"];' in state["_esm"]
        assert waits == state["_anywidget_id"].endswith("DashboardFigure")
    # Each holder opened once in this kernel (here or by an earlier test of the process).
    holders = [s for s in opened.values() if s["_model_name"] == "WidgetModel"]
    assert len(holders) <= 2
    # Closed (`Widget.close_all()`), the holder is made again for the next widget.
    grid_holder.close()
    again = module_holder(grid_holder.source, grid_holder.css)
    assert again is not grid_holder and again.comm is not None
    assert module_holder(grid_holder.source, grid_holder.css) is again


def test_the_repair_plan_is_made_when_its_tab_is_first_shown(demos: Path, monkeypatch):
    """Planning every part and re-checking the result takes seconds of the kernel at 300,000
    tensors: the background worker builds the Repair tab without planning; its first show
    plans, once."""
    from inspector.widgets.tabs import repair as actions

    calls: list[str] = []
    plan_all = actions.plan_all

    def counted(*args, **kwargs):
        calls.append("all")
        return plan_all(*args, **kwargs)

    monkeypatch.setattr(actions, "plan_all", counted)
    dash = Dashboard(demos / DRIFT)
    repair = dash.panel("Repair")  # what the background worker does
    assert calls == [] and repair.plan is None and repair.repair.disabled
    assert "when the tab is shown" in repair.verdict.value
    assert dash.select("Repair") is repair and calls == ["all"]
    assert "mtp.layers.0" in repair.plan_view.value and not repair.repair.disabled
    dash.select("Overview")
    dash.select("Repair")
    assert calls == ["all"]  # planned once
    # From the Overview, "Repair: index" plans the index alone, without planning all first.
    other = Dashboard(demos / DRIFT)
    calls.clear()
    assert other.repair(("index",)).parts == ("index",) and calls == []
    assert INDEX_NAME in other.panel("Repair").plan_view.value


def test_rescan_on_the_tensors_tab_draws_the_new_grid(demos: Path):
    """A re-scan draws the open tab again: on the Tensors tab that is shown at once, in the
    grid it shows (its table's rows replaced by the re-scan's), rather than in a grid waiting
    for a click that never comes."""
    dash = Dashboard(demos / DRIFT, model=False)
    old = dash.select("Tensors")
    old.set_query(TensorQuery(dtype="F32"))
    assert old.grid is not None and old.grid.filter
    dash.worker_delay = 0  # nothing is clicked after the re-scan: no page to give way to
    dash.refresh()
    dash.wait(60)
    browser = dash.panels["Tensors"]
    assert browser is old and browser.scanned is dash.scanned is not None
    assert browser.grid is not None and browser.grid.comm is not None
    assert browser._grid_box.children == (browser.grid,)
    # As a tab built for the re-scan: every tensor, its rows in the grid's table.
    assert browser.query == TensorQuery() and browser.grid.filter == []
    assert browser.table.size() == len(dash.scanned.tensors)


def test_grid_engine_and_pandas_select_the_same_tensors(demos: Path):
    """The grid filters in Perspective's engine (RE2), the export in pandas: same rows."""
    from inspector.widgets.browser import TensorBrowser, grid_config

    from inspector._internal.report.query import TensorQuery

    scanned = scan(demos / DRIFT)
    browser = TensorBrowser(scanned)
    t = scanned.tensors
    queries = [
        TensorQuery(name="*.experts.1?.*"),
        TensorQuery(name="mtp.layers.0"),
        TensorQuery(name=r"(gate|up)_proj\.weight$", regex=True),
        TensorQuery(name=r"layers\.[12]\..*scale", regex=True, dtype="F32"),
        TensorQuery(kind="router"),
        TensorQuery(expert=3, file="model-00002-of-00004.safetensors"),
        TensorQuery(name="it's [a-z]*", layer=1),
    ]
    for query in queries:
        browser.set_query(query)
        view = browser.table.view(**grid_config(query))
        try:
            engine = sorted(view.to_columns()["name"])
        finally:
            view.delete()
        assert engine == sorted(query.apply(t)["name"]), query
    browser.close()


def test_files_grid_counts_the_findings_that_name_each_file(demos: Path):
    """The Files tab is a grid with people's column names and numbers that sort as numbers;
    its findings column agrees with the findings (the shard an expert-missing finding names
    counts it), and the filters narrow it."""
    dash = Dashboard(demos / EP_COLLISION, model=False)
    files = dash.select("Files").table
    frame = files.frame
    assert list(frame.columns[:4]) == ["file", "findings", "size", "outlier"]
    assert "tensor_bytes" not in frame.columns and "data size" in frame.columns
    assert frame["size"].dtype == "Int64" and frame["data size"].dtype == "int64"
    named = [f for f in dash.state.findings if f.code == "expert-missing"]
    assert named and all(f.file for f in named)
    counts = dict(zip(frame["file"], frame["findings"], strict=True))
    for f in named:
        assert counts[f.file] >= sum(g.file == f.file for g in dash.state.findings) > 0
    # The grid's own sort puts the files with findings first.
    shown = files.rows()
    assert list(shown["findings"]) == sorted(shown["findings"], reverse=True)
    files.flags["with findings"].value = True
    assert files.matches() == int((frame["findings"] > 0).sum()) < len(frame)
    assert f"<b>{files.matches()}</b> of {len(frame)} files" in files.count.value
    files.flags["with findings"].value = False
    files.text.value = "*-00002-*"
    assert files.matches() == 1 and set(files.rows()["file"]) == {
        n for n in frame["file"] if "-00002-" in n
    }
    files.regex.value, files.text.value = True, "[unclosed"
    assert "not a regular expression" in files.count.value


def test_layers_grid_names_columns_for_people_and_filters_by_kind(demos: Path):
    dash = Dashboard(demos / DRIFT, model=False)
    layers = dash.select("Layers").table
    frame = layers.frame
    assert {"is_mtp", "experts_found", "bytes"}.isdisjoint(frame.columns)
    assert {"MTP", "experts found", "size", "findings"} <= set(frame.columns)
    assert set(frame["MTP"]) == {"yes", "no"}
    assert frame["size"].tolist() == dash.scanned.layers["bytes"].tolist()
    layers.choices["kind"].value = "moe"
    assert layers.matches() == int((frame["kind"] == "moe").sum()) > 0
    assert layers.grid is not None and layers.grid.filter == [["kind", "==", "moe"]]


def test_tensor_grid_sizes_are_numbers(demos: Path):
    """The grid sorts `size` in its engine: as bytes, not as the text "22.0 MB"."""
    from inspector.widgets.browser import GRID_COLUMNS, grid_frame
    from inspector.widgets.grid import is_bytes_column

    frame = grid_frame(scan(demos / DRIFT).tensors)
    assert frame["size"].dtype == "int64" and is_bytes_column("size")
    assert "nbytes" not in GRID_COLUMNS and "elements" in GRID_COLUMNS


def test_experts_tab_opens_on_the_faulty_layer(tmp_path: Path, monkeypatch):
    """Layer 3 of 4 lost experts 4-7 (every other layer is whole): the Experts tab opens
    zoomed into layer 3, not into the first MoE layer."""
    import test_report_html

    monkeypatch.setattr(test_report_html, "LOST_PART", None)  # layer 1 keeps all its parts
    dash = Dashboard(test_report_html.write_moe_checkpoint(tmp_path / "moe"), model=False)
    missing = [f for f in dash.state.findings if f.code == "expert-missing"]
    assert [f.layer for f in missing] == [3]
    experts = dash.select("Experts")
    assert experts.zoomed == 3 and experts.layer.value == 3
    assert min(experts.layer.options) < 3


def test_a_tab_click_answers_at_once_while_the_tab_is_built(demos: Path, monkeypatch):
    """A click on a tab that is not built yet shows a spinner at once and builds it in a
    thread (the kernel answers the next click meanwhile); the panel replaces the spinner."""
    import threading

    from inspector.widgets.tabs import layers as module

    gate = threading.Event()
    real = module.LayersPanel

    def slow(dash):
        assert gate.wait(30)  # the build takes as long as the test says
        return real(dash)

    dash = Dashboard(demos / DRIFT, model=False)
    monkeypatch.setattr(module, "LayersPanel", slow)  # the tab table names it
    index = dash.TABS.index("Layers")
    dash.tab.selected_index = index  # returns although the build is blocked
    (spinner,) = dash.tab.children[index].children
    assert "ckpt-tab-loading" in spinner.value and "layers" in spinner.value
    dash.tab.selected_index = dash.TABS.index("Files")  # the next click is answered too
    assert dash.tab.children[dash.TABS.index("Files")].children
    gate.set()
    layers = dash.panel("Layers")
    assert dash.tab.children[index].children == (layers.widget,)


def test_every_tab_holds_its_spinner_before_the_kernel_hears_of_a_click(demos: Path):
    """The page switches tabs by itself: an unbuilt tab shows the spinner it was drawn with,
    even while the kernel is too busy to answer the click yet."""
    dash = Dashboard(
        demos / DRIFT, model=False
    )  # not displayed: no background worker, nothing clicked
    for title, box in zip(dash.TABS[1:], dash.tab.children[1:], strict=True):
        (spinner,) = box.children
        assert "ckpt-tab-loading" in spinner.value and "Building" in spinner.value, title
    assert "Building the table of 387 tensors" in dash.tab.children[1].children[0].value


def test_a_tab_built_in_a_thread_keeps_the_parent_of_the_click(demos: Path, monkeypatch):
    """ipykernel gives a message the parent in its `ContextVar`; a thread without its own
    context took the parent of whatever the kernel handled meanwhile, and when that handler
    drew progress bars into an Output (a consolidation, the next dashboard's scan), the page
    swallowed the thread's widgets: a grid or figure that never drew."""
    import contextvars
    import threading

    parent: contextvars.ContextVar[str] = contextvars.ContextVar("parent")
    gate, seen = threading.Event(), []

    from inspector.widgets.tabs import layers

    real = layers.LayersPanel

    def build(dash):
        assert gate.wait(30)
        seen.append(parent.get("none"))
        return real(dash)

    dash = Dashboard(demos / DRIFT, model=False)
    monkeypatch.setattr(layers, "LayersPanel", build)  # the tab table names it
    parent.set("the tab click")
    dash.tab.selected_index = dash.TABS.index("Layers")
    parent.set("a consolidation drawing progress bars")  # the kernel's next message
    gate.set()
    dash.panel("Layers")
    assert seen == ["the tab click"]


def test_a_tab_that_fails_to_build_says_why_in_the_tab(demos: Path, monkeypatch):
    from inspector.errors import InspectorError

    dash = Dashboard(demos / DRIFT, model=False)

    def broken(dash):
        raise InspectorError("model-00001-of-00004.safetensors: cannot read it")

    from inspector.widgets.tabs import layers

    monkeypatch.setattr(layers, "LayersPanel", broken)  # the tab table names it
    index = dash.TABS.index("Layers")
    dash.tab.selected_index = index
    _until(lambda: "ckpt-error" in str(getattr(dash.tab.children[index].children[0], "value", "")))
    assert "cannot read it" in dash.tab.children[index].children[0].value


def test_figures_use_units_on_axes_and_hover(demos: Path):
    from inspector.widgets.figures import bytes_per_layer, shard_size_distribution

    s = scan(demos / EP_COLLISION)
    sizes = shard_size_distribution(s.files)
    assert sizes.layout.yaxis.title.text in ("size (kB)", "size (MB)")
    assert sizes.data[0].customdata[0][0].endswith(("kB", "MB"))
    per_layer = bytes_per_layer(s.tensors)
    assert per_layer.layout.yaxis.title.text.startswith("size (")
    assert per_layer.layout.width is None and per_layer.layout.autosize


def test_header_does_not_clip_the_rescan_button(demos: Path):
    dash = Dashboard(demos / EP_COLLISION, model=False)
    (rescan,) = _buttons(dash.widget, "ckpt-rescan-button")
    assert rescan.layout.flex == "0 0 auto" and rescan.layout.min_width == "max-content"
    assert dash.header.layout.min_width == "0"


def test_static_snapshot_is_html_plus_png_outputs(demos: Path, monkeypatch):
    from IPython.core.interactiveshell import InteractiveShell

    published: list[tuple[dict, dict]] = []

    class Handle:
        def __init__(self, data):
            self.data = data
            published.append(data)

        def update(self, data, raw=True):
            self.data.clear()
            self.data.update(data)

    def display(data, raw=False, display_id=None):
        if display_id:
            return Handle(dict(data))
        published.append(dict(data))
        return None

    monkeypatch.setattr("IPython.display.display", display)
    fake_png = b"\x89PNG\r\n\x1a\nfake"
    dash = _Dashboard(demos / EP_COLLISION, progress=False, snapshot=True)
    dash._snapshot.render = lambda figures: [fake_png for _ in figures]
    dash.worker_delay = 0  # nothing is clicked before the worker is done: no page to give way to
    dash._ipython_display_()
    dash.wait(60)
    # The worker built every tab ahead of the first click.
    assert {"Tensors", "Experts", "Files", "Layers", "Repair", "Findings"} <= set(dash.panels)
    widget, text, *images = published
    assert "application/vnd.jupyter.widget-view+json" in widget
    assert "static snapshot below" in widget["text/plain"]
    html_out = text["text/html"]
    assert "ckpt-snapshot" in html_out and "448 of 512 experts missing" in html_out
    assert "re-export" in html_out and "config.json is not valid JSON" in html_out
    assert "<script" not in html_out
    assert [i["text/plain"] for i in images] == [
        "(expert coverage)",
        "(shard sizes)",
        "(bytes per layer)",
    ]
    assert all(i["image/png"] == fake_png for i in images)
    assert InteractiveShell  # the display hook is IPython's


# -- will it load? ------------------------------------------------------------------------------


def _held_verdict(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """From now on the dashboard's load verdict waits until the returned event is set (at
    most 60 s), as a slow load check would."""
    import inspector.widgets.dashboard as dashboard

    release = threading.Event()
    real = dashboard.verdict_apart

    def held(scanned, **options):
        release.wait(60)
        return real(scanned, **options)

    monkeypatch.setattr(dashboard, "verdict_apart", held)
    return release


def test_overview_draws_at_once_then_answers_will_it_load(demos: Path, monkeypatch):
    """The Overview shows the plain checks while the load verdict is computed in a thread;
    `state` waits for the verdict, and the Overview is redrawn with it."""
    release = _held_verdict(monkeypatch)
    dash = _Dashboard(demos / DRIFT, progress=False, snapshot=False)
    overview = _texts(dash.panels["Overview"].widget)
    assert "Will it load?" in overview and "checking" in overview
    assert dash.current.pending and dash.tab.titles[FINDINGS_TAB] == "Findings (44...)"
    assert "2 issues" in overview  # the plain checks' issues are there already
    release.set()
    dash.wait(60)
    assert not dash.current.pending and dash.current is dash.state
    assert dash.state.verdict is not None and dash.state.verdict.loads
    overview = _texts(dash.panels["Overview"].widget)
    assert "checking" not in overview and "data-loads='yes'" in overview
    assert "as <code>DeepseekV3ForCausalLM</code>" in overview
    assert dash.tab.titles[FINDINGS_TAB] == "Findings (44)"
    # The MTP layer transformers skips is named, with a link to its tensors.
    (mtp,) = _buttons(dash.panels["Overview"].widget, "ckpt-load-mtp")
    assert mtp.description == "MTP skipped (42)"
    mtp.click()
    assert dash.tab.selected_index == dash.TABS.index("Tensors")
    assert dash.panels["Tensors"].matches() == 42


def test_a_verdict_kept_in_the_cache_shows_without_starting_the_child(
    demos: Path, monkeypatch: pytest.MonkeyPatch
):
    """A checkpoint whose verdict the user's cache keeps (tests/test_verdict_cache.py): the
    dashboard shows it and starts no process for the load check; `cache=False` asks the
    child again."""
    pytest.importorskip("transformers")
    import inspector._internal.load.child as load_child
    from inspector._internal.load.verdict import load_verdict

    kept = load_verdict(scan(demos / DRIFT))  # kept in this test's cache
    # The process's own child, already running when an earlier test started it: asked
    # again below instead of a new one (a new child imports torch and transformers again).
    child = load_child._CHILD
    asked: list[dict] = []

    class NoChild(load_child.VerdictProcess):
        def __init__(self) -> None:
            super().__init__(
                "inspector._internal.load.child",
                what="the load check",
                seconds=load_child.VERDICT_SECONDS,
            )

        def start(self) -> None:
            raise AssertionError("the load check's process was started")

        def ask(self, request: dict) -> dict:
            asked.append(request)
            return super().ask(request)

    monkeypatch.setattr(load_child, "_CHILD", NoChild())
    dash = Dashboard(demos / DRIFT)
    assert dash.state.verdict == kept and dash.state.verdict.loads
    assert not asked and load_child._CHILD._process is None
    assert "data-loads='yes'" in _texts(dash.panels["Overview"].widget)
    state = CheckpointState.load(demos / DRIFT)  # a re-scan's state: no child either
    assert state.verdict == kept and not state.pending and not asked

    def recorded(request: dict) -> dict:
        asked.append(request)
        return load_child.VerdictProcess.ask(child, request)

    monkeypatch.setattr(child, "ask", recorded)
    monkeypatch.setattr(load_child, "_CHILD", child)  # now the child may be asked
    fresh = Dashboard(demos / DRIFT, cache=False)
    assert fresh.state.verdict == kept and len(asked) == 1 and asked[0]["cache"] is False


def test_load_check_off_says_so(demos: Path):
    dash = Dashboard(demos / DRIFT, model=False)
    assert dash.state.verdict is None and not dash.state.pending
    overview = _texts(dash.panels["Overview"].widget)
    assert "data-loads='unknown'" in overview and "the load check was off" in overview


def test_overview_links_what_will_not_load_and_says_how_to_fix_it(tmp_path: Path):
    pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    from hf_exports import resaved, tiny_deepseek_v3

    stray = "model.layers.0.self_attn.extra_proj.weight"

    def edit(state: dict) -> dict:
        kept = {k: v for k, v in state.items() if not k.startswith("lm_head.")}
        return {**kept, stray: torch.zeros(4, 4)}

    folder = resaved(tiny_deepseek_v3(tmp_path / "base"), tmp_path / "damaged", edit)
    dash = Dashboard(folder, report_dir=tmp_path / "reports")
    overview = dash.panels["Overview"].widget
    text = _texts(overview)
    assert "data-loads='no'" in text and "<b>1 missing</b>" in text and "lm_head.weight" in text
    assert "<b>1 unexpected</b>" in text
    # Each problem says what fixes it: restore the head from a reference.
    assert "expects 1 tensor the checkpoint does not hold (lm_head.weight)" in text
    assert f"ckpt-inspect repair {folder} --from REF" in text
    assert _buttons(overview, "ckpt-problem-load-missing-tensors")
    # Missing tensors are not in the checkpoint: the button lists their findings.
    (missing,) = _buttons(overview, "ckpt-load-missing")
    missing.click()
    drift = dash.panels["Findings"]
    assert dash.tab.selected_index == FINDINGS_TAB and drift.codes == ("load-missing-tensor",)
    assert [dash.state.findings[i].code for i in drift.shown()] == ["load-missing-tensor"]
    # The unexpected one is, and the button shows it.
    (unexpected,) = _buttons(overview, "ckpt-load-unexpected")
    unexpected.click()
    assert dash.panels["Tensors"].query.names == (stray,)
    assert dash.panels["Tensors"].matches() == 1
    # The Markdown summary and the HTML report carry the verdict.
    report = dash.select("Report")
    assert "- will it load: **no**" in report.show_markdown()
    written = report.write_report()
    assert written is not None and "<h2>Will it load?</h2>" in written.read_text()


def _lost_expert(tmp_path: Path) -> tuple[Path, Path]:
    """A tiny DeepSeek-V3 saved by transformers (the reference, beside it) and a copy that
    lost expert 1 of layer 2; its config.json names the reference (`_name_or_path`)."""
    from hf_exports import resaved, tiny_deepseek_v3

    original = tiny_deepseek_v3(tmp_path / "original", layers=3)
    lost = "model.layers.2.mlp.experts.1."

    def lose(state: dict) -> dict:
        return {k: v for k, v in state.items() if not k.startswith(lost)}

    broken = resaved(original, tmp_path / "broken", lose)
    config = json.loads((broken / CONFIG_NAME).read_text())
    config["_name_or_path"] = "original"
    (broken / CONFIG_NAME).write_text(json.dumps(config))
    return original, broken


def test_lost_experts_are_offered_back_and_shown_where_they_are_missing(tmp_path: Path):
    """The Overview said lost experts cannot be restored; a fused name's "show tensor" found
    0 tensors; filtering the missing expert showed 0 rows without a word. Now the issue
    offers the restore from the candidate reference, the fused name shows the stored
    experts of that projection, and a filter that selects the missing expert says so."""
    original, broken = _lost_expert(tmp_path)
    dash = Dashboard(broken)
    overview = dash.panels["Overview"].widget
    (issue,) = [p for p in dash.state.problems if p.key == "experts-missing"]
    assert issue.action.command == f"ckpt-inspect repair {broken} --from {original}"
    assert "re-run the exporter" not in _texts(overview)
    # A fused transformers name lands on the stored tensors behind it, with the missing one.
    fused = next(f for f in dash.state.findings if f.tensor and f.tensor.endswith("down_proj"))
    browser = dash.follow(fused)
    assert browser.matches() == 3
    count = browser.count.value
    assert "expert 1 of layer 2 is missing (expert-missing)" in count
    browser.set_query(TensorQuery(layer=2, expert=1))
    assert browser.matches() == 0
    assert "expert 1 of layer 2 is missing (expert-missing)" in browser.count.value
    browser.set_query(TensorQuery(layer=2, expert=3))
    assert browser.matches() > 0 and "missing" not in browser.count.value
    # Restore from...: the Repair tab plans the copy from the candidate and asks.
    (restore,) = _buttons(overview, "ckpt-problem-restore")
    restore.click()
    repair = dash.panels["Repair"]
    assert dash.tab.selected_index == dash.TABS.index("Repair")
    assert repair.source.value == str(original) and len(repair.plan.restored) == 3
    assert repair.worth_it and repair.confirm_box.layout.display is None
    repair.confirm.click()
    assert "Repaired." in dash.panel("Repair").result.value
    assert [f for f in dash.state.findings if f.severity != "info"] == []


def test_repair_all_from_the_overview_fixes_both_parts_at_once(demos: Path, tmp_path: Path):
    """Repairing the index first left the sidecar to repair next; Repair all plans both,
    previews that nothing is left, and leaves no issue."""
    folder = _copy(demos, DRIFT, tmp_path)
    dash = Dashboard(folder)
    (fix_all,) = _buttons(dash.panels["Overview"].widget, "ckpt-repair-all")
    fix_all.click()
    repair = dash.panels["Repair"]
    assert {w.path for w in repair.plan.writes} == {
        INDEX_NAME,
        "model-00004-of-00004.safetensors.json",
    }
    assert "fixes 44 of 44 findings" in repair.verdict.value
    assert "It cannot fix" not in repair.verdict.value
    repair.confirm.click()
    assert dash.state.findings == () and dash.state.problems == ()


def test_a_bug_shows_its_traceback_in_the_page_escaped():
    """A bug's error line carried only "the traceback is in the kernel log", which a person in
    the page cannot find: the traceback now sits behind a "details" toggle, every line legible
    (a hostile name in the message can neither inject markup nor forge a line)."""
    import ipywidgets as w
    from inspector.widgets.guard import guarded

    hostile = 'model.<img src=x onerror=alert(1)>\x1b[2J"\u202e.weight'

    def nested() -> None:
        raise RuntimeError(f"Cannot delete table with views: {hostile}")

    status = w.HTML()
    with pytest.raises(RuntimeError):
        guarded(nested, status)()
    page = status.value
    assert "kernel log" not in page and "<details" in page and "<summary>details</summary>" in page
    details = page[page.index("<details") :]
    assert "Traceback (most recent call last)" in details and "in nested" in details
    assert "<img" not in page and "&lt;img" in details and "\x1b" not in page
    assert "\u202e" not in page
    # An error the core raises on purpose is its message alone: no traceback.
    guarded(lambda: (_ for _ in ()).throw(ValueError("bad size")), status)()
    assert "bad size" in status.value and "<details" not in status.value


def test_an_empty_cell_of_the_expert_zoom_is_no_expert(tmp_path: Path):
    """On an 8-expert layer the zoom drew a row of 32 cells, and a click on the empty ninth
    one showed "expert 9" of a layer that has eight: the row is now as wide as the layer, and a
    click on a cell without an expert (a partial last row, an empty heatmap cell) does
    nothing."""
    import test_report_html

    moe = test_report_html.write_moe_checkpoint(tmp_path / "moe")
    experts = Dashboard(moe, model=False).select("Experts")
    layer = experts.zoomed
    zoom = experts.zoom.children[0]
    n = test_report_html.EXPERTS
    assert np.asarray(zoom.data[0].z, dtype=float).shape == (1, n)
    experts.show(layer, 2)
    before = experts.details.value

    def click(figure, x, y) -> None:
        figure._js2py_pointsCallback = {
            "event_type": "plotly_click",
            "points": {"xs": [x], "ys": [y], "point_indexes": [[0, x]], "trace_indexes": [0]},
        }

    click(zoom, n + 1, f"0-{n - 1}")  # where the old row's empty cell was
    click(experts.figure, n + 1, str(layer))
    assert experts.expert.value == 2 and experts.details.value == before
    assert f"expert {n + 1}" not in experts.details.value
    click(zoom, n - 1, f"0-{n - 1}")
    assert experts.expert.value == n - 1 and f"expert {n - 1}</h4>" in experts.details.value


def test_repair_is_enabled_by_the_plan_not_by_its_re_check(
    demos: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """The "Repair" button stayed disabled 12.6 s on a demo while the plan was re-checked; the
    click needs the plan alone. While the re-check still runs (held here), Repair is enabled
    and a click asks for confirmation; the re-check's answer then completes the question."""
    import threading

    from inspector.widgets.tabs import repair as actions

    dash = Dashboard(_copy(demos, DRIFT, tmp_path))
    repair = dash.panel("Repair")
    release, entered = threading.Event(), threading.Event()
    real = actions.preview_repair

    def held(*args, **kwargs):
        entered.set()
        release.wait(60)
        return real(*args, **kwargs)

    monkeypatch.setattr(actions, "preview_repair", held)
    planner = threading.Thread(target=repair.make_plan)
    planner.start()
    try:
        assert entered.wait(60)
        assert not repair.repair.disabled and repair.plan is not None
        assert "ckpt-repair-planning" in repair.verdict.value  # the re-check's spinner
        repair.repair.click()
        assert repair.confirm_box.layout.display != "none"
    finally:
        release.set()
        planner.join(60)
    assert repair.preview is not None and "It fixes" in repair.question.value
    assert repair.confirm_box.layout.display != "none" and "This plan fixes" in repair.verdict.value


def test_consolidate_buttons_are_disabled_with_the_reason_when_the_plan_will_refuse(
    demos: Path, tmp_path: Path
):
    """Consolidate stayed enabled where the tab knew the plan would refuse (issue 34 item 5):
    another layout disables both buttons from the start, a refused plan disables Consolidate
    until the form changes; the reason shows beside them and in their tooltip."""
    other = Dashboard(demos / "healthy-hf-sharded").select("Consolidate")
    assert other.run.disabled and other.plan_button.disabled
    assert "hf-sharded" in other.why.value and "hf-sharded" in other.run.tooltip
    other.dest.value = "/elsewhere"  # no form value lifts a refusal of the layout
    assert other.run.disabled

    form = Dashboard(_copy(demos, DCP_COLLAPSED, tmp_path)).select("Consolidate")
    assert not form.run.disabled and not form.why.value
    form.max_size.value = "lots"
    form.plan_button.click()
    assert form.run.disabled and "cannot read size" in form.why.value
    assert not form.plan_button.disabled  # asking again stays possible
    form.max_size.value = "5GB"  # the form changed: the refusal no longer holds
    assert not form.run.disabled and not form.why.value
    form.plan_button.click()
    assert not form.run.disabled and "cannot read size" not in form.status.value


def test_the_grid_module_loads_the_client_into_the_viewer_not_the_table():
    """perspective-python's widget module passed the table to the page's viewer
    (`viewer.load(table)`, which the viewer's docs ask to replace by loading the client and
    naming the table in `restore`). The grids' module does that for the installed version."""
    from inspector.widgets.grid import grid_class

    source = grid_class().class_traits()["_module_holder"].source
    assert "await n.load(o),await(async()=>{" in source and "table:a})})()" in source
    # Restored again while the model changed during a restore (the module listens to its
    # changes only after it): "show tensor"'s filter, sent just after the grid is shown.
    assert "(m=JSON.stringify(Ye.map(b=>e.get(b))))!==k" in source
    # The table is still loaded for a binding other than the server one, which it never is.
    assert source.count("await n.load(_)") == 1 and 's==="server"?' in source


def test_the_grid_module_leaves_out_the_engine_a_server_bound_grid_never_starts():
    """Perspective's widget module carried the page-side engine's WebAssembly (3.5 MB of
    base64 text, decoded by every page as the module was evaluated) though every grid here
    is bound to its table in the kernel. The grids' module leaves it out (2.8 MB, not 6.3)
    and keeps the viewer's client; a version it does not know is left as it is."""
    import re

    from inspector.widgets.grid import grid_module, server_binding_only

    source, _ = grid_module()
    literals = sorted(len(m) for m in re.findall(r'"[A-Za-z0-9+/=]{100000,}"', source))
    assert len(literals) == 1 and 2_000_000 < literals[0] < 2_500_000  # the client's
    assert len(source) < 3_000_000 and "page-side Perspective engine is left out" in source
    assert ".init_server(" in source  # registered still, handed over only if asked for
    unknown = source.replace(".init_server(", ".init_server_v6(")
    assert server_binding_only(unknown) == unknown


def test_the_dashboard_preloads_the_grids_module_its_grids_name(
    demos: Path, monkeypatch: pytest.MonkeyPatch
):
    """As the Overview is shown, the dashboard sends the grids' module to its `ModulePreload`
    (the page evaluates it once it rests, ahead of the first grid), then the figures'
    (evaluated by the first figure): the preload names the holder the grids name, under
    the key their stub looks for, so the module crosses once and is evaluated once."""
    from inspector.widgets import dashboard
    from inspector.widgets.esm import HOLDER_TRAIT
    from inspector.widgets.grid import grid_class, preload_grids

    sent: list[str] = []
    monkeypatch.setattr("IPython.display.display", lambda *_args, **_kwargs: None)
    monkeypatch.setattr(dashboard, "send_figure_module", lambda: sent.append("figures"))
    dash = _Dashboard(demos / DRIFT, progress=False, snapshot=False, model=False)
    dash.wait_when_headless = False
    preload = dash._preload
    assert preload in dash.widget.children and preload.modules == []
    assert ".ckpt-tab-loading" in preload.busy
    dash._ipython_display_()
    assert sent == ["figures"] and len(preload.modules) == 1  # before the worker's imports
    dash.wait(60)
    [(key, holder)] = preload.modules
    grid = dash.select("Tensors").grid
    assert holder is getattr(grid, HOLDER_TRAIT)
    assert f'const key = "{key}";' in grid_class()._esm
    preload_grids(preload)  # again (a second view): nothing changes
    assert preload.modules == [(key, holder)]


def test_the_overview_shows_when_perspectives_module_is_not_where_it_is_looked_for(
    demos: Path, monkeypatch: pytest.MonkeyPatch
):
    """The grids' module is read as the Overview is shown: a Perspective laid out otherwise
    (no widget/static/perspective-anywidget.js) leaves the Overview as it is; the first grid
    says what is wrong when its tab is opened."""
    from inspector.widgets import dashboard

    def moved(_preload: object) -> None:
        raise FileNotFoundError("perspective/widget/static/perspective-anywidget.js")

    shown: list[object] = []
    monkeypatch.setattr("IPython.display.display", lambda *args, **_kwargs: shown.append(args))
    monkeypatch.setattr(dashboard, "preload_grids", moved)
    dash = _Dashboard(demos / DRIFT, progress=False, snapshot=False, model=False)
    dash.wait_when_headless = False
    dash._ipython_display_()
    assert len(shown) == 1 and dash._preload.modules == []
    dash.wait(60)
    assert "Tensors" in dash.panels  # the worker went on


def test_findings_show_before_the_load_check_which_joins_them_in_a_slot_of_its_own(
    demos: Path, monkeypatch: pytest.MonkeyPatch
):
    """The Findings tab waited for the load check's child (3.5-7 s on this demo) before it
    showed the findings the scan and the structural checks already knew (issue 34 item 2).
    Now they show at once, the load check's part waits in its own slot with its own spinner,
    and its findings join the list on the page shown, the filters kept."""
    import dataclasses

    release = _held_verdict(monkeypatch)
    dash = _Dashboard(demos / DRIFT, progress=False, snapshot=False)
    built: list = []
    try:
        opener = threading.Thread(target=lambda: built.append(dash.select("Findings")))
        opener.start()
        opener.join(30)  # the old panel waited for the held verdict here
        assert built, "the Findings tab waited for the load check"
        (panel,) = built
        assert dash.current.pending
        assert "1-25 of 44" in panel.where.value and len(panel.rows.children) == 25
        assert dash.tab.children[FINDINGS_TAB].children == (panel.widget,)  # no tab spinner
        assert "ckpt-load-waiting" in panel.load.value
        assert "Waiting for the load check" in panel.load.value
        panel.next.click()
    finally:
        release.set()
    dash.wait(60)
    assert panel.findings == dash.state.findings and panel.start == 25
    assert "ckpt-load-waiting" not in panel.load.value
    assert "added no findings" in panel.load.value
    # What the load check adds is said in the slot and listed, the code filter kept.
    panel.code.value = "unindexed-tensor"
    extra = make_finding(
        "load-missing-tensor", "the model expects lm_head.weight", tensor="lm_head.weight"
    )
    findings = (*dash.state.findings, extra)
    panel.checked(dataclasses.replace(dash.state, findings=findings))  # its frame follows
    assert "added 1 finding (load-missing-tensor)" in panel.load.value
    assert panel.code.value == "unindexed-tensor" and "of 21" in panel.where.value
    assert "load-missing-tensor (1)" in [label for label, _ in panel.code.options]


def test_a_tab_built_while_the_load_check_finishes_takes_its_findings(
    demos: Path, monkeypatch: pytest.MonkeyPatch
):
    """A panel reads the dashboard's state, then asks `when_checked` for what comes later:
    when the load check finished in between, the Findings tab kept the plain checks'
    findings and its "Waiting for the load check" spinner for good (and the Files and
    Layers grids their first counts). What arrived meanwhile is now given at once."""
    from inspector.widgets.tabs.findings import FindingsPanel

    release = _held_verdict(monkeypatch)
    dash = _Dashboard(demos / DRIFT, progress=False, snapshot=False)
    assert dash.current.pending
    real = FindingsPanel.render

    def render_as_the_check_finishes(panel, start):
        # The tab's first page is drawn from the plain state; the verdict lands meanwhile.
        real(panel, start)
        if not dash._complete.done():
            release.set()
            dash.wait(60)

    monkeypatch.setattr(FindingsPanel, "render", render_as_the_check_finishes)
    try:
        panel = dash.panel("Findings")
    finally:
        release.set()
    assert not dash.current.pending
    assert panel.findings == dash.state.findings
    assert "Waiting for the load check" not in panel.load.value, panel.load.value


def test_plan_again_after_a_refused_restore_plans_the_repair(demos: Path, tmp_path: Path):
    """Plan again after Plan restore with no reference repeated the refusal: the
    refused restore stayed the choice. It now plans the repair, as before the restore."""
    dash = Dashboard(_copy(demos, DRIFT, tmp_path))
    repair = dash.select("Repair")
    assert repair.plan is not None and not repair.repair.disabled
    repair.source.value = ""
    (restore,) = _buttons(repair.widget, "ckpt-plan-restore")
    restore.click()
    assert "name the checkpoint to restore from" in repair.verdict.value
    assert repair.plan is None and repair.repair.disabled
    (again,) = _buttons(repair.widget, "ckpt-plan-button")
    again.click()
    assert "name the checkpoint to restore from" not in repair.verdict.value
    assert repair.plan is not None and not repair.plan.empty and not repair.repair.disabled
    assert "all parts at once" in repair.scope.value
    # A reference named in the field is tried again by Plan restore.
    repair.source.value = str(tmp_path / "no-such-reference")
    restore.click()
    assert "no-such-reference" in repair.verdict.value and repair.plan is None
    again.click()
    assert repair.plan is not None and not repair.repair.disabled


def test_files_tab_makes_its_figure_when_shown_after_its_grid(demos: Path, monkeypatch):
    """Building the Files tab made its figure, and the kernel's first figure costs plotly's
    template (0.6-1.9 s, 4.6 s of a first click at load 6): the tab is now built without
    it, and showing it makes the grid first, then the figure (the worker prepares the
    template meanwhile: `figures.prepare_template`)."""
    from inspector.widgets import figures

    made: list[bool] = []
    real = figures.shard_size_distribution

    def recorded(files):
        made.append(dash.panels["Files"].table.grid is not None)
        return real(files)

    monkeypatch.setattr(figures, "shard_size_distribution", recorded)
    dash = Dashboard(demos / DRIFT, model=False)
    dash.panel("Files")
    assert made == []
    dash.select("Files")
    assert made == [True]


def test_report_buttons_say_they_wait_for_the_load_check(demos: Path, monkeypatch):
    """The report and the summary carry the load verdict, so their clicks wait for it; they
    waited saying nothing. The status now says so until the answer comes."""
    release = _held_verdict(monkeypatch)
    dash = _Dashboard(demos / DRIFT, progress=False, snapshot=False)
    report = dash.panel("Report")
    clicked = threading.Thread(target=report.show_markdown)
    try:
        clicked.start()
        _until(lambda: "ckpt-report-waiting" in report.status.value)
        assert "Waiting for the load check" in report.status.value
    finally:
        release.set()
    clicked.join(60)
    assert report.status.value == "" and "will it load" in report.markdown.value


# The verdict's thread raises the bug again after publishing it (so a kernel logs it too).
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_load_check_that_raises_says_so_in_the_findings_tab(
    demos: Path, monkeypatch: pytest.MonkeyPatch
):
    """A bug in the load check left the Findings tab's "waiting" spinner turning forever: the
    slot now says the check failed, with its traceback behind "details"."""
    import inspector.widgets.dashboard as dashboard

    release = threading.Event()

    def broken(scanned, **options):
        release.wait(60)
        raise RuntimeError("the load check broke on purpose")

    monkeypatch.setattr(dashboard, "verdict_apart", broken)
    dash = _Dashboard(demos / DRIFT, progress=False, snapshot=False)
    panel = dash.select("Findings")
    assert "Waiting for the load check" in panel.load.value
    release.set()
    dash.wait(60)
    with pytest.raises(RuntimeError, match="broke on purpose"):
        dash.state  # noqa: B018 (the property raises the check's bug)
    deadline = time.monotonic() + 30
    while "Waiting for the load check" in panel.load.value and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "Waiting for the load check" not in panel.load.value
    assert "broke on purpose" in panel.load.value and "details" in panel.load.value


# The verdict's thread raises the bug again after publishing it (so a kernel logs it too).
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_findings_tab_first_opened_after_the_load_check_raised_says_so(
    demos: Path, monkeypatch: pytest.MonkeyPatch
):
    """A Findings tab first opened once the load check had raised registered for an answer
    that never came: its "Waiting for the load check" spinner turned for good."""
    import inspector.widgets.dashboard as dashboard

    def broken(scanned, **options):
        raise RuntimeError("the load check broke on purpose")

    monkeypatch.setattr(dashboard, "verdict_apart", broken)
    dash = _Dashboard(demos / DRIFT, progress=False, snapshot=False)
    dash.wait(60)
    assert dash.current.pending and "Findings" not in dash.panels
    panel = dash.select("Findings")
    assert "Waiting for the load check" not in panel.load.value
    assert "broke on purpose" in panel.load.value


def _watched(monkeypatch: pytest.MonkeyPatch) -> None:
    """The dashboard as a person's kernel makes it: not headless, and nothing of the load
    check runs before the Overview is sent (`_overview_sent`, set by displaying it)."""
    from types import SimpleNamespace

    import inspector.widgets.dashboard as dashboard

    monkeypatch.setattr(dashboard, "shell", lambda: SimpleNamespace(kernel=object()))
    monkeypatch.setattr(dashboard, "headless", lambda: False)
    monkeypatch.setattr(dashboard, "_VERDICT_HOLD", 60.0)


def test_a_watched_overview_shows_before_the_costliest_rules_then_their_issues(
    demos: Path, monkeypatch: pytest.MonkeyPatch
):
    """In a person's kernel the Overview is sent before the index and structure rules ran
    (0.3-0.5 s of a 2.2-3.2 s Overview at 300,000 tensors) and says so, never "No issues
    found"; once it is sent they run, and their issues, the Files tab's counts and the
    findings count arrive. The background worker's imports and tabs wait for them."""
    import inspector.widgets.dashboard as dashboard

    _watched(monkeypatch)
    worker_saw: list[tuple[str, ...]] = []
    monkeypatch.setattr(
        dashboard, "import_figure_widget", lambda: worker_saw.append(dash.current.unchecked)
    )
    dash = _Dashboard(demos / EP_COLLISION, progress=False, snapshot=False, model=False)
    # No delay: what keeps the worker off the tabs until the Overview is sent is under test.
    dash.worker_delay = 0
    dash._start_worker()  # as displaying it does, before the Overview is sent
    files = dash.select("Files").table
    assert dash.current.unchecked == ("index", "structure")
    assert not dash._complete.done()  # `state` waits for them
    overview = _texts(dash.panels["Overview"].widget)
    assert "checking the index and the structure..." in overview
    assert "No issues found" not in overview
    assert "checking the index and the structure..." in dash.header.value
    assert dash.tab.titles[FINDINGS_TAB].endswith("...)")
    assert not any(f.code == "expert-missing" for f in dash.current.findings)
    assert files.frame["findings"].sum() == 0
    dash._overview_sent.set()  # what displaying it does
    dash.wait(60)
    assert dash.current is dash.state and not dash.state.unchecked
    missing = [f for f in dash.state.findings if f.code == "expert-missing"]
    assert missing
    overview = _texts(dash.panels["Overview"].widget)
    assert "checking the" not in overview and "so far" not in overview
    assert "checking the" not in dash.header.value
    assert dash.tab.titles[FINDINGS_TAB] == f"Findings ({len(dash.state.findings)})"
    assert files.frame["findings"].sum() >= len(missing)
    assert worker_saw == [()]


def test_a_dashboard_nobody_watches_runs_every_rule_before_its_overview(
    demos: Path, monkeypatch: pytest.MonkeyPatch
):
    """Asked to wait (`wait=True`), headless (nbconvert), or outside a kernel, the first
    state already holds every plain rule's findings: nothing is left for later."""
    dash = _Dashboard(demos / EP_COLLISION, progress=False, snapshot=False, model=False)
    assert not dash.current.unchecked and dash._complete.done()
    _watched(monkeypatch)
    waits = _Dashboard(demos / EP_COLLISION, progress=False, snapshot=False, model=False, wait=True)
    assert not waits.current.unchecked and waits._complete.done()
    assert waits.current.findings == dash.current.findings


def test_the_load_checks_child_starts_with_the_scan_only_when_asked(
    demos: Path, monkeypatch: pytest.MonkeyPatch
):
    """`VERDICT_WITH_SCAN` (measured by benchmarks/bench_overview.py --orders) starts the
    load check's child before the scan; by default it starts once the Overview is sent."""
    import inspector.widgets.dashboard as dashboard

    order: list[str] = []
    real_scan = dashboard.CheckpointState.load

    def load(*args, **kwargs):
        order.append("scan")
        return real_scan(*args, **kwargs)

    monkeypatch.setattr(dashboard, "start_verdict_process", lambda: order.append("child"))
    monkeypatch.setattr(dashboard.CheckpointState, "load", load)
    monkeypatch.setattr(dashboard, "verdict_apart", lambda scanned, **_: None)
    monkeypatch.setattr(dashboard, "start_verdict_for", lambda scanned, **_: None)
    Dashboard(demos / DRIFT)
    assert order == ["scan"]
    monkeypatch.setattr(dashboard, "VERDICT_WITH_SCAN", True)
    Dashboard(demos / DRIFT)
    assert order == ["scan", "child", "scan"]


def test_the_load_checks_child_starts_once_the_overview_is_sent_before_the_deferred_rules(
    demos: Path, monkeypatch: pytest.MonkeyPatch
):
    """Nothing of the load check runs before the Overview is sent; then its child starts
    first (it imports torch and transformers on the other core while the kernel runs the
    deferred rules, instead of waiting for them), and the verdict is asked for once their
    issues are shown."""
    import inspector.widgets.dashboard as dashboard

    from inspector._internal.load.verdict import LoadVerdict

    _watched(monkeypatch)
    seen: list[tuple[str, tuple[str, ...]]] = []

    def child(scanned, **_) -> None:
        seen.append(("child", dash.current.unchecked))

    def verdict(scanned, **_) -> LoadVerdict:
        seen.append(("verdict", dash.current.unchecked))
        return LoadVerdict(skipped="not asked in this test")

    monkeypatch.setattr(dashboard, "start_verdict_for", child)
    monkeypatch.setattr(dashboard, "verdict_apart", verdict)
    dash = _Dashboard(demos / DRIFT, progress=False, snapshot=False)
    assert seen == [] and dash.current.unchecked == ("index", "structure")
    dash._overview_sent.set()  # what displaying it does
    dash.wait(60)
    assert seen == [("child", ("index", "structure")), ("verdict", ())]
    assert dash.state.verdict == LoadVerdict(skipped="not asked in this test")


def test_figures_place_holder_is_marked_not_drawn_until_the_tab_shows_them():
    """The line that stands for a tab's figures carries the class the grids' line carries
    (`NOT_DRAWN`): the dashboard's module preload waits while one shows, and a page (the lab
    clicks test's first-click times) tells it from a drawn figure. It once had none, so an
    Experts tab whose heatmap was not yet made counted as drawn. Showing the figures
    replaces it."""
    import plotly.graph_objects as go
    from inspector.widgets.controls import NOT_DRAWN
    from inspector.widgets.plot import FigureBox

    box = FigureBox([(go.Figure(go.Bar(x=[1], y=[2])), "ckpt-test-figure")])
    (line,) = box.box.children
    assert NOT_DRAWN in line._dom_classes
    shown = box.show()
    assert list(box.box.children) == shown and len(shown) == 1
    assert NOT_DRAWN not in shown[0]._dom_classes
    assert "ckpt-test-figure" in shown[0]._dom_classes


def test_the_expert_grid_is_known_without_building_the_tables(demos: Path, tmp_path: Path):
    """`has_expert_grid` (whether the snapshot has an expert heatmap and the Overview's issue
    an "On the heatmap" button, both asked before they are sent) says what the experts
    table's rows say: from the scan's figures when experts are stored, building no table;
    from the table when none is, where a config that declares experts still has a grid of
    them, all missing, and a checkpoint without layers has none."""
    from safetensors.torch import load_file, save_file

    from inspector.ui import has_expert_grid

    healthy = demos / "healthy-hf-sharded"
    stored = scan(healthy)
    assert has_expert_grid(stored) and "tables" not in vars(stored)
    assert len(stored.experts)
    kept = {}
    for shard in sorted(healthy.glob("*.safetensors")):
        kept |= {n: t for n, t in load_file(shard).items() if ".experts." not in n}
    lost = tmp_path / "experts-lost"
    lost.mkdir()
    shutil.copy(healthy / CONFIG_NAME, lost / CONFIG_NAME)
    save_file(kept, str(lost / SAFETENSORS_WEIGHTS_NAME), metadata={"format": "pt"})
    gone = scan(lost)
    assert has_expert_grid(gone)
    assert len(gone.experts) and not gone.experts["tensors_found"].any()
    bare = tmp_path / "no-layers"
    bare.mkdir()
    outside = {n: t for n, t in kept.items() if ".layers." not in n}
    assert outside, "the demo's tensors changed: this case would check nothing"
    save_file(outside, str(bare / SAFETENSORS_WEIGHTS_NAME), metadata={"format": "pt"})
    none = scan(bare)
    assert not has_expert_grid(none) and not len(none.experts)
