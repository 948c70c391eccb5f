"""Write Model-Optimizer exports with the REAL nvidia-modelopt 0.47: `export_hf_checkpoint` of a
quantized transformers MoE, and `export_mcore_gpt_to_hf` (one shard + sidecar per decoder
layer) of a megatron-core 0.16.1 GPT MoE with an MTP layer, from gloo ranks on 127.0.0.1.

Cases (tests/fixtures/writers/modelopt/<case>/):

- `hf-fp8`, `hf-nvfp4`: a tiny Qwen3-MoE (bf16, hidden 32, 2 layers, 4 experts) quantized with
  `mtq.quantize(FP8_DEFAULT_CFG | NVFP4_DEFAULT_CFG)` and calibrated on 4 random batches on the
  CPU, exported with `export_hf_checkpoint(max_shard_size="16KB")` so it is sharded with an
  index (transformers `save_pretrained` underneath: the index carries `total_parameters`).
- `mcore-ep1`: `export_mcore_gpt_to_hf` of a megatron GPT (2 MoE layers, 4 SequentialMLP experts,
  1 MTP layer, local spec) to Qwen3MoeForCausalLM, one rank. Sidecars are named
  `model-0000L-of-0000N.json` (the exporter formats `model-{:05d}-of-{:05d}` and appends
  `.safetensors` and `.json`). MTP tensors go into the last layer's shard as `mtp.layers.*`.
- `mcore-ep2`: the same at expert parallel size 2 (2 ranks, TP 1). 0.47 as released: its
  SequentialMLP path (`enumerate(layer.mlp.experts.local_experts)`) still names experts by
  LOCAL id (only its TEGroupedMLP path maps to global ids and gathers across EP; TEGroupedMLP
  needs TransformerEngine, i.e. CUDA), so both EP ranks write experts 0 and 1 of every layer
  into the same files and experts 2 and 3 are lost. The exporter's own self-check then raises
  (recorded as `writer_error`); the files stay on disk.
- `modelopt-1631-ep2-truncated-config`: the same EP=2 export (the seed's lost experts) plus the
  seed's `config.json` race. 0.47 has the fix (one writer, between barriers); the pre-fix step
  is restored by patching `GPTModelExporter._is_sidecar_writer_rank` so every last-stage main
  rank writes config.json (`PretrainedConfig.to_json_file`), and rank 1's write lands last and
  is cut off half way (what a reader saw mid-write: a deterministic stand-in for the
  interleaving, which cannot be timed).
- `modelopt-1422-sidecar-drift`: `mcore-ep1` with the pre-fix order of the seed: each layer's
  sidecar is written from its dict first, and the MTP tensors are added to the last layer's dict
  after its sidecar was written and before its shard (the fixed code freezes one snapshot for
  both). Patched: `save_safetensors_by_layer_index` is wrapped to receive the MTP tensors late,
  `_get_mtp_state_dict` returns them to the wrapper instead of the dict. Rank 0 merges the
  sidecars into the index, so the index misses them too.

Shims (all no-ops for the bytes written):
- `megatron.core.models.hybrid.hybrid_model` is imported by modelopt 0.47 but absent from
  megatron-core 0.16.1: a stand-in module with an empty `HybridModel` class (used only in
  `isinstance` checks; our model is a GPTModel).
- modelopt 0.47 reads an MTP layer's inner layer as `mtp_model_layer`; megatron-core 0.16.1
  calls it `transformer_layer`: an alias property.
- `_common.cpu_cuda_shims` (see write_megatron.py).
Shown not to change the bytes: the stand-in module and the alias only let modelopt import and
find the MTP layer; every tensor of `mcore-ep1` exported 1:1 by a name rule (embedding, head,
norms, routers, attention output and expert down projections) is compared with the megatron
parameter it came from (`exported_equal_model` in the manifest). No CUDA call is reached.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import types
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common

# The file-name table, from the project's source tree (the writers' environments do not
# install the project; importing it takes the standard library alone).
sys.path.insert(1, str(_common.REPO))

from inspector._internal.common.filenames import CONFIG_NAME

WRITER = "modelopt"
PACKAGE = "nvidia-modelopt"
SCRIPT = "write_modelopt.py"
HIDDEN = 16
LAYERS = 2
EXPERTS = 4


def install_shims() -> None:
    """The two megatron-core 0.16.1 / modelopt 0.47 gaps (see the module docstring)."""
    if "megatron.core.models.hybrid.hybrid_model" not in sys.modules:
        pkg = types.ModuleType("megatron.core.models.hybrid")
        mod = types.ModuleType("megatron.core.models.hybrid.hybrid_model")

        class HybridModel:  # stand-in: never instantiated
            pass

        mod.HybridModel = HybridModel  # type: ignore[attr-defined]
        pkg.hybrid_model = mod  # type: ignore[attr-defined]
        sys.modules["megatron.core.models.hybrid"] = pkg
        sys.modules["megatron.core.models.hybrid.hybrid_model"] = mod
    from megatron.core.transformer.multi_token_prediction import MultiTokenPredictionLayer

    if not hasattr(MultiTokenPredictionLayer, "mtp_model_layer"):
        MultiTokenPredictionLayer.mtp_model_layer = property(lambda self: self.transformer_layer)


# ---------------------------------------------------------------- export_hf_checkpoint


def _hf_qwen3_moe(hidden: int, layers: int, dense_first: bool) -> Any:
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    config = Qwen3MoeConfig(
        vocab_size=64,
        hidden_size=hidden,
        head_dim=hidden // 2,
        intermediate_size=2 * hidden,
        moe_intermediate_size=hidden if hidden == 32 else 8,
        num_hidden_layers=layers,
        num_attention_heads=2,
        num_key_value_heads=1 if dense_first else 2,
        num_experts=EXPERTS,
        num_experts_per_tok=2,
        mlp_only_layers=[0] if dense_first else [],
        tie_word_embeddings=False,
        architectures=["Qwen3MoeForCausalLM"],
    )
    return Qwen3MoeForCausalLM(config)


def write_hf(case: str, fmt: str) -> None:
    import modelopt.torch.quantization as mtq
    import torch
    from modelopt.torch.export import export_hf_checkpoint

    torch.manual_seed(0)
    model = _hf_qwen3_moe(32, 2, dense_first=True).to(torch.bfloat16)
    qcfg = {"fp8": mtq.FP8_DEFAULT_CFG, "nvfp4": mtq.NVFP4_DEFAULT_CFG}[fmt]

    def calibrate(m: Any) -> None:
        gen = torch.Generator().manual_seed(1)
        for _ in range(4):
            m(torch.randint(0, 64, (2, 16), generator=gen))

    mtq.quantize(model, qcfg, calibrate)
    dest = _common.case_dir(WRITER, case)
    export_hf_checkpoint(model, export_dir=dest, max_shard_size="16KB")
    params = {n: p.numel() for n, p in model.named_parameters()}
    _common.record(
        WRITER,
        case,
        package=PACKAGE,
        script=SCRIPT,
        description=f"export_hf_checkpoint of a {fmt.upper()}-quantized Qwen3-MoE, sharded",
        healthy=True,
        extra={
            "model_parameters_after_export": sum(params.values()),
            "quant_format": fmt.upper(),
        },
    )


# ---------------------------------------------------------------- export_mcore_gpt_to_hf


def _mcore_model(ep: int) -> Any:
    import torch
    import torch.nn.functional as F
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import (
        get_gpt_layer_local_spec,
        get_gpt_mtp_block_spec,
    )
    from megatron.core.transformer.transformer_config import TransformerConfig

    config = TransformerConfig(
        num_layers=LAYERS,
        hidden_size=HIDDEN,
        ffn_hidden_size=32,
        num_attention_heads=2,
        num_query_groups=2,
        kv_channels=8,
        expert_model_parallel_size=ep,
        num_moe_experts=EXPERTS,
        moe_router_topk=2,
        moe_ffn_hidden_size=8,
        moe_grouped_gemm=False,
        moe_token_dispatcher_type="allgather",
        mtp_num_layers=1,
        normalization="RMSNorm",
        qk_layernorm=True,
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        params_dtype=torch.bfloat16,
        bf16=True,
        use_cpu_initialization=True,
        gradient_accumulation_fusion=False,
        bias_dropout_fusion=False,
        masked_softmax_fusion=False,
        apply_rope_fusion=False,
        persist_layer_norm=False,
    )
    spec = get_gpt_layer_local_spec(
        num_experts=EXPERTS, moe_grouped_gemm=False, qk_layernorm=True, normalization="RMSNorm"
    )
    torch.manual_seed(1234)
    return GPTModel(
        config=config,
        transformer_layer_spec=spec,
        vocab_size=64,
        max_sequence_length=32,
        position_embedding_type="rope",
        share_embeddings_and_output_weights=False,
        mtp_block_spec=get_gpt_mtp_block_spec(config, spec, use_transformer_engine=False),
    )


def write_reference(folder: Path) -> None:
    """The HF model the export targets (config, generation config, weights for the
    exporter's self-check): Qwen3-MoE with the megatron model's shapes."""
    import torch

    torch.manual_seed(0)
    _hf_qwen3_moe(HIDDEN, LAYERS, dense_first=False).save_pretrained(folder)


def _mcore_rank(rank: int, world: int, case: str, reference: str, dest: str) -> None:
    import torch
    from megatron.core import parallel_state as ps

    install_shims()
    from modelopt.torch.export import export_mcore_gpt_to_hf
    from modelopt.torch.export import unified_export_megatron as uem
    from modelopt.torch.export.plugins import mcore_custom

    ps.initialize_model_parallel(expert_model_parallel_size=world)
    model = _mcore_model(world)
    late: dict[str, Any] = {}
    if case == "modelopt-1422-sidecar-drift":
        original_save = mcore_custom.save_safetensors_by_layer_index
        original_mtp = uem.GPTModelExporter._get_mtp_state_dict

        def mtp_later(self: Any) -> dict:
            late.update(original_mtp(self))
            return {}

        def save_then_mutate(
            layer_state_dicts: dict, total_layers: int, save_directory: str, name_template: str
        ) -> None:
            # Pre-fix order: sidecar from the dict, then the dict mutated, then the shard.
            from safetensors.torch import save_file

            for layer, sd in layer_state_dicts.items():
                name = name_template.format(layer, total_layers)
                weight_map = dict.fromkeys(sd, name + ".safetensors")
                size = sum(v.numel() * v.element_size() for v in sd.values())
                with open(f"{save_directory}/{name}.json", "w") as f:
                    json.dump(
                        {"metadata": {"total_size": size}, "weight_map": weight_map}, f, indent=4
                    )
                if layer == total_layers:
                    sd.update(late)
                save_file(
                    dict(sd), f"{save_directory}/{name}.safetensors", metadata={"format": "pt"}
                )
            # The rest (barrier, rank 0 merges the sidecars) is the real function's: call it
            # on an empty dict so it writes no shard and only merges.
            original_save({}, total_layers, save_directory, name_template)

        uem.GPTModelExporter._get_mtp_state_dict = mtp_later
        uem.save_safetensors_by_layer_index = save_then_mutate
    if case == "modelopt-1631-ep2-truncated-config":
        uem.GPTModelExporter._is_sidecar_writer_rank = staticmethod(lambda last: last)
        _interleave_config_writes(rank, dest)
    error = None
    with _common.cpu_cuda_shims():
        try:
            export_mcore_gpt_to_hf(model, reference, dtype=torch.bfloat16, export_dir=dest)
        except RuntimeError as exc:  # the exporter's self-check; paths made run-independent
            error = str(exc).replace(reference, "<reference>").replace(dest, "<export_dir>")
    torch.distributed.barrier()
    if rank == 0:
        info = {"writer_error": error}
        if case == "mcore-ep1":
            info["exported_equal_model"] = _compare_with_model(model, Path(dest))
        Path(dest, ".writer-info.json").write_text(json.dumps(info))
    ps.destroy_model_parallel()


def _interleave_config_writes(rank: int, dest: str) -> None:
    """Both ranks write config.json (`PretrainedConfig.to_json_file`); rank 0's write is
    complete first (it leaves a marker beside the export folder), then rank 1's lands and is
    cut off half way (see module docstring)."""
    import time

    from transformers import PretrainedConfig

    real = PretrainedConfig.to_json_file
    target = (Path(dest) / CONFIG_NAME).resolve()
    marker = Path(dest).parent / f".{Path(dest).name}-config-written"

    def interleaved(self: Any, json_file_path: Any, use_diff: bool = True) -> None:
        if Path(json_file_path).resolve() != target:
            return real(self, json_file_path, use_diff)
        if rank == 0:
            real(self, json_file_path, use_diff)
            marker.touch()
            return None
        deadline = time.monotonic() + 60
        while not marker.exists():
            if time.monotonic() > deadline:
                raise TimeoutError("the writer rank never wrote config.json")
            time.sleep(0.05)
        marker.unlink()
        text = self.to_json_string(use_diff=use_diff)
        target.write_text(text[: len(text) // 2])
        return None

    PretrainedConfig.to_json_file = interleaved  # type: ignore[method-assign]


def _compare_with_model(model: Any, dest: Path) -> bool:
    """Every exported tensor equals a parameter of the megatron model (same values; the
    fused qkv / fc1 are split by the exporter, so compare by content hashes of all slices is
    out of scope: compare the tensors exported 1:1 by name rules: norms, embeddings, router,
    down projections)."""
    import torch
    from safetensors.torch import load_file

    exported: dict[str, torch.Tensor] = {}
    for path in dest.glob("*.safetensors"):
        exported.update(load_file(str(path)))
    params = dict(model.named_parameters())
    pairs = {
        "model.embed_tokens.weight": "embedding.word_embeddings.weight",
        "lm_head.weight": "output_layer.weight",
        "model.norm.weight": "decoder.final_layernorm.weight",
    }
    for layer in range(LAYERS):
        pairs[f"model.layers.{layer}.mlp.gate.weight"] = f"decoder.layers.{layer}.mlp.router.weight"
        pairs[f"model.layers.{layer}.self_attn.o_proj.weight"] = (
            f"decoder.layers.{layer}.self_attention.linear_proj.weight"
        )
        for e in range(EXPERTS):
            pairs[f"model.layers.{layer}.mlp.experts.{e}.down_proj.weight"] = (
                f"decoder.layers.{layer}.mlp.experts.local_experts.{e}.linear_fc2.weight"
            )
    return all(
        torch.equal(exported[h].to(params[m].dtype), params[m].detach()) for h, m in pairs.items()
    )


MCORE_CASES: dict[str, tuple[int, bool, str | None, str | None, str]] = {
    "mcore-ep1": (1, True, None, None, "export_mcore_gpt_to_hf per layer, EP 1"),
    "mcore-ep2": (
        2,
        False,
        None,
        "0.47 SequentialMLP path names experts by local id at EP>1: experts 2-3 of every "
        "layer lost (the exporter's self-check raises after writing)",
        "export_mcore_gpt_to_hf per layer, EP 2 (2 gloo ranks)",
    ),
    "modelopt-1631-ep2-truncated-config": (
        2,
        False,
        "modelopt-1631",
        "EP 2 local expert ids (experts 2-3 lost) and config.json cut half way by a second "
        "writer (pre-fix single-writer gating)",
        "EP 2 export with lost experts and a truncated config.json",
    ),
    "modelopt-1422-sidecar-drift": (
        1,
        False,
        "modelopt-1422",
        "MTP tensors added to the last layer's dict after its sidecar was written: in the "
        "shard, not in the sidecar nor the merged index",
        "per-layer export whose last sidecar misses the MTP tensors",
    ),
}


def write_mcore(case: str, reference: Path) -> None:
    ep, healthy, seed, damage, description = MCORE_CASES[case]
    dest = _common.case_dir(WRITER, case)
    _common.spawn(_mcore_rank, ep, case, str(reference), str(dest))
    info_path = dest / ".writer-info.json"
    info = json.loads(info_path.read_text())
    info_path.unlink()
    _common.record(
        WRITER,
        case,
        package=PACKAGE,
        script=SCRIPT,
        description=description,
        healthy=healthy,
        seed=seed,
        damage=damage,
        extra={
            "megatron_core": _common.version("megatron-core"),
            "world_size": ep,
            "parallelism": {"tp": 1, "ep": ep, "pp": 1},
            "target_architecture": "Qwen3MoeForCausalLM",
            **info,
        },
    )


def main() -> None:
    only = sys.argv[1:] or ["hf-fp8", "hf-nvfp4", *MCORE_CASES]
    for case in only:
        if case.startswith("hf-"):
            write_hf(case, case.removeprefix("hf-"))
    mcore = [c for c in only if c in MCORE_CASES]
    if mcore:
        with tempfile.TemporaryDirectory() as tmp:
            reference = Path(tmp) / "Qwen3-MoE-tiny"
            write_reference(reference)
            for case in mcore:
                write_mcore(case, reference)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
