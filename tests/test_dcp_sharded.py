"""The `dcp-sharded` layout against checkpoints written by PyTorch's own DCP writer.

One 2-process save per test run (`real`, conftest's `dcp_checkpoint`); every damaging test
works on a copy of it.
"""

from __future__ import annotations

import dataclasses
import json
import multiprocessing.process
import os
import shutil
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from dcp_writers import MAPPING, full_tensors, tensor_plan
from huggingface_hub import split_torch_state_dict_into_shards
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors import safe_open
from safetensors.torch import save_file
from work_count import calls

from inspector._internal.checkpoint.scanned import DcpChunk, DcpInfo, full_shape
from inspector._internal.checks import check
from inspector._internal.checks.coverage import coverage
from inspector._internal.checks.dcp import check_dcp
from inspector._internal.common.filenames import CONFIG_NAME, HF_METADATA_DIR, INDEX_NAME
from inspector._internal.demo.dcp import write_dcp_demo, write_rank_files
from inspector._internal.layouts import dcp_sharded
from inspector._internal.scan.entry import scan
from inspector._internal.scan.registry import detect_layout
from inspector._internal.storage import local_location

OUT1_RANK2 = "shard-00002-model-00001-of-00002.safetensors"
OUT2_RANK1 = "shard-00001-model-00002-of-00002.safetensors"
OUT2_RANK2 = "shard-00002-model-00002-of-00002.safetensors"


@pytest.fixture(scope="module")
def real(dcp_checkpoint: Path) -> Path:
    """A training checkpoint folder whose `model/` was saved by 2 gloo ranks (the test run's
    `dcp_checkpoint`, read only)."""
    return dcp_checkpoint.parent


@pytest.fixture
def model(real: Path, tmp_path: Path) -> Path:
    """A private copy of the real `model/` folder, free to damage."""
    return Path(shutil.copytree(real / "model", tmp_path / "model"))


def codes(scanned) -> list[str]:
    return [f.code for f in [*scanned.read_findings, *check_dcp(scanned)]]


def by_code(scanned, code: str):
    return [f for f in [*scanned.read_findings, *check_dcp(scanned)] if f.code == code]


def rewrite(path: Path, *, edit_info=None, edit_tensors=None, metadata=None) -> None:
    """Re-save one rank's file with edited tensors and/or edited DCP_SHARDING_INFO."""
    with safe_open(str(path), "pt") as f:
        meta = dict(f.metadata())
        tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open API)
    if edit_info is not None:
        info = json.loads(meta["DCP_SHARDING_INFO"])
        edit_info(info)
        meta["DCP_SHARDING_INFO"] = json.dumps(info)
    if edit_tensors is not None:
        edit_tensors(tensors)
    save_file(tensors, str(path), metadata=meta if metadata is None else metadata)


# -- the real checkpoint -----------------------------------------------------------------------


def test_what_torch_writes(real: Path) -> None:
    names = sorted(p.name for p in (real / "model").iterdir())
    assert names == [
        ".hf_metadata",
        "shard-00001-model-00001-of-00002.safetensors",
        OUT2_RANK1,
        OUT1_RANK2,
        OUT2_RANK2,
    ]


def test_detect_and_parent_folder(real: Path) -> None:
    assert dcp_sharded.detect(local_location(real / "model"))
    assert dcp_sharded.detect(local_location(real))
    assert detect_layout(local_location(real / "model")) is dcp_sharded.LAYOUT
    scanned = scan(real)
    assert scanned.layout == "dcp-sharded"
    assert scanned.path == (real / "model").resolve()
    assert scanned.shards[0].file == "shard-00001-model-00001-of-00002.safetensors"


def test_detect_by_metadata_only(model: Path, tmp_path: Path) -> None:
    shutil.rmtree(model / ".hf_metadata")
    for i, path in enumerate(sorted(model.glob("*.safetensors"))):
        path.rename(model / f"rank{i}.safetensors")
    assert dcp_sharded.detect(local_location(model))
    plain = tmp_path / "plain"
    plain.mkdir()
    save_file({"a": torch.zeros(2)}, str(plain / "model-00001-of-00002.safetensors"))
    save_file({"b": torch.zeros(2)}, str(plain / "model-00002-of-00002.safetensors"))
    assert not dcp_sharded.detect(local_location(plain))


