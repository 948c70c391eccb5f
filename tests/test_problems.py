"""Problems (findings grouped by root cause, with impact and action) and repair previews (what
a plan fixes, by re-checking the checkpoint as the plan would leave it), on the seed demos."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from inspector._internal.checks import check
from inspector._internal.common.filenames import CONFIG_NAME, QUANT_CONFIG_NAME
from inspector._internal.demo.safetensors_layouts import (
    automodel_2289,
    healthy_per_layer,
    megatron_3624,
    modelopt_1422,
    modelopt_1631,
)
from inspector._internal.diagnosis.issues import group_problems
from inspector._internal.findings.codes import Code
from inspector._internal.findings.finding import make_finding
from inspector._internal.plans.repair import plan_repair, preview_repair, scanned_after
from inspector._internal.scan.entry import scan

WRITERS = {
    "modelopt-1422": modelopt_1422,
    "modelopt-1631": modelopt_1631,
    "healthy-per-layer": healthy_per_layer,
    "megatron-3624": megatron_3624,
    "automodel-2289": automodel_2289,
}


@pytest.fixture(scope="module")
def demos(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("problem-demos")
    out = {}
    for name, write in WRITERS.items():
        (root / name).mkdir()
        write(root / name)
        out[name] = root / name
    return out


def test_seed_1422_is_two_problems_not_44_findings(demos):
    scanned = scan(demos["modelopt-1422"])
    findings = check(scanned)
    assert len(findings) == 44
    problems = group_problems(scanned, findings)
    assert [p.key for p in problems] == ["index-misses-tensors", "sidecars-disagree"]
    index, sidecar = problems
    # Impact in words and numbers, computed from the shards (the findings fold after 20).
    assert index.title == "model.safetensors.index.json misses 42 MTP tensors (mtp.layers.0.*)"
    assert index.impact.startswith("42 MTP tensors (17.1 kB) invisible to loaders")
    assert len(index.tensors) == 42 and all(t.startswith("mtp.layers.0.") for t in index.tensors)
    assert sidecar.title.startswith("model-00004-of-00004.safetensors.json misses the same 42")
    assert set(sidecar.tensors) == set(index.tensors)
    # The action says what fixes it and that it is fixable here.
    assert index.action.kind == "repair" and index.action.parts == ("index",)
    assert sidecar.action.parts == ("sidecars",) and sidecar.repairable
    assert index.action.command.endswith("--only index")
    # The stale totals are explained by the same missing tensors.
    assert {"unindexed-tensor", "total-size-mismatch"} == set(index.codes)
    assert {"sidecar-unlisted-tensor", "sidecar-total-size-mismatch"} == set(sidecar.codes)


def test_seed_1631_says_what_restores_it(demos):
    """No JSON repair here fixes seed 1631; what does is said: the lost experts come back
    from a reference (`repair --from REF`, or a re-export), config.json is copied back."""
    scanned = scan(demos["modelopt-1631"])
    problems = group_problems(scanned, check(scanned))
    by_key = {p.key: p for p in problems}
    assert set(by_key) == {"experts-missing", "config-unreadable"}
    experts = by_key["experts-missing"]
    assert experts.title == "448 of 512 experts missing in 3 MoE layers (1-3) and MTP layer 4"
    assert experts.action.kind == "restore" and not experts.repairable
    assert experts.action.command.endswith("--from REF") and "re-export" in experts.action.text
    assert experts.cells == ((1, None), (2, None), (3, None), (4, None))
    config = by_key["config-unreadable"]
    assert config.action.kind == "restore"
    assert config.action.command.startswith("cp REF/config.json ")
    assert not any(p.repairable for p in problems)


def test_every_finding_belongs_to_exactly_one_problem(demos):
    for folder in demos.values():
        scanned = scan(folder)
        findings = check(scanned)
        problems = group_problems(scanned, findings)
        grouped = [f for p in problems for f in p.findings]
        assert sorted(grouped, key=repr) == sorted(findings, key=repr), folder.name
        assert all(p.title and p.impact and p.action.text for p in problems)


def test_a_code_no_rule_explains_is_a_problem_in_its_own_words(demos):
    scanned = scan(demos["megatron-3624"])
    (problem,) = group_problems(scanned, check(scanned))
    assert problem.key == "layer-keyset-outlier" and problem.severity == "warning"
    assert problem.title.startswith(
        "MTP layer 4 carries self_attention.core_attention._extra_state entries"
    )
    assert problem.cells == ((4, None),) and problem.action.kind == "review"


def test_modules_a_quant_config_leaves_out_are_one_issue_per_file(demos):
    """config.json's quantization_config is reviewed by a person, hf_quant_config.json is
    repaired here: the same code makes two issues, told apart by the findings' file."""
    scanned = scan(demos["healthy-per-layer"])
    files = (CONFIG_NAME, QUANT_CONFIG_NAME, QUANT_CONFIG_NAME)
    findings = [
        make_finding(Code.QUANT_CONFIG_MISSING_LAYER, f"layer {i} left out", file=f, tensor=f"t{i}")
        for i, f in enumerate(files)
    ]
    by_key = {p.key: p for p in group_problems(scanned, findings)}
    in_config = by_key["quant-config-missing-layers-config"]
    sidecar = by_key["quant-config-missing-layers"]
    assert in_config.title == "config.json's quantization_config leaves out 1 quantized module"
    assert in_config.files == (CONFIG_NAME,) and in_config.action.kind == "review"
    assert sidecar.title == "hf_quant_config.json lacks 2 quantized modules"
    assert sidecar.files == (QUANT_CONFIG_NAME,) and sidecar.tensors == ("t1", "t2")
    assert sidecar.action.parts == ("quant-config",) and sidecar.repairable


