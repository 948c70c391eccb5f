"""Index drift on real Hugging Face sharded checkpoints (huggingface_hub / transformers writers),
damaged the way real exports go wrong."""

from __future__ import annotations

import itertools
import json
import random
import typing
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest
import safetensors.numpy
import torch
from huggingface_hub import save_torch_state_dict
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import save_file
from work_count import calls

from inspector._internal.checkpoint.scanned import ScannedCheckpoint
from inspector._internal.checkpoint.tensor_shards import held_tensors
from inspector._internal.checks import check_layout
from inspector._internal.checks import index as index_check
from inspector._internal.checks.index import DETAIL_PER_FILE, check_index
from inspector._internal.common.filenames import CONFIG_NAME, INDEX_NAME
from inspector._internal.findings.finding import (
    FOLD,
    Finding,
    FoldPolicy,
    fold_listed,
    fold_modules,
)
from inspector._internal.formats.safetensors import ShardHeader
from inspector._internal.scan.entry import scan
from inspector._internal.storage import local_location

INDEX = INDEX_NAME
SHARD_1 = "model-00001-of-00003.safetensors"
SHARD_3 = "model-00003-of-00003.safetensors"


def _state_dict() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    sd = {"model.embed_tokens.weight": torch.randn(16, 8, generator=gen).to(torch.bfloat16)}
    for layer in range(4):
        for part in ("q_proj", "k_proj", "o_proj"):
            sd[f"model.layers.{layer}.self_attn.{part}.weight"] = torch.randn(
                8, 8, generator=gen
            ).to(torch.bfloat16)
    sd["model.norm.weight"] = torch.randn(8, generator=gen).to(torch.bfloat16)
    sd["mtp.layers.0.eh_proj.weight"] = torch.randn(8, 16, generator=gen).to(torch.bfloat16)
    sd["mtp.layers.0.enorm.weight"] = torch.randn(8, generator=gen).to(torch.bfloat16)
    return sd


@pytest.fixture
def ckpt(tmp_path: Path) -> Path:
    """A healthy 3-shard checkpoint written by huggingface_hub."""
    folder = tmp_path / "ckpt"
    folder.mkdir()
    save_torch_state_dict(_state_dict(), folder, max_shard_size=800)
    assert sorted(p.name for p in folder.glob("*.safetensors"))[-1] == SHARD_3
    return folder


def _index(folder: Path) -> dict:
    return json.loads((folder / INDEX).read_text())


def _write_index(folder: Path, doc: dict) -> None:
    (folder / INDEX).write_text(json.dumps(doc, indent=2))


def _check(folder: Path) -> tuple[ScannedCheckpoint, list[Finding]]:
    scanned = scan(folder)
    return scanned, check_layout(scanned)


def _codes(findings: list[Finding]) -> list[str]:
    return sorted(f.code for f in findings)


# -- healthy ----------------------------------------------------------------------------------


def test_healthy_checkpoint_has_no_findings(ckpt: Path) -> None:
    scanned, findings = _check(ckpt)
    assert scanned.layout == "hf-sharded"
    assert len(scanned.shards) == 3
    assert scanned.read_findings == []
    assert findings == []


@pytest.mark.slow
def test_healthy_transformers_checkpoint_with_total_parameters(tmp_path: Path) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1,
    )  # fmt: skip
    LlamaForCausalLM(config).save_pretrained(tmp_path, max_shard_size="20KB")
    assert "total_parameters" in _index(tmp_path)["metadata"]
    scanned, findings = _check(tmp_path)
    assert len(scanned.shards) > 1
    assert scanned.read_findings == []
    assert findings == []


def test_index_with_dot_slash_paths_reads_each_shard_once(ckpt: Path) -> None:
    doc = _index(ckpt)
    doc["weight_map"] = {k: f"./{v}" for k, v in doc["weight_map"].items()}
    _write_index(ckpt, doc)
    scanned, findings = _check(ckpt)
    assert sorted(s.file for s in scanned.shards) == sorted(
        p.name for p in ckpt.glob("*.safetensors")
    )
    assert findings == []


# -- one test per code ------------------------------------------------------------------------


