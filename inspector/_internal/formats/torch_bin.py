"""Read the header of a PyTorch `.bin` / `.pt` file (`torch.save`) without its tensor data.

The zip's directory, each storage record's local header and `data.pkl` (audited, then
unpickled with a restricted unpickler whose globals are inert stand-ins made for each read)
are read in a few bounded reads, since on a remote store each read is a round trip. The
pre-1.6 stream is recognised and reported as `BinLegacyError`. How: docs/architecture.md,
"formats/".
"""

from __future__ import annotations

import io
import math
import re
import struct
import zipfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from inspector._internal.common.display import legible
from inspector._internal.common.dtypes import TORCH_DTYPES
from inspector._internal.common.text import short_repr
from inspector._internal.formats.pickles.allowed import DATA_PKL
from inspector._internal.formats.pickles.audit import check_pickle
from inspector._internal.formats.pickles.errors import PickleFormatError
from inspector._internal.formats.pickles.stand_ins import StorageType, TorchStorage, TorchTensor
from inspector._internal.formats.pickles.unpickler import unpickle


class ByteSource(Protocol):
    """What the reader needs of a file: its size and ranged reads (a `RangeReader` is one)."""

    def size(self) -> int: ...

    def read_range(self, offset: int, length: int) -> bytes: ...


__all__ = [
    "BIN_HEADER_CAP",
    "HEADER_WINDOW",
    "LEGACY_MAGIC",
    "TAIL_BYTES",
    "BinArchive",
    "BinFormatError",
    "BinLegacyError",
    "BinTensor",
    "ByteSource",
    "LegacyListing",
    "ManyRanges",
    "list_legacy",
    "read_bin",
    "same_directory",
]

# How many bytes of a file the header reader may read in all: the zip's directories, local
# headers and data.pkl. A million tensors need about 150 MB.
BIN_HEADER_CAP = 400_000_000
# How many records a zip may list (each storage is one): far past any real checkpoint.
MAX_RECORDS = 10_000_000
ZIP_MAGIC = b"PK\x03\x04"
# `torch.save(..., _use_new_zipfile_serialization=False)`: PROTO 2, LONG1 of the magic number.
LEGACY_MAGIC = bytes.fromhex("80028a0a6cfc9c46f9206aa850192e")
_LOCAL_HEADER = struct.Struct("<4s22xHH")  # signature ... name length, extra length
# The file's tail read first: the end of central directory record (22 bytes, 98 with the
# zip64 records) and the central directory before it (about 100 bytes a record).
TAIL_BYTES = 64 << 10
# Local headers closer than `_HEADER_GAP` are fetched in one read of at most `HEADER_WINDOW`
# bytes (small storages sit between them); `_EXTRA_GUESS` bytes are read for each header's
# extra field (torch pads it to a 64-byte boundary; a zip64 block adds 20).
HEADER_WINDOW = 256 << 10
_HEADER_GAP = 4 << 10
_EXTRA_GUESS = 160

# Reads of many (offset, length) ranges of the same file at once, answered in order.
ManyRanges = Callable[[Sequence[tuple[int, int]]], list[bytes]]


class BinFormatError(ValueError):
    """Not a readable `torch.save` archive; the message is a clause after the file name."""


class BinLegacyError(ValueError):
    """The pre-1.6 non-zip stream (or an older tar archive): not read."""


@dataclass(frozen=True, slots=True)
class BinTensor:
    """One tensor of data.pkl: where its elements are, in elements of `dtype`."""

    name: str
    dtype: str  # torch dtype name (float32, bfloat16, float8_e4m3fn...)
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    storage_offset: int
    storage_key: str
    requires_grad: bool

    @property
    def itemsize(self) -> int:
        return TORCH_DTYPES[self.dtype][1]

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def span(self) -> int:
        """Elements of the storage the tensor touches, from its offset (0 when empty)."""
        if 0 in self.shape:
            return 0
        return 1 + sum((n - 1) * s for n, s in zip(self.shape, self.stride, strict=True))

    @property
    def contiguous(self) -> bool:
        expect = 1
        for n, s in zip(reversed(self.shape), reversed(self.stride), strict=True):
            if n != 1 and s != expect:
                return False
            expect *= n
        return True


