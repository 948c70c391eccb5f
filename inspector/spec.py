"""What a `config.json` says should exist: layers, MoE layers, experts, MTP layers. Pure."""

from __future__ import annotations

from typing import Any

from inspector.model import ModelSpec

__all__ = ["spec_from_config"]

_EXPERT_KEYS = ("n_routed_experts", "num_experts", "num_local_experts", "moe_num_experts")
_MTP_KEYS = ("num_nextn_predict_layers", "mtp_num_layers", "num_mtp_layers")


def spec_from_config(config: dict[str, Any] | None, *, source: str = "config.json") -> ModelSpec:
    """Derive the expected structure; the text model of a multimodal config is used."""
    if not isinstance(config, dict):
        return ModelSpec()
    text = config.get("text_config")
    if isinstance(text, dict) and _int(text.get("num_hidden_layers")) is not None:
        config, source = {**text, "model_type": text.get("model_type") or config.get("model_type")}, f"{source}:text_config"
    num_layers = _int(config.get("num_hidden_layers")) or _int(config.get("num_layers"))
    experts = next((v for k in _EXPERT_KEYS if (v := _int(config.get(k))) is not None), None)
    if experts == 0:
        experts = None
    moe = _moe_layers(config, num_layers, experts)
    mtp = next((v for k in _MTP_KEYS if (v := _int(config.get(k))) is not None), 0)
    model_type = config.get("model_type") if isinstance(config.get("model_type"), str) else None
    return ModelSpec(model_type, num_layers, moe, experts, mtp, source)


def _moe_layers(config: dict[str, Any], num_layers: int | None, experts: int | None) -> frozenset[int] | None:
    if num_layers is None:
        return None
    pattern = _hybrid_pattern(config, num_layers)
    if pattern is not None:
        return frozenset(i for i, block in enumerate(pattern) if block in ("E", "moe"))
    if experts is None:
        return frozenset()
    layers = set(range(num_layers))
    # DeepSeek / Kimi / GLM: the first k layers are dense, then every `moe_layer_freq`-th.
    first_dense = _int(config.get("first_k_dense_replace"))
    if first_dense is not None:
        freq = _int(config.get("moe_layer_freq")) or 1
        layers = {i for i in layers if i >= first_dense and (i - first_dense) % freq == 0}
    # Qwen-MoE: every `decoder_sparse_step`-th layer, except `mlp_only_layers`.
    step = _int(config.get("decoder_sparse_step"))
    if step and step > 1:
        layers = {i for i in layers if (i + 1) % step == 0}
    only_mlp = config.get("mlp_only_layers")
    if isinstance(only_mlp, list):
        layers -= {i for i in only_mlp if isinstance(i, int)}
    # Some configs give a per-layer list of 0/1 in moe_layer_freq.
    freq_list = config.get("moe_layer_freq")
    if isinstance(freq_list, list) and len(freq_list) == num_layers:
        layers = {i for i, flag in enumerate(freq_list) if flag}
    return frozenset(layers)


def _hybrid_pattern(config: dict[str, Any], num_layers: int) -> list[str] | None:
    """Nemotron-H: `hybrid_override_pattern` ("M-M*E...") or `layers_block_type` list."""
    blocks = config.get("layers_block_type")
    if isinstance(blocks, list) and blocks and all(isinstance(b, str) for b in blocks):
        return blocks
    pattern = config.get("hybrid_override_pattern")
    if isinstance(pattern, str) and pattern:
        return list(pattern)
    return None


def _int(value: object) -> int | None:
    return value if type(value) is int else None
