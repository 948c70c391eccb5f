"""Read the header of a GGUF file (llama.cpp's format, written by the `gguf` package's
`GGUFWriter`) without its tensor data: magic, version, counts, metadata key/values and tensor
infos (docs/formats.md, "GGUF").

Hand-written because the package's own `GGUFReader` memory-maps the whole file and builds a
view of every tensor (not header-only, and it raises on a truncated download). Bounded by
`cap`; refuses what llama.cpp refuses (`GgufError`). How: docs/architecture.md, "formats/".
"""

from __future__ import annotations

import math
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NoReturn, Protocol

import numpy as np

from inspector._internal.common.display import legible

__all__ = [
    "GGML_TYPES",
    "GGUF_HEADER_CAP",
    "INT64_MAX",
    "ArrayInfo",
    "GgufError",
    "GgufHeader",
    "GgufTensor",
    "read_gguf",
]

GGUF_MAGIC = b"GGUF"
GGUF_HEADER_CAP = 512_000_000
# Real files hold a few thousand tensors (experts are stacked) and a few dozen keys.
MAX_TENSORS = 1_000_000
MAX_KV = 100_000
# Our own caps on one string, below llama.cpp's GGUF_MAX_STRING_LENGTH (1 GiB): the longest
# real value is a chat template of some kilobytes.
MAX_STRING = 64_000_000
MAX_KEY = 1_024  # keys and tensor names: real ones are a few dozen bytes
# Strings kept as text: each at most KEEP_STRING bytes, at most KEEP_TEXT bytes in all; a
# longer one is stepped over without being read (`TextInfo`), so a header of many long
# strings costs no more memory than this.
KEEP_STRING = 1 << 16
KEEP_TEXT = 16 << 20
# llama.cpp's limits (ggml/src/gguf.cpp, ggml/include/ggml.h).
GGUF_MAX_ARRAY_ELEMENTS = 1 << 30
GGML_MAX_DIMS = 4
GGML_MAX_NAME = 64  # a tensor name is a C string of at most 63 bytes and its NUL
INT64_MAX = (1 << 63) - 1
SIZE_MAX = (1 << 64) - 1
KEEP_ITEMS = 16  # arrays up to this length keep their values
_BLOCK = 1 << 20
DEFAULT_ALIGNMENT = 32
ALIGNMENT_KEY = "general.alignment"

# ggml type id -> (name, values per block, bytes per block) (gguf-py `GGML_QUANT_SIZES`).
# Ids not here (4, 5, 31-33, 36-38: removed; past the last: future) have no block size, which
# llama.cpp refuses.
GGML_TYPES: Mapping[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4),
    1: ("F16", 1, 2),
    2: ("Q4_0", 32, 18),
    3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24),
    8: ("Q8_0", 32, 34),
    9: ("Q8_1", 32, 40),
    10: ("Q2_K", 256, 84),
    11: ("Q3_K", 256, 110),
    12: ("Q4_K", 256, 144),
    13: ("Q5_K", 256, 176),
    14: ("Q6_K", 256, 210),
    15: ("Q8_K", 256, 292),
    16: ("IQ2_XXS", 256, 66),
    17: ("IQ2_XS", 256, 74),
    18: ("IQ3_XXS", 256, 98),
    19: ("IQ1_S", 256, 50),
    20: ("IQ4_NL", 32, 18),
    21: ("IQ3_S", 256, 110),
    22: ("IQ2_S", 256, 82),
    23: ("IQ4_XS", 256, 136),
    24: ("I8", 1, 1),
    25: ("I16", 1, 2),
    26: ("I32", 1, 4),
    27: ("I64", 1, 8),
    28: ("F64", 1, 8),
    29: ("IQ1_M", 256, 56),
    30: ("BF16", 1, 2),
    34: ("TQ1_0", 256, 54),
    35: ("TQ2_0", 256, 66),
    39: ("MXFP4", 32, 17),
    40: ("NVFP4", 64, 36),
    41: ("Q1_0", 128, 18),
}
# value type id -> struct format of a scalar
_SCALARS: Mapping[int, str] = {
    0: "B",
    1: "b",
    2: "H",
    3: "h",
    4: "I",
    5: "i",
    6: "f",
    7: "?",
    10: "Q",
    11: "q",
    12: "d",
}
_SCALAR_STRUCTS = {t: struct.Struct("<" + f) for t, f in _SCALARS.items()}
_STRING, _ARRAY = 8, 9
VALUE_TYPES: Mapping[int, str] = {
    0: "UINT8",
    1: "INT8",
    2: "UINT16",
    3: "INT16",
    4: "UINT32",
    5: "INT32",
    6: "FLOAT32",
    7: "BOOL",
    8: "STRING",
    9: "ARRAY",
    10: "UINT64",
    11: "INT64",
    12: "FLOAT64",
}
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")


