"""A tied output head stored with other values than the embedding (`tied-head-differs`): the
engines throw a tied head away, so a head trained apart makes the model generate gibberish.
Compared by dtype, shape, then sampled or full bytes (a matching sample says "no difference
seen"). The engines' functions and what is read: docs/architecture.md, "checks/".
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np

from inspector._internal.checkpoint.loaded import tensor_data
from inspector._internal.checkpoint.naming import KINDS
from inspector._internal.checkpoint.scanned import ScannedCheckpoint
from inspector._internal.checkpoint.spec import serving_spec
from inspector._internal.checkpoint.tables import scan_columns
from inspector._internal.common.display import legible
from inspector._internal.common.dtypes import DTYPE_BITS
from inspector._internal.findings.codes import Code, code_set
from inspector._internal.findings.finding import Finding, make_finding
from inspector._internal.formats.bin_shard import data_unread, strides_of
from inspector._internal.formats.safetensors import ShardHeader
from inspector._internal.formats.value_reading import SampleBudget, windows_of
from inspector.errors import UnsafeFileError

__all__ = ["CODES", "check_tied_head"]

CODES = code_set(Code.TIED_HEAD_DIFFERS)


def check_tied_head(
    scanned: ScannedCheckpoint, *, mode: Literal["sample", "full"] = "sample", seed: int = 0
) -> list[Finding]:
    """`tied-head-differs` when config.json ties the head and the stored head's values are
    not the embedding's (module docstring)."""
    if scanned.config is None or not serving_spec(scanned.config, scanned.spec).tie_word_embeddings:
        return []
    head = _one_of(scanned, "output_head")
    embedding = _one_of(scanned, "embedding")
    if head is None or embedding is None:
        return []
    (h_name, h_dtype, h_shape), (e_name, e_dtype, e_shape) = head, embedding
    if (h_dtype, h_shape) != (e_dtype, e_shape):
        return [
            _finding(
                h_name,
                e_name,
                f"stored as {h_dtype} {list(h_shape)}, the embedding as {e_dtype} {list(e_shape)}",
                scanned,
            )
        ]
    where = _compare(scanned, h_name, e_name, mode=mode, seed=seed)
    if where is None:
        return []
    return [_finding(h_name, e_name, where, scanned)]


def _finding(head: str, embedding: str, how: str, scanned: ScannedCheckpoint) -> Finding:
    return make_finding(
        Code.TIED_HEAD_DIFFERS,
        f"config.json sets tie_word_embeddings true and the stored {legible(head)} differs from "
        f"{legible(embedding)} ({how}): vLLM never loads the stored head and transformers "
        "replaces it by the embedding, so the trained head is thrown away; set "
        "tie_word_embeddings false if the head is the trained one",
        file=_file_of(scanned, head),
        tensor=head,
    )


def _one_of(scanned: ScannedCheckpoint, kind: str) -> tuple[str, str, tuple[int, ...]] | None:
    """(name, dtype, shape) of the one tensor of `kind` outside MTP layers; None unless
    exactly one `.weight` is stored."""
    columns = scan_columns(scanned)
    numbering, source = columns.numbering, columns.tensors
    of_kind = np.flatnonzero((numbering.kind == KINDS.index(kind)) & ~numbering.is_mtp)
    rows = [r for r in of_kind.tolist() if source.names[r].endswith(".weight")]
    if len({source.names[r] for r in rows}) != 1:
        return None
    row = rows[0]
    dtype = source.dtypes[int(source.dtype_codes[row])]
    return source.names[row], dtype, tuple(int(n) for n in source.shape[row])


def _file_of(scanned: ScannedCheckpoint, name: str) -> str | None:
    found = _located(scanned, name)
    return None if found is None else found[0].file


def _located(scanned: ScannedCheckpoint, name: str) -> tuple[ShardHeader, int] | None:
    for shard in scanned.shards:
        if not shard.readable or data_unread(shard) or name in strides_of(shard):
            continue
        try:
            return shard, shard.names.index(name)
        except ValueError:
            continue
    return None


def _compare(
    scanned: ScannedCheckpoint, head: str, embedding: str, *, mode: str, seed: int
) -> str | None:
    """How the two differ ("byte 1,024 differs", "content hashes differ"), or None when no
    difference was seen or the bytes cannot be read."""
    if scanned.dcp is not None:
        return None  # chunks, not one run per tensor: the consolidated copy is compared
    if mode == "full":
        with tensor_data(scanned) as data:
            a, b = data.tensor_hash(head), data.tensor_hash(embedding)
        return None if a is None or b is None or a == b else "their content hashes differ"
    h, e = _located(scanned, head), _located(scanned, embedding)
    if h is None or e is None:
        return None
    (h_shard, i), (e_shard, j) = h, e
    h_start = h_shard.data_start + int(h_shard.begins[i])
    e_start = e_shard.data_start + int(e_shard.begins[j])
    size = int(h_shard.ends[i] - h_shard.begins[i])
    if size != int(e_shard.ends[j] - e_shard.begins[j]) or size <= 0:
        return None
    itemsize = max(1, DTYPE_BITS.get(h_shard.dtypes[i], 8) // 8)
    windows = windows_of(head, h_shard.file, 0, size, itemsize, SampleBudget(), seed)
    ranges = [(h_shard.file, h_start + at, n) for at, n in windows]
    ranges += [(e_shard.file, e_start + at, n) for at, n in windows]
    try:
        pieces = scanned.location.storage.read_ranges(ranges)
    except (OSError, UnsafeFileError):
        return None
    return _first_difference(pieces[: len(windows)], pieces[len(windows) :], windows)


def _first_difference(
    heads: Sequence[bytes], embeds: Sequence[bytes], windows: Sequence[tuple[int, int]]
) -> str | None:
    for (at, n), a, b in zip(windows, heads, embeds, strict=True):
        if len(a) != n or len(b) != n:
            return None  # a short read: the file changed; the value checks say so
        if a != b:
            where = int(np.flatnonzero(np.frombuffer(a, np.uint8) != np.frombuffer(b, np.uint8))[0])
            return f"byte {at + where:,} of {len(windows):,} sampled windows differs"
    return None
