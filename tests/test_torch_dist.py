"""The torch-dist layout on REAL Megatron-style checkpoints written by
`torch.distributed.checkpoint.save` (one process, and two gloo processes with DTensors), plus
malformed and hostile `.metadata` / `metadata.json` / tracker files."""

from __future__ import annotations

import io
import json
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from dcp_writers import torch_dist_tensors

from inspector._internal.checks.torch_dist import check_torch_dist, chunk_coverage
from inspector._internal.demo.torch_dist import (
    RerunState,
    megatron_common_state,
    megatron_pickle_names,
    save_megatron_dcp,
    write_torch_dist_demo,
)
from inspector._internal.formats.pickles.dcp_metadata import (
    MetadataFormatError,
    load_dcp_metadata,
)
from inspector._internal.formats.pickles.errors import RefusedGlobalError
from inspector._internal.layouts import torch_dist
from inspector._internal.layouts.base import ScanOptions
from inspector._internal.layouts.torch_dist import PickledObject
from inspector._internal.scan.entry import scan
from inspector._internal.storage import local_location

ITER = "iter_0000100"
WORLD = 2


def codes(findings) -> list[str]:
    return [f.code for f in findings]


def all_findings(scanned) -> list:
    return [*scanned.read_findings, *check_torch_dist(scanned)]


# -- fixtures: real checkpoints --------------------------------------------------------------


@pytest.fixture
def demo(tmp_path: Path) -> Path:
    """The healthy single-process demo: parent folder with the tracker file."""
    return write_torch_dist_demo(tmp_path / "run")


@pytest.fixture(scope="module")
def two_rank_source() -> Path:
    """Saved by 2 gloo ranks: DTensors sharded over a 2-rank mesh, per-rank rerun state (the
    golden fixture `torch-dcp/megatron-style-2rank`, written by `make fixtures` with
    tests/dcp_writers.py `write_torch_dist_run`). Read only."""
    return Path(__file__).parent / "fixtures" / "writers" / "torch-dcp" / "megatron-style-2rank"


@pytest.fixture
def two_rank(two_rank_source: Path, tmp_path: Path) -> Path:
    """A private copy each test may damage."""
    return Path(shutil.copytree(two_rank_source, tmp_path / "run"))


def _blob(data: object) -> io.BytesIO:
    buffer = io.BytesIO()
    torch.save([data], buffer)
    buffer.seek(0)
    return buffer


def rewrite_metadata(folder: Path, edit) -> None:
    """Re-pickle the real `Metadata` object after `edit(metadata)` changed it in place."""
    meta = dcp.FileSystemReader(str(folder)).read_metadata()
    edit(meta)
    (folder / ".metadata").write_bytes(pickle.dumps(meta))


# -- healthy checkpoints ---------------------------------------------------------------------


def test_demo_scans_as_torch_dist_with_megatron_names(demo: Path) -> None:
    scanned = scan(demo)
    info = scanned.torch_dist
    assert scanned.layout == "torch-dist"
    assert scanned.path == demo.resolve()
    assert info.iteration_dir == ITER
    qkv = info.tensors["decoder.layers.self_attention.linear_qkv.weight"]
    assert (qkv.dtype, qkv.size) == ("BF16", (2, 96, 32))
    assert qkv.chunks == (((0, 0, 0), (2, 96, 32)),)
    fc1 = info.tensors["decoder.layers.mlp.experts.experts.linear_fc1.weight"]
    assert fc1.size == (2, 4, 32, 32)
    assert "mtp.layers.0.eh_proj.weight" in info.tensors
    assert sorted(info.byte_keys) == [
        "rerun_state_machine_state/shard_0_1",
        "rng_state/shard_0.0_1.1",
    ]
    assert info.metadata_json["sharded_backend"] == "torch_dist"
    assert info.distcp_sizes == {
        f"{ITER}/__0_0.distcp": (demo / ITER / "__0_0.distcp").stat().st_size
    }
    # The common state: Megatron enums and argparse.Namespace kept as inert records.
    assert info.common["iteration"] == 100
    assert info.common["args"] == PickledObject("argparse.Namespace", (), info.common["args"].state)
    assert info.common["args"].state["world_size"] == 1
    assert info.common["rerun_state_machine"]["state"].args == (0,)
    assert info.common_file == f"{ITER}/common.pt"
    assert scanned.read_findings == []
    assert check_torch_dist(scanned) == []