class ByteSource(Protocol):
    def size(self) -> int: ...

    def read_range(self, offset: int, length: int) -> bytes: ...


class GgufError(ValueError):
    """The header cannot be read, or llama.cpp refuses it; the message is a clause after the
    file name."""


@dataclass(frozen=True, slots=True)
class GgufTensor:
    """One tensor info: `ne` innermost first, as stored; `offset` relative to the data
    section; `type_id` the ggml type (unknown ids are kept: a finding, not a crash)."""

    name: str
    ne: tuple[int, ...]
    type_id: int
    offset: int

    @property
    def type_name(self) -> str:
        known = GGML_TYPES.get(self.type_id)
        return known[0] if known else f"ggml-type-{self.type_id}"

    @property
    def shape(self) -> tuple[int, ...]:
        """numpy order (outermost first)."""
        return tuple(reversed(self.ne))

    @property
    def n_elements(self) -> int:
        return math.prod(self.ne)

    @property
    def row(self) -> int:
        """Values in a row (ne[0]; 1 for a tensor of no dimension, as ggml pads `ne`)."""
        return self.ne[0] if self.ne else 1

    @property
    def n_bytes(self) -> int | None:
        """Bytes of its data, or None for an unknown type or a row not a whole block."""
        known = GGML_TYPES.get(self.type_id)
        if known is None or self.row % known[1]:
            return None
        return self.n_elements // known[1] * known[2]


@dataclass(frozen=True, slots=True)
class GgufHeader:
    version: int
    kv: Mapping[
        str, Any
    ]  # scalars, strings (long ones TextInfo), small arrays as lists, others ArrayInfo
    kv_types: Mapping[str, str]
    tensors: tuple[GgufTensor, ...]
    alignment: int
    alignment_stated: bool
    data_offset: int
    file_size: int
    # (later, earlier) tensor-info indices of a name given twice (as llama.cpp compares
    # names: the bytes up to a NUL)
    duplicates: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True, slots=True)
class ArrayInfo:
    """An array too long to keep: its item type and length."""

    item_type: str
    length: int


@dataclass(frozen=True, slots=True)
class TextInfo:
    """A string value too long to keep (see `KEEP_STRING`): its length in bytes."""

    length: int