def test_dangling_tensor_in_a_shard_without_it(ckpt: Path) -> None:
    doc = _index(ckpt)
    doc["weight_map"]["mtp.fc.weight"] = SHARD_3
    _write_index(ckpt, doc)
    _, findings = _check(ckpt)
    assert _codes(findings) == ["index-dangling-tensor"]
    (f,) = findings
    assert (f.file, f.tensor) == (SHARD_3, "mtp.fc.weight")
    assert "no shard holds it" in f.message


def test_missing_file_is_one_finding_with_the_tensor_count(ckpt: Path) -> None:
    listed = [k for k, v in _index(ckpt)["weight_map"].items() if v == SHARD_1]
    (ckpt / SHARD_1).unlink()
    _, findings = _check(ckpt)
    missing = [f for f in findings if f.code == "index-missing-file"]
    assert len(missing) == 1 and missing[0].file == SHARD_1
    assert f"maps {len(listed):,} tensors to {SHARD_1}" in missing[0].message
    # Its tensors are not reported again one by one.
    assert not [f for f in findings if f.code == "index-dangling-tensor"]
    (size,) = [f for f in findings if f.code == "total-size-mismatch"]
    assert "lists but no shard holds" in size.message


def test_stray_shard_not_in_index(ckpt: Path) -> None:
    extra = {"extra.bias": torch.ones(4, dtype=torch.float32)}
    save_file(extra, str(ckpt / "zz-extra.safetensors"))
    _, findings = _check(ckpt)
    assert _codes(findings) == ["total-size-mismatch", "unindexed-file"]
    stray = next(f for f in findings if f.code == "unindexed-file")
    assert stray.file == "zz-extra.safetensors"
    assert "1 of them listed nowhere" in stray.message
    size = next(f for f in findings if f.code == "total-size-mismatch")
    assert "short by exactly the bytes of the 1 tensor the index" in size.message
    assert "difference -16" in size.message


def test_duplicate_tensor_same_dtype(ckpt: Path) -> None:
    sd = _state_dict()
    save_file({"model.norm.weight": sd["model.norm.weight"]}, str(ckpt / "zz-copy.safetensors"))
    _, findings = _check(ckpt)
    (dup,) = [f for f in findings if f.code == "duplicate-tensor"]
    holder = _index(ckpt)["weight_map"]["model.norm.weight"]
    assert dup.tensor == "model.norm.weight"
    assert dup.file == "zz-copy.safetensors"  # the copy loaders do not use
    assert "all copies are BF16 [8]" in dup.message
    # The index never names zz-copy.safetensors: no loader reads it.
    assert f"transformers keeps the copy in {holder}" in dup.message
    assert "may keep another" in dup.message


def test_duplicate_tensor_different_dtype(ckpt: Path) -> None:
    save_file(
        {"model.norm.weight": torch.ones(8, dtype=torch.float32)}, str(ckpt / "zz-copy.safetensors")
    )
    _, findings = _check(ckpt)
    (dup,) = [f for f in findings if f.code == "duplicate-tensor"]
    assert "the copies DIFFER" in dup.message
    assert "zz-copy.safetensors has F32 [8]" in dup.message
    assert "has BF16 [8]" in dup.message


def test_without_index_only_duplicates_are_reported(ckpt: Path) -> None:
    (ckpt / INDEX).unlink()
    save_file(
        {"model.norm.weight": torch.ones(8, dtype=torch.bfloat16)},
        str(ckpt / "zz-copy.safetensors"),
    )
    scanned, findings = _check(ckpt)
    assert scanned.layout == "hf-sharded" and scanned.index is None
    assert _codes(findings) == ["duplicate-tensor"]
    assert "without an index" in findings[0].message
    assert "keep the copy in zz-copy.safetensors" in findings[0].message


def test_unindexed_mtp_tensors(ckpt: Path) -> None:
    doc = _index(ckpt)
    mtp = sorted(k for k in doc["weight_map"] if k.startswith("mtp."))
    mtp_bytes = sum(_state_dict()[k].nbytes for k in mtp)
    for name in mtp:
        del doc["weight_map"][name]
    doc["metadata"]["total_size"] -= mtp_bytes  # what an index written before them says
    _write_index(ckpt, doc)
    _, findings = _check(ckpt)
    unindexed = [f for f in findings if f.code == "unindexed-tensor"]
    assert sorted(f.tensor for f in unindexed) == mtp
    assert all(f.file == SHARD_3 and f.layer is None for f in unindexed)
    (size,) = [f for f in findings if f.code == "total-size-mismatch"]
    assert f"short by exactly the bytes of the {len(mtp)} tensors" in size.message
    assert f"difference -{mtp_bytes}" in size.message


