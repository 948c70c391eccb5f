"""Consolidating into a hostile or occupied DEST (issue 9, item 7): an existing checkpoint
as DEST, a link planted under an output's `.partial` name, a DEST that is a link. Each test
builds the minimal folder itself; nothing outside DEST may change, and nothing in DEST may
be replaced without `--overwrite` (and then only after a backup)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from dcp_writers import MAPPING, full_tensors
from test_consolidate import _reference, load_all

from inspector._internal.cli.main import main
from inspector._internal.common.filenames import CONFIG_NAME, INDEX_NAME
from inspector._internal.plans.consolidate import ConsolidationPlan, plan_consolidation
from inspector._internal.plans.consolidate.engine import Dest
from inspector._internal.scan.entry import scan
from inspector.errors import PlanRefusedError, UnsafeInputError

ONE_FILE = "model-00001-of-00001.safetensors"
BACKUP = ".ckpt-inspect-backup"


@pytest.fixture(scope="module")
def source(dcp_checkpoint: Path) -> Path:
    return dcp_checkpoint


def snapshot(folder: Path) -> dict[str, bytes | str]:
    """Every entry below `folder`: file bytes, or where a link points (never followed)."""
    out: dict[str, bytes | str] = {}
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder).as_posix()
        if path.is_symlink():
            out[rel] = "-> " + os.readlink(path)
        elif path.is_file():
            out[rel] = path.read_bytes()
    return out


def existing_checkpoint(folder: Path) -> Path:
    """Somebody's Hugging Face checkpoint: two shards, an index, a config, a tokenizer."""
    _reference(
        folder,
        {1: "model-00001-of-00002.safetensors", 2: "model-00002-of-00002.safetensors"},
    )
    (folder / CONFIG_NAME).write_text('{"model_type": "theirs"}')
    (folder / "tokenizer.json").write_text('{"version": "1.0"}')
    return folder


def one_file_plan(source: Path, dest: Path) -> ConsolidationPlan:
    return plan_consolidation(scan(source), dest, mapping=dict.fromkeys(MAPPING, 1))


def test_an_existing_checkpoint_as_dest_is_refused_then_backed_up_with_overwrite(
    source: Path, tmp_path: Path
) -> None:
    dest = existing_checkpoint(tmp_path / "theirs")
    before = snapshot(dest)
    plan = plan_consolidation(scan(source), dest)
    with pytest.raises(PlanRefusedError) as info:
        plan.execute(progress=False)
    message = str(info.value)
    assert "config.json (other content than this plan writes)" in message
    assert INDEX_NAME in message and "tokenizer.json" in message
    assert "--overwrite" in message and "\n" not in message
    assert snapshot(dest) == before  # not one byte written, nothing created

    result = plan.execute(progress=False, overwrite=True)
    assert result.ok and len(result.written) == 2
    got = load_all(dest)
    assert all(torch.equal(got[n], t) for n, t in full_tensors().items())
    # Every file a written one replaced was moved, byte for byte, into the backup folder;
    # tokenizer.json (no name we write) stayed where it was.
    assert result.backup is not None and result.backup.parent == dest / BACKUP
    replaced = (
        CONFIG_NAME,
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
        INDEX_NAME,
    )
    assert sorted(result.replaced) == sorted(replaced)
    assert snapshot(result.backup) == {n: before[n] for n in replaced}
    assert (dest / "tokenizer.json").read_bytes() == before["tokenizer.json"]
    assert "the originals are in" in str(result)


def test_a_second_run_of_the_same_plan_needs_no_overwrite(source: Path, tmp_path: Path) -> None:
    dest = tmp_path / "out"
    plan = plan_consolidation(scan(source), dest)
    plan.execute(progress=False, verify=False)
    # A temp file of the index left by a kill: ours while it holds a prefix of our index.
    (dest / ".model.safetensors.index.json.tmp-4242").write_bytes(
        (dest / INDEX_NAME).read_bytes()[:50]
    )
    result = plan.execute(progress=False)
    assert result.ok and result.backup is None and len(result.written) == 2
    (dest / ".model.safetensors.index.json.tmp-4242").write_bytes(b'{"weight_map": {}}')
    with pytest.raises(PlanRefusedError, match=r"index\.json\.tmp-4242 \(other content"):
        plan.execute(progress=False)


