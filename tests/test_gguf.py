"""GGUF headers read by our bounded parser: the golden fixtures (gguf's GGUFWriter) read
exactly as the manifest records them, files llama.cpp refuses end in their finding (written
by GGUFWriter, edited where it would not write them), and values that are not kept cost no
object each."""

from __future__ import annotations

import json
import struct
import tempfile
import tracemalloc
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from unittest import mock

import gguf
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_header_fuzz import CountingReader

from inspector._internal.checkpoint.scan import scan
from inspector._internal.checks import check
from inspector._internal.cli.main import main
from inspector._internal.findings.finding import Finding
from inspector._internal.formats import gguf_header
from inspector._internal.formats.gguf_header import ArrayInfo, TextInfo, read_gguf
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
        (_gguf(n_kv=1, kv=_string(b"k") + struct.pack("<IIQ", 9, 4, 1 << 29)), "longer than"),
        (_gguf(n_kv=1, kv=_string(b"k") + struct.pack("<IIQ", 9, 4, 1 << 40)), "llama.cpp's limit"),
        (_gguf(n_kv=1, kv=_string(b"k") + struct.pack("<IIQ", 9, 8, 1 << 29)), "longer than"),
        (_gguf(n_kv=1, kv=_string(b"k") + struct.pack("<IQ", 8, 1000)), "past the end"),
        (
            _gguf(
                n_kv=1,
                kv=_string(b"k") + struct.pack("<IIQ", 9, 9, 1) + struct.pack("<IQ", 9, 1) * 8,
            ),
            "array of arrays",
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


# -- files llama.cpp refuses, written by gguf's GGUFWriter and edited where it would not -----
#
# The rules are those of `gguf_init_from_file_impl` (llama.cpp, ggml/src/gguf.cpp); each
# hostile file must end in its finding, never in an internal error (exit 2) or "no findings".


def _written(
    folder: Path,
    *,
    kv: Sequence[tuple[str, str, Any]] = (),
    tensors: Sequence[tuple[str, np.ndarray]] | None = None,
) -> Path:
    """`folder/m.gguf` as GGUFWriter writes it: `kv` as (writer method, key, value) calls,
    then `tensors` (two small F32 tensors by default)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "m.gguf"
    writer = gguf.GGUFWriter(path, "llama")
    for method, key, value in kv:
        getattr(writer, method)(key, value)
    if tensors is None:
        tensors = [
            ("a.weight", np.ones((2, 32), np.float32)),
            ("b.weight", np.ones(32, np.float32)),
        ]
    for name, array in tensors:
        writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _edit(path: Path, old: bytes, new: bytes) -> None:
    """Replace the one occurrence of `old` in the file by `new` (same length: the layout
    stays as the writer made it)."""
    data = path.read_bytes()
    assert data.count(old) == 1 and len(old) == len(new)
    path.write_bytes(data.replace(old, new))


def _patch(path: Path, after: bytes, skip: int, fmt: str, *values: int) -> None:
    """Overwrite, `skip` bytes after the end of `after` (a name the writer wrote), the values
    packed as `fmt` (little-endian)."""
    data = bytearray(path.read_bytes())
    at = data.index(after) + len(after) + skip
    struct.pack_into("<" + fmt, data, at, *values)
    path.write_bytes(bytes(data))


def _findings(folder: Path) -> list[Finding]:
    """`check` of the folder, through the CLI too: findings (exit 1), not an internal error."""
    assert main(["check", str(folder), "--fail-on", "error"]) == 1
    assert main(["scan", str(folder)]) in (0, 1)
    return check(scan(folder), model=False)


def _only(findings: list[Finding], code: str, *words: str) -> Finding:
    assert [f.code for f in findings] == [code], [(f.code, f.message) for f in findings]
    for word in words:
        assert word in findings[0].message, findings[0].message
    return findings[0]


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("method", "value", "words"),
    [
        # issue 31, item 6: 2**63 ended scan and check in "cannot safely cast uint64 to int64"
        ("add_uint64", 1 << 63, ("UINT64", "requires a UINT32")),
        ("add_uint32", 13, ("alignment 13", "not a power of two")),
        ("add_uint32", 0, ("alignment 0", "not a power of two")),
        # a valid value in the wrong type was silently replaced by 32
        ("add_int32", 32, ("INT32", "requires a UINT32")),
        ("add_uint64", 32, ("UINT64", "requires a UINT32")),
        ("add_string", "32", ("STRING", "requires a UINT32")),
    ],
)
def test_alignment_llama_cpp_refuses(
    tmp_path: Path, method: str, value: object, words: tuple[str, ...]
) -> None:
    _written(tmp_path, kv=[(method, "general.alignment", value)])
    _only(_findings(tmp_path), "gguf-unreadable", "general.alignment", *words)


def test_custom_alignment_is_read(tmp_path: Path) -> None:
    """GGUFWriter's own `add_custom_alignment` (a UINT32 power of two) is healthy."""
    path = tmp_path / "m.gguf"
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_custom_alignment(64)
    writer.add_tensor("a.weight", np.ones(40, np.float32))
    writer.add_tensor("b.weight", np.ones(40, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    header = read_gguf(CountingReader(path.read_bytes()))
    assert (header.alignment, header.data_offset % 64, [t.offset for t in header.tensors]) == (
        64,
        0,
        [0, 192],
    )
    assert check(scan(tmp_path), model=False) == []


@pytest.mark.timeout(60)
def test_duplicate_metadata_key(tmp_path: Path) -> None:
    path = _written(tmp_path, kv=[("add_uint32", "x.aaaa", 1), ("add_uint32", "x.bbbb", 2)])
    _edit(path, b"x.bbbb", b"x.aaaa")  # GGUFWriter overwrites a key given twice
    _only(_findings(tmp_path), "gguf-unreadable", "'x.aaaa' twice")


@pytest.mark.timeout(60)
def test_duplicate_tensor_name(tmp_path: Path) -> None:
    path = _written(tmp_path)
    _edit(path, b"b.weight", b"a.weight")  # GGUFWriter refuses a name given twice
    found = _only(_findings(tmp_path), "duplicate-tensor", "infos 0 and 1", "'a.weight'")
    assert (found.file, found.tensor) == ("m.gguf", "a.weight")
    shard = scan(tmp_path).shards[0]
    assert shard.names == ("a.weight",) and shard.tensor_count == 2


@pytest.mark.parametrize(
    ("names", "edits", "twice"),
    [
        (("a.x", "a.y"), [(b"a.x", b"a\0x"), (b"a.y", b"a\0y")], True),
        (("a", "abc"), [(b"abc", b"a\0c")], True),
        (("a.x", "a.y"), [(b"a.x", b"a.\xff"), (b"a.y", b"a.\xfe")], False),
    ],
    ids=["after-a-nul", "a-nul-against-none", "not-utf8-but-distinct"],
)
def test_duplicate_tensor_name_is_compared_as_ggml_does(
    tmp_path: Path, names: tuple[str, str], edits: list[tuple[bytes, bytes]], twice: bool
) -> None:
    """ggml keeps a name as a C string: 'a\\0x' and 'a\\0y' are one tensor to llama.cpp, and
    so are 'a' and 'a\\0c'; two names whose bytes differ are two, even when neither is
    UTF-8 and both are shown alike."""
    path = _written(tmp_path, tensors=[(n, np.ones(32, np.float32)) for n in names])
    for old, new in edits:
        _edit(path, old, new)
    codes = [f.code for f in check(scan(tmp_path), model=False)]
    assert codes == (["duplicate-tensor"] if twice else [])


@pytest.mark.timeout(60)
def test_five_dimensions(tmp_path: Path) -> None:
    _written(tmp_path, tensors=[("a.weight", np.ones((1, 1, 1, 2, 32), np.float32))])
    _only(_findings(tmp_path), "gguf-unreadable", "5 dimensions", "GGML_MAX_DIMS")


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("kv", "tensors", "words"),
    [
        ([("add_uint32", "", 1)], None, ("empty metadata key",)),
        ([("add_array", "x.nested", [[1, 2], [3]])], None, ("array of arrays", "x.nested")),
        ([], [("n" * 64, np.ones(32, np.float32))], ("64 bytes", "GGML_MAX_NAME")),
    ],
)
def test_header_rules_of_llama_cpp(
    tmp_path: Path, kv: list[tuple[str, str, Any]], tensors: Any, words: tuple[str, ...]
) -> None:
    """What GGUFWriter writes but llama.cpp's reader refuses."""
    _written(tmp_path, kv=kv, tensors=tensors)
    _only(_findings(tmp_path), "gguf-unreadable", *words)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("ne", "words"),
    [
        ((32, 1 << 63), "negative"),  # a uint64 llama.cpp reads as an int64
        ((1 << 32, 1 << 31), "more elements than an int64"),  # 2**63: not below INT64_MAX
        ((32, 1 << 40, 1 << 40), "more elements than an int64"),
    ],
)
def test_shapes_llama_cpp_refuses(tmp_path: Path, ne: tuple[int, ...], words: str) -> None:
    path = _written(
        tmp_path, tensors=[("a.weight", np.ones((1,) * (len(ne) - 1) + (32,), np.float32))]
    )
    _patch(path, b"a.weight", 4, f"{len(ne)}Q", *ne)
    _only(_findings(tmp_path), "gguf-unreadable", "'a.weight'", words)


def test_byte_size_past_size_max(tmp_path: Path) -> None:
    """2**62 - 1 F64 values: an element count ggml accepts, 2**65 bytes it cannot."""
    path = _written(tmp_path, tensors=[("a.weight", np.ones(32, np.float64))])
    _patch(path, b"a.weight", 4, "Q", (1 << 62) - 1)
    _only(_findings(tmp_path), "gguf-unreadable", "F64", "bytes; llama.cpp refuses")


def test_zero_elements_and_no_dimension_are_healthy(tmp_path: Path) -> None:
    """A dimension of 0 and a tensor of no dimension are what llama.cpp reads (a scalar is
    one value; an empty tensor takes no byte and the next one starts at the same offset)."""
    _written(
        tmp_path,
        tensors=[
            ("a.weight", np.ones((0, 32), np.float32)),
            ("b.weight", np.float32(3).reshape(())),
            ("c.weight", np.ones(8, np.float32)),
        ],
    )
    assert check(scan(tmp_path), model=False) == []
    shard = scan(tmp_path).shards[0]
    assert shard.shapes == [(0, 32), (), (8,)]
    assert list(shard.begins) == [0, 0, 32] and list(shard.ends) == [0, 4, 64]


@pytest.mark.parametrize(
    ("offset", "words"),
    [
        (160, "at 160, expected 256"),  # overlaps a.weight
        (288, "at 288, expected 256"),  # a gap
        (257, "at 257, expected 256"),  # off the alignment
        ((1 << 64) - 1, "expected 256"),  # past anything an int64 column holds
    ],
)
def test_offsets_other_than_the_packed_layout(tmp_path: Path, offset: int, words: str) -> None:
    path = _written(tmp_path)  # a.weight is 256 bytes at 0, b.weight 128 at 256
    _patch(path, b"b.weight", 4 + 8 + 4, "Q", offset)
    codes = [f.code for f in check(scan(tmp_path), model=False)]
    assert "offset-invalid" in codes and set(codes) <= {"offset-invalid", "file-truncated"}
    (found,) = [f for f in check(scan(tmp_path), model=False) if f.code == "offset-invalid"]
    assert words in found.message and "'b.weight'" in found.message


def test_data_section_past_the_end(tmp_path: Path) -> None:
    """A file cut inside the padding before its data section: llama.cpp cannot seek to it."""
    path = _written(tmp_path)
    header = read_gguf(CountingReader(path.read_bytes()))
    path.write_bytes(path.read_bytes()[: header.data_offset - 1])
    _only(check(scan(tmp_path), model=False), "file-truncated", "2 tensors run past the end")


# -- issue 31, item 9: values that are not kept cost no object each ---------------------------


def _peak_bytes(data: bytes) -> tuple[int, Any]:
    """Peak Python memory allocated while reading the header, and the header."""
    tracemalloc.start()
    try:
        header = read_gguf(CountingReader(data))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return peak, header


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "tokens",
    [
        ["ab"] * 200_000,  # one length: the numpy path
        ["a", "bc", ""] * 70_000,  # lengths that never repeat twice in a row: one by one
    ],
    ids=["one-length", "mixed-lengths"],
)
def test_many_tiny_strings_are_not_built(tmp_path: Path, tokens: list[str]) -> None:
    """A token list of 200,000 tiny strings is walked, not built: the peak of the read is the
    read blocks (about 1 MiB), not the ~12 MB the strings take as Python objects (before:
    16.9 s and 264 MB for 2,000,000)."""
    path = _written(
        tmp_path,
        kv=[
            ("add_array", "tokenizer.ggml.tokens", tokens),
            ("add_array", "tokenizer.ggml.scores", [0.5] * len(tokens)),
            ("add_uint32", "x.after", 7),  # read at the right byte after the walks
        ],
    )
    data = path.read_bytes()
    peak, header = _peak_bytes(data)
    assert peak < 3 << 20, f"{peak:,} bytes at the peak for a {len(data):,}-byte file"
    assert header.kv["tokenizer.ggml.tokens"] == ArrayInfo("STRING", len(tokens))
    assert header.kv["tokenizer.ggml.scores"] == ArrayInfo("FLOAT32", len(tokens))
    assert header.kv["x.after"] == 7 and [t.name for t in header.tensors] == [
        "a.weight",
        "b.weight",
    ]