def test_scan_rebuilds_full_shapes(real: Path) -> None:
    scanned = scan(real / "model")
    full = full_tensors()
    assert scanned.dcp.full_shapes == {name: tuple(t.shape) for name, t in full.items()}
    logical = dict(
        zip(
            scanned.logical.name,
            zip(scanned.logical.dtype, scanned.logical.nbytes, strict=True),
            strict=True,
        )
    )
    for name, t in full.items():
        dtype, nbytes = logical[name]
        assert nbytes == t.numel() * t.element_size(), name
        assert (
            dtype
            == {
                "torch.bfloat16": "BF16",
                "torch.float32": "F32",
                "torch.int32": "I32",
                "torch.int8": "I8",
                "torch.bool": "BOOL",
            }[str(t.dtype)]
        )
        sharded = tensor_plan()[name].shard_dim is not None
        assert len(scanned.dcp.chunks[name]) == (2 if sharded else 1), name
    assert scanned.dcp.mapping == MAPPING
    assert scanned.spec.experts_per_layer == 2
    assert scanned.read_findings == []
    assert check_dcp(scanned) == []


def test_chunks_reassemble_the_saved_tensors(real: Path) -> None:
    """Our reading of the offsets puts every chunk's data where torch took it from."""
    scanned = scan(real / "model")
    for name, expected in full_tensors().items():
        rebuilt = torch.zeros(scanned.dcp.full_shapes[name], dtype=expected.dtype)
        for chunk in scanned.dcp.chunks[name]:
            with safe_open(str(scanned.path / chunk.file), "pt") as f:
                data = f.get_tensor(name)
            region = tuple(slice(o, o + n) for o, n in zip(chunk.offsets, chunk.shape, strict=True))
            rebuilt[region] = data
        assert torch.equal(rebuilt, expected), name


# -- coverage, overlap, dtype --------------------------------------------------------------------


def test_missing_first_rank_file_leaves_gaps(model: Path) -> None:
    (model / OUT2_RANK1).unlink()
    scanned = scan(model)
    gaps = by_code(scanned, "dcp-coverage-gap")
    by_tensor = {f.tensor: f for f in gaps if f.tensor}
    # Rank 1 held row 0 of the gate and columns 0-7 of expert 0's down_proj.
    assert "[0:1, 0:32]" in by_tensor["model.layers.0.mlp.gate.weight"].message
    assert "[0:32, 0:8]" in by_tensor["model.layers.0.mlp.experts.0.down_proj.weight"].message
    assert by_tensor["model.layers.0.mlp.experts.0.down_proj.weight"].expert == 0
    # lm_head's rank-1 chunk held its only row; the remaining chunk is empty.
    assert "lm_head.weight" in by_tensor
    file_level = [f for f in gaps if f.tensor is None]
    assert [f.file for f in file_level] == [OUT2_RANK1]
    assert "rank 2 wrote output file 2 but rank 1 did not" in file_level[0].message


def test_missing_last_rank_file_is_named(model: Path) -> None:
    (model / OUT1_RANK2).unlink()
    scanned = scan(model)
    # The full shape silently shrinks to the chunks present ...
    assert scanned.dcp.full_shapes["model.embed_tokens.weight"] == (32, 32)
    # ... so the missing file itself is the evidence.
    gaps = by_code(scanned, "dcp-coverage-gap")
    assert [f.file for f in gaps] == [OUT1_RANK2]
    assert "output file 1" in gaps[0].message


def test_truncated_rank_file_leaves_gaps(model: Path) -> None:
    path = model / OUT2_RANK2
    data = path.read_bytes()
    path.write_bytes(data[:-200])
    scanned = scan(model)
    assert "file-truncated" in codes(scanned)
    shard = scanned.shard(OUT2_RANK2)
    limit = shard.file_size - shard.data_start
    cut = {n for n, e in zip(shard.names, shard.ends, strict=True) if e > limit}
    sharded_cut = {n for n in cut if tensor_plan()[n].shard_dim is not None}
    gaps = {f.tensor for f in by_code(scanned, "dcp-coverage-gap") if f.tensor}
    assert sharded_cut and sharded_cut <= gaps
    assert all("is truncated" in f.message for f in by_code(scanned, "dcp-coverage-gap"))


def test_overlapping_chunks(model: Path) -> None:
    def shift(info: dict) -> None:
        info["model.embed_tokens.weight"]["saved_offsets"] = [16, 0]

    rewrite(model / OUT1_RANK2, edit_info=shift)
    scanned = scan(model)
    assert scanned.dcp.full_shapes["model.embed_tokens.weight"] == (48, 32)
    overlaps = by_code(scanned, "dcp-chunk-overlap")
    assert [f.tensor for f in overlaps] == ["model.embed_tokens.weight"]
    assert OUT1_RANK2 in overlaps[0].message and "[16, 0]" in overlaps[0].message
    assert "dcp-coverage-gap" not in codes(scanned)


