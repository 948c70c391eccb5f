"""The safetensors header reader against real files written by safetensors, then damaged.

Each shard-integrity code of docs/findings.md gets a file that has exactly that problem; the
test checks the exact set of codes, the file and tensor fields, that the message names the
bad value, and (for errors) that the safetensors library itself refuses the same file.
"""

from __future__ import annotations

import json
import os
import struct
import sys
from collections.abc import Callable
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.numpy import save_file
from safetensors.torch import save_file as save_torch

from inspector._internal.common.dtypes import DTYPE_BITS
from inspector._internal.findings.finding import FOLD
from inspector._internal.formats import safetensors as safetensors_format
from inspector._internal.formats.safetensors import (
    DEFAULT_HEADER_CAP,
    ShardHeader,
    parse_header_bytes,
    read_header,
    read_shard,
)
from inspector._internal.storage import LocalFile

NAME = "model.safetensors"


# -- helpers -------------------------------------------------------------------------------


def healthy(folder: Path) -> Path:
    """A real file: a float32 (2, 3), an int64 (4,), a uint8 (5,), with format metadata."""
    path = folder / NAME
    tensors = {
        "a": np.arange(6, dtype=np.float32).reshape(2, 3),
        "b": np.arange(4, dtype=np.int64),
        "c": np.arange(5, dtype=np.uint8),
    }
    save_file(tensors, str(path), metadata={"format": "pt"})
    return path


def split(path: Path) -> tuple[dict, bytes]:
    """(header as a dict in file order, data section) of a safetensors file."""
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8 : 8 + n]), raw[8 + n :]


def rewrite(path: Path, header: dict | bytes, data: bytes) -> None:
    """Write `header` (a dict, or raw bytes used as they are) and `data` back to `path`."""
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)


def scan(path: Path, **kwargs: int) -> ShardHeader:
    return read_shard(path, root=path.parent, **kwargs)


def codes(shard: ShardHeader) -> set[str]:
    return {f.code for f in shard.findings}


def only(shard: ShardHeader, code: str) -> list:
    """The findings of `shard`, asserting they all have `code` and name the file."""
    assert codes(shard) == {code}, [f.message for f in shard.findings]
    assert all(f.file == shard.file for f in shard.findings)
    assert all(f.message.startswith(f"{shard.file}: ") for f in shard.findings)
    return list(shard.findings)


def library_rejects(path: Path) -> bool:
    """True when the safetensors library refuses to open the file or load any tensor."""
    try:
        with safe_open(str(path), framework="np") as fh:
            for key in fh.keys():  # noqa: SIM118 - safe_open handles have no __iter__
                fh.get_tensor(key)
    except Exception:
        return True
    return False


class CountingReader:
    """A RangeReader over bytes in memory that records every byte it hands out."""

    def __init__(self, data: bytes, *, size: int | None = None) -> None:
        self.name = "counted.safetensors"
        self._data = data
        self._size = len(data) if size is None else size
        self.bytes_read = 0

    def size(self) -> int:
        return self._size

    def read_range(self, offset: int, length: int) -> bytes:
        chunk = self._data[offset : offset + length]
        self.bytes_read += len(chunk)
        return chunk

    def close(self) -> None:
        pass


# -- healthy files -------------------------------------------------------------------------


def test_healthy_file_has_no_finding_and_matches_the_library(tmp_path: Path) -> None:
    path = tmp_path / NAME
    tensors = {
        "w.bf16": torch.ones(3, 5, dtype=torch.bfloat16),
        "w.f8": torch.zeros(4, 4, dtype=torch.float8_e4m3fn),
        "w.c64": torch.zeros(2, dtype=torch.complex64),
        "w.bool": torch.ones(7, dtype=torch.bool),
        "w.u16": torch.zeros(3, dtype=torch.uint16),
        "w.i64": torch.arange(3),
    }
    save_torch(tensors, str(path), metadata={"format": "pt"})
    shard = scan(path)
    assert shard.findings == ()
    assert shard.metadata == {"format": "pt"}
    assert shard.file_size == path.stat().st_size
    with safe_open(str(path), framework="pt") as fh:
        expected = {k: tuple(fh.get_slice(k).get_shape()) for k in fh.keys()}  # noqa: SIM118
    assert dict(zip(shard.names, shard.shapes, strict=True)) == expected
    nbytes = {n: e - b for n, b, e in zip(shard.names, shard.begins, shard.ends, strict=True)}
    assert nbytes == {k: v.numel() * v.element_size() for k, v in tensors.items()}
    assert shard.tensor_bytes == path.stat().st_size - shard.data_start


