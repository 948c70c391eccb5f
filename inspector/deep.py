"""`check --deep`: read tensor data (streamed through memory maps) for what headers can't show:
all-zero tensors (an expert that was never written), NaN/Inf, and whether a tensor stored in
two shards has the same bytes in both."""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from inspector.dtypes import FLOAT_VIEWS, NONFINITE_BITS
from inspector.findings import Finding, examples, make_finding
from inspector.model import ScannedCheckpoint
from inspector.tensordata import TensorData, hash_bytes

__all__ = ["deep_check"]

_BLOCK = 16 << 20  # bytes per step: bounded memory whatever the tensor size
_PER_FILE = 5  # past this many all-zero tensors in one file, one summary finding


def deep_check(scanned: ScannedCheckpoint) -> list[Finding]:
    """Findings from tensor data: tensor-all-zero, tensor-nonfinite, duplicate-tensor-content."""
    out: list[Finding] = []
    hashes: dict[str, dict[str, str]] = defaultdict(dict)
    duplicated = _duplicated_names(scanned)
    with TensorData(scanned) as data:
        for shard in scanned.shards:
            zeros: list[str] = []
            for name, dtype, _shape, view in data.shard_entries(shard):
                if _skip_zero(name) or not len(view):
                    pass
                elif not _any_nonzero(view):
                    zeros.append(name)
                if _nonfinite(view, dtype):
                    out.append(
                        make_finding(
                            "tensor-nonfinite",
                            f"{shard.file}: tensor {name!r} ({dtype}) holds NaN or Inf values",
                            file=shard.file,
                            tensor=name,
                        )
                    )
                if name in duplicated:
                    hashes[name][shard.file] = hash_bytes(view)
            out.extend(_zero_findings(shard.file, zeros))
    out.extend(_duplicate_findings(hashes))
    return out


def _duplicated_names(scanned: ScannedCheckpoint) -> set[str]:
    if scanned.dcp is not None:
        # DCP rank files each hold a chunk of the same name: only two chunks saved at the same
        # offsets are copies of one another.
        return {
            fqn
            for fqn, chunks in scanned.dcp.chunks.items()
            if len({c.offsets for c in chunks}) < len(chunks)
        }
    seen: set[str] = set()
    dup: set[str] = set()
    for shard in scanned.shards:
        for name in shard.names:
            (dup if name in seen else seen).add(name)
    return dup


def _skip_zero(name: str) -> bool:
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


def _zero_findings(file: str, zeros: list[str]) -> list[Finding]:
    if len(zeros) <= _PER_FILE:
        return [
            make_finding(
                "tensor-all-zero",
                f"{file}: tensor {name!r} is all zeros; a weight that was never written reads back "
                "as zeros (check the exporter's expert and rank coverage)",
                file=file,
                tensor=name,
            )
            for name in zeros
        ]
    return [
        make_finding(
            "tensor-all-zero",
            f"{file}: {len(zeros)} tensors are all zeros ({examples(zeros)}); weights that were "
            "never written read back as zeros",
            file=file,
            tensor=zeros[0],
        )
    ]


def _duplicate_findings(hashes: dict[str, dict[str, str]]) -> list[Finding]:
    out = []
    for name, by_file in sorted(hashes.items()):
        files = sorted(by_file)
        same = len(set(by_file.values())) == 1
        code = "duplicate-tensor-identical" if same else "duplicate-tensor-content"
        verdict = (
            "the same bytes" if same else "DIFFERENT bytes; loaders keep whichever they read last"
        )
        out.append(
            make_finding(
                code,
                f"tensor {name!r} is stored in {', '.join(files)} with {verdict}",
                file=files[-1],
                tensor=name,
            )
        )
    return out
