"""`verify` and `manifest` on checkpoints the real writers wrote (golden fixtures), damaged the
way transfers damage them, against every kind of source: the folder's manifest, another
checkpoint (local, re-sharded, consolidated from DCP, uploaded to moto's S3) and the Hub
stand-in's tree listing (nothing downloaded)."""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from inspector.widgets.report import render_html_report
from remote_servers import FakeHub, S3Store

from inspector import verify, write_manifest
from inspector._internal.checkpoint.loaded import tensor_data
from inspector._internal.checks import check
from inspector._internal.cli.main import main
from inspector._internal.common.filenames import (
    CONFIG_NAME,
    HF_METADATA_DIR,
    INDEX_NAME,
    MANIFEST_NAME,
    is_well_known,
)
from inspector._internal.integrity import ManifestError, parse_manifest
from inspector._internal.plans.consolidate import plan_consolidation
from inspector._internal.plans.reshard import plan_reshard
from inspector._internal.report.html import facts_html
from inspector._internal.report.markdown import markdown_summary
from inspector._internal.scan.entry import scan

GOLDEN = Path(__file__).resolve().parent / "fixtures" / "writers"
MIXTRAL = GOLDEN / "transformers" / "mixtral"
DCP = GOLDEN / "torch-dcp" / "healthy"
SHARD = "model-00002-of-00004.safetensors"
OTHER = "model-00003-of-00004.safetensors"
SHA = "c" * 40


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    folder = tmp_path / "mixtral"
    shutil.copytree(MIXTRAL, folder)
    return folder


def codes(result: object) -> set[str]:
    return {f.code for f in result.findings}  # type: ignore[attr-defined]


def data_region(file: Path) -> tuple[int, int, dict[str, tuple[int, int]]]:
    """(data start, file size, tensor -> absolute byte range) from the shard's own header."""
    header = scan(file.parent).shard(file.name)
    assert header is not None
    base = header.data_start
    spans = {
        n: (base + int(b), base + int(e))
        for n, b, e in zip(header.names, header.begins, header.ends, strict=True)
    }
    return base, header.file_size, spans


def touched(spans: dict[str, tuple[int, int]], lo: int, hi: int) -> set[str]:
    return {n for n, (b, e) in spans.items() if b < hi and lo < e}


# -- damage as transfers do it: each keeps the size; returns the byte range it changed --------


def flip_byte(file: Path, other: Path) -> tuple[int, int]:
    start, size, _ = data_region(file)
    at = (start + size) // 2
    data = bytearray(file.read_bytes())
    data[at] ^= 0xFF
    file.write_bytes(data)
    return at, at + 1


def block_from_other_shard(file: Path, other: Path) -> tuple[int, int]:
    start, size, _ = data_region(file)
    at = (start + size) // 2 - 2048
    data = bytearray(file.read_bytes())
    donor = other.read_bytes()
    data[at : at + 4096] = donor[at : at + 4096]
    assert bytes(data) != file.read_bytes()
    file.write_bytes(data)
    return at, at + 4096


def zeros_over_range(file: Path, other: Path) -> tuple[int, int]:
    start, size, _ = data_region(file)
    at = start + (size - start) // 3
    data = bytearray(file.read_bytes())
    data[at : at + 4096] = bytes(4096)
    file.write_bytes(data)
    return at, at + 4096


def truncated_then_padded(file: Path, other: Path) -> tuple[int, int]:
    start, size, _ = data_region(file)
    keep = (start + size) // 2
    data = file.read_bytes()[:keep] + bytes(size - keep)
    file.write_bytes(data)
    return keep, size


DAMAGE: list[Callable[[Path, Path], tuple[int, int]]] = [
    flip_byte,
    block_from_other_shard,
    zeros_over_range,
    truncated_then_padded,
]


# -- the manifest ---------------------------------------------------------------------------


def test_manifest_records_every_file_and_tensor_and_check_knows_it(copy: Path) -> None:
    before = check(scan(copy), model=False)
    dest = write_manifest(copy)
    assert dest == copy / MANIFEST_NAME and is_well_known(MANIFEST_NAME)
    manifest = parse_manifest(dest.read_bytes())
    files = {p.name for p in MIXTRAL.iterdir()}
    assert set(manifest.files) == files
    import hashlib

    for name, rec in manifest.files.items():
        data = (MIXTRAL / name).read_bytes()
        assert rec.size == len(data) and rec.sha256 == hashlib.sha256(data).hexdigest()
    scanned = scan(copy)
    assert set(manifest.tensors) == set(scanned.tensors["name"])
    assert all(t.hash is not None for t in manifest.tensors.values())
    # The manifest is a file check knows: nothing new is reported about the folder.
    assert check(scan(copy), model=False) == before
    # Atomic: no temp file left, and a second run replaces it.
    write_manifest(copy)
    assert sorted(p.name for p in copy.iterdir() if p.name.startswith(".")) == []


def test_healthy_copy_verifies_at_every_level(copy: Path) -> None:
    write_manifest(copy)
    for level in ("size", "hash", "tensor"):
        result = verify(copy, level=level)
        assert result.ok and result.findings == (), (level, result.findings)
        assert result.source_kind == "manifest" and result.mismatches == 0
    size = verify(copy, level="size")
    assert size.bytes_read == 0
    # "all match" only where every byte a loader reads was compared with a recorded hash:
    # sizes say nothing of the bytes, and level tensor leaves config.json uncompared.
    assert "all sizes match" in size.line() and not size.all_match
    assert verify(copy, level="hash").all_match
    assert "all match" in verify(copy, level="hash").line()
    tensor = verify(copy, level="tensor")
    assert tensor.tensors == len(parse_manifest((copy / MANIFEST_NAME).read_bytes()).tensors)
    assert "verified" in tensor.line() and "all tensors match" in tensor.line()
    assert "config.json, generation_config.json" in tensor.note and not tensor.all_match