class _Cursor:
    """Reads forward through the header in blocks; never at or past `cap`, never more than
    `cap` bytes in all."""

    def __init__(self, reader: ByteSource, cap: int) -> None:
        self.reader = reader
        self.size = reader.size()
        self.cap = cap
        self.end = min(self.size, cap)  # no byte from here on is read
        self.left = cap
        self.keep_left = KEEP_TEXT  # bytes of text it may still keep
        self.pos = 0
        self.buf = b""
        self.buf_at = 0

    def remaining(self) -> int:
        return self.size - self.pos

    def _check(self, end: int, what: str) -> None:
        if end > self.size:
            raise GgufError(f"is truncated inside its header ({what} at byte {self.pos:,})")
        if end > self.cap:
            raise GgufError(
                f"has a header larger than the {self.cap:,}-byte limit for GGUF headers; real "
                "files need far less: it is corrupt or crafted"
            )

    def need(self, n: int, what: str) -> int:
        """Make bytes [pos, pos + n) available; their offset in `buf`."""
        at = self.pos - self.buf_at
        if at + n <= len(self.buf) and at >= 0:
            return at
        self._check(self.pos + n, what)
        want = min(max(n, _BLOCK), self.end - self.pos)
        if want > self.left:  # blocks read again where a value straddled two of them
            raise GgufError(f"needs more than {self.cap:,} bytes read to walk its header")
        self.left -= want
        self.buf = self.reader.read_range(self.pos, want)
        self.buf_at = self.pos
        if len(self.buf) < n:
            raise GgufError(f"is truncated inside its header ({what}): it got shorter")
        return 0

    def take(self, n: int, what: str) -> bytes:
        at = self.need(n, what)
        self.pos += n
        return self.buf[at : at + n]

    def skip(self, n: int, what: str) -> None:
        """Step over n bytes without reading them."""
        self._check(self.pos + n, what)
        self.pos += n

    def u32(self, what: str) -> int:
        at = self.need(4, what)
        self.pos += 4
        return int(_U32.unpack_from(self.buf, at)[0])

    def u64(self, what: str) -> int:
        at = self.need(8, what)
        self.pos += 8
        return int(_U64.unpack_from(self.buf, at)[0])

    def scalar(self, vtype: int, what: str) -> Any:
        s = _SCALAR_STRUCTS[vtype]
        at = self.need(s.size, what)
        self.pos += s.size
        return s.unpack_from(self.buf, at)[0]

    def raw_string(self, what: str, cap: int) -> bytes:
        n = self.u64(what)
        self._check_length(n, what, cap)
        return self.take(n, what)

    def _check_length(self, n: int, what: str, cap: int) -> None:
        # gguf_reader::read(std::string &): at most GGUF_MAX_STRING_LENGTH, within the file
        if n > cap:
            raise GgufError(f"gives {what} a length of {n:,} bytes, over the {cap:,}-byte limit")
        if n > self.remaining():
            raise GgufError(
                f"is truncated inside its header, or gives {what} a length past the end of "
                f"the file ({n:,} bytes from byte {self.pos:,}; the file ends at "
                f"{self.size:,})"
            )

    def text(self, what: str) -> str | TextInfo:
        """A string value: its text while `KEEP_STRING` and `KEEP_TEXT` allow, else its
        length (its bytes checked to be in the file, not read)."""
        n = self.u64(what)
        self._check_length(n, what, MAX_STRING)
        if n > KEEP_STRING or n > self.keep_left:
            self.skip(n, what)
            return TextInfo(n)
        self.keep_left -= n
        return self.take(n, what).decode("utf-8", "replace")

    def skip_strings(self, count: int, what: str) -> None:
        """Step over `count` strings, each checked as `raw_string` checks it, without making
        a Python object of any: one length read per string, its bytes never read. A run of
        strings of one length (a crafted list of millions of tiny strings, or a real
        vocabulary's single characters) is checked with numpy, through a strided view of the
        lengths where they must be; the rest are walked in batches of `_BATCH`, and where
        runs keep being short the look for one is made less and less often."""
        unpack = _U64.unpack_from
        cap = MAX_STRING
        left = count
        wait, backoff = 0, 1  # batches to walk before the next look for a run
        while left:
            at = self.need(8, what)
            buf, base = self.buf, self.buf_at
            last = len(buf) - 8  # a length at or before this is in the buffer
            while left and at <= last:
                if wait:
                    wait -= 1
                else:
                    n = unpack(buf, at)[0]
                    if n <= cap:
                        run = _run_length(buf, at, n, left)  # at least this one string
                        at += run * (8 + n)
                        left -= run
                        backoff = 1 if run >= _RUN_WORTH else min(2 * backoff, _BACKOFF_MOST)
                        wait = backoff
                        continue
                walked = batch = min(left, _BATCH)
                for i in range(batch):
                    if at > last:
                        walked = i
                        break
                    n = unpack(buf, at)[0]
                    if n > cap:
                        self.pos = base + at
                        raise GgufError(
                            f"has a string of {n:,} bytes in {what}, over the {cap:,}-byte limit"
                        )
                    at += 8 + n
                left -= walked
            self.pos = base + at
            self._check(self.pos, what)


# Strings walked one by one between two looks for a run of one length; a run this long
# makes looking worth it; the most batches between two looks.
_BATCH = 64
_RUN_WORTH = 512
_BACKOFF_MOST = 1024
# The windows a run is checked in, each 8 times the last, so a run that ends soon costs
# no pass over the whole buffer.
_WINDOWS = (64, 512, 4096, 32768)


