"""llama.cpp's own tensor set: what a GGUF must hold for its architecture and block count, and
which names of a Hugging Face checkpoint `convert_hf_to_gguf.py` cannot map. Pure; the names
come from gguf-py (`gguf.constants.MODEL_TENSORS`, `TENSOR_NAMES`, `gguf.TensorNameMap`),
the package llama.cpp's converter itself uses, so the set follows the installed gguf-py.

The rules are the ones llama.cpp's loader and converter apply (each cited in
docs/architecture.md, "checks/"); without gguf-py they give nothing and `gguf_available()`
says so. Linear in the names: each is reduced to a template once and looked up in a set.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from functools import lru_cache
from typing import Any

from inspector._internal.checkpoint.scanned import ScannedCheckpoint
from inspector._internal.checkpoint.spec import MAX_LAYERS
from inspector._internal.common.display import legible
from inspector._internal.common.text import examples, fold_ranges, plural
from inspector._internal.findings.codes import Code, code_set
from inspector._internal.findings.finding import Finding, make_finding
from inspector._internal.formats.gguf_shard import GgufShard, kv_int

__all__ = [
    "CODES",
    "CONVERT_CODES",
    "HF_TO_GGUF_ARCH",
    "check_convert_mapping",
    "check_gguf_tensor_set",
    "gguf_available",
]

CODES = code_set(Code.GGUF_TENSOR_MISSING, Code.GGUF_TENSOR_UNEXPECTED)
CONVERT_CODES = code_set(Code.GGUF_CONVERT_UNMAPPED)

# config.json `architectures` -> the gguf-py architecture `convert_hf_to_gguf.py` registers
# the class under (`@ModelBase.register(...)` and its `model_arch`). Only these are judged.
HF_TO_GGUF_ARCH: Mapping[str, str] = {
    "LlamaForCausalLM": "LLAMA",
    "MistralForCausalLM": "LLAMA",
    "MixtralForCausalLM": "LLAMA",
    "Qwen2ForCausalLM": "QWEN2",
    "Qwen2MoeForCausalLM": "QWEN2MOE",
    "Qwen3ForCausalLM": "QWEN3",
    "Qwen3MoeForCausalLM": "QWEN3MOE",
    "GemmaForCausalLM": "GEMMA",
    "Gemma2ForCausalLM": "GEMMA2",
    "Gemma3ForCausalLM": "GEMMA3",
    "Phi3ForCausalLM": "PHI3",
    "DeepseekV2ForCausalLM": "DEEPSEEK2",
    "DeepseekV3ForCausalLM": "DEEPSEEK2",
    "GptOssForCausalLM": "GPT_OSS",
    "Glm4MoeForCausalLM": "GLM4_MOE",
    "GPT2LMHeadModel": "GPT2",
}

# A block number in a GGUF name (`blk.12.`, `enc.blk.3.`), and in a Hugging Face name.
_GGUF_BLOCK = re.compile(r"(?<![^.])blk\.(\d{1,9})\.")
_HF_EXPERT = re.compile(r"\.experts\.\d{1,9}\.")
# What the converter drops or leaves to another conversion (module docstring).
_CONVERT_SKIPS = (".rotary_emb.inv_freq", ".attention.masked_bias", ".attention.bias")
_SCALE_PARAMS = frozenset(
    {"weight_scale_inv", "weight_scale", "input_scale", "weight_scale_2", "k_scale", "v_scale"}
)
_TOWERS = (
    "visual.",
    "model.visual.",
    "vision_tower.",
    "model.vision_tower.",
    "vision_model.",
    "multi_modal_projector.",
    "model.multi_modal_projector.",
    "audio_tower.",
    "model.audio_tower.",
    "mm_projector.",
)


def gguf_available() -> str | None:
    """None when gguf-py is importable, else the one line that says the rules did not run."""
    return None if _gguf() is not None else _MISSING


_MISSING = (
    "llama.cpp's tensor set was not checked: gguf-py is not installed "
    "(pip install 'checkpoint-inspector[gguf]')"
)


@lru_cache(maxsize=1)
def _gguf() -> Any:
    try:
        import gguf
    except ImportError:
        return None
    return gguf


@lru_cache(maxsize=64)
def _templates(arch_name: str) -> frozenset[str] | None:
    """The tensor-name templates (`blk.{bid}.attn_q`, `output`) llama.cpp creates for the
    architecture gguf-py names `arch_name`, or None when gguf-py does not know it."""
    gguf = _gguf()
    if gguf is None:
        return None
    constants = gguf.constants
    by_name = {name: arch for arch, name in constants.MODEL_ARCH_NAMES.items()}
    arch = by_name.get(arch_name)
    if arch is None or arch not in constants.MODEL_TENSORS:
        return None
    return frozenset(constants.TENSOR_NAMES[t] for t in constants.MODEL_TENSORS[arch])


def _template(name: str) -> tuple[str, int | None]:
    """(`name` with its block number as `{bid}` and its last part cut off, the block)."""
    block = None
    match = _GGUF_BLOCK.search(name)
    if match is not None:
        block = int(match[1])
        name = f"{name[: match.start()]}blk.{{bid}}.{name[match.end() :]}"
    base, dot, _ = name.rpartition(".")
    return (base if dot else name), block


def check_gguf_tensor_set(scanned: ScannedCheckpoint) -> list[Finding]:
    """`gguf-tensor-missing` / `gguf-tensor-unexpected` for a GGUF (module docstring). Runs
    when the file declares `general.architecture` and `{arch}.block_count` (llama.cpp
    refuses a file without them) and gguf-py knows the architecture."""
    shards = [s for s in scanned.shards if isinstance(s, GgufShard) and s.readable]
    kv = next((s.kv for s in shards if isinstance(s.kv.get("general.architecture"), str)), None)
    if kv is None:
        return []
    arch = kv["general.architecture"]
    blocks = kv_int(kv, f"{arch}.block_count")
    templates = _templates(arch)
    if blocks is None or templates is None or not 0 <= blocks <= MAX_LAYERS:
        return []
    unexpected: list[tuple[str, str]] = []
    past: list[tuple[str, str]] = []
    held_blocks: set[int] = set()
    held: set[str] = set()
    for shard in shards:
        for name in shard.names:
            template, block = _template(name)
            if template not in templates:
                unexpected.append((name, shard.file))
            elif block is not None and block >= blocks:
                past.append((name, shard.file))
            else:
                if block is not None:
                    held_blocks.add(block)
                held.add(template)
    file = shards[0].file
    found: list[Finding] = []
    lost = [b for b in range(blocks) if b not in held_blocks]
    has_blocks = any("{bid}" in t for t in templates)
    if lost and has_blocks:
        found.append(
            make_finding(
                Code.GGUF_TENSOR_MISSING,
                f"{legible(arch)}.block_count declares {blocks:,} blocks and "
                f"{len(lost):,} hold no tensor (blocks {fold_ranges(lost)}): llama.cpp stops "
                "with \"missing tensor 'blk."
                f"{lost[0]}...'\" (`llama_model::load_tensors`); re-convert from the complete "
                "model, or the file was cut short",
                file=file,
                layer=lost[0],
            )
        )
    if _llama3_rope(scanned.config) and "rope_freqs" in templates and "rope_freqs" not in held:
        found.append(
            make_finding(
                Code.GGUF_TENSOR_MISSING,
                "config.json scales RoPE as Llama 3 does (rope_scaling.rope_type llama3) and "
                "the GGUF holds no rope_freqs.weight: llama.cpp loads it and computes "
                "unscaled positions past the original context (`convert_hf_to_gguf.py` "
                "writes rope_freqs in `LlamaModel.generate_extra_tensors`); re-convert with a "
                "current convert_hf_to_gguf.py",
                file=file,
            )
        )
    for what, items in (("names llama.cpp does not create for", unexpected), ("blocks past", past)):
        if not items:
            continue
        tail = (
            f"the {legible(arch)} architecture"
            if items is unexpected
            else f"{legible(arch)}.block_count {blocks:,}"
        )
        found.append(
            make_finding(
                Code.GGUF_TENSOR_UNEXPECTED,
                f"{plural(len(items), 'tensor')} with {what} {tail} "
                f"({examples([n for n, _ in items])}): "
                'llama.cpp refuses the file with "wrong number of tensors" '
                "(`llama_model_loader::done_getting_tensors`); re-convert with the llama.cpp "
                "the file is meant for, or fix block_count",
                file=items[0][1],
                tensor=items[0][0],
            )
        )
    return found


def _llama3_rope(config: Mapping[str, Any] | None) -> bool:
    if not isinstance(config, Mapping):
        return False
    rope = config.get("rope_scaling") or config.get("rope_parameters")
    if not isinstance(rope, Mapping):
        return False
    kind = rope.get("rope_type", rope.get("type"))
    return isinstance(kind, str) and kind.lower() == "llama3"


def check_convert_mapping(scanned: ScannedCheckpoint) -> tuple[list[Finding], str | None]:
    """(`gguf-convert-unmapped` findings, why the rule did not run or None) for a Hugging
    Face checkpoint (module docstring)."""
    gguf = _gguf()
    if gguf is None:
        return [], _MISSING
    config = scanned.config if isinstance(scanned.config, Mapping) else {}
    names = config.get("architectures")
    hf_arch = names[0] if isinstance(names, list) and names and isinstance(names[0], str) else None
    if hf_arch is None:
        return [], "llama.cpp's converter was not checked: config.json names no architecture"
    arch = HF_TO_GGUF_ARCH.get(hf_arch)
    if arch is None:
        return [], (
            f"llama.cpp's converter was not checked: {legible(hf_arch)} is not among the "
            f"architectures judged ({', '.join(sorted(HF_TO_GGUF_ARCH))})"
        )
    layers = scanned.spec.num_layers or 0
    blocks = min(max(layers, _max_block(scanned.tensors["name"]) + 1), MAX_LAYERS)
    mapping = _name_map(arch, blocks)
    t = scanned.tensors
    is_mtp = t["is_mtp"].to_numpy(dtype=bool)
    unmapped: list[tuple[str, str]] = []
    seen: set[str] = set()
    for name, file, mtp in zip(t["name"].tolist(), t["file"].tolist(), is_mtp, strict=True):
        if mtp or _skipped_by_convert(name):
            continue
        key = _HF_EXPERT.sub(".experts.", name)
        if key in seen:
            continue
        seen.add(key)
        if mapping.get_type_and_name(key, try_suffixes=(".weight", ".bias")) is None:
            unmapped.append((name, str(file)))
    if not unmapped:
        return [], None
    return [
        make_finding(
            Code.GGUF_CONVERT_UNMAPPED,
            f"{plural(len(unmapped), 'tensor')} convert_hf_to_gguf.py cannot map for "
            f"{legible(hf_arch)} "
            f"(gguf-py {legible(arch)}: {examples([n for n, _ in unmapped])}): the conversion "
            'stops with "Can not map tensor" (`ModelBase.map_tensor_name`); remove or rename '
            "them, or check that config.json names the right architecture",
            file=unmapped[0][1],
            tensor=unmapped[0][0],
        )
    ], None


@lru_cache(maxsize=16)
def _name_map(arch: str, blocks: int) -> Any:
    gguf = _gguf()
    return gguf.get_tensor_name_map(getattr(gguf.MODEL_ARCH, arch), blocks)


_HF_LAYER = re.compile(r"\.layers\.(\d{1,9})\.")


def _max_block(names: Iterable[str]) -> int:
    """The largest layer number in the names (-1 when none), capped by MAX_LAYERS."""
    top = -1
    for name in names:
        match = _HF_LAYER.search(name)
        if match is not None:
            top = max(top, min(int(match[1]), MAX_LAYERS))
    return top


def _skipped_by_convert(name: str) -> bool:
    if name.endswith(_CONVERT_SKIPS) or name.startswith(_TOWERS):
        return True
    return name.rpartition(".")[2] in _SCALE_PARAMS