_TOKEN = st.sampled_from(["", "a", "ab", "abc", "\u00e9t\u00e9", "a b"])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    runs=st.lists(st.tuples(_TOKEN, st.integers(1, 40)), min_size=1, max_size=30),
    ints=st.lists(st.integers(-(2**31), 2**31 - 1), max_size=40),
    block=st.sampled_from([24, 64, 1 << 20]),
)
def test_arrays_round_trip(runs: list[tuple[str, int]], ints: list[int], block: int) -> None:
    """Whatever runs of string lengths GGUFWriter writes, the walk ends where the writer's
    next value begins: kept arrays equal, long ones counted, the tensors after them exact;
    also when the reader's blocks are a few bytes, so values straddle them everywhere."""
    tokens = [token for token, times in runs for _ in range(times)]
    with tempfile.TemporaryDirectory() as tmp:
        path = _written(
            Path(tmp),
            kv=[
                ("add_array", "x.tokens", tokens),
                ("add_array", "x.ints", ints) if ints else ("add_uint32", "x.ints", 0),
                ("add_string", "x.after", "end"),
            ],
        )
        with mock.patch.object(gguf_header, "_BLOCK", block):
            header = read_gguf(CountingReader(path.read_bytes()))
    kept = header.kv["x.tokens"]
    assert kept == (tokens if len(tokens) <= 16 else ArrayInfo("STRING", len(tokens)))
    if ints:
        assert header.kv["x.ints"] == (ints if len(ints) <= 16 else ArrayInfo("INT32", len(ints)))
    assert header.kv["x.after"] == "end"
    assert [(t.name, t.ne, t.offset) for t in header.tensors] == [
        ("a.weight", (32, 2), 0),
        ("b.weight", (32,), 256),
    ]


def test_long_strings_are_not_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A string value past `KEEP_STRING` is its length, its bytes never read; past
    `KEEP_TEXT` in all, no more text is kept (a 480 MB header of eight 60 MB strings took
    650 MB to check)."""
    path = _written(
        tmp_path,
        kv=[
            ("add_string", "x.long", "a" * (4 << 20)),
            ("add_string", "x.short", "kept"),
            ("add_array", "x.few", ["b" * 40, "c" * 40]),
            ("add_string", "x.over", "d" * 40),
        ],
    )
    monkeypatch.setattr(gguf_header, "KEEP_TEXT", 100)
    reader = CountingReader(path.read_bytes())
    header = read_gguf(reader)
    assert reader.bytes_read < 2 << 20
    assert header.kv["x.long"] == TextInfo(4 << 20) and header.kv["x.short"] == "kept"
    assert header.kv["x.few"] == ["b" * 40, "c" * 40] and header.kv["x.over"] == TextInfo(40)
    assert check(scan(tmp_path), model=False) == []
