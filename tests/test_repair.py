"""Repair plans: shown first, executed atomically with a backup, idempotent, data untouched."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from modelopt_writer import mtp_tensors, tiny_layer_state_dicts, write_modelopt_export
from safetensors.torch import save_file

from inspector import check, scan
from inspector._internal.checkpoint.parameters import count_parameters
from inspector._internal.cli.main import main
from inspector._internal.common.filenames import INDEX_NAME
from inspector._internal.execution import atomic
from inspector._internal.load.verdict import load_verdict
from inspector._internal.plans.repair import plan_index, plan_repair, plan_sidecars

INDEX = INDEX_NAME
REPAIRABLE = {
    "index-dangling-tensor",
    "index-wrong-file",
    "index-missing-file",
    "unindexed-tensor",
    "unindexed-file",
    "total-size-mismatch",
    "total-parameters-mismatch",
    "sidecar-missing",
    "sidecar-unlisted-tensor",
    "sidecar-dangling-tensor",
    "sidecar-total-size-mismatch",
    "sidecar-index-disagree",
}


def _digests(folder: Path) -> dict[str, str]:
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.glob("*.safetensors"))
    }


def _drifted_export(folder: Path) -> Path:
    """The modelopt-1422 export: MTP tensors in the last shard, absent from sidecar and index."""
    layers = tiny_layer_state_dicts(3)
    return write_modelopt_export(folder, layers, late={3: mtp_tensors()})


def test_modelopt_1422_repair_makes_mtp_visible(tmp_path: Path) -> None:
    folder = _drifted_export(tmp_path / "ckpt")
    before = {f.code for f in check(scan(folder))}
    assert {"unindexed-tensor", "sidecar-unlisted-tensor"} <= before
    shards_before = _digests(folder)

    plan = plan_repair(scan(folder))
    text = plan.describe()
    assert INDEX in text and "model-00003-of-00003.safetensors.json" in text
    assert "mtp.layers.0.eh_proj.weight" in plan.diff()
    result = plan.execute()

    assert not ({f.code for f in result.remaining} & REPAIRABLE)
    index = json.loads((folder / INDEX).read_text())
    assert index["weight_map"]["mtp.layers.0.eh_proj.weight"] == "model-00003-of-00003.safetensors"
    sidecar = json.loads((folder / "model-00003-of-00003.safetensors.json").read_text())
    assert "mtp.layers.0.enorm.weight" in sidecar["weight_map"]
    assert _digests(folder) == shards_before, "tensor data must never be rewritten"
    assert result.backup_dir is not None
    backed_up = json.loads((result.backup_dir / INDEX).read_text())
    assert "mtp.layers.0.eh_proj.weight" not in backed_up["weight_map"]


def test_repair_twice_changes_nothing_the_second_time(tmp_path: Path) -> None:
    folder = _drifted_export(tmp_path / "ckpt")
    plan_repair(scan(folder)).execute()
    snapshot = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}
    second = plan_repair(scan(folder))
    assert second.empty and not second.refused
    assert "nothing to repair" in second.describe()
    assert {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()} == snapshot


def test_index_rebuild_keeps_other_metadata_and_recomputes_totals(tmp_path: Path) -> None:
    folder = _drifted_export(tmp_path / "ckpt")
    index = json.loads((folder / INDEX).read_text())
    index["metadata"]["producer"] = "exporter 1.2"
    (folder / INDEX).write_text(json.dumps(index))
    plan = plan_index(scan(folder))
    (write,) = plan.writes
    new = json.loads(write.new)
    assert new["metadata"]["producer"] == "exporter 1.2"
    tensors = scan(folder).tensors
    assert new["metadata"]["total_size"] == int(tensors["nbytes"].sum())
    assert new["metadata"]["total_parameters"] == int(tensors["numel"].sum())
    assert any("total_size" in c for c in write.changes)
    assert any("3 tensors added" in c for c in write.changes)


def test_conflicting_duplicate_is_refused_unless_a_policy_is_given(tmp_path: Path) -> None:
    folder = _drifted_export(tmp_path / "ckpt")
    name = "model.layers.0.input_layernorm.weight"
    save_file({name: torch.zeros(3, dtype=torch.float32)}, str(folder / "extra.safetensors"))
    plan = plan_index(scan(folder))
    assert plan.empty and any(name in r and "--duplicates" in r for r in plan.refused)
    kept = plan_index(scan(folder), duplicates="first")
    new = json.loads(kept.writes[0].new)
    assert new["weight_map"][name] == "extra.safetensors"  # sorted first
    kept_last = plan_index(scan(folder), duplicates="index")
    assert (
        json.loads(kept_last.writes[0].new)["weight_map"][name]
        == "model-00001-of-00003.safetensors"
    )


def test_unreadable_shard_refuses_index_rebuild(tmp_path: Path) -> None:
    folder = _drifted_export(tmp_path / "ckpt")
    (folder / "model-00002-of-00003.safetensors").write_bytes(b"\x01\x02")
    plan = plan_index(scan(folder))
    assert plan.empty and "unreadable" in plan.refused[0]


def test_sidecar_created_for_shard_without_one(tmp_path: Path) -> None:
    folder = _drifted_export(tmp_path / "ckpt")
    (folder / "model-00002-of-00003.safetensors.json").unlink()
    assert "sidecar-missing" in {f.code for f in check(scan(folder))}
    plan = plan_sidecars(scan(folder))
    assert any(
        w.old is None and w.path.endswith("00002-of-00003.safetensors.json") for w in plan.writes
    )
    result = plan_repair(scan(folder)).execute()
    assert not ({f.code for f in result.remaining} & REPAIRABLE)


def test_plan_aborts_when_files_changed_after_planning(tmp_path: Path) -> None:
    folder = _drifted_export(tmp_path / "ckpt")
    plan = plan_repair(scan(folder))
    (folder / INDEX).write_text('{"weight_map": {}}')
    with pytest.raises(Exception, match="changed since the repair was planned"):
        plan.execute()


@pytest.mark.parametrize("crash_after", [0, 1])
def test_interrupted_repair_leaves_originals_or_complete_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, crash_after: int
) -> None:
    """A crash during the renames: every file is whole (old or new), and the next run finishes."""
    folder = _drifted_export(tmp_path / "ckpt")
    originals = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}
    plan = plan_repair(scan(folder))
    targets = {w.path: w.new.encode() for w in plan.writes}
    assert len(targets) == 2  # the index and the last sidecar: crash before each rename
    real_replace = os.replace
    calls = {"n": 0}

    def crashing_replace(src, dst, **dir_fds):
        if calls["n"] >= crash_after:
            raise KeyboardInterrupt("simulated kill")
        calls["n"] += 1
        return real_replace(src, dst, **dir_fds)

    monkeypatch.setattr(atomic.os, "replace", crashing_replace)
    with pytest.raises(KeyboardInterrupt):
        plan.execute()
    monkeypatch.setattr(atomic.os, "replace", real_replace)
    for name, old in originals.items():
        now = (folder / name).read_bytes()
        assert now == old or now == targets.get(name), f"{name} is neither original nor repaired"
    (folder / atomic.LOCK).unlink(missing_ok=True)  # the killed process would have left it
    atomic.recover(folder)
    for name, new in targets.items():
        assert (folder / name).read_bytes() == new
    assert not (folder / atomic.JOURNAL).exists()


def test_cli_repair_dry_run_writes_nothing_and_yes_executes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = _drifted_export(tmp_path / "ckpt")
    before = (folder / INDEX).read_bytes()
    assert main(["repair", str(folder), "--dry-run"]) == 0
    assert (folder / INDEX).read_bytes() == before
    assert "tensors added" in capsys.readouterr().out
    assert main(["repair", str(folder), "--yes", "--only", "index"]) == 0
    out = capsys.readouterr().out
    assert "backup:" in out
    assert "mtp.layers.0.enorm.weight" in json.loads((folder / INDEX).read_text())["weight_map"]
    # sidecars were not asked for: they still drift
    assert "sidecar-unlisted-tensor" in {f.code for f in check(scan(folder))}


GOLDEN = Path(__file__).resolve().parent / "fixtures" / "writers"


@pytest.mark.parametrize(
    ("case", "stated"),
    [("modelopt/hf-nvfp4", 16_736), ("modelopt/hf-fp8", 29_024), ("transformers/glm4-moe", None)],
)
def test_total_parameters_counted_as_its_writer_counts(
    case: str, stated: int | None, tmp_path: Path
) -> None:
    """Model-Optimizer's count leaves out quantization scales (NVFP4: 16,736 of 18,318 stored
    elements, packed weights per byte), transformers' leaves out buffers
    (e_score_correction_bias): both are healthy, without a model to say so, and a repair
    that changes nothing else keeps the writer's count. An index rebuilt with a tensor back
    states the one count the project shows everywhere (values: NVFP4 unpacked, scales and
    buffers left out), which is the model's own count, and is clean too."""
    folder = tmp_path / "ckpt"
    shutil.copytree(GOLDEN / case, folder)
    index = json.loads((folder / INDEX).read_text())
    stated = stated or index["metadata"]["total_parameters"]
    assert index["metadata"]["total_parameters"] == stated
    scanned = scan(folder)
    assert int(scanned.tensors["numel"].sum()) > stated
    assert [f for f in check(scanned, model=False) if f.severity != "info"] == []
    assert plan_repair(scanned).empty
    # Drop an entry: the rebuilt index lists it again, with the project's count.
    dropped = next(
        n for n in index["weight_map"] if n.endswith(("weight_scale", "correction_bias"))
    )
    file = index["weight_map"].pop(dropped)
    (folder / INDEX).write_text(json.dumps(index, indent=2))
    (write,) = plan_index(scan(folder)).writes
    rebuilt = json.loads(write.new)["metadata"]["total_parameters"]
    ours = count_parameters(scanned.tensors, config=scanned.config)
    assert rebuilt == ours == load_verdict(scanned).parameters
    assert f"total_parameters {stated} -> {ours}" in write.changes or stated == ours
    (folder / INDEX).write_text(write.new)
    assert [f for f in check(scan(folder)) if f.severity != "info"] == []
    # A count no writer gives is reported with the ways each writer counts.
    index["metadata"]["total_parameters"] = stated + 1
    index["weight_map"][dropped] = file
    (folder / INDEX).write_text(json.dumps(index, indent=2))
    (f,) = [f for f in check(scan(folder), model=False) if f.code == "total-parameters-mismatch"]
    assert f"{stated:,} with" in f.message and "none of them this" in f.message
