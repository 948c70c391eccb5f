"""The real writers' golden fixtures (`tests/fixtures/writers/`, written by `make fixtures`) and
their manifest, shared by the tests that iterate over every case.

A case of a format the first writers did not produce carries `"format"` (`pytorch-bin`,
`compressed-tensors`, `mxfp4`, `fp8-block`, `gguf`) and states in the manifest itself the exact
error and warning codes a check must give (`"expected_codes"`) and why (`"expected_findings"`).
Some of those codes need a reader or a check that the project does not have yet: the two tables
below name them with the reason. Their cases run as strict expected failures (never skipped):
they are reported as xfailed with the reason today, and the day the reader or check makes
them pass, pytest reports the XPASS as a failure until the entry is removed here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

FIXTURES = Path(__file__).parent / "fixtures" / "writers"
MANIFEST: dict[str, dict[str, Any]] = json.loads((FIXTURES / "MANIFEST.json").read_text())

# format -> why no case of it can be scanned yet
READER_PENDING: dict[str, str] = {}

# case -> the check its expected codes need, which does not exist yet
CHECK_PENDING: dict[str, str] = {}


def pending(case: str) -> str | None:
    """Why `case` cannot meet its expectations yet, or None when it must."""
    fmt = MANIFEST[case].get("format")
    if fmt in READER_PENDING:
        return f"{fmt}: {READER_PENDING[fmt]}"
    return CHECK_PENDING.get(case)


def unreadable(case: str) -> str | None:
    """Why `case` cannot even be scanned yet, or None."""
    fmt = MANIFEST[case].get("format")
    return f"{fmt}: {READER_PENDING[fmt]}" if fmt in READER_PENDING else None


def params(cases: list[str], reason: Any = pending) -> list[Any]:
    """`cases` as pytest parameters, those `reason(case)` names as strict expected failures."""
    out = []
    for case in cases:
        why = reason(case)
        marks = [pytest.mark.xfail(strict=True, reason=why)] if why else []
        out.append(pytest.param(case, marks=marks, id=case))
    return out