def test_zero_dim_and_empty_tensors_are_legal(tmp_path: Path) -> None:
    path = tmp_path / NAME
    tensors = {
        "scalar": np.array(3.5, dtype=np.float32),
        "empty": np.zeros((0, 3), dtype=np.float32),
        "empty2": np.zeros((4, 0), dtype=np.int8),
        "row": np.ones(2, dtype=np.float64),
    }
    save_file(tensors, str(path))
    shard = scan(path)
    assert shard.findings == ()
    shapes = dict(zip(shard.names, shard.shapes, strict=True))
    assert shapes == {"scalar": (), "empty": (0, 3), "empty2": (4, 0), "row": (2,)}
    assert not library_rejects(path)


@pytest.mark.parametrize("dtype", sorted(DTYPE_BITS))
def test_every_safetensors_dtype_is_accepted_with_its_byte_size(tmp_path: Path, dtype: str) -> None:
    # A real 24-byte U8 tensor relabelled: 192 bits are a whole number of elements of every
    # width (4, 6, 8, 16, 32, 64 bits).
    path = tmp_path / NAME
    save_file({"t": np.zeros(24, dtype=np.uint8)}, str(path))
    header, data = split(path)
    numel = 24 * 8 // DTYPE_BITS[dtype]
    header["t"].update(dtype=dtype, shape=[numel])
    rewrite(path, header, data)
    shard = scan(path)
    assert shard.findings == ()
    assert (shard.dtypes, shard.shapes, shard.ends[0] - shard.begins[0]) == (
        [dtype],
        [(numel,)],
        24,
    )


def test_f4_with_odd_element_count_is_a_size_mismatch(tmp_path: Path) -> None:
    path = tmp_path / NAME
    save_file({"t": np.zeros(2, dtype=np.uint8)}, str(path))
    header, data = split(path)
    header["t"].update(dtype="F4", shape=[3])  # 12 bits: not whole bytes
    rewrite(path, header, data)
    (finding,) = only(scan(path), "size-mismatch")
    assert finding.tensor == "t"
    assert "F4 [3]" in finding.message and "1.5 (not a whole number of bytes)" in finding.message
    assert library_rejects(path)


# -- header-unreadable, one test per cause --------------------------------------------------


def test_file_under_8_bytes(tmp_path: Path) -> None:
    path = tmp_path / NAME
    path.write_bytes(b"\x05\x00\x00")
    (finding,) = only(scan(path), "header-unreadable")
    assert "file is 3 bytes" in finding.message and finding.tensor is None
    assert scan(path).header_len is None
    assert library_rejects(path)


def test_header_length_past_end_of_file(tmp_path: Path) -> None:
    path = healthy(tmp_path)
    raw = path.read_bytes()
    bad_len = len(raw)  # below the cap, but more than the file holds after the prefix
    path.write_bytes(struct.pack("<Q", bad_len) + raw[8:])
    (finding,) = only(scan(path), "header-unreadable")
    assert f"header length {bad_len:,}" in finding.message
    assert f"{len(raw):,}-byte file" in finding.message
    assert library_rejects(path)


def test_header_over_the_cap_and_the_cap_is_configurable(tmp_path: Path) -> None:
    path = healthy(tmp_path)
    header_len = struct.unpack("<Q", path.read_bytes()[:8])[0]
    assert scan(path, cap=header_len).findings == ()
    (finding,) = only(scan(path, cap=header_len - 1), "header-unreadable")
    assert f"header length {header_len:,}" in finding.message
    assert f"limit of {header_len - 1:,}" in finding.message


