"""Write journals are untrusted input too (issue 9, item 1): a journal shipped inside a
checkpoint, or a backup, staging or temp path planted as a link, must never make a repair
write, rename or read outside the folder; a journal we did not write is reported and left
for the user; our own interrupted batch is still finished by the next run."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import threading
from pathlib import Path

import numpy as np
import orjson
import pytest
from commands import run
from safetensors.numpy import save_file

from inspector._internal.common.filenames import CONFIG_NAME, INDEX_NAME
from inspector._internal.execution import atomic
from inspector._internal.plans.repair import plan_repair
from inspector._internal.scan.entry import scan
from inspector.errors import PlanRefusedError, UnsafeInputError

INDEX = INDEX_NAME


def drifted(folder: Path) -> Path:
    """Two shards whose index misses a tensor: `repair --only index` rewrites the index."""
    folder.mkdir(parents=True)
    weight_map = {}
    for i in (1, 2):
        name = f"model-{i:05d}-of-00002.safetensors"
        tensors = {f"model.layers.{i}.mlp.weight": np.ones((2, 2), np.float32)}
        save_file(tensors, str(folder / name), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(tensors, name))
    weight_map.pop("model.layers.2.mlp.weight")
    (folder / INDEX).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return folder


def one_line_error(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    return lines[0]


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    """A file outside the checkpoint that an attacker wants overwritten or moved in."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("do not touch")
    return outside


# -- a shipped journal -------------------------------------------------------------------


def test_shipped_old_style_journal_leaving_the_folder_is_refused(
    tmp_path: Path, victim: Path
) -> None:
    """The journal of the issue: overwrite a file outside, move another one in."""
    folder = drifted(tmp_path / "ckpt")
    (folder / "evil").write_text("attacker content")
    journal = {"renames": [["evil", "../outside/secret.txt"], ["../outside/secret.txt", "x"]]}
    (folder / atomic.JOURNAL).write_text(json.dumps(journal))
    index_before = (folder / INDEX).read_bytes()
    line = one_line_error(run("repair", folder, "--yes"))
    assert atomic.JOURNAL in line and "--recover" in line and "--discard-journal" in line
    assert (victim / "secret.txt").read_text() == "do not touch"
    assert not (folder / "x").exists() and (folder / "evil").exists()
    assert (folder / INDEX).read_bytes() == index_before  # the repair itself did not run


@pytest.mark.parametrize(
    ("src", "dst"),
    [
        ("/etc/hostname", "x"),
        ("evil", "../outside/secret.txt"),
        ("sub/../../outside/secret.txt", "x"),
        (".x.tmp-1", "x"),  # our temp name, but not for this writer's pid
        ("evil", ".ckpt-inspect-backup/not-a-stamp/evil"),
        ("evil", CONFIG_NAME),  # a replace whose source is not the temp we write
    ],
)
def test_foreign_entries_are_never_replayed_even_when_confirmed(
    tmp_path: Path, victim: Path, src: str, dst: str
) -> None:
    folder = drifted(tmp_path / "ckpt")
    (folder / "evil").write_text("attacker content")
    (folder / ".x.tmp-1").write_text("attacker content")
    forged = {
        "format": "ckpt-inspect-journal",
        "version": 2,
        "writer": {"host": "elsewhere", "uid": os.getuid(), "pid": 4242, "time": 0},
        "entries": [["replace", src, dst, 16, 1, 1, None]],
        "mac": "0" * 64,
    }
    (folder / atomic.JOURNAL).write_bytes(orjson.dumps(forged))
    journal = atomic.read_journal(folder)
    assert journal is not None and not journal.ours and journal.problems
    with pytest.raises(atomic.JournalError):
        atomic.recover(folder, confirmed=True)
    assert (victim / "secret.txt").read_text() == "do not touch"
    assert (folder / "evil").exists() and (folder / ".x.tmp-1").exists()
    assert not (folder / "x").exists()


def _forge(folder: Path, writes: dict[str, bytes], pid: int = 4242) -> None:
    """A well-formed journal with confined entries, as another machine would leave it: its
    temp files exist with the recorded content, but the MAC is not ours."""
    entries = []
    for rel, data in writes.items():
        tmp = f".{rel}.tmp-{pid}"
        (folder / tmp).write_bytes(data)
        info = (folder / tmp).stat()
        digest = hashlib.sha256(data).hexdigest()
        entries.append(["replace", tmp, rel, len(data), info.st_ino, info.st_mtime_ns, digest])
    forged = {
        "format": "ckpt-inspect-journal",
        "version": 2,
        "writer": {"host": "elsewhere", "uid": os.getuid(), "pid": pid, "time": 0},
        "entries": entries,
        "mac": "f" * 64,
    }
    (folder / atomic.JOURNAL).write_bytes(orjson.dumps(forged))