def _run_length(buf: bytes, at: int, n: int, most: int) -> int:
    """How many strings of `n` bytes follow from `at` (at most `most`), as far as `buf` holds
    their lengths."""
    stride = 8 + n
    fits = (len(buf) - 8 - at) // stride + 1 if at <= len(buf) - 8 else 0
    m = min(most, fits)
    if m <= 0:
        return 0
    lengths = np.ndarray((m,), dtype="<u8", buffer=buf, offset=at, strides=(stride,))
    for window in (*(w for w in _WINDOWS if w < m), m):
        other = np.flatnonzero(lengths[:window] != n)
        if other.size:
            return int(other[0])
    return m


def _shown(value: Any) -> str:
    """A metadata value in a message, bounded."""
    if isinstance(value, ArrayInfo):
        return f"an array of {value.length:,} {value.item_type}"
    if isinstance(value, list):
        return f"an array of {len(value):,}"
    if isinstance(value, str):
        return f"'{legible(value, limit=80)}'"
    return repr(value)


def _value(cur: _Cursor, vtype: int, key: str) -> Any:
    """One metadata value (`gguf_read_emplace_helper`): kept whole unless it is an array of
    more than `KEEP_ITEMS` items, which is checked and stepped over."""
    what = f"the value of '{_short(key)}'"
    if vtype in _SCALARS:
        return cur.scalar(vtype, what)
    if vtype == _STRING:
        return cur.text(what)
    if vtype != _ARRAY:
        raise GgufError(f"has metadata '{_short(key)}' of unknown value type {vtype}")
    item = cur.u32(what)
    count = cur.u64(what)
    if item == _ARRAY:  # gguf_init_from_file_impl: an array's items are never arrays
        raise GgufError(
            f"has an array of arrays in '{_short(key)}'; llama.cpp reads no "
            "nested arrays and refuses the file"
        )
    if item not in VALUE_TYPES:
        raise GgufError(f"has an array of unknown value type {item} in '{_short(key)}'")
    # gguf_reader::read(std::vector<T> &, n): at most GGUF_MAX_ARRAY_ELEMENTS items, and the
    # file must still hold n times the item size (a string's length prefix for strings).
    width = 8 if item == _STRING else _SCALAR_STRUCTS[item].size
    if count > GGUF_MAX_ARRAY_ELEMENTS:
        raise GgufError(
            f"has an array of {count:,} items in '{_short(key)}', over llama.cpp's "
            f"limit of {GGUF_MAX_ARRAY_ELEMENTS:,}"
        )
    if count * width > cur.remaining():
        raise GgufError(
            f"is truncated inside its header, or has an array in '{_short(key)}' "
            f"longer than the file ({count:,} items of at least {width} bytes from byte "
            f"{cur.pos:,}; the file ends at {cur.size:,})"
        )
    if item == _STRING:
        if count <= KEEP_ITEMS:
            return [cur.text(what) for _ in range(count)]
        cur.skip_strings(count, what)
        return ArrayInfo(VALUE_TYPES[item], count)
    if count <= KEEP_ITEMS:
        raw = cur.take(count * width, what)
        return list(struct.unpack(f"<{count}{_SCALARS[item]}", raw))
    cur.skip(count * width, what)  # any bytes are valid items: nothing to check, nothing read
    return ArrayInfo(VALUE_TYPES[item], count)


def _alignment(kv: Mapping[str, Any], kv_types: Mapping[str, str]) -> int:
    """`general.alignment` as llama.cpp takes it: a UINT32, a power of two, not zero."""
    if ALIGNMENT_KEY not in kv:
        return DEFAULT_ALIGNMENT
    value, vtype = kv[ALIGNMENT_KEY], kv_types[ALIGNMENT_KEY]
    if vtype != "UINT32":
        raise GgufError(
            f"stores {ALIGNMENT_KEY} as {vtype} ({_shown(value)}); llama.cpp requires a "
            "UINT32 and refuses the file"
        )
    if value == 0 or value & (value - 1):
        raise GgufError(
            f"has {ALIGNMENT_KEY} {value:,}, not a power of two; llama.cpp refuses the file "
            "(its data section cannot be placed)"
        )
    return int(value)


def _elements_representable(ne: tuple[int, ...]) -> bool:
    """gguf_init_from_file_impl: the element count, computed dimension by dimension, stays
    below INT64_MAX (C division, `ne` padded to GGML_MAX_DIMS with ones)."""
    count = math.prod(ne)
    if count < 1 << 62:
        return True  # no partial product can reach INT64_MAX; zero elements are read too
    ne0, ne1, ne2, ne3 = (*ne, 1, 1, 1, 1)[:GGML_MAX_DIMS]
    return not (
        INT64_MAX // ne1 <= ne0
        or INT64_MAX // ne2 <= ne0 * ne1
        or INT64_MAX // ne3 <= ne0 * ne1 * ne2
    )