@dataclass(frozen=True, slots=True)
class BinArchive:
    """What a `torch.save` zip says: its tensors and where each storage's bytes are."""

    prefix: str
    tensors: tuple[BinTensor, ...]
    # storage key -> (absolute offset of its record's data, record bytes); keys data.pkl
    # names but the archive lacks are absent.
    records: Mapping[str, tuple[int, int]]
    # storage key -> (torch dtype of the storage, bytes it declares)
    storages: Mapping[str, tuple[str, int]]
    byteorder: str
    pickle_bytes: int
    # Entries of data.pkl that are not tensors (a nested dict, a number): name -> type name.
    skipped: Mapping[str, str]


# -- a file object over a range reader, with a budget ---------------------------------------


class _Budgeted(io.RawIOBase):
    """A seekable read-only view of a `ByteSource` that raises `BinFormatError` once more
    than `budget` bytes have been read (zipfile reads the whole central directory a hostile
    end record asks for)."""

    def __init__(self, reader: ByteSource, budget: int) -> None:
        super().__init__()
        self._reader = reader
        self._size = reader.size()
        self._pos = 0
        self.left = budget
        self._tail = b""  # the last bytes of the file, once `keep_tail` read them

    def keep_tail(self, length: int) -> None:
        """Read the last `length` bytes once: the reads zipfile makes of the end record and
        the directory are then served from them."""
        length = min(length, self._size)
        self._tail = self.pread(self._size - length, length)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def read(self, size: int | None = -1) -> bytes:
        if size is None or size < 0:
            size = self._size - self._pos
        size = max(0, min(size, self._size - self._pos))
        data = self.pread(self._pos, size)
        self._pos += len(data)
        return data

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def pread(self, offset: int, size: int, *, cost: int | None = None) -> bytes:
        """`size` bytes at `offset`, `cost` of them (default all) counted in the budget."""
        self.charge(size if cost is None else cost)
        tail_at = self._size - len(self._tail)
        if self._tail and offset + size > tail_at:
            head = self._reader.read_range(offset, tail_at - offset) if offset < tail_at else b""
            return head + self._tail[max(0, offset - tail_at) : offset + size - tail_at]
        return self._reader.read_range(offset, size) if size else b""

    def charge(self, size: int) -> None:
        """Count `size` bytes against the budget (raising once it is spent)."""
        if size > self.left:
            raise BinFormatError(
                "asks for more header bytes than the limit for .bin archives "
                f"({BIN_HEADER_CAP:,} bytes of directories and data.pkl); a real "
                "checkpoint needs far less: the file is corrupt or crafted"
            )
        self.left -= size


# -- data.pkl --------------------------------------------------------------------------------


class _Storages:
    """The persistent ids of one data.pkl (`torch.save`'s storage references): each becomes
    a `TorchStorage` record, one per key; no storage byte is read."""

    def __init__(self, *, legacy: bool) -> None:
        self.legacy = legacy
        self.found: dict[str, TorchStorage] = {}

    def __call__(self, pid: Any) -> TorchStorage:
        size = 6 if self.legacy else 5
        if not isinstance(pid, tuple) or len(pid) != size or pid[0] != "storage":
            raise PickleFormatError("has a persistent id that is not a storage reference")
        kind, key, numel = pid[1], pid[2], pid[4]
        if not isinstance(kind, StorageType) or type(key) is not str or len(key) > 1000:
            raise PickleFormatError("has a malformed storage reference")
        if type(numel) is not int or numel < 0:
            raise PickleFormatError(f"gives storage {key!r:.40} a bad size")
        if self.legacy and pid[5] is not None:
            raise PickleFormatError("holds a storage view (pre-1.6 format); not read")
        known = self.found.get(key)
        if known is not None:
            return known
        storage = TorchStorage(key=key, dtype=kind.dtype, numel=numel)
        self.found[key] = storage
        return storage


