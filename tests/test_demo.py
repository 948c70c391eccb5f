"""The built-in demos: real files, healthy ones scan clean, damaged ones carry their damage."""

from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

from inspector._internal.checkpoint.scanned import ScannedCheckpoint
from inspector._internal.common.filenames import CONFIG_NAME, INDEX_NAME, QUANT_CONFIG_NAME
from inspector._internal.demo import SAFETENSORS_DEMOS, demo_names, write_demos
from inspector._internal.demo.model import GROUP_SIZE, TinyMoeSpec, build_model
from inspector._internal.demo.safetensors_layouts import save_shard, split_greedy
from inspector._internal.scan.entry import scan

INDEX = INDEX_NAME
_EXPERT = re.compile(
    r"^(model\.layers\.\d+|mtp\.layers\.\d+\.transformer_layer)\.mlp\.experts\.(\d+)\."
)


@pytest.fixture(scope="module")
def demos(demo_checkpoints: Path) -> dict[str, Path]:
    """The session's demos (written by `write_demos` once per test run), read only."""
    return {n: demo_checkpoints / n for n in demo_names() if (demo_checkpoints / n).is_dir()}


def _names(scanned: ScannedCheckpoint) -> dict[str, tuple[str, str, tuple[int, ...]]]:
    """tensor -> (file, dtype, shape) over every shard."""
    return {
        name: (s.file, dtype, shape)
        for s in scanned.shards
        for name, dtype, shape in zip(s.names, s.dtypes, s.shapes, strict=True)
    }


def _expected_count(spec: TinyMoeSpec) -> int:
    """Tensor count from the architecture, independent of how build_model loops."""
    experts = len(spec.expert_ids)
    per_expert = 12 if spec.quantized else 3
    dense = 2 + 7 + 3
    moe = 2 + 7 + 2 + 3 + experts * per_expert
    mtp_block = 2 + 7 + 2 + 3 + experts * 3
    mtp_own = 6 if spec.mtp_spelling == "deepseek" else 4
    layers = spec.first_dense * dense + (spec.num_layers - spec.first_dense) * moe
    return 3 + layers + spec.mtp_layers * (mtp_own + mtp_block)


def _read(path: Path) -> dict:
    return json.loads(path.read_text())


# -- write_demos -----------------------------------------------------------------------------


def test_write_demos_prints_one_line_per_demo_and_reruns_in_place(
    tmp_path, capsys, demos, copy_demos
):
    # What an earlier `write_demos(tmp_path)` left (the session's demos were written by it).
    first = {p.name: p for p in copy_demos(tmp_path)}
    assert list(first) == list(demos)
    shard = first["healthy-hf-sharded"] / "model-00001-of-00004.safetensors"
    before = shard.read_bytes()
    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / "other-checkpoint").mkdir()
    stale = first["healthy-hf-sharded"] / "stale.safetensors"
    stale.write_bytes(b"x")
    again = write_demos(tmp_path)
    lines = [
        line
        for line in capsys.readouterr().out.splitlines()
        if line.startswith(("wrote ", "skip "))
    ]
    assert sorted(line.split()[1] for line in lines) == sorted(demo_names())
    assert set(first) <= set(demo_names())
    for folder in again:
        readme = (folder / "README.txt").read_text()
        assert folder.name in readme and len(readme) > 40
    assert [p.name for p in again] == list(first)
    assert (tmp_path / "notes.txt").read_text() == "mine"
    assert (tmp_path / "other-checkpoint").is_dir()
    assert not stale.exists()
    # Deterministic: the same seed gives the same bytes, in every file of every demo our own
    # writer makes (torch's DCP writers put a fresh id into each run's metadata).
    assert shard.read_bytes() == before
    for name in (d.name for d in SAFETENSORS_DEMOS):
        folder = demos[name]
        for file in sorted(f for f in folder.rglob("*") if f.is_file()):
            assert (tmp_path / name / file.relative_to(folder)).read_bytes() == file.read_bytes()


# -- healthy ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "layout", "spec"),
    [
        ("healthy-safetensors-single", "safetensors-single", TinyMoeSpec()),
        ("healthy-hf-sharded", "hf-sharded", TinyMoeSpec()),
        ("healthy-modelopt-per-layer", "modelopt-per-layer", TinyMoeSpec(mtp_spelling="mtp")),
    ],
)
def test_healthy_demo_scans_clean_and_matches_the_model(demos, name, layout, spec):
    scanned = scan(demos[name])
    assert scanned.layout == layout
    assert scanned.read_findings == []
    found = _names(scanned)
    assert len(found) == _expected_count(spec)
    model = build_model(spec)
    assert {n: (d, s) for n, (_, d, s) in found.items()} == {
        n: (t.dtype, t.shape) for n, t in model.tensors.items()
    }
    assert scanned.spec.num_layers == 4 and scanned.spec.experts_per_layer == 8
    assert scanned.spec.mtp_layers == 1 and scanned.spec.moe_layers == {1, 2, 3}


