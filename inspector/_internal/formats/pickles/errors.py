"""What a pickle reader refuses, and why: one exception per reason, the same for every reader.

`except` clauses name `HostilePickleError` before `RefusedGlobalError`: a hostile pickle is
also a refused one, and is reported as `pickle-hostile`, not as an unreadable file.
"""

from __future__ import annotations

from inspector._internal.common.text import short_repr
from inspector.errors import UnsafeInputError

__all__ = [
    "GlobalMutationError",
    "HostilePickleError",
    "PickleBombError",
    "PickleFormatError",
    "RefusedGlobalError",
]


class PickleFormatError(ValueError):
    """Not a readable pickle (truncated, unknown opcode, stack underflow), or one whose
    content is not what its reader reads (a tensor size that is not a tuple of ints); the
    message is a clause after the stream's name."""


class PickleBombError(UnsafeInputError):
    """The pickle would make unpickling or walking its result do unbounded work."""

    def __init__(self, reason: str, *, kind: str) -> None:
        self.reason = reason
        self.kind = kind  # "depth", "size", "cycle", "int"
        super().__init__(reason)


class RefusedGlobalError(UnsafeInputError):
    """The pickle names a global its reader does not resolve; nothing was run. `globals`
    holds the names ("module.name")."""

    def __init__(self, message: str, *, names: tuple[str, ...]) -> None:
        self.globals = names
        super().__init__(message)


class HostilePickleError(RefusedGlobalError):
    """The pickle names callables that run code or reach the system; nothing was run."""

    def __init__(self, names: tuple[str, ...], *, message: str | None = None) -> None:
        if message is None:
            # Names come from the file: each is shown bounded, so a finding never echoes
            # much of it.
            shown = ", ".join(short_repr(n, limit=120) for n in names[:8])
            shown += f" and {len(names) - 8} more" if len(names) > 8 else ""
            message = (
                f"names {shown}, which can run code or reach the system: a hostile file, "
                "refused before unpickling (nothing ran)"
            )
        super().__init__(message, names=names)


class GlobalMutationError(HostilePickleError):
    """The pickle changes an object it names as a global, or takes one from this process's
    copyreg registry: what a reader hands it for a global would carry the change into every
    later read of the process. No writer does either; nothing was run.

    `name` is the global (as the audit lists it) or the stand-in; `action` says what the
    stream does to it ("BUILD at byte 14", "sets its attribute 'dtype'")."""

    def __init__(self, name: str, *, action: str) -> None:
        self.action = action
        super().__init__(
            (name,),
            message=(
                f"{action} changes {short_repr(name, limit=120)}, a global it names: the "
                "object a reader hands out for it would carry the change into every later "
                "read; no writer does that: a hostile file, refused (nothing ran)"
            ),
        )
