"""The four tables, on checkpoints written with huggingface_hub's sharded writer."""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from safetensors import safe_open
from work_count import calls

from inspector._internal.checkpoint.scanned import (
    LogicalTensors,
    ScannedCheckpoint,
    ShardedInfo,
    TorchDistInfo,
    TorchDistTensor,
)
from inspector._internal.checkpoint.spec import ModelSpec
from inspector._internal.checkpoint.tables import _name_column, build_tables
from inspector._internal.common.columns import Coded
from inspector._internal.formats.safetensors import ShardHeader
from inspector._internal.scan.entry import scan

transformers = pytest.importorskip("transformers")

PROJ = ("gate_proj", "up_proj", "down_proj")


def _qwen3_moe_config(layers: int, experts: int, *, mlp_only: list[int]) -> object:
    return transformers.Qwen3MoeConfig(
        vocab_size=32, hidden_size=16, head_dim=8, num_attention_heads=2, num_key_value_heads=1,
        intermediate_size=16, moe_intermediate_size=8, num_hidden_layers=layers,
        num_experts=experts, num_experts_per_tok=2, mlp_only_layers=mlp_only,
    )  # fmt: skip


def _moe_state(layers: range, experts: int, dense: set[int]) -> dict[str, torch.Tensor]:
    state = {
        "model.embed_tokens.weight": torch.zeros(32, 16),
        "lm_head.weight": torch.zeros(32, 16),
    }
    for layer in layers:
        prefix = f"model.layers.{layer}"
        state[f"{prefix}.self_attn.q_proj.weight"] = torch.zeros(16, 16)
        state[f"{prefix}.input_layernorm.weight"] = torch.zeros(16)
        if layer in dense:
            for proj in PROJ:
                state[f"{prefix}.mlp.{proj}.weight"] = torch.zeros(16, 16)
            continue
        state[f"{prefix}.mlp.gate.weight"] = torch.zeros(experts, 16)
        for e in range(experts):
            for proj in PROJ:
                state[f"{prefix}.mlp.experts.{e}.{proj}.weight"] = torch.zeros(8, 16)
    return state


def test_missing_and_incomplete_experts(write_state_dict) -> None:
    state = _moe_state(range(3), 4, dense={0})
    for proj in PROJ:
        del state[f"model.layers.2.mlp.experts.3.{proj}.weight"]
    del state["model.layers.1.mlp.experts.1.down_proj.weight"]
    folder = write_state_dict(state, max_shard_size="4KB")
    _qwen3_moe_config(3, 4, mlp_only=[0]).save_pretrained(folder)
    scanned = scan(folder)
    assert scanned.read_findings == []
    experts = scanned.experts.set_index(["layer", "expert"])
    assert len(experts) == 8  # layers 1 and 2, experts 0-3
    assert experts.loc[(2, 3)].tolist() == [0, 3, 0, True]
    assert experts.loc[(1, 1)].tolist() == [2, 3, 2 * 8 * 16 * 4, False]
    assert experts.loc[(1, 0), "bytes"] == 3 * 8 * 16 * 4
    assert int(experts["missing"].sum()) == 1
    layers = scanned.layers.set_index("layer")
    assert layers["kind"].tolist() == ["dense", "moe", "moe"]
    assert layers["experts_found"].tolist() == [0, 4, 3]
    assert layers["experts_expected"].tolist() == [0, 4, 4]


def test_declared_layers_without_tensors_are_rows(write_state_dict) -> None:
    folder = write_state_dict(_moe_state(range(2), 4, dense={0}), max_shard_size="4KB")
    _qwen3_moe_config(4, 4, mlp_only=[0]).save_pretrained(folder)
    scanned = scan(folder)
    layers = scanned.layers
    assert layers["layer"].tolist() == [0, 1, 2, 3]
    assert layers["tensors"].tolist()[2:] == [0, 0]
    assert layers["bytes"].tolist()[2:] == [0, 0]
    assert layers["kind"].tolist() == ["dense", "moe", "moe", "moe"]
    assert layers["dtypes"].tolist() == ["F32", "F32", "", ""]
    missing = scanned.experts[scanned.experts["missing"]]
    assert sorted(set(missing["layer"].tolist())) == [2, 3] and len(missing) == 8
    # Expected tensors per expert of an empty layer come from its siblings.
    assert set(missing["tensors_expected"].tolist()) == {3}


