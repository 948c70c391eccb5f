"""`hf_quant_config.json` against the tensors: quantized modules it forgets, entries it keeps
for modules that are gone. Pure."""

from __future__ import annotations

import fnmatch
import re
from collections import defaultdict
from collections.abc import Callable, Collection, Mapping
from itertools import compress
from operator import itemgetter, methodcaller
from typing import Any

import numpy as np

from inspector.codes import Code, code_set
from inspector.display import legible
from inspector.dtypes import QUANT_DTYPES
from inspector.filenames import QUANT_CONFIG_NAME
from inspector.findings import Finding, fold_findings, fold_ranges, make_finding
from inspector.model import ScannedCheckpoint
from inspector.naming_rules import expert_template

__all__ = [
    "CODES",
    "MAX_WILDCARDS",
    "check_quant_config",
    "exclude_matcher",
    "quant_section",
    "quantized_modules",
]

CODES = code_set(
    Code.QUANT_CONFIG_MISSING_LAYER, Code.QUANT_CONFIG_STALE_LAYER, Code.CHECK_BUDGET_EXCEEDED
)

QUANT_FILE = QUANT_CONFIG_NAME
_SCALE_PARAMS = frozenset({"weight_scale", "weight_scale_inv"})
# A name whose last component is a scale param ends with one of these (and vice versa).
_ENDS_WITH_SCALE = methodcaller("endswith", tuple(f".{p}" for p in sorted(_SCALE_PARAMS)))
_ENDS_WITH_WEIGHT = methodcaller("endswith", ".weight")
_RPARTITION = methodcaller("rpartition", ".")
_MODULE = itemgetter(0)
# Up to this many unlisted-yet-unquantized entries are probed by prefix (each prefix costs
# every name one more comparison); past it, every module is listed once.
_PROBE_LIMIT = 32


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


def check_quant_config(scanned: ScannedCheckpoint) -> list[Finding]:
    """quant-config-missing-layer (under MIXED_PRECISION) and quant-config-stale-layer."""
    section = quant_section(scanned.quant_config)
    layers = section.get("quantized_layers")
    if section.get("quant_algo") != "MIXED_PRECISION" or not isinstance(layers, Mapping):
        return []
    quantized = quantized_modules(scanned)
    excluded = exclude_matcher(section)
    stale = _stale(layers, quantized, scanned.tensors["name"].tolist())
    found = _fold("quant-config-stale-layer", stale, {}, len(layers))
    if excluded is None:
        return [_too_many_patterns(section), *found]
    missing = [m for m in quantized if m not in layers and not excluded(m)]
    return _fold("quant-config-missing-layer", missing, quantized, len(layers)) + found


def _stale(layers: Mapping[str, Any], quantized: Collection[str], names: list[str]) -> list[str]:
    """Listed modules no tensor belongs to (a tensor's module is its name up to the last dot).

    A quantized module exists, which settles the usual entry. The others are looked up among
    the names under them (one C-level `startswith` pass), or, when there are many, among
    every tensor's module."""
    unsure = [m for m in layers if m not in quantized]
    if not unsure:
        return []
    if len(unsure) > _PROBE_LIMIT or "" in unsure:
        known = set(map(_MODULE, map(_RPARTITION, names)))
    else:
        under = methodcaller("startswith", tuple(f"{m}." for m in unsure))
        known = set(map(_MODULE, map(_RPARTITION, compress(names, map(under, names)))))
    return [m for m in unsure if m not in known]


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


def _too_many_patterns(section: Mapping[str, Any]) -> Finding:
    patterns = section.get("exclude_modules") or []
    wild = sum(1 for p in patterns if isinstance(p, str) and _WILDCARD.search(p))
    msg = (
        f"{QUANT_FILE}: exclude_modules holds {wild:,} wildcard patterns, more than the "
        f"{MAX_WILDCARDS:,} the check matches against every module, so modules missing from "
        "quantized_layers were NOT checked; no real export lists that many: the file was "
        "crafted or is corrupt"
    )
    return make_finding(Code.CHECK_BUDGET_EXCEEDED, msg, file=QUANT_FILE)


def _fold(code: str, modules: list[str], tensor_of: dict[str, str], listed: int) -> list[Finding]:
    """One finding per layer-and-projection group: 'experts 64-511 of model.layers.3...'."""
    groups: dict[str, list[int]] = defaultdict(list)
    singles: list[str] = []
    for module in modules:
        key, expert = expert_template(module)
        if expert is not None:
            groups[key].append(expert)
        else:
            singles.append(module)
    what = (
        "is stored quantized but has no quantized_layers entry and matches no "
        "exclude_modules pattern"
        if code == "quant-config-missing-layer"
        else "is listed in quantized_layers but no tensor of it exists"
    )
    todo = (
        "; add the entries (`ckpt-inspect repair --only quant-config`)"
        if code == "quant-config-missing-layer"
        else "; remove the entry or restore the module"
    )
    out = [
        make_finding(
            code,
            f"{QUANT_FILE}: {legible(m)} {what}{todo}",
            file=QUANT_FILE,
            tensor=tensor_of.get(m),
        )
        for m in singles
    ]
    for key, ids in groups.items():
        out.append(
            make_finding(
                code,
                f"{QUANT_FILE}: {legible(key)} for experts {fold_ranges(ids)} ({len(ids)} modules) "
                f"{what} ({listed} entries listed){todo}",
                file=QUANT_FILE,
                tensor=tensor_of.get(key.replace("{E}", str(ids[0]))),
                expert=ids[0] if len(ids) == 1 else None,
            )
        )
    what_more = (
        "modules missing from quantized_layers"
        if code == "quant-config-missing-layer"
        else "stale quantized_layers entries"
    )
    return fold_findings(out, what_more)
