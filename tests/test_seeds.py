"""Regression tests named after the seed bugs (docs/formats.md), each checkpoint built
with the real writer and damaged the way the original bug damaged it, then run through the
full `inspector._internal.checks.check()`. Plus the classic index drifts of a sharded checkpoint."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
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
from safetensors.torch import save_file

from inspector._internal.checks import check
from inspector._internal.common.filenames import CONFIG_NAME, QUANT_CONFIG_NAME
from inspector._internal.demo.dcp import write_rank_files
from inspector._internal.demo.torch_dist import (
    RerunState,
    megatron_common_state,
    megatron_pickle_names,
    save_megatron_dcp,
)
from inspector._internal.findings.finding import Finding
from inspector._internal.scan.entry import scan

HIDDEN = 8


def run(folder: Path, *, model: bool = True) -> list[Finding]:
    return check(scan(folder), model=model)


def codes(findings: list[Finding]) -> set[str]:
    return {f.code for f in findings}


def of(findings: list[Finding], code: str) -> list[Finding]:
    return [f for f in findings if f.code == code]


def bf16(*shape: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=gen).to(torch.bfloat16)


# -- modelopt-1422: sidecar and index computed before the MTP tensors were appended --------


def test_modelopt_1422_sidecar_missing_mtp(tmp_path: Path) -> None:
    layers = 3
    mtp = mtp_tensors()
    folder = write_modelopt_export(
        tmp_path / "export", tiny_layer_state_dicts(layers), late={layers: mtp}
    )
    last = shard_name(layers, layers)
    findings = run(folder)
    assert codes(findings) == {
        "sidecar-unlisted-tensor",
        "unindexed-tensor",
        "sidecar-total-size-mismatch",
        "total-size-mismatch",
    }
    # Both totals leave out exactly the bytes of the unlisted MTP tensors, and say so.
    mtp_bytes = sum(t.numel() * t.element_size() for t in mtp.values())
    for code in ("sidecar-total-size-mismatch", "total-size-mismatch"):
        (total,) = of(findings, code)
        assert f"-{mtp_bytes:,}" in total.message
    unlisted = of(findings, "sidecar-unlisted-tensor")
    assert {f.tensor for f in unlisted} == set(mtp)
    for f in unlisted:
        assert f.file in (last, f"{last}.json")
        assert last in f.message and f"{last}.json" in f.message
        assert "missing from the merged index too" in f.message
    unindexed = of(findings, "unindexed-tensor")
    assert {f.tensor for f in unindexed} == set(mtp)
    assert all(INDEX in f.message and last in f.message for f in unindexed)
    # The same export without the late mutation is clean: the drift is the cause.
    assert run(write_modelopt_export(tmp_path / "ok", tiny_layer_state_dicts(layers))) == []


# -- modelopt-1631: EP ranks wrote local expert ids, config.json rewritten concurrently ------

EXPERTS, EP_SIZE = 512, 8
LOCAL = EXPERTS // EP_SIZE


def _ep_export_layer(layer: int, *, ep_bug: bool) -> dict[str, torch.Tensor]:
    """One MoE layer as the exporter assembles it from EP ranks. Expert weights are FP8 with a
    per-tensor scale. With `ep_bug` each rank keys its experts by LOCAL id, so ranks overwrite
    each other and the last rank's 64 experts survive under ids 0-63."""
    p = f"model.layers.{layer}"
    sd = {
        f"{p}.input_layernorm.weight": bf16(HIDDEN),
        f"{p}.self_attn.qkv_proj.weight": bf16(3 * HIDDEN, HIDDEN),
        # The router is replicated: it always has one row per declared expert.
        f"{p}.mlp.gate.weight": bf16(EXPERTS, HIDDEN),
    }
    for rank in range(EP_SIZE):
        for local in range(LOCAL):
            expert = local if ep_bug else rank * LOCAL + local
            for proj in ("up_proj", "down_proj"):
                base = f"{p}.mlp.experts.{expert}.{proj}"
                sd[f"{base}.weight"] = torch.zeros(HIDDEN, HIDDEN).to(torch.float8_e4m3fn)
                sd[f"{base}.weight_scale"] = torch.tensor(1.0 + rank)
    return sd


def _quant_config(expert_ids: range, layers: int) -> dict:
    quantized = {
        f"model.layers.{layer}.mlp.experts.{e}.{proj}": {"quant_algo": "FP8"}
        for layer in range(layers)
        for e in expert_ids
        for proj in ("up_proj", "down_proj")
    }
    return {
        "producer": {"name": "modelopt", "version": "0.0.0"},
        "quantization": {
            "quant_algo": "MIXED_PRECISION",
            "quantized_layers": quantized,
            "exclude_modules": ["lm_head", "model.embed_tokens", "*self_attn*", "*mlp.gate"],
        },
    }


