"""Hostile files (SECURITY.md, "Reads stay inside the folder"): every file we read goes through
the storage layer, which opens only regular files, non-blocking, under a cap, and never
through a link that leaves the checkpoint folder (the Hugging Face cache layout aside).

Each test builds a minimal hostile folder from a healthy checkpoint written by the project's
own demo writers and checks the finding, that nothing hangs (the pytest timeout), and that no
byte of a refused file reaches a report. Scan and consolidate must agree on every link.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from inspector._internal.checks import check
from inspector._internal.common.filenames import CONFIG_NAME, INDEX_NAME
from inspector._internal.demo.dcp import write_dcp_demo
from inspector._internal.demo.torch_dist import write_torch_dist_demo
from inspector._internal.findings.finding import Finding
from inspector._internal.plans.consolidate import plan_consolidation
from inspector._internal.plans.repair import plan_repair
from inspector._internal.scan.entry import scan
from inspector.errors import PlanRefusedError

pytestmark = pytest.mark.timeout(60)  # a FIFO that is opened blocking would hang forever

INDEX = INDEX_NAME
ITER = "iter_0000100"
SECRET = "TOKEN=never-in-a-report"


def unsafe(findings: list[Finding]) -> dict[str | None, str]:
    return {f.file: f.message for f in findings if f.code == "file-unsafe"}


def all_findings(folder: Path) -> list[Finding]:
    return check(scan(folder), model=False)


def plant(path: Path, kind: str) -> None:
    """Replace `path` (if any) with a FIFO or a link to /dev/zero."""
    path.unlink(missing_ok=True)
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/zero")


def no_leak(findings: list[Finding]) -> None:
    assert all(SECRET not in f.message for f in findings)


@pytest.fixture
def secret(tmp_path: Path) -> Path:
    """A readable file outside every checkpoint folder that a link may point at."""
    path = tmp_path / "outside" / "secret.json"
    path.parent.mkdir()
    path.write_text(json.dumps({"weight_map": {"a": SECRET}, "num_hidden_layers": 7}))
    return path


@pytest.fixture
def sharded(tmp_path: Path) -> Path:
    """Two shards, an index, a config: healthy."""
    folder = tmp_path / "hf"
    folder.mkdir()
    one, two = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
    save_file({"model.embed_tokens.weight": np.ones((4, 2), np.float32)}, str(folder / one))
    save_file({"model.norm.weight": np.ones(2, np.float32)}, str(folder / two))
    weight_map = {"model.embed_tokens.weight": one, "model.norm.weight": two}
    (folder / INDEX).write_text(
        json.dumps({"metadata": {"total_size": 40}, "weight_map": weight_map})
    )
    (folder / CONFIG_NAME).write_text(json.dumps({"model_type": "llama", "num_hidden_layers": 1}))
    assert unsafe(all_findings(folder)) == {}
    return folder


# -- item 2: special files are refused, never opened blocking nor read without a cap ---------


@pytest.mark.parametrize("kind", ["fifo", "dev-zero"])
@pytest.mark.parametrize("name", [INDEX, CONFIG_NAME, "model-00001-of-00002.safetensors"])
def test_special_file_as_index_config_or_shard(sharded: Path, name: str, kind: str) -> None:
    plant(sharded / name, kind)
    found = unsafe(all_findings(sharded))
    why = "is a FIFO, not a regular file" if kind == "fifo" else "is a link to /dev/zero"
    assert list(found) == [name] and why in found[name] and "not read" in found[name]


def test_index_that_is_a_fifo_is_reported_not_ignored(sharded: Path) -> None:
    """It used to vanish: the scan saw no index and reported nothing about it."""
    plant(sharded / INDEX, "fifo")
    scanned = scan(sharded)
    assert scanned.index is None and INDEX in unsafe(scanned.read_findings)


@pytest.mark.parametrize("kind", ["fifo", "dev-zero"])
def test_sidecar_that_is_special(sharded: Path, kind: str) -> None:
    sidecar = sharded / "model-00001-of-00002.safetensors.json"
    plant(sidecar, kind)
    scanned = scan(sharded)
    assert scanned.layout == "modelopt-per-layer"
    assert list(unsafe(scanned.read_findings)) == [sidecar.name]


@pytest.mark.parametrize("kind", ["fifo", "dev-zero"])
def test_torch_dist_metadata_common_and_distcp(tmp_path: Path, kind: str) -> None:
    folder = write_torch_dist_demo(tmp_path / "run")
    ckpt = folder / ITER
    for name in (".metadata", "common.pt", "__0_0.distcp"):
        plant(ckpt / name, kind)
    found = unsafe(all_findings(folder))
    assert sorted(found) == [f"{ITER}/.metadata", f"{ITER}/__0_0.distcp", f"{ITER}/common.pt"]


def test_distcp_named_by_metadata_that_is_a_fifo(tmp_path: Path) -> None:
    """The common state lives in a .distcp file; a FIFO there must not hang its range read."""
    folder = write_torch_dist_demo(tmp_path / "run")
    (folder / ITER / "common.pt").unlink()  # the common state is then looked up in .distcp
    plant(folder / ITER / "__0_0.distcp", "fifo")
    scanned = scan(folder)
    assert f"{ITER}/__0_0.distcp" in unsafe(scanned.read_findings)


def test_dcp_mapping_and_config_that_are_special(tmp_path: Path) -> None:
    folder = write_dcp_demo(tmp_path / "model")
    meta = folder / ".hf_metadata"
    plant(meta / "fqn_to_file_index_mapping.json", "fifo")
    plant(meta / CONFIG_NAME, "dev-zero")
    found = unsafe(scan(folder).read_findings)
    assert sorted(found) == [
        ".hf_metadata/config.json",
        ".hf_metadata/fqn_to_file_index_mapping.json",
    ]


def test_repair_never_reads_a_special_index(sharded: Path) -> None:
    plant(sharded / INDEX, "dev-zero")
    with pytest.raises(PlanRefusedError, match="not read"):
        plan_repair(scan(sharded))


# -- item 3: links that leave the folder are not read ----------------------------------------


def test_shard_linked_out_of_the_folder(sharded: Path, secret: Path) -> None:
    name = "model-00002-of-00002.safetensors"
    (sharded / name).unlink()
    (sharded / name).symlink_to(secret)
    findings = all_findings(sharded)
    found = unsafe(findings)
    assert list(found) == [name] and str(secret) in found[name]
    no_leak(findings)


def test_config_linked_to_a_sibling_folder(sharded: Path, secret: Path) -> None:
    (sharded / CONFIG_NAME).unlink()
    (sharded / CONFIG_NAME).symlink_to(Path("..") / "outside" / secret.name)
    scanned = scan(sharded)
    assert scanned.config is None and scanned.spec.num_layers is None  # not even salvaged
    assert list(unsafe(scanned.read_findings)) == [CONFIG_NAME]
    no_leak(check(scanned, model=False))


def test_index_linked_out_is_refused_and_its_bytes_never_shown(sharded: Path, secret: Path) -> None:
    (sharded / INDEX).unlink()
    (sharded / INDEX).symlink_to(secret)
    findings = all_findings(sharded)
    assert list(unsafe(findings)) == [INDEX]
    no_leak(findings)


def test_link_loop_and_links_inside_the_folder(sharded: Path) -> None:
    # A link inside the folder is read like the file; a loop is refused.
    sub = sharded / "real"
    sub.mkdir()
    name = "model-00001-of-00002.safetensors"
    shutil.move(sharded / name, sub / name)
    (sharded / name).symlink_to(Path("real") / name)
    (sharded / "x.safetensors").symlink_to("x.safetensors")
    findings = all_findings(sharded)
    found = unsafe(findings)
    assert list(found) == ["x.safetensors"] and "link loop" in found["x.safetensors"]
    shard = scan(sharded).shard(name)
    assert shard is not None and shard.readable and shard.names == ("model.embed_tokens.weight",)


def hf_cache_snapshot(base: Path, files: dict[str, Path]) -> Path:
    """The Hugging Face cache layout: blobs named by hash, a snapshot of links to them."""
    repo = base / "hub" / "models--org--tiny"
    (repo / "blobs").mkdir(parents=True)
    snapshot = repo / "snapshots" / ("a" * 40)
    snapshot.mkdir(parents=True)
    for i, (name, source) in enumerate(sorted(files.items())):
        blob = repo / "blobs" / f"{i:064x}"
        shutil.copyfile(source, blob)
        (snapshot / name).symlink_to(Path("..") / ".." / "blobs" / blob.name)
    return snapshot


def test_hf_cache_snapshot_is_read_like_a_copy(sharded: Path, tmp_path: Path) -> None:
    snapshot = hf_cache_snapshot(tmp_path, {p.name: p for p in sharded.iterdir()})
    here, there = scan(sharded), scan(snapshot)
    assert [s.names for s in there.shards] == [s.names for s in here.shards]
    assert there.index is not None and there.config is not None
    assert [f.code for f in all_findings(snapshot)] == [f.code for f in all_findings(sharded)]


def test_hf_cache_link_into_another_repository_is_refused(sharded: Path, tmp_path: Path) -> None:
    snapshot = hf_cache_snapshot(tmp_path, {p.name: p for p in sharded.iterdir()})
    other = tmp_path / "hub" / "models--someone--else" / "blobs"
    other.mkdir(parents=True)
    shutil.copyfile(sharded / CONFIG_NAME, other / "cafe")
    (snapshot / CONFIG_NAME).unlink()
    (snapshot / CONFIG_NAME).symlink_to(other / "cafe")
    assert list(unsafe(scan(snapshot).read_findings)) == [CONFIG_NAME]


# -- scan and consolidate agree --------------------------------------------------------------


@pytest.fixture
def dcp_folder(tmp_path: Path) -> Path:
    return write_dcp_demo(tmp_path / "src" / "model")


RANK = "shard-00002-model-00001-of-00004.safetensors"


def test_consolidate_refuses_what_the_scan_refuses(dcp_folder: Path, tmp_path: Path) -> None:
    moved = tmp_path / "elsewhere.safetensors"
    shutil.move(dcp_folder / RANK, moved)
    (dcp_folder / RANK).symlink_to(moved)
    scanned = scan(dcp_folder)
    assert list(unsafe(scanned.read_findings)) == [RANK]
    with pytest.raises(PlanRefusedError, match="file-unsafe"):
        plan_consolidation(scanned, tmp_path / "out")


def test_consolidate_reads_what_the_scan_reads(dcp_folder: Path, tmp_path: Path) -> None:
    """A rank file linked inside the folder, and a DCP folder in the Hugging Face cache
    layout: the scan reads them, and so does consolidation, to the same bytes."""
    expected = plan_consolidation(scan(dcp_folder), tmp_path / "plain").execute(progress=False)
    assert expected.ok
    (dcp_folder / "ranks").mkdir()
    shutil.move(dcp_folder / RANK, dcp_folder / "ranks" / RANK)
    (dcp_folder / RANK).symlink_to(Path("ranks") / RANK)
    scanned = scan(dcp_folder)
    assert unsafe(scanned.read_findings) == {}
    linked = plan_consolidation(scanned, tmp_path / "linked").execute(progress=False)
    assert linked.ok
    for name in expected.written:
        assert (tmp_path / "linked" / name).read_bytes() == (tmp_path / "plain" / name).read_bytes()


@pytest.mark.parametrize("kind", ["inside", "link-out", "fifo", "over-cap"])
def test_the_metadata_child_gets_only_what_the_storage_read(
    tmp_path: Path, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Large `.metadata` files are unpickled in a bounded child
    (`pickles.sandbox`), from bytes this process read through the storage: a
    link out of the folder, a FIFO or a file over the cap is refused before any child runs. The
    child is forced on for every size here (its threshold is 1 MB) and counted."""
    from inspector._internal.formats.pickles import dcp_metadata
    from inspector._internal.formats.pickles.sandbox import SandboxLimits
    from inspector._internal.layouts import torch_dist

    children: list[int] = []
    real = dcp_metadata.run_bounded

    def counted(fn: Callable[[], object], *, size: int, **kwargs: object) -> object:
        children.append(size)
        return real(fn, size=size, **kwargs)

    monkeypatch.setattr(dcp_metadata, "run_bounded", counted)
    defaults = dict(dcp_metadata.read_dcp_metadata.__kwdefaults__ or {})
    defaults["limits"] = SandboxLimits(min_size=0)
    monkeypatch.setattr(dcp_metadata.read_dcp_metadata, "__kwdefaults__", defaults)
    folder = write_torch_dist_demo(tmp_path / "run")
    meta = folder / ITER / ".metadata"
    healthy = scan(folder)
    children.clear()
    outside = tmp_path / "elsewhere.metadata"
    shutil.copyfile(meta, outside)
    if kind == "link-out":
        meta.unlink()
        meta.symlink_to(outside)
    elif kind == "fifo":
        plant(meta, "fifo")
    elif kind == "over-cap":
        monkeypatch.setattr(torch_dist, "METADATA_CAP", meta.stat().st_size - 1)
    scanned = scan(folder)
    if kind == "inside":
        assert children == [meta.stat().st_size]
        assert [t.name for t in scanned.tensors.itertuples()] == [
            t.name for t in healthy.tensors.itertuples()
        ]
        return
    assert children == []
    problem = [p for p in scanned.read_findings if p.file == f"{ITER}/.metadata"]
    assert len(problem) == 1
    unreadable = "torch-dist-metadata-unreadable"
    assert problem[0].code == (unreadable if kind == "over-cap" else "file-unsafe")
