"""A repair writes only files whose role it established: well-known JSON files (config.json,
hf_quant_config.json, generation_config.json, the tokenizer files...) are never sidecars,
whatever `.safetensors` file shares their stem, and a plan refuses, in one line, a target
that exists with another role. Each test builds the folder and runs the CLI's entry function
(`commands.run`; the real process's exit codes: tests/test_cli_errors.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from commands import run
from safetensors.numpy import save_file
from test_journal import drifted

from inspector._internal.checks import check
from inspector._internal.common.filenames import (
    BIN_INDEX_NAME,
    CONFIG_NAME,
    GENERATION_CONFIG_NAME,
    INDEX_NAME,
    WELL_KNOWN,
    is_well_known,
)
from inspector._internal.layouts.modelopt_per_layer import shard_of_sidecar, sidecar_name
from inspector._internal.plans.repair import plan_repair
from inspector._internal.scan.entry import scan

INDEX = INDEX_NAME
GOLDEN = Path(__file__).resolve().parent / "fixtures" / "writers" / "modelopt"
EXPORT = GOLDEN / "modelopt-1422-sidecar-drift"  # nvidia-modelopt's own `<stem>.json` sidecars


def stray_shard(folder: Path, stem: str) -> None:
    """A `.safetensors` file sharing its stem with a well-known JSON file."""
    tensors = {f"{stem}.extra.weight": np.ones((2, 2), np.float32)}
    save_file(tensors, str(folder / f"{stem}.safetensors"), metadata={"format": "pt"})


CONFIG = {"model_type": "llama", "num_hidden_layers": 3, "hidden_size": 2}
QUANT = {"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "FP8"}}


@pytest.mark.parametrize(
    ("stem", "content"), [("config", CONFIG), ("hf_quant_config", QUANT)], ids=["config", "quant"]
)
def test_repair_yes_keeps_a_well_known_json_next_to_a_same_stem_shard(
    tmp_path: Path, stem: str, content: dict
) -> None:
    """`config.json` beside `config.safetensors` is the config, not that file's sidecar:
    the scan does not call the folder a per-layer export, and `repair --yes` leaves it."""
    folder = drifted(tmp_path / "ckpt")  # two shards, an index that misses a tensor
    text = json.dumps(content, indent=2)
    (folder / f"{stem}.json").write_text(text)
    stray_shard(folder, stem)
    scanned = scan(folder)
    assert scanned.layout == "hf-sharded"
    assert not scanned.sidecars
    proc = run("repair", folder, "--yes")
    assert proc.returncode in (0, 1), proc.stderr
    assert (folder / f"{stem}.json").read_text() == text
    assert f"rewrite {stem}.json" not in proc.stdout and "written: " in proc.stdout
    assert f"{stem}.json" not in proc.stdout.split("written: ")[1].splitlines()[0]
    assert "model.layers.2.mlp.weight" in json.loads((folder / INDEX).read_text())["weight_map"]


@pytest.mark.parametrize(
    ("named", "role"),
    [
        (CONFIG_NAME, "the model config"),
        (INDEX_NAME, "the safetensors weight-map index"),
        (GENERATION_CONFIG_NAME, "the generation config"),
    ],
)
def test_an_index_entry_naming_a_well_known_file_is_the_wrong_entry(
    tmp_path: Path, named: str, role: str
) -> None:
    """An index that maps a tensor to config.json (or to itself, or another file whose name
    gives it a role): the entry is wrong, not the file. Before, the scan read the file as a
    shard, `check` called it damaged ("copy config.json again from the source") and
    `repair` refused to rebuild the index until it was restored or removed."""
    folder = drifted(tmp_path / "ckpt")  # two shards; the index misses layer 2's tensor
    for name in (CONFIG_NAME, GENERATION_CONFIG_NAME):
        (folder / name).write_text(json.dumps({"model_type": "llama"}, indent=2))
    index = json.loads((folder / INDEX).read_text())
    index["weight_map"]["model.layers.2.mlp.weight"] = named
    (folder / INDEX).write_text(json.dumps(index))
    kept = {name: (folder / name).read_bytes() for name in (CONFIG_NAME, GENERATION_CONFIG_NAME)}
    # Layer 2's shard is named by no entry now: unindexed-file, which the rebuild fixes too.
    finding, unindexed = check(scan(folder), model=False)
    assert unindexed.code == "unindexed-file"
    assert finding.code == "index-wrong-file" and finding.file == INDEX
    assert f"to {named} (e.g. model.layers.2.mlp.weight), which is {role}, not a shard: " in (
        finding.message
    )
    checked = run("check", folder)
    assert "header-unreadable" not in checked.stdout and f"REF/{named}" not in checked.stdout
    proc = run("repair", folder, "--yes")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "REFUSED" not in proc.stdout and "remove" not in proc.stdout
    assert f"model.layers.2.mlp.weight {named} -> model-00002-of-00002.safetensors" in proc.stdout
    assert "written: model.safetensors.index.json\n" in proc.stdout
    assert "re-check: no findings" in proc.stdout
    assert {name: (folder / name).read_bytes() for name in kept} == kept


def test_per_layer_export_with_a_config_safetensors_keeps_config_json(tmp_path: Path) -> None:
    """In a real per-layer export, `config.json` is still no sidecar: a stray
    `config.safetensors` gets its sidecar under the other accepted name
    (`config.safetensors.json`), and the config survives `repair --yes` byte for byte."""
    folder = tmp_path / "export"
    shutil.copytree(EXPORT, folder)
    config = (folder / CONFIG_NAME).read_bytes()
    generation = (folder / GENERATION_CONFIG_NAME).read_bytes()
    stray_shard(folder, "config")
    stray_shard(folder, "generation_config")
    scanned = scan(folder)
    assert scanned.layout == "modelopt-per-layer"
    assert set(scanned.sidecars) == {
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
    }
    assert not [p for p in scanned.read_problems if p.file.endswith(CONFIG_NAME)]
    missing = [f for f in check(scanned, model=False) if f.code == "sidecar-missing"]
    assert {f.file for f in missing} == {"config.safetensors", "generation_config.safetensors"}
    assert all("config.safetensors.json" in f.message for f in missing)
    proc = run("repair", folder, "--yes", "--only", "sidecars")
    assert proc.returncode in (0, 1), proc.stderr
    assert (folder / CONFIG_NAME).read_bytes() == config
    assert (folder / GENERATION_CONFIG_NAME).read_bytes() == generation
    side = json.loads((folder / "config.safetensors.json").read_text())
    assert side["weight_map"] == {"config.extra.weight": "config.safetensors"}
    assert scan(folder).sidecars.keys() >= {"config.safetensors", "generation_config.safetensors"}


def test_lone_config_safetensors_with_config_json(tmp_path: Path) -> None:
    """The smallest folder of the report: `config.safetensors` and `config.json` alone."""
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / CONFIG_NAME).write_text(json.dumps(CONFIG))
    stray_shard(folder, "config")
    assert scan(folder).layout != "modelopt-per-layer"
    proc = run("repair", folder, "--yes")
    assert proc.returncode in (0, 1), proc.stderr
    assert json.loads((folder / CONFIG_NAME).read_text()) == CONFIG


@pytest.mark.parametrize("name", sorted(WELL_KNOWN))
def test_no_well_known_name_is_ever_a_sidecar(name: str) -> None:
    stem = name.removesuffix(".json")
    assert shard_of_sidecar(name, {f"{stem}.safetensors"}) is None
    assert not is_well_known(sidecar_name(f"{stem}.safetensors", {}))


def test_indices_are_never_sidecars() -> None:
    for name in (BIN_INDEX_NAME, "diffusion_pytorch_model.safetensors.index.json"):
        assert is_well_known(name)
        assert shard_of_sidecar(name, {name.replace(".json", ".safetensors")}) is None


def test_plan_refuses_a_target_whose_role_it_did_not_establish(tmp_path: Path) -> None:
    """A file already at a name the plan would create (here a sidecar name, which the scan
    read as no sidecar) is refused in one line; the rest of the plan stands."""
    folder = tmp_path / "export"
    shutil.copytree(EXPORT, folder)
    (folder / "model-00001-of-00002.json").unlink()
    # The name a new sidecar of shard 1 would get, holding something else (a folder).
    (folder / "model-00001-of-00002.json").mkdir()
    plan = plan_repair(scan(folder), only={"sidecars"})
    assert "model-00001-of-00002.json" not in [w.path for w in plan.writes]
    (line,) = [r for r in plan.refused if "model-00001-of-00002.json" in r]
    assert "not a sidecar" in line or "not" in line
    proc = run("repair", folder, "--yes", "--only", "sidecars")
    assert proc.returncode == 1, proc.stderr
    assert "REFUSED" in proc.stdout and "Traceback" not in proc.stderr
    assert (folder / "model-00001-of-00002.json").is_dir()


def test_preview_of_writer_named_sidecars(tmp_path: Path) -> None:
    """The checkpoint as the plan leaves it, in memory, knows the writer's `<stem>.json`
    sidecars as sidecars (it used to refuse to preview them)."""
    folder = tmp_path / "export"
    shutil.copytree(EXPORT, folder)
    scanned = scan(folder)
    plan = plan_repair(scanned)
    assert "model-00002-of-00002.json" in [w.path for w in plan.writes]
    preview = plan.preview(scanned, model=False)
    assert preview.fixes and not preview.remains and not preview.introduces


def test_reshard_refuses_a_new_shard_name_taken_by_a_folder(tmp_path: Path) -> None:
    folder = tmp_path / "ckpt"
    folder.mkdir()
    tensors = {f"model.layers.{i}.mlp.weight": np.ones((64, 64), np.float32) for i in range(4)}
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "model-00001-of-00002.safetensors").mkdir()
    proc = run("repair", folder, "--yes", "--only", "reshard", "--max-shard-size", "40000")
    assert proc.returncode == 1, proc.stderr
    assert "REFUSED: model-00001-of-00002.safetensors is a folder" in proc.stdout
    assert (folder / "model-00001-of-00002.safetensors").is_dir()
    assert (folder / "model.safetensors").is_file()


def test_restore_leaves_a_file_at_the_new_sidecar_name(tmp_path: Path) -> None:
    """`repair --from` in a per-layer export names its new shard so that neither the shard
    nor its sidecar replaces a file already there."""
    folder = tmp_path / "export"
    shutil.copytree(EXPORT, folder)
    reference = tmp_path / "reference"
    reference.mkdir()
    scanned = scan(folder)
    tensors = {"model.extra_norm.weight": np.ones((4,), np.float32)}
    for shard in scanned.shards:
        for name, shape in zip(shard.names, shard.shapes, strict=True):
            tensors[name] = np.zeros(shape, np.float32)
    save_file(tensors, str(reference / "model.safetensors"), metadata={"format": "pt"})
    (folder / "model-restored-00001.json").write_text('{"notes": "mine"}')
    proc = run("repair", folder, "--from", reference, "--yes")
    assert proc.returncode in (0, 1), proc.stderr
    assert (folder / "model-restored-00001.json").read_text() == '{"notes": "mine"}'
    assert not (folder / "model-restored-00001.safetensors").exists()
    side = json.loads((folder / "model-restored-00002.json").read_text())
    assert "model.extra_norm.weight" in side["weight_map"]