def test_wrong_file(ckpt: Path) -> None:
    doc = _index(ckpt)
    name = "model.embed_tokens.weight"
    actual = doc["weight_map"][name]
    other = next(v for v in doc["weight_map"].values() if v != actual)
    doc["weight_map"][name] = other
    _write_index(ckpt, doc)
    _, findings = _check(ckpt)
    assert _codes(findings) == ["index-wrong-file"]
    assert (findings[0].file, findings[0].tensor) == (other, name)
    assert f"it is in {actual}" in findings[0].message


def test_total_size_equal_to_file_sizes_is_explained(ckpt: Path) -> None:
    doc = _index(ckpt)
    tensor_bytes = doc["metadata"]["total_size"]
    doc["metadata"]["total_size"] = sum(p.stat().st_size for p in ckpt.glob("*.safetensors"))
    _write_index(ckpt, doc)
    _, findings = _check(ckpt)
    assert _codes(findings) == ["total-size-mismatch"]
    assert "sum of the shard FILE sizes" in findings[0].message
    assert f"hold {tensor_bytes:,} tensor bytes" in findings[0].message


def test_total_parameters_mismatch(ckpt: Path) -> None:
    doc = _index(ckpt)
    numel = sum(t.numel() for t in _state_dict().values())
    doc["metadata"]["total_parameters"] = numel
    _write_index(ckpt, doc)
    assert _check(ckpt)[1] == []
    doc["metadata"]["total_parameters"] = numel + 5
    _write_index(ckpt, doc)
    _, findings = _check(ckpt)
    assert _codes(findings) == ["total-parameters-mismatch"]
    assert (
        f"is {numel + 5:,} but the shards hold {numel:,} elements (difference +5)"
        in findings[0].message
    )


def test_unreadable_shard_is_reported_once(ckpt: Path) -> None:
    listed = [k for k, v in _index(ckpt)["weight_map"].items() if v == SHARD_1]
    data = (ckpt / SHARD_1).read_bytes()
    (ckpt / SHARD_1).write_bytes(b"\xff" * 8 + data[8:])  # header length past the end of file
    scanned, findings = _check(ckpt)
    assert [f.code for f in scanned.read_findings] == ["header-unreadable"]
    assert _codes(findings) == ["index-dangling-tensor"]
    assert findings[0].file == SHARD_1 and findings[0].tensor is None
    assert f"maps {len(listed):,} tensors to {SHARD_1}" in findings[0].message


def test_unsafe_paths_are_refused_and_nothing_outside_is_read(tmp_path: Path, ckpt: Path) -> None:
    outside = tmp_path / "outside.safetensors"
    save_file({"secret.weight": torch.ones(2)}, str(outside))
    doc = _index(ckpt)
    doc["weight_map"]["secret.weight"] = "../outside.safetensors"
    doc["weight_map"]["other.weight"] = str(outside.resolve())
    doc["weight_map"]["passwd"] = "/etc/passwd"
    _write_index(ckpt, doc)
    scanned, findings = _check(ckpt)
    unsafe = sorted(f.tensor for f in scanned.read_findings if f.code == "index-unsafe-path")
    assert unsafe == ["other.weight", "passwd", "secret.weight"]
    assert all("outside" not in s.file and "passwd" not in s.file for s in scanned.shards)
    assert len(scanned.shards) == 3
    assert findings == []  # the refused entries are dropped, not followed


