"""Read and validate one safetensors header without touching the tensor data.

Every rule of the reference reader becomes a finding, and a hostile file makes us read at
most `8 + cap` bytes. The one reader that judges while it reads: a second pass over a million
entries would double the cost (docs/architecture.md, "formats/": the bulk path).
"""

from __future__ import annotations

import json
import math
import operator
import re
import reprlib
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import chain
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Annotated, Any, Literal

import msgspec
import numpy as np
import orjson

from inspector._internal.common.columns import Coded, frozen, int64s
from inspector._internal.common.defaults import DEFAULT_HEADER_CAP
from inspector._internal.common.display import legible
from inspector._internal.common.dtypes import DTYPE_BITS
from inspector._internal.common.gc import gc_paused
from inspector._internal.findings.finding import FOLD, Finding, make_finding
from inspector._internal.storage import Location, RangeReader, local_location
from inspector.errors import UNSAFE_FILE_ADVICE, UnsafeFileError

__all__ = [
    "DEFAULT_HEADER_CAP",
    "ShardHeader",
    "header_span",
    "parse_header_bytes",
    "read_header",
    "read_shard",
]

_DUP_MARKER = b'"data_offsets"'
# `-0` as an array element: serde_json parses it as the float -0.0, which a `usize` shape or
# offset refuses (the whole file is unreadable), where orjson and msgspec read the int 0.
# `_minus_zero` looks for a `-0` after a byte that can come before an array element.
_MINUS = ord("-")
_ZERO = ord("0")
_BEFORE_ELEMENT = np.frombuffer(b"[, \t\n\r", dtype=np.uint8)
# Shapes with more dimensions than this skip the bulk path: `math.prod` of thousands of
# 64-bit dimensions is a huge integer product (quadratic time), so it is bounded there.
_FAST_MAX_DIMS = 16
# Past this element count a tensor cannot fit any file; the exact product is not needed.
_HUGE_NUMEL = 1 << 72
# Bit counts at or past this do not fit the int64 columns the bulk path checks with numpy;
# no file reaches the offset (1 EiB), and below it 8 x a size is an int64 too.
_INT64_END = 1 << 63
_MAX_OFFSET = 1 << 60
_SHORT = reprlib.Repr()
_SHORT.maxstring = 60
_SHORT.maxother = 60
_SHORT.maxlist = 8
_SHORT.maxdict = 4
_SHORT.maxlevel = 3

# names, dtypes, shapes, begins, ends of a header checked in bulk
_BulkColumns = tuple[tuple[str, ...], Coded[str], Coded[tuple[int, ...]], np.ndarray, np.ndarray]
# names, dtypes, shapes, begins, ends of the located entries
_Columns = tuple[list[str], list[str], list[Any], list[int], list[int]]


# The dtypes the bulk path knows, as a Literal: msgspec refuses any other (a doubt, as the
# bulk path's check of the dtypes is) and gives every entry the one string of its dtype, so
# that the decode makes no string per entry and the coding hashes none (15-25 ms at 300,000).
if TYPE_CHECKING:
    _KnownDtype = str
else:
    _KnownDtype = Literal[tuple(DTYPE_BITS)]


class _Entry(msgspec.Struct, gc=False):
    """A tensor entry as the typed decode takes it (`_typed_columns`): the three fields a
    reader uses, a dtype the bulk path knows, ints that are never bools or floats, offsets
    under `_MAX_OFFSET`. Other fields are ignored, as the bulk path's `itemgetter` ignores
    them."""

    dtype: _KnownDtype
    shape: tuple[Annotated[int, msgspec.Meta(ge=0, le=_INT64_END - 1)], ...]
    data_offsets: tuple[
        Annotated[int, msgspec.Meta(ge=0, lt=_MAX_OFFSET)],
        Annotated[int, msgspec.Meta(ge=0, lt=_MAX_OFFSET)],
    ]


_ENTRIES = msgspec.json.Decoder(dict[str, _Entry])
_METADATA_KEY = b'{"__metadata__":'
_METADATA_DECODER = json.JSONDecoder()
# After the metadata's comma an entry must follow: `{"__metadata__":{...},}` is a trailing
# comma orjson refuses, which the typed decode would read as `{}`.
_CLOSE_AFTER_COMMA = re.compile(rb"[ \t\n\r]*\}")
# An entry as writers write it: its name's colon and one per field, and two arrays (shape,
# data_offsets). A field the typed decode ignores is not read by msgspec, only skipped:
# a number orjson refuses there ("number is infinity when parsed as double": 1e999, 320
# digits) passed, and so did nesting past orjson's 1,024 levels once the recursion limit is
# raised (torch's inductor sets 2,000), which can also take the C stack. Counting these
# bytes before any decoder runs rules both out: with no bracket but the entries' own, no
# value nests past 3 levels.
_ENTRY_COLONS = 4
_ENTRY_ARRAYS = 2
# Bytes compared per numpy step when counting them (`_byte_counts`).
_COUNT_CHUNK = 1 << 20