def test_logical_rows_are_tensors_only_with_global_shapes(demo: Path) -> None:
    scanned = scan(demo)
    logical = scanned.logical
    columns = zip(logical.file, logical.dtype, logical.shape, logical.nbytes, strict=True)
    rows = dict(zip(logical.name, columns, strict=True))
    assert len(rows) == len(scanned.torch_dist.tensors) == 21
    assert not any(name.startswith(("rng_state", "rerun_state")) for name in rows)
    assert rows["output_layer.weight"] == (f"{ITER}/__0_0.distcp", "BF16", (128, 32), 128 * 32 * 2)
    assert logical.begin is None and logical.end is None  # not one byte range each


def test_iteration_folder_scanned_directly(demo: Path) -> None:
    scanned = scan(demo / ITER)
    assert scanned.layout == "torch-dist"
    assert scanned.torch_dist.iteration_dir == ""
    assert "__0_0.distcp" in scanned.torch_dist.distcp_sizes
    assert all_findings(scanned) == []


def test_two_ranks_store_several_chunks_that_tile_each_tensor(two_rank: Path) -> None:
    scanned = scan(two_rank)
    info = scanned.torch_dist
    for name, (shape, dim) in torch_dist_tensors().items():
        tensor = info.tensors[name]
        assert tensor.size == shape
        assert len(tensor.chunks) == (1 if dim is None else WORLD), name
    qkv = info.tensors["decoder.layers.self_attention.linear_qkv.weight"]
    assert sorted(qkv.chunks) == [((0, 0, 0), (2, 24, 16)), ((0, 24, 0), (2, 24, 16))]
    files = {loc[0] for loc in info.storage.values()}
    assert files == {f"{ITER}/__0_0.distcp", f"{ITER}/__1_0.distcp"}
    assert sorted(info.byte_keys) == [f"rerun_state_machine_state/shard_{r}_2" for r in range(2)]
    # Rerun machine active, and both ranks' shards are there: no drift.
    assert all_findings(scanned) == []


# -- one test per finding code ------------------------------------------------------------------


def test_missing_distcp_file(two_rank: Path) -> None:
    (two_rank / ITER / "__1_0.distcp").unlink()
    found = check_torch_dist(scan(two_rank))
    assert codes(found) == ["torch-dist-missing-file"]
    assert found[0].file == f"{ITER}/__1_0.distcp"
    # Rank 1 wrote the second chunk of the 4 sharded tensors plus its own rerun shard; the
    # replicated norm went to one of the two ranks.
    assert "is missing" in found[0].message
    assert (
        "stores 5 entries there" in found[0].message or "stores 6 entries there" in found[0].message
    )


