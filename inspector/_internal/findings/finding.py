"""Findings: the typed result of every check (built from `findings.codes`), and the one policy
(`FOLD`) for how many are listed one by one: at most `per_file` per code and file and
`per_code` per code, the rest of each group one summary finding ("180 more tensors ...").
The full lists are always in the tables.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, TypeVar

from inspector._internal.common.display import MESSAGE_LIMIT, legible
from inspector._internal.common.text import examples, fold_ranges
from inspector._internal.findings.codes import (
    CODE_HELP,
    CODES,
    Code,
    Severity,
    code_of,
    severity_rank,
)

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "CODES",
    "CODE_HELP",
    "FOLD",
    "Code",
    "Finding",
    "FoldPolicy",
    "Severity",
    "besides",
    "findings_per_file",
    "findings_to_frame",
    "fold",
    "fold_by_file",
    "fold_findings",
    "fold_listed",
    "fold_modules",
    "make_finding",
    "severity_rank",
    "sort_findings",
]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Finding:
    """One problem, with where it is. `file` is relative to the checkpoint folder.

    `folded` is how many more items of its kind (tensors, files, layers...) a summary
    finding stands for, set by the fold policy (`fold`): 0 for a finding about one thing.
    A count of findings is then explained by it: 21 `unindexed-tensor` findings are 20
    tensors one by one and one summary that folds 22 more."""

    code: str
    severity: Severity
    message: str
    file: str | None = None
    tensor: str | None = None
    layer: int | None = None
    expert: int | None = None
    folded: int = 0

    def to_dict(self) -> dict[str, object]:
        d = asdict(self)
        d["severity"] = str(self.severity)
        return d

    def __repr__(self) -> str:
        # A console shows the repr: names bounded and escaped like everywhere else.
        where = "".join(
            f", {k}='{legible(v)}'" for k, v in (("file", self.file), ("tensor", self.tensor)) if v
        )
        at = "".join(
            f", {k}={v}"
            for k, v in (("layer", self.layer), ("expert", self.expert))
            if v is not None
        )
        more = f", folded={self.folded}" if self.folded else ""
        return f"Finding({self.code}, {self.severity}: '{self.message}'{where}{at}{more})"


def make_finding(
    code: Code | str,
    message: str,
    *,
    file: str | None = None,
    tensor: str | None = None,
    layer: int | None = None,
    expert: int | None = None,
) -> Finding:
    """A finding whose severity comes from the code table (an unknown code raises: a bug).

    The message is what people read: it goes through `legible` (at most `MESSAGE_LIMIT`
    characters, control characters escaped), whatever names the check put in it. `file` and
    `tensor` stay exact (they are data: tables, filters and `--json` match on them); every
    renderer shows them through `legible` too."""
    known = code_of(code)
    text = legible(message, limit=MESSAGE_LIMIT)
    return Finding(known.value, known.severity, text, file, tensor, layer, expert)


def sort_findings(findings: Iterable[Finding]) -> list[Finding]:
    """Exact duplicates dropped, then worst first, by code, file and tensor."""
    unique = dict.fromkeys(findings)
    return sorted(
        unique, key=lambda f: (severity_rank(f.severity), f.code, f.file or "", f.tensor or "")
    )


# -- how many findings of one kind are listed ---------------------------------------------------


@dataclass(frozen=True, slots=True)
class FoldPolicy:
    """How many findings of one code are listed one by one: `per_file` per file (or group),
    `per_code` in all; the rest of each group is folded into one summary finding."""

    per_file: int = 20
    per_code: int = 200


FOLD = FoldPolicy()


def fold(
    groups: Mapping[str, Sequence[T]] | Sequence[T],
    detail: Callable[[str | None, T], Finding],
    summary: Callable[[str | None, Sequence[T], int], Finding],
    *,
    policy: FoldPolicy = FOLD,
) -> list[Finding]:
    """Findings for many items of one kind (one code), bounded by `policy`.

    `groups` maps a group (usually a file) to its items, or is one ungrouped sequence.
    `detail(group, item)` builds the finding of an item listed on its own and is only called
    for those; `summary(group, rest, shown)` builds the finding that folds the rest of a group
    (`shown` of its items have findings of their own: `besides(shown)` says so). Groups are
    visited in sorted order. Each summary's `folded` is how many items it stands for.
    """
    if not isinstance(groups, Mapping):
        groups = {"": groups} if groups else {}
    findings: list[Finding] = []
    budget = policy.per_code
    for group in sorted(groups):
        items = groups[group]
        key = group or None
        shown = max(0, min(policy.per_file, budget, len(items)))
        budget -= shown
        findings.extend(detail(key, item) for item in items[:shown])
        if shown < len(items):
            rest = items[shown:]
            findings.append(_folding(summary(key, rest, shown), rest))
    return findings


def _folding(summary: Finding, rest: Sequence[object]) -> Finding:
    """`summary` standing for the items of `rest` (a folded finding among them counts for
    what it folds too)."""
    n = sum(1 + item.folded if isinstance(item, Finding) else 1 for item in rest)
    return replace(summary, folded=n)


def besides(shown: int) -> str:
    """' (besides the 20 reported one by one)' after the count of a summary finding, '' when
    none of its group was listed. Never "listed above": the findings are sorted, filtered
    and shown in tables, where nothing is above."""
    return f" ({_BESIDES.format(shown)})" if shown else ""


_BESIDES = "besides the {:,} reported one by one"


def fold_findings(
    findings: Sequence[Finding], what: str, *, policy: FoldPolicy = FOLD
) -> list[Finding]:
    """Findings already built (one code), bounded by `policy` per file: the rest of a file
    becomes one summary, "N more <what> (layers ..., e.g. ...)"."""
    groups: dict[str, list[Finding]] = {}
    for f in findings:
        groups.setdefault(f.file or "", []).append(f)

    def summary(file: str | None, rest: Sequence[Finding], shown: int) -> Finding:
        layers = fold_ranges(f.layer for f in rest if f.layer is not None)
        tensors = [f.tensor for f in rest if f.tensor]
        parts = [_BESIDES.format(shown)] if shown else []
        if layers:
            parts.append(f"layers {layers}")
        if tensors:
            parts.append(f"e.g. {examples(tensors)}")
        where = f" ({'; '.join(parts)})" if parts else ""
        return make_finding(rest[0].code, f"{len(rest):,} more {what}{where}", file=file)

    return fold(groups, lambda _file, f: f, summary, policy=policy)


def fold_by_file(
    findings: Sequence[Finding], what: str, *, policy: FoldPolicy = FOLD
) -> list[Finding]:
    """`fold_findings` for findings of one code spread over many files: the files past the
    per-code budget share one summary instead of one each. With a finding per file (a
    damaged copy of 20,000 shards), `fold_findings` still gives one summary per file past
    the budget; here that is `per_code` findings and one count."""
    groups: dict[str, list[Finding]] = {}
    for f in findings:
        groups.setdefault(f.file or "", []).append(f)
    budget, kept, rest = policy.per_code, [], []
    for file in sorted(groups):
        if budget > 0:
            kept += groups[file]
            budget -= min(policy.per_file, len(groups[file]))
        else:
            rest.append(file)
    out = fold_findings(kept, what, policy=policy)
    if rest:
        left = [f for file in rest for f in groups[file]]
        where = f" in {len(rest):,} more files" if len(rest) != len(left) else ""
        named = [f.tensor or f.file or "" for f in left]
        summary = make_finding(
            left[0].code, f"{len(left):,} more {what}{where} (e.g. {examples(named)})"
        )
        out.append(_folding(summary, left))
    return out


def fold_listed(
    code: Code | str,
    items: Sequence[T],
    *,
    file: str,
    message: Callable[[T], str],
    rest: Callable[[Sequence[T]], str],
    tensor: Callable[[T], str | None] = lambda _item: None,
    policy: FoldPolicy = FOLD,
) -> list[Finding]:
    """One finding per item (`message(item)`, `tensor(item)`) for the first
    `policy.per_code` items of one code in `file`, then one finding for the rest
    (`rest(items left)`)."""
    found = [
        make_finding(code, message(item), file=file, tensor=tensor(item))
        for item in items[: policy.per_code]
    ]
    left = items[policy.per_code :]
    if left:
        found.append(_folding(make_finding(code, rest(left), file=file), left))
    return found


def fold_modules(
    code: Code | str, items: Sequence[tuple[str, str]], *, head: str, advice: str, file: str
) -> list[Finding]:
    """`fold_listed` of (module, what is wrong with it) pairs of one config check: each said
    as "{head}: 'module' {what}; {advice}", the rest counted with a few examples."""
    return fold_listed(
        code,
        items,
        file=file,
        message=lambda item: f"{head}: '{legible(item[0])}' {item[1]}; {advice}",
        rest=lambda left: (
            f"{head}: {len(left):,} more modules the same way "
            f"({examples([m for m, _ in left[:3]])}); {advice}"
        ),
    )


_COLUMNS = ["code", "severity", "message", "file", "tensor", "layer", "expert"]


def findings_to_frame(findings: Iterable[Finding]) -> pd.DataFrame:
    """The findings as a DataFrame, worst first, with categorical code and severity."""
    import pandas as pd

    rows = [f.to_dict() for f in findings]
    frame = pd.DataFrame(rows, columns=_COLUMNS)
    frame["layer"] = frame["layer"].astype("Int64")
    frame["expert"] = frame["expert"].astype("Int64")
    frame["severity"] = pd.Categorical(
        frame["severity"], categories=[s.value for s in Severity], ordered=True
    )
    frame["code"] = frame["code"].astype("category")
    return frame.sort_values(["severity", "code"], kind="stable").reset_index(drop=True)


# A word of a message that may be a file name: no space, no quote or bracket around it.
_WORD = re.compile(r"[^\s'\"`()\[\]{}<>,;]+")


def findings_per_file(findings: Iterable[Finding], files: Iterable[str]) -> dict[str, int]:
    """How many findings name each of `files`: as their `file`, or in their message (a
    sidecar finding names the shard it disagrees with, a folded one the file it is in).
    A finding counts once for every file it names, so the files table agrees with the
    findings: the shard an `expert-missing` finding names counts it."""
    known = set(files)
    counts = dict.fromkeys(known, 0)
    for f in findings:
        named = {f.file} if f.file in known else set()
        for word in _WORD.findall(f.message):
            word = word.rstrip(".:")
            if word in known:
                named.add(word)
        for name in named:
            counts[name] += 1
    return counts