def test_preview_of_the_1422_repair_fixes_every_finding(demos, tmp_path):
    folder = Path(shutil.copytree(demos["modelopt-1422"], tmp_path / "c"))
    scanned = scan(folder)
    findings = check(scanned)
    plan = plan_repair(scanned)
    preview = preview_repair(plan, scanned, findings=findings)
    assert set(preview.fixes) == set(findings) and preview.remains == ()
    assert preview.introduces == () and preview.matters
    # Only the index part: the sidecar findings remain, exactly.
    index_only = plan_repair(scanned, only={"index"}).preview(scanned, findings=findings)
    assert {f.code for f in index_only.fixes} == {"unindexed-tensor", "total-size-mismatch"}
    assert {f.code for f in index_only.remains} == {
        "sidecar-unlisted-tensor",
        "sidecar-total-size-mismatch",
    }
    # ... and the sidecars now disagree with the rebuilt index, which the preview says.
    assert {f.code for f in index_only.introduces} == {"sidecar-index-disagree"}
    assert index_only.matters
    # In issues, as the Repair tab shows them: the whole plan fixes both and leaves none; the
    # index part fixes the index's issue and leaves the sidecars' one.
    problems = group_problems(scanned, findings)
    assert len(problems) == 2
    assert preview.issues(problems) == (list(problems), [])
    fixed, left = index_only.issues(problems)
    assert len(fixed) == len(left) == 1 and fixed != left
    assert {f.code for f in left[0].findings} <= {f.code for f in index_only.remains}
    # The preview is what really happens: execute and compare.
    result = plan.execute()
    assert result.remaining == preview.remains == ()


def test_preview_of_the_1631_plan_fixes_nothing_that_matters(demos, cli):
    scanned = scan(demos["modelopt-1631"])
    findings = check(scanned)
    plan = plan_repair(scanned)
    # It would add total_parameters to an index that states none: no finding is about its
    # absence (total-parameters-mismatch is about a stated count), so it fixes none.
    ((write,),) = (plan.writes,)
    count = json.loads(write.new)["metadata"]["total_parameters"]
    assert write.changes == (f"total_parameters {count} added (the index stated none)",)
    preview = plan.preview(scanned, findings=findings)
    assert preview.fixes == () and set(preview.remains) == set(findings)
    assert not preview.matters
    # The CLI's preview says what it changes, not "fixes 0 findings".
    out = cli("repair", "--dry-run", "--no-model", demos["modelopt-1631"]).stdout
    said = (
        "preview (every check re-run on the planned files, in memory): fixes no finding; it "
        f"changes {write.path}: total_parameters {count} added (the index stated none)\n"
    )
    assert said in out
    assert "0 findings" not in out


def test_scanned_after_substitutes_the_planned_json_and_shares_the_tables(demos):
    scanned = scan(demos["modelopt-1422"])
    tables = scanned.tables
    plan = plan_repair(scanned)
    after = scanned_after(plan, scanned)
    assert after.tables is tables and after is not scanned
    new_index = json.loads(next(w.new for w in plan.writes if w.path.endswith("index.json")))
    assert after.index.weight_map == new_index["weight_map"]
    sidecar = after.sidecars["model-00004-of-00004.safetensors"]
    assert any(n.startswith("mtp.") for n in sidecar.weight_map)
    # Nothing on disk changed.
    assert scan(demos["modelopt-1422"]).index.weight_map == scanned.index.weight_map
    assert check(after) == []


def test_an_unindexed_copy_of_an_indexed_shard_is_not_an_index_missing_0_tensors(tmp_path):
    # huggingface_hub's writer, then a shard copied under a name the index does not give: its
    # one tensor is listed (from the original), so the index misses no tensor.
    torch = pytest.importorskip("torch")
    from huggingface_hub import save_torch_state_dict

    folder = tmp_path / "ckpt"
    folder.mkdir()
    state = {f"model.layers.{i}.w": torch.zeros(64, 64) for i in range(4)}
    save_torch_state_dict(state, folder, max_shard_size="20KB")
    first = sorted(folder.glob("model-0*.safetensors"))[0]
    shutil.copy(first, folder / "extra.safetensors")
    scanned = scan(folder)
    findings = check(scanned)
    assert {f.code for f in findings} == {Code.DUPLICATE_TENSOR, Code.UNINDEXED_FILE}
    problems = group_problems(scanned, findings)
    assert "index-misses-tensors" not in [p.key for p in problems]
    assert not any("misses 0" in p.title for p in problems)
    (unindexed,) = [p for p in problems if Code.UNINDEXED_FILE in {f.code for f in p.findings}]
    assert unindexed.severity.name == "WARNING"
    # Its title is the message's first clause, not cut at the "; " inside its parentheses.
    assert unindexed.title.startswith("extra.safetensors holds 1 tensor (layers 0; e.g. ")
    assert unindexed.title.count("(") == unindexed.title.count(")")
