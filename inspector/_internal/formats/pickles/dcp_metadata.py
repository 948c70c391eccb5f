"""PyTorch DCP `.metadata` files (docs/formats.md, "Megatron torch_dist") read with the
restricted unpickler into the stand-ins `pickles.allowed` lists; torch is not imported.

`load_dcp_metadata` audits first; `read_dcp_metadata` (the scan's) runs large streams in the
bounded child of `pickles.sandbox`, falling back to the audit when it gives no answer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeVar

from inspector._internal.formats.pickles.allowed import METADATA
from inspector._internal.formats.pickles.errors import PickleFormatError
from inspector._internal.formats.pickles.sandbox import (
    DEFAULT_SANDBOX,
    SandboxFailed,
    SandboxLimits,
    SandboxUnavailable,
    run_bounded,
)
from inspector._internal.formats.pickles.stand_ins import Dims, StandIn
from inspector._internal.formats.pickles.unpickler import unpickle

__all__ = ["MetadataFormatError", "load_dcp_metadata", "read_dcp_metadata"]

T = TypeVar("T")


class MetadataFormatError(ValueError):
    """The bytes are not a readable DCP metadata pickle (truncated, corrupt, wrong shape)."""


def load_dcp_metadata(data: bytes) -> StandIn:
    """Unpickle `.metadata` bytes into stand-ins; returns the `Metadata` stand-in.

    The stream is audited first (`pickles.audit`), so nothing is unpickled that would take
    unbounded work. Raises `HostilePickleError` when the pickle names callables that run
    code, `RefusedGlobalError` when it names anything else outside the allow-list,
    `PickleBombError` when unpickling it would take unbounded work, and
    `MetadataFormatError` when the bytes are truncated, corrupt, or not DCP metadata.
    """
    return _metadata(data, audited=True)


def read_dcp_metadata(
    data: bytes,
    convert: Callable[[StandIn], T],
    *,
    classes: Iterable[type] = (),
    limits: SandboxLimits = DEFAULT_SANDBOX,
) -> T:
    """`convert(load_dcp_metadata(data))`, fast on large files.

    From `limits.min_size` bytes on (where the sandbox exists), the restricted unpickler
    and `convert` run without the audit in a child process the OS bounds (CPU time and
    memory in proportion to the input, `pickles.sandbox`): at C speed, and a
    bomb only kills the child. `convert` must turn the stand-ins into plain data (containers,
    scalars, `Dims` and the `classes` named), which is what comes back. When the child
    gives no result (a refused global, a malformed stream, a limit), the stream takes the
    audited path here, which raises what `load_dcp_metadata` raises and says precisely
    what was refused. Smaller files take the audited path directly."""
    if len(data) >= limits.min_size:
        try:
            return run_bounded(
                lambda: convert(_metadata(data, audited=False)),
                size=len(data),
                classes=(Dims, *classes),
                limits=limits,
            )
        except (SandboxUnavailable, SandboxFailed):
            pass
    return convert(load_dcp_metadata(data))


def _metadata(data: bytes, *, audited: bool) -> StandIn:
    """The `Metadata` stand-in of `data`, audited or not (in the bounded child)."""
    try:
        value = unpickle(data, METADATA, audited=audited)
    except PickleFormatError as exc:
        raise MetadataFormatError(str(exc)) from None
    if not isinstance(value, StandIn) or value.kind not in ("Metadata", "MCoreMetadata"):
        kind = value.kind if isinstance(value, StandIn) else type(value).__name__
        raise MetadataFormatError(f"holds a {kind}, expected a DCP Metadata object")
    return value