def _unpickle(data: bytes, *, legacy: bool) -> tuple[Any, dict[str, TorchStorage]]:
    """The audited, restricted unpickling of one pickle (`data` holds exactly it);
    `HostilePickleError` and `PickleBombError` propagate."""
    storages = _Storages(legacy=legacy)
    try:
        value = unpickle(data, DATA_PKL, persistent=storages)
    except PickleFormatError as exc:
        raise BinFormatError(f"data.pkl {exc}") from None
    return value, storages.found


def _tensors(value: Any) -> tuple[list[BinTensor], dict[str, str]]:
    """The tensors of a state dict (`{name: tensor}`); a model wrapped in {"state_dict": ..}
    or {"model": ...} is unwrapped once. Other entries are listed as skipped."""
    if not isinstance(value, dict):
        raise BinFormatError(f"data.pkl holds a {type(value).__name__}, expected a dict of tensors")
    if not any(isinstance(v, TorchTensor) for v in value.values()):
        for wrapper in ("state_dict", "model", "module"):
            inner = value.get(wrapper)
            if isinstance(inner, dict) and any(isinstance(v, TorchTensor) for v in inner.values()):
                value = inner
                break
    tensors: list[BinTensor] = []
    skipped: dict[str, str] = {}
    for name, item in value.items():
        if not isinstance(name, str):
            skipped[repr(name)[:200]] = type(item).__name__
        elif isinstance(item, TorchTensor):
            assert item.dtype is not None
            tensors.append(
                BinTensor(
                    name,
                    item.dtype,
                    item.shape,
                    item.stride,
                    item.offset,
                    item.storage.key,
                    item.requires_grad,
                )
            )
        else:
            skipped[name] = type(item).__name__
    return tensors, skipped


# -- the archive -----------------------------------------------------------------------------


def read_bin(
    reader: ByteSource, *, cap: int = BIN_HEADER_CAP, many: ManyRanges | None = None
) -> BinArchive:
    """The header of a `torch.save` zip. Raises `BinLegacyError` for the pre-1.6 format,
    `BinFormatError` for anything unreadable, `HostilePickleError` / `RefusedGlobalError` /
    `PickleBombError` for a data.pkl that is refused. Reads at most `cap` bytes; `many`
    fetches the storage records' local headers concurrently (else one after the other)."""
    size = reader.size()
    head = reader.read_range(0, min(size, len(LEGACY_MAGIC)))
    if head[:4] != ZIP_MAGIC:
        if head == LEGACY_MAGIC:
            raise BinLegacyError("legacy")
        if size >= 262 and reader.read_range(257, 5) == b"ustar":
            raise BinLegacyError("tar")
        raise BinFormatError(
            f"is not a torch.save archive (starts with {head[:4].hex()}, expected "
            f"{ZIP_MAGIC.hex()}, a zip)"
        )
    fh = _Budgeted(reader, cap)
    try:
        fh.keep_tail(TAIL_BYTES)
        with zipfile.ZipFile(fh) as archive:
            infos = archive.infolist()
            start_dir = archive.start_dir
    except BinFormatError:
        raise
    # zipfile raises many kinds on a corrupt directory (BadZipFile, NotImplementedError for a
    # version it does not know, struct.error, UnicodeDecodeError...): all mean "unreadable".
    except Exception as exc:
        raise BinFormatError(
            f"is not a readable zip archive ({short_repr(str(exc))}); it may be truncated"
        ) from None
    if len(infos) > MAX_RECORDS:
        raise BinFormatError(f"lists {len(infos):,} records, over the {MAX_RECORDS:,} limit")
    same_directory(fh.pread, size, start_dir, len(infos))
    prefix, by_name = _records(infos)

    def record(name: str) -> zipfile.ZipInfo | None:
        # torch looks a record up by the UTF-8 bytes of "<prefix>/<name>" (getRecordID),
        # through miniz's binary search, which ignores ASCII case (`_folded`)
        return by_name.get(_folded(prefix + b"/" + name.encode("utf-8", "surrogatepass")))

    pkl = record("data.pkl")
    if pkl is None:
        raise BinFormatError(
            f"holds no {legible(prefix.decode('utf-8', 'replace'))}/data.pkl record (torch reads "
            "the one named after the archive's first record): not a torch.save archive"
        )
    version = record("version")
    if version is None:
        raise BinFormatError("holds no <prefix>/version record; torch.load refuses the file")
    data = _record_bytes(fh, pkl, size)
    value, storages = _unpickle(data, legacy=False)
    tensors, skipped = _tensors(value)
    order = record("byteorder")
    wanted = [i for key in storages if (i := record(f"data/{key}")) is not None]
    starts = _data_offsets(fh, [*wanted, version, *([order] if order else [])], size, many)
    _check_version(fh.pread(starts[version.header_offset], min(version.file_size, 64)))
    # torch.serialization._load: no record is little-endian; a record must say exactly
    # b"little" or b"big" (anything else: "Unknown endianness type"), and "big" makes torch
    # swap every storage it loads (`UntypedStorage.byteswap`).
    byteorder = "little"
    if order is not None:
        raw_order = fh.pread(starts[order.header_offset], min(order.file_size, 64))
        byteorder = raw_order.decode("ascii", "backslashreplace")
    records = {
        key: (starts[info.header_offset], info.file_size)
        for key in storages
        if (info := record(f"data/{key}")) is not None
    }
    return BinArchive(
        pkl.filename[: -len("/data.pkl")],
        tuple(tensors),
        records,
        {k: (s.dtype or "uint8", s.numel * _itemsize(s)) for k, s in storages.items()},
        byteorder,
        len(data),
        skipped,
    )