def test_ten_thousand_unindexed_tensors_stay_bounded(tmp_path: Path) -> None:
    """A file the index does not name: its tensors folded into one finding, and the check
    linear in them, counted (tests/work_count.py), not timed: 4 times the tensors make fewer
    than 5 times the calls (a quadratic pass makes 16 times as many)."""

    def written(tensors: int) -> tuple[Path, list[str], dict]:
        folder = tmp_path / f"big-{tensors}"
        folder.mkdir()
        names = [
            f"model.layers.{i // 1000}.mlp.experts.{i % 1000}.w.weight" for i in range(tensors)
        ]
        arrays = dict.fromkeys(names, np.zeros(1, dtype=np.float16))
        safetensors.numpy.save_file(arrays, str(folder / "model-00002-of-00002.safetensors"))
        safetensors.numpy.save_file(
            {"a": np.zeros(1, np.float16)}, str(folder / "model-00001-of-00002.safetensors")
        )
        index = {"metadata": {}, "weight_map": {"a": "model-00001-of-00002.safetensors"}}
        (folder / INDEX).write_text(json.dumps(index))
        return folder, names, index

    few = scan(written(2_500)[0])
    _, quarter = calls(lambda: check_layout(few))
    folder, names, index = written(10_000)
    scanned = scan(folder)
    findings, done = calls(lambda: check_layout(scanned))
    assert done < 5 * quarter, (done, quarter)
    (stray,) = [f for f in findings if f.code == "unindexed-file"]
    assert "10,000 tensors (layers 0-9" in stray.message
    # The file is not named by the index, so its tensors are not listed one by one.
    assert len(findings) == 1
    # Name the file in the index for one tensor: now each is unindexed, bounded and folded.
    index["weight_map"][names[0]] = "model-00002-of-00002.safetensors"
    (folder / INDEX).write_text(json.dumps(index))
    scanned = scan(folder)
    findings = check_layout(scanned)
    detailed = [f for f in findings if f.tensor is not None]
    summaries = [f for f in findings if f.tensor is None]
    assert len(detailed) == DETAIL_PER_FILE and len(summaries) == 1
    assert all(f.code == "unindexed-tensor" and f.layer is not None for f in detailed)
    assert f"{10_000 - 1 - DETAIL_PER_FILE:,} more tensors" in summaries[0].message


def test_detail_budget_is_shared_across_files(ckpt: Path) -> None:
    doc = _index(ckpt)
    keep = {}
    for name, file in sorted(doc["weight_map"].items()):
        keep.setdefault(file, name)  # one tensor per shard stays listed
    doc["weight_map"] = {name: file for file, name in keep.items()}
    _write_index(ckpt, doc)
    scanned = scan(ckpt)
    findings = check_index(scanned.shards, scanned.index, policy=FoldPolicy(per_file=2, per_code=3))
    unindexed = [f for f in findings if f.code == "unindexed-tensor"]
    detailed = [f for f in unindexed if f.tensor is not None]
    assert len(detailed) == 3
    # Every shard with unlisted tensors beyond its detail gets exactly one summary.
    summaries = [f for f in unindexed if f.tensor is None]
    assert sorted(f.file for f in summaries) == sorted(keep)
    listed_in_summaries = sum(
        int(f.message.split(" more tensor")[0].split()[-1]) for f in summaries
    )
    held = sum(len(s.names) for s in scanned.shards)
    assert len(detailed) + listed_in_summaries == held - len(keep)


def test_hostile_index_naming_many_missing_files_is_bounded(ckpt: Path) -> None:
    doc = _index(ckpt)
    for i in range(1000):
        doc["weight_map"][f"ghost.{i}.weight"] = f"ghost-{i:05d}.safetensors"
    _write_index(ckpt, doc)
    scanned = scan(ckpt)
    findings = check_index(scanned.shards, scanned.index, policy=FoldPolicy(per_code=10))
    missing = [f for f in findings if f.code == "index-missing-file"]
    assert len(missing) == 11
    assert "names 990 more files that are not in the folder" in missing[-1].message
    assert len(scanned.shards) == 3