def test_dtype_and_ndim_conflicts(model: Path) -> None:
    def damage(tensors: dict) -> None:
        tensors["model.embed_tokens.weight"] = tensors["model.embed_tokens.weight"].float()
        tensors["model.layers.0.self_attn.q_proj.weight"] = tensors[
            "model.layers.0.self_attn.q_proj.weight"
        ].reshape(32, 16, 1)

    def offsets(info: dict) -> None:
        info["model.layers.0.self_attn.q_proj.weight"]["saved_offsets"] = [0, 16, 0]

    rewrite(model / OUT1_RANK2, edit_tensors=damage, edit_info=offsets)
    scanned = scan(model)
    conflicts = {f.tensor: f.message for f in by_code(scanned, "dcp-dtype-conflict")}
    assert set(conflicts) == {"model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight"}
    assert "dtype" in conflicts["model.embed_tokens.weight"]
    assert "F32" in conflicts["model.embed_tokens.weight"]
    assert "number of dimensions" in conflicts["model.layers.0.self_attn.q_proj.weight"]


@pytest.mark.parametrize(
    ("damage", "expect"),
    [
        ("drop-info", "no DCP_SHARDING_INFO"),
        ("not-json", "not valid JSON"),
        ("not-object", "JSON list"),
        ("too-deep", "levels deep"),  # past the JSON depth budget
        ("past-recursion", "levels deep"),  # past Python's recursion limit
        ("no-offsets", "no valid saved_offsets"),
        ("wrong-length", "length differs"),
    ],
)
def test_sharding_info_missing(model: Path, damage: str, expect: str) -> None:
    path = model / OUT1_RANK2
    target = "model.layers.0.self_attn.mask"
    if damage == "drop-info":
        rewrite(path, metadata={"format": "pt"})
    elif damage in ("not-json", "not-object", "too-deep", "past-recursion"):
        depth = 300 if damage == "too-deep" else 100_000
        raw = {"not-json": "{truncated", "not-object": "[1, 2]"}.get(
            damage, "[" * depth + "]" * depth
        )
        rewrite(path, metadata={"DCP_SHARDING_INFO": raw, "DCP_VERSION": "1.0", "format": "pt"})
    elif damage == "no-offsets":
        rewrite(path, edit_info=lambda info: info[target].pop("saved_offsets"))
    else:
        rewrite(path, edit_info=lambda info: info[target].update(saved_offsets=[0, 3, 0]))
    scanned = scan(model)
    found = by_code(scanned, "dcp-sharding-info-missing")
    assert len(found) == 1 and found[0].file == OUT1_RANK2
    assert expect in found[0].message
    if damage in ("no-offsets", "wrong-length"):
        assert found[0].tensor == target
        assert [c.file for c in scanned.dcp.chunks[target]] == [
            "shard-00001-model-00001-of-00002.safetensors"
        ]


# -- mapping -------------------------------------------------------------------------------------


def edit_mapping(model: Path, edit) -> None:
    path = model / ".hf_metadata" / "fqn_to_file_index_mapping.json"
    mapping = json.loads(path.read_text())
    edit(mapping)
    path.write_text(json.dumps(mapping, indent=2, sort_keys=True))


def test_unmapped_and_dangling(model: Path) -> None:
    def edit(mapping: dict) -> None:
        del mapping["model.norm.weight"]
        mapping["model.embed_tokens.alias.weight"] = 1

    edit_mapping(model, edit)
    scanned = scan(model)
    unmapped = by_code(scanned, "mapping-unmapped-tensor")
    dangling = by_code(scanned, "mapping-dangling-tensor")
    assert [f.tensor for f in unmapped] == ["model.norm.weight"]
    assert [f.tensor for f in dangling] == ["model.embed_tokens.alias.weight"]
    assert "fqn_to_file_index_mapping.json" in dangling[0].message