# The zip's end records (APPNOTE 4.3.14-4.3.16): the end of central directory record, and
# before it, in a zip64 archive such as torch.save writes, the zip64 locator and record.
_END = struct.Struct("<4sHHHHIIH")  # signature, disks, entries here, entries, size, offset
_LOCATOR = struct.Struct("<4sIQI")  # signature, disk, offset of the zip64 record, disks
_END64 = struct.Struct("<4sQHHIIQQQQ")  # ..., entries here, entries, directory size, offset
_END_SIG, _LOCATOR_SIG, _END64_SIG = b"PK\x05\x06", b"PK\x06\x07", b"PK\x06\x06"


def same_directory(
    pread: Callable[[int, int], bytes], size: int, start_dir: int, count: int
) -> None:
    """Refuse an archive whose central directory torch and `zipfile` would find in different
    places, or read a different number of records of.

    torch's reader (miniz, `mz_zip_reader_read_central_dir`) reads the directory at the
    offset the end record states (the zip64 record's, which it finds through the zip64
    locator) and exactly the number of records it states; `zipfile` reads it where it really
    ends, before the end record, and shifts every record's offset by the difference
    (`_RealGetContents`: "concat", for data prepended to an archive), then reads records
    until the stated size is used up. Two torch.save archives written one after the other
    are then two different files to them: torch loads the first, `zipfile` the second. So
    the stated offset must be where `zipfile` found the directory, the locator must point at
    the zip64 record `zipfile` reads (right before it), and the counts must agree. `pread`
    reads `(offset, length)` of the file, `start_dir` and `count` are what `zipfile` found."""
    window = min(size, (1 << 16) + _END.size)
    tail = pread(size - window, window)
    at = tail.rfind(_END_SIG, 0, len(tail) - _END.size + len(_END_SIG))  # 22 bytes after it
    if at < 0:
        raise BinFormatError("has no zip end record; it may be truncated")
    end = size - window + at
    _, _, _, _, entries, _, offset, _ = _END.unpack_from(tail, at)
    if at >= _LOCATOR.size and tail[at - _LOCATOR.size : at - _LOCATOR.size + 4] == _LOCATOR_SIG:
        where = end - _LOCATOR.size - _END64.size
        pointed = _LOCATOR.unpack_from(tail, at - _LOCATOR.size)[2]
        record = pread(where, _END64.size) if where >= 0 else b""
        if pointed != where or record[:4] != _END64_SIG:
            raise BinFormatError(
                "has a zip64 locator that points elsewhere than the zip64 end record before "
                "it: readers of the archive disagree on its directory; the file is crafted"
            )
        fields = _END64.unpack(record)
        entries, offset = fields[7], fields[9]
    if offset != start_dir or entries != count:
        raise BinFormatError(
            f"states its zip directory at byte {offset:,} with {entries:,} records, but it "
            f"is at byte {start_dir:,} with {count:,}: torch and other zip readers would "
            "read different archives from it (data before or after a torch.save archive); "
            "the file is crafted or damaged"
        )


