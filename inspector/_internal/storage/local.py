"""Local folders: the one place where the hostile-input rules for reading files are enforced:
non-blocking opens, regular files only (`fstat` after opening), `os.pread` under the caller's
cap, nothing read through a link leaving the folder (except the Hugging Face cache's
`snapshots/` -> `blobs/`), and the opened descriptor checked again (`/proc/self/fd`) so a
link swapped in between is caught. Why each: SECURITY.md, "3. Reads stay inside the folder".
"""

from __future__ import annotations

import errno
import os
import re
import stat
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

from inspector._internal.storage.base import Entry, EntryKind, IOStats, TooLargeError, check_member
from inspector.errors import FileShrankError, UnsafeFileError

__all__ = ["LocalFile", "LocalStorage", "file_identity", "file_kind", "hf_cache_snapshots"]

T = TypeVar("T")
U = TypeVar("U")

_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
# A Hugging Face cache repository folder: models--org--name (also datasets--, spaces--).
_HF_REPO = re.compile(r"(models|datasets|spaces)--.+")
_PROC_FD = Path("/proc/self/fd")


class LocalFile:
    """A local file read with `os.pread`: no seek state, no buffering surprises.

    `LocalFile(path)` opens one path non-blocking and refuses anything but a regular file;
    `LocalStorage.open` adds the folder rules and hands over its checked descriptor."""

    def __init__(self, path: str | os.PathLike[str], *, _fd: int | None = None) -> None:
        self.name = str(path)
        # O_NONBLOCK: opening a FIFO planted in a checkpoint folder must not hang the scan.
        self._fd = os.open(path, os.O_RDONLY | _NONBLOCK | _CLOEXEC) if _fd is None else _fd
        info = os.fstat(self._fd)
        if not stat.S_ISREG(info.st_mode):
            os.close(self._fd)
            self._fd = -1
            raise OSError(errno.EINVAL, "not a regular file", self.name)
        self._size = info.st_size

    def size(self) -> int:
        return self._size

    def fileno(self) -> int:
        """The descriptor (kernel copies of tensor data use it)."""
        return self._fd

    def read_into(self, buffer: memoryview, offset: int) -> None:
        """Exactly `len(buffer)` bytes from `offset` straight into `buffer` (`preadv`, in as
        many calls as the system needs: one moves at most about 2 GiB); `FileShrankError`
        when the file ends first."""
        view = buffer.cast("B") if buffer.format != "B" or buffer.ndim != 1 else buffer
        fd, preadv = self._fd, os.preadv
        done, total = 0, len(view)
        while done < total:
            n = preadv(fd, [view[done:]], offset + done)
            if n == 0:
                raise FileShrankError(self.name, min(offset + done, os.fstat(fd).st_size))
            done += n

    def read_range(self, offset: int, length: int) -> bytes:
        if offset < 0 or length < 0:
            raise ValueError(f"{self.name}: negative read range ({offset}, {length})")
        chunks: list[bytes] = []
        while length > 0:
            chunk = os.pread(self._fd, min(length, 1 << 30), offset)
            if not chunk:
                break
            chunks.append(chunk)
            offset += len(chunk)
            length -= len(chunk)
        return b"".join(chunks) if len(chunks) != 1 else chunks[0]

    def read_many(self, offsets: Sequence[int], lengths: Sequence[int]) -> list[bytes]:
        """Many short ranges, one `pread` each and no Python work around them (300,000
        sampled windows in a fraction of a second); fewer bytes only at the end of the
        file. OSError when any read fails (`read_range` then tells which)."""
        fd, pread = self._fd, os.pread
        return [pread(fd, n, a) for a, n in zip(offsets, lengths, strict=True)]

    def read_many_into(
        self, buffer: memoryview, at: Sequence[int], offsets: Sequence[int], lengths: Sequence[int]
    ) -> list[int]:
        """Long ranges read straight into `buffer` at positions `at` (`preadv`: no copy
        after), the bytes each brought (fewer only at the end of the file)."""
        fd, preadv = self._fd, os.preadv
        spans = zip(at, lengths, offsets, strict=True)
        return [preadv(fd, [buffer[p : p + n]], a) for p, n, a in spans]

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> LocalFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def file_kind(mode: int) -> str | None:
    """What a non-regular file is, for messages ("a FIFO"); None when it has no name."""
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISDIR(mode):
        return "a folder"
    return None