def test_mapping_bad_values_and_bad_json(model: Path) -> None:
    edit_mapping(model, lambda m: m.update({"model.norm.weight": 0, "lm_head.weight": "2"}))
    scanned = scan(model)
    bad = by_code(scanned, "mapping-unreadable")
    assert len(bad) == 1 and "model.norm.weight=0" in bad[0].message
    assert "lm_head.weight='2'" in bad[0].message
    assert {f.tensor for f in by_code(scanned, "mapping-unmapped-tensor")} == {
        "model.norm.weight",
        "lm_head.weight",
    }
    path = model / ".hf_metadata" / "fqn_to_file_index_mapping.json"
    path.write_text(path.read_text()[:40])
    scanned = scan(model)
    assert [f.code for f in scanned.read_findings] == ["mapping-unreadable"]
    assert scanned.dcp.mapping is None


def test_collapsed_against_reference_index(model: Path) -> None:
    split = split_torch_state_dict_into_shards(
        full_tensors(),
        max_shard_size=3000,
        filename_pattern="model.safetensors{suffix}.safetensors",
    )
    index = {"metadata": split.metadata, "weight_map": split.tensor_to_filename}
    (model / ".hf_metadata" / INDEX_NAME).write_text(json.dumps(index))
    scanned = scan(model)
    assert by_code(scanned, "mapping-collapsed") == []  # the real mapping uses 2 files
    edit_mapping(model, lambda m: m.update(dict.fromkeys(m, 1)))
    scanned = scan(model)
    (found,) = by_code(scanned, "mapping-collapsed")
    n = len(split.filename_to_tensors)
    assert n > 1 and f"names {n} files" in found.message
    assert "model.safetensors-00001-of-" in found.message


def test_collapsed_by_size(model: Path) -> None:
    edit_mapping(model, lambda m: m.update(dict.fromkeys(m, 1)))
    scanned = scan(model)
    assert by_code(scanned, "mapping-collapsed") == []  # 15 small tensors in one file is fine
    # Same checkpoint as if its tensors were 1000x larger: over the 5 GB limit.
    huge = dataclasses.replace(
        scanned.logical, nbytes=[n * 1000 + 400_000_000 for n in scanned.logical.nbytes]
    )
    (found,) = [
        f
        for f in check_dcp(dataclasses.replace(scanned, logical=huge))
        if f.code == "mapping-collapsed"
    ]
    assert "GB, over the 5.0 GB per-file limit" in found.message


# -- coverage arithmetic -------------------------------------------------------------------------


boxes = st.lists(
    st.tuples(*(st.tuples(st.integers(0, 5), st.integers(0, 4)) for _ in range(3))),
    min_size=1,
    max_size=6,
)


@settings(max_examples=150, deadline=None)
@given(boxes)
def test_coverage_is_exact(spec) -> None:
    chunks = [DcpChunk("f", tuple(o for o, _ in b), tuple(n for _, n in b), "F32") for b in spec]
    full = full_shape(chunks)
    grid = np.zeros(full, dtype=np.int32)
    for c in chunks:
        grid[tuple(slice(o, o + n) for o, n in zip(c.offsets, c.shape, strict=True))] += 1
    nonempty = [c for c in chunks if np.prod(c.shape)]
    result = coverage(full, [(c.offsets, c.shape) for c in nonempty])
    assert result.covered == int((grid > 0).sum())
    assert (result.overlap is not None) == bool((grid > 1).any())
    for hole in result.holes:
        assert not grid[tuple(slice(a, b) for a, b in hole)].any()


def test_check_is_linear_and_folds(tmp_path: Path) -> None:
    """6,000 tensors on 8 ranks, one rank's chunks lost: at most 21 findings, and the work
    linear in the tensors, counted (tests/work_count.py), not timed: 4 times the tensors make
    fewer than 5 times the calls (a walk quadratic in the tensors or ranks makes 16 times as
    many, and took minutes at 60,000 tensors)."""
    # Every tensor is stored alike (rank r holds rows 4r to 4r+3 of each): one tuple of
    # frozen records serves them all, instead of a record per chunk built alike.
    stored = tuple(
        DcpChunk(f"shard-{r + 1:05d}-model-00001-of-00001.safetensors", (r * 4, 0), (4, 64), "BF16")
        for r in range(8)
        if r != 3
    )
    scanned = scan(write_dcp_demo(tmp_path / "demo"))

    def checked(tensors: int) -> tuple[list, int]:
        chunks: dict[str, tuple[DcpChunk, ...]] = {}
        for i in range(tensors):
            name = f"model.layers.{i // 600}.mlp.experts.{i % 600 // 3}.w{i % 3}.weight"
            chunks[name] = stored
        big = dataclasses.replace(scanned, info=DcpInfo.from_chunks(chunks), logical=None)
        assert big.dcp.full_shapes[name] == (32, 64)  # rebuilt from the chunks
        return calls(lambda: check_dcp(big))

    (_, quarter), (found, done) = checked(1_500), checked(6_000)
    assert done < 5 * quarter, (done, quarter)
    assert len(found) == 21 and all(f.code == "dcp-coverage-gap" for f in found)
    assert "[12:16, 0:64]" in found[0].message
    assert found[-1].message.startswith("5,980 more tensors") and "layers 0-9" in found[-1].message