@pytest.mark.parametrize(
    "layout",
    ["indented", "weight_map_first", "compact", "duplicate_across_pieces", "nested_weight_map"],
)
@pytest.mark.parametrize("listed", [0, 2, 4])
def test_index_decoded_in_pieces_equals_the_whole_decode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, layout: str, listed: int
) -> None:
    """A large index is decoded a few MB at a time when it is laid out as writers do; any
    other layout falls back to one decode. Both must give what a JSON reader gives, whether
    the shard files it names are all known to the decode (`shard_files`), some or none."""
    from inspector._internal.layouts import _common

    monkeypatch.setattr(_common, "_PIECE_BYTES", 200)  # many pieces from a small file
    weight_map = {
        f"model.layers.{i}.mlp.w{i % 3}.weight": f"m-{i % 4}.safetensors" for i in range(60)
    }
    doc = {"metadata": {"total_size": 1, "weight_map": {"x": "y"}}, "weight_map": weight_map}
    if layout == "weight_map_first":
        doc = {"weight_map": weight_map, "metadata": {"total_size": 1}}
    text = json.dumps(doc, indent=None if layout == "compact" else 2)
    if layout == "duplicate_across_pieces":
        # The same name early and late: JSON keeps the last value at the first position.
        first = next(iter(weight_map))
        text = text.replace("\n  }\n}", f',\n    "{first}": "late.safetensors"\n  }}\n}}')
    if layout == "nested_weight_map":
        text = text.replace('"metadata": {', '"metadata": {"note": "a \\"weight_map\\": {", ', 1)
    path = tmp_path / INDEX
    path.write_text(text)
    expected = json.loads(text)
    root = local_location(tmp_path)
    files = [f"m-{i}.safetensors" for i in range(listed)]
    parsed, problems = _common.read_index_doc(root / INDEX, root=root, shard_files=files)
    assert problems == [] and parsed is not None
    assert dict(parsed.weight_map) == expected["weight_map"]
    assert list(parsed.weight_map) == list(expected["weight_map"])
    assert dict(parsed.metadata) == expected["metadata"]
    split = _common.weight_map_columns(path.read_bytes(), shard_files=files)
    # Without newlines (compact) the map is one piece; the others fall back to one decode.
    assert (split is None) == (layout in ("weight_map_first", "duplicate_across_pieces"))


@pytest.mark.parametrize("pieces", [False, True])
def test_bytes_that_are_not_utf8_make_the_index_unreadable_not_the_scan(
    ckpt: Path, monkeypatch: pytest.MonkeyPatch, pieces: bool
) -> None:
    """A string that is not UTF-8 (a fuzz crasher: the JSON decoder raises UnicodeDecodeError
    there, not its decode error), whole or in the pieces a large index is decoded in."""
    from inspector._internal.layouts import _common

    if pieces:
        monkeypatch.setattr(_common, "_PIECE_BYTES", 64)
    doc = _index(ckpt)
    text = json.dumps(doc, indent=2).encode()
    name = next(iter(doc["weight_map"]))
    (ckpt / INDEX).write_bytes(text.replace(name.encode(), name.encode() + b"\xd8", 1))
    data = (ckpt / INDEX).read_bytes()
    assert (len(data) >= _common._PIECE_BYTES) == pieces
    assert _common.weight_map_columns(data) is None  # no pieces: the whole decode reports it
    findings = [f for f in scan(ckpt).read_findings if f.code == "index-unreadable"]
    assert len(findings) == 1 and "is not valid JSON" in findings[0].message


def test_config_salvage_skips_values_that_are_not_utf8(tmp_path: Path) -> None:
    from inspector._internal.layouts._common import salvage_json_prefix

    (tmp_path / CONFIG_NAME).write_bytes(
        b'{"num_hidden_layers": 4, "model_type": "ab\xd8", "num_experts": 8, '
    )
    assert salvage_json_prefix(local_location(tmp_path) / CONFIG_NAME) == {
        "num_hidden_layers": 4,
        "num_experts": 8,
    }


def test_fold_listed_lists_the_first_items_then_counts_the_rest() -> None:
    """The fold the .bin, compressed-tensors and block-quant checks share: per_code items as
    findings of their own (with their tensor), one finding for the rest, in the same file."""
    items = [(f"t{i}", "why") for i in range(5)]
    found = fold_listed(
        "bin-record-missing",
        items,
        file="f.bin",
        tensor=lambda item: item[0],
        message=lambda item: f"{item[0]}: {item[1]}",
        rest=lambda left: f"{len(left)} more ({left[0][0]}...)",
        policy=FoldPolicy(per_code=3),
    )
    assert [f.message for f in found] == ["t0: why", "t1: why", "t2: why", "2 more (t3...)"]
    assert [f.tensor for f in found] == ["t0", "t1", "t2", None]
    assert {(f.file, f.code) for f in found} == {("f.bin", "bin-record-missing")}
    exact = fold_listed(
        "bin-record-missing", items[:3], file="f", message=str, rest=str, policy=FoldPolicy(3, 3)
    )
    assert len(exact) == 3  # nothing left over: no summary


