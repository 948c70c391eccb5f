"""The issues `check`, the report and the dashboard show (`group_issues`), pinned on every
demo checkpoint and every golden writer fixture: a change to the grouping rules (the table
of diagnosis/issues.py) leaves them byte for byte as they were, or updates
tests/fixtures/issues/snapshot.json on purpose (`ISSUES_SNAPSHOT=write`, then review the
diff)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from inspector._internal.checks import check
from inspector._internal.diagnosis.issues import Issue, group_issues
from inspector._internal.scan.entry import scan

FIXTURES = Path(__file__).parent / "fixtures"
SNAPSHOT = FIXTURES / "issues" / "snapshot.json"


def _golden_folders() -> list[Path]:
    """Every golden writer checkpoint: a folder holding files, or a training run's `model/`
    (a DCP run: its upstream model beside it)."""
    folders = [p for p in (FIXTURES / "writers").glob("*/*") if p.is_dir()]
    return sorted(
        p if any(c.is_file() for c in p.iterdir()) else p / "model"
        for p in folders
        if any(c.is_file() for c in p.iterdir()) or (p / "model").is_dir()
    )


def _issue(issue: Issue, roots: dict[str, str]) -> dict[str, Any]:
    def words(text: str) -> str:
        for root, name in roots.items():
            text = text.replace(root, name)
        return text

    action = issue.action
    return {
        "key": issue.key,
        "severity": str(issue.severity),
        "title": words(issue.title),
        "impact": words(issue.impact),
        "action": [action.kind, words(action.text), words(action.command), list(action.parts)],
        "findings": [[f.code, f.file, f.tensor, words(f.message)] for f in issue.findings],
        "tensors": list(issue.tensors),
        "files": list(issue.files),
        "cells": [list(c) for c in issue.cells],
    }


def _issues_of(path: Path, *, model: bool, roots: dict[str, str]) -> list[dict[str, Any]]:
    scanned = scan(path)
    return [_issue(i, roots) for i in group_issues(scanned, check(scanned, model=model))]


@pytest.fixture
def no_hf_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """References are looked up in the Hugging Face cache too: an empty one, so the snapshot
    is the same on every machine."""
    for name in ("HF_HUB_CACHE", "HF_HOME", "HOME"):
        monkeypatch.setenv(name, str(tmp_path / "home"))


def test_issues_of_every_demo_and_golden_fixture_are_the_snapshot(
    demo_checkpoints: Path, kept_demo_verdicts: Path, no_hf_cache: None
) -> None:
    from inspector._internal.demo import demo_names

    roots = {str(demo_checkpoints): "DEMOS", str(FIXTURES): "FIXTURES"}
    # The demos with their load verdicts (kept: no model is built), the golden fixtures
    # without the model-aware check (building each fixture's model is the load tests' job).
    got = {
        f"demo/{name}": _issues_of(demo_checkpoints / name, model=True, roots=roots)
        for name in demo_names()
        if (demo_checkpoints / name).is_dir()
    }
    got |= {
        f"golden/{p.relative_to(FIXTURES / 'writers').as_posix()}": _issues_of(
            p, model=False, roots=roots
        )
        for p in _golden_folders()
    }
    text = json.dumps(got, indent=1, ensure_ascii=False, sort_keys=True) + "\n"
    if os.environ.get("ISSUES_SNAPSHOT") == "write":
        SNAPSHOT.write_text(text, encoding="utf-8")
    want = json.loads(SNAPSHOT.read_text(encoding="utf-8"))
    assert sorted(got) == sorted(want)
    for name in sorted(got):
        assert got[name] == want[name], name
