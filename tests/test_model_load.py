"""The model-aware load check against transformers itself.

Each family we name is built tiny, saved by transformers' own `save_pretrained`, then damaged
the way real exports go wrong (a tensor removed with index and shards kept consistent, a stray
tensor added, `embed_tokens` resized, `lm_head` dropped, experts dropped). Our verdict, read
from the headers alone, must equal what `from_pretrained(folder)` reports when it actually
loads the folder, key for key in the model's key space. The report is taken where transformers
builds it (`log_state_dict_report`, which would raise on mismatches and conversion errors).
"""

from __future__ import annotations

import json
import math
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from hf_exports import modelopt_export, resaved, with_deepseek_mtp
from modelopt_writer import INDEX, load_json, save_json
from test_transformers_families import FAMILIES as MOE_FAMILIES

from inspector._internal.checkpoint.scanned import ScannedCheckpoint
from inspector._internal.checks import check
from inspector._internal.cli.main import main
from inspector._internal.common.filenames import CONFIG_NAME
from inspector._internal.load.verdict import LoadVerdict, clear_model_cache, load_verdict
from inspector._internal.scan.entry import scan

transformers = pytest.importorskip("transformers")
T = transformers
ATTN = {"num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 64}
LOAD_CODES = {"load-missing-tensor", "load-unexpected-tensor", "load-shape-mismatch"}


@dataclass(frozen=True)
class Family:
    name: str
    config: object
    model_class: str


FAMILIES = [Family(f.name, f.config, f.model_class) for f in MOE_FAMILIES] + [
    Family(
        "llama",
        T.LlamaConfig(**ATTN, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                      tie_word_embeddings=False),
        "LlamaForCausalLM",
    ),
    Family(
        "llama-tied",
        T.LlamaConfig(**ATTN, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                      tie_word_embeddings=True),
        "LlamaForCausalLM",
    ),
    Family(
        "qwen3",
        T.Qwen3Config(**ATTN, hidden_size=16, head_dim=8, intermediate_size=32,
                      num_hidden_layers=2, tie_word_embeddings=False),
        "Qwen3ForCausalLM",
    ),
    Family(
        "qwen2-moe",
        T.Qwen2MoeConfig(**ATTN, hidden_size=16, intermediate_size=32, moe_intermediate_size=8,
                         shared_expert_intermediate_size=8, num_hidden_layers=2, num_experts=4,
                         num_experts_per_tok=2),
        "Qwen2MoeForCausalLM",
    ),
    Family(
        "deepseek-v2",
        T.DeepseekV2Config(vocab_size=64, hidden_size=32, intermediate_size=32,
                           moe_intermediate_size=8, num_hidden_layers=3, num_attention_heads=2,
                           num_key_value_heads=2, n_routed_experts=4, n_shared_experts=1,
                           num_experts_per_tok=2, first_k_dense_replace=1, kv_lora_rank=8,
                           q_lora_rank=8, qk_rope_head_dim=4, qk_nope_head_dim=4, v_head_dim=4),
        "DeepseekV2ForCausalLM",
    ),
    Family(
        "glm4-moe",
        T.Glm4MoeConfig(vocab_size=64, hidden_size=32, intermediate_size=32,
                        moe_intermediate_size=8, num_hidden_layers=3, num_attention_heads=2,
                        num_key_value_heads=1, head_dim=16, n_routed_experts=4,
                        n_shared_experts=1, num_experts_per_tok=2, first_k_dense_replace=1,
                        num_nextn_predict_layers=1),
        "Glm4MoeForCausalLM",
    ),
    Family(
        "qwen3-next",
        T.Qwen3NextConfig(vocab_size=64, hidden_size=32, intermediate_size=32,
                          moe_intermediate_size=8, shared_expert_intermediate_size=8,
                          num_hidden_layers=4, num_attention_heads=2, num_key_value_heads=1,
                          head_dim=16, num_experts=4, num_experts_per_tok=2,
                          linear_num_value_heads=2, linear_num_key_heads=1,
                          linear_key_head_dim=8, linear_value_head_dim=8,
                          linear_conv_kernel_dim=2, full_attention_interval=2),
        "Qwen3NextForCausalLM",
    ),
]  # fmt: skip
BY_NAME = {f.name: f for f in FAMILIES}


# -- writing and damaging real save_pretrained output ------------------------------------------


@dataclass(frozen=True)
class Saved:
    family: Family
    folder: Path
    parameters: int  # the saved model's num_parameters()


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Saved]:
    """Factory: each family saved once per module (two or more shards, with an index)."""
    cache: dict[str, Saved] = {}

    def get(name: str) -> Saved:
        if name not in cache:
            family = BY_NAME[name]
            torch.manual_seed(0)
            model = getattr(T, family.model_class)(family.config)
            folder = tmp_path_factory.mktemp(name)
            model.save_pretrained(folder, max_shard_size="20KB")
            cache[name] = Saved(family, folder, model.num_parameters())
        return cache[name]

    return get


