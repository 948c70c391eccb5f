"""A tiny quantized MoE model with MTP, as named tensors plus `config.json` and
`hf_quant_config.json`: the one model every safetensors demo is cut from. Pure (no IO).

Names follow DeepSeek-V3 in Hugging Face spelling (`model.layers.{L}...`, MLA attention,
router `mlp.gate`, shared experts, routed experts per expert id). Routed experts of the decoder
are NVFP4-like (docs/formats.md, "Model-Optimizer per-layer exports"): packed `weight` U8
[out, in/2], `weight_scale` F8_E4M3 [out, in/16], scalar F32 `weight_scale_2` and
`input_scale`. Everything else is BF16.

Tensor data is kept as raw little-endian storage (BF16 as uint16 bits, F8_E4M3 as uint8 codes)
so that any real safetensors writer can be given a view of it (see `safetensors_layouts`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

__all__ = ["GROUP_SIZE", "DemoModel", "DemoTensor", "TinyMoeSpec", "build_model"]

# NVFP4 block size: one F8_E4M3 scale per 16 input elements.
GROUP_SIZE = 16
_STORAGE = {"BF16": np.uint16, "F8_E4M3": np.uint8, "U8": np.uint8, "F32": np.float32}
_EXPERT_PROJS = ("gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True, slots=True)
class DemoTensor:
    """One tensor: its safetensors dtype and its raw storage (`_STORAGE[dtype]` elements)."""

    dtype: str
    data: np.ndarray

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.data.shape)

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes)

    @property
    def numel(self) -> int:
        return int(self.data.size)


@dataclass(frozen=True, slots=True)
class TinyMoeSpec:
    """Sizes and options of the demo model. `stored_experts` below `experts` reproduces an
    export that kept only some expert ids while the config declares all of them."""

    num_layers: int = 4
    first_dense: int = 1
    experts: int = 8
    stored_experts: int | None = None
    hidden: int = 16
    dense_intermediate: int = 32
    # A multiple of GROUP_SIZE, so that down_proj's input splits into whole scale blocks.
    moe_intermediate: int = 16
    vocab: int = 64
    heads: int = 2
    mtp_layers: int = 1
    # "deepseek": MTP as extra layers `model.layers.{num_layers + k}`; "mtp": `mtp.layers.{k}`.
    mtp_spelling: Literal["deepseek", "mtp"] = "deepseek"
    quantized: bool = True
    seed: int = 0

    @property
    def expert_ids(self) -> range:
        return range(self.experts if self.stored_experts is None else self.stored_experts)

    @property
    def mtp_prefixes(self) -> list[str]:
        """Where each MTP layer's own tensors live (the inner block may nest further)."""
        if self.mtp_spelling == "deepseek":
            return [f"model.layers.{self.num_layers + k}." for k in range(self.mtp_layers)]
        return [f"mtp.layers.{k}." for k in range(self.mtp_layers)]


@dataclass(frozen=True)
class DemoModel:
    """Tensors in model order (embedding, layers, final norm, head, MTP) plus the JSON files."""

    spec: TinyMoeSpec
    tensors: dict[str, DemoTensor]
    config: dict[str, Any]
    quant_config: dict[str, Any] | None = None
    mtp_names: frozenset[str] = field(default_factory=frozenset)

    @property
    def total_size(self) -> int:
        return sum(t.nbytes for t in self.tensors.values())

    @property
    def total_parameters(self) -> int:
        return sum(t.numel for t in self.tensors.values())


def build_model(spec: TinyMoeSpec | None = None) -> DemoModel:
    """The demo model for `spec`: deterministic small random values, same seed, same bytes."""
    spec = spec or TinyMoeSpec()
    make = _Maker(np.random.default_rng(spec.seed))
    tensors: dict[str, DemoTensor] = {
        "model.embed_tokens.weight": make.bf16(spec.vocab, spec.hidden)
    }
    for layer in range(spec.num_layers):
        tensors |= _decoder_layer(
            make, spec, f"model.layers.{layer}.", moe=layer >= spec.first_dense
        )
    tensors["model.norm.weight"] = make.norm(spec.hidden)
    tensors["lm_head.weight"] = make.bf16(spec.vocab, spec.hidden)
    mtp: dict[str, DemoTensor] = {}
    for prefix in spec.mtp_prefixes:
        mtp |= _mtp_layer(make, spec, prefix)
    quant = _quant_config(spec) if spec.quantized else None
    return DemoModel(spec, tensors | mtp, _config(spec, quant), quant, frozenset(mtp))


