"""The full shape each DCP tensor must have, from every independent source a run leaves.
Pure: names, shapes and documents in, shapes out.

DCP's Hugging Face writer stores no full shape (it is the max over the chunks), so when the
last rank's files are gone the shapes shrink and nothing looks wrong. Each other source can
only say a tensor is at least so large, so the full shape is the element-wise max of all of
them; the sources: docs/architecture.md, "layouts/".
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from inspector._internal.checkpoint.naming import NameColumns, parse_names
from inspector._internal.checkpoint.spec import ModelSpec, config_dims
from inspector._internal.common.dtypes import FLOAT_DTYPES, QUANT_DTYPES

__all__ = ["SHAPE_RULES", "ShapeRule", "raised_shapes"]


@dataclass(frozen=True, slots=True)
class ShapeRule:
    """Tensors `<module>.weight` of `ndim` axes whose module matches `module` (after the
    layer prefix): axis k is at least the product of the config sizes `axes[k]`."""

    what: str
    module: re.Pattern[str]
    ndim: int
    axes: tuple[tuple[str, ...], ...]


def _rule(what: str, module: str, *axes: tuple[str, ...]) -> ShapeRule:
    return ShapeRule(what, re.compile(module), len(axes), axes)


_V, _H = ("vocab_size",), ("hidden_size",)
_Q = ("num_attention_heads", "head_dim")
_KV = ("num_key_value_heads", "head_dim")
# The experts per MoE layer (`ModelSpec.experts_per_layer`), for routers and fused experts.
_EXPERTS = "experts"

SHAPE_RULES: tuple[ShapeRule, ...] = (
    _rule(
        "input embedding", r"(?:^|\.)(?:embed_tokens|word_embeddings|wte|tok_embeddings)$", _V, _H
    ),
    _rule("output head", r"(?:^|\.)(?:lm_head|output_layer|embed_out)$", _V, _H),
    # Block and final norms only: `mixer.norm` (Mamba) or `q_a_layernorm` (MLA) are not.
    _rule(
        "decoder norm",
        r"^(?:(?:model|language_model|backbone)\.)*(?:input_layernorm|post_attention_layernorm"
        r"|pre_feedforward_layernorm|post_feedforward_layernorm|norm|final_layernorm|norm_f)$",
        _H,
    ),
    _rule("query/key norm", r"(?:^|\.)self_attn\.[qk]_norm$", ("head_dim",)),
    _rule("query projection", r"(?:^|\.)self_attn\.q_proj$", _Q, _H),
    _rule("key/value projection", r"(?:^|\.)self_attn\.[kv]_proj$", _KV, _H),
    _rule("output projection", r"(?:^|\.)self_attn\.o_proj$", _H, _Q),
)
_FLOATS = FLOAT_DTYPES | (QUANT_DTYPES & {"F8_E4M3", "F8_E5M2"})
_INT64 = 1 << 62


def raised_shapes(
    names: Sequence[str],
    full: Sequence[tuple[int, ...]],
    dtypes: Sequence[str],
    *,
    config: Mapping[str, object] | None,
    spec: ModelSpec,
    reference: Mapping[str, tuple[int, ...]] | None = None,
    reference_label: str = "the reference checkpoint",
) -> tuple[list[tuple[int, ...]], dict[str, str]]:
    """(full shape of each tensor, {tensor: the source that made it larger than its chunks}).

    `full` holds the shapes the chunks imply; `reference` the shapes of the reference
    checkpoint's shard headers by tensor name."""
    out = [tuple(s) for s in full]
    why: dict[str, str] = {}

    def lift(i: int, floor: Sequence[int], source: str) -> None:
        if len(floor) != len(out[i]):
            return
        lifted = tuple(max(a, b) for a, b in zip(out[i], floor, strict=True))
        if lifted != out[i]:
            out[i] = lifted
            why.setdefault(names[i], source)

    # 1. The reference checkpoint's headers.
    for i, name in enumerate(names):
        shape = reference.get(name) if reference else None
        if shape is not None:
            lift(i, shape, f"{reference_label} stores it as {list(shape)}")
    parsed = parse_names(list(names))
    floating = np.fromiter((d in _FLOATS for d in dtypes), dtype=bool, count=len(names))
    # 2. config.json.
    dims = config_dims(config)
    if spec.experts_per_layer is not None:
        dims[_EXPERTS] = spec.experts_per_layer
    for i, floor, source in _config_floors(parsed, out, floating, dims):
        lift(i, floor, source)
    # 3. Siblings: the hidden size from the input embedding, then the experts of a layer.
    if "hidden_size" not in dims:
        width = _embedding_width(parsed, out, floating)
        if width:
            norms = dims | {"hidden_size": width}
            for i, floor, _ in _config_floors(parsed, out, floating, norms, only="decoder norm"):
                lift(i, floor, f"the input embedding is {width} wide")
    for i, floor, source in _expert_groups(parsed, out):
        lift(i, floor, source)
    return out, why


