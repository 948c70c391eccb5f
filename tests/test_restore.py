"""`repair --from REF`: tensors a checkpoint lost (MTP layers, lm_head, experts) copied back from
a reference into one new shard, with the index (and sidecars) updated, atomically, existing
shards never modified; on real save_pretrained output and Model-Optimizer-style exports."""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from hf_exports import modelopt_export, resaved, state_of, tiny_deepseek_v3
from modelopt_writer import INDEX, load_json, save_json
from safetensors.torch import load_file

from inspector._internal.checks import check
from inspector._internal.cli.main import main
from inspector._internal.common.filenames import CONFIG_NAME
from inspector._internal.load.verdict import load_verdict
from inspector._internal.plans.consolidate.engine import AGAIN
from inspector._internal.plans.repair import plan_repair
from inspector._internal.plans.restore import plan_restore
from inspector._internal.scan.entry import scan
from inspector.errors import InspectorError

transformers = pytest.importorskip("transformers")

LAYERS = 3
MTP = f"model.layers.{LAYERS}."
EXPERT = "model.layers.1.mlp.experts.2."


@pytest.fixture(scope="module")
def original(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_deepseek_v3(tmp_path_factory.mktemp("orig") / "ckpt", layers=LAYERS)


def lose(*prefixes: str):
    """An export that lost every tensor starting with one of `prefixes`."""
    return lambda s: {k: v for k, v in s.items() if not k.startswith(prefixes)}


def digests(folder: Path) -> dict[str, str]:
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.glob("*.safetensors")
    }


def load_codes(folder: Path) -> set[str]:
    return {f.code for f in check(scan(folder)) if f.code.startswith(("load-", "mtp-", "expert"))}


def test_mtp_lm_head_and_an_expert_come_back(original: Path, tmp_path: Path) -> None:
    broken = resaved(original, tmp_path / "ckpt", lose(MTP, "lm_head.", EXPERT))
    # transformers' DeepSeek-V3 class never stores MTP: its loss reads as mtp-not-stored,
    # the info whose advice is this restore.
    assert {"load-missing-tensor", "load-shape-mismatch", "mtp-not-stored"} <= load_codes(broken)
    before = digests(broken)
    plan = plan_restore(scan(broken), scan(original), verify_data=True)
    lost = {n for n in state_of(original)[0] if n.startswith((MTP, "lm_head.", EXPERT))}
    assert set(plan.restored) == lost and plan.refused == ()
    assert plan.shard == "model-restored-00001.safetensors"
    assert "create model-restored-00001.safetensors" in plan.describe()
    assert '"model-restored-00001.safetensors"' in plan.diff()
    result = plan.execute()
    assert result.data_checked == len(lost)
    # Existing shards untouched, one shard added, the old index kept in the backup.
    after = digests(broken)
    assert {k: after[k] for k in before} == before and set(after) - set(before) == {plan.shard}
    assert (result.backup_dir / INDEX).is_file()
    assert load_codes(broken) == set() and result.remaining == ()
    restored = load_file(broken / plan.shard)
    reference = state_of(original)[0]
    assert set(restored) == lost
    assert all(torch.equal(restored[n], reference[n]) for n in lost)
    index = load_json(broken / INDEX)
    assert {n for n, f in index["weight_map"].items() if f == plan.shard} == lost
    assert set(load_verdict(scan(broken)).mtp_skipped) == {n for n in lost if n.startswith(MTP)}


def test_a_quantized_export_takes_experts_only_in_its_own_format(
    original: Path, tmp_path: Path
) -> None:
    full = modelopt_export(original, tmp_path / "nvfp4", "NVFP4", experts_only=True)
    broken = resaved(full, tmp_path / "broken", lose(EXPERT))
    # The BF16 original cannot give a NVFP4 expert back: its siblings are packed U8.
    plan = plan_restore(scan(broken), scan(original))
    assert plan.empty and len(plan.refused) == 2  # gate/up and down have their own shapes
    want = "the reference stores it as F32 [16, 32], its siblings in the checkpoint are U8 [16, 16]"
    assert want in plan.refused[1]
    assert all("experts.2." in r for r in plan.refused)
    # Another copy of the same export can: weights and scales come back.
    plan = plan_restore(scan(broken), scan(full))
    assert plan.refused == () and all(n.startswith(EXPERT) for n in plan.restored)
    assert {n.rpartition(".")[2] for n in plan.restored} == {
        "weight", "weight_scale", "weight_scale_2", "input_scale"
    }  # fmt: skip
    plan.execute()
    assert load_codes(broken) == set()


def test_tied_head_is_not_restored(original: Path, tmp_path: Path) -> None:
    broken = resaved(original, tmp_path / "ckpt", lose("lm_head."))
    config = load_json(broken / CONFIG_NAME)
    config["tie_word_embeddings"] = True
    save_json(broken / CONFIG_NAME, config)
    plan = plan_restore(scan(broken), scan(original))
    assert plan.empty and "ties it to the input embedding" in plan.notes[0]


