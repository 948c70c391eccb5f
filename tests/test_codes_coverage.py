"""Every finding code, produced by the full `inspector._internal.checks.check()` from a checkpoint
that a real writer wrote (safetensors `save_file`, huggingface_hub / transformers, PyTorch DCP) and
that was then damaged the way real exports go wrong.

One test per code, named `test_code_<code with _ for ->`; the last test proves that every
code in `inspector._internal.findings.finding.CODES` and in docs/findings.md has its test here.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import shutil
import struct
import sys
from pathlib import Path

import pytest
import torch
from engine_cases import write_eagle3, write_llama_gguf
from hf_exports import resaved, tiny_llama
from huggingface_hub import save_torch_state_dict
from modelopt_writer import (
    INDEX,
    load_json,
    mtp_tensors,
    save_json,
    shard_name,
    tiny_layer_state_dicts,
    write_modelopt_export,
)
from remote_servers import FakeHub
from safetensors.torch import load_file, save_file

from inspector._internal.checks import check
from inspector._internal.common.filenames import CONFIG_NAME, MANIFEST_NAME, QUANT_CONFIG_NAME
from inspector._internal.demo.dcp import write_rank_files
from inspector._internal.demo.torch_dist import write_torch_dist_demo
from inspector._internal.findings.codes import codes_markdown
from inspector._internal.findings.finding import CODES, Finding
from inspector._internal.integrity.verify import verify, write_manifest
from inspector._internal.load.engine import EngineVerdict
from inspector._internal.scan.entry import scan
from inspector._internal.serve.engine import engine_check, verdict_findings
from inspector._internal.serve.fit import fit

H = 8
FINDINGS_MD = Path(__file__).resolve().parents[1] / "docs" / "findings.md"
# Checkpoints written by the real libraries (tests/test_golden_writers.py).
GOLDEN = Path(__file__).resolve().parent / "fixtures" / "writers"
ITER = "iter_0000100"


def run(folder: Path, *, deep: bool = False) -> list[Finding]:
    return check(scan(folder), deep=deep)


def one(findings: list[Finding], code: str) -> Finding:
    """The first finding of `code`; fails with every code found when there is none."""
    hits = [f for f in findings if f.code == code]
    assert hits, f"no {code}; found {sorted({f.code for f in findings})}"
    return hits[0]


def bf16(*shape: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=gen).to(torch.bfloat16)


# -- writers -----------------------------------------------------------------------------------


def dense_model(layers: int = 3) -> dict[str, torch.Tensor]:
    sd = {"model.embed_tokens.weight": bf16(32, H)}
    for layer in range(layers):
        p = f"model.layers.{layer}"
        sd[f"{p}.input_layernorm.weight"] = bf16(H, seed=layer)
        sd[f"{p}.self_attn.q_proj.weight"] = bf16(H, H, seed=layer + 10)
        sd[f"{p}.mlp.down_proj.weight"] = bf16(H, H, seed=layer + 20)
    sd["model.norm.weight"] = bf16(H, seed=99)
    return sd


def moe_model(layers: int = 2, experts: int = 4, *, fp8: bool = False) -> dict[str, torch.Tensor]:
    """A small MoE; with `fp8` the experts are FP8 with a per-tensor `weight_scale`."""
    sd = {"model.embed_tokens.weight": bf16(32, H)}
    for layer in range(layers):
        p = f"model.layers.{layer}"
        sd[f"{p}.input_layernorm.weight"] = bf16(H)
        sd[f"{p}.mlp.gate.weight"] = bf16(experts, H)
        for e in range(experts):
            for proj in ("up_proj", "down_proj"):
                base = f"{p}.mlp.experts.{e}.{proj}"
                if fp8:
                    sd[f"{base}.weight"] = bf16(H, H, seed=e).to(torch.float8_e4m3fn)
                    sd[f"{base}.weight_scale"] = torch.tensor(0.5)
                else:
                    sd[f"{base}.weight"] = bf16(H, H, seed=e)
    return sd


def moe_config(layers: int = 2, experts: int = 4) -> dict:
    return {"model_type": "qwen3_moe", "num_hidden_layers": layers, "num_experts": experts}


def write_hf(folder: Path, state: dict, *, config: dict | None = None, shard: int = 600) -> Path:
    """huggingface_hub's sharded writer (shards plus index), and a config.json."""
    folder.mkdir(parents=True)
    save_torch_state_dict(state, folder, max_shard_size=shard)
    if config is not None:
        save_json(folder / CONFIG_NAME, config)
    return folder


def write_single(folder: Path, state: dict) -> Path:
    folder.mkdir(parents=True)
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


def private_copy(written: Path, folder: Path) -> Path:
    """A test's own copy of a checkpoint a module fixture wrote (and checked clean) once:
    the test damages it; writing and checking it again for each test cost 0.1-0.2 s of CPU."""
    return Path(shutil.copytree(written, folder, symlinks=True))


def shards(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.glob("*.safetensors"))


def edit_json(path: Path, edit) -> None:
    doc = load_json(path)
    edit(doc)
    save_json(path, doc)


def edit_header(path: Path, edit) -> None:
    """Rewrite a real file's header as text after `edit(text)`, data section unchanged."""
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = edit(raw[8 : 8 + n].decode().rstrip())
    data = header.encode()
    data += b" " * (-len(data) % 8)
    path.write_bytes(struct.pack("<Q", len(data)) + data + raw[8 + n :])


def single_header_case(tmp_path: Path, edit) -> tuple[list[Finding], str]:
    folder = write_single(tmp_path / "single", dense_model(1))
    edit_header(folder / "model.safetensors", edit)
    return run(folder), "model.safetensors"


# -- shard integrity -------------------------------------------------------------------------


def test_code_header_unreadable(tmp_path: Path) -> None:
    folder = write_single(tmp_path / "single", dense_model(1))
    os.truncate(folder / "model.safetensors", 5)
    f = one(run(folder), "header-unreadable")
    assert f.file == "model.safetensors" and "5 bytes" in f.message


def test_code_header_invalid_entry(tmp_path: Path) -> None:
    def bad_shape(text: str) -> str:
        doc = json.loads(text)
        doc["model.norm.weight"]["shape"] = "eight"
        return json.dumps(doc)

    findings, file = single_header_case(tmp_path, bad_shape)
    f = one(findings, "header-invalid-entry")
    assert f.file == file and f.tensor == "model.norm.weight" and "eight" in f.message


def test_code_header_duplicate_key(tmp_path: Path) -> None:
    def duplicate(text: str) -> str:
        entry = json.dumps(json.loads(text)["model.norm.weight"])
        return text[:-1] + f',"model.norm.weight":{entry}}}'

    findings, file = single_header_case(tmp_path, duplicate)
    f = one(findings, "header-duplicate-key")
    assert f.file == file and "model.norm.weight" in f.message


def test_code_unknown_dtype(tmp_path: Path) -> None:
    findings, file = single_header_case(tmp_path, lambda t: t.replace('"BF16"', '"BF17"', 1))
    f = one(findings, "unknown-dtype")
    assert f.file == file and "BF17" in f.message


def test_code_size_mismatch(tmp_path: Path) -> None:
    def shrink(text: str) -> str:
        doc = json.loads(text)
        doc["model.norm.weight"]["shape"] = [7]
        return json.dumps(doc)

    findings, file = single_header_case(tmp_path, shrink)
    f = one(findings, "size-mismatch")
    assert f.file == file and f.tensor == "model.norm.weight"
    assert "14" in f.message and "16" in f.message  # 7 BF16 = 14 bytes, the range holds 16