# -- tensors -------------------------------------------------------------------------------


class _Maker:
    """Deterministic values per dtype, drawn from one generator in model order."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng

    def bf16(self, *shape: int, scale: float = 0.02) -> DemoTensor:
        values = (self.rng.standard_normal(shape, dtype=np.float32) * scale).astype(np.float32)
        # BF16 is the upper half of an F32; truncation is good enough for demo values.
        return DemoTensor("BF16", (values.view(np.uint32) >> 16).astype(np.uint16))

    def norm(self, size: int) -> DemoTensor:
        ones = (
            np.ones(size, dtype=np.float32)
            + self.rng.standard_normal(size, dtype=np.float32) * 0.01
        )
        return DemoTensor("BF16", (ones.view(np.uint32) >> 16).astype(np.uint16))

    def f32(self, *shape: int, low: float = 0.001, high: float = 0.01) -> DemoTensor:
        # asarray: a 0-d draw is a numpy scalar, and the writers need an array.
        return DemoTensor("F32", np.asarray(self.rng.uniform(low, high, shape), dtype=np.float32))

    def nvfp4(self, out_dim: int, in_dim: int) -> dict[str, DemoTensor]:
        """Packed weight (two E2M1 codes a byte, every code valid) and its scales."""
        return {
            "weight": DemoTensor("U8", self.rng.integers(0, 256, (out_dim, in_dim // 2), np.uint8)),
            # E4M3 codes 0x30-0x3f are the finite positive values 0.5 to 1.875.
            "weight_scale": DemoTensor(
                "F8_E4M3", self.rng.integers(0x30, 0x40, (out_dim, in_dim // GROUP_SIZE), np.uint8)
            ),
            "weight_scale_2": self.f32(),
            "input_scale": self.f32(),
        }


def _attention(make: _Maker, spec: TinyMoeSpec, prefix: str) -> dict[str, DemoTensor]:
    """DeepSeek MLA projections with ranks of hidden/2 and half-rope head dims."""
    h, rank, head = spec.hidden, spec.hidden // 2, spec.hidden // spec.heads
    rope = nope = head // 2
    return {
        f"{prefix}self_attn.q_a_proj.weight": make.bf16(rank, h),
        f"{prefix}self_attn.q_a_layernorm.weight": make.norm(rank),
        f"{prefix}self_attn.q_b_proj.weight": make.bf16(spec.heads * (nope + rope), rank),
        f"{prefix}self_attn.kv_a_proj_with_mqa.weight": make.bf16(rank + rope, h),
        f"{prefix}self_attn.kv_a_layernorm.weight": make.norm(rank),
        f"{prefix}self_attn.kv_b_proj.weight": make.bf16(spec.heads * (nope + head), rank),
        f"{prefix}self_attn.o_proj.weight": make.bf16(h, spec.heads * head),
    }


def _mlp(make: _Maker, prefix: str, hidden: int, inter: int) -> dict[str, DemoTensor]:
    return {
        f"{prefix}gate_proj.weight": make.bf16(inter, hidden),
        f"{prefix}up_proj.weight": make.bf16(inter, hidden),
        f"{prefix}down_proj.weight": make.bf16(hidden, inter),
    }


def _experts(
    make: _Maker, spec: TinyMoeSpec, prefix: str, *, quantized: bool
) -> dict[str, DemoTensor]:
    h, inter = spec.hidden, spec.moe_intermediate
    out: dict[str, DemoTensor] = {}
    for expert in spec.expert_ids:
        base = f"{prefix}mlp.experts.{expert}."
        if not quantized:
            out |= _mlp(make, base, h, inter)
            continue
        for proj in _EXPERT_PROJS:
            dims = (h, inter) if proj == "down_proj" else (inter, h)
            out |= {f"{base}{proj}.{k}": v for k, v in make.nvfp4(*dims).items()}
    return out


def _decoder_layer(
    make: _Maker, spec: TinyMoeSpec, prefix: str, *, moe: bool, quantized: bool | None = None
) -> dict[str, DemoTensor]:
    """Norms, attention and either a dense MLP or router + shared expert + routed experts."""
    quantized = spec.quantized if quantized is None else quantized
    out = {f"{prefix}input_layernorm.weight": make.norm(spec.hidden)}
    out |= _attention(make, spec, prefix)
    out[f"{prefix}post_attention_layernorm.weight"] = make.norm(spec.hidden)
    if not moe:
        return out | _mlp(make, f"{prefix}mlp.", spec.hidden, spec.dense_intermediate)
    # The router is replicated on every rank, so it always has a row per declared expert.
    out[f"{prefix}mlp.gate.weight"] = make.bf16(spec.experts, spec.hidden)
    out[f"{prefix}mlp.gate.e_score_correction_bias"] = make.f32(spec.experts)
    out |= _mlp(make, f"{prefix}mlp.shared_experts.", spec.hidden, spec.moe_intermediate)
    return out | _experts(make, spec, prefix, quantized=quantized)


def _mtp_layer(make: _Maker, spec: TinyMoeSpec, prefix: str) -> dict[str, DemoTensor]:
    """One MTP layer, kept in BF16 (excluded from quantization, as exporters do).

    DeepSeek spelling: a full decoder layer plus `embed_tokens`, `enorm`, `hnorm`, `eh_proj`
    and `shared_head`. `mtp` spelling (Megatron export): `enorm`, `hnorm`, `eh_proj`,
    `final_layernorm` and the decoder block nested under `transformer_layer.`.
    """
    h = spec.hidden
    out = {
        f"{prefix}enorm.weight": make.norm(h),
        f"{prefix}hnorm.weight": make.norm(h),
        f"{prefix}eh_proj.weight": make.bf16(h, 2 * h),
    }
    if spec.mtp_spelling == "mtp":
        out[f"{prefix}final_layernorm.weight"] = make.norm(h)
        return out | _decoder_layer(
            make, spec, f"{prefix}transformer_layer.", moe=True, quantized=False
        )
    out[f"{prefix}embed_tokens.weight"] = make.bf16(spec.vocab, h)
    out[f"{prefix}shared_head.norm.weight"] = make.norm(h)
    out[f"{prefix}shared_head.head.weight"] = make.bf16(spec.vocab, h)
    return out | _decoder_layer(make, spec, prefix, moe=True, quantized=False)


# -- JSON files ----------------------------------------------------------------------------


def _quant_config(spec: TinyMoeSpec) -> dict[str, Any]:
    """MIXED_PRECISION: one `quantized_layers` entry per stored routed-expert projection."""
    layers = {
        f"model.layers.{layer}.mlp.experts.{expert}.{proj}": {
            "quant_algo": "NVFP4",
            "group_size": GROUP_SIZE,
        }
        for layer in range(spec.first_dense, spec.num_layers)
        for expert in spec.expert_ids
        for proj in _EXPERT_PROJS
    }
    mtp = "mtp*" if spec.mtp_spelling == "mtp" else f"model.layers.{spec.num_layers}*"
    exclude = [
        "lm_head",
        "model.embed_tokens",
        "model.layers.*.self_attn*",
        "model.layers.*.mlp.gate",
        "model.layers.*.mlp.shared_experts*",
        *(f"model.layers.{i}.mlp*" for i in range(spec.first_dense)),
        mtp,
    ]
    return {
        "producer": {"name": "modelopt", "version": "0.0.0+demo"},
        "quantization": {
            "quant_algo": "MIXED_PRECISION",
            "kv_cache_quant_algo": None,
            "quantized_layers": layers,
            "exclude_modules": exclude,
        },
    }


def _config(spec: TinyMoeSpec, quant: dict[str, Any] | None) -> dict[str, Any]:
    """A DeepSeek-V3-like `config.json` whose sizes match the tensors `build_model` makes."""
    head = spec.hidden // spec.heads
    config: dict[str, Any] = {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "vocab_size": spec.vocab,
        "hidden_size": spec.hidden,
        "intermediate_size": spec.dense_intermediate,
        "moe_intermediate_size": spec.moe_intermediate,
        "num_hidden_layers": spec.num_layers,
        "num_attention_heads": spec.heads,
        "num_key_value_heads": spec.heads,
        "q_lora_rank": spec.hidden // 2,
        "kv_lora_rank": spec.hidden // 2,
        "qk_nope_head_dim": head // 2,
        "qk_rope_head_dim": head // 2,
        "v_head_dim": head,
        "n_routed_experts": spec.experts,
        "n_shared_experts": 1,
        "num_experts_per_tok": min(2, spec.experts),
        "first_k_dense_replace": spec.first_dense,
        "moe_layer_freq": 1,
        "num_nextn_predict_layers": spec.mtp_layers,
        "max_position_embeddings": 128,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    }
    if quant is not None:
        config["quantization_config"] = {"quant_method": "modelopt", **quant["quantization"]}
    return config
