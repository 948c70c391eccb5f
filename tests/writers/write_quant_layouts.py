"""Write MXFP4 (gpt-oss `_blocks` / `_scales`) and DeepSeek block-FP8 (`weight_scale_inv`)
checkpoints, healthy and damaged, with the real libraries wherever they run on the CPU.

Runs in the main writers' environment (`build/writers-venv`: transformers 5.23,
nvidia-modelopt 0.47, huggingface_hub, accelerate).

What writes what, and why:
- transformers cannot write MXFP4 here: its `Mxfp4HfQuantizer` quantizes with the
  `triton_kernels` package that the `kernels` library downloads from the Hub at run time
  (`quantize_to_mxfp4`, `swizzle_mxfp4` in `transformers/integrations/mxfp4.py`), and this
  machine reaches package registries only. The gpt-oss layout is therefore written as gpt-oss
  checkpoints ship it: every other tensor as transformers holds it, the experts' `gate_up_proj`
  and `down_proj` quantized by nvidia-modelopt's `MXFP4QTensor.quantize` (E2M1 codes, two a
  byte, even element in the low nibble; one E8M0 exponent per 32 values, bias 127) and laid out
  `[experts, out, in/32, 16]` / `[experts, out, in/32]`; shards and index by huggingface_hub's
  `save_torch_state_dict` (what `save_pretrained` uses). The result is read back with
  transformers' own loader (`Mxfp4Config(dequantize=True)`, the CPU path): no missing, no
  unexpected key, and every dequantized expert equal to modelopt's own dequantization.
- transformers' `FineGrainedFP8HfQuantizer` quantizes on load only with a GPU
  (`validate_environment` raises "No GPU or XPU found"). The DeepSeek-V3 layout is written as
  the published checkpoints hold it (config `quantization_config` = `{"activation_scheme":
  "dynamic", "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": [128, 128]}`; every
  attention, dense-MLP, shared-expert and routed-expert projection F8_E4M3 with an F32
  `weight_scale_inv` of `[ceil(out/128), ceil(in/128)]`, the dequantization multiplier of each
  128x128 tile, tiles at the edges partial; embeddings, norms, router and lm_head kept), and
  read back with transformers' loader, which dequantizes on the CPU: no missing, no unexpected
  key, every weight equal to `weight * weight_scale_inv` tile by tile.
- transformers-fp8-save: what transformers' FineGrainedFP8 quantizer itself writes. One CPU
  shim: `validate_environment` is replaced by a no-op for the load (it only checks that
  accelerate is installed and that a GPU is present, and raises; it configures nothing); the
  quantization ops (`Fp8Quantize`) are plain torch and run on the CPU unchanged.

Cases (`tests/fixtures/writers/mxfp4/` and `.../fp8-block/`):
- mxfp4/gpt-oss: healthy, 3 shards, `modules_to_not_convert` as gpt-oss ships it.
- mxfp4/scales-missing: layer 1's `down_proj_scales` dropped from its shard and the index (a
  conversion that copied `*_blocks` only).
- mxfp4/scales-transposed: layer 0's `gate_up_proj_scales` stored `[experts, in/32, out]` (the
  kernels' swizzled orientation written without transposing back).
- mxfp4/dequantized-resave: transformers 5.23 loading gpt-oss with `Mxfp4Config(dequantize=
  True)` and calling `save_pretrained`: the dequantized bfloat16 experts are written under the
  `*_blocks` names with no scales, and `quantization_config` is dropped from config.json.
- fp8-block/deepseek-v3: healthy, 4 shards.
- fp8-block/scale-inv-transposed: `weight_scale_inv` of layer 0's q_a_proj and q_b_proj stored
  transposed (`[ceil(in/128), ceil(out/128)]`, as a converter writing column-major tiles does).
- fp8-block/expert-scale-missing: expert 3 of layer 1 lost its `gate_proj.weight_scale_inv`
  (removed from its shard and the index).
- fp8-block/transformers-fp8-save: transformers 5.23 `from_pretrained(...,
  quantization_config=FineGrainedFP8Config())` of the bfloat16 model, then `save_pretrained`.
"""