def test_huge_header_length_neither_allocates_nor_hangs() -> None:
    prefix = struct.pack("<Q", 2**63)
    reader = CountingReader(prefix + b"{}      ")
    shard = read_header(reader, file="huge.safetensors")
    assert codes(shard) == {"header-unreadable"}
    assert f"{2**63:,}" in shard.findings[0].message
    assert reader.bytes_read == 8
    # Even with the cap lifted, the length is checked against the file size before reading.
    lifted = CountingReader(prefix + b"{}      ", size=2**40)
    shard = read_header(lifted, file="huge.safetensors", cap=2**64)
    assert codes(shard) == {"header-unreadable"} and lifted.bytes_read == 8
    assert DEFAULT_HEADER_CAP == 100_000_000


def test_header_not_utf8(tmp_path: Path) -> None:
    path = healthy(tmp_path)
    header, data = split(path)
    raw = json.dumps(header).encode().replace(b'"c"', b'"c\xff"')
    rewrite(path, raw, data)
    (finding,) = only(scan(path), "header-unreadable")
    assert "not UTF-8" in finding.message and "b'\\xff'" in finding.message
    bad_at = raw.index(b"\xff")
    assert f"offset {bad_at:,}" in finding.message
    assert library_rejects(path)


def test_header_not_json(tmp_path: Path) -> None:
    path = healthy(tmp_path)
    header, data = split(path)
    raw = json.dumps(header).encode()
    raw = raw[: raw.index(b'"b"')] + b'"b": {"dtype": "I64",, ' + raw[raw.index(b'"b"') :]
    rewrite(path, raw, data)
    (finding,) = only(scan(path), "header-unreadable")
    assert "not valid JSON" in finding.message and '"I64",,' in finding.message
    assert library_rejects(path)


def _compact(header: dict) -> str:
    """The header as the writer wrote it (no spaces): the shape the typed decode takes."""
    return json.dumps(header, separators=(",", ":"))


@pytest.mark.parametrize(
    ("splice", "depth_limit"),
    [
        # a comma after the metadata that no entry follows
        (lambda text: '{"__metadata__":' + json.dumps({"format": "pt"}) + ", }", None),
        # numbers orjson overflows to infinity, in a field the typed decode skips unread
        (lambda text: text.replace('{"dtype"', '{"x":1e999,"dtype"', 1), None),
        (lambda text: text.replace('{"dtype"', '{"x":[' + "9" * 320 + '],"dtype"', 1), None),
        # nesting past orjson's 1,024 levels with Python's recursion limit raised (torch's
        # inductor raises it to 2,000), which the typed decode's depth follows
        (
            lambda text: text.replace(
                '{"dtype"', '{"x":' + "[" * 1100 + "]" * 1100 + ',"dtype"', 1
            ),
            5000,
        ),
    ],
    ids=["metadata-trailing-comma", "exponent-infinity", "integer-infinity", "deep-raised-limit"],
)
def test_header_orjson_refuses_is_unreadable_through_the_typed_decode(
    tmp_path: Path, splice: Callable[[str], str], depth_limit: int | None
) -> None:
    """What the bulk path (orjson) refuses is refused whichever decode reads the header:
    before, the typed decode read each of these as a healthy header."""
    path = healthy(tmp_path)
    header, data = split(path)
    rewrite(path, splice(_compact(header)).encode(), data)
    limit = sys.getrecursionlimit()
    try:
        if depth_limit is not None:
            sys.setrecursionlimit(depth_limit)
        shard = scan(path)
        with mock.patch.object(safetensors_format, "_typed_columns", lambda _raw: None):
            untyped = scan(path)
    finally:
        sys.setrecursionlimit(limit)
    assert shard == untyped
    assert [f.code for f in shard.findings] == ["header-unreadable"]
    assert library_rejects(path)


