"""ModelSpec from real transformers configs, checked against the models transformers builds."""

from __future__ import annotations

import json

import pytest
import torch

from inspector._internal.checkpoint.spec import (
    MAX_LAYERS,
    layer_types_from_config,
    spec_from_config,
)
from inspector._internal.common.filenames import CONFIG_NAME

transformers = pytest.importorskip("transformers")

TINY = {"vocab_size": 32, "hidden_size": 16, "num_attention_heads": 2, "num_key_value_heads": 1}


def _json(config: object) -> dict:
    """What `save_pretrained` writes to config.json."""
    return json.loads(config.to_json_string())


def _moe_layers_of(model: torch.nn.Module) -> set[int]:
    """Layers whose MLP transformers built with experts (the ground truth)."""
    layers = model.model.layers
    return {i for i, layer in enumerate(layers) if hasattr(getattr(layer, "mlp", None), "experts")}


def test_qwen3_moe_sparse_step_and_mlp_only_layers() -> None:
    config = transformers.Qwen3MoeConfig(
        **TINY, head_dim=8, intermediate_size=16, moe_intermediate_size=8, num_hidden_layers=6,
        num_experts=4, num_experts_per_tok=2, decoder_sparse_step=2, mlp_only_layers=[3],
    )  # fmt: skip
    spec = spec_from_config(_json(config))
    assert spec.num_layers == 6
    assert spec.moe_layers == {1, 5}
    assert spec.moe_layers == _moe_layers_of(transformers.Qwen3MoeForCausalLM(config))
    assert spec.experts_per_layer == 4 and spec.mtp_layers == 0
    assert spec.model_type == "qwen3_moe"


def test_deepseek_v3_first_dense_and_mtp() -> None:
    config = transformers.DeepseekV3Config(
        **TINY, intermediate_size=16, moe_intermediate_size=8, num_hidden_layers=4,
        n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2, first_k_dense_replace=2,
        kv_lora_rank=8, q_lora_rank=8, qk_rope_head_dim=4, qk_nope_head_dim=4, v_head_dim=4,
        n_group=2, topk_group=1, num_nextn_predict_layers=1,
    )  # fmt: skip
    spec = spec_from_config(_json(config))
    assert spec.moe_layers == {2, 3}
    assert spec.moe_layers == _moe_layers_of(transformers.DeepseekV3ForCausalLM(config))
    assert (spec.num_layers, spec.experts_per_layer, spec.mtp_layers) == (4, 8, 1)


def test_deepseek_moe_layer_freq() -> None:
    # DeepSeek's own modelling code: MoE when i >= first_k_dense_replace and i % freq == 0.
    config = _json(transformers.DeepseekV3Config(num_hidden_layers=7, first_k_dense_replace=1))
    config["moe_layer_freq"] = 2
    assert spec_from_config(config).moe_layers == {2, 4, 6}


def test_mixtral_every_layer() -> None:
    config = transformers.MixtralConfig(
        **TINY, head_dim=8, intermediate_size=16, num_hidden_layers=3, num_local_experts=4
    )
    spec = spec_from_config(_json(config))
    assert spec.moe_layers == {0, 1, 2} and spec.experts_per_layer == 4


def test_nemotron_h_transformers5_layers_block_type() -> None:
    config = transformers.NemotronHConfig(
        vocab_size=32, hidden_size=32, hybrid_override_pattern="ME*-E", n_routed_experts=4,
        num_attention_heads=2, num_key_value_heads=1, head_dim=16, mamba_num_heads=4,
        mamba_head_dim=8, n_groups=1, num_nextn_predict_layers=1,
    )  # fmt: skip
    written = _json(config)
    # transformers 5 writes the list form and no num_hidden_layers; the count is the length.
    assert "num_hidden_layers" not in written and "layers_block_type" in written
    spec = spec_from_config(written)
    assert spec.num_layers == 5
    assert spec.moe_layers == {1, 4}
    assert spec.experts_per_layer == 4 and spec.mtp_layers == 1
    assert layer_types_from_config(written) == ("mamba", "moe", "attention", "dense", "moe")


def test_nemotron_h_legacy_pattern() -> None:
    # Older Nemotron-H config.json files carry the pattern string.
    legacy = {
        "model_type": "nemotron_h",
        "num_hidden_layers": 4,
        "hybrid_override_pattern": "M-M*",
        "n_routed_experts": 0,
    }
    spec = spec_from_config(legacy)
    assert spec.num_layers == 4 and spec.moe_layers == frozenset()
    assert spec.experts_per_layer is None
    assert layer_types_from_config(legacy) == ("mamba", "dense", "mamba", "attention")


def test_llama4_nested_text_config() -> None:
    text = transformers.Llama4TextConfig(
        **TINY, head_dim=8, intermediate_size=16, intermediate_size_mlp=32, num_hidden_layers=4,
        num_local_experts=4, interleave_moe_layer_step=2,
    )  # fmt: skip
    config = transformers.Llama4Config(text_config=text.to_dict())
    spec = spec_from_config(_json(config))
    assert spec.source == "config.json:text_config"
    assert spec.model_type == "llama4_text"
    assert spec.num_layers == 4
    assert spec.moe_layers == {1, 3} and spec.experts_per_layer == 4


