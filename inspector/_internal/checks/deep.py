"""`check --deep`: read tensor data (streamed through memory maps) for what headers can't show:
all-zero tensors (an expert that was never written), NaN/Inf, and whether a tensor stored in
two shards has the same bytes in both."""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from inspector._internal.checkpoint.scanned import ScannedCheckpoint
from inspector._internal.common.display import legible
from inspector._internal.common.dtypes import FLOAT_VIEWS, NONFINITE_BITS
from inspector._internal.findings.codes import Code, code_set
from inspector._internal.findings.finding import Finding, fold_findings, make_finding
from inspector._internal.formats.tensordata import TensorData, tensor_digest

__all__ = ["CODES", "deep_check", "zero_allowed"]

_BLOCK = 16 << 20  # bytes per step: bounded memory whatever the tensor size
CODES = code_set(
    Code.TENSOR_ALL_ZERO,
    Code.TENSOR_NONFINITE,
    Code.DUPLICATE_TENSOR_CONTENT,
    Code.DUPLICATE_TENSOR_IDENTICAL,
)


def deep_check(scanned: ScannedCheckpoint) -> list[Finding]:
    """Findings from tensor data: tensor-all-zero, tensor-nonfinite, duplicate-tensor-content."""
    out: list[Finding] = []
    hashes: dict[str, dict[str, str]] = defaultdict(dict)
    duplicated = _duplicated_names(scanned)
    with TensorData(scanned) as data:
        for shard in scanned.shards:
            zeros: list[Finding] = []
            for name, dtype, _shape, view in data.shard_entries(shard):
                if zero_allowed(name) or not len(view):
                    pass
                elif not _any_nonzero(view):
                    zeros.append(_zero_finding(shard.file, name))
                if _nonfinite(view, dtype):
                    out.append(
                        make_finding(
                            Code.TENSOR_NONFINITE,
                            f"{legible(shard.file)}: tensor '{legible(name)}' ({dtype}) holds NaN "
                            "or Inf values",
                            file=shard.file,
                            tensor=name,
                        )
                    )
                if name in duplicated:
                    hashes[name][shard.file] = tensor_digest(view)
            out.extend(zeros)
    out = fold_findings(
        [f for f in out if f.code == Code.TENSOR_ALL_ZERO], "tensors that are all zeros"
    ) + fold_findings(
        [f for f in out if f.code == Code.TENSOR_NONFINITE], "tensors holding NaN or Inf"
    )
    return out + _duplicate_findings(hashes)


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


def _any_nonzero(view: memoryview) -> bool:
    raw = np.frombuffer(view, dtype=np.uint8)
    return any(raw[i : i + _BLOCK].any() for i in range(0, len(raw), _BLOCK))


def _nonfinite(view: memoryview, dtype: str) -> bool:
    if dtype in FLOAT_VIEWS:
        arr = np.frombuffer(view, dtype=FLOAT_VIEWS[dtype])
        step = _BLOCK // arr.itemsize
        return any(not np.isfinite(arr[i : i + step]).all() for i in range(0, len(arr), step))
    if dtype in NONFINITE_BITS:
        np_dtype, mask, value = NONFINITE_BITS[dtype]
        arr = np.frombuffer(view, dtype=np_dtype)
        step = _BLOCK // arr.itemsize
        return any(((arr[i : i + step] & mask) == value).any() for i in range(0, len(arr), step))
    return False


def _zero_finding(file: str, name: str) -> Finding:
    return make_finding(
        Code.TENSOR_ALL_ZERO,
        f"{legible(file)}: tensor '{legible(name)}' is all zeros; a weight that was never written "
        "reads back as zeros (check the exporter's expert and rank coverage)",
        file=file,
        tensor=name,
    )


def _duplicate_findings(hashes: dict[str, dict[str, str]]) -> list[Finding]:
    out = []
    for name, by_file in sorted(hashes.items()):
        files = sorted(by_file)
        same = len(set(by_file.values())) == 1
        code = Code.DUPLICATE_TENSOR_IDENTICAL if same else Code.DUPLICATE_TENSOR_CONTENT
        verdict = (
            "the same bytes" if same else "DIFFERENT bytes; loaders keep whichever they read last"
        )
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
