"""The scanned checkpoint: one structure that every layout module produces.

Plain data only. Tables are built from it on first access (`inspector.tables`), checks read
it, repairs plan from it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from inspector.findings import Finding
from inspector.safetensors_header import ShardHeader

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "DcpChunk",
    "DcpInfo",
    "IndexDoc",
    "LogicalTensors",
    "ModelSpec",
    "ScannedCheckpoint",
    "TorchDistInfo",
    "TorchDistTensor",
]


@dataclass(frozen=True, slots=True)
class IndexDoc:
    """A parsed `model.safetensors.index.json` or a per-layer sidecar (same schema)."""

    file: str
    weight_map: dict[str, str]
    metadata: dict[str, Any]
    raw: dict[str, Any]


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """What `config.json` says should exist. Unknown facts are None."""

    model_type: str | None = None
    num_layers: int | None = None
    # 0-based decoder layer numbers that are MoE; None when the config says nothing.
    moe_layers: frozenset[int] | None = None
    experts_per_layer: int | None = None
    mtp_layers: int = 0
    # Where the facts came from, e.g. "config.json" or "config.json:text_config".
    source: str | None = None


@dataclass(frozen=True, slots=True)
class LogicalTensors:
    """Columns of the checkpoint's logical tensors when they are not simply the shards'
    entries (DCP chunks merged to full shapes, torch_dist metadata). `begin`/`end` are None
    where a tensor is not one contiguous byte range."""

    name: list[str]
    file: list[str]
    dtype: list[str]
    shape: list[tuple[int, ...]]
    nbytes: list[int]
    begin: list[int | None]
    end: list[int | None]


@dataclass(frozen=True, slots=True)
class DcpChunk:
    file: str
    offsets: tuple[int, ...]
    shape: tuple[int, ...]
    dtype: str


@dataclass(frozen=True)
class DcpInfo:
    """DCP-sharded safetensors: each tensor's chunks and the rebuilt full shapes."""

    chunks: dict[str, list[DcpChunk]]
    full_shapes: dict[str, tuple[int, ...]]
    # `.hf_metadata/fqn_to_file_index_mapping.json` (fqn -> 1-based output index), if any.
    mapping: dict[str, int] | None = None
    mapping_file: str | None = None
    hf_metadata_dir: str | None = None


@dataclass(frozen=True, slots=True)
class TorchDistTensor:
    dtype: str
    size: tuple[int, ...]
    # (offsets, sizes) of each stored chunk
    chunks: tuple[tuple[tuple[int, ...], tuple[int, ...]], ...]


@dataclass(frozen=True)
class TorchDistInfo:
    """A Megatron / DCP torch_dist folder, from `.metadata`, `metadata.json`, `common.pt`."""

    iteration_dir: str
    metadata_json: dict[str, Any] | None
    tensors: dict[str, TorchDistTensor]
    # Keys stored as bytes (sharded objects such as rerun_state_machine_state/shard_0_8).
    byte_keys: list[str]
    # (fqn, chunk offsets) -> (relative .distcp path, offset, length)
    storage: dict[tuple[str, tuple[int, ...]], tuple[str, int, int]]
    distcp_sizes: dict[str, int]
    common: dict[str, Any] | None
    common_file: str | None = None


@dataclass(frozen=True)
class ScannedCheckpoint:
    """Everything a scan read: headers, JSON files, config, layout-specific metadata.

    `path` is the checkpoint folder; every `file` below is relative to it.
    """

    path: Path
    layout: str
    shards: list[ShardHeader]
    index: IndexDoc | None = None
    sidecars: dict[str, IndexDoc] = field(default_factory=dict)
    config: dict[str, Any] | None = None
    quant_config: dict[str, Any] | None = None
    spec: ModelSpec = field(default_factory=ModelSpec)
    dcp: DcpInfo | None = None
    torch_dist: TorchDistInfo | None = None
    logical: LogicalTensors | None = None
    problems: list[Finding] = field(default_factory=list)
    # Names of JSON files we looked for and found, e.g. {"config.json", "hf_quant_config.json"}.
    json_files: frozenset[str] = frozenset()

    # -- tables, built once on first access -------------------------------------------

    @cached_property
    def tables(self) -> Any:
        from inspector.tables import build_tables

        return build_tables(self)

    @property
    def tensors(self) -> pd.DataFrame:
        """One row per tensor: name, file, dtype, shape, numel, nbytes, offsets, naming."""
        return self.tables.tensors

    @property
    def files(self) -> pd.DataFrame:
        """One row per shard file."""
        return self.tables.files

    @property
    def layers(self) -> pd.DataFrame:
        """One row per layer."""
        return self.tables.layers

    @property
    def experts(self) -> pd.DataFrame:
        """One row per MoE layer and expert id."""
        return self.tables.experts

    def shard(self, file: str) -> ShardHeader | None:
        """The header of `file`, if it was read."""
        return self._shards_by_file.get(file)

    def browse(self, **options: Any) -> Any:
        """The tensor browser (notebook UI, the `ui` extra): every tensor in a sortable grid
        filtered by name glob or regex, dtype, layer, expert, file and kind, with CSV and
        Parquet export. Display the result as the last expression of a cell. `options` are
        the filters (see `inspector.query.TensorQuery`)."""
        from inspector.ui import ui_function

        return ui_function("browse")(self, **options)

    def dashboard(self, **options: Any) -> Any:
        """The notebook dashboard of this scan (the `ui` extra); see `inspector.widgets`."""
        from inspector.ui import ui_function

        return ui_function("dashboard")(self, **options)

    def _repr_html_(self) -> str:
        """Notebook display: summary card and small tables (see `inspector.html_repr`)."""
        from inspector.html_repr import scanned_html

        return scanned_html(self)

    @cached_property
    def _shards_by_file(self) -> dict[str, ShardHeader]:
        return {s.file: s for s in self.shards}