def _ep_config(layers: int) -> dict:
    return {
        "model_type": "deepseek_v3",
        "num_hidden_layers": layers,
        "n_routed_experts": EXPERTS,
        "first_k_dense_replace": 0,
        "moe_layer_freq": 1,
        "hidden_size": HIDDEN,
        "quantization_config": {"quant_method": "modelopt", "quant_algo": "MIXED_PRECISION"},
        "architectures": ["DeepseekV3ForCausalLM"],
        "torch_dtype": "bfloat16",
    }


def _write_ep_export(folder: Path, *, ep_bug: bool, layers: int = 3) -> Path:
    state = {layer + 1: _ep_export_layer(layer, ep_bug=ep_bug) for layer in range(layers)}
    state[1]["model.embed_tokens.weight"] = bf16(32, HIDDEN)
    state[layers]["lm_head.weight"] = bf16(32, HIDDEN)
    write_modelopt_export(folder, state, config=_ep_config(layers))
    # The exporter wrote quantized_layers from what it saw: the experts that survived.
    ids = range(LOCAL) if ep_bug else range(EXPERTS)
    save_json(folder / QUANT_CONFIG_NAME, _quant_config(ids, layers))
    return folder


def test_modelopt_1631_ep_collision(tmp_path: Path) -> None:
    layers = 3
    folder = _write_ep_export(tmp_path / "export", ep_bug=True, layers=layers)
    # Several ranks rewrote config.json at once: a reader saw the first part of the text.
    text = (folder / CONFIG_NAME).read_text()
    cut = text.index('"quantization_config"') + 30
    (folder / CONFIG_NAME).write_text(text[:cut])
    findings = run(folder)
    assert codes(findings) == {"expert-missing", "config-unreadable"}
    (unreadable,) = of(findings, "config-unreadable")
    assert unreadable.file == CONFIG_NAME and "not valid JSON" in unreadable.message
    # The structure is salvaged from the readable part of the truncated config.
    assert "num_hidden_layers=3" in unreadable.message
    assert "n_routed_experts=512" in unreadable.message
    missing = of(findings, "expert-missing")
    assert [f.layer for f in missing] == list(range(layers))
    for f in missing:
        assert "experts 64-511 missing (448 of 512" in f.message
        assert f.file == shard_name(f.layer + 1, layers) and f.file in f.message
    # Negative control: the fixed exporter (global ids, complete config) is clean. Its toy
    # layers (qkv_proj attention, 8 wide) stand in for DeepSeek-V3's, so the load verdict of
    # the config's architecture is left out (tests/test_model_load.py covers that rule).
    fixed = _write_ep_export(tmp_path / "fixed", ep_bug=False, layers=layers)
    assert run(fixed, model=False) == []


def test_modelopt_1631_config_cut_before_the_expert_count(tmp_path: Path) -> None:
    """The race cut config.json before its expert count: the replicated router still has a
    row per expert, so every layer's lost experts are seen, and the finding says the router
    set the expectation. Without routers, the layer holding the most experts sets it."""
    layers = 2
    folder = _write_ep_export(tmp_path / "export", ep_bug=True, layers=layers)
    (folder / CONFIG_NAME).write_text('{"model_type": "deepseek_v3", "num_hidden_la')
    missing = of(run(folder, model=False), "expert-missing")
    assert [f.layer for f in missing] == list(range(layers))
    for f in missing:
        assert "experts 64-511 missing (448 of 512; the layer's router weight has 512 rows" in (
            f.message
        )
    # No router and no expert count: the sibling holding the most experts sets it.
    state = {k: v for k, v in _ep_export_layer(0, ep_bug=False).items() if "mlp.gate." not in k}
    state |= {k: v for k, v in _ep_export_layer(1, ep_bug=True).items() if "mlp.gate." not in k}
    siblings = tmp_path / "siblings"
    siblings.mkdir()
    save_torch_state_dict(state, siblings, max_shard_size="50MB")
    (lost,) = of(run(siblings, model=False), "expert-missing")
    assert lost.layer == 1
    assert "experts 64-511 missing (448 of 512; its sibling layers hold experts up to id 511)" in (
        lost.message
    )


# -- automodel-2289: non-standard upstream names all parsed as output file 1 ---------------

REFERENCE_FILES = [f"model.safetensors-{i:05d}-of-00003.safetensors" for i in range(1, 4)]