# -- demo ----------------------------------------------------------------------------------------


def test_demo_files_match_the_real_writer(real: Path, tmp_path: Path) -> None:
    dims = {name: plan.shard_dim for name, plan in tensor_plan().items()}
    written = write_rank_files(tmp_path, full_tensors(), dims, MAPPING, ranks=2)
    real_files = sorted(p.name for p in (real / "model").glob("*.safetensors"))
    assert sorted(p.name for p in written) == real_files
    for name in real_files:
        ours, theirs = (tmp_path / name).read_bytes(), (real / "model" / name).read_bytes()
        (n_ours,), (n_theirs,) = struct.unpack("<Q", ours[:8]), struct.unpack("<Q", theirs[:8])
        assert n_ours == n_theirs and len(ours) == len(theirs), name
        h_ours, h_theirs = json.loads(ours[8 : 8 + n_ours]), json.loads(theirs[8 : 8 + n_theirs])
        # Same JSON (the metadata key order varies from run to run even in torch's output) ...
        assert h_ours == h_theirs, name
        # ... the very same sharding-info string, and the same data bytes.
        info = "DCP_SHARDING_INFO"
        assert h_ours["__metadata__"][info] == h_theirs["__metadata__"][info]
        assert ours[8 + n_ours :] == theirs[8 + n_theirs :], name