def test_fold_modules_says_each_module_then_counts_the_rest_with_examples() -> None:
    """The compressed-tensors and block-quant config checks word their module lists so."""
    items = [(f"model.layers.{i}.mlp", "is quantized") for i in range(FOLD.per_code + 2)]
    found = fold_modules(
        "quant-scheme-mismatch", items, head=CONFIG_NAME, advice="re-export", file="c.json"
    )
    assert len(found) == FOLD.per_code + 1
    assert found[0].message == "config.json: 'model.layers.0.mlp' is quantized; re-export"
    first, second = items[FOLD.per_code][0], items[FOLD.per_code + 1][0]
    assert found[-1].message == (
        f"config.json: 2 more modules the same way ({first}, {second}); re-export"
    )
    assert {(f.file, f.code) for f in found} == {("c.json", "quant-scheme-mismatch")}


def _drifts(folder: Path) -> dict[str, object]:
    """Ways the index and shards stop agreeing entry for entry, each applied to a copy."""
    doc = _index(folder)
    wmap = doc["weight_map"]
    name = sorted(wmap)[3]
    other = SHARD_1 if wmap[name] != SHARD_1 else SHARD_3
    empty = {"metadata": {"format": "pt"}}
    return {
        "healthy": None,
        "entry dropped": {**doc, "weight_map": {k: v for k, v in wmap.items() if k != name}},
        "entry to the wrong file": {**doc, "weight_map": {**wmap, name: other}},
        "entry no shard holds": {**doc, "weight_map": {**wmap, "model.gone.weight": SHARD_1}},
        "entry to a missing file": {**doc, "weight_map": {**wmap, name: "model-gone.safetensors"}},
        "file named as ./file": {**doc, "weight_map": {k: f"./{v}" for k, v in wmap.items()}},
        "a shard holding nothing": ("empty.safetensors", empty),
        "a shard listed nowhere": ("extra.safetensors", {"model.extra.weight": np.ones(2)}),
        "a name in two shards": ("copy.safetensors", {name: np.ones(2)}),
    }


_DRIFTS = (
    "healthy",
    "entry dropped",
    "entry to the wrong file",
    "entry no shard holds",
    "entry to a missing file",
    "file named as ./file",
    "a shard holding nothing",
    "a shard listed nowhere",
    "a name in two shards",
)
_AGREEING = ("healthy", "file named as ./file")