def _tensor_infos(cur: _Cursor, n_tensors: int) -> tuple[list[GgufTensor], list[tuple[int, int]]]:
    """The tensor infos and the (later, earlier) indices of names given twice, parsed in place
    from the cursor's buffer (a crafted header may hold a million); each checked by `_tensor`."""
    tensors: list[GgufTensor] = []
    first: dict[str | bytes, int] = {}
    duplicates: list[tuple[int, int]] = []
    u64, u32 = _U64.unpack_from, _U32.unpack_from
    index = 0
    while index < n_tensors:
        buf, base = cur.buf, cur.buf_at
        at, stop = cur.pos - base, len(buf)
        want = 0
        while index < n_tensors:
            start = at
            if at + 8 > stop:
                want = 8
                break
            size = u64(buf, at)[0]
            if size >= GGML_MAX_NAME:  # too long for ggml, or over our cap, or past the file
                cur.pos = base + at
                _refused(cur, index)
            at += 8
            if at + size + 4 > stop:
                want = 8 + size + 4
                break
            raw = buf[at : at + size]
            n_dims = u32(buf, at + size)[0]
            at += size + 4
            if n_dims > GGML_MAX_DIMS:
                cur.pos = base + start
                _refused(cur, index)
            layout = _INFOS[n_dims]
            if at + layout.size > stop:
                want = at - start + layout.size
                break
            *ne, type_id, offset = layout.unpack_from(buf, at)
            at += layout.size
            name = raw.decode("utf-8", "replace")
            tensors.append(_checked(name, ne, type_id, offset))
            earlier = first.setdefault(_name_key(raw, name), index)
            if earlier != index:
                duplicates.append((index, earlier))
            index += 1
        cur.pos = base + at if not want else base + start
        if want:  # the next info runs past the buffer: read on from it (or the file ends)
            cur.need(want, f"tensor info {index:,}")
    return tensors, duplicates


def _name_key(raw: bytes, name: str) -> str | bytes:
    """What llama.cpp compares to find a name given twice: ggml's copy of it, a C string (the
    bytes up to a NUL). The decoded name itself where that is the same thing (no NUL, valid
    UTF-8), so the common case costs no second copy; the bytes otherwise."""
    if "\0" in name:
        raw = raw.split(b"\0", 1)[0]
        name = raw.decode("utf-8", "replace")
    return raw if "\ufffd" in name else name


def _refused(cur: _Cursor, index: int) -> NoReturn:
    """Tensor info `index`, which breaks a rule, read again field by field to say which."""
    _tensor(cur, index)
    raise AssertionError(f"tensor info {index} was refused, then read")


def _tensor(cur: _Cursor, index: int) -> GgufTensor:
    """One tensor info read field by field from the cursor, with the rules llama.cpp refuses
    a file for (the slow path of `_tensor_infos`, which takes it to say why it refuses)."""
    what = f"tensor info {index:,}"
    raw = cur.raw_string(what, MAX_KEY)
    name = raw.decode("utf-8", "replace")
    if len(raw) >= GGML_MAX_NAME:
        raise GgufError(
            f"names tensor {index:,} '{_short(name)}' in {len(raw):,} bytes; ggml holds at "
            f"most {GGML_MAX_NAME - 1} (GGML_MAX_NAME) and llama.cpp refuses the file"
        )
    n_dims = cur.u32(what)
    if n_dims > GGML_MAX_DIMS:
        raise GgufError(
            f"gives tensor '{_short(name)}' {n_dims:,} dimensions; ggml tensors have at most "
            f"{GGML_MAX_DIMS} (GGML_MAX_DIMS) and llama.cpp refuses the file"
        )
    layout = _INFOS[n_dims]  # the dimensions, the type and the offset
    *ne, type_id, offset = layout.unpack(cur.take(layout.size, what))
    return _checked(name, ne, type_id, offset)