_EMPTY_I64 = frozen(np.zeros(0, dtype=np.int64))
_NO_DTYPES: Coded[str] = Coded(frozen(np.zeros(0, dtype=np.int32)), ())
_NO_SHAPES: Coded[tuple[int, ...]] = Coded(frozen(np.zeros(0, dtype=np.int32)), ())


@dataclass(frozen=True, slots=True, eq=False)
class ShardHeader:
    """What one safetensors header says, as columns: names, dtype and shape codes (each
    distinct dtype and shape stored once), begin and end offsets as int64 arrays.

    Only entries that are well formed enough to locate are in the columns; the others are
    findings. `header_len` is None when the header could not be read at all.
    """

    file: str
    file_size: int
    header_len: int | None
    metadata: Mapping[str, str] | None
    names: tuple[str, ...] = ()
    dtype: Coded[str] = _NO_DTYPES
    shape: Coded[tuple[int, ...]] = _NO_SHAPES
    begins: np.ndarray = field(default_factory=lambda: _EMPTY_I64)
    ends: np.ndarray = field(default_factory=lambda: _EMPTY_I64)
    findings: tuple[Finding, ...] = ()

    @classmethod
    def from_columns(
        cls,
        file: str,
        file_size: int,
        header_len: int | None,
        metadata: Mapping[str, str] | None,
        names: Sequence[str],
        dtypes: Sequence[str],
        shapes: Sequence[Sequence[int]],
        begins: Sequence[int],
        ends: Sequence[int],
        findings: tuple[Finding, ...] = (),
    ) -> ShardHeader:
        """A header from plain per-entry lists."""
        n = len(names)
        return cls(
            file,
            file_size,
            header_len,
            metadata
            if metadata is None or isinstance(metadata, MappingProxyType)
            else MappingProxyType(dict(metadata)),
            tuple(names),
            Coded.encode(dtypes, n),
            Coded.encode(map(tuple, shapes), n),
            int64s(begins, n),
            int64s(ends, n),
            findings,
        )

    def __eq__(self, other: object) -> bool:
        """Equal headers say the same of the same file (columns compared by value)."""
        if not isinstance(other, ShardHeader):
            return NotImplemented
        return (
            (self.file, self.file_size, self.header_len, self.names, self.findings)
            == (other.file, other.file_size, other.header_len, other.names, other.findings)
            and _plain(self.metadata) == _plain(other.metadata)
            and self.dtypes == other.dtypes
            and self.shapes == other.shapes
            and np.array_equal(self.begins, other.begins)
            and np.array_equal(self.ends, other.ends)
        )

    __hash__ = None  # type: ignore[assignment]

    @property
    def readable(self) -> bool:
        return self.header_len is not None

    @property
    def data_start(self) -> int:
        return 8 + (self.header_len or 0)

    @property
    def tensor_bytes(self) -> int:
        return int(self.ends.sum()) - int(self.begins.sum())

    @property
    def total_numel(self) -> int:
        """Elements of all entries (each distinct shape multiplied out once)."""
        counts = np.bincount(self.shape.codes, minlength=len(self.shape.values)).tolist()
        return sum(math.prod(s) * n for s, n in zip(self.shape.values, counts, strict=True))

    @property
    def dtypes(self) -> list[str]:
        """Each entry's dtype (a list built on access)."""
        return self.dtype.tolist()

    @property
    def shapes(self) -> list[tuple[int, ...]]:
        """Each entry's shape (a list built on access; equal shapes are one tuple)."""
        return self.shape.tolist()


def _plain(metadata: Mapping[str, str] | None) -> dict[str, str] | None:
    return None if metadata is None else dict(metadata)


def read_shard(
    path: Location | Path, *, root: Location | Path, cap: int = DEFAULT_HEADER_CAP
) -> ShardHeader:
    """Open a file through its storage and read its header. A file the storage refuses (not
    a regular file, a link leaving the folder) is a `file-unsafe` finding, one that cannot be
    opened a `header-unreadable` one: never a crash. Local paths are taken as a file in the
    folder `root`."""
    if not isinstance(path, Location) or not isinstance(root, Location):
        path, root = _locations(Path(str(path)), Path(str(root)))
    rel = _relative(path, root)
    try:
        with path.open() as reader:
            return read_header(reader, file=rel, cap=cap)
    except UnsafeFileError as exc:
        message = f"{legible(rel)}: not read, it {exc.reason}{UNSAFE_FILE_ADVICE}"
        finding = make_finding("file-unsafe", message, file=rel)
        return ShardHeader(rel, 0, None, None, findings=(finding,))
    except OSError as exc:
        reason = exc.strerror or str(exc)
        msg = f"{legible(rel)}: cannot be read ({reason}); check that it is a readable regular file"
        return _unreadable(rel, 0, msg)


