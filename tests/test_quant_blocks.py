"""MXFP4 and block-FP8 checkpoints (golden fixtures) damaged beyond the golden cases."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from inspector._internal.checks import check
from inspector._internal.common.filenames import CONFIG_NAME
from inspector._internal.scan.entry import scan

GOLDEN = Path(__file__).resolve().parent / "fixtures" / "writers"


def _mismatches(folder: Path) -> list[str]:
    return [
        f.message for f in check(scan(folder), model=False) if f.code == "quant-scheme-mismatch"
    ]


def _edit_config(folder: Path, **changes: object) -> None:
    config = json.loads((folder / CONFIG_NAME).read_text())
    config["quantization_config"].update(changes)
    (folder / CONFIG_NAME).write_text(json.dumps(config))


def test_mxfp4_blocks_in_a_module_not_to_convert(tmp_path: Path) -> None:
    folder = tmp_path / "m"
    shutil.copytree(GOLDEN / "mxfp4" / "gpt-oss", folder)
    config = json.loads((folder / CONFIG_NAME).read_text())
    keep = config["quantization_config"]["modules_to_not_convert"]
    _edit_config(folder, modules_to_not_convert=[*keep, "model.layers.1.mlp.experts"])
    found = _mismatches(folder)
    assert len(found) == 2  # gate_up_proj and down_proj of layer 1
    assert all("layers.1.mlp.experts" in m and "modules_to_not_convert" in m for m in found)


def test_fp8_block_size_is_read_from_the_config(tmp_path: Path) -> None:
    """The same tensors under a 64x64 block: every scale that is [1, 1] for 128 is wrong."""
    folder = tmp_path / "m"
    shutil.copytree(GOLDEN / "fp8-block" / "deepseek-v3", folder)
    assert _mismatches(folder) == []
    _edit_config(folder, weight_block_size=[64, 64])
    found = _mismatches(folder)
    assert found and all("block [64, 64]" in m for m in found)
