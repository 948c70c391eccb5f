"""Real models as sparse checkpoints: the released config.json written by transformers' own
config class, and shards whose headers list every tensor of the release (names, dtypes,
shapes as the Hugging Face repositories store them) while their data is a file hole.

A shard is the safetensors format exactly as the `safetensors` writer lays it out (an 8-byte
little-endian header length, the JSON header padded with spaces to a multiple of 8, then the
data, each tensor's `data_offsets` tiling it); only the data is never written, so a 671B
model costs a few MB of headers and no disk. `tests/test_collapsed_shards.py` and
`benchmarks/_synthetic.py` build theirs the same way.

The models (sizes from each repository's config.json):

- `deepseek_v3`: deepseek-ai/DeepSeek-V3, block-FP8 (`weight_block_size` [128, 128]), MLA,
  61 layers (3 dense) x 256 routed experts + 1 shared, the MTP layer 61;
- `qwen3_30b_a3b_fp8`: Qwen/Qwen3-30B-A3B-FP8, block-FP8, 48 layers x 128 experts of
  intermediate size 768, 32 heads and 4 KV heads of 128;
- `llama3_70b`: meta-llama/Meta-Llama-3-70B, BF16, 80 layers, 64 heads, 8 KV heads;
- `gpt_oss_120b`: openai/gpt-oss-120b, MXFP4 experts (blocks and scales as it ships them),
  36 layers alternating sliding (128) and full attention, 128 experts, attention sinks;
- `nemotron_nano_9b_v2`: nvidia/NVIDIA-Nemotron-Nano-9B-v2, the Nemotron-H hybrid: 56 blocks
  (27 Mamba-2, 25 MLP, 4 attention).
"""

from __future__ import annotations

import json
import math
import os
import struct
from collections.abc import Callable, Iterator
from pathlib import Path

from transformers import (
    DeepseekV3Config,
    GptOssConfig,
    LlamaConfig,
    NemotronHConfig,
    PretrainedConfig,
    Qwen3MoeConfig,
)

from inspector._internal.common.filenames import CONFIG_NAME, INDEX_NAME

__all__ = ["MODELS", "Tensor", "write_model"]

Tensor = tuple[str, str, tuple[int, ...]]
_BITS = {"BF16": 16, "F32": 32, "F8_E4M3": 8, "U8": 8}
FP8_BLOCK = {
    "quant_method": "fp8",
    "fmt": "e4m3",
    "activation_scheme": "dynamic",
    "weight_block_size": [128, 128],
}


def write_model(folder: Path, name: str, *, shards: int = 8) -> Path:
    """Write model `name` of `MODELS` into `folder`: config.json, shards, the index."""
    config, tensors = MODELS[name]()
    folder.mkdir(parents=True, exist_ok=True)
    config.to_json_file(str(folder / CONFIG_NAME))
    entries = list(tensors)
    per = math.ceil(len(entries) / shards)
    weight_map: dict[str, str] = {}
    total = 0
    for i in range(shards):
        chunk = entries[i * per : (i + 1) * per]
        file = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        total += _write_shard(folder / file, chunk)
        weight_map.update(dict.fromkeys((n for n, _, _ in chunk), file))
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / INDEX_NAME).write_text(json.dumps(index))
    return folder


def _write_shard(path: Path, chunk: list[Tensor]) -> int:
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, dtype, shape in chunk:
        nbytes = math.prod(shape) * _BITS[dtype] // 8
        header[name] = {
            "dtype": dtype,
            "shape": list(shape),
            "data_offsets": [offset, offset + nbytes],
        }
        offset += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(raw)) + raw)
    os.truncate(path, 8 + len(raw) + offset)
    return offset


def _fp8(module: str, rows: int, cols: int) -> Iterator[Tensor]:
    """A block-FP8 linear: its weight and one F32 scale per 128 x 128 tile."""
    yield f"{module}.weight", "F8_E4M3", (rows, cols)
    yield f"{module}.weight_scale_inv", "F32", (math.ceil(rows / 128), math.ceil(cols / 128))


def _mlp(
    prefix: str, inter: int, hidden: int, linear: Callable[..., Iterator[Tensor]]
) -> Iterator[Tensor]:
    yield from linear(f"{prefix}.gate_proj", inter, hidden)
    yield from linear(f"{prefix}.up_proj", inter, hidden)
    yield from linear(f"{prefix}.down_proj", hidden, inter)