def header_span(head: bytes, size: int, *, cap: int = DEFAULT_HEADER_CAP) -> int:
    """How many bytes from the start of a safetensors file `read_header` reads (8 + the
    header length), known from its first bytes; no more than `head` when the length is over
    the cap or past the end (the reader then reports it without reading further)."""
    if len(head) < 8:
        return len(head)
    length = struct.unpack("<Q", head[:8])[0]
    return 8 + length if length <= cap and 8 + length <= size else len(head)


def read_header(reader: RangeReader, *, file: str, cap: int = DEFAULT_HEADER_CAP) -> ShardHeader:
    """Read the length prefix and header through `reader` and validate them.

    Reads at most `8 + cap` bytes whatever the file says, and checks the length against the
    cap and the file size before reading, so a length such as 2**63 costs nothing.
    """
    size = reader.size()
    prefix = reader.read_range(0, 8) if size >= 8 else b""
    if len(prefix) < 8:
        msg = f"{legible(file)}: file is {size} bytes, shorter than the 8-byte header length prefix"
        return _unreadable(file, size, msg)
    (header_len,) = struct.unpack("<Q", prefix)
    if header_len > cap:
        msg = (
            f"{legible(file)}: header length {header_len:,} bytes is over the limit of {cap:,}; "
            "if the file is trusted, raise the header cap (--header-cap)"
        )
        return _unreadable(file, size, msg)
    raw = reader.read_range(8, header_len) if 8 + header_len <= size else b""
    if len(raw) < header_len:
        msg = (
            f"{legible(file)}: header length {header_len:,} runs past the end of the {size:,}-byte "
            f"file (at most {max(size - 8, 0):,} header bytes); the file is truncated or "
            "not safetensors"
        )
        return _unreadable(file, size, msg)
    return parse_header_bytes(raw, file=file, file_size=size)


def parse_header_bytes(raw: bytes, *, file: str, file_size: int) -> ShardHeader:
    """Validate header bytes (already read) against the file size. Pure."""
    # The decoded JSON lives only inside `_parse`, so it is freed before the GC resumes and
    # the collection that follows never has to walk it.
    with gc_paused():
        return _parse(raw, file, file_size)


# -- steps ---------------------------------------------------------------------------------


def _parse(raw: bytes, file: str, file_size: int) -> ShardHeader:
    """1. decode the JSON; 2. check `__metadata__`; 3. look for duplicate names when the raw
    bytes hint at one; 4. take the columns in bulk, or entry by entry when a bulk check fails;
    5. check that the offsets tile the data section and the file length.
    A header as writers write it takes the typed decode instead (`_typed_columns`), which
    yields the same columns or None, never a finding."""
    typed = _typed_columns(raw)
    if typed is not None:
        out = _Collector(file)
        metadata = _metadata(typed[0], out)
        names, dtype, shape, begins, ends = typed[1]
        _check_length(file_size, len(raw), int(ends.max()) if len(ends) else 0, out=out)
        return ShardHeader(
            file, file_size, len(raw), metadata, names, dtype, shape, begins, ends, out.done()
        )
    header, problem = _decode(raw, file)
    if problem is not None:
        return _unreadable(file, file_size, problem)
    out = _Collector(file)
    metadata = _metadata(header.pop("__metadata__", None), out)
    if _strict_doubt(raw, header, metadata):
        _report_strict(raw, out)
    bulk = _bulk_columns(header)
    if bulk is not None:
        names, dtype, shape, begins, ends = bulk
        _check_length(file_size, len(raw), int(ends.max()) if len(ends) else 0, out=out)
        return ShardHeader(
            file, file_size, len(raw), metadata, names, dtype, shape, begins, ends, out.done()
        )
    columns = _entries(header, out)
    # An entry that cannot be located may own the bytes around the others: gaps and the
    # file length cannot be judged, and the file is already an error.
    if len(columns[0]) == len(header):
        tiled = _check_tiling(columns, file_size - 8 - len(raw), out)
        _check_length(file_size, len(raw), max(columns[4], default=0), tiled=tiled, out=out)
    return ShardHeader.from_columns(
        file, file_size, len(raw), metadata, *columns, findings=out.done()
    )


def _decode(raw: bytes, file: str) -> tuple[dict, str | None]:
    """(header, None) or ({}, why the header is unreadable)."""
    try:
        header = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        return {}, _not_json(raw, file, exc)
    if not isinstance(header, dict):
        names: dict[type, str] = {list: "array", str: "string"}
        kind = names.get(type(header), type(header).__name__)
        return (
            {},
            f"{legible(file)}: header is a JSON {kind} ({_short(header)}), expected an object",
        )
    if not raw.startswith(b"{"):
        # Valid JSON with leading whitespace: the reference reader still rejects it.
        return {}, (
            f"{legible(file)}: header starts with {raw[:8]!r}, not "
            f"'{{' as the format requires; strict "
            "readers reject it, rewrite the header without the leading bytes"
        )
    return header, None


