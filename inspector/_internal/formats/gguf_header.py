"""Read the header of a GGUF file (llama.cpp's format, written by the `gguf` package's
`GGUFWriter`) without its tensor data: magic, version, counts, metadata key/values and tensor
infos (docs/formats.md, "GGUF").

Hand-written to match the writer byte for byte, because the package's own `GGUFReader`
memory-maps the whole file and builds a view of every tensor (not header-only, and it raises
on a truncated download). Bounded: at most `GGUF_HEADER_CAP` bytes read in all, counts and
lengths capped before anything is allocated, arrays nested at most `MAX_ARRAY_DEPTH` deep;
only small arrays are kept (their length otherwise).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = [
    "GGML_TYPES",
    "GGUF_HEADER_CAP",
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
# Elements of one tensor past which no file could hold it (and int64 columns would overflow).
MAX_ELEMENTS = 1 << 62
MAX_DIMS = 8  # GGML_MAX_DIMS is 4; a little slack
MAX_STRING = 64_000_000
MAX_ARRAY_DEPTH = 4
KEEP_ITEMS = 16  # arrays up to this length keep their values
_BLOCK = 1 << 20
DEFAULT_ALIGNMENT = 32

# ggml type id -> (name, values per block, bytes per block) (gguf-py `GGML_QUANT_SIZES`).
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


class ByteSource(Protocol):
    def size(self) -> int: ...

    def read_range(self, offset: int, length: int) -> bytes: ...


class GgufError(ValueError):
    """The header cannot be read; the message is a clause after the file name."""


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
    def n_bytes(self) -> int | None:
        """Bytes of its data, or None for an unknown type or a row not a whole block."""
        known = GGML_TYPES.get(self.type_id)
        if known is None or not self.ne or self.ne[0] % known[1]:
            return None if known is None or self.ne else known[2] // known[1]
        return self.n_elements // known[1] * known[2]


@dataclass(frozen=True, slots=True)
class GgufHeader:
    version: int
    kv: Mapping[str, Any]  # scalars and strings; small arrays as lists; others ArrayInfo
    kv_types: Mapping[str, str]
    tensors: tuple[GgufTensor, ...]
    alignment: int
    alignment_stated: bool
    data_offset: int
    file_size: int


@dataclass(frozen=True, slots=True)
class ArrayInfo:
    """An array too long to keep: its item type and length."""

    item_type: str
    length: int


class _Cursor:
    def __init__(self, reader: ByteSource, cap: int) -> None:
        self.reader = reader
        self.size = reader.size()
        self.left = cap
        self.pos = 0
        self.buf = b""
        self.buf_at = 0

    def take(self, n: int, what: str) -> bytes:
        if self.pos + n > self.size:
            raise GgufError(f"is truncated inside its header ({what} at byte {self.pos:,})")
        end = self.pos + n
        if end > self.buf_at + len(self.buf) or self.pos < self.buf_at:
            want = min(max(n, _BLOCK), self.size - self.pos)
            if want > self.left:
                raise GgufError(
                    f"has a header larger than the {GGUF_HEADER_CAP:,}-byte limit for GGUF "
                    "headers; real files need far less: it is corrupt or crafted"
                )
            self.left -= want
            self.buf = self.reader.read_range(self.pos, want)
            self.buf_at = self.pos
            if len(self.buf) < n:
                raise GgufError(f"is truncated inside its header ({what})")
        start = self.pos - self.buf_at
        self.pos = end
        return self.buf[start : start + n]

    def unpack(self, fmt: str, what: str) -> Any:
        size = struct.calcsize("<" + fmt)
        return struct.unpack("<" + fmt, self.take(size, what))[0]

    def string(self, what: str, cap: int = MAX_STRING) -> str:
        n = self.unpack("Q", what)
        if n > cap:
            raise GgufError(f"has a {what} of {n:,} bytes, over the {cap:,}-byte limit")
        return self.take(n, what).decode("utf-8", "replace")


def _value(cur: _Cursor, vtype: int, key: str, depth: int = 0) -> Any:
    if vtype in _SCALARS:
        return cur.unpack(_SCALARS[vtype], f"the value of {key[:80]!r}")
    if vtype == _STRING:
        return cur.string(f"string value of {key[:80]!r}")
    if vtype == _ARRAY:
        if depth >= MAX_ARRAY_DEPTH:
            raise GgufError(f"nests arrays more than {MAX_ARRAY_DEPTH} deep in {key[:80]!r}")
        item = cur.unpack("I", "an array item type")
        count = cur.unpack("Q", "an array length")
        if item not in VALUE_TYPES:
            raise GgufError(f"has an array of unknown value type {item} in {key[:80]!r}")
        if item in _SCALARS:
            width = struct.calcsize("<" + _SCALARS[item])
            if count * width > cur.size:
                raise GgufError(f"has an array in {key[:80]!r} longer than the file")
            raw = cur.take(count * width, f"the array {key[:80]!r}")
            if count <= KEEP_ITEMS:
                return list(struct.unpack(f"<{count}{_SCALARS[item]}", raw))
            return ArrayInfo(VALUE_TYPES[item], count)
        if count > cur.size:  # every item takes at least one byte
            raise GgufError(f"has an array in {key[:80]!r} longer than the file")
        items = [_value(cur, item, key, depth + 1) for _ in range(count)]
        return items if count <= KEEP_ITEMS else ArrayInfo(VALUE_TYPES[item], count)
    raise GgufError(f"has metadata {key[:80]!r} of unknown value type {vtype}")


def read_gguf(reader: ByteSource, *, cap: int = GGUF_HEADER_CAP) -> GgufHeader:
    """The header of a GGUF file; raises `GgufError` for anything unreadable."""
    cur = _Cursor(reader, cap)
    magic = cur.take(4, "the magic")
    if magic != GGUF_MAGIC:
        raise GgufError(f"does not start with the GGUF magic (starts with {magic.hex()})")
    version = cur.unpack("I", "the version")
    if version not in (2, 3):
        swapped = "; a big-endian file" if version & 0xFFFF == 0 else ""
        raise GgufError(f"is GGUF version {version}{swapped}; versions 2 and 3 are read")
    n_tensors = cur.unpack("Q", "the tensor count")
    n_kv = cur.unpack("Q", "the metadata count")
    if n_tensors > MAX_TENSORS or n_kv > MAX_KV:
        raise GgufError(
            f"declares {n_tensors:,} tensors and {n_kv:,} metadata entries, over the limits "
            f"({MAX_TENSORS:,} and {MAX_KV:,})"
        )
    kv: dict[str, Any] = {}
    kv_types: dict[str, str] = {}
    for _ in range(n_kv):
        key = cur.string("metadata key", cap=65_536)
        vtype = cur.unpack("I", f"the type of {key[:80]!r}")
        kv[key] = _value(cur, vtype, key)
        kv_types[key] = VALUE_TYPES.get(vtype, str(vtype))
    tensors = []
    for _ in range(n_tensors):
        name = cur.string("tensor name", cap=65_536)
        n_dims = cur.unpack("I", f"the dimensions of {name[:80]!r}")
        if n_dims > MAX_DIMS:
            raise GgufError(f"gives tensor {name[:80]!r} {n_dims} dimensions (at most {MAX_DIMS})")
        ne = tuple(cur.unpack("Q", f"a dimension of {name[:80]!r}") for _ in range(n_dims))
        type_id = cur.unpack("I", f"the type of {name[:80]!r}")
        offset = cur.unpack("Q", f"the offset of {name[:80]!r}")
        if math.prod(ne) > MAX_ELEMENTS:
            raise GgufError(f"gives tensor {name[:80]!r} dimensions {list(ne)}: too large")
        tensors.append(GgufTensor(name, ne, type_id, offset))
    stated = kv.get("general.alignment")
    alignment = DEFAULT_ALIGNMENT
    good = False
    if type(stated) is int and stated > 0 and stated & (stated - 1) == 0:
        alignment, good = stated, True
    data_offset = -(-cur.pos // alignment) * alignment
    return GgufHeader(version, kv, kv_types, tuple(tensors), alignment, good, data_offset, cur.size)