def _bf16(module: str, rows: int, cols: int) -> Iterator[Tensor]:
    yield f"{module}.weight", "BF16", (rows, cols)


# -- DeepSeek-V3 ------------------------------------------------------------------------------


def deepseek_v3() -> tuple[PretrainedConfig, Iterator[Tensor]]:
    config = DeepseekV3Config(
        vocab_size=129280,
        hidden_size=7168,
        intermediate_size=18432,
        moe_intermediate_size=2048,
        num_hidden_layers=61,
        num_nextn_predict_layers=1,
        num_attention_heads=128,
        num_key_value_heads=128,
        n_shared_experts=1,
        n_routed_experts=256,
        routed_scaling_factor=2.5,
        kv_lora_rank=512,
        q_lora_rank=1536,
        qk_rope_head_dim=64,
        v_head_dim=128,
        qk_nope_head_dim=128,
        n_group=8,
        topk_group=4,
        num_experts_per_tok=8,
        first_k_dense_replace=3,
        moe_layer_freq=1,
        norm_topk_prob=True,
        max_position_embeddings=163840,
        tie_word_embeddings=False,
        dtype="bfloat16",
        quantization_config=FP8_BLOCK,
        architectures=["DeepseekV3ForCausalLM"],
    )
    return config, _deepseek_tensors()


def _deepseek_tensors() -> Iterator[Tensor]:
    h, vocab = 7168, 129280
    yield "model.embed_tokens.weight", "BF16", (vocab, h)
    for layer in range(62):  # 61 decoder layers, then the MTP layer 61
        p = f"model.layers.{layer}"
        yield from _fp8(f"{p}.self_attn.q_a_proj", 1536, h)
        yield f"{p}.self_attn.q_a_layernorm.weight", "BF16", (1536,)
        yield from _fp8(f"{p}.self_attn.q_b_proj", 128 * 192, 1536)
        yield from _fp8(f"{p}.self_attn.kv_a_proj_with_mqa", 512 + 64, h)
        yield f"{p}.self_attn.kv_a_layernorm.weight", "BF16", (512,)
        yield from _fp8(f"{p}.self_attn.kv_b_proj", 128 * 256, 512)
        yield from _fp8(f"{p}.self_attn.o_proj", h, 128 * 128)
        yield f"{p}.input_layernorm.weight", "BF16", (h,)
        yield f"{p}.post_attention_layernorm.weight", "BF16", (h,)
        if layer < 3:
            yield from _mlp(f"{p}.mlp", 18432, h, _fp8)
        else:
            yield f"{p}.mlp.gate.weight", "BF16", (256, h)
            yield f"{p}.mlp.gate.e_score_correction_bias", "F32", (256,)
            for expert in range(256):
                yield from _mlp(f"{p}.mlp.experts.{expert}", 2048, h, _fp8)
            yield from _mlp(f"{p}.mlp.shared_experts", 2048, h, _fp8)
        if layer == 61:
            yield f"{p}.embed_tokens.weight", "BF16", (vocab, h)
            yield f"{p}.enorm.weight", "BF16", (h,)
            yield f"{p}.hnorm.weight", "BF16", (h,)
            yield f"{p}.eh_proj.weight", "BF16", (h, 2 * h)
            yield f"{p}.shared_head.norm.weight", "BF16", (h,)
            yield f"{p}.shared_head.head.weight", "BF16", (vocab, h)
    yield "model.norm.weight", "BF16", (h,)
    yield "lm_head.weight", "BF16", (vocab, h)


# -- Qwen3-30B-A3B-FP8 ------------------------------------------------------------------------


def qwen3_30b_a3b_fp8() -> tuple[PretrainedConfig, Iterator[Tensor]]:
    config = Qwen3MoeConfig(
        vocab_size=151936,
        hidden_size=2048,
        intermediate_size=6144,
        moe_intermediate_size=768,
        num_hidden_layers=48,
        num_attention_heads=32,
        num_key_value_heads=4,
        head_dim=128,
        num_experts=128,
        num_experts_per_tok=8,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        max_position_embeddings=40960,
        tie_word_embeddings=False,
        dtype="bfloat16",
        quantization_config=FP8_BLOCK,
        architectures=["Qwen3MoeForCausalLM"],
    )
    return config, _qwen3_tensors()