def _not_json(raw: bytes, file: str, exc: orjson.JSONDecodeError) -> str:
    """Why undecodable bytes are unreadable: bad UTF-8, not safetensors, or damaged JSON."""
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as bad:
        where = raw[bad.start : bad.start + 4]
        return (
            f"{legible(file)}: header is not UTF-8 (byte {where[:1]!r} at offset {bad.start:,}, "
            f"in {raw[max(bad.start - 12, 0) : bad.start + 4]!r}); the file is damaged"
        )
    if not raw.lstrip().startswith(b"{"):
        return (
            f"{legible(file)}: header does not start with "
            f"'{{' (starts with {raw[:16]!r}); not safetensors"
        )
    pos = getattr(exc, "pos", 0) or 0
    return (
        f"{legible(file)}: header is not valid JSON ({exc.msg} near "
        f"{raw[max(pos - 20, 0) : pos + 20]!r}); "
        "the file is damaged, re-export it"
    )


def _metadata(value: object, out: _Collector) -> Mapping[str, str] | None:
    """`__metadata__` must map strings to strings; other values are findings and dropped."""
    if value is None:
        return None
    if not isinstance(value, dict):
        out.add(
            "header-invalid-entry",
            f"__metadata__ is {type(value).__name__} {_short(value)}, "
            "expected an object of strings",
            tensor="__metadata__",
        )
        return None
    for key, val in value.items():
        if not isinstance(val, str):
            out.add(
                "header-invalid-entry",
                f"__metadata__['{legible(key)}'] is {type(val).__name__} {_short(val)}, expected a "
                "string",
                tensor="__metadata__",
            )
    return MappingProxyType({k: v for k, v in value.items() if isinstance(v, str)})


def _bulk_columns(header: dict) -> _BulkColumns | None:
    """The columns of a header with no problem at all, checked in bulk; None on any doubt.

    No Python code runs per entry: the entries are dicts with the three keys (`itemgetter`
    raises on anything else); dtypes and shapes are coded in one dict pass each and judged
    once per distinct value (known dtypes; short shapes of non-negative ints); offsets are
    pairs of ints that fit int64; sizes match and the ranges tile from 0, both checked with
    numpy on the offset arrays. The result is what `ShardHeader` holds, so nothing is coded
    twice.
    """
    if not header:
        return (), _NO_DTYPES, _NO_SHAPES, _EMPTY_I64, _EMPTY_I64
    try:
        entries = list(header.values())
        n = len(entries)
        dtype = Coded.encode(map(operator.itemgetter("dtype"), entries), n)
        raw_shapes = list(map(operator.itemgetter("shape"), entries))
        offsets = list(map(operator.itemgetter("data_offsets"), entries))
        if not set(dtype.values) <= DTYPE_BITS.keys() or set(map(type, raw_shapes)) != {list}:
            return None
        shape = Coded.encode(map(tuple, raw_shapes), n)
        if not all(map(_plain_shape, shape.values)) or set(map(len, offsets)) != {2}:
            return None
        begin_list = list(map(operator.itemgetter(0), offsets))
        end_list = list(map(operator.itemgetter(1), offsets))
        # One type pass over every offset, then their range: no end past `_MAX_OFFSET`
        # and no negative begin, so that `8 * (end - begin)` stays inside int64.
        if set(map(type, chain(begin_list, end_list))) != {int}:
            return None
        if max(end_list) >= _MAX_OFFSET or min(begin_list) < 0:
            return None
    except (KeyError, TypeError, IndexError):
        return None
    begins, ends = int64s(begin_list, n), int64s(end_list, n)
    if not _sizes_tile(dtype, shape, begins, ends):
        return None
    return tuple(header), dtype, shape, begins, ends


