"""Read llm-compressor's `recipe.yaml` (the recipe a compressed-tensors checkpoint was made
with) into plain data, bounded: at most `RECIPE_CAP` bytes, YAML's safe loader (no tags that
build objects), and only what the quantization checks use is kept: each
`QuantizationModifier`'s `targets`, `ignore`, `scheme` and `config_groups`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from inspector._internal.common.text import short_repr

__all__ = ["RECIPE_CAP", "QuantModifier", "parse_recipe"]

RECIPE_CAP = 4_000_000
# How deep the modifiers may sit (stage -> modifiers group -> modifier) and how many there may be.
_MAX_DEPTH = 6
_MAX_MODIFIERS = 1_000
# Mappings looked into per level: YAML aliases can make a small file a wide tree.
_MAX_NODES = 10_000


@dataclass(frozen=True, slots=True)
class QuantModifier:
    """One `QuantizationModifier`: where it sits (`stage/group`), its targets and ignore list,
    its preset scheme (`W4A16`...) or its groups' targets."""

    where: str
    targets: tuple[str, ...]
    ignore: tuple[str, ...]
    scheme: str | None
    groups: Mapping[str, tuple[str, ...]]


def _strings(value: Any) -> tuple[str, ...] | None:
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return tuple(value)
    return None


def parse_recipe(data: bytes) -> tuple[tuple[QuantModifier, ...], str | None]:
    """(modifiers, None) or ((), why the recipe cannot be read)."""
    # Here, not at the top: every safetensors scan imports this module, few read a recipe.
    import yaml

    try:
        doc = yaml.safe_load(data)
    except (yaml.YAMLError, UnicodeDecodeError, RecursionError) as exc:
        return (), f"is not valid YAML ({short_repr(str(exc), limit=200)})"
    found: list[QuantModifier] = []
    level: list[tuple[str, Any]] = [("", doc)]
    for _ in range(_MAX_DEPTH):
        below: list[tuple[str, Any]] = []
        for where, node in level:
            if not isinstance(node, dict):
                continue
            for key, value in list(node.items())[:_MAX_MODIFIERS]:
                if key == "QuantizationModifier" and isinstance(value, dict):
                    modifier = _modifier(where, value)
                    if modifier is None:
                        return (), (
                            f"has a QuantizationModifier at {where or 'the top'} "
                            "whose targets, ignore or config_groups are not lists of names"
                        )
                    found.append(modifier)
                elif isinstance(value, dict) and len(below) < _MAX_NODES:
                    below.append((f"{where}/{key}".strip("/"), value))
        level = below
    return tuple(found), None


def _modifier(where: str, value: dict[Any, Any]) -> QuantModifier | None:
    targets = _strings(value.get("targets", []))
    ignore = _strings(value.get("ignore", []))
    scheme = value.get("scheme")
    groups: dict[str, tuple[str, ...]] = {}
    raw_groups = value.get("config_groups")
    if isinstance(raw_groups, dict):
        for name, group in raw_groups.items():
            group_targets = _strings(group.get("targets")) if isinstance(group, dict) else None
            if group_targets is None:
                return None
            groups[str(name)] = group_targets
    elif raw_groups is not None:
        return None
    if targets is None or ignore is None:
        return None
    return QuantModifier(
        where, targets, ignore, scheme if isinstance(scheme, str) else None, groups
    )
