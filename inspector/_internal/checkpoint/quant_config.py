"""How `hf_quant_config.json` is read: its `quantization` section, the modules a checkpoint
stores quantized, and which modules `exclude_modules` leaves out. Facts the quant-config
check, the load check's quantization view and the quant-config repair share; and how a
quantization scheme tiles the dimensions tensor parallelism splits (`split_block`, what
`ckpt-inspect fit` checks). Pure.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from itertools import islice
from operator import itemgetter, methodcaller
from typing import TYPE_CHECKING, Any

import numpy as np

from inspector._internal.checkpoint.tables import tensor_columns
from inspector._internal.common.dtypes import QUANT_DTYPES
from inspector._internal.formats.patterns import PatternBudget, Patterns, compile_patterns

if TYPE_CHECKING:
    from inspector._internal.checkpoint.scanned import ScannedCheckpoint

__all__ = [
    "MAX_WILDCARDS",
    "Exclusions",
    "SplitBlock",
    "exclude_matcher",
    "exclude_patterns",
    "is_wildcard",
    "module_of",
    "quant_section",
    "quantized_modules",
    "split_block",
    "split_block_problem",
]

_SCALE_PARAMS = frozenset({"weight_scale", "weight_scale_inv"})
# A name whose last component is a scale param ends with one of these (and vice versa).
_ENDS_WITH_SCALE = methodcaller("endswith", tuple(f".{p}" for p in sorted(_SCALE_PARAMS)))
_ENDS_WITH_WEIGHT = methodcaller("endswith", ".weight")
_RPARTITION = methodcaller("rpartition", ".")
_MODULE = itemgetter(0)


def module_of(name: str) -> str:
    """A tensor's module: its name up to the last dot ("" for a name without one)."""
    return _MODULE(_RPARTITION(name))


def quant_section(quant_config: Mapping[str, Any] | None) -> Mapping[str, Any]:
    """The `quantization` object (older files keep its keys at the top level)."""
    if not isinstance(quant_config, Mapping):
        return {}
    section = quant_config.get("quantization")
    return section if isinstance(section, Mapping) else quant_config


def quantized_modules(scanned: ScannedCheckpoint) -> dict[str, str]:
    """Module name -> its first tensor, for modules stored quantized: a tensor named
    `<module>.weight_scale[_inv]`, or `<module>.weight` in a packed or 8-bit float dtype.

    Column-wise (C-level `map` over names, numpy masks): no Python loop over 300,000 names."""
    columns = tensor_columns(scanned)
    names = columns.names
    wanted = np.fromiter(map(_ENDS_WITH_SCALE, names), dtype=bool, count=len(names))
    quant = np.array([d in QUANT_DTYPES for d in columns.dtypes], dtype=bool)
    packed = np.flatnonzero(quant[columns.dtype_codes]) if len(quant) else np.zeros(0, np.intp)
    picked = map(names.__getitem__, packed.tolist())
    weights = np.fromiter(map(_ENDS_WITH_WEIGHT, picked), dtype=bool, count=len(packed))
    wanted[packed[weights]] = True
    chosen = list(map(names.__getitem__, np.flatnonzero(wanted).tolist()))
    modules_of = list(map(_MODULE, map(_RPARTITION, chosen)))
    # First tensor of each module, modules in order of first appearance (as a setdefault loop
    # would give): the reversed update leaves each module's first tensor as its value.
    modules: dict[str, str] = dict.fromkeys(modules_of, "")
    modules.update(zip(reversed(modules_of), reversed(chosen), strict=True))
    modules.pop("", None)  # a name such as ".weight_scale" belongs to no module
    return modules


# Wildcard `exclude_modules` patterns matched against every quantized module; real exports
# list a few dozen (the rest are exact names, looked up in a set).
MAX_WILDCARDS = 1_024


def exclude_patterns(section: Mapping[str, Any]) -> list[str]:
    """The `exclude_modules` entries (fnmatch globs or exact module names)."""
    patterns = section.get("exclude_modules")
    return [p for p in patterns if isinstance(p, str)] if isinstance(patterns, list) else []


class Exclusions:
    """Whether `exclude_modules` excludes a module: `excluded(module)` is True when the module
    or `<module>.weight` matches an entry (`fnmatch.fnmatchcase`, as the exporters and
    serving engines match them), False when neither does, None when a refused glob could
    decide (`globs.reasons()` says why).

    Exact names are one set look-up; the wildcard patterns are one program without
    backtracking (`inspector._internal.formats.patterns`): each module costs one match,
    never one per pattern."""

    def __init__(self, patterns: list[str], *, budget: PatternBudget | None = None) -> None:
        self.exact = {p for p in patterns if not _WILDCARD.search(p)}
        wild = sorted({p for p in patterns if _WILDCARD.search(p)})
        self.globs: Patterns = compile_patterns(wild, syntax="glob", budget=budget)

    def __call__(self, module: str) -> bool | None:
        weight = f"{module}.weight"
        if module in self.exact or weight in self.exact:
            return True
        found = self.globs.match(module)
        if found is not False:
            return found or self.globs.match(weight) or None
        return self.globs.match(weight)


def exclude_matcher(
    patterns: list[str], *, budget: PatternBudget | None = None
) -> Exclusions | None:
    """The `Exclusions` of `exclude_modules` entries; None when they hold more than
    `MAX_WILDCARDS` wildcard patterns."""
    if sum(1 for p in patterns if _WILDCARD.search(p)) > MAX_WILDCARDS:
        return None
    return Exclusions(patterns, budget=budget)


