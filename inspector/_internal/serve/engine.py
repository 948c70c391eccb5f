"""`check --engine`: what a serving engine would make of a checkpoint, as findings.

`vllm`: its own weight loading on a meta model (`load.engine`) and quantization support;
`llama.cpp`: the names `convert_hf_to_gguf.py` cannot map (`checks.llama_cpp`). SGLang is
left out: its `load_weights` logs an unmapped name and goes on, so it says far less (its
start-up rules are in `fit`). What did not run is one line in `notes`, never a finding.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from inspector._internal.checkpoint.scanned import LayoutName, ScannedCheckpoint
from inspector._internal.checks.llama_cpp import check_convert_mapping, gguf_available
from inspector._internal.common.defaults import ENGINES
from inspector._internal.common.display import legible
from inspector._internal.common.text import examples, plural
from inspector._internal.findings.codes import Code
from inspector._internal.findings.finding import Finding, make_finding, sort_findings
from inspector._internal.load.engine import EngineVerdict, engine_verdict
from inspector._internal.serve.gpus import gpu_named
from inspector._internal.serve.quant_support import quant_support_findings
from inspector.errors import InspectorError

__all__ = ["ENGINES", "EngineReport", "engine_check", "verdict_findings"]

_SGLANG = (
    "SGLang's own weight loading is not run: it logs a name it cannot map and goes on, so "
    "it would say little; its start-up rules are judged by `ckpt-inspect fit`"
)


@dataclass(frozen=True)
class EngineReport:
    """The engine's findings, the notes on what did not run, and vLLM's verdict."""

    engine: str
    findings: tuple[Finding, ...]
    notes: tuple[str, ...]
    verdict: EngineVerdict | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "engine": self.engine,
            "notes": list(self.notes),
            "verdict": None if self.verdict is None else self.verdict.to_dict(),
        }


def engine_check(
    ckpt: ScannedCheckpoint,
    *,
    engine: str,
    tp: int = 1,
    gpu: str | None = None,
    verdict: EngineVerdict | None = None,
) -> EngineReport:
    """`engine`'s findings for `ckpt` at tensor-parallel size `tp` (module docstring);
    `gpu` (a catalogue name) adds its quantization support; `verdict` reuses one."""
    if engine not in ENGINES:
        raise InspectorError(f"engine {engine!r}: expected one of {', '.join(ENGINES)}")
    if type(tp) is not int or not 1 <= tp <= 1024:
        raise InspectorError(f"tp {tp!r}: expected a whole number from 1 to 1,024")
    known = None
    if gpu is not None:
        known = gpu_named(gpu)
        if known is None:
            raise InspectorError(f"gpu {gpu!r} is not in the catalogue")
    found: list[Finding] = []
    notes: list[str] = []
    if engine == "llama.cpp":
        if ckpt.layout != LayoutName.GGUF:
            mapped, why = check_convert_mapping(ckpt)
            found += mapped
            notes += [why] if why else []
        elif (missing := gguf_available()) is not None:
            notes.append(missing)
        return EngineReport(engine, tuple(sort_findings(found)), tuple(notes))
    if known is not None:
        found += quant_support_findings(ckpt.config, ckpt.quant_config, gpu=known, engine=engine)
    if engine == "sglang":
        return EngineReport(engine, tuple(found), (_SGLANG,))
    if verdict is None:
        verdict = engine_verdict(ckpt, tp=tp)
    if verdict.skipped is not None:
        notes.append(verdict.summary())
    found += verdict_findings(verdict)
    return EngineReport(engine, tuple(sort_findings(found)), tuple(notes), verdict)


def verdict_findings(verdict: EngineVerdict) -> list[Finding]:
    """vLLM's verdict as findings (module docstring)."""
    if not verdict.ran:
        return []
    who = f"vLLM {verdict.version} ({verdict.architecture}, TP {verdict.tp})"
    found: list[Finding] = []
    if verdict.error is not None:
        code = {
            "unmapped": Code.ENGINE_WEIGHT_UNMAPPED,
            "shape": Code.ENGINE_SHAPE_MISMATCH,
        }.get(verdict.error_kind or "", Code.ENGINE_LOAD_FAILED)
        found.append(
            make_finding(code, f"{who} load_weights raises: {legible(verdict.error, limit=600)}")
        )
        return found
    if verdict.missing_count:
        quantized = f" (a {verdict.quantization} checkpoint: vLLM itself does not check)"
        found.append(
            make_finding(
                Code.ENGINE_WEIGHT_MISSING,
                f"{who}: {plural(verdict.missing_count, 'parameter')} load_weights never "
                f"loaded ({examples(list(verdict.missing))}): the engine starts and serves "
                "them uninitialised"
                + (
                    quantized
                    if verdict.quantization
                    else "; vLLM's own check skips modules "
                    "whose weights are post-processed, such as o_proj and lm_head"
                ),
                tensor=verdict.missing[0] if verdict.missing else None,
            )
        )
    for name, lacking in verdict.missing_shards:
        found.append(
            make_finding(
                Code.ENGINE_WEIGHT_MISSING,
                f"{who}: {legible(name)} is fused from several stored tensors and none filled "
                f"{legible(lacking, limit=200)}: vLLM starts without a word and serves that "
                "part uninitialised",
                tensor=name,
            )
        )
    for name, received, expected, shape in verdict.size_mismatched:
        more = "more" if received > expected else "fewer"
        found.append(
            make_finding(
                Code.ENGINE_SHAPE_MISMATCH,
                f"{who}: the stored tensors for {legible(name)} hold {received:,} elements, "
                f"{more} than its {expected:,} ({list(shape)}): vLLM copies them without a "
                "word "
                + ("(cut to the parameter)" if received > expected else "(the rest uninitialised)"),
                tensor=name,
            )
        )
    return found
