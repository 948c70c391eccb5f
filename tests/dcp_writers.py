"""Write REAL DCP-sharded safetensors checkpoints, as NeMo AutoModel does during training.

Two gloo processes on CPU each hold DTensors sharded over a 2-rank DeviceMesh and save them
with PyTorch's own `HuggingFaceStorageWriter(save_distributed=True)`. Torch then writes one
file per rank and output index, `shard-{rank+1:05d}-model-{index:05d}-of-{count:05d}.safetensors`,
and nothing else (no index, no `.metadata`). NeMo AutoModel adds `.hf_metadata/` with
`config.json` and `fqn_to_file_index_mapping.json` (written here the same way, from rank 0).

It also writes the Megatron-style torch_dist run of tests/test_torch_dist.py: 2 gloo ranks save
DTensors with `dcp.save` as Megatron does (the project's `save_megatron_dcp`), plus `common.pt`.

The tests read both as golden fixtures, written once by `make fixtures`
(tests/writers/write_dcp_test_models.py, in the writers' environment) and committed: a test
imports `tensor_plan`, `full_tensors`, `MAPPING` and `torch_dist_tensors` to know what they hold
(pytest puts tests/ on the path), never the writers.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from inspector._internal.common.filenames import CONFIG_NAME

__all__ = [
    "CONFIG",
    "MAPPING",
    "TensorPlan",
    "full_tensors",
    "tensor_plan",
    "torch_dist_tensors",
    "write_dcp_checkpoint",
    "write_torch_dist_run",
]

WORLD_SIZE = 2


@dataclass(frozen=True, slots=True)
class TensorPlan:
    """One tensor of the test model: full shape, dtype, and how it is sharded (None: plain)."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    shard_dim: int | None


def tensor_plan() -> dict[str, TensorPlan]:
    """The test model: HF-style MoE names, row- and column-sharded, float/int/bool dtypes,
    uneven splits (3 rows over 2 ranks), an empty chunk (1 row over 2 ranks) and a 0-d
    plain tensor that only one rank saves."""
    bf16, f32 = torch.bfloat16, torch.float32
    plan = {
        "model.embed_tokens.weight": TensorPlan((64, 32), bf16, 0),
        "model.layers.0.self_attn.q_proj.weight": TensorPlan((32, 32), bf16, 1),
        "model.layers.0.input_layernorm.weight": TensorPlan((32,), f32, 0),
        "model.layers.0.mlp.gate.weight": TensorPlan((2, 32), f32, 0),
        "model.layers.0.mlp.gate.expert_counts": TensorPlan((3, 4), torch.int32, 0),
        "model.layers.0.self_attn.mask": TensorPlan((5, 5), torch.bool, 1),
        "model.layers.0.mlp.router_scale": TensorPlan((), f32, None),
        "model.norm.weight": TensorPlan((32,), bf16, 0),
        "lm_head.weight": TensorPlan((1, 32), f32, 0),
    }
    for expert in range(2):
        prefix = f"model.layers.0.mlp.experts.{expert}"
        plan[f"{prefix}.up_proj.weight"] = TensorPlan((16, 32), bf16, expert % 2)
        plan[f"{prefix}.down_proj.weight"] = TensorPlan((32, 16), f32, 1 - expert % 2)
        plan[f"{prefix}.up_proj.weight_packed"] = TensorPlan((16, 16), torch.int8, 1)
    return plan


# Output file 1 takes the embedding and attention, file 2 the rest, as a mapping derived from
# a two-file HF index would.
MAPPING: dict[str, int] = {
    name: 1 if name.startswith(("model.embed_tokens", "model.layers.0.self_attn")) else 2
    for name in tensor_plan()
}

# What the test model's config says. No vocab_size: its one-row `lm_head` (an empty chunk on
# rank 2) is no real output head, and the DCP reader holds the head to the vocabulary.
CONFIG: dict[str, object] = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe",
    "hidden_size": 32,
    "num_hidden_layers": 1,
    "num_experts": 2,
    "torch_dtype": "bfloat16",
}


def full_tensors() -> dict[str, torch.Tensor]:
    """The full tensors every rank starts from (deterministic, so the parent can compare)."""
    gen = torch.Generator().manual_seed(1234)
    out: dict[str, torch.Tensor] = {}
    for name, plan in tensor_plan().items():
        if plan.dtype == torch.bool:
            out[name] = torch.randint(0, 2, plan.shape, generator=gen).bool()
        elif plan.dtype in (torch.int8, torch.int32):
            out[name] = torch.randint(-100, 100, plan.shape, generator=gen).to(plan.dtype)
        else:
            out[name] = torch.randn(plan.shape, generator=gen).to(plan.dtype)
    return out


def write_dcp_checkpoint(
    dest: Path,
    *,
    mapping: dict[str, int] | None = MAPPING,
    hf_metadata: bool = True,
) -> Path:
    """Save the test model from 2 gloo processes into `dest` (created); returns `dest`.

    `mapping=None` lets torch put every tensor of a rank into one file. Raises if a rank fails.
    """
    dest.mkdir(parents=True, exist_ok=True)
    _run_ranks(_rank_main, dest, mapping)
    if hf_metadata:
        _write_hf_metadata(dest, mapping)
    return dest


