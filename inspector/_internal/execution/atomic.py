"""The few writers: atomic file replacement with backups, under a folder lock.

`apply_writes` backs up, writes temp files, journals the renames and renames, each step
surviving a kill, so that files are never left half old, half new; `recover()` finishes a
journal's renames, and replays only a journal that is ours, since a shared folder may carry
one. The steps: docs/architecture.md, "execution/"; the promises: SECURITY.md, 4.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import hmac
import os
import re
import shutil
import socket
import stat
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import orjson

from inspector._internal.common import filenames
from inspector._internal.common.display import MESSAGE_LIMIT, legible
from inspector._internal.execution.temps import (
    Leftovers,
    find_leftovers,
    remove_leftovers,
    temp_name_for,
)
from inspector.errors import InspectorError, UnsafeInputError

try:
    import fcntl
except ImportError:  # Windows: the lock is an exclusive create (`_exclusive_lock`)
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "BACKUP_DIR",
    "JOURNAL",
    "LOCK",
    "STAGING",
    "Journal",
    "JournalEntry",
    "JournalError",
    "Recovery",
    "apply_renames",
    "apply_writes",
    "discard_journal",
    "folder_lock",
    "fresh_staging",
    "fsync_dir",
    "new_backup_dir",
    "open_fresh",
    "read_journal",
    "recover",
    "recover_folder",
    "temp_name",
    "write_atomic",
]

# The lock, journal, backups and the staging folder re-sharding copies new shards into
# before swapping them in: all inside the checkpoint, named in the one table of file names.
LOCK = filenames.LOCK
JOURNAL = filenames.JOURNAL
BACKUP_DIR = filenames.BACKUP_DIR
STAGING = filenames.STAGING

_FORMAT = "ckpt-inspect-journal"
_VERSION = 2
# A journal lists a few renames per shard; anything far larger is not one of ours.
_JOURNAL_CAP = 64_000_000
_STAMP = re.compile(r"\d{8}-\d{6}(-\d+)?")
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)


class JournalError(UnsafeInputError):
    """A write journal in the folder that will not be replayed without the user's say-so."""


# -- the folder lock --------------------------------------------------------------------------


@contextlib.contextmanager
def folder_lock(root: Path) -> Iterator[None]:
    """Exclusive lock on a checkpoint folder for the duration of a write.

    The lock is `fcntl.flock` on `.ckpt-inspect.lock` (hand-written rather than `filelock`:
    the file must be checked as the descriptor that is locked, see `_take_lock`). The
    kernel drops it when its holder exits, however it exits: a lock a killed run left
    behind is free, and no process ever judges another one dead (that judgement raced
    when two did it at once). The holder removes the file while it still holds the lock;
    a process that locked the removed file sees it is gone and starts again. Where flock
    is unsupported (some network file systems), an exclusive create stands in, and a lock
    left behind there must be removed by hand.
    """
    fd = _take_lock(root)
    key = None
    try:
        key = _locked_folder_key(root, fd)
        if key is not None:
            _HELD.add(key)
        yield
    finally:
        if key is not None:
            _HELD.discard(key)
        _drop_lock(root, fd)


# The folders whose lock this thread holds (device, inode, thread): a recovery under one of
# them knows no other lock-holding writer runs there (another thread of this process may be
# writing under a lock it holds, so the thread is part of the key).
_HELD: set[tuple[int, int, int]] = set()


def _locked_folder_key(root: Path, fd: int) -> tuple[int, int, int] | None:
    """The key of the folder whose lock file is `fd`: `root` as opened now, when the lock
    file in it is that very file. A link in `root`'s path swapped since the lock was taken
    would otherwise register a folder whose lock is not held, and a recovery there would
    remove files as if no other writer ran (None: nothing is registered)."""
    try:
        dfd = os.open(root, os.O_RDONLY | _DIRECTORY | _CLOEXEC)
    except OSError:
        return None
    try:
        folder = os.fstat(dfd)
        there = os.stat(LOCK, dir_fd=dfd, follow_symlinks=False)
        if fd >= 0:
            mine = os.fstat(fd)
            if (mine.st_dev, mine.st_ino) != (there.st_dev, there.st_ino):
                return None
        elif not stat.S_ISREG(there.st_mode):
            return None
    except OSError:
        return None
    finally:
        os.close(dfd)
    return folder.st_dev, folder.st_ino, threading.get_ident()


def _holds_lock_of(fd: int) -> bool:
    """True when this thread holds the lock of the folder open as `fd`."""
    info = os.fstat(fd)
    return (info.st_dev, info.st_ino, threading.get_ident()) in _HELD


# Attempts to take the lock: a holder finishing, or a planted entry removed, costs one.
_LOCK_TRIES = 20
# Errors of flock where the file system does not support it.
_NO_FLOCK = {errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL, errno.EBADF}
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


