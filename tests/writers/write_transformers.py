"""Write healthy checkpoints of every MoE family our tensor naming covers with the REAL
transformers `save_pretrained` (tiny random models, several shards each, so every case is an
`hf-sharded` folder with `model.safetensors.index.json`).

Families: Qwen2-MoE, Qwen3-MoE, Qwen3-Next, Qwen3.5-MoE (text), DeepSeek-V2, DeepSeek-V3 (config
declares one MTP layer, which transformers does not save), GLM4-MoE, Mixtral, Nemotron-H,
GPT-OSS, Llama 4 (text). A family the installed transformers lacks, or that fails to build, is
reported and skipped (the manifest then has no case for it).

No shim: transformers runs on the CPU as it is. Randomly initialised weights (seed 0 before
each model is built), saved in float32 (transformers' default here), `max_shard_size="20KB"`.
transformers writes `metadata.total_parameters` into the index (a count of the model's
parameters, not of the tensors saved: buffers saved with the weights are not counted), which is
why DeepSeek-V3 is here: its router's `e_score_correction_bias` is such a buffer.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common

WRITER = "transformers"
PACKAGE = "transformers"
SCRIPT = "write_transformers.py"
SHARD = "20KB"
ATTN: dict[str, Any] = {"num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 64}


def _families() -> dict[str, tuple[str, str, Callable[[], Any]]]:
    """{case: (config class, model class, kwargs factory)}: tiny configs, 2-4 layers,
    4-8 experts, hidden 16-32."""
    return {
        "qwen2-moe": (
            "Qwen2MoeConfig",
            "Qwen2MoeForCausalLM",
            lambda: dict(
                **ATTN, hidden_size=16, intermediate_size=32, moe_intermediate_size=8,
                shared_expert_intermediate_size=8, num_hidden_layers=2, num_experts=4,
                num_experts_per_tok=2,
            ),
        ),
        "qwen3-moe": (
            "Qwen3MoeConfig",
            "Qwen3MoeForCausalLM",
            lambda: dict(
                **ATTN, hidden_size=16, head_dim=8, intermediate_size=32, moe_intermediate_size=8,
                num_hidden_layers=3, num_experts=4, num_experts_per_tok=2, mlp_only_layers=[0],
            ),
        ),
        "qwen3-next": (
            "Qwen3NextConfig",
            "Qwen3NextForCausalLM",
            lambda: dict(
                **ATTN, hidden_size=32, head_dim=16, intermediate_size=32,
                moe_intermediate_size=8, shared_expert_intermediate_size=8, num_hidden_layers=4,
                num_experts=4, num_experts_per_tok=2, linear_num_value_heads=2,
                linear_num_key_heads=1, linear_key_head_dim=8, linear_value_head_dim=8,
                full_attention_interval=2,
            ),
        ),
        "qwen3.5-moe": (
            "Qwen3_5MoeTextConfig",
            "Qwen3_5MoeForCausalLM",
            lambda: dict(
                **ATTN, hidden_size=32, head_dim=16, moe_intermediate_size=8,
                shared_expert_intermediate_size=8, num_hidden_layers=4, num_experts=4,
                num_experts_per_tok=2, linear_num_value_heads=2, linear_num_key_heads=1,
                linear_key_head_dim=8, linear_value_head_dim=8,
                layer_types=["linear_attention", "full_attention"] * 2,
            ),
        ),
        "deepseek-v2": (
            "DeepseekV2Config",
            "DeepseekV2ForCausalLM",
            lambda: dict(
                vocab_size=64, hidden_size=32, intermediate_size=32, moe_intermediate_size=8,
                num_hidden_layers=3, num_attention_heads=2, num_key_value_heads=2,
                n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2,
                first_k_dense_replace=1, kv_lora_rank=8, q_lora_rank=8, qk_rope_head_dim=4,
                qk_nope_head_dim=4, v_head_dim=4,
            ),
        ),
        "deepseek-v3": (
            "DeepseekV3Config",
            "DeepseekV3ForCausalLM",
            lambda: dict(
                vocab_size=64, hidden_size=32, intermediate_size=32, moe_intermediate_size=8,
                num_hidden_layers=3, num_attention_heads=2, num_key_value_heads=2,
                n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2,
                first_k_dense_replace=1, kv_lora_rank=8, q_lora_rank=8, qk_rope_head_dim=4,
                qk_nope_head_dim=4, v_head_dim=4, n_group=2, topk_group=1,
                num_nextn_predict_layers=1,
            ),
        ),
        "glm4-moe": (
            "Glm4MoeConfig",
            "Glm4MoeForCausalLM",
            lambda: dict(
                **ATTN, hidden_size=32, head_dim=16, intermediate_size=32,
                moe_intermediate_size=8, num_hidden_layers=3, n_routed_experts=4,
                n_shared_experts=1, num_experts_per_tok=2, first_k_dense_replace=1, n_group=1,
                topk_group=1,
            ),
        ),
        "mixtral": (
            "MixtralConfig",
            "MixtralForCausalLM",
            lambda: dict(
                **ATTN, hidden_size=16, head_dim=8, intermediate_size=32, num_hidden_layers=2,
                num_local_experts=4, num_experts_per_tok=2,
            ),
        ),
        "nemotron-h": (
            "NemotronHConfig",
            "NemotronHForCausalLM",
            lambda: dict(
                vocab_size=64, hidden_size=32, hybrid_override_pattern="ME*-E",
                num_attention_heads=2, num_key_value_heads=1, head_dim=16, intermediate_size=32,
                mamba_num_heads=4, mamba_head_dim=8, n_groups=1, ssm_state_size=8,
                chunk_size=16, n_routed_experts=4, n_shared_experts=1, moe_intermediate_size=8,
                moe_shared_expert_intermediate_size=8, num_experts_per_tok=2,
            ),
        ),
        "gpt-oss": (
            "GptOssConfig",
            "GptOssForCausalLM",
            lambda: dict(
                **ATTN, hidden_size=32, head_dim=16, intermediate_size=16, num_hidden_layers=2,
                num_local_experts=4, num_experts_per_tok=2,
                layer_types=["sliding_attention", "full_attention"],
            ),
        ),
        "llama4": (
            "Llama4TextConfig",
            "Llama4ForCausalLM",
            lambda: dict(
                **ATTN, hidden_size=32, head_dim=16, intermediate_size=16,
                intermediate_size_mlp=32, num_hidden_layers=2, num_local_experts=4,
                interleave_moe_layer_step=2,
            ),
        ),
    }  # fmt: skip


def main() -> None:
    import torch
    import transformers

    families = _families()
    only = sys.argv[1:] or list(families)
    skipped: dict[str, str] = {}
    for case in only:
        config_cls, model_cls, kwargs = families[case]
        try:
            config = getattr(transformers, config_cls)(**kwargs())
            torch.manual_seed(0)
            model = getattr(transformers, model_cls)(config)
        except Exception as exc:  # a family this transformers cannot build is reported
            skipped[case] = f"{type(exc).__name__}: {exc}"
            continue
        dest = _common.case_dir(WRITER, case)
        model.save_pretrained(dest, max_shard_size=SHARD)
        params = sum(p.numel() for p in model.parameters())
        buffers = {
            name: b.numel()
            for name, b in model.named_buffers()
            if name in model.state_dict()  # persistent buffers only: those are saved
        }
        _common.record(
            WRITER,
            case,
            package=PACKAGE,
            script=SCRIPT,
            description=f"{model_cls} save_pretrained(max_shard_size={SHARD!r}), random init",
            healthy=True,
            extra={
                "model_class": model_cls,
                "parameters": params,
                "persistent_buffers": buffers,
            },
        )
    for case, why in skipped.items():
        print(f"[{WRITER}/{case}] skipped: {why}")


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
