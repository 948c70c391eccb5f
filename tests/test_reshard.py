"""Re-sharding a collapsed checkpoint (seed automodel-2289): new shards under the limit, the
old file moved to the backup, every tensor byte unchanged."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from inspector import check, scan
from inspector._internal.checks.diff import diff_checkpoints
from inspector._internal.cli.main import main
from inspector._internal.common.filenames import INDEX_NAME
from inspector._internal.plans.reshard import plan_reshard

INDEX = INDEX_NAME


def _collapsed(folder: Path, layers: int = 12) -> Path:
    """What the collapsed consolidation wrote: every tensor in one file, with its index."""
    rng = np.random.default_rng(0)
    tensors = {}
    for layer in range(layers):
        tensors[f"model.layers.{layer}.self_attn.q_proj.weight"] = rng.standard_normal(
            (16, 16)
        ).astype(np.float32)
        tensors[f"model.layers.{layer}.mlp.experts.0.up_proj.weight"] = rng.integers(
            0, 255, (16, 8), dtype=np.uint8
        )
    tensors["model.embed_tokens.weight"] = rng.standard_normal((64, 16)).astype(np.float32)
    folder.mkdir(parents=True)
    save_file(tensors, str(folder / "model-00001-of-00001.safetensors"), metadata={"format": "pt"})
    total = sum(t.nbytes for t in tensors.values())
    index = {
        "metadata": {"total_size": total},
        "weight_map": dict.fromkeys(tensors, "model-00001-of-00001.safetensors"),
    }
    (folder / INDEX).write_text(json.dumps(index))
    return folder


def test_automodel_2289_collapsed_file_is_resharded_under_the_limit(tmp_path: Path) -> None:
    original = _collapsed(tmp_path / "original")
    folder = _collapsed(tmp_path / "ckpt")
    plan = plan_reshard(scan(folder), max_shard_size="4kB")
    assert not plan.refused and not plan.empty
    assert "retire model-00001-of-00001.safetensors" in plan.describe()
    names = [o.name for o in plan.copy.outputs]
    assert len(names) > 2 and all(n.endswith(f"-of-{len(names):05d}.safetensors") for n in names)
    # huggingface_hub's rule: greedy, each shard's tensor bytes under the limit unless one
    # tensor alone is larger (the 4 kB embedding here)
    for output in plan.copy.outputs:
        assert output.data_bytes <= 4000 or len(output.tensors) == 1

    result = plan.execute()
    assert result.remaining == ()
    assert not (folder / "model-00001-of-00001.safetensors").exists()
    assert (result.backup_dir / "model-00001-of-00001.safetensors").exists()
    assert sorted(p.name for p in folder.glob("*.safetensors")) == sorted(names)
    d = diff_checkpoints(scan(original), scan(folder), data=True)
    assert d.identical and d.data_compared == 25
    # model order, not lexicographic: layer 2 is written before layer 10
    wm = json.loads((folder / INDEX).read_text())["weight_map"]
    assert (
        wm["model.layers.2.self_attn.q_proj.weight"]
        <= wm["model.layers.10.self_attn.q_proj.weight"]
    )


def test_reshard_is_a_no_op_when_everything_fits(tmp_path: Path) -> None:
    folder = _collapsed(tmp_path / "ckpt", layers=2)
    plan = plan_reshard(scan(folder))
    assert plan.empty and "fit in one shard" in plan.notes[0]


def test_reshard_refuses_dcp_sharded_input(tmp_path: Path) -> None:
    from inspector._internal.demo.dcp import write_dcp_demo

    folder = write_dcp_demo(tmp_path / "dcp")
    plan = plan_reshard(scan(folder))
    assert plan.empty and "consolidate" in plan.refused[0]


def test_cli_repair_only_reshard(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = _collapsed(tmp_path / "ckpt")
    assert (
        main(["repair", str(folder), "--only", "reshard", "--max-shard-size", "4kB", "--yes"]) == 0
    )
    out = capsys.readouterr().out
    assert "re-check: no findings" in out
    assert check(scan(folder)) == []