def test_a_link_planted_as_the_partial_output_is_never_written_through(
    source: Path, tmp_path: Path
) -> None:
    victim = tmp_path / "victim.bin"
    victim.write_bytes(b"precious")
    dest = tmp_path / "out"
    dest.mkdir()
    (dest / f"{ONE_FILE}.partial").symlink_to(victim)
    plan = one_file_plan(source, dest)
    assert [o.name for o in plan.outputs] == [ONE_FILE]
    with pytest.raises(PlanRefusedError, match=r"\.partial \(a symbolic link\)"):
        plan.execute(progress=False)
    assert victim.read_bytes() == b"precious"

    result = plan.execute(progress=False, overwrite=True)
    assert result.ok and result.written == (ONE_FILE,)
    assert victim.read_bytes() == b"precious"
    moved = result.backup / f"{ONE_FILE}.partial"
    assert moved.is_symlink() and os.readlink(moved) == str(victim)  # kept as it was
    assert (dest / ONE_FILE).is_file() and not (dest / ONE_FILE).is_symlink()
    got = load_all(dest)
    assert all(torch.equal(got[n], t) for n, t in full_tensors().items())


def test_a_link_planted_after_the_check_is_removed_not_followed(tmp_path: Path) -> None:
    """The race: a link appears under the partial name after DEST was checked."""
    victim = tmp_path / "victim.bin"
    victim.write_bytes(b"precious")
    dest = tmp_path / "out"
    with Dest.open(dest) as folder:
        (dest / f"{ONE_FILE}.partial").symlink_to(victim)
        fd = folder.open_partial(f"{ONE_FILE}.partial")
        os.write(fd, b"ours")
        os.close(fd)
    assert victim.read_bytes() == b"precious"
    assert not (dest / f"{ONE_FILE}.partial").is_symlink()
    assert (dest / f"{ONE_FILE}.partial").read_bytes() == b"ours"


def test_a_dest_that_is_a_link_is_refused(
    source: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    link = tmp_path / "out"
    link.symlink_to(elsewhere)
    with pytest.raises(UnsafeInputError, match=f"DEST is a symbolic link \\(to {elsewhere}\\)"):
        plan_consolidation(scan(source), link)
    # Planned while DEST was absent, swapped for a link before running: still refused.
    later = tmp_path / "later"
    plan = plan_consolidation(scan(source), later)
    later.symlink_to(elsewhere)
    with pytest.raises(UnsafeInputError, match="symbolic link"):
        plan.execute(progress=False, overwrite=True)
    assert list(elsewhere.iterdir()) == []
    # The command line: one line, exit 2, nothing written.
    assert main(["consolidate", str(source), str(link), "--no-progress", "--overwrite"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "DEST is a symbolic link" in err and "Traceback" not in err
    assert list(elsewhere.iterdir()) == []


def test_cli_refuses_an_occupied_dest_in_one_line(
    source: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dest = existing_checkpoint(tmp_path / "theirs")
    before = snapshot(dest)
    assert main(["consolidate", str(source), str(dest), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("ckpt-inspect: ")
    assert "DEST is not empty" in err and "--overwrite" in err
    assert snapshot(dest) == before
    assert main(["consolidate", str(source), str(dest), "--no-progress", "--overwrite"]) == 0
    assert "the originals are in" in capsys.readouterr().out


def test_a_backup_folder_that_is_a_link_is_refused(source: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    dest = existing_checkpoint(tmp_path / "theirs")
    (dest / BACKUP).symlink_to(elsewhere)
    before = snapshot(dest)
    plan = plan_consolidation(scan(source), dest)
    with pytest.raises(UnsafeInputError, match="not the backup folder"):
        plan.execute(progress=False, overwrite=True)
    assert list(elsewhere.iterdir()) == [] and snapshot(dest) == before


def test_a_dest_that_is_a_file_is_refused(source: Path, tmp_path: Path) -> None:
    dest = tmp_path / "model.safetensors"
    dest.write_bytes(b"somebody's file")
    with pytest.raises(UnsafeInputError, match="DEST exists and is not a folder"):
        plan_consolidation(scan(source), dest)
    assert dest.read_bytes() == b"somebody's file"
