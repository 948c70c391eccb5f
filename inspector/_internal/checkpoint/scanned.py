"""The scanned model: what a layout reader produces from a checkpoint. Plain, immutable data.

`ScannedCheckpoint` holds what every layout has plus one per-layout `info` record (a tagged
union). Readers never judge: what they could not read is a `ReadProblem`
(`checkpoint.read_problems`). Records are frozen and per-tensor data columnar
(`common.columns`): a million tensors must fit in a few hundred bytes each.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence, Set
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cached_property
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from inspector._internal.checkpoint.read_problems import ReadProblem, read_problem_findings
from inspector._internal.checkpoint.spec import ModelSpec
from inspector._internal.checkpoint.tables import Tables, build_tables
from inspector._internal.checkpoint.ui import core_function, html_view, ui_function
from inspector._internal.common.columns import Coded, frozen, int64s
from inspector._internal.common.display import legible
from inspector._internal.common.text import plural
from inspector._internal.findings.finding import Finding
from inspector._internal.findings.words import READ_ERROR
from inspector._internal.formats.safetensors import ShardHeader
from inspector._internal.storage import LocalStorage, Location, RemoteURL, Storage

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "ChunkTable",
    "DcpChunk",
    "DcpInfo",
    "DcpReference",
    "GgufInfo",
    "IndexDoc",
    "LayoutInfo",
    "LayoutName",
    "LogicalTensors",
    "PerLayerInfo",
    "PickledObject",
    "PytorchBinInfo",
    "ScannedCheckpoint",
    "ShardHeader",
    "ShardedInfo",
    "SingleFileInfo",
    "TensorSummary",
    "TorchDistInfo",
    "TorchDistTensor",
    "readonly",
]

T = TypeVar("T")


def readonly(value: Mapping[Any, Any] | None) -> Mapping[Any, Any] | None:
    """A read-only view of a mapping (None stays None; a view is not wrapped twice)."""
    if value is None or isinstance(value, MappingProxyType):
        return value
    return MappingProxyType(dict(value) if not isinstance(value, dict) else value)


def _set(record: object, name: str, value: object) -> None:
    """Normalise a field of a frozen record in `__post_init__`."""
    object.__setattr__(record, name, value)


class LayoutName(StrEnum):
    """The on-disk layouts (one reader module each, see `inspector._internal.layouts`)."""

    SAFETENSORS_SINGLE = "safetensors-single"
    HF_SHARDED = "hf-sharded"
    MODELOPT_PER_LAYER = "modelopt-per-layer"
    DCP_SHARDED = "dcp-sharded"
    TORCH_DIST = "torch-dist"
    PYTORCH_BIN = "pytorch-bin"
    GGUF = "gguf"


# -- documents ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, eq=False)
class IndexDoc:
    """A parsed `model.safetensors.index.json` or per-layer sidecar (same schema), with the
    weight map stored as columns: `names` and, per name, a code into `files`."""

    file: str
    names: tuple[str, ...]
    files: Coded[str]
    metadata: Mapping[str, Any]
    # The other top-level keys, in file order ("weight_map" marks its place): repairs keep them.
    document: Mapping[str, Any] = field(default_factory=dict)
    _cache: dict[str, Any] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        _set(self, "metadata", readonly(self.metadata))
        _set(self, "document", readonly(self.document))

    @classmethod
    def from_map(
        cls,
        file: str,
        weight_map: Mapping[str, str],
        metadata: Mapping[str, Any] | None = None,
        document: Mapping[str, Any] | None = None,
    ) -> IndexDoc:
        names = tuple(weight_map)
        return cls(
            file,
            names,
            Coded.encode(weight_map.values(), len(names)),
            metadata or {},
            document if document is not None else {"metadata": None, "weight_map": None},
        )

    @property
    def weight_map(self) -> Mapping[str, str]:
        """tensor -> file, as the file has it (built on first use)."""
        built = self._cache.get("weight_map")
        if built is None:
            built = self._cache["weight_map"] = MappingProxyType(self.lookup_map())
        return built

    def lookup_map(self) -> dict[str, str]:
        """`weight_map` as the plain dict under it, shared: for lookups only, never modify
        it. Millions of lookups through the read-only view cost half as much again, and
        copying the view back into a dict costs more than building it (300,000 names)."""
        built = self._cache.get("lookup_map")
        if built is None:
            built = self._cache["lookup_map"] = dict(
                zip(self.names, self.files.tolist(), strict=True)
            )
        return built

    def name_set(self) -> Set[str]:
        """The names as a set for membership tests, shared (the lookup map's keys when that is
        built already): the index and issue rules both ask which shard names it lacks."""
        built = self._cache.get("lookup_map")
        if built is not None:
            return built.keys()
        names = self._cache.get("name_set")
        if names is None:
            names = self._cache["name_set"] = frozenset(self.names)
        return names

    @property
    def raw(self) -> dict[str, Any]:
        """The whole document as a new dict (what a repair rewrites)."""
        out = dict(self.document)
        out["metadata"] = dict(self.metadata)
        out["weight_map"] = dict(self.weight_map)
        return out


# -- logical tensors ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, eq=False)
class LogicalTensors:
    """The checkpoint's logical tensors as columns, when they are not simply the shards'
    entries (DCP chunks merged to full shapes, torch_dist metadata). `begin`/`end` are None
    when tensors are not stored as one contiguous byte range each."""

    name: tuple[str, ...]
    file: Coded[str]
    dtype: Coded[str]
    shape: Coded[tuple[int, ...]]
    nbytes: np.ndarray
    begin: np.ndarray | None = None
    end: np.ndarray | None = None

    def __post_init__(self) -> None:
        _set(self, "name", tuple(self.name))
        _set(self, "nbytes", int64s(self.nbytes))

    def __len__(self) -> int:
        return len(self.name)


# -- per-layout info records ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SingleFileInfo:
    """`safetensors-single`: `lone_file` when a file was scanned without its folder."""

    lone_file: bool = False


@dataclass(frozen=True, slots=True)
class ShardedInfo:
    """`hf-sharded`: everything is in the shards and the index."""


@dataclass(frozen=True, slots=True)
class PytorchBinInfo:
    """`torch.save` files (`pytorch_model.bin`, or shards with `pytorch_model.bin.index.json`):
    `lone_file` when one file was scanned without its folder."""

    lone_file: bool = False


@dataclass(frozen=True, slots=True)
class GgufInfo:
    """GGUF files (single, or split parts `NAME-0000i-of-0000N.gguf`); each shard is an
    `inspector.gguf_shard.GgufShard` carrying its metadata. `lone_file` when one file was
    scanned without its folder."""

    lone_file: bool = False


@dataclass(frozen=True, slots=True)
class PerLayerInfo:
    """`modelopt-per-layer`: each shard's parsed `<shard>.json` sidecar, by shard file."""

    sidecars: Mapping[str, IndexDoc] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _set(self, "sidecars", readonly(self.sidecars))


