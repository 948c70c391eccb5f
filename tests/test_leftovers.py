"""Temp files a killed run left (`execution/temps.py`): removed only when provably ours, and
everything that merely looks like them reported and left as it is. Each test builds the
hostile folder itself."""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from safetensors.numpy import save_file

from inspector._internal.checks import check
from inspector._internal.cli.main import main
from inspector._internal.common.filenames import BIN_INDEX_NAME, INDEX_NAME, JOURNAL
from inspector._internal.execution import temps
from inspector._internal.execution.atomic import folder_lock, recover_folder
from inspector._internal.execution.temps import (
    find_leftovers,
    parse_temp_name,
    remove_leftovers,
    temp_name_for,
)
from inspector._internal.scan.entry import scan
from inspector.errors import InspectorError


def _dead_pid() -> int:
    """The pid of a process that has exited and been reaped."""
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    return pid


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """A one-file safetensors checkpoint written by safetensors itself."""
    root = tmp_path / "ckpt"
    root.mkdir()
    save_file({"w": np.zeros((2, 2), np.float32)}, str(root / "model.safetensors"))
    return root


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A file of the user's outside the checkpoint folder, which nothing may touch."""
    path = tmp_path / "precious.txt"
    path.write_text("keep me")
    return path


def _names(root: Path) -> list[str]:
    return sorted(os.listdir(root))


def test_the_name_parses_back_exactly() -> None:
    assert parse_temp_name(temp_name_for(INDEX_NAME, 4242)) == (INDEX_NAME, 4242)
    assert parse_temp_name(temp_name_for(JOURNAL, 7)) == (JOURNAL, 7)
    # A target that itself holds ".tmp-": the pid is the last part, as the writer appends it.
    assert parse_temp_name(".a.tmp-1.tmp-2") == ("a.tmp-1", 2)
    for name in (
        f".{INDEX_NAME}.tmp-0123",  # a leading zero: no writer makes it
        f".{INDEX_NAME}.tmp-+12",
        f".{INDEX_NAME}.tmp- 12",
        f".{INDEX_NAME}.tmp-\uff11\uff12",  # fullwidth digits
        f".{INDEX_NAME}.tmp-\u0661\u0662",  # Arabic-Indic digits: int() would accept them
        f".{INDEX_NAME}.tmp\u2010123",  # a Unicode hyphen
        f".{INDEX_NAME}.tmp-99999999999",  # past any pid
        f".{INDEX_NAME}.tmp-0",
        f".sub/{INDEX_NAME}.tmp-12",  # a path separator
        f".{INDEX_NAME}\x00.tmp-12",
        f"{INDEX_NAME}.tmp-12",  # no leading dot
        "..tmp-12",  # no target
    ):
        assert parse_temp_name(name) is None, name
    # Linear, whatever the name (a crafted one repeats the suffix).
    assert parse_temp_name("." + ".tmp-1" * 200_000 + "x") is None


_TARGETS = st.text(min_size=1).filter(lambda t: "/" not in t and "\x00" not in t)


@given(target=_TARGETS, pid=st.integers(1, 2**31 - 1))
def test_the_name_round_trips(target: str, pid: int) -> None:
    assert parse_temp_name(temp_name_for(target, pid)) == (target, pid)


@given(name=st.text() | st.from_regex(r"\.[^/\x00]{0,12}\.tmp-.{0,12}", fullmatch=True))
def test_only_our_exact_name_parses(name: str) -> None:
    """Whatever the name: parsed only when it is exactly what the writer makes."""
    parsed = parse_temp_name(name)
    assert parsed is None or temp_name_for(*parsed) == name


def test_a_killed_runs_temp_files_are_reported_then_removed(folder: Path) -> None:
    pid = _dead_pid()
    index_temp = folder / temp_name_for(INDEX_NAME, pid)
    journal_temp = folder / temp_name_for(JOURNAL, pid)
    index_temp.write_bytes(b"x" * 3000)
    journal_temp.write_bytes(b"{}")
    found = [f for f in check(scan(folder), model=False) if f.code == "temp-file-left"]
    assert sorted(f.file for f in found) == sorted([index_temp.name, journal_temp.name])
    assert any("(3.0 kB)" in f.message and "--recover" in f.message for f in found)
    done = recover_folder(folder)
    assert {i.path for i in done.leftovers.removable} == {index_temp.name, journal_temp.name}
    assert _names(folder) == ["model.safetensors"]  # the lock taken for it is gone too