def test_gpt_oss_every_layer() -> None:
    config = transformers.GptOssConfig(
        **TINY, head_dim=8, intermediate_size=16, num_hidden_layers=2, num_local_experts=4
    )
    spec = spec_from_config(_json(config))
    assert spec.moe_layers == {0, 1} and spec.experts_per_layer == 4


def test_dense_model_has_no_moe_layers() -> None:
    config = transformers.LlamaConfig(**TINY, intermediate_size=16, num_hidden_layers=3)
    spec = spec_from_config(_json(config))
    assert spec.num_layers == 3 and spec.moe_layers == frozenset()
    assert spec.experts_per_layer is None


@pytest.mark.parametrize(
    ("config", "layers", "experts", "mtp"),
    [
        (None, None, None, 0),
        ([1, 2], None, None, 0),
        ({"num_hidden_layers": "4", "num_experts": True}, None, None, 0),
        ({"num_hidden_layers": 2, "n_routed_experts": 0}, 2, None, 0),
        ({"num_hidden_layers": 2, "num_experts": -3, "num_nextn_predict_layers": -1}, 2, None, 0),
        ({"num_layers": 3, "num_moe_experts": 8, "mtp_num_layers": 2}, 3, 8, 2),
        ({"text_config": "oops", "num_hidden_layers": 1}, 1, None, 0),
    ],
)
def test_malformed_configs_never_raise(
    config: object, layers: int | None, experts: int | None, mtp: int
) -> None:
    spec = spec_from_config(config)  # type: ignore[arg-type]
    assert (spec.num_layers, spec.experts_per_layer, spec.mtp_layers) == (layers, experts, mtp)


def test_truncated_config_keeps_every_key_the_spec_reads(tmp_path) -> None:
    """Concurrent writers cut config.json short; the salvaged keys are the ones the spec
    reads, Megatron-style `num_moe_experts` and `num_mtp_layers` included."""
    from safetensors.torch import save_file

    from inspector._internal.scan.entry import scan

    save_file({"model.norm.weight": torch.zeros(4)}, str(tmp_path / "model.safetensors"))
    text = json.dumps(
        {"model_type": "x", "num_layers": 6, "num_moe_experts": 64, "num_mtp_layers": 1,
         "hidden_size": 16, "vocab_size": 32},
        indent=2,
    )  # fmt: skip
    (tmp_path / CONFIG_NAME).write_text(text[: text.index('"vocab_size"')])
    scanned = scan(tmp_path)
    assert [p.code for p in scanned.read_findings] == ["config-unreadable"]
    assert (scanned.spec.num_layers, scanned.spec.experts_per_layer) == (6, 64)
    assert scanned.spec.mtp_layers == 1
    assert "num_moe_experts=64" in scanned.read_findings[0].message
    assert "num_mtp_layers=1" in scanned.read_findings[0].message


@pytest.mark.parametrize(
    ("config", "layers", "experts"),
    [
        # A hostile count (JSON integers have no size limit) would build a set per layer.
        ({"num_hidden_layers": int("7" * 120), "n_routed_experts": 4}, None, 4),
        ({"num_hidden_layers": 2049, "num_experts": 8}, None, 8),
        ({"num_hidden_layers": 2048, "num_experts": 8193}, 2048, None),
        # 61 MoE layers of 8,192 experts: 499,712 expert blocks, over the 250,000 bound.
        ({"num_hidden_layers": 61, "num_local_experts": 8192}, 61, None),
        # Kimi K2's size stays: 61 layers of 384 experts.
        ({"num_hidden_layers": 61, "n_routed_experts": 384}, 61, 384),
    ],
)
def test_counts_past_any_real_model_are_unknown(
    config: dict, layers: int | None, experts: int | None
) -> None:
    spec = spec_from_config(config)
    assert (spec.num_layers, spec.experts_per_layer) == (layers, experts)
    assert spec.moe_layers is None or len(spec.moe_layers) <= 2048


def test_a_block_pattern_past_any_real_model_is_unknown_before_it_is_built() -> None:
    """A 20,000,000-block `hybrid_override_pattern` used to be expanded into a tuple of 20M
    kinds by every reader of the config (the scan, the tables, fit): 217 MB and seconds each.
    Past MAX_LAYERS blocks the count is unknown, judged by its length first."""
    assert layer_types_from_config({"hybrid_override_pattern": "M-" * 10_000_000}) is None
    assert layer_types_from_config({"layers_block_type": ["mlp"] * (MAX_LAYERS + 1)}) is None
    assert spec_from_config({"hybrid_override_pattern": "M" * (MAX_LAYERS + 1)}).num_layers is None
    assert spec_from_config({"hybrid_override_pattern": "M" * MAX_LAYERS}).num_layers == MAX_LAYERS
