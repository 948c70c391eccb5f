"""The folder lock (`inspector._internal.plans.atomic.folder_lock`) under contention, with real
processes.

Each trial starts several processes at once (forked from one driver, itself forked from the
test process; released together by closing a pipe) that each try to take the lock of one
folder; a holder appends `enter` and `exit` lines around a short sleep to a shared log
(O_APPEND). Mutual exclusion holds when
the log never shows two holders at once. Trials start with a stale lock (its holder
gone): before, two processes could both judge it dead and both take it over.
"""

from __future__ import annotations

import os
import signal
import time
import traceback
import warnings
from pathlib import Path

import pytest

from inspector._internal.plans import atomic
from inspector.errors import InspectorError


def fork() -> int:
    """`os.fork()`: the processes here are forked from this one, whose imports are done
    (another interpreter would import the package again: 2-3 s of CPU each)."""
    with warnings.catch_warnings():
        # Python 3.12+ warns when a process with threads forks: the children take no lock
        # another thread may hold (system calls on their own descriptors, sleeps, forks).
        warnings.simplefilter("ignore", DeprecationWarning)
        return os.fork()


def drive(folder: Path, log: Path, trials: int, procs: int) -> None:
    """`trials` times: a stale lock, then `procs` processes released at once to take it,
    each holder logging `enter` and `exit` around a short sleep."""
    dead = fork()
    if dead == 0:
        os._exit(0)
    os.waitpid(dead, 0)  # a pid nobody holds any more: what a killed holder leaves behind

    def attempt(trial: int) -> None:
        try:
            with atomic.folder_lock(folder):
                fd = os.open(log, os.O_WRONLY | os.O_APPEND)
                os.write(fd, f"enter {trial} {os.getpid()}\n".encode())
                time.sleep(0.005)
                os.write(fd, f"exit {trial} {os.getpid()}\n".encode())
                os.close(fd)
        except InspectorError:
            pass

    failed = 0
    for trial in range(trials):
        (folder / atomic.LOCK).write_text(str(dead))  # a stale lock at every start
        read, write = os.pipe()
        children = []
        for _ in range(procs):
            pid = fork()
            if pid == 0:
                code = 1
                try:
                    os.close(write)
                    os.read(read, 1)  # everybody starts when the pipe closes
                    attempt(trial)
                    code = 0
                finally:
                    os._exit(code)
            children.append(pid)
        os.close(read)
        time.sleep(0.002)
        os.close(write)
        failed += sum(os.waitpid(pid, 0)[1] != 0 for pid in children)
    if failed:
        raise AssertionError(f"{failed} contending processes failed")


def contend(folder: Path, *, trials: int, procs: int) -> list[str]:
    folder.mkdir(exist_ok=True)
    log = folder.parent / f"{folder.name}.log"
    log.write_text("")
    driver = fork()
    if driver == 0:
        code = 1
        try:
            drive(folder, log, trials, procs)
            code = 0
        except BaseException:
            traceback.print_exc()  # on the test's captured stderr
        finally:
            os._exit(code)
    assert os.waitpid(driver, 0)[1] == 0, "the driver failed (its traceback is above)"
    return log.read_text().splitlines()


def holders_at_once(lines: list[str]) -> list[str]:
    """The lines where a second process entered while another held the lock."""
    held: str | None = None
    overlaps = []
    for line in lines:
        what, _trial, pid = line.split()
        if what == "enter":
            if held is not None:
                overlaps.append(line)
            held = pid
        elif held == pid:
            held = None
    return overlaps


def test_one_holder_at_a_time_under_contention_with_a_stale_lock(tmp_path: Path) -> None:
    lines = contend(tmp_path / "ckpt", trials=120, procs=3)
    assert holders_at_once(lines) == []
    entered = {line.split()[1] for line in lines if line.startswith("enter")}
    assert len(entered) == 120  # every trial, the stale lock was taken over by someone
    assert not (tmp_path / "ckpt" / atomic.LOCK).exists()


