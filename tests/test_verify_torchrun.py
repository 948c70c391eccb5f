"""`manifest` and `verify` under torchrun: 2 real ranks (gloo on 127.0.0.1, CPU) share the
reading, files balanced by bytes (DCP tensors by their bytes); rank 0 alone prints and writes,
and what it reports is what one process reports. The run's one torchrun launch
(tests/torchrun_job.py, shared with test_consolidate_torchrun) runs every command in turn in
the same two processes (`verify_ranks_probe.py`), as a training loop would."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from test_verify import SHARD
from torchrun_job import job_ranks

from inspector import verify, write_manifest
from inspector._internal.common.filenames import MANIFEST_NAME
from inspector._internal.execution.ranks import balance
from inspector._internal.integrity import parse_manifest


def _files(folder: Path) -> dict[str, int]:
    return {
        p.relative_to(folder).as_posix(): p.stat().st_size
        for p in folder.rglob("*")
        if p.is_file() and p.name != MANIFEST_NAME
    }


def _same_manifest(a: Path, b: Path) -> None:
    ma, mb = parse_manifest(a.read_bytes()), parse_manifest(b.read_bytes())
    assert ma.files == mb.files and ma.tensors == mb.tensors


def _comparable(doc: dict[str, Any]) -> dict[str, Any]:
    """A verification without what differs from run to run (when, how long)."""
    return {k: v for k, v in doc.items() if k not in {"when", "seconds", "line"}}


def test_balance_splits_by_bytes_not_by_count() -> None:
    items = [("big", 100), *((f"small-{i}", 10) for i in range(10))]
    parts = balance(items, 2)
    assert sorted(x for part in parts for x in part) == sorted(items)
    assert [sum(size for _, size in part) for part in parts] == [100, 100]
    assert balance(items, 2) == parts  # the same split on every rank
    assert balance([], 3) == [[], [], []]


def test_two_ranks_share_the_reading_and_rank_0_alone_reports(
    torchrun_job: Path, tmp_path: Path
) -> None:
    healthy, damaged, dcp = (torchrun_job / name for name in ("healthy", "damaged", "dcp"))
    ranks = job_ranks(torchrun_job)
    first, second = ([run[i] for run in ranks] for i in range(2))
    dcp_runs = [run[4] for run in ranks]

    # manifest: each file read by exactly one rank, the shares balanced by bytes.
    files = _files(healthy)
    reads = [{(rel, size) for _, rel, size in r["read"]} for r in first]
    assert reads[0] and reads[1] and not reads[0] & reads[1]
    assert reads[0] | reads[1] == set(files.items())
    loads = [sum(size for _, size in r) for r in reads]
    assert max(loads) <= sum(loads) / 2 + max(files.values())
    # Rank 0 wrote the manifest and said so; rank 1 wrote and printed nothing.
    assert first[0]["wrote"] == [str(torchrun_job / "ranks.json")] and first[1]["wrote"] == []
    assert first[0]["stdout"].startswith("wrote ") and first[1]["stdout"] == ""
    assert [r["rc"] for r in first] == [0, 0]
    # What the two ranks wrote is what one process writes.
    write_manifest(healthy, output=tmp_path / "alone.json")
    _same_manifest(torchrun_job / "ranks.json", tmp_path / "alone.json")

    # verify --level hash: the damaged shard, reported once, by rank 0; both ranks exit 1.
    reads = [{rel for _, rel, _ in r["read"]} for r in second]
    assert not reads[0] & reads[1] and reads[0] | reads[1] == set(_files(damaged))
    assert second[1]["stdout"] == "" and [r["rc"] for r in second] == [1, 1]
    doc = json.loads(second[0]["stdout"])
    assert [(f["code"], f["file"]) for f in doc["findings"]] == [("file-hash-mismatch", SHARD)]
    alone = verify(damaged, level="hash").to_dict()
    assert _comparable(doc) == _comparable(json.loads(json.dumps(alone, default=str)))

    # verify --level tensor and against another checkpoint (both copies read, each split).
    for index, level, against in ((2, "tensor", None), (3, "hash", str(healthy))):
        runs = [run[index] for run in ranks]
        assert runs[1]["stdout"] == "" and [r["rc"] for r in runs] == [1, 1]
        for side in (str(damaged), str(healthy)) if against else (str(damaged),):
            reads = [{rel for root, rel, _ in r["read"] if root == side} for r in runs]
            assert not reads[0] & reads[1] and reads[0] and reads[1]
        doc = json.loads(runs[0]["stdout"])
        alone = verify(damaged, level=level, against=against).to_dict()
        assert _comparable(doc) == _comparable(json.loads(json.dumps(alone, default=str)))
        assert doc["findings"] and all(f["file"] == SHARD for f in doc["findings"])

    # DCP: tensors assembled from their chunks, each by one rank; the same manifest as alone.
    named = [set(r["tensors"]) for r in dcp_runs]
    assert named[0] and named[1] and not named[0] & named[1]
    write_manifest(dcp, output=tmp_path / "dcp-alone.json")
    alone_dcp = parse_manifest((tmp_path / "dcp-alone.json").read_bytes())
    assert named[0] | named[1] == set(alone_dcp.tensors)
    _same_manifest(torchrun_job / "dcp-ranks.json", tmp_path / "dcp-alone.json")
    assert dcp_runs[1]["wrote"] == [] and dcp_runs[1]["stdout"] == ""
