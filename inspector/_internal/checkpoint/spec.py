"""What a `config.json` says should exist: layers, MoE layers, experts, MTP layers; and
what serving the model needs (`serving_spec`): attention shape, KV cache, recurrent state and
the sizes tensor parallelism splits. Pure.

The rules mirror how each family's modelling code decides (docs/formats.md, `config.json`;
listed in docs/architecture.md, "checkpoint/"). config.json is untrusted: a layer or expert
count past any real model's (`MAX_LAYERS`, `MAX_EXPERTS`, `MAX_LAYER_EXPERTS`) is treated
as unknown, because the tables and structure checks build one entry per declared layer and
expert.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from inspector._internal.common.dtypes import TORCH_DTYPES
from inspector._internal.common.filenames import CONFIG_NAME
from inspector._internal.common.text import short_repr

__all__ = [
    "DIM_KEYS",
    "MAX_EXPERTS",
    "MAX_LAYERS",
    "MAX_LAYER_EXPERTS",
    "MTP_NOT_STORED",
    "SPEC_KEYS",
    "LinearState",
    "MambaState",
    "ModelSpec",
    "ServingSpec",
    "config_dims",
    "layer_types_from_config",
    "serving_spec",
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
    if num_layers is not None and not 0 < num_layers <= MAX_LAYERS:
        num_layers = None  # a negative count is no count: every reader of it sizes arrays
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
    (Nemotron-H), or None when the config has no block pattern, or one of more than
    `MAX_LAYERS` blocks: a count past any real model's is unknown, and judged by its length
    before a tuple of it is built (a 200 MB pattern string would cost gigabytes)."""
    if not isinstance(config, Mapping):
        return None
    config, _ = _text_config(config, "")
    blocks = config.get("layers_block_type")
    blocks = blocks if isinstance(blocks, list) and 0 < len(blocks) <= MAX_LAYERS else []
    if blocks and all(isinstance(b, str) for b in blocks):
        return tuple(_BLOCKS.get(str(b), str(b)) for b in blocks)
    pattern = config.get("hybrid_override_pattern")
    if isinstance(pattern, str) and 0 < len(pattern) <= MAX_LAYERS:
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


# -- what serving needs ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MambaState:
    """A Mamba-2 mixer's sizes (Nemotron-H, Bamba...): its per-sequence state, and what TP
    splits (heads; groups when TP divides them)."""

    heads: int
    head_dim: int
    state_size: int
    groups: int
    conv_kernel: int
    # Bytes per element of the SSM state (`mamba_ssm_cache_dtype`; the model's 16 bits
    # when the config names none).
    ssm_itemsize: int = 2


@dataclass(frozen=True, slots=True)
class LinearState:
    """A gated-delta-net linear-attention layer's sizes (Qwen3-Next `linear_*`)."""

    key_heads: int
    value_heads: int
    key_dim: int
    value_dim: int
    conv_kernel: int


@dataclass(frozen=True, slots=True)
class ServingSpec:
    """What config.json says about serving the model. Unknown or unbelievable facts are None,
    each named in `invalid` as (key, why) when the config gave a value that cannot be used.

    `layer_attention` has one entry per decoder layer: "full" (a KV cache that grows with the
    context), "sliding" (bounded by `sliding_window`), "mla" (latent KV, every TP rank holds
    all of it), "mamba" / "linear" (a fixed state per sequence) or "none" (an MLP-only block
    of a hybrid pattern)."""

    hidden_size: int | None = None
    vocab_size: int | None = None
    heads: int | None = None
    kv_heads: int | None = None
    head_dim: int | None = None
    v_head_dim: int | None = None
    kv_lora_rank: int | None = None
    qk_rope_head_dim: int | None = None
    intermediate_size: int | None = None
    moe_intermediate_size: int | None = None
    shared_intermediate_size: int | None = None
    sliding_window: int | None = None
    layer_attention: tuple[str, ...] | None = None
    mamba: MambaState | None = None
    linear: LinearState | None = None
    max_position_embeddings: int | None = None
    tie_word_embeddings: bool = False
    invalid: tuple[tuple[str, str], ...] = field(default_factory=tuple)

    @property
    def mla(self) -> bool:
        """Multi-head latent attention (DeepSeek V2/V3, Kimi K2, GLM-MoE-Lite...)."""
        return self.kv_lora_rank is not None


