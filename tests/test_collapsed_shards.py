"""automodel-2289 on the Hugging Face side: every tensor in one file over the 5 GB split size,
and what transformers writes as one file."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

from inspector import check, scan
from inspector._internal.checks.sharding import check_collapsed_shards
from inspector._internal.common.filenames import INDEX_NAME
from inspector._internal.plans.reshard import plan_reshard


def test_collapsed_demo_is_flagged_against_a_smaller_limit_and_reshard_clears_it(
    tmp_path: Path, copy_demos
) -> None:
    copy_demos(tmp_path)
    folder = tmp_path / "automodel-2289-collapsed"
    scanned = scan(folder)
    assert check_collapsed_shards(scanned) == []  # 78 kB: fine at the 5 GB default
    (finding,) = check_collapsed_shards(scanned, limit=50_000)
    assert finding.code == "mapping-collapsed"
    assert "all 173 tensors" in finding.message and "repair --only reshard" in finding.message
    plan_reshard(scanned, max_shard_size=50_000).execute()
    assert check_collapsed_shards(scan(folder), limit=50_000) == []


def _six_gigabytes(folder: Path, name: str) -> Path:
    """A sparse file (data region left as a hole) with a valid header of 6 GB of tensors."""
    folder.mkdir()
    header, offset = {}, 0
    for layer in range(6):
        n = 10**9 // 2  # 1 GB of BF16
        header[f"model.layers.{layer}.mlp.down_proj.weight"] = {
            "dtype": "BF16",
            "shape": [n],
            "data_offsets": [offset, offset + 2 * n],
        }
        offset += 2 * n
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    path = folder / name
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(raw)) + raw)
    os.truncate(path, 8 + len(raw) + offset)
    return folder


def test_a_six_gigabyte_single_file_is_flagged_by_default(tmp_path: Path) -> None:
    folder = _six_gigabytes(tmp_path / "ckpt", "model-00001-of-00001.safetensors")
    codes = [f.code for f in check(scan(folder))]
    assert codes == ["mapping-collapsed"]


def test_one_model_safetensors_as_transformers_5_saves_it_is_no_collapse(tmp_path: Path) -> None:
    """transformers 5's save_pretrained writes a model under 50 GB as one model.safetensors
    and no index: nothing was lost, a loader reads it (check said mapping-collapsed over 5 GB).
    The same file named alone by an index is what a consolidation that lost its mapping
    leaves: still the finding."""
    folder = _six_gigabytes(tmp_path / "ckpt", "model.safetensors")
    assert [f.code for f in check(scan(folder))] == []
    names = (f"model.layers.{layer}.mlp.down_proj.weight" for layer in range(6))
    weight_map = dict.fromkeys(names, "model.safetensors")
    (folder / INDEX_NAME).write_text(
        json.dumps({"metadata": {"total_size": 6 * 10**9}, "weight_map": weight_map})
    )
    assert "mapping-collapsed" in {f.code for f in check(scan(folder))}
