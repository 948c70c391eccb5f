"""Damage a checkpoint the way real exports go wrong while keeping it self-consistent: the
shards are re-written with the real safetensors writer to hold `edit(state)`, and the index
is rewritten to match them, so the only problem left is in the tensors themselves.

Tests import it as `from hf_resave import resaved` (pytest puts tests/ on the path).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import torch
from modelopt_writer import INDEX, load_json, save_json
from safetensors.torch import load_file, save_file

__all__ = ["resaved", "state_of"]


def state_of(folder: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """(tensors, file of each tensor) of every `.safetensors` file in `folder`."""
    state: dict[str, torch.Tensor] = {}
    home: dict[str, str] = {}
    for path in sorted(folder.glob("*.safetensors")):
        for name, tensor in load_file(path).items():
            state[name], home[name] = tensor, path.name
    return state, home


def resaved(
    src: Path, dest: Path, edit: Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]]
) -> Path:
    """A copy of `src` whose shards hold `edit(state)` (added tensors go to the last shard),
    with the index's weight map and total size rewritten to match."""
    shutil.copytree(src, dest)
    state, home = state_of(dest)
    files = sorted(set(home.values()))
    tensors = edit(dict(state))
    where = {k: home.get(k, files[-1]) for k in tensors}
    for file in files:
        part = {k: v.contiguous() for k, v in tensors.items() if where[k] == file}
        save_file(part, str(dest / file), metadata={"format": "pt"})
    if (dest / INDEX).exists():
        index = load_json(dest / INDEX)
        index["weight_map"] = where
        sizes = (t.numel() * t.element_size() for t in tensors.values())
        index["metadata"]["total_size"] = sum(sizes)
        save_json(dest / INDEX, index)
    return dest
