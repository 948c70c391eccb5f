"""The KV cache and recurrent state of one sequence on one GPU, per pipeline stage, from
config.json (`ServingSpec`). Pure.

Per layer and token on the fullest rank of a stage, by the engines' own formulas for
grouped-query, sliding-window and latent attention and the Mamba-2 and gated-delta-net
states (docs/architecture.md, "serve/").
"""

from __future__ import annotations

from dataclasses import dataclass

from inspector._internal.checkpoint.spec import ServingSpec

__all__ = ["KvCost", "stage_kv"]

_STATE_ITEMSIZE = 2


@dataclass(frozen=True, slots=True)
class KvCost:
    """The cache of one sequence on the fullest rank of a stage: `per_token` bytes for each
    token of the context (full attention, MLA), `windows` (window, bytes per token) for
    sliding layers, which stop growing at their window, and a fixed `state` (Mamba, linear
    attention)."""

    per_token: int
    windows: tuple[tuple[int, int], ...] = ()
    state: int = 0

    def bytes_for(self, tokens: int) -> int:
        """Bytes of the cache of one sequence of `tokens` tokens."""
        windowed = sum(size * min(tokens, window) for window, size in self.windows)
        return self.per_token * tokens + windowed + self.state

    def longest(self, free: int, cap: int) -> int:
        """The most tokens (at most `cap`) whose cache fits in `free` bytes; 0 when not even
        the fixed state fits. A binary search: the cost only grows with the tokens."""
        if self.bytes_for(0) > free:
            return 0
        if self.bytes_for(cap) <= free:
            return cap
        fits, too_many = 0, cap
        while too_many - fits > 1:
            middle = (fits + too_many) // 2
            if self.bytes_for(middle) <= free:
                fits = middle
            else:
                too_many = middle
        return fits


def stage_kv(
    serving: ServingSpec,
    layers: tuple[int, ...],
    *,
    tp: int,
    itemsize: int,
    mtp_layers: int = 0,
) -> tuple[tuple[KvCost, ...] | None, str | None]:
    """The cache of each pipeline stage (`layers`: decoder layers per stage, in order), MTP
    layers on the last; or None and the config fact that is missing."""
    kinds = serving.layer_attention
    if kinds is None:
        return None, "the attention type of each layer (num_hidden_layers, layer_types)"
    needed = {k for k in kinds if k != "none"} | ({_mtp_kind(serving)} if mtp_layers else set())
    per_layer: dict[str, tuple[str, int]] = {}
    for kind in needed:
        cost, missing = _layer_cost(serving, kind, tp=tp, itemsize=itemsize)
        if missing is not None:
            return None, missing
        per_layer[kind] = cost
    costs = []
    start = 0
    for stage, count in enumerate(layers):
        stage_kinds = list(kinds[start : start + count])
        start += count
        if stage == len(layers) - 1:
            stage_kinds += [_mtp_kind(serving)] * mtp_layers
        costs.append(_sum([per_layer[k] for k in stage_kinds if k != "none"], serving))
    return tuple(costs), None


def _mtp_kind(serving: ServingSpec) -> str:
    return "mla" if serving.mla else "full"


def _layer_cost(
    serving: ServingSpec, kind: str, *, tp: int, itemsize: int
) -> tuple[tuple[str, int], str | None]:
    """(what the layer holds: "token", "window" or "state"; its bytes) on one rank."""
    s = serving
    if kind in ("full", "sliding"):
        if s.kv_heads is None or s.head_dim is None:
            return ("token", 0), "the KV heads and head size (num_key_value_heads, head_dim)"
        size = 2 * max(1, s.kv_heads // tp) * s.head_dim * itemsize
        return ("window" if kind == "sliding" else "token", size), None
    if kind == "mla":
        if s.kv_lora_rank is None or s.qk_rope_head_dim is None:
            return ("token", 0), "kv_lora_rank and qk_rope_head_dim"
        return ("token", (s.kv_lora_rank + s.qk_rope_head_dim) * itemsize), None
    if kind == "mamba":
        m = s.mamba
        if m is None:
            return ("state", 0), "the Mamba sizes (mamba_num_heads, ssm_state_size...)"
        heads = -(-m.heads // tp)
        groups = m.groups // tp if m.groups % tp == 0 else m.groups
        conv = (m.conv_kernel - 1) * (heads * m.head_dim + 2 * groups * m.state_size)
        ssm = heads * m.head_dim * m.state_size * m.ssm_itemsize
        return ("state", conv * _STATE_ITEMSIZE + ssm), None
    if kind == "linear":
        g = s.linear
        if g is None:
            return ("state", 0), "the linear-attention sizes (linear_num_key_heads...)"
        channels = 2 * g.key_heads * g.key_dim + g.value_heads * g.value_dim
        conv = (g.conv_kernel - 1) * -(-channels // tp)
        recurrent = -(-g.value_heads // tp) * g.key_dim * g.value_dim
        return ("state", (conv + recurrent) * _STATE_ITEMSIZE), None
    return ("token", 0), None


def _sum(costs: list[tuple[str, int]], serving: ServingSpec) -> KvCost:
    per_token = sum(size for what, size in costs if what == "token")
    windowed = sum(size for what, size in costs if what == "window")
    state = sum(size for what, size in costs if what == "state")
    window = serving.sliding_window
    windows = ((window, windowed),) if windowed and window is not None else ()
    return KvCost(per_token, windows, state)
