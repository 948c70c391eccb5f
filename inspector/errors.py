"""The project's exceptions. Scans turn problems into findings; these are for the rest.

Messages name the file, the bad value, what was expected and what to do. A message is what
people read: it goes through `inspector._internal.common.display.legible` (one line, bounded,
control characters escaped), whatever names the raiser put in it.
"""

from __future__ import annotations

import errno

from inspector._internal.common.display import LINE_LIMIT, legible
from inspector._internal.findings.codes import Code

__all__ = [
    "UNSAFE_FILE_ADVICE",
    "CannotInspectError",
    "FileShrankError",
    "InspectorError",
    "PlanRefusedError",
    "RemoteAccessError",
    "UnsafeFileError",
    "UnsafeInputError",
]


class InspectorError(Exception):
    """Base class of every error this package raises on purpose."""

    def __init__(self, message: object = "", *args: object) -> None:
        super().__init__(legible(message, limit=LINE_LIMIT), *args)


class CannotInspectError(InspectorError):
    """The path cannot be inspected at all (missing, empty, not a checkpoint)."""


class UnsafeInputError(InspectorError):
    """A file asked for something we refuse to do (execute code, leave the folder)."""


class UnsafeFileError(UnsafeInputError):
    """A file the storage layer refuses to open: not a regular file (a FIFO, a device, a
    socket), a link whose target leaves the checkpoint folder, or a link loop. Nothing of it
    was read. `file` is relative to the checkpoint folder; `reason` is a clause that follows
    it ("is a FIFO, not a regular file")."""

    def __init__(self, file: str, reason: str) -> None:
        super().__init__(f"{legible(file)} {reason}; not read")
        self.file = file
        self.reason = reason


# What a finding about a refused file tells people to do (scan and consolidate say the same):
# a FIFO, a link leaving the folder and a name no loader reads the same way are all fixed so.
# What to do about a file the storage refused: the fix of its code, as a message's tail.
UNSAFE_FILE_ADVICE = f"; {Code.FILE_UNSAFE.fix.text}"


class RemoteAccessError(InspectorError):
    """Remote storage refused us or cannot be reached (no credentials, 403, 404 of the
    checkpoint itself, retries exhausted): the message says which URL and what to do."""


class PlanRefusedError(InspectorError):
    """A repair or consolidation plan cannot decide something without a user policy."""


class FileShrankError(OSError):
    """A local file ended before bytes it held when it was opened: another process cut it
    short (or is still writing it) while it was read. `at` is the byte it ended at. Tensor
    data is read with `pread`/`preadv` for this reason: through a memory map, the same cut
    kills the process with SIGBUS."""

    def __init__(self, name: str, at: int) -> None:
        super().__init__(
            errno.EIO, f"the file ended at byte {at:,}: it got shorter while it was read", name
        )
        self.at = at