@pytest.mark.parametrize("damage", DAMAGE, ids=lambda d: d.__name__)
def test_each_level_catches_what_it_should(
    copy: Path, damage: Callable[[Path, Path], tuple[int, int]]
) -> None:
    write_manifest(copy)
    _, _, spans = data_region(copy / SHARD)
    lo, hi = damage(copy / SHARD, copy / OTHER)
    # `check` reads headers only: same size, so nothing to see.
    assert not [f for f in check(scan(copy), model=False) if f.severity == "error"]
    # size: listings only, same sizes.
    assert verify(copy, level="size").ok
    # hash: the file, and only it.
    hashed = verify(copy, level="hash")
    assert codes(hashed) == {"file-hash-mismatch"}
    assert [f.file for f in hashed.findings] == [SHARD]
    # tensor: exactly the tensors whose bytes were changed, with their layers.
    result = verify(copy, level="tensor")
    assert codes(result) == {"tensor-hash-mismatch"}
    named = {f.tensor for f in result.findings}
    assert named and named <= touched(spans, lo, hi)
    assert all(f.file == SHARD for f in result.findings)
    assert all(f.layer is not None for f in result.findings if ".layers." in (f.tensor or ""))


def test_truncated_missing_and_extra_files(copy: Path) -> None:
    write_manifest(copy)
    data = (copy / SHARD).read_bytes()
    (copy / SHARD).write_bytes(data[: len(data) - 4096])
    (copy / OTHER).unlink()
    (copy / "notes.txt").write_text("added later\n")
    result = verify(copy, level="size")
    found = {(f.code, f.file) for f in result.findings}
    assert found == {
        ("file-size-mismatch", SHARD),
        ("file-missing-vs-source", OTHER),
        ("file-extra-vs-source", "notes.txt"),
    }
    assert result.bytes_read == 0
    tensor = verify(copy, level="tensor")
    assert "tensor-missing-vs-source" in codes(tensor)


def test_against_another_local_checkpoint_and_a_resharded_copy(copy: Path, tmp_path: Path) -> None:
    assert verify(copy, against=str(MIXTRAL), level="hash").ok
    resharded = tmp_path / "resharded"
    shutil.copytree(MIXTRAL, resharded)
    plan = plan_reshard(scan(resharded), max_shard_size="8kB")
    assert not plan.refused, plan.refused
    plan.execute(model=False)  # the re-check's load verdict is not under test here
    shards = {p.name for p in resharded.glob("*.safetensors")}
    assert shards and shards != {p.name for p in MIXTRAL.glob("*.safetensors")}
    # Files differ, tensors do not.
    assert not verify(resharded, against=str(MIXTRAL), level="hash").ok
    same = verify(resharded, against=str(MIXTRAL), level="tensor")
    assert same.ok and same.findings == () and same.source_kind == "checkpoint"
    # One changed tensor is named, with its layer.
    _, _, spans = data_region(copy / SHARD)
    name, (b, _e) = next((n, s) for n, s in sorted(spans.items()) if ".layers." in n)
    data = bytearray((copy / SHARD).read_bytes())
    data[b] ^= 0x01
    (copy / SHARD).write_bytes(data)
    result = verify(resharded, against=str(copy), level="tensor")
    assert [(f.code, f.tensor) for f in result.findings] == [("tensor-hash-mismatch", name)]
    assert result.findings[0].layer is not None


def test_dcp_source_and_its_consolidated_output_compare_equal(tmp_path: Path) -> None:
    dest = tmp_path / "out"
    plan_consolidation(scan(DCP), dest).execute(progress=False, verify=False)
    result = verify(dest, against=str(DCP), level="tensor")
    assert result.ok and result.findings == (), result.findings
    assert result.tensors == len(scan(dest).tensors)
    # A manifest of the DCP source records the logical tensors the output holds.
    src = tmp_path / "src"
    shutil.copytree(DCP, src)
    write_manifest(src)
    assert verify(dest, against=str(src / MANIFEST_NAME), level="tensor").ok


# -- hostile manifests ----------------------------------------------------------------------


_REC = {"size": 1, "sha256": "0" * 64}


def _tensor(digest: str | None) -> bytes:
    record = {"dtype": "F32", "shape": [2], "file": "a"} | ({"hash": digest} if digest else {})
    return json.dumps(record).encode()


_TENSOR_TWICE = (
    b'{"format": "checkpoint-inspector-manifest", "version": 1, "files": {"a": '
    + json.dumps(_REC).encode()
    + b'}, "tensors": {"t": '
    + _tensor("a" * 32)
    + b', "u": '
    + _tensor(None)
    + b', "t": '
    + _tensor("b" * 32)
    + b"}}"
)


def _manifest_of(files: dict) -> bytes:
    return json.dumps(
        {"format": "checkpoint-inspector-manifest", "version": 1, "files": files}
    ).encode()


