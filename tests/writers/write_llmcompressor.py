"""Write compressed-tensors checkpoints with the REAL writers: llm-compressor's `oneshot` (which
quantizes with compressed-tensors and saves through its `save_pretrained` wrapper:
`ModelCompressor.compress_model`, `save_pretrained`, `ModelCompressor.update_config`,
`recipe.yaml`) and llm-compressor's `model_free_ptq` (safetensors in, safetensors out, no model
class), healthy and damaged the way users find them.

Runs in its own virtual environment, `build/writers-venv-llmc` (pins in
`tests/writers/constraints-llmc.txt`): llmcompressor 0.14.0.1 requires transformers 5.15-5.17
and exactly compressed-tensors 0.19.0, which the main writers' environment (transformers
5.23) cannot hold.

Everything runs on the CPU, without a shim: `oneshot` falls back to the CPU by itself ("No
accelerator available! Compressing model on CPU instead"), data-free schemes need no data, and
schemes with static activation scales (NVFP4's `input_global_scale`, FP8 `input_scale`, the KV
cache scales) calibrate on 8 rows of 16 random token ids given as a tokenized `datasets.Dataset`
(no tokenizer is needed for an already tokenized dataset).

One base model for every case: a tiny Qwen3-MoE (hidden 128 so that every group and block size
used here divides it: W4A16 groups of 128, NVFP4 groups of 16, FP8 blocks of 128x128; layer 0
dense, layer 1 with 4 experts), bfloat16, seed 0, saved by transformers to a scratch folder and
loaded back. Its fused experts are turned into one `nn.Linear` per expert with llm-compressor's
`linearize_moe` (compressed-tensors quantizes `Linear` modules only; vLLM reads per-expert
names). llm-compressor's own loader (`load_quantizable_moe`) does the same at load time but
fails here: transformers 5.17's class patching walks every lazily imported transformers module
and one of them imports torchvision, which is not installed (and PyPI's torchvision does not
import beside this torch); the post-load path is the one llm-compressor documents as the
fallback and gives the same module tree.

Cases (`tests/fixtures/writers/llmcompressor/`):
- fp8-dynamic: scheme FP8_DYNAMIC (float-quantized; F8_E4M3 `weight`, per-channel
  `weight_scale` [out, 1]; dynamic per-token activations, so no `input_scale`).
- w4a16: scheme W4A16 (pack-quantized; `weight_packed` I32, `weight_scale` [out, in/128],
  `weight_shape`).
- nvfp4: scheme NVFP4 (nvfp4-pack-quantized; `weight_packed` U8 [out, in/2], `weight_scale`
  F8_E4M3 [out, in/16], `weight_global_scale` and `input_global_scale` F32 [1]).
- mixed-precision: three config groups whose targets are `re:` patterns (FP8 static per-tensor
  attention, INT8 per-channel dense MLP, asymmetric INT4 groups of 32 for the experts) and a
  `kv_cache_scheme` (attention `k_scale` / `v_scale`): format mixed-precision.
- model-free-fp8-block: `model_free_ptq(scheme="FP8_BLOCK")`: config.json keeps the `re:`
  patterns of `ignore` as given (oneshot writes module names instead), `weight_scale`
  [ceil(out/128), ceil(in/128)].
- recipe-ignore-drift: the w4a16 output with the recipe.yaml of a second W4A16 run that also
  ignored layer 0's MLP (files of two runs uploaded together).
- targeted-module-unquantized: the weights of that second run (layer 0's MLP stored as plain
  bfloat16 `weight`) with the config.json of the first (whose `ignore` does not name them).
- lm-head-scales-exported: an NVFP4 run that quantized `lm_head`, whose config.json was then
  edited to list `lm_head` in `ignore` (as done to serve on an engine that cannot run a
  quantized head): NVFP4 tensors of a module the config says is not quantized.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common

# The file-name table, from the project's source tree (the writers' environments do not
# install the project; importing it takes the standard library alone).
sys.path.insert(1, str(_common.REPO))

from inspector._internal.common.filenames import CONFIG_NAME

WRITER = "llmcompressor"
PACKAGE = "llmcompressor"
SCRIPT = "write_llmcompressor.py"
IGNORE = ["lm_head", "re:.*mlp.gate$"]
BASE: dict[str, Any] = {
    "vocab_size": 32,
    "hidden_size": 128,
    "head_dim": 32,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "intermediate_size": 128,
    "moe_intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "mlp_only_layers": [0],
    "tie_word_embeddings": False,
}
MIXED_RECIPE = r"""
quant_stage:
  quant_modifiers:
    QuantizationModifier:
      ignore: ["lm_head", "re:.*mlp.gate$"]
      config_groups:
        attention:
          targets: ["re:.*self_attn\\.(q|k|v|o)_proj$"]
          weights: {num_bits: 8, type: float, strategy: tensor, symmetric: true, dynamic: false}
          input_activations: {num_bits: 8, type: float, strategy: tensor, symmetric: true,
                              dynamic: false}
        dense_mlp:
          targets: ["re:.*layers\\.0\\.mlp\\.(gate|up|down)_proj$"]
          weights: {num_bits: 8, type: int, strategy: channel, symmetric: true, dynamic: false}
        experts:
          targets: ["re:.*mlp\\.experts\\.\\d+\\.(gate|up|down)_proj$"]
          weights: {num_bits: 4, type: int, strategy: group, group_size: 32, symmetric: false,
                    dynamic: false}
      kv_cache_scheme: {num_bits: 8, type: float, strategy: tensor, symmetric: true,
                        dynamic: false}
