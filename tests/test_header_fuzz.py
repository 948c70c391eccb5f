"""Property tests of the header reader: damaged files never crash it or make it over-read,
and any valid header (from the safetensors writer or generated) reads back with no finding."""

from __future__ import annotations

import json
import math
import re
import struct
from unittest import mock

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.numpy import save

from inspector._internal.common.dtypes import DTYPE_BITS
from inspector._internal.findings.finding import CODES
from inspector._internal.formats import safetensors as safetensors_format
from inspector._internal.formats.safetensors import ShardHeader, parse_header_bytes, read_header

SHARD_CODES = {
    "header-unreadable",
    "header-invalid-entry",
    "header-duplicate-key",
    "unknown-dtype",
    "size-mismatch",
    "offset-invalid",
    "file-truncated",
    "trailing-bytes",
}
CAP = 4096
FUZZ = settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])


class CountingReader:
    """A RangeReader over bytes that records how many bytes it handed out."""

    def __init__(self, data: bytes) -> None:
        self.name = "fuzz.safetensors"
        self._data = data
        self.bytes_read = 0

    def size(self) -> int:
        return len(self._data)

    def read_range(self, offset: int, length: int) -> bytes:
        chunk = self._data[offset : offset + length]
        self.bytes_read += len(chunk)
        return chunk

    def close(self) -> None:
        pass


def _valid_file() -> bytes:
    """A real file with several dtypes, metadata, a 0-d and an empty tensor."""
    return save(
        {
            "model.layers.0.mlp.experts.3.down_proj.weight": np.arange(12, dtype=np.uint8).reshape(
                3, 4
            ),
            "model.layers.0.mlp.experts.3.down_proj.weight_scale": np.ones((3, 1), np.float16),
            "model.layers.0.mlp.experts.3.down_proj.input_scale": np.array(0.5, np.float32),
            "model.norm.weight": np.ones(8, np.float64),
            "empty": np.zeros((0, 5), np.int32),
        },
        metadata={"format": "pt", "note": "fuzz"},
    )


VALID = _valid_file()


def _read(data: bytes) -> tuple[ShardHeader, CountingReader]:
    reader = CountingReader(data)
    shard = read_header(reader, file="fuzz.safetensors", cap=CAP)
    return shard, reader


def _sane(shard: ShardHeader, reader: CountingReader) -> None:
    """What must hold for any input: bounded reads, known codes, consistent columns."""
    assert reader.bytes_read <= 8 + CAP
    assert {f.code for f in shard.findings} <= SHARD_CODES
    assert all(f.severity == CODES[f.code] and f.file == "fuzz.safetensors" for f in shard.findings)
    n = len(shard.names)
    assert n == len(shard.dtypes) == len(shard.shapes) == len(shard.begins) == len(shard.ends)
    if shard.header_len is None:
        assert [f.code for f in shard.findings] == ["header-unreadable"] and n == 0


def test_the_valid_file_itself_has_no_finding() -> None:
    shard, reader = _read(VALID)
    assert shard.findings == () and len(shard.names) == 5
    assert reader.bytes_read == 8 + shard.header_len


@FUZZ
@given(
    edits=st.lists(st.tuples(st.integers(0, len(VALID) - 1), st.integers(0, 255)), max_size=8),
    cut=st.integers(0, len(VALID)),
    tail=st.binary(max_size=16),
)
def test_random_byte_damage_never_raises_or_over_reads(edits, cut, tail) -> None:
    data = bytearray(VALID)
    for pos, value in edits:
        data[pos] = value
    damaged = bytes(data[:cut]) + tail
    shard, reader = _read(damaged)
    _sane(shard, reader)
    (n,) = struct.unpack("<Q", VALID[:8])
    if damaged[: 8 + n] == VALID[: 8 + n]:
        # Header intact: only the length can be wrong, and it is always noticed exactly.
        size = len(damaged)
        want = (
            []
            if size == len(VALID)
            else ["file-truncated" if size < len(VALID) else "trailing-bytes"]
        )
        if size >= 8 + n:
            assert [f.code for f in shard.findings] == want


@FUZZ
@given(length=st.integers(0, 2**64 - 1), body=st.binary(max_size=64))
def test_any_length_prefix_is_safe(length, body) -> None:
    shard, reader = _read(struct.pack("<Q", length) + body)
    _sane(shard, reader)
    if length > len(body):
        assert [f.code for f in shard.findings] == ["header-unreadable"]
        assert reader.bytes_read == 8


JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=12,
)


