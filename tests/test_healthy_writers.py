"""A healthy checkpoint from each real writer produces NO finding at all through the full
`inspector._internal.checks.check()`, headers-only and with `deep=True`: transformers
`save_pretrained` (tiny MoE configs), PyTorch DCP `HuggingFaceStorageWriter` from 2 processes, DCP
`save` of a Megatron torch_dist checkpoint, plain safetensors `save_file`, and a
Model-Optimizer-style per-layer export."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from dcp_writers import tensor_plan
from modelopt_writer import mtp_tensors, tiny_layer_state_dicts, write_modelopt_export
from safetensors.torch import save_file

from inspector._internal.checks import check
from inspector._internal.demo.torch_dist import write_torch_dist_demo
from inspector._internal.scan.entry import scan


def assert_clean(folder: Path, *, layout: str) -> None:
    scanned = scan(folder)
    assert scanned.layout == layout
    assert len(scanned.tensors) > 0
    assert check(scanned) == []
    assert check(scanned, deep=True) == []


def _qwen3_moe():
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    config = Qwen3MoeConfig(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        moe_intermediate_size=8,
        num_hidden_layers=3,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        num_experts=4,
        num_experts_per_tok=2,
        mlp_only_layers=[0],
    )
    return Qwen3MoeForCausalLM(config)


def _mixtral():
    from transformers import MixtralConfig, MixtralForCausalLM

    config = MixtralConfig(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        num_local_experts=4,
        num_experts_per_tok=2,
    )
    return MixtralForCausalLM(config)


@pytest.mark.parametrize("build", [_qwen3_moe, _mixtral], ids=["qwen3-moe", "mixtral"])
@pytest.mark.parametrize("shard", ["20KB", None], ids=["sharded", "single"])
def test_transformers_save_pretrained(tmp_path: Path, build, shard: str | None) -> None:
    torch.manual_seed(0)
    model = build()
    kwargs = {"max_shard_size": shard} if shard else {}
    model.save_pretrained(tmp_path / "m", **kwargs)
    layout = "hf-sharded" if shard else "safetensors-single"
    if shard:
        assert len(list((tmp_path / "m").glob("*.safetensors"))) > 1
    scanned = scan(tmp_path / "m")
    # The config's expert count really is what the checks compare against.
    assert scanned.spec.experts_per_layer == 4 and scanned.spec.moe_layers
    assert_clean(tmp_path / "m", layout=layout)


@pytest.fixture(scope="module")
def dcp_run(dcp_checkpoint: Path) -> Path:
    """Saved by 2 gloo processes with DCP's HuggingFaceStorageWriter (DTensors): conftest's
    `dcp_checkpoint`, the golden fixture `torch-dcp/test-model` (`make fixtures`)."""
    return dcp_checkpoint


def test_dcp_hf_storage_writer_two_processes(dcp_run: Path) -> None:
    scanned = scan(dcp_run)
    # Every rank wrote its own files, and the chunks rebuild every full tensor.
    assert {s.file.split("-model-")[0] for s in scanned.shards} == {"shard-00001", "shard-00002"}
    assert scanned.dcp is not None
    assert {n: tuple(p.shape) for n, p in tensor_plan().items()} == scanned.dcp.full_shapes
    assert_clean(dcp_run, layout="dcp-sharded")


def test_torch_dist_dcp_save(tmp_path: Path) -> None:
    folder = write_torch_dist_demo(tmp_path / "run")
    scanned = scan(folder)
    assert scanned.torch_dist is not None and scanned.torch_dist.common is not None
    assert any(k.startswith("rerun_state_machine_state/") for k in scanned.torch_dist.byte_keys)
    assert_clean(folder, layout="torch-dist")


def test_safetensors_save_file(tmp_path: Path) -> None:
    gen = torch.Generator().manual_seed(0)
    state = {
        "model.embed_tokens.weight": torch.randn(32, 8, generator=gen).to(torch.bfloat16),
        "model.layers.0.mlp.experts.0.up_proj.weight": torch.randn(8, 8, generator=gen),
        "model.layers.0.mlp.experts.1.up_proj.weight": torch.randn(8, 8, generator=gen),
        "model.norm.weight": torch.ones(8, dtype=torch.float16),
        "model.step": torch.tensor(7, dtype=torch.int64),
    }
    (tmp_path / "m").mkdir()
    save_file(state, str(tmp_path / "m" / "model.safetensors"), metadata={"format": "pt"})
    assert_clean(tmp_path / "m", layout="safetensors-single")
    # The file on its own is the same single-file layout.
    assert check(scan(tmp_path / "m" / "model.safetensors")) == []


def test_modelopt_per_layer_export(tmp_path: Path) -> None:
    layers = tiny_layer_state_dicts(3)
    layers[3] |= mtp_tensors()
    folder = write_modelopt_export(tmp_path / "export", layers)
    assert_clean(folder, layout="modelopt-per-layer")
