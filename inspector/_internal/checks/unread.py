"""Tensors whose bytes could not be read (`check --values`, `check --deep`): the finding that
says so and why, worded once for both readers."""

from __future__ import annotations

from collections.abc import Sequence

from inspector._internal.common.display import legible
from inspector._internal.findings.codes import Code
from inspector._internal.findings.finding import Finding, fold_findings, make_finding
from inspector._internal.formats.value_reading import Unread

__all__ = ["UNREAD_FOLDS", "unread_findings", "unread_verdict"]

# How many findings of each code are folded into one ("the first listed, the rest counted").
UNREAD_FOLDS = (
    (Code.TENSOR_UNREADABLE, "tensors whose bytes could not be read"),
    (Code.FILE_TRUNCATED, "tensors past the end of their file"),
)


def unread_verdict(unread: Unread) -> tuple[Code, str]:
    """`file-truncated` for bytes past the end of the file, else `tensor-unreadable`, and
    why, with what to do."""
    if unread.truncated:
        return Code.FILE_TRUNCATED, (
            f"{unread.why}: its values were not read (the write or copy was cut short; "
            "re-copy or re-export the file)"
        )
    return Code.TENSOR_UNREADABLE, (
        f"its bytes could not be read ({unread.why}): its values were not checked; "
        "re-copy the file or check the disk or the connection, then check again"
    )


def unread_findings(unread: Sequence[Unread]) -> list[Finding]:
    """One finding per unread tensor (as `check --values` words it), folded per code."""
    by_code: dict[Code, list[Finding]] = {code: [] for code, _ in UNREAD_FOLDS}
    for u in unread:
        code, why = unread_verdict(u)
        where = f"{legible(u.file)}: tensor '{legible(u.name)}' ({u.dtype})"
        by_code[code].append(make_finding(code, f"{where}: {why}", file=u.file, tensor=u.name))
    return [f for code, what in UNREAD_FOLDS for f in fold_findings(by_code[code], what)]
