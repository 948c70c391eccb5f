"""compressed-tensors' target and ignore entries, resolved against module names: the one
matcher the compressed-tensors check and the parameter count share.

An entry is `re:<regex>` (`re.match` on the module name: anchored at the start only, as
`compressed_tensors.utils.match._match_name`; compiled by `inspector._internal.formats.patterns`,
which never backtracks), an exact module name, or a class name. Class names are resolved from
the tensors: a `Linear` is a module with a 2-D `weight` (or the packed tensors of a quantized
one) that is not an embedding (its last component starts with `embed`, or is `wte`, `wpe`,
`word_embeddings`). Other class names cannot be resolved from names and match nothing."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from inspector._internal.formats.patterns import (
    MAX_PATTERNS,
    PatternBudget,
    Patterns,
    compile_patterns,
)

__all__ = [
    "EMBEDDING",
    "TargetMatcher",
    "group_targets",
    "is_linear",
    "strings",
    "target_count",
    "too_many_targets",
]

EMBEDDING = re.compile(r"(^|\.)(embed\w*|wte|wpe|word_embeddings)$")


def is_linear(module: str, params: Mapping[str, tuple[str, tuple[int, ...]]]) -> bool:
    """Whether a module whose tensors are `params` ({param: (dtype, shape)}) is a Linear."""
    if EMBEDDING.search(module):
        return False
    if "weight_packed" in params:
        return True
    weight = params.get("weight")
    return weight is not None and len(weight[1]) == 2


class TargetMatcher:
    """One list of targets or ignore entries; `matcher(module, linear)` is True, False, or
    None when a refused pattern could decide (`patterns.reasons()` says why)."""

    def __init__(self, entries: Sequence[str], *, budget: PatternBudget | None = None) -> None:
        self.names = {e for e in entries if not e.startswith("re:") and e != "Linear"}
        regexes = [e[3:] for e in entries if e.startswith("re:")]
        self.patterns: Patterns = compile_patterns(regexes, syntax="regex", budget=budget)
        self.linear = "Linear" in entries

    def __call__(self, module: str, linear: bool) -> bool | None:
        if module in self.names or (self.linear and linear):
            return True
        return self.patterns.match(module)


def strings(value: Any) -> list[str]:
    """The names of a `targets` / `ignore` value (one string or a list)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [v for v in value if isinstance(v, str)]
    return []


def target_count(section: Mapping[str, Any]) -> int:
    """Config groups, their targets and the ignore entries of a `quantization_config`: each
    group is one matcher run over every module, each entry part of one."""
    groups = section.get("config_groups")
    groups = (
        [g for g in groups.values() if isinstance(g, Mapping)]
        if isinstance(groups, Mapping)
        else []
    )
    return (
        len(groups)
        + sum(len(strings(g.get("targets"))) for g in groups)
        + len(strings(section.get("ignore")))
    )


def too_many_targets(section: Mapping[str, Any]) -> bool:
    """More groups and entries than any real config (`MAX_PATTERNS`): not matched at all."""
    return target_count(section) > MAX_PATTERNS


def group_targets(
    section: Mapping[str, Any], *, budget: PatternBudget | None = None
) -> list[tuple[str, TargetMatcher, Mapping[str, Any]]]:
    """(group name, its targets, the group) of a `quantization_config`, in order."""
    groups = section.get("config_groups")
    out = []
    for name, group in groups.items() if isinstance(groups, Mapping) else ():
        if isinstance(group, Mapping):
            matcher = TargetMatcher(strings(group.get("targets")), budget=budget)
            out.append((str(name), matcher, group))
    return out