def _raw_name(info: zipfile.ZipInfo) -> bytes:
    """A record's name as the bytes the archive stores (what torch compares): `zipfile`
    decoded them as UTF-8 when flag bit 11 says so, else as cp437 (both reversible), and
    `orig_filename` keeps what it cut at a NUL."""
    utf8 = info.flag_bits & 0x800
    return info.orig_filename.encode("utf-8" if utf8 else "cp437", "surrogatepass")


def _folded(name: bytes) -> bytes:
    """A record name as miniz compares it when torch looks a record up
    (`mz_zip_reader_locate_file` without MZ_ZIP_FLAG_CASE_SENSITIVE: a binary search with
    `mz_zip_filename_compare`, which lowers ASCII letters): `bytes.lower` is ASCII-only."""
    return name.lower()


def _records(infos: Sequence[zipfile.ZipInfo]) -> tuple[bytes, dict[bytes, zipfile.ZipInfo]]:
    """(the archive's folder, record by folded stored name) as torch reads them
    (caffe2/serialize/inline_container.cc, `PyTorchStreamReader::init`): the folder is the
    first record's name up to its first '/', every record must be inside it (torch refuses
    "file in archive is not in a subdirectory"), and a name is looked up as bytes, ASCII case
    ignored (`_folded`). Two names equal once folded are refused: miniz's binary search finds
    one of them, and which one depends on the sort, not on what another reader takes."""
    by_name: dict[bytes, zipfile.ZipInfo] = {}
    for info in infos:
        key = _folded(_raw_name(info))
        if key in by_name:
            raise BinFormatError(
                f"stores the record {short_repr(info.filename, limit=120)} twice (ASCII "
                "case aside, as torch compares names): readers of the archive disagree on "
                "which one is meant; the file is crafted"
            )
        by_name[key] = info
    first = _raw_name(infos[0]) if infos else b""
    prefix, slash, _ = first.partition(b"/")
    if not slash:
        raise BinFormatError(
            f"has its first record {short_repr(infos[0].filename if infos else '', limit=120)} "
            "outside a folder; torch.save puts every record in one folder"
        )
    outside = next((i for i in infos if not _raw_name(i).startswith(prefix + b"/")), None)
    if outside is not None:
        raise BinFormatError(
            f"has the record {short_repr(outside.filename, limit=120)} outside its folder "
            f"{short_repr(prefix.decode('utf-8', 'replace'), limit=120)}; torch refuses such "
            "an archive (and another reader could read another archive from it)"
        )
    return prefix, by_name


# The file format versions torch 2.13 reads (caffe2/serialize/versions.h,
# kMinSupportedFileFormatVersion and kMaxSupportedFileFormatVersion); torch.save writes 3.
_VERSIONS = range(1, 11)
# `std::stoull` as `PyTorchStreamReader::init` parses the version record: leading white
# space, a sign, digits; what follows the digits is ignored.
_STOULL = re.compile(rb"[ \t\n\v\f\r]*([+-]?)([0-9]+)")


def _check_version(raw: bytes) -> None:
    """Refuse what `PyTorchStreamReader::init` refuses of the `version` record's bytes: a
    version that does not parse, or one outside `_VERSIONS`."""
    found = _STOULL.match(raw)
    number = int(found[2]) if found and found[1] != b"-" else -1
    if number not in _VERSIONS:
        raise BinFormatError(
            f"has the format version {short_repr(raw.decode('ascii', 'backslashreplace'))}, "
            f"expected a number from {_VERSIONS.start} to {_VERSIONS.stop - 1}; torch.load "
            "refuses the file"
        )


def _itemsize(storage: TorchStorage) -> int:
    return 1 if storage.dtype is None else TORCH_DTYPES[storage.dtype][1]


def _data_offset(fh: _Budgeted, info: zipfile.ZipInfo, size: int) -> int:
    """Where a record's bytes start: after its local header, name and extra field (whose
    lengths differ from the central directory's: torch pads the local one)."""
    return _checked_start(info, fh.pread(info.header_offset, _LOCAL_HEADER.size), size)