from __future__ import annotations

import json
import math
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

from inspector._internal.common.filenames import CONFIG_NAME, GENERATION_CONFIG_NAME, INDEX_NAME

SCRIPT = "write_quant_layouts.py"
MXFP4_NOT_CONVERTED = [
    "model.layers.*.self_attn",
    "model.layers.*.mlp.router",
    "model.embed_tokens",
    "lm_head",
]
DEEPSEEK_FP8 = {
    "activation_scheme": "dynamic",
    "fmt": "e4m3",
    "quant_method": "fp8",
    "weight_block_size": [128, 128],
}
BLOCK = 128
FP8_MAX = 448.0


def _read_all(folder: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    out: dict[str, Any] = {}
    for path in sorted(folder.glob("*.safetensors")):
        out.update(load_file(str(path)))
    return out


def _save_sharded(state: dict[str, Any], folder: Path, max_shard_size: str) -> None:
    from huggingface_hub import save_torch_state_dict

    save_torch_state_dict(state, folder, max_shard_size=max_shard_size)


def _drop(folder: Path, names: list[str]) -> None:
    """Remove tensors from their shard (rewritten with the same metadata) and from the index,
    whose `total_size` is lowered by their bytes: what a tool that writes the shards and the
    index without them leaves, so that only the intended damage shows."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    index_path = folder / INDEX_NAME
    index = json.loads(index_path.read_text())
    for name in names:
        shard = folder / index["weight_map"].pop(name)
        with safe_open(str(shard), "pt") as f:
            meta = f.metadata()
            names = f.keys()
            kept = {n: f.get_tensor(n) for n in names if n != name}
            dropped = f.get_tensor(name)
        save_file(kept, str(shard), metadata=meta)
        index["metadata"]["total_size"] -= dropped.numel() * dropped.element_size()
    index_path.write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")


def _replace(folder: Path, updates: dict[str, Any]) -> None:
    """Rewrite tensors in place in their shard (same names, new values or shapes)."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    index = json.loads((folder / INDEX_NAME).read_text())
    by_shard: dict[str, dict[str, Any]] = {}
    for name, value in updates.items():
        by_shard.setdefault(index["weight_map"][name], {})[name] = value
    for shard_name, values in by_shard.items():
        shard = folder / shard_name
        with safe_open(str(shard), "pt") as f:
            meta = f.metadata()
            names = f.keys()
            kept = {n: values.get(n, f.get_tensor(n)) for n in names}
        save_file(kept, str(shard), metadata=meta)


def _record(
    writer: str, case: str, *, extra: dict[str, Any] | None = None, **case_args: Any
) -> None:
    """The manifest entry of an MXFP4 or block-FP8 case, with every tensor it holds."""
    folder = _common.FIXTURES / writer / case
    facts = {
        "transformers": _common.version("transformers"),
        "tensors": _common.safetensors_listing(folder),
    }
    _common.record_expected(writer, case, script=SCRIPT, extra=facts | (extra or {}), **case_args)


# -- MXFP4 --------------------------------------------------------------------------------------


def _gpt_oss() -> Any:
    import torch
    import transformers

    config = transformers.GptOssConfig(
        vocab_size=64, hidden_size=64, head_dim=16, intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, num_local_experts=4,
        num_experts_per_tok=2, layer_types=["sliding_attention", "full_attention"],
        tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(0)
    return transformers.GptOssForCausalLM(config).to(torch.bfloat16)


def _mxfp4(weight: Any) -> tuple[Any, Any]:
    """(blocks, scales) of one expert stack held as transformers holds it, `[E, in, out]`."""
    from modelopt.torch.quantization.qtensor import MXFP4QTensor

    w = weight.transpose(1, 2).contiguous()  # [E, out, in]: rows of the matmul
    experts, rows, cols = w.shape
    packed, scales = MXFP4QTensor.quantize(w, block_size=32)
    blocks = packed._quantized_data.reshape(experts, rows, cols // 32, 16)
    return blocks, scales.reshape(experts, rows, cols // 32)


def _mxfp4_dequantized(weight: Any) -> Any:
    """modelopt's own dequantization of `_mxfp4(weight)`, in transformers' orientation."""
    import torch
    from modelopt.torch.quantization.qtensor import MXFP4QTensor

    packed, scales = MXFP4QTensor.quantize(weight.transpose(1, 2).contiguous(), block_size=32)
    deq = packed.dequantize(dtype=torch.float32, scale=scales, block_sizes={-1: 32})
    return deq.transpose(1, 2).to(torch.bfloat16)


def _write_gpt_oss(model: Any, dest: Path) -> dict[str, Any]:
    state: dict[str, Any] = {}
    for name, t in model.state_dict().items():
        if name.endswith(("mlp.experts.gate_up_proj", "mlp.experts.down_proj")):
            state[f"{name}_blocks"], state[f"{name}_scales"] = _mxfp4(t)
        else:
            state[name] = t
    _save_sharded(state, dest, "40KB")
    config = model.config.to_dict()
    config["quantization_config"] = {
        "modules_to_not_convert": MXFP4_NOT_CONVERTED,
        "quant_method": "mxfp4",
    }
    (dest / CONFIG_NAME).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return state


def _check_gpt_oss_reads_back(model: Any, dest: Path) -> Any:
    """transformers' own loader reads the layout: no key missing or unexpected, every expert
    equal to the writer's dequantization. Returns the loaded (dequantized) model."""
    import torch
    import transformers

    loaded, info = transformers.AutoModelForCausalLM.from_pretrained(
        dest,
        quantization_config=transformers.Mxfp4Config(dequantize=True),
        dtype=torch.bfloat16,
        output_loading_info=True,
    )
    problems = {k: v for k, v in info.items() if v}
    if problems:
        raise SystemExit(f"transformers does not read {dest} cleanly: {problems}")
    for i, layer in enumerate(model.model.layers):
        for proj in ("gate_up_proj", "down_proj"):
            want = _mxfp4_dequantized(getattr(layer.mlp.experts, proj))
            got = getattr(loaded.model.layers[i].mlp.experts, proj)
            if not torch.equal(want, got):
                raise SystemExit(f"layer {i} {proj}: transformers dequantizes differently")
    return loaded


def mxfp4_cases() -> None:
    import transformers

    tf = f"transformers {transformers.__version__}"
    model = _gpt_oss()
    params = sum(p.numel() for p in model.parameters())
    dest = _common.case_dir("mxfp4", "gpt-oss")
    _write_gpt_oss(model, dest)
    loaded = _check_gpt_oss_reads_back(model, dest)
    common = {"parameters": params, "read_back": f"{tf} Mxfp4Config(dequantize=True): clean"}
    _record(
        "mxfp4",
        "gpt-oss",
        fmt="mxfp4",
        package="nvidia-modelopt",
        description="GptOssForCausalLM experts quantized by modelopt MXFP4QTensor, laid out as "
        "gpt-oss ships (_blocks [E, out, in/32, 16] U8, _scales [E, out, in/32] U8), "
        "huggingface_hub save_torch_state_dict(max_shard_size='40KB')",
        expected=[],
        words="healthy: no error, no warning; parameters count the experts as values "
        "(blocks x 32 per 16 bytes), not as bytes",
        extra=common,
    )

    dest = _common.case_dir("mxfp4", "scales-missing")
    _write_gpt_oss(model, dest)
    lost = "model.layers.1.mlp.experts.down_proj_scales"
    _drop(dest, [lost])
    _record(
        "mxfp4",
        "scales-missing",
        fmt="mxfp4",
        package="nvidia-modelopt",
        description="gpt-oss MXFP4 layout without one _scales tensor",
        damage=f"{lost} removed from its shard and the index (a conversion that copied the "
        "*_blocks tensors only)",
        expected=["quant-scheme-mismatch"],
        words="model.layers.1.mlp.experts.down_proj has _blocks but no _scales "
        "(quant-scheme-mismatch); transformers' loader cannot dequantize it (a load view that "
        "models MXFP4 would add load-missing-tensor: today's gives nothing)",
        extra=common | {"lost": lost},
    )

    dest = _common.case_dir("mxfp4", "scales-transposed")
    state = _write_gpt_oss(model, dest)
    bad = "model.layers.0.mlp.experts.gate_up_proj_scales"
    _replace(dest, {bad: state[bad].transpose(1, 2).contiguous()})
    _record(
        "mxfp4",
        "scales-transposed",
        fmt="mxfp4",
        package="nvidia-modelopt",
        description="gpt-oss MXFP4 layout with one _scales tensor transposed",
        damage=f"{bad} written [E, in/32, out] = {list(state[bad].transpose(1, 2).shape)} "
        f"instead of [E, out, in/32] = {list(state[bad].shape)}",
        expected=["quant-scheme-mismatch"],
        words="the scales of model.layers.0.mlp.experts.gate_up_proj do not match its blocks: "
        "blocks [4, 64, 2, 16] need scales [4, 64, 2] (quant-scheme-mismatch)",
        extra=common | {"damaged": bad},
    )

    dest = _common.case_dir("mxfp4", "dequantized-resave")
    loaded.save_pretrained(dest, max_shard_size="40KB")
    config = json.loads((dest / CONFIG_NAME).read_text())
    _record(
        "mxfp4",
        "dequantized-resave",
        fmt="mxfp4",
        package="transformers",
        description=f"gpt-oss loaded with Mxfp4Config(dequantize=True), then save_pretrained, {tf}",
        damage="written by transformers itself: the dequantized bfloat16 experts are saved "
        "under the *_blocks names ([E, in, out], no *_scales) and config.json has no "
        "quantization_config",
        expected=["load-missing-tensor", "load-unexpected-tensor"],
        words="GptOssForCausalLM expects mlp.experts.gate_up_proj / down_proj, which are not "
        "stored (load-missing-tensor); the *_blocks tensors are bfloat16 weights under MXFP4 "
        "names that nothing reads (load-unexpected-tensor)",
        extra=common | {"quantization_config_kept": "quantization_config" in config},
    )


# -- DeepSeek block FP8 -------------------------------------------------------------------------


def _deepseek() -> Any:
    import torch
    import transformers

    config = transformers.DeepseekV3Config(
        vocab_size=32, hidden_size=128, intermediate_size=128, moe_intermediate_size=32,
        num_hidden_layers=2, num_attention_heads=1, num_key_value_heads=1, n_routed_experts=4,
        n_shared_experts=1, num_experts_per_tok=2, first_k_dense_replace=1, kv_lora_rank=64,
        q_lora_rank=192, qk_rope_head_dim=16, qk_nope_head_dim=32, v_head_dim=32, n_group=2,
        topk_group=1, tie_word_embeddings=False, num_nextn_predict_layers=0,
    )  # fmt: skip
    torch.manual_seed(0)
    return transformers.DeepseekV3ForCausalLM(config).to(torch.bfloat16)


def _block_fp8(weight: Any) -> tuple[Any, Any]:
    """(F8_E4M3 weight, F32 weight_scale_inv) with 128x128 tiles, edge tiles partial: each
    tile's scale is its max |w| / 448, the weight is w / scale cast to float8_e4m3fn."""
    import torch

    rows, cols = weight.shape
    tr, tc = math.ceil(rows / BLOCK), math.ceil(cols / BLOCK)
    padded = torch.zeros(tr * BLOCK, tc * BLOCK, dtype=torch.float32)
    padded[:rows, :cols] = weight.float()
    tiles = padded.reshape(tr, BLOCK, tc, BLOCK)
    amax = tiles.abs().amax(dim=(1, 3))
    scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    q = (tiles / scale[:, None, :, None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q.reshape(tr * BLOCK, tc * BLOCK)[:rows, :cols].clone(), scale


def _quantized_projection(name: str) -> bool:
    return name.endswith(("_proj.weight", "_proj_with_mqa.weight"))


def _write_deepseek(bf16: Path, dest: Path) -> dict[str, Any]:
    state: dict[str, Any] = {}
    for name, t in _read_all(bf16).items():
        if _quantized_projection(name):
            state[name], state[f"{name}_scale_inv"] = _block_fp8(t)
        else:
            state[name] = t
    _save_sharded(state, dest, "100KB")
    config = json.loads((bf16 / CONFIG_NAME).read_text())
    config["quantization_config"] = DEEPSEEK_FP8
    (dest / CONFIG_NAME).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    shutil.copy2(bf16 / GENERATION_CONFIG_NAME, dest / GENERATION_CONFIG_NAME)
    return state


def _check_deepseek_reads_back(state: dict[str, Any], dest: Path) -> None:
    import torch
    import transformers

    loaded, info = transformers.AutoModelForCausalLM.from_pretrained(
        dest, dtype=torch.bfloat16, output_loading_info=True
    )
    problems = {k: v for k, v in info.items() if v}
    if problems:
        raise SystemExit(f"transformers does not read {dest} cleanly: {problems}")
    held = dict(loaded.named_parameters())
    for name, q in state.items():
        # transformers' CPU dequantization (`Fp8Dequantize._dequantize_one`) takes the tile as
        # weight side // scale side, which is the writer's 128 only where the side is a
        # multiple of 128 (q_a_proj [192, 128] with [2, 1] scales is read with 96-row tiles,
        # a [576, 7168] weight with [5, 56] scales raises): compare those modules only.
        if not (_quantized_projection(name) and name in held) or any(n % BLOCK for n in q.shape):
            continue
        s = state[f"{name}_scale_inv"]
        full = s.repeat_interleave(BLOCK, 0).repeat_interleave(BLOCK, 1)
        want = (q.float() * full[: q.shape[0], : q.shape[1]]).to(torch.bfloat16)
        if not torch.equal(want, held[name]):
            raise SystemExit(f"{name}: transformers dequantizes differently")


def _fp8_quantizer_save(bf16: Path, dest: Path) -> None:
    """transformers' FineGrainedFP8 quantize-on-load, then save_pretrained (see the module
    docstring for the one shim)."""
    import torch
    import transformers
    from transformers.quantizers.quantizer_finegrained_fp8 import FineGrainedFP8HfQuantizer

    saved = FineGrainedFP8HfQuantizer.validate_environment
    FineGrainedFP8HfQuantizer.validate_environment = lambda self, *a, **k: None  # type: ignore[method-assign]
    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(
            bf16,
            quantization_config=transformers.FineGrainedFP8Config(weight_block_size=[128, 128]),
            dtype=torch.bfloat16,
        )
    finally:
        FineGrainedFP8HfQuantizer.validate_environment = saved  # type: ignore[method-assign]
    model.save_pretrained(dest, max_shard_size="100KB")


def fp8_cases() -> None:
    import transformers

    tf = f"transformers {transformers.__version__}"
    model = _deepseek()
    params = sum(p.numel() for p in model.parameters())
    with tempfile.TemporaryDirectory() as tmp:
        bf16 = Path(tmp) / "bf16"
        model.save_pretrained(bf16)
        common = {"parameters": params, "quantization_config": DEEPSEEK_FP8}

        dest = _common.case_dir("fp8-block", "deepseek-v3")
        state = _write_deepseek(bf16, dest)
        _check_deepseek_reads_back(state, dest)
        _record(
            "fp8-block",
            "deepseek-v3",
            fmt="fp8-block",
            package="transformers",
            description="DeepseekV3ForCausalLM saved by transformers, every projection written "
            "in the DeepSeek-V3 published layout (F8_E4M3 weight + F32 weight_scale_inv "
            "[ceil(out/128), ceil(in/128)]), huggingface_hub save_torch_state_dict",
            expected=[],
            words="healthy: no error, no warning; kv_a_proj_with_mqa [80, 128] has a [1, 1] "
            "scale and q_b_proj [48, 192] a [1, 2] one (partial edge tiles, as DeepSeek-V3's "
            "kv_a_proj_with_mqa [576, 7168] has [5, 56]); e_score_correction_bias is a buffer",
            extra=common | {"read_back": f"{tf} (dequantizes on the CPU): clean"},
        )

        dest = _common.case_dir("fp8-block", "scale-inv-transposed")
        state = _write_deepseek(bf16, dest)
        bad = [
            "model.layers.0.self_attn.q_a_proj.weight_scale_inv",
            "model.layers.0.self_attn.q_b_proj.weight_scale_inv",
        ]
        _replace(dest, {n: state[n].t().contiguous() for n in bad})
        _record(
            "fp8-block",
            "scale-inv-transposed",
            fmt="fp8-block",
            package="transformers",
            description="DeepSeek-V3 block-FP8 layout with two weight_scale_inv transposed",
            damage="q_a_proj.weight_scale_inv of layer 0 written [1, 2] for a [192, 128] "
            "weight (needs [2, 1]) and q_b_proj's [2, 1] for [48, 192] (needs [1, 2])",
            expected=["load-shape-mismatch", "quant-scheme-mismatch"],
            words="two modules whose weight_scale_inv is not [ceil(out/128), ceil(in/128)] "
            "(quant-scheme-mismatch, one per module); today's load view already reports the "
            "scale shapes the model would create (load-shape-mismatch)",
            extra=common | {"damaged": bad},
        )

        dest = _common.case_dir("fp8-block", "expert-scale-missing")
        _write_deepseek(bf16, dest)
        lost = "model.layers.1.mlp.experts.3.gate_proj.weight_scale_inv"
        _drop(dest, [lost])
        _record(
            "fp8-block",
            "expert-scale-missing",
            fmt="fp8-block",
            package="transformers",
            description="DeepSeek-V3 block-FP8 layout, one expert's weight_scale_inv lost",
            damage=f"{lost} removed from its shard and the index",
            expected=["expert-incomplete", "load-missing-tensor", "quant-scheme-mismatch"],
            words="expert 3 of layer 1 has one tensor fewer than its siblings "
            "(expert-incomplete), its gate_proj is F8_E4M3 without a scale "
            "(quant-scheme-mismatch), and the model's scale parameter has no data "
            "(load-missing-tensor, reported today)",
            extra=common | {"lost": lost},
        )

        dest = _common.case_dir("fp8-block", "transformers-fp8-save")
        _fp8_quantizer_save(bf16, dest)
        _record(
            "fp8-block",
            "transformers-fp8-save",
            fmt="fp8-block",
            package="transformers",
            description=f"FineGrainedFP8Config(weight_block_size=[128, 128]) quantize-on-load "
            f"of the bfloat16 DeepSeek-V3, then save_pretrained, {tf} (GPU check shimmed)",
            damage="written by transformers itself: projections whose sides are not multiples "
            "of 128 stay bfloat16 but get an uninitialised weight_scale_inv; routed experts are "
            "saved per expert (experts.E.gate_proj.weight, F8_E4M3) with their scales fused "
            "under experts.gate_up_proj_scale_inv [E, 2I/128, H/128] and "
            "experts.down_proj_scale_inv",
            expected=["quant-scheme-mismatch", "load-unexpected-tensor"],
            words="the bfloat16 q_a/q_b/kv_a/kv_b/o projections carry a weight_scale_inv, and "
            "every routed expert projection is F8_E4M3 without one (quant-scheme-mismatch); "
            "the fused experts.*_scale_inv tensors match no module (load-unexpected-tensor)",
            extra={
                "parameters": params,
                "quantization_config": json.loads((dest / CONFIG_NAME).read_text())[
                    "quantization_config"
                ],
            },
        )


def main() -> None:
    mxfp4_cases()
    fp8_cases()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