# The largest value of each serving size a real model has: a larger one is not believed.
_SMALL, _WIDE, _LONG = 1 << 16, 1 << 22, 1 << 40
_SERVING_CAPS = {
    "hidden_size": 1 << 20,
    "vocab_size": 1 << 24,
    "num_attention_heads": _SMALL,
    "num_key_value_heads": _SMALL,
    "head_dim": _SMALL,
    "v_head_dim": _SMALL,
    "kv_lora_rank": _SMALL,
    "qk_rope_head_dim": _SMALL,
    "intermediate_size": _WIDE,
    "moe_intermediate_size": _WIDE,
    "shared_expert_intermediate_size": _WIDE,
    "moe_shared_expert_intermediate_size": _WIDE,
    "n_shared_experts": _SMALL,
    "sliding_window": _LONG,
    "sliding_window_pattern": _SMALL,
    "max_window_layers": 1 << 20,
    "max_position_embeddings": _LONG,
}
# Mamba-2 sizes under their names in Nemotron-H / Bamba-style configs (first found wins).
_MAMBA_KEYS = {
    "heads": ("mamba_num_heads", "mamba_n_heads"),
    "head_dim": ("mamba_head_dim", "mamba_d_head"),
    "state_size": ("ssm_state_size", "mamba_d_state"),
    "groups": ("n_groups", "mamba_n_groups"),
    "conv_kernel": ("conv_kernel", "mamba_d_conv"),
}
_LINEAR_KEYS = {
    "key_heads": "linear_num_key_heads",
    "value_heads": "linear_num_value_heads",
    "key_dim": "linear_key_head_dim",
    "value_dim": "linear_value_head_dim",
    "conv_kernel": "linear_conv_kernel_dim",
}
# `layer_types` entries (transformers' per-layer attention list) -> ServingSpec kinds.
_LAYER_TYPES = {
    "full_attention": "full",
    "attention": "full",
    "sliding_attention": "sliding",
    "chunked_attention": "sliding",
    "linear_attention": "linear",
}
# Hybrid block kinds (`layer_types_from_config`) -> ServingSpec kinds.
_BLOCK_ATTENTION = {"attention": "full", "mamba": "mamba", "dense": "none", "moe": "none"}


