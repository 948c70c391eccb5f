"""`safetensors-single`: one `.safetensors` file, or a folder holding `model.safetensors`."""

from __future__ import annotations

from pathlib import Path

from inspector.findings import Finding
from inspector.layouts._common import INDEX_NAME, list_safetensors, read_config_files, read_shards
from inspector.model import ModelSpec, ScannedCheckpoint

NAME = "safetensors-single"


def detect(path: Path) -> bool:
    if path.is_file():
        return path.name.endswith(".safetensors")
    if (path / INDEX_NAME).is_file():
        return False
    return len(list_safetensors(path)) == 1


def scan(path: Path, *, header_cap: int) -> ScannedCheckpoint:
    """A lone file is read without the folder's config: the folder may hold more shards."""
    if path.is_file():
        shards = read_shards([path], root=path.parent, header_cap=header_cap)
        config = quant = None
        spec, found, config_problems = ModelSpec(), set(), []
        folder = path.parent
    else:
        folder = path
        shards = read_shards(list_safetensors(folder), root=folder, header_cap=header_cap)
        config, quant, spec, found, config_problems = read_config_files(folder, root=folder)
    problems = [f for s in shards for f in s.findings] + config_problems
    return ScannedCheckpoint(
        path=folder,
        layout=NAME,
        shards=shards,
        config=config,
        quant_config=quant,
        spec=spec,
        problems=problems,
        json_files=frozenset(found),
    )


def check(scanned: ScannedCheckpoint) -> list[Finding]:
    """One file has no index, sidecars or siblings to cross-check (its header problems are
    already in `scanned.problems`); it can still be a collapsed consolidation."""
    from inspector.checks.sharding import check_collapsed_shards

    return check_collapsed_shards(scanned)
