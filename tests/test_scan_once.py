"""`scan_once` (what `ckpt-inspect scan` reads with) against `scan`, on the real writers' golden
fixtures with an index or sidecars: the same result, only the index names' strings differ in
where they come from (`ScanOptions.share_names`)."""

from __future__ import annotations

import gc
import json
from pathlib import Path

import numpy as np
import pytest

from inspector._internal.checkpoint.scanned import IndexDoc, ScannedCheckpoint
from inspector._internal.checkpoint.tables import scan_columns
from inspector._internal.cli.main import main
from inspector._internal.common.gc import gc_paused
from inspector._internal.report.summary import summarize
from inspector._internal.scan.entry import scan, scan_once

WRITERS = Path(__file__).parent / "fixtures" / "writers"
FOLDERS = sorted({p.parent for p in WRITERS.rglob("*.index.json")})


def _docs(scanned: ScannedCheckpoint) -> list[IndexDoc]:
    sidecars = getattr(scanned.info, "sidecars", {})
    return [d for d in (scanned.index, *sidecars.values()) if d is not None]


def _same_doc(a: IndexDoc, b: IndexDoc) -> bool:
    return (
        (a.file, a.names, a.files.values) == (b.file, b.names, b.files.values)
        and np.array_equal(a.files.codes, b.files.codes)
        and dict(a.metadata) == dict(b.metadata)
        and dict(a.document) == dict(b.document)
    )


@pytest.mark.parametrize("folder", FOLDERS, ids=[str(f.relative_to(WRITERS)) for f in FOLDERS])
def test_scan_once_reads_what_scan_reads(folder: Path) -> None:
    kept, once = scan(folder), scan_once(folder)
    assert (kept.layout, kept.shards, kept.read_problems) == (
        once.layout,
        once.shards,
        once.read_problems,
    )
    kept_docs, once_docs = _docs(kept), _docs(once)
    assert kept_docs and len(kept_docs) == len(once_docs)
    assert all(_same_doc(a, b) for a, b in zip(kept_docs, once_docs, strict=True))
    # The scan kept with its caller gives the index the shards' strings for the names they
    # share (one string a name, not two); `scan_once` need not.
    held = {id(n): n for s in kept.shards for n in s.names}
    by_text = {n: n for n in held.values()}
    shared = [n for d in kept_docs for n in d.names if n in by_text]
    assert all(id(n) in held for n in shared)


def test_scan_command_output_is_scans_summary(capsys: pytest.CaptureFixture[str]) -> None:
    """The command reads with `scan_once`; its JSON is the summary of a kept scan."""
    folder = WRITERS / "transformers" / "deepseek-v3"
    assert main(["scan", "--json", str(folder)]) == 0
    printed = capsys.readouterr().out
    assert json.loads(printed) == json.loads(json.dumps(summarize(scan(folder)), default=str))


@pytest.mark.parametrize("folder", FOLDERS, ids=[str(f.relative_to(WRITERS)) for f in FOLDERS])
def test_scan_leaves_no_reference_cycle(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`check` freezes what the scan made, its garbage too (`cli.args.settled`), so a reference
    cycle the scan leaves stays until the command ends. Every coding left one (a dict whose
    default factory was its own `__len__`): two a shard, the index's and the names' (a header
    of 200,000 distinct shapes: 38 MB more at the peak of check --no-model)."""
    from inspector._internal.layouts import _common

    monkeypatch.setattr(_common, "_PIECE_BYTES", 64)  # the index decoded in pieces too
    scan_columns(scan(folder))  # imports and caches made once
    # Only the youngest generation is collected: what the scan makes while the collector is
    # paused stays in it, and a full collection walked whatever the worker's earlier tests
    # had left (0.2 CPU-s a folder behind the in-process model tests).
    gc.collect(0)
    with gc_paused():
        scan_columns(scan(folder)).parsed  # noqa: B018 (the name columns, built on first use)
        assert gc.collect(0) == 0
