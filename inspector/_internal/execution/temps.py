"""Temp files: the one name a writer gives the file it renames over its target
(`.<name>.tmp-<pid>`), and what a killed run leaves under that name.

A run killed between writing a temp file and renaming it leaves it behind and nothing else
removes it: `find_leftovers` lists them, `remove_leftovers` removes only those proved ours
(the rule: docs/architecture.md, "execution/"); anything else is reported and left as it is.
The promise: SECURITY.md, 4.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import os
import stat
import unicodedata
from collections.abc import Collection
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath

from inspector._internal.common.display import legible
from inspector._internal.common.filenames import (
    BIN_INDEX_NAME,
    INDEX_NAME,
    JOURNAL,
    QUANT_CONFIG_NAME,
    STAGING,
)
from inspector._internal.common.units import format_bytes

__all__ = [
    "LEFTOVER_LIST_CAP",
    "LEFTOVER_REMOVE_CAP",
    "LEFTOVER_SCAN_CAP",
    "Leftover",
    "Leftovers",
    "find_leftovers",
    "parse_temp_name",
    "remove_leftovers",
    "temp_name_for",
]

_SUFFIX = ".tmp-"
# Entries of one folder looked at; a checkpoint holds thousands, so more is a crafted folder
# (the listing stops there and says so).
LEFTOVER_SCAN_CAP = 1_000_000
# Entries reported one by one; the rest are counted.
LEFTOVER_LIST_CAP = 1_000
# Temp files one recovery removes (a killed run leaves a few); past it they are counted, and
# the next recovery takes the next ones. Memory stays bounded whatever the folder holds.
LEFTOVER_REMOVE_CAP = 10_000
# The largest pid a writer can have had: Linux's PID_MAX_LIMIT is 2**22, other systems less;
# a larger number is no pid of ours.
_PID_MAX = 2**31 - 1
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
# Characters a name may use to look like ours without being ours (NFKC folds fullwidth
# digits, dots and letters; these dashes it leaves as they are).
_DASHES = str.maketrans(
    dict.fromkeys("\u2010\u2011\u2012\u2013\u2014\u2015\u2212\ufe63\uff0d", "-")
)


def temp_name_for(name: str, pid: int) -> str:
    """The temp file process `pid` writes before renaming it to `name` (same folder)."""
    return f".{name}{_SUFFIX}{pid}"


def parse_temp_name(name: str) -> tuple[str, int] | None:
    """(target, pid) when `name` is exactly what `temp_name_for` makes, else None: a leading
    dot, a target without a path separator or NUL, and a pid in ASCII digits without a sign
    or a leading zero. Linear in the name (no regular expression)."""
    if not name.startswith(".") or "/" in name or "\x00" in name:
        return None
    head, sep, digits = name.rpartition(_SUFFIX)
    target = head[1:]
    if not sep or not target or not digits or len(digits) > 10:
        return None
    if not (digits.isascii() and digits.isdigit()) or digits[0] == "0":
        return None
    pid = int(digits)
    if pid > _PID_MAX:
        return None
    return target, pid


def _looks_like_temp(name: str) -> bool:
    """`name` reads as one of our temp names to a person (after folding look-alike
    characters), though it may not be one exactly."""
    if _SUFFIX in name and name.startswith("."):
        return True
    folded = unicodedata.normalize("NFKC", name).translate(_DASHES)
    return folded.startswith(".") and _SUFFIX in folded.lower()


@dataclass(frozen=True, slots=True)
class Leftover:
    """An entry of the folder named like one of our temp files. `path` is relative to the
    checkpoint folder; `target` and `pid` come from its name when it is exactly ours; `kept`
    says why it is not removed (None: it is ours to remove)."""

    path: str
    size: int | None
    target: str | None
    pid: int | None
    kept: str | None
    # (device, inode, size, mtime) when listed: a file changed since is not removed.
    identity: tuple[int, int, int, int] | None = None
    # What it is, when its name gives no target and pid.
    what: str = "named like a ckpt-inspect temp file"

    def describe(self) -> str:
        """One line: the entry, its size, and what it is."""
        size = f" ({format_bytes(self.size)})" if self.size is not None else ""
        what = self.what
        if self.target is not None:
            gone = ", which is gone" if self.kept is None else ""
            what = f"temp file of {legible(self.target)} left by pid {self.pid}{gone}"
        line = f"{legible(self.path)}{size}: {what}"
        return line if self.kept is None else f"{line}; kept: {self.kept}"


@dataclass(frozen=True, slots=True)
class Leftovers:
    """What `find_leftovers` saw: entries to remove, entries kept (at most
    `LEFTOVER_LIST_CAP` of them listed, `more_kept` counted), and whether a folder's listing
    stopped at `LEFTOVER_SCAN_CAP`."""

    removable: tuple[Leftover, ...] = ()
    kept: tuple[Leftover, ...] = ()
    more_kept: int = 0
    truncated: tuple[str, ...] = ()
    # Removable entries past `LEFTOVER_REMOVE_CAP`, left for the next recovery.
    more_removable: int = 0
    # True once `remove_leftovers` ran: `removable` are then the entries removed.
    removed: bool = False

    def __bool__(self) -> bool:
        return bool(self.removable or self.kept or self.truncated or self.more_removable)

    @property
    def size(self) -> int:
        """Bytes the removable entries take."""
        return sum(item.size or 0 for item in self.removable)

    def lines(self, *, limit: int = 20) -> list[str]:
        """The entries, one line each (at most `limit` of each kind), for a plan or a report."""
        verb = "removed" if self.removed else "remove"
        out = [f"{verb} {item.describe()}" for item in self.removable[:limit]]
        if len(self.removable) > limit:
            out.append(f"{verb} ... {len(self.removable) - limit:,} more temp files")
        if self.more_removable:
            out.append(
                f"keep ... {self.more_removable:,} more temp files of killed runs, past the "
                f"{LEFTOVER_REMOVE_CAP:,} one recovery removes: run it again"
            )
        out += [f"keep {item.describe()}" for item in self.kept[:limit]]
        hidden = len(self.kept) - min(len(self.kept), limit) + self.more_kept
        if hidden:
            out.append(f"keep ... {hidden:,} more entries named like temp files")
        out += [
            f"keep {legible(folder or '.')}: listing stopped at {LEFTOVER_SCAN_CAP:,} entries"
            for folder in self.truncated
        ]
        return out


# The files a writer holding the folder lock writes through a temp file, whatever the plan:
# the journal and what `repair` may rewrite by name (`plans/repair.py`: `index_name`, the
# quantization config). A plan adds its own paths (sidecars, a restore's JSON).
_LOCKED_WRITES = frozenset({JOURNAL, INDEX_NAME, BIN_INDEX_NAME, QUANT_CONFIG_NAME})


def _written_under_lock(target: str, writes: Collection[str]) -> bool:
    """True for a file only a writer holding the folder lock writes through a temp file:
    the journal, the weight-map index, the quantization config, or a file the plan writes.
    (The content manifest, a consolidation's DEST and the verdict cache are written without
    the folder lock, so the lock proves nothing about their temp files.)"""
    return target in _LOCKED_WRITES or target in writes


def _alive(pid: int) -> bool:
    """True unless the system says no process `pid` runs here. Signal 0 only tests; on
    Windows `os.kill` would end the process, so every pid counts as alive there."""
    if os.name != "posix":
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError, OSError):
        return True
    return True


def find_leftovers(
    root: Path,
    *,
    writes: Collection[str] = (),
    locked: bool,
    dir_fd: int | None = None,
    outputs: bool = False,
) -> Leftovers:
    """Entries of `root` (and of the folders of `writes`, paths relative to it) named like
    our temp files, each judged (see the module docs); `locked`: no other writer of the
    folder runs (this process holds the folder lock; a plan passes True to say what its
    execution would remove). `dir_fd` is `root` already opened. `outputs` also lists, to
    be kept, the shard-sized files killed runs leave under other names: a consolidation's
    `.partial` outputs and the staging folder of a re-shard. Reads only names and, for
    those that match, one `lstat` each, without following a link: linear in the entries,
    at most `LEFTOVER_SCAN_CAP` per folder."""
    folders = {""} | {_folder_of(w) for w in writes}
    removable: list[Leftover] = []
    kept: list[Leftover] = []
    more_kept, more_removable, truncated = 0, 0, []
    alive: dict[int, bool] = {}
    uid = os.getuid() if hasattr(os, "getuid") else None
    for folder in sorted(folders):
        try:
            fd = _open_folder(root, folder, dir_fd)
        except OSError:
            continue  # no such folder (yet), or not one: nothing left there
        try:
            with os.scandir(fd) as entries:
                for seen, entry in enumerate(entries):
                    if seen >= LEFTOVER_SCAN_CAP:
                        truncated.append(folder)
                        break
                    if outputs and entry.name == STAGING and not folder:
                        item = _staging(entry, fd)
                    elif outputs and entry.name.endswith(_PARTIAL):
                        item = _partial(entry, folder)
                    elif _looks_like_temp(entry.name):
                        item = _judge(entry, folder, writes, locked, alive, uid)
                    else:
                        continue
                    if item.kept is None and len(removable) < LEFTOVER_REMOVE_CAP:
                        removable.append(item)
                    elif item.kept is None:
                        more_removable += 1
                    elif len(kept) < LEFTOVER_LIST_CAP:
                        kept.append(item)
                    else:
                        more_kept += 1
        finally:
            os.close(fd)
    key = lambda item: item.path  # noqa: E731
    return Leftovers(
        tuple(sorted(removable, key=key)),
        tuple(sorted(kept, key=key)),
        more_kept,
        tuple(truncated),
        more_removable,
    )


def _folder_of(rel: str) -> str:
    """The folder of a path relative to the checkpoint ("" for the checkpoint itself)."""
    parent = str(PurePosixPath(rel).parent)
    return "" if parent == "." else parent


# A consolidation writes each output as `<name>.partial` and renames it when complete
# (`plans/consolidate/engine.py`); a re-shard or restore copies into the staging folder.
_PARTIAL = ".safetensors.partial"
# Entries of the staging folder whose sizes are added up (a re-shard writes a few shards).
_STAGING_SIZED = 10_000


def _looked_at(entry: os.DirEntry[str], folder: str) -> tuple[str, os.stat_result | None]:
    """The entry's path relative to the checkpoint and its `lstat` (None: it vanished)."""
    rel = f"{folder}/{entry.name}" if folder else entry.name
    try:
        return rel, entry.stat(follow_symlinks=False)
    except OSError:
        return rel, None


