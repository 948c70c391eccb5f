"""compressed-tensors checkpoints (`quantization_config.quant_method == "compressed-tensors"`
in config.json, as llm-compressor writes them and vLLM / SGLang read them) against their
tensors and their `recipe.yaml`. Pure.

A module is quantized by the config group whose `targets` it matches and no `ignore` entry
names; what each format stores per module is docs/formats.md, "compressed-tensors". How the
entries are matched: docs/architecture.md, "checks/".
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from inspector._internal.checkpoint.quant_targets import (
    TargetMatcher,
    group_targets,
    is_linear,
    strings,
    too_many_targets,
)
from inspector._internal.checkpoint.scanned import ScannedCheckpoint
from inspector._internal.common.filenames import CONFIG_NAME, RECIPE_NAME
from inspector._internal.common.text import examples
from inspector._internal.findings.codes import Code, code_set
from inspector._internal.findings.finding import Finding, fold_modules, make_finding
from inspector._internal.formats.patterns import MAX_PATTERNS, PatternBudget, Patterns
from inspector._internal.formats.recipe import QuantModifier

__all__ = [
    "CODES",
    "check_compressed_tensors",
    "compressed_tensors_config",
    "module_tensors",
    "pattern_findings",
]

CODES = code_set(
    Code.QUANT_SCHEME_MISMATCH,
    Code.QUANT_CONFIG_MISSING_LAYER,
    Code.QUANT_RECIPE_MISMATCH,
    Code.CHECK_BUDGET_EXCEEDED,
    Code.QUANT_PATTERN_REFUSED,
)

# Tensors a quantized Linear may hold besides its plain `weight` / `bias`.
QUANT_PARAMS = frozenset(
    {
        "weight_packed",
        "weight_scale",
        "weight_zero_point",
        "weight_global_scale",
        "weight_shape",
        "weight_g_idx",
        "input_scale",
        "input_zero_point",
        "input_global_scale",
        "output_scale",
        "output_zero_point",
    }
)
_FLOAT8 = frozenset({"F8_E4M3", "F8_E5M2", "F8_E4M3FNUZ", "F8_E5M2FNUZ"})

Tensors = Mapping[str, tuple[str, tuple[int, ...]]]


def compressed_tensors_config(config: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """The `quantization_config` of `config.json` when it is a compressed-tensors one."""
    section = config.get("quantization_config") if isinstance(config, Mapping) else None
    if isinstance(section, Mapping) and section.get("quant_method") == "compressed-tensors":
        return section
    return None


def module_tensors(scanned: ScannedCheckpoint) -> dict[str, dict[str, tuple[str, tuple[int, ...]]]]:
    """Module -> {parameter name: (dtype, shape)} of every stored tensor."""
    out: dict[str, dict[str, tuple[str, tuple[int, ...]]]] = {}
    for shard in scanned.shards:
        for name, dtype, shape in zip(shard.names, shard.dtypes, shard.shapes, strict=True):
            module, _, param = name.rpartition(".")
            out.setdefault(module, {})[param] = (dtype, tuple(shape))
    return out


@dataclass(frozen=True, slots=True)
class _Scheme:
    group: str
    format: str
    args: Mapping[str, Any]  # the group's `weights`
    static_input: bool  # input activations with a stored scale
    nvfp4_input: bool


def _schemes(
    section: Mapping[str, Any], budget: PatternBudget
) -> list[tuple[TargetMatcher, _Scheme]]:
    out = []
    default = section.get("format")
    for name, matcher, group in group_targets(section, budget=budget):
        weights = group.get("weights")
        fmt = group.get("format") or default
        acts = group.get("input_activations")
        static = isinstance(acts, Mapping) and acts.get("dynamic") is False
        local = isinstance(acts, Mapping) and acts.get("dynamic") == "local"
        out.append(
            (
                matcher,
                _Scheme(
                    name,
                    str(fmt),
                    weights if isinstance(weights, Mapping) else {},
                    static,
                    local,
                ),
            )
        )
    return out


def check_compressed_tensors(scanned: ScannedCheckpoint) -> list[Finding]:
    """quant-scheme-mismatch, quant-config-missing-layer and quant-recipe-mismatch."""
    section = compressed_tensors_config(scanned.config)
    if section is None:
        return []
    ignore_entries = strings(section.get("ignore"))
    if too_many_targets(section):
        return [
            make_finding(
                "check-budget-exceeded",
                f"{CONFIG_NAME} quantization_config lists more than {MAX_PATTERNS:,} config "
                "groups, targets and ignore entries; the compressed-tensors modules were NOT "
                "checked",
                file=CONFIG_NAME,
            )
        ]
    budget = PatternBudget()
    schemes = _schemes(section, budget)
    ignore = TargetMatcher(ignore_entries, budget=budget)
    modules = module_tensors(scanned)
    mismatched: list[tuple[str, str]] = []
    unlisted: list[tuple[str, str]] = []
    undecided: list[str] = []
    planned: dict[str, str] = {}
    for module, params in modules.items():
        linear = is_linear(module, params)
        if not linear and not (set(params) & QUANT_PARAMS):
            continue
        ignored = ignore(module, linear)
        scheme = None
        if ignored is False:
            for matcher, candidate in schemes:
                hit = matcher(module, linear)
                if hit is not False:
                    ignored, scheme = (None, None) if hit is None else (False, candidate)
                    break
        if ignored is None:
            undecided.append(module)  # a refused pattern decides it: not judged
            continue
        stored = _stored_kind(params)
        if scheme is None:
            if stored is not None and linear:
                why = "ignores it" if ignored else "targets it in no config group"
                unlisted.append((module, f"is stored {stored} but {CONFIG_NAME} {why}"))
            continue
        planned[module] = scheme.group
        problem = _against_scheme(params, scheme)
        if problem is not None:
            mismatched.append((module, problem))
    findings = _fold(Code.QUANT_SCHEME_MISMATCH, mismatched)
    findings += _fold(Code.QUANT_CONFIG_MISSING_LAYER, unlisted)
    lists = [ignore.patterns, *(m.patterns for m, _ in schemes)]
    findings += pattern_findings(f"{CONFIG_NAME} quantization_config", lists, undecided)
    if scanned.recipe:
        # A module the two lists disagree on whose tensors already contradict config.json is
        # reported above (the config is the side that is off); the recipe adds nothing.
        reported = {m for m, _ in mismatched} | {m for m, _ in unlisted} | set(undecided)
        findings += _recipe(scanned.recipe, modules, planned, reported, budget)
    return findings


def pattern_findings(
    where: str, lists: Iterable[Patterns], modules: Sequence[str]
) -> list[Finding]:
    """quant-pattern-refused for the pattern lists of `where` ("config.json
    quantization_config"...): the patterns refused, the names left undecided, and the
    `modules` that were not checked for it. Nothing when every pattern ran on every name."""
    reasons = list(dict.fromkeys(r for patterns in lists for r in patterns.reasons()))
    if not reasons and not modules:
        return []
    shown = "; ".join(reasons[:3]) + (f"; and {len(reasons) - 3} more" if len(reasons) > 3 else "")
    unchecked = (
        f"{len(modules):,} modules they could decide were NOT checked ({examples(sorted(modules))})"
        if modules
        else "no module needed it"
    )
    file = where.split(" ")[0]
    return [
        make_finding(
            Code.QUANT_PATTERN_REFUSED,
            f"{where}: patterns not matched ({shown}); {unchecked}. Patterns run without "
            "backtracking: rewrite these without backreferences or lookarounds, within the caps",
            file=file,
        )
    ]


def _stored_kind(params: Mapping[str, tuple[str, tuple[int, ...]]]) -> str | None:
    """How a module is stored quantized ("packed", "as FP8"...), or None when it is not."""
    if "weight_packed" in params:
        return f"packed ({params['weight_packed'][0]} weight_packed)"
    weight = params.get("weight")
    if "weight_scale" in params or "weight_global_scale" in params:
        return f"quantized ({weight[0] if weight else 'no'} weight with weight_scale)"
    if weight is not None and (weight[0] in _FLOAT8 or weight[0] == "I8"):
        return f"quantized ({weight[0]} weight)"
    return None


def _int(value: Any) -> int | None:
    return value if type(value) is int and value > 0 else None


def _against_scheme(params: Mapping[str, tuple[str, tuple[int, ...]]], s: _Scheme) -> str | None:
    """Why the module's tensors are not what scheme `s` stores, or None."""
    fmt = s.format
    bits = _int(s.args.get("num_bits")) or 8
    if fmt in ("pack-quantized", "nvfp4-pack-quantized", "mxfp4-pack-quantized"):
        need = ["weight_packed", "weight_scale"]
        need += ["weight_shape"] if fmt == "pack-quantized" else []
        need += ["weight_global_scale"] if fmt == "nvfp4-pack-quantized" else []
    elif fmt in ("float-quantized", "int-quantized", "naive-quantized"):
        need = ["weight", "weight_scale"]
    else:
        return None  # dense, sparse and unknown formats: nothing this check knows to require
    if s.args.get("symmetric") is False and fmt != "nvfp4-pack-quantized":
        need.append("weight_zero_point")
    if s.static_input:
        need.append("input_scale")
    if s.nvfp4_input and fmt == "nvfp4-pack-quantized":
        need.append("input_global_scale")
    missing = [p for p in need if p not in params]
    if missing:
        held = ", ".join(f"{p} {d} {list(sh)}" for p, (d, sh) in sorted(params.items()))
        lacks = ", ".join(missing)
        return f"config group {s.group} ({fmt}) needs {lacks}, which it lacks (it holds {held})"
    out_in = _logical_shape(params, fmt, bits)
    if out_in is None:
        shown = params.get("weight_packed", params.get("weight"))
        return f"config group {s.group} ({fmt}): its weight shape {shown} is not a 2-D matrix"
    out, lo, hi = out_in
    if fmt in ("float-quantized", "int-quantized"):
        dtype = params["weight"][0]
        wanted = _FLOAT8 if s.args.get("type") == "float" else {"I8"}
        if dtype not in wanted:
            stores = "/".join(sorted(wanted))
            return f"config group {s.group} ({fmt}) stores {stores}, the weight is {dtype}"
    return _scale_problem(params["weight_scale"][1], s, out, lo, hi)


def _logical_shape(
    params: Mapping[str, tuple[str, tuple[int, ...]]], fmt: str, bits: int
) -> tuple[int, int, int] | None:
    """(out, smallest in, largest in) the stored weight allows."""
    if fmt == "pack-quantized":
        shape = params["weight_packed"][1]
        if len(shape) != 2:
            return None
        cols = shape[1]
        # ceil(in * bits / 32) words per row: in lies in ((cols - 1) * 32 / bits, cols * 32 / bits]
        return shape[0], (cols - 1) * 32 // bits + 1, cols * 32 // bits
    if fmt in ("nvfp4-pack-quantized", "mxfp4-pack-quantized"):
        shape = params["weight_packed"][1]
        return (shape[0], 2 * shape[1], 2 * shape[1]) if len(shape) == 2 else None
    shape = params["weight"][1]
    return (shape[0], shape[1], shape[1]) if len(shape) == 2 else None


def _scale_problem(scale: tuple[int, ...], s: _Scheme, out: int, lo: int, hi: int) -> str | None:
    strategy = s.args.get("strategy")
    group = _int(s.args.get("group_size"))
    block = s.args.get("block_structure")
    shown = f"weight_scale {list(scale)}"
    head = f"config group {s.group} ({s.format}, {strategy}"
    if strategy == "tensor":
        ok = math.prod(scale) == 1
        want = "[1]"
    elif strategy == "channel":
        ok = tuple(scale) == (out, 1)
        want = f"[{out}, 1]"
    elif strategy in ("group", "tensor_group") and group is not None:
        ok = len(scale) == 2 and scale[0] == out and -(-lo // group) <= scale[1] <= -(-hi // group)
        want = f"[{out}, ceil(in / {group})]"
        head += f" {group}"
    elif (
        strategy == "block"
        and isinstance(block, list)
        and len(block) == 2
        and all(_int(b) for b in block)
    ):
        b0, b1 = block
        ok = (
            len(scale) == 2
            and scale[0] == -(-out // b0)
            and -(-lo // b1) <= scale[1] <= -(-hi // b1)
        )
        want = f"[ceil({out} / {b0}), ceil(in / {b1})]"
        head += f" {b0}x{b1}"
    else:
        return None
    if ok:
        return None
    size = f"{lo}" if lo == hi else f"{lo}..{hi}"
    return f"{head}) needs {want} with in = {size}, the module stores {shown}"


def _fold(code: Code, items: list[tuple[str, str]]) -> list[Finding]:
    what = {
        Code.QUANT_SCHEME_MISMATCH: (
            "serving engines build the module the config describes and find other tensors: "
            f"re-export the module with its group's scheme, or fix {CONFIG_NAME} to what was "
            "exported"
        ),
        Code.QUANT_CONFIG_MISSING_LAYER: (
            "loaders build it unquantized and find quantized tensors: remove it from "
            f"{CONFIG_NAME}'s ignore (or add it to a group's targets), or re-export it "
            "unquantized"
        ),
    }[code]
    return fold_modules(code, items, head=CONFIG_NAME, advice=what, file=CONFIG_NAME)


def _recipe(
    recipe: Sequence[QuantModifier],
    modules: Mapping[str, Mapping[str, tuple[str, tuple[int, ...]]]],
    planned: Mapping[str, str],
    reported: set[str],
    budget: PatternBudget,
) -> list[Finding]:
    """The modules the recipe quantizes against those config.json quantizes."""
    by_recipe: set[str] = set()
    matchers: list[tuple[TargetMatcher, list[TargetMatcher]]] = []
    for modifier in recipe:
        targets = [TargetMatcher(t, budget=budget) for t in modifier.groups.values()] or [
            TargetMatcher(modifier.targets, budget=budget)
        ]
        matchers.append((TargetMatcher(modifier.ignore, budget=budget), targets))
    undecided: list[str] = []
    for module, params in modules.items():
        linear = is_linear(module, params)
        if not linear:
            continue
        for ignore, targets in matchers:
            ignored = ignore(module, linear)
            hits = [t(module, linear) for t in targets] if ignored is False else []
            if ignored is None or (None in hits and True not in hits):
                undecided.append(module)
                break
            if ignored is False and True in hits:
                by_recipe.add(module)
    reported = reported | set(undecided)
    by_recipe -= reported
    lists = [m.patterns for ignore, targets in matchers for m in (ignore, *targets)]
    found = pattern_findings(RECIPE_NAME, lists, undecided)
    by_config = set(planned) - reported
    if by_recipe == by_config:
        return found
    only_recipe = sorted(by_recipe - by_config - reported)
    only_config = sorted(by_config - by_recipe - reported)
    if not only_recipe and not only_config:
        return found
    parts = []
    if only_recipe:
        parts.append(
            f"quantizes {len(only_recipe):,} modules {CONFIG_NAME} leaves unquantized "
            f"({examples(only_recipe)})"
        )
    if only_config:
        parts.append(
            f"leaves unquantized {len(only_config):,} modules {CONFIG_NAME} quantizes "
            f"({examples(only_config)})"
        )
    return [
        *found,
        make_finding(
            "quant-recipe-mismatch",
            f"{RECIPE_NAME} {' and '.join(parts)}; one of the two was edited after the export: "
            "re-export, or make them agree so the recipe reproduces this checkpoint",
            file=RECIPE_NAME,
        ),
    ]
