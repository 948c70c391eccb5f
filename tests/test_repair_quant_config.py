"""Opt-in repair of hf_quant_config.json: missing expert entries are added where every sibling
expert of the layer shares one config, refused where they disagree."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from inspector import check, scan
from inspector._internal.cli.main import main
from inspector._internal.common.filenames import QUANT_CONFIG_NAME
from inspector._internal.plans.repair import plan_quant_config, plan_repair

QUANT = QUANT_CONFIG_NAME


@pytest.fixture(scope="module")
def demos(tmp_path_factory: pytest.TempPathFactory, copy_demos) -> Path:
    out = tmp_path_factory.mktemp("demos")
    copy_demos(out)
    return out


def _export_missing_entries(demos: Path, dest: Path, drop: str) -> tuple[Path, dict]:
    """The healthy Model-Optimizer export with the quant entries of matching modules removed."""
    folder = dest / "ckpt"
    shutil.copytree(demos / "healthy-modelopt-per-layer", folder)
    doc = json.loads((folder / QUANT).read_text())
    original = dict(doc["quantization"]["quantized_layers"])
    doc["quantization"]["quantized_layers"] = {k: v for k, v in original.items() if drop not in k}
    (folder / QUANT).write_text(json.dumps(doc, indent=4))
    return folder, original


def test_missing_expert_entries_are_restored_from_their_siblings(
    demos: Path, tmp_path: Path
) -> None:
    folder, original = _export_missing_entries(demos, tmp_path, "model.layers.2.mlp.experts.5.")
    assert "quant-config-missing-layer" in {f.code for f in check(scan(folder))}
    # opt-in: the default repair leaves the quant config alone
    assert not [w for w in plan_repair(scan(folder)).writes if w.path == QUANT]
    plan = plan_quant_config(scan(folder))
    (write,) = plan.writes
    assert "3 entries added" in write.changes[0]
    assert main(["repair", str(folder), "--only", "quant-config", "--yes"]) == 0
    restored = json.loads((folder / QUANT).read_text())["quantization"]["quantized_layers"]
    assert restored == original
    assert check(scan(folder)) == []


def test_entries_are_refused_when_siblings_disagree(demos: Path, tmp_path: Path) -> None:
    folder, _ = _export_missing_entries(demos, tmp_path, "model.layers.2.mlp.experts.5.")
    doc = json.loads((folder / QUANT).read_text())
    layers = doc["quantization"]["quantized_layers"]
    sibling = next(
        k for k in layers if k.startswith("model.layers.2.mlp.experts.") and k.endswith("up_proj")
    )
    layers[sibling] = {**layers[sibling], "group_size": 32}
    (folder / QUANT).write_text(json.dumps(doc))
    plan = plan_quant_config(scan(folder))
    assert any("different configs" in r and "experts.5.up_proj" in r for r in plan.refused)
    added = json.loads(plan.writes[0].new)["quantization"]["quantized_layers"]
    assert "model.layers.2.mlp.experts.5.up_proj" not in added
    assert "model.layers.2.mlp.experts.5.down_proj" in added