def _buggy_output_index(file: str) -> int:
    """The pre-fix parser: the number after the first 'model' token; for
    'model.safetensors-00002-of-00003.safetensors' that token is followed by nothing numeric
    and the default 1 is used."""
    match = re.match(r"model-(\d+)", file)
    return int(match.group(1)) if match else 1


def _fixed_output_index(file: str) -> int:
    match = re.search(r"-(\d+)-of-(\d+)\.safetensors$", file)
    assert match is not None
    return int(match.group(1))


def _write_dcp_run(folder: Path, parse) -> Path:
    """Rank files as DCP's HuggingFaceStorageWriter writes them on 2 ranks, with the mapping
    derived from the upstream HF index by `parse`, and NeMo's `.hf_metadata/`."""
    tensors: dict[str, torch.Tensor] = {"model.embed_tokens.weight": bf16(32, HIDDEN, seed=1)}
    reference: dict[str, str] = {"model.embed_tokens.weight": REFERENCE_FILES[0]}
    for layer in range(2):
        for part in ("q_proj", "o_proj"):
            name = f"model.layers.{layer}.self_attn.{part}.weight"
            tensors[name] = bf16(HIDDEN, HIDDEN, seed=layer + 2)
            reference[name] = REFERENCE_FILES[layer]
    tensors["model.norm.weight"] = bf16(HIDDEN, seed=9)
    tensors["lm_head.weight"] = bf16(32, HIDDEN, seed=10)
    reference |= dict.fromkeys(("model.norm.weight", "lm_head.weight"), REFERENCE_FILES[2])
    mapping = {name: parse(file) for name, file in reference.items()}
    folder.mkdir(parents=True)
    write_rank_files(folder, tensors, dict.fromkeys(tensors, 0), mapping, ranks=2)
    meta = folder / ".hf_metadata"
    meta.mkdir()
    (meta / "fqn_to_file_index_mapping.json").write_text(json.dumps(mapping, indent=2))
    index = {"metadata": {"total_size": 0}, "weight_map": reference}
    (meta / INDEX).write_text(json.dumps(index))
    config = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": HIDDEN}
    (meta / CONFIG_NAME).write_text(json.dumps(config))
    return folder


def test_automodel_2289_collapsed_consolidation(tmp_path: Path) -> None:
    folder = _write_dcp_run(tmp_path / "collapsed", _buggy_output_index)
    scanned = scan(folder)
    assert scanned.layout == "dcp-sharded"
    # Every rank wrote a single output file: the collapse is visible in the file names too.
    assert {s.file for s in scanned.shards} == {
        "shard-00001-model-00001-of-00001.safetensors",
        "shard-00002-model-00001-of-00001.safetensors",
    }
    findings = check(scanned)
    assert codes(findings) == {"mapping-collapsed"}
    (collapsed,) = findings
    assert collapsed.file == ".hf_metadata/fqn_to_file_index_mapping.json"
    assert "all 7 tensors to output file 1" in collapsed.message
    assert "names 3 files" in collapsed.message and REFERENCE_FILES[0] in collapsed.message
    assert "a single file instead of 3" in collapsed.message
    # The fixed parser keeps the upstream file count and nothing is reported.
    fixed = scan(_write_dcp_run(tmp_path / "fixed", _fixed_output_index))
    assert len({s.file.rpartition("-model-")[2] for s in fixed.shards}) == 3
    assert check(fixed) == []


# -- megatron-4448: common state says rerun active, .metadata has no rerun shards ----------


def _write_megatron(folder: Path, *, rerun_shards: list[int], world_size: int) -> Path:
    state: dict[str, object] = {
        "embedding.word_embeddings.weight": bf16(32, HIDDEN),
        "decoder.layers.self_attention.linear_qkv.weight": bf16(2, 3 * HIDDEN, HIDDEN),
        "decoder.final_layernorm.weight": bf16(HIDDEN),
    }
    for rank in rerun_shards:
        blob = _blob({"rerun_requested": False})
        state[f"rerun_state_machine_state/shard_{rank}_{world_size}"] = blob
    iter_dir = folder / "iter_0000100"
    iter_dir.mkdir(parents=True)
    save_megatron_dcp(state, iter_dir)
    common = megatron_common_state(
        world_size=world_size, rerun_state=RerunState.WILL_RERUN_FROM_CHECKPOINT
    )
    with megatron_pickle_names():
        torch.save(common, iter_dir / "common.pt")
    (folder / "latest_checkpointed_iteration.txt").write_text("100")
    return folder


