"""Text helpers every room may use: counting things in a sentence, folding numbers into
ranges, a few names of a long list, a bounded description of an untrusted value, a shell word.
Below every room that writes messages (layout readers, checks, plans, renderers), so none of
them reaches up for a word; `findings/words.py` keeps the vocabulary itself."""

from __future__ import annotations

import reprlib
import shlex
from collections.abc import Collection, Iterable, Sequence
from typing import Any

from inspector._internal.common.display import legible

__all__ = [
    "cut_at_word",
    "examples",
    "fold_ranges",
    "fold_spans",
    "layer_name",
    "layers_text",
    "plural",
    "shell_word",
    "short_repr",
]


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


def layers_text(
    layers: Iterable[int], *, limit: int = 12, noun: str = "layer", mtp: Collection[int] = ()
) -> str:
    """'layer 40' or 'layers 0-39, 41-97' (ranges folded as `check` folds them); `noun`
    names other numbered things ('experts 17-19'). Layers in `mtp` are MTP layers, said
    after the decoder's: 'layers 1-3 and MTP layer 4' (`findings/words.py` on the one
    numbering)."""
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


def fold_ranges(values: Iterable[int], *, limit: int = 12) -> str:
    """'0-3, 7, 9-511': sorted unique ints folded into ranges, at most `limit` pieces."""
    ordered = sorted(set(values))
    spans: list[tuple[int, int]] = []
    if ordered:
        start = prev = ordered[0]
        for v in ordered[1:]:
            if v == prev + 1:
                prev = v
            else:
                spans.append((start, prev))
                start = prev = v
        spans.append((start, prev))
    return fold_spans(spans, limit=limit)


def fold_spans(spans: Sequence[tuple[int, int]], *, limit: int = 12) -> str:
    """`fold_ranges` of the sorted, disjoint inclusive ranges `spans`, as given: for sets too
    large to list (a hostile expert id of 999,999,999 leaves a billion ids missing)."""
    pieces = [_piece(start, end) for start, end in spans[:limit]]
    if len(spans) > limit:
        return ", ".join(pieces) + f", ... ({len(spans) - limit} more ranges)"
    return ", ".join(pieces)


def _piece(start: int, end: int) -> str:
    return str(start) if start == end else f"{start}-{end}"


def examples(items: Sequence[str], *, limit: int = 3) -> str:
    """'a, b, c and 12 more': the first few of a long list (of names), for messages; each
    through `legible`."""
    first = ", ".join(map(legible, items[:limit]))
    rest = len(items) - limit
    return f"{first} and {rest} more" if rest > 0 else first


# Values from checkpoint files quoted in messages: bounded, so a finding never echoes much of
# a file and never walks a whole (possibly shared, deep) structure to print it.
_SHORT = reprlib.Repr()


_SHORT.maxlevel = 3


_SHORT.maxtuple = _SHORT.maxlist = _SHORT.maxset = _SHORT.maxfrozenset = 6


_SHORT.maxdict = 4


_SHORT.maxstring = _SHORT.maxother = 80


_SHORT.maxlong = 40


def short_repr(value: Any, *, limit: int = 200) -> str:
    """A bounded description of an untrusted value: visits at most a few hundred nodes
    whatever its size, depth or sharing (`str()` of a pickled DAG takes exponential time).
    A string is shown as a name is (`inspector._internal.common.display.legible`: head and tail,
    control characters escaped)."""
    if type(value) is str:
        return legible(value, limit=limit)
    try:
        text = _SHORT.repr(value)
    except Exception as exc:  # a hostile __repr__ cannot exist (nothing is imported), but
        text = f"<{type(value).__name__}: {type(exc).__name__}>"  # never let one escape
    return text if len(text) <= limit else text[: limit - 3] + "..."
