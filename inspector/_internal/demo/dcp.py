"""A small DCP-sharded demo checkpoint, as NeMo AutoModel leaves it after a 2-rank run.

The files are what PyTorch's `HuggingFaceStorageWriter(save_distributed=True)` writes, made
here without starting processes: each rank's chunk of each tensor (split like a DTensor
`Shard(dim)`: `ceil(n / ranks)` per rank, the last ranks short or empty) goes into
`shard-{rank:05d}-model-{output:05d}-of-{count:05d}.safetensors` with the same
`__metadata__` (`DCP_SHARDING_INFO` as `json.dumps` of `{fqn: {"saved_offsets": [...]}}` in
state-dict order, `DCP_VERSION`, `format`). A test checks this byte for byte against files
written by the real writer from 2 processes.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from inspector._internal.common.filenames import (
    CONFIG_NAME,
    DCP_MAPPING_NAME,
    HF_METADATA_DIR,
    INDEX_NAME,
)

if TYPE_CHECKING:
    import torch

__all__ = ["REFERENCE_FILES", "chunk_span", "write_dcp_demo", "write_rank_files"]

# The reference model's shard names: the non-standard form that seed automodel-2289 collapsed.
REFERENCE_FILES = [f"model.safetensors-{i:05d}-of-00004.safetensors" for i in range(1, 5)]
_LAYERS = 2
_EXPERTS = 4
_HIDDEN = 64
_VOCAB = 256

_CONFIG = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe",
    "hidden_size": _HIDDEN,
    "intermediate_size": 128,
    "moe_intermediate_size": 32,
    "num_hidden_layers": _LAYERS,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "num_experts": _EXPERTS,
    "num_experts_per_tok": 2,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "vocab_size": _VOCAB,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}

_README = """\
Demo: a DCP-sharded checkpoint (PyTorch DCP HuggingFaceStorageWriter, save_distributed=True),
as NeMo AutoModel writes it during training on 2 ranks, before consolidation.

  shard-0000R-model-0000I-of-0000N.safetensors  rank R's chunks of the tensors of output file I;
                                                 __metadata__["DCP_SHARDING_INFO"] gives each
                                                 chunk's offsets in the full tensor
  .hf_metadata/config.json                       the model config
  .hf_metadata/fqn_to_file_index_mapping.json    tensor -> output file index used by consolidation
  .hf_metadata/model.safetensors.index.json      the reference model's index (4 files)
{extra}
Inspect it with:  ckpt-inspect check {name}
"""

_COLLAPSED_NOTE = """
This copy is DAMAGED on purpose: the mapping sends every tensor to output file 1 although the
reference index names 4 files (the output index was parsed from the non-standard names
model.safetensors-0000i-of-00004.safetensors and read as 1 each time). Expect mapping-collapsed.
"""


def write_dcp_demo(dest: Path, *, collapsed: bool = False) -> Path:
    """Write the demo into `dest` (created) and return it. Prints nothing.

    `collapsed=True` reproduces seed automodel-2289: every tensor maps to output file 1
    while `.hf_metadata/` keeps the reference index naming 4 files."""
    import torch

    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    tensors, shard_dims, reference = _demo_model(torch)
    mapping = dict.fromkeys(tensors, 1) if collapsed else reference
    write_rank_files(dest, tensors, shard_dims, mapping, ranks=2)
    meta = dest / HF_METADATA_DIR
    meta.mkdir(exist_ok=True)
    (meta / CONFIG_NAME).write_text(json.dumps(_CONFIG, indent=2) + "\n")
    # NeMo AutoModel writes the mapping with these json.dump options.
    with open(meta / DCP_MAPPING_NAME, "w") as f:
        json.dump(mapping, f, indent=2, sort_keys=True)
    index = {
        "metadata": {"total_size": sum(t.numel() * t.element_size() for t in tensors.values())},
        "weight_map": {name: REFERENCE_FILES[i - 1] for name, i in reference.items()},
    }
    (meta / INDEX_NAME).write_text(json.dumps(index, indent=2) + "\n")
    extra = _COLLAPSED_NOTE if collapsed else ""
    (dest / "README.txt").write_text(_README.format(extra=extra, name=dest.name))
    return dest


def chunk_span(size: int, rank: int, ranks: int) -> tuple[int, int]:
    """(start, length) of `rank`'s piece of a dimension of `size` split like DTensor Shard:
    ceil(size / ranks) each; trailing ranks get less, possibly nothing (start = size)."""
    step = -(-size // ranks)
    start = min(rank * step, size)
    return start, min(size, start + step) - start


def write_rank_files(
    dest: Path,
    tensors: dict[str, torch.Tensor],
    shard_dims: dict[str, int | None],
    mapping: dict[str, int] | None,
    *,
    ranks: int,
) -> list[Path]:
    """Write each rank's files as the DCP writer would. A tensor with shard dim None is
    replicated; like torch's save-plan dedup here, the last rank alone saves it."""
    from safetensors.torch import save_file

    count = max(mapping.values()) if mapping else 1
    written = []
    for rank in range(ranks):
        files: dict[int, dict[str, tuple[torch.Tensor, list[int]]]] = {}
        for name, full in tensors.items():
            piece = _piece(full, shard_dims[name], rank, ranks)
            if piece is not None:
                files.setdefault(mapping[name] if mapping else 1, {})[name] = piece
        for index, items in sorted(files.items()):
            path = dest / f"shard-{rank + 1:05d}-model-{index:05d}-of-{count:05d}.safetensors"
            info = {name: {"saved_offsets": offsets} for name, (_, offsets) in items.items()}
            metadata = {"DCP_SHARDING_INFO": json.dumps(info), "DCP_VERSION": "1.0", "format": "pt"}
            save_file({n: t for n, (t, _) in items.items()}, str(path), metadata=metadata)
            written.append(path)
    return written


