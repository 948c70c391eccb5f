"""A PyTorch `.bin` file as shard columns (`BinShard`): what `formats.torch_bin` reads of it,
in the columns a safetensors header gives, so that every index, coverage and load check
applies unchanged. Like `formats.safetensors`, this reader judges while it reads:
what it cannot read is a finding of the shard (bin-unreadable, bin-legacy-format,
bin-record-missing, pickle-hostile, pickle-bomb, file-unsafe)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

from inspector._internal.common.display import legible
from inspector._internal.common.dtypes import TORCH_DTYPES
from inspector._internal.common.text import examples
from inspector._internal.findings.finding import Finding, fold_listed, make_finding
from inspector._internal.formats.pickles.errors import (
    HostilePickleError,
    PickleBombError,
    RefusedGlobalError,
)
from inspector._internal.formats.safetensors import ShardHeader
from inspector._internal.formats.torch_bin import (
    BIN_HEADER_CAP,
    BinArchive,
    BinFormatError,
    BinLegacyError,
    BinTensor,
    ByteSource,
    ManyRanges,
    list_legacy,
    read_bin,
)
from inspector._internal.storage import Location
from inspector.errors import UNSAFE_FILE_ADVICE, UnsafeFileError

__all__ = [
    "BinShard",
    "data_unread",
    "open_columns",
    "read_bin_columns",
    "read_bin_shard",
    "strides_of",
]

S = TypeVar("S", bound=ShardHeader)


class BinShard(ShardHeader):
    """A `.bin` file as shard columns: begins and ends are absolute file offsets.

    `strided` names the tensors whose elements are not one contiguous run (a transposed
    view saved as is): their [begin, end) is where the run starts and how many bytes the
    tensor takes, not a byte range to read as is. `legacy` marks a pre-1.6 stream, whose
    tensors are listed but whose data is never read (begins and ends are 0). `byteorder` is
    what the archive's `byteorder` record says ("little" without one): any other value
    means torch.load gives other values than the stored bytes, or refuses the file."""

    __slots__ = ("byteorder", "legacy", "strides")
    byteorder: str
    legacy: bool
    strides: dict[str, tuple[int, ...]]

    @property
    def data_start(self) -> int:
        return 0


def strides_of(shard: ShardHeader) -> Mapping[str, tuple[int, ...]]:
    """The entries of `shard` that are strided `.bin` views (name -> element strides): their
    elements are not one row-major run from their begin. Empty for any other shard."""
    return shard.strides if isinstance(shard, BinShard) else {}


def data_unread(shard: ShardHeader) -> bool:
    """True for a `.bin` file whose stored bytes are not what torch.load gives, so no value,
    hash or copy is ever taken from them: a legacy (pre-1.6) stream (its tensors are listed;
    begins and ends are 0, not where any data is), and an archive whose `byteorder` record is
    not "little" (torch swaps every storage of a "big" one and refuses any other)."""
    return isinstance(shard, BinShard) and (shard.legacy or shard.byteorder != "little")


def _set(shard: ShardHeader, **values: object) -> BinShard:
    assert isinstance(shard, BinShard)  # from_columns builds the class it is called on
    for key, value in values.items():
        object.__setattr__(shard, key, value)
    return shard


def _dtype(name: str) -> str:
    st = TORCH_DTYPES[name][0]
    return st if st is not None else f"torch.{name}"


def read_bin_shard(path: Location, *, root: Location) -> BinShard:
    """One `.bin` file as shard columns; what cannot be read is a finding, never a raise. On
    a remote storage the local headers of its records are fetched concurrently."""
    storage = path.storage
    many: ManyRanges | None = None
    if not storage.is_local and not path.refused:

        def many(ranges: Sequence[tuple[int, int]]) -> list[bytes]:
            return storage.read_ranges([(path.rel, offset, n) for offset, n in ranges])

    def columns(reader: ByteSource, rel: str) -> BinShard:
        return read_bin_columns(reader, rel, many=many)

    return open_columns(path, root, columns, _unreadable, "bin-unreadable")


def open_columns(
    path: Location,
    root: Location,
    columns: Callable[[ByteSource, str], S],
    unreadable: Callable[[str, int, Finding], S],
    code: str,
) -> S:
    """`columns(reader, rel)` of a file opened through its storage; a file the storage
    refuses is `file-unsafe`, one that cannot be opened `code`: `unreadable(rel, 0, finding)`
    (shared by the readers of .bin and GGUF files)."""
    rel = path.relative_to(root)
    try:
        with path.open() as reader:
            return columns(reader, rel)
    except UnsafeFileError as exc:
        message = f"{legible(rel)}: not read, it {exc.reason}{UNSAFE_FILE_ADVICE}"
        return unreadable(rel, 0, make_finding("file-unsafe", message, file=rel))
    except OSError as exc:
        reason = exc.strerror or str(exc)
        msg = f"{legible(rel)}: cannot be read ({reason}); check that it is a readable regular file"
        return unreadable(rel, 0, make_finding(code, msg, file=rel))


def _unreadable(rel: str, size: int, finding: Finding) -> BinShard:
    shard = BinShard(rel, size, None, None, findings=(finding,))
    return _set(shard, legacy=False, strides={}, byteorder="little")


def read_bin_columns(
    reader: ByteSource, rel: str, *, cap: int = BIN_HEADER_CAP, many: ManyRanges | None = None
) -> BinShard:
    """The shard columns of one open `.bin` file (`rel` names it in findings); at most `cap`
    bytes of it read (`many`: see `read_bin`)."""
    size = reader.size()
    shown = legible(rel)
    try:
        archive = read_bin(reader, cap=cap, many=many)
    except BinLegacyError as exc:
        return _legacy(reader, rel, size, tar=str(exc) == "tar", cap=cap)
    except (HostilePickleError, PickleBombError) as exc:  # before RefusedGlobalError: hostile
        return _unreadable(rel, size, _refused(rel, "data.pkl", exc))
    except (BinFormatError, RefusedGlobalError) as exc:
        msg = f"{shown}: {exc}; expected a torch.save zip archive of a dict of tensors"
        return _unreadable(rel, size, make_finding("bin-unreadable", msg, file=rel))
    return _columns(archive, rel, size)


def _refused(rel: str, what: str, exc: HostilePickleError | PickleBombError) -> Finding:
    """The finding of a pickle the audit refused: `pickle-hostile` or `pickle-bomb`."""
    if isinstance(exc, HostilePickleError):
        msg = f"{legible(rel)}: {what} {exc}"
        return make_finding("pickle-hostile", msg, file=rel)
    msg = f"{legible(rel)}: {what} refused before unpickling: {exc.reason}"
    return make_finding("pickle-bomb", msg, file=rel)


def _legacy(reader: ByteSource, rel: str, size: int, *, tar: bool, cap: int) -> BinShard:
    shown = legible(rel)
    what = "a tar archive (torch < 0.4)" if tar else "a pickle stream (torch < 1.6)"
    base = (
        f"{shown}: the legacy torch.save format, {what}, not the zip archive torch >= 1.6 "
        "writes; its data is not read (no --deep, consolidation or repair from it): load it "
        "with torch.load(path, weights_only=True) and save it again with safetensors' "
        "save_file or torch.save"
    )
    tensors: Sequence[BinTensor] = ()
    refused: tuple[Finding, ...] = ()
    if not tar:
        try:
            tensors = list_legacy(reader, cap=cap).tensors
        except (HostilePickleError, PickleBombError) as exc:
            # Reported as such, as in a zip archive: the file is hostile, not only old.
            base += " (its tensors cannot be listed either: its pickles were refused)"
            refused = (_refused(rel, "the legacy pickle stream", exc),)
        except (BinFormatError, RefusedGlobalError) as exc:
            base += f" (its tensors cannot be listed either: {exc})"
    finding = make_finding("bin-legacy-format", base, file=rel)
    zeros = [0] * len(tensors)
    shard = BinShard.from_columns(
        rel,
        size,
        None if tar or not tensors else 0,
        None,
        [t.name for t in tensors],
        [_dtype(t.dtype) for t in tensors],
        [t.shape for t in tensors],
        zeros,
        zeros,
        (finding, *refused),
    )
    return _set(shard, legacy=True, strides={}, byteorder="little")


def _columns(archive: BinArchive, rel: str, size: int) -> BinShard:
    names: list[str] = []
    dtypes: list[str] = []
    shapes: list[tuple[int, ...]] = []
    begins: list[int] = []
    ends: list[int] = []
    strides: dict[str, tuple[int, ...]] = {}
    lost: list[tuple[str, str]] = []
    short = {
        key
        for key, (offset, length) in archive.records.items()
        if length < archive.storages[key][1]
    }
    for t in archive.tensors:
        record = archive.records.get(t.storage_key)
        if record is None:
            lost.append((t.name, f"its storage record data/{t.storage_key} is absent"))
            continue
        offset, length = record
        if t.storage_key in short:
            lost.append((t.name, f"its storage record data/{t.storage_key} is short"))
            continue
        item = t.itemsize
        if (t.storage_offset + t.span) * item > length:
            lost.append((t.name, f"it runs past the end of data/{t.storage_key}"))
            continue
        begin = offset + t.storage_offset * item
        names.append(t.name)
        dtypes.append(_dtype(t.dtype))
        shapes.append(t.shape)
        begins.append(begin)
        ends.append(begin + t.numel * item)
        if not t.contiguous:
            strides[t.name] = t.stride
    findings: list[Finding] = []
    if archive.byteorder != "little":
        findings.append(_byteorder_finding(rel, archive.byteorder))
    findings += _lost_findings(rel, lost)
    shard = BinShard.from_columns(
        rel,
        size,
        archive.pickle_bytes,
        None,
        names,
        dtypes,
        shapes,
        begins,
        ends,
        tuple(findings),
    )
    return _set(shard, legacy=False, strides=strides, byteorder=archive.byteorder)


def _byteorder_finding(rel: str, byteorder: str) -> Finding:
    """The archive's `byteorder` record is not "little" (torch.serialization._load): "big"
    makes torch.load swap the bytes of every tensor, any other value makes it refuse the
    file. Either way no stored byte is the value torch loads (`data_unread`)."""
    if byteorder == "big":
        what = (
            "stores its tensors big-endian: torch.load swaps the bytes of every tensor, so "
            "their values are not the stored bytes and none is read here (no values, hashes, "
            "--deep or conversion)"
        )
    else:
        what = (
            f"has the byte order record '{legible(byteorder)}', expected 'little' or 'big' "
            "exactly: torch.load refuses the file (Unknown endianness type)"
        )
    return make_finding(
        "bin-unreadable",
        f"{legible(rel)}: {what}; load it with torch and save it again on a little-endian machine",
        file=rel,
    )


def _lost_findings(rel: str, lost: list[tuple[str, str]]) -> list[Finding]:
    return fold_listed(
        "bin-record-missing",
        lost,
        file=rel,
        tensor=lambda item: item[0],
        message=lambda item: (
            f"{legible(rel)}: '{legible(item[0])}' has no bytes in the "
            f"archive: {item[1]}; torch.load fails on this file; re-copy it or re-save it from "
            "the source"
        ),
        rest=lambda left: (
            f"{legible(rel)}: {len(left):,} more tensors have no bytes in the "
            f"archive ({examples([n for n, _ in left[:3]])}); re-copy the file"
        ),
    )