def test_deepseek_mtp_extra_layer(write_state_dict) -> None:
    state = _moe_state(range(3), 2, dense={0})
    for part in (
        "enorm",
        "hnorm",
        "eh_proj",
        "embed_tokens",
        "shared_head.head",
        "shared_head.norm",
    ):
        state[f"model.layers.2.{part}.weight"] = torch.zeros(4, 4)
    folder = write_state_dict(state, max_shard_size="4KB")
    config = transformers.DeepseekV3Config(
        vocab_size=32, hidden_size=16, num_hidden_layers=2, first_k_dense_replace=1,
        n_routed_experts=2, num_nextn_predict_layers=1,
    )  # fmt: skip
    config.save_pretrained(folder)
    scanned = scan(folder)
    layers = scanned.layers.set_index("layer")
    assert layers.index.tolist() == [0, 1, 2]
    assert layers["is_mtp"].tolist() == [False, False, True]
    assert layers["kind"].tolist() == ["dense", "moe", "mtp"]
    # DeepSeek's MTP block is MoE: its experts are counted like a decoder layer's.
    assert layers.loc[2, "experts_found"] == 2 and layers.loc[2, "experts_expected"] == 2
    tensors = scanned.tensors.set_index("name")
    for name in ("model.layers.2.embed_tokens.weight", "model.layers.2.input_layernorm.weight"):
        assert tensors.loc[name, "kind"] == "mtp" and tensors.loc[name, "is_mtp"]
    assert tensors.loc["model.layers.2.mlp.experts.1.up_proj.weight", "kind"] == "expert"
    assert not tensors.loc["model.layers.1.input_layernorm.weight", "is_mtp"]


def test_mtp_layers_numbered_after_decoder_layers(write_state_dict) -> None:
    state = {}
    for layer in range(2):
        state[f"decoder.layers.{layer}.self_attention.linear_qkv.weight"] = torch.zeros(8, 4)
        state[f"decoder.layers.{layer}.mlp.linear_fc1.weight"] = torch.zeros(8, 4)
    for k in range(2):
        state[f"mtp.layers.{k}.enorm.weight"] = torch.zeros(4)
        state[f"mtp.layers.{k}.transformer_layer.self_attention.linear_qkv.weight"] = torch.zeros(
            8, 4
        )
    state["mtp.fc.weight"] = torch.zeros(4, 8)
    scanned = scan(write_state_dict(state, max_shard_size=300))
    layers = scanned.layers
    assert layers["layer"].tolist() == [0, 1, 2, 3]
    assert layers["is_mtp"].tolist() == [False, False, True, True]
    assert layers["kind"].tolist() == ["dense", "dense", "mtp", "mtp"]
    # Layer-less `mtp.*` tensors belong to MTP block 0.
    assert layers["tensors"].tolist() == [2, 2, 3, 2]
    tensors = scanned.tensors.set_index("name")
    assert tensors.loc["mtp.layers.1.enorm.weight", "layer"] == 3


def test_fused_experts_spread_over_expert_axis(write_state_dict) -> None:
    state = {}
    for layer in range(2):
        prefix = f"model.layers.{layer}.mlp"
        state[f"{prefix}.experts.gate_up_proj"] = torch.zeros(6, 8, 16, dtype=torch.bfloat16)
        state[f"{prefix}.experts.gate_up_proj_bias"] = torch.zeros(6, 16, dtype=torch.bfloat16)
        state[f"{prefix}.experts.down_proj"] = torch.zeros(6, 8, 8, dtype=torch.bfloat16)
        state[f"{prefix}.router.weight"] = torch.zeros(6, 8, dtype=torch.bfloat16)
    scanned = scan(write_state_dict(state, max_shard_size="2KB"))
    experts = scanned.experts
    assert len(experts) == 12 and not experts["missing"].any()
    assert set(experts["tensors_found"].tolist()) == {3}
    assert experts["bytes"].tolist() == [(8 * 16 + 16 + 8 * 8) * 2] * 12
    layers = scanned.layers
    assert layers["experts_found"].tolist() == [6, 6] == layers["experts_expected"].tolist()
    assert layers["tensors"].tolist() == [4, 4]
    assert layers["dtypes"].tolist() == ["BF16", "BF16"]


