"""The folder lock (`inspector._internal.execution.atomic.folder_lock`) under contention, with real
processes.

Each trial starts several processes at once (forked from one driver, released together by
closing a pipe) that each try to take the lock of one folder; a holder appends `enter` and
`exit` lines around a short sleep to a shared log (O_APPEND). Mutual exclusion holds when
the log never shows two holders at once. Trials start with a stale lock (its holder
gone): before, two processes could both judge it dead and both take it over.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import pytest

from inspector._internal.common.filenames import INDEX_NAME
from inspector._internal.execution import atomic
from inspector.errors import InspectorError


def fork() -> int:
    """`os.fork()` of this process, whose imports are done (another interpreter would import
    the package again: 2-3 s of CPU). Only for one process: the contention test's hundreds
    come from a small interpreter of their own, since a fork costs in proportion to the
    forking process's memory (from a test process that has imported torch, about 30 ms of
    CPU with the child's exit: 360 of them cost more than the interpreter's imports)."""
    with warnings.catch_warnings():
        # Python 3.12+ warns when a process with threads forks: the child takes no lock
        # another thread may hold (system calls on its own descriptors, then a sleep).
        warnings.simplefilter("ignore", DeprecationWarning)
        return os.fork()


_DRIVER = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path
    from inspector._internal.execution.atomic import LOCK, folder_lock
    from inspector.errors import InspectorError

    folder, log, trials, procs = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    dead = os.fork()
    if dead == 0:
        os._exit(0)
    os.waitpid(dead, 0)  # a pid nobody holds any more: what a killed holder leaves behind

    def attempt(trial):
        try:
            with folder_lock(folder):
                fd = os.open(log, os.O_WRONLY | os.O_APPEND)
                os.write(fd, f"enter {trial} {os.getpid()}\\n".encode())
                time.sleep(0.005)
                os.write(fd, f"exit {trial} {os.getpid()}\\n".encode())
                os.close(fd)
        except InspectorError:
            pass

    for trial in range(trials):
        (folder / LOCK).write_text(str(dead))  # a stale lock at every start
        read, write = os.pipe()
        children = []
        for _ in range(procs):
            pid = os.fork()
            if pid == 0:
                os.close(write)
                os.read(read, 1)  # everybody starts when the pipe closes
                attempt(trial)
                os._exit(0)
            children.append(pid)
        os.close(read)
        time.sleep(0.002)
        os.close(write)
        for pid in children:
            os.waitpid(pid, 0)
    """
)


def contend(folder: Path, *, trials: int, procs: int) -> list[str]:
    folder.mkdir(exist_ok=True)
    log = folder.parent / f"{folder.name}.log"
    log.write_text("")
    proc = subprocess.run(
        [sys.executable, "-c", _DRIVER, str(folder), str(log), str(trials), str(procs)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
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
    kept = folder / INDEX_NAME
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