def _blob(data: object):
    import io

    buffer = io.BytesIO()
    torch.save([data], buffer)
    buffer.seek(0)
    return buffer


def test_megatron_4448_rerun_state_drift(tmp_path: Path) -> None:
    folder = _write_megatron(tmp_path / "drift", rerun_shards=[], world_size=1)
    findings = run(folder)
    assert codes(findings) == {"torch-dist-common-drift"}
    (drift,) = findings
    assert drift.file == "iter_0000100/common.pt"
    assert "WILL_RERUN_FROM_CHECKPOINT" in drift.message
    assert "rerun_state_machine_state/shard_" in drift.message
    assert "iter_0000100/.metadata" in drift.message
    # Only some ranks' shards (fewer than the world size) is the same drift.
    partial = run(_write_megatron(tmp_path / "partial", rerun_shards=[0], world_size=4))
    assert codes(partial) == {"torch-dist-common-drift"}
    assert "1-3 missing (3 of 4)" in partial[0].message
    # Every rank's shard present: no finding.
    assert run(_write_megatron(tmp_path / "ok", rerun_shards=[0], world_size=1)) == []


# -- megatron-3624: MTP block carries _extra_state keys the decoder layers lack --------------


def _mtp_model(*, extra_state: bool) -> dict[str, torch.Tensor]:
    sd: dict[str, torch.Tensor] = {"model.embed_tokens.weight": bf16(32, HIDDEN)}
    for layer in range(3):
        p = f"model.layers.{layer}"
        sd[f"{p}.input_layernorm.weight"] = bf16(HIDDEN)
        sd[f"{p}.self_attn.qkv_proj.weight"] = bf16(3 * HIDDEN, HIDDEN)
        sd[f"{p}.mlp.down_proj.weight"] = bf16(HIDDEN, HIDDEN)
    sd["model.norm.weight"] = bf16(HIDDEN)
    block = "mtp.layers.0.transformer_layer"
    sd["mtp.layers.0.eh_proj.weight"] = bf16(HIDDEN, 2 * HIDDEN)
    sd[f"{block}.input_layernorm.weight"] = bf16(HIDDEN)
    sd[f"{block}.self_attn.qkv_proj.weight"] = bf16(3 * HIDDEN, HIDDEN)
    sd[f"{block}.mlp.down_proj.weight"] = bf16(HIDDEN, HIDDEN)
    if extra_state:
        # TransformerEngine's extra state: an empty byte tensor.
        sd[f"{block}.self_attention.core_attention._extra_state"] = torch.empty(
            0, dtype=torch.uint8
        )
    return sd


def test_megatron_3624_mtp_extra_state(tmp_path: Path) -> None:
    folder = tmp_path / "export"
    folder.mkdir()
    save_torch_state_dict(_mtp_model(extra_state=True), folder, max_shard_size=1000)
    findings = run(folder)
    assert codes(findings) == {"layer-keyset-outlier"}
    (outlier,) = findings
    assert "MTP layer" in outlier.message and "_extra_state" in outlier.message
    assert "no decoder layer has" in outlier.message
    clean = tmp_path / "clean"
    clean.mkdir()
    save_torch_state_dict(_mtp_model(extra_state=False), clean, max_shard_size=1000)
    assert run(clean) == []


def _fp8_export_with_mtp(folder: Path, mtp: str) -> Path:
    """A Model-Optimizer FP8 per-layer export of a DeepSeek-style model whose MTP layer is
    `model.layers.3` (after the 3 decoder layers): every expert projection stores an F8
    weight, `weight_scale` and `input_scale`. `mtp`: "same", "lacks" (the MTP layer's
    projections lack `input_scale`), "extra" (they add `output_scale`) or "unquantized"
    (the MTP layer left in BF16, as exporters that exclude it do). No layer stores a byte
    (`_extra_state`) entry."""
    layers = tiny_layer_state_dicts(4)
    for layer, sd in layers.items():
        is_mtp = layer == 4
        for name in [n for n in sd if ".experts." in n and n.endswith(".weight")]:
            if is_mtp and mtp == "unquantized":
                continue
            sd[name] = sd[name].to(torch.float8_e4m3fn)
            module = name.removesuffix(".weight")
            sd[f"{module}.weight_scale"] = torch.ones(())
            if not (is_mtp and mtp == "lacks"):
                sd[f"{module}.input_scale"] = torch.ones(())
            if is_mtp and mtp == "extra":
                sd[f"{module}.output_scale"] = torch.ones(())
    layers[4].update(
        {k.replace("mtp.layers.0", "model.layers.3"): v for k, v in mtp_tensors().items()}
    )
    config = {"model_type": "deepseek_v3", "num_hidden_layers": 3, "num_nextn_predict_layers": 1}
    return write_modelopt_export(folder, layers, config=config)