_WILDCARD = re.compile(r"[*?\[]")


def is_wildcard(pattern: str) -> bool:
    """True when an `exclude_modules` entry is a pattern (`*`, `?`, `[`), not an exact name."""
    return _WILDCARD.search(pattern) is not None


# -- quantization blocks against tensor parallelism --------------------------------------------


@dataclass(frozen=True, slots=True)
class SplitBlock:
    """How a quantization scheme tiles the dimensions tensor parallelism splits: a rank's
    share of a column-parallel output must be a multiple of `block_n` (0: no rule), of a
    row-parallel input a multiple of `block_k`. `padded`: the engines cut in whole blocks
    and pad the last rank instead of refusing (MXFP4). `rule` names the engine check."""

    scheme: str
    block_n: int
    block_k: int
    rule: str
    padded: bool = False


# MXFP4 (OCP microscaling) holds 32 values per scale; NVFP4 16.
MXFP4_BLOCK, NVFP4_GROUP = 32, 16
_MAX_BLOCK = 1 << 16
# Config groups looked at in a compressed-tensors config (real ones have a few).
_MAX_GROUPS = 1_024
_FP8_RULE = "validate_fp8_block_shape, Fp8MoEMethod.create_weights"
_NVFP4_RULE = "ModelOptNvFp4LinearMethod.create_weights"
_GROUP_RULE = "verify_marlin_supports_shape"


def split_block(
    config: Mapping[str, Any] | None, quant_config: Mapping[str, Any] | None = None
) -> SplitBlock | None:
    """The block rule of the checkpoint's quantization (config.json's `quantization_config`,
    else `hf_quant_config.json`), or None when it sets none (unquantized, per-tensor or
    per-channel scales). Values are checked: a block size that is not a positive int within
    a real range is ignored."""
    qc = config.get("quantization_config") if isinstance(config, Mapping) else None
    qc = qc if isinstance(qc, Mapping) else {}
    method = qc.get("quant_method")
    if method == "fp8":
        block = _pair(qc.get("weight_block_size"))
        return None if block is None else SplitBlock(f"FP8 block {list(block)}", *block, _FP8_RULE)
    if method == "mxfp4":
        return SplitBlock("MXFP4", MXFP4_BLOCK, MXFP4_BLOCK, "the MXFP4 loaders", padded=True)
    if method in ("gptq", "awq", "gptq_marlin", "awq_marlin"):
        group = _size(qc.get("group_size"))
        return (
            None if group is None else SplitBlock(f"{method} group {group}", 0, group, _GROUP_RULE)
        )
    if method == "compressed-tensors":
        return _compressed_tensors(qc)
    section = qc if method in ("modelopt", "modelopt_fp4") else quant_section(quant_config)
    if _nvfp4(section):
        return SplitBlock("NVFP4", 0, NVFP4_GROUP, _NVFP4_RULE)
    return None


def _nvfp4(section: Mapping[str, Any]) -> bool:
    """Model-Optimizer NVFP4: the whole checkpoint, or a mixed-precision one whose
    `quantized_layers` (the first `_MAX_GROUPS` looked at) hold NVFP4 modules."""
    algo = section.get("quant_algo")
    if isinstance(algo, str) and "NVFP4" in algo.upper():
        return True
    layers = section.get("quantized_layers")
    if algo != "MIXED_PRECISION" or not isinstance(layers, Mapping):
        return False
    return any(
        isinstance(entry, Mapping)
        and isinstance(entry.get("quant_algo"), str)
        and "NVFP4" in entry["quant_algo"].upper()
        for entry in islice(layers.values(), _MAX_GROUPS)
    )


def split_block_problem(config: Mapping[str, Any] | None) -> str | None:
    """What is wrong with a block or group size config.json's `quantization_config` gives
    but `split_block` cannot use (the block rules are then not checked), or None."""
    qc = config.get("quantization_config") if isinstance(config, Mapping) else None
    if not isinstance(qc, Mapping):
        return None
    method = qc.get("quant_method")
    if method == "fp8" and "weight_block_size" in qc and split_block(config) is None:
        return "weight_block_size is not two sizes from 1 to 65,536"
    group = qc.get("group_size")
    grouped = method in ("gptq", "awq", "gptq_marlin", "awq_marlin")
    if grouped and group != -1 and _size(group) is None:
        return "group_size is not -1 nor a size from 1 to 65,536"
    return None


def _compressed_tensors(qc: Mapping[str, Any]) -> SplitBlock | None:
    """The first config group whose weights are quantized in groups or blocks."""
    groups = qc.get("config_groups")
    if not isinstance(groups, Mapping):
        return None
    for group in islice(groups.values(), _MAX_GROUPS):
        weights = group.get("weights") if isinstance(group, Mapping) else None
        if not isinstance(weights, Mapping):
            continue
        strategy = weights.get("strategy")
        if strategy == "block":
            block = _pair(weights.get("block_structure"))
            if block is not None:
                return SplitBlock(f"compressed-tensors block {list(block)}", *block, _FP8_RULE)
        elif strategy in ("group", "tensor_group"):
            size = _size(weights.get("group_size"))
            if size is not None:
                name = f"compressed-tensors group {size}"
                return SplitBlock(name, 0, size, _GROUP_RULE)
    return None


def _size(value: object) -> int | None:
    return value if type(value) is int and 0 < value <= _MAX_BLOCK else None


def _pair(value: object) -> tuple[int, int] | None:
    if isinstance(value, list) and len(value) == 2:
        n, k = _size(value[0]), _size(value[1])
        if n is not None and k is not None:
            return n, k
    return None