def test_header_json_but_not_an_object(tmp_path: Path) -> None:
    path = healthy(tmp_path)
    _, data = split(path)
    rewrite(path, b'[{"a": 1}, 2]   ', data)
    (finding,) = only(scan(path), "header-unreadable")
    assert "JSON array" in finding.message and "expected an object" in finding.message
    assert library_rejects(path)


@pytest.mark.parametrize(
    ("prefix", "shown", "library_too"),
    [
        (b"PK\x03\x04", "does not start with '{' (starts with b'PK\\x03\\x04", True),
        # docs/formats.md: the header must start with '{'. safetensors 0.8's own reader is more
        # lenient and skips leading whitespace; we keep the format's rule (strict readers).
        (b"  ", "starts with b'  {\"", False),
    ],
    ids=["zip-magic", "leading-whitespace"],
)
def test_header_not_starting_with_brace(
    tmp_path: Path, prefix: bytes, shown: str, library_too: bool
) -> None:
    path = healthy(tmp_path)
    header, data = split(path)
    rewrite(path, prefix + json.dumps(header).encode(), data)
    (finding,) = only(scan(path), "header-unreadable")
    assert shown in finding.message
    assert library_rejects(path) is library_too


def test_unopenable_paths_are_findings(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.safetensors"
    os.mkfifo(fifo)  # opening a FIFO for reading would block without a writer
    folder = tmp_path / "dir.safetensors"
    folder.mkdir()
    for path in (folder, tmp_path / "gone.safetensors"):
        (finding,) = only(scan(path), "header-unreadable")
        assert finding.file == path.name and "cannot be read" in finding.message
    # Not a regular file: refused by the storage before anything is read.
    (finding,) = only(scan(fifo), "file-unsafe")
    assert finding.file == fifo.name and "is a FIFO, not a regular file" in finding.message


# -- header-invalid-entry -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "shown"),
    [
        ({"dtype": None}, "dtype None"),
        ({"dtype": 7}, "dtype 7"),
        ({"shape": None}, "shape None"),
        ({"shape": "2x3"}, "shape '2x3'"),
        ({"shape": [2, -3]}, "shape [2, -3]"),
        ({"shape": [2.0, 3]}, "shape [2.0, 3]"),
        ({"shape": [True, 6]}, "shape [True, 6]"),
        ({"data_offsets": None}, "data_offsets None"),
        ({"data_offsets": [0, 12, 24]}, "data_offsets [0, 12, 24]"),
        ({"data_offsets": [0.0, 24]}, "data_offsets [0.0, 24]"),
        ({"data_offsets": [24, 0]}, "data_offsets [24, 0]"),
    ],
    ids=lambda v: str(v) if isinstance(v, str) else json.dumps(v),
)
def test_invalid_entry(tmp_path: Path, change: dict, shown: str) -> None:
    path = healthy(tmp_path)
    header, data = split(path)
    for key, value in change.items():
        if value is None:
            del header["a"][key]
        else:
            header["a"][key] = value
    rewrite(path, header, data)
    shard = scan(path)
    (finding,) = only(shard, "header-invalid-entry")
    assert finding.tensor == "a" and shown in finding.message
    assert "a" not in shard.names and set(shard.names) == {"b", "c"}
    assert library_rejects(path)


def test_entry_that_is_not_an_object(tmp_path: Path) -> None:
    path = healthy(tmp_path)
    header, data = split(path)
    header["c"] = ["U8", [5], [56, 61]]
    rewrite(path, header, data)
    (finding,) = only(scan(path), "header-invalid-entry")
    assert finding.tensor == "c" and "entry is list ['U8', [5], [56, 61]]" in finding.message
    # The library's serde decoding takes a 3-item array as the entry's fields in order; the
    # format (and every other reader) wants an object, so we keep calling it invalid.
    assert not library_rejects(path)
    header["c"] = "U8 [5] [56, 61]"
    rewrite(path, header, data)
    (finding,) = only(scan(path), "header-invalid-entry")
    assert "entry is str 'U8 [5] [56, 61]'" in finding.message
    assert library_rejects(path)


