"""Tiny models of each MoE family, saved by transformers 5 in several shards, then scanned.

The layers and experts tables are checked against the config and against the model
transformers actually built (which layers got experts, how many bytes each layer holds).
What transformers 5.x saves, as observed: per-expert tensors for Qwen3-MoE, Mixtral,
DeepSeek-V3 and Nemotron-H (`...experts.{E}.{proj}.weight`), fused 3-D tensors for GPT-OSS
and Llama 4 (`...experts.gate_up_proj`), and no MTP layers even when the config declares
them.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from inspector._internal.checkpoint.scanned import ScannedCheckpoint
from inspector._internal.common.filenames import INDEX_NAME
from inspector._internal.scan.entry import scan

transformers = pytest.importorskip("transformers")

ATTN = {"num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 64}


@dataclass(frozen=True)
class Family:
    name: str
    config: object
    model_class: str
    experts: int
    tensors_per_expert: int
    fused: bool


FAMILIES = [
    Family(
        "qwen3-moe",
        transformers.Qwen3MoeConfig(
            **ATTN, hidden_size=16, head_dim=8, intermediate_size=32, moe_intermediate_size=8,
            num_hidden_layers=3, num_experts=4, num_experts_per_tok=2, mlp_only_layers=[0],
        ),
        "Qwen3MoeForCausalLM", 4, 3, False,
    ),
    Family(
        "mixtral",
        transformers.MixtralConfig(
            **ATTN, hidden_size=16, head_dim=8, intermediate_size=32, num_hidden_layers=2,
            num_local_experts=4, num_experts_per_tok=2,
        ),
        "MixtralForCausalLM", 4, 3, False,
    ),
    Family(
        "deepseek-v3",
        transformers.DeepseekV3Config(
            vocab_size=64, hidden_size=32, intermediate_size=32, moe_intermediate_size=8,
            num_hidden_layers=3, num_attention_heads=2, num_key_value_heads=2, n_routed_experts=8,
            n_shared_experts=1, num_experts_per_tok=2, first_k_dense_replace=1, kv_lora_rank=8,
            q_lora_rank=8, qk_rope_head_dim=4, qk_nope_head_dim=4, v_head_dim=4, n_group=2,
            topk_group=1, num_nextn_predict_layers=1,
        ),
        "DeepseekV3ForCausalLM", 8, 3, False,
    ),
    Family(
        "nemotron-h",
        transformers.NemotronHConfig(
            vocab_size=64, hidden_size=32, hybrid_override_pattern="ME*-E", num_attention_heads=2,
            num_key_value_heads=1, head_dim=16, intermediate_size=32, mamba_num_heads=4,
            mamba_head_dim=8, n_groups=1, ssm_state_size=8, chunk_size=16, n_routed_experts=4,
            n_shared_experts=1, moe_intermediate_size=8, moe_shared_expert_intermediate_size=8,
            num_experts_per_tok=2,
        ),
        "NemotronHForCausalLM", 4, 2, False,
    ),
    Family(
        "gpt-oss",
        transformers.GptOssConfig(
            **ATTN, hidden_size=32, head_dim=16, intermediate_size=16, num_hidden_layers=2,
            num_local_experts=4, num_experts_per_tok=2,
            layer_types=["sliding_attention", "full_attention"],
        ),
        "GptOssForCausalLM", 4, 4, True,
    ),
    Family(
        "llama4",
        transformers.Llama4TextConfig(
            **ATTN, hidden_size=32, head_dim=16, intermediate_size=16, intermediate_size_mlp=32,
            num_hidden_layers=2, num_local_experts=4, interleave_moe_layer_step=2,
        ),
        "Llama4ForCausalLM", 4, 2, True,
    ),
]  # fmt: skip


@dataclass(frozen=True)
class Saved:
    family: Family
    scanned: ScannedCheckpoint
    folder: Path
    moe_layers: set[int]
    layer_bytes: dict[int, int]
    state_bytes: int


def _decoder_layers(model: torch.nn.Module) -> torch.nn.ModuleList:
    inner = getattr(model, "model", None) or model.backbone
    return inner.layers


@pytest.fixture(scope="module", params=FAMILIES, ids=lambda f: f.name)
def saved(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Saved:
    family: Family = request.param
    torch.manual_seed(0)
    model = getattr(transformers, family.model_class)(family.config)
    folder = tmp_path_factory.mktemp(family.name)
    model.save_pretrained(folder, max_shard_size="20KB")
    moe = {
        i
        for i, layer in enumerate(_decoder_layers(model))
        if any(name.split(".")[-1] == "experts" for name, _ in layer.named_modules())
    }
    layer_bytes: dict[int, int] = {}
    state = model.state_dict()
    for name, tensor in state.items():
        if m := re.search(r"\blayers\.(\d+)\.", name):
            key = int(m.group(1))
            layer_bytes[key] = layer_bytes.get(key, 0) + tensor.numel() * tensor.element_size()
    total = sum(t.numel() * t.element_size() for t in state.values())
    return Saved(family, scan(folder), folder, moe, layer_bytes, total)


def test_scan_is_clean_and_sharded(saved: Saved) -> None:
    assert saved.scanned.read_findings == []
    assert saved.scanned.layout == "hf-sharded"
    assert len(saved.scanned.shards) > 1
    # Names on disk differ from the in-memory ones (transformers converts on save), so
    # compare with the index it wrote, and bytes with the model's own tensors.
    index = json.loads((saved.folder / INDEX_NAME).read_bytes())
    assert set(saved.scanned.tensors["name"]) == set(index["weight_map"])
    assert int(saved.scanned.tensors["nbytes"].sum()) == saved.state_bytes


def test_layers_match_config_and_model(saved: Saved) -> None:
    spec = saved.scanned.spec
    layers = saved.scanned.layers
    decoder = layers[~layers["is_mtp"]]
    assert decoder["layer"].tolist() == list(range(spec.num_layers))
    assert (
        set(decoder.loc[decoder["kind"] == "moe", "layer"]) == saved.moe_layers == spec.moe_layers
    )
    assert dict(zip(decoder["layer"], decoder["bytes"], strict=True)) == saved.layer_bytes
    assert (decoder["tensors"] > 0).all()
    # transformers does not save MTP layers (the DeepSeek-V3 config declares one): no MTP
    # rows, no MTP tensors; the structure check reports that as mtp-not-stored (an info).
    assert not layers["is_mtp"].any()
    assert not (saved.scanned.tensors["kind"] == "mtp").any()
    assert spec.mtp_layers == getattr(saved.family.config, "num_nextn_predict_layers", 0)


def test_experts_complete(saved: Saved) -> None:
    family = saved.family
    layers = saved.scanned.layers
    moe = layers[layers["kind"] == "moe"]
    assert (moe["experts_found"] == family.experts).all()
    assert (moe["experts_expected"] == family.experts).all()
    experts = saved.scanned.experts
    assert len(experts) == len(saved.moe_layers) * family.experts
    assert not experts["missing"].any()
    assert (experts["tensors_found"] == family.tensors_per_expert).all()
    assert (experts["tensors_expected"] == family.tensors_per_expert).all()


def test_expert_tensors_saved_as_observed(saved: Saved) -> None:
    tensors = saved.scanned.tensors
    expert = tensors[tensors["kind"] == "expert"]
    assert len(expert) > 0
    assert (expert["fused"] == saved.family.fused).all()
    if saved.family.fused:
        assert expert["expert"].isna().all()
        assert {shape[0] for shape in expert["shape"]} == {saved.family.experts}
    else:
        assert set(expert["expert"]) == set(range(saved.family.experts))
    assert set(expert["layer"]) == saved.moe_layers
    # Every named decoder tensor got a layer; the embedding, final norm and head did not.
    no_layer = tensors[tensors["layer"].isna()]
    assert set(no_layer["kind"]) <= {"embedding", "norm", "output_head"}
