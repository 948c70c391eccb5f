"""The small file-like interface every reader goes through: open, read a byte range, size.

A remote store only has to implement `RangeReader` to be read; the parsers never touch
`open()` themselves.
"""

from __future__ import annotations

import errno
import os
import stat
from typing import Protocol

__all__ = ["LocalFile", "RangeReader"]


class RangeReader(Protocol):
    """A readable object of known size."""

    name: str

    def size(self) -> int: ...

    def read_range(self, offset: int, length: int) -> bytes:
        """Up to `length` bytes from `offset`; fewer only at the end of the object."""
        ...

    def close(self) -> None: ...


class LocalFile:
    """A local file read with `os.pread`: no seek state, no buffering surprises."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.name = str(path)
        # O_NONBLOCK: opening a FIFO planted in a checkpoint folder must not hang the scan.
        self._fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        info = os.fstat(self._fd)
        if not stat.S_ISREG(info.st_mode):
            os.close(self._fd)
            self._fd = -1
            raise OSError(errno.EINVAL, "not a regular file", self.name)
        self._size = info.st_size

    def size(self) -> int:
        return self._size

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

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> LocalFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
