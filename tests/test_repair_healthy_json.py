"""Regression: shard files an index or sidecar spells `./x`, `.//x` or `././/x` (transformers
joins them onto the folder and loads them; the checks read them as `x`) counted as every tensor
moved: a repair planned to rewrite a healthy index, its preview said "fixes 0 findings", and
`--duplicates index` lost the index's choice."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from huggingface_hub import save_torch_state_dict
from modelopt_writer import tiny_layer_state_dicts, write_modelopt_export
from safetensors.torch import load_file, save_file

from inspector import check, scan
from inspector._internal.cli.main import main
from inspector._internal.common.filenames import INDEX_NAME
from inspector._internal.plans.repair import (
    plan_index,
    plan_repair,
    plan_sidecars,
    preview_repair,
)

SPELLINGS = ("./", ".//", "././/")


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three shards and their index as huggingface_hub's `save_torch_state_dict` writes them."""
    gen = torch.Generator().manual_seed(0)
    state = {
        f"model.layers.{i}.{part}.weight": torch.randn(8, 8, generator=gen)
        for i in range(3)
        for part in ("q_proj", "o_proj")
    }
    folder = tmp_path_factory.mktemp("hub")
    save_torch_state_dict(state, folder, max_shard_size=600)
    assert len(list(folder.glob("*.safetensors"))) == 3
    # Stated as transformers' save_pretrained states it (a repair adds it where it is absent).
    doc = json.loads((folder / INDEX_NAME).read_text())
    doc["metadata"]["total_parameters"] = sum(t.numel() for t in state.values())
    (folder / INDEX_NAME).write_text(json.dumps(doc, indent=2))
    return folder


def _copy(written: Path, tmp_path: Path) -> Path:
    folder = tmp_path / "ckpt"
    folder.mkdir()
    for p in written.iterdir():
        (folder / p.name).write_bytes(p.read_bytes())
    return folder


def _edit_index(folder: Path, prefix: str = "") -> dict:
    """The index as written, every shard named `prefix + name`; returns it."""
    doc = json.loads((folder / INDEX_NAME).read_text())
    doc["weight_map"] = {k: prefix + v for k, v in doc["weight_map"].items()}
    (folder / INDEX_NAME).write_text(json.dumps(doc, indent=2))
    return doc


def _nothing_to_repair(folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    scanned = scan(folder)
    assert check(scanned, model=False) == []
    plan = plan_repair(scanned)
    assert plan.empty and not plan.refused, plan.describe()
    assert main(["repair", str(folder), "--dry-run", "--no-model"]) == 0
    assert capsys.readouterr().out == f"{folder}: nothing to repair\n"
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before


# -- shard files spelled ./x, .//x, ././/x -----------------------------------------------------


@pytest.mark.parametrize("prefix", SPELLINGS)
def test_healthy_index_spelled_differently_is_not_rewritten(
    written: Path, tmp_path: Path, prefix: str, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = _copy(written, tmp_path)
    _edit_index(folder, prefix)
    _nothing_to_repair(folder, capsys)


def test_healthy_sidecars_spelled_differently_are_not_rewritten(tmp_path: Path) -> None:
    folder = write_modelopt_export(tmp_path / "ckpt", tiny_layer_state_dicts(2))
    for sidecar in folder.glob("*.safetensors.json"):
        doc = json.loads(sidecar.read_text())
        doc["weight_map"] = {k: f"././/{v}" for k, v in doc["weight_map"].items()}
        sidecar.write_text(json.dumps(doc, indent=4))
    assert plan_sidecars(scan(folder)).empty


@pytest.mark.parametrize("prefix", SPELLINGS)
def test_preview_counts_the_findings_the_repair_fixes(
    written: Path, tmp_path: Path, prefix: str, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = _copy(written, tmp_path)
    doc = _edit_index(folder, prefix)
    shards = sorted({f.removeprefix(prefix) for f in doc["weight_map"].values()})
    moved = next(k for k, v in doc["weight_map"].items() if v == prefix + shards[0])
    doc["weight_map"][moved] = prefix + shards[-1]
    doc["metadata"]["total_size"] += 2
    (folder / INDEX_NAME).write_text(json.dumps(doc, indent=2))
    scanned = scan(folder)
    found = check(scanned, model=False)
    assert sorted(f.code for f in found) == ["index-wrong-file", "total-size-mismatch"]

    plan = plan_repair(scanned)
    (write,) = plan.writes
    # Only the entry that names another file is a move; the others are respelled.
    assert write.changes[0] == f"1 tensors moved: {moved} {shards[-1]} -> {shards[0]}"
    assert write.changes[-1].startswith(
        f"file names written as the shards are named: {prefix}{shards[0]} -> {shards[0]}"
    )
    preview = preview_repair(plan, scanned, model=False)
    assert sorted(preview.fixes, key=str) == sorted(found, key=str)
    assert preview.remains == preview.introduces == ()
    assert main(["repair", str(folder), "--dry-run", "--no-model"]) == 0
    assert "fixes 2 findings" in capsys.readouterr().out

    result = plan.execute(model=False)
    assert result.remaining == ()
    after = json.loads((folder / INDEX_NAME).read_text())["weight_map"]
    assert after == {
        **{k: v.removeprefix(prefix) for k, v in doc["weight_map"].items()},
        moved: shards[0],
    }


def test_duplicates_policy_index_keeps_the_file_the_index_spells(
    written: Path, tmp_path: Path
) -> None:
    """A tensor in two shards: `--duplicates index` keeps the file the index names, however it
    spells it (it fell back to the last file)."""
    folder = _copy(written, tmp_path)
    doc = _edit_index(folder, "././/")
    name, spelled = next(iter(doc["weight_map"].items()))
    holder = spelled.removeprefix("././/")
    copy = load_file(str(folder / holder))[name].clone()
    save_file({name: copy}, str(folder / "zz-copy.safetensors"))
    plan = plan_index(scan(folder), duplicates="index")
    assert not plan.writes, plan.describe()
    assert plan.notes == (
        f"'{name}' is in {holder}, zz-copy.safetensors; the index keeps {holder}",
    )


# -- shard files spelled x/ or x/. -------------------------------------------------------------


@pytest.mark.parametrize("suffix", ["/", "/."])
def test_a_shard_spelled_as_a_folder_is_not_the_shard(
    written: Path, tmp_path: Path, suffix: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`x.safetensors/` and `x.safetensors/.` are not the shard x: a loader that joins them onto
    the folder (transformers, safetensors' `safe_open`) fails, not a folder. They were
    normalised onto x (`PurePosixPath` drops that last part): check said "no findings" and,
    with the plans reading the map the same way, repair said "nothing to repair" on an index
    no loader could use."""
    folder = _copy(written, tmp_path)
    doc = _edit_index(folder)
    shard = sorted(set(doc["weight_map"].values()))[0]
    spelled = {k: v + suffix if v == shard else v for k, v in doc["weight_map"].items()}
    (folder / INDEX_NAME).write_text(json.dumps({**doc, "weight_map": spelled}, indent=2))
    with pytest.raises(OSError):
        load_file(f"{folder}/{shard}{suffix}")  # as transformers joins it (os.path.join)
    scanned = scan(folder)
    found = check(scanned, model=False)
    assert sorted((f.code, f.file) for f in found) == [
        ("index-missing-file", shard + suffix),
        ("unindexed-file", shard),
    ]
    assert main(["repair", str(folder), "--yes", "--no-model"]) == 0
    capsys.readouterr()
    assert json.loads((folder / INDEX_NAME).read_text())["weight_map"] == doc["weight_map"]
    assert check(scan(folder), model=False) == []