def _typed_columns(raw: bytes) -> tuple[dict[str, str] | None, _BulkColumns] | None:
    """(metadata, columns) of a header as writers write it, decoded straight into typed
    entries: no dict per entry, no type pass, offsets as one array. None on any doubt, and
    `_parse` then decodes it as before; so what this accepts is exactly what the bulk path
    accepts, with the same columns.

    The doubts: a backslash (an escape: orjson's rules on surrogates are kept by leaving
    them to it), bytes that are not UTF-8, a `__metadata__` that is not the first key or not
    an object of strings, a comma after it that no entry follows, a field this decode
    ignores (msgspec skips it unread) or a bracket outside the entries' arrays, an entry
    msgspec's schema refuses, a repeated name, and every check of the bulk path.
    """
    if b"\\" in raw or not raw.startswith(b"{"):
        return None
    # Each entry holds the marker once (checked after the decode), so `n` is the count of
    # entries; the top-level object, the metadata and the entries are the only objects.
    n = raw.count(_DUP_MARKER)
    brackets, braces, colons, minuses = _byte_counts(raw, b"[{:-")
    if brackets != _ENTRY_ARRAYS * n or braces > n + 2 or (minuses and _minus_zero(raw)):
        return None
    try:
        metadata: dict[str, str] | None = None
        body = raw
        if raw.startswith(_METADATA_KEY):
            # An object of strings with no escape ends at its first `}` (one inside a string
            # or a nested object leaves text the decoder refuses). Only the metadata is
            # decoded to `str`; the entries go to msgspec as bytes, which checks the UTF-8
            # of every string it reads (a string it skips is in an ignored field, refused
            # below): no copy of the whole header as text, 4 bytes a character once a name
            # holds one past U+FFFF.
            end = raw.index(b"}", len(_METADATA_KEY)) + 1
            value = _METADATA_DECODER.decode(raw[len(_METADATA_KEY) : end].decode("utf-8"))
            if not isinstance(value, dict) or not all(type(v) is str for v in value.values()):
                return None
            metadata = value
            if raw[end : end + 1] == b",":
                if _CLOSE_AFTER_COMMA.match(raw, end + 1):
                    return None
                body = b"{" + raw[end + 1 :]
            elif raw[end:] == b"}":
                body = b"{}"
            else:
                return None
            # The body's colons: those after the metadata (its `{` adds none).
            colons -= raw.count(b":", 0, end + 1)
        header = _ENTRIES.decode(body)
    except (ValueError, RecursionError, msgspec.DecodeError, msgspec.ValidationError):
        # RecursionError: both decoders raise it for nesting past their depth (in a field
        # this decode ignores, or in the metadata); the decode below reports it as a finding.
        return None
    if "__metadata__" in header or n != len(header):
        return None
    if colons != _ENTRY_COLONS * n:
        return None  # an ignored field, or a colon in a name (rare: the bulk path reads it)
    if not header:
        return metadata, ((), _NO_DTYPES, _NO_SHAPES, _EMPTY_I64, _EMPTY_I64)
    entries = list(header.values())
    n = len(entries)
    dtype = Coded.encode(map(operator.attrgetter("dtype"), entries), n)
    shape = Coded.encode(map(operator.attrgetter("shape"), entries), n)
    if not set(dtype.values) <= DTYPE_BITS.keys() or max(map(len, shape.values)) > _FAST_MAX_DIMS:
        return None
    offsets = np.fromiter(
        chain.from_iterable(map(operator.attrgetter("data_offsets"), entries)),
        dtype=np.int64,
        count=2 * n,
    )
    begins, ends = frozen(offsets[0::2].copy()), frozen(offsets[1::2].copy())
    if not _sizes_tile(dtype, shape, begins, ends):
        return None
    return metadata, (tuple(header), dtype, shape, begins, ends)


def _byte_counts(data: bytes, wanted: bytes) -> list[int]:
    """How many times each byte of `wanted` occurs in `data`: `data.count(byte)` for each,
    in one pass of numpy comparisons a chunk at a time (bytes.count tests one byte per step,
    three times slower over the 36 MB of a 300,000-tensor checkpoint's headers; the chunks
    bound the temporaries whatever the header's size)."""
    view = np.frombuffer(data, dtype=np.uint8)
    counts = [0] * len(wanted)
    for at in range(0, len(view), _COUNT_CHUNK):
        chunk = view[at : at + _COUNT_CHUNK]
        for i, byte in enumerate(wanted):
            counts[i] += int(np.count_nonzero(chunk == byte))
    return counts


def _sizes_tile(
    dtype: Coded[str], shape: Coded[tuple[int, ...]], begins: np.ndarray, ends: np.ndarray
) -> bool:
    """The bulk path's last checks: every element count fits int64 bits, each entry's byte
    range is as long as its dtype and shape say, and the ranges tile from 0."""
    numel = [math.prod(s) for s in shape.values]
    bits = [DTYPE_BITS[d] for d in dtype.values]
    if max(numel) * max(bits) >= _INT64_END:  # only a hostile shape; the slow path says so
        return False
    sizes = ends - begins
    stored = np.asarray(numel, np.int64)[shape.codes] * np.asarray(bits, np.int64)[dtype.codes]
    return bool(np.array_equal(stored, sizes * 8)) and _tiles(begins, ends)


def _plain_shape(shape: tuple[Any, ...]) -> bool:
    """A shape the bulk path takes: at most `_FAST_MAX_DIMS` non-negative ints."""
    if len(shape) > _FAST_MAX_DIMS:
        return False
    return not shape or (set(map(type, shape)) == {int} and min(shape) >= 0)


def _tiles(begins: np.ndarray, ends: np.ndarray) -> bool:
    """True when the ranges, sorted by (begin, end), run from 0 with each starting where the
    last ended (empty ranges included)."""
    order = np.lexsort((ends, begins))
    starts, stops = begins[order], ends[order]
    return bool(starts[0] == 0 and np.array_equal(starts[1:], stops[:-1]))