def _partial(entry: os.DirEntry[str], folder: str) -> Leftover:
    """An output a consolidation was writing: shard-sized, never removed here (a
    `consolidate --resume` finishes it, a new run replaces it)."""
    rel, info = _looked_at(entry, folder)
    if info is None:
        return Leftover(rel, None, None, None, "it could not be looked at")
    size = info.st_size if stat.S_ISREG(info.st_mode) else None
    return Leftover(
        rel,
        size,
        None,
        None,
        "a consolidation killed while writing it (or running now) left it; `consolidate "
        "--resume` finishes it, or delete it once no consolidation writes here",
        what="an output a consolidation writes before renaming it",
    )


def _staging(entry: os.DirEntry[str], parent: int) -> Leftover:
    """The staging folder of a re-shard or restore, which exists only while one runs: left
    by a killed one, with the bytes of the files in it (the next one empties it)."""
    why = (
        "the next `repair --only reshard` or `repair --from` empties it; delete it once "
        "neither runs here"
    )
    what = "the staging folder of a killed re-shard or restore"
    try:
        fd = os.open(STAGING, os.O_RDONLY | _DIRECTORY | _NOFOLLOW | _CLOEXEC, dir_fd=parent)
    except OSError:
        return Leftover(STAGING, None, None, None, "not a folder ckpt-inspect made", what=what)
    size, more = 0, False
    try:
        with os.scandir(fd) as entries:
            for seen, item in enumerate(entries):
                if seen >= _STAGING_SIZED:
                    more = True
                    break
                with contextlib.suppress(OSError):
                    info = item.stat(follow_symlinks=False)
                    size += info.st_size if stat.S_ISREG(info.st_mode) else 0
    finally:
        os.close(fd)
    if more:  # the size shown is a floor, and says so
        what += f" (more than {_STAGING_SIZED:,} entries; the size is of the first ones)"
    return Leftover(STAGING, size, None, None, why, what=what)


