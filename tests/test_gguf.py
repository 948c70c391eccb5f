"""GGUF headers read by our bounded parser: the golden fixtures (gguf's GGUFWriter) read
exactly as the manifest records them, and hostile headers end in one finding."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
from test_header_fuzz import CountingReader

from inspector._internal.checkpoint.scan import scan
from inspector._internal.checks import check
from inspector._internal.formats.gguf_header import ArrayInfo, read_gguf
from inspector._internal.formats.gguf_shard import read_gguf_columns

GOLDEN = Path(__file__).resolve().parent / "fixtures" / "writers"
MANIFEST = json.loads((GOLDEN / "MANIFEST.json").read_text())
INTACT = [
    (c, f) for c, e in MANIFEST.items() if e.get("format") == "gguf" for f in e.get("files", {})
]


@pytest.mark.parametrize(("case", "file"), INTACT)
def test_header_is_what_the_writer_wrote(case: str, file: str) -> None:
    expected = MANIFEST[case]["files"][file]
    header = read_gguf(CountingReader((GOLDEN / case / file).read_bytes()))
    assert (header.version, len(header.kv), header.alignment, header.data_offset) == (
        expected["version"],
        expected["kv_count"],
        expected["alignment"],
        expected["data_offset"],
    )
    got = [
        {
            "name": t.name,
            "ggml_type": t.type_name,
            "ne": list(t.ne),
            "offset": t.offset,
            "n_elements": t.n_elements,
            "n_bytes": t.n_bytes,
        }
        for t in header.tensors
    ]
    assert got == expected["tensors"]
    for key, want in expected["kv"].items():
        assert header.kv_types[key] == want["type"][0]
        value = header.kv[key]
        if "length" in want:
            assert (value.length if isinstance(value, ArrayInfo) else len(value)) == want["length"]
        else:
            assert value == pytest.approx(want["value"])


def _gguf(*, n_tensors: int = 0, kv: bytes = b"", n_kv: int = 0, tail: bytes = b"") -> bytes:
    return b"GGUF" + struct.pack("<IQQ", 3, n_tensors, n_kv) + kv + tail


def _string(text: bytes) -> bytes:
    return struct.pack("<Q", len(text)) + text


@pytest.mark.parametrize(
    ("data", "words"),
    [
        (b"GGML" + bytes(20), "magic"),
        (b"GGUF" + struct.pack("<I", 1 << 16) + bytes(16), "big-endian"),
        (_gguf(n_tensors=1 << 40), "over the limits"),
        (_gguf(n_kv=1, kv=_string(b"k") + struct.pack("<I", 99)), "unknown value type"),
        (_gguf(n_kv=1, kv=struct.pack("<Q", 1 << 50)), "limit"),
        (_gguf(n_kv=1, kv=_string(b"k") + struct.pack("<IIQ", 9, 4, 1 << 40)), "longer than"),
        (
            _gguf(
                n_kv=1,
                kv=_string(b"k") + struct.pack("<IIQ", 9, 9, 1) + struct.pack("<IQ", 9, 1) * 8,
            ),
            "nests arrays",
        ),
        (_gguf(n_tensors=1, tail=_string(b"t") + struct.pack("<I", 2)), "truncated"),
    ],
)
def test_hostile_headers_are_one_finding(data: bytes, words: str) -> None:
    reader = CountingReader(data)
    shard = read_gguf_columns(reader, "x.gguf")
    assert [f.code for f in shard.findings] == ["gguf-unreadable"]
    assert words in shard.findings[0].message
    assert reader.bytes_read <= len(data)


def test_unknown_type_and_partial_block(tmp_path: Path) -> None:
    tensors = _string(b"a") + struct.pack("<IQIQ", 1, 32, 4, 0)  # type 4 (removed Q4_2)
    tensors += _string(b"b") + struct.pack("<IQIQ", 1, 16, 2, 32)  # Q4_0 of 16 values
    data = _gguf(n_tensors=2, tail=tensors)
    data += bytes(-len(data) % 32 + 64)
    (tmp_path / "m.gguf").write_bytes(data)
    codes = [f.code for f in check(scan(tmp_path), model=False)]
    assert codes == ["gguf-unknown-type"]