def _take_lock(root: Path) -> int:
    """The descriptor of the locked `.ckpt-inspect.lock`, its content our pid (-1: the
    exclusive-create stand-in holds it).

    Only a regular file of one link, opened without following a link and without blocking,
    is ever locked or written: a FIFO, a socket, a link (to `/dev/zero`, or out of the
    folder) or a second name of another file planted as the lock is removed as it is (under
    a lock on the folder itself, so two processes never remove each other's fresh lock)
    and never read or written; a folder there is refused in one line."""
    lock = root / LOCK
    flags = os.O_RDWR | _NOFOLLOW | _NONBLOCK | _CLOEXEC
    for _ in range(_LOCK_TRIES):
        created = True
        try:
            try:
                fd = os.open(lock, flags | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                created = False
                fd = os.open(lock, flags)
        except FileNotFoundError:
            continue  # removed by its holder since
        except OSError as exc:
            if exc.errno not in (errno.ELOOP, errno.ENXIO, errno.EISDIR, errno.EMLINK):
                raise _cannot_write(root, exc) from None
            _clear_planted(root)  # a link, a socket or a folder
            continue
        try:
            state = _lock_open_file(lock, fd)
        except BaseException:
            os.close(fd)
            raise
        if state == "locked":
            return fd
        os.close(fd)
        if state == "planted":
            _clear_planted(root)
        elif state == "no-flock":
            return _exclusive_lock(root, created)
    raise InspectorError(f"{lock}: cannot take the lock; run again")


def _lock_open_file(lock: Path, fd: int) -> str:
    """Lock the opened `fd` of `lock`: "locked" (and our pid written), "planted" (no lock
    file), "gone" (replaced since it was opened: try again) or "no-flock" (unsupported)."""
    opened = os.fstat(fd)
    if not stat.S_ISREG(opened.st_mode) or opened.st_nlink != 1:
        return "planted"
    if fcntl is None:
        return "no-flock"
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        pid = _lock_pid(lock)
        who = f"another ckpt-inspect process (pid {pid})" if pid else "another ckpt-inspect process"
        raise InspectorError(
            f"{lock}: {who} is writing this checkpoint; wait for it to finish, then run again"
        ) from None
    except OSError as exc:
        if exc.errno in _NO_FLOCK:
            return "no-flock"
        raise _cannot_write(lock.parent, exc) from None
    # The file locked must still be the lock: its last holder removes it (it may have,
    # between our open and our lock), and the next one then makes a new one.
    try:
        now = os.lstat(lock)
    except FileNotFoundError:
        return "gone"
    if (now.st_dev, now.st_ino) != (opened.st_dev, opened.st_ino):
        return "gone"
    os.ftruncate(fd, 0)
    os.write(fd, str(os.getpid()).encode())
    return "locked"


def _drop_lock(root: Path, fd: int) -> None:
    """Remove the lock file while still holding it (when it is still ours), then release."""
    try:
        if fd < 0:  # the exclusive-create stand-in
            (root / LOCK).unlink(missing_ok=True)
            return
        with contextlib.suppress(OSError):
            mine, now = os.fstat(fd), os.lstat(root / LOCK)
            if (mine.st_dev, mine.st_ino) == (now.st_dev, now.st_ino):
                os.unlink(root / LOCK)
    finally:
        if fd >= 0:
            os.close(fd)


def _clear_planted(root: Path) -> None:
    """Remove what is planted as the lock when it is no lock file (it may be one again by
    now: another process may have cleared it and locked a fresh file, which is kept).

    Removers take an flock on the folder itself, so one never removes the lock another
    has just made; where the folder cannot be locked, the entry is refused instead."""
    lock = root / LOCK
    try:
        dfd = os.open(root, os.O_RDONLY | _DIRECTORY | _CLOEXEC)
    except OSError as exc:
        raise _cannot_write(root, exc) from None
    try:
        if not _flock_briefly(dfd):
            raise InspectorError(
                f"{lock} is {_entry_kind(lock)}, not a lock file, and the folder cannot be "
                "locked to replace it; remove it, then run again"
            )
        try:
            entry = os.lstat(LOCK, dir_fd=dfd)
        except FileNotFoundError:
            return
        if stat.S_ISDIR(entry.st_mode):
            raise InspectorError(f"{lock} is a folder, not a lock file; remove it, then run again")
        if stat.S_ISREG(entry.st_mode) and (entry.st_nlink == 1 or _held(dfd)):
            return  # a lock file now, or one a holder has (a link made to it since)
        # A link, FIFO, socket or device: nobody locks one (`_take_lock` refuses them).
        # A second name of another file: removing the name leaves that file as it is.
        os.unlink(LOCK, dir_fd=dfd)
    finally:
        os.close(dfd)


def _held(dfd: int) -> bool:
    """True when a process holds the flock of the regular file named like the lock."""
    try:
        fd = os.open(LOCK, os.O_RDONLY | _NOFOLLOW | _NONBLOCK | _CLOEXEC, dir_fd=dfd)
    except OSError:
        return False
    try:
        assert fcntl is not None  # `_clear_planted` runs only where flock works
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except OSError:
        return True
    finally:
        os.close(fd)


def _flock_briefly(fd: int, *, seconds: float = 5.0) -> bool:
    """An exclusive flock on `fd` within `seconds` (others hold it only for a few system
    calls); False when the file system cannot lock it or it stays held."""
    if fcntl is None:
        return False
    deadline = time.monotonic() + seconds
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.005)
        except OSError:
            return False


