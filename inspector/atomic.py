"""The few writers: atomic file replacement with backups, under a folder lock.

Protocol of `apply_writes` (each step survives a kill):
1. take `.ckpt-inspect.lock` (O_EXCL; a lock whose process is gone is taken over);
2. copy every file to be replaced into `.ckpt-inspect-backup/<timestamp>/`;
3. write every new content to a temp file beside its target and fsync it;
4. write a journal naming the temp -> target renames, fsync it;
5. rename each temp over its target, fsync the folder, delete the journal.
A kill before step 4 leaves the originals untouched; after it, `recover()` (run by every
`apply_writes`) finishes the renames, so files are never left half old, half new.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import orjson

from inspector.errors import InspectorError

__all__ = [
    "BACKUP_DIR",
    "JOURNAL",
    "LOCK",
    "apply_renames",
    "apply_writes",
    "folder_lock",
    "fsync_dir",
    "new_backup_dir",
    "recover",
    "write_atomic",
]

LOCK = ".ckpt-inspect.lock"
JOURNAL = ".ckpt-inspect-journal.json"
BACKUP_DIR = ".ckpt-inspect-backup"


def write_atomic(path: Path, data: bytes) -> None:
    """Temp file beside `path`, fsync, rename, fsync the folder."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    _write_synced(tmp, data)
    os.replace(tmp, path)
    fsync_dir(path.parent)


@contextlib.contextmanager
def folder_lock(root: Path) -> Iterator[None]:
    """Exclusive lock on a checkpoint folder for the duration of a write."""
    lock = root / LOCK
    for _ in range(2):
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            break
        except FileExistsError:
            if _lock_alive(lock):
                raise InspectorError(
                    f"{lock}: another ckpt-inspect process (pid {_lock_pid(lock)}) is writing this "
                    "checkpoint; wait for it, or delete the lock file if that process is gone"
                ) from None
            lock.unlink(missing_ok=True)
    else:
        raise InspectorError(f"{lock}: cannot take the lock; delete it if no repair is running")
    try:
        os.write(fd, str(os.getpid()).encode())
        os.close(fd)
        yield
    finally:
        lock.unlink(missing_ok=True)


def apply_writes(
    root: Path,
    writes: Sequence[tuple[str, bytes]],
    *,
    backup: bool = True,
    moves: Sequence[tuple[str, str]] = (),
) -> Path | None:
    """Replace files under `root` atomically as one journaled batch; returns the backup folder.

    `moves` are renames of files already written under `root` (e.g. a new shard in a staging
    folder) to names that do not exist yet; the journal does them first, so a file the new
    JSON names is in place before the JSON is."""
    recover(root)
    backup_dir = None
    if backup and any((root / rel).exists() for rel, _ in writes):
        backup_dir = new_backup_dir(root)
        for rel, _ in writes:
            if (root / rel).exists():
                target = backup_dir / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(root / rel, target)
                _fsync_file(target)
        fsync_dir(backup_dir)
    renames = list(moves)
    for rel, data in writes:
        final = root / rel
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = final.with_name(f".{final.name}.tmp-{os.getpid()}")
        _write_synced(tmp, data)
        renames.append((str(tmp.relative_to(root)), rel))
    apply_renames(root, renames)
    return backup_dir


def new_backup_dir(root: Path) -> Path:
    """A fresh `.ckpt-inspect-backup/<timestamp>` folder path under `root` (not created)."""
    return _unique(root / BACKUP_DIR / time.strftime("%Y%m%d-%H%M%S"))


def apply_renames(root: Path, renames: Sequence[tuple[str, str]]) -> list[str]:
    """Journal then perform renames (paths relative to `root`), in order. A kill part-way is
    finished by the next `recover`. Targets must not also be sources of a later step."""
    _write_synced(root / JOURNAL, orjson.dumps({"renames": [list(r) for r in renames]}))
    fsync_dir(root)
    return recover(root)


def recover(root: Path) -> list[str]:
    """Finish an interrupted batch: do the journal's remaining renames. Returns targets done."""
    journal = root / JOURNAL
    if not journal.exists():
        return []
    try:
        renames = orjson.loads(journal.read_bytes())["renames"]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        # The journal itself was cut short: the batch never started renaming.
        journal.unlink()
        return []
    done = []
    for tmp, rel in renames:
        if (root / tmp).exists():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            os.replace(root / tmp, root / rel)
            done.append(rel)
    dirs = {(root / rel).parent for _, rel in renames} | {root}
    for d in dirs:
        fsync_dir(d)
    journal.unlink()
    fsync_dir(root)
    return done


def _write_synced(path: Path, data: bytes) -> None:
    with open(path, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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


def _unique(path: Path) -> Path:
    candidate, n = path, 1
    while candidate.exists():
        n += 1
        candidate = path.with_name(f"{path.name}-{n}")
    return candidate


def _lock_pid(lock: Path) -> int | None:
    try:
        return int(lock.read_text().strip() or "0") or None
    except (OSError, ValueError):
        return None


def _lock_alive(lock: Path) -> bool:
    pid = _lock_pid(lock)
    if pid is None:
        # Being written this instant by its owner, or junk: treat a fresh one as alive.
        return time.time() - lock.stat().st_mtime < 5 if lock.exists() else False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