def file_identity(path: str) -> tuple[int, ...] | None:
    """What tells a user's own file (a credentials file, never a checkpoint's) from the same
    path rewritten: (device, inode, size, mtime, ctime) of a regular file, (device, inode) of
    anything else (`/dev/null`'s times change as others write to it), None when absent. Only
    `stat`ed, never opened: a FIFO or a huge file costs nothing."""
    try:
        info = os.stat(os.path.expanduser(path)) if path else None
    except OSError:
        return None
    if info is None:
        return None
    if stat.S_ISREG(info.st_mode):
        return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)
    return (info.st_dev, info.st_ino)


class LocalStorage:
    """A local checkpoint folder. `confine` is the folder nothing may leave (the folder the
    user named); a sub-folder storage (`sub`) keeps its parent's."""

    is_local = True

    def __init__(self, root: str | os.PathLike[str], *, confine: str | None = None) -> None:
        self._root = Path(root)
        self._confine = confine if confine is not None else os.path.realpath(root)
        self._stats = IOStats()

    @property
    def path(self) -> Path:
        return self._root

    @property
    def stats(self) -> IOStats:
        return self._stats

    def __repr__(self) -> str:
        return f"LocalStorage({str(self._root)!r})"

    def sub(self, rel: str) -> LocalStorage:
        return LocalStorage(self._root / check_member(rel), confine=self._confine)

    def fresh(self) -> LocalStorage:
        return LocalStorage(self._root, confine=self._confine)  # nothing is cached locally

    # -- the rules -------------------------------------------------------------------------

    def _inside(self, real: str) -> bool:
        root = self._confine
        if real == root or real.startswith(root.rstrip("/") + "/"):
            return True
        return self._hf_blob(real)

    def _hf_blob(self, real: str) -> bool:
        """True for `<repo>/blobs/<hash>` when the folder is `<repo>/snapshots/<rev>[/...]` of
        a Hugging Face cache repository (files there are links into the repository's blobs)."""
        parts = self._confine.split("/")
        if "snapshots" not in parts:
            return False
        at = len(parts) - 1 - parts[::-1].index("snapshots")
        if at < 1 or at + 1 >= len(parts) or not _HF_REPO.fullmatch(parts[at - 1]):
            return False
        blobs = "/".join([*parts[:at], "blobs"])
        head, _, blob = real.rpartition("/")
        return head == blobs and blob not in ("", ".", "..")

    def _real(self, rel: str) -> str:
        """The real path of `rel`, checked to stay inside the folder. Raises UnsafeFileError
        for a link that leaves it or a link loop, OSError when it does not exist."""
        rel = check_member(rel)
        path = os.path.join(self._root, rel) if rel else str(self._root)
        try:
            real = os.path.realpath(path, strict=True)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise UnsafeFileError(
                    rel or ".", f"is a link loop ({os.strerror(errno.ELOOP)})"
                ) from None
            raise
        if not self._inside(real):
            raise UnsafeFileError(
                rel or ".", f"is a link to {real}, which is outside the checkpoint folder"
            )
        return real

    def _classify(self, name: str, rel: str) -> Entry | None:
        try:
            real = self._real(rel)
            info = os.stat(real)
        except UnsafeFileError as exc:
            return Entry(name, EntryKind.REFUSED, reason=exc.reason)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError:
            # Permission denied on the way, a name too long...: reading it says which.
            return Entry(name, EntryKind.FILE)
        if stat.S_ISDIR(info.st_mode):
            return Entry(name, EntryKind.DIR)
        if stat.S_ISREG(info.st_mode):
            return Entry(name, EntryKind.FILE, info.st_size)
        return Entry(name, EntryKind.REFUSED, reason=_not_regular(info.st_mode))

    # -- the interface ---------------------------------------------------------------------

    def entries(self, rel: str = "") -> list[Entry]:
        rel = check_member(rel)
        try:
            folder = self._real(rel)
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except (OSError, UnsafeFileError):
            return []
        out = []
        for entry in entries:
            child = f"{rel}/{entry.name}" if rel else entry.name
            try:
                if entry.is_symlink():
                    found = self._classify(entry.name, child)
                    if found is not None:
                        out.append(found)
                    continue
                info = entry.stat(follow_symlinks=False)
            except OSError:
                out.append(Entry(entry.name, EntryKind.FILE))  # reading it says why
                continue
            if stat.S_ISDIR(info.st_mode):
                out.append(Entry(entry.name, EntryKind.DIR))
            elif stat.S_ISREG(info.st_mode):
                out.append(Entry(entry.name, EntryKind.FILE, info.st_size))
            else:
                out.append(Entry(entry.name, EntryKind.REFUSED, reason=_not_regular(info.st_mode)))
        return out

    def stat(self, rel: str) -> Entry | None:
        rel = check_member(rel)
        return self._classify(rel.rsplit("/", 1)[-1] or self._root.name, rel)

    def open(self, rel: str) -> LocalFile:
        rel = check_member(rel)
        real = self._real(rel)
        before = os.stat(real)
        if stat.S_ISDIR(before.st_mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(self._root / rel))
        if not stat.S_ISREG(before.st_mode):
            raise UnsafeFileError(rel, _not_regular(before.st_mode))  # never opened
        try:
            fd = os.open(real, os.O_RDONLY | _NONBLOCK | _NOFOLLOW | _CLOEXEC)
        except OSError as exc:
            if exc.errno == errno.ELOOP:  # became a link after the check
                raise UnsafeFileError(rel, "was replaced by a link while being opened") from None
            raise
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise UnsafeFileError(rel, _not_regular(info.st_mode))
            if (info.st_dev, info.st_ino) != (before.st_dev, before.st_ino):
                raise UnsafeFileError(rel, "was replaced while being opened")
            opened = _opened_path(fd)
            if opened is not None and not self._inside(opened):
                raise UnsafeFileError(
                    rel, f"resolves to {opened}, which is outside the checkpoint folder"
                )
            return LocalFile(self._root / rel, _fd=fd)
        except BaseException:
            os.close(fd)
            raise

    def read_bytes(self, rel: str, *, cap: int) -> bytes:
        with self.open(rel) as reader:
            size = reader.size()
            if size > cap:
                raise TooLargeError(rel, size, cap)
            return reader.read_range(0, size)

    def read_range(self, rel: str, offset: int, length: int) -> bytes:
        with self.open(rel) as reader:
            return reader.read_range(offset, length)

    def read_ranges(self, ranges: Sequence[tuple[str, int, int]]) -> list[bytes]:
        return [self.read_range(*r) for r in ranges]

    def try_read_ranges(
        self, ranges: Sequence[tuple[str, int, int]]
    ) -> list[bytes | OSError | UnsafeFileError]:
        out: list[bytes | OSError | UnsafeFileError] = []
        for r in ranges:
            try:
                out.append(self.read_range(*r))
            except (OSError, UnsafeFileError) as exc:
                out.append(exc)
        return out

    def prefetch(
        self, wanted: Sequence[tuple[str, int | Callable[[bytes, int], int]]], *, desc: str = ""
    ) -> None:
        """Nothing to do: a local open costs no round trip."""

    def map(self, fn: Callable[[T], U], items: Sequence[T], *, desc: str = "") -> list[U]:
        # Local reads take microseconds: threads would only add contention for the GIL.
        return [fn(item) for item in items]


