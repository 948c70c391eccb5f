"""Synthetic sparse checkpoints for benchmarks: real headers, data regions left as file holes.

`ensure_checkpoint(spec)` builds (once, cached under `benchmarks/.cache/<key>/`) an HF-sharded
checkpoint of a DeepSeek-V3-like MoE quantized NVFP4-style: every expert projection carries
`weight` (U8, two 4-bit values per byte), `weight_scale` (F8_E4M3, one per 16 values),
`weight_scale_2` and `input_scale` (F32 scalars). Shapes are realistic, so the files are
sparse multi-GB files that use almost no disk: only the headers are ever written.

The files are valid safetensors files (offsets tile the data section, lengths match), so a
healthy scan of them must report no shard-integrity finding.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import struct
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from inspector._internal.common.filenames import CONFIG_NAME, INDEX_NAME, QUANT_CONFIG_NAME

__all__ = [
    "CACHE_DIR",
    "SyntheticSpec",
    "ensure_checkpoint",
    "ensure_listed",
    "spec_for",
    "tensor_count",
    "tensor_list",
]

CACHE_DIR = Path(__file__).resolve().parent / ".cache"
_COMPLETE = ".complete"
# Bits per element of the dtypes this generator uses (a subset of
# `inspector._internal.common.dtypes`).
_BITS = {"U8": 8, "F8_E4M3": 8, "BF16": 16, "F32": 32}


@dataclass(frozen=True, slots=True)
class SyntheticSpec:
    """The parameters of one synthetic checkpoint; the cache key is derived from them."""

    layers: int = 100
    experts: int = 512
    shards: int = 300
    first_dense: int = 3
    mtp_layers: int = 1
    hidden: int = 7168
    moe_intermediate: int = 2048
    dense_intermediate: int = 18432
    vocab: int = 129280
    group_size: int = 16
    # Experts an exporter lost, "<layer>:<first>-<last>" (e.g. "40:17-19"); "" for none.
    lost: str = ""

    @property
    def key(self) -> str:
        # `lost` joins the key only when set, so the caches of whole checkpoints keep theirs.
        fields = {k: v for k, v in asdict(self).items() if k != "lost" or v}
        blob = json.dumps(fields, sort_keys=True).encode()
        tag = f"-lost{self.lost.replace(':', 'x')}" if self.lost else ""
        # "v2": shards are cut into exactly `shards` files since the 1M-tensor case.
        return (
            f"moe-v2-l{self.layers}-e{self.experts}-s{self.shards}{tag}-"
            + hashlib.sha1(blob).hexdigest()[:10]
        )

    def lost_experts(self) -> tuple[int, set[int]]:
        """(layer, expert ids) of `lost`; (-1, empty) when nothing is lost."""
        if not self.lost:
            return -1, set()
        layer, _, ids = self.lost.partition(":")
        first, _, last = ids.partition("-")
        return int(layer), set(range(int(first), int(last or first) + 1))


def spec_for(*, tensors: int | None = None, shards: int | None = None) -> SyntheticSpec:
    """A spec of about `tensors` tensors in `shards` shards (defaults: the full-size model).

    Small targets first shrink the number of layers, then the experts per layer, so that a
    quick run still has the same structure as the full one; larger ones add layers.
    """
    base = SyntheticSpec()
    if tensors is None:
        return base if shards is None else _with(base, shards=shards)
    per_layer = 6144 + 30  # experts (512 * 3 * 4) plus attention, norms, router, shared
    layers = max(2, round(tensors / per_layer))
    experts = base.experts
    if tensors < 2 * per_layer:
        experts = max(4, min(base.experts, tensors // (2 * 12)))
    shard_count = shards if shards is not None else max(1, round(3 * layers))
    spec = _with(
        base, layers=layers, experts=experts, shards=shard_count, first_dense=min(3, layers // 2)
    )
    # Above the full-size model, add layers until there are at least `tensors` tensors.
    while tensors > tensor_count(base) and tensor_count(spec) < tensors:
        spec = _with(spec, layers=spec.layers + 1)
    return spec


def tensor_count(spec: SyntheticSpec) -> int:
    """len(tensor_list(spec)), without building the list."""
    dense = sum(1 for _ in _layer(spec, 0)) if spec.first_dense else 0
    moe = sum(1 for _ in _layer(_with(spec, first_dense=0), 0))
    mtp = 4 * spec.mtp_layers
    decoder = spec.first_dense * dense + (spec.layers - spec.first_dense) * moe
    return 3 + decoder + spec.mtp_layers * moe + mtp


def _with(spec: SyntheticSpec, **changes: int | str) -> SyntheticSpec:
    return SyntheticSpec(**{**asdict(spec), **changes})


# -- tensor list -----------------------------------------------------------------------------


def tensor_list(spec: SyntheticSpec) -> list[tuple[str, str, tuple[int, ...]]]:
    """Every tensor of the model as (name, dtype, shape), in the order a writer emits them."""
    out: list[tuple[str, str, tuple[int, ...]]] = [
        ("model.embed_tokens.weight", "BF16", (spec.vocab, spec.hidden))
    ]
    for layer in range(spec.layers + spec.mtp_layers):
        out.extend(_layer(spec, layer))
    out.append(("model.norm.weight", "BF16", (spec.hidden,)))
    out.append(("lm_head.weight", "BF16", (spec.vocab, spec.hidden)))
    return out


def _layer(spec: SyntheticSpec, layer: int) -> Iterator[tuple[str, str, tuple[int, ...]]]:
    """One decoder layer; layers past `spec.layers` are DeepSeek-V3-style MTP layers."""
    p = f"model.layers.{layer}"
    h = spec.hidden
    yield from _attention(p, h)
    yield f"{p}.input_layernorm.weight", "BF16", (h,)
    yield f"{p}.post_attention_layernorm.weight", "BF16", (h,)
    if layer < spec.first_dense:
        for proj, shape in _mlp_shapes(h, spec.dense_intermediate):
            yield f"{p}.mlp.{proj}.weight", "BF16", shape
    else:
        yield f"{p}.mlp.gate.weight", "BF16", (spec.experts, h)
        yield f"{p}.mlp.gate.e_score_correction_bias", "F32", (spec.experts,)
        lost_layer, lost = spec.lost_experts()
        for expert in range(spec.experts):
            if layer == lost_layer and expert in lost:
                continue  # never written, as an exporter that lost them writes nothing
            yield from _nvfp4_mlp(f"{p}.mlp.experts.{expert}", spec)
        yield from _nvfp4_mlp(f"{p}.mlp.shared_experts", spec)
    if layer >= spec.layers:
        yield f"{p}.enorm.weight", "BF16", (h,)
        yield f"{p}.hnorm.weight", "BF16", (h,)
        yield f"{p}.eh_proj.weight", "BF16", (h, 2 * h)
        yield f"{p}.shared_head.norm.weight", "BF16", (h,)


def _attention(p: str, h: int) -> Iterator[tuple[str, str, tuple[int, ...]]]:
    # DeepSeek-V3 multi-head latent attention, 128 heads.
    yield f"{p}.self_attn.q_a_proj.weight", "BF16", (1536, h)
    yield f"{p}.self_attn.q_a_layernorm.weight", "BF16", (1536,)
    yield f"{p}.self_attn.q_b_proj.weight", "BF16", (128 * 192, 1536)
    yield f"{p}.self_attn.kv_a_proj_with_mqa.weight", "BF16", (576, h)
    yield f"{p}.self_attn.kv_a_layernorm.weight", "BF16", (512,)
    yield f"{p}.self_attn.kv_b_proj.weight", "BF16", (128 * 256, 512)
    yield f"{p}.self_attn.o_proj.weight", "BF16", (h, 128 * 128)


def _mlp_shapes(h: int, inter: int) -> list[tuple[str, tuple[int, int]]]:
    return [("gate_proj", (inter, h)), ("up_proj", (inter, h)), ("down_proj", (h, inter))]


def _nvfp4_mlp(p: str, spec: SyntheticSpec) -> Iterator[tuple[str, str, tuple[int, ...]]]:
    for proj, (rows, cols) in _mlp_shapes(spec.hidden, spec.moe_intermediate):
        yield f"{p}.{proj}.weight", "U8", (rows, cols // 2)
        yield f"{p}.{proj}.weight_scale", "F8_E4M3", (rows, cols // spec.group_size)
        yield f"{p}.{proj}.weight_scale_2", "F32", ()
        yield f"{p}.{proj}.input_scale", "F32", ()


# -- writing ---------------------------------------------------------------------------------


def ensure_checkpoint(spec: SyntheticSpec, *, cache_dir: Path = CACHE_DIR) -> Path:
    """The folder of `spec`'s checkpoint, generated unless a complete copy is cached.

    A folder without the completion marker (an interrupted run) is deleted and rebuilt.
    """
    folder = cache_dir / spec.key
    if (folder / _COMPLETE).is_file():
        return folder
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    _write(spec, folder)
    (folder / _COMPLETE).write_text(json.dumps(asdict(spec), indent=1))
    return folder


def ensure_listed(
    name: str,
    tensors: Callable[[], list[tuple[str, str, tuple[int, ...]]]],
    *,
    shards: int,
    config: dict[str, object],
    cache_dir: Path = CACHE_DIR,
) -> Path:
    """The folder of a checkpoint given as its tensor list (`tensors()`, called only when
    the folder is built) and config.json: `shards` sparse shards in list order and their
    index, cached under `cache_dir/name` like `ensure_checkpoint`'s."""
    folder = cache_dir / name
    if (folder / _COMPLETE).is_file():
        return folder
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    entries = tensors()
    per_shard = math.ceil(len(entries) / shards)
    weight_map: dict[str, str] = {}
    total_size = 0
    for i in range(shards):
        chunk = entries[i * per_shard : (i + 1) * per_shard]
        file = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        total_size += _write_shard(folder / file, chunk)[0]
        weight_map.update(dict.fromkeys((t[0] for t in chunk), file))
    index = {"metadata": {"total_size": total_size}, "weight_map": weight_map}
    (folder / INDEX_NAME).write_text(json.dumps(index, indent=2))
    (folder / CONFIG_NAME).write_text(json.dumps(config, indent=2))
    (folder / _COMPLETE).write_text("")
    return folder