def _qwen3_tensors() -> Iterator[Tensor]:
    h, vocab = 2048, 151936
    yield "model.embed_tokens.weight", "BF16", (vocab, h)
    for layer in range(48):
        p = f"model.layers.{layer}"
        yield from _fp8(f"{p}.self_attn.q_proj", 32 * 128, h)
        yield from _fp8(f"{p}.self_attn.k_proj", 4 * 128, h)
        yield from _fp8(f"{p}.self_attn.v_proj", 4 * 128, h)
        yield from _fp8(f"{p}.self_attn.o_proj", h, 32 * 128)
        yield f"{p}.self_attn.q_norm.weight", "BF16", (128,)
        yield f"{p}.self_attn.k_norm.weight", "BF16", (128,)
        yield f"{p}.input_layernorm.weight", "BF16", (h,)
        yield f"{p}.post_attention_layernorm.weight", "BF16", (h,)
        yield f"{p}.mlp.gate.weight", "BF16", (128, h)
        for expert in range(128):
            yield from _mlp(f"{p}.mlp.experts.{expert}", 768, h, _fp8)
    yield "model.norm.weight", "BF16", (h,)
    yield "lm_head.weight", "BF16", (vocab, h)


# -- Llama-3-70B --------------------------------------------------------------------------------


def llama3_70b() -> tuple[PretrainedConfig, Iterator[Tensor]]:
    config = LlamaConfig(
        vocab_size=128256,
        hidden_size=8192,
        intermediate_size=28672,
        num_hidden_layers=80,
        num_attention_heads=64,
        num_key_value_heads=8,
        max_position_embeddings=8192,
        rope_theta=500000.0,
        tie_word_embeddings=False,
        dtype="bfloat16",
        architectures=["LlamaForCausalLM"],
    )
    return config, _llama_tensors()


def _llama_tensors() -> Iterator[Tensor]:
    h, vocab = 8192, 128256
    yield "model.embed_tokens.weight", "BF16", (vocab, h)
    for layer in range(80):
        p = f"model.layers.{layer}"
        yield from _bf16(f"{p}.self_attn.q_proj", 64 * 128, h)
        yield from _bf16(f"{p}.self_attn.k_proj", 8 * 128, h)
        yield from _bf16(f"{p}.self_attn.v_proj", 8 * 128, h)
        yield from _bf16(f"{p}.self_attn.o_proj", h, 64 * 128)
        yield from _mlp(f"{p}.mlp", 28672, h, _bf16)
        yield f"{p}.input_layernorm.weight", "BF16", (h,)
        yield f"{p}.post_attention_layernorm.weight", "BF16", (h,)
    yield "model.norm.weight", "BF16", (h,)
    yield "lm_head.weight", "BF16", (vocab, h)


# -- gpt-oss-120b ------------------------------------------------------------------------------


def gpt_oss_120b() -> tuple[PretrainedConfig, Iterator[Tensor]]:
    config = GptOssConfig(
        vocab_size=201088,
        hidden_size=2880,
        intermediate_size=2880,
        num_hidden_layers=36,
        num_attention_heads=64,
        num_key_value_heads=8,
        head_dim=64,
        num_local_experts=128,
        num_experts_per_tok=4,
        sliding_window=128,
        layer_types=["sliding_attention", "full_attention"] * 18,
        max_position_embeddings=131072,
        tie_word_embeddings=False,
        quantization_config={
            "quant_method": "mxfp4",
            "modules_to_not_convert": [
                "model.layers.*.self_attn",
                "model.layers.*.mlp.router",
                "model.embed_tokens",
                "lm_head",
            ],
        },
        architectures=["GptOssForCausalLM"],
    )
    return config, _gpt_oss_tensors()