def test_tensor_and_file_columns(write_state_dict) -> None:
    state = {
        f"model.layers.{i}.self_attn.q_proj.weight": torch.ones(16, 16, dtype=torch.float8_e4m3fn)
        for i in range(4)
    }
    state |= {f"model.layers.{i}.self_attn.q_proj.weight_scale": torch.ones(1) for i in range(4)}
    state["model.norm.weight"] = torch.ones(16, dtype=torch.bfloat16)
    folder = write_state_dict(state, max_shard_size=600)
    (folder / "stray.safetensors").write_bytes(b"abc")
    scanned = scan(folder)
    tensors = scanned.tensors
    assert len(tensors) == 9
    assert (tensors["nbytes"] == tensors["end"] - tensors["begin"]).all()
    row = tensors.set_index("name").loc["model.layers.2.self_attn.q_proj.weight"]
    assert (row["dtype"], row["shape"], row["numel"], row["nbytes"]) == (
        "F8_E4M3",
        (16, 16),
        256,
        256,
    )
    assert (row["layer"], row["module"], row["param"], row["kind"]) == (
        2,
        "self_attn.q_proj",
        "weight",
        "attention",
    )
    assert scanned.layers["dtypes"].tolist() == ["F32,F8_E4M3"] * 4
    files = scanned.files.set_index("file")
    for file in files.index:
        path = folder / file
        assert files.loc[file, "size"] == os.path.getsize(path)
        if file == "stray.safetensors":
            continue
        with path.open("rb") as f:
            assert files.loc[file, "header_bytes"] == struct.unpack("<Q", f.read(8))[0]
        with safe_open(path, "pt") as f:
            keys = list(f.keys())
        on_disk = tensors[tensors["file"] == file]
        assert files.loc[file, "tensors"] == len(keys)
        assert files.loc[file, "tensor_bytes"] == int(on_disk["nbytes"].sum())
        layer_ids = on_disk["layer"].dropna()
        if len(layer_ids):
            assert files.loc[file, "first_layer"] == layer_ids.min()
            assert files.loc[file, "last_layer"] == layer_ids.max()
            assert files.loc[file, "layers"] == layer_ids.nunique()
    stray = files.loc["stray.safetensors"]
    assert not stray["readable"] and stray["problems"] == 1 and stray["tensors"] == 0
    assert stray["first_layer"] is pd_na()
    assert files.drop(index="stray.safetensors")["readable"].all()


def pd_na() -> object:
    import pandas as pd

    return pd.NA


def test_truncated_shard_counts_its_problem(write_state_dict) -> None:
    folder = write_state_dict(_moe_state(range(2), 2, dense=set()), max_shard_size="2KB")
    victim = sorted(folder.glob("*.safetensors"))[1]
    with victim.open("r+b") as f:
        f.truncate(os.path.getsize(victim) - 16)
    scanned = scan(folder)
    files = scanned.files.set_index("file")
    assert files.loc[victim.name, "problems"] == 1
    assert files.loc[victim.name, "readable"]
    assert files["problems"].sum() == len(scanned.read_findings) == 1


