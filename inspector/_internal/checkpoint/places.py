"""Tensor names summarised by where they sit (layer, expert, MTP layer), for messages: the
phrasing that needs the naming rules, so it lives above them rather than in `findings/`."""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Mapping, Sequence

from inspector._internal.checkpoint.naming import layer_expert_numbers, parse_names
from inspector._internal.common.display import legible
from inspector._internal.common.text import examples, fold_ranges, layers_text, plural

__all__ = ["describe_names", "places_text"]


def places_text(
    names: Sequence[str],
    *,
    limit: int = 20,
    numbers: Mapping[str, tuple[int, bool]] | None = None,
) -> list[str]:
    """Tensor names summarised by where they are, one line per group, at most `limit` lines:
    'layer 40: experts 17-19 (36 tensors)', 'layers 3-5: 2 tensors each (self_attn.q_norm.weight,
    self_attn.k_norm.weight)', 'MTP layer 4: 42 tensors', then the names outside the layers.
    `numbers`: name -> (layer, is MTP) as the tensors table numbers it (`findings/words.py`
    on the one numbering); a name it lacks is numbered from the name alone (`mtp.layers.0.*`
    is then MTP layer 0)."""
    parsed = parse_names(list(names))
    numbered = numbers or {}
    experts: dict[tuple[bool, int], set[int]] = defaultdict(set)
    expert_tensors: dict[tuple[bool, int], int] = defaultdict(int)
    keys: dict[tuple[bool, int], list[str]] = defaultdict(list)
    outside: list[str] = []
    rows = zip(
        names, parsed.layer.tolist(), parsed.expert.tolist(), parsed.mtp.tolist(), strict=True
    )
    for name, own, expert, own_mtp in rows:
        layer, is_mtp = numbered.get(name, (int(own), bool(own_mtp)))
        where = (is_mtp, int(layer))
        if layer < 0:
            outside.append(name)
        elif expert >= 0:
            experts[where].add(int(expert))
            expert_tensors[where] += 1
        else:
            keys[where].append(_in_layer(name, int(own)))
    lines: list[str] = []
    # Layers that lost the same experts, or hold the same other keys, share one line.
    by_experts: dict[tuple[bool, frozenset[int], int], list[int]] = defaultdict(list)
    for (is_mtp, layer), ids in experts.items():
        per = expert_tensors[(is_mtp, layer)] // max(len(ids), 1)
        by_experts[(is_mtp, frozenset(ids), per)].append(layer)
    for (is_mtp, lost, per), layers in sorted(by_experts.items(), key=lambda kv: min(kv[1])):
        n = per * len(lost) * len(layers)
        each = f", {per:,} per expert" if len(lost) * len(layers) > 1 else ""
        lines.append(
            f"{_layer_word(is_mtp, layers)}: {layers_text(lost, noun='expert')} "
            f"({plural(n, 'tensor')}{each})"
        )
    by_keys: dict[tuple[bool, tuple[str, ...]], list[int]] = defaultdict(list)
    for (is_mtp, layer), found in keys.items():
        by_keys[(is_mtp, tuple(sorted(found)))].append(layer)
    for (is_mtp, same), layers in sorted(by_keys.items(), key=lambda kv: min(kv[1])):
        each = " each" if len(layers) > 1 else ""
        lines.append(
            f"{_layer_word(is_mtp, layers)}: {plural(len(same), 'tensor')}{each} "
            f"({examples(list(same))})"
        )
    # A name outside the layers is shown as a name (bounded at `NAME_LIMIT`, escaped), not
    # cut only at a message's 2,000 characters where the line is printed.
    lines += map(legible, sorted(outside))
    if len(lines) > limit:
        lines = [*lines[:limit], f"... {plural(len(lines) - limit, 'more line')}"]
    return lines


def _layer_word(mtp: bool, layers: list[int]) -> str:
    return ("MTP " if mtp else "") + layers_text(layers)


def _in_layer(name: str, layer: int) -> str:
    """The part of `name` after its layer number ('self_attn.q_proj.weight')."""
    marker = f".{layer}."
    at = name.find(marker)
    return name[at + len(marker) :] if at >= 0 else name


def describe_names(names: Sequence[str]) -> str:
    """'layers 0-63; 3 outside decoder layers; e.g. a, b, c and 997 more': a long name
    list in one line."""
    numbers = layer_expert_numbers(names)
    layers = {layer for layer, _ in numbers if layer is not None}
    other = len(names) - sum(1 for layer, _ in numbers if layer is not None)
    parts = []
    if layers:
        parts.append(f"layers {fold_ranges(layers)}")
    if other and layers:
        parts.append(f"{other:,} outside decoder layers")
    first = heapq.nsmallest(3, names)
    more = f" and {len(names) - 3:,} more" if len(names) > 3 else ""
    parts.append(f"e.g. {', '.join(map(legible, first))}{more}")
    return "; ".join(parts)