@dataclass(frozen=True, slots=True)
class DcpChunk:
    """One stored chunk of a DCP tensor (a view of one `ChunkTable` row)."""

    file: str
    offsets: tuple[int, ...]
    shape: tuple[int, ...]
    dtype: str


@dataclass(frozen=True, slots=True, eq=False)
class ChunkTable:
    """Every stored chunk of every DCP tensor, one row per chunk, the rows of tensor `i`
    being `starts[i]:starts[i + 1]` in file order. `full` is each tensor's full shape."""

    names: tuple[str, ...]
    starts: np.ndarray
    file: Coded[str]
    dtype: Coded[str]
    offsets: Coded[tuple[int, ...]]
    shape: Coded[tuple[int, ...]]
    full: Coded[tuple[int, ...]]

    def rows(self, tensor: int) -> range:
        return range(int(self.starts[tensor]), int(self.starts[tensor + 1]))

    def chunks(self, tensor: int) -> tuple[DcpChunk, ...]:
        """The chunks of tensor number `tensor`, as records."""
        f, d, o, s = self.file, self.dtype, self.offsets, self.shape
        return tuple(DcpChunk(f[r], o[r], s[r], d[r]) for r in self.rows(tensor))

    @classmethod
    def from_chunks(cls, chunks: Mapping[str, Sequence[DcpChunk]]) -> ChunkTable:
        """From records (tests, and views built from other layouts); full shapes are the
        element-wise max of offset + shape (see `full_shape`)."""
        names = tuple(chunks)
        flat = [c for n in names for c in chunks[n]]
        sizes = [len(chunks[n]) for n in names]
        return cls(
            names,
            frozen(np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)]).astype(np.int64)),
            Coded.encode([c.file for c in flat]),
            Coded.encode([c.dtype for c in flat]),
            Coded.encode([c.offsets for c in flat]),
            Coded.encode([c.shape for c in flat]),
            Coded.encode([full_shape(chunks[n]) for n in names]),
        )