def _torch_dist_scan() -> ScannedCheckpoint:
    """A torch_dist checkpoint as its layout module describes it: stacked layer tensors."""
    tensors = {
        "decoder.layers.self_attention.linear_qkv.weight": ((4, 48, 16), "BF16"),
        "decoder.layers.mlp.experts.experts.linear_fc1.weight": ((4, 8, 32, 16), "BF16"),
        "embedding.word_embeddings.weight": ((64, 16), "BF16"),
    }
    names = list(tensors)
    shapes = [tensors[n][0] for n in names]
    nbytes = [int(np.prod(s)) * 2 for s in shapes]
    storage = {
        (n, (0,) * len(s)): ("__0_0.distcp", 0, b)
        for n, s, b in zip(names, shapes, nbytes, strict=True)
    }
    info = TorchDistInfo(
        "iter_0000001", {"sharded_backend": "torch_dist"},
        {n: TorchDistTensor(d, s, (((0,) * len(s), s),)) for n, (s, d) in tensors.items()},
        [], storage, {"__0_0.distcp": sum(nbytes)}, None,
    )  # fmt: skip
    logical = LogicalTensors(
        tuple(names),
        Coded.encode(["__0_0.distcp"] * 3),
        Coded.encode(["BF16"] * 3),
        Coded.encode(shapes),
        np.asarray(nbytes),
    )
    spec = ModelSpec(num_layers=4, moe_layers=frozenset(range(4)), experts_per_layer=8)
    return ScannedCheckpoint(Path("."), "torch-dist", info, logical=logical, spec=spec)


def test_stacked_torch_dist_tensors_spread_over_layers() -> None:
    tables = build_tables(_torch_dist_scan())
    assert tables.tensors["layer"].isna().all()
    assert tables.tensors["begin"].isna().all()
    layers = tables.layers
    assert layers["layer"].tolist() == [0, 1, 2, 3]
    assert layers["tensors"].tolist() == [2] * 4
    assert layers["bytes"].tolist() == [(48 * 16 + 8 * 32 * 16) * 2] * 4
    assert layers["experts_found"].tolist() == [8] * 4
    experts = tables.experts
    assert len(experts) == 32 and not experts["missing"].any()
    assert set(experts["bytes"].tolist()) == {32 * 16 * 2}
    files = tables.files
    assert files["file"].tolist() == ["__0_0.distcp"]
    assert files["tensors"].tolist() == [3] and files["readable"].tolist() == [True]


GOLDEN = Path(__file__).resolve().parent / "fixtures" / "writers"


def test_torch_dist_mtp_after_stacked_layers_and_objects_in_layer_keys() -> None:
    """megatron-core's own save (2 stacked decoder layers, 1 MTP block, no config): the MTP
    block is layer 2, after the 2 layers of the stacked axis, and the sharded objects
    (`_extra_state/shard_{layer}_2`, `shard_{layer}.{expert}_2.4`) are keys of their layers."""
    from inspector._internal.checkpoint.tables import layer_keys

    scanned = scan(GOLDEN / "megatron" / "healthy")
    layers = scanned.layers
    assert layers["layer"].tolist() == [0, 1, 2]
    assert layers["is_mtp"].tolist() == [False, False, True]
    keys = layer_keys(scanned)
    rows = zip(keys.layer.tolist(), keys.module.tolist(), keys.param.tolist(), strict=True)
    entries = [(n, f"{keys.modules[m]}.{keys.params[p]}") for n, m, p in rows]
    held = {entry for entry, obj in zip(entries, keys.object.tolist(), strict=True) if obj}
    for layer in (0, 1):
        assert (layer, "self_attention.linear_proj._extra_state") in held
        assert (layer, "mlp.experts.experts.linear_fc1._extra_state") in held
    assert (2, "eh_proj._extra_state") in held
    assert (2, "self_attention.linear_qkv._extra_state") in held
    # stacked tensors count once per layer of their leading axis
    tensors = keys.layer[~keys.object]
    assert (tensors == 0).sum() == (tensors == 1).sum() == 7


def test_empty_checkpoint_has_empty_tables() -> None:
    tables = build_tables(ScannedCheckpoint(Path("."), "hf-sharded", ShardedInfo()))
    assert tables.tensors.empty and tables.files.empty
    assert tables.layers.empty and tables.experts.empty
    assert "kind" in tables.layers.columns and "missing" in tables.experts.columns