def test_code_offset_invalid(tmp_path: Path) -> None:
    def overlap(text: str) -> str:
        doc = json.loads(text)
        begin, end = doc["model.norm.weight"]["data_offsets"]
        doc["model.norm.weight"]["data_offsets"] = [begin - 2, end - 2]
        return json.dumps(doc)

    findings, file = single_header_case(tmp_path, overlap)
    f = one(findings, "offset-invalid")
    assert f.file == file and "model.norm.weight" in f.message


def test_code_file_truncated(tmp_path: Path) -> None:
    folder = write_single(tmp_path / "single", dense_model(1))
    path = folder / "model.safetensors"
    size = path.stat().st_size
    os.truncate(path, size - 10)
    f = one(run(folder), "file-truncated")
    assert f.file == "model.safetensors" and f"{size - 10:,}" in f.message


def test_code_trailing_bytes(tmp_path: Path) -> None:
    folder = write_single(tmp_path / "single", dense_model(1))
    with open(folder / "model.safetensors", "ab") as fh:
        fh.write(b"\0" * 24)
    f = one(run(folder), "trailing-bytes")
    assert f.file == "model.safetensors" and "24" in f.message


# -- index against shards ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def hf_written(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = write_hf(tmp_path_factory.mktemp("hf") / "hf", dense_model())
    assert len(shards(folder)) >= 3 and run(folder) == []
    return folder


@pytest.fixture
def hf(hf_written: Path, tmp_path: Path) -> Path:
    return private_copy(hf_written, tmp_path / "hf")