def test_metadata_value_not_a_string(tmp_path: Path) -> None:
    path = healthy(tmp_path)
    header, data = split(path)
    header["__metadata__"] = {"format": "pt", "step": 1200}
    rewrite(path, header, data)
    shard = scan(path)
    (finding,) = only(shard, "header-invalid-entry")
    assert finding.tensor == "__metadata__"
    assert "__metadata__['step'] is int 1200" in finding.message
    assert shard.metadata == {"format": "pt"}
    assert sorted(shard.names) == ["a", "b", "c"]
    assert library_rejects(path)


# -- the other codes ---------------------------------------------------------------------------


def test_duplicate_key(tmp_path: Path) -> None:
    path = healthy(tmp_path)
    header, data = split(path)
    raw = json.dumps(header).encode()
    entry_b = json.dumps({"b": header["b"]}).encode()[1:-1]  # '"b": {...}'
    raw = raw[:-1] + b", " + entry_b + b"}"
    rewrite(path, raw, data)
    shard = scan(path)
    (finding,) = only(shard, "header-duplicate-key")
    assert finding.severity == "warning"
    assert finding.tensor == "b" and "'b' appears twice" in finding.message
    assert sorted(shard.names) == ["a", "b", "c"]
    # The reference reader keeps an identical duplicate: a warning, not an error.
    assert not library_rejects(path)


def test_unknown_dtype(tmp_path: Path) -> None:
    path = healthy(tmp_path)
    header, data = split(path)
    header["c"]["dtype"] = "U7"
    rewrite(path, header, data)
    (finding,) = only(scan(path), "unknown-dtype")
    assert finding.tensor == "c" and "'U7'" in finding.message and "F8_E4M3" in finding.message
    assert library_rejects(path)


def test_size_mismatch(tmp_path: Path) -> None:
    path = healthy(tmp_path)
    header, data = split(path)
    header["a"]["shape"] = [2, 4]  # 32 bytes of F32, but the offsets span 24
    rewrite(path, header, data)
    (finding,) = only(scan(path), "size-mismatch")
    assert finding.tensor == "a"
    assert "span 24 bytes" in finding.message and "F32 [2, 4] needs 32" in finding.message
    assert library_rejects(path)


def _shift(header: dict, names: list[str], by: int) -> None:
    for name in names:
        begin, end = header[name]["data_offsets"]
        header[name]["data_offsets"] = [begin + by, end + by]


def _by_offset(header: dict) -> list[str]:
    names = [k for k in header if k != "__metadata__"]
    return sorted(names, key=lambda k: header[k]["data_offsets"][0])


def test_offsets_leave_a_gap(tmp_path: Path) -> None:
    path = healthy(tmp_path)
    header, data = split(path)
    first, second, third = _by_offset(header)
    cut = header[second]["data_offsets"][0]
    _shift(header, [second, third], 8)
    rewrite(path, header, data[:cut] + b"\0" * 8 + data[cut:])  # the length stays consistent
    (finding,) = only(scan(path), "offset-invalid")
    assert finding.tensor == second
    assert "gap of 8 unused bytes" in finding.message and repr(first) in finding.message
    assert library_rejects(path)


def test_offsets_overlap(tmp_path: Path) -> None:
    path = healthy(tmp_path)
    header, data = split(path)
    first, second, third = _by_offset(header)
    _shift(header, [second, third], -4)
    rewrite(path, header, data[:-4])
    (finding,) = only(scan(path), "offset-invalid")
    assert finding.tensor == second
    assert f"start 4 bytes inside tensor {first!r}" in finding.message
    assert library_rejects(path)


def test_two_names_on_the_same_bytes(tmp_path: Path) -> None:
    path = tmp_path / NAME
    save_file({"x": np.ones(4, dtype=np.float32), "y": np.zeros(4, dtype=np.float32)}, str(path))
    header, data = split(path)
    header["y"]["data_offsets"] = list(header["x"]["data_offsets"])
    rewrite(path, header, data[:16])
    (finding,) = only(scan(path), "offset-invalid")
    other = ({"x", "y"} - {finding.tensor}).pop()
    assert f"same bytes as tensor {other!r}" in finding.message
    assert library_rejects(path)