@FUZZ
@given(
    target=st.sampled_from(["dtype", "shape", "data_offsets", "entry", "__metadata__"]),
    value=JSON_VALUES,
    which=st.integers(0, 4),
)
def test_random_json_values_in_the_header_never_raise(target, value, which) -> None:
    (n,) = struct.unpack("<Q", VALID[:8])
    header = json.loads(VALID[8 : 8 + n])
    names = [k for k in header if k != "__metadata__"]
    name = names[which % len(names)]
    if target == "entry":
        header[name] = value
    elif target == "__metadata__":
        header["__metadata__"] = value
    else:
        header[name][target] = value
    raw = json.dumps(header).encode()
    shard, reader = _read(struct.pack("<Q", len(raw)) + raw + VALID[8 + n :])
    _sane(shard, reader)


# -- valid headers round-trip ----------------------------------------------------------------

NUMPY_DTYPES = [
    np.uint8,
    np.int8,
    np.int16,
    np.uint16,
    np.float16,
    np.int32,
    np.uint32,
    np.float32,
    np.int64,
    np.uint64,
    np.float64,
    np.complex64,
    np.bool_,
]
NAMES = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=24)


@settings(max_examples=150, deadline=None)
@given(
    st.dictionaries(
        NAMES.filter(lambda k: k != "__metadata__"),
        st.tuples(st.sampled_from(NUMPY_DTYPES), st.lists(st.integers(0, 5), max_size=3)),
        max_size=12,
    )
)
def test_files_from_the_safetensors_writer_round_trip(spec) -> None:
    arrays = {k: np.zeros(shape, dtype=dtype) for k, (dtype, shape) in spec.items()}
    data = save(arrays, metadata={"format": "np"})
    shard, reader = _read(data)
    assert shard.findings == ()
    assert reader.bytes_read == 8 + shard.header_len
    assert dict(zip(shard.names, shard.shapes, strict=True)) == {
        k: a.shape for k, a in arrays.items()
    }
    nbytes = {n: e - b for n, b, e in zip(shard.names, shard.begins, shard.ends, strict=True)}
    assert nbytes == {k: a.nbytes for k, a in arrays.items()}