def _entries(header: dict, out: _Collector) -> _Columns:
    """The slow path: each entry checked on its own, each problem a finding."""
    names: list[str] = []
    dtypes: list[str] = []
    shapes: list[tuple[int, ...]] = []
    begins: list[int] = []
    ends: list[int] = []
    for name, entry in header.items():
        located = _locate(name, entry, out)
        if located is None:
            continue
        dtype, shape, begin, end = located
        bits = DTYPE_BITS.get(dtype)
        if bits is None:
            known = ", ".join(DTYPE_BITS)
            out.add(
                "unknown-dtype",
                f"tensor '{legible(name)}' has dtype {_short(dtype)}, not a safetensors dtype "
                f"(expected one of {known})",
                tensor=name,
            )
        else:
            total_bits = _numel(shape) * bits
            if total_bits % 8 or total_bits // 8 != end - begin:
                out.add(
                    "size-mismatch",
                    _size_problem(name, dtype, shape, begin, end, total_bits),
                    tensor=name,
                )
        names.append(name)
        dtypes.append(dtype)
        shapes.append(shape)
        begins.append(begin)
        ends.append(end)
    return names, dtypes, shapes, begins, ends


def _locate(
    name: str, entry: object, out: _Collector
) -> tuple[str, tuple[int, ...], int, int] | None:
    """(dtype, shape, begin, end) of a well-typed entry, else a header-invalid-entry finding."""
    item: Any = entry
    try:
        dtype = item["dtype"]
        shape = item["shape"]
        begin, end = item["data_offsets"]
    except (TypeError, KeyError, ValueError, IndexError):
        out.add(
            "header-invalid-entry",
            f"tensor '{legible(name)}': {_entry_problem(entry)}",
            tensor=name,
        )
        return None
    if not (
        type(dtype) is str
        and type(shape) is list
        and all(type(d) is int and d >= 0 for d in shape)
        and type(item["data_offsets"]) is list
        and type(begin) is int
        and type(end) is int
        and 0 <= begin <= end
    ):
        out.add(
            "header-invalid-entry",
            f"tensor '{legible(name)}': {_entry_problem(entry)}",
            tensor=name,
        )
        return None
    return dtype, tuple(shape), begin, end


def _numel(shape: tuple[int, ...]) -> int:
    """prod(shape), stopping early once it is past any possible file size."""
    if len(shape) <= _FAST_MAX_DIMS:
        return math.prod(shape)
    if 0 in shape:
        return 0
    n = 1
    for d in shape:
        n *= d
        if n > _HUGE_NUMEL:
            return n
    return n


def _check_tiling(columns: _Columns, data_len: int, out: _Collector) -> bool:
    """Offsets must tile [0, last end) exactly: no gap, no overlap, no shared bytes.

    Returns True when they do. When they do not, tensors running past the data section are
    reported here too: the header is inconsistent, so the file is not simply truncated.
    """
    names, _, _, begins, ends = columns
    problems: list[tuple[int, str]] = []
    expected, holder = 0, None
    for begin, end, i in sorted(zip(begins, ends, range(len(names)), strict=True)):
        if begin > expected:
            after = f"after tensor '{legible(names[holder])}' " if holder is not None else ""
            problems.append(
                (
                    i,
                    f"leave a gap of {begin - expected:,} unused bytes {after}"
                    f"(expected it to start at {expected:,})",
                )
            )
        elif begin < expected and holder is not None:
            if (begins[holder], ends[holder]) == (begin, end):
                what = f"point at the same bytes as tensor '{legible(names[holder])}'"
            else:
                what = (
                    f"start {expected - begin:,} bytes inside tensor '{legible(names[holder])}' "
                    f"[{begins[holder]:,}, {expected:,}] (expected it to start at {expected:,})"
                )
            problems.append((i, what))
        if end > expected:
            expected, holder = end, i
    if not problems:
        return True
    reported = {i for i, _ in problems}
    problems += [(i, "") for i, end in enumerate(ends) if end > data_len and i not in reported]
    for i, what in problems:
        past = (
            f"run past the end of the {data_len:,}-byte data section" if ends[i] > data_len else ""
        )
        detail = "; ".join(p for p in (what, past) if p)
        out.add(
            "offset-invalid",
            f"tensor '{legible(names[i])}' data_offsets [{begins[i]:,}, {ends[i]:,}] {detail}; "
            "loaders reject the file, re-export it",
            tensor=names[i],
        )
    return False


def _check_length(
    file_size: int, header_len: int, data_end: int, *, tiled: bool = True, out: _Collector
) -> None:
    """The file must be exactly `8 + header + data` (`data_end`: the largest end offset); a
    short file only counts as truncated when the offsets are consistent (otherwise
    `_check_tiling` already said what is wrong)."""
    expected = 8 + header_len + data_end
    if file_size < expected and tiled:
        out.add(
            "file-truncated",
            f"file is {file_size:,} bytes but its header needs {expected:,} "
            f"({expected - file_size:,} bytes missing); the write was cut short, re-export it",
        )
    elif file_size > expected:
        out.add(
            "trailing-bytes",
            f"file is {file_size:,} bytes, {file_size - expected:,} more than its header "
            f"describes ({expected:,}); loaders reject the file, cut it to {expected:,} bytes",
        )


