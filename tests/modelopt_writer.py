"""Write Model-Optimizer-style per-layer exports (docs/formats.md, "Model-Optimizer per-layer
exports") with the real safetensors writer, including the sidecar drift of seed modelopt-1422.

Layout: one `model-{L:05d}-of-{N:05d}.safetensors` per decoder layer (1-based), a sidecar
`<shard>.json` = `{"metadata": {"total_size": tensor bytes}, "weight_map": {name: shard}}` per
shard, and `model.safetensors.index.json` merged from every sidecar (as rank 0 does after the
barrier). The embedding lands in layer 1's shard; final norm, output layer and MTP tensors in
the last layer's shard.

Tests import it as `from modelopt_writer import ...` (pytest puts tests/ on the path).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from inspector._internal.common.filenames import CONFIG_NAME, INDEX_NAME

__all__ = [
    "INDEX",
    "load_json",
    "mtp_tensors",
    "save_json",
    "shard_name",
    "tiny_layer_state_dicts",
    "write_modelopt_export",
]

# The index and config names, from the project's one table of file names.
INDEX = INDEX_NAME
HIDDEN = 8


def shard_name(layer: int, total: int) -> str:
    """The shard file of 1-based decoder layer `layer`."""
    return f"model-{layer:05d}-of-{total:05d}.safetensors"


def tiny_layer_state_dicts(
    num_layers: int, *, experts: int = 2
) -> dict[int, dict[str, torch.Tensor]]:
    """A small MoE decoder split per 1-based layer, each tensor with distinct values."""
    gen = torch.Generator().manual_seed(0)

    def t(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(torch.bfloat16)

    layers: dict[int, dict[str, torch.Tensor]] = {}
    for layer in range(1, num_layers + 1):
        prefix = f"model.layers.{layer - 1}"
        sd = {
            f"{prefix}.input_layernorm.weight": t(HIDDEN),
            f"{prefix}.self_attn.qkv_proj.weight": t(3 * HIDDEN, HIDDEN),
            f"{prefix}.mlp.gate.weight": t(experts, HIDDEN),
        }
        for e in range(experts):
            sd[f"{prefix}.mlp.experts.{e}.up_proj.weight"] = t(HIDDEN, HIDDEN)
            sd[f"{prefix}.mlp.experts.{e}.down_proj.weight"] = t(HIDDEN, HIDDEN)
        layers[layer] = sd
    layers[1]["model.embed_tokens.weight"] = t(32, HIDDEN)
    layers[num_layers]["model.norm.weight"] = t(HIDDEN)
    layers[num_layers]["lm_head.weight"] = t(32, HIDDEN)
    return layers


def mtp_tensors() -> dict[str, torch.Tensor]:
    """The MTP block the exporter appends to the last layer's shard."""
    gen = torch.Generator().manual_seed(1)
    return {
        "mtp.layers.0.enorm.weight": torch.randn(HIDDEN, generator=gen).to(torch.bfloat16),
        "mtp.layers.0.hnorm.weight": torch.randn(HIDDEN, generator=gen).to(torch.bfloat16),
        "mtp.layers.0.eh_proj.weight": torch.randn(HIDDEN, 2 * HIDDEN, generator=gen).to(
            torch.bfloat16
        ),
    }


def write_modelopt_export(
    folder: Path,
    layers: dict[int, dict[str, torch.Tensor]],
    *,
    late: dict[int, dict[str, torch.Tensor]] | None = None,
    config: dict | None = None,
) -> Path:
    """Write the export. `late[L]` tensors are added to layer L's dict AFTER its sidecar was
    computed and before the shard is written: the modelopt-1422 bug (shard holds more than
    its sidecar and the merged index list)."""
    folder.mkdir(parents=True, exist_ok=True)
    total = len(layers)
    merged: dict[str, str] = {}
    total_size = 0
    for layer, state_dict in sorted(layers.items()):
        name = shard_name(layer, total)
        weight_map = dict.fromkeys(state_dict, name)
        size = sum(v.numel() * v.element_size() for v in state_dict.values())
        save_json(
            folder / f"{name}.json", {"metadata": {"total_size": size}, "weight_map": weight_map}
        )
        written = {**state_dict, **(late or {}).get(layer, {})}
        save_file(written, str(folder / name), metadata={"format": "pt"})
        merged.update(weight_map)
        total_size += size
    save_json(folder / INDEX, {"metadata": {"total_size": total_size}, "weight_map": merged})
    save_json(
        folder / CONFIG_NAME, config or {"model_type": "tiny_moe", "num_hidden_layers": total}
    )
    return folder


def load_json(path: Path) -> dict:
    return json.loads(path.read_text())


def save_json(path: Path, value: dict) -> None:
    path.write_text(json.dumps(value, indent=2))