def test_truncated_distcp_file(demo: Path) -> None:
    path = demo / ITER / "__0_0.distcp"
    size = path.stat().st_size
    os.truncate(path, size // 2)
    found = check_torch_dist(scan(demo))
    assert codes(found) == ["torch-dist-missing-file"]
    assert f"is {size // 2:,} bytes" in found[0].message
    assert "truncated" in found[0].message


def test_chunk_gap_from_a_dropped_chunk(two_rank: Path) -> None:
    name = "decoder.layers.self_attention.linear_qkv.weight"

    def drop_second_chunk(meta) -> None:
        meta.state_dict_metadata[name].chunks.pop()

    rewrite_metadata(two_rank / ITER, drop_second_chunk)
    found = check_torch_dist(scan(two_rank))
    assert codes(found) == ["torch-dist-chunk-gap"]
    assert found[0].tensor == name
    assert "cover 768 of the 1,536 elements" in found[0].message
    assert "offsets (0, 24, 0) with sizes (2, 24, 16)" in found[0].message


def test_chunk_overlap(two_rank: Path) -> None:
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata

    name = "embedding.word_embeddings.weight"

    def shift_chunk(meta) -> None:
        chunks = meta.state_dict_metadata[name].chunks
        chunks.append(ChunkStorageMetadata(torch.Size([16, 0]), torch.Size([32, 16])))

    rewrite_metadata(two_rank / ITER, shift_chunk)
    found = check_torch_dist(scan(two_rank))
    # The extra chunk also has no storage record: both problems are reported.
    assert sorted(codes(found)) == ["torch-dist-chunk-overlap", "torch-dist-missing-file"]
    overlap = next(f for f in found if f.code == "torch-dist-chunk-overlap")
    assert overlap.tensor == name and "512 elements" in overlap.message


def test_rerun_active_without_shards_is_drift(tmp_path: Path) -> None:
    scanned = scan(write_torch_dist_demo(tmp_path / "run", rerun_drift=True))
    assert scanned.read_findings == []
    found = check_torch_dist(scanned)
    assert codes(found) == ["torch-dist-common-drift"]
    msg = found[0].message
    assert found[0].file == f"{ITER}/common.pt"
    assert "WILL_RERUN_FROM_CHECKPOINT" in msg and "has no rerun_state_machine_state/shard_*" in msg
    assert "rerun_state_machine_state/shard_X_1" in msg


def test_rerun_shards_fewer_than_world_size_is_drift(two_rank: Path) -> None:
    key = "rerun_state_machine_state/shard_1_2"

    def drop_rank_1(meta) -> None:
        del meta.state_dict_metadata[key]
        meta.storage_data = {k: v for k, v in meta.storage_data.items() if k.fqn != key}

    rewrite_metadata(two_rank / ITER, drop_rank_1)
    found = check_torch_dist(scan(two_rank))
    assert codes(found) == ["torch-dist-common-drift"]
    assert "rank 1 missing (1 of 2)" in found[0].message


@pytest.mark.parametrize(
    ("content", "expect"),
    [
        (None, "is missing"),
        ('{"sharded_backend": "zarr", "sharded_backend_version": 1}', "sharded_backend 'zarr'"),
    ],
)
def test_metadata_json_drift(demo: Path, content: str | None, expect: str) -> None:
    path = demo / ITER / "metadata.json"
    path.unlink()
    if content is not None:
        path.write_text(content)
    scanned = scan(demo)
    assert scanned.read_findings == []
    found = check_torch_dist(scanned)
    assert codes(found) == ["torch-dist-metadata-json"]
    assert expect in found[0].message and found[0].file == f"{ITER}/metadata.json"


def test_truncated_metadata_json_is_one_scan_problem(demo: Path) -> None:
    (demo / ITER / "metadata.json").write_text('{"sharded_backend": "torch_di')
    scanned = scan(demo)
    assert codes(scanned.read_findings) == ["torch-dist-metadata-json"]
    assert "not valid JSON" in scanned.read_findings[0].message
    assert check_torch_dist(scanned) == []  # not reported twice


# -- hostile and broken .metadata ---------------------------------------------------------------


class _RunsCode:
    """Pickles as a call to os.system: loading it with plain pickle would run the command."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_malicious_metadata_is_refused_and_not_executed(demo: Path, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    (demo / ITER / ".metadata").write_bytes(pickle.dumps(_RunsCode(marker)))
    scanned = scan(demo)
    assert not marker.exists()
    # A global that runs code is reported as a hostile file, not merely an unreadable one.
    assert codes(scanned.read_findings) == ["pickle-hostile"]
    msg = scanned.read_findings[0].message
    assert f"names {os.system.__module__}.system" in msg
    assert "refused before unpickling (nothing ran)" in msg
    assert scanned.read_findings[0].file == f"{ITER}/.metadata"
    assert scanned.torch_dist.tensors == {}


def test_payload_hidden_inside_real_metadata_is_refused(demo: Path, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"

    def hide_payload(meta) -> None:
        meta.planner_data = {"x": _RunsCode(marker)}

    rewrite_metadata(demo / ITER, hide_payload)
    scanned = scan(demo)
    assert not marker.exists()
    assert codes(scanned.read_findings) == ["pickle-hostile"]
    with pytest.raises(RefusedGlobalError):
        load_dcp_metadata((demo / ITER / ".metadata").read_bytes())


def test_megatron_mcore_metadata_is_read_without_megatron(
    demo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Megatron pickles its `MCoreMetadata` (a DCP Metadata with `mcore_data`) by its own
    module path; the inspector maps it to a stand-in and never imports Megatron."""
    import dataclasses
    import types

    from torch.distributed.checkpoint.metadata import Metadata

    module = "megatron.core.dist_checkpointing.strategies.torch"
    parts = module.split(".")
    for i in range(1, len(parts) + 1):
        monkeypatch.setitem(sys.modules, ".".join(parts[:i]), types.ModuleType(".".join(parts[:i])))

    @dataclasses.dataclass
    class MCoreMetadata(Metadata):
        mcore_data: dict = dataclasses.field(default_factory=dict)

    MCoreMetadata.__module__, MCoreMetadata.__qualname__ = module, "MCoreMetadata"
    sys.modules[module].MCoreMetadata = MCoreMetadata
    folder = demo / ITER
    meta = dcp.FileSystemReader(str(folder)).read_metadata()
    mcore = MCoreMetadata(**vars(meta), mcore_data={"output_layer.weight": {"x": 1}})
    (folder / ".metadata").write_bytes(pickle.dumps(mcore))
    monkeypatch.delitem(sys.modules, module)  # the reader must not need it
    assert b"MCoreMetadata" in (folder / ".metadata").read_bytes()
    scanned = scan(demo)
    assert scanned.read_findings == []
    assert len(scanned.torch_dist.tensors) == 21


def test_builtins_eval_is_refused() -> None:
    payload = b"cbuiltins\neval\n(S'1+1'\ntR."
    with pytest.raises(RefusedGlobalError, match=r"builtins\.eval"):
        load_dcp_metadata(payload)


@pytest.mark.parametrize("cut", [0.5, 0.9])
def test_truncated_metadata(demo: Path, cut: float) -> None:
    path = demo / ITER / ".metadata"
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * cut)])
    scanned = scan(demo)
    assert codes(scanned.read_findings) == ["torch-dist-metadata-unreadable"]
    assert "truncated or corrupt" in scanned.read_findings[0].message
    assert scanned.read_findings[0].file == f"{ITER}/.metadata"