def test_offsets_run_past_the_data_section(tmp_path: Path) -> None:
    path = tmp_path / NAME
    save_file({"x": np.ones(4, dtype=np.float32), "y": np.zeros(4, dtype=np.float32)}, str(path))
    header, data = split(path)
    header["y"]["data_offsets"] = [48, 64]  # the data section is 32 bytes
    rewrite(path, header, data)
    (finding,) = only(scan(path), "offset-invalid")
    assert finding.tensor == "y"
    assert (
        "[48, 64]" in finding.message
        and "past the end of the 32-byte data section" in finding.message
    )
    assert library_rejects(path)


def test_file_truncated(tmp_path: Path) -> None:
    path = healthy(tmp_path)
    size = path.stat().st_size
    os.truncate(path, size - 5)
    (finding,) = only(scan(path), "file-truncated")
    assert f"needs {size:,}" in finding.message and "5 bytes missing" in finding.message
    assert finding.tensor is None
    assert library_rejects(path)


def test_trailing_bytes(tmp_path: Path) -> None:
    path = healthy(tmp_path)
    size = path.stat().st_size
    with open(path, "ab") as fh:
        fh.write(b"garbage")
    (finding,) = only(scan(path), "trailing-bytes")
    assert finding.severity == "warning"
    assert f"{size + 7:,} bytes, 7 more" in finding.message
    assert library_rejects(path)


# -- limits and consistency -----------------------------------------------------------------


def test_findings_per_code_are_capped(tmp_path: Path) -> None:
    path = tmp_path / NAME
    save_file({f"t{i:03d}": np.zeros(2, dtype=np.uint8) for i in range(60)}, str(path))
    header, data = split(path)
    for i in range(60):
        header[f"t{i:03d}"]["dtype"] = "Q8"
    rewrite(path, header, data)
    found = only(scan(path), "unknown-dtype")
    # The project's one fold policy: FOLD.per_file listed, the rest in one summary.
    assert len(found) == FOLD.per_file + 1
    assert f"{60 - FOLD.per_file} more unknown-dtype findings" in found[-1].message


def test_hostile_shape_with_many_huge_dims_is_fast(tmp_path: Path) -> None:
    path = tmp_path / NAME
    save_file({"t": np.zeros(2, dtype=np.uint8)}, str(path))
    header, data = split(path)
    header["t"]["shape"] = [2**64 - 1] * 20_000  # prod is a 1.28M-bit number if computed fully
    rewrite(path, header, data)
    (finding,) = only(scan(path), "size-mismatch")
    assert finding.tensor == "t" and "18446744073709551615, ..." in finding.message


def test_parse_header_bytes_is_pure_and_matches_read_shard(tmp_path: Path) -> None:
    path = healthy(tmp_path)
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    parsed = parse_header_bytes(raw[8 : 8 + n], file=NAME, file_size=len(raw))
    assert parsed == scan(path)
    with LocalFile(path) as reader:
        assert read_header(reader, file=NAME) == parsed


# -- what orjson forgives and the reference reader refuses ---------------------------------
# Before, each of these read as a healthy header (no finding, or only a warning) on both
# paths, while the safetensors library refuses the whole file.


def _edited(tmp_path: Path, old: bytes, new: bytes) -> tuple[Path, bytes]:
    """The healthy file with one byte edit in its header (`old` must occur once)."""
    path = healthy(tmp_path)
    header, data = split(path)
    raw = json.dumps(header, separators=(",", ":")).encode()
    assert raw.count(old) == 1
    raw = raw.replace(old, new)
    rewrite(path, raw, data)
    return path, raw