def _checked(name: str, ne: list[int], type_id: int, offset: int) -> GgufTensor:
    """A tensor info whose shape and size llama.cpp accepts (gguf_init_from_file_impl)."""
    tensor = GgufTensor(name, tuple(ne), type_id, offset)
    if ne and max(ne) > INT64_MAX:
        raise GgufError(
            f"gives tensor '{_short(name)}' dimensions {ne}: negative as the int64 "
            "llama.cpp reads them"
        )
    if not _elements_representable(tensor.ne):
        raise GgufError(
            f"gives tensor '{_short(name)}' dimensions {ne}: more elements than an int64 "
            "counts; llama.cpp refuses the file"
        )
    known = GGML_TYPES.get(type_id)
    # the byte size must fit a size_t (an unknown type, or a row that is not whole blocks,
    # is a finding of the shard reader instead)
    if known and not tensor.row % known[1] and tensor.n_elements // known[1] > SIZE_MAX // known[2]:
        raise GgufError(
            f"gives tensor '{_short(name)}' ({known[0]}, dimensions {ne}) more than "
            f"{SIZE_MAX:,} bytes; llama.cpp refuses the file"
        )
    return tensor


_INFOS = tuple(struct.Struct(f"<{n}QIQ") for n in range(GGML_MAX_DIMS + 1))


def _short(name: str) -> str:
    """A key or tensor name in a message: itself when short and printable (tested inline:
    this runs for every key), else `legible`."""
    return name if len(name) <= 80 and name.isprintable() else legible(name, limit=80)


def read_gguf(reader: ByteSource, *, cap: int = GGUF_HEADER_CAP) -> GgufHeader:
    """The header of a GGUF file; raises `GgufError` for anything unreadable or refused."""
    cur = _Cursor(reader, cap)
    magic = cur.take(4, "the magic")
    if magic != GGUF_MAGIC:
        raise GgufError(f"does not start with the GGUF magic (starts with {magic.hex()})")
    version = cur.u32("the version")
    if version not in (2, 3):  # 0 and 1 are refused by llama.cpp, and versions past 3
        swapped = "; a big-endian file" if version & 0xFFFF == 0 else ""
        raise GgufError(f"is GGUF version {version}{swapped}; versions 2 and 3 are read")
    n_tensors = cur.u64("the tensor count")
    n_kv = cur.u64("the metadata count")
    if n_tensors > MAX_TENSORS or n_kv > MAX_KV:
        raise GgufError(
            f"declares {n_tensors:,} tensors and {n_kv:,} metadata entries, over the limits "
            f"({MAX_TENSORS:,} and {MAX_KV:,})"
        )
    kv: dict[str, Any] = {}
    kv_types: dict[str, str] = {}
    raw_keys: set[bytes] = set()
    for i in range(n_kv):
        raw = cur.raw_string(f"metadata key {i:,}", MAX_KEY)
        key = raw.decode("utf-8", "replace")
        # gguf_init_from_file_impl: no empty key, no key twice (compared as bytes)
        if not raw:
            raise GgufError(f"has an empty metadata key (entry {i:,}); llama.cpp refuses it")
        # gguf_find_key compares keys with strcmp: a key holding a NUL byte is, to llama.cpp,
        # the key its bytes before the NUL spell (`general.alignment\0x` is the alignment),
        # while a whole-key reader (gguf-py, this one) sees another key.
        if b"\0" in raw:
            seen = raw.split(b"\0", 1)[0].decode("utf-8", "replace")
            raise GgufError(
                f"has metadata key '{_short(key)}' holding a NUL byte; llama.cpp reads it as "
                f"'{_short(seen)}', other readers as another key"
            )
        if raw in raw_keys:
            raise GgufError(
                f"has metadata key '{_short(key)}' twice; llama.cpp refuses a duplicate key"
            )
        raw_keys.add(raw)
        vtype = cur.u32(f"metadata key {i:,}")
        kv[key] = _value(cur, vtype, key)
        kv_types[key] = VALUE_TYPES[vtype]
    alignment = _alignment(kv, kv_types)
    tensors, duplicates = _tensor_infos(cur, n_tensors)
    data_offset = -(-cur.pos // alignment) * alignment
    return GgufHeader(
        version,
        kv,
        kv_types,
        tuple(tensors),
        alignment,
        ALIGNMENT_KEY in kv,
        data_offset,
        cur.size,
        tuple(duplicates),
    )