@pytest.mark.parametrize(
    ("document", "reason"),
    [
        (b"{", "not valid JSON"),
        (b'{"format": "other"}', "not a checkpoint manifest"),
        (b'{"format": "checkpoint-inspector-manifest", "version": 9, "files": {}}', "version"),
        (
            b'{"format": "checkpoint-inspector-manifest", "version": 1, '
            b'"files": {"../../etc/passwd": {"size": 1, "sha256": null}}}',
            "inside the checkpoint folder",
        ),
        (
            b'{"format": "checkpoint-inspector-manifest", "version": 1, '
            b'"files": {"/etc/passwd": {"size": 1}}}',
            "absolute path",
        ),
        (
            b'{"format": "checkpoint-inspector-manifest", "version": 1, '
            b'"files": {"a": {"size": -1}}}',
            "size",
        ),
        (
            b'{"format": "checkpoint-inspector-manifest", "version": 1, '
            b'"files": {"a": {"size": 1, "sha256": "zz"}}}',
            "64 hex digits",
        ),
        (b"[" * 100_000, "levels deep"),
        # issue 31: a file without a SHA-256 would be compared by size only.
        (_manifest_of({"a": {"size": 1, "sha256": None}}), "expected 64 hex digits"),
        (_manifest_of({"a": {"size": 1}}), "expected 64 hex digits"),
        # issue 31: one spelling per file.
        (_manifest_of({"a/./b": _REC}), "not in normal form"),
        (_manifest_of({"./a": _REC}), "not in normal form"),
        (_manifest_of({"a//b": _REC}), "not in normal form"),
        (_manifest_of({"a/": _REC}), "not in normal form"),
        (_manifest_of({".": _REC}), "not in normal form"),
        (_manifest_of({"a/../b": _REC}), "'..'"),
        (_manifest_of({"a\\b": _REC}), "backslash"),
        (_manifest_of({"": _REC}), "empty"),
        (
            b'{"format": "checkpoint-inspector-manifest", "version": 1, "files": {"a": '
            + json.dumps(_REC).encode()
            + b', "a": '
            + json.dumps(_REC).encode()
            + b"}}",
            "twice",
        ),
        (
            b'{"format": "checkpoint-inspector-manifest", "version": 1, "files": {}, '
            b'"files": {"a": ' + json.dumps(_REC).encode() + b"}}",
            "twice",
        ),
        # Before, only more "sha256", "hash", "files" or "tensors" keys than entries were
        # looked for: a tensor given twice around one without a hash (a reader sees the
        # first hash, verify used the last), a size given twice, passed.
        (_TENSOR_TWICE, "'t' twice"),
        (_manifest_of({"a": _REC}).replace(b'"size": 1,', b'"size": 1, "size" : 2,'), "twice"),
    ],
)
def test_hostile_manifest_is_unreadable_and_nothing_is_verified(
    copy: Path, document: bytes, reason: str
) -> None:
    with pytest.raises(ManifestError, match=reason):
        parse_manifest(document)
    (copy / MANIFEST_NAME).write_bytes(document)
    result = verify(copy, level="hash")
    assert codes(result) == {"manifest-unreadable"}
    assert reason in result.findings[0].message
    assert main(["verify", str(copy)]) == 1


# -- the CLI --------------------------------------------------------------------------------