def _big_scan(layers: int, experts: int) -> ScannedCheckpoint:
    shards = []
    for layer in range(layers):
        names = [
            f"model.layers.{layer}.mlp.experts.{e}.{proj}.{param}"
            for e in range(experts)
            for proj in PROJ
            for param in ("weight", "weight_scale_inv")
        ]
        names.append(f"model.layers.{layer}.self_attn.q_proj.weight")
        begins = [i * 64 for i in range(len(names))]
        ends = [b + 64 for b in begins]
        shards.append(
            ShardHeader.from_columns(
                f"model-{layer + 1:05d}-of-{layers:05d}.safetensors", 8 + 100 + ends[-1], 100,
                None, names, ["F8_E4M3"] * len(names), [(8, 8)] * len(names), begins, ends,
            )
        )  # fmt: skip
    spec = ModelSpec("deepseek_v3", layers, frozenset(range(layers)), experts, 0)
    return ScannedCheckpoint(Path("."), "hf-sharded", ShardedInfo(), shards, spec=spec)


def test_tables_of_93k_tensors_take_no_step_per_tensor() -> None:
    """The tables are built column by column (the names in chunks): the calls made grow far
    slower than the tensors (a step per tensor was the slow path: seconds at 300k). Counted,
    not timed (tests/work_count.py); benchmarks/bench_scan.py times the scan with its tables."""
    small, big = _big_scan(layers=61, experts=8), _big_scan(layers=61, experts=256)
    few, done_few = calls(lambda: build_tables(small))
    tables, done = calls(lambda: build_tables(big))
    assert len(tables.tensors) == 61 * (256 * 6 + 1)
    assert len(tables.experts) == 61 * 256 and not tables.experts["missing"].any()
    assert tables.layers["experts_found"].tolist() == [256] * 61
    assert len(few.tensors) == 61 * (8 * 6 + 1)
    # The same 61 shards: less than one call more per ten tensors more (about one per 80
    # here, a few hundred per chunk of names); a step per tensor makes at least one per tensor.
    assert done - done_few < (len(tables.tensors) - len(few.tensors)) / 10, (done, done_few)


def test_numel_is_the_shape_product_even_when_sizes_lie(tmp_path: Path) -> None:
    """Clean shards take numel from their byte sizes; a shard whose header lies about a size
    or a dtype still gets the product of each shape."""
    from safetensors.torch import save_file

    from inspector._internal.formats.safetensors import read_shard

    good = tmp_path / "good.safetensors"
    save_file(
        {
            "model.layers.0.mlp.gate_proj.weight": torch.ones(6, 10, dtype=torch.bfloat16),
            "model.layers.0.mlp.up_proj.weight_scale": torch.ones(3, dtype=torch.float32),
            "model.layers.0.input_layernorm.weight": torch.ones(7, dtype=torch.uint8),
            "model.norm.weight": torch.ones((), dtype=torch.float64),
        },
        str(good),
    )
    # Hand-written malformed header: a size that does not match the shape, an unknown dtype.
    header = {
        "model.layers.1.self_attn.q_proj.weight": {
            "dtype": "F32", "shape": [4, 5], "data_offsets": [0, 40],
        },
        "model.layers.1.self_attn.k_proj.weight": {
            "dtype": "Q3", "shape": [2, 3], "data_offsets": [40, 52],
        },
    }  # fmt: skip
    raw = json.dumps(header).encode()
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(52))
    shards = [read_shard(good, root=tmp_path), read_shard(bad, root=tmp_path)]
    assert {f.code for f in shards[1].findings} >= {"size-mismatch", "unknown-dtype"}
    tensors = build_tables(ScannedCheckpoint(tmp_path, "hf-sharded", ShardedInfo(), shards)).tensors
    numel = dict(zip(tensors["name"], tensors["numel"].tolist(), strict=True))
    assert numel == {
        "model.layers.0.mlp.gate_proj.weight": 60,
        "model.layers.0.mlp.up_proj.weight_scale": 3,
        "model.layers.0.input_layernorm.weight": 7,
        "model.norm.weight": 1,
        "model.layers.1.self_attn.q_proj.weight": 20,
        "model.layers.1.self_attn.k_proj.weight": 6,
    }
    assert tensors.set_index("name").loc["model.layers.1.self_attn.q_proj.weight", "nbytes"] == 40