def _minus_zero(raw: bytes) -> bool:
    """A doubt that an array of the header holds `-0`: a `-0` after `[`, `,` or whitespace
    (a name or a string may hold one too; the caller's slow path decides). One numpy pass a
    chunk at a time, as `_byte_counts` (a regex took 0.35 s over 36 MB of header)."""
    view = np.frombuffer(raw, dtype=np.uint8)
    last = len(view) - 1  # a `-` needs a byte before it and one after it
    for at in range(1, last, _COUNT_CHUNK):
        hits = np.flatnonzero(view[at : min(at + _COUNT_CHUNK, last)] == _MINUS) + at
        if len(hits) and np.any(
            (view[hits + 1] == _ZERO) & np.isin(view[hits - 1], _BEFORE_ELEMENT)
        ):
            return True
    return False


def _strict_doubt(raw: bytes, header: dict, metadata: Mapping[str, str] | None) -> bool:
    """True when the raw bytes hint at what orjson forgives and the reference reader does
    not: a key given twice (the header has more colons than the decoded one accounts for: 4
    an entry, one a metadata key, one for `__metadata__`, and those inside the names and
    metadata strings), or a `-0` in an array (`_minus_zero`). Linear: joins and counts."""
    expected = _ENTRY_COLONS * len(header) + "".join(header).count(":")
    if metadata is not None:
        expected += 1 + len(metadata) + "".join(chain(*metadata.items())).count(":")
    # An escaped colon counts in the strings but not in the raw bytes: it could hide a key
    # given twice by making up for that key's colon.
    escaped = b"\\u003a" in raw or b"\\u003A" in raw
    return escaped or raw.count(b":") != expected or _minus_zero(raw)


class _MinusZero(int):
    """The int 0 written `-0`: kept apart so that `_report_strict` can name its entry."""


def _strict_int(text: str) -> int:
    return _MinusZero(0) if text == "-0" else int(text)


# The fields of the reference reader's `TensorInfo` (safetensors `tensor.rs`).
_FIELDS = ("dtype", "shape", "data_offsets")


def _report_strict(raw: bytes, out: _Collector) -> None:
    """Slow path, only taken when `_strict_doubt` says so. The reference reader
    (safetensors `tensor.rs`: serde's derived `Deserialize` of `Metadata` and `TensorInfo`
    over serde_json) keeps the last of two entries of one name, a warning here; it refuses
    the whole file, an error here, for `__metadata__` twice, a field twice in an entry, `-0`
    (a float to serde_json) in a shape or offsets, or an earlier entry of a repeated name
    that is no tensor entry (every value is deserialized, even one a later one replaces)."""
    repeats: dict[int, list[tuple[str, object]]] = {}  # object id -> (key, earlier value)

    def hook(pairs: list[tuple[str, object]]) -> dict:
        result = dict(pairs)
        if len(result) < len(pairs):
            seen: dict[str, object] = {}
            twice = repeats.setdefault(id(result), [])
            for key, value in pairs:
                if key in seen:
                    twice.append((key, seen[key]))
                seen[key] = value
        return result

    try:
        top = json.loads(raw.decode("utf-8"), object_pairs_hook=hook, parse_int=_strict_int)
    except (ValueError, RecursionError):
        # orjson accepted the header; stdlib json may still refuse very deep nesting.
        return
    for key, earlier in repeats.get(id(top), []):
        if key == "__metadata__":
            out.add(
                "header-invalid-entry",
                "__metadata__ appears twice in the header; the safetensors reader refuses the "
                "whole file (duplicate field), re-export the shard",
                tensor=key,
            )
        elif _serde_entry(earlier, repeats):
            out.add(
                "header-duplicate-key",
                f"tensor '{legible(key)}' appears twice in the header; readers keep only "
                "the last entry, remove the other one",
                tensor=key,
            )
        else:
            out.add(
                "header-invalid-entry",
                f"tensor '{legible(key)}' appears twice in the header and the earlier one is not "
                "a tensor entry; the safetensors reader refuses the whole file, remove it",
                tensor=key,
            )
    for name, entry in top.items():
        if name == "__metadata__" or not isinstance(entry, dict):
            continue
        twice = [key for key, _ in repeats.get(id(entry), []) if key in _FIELDS]
        if twice:
            out.add(
                "header-invalid-entry",
                f"tensor '{legible(name)}' has {twice[0]} twice; the safetensors reader refuses "
                "the whole file (duplicate field), re-export the shard",
                tensor=name,
            )
        minus = [f for f in _FIELDS[1:] if _has_minus_zero(entry.get(f))]
        if minus:
            out.add(
                "header-invalid-entry",
                f"tensor '{legible(name)}' has -0 in its {minus[0]}; the safetensors reader "
                "reads it as a float and refuses the whole file, re-export the shard",
                tensor=name,
            )