def _config_floors(
    parsed: NameColumns,
    shapes: list[tuple[int, ...]],
    floating: np.ndarray,
    dims: dict[str, int],
    *,
    only: str | None = None,
) -> list[tuple[int, tuple[int, ...], str]]:
    """(tensor, least shape, why) for every tensor a rule or the expert count applies to."""
    out: list[tuple[int, tuple[int, ...], str]] = []
    modules = parsed.module.categories
    is_weight = np.asarray(parsed.param == "weight", dtype=bool) & floating
    for rule in SHAPE_RULES:
        if only is not None and rule.what != only:
            continue
        if not all(k in dims for axis in rule.axes for k in axis):
            continue
        matched = [c for c, m in enumerate(modules) if rule.module.search(str(m))]
        rows = np.flatnonzero(np.isin(parsed.module.codes, matched) & is_weight)
        floor = tuple(int(np.prod([dims[k] for k in axis])) for axis in rule.axes)
        said = ", ".join(f"{k} {dims[k]}" for k in dict.fromkeys(k for a in rule.axes for k in a))
        for i in rows.tolist():
            if len(shapes[i]) == rule.ndim:
                out.append((i, floor, f"config.json says {said} ({rule.what})"))
    experts = dims.get(_EXPERTS)
    if experts and only is None:
        kind = np.asarray(parsed.kind)
        router = (kind == "router") & is_weight & (parsed.layer >= 0)
        fused = parsed.fused & (parsed.layer >= 0) & floating
        said = f"config.json says {experts} experts"
        for i in np.flatnonzero(router | fused).tolist():
            if shapes[i]:
                floor = (experts,) + (0,) * (len(shapes[i]) - 1)
                out.append((i, floor, said))
    return out


def _embedding_width(
    parsed: NameColumns, shapes: list[tuple[int, ...]], floating: np.ndarray
) -> int:
    rule = SHAPE_RULES[0]
    modules = parsed.module.categories
    matched = [c for c, m in enumerate(modules) if rule.module.search(str(m))]
    rows = np.flatnonzero(np.isin(parsed.module.codes, matched) & floating)
    widths = [shapes[i][1] for i in rows.tolist() if len(shapes[i]) == 2]
    return max(widths, default=0)


def _expert_groups(
    parsed: NameColumns, shapes: list[tuple[int, ...]]
) -> list[tuple[int, tuple[int, ...], str]]:
    """(tensor, the element-wise max shape of its siblings, which layer) for every numbered
    expert tensor smaller than a sibling: the experts of one layer (or MTP block) hold the
    same projections with the same shapes. Grouped with numpy: 300,000 experts are common."""
    rows = np.flatnonzero((parsed.expert >= 0) & (parsed.layer >= 0))
    # Sizes past int64 (a hostile header) are not compared: each stays its own.
    rows = rows[[max(shapes[i], default=0) < _INT64 for i in rows.tolist()]]
    if not len(rows):
        return []
    ndim = np.fromiter((len(shapes[i]) for i in rows.tolist()), dtype=np.int64, count=len(rows))
    n_mod = max(len(parsed.module.categories), 1)
    n_par = max(len(parsed.param.categories), 1)
    key = parsed.layer[rows] * 2 + parsed.mtp[rows]
    key = (key * n_mod + parsed.module.codes[rows]) * n_par + parsed.param.codes[rows]
    out: list[tuple[int, tuple[int, ...], str]] = []
    for d in np.unique(ndim).tolist():
        if d == 0:
            continue
        members = rows[ndim == d]
        dims = np.asarray([shapes[i] for i in members.tolist()], dtype=np.int64)
        _, inverse = np.unique(key[ndim == d], return_inverse=True)
        inverse = inverse.reshape(-1)
        floor = np.zeros((int(inverse.max()) + 1, d), dtype=np.int64)
        np.maximum.at(floor, inverse, dims)
        short = np.flatnonzero((dims < floor[inverse]).any(axis=1))
        for k in short.tolist():
            i = int(members[k])
            where = f"MTP block {parsed.layer[i]}" if parsed.mtp[i] else f"layer {parsed.layer[i]}"
            wanted = tuple(floor[inverse[k]].tolist())
            out.append((i, wanted, f"the sibling experts of {where} are {list(wanted)}"))
    return out