def hold(folder: Path) -> int:
    """A real process holding the lock of `folder` until it is killed; its pid. It takes
    the lock after the fork (the lock is its own open file) and says so through a pipe."""
    read, write = os.pipe()
    pid = fork()
    if pid == 0:
        try:
            os.close(read)
            with atomic.folder_lock(folder):
                os.write(write, b"held")
                time.sleep(600)
        finally:
            os._exit(0)
    os.close(write)
    try:
        assert os.read(read, 4) == b"held"
    finally:
        os.close(read)
    return pid


def test_a_live_holder_keeps_it_and_a_killed_one_releases_it(tmp_path: Path) -> None:
    folder = tmp_path / "ckpt"
    folder.mkdir()
    holder = hold(folder)
    try:
        with pytest.raises(InspectorError, match=f"pid {holder}"), atomic.folder_lock(folder):
            pass
    finally:
        os.kill(holder, signal.SIGKILL)
        os.waitpid(holder, 0)
    # The kernel released the lock with the process; its file is still there, and free.
    assert (folder / atomic.LOCK).exists()
    start = time.monotonic()
    with atomic.folder_lock(folder):
        assert (folder / atomic.LOCK).read_text() == str(os.getpid())
    assert time.monotonic() - start < 5
    assert not (folder / atomic.LOCK).exists()


def test_a_lock_whose_pid_was_reused_is_not_mistaken_for_a_live_one(tmp_path: Path) -> None:
    """A stale lock naming a live process that holds no lock (pid reuse, or junk) is free."""
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / atomic.LOCK).write_text(str(os.getpid()))
    with atomic.folder_lock(folder):
        pass


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "link-out", "hard-link", "socket"])
def test_hostile_lock_entries_are_replaced_never_used(tmp_path: Path, kind: str) -> None:
    """A planted lock that is no lock file: nothing hangs, nothing is written through it or
    into the file it shares an inode with, and the lock is taken."""
    import socket

    folder = tmp_path / "ckpt"
    folder.mkdir()
    lock = folder / atomic.LOCK
    secret = tmp_path / "secret.txt"  # outside the checkpoint
    secret.write_text("do not touch")
    kept = folder / "model.safetensors.index.json"
    kept.write_text('{"weight_map": {}}')
    if kind == "fifo":
        os.mkfifo(lock)
    elif kind == "dev-zero":
        lock.symlink_to("/dev/zero")
    elif kind == "link-out":
        lock.symlink_to(secret)
    elif kind == "hard-link":
        os.link(kept, lock)
    else:
        server = socket.socket(socket.AF_UNIX)
        server.bind(str(lock))
    with atomic.folder_lock(folder):
        assert lock.is_file() and not lock.is_symlink() and os.stat(lock).st_nlink == 1
    assert secret.read_text() == "do not touch"
    assert kept.read_text() == '{"weight_map": {}}'
    assert not lock.exists()


def test_a_folder_as_lock_is_one_clear_line(tmp_path: Path) -> None:
    folder = tmp_path / "ckpt"
    (folder / atomic.LOCK / "inner").mkdir(parents=True)
    with pytest.raises(InspectorError, match="is a folder"), atomic.folder_lock(folder):
        pass
    assert (folder / atomic.LOCK / "inner").is_dir()


def test_without_flock_an_exclusive_create_stands_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file system that cannot flock: the lock is the file's exclusive creation; a second
    taker is refused, and a lock left behind is not taken over (it names its pid)."""
    monkeypatch.setattr(atomic, "fcntl", None)
    folder = tmp_path / "ckpt"
    folder.mkdir()
    with atomic.folder_lock(folder):
        assert (folder / atomic.LOCK).read_text() == str(os.getpid())
        with pytest.raises(InspectorError, match="cannot lock files"), atomic.folder_lock(folder):
            pass
    assert not (folder / atomic.LOCK).exists()
    (folder / atomic.LOCK).write_text("4242")
    with pytest.raises(InspectorError, match="pid 4242"), atomic.folder_lock(folder):
        pass
