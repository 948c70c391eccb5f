"""The storage interface: what every reader may do with a checkpoint's files, local or remote.

A `Storage` is rooted at one folder; readers name files relative to it and can only list,
stat, open a `RangeReader`, read a small file whole under a cap, and read concurrently. The
implementations enforce every hostile-input rule, so no reader can forget one. `Location` is
a handle on one entry with the few path operations the layout readers need.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path, PurePosixPath
from threading import Lock
from typing import Protocol, TypeVar

from inspector._internal.common.display import legible
from inspector.errors import UnsafeFileError

__all__ = [
    "Entry",
    "EntryKind",
    "IOStats",
    "Location",
    "RangeReader",
    "RemoteURL",
    "Storage",
    "TooLargeError",
    "check_member",
    "member_problem",
]

T = TypeVar("T")
U = TypeVar("U")


class RangeReader(Protocol):
    """A readable object of known size."""

    name: str

    def size(self) -> int: ...

    def read_range(self, offset: int, length: int) -> bytes:
        """Up to `length` bytes from `offset`; fewer only at the end of the object."""
        ...

    def close(self) -> None: ...

    def __enter__(self) -> RangeReader: ...

    def __exit__(self, *exc: object) -> None: ...


class EntryKind(StrEnum):
    FILE = "file"
    DIR = "dir"
    # Present, but never opened: not a regular file (FIFO, device, socket), a link whose
    # target leaves the checkpoint folder, or a link loop. Readers report it, never skip it.
    REFUSED = "refused"


@dataclass(frozen=True, slots=True)
class Entry:
    """One entry of a folder. `size` is known for files (None where a store does not say);
    `reason` says why a REFUSED entry is refused, as a clause after its name (for a remote
    file of unknown size, why the store did not say it). `sha256` and `blob_sha1` are the
    checksums a store's listing records for a file (the Hub's `lfs.oid` and git `oid`)."""

    name: str
    kind: EntryKind
    size: int | None = None
    reason: str | None = None
    sha256: str | None = None
    blob_sha1: str | None = None


class TooLargeError(ValueError):
    """A file over the cap a reader gave; nothing past the size check was read."""

    def __init__(self, file: str, size: int, cap: int) -> None:
        super().__init__(f"{file} is {size:,} bytes, over the {cap:,}-byte limit")
        self.size = size
        self.cap = cap


@dataclass
class IOStats:
    """What a storage fetched: requests and bytes (remote stores count them; the header-only
    promise is tested with these and with the bytes a test server sends)."""

    requests: int = 0
    bytes: int = 0
    retries: int = 0
    _lock: Lock = field(default_factory=Lock, repr=False, compare=False)

    def add(self, nbytes: int, *, retry: bool = False) -> None:
        with self._lock:
            if retry:
                self.retries += 1
            else:
                self.requests += 1
                self.bytes += nbytes


@dataclass(frozen=True, slots=True)
class RemoteURL:
    """The root of a remote checkpoint as people see it (`s3://bucket/prefix`). Not a local
    path: it has no `__fspath__`, so no local file function can be handed one by mistake."""

    url: str

    @property
    def name(self) -> str:
        return self.url.rstrip("/").rsplit("/", 1)[-1]

    def __truediv__(self, name: str) -> RemoteURL:
        return RemoteURL(f"{self.url.rstrip('/')}/{name}")

    def __str__(self) -> str:
        return self.url


class Storage(Protocol):
    """A checkpoint folder's files. Implementations: `LocalStorage`, `FsspecStorage`."""

    @property
    def path(self) -> Path | RemoteURL:
        """The root: a local folder, or the URL of a remote one."""
        ...

    @property
    def is_local(self) -> bool: ...

    @property
    def stats(self) -> IOStats: ...

    def sub(self, rel: str) -> Storage:
        """The storage rooted at folder `rel`, under the same confinement."""
        ...

    def fresh(self) -> Storage:
        """The same storage with nothing remembered (listings), for a re-scan."""
        ...

    def entries(self, rel: str = "") -> list[Entry]:
        """Entries of folder `rel` sorted by name; empty when it is not a readable folder."""
        ...

    def stat(self, rel: str) -> Entry | None:
        """The entry `rel`, or None when nothing is there."""
        ...

    def open(self, rel: str) -> RangeReader:
        """A reader of file `rel`. Raises `UnsafeFileError` for a refused entry, OSError
        (FileNotFoundError, PermissionError...) when it cannot be opened."""
        ...

    def read_bytes(self, rel: str, *, cap: int) -> bytes:
        """The whole file, at most `cap` bytes (`TooLargeError` past it)."""
        ...

    def read_range(self, rel: str, offset: int, length: int) -> bytes:
        """Up to `length` bytes of file `rel` from `offset` (one ranged request remotely);
        fewer only at the end of the file."""
        ...

    def read_ranges(self, ranges: Sequence[tuple[str, int, int]]) -> list[bytes]:
        """(file, offset, length) ranges, read concurrently where the store allows."""
        ...

    def try_read_ranges(
        self, ranges: Sequence[tuple[str, int, int]]
    ) -> list[bytes | OSError | UnsafeFileError]:
        """`read_ranges`, with the error of each range that cannot be read in its place
        (the others are still read). An error that ends the whole run (`RemoteAccessError`:
        no credentials, a store that keeps failing) is raised."""
        ...

    def map(self, fn: Callable[[T], U], items: Sequence[T], *, desc: str = "") -> list[U]:
        """`[fn(x) for x in items]`, with as many in flight as this storage allows and a
        progress bar (`desc`) for long remote runs."""
        ...

    def prefetch(
        self, wanted: Sequence[tuple[str, int | Callable[[bytes, int], int]]], *, desc: str = ""
    ) -> None:
        """A hint: fetch the start of these files at once (remote stores), so that opening
        them later costs no request. `want` per file: a byte count from the start, or a
        function of the first bytes and the file size. Local storage has nothing to do."""
        ...


