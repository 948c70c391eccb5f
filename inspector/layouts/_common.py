"""Reading helpers shared by the layout modules: JSON files, the index, config, shards.

Every function returns plain data plus findings; nothing here raises on bad input.
"""

from __future__ import annotations

import os
import re
from pathlib import Path, PurePosixPath
from typing import Any

import orjson

from inspector.findings import Finding, make_finding
from inspector.model import IndexDoc, ModelSpec
from inspector.progress import track
from inspector.safetensors_header import DEFAULT_HEADER_CAP, ShardHeader, read_shard
from inspector.spec import spec_from_config

__all__ = [
    "INDEX_NAME",
    "JSON_CAP",
    "is_safe_member",
    "list_safetensors",
    "read_config_files",
    "read_index_doc",
    "read_json",
    "read_shards",
]

INDEX_NAME = "model.safetensors.index.json"
# An index of 1.3M tensors is about 100 MB; anything far past that is not an index.
JSON_CAP = 1_000_000_000


def read_json(path: Path, *, cap: int = JSON_CAP) -> tuple[Any, str | None]:
    """(value, None) or (None, reason). Reads at most `cap` bytes."""
    try:
        size = path.stat().st_size
        if size > cap:
            return None, f"is {size:,} bytes, over the {cap:,}-byte limit for JSON files"
        return orjson.loads(path.read_bytes()), None
    except OSError as exc:
        return None, f"cannot be read ({exc.strerror or exc})"
    except orjson.JSONDecodeError as exc:
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
) -> list[ShardHeader]:
    return [
        read_shard(p, root=root, cap=header_cap)
        for p in track(paths, desc="shard headers", unit="file")
    ]


def is_safe_member(value: str) -> bool:
    """True when a `weight_map` value names a file inside the checkpoint folder."""
    if not value or "\x00" in value or "\\" in value:
        return False
    pure = PurePosixPath(value)
    return not pure.is_absolute() and ".." not in pure.parts and not value.startswith("~")


def read_index_doc(
    path: Path, *, root: Path, unreadable_code: str = "index-unreadable"
) -> tuple[IndexDoc | None, list[Finding]]:
    """Parse an index or sidecar. Unsafe `weight_map` paths are findings and are dropped,
    so nothing downstream ever follows them out of the folder."""
    rel = path.relative_to(root).as_posix()
    value, problem = read_json(path)
    if problem is not None:
        return None, [make_finding(unreadable_code, f"{rel} {problem}", file=rel)]
    weight_map = value.get("weight_map") if isinstance(value, dict) else None
    # Values repeat (hundreds of files for 300k tensors): validate each distinct one once.
    values = set(weight_map.values()) if isinstance(weight_map, dict) else set()
    if (
        not isinstance(weight_map, dict)
        or not all(type(v) is str for v in values)
        # orjson object keys are always str; only a hand-built dict could differ
        or not all(type(k) is str for k in weight_map)
    ):
        msg = (
            f'{rel} is not of the form {{"weight_map": {{tensor: file}}}}; '
            "regenerate it with `ckpt-inspect repair`"
        )
        return None, [make_finding(unreadable_code, msg, file=rel)]
    unsafe = {v for v in values if not is_safe_member(v)}
    findings = []
    safe = weight_map
    if unsafe:
        safe = {t: f for t, f in weight_map.items() if f not in unsafe}
        for tensor, file in weight_map.items():
            if file in unsafe:
                findings.append(
                    make_finding(
                        "index-unsafe-path",
                        f"{rel} maps {tensor!r} to {file!r}, which leaves the checkpoint folder; "
                        "expected a file name inside it (the entry is ignored)",
                        file=rel,
                        tensor=tensor,
                    )
                )
    metadata = value.get("metadata")
    return IndexDoc(rel, safe, metadata if isinstance(metadata, dict) else {}, value), findings


def read_config_files(
    folder: Path, *, root: Path
) -> tuple[dict | None, dict | None, ModelSpec, set[str], list[Finding]]:
    """`config.json` and `hf_quant_config.json` in `folder`.

    Returns (config, quant config, spec, files found, findings)."""
    found: set[str] = set()
    findings: list[Finding] = []
    docs: dict[str, Any] = {}
    salvaged_spec = ModelSpec()
    for name, code in (
        ("config.json", "config-unreadable"),
        ("hf_quant_config.json", "quant-config-unreadable"),
    ):
        path = folder / name
        if not path.is_file():
            continue
        rel = path.relative_to(root).as_posix()
        found.add(rel)
        value, problem = read_json(path)
        if problem is None and not isinstance(value, dict):
            problem = f"holds a JSON {type(value).__name__}, expected an object"
        if problem is not None:
            salvaged = salvage_json_prefix(path) if name == "config.json" else {}
            if salvaged:
                salvaged_spec = spec_from_config(salvaged, source=f"{rel} (salvaged)")
                keep = ", ".join(f"{k}={salvaged[k]}" for k in _SPEC_KEYS if k in salvaged)
                problem += f"; the structure checks use what its readable part says ({keep})"
            findings.append(
                make_finding(
                    code, f"{rel} {problem}; re-write it from the model's config", file=rel
                )
            )
        else:
            docs[name] = value
    config = docs.get("config.json")
    spec = spec_from_config(config, source="config.json") if config is not None else salvaged_spec
    return config, docs.get("hf_quant_config.json"), spec, found, findings


_SPEC_KEYS = (
    "model_type",
    "num_hidden_layers",
    "n_routed_experts",
    "num_experts",
    "num_local_experts",
    "first_k_dense_replace",
    "moe_layer_freq",
    "decoder_sparse_step",
    "num_nextn_predict_layers",
    "mtp_num_layers",
    "hybrid_override_pattern",
)
_SCALAR = re.compile(rb'"(\w+)"\s*:\s*(-?\d+|true|false|"[^"\\]{0,4096}")\s*[,}\n]')


def salvage_json_prefix(path: Path, *, cap: int = 16_000_000) -> dict[str, Any]:
    """Scalar `"key": value` pairs from the readable part of a damaged JSON file.

    A config truncated by a concurrent writer usually still holds the counts we need (layers,
    experts); the first occurrence of each key wins, so top-level keys before nested ones.
    """
    try:
        with path.open("rb") as fh:
            data = fh.read(cap)
    except OSError:
        return {}
    out: dict[str, Any] = {}
    for match in _SCALAR.finditer(data):
        key = match.group(1).decode("ascii", "replace")
        if key in out:
            continue
        try:
            out[key] = orjson.loads(match.group(2))
        except orjson.JSONDecodeError:
            continue
    return {k: v for k, v in out.items() if k in _SPEC_KEYS}
