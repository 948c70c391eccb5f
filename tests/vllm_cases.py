"""vLLM's own load against ours, on tiny models: the cases issue 37 lists, written by the real
writers (transformers' `save_pretrained`, then re-saved with safetensors' `save_file` after the
damage), and a runner that gives, for each case, what vLLM's real loader does with the real
tensors on CPU (`DefaultModelLoader.load_weights`, its own strictness) and what our verdict
says (`load.engine_child`, meta tensors). Run as a script in a child process: vLLM takes the
process (one gloo group, its config context).

`python tests/vllm_cases.py CASE_FOLDER...` prints {case: {"engine": ..., "ours": {...}}}.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["CASES", "write_cases"]

_LAYER0 = "model.layers.0"


def _fp8(state: dict) -> dict:
    import torch

    out = {}
    for name, tensor in state.items():
        if name.endswith("proj.weight") and ".layers." in name:
            out[name] = tensor.to(torch.float8_e4m3fn)
            out[name.removesuffix("weight") + "weight_scale"] = torch.tensor(1.0)
        else:
            out[name] = tensor
    return out


def _fp8_config(config: dict) -> None:
    config["quantization_config"] = {"quant_method": "fp8", "activation_scheme": "dynamic"}


def _without(*names: str) -> Callable[[dict], dict]:
    return lambda s: {k: v for k, v in s.items() if k not in names}


def _with(name: str, *shape: int) -> Callable[[dict], dict]:
    def edit(state: dict) -> dict:
        import torch

        return {**state, name: torch.zeros(*shape)}

    return edit


# case -> (model, edit of the state dict, edit of config.json)
CASES: dict[str, tuple[str, Callable[[dict], dict], Callable[[dict], None] | None]] = {
    "healthy": ("llama", lambda s: s, None),
    "drop-o_proj": ("llama", _without(f"{_LAYER0}.self_attn.o_proj.weight"), None),
    "drop-k_proj": ("llama", _without(f"{_LAYER0}.self_attn.k_proj.weight"), None),
    "drop-lm_head": ("llama", _without("lm_head.weight"), None),
    "extra-tensor": ("llama", _with(f"{_LAYER0}.self_attn.rope_alpha.weight", 4), None),
    "wrong-shape": ("llama", _with(f"{_LAYER0}.mlp.down_proj.weight", 64, 96), None),
    "oversized": ("llama", _with(f"{_LAYER0}.mlp.down_proj.weight", 64, 256), None),
    "moe-healthy": ("moe", lambda s: s, None),
    "drop-expert": (
        "moe",
        lambda s: {k: v for k, v in s.items() if not k.startswith(f"{_LAYER0}.mlp.experts.1.")},
        None,
    ),
    "rename-expert": (
        "moe",
        lambda s: {
            k.replace(f"{_LAYER0}.mlp.experts.1.", f"{_LAYER0}.mlp.experts.9."): v
            for k, v in s.items()
        },
        None,
    ),
    "small-expert": ("moe", _with(f"{_LAYER0}.mlp.experts.1.down_proj.weight", 64, 16), None),
    "fp8-healthy": ("llama", _fp8, _fp8_config),
    "fp8-renamed-scale": (
        "llama",
        lambda s: {
            k.replace("q_proj.weight_scale", "q_proj.scale") if k.startswith(_LAYER0) else k: v
            for k, v in _fp8(s).items()
        },
        _fp8_config,
    ),
    "fp8-drop-scale": (
        "llama",
        lambda s: _without(f"{_LAYER0}.self_attn.q_proj.weight_scale")(_fp8(s)),
        _fp8_config,
    ),
    "fp8-drop-o_proj": (
        "llama",
        lambda s: {
            k: v for k, v in _fp8(s).items() if not k.startswith(f"{_LAYER0}.self_attn.o_proj.")
        },
        _fp8_config,
    ),
}


def _models(root: Path) -> dict[str, Path]:
    """A tiny untied Llama and a tiny Qwen3-MoE, as `save_pretrained` writes them."""
    import torch
    import transformers

    torch.manual_seed(0)
    llama = transformers.LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False,
    )  # fmt: skip
    moe = transformers.Qwen3MoeConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, num_experts=4,
        num_experts_per_tok=2, head_dim=16,
    )  # fmt: skip
    out = {}
    for name, config, cls in (
        ("llama", llama, transformers.LlamaForCausalLM),
        ("moe", moe, transformers.Qwen3MoeForCausalLM),
    ):
        out[name] = root / f"base-{name}"
        cls(config).save_pretrained(out[name])
    return out


def write_cases(root: Path) -> dict[str, Path]:
    """Every case of `CASES` under `root`, as one `model.safetensors` and config.json."""
    from safetensors.torch import load_file, save_file

    bases = _models(root)
    out = {}
    for case, (base, edit, config_edit) in CASES.items():
        folder = root / case
        shutil.copytree(bases[base], folder)
        state = edit(load_file(folder / "model.safetensors"))
        save_file(
            {k: v.contiguous() for k, v in state.items()},
            str(folder / "model.safetensors"),
            metadata={"format": "pt"},
        )
        if config_edit is not None:
            config = json.loads((folder / "config.json").read_text())
            config_edit(config)
            (folder / "config.json").write_text(json.dumps(config))
        out[case] = folder
    return out


def _run(folders: list[str]) -> dict[str, dict]:
    os.environ["VLLM_TARGET_DEVICE"] = "cpu"
    os.environ["HF_HUB_OFFLINE"] = "1"
    import torch
    from vllm.config import (
        DeviceConfig,
        LoadConfig,
        ModelConfig,
        VllmConfig,
        set_current_vllm_config,
    )
    from vllm.distributed import parallel_state
    from vllm.model_executor.model_loader.default_loader import DefaultModelLoader
    from vllm.model_executor.model_loader.utils import initialize_model

    from inspector._internal.load import engine_child

    results = {}
    for folder in folders:
        model_config = ModelConfig(model=folder, skip_tokenizer_init=True, enforce_eager=True)
        config = VllmConfig(
            model_config=model_config,
            load_config=LoadConfig(load_format="safetensors"),
            device_config=DeviceConfig("cpu"),
        )
        # The groups are made for the config current at their creation (a MoE model's
        # expert-parallel group only for a MoE config): made again for each case and verdict.
        _reset(parallel_state)
        with set_current_vllm_config(config):
            if not parallel_state.model_parallel_is_initialized():
                parallel_state.init_distributed_environment(
                    world_size=1, rank=0, local_rank=0, backend="gloo",
                    distributed_init_method=f"file://{folder}.gloo",
                )  # fmt: skip
                parallel_state.ensure_model_parallel_initialized(1, 1)
            with torch.device("cpu"):
                model = initialize_model(config)
            try:
                DefaultModelLoader(config.load_config).load_weights(model, model_config)
                engine = "loads"
            except Exception as exc:
                engine = f"{type(exc).__name__}: {exc}"
        _reset(parallel_state)
        ours = engine_child._verdict(folder, "safetensors-single", 1)
        ours.pop("digest", None)
        results[Path(folder).name] = {"engine": engine, "ours": ours}
    return results


def _reset(parallel_state: Any) -> None:
    if parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()
        parallel_state.destroy_distributed_environment()


if __name__ == "__main__":
    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # what vLLM prints is not the answer
    answers.write(json.dumps(_run(sys.argv[1:])) + "\n")
    answers.close()
    os._exit(0)