@pytest.mark.parametrize(
    ("old", "new", "field"),
    [
        (b'"data_offsets":[0,32]', b'"data_offsets":[-0,32]', "data_offsets"),
        (b'"shape":[2,3]', b'"shape":[2, -0]', "shape"),
    ],
)
def test_minus_zero_in_an_array(tmp_path: Path, old: bytes, new: bytes, field: str) -> None:
    """serde_json reads `-0` as the float -0.0, which a shape or offset refuses; orjson and
    msgspec read the int 0, so the typed path must not take the header."""
    path, raw = _edited(tmp_path, old, new)
    assert safetensors_format._typed_columns(raw) is None
    shard = scan(path)
    (finding,) = [f for f in shard.findings if f.code == "header-invalid-entry"]
    assert f"-0 in its {field}" in finding.message
    assert finding.tensor == ("b" if field == "data_offsets" else "a")
    if field == "data_offsets":  # the same sizes: nothing else is wrong
        assert codes(shard) == {"header-invalid-entry"}
    assert library_rejects(path)


def test_metadata_twice(tmp_path: Path) -> None:
    path, _ = _edited(tmp_path, b'"__metadata__":{"format":"pt"},', b'"__metadata__":{},')
    header, data = split(path)
    raw = json.dumps(header, separators=(",", ":")).encode()[:-1] + b',"__metadata__":{}}'
    rewrite(path, raw, data)
    (finding,) = only(scan(path), "header-invalid-entry")
    assert finding.tensor == "__metadata__" and "appears twice" in finding.message
    assert library_rejects(path)


def test_field_twice_in_an_entry(tmp_path: Path) -> None:
    path, _ = _edited(tmp_path, b'"dtype":"U8",', b'"dtype":"U8","dtype":"U8",')
    (finding,) = only(scan(path), "header-invalid-entry")
    assert finding.tensor == "c" and "has dtype twice" in finding.message
    assert library_rejects(path)


def test_repeated_name_whose_earlier_value_is_not_an_entry(tmp_path: Path) -> None:
    """Every value is deserialized, even one a later entry of the same name replaces."""
    path, _ = _edited(tmp_path, b'"b":{', b'"b":5,"b":{')
    (finding,) = only(scan(path), "header-invalid-entry")
    assert finding.tensor == "b" and "earlier one is not a tensor entry" in finding.message
    assert library_rejects(path)


def test_hints_inside_strings_are_no_finding(tmp_path: Path) -> None:
    """A `-0` after a comma or a colon inside a name or metadata only takes the slow path."""
    path = tmp_path / NAME
    tensors = {"x,-0": np.zeros(2, np.float32), "y:[-0]": np.zeros(1, np.uint8)}
    save_file(tensors, str(path), metadata={"k:,-0": "v:[-0"})
    shard = scan(path)
    assert not shard.findings and sorted(shard.names) == ["x,-0", "y:[-0]"]
    assert shard.metadata == {"k:,-0": "v:[-0"}
    assert not library_rejects(path)


def test_strict_pass_skipped_for_colons_inside_strings(tmp_path: Path) -> None:
    """Escaped quotes (a JSON config kept in the metadata) send a header to the general path;
    the colons in its strings and names are accounted for, so the costly strict pass (stdlib
    json over the whole header) does not run for a header with nothing wrong."""
    path = tmp_path / NAME
    config = json.dumps({"hidden": 8, "act": "a:b"})
    save_file({"w:0": np.zeros(2, np.float32)}, str(path), metadata={"config": config})
    with mock.patch.object(safetensors_format, "_report_strict") as strict:
        shard = scan(path)
    assert not strict.called and not shard.findings
    assert shard.metadata == {"config": config}


def test_escaped_colon_does_not_hide_a_key_given_twice(tmp_path: Path) -> None:
    """`\\u003a` is a colon in the decoded name but not in the raw bytes: it made up for the
    colon of a second `__metadata__`, and the colon count saw nothing wrong."""
    path, raw = _edited(tmp_path, b'"__metadata__":{"format":"pt"},', b'"__metadata__":{},')
    raw = raw.replace(b'"b":', b'"b\\u003a":')[:-1] + b',"__metadata__":{}}'
    rewrite(path, raw, split(path)[1])
    (finding,) = only(scan(path), "header-invalid-entry")
    assert finding.tensor == "__metadata__" and "appears twice" in finding.message
    assert library_rejects(path)