def _not_regular(mode: int) -> str:
    kind = file_kind(mode)
    return f"is {kind}, not a regular file" if kind else "is not a regular file"


def _opened_path(fd: int) -> str | None:
    """The path the kernel says `fd` refers to (Linux), or None where it cannot say."""
    try:
        target = os.readlink(_PROC_FD / str(fd))
    except OSError:
        return None
    return target if target.startswith("/") else None


def hf_cache_snapshots(repo_id: str) -> list[Path]:
    """The snapshots of a Hub model in the local Hugging Face cache (`$HF_HUB_CACHE`,
    `$HF_HOME/hub`, `~/.cache/huggingface/hub`): the one `refs/main` names first, then the
    others newest first."""
    roots = [os.environ.get("HF_HUB_CACHE")]
    home = os.environ.get("HF_HOME")
    roots += [str(Path(home) / "hub") if home else None, "~/.cache/huggingface/hub"]
    folder = "models--" + repo_id.replace("/", "--")
    out: list[Path] = []
    for root in filter(None, roots):
        repo = Path(root).expanduser() / folder
        try:
            snapshots = sorted(
                (e for e in os.scandir(repo / "snapshots") if e.is_dir()),
                key=lambda e: e.stat().st_mtime,
                reverse=True,
            )
        except OSError:
            continue
        try:
            with LocalFile(repo / "refs" / "main") as reader:
                wanted = reader.read_range(0, 256).decode("utf-8", "replace").strip()
        except OSError:
            wanted = ""
        out += [Path(e.path) for e in snapshots if e.name == wanted]
        out += [Path(e.path) for e in snapshots if e.name != wanted]
    return out