def test_metadata_that_is_not_dcp_metadata(demo: Path) -> None:
    (demo / ITER / ".metadata").write_bytes(pickle.dumps({"state_dict_metadata": {}}))
    scanned = scan(demo)
    assert codes(scanned.read_findings) == ["torch-dist-metadata-unreadable"]
    assert "expected a DCP Metadata object" in scanned.read_findings[0].message


def test_storage_path_leaving_the_folder_is_dropped(demo: Path) -> None:
    name = "output_layer.weight"

    def redirect(meta) -> None:
        for index, info in meta.storage_data.items():
            if index.fqn == name:
                info.relative_path = "../../outside.distcp"

    rewrite_metadata(demo / ITER, redirect)
    scanned = scan(demo)
    assert codes(scanned.read_findings) == ["torch-dist-metadata-unreadable"]
    assert "outside the checkpoint folder" in scanned.read_findings[0].message
    assert all("outside" not in loc[0] for loc in scanned.torch_dist.storage.values())
    # With its storage record gone, the tensor's chunk has nowhere to be read from.
    found = check_torch_dist(scanned)
    assert codes(found) == ["torch-dist-missing-file"] and found[0].tensor == name


def test_safe_unpickler_never_imports_torch(demo: Path) -> None:
    script = (
        "import sys; sys.modules['torch'] = None\n"
        "from inspector._internal.formats.pickles.dcp_metadata import load_dcp_metadata\n"
        f"meta = load_dcp_metadata(open({str(demo / ITER / '.metadata')!r}, 'rb').read())\n"
        "entries = meta.get('state_dict_metadata')\n"
        "print(len(entries), entries['output_layer.weight'].get('size'))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["23", "(128,", "32)"]


def test_load_dcp_metadata_rejects_garbage() -> None:
    with pytest.raises(MetadataFormatError):
        load_dcp_metadata(b"\x80\x04not a pickle at all")


# -- common state -------------------------------------------------------------------------------


def test_common_state_inside_distcp(tmp_path: Path) -> None:
    """Newer Megatron: no common.pt, the common state is the `common_state` sharded object."""
    folder = tmp_path / "ckpt"
    common = megatron_common_state(world_size=1, rerun_state=RerunState.NOT_RUNNING_YET)
    with megatron_pickle_names():
        blob = _blob(common)
    save_megatron_dcp(
        {"output_layer.weight": torch.ones(4, 2), "common_state/shard_0_1": blob}, folder
    )
    scanned = scan(folder)
    info = scanned.torch_dist
    assert info.common is not None and info.common["iteration"] == 100
    assert info.common_file == "__0_0.distcp[common_state/shard_0_1]"
    assert all_findings(scanned) == []


def test_common_pt_without_torch_is_a_finding(demo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)
    scanned = torch_dist.LAYOUT.scan(local_location(demo), options=ScanOptions())
    assert codes(scanned.read_findings) == ["torch-dist-common-unreadable"]
    assert "pip install" in scanned.read_findings[0].message
    assert len(scanned.torch_dist.tensors) == 21  # .metadata needs no torch


def test_corrupt_common_pt(demo: Path) -> None:
    (demo / ITER / "common.pt").write_bytes(b"PK\x03\x04 broken zip")
    scanned = scan(demo)
    assert codes(scanned.read_findings) == ["torch-dist-common-unreadable"]
    assert scanned.torch_dist.common is None


# -- the tracker file ---------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["../../etc", "100; rm -rf /", "", "-5"])
def test_bad_tracker_text_falls_back_to_newest_iteration(demo: Path, text: str) -> None:
    (demo / "latest_checkpointed_iteration.txt").write_text(text)
    scanned = scan(demo)
    assert codes(scanned.read_findings) == ["torch-dist-metadata-unreadable"]
    assert f"scanning {ITER}/ instead" in scanned.read_findings[0].message
    assert scanned.torch_dist.iteration_dir == ITER and len(scanned.torch_dist.tensors) == 21


def test_release_tracker(demo: Path) -> None:
    (demo / ITER).rename(demo / "release")
    (demo / "latest_checkpointed_iteration.txt").write_text("release")
    scanned = scan(demo)
    assert scanned.torch_dist.iteration_dir == "release"
    assert all_findings(scanned) == []


def test_iteration_symlink_out_of_the_folder_is_not_followed(demo: Path, tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere"
    (demo / ITER).rename(outside)
    (demo / ITER).symlink_to(outside, target_is_directory=True)
    scanned = scan(demo)
    assert codes(scanned.read_findings) == ["torch-dist-metadata-unreadable"]
    assert "not a folder inside" in scanned.read_findings[0].message
    assert scanned.torch_dist.tensors == {}


# -- coverage arithmetic (pure) -----------------------------------------------------------------


def test_chunk_coverage_cases() -> None:
    size = (4, 6)
    tiles = [((0, 0), (2, 6)), ((2, 0), (2, 3)), ((2, 3), (2, 3))]
    assert chunk_coverage(size, tiles) is None
    assert chunk_coverage((), [((), ())]) is None
    assert chunk_coverage((0, 5), []) is None
    code, detail = chunk_coverage(size, tiles[:2])
    assert code == "torch-dist-chunk-gap" and "offsets (2, 3) with sizes (2, 3)" in detail
    code, detail = chunk_coverage(size, [*tiles, ((1, 1), (1, 1))])
    assert code == "torch-dist-chunk-overlap" and "1 elements" in detail
    code, detail = chunk_coverage(size, [((3, 0), (2, 6))])
    assert code == "torch-dist-chunk-gap" and "outside the global size" in detail


def test_pickled_metadata_json_round_trip_is_json(demo: Path) -> None:
    doc = json.loads((demo / ITER / "metadata.json").read_text())
    assert doc == scan(demo).torch_dist.metadata_json
