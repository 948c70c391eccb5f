"""The four tables of a scanned checkpoint: tensors, files, layers, experts. Pure.

Built column-wise (numpy arrays, one DataFrame each) because a checkpoint may hold 300,000
tensors: no per-row pandas work, no `apply`, no groupby over nullable columns. `layer_keys`
is the view the layer key-set comparison reads. Layer numbering (MTP, stacked and fused
tensors): docs/architecture.md, "checkpoint/".
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from functools import cache
from itertools import chain
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import numpy as np

from inspector._internal.checkpoint.naming import (
    KINDS,
    NameColumns,
    parse_names,
    sharded_object_key,
)
from inspector._internal.checkpoint.spec import (
    MAX_EXPERTS,
    MAX_LAYERS,
    ModelSpec,
    layer_types_from_config,
)
from inspector._internal.common.columns import Coded, code_table
from inspector._internal.findings.finding import Finding
from inspector._internal.formats.safetensors import ShardHeader

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "EXPERT_SOURCES",
    "Figures",
    "LayerKeys",
    "ScanColumns",
    "ScanView",
    "Tables",
    "build_tables",
    "layer_keys",
    "name_leaves",
    "rows_named",
    "scan_columns",
    "scan_figures",
    "tensor_columns",
]

T = TypeVar("T")


# What the tables read of a scan, as types of this module's own: the scanned checkpoint
# (`checkpoint.scanned`) builds its tables here, so this module cannot import it back.
class _Logical(Protocol):
    @property
    def name(self) -> tuple[str, ...]: ...
    @property
    def file(self) -> Coded[str]: ...
    @property
    def dtype(self) -> Coded[str]: ...
    @property
    def shape(self) -> Coded[tuple[int, ...]]: ...
    @property
    def nbytes(self) -> np.ndarray: ...
    @property
    def begin(self) -> np.ndarray | None: ...
    @property
    def end(self) -> np.ndarray | None: ...


class _TorchDist(Protocol):
    @property
    def byte_keys(self) -> tuple[str, ...]: ...
    @property
    def storage(self) -> Mapping[tuple[str, tuple[int, ...]], tuple[str, int, int]]: ...
    @property
    def distcp_sizes(self) -> Mapping[str, int]: ...


class ScanView(Protocol):
    """A scanned checkpoint as the tables see it (`ScannedCheckpoint` is one)."""

    @property
    def spec(self) -> ModelSpec: ...
    @property
    def config(self) -> Mapping[str, Any] | None: ...
    @property
    def shards(self) -> tuple[ShardHeader, ...]: ...
    @property
    def logical(self) -> _Logical | None: ...
    @property
    def torch_dist(self) -> _TorchDist | None: ...
    @property
    def read_findings(self) -> list[Finding]: ...
    @property
    def tensors(self) -> pd.DataFrame: ...
    @property
    def tables(self) -> Tables: ...
    def derived(self, key: str, build: Callable[[], T]) -> T: ...


_INT64_MAX = np.iinfo(np.int64).max
# Kinds that, inside an MTP block, belong to the MTP head rather than to a standard part.
_MTP_OWN = np.isin(np.asarray(KINDS), ("norm", "embedding", "output_head", "other"))
_MTP_KIND = KINDS.index("mtp")
_ROUTED = [KINDS.index("expert"), KINDS.index("router")]
# Hostile shapes or configs must not make the expansions allocate without bound.
_MAX_EXPANSION = 5_000_000
# Layer and expert numbers have at most 9 digits (naming), so (layer << 30 | expert) fits.
_SHIFT = 30
# Value ranges up to this (plus 4 per value) are grouped by counting instead of sorting.
_DENSE = 1 << 16


@dataclass(frozen=True)
class Tables:
    """The four tables; see `build_tables` for their columns."""

    tensors: pd.DataFrame
    files: pd.DataFrame
    layers: pd.DataFrame
    experts: pd.DataFrame
    # The layer number of the first MTP block (after the decoder layers).
    mtp_base: int = 0
    # The tensors table's `name` column as the scan's own strings: reading the column back
    # from pandas' Arrow strings makes a new string per row (0.1 s and ~60 bytes per tensor
    # at 300,000 tensors).
    names: Sequence[str] = ()


def rows_named(tensors: pd.DataFrame, names: Iterable[str]) -> np.ndarray:
    """A boolean mask of the rows of `tensors` whose `name` is one of `names`. A set lookup
    per row: pandas' `isin` on an Arrow string column converts every wanted name to an Arrow
    scalar first, 10 s for the 300,000 names of an index, this a fraction of a second."""
    wanted = names if isinstance(names, AbstractSet) else set(names)
    column = tensors["name"].tolist()
    return np.fromiter((n in wanted for n in column), dtype=bool, count=len(column))


def build_tables(scanned: ScanView) -> Tables:
    """Build the tables of `scanned`.

    - tensors: name, file, dtype, shape, numel, nbytes, begin, end, layer, expert, module,
      param, kind, family, is_mtp, fused, stacked (one row per tensor: the logical tensors
      when the layout has them, else every shard entry);
    - files: file, size, header_bytes (the JSON header length N), tensors, tensor_bytes,
      first_layer, last_layer, layers, readable, problems;
    - layers: layer, kind, is_mtp, tensors, bytes, parameters, experts_found,
      experts_expected, experts_source (which of `EXPERT_SOURCES` set experts_expected:
      the config, the layer's router or the sibling layers), dtypes (decoder layers the
      config declares but nobody stores are rows with tensors=0; MTP rows are only the
      stored MTP layers);
    - experts: layer, expert, tensors_found, tensors_expected, bytes, missing.
    """
    import pandas as pd

    columns = scan_columns(scanned)
    source, parsed, numbering = columns.tensors, columns.parsed, columns.numbering
    tensors = _tensors_frame(source, parsed, numbering)
    files = _files_frame(scanned, source, numbering, columns.depth)
    experts = _experts_frame(columns.experts)
    layers = pd.DataFrame(columns.layers)
    # The summary's figures from the same columns: a later summary reads them, not the frames.
    scanned.derived("figures", lambda: _figures(source, columns.layers, len(files)))
    return Tables(tensors, files, layers, experts, numbering.mtp_base, source.names)


@dataclass(frozen=True, slots=True)
class ScanColumns:
    """What the tables are built from, as numpy columns, built once per scan
    (`scan_columns`): the rules of `check` and a scan's summary read these, so that neither
    builds a frame nor imports pandas.

    - tensors: one entry per row of the tensors table (names, file and dtype codes, shapes,
      numel, bytes, offsets);
    - parsed: what each name says (`parse_names`: expert, module, param, stacked, fused);
    - numbering: each tensor's global layer (-1: none), MTP flag and kind code (into
      `KINDS`, MTP-head parts relabelled "mtp"): the tensors table's layer, is_mtp, kind;
    - layers: the layers table's columns (numpy arrays, `kind` and `dtypes` lists);
    - experts: the experts table's columns.
    """

    tensors: _Source
    parsed: NameColumns
    numbering: _Numbering
    layers: dict[str, Any]
    experts: dict[str, np.ndarray]
    # The decoder layers stacked tensors hold (`_stack_depth`).
    depth: int


def scan_columns(scanned: ScanView) -> ScanColumns:
    """The `ScanColumns` of `scanned`, built once and kept with it."""
    return scanned.derived("columns", lambda: _scan_columns(scanned))


def name_leaves(scanned: ScanView) -> Coded[str]:
    """Each tensor's last dotted component (`name.rpartition(".")[2]`: the whole name when it
    has no dot), coded, from the name columns (`NameColumns.leaf`): the parameter count
    judges these, and a name is `leaf` or ends with `.leaf` exactly when this is `leaf`."""
    return scan_columns(scanned).parsed.leaf


def _scan_columns(scanned: ScanView) -> ScanColumns:
    source = _source(scanned)
    parsed = parse_names(source.names)
    depth = _stack_depth(source.shape, parsed)
    numbering = _Numbering.of(parsed, scanned.spec, depth)
    expert_columns, layer_columns = _grouped(scanned, source, parsed, numbering)
    return ScanColumns(source, parsed, numbering, layer_columns, expert_columns, depth)


@dataclass(frozen=True, slots=True)
class Figures:
    """What a scan's summary says of its tensors and layers, computed from the numpy columns
    the tables are built from (`scan_figures`), so that a scan that prints its summary never
    builds a frame nor imports pandas. Per layer (the `layers` table's rows): layer,
    is_mtp, kind, experts_found."""

    tensors: int
    total_bytes: int
    # (dtype, bytes), most bytes first, as `tensors.groupby("dtype")["nbytes"].sum()
    # .sort_values(ascending=False)` orders them.
    dtype_bytes: tuple[tuple[str, int], ...]
    files: int
    layer: np.ndarray
    is_mtp: np.ndarray
    kind: list[str]
    experts_found: np.ndarray


def scan_figures(scanned: ScanView) -> Figures:
    """The `Figures` of `scanned`, computed once: from the tables' columns when they are
    built (`build_tables` keeps them), else from the same numpy steps without the frames."""
    return scanned.derived("figures", lambda: _figures_alone(scanned))


def _figures_alone(scanned: ScanView) -> Figures:
    columns = scan_columns(scanned)
    source, layer_columns = columns.tensors, columns.layers
    files = _file_rows(scanned, source)
    known = {r[0] for r in files}
    count = len(files) + sum(f not in known for f in _entry_files(scanned, source))
    return _figures(source, layer_columns, count)


def _figures(source: _Source, layers: dict[str, Any], files: int) -> Figures:
    return Figures(
        len(source.names),
        int(source.nbytes.sum()),
        _dtype_bytes(source),
        files,
        layers["layer"],
        layers["is_mtp"],
        layers["kind"],
        layers["experts_found"],
    )


def _dtype_bytes(source: _Source) -> tuple[tuple[str, int], ...]:
    """Bytes per dtype present, as pandas' `groupby(observed=True).sum()` then
    `sort_values(ascending=False)` give them: groups in the dtypes' first-seen order, then
    pandas' descending sort (`pandas.core.sorting.nargsort`: the values reversed, sorted
    with numpy's default kind, the order reversed back), which decides the order of ties."""
    codes = source.dtype_codes
    if not len(codes):
        return ()
    order = np.argsort(codes, kind="stable")
    present, starts = np.unique(codes[order], return_index=True)
    # int64 sums, exact (bincount's weights would be floats).
    sums = np.add.reduceat(source.nbytes[order], starts)
    indexer = sums[::-1].argsort(kind="quicksort")
    ranked = np.arange(len(sums))[::-1][indexer][::-1]
    return tuple((str(source.dtypes[present[i]]), int(sums[i])) for i in ranked.tolist())


def _grouped(
    scanned: ScanView, source: _Source, parsed: NameColumns, numbering: _Numbering
) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The experts' and the layers' columns (numpy, before any frame)."""
    spec = scanned.spec
    contrib = _contributions(source, parsed, numbering)
    moe = _moe_layers(contrib, spec)
    count = _expected_ids(contrib, spec, moe, _router_experts(source, parsed, numbering))
    experts = _expert_columns(contrib, moe, count)
    return experts, _layer_columns(contrib, experts, scanned, numbering, moe, count)


# -- 1. where the tensors come from -----------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Source:
    names: list[str]
    file_codes: np.ndarray
    files: list[str]
    dtype_codes: np.ndarray
    dtypes: list[str]
    shape: Coded[tuple[int, ...]]
    numel: np.ndarray
    nbytes: np.ndarray
    begin: np.ndarray
    end: np.ndarray
    # True where begin/end are unknown (logical tensors not stored as one byte range).
    no_range: np.ndarray


def tensor_columns(scanned: ScanView) -> _Source:
    """The tensors table's own columns (names, dtype codes, numel, bytes...) as numpy: for a
    figure that needs no frame (the parameter count of a scan's summary)."""
    return scan_columns(scanned).tensors


def _source(scanned: ScanView) -> _Source:
    """The logical tensors if the layout built them, else every shard's header entries."""
    if scanned.logical is not None:
        lt = scanned.logical
        n = len(lt.name)
        has_range = lt.begin is not None and lt.end is not None
        return _Source(
            list(lt.name),
            lt.file.codes.astype(np.int64),
            list(lt.file.values),
            lt.dtype.codes.astype(np.int64),
            list(lt.dtype.values),
            lt.shape,
            _shape_numel(lt.shape),
            np.asarray(lt.nbytes, dtype=np.int64),
            np.asarray(lt.begin, dtype=np.int64) if has_range else np.zeros(n, np.int64),
            np.asarray(lt.end, dtype=np.int64) if has_range else np.zeros(n, np.int64),
            np.full(n, not has_range, dtype=bool),
        )
    return _shard_source(scanned.shards)


def _shard_source(shards: Sequence[ShardHeader]) -> _Source:
    """Every shard's header entries: the columns are concatenated, never expanded into
    Python objects (names are the shards' own strings, shapes their shared tuples)."""
    index: dict[str, int] = {}
    per_shard = [index.setdefault(s.file, len(index)) for s in shards]
    counts = [len(s.names) for s in shards]
    names = list(chain.from_iterable(s.names for s in shards))
    begin = _concat([s.begins for s in shards])
    end = _concat([s.ends for s in shards])
    dtype = Coded.concat([s.dtype for s in shards])
    shape = Coded.concat([s.shape for s in shards])
    return _Source(
        names,
        np.repeat(np.asarray(per_shard, dtype=np.int64), counts),
        list(index),
        dtype.codes.astype(np.int64),
        list(dtype.values),
        shape,
        _shape_numel(shape),
        end - begin,
        begin,
        end,
        np.zeros(len(names), dtype=bool),
    )


def _concat(arrays: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(arrays) if arrays else np.zeros(0, np.int64)


def _shape_numel(shape: Coded[tuple[int, ...]]) -> np.ndarray:
    """Elements per row: each distinct shape multiplied out once (clamped to int64 for
    hostile shapes)."""
    per_shape = _int64([min(math.prod(s), _INT64_MAX) for s in shape.values] or [0])
    return per_shape[shape.codes]


def _codes(values: Iterable[str], count: int = -1) -> tuple[np.ndarray, list[str]]:
    """(int64 codes, distinct values in first-seen order). A dict pass in C: a value the
    dict does not have yet gets the dict's current length as its code. `count` is
    `len(values)` when `values` is an iterator."""
    if count < 0:
        values = list(values)
        count = len(values)
    index: defaultdict[str, int] = code_table()
    codes = np.fromiter(map(index.__getitem__, values), dtype=np.int64, count=count)
    return codes, [str(u) for u in index]


def _int64(values: Iterable[int]) -> np.ndarray:
    """int64 array; values past int64 (a hostile header) are clamped instead of raising.
    `np.fromiter` with a known count is about twice as fast as `np.asarray` on a list."""
    values = values if isinstance(values, list) else list(values)
    try:
        return np.fromiter(values, dtype=np.int64, count=len(values))
    except OverflowError:
        lo, hi = np.iinfo(np.int64).min, _INT64_MAX
        return np.asarray([min(max(v, lo), hi) for v in values], dtype=np.int64)


# -- 2. layer numbering -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Numbering:
    """Global layer number per tensor (-1: none), which rows are MTP, and kind codes with
    MTP-head parts relabelled "mtp"."""

    layer: np.ndarray
    is_mtp: np.ndarray
    kind: np.ndarray
    # The first MTP layer number (spec.num_layers, else past the last decoder layer seen,
    # numbered or stacked).
    mtp_base: int

    @staticmethod
    def of(
        parsed: NameColumns, spec: ModelSpec, stack_depth: int = 0, base: int | None = None
    ) -> _Numbering:
        """`stack_depth`: the layers stacked tensors hold on their leading axis (torch_dist
        keeps them without a layer number, so only their shape says how many there are);
        `base`: the first MTP layer number when another numbering already fixed it."""
        layer = parsed.layer.copy()
        decoder = layer[(layer >= 0) & ~parsed.mtp]
        if base is not None:
            pass
        elif spec.num_layers is not None:
            base = spec.num_layers
        else:
            base = max(int(decoder.max()) + 1 if len(decoder) else 0, stack_depth)
        is_mtp = parsed.mtp.copy()
        # `mtp.layers.{k}` counts MTP blocks from 0 (Megatron), but Model-Optimizer's HF
        # export numbers them after the decoder (`mtp.layers.{num_layers + k}`): a number
        # at or past the base is already the global layer number.
        k = layer[is_mtp]
        layer[is_mtp] = np.where(k >= base, k, base + np.maximum(k, 0))
        if spec.mtp_layers > 0 and spec.num_layers is not None:
            # DeepSeek spelling: extra `model.layers.{num_hidden_layers + k}` layers.
            is_mtp |= layer >= base
        kind = parsed.texts["kind"].codes.astype(np.int64)
        kind[is_mtp & _MTP_OWN[kind]] = _MTP_KIND
        return _Numbering(layer, is_mtp, kind, base)


def _stack_depth(shape: Coded[tuple[int, ...]], parsed: NameColumns) -> int:
    """Decoder layers stacked tensors hold: the largest leading axis of a stacked tensor."""
    stacked = np.flatnonzero(parsed.stacked & (parsed.layer < 0))
    depth = _axis(shape, stacked, 0)
    return int(depth.max()) if len(depth) else 0


# -- 3. tensors -------------------------------------------------------------------------


def _tensors_frame(source: _Source, parsed: NameColumns, numbering: _Numbering) -> pd.DataFrame:
    import pandas as pd

    return pd.DataFrame(
        {
            "name": _name_column(source.names),
            "file": pd.Categorical.from_codes(source.file_codes, pd.Index(source.files)),
            "dtype": pd.Categorical.from_codes(source.dtype_codes, pd.Index(source.dtypes)),
            "shape": _shape_column(source.shape),
            "numel": source.numel,
            "nbytes": source.nbytes,
            "begin": pd.arrays.IntegerArray(source.begin, source.no_range.copy()),
            "end": pd.arrays.IntegerArray(source.end, source.no_range.copy()),
            "layer": pd.arrays.IntegerArray(numbering.layer, numbering.layer < 0),
            "expert": pd.arrays.IntegerArray(parsed.expert, parsed.expert < 0),
            "module": parsed.module,
            "param": parsed.param,
            "kind": pd.Categorical.from_codes(numbering.kind, pd.Index(KINDS)),
            "family": parsed.family,
            "is_mtp": numbering.is_mtp,
            "fused": parsed.fused,
            "stacked": parsed.stacked,
        },
        # Every column is a fresh array nobody else writes to; copying them costs ~20 ms.
        copy=False,
    )


@cache
def _str_dtype() -> Any:
    """The dtype pandas gives a column of Python strings (Arrow-backed `str` in pandas 3)."""
    import pandas as pd

    return pd.Series(np.array([""], dtype=object)).dtype


def _name_column(names: list[str]) -> Any:
    """The name column as pandas would infer it from the strings, built in one piece when
    that is an Arrow string column: the names joined and encoded once, their offsets a
    cumulative sum. pandas' own conversion appends each string to a growing Arrow buffer,
    which left about 120 bytes per tensor of memory behind against 60 this way (of a
    300,000-tensor check's peak of 670). Any other case (no pyarrow, a string that is not
    UTF-8 encodable) takes pandas' own conversion."""
    import pandas as pd

    n = len(names)
    plain = np.fromiter(names, dtype=object, count=n)
    str_dtype = _str_dtype()
    # pandas leaves an empty object column as it is.
    if not n or not (isinstance(str_dtype, pd.StringDtype) and str_dtype.storage == "pyarrow"):
        return plain
    try:
        import pyarrow as pa

        data = "".join(names).encode("utf-8")
    except (ImportError, TypeError, UnicodeEncodeError):
        return plain
    del plain
    lengths = np.fromiter(map(len, names), dtype=np.int64, count=n)
    if len(data) != int(lengths.sum()):  # non-ASCII: the lengths in UTF-8 bytes
        lengths = np.fromiter(map(len, map(str.encode, names)), dtype=np.int64, count=n)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    array = pa.LargeStringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(data))
    return pd.array(array, dtype=str_dtype)


def _shape_column(shape: Coded[tuple[int, ...]]) -> np.ndarray:
    """The shapes as an object column whose rows point at the shared tuples (8 bytes a row,
    no tuple per row)."""
    table = np.empty(len(shape.values), dtype=object)
    for i, value in enumerate(shape.values):
        table[i] = value
    return table[shape.codes]


# -- 4. what each tensor contributes to layers and experts ------------------------------


@dataclass(frozen=True, slots=True)
class _Contrib:
    """Per-layer rows (one per tensor and layer) and per-expert rows (one per tensor, layer
    and expert) after spreading stacked and fused tensors over their axes."""

    layer: np.ndarray
    nbytes: np.ndarray
    numel: np.ndarray
    dtype: np.ndarray
    kind: np.ndarray
    is_mtp: np.ndarray
    dtypes: list[str]
    e_layer: np.ndarray
    e_expert: np.ndarray
    e_nbytes: np.ndarray


def _contributions(source: _Source, parsed: NameColumns, numbering: _Numbering) -> _Contrib:
    """1. a tensor with a layer counts once for it; 2. a stacked tensor counts once for
    each index of its leading axis, with its bytes split evenly; 3. expert rows follow."""
    layer = numbering.layer
    own = np.flatnonzero(layer >= 0)
    stacked = np.flatnonzero(parsed.stacked & (layer < 0))
    depth = _axis(source.shape, stacked, 0)
    st_rows, st_layer = _spread(stacked, depth)
    rows = np.concatenate([own, st_rows])
    share = np.concatenate([np.ones(len(own), np.int64), np.repeat(np.maximum(depth, 1), depth)])
    e_layer, e_expert, e_nbytes = _expert_rows(source, parsed, layer)
    return _Contrib(
        np.concatenate([layer[own], st_layer]),
        source.nbytes[rows] // share,
        source.numel[rows] // share,
        source.dtype_codes[rows],
        numbering.kind[rows],
        numbering.is_mtp[rows],
        source.dtypes,
        e_layer,
        e_expert,
        e_nbytes,
    )


def _expert_rows(source: _Source, parsed: NameColumns, layer: np.ndarray) -> tuple[np.ndarray, ...]:
    """(layer, expert, bytes) per expert a tensor holds: numbered expert tensors hold one;
    fused ones (expert axis 0) and stacked fused ones (layer axis 0, expert axis 1) many."""
    expert, fused, shapes = parsed.expert, parsed.fused, source.shape
    numbered = np.flatnonzero((expert >= 0) & (layer >= 0))
    flat = np.flatnonzero(fused & (layer >= 0))
    width = _axis(shapes, flat, 0)
    f_rows, f_expert = _spread(flat, width)
    deep = np.flatnonzero(fused & parsed.stacked & (layer < 0))
    d_width = _axis(shapes, deep, 1)
    cells = _capped(_axis(shapes, deep, 0) * d_width)
    d_rows, d_index = _spread(deep, cells)
    d_cols = np.repeat(np.maximum(d_width, 1), cells)
    rows = np.concatenate([numbered, f_rows, d_rows])
    share = np.concatenate(
        [
            np.ones(len(numbered), np.int64),
            np.repeat(np.maximum(width, 1), width),
            np.repeat(np.maximum(cells, 1), cells),
        ]
    )
    return (
        np.concatenate([layer[numbered], layer[f_rows], d_index // d_cols]),
        np.concatenate([expert[numbered], f_expert, d_index % d_cols]),
        source.nbytes[rows] // share,
    )


def _axis(shape: Coded[tuple[int, ...]], rows: np.ndarray, axis: int) -> np.ndarray:
    """Size of `axis` of each row's shape (0 when it has no such axis), capped."""
    sizes = _int64([min(s[axis], _INT64_MAX) if len(s) > axis else 0 for s in shape.values] or [0])
    return _capped(sizes[shape.codes[rows]] if len(rows) else np.zeros(0, np.int64))


def _capped(sizes: np.ndarray) -> np.ndarray:
    """The sizes, or all zeros when spreading over them would exceed the expansion cap."""
    if len(sizes) and (sizes.max() > _MAX_EXPANSION or sizes.sum() > _MAX_EXPANSION):
        return np.zeros(len(sizes), np.int64)
    return sizes


def _spread(rows: np.ndarray, sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each row repeated `size` times, with the index 0..size-1 of each copy."""
    repeated = np.repeat(rows, sizes)
    starts = np.repeat(np.cumsum(sizes) - sizes, sizes)
    return repeated, np.arange(len(repeated), dtype=np.int64) - starts


def _group(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(sorted distinct values, position of each value among them), like `np.unique` with
    `return_inverse`. Small non-negative ints (layer and expert numbers, codes) are counted
    instead of sorted: a few ms instead of ~50 ms for 600,000 values."""
    values = np.asarray(values, dtype=np.int64)
    if len(values) and values.min() >= 0 and values.max() < _DENSE + 4 * len(values):
        present = np.zeros(int(values.max()) + 1, dtype=bool)
        present[values] = True
        rank = np.cumsum(present) - 1
        return np.flatnonzero(present), rank[values]
    distinct, inverse = np.unique(values, return_inverse=True)
    return distinct, inverse.reshape(-1)


def _union(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The sorted distinct int64 values of `a` and `b`, as `np.union1d` gives them. Sorted
    here: numpy's `unique` without an index asked for imports `numpy.ma` to test for a
    masked array (numpy 2.x), 10-60 ms of a scan's CPU for an array that never is one."""
    both = np.sort(np.concatenate([a, b]).astype(np.int64, copy=False))
    keep = np.ones(len(both), dtype=bool)
    keep[1:] = both[1:] != both[:-1]
    return both[keep]


def _pairs(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The distinct (a, b) pairs sorted by a then b, as two arrays, and each row's pair."""
    a_values, a_rank = _group(a)
    b_values, b_rank = _group(b)
    width = max(len(b_values), 1)
    keys, inverse = _group(a_rank * width + b_rank)
    return a_values[keys // width], b_values[keys % width], inverse


def _sums(inverse: np.ndarray, n: int, values: np.ndarray) -> np.ndarray:
    """Per-group sums. Float accumulation is exact below 2**53 bytes (9 PB) per group."""
    return np.rint(np.bincount(inverse, weights=values, minlength=n)).astype(np.int64)


# -- 5. experts -------------------------------------------------------------------------


def _moe_layers(contrib: _Contrib, spec: ModelSpec) -> np.ndarray:
    """Decoder layers the config calls MoE, plus every layer holding expert or router
    tensors (DeepSeek's MTP block is MoE too)."""
    declared = np.asarray(sorted(spec.moe_layers or ()), dtype=np.int64)
    routed = contrib.layer[np.isin(contrib.kind, _ROUTED)]
    return _group(np.concatenate([declared, contrib.e_layer, routed]))[0]


# Where a layer's expected expert count came from, strongest first (ties go to the first).
EXPERT_SOURCES = ("config", "router", "siblings")


@dataclass(frozen=True, slots=True)
class _ExpertCounts:
    """Experts expected per MoE layer (aligned with the sorted MoE layer numbers) and which
    source set each: a code into `EXPERT_SOURCES`."""

    count: np.ndarray
    source: np.ndarray


def _router_experts(source: _Source, parsed: NameColumns, numbering: _Numbering) -> dict[int, int]:
    """layer -> rows of its router weight. The router (`mlp.gate.weight` [E, H],
    `mlp.router.weight`, Megatron's stacked `decoder.layers.mlp.router.weight` [L, E, H]) is
    never split by expert parallelism, so it keeps the global expert count when the experts
    were saved under local ids or the config is unreadable."""

    router = (numbering.kind == KINDS.index("router")) & parsed.texts["param"].equals("weight")
    layer = numbering.layer
    out: dict[int, int] = {}
    for row in np.flatnonzero(router).tolist():
        shape = source.shape[row]
        if layer[row] >= 0 and len(shape) == 2:
            rows = {int(layer[row]): shape[0]}
        elif layer[row] < 0 and parsed.stacked[row] and len(shape) == 3:
            rows = dict.fromkeys(range(min(shape[0], MAX_LAYERS)), shape[1])
        else:
            continue
        for at, experts in rows.items():
            if 0 < experts <= MAX_EXPERTS:
                out[at] = max(out.get(at, 0), experts)
    return out


def _expected_ids(
    contrib: _Contrib, spec: ModelSpec, moe: np.ndarray, routers: dict[int, int]
) -> _ExpertCounts:
    """Experts per MoE layer: the most any source says, of the config's count, the layer's
    router rows and the experts its sibling layers hold (highest id + 1): experts lost from
    every layer at once (expert-parallel ranks overwriting each other) still show, through
    the router, when the config is unreadable."""
    siblings = int(contrib.e_expert.max()) + 1 if len(contrib.e_expert) else 0
    config = spec.experts_per_layer or 0
    router = np.asarray([routers.get(x, 0) for x in moe.tolist()], dtype=np.int64)
    options = np.stack([np.full(len(moe), config), router, np.full(len(moe), siblings)]).astype(
        np.int64
    )
    return _ExpertCounts(options.max(axis=0), options.argmax(axis=0))


def _expert_columns(
    contrib: _Contrib, moe: np.ndarray, expected: _ExpertCounts
) -> dict[str, np.ndarray]:
    """The experts table's columns: one row per MoE layer and expert id, the expected ids
    0..count-1 of each layer and any other id seen. The grid is skipped when a hostile
    config would make it huge."""
    k_layer, k_expert, inverse = _pairs(contrib.e_layer, contrib.e_expert)
    keys = (k_layer << _SHIFT) | k_expert
    grid = np.zeros(0, np.int64)
    counts = expected.count
    if 0 < counts.sum() <= _MAX_EXPANSION:
        g_layer, g_expert = _spread(moe, counts)
        grid = (g_layer << _SHIFT) | g_expert
    every = _union(grid, keys)
    at = np.searchsorted(every, keys)
    tensors_found = np.zeros(len(every), np.int64)
    tensors_found[at] = np.bincount(inverse, minlength=len(keys))
    nbytes = np.zeros(len(every), np.int64)
    nbytes[at] = _sums(inverse, len(keys), contrib.e_nbytes)
    layer = every >> _SHIFT
    expert = every & ((1 << _SHIFT) - 1)
    limit = np.zeros(len(every), np.int64)
    known = np.isin(layer, moe)
    limit[known] = counts[np.searchsorted(moe, layer[known])]
    return {
        "layer": layer,
        "expert": expert,
        "tensors_found": tensors_found,
        "tensors_expected": _majority(layer, tensors_found),
        "bytes": nbytes,
        "missing": (tensors_found == 0) & (expert < limit),
    }


def _experts_frame(columns: dict[str, np.ndarray]) -> pd.DataFrame:
    import pandas as pd

    order = ("layer", "expert", "tensors_found", "tensors_expected", "bytes", "missing")
    return pd.DataFrame({k: columns[k] for k in order})


def _majority(layer: np.ndarray, found: np.ndarray) -> np.ndarray:
    """Per layer, the most common non-zero tensors-per-expert count (ties: the larger);
    a layer without any expert tensor takes the most common count over all layers."""
    present = found > 0
    if not present.any():
        return np.zeros(len(layer), np.int64)
    p_layer, p_found, inverse = _pairs(layer[present], found[present])
    n = np.bincount(inverse, minlength=len(p_layer))
    # Pairs sorted by (layer, n, count): each layer's last is its choice.
    order = np.lexsort((p_found, n, p_layer))
    last = np.ones(len(order), dtype=bool)
    last[:-1] = p_layer[order][1:] != p_layer[order][:-1]
    chosen_layer, chosen = p_layer[order][last], p_found[order][last]
    values, at = _group(found[present])
    counts = np.bincount(at, minlength=len(values))
    fallback = values[np.lexsort((values, counts))[-1]]
    out = np.full(len(layer), fallback, dtype=np.int64)
    where = np.searchsorted(chosen_layer, layer)
    hit = where < len(chosen_layer)
    hit[hit] = chosen_layer[where[hit]] == layer[hit]
    out[hit] = chosen[where[hit]]
    return out


# -- 6. layers --------------------------------------------------------------------------


def _layer_columns(
    contrib: _Contrib,
    experts: dict[str, np.ndarray],
    scanned: ScanView,
    numbering: _Numbering,
    moe: np.ndarray,
    expected: _ExpertCounts,
) -> dict[str, Any]:
    """The layers table's columns, in order: one row per layer seen or declared (decoder
    layers, then MTP layers).

    1. aggregate the per-layer contributions; 2. add declared layers without tensors;
    3. experts found / expected from the experts table; 4. dtypes and kind per layer.
    """
    seen, inverse = _group(contrib.layer)
    n = len(seen)
    # Declared decoder layers appear even without tensors (layer-missing); declared MTP
    # layers do not: their absence is the mtp-missing finding, and is_mtp rows are stored ones.
    declared = np.arange(scanned.spec.num_layers or 0)
    layers = _union(seen, declared)
    at = np.searchsorted(layers, seen)

    def spread(values: np.ndarray, dtype: type = np.int64) -> np.ndarray:
        out: np.ndarray = np.zeros(len(layers), dtype=dtype)
        out[at] = values
        return out

    is_mtp = spread(np.bincount(inverse, weights=contrib.is_mtp, minlength=n) > 0, bool)
    # Expert ids with tensors, counted per layer (a layer of no row here counts 0).
    with_experts = experts["layer"][experts["tensors_found"] > 0]
    listed = np.isin(with_experts, layers)
    experts_found = np.bincount(
        np.searchsorted(layers, with_experts[listed]), minlength=len(layers)
    ).astype(np.int64)
    in_moe = np.isin(layers, moe)
    at_moe = np.searchsorted(moe, layers[in_moe])
    experts_expected = np.zeros(len(layers), np.int64)
    experts_expected[in_moe] = expected.count[at_moe]
    source = np.full(len(layers), "", dtype=object)
    source[in_moe] = np.asarray(EXPERT_SOURCES, dtype=object)[expected.source[at_moe]]
    dtypes = _value_sets(seen, inverse, contrib.dtype, contrib.dtypes)
    kinds = _value_sets(seen, inverse, contrib.kind, list(KINDS))
    types = layer_types_from_config(scanned.config)
    return {
        "layer": layers,
        "kind": _layer_kinds(layers, is_mtp, kinds, moe, types, scanned.spec),
        "is_mtp": is_mtp,
        "tensors": spread(np.bincount(inverse, minlength=n)),
        "bytes": spread(_sums(inverse, n, contrib.nbytes)),
        "parameters": spread(_sums(inverse, n, contrib.numel)),
        "experts_found": experts_found,
        "experts_expected": experts_expected,
        "experts_source": source,
        "dtypes": [",".join(sorted(dtypes.get(x, ()))) for x in layers.tolist()],
    }


def _value_sets(
    seen: np.ndarray, inverse: np.ndarray, codes: np.ndarray, names: list[str]
) -> dict[int, set[str]]:
    """layer -> the distinct values (by code) its contributions have."""
    width = max(len(names), 1)
    pairs = _group(inverse.astype(np.int64) * width + codes)[0]
    out: dict[int, set[str]] = {}
    for group, code in zip((pairs // width).tolist(), (pairs % width).tolist(), strict=True):
        out.setdefault(int(seen[group]), set()).add(names[code])
    return out


_TENSOR_KINDS = (("mamba", "mamba"), ("dense_mlp", "dense"), ("attention", "attention"))


def _layer_kinds(
    layers: np.ndarray,
    is_mtp: np.ndarray,
    kinds: dict[int, set[str]],
    moe: np.ndarray,
    types: tuple[str, ...] | None,
    spec: ModelSpec,
) -> list[str]:
    """mtp > moe (config or experts present) > the config's block pattern > what the
    tensors show (mamba, dense, attention) > "dense" for a declared layer > "other"."""
    moe_set = set(moe.tolist())
    declared = spec.num_layers if spec.moe_layers is not None else None
    out: list[str] = []
    for layer, mtp in zip(layers.tolist(), is_mtp.tolist(), strict=True):
        present = kinds.get(layer, set())
        if mtp:
            out.append("mtp")
        elif layer in moe_set:
            out.append("moe")
        elif types is not None and 0 <= layer < len(types):
            out.append(types[layer])
        elif label := next((lb for k, lb in _TENSOR_KINDS if k in present), None):
            out.append(label)
        else:
            out.append("dense" if declared is not None and layer < declared else "other")
    return out


# -- 7. files ---------------------------------------------------------------------------


def _files_frame(
    scanned: ScanView, source: _Source, numbering: _Numbering, depth: int
) -> pd.DataFrame:
    """One row per data file: shards (also of DCP layouts) or torch_dist `.distcp` files.

    1. the files we know of, with size and header length; 2. what each stores, as
    (file, layer, bytes) entries; 3. per-file counts, byte sums and layer ranges."""
    import pandas as pd

    rows = _file_rows(scanned, source)
    files, codes, layer, nbytes = _file_entries(scanned, source, numbering, depth)
    known = {r[0] for r in rows}
    rows += [(f, None, None, False) for f in files if f not in known]
    names = [r[0] for r in rows]
    position = {f: i for i, f in enumerate(names)}
    # Entries' file codes -> row positions in the frame.
    where = np.asarray([position[f] for f in files], dtype=np.int64)[codes] if len(codes) else codes
    n = len(rows)
    first, last, distinct = _layer_ranges(where, layer, n)
    problems = Counter(f.file for f in scanned.read_findings if f.file is not None)
    return pd.DataFrame(
        {
            "file": pd.array(names, dtype=object),
            "size": pd.array([r[1] for r in rows], dtype="Int64"),
            "header_bytes": pd.array([r[2] for r in rows], dtype="Int64"),
            "tensors": np.bincount(where, minlength=n).astype(np.int64),
            "tensor_bytes": _sums(where, n, nbytes),
            "first_layer": pd.arrays.IntegerArray(first, first < 0),
            "last_layer": pd.arrays.IntegerArray(last, last < 0),
            "layers": distinct,
            "readable": np.asarray([bool(r[3]) for r in rows], dtype=bool),
            "problems": np.asarray([problems.get(f, 0) for f in names], dtype=np.int64),
        }
    )


def _layer_ranges(where: np.ndarray, layer: np.ndarray, n: int) -> tuple[np.ndarray, ...]:
    """Per file: first layer, last layer (-1: none) and the number of distinct layers."""
    has = layer >= 0
    files, layers, _ = _pairs(where[has], layer[has])
    first = np.full(n, -1, np.int64)
    last = np.full(n, -1, np.int64)
    # Pairs come sorted by (file, layer): the last write per file is its largest layer.
    last[files] = layers
    first[files[::-1]] = layers[::-1]
    return first, last, np.bincount(files, minlength=n).astype(np.int64)


def _file_rows(scanned: ScanView, source: _Source) -> list[tuple]:
    """(file, size on disk, JSON header length, readable) of every data file we know of."""
    if scanned.shards:
        return [(s.file, s.file_size, s.header_len, s.readable) for s in scanned.shards]
    if scanned.torch_dist is not None:
        sizes = scanned.torch_dist.distcp_sizes
        return [(f, size, None, True) for f, size in sorted(sizes.items())]
    return [(f, None, None, True) for f in source.files]


def _entry_files(scanned: ScanView, source: _Source) -> list[str]:
    """The files of `_file_entries`, alone (the summary counts the files)."""
    if scanned.logical is None or not (scanned.shards or scanned.torch_dist):
        return source.files
    if scanned.shards:
        return [s.file for s in scanned.shards]
    info = scanned.torch_dist
    items = info.storage.values() if info is not None else ()
    return _codes([value[0] for value in items])[1]


def _file_entries(
    scanned: ScanView, source: _Source, numbering: _Numbering, depth: int
) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray]:
    """(files, file code, layer, bytes) of what each file stores: the tensors themselves
    for plain shards, the shard headers' chunks for DCP, the storage map for torch_dist."""
    if scanned.logical is None or not (scanned.shards or scanned.torch_dist):
        return source.files, source.file_codes, numbering.layer, source.nbytes
    if scanned.shards:
        names = list(chain.from_iterable(s.names for s in scanned.shards))
        counts = [len(s.names) for s in scanned.shards]
        codes = np.repeat(np.arange(len(scanned.shards), dtype=np.int64), counts)
        distinct = [s.file for s in scanned.shards]
        nbytes = _concat([s.ends - s.begins for s in scanned.shards])
    else:
        info = scanned.torch_dist
        items = list(info.storage.items()) if info is not None else []
        names = [key[0] for key, _ in items]
        codes, distinct = _codes([value[0] for _, value in items])
        nbytes = _int64([value[2] for _, value in items])
    layer = _Numbering.of(parse_names(names), scanned.spec, depth).layer
    return distinct, codes, layer, nbytes


# -- 8. the key set of each layer ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LayerKeys:
    """What each layer holds (`layer_keys`), one entry per row: layer, is_mtp, kind (codes
    into `KINDS`), module and param (codes into `modules` and `params`, in the order pandas
    gives their codes: the names' parse order for tensors alone, first seen once sharded
    objects join them), object (True for the sharded-object rows)."""

    layer: np.ndarray
    is_mtp: np.ndarray
    kind: np.ndarray
    module: np.ndarray
    modules: list[str]
    param: np.ndarray
    params: list[str]
    object: np.ndarray


def layer_keys(scanned: ScanView) -> LayerKeys:
    """What each layer holds, for comparing layers with each other: one row per tensor of a
    layer (stacked tensors once for each layer of their leading axis) and, for torch_dist,
    one per sharded object of a layer (`..._extra_state/shard_*`: bytes, not tensors, but
    part of the state dict a loader demands). Built once per scan, from its columns."""
    return scanned.derived("layer-keys", lambda: _layer_keys(scanned))


def _layer_keys(scanned: ScanView) -> LayerKeys:
    columns = scan_columns(scanned)
    source, parsed, numbering = columns.tensors, columns.parsed, columns.numbering
    layer = numbering.layer
    own = np.flatnonzero(layer >= 0)
    stacked = np.flatnonzero(parsed.stacked & (layer < 0))
    depth = _capped(_axis_first(source.shape, stacked))
    st_rows, st_layer = _spread(stacked, depth)
    rows = np.concatenate([own, st_rows])
    module, param = parsed.texts["module"], parsed.texts["param"]
    keys = LayerKeys(
        np.concatenate([layer[own], st_layer]),
        numbering.is_mtp[rows],
        numbering.kind[rows],
        module.codes[rows].astype(np.int64),
        list(module.values),
        param.codes[rows].astype(np.int64),
        list(param.values),
        np.zeros(len(rows), dtype=bool),
    )
    objects = _object_keys(scanned)
    return keys if objects is None else _joined(keys, objects)


def _axis_first(shape: Coded[tuple[int, ...]], rows: np.ndarray) -> np.ndarray:
    """The leading axis of each row's shape (0 for a scalar), uncapped."""
    return _int64([s[0] if len(s) else 0 for s in map(shape.__getitem__, rows.tolist())])


def _joined(tensors: LayerKeys, objects: LayerKeys) -> LayerKeys:
    """Tensor rows then object rows; module and param coded anew in first-seen order (what
    pandas' factorize gives a column joined from two with other categories)."""

    def recoded(a: LayerKeys, b: LayerKeys, codes: str, labels: str) -> tuple[np.ndarray, list]:
        texts = [
            *map(getattr(a, labels).__getitem__, getattr(a, codes).tolist()),
            *map(getattr(b, labels).__getitem__, getattr(b, codes).tolist()),
        ]
        joined, values = _codes(texts, len(texts))
        return joined, values

    module, modules = recoded(tensors, objects, "module", "modules")
    param, params = recoded(tensors, objects, "param", "params")
    return LayerKeys(
        np.concatenate([tensors.layer, objects.layer]),
        np.concatenate([tensors.is_mtp, objects.is_mtp]),
        np.concatenate([tensors.kind, objects.kind]),
        module,
        modules,
        param,
        params,
        np.concatenate([tensors.object, objects.object]),
    )


def _object_keys(scanned: ScanView) -> LayerKeys | None:
    """The torch_dist sharded objects that belong to a layer, one row per (layer, key):
    numbered names give their layer; a stacked family's first offset is its layer."""
    info = scanned.torch_dist
    if info is None or not info.byte_keys:
        return None
    entries = [p for key in info.byte_keys if (p := sharded_object_key(key)) is not None]
    if not entries:
        return None
    parsed = parse_names([family for family, _, _ in entries])
    numbering = _Numbering.of(parsed, scanned.spec, base=scan_columns(scanned).numbering.mtp_base)
    layer = numbering.layer.copy()
    stacked = parsed.stacked & (layer < 0)
    layer[stacked] = _int64([offsets[0] for _, offsets, _ in entries])[stacked]
    keep = np.flatnonzero(layer >= 0)
    module, param = parsed.texts["module"], parsed.texts["param"]
    # One row per distinct (layer, is_mtp, kind, module, param), the first kept.
    seen = dict.fromkeys(
        zip(
            layer[keep].tolist(),
            numbering.is_mtp[keep].tolist(),
            numbering.kind[keep].tolist(),
            map(module.values.__getitem__, module.codes[keep].tolist()),
            map(param.values.__getitem__, param.codes[keep].tolist()),
            strict=True,
        )
    )
    n = len(seen)
    layers, is_mtp, kinds, modules, params = zip(*seen, strict=True) if n else ((),) * 5
    module_codes, module_values = _codes(modules, n)
    param_codes, param_values = _codes(params, n)
    return LayerKeys(
        _int64(list(layers)),
        np.asarray(is_mtp, dtype=bool),
        _int64(list(kinds)),
        module_codes,
        module_values,
        param_codes,
        param_values,
        np.ones(n, dtype=bool),
    )
