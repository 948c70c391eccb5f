"""The words shown to people: one vocabulary and one way to count things in text.

- a **finding** is one coded observation (`inspector.findings.Finding`, with a code from
  `inspector.codes` and a severity);
- an **issue** is the findings one root cause explains, with its impact and the one action
  that fixes it (`inspector.problems.Problem`; the Overview, `check`, the reports list them);
- severities are **error**, **warning** and **info**;
- `scan` reads headers and JSON and runs no check: what it could not read are **read
  errors**, never "problems" (`check` gives the findings).

Every count in a sentence goes through `plural` ("1 finding", "2 errors", "3 info"), and
every list of layers through `layers_text` ("layer 40", "layers 0-39, 41-97"), so the CLI,
the summaries, the reports and the dashboard say the same thing the same way.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Mapping

from inspector.findings import fold_ranges

__all__ = [
    "FINDING",
    "ISSUE",
    "READ_ERROR",
    "SEVERITY_ORDER",
    "layers_text",
    "plural",
    "severity_counts",
    "shell_word",
]

FINDING = "finding"
ISSUE = "issue"
READ_ERROR = "read error"
SEVERITY_ORDER = ("error", "warning", "info")

# Nouns whose plural is not the noun + "s" ("info" is a mass noun: "3 info").
_IRREGULAR = {"info": "info", "index": "indices", "entry": "entries"}


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


def layers_text(layers: Iterable[int], *, limit: int = 12) -> str:
    """'layer 40' or 'layers 0-39, 41-97' (ranges folded as `check` folds them)."""
    ordered = sorted(set(layers))
    word = "layer" if len(ordered) == 1 else "layers"
    return f"{word} {fold_ranges(ordered, limit=limit)}"


def shell_word(text: str) -> str:
    """A path as one shell word in a command people copy (quoted only when it needs it)."""
    return shlex.quote(text)
