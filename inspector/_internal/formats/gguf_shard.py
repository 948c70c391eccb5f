"""A GGUF file as shard columns (`GgufShard`): names, ggml type names, shapes in numpy
order (outermost first) and byte ranges relative to the data section (`data_start`), with its
metadata. Like `inspector._internal.formats.safetensors`, this reader judges while it reads: what it
cannot read is a finding of the file (gguf-unreadable, gguf-unknown-type, file-truncated,
offset-invalid, file-unsafe)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from inspector._internal.common.display import legible
from inspector._internal.findings.finding import FOLD, Finding, examples, make_finding
from inspector._internal.formats.bin_shard import open_columns
from inspector._internal.formats.gguf_header import (
    GGML_TYPES,
    GGUF_HEADER_CAP,
    ByteSource,
    GgufError,
    read_gguf,
)
from inspector._internal.formats.safetensors import ShardHeader
from inspector._internal.storage import Location

__all__ = ["GgufShard", "read_gguf_columns", "read_gguf_shard"]


class GgufShard(ShardHeader):
    """A GGUF file's tensors as shard columns; `kv` its metadata (small arrays as lists,
    long ones as `ArrayInfo`), `tensor_count` what its header declares, `alignment_stated`
    whether `general.alignment` was in it."""

    __slots__ = ("alignment_stated", "data_offset", "kv", "tensor_count")
    alignment_stated: bool
    data_offset: int
    kv: dict[str, Any]
    tensor_count: int

    @property
    def data_start(self) -> int:
        return self.data_offset


def _with(shard: ShardHeader, **values: object) -> GgufShard:
    assert isinstance(shard, GgufShard)  # from_columns builds the class it is called on
    for key, value in values.items():
        object.__setattr__(shard, key, value)
    return shard


def _empty(rel: str, size: int, finding: Finding) -> GgufShard:
    shard = GgufShard(rel, size, None, None, findings=(finding,))
    return _with(shard, kv={}, tensor_count=0, alignment_stated=False, data_offset=0)


def read_gguf_shard(path: Location, *, root: Location) -> GgufShard:
    """One GGUF file; what cannot be read is a finding, never a raise."""
    return open_columns(path, root, read_gguf_columns, _empty, "gguf-unreadable")


def read_gguf_columns(reader: ByteSource, rel: str, *, cap: int = GGUF_HEADER_CAP) -> GgufShard:
    """The shard columns of one open GGUF file (`rel` names it in findings)."""
    size = reader.size()
    shown = legible(rel)
    try:
        header = read_gguf(reader, cap=cap)
    except GgufError as exc:
        msg = f"{shown}: {exc}; expected a GGUF file as llama.cpp's gguf writer makes them"
        return _empty(rel, size, make_finding("gguf-unreadable", msg, file=rel))
    names, types, shapes, begins, ends = [], [], [], [], []
    unknown: list[str] = []
    misaligned: list[str] = []
    past_end: list[str] = []
    limit = size - header.data_offset
    for t in header.tensors:
        nbytes = t.n_bytes
        if nbytes is None:
            known = GGML_TYPES.get(t.type_id)
            why = (
                f"type id {t.type_id}, which ggml does not define"
                if known is None
                else f"{known[0]} with a first dimension of {t.ne[0]:,}, not a whole number "
                f"of {known[1]}-value blocks"
            )
            unknown.append(f"'{legible(t.name)}' ({why})")
            nbytes = 0
        if t.offset % header.alignment:
            misaligned.append(t.name)
        names.append(t.name)
        types.append(t.type_name)
        shapes.append(t.shape)
        begins.append(t.offset)
        ends.append(t.offset + nbytes)
        if t.offset + nbytes > limit:
            past_end.append(t.name)
    findings: list[Finding] = []
    if unknown:
        findings.append(
            make_finding(
                "gguf-unknown-type",
                f"{shown}: {len(unknown):,} tensors have a type llama.cpp cannot read: "
                f"{', '.join(unknown[: FOLD.per_code])}; re-convert the file",
                file=rel,
            )
        )
    if misaligned:
        findings.append(
            make_finding(
                "offset-invalid",
                f"{shown}: {len(misaligned):,} tensors start off the {header.alignment}-byte "
                f"alignment ({examples(misaligned)}); the file is corrupt: re-convert it",
                file=rel,
            )
        )
    if past_end:
        need = header.data_offset + max(ends)
        findings.append(
            make_finding(
                "file-truncated",
                f"{shown} is {size:,} bytes but its tensors need {need:,}: "
                f"{len(past_end):,} tensors run past the end ({examples(past_end, limit=8)}); "
                "an interrupted download: download the file again",
                file=rel,
            )
        )
    shard = GgufShard.from_columns(
        rel, size, header.data_offset, None, names, types, shapes, begins, ends, tuple(findings)
    )
    return _with(
        shard,
        kv=dict(header.kv),
        tensor_count=len(header.tensors),
        alignment_stated=header.alignment_stated,
        data_offset=header.data_offset,
    )


def kv_int(kv: Mapping[str, Any], key: str) -> int | None:
    """An integer metadata value, or None."""
    value = kv.get(key)
    return value if type(value) is int else None