def test_healthy_sharded_index_totals_are_tensor_bytes_and_elements(demos):
    scanned = scan(demos["healthy-hf-sharded"])
    assert len(scanned.shards) == 4
    found = _names(scanned)
    assert scanned.index.weight_map == {n: f for n, (f, _, _) in found.items()}
    assert scanned.index.metadata["total_size"] == sum(s.tensor_bytes for s in scanned.shards)
    numel = sum(int(np.prod(shape)) for _, _, shape in found.values())
    assert scanned.index.metadata["total_parameters"] == numel
    # Greedy in key order: concatenating the shards in file order gives the model order.
    in_file_order = [n for n, _ in sorted(found.items(), key=lambda kv: kv[1][0])]
    order = list(build_model().tensors)
    assert sorted(in_file_order, key=order.index) == order
    files = [found[n][0] for n in order]
    assert files == sorted(files)


def test_healthy_per_layer_sidecars_match_their_shards(demos):
    scanned = scan(demos["healthy-modelopt-per-layer"])
    assert len(scanned.shards) == 4 == len(scanned.sidecars)
    merged = {}
    for shard in scanned.shards:
        sidecar = scanned.sidecars[shard.file]
        assert set(sidecar.weight_map) == set(shard.names)
        assert set(sidecar.weight_map.values()) == {shard.file}
        assert sidecar.metadata["total_size"] == shard.tensor_bytes
        merged |= sidecar.weight_map
    assert scanned.index.weight_map == merged
    found = _names(scanned)
    assert found["model.embed_tokens.weight"][0] == "model-00001-of-00004.safetensors"
    last = "model-00004-of-00004.safetensors"
    assert found["lm_head.weight"][0] == found["model.norm.weight"][0] == last
    mtp = [n for n in found if n.startswith("mtp.")]
    assert mtp and {found[n][0] for n in mtp} == {last}
    layer_two = {n for n in found if n.startswith("model.layers.2.")}
    assert {found[n][0] for n in layer_two} == {"model-00003-of-00004.safetensors"}