_NOT_UTF8 = re.compile("[\ud800-\udfff\ufffd]")


def member_problem(rel: str) -> str | None:
    """Why `rel` cannot name a file of a checkpoint (a clause that follows the name), or None.

    The one rule for every name a reader meets: the names a folder lists, the names JSON
    files give (index and sidecar weight maps, DCP storage paths) and the paths joined under
    a root. A member is a relative POSIX path that stays under its root and means the same
    file to every tool that reads the checkpoint: no absolute path, no `..`, no backslash (a
    folder separator on Windows and to loaders that normalise paths), no NUL, and valid UTF-8
    (a name the file system holds as other bytes reaches Python as lone surrogates, which no
    JSON index, hub or table can hold; a listing shows each such byte as U+FFFD, so U+FFFD
    is refused too)."""
    if "\x00" in rel:
        return "has a NUL character in its name"
    if not rel.isascii() and _NOT_UTF8.search(rel):
        return "has a name that is not valid UTF-8"
    if "\\" in rel:
        return (
            "has a backslash in its name, which Windows and loaders that normalise paths read "
            "as a folder separator"
        )
    if rel.startswith("/"):
        return "is an absolute path"
    if ".." in rel.split("/"):
        return "leaves the folder through '..'"
    return None


def check_member(rel: str) -> str:
    """`rel` as a normalised relative POSIX path that stays under its root (empty and `.`
    parts dropped); ValueError when `member_problem` refuses it."""
    problem = member_problem(rel)
    if problem is not None:
        raise ValueError(
            f"'{legible(rel)}' {problem}; expected a relative path inside the checkpoint folder"
        )
    return "/".join(p for p in rel.split("/") if p not in ("", "."))


@dataclass(frozen=True, slots=True)
class Location:
    """One entry of a storage: `storage` and a path relative to its root ("" is the root).

    The path operations the layout readers use (`/`, `name`, `parent`, `is_file`...), each
    answered by the storage, so every check the storage makes applies.

    A path `member_problem` refuses (a listed file named `a\\b.safetensors`, a joined `..`)
    is still a location, `refused` saying why: it is listed and reported like a FIFO or a link
    leaving the folder (an entry of kind REFUSED; opening or reading it raises
    `UnsafeFileError`, a `file-unsafe` finding) and never reaches the storage."""

    storage: Storage
    rel: str = ""
    refused: str | None = None

    def __truediv__(self, name: str) -> Location:
        joined = f"{self.rel}/{name}" if self.rel else name
        problem = self.refused or member_problem(joined)
        if problem is not None:  # never reaches the storage: its name needs only be shown
            return Location(self.storage, _NOT_UTF8.sub("\ufffd", joined), problem)
        return Location(self.storage, check_member(joined))

    def __str__(self) -> str:
        return str(self.path)

    @property
    def path(self) -> Path | RemoteURL:
        """The entry as people see it (a local path or a URL)."""
        return self.storage.path / self.rel if self.rel else self.storage.path

    @property
    def name(self) -> str:
        return PurePosixPath(self.rel).name if self.rel else self.storage.path.name

    @property
    def parent(self) -> Location:
        """The folder holding this entry; the root has none (ValueError): nothing above the
        root is ever reachable."""
        if not self.rel:
            raise ValueError(f"{self}: the checkpoint folder's parent is not reachable")
        parent = PurePosixPath(self.rel).parent.as_posix()
        return Location(self.storage, "" if parent == "." else parent)

    def relative_to(self, root: Location) -> str:
        """This entry's path relative to the folder `root` (of the same storage)."""
        if root.storage is not self.storage:
            raise ValueError(f"{self} is not in {root}")
        if not root.rel:
            return self.rel
        if not self.rel.startswith(root.rel + "/"):
            raise ValueError(f"{self} is not in {root}")
        return self.rel[len(root.rel) + 1 :]

    def stat(self) -> Entry | None:
        if self.refused is not None:
            return Entry(self.name, EntryKind.REFUSED, reason=self.refused)
        return self.storage.stat(self.rel)

    def is_dir(self) -> bool:
        entry = self.stat()
        return entry is not None and entry.kind is EntryKind.DIR

    def is_file(self) -> bool:
        """A file to read: a regular file, or an entry reading will refuse and report (a
        FIFO, a link leaving the folder...). Such entries are never silently skipped."""
        entry = self.stat()
        return entry is not None and entry.kind is not EntryKind.DIR

    def entries(self) -> list[Entry]:
        """The folder's entries; one whose name `member_problem` refuses is REFUSED."""
        if self.refused is not None:
            return []
        return [_named(e) for e in self.storage.entries(self.rel)]

    def open(self) -> RangeReader:
        self._check()
        return self.storage.open(self.rel)

    def read_bytes(self, *, cap: int) -> bytes:
        self._check()
        return self.storage.read_bytes(self.rel, cap=cap)

    def as_root(self) -> Storage:
        """A storage rooted at this folder (same confinement as its own)."""
        self._check()
        return self.storage.sub(self.rel) if self.rel else self.storage

    def _check(self) -> None:
        if self.refused is not None:
            raise UnsafeFileError(self.rel, self.refused)


def _named(entry: Entry) -> Entry:
    problem = member_problem(entry.name)
    if problem is None:
        return entry
    # Lone surrogates (bytes that are not UTF-8) would break every table the name reaches.
    name = _NOT_UTF8.sub("\ufffd", entry.name)
    return Entry(name, EntryKind.REFUSED, reason=problem)
