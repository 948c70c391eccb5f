"""`hf_quant_config.json` against the tensors: quantized modules it forgets, entries it keeps
for modules that are gone. Pure."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Mapping
from itertools import compress
from operator import methodcaller
from typing import Any

from inspector._internal.checkpoint.naming_rules import expert_template
from inspector._internal.checkpoint.quant_config import (
    MAX_WILDCARDS,
    exclude_matcher,
    exclude_patterns,
    is_wildcard,
    module_of,
    quant_section,
    quantized_modules,
)
from inspector._internal.checkpoint.scanned import ScannedCheckpoint
from inspector._internal.checkpoint.tables import tensor_columns
from inspector._internal.checks.compressed_tensors import pattern_findings
from inspector._internal.common.display import legible
from inspector._internal.common.filenames import QUANT_CONFIG_NAME
from inspector._internal.common.text import fold_ranges
from inspector._internal.findings.codes import Code, code_set
from inspector._internal.findings.finding import Finding, fold_findings, make_finding

__all__ = ["CODES", "check_quant_config"]

CODES = code_set(
    Code.QUANT_CONFIG_MISSING_LAYER,
    Code.QUANT_CONFIG_STALE_LAYER,
    Code.CHECK_BUDGET_EXCEEDED,
    Code.QUANT_PATTERN_REFUSED,
)

# Up to this many unlisted-yet-unquantized entries are probed by prefix (each prefix costs
# every name one more comparison); past it, every module is listed once.
_PROBE_LIMIT = 32


def check_quant_config(scanned: ScannedCheckpoint) -> list[Finding]:
    """quant-config-missing-layer (under MIXED_PRECISION) and quant-config-stale-layer."""
    section = quant_section(scanned.quant_config)
    layers = section.get("quantized_layers")
    if section.get("quant_algo") != "MIXED_PRECISION" or not isinstance(layers, Mapping):
        return []
    quantized = quantized_modules(scanned)
    excluded = exclude_matcher(exclude_patterns(section))
    stale = _stale(layers, quantized, tensor_columns(scanned).names)
    found = _fold("quant-config-stale-layer", stale, {}, len(layers))
    if excluded is None:
        return [_too_many_patterns(section), *found]
    unlisted = [m for m in quantized if m not in layers]
    verdicts = list(map(excluded, unlisted))
    missing = [m for m, v in zip(unlisted, verdicts, strict=True) if v is False]
    undecided = [m for m, v in zip(unlisted, verdicts, strict=True) if v is None]
    found += pattern_findings(f"{QUANT_CONFIG_NAME} exclude_modules", [excluded.globs], undecided)
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
        known = set(map(module_of, names))
    else:
        under = methodcaller("startswith", tuple(f"{m}." for m in unsure))
        known = set(map(module_of, compress(names, map(under, names))))
    return [m for m in unsure if m not in known]


def _too_many_patterns(section: Mapping[str, Any]) -> Finding:
    patterns = section.get("exclude_modules") or []
    wild = sum(1 for p in patterns if isinstance(p, str) and is_wildcard(p))
    msg = (
        f"{QUANT_CONFIG_NAME}: exclude_modules holds {wild:,} wildcard patterns, more than the "
        f"{MAX_WILDCARDS:,} the check matches against every module, so modules missing from "
        "quantized_layers were NOT checked; no real export lists that many: the file was "
        "crafted or is corrupt"
    )
    return make_finding(Code.CHECK_BUDGET_EXCEEDED, msg, file=QUANT_CONFIG_NAME)


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
            f"{QUANT_CONFIG_NAME}: {legible(m)} {what}{todo}",
            file=QUANT_CONFIG_NAME,
            tensor=tensor_of.get(m),
        )
        for m in singles
    ]
    for key, ids in groups.items():
        out.append(
            make_finding(
                code,
                f"{QUANT_CONFIG_NAME}: {legible(key)} for experts {fold_ranges(ids)} "
                f"({len(ids)} modules) {what} ({listed} entries listed){todo}",
                file=QUANT_CONFIG_NAME,
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
