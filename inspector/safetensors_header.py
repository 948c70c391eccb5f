"""Read and validate one safetensors header without touching the tensor data.

Layout (FORMATS.md section 1): 8-byte little-endian header length N, N bytes of JSON, data.
Every rule the reference reader enforces becomes a finding here instead of an exception, and
a hostile file can make us read at most `8 + cap` bytes.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from inspector.dtypes import DTYPE_BITS
from inspector.findings import Finding, make_finding
from inspector.storage import LocalFile, RangeReader

__all__ = ["DEFAULT_HEADER_CAP", "ShardHeader", "parse_header_bytes", "read_header", "read_shard"]

DEFAULT_HEADER_CAP = 100_000_000
# Per file and code, after this many findings the rest are folded into one summary finding,
# so a hostile header cannot turn into millions of findings.
_MAX_PER_CODE = 25
_DUP_MARKER = b'"data_offsets"'


@dataclass(frozen=True, slots=True)
class ShardHeader:
    """What one safetensors header says, as parallel columns (fast to build tables from).

    Only entries that are well formed enough to locate are in the columns; the others are
    findings. `header_len` is None when the header could not be read at all.
    """

    file: str
    file_size: int
    header_len: int | None
    metadata: dict[str, str] | None
    names: list[str] = field(default_factory=list)
    dtypes: list[str] = field(default_factory=list)
    shapes: list[tuple[int, ...]] = field(default_factory=list)
    begins: list[int] = field(default_factory=list)
    ends: list[int] = field(default_factory=list)
    findings: tuple[Finding, ...] = ()

    @property
    def readable(self) -> bool:
        return self.header_len is not None

    @property
    def data_start(self) -> int:
        return 8 + (self.header_len or 0)

    @property
    def tensor_bytes(self) -> int:
        return sum(e - b for b, e in zip(self.begins, self.ends, strict=True))


def read_shard(path: Path, *, root: Path, cap: int = DEFAULT_HEADER_CAP) -> ShardHeader:
    """Open a local file and read its header; an unopenable file is a finding, not a crash."""
    rel = _relative(path, root)
    try:
        with LocalFile(path) as reader:
            return read_header(reader, file=rel, cap=cap)
    except OSError as exc:
        msg = f"{rel}: cannot be opened ({exc.strerror or exc}); check permissions and the path"
        return ShardHeader(rel, 0, None, None, findings=(make_finding("header-unreadable", msg, file=rel),))


def read_header(reader: RangeReader, *, file: str, cap: int = DEFAULT_HEADER_CAP) -> ShardHeader:
    """Read the length prefix and header through `reader` and validate them."""
    size = reader.size()
    if size < 8:
        msg = f"{file}: file is {size} bytes, shorter than the 8-byte header length prefix"
        return _unreadable(file, size, msg)
    (header_len,) = struct.unpack("<Q", reader.read_range(0, 8))
    if header_len > cap:
        msg = (
            f"{file}: header length {header_len:,} bytes is over the limit of {cap:,}; "
            "if the file is trusted, raise the header cap (--header-cap)"
        )
        return _unreadable(file, size, msg)
    if 8 + header_len > size:
        msg = (
            f"{file}: header length {header_len:,} runs past the end of the {size:,}-byte "
            "file; the file is truncated or not safetensors"
        )
        return _unreadable(file, size, msg)
    raw = reader.read_range(8, header_len)
    return parse_header_bytes(raw, file=file, file_size=size)


def parse_header_bytes(raw: bytes, *, file: str, file_size: int) -> ShardHeader:
    """Validate header bytes (already read) against the file size. Pure."""
    header, problem = _decode(raw, file)
    if problem is not None:
        return _unreadable(file, file_size, problem)
    out = _Collector(file)
    metadata = _metadata(header.pop("__metadata__", None), out)
    if raw.count(_DUP_MARKER) > len(header):
        _report_duplicates(raw, out)
    names, dtypes, shapes, begins, ends = _entries(header, out)
    _check_tiling(names, begins, ends, out)
    _check_length(file_size, len(raw), ends, out)
    return ShardHeader(
        file, file_size, len(raw), metadata, names, dtypes, shapes, begins, ends, out.done()
    )


# -- steps ---------------------------------------------------------------------------------


def _decode(raw: bytes, file: str) -> tuple[dict, str | None]:
    if not raw.startswith(b"{"):
        head = raw[:16]
        return {}, f"{file}: header does not start with '{{' (starts with {head!r}); not safetensors"
    try:
        header = orjson.loads(raw.rstrip(b" "))
    except orjson.JSONDecodeError as exc:
        return {}, f"{file}: header is not valid UTF-8 JSON ({exc}); the file is damaged"
    if not isinstance(header, dict):
        return {}, f"{file}: header is JSON but not an object; not safetensors"
    return header, None


def _metadata(value: object, out: _Collector) -> dict[str, str] | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        out.add("header-invalid-entry", f"__metadata__ is {type(value).__name__}, expected an object of strings")
        return None
    for key, val in value.items():
        if not isinstance(val, str):
            out.add(
                "header-invalid-entry",
                f"__metadata__[{key!r}] is {type(val).__name__} {_short(val)}, expected a string",
            )
    return {k: v for k, v in value.items() if isinstance(v, str)}


def _entries(header: dict, out: _Collector):
    names: list[str] = []
    dtypes: list[str] = []
    shapes: list[tuple[int, ...]] = []
    begins: list[int] = []
    ends: list[int] = []
    bits_of = DTYPE_BITS.get
    for name, entry in header.items():
        try:
            dtype = entry["dtype"]
            shape = tuple(entry["shape"])
            begin, end = entry["data_offsets"]
        except (TypeError, KeyError, ValueError):
            out.add("header-invalid-entry", _entry_problem(entry), tensor=name)
            continue
        if not (
            type(dtype) is str
            and all(type(d) is int and d >= 0 for d in shape)
            and type(begin) is int
            and type(end) is int
            and 0 <= begin <= end
        ):
            out.add("header-invalid-entry", _entry_problem(entry), tensor=name)
            continue
        bits = bits_of(dtype)
        if bits is None:
            out.add(
                "unknown-dtype",
                f"tensor {name!r} has dtype {dtype!r}, not a safetensors dtype "
                f"(expected one of {', '.join(DTYPE_BITS)})",
                tensor=name,
            )
        else:
            total_bits = math.prod(shape) * bits
            if total_bits % 8 or total_bits // 8 != end - begin:
                out.add("size-mismatch", _size_problem(name, dtype, shape, begin, end, total_bits), tensor=name)
        names.append(name)
        dtypes.append(dtype)
        shapes.append(shape)
        begins.append(begin)
        ends.append(end)
    return names, dtypes, shapes, begins, ends


def _check_tiling(names: list[str], begins: list[int], ends: list[int], out: _Collector) -> None:
    """Offsets must tile [0, last end) exactly: no gap, no overlap, no shared bytes."""
    expected = 0
    for begin, end, i in sorted(zip(begins, ends, range(len(names)), strict=True)):
        if begin != expected:
            kind = "gap" if begin > expected else "overlap"
            what = (
                f"{begin - expected:,} unused bytes before it"
                if kind == "gap"
                else f"starts {expected - begin:,} bytes inside the previous tensor"
            )
            out.add(
                "offset-invalid",
                f"tensor {names[i]!r} data_offsets [{begin}, {end}] leave a {kind}: {what} "
                f"(expected it to start at {expected})",
                tensor=names[i],
            )
        expected = max(expected, end)


def _check_length(file_size: int, header_len: int, ends: list[int], out: _Collector) -> None:
    expected = 8 + header_len + (max(ends) if ends else 0)
    if file_size < expected:
        out.add(
            "file-truncated",
            f"file is {file_size:,} bytes but its header needs {expected:,} "
            f"({expected - file_size:,} bytes missing); the write was cut short, re-export it",
        )
    elif file_size > expected:
        out.add(
            "trailing-bytes",
            f"file is {file_size:,} bytes, {file_size - expected:,} more than its header "
            f"describes ({expected:,}); loaders reject the file",
        )


def _report_duplicates(raw: bytes, out: _Collector) -> None:
    """Slow path, only taken when the marker count says a key may repeat."""
    seen: set[str] = set()

    def hook(pairs: list[tuple[str, object]]) -> dict:
        for key, _ in pairs:
            if isinstance(_, dict) and "data_offsets" in _:
                if key in seen:
                    out.add(
                        "header-duplicate-key",
                        f"tensor {key!r} appears twice in the header; only the last entry is "
                        "used by readers",
                        tensor=key,
                    )
                seen.add(key)
        return dict(pairs)

    try:
        json.loads(raw.decode("utf-8"), object_pairs_hook=hook)
    except ValueError:
        return


# -- helpers -------------------------------------------------------------------------------


class _Collector:
    """Findings of one file, capped per code."""

    def __init__(self, file: str) -> None:
        self.file = file
        self.items: list[Finding] = []
        self.counts: dict[str, int] = {}

    def add(self, code: str, message: str, *, tensor: str | None = None) -> None:
        n = self.counts.get(code, 0) + 1
        self.counts[code] = n
        if n <= _MAX_PER_CODE:
            self.items.append(make_finding(code, f"{self.file}: {message}", file=self.file, tensor=tensor))

    def done(self) -> tuple[Finding, ...]:
        for code, n in self.counts.items():
            if n > _MAX_PER_CODE:
                more = n - _MAX_PER_CODE
                self.items.append(
                    make_finding(code, f"{self.file}: {more:,} more {code} problems not listed", file=self.file)
                )
        return tuple(self.items)


def _unreadable(file: str, size: int, message: str) -> ShardHeader:
    return ShardHeader(file, size, None, None, findings=(make_finding("header-unreadable", message, file=file),))


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
        problems.append(f"data_offsets {_short(offsets)} (expected [begin, end] with 0 <= begin <= end)")
    return "entry has " + "; ".join(problems or ["an unexpected form"])


def _size_problem(name: str, dtype: str, shape: tuple[int, ...], begin: int, end: int, bits: int) -> str:
    want = f"{bits // 8:,}" if bits % 8 == 0 else f"{bits / 8} (not a whole number of bytes)"
    return (
        f"tensor {name!r} spans {end - begin:,} bytes but {dtype} {list(shape)} needs {want}"
    )


def _short(value: object, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _relative(path: Path, root: Path) -> str:
    try:
        return path.relative_to(root).as_posix()
    except ValueError:
        return path.name