def _run_ranks(target: Callable[..., None], dest: Path, *args: object) -> None:
    """`target(rank, dest, rendezvous file, *args)` in WORLD_SIZE spawned processes; raises if a
    rank fails. The rendezvous file sits beside `dest` and is removed afterwards."""
    ctx = mp.get_context("spawn")
    rdzv = dest.parent / f".rdzv-{dest.name}"
    procs = [
        ctx.Process(target=target, args=(rank, str(dest), str(rdzv), *args))
        for rank in range(WORLD_SIZE)
    ]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=120)
    codes = [proc.exitcode for proc in procs]
    rdzv.unlink(missing_ok=True)
    if codes != [0] * WORLD_SIZE:
        raise RuntimeError(f"writer ranks exited with {codes}")


def _write_hf_metadata(dest: Path, mapping: dict[str, int] | None) -> None:
    # NeMo AutoModel's rank 0 writes these after the save, with the same json.dump options.
    meta = dest / ".hf_metadata"
    meta.mkdir(exist_ok=True)
    (meta / CONFIG_NAME).write_text(json.dumps(CONFIG, indent=2))
    if mapping is not None:
        with open(meta / "fqn_to_file_index_mapping.json", "w") as f:
            json.dump(mapping, f, indent=2, sort_keys=True)


def _rank_main(rank: int, dest: str, rdzv: str, mapping: dict[str, int] | None) -> None:
    """One training rank: build DTensors from the shared full tensors and save them."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import HuggingFaceStorageWriter
    from torch.distributed.tensor import Shard, distribute_tensor, init_device_mesh

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    dist.init_process_group("gloo", init_method=f"file://{rdzv}", rank=rank, world_size=WORLD_SIZE)
    try:
        mesh = init_device_mesh("cpu", (WORLD_SIZE,))
        state: dict[str, torch.Tensor] = {}
        plan = tensor_plan()
        for name, full in full_tensors().items():
            dim = plan[name].shard_dim
            state[name] = full if dim is None else distribute_tensor(full, mesh, [Shard(dim)])
        writer = HuggingFaceStorageWriter(
            dest, fqn_to_index_mapping=mapping, save_distributed=True, enable_consolidation=False
        )
        dcp.save(state, storage_writer=writer)
        dist.barrier()
    finally:
        dist.destroy_process_group()


# -- the Megatron-style torch_dist run (tests/test_torch_dist.py) -----------------------------

TORCH_DIST_ITERATION = "iter_0000100"


def torch_dist_tensors() -> dict[str, tuple[tuple[int, ...], int | None]]:
    """The torch_dist run's tensors: name -> (global shape, sharded dim or None: replicated)."""
    return {
        "embedding.word_embeddings.weight": ((64, 16), 0),
        "decoder.layers.self_attention.linear_qkv.weight": ((2, 48, 16), 1),
        "decoder.layers.self_attention.linear_proj.weight": ((2, 16, 16), 2),
        "decoder.layers.mlp.experts.experts.linear_fc1.weight": ((2, 4, 32, 16), 1),
        "decoder.final_layernorm.weight": ((16,), None),
    }


def write_torch_dist_run(root: Path) -> Path:
    """Save the torch_dist run from 2 gloo processes into `root` (created): the tracker file and
    `iter_0000100/` with DTensors sharded over a 2-rank mesh, a rerun-state shard per rank,
    `metadata.json` and `common.pt` (rerun machine active). Returns `root`."""
    (root / TORCH_DIST_ITERATION).mkdir(parents=True, exist_ok=True)
    _run_ranks(_torch_dist_rank_main, root)
    return root


def _torch_dist_rank_main(rank: int, root: str, rdzv: str) -> None:
    import io

    import torch.distributed as dist
    from torch.distributed.tensor import Shard, distribute_tensor, init_device_mesh

    from inspector._internal.demo.torch_dist import (
        RerunState,
        megatron_common_state,
        megatron_pickle_names,
        save_megatron_dcp,
    )

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    dist.init_process_group("gloo", init_method=f"file://{rdzv}", rank=rank, world_size=WORLD_SIZE)
    try:
        mesh = init_device_mesh("cpu", (WORLD_SIZE,))
        gen = torch.Generator().manual_seed(7)
        state: dict[str, object] = {}
        for name, (shape, dim) in torch_dist_tensors().items():
            full = torch.randn(shape, generator=gen).to(torch.bfloat16)
            state[name] = full if dim is None else distribute_tensor(full, mesh, [Shard(dim)])
        # Megatron stores a sharded object as the bytes of torch.save([data]).
        blob = io.BytesIO()
        torch.save([{"rank": rank}], blob)
        blob.seek(0)
        state[f"rerun_state_machine_state/shard_{rank}_{WORLD_SIZE}"] = blob
        iter_dir = Path(root) / TORCH_DIST_ITERATION
        save_megatron_dcp(state, iter_dir, metadata_json=rank == 0, process_group=None)
        if rank == 0:
            common = megatron_common_state(
                world_size=WORLD_SIZE, rerun_state=RerunState.WILL_RERUN_FROM_CHECKPOINT
            )
            with megatron_pickle_names():
                torch.save(common, iter_dir / "common.pt")
            (Path(root) / "latest_checkpointed_iteration.txt").write_text("100\n")
        dist.barrier()
    finally:
        dist.destroy_process_group()
