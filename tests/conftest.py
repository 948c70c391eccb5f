"""Shared pytest fixtures. Checkpoints are written with the real writers."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest


@pytest.fixture
def write_state_dict(tmp_path: Path) -> Callable[..., Path]:
    """Factory: write `{name: torch.Tensor}` with huggingface_hub's sharded writer
    (`save_torch_state_dict`: shards plus `model.safetensors.index.json` when there is more
    than one shard) into a folder under `tmp_path`; returns the folder. `max_shard_size`
    is bytes (int) or a string such as "5GB" or "4KB"."""

    def write(state: dict, *, folder: str = "ckpt", max_shard_size: int | str = "5GB") -> Path:
        from huggingface_hub import save_torch_state_dict

        target = tmp_path / folder
        target.mkdir(parents=True, exist_ok=True)
        save_torch_state_dict(state, target, max_shard_size=max_shard_size)
        return target

    return write


@pytest.fixture(scope="session")
def demo_checkpoints(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo checkpoints (`inspector.demo`), written once per session; tests that change
    one work on a copy."""
    from inspector._internal.demo import write_demos

    target = tmp_path_factory.mktemp("demo-checkpoints")
    write_demos(target, log=lambda _line: None)
    return target
