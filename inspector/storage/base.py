"""The storage interface: what every reader may do with a checkpoint's files, local or remote.

A `Storage` is rooted at one folder (a local directory or a remote prefix). Readers name
files relative to that root and can only list a folder, stat an entry, open a file as a
`RangeReader`, read a small file whole under a cap, and run reads concurrently. Everything
that keeps hostile input harmless (regular files only, size caps, nothing outside the root)
is enforced by the implementations, so no reader can forget it. `Location` is a handle on
one entry, with the few path operations the layout readers need.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path, PurePosixPath
from threading import Lock
from typing import Protocol, TypeVar

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
    file of unknown size, why the store did not say it)."""

    name: str
    kind: EntryKind
    size: int | None = None
    reason: str | None = None


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


def check_member(rel: str) -> str:
    """`rel` as a normalised relative POSIX path that stays under its root; ValueError for an
    absolute path, `..`, an empty part, a backslash or a NUL (nothing that could leave it)."""
    if not rel:
        return ""
    if "\x00" in rel or "\\" in rel or rel.startswith("/"):
        raise ValueError(f"{rel!r}: expected a relative path inside the checkpoint folder")
    parts = [p for p in rel.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise ValueError(f"{rel!r}: expected a relative path inside the checkpoint folder")
    return "/".join(parts)


@dataclass(frozen=True, slots=True)
class Location:
    """One entry of a storage: `storage` and a path relative to its root ("" is the root).

    The path operations the layout readers use (`/`, `name`, `parent`, `is_file`...), each
    answered by the storage, so every check the storage makes applies."""

    storage: Storage
    rel: str = ""

    def __truediv__(self, name: str) -> Location:
        joined = f"{self.rel}/{name}" if self.rel else name
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
        return self.storage.entries(self.rel)

    def open(self) -> RangeReader:
        return self.storage.open(self.rel)

    def read_bytes(self, *, cap: int) -> bytes:
        return self.storage.read_bytes(self.rel, cap=cap)

    def as_root(self) -> Storage:
        """A storage rooted at this folder (same confinement as its own)."""
        return self.storage.sub(self.rel) if self.rel else self.storage
