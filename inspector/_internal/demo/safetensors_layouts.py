"""The safetensors demos: the tiny model of `inspector._internal.demo.model` written with the real
safetensors writer as a single file, an HF sharded checkpoint, a Model-Optimizer per-layer
export, and four damaged checkpoints that reproduce the seed bugs (docs/formats.md).

Every damage is made the way the original bug made it (a sidecar built before the dict was
mutated, expert ids that collided, a config cut mid-write, a name parser that collapsed every
shard into one), not by patching bytes afterwards.
"""

from __future__ import annotations

import json
import math
import textwrap
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np

from inspector._internal.checkpoint.naming import layer_expert_numbers
from inspector._internal.common.filenames import CONFIG_NAME, INDEX_NAME, QUANT_CONFIG_NAME
from inspector._internal.demo.model import DemoModel, DemoTensor, TinyMoeSpec, build_model

__all__ = [
    "SAFETENSORS_DEMOS",
    "Demo",
    "index_doc",
    "per_layer_groups",
    "save_shard",
    "split_greedy",
    "write_per_layer",
    "write_sharded",
    "write_single",
]

HF_TEMPLATE = "model-{i:05d}-of-{n:05d}.safetensors"
Backend = Literal["auto", "ml_dtypes", "torch"]


@dataclass(frozen=True, slots=True)
class Demo:
    """One demo folder: its name, a one-line summary, and the function that fills it."""

    name: str
    summary: str
    write: Callable[[Path], object]


# -- writing files -------------------------------------------------------------------------


def save_shard(
    path: Path,
    tensors: Mapping[str, DemoTensor],
    *,
    backend: Backend = "auto",
    metadata: Mapping[str, str] | None = None,
) -> None:
    """Write `tensors` with the real safetensors writer.

    numpy cannot hold BF16 or F8_E4M3 by itself: `ml_dtypes` gives it those dtypes and
    `safetensors.numpy` then writes them; without it, torch views of the same bytes go through
    `safetensors.torch`. Both produce the same file.
    """
    meta = dict(metadata or {"format": "pt"})
    if backend == "auto":
        backend = "ml_dtypes" if _has_module("ml_dtypes") else "torch"
    if backend == "ml_dtypes":
        import ml_dtypes
        from safetensors.numpy import save_file

        views = {"BF16": ml_dtypes.bfloat16, "F8_E4M3": ml_dtypes.float8_e4m3fn}
        arrays = {k: _view(t.data, views.get(t.dtype)) for k, t in tensors.items()}
        save_file(arrays, path, metadata=meta)
        return
    import torch
    from safetensors.torch import save_file as save_torch

    views = {"BF16": torch.bfloat16, "F8_E4M3": torch.float8_e4m3fn}
    out = {}
    for name, t in tensors.items():
        tensor = torch.from_numpy(t.data)
        out[name] = tensor.view(views[t.dtype]) if t.dtype in views else tensor
    save_torch(out, path, metadata=meta)


def _view(data: np.ndarray, dtype: Any) -> np.ndarray:
    return data if dtype is None else data.view(dtype)