def _has_minus_zero(value: object) -> bool:
    return isinstance(value, list) and any(type(v) is _MinusZero for v in value)


def _serde_entry(value: object, repeats: dict[int, list[tuple[str, object]]]) -> bool:
    """True when the reference reader deserializes `value` as a `TensorInfo`: a known dtype,
    a shape and two offsets of non-negative ints (no `-0`), no field twice."""
    if not isinstance(value, dict) or any(k in _FIELDS for k, _ in repeats.get(id(value), [])):
        return False
    dtype, shape, offsets = value.get("dtype"), value.get("shape"), value.get("data_offsets")
    return (
        isinstance(dtype, str)
        and dtype in DTYPE_BITS
        and isinstance(shape, list)
        and isinstance(offsets, list)
        and len(offsets) == 2
        and all(type(v) is int and v >= 0 for v in chain(shape, offsets))
    )


# -- helpers -------------------------------------------------------------------------------


class _Collector:
    """Findings of one file under the fold policy: `FOLD.per_file` per code are listed, the
    rest of each code is counted and folded into one summary finding, so a hostile header
    cannot turn into millions of findings."""

    def __init__(self, file: str) -> None:
        self.file = file
        self.items: list[Finding] = []
        self.counts: dict[str, int] = {}
        self.folded: dict[str, list[str]] = {}

    def add(self, code: str, message: str, *, tensor: str | None = None) -> None:
        n = self.counts.get(code, 0) + 1
        self.counts[code] = n
        if n <= FOLD.per_file:
            self.items.append(
                make_finding(
                    code, f"{legible(self.file)}: {message}", file=self.file, tensor=tensor
                )
            )
        elif tensor is not None and len(self.folded.setdefault(code, [])) < 3:
            self.folded[code].append(tensor)

    def done(self) -> tuple[Finding, ...]:
        for code, n in self.counts.items():
            if n > FOLD.per_file:
                more = n - FOLD.per_file
                names = self.folded.get(code)
                eg = " (e.g. " + ", ".join(f"'{legible(n)}'" for n in names) + ")" if names else ""
                self.items.append(
                    make_finding(
                        code,
                        f"{legible(self.file)}: {more:,} more {code} findings{eg}, not listed one "
                        "by one",
                        file=self.file,
                    )
                )
        return tuple(self.items)


def _unreadable(file: str, size: int, message: str) -> ShardHeader:
    return ShardHeader(
        file, size, None, None, findings=(make_finding("header-unreadable", message, file=file),)
    )


def _entry_problem(entry: object) -> str:
    if not isinstance(entry, dict):
        return f"entry is {type(entry).__name__} {_short(entry)}, expected an object"
    problems = []
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if not isinstance(dtype, str):
        problems.append(f"dtype {_short(dtype)} (expected a string)")
    if not (isinstance(shape, list) and all(type(d) is int and d >= 0 for d in shape)):
        problems.append(f"shape {_short(shape)} (expected a list of non-negative integers)")
    if not (
        isinstance(offsets, list)
        and len(offsets) == 2
        and all(type(o) is int and o >= 0 for o in offsets)
        and offsets[0] <= offsets[1]
    ):
        problems.append(
            f"data_offsets {_short(offsets)} (expected [begin, end] with 0 <= begin <= end)"
        )
    return "entry has " + "; ".join(problems or ["an unexpected form"])


def _size_problem(
    name: str, dtype: str, shape: tuple[int, ...], begin: int, end: int, bits: int
) -> str:
    want = f"{bits // 8:,}" if bits % 8 == 0 else f"{bits / 8:,} (not a whole number of bytes)"
    dims = _short(list(shape))
    return (
        f"tensor '{legible(name)}' data_offsets [{begin:,}, {end:,}] span {end - begin:,} bytes "
        f"but {dtype} {dims} needs {want}"
    )


def _short(value: object) -> str:
    """A bounded repr: safe for hostile values (deep nesting, huge lists, long strings)."""
    try:
        return _SHORT.repr(value)
    except (RecursionError, ValueError):
        return f"<{type(value).__name__}>"


def _relative(path: Location, root: Location) -> str:
    try:
        return path.relative_to(root)
    except ValueError:
        return path.name


def _locations(path: Path, root: Path) -> tuple[Location, Location]:
    """A local file and its folder as locations of one storage rooted at `root` (or at the
    file's own folder when it is not under `root`)."""
    try:
        rel = path.relative_to(root).as_posix()
    except ValueError:
        root, rel = path.parent, path.name
    folder = local_location(root) if root.is_dir() else local_location(path.parent)
    return folder / rel if root.is_dir() else folder / path.name, folder
