"""`hf_quant_config.json` against the tensors: quantized modules it forgets, entries it keeps
for modules that are gone. Pure."""

from __future__ import annotations

import fnmatch
import re
from collections import defaultdict
from typing import Any

from inspector.findings import Finding, examples, fold_ranges, make_finding
from inspector.model import ScannedCheckpoint

__all__ = ["check_quant_config", "quant_section", "quantized_modules"]

QUANT_FILE = "hf_quant_config.json"
# Packed or 8-bit float storage only a quantized module uses.
_QUANT_DTYPES = frozenset(
    {
        "U8",
        "F4",
        "F6_E2M3",
        "F6_E3M2",
        "F8_E5M2",
        "F8_E4M3",
        "F8_E8M0",
        "F8_E4M3FNUZ",
        "F8_E5M2FNUZ",
    }
)
_SCALE_PARAMS = frozenset({"weight_scale", "weight_scale_inv"})
_EXPERT_ID = re.compile(r"\.experts\.(\d+)\.")


def quant_section(quant_config: dict[str, Any] | None) -> dict[str, Any]:
    """The `quantization` object (older files keep its keys at the top level)."""
    if not isinstance(quant_config, dict):
        return {}
    section = quant_config.get("quantization")
    return section if isinstance(section, dict) else quant_config


def quantized_modules(scanned: ScannedCheckpoint) -> dict[str, str]:
    """Module name -> a tensor of it, for modules stored quantized (a scale or a packed dtype)."""
    t = scanned.tensors
    modules: dict[str, str] = {}
    for name, dtype in zip(t["name"], t["dtype"].astype(str), strict=True):
        module, _, param = name.rpartition(".")
        if not module:
            continue
        if param in _SCALE_PARAMS or (param == "weight" and dtype in _QUANT_DTYPES):
            modules.setdefault(module, name)
    return modules


def check_quant_config(scanned: ScannedCheckpoint) -> list[Finding]:
    """quant-config-missing-layer (under MIXED_PRECISION) and quant-config-stale-layer."""
    section = quant_section(scanned.quant_config)
    layers = section.get("quantized_layers")
    if section.get("quant_algo") != "MIXED_PRECISION" or not isinstance(layers, dict):
        return []
    excluded = [p for p in section.get("exclude_modules") or [] if isinstance(p, str)]
    quantized = quantized_modules(scanned)
    missing = [m for m in quantized if m not in layers and not _excluded(m, excluded)]
    all_modules = {name.rpartition(".")[0] for name in scanned.tensors["name"]}
    stale = [m for m in layers if m not in all_modules]
    return _fold("quant-config-missing-layer", missing, quantized, len(layers)) + _fold(
        "quant-config-stale-layer", stale, {}, len(layers)
    )


def _excluded(module: str, patterns: list[str]) -> bool:
    return any(
        fnmatch.fnmatchcase(module, p) or fnmatch.fnmatchcase(module + ".weight", p)
        for p in patterns
    )


def _fold(code: str, modules: list[str], tensor_of: dict[str, str], listed: int) -> list[Finding]:
    """One finding per layer-and-projection group: 'experts 64-511 of model.layers.3...'."""
    groups: dict[str, list[int]] = defaultdict(list)
    singles: list[str] = []
    for module in modules:
        match = _EXPERT_ID.search(module)
        if match:
            key = module[: match.start()] + ".experts.{E}." + module[match.end() :]
            groups[key].append(int(match.group(1)))
        else:
            singles.append(module)
    what = (
        "is stored quantized but has no quantized_layers entry and matches no exclude_modules pattern"
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
            code, f"{QUANT_FILE}: {m} {what}{todo}", file=QUANT_FILE, tensor=tensor_of.get(m)
        )
        for m in singles
    ]
    for key, ids in groups.items():
        out.append(
            make_finding(
                code,
                f"{QUANT_FILE}: {key} for experts {fold_ranges(ids)} ({len(ids)} modules) {what}"
                f" ({listed} entries listed){todo}",
                file=QUANT_FILE,
                tensor=tensor_of.get(key.replace("{E}", str(ids[0]))),
                expert=ids[0] if len(ids) == 1 else None,
            )
        )
    return out