@dataclass(frozen=True)
class Report:
    missing: set[str]
    unexpected: set[str]
    mismatched: set[tuple[str, tuple[int, ...], tuple[int, ...]]]
    conversion_errors: set[str]


def transformers_report(folder: Path, monkeypatch: pytest.MonkeyPatch) -> Report:
    """What `AutoModelForCausalLM.from_pretrained(folder)` reports, taken where it is built
    (the report function raises on mismatched shapes and conversion errors)."""
    seen = {}

    def capture(**kwargs: object) -> None:
        seen["info"] = kwargs["loading_info"]

    with monkeypatch.context() as m:
        m.setattr(T.modeling_utils, "log_state_dict_report", capture)
        T.AutoModelForCausalLM.from_pretrained(folder)
    info = seen["info"]
    return Report(
        set(info.missing_keys),
        set(info.unexpected_keys),
        {(k, tuple(a), tuple(b)) for k, a, b in info.mismatched_keys},
        set(info.conversion_errors),
    )


def ours(verdict: LoadVerdict) -> tuple[set, set, set]:
    assert verdict.skipped is None, verdict.skipped
    mismatched = {(m.key, m.stored, m.expected) for m in verdict.mismatched}
    return set(verdict.missing), set(verdict.unexpected), mismatched


def load_findings(source: Path | ScannedCheckpoint) -> list:
    """The load findings `check` gives for a folder, or for the scan a test made of it (its
    tables and counts are then built once, not again for a second scan of the same files)."""
    scanned = source if isinstance(source, ScannedCheckpoint) else scan(source)
    return [f for f in check(scanned) if f.code in LOAD_CODES]


# -- damages --------------------------------------------------------------------------------


def _layer1_tensor(state: dict[str, torch.Tensor]) -> str:
    """A layer-1 tensor that is not part of the experts (attention or mixer)."""
    return next(k for k in sorted(state) if ".layers.1." in k and "experts" not in k)


def _embedding(state: dict[str, torch.Tensor]) -> str:
    return next(k for k in sorted(state) if "embed" in k)


def _expert_tensors(state: dict[str, torch.Tensor]) -> list[str]:
    """Per-expert tensors of expert 1 in the first MoE layer, or [] when experts are fused."""
    names = sorted(k for k in state if ".experts.1." in k)
    if not names:
        return []
    layer = names[0].split(".experts.")[0]
    return [k for k in names if k.startswith(f"{layer}.experts.1.")]


def _fused_experts(state: dict[str, torch.Tensor]) -> list[str]:
    """Fused expert tensors ([experts, ...]) of the first MoE layer."""
    fused = sorted(k for k in state if ".experts." in k and ".experts.0." not in k
                   and not any(f".experts.{i}." in k for i in range(1, 10)))  # fmt: skip
    if not fused:
        return []
    layer = fused[0].split(".experts.")[0]
    return [k for k in fused if k.startswith(f"{layer}.experts.")]


def remove_tensor(state: dict) -> dict:
    return {k: v for k, v in state.items() if k != _layer1_tensor(state)}


def add_tensor(state: dict) -> dict:
    return {**state, "model.layers.0.self_attn.extra_proj.weight": torch.zeros(4, 4)}


def resize_embedding(state: dict) -> dict:
    name = _embedding(state)
    rows, cols = state[name].shape
    return {**state, name: torch.zeros(rows + 8, cols, dtype=state[name].dtype)}


def remove_lm_head(state: dict) -> dict:
    return {k: v for k, v in state.items() if not k.startswith("lm_head.")}


def drop_expert(state: dict) -> dict:
    per_expert = set(_expert_tensors(state))
    if per_expert:
        return {k: v for k, v in state.items() if k not in per_expert}
    fused = set(_fused_experts(state))
    return {k: (v[:-1].clone() if k in fused else v) for k, v in state.items()}