def _write(spec: SyntheticSpec, folder: Path) -> None:
    """1. split the tensor list into shards; 2. write each header and extend the file to its
    full length as a hole; 3. write the index, config.json and hf_quant_config.json."""
    tensors = tensor_list(spec)
    # Exactly `spec.shards` shards, sizes differing by at most one tensor.
    n, count = len(tensors), min(spec.shards, len(tensors))
    chunks = [tensors[i * n // count : (i + 1) * n // count] for i in range(count)]
    weight_map: dict[str, str] = {}
    total_size = 0
    total_params = 0
    for i, chunk in enumerate(chunks, start=1):
        name = f"model-{i:05d}-of-{len(chunks):05d}.safetensors"
        nbytes, numel = _write_shard(folder / name, chunk)
        total_size += nbytes
        total_params += numel
        weight_map.update(dict.fromkeys((t[0] for t in chunk), name))
    index = {
        "metadata": {"total_size": total_size, "total_parameters": total_params},
        "weight_map": weight_map,
    }
    (folder / INDEX_NAME).write_text(json.dumps(index, indent=2))
    (folder / CONFIG_NAME).write_text(json.dumps(_config(spec), indent=2))
    (folder / QUANT_CONFIG_NAME).write_text(json.dumps(_quant_config(spec), indent=2))


def _write_shard(path: Path, chunk: list[tuple[str, str, tuple[int, ...]]]) -> tuple[int, int]:
    """Write one shard's header, then truncate up to the full length. (data bytes, numel)."""
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    numel_total = 0
    for name, dtype, shape in chunk:
        numel = math.prod(shape)
        nbytes = numel * _BITS[dtype] // 8
        header[name] = {
            "dtype": dtype,
            "shape": list(shape),
            "data_offsets": [offset, offset + nbytes],
        }
        offset += nbytes
        numel_total += numel
    raw = json.dumps(header, separators=(",", ":")).encode()
    # Writers pad the header with spaces to a multiple of 8 bytes.
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(raw)))
        fh.write(raw)
    os.truncate(path, 8 + len(raw) + offset)
    return offset, numel_total