@pytest.mark.parametrize("drift", _DRIFTS)
def test_agreeing_index_shortcut_gives_what_the_walk_gives(
    ckpt: Path, drift: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The index check skips its per-name walk when index and shards agree entry for entry;
    on every drift it must fall back, and the findings must be those of the walk."""
    change = _drifts(ckpt)[drift]
    if isinstance(change, tuple):
        file, tensors = change
        if "metadata" in tensors:
            (ckpt / file).write_bytes(b"\x02\x00\x00\x00\x00\x00\x00\x00{}")
        else:
            safetensors.numpy.save_file(tensors, str(ckpt / file))
    elif change is not None:
        _write_index(ckpt, change)
    scanned = scan(ckpt)
    took = []
    real = index_check._IndexView.agrees

    def spy(view: index_check._IndexView) -> bool:
        took.append(real(view))
        return took[-1]

    monkeypatch.setattr(index_check._IndexView, "agrees", spy)
    fast = check_index(scanned.shards, scanned.index)
    monkeypatch.setattr(index_check._IndexView, "agrees", lambda view: False)
    walked = check_index(scanned.shards, scanned.index)
    assert took == [drift in _AGREEING]
    assert fast == walked
    assert bool(fast) == (drift not in _AGREEING)


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 6), min_size=1, max_size=5),
    order=st.randoms(use_true_random=False),
    cut=st.integers(0, 30),
    extra=st.lists(st.sampled_from(["x", "t0", "dangling.weight"]), max_size=2, unique=True),
)
def test_index_holders_by_runs_equal_the_lookup_of_every_name(
    sizes: list[int], order: random.Random, cut: int, extra: list[str]
) -> None:
    """The index view's holders, taken run by run while the index follows the shards, are
    what the look-up of each name in the held map gives, in any order (`_holders`)."""
    shards, at = [], 0
    for i, n in enumerate(sizes):
        names = [f"t{at + k}" for k in range(n)]
        at += n
        shards.append(
            ShardHeader.from_columns(
                f"s{i}",
                8,
                0,
                None,
                names,
                ["F32"] * n,
                [[1]] * n,
                [4 * k for k in range(n)],
                [4 * k + 4 for k in range(n)],
            )
        )
    held = held_tensors(shards)
    listed = [name for s in shards for name in s.names]
    tail = listed[cut:]
    order.shuffle(tail)  # the index follows the shards up to `cut`, then any order
    names = tuple(dict.fromkeys([*listed[:cut], *tail, *extra]))
    expected = [held.first.get(name, -1) for name in names]
    assert index_check._holders(names, held).tolist() == expected


# msgspec's string tables hash with murmur2 and no seed (`_common._LITERAL_FILES`).
_MURMUR = 0x5BD1E995
_WORD = 0xFFFFFFFF


def _mix(k: int) -> int:
    k = (k * _MURMUR) & _WORD
    return ((k ^ (k >> 24)) * _MURMUR) & _WORD


def _unmix(h: int) -> int:
    inverse = pow(_MURMUR, -1, 1 << 32)
    h = (h * inverse) & _WORD
    return ((h ^ (h >> 24)) * inverse) & _WORD


def _one_hash_names(count: int) -> list[str]:
    """`count` file names of one length and one murmur2 hash: `m-` and two 8-byte blocks of
    [a-z0-9], each block pair taking the hash state to the same value (its second word
    solved for), then `.safetensors`."""
    alphabet = b"abcdefghijklmnopqrstuvwxyz0123456789"
    words = [int.from_bytes(bytes(w), "little") for w in itertools.product(alphabet, repeat=4)]
    allowed = set(alphabet)

    def blocks(state: int) -> tuple[list[bytes], int]:
        start = (state * _MURMUR) & _WORD
        goal = (((start ^ _mix(words[0])) * _MURMUR) & _WORD) ^ _mix(words[0])
        found = []
        for first in words:
            second = _unmix(goal ^ (((start ^ _mix(first)) * _MURMUR) & _WORD))
            tail = second.to_bytes(4, "little")
            if set(tail) <= allowed:
                found.append(first.to_bytes(4, "little") + tail)
                if len(found) * len(found) >= count:
                    return found, goal
        raise AssertionError("too few blocks")

    head, suffix = b"m-", b".safetensors"
    padded = head + b"0" * (4 - len(head) % 4)  # whole words before the blocks
    state = len(padded) + 16 + len(suffix)
    for at in range(0, len(padded), 4):
        state = ((state * _MURMUR) & _WORD) ^ _mix(int.from_bytes(padded[at : at + 4], "little"))
    first, state = blocks(state)
    second, _ = blocks(state)
    return [(padded + a + b + suffix).decode() for a in first for b in second][:count]


def test_shard_files_sharing_one_hash_are_not_a_literal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A folder of 200 shards whose names share msgspec's hash, named by a large index: each
    entry's decode walked past all of them (60,000 files: scan 4x slower), so that many files
    are decoded as plain strings, and the index reads as a JSON reader reads it."""
    from inspector._internal.layouts import _common

    monkeypatch.setattr(_common, "_PIECE_BYTES", 200)  # many pieces from a small file
    count = 200
    state = {f"model.layers.{i}.mlp.weight": torch.zeros(1) for i in range(count)}
    save_torch_state_dict(state, tmp_path, max_shard_size=4)  # one tensor a shard
    doc = json.loads((tmp_path / INDEX).read_text())
    written = sorted(set(doc["weight_map"].values()))
    hostile = dict(zip(written, _one_hash_names(count), strict=True))
    for old, new in hostile.items():
        (tmp_path / old).rename(tmp_path / new)
    doc["weight_map"] = {k: hostile[v] for k, v in doc["weight_map"].items()}
    _write_index(tmp_path, doc)
    literals: list[tuple[str, ...]] = []
    real = msgspec.json.Decoder

    def spy(kind: Any = Any, **options: Any) -> Any:
        value = typing.get_args(kind)[1:] if typing.get_origin(kind) is dict else ()
        if value and typing.get_origin(value[0]) is typing.Literal:
            literals.append(typing.get_args(value[0]))
        return real(kind, **options)

    monkeypatch.setattr(msgspec.json, "Decoder", spy)
    scanned = scan(tmp_path)
    assert not any(set(names) & set(hostile.values()) for names in literals)
    assert scanned.index is not None
    assert dict(scanned.index.weight_map) == doc["weight_map"]