def drop_one_expert_tensor(state: dict) -> dict:
    last = _expert_tensors(state)[-1]
    return {k: v for k, v in state.items() if k != last}


DAMAGES = {
    "remove-tensor": remove_tensor,
    "add-tensor": add_tensor,
    "resize-embedding": resize_embedding,
    "remove-lm-head": remove_lm_head,
    "drop-expert": drop_expert,
    "drop-one-expert-tensor": drop_one_expert_tensor,
}


def _cases() -> list[tuple[str, str]]:
    fused = {"gpt-oss", "llama4"}
    dense = {"llama", "llama-tied", "qwen3"}
    cases = []
    for family in FAMILIES:
        for damage in DAMAGES:
            if damage.startswith("drop") and family.name in dense:
                continue
            if damage == "drop-one-expert-tensor" and family.name in fused:
                continue
            cases.append((family.name, damage))
    return cases


# -- healthy save_pretrained output -------------------------------------------------------------


@pytest.mark.parametrize("name", [f.name for f in FAMILIES])
def test_healthy_save_pretrained_output_loads_clean(
    name: str, saved: Callable[[str], Saved], monkeypatch: pytest.MonkeyPatch
) -> None:
    s = saved(name)
    scanned = scan(s.folder)
    verdict = load_verdict(scanned)
    assert ours(verdict) == (set(), set(), set())
    assert verdict.loads is True and verdict.architecture == s.family.model_class
    assert verdict.mtp_skipped == () and verdict.quantization_expected == ()
    theirs = transformers_report(s.folder, monkeypatch)
    assert (theirs.missing, theirs.unexpected, theirs.mismatched) == (set(), set(), set())
    # The exact parameter count is what save_pretrained wrote (buffers are not parameters).
    assert verdict.parameters == s.parameters
    assert load_json(s.folder / INDEX)["metadata"]["total_parameters"] == s.parameters
    codes = {f.code for f in check(scanned)}
    assert not codes & LOAD_CODES
    assert "total-parameters-mismatch" not in codes


def test_mtp_the_class_never_builds_is_known_from_the_model(
    saved: Callable[[str], Saved], tmp_path: Path
) -> None:
    """A config outside the MTP_NOT_STORED table that declares an MTP layer: without the
    model that is mtp-missing; the model built from config.json has no MTP module, so
    save_pretrained never stores one (mtp-not-stored)."""
    folder = tmp_path / "ckpt"
    shutil.copytree(saved("qwen3-moe").folder, folder)
    config = load_json(folder / CONFIG_NAME)
    assert config["model_type"] == "qwen3_moe"
    save_json(folder / CONFIG_NAME, {**config, "num_nextn_predict_layers": 1})
    scanned = scan(folder)
    assert "mtp-missing" in {f.code for f in check(scanned, model=False)}
    (f,) = [f for f in check(scanned) if f.code.startswith("mtp-")]
    assert f.code == "mtp-not-stored" and "Qwen3MoeForCausalLM built from config.json" in f.message


def test_persistent_buffers_no_longer_read_as_a_parameter_mismatch(
    saved: Callable[[str], Saved],
) -> None:
    """DeepSeek-V3 saves its router's score-correction bias, a buffer: the shards hold more
    elements than the model has parameters, and save_pretrained counts parameters. The
    model says so exactly; without it, the naming rules know the buffer by name (issue 8)."""
    s = saved("deepseek-v3")
    scanned = scan(s.folder)
    t = scanned.tensors
    buffers = int(t.loc[t["param"] == "e_score_correction_bias", "numel"].sum())
    assert buffers > 0 and int(t["numel"].sum()) == s.parameters + buffers
    assert "total-parameters-mismatch" not in {f.code for f in check(scanned, model=False)}
    assert "total-parameters-mismatch" not in {f.code for f in check(scanned)}


def test_a_wrong_total_parameters_names_the_model_count(
    saved: Callable[[str], Saved], tmp_path: Path
) -> None:
    s = saved("llama")
    folder = tmp_path / "ckpt"
    shutil.copytree(s.folder, folder)
    index = load_json(folder / INDEX)
    index["metadata"]["total_parameters"] = s.parameters + 5
    save_json(folder / INDEX, index)
    (f,) = [f for f in check(scan(folder)) if f.code == "total-parameters-mismatch"]
    assert f"the model built from config.json has {s.parameters:,} parameters" in f.message


# -- damaged: our verdict is transformers' report, key for key -------------------------------------


