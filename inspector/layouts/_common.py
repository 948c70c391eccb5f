"""Reading helpers shared by the layout readers: JSON files, the index, config, shards.

Every function returns plain data plus `ReadProblem`s; nothing here raises on bad input and
nothing here judges (the checks do).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import msgspec
import numpy as np

from inspector.columns import Coded
from inspector.findings import FOLD, examples
from inspector.model import FileRole, IndexDoc, ModelSpec, ProblemKind, ReadProblem
from inspector.safetensors_header import DEFAULT_HEADER_CAP, ShardHeader, read_shard
from inspector.spec import SPEC_KEYS, spec_from_config
from inspector.storage import LocalFile

__all__ = [
    "INDEX_NAME",
    "JSON_CAP",
    "ConfigFiles",
    "is_safe_member",
    "list_safetensors",
    "read_config_files",
    "read_index_doc",
    "read_json",
    "read_shards",
    "relative",
]

INDEX_NAME = "model.safetensors.index.json"
# An index of 1.3M tensors is about 100 MB; anything far past that is not an index.
JSON_CAP = 1_000_000_000
# msgspec builds the Python objects straight from the bytes; orjson's intermediate document
# costs about 12x the file size at its peak, 1.2 GB for the index of a million tensors.
_DECODER = msgspec.json.Decoder()


def relative(path: Path, root: Path) -> str:
    return path.relative_to(root).as_posix()


def read_json(path: Path, *, cap: int = JSON_CAP) -> tuple[Any, str | None]:
    """(value, None) or (None, reason). Opens only a regular file, reads at most `cap` bytes."""
    try:
        with LocalFile(path) as reader:
            size = reader.size()
            if size > cap:
                return None, f"is {size:,} bytes, over the {cap:,}-byte limit for JSON files"
            data = reader.read_range(0, size)
    except OSError as exc:
        return None, f"cannot be read ({exc.strerror or exc})"
    try:
        return _DECODER.decode(data), None
    except msgspec.DecodeError as exc:
        return None, f"is not valid JSON ({exc}); it may have been truncated by a concurrent writer"


def list_safetensors(folder: Path) -> list[Path]:
    """The `.safetensors` files directly in `folder`, sorted by name."""
    try:
        entries = sorted(os.scandir(folder), key=lambda e: e.name)
    except OSError:
        return []
    return [Path(e.path) for e in entries if e.name.endswith(".safetensors") and e.is_file()]


def read_shards(
    paths: list[Path], *, root: Path, header_cap: int = DEFAULT_HEADER_CAP
) -> tuple[ShardHeader, ...]:
    return tuple(read_shard(p, root=root, cap=header_cap) for p in paths)


def is_safe_member(value: str) -> bool:
    """True when a `weight_map` value names a file inside the checkpoint folder."""
    if not value or "\x00" in value or "\\" in value:
        return False
    pure = PurePosixPath(value)
    return not pure.is_absolute() and ".." not in pure.parts and not value.startswith("~")


def read_index_doc(
    path: Path, *, root: Path, role: FileRole = FileRole.INDEX
) -> tuple[IndexDoc | None, list[ReadProblem]]:
    """Parse an index or sidecar into columns. Unsafe `weight_map` paths are problems and
    are dropped, so nothing downstream ever follows them out of the folder."""
    rel = relative(path, root)
    value, problem = read_json(path)
    if problem is not None:
        return None, [ReadProblem(rel, role, problem)]
    weight_map = value.get("weight_map") if isinstance(value, dict) else None
    if not isinstance(weight_map, dict):
        return None, [ReadProblem(rel, role, 'is not of the form {"weight_map": {tensor: file}}')]
    # Values repeat (hundreds of files for 300k tensors): coded once, each distinct one
    # validated once, and the per-entry strings freed with the decoded dict.
    names = tuple(weight_map)
    files = Coded.encode(weight_map.values(), len(names))
    del weight_map
    if not all(type(v) is str for v in files.values):
        return None, [ReadProblem(rel, role, 'is not of the form {"weight_map": {tensor: file}}')]
    problems: list[ReadProblem] = []
    unsafe = [i for i, f in enumerate(files.values) if not is_safe_member(f)]
    if unsafe:
        names, files, problems = _drop_unsafe(rel, role, names, files, unsafe)
    metadata = value.get("metadata")
    document = {k: (None if k in ("weight_map", "metadata") else v) for k, v in value.items()}
    doc = IndexDoc(rel, names, files, metadata if isinstance(metadata, dict) else {}, document)
    return doc, problems


def _drop_unsafe(
    rel: str, role: FileRole, names: tuple[str, ...], files: Coded[str], unsafe: list[int]
) -> tuple[tuple[str, ...], Coded[str], list[ReadProblem]]:
    """The entries whose file leaves the folder, removed; one problem per entry, bounded
    (a hostile index may hold millions: past `FOLD.per_code`, one problem for the rest)."""
    bad = np.isin(files.codes, unsafe)
    rows = np.flatnonzero(bad)
    problems = [
        ReadProblem(
            rel,
            role,
            f"maps {names[i]!r} to {files[i]!r}, which leaves the checkpoint folder; "
            "expected a file name inside it (the entry is ignored)",
            ProblemKind.UNSAFE_PATH,
            tensor=names[i],
        )
        for i in rows[: FOLD.per_code].tolist()
    ]
    rest = rows[FOLD.per_code :].tolist()
    if rest:
        problems.append(
            ReadProblem(
                rel,
                role,
                f"maps {len(rest):,} more tensors to files outside the checkpoint folder "
                f"({examples([names[i] for i in rest[:3]])}); those entries are ignored",
                ProblemKind.UNSAFE_PATH,
            )
        )
    keep = np.flatnonzero(~bad)
    kept_names = tuple(names[i] for i in keep.tolist())
    # Re-coded, so that the unsafe names are gone from the table of files too.
    return kept_names, Coded.encode(files.take(keep).tolist()), problems


@dataclass(frozen=True, slots=True)
class ConfigFiles:
    """`config.json` and `hf_quant_config.json` of a folder, and what they say."""

    config: Mapping[str, Any] | None = None
    quant: Mapping[str, Any] | None = None
    spec: ModelSpec = field(default_factory=ModelSpec)
    found: frozenset[str] = frozenset()
    problems: tuple[ReadProblem, ...] = field(default_factory=tuple)


def read_config_files(folder: Path, *, root: Path) -> ConfigFiles:
    """`config.json` and `hf_quant_config.json` in `folder` (names relative to `root`)."""
    found: set[str] = set()
    problems: list[ReadProblem] = []
    docs: dict[str, Any] = {}
    salvaged_spec = ModelSpec()
    for name, role in (
        ("config.json", FileRole.CONFIG),
        ("hf_quant_config.json", FileRole.QUANT_CONFIG),
    ):
        path = folder / name
        if not path.is_file():
            continue
        rel = relative(path, root)
        found.add(rel)
        value, problem = read_json(path)
        if problem is None and not isinstance(value, dict):
            problem = f"holds a JSON {type(value).__name__}, expected an object"
        if problem is not None:
            salvaged = salvage_json_prefix(path) if role is FileRole.CONFIG else {}
            if salvaged:
                salvaged_spec = spec_from_config(salvaged, source=f"{rel} (salvaged)")
                keep = ", ".join(f"{k}={salvaged[k]}" for k in SPEC_KEYS if k in salvaged)
                problem += f"; the structure checks use what its readable part says ({keep})"
            problems.append(ReadProblem(rel, role, problem))
        else:
            docs[name] = value
    config = docs.get("config.json")
    spec = spec_from_config(config, source="config.json") if config is not None else salvaged_spec
    return ConfigFiles(
        config, docs.get("hf_quant_config.json"), spec, frozenset(found), tuple(problems)
    )


_SCALAR = re.compile(rb'"(\w+)"\s*:\s*(-?\d+|true|false|"[^"\\]{0,4096}")\s*[,}\n]')


def salvage_json_prefix(path: Path, *, cap: int = 16_000_000) -> dict[str, Any]:
    """Scalar `"key": value` pairs from the readable part of a damaged JSON file.

    A config truncated by a concurrent writer usually still holds the counts we need (layers,
    experts); the first occurrence of each key wins, so top-level keys before nested ones.
    """
    try:
        with LocalFile(path) as reader:
            data = reader.read_range(0, min(reader.size(), cap))
    except OSError:
        return {}
    out: dict[str, Any] = {}
    for match in _SCALAR.finditer(data):
        key = match.group(1).decode("ascii", "replace")
        if key in out:
            continue
        try:
            out[key] = _DECODER.decode(match.group(2))
        except msgspec.DecodeError:
            continue
    return {k: v for k, v in out.items() if k in SPEC_KEYS}
