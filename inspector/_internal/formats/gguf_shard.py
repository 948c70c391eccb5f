"""A GGUF file as shard columns (`GgufShard`): names, ggml type names, shapes in numpy
order (outermost first) and byte ranges relative to the data section (`data_start`), with its
metadata. Like `inspector._internal.formats.safetensors`, this reader judges while it reads: what it
cannot read, or llama.cpp would refuse, is a finding of the file (gguf-unreadable,
gguf-unknown-type, duplicate-tensor, offset-invalid, file-truncated, file-unsafe)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from inspector._internal.common.display import legible
from inspector._internal.findings.finding import FOLD, Finding, examples, make_finding
from inspector._internal.formats.bin_shard import open_columns
from inspector._internal.formats.gguf_header import (
    GGML_TYPES,
    GGUF_HEADER_CAP,
    INT64_MAX,
    ByteSource,
    GgufError,
    read_gguf,
)
from inspector._internal.formats.safetensors import ShardHeader
from inspector._internal.storage import Location

__all__ = ["GgufShard", "read_gguf_columns", "read_gguf_shard"]


class GgufShard(ShardHeader):
    """A GGUF file's tensors as shard columns; `kv` its metadata (small arrays as lists,
    long ones as `ArrayInfo`, long strings as `TextInfo`), `tensor_count` what its header
    declares, `alignment_stated` whether `general.alignment` was in it."""

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
        msg = f"{shown}: {exc}; re-download the file, or re-convert it with llama.cpp's tools"
        return _empty(rel, size, make_finding("gguf-unreadable", msg, file=rel))
    names, types, shapes, begins, ends = [], [], [], [], []
    unknown: list[str] = []  # the first few, as the others are counted
    n_unknown = 0
    misplaced: list[str] = []
    n_misplaced = 0
    past_end: list[str] = []
    twice = dict(header.duplicates)
    limit = size - header.data_offset
    need = header.data_offset
    # gguf_init_from_file_impl: each tensor's data starts where the previous one's ends,
    # padded to the alignment, in the order of the tensor infos (a gap, an overlap, another
    # order or a misaligned offset are all refused); judged up to the first tensor whose size
    # is unknown
    expected: int | None = 0
    for index, t in enumerate(header.tensors):
        nbytes = t.n_bytes
        if nbytes is None:
            known = GGML_TYPES.get(t.type_id)
            why = (
                f"type id {t.type_id}, which ggml does not define"
                if known is None
                else f"{known[0]} with a first dimension of {t.row:,}, not a whole number "
                f"of {known[1]}-value blocks"
            )
            n_unknown += 1
            if len(unknown) < FOLD.per_file:
                unknown.append(f"'{legible(t.name)}' ({why})")
            nbytes, expected = 0, None
        if expected is not None:
            if t.offset != expected:
                n_misplaced += 1
                if len(misplaced) < 8:
                    misplaced.append(f"'{legible(t.name)}' at {t.offset:,}, expected {expected:,}")
            expected += -(-nbytes // header.alignment) * header.alignment
        end = t.offset + nbytes
        need = max(need, header.data_offset + end)
        if end > limit:
            past_end.append(t.name)
        if index in twice or header.data_offset + end > INT64_MAX:
            continue  # a second copy, or a range no file holds (file-truncated names it)
        names.append(t.name)
        types.append(t.type_name)
        shapes.append(t.shape)
        begins.append(t.offset)
        ends.append(end)
    findings: list[Finding] = []
    if unknown:
        findings.append(
            make_finding(
                "gguf-unknown-type",
                f"{shown}: {n_unknown:,} tensors have a type llama.cpp cannot read: "
                f"{', '.join(unknown)}{' ...' if n_unknown > len(unknown) else ''}; "
                "re-convert the file",
                file=rel,
            )
        )
    if misplaced:
        findings.append(
            make_finding(
                "offset-invalid",
                f"{shown}: {n_misplaced:,} tensors are not where llama.cpp expects their data "
                f"(each right after the previous one, padded to {header.alignment:,} bytes, "
                f"in header order): {'; '.join(misplaced)}"
                f"{' ...' if n_misplaced > len(misplaced) else ''}; llama.cpp refuses the "
                "file: re-convert it",
                file=rel,
            )
        )
    n_twice = len(header.duplicates)
    in_all = f" ({n_twice:,} tensor infos repeat a name in all)" if n_twice > FOLD.per_file else ""
    for later, earlier in header.duplicates[: FOLD.per_file]:
        name = header.tensors[later].name
        findings.append(
            make_finding(
                "duplicate-tensor",
                f"{shown}: tensor infos {earlier:,} and {later:,} are both named "
                f"'{legible(name)}'{in_all}; llama.cpp refuses a file naming a tensor twice "
                "(the second is left out here): re-convert it",
                file=rel,
                tensor=name,
            )
        )
    if past_end:
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