def _config(spec: SyntheticSpec) -> dict[str, object]:
    return {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "hidden_size": spec.hidden,
        "intermediate_size": spec.dense_intermediate,
        "moe_intermediate_size": spec.moe_intermediate,
        "num_hidden_layers": spec.layers,
        "num_attention_heads": 128,
        "num_key_value_heads": 128,
        "n_routed_experts": spec.experts,
        "n_shared_experts": 1,
        "num_experts_per_tok": 8,
        "first_k_dense_replace": spec.first_dense,
        "moe_layer_freq": 1,
        "num_nextn_predict_layers": spec.mtp_layers,
        "kv_lora_rank": 512,
        "q_lora_rank": 1536,
        "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64,
        "v_head_dim": 128,
        "vocab_size": spec.vocab,
        "torch_dtype": "bfloat16",
        "quantization_config": {"quant_method": "modelopt", "quant_algo": "NVFP4"},
    }


def _quant_config(spec: SyntheticSpec) -> dict[str, object]:
    return {
        "producer": {"name": "modelopt", "version": "0.0.0-synthetic"},
        "quantization": {
            "quant_algo": "NVFP4",
            "group_size": spec.group_size,
            "kv_cache_quant_algo": None,
            "exclude_modules": ["lm_head", "model.embed_tokens", "*self_attn*", "*mlp.gate"]
            + [f"model.layers.{i}.mlp.*" for i in range(spec.first_dense)],
        },
    }


def main(argv: list[str] | None = None) -> int:
    """Write (or find cached) the checkpoint the benchmarks and docs measure; print its
    folder. `python benchmarks/_synthetic.py --tensors 300000 --lost 40:17-19`."""
    import argparse

    parser = argparse.ArgumentParser(
        description=main.__doc__.splitlines()[0] if main.__doc__ else ""
    )
    parser.add_argument("--tensors", type=int, default=None, help="about this many tensors")
    parser.add_argument("--shards", type=int, default=None, help="in this many shards")
    parser.add_argument("--lost", default="", help='experts an exporter lost, e.g. "40:17-19"')
    args = parser.parse_args(argv)
    spec = spec_for(tensors=args.tensors, shards=args.shards)
    if args.lost:
        spec = _with(spec, lost=args.lost)
    folder = ensure_checkpoint(spec)
    print(f"{folder} ({tensor_count(spec):,} tensors, {spec.shards} shards, sparse files)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
