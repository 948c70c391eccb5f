"""`check --deep`: read tensor data (streamed in blocks, `TensorData`) for what headers can't
show: all-zero tensors (an expert that was never written), NaN/Inf, and whether a tensor
stored in two shards has the same bytes in both. A tensor whose bytes cannot be read (the file
got shorter while it was read, a read failed) is reported as `check --values` reports it."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence

import numpy as np

from inspector._internal.checkpoint.loaded import kept_copies
from inspector._internal.checkpoint.scanned import ScannedCheckpoint
from inspector._internal.checks.unread import unread_findings
from inspector._internal.common.display import legible
from inspector._internal.common.dtypes import FLOAT_VIEWS, NONFINITE_BITS
from inspector._internal.findings.codes import Code, code_set
from inspector._internal.findings.finding import Finding, fold_findings, make_finding
from inspector._internal.formats.bin_shard import data_unread, strides_of
from inspector._internal.formats.safetensors import ShardHeader
from inspector._internal.formats.tensordata import TensorData, tensor_hasher
from inspector._internal.formats.value_reading import Unread

__all__ = ["CODES", "deep_check", "zero_allowed"]

# Bytes per step: bounded memory whatever the tensor size; the temporaries of a step stay in
# the CPU's cache (16 MiB steps took twice as long).
_BLOCK = 1 << 20
CODES = code_set(
    Code.TENSOR_ALL_ZERO,
    Code.TENSOR_NONFINITE,
    Code.DUPLICATE_TENSOR_CONTENT,
    Code.DUPLICATE_TENSOR_IDENTICAL,
    Code.TENSOR_UNREADABLE,
    Code.FILE_TRUNCATED,
)


def deep_check(scanned: ScannedCheckpoint) -> list[Finding]:
    """Findings from tensor data: tensor-all-zero, tensor-nonfinite, duplicate-tensor-content
    (and -identical); tensor-unreadable and file-truncated for bytes that could not be read."""
    out: list[Finding] = []
    hashes: dict[str, dict[str, str]] = defaultdict(dict)
    unread: list[Unread] = []
    duplicated = _duplicated_names(scanned)
    with TensorData(scanned) as data:
        for shard in scanned.shards:
            zeros: list[Finding] = []
            unread += _past_end(shard, data.size(shard.file))
            for name, dtype, _shape, blocks in data.shard_entries(shard):
                try:
                    size, nonzero, nonfinite, digest = _read(blocks, dtype, name in duplicated)
                except OSError as exc:  # FileShrankError: it got shorter while it was read
                    unread.append(Unread.failed(shard.file, name, dtype, exc))
                    continue
                if not (zero_allowed(name) or not size or nonzero):
                    zeros.append(_zero_finding(shard.file, name))
                if nonfinite:
                    out.append(
                        make_finding(
                            Code.TENSOR_NONFINITE,
                            f"{legible(shard.file)}: tensor '{legible(name)}' ({dtype}) holds NaN "
                            "or Inf values",
                            file=shard.file,
                            tensor=name,
                        )
                    )
                if digest is not None:
                    hashes[name][shard.file] = digest
            out.extend(zeros)
    out = fold_findings(
        [f for f in out if f.code == Code.TENSOR_ALL_ZERO], "tensors that are all zeros"
    ) + fold_findings(
        [f for f in out if f.code == Code.TENSOR_NONFINITE], "tensors holding NaN or Inf"
    )
    return out + _duplicate_findings(scanned, hashes) + unread_findings(unread)


def _read(
    blocks: Iterable[memoryview], dtype: str, hashed: bool
) -> tuple[int, bool, bool, str | None]:
    """One pass over a tensor's blocks: (its bytes, whether any is non-zero, whether it holds
    NaN or Inf, its content hash when `hashed`). `OSError` when a read fails."""
    hasher = tensor_hasher() if hashed else None
    size, nonzero, nonfinite = 0, False, False
    for block in blocks:
        size += len(block)
        nonzero = nonzero or _any_nonzero(block)
        nonfinite = nonfinite or _nonfinite(block, dtype)
        if hasher is not None:
            hasher.update(block)
    return size, nonzero, nonfinite, None if hasher is None else hasher.hexdigest()


def _past_end(shard: ShardHeader, size: int | None) -> list[Unread]:
    """The entries whose bytes lie past the end of the file as it was opened for reading
    (none when it could not be opened: the scan says why)."""
    if size is None or data_unread(shard):
        return []
    strided = strides_of(shard)
    starts = shard.begins + shard.data_start
    ends = shard.ends + shard.data_start
    rows = np.flatnonzero((ends > size) & (ends > starts)).tolist()
    dtypes = shard.dtypes if rows else []
    return [
        Unread.past_end(shard.file, shard.names[r], dtypes[r], (int(starts[r]), int(ends[r])), size)
        for r in rows
        if shard.names[r] not in strided
    ]


def _duplicated_names(scanned: ScannedCheckpoint) -> set[str]:
    if scanned.dcp is not None:
        # DCP rank files each hold a chunk of the same name: only two chunks saved at the same
        # offsets are copies of one another.
        table = scanned.dcp.table
        offsets = table.offsets.codes.tolist()
        return {
            fqn
            for i, fqn in enumerate(table.names)
            if len({offsets[r] for r in table.rows(i)}) < len(table.rows(i))
        }
    seen: set[str] = set()
    dup: set[str] = set()
    for shard in scanned.shards:
        for name in shard.names:
            (dup if name in seen else seen).add(name)
    return dup


def zero_allowed(name: str) -> bool:
    """Biases and TransformerEngine extra state are legitimately zero."""
    last = name.rsplit(".", 1)[-1]
    return last.endswith("bias") or last.startswith("_extra_state")


def _pieces(arr: np.ndarray) -> Sequence[np.ndarray] | Iterator[np.ndarray]:
    """`arr` in steps of `_BLOCK` bytes (itself, when it is no longer: most blocks are)."""
    step = _BLOCK // arr.itemsize
    if len(arr) <= step:
        return (arr,)
    return (arr[i : i + step] for i in range(0, len(arr), step))


def _any_nonzero(view: memoryview) -> bool:
    return any(piece.any() for piece in _pieces(np.frombuffer(view, dtype=np.uint8)))


def _nonfinite(view: memoryview, dtype: str) -> bool:
    if dtype in FLOAT_VIEWS:
        arr = np.frombuffer(view, dtype=FLOAT_VIEWS[dtype])
        return any(not np.isfinite(piece).all() for piece in _pieces(arr))
    if dtype in NONFINITE_BITS:
        np_dtype, mask, value = NONFINITE_BITS[dtype]
        arr = np.frombuffer(view, dtype=np_dtype)
        return any(((piece & mask) == value).any() for piece in _pieces(arr))
    return False


def _zero_finding(file: str, name: str) -> Finding:
    return make_finding(
        Code.TENSOR_ALL_ZERO,
        f"{legible(file)}: tensor '{legible(name)}' is all zeros; a weight that was never written "
        "reads back as zeros (check the exporter's expert and rank coverage)",
        file=file,
        tensor=name,
    )


def _duplicate_findings(
    scanned: ScannedCheckpoint, hashes: dict[str, dict[str, str]]
) -> list[Finding]:
    out = []
    kept = kept_copies(scanned, hashes.keys())
    for name, by_file in sorted(hashes.items()):
        files = sorted(by_file)
        same = len(set(by_file.values())) == 1
        code = Code.DUPLICATE_TENSOR_IDENTICAL if same else Code.DUPLICATE_TENSOR_CONTENT
        if same:
            verdict = "the same bytes"
        elif name in kept:
            verdict = (
                f"DIFFERENT bytes; transformers loads the copy in {legible(kept[name][0].file)} "
                "(the last file it reads), other loaders may load another"
            )
        else:
            verdict = "DIFFERENT bytes; loaders keep whichever they read last"
        out.append(
            make_finding(
                code,
                f"tensor '{legible(name)}' is stored in {', '.join(map(legible, files))} with "
                f"{verdict}",
                file=files[-1],
                tensor=name,
            )
        )
    return out