def test_a_link_named_like_our_temp_file_is_never_followed_nor_removed(
    folder: Path, outside: Path, tmp_path: Path
) -> None:
    link = folder / temp_name_for(INDEX_NAME, _dead_pid())
    link.symlink_to(outside)
    (folder / temp_name_for(BIN_INDEX_NAME, _dead_pid())).symlink_to(tmp_path)
    os.mkfifo(folder / temp_name_for(JOURNAL, _dead_pid()))  # never opened: it would block
    done = recover_folder(folder)
    assert not done.leftovers.removable
    assert sorted(i.kept or "" for i in done.leftovers.kept) == [
        "a symbolic link, not a file ckpt-inspect wrote",
        "a symbolic link, not a file ckpt-inspect wrote",
        "not a regular file",
    ]
    assert link.is_symlink() and outside.read_text() == "keep me"
    (f,) = [f for f in check(scan(folder), model=False) if f.file == link.name]
    assert "symbolic link" in f.message and "keep me" not in f.message


def test_a_folder_named_like_our_temp_file_is_left_with_its_content(folder: Path) -> None:
    planted = folder / temp_name_for(INDEX_NAME, _dead_pid())
    planted.mkdir()
    (planted / "data").write_text("mine")
    assert main(["repair", "--recover", "--yes", str(folder)]) == 0
    assert (planted / "data").read_text() == "mine"
    (item,) = find_leftovers(folder, locked=True).kept
    assert item.kept == "a folder, not a file ckpt-inspect wrote"


def test_a_running_repairs_temp_file_is_kept(folder: Path) -> None:
    """Another process holds the folder lock and is writing: its temp file stays, and the
    recovery neither waits nor fails; once it is gone, the file is removed."""
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the other run: holds the lock while its temp file exists
        try:
            with folder_lock(folder):
                (folder / temp_name_for(INDEX_NAME, os.getpid())).write_bytes(b"{}")
                os.write(ready_w, b"1")
                os.read(go_r, 1)
        finally:
            os._exit(0)
    try:
        assert os.read(ready_r, 1) == b"1"
        done = recover_folder(folder)
        (item,) = done.leftovers.kept
        assert item.pid == pid and f"pid {pid} is running" in (item.kept or "")
        assert (folder / temp_name_for(INDEX_NAME, pid)).exists()
    finally:
        os.write(go_w, b"1")
        os.waitpid(pid, 0)
    # Killed now (here: exited without renaming): the next recovery removes it.
    assert [i.path for i in recover_folder(folder).leftovers.removable] == [item.path]


def test_a_pid_reused_by_an_unrelated_process_keeps_the_file(folder: Path) -> None:
    # The pid of a process that is running (our parent): it may be any program now, so the
    # file is reported for review, never removed on a guess.
    temp = folder / temp_name_for(INDEX_NAME, os.getppid())
    temp.write_bytes(b"{}")
    assert main(["repair", "--recover", "--yes", str(folder)]) == 0
    assert temp.exists()
    (item,) = find_leftovers(folder, locked=True).kept
    assert "is running" in (item.kept or "")


def test_without_the_lock_nothing_is_removed(folder: Path) -> None:
    temp = folder / temp_name_for(INDEX_NAME, _dead_pid())
    temp.write_bytes(b"{}")
    found = find_leftovers(folder, locked=False)
    assert not found.removable and "lock" in (found.kept[0].kept or "")


def test_look_alike_names_are_reported_never_removed(folder: Path) -> None:
    pid = _dead_pid()
    names = [
        f".{INDEX_NAME}.tmp-\uff11\uff12",  # fullwidth digits
        f".{INDEX_NAME}.tmp\u2010{pid}",  # a Unicode hyphen
        f"\uff0e{INDEX_NAME}.tmp-{pid}",  # a fullwidth dot
        f".{INDEX_NAME}.tmp-0{pid}",  # a leading zero
        f".{INDEX_NAME}.TMP-{pid}",
        f".{INDEX_NAME}\n.tmp-{pid}",  # a line break in the name
        f".config.json.tmp-{pid}",  # exact, but a file written without the lock
        f".evil.index.json.tmp-{pid}",  # exact, but no index a repair writes
        f".weights\\{INDEX_NAME}.tmp-{pid}",  # a backslash: no such target is written
    ]
    for name in names:
        (folder / name).write_bytes(b"user data")
    assert main(["repair", "--recover", "--yes", str(folder)]) == 0
    assert _names(folder) == sorted([*names, "model.safetensors"])
    found = [f for f in check(scan(folder), model=False) if f.code == "temp-file-left"]
    assert sorted(f.file for f in found) == sorted(names)
    assert all("\n" not in f.message for f in found)  # shown escaped, on one line


