"""Findings: the typed, stable result of every check (codes from FINDINGS.md)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "CODES",
    "CODE_HELP",
    "Finding",
    "Severity",
    "findings_to_frame",
    "fold_ranges",
    "make_finding",
    "severity_rank",
]


class Severity(StrEnum):
    ERROR = "error"
    WARNING = "warning"
    INFO = "info"


_RANK = {Severity.ERROR: 0, Severity.WARNING: 1, Severity.INFO: 2}


def severity_rank(severity: str) -> int:
    """0 for error, 1 for warning, 2 for info: sort key, worst first."""
    return _RANK[Severity(severity)]


# The stable codes. Never rename one; add new ones freely.
CODES: dict[str, Severity] = {
    # Shard integrity
    "header-unreadable": Severity.ERROR,
    "header-invalid-entry": Severity.ERROR,
    "header-duplicate-key": Severity.WARNING,
    "unknown-dtype": Severity.ERROR,
    "size-mismatch": Severity.ERROR,
    "offset-invalid": Severity.ERROR,
    "file-truncated": Severity.ERROR,
    "trailing-bytes": Severity.WARNING,
    # Index against shards
    "index-unreadable": Severity.ERROR,
    "index-unsafe-path": Severity.ERROR,
    "index-missing-file": Severity.ERROR,
    "index-dangling-tensor": Severity.ERROR,
    "index-wrong-file": Severity.ERROR,
    "unindexed-tensor": Severity.ERROR,
    "unindexed-file": Severity.WARNING,
    "duplicate-tensor": Severity.ERROR,
    "total-size-mismatch": Severity.WARNING,
    "total-parameters-mismatch": Severity.WARNING,
    # Per-layer sidecars
    "sidecar-missing": Severity.ERROR,
    "sidecar-unlisted-tensor": Severity.ERROR,
    "sidecar-dangling-tensor": Severity.ERROR,
    "sidecar-total-size-mismatch": Severity.WARNING,
    "sidecar-index-disagree": Severity.ERROR,
    "sidecar-unreadable": Severity.ERROR,
    # Model structure
    "config-unreadable": Severity.ERROR,
    "layer-missing": Severity.ERROR,
    "expert-missing": Severity.ERROR,
    "expert-incomplete": Severity.ERROR,
    "expert-shape-mismatch": Severity.ERROR,
    "layer-keyset-outlier": Severity.WARNING,
    "mtp-missing": Severity.WARNING,
    "quant-config-unreadable": Severity.ERROR,
    "quant-config-missing-layer": Severity.ERROR,
    "quant-config-stale-layer": Severity.WARNING,
    # DCP-sharded safetensors
    "dcp-sharding-info-missing": Severity.ERROR,
    "dcp-coverage-gap": Severity.ERROR,
    "dcp-chunk-overlap": Severity.ERROR,
    "dcp-dtype-conflict": Severity.ERROR,
    "mapping-unmapped-tensor": Severity.WARNING,
    "mapping-dangling-tensor": Severity.WARNING,
    "mapping-collapsed": Severity.WARNING,
    "mapping-unreadable": Severity.ERROR,
    # Megatron torch_dist
    "torch-dist-metadata-unreadable": Severity.ERROR,
    "torch-dist-missing-file": Severity.ERROR,
    "torch-dist-chunk-gap": Severity.ERROR,
    "torch-dist-common-drift": Severity.ERROR,
    "torch-dist-metadata-json": Severity.WARNING,
    "torch-dist-chunk-overlap": Severity.ERROR,
    "torch-dist-common-unreadable": Severity.WARNING,
    # Tensor data (check --deep)
    "tensor-all-zero": Severity.WARNING,
    "tensor-nonfinite": Severity.ERROR,
    "duplicate-tensor-content": Severity.ERROR,
    "duplicate-tensor-identical": Severity.INFO,
}


# One line per code: what it means and what to do. Shown next to findings in the dashboard and
# reports; `CODE_HELP.get(code, "")` for codes added later without an entry.
CODE_HELP: dict[str, str] = {
    "header-unreadable": "The safetensors header cannot be read (too short, length past the "
    "end or over the cap, not a JSON object): the file is truncated or not safetensors; "
    "re-copy it.",
    "header-invalid-entry": "A tensor entry lacks or mistypes dtype, shape or data_offsets: "
    "the writer produced a broken header; re-export the shard.",
    "header-duplicate-key": "The same tensor name appears twice in one header; loaders keep "
    "one of them silently.",
    "unknown-dtype": "A dtype outside the safetensors list; no standard loader can read it.",
    "size-mismatch": "A tensor's byte range does not match prod(shape) x dtype size: the "
    "header is wrong or the data is packed differently than declared.",
    "offset-invalid": "Data offsets leave a gap, overlap or run past the data section; the "
    "shard is corrupt.",
    "file-truncated": "The file is shorter than its header says (interrupted copy or write); "
    "re-copy or re-export it.",
    "trailing-bytes": "The file is longer than its header says; strict readers reject it.",
    "index-unreadable": "model.safetensors.index.json is not valid JSON or lacks a weight_map; "
    "rebuild it with `ckpt-inspect repair`.",
    "index-unsafe-path": "The index points outside the checkpoint folder; never load it as is.",
    "index-missing-file": "The index names a shard that is not on disk; its tensors would stay "
    "uninitialised. Copy the shard or rebuild the index.",
    "index-dangling-tensor": "The index lists a tensor no shard holds; loading fails or leaves "
    "it uninitialised.",
    "index-wrong-file": "The index maps a tensor to the wrong shard; rebuild the index.",
    "unindexed-tensor": "A shard holds a tensor the index does not list, so loaders silently "
    "ignore it (e.g. lost MTP weights); rebuild the index.",
    "unindexed-file": "A .safetensors file the index never names: a leftover or a forgotten shard.",
    "duplicate-tensor": "One tensor name in several shards; loaders keep whichever they read "
    "last. Decide which copy is right, then repair.",
    "total-size-mismatch": "metadata.total_size differs from the sum of tensor bytes; usually "
    "harmless, but it can reveal missing or extra tensors.",
    "total-parameters-mismatch": "metadata.total_parameters differs from the sum of element "
    "counts.",
    "sidecar-missing": "A per-layer shard has no .json sidecar, or a sidecar has no shard.",
    "sidecar-unlisted-tensor": "A shard holds a tensor its sidecar does not list (the sidecar "
    "was written before the tensor was added); the merged index misses it too.",
    "sidecar-dangling-tensor": "A sidecar lists a tensor its shard does not hold.",
    "sidecar-total-size-mismatch": "A sidecar's total_size differs from its shard's tensor bytes.",
    "sidecar-index-disagree": "The merged sidecars and model.safetensors.index.json disagree.",
    "sidecar-unreadable": "A per-layer sidecar is not valid JSON or lacks a weight_map.",
    "config-unreadable": "config.json is not valid JSON (e.g. truncated by concurrent "
    "writers); restore it from the training run.",
    "layer-missing": "A layer that config.json declares has no tensors.",
    "expert-missing": "An MoE layer lacks expert ids the config declares (e.g. EP ranks "
    "overwrote each other); re-export from the training checkpoint.",
    "expert-incomplete": "An expert has fewer tensors than its siblings (a projection or a "
    "quantization scale is missing).",
    "expert-shape-mismatch": "An expert tensor's shape or dtype differs from its siblings'.",
    "layer-keyset-outlier": "A layer's set of tensor suffixes differs from the other layers of "
    "its kind (extra _extra_state, partly quantized).",
    "mtp-missing": "The config declares MTP layers but none are stored; MTP speculative "
    "decoding will not work.",
    "quant-config-unreadable": "hf_quant_config.json is not valid JSON.",
    "quant-config-missing-layer": "A quantized module has no quantized_layers entry and no "
    "matching exclude pattern; loaders treat it as unquantized.",
    "quant-config-stale-layer": "A quantized_layers entry names a module with no tensors.",
    "dcp-sharding-info-missing": "A DCP shard lacks DCP_SHARDING_INFO (or offsets for one of "
    "its tensors); its chunks cannot be placed.",
    "dcp-coverage-gap": "A tensor's chunks do not cover its full shape: a rank's file is "
    "missing or short.",
    "dcp-chunk-overlap": "Two chunks of one tensor overlap.",
    "dcp-dtype-conflict": "Chunks of one tensor disagree on dtype or number of dimensions.",
    "mapping-unmapped-tensor": "A tensor is absent from fqn_to_file_index_mapping.json; "
    "consolidation has to place it itself.",
    "mapping-dangling-tensor": "The file-index mapping lists a tensor no shard holds (e.g. a "
    "tied alias).",
    "mapping-collapsed": "Every tensor maps to one output file, or the output would exceed the "
    "shard size limit; consolidate with a reference index or greedy packing.",
    "mapping-unreadable": "fqn_to_file_index_mapping.json is not valid JSON or not {fqn: index}.",
    "torch-dist-metadata-unreadable": "The torch_dist .metadata is missing, corrupt or pickles "
    "classes outside the DCP metadata (refused, never executed).",
    "torch-dist-missing-file": "A .distcp file the metadata points into is missing or too short.",
    "torch-dist-chunk-gap": "A tensor's chunks do not cover its global size.",
    "torch-dist-common-drift": "Common state and sharded metadata disagree (e.g. the rerun "
    "state machine is active but its shards were not saved); loading will fail.",
    "torch-dist-metadata-json": "metadata.json is missing, unreadable or not torch_dist.",
    "torch-dist-chunk-overlap": "Two stored chunks of one tensor overlap.",
    "torch-dist-common-unreadable": "common.pt cannot be read with weights_only=True.",
    "tensor-all-zero": "A tensor holds only zeros: often a tensor that was never written.",
    "tensor-nonfinite": "A tensor holds NaN or Inf values.",
    "duplicate-tensor-content": "One tensor name in several shards with DIFFERENT bytes; "
    "loaders keep whichever they read last.",
    "duplicate-tensor-identical": "One tensor name in several shards with the same bytes; "
    "harmless but wasteful.",
}


@dataclass(frozen=True, slots=True)
class Finding:
    """One problem, with where it is. `file` is relative to the checkpoint folder."""

    code: str
    severity: Severity
    message: str
    file: str | None = None
    tensor: str | None = None
    layer: int | None = None
    expert: int | None = None

    def to_dict(self) -> dict[str, object]:
        d = asdict(self)
        d["severity"] = str(self.severity)
        return d


def make_finding(
    code: str,
    message: str,
    *,
    file: str | None = None,
    tensor: str | None = None,
    layer: int | None = None,
    expert: int | None = None,
) -> Finding:
    """A finding whose severity comes from the code registry (unknown codes are a bug)."""
    return Finding(code, CODES[code], message, file, tensor, layer, expert)


_COLUMNS = ["code", "severity", "message", "file", "tensor", "layer", "expert"]


def findings_to_frame(findings: Iterable[Finding]) -> pd.DataFrame:
    """The findings as a DataFrame, worst first, with categorical code and severity."""
    import pandas as pd

    rows = [f.to_dict() for f in findings]
    frame = pd.DataFrame(rows, columns=_COLUMNS)
    frame["layer"] = frame["layer"].astype("Int64")
    frame["expert"] = frame["expert"].astype("Int64")
    frame["severity"] = pd.Categorical(
        frame["severity"], categories=[s.value for s in Severity], ordered=True
    )
    frame["code"] = frame["code"].astype("category")
    return frame.sort_values(["severity", "code"], kind="stable").reset_index(drop=True)


def fold_ranges(values: Iterable[int], *, limit: int = 12) -> str:
    """'0-3, 7, 9-511': sorted unique ints folded into ranges, at most `limit` pieces."""
    ordered = sorted(set(values))
    pieces: list[str] = []
    start = prev = None
    for v in ordered:
        if start is None:
            start = prev = v
        elif v == prev + 1:
            prev = v
        else:
            pieces.append(_piece(start, prev))
            start = prev = v
    if start is not None:
        pieces.append(_piece(start, prev))
    if len(pieces) > limit:
        return ", ".join(pieces[:limit]) + f", ... ({len(pieces) - limit} more ranges)"
    return ", ".join(pieces)


def _piece(start: int, end: int) -> str:
    return str(start) if start == end else f"{start}-{end}"


def examples(items: Sequence[str], *, limit: int = 3) -> str:
    """'a, b, c and 12 more': the first few of a long list, for messages."""
    shown = ", ".join(items[:limit])
    rest = len(items) - limit
    return f"{shown} and {rest} more" if rest > 0 else shown
