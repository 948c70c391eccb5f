"""Weight bytes per GPU under a parallel plan, from the stored tensors (names, dtypes,
shapes, bytes), placed the way vLLM and SGLang place them. Pure, column-wise.

Each tensor gets a role from its kind and projection name (`checkpoint/naming`) and is
split, replicated or staged as the engines' own layer classes do, because the fullest GPU
decides whether a plan fits. A split that does not divide is still counted (the fullest
rank, rounded up): such a plan carries the finding that says the engines refuse it. The
rules: docs/architecture.md, "serve/".
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from inspector._internal.checkpoint.quant_config import MXFP4_BLOCK, SplitBlock
from inspector._internal.checkpoint.scanned import ScannedCheckpoint
from inspector._internal.checkpoint.spec import MAX_LAYERS, ServingSpec

__all__ = ["VOCAB_PADDING", "StageBytes", "WeightLayout", "pipeline_layers", "weight_layout"]

# vLLM's and SGLang's `DEFAULT_VOCAB_PADDING_SIZE`.
VOCAB_PADDING = 64

# Roles (how a tensor divides over the TP ranks).
_WHOLE, _COLUMN, _ROW, _KV, _QKV, _VOCAB, _SPLIT = range(7)
# Where a tensor goes along the pipeline.
_DECODER, _FIRST, _LAST, _MTP, _STACKED = range(5)

# Roles split over the ranks by their units.
_SPLITS = np.zeros(_SPLIT + 1, dtype=bool)
_SPLITS[[_COLUMN, _ROW, _KV, _SPLIT]] = True
# Projection names (the module's last part) by role.
_KV_NAMES = frozenset({"k_proj", "v_proj", "wk", "wv"})
_QKV_NAMES = frozenset({"qkv_proj", "query_key_value", "c_attn", "wqkv", "linear_qkv", "W_pack"})
_COLUMN_NAMES = frozenset(
    {
        "q_proj",
        "q_b_proj",
        "kv_b_proj",
        "wq",
        "gate_proj",
        "up_proj",
        "gate_up_proj",
        "w1",
        "w3",
        "w13",
        "fc1",
        "c_fc",
        "linear_fc1",
        "dense_h_to_4h",
        "in_proj",
    }
)
_ROW_NAMES = frozenset(
    {
        "o_proj",
        "wo",
        "dense",
        "linear_proj",
        "down_proj",
        "w2",
        "fc2",
        "c_proj",
        "linear_fc2",
        "dense_4h_to_h",
        "out_proj",
    }
)
# Parameters of the attention module itself that split by heads (gpt-oss `sinks`).
_HEAD_PARAMS = frozenset({"sinks"})


@dataclass(frozen=True)
class WeightLayout:
    """The tensors of a checkpoint as placement needs them, computed once per checkpoint:
    per row its bytes, role, the units its split dimension holds (heads, intermediate rows,
    MXFP4 blocks; 0 when unknown: an even split), whether EP splits it, and where it goes."""

    nbytes: np.ndarray
    role: np.ndarray
    units: np.ndarray
    vocab_rows: np.ndarray
    routed: np.ndarray
    experts: np.ndarray
    place: np.ndarray
    layer: np.ndarray
    num_layers: int
    heads: int
    kv_heads: int
    tied: bool
    # MTP layers stored (distinct layer numbers of the MTP tensors).
    mtp_layers: int = 0

    @property
    def mtp(self) -> np.ndarray:
        return self.place == _MTP


@dataclass(frozen=True)
class StageBytes:
    """Weight bytes of the fullest rank of each pipeline stage, and of the MTP layers on the
    last stage."""

    per_stage: tuple[int, ...]
    mtp: int

    @property
    def largest(self) -> int:
        return max(self.per_stage, default=0)


def pipeline_layers(num_layers: int, pp: int) -> tuple[int, ...]:
    """Decoder layers per stage as vLLM's `get_pp_indices` splits them: evenly, the
    remainder one each to the stages before the last (which holds the output head). SGLang's
    `get_pp_indices` gives the remainder to the last stages instead."""
    parts = [num_layers // pp] * pp
    for i in range(2, num_layers % pp + 2):
        parts[-i] += 1
    return tuple(parts)


def weight_layout(
    scanned: ScannedCheckpoint, serving: ServingSpec, block: SplitBlock | None
) -> WeightLayout:
    """The placement facts of every stored tensor (each name once)."""
    t = scanned.tensors
    names = t["name"].astype(str).tolist()
    if len(set(names)) < len(names):
        t = t.drop_duplicates("name")
    n = len(t)
    # Roles are decided once per distinct (kind, module, param): a few dozen, not a row each.
    columns = [pd.Categorical(t[c]) for c in ("kind", "module", "param")]
    key = np.zeros(n, dtype=np.int64)
    for column in columns:
        key = key * (len(column.categories) + 1) + column.codes.astype(np.int64) + 1
    distinct, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    role_of = np.array(
        [_role(*(str(c[i]) for c in columns)) for i in first.tolist()], dtype=np.int8
    )
    role = role_of[inverse.reshape(-1)] if len(distinct) else np.zeros(0, dtype=np.int8)
    kinds = columns[0]
    labels = [str(c) for c in kinds.categories]

    def kind_is(*names: str) -> np.ndarray:
        wanted = np.zeros(len(labels) + 1, dtype=bool)
        wanted[[i for i, label in enumerate(labels) if label in names]] = True
        return wanted[kinds.codes]  # code -1 (no kind) reads the last entry, False

    routed = kind_is("expert")
    units = np.zeros(n)
    heads, kv_heads = serving.heads or 0, serving.kv_heads or 0
    attention = kind_is("attention")
    split_role = np.zeros(_SPLIT + 1, dtype=bool)
    split_role[[_COLUMN, _ROW, _SPLIT]] = True
    units[attention & split_role[role]] = heads
    units[attention & (role == _KV)] = kv_heads
    units[kind_is("dense_mlp")] = serving.intermediate_size or 0
    units[kind_is("shared_expert")] = serving.shared_intermediate_size or 0
    units[routed] = _moe_units(serving, block)
    if serving.mamba is not None:
        units[kind_is("mamba")] = serving.mamba.heads
    units[role == _WHOLE] = 0

    vocab_rows = np.zeros(n)
    shapes = t["shape"].to_numpy(dtype=object)
    for i in np.flatnonzero(role == _VOCAB).tolist():
        shape = shapes[i]
        vocab_rows[i] = min(shape[0], 1 << 40) if isinstance(shape, tuple) and shape else 0

    layer = t["layer"].to_numpy(dtype="float64", na_value=np.nan)
    is_mtp = t["is_mtp"].to_numpy(dtype=bool)
    stacked = t["stacked"].to_numpy(dtype=bool)
    decoder = ~np.isnan(layer) & ~is_mtp
    num_layers = scanned.spec.num_layers
    if num_layers is None:
        # No believable count in config.json: the stored layers, within a real model's.
        stored = int(np.nanmax(layer[decoder])) + 1 if decoder.any() else 0
        num_layers = min(stored, MAX_LAYERS)
    place = np.full(n, _FIRST, dtype=np.int8)
    place[kind_is("output_head", "norm")] = _LAST
    place[decoder] = _DECODER
    place[stacked & ~decoder] = _STACKED if num_layers else _FIRST
    place[is_mtp] = _MTP

    tied = serving.tie_word_embeddings and not kind_is("output_head").any()
    mtp_numbers = layer[is_mtp]
    mtp_layers = len(np.unique(mtp_numbers[~np.isnan(mtp_numbers)])) or int(is_mtp.any())
    return WeightLayout(
        nbytes=t["nbytes"].to_numpy(dtype="float64"),
        role=role,
        units=units,
        vocab_rows=vocab_rows,
        routed=routed,
        experts=_experts(t, routed, layer, scanned.spec.experts_per_layer),
        place=place,
        layer=np.where(decoder, np.nan_to_num(layer), -1).astype(np.int64),
        num_layers=num_layers,
        heads=heads,
        kv_heads=kv_heads,
        tied=tied,
        mtp_layers=mtp_layers,
    )


def stage_bytes(layout: WeightLayout, *, tp: int, ep: int, pp: int) -> StageBytes:
    """Weight bytes of the fullest rank of each stage under TP x EP x PP (EP 1 or dividing
    TP: the experts' own TP is TP / EP)."""
    num, den = _shares(layout, tp=tp, ep=ep)
    # A rank holds whole bytes: each tensor's share is rounded up on its own.
    per_rank = np.ceil(layout.nbytes * num / den)
    parts = pipeline_layers(layout.num_layers, pp)
    stage_of_layer = np.repeat(np.arange(pp), parts)
    stage = np.zeros(len(per_rank), dtype=np.int64)
    decoder = layout.place == _DECODER
    if len(stage_of_layer):
        stage[decoder] = stage_of_layer[np.clip(layout.layer[decoder], 0, len(stage_of_layer) - 1)]
    stage[(layout.place == _LAST) | (layout.place == _MTP)] = pp - 1
    stacked = layout.place == _STACKED
    totals = np.bincount(stage[~stacked], weights=per_rank[~stacked], minlength=pp)
    if stacked.any():
        totals += per_rank[stacked].sum() * np.asarray(parts, dtype=float) / layout.num_layers
    if layout.tied and pp > 1:
        # The last stage builds its own output head and loads the embedding into it.
        totals[-1] += per_rank[(layout.role == _VOCAB) & (layout.place == _FIRST)].sum()
    mtp = float(per_rank[layout.mtp].sum())
    return StageBytes(tuple(_ceil(x) for x in totals), _ceil(mtp))


def _shares(layout: WeightLayout, *, tp: int, ep: int) -> tuple[np.ndarray, np.ndarray]:
    """Each tensor's fraction held by the fullest rank, as (numerator, denominator): bytes
    times an integer over an integer stay exact in float64 where a rounded fraction would
    not (12 of 90 MXFP4 blocks)."""
    role, units = layout.role, layout.units
    degree = np.where(layout.routed & (ep > 1), max(tp // ep, 1), tp).astype(float)
    num, den = np.ones(len(role)), np.ones(len(role))
    split = _SPLITS[role]
    known = split & (units > 0)
    num[known] = np.ceil(units[known] / degree[known])
    den[known] = units[known]
    even = split & (units <= 0)
    den[even] = degree[even]
    qkv = role == _QKV
    if qkv.any():
        h, kv = layout.heads, layout.kv_heads
        if h and kv:
            num[qkv], den[qkv] = -(-h // tp) + 2 * -(-kv // tp), h + 2 * kv
        else:
            den[qkv] = tp
    vocab = (role == _VOCAB) & (layout.vocab_rows > 0)
    rows = layout.vocab_rows[vocab]
    num[vocab] = np.ceil(np.ceil(rows / VOCAB_PADDING) * VOCAB_PADDING / tp)
    den[vocab] = rows
    if ep > 1:
        routed = layout.routed & (layout.experts > 0)
        experts = layout.experts[routed]
        num[routed] *= np.ceil(experts / ep)
        den[routed] *= experts
    return num, den


def _role(kind: str, module: str, param: str) -> int:
    """How one kind of tensor divides over the TP ranks (see the module docstring)."""
    if kind in ("embedding", "output_head"):
        return _VOCAB
    if kind == "mtp":
        return _VOCAB if module.endswith(("embed_tokens", "head")) else _WHOLE
    if kind in ("norm", "router", "other"):
        return _WHOLE
    if kind == "mamba":
        return _SPLIT
    last = module.rpartition(".")[2]
    if kind == "attention":
        if param in _HEAD_PARAMS:
            return _SPLIT
        if last in _KV_NAMES:
            return _KV
        if last in _QKV_NAMES:
            return _QKV
    if last in _COLUMN_NAMES:
        return _COLUMN
    if last in _ROW_NAMES:
        # A row-parallel layer adds its bias once, after the reduction: every rank holds it.
        return _WHOLE if param == "bias" else _ROW
    return _WHOLE


def _moe_units(serving: ServingSpec, block: SplitBlock | None) -> int:
    """The units an expert's intermediate dimension splits in: MXFP4 blocks of 32 values,
    else rows (0: unknown)."""
    size = serving.moe_intermediate_size or serving.intermediate_size or 0
    if block is not None and block.padded and size % MXFP4_BLOCK == 0:
        return size // MXFP4_BLOCK
    return size


def _experts(
    t: pd.DataFrame, routed: np.ndarray, layer: np.ndarray, declared: int | None
) -> np.ndarray:
    """Routed experts of each expert tensor's layer: config.json's count, else the experts
    stored in that layer (a fused tensor's leading axis)."""
    out = np.zeros(len(routed))
    if not routed.any():
        return out
    if declared is not None:
        out[routed] = declared
        return out
    sizes = t["expert"].to_numpy(dtype="float64", na_value=0.0)[routed] + 1
    # A fused tensor holds all experts of its layer on its leading axis.
    fused = np.flatnonzero(t["fused"].to_numpy(dtype=bool)[routed])
    shapes = t["shape"].to_numpy(dtype=object)[routed]
    for i in fused.tolist():
        shape = shapes[i]
        sizes[i] = min(shape[0], 1 << 40) if isinstance(shape, tuple) and shape else 1
    frame = pd.DataFrame({"layer": np.nan_to_num(layer[routed], nan=-1.0), "size": sizes})
    per_layer = frame.groupby("layer")["size"].transform("max")
    out[routed] = per_layer.to_numpy(dtype="float64")
    return out


def _ceil(x: float) -> int:
    return int(np.ceil(x)) if np.isfinite(x) else 0
