"""The common state of a DCP / Megatron checkpoint (`common.pt`, or `common_state` inside a
`.distcp` file), read with torch's own weights-only unpickler, the one Megatron's loader
uses: every pickle torch would read from the file audited first (`pickles.audit`), tensors
on the meta device, and each global torch's allow-list lacks an inert `Opaque` record made
for this read.
"""

from __future__ import annotations

import io
import zipfile
from typing import Any

from inspector._internal.formats.pickles.audit import (
    DEFAULT_LIMITS,
    PickleAudit,
    PickleLimits,
    check_pickle,
)
from inspector._internal.formats.pickles.errors import PickleFormatError
from inspector._internal.formats.torch_bin import ZIP_MAGIC, BinFormatError, same_directory

__all__ = ["Opaque", "audit_torch_save", "load_common_state"]


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


# torch's legacy (non-zip) format: magic number, protocol, system info, the object, the
# storage keys; then raw storage bytes.
_LEGACY_PICKLES = 5


def audit_torch_save(
    data: bytes, *, cap: int, limits: PickleLimits = DEFAULT_LIMITS
) -> tuple[PickleAudit, ...]:
    """Audit every pickle `torch.load` would read from `data` (a `torch.save` file): each
    `.pkl` member of the zip archive (duplicates included, each read with at most `cap`
    bytes), or the pickles of the legacy stream. Raises like `check_pickle`; a zip that
    cannot be read, or that torch would read as another archive, is a `PickleFormatError`.

    torch takes the file for a zip exactly when it starts with a zip's local header
    (`torch.serialization._is_zipfile`), else for the legacy stream: a legacy stream with a
    zip after it is audited as the stream torch unpickles, not as the zip `zipfile` finds."""
    if data[:4] == ZIP_MAGIC:
        return tuple(check_pickle(p, limits=limits) for p in _zip_pickles(data, cap))
    audits = []
    pos = 0
    for _ in range(_LEGACY_PICKLES):
        if pos >= len(data):
            break
        audit = check_pickle(data, start=pos, limits=limits)
        audits.append(audit)
        pos = audit.end
    return tuple(audits)


def _zip_pickles(data: bytes, cap: int) -> list[bytes]:
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            infos = archive.infolist()
            # torch's reader must find the directory `zipfile` found (two archives one
            # after the other are two files to them), and looks `<archive>/data.pkl` up
            # ignoring ASCII case (miniz): every member named so in any case is audited.
            same_directory(
                lambda at, n: data[at : at + n], len(data), archive.start_dir, len(infos)
            )
            members = [i for i in infos if i.filename.lower().endswith(".pkl")]
            if not members:
                raise PickleFormatError("the zip archive holds no pickle (no data.pkl)")
            out = []
            for info in members:
                with archive.open(info) as fh:
                    blob = fh.read(cap + 1)  # decompressed size capped: no zip bomb
                if len(blob) > cap:
                    raise PickleFormatError(f"{info.filename} unpacks to more than {cap:,} bytes")
                out.append(blob)
            return out
    except BinFormatError as exc:
        raise PickleFormatError(str(exc)) from None
    except (zipfile.BadZipFile, zipfile.LargeZipFile, NotImplementedError, EOFError) as exc:
        raise PickleFormatError(f"is not a readable torch.save archive ({exc})") from None
    except OSError as exc:  # zlib and CRC errors surface as OSError subclasses in places
        raise PickleFormatError(f"is not a readable torch.save archive ({exc})") from None
