"""How `hf_quant_config.json` is read: its `quantization` section, the modules a checkpoint
stores quantized, and which modules `exclude_modules` leaves out. Facts the quant-config
check, the load check's quantization view and the quant-config repair share. Pure.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable, Mapping
from operator import itemgetter, methodcaller
from typing import TYPE_CHECKING, Any

import numpy as np

from inspector._internal.common.dtypes import QUANT_DTYPES

if TYPE_CHECKING:
    from inspector._internal.checkpoint.scanned import ScannedCheckpoint

__all__ = [
    "MAX_WILDCARDS",
    "exclude_matcher",
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


def exclude_matcher(section: Mapping[str, Any]) -> Callable[[str], bool] | None:
    """Whether `exclude_modules` excludes a module (matched as the module and as
    `<module>.weight`); None when it holds more than `MAX_WILDCARDS` wildcard patterns.

    Exact names are one set look-up; the wildcard patterns are one compiled regex (fnmatch's
    translation, which never backtracks without bound): each module costs one match, never
    one per pattern, and no pattern is compiled twice."""
    patterns = [p for p in section.get("exclude_modules") or [] if isinstance(p, str)]
    exact = {p for p in patterns if not _WILDCARD.search(p)}
    wild = sorted({p for p in patterns if _WILDCARD.search(p)})
    if len(wild) > MAX_WILDCARDS:
        return None
    regex = re.compile("|".join(map(fnmatch.translate, wild))) if wild else None

    def excluded(module: str) -> bool:
        weight = f"{module}.weight"
        if module in exact or weight in exact:
            return True
        return regex is not None and bool(regex.match(module) or regex.match(weight))

    return excluded


_WILDCARD = re.compile(r"[*?\[]")


def is_wildcard(pattern: str) -> bool:
    """True when an `exclude_modules` entry is a pattern (`*`, `?`, `[`), not an exact name."""
    return _WILDCARD.search(pattern) is not None