def _has_module(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def write_json(path: Path, value: Any) -> None:
    path.write_text(json.dumps(value, indent=2) + "\n", encoding="utf-8")


def write_readme(dest: Path, title: str, body: str) -> None:
    """`README.txt`: what the folder is and what is wrong with it."""
    text = f"{title}\n{'=' * len(title)}\n\n{body.strip()}\n"
    (dest / "README.txt").write_text(text, encoding="utf-8")


def write_model_json(dest: Path, model: DemoModel) -> None:
    write_json(dest / CONFIG_NAME, model.config)
    if model.quant_config is not None:
        write_json(dest / QUANT_CONFIG_NAME, model.quant_config)


# -- pure planning -------------------------------------------------------------------------


def split_greedy(items: Sequence[tuple[str, int]], *, max_bytes: int) -> list[list[str]]:
    """Greedy in key order, like huggingface_hub's splitter: start a new shard when the next
    tensor would push the current one past `max_bytes`; an oversized tensor sits alone."""
    shards: list[list[str]] = []
    current: list[str] = []
    size = 0
    for name, nbytes in items:
        if current and size + nbytes > max_bytes:
            shards.append(current)
            current, size = [], 0
        current.append(name)
        size += nbytes
    if current:
        shards.append(current)
    return shards


def split_into(items: Sequence[tuple[str, int]], count: int) -> list[list[str]]:
    """The greedy split with the smallest shard limit that yields at most `count` shards."""
    low = max(max(n for _, n in items), math.ceil(sum(n for _, n in items) / count))
    high = sum(n for _, n in items)
    while low < high:
        mid = (low + high) // 2
        if len(split_greedy(items, max_bytes=mid)) <= count:
            high = mid
        else:
            low = mid + 1
    return split_greedy(items, max_bytes=low)


def index_doc(
    weight_map: Mapping[str, str],
    tensors: Mapping[str, DemoTensor],
    *,
    parameters: bool = True,
) -> dict[str, Any]:
    """An index (or sidecar) whose totals are the bytes and elements of the listed tensors."""
    listed = [tensors[name] for name in weight_map]
    metadata: dict[str, Any] = {"total_size": sum(t.nbytes for t in listed)}
    if parameters:
        metadata["total_parameters"] = sum(t.numel for t in listed)
    return {"metadata": metadata, "weight_map": dict(weight_map)}


def per_layer_groups(model: DemoModel) -> list[list[str]]:
    """Model-Optimizer's per-layer plan: one group per decoder layer, the embedding with the
    first, and final norm, output layer and MTP tensors (appended in that order) with the last."""
    layers = model.spec.num_layers
    groups: list[list[str]] = [[] for _ in range(layers)]
    names = list(model.tensors)
    for name, (layer, _expert) in zip(names, layer_expert_numbers(names), strict=True):
        if layer is not None and layer < layers:
            groups[layer].append(name)
        elif name.startswith("model.embed_tokens."):
            groups[0].append(name)
        else:
            groups[-1].append(name)
    return groups


# -- layouts -------------------------------------------------------------------------------


def write_single(dest: Path, model: DemoModel) -> None:
    """`model.safetensors` plus the JSON files, no index (transformers' single-file save)."""
    save_shard(dest / "model.safetensors", model.tensors)
    write_model_json(dest, model)


def write_sharded(
    dest: Path,
    model: DemoModel,
    *,
    shards: int = 4,
    template: str = HF_TEMPLATE,
    write_files: bool = True,
) -> dict[str, Any]:
    """Split greedily into about `shards` files, write them (unless `write_files` is false:
    only the plan is wanted) and return the index document."""
    items = [(name, t.nbytes) for name, t in model.tensors.items()]
    groups = split_into(items, shards)
    weight_map: dict[str, str] = {}
    for i, names in enumerate(groups, start=1):
        file = template.format(i=i, n=len(groups))
        if write_files:
            save_shard(dest / file, {n: model.tensors[n] for n in names})
        weight_map |= dict.fromkeys(names, file)
    return index_doc(weight_map, model.tensors)


def write_per_layer(
    dest: Path, model: DemoModel, *, unlisted: frozenset[str] = frozenset()
) -> dict[str, Any]:
    """One shard per decoder layer with its `<shard>.json` sidecar, then the merged index.

    `unlisted` names tensors that reach the shard but not its sidecar: the exporter computed the
    sidecar from the layer's dict before those tensors were added to it (seed 1422).
    """
    groups = per_layer_groups(model)
    merged: dict[str, str] = {}
    for number, names in enumerate(groups, start=1):
        file = HF_TEMPLATE.format(i=number, n=len(groups))
        save_shard(dest / file, {n: model.tensors[n] for n in names})
        listed = {n: file for n in names if n not in unlisted}
        write_json(dest / f"{file}.json", index_doc(listed, model.tensors, parameters=False))
        merged |= listed
    index = index_doc(merged, model.tensors, parameters=False)
    write_json(dest / INDEX_NAME, index)
    write_model_json(dest, model)
    return index


# -- the demos -----------------------------------------------------------------------------

_MODEL_TEXT = textwrap.fill(
    "A tiny DeepSeek-V3-style model: 4 decoder layers (layer 0 dense, layers 1-3 MoE with "
    "router, shared expert and routed experts), MLA attention, one MTP layer. Routed experts "
    "are NVFP4-like (U8 packed weight, F8_E4M3 weight_scale, F32 weight_scale_2 and "
    "input_scale); everything else is BF16.",
    width=92,
)


def healthy_single(dest: Path) -> None:
    model = build_model()
    write_single(dest, model)
    write_readme(
        dest,
        "healthy-safetensors-single",
        f"""{_MODEL_TEXT}

One model.safetensors ({len(model.tensors)} tensors) with config.json and hf_quant_config.json.
MTP in DeepSeek spelling: model.layers.4.*. Nothing is wrong with it.""",
    )


def healthy_sharded(dest: Path) -> None:
    model = build_model()
    index = write_sharded(dest, model)
    write_json(dest / INDEX_NAME, index)
    write_model_json(dest, model)
    files = sorted(set(index["weight_map"].values()))
    write_readme(
        dest,
        "healthy-hf-sharded",
        f"""{_MODEL_TEXT}

Split greedily in key order into {len(files)} shards
({files[0]} ... {files[-1]}) with model.safetensors.index.json
(total_size = sum of tensor bytes, total_parameters = sum of element counts).
MTP in DeepSeek spelling: model.layers.4.*. Nothing is wrong with it.""",
    )


def healthy_per_layer(dest: Path) -> None:
    model = build_model(TinyMoeSpec(mtp_spelling="mtp"))
    write_per_layer(dest, model)
    write_readme(
        dest,
        "healthy-modelopt-per-layer",
        f"""{_MODEL_TEXT}

A Model-Optimizer Megatron export: one shard per decoder layer (model-0000L-of-00004),
each with a <shard>.json sidecar, and the merged model.safetensors.index.json. The
embedding is in layer 1's shard; final norm, lm_head and the {len(model.mtp_names)} MTP
tensors (mtp.layers.0.*) are in the last shard. Nothing is wrong with it.""",
    )


def modelopt_1422(dest: Path) -> None:
    model = build_model(TinyMoeSpec(mtp_spelling="mtp"))
    write_per_layer(dest, model, unlisted=model.mtp_names)
    write_readme(
        dest,
        "modelopt-1422-sidecar-drift",
        f"""{_MODEL_TEXT}

Seed: Model-Optimizer PR 1422 (sidecar JSON drift). The exporter wrote each layer's
sidecar from the layer's dict, then appended the MTP tensors to the last layer's dict and
wrote the shard. model-00004-of-00004.safetensors holds the {len(model.mtp_names)}
mtp.layers.0.* tensors, but its sidecar model-00004-of-00004.safetensors.json and the merged
model.safetensors.index.json do not list them (their total_size leaves those bytes out too).
Loaders trust the index, so the MTP weights are silently never loaded.""",
    )


def modelopt_1631(dest: Path) -> None:
    spec = TinyMoeSpec(experts=512, stored_experts=64, mtp_spelling="mtp")
    model = build_model(spec)
    write_per_layer(dest, model)
    # Several ranks rewrote config.json at once; a reader saw the first part of the text.
    text = json.dumps(model.config, indent=2)
    (dest / CONFIG_NAME).write_text(text[: len(text) * 3 // 5], encoding="utf-8")
    write_readme(
        dest,
        "modelopt-1631-ep-collision",
        f"""{_MODEL_TEXT}

Seed: Model-Optimizer PR 1631 (export at expert parallel size 8). The config declares
n_routed_experts = 512 and every router (mlp.gate.weight) has 512 rows, but each EP rank
wrote its experts under local ids 0-63, so every MoE layer (and the MTP layer) kept experts
0-63 only: experts 64-511 are missing (448 of 512). hf_quant_config.json lists
quantized_layers for experts 0-63 only; shards, sidecars and index agree with what is there.
config.json was rewritten by several ranks at once and is cut off after
{len(text) * 3 // 5} of its {len(text)} characters: it is not valid JSON.""",
    )


def automodel_2289(dest: Path) -> None:
    model = build_model(TinyMoeSpec(quantized=False))
    reference = write_sharded(
        dest, model, template="model.safetensors-{i:05d}-of-{n:05d}.safetensors", write_files=False
    )
    (dest / "reference").mkdir()
    write_json(dest / "reference" / INDEX_NAME, reference)
    collapsed = HF_TEMPLATE.format(i=1, n=1)
    save_shard(dest / collapsed, model.tensors)
    write_json(dest / INDEX_NAME, index_doc(dict.fromkeys(model.tensors, collapsed), model.tensors))
    write_model_json(dest, model)
    count = len(set(reference["weight_map"].values()))
    write_readme(
        dest,
        "automodel-2289-collapsed",
        f"""A BF16 fine-tune of the tiny DeepSeek-V3-style model (4 decoder layers, MoE,
one MTP layer as model.layers.4.*), consolidated from DCP shards.

Seed: NeMo AutoModel PR 2289. The upstream model's index (kept as
reference/model.safetensors.index.json) spreads the tensors over {count} shards named
model.safetensors-0000i-of-0000{count}.safetensors. The consolidation read each shard's output
index from its file name by looking for a 'model' token, so every name parsed as 1 and all
{len(model.tensors)} tensors landed in {collapsed}. The output index is consistent with that
single file; the damage is the collapse itself (on a real model, one file of hundreds of GB).""",
    )


def megatron_3624(dest: Path) -> None:
    model = build_model(TinyMoeSpec(mtp_spelling="mtp"))
    extra = "mtp.layers.0.transformer_layer.self_attention.core_attention._extra_state"
    # TransformerEngine's extra state is an empty uint8 tensor; no export rule renames it, so
    # it keeps its Megatron spelling inside the otherwise HF-named MTP block.
    empty = DemoTensor("U8", np.zeros((0,), dtype=np.uint8))
    model = replace(
        model, tensors={**model.tensors, extra: empty}, mtp_names=model.mtp_names | {extra}
    )
    index = write_sharded(dest, model)
    write_json(dest / INDEX_NAME, index)
    write_model_json(dest, model)
    write_readme(
        dest,
        "megatron-3624-mtp-extra-state",
        f"""{_MODEL_TEXT}

Seed: Megatron-LM PR 3624 (MTP sharded state dict). An HF-style export of a Megatron model
whose MTP block built its state dict differently from the decoder layers: the MTP layer
(mtp.layers.0.transformer_layer.*) carries
  {extra}
(an empty U8 tensor), which no decoder layer has. The index and shards agree; the MTP
layer's key set differs from its sibling layers'.""",
    )


SAFETENSORS_DEMOS: tuple[Demo, ...] = (
    Demo("healthy-safetensors-single", "one model.safetensors, no findings", healthy_single),
    Demo("healthy-hf-sharded", "HF shards + index, no findings", healthy_sharded),
    Demo(
        "healthy-modelopt-per-layer", "per-layer shards + sidecars, no findings", healthy_per_layer
    ),
    Demo(
        "modelopt-1422-sidecar-drift",
        "last sidecar and index omit the mtp.* tensors",
        modelopt_1422,
    ),
    Demo(
        "modelopt-1631-ep-collision", "experts 64-511 missing, config.json truncated", modelopt_1631
    ),
    Demo(
        "automodel-2289-collapsed",
        "every tensor in one file; reference had 4 shards",
        automodel_2289,
    ),
    Demo("megatron-3624-mtp-extra-state", "MTP layer carries an _extra_state key", megatron_3624),
)