"""


def _base(folder: Path) -> int:
    """Save the base model to `folder`; returns its parameter count (values)."""
    import torch
    import transformers

    config = transformers.Qwen3MoeConfig(**BASE)
    torch.manual_seed(0)
    model = transformers.Qwen3MoeForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(folder)
    return sum(p.numel() for p in model.parameters())


def _calibration() -> Any:
    import torch
    from datasets import Dataset

    ids = torch.randint(0, BASE["vocab_size"], (8, 16), generator=torch.Generator().manual_seed(0))
    return Dataset.from_dict({"input_ids": ids.tolist(), "attention_mask": [[1] * 16] * 8})


def _quantize(base: Path, dest: Path, recipe: Any, *, calibrate: bool) -> None:
    """`oneshot` on the base model (experts linearized), then llm-compressor's compressed save."""
    import torch
    from llmcompressor import oneshot
    from llmcompressor.modeling.moe.linearize import linearize_moe
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.bfloat16)
    linearize_moe(model)
    data: dict[str, Any] = {}
    if calibrate:
        data = {
            "dataset": _calibration(),
            "num_calibration_samples": 8,
            "max_seq_length": 16,
            "shuffle_calibration_samples": False,
        }
    oneshot(model=model, recipe=recipe, **data)
    model.save_pretrained(dest, save_compressed=True)


def _scheme(scheme: str, ignore: list[str]) -> Any:
    from llmcompressor.modifiers.quantization import QuantizationModifier

    return QuantizationModifier(targets="Linear", scheme=scheme, ignore=ignore)


def _quant_config(folder: Path) -> dict[str, Any]:
    return json.loads((folder / CONFIG_NAME).read_text())["quantization_config"]


def _record(
    case: str, *, parameters: int, extra: dict[str, Any] | None = None, **case_args: Any
) -> None:
    """The manifest entry of a compressed-tensors case: its quantization config in short, the
    unquantized model's parameter count (values: what the project's count must give) and
    every tensor it holds."""
    folder = _common.FIXTURES / WRITER / case
    q = _quant_config(folder)
    facts = {
        "compressed_tensors": _common.version("compressed-tensors"),
        "transformers": _common.version("transformers"),
        "quant_format": q["format"],
        "config_groups": {n: g["targets"] for n, g in q["config_groups"].items()},
        "ignore": q["ignore"],
        "parameters": parameters,
        "tensors": _common.safetensors_listing(folder),
    }
    _common.record_expected(
        WRITER, case, package=PACKAGE, script=SCRIPT, fmt="compressed-tensors",
        extra=facts | (extra or {}), **case_args,
    )  # fmt: skip


def _copy_run(run: Path, case: str) -> Path:
    dest = _common.case_dir(WRITER, case)
    for item in run.iterdir():
        shutil.copy2(item, dest / item.name)
    return dest