@pytest.mark.parametrize(("name", "damage"), _cases())
def test_damage_is_reported_as_transformers_reports_it(
    name: str,
    damage: str,
    saved: Callable[[str], Saved],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    folder = resaved(saved(name).folder, tmp_path / "ckpt", DAMAGES[damage])
    scanned = scan(folder)
    verdict = load_verdict(scanned)
    theirs = transformers_report(folder, monkeypatch)
    missing, unexpected, mismatched = ours(verdict)
    assert missing == theirs.missing
    assert unexpected == theirs.unexpected
    assert mismatched == theirs.mismatched
    # What transformers cannot convert stays missing, and we say why.
    for key in theirs.conversion_errors:
        assert key in missing and "conversion error" in verdict.reasons[key]
    # Something is reported for every damage, except a tied head (the embedding stands in).
    findings = load_findings(scanned)
    if name == "llama-tied" and damage == "remove-lm-head":
        assert findings == [] and verdict.loads
        return
    assert findings
    counts = {c: sum(f.code == c for f in findings) for c in LOAD_CODES}
    assert counts == {
        "load-missing-tensor": len(missing),
        "load-unexpected-tensor": len(unexpected),
        "load-shape-mismatch": len(mismatched),
    }


def test_dropped_experts_are_named_in_the_mismatch(
    saved: Callable[[str], Saved], tmp_path: Path
) -> None:
    folder = resaved(saved("qwen3-moe").folder, tmp_path / "ckpt", drop_expert)
    findings = load_findings(folder)
    assert {f.code for f in findings} == {"load-shape-mismatch"}
    for f in findings:
        assert f.layer == 1 and "experts 0, 2-3; expert 1 missing" in f.message
        assert f.file is not None and f.file.endswith(".safetensors")


def test_missing_fused_key_says_how_the_checkpoint_spells_it(
    saved: Callable[[str], Saved], tmp_path: Path
) -> None:
    folder = resaved(saved("mixtral").folder, tmp_path / "ckpt", drop_one_expert_tensor)
    verdict = load_verdict(scan(folder))
    (key,) = verdict.missing
    assert ".experts.*." in verdict.stored_as[key]


# -- MTP layers: named as such, not as load findings ---------------------------------------------


@pytest.mark.parametrize("name", ["deepseek-v3", "glm4-moe"])
def test_deepseek_style_mtp_layer_is_named_not_reported(
    name: str, saved: Callable[[str], Saved], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    layers = BY_NAME[name].config.num_hidden_layers
    folder = resaved(saved(name).folder, tmp_path / "ckpt", lambda s: with_deepseek_mtp(s, layers))
    scanned = scan(folder)
    verdict = load_verdict(scanned)
    stored_mtp = {n for n in scanned.tensors["name"] if n.startswith(f"model.layers.{layers}.")}
    assert set(verdict.mtp_skipped) == stored_mtp and len(stored_mtp) > 10
    assert ours(verdict) == (set(), set(), set())
    # transformers drops them too; with these small configs its ignore list (written for the
    # full-size layer number) does not match, so it calls them unexpected.
    theirs = transformers_report(folder, monkeypatch)
    assert theirs.unexpected and all(
        k.startswith(f"model.layers.{layers}.") for k in theirs.unexpected
    )
    assert (theirs.missing, theirs.mismatched) == (set(), set())
    codes = {f.code for f in check(scanned)}
    assert not codes & LOAD_CODES and "mtp-missing" not in codes


def test_qwen3_next_mtp_block_is_named_not_reported(
    saved: Callable[[str], Saved], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = BY_NAME["qwen3-next"].config.hidden_size
    mtp = {
        "mtp.fc.weight": torch.zeros(h, 2 * h),
        "mtp.pre_fc_norm_embedding.weight": torch.ones(h),
        "mtp.pre_fc_norm_hidden.weight": torch.ones(h),
        "mtp.norm.weight": torch.ones(h),
        "mtp.layers.0.input_layernorm.weight": torch.ones(h),
    }
    folder = resaved(saved("qwen3-next").folder, tmp_path / "ckpt", lambda s: {**s, **mtp})
    scanned = scan(folder)
    verdict = load_verdict(scanned)
    assert set(verdict.mtp_skipped) == set(mtp)
    assert ours(verdict) == (set(), set(), set())
    theirs = transformers_report(folder, monkeypatch)  # its ignore list drops `mtp.*`
    assert (theirs.missing, theirs.unexpected, theirs.mismatched) == (set(), set(), set())
    assert not load_findings(scanned)


# -- quantized checkpoints: compared through their quantization config ----------------------------


@pytest.fixture(scope="module")
def demos(tmp_path_factory: pytest.TempPathFactory, copy_demos) -> Path:
    out = tmp_path_factory.mktemp("demos")
    copy_demos(out)
    return out


def test_modelopt_nvfp4_export_scales_and_packed_weights_are_expected(demos: Path) -> None:
    scanned = scan(demos / "healthy-hf-sharded")
    verdict = load_verdict(scanned)
    assert ours(verdict) == (set(), set(), set())
    assert verdict.quantization.startswith("Model-Optimizer MIXED_PRECISION")
    names = set(scanned.tensors["name"])
    scales = {n for n in names if n.endswith(("weight_scale", "weight_scale_2", "input_scale"))}
    packed = {n for n in names if n.endswith(".weight") and ".experts." in n and
              scanned.tensors.set_index("name").loc[n, "dtype"] == "U8"}  # fmt: skip
    assert scales and packed and scales | packed <= set(verdict.quantization_expected)
    assert verdict.mtp_skipped  # the demo's DeepSeek-style MTP layer
    assert not {f.code for f in check(scanned)} & LOAD_CODES


def test_modelopt_missing_weight_scale_is_reported(demos: Path, tmp_path: Path) -> None:
    scale = "model.layers.2.mlp.experts.3.up_proj.weight_scale"
    folder = resaved(demos / "healthy-hf-sharded", tmp_path / "ckpt",
                     lambda s: {k: v for k, v in s.items() if k != scale})  # fmt: skip
    scanned = scan(folder)
    verdict = load_verdict(scanned)
    assert verdict.missing == (scale,) and "NVFP4" in verdict.reasons[scale]
    (f,) = load_findings(scanned)
    assert f.code == "load-missing-tensor" and f.tensor == scale and f.layer == 2 and f.expert == 3


def test_modelopt_mis_shaped_weight_scale_is_reported(demos: Path, tmp_path: Path) -> None:
    scale = "model.layers.1.mlp.experts.0.down_proj.weight_scale"

    def edit(state: dict) -> dict:
        rows, cols = state[scale].shape
        return {**state, scale: torch.zeros(rows, cols + 1, dtype=torch.uint8)}

    folder = resaved(demos / "healthy-hf-sharded", tmp_path / "ckpt", edit)
    (f,) = load_findings(folder)
    assert f.code == "load-shape-mismatch" and f.tensor == scale
    assert "one value per 16 inputs" in f.message


def test_modelopt_fp8_export_of_a_moe_is_clean(
    saved: Callable[[str], Saved], tmp_path: Path
) -> None:
    folder = modelopt_export(saved("qwen3-moe").folder, tmp_path / "fp8", "FP8")
    scanned = scan(folder)
    verdict = load_verdict(scanned)
    assert ours(verdict) == (set(), set(), set())
    assert any(n.endswith(".experts.2.up_proj.weight_scale") for n in verdict.quantization_expected)
    assert not load_findings(scanned)


def test_modelopt_nvfp4_experts_of_a_save_pretrained_moe(
    saved: Callable[[str], Saved], tmp_path: Path
) -> None:
    folder = modelopt_export(
        saved("deepseek-v3").folder, tmp_path / "nvfp4", "NVFP4", experts_only=True
    )
    scanned = scan(folder)
    verdict = load_verdict(scanned)
    assert ours(verdict) == (set(), set(), set())
    packed = "model.layers.1.mlp.experts.5.down_proj.weight"
    assert {packed, f"{packed}_scale", f"{packed}_scale_2"} <= set(verdict.quantization_expected)
    assert not load_findings(scanned)


def test_modelopt_fp8_missing_input_scale_is_reported(
    saved: Callable[[str], Saved], tmp_path: Path
) -> None:
    gone = "model.layers.1.self_attn.q_proj.input_scale"
    folder = modelopt_export(saved("qwen3-moe").folder, tmp_path / "fp8", "FP8",
                             edit=lambda s: {k: v for k, v in s.items() if k != gone})  # fmt: skip
    (f,) = load_findings(folder)
    assert f.code == "load-missing-tensor" and f.tensor == gone and "FP8" in f.message


def _pack_int4(state: dict[str, torch.Tensor], group: int) -> dict[str, torch.Tensor]:
    """compressed-tensors pack-quantized W4A16: eight 4-bit values per I32, group scales."""
    out = {}
    for k, v in state.items():
        if k.endswith("proj.weight") and v.dim() == 2:
            module = k.removesuffix(".weight")
            rows, cols = v.shape
            out[f"{module}.weight_packed"] = torch.zeros(rows, cols // 8, dtype=torch.int32)
            out[f"{module}.weight_scale"] = torch.ones(rows, cols // group, dtype=torch.bfloat16)
            out[f"{module}.weight_shape"] = torch.tensor([rows, cols])
        else:
            out[k] = v
    return out


def test_compressed_tensors_pack_quantized(saved: Callable[[str], Saved], tmp_path: Path) -> None:
    group = 8

    def export(dest: Path, edit: Callable[[dict], dict]) -> Path:
        folder = resaved(saved("llama").folder, dest, lambda s: edit(_pack_int4(s, group)))
        config = load_json(folder / CONFIG_NAME)
        weights = {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group",
                   "group_size": group}  # fmt: skip
        config["quantization_config"] = {
            "quant_method": "compressed-tensors",
            "format": "pack-quantized",
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights}},
            "ignore": ["lm_head"],
        }
        save_json(folder / CONFIG_NAME, config)
        return folder

    healthy = export(tmp_path / "ct", lambda s: s)
    verdict = load_verdict(scan(healthy))
    assert ours(verdict) == (set(), set(), set())
    assert "model.layers.0.mlp.up_proj.weight_packed" in verdict.quantization_expected
    gone = "model.layers.0.mlp.up_proj.weight_shape"
    broken = export(tmp_path / "ct-broken", lambda s: {k: v for k, v in s.items() if k != gone})
    (f,) = load_findings(broken)
    assert f.code == "load-missing-tensor" and f.tensor == gone


def test_compressed_tensors_fp8_dynamic(saved: Callable[[str], Saved], tmp_path: Path) -> None:
    """float-quantized, channel strategy, dynamic activations: F8 weights, one scale per row."""

    def fp8(state: dict) -> dict:
        out = {}
        for k, v in state.items():
            if k.endswith("proj.weight") and v.dim() == 2:
                out[k] = v.to(torch.float8_e4m3fn)
                out[k.replace(".weight", ".weight_scale")] = torch.ones(v.shape[0], 1)
            else:
                out[k] = v
        return out

    folder = resaved(saved("qwen3-moe").folder, tmp_path / "ct", fp8)
    config = load_json(folder / CONFIG_NAME)
    weights = {"num_bits": 8, "type": "float", "strategy": "channel", "dynamic": False}
    config["quantization_config"] = {
        "quant_method": "compressed-tensors",
        "format": "float-quantized",
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights}},
        "ignore": ["lm_head", "re:.*mlp.gate$"],
    }
    save_json(folder / CONFIG_NAME, config)
    scanned = scan(folder)
    verdict = load_verdict(scanned)
    assert ours(verdict) == (set(), set(), set())
    assert "model.layers.1.mlp.experts.0.down_proj.weight_scale" in verdict.quantization_expected
    assert not load_findings(scanned)


def test_block_fp8_scales_follow_the_block_size(
    saved: Callable[[str], Saved], tmp_path: Path
) -> None:
    """DeepSeek's own FP8 layout: `weight_scale_inv` per 128x128 block of the weight."""

    def export(dest: Path, rows_extra: int) -> Path:
        def edit(state: dict) -> dict:
            out = {}
            for k, v in state.items():
                if k.endswith("proj.weight") and v.dim() == 2 and ".experts." not in k:
                    out[k] = v.to(torch.float8_e4m3fn)
                    blocks = (math.ceil(v.shape[0] / 128) + rows_extra, math.ceil(v.shape[1] / 128))
                    out[k.replace(".weight", ".weight_scale_inv")] = torch.ones(blocks)
                else:
                    out[k] = v
            return out

        folder = resaved(saved("deepseek-v3").folder, dest, edit)
        config = load_json(folder / CONFIG_NAME)
        config["quantization_config"] = {"quant_method": "fp8", "weight_block_size": [128, 128],
                                         "activation_scheme": "dynamic"}  # fmt: skip
        save_json(folder / CONFIG_NAME, config)
        return folder

    assert ours(load_verdict(scan(export(tmp_path / "ok", 0)))) == (set(), set(), set())
    bad = export(tmp_path / "bad", 1)
    scanned = scan(bad)
    verdict = load_verdict(scanned)
    assert verdict.mismatched and not verdict.missing and not verdict.unexpected
    for m in verdict.mismatched:
        assert m.key.endswith("weight_scale_inv") and m.stored[0] == m.expected[0] + 1
        assert "one value per 128x128 block" in verdict.reasons[m.key]
    assert {f.code for f in load_findings(scanned)} == {"load-shape-mismatch"}


def test_an_unmodelled_quantization_method_skips_the_check(
    saved: Callable[[str], Saved], tmp_path: Path
) -> None:
    folder = tmp_path / "gptq"
    shutil.copytree(saved("llama").folder, folder)
    config = load_json(folder / CONFIG_NAME)
    config["quantization_config"] = {"quant_method": "gptq", "bits": 4}
    save_json(folder / CONFIG_NAME, config)
    scanned = scan(folder)
    verdict = load_verdict(scanned)
    assert verdict.skipped and "'gptq'" in verdict.skipped and verdict.loads is None
    assert not load_findings(scanned)


# -- when the check cannot run: skipped, visible, no finding ---------------------------------------


def _with_config(src: Path, dest: Path, edit: Callable[[dict], None]) -> Path:
    shutil.copytree(src, dest)
    config = load_json(dest / CONFIG_NAME)
    edit(config)
    save_json(dest / CONFIG_NAME, config)
    return dest


@pytest.mark.parametrize(
    ("edit", "reason"),
    [
        (lambda c: c.pop("architectures"), "names no architecture"),
        (lambda c: c.update(architectures=["NoSuchForCausalLM"]), "does not know NoSuch"),
        (lambda c: c.update(num_hidden_layers=5000), "over the 2,048 this check builds"),
        (lambda c: c.update(hidden_size="wide"), "cannot build LlamaForCausalLM"),
        (
            lambda c: c.update(architectures=["TinyForCausalLM"],
                               auto_map={"AutoModelForCausalLM": "modeling_tiny.TinyForCausalLM"}),
            "allow it with --trust-remote-code",
        ),
    ],
)  # fmt: skip
def test_skipped_verdicts_say_why(
    edit: Callable[[dict], None], reason: str, saved: Callable[[str], Saved], tmp_path: Path
) -> None:
    folder = _with_config(saved("llama").folder, tmp_path / "ckpt", edit)
    scanned = scan(folder)
    verdict = load_verdict(scanned)
    assert verdict.skipped is not None and reason in verdict.skipped
    assert verdict.loads is None and not verdict.missing and verdict.parameters is None
    assert not load_findings(scanned)


def test_sizes_are_not_counts(saved: Callable[[str], Saved], tmp_path: Path) -> None:
    """The bounds apply to counts of layers and experts, not to sizes that mention them."""
    big = 20480
    folder = _with_config(
        saved("qwen2-moe").folder,
        tmp_path / "ckpt",
        lambda c: c.update(shared_expert_intermediate_size=big),
    )
    verdict = load_verdict(scan(folder))
    assert verdict.skipped is None
    assert {m.expected for m in verdict.mismatched} >= {(big, 16), (16, big)}


def test_kimi_style_config_uses_transformers_own_class(
    saved: Callable[[str], Saved], tmp_path: Path
) -> None:
    """Kimi K2 ships DeepSeek-V3 weights under its own model_type with code in auto_map; the
    architecture it names is transformers' own, which is used without running that code."""

    def kimi(config: dict) -> None:
        config.update(
            model_type="kimi_k2",
            auto_map={"AutoModelForCausalLM": "modeling_deepseek.DeepseekV3ForCausalLM"},
        )

    folder = _with_config(saved("deepseek-v3").folder, tmp_path / "ckpt", kimi)
    verdict = load_verdict(scan(folder))
    assert verdict.architecture == "DeepseekV3ForCausalLM"
    assert ours(verdict) == (set(), set(), set())


def test_layouts_a_loader_does_not_read_are_skipped(tmp_path: Path) -> None:
    from inspector._internal.demo.dcp import write_dcp_demo

    verdict = load_verdict(scan(write_dcp_demo(tmp_path / "dcp")))
    assert verdict.skipped is not None and "dcp-sharded layout" in verdict.skipped


_TINY_CODE = """
from transformers import LlamaConfig, LlamaForCausalLM


class TinyConfig(LlamaConfig):
    model_type = "tiny_custom"


class TinyForCausalLM(LlamaForCausalLM):
    config_class = TinyConfig
"""


def _remote_code_folder(src: Path, dest: Path, auto_map: dict) -> Path:
    def edit(config: dict) -> None:
        config.update(
            architectures=["TinyForCausalLM"], model_type="tiny_custom", auto_map=auto_map
        )

    folder = _with_config(src, dest, edit)
    (folder / "modeling_tiny.py").write_text(_TINY_CODE)
    return folder


def test_trust_remote_code_runs_only_the_folders_own_code(
    saved: Callable[[str], Saved], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # transformers copies the module into its modules cache: keep that under tmp_path.
    monkeypatch.setattr(T.dynamic_module_utils, "HF_MODULES_CACHE", str(tmp_path / "modules"))
    monkeypatch.setattr(sys, "path", list(sys.path))
    local = {"AutoConfig": "modeling_tiny.TinyConfig",
             "AutoModelForCausalLM": "modeling_tiny.TinyForCausalLM"}  # fmt: skip
    folder = _remote_code_folder(saved("llama").folder, tmp_path / "ckpt", local)
    assert "--trust-remote-code" in load_verdict(scan(folder)).skipped
    verdict = load_verdict(scan(folder), trust_remote_code=True)
    assert ours(verdict) == (set(), set(), set()) and verdict.architecture == "TinyForCausalLM"
    # Code in another repository (`repo--module.Class`) is never fetched, trusted or not.
    other = {"AutoConfig": "someone/repo--modeling_tiny.TinyConfig",
             "AutoModelForCausalLM": "someone/repo--modeling_tiny.TinyForCausalLM"}  # fmt: skip
    folder = _remote_code_folder(saved("llama").folder, tmp_path / "other", other)
    verdict = load_verdict(scan(folder), trust_remote_code=True)
    assert "not a module file in the checkpoint folder" in verdict.skipped
    # Nor is code a link in the folder points to.
    folder = _remote_code_folder(saved("llama").folder, tmp_path / "linked", local)
    (tmp_path / "elsewhere.py").write_text("")
    (folder / "helpers.py").symlink_to(tmp_path / "elsewhere.py")
    verdict = load_verdict(scan(folder), trust_remote_code=True)
    assert "not a module file in the checkpoint folder" in verdict.skipped


def test_the_meta_model_is_built_once_per_config(saved: Callable[[str], Saved]) -> None:
    from inspector._internal.load import verdict as model_load

    clear_model_cache()
    scanned = scan(saved("qwen3").folder)
    # Computed both times (not taken from the verdict cache): the model is built once.
    load_verdict(scanned, cache=False)
    load_verdict(scanned, cache=False)
    info = model_load._build.cache_info()
    assert (info.misses, info.hits) == (1, 1)


# -- the CLI -----------------------------------------------------------------------------------


def test_cli_check_reports_the_verdict_and_no_model_skips_it(
    saved: Callable[[str], Saved], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = resaved(saved("llama").folder, tmp_path / "ckpt", remove_lm_head)
    assert main(["check", str(folder)]) == 1
    out = capsys.readouterr().out
    assert "load check: does NOT load cleanly as LlamaForCausalLM: 1 missing" in out
    assert "error    load-missing-tensor  1 finding" in out
    assert main(["check", str(folder), "--no-model"]) == 0
    out = capsys.readouterr().out
    assert "load check" not in out and "load-missing-tensor" not in out
    assert main(["check", str(folder), "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["load"]["missing"] == ["lm_head.weight"] and doc["load"]["loads"] is False


def test_markdown_summary_says_whether_it_loads(
    saved: Callable[[str], Saved], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("plotly")
    folder = resaved(saved("mixtral").folder, tmp_path / "ckpt", drop_expert)
    assert main(["report", str(folder), "--markdown"]) == 0
    out = capsys.readouterr().out
    assert "- will it load: **no**, as `MixtralForCausalLM`" in out
    assert "2 with another shape: `model.layers.0.mlp.experts.down_proj [3, 16, 32]" in out
    assert main(["report", str(saved("mixtral").folder), "--markdown"]) == 0
    assert (
        "- will it load: yes, as `MixtralForCausalLM` (16,080 parameters)"
        in capsys.readouterr().out
    )
    assert main(["report", str(folder), "--markdown", "--no-model"]) == 0
    assert "will it load" not in capsys.readouterr().out