def _checked_start(info: zipfile.ZipInfo, local: bytes, size: int) -> int:
    """The record's data offset from its local header's first 30 bytes, checked."""
    if len(local) < _LOCAL_HEADER.size:
        raise BinFormatError(f"is truncated inside the local header of {info.filename[:200]}")
    magic, name_len, extra_len = _LOCAL_HEADER.unpack(local)
    if magic != ZIP_MAGIC:
        raise BinFormatError(f"has no local header where {info.filename[:200]} should start")
    start = info.header_offset + _LOCAL_HEADER.size + name_len + extra_len
    if info.compress_type != zipfile.ZIP_STORED:
        raise BinFormatError(f"compresses {info.filename[:200]}; torch.save stores records")
    if start + info.file_size > size:
        raise BinFormatError(f"is truncated: {info.filename[:200]} runs past the end of the file")
    return start


def _data_offsets(
    fh: _Budgeted, infos: list[zipfile.ZipInfo], size: int, many: ManyRanges | None
) -> dict[int, int]:
    """Where each record's bytes start (`_data_offset`), by the offset of its local header
    (two records may have one name as `zipfile` decodes it), from its local header: headers less
    than `_HEADER_GAP` apart are read in one window of at most `HEADER_WINDOW` bytes, and the
    windows all at once through `many`."""
    infos = sorted(infos, key=lambda i: i.header_offset)
    windows: list[tuple[int, int, list[zipfile.ZipInfo]]] = []
    costs: list[int] = []
    for info in infos:
        start = info.header_offset
        want = _LOCAL_HEADER.size + len(info.orig_filename) + _EXTRA_GUESS
        end = min(size, start + want)
        if windows:
            lo, hi, members = windows[-1]
            if start <= hi + _HEADER_GAP and end - lo <= HEADER_WINDOW:
                windows[-1] = (lo, max(hi, end), [*members, info])
                costs[-1] += want
                continue
        windows.append((start, end, [info]))
        costs.append(want)
    spans = [(lo, max(0, hi - lo)) for lo, hi, _ in windows]
    if many is not None and len(spans) > 1:
        for cost in costs:
            fh.charge(cost)
        datas = many(spans)
    else:
        datas = [fh.pread(lo, n, cost=c) for (lo, n), c in zip(spans, costs, strict=True)]
    out: dict[int, int] = {}
    for (lo, _, members), data in zip(windows, datas, strict=True):
        for info in members:
            at = info.header_offset - lo
            local = data[at : at + _LOCAL_HEADER.size]
            if len(local) == _LOCAL_HEADER.size:
                name_len, extra_len = _LOCAL_HEADER.unpack(local)[1:]
                if at + _LOCAL_HEADER.size + name_len + extra_len <= len(data):
                    out[info.header_offset] = _checked_start(info, local, size)
                    continue
            out[info.header_offset] = _data_offset(fh, info, size)  # a header longer than guessed
    return out


def _record_bytes(fh: _Budgeted, info: zipfile.ZipInfo, size: int) -> bytes:
    start = _data_offset(fh, info, size)
    return fh.pread(start, info.file_size)


# -- the legacy stream ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LegacyListing:
    """The tensors of a pre-1.6 stream, read from its pickles alone."""

    tensors: tuple[BinTensor, ...]
    pickle_bytes: int


def list_legacy(reader: ByteSource, *, cap: int = BIN_HEADER_CAP) -> LegacyListing:
    """Names, dtypes and shapes of a legacy stream's tensors (its pickles precede the data);
    raises like `read_bin`. Reads at most `cap` bytes."""
    data = reader.read_range(0, min(reader.size(), cap))
    pos = 0
    value: Any = None
    for step in range(4):  # magic number, protocol, system info, the object
        try:
            end = check_pickle(data, start=pos).end
        except PickleFormatError as exc:
            raise BinFormatError(f"is a truncated legacy torch.save stream ({exc})") from None
        value, _ = _unpickle(data[pos:end], legacy=step == 3)
        pos = end
    tensors, _ = _tensors(value)
    return LegacyListing(tuple(tensors), pos)
