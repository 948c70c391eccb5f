"""The words shown to people: one vocabulary for findings, issues, severities and refusals.

A **finding** is one coded observation; an **issue** the findings one root cause explains,
with its impact and the one action that fixes it; severities are **error**, **warning** and
**info**; what `scan` could not read are **read errors**. One module, so that the CLI, the
summaries, the reports and the dashboard say the same thing the same way; the helpers and
the layer numbering: docs/architecture.md, "findings/".
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from itertools import groupby
from typing import Protocol

from inspector._internal.common.display import legible
from inspector._internal.common.text import plural, shell_word
from inspector._internal.findings.finding import Finding, severity_rank

__all__ = [
    "FINDING",
    "ISSUE",
    "READ_ERROR",
    "SEVERITY_ORDER",
    "grouped_by_code",
    "refusal_digest",
    "severity_counts",
    "severity_tally",
]

FINDING = "finding"
ISSUE = "issue"
READ_ERROR = "read error"
SEVERITY_ORDER = ("error", "warning", "info")


class _Judged(Protocol):
    @property
    def severity(self) -> object: ...


def severity_tally(items: Iterable[_Judged | Mapping[str, object]]) -> Counter[str]:
    """How many of `items` (findings or issues, or findings as JSON: `Finding.to_dict()`)
    have each severity, by its word: the one count the CLI, the reports and the dashboard
    show (`severity_counts` says it)."""
    return Counter(str(i["severity"] if isinstance(i, Mapping) else i.severity) for i in items)


def severity_counts(counts: Mapping[str, int], *, zeros: bool = False) -> str:
    """'2 errors, 1 warning' (worst first; severities with none left out unless `zeros`)."""
    parts = [
        plural(int(counts.get(s, 0)), s) for s in SEVERITY_ORDER if zeros or int(counts.get(s, 0))
    ]
    return ", ".join(parts)


def grouped_by_code(findings: Iterable[Finding]) -> list[tuple[str, list[Finding]]]:
    """The findings worst first, one group per code (each in the order given): the table of
    findings per code that the Markdown summary and the HTML report show."""
    ordered = sorted(findings, key=lambda f: (severity_rank(f.severity), f.code))
    return [(code, list(items)) for code, items in groupby(ordered, key=lambda f: f.code)]


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