def _piece(
    full: torch.Tensor, dim: int | None, rank: int, ranks: int
) -> tuple[torch.Tensor, list[int]] | None:
    if dim is None:
        return (full.contiguous(), [0] * full.dim()) if rank == ranks - 1 else None
    start, length = chunk_span(full.shape[dim], rank, ranks)
    offsets = [0] * full.dim()
    offsets[dim] = start
    return full.narrow(dim, start, length).contiguous(), offsets


def _demo_model(
    torch: ModuleType,
) -> tuple[dict[str, Any], dict[str, int | None], dict[str, int]]:
    """(tensors in state-dict order, shard dim per tensor, reference output file per tensor).

    Reference files: 1 embedding and layer 0 attention, 2 layer 0 MoE, 3 layer 1, 4 head."""
    gen = torch.Generator().manual_seed(0)
    tensors: dict[str, Any] = {}
    dims: dict[str, int | None] = {}
    ref: dict[str, int] = {}

    def add(name: str, shape: tuple[int, ...], dim: int | None, file: int) -> None:
        tensors[name] = (torch.randn(shape, generator=gen) * 0.02).to(torch.bfloat16)
        dims[name], ref[name] = dim, file

    add("model.embed_tokens.weight", (_VOCAB, _HIDDEN), 0, 1)
    for layer in range(_LAYERS):
        p = f"model.layers.{layer}"
        attn, moe = (1, 2) if layer == 0 else (3, 3)
        add(f"{p}.input_layernorm.weight", (_HIDDEN,), 0, attn)
        for proj, rows in (("q", 64), ("k", 32), ("v", 32)):
            add(f"{p}.self_attn.{proj}_proj.weight", (rows, _HIDDEN), 0, attn)
        add(f"{p}.self_attn.o_proj.weight", (_HIDDEN, 64), 1, attn)
        add(f"{p}.self_attn.q_norm.weight", (16,), 0, attn)
        add(f"{p}.self_attn.k_norm.weight", (16,), 0, attn)
        add(f"{p}.post_attention_layernorm.weight", (_HIDDEN,), 0, moe)
        add(f"{p}.mlp.gate.weight", (_EXPERTS, _HIDDEN), 0, moe)
        for e in range(_EXPERTS):
            add(f"{p}.mlp.experts.{e}.gate_proj.weight", (32, _HIDDEN), 0, moe)
            add(f"{p}.mlp.experts.{e}.up_proj.weight", (32, _HIDDEN), 0, moe)
            add(f"{p}.mlp.experts.{e}.down_proj.weight", (_HIDDEN, 32), 1, moe)
    add("model.norm.weight", (_HIDDEN,), 0, 4)
    add("lm_head.weight", (_VOCAB, _HIDDEN), 0, 4)
    return tensors, dims, ref