def _entry_kind(path: Path) -> str:
    try:
        mode = path.lstat().st_mode
    except OSError:
        return "gone"
    kinds = ((stat.S_ISLNK, "a link"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"))
    return next((what for test, what in kinds if test(mode)), "not a regular file")


def _exclusive_lock(root: Path, created: bool) -> int:
    """Where flock is unsupported: the lock is the exclusive creation of the file (`created`
    says whether this process just created it). A lock left by a process that is gone is
    not taken over (two processes judging it dead at once would both take it): it names
    its pid and is removed by hand."""
    lock = root / LOCK
    if not created:
        raise InspectorError(
            f"{lock}: another ckpt-inspect process (pid {_lock_pid(lock)}) is writing this "
            "checkpoint (this file system cannot lock files, so a lock left by a process that "
            "is gone stays); wait for it, or delete the lock file if that process is gone"
        )
    try:
        fd = os.open(lock, os.O_WRONLY | _NOFOLLOW | _NONBLOCK | _CLOEXEC)
        try:
            os.write(fd, str(os.getpid()).encode())
        finally:
            os.close(fd)
    except OSError as exc:
        raise _cannot_write(root, exc) from None
    return -1


def _cannot_write(root: Path, exc: OSError) -> InspectorError:
    """The first write into a folder failed: say why in one line, with what to do."""
    reason = exc.strerror or str(exc)
    if exc.errno == errno.EROFS:
        todo = "copy the checkpoint to a writable place and repair the copy, or use --dry-run"
    elif exc.errno in (errno.EACCES, errno.EPERM):
        todo = "run as a user who may write the folder, or repair a copy of it"
    elif exc.errno in (errno.ENOSPC, errno.EDQUOT):
        todo = "free space on that file system, then run again"
    else:
        todo = "check the folder, then run again"
    return InspectorError(f"{root}: cannot write in this folder ({reason}); {todo}")


def _lock_pid(lock: Path) -> int | None:
    text = _read_small(lock, 64)
    if text is None:
        return None
    try:
        return int(text.strip() or b"0") or None
    except ValueError:
        return None


def _read_small(path: Path, cap: int) -> bytes | None:
    """At most `cap` bytes of a regular file, never through a link, never blocking."""
    try:
        fd = os.open(path, os.O_RDONLY | _NOFOLLOW | _NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return os.read(fd, cap)
    except OSError:
        return None
    finally:
        os.close(fd)


# -- folders reached without following links ---------------------------------------------------


def _safe_rel(rel: str) -> PurePosixPath:
    """`rel` as a path inside the folder, or UnsafeInputError."""
    if not isinstance(rel, str) or not rel or "\x00" in rel or "\\" in rel:
        raise UnsafeInputError(f"path {rel!r:.120} is not a plain relative path")
    pure = PurePosixPath(rel)
    if pure.is_absolute() or any(p in ("..", ".", "") for p in rel.split("/")):
        raise UnsafeInputError(f"path {rel!r:.120} leaves the checkpoint folder")
    return pure


class _Folder:
    """The checkpoint root and its sub-folders as descriptors, each opened with O_NOFOLLOW
    from its parent: a link planted anywhere below the root cannot redirect a write."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._fds: dict[tuple[str, ...], int] = {}
        # The root itself is what the user named (a link there is the user's choice).
        self._fds[()] = os.open(root, os.O_RDONLY | _DIRECTORY)

    def dir_fd(self, parts: tuple[str, ...], *, create: bool = False) -> int | None:
        """Descriptor of root/parts, or None when it does not exist (and not `create`)."""
        if parts in self._fds:
            return self._fds[parts]
        parent = self.dir_fd(parts[:-1], create=create)
        if parent is None:
            return None
        name = parts[-1]
        flags = os.O_RDONLY | _DIRECTORY | _NOFOLLOW
        try:
            fd = os.open(name, flags, dir_fd=parent)
        except FileNotFoundError:
            if not create:
                return None
            os.mkdir(name, 0o755, dir_fd=parent)
            fd = os.open(name, flags, dir_fd=parent)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
                raise UnsafeInputError(
                    f"{self.root / '/'.join(parts)} is a symbolic link or not a folder; "
                    "ckpt-inspect writes only into real folders inside the checkpoint: "
                    "remove it, then run again"
                ) from None
            raise
        self._fds[parts] = fd
        return fd

    def locate(self, rel: str, *, create: bool = False) -> tuple[int | None, str]:
        """(descriptor of the parent folder or None, file name) of `rel`."""
        pure = _safe_rel(rel)
        return self.dir_fd(pure.parts[:-1], create=create), pure.name

    def lstat(self, rel: str) -> os.stat_result | None:
        fd, name = self.locate(rel)
        if fd is None:
            return None
        try:
            return os.stat(name, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            return None

    def sync(self) -> None:
        for fd in self._fds.values():
            with contextlib.suppress(OSError):
                os.fsync(fd)

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def __enter__(self) -> _Folder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _regular_or_absent(folder: _Folder, rel: str, what: str) -> os.stat_result | None:
    info = folder.lstat(rel)
    if info is not None and not stat.S_ISREG(info.st_mode):
        kind = "a symbolic link" if stat.S_ISLNK(info.st_mode) else "not a regular file"
        raise UnsafeInputError(
            f"{folder.root / rel} ({what}) is {kind}; ckpt-inspect only replaces regular files "
            "inside the checkpoint (a link may point anywhere): replace it with a copy of the "
            "file, then run again"
        )
    return info


# -- writing ------------------------------------------------------------------------------------


def write_atomic(path: Path, data: bytes, *, dir_fd: int | None = None) -> None:
    """Temp file beside `path`, fsync, rename, fsync the folder. With `dir_fd`, `path` is a
    name in that folder and every step goes through the descriptor (no link is followed)."""
    if dir_fd is None:
        tmp = path.with_name(temp_name_for(path.name, os.getpid()))
        _write_synced(tmp, data)
        os.replace(tmp, path)
        fsync_dir(path.parent)
        return
    tmp_name = temp_name(path.name)
    _write_synced(Path(tmp_name), data, dir_fd=dir_fd)
    os.replace(tmp_name, path.name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    with contextlib.suppress(OSError):  # some file systems cannot fsync a folder
        os.fsync(dir_fd)


def temp_name(name: str) -> str:
    """The temp file this process writes before renaming it to `name`."""
    return temp_name_for(name, os.getpid())


def open_fresh(
    name: str | Path, *, dir_fd: int | None = None, flags: int = os.O_WRONLY, mode: int = 0o666
) -> int:
    """Create `name` afresh and open it (`flags` plus O_CREAT, O_EXCL, O_NOFOLLOW). A stale
    file or a planted link of that name is removed first (the link itself, never what it
    points to); a link planted again in between makes the open fail, so nothing is ever
    written through a link. A folder of that name is refused."""
    with contextlib.suppress(FileNotFoundError):
        info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        if stat.S_ISDIR(info.st_mode):
            raise UnsafeInputError(f"{name} is a folder where ckpt-inspect writes a file")
        os.unlink(name, dir_fd=dir_fd)
    return os.open(name, flags | os.O_CREAT | os.O_EXCL | _NOFOLLOW, mode, dir_fd=dir_fd)


def _write_synced(path: Path, data: bytes, *, dir_fd: int | None = None) -> os.stat_result:
    """Create `path` afresh (`open_fresh`), write, fsync; returns its stat."""
    try:
        fd = open_fresh(path.name if dir_fd is not None else path, dir_fd=dir_fd)
    except UnsafeInputError:
        raise UnsafeInputError(f"{path} is a folder where a temporary file belongs") from None
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
        return os.fstat(fd)
    finally:
        os.close(fd)


def apply_writes(
    root: Path,
    writes: Sequence[tuple[str, bytes]],
    *,
    backup: bool = True,
    moves: Sequence[tuple[str, str]] = (),
) -> Path | None:
    """Replace files under `root` atomically as one journaled batch; returns the backup folder.

    `moves` are files staged in `STAGING` (`STAGING/<name>` -> `<name>`, a name not in use,
    e.g. a restored shard); the journal moves them in first, so a file the new JSON names is
    in place before the JSON is."""
    recover(root)
    pid = os.getpid()
    with _Folder(root) as folder:
        staged = []
        for src, dst in moves:
            info = folder.lstat(src)
            if info is None or not stat.S_ISREG(info.st_mode):
                raise UnsafeInputError(f"{root / src} is not a regular file; nothing written")
            if folder.lstat(dst) is not None:
                raise InspectorError(f"{root / dst} exists now; plan again")
            staged.append(JournalEntry(_kind_of(src, dst), src, dst, *_identity(info)))
        existing = {rel: _regular_or_absent(folder, rel, "to be rewritten") for rel, _ in writes}
        backup_dir = None
        if backup and any(existing.values()):
            backup_dir = new_backup_dir(root)
            rel_backup = backup_dir.relative_to(root).as_posix()
            for rel, _ in writes:
                if existing[rel] is not None:
                    _copy_into(folder, rel, f"{rel_backup}/{rel}")
            folder.sync()
        entries = staged
        for rel, data in writes:
            parent, name = folder.locate(rel, create=True)
            tmp = PurePosixPath(rel).with_name(temp_name_for(name, pid)).as_posix()
            info = _write_synced(Path(tmp), data, dir_fd=parent)
            digest = hashlib.sha256(data).hexdigest()
            entries.append(JournalEntry("replace", tmp, rel, *_identity(info), digest))
    _run_journal(root, entries)
    return backup_dir


def _copy_into(folder: _Folder, rel: str, dest_rel: str) -> None:
    """Copy root/rel to root/dest_rel (created fresh), through no-follow descriptors."""
    src_parent, src_name = folder.locate(rel)
    dst_parent, dst_name = folder.locate(dest_rel, create=True)
    src = os.open(src_name, os.O_RDONLY | _NOFOLLOW | _NONBLOCK, dir_fd=src_parent)
    try:
        info = os.fstat(src)
        if not stat.S_ISREG(info.st_mode):
            raise UnsafeInputError(f"{folder.root / rel} is not a regular file; not backed up")
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW
        dst = os.open(dst_name, flags, stat.S_IMODE(info.st_mode), dir_fd=dst_parent)
        try:
            while chunk := os.read(src, 1 << 20):
                view = memoryview(chunk)
                while view:
                    view = view[os.write(dst, view) :]
            os.utime(dst, ns=(info.st_atime_ns, info.st_mtime_ns))
            os.fsync(dst)
        finally:
            os.close(dst)
    finally:
        os.close(src)


def new_backup_dir(root: Path) -> Path:
    """A fresh `.ckpt-inspect-backup/<timestamp>` folder path under `root` (not created)."""
    return _unique(root / BACKUP_DIR / time.strftime("%Y%m%d-%H%M%S"))


def _unique(path: Path) -> Path:
    candidate, n = path, 1
    while os.path.lexists(candidate):
        n += 1
        candidate = path.with_name(f"{path.name}-{n}")
    return candidate


def fresh_staging(root: Path) -> Path:
    """`root/.ckpt-inspect-reshard`, emptied and created as a real folder. A link of that
    name (planted to redirect the copy out of the checkpoint) is refused, not followed."""
    staging = root / STAGING
    info = None
    with contextlib.suppress(FileNotFoundError):
        info = staging.lstat()
    if info is not None and not stat.S_ISDIR(info.st_mode):
        raise UnsafeInputError(
            f"{staging} is a symbolic link or a file, not the staging folder ckpt-inspect "
            "makes; remove it, then run again"
        )
    if info is not None:
        # rmtree removes a tree without following links inside it (fd-based on Linux).
        shutil.rmtree(staging)
    with _Folder(root) as folder:
        folder.dir_fd((STAGING,), create=True)
    return staging


def fsync_dir(folder: Path) -> None:
    """Make a folder's entries (a rename) durable. Some file systems cannot fsync a folder;
    the rename is still atomic there, so that is not an error."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


# -- the journal --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class JournalEntry:
    """One rename of a batch: `kind` is "replace" (a written temp file over its target),
    "stage" (a re-sharded file from the staging folder) or "retire" (an old shard into the
    backup folder); the source's identity when the journal was written; `sha256` of a
    written temp file."""

    kind: str
    src: str
    dst: str
    size: int
    inode: int
    mtime_ns: int
    sha256: str | None = None


@dataclass(frozen=True)
class Journal:
    """A journal found in a folder, with the verdict on it."""

    root: Path
    entries: tuple[JournalEntry, ...]
    writer: dict[str, Any]
    ours: bool  # owned by this user and its MAC verifies
    problems: tuple[str, ...]  # why an entry cannot be replayed (or the journal read)

    def describe(self, *, limit: int = 40) -> str:
        """What the journal would do, one rename per line."""
        w = self.writer
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(w.get("time", 0)))
        lines = [
            f"{self.root / JOURNAL}: unfinished write batch of pid {w.get('pid')} on host "
            f"{w.get('host')!r:.80} at {when} ({'ours' if self.ours else 'NOT verified as ours'})",
            f"  it renames {len(self.entries)} files:",
        ]
        lines += [f"    {e.kind:<7} {e.src} -> {e.dst}" for e in self.entries[:limit]]
        if len(self.entries) > limit:
            lines.append(f"    ... {len(self.entries) - limit} more")
        lines += [f"  problem: {p}" for p in self.problems[:limit]]
        return "\n".join(legible(line, limit=MESSAGE_LIMIT) for line in lines)


def apply_renames(root: Path, renames: Sequence[tuple[str, str]]) -> list[str]:
    """Journal then perform renames (paths relative to `root`), in order. A kill part-way is
    finished by the next `recover`. Targets must not also be sources of a later step.

    Each pair must have a shape we write (see the module docs): a staged shard
    `.ckpt-inspect-reshard/<name>` -> `<name>`, a shard retired into
    `.ckpt-inspect-backup/<timestamp>/`, or a temp file `.<name>.tmp-<pid>` -> `<name>`."""
    entries = []
    with _Folder(root) as folder:
        for src, dst in renames:
            kind = _kind_of(src, dst)
            info = folder.lstat(src)
            if info is None or not stat.S_ISREG(info.st_mode):
                raise UnsafeInputError(f"{root / src} is not a regular file; nothing renamed")
            entries.append(JournalEntry(kind, src, dst, *_identity(info)))
    return _run_journal(root, entries)


def _kind_of(src: str, dst: str) -> str:
    if src.startswith(f"{STAGING}/"):
        return "stage"
    if dst.startswith(f"{BACKUP_DIR}/"):
        return "retire"
    return "replace"


def _identity(info: os.stat_result) -> tuple[int, int, int]:
    return info.st_size, info.st_ino, info.st_mtime_ns


def _run_journal(root: Path, entries: list[JournalEntry]) -> list[str]:
    """Write the journal (temp name, fsync, rename: it is whole or absent), then replay it."""
    pid = os.getpid()
    for entry in entries:
        problem = _shape_problem(entry, pid)
        if problem:
            raise UnsafeInputError(f"{root}: refusing to journal {problem}")
    writer = {"host": socket.gethostname(), "uid": os.getuid(), "pid": pid, "time": time.time()}
    body = {
        "format": _FORMAT,
        "version": _VERSION,
        "writer": writer,
        "entries": [list(_entry_fields(e)) for e in entries],
    }
    doc = {**body, "mac": _mac(body)}
    tmp = root / temp_name_for(JOURNAL, pid)
    _write_synced(tmp, orjson.dumps(doc))
    # A hard link publishes the whole journal at once (and fails rather than replace one
    # that appeared meanwhile); file systems without links get the rename.
    try:
        os.link(tmp, root / JOURNAL, follow_symlinks=False)
        tmp.unlink()
    except OSError as exc:
        if exc.errno == errno.EEXIST:
            raise JournalError(f"{root / JOURNAL} appeared while writing; run again") from None
        os.replace(tmp, root / JOURNAL)
    fsync_dir(root)
    return recover(root)


def _entry_fields(e: JournalEntry) -> tuple[Any, ...]:
    return (e.kind, e.src, e.dst, e.size, e.inode, e.mtime_ns, e.sha256)


def _mac(body: dict[str, Any]) -> str:
    return hmac.new(
        _machine_key(), orjson.dumps(body, option=orjson.OPT_SORT_KEYS), "sha256"
    ).hexdigest()


def _machine_key() -> bytes:
    """Key of the journal MAC: what only this user on this machine, this boot, has. The boot
    id is random per boot and unknown elsewhere, so a journal made on another machine (a
    downloaded checkpoint) cannot carry a valid MAC. Where there is no boot id, the host name
    stands in, and the ownership check alone separates users."""
    parts = [str(os.getuid()).encode(), socket.gethostname().encode()]
    for source in (
        "/proc/sys/kernel/random/boot_id",
        "/etc/machine-id",
        "/var/lib/dbus/machine-id",
    ):
        data = _read_small(Path(source), 256)
        if data:
            parts.append(data.strip())
    return hashlib.sha256(b"ckpt-inspect-journal\x00" + b"\x00".join(parts)).digest()


def read_journal(root: Path) -> Journal | None:
    """The journal in `root` and whether it may be replayed, or None when there is none."""
    path = root / JOURNAL
    try:
        info = path.lstat()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise JournalError(f"{path}: cannot be read ({exc.strerror}); remove it") from None
    if not stat.S_ISREG(info.st_mode):
        raise JournalError(
            f"{path} is not a regular file (a link or a special file), so not a journal "
            "ckpt-inspect wrote; remove it, then run again"
        )
    if info.st_size > _JOURNAL_CAP:
        raise JournalError(f"{path} is {info.st_size:,} bytes, not a journal ckpt-inspect wrote")
    raw = _read_small(path, _JOURNAL_CAP)
    try:
        doc = orjson.loads(raw or b"")
        body = {k: doc[k] for k in ("format", "version", "writer", "entries")}
        if body["format"] != _FORMAT or body["version"] != _VERSION:
            raise ValueError("unknown format")
        entries = tuple(_entry(row) for row in body["entries"])
        writer = dict(body["writer"])
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError):
        return Journal(root, (), {}, False, ("not a journal ckpt-inspect writes (unreadable)",))
    ours = (
        info.st_uid == os.getuid()
        and isinstance(doc.get("mac"), str)
        and hmac.compare_digest(doc["mac"], _mac(body))
    )
    pid = writer.get("pid")
    problems = []
    for entry in entries:
        shape = _shape_problem(entry, pid)
        if shape:
            problems.append(shape)
    return Journal(root, entries, writer, ours, tuple(problems))


def _entry(row: Any) -> JournalEntry:
    kind, src, dst, size, inode, mtime, digest = row
    if not all(isinstance(x, str) for x in (kind, src, dst)):
        raise TypeError("entry paths are not strings")
    if not all(type(x) is int for x in (size, inode, mtime)):
        raise TypeError("entry identity is not integers")
    if digest is not None and not isinstance(digest, str):
        raise TypeError("entry digest is not a string")
    return JournalEntry(kind, src, dst, size, inode, mtime, digest)


def _shape_problem(entry: JournalEntry, pid: Any) -> str | None:
    """Why this rename is not one ckpt-inspect writes, or None."""
    show = f"{entry.src!r:.120} -> {entry.dst!r:.120}"
    try:
        src, dst = _safe_rel(entry.src), _safe_rel(entry.dst)
    except UnsafeInputError as exc:
        return f"{show}: {exc}"
    if entry.kind == "replace":
        expected = dst.with_name(temp_name_for(dst.name, pid)) if type(pid) is int else None
        if src != expected or src.parts[0] in (BACKUP_DIR, STAGING):
            return f"{show}: the source is not the temp file we write for that target"
    elif entry.kind == "stage":
        if len(dst.parts) != 1 or src != PurePosixPath(STAGING, dst.name):
            return f"{show}: not a staged file moving to the same name in the folder"
    elif entry.kind == "retire":
        parts = dst.parts
        if (
            len(parts) != len(src.parts) + 2
            or parts[0] != BACKUP_DIR
            or not _STAMP.fullmatch(parts[1])
            or PurePosixPath(*parts[2:]) != src
            or src.parts[0] in (BACKUP_DIR, STAGING)
        ):
            return f"{show}: not a file retired into the backup folder under its own name"
    else:
        return f"{show}: unknown kind {entry.kind!r:.40}"
    return None


@dataclass(frozen=True)
class Recovery:
    """What `recover_folder` did: the journal's targets renamed, and the temp files a killed
    run left (`leftovers.removable` removed, `leftovers.kept` left with why)."""

    renamed: list[str]
    leftovers: Leftovers


def recover_folder(root: Path, *, confirmed: bool = False, writes: Sequence[str] = ()) -> Recovery:
    """`recover`, then remove the temp files a killed run left in `root` (and in the folders
    of `writes`, the paths a plan writes), under the folder lock: the caller's, or one taken
    here when there is something to remove. What is not established as ours is reported in
    `leftovers.kept`, never removed (`execution/temps.py`)."""
    renamed = recover(root, confirmed=confirmed)
    # The folder is opened once: the lock checked, the listing and the removals all go
    # through this descriptor, so a path whose link is swapped meanwhile cannot make them
    # act on a folder whose lock is not held.
    fd = os.open(root, os.O_RDONLY | _DIRECTORY | _CLOEXEC)
    try:
        found = find_leftovers(root, writes=writes, locked=True, dir_fd=fd)
        if _holds_lock_of(fd):
            return Recovery(renamed, remove_leftovers(root, found, dir_fd=fd))
        if not found.removable:  # most folders: nothing to remove, no lock (taking it writes)
            return Recovery(renamed, found)
        try:
            with folder_lock(root):
                if _holds_lock_of(fd):
                    found = find_leftovers(root, writes=writes, locked=True, dir_fd=fd)
                    return Recovery(renamed, remove_leftovers(root, found, dir_fd=fd))
        except InspectorError:  # another run holds it, or the folder cannot be written
            pass
        return Recovery(renamed, find_leftovers(root, writes=writes, locked=False, dir_fd=fd))
    finally:
        os.close(fd)


def recover(root: Path, *, confirmed: bool = False) -> list[str]:
    """Finish an interrupted batch: do the journal's remaining renames. Returns targets done.

    Our own journal is finished as it stands. Any other one raises `JournalError` (what it
    would do, and the commands that finish or discard it) unless `confirmed`: then its
    confined entries are finished after checking each source's content (SHA-256 where the
    journal has one, size otherwise). An entry that is not confined, or whose file changed,
    is never replayed: the journal is then left in place and reported."""
    journal = read_journal(root)
    if journal is None:
        return []
    if not journal.entries and not journal.problems:
        _remove_journal(root)
        return []
    if not journal.ours and not confirmed:
        raise JournalError(_not_ours(journal))
    if journal.problems:
        raise JournalError(_unverified(journal, list(journal.problems)))
    with _Folder(root) as folder:
        plan, problems = _verify(folder, journal, strict=journal.ours and not confirmed)
        if problems:
            raise JournalError(_unverified(journal, problems))
        done = []
        for entry in plan:
            src_fd, src_name = folder.locate(entry.src)
            dst_fd, dst_name = folder.locate(entry.dst, create=True)
            os.replace(src_name, dst_name, src_dir_fd=src_fd, dst_dir_fd=dst_fd)
            done.append(entry.dst)
        folder.sync()
    _remove_journal(root)
    return done


def _verify(
    folder: _Folder, journal: Journal, *, strict: bool
) -> tuple[list[JournalEntry], list[str]]:
    """(entries still to rename, problems). `strict` (our own journal) also checks each
    source's inode and mtime; a confirmed foreign journal is checked by content."""
    todo, problems = [], []
    for entry in journal.entries:
        src = _regular_or_absent(folder, entry.src, "a journal source")
        dst = _regular_or_absent(folder, entry.dst, "a journal target")
        if src is None:
            # Renamed before the interruption: the target must be that very file.
            if dst is None or not _same(entry, dst, strict=strict):
                problems.append(f"{entry.src} is gone and {entry.dst} is not the renamed file")
            continue
        if src.st_uid != os.getuid() and strict:
            problems.append(f"{entry.src} belongs to another user")
        elif not _same(entry, src, strict=strict) or not _content_ok(folder, entry):
            problems.append(f"{entry.src} changed since the journal was written")
        else:
            todo.append(entry)
    return todo, problems


def _same(entry: JournalEntry, info: os.stat_result, *, strict: bool) -> bool:
    if info.st_size != entry.size:
        return False
    return not strict or (info.st_ino == entry.inode and info.st_mtime_ns == entry.mtime_ns)


def _content_ok(folder: _Folder, entry: JournalEntry) -> bool:
    if entry.sha256 is None:
        return True
    parent, name = folder.locate(entry.src)
    fd = os.open(name, os.O_RDONLY | _NOFOLLOW | _NONBLOCK, dir_fd=parent)
    digest = hashlib.sha256()
    try:
        while chunk := os.read(fd, 1 << 20):
            digest.update(chunk)
    finally:
        os.close(fd)
    return hmac.compare_digest(digest.hexdigest(), entry.sha256)


def _not_ours(journal: Journal) -> str:
    pairs = ", ".join(f"{e.src} -> {e.dst}" for e in journal.entries[:3])
    more = f" and {len(journal.entries) - 3} more" if len(journal.entries) > 3 else ""
    what = f"it would rename {len(journal.entries)} files ({pairs}{more})"
    if journal.problems and not journal.entries:
        what = journal.problems[0]
    root = journal.root
    return (
        f"{root / JOURNAL} was not written by this user on this machine since its last boot "
        f"(or was changed), so it is not replayed: {what}; review and finish it with "
        f"`ckpt-inspect repair --recover {root}`, or remove it with "
        f"`ckpt-inspect repair --discard-journal {root}`"
    )


def _unverified(journal: Journal, problems: list[str]) -> str:
    shown = "; ".join(problems[:3]) + (
        f"; and {len(problems) - 3} more" if len(problems) > 3 else ""
    )
    return (
        f"{journal.root / JOURNAL} cannot be finished safely ({shown}); nothing was renamed. "
        f"Inspect the files it names, then remove it with "
        f"`ckpt-inspect repair --discard-journal {journal.root}`"
    )


def _remove_journal(root: Path) -> None:
    (root / JOURNAL).unlink(missing_ok=True)
    fsync_dir(root)


def discard_journal(root: Path) -> Journal | None:
    """Remove the journal (its files stay where they are); returns what it said, or None."""
    try:
        journal = read_journal(root)
    except JournalError:
        journal = None
        if not os.path.lexists(root / JOURNAL):
            return None
    if journal is None and not os.path.lexists(root / JOURNAL):
        return None
    _remove_journal(root)
    return journal
