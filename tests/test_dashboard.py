"""The dashboard driven without a browser: set widget values, click buttons (their on_click
handlers run), feed the heatmap the click message the frontend sends, and check what the core
did on disk. Every test that writes works on a copy of a demo checkpoint."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from inspector.widgets import Dashboard

from inspector.consolidate import reference_assignment
from inspector.findings import CODE_HELP, CODES, make_finding
from inspector.html_repr import scanned_html
from inspector.scan import scan

pytest.importorskip("ipywidgets")

DRIFT = "modelopt-1422-sidecar-drift"
EP_COLLISION = "modelopt-1631-ep-collision"
DCP_COLLAPSED = "automodel-2289-dcp-mapping-collapsed"


@pytest.fixture(scope="module")
def demos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from inspector.demo import write_demos

    target = tmp_path_factory.mktemp("demos")
    write_demos(target, log=lambda _line: None)
    return target


def _copy(demos: Path, name: str, tmp_path: Path) -> Path:
    return Path(shutil.copytree(demos / name, tmp_path / name))


def _weight_map(folder: Path) -> dict[str, str]:
    return json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]


def test_every_code_is_explained():
    assert set(CODE_HELP) == set(CODES)
    assert all(len(text) > 20 for text in CODE_HELP.values())


def test_opens_with_overview_only_and_counts_findings(demos: Path, tmp_path: Path):
    dash = Dashboard(_copy(demos, DRIFT, tmp_path))
    assert list(dash.panels) == ["Overview"]  # the other tabs wait for their first selection
    n = len(dash.state.findings)
    assert n > 0 and dash.tab.titles[4] == f"Drift ({n})"
    overview = dash.panels["Overview"].widget.children[0].value
    assert "modelopt-per-layer" in overview and "unindexed-tensor" in overview
    assert "modelopt-per-layer" in dash.header.value and "error" in dash.header.value
    dash.tab.selected_index = dash.TABS.index("Layers")  # what a click on the tab does
    assert "Layers" in dash.panels
    assert dash.tab.children[3].children == (dash.panels["Layers"].widget,)


def test_repair_asks_for_confirmation_then_repairs_backs_up_and_refreshes(
    demos: Path, tmp_path: Path
):
    folder = _copy(demos, DRIFT, tmp_path)
    before = (folder / "model.safetensors.index.json").read_text()
    dash = Dashboard(folder)
    drift_before = dash.select("Drift")
    repair = dash.select("Repair")
    assert "mtp.layers.0" in repair.plan_view.value and "+" in repair.plan_view.value
    # 1. Repair only asks; Cancel writes nothing.
    repair.repair.click()
    assert repair.confirm_box.layout.display is None and repair.repair.disabled
    assert "backed up" in repair.question.value
    repair.cancel.click()
    assert repair.confirm_box.layout.display == "none"
    assert (folder / "model.safetensors.index.json").read_text() == before
    # 2. Repair, then Confirm: the index lists the MTP tensors, the old file is backed up.
    repair.repair.click()
    repair.confirm.click()
    assert any(name.startswith("mtp.") for name in _weight_map(folder))
    backups = list((folder / ".ckpt-inspect-backup").iterdir())
    assert len(backups) == 1
    assert (backups[0] / "model.safetensors.index.json").read_text() == before
    # 3. Every tab was refreshed from a re-scan.
    assert dash.state.findings == () and dash.tab.titles[4] == "Drift (0)"
    after = dash.panel("Repair")
    assert after is not repair and "Repaired." in after.result.value
    assert str(backups[0]) in after.result.value and after.plan.empty and after.repair.disabled
    drift_after = dash.select("Drift")
    assert drift_after is not drift_before and "No findings." in drift_after.table.value


def test_rescan_button_picks_up_changes_on_disk(demos: Path, tmp_path: Path):
    folder = _copy(demos, DRIFT, tmp_path)
    dash = Dashboard(folder)
    (folder / "config.json").write_text('{"model_type": "deepseek_v3", "num_hidden')
    dash.widget.children[0].children[1].click()
    assert "config-unreadable" in {f.code for f in dash.state.findings}
    assert "config-unreadable" in dash.panels["Overview"].widget.children[0].value


def test_repair_of_a_changed_file_is_refused_and_shown(demos: Path, tmp_path: Path):
    folder = _copy(demos, DRIFT, tmp_path)
    repair = Dashboard(folder).select("Repair")
    # Someone rewrites the index between planning and confirming.
    (folder / "model.safetensors.index.json").write_text('{"weight_map": {}}')
    repair.repair.click()
    repair.confirm.click()
    assert "changed since the repair was planned" in repair.result.value
    assert _weight_map(folder) == {}


def test_heatmap_click_lists_the_experts_tensors(demos: Path):
    dash = Dashboard(demos / EP_COLLISION)
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
    click(3, 300)
    assert "expert-missing" in experts.details.value and "64-511" in experts.details.value
    # The picker does the same without the figure.
    experts.layer.value, experts.expert.value = 1, 0
    experts.widget.children[1].children[2].click()
    assert "model.layers.1.mlp.experts.0.gate_proj.weight" in experts.details.value


def test_drift_filters_by_severity_and_code_and_explains(demos: Path, tmp_path: Path):
    drift = Dashboard(_copy(demos, DRIFT, tmp_path)).select("Drift")
    drift.severity.value = "warning"
    table = drift.table.value
    assert 'data-severity="warning"' in table and 'data-severity="error"' not in table
    drift.severity.value = "all"
    drift.code.value = "unindexed-tensor"
    assert set(_codes(drift.table.value)) == {"unindexed-tensor"}
    help_text = CODE_HELP["unindexed-tensor"].replace("'", "&#x27;")
    assert help_text in drift.help.value and "sidecar-missing" not in drift.help.value


def _codes(table: str) -> list[str]:
    return [part.split('"', 1)[0] for part in table.split('data-code="')[1:]]


def test_consolidate_tab_writes_verified_output(demos: Path, tmp_path: Path):
    folder = _copy(demos, DCP_COLLAPSED, tmp_path)
    form = Dashboard(folder).select("Consolidate")
    # A bad size is refused in the panel, nothing is written.
    form.dest.value = str(tmp_path / "out")
    form.max_size.value = "lots"
    form.run.click()
    assert "cannot read size" in form.status.value and not (tmp_path / "out").exists()
    # With the reference model's assignment the output has the reference's 4 files.
    table, _ = reference_assignment(folder / ".hf_metadata" / "model.safetensors.index.json")
    mapping = tmp_path / "mapping.json"
    mapping.write_text(json.dumps(table))
    form.mapping.value, form.max_size.value = str(mapping), "5GB"
    form.verify_data.value, form.workers.value = True, 2
    result = form.execute()
    assert result is not None and result.ok and result.data_checked == len(table)
    written = scan(tmp_path / "out")
    assert len(written.files) == 4 and sorted(_weight_map(tmp_path / "out")) == sorted(table)
    assert "verified: no finding" in form.status.value and not form.run.disabled


def test_consolidate_refuses_other_layouts_in_the_panel(demos: Path):
    form = Dashboard(demos / "healthy-hf-sharded").select("Consolidate")
    assert "hf-sharded" in form.widget.children[0].value
    assert form.make_plan() is None and "not DCP-sharded" in form.status.value


def test_report_tab_writes_html_and_shows_markdown(demos: Path, tmp_path: Path):
    dash = Dashboard(demos / EP_COLLISION, report_dir=tmp_path / "reports")
    report = dash.select("Report")
    report.widget.children[1].children[0].click()
    target = tmp_path / "reports" / f"{EP_COLLISION}-report.html"
    text = target.read_text()
    assert text.startswith("<!DOCTYPE html>") or "<html" in text[:200]
    assert "expert-missing" in text and str(target) in report.status.value
    report.widget.children[1].children[1].click()
    assert report.markdown.value.startswith("### Checkpoint inspection")
    assert "`expert-missing`" in report.markdown.value and report.markdown.layout.display is None


def test_torch_dist_checkpoint_opens_every_tab(demos: Path):
    dash = Dashboard(demos / "megatron-4448-rerun-drift")
    for title in dash.TABS:
        dash.select(title)
    assert _codes(dash.panels["Drift"].table.value) == ["torch-dist-common-drift"]
    assert "nothing to repair" in dash.panels["Repair"].plan_view.value
    assert dash.panels["Repair"].repair.disabled


def test_dense_checkpoint_has_no_expert_picker(tmp_path: Path):
    import torch
    from safetensors.torch import save_file

    folder = tmp_path / "dense"
    folder.mkdir()
    state = {f"model.layers.{i}.mlp.up_proj.weight": torch.ones(8, 4) for i in range(3)}
    save_file(state, folder / "model.safetensors", metadata={"format": "pt"})
    dash = Dashboard(folder)
    experts = dash.select("Experts")
    assert experts.layer.options == ()
    experts.widget.children[1].children[2].click()
    assert "No MoE layer" in experts.details.value
    assert "No MoE experts" in experts.figure.layout.annotations[0].text
    assert "No findings." in dash.select("Drift").table.value


def test_repr_html_summarizes_and_escapes(demos: Path):
    scanned = scan(demos / EP_COLLISION)
    card = scanned._repr_html_()
    assert "modelopt-per-layer" in card and "config-unreadable" in card
    assert "model-00004-of-00004.safetensors" in card and "512" in card
    hostile = make_finding("unindexed-tensor", "holds '<script>alert(1)</script>'")
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
    repair.widget.children[1].children[2].click()  # "Plan again"
    assert not repair.repair.disabled and "REFUSED" not in repair.plan_view.value
    repair.repair.click()
    repair.confirm.click()
    assert "Repaired." in dash.panel("Repair").result.value
    assert _weight_map(folder)[name] != "stray.safetensors"
