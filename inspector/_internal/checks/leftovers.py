"""Temp files a killed run left in the folder (`temp-file-left`): each named with its size
and what it is, and whether `repair --recover` removes it (`execution/temps.py` judges);
shard-sized ones too (a consolidation's `.partial` outputs, a re-shard's staging folder).

The one rule that looks at the folder beyond what the scan read: the names of its entries
(and one `lstat` per name that looks like a temp file), never their bytes. A remote
checkpoint has no such files of ours."""

from __future__ import annotations

from pathlib import Path

from inspector._internal.checkpoint.scanned import ScannedCheckpoint
from inspector._internal.common.display import legible
from inspector._internal.common.text import plural
from inspector._internal.common.units import format_bytes
from inspector._internal.execution.atomic import JournalError, read_journal
from inspector._internal.execution.temps import LEFTOVER_SCAN_CAP, Leftover, find_leftovers
from inspector._internal.findings.codes import Code, code_set
from inspector._internal.findings.finding import Finding, make_finding

__all__ = ["CODES", "check_leftovers"]

CODES = code_set(Code.TEMP_FILE_LEFT)
# Entries named one finding each; the rest are one finding that counts them.
_SHOWN = 20


def check_leftovers(scanned: ScannedCheckpoint) -> list[Finding]:
    """One `temp-file-left` per entry named like our temp files (at most `_SHOWN`, then one
    that counts the rest and their bytes)."""
    root = scanned.path
    if not isinstance(root, Path):
        return []
    try:
        found = find_leftovers(root, locked=True, outputs=True)
    except OSError:
        return []  # the folder went away or cannot be listed: the scan said what it could
    # A temp file an unfinished journal renames is no leftover: the recovery finishes it.
    pending = _journal_sources(root)
    items = [i for i in (*found.removable, *found.kept) if i.path not in pending]
    out = [_finding(root, item) for item in items[:_SHOWN]]
    rest = items[_SHOWN:]
    hidden = len(rest) + found.more_kept + found.more_removable
    if hidden:
        size = sum(item.size or 0 for item in rest)
        out.append(
            make_finding(
                Code.TEMP_FILE_LEFT,
                f"{plural(hidden, 'more entry', many='more entries')} named like ckpt-inspect temp "
                f"files ({format_bytes(size)} among those listed)",
            )
        )
    out += [
        make_finding(
            Code.TEMP_FILE_LEFT,
            f"{legible(folder or '.')}: more than {LEFTOVER_SCAN_CAP:,} entries; the listing "
            "stopped there, so temp files further on were not looked for",
        )
        for folder in found.truncated
    ]
    return out


def _journal_sources(root: Path) -> set[str]:
    try:
        journal = read_journal(root)
    except (JournalError, OSError):
        return set()  # not one of ours: nothing it names is taken off the list
    # Only our own journal is finished by the recovery on its own: the sources of any other
    # (shipped, edited, another user's) stay listed, or a journal could hide any entry.
    if journal is None or not journal.ours or journal.problems:
        return set()
    return {entry.src for entry in journal.entries}


def _finding(root: Path, item: Leftover) -> Finding:
    # A kept entry says why it is kept, and what to do, in its own words.
    todo = (
        f"; `ckpt-inspect repair {legible(root)} --recover` removes it" if item.kept is None else ""
    )
    return make_finding(Code.TEMP_FILE_LEFT, f"{item.describe()}{todo}", file=item.path)
