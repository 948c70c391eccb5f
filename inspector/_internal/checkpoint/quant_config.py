"""How `hf_quant_config.json` is read: its `quantization` section, the modules a checkpoint
stores quantized, and which modules `exclude_modules` leaves out. Facts the quant-config
check, the load check's quantization view and the quant-config repair share. Pure.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from operator import itemgetter, methodcaller
from typing import TYPE_CHECKING, Any

import numpy as np

from inspector._internal.common.dtypes import QUANT_DTYPES
from inspector._internal.formats.patterns import PatternBudget, Patterns, compile_patterns

if TYPE_CHECKING:
    from inspector._internal.checkpoint.scanned import ScannedCheckpoint

__all__ = [
    "MAX_WILDCARDS",
    "Exclusions",
    "exclude_matcher",
    "exclude_patterns",
    "is_wildcard",
    "module_of",
    "quant_section",
    "quantized_modules",
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
    t = scanned.tensors
    names = t["name"].to_numpy(dtype=object)
    wanted = np.fromiter(map(_ENDS_WITH_SCALE, names.tolist()), dtype=bool, count=len(names))
    packed = np.flatnonzero(t["dtype"].isin(QUANT_DTYPES).to_numpy(dtype=bool))
    weights = np.fromiter(map(_ENDS_WITH_WEIGHT, names[packed]), dtype=bool, count=len(packed))
    wanted[packed[weights]] = True
    chosen = names[wanted].tolist()
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
