"""Sidecar drift on real Model-Optimizer-style per-layer exports (safetensors writer per layer,
sidecars and merged index as docs/formats.md describes), damaged as in the wild."""

from __future__ import annotations

from pathlib import Path

import pytest
from modelopt_writer import (
    INDEX,
    load_json,
    mtp_tensors,
    save_json,
    shard_name,
    tiny_layer_state_dicts,
    write_modelopt_export,
)

from inspector._internal.checkpoint.scanned import ScannedCheckpoint
from inspector._internal.checks import check_layout
from inspector._internal.checks.index import DETAIL_PER_FILE
from inspector._internal.findings.finding import Finding
from inspector._internal.scan.entry import scan

LAYERS = 3
LAST = shard_name(LAYERS, LAYERS)
FIRST = shard_name(1, LAYERS)


@pytest.fixture
def export(tmp_path: Path) -> Path:
    """A healthy export: MTP tensors written into the last shard AND listed everywhere."""
    layers = tiny_layer_state_dicts(LAYERS)
    layers[LAYERS].update(mtp_tensors())
    return write_modelopt_export(tmp_path / "export", layers)


def _check(folder: Path) -> tuple[ScannedCheckpoint, list[Finding]]:
    scanned = scan(folder)
    assert scanned.layout == "modelopt-per-layer"
    return scanned, check_layout(scanned)


def _by_code(findings: list[Finding], code: str) -> list[Finding]:
    return [f for f in findings if f.code == code]


def test_healthy_export_has_no_findings(export: Path) -> None:
    scanned, findings = _check(export)
    assert set(scanned.sidecars) == {shard_name(i, LAYERS) for i in range(1, LAYERS + 1)}
    assert scanned.read_findings == []
    assert findings == []


def test_late_mtp_tensors_reproduce_the_1422_drift(tmp_path: Path) -> None:
    mtp = mtp_tensors()
    folder = write_modelopt_export(
        tmp_path / "x", tiny_layer_state_dicts(LAYERS), late={LAYERS: mtp}
    )
    mtp_bytes = sum(t.nbytes for t in mtp.values())
    scanned, findings = _check(folder)
    assert scanned.read_findings == []
    unlisted = _by_code(findings, "sidecar-unlisted-tensor")
    assert sorted(f.tensor for f in unlisted) == sorted(mtp)
    assert {f.file for f in unlisted} == {f"{LAST}.json"}
    assert sorted(f.tensor for f in _by_code(findings, "unindexed-tensor")) == sorted(mtp)
    (side_size,) = _by_code(findings, "sidecar-total-size-mismatch")
    assert (
        f"short by exactly the {mtp_bytes:,} bytes of the {len(mtp)} tensors" in side_size.message
    )
    (size,) = _by_code(findings, "total-size-mismatch")
    assert f"difference -{mtp_bytes:,}" in size.message and "short by exactly" in size.message
    # Sidecar and merged index agree with each other: both are stale in the same way.
    assert not _by_code(findings, "sidecar-index-disagree")
    assert {f.code for f in findings} == {
        "sidecar-unlisted-tensor", "unindexed-tensor", "sidecar-total-size-mismatch",
        "total-size-mismatch",
    }  # fmt: skip


def test_shard_without_sidecar(export: Path) -> None:
    (export / f"{FIRST}.json").unlink()
    _, findings = _check(export)
    assert [(f.code, f.file) for f in findings] == [("sidecar-missing", FIRST)]
    assert f"while {LAYERS - 1} sibling shards have one" in findings[0].message


def test_sidecar_without_shard(export: Path) -> None:
    (export / FIRST).unlink()
    _, findings = _check(export)
    (missing,) = _by_code(findings, "sidecar-missing")
    assert missing.file == f"{FIRST}.json"
    assert f"{FIRST} is not in the folder" in missing.message
    assert len(_by_code(findings, "index-missing-file")) == 1
    assert not _by_code(findings, "sidecar-dangling-tensor")


def test_sidecar_dangling_tensor(export: Path) -> None:
    path = export / f"{LAST}.json"
    doc = load_json(path)
    doc["weight_map"]["mtp.fc.weight"] = LAST
    save_json(path, doc)
    _, findings = _check(export)
    dangling = _by_code(findings, "sidecar-dangling-tensor")
    assert [(f.file, f.tensor) for f in dangling] == [(f"{LAST}.json", "mtp.fc.weight")]
    # The index was not rebuilt from this sidecar, so the two disagree as well.
    (disagree,) = _by_code(findings, "sidecar-index-disagree")
    assert disagree.tensor == "mtp.fc.weight" and f"but {INDEX} does not" in disagree.message