def test_per_layer_export_gets_a_sidecar_for_the_new_shard(tmp_path: Path, copy_demos) -> None:
    copy_demos(tmp_path / "demos")
    healthy = tmp_path / "demos" / "healthy-modelopt-per-layer"
    mtp = "mtp."  # the Megatron-export spelling of its MTP layer
    broken = resaved(healthy, tmp_path / "ckpt", lose(mtp))
    plan_repair(scan(broken), only={"sidecars"}).execute()
    assert "mtp-missing" in load_codes(broken)
    plan = plan_restore(scan(broken), scan(healthy))
    assert [w.path for w in plan.writes] == [INDEX, f"{plan.shard}.json"]
    plan.execute()
    scanned = scan(broken)
    assert scanned.layout == "modelopt-per-layer" and check(scanned) == []
    sidecar = json.loads((broken / f"{plan.shard}.json").read_text())
    assert set(sidecar["weight_map"]) == set(plan.restored)


def test_refusals_and_a_changed_index(original: Path, tmp_path: Path) -> None:
    single = tmp_path / "single"
    single.mkdir()
    shutil.copy(next(original.glob("model-00001-*.safetensors")), single / "model.safetensors")
    shutil.copy(original / CONFIG_NAME, single / CONFIG_NAME)
    plan = plan_restore(scan(single), scan(original))
    assert plan.empty and "loaders read model.safetensors alone" in plan.refused[0]
    assert plan_restore(scan(original), scan(original)).refused
    broken = resaved(original, tmp_path / "ckpt", lose(MTP))
    plan = plan_restore(scan(broken), scan(original))
    (broken / INDEX).write_text((broken / INDEX).read_text().replace("{", "{ ", 1))
    with pytest.raises(InspectorError, match="changed since the restore was planned"):
        plan.execute()
    assert not list(broken.glob("*restored*")) and not (broken / ".ckpt-inspect-restore").exists()


def test_cli_repair_from(original: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    broken = resaved(original, tmp_path / "ckpt", lose(MTP))
    assert main(["repair", str(broken), "--from", str(original), "--dry-run"]) == 0
    assert "restore plan for" in capsys.readouterr().out
    assert not list(broken.glob("*restored*"))
    assert main(["repair", str(broken), "--from", str(original), "--yes", "--verify-data"]) == 0
    out = capsys.readouterr().out
    assert "hold the reference's bytes" in out and "re-check: no findings" in out
    assert main(["repair", str(broken), "--verify-data"]) == 2


def test_a_reference_cut_while_it_is_copied_changes_nothing(
    original: Path, tmp_path: Path, cut_on_open: Callable[[Path], dict[str, int]]
) -> None:
    """Another process cuts the reference's shard in half as soon as the restore opens it:
    the copy comes back short. The restore raises the project's error naming the shard, the
    byte where it ended and what to do; the checkpoint is as it was (no new shard, the same
    index, no staging folder left)."""
    reference = tmp_path / "reference"
    shutil.copytree(original, reference)
    broken = resaved(original, tmp_path / "ckpt", lose(MTP))
    before = {p.name: p.read_bytes() for p in broken.iterdir() if p.is_file()}
    plan = plan_restore(scan(broken), scan(reference))
    cut = cut_on_open(reference)
    with pytest.raises(InspectorError) as raised:
        plan.execute()
    ((file, at),) = cut.items()
    message = str(raised.value)
    assert str(reference / file) in message and AGAIN in message, message
    assert f"the file ended at byte {at:,}: it got shorter while it was read" in message
    assert sorted(p.name for p in broken.iterdir()) == sorted(before)
    assert {n: (broken / n).read_bytes() for n in before} == before


def test_unreadable_shards_are_one_refusal_line_however_many(
    original: Path, tmp_path: Path
) -> None:
    """A reference whose shards are all truncated is refused in one line that counts them,
    names the first few and points to `check`, not one line per shard."""
    broken = resaved(original, tmp_path / "ckpt", lose(MTP))
    reference = tmp_path / "reference"
    shutil.copytree(original, reference)
    shards = sorted(reference.glob("*.safetensors"))
    for shard in shards:
        shard.write_bytes(shard.read_bytes()[:7])  # shorter than the header's length prefix
    plan = plan_restore(scan(broken), scan(reference))
    assert plan.empty
    lines = [r for r in plan.refused if "unreadable or invalid header" in r]
    assert len(lines) == 1, plan.refused
    assert lines[0].startswith(f"{len(shards)} shards of ") and "ckpt-inspect check" in lines[0]
    assert shards[0].name in lines[0] and len(lines[0]) < 600