@given(
    st.lists(
        st.text(st.characters(blacklist_categories=["Cs"]), max_size=12),
        max_size=20,
    )
)
def test_name_column_is_what_pandas_infers(names: list[str]) -> None:
    """The name column built in one piece (`_name_column`) has the dtype and values pandas
    infers from the same strings (empty, non-ASCII, NUL and empty names included)."""
    ours = pd.DataFrame({"name": _name_column(names)}, copy=False)["name"]
    theirs = pd.DataFrame({"name": np.array(names, dtype=object)})["name"]
    assert ours.dtype == theirs.dtype
    assert ours.equals(theirs)
    assert ours.tolist() == names


def test_name_column_leaves_unencodable_names_to_pandas() -> None:
    """A lone surrogate (not UTF-8 encodable) takes pandas' own conversion."""
    names = ["a.weight", "\ud800.weight"]
    assert isinstance(_name_column(names), np.ndarray)


def _summary_both_ways(make: Callable[[], ScannedCheckpoint]) -> tuple[dict, dict]:
    """`summarize` of a fresh scan (from the numpy columns: no frame is built) and of one
    whose tables were built first (its figures kept by `build_tables`)."""
    from inspector._internal.report.summary import summarize

    alone = make()
    plain = summarize(alone)
    assert "tables" not in vars(alone)
    framed = make()
    framed.tables  # noqa: B018 (builds the tables first)
    return plain, summarize(framed)


def test_summary_from_columns_is_the_one_from_the_tables(demo_checkpoints: Path) -> None:
    folders = sorted(p for p in demo_checkpoints.iterdir() if p.is_dir())
    assert len(folders) >= 8
    for folder in folders:
        plain, framed = _summary_both_ways(lambda folder=folder: scan(folder))
        assert json.dumps(plain, default=str) == json.dumps(framed, default=str), folder
    plain, framed = _summary_both_ways(_torch_dist_scan)
    assert plain == framed and plain["moe_layers"] == 4


def test_figures_of_repeated_names_and_tied_dtypes(tmp_path: Path) -> None:
    """A name stored in two shards counts once in the parameters (its first row, as
    `drop_duplicates` keeps it), and dtypes holding the same bytes keep pandas' order."""
    from safetensors.torch import save_file

    from inspector._internal.checkpoint.parameters import scan_parameters
    from inspector._internal.checkpoint.tables import scan_figures

    state = {
        "model.layers.0.mlp.up_proj.weight": torch.zeros(4, 4, dtype=torch.bfloat16),
        "model.layers.0.mlp.down_proj.weight": torch.zeros(4, 8, dtype=torch.uint8),
        "model.layers.0.mlp.gate_proj.weight": torch.zeros(2, 8, dtype=torch.float16),
        "model.norm.weight": torch.zeros(8, dtype=torch.float32),
    }
    save_file(state, str(tmp_path / "model-00001-of-00002.safetensors"))
    # The same name again, with another shape and dtype: the first row is the one counted.
    again = {"model.layers.0.mlp.up_proj.weight": torch.zeros(4, dtype=torch.float64)}
    save_file(again, str(tmp_path / "model-00002-of-00002.safetensors"))
    fresh, framed = scan(tmp_path), scan(tmp_path)
    figures = scan_figures(fresh)
    t = framed.tensors
    by_dtype = t.groupby("dtype", observed=True)["nbytes"].sum().sort_values(ascending=False)
    assert figures.dtype_bytes == tuple((str(k), int(v)) for k, v in by_dtype.items())
    assert [b for _, b in figures.dtype_bytes] == [32] * 5
    assert (figures.tensors, figures.total_bytes, figures.files) == (5, 160, len(framed.files))
    assert scan_parameters(fresh) == scan_parameters(framed) == 16 + 32 + 16 + 8
    assert "tables" not in vars(fresh)