def test_demo_is_clean_and_quick(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Quick because the project's own code writes the rank files in this process, where
    # the real writer starts 2 gloo processes (seconds of CPU): shown by refusing every new
    # process while it writes, not by a clock.
    def refused(*args: object, **kwargs: object) -> None:
        raise AssertionError("the demo started a process")

    monkeypatch.setattr(subprocess.Popen, "__init__", refused)
    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", refused)
    monkeypatch.setattr(os, "fork", refused)
    dest = write_dcp_demo(tmp_path / "dcp")
    monkeypatch.undo()
    assert capsys.readouterr() == ("", "")
    assert (dest / "README.txt").read_text().startswith("Demo: a DCP-sharded checkpoint")
    scanned = scan(dest)
    assert scanned.layout == "dcp-sharded"
    assert sorted(set(scanned.dcp.mapping.values())) == [1, 2, 3, 4]
    assert len(scanned.shards) == 8
    assert scanned.dcp.full_shapes["lm_head.weight"] == (256, 64)
    assert scanned.read_findings == [] and check_dcp(scanned) == []


def test_collapsed_demo(tmp_path: Path) -> None:
    scanned = scan(write_dcp_demo(tmp_path / "dcp", collapsed=True))
    assert set(scanned.dcp.mapping.values()) == {1}
    assert [p.name for p in sorted(scanned.path.glob("*.safetensors"))] == [
        "shard-00001-model-00001-of-00001.safetensors",
        "shard-00002-model-00001-of-00001.safetensors",
    ]
    found = check_dcp(scanned)
    assert [f.code for f in found] == ["mapping-collapsed"]
    assert "names 4 files" in found[0].message and "instead of 4" in found[0].message


# -- a lost rank: every independent source of the full shapes (issue 8, item 4) ----------------

RANK2 = (OUT1_RANK2, OUT2_RANK2)


def test_lost_last_rank_is_seen_through_config_and_siblings(model: Path) -> None:
    """Every file of rank 2 is gone: the chunks of rank 1 alone make smaller, self-consistent
    shapes. config.json's hidden size and the sibling expert shapes still say how large the
    tensors are."""
    for name in RANK2:
        (model / name).unlink()
    scanned = scan(model)
    sources = scanned.dcp.shape_sources
    full = scanned.dcp.full_shapes
    assert full["model.layers.0.input_layernorm.weight"] == (32,)
    assert "config.json says hidden_size 32" in sources["model.layers.0.input_layernorm.weight"]
    # Expert 0's up_proj is row-sharded, expert 1's column-sharded: each kept another half.
    for expert in (0, 1):
        name = f"model.layers.0.mlp.experts.{expert}.up_proj.weight"
        assert full[name] == (16, 32) and "sibling experts of layer 0" in sources[name]
    gaps = {f.tensor: f for f in by_code(scanned, "dcp-coverage-gap") if f.tensor}
    assert {
        "model.layers.0.input_layernorm.weight",
        "model.norm.weight",
        "model.layers.0.mlp.experts.0.up_proj.weight",
        "model.layers.0.mlp.experts.1.up_proj.weight",
    } <= set(gaps)
    assert "every file of the last rank is gone" in gaps["model.norm.weight"].message
    # The logical tensors and the tables carry the full shapes: experts agree again.
    assert "expert-shape-mismatch" not in {f.code for f in check(scanned)}


def test_a_lost_rank_number_is_a_gap(model: Path) -> None:
    """Ranks are numbered 1..N without gaps: files of ranks 1 and 3 mean rank 2 lost all of
    its files (here: rank 2's files renamed as rank 3's, rank 2 gone)."""
    for name in RANK2:
        (model / name).rename(model / name.replace("shard-00002-", "shard-00003-"))
    scanned = scan(model)
    (lost,) = [f for f in by_code(scanned, "dcp-coverage-gap") if f.tensor is None]
    assert lost.file == "shard-00002-model-00001-of-00002.safetensors"
    assert "ranks 2 wrote no file at all" in lost.message


def _upstream(folder: Path, *, shards: bool) -> Path:
    """An upstream HF checkpoint of the test model (save_pretrained's layout)."""
    folder.mkdir(parents=True)
    state = {k: v.contiguous() for k, v in full_tensors().items()}
    split = split_torch_state_dict_into_shards(state, max_shard_size=3000)
    if shards:
        for file, names in split.filename_to_tensors.items():
            save_file({n: state[n] for n in names}, str(folder / file), metadata={"format": "pt"})
    index = {"metadata": split.metadata, "weight_map": split.tensor_to_filename}
    (folder / INDEX_NAME).write_text(json.dumps(index))
    return folder


def test_reference_named_by_consolidate_script_gives_exact_shapes(
    real: Path, tmp_path: Path
) -> None:
    """NeMo's consolidate.sh names the upstream model (`--model-name`); when it is on this
    machine its shard headers give every tensor's exact shape, the embedding's too."""
    run = tmp_path / "run"
    shutil.copytree(real / "model", run / "model")
    _upstream(run / "upstream", shards=True)
    (run / "model" / "consolidate.sh").write_text(
        'python3 tools/offline_hf_consolidation.py --model-name "upstream" --input-dir ./model\n'
    )
    assert check_dcp(scan(run / "model")) == []
    for name in RANK2:
        (run / "model" / name).unlink()
    scanned = scan(run / "model")
    reference = scanned.dcp.reference
    assert reference is not None and reference.named_by == "consolidate.sh --model-name"
    assert scanned.dcp.full_shapes["model.embed_tokens.weight"] == (64, 32)
    source = scanned.dcp.shape_sources["model.embed_tokens.weight"]
    assert "upstream" in source and "stores it as [64, 32]" in source
    gaps = {f.tensor for f in by_code(scanned, "dcp-coverage-gap")}
    assert "model.embed_tokens.weight" in gaps


def test_reference_by_hub_id_in_the_cache(
    real: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`_name_or_path` as a hub id: the snapshot `refs/main` names in the Hugging Face cache."""
    cache = tmp_path / "hub"
    repo = cache / "models--acme--tiny-moe"
    _upstream(repo / "snapshots" / "abc123", shards=False)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    model = Path(shutil.copytree(real / "model", tmp_path / "model"))
    config = json.loads((model / HF_METADATA_DIR / CONFIG_NAME).read_text())
    config["_name_or_path"] = "acme/tiny-moe"
    (model / HF_METADATA_DIR / CONFIG_NAME).write_text(json.dumps(config))
    edit_mapping(model, lambda m: m.update(dict.fromkeys(m, 1)))
    scanned = scan(model)
    reference = scanned.dcp.reference
    assert reference is not None and reference.path == str(repo / "snapshots" / "abc123")
    assert reference.named_by == "config.json _name_or_path"
    (found,) = by_code(scanned, "mapping-collapsed")
    assert "snapshots/abc123/model.safetensors.index.json names" in found.message
    # A name that leaves the run folder is not followed.
    config["_name_or_path"] = "../../etc"
    (model / HF_METADATA_DIR / CONFIG_NAME).write_text(json.dumps(config))
    assert scan(model).dcp.reference is None
