"""Block-scaled quantization layouts against their tensors: gpt-oss MXFP4 (`quant_method`
"mxfp4") and DeepSeek block FP8 (`quant_method` "fp8" with `weight_block_size`). Pure.
The shapes of blocks and scales: docs/formats.md, "MXFP4 (gpt-oss) and block FP8 (DeepSeek)";
`modules_to_not_convert` globs match without backtracking (`formats.patterns`).
A module whose weight is not 8-bit must have no `weight_scale_inv`: transformers' own save
leaves an uninitialised one on the projections it kept in bfloat16.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from inspector._internal.checkpoint.scanned import ScannedCheckpoint
from inspector._internal.checks.compressed_tensors import module_tensors, pattern_findings
from inspector._internal.common.filenames import CONFIG_NAME
from inspector._internal.findings.codes import Code, code_set
from inspector._internal.findings.finding import (
    Finding,
    fold_modules,
)
from inspector._internal.formats.patterns import compile_patterns

__all__ = ["CODES", "check_block_quant"]

CODES = code_set(Code.QUANT_SCHEME_MISMATCH, Code.QUANT_PATTERN_REFUSED)

_BLOCKS, _SCALES = "_blocks", "_scales"
_FLOAT8 = frozenset({"F8_E4M3", "F8_E5M2", "F8_E4M3FNUZ", "F8_E5M2FNUZ"})
# Globs in modules_to_not_convert matched per module: a few in real configs.
_MAX_GLOBS = 1_024

Params = Mapping[str, tuple[str, tuple[int, ...]]]


def check_block_quant(scanned: ScannedCheckpoint) -> list[Finding]:
    """quant-scheme-mismatch for MXFP4 and block-FP8 checkpoints (and quant-pattern-refused
    for a modules_to_not_convert glob that could not be matched)."""
    config = scanned.config
    section = config.get("quantization_config") if isinstance(config, Mapping) else None
    if not isinstance(section, Mapping):
        return []
    method = section.get("quant_method")
    if method == "mxfp4":
        problems, refused = _mxfp4(module_tensors(scanned), section)
        return _fold("MXFP4", problems) + refused
    if method == "fp8":
        return _fold("block FP8", _fp8(module_tensors(scanned), section.get("weight_block_size")))
    return []


def _mxfp4(
    modules: Mapping[str, Params], section: Mapping[str, Any]
) -> tuple[list[tuple[str, str]], list[Finding]]:
    """(problems, quant-pattern-refused findings) of an MXFP4 checkpoint."""
    raw = section.get("modules_to_not_convert")
    globs = [g for g in raw if isinstance(g, str)][:_MAX_GLOBS] if isinstance(raw, list) else []
    skip = compile_patterns(globs, syntax="glob")
    out: list[tuple[str, str]] = []
    undecided: list[str] = []
    for module, params in modules.items():
        for param, (dtype, shape) in params.items():
            if param.endswith(_BLOCKS):
                stem = param[: -len(_BLOCKS)]
                where = f"{module}.{stem}"
                skipped = skip.match(module)
                if skipped is None:
                    undecided.append(where)
                    continue
                if skipped:
                    out.append((where, "holds MXFP4 blocks but modules_to_not_convert names it"))
                    continue
                problem = _mxfp4_pair(dtype, shape, params.get(stem + _SCALES))
                if problem:
                    out.append((where, problem))
            elif param.endswith(_SCALES) and param[: -len(_SCALES)] + _BLOCKS not in params:
                out.append((f"{module}.{param[: -len(_SCALES)]}", "has _scales but no _blocks"))
    where = f"{CONFIG_NAME} quantization_config modules_to_not_convert"
    return out, pattern_findings(where, [skip], undecided)


def _mxfp4_pair(
    dtype: str, shape: tuple[int, ...], scales: tuple[str, tuple[int, ...]] | None
) -> str | None:
    if dtype != "U8" or len(shape) < 2 or shape[-1] != 16:
        return f"_blocks is {dtype} {list(shape)}; expected U8 [..., rows, groups, 16]"
    want = list(shape[:-1])
    if scales is None:
        return (
            f"has _blocks {list(shape)} but no _scales (needs U8 {want}): it cannot be dequantized"
        )
    if list(scales[1]) != want or scales[0] != "U8":
        return f"_blocks {list(shape)} need _scales U8 {want}; stored {scales[0]} {list(scales[1])}"
    return None


def _fp8(modules: Mapping[str, Params], block: Any) -> list[tuple[str, str]]:
    sizes = (
        tuple(block)
        if isinstance(block, list)
        and len(block) == 2
        and all(type(b) is int and b > 0 for b in block)
        else None
    )
    out: list[tuple[str, str]] = []
    for module, params in modules.items():
        weight = params.get("weight")
        scale = params.get("weight_scale_inv")
        if weight is None:
            continue
        dtype, shape = weight
        if dtype not in _FLOAT8:
            if scale is not None:
                out.append(
                    (
                        module,
                        f"has a {dtype} weight {list(shape)} (not quantized) and a "
                        f"weight_scale_inv {list(scale[1])}: an uninitialised scale of a "
                        "module that was left unquantized",
                    )
                )
            continue
        if len(shape) != 2:
            continue  # stacked experts and other layouts: their scales are named otherwise
        if scale is None:
            out.append((module, f"has an {dtype} weight {list(shape)} but no weight_scale_inv"))
            continue
        if sizes is None:
            continue
        want = [-(-shape[0] // sizes[0]), -(-shape[1] // sizes[1])]
        if list(scale[1]) != want:
            out.append(
                (
                    module,
                    f"weight {list(shape)} with block {list(sizes)} needs weight_scale_inv "
                    f"{want} (ceil(out / {sizes[0]}), ceil(in / {sizes[1]})); stored "
                    f"{list(scale[1])}",
                )
            )
    return out


def _fold(head: str, items: list[tuple[str, str]]) -> list[Finding]:
    advice = (
        "loaders dequantize it wrongly or refuse it; re-export the module (quantized with its "
        "scales, or unquantized without them)"
    )
    return fold_modules(
        Code.QUANT_SCHEME_MISMATCH, items, head=head, advice=advice, file=CONFIG_NAME
    )