def _open_folder(root: Path, folder: str, dir_fd: int | None) -> int:
    """A descriptor of root/folder, every part below the root opened without following a
    link (the root itself is what the user named, or `dir_fd` when it is open already)."""
    # An absolute path would make its first part "/", which `os.open` opens whatever
    # `dir_fd` is: refused before anything is opened, like `..`.
    if PurePosixPath(folder).is_absolute():
        raise OSError(errno.EINVAL, "not a folder inside the checkpoint")
    fd = (
        os.dup(dir_fd) if dir_fd is not None else os.open(root, os.O_RDONLY | _DIRECTORY | _CLOEXEC)
    )
    for part in PurePosixPath(folder).parts if folder else ():
        try:
            if part in ("..", ".") or "\x00" in part:
                raise OSError(errno.EINVAL, "not a folder inside the checkpoint")
            sub = os.open(part, os.O_RDONLY | _DIRECTORY | _NOFOLLOW | _CLOEXEC, dir_fd=fd)
        finally:
            os.close(fd)
        fd = sub
    return fd


def _judge(
    entry: os.DirEntry[str],
    folder: str,
    writes: Collection[str],
    locked: bool,
    alive: dict[int, bool],
    uid: int | None,
) -> Leftover:
    """The entry as a `Leftover`: removable only when every condition holds."""
    rel, info = _looked_at(entry, folder)
    if info is None:
        return Leftover(rel, None, None, None, "it could not be looked at")
    size = info.st_size if stat.S_ISREG(info.st_mode) else None
    parsed = parse_temp_name(entry.name)
    if parsed is None:
        return Leftover(
            rel, size, None, None, "not exactly the name ckpt-inspect gives a temp file"
        )
    name, pid = parsed
    target = f"{folder}/{name}" if folder else name
    item = Leftover(rel, size, target, pid, None)
    identity = (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)
    why = None
    if stat.S_ISLNK(info.st_mode):
        why = "a symbolic link, not a file ckpt-inspect wrote"
    elif stat.S_ISDIR(info.st_mode):
        why = "a folder, not a file ckpt-inspect wrote"
    elif not stat.S_ISREG(info.st_mode):
        why = "not a regular file"
    elif info.st_nlink != 1:
        why = "the file has another name too"
    elif uid is not None and info.st_uid != uid:
        why = "it belongs to another user"
    elif not _written_under_lock(target, writes):
        why = (
            f"{legible(name)} is not among the files ckpt-inspect writes under the folder "
            "lock, so no run can prove its writer is gone: delete it once you know nothing "
            "writes this folder"
        )
    elif pid == os.getpid():
        why = "written by this very process"
    elif alive.setdefault(pid, _alive(pid)):
        why = (
            f"pid {pid} is running (another ckpt-inspect run, or an unrelated process that "
            "reuses the pid): delete it once no ckpt-inspect run writes this folder"
        )
    elif not locked:
        why = "the folder lock could not be taken (another run may be writing)"
    return replace(item, kept=why, identity=identity)


