"""How many parameters a checkpoint stores: one count, one rule (`PARAMETER_RULE`), used
everywhere. It counts values (a packed 4-bit weight counts the values it holds), without
scales and persistent buffers, because that is what the model built from config.json counts
(`num_parameters()`, `total_parameters`). Column-wise. Which weights are packed:
docs/architecture.md, "checkpoint/".
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from itertools import repeat
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from inspector._internal.checkpoint.naming_rules import BUFFER_PARAMS, QUANT_SIBLING_PARAMS
from inspector._internal.checkpoint.quant_targets import group_targets, too_many_targets
from inspector._internal.checkpoint.scanned import LayoutName, ScannedCheckpoint
from inspector._internal.checkpoint.tables import (
    name_leaves,
    rows_named,
    scan_columns,
    tensor_columns,
)
from inspector._internal.checkpoint.tensor_shards import shard_names_distinct
from inspector._internal.common.columns import Coded
from inspector._internal.common.dtypes import DTYPE_BITS
from inspector._internal.formats.patterns import PatternBudget

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "PARAMETER_RULE",
    "Uncounted",
    "count_parameters",
    "parameters_of",
    "parse_count",
    "scan_parameters",
    "scan_uncounted",
    "uncounted_elements",
]

PARAMETER_RULE = "values; packed 4-bit weights unpacked; quantization scales and buffers left out"

# Integer dtypes 4-bit values are packed into.
_PACKED_INTO = frozenset({"U8", "I8", "U16", "I16", "U32", "I32", "U64", "I64"})
# Quantization scales and persistent buffers: stored, not parameters.
_NOT_PARAMETERS = QUANT_SIBLING_PARAMS | BUFFER_PARAMS
# A module storing one of these holds FP4 (NVFP4) values in its integer weight.
_FP4_EVIDENCE = frozenset({"weight_scale_2", "weight_global_scale"})
_BLOCKS, _SCALES, _SCALE_INV = "_blocks", "_scales", "_scale_inv"
# A hostile shape may multiply past what int64 holds; no real tensor comes near this.
_NUMEL_CAP = 2**62


def count_parameters(
    tensors: pd.DataFrame,
    *,
    config: Mapping[str, Any] | None = None,
) -> int:
    """The parameters (values, see the module docstring) of a tensors table: each name once;
    columns `name`, `dtype`, `numel`. `config` is config.json: a compressed-tensors
    `quantization_config` says how many bits a `weight_packed` value has (without one, a
    `weight_packed` is counted as stored)."""
    if not len(tensors):
        return 0
    return _count(*_each_name_once(tensors), config)


def _count(tensors: pd.DataFrame, names: list[str], config: Mapping[str, Any] | None) -> int:
    """`count_parameters` of a table whose names are distinct (`names` its name column)."""
    if not len(tensors):
        return 0
    numel = tensors["numel"].to_numpy(dtype=np.int64)
    # A categorical column (the tensors table's) gives its codes for free.
    as_category = tensors["dtype"].astype("category")
    codes = as_category.cat.codes.to_numpy()
    kinds = [str(d) for d in as_category.cat.categories]
    return int(_values(names, codes, kinds, numel, _packed_bits(config)).sum())


def _each_name_once(
    tensors: pd.DataFrame, names: Sequence[str] | None = None
) -> tuple[pd.DataFrame, list[str]]:
    """(`tensors` with each name's first row only, its names). Duplicates are looked for
    with a set of the names, not pandas' `duplicated`: that factorizes the Arrow string
    column, a fifth of a second at 300,000 names, for a table that almost never has any.
    `names`, when given, is the `name` column as Python strings already (`Tables.names`)."""
    if names is None or len(names) != len(tensors):
        names = tensors["name"].astype(str).tolist()
    # The scan's own list is only read, never changed: a copy would be kept with the scan
    # (8 bytes a tensor, at `check`'s peak).
    names = names if isinstance(names, list) else list(names)
    if len(set(names)) < len(names):
        tensors = tensors.drop_duplicates("name")
        names = tensors["name"].astype(str).tolist()
    return tensors, names


def _tied_once(scanned: ScannedCheckpoint) -> pd.DataFrame:
    """The tensors table with tied names counted once: in a `.bin` file tied weights
    (`lm_head.weight` and the embedding) are one storage under two names, the same bytes
    (file, begin, end); transformers' `num_parameters()` counts them once."""
    t = scanned.tensors
    if scanned.layout != LayoutName.PYTORCH_BIN or not len(t):
        return t
    spans = t[t["end"] > t["begin"]]
    tied = spans.duplicated(["file", "begin", "end", "dtype"])
    return t.drop(index=spans.index[tied.to_numpy()]) if tied.any() else t


def scan_parameters(scanned: ScannedCheckpoint) -> int:
    """`count_parameters` of every tensor of a scan, counted once per scan (the scan summary,
    the index check and the load check all show it)."""
    return scanned.derived("parameters", lambda: _scan_count(scanned))


def _scan_count(scanned: ScannedCheckpoint) -> int:
    """From the tensors table when it is built or needed (`.bin` ties), else from the columns
    it is built from (a scan's summary builds no frame)."""
    if "tables" in vars(scanned) or scanned.layout == LayoutName.PYTORCH_BIN:
        return _count(*_named_once(scanned, _tied_once(scanned)), scanned.config)
    columns = tensor_columns(scanned)
    names, codes, numel = columns.names, columns.dtype_codes, columns.numel
    if not names:
        return 0
    rows = _first_rows(scanned)
    leaves = name_leaves(scanned)
    if rows is not None:
        names = [names[r] for r in rows.tolist()]
        codes, numel, leaves = codes[rows], numel[rows], leaves.take(rows)
    bits = _packed_bits(scanned.config)
    return int(_values(names, codes, columns.dtypes, numel, bits, leaves).sum())


def _first_rows(scanned: ScannedCheckpoint) -> np.ndarray | None:
    """The rows of the tensors table `drop_duplicates("name")` keeps (each name's first),
    None when every name is distinct (nearly always); kept with the scan."""

    def build() -> np.ndarray | None:
        # The tensors are the shards' own entries: the index rule's look-up of every shard
        # name may have told already (a set of a million names costs a tenth of a second).
        if scanned.logical is None and shard_names_distinct(scanned):
            return None
        names = tensor_columns(scanned).names
        if len(set(names)) == len(names):
            return None
        first = dict(zip(reversed(names), range(len(names) - 1, -1, -1), strict=True))
        return np.sort(np.fromiter(first.values(), dtype=np.int64, count=len(first)))

    return scanned.derived("tensors-first-rows", build)


def scan_uncounted(scanned: ScannedCheckpoint) -> Uncounted:
    """`uncounted_elements` of every tensor of a scan, with `scan_parameters` as its values.
    From the columns the tensors table is built from (its params, numel), each name once."""
    columns = scan_columns(scanned)
    param = columns.parsed.texts["param"]
    numel = columns.tensors.numel
    rows = _first_rows(scanned)
    codes = param.codes if rows is None else param.codes[rows]
    numel = numel if rows is None else numel[rows]

    def total(wanted: frozenset[str]) -> int:
        mask = np.array([v in wanted for v in param.values], dtype=bool)
        return int(numel[mask[codes]].sum()) if len(param.values) else 0

    return Uncounted(total(QUANT_SIBLING_PARAMS), total(BUFFER_PARAMS), scan_parameters(scanned))


def _named_once(scanned: ScannedCheckpoint, table: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """`_each_name_once` of `table`, kept with the scan when `table` is its tensors table (the
    parameter count and the index check's uncounted elements both need it)."""
    if table is not scanned.tensors:
        return _each_name_once(table)
    names = scanned.tables.names
    return scanned.derived("tensors-each-name-once", lambda: _each_name_once(table, names))


def parameters_of(
    names: Sequence[str],
    dtypes: Sequence[str],
    shapes: Sequence[Sequence[int]],
    *,
    config: Mapping[str, Any] | None = None,
) -> int:
    """`count_parameters` of tensors given as names, dtypes and shapes (a plan's output)."""
    numel = [min(math.prod(s), _NUMEL_CAP) for s in shapes]
    import pandas as pd

    frame = pd.DataFrame({"name": list(names), "dtype": list(dtypes), "numel": numel})
    return count_parameters(frame, config=config)


def _values(
    names: list[str],
    dtype_codes: np.ndarray,
    dtype_kinds: Sequence[str],
    numel: np.ndarray,
    bits: Callable[[str], int] | None,
    leaves: Coded[str] | None = None,
) -> np.ndarray:
    """Values per tensor: 0 for scales and buffers, numel x values per element for packed
    4-bit weights, numel otherwise. Names are split once; every other test runs on the few
    distinct params and dtypes (factorized), and the module of a name is taken only for
    the rows packing depends on, so 300,000 tensors cost a few tenths of a second."""
    # Coded straight from C-level maps: no list of 300,000 param strings is kept. `leaves`,
    # when given, is that coding already (`name_leaves`).
    if leaves is None:
        last = map(operator.itemgetter(2), map(str.rpartition, names, repeat(".")))
        leaves = Coded.encode(last, len(names))
    codes, kinds = leaves.codes, leaves.values

    def per_kind(test: Callable[[str], bool]) -> np.ndarray:
        return np.array([test(k) for k in kinds], dtype=bool)[codes]

    # `*_scale_inv`: block-FP8 scales, also fused per expert (`gate_up_proj_scale_inv`).
    not_counted = per_kind(lambda k: k in _NOT_PARAMETERS or k.endswith(_SCALE_INV))
    blocks = per_kind(lambda k: k.endswith(_BLOCKS))
    scales = per_kind(lambda k: k.endswith(_SCALES))
    weight = per_kind(lambda k: k == "weight")
    packed_weight = per_kind(lambda k: k == "weight_packed")
    evidence = per_kind(lambda k: k in _FP4_EVIDENCE)
    integer = np.array([d in _PACKED_INTO for d in dtype_kinds], dtype=bool)[dtype_codes]
    element_bits = np.array([DTYPE_BITS.get(d, 8) for d in dtype_kinds], dtype=np.int64)[
        dtype_codes
    ]

    def modules(rows: np.ndarray) -> list[str]:
        # C-level maps, as for `last`: a packed checkpoint asks for half its names here.
        picked = map(names.__getitem__, rows.tolist())
        return list(map(operator.itemgetter(0), map(str.rpartition, picked, repeat("."))))

    if scales.any() and blocks.any():
        # MXFP4: `<proj>_scales` next to `<proj>_blocks` in the same module.
        rows = np.flatnonzero(blocks)
        stems = {
            (m, kinds[codes[r]][: -len(_BLOCKS)])
            for m, r in zip(modules(rows), rows.tolist(), strict=True)
        }
        rows = np.flatnonzero(scales)
        for m, row in zip(modules(rows), rows.tolist(), strict=True):
            if (m, kinds[codes[row]][: -len(_SCALES)]) in stems:
                not_counted[row] = True
    candidates = np.flatnonzero(integer & (weight | packed_weight))
    in_fp4 = np.zeros(len(names), dtype=bool)
    if len(candidates) and evidence.any():
        fp4_modules = set(modules(np.flatnonzero(evidence)))
        in_fp4[candidates] = np.fromiter(
            map(fp4_modules.__contains__, modules(candidates)), dtype=bool, count=len(candidates)
        )
    values_per = np.ones(len(names), dtype=np.int64)
    values_per[in_fp4] = element_bits[in_fp4] // 4
    if bits is not None:
        packed = np.flatnonzero(integer & packed_weight & ~in_fp4)
        per_value = np.array([bits(m) for m in modules(packed)], dtype=np.int64)
        values_per[packed] = np.maximum(element_bits[packed] // np.maximum(per_value, 1), 1)
    mx = integer & blocks
    values_per[mx] = element_bits[mx] // 4
    out = numel * values_per
    out[not_counted] = 0
    return out


def _packed_bits(config: Mapping[str, Any] | None) -> Callable[[str], int] | None:
    """compressed-tensors' bits per packed weight value of a module: the `num_bits` of the
    first config group that targets it (a mixed-precision checkpoint packs 8-bit and 4-bit
    groups side by side), else the config's one `num_bits` (4 when it names none or several);
    None without a compressed-tensors config. A config with more groups and entries than the
    check matches (check-budget-exceeded) gives every module 4."""
    qc = config.get("quantization_config") if isinstance(config, Mapping) else None
    if not isinstance(qc, Mapping) or qc.get("quant_method") != "compressed-tensors":
        return None
    if too_many_targets(qc):
        return lambda _module: 4
    groups = []
    # One matching budget for every group: a module costs one match per group at most.
    for _, matcher, group in group_targets(qc, budget=PatternBudget()):
        weights = group.get("weights")
        bits = weights.get("num_bits") if isinstance(weights, Mapping) else None
        if isinstance(bits, int) and not isinstance(bits, bool) and 0 < bits <= 64:
            groups.append((matcher, bits))
    found = {b for _, b in groups}
    default = found.pop() if len(found) == 1 else 4

    def bits_of(module: str) -> int:
        # A module a refused pattern decides (quant-pattern-refused) counts with the default.
        return next((b for m, b in groups if m(module, True) is True), default)

    return bits_of


@dataclass(frozen=True, slots=True)
class Uncounted:
    """Stored elements some writers leave out of `total_parameters`: quantization scales
    (`weight_scale`, `input_scale`... Model-Optimizer registers them as buffers) and the
    persistent buffers known by name (`e_score_correction_bias`...).

    How each writer counts (`WAYS`): this project writes the values
    (`inspector._internal.checkpoint.parameters`: packed 4-bit weights unpacked, scales and buffers
    left out); transformers writes `num_parameters()`, buffers left out; Model-Optimizer's export
    counts its compressed weights per stored element (packed NVFP4: per byte) and leaves out scales
    and buffers; remote-code models may keep a router bias as a parameter; older writers
    count every stored element. `values` is the project's count of the same tensors (None:
    not known, counted as "buffers")."""

    scales: int = 0
    buffers: int = 0
    values: int | None = None

    # way -> what it leaves out, the project's own count first
    WAYS: ClassVar[dict[str, str]] = {
        "values": f"the values counted ({PARAMETER_RULE})",
        "buffers": "buffers left out (transformers' num_parameters())",
        "scales+buffers": "quantization scales and buffers left out (Model-Optimizer)",
        "scales": "quantization scales left out",
        "none": "every stored element",
    }

    def count(self, stored: int, way: str) -> int:
        """`stored` elements counted the `way` one writer counts them."""
        if way == "values":
            return self.values if self.values is not None else stored - self.buffers
        scales = self.scales if "scales" in way else 0
        buffers = self.buffers if "buffers" in way else 0
        return stored - scales - buffers

    def counts(self, stored: int) -> dict[int, str]:
        """Each distinct count of `stored` elements -> the first way that gives it."""
        out: dict[int, str] = {}
        for way in self.WAYS:
            out.setdefault(self.count(stored, way), way)
        return out


def uncounted_elements(
    tensors: pd.DataFrame,
    names: Collection[str] | None = None,
    *,
    config: Mapping[str, object] | None = None,
    values: int | None = None,
) -> Uncounted:
    """`Uncounted` of a tensors table (each name once), optionally of `names` only;
    `config` (config.json) as `inspector._internal.checkpoint.parameters.count_parameters` takes it,
    `values` the count when the caller has it already."""
    if names is not None:
        tensors = tensors[rows_named(tensors, names)]
    tensors, listed = _each_name_once(tensors)
    return _uncounted(tensors, _count(tensors, listed, config) if values is None else values)


def _uncounted(tensors: pd.DataFrame, values: int) -> Uncounted:
    """`Uncounted` of a table whose names are distinct."""
    param = tensors["param"]
    numel = tensors["numel"].to_numpy(dtype=np.int64)
    scales = param.isin(QUANT_SIBLING_PARAMS).to_numpy(dtype=bool)
    buffers = param.isin(BUFFER_PARAMS).to_numpy(dtype=bool)
    return Uncounted(int(numel[scales].sum()), int(numel[buffers].sum()), values)


def parse_count(value: object) -> int | None:
    """A non-negative integer from JSON (some producers write numbers as strings)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value >= 0 else None
    if isinstance(value, float) and value.is_integer() and value >= 0:
        return int(value)
    # ASCII digits only, at most 20 of them: str.isdigit() accepts "²", which int() refuses,
    # and int() refuses strings over 4300 digits.
    if isinstance(value, str) and re.fullmatch(r"[0-9]{1,20}", value.strip()):
        return int(value.strip())
    return None