def test_mtp_keyset_outlier_without_byte_entries(tmp_path: Path) -> None:
    """The MTP rule compared only what the MTP block adds; a block that lacks quantizer
    scales every decoder layer has went unreported (no `_extra_state` anywhere to add)."""
    lacks = run(_fp8_export_with_mtp(tmp_path / "lacks", "lacks"), model=False)
    assert codes(lacks) == {"layer-keyset-outlier"}
    (outlier,) = lacks
    assert outlier.layer == 3 and "MTP layer 3 lacks" in outlier.message
    assert "mlp.experts.up_proj.input_scale" in outlier.message
    extra = run(_fp8_export_with_mtp(tmp_path / "extra", "extra"), model=False)
    assert codes(extra) == {"layer-keyset-outlier"}
    assert "mlp.experts.up_proj.output_scale" in extra[0].message
    for healthy in ("same", "unquantized"):
        assert run(_fp8_export_with_mtp(tmp_path / healthy, healthy), model=False) == []


# -- index drift of a sharded checkpoint -------------------------------------------------------


@pytest.fixture
def sharded(tmp_path: Path) -> Path:
    """A healthy 3-shard checkpoint written by huggingface_hub's splitter."""
    folder = tmp_path / "ckpt"
    folder.mkdir()
    save_torch_state_dict(_mtp_model(extra_state=False), folder, max_shard_size=1000)
    assert len(list(folder.glob("*.safetensors"))) >= 3
    assert run(folder) == []
    return folder


def _files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.glob("*.safetensors"))


def test_index_lists_tensor_no_shard_holds(sharded: Path) -> None:
    index = load_json(sharded / INDEX)
    last = _files(sharded)[-1]
    index["weight_map"]["mtp.fc.weight"] = last
    save_json(sharded / INDEX, index)
    findings = run(sharded)
    assert codes(findings) == {"index-dangling-tensor"}
    (dangling,) = findings
    assert dangling.tensor == "mtp.fc.weight"
    assert "mtp.fc.weight" in dangling.message and last in dangling.message


def test_shard_listed_in_index_but_absent(sharded: Path) -> None:
    gone = _files(sharded)[1]
    listed = [n for n, f in load_json(sharded / INDEX)["weight_map"].items() if f == gone]
    (sharded / gone).unlink()
    findings = run(sharded)
    assert codes(findings) == {"index-missing-file", "total-size-mismatch"}
    (missing,) = of(findings, "index-missing-file")
    assert missing.file == gone and "is not in the checkpoint folder" in missing.message
    assert f"maps {len(listed)} tensors to {gone}" in missing.message
    # The total is off by the missing shard's bytes, and the message says why.
    (total,) = of(findings, "total-size-mismatch")
    assert f"the {len(listed)} tensors the index lists but no shard holds" in total.message


def test_stray_shard_not_in_index(sharded: Path) -> None:
    stray = "model-00001-of-00001.safetensors"
    save_file({"extra.weight": bf16(4, 4)}, str(sharded / stray), metadata={"format": "pt"})
    findings = run(sharded)
    assert codes(findings) == {"unindexed-file", "total-size-mismatch"}
    (unindexed,) = of(findings, "unindexed-file")
    assert unindexed.file == stray and stray in unindexed.message and INDEX in unindexed.message


def test_tensor_in_two_shards(sharded: Path) -> None:
    name = "model.norm.weight"
    owner = load_json(sharded / INDEX)["weight_map"][name]
    other = next(f for f in _files(sharded) if f != owner)
    from safetensors.torch import load_file

    copy = load_file(str(sharded / other)) | {name: bf16(HIDDEN, seed=5)}
    save_file(copy, str(sharded / other), metadata={"format": "pt"})
    findings = run(sharded)
    assert codes(findings) == {"duplicate-tensor"}
    (dup,) = findings
    assert dup.tensor == name and owner in dup.message and other in dup.message
    assert "all copies are BF16 [8]" in dup.message


def test_seed_checkpoints_survive_a_copy(tmp_path: Path) -> None:
    """The findings name files relative to the checkpoint, so a moved copy reports the same."""
    layers = 2
    folder = write_modelopt_export(
        tmp_path / "a", tiny_layer_state_dicts(layers), late={layers: mtp_tensors()}
    )
    moved = Path(shutil.copytree(folder, tmp_path / "elsewhere" / "b"))
    assert run(folder) == run(moved)