def full_shape(chunks: Sequence[DcpChunk]) -> tuple[int, ...]:
    """Element-wise max of offset + chunk shape over the chunks with the first chunk's number
    of dimensions (chunks with another one are a conflict, reported by the checks)."""
    ndim = len(chunks[0].shape)
    ends = [[o + s for o, s in zip(c.offsets, c.shape, strict=True)] for c in chunks]
    return tuple(map(max, zip(*(e for e in ends if len(e) == ndim), strict=True)))


class _ByName(Mapping[str, T]):
    """A read-only mapping over tensor names, values built on access."""

    def __init__(
        self, names: tuple[str, ...], position: Mapping[str, int], get: Callable[[int], T]
    ):
        self._names, self._position, self._get = names, position, get

    def __getitem__(self, name: str) -> T:
        return self._get(self._position[name])

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def __contains__(self, name: object) -> bool:
        return name in self._position


@dataclass(frozen=True, slots=True, eq=False)
class DcpReference:
    """The reference (upstream) checkpoint a DCP run names (`consolidate.sh --model-name`,
    `config.json` `_name_or_path`), found on this machine: its index and the shapes its
    shard headers store."""

    path: str  # where it was found
    named_by: str  # which file named it, e.g. "consolidate.sh --model-name"
    index: IndexDoc | None = None
    shapes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _set(self, "shapes", readonly(self.shapes))

    @property
    def label(self) -> str:
        return f"the reference checkpoint {self.path} (named by {self.named_by})"


@dataclass(frozen=True, slots=True, eq=False)
class DcpInfo:
    """DCP-sharded safetensors: the chunk table, and `.hf_metadata/`'s file-index mapping
    (fqn -> 1-based output index) when the run kept one.

    The table's full shapes are the largest any source gives
    (`inspector._internal.layouts.expected_shapes`);
    `shape_sources` says, for each tensor whose chunks reach less, which source set it."""

    table: ChunkTable
    mapping: Mapping[str, int] | None = None
    mapping_file: str | None = None
    hf_metadata_dir: str | None = None
    reference: DcpReference | None = None
    shape_sources: Mapping[str, str] = field(default_factory=dict)
    _cache: dict[str, Any] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        _set(self, "mapping", readonly(self.mapping))
        _set(self, "shape_sources", readonly(self.shape_sources))

    @classmethod
    def from_chunks(cls, chunks: Mapping[str, Sequence[DcpChunk]], **options: Any) -> DcpInfo:
        return cls(ChunkTable.from_chunks(chunks), **options)

    @property
    def position(self) -> Mapping[str, int]:
        """tensor name -> its number in the table (built on first use)."""
        built = self._cache.get("position")
        if built is None:
            names = self.table.names
            built = self._cache["position"] = dict(zip(names, range(len(names)), strict=True))
        return built

    @property
    def chunks(self) -> Mapping[str, tuple[DcpChunk, ...]]:
        """tensor name -> its chunks (records built on access)."""
        return _ByName(self.table.names, self.position, self.table.chunks)

    @property
    def full_shapes(self) -> Mapping[str, tuple[int, ...]]:
        return _ByName(self.table.names, self.position, self.table.full.__getitem__)


