"""The words shown to people: one vocabulary and one way to count things in text.

- a **finding** is one coded observation (`inspector._internal.findings.finding.Finding`, with a
  code from
  `inspector._internal.findings.codes` and a severity);
- an **issue** is the findings one root cause explains, with its impact and the one action
  that fixes it (`inspector._internal.findings.issues.Problem`; the Overview, `check`, the reports
  list them);
- severities are **error**, **warning** and **info**;
- `scan` reads headers and JSON and runs no check: what it could not read are **read
  errors**, never "problems" (`check` gives the findings).

Every count in a sentence goes through `plural` ("1 finding", "2 errors", "3 info"), and
every list of layers through `layers_text` ("layer 40", "layers 0-39, 41-97"), and a list of
tensor names through `places_text` ("layer 40: experts 17-19 (36 tensors)"), so the CLI, the
summaries, the reports and the dashboard say the same thing the same way.

One layer numbering, the tables' (`inspector._internal.checkpoint.tables`): a decoder layer
is the number its names give (`model.layers.3.*` is layer 3); MTP layers follow the decoder
layers, as DeepSeek-V3 stores its MTP layer (`model.layers.61.*` after layers 0-60) and
Model-Optimizer numbers it: with 4 decoder layers, `mtp.layers.0.*` is "MTP layer 4",
whichever spelling the checkpoint uses. Text says "MTP layer" for them (`layer_name`,
`layers_text(..., mtp=...)`) and never counts them among the decoder's MoE layers.
"""

from __future__ import annotations

import heapq
import shlex
from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence

from inspector._internal.checkpoint.naming import layer_expert_numbers, parse_names
from inspector._internal.common.display import legible
from inspector._internal.findings.finding import Finding, examples, fold_ranges

__all__ = [
    "FINDING",
    "ISSUE",
    "READ_ERROR",
    "SEVERITY_ORDER",
    "cut_at_word",
    "layer_name",
    "layers_text",
    "places_text",
    "plural",
    "refusal_digest",
    "severity_counts",
    "shell_word",
]

FINDING = "finding"
ISSUE = "issue"
READ_ERROR = "read error"
SEVERITY_ORDER = ("error", "warning", "info")

# Nouns whose plural is not the noun + "s" ("info" is a mass noun: "3 info").
_IRREGULAR = {"info": "info", "index": "indices", "entry": "entries", "mismatch": "mismatches"}


def plural(n: int, noun: str, *, many: str | None = None, number: bool = True) -> str:
    """'1 finding', '2 findings', '1,234 errors', '3 info'; `many` overrides the plural,
    `number=False` gives the noun alone ('finding' / 'findings')."""
    if n == 1:
        word = noun
    else:
        last = noun.rsplit(" ", 1)
        head = f"{last[0]} " if len(last) == 2 else ""
        tail = last[-1]
        word = many or f"{head}{_IRREGULAR.get(tail, tail + 's')}"
    return f"{n:,} {word}" if number else word


def severity_counts(counts: Mapping[str, int], *, zeros: bool = False) -> str:
    """'2 errors, 1 warning' (worst first; severities with none left out unless `zeros`)."""
    parts = [
        plural(int(counts.get(s, 0)), s) for s in SEVERITY_ORDER if zeros or int(counts.get(s, 0))
    ]
    return ", ".join(parts)


def layers_text(
    layers: Iterable[int], *, limit: int = 12, noun: str = "layer", mtp: Collection[int] = ()
) -> str:
    """'layer 40' or 'layers 0-39, 41-97' (ranges folded as `check` folds them); `noun`
    names other numbered things ('experts 17-19'). Layers in `mtp` are MTP layers, said
    after the decoder's: 'layers 1-3 and MTP layer 4'."""
    ordered = sorted(set(layers))
    extra = [n for n in ordered if n in mtp] if mtp else []
    decoder = [n for n in ordered if n not in mtp] if mtp else ordered
    parts = [
        f"{head}{plural(len(numbers), noun, number=False)} {fold_ranges(numbers, limit=limit)}"
        for head, numbers in (("", decoder), ("MTP ", extra))
        if numbers or (not ordered and not head)
    ]
    return " and ".join(parts)


def layer_name(layer: int, *, mtp: bool = False) -> str:
    """'layer 3', or 'MTP layer 4' for an MTP layer (numbered after the decoder layers)."""
    return f"{'MTP ' if mtp else ''}layer {layer}"


def cut_at_word(text: str, limit: int) -> str:
    """`text` if it fits in `limit` characters, else cut at the last space that leaves room
    for the note of how much was left out: 'iter_0000100/common.pt says the rerun state
    machine is active ... (74 more characters)'. Never mid-word; for a sentence a person
    reads whole elsewhere (an issue title whose finding holds the rest)."""
    if len(text) <= limit:
        return text
    room = max(limit - 30, 1)
    cut = text.rfind(" ", 0, room)
    cut = cut if cut > 0 else room
    head = text[:cut].rstrip(" ,;:(")
    return f"{head} ... ({len(text) - len(head):,} more characters)"


def shell_word(text: str) -> str:
    """A path as one shell word in a command people copy (quoted only when it needs it)."""
    return shlex.quote(text)


def places_text(
    names: Sequence[str],
    *,
    limit: int = 20,
    numbers: Mapping[str, tuple[int, bool]] | None = None,
) -> list[str]:
    """Tensor names summarised by where they are, one line per group, at most `limit` lines:
    'layer 40: experts 17-19 (36 tensors)', 'layers 3-5: 2 tensors each (self_attn.q_norm.weight,
    self_attn.k_norm.weight)', 'MTP layer 4: 42 tensors', then the names outside the layers.
    `numbers`: name -> (layer, is MTP) as the tensors table numbers it (the module docstring);
    a name it lacks is numbered from the name alone (`mtp.layers.0.*` is then MTP layer 0)."""
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
    lines += sorted(outside)
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


# A refusal shows this many codes, each with its count and its first message cut to this length.
REFUSAL_CODES = 3
REFUSAL_MESSAGE = 400


def refusal_digest(findings: Sequence[Finding], *, path: object) -> str:
    """Why a plan is refused, in a few hundred characters however many findings there are:
    how many, the first codes with their counts and first message, and the command that
    lists them all ("21 findings: dcp-coverage-gap x15 (e.g. ...); ...; and 2 more codes;
    `ckpt-inspect check PATH` lists them all")."""
    by_code: dict[str, list[Finding]] = defaultdict(list)
    for finding in findings:
        by_code[finding.code].append(finding)
    shown = []
    for code, items in list(by_code.items())[:REFUSAL_CODES]:
        first = legible(items[0].message, limit=REFUSAL_MESSAGE)
        count = f" x{len(items):,}" if len(items) > 1 else ""
        shown.append(f"{code}{count} ({'e.g. ' if count else ''}{first})")
    rest = len(by_code) - len(shown)
    more = f"; and {plural(rest, 'more code')}" if rest else ""
    command = f"ckpt-inspect check {shell_word(str(path))}"
    return (
        f"{plural(len(findings), 'finding')}: {'; '.join(shown)}{more}; `{command}` lists them all"
    )
