"""vLLM's own load against ours, on tiny models: the cases issue 37 lists, written by the real
writers (transformers' `save_pretrained`, then re-saved with safetensors' `save_file` after the
damage), and a script that runs, in one process and one vLLM import, what vLLM's real loader
does with the real tensors on CPU (`DefaultModelLoader.load_weights`, its own strictness),
then serves as our verdict's child (`load.engine_child`: meta tensors, sealed), asked by
tests/conftest.py's `vllm_cases` through `load.engine.engine_verdict`.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

from inspector._internal.common.filenames import CONFIG_NAME, GENERATION_CONFIG_NAME

__all__ = ["CASES", "HOSTILE", "engine_alone", "write_cases", "write_hostile"]

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
            config = json.loads((folder / CONFIG_NAME).read_text())
            config_edit(config)
            (folder / CONFIG_NAME).write_text(json.dumps(config))
        out[case] = folder
    return out


# Hostile folders for our verdict alone (vLLM's own load is not asked): config.json fields
# that reach vLLM, and files beside it. case -> (edit of config.json, files to add).
_IMPORTED = "imported.txt"
_CODE = f"open(__file__.rsplit('/', 1)[0] + '/{_IMPORTED}', 'w').write('ran')\n"
HOSTILE: dict[str, tuple[Callable[[dict], None], dict[str, str]]] = {
    # A billion layers: vLLM would build them (minutes, gigabytes); refused before it runs.
    "billion-layers": (lambda c: c.update(num_hidden_layers=10**9), {}),
    # The folder's own code named at the top and nested: never imported.
    "auto-map": (
        lambda c: c.update(
            architectures=["EvilForCausalLM"],
            auto_map={"AutoModelForCausalLM": "evil.EvilForCausalLM"},
            text_config={"auto_map": {"AutoConfig": "evil.EvilConfig"}},
        ),
        {"evil.py": _CODE},
    ),
    # A generation config that is a link to an endless file: vLLM never reads the folder.
    "endless-link": (lambda c: None, {GENERATION_CONFIG_NAME: "->/dev/zero"}),
    # A Hub repository named for a part of the model: offline, sealed.
    "hub-backbone": (
        lambda c: c.update(speculators_config={"verifier": {"name_or_path": "someone/else"}}),
        {},
    ),
}


def write_hostile(root: Path, base: Path) -> dict[str, Path]:
    """Every case of `HOSTILE` under `root`: `base`'s files, its config.json edited."""
    out = {}
    for case, (config_edit, files) in HOSTILE.items():
        folder = root / case
        shutil.copytree(base, folder)
        config = json.loads((folder / CONFIG_NAME).read_text())
        config_edit(config)
        (folder / CONFIG_NAME).write_text(json.dumps(config))
        for name, text in files.items():
            (folder / name).unlink(missing_ok=True)
            if text.startswith("->"):
                (folder / name).symlink_to(text[2:])
            else:
                (folder / name).write_text(text)
        out[case] = folder
    return out


def imported(folder: Path) -> bool:
    """Whether a hostile folder's own code ran."""
    return (folder / _IMPORTED).exists()


def engine_alone(folders: list[str]) -> dict[str, str]:
    """What vLLM's real loader does with each folder's real tensors on CPU: "loads", or its
    exception as it wrote it."""
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

    results = {}
    for folder in folders:
        model_config = ModelConfig(model=folder, skip_tokenizer_init=True, enforce_eager=True)
        config = VllmConfig(
            model_config=model_config,
            load_config=LoadConfig(load_format="safetensors"),
            device_config=DeviceConfig("cpu"),
        )
        # The groups are made for the config current at their creation (a MoE model's
        # expert-parallel group only for a MoE config): made again for each case.
        with set_current_vllm_config(config):
            parallel_state.init_distributed_environment(
                world_size=1, rank=0, local_rank=0, backend="gloo",
                distributed_init_method=f"file://{folder}.gloo",
            )  # fmt: skip
            parallel_state.ensure_model_parallel_initialized(1, 1)
            try:
                with torch.device("cpu"):
                    model = initialize_model(config)
                DefaultModelLoader(config.load_config).load_weights(model, model_config)
                results[Path(folder).name] = "loads"
            except Exception as exc:
                results[Path(folder).name] = f"{type(exc).__name__}: {exc}"
            finally:
                parallel_state.destroy_model_parallel()
                parallel_state.destroy_distributed_environment()
    return results


if __name__ == "__main__":
    # `python tests/vllm_cases.py`: this process serves as the vLLM verdict's child
    # (`load.engine_child`, as `_main` starts it: our verdicts come first, from a cold
    # process, vLLM imported and used under the seal as for a user), then a last request
    # {"alone": [CASE_FOLDER, ...]} runs vLLM's own load of every case and answers with what
    # it did: one vLLM import for both.
    import io

    os.environ["VLLM_TARGET_DEVICE"] = "cpu"
    from inspector._internal.load import engine_child

    answers = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # what vLLM prints is not an answer
    engine_child._bound()
    engine_child._prepare()
    for line in sys.stdin.buffer:
        request = json.loads(line)
        if "alone" in request:
            answers.write(json.dumps(engine_alone(request["alone"])).encode() + b"\n")
            answers.flush()
        else:
            engine_child._serve(io.BytesIO(line), answers)
    answers.close()
    os._exit(0)