def test_quantized_experts_are_nvfp4_and_match_the_quant_config(demos):
    scanned = scan(demos["healthy-hf-sharded"])
    found = _names(scanned)
    layers = scanned.quant_config["quantization"]["quantized_layers"]
    scaled = {n.removesuffix(".weight_scale") for n in found if n.endswith(".weight_scale")}
    assert scaled == set(layers)
    assert scanned.config["quantization_config"]["quant_method"] == "modelopt"
    hidden, inter = scanned.config["hidden_size"], scanned.config["moe_intermediate_size"]
    down = "model.layers.2.mlp.experts.5.down_proj"
    assert found[f"{down}.weight"][1:] == ("U8", (hidden, inter // 2))
    assert found[f"{down}.weight_scale"][1:] == ("F8_E4M3", (hidden, inter // GROUP_SIZE))
    assert found[f"{down}.weight_scale_2"][1:] == ("F32", ())
    assert found[f"{down}.input_scale"][1:] == ("F32", ())
    assert layers[down] == {"quant_algo": "NVFP4", "group_size": GROUP_SIZE}
    # The MTP layer and lm_head stay BF16 and are excluded.
    assert found["model.layers.4.mlp.experts.0.up_proj.weight"][1] == "BF16"
    exclude = scanned.quant_config["quantization"]["exclude_modules"]
    assert "lm_head" in exclude and "model.layers.4*" in exclude


# -- damaged ---------------------------------------------------------------------------------


def test_1422_last_sidecar_and_index_omit_the_mtp_tensors_the_shard_holds(demos):
    scanned = scan(demos["modelopt-1422-sidecar-drift"])
    assert scanned.layout == "modelopt-per-layer"
    assert scanned.read_findings == []  # the damage is a disagreement, not a broken file
    last = scanned.shard("model-00004-of-00004.safetensors")
    sidecar = scanned.sidecars[last.file]
    hidden = set(last.names) - set(sidecar.weight_map)
    assert hidden and all(n.startswith("mtp.layers.0.") for n in hidden)
    assert "mtp.layers.0.eh_proj.weight" in hidden
    assert set(sidecar.weight_map) < set(last.names)
    assert not hidden & set(scanned.index.weight_map)
    hidden_bytes = sum(
        e - b for n, b, e in zip(last.names, last.begins, last.ends, strict=True) if n in hidden
    )
    assert sidecar.metadata["total_size"] == last.tensor_bytes - hidden_bytes
    for shard in scanned.shards[:-1]:
        assert set(scanned.sidecars[shard.file].weight_map) == set(shard.names)


def test_1631_config_is_truncated_and_only_experts_0_to_63_exist(demos):
    folder = demos["modelopt-1631-ep-collision"]
    text = (folder / CONFIG_NAME).read_text()
    with pytest.raises(json.JSONDecodeError):
        json.loads(text)
    assert '"n_routed_experts": 512' in text
    scanned = scan(folder)
    assert scanned.layout == "modelopt-per-layer"
    assert [p.code for p in scanned.read_findings] == ["config-unreadable"]
    experts: dict[str, set[int]] = defaultdict(set)
    found = _names(scanned)
    for name in found:
        if match := _EXPERT.match(name):
            experts[match.group(1)].add(int(match.group(2)))
    expected_layers = {f"model.layers.{i}" for i in (1, 2, 3)} | {"mtp.layers.0.transformer_layer"}
    assert set(experts) == expected_layers
    assert all(ids == set(range(64)) for ids in experts.values())
    assert found["model.layers.1.mlp.gate.weight"][2] == (512, 16)
    quantized = _read(folder / QUANT_CONFIG_NAME)["quantization"]["quantized_layers"]
    assert {int(k.split(".")[5]) for k in quantized} == set(range(64))
    for shard in scanned.shards:
        assert set(scanned.sidecars[shard.file].weight_map) == set(shard.names)


def test_2289_every_tensor_collapsed_into_one_file_while_reference_had_four(demos):
    folder = demos["automodel-2289-collapsed"]
    scanned = scan(folder)
    assert scanned.layout == "hf-sharded" and scanned.read_findings == []
    assert [s.file for s in scanned.shards] == ["model-00001-of-00001.safetensors"]
    assert set(scanned.index.weight_map.values()) == {"model-00001-of-00001.safetensors"}
    reference = _read(folder / "reference" / INDEX)
    files = sorted(set(reference["weight_map"].values()))
    assert files == [f"model.safetensors-{i:05d}-of-00004.safetensors" for i in range(1, 5)]
    assert set(reference["weight_map"]) == set(scanned.shards[0].names)
    assert reference["metadata"]["total_size"] == scanned.shards[0].tensor_bytes
    assert len(scanned.shards[0].names) == _expected_count(TinyMoeSpec(quantized=False))
    assert not (folder / QUANT_CONFIG_NAME).exists()
    assert set(scanned.shards[0].dtypes) == {"BF16", "F32"}


def test_3624_only_the_mtp_layer_carries_extra_state(demos):
    scanned = scan(demos["megatron-3624-mtp-extra-state"])
    assert scanned.layout == "hf-sharded" and scanned.read_findings == []
    found = _names(scanned)
    extra = [n for n in found if n.endswith("_extra_state")]
    assert extra == ["mtp.layers.0.transformer_layer.self_attention.core_attention._extra_state"]
    assert found[extra[0]][1:] == ("U8", (0,))
    assert extra[0] in scanned.index.weight_map
    # Every decoder layer has an attention block, yet none has the extra state.
    assert all(f"model.layers.{i}.self_attn.o_proj.weight" in found for i in range(4))


# -- building blocks -------------------------------------------------------------------------


def test_split_greedy_keeps_order_and_respects_the_limit():
    items = [("a", 40), ("b", 50), ("c", 30), ("d", 200), ("e", 10), ("f", 90)]
    shards = split_greedy(items, max_bytes=100)
    assert [n for shard in shards for n in shard] == [n for n, _ in items]
    sizes = dict(items)
    assert shards == [["a", "b"], ["c"], ["d"], ["e", "f"]]
    assert all(sum(sizes[n] for n in s) <= 100 or len(s) == 1 for s in shards)


def test_ml_dtypes_and_torch_writers_produce_identical_files(tmp_path):
    pytest.importorskip("ml_dtypes")
    torch = pytest.importorskip("torch")
    from safetensors.torch import load_file

    tensors = dict(list(build_model().tensors.items())[:40])
    save_shard(tmp_path / "a.safetensors", tensors, backend="ml_dtypes")
    save_shard(tmp_path / "b.safetensors", tensors, backend="torch")
    assert (tmp_path / "a.safetensors").read_bytes() == (tmp_path / "b.safetensors").read_bytes()
    loaded = load_file(tmp_path / "a.safetensors")
    gate = "model.layers.1.mlp.experts.0.gate_proj"
    assert loaded[f"{gate}.weight_scale"].dtype == torch.float8_e4m3fn
    assert loaded["model.embed_tokens.weight"].dtype == torch.bfloat16
    raw = loaded["model.embed_tokens.weight"].view(torch.int16).numpy().view(np.uint16)
    assert np.array_equal(raw, tensors["model.embed_tokens.weight"].data)
    scales = loaded[f"{gate}.weight_scale"].float()
    assert bool(((scales >= 0.5) & (scales < 2)).all())


@pytest.mark.parametrize(
    ("name", "layout", "healthy"),
    [
        ("healthy-dcp-sharded", "dcp-sharded", True),
        ("automodel-2289-dcp-mapping-collapsed", "dcp-sharded", False),
        ("healthy-torch-dist", "torch-dist", True),
        ("megatron-4448-rerun-drift", "torch-dist", False),
    ],
)
def test_demos_from_other_writers_are_detected(demos, name, layout, healthy):
    if name not in demos:
        pytest.skip(f"{name}: its writer module is not available")
    scanned = scan(demos[name])
    assert scanned.layout == layout
    assert (demos[name] / "README.txt").is_file()
    if healthy:
        assert scanned.read_findings == []