def test_code_index_unreadable(hf: Path) -> None:
    text = (hf / INDEX).read_text()
    (hf / INDEX).write_text(text[: len(text) // 2])
    f = one(run(hf), "index-unreadable")
    assert f.file == INDEX and "not valid JSON" in f.message


def test_code_index_unsafe_path(hf: Path) -> None:
    edit_json(
        hf / INDEX, lambda d: d["weight_map"].update({"model.norm.weight": "../x.safetensors"})
    )
    f = one(run(hf), "index-unsafe-path")
    assert f.tensor == "model.norm.weight" and "'../x.safetensors'" in f.message


def test_code_index_missing_file(hf: Path) -> None:
    gone = shards(hf)[0]
    (hf / gone).unlink()
    f = one(run(hf), "index-missing-file")
    assert f.file == gone and "not in the checkpoint folder" in f.message


def test_code_index_dangling_tensor(hf: Path) -> None:
    edit_json(hf / INDEX, lambda d: d["weight_map"].update({"mtp.fc.weight": shards(hf)[-1]}))
    f = one(run(hf), "index-dangling-tensor")
    assert f.tensor == "mtp.fc.weight" and shards(hf)[-1] in f.message


def test_code_index_wrong_file(hf: Path) -> None:
    owner = load_json(hf / INDEX)["weight_map"]["model.norm.weight"]
    other = next(s for s in shards(hf) if s != owner)
    edit_json(hf / INDEX, lambda d: d["weight_map"].update({"model.norm.weight": other}))
    f = one(run(hf), "index-wrong-file")
    assert f.tensor == "model.norm.weight" and owner in f.message and other in f.message


def test_code_unindexed_tensor(hf: Path) -> None:
    owner = load_json(hf / INDEX)["weight_map"]["model.norm.weight"]
    edit_json(hf / INDEX, lambda d: d["weight_map"].pop("model.norm.weight"))
    f = one(run(hf), "unindexed-tensor")
    assert f.tensor == "model.norm.weight" and owner in f.message


def test_code_unindexed_file(hf: Path) -> None:
    save_file({"stray.weight": bf16(2, 2)}, str(hf / "extra.safetensors"))
    f = one(run(hf), "unindexed-file")
    assert f.file == "extra.safetensors" and "stray.weight" in f.message


def test_code_weights_named_by_config(hf: Path) -> None:
    """config.json's transformers_weights names the one file transformers reads."""
    save_file(load_file(str(hf / shards(hf)[0])), str(hf / "other.safetensors"))
    save_json(hf / CONFIG_NAME, {"transformers_weights": "other.safetensors"})
    f = one(run(hf), "weights-named-by-config")
    assert f.file == CONFIG_NAME and "transformers reads other.safetensors" in f.message


def test_code_duplicate_tensor(hf: Path) -> None:
    owner = load_json(hf / INDEX)["weight_map"]["model.norm.weight"]
    other = next(s for s in shards(hf) if s != owner)
    save_file(load_file(str(hf / other)) | {"model.norm.weight": bf16(4)}, str(hf / other))
    f = one(run(hf), "duplicate-tensor")
    # The copies disagree on shape: the message says so.
    assert f.tensor == "model.norm.weight" and "[4]" in f.message and "[8]" in f.message


def test_code_total_size_mismatch(hf: Path) -> None:
    edit_json(
        hf / INDEX, lambda d: d["metadata"].update(total_size=d["metadata"]["total_size"] + 7)
    )
    f = one(run(hf), "total-size-mismatch")
    assert f.file == INDEX and "+7" in f.message


def test_code_total_parameters_mismatch(hf: Path) -> None:
    numel = sum(t.numel() for t in dense_model().values())
    edit_json(hf / INDEX, lambda d: d["metadata"].update(total_parameters=numel * 2))
    f = one(run(hf), "total-parameters-mismatch")
    assert f.file == INDEX and f"{numel * 2:,}" in f.message and f"{numel:,}" in f.message


# -- per-layer sidecars ------------------------------------------------------------------------

LAYERS = 3
LAST = shard_name(LAYERS, LAYERS)


@pytest.fixture(scope="module")
def export_written(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("export") / "export"
    write_modelopt_export(folder, tiny_layer_state_dicts(LAYERS))
    assert run(folder) == []
    return folder


@pytest.fixture
def export(export_written: Path, tmp_path: Path) -> Path:
    return private_copy(export_written, tmp_path / "export")


def test_code_sidecar_missing(export: Path) -> None:
    (export / f"{LAST}.json").unlink()
    f = one(run(export), "sidecar-missing")
    assert f.file == LAST and LAST in f.message


def test_code_sidecar_unlisted_tensor(tmp_path: Path) -> None:
    folder = write_modelopt_export(
        tmp_path / "e", tiny_layer_state_dicts(LAYERS), late={LAYERS: mtp_tensors()}
    )
    f = one(run(folder), "sidecar-unlisted-tensor")
    assert f.tensor in mtp_tensors() and f"{LAST}.json" in f.message


def test_code_sidecar_dangling_tensor(export: Path) -> None:
    edit_json(export / f"{LAST}.json", lambda d: d["weight_map"].update({"mtp.fc.weight": LAST}))
    f = one(run(export), "sidecar-dangling-tensor")
    assert f.tensor == "mtp.fc.weight" and LAST in f.message


def test_code_sidecar_total_size_mismatch(export: Path) -> None:
    edit_json(export / f"{LAST}.json", lambda d: d["metadata"].update(total_size=1))
    f = one(run(export), "sidecar-total-size-mismatch")
    assert f"{LAST}.json" in f.message and "is 1 " in f.message


def test_code_sidecar_index_disagree(export: Path) -> None:
    edit_json(export / INDEX, lambda d: d["weight_map"].pop("model.norm.weight"))
    f = one(run(export), "sidecar-index-disagree")
    assert f.tensor == "model.norm.weight" and INDEX in f.message


def test_code_sidecar_unreadable(export: Path) -> None:
    (export / f"{LAST}.json").write_text('{"weight_map": {')
    f = one(run(export), "sidecar-unreadable")
    assert f.file == f"{LAST}.json" and "not valid JSON" in f.message


# -- model structure ---------------------------------------------------------------------------


def test_code_config_unreadable(tmp_path: Path) -> None:
    folder = write_hf(tmp_path / "m", moe_model(), config=moe_config())
    (folder / CONFIG_NAME).write_text('{"model_type": "qwen3_moe", "num_hidden_layers": 2, "num_')
    f = one(run(folder), "config-unreadable")
    assert f.file == CONFIG_NAME and "num_hidden_layers=2" in f.message


def test_code_layer_missing(tmp_path: Path) -> None:
    folder = write_hf(tmp_path / "m", dense_model(3), config={"num_hidden_layers": 5})
    findings = run(folder)
    missing = [f for f in findings if f.code == "layer-missing"]
    assert [f.layer for f in missing] == [3, 4]
    assert "declares 5 layers" in missing[0].message


def test_code_expert_missing(tmp_path: Path) -> None:
    state = {k: v for k, v in moe_model().items() if ".experts.3." not in k}
    folder = write_hf(tmp_path / "m", state, config=moe_config())
    f = one(run(folder), "expert-missing")
    assert f.expert == 3 and "experts 3 missing (1 of 4; config declares 4)" in f.message


def test_code_expert_incomplete(tmp_path: Path) -> None:
    state = moe_model()
    del state["model.layers.1.mlp.experts.2.down_proj.weight"]
    folder = write_hf(tmp_path / "m", state, config=moe_config())
    f = one(run(folder), "expert-incomplete")
    assert (f.layer, f.expert) == (1, 2) and "down_proj" in f.message


def test_code_expert_shape_mismatch(tmp_path: Path) -> None:
    state = moe_model()
    state["model.layers.0.mlp.experts.1.up_proj.weight"] = bf16(H, H + 1)
    folder = write_hf(tmp_path / "m", state, config=moe_config())
    f = one(run(folder), "expert-shape-mismatch")
    assert (f.layer, f.expert) == (0, 1) and "[8, 9]" in f.message and "[8, 8]" in f.message
    assert f.tensor == "model.layers.0.mlp.experts.1.up_proj.weight"


def test_code_layer_keyset_outlier(tmp_path: Path) -> None:
    state = dense_model(4) | {"model.layers.2.self_attn.q_proj.bias": bf16(H)}
    folder = write_hf(tmp_path / "m", state, config={"num_hidden_layers": 4})
    f = one(run(folder), "layer-keyset-outlier")
    assert f.layer == 2 and "q_proj.bias" in f.message


def test_code_mtp_missing(tmp_path: Path) -> None:
    """A Model-Optimizer per-layer export stores the MTP block in its last shard; one whose
    MTP tensors are gone while the config still declares the layer lost them."""
    config = {"model_type": "deepseek_v3", "num_hidden_layers": 3, "num_nextn_predict_layers": 1}
    folder = write_modelopt_export(tmp_path / "export", tiny_layer_state_dicts(3), config=config)
    f = one(run(folder), "mtp-missing")
    assert "declares 1 MTP layer" in f.message and f.severity == "warning"
    assert "mtp-not-stored" not in {x.code for x in run(folder)}


def test_code_mtp_not_stored(tmp_path: Path) -> None:
    """transformers' DeepSeek-V3 class builds no MTP module, so save_pretrained never stores
    the MTP layer the config declares: an info, with or without the model built."""
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    config = DeepseekV3Config(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        moe_intermediate_size=8,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        n_routed_experts=4,
        num_experts_per_tok=2,
        n_group=1,
        topk_group=1,
        first_k_dense_replace=1,
        q_lora_rank=8,
        kv_lora_rank=8,
        qk_nope_head_dim=4,
        qk_rope_head_dim=4,
        v_head_dim=8,
        num_nextn_predict_layers=1,
    )
    torch.manual_seed(0)
    DeepseekV3ForCausalLM(config).save_pretrained(tmp_path / "ds")
    scanned = scan(tmp_path / "ds")
    for findings in (check(scanned), check(scanned, model=False)):
        f = one(findings, "mtp-not-stored")
        assert "declares 1 MTP layer" in f.message and f.severity == "info"
        assert "repair --from" in f.message
        assert "mtp-missing" not in {x.code for x in findings}


def _quant_export(tmp_path: Path, quantized_layers: dict) -> Path:
    folder = write_hf(tmp_path / "q", moe_model(fp8=True), config=moe_config())
    doc = {
        "producer": {"name": "modelopt", "version": "0"},
        "quantization": {
            "quant_algo": "MIXED_PRECISION",
            "quantized_layers": quantized_layers,
            "exclude_modules": ["lm_head", "model.embed_tokens", "*mlp.gate"],
        },
    }
    save_json(folder / QUANT_CONFIG_NAME, doc)
    return folder


def _all_quantized() -> dict:
    return {
        f"model.layers.{layer}.mlp.experts.{e}.{proj}": {"quant_algo": "FP8"}
        for layer in range(2)
        for e in range(4)
        for proj in ("up_proj", "down_proj")
    }


def test_code_quant_config_unreadable(tmp_path: Path) -> None:
    folder = _quant_export(tmp_path, _all_quantized())
    assert run(folder) == []
    (folder / QUANT_CONFIG_NAME).write_text('{"quantization": {"quant_algo": ')
    f = one(run(folder), "quant-config-unreadable")
    assert f.file == QUANT_CONFIG_NAME and "not valid JSON" in f.message


def test_code_quant_config_missing_layer(tmp_path: Path) -> None:
    layers = {k: v for k, v in _all_quantized().items() if ".experts.2." not in k}
    f = one(run(_quant_export(tmp_path, layers)), "quant-config-missing-layer")
    assert f.file == QUANT_CONFIG_NAME and "for experts 2 (1 modules)" in f.message
    assert "has no quantized_layers entry" in f.message


def test_code_quant_config_stale_layer(tmp_path: Path) -> None:
    layers = _all_quantized() | {"model.layers.1.mlp.experts.9.up_proj": {"quant_algo": "FP8"}}
    f = one(run(_quant_export(tmp_path, layers)), "quant-config-stale-layer")
    assert "model.layers.1.mlp.experts.{E}.up_proj for experts 9 (1 modules)" in f.message
    assert "is listed in quantized_layers but no tensor of it exists" in f.message


# -- DCP-sharded safetensors -------------------------------------------------------------------

DCP_TENSORS = {
    "model.embed_tokens.weight": (32, H),
    "model.layers.0.self_attn.q_proj.weight": (H, H),
    "model.norm.weight": (H,),
}
RANK2 = "shard-00002-model-00001-of-00001.safetensors"


def write_dcp(folder: Path, *, mapping: dict[str, int] | None = None) -> Path:
    """Three ranks' files as DCP's HuggingFaceStorageWriter writes them (row-sharded), plus
    NeMo's `.hf_metadata/`. Three, so that a lost middle rank leaves a hole the outer ranks'
    chunks still bound."""
    folder.mkdir(parents=True)
    tensors = {n: bf16(*s, seed=i) for i, (n, s) in enumerate(DCP_TENSORS.items())}
    mapping = mapping or dict.fromkeys(tensors, 1)
    write_rank_files(folder, tensors, dict.fromkeys(tensors, 0), mapping, ranks=3)
    meta = folder / ".hf_metadata"
    meta.mkdir()
    (meta / "fqn_to_file_index_mapping.json").write_text(json.dumps(mapping))
    (meta / CONFIG_NAME).write_text(json.dumps({"model_type": "llama", "num_hidden_layers": 1}))
    return folder


def rewrite_rank(path: Path, *, tensors=None, info=None, drop_info: bool = False) -> None:
    """Re-save a rank file with safetensors after changing its tensors or sharding info."""
    from safetensors import safe_open

    with safe_open(str(path), "pt") as fh:
        metadata = dict(fh.metadata())
    state = load_file(str(path))
    if tensors:
        state |= tensors(state)
    if info:
        metadata["DCP_SHARDING_INFO"] = json.dumps(info(json.loads(metadata["DCP_SHARDING_INFO"])))
    if drop_info:
        del metadata["DCP_SHARDING_INFO"]
    save_file(state, str(path), metadata=metadata)


@pytest.fixture(scope="module")
def dcp_written(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = write_dcp(tmp_path_factory.mktemp("dcp") / "dcp")
    assert scan(folder).layout == "dcp-sharded" and run(folder) == []
    return folder


@pytest.fixture
def dcp(dcp_written: Path, tmp_path: Path) -> Path:
    return private_copy(dcp_written, tmp_path / "dcp")


def test_code_dcp_sharding_info_missing(dcp: Path) -> None:
    rewrite_rank(dcp / RANK2, drop_info=True)
    f = one(run(dcp), "dcp-sharding-info-missing")
    assert f.file == RANK2 and "DCP_SHARDING_INFO" in f.message


def test_code_dcp_coverage_gap(dcp: Path) -> None:
    (dcp / RANK2).unlink()
    f = one(run(dcp), "dcp-coverage-gap")
    assert f.tensor in DCP_TENSORS


def test_code_dcp_chunk_overlap(dcp: Path) -> None:
    def shift(info: dict) -> dict:
        info["model.embed_tokens.weight"]["saved_offsets"] = [8, 0]
        return info

    rewrite_rank(dcp / RANK2, info=shift)
    f = one(run(dcp), "dcp-chunk-overlap")
    assert f.tensor == "model.embed_tokens.weight"


def test_code_dcp_dtype_conflict(dcp: Path) -> None:
    rewrite_rank(
        dcp / RANK2, tensors=lambda s: {"model.norm.weight": s["model.norm.weight"].float()}
    )
    f = one(run(dcp), "dcp-dtype-conflict")
    assert f.tensor == "model.norm.weight" and "F32" in f.message and "BF16" in f.message


MAPPING_FILE = ".hf_metadata/fqn_to_file_index_mapping.json"


def test_code_mapping_unmapped_tensor(dcp: Path) -> None:
    edit_json(dcp / MAPPING_FILE, lambda d: d.pop("model.norm.weight"))
    f = one(run(dcp), "mapping-unmapped-tensor")
    assert f.tensor == "model.norm.weight" and MAPPING_FILE in f.message


def test_code_mapping_dangling_tensor(dcp: Path) -> None:
    edit_json(dcp / MAPPING_FILE, lambda d: d.update({"lm_head.weight": 1}))
    f = one(run(dcp), "mapping-dangling-tensor")
    assert f.tensor == "lm_head.weight" and MAPPING_FILE in f.message


def test_code_mapping_collapsed(dcp: Path) -> None:
    reference = {
        n: f"model.safetensors-0000{i + 1}-of-00003.safetensors" for i, n in enumerate(DCP_TENSORS)
    }
    (dcp / ".hf_metadata" / INDEX).write_text(json.dumps({"weight_map": reference}))
    f = one(run(dcp), "mapping-collapsed")
    assert f.file == MAPPING_FILE and "names 3 files" in f.message


def test_code_mapping_unreadable(dcp: Path) -> None:
    (dcp / MAPPING_FILE).write_text('{"model.norm.weight": ')
    f = one(run(dcp), "mapping-unreadable")
    assert f.file == MAPPING_FILE


# -- Megatron torch_dist ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def megatron_written(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = write_torch_dist_demo(tmp_path_factory.mktemp("megatron") / "run")
    assert run(folder) == []
    return folder


@pytest.fixture
def megatron(megatron_written: Path, tmp_path: Path) -> Path:
    return private_copy(megatron_written, tmp_path / "run")


def rewrite_metadata(folder: Path, edit) -> None:
    """Re-pickle the real DCP `Metadata` object after `edit(metadata)` changed it in place."""
    import torch.distributed.checkpoint as dcp_api

    meta = dcp_api.FileSystemReader(str(folder)).read_metadata()
    edit(meta)
    (folder / ".metadata").write_bytes(pickle.dumps(meta))


def test_code_torch_dist_metadata_unreadable(megatron: Path) -> None:
    path = megatron / ITER / ".metadata"
    os.truncate(path, path.stat().st_size // 3)
    f = one(run(megatron), "torch-dist-metadata-unreadable")
    assert f.file == f"{ITER}/.metadata"


def test_code_torch_dist_missing_file(megatron: Path) -> None:
    (megatron / ITER / "__0_0.distcp").unlink()
    f = one(run(megatron), "torch-dist-missing-file")
    assert f.file == f"{ITER}/__0_0.distcp" and "missing" in f.message


NORM = "decoder.final_layernorm.weight"


def test_code_torch_dist_chunk_gap(megatron: Path) -> None:
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata

    def halve(meta) -> None:
        entry = meta.state_dict_metadata[NORM]
        (chunk,) = entry.chunks
        entry.chunks[0] = ChunkStorageMetadata(chunk.offsets, torch.Size([chunk.sizes[0] // 2]))

    rewrite_metadata(megatron / ITER, halve)
    f = one(run(megatron), "torch-dist-chunk-gap")
    assert f.tensor == NORM and "16 of the 32 elements" in f.message


def test_code_torch_dist_chunk_overlap(megatron: Path) -> None:
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata

    def add_chunk(meta) -> None:
        meta.state_dict_metadata[NORM].chunks.append(
            ChunkStorageMetadata(torch.Size([8]), torch.Size([8]))
        )

    rewrite_metadata(megatron / ITER, add_chunk)
    f = one(run(megatron), "torch-dist-chunk-overlap")
    assert f.tensor == NORM and "8 elements" in f.message


def test_code_check_budget_exceeded(megatron: Path) -> None:
    """A tensor cut into 4,200 irregular chunks (no grid, no single-axis split, over 4M
    boundary cells) whose volume matches: not proven either way, and said so."""
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata

    def strips(meta) -> None:
        entry = meta.state_dict_metadata[NORM]
        entry.size = torch.Size([4200, 4200])
        entry.chunks[:] = [
            ChunkStorageMetadata(torch.Size(o), torch.Size(s))
            for i in range(2100)
            for o, s in (((2 * i, 0), (2, i + 1)), ((2 * i, i + 1), (2, 4199 - i)))
        ]

    rewrite_metadata(megatron / ITER, strips)
    f = one(run(megatron), "check-budget-exceeded")
    assert f.tensor == NORM and "NOT verified" in f.message and "4,200 listed" in f.message


def test_code_torch_dist_common_drift(tmp_path: Path) -> None:
    folder = write_torch_dist_demo(tmp_path / "run", rerun_drift=True)
    f = one(run(folder), "torch-dist-common-drift")
    assert f.file == f"{ITER}/common.pt" and "rerun_state_machine_state/shard_" in f.message


def test_code_torch_dist_object_incomplete(tmp_path: Path) -> None:
    """megatron-core 0.16.1's own save (the golden fixture, copied), whose `.metadata` then
    lost one rank's `rng_state` shard: the keys declare a grid of 1 x 2 shards."""
    folder = tmp_path / "ckpt"
    shutil.copytree(GOLDEN / "megatron" / "healthy", folder)
    assert run(folder) == []
    lost = "rng_state/shard_0.1_1.2"

    def drop(meta) -> None:
        del meta.state_dict_metadata[lost]
        meta.storage_data = {k: v for k, v in meta.storage_data.items() if k.fqn != lost}

    rewrite_metadata(folder, drop)
    f = one(run(folder), "torch-dist-object-incomplete")
    assert f.file == ".metadata" and f.tensor == lost
    assert "rng_state" in f.message and "1 of 2" in f.message
    assert {x.code for x in run(folder)} == {"torch-dist-object-incomplete"}


def test_code_torch_dist_metadata_json(megatron: Path) -> None:
    (megatron / ITER / "metadata.json").write_text(json.dumps({"sharded_backend": "zarr"}))
    f = one(run(megatron), "torch-dist-metadata-json")
    assert f.file == f"{ITER}/metadata.json" and "zarr" in f.message


def test_code_torch_dist_common_unreadable(megatron: Path) -> None:
    (megatron / ITER / "common.pt").write_bytes(b"PK\x03\x04 not a zip archive")
    f = one(run(megatron), "torch-dist-common-unreadable")
    assert f.file == f"{ITER}/common.pt"


# -- files the checkpoint cannot safely give us ------------------------------------------------


class _CallsOsSystem:
    """Pickles as `os.system(command)`: plain pickle.load / torch.load would run it."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


def test_code_file_unsafe(hf: Path, tmp_path: Path) -> None:
    # A shard moved out of the folder and linked back: never read through the link, and
    # nothing of the target (here a private file) reaches the report.
    secret = tmp_path / "secret.txt"
    secret.write_text("TOKEN=do-not-leak")
    victim = shards(hf)[0]
    (hf / victim).unlink()
    (hf / victim).symlink_to(secret)
    f = one(run(hf), "file-unsafe")
    assert f.file == victim and f.severity == "error"
    assert "outside the checkpoint folder" in f.message and "not read" in f.message
    assert all("do-not-leak" not in g.message for g in run(hf))


def test_code_pickle_hostile(megatron: Path, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    from inspector._internal.demo.torch_dist import (
        RerunState,
        megatron_common_state,
        megatron_pickle_names,
    )

    state = megatron_common_state(world_size=1, rerun_state=RerunState.NOT_RUNNING_YET)
    state["optimizer"] = _CallsOsSystem(f"touch {marker}")
    with megatron_pickle_names():
        torch.save(state, megatron / ITER / "common.pt")
    f = one(run(megatron), "pickle-hostile")
    assert not marker.exists()
    assert f.file == f"{ITER}/common.pt" and "system" in f.message and "nothing ran" in f.message


def test_code_pickle_bomb(megatron: Path) -> None:
    # A 250-byte `.metadata` whose dict key is a tuple shared 40 levels deep through the
    # memo: hashing it would take 2**40 steps.
    body = b")\x94" + b"".join(b"h%ch%c\x86\x94" % (i, i) for i in range(40))
    (megatron / ITER / ".metadata").write_bytes(b"\x80\x04}" + body + b"K\x01s.")
    f = one(run(megatron), "pickle-bomb")
    assert f.file == f"{ITER}/.metadata" and "refused before unpickling" in f.message


def test_code_temp_file_left(hf: Path) -> None:
    # A repair killed between writing the index's temp file and renaming it over the index.
    from inspector._internal.common.filenames import INDEX_NAME
    from inspector._internal.execution.atomic import write_atomic

    pid = os.fork()
    if pid == 0:  # the child dies at the rename, as a SIGKILL would leave it
        os.replace = lambda *args, **kwargs: os._exit(137)  # type: ignore[assignment]
        write_atomic(hf / INDEX_NAME, b'{"weight_map": {}}')
        os._exit(1)
    os.waitpid(pid, 0)
    f = one(run(hf), "temp-file-left")
    assert f.file == f".{INDEX_NAME}.tmp-{pid}" and f.severity == "warning"
    assert "(18 B)" in f.message and "which is gone" in f.message and "--recover" in f.message


# -- what the model code itself would load -------------------------------------------------------


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny untied Llama as transformers' own `save_pretrained` writes it (two shards)."""
    return tiny_llama(tmp_path_factory.mktemp("llama"))


def test_code_load_missing_tensor(llama: Path, tmp_path: Path) -> None:
    folder = resaved(
        llama, tmp_path / "ckpt", lambda s: {k: v for k, v in s.items() if k != "lm_head.weight"}
    )
    assert run(llama) == []  # the healthy save_pretrained output is clean
    (f,) = [f for f in run(folder) if f.code.startswith("load-")]
    assert f.code == "load-missing-tensor" and f.tensor == "lm_head.weight"
    assert "tie_word_embeddings false" in f.message and f.file is None


def test_code_load_unexpected_tensor(llama: Path, tmp_path: Path) -> None:
    extra = "model.layers.1.mlp.router.weight"
    folder = resaved(llama, tmp_path / "ckpt", lambda s: {**s, extra: bf16(4, 16)})
    (f,) = [f for f in run(folder) if f.code.startswith("load-")]
    assert f.code == "load-unexpected-tensor" and f.tensor == extra and f.layer == 1
    assert f.file in shards(folder) and "LlamaForCausalLM does not load" in f.message


def test_code_load_shape_mismatch(llama: Path, tmp_path: Path) -> None:
    embed = "model.embed_tokens.weight"
    folder = resaved(llama, tmp_path / "ckpt", lambda s: {**s, embed: bf16(72, 16)})
    (f,) = [f for f in run(folder) if f.code.startswith("load-")]
    assert f.code == "load-shape-mismatch" and f.tensor == embed
    assert "stored as [72, 16]" in f.message and "expects [64, 16]" in f.message


# -- tensor data (check --deep) -------------------------------------------------------------------


def test_code_tensor_all_zero(tmp_path: Path) -> None:
    folder = write_single(
        tmp_path / "z",
        dense_model(1)
        | {"model.layers.0.mlp.up_proj.weight": torch.zeros(H, H, dtype=torch.bfloat16)},
    )
    assert "tensor-all-zero" not in {f.code for f in run(folder)}  # needs the data
    f = one(run(folder, deep=True), "tensor-all-zero")
    assert f.tensor == "model.layers.0.mlp.up_proj.weight" and "all zeros" in f.message


def test_code_tensor_nonfinite(tmp_path: Path) -> None:
    bad = bf16(H, H)
    bad[3, 4] = float("nan")
    folder = write_single(
        tmp_path / "n", dense_model(1) | {"model.layers.0.mlp.up_proj.weight": bad}
    )
    f = one(run(folder, deep=True), "tensor-nonfinite")
    assert f.tensor == "model.layers.0.mlp.up_proj.weight" and "BF16" in f.message


def _duplicated(tmp_path: Path, second: torch.Tensor) -> Path:
    folder = write_hf(tmp_path / "d", dense_model())
    owner = load_json(folder / INDEX)["weight_map"]["model.norm.weight"]
    other = next(s for s in shards(folder) if s != owner)
    save_file(load_file(str(folder / other)) | {"model.norm.weight": second}, str(folder / other))
    return folder


def test_code_duplicate_tensor_content(tmp_path: Path) -> None:
    folder = _duplicated(tmp_path, bf16(H, seed=123))
    f = one(run(folder, deep=True), "duplicate-tensor-content")
    assert f.tensor == "model.norm.weight" and "DIFFERENT bytes" in f.message


def test_code_duplicate_tensor_identical(tmp_path: Path) -> None:
    folder = _duplicated(tmp_path, dense_model()["model.norm.weight"])
    findings = run(folder, deep=True)
    f = one(findings, "duplicate-tensor-identical")
    assert f.tensor == "model.norm.weight" and "the same bytes" in f.message
    assert "duplicate-tensor-content" not in {x.code for x in findings}


# -- PyTorch .bin files (torch.save wrote them; tests/test_pytorch_bin.py has more) -----------


def test_code_bin_legacy_format() -> None:
    f = one(run(GOLDEN / "torch-save" / "legacy-non-zip"), "bin-legacy-format")
    assert f.file == "pytorch_model.bin" and "weights_only=True" in f.message


def test_code_bin_unreadable(tmp_path: Path) -> None:
    torch.save({"w": bf16(2, 2)}, tmp_path / "pytorch_model.bin")
    data = (tmp_path / "pytorch_model.bin").read_bytes()
    (tmp_path / "pytorch_model.bin").write_bytes(data[: len(data) // 2])
    f = one(run(tmp_path), "bin-unreadable")
    assert f.file == "pytorch_model.bin" and "zip" in f.message


def test_code_bin_record_missing(tmp_path: Path) -> None:
    import zipfile

    torch.save({"a": bf16(2, 2), "b": bf16(3, 2)}, tmp_path / "src.bin")
    with (
        zipfile.ZipFile(tmp_path / "src.bin") as zin,
        zipfile.ZipFile(tmp_path / "pytorch_model.bin", "w") as zout,
    ):
        for info in zin.infolist():
            if not info.filename.endswith("/data/1"):
                zout.writestr(info.filename, zin.read(info))
    (tmp_path / "src.bin").unlink()
    f = one(run(tmp_path), "bin-record-missing")
    assert f.tensor == "b" and "data/1" in f.message


# -- compressed-tensors (llm-compressor wrote them; tests/test_compressed_tensors.py has more) -


def test_code_quant_scheme_mismatch() -> None:
    f = one(run(GOLDEN / "llmcompressor" / "targeted-module-unquantized"), "quant-scheme-mismatch")
    assert "model.layers.0.mlp" in f.message and "weight_packed" in f.message


def test_code_quant_recipe_mismatch() -> None:
    f = one(run(GOLDEN / "llmcompressor" / "recipe-ignore-drift"), "quant-recipe-mismatch")
    assert f.file == "recipe.yaml" and "model.layers.0.mlp.down_proj" in f.message


def test_code_quant_pattern_refused(tmp_path: Path) -> None:
    """An `re:` ignore entry with a lookahead: RE2 cannot run it, so the modules it could
    ignore are not judged (tests/test_compressed_tensors.py has the hostile cases)."""
    folder = tmp_path / "m"
    shutil.copytree(GOLDEN / "llmcompressor" / "fp8-dynamic", folder)
    config = json.loads((folder / CONFIG_NAME).read_text())
    config["quantization_config"]["ignore"].append(r"re:.*(?=self_attn)self_attn\.q_proj$")
    (folder / CONFIG_NAME).write_text(json.dumps(config))
    f = one(run(folder), "quant-pattern-refused")
    assert f.file == CONFIG_NAME and "invalid perl operator" in f.message
    assert "NOT checked" in f.message and "q_proj" in f.message


# -- GGUF (gguf's GGUFWriter wrote them; tests/test_gguf.py has more) --------------------------


def test_code_gguf_unreadable(tmp_path: Path) -> None:
    data = (GOLDEN / "gguf" / "single" / "tiny-qwen3moe-Q4_0.gguf").read_bytes()
    (tmp_path / "m.gguf").write_bytes(data[:1000])  # cut inside the metadata
    f = one(run(tmp_path), "gguf-unreadable")
    assert f.file == "m.gguf" and "truncated" in f.message


def test_code_gguf_unknown_type(tmp_path: Path) -> None:
    src = GOLDEN / "gguf" / "single" / "tiny-qwen3moe-Q4_0.gguf"
    data = bytearray(src.read_bytes())
    # token_embd.weight's type (Q8_0 = 8) becomes 4, the removed Q4_2.
    at = data.index(b"token_embd.weight") + len("token_embd.weight") + 4 + 2 * 8
    assert struct.unpack_from("<I", data, at)[0] == 8
    struct.pack_into("<I", data, at, 4)
    (tmp_path / "m.gguf").write_bytes(bytes(data))
    f = one(run(tmp_path), "gguf-unknown-type")
    assert "token_embd.weight" in f.message and "type id 4" in f.message


def test_code_gguf_split_missing() -> None:
    f = one(run(GOLDEN / "gguf" / "split-part-missing"), "gguf-split-missing")
    assert "tiny-qwen3moe-Q4_0-00002-of-00003.gguf" in f.message


def test_code_gguf_split_tensor_count_mismatch() -> None:
    folder = GOLDEN / "gguf" / "split-tensor-count-mismatch"
    f = one(run(folder), "gguf-split-tensor-count-mismatch")
    assert "27" in f.message and "26" in f.message


def test_code_gguf_split_inconsistent(tmp_path: Path) -> None:
    """Part 2 renamed to part 3's number and part 3 dropped: its split.no says 1."""
    split = GOLDEN / "gguf" / "split"
    for n in (1, 2):
        shutil.copy(split / f"tiny-qwen3moe-Q4_0-0000{n}-of-00003.gguf", tmp_path)
    (tmp_path / "tiny-qwen3moe-Q4_0-00002-of-00003.gguf").rename(
        tmp_path / "tiny-qwen3moe-Q4_0-00003-of-00003.gguf"
    )
    f = one(run(tmp_path), "gguf-split-inconsistent")
    assert "split.no 1, expected 2" in f.message


def test_code_tensor_uninitialised(tmp_path: Path) -> None:
    # Never-written memory: arbitrary bit patterns where the other layers hold weights.
    garbage = torch.randint(-(2**15), 2**15, (H, H), generator=torch.Generator().manual_seed(3))
    state = dense_model(4) | {
        "model.layers.2.mlp.down_proj.weight": garbage.to(torch.int16).view(torch.bfloat16)
    }
    folder = write_single(tmp_path / "u", state)
    assert "tensor-uninitialised" not in {f.code for f in run(folder, deep=True)}
    f = one(check(scan(folder), values="full"), "tensor-uninitialised")
    assert f.tensor == "model.layers.2.mlp.down_proj.weight" and "siblings" in f.message


def test_code_tensor_values_outlier(tmp_path: Path) -> None:
    state = dense_model(4)
    state["model.layers.1.self_attn.q_proj.weight"] = (
        state["model.layers.1.self_attn.q_proj.weight"].float() * 1000
    ).to(torch.bfloat16)
    folder = write_single(tmp_path / "o", state)
    for mode in ("sample", "full"):
        f = one(check(scan(folder), values=mode), "tensor-values-outlier")
        assert f.tensor == "model.layers.1.self_attn.q_proj.weight" and "above" in f.message


def test_code_tensor_unreadable(tmp_path: Path) -> None:
    # The shard is replaced after the scan by something that is not a file.
    folder = write_single(tmp_path / "r", dense_model(2))
    scanned = scan(folder)
    shard = next(folder.glob("*.safetensors"))
    shard.unlink()
    shard.mkdir()
    f = one(check(scanned, values="sample", model=False), "tensor-unreadable")
    assert f.file == shard.name and "could not be read" in f.message


# -- content against a source (verify) ----------------------------------------------------------


def verified(folder: Path, level: str = "hash", against: Path | None = None) -> list[Finding]:
    return list(
        verify(folder, level=level, against=None if against is None else str(against)).findings
    )


def test_code_file_size_mismatch(hf: Path) -> None:
    write_manifest(hf)
    victim = shards(hf)[0]
    data = (hf / victim).read_bytes()
    (hf / victim).write_bytes(data[:-100])
    f = one(verified(hf, "size"), "file-size-mismatch")
    assert f.file == victim and f"{len(data):,} bytes" in f.message


def test_code_file_hash_mismatch(hf: Path) -> None:
    write_manifest(hf)
    victim = shards(hf)[1]
    data = bytearray((hf / victim).read_bytes())
    data[-10] ^= 0x40  # one flipped bit in the last tensor's bytes: same size
    (hf / victim).write_bytes(data)
    assert run(hf) == [] and verified(hf, "size") == []
    f = one(verified(hf), "file-hash-mismatch")
    assert f.file == victim and "same size, different bytes" in f.message


def test_code_file_missing_vs_source(hf: Path) -> None:
    write_manifest(hf)
    (hf / INDEX).unlink()
    assert one(verified(hf, "size"), "file-missing-vs-source").file == INDEX


def test_code_file_extra_vs_source(hf: Path) -> None:
    write_manifest(hf)
    (hf / "README.md").write_text("# notes\n")
    f = one(verified(hf, "size"), "file-extra-vs-source")
    assert f.file == "README.md" and f.severity == "warning"


def test_code_file_not_verified(hf: Path, hub_server: FakeHub) -> None:
    """The Hub stand-in's listing without `lfs.oid` for one shard: its size matches, its
    bytes are not compared, and that is said."""
    victim = shards(hf)[0]

    def no_checksum(item: dict) -> dict:
        if item["path"] == victim:
            item.pop("lfs")
            item.pop("oid")
        return item

    with hub_server.serving({"org/hf": {"main": ("c" * 40, hf)}}, entry=no_checksum) as hub:
        options = {"endpoint": hub.url, "token": False}
        result = verify(hf, against="hf://org/hf", storage_options=options)
    f = one(list(result.findings), "file-not-verified")
    assert f.file == victim and f.severity == "warning" and "not compared" in f.message
    assert result.ok and not result.all_match


def test_code_tensor_hash_mismatch(hf: Path, tmp_path: Path) -> None:
    manifest = write_manifest(hf)
    sd = dense_model()
    sd["model.layers.1.mlp.down_proj.weight"] = sd["model.layers.1.mlp.down_proj.weight"] * 2
    other = write_hf(tmp_path / "other", sd, shard=300)  # the writer again, sharded otherwise
    f = one(verified(other, "tensor", against=manifest), "tensor-hash-mismatch")
    assert f.tensor == "model.layers.1.mlp.down_proj.weight" and f.layer == 1
    assert [g.code for g in verified(other, "tensor", against=manifest)] == [f.code]


def test_code_tensor_missing_vs_source(hf: Path, tmp_path: Path) -> None:
    sd = dense_model()
    del sd["model.norm.weight"]
    other = write_hf(tmp_path / "other", sd)
    f = one(verified(other, "tensor", against=hf), "tensor-missing-vs-source")
    assert f.tensor == "model.norm.weight"


def test_code_tensor_extra_vs_source(hf: Path, tmp_path: Path) -> None:
    sd = dense_model()
    sd["model.extra.weight"] = bf16(H)
    other = write_hf(tmp_path / "other", sd)
    f = one(verified(other, "tensor", against=hf), "tensor-extra-vs-source")
    assert f.tensor == "model.extra.weight" and f.severity == "warning"


def test_code_manifest_unreadable(hf: Path) -> None:
    (hf / MANIFEST_NAME).write_text(
        '{"format": "checkpoint-inspector-manifest", "version": 1, '
        '"files": {"../outside": {"size": 1}}}'
    )
    f = one(verified(hf), "manifest-unreadable")
    assert f.file == MANIFEST_NAME and "inside the checkpoint folder" in f.message


# -- serving: parallel plans and memory per GPU (fit) ----------------------------------------
# The demo MoE (transformers-named DeepSeek-V3 layout: 2 heads, 8 experts of intermediate size
# 16 in NVFP4, an MTP layer) and a small Llama written with huggingface_hub's writer.

FIT_DEMO = "healthy-hf-sharded"


def fit_codes(folder: Path, **options: object) -> list[Finding]:
    return [f for plan in fit(scan(folder), **options).plans for f in plan.findings]


@pytest.fixture
def gqa(tmp_path: Path) -> Path:
    """12 attention heads and 6 KV heads of 4."""
    sd = {"model.embed_tokens.weight": bf16(32, 48)}
    for layer in range(2):
        p = f"model.layers.{layer}"
        sd[f"{p}.self_attn.q_proj.weight"] = bf16(48, 48)
        sd[f"{p}.self_attn.k_proj.weight"] = bf16(24, 48)
        sd[f"{p}.self_attn.v_proj.weight"] = bf16(24, 48)
        sd[f"{p}.self_attn.o_proj.weight"] = bf16(48, 48)
    config = {
        "model_type": "llama",
        "num_hidden_layers": 2,
        "hidden_size": 48,
        "num_attention_heads": 12,
        "num_key_value_heads": 6,
        "vocab_size": 32,
    }
    return write_hf(tmp_path / "gqa", sd, config=config)


def test_code_parallel_heads_indivisible(demo_checkpoints: Path) -> None:
    f = one(fit_codes(demo_checkpoints / FIT_DEMO, tp=4, ep=4), "parallel-heads-indivisible")
    assert "TP 4 does not divide the 2 attention heads" in f.message


def test_code_parallel_kv_heads_indivisible(gqa: Path) -> None:
    f = one(fit_codes(gqa, tp=4), "parallel-kv-heads-indivisible")
    assert "4 does not divide 6" in f.message


def test_code_parallel_kv_heads_replicated(gqa: Path) -> None:
    f = one(fit_codes(gqa, tp=12), "parallel-kv-heads-replicated")
    assert f.severity == "info" and "replicated on 2 ranks" in f.message


def test_code_parallel_block_misaligned(demo_checkpoints: Path) -> None:
    # The experts' intermediate size 16 over TP 2 is 8 per rank: half an NVFP4 group.
    f = one(fit_codes(demo_checkpoints / FIT_DEMO, tp=2), "parallel-block-misaligned")
    assert "8 per rank" in f.message and "NVFP4" in f.message
    assert fit_codes(demo_checkpoints / FIT_DEMO, tp=2, ep=2) == []


def test_code_parallel_experts_indivisible(demo_checkpoints: Path) -> None:
    found = fit_codes(demo_checkpoints / FIT_DEMO, tp=16, ep=16)
    f = one(found, "parallel-experts-indivisible")
    assert "EP 16 does not divide the 8 routed experts" in f.message


def test_code_parallel_stages_exceed_layers(demo_checkpoints: Path) -> None:
    f = one(fit_codes(demo_checkpoints / FIT_DEMO, tp=1, pp=8), "parallel-stages-exceed-layers")
    assert "4 decoder layers" in f.message


def test_code_parallel_mtp_last_stage(demo_checkpoints: Path) -> None:
    f = one(fit_codes(demo_checkpoints / FIT_DEMO, tp=1, pp=2), "parallel-mtp-last-stage")
    assert f.severity == "info" and "last of the 2 stages" in f.message


def test_code_fit_weights_exceed_gpu(demo_checkpoints: Path) -> None:
    # Half a GiB leaves nothing after the engine's own estimate.
    f = one(fit_codes(demo_checkpoints / FIT_DEMO, tp=1, gpu_memory=0.5), "fit-weights-exceed-gpu")
    assert "the engine may use" in f.message


def test_code_fit_context_exceeds_gpu(demo_checkpoints: Path) -> None:
    found = fit_codes(demo_checkpoints / FIT_DEMO, tp=1, gpu_memory=1.5, context=10**9)
    f = one(found, "fit-context-exceeds-gpu")
    assert "1,000,000,000 tokens (asked)" in f.message and "--max-model-len" in f.message


def test_code_fit_config_invalid(demo_checkpoints: Path, tmp_path: Path) -> None:
    folder = Path(shutil.copytree(demo_checkpoints / FIT_DEMO, tmp_path / "c"))
    edit_json(folder / CONFIG_NAME, lambda c: c.update(num_attention_heads="2"))
    f = one(fit_codes(folder, tp=1), "fit-config-invalid")
    assert 'num_attention_heads "2" is not a whole number' in f.message


# -- serving engines: what vLLM and llama.cpp would load ---------------------------------------
# GGUF files by gguf-py's GGUFWriter, drafts and tied heads by safetensors (tests/engine_cases.py;
# tests/test_engines.py has more).


def test_code_gguf_tensor_missing(tmp_path: Path) -> None:
    write_llama_gguf(tmp_path, block_count=3, blocks=(0,))
    f = one(run(tmp_path), "gguf-tensor-missing")
    assert "declares 3 blocks" in f.message and "blocks 1-2" in f.message


def test_code_gguf_tensor_unexpected(tmp_path: Path) -> None:
    write_llama_gguf(tmp_path, extra=("blk.0.attn_qkv_lora.weight",))
    f = one(run(tmp_path), "gguf-tensor-unexpected")
    assert f.tensor == "blk.0.attn_qkv_lora.weight" and "wrong number of tensors" in f.message


def test_code_gguf_convert_unmapped(llama: Path, tmp_path: Path) -> None:
    extra = "model.layers.0.self_attn.rope_alpha.weight"
    folder = resaved(llama, tmp_path / "ckpt", lambda s: {**s, extra: bf16(4)})
    f = one(engine_check(scan(folder), engine="llama.cpp").findings, "gguf-convert-unmapped")
    assert f.tensor == extra and "Can not map tensor" in f.message
    assert engine_check(scan(llama), engine="llama.cpp").findings == ()


def test_code_tied_head_differs(llama: Path, tmp_path: Path) -> None:
    def tie(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {**state, "lm_head.weight": state["model.embed_tokens.weight"].clone()}

    same = resaved(llama, tmp_path / "same", tie)
    edit_json(same / CONFIG_NAME, lambda c: c.update(tie_word_embeddings=True))
    assert [f.code for f in run(same) if f.code == "tied-head-differs"] == []
    other = resaved(llama, tmp_path / "other", lambda s: s)  # save_pretrained's own head
    edit_json(other / CONFIG_NAME, lambda c: c.update(tie_word_embeddings=True))
    f = one(run(other), "tied-head-differs")
    assert f.tensor == "lm_head.weight" and "sampled windows" in f.message


def test_code_draft_target_mismatch(tmp_path: Path) -> None:
    draft = write_eagle3(tmp_path / "draft", hidden=16)
    target = write_eagle3(tmp_path / "target", hidden=32)
    f = one(fit_codes(draft, tp=1, target=scan(target)), "draft-target-mismatch")
    assert "hidden size is 16, the target's 32" in f.message


def test_code_draft_mapping_invalid(tmp_path: Path) -> None:
    folder = write_eagle3(tmp_path, d2t=torch.full((32,), -5, dtype=torch.int64))
    f = one(run(folder), "draft-mapping-invalid")
    assert "outside the 64-token vocabulary" in f.message and f.tensor == "d2t"


def test_code_draft_head_from_target(tmp_path: Path) -> None:
    f = one(run(write_eagle3(tmp_path, head=False)), "draft-head-from-target")
    assert "no output head" in f.message


# vLLM's own weight loading (the [vllm] extra; skipped without it): one child process answers
# for every case of tests/vllm_cases.py (tests/test_engines.py compares them with vLLM's real
# load).


def vllm_finding(vllm_cases: dict[str, dict], case: str, code: str) -> Finding:
    verdict = EngineVerdict.from_answer(vllm_cases[case]["ours"], tp=1)
    return one(verdict_findings(verdict), code)


def test_code_engine_weight_unmapped(vllm_cases: dict[str, dict]) -> None:
    f = vllm_finding(vllm_cases, "extra-tensor", "engine-weight-unmapped")
    assert "There is no module or parameter named 'layers.0.self_attn.rope_alpha'" in f.message


def test_code_engine_shape_mismatch(vllm_cases: dict[str, dict]) -> None:
    f = vllm_finding(vllm_cases, "oversized", "engine-shape-mismatch")
    assert "16,384 elements, more than its 8,192" in f.message


def test_code_engine_weight_missing(vllm_cases: dict[str, dict]) -> None:
    f = vllm_finding(vllm_cases, "fp8-drop-o_proj", "engine-weight-missing")
    assert "o_proj.weight" in f.message and "vLLM itself does not check" in f.message


def test_code_engine_load_failed(vllm_cases: dict[str, dict]) -> None:
    f = vllm_finding(vllm_cases, "fp8-renamed-scale", "engine-load-failed")
    assert "AttributeError" in f.message


def test_code_engine_quant_unsupported(demo_checkpoints: Path) -> None:
    f = one(
        fit_codes(demo_checkpoints / FIT_DEMO, tp=1, gpu="V100-32GB"), "engine-quant-unsupported"
    )
    assert "NVFP4" in f.message and "7.0" in f.message


def test_code_engine_quant_fallback(demo_checkpoints: Path) -> None:
    f = one(fit_codes(demo_checkpoints / FIT_DEMO, tp=1, gpu="H100-80GB"), "engine-quant-fallback")
    assert "FP4 Marlin" in f.message
    assert [p for p in fit(scan(demo_checkpoints / FIT_DEMO), tp=1, gpu="B200").plans[0].findings
            if p.code.startswith("engine-")] == []  # fmt: skip


# -- the contract: every code has its test ----------------------------------------------------


def _findings_md_codes() -> set[str]:
    return set(re.findall(r"^\| `([a-z0-9-]+)` \|", FINDINGS_MD.read_text(), flags=re.M))


def test_every_code_has_a_test() -> None:
    tested = {
        name.removeprefix("test_code_").replace("_", "-")
        for name in dir(sys.modules[__name__])
        if name.startswith("test_code_")
    }
    assert set(CODES) - tested == set()
    assert tested - set(CODES) == set()  # a test for a code that does not exist is stale


def test_every_findings_md_code_is_registered_and_tested() -> None:
    documented = _findings_md_codes()
    assert len(documented) >= 40
    assert documented == set(CODES)


def test_findings_md_is_generated_from_the_code_table() -> None:
    """docs/findings.md is `codes_markdown()`: regenerate it with `make docs`."""
    assert FINDINGS_MD.read_text() == codes_markdown()