class _Reader:
    """Reads positive whole numbers from a config, remembering each present but unusable
    value (a string, a bool, zero, negative, past the cap) as (key, why)."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        self.config = config
        self.invalid: list[tuple[str, str]] = []

    def size(self, key: str, cap: int = _SMALL) -> int | None:
        value = self.config.get(key)
        if value is None:
            return None
        if type(value) is int and 0 < value <= cap:
            return value
        if type(value) is int:
            why = "must be positive" if value <= 0 else f"is past any real model's ({cap:,})"
        else:
            why = "is not a whole number"
        self.invalid.append((key, f"{_shown(value)} {why}"))
        return None

    def first(self, keys: tuple[str, ...], cap: int = _SMALL) -> int | None:
        return next((v for k in keys if (v := self.size(k, cap)) is not None), None)


def _shown(value: object) -> str:
    """A config value as a finding quotes it: bounded, a string in quotes (`"2"` is not 2)."""
    return f'"{short_repr(value)}"' if isinstance(value, str) else short_repr(value)


def serving_spec(config: Mapping[str, Any] | None, spec: ModelSpec) -> ServingSpec:
    """The serving facts of the (text) config, with the layer count of `spec`. Every value is
    checked before it is used: a config is untrusted, so a value that is not a positive int
    within its cap is None and named in `invalid`, never an exception."""
    if not isinstance(config, Mapping):
        return ServingSpec()
    config, _ = _text_config(config, "")
    read = _Reader(config)
    caps = _SERVING_CAPS
    heads = read.size("num_attention_heads", caps["num_attention_heads"])
    kv_heads = read.size("num_key_value_heads", caps["num_key_value_heads"]) or heads
    hidden = read.size("hidden_size", caps["hidden_size"])
    head_dim = read.size("head_dim", caps["head_dim"])
    kv_lora_rank = read.size("kv_lora_rank", caps["kv_lora_rank"])
    rope = read.size("qk_rope_head_dim", caps["qk_rope_head_dim"])
    if head_dim is None and hidden is not None and heads is not None:
        # transformers' default when the config names none (vLLM `get_head_size` too).
        head_dim = hidden // heads or None
    moe_inter = read.size("moe_intermediate_size", caps["moe_intermediate_size"])
    shared = read.first(
        ("shared_expert_intermediate_size", "moe_shared_expert_intermediate_size"), _WIDE
    )
    n_shared = read.size("n_shared_experts", caps["n_shared_experts"])
    if shared is None and n_shared is not None and moe_inter is not None:
        # DeepSeek's shared experts are one MLP of n_shared x moe_intermediate_size.
        shared = n_shared * moe_inter
    window = read.size("sliding_window", caps["sliding_window"])
    _check_layer_count(config, read)
    tie = config.get("tie_word_embeddings")
    return ServingSpec(
        hidden_size=hidden,
        vocab_size=read.size("vocab_size", caps["vocab_size"]),
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        v_head_dim=read.size("v_head_dim", caps["v_head_dim"]),
        kv_lora_rank=kv_lora_rank,
        qk_rope_head_dim=rope,
        intermediate_size=read.size("intermediate_size", caps["intermediate_size"]),
        moe_intermediate_size=moe_inter,
        shared_intermediate_size=shared,
        sliding_window=window,
        layer_attention=_layer_attention(config, spec.num_layers, read, window, kv_lora_rank),
        mamba=_mamba(config, read),
        linear=_linear(read),
        max_position_embeddings=read.size("max_position_embeddings", _LONG),
        tie_word_embeddings=tie is True,
        invalid=tuple(read.invalid),
    )


def _check_layer_count(config: Mapping[str, Any], read: _Reader) -> None:
    """Name a layer count or block pattern past `MAX_LAYERS` (which `spec_from_config`
    treats as unknown) or of the wrong type, so that what it leaves uncomputed is said."""
    for key in ("layers_block_type", "hybrid_override_pattern"):
        value = config.get(key)
        if isinstance(value, list | str) and len(value) > MAX_LAYERS:
            read.invalid.append((key, f"has {len(value):,} blocks, past any real model's"))
    if layer_types_from_config(config) is None:
        read.first(_LAYER_KEYS, MAX_LAYERS)


def _layer_attention(
    config: Mapping[str, Any],
    num_layers: int | None,
    read: _Reader,
    window: int | None,
    mla: int | None,
) -> tuple[str, ...] | None:
    """One attention kind per decoder layer (see `ServingSpec`), by the first rule that
    applies: a hybrid block pattern; transformers' `layer_types`; MLA; a sliding window with
    Gemma's `sliding_window_pattern` or Qwen2's `max_window_layers`, or on every layer."""
    blocks = layer_types_from_config(config)
    if blocks is not None:
        return tuple(_BLOCK_ATTENTION.get(b, "none") for b in blocks)
    if num_layers is None:
        return None
    types = config.get("layer_types")
    if isinstance(types, list) and types:
        known = len(types) == num_layers and all(
            isinstance(t, str) and t in _LAYER_TYPES for t in types
        )
        if not known:
            why = f"is not one known attention type per layer ({num_layers:,} layers)"
            read.invalid.append(("layer_types", f"{_shown(types)} {why}"))
            return None
        kinds = tuple(_LAYER_TYPES[t] for t in types)
        if "sliding" in kinds and window is None:
            read.invalid.append(("sliding_window", "is needed by the sliding layers"))
            return None
        return kinds
    if mla is not None:
        return ("mla",) * num_layers
    if window is None or config.get("use_sliding_window") is False:
        return ("full",) * num_layers
    pattern = read.size("sliding_window_pattern", _SMALL)
    if pattern is not None:
        # Gemma 2/3: every `pattern`-th layer is global, the others slide.
        return tuple("full" if (i + 1) % pattern == 0 else "sliding" for i in range(num_layers))
    first = read.size("max_window_layers", 1 << 20)
    if first is not None and config.get("use_sliding_window") is True:
        # Qwen2: layers from `max_window_layers` on slide.
        return tuple("sliding" if i >= first else "full" for i in range(num_layers))
    return ("sliding",) * num_layers


def _mamba(config: Mapping[str, Any], read: _Reader) -> MambaState | None:
    sizes = {field: read.first(keys) for field, keys in _MAMBA_KEYS.items()}
    if sizes["heads"] is None:
        return None
    if any(v is None for v in sizes.values()):
        missing = [keys[0] for field, keys in _MAMBA_KEYS.items() if sizes[field] is None]
        read.invalid.append((missing[0], "is needed for the Mamba state"))
        return None
    dtype = config.get("mamba_ssm_cache_dtype")
    itemsize = TORCH_DTYPES.get(dtype, (None, 2))[1] if isinstance(dtype, str) else 2
    heads, head_dim, state, groups, conv = (int(v or 0) for v in sizes.values())
    return MambaState(heads, head_dim, state, groups, conv, itemsize if itemsize in (2, 4) else 2)


def _linear(read: _Reader) -> LinearState | None:
    sizes = {field: read.size(key) for field, key in _LINEAR_KEYS.items()}
    if all(v is None for v in sizes.values()):
        return None
    if any(v is None for v in sizes.values()):
        missing = next(key for field, key in _LINEAR_KEYS.items() if sizes[field] is None)
        read.invalid.append((missing, "is needed for the linear-attention state"))
        return None
    key_heads, value_heads, key_dim, value_dim, conv = (int(v or 0) for v in sizes.values())
    return LinearState(key_heads, value_heads, key_dim, value_dim, conv)
