"""Findings: the typed, stable result of every check (codes from FINDINGS.md)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "CODES",
    "Finding",
    "Severity",
    "findings_to_frame",
    "fold_ranges",
    "make_finding",
    "severity_rank",
]


class Severity(StrEnum):
    ERROR = "error"
    WARNING = "warning"
    INFO = "info"


_RANK = {Severity.ERROR: 0, Severity.WARNING: 1, Severity.INFO: 2}


def severity_rank(severity: str) -> int:
    """0 for error, 1 for warning, 2 for info: sort key, worst first."""
    return _RANK[Severity(severity)]


# The stable codes. Never rename one; add new ones freely.
CODES: dict[str, Severity] = {
    # Shard integrity
    "header-unreadable": Severity.ERROR,
    "header-invalid-entry": Severity.ERROR,
    "header-duplicate-key": Severity.WARNING,
    "unknown-dtype": Severity.ERROR,
    "size-mismatch": Severity.ERROR,
    "offset-invalid": Severity.ERROR,
    "file-truncated": Severity.ERROR,
    "trailing-bytes": Severity.WARNING,
    # Index against shards
    "index-unreadable": Severity.ERROR,
    "index-unsafe-path": Severity.ERROR,
    "index-missing-file": Severity.ERROR,
    "index-dangling-tensor": Severity.ERROR,
    "index-wrong-file": Severity.ERROR,
    "unindexed-tensor": Severity.ERROR,
    "unindexed-file": Severity.WARNING,
    "duplicate-tensor": Severity.ERROR,
    "total-size-mismatch": Severity.WARNING,
    "total-parameters-mismatch": Severity.WARNING,
    # Per-layer sidecars
    "sidecar-missing": Severity.ERROR,
    "sidecar-unlisted-tensor": Severity.ERROR,
    "sidecar-dangling-tensor": Severity.ERROR,
    "sidecar-total-size-mismatch": Severity.WARNING,
    "sidecar-index-disagree": Severity.ERROR,
    "sidecar-unreadable": Severity.ERROR,
    # Model structure
    "config-unreadable": Severity.ERROR,
    "layer-missing": Severity.ERROR,
    "expert-missing": Severity.ERROR,
    "expert-incomplete": Severity.ERROR,
    "expert-shape-mismatch": Severity.ERROR,
    "layer-keyset-outlier": Severity.WARNING,
    "mtp-missing": Severity.WARNING,
    "quant-config-unreadable": Severity.ERROR,
    "quant-config-missing-layer": Severity.ERROR,
    "quant-config-stale-layer": Severity.WARNING,
    # DCP-sharded safetensors
    "dcp-sharding-info-missing": Severity.ERROR,
    "dcp-coverage-gap": Severity.ERROR,
    "dcp-chunk-overlap": Severity.ERROR,
    "dcp-dtype-conflict": Severity.ERROR,
    "mapping-unmapped-tensor": Severity.WARNING,
    "mapping-dangling-tensor": Severity.WARNING,
    "mapping-collapsed": Severity.WARNING,
    # Megatron torch_dist
    "torch-dist-metadata-unreadable": Severity.ERROR,
    "torch-dist-missing-file": Severity.ERROR,
    "torch-dist-chunk-gap": Severity.ERROR,
    "torch-dist-common-drift": Severity.ERROR,
    "torch-dist-metadata-json": Severity.WARNING,
}


@dataclass(frozen=True, slots=True)
class Finding:
    """One problem, with where it is. `file` is relative to the checkpoint folder."""

    code: str
    severity: Severity
    message: str
    file: str | None = None
    tensor: str | None = None
    layer: int | None = None
    expert: int | None = None

    def to_dict(self) -> dict[str, object]:
        d = asdict(self)
        d["severity"] = str(self.severity)
        return d


def make_finding(
    code: str,
    message: str,
    *,
    file: str | None = None,
    tensor: str | None = None,
    layer: int | None = None,
    expert: int | None = None,
) -> Finding:
    """A finding whose severity comes from the code registry (unknown codes are a bug)."""
    return Finding(code, CODES[code], message, file, tensor, layer, expert)


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


def fold_ranges(values: Iterable[int], *, limit: int = 12) -> str:
    """'0-3, 7, 9-511': sorted unique ints folded into ranges, at most `limit` pieces."""
    ordered = sorted(set(values))
    pieces: list[str] = []
    start = prev = None
    for v in ordered:
        if start is None:
            start = prev = v
        elif v == prev + 1:
            prev = v
        else:
            pieces.append(_piece(start, prev))
            start = prev = v
    if start is not None:
        pieces.append(_piece(start, prev))
    if len(pieces) > limit:
        return ", ".join(pieces[:limit]) + f", ... ({len(pieces) - limit} more ranges)"
    return ", ".join(pieces)


def _piece(start: int, end: int) -> str:
    return str(start) if start == end else f"{start}-{end}"


def examples(items: Sequence[str], *, limit: int = 3) -> str:
    """'a, b, c and 12 more': the first few of a long list, for messages."""
    shown = ", ".join(items[:limit])
    rest = len(items) - limit
    return f"{shown} and {rest} more" if rest > 0 else shown