def test_confined_foreign_journal_is_shown_then_finished_or_discarded(tmp_path: Path) -> None:
    new_index = b'{"weight_map": {}}\n'
    first = drifted(tmp_path / "a")
    _forge(first, {INDEX: new_index})
    # Not ours: a repair refuses to start, naming what the journal would do.
    line = one_line_error(run("repair", first, "--yes"))
    assert f".{INDEX}.tmp-4242 -> {INDEX}" in line
    # --recover without --yes (no terminal) shows it and does nothing.
    shown = run("repair", first, "--recover")
    assert shown.returncode == 1 and "NOT verified as ours" in shown.stdout
    assert (first / atomic.JOURNAL).exists()
    # Confirmed: the confined, content-checked entry is finished.
    done = run("repair", first, "--recover", "--yes")
    assert done.returncode == 0, done.stderr
    assert (first / INDEX).read_bytes() == new_index
    assert not (first / atomic.JOURNAL).exists()

    second = drifted(tmp_path / "b")
    before = (second / INDEX).read_bytes()
    _forge(second, {INDEX: new_index})
    gone = run("repair", second, "--discard-journal", "--yes")
    assert gone.returncode == 0, gone.stderr
    assert not (second / atomic.JOURNAL).exists()
    assert (second / INDEX).read_bytes() == before
    assert run("repair", second, "--yes", "--only", "index").returncode == 0


def test_confirmed_recovery_checks_content(tmp_path: Path) -> None:
    folder = drifted(tmp_path / "ckpt")
    _forge(folder, {INDEX: b'{"weight_map": {}}\n'})
    (folder / f".{INDEX}.tmp-4242").write_bytes(b'{"weight_map": {"x": "y"}}\n')
    with pytest.raises(atomic.JournalError, match="changed since the journal was written"):
        atomic.recover(folder, confirmed=True)
    assert (folder / atomic.JOURNAL).exists()


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "folder"])
def test_journal_that_is_not_a_regular_file_is_refused_without_hanging(
    tmp_path: Path, kind: str
) -> None:
    folder = drifted(tmp_path / "ckpt")
    journal = folder / atomic.JOURNAL
    if kind == "fifo":
        os.mkfifo(journal)
    elif kind == "dev-zero":
        journal.symlink_to("/dev/zero")
    else:
        journal.mkdir()
    result: list[BaseException | None] = []

    def attempt() -> None:
        try:
            atomic.recover(folder)
            result.append(None)
        except BaseException as exc:
            result.append(exc)

    worker = threading.Thread(target=attempt, daemon=True)
    worker.start()
    worker.join(timeout=20)
    assert result, "recover() hung on the journal"
    assert isinstance(result[0], atomic.JournalError)
    assert "not a regular file" in str(result[0])


# -- our own journal -----------------------------------------------------------------------


def test_our_interrupted_batch_is_finished_and_a_changed_temp_is_not(tmp_path: Path) -> None:
    """Our own journal replays silently; the same journal after a temp file was swapped
    refuses (the temp's inode and SHA-256 are in the journal)."""
    folder = drifted(tmp_path / "ckpt")
    new = b'{"metadata": {}, "weight_map": {}}\n'
    pid = os.getpid()
    tmp = folder / f".{INDEX}.tmp-{pid}"
    tmp.write_bytes(new)
    entry = atomic.JournalEntry("replace", tmp.name, INDEX, *_ident(tmp), _sha(new))

    def journal_only(root, entries):  # write the journal, stop before renaming
        real = atomic.recover
        atomic.recover = lambda root, **kw: []
        try:
            atomic._run_journal(root, entries)
        finally:
            atomic.recover = real

    journal_only(folder, [entry])
    assert atomic.read_journal(folder).ours
    assert atomic.recover(folder) == [INDEX]
    assert (folder / INDEX).read_bytes() == new

    tmp.write_bytes(new)
    entry = atomic.JournalEntry("replace", tmp.name, INDEX, *_ident(tmp), _sha(new))
    journal_only(folder, [entry])
    tmp.unlink()
    tmp.write_bytes(b'{"hijacked": true}\n'.ljust(len(new)))
    with pytest.raises(atomic.JournalError, match="changed since"):
        atomic.recover(folder)
    assert (folder / INDEX).read_bytes() == new


