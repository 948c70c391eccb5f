"""The common state of a DCP / Megatron checkpoint (`common.pt`, or `common_state` inside a
`.distcp` file), read with torch's own weights-only unpickler, the one Megatron's loader
uses: every pickle of the file audited first (`pickles.audit`), tensors on the meta device,
and each global torch's allow-list lacks an inert `Opaque` record made for this read.
"""

from __future__ import annotations

import io
from typing import Any

from inspector._internal.formats.pickles.audit import audit_torch_save

__all__ = ["Opaque", "load_common_state"]


class Opaque:
    """Inert stand-in torch's weights-only unpickler may construct for a named global."""

    qualname = "?"
    args: tuple[Any, ...] = ()
    state: Any = None

    def __init__(self, *args: Any) -> None:
        self.args = args

    def __setstate__(self, state: Any) -> None:
        self.state = state


def load_common_state(torch: Any, data: bytes, *, cap: int) -> Any:
    """`torch.load(weights_only=True)` of `data` (each pickle at most `cap` bytes), where
    each global torch would refuse (Megatron enums, `argparse.Namespace`...) is replaced by
    an `Opaque` record: nothing is imported. Plain DCP (unlike Megatron's planner) pickles a
    BytesIO object around the payload: that payload is read the same way.

    A pickle naming code-running callables or asking for unbounded work is refused before
    torch sees it (`HostilePickleError`, `PickleBombError`). Tensors load on the meta
    device: only dtype and shape are kept, so no storage size the file claims is ever
    allocated."""
    value = _inert_torch_load(torch, data, cap)
    if isinstance(value, Opaque) and value.qualname == "_io.BytesIO":
        inner = value.state[0] if isinstance(value.state, tuple) and value.state else None
        if isinstance(inner, bytes):
            return _inert_torch_load(torch, inner, cap)
    return value


def _inert_torch_load(torch: Any, data: bytes, cap: int) -> Any:
    audit_torch_save(data, cap=cap)
    try:
        names = torch.serialization.get_unsafe_globals_in_checkpoint(io.BytesIO(data))
    except Exception:  # legacy (non-zip) format or a corrupt file: torch.load reports it
        names = []
    stand_ins = [(type("Opaque", (Opaque,), {"qualname": n}), n) for n in names]
    with torch.serialization.safe_globals(stand_ins):
        return torch.load(io.BytesIO(data), weights_only=True, map_location="meta")