def remove_leftovers(root: Path, found: Leftovers, *, dir_fd: int | None = None) -> Leftovers:
    """Remove `found.removable` (the caller holds the folder lock): each is looked at again
    through its folder's descriptor and removed only when it is still that very regular
    file. Returns what was removed (`removable`) and what was not (`kept`, with why)."""
    removed: list[Leftover] = []
    kept = list(found.kept)
    by_folder: dict[str, list[Leftover]] = {}
    for item in found.removable:
        by_folder.setdefault(_folder_of(item.path), []).append(item)
    for folder, items in sorted(by_folder.items()):
        try:
            fd = _open_folder(root, folder, dir_fd)
        except OSError as exc:
            kept += [
                replace(i, kept=f"its folder cannot be opened ({exc.strerror})") for i in items
            ]
            continue
        try:
            for item in items:
                why = _unlink_if_same(fd, item)
                if why is None:
                    removed.append(item)
                else:
                    kept.append(replace(item, kept=why))
            with contextlib.suppress(OSError):  # some file systems cannot fsync a folder
                os.fsync(fd)
        finally:
            os.close(fd)
    return dataclasses.replace(found, removable=tuple(removed), kept=tuple(kept), removed=True)


def _unlink_if_same(fd: int, item: Leftover) -> str | None:
    """Unlink the entry when it is still the regular file listed; else why not. A link or
    folder swapped in since is never followed: `unlink` removes a link itself, and refuses
    a folder."""
    name = PurePosixPath(item.path).name
    try:
        info = os.stat(name, dir_fd=fd, follow_symlinks=False)
    except FileNotFoundError:
        return "gone meanwhile"
    except OSError as exc:
        return f"it could not be looked at ({exc.strerror})"
    now = (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)
    if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1 or now != item.identity:
        return "it changed since it was listed"
    try:
        os.unlink(name, dir_fd=fd)
    except FileNotFoundError:
        return "gone meanwhile"
    except OSError as exc:
        return f"it could not be removed ({exc.strerror})"
    return None
