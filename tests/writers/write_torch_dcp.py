"""Write DCP-sharded safetensors with PyTorch's REAL `HuggingFaceStorageWriter(
save_distributed=True)` from 2 gloo ranks on 127.0.0.1 (DTensors on a 2-rank CPU DeviceMesh).

The tiny model (`tensor_plan`) has HF MoE names and every case DCP has to get right: bf16, f32,
int32, int8 and bool tensors; row- (Shard(0)) and column- (Shard(1)) sharded tensors; uneven
splits (3 rows, 5 columns over 2 ranks); a 1-row tensor whose second chunk is empty; a 0-d
tensor every rank holds in full (replicated: DCP keeps rank 0's). `fqn_to_index_mapping` sends
the embedding and attention to output file 1 and the rest to file 2, as a mapping derived from
a two-file HF index would; torch then names each file
`shard-{rank+1:05d}-model-{index:05d}-of-00002.safetensors` and writes nothing else (no index,
no `.metadata`, no `.hf_metadata/`).

Cases (tests/fixtures/writers/torch-dcp/<case>/):

- `healthy`: as written.
- `last-rank-lost`: the same save, then every file of the last rank (`shard-00002-*`) deleted.

The manifest records, per case, sha256 of every tensor of the full state dict the ranks
distributed (`writer_state`), and of PyTorch's own consolidator
(`torch.distributed.checkpoint._consolidate_hf_safetensors.consolidate_safetensors_files`) run
on the healthy output (`torch_consolidated`, or the error it raised: in torch 2.13 it sizes
every dtype with `torch.finfo` and fails on integer and bool tensors). No shim: DCP runs on the
CPU with gloo as it is. Volatile bytes, left as written: the safetensors library (0.8) writes
the `__metadata__` object from a Rust HashMap, so the order of its three keys (`format`,
`DCP_VERSION`, `DCP_SHARDING_INFO`) changes from run to run; every tensor entry and every data
byte is identical across runs.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common

WRITER = "torch-dcp"
PACKAGE = "torch"
SCRIPT = "write_torch_dcp.py"
WORLD = 2


def tensor_plan() -> dict[str, tuple[tuple[int, ...], str, int | None]]:
    """{name: (full shape, dtype name, shard dim or None for a replicated plain tensor)}."""
    plan: dict[str, tuple[tuple[int, ...], str, int | None]] = {
        "model.embed_tokens.weight": ((64, 32), "bfloat16", 0),
        "model.layers.0.self_attn.q_proj.weight": ((32, 32), "bfloat16", 1),
        "model.layers.0.self_attn.k_proj.weight": ((8, 32), "bfloat16", 0),
        "model.layers.0.input_layernorm.weight": ((32,), "float32", 0),
        "model.layers.0.mlp.gate.weight": ((4, 32), "float32", 0),
        "model.layers.0.mlp.gate.expert_counts": ((3, 4), "int32", 0),
        "model.layers.0.self_attn.mask": ((5, 5), "bool", 1),
        "model.layers.0.mlp.router_scale": ((), "float32", None),
        "model.norm.weight": ((32,), "bfloat16", 0),
        "lm_head.weight": ((1, 32), "float32", 0),
    }
    for expert in range(4):
        prefix = f"model.layers.0.mlp.experts.{expert}"
        plan[f"{prefix}.up_proj.weight"] = ((16, 32), "bfloat16", expert % 2)
        plan[f"{prefix}.down_proj.weight"] = ((32, 16), "float32", 1 - expert % 2)
        plan[f"{prefix}.up_proj.weight_packed"] = ((16, 16), "int8", 1)
    return plan


def mapping() -> dict[str, int]:
    """Output file of each tensor: embedding and attention in 1, the rest in 2."""
    return {
        name: 1 if name.startswith(("model.embed_tokens", "model.layers.0.self_attn")) else 2
        for name in tensor_plan()
    }


def full_tensors() -> dict[str, Any]:
    """The full tensors every rank starts from (one seeded generator, so all ranks agree)."""
    import torch

    gen = torch.Generator().manual_seed(1234)
    out: dict[str, Any] = {}
    for name, (shape, dtype, _) in tensor_plan().items():
        if dtype == "bool":
            out[name] = torch.randint(0, 2, shape, generator=gen).bool()
        elif dtype in ("int8", "int32"):
            out[name] = torch.randint(-100, 100, shape, generator=gen).to(getattr(torch, dtype))
        else:
            out[name] = torch.randn(shape, generator=gen).to(getattr(torch, dtype))
    return out


def _rank_main(rank: int, world: int, dest: str) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import HuggingFaceStorageWriter
    from torch.distributed.tensor import Shard, distribute_tensor, init_device_mesh

    mesh = init_device_mesh("cpu", (world,))
    plan = tensor_plan()
    state: dict[str, Any] = {}
    for name, full in full_tensors().items():
        dim = plan[name][2]
        state[name] = full if dim is None else distribute_tensor(full, mesh, [Shard(dim)])
    writer = HuggingFaceStorageWriter(
        dest, fqn_to_index_mapping=mapping(), save_distributed=True, enable_consolidation=False
    )
    dcp.save(state, storage_writer=writer)


def torch_consolidate(src: Path, fqn_to_index: dict[str, int]) -> dict[str, Any]:
    """PyTorch's consolidator on a copy's output folder: the hashes, or the error it raised."""
    from torch.distributed.checkpoint._consolidate_hf_safetensors import (
        consolidate_safetensors_files,
    )

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "consolidated"
        out.mkdir()
        try:
            consolidate_safetensors_files(str(src), str(out), fqn_to_index)
        except Exception as exc:  # recorded: the manifest says whether it ran
            return {"ran": False, "error": f"{type(exc).__name__}: {exc}"}
        return {"ran": True, "tensors": _common.safetensors_folder_hashes(out)}


def main() -> None:
    writer_state = _common.state_dict_hashes(full_tensors())
    for case in ("healthy", "last-rank-lost"):
        dest = _common.case_dir(WRITER, case)
        _common.spawn(_rank_main, WORLD, str(dest))
        consolidated = torch_consolidate(dest, mapping()) if case == "healthy" else None
        if case == "last-rank-lost":
            for path in dest.glob(f"shard-{WORLD:05d}-*"):
                path.unlink()
        _common.record(
            WRITER,
            case,
            package=PACKAGE,
            script=SCRIPT,
            description=(
                "HuggingFaceStorageWriter(save_distributed=True) from 2 gloo ranks"
                + ("" if case == "healthy" else ", then every file of rank 2 deleted")
            ),
            healthy=case == "healthy",
            damage=None if case == "healthy" else "all shard-00002-* files deleted",
            extra={
                "world_size": WORLD,
                "fqn_to_index_mapping": mapping(),
                "shard_dims": {n: p[2] for n, p in tensor_plan().items()},
                "writer_state": writer_state,
                "torch_consolidated": consolidated,
            },
        )


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