@dataclass(frozen=True, slots=True)
class TensorSummary:
    """A tensor found in torch_dist common state, by dtype and shape only."""

    dtype: str
    shape: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class PickledObject:
    """An object of a class the common state names but torch does not allow by default
    (`argparse.Namespace`, Megatron enums). Nothing was imported: this is its pickled form,
    `qualname(*args)` then `state` (e.g. a Namespace's attribute dict)."""

    qualname: str
    args: tuple[Any, ...]
    state: Any


@dataclass(frozen=True, slots=True)
class TorchDistTensor:
    dtype: str
    size: tuple[int, ...]
    # (offsets, sizes) of each stored chunk
    chunks: tuple[tuple[tuple[int, ...], tuple[int, ...]], ...]


@dataclass(frozen=True, slots=True, eq=False)
class TorchDistInfo:
    """A Megatron / DCP torch_dist folder, from `.metadata`, `metadata.json`, `common.pt`."""

    iteration_dir: str
    metadata_json: Mapping[str, Any] | None
    tensors: Mapping[str, TorchDistTensor]
    # Keys stored as bytes (sharded objects such as rerun_state_machine_state/shard_0_8).
    byte_keys: tuple[str, ...]
    # (fqn, chunk offsets) -> (.distcp path relative to the scanned folder, offset, length)
    storage: Mapping[tuple[str, tuple[int, ...]], tuple[str, int, int]]
    distcp_sizes: Mapping[str, int]
    common: Mapping[str, Any] | None
    common_file: str | None = None

    def __post_init__(self) -> None:
        for name in ("metadata_json", "tensors", "storage", "distcp_sizes", "common"):
            _set(self, name, readonly(getattr(self, name)))
        _set(self, "byte_keys", tuple(self.byte_keys))


LayoutInfo = (
    SingleFileInfo
    | ShardedInfo
    | PerLayerInfo
    | DcpInfo
    | TorchDistInfo
    | PytorchBinInfo
    | GgufInfo
)

_INFO_OF: dict[LayoutName, type] = {
    LayoutName.SAFETENSORS_SINGLE: SingleFileInfo,
    LayoutName.HF_SHARDED: ShardedInfo,
    LayoutName.MODELOPT_PER_LAYER: PerLayerInfo,
    LayoutName.DCP_SHARDED: DcpInfo,
    LayoutName.TORCH_DIST: TorchDistInfo,
    LayoutName.PYTORCH_BIN: PytorchBinInfo,
    LayoutName.GGUF: GgufInfo,
}