@st.composite
def generated_headers(draw) -> tuple[dict, int]:
    """A valid header of any dtype (F4 and F6 included) with its data laid out in a random
    order, so that key order and offset order differ."""
    names = draw(st.lists(NAMES.filter(lambda k: k != "__metadata__"), unique=True, max_size=20))
    entries = []
    for name in names:
        dtype = draw(st.sampled_from(sorted(DTYPE_BITS)))
        shape = draw(st.lists(st.integers(0, 6), max_size=3))
        if DTYPE_BITS[dtype] % 8:
            shape.append(4)  # 4 sub-byte elements are always whole bytes (16 or 24 bits)
        entries.append((name, dtype, shape, math.prod(shape) * DTYPE_BITS[dtype] // 8))
    order = draw(st.permutations(range(len(entries))))
    header: dict = {"__metadata__": {"format": "pt"}}
    offset = 0
    offsets = {}
    for i in order:
        offsets[i] = [offset, offset + entries[i][3]]
        offset += entries[i][3]
    for i, (name, dtype, shape, _) in enumerate(entries):
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": offsets[i]}
    return header, offset


@FUZZ
@given(generated_headers(), st.integers(0, 7))
def test_generated_valid_headers_round_trip(generated, padding) -> None:
    header, data_len = generated
    raw = json.dumps(header).encode() + b" " * padding
    shard = parse_header_bytes(raw, file="gen.safetensors", file_size=8 + len(raw) + data_len)
    assert shard.findings == ()
    assert shard.metadata == {"format": "pt"}
    expected = {
        k: (v["dtype"], tuple(v["shape"]), *v["data_offsets"])
        for k, v in header.items()
        if k != "__metadata__"
    }
    got = {
        n: (d, s, b, e)
        for n, d, s, b, e in zip(
            shard.names, shard.dtypes, shard.shapes, shard.begins, shard.ends, strict=True
        )
    }
    assert got == expected
    assert shard.tensor_bytes == data_len
    # One byte more or less is always noticed.
    longer = parse_header_bytes(raw, file="gen.safetensors", file_size=9 + len(raw) + data_len)
    assert [f.code for f in longer.findings] == ["trailing-bytes"]
    if data_len:
        shorter = parse_header_bytes(raw, file="gen.safetensors", file_size=7 + len(raw) + data_len)
        assert [f.code for f in shorter.findings] == ["file-truncated"]


# -- the bulk path says what the per-entry path says ------------------------------------------

EDGE_NUMBERS = st.sampled_from([-1, 0, 1, 3, 2**31, 2**60, 2**62, 2**63 - 1, 2**63, 2**64 - 1])
EDGE_VALUES = (
    EDGE_NUMBERS
    | st.lists(EDGE_NUMBERS, max_size=3)
    | st.sampled_from([True, 1.0, "BF16", "F4", "X", None, [1, True], [0.5]])
    | JSON_VALUES
)


@FUZZ
@given(
    generated_headers(),
    st.lists(
        st.tuples(
            st.integers(0, 19),
            st.sampled_from(["dtype", "shape", "data_offsets", "offset+1", "begin", "end"]),
            EDGE_VALUES,
        ),
        max_size=3,
    ),
    st.integers(-2, 2),
    st.sampled_from(["writer", "spaced", "unicode"]),
    st.sampled_from(["none", "metadata-last", "metadata-int", "duplicate", "extra-field"]),
)
def test_bulk_path_reads_what_the_per_entry_path_reads(
    generated, edits, size_change, style, twist
) -> None:
    """Every header, valid or damaged where the bulk checks look (dtype, shape, offsets,
    sizes, tiling, int64 range), reads the same with the typed decode, with the bulk path
    and with neither: each fast path only takes what the per-entry path would accept, and
    says the same of the file. Written as writers write it (no spaces), spaced, with raw
    non-ASCII names, and twisted where the typed decode looks (metadata not first or not
    strings, a repeated name, an extra field)."""
    header, data_len = generated
    names = [k for k in header if k != "__metadata__"]
    for which, field, value in edits if names else []:
        entry = header[names[which % len(names)]]
        if field in ("dtype", "shape", "data_offsets"):
            entry[field] = value
            continue
        offsets = entry["data_offsets"]
        if not (isinstance(offsets, list) and len(offsets) == 2):
            continue  # an earlier edit replaced them
        begin, end = offsets
        if field == "begin":
            entry["data_offsets"] = [value, end]
        elif field == "end":
            entry["data_offsets"] = [begin, value]
        elif type(end) is int:
            entry["data_offsets"] = [begin, end + 1]
    if twist == "metadata-last":
        header["__metadata__"] = header.pop("__metadata__")
    elif twist == "metadata-int":
        header["__metadata__"]["n"] = 1
    elif twist == "extra-field" and names:
        header[names[0]]["extra"] = [1, {"x": None}]
    separators = (", ", ": ") if style == "spaced" else (",", ":")
    text = json.dumps(header, separators=separators, ensure_ascii=style != "unicode")
    if twist == "duplicate" and names:
        first = json.dumps({names[0]: header[names[0]]}, separators=separators)[1:-1]
        text = text[:-1] + "," + first + "}"
    raw = text.encode("utf-8", "surrogatepass")
    size = max(8 + len(raw) + data_len + size_change, 0)
    typed = parse_header_bytes(raw, file="gen.safetensors", file_size=size)
    with mock.patch.object(safetensors_format, "_typed_columns", lambda _raw: None):
        bulk = parse_header_bytes(raw, file="gen.safetensors", file_size=size)
        with mock.patch.object(safetensors_format, "_bulk_columns", lambda _header: None):
            walked = parse_header_bytes(raw, file="gen.safetensors", file_size=size)
    assert typed == bulk == walked
    for one in (typed, bulk):
        assert one.dtype.values == walked.dtype.values and one.shape.values == walked.shape.values


@given(st.binary(max_size=300), st.integers(1, 40))
def test_byte_counts_equal_bytes_count_across_chunks(data: bytes, chunk: int) -> None:
    """The typed path's bracket, brace and colon counts (numpy, a chunk at a time) are
    `bytes.count`'s, wherever the chunks cut."""
    with mock.patch.object(safetensors_format, "_COUNT_CHUNK", chunk):
        counts = safetensors_format._byte_counts(data, b"[{:")
    assert counts == [data.count(b) for b in (b"[", b"{", b":")]


@given(
    st.binary(max_size=200) | st.text("[, \t-0a", max_size=60).map(str.encode), st.integers(1, 40)
)
def test_minus_zero_doubt_covers_every_array_element(data: bytes, chunk: int) -> None:
    """The typed path leaves every header with a `-0` array element (which the reference
    reader refuses) to the slow path, wherever the numpy chunks cut."""
    element = re.search(rb"[\[,][ \t\n\r]*-0", data)
    with mock.patch.object(safetensors_format, "_COUNT_CHUNK", chunk):
        assert safetensors_format._minus_zero(data) or element is None
