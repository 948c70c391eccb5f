"""What a `config.json` says should exist: layers, MoE layers, experts, MTP layers. Pure.

The rules mirror how the modelling code of each family decides (docs/formats.md, `config.json`):
- Qwen2/3-MoE: layer i is MoE when i is not in `mlp_only_layers` and
  `(i + 1) % decoder_sparse_step == 0`;
- DeepSeek-V2/V3, Kimi, GLM-MoE: MoE when `i >= first_k_dense_replace` and
  `i % moe_layer_freq == 0`;
- Llama 4: the `moe_layers` list, else every `interleave_moe_layer_step`-th layer;
- Nemotron-H: the block pattern (`hybrid_override_pattern` "M*E-" or, as transformers 5
  writes it, `layers_block_type` ["linear_attention", "moe", "full_attention", "mlp"]);
  the number of layers is the pattern's length (transformers 5 no longer writes
  `num_hidden_layers` for it);
- otherwise every layer is MoE when the config names an expert count.

config.json is untrusted: a layer or expert count past any real model's (`MAX_LAYERS`,
`MAX_EXPERTS`, `MAX_LAYER_EXPERTS` expert blocks) is treated as unknown, because the tables
and structure checks build one entry per declared layer and expert. The load check reports
such a config as the reason it skipped (`inspector._internal.load.verdict`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from inspector._internal.common.filenames import CONFIG_NAME

__all__ = [
    "DIM_KEYS",
    "MAX_EXPERTS",
    "MAX_LAYERS",
    "MAX_LAYER_EXPERTS",
    "MTP_NOT_STORED",
    "SPEC_KEYS",
    "ModelSpec",
    "config_dims",
    "layer_types_from_config",
    "spec_from_config",
]


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """What `config.json` says should exist. Unknown facts are None."""

    model_type: str | None = None
    num_layers: int | None = None
    # 0-based decoder layer numbers that are MoE; None when the config says nothing.
    moe_layers: frozenset[int] | None = None
    experts_per_layer: int | None = None
    mtp_layers: int = 0
    # Where the facts came from, e.g. `config.json` or `config.json:text_config`.
    source: str | None = None


# Counts a config may declare: the largest real models have about a hundred layers and a few
# hundred experts per MoE layer.
MAX_LAYERS = 2048
MAX_EXPERTS = 8192
# MoE layers x experts: one expert block each.
MAX_LAYER_EXPERTS = 250_000

_EXPERT_KEYS = (
    "n_routed_experts",
    "num_experts",
    "num_local_experts",
    "moe_num_experts",
    "num_moe_experts",
)
_MTP_KEYS = ("num_nextn_predict_layers", "mtp_num_layers", "num_mtp_layers")
_LAYER_KEYS = ("num_hidden_layers", "num_layers")
_PATTERN_KEYS = ("layers_block_type", "hybrid_override_pattern")
# Keys of the per-family MoE layer rules (see the module docstring).
_RULE_KEYS = (
    "moe_layers",
    "first_k_dense_replace",
    "moe_layer_freq",
    "decoder_sparse_step",
    "interleave_moe_layer_step",
    "mlp_only_layers",
)
# Model types whose transformers model class builds no MTP module, so `save_pretrained`
# never stores the MTP layers their config declares (the classes list them in
# `_keys_to_ignore_on_load_unexpected`, e.g. DeepSeek-V3 `model\.layers\.61.*`, GLM-4-MoE
# `model\.layers\.92.*`, Qwen3-Next `^mtp.*`). Used when transformers is not installed to
# build the model and say it exactly.
MTP_NOT_STORED = frozenset(
    {
        "bailing_hybrid",
        "deepseek_v3",
        "deepseek_v32",
        "ernie4_5_moe",
        "exaone_moe",
        "glm4_moe",
        "glm4_moe_lite",
        "glm4v_moe",
        "glm_moe_dsa",
        "longcat_flash",
        "mimo_v2_flash",
        "nemotron_h",
        "qwen3_5",
        "qwen3_5_moe",
        "qwen3_next",
    }
)
# Every key `spec_from_config` reads from a (text) config: what must survive when only part
# of a damaged config.json can be read.
SPEC_KEYS = ("model_type", *_LAYER_KEYS, *_EXPERT_KEYS, *_RULE_KEYS, *_PATTERN_KEYS, *_MTP_KEYS)
# Where multimodal configs keep the text model's config.
_TEXT_KEYS = ("text_config", "language_config", "llm_config")
# Block names of hybrid patterns -> the layer kinds the tables use.
_BLOCKS = {
    "M": "mamba",
    "mamba": "mamba",
    "linear_attention": "mamba",
    "*": "attention",
    "attention": "attention",
    "full_attention": "attention",
    "-": "dense",
    "mlp": "dense",
    "E": "moe",
    "moe": "moe",
}


def spec_from_config(config: Mapping[str, Any] | None, *, source: str = CONFIG_NAME) -> ModelSpec:
    """Derive the expected structure; the text model of a multimodal config is used."""
    if not isinstance(config, Mapping):
        return ModelSpec()
    config, source = _text_config(config, source)
    pattern = layer_types_from_config(config)
    num_layers = next((v for k in _LAYER_KEYS if (v := _int(config.get(k)))), None)
    if pattern is not None:
        num_layers = len(pattern)
    if num_layers is not None and num_layers > MAX_LAYERS:
        num_layers = None
    experts = next((v for k in _EXPERT_KEYS if (v := _int(config.get(k))) is not None), None)
    if experts is not None and not 0 < experts <= MAX_EXPERTS:
        experts = None
    moe = _moe_layers(config, num_layers, experts, pattern)
    if experts is not None and moe and len(moe) * experts > MAX_LAYER_EXPERTS:
        experts = None
    mtp = next((v for k in _MTP_KEYS if (v := _int(config.get(k))) is not None), 0)
    model_type = config.get("model_type") if isinstance(config.get("model_type"), str) else None
    return ModelSpec(model_type, num_layers, moe, experts, max(mtp, 0), source)


# Sizes a config states that fix tensor shapes (`config_dims`), and the largest value of
# each a real model has (a larger one is not believed).
DIM_KEYS = {
    "vocab_size": 1 << 24,
    "hidden_size": 1 << 20,
    "head_dim": 1 << 16,
    "num_attention_heads": 1 << 16,
    "num_key_value_heads": 1 << 16,
}


def config_dims(config: Mapping[str, Any] | None) -> dict[str, int]:
    """The sizes of `DIM_KEYS` the (text) config states as positive ints: the DCP reader's
    lower bounds on embedding, norm and attention shapes. `head_dim` only when stated (it
    is not always hidden_size / heads); `num_key_value_heads` defaults to the heads."""
    if not isinstance(config, Mapping):
        return {}
    config, _ = _text_config(config, "")
    dims = {
        key: value
        for key, cap in DIM_KEYS.items()
        if (value := _int(config.get(key))) is not None and 0 < value <= cap
    }
    if "num_attention_heads" in dims:
        dims.setdefault("num_key_value_heads", dims["num_attention_heads"])
    return dims


def layer_types_from_config(config: Mapping[str, Any] | None) -> tuple[str, ...] | None:
    """Per-layer block kinds ("mamba", "attention", "dense", "moe") of a hybrid model
    (Nemotron-H), or None when the config has no block pattern."""
    if not isinstance(config, Mapping):
        return None
    config, _ = _text_config(config, "")
    blocks = config.get("layers_block_type")
    if isinstance(blocks, list) and blocks and all(isinstance(b, str) for b in blocks):
        return tuple(_BLOCKS.get(str(b), str(b)) for b in blocks)
    pattern = config.get("hybrid_override_pattern")
    if isinstance(pattern, str) and pattern:
        return tuple(_BLOCKS.get(c, c) for c in pattern)
    return None


def _text_config(config: Mapping[str, Any], source: str) -> tuple[Mapping[str, Any], str]:
    """The nested text model config when there is one that says how many layers it has."""
    for key in _TEXT_KEYS:
        text = config.get(key)
        if isinstance(text, Mapping) and (
            _int(text.get("num_hidden_layers")) is not None
            or layer_types_from_config(text) is not None
        ):
            merged = {**text, "model_type": text.get("model_type") or config.get("model_type")}
            return merged, f"{source}:{key}"
    return config, source


def _moe_layers(
    config: Mapping[str, Any],
    num_layers: int | None,
    experts: int | None,
    pattern: tuple[str, ...] | None,
) -> frozenset[int] | None:
    """0-based MoE layer numbers, one family rule after the other (see the module doc)."""
    if num_layers is None:
        return None
    if pattern is not None:
        return frozenset(i for i, block in enumerate(pattern) if block == "moe")
    if experts is None:
        return frozenset()
    layers = set(range(num_layers))
    listed = config.get("moe_layers")
    if isinstance(listed, list) and all(type(i) is int for i in listed):
        return frozenset(i for i in listed if 0 <= i < num_layers)
    first_dense = _int(config.get("first_k_dense_replace"))
    freq = config.get("moe_layer_freq")
    if isinstance(freq, list) and len(freq) == num_layers:
        # Megatron-style per-layer flags.
        layers = {i for i, flag in enumerate(freq) if flag}
    elif first_dense is not None or _int(freq) is not None:
        step = _int(freq) or 1
        layers = {i for i in layers if i >= (first_dense or 0) and i % step == 0}
    sparse_step = _int(config.get("decoder_sparse_step")) or _int(
        config.get("interleave_moe_layer_step")
    )
    if sparse_step and sparse_step > 1:
        layers = {i for i in layers if (i + 1) % sparse_step == 0}
    only_mlp = config.get("mlp_only_layers")
    if isinstance(only_mlp, list):
        layers -= {i for i in only_mlp if type(i) is int}
    return frozenset(layers)


def _int(value: object) -> int | None:
    return value if type(value) is int else None