# -- the scanned checkpoint -----------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class ScannedCheckpoint:
    """Everything a scan read: headers, JSON files, config, the layout's own record.

    `path` is the checkpoint folder (a local `Path`, or the `RemoteURL` of a remote one);
    every `file` below is relative to it. `storage` is the storage rooted there that read
    it: every later read (tensor data, a repair's old contents, consolidation) goes through
    it, with the same rules; None means `LocalStorage(path)`.
    """

    path: Path | RemoteURL
    layout: LayoutName
    info: LayoutInfo
    shards: tuple[ShardHeader, ...] = ()
    index: IndexDoc | None = None
    config: Mapping[str, Any] | None = None
    quant_config: Mapping[str, Any] | None = None
    spec: ModelSpec = field(default_factory=ModelSpec)
    logical: LogicalTensors | None = None
    read_problems: tuple[ReadProblem, ...] = ()
    # Names of JSON files we looked for and found, e.g. `config.json` and `hf_quant_config.json`.
    json_files: frozenset[str] = frozenset()
    storage: Storage | None = None
    # llm-compressor's recipe.yaml: its QuantizationModifiers (inspector.recipe), or None.
    recipe: tuple[Any, ...] | None = None

    def __post_init__(self) -> None:
        if self.storage is None:
            if not isinstance(self.path, Path):
                raise TypeError(f"{self.path}: a remote checkpoint needs its storage")
            _set(self, "storage", LocalStorage(self.path))
        _set(self, "layout", LayoutName(self.layout))
        if not isinstance(self.info, _INFO_OF[self.layout]):
            raise TypeError(
                f"a {self.layout} checkpoint carries {_INFO_OF[self.layout].__name__}, "
                f"not {type(self.info).__name__}"
            )
        _set(self, "shards", tuple(self.shards))
        _set(self, "read_problems", tuple(self.read_problems))
        _set(self, "config", readonly(self.config))
        _set(self, "quant_config", readonly(self.quant_config))
        _set(self, "json_files", frozenset(self.json_files))

    @property
    def location(self) -> Location:
        """The checkpoint folder in its storage (read files as `location / file`)."""
        assert self.storage is not None  # set in __post_init__
        return Location(self.storage)

    @property
    def local_path(self) -> Path | None:
        """The folder when it is on a local disk (writers need one), else None."""
        return self.path if isinstance(self.path, Path) else None

    # -- layout records -------------------------------------------------------------------

    @property
    def dcp(self) -> DcpInfo | None:
        return self.info if isinstance(self.info, DcpInfo) else None

    @property
    def torch_dist(self) -> TorchDistInfo | None:
        return self.info if isinstance(self.info, TorchDistInfo) else None

    @property
    def sidecars(self) -> Mapping[str, IndexDoc]:
        """Per-layer sidecars by shard file (empty for other layouts)."""
        return self.info.sidecars if isinstance(self.info, PerLayerInfo) else MappingProxyType({})

    @property
    def read_findings(self) -> list[Finding]:
        """What the scan itself met: shard integrity findings, then the findings of the files
        it could not read (codes and advice: `inspector._internal.checkpoint.read_problems`)."""
        return list(self.derived("read_findings", self._read_findings))

    def _read_findings(self) -> tuple[Finding, ...]:
        shard_findings = (f for s in self.shards for f in s.findings)
        return (*shard_findings, *read_problem_findings(self.read_problems))

    def derived(self, key: str, build: Callable[[], T]) -> T:
        """A value computed from this scan once and kept with it (tables, check indexes)."""
        memo: dict[str, Any] = self.__dict__.setdefault("_derived", {})
        if key not in memo:
            memo[key] = build()
        value: T = memo[key]
        return value

    def derived_if_built(self, key: str) -> Any:
        """The value `derived(key, ...)` kept, or None when nothing built it yet."""
        return self.__dict__.get("_derived", {}).get(key)

    # -- tables, built once on first access -------------------------------------------

    @cached_property
    def tables(self) -> Tables:
        return build_tables(self)

    @property
    def tensors(self) -> pd.DataFrame:
        """One row per tensor: name, file, dtype, shape, numel, nbytes, offsets, naming."""
        return self.tables.tensors

    @property
    def values(self) -> pd.DataFrame:
        """One row per tensor with its value statistics and sibling judgement (reads tensor
        data: the table of the last `check(values=...)`, full preferred, else a sample;
        `inspector._internal.checks.values.value_table` for a chosen mode, budget or seed).
        The judging code sits above the scanned checkpoint, so it is found by name like the
        notebook display (`inspector._internal.checkpoint.ui.core_function`)."""
        table: pd.DataFrame = core_function("values")(self)
        return table

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
        the filters (see `inspector._internal.report.query.TensorQuery`)."""
        return ui_function("browse")(self, **options)

    def dashboard(self, **options: Any) -> Any:
        """The notebook dashboard of this scan (the `ui` extra); see `inspector.widgets`."""
        return ui_function("dashboard")(self, **options)

    def __repr__(self) -> str:
        """A line a console shows: where, what layout, how much (a path is shown legible)."""
        errors = len(self.read_problems) + sum(len(s.findings) for s in self.shards)
        return (
            f"<ScannedCheckpoint {legible(self.path)} ({self.layout}): {len(self.shards):,} "
            f"shard files, {plural(errors, READ_ERROR)}>"
        )

    def _repr_html_(self) -> str:
        """Notebook display: summary card and small tables (`inspector._internal.report.html`,
        found by name like the UI: the scanned checkpoint imports nothing above it)."""
        return html_view(self)

    @cached_property
    def _shards_by_file(self) -> dict[str, ShardHeader]:
        return {s.file: s for s in self.shards}