def test_cli_manifest_and_verify_exit_codes(
    copy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "elsewhere.json"
    assert main(["manifest", str(copy), "-o", str(out)]) == 0
    assert not (copy / MANIFEST_NAME).exists() and out.is_file()
    assert main(["verify", str(copy), "--against", str(out)]) == 0
    assert "all match" in capsys.readouterr().out
    zeros_over_range(copy / SHARD, copy / OTHER)
    assert main(["verify", str(copy), "--against", str(out), "--level", "size"]) == 0
    capsys.readouterr()
    assert main(["verify", str(copy), "--against", str(out), "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] is False and doc["findings"][0]["code"] == "file-hash-mismatch"
    assert doc["findings"][0]["file"] == SHARD
    # No manifest, no source: the header extents, and a note that says what to do.
    capsys.readouterr()
    assert main(["verify", str(copy)]) == 0
    assert "ckpt-inspect manifest" in capsys.readouterr().out
    assert main(["verify", str(tmp_path / "absent")]) == 2


# -- remote: the Hub's own listing, an upload to S3 ---------------------------------------------


@pytest.fixture
def hub(hub_server: FakeHub) -> Iterator[FakeHub]:
    with hub_server.serving({"org/mixtral": {"main": (SHA, MIXTRAL)}}) as server:
        yield server


def test_against_the_hub_listing_reads_no_file(copy: Path, hub: FakeHub) -> None:
    options = {"storage_options": {"endpoint": hub.url, "token": False}}
    for level in ("size", "hash"):
        result = verify(copy, against="hf://org/mixtral", level=level, **options)
        assert result.ok and result.findings == (), (level, result.findings)
        assert result.source_kind == "hub"
    assert hub.content_bytes == 0
    # Every file was compared by what the Hub records: SHA-256 for LFS, git SHA-1 otherwise.
    hashed = verify(copy, against="hf://org/mixtral", level="hash", **options)
    assert set(hashed.table["status"]) == {"ok"} and len(hashed.table) == 7
    block_from_other_shard(copy / SHARD, copy / OTHER)
    (copy / CONFIG_NAME).write_text((copy / CONFIG_NAME).read_text().replace("1", "2", 1))
    damaged = verify(copy, against="hf://org/mixtral@main", level="hash", **options)
    assert {(f.code, f.file) for f in damaged.findings} == {
        ("file-hash-mismatch", SHARD),
        ("file-hash-mismatch", CONFIG_NAME),
    }
    assert hub.content_bytes == 0


def test_an_s3_upload_against_the_local_original(
    tmp_path: Path, s3_store: S3Store, aws_env: None
) -> None:
    bucket = s3_store.bucket("uploads")
    upload = tmp_path / "upload"
    shutil.copytree(MIXTRAL, upload)
    zeros_over_range(upload / SHARD, upload / OTHER)
    s3_store.put_folder(upload, bucket, "mixtral")
    options = {"storage_options": {"endpoint_url": s3_store.url}}
    url = f"s3://{bucket}/mixtral"
    assert verify(url, against=str(MIXTRAL), level="size", **options).ok
    result = verify(url, against=str(MIXTRAL), level="hash", **options)
    assert [(f.code, f.file) for f in result.findings] == [("file-hash-mismatch", SHARD)]
    tensor = verify(url, against=str(MIXTRAL), level="tensor", **options)
    assert codes(tensor) == {"tensor-hash-mismatch"}


# -- the "verified" line: Overview facts, HTML report, Markdown summary -----------------------


def test_verified_line_in_overview_report_and_summary(copy: Path) -> None:
    def lines(scanned: object) -> tuple[str, str, str]:
        return (
            facts_html(scanned),  # type: ignore[arg-type]
            render_html_report(scanned, []),  # type: ignore[arg-type]
            markdown_summary(scanned, []),  # type: ignore[arg-type]
        )

    for text in lines(scan(copy)):
        assert "not verified: no ckpt-inspect-manifest.json" in text
    write_manifest(copy)
    for text in lines(scan(copy)):
        assert "not verified yet: the folder keeps ckpt-inspect-manifest.json" in text
    result = verify(copy, level="tensor")
    for text in lines(scan(copy)):
        assert f"verified {result.when} at level tensor against manifest" in text
        assert "7 files" not in text and "41 tensors, all tensors match" in text
    zeros_over_range(copy / SHARD, copy / OTHER)
    verify(copy, level="hash")
    for text in lines(scan(copy)):
        assert "at level hash" in text and "1 error finding" in text


# -- writers keep the manifest true: re-sharding, repair, consolidation ------------------------


def test_reshard_refreshes_the_manifest_and_keeps_every_tensor_hash(copy: Path) -> None:
    write_manifest(copy)
    plan = plan_reshard(scan(copy), max_shard_size="8kB")
    plan.execute(model=False)  # the re-check's load verdict is not under test here
    manifest = parse_manifest((copy / MANIFEST_NAME).read_bytes())
    on_disk = {p.name for p in copy.iterdir() if p.is_file() and p.name != MANIFEST_NAME}
    assert set(manifest.files) == on_disk
    for level in ("size", "hash", "tensor"):
        assert verify(copy, level=level).findings == (), level


def test_reshard_of_a_damaged_shard_still_names_the_tensor(copy: Path) -> None:
    write_manifest(copy)
    _, _, spans = data_region(copy / SHARD)
    lo, hi = zeros_over_range(copy / SHARD, copy / OTHER)
    plan_reshard(scan(copy), max_shard_size="8kB").execute(model=False)
    # The new shards were hashed as written, but the tensors keep what was recorded.
    assert verify(copy, level="hash").findings == ()
    result = verify(copy, level="tensor")
    assert codes(result) == {"tensor-hash-mismatch"}
    assert {f.tensor for f in result.findings} <= touched(spans, lo, hi)


def test_repair_refreshes_only_what_it_wrote(copy: Path) -> None:
    from inspector._internal.plans.repair import plan_repair

    write_manifest(copy)
    index = copy / INDEX_NAME
    doc = json.loads(index.read_text())
    doc["weight_map"].pop(next(iter(doc["weight_map"])))
    index.write_text(json.dumps(doc))
    zeros_over_range(copy / SHARD, copy / OTHER)  # damage the repair did not make
    plan_repair(scan(copy)).execute(model=False)  # no model built for the re-check
    result = verify(copy, level="hash")
    # The rebuilt index is recorded anew; the damaged shard still fails its recorded hash.
    assert [(f.code, f.file) for f in result.findings] == [("file-hash-mismatch", SHARD)]


def test_consolidation_carries_the_source_manifest(tmp_path: Path) -> None:
    src = tmp_path / "src"
    shutil.copytree(DCP, src)
    write_manifest(src)
    dest = tmp_path / "out"
    plan_consolidation(scan(src), dest).execute(progress=False, verify=False)
    assert (dest / MANIFEST_NAME).is_file()
    for level in ("size", "hash", "tensor"):
        assert verify(dest, level=level).findings == (), level


def test_a_source_without_hashes_lists_each_file_once_in_linear_time(tmp_path: Path) -> None:
    """A source that records sizes but no hash (a Hub listing without checksums): every file
    is one `unchecked` row, a `file-not-verified` finding (folded), and the note counts them.
    20,000 files: the row lookup per file was a scan of all rows (minutes here), now a set
    (well under a second; figures in the commit)."""
    from inspector._internal.integrity.hashing import Listing
    from inspector._internal.integrity.manifest import FileRecord
    from inspector._internal.integrity.verify import _Run, _Source
    from inspector._internal.storage import LocalStorage

    files: dict[str, int | None] = {f"shard-{i:05d}.safetensors": 100 for i in range(20_000)}
    source = _Source(kind="manifest", shown="m", files={k: FileRecord(100) for k in files})
    run = _Run(LocalStorage(tmp_path), Listing(files=files), source, workers=1, progress=False)
    run.files(hashes=True)
    assert [r[1] for r in run.rows] == sorted(files)
    assert {r[4] for r in run.rows} == {"unchecked"}
    assert run.notes[0].startswith("20,000 files compared by size only")
    assert {f.code for f in run.findings} == {"file-not-verified"} and len(run.findings) == 20_000
    folded = run.folded()
    assert len(folded) == 201
    assert folded[-1].message.startswith("19,800 more files (e.g. shard-00200")


# -- every command that rewrites files keeps the manifest true, from the CLI -------------------


def _lose_a_tensor(folder: Path) -> str:
    """`folder` (a Mixtral copy) without one tensor of its last shard, as an export that lost
    it; returns its name."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    shard = folder / "model-00004-of-00004.safetensors"
    with safe_open(str(shard), "pt") as handle:
        metadata = handle.metadata()
    tensors = load_file(shard)
    lost = "model.norm.weight"
    del tensors[lost]
    save_file(tensors, str(shard), metadata=metadata)
    index = folder / INDEX_NAME
    doc = json.loads(index.read_text())
    del doc["weight_map"][lost]
    index.write_text(json.dumps(doc))
    return lost


def _manifest_is_true(folder: Path, *, against: Path | None = None) -> None:
    manifest = parse_manifest((folder / MANIFEST_NAME).read_bytes())
    on_disk = {
        p.relative_to(folder).as_posix()
        for p in folder.rglob("*")
        if p.is_file() and p.name != MANIFEST_NAME and ".ckpt-inspect-backup" not in p.parts
    }
    assert set(manifest.files) == on_disk
    assert set(manifest.tensors) == set(scan(folder).tensors["name"])
    for level in ("size", "hash", "tensor"):
        assert verify(folder, level=level).findings == (), level
    if against is not None:
        assert verify(folder, against=str(against), level="tensor").findings == ()


@pytest.mark.parametrize("command", ["index", "reshard", "from"])
def test_cli_repair_reshard_and_restore_refresh_the_manifest(
    copy: Path, tmp_path: Path, command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    if command == "index":
        index = copy / INDEX_NAME
        doc = json.loads(index.read_text())
        doc["weight_map"].pop(next(iter(doc["weight_map"])))
        index.write_text(json.dumps(doc))
        args = ["--only", "index"]
    elif command == "reshard":
        args = ["--only", "reshard", "--max-shard-size", "8kB"]
    else:
        _lose_a_tensor(copy)
        args = ["--from", str(MIXTRAL), "--verify-data"]
    write_manifest(copy)
    before = parse_manifest((copy / MANIFEST_NAME).read_bytes())
    # The manifest is under test, not the re-check's load verdict: no model is built.
    assert main(["repair", str(copy), *args, "--yes", "--no-model"]) == 0, capsys.readouterr().out
    written = capsys.readouterr().out.split("written: ", 1)[1].splitlines()[0].split(", ")
    after = parse_manifest((copy / MANIFEST_NAME).read_bytes())
    assert set(written) <= set(after.files)
    # What the command did not write keeps its recorded entry; what it wrote is recorded anew.
    for rel, rec in after.files.items():
        if rel not in written and rel in before.files:
            assert rec == before.files[rel], rel
    _manifest_is_true(copy, against=MIXTRAL)


def _dcp_with_manifest(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    shutil.copytree(DCP, src)
    write_manifest(src)
    return src


@pytest.mark.parametrize("extra", [[], ["--dtype", "fp16"]], ids=["same-dtype", "cast"])
def test_cli_consolidation_writes_the_manifest_and_runs_again_over_it(
    tmp_path: Path, extra: list[str]
) -> None:
    src = _dcp_with_manifest(tmp_path)
    dest = tmp_path / "out"
    run = ["consolidate", str(src), str(dest), "--no-progress", "--verify-data", *extra]
    assert main(run) == 0
    _manifest_is_true(dest, against=None if extra else src)
    # Its own manifest in DEST is part of its output: running again (a resume, or a
    # re-run after an interruption) is not refused over it, and leaves it true.
    assert main([*run, "--resume"]) == 0
    _manifest_is_true(dest, against=None if extra else src)
    # A DEST manifest is refreshed even when the source has none (the outputs were
    # rewritten under it).
    (src / MANIFEST_NAME).unlink()
    assert main([*run, "--overwrite"]) == 0
    _manifest_is_true(dest)


def test_consolidation_records_what_it_copied_not_what_the_source_kept(tmp_path: Path) -> None:
    """The source's manifest records `config.json` at its root; DEST's `config.json` is the
    copy of `.hf_metadata/config.json`, another file: DEST's manifest records what was
    written there, not the source's entry of the same name."""
    src = tmp_path / "src"
    shutil.copytree(DCP, src)
    (src / HF_METADATA_DIR).mkdir()
    (src / HF_METADATA_DIR / CONFIG_NAME).write_text('{"model_type": "llama", "step": 2}')
    (src / CONFIG_NAME).write_text('{"model_type": "llama", "step": 1}')
    write_manifest(src)
    dest = tmp_path / "out"
    plan_consolidation(scan(src), dest).execute(progress=False)
    assert json.loads((dest / CONFIG_NAME).read_text())["step"] == 2
    _manifest_is_true(dest, against=src)


# -- one tensor hash for the whole project: manifest, verify, consolidate --verify-data, diff --


def test_one_tensor_hash_everywhere(copy: Path) -> None:
    """The hash `diff --data`, `--deep` and `consolidate --verify-data` take from `TensorData`
    is the manifest's, and no other module hashes tensors with its own function."""

    manifest = parse_manifest(write_manifest(copy).read_bytes())
    with tensor_data(scan(copy)) as data:
        for name, record in manifest.tensors.items():
            assert data.tensor_hash(name) == record.hash, name
    package = Path(__file__).resolve().parent.parent / "inspector"
    users = sorted(
        p.relative_to(package).as_posix()
        for p in package.rglob("*.py")
        if "xxhash" in p.read_text(encoding="utf-8")
    )
    assert users == ["_internal/formats/tensordata.py"]


@pytest.mark.parametrize("where", ["output", "source-read"])
def test_consolidate_verify_data_names_a_tensor_damaged_after_writing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """The output's bytes of one tensor changed between writing and verification (a bad
    disk, a concurrent writer), or the verification's read of the source gave other bytes:
    `--verify-data` names that tensor and only it."""
    from inspector._internal.formats.tensordata import TensorData
    from inspector._internal.plans.consolidate import engine

    dest = tmp_path / "out"
    plan = plan_consolidation(scan(DCP), dest)
    victim = sorted(t.name for o in plan.outputs for t in o.tensors)[3]
    real_recheck = engine.recheck

    def damage_then_verify(*args: object, **kwargs: bool) -> object:
        out = scan(dest)
        shard = next(s for s in out.shards if victim in s.names)
        at = shard.data_start + int(shard.begins[shard.names.index(victim)])
        data = bytearray((dest / shard.file).read_bytes())
        data[at] ^= 0x40
        (dest / shard.file).write_bytes(data)
        return real_recheck(*args, **kwargs)  # type: ignore[arg-type]

    if where == "output":
        monkeypatch.setattr(engine, "recheck", damage_then_verify)
    else:
        real_bytes = TensorData.tensor_bytes

        def wrong_source(self: TensorData, name: str) -> memoryview | None:
            raw = real_bytes(self, name)
            if raw is None or name != victim or not self.chunks:
                return raw
            changed = bytearray(raw)
            changed[-1] ^= 0x01
            return memoryview(bytes(changed))

        monkeypatch.setattr(TensorData, "tensor_bytes", wrong_source)
    result = plan.execute(progress=False, verify_data=True)
    assert result.data_mismatches == (victim,)
    assert not result.ok and result.data_checked == len(plan.weight_map)
    assert f"1 mismatch: {victim}" in str(result)


def test_verify_speaks_in_counted_plurals(copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from test_words import bad_forms

    write_manifest(copy)
    flip_byte(copy / SHARD, copy / OTHER)
    for level in ("hash", "tensor"):
        assert main(["verify", str(copy), "--level", level]) == 1
    out = capsys.readouterr().out
    assert re.search(r"\b1 error finding\b(?!s)", out), out
    assert bad_forms(out) == [], bad_forms(out)
    # No text the core or the UI shows (a string literal, docstrings aside) says "(s)".
    root = Path(__file__).resolve().parent.parent
    wrong = [
        f"{path.relative_to(root)}:{line}"
        for folder in ("inspector", "widgets")
        for path in sorted((root / folder).rglob("*.py"))
        for line, text in _shown_strings(path)
        if re.search(r"[a-z]\(s\)", text.replace("http(s)", ""))
    ]
    assert wrong == [], wrong


def _shown_strings(path: Path) -> Iterator[tuple[int, str]]:
    """(line, text) of every string literal of a module (f-strings' literal parts included),
    docstrings left out."""
    import ast

    tree = ast.parse(path.read_text(encoding="utf-8"))
    docs = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            docs.add(id(body[0].value))
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            yield node.lineno, node.value


# -- issue 31: "all match" only when every byte a loader reads was compared ------------------


def _two_shards(write_state_dict: Callable[..., Path]) -> Path:
    """huggingface_hub's writer, two shards: `x.weight` and `z.weight` in the first (so the
    index keeps naming it whatever one entry says), `y.weight` in the second; a manifest."""
    import torch

    state = {
        "x.weight": torch.arange(64, dtype=torch.float32).reshape(8, 8),
        "z.weight": torch.zeros(8, 8),
        "y.weight": torch.ones(8, 24),
    }
    folder = write_state_dict(state, folder="good", max_shard_size=600)
    index = json.loads((folder / INDEX_NAME).read_text())
    assert set(index["weight_map"].values()) == set(_SHARDS)
    assert index["weight_map"]["x.weight"] == index["weight_map"]["z.weight"]
    write_manifest(folder)
    return folder


def _send_x_elsewhere(good: Path, shard: str, value: float) -> Path:
    """A copy of `good` with a new shard (safetensors' own writer) holding `x.weight` filled
    with `value`, and the index's `x.weight` pointed at it."""
    import torch
    from safetensors.torch import save_file

    bad = good.parent / f"bad-{shard}"
    shutil.copytree(good, bad)
    save_file({"x.weight": torch.full((8, 8), value)}, str(bad / shard), metadata={"format": "pt"})
    path = bad / INDEX_NAME
    index = json.loads(path.read_text())
    index["weight_map"]["x.weight"] = shard
    path.write_text(json.dumps(index))
    return bad


@pytest.mark.parametrize(
    ("shard", "kept"),
    [
        # Sorts last: transformers keeps its copy (the attack of issue 31, item 2).
        ("model-00003-of-00003.safetensors", "new"),
        # Sorts first: transformers keeps the old copy, huggingface_hub's loader either.
        ("a-model.safetensors", "old"),
    ],
)
def test_a_tensor_sent_to_other_bytes_is_never_all_match(
    write_state_dict: Callable[..., Path],
    capsys: pytest.CaptureFixture[str],
    shard: str,
    kept: str,
) -> None:
    """Before: the tensor hash was taken from the first shard in scan order holding the
    name, so `verify --level tensor` said "2 files, 2 tensors, all match" (exit 0) while
    transformers loaded the new values. Now every copy in a shard a loader reads is
    compared, the name held twice is a finding, and the manifest records the copy
    transformers keeps (`loaded_shards`: the last file in name order, whatever the index
    entry says)."""
    from inspector._internal.checkpoint.loaded import loaded_shards

    good = _two_shards(write_state_dict)
    bad = _send_x_elsewhere(good, shard, 7.0)
    first = _holder(good, "x.weight")
    scanned = scan(bad)
    assert [s.file for s in loaded_shards(scanned)] == sorted([*_SHARDS, shard])
    for against in (None, str(good)):
        result = verify(bad, level="tensor", against=against)
        assert not result.ok and not result.all_match, result.line()
        assert "all match" not in result.line()
        found = {(f.code, f.file, f.tensor) for f in result.findings}
        assert ("tensor-hash-mismatch", shard, "x.weight") in found
        assert ("duplicate-tensor", min(first, shard), "x.weight") in found
        # The copy that kept its bytes is compared too, and matches.
        assert ("tensor", "x.weight", first, None, "ok") in {r[:5] for r in result.rows}
        assert main(["verify", str(bad), "--level", "tensor"]) == 1
    out = capsys.readouterr().out
    assert "transformers keeps the copy in " + max(first, shard) in out
    # A manifest of the attacked folder records the copy transformers loads.
    manifest = parse_manifest(write_manifest(bad).read_bytes())
    assert manifest.tensors["x.weight"].file == (shard if kept == "new" else first)


def test_same_bytes_in_a_second_shard_are_still_a_duplicate(
    write_state_dict: Callable[..., Path],
) -> None:
    good = _two_shards(write_state_dict)
    bad = _send_x_elsewhere(good, "model-00003-of-00003.safetensors", 0.0)
    import torch
    from safetensors.torch import save_file

    # The same values as the original copy: every copy matches, the name held twice is said.
    x = torch.arange(64, dtype=torch.float32).reshape(8, 8)
    save_file({"x.weight": x}, str(bad / "model-00003-of-00003.safetensors"))
    result = verify(bad, level="tensor", against=str(good))
    assert [f.code for f in result.findings] == ["duplicate-tensor"]
    assert {r[4] for r in result.rows} == {"ok"} and not result.all_match


_SHARDS = ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")


def _holder(folder: Path, name: str) -> str:
    index = json.loads((folder / INDEX_NAME).read_text())
    return str(index["weight_map"][name])


def test_an_index_entry_leaving_the_folder_is_never_all_match(
    write_state_dict: Callable[..., Path],
) -> None:
    """transformers would read `../outside.safetensors`; the scan refuses it, so the tensor a
    loader gets is unknown: said (`index-unsafe-path`), never "all match"."""
    import torch
    from safetensors.torch import save_file

    good = _two_shards(write_state_dict)
    bad = good.parent / "bad"
    shutil.copytree(good, bad)
    save_file({"x.weight": torch.full((8, 8), 7.0)}, str(good.parent / "outside.safetensors"))
    path = bad / INDEX_NAME
    index = json.loads(path.read_text())
    index["weight_map"]["x.weight"] = "../outside.safetensors"
    path.write_text(json.dumps(index))
    result = verify(bad, level="tensor")
    assert "index-unsafe-path" in codes(result) and not result.ok
    assert "all match" not in result.line()
    # Even where the manifest recorded that very index: the bytes outside were never compared.
    write_manifest(bad)
    recorded = verify(bad, level="hash")
    assert codes(recorded) == {"index-unsafe-path"} and not recorded.all_match


def test_a_file_the_source_does_not_list_is_never_all_match(
    write_state_dict: Callable[..., Path],
) -> None:
    """At level hash a file the manifest does not record is a warning, and the line names
    the warning instead of "all match" (before: "all match", as only errors counted); at
    level tensor the tensors of a shard a loader reads are all compared, and one the source
    does not record is a warning too."""
    import torch
    from safetensors.torch import save_file

    good = _two_shards(write_state_dict)
    bad = good.parent / "bad"
    shutil.copytree(good, bad)
    save_file({"w.weight": torch.ones(4)}, str(bad / "model-00003-of-00003.safetensors"))
    path = bad / INDEX_NAME
    index = json.loads(path.read_text())
    index["weight_map"]["w.weight"] = "model-00003-of-00003.safetensors"
    path.write_text(json.dumps(index))
    write_manifest(good)  # the folder's own manifest is the good one's
    shutil.copy(good / MANIFEST_NAME, bad / MANIFEST_NAME)
    for level in ("size", "hash", "tensor"):
        result = verify(bad, level=level, against=str(good / MANIFEST_NAME))
        assert not result.all_match and "all match" not in result.line(), level
        assert "warning finding" in result.line() or not result.ok, level
    extra = verify(bad, level="tensor", against=str(good))
    assert ("tensor-extra-vs-source", "w.weight") in {(f.code, f.tensor) for f in extra.findings}
    assert main(["verify", str(bad), "--level", "tensor", "--fail-on", "warning"]) == 1


# -- item 4: a source without a hash -------------------------------------------------------


def test_a_listing_without_checksums_never_says_match(copy: Path, hub_server: FakeHub) -> None:
    """A Hub listing entry without `lfs.oid` (or with one of the wrong length, whose `oid` is
    the pointer's SHA-1, not the content's) left "all match (compared by size only)", exit
    0, over a damaged file. Now: `file-not-verified` (a warning: exit 1 under --fail-on
    warning), and `--download` hashes the Hub's copy, which names the damage."""

    def no_checksum(item: dict) -> dict:
        if item["path"] == SHARD:
            item["lfs"].pop("oid")
        if item["path"] == OTHER:
            item["lfs"]["oid"] = item["lfs"]["oid"][:40]  # the length of a SHA-1
        return item

    block_from_other_shard(copy / SHARD, copy / OTHER)
    with hub_server.serving({"org/mixtral": {"main": (SHA, MIXTRAL)}}, entry=no_checksum) as hub:
        options = {"storage_options": {"endpoint": hub.url, "token": False}}
        result = verify(copy, against="hf://org/mixtral", level="hash", **options)
        assert result.ok and not result.all_match and hub.content_bytes == 0
        assert {(f.code, f.file) for f in result.findings} == {
            ("file-not-verified", SHARD),
            ("file-not-verified", OTHER),
        }
        assert "2 warning findings" in result.line() and "all match" not in result.line()
        args = ["verify", str(copy), "--against", "hf://org/mixtral"]
        args += ["--storage-option", f"endpoint={hub.url}", "--storage-option", "token=false"]
        assert main(args) == 0
        assert main([*args, "--fail-on", "warning"]) == 1
        downloaded = verify(copy, against="hf://org/mixtral", download=True, **options)
        assert {(f.code, f.file) for f in downloaded.findings} == {("file-hash-mismatch", SHARD)}
        # Only the two files without a checksum were read.
        assert hub.content_bytes == sum((MIXTRAL / f).stat().st_size for f in (SHARD, OTHER))


# -- item 5: the Hub at level tensor downloads only when asked -----------------------------


def test_hub_tensor_level_without_a_manifest_downloads_nothing(
    copy: Path, tmp_path: Path, hub_server: FakeHub, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: `--level tensor` against a repository without a manifest scanned and hashed
    every weight on the Hub (docs/verify.md said nothing is downloaded), and a published
    manifest that did not parse was ignored in silence before the same download."""
    broken = tmp_path / "broken"
    shutil.copytree(MIXTRAL, broken)
    (broken / MANIFEST_NAME).write_text('{"format": "checkpoint-inspector-manifest"')
    repos = {"org/plain": {"main": (SHA, MIXTRAL)}, "org/broken": {"main": (SHA, broken)}}
    zeros_over_range(copy / SHARD, copy / OTHER)
    with hub_server.serving(repos) as hub:
        options = {"storage_options": {"endpoint": hub.url, "token": False}}
        plain = verify(copy, against="hf://org/plain", level="tensor", **options)
        assert hub.content_bytes == 0
        assert plain.level == "hash" and "keeps no ckpt-inspect-manifest.json" in plain.note
        assert [(f.code, f.file) for f in plain.findings] == [("file-hash-mismatch", SHARD)]
        bad = verify(copy, against="hf://org/broken", level="tensor", **options)
        assert hub.content_bytes == (broken / MANIFEST_NAME).stat().st_size  # that file only
        assert codes(bad) == {"manifest-unreadable", "file-hash-mismatch"}
        assert bad.level == "hash" and "cannot be used" in bad.note
        # Asked: the weights are read and the tensors compared.
        args = ["verify", str(copy), "--against", "hf://org/plain", "--level", "tensor"]
        args += ["--storage-option", f"endpoint={hub.url}", "--storage-option", "token=false"]
        capsys.readouterr()
        assert main([*args, "--download", "--json"]) == 1
        doc = json.loads(capsys.readouterr().out)
        assert doc["level"] == "tensor" and hub.content_bytes > 0
        assert {f["code"] for f in doc["findings"]} == {"tensor-hash-mismatch"}


# -- item 8: verify without a source prints what check prints, bounded -----------------------


def test_many_damaged_files_print_a_bounded_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """1,000 empty shards and no source: 1,001 lines before, 800 of them "header-unreadable:
    1 more files" (20,000 gave 857 KB); now the heading, ten messages and a count, as
    `check` prints them, with every finding in --json."""
    folder = tmp_path / "empty"
    folder.mkdir()
    for i in range(1000):
        (folder / f"model-{i:05d}-of-01000.safetensors").touch()
    assert main(["verify", str(folder)]) == 1
    out = capsys.readouterr().out
    assert len(out.splitlines()) <= 15 and "1 more files" not in out, out
    assert "ERROR header-unreadable (1,000 findings, one per file)" in out
    assert "... 990 more (use --json for all)" in out
    assert main(["verify", str(folder), "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert len(doc["findings"]) == 1000 and not doc["all_match"]


def test_many_mismatching_files_fold_into_one_summary(copy: Path) -> None:
    """300 files that differ from the manifest: 200 listed (the policy's per-code count),
    the other 100 one summary (before: one "1 more files" finding each past the 200th)."""
    from inspector._internal.integrity.manifest import FileRecord, Manifest, manifest_bytes

    names = [f"extra-{i:04d}.json" for i in range(300)]
    for name in names:
        (copy / name).write_text("{}")
    write_manifest(copy)
    manifest = parse_manifest((copy / MANIFEST_NAME).read_bytes())
    wrong = {n: FileRecord(2, "0" * 64) if n in names else r for n, r in manifest.files.items()}
    (copy / MANIFEST_NAME).write_bytes(manifest_bytes(Manifest(wrong, manifest.tensors)))
    result = verify(copy, level="hash")
    assert [f.code for f in result.findings] == ["file-hash-mismatch"] * 201
    (summary,) = [f for f in result.findings if f.file is None]
    assert summary.message.startswith("100 more files (e.g. extra-0200")


def test_a_bin_that_says_big_endian_never_matches_at_tensor_level(tmp_path: Path) -> None:
    """The same tensor bytes under a `byteorder` record saying "big": torch.load swaps every
    tensor, so the values it gives are not the recorded ones, and no tensor may "match"."""
    import zipfile

    import torch

    folder = tmp_path / "ckpt"
    folder.mkdir()
    path = folder / "pytorch_model.bin"
    torch.save({"x.weight": torch.arange(8, dtype=torch.float32)}, path)
    write_manifest(folder)
    before = verify(folder, level="tensor")
    assert before.ok and "all match" in before.line()
    with zipfile.ZipFile(path) as archive:
        records = [(i.filename, archive.read(i)) for i in archive.infolist()]
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in records:
            archive.writestr(name, b"big" if name.endswith("/byteorder") else data)
    loaded = torch.load(path, weights_only=True)["x.weight"]
    assert not torch.equal(loaded, torch.arange(8, dtype=torch.float32))  # torch swapped them
    result = verify(folder, level="tensor")
    assert not result.ok and result.mismatches and "match" not in result.line(), result.line()


@pytest.mark.parametrize(
    "shard",
    [".model-00001-of-00001.safetensors.tmp-1", ".cache/m.safetensors", ".git/m.safetensors"],
)
def test_a_shard_where_the_listing_skips_is_verified(tmp_path: Path, shard: str) -> None:
    # The listing skips temp-named files, `.cache`, `.git`; an index may name a shard there
    # and a loader reads it: its bytes changed and verify said "all match".
    import numpy as np
    from safetensors.numpy import save_file

    folder = tmp_path / "ckpt"
    (folder / shard).parent.mkdir(parents=True)
    save_file({"w": np.arange(4, dtype=np.float32)}, str(folder / shard))
    index = {"metadata": {"total_size": 16}, "weight_map": {"w": shard}}
    (folder / INDEX_NAME).write_text(json.dumps(index))
    write_manifest(folder)
    data = bytearray((folder / shard).read_bytes())
    data[-1] ^= 0xFF
    (folder / shard).write_bytes(bytes(data))
    result = verify(folder, level="hash")
    assert not result.ok and not result.all_match
    assert result.mismatches == 1