def main() -> None:
    import llmcompressor

    lc = f"llmcompressor {llmcompressor.__version__}"
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        base = tmp / "base"
        params = _base(base)

        healthy = {
            "fp8-dynamic": (_scheme("FP8_DYNAMIC", IGNORE), False, "FP8_DYNAMIC"),
            "w4a16": (_scheme("W4A16", IGNORE), False, "W4A16"),
            "nvfp4": (_scheme("NVFP4", IGNORE), True, "NVFP4"),
            "mixed-precision": (MIXED_RECIPE, True, "3 config groups + kv_cache_scheme"),
        }
        for case, (recipe, calibrate, what) in healthy.items():
            dest = _common.case_dir(WRITER, case)
            _quantize(base, dest, recipe, calibrate=calibrate)
            _record(
                case,
                description=f"oneshot {what} of a tiny Qwen3-MoE (experts linearized), "
                f"ignore {IGNORE}, save_pretrained(save_compressed=True), {lc}",
                expected=[],
                words="healthy: no error, no warning",
                parameters=params,
            )

        from llmcompressor import model_free_ptq

        dest = _common.case_dir(WRITER, "model-free-fp8-block")
        free_ignore = [*IGNORE, "re:.*embed_tokens"]
        model_free_ptq(base, dest, scheme="FP8_BLOCK", ignore=free_ignore, device="cpu")
        _record(
            "model-free-fp8-block",
            description=f"model_free_ptq(scheme='FP8_BLOCK', ignore={free_ignore}) of the tiny "
            f"Qwen3-MoE saved by transformers, {lc}",
            expected=[],
            words="healthy: the `re:` patterns of ignore are honoured (router gates and lm_head "
            "stay bfloat16); norms are skipped by model_free_ptq without being listed",
            parameters=params,
        )

        # A second W4A16 run that also leaves layer 0's MLP unquantized.
        dense_mlp = r"re:.*layers\.0\.mlp\.(gate|up|down)_proj$"
        run_b = tmp / "w4a16-b"
        _quantize(base, run_b, _scheme("W4A16", [*IGNORE, dense_mlp]), calibrate=False)
        run_a = _common.FIXTURES / WRITER / "w4a16"

        dest = _copy_run(run_a, "recipe-ignore-drift")
        shutil.copy2(run_b / "recipe.yaml", dest / "recipe.yaml")
        _record(
            "recipe-ignore-drift",
            description="w4a16 output with the recipe.yaml of another W4A16 run",
            damage=f"recipe.yaml taken from a run whose ignore also held {dense_mlp!r}: the "
            "recipe ignores layer 0's gate/up/down_proj, config.json quantizes them (and the "
            "shards hold them quantized)",
            expected=["quant-recipe-mismatch"],
            words="recipe.yaml's ignore resolves to 3 modules more than config.json's "
            "(model.layers.0.mlp.gate_proj/up_proj/down_proj): the two disagree on what is "
            "quantized (quant-recipe-mismatch); the tensors agree with config.json, nothing "
            "else. Note the healthy cases: the recipe holds 2 patterns where config.json holds "
            "2 names, so a literal comparison would false-alarm on every oneshot output",
            parameters=params,
        )

        dest = _copy_run(run_b, "targeted-module-unquantized")
        for name in (CONFIG_NAME, "recipe.yaml"):
            shutil.copy2(run_a / name, dest / name)
        _record(
            "targeted-module-unquantized",
            description="weights of a W4A16 run that left layer 0's MLP unquantized, with the "
            "config.json and recipe.yaml of a run that quantized it",
            damage="config.json and recipe.yaml copied from a sibling run: group_0 targets "
            "Linear and ignore names only model.layers.1.mlp.gate and lm_head, yet "
            "model.layers.0.mlp.gate/up/down_proj hold a plain bfloat16 `weight`",
            expected=["quant-scheme-mismatch"],
            words="model.layers.0.mlp.{gate,up,down}_proj are targeted by group_0 (W4A16, "
            "pack-quantized) and not ignored, but hold a bfloat16 `weight` and no "
            "weight_packed/weight_scale/weight_shape (quant-scheme-mismatch, one per module); "
            "a serving engine creates packed parameters for them and finds no data",
            parameters=params,
        )

        dest = _common.case_dir(WRITER, "lm-head-scales-exported")
        _quantize(base, dest, _scheme("NVFP4", ["re:.*mlp.gate$"]), calibrate=True)
        config = json.loads((dest / CONFIG_NAME).read_text())
        config["quantization_config"]["ignore"].append("lm_head")
        # the same formatting ModelCompressor.update_config uses
        (dest / CONFIG_NAME).write_text(json.dumps(config, indent=2, sort_keys=True))
        _record(
            "lm-head-scales-exported",
            description="oneshot NVFP4 with lm_head quantized, config.json then edited to "
            "ignore lm_head",
            damage="'lm_head' appended to quantization_config.ignore after the save; the shard "
            "still holds lm_head.weight_packed/weight_scale/weight_global_scale/"
            "input_global_scale and no lm_head.weight",
            expected=[
                "quant-config-missing-layer",
                "load-missing-tensor",
                "load-unexpected-tensor",
            ],
            words="lm_head is stored NVFP4-quantized but config.json ignores it "
            "(quant-config-missing-layer); loaders then build a plain Linear: lm_head.weight is "
            "missing (load-missing-tensor) and its four quantized tensors are unexpected "
            "(load-unexpected-tensor); today's checker already reports the two load codes",
            parameters=params,
        )


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
