"""Which quantization schemes an engine runs on which GPU: native, through a fallback kernel,
or not at all (`engine-quant-unsupported`, `engine-quant-fallback`). One data table, with
the source and version each row comes from.

Rows only where an engine publishes the facts (vLLM; SGLang publishes none, and `fit` says so
rather than guess). The sources: docs/architecture.md, "serve/". The scheme is read from
config.json's `quantization_config` (else `hf_quant_config.json`), every value checked
before use: an unknown scheme is not judged.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from itertools import islice
from typing import Any

from inspector._internal.checkpoint.quant_config import quant_section
from inspector._internal.findings.codes import Code
from inspector._internal.findings.finding import Finding, make_finding
from inspector._internal.serve.gpus import Gpu

__all__ = ["QUANT_SUPPORT", "SUPPORT_SOURCE", "Support", "quant_scheme", "quant_support_findings"]

SUPPORT_SOURCE = (
    "vLLM 0.33.0: docs/features/quantization (Supported Hardware, FP8 W8A8) and each "
    "method's get_min_capability"
)


@dataclass(frozen=True, slots=True)
class Support:
    """One scheme in one engine: native from `native` (compute capability), through
    `fallback_kernel` from `fallback` (None: no fallback), unsupported below both."""

    scheme: str
    native: float
    fallback: float | None
    fallback_kernel: str
    source: str


QUANT_SUPPORT: Mapping[tuple[str, str], Support] = {
    (s.scheme, "vllm"): s
    for s in (
        Support("FP8 W8A8", 8.9, 7.5, "FP8 Marlin (weight-only W8A16)", SUPPORT_SOURCE),
        Support("NVFP4", 10.0, 7.5, "FP4 Marlin (weight-only)", SUPPORT_SOURCE),
        Support(
            "MXFP4", 10.0, 8.0, "the MXFP4 triton / Marlin kernels (weight-only)", SUPPORT_SOURCE
        ),
        Support("INT4 W4A16 (GPTQ / AWQ)", 7.5, None, "", SUPPORT_SOURCE),
        Support("INT8 W8A8", 7.5, None, "", SUPPORT_SOURCE),
    )
}

_GROUPS_LOOKED_AT = 1_024


def quant_scheme(
    config: Mapping[str, Any] | None, quant_config: Mapping[str, Any] | None
) -> str | None:
    """The scheme (a `QUANT_SUPPORT` key) the checkpoint is quantized with, or None when it
    is not quantized or the scheme is not one the table judges."""
    qc = config.get("quantization_config") if isinstance(config, Mapping) else None
    qc = qc if isinstance(qc, Mapping) else {}
    method = qc.get("quant_method")
    if method in ("fp8", "fbgemm_fp8"):
        return "FP8 W8A8"
    if method == "mxfp4":
        return "MXFP4"
    if method in ("gptq", "awq", "gptq_marlin", "awq_marlin"):
        return "INT4 W4A16 (GPTQ / AWQ)" if qc.get("bits", 4) == 4 else None
    if method == "compressed-tensors":
        return _compressed_tensors(qc)
    section = qc if method in ("modelopt", "modelopt_fp4") else quant_section(quant_config)
    algo = section.get("quant_algo") if isinstance(section, Mapping) else None
    if algo == "MIXED_PRECISION":
        # Model-Optimizer's mixed precision: the schemes its quantized_layers use, the
        # most demanding first.
        layers = section.get("quantized_layers")
        algos = {
            str(e.get("quant_algo")).upper()
            for e in islice(
                layers.values() if isinstance(layers, Mapping) else (), _GROUPS_LOOKED_AT
            )
            if isinstance(e, Mapping)
        }
        algo = next((a for a in ("NVFP4", "FP8") if any(a in x for x in algos)), None)
    if isinstance(algo, str):
        upper = algo.upper()
        if "NVFP4" in upper:
            return "NVFP4"
        if "FP8" in upper:
            return "FP8 W8A8"
    return None


def _compressed_tensors(qc: Mapping[str, Any]) -> str | None:
    groups = qc.get("config_groups")
    if not isinstance(groups, Mapping):
        return None
    for group in islice(groups.values(), _GROUPS_LOOKED_AT):
        if not isinstance(group, Mapping):
            continue
        weights, inputs = group.get("weights"), group.get("input_activations")
        if not isinstance(weights, Mapping):
            continue
        bits, kind = weights.get("num_bits"), weights.get("type")
        if kind == "float" and bits == 4:
            return "NVFP4"
        if kind == "float" and bits == 8:
            return "FP8 W8A8"
        if kind == "int" and bits == 4 and not isinstance(inputs, Mapping):
            return "INT4 W4A16 (GPTQ / AWQ)"
        if kind == "int" and bits == 8 and isinstance(inputs, Mapping):
            return "INT8 W8A8"
    return None


def quant_support_findings(
    config: Mapping[str, Any] | None,
    quant_config: Mapping[str, Any] | None,
    *,
    gpu: Gpu,
    engine: str = "vllm",
) -> list[Finding]:
    """`engine-quant-unsupported` or `engine-quant-fallback` for the checkpoint's scheme on
    `gpu` in `engine`; nothing when it runs natively or the table has no row for it."""
    scheme = quant_scheme(config, quant_config)
    row = None if scheme is None else QUANT_SUPPORT.get((scheme, engine))
    if row is None:
        return []
    cc = float(gpu.compute_capability)
    where = f"{gpu.name} (compute capability {gpu.compute_capability})"
    if cc >= row.native:
        return []
    if row.fallback is not None and cc >= row.fallback:
        return [
            make_finding(
                Code.ENGINE_QUANT_FALLBACK,
                f"{engine} runs {scheme} natively from compute capability {row.native:g}; on "
                f"{where} it falls back to {row.fallback_kernel} ({row.source})",
            )
        ]
    lowest = row.fallback if row.fallback is not None else row.native
    return [
        make_finding(
            Code.ENGINE_QUANT_UNSUPPORTED,
            f"{engine} runs {scheme} from compute capability {lowest:g}; {where} is below it "
            f"and the engine refuses to start ({row.source})",
        )
    ]
