"""Re-export real `save_pretrained` output: damaged the way real exports go wrong while kept
self-consistent (`resaved`: the shards are re-written with the real safetensors writer to hold
`edit(state)` and the index is rewritten to match them, so the only problem left is in the
tensors themselves), or quantized the way Model-Optimizer exports (`modelopt_export`: FP8 or
NVFP4 tensors, `hf_quant_config.json` and the config's `quantization_config`).

Tests import it as `from hf_exports import ...` (pytest puts tests/ on the path).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import torch
from modelopt_writer import INDEX, load_json, save_json
from safetensors.torch import load_file, save_file

from inspector._internal.common.filenames import CONFIG_NAME, QUANT_CONFIG_NAME

__all__ = [
    "modelopt_export",
    "quantize",
    "resaved",
    "state_of",
    "tiny_deepseek_v3",
    "with_deepseek_mtp",
]


def state_of(folder: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """(tensors, file of each tensor) of every `.safetensors` file in `folder`."""
    state: dict[str, torch.Tensor] = {}
    home: dict[str, str] = {}
    for path in sorted(folder.glob("*.safetensors")):
        for name, tensor in load_file(path).items():
            state[name], home[name] = tensor, path.name
    return state, home


def resaved(
    src: Path, dest: Path, edit: Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]]
) -> Path:
    """A copy of `src` whose shards hold `edit(state)` (added tensors go to the last shard),
    with the index's weight map and total size rewritten to match."""
    shutil.copytree(src, dest)
    state, home = state_of(dest)
    files = sorted(set(home.values()))
    tensors = edit(dict(state))
    where = {k: home.get(k, files[-1]) for k in tensors}
    for file in files:
        part = {k: v.contiguous() for k, v in tensors.items() if where[k] == file}
        save_file(part, str(dest / file), metadata={"format": "pt"})
    if (dest / INDEX).exists():
        index = load_json(dest / INDEX)
        index["weight_map"] = where
        sizes = (t.numel() * t.element_size() for t in tensors.values())
        index["metadata"]["total_size"] = sum(sizes)
        save_json(dest / INDEX, index)
    return dest


def quantize(state: dict[str, torch.Tensor], algo: str, *, experts_only: bool = False) -> dict:
    """Model-Optimizer's tensors for every linear `*proj.weight` (all of them, or the routed
    experts only): FP8 = F8_E4M3 weight + scalar weight and input scales; NVFP4 = two E2M1
    codes a byte (U8 `[out, in/2]`) + F8_E4M3 scale per 16 inputs + scalar `weight_scale_2`
    and `input_scale`. Values are placeholders: only names, dtypes and shapes are read."""
    out: dict[str, torch.Tensor] = {}
    for name, t in state.items():
        quantized = name.endswith("proj.weight") and t.dim() == 2
        if not quantized or (experts_only and ".experts." not in name):
            out[name] = t
            continue
        module = name.removesuffix(".weight")
        rows, cols = t.shape
        if algo == "FP8":
            out[name] = t.to(torch.float8_e4m3fn)
        else:
            out[name] = torch.zeros(rows, cols // 2, dtype=torch.uint8)
            out[f"{module}.weight_scale"] = torch.ones(rows, cols // 16).to(torch.float8_e4m3fn)
            out[f"{module}.weight_scale_2"] = torch.tensor(0.5)
        if algo == "FP8":
            out[f"{module}.weight_scale"] = torch.tensor(0.5)
        out[f"{module}.input_scale"] = torch.tensor(0.25)
    return out


def modelopt_export(
    src: Path,
    dest: Path,
    algo: str,
    *,
    experts_only: bool = False,
    edit: Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]] = lambda s: s,
) -> Path:
    """`src` quantized by `quantize`, then `edit`ed, with the quantization config files."""
    folder = resaved(src, dest, lambda s: edit(quantize(s, algo, experts_only=experts_only)))
    exclude = (
        ["lm_head", "*self_attn*", "*shared_expert*", "*mlp.gate"] if experts_only else ["lm_head"]
    )
    quant = {"quant_algo": algo, "kv_cache_quant_algo": None, "exclude_modules": exclude}
    if algo == "NVFP4":
        quant["group_size"] = 16
    save_json(folder / QUANT_CONFIG_NAME, {"producer": {"name": "modelopt"},
                                                "quantization": quant})  # fmt: skip
    config = load_json(folder / CONFIG_NAME)
    config["quantization_config"] = {"quant_method": "modelopt", **quant}
    save_json(folder / CONFIG_NAME, config)
    return folder


def with_deepseek_mtp(state: dict[str, torch.Tensor], layers: int) -> dict[str, torch.Tensor]:
    """`state` plus a DeepSeek-style MTP layer `model.layers.{layers}`, as DeepSeek-V3 and GLM
    ship it (transformers does not save it): a copy of the last decoder layer plus its own
    embedding, norms, projection and shared head."""
    last = f"model.layers.{layers - 1}."
    mtp = f"model.layers.{layers}."
    out = dict(state)
    out.update({mtp + k[len(last) :]: v + 1 for k, v in state.items() if k.startswith(last)})
    hidden = state["model.norm.weight"].shape[0]
    embed = state["model.embed_tokens.weight"]
    out |= {
        f"{mtp}embed_tokens.weight": embed.clone(),
        f"{mtp}enorm.weight": torch.ones(hidden),
        f"{mtp}hnorm.weight": torch.ones(hidden),
        f"{mtp}eh_proj.weight": torch.randn(hidden, 2 * hidden),
        f"{mtp}shared_head.norm.weight": torch.ones(hidden),
        f"{mtp}shared_head.head.weight": embed.clone(),
    }
    return out


def tiny_llama(folder: Path) -> Path:
    """A tiny untied Llama as transformers' own `save_pretrained` writes it (two shards);
    returns `folder` (created)."""
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(folder, max_shard_size="20KB")
    return folder


def tiny_deepseek_v3(folder: Path, *, layers: int = 3) -> Path:
    """A tiny DeepSeek-V3 (4 experts, untied head) saved by transformers' save_pretrained in
    several shards, plus DeepSeek's MTP layer; returns `folder` (created)."""
    import transformers

    config = transformers.DeepseekV3Config(
        vocab_size=64, hidden_size=32, intermediate_size=32, moe_intermediate_size=16,
        num_hidden_layers=layers, num_attention_heads=2, num_key_value_heads=2,
        n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2, first_k_dense_replace=1,
        kv_lora_rank=8, q_lora_rank=8, qk_rope_head_dim=4, qk_nope_head_dim=4, v_head_dim=4,
        n_group=2, topk_group=1, num_nextn_predict_layers=1, tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(0)
    saved = folder.with_name(f"{folder.name}-saved")
    transformers.DeepseekV3ForCausalLM(config).save_pretrained(saved, max_shard_size="40KB")
    resaved(saved, folder, lambda s: with_deepseek_mtp(s, layers))
    shutil.rmtree(saved)
    return folder