def _ident(path: Path) -> tuple[int, int, int]:
    info = path.stat()
    return info.st_size, info.st_ino, info.st_mtime_ns


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_a_journal_edited_by_hand_is_not_ours(tmp_path: Path) -> None:
    folder = drifted(tmp_path / "ckpt")
    plan = plan_repair(scan(folder))
    plan.execute()
    new = b"{}\n"
    tmp = folder / f".{INDEX}.tmp-{os.getpid()}"
    tmp.write_bytes(new)
    real = atomic.recover
    atomic.recover = lambda root, **kw: []
    try:
        atomic._run_journal(
            folder, [atomic.JournalEntry("replace", tmp.name, INDEX, *_ident(tmp), _sha(new))]
        )
    finally:
        atomic.recover = real
    doc = orjson.loads((folder / atomic.JOURNAL).read_bytes())
    doc["writer"]["time"] += 1
    (folder / atomic.JOURNAL).write_bytes(orjson.dumps(doc))
    assert not atomic.read_journal(folder).ours
    with pytest.raises(atomic.JournalError, match="not written by this user on this machine"):
        atomic.recover(folder)


# -- planted links -------------------------------------------------------------------------


def test_backup_folder_planted_as_a_link_is_refused(tmp_path: Path, victim: Path) -> None:
    folder = drifted(tmp_path / "ckpt")
    (folder / atomic.BACKUP_DIR).symlink_to(victim)
    line = one_line_error(run("repair", folder, "--yes", "--only", "index"))
    assert atomic.BACKUP_DIR in line and "symbolic link" in line
    assert sorted(p.name for p in victim.iterdir()) == ["secret.txt"]


def test_temp_name_planted_as_a_link_is_not_written_through(tmp_path: Path, victim: Path) -> None:
    """Temp names are predictable (`.<name>.tmp-<pid>`): a planted link is replaced, never
    followed."""
    folder = drifted(tmp_path / "ckpt")
    target = victim / "secret.txt"
    for pid in range(os.getpid(), os.getpid() + 1):
        (folder / f".{INDEX}.tmp-{pid}").symlink_to(target)
    plan_repair(scan(folder), only={"index"}).execute()
    assert target.read_text() == "do not touch"
    assert "model.layers.2.mlp.weight" in json.loads((folder / INDEX).read_text())["weight_map"]


def test_target_that_is_a_link_is_refused(tmp_path: Path, victim: Path) -> None:
    folder = drifted(tmp_path / "ckpt")
    text = (folder / INDEX).read_text()
    (victim / INDEX).write_text(text)
    (folder / INDEX).unlink()
    # A link out of the folder is not even read: the plan stops before anything is written.
    (folder / INDEX).symlink_to(victim / INDEX)
    with pytest.raises(PlanRefusedError, match="outside the checkpoint folder"):
        plan_repair(scan(folder), only={"index"})
    assert (victim / INDEX).read_text() == text
    # A link inside the folder is read, but never written through.
    (folder / INDEX).unlink()
    (folder / "kept").mkdir()
    (folder / "kept" / INDEX).write_text(text)
    (folder / INDEX).symlink_to(Path("kept") / INDEX)
    plan = plan_repair(scan(folder), only={"index"})
    with pytest.raises(UnsafeInputError, match="symbolic link"):
        plan.execute()
    assert (folder / "kept" / INDEX).read_text() == text


def test_reshard_staging_planted_as_a_link_is_refused(tmp_path: Path, victim: Path) -> None:
    from inspector._internal.plans.reshard import STAGING, plan_reshard

    folder = tmp_path / "ckpt"
    folder.mkdir()
    tensors = {f"model.layers.{i}.mlp.weight": np.ones((64, 64), np.float32) for i in range(4)}
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    plan = plan_reshard(scan(folder), max_shard_size=40_000)
    assert not plan.empty
    (folder / STAGING).symlink_to(victim)
    with pytest.raises(UnsafeInputError, match="symbolic link"):
        plan.execute()
    assert sorted(p.name for p in victim.iterdir()) == ["secret.txt"]
    assert (folder / "model.safetensors").exists()


def test_lock_file_planted_as_a_link_to_dev_zero_does_not_hang(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The real `repair` command, in a thread of this process that must end within the
    bound (a CLI process would import the package again: 2-3 s of CPU)."""
    from inspector._internal.cli.main import main

    folder = drifted(tmp_path / "ckpt")
    (folder / atomic.LOCK).symlink_to("/dev/zero")
    codes: list[int] = []
    args = ["repair", str(folder), "--yes", "--only", "index", "--no-model"]
    worker = threading.Thread(target=lambda: codes.append(main(args)), daemon=True)
    worker.start()
    worker.join(timeout=60)
    assert not worker.is_alive(), "repair hung on the planted lock"
    assert codes == [0], capsys.readouterr().err  # a lock with no readable pid is stale
    assert not os.path.lexists(folder / atomic.LOCK)  # replaced by a lock file, then removed