def test_a_second_name_of_a_shard_is_not_removed(folder: Path) -> None:
    temp = folder / temp_name_for(INDEX_NAME, _dead_pid())
    os.link(folder / "model.safetensors", temp)
    assert not recover_folder(folder).leftovers.removable
    assert temp.exists()


def test_a_temp_file_swapped_for_a_link_after_listing_is_not_removed(
    folder: Path, outside: Path
) -> None:
    temp = folder / temp_name_for(INDEX_NAME, _dead_pid())
    temp.write_bytes(b"{}")
    found = find_leftovers(folder, locked=True)
    assert len(found.removable) == 1
    temp.unlink()
    temp.symlink_to(outside)  # between the listing and the unlink
    with folder_lock(folder):
        done = remove_leftovers(folder, found)
    assert not done.removable and done.kept[0].kept == "it changed since it was listed"
    assert temp.is_symlink() and outside.read_text() == "keep me"


def test_a_planned_path_under_a_linked_folder_is_not_looked_into(
    folder: Path, tmp_path: Path
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    victim = elsewhere / temp_name_for("model.safetensors.json", _dead_pid())
    victim.write_text("not ours")
    (folder / "sub").symlink_to(elsewhere)
    done = recover_folder(folder, writes=["sub/model.safetensors.json"])
    assert not done.leftovers and victim.exists()


def test_many_look_alikes_are_bounded(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Thousands of look-alike entries: listed up to the cap, the rest counted; the check
    names at most 20 and one summary; a folder past the listing cap says where it stopped."""
    pid = _dead_pid()
    for n in range(3000):
        (folder / f".{n}.index.json.tmp-{pid}").write_bytes(b"")
    monkeypatch.setattr(temps, "LEFTOVER_LIST_CAP", 100)
    found = find_leftovers(folder, locked=True)
    assert len(found.kept) == 100 and found.more_kept == 2900 and not found.removable
    findings = [f for f in check(scan(folder), model=False) if f.code == "temp-file-left"]
    assert len(findings) == 21 and any("2,980 more entries" in f.message for f in findings)
    monkeypatch.setattr(temps, "LEFTOVER_SCAN_CAP", 500)
    stopped = find_leftovers(folder, locked=True)
    assert stopped.truncated == ("",) and len(stopped.kept) + stopped.more_kept <= 500


def test_one_recovery_removes_a_bounded_number(
    folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past `LEFTOVER_REMOVE_CAP` removable files, the rest are counted (memory stays bounded
    whatever the folder holds) and the next recovery takes them."""
    monkeypatch.setattr(temps, "LEFTOVER_REMOVE_CAP", 5)
    # Pids past Linux's PID_MAX_LIMIT (2**22): no process runs with them.
    for n in range(12):
        (folder / temp_name_for(INDEX_NAME, 2**30 + n)).write_bytes(b"{}")
    first = recover_folder(folder).leftovers
    assert len(first.removable) == 5 and first.more_removable == 7
    assert any("run it again" in line for line in first.lines())
    assert len(recover_folder(folder).leftovers.removable) == 5
    assert len(recover_folder(folder).leftovers.removable) == 2
    assert _names(folder) == ["model.safetensors"]


def test_removal_races_another_recovery(folder: Path) -> None:
    """Two recoveries at once: the folder lock lets one remove, the other sees it gone or
    the lock held; nothing fails and the file is removed once."""
    temp = folder / temp_name_for(INDEX_NAME, _dead_pid())
    temp.write_bytes(b"{}")
    results = []

    def one() -> None:
        results.append(recover_folder(folder).leftovers)

    threads = [threading.Thread(target=one) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not temp.exists()
    assert sum(len(r.removable) for r in results) == 1


def test_a_temp_file_an_unfinished_journal_renames_is_no_leftover(folder: Path) -> None:
    """Killed after the journal was linked: its temp file is the journal's to rename, so
    check does not call it a leftover, and the recovery renames it instead of removing it."""
    from inspector._internal.execution import atomic

    pid = os.fork()
    if pid == 0:  # dies once the journal is linked, before its renames (the 2nd recover)
        calls = iter((atomic.recover, lambda *args, **kwargs: os._exit(137)))
        atomic.recover = lambda *args, **kwargs: next(calls)(*args, **kwargs)  # type: ignore[assignment]
        atomic.apply_writes(folder, [(INDEX_NAME, b'{"weight_map": {}}')], backup=False)
        os._exit(1)
    os.waitpid(pid, 0)
    assert (folder / JOURNAL).exists() and (folder / temp_name_for(INDEX_NAME, pid)).exists()
    assert not [f for f in check(scan(folder), model=False) if f.code == "temp-file-left"]
    # A journal that is not ours (here: its MAC edited) hides nothing: the recovery does
    # not finish it on its own.
    ours = (folder / JOURNAL).read_bytes()
    doc = json.loads(ours)
    (folder / JOURNAL).write_text(json.dumps({**doc, "mac": "0" * len(doc["mac"])}))
    found = [f.file for f in check(scan(folder), model=False) if f.code == "temp-file-left"]
    assert found == [temp_name_for(INDEX_NAME, pid)]
    (folder / JOURNAL).write_bytes(ours)
    done = recover_folder(folder)
    assert done.renamed == [INDEX_NAME] and not done.leftovers
    assert _names(folder) == sorted([INDEX_NAME, "model.safetensors"])


def test_a_killed_consolidations_temp_file_is_removed_by_the_next_run(
    dcp_checkpoint: Path, tmp_path: Path
) -> None:
    """Consolidation killed as it renames the index's temp file into DEST: the next run of
    the plan removes that temp file (its pid is gone) and says so."""
    from inspector._internal.plans.consolidate import plan_consolidation

    dest = tmp_path / "out"
    plan = plan_consolidation(scan(dcp_checkpoint), dest)
    pid = os.fork()
    if pid == 0:
        replace = os.replace

        def dies_at_the_index(src: object, *args: object, **kwargs: object) -> None:
            if str(src).startswith(f".{INDEX_NAME}.tmp-"):
                os._exit(137)
            replace(src, *args, **kwargs)  # type: ignore[arg-type]

        os.replace = dies_at_the_index  # type: ignore[assignment]
        try:
            plan.execute(progress=False, verify=False)
        finally:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 137
    temp = temp_name_for(INDEX_NAME, pid)
    assert temp in _names(dest) and INDEX_NAME not in _names(dest)
    result = plan.execute(progress=False, verify=False)
    assert [i.path for i in result.leftovers.removable] == [temp]
    assert f"removed {temp}" in result.describe()
    assert temp not in _names(dest) and INDEX_NAME in _names(dest)


def test_repair_plans_the_removal_and_says_what_it_removed(
    folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A folder whose only trouble is a killed run's temp file: `repair` prints a plan that
    removes it (the look-alike beside it is kept), and removes it once confirmed."""
    temp = temp_name_for(INDEX_NAME, _dead_pid())
    (folder / temp).write_bytes(b"x" * 2048)
    (folder / f".{INDEX_NAME}.tmp-\uff17").write_bytes(b"{}")
    assert main(["repair", "--no-model", "--dry-run", str(folder)]) == 0
    plan = capsys.readouterr().out
    assert f"remove {temp} (2.0 kB)" in plan and "keep .model" in plan
    assert temp in _names(folder)
    assert main(["repair", "--no-model", "--yes", str(folder)]) == 0
    assert f"removed {temp} (2.0 kB)" in capsys.readouterr().out
    assert _names(folder) == sorted(["model.safetensors", f".{INDEX_NAME}.tmp-\uff17"])


def test_shard_sized_outputs_of_killed_runs_are_reported_not_removed(folder: Path) -> None:
    """A re-shard's staging folder and a consolidation's `.partial` output, left by killed
    runs: check names them with their sizes; the recovery keeps them (the next re-shard
    empties the one, `consolidate --resume` finishes the other)."""
    staging = folder / ".ckpt-inspect-reshard"
    staging.mkdir()
    (staging / "model-00001-of-00002.safetensors").write_bytes(b"x" * 6000)
    (folder / "model-00002-of-00002.safetensors.partial").write_bytes(b"x" * 3000)
    found = {f.file: f.message for f in check(scan(folder), model=False)}
    assert "(6.0 kB): the staging folder of a killed re-shard" in found[staging.name]
    assert (
        "(3.0 kB): an output a consolidation" in found["model-00002-of-00002.safetensors.partial"]
    )
    assert main(["repair", "--recover", "--yes", str(folder)]) == 0
    assert staging.is_dir() and (folder / "model-00002-of-00002.safetensors.partial").exists()


def test_an_absolute_planned_path_never_reaches_outside_the_folder(
    folder: Path, tmp_path: Path
) -> None:
    # `os.open("/", dir_fd=...)` ignores the descriptor: an absolute path among a plan's
    # writes made the listing, then the removal, walk from the file system's root.
    victim = tmp_path / "victim"
    victim.mkdir()
    temp = victim / temp_name_for("notes.json", _dead_pid())
    temp.write_text("keep me")
    for planned in (str(victim / "notes.json"), "/" + str(victim / "notes.json")):
        assert not find_leftovers(folder, writes=[planned], locked=True)
        recover_folder(folder, writes=[planned])
    assert temp.read_text() == "keep me"


def _linked_folders(tmp_path: Path) -> tuple[Path, Path, Path, Path]:
    """Two folders, a dead run's temp file of the index in the second one, and a link
    naming the first: (first, second, temp file, link)."""
    locked, other = tmp_path / "locked", tmp_path / "other"
    locked.mkdir()
    other.mkdir()
    temp = other / temp_name_for(INDEX_NAME, _dead_pid())
    temp.write_text("{}")
    link = tmp_path / "ckpt"
    link.symlink_to(locked)
    return locked, other, temp, link


def test_a_folder_link_swapped_during_recovery_leaves_the_unlocked_folder_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The path the user named is a link; whoever controls it points it elsewhere between
    # the listing, the lock check and the removal. The recovery acts on the folder it
    # opened (whose lock it holds), never on the other one.
    from inspector._internal.execution import atomic

    locked, other, temp, link = _linked_folders(tmp_path)

    def point(at: Path) -> None:
        link.unlink()
        link.symlink_to(at)

    real_find, real_remove = atomic.find_leftovers, atomic.remove_leftovers

    def find(*args: object, **kwargs: object) -> temps.Leftovers:
        point(other)
        try:
            return real_find(*args, **kwargs)  # type: ignore[arg-type]
        finally:
            point(locked)

    def remove(*args: object, **kwargs: object) -> temps.Leftovers:
        point(other)
        return real_remove(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(atomic, "find_leftovers", find)
    monkeypatch.setattr(atomic, "remove_leftovers", remove)
    with folder_lock(locked):
        point(locked)
        recover_folder(link)
    assert temp.exists()


def test_a_look_alike_temp_name_in_dest_is_foreign_to_a_consolidation(
    dcp_checkpoint: Path, tmp_path: Path
) -> None:
    # The DEST check read temp names with `\d`, which takes any Unicode digit: a look-alike
    # the recovery keeps as not ours passed as this plan's own output, so the consolidation
    # wrote into a DEST holding somebody else's entry without `--overwrite`.
    from inspector._internal.common.filenames import MANIFEST_NAME
    from inspector._internal.plans.consolidate import plan_consolidation
    from inspector.errors import PlanRefusedError

    dest = tmp_path / "out"
    dest.mkdir()
    look_alike = dest / f".{MANIFEST_NAME}.tmp-\u0661\u0662"
    look_alike.write_text("somebody's notes")
    plan = plan_consolidation(scan(dcp_checkpoint), dest)
    with pytest.raises(PlanRefusedError, match="tmp-"):
        plan.execute(progress=False, verify=False)
    assert _names(dest) == [look_alike.name]


def test_a_folder_link_swapped_as_the_lock_is_taken_registers_no_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The lock is taken in the folder the link names then; the link then names another
    # folder. That other folder's lock is not held, so nothing is removed from it.
    from inspector._internal.execution import atomic

    _, other, temp, link = _linked_folders(tmp_path)
    take = atomic._take_lock

    def take_then_swap(root: Path) -> int:
        fd = take(root)
        link.unlink()
        link.symlink_to(other)
        return fd

    monkeypatch.setattr(atomic, "_take_lock", take_then_swap)
    with folder_lock(link):
        # Another run holds the other folder's lock (the temp file may be its own).
        monkeypatch.setattr(atomic, "folder_lock", _refused)
        recover_folder(link)
    assert temp.exists()


@contextlib.contextmanager
def _refused(root: Path) -> Iterator[None]:
    """A folder lock another run holds."""
    raise InspectorError(f"{root}: another run holds the lock")
    yield


def test_a_staging_folder_past_the_sizing_cap_says_its_size_is_a_floor(
    folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The staging folder's entries are sized up to a cap; past it the size shown was
    # silently that of the first ones.
    monkeypatch.setattr(temps, "_STAGING_SIZED", 2)
    staging = folder / ".ckpt-inspect-reshard"
    staging.mkdir()
    for i in range(3):
        (staging / f"part-{i}").write_bytes(b"x" * 1000)
    [line] = [i.describe() for i in find_leftovers(folder, locked=True, outputs=True).kept]
    assert "(2.0 kB)" in line and "more than 2 entries; the size is of the first ones" in line