def test_sidecar_total_size_is_the_file_size(export: Path) -> None:
    path = export / f"{FIRST}.json"
    doc = load_json(path)
    stated = (export / FIRST).stat().st_size
    doc["metadata"]["total_size"] = stated
    save_json(path, doc)
    _, findings = _check(export)
    assert [f.code for f in findings] == ["sidecar-total-size-mismatch"]
    assert f"is {stated:,} but {FIRST} holds" in findings[0].message
    assert "equals the shard's file size" in findings[0].message


@pytest.mark.parametrize("kind", ["only-index", "only-sidecars", "different"])
def test_sidecars_and_index_disagree(export: Path, kind: str) -> None:
    index = load_json(export / INDEX)
    name = "model.layers.0.mlp.gate.weight"
    if kind == "only-index":
        sidecar = load_json(export / f"{FIRST}.json")
        del sidecar["weight_map"][name]
        save_json(export / f"{FIRST}.json", sidecar)
        expected = f"maps {name!r} to {FIRST} but that shard's sidecar does not list it"
    elif kind == "only-sidecars":
        del index["weight_map"][name]
        expected = f"the sidecar of {FIRST} lists {name!r} but {INDEX} does not"
    else:
        index["weight_map"][name] = LAST
        expected = f"{INDEX} maps {name!r} to {LAST}, the sidecars to {FIRST}"
    save_json(export / INDEX, index)
    _, findings = _check(export)
    (disagree,) = _by_code(findings, "sidecar-index-disagree")
    assert disagree.tensor == name and disagree.file == INDEX and disagree.layer == 0
    assert expected in disagree.message


def test_unreadable_sidecar_is_not_also_missing(export: Path) -> None:
    path = export / f"{FIRST}.json"
    path.write_text(path.read_text()[:40])  # truncated by a concurrent writer
    scanned, findings = _check(export)
    assert [(f.code, f.file) for f in scanned.read_findings] == [
        ("sidecar-unreadable", f"{FIRST}.json")
    ]
    assert findings == []


def test_many_missing_sidecars_are_folded(tmp_path: Path) -> None:
    layers = 30
    folder = write_modelopt_export(tmp_path / "wide", tiny_layer_state_dicts(layers, experts=1))
    for i in range(2, layers + 1):
        (folder / f"{shard_name(i, layers)}.json").unlink()
    _, findings = _check(folder)
    assert {f.code for f in findings} == {"sidecar-missing"}
    assert len(findings) == DETAIL_PER_FILE + 1
    assert (
        f"{layers - 1 - DETAIL_PER_FILE} more shards have no .json sidecar" in findings[-1].message
    )


GOLDEN = Path(__file__).resolve().parent / "fixtures" / "writers" / "modelopt"


def test_writer_sidecar_names_are_read_and_repaired_in_place(tmp_path: Path) -> None:
    """nvidia-modelopt 0.47's own export names the sidecar of `model-00002-of-00002.safetensors`
    `model-00002-of-00002.json`: it is read, its drift (seed modelopt-1422) is found, and the
    repair rewrites that file instead of adding a `.safetensors.json` beside it; a shard
    whose sidecar is lost gets one named like its siblings'."""
    import shutil

    from inspector._internal.plans.repair import plan_repair

    folder = tmp_path / "export"
    shutil.copytree(GOLDEN / "modelopt-1422-sidecar-drift", folder)
    scanned, findings = _check(folder)
    # Its MTP block is `mtp.layers.2.*` after 2 decoder layers: MTP layer 2, not 2 + 2.
    layers = scanned.layers
    assert layers.loc[layers["is_mtp"], "layer"].tolist() == [2]
    assert set(scanned.sidecars) == {
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
    }
    unlisted = [f for f in findings if f.code == "sidecar-unlisted-tensor"]
    assert {f.file for f in unlisted} == {"model-00002-of-00002.json"}
    assert all("model-00002-of-00002.safetensors holds" in f.message for f in unlisted[:-1])
    (folder / "model-00001-of-00002.json").unlink()
    plan = plan_repair(scan(folder), only={"sidecars", "index"})
    assert sorted(w.path for w in plan.writes) == [
        "model-00001-of-00002.json",
        "model-00002-of-00002.json",
        INDEX,
    ]
    result = plan.execute()
    assert not list(folder.glob("*.safetensors.json"))
    assert result.remaining == ()
