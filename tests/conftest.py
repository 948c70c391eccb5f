"""Shared pytest fixtures. Checkpoints are written with the real writers."""

from __future__ import annotations

import compileall
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from inspector._internal.plans.consolidate.engine import SourceFiles

ROOT = Path(__file__).resolve().parents[1]


def pytest_sessionstart(session: pytest.Session) -> None:
    """Compile the project's modules to bytecode once, before any test. The suite starts
    hundreds of Python processes (the CLI, notebook kernels, the import probe's children);
    where PYTHONDONTWRITEBYTECODE is set, as in many CI images, each of them would compile
    the whole package from source again: about half a second of CPU per process."""
    for folder in ("inspector", "widgets"):
        compileall.compile_dir(ROOT / folder, quiet=1)


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


@pytest.fixture
def cut_on_open(monkeypatch: pytest.MonkeyPatch) -> Callable[[Path], dict[str, int]]:
    """Factory: from now on, "another process" cuts the first source file a copy opens
    (consolidate, re-shard, `repair --from`), in folder `folder`, to half its size as soon as
    the copy has opened it. Returns {file: the size it was cut to}, filled when that happens."""

    def install(folder: Path) -> dict[str, int]:
        real = SourceFiles.reader
        cut: dict[str, int] = {}

        def cutting(self: SourceFiles, file: str):  # type: ignore[no-untyped-def]
            reader = real(self, file)
            if not cut:
                cut[file] = (folder / file).stat().st_size // 2
                os.truncate(folder / file, cut[file])
            return reader

        monkeypatch.setattr(SourceFiles, "reader", cutting)
        return cut

    return install