def _gpt_oss_tensors() -> Iterator[Tensor]:
    h, vocab, inter, experts = 2880, 201088, 2880, 128
    yield "model.embed_tokens.weight", "BF16", (vocab, h)
    for layer in range(36):
        p = f"model.layers.{layer}"
        for proj, rows in (("q_proj", 64 * 64), ("k_proj", 8 * 64), ("v_proj", 8 * 64)):
            yield f"{p}.self_attn.{proj}.weight", "BF16", (rows, h)
            yield f"{p}.self_attn.{proj}.bias", "BF16", (rows,)
        yield f"{p}.self_attn.o_proj.weight", "BF16", (h, 64 * 64)
        yield f"{p}.self_attn.o_proj.bias", "BF16", (h,)
        yield f"{p}.self_attn.sinks", "BF16", (64,)
        yield f"{p}.mlp.router.weight", "BF16", (experts, h)
        yield f"{p}.mlp.router.bias", "BF16", (experts,)
        # MXFP4: 16 bytes (32 values) per block, one E8M0 scale per block.
        yield f"{p}.mlp.experts.gate_up_proj_blocks", "U8", (experts, 2 * inter, h // 32, 16)
        yield f"{p}.mlp.experts.gate_up_proj_scales", "U8", (experts, 2 * inter, h // 32)
        yield f"{p}.mlp.experts.gate_up_proj_bias", "BF16", (experts, 2 * inter)
        yield f"{p}.mlp.experts.down_proj_blocks", "U8", (experts, h, inter // 32, 16)
        yield f"{p}.mlp.experts.down_proj_scales", "U8", (experts, h, inter // 32)
        yield f"{p}.mlp.experts.down_proj_bias", "BF16", (experts, h)
        yield f"{p}.input_layernorm.weight", "BF16", (h,)
        yield f"{p}.post_attention_layernorm.weight", "BF16", (h,)
    yield "model.norm.weight", "BF16", (h,)
    yield "lm_head.weight", "BF16", (vocab, h)


# -- Nemotron-Nano-9B-v2 (Nemotron-H) ------------------------------------------------------------

NEMOTRON_PATTERN = "M-M-M-MM-M-M-M*-M-M-M*-M-M-M-M*-M-M-M-M*-M-MM-M-M-M-M-M-"


def nemotron_nano_9b_v2() -> tuple[PretrainedConfig, Iterator[Tensor]]:
    config = NemotronHConfig(
        vocab_size=131072,
        hidden_size=4480,
        hybrid_override_pattern=NEMOTRON_PATTERN,
        num_attention_heads=40,
        num_key_value_heads=8,
        head_dim=128,
        intermediate_size=15680,
        mamba_num_heads=128,
        mamba_head_dim=80,
        ssm_state_size=128,
        n_groups=8,
        conv_kernel=4,
        max_position_embeddings=131072,
        tie_word_embeddings=False,
        dtype="bfloat16",
        architectures=["NemotronHForCausalLM"],
    )
    return config, _nemotron_tensors()


def _nemotron_tensors() -> Iterator[Tensor]:
    h, vocab, heads, head_dim, state, groups = 4480, 131072, 128, 80, 128, 8
    inner = heads * head_dim
    conv = inner + 2 * groups * state
    yield "backbone.embeddings.weight", "BF16", (vocab, h)
    for layer, block in enumerate(NEMOTRON_PATTERN):
        p = f"backbone.layers.{layer}"
        yield f"{p}.norm.weight", "BF16", (h,)
        if block == "M":
            yield f"{p}.mixer.in_proj.weight", "BF16", (2 * inner + 2 * groups * state + heads, h)
            yield f"{p}.mixer.conv1d.weight", "BF16", (conv, 1, 4)
            yield f"{p}.mixer.conv1d.bias", "BF16", (conv,)
            yield f"{p}.mixer.A_log", "F32", (heads,)
            yield f"{p}.mixer.D", "F32", (heads,)
            yield f"{p}.mixer.dt_bias", "F32", (heads,)
            yield f"{p}.mixer.norm.weight", "BF16", (inner,)
            yield f"{p}.mixer.out_proj.weight", "BF16", (h, inner)
        elif block == "-":
            yield f"{p}.mixer.up_proj.weight", "BF16", (15680, h)
            yield f"{p}.mixer.down_proj.weight", "BF16", (h, 15680)
        else:
            yield f"{p}.mixer.q_proj.weight", "BF16", (40 * 128, h)
            yield f"{p}.mixer.k_proj.weight", "BF16", (8 * 128, h)
            yield f"{p}.mixer.v_proj.weight", "BF16", (8 * 128, h)
            yield f"{p}.mixer.o_proj.weight", "BF16", (h, 40 * 128)
    yield "backbone.norm_f.weight", "BF16", (h,)
    yield "lm_head.weight", "BF16", (vocab, h)


MODELS: dict[str, Callable[[], tuple[PretrainedConfig, Iterator[Tensor]]]] = {
    "deepseek_v3": deepseek_v3,
    "qwen3_30b_a3b_fp8": qwen3_30b_a3b_fp8,
    "llama3_70b": llama3_70b,
    "gpt_oss_120b": gpt_oss_120b,
    "nemotron_nano_9b_v2": nemotron_nano_9b_v2,
}
