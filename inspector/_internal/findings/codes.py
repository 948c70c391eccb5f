"""The finding codes: one table, the stable interface of every check.

Each `Code` member is the code string itself (a `StrEnum`, so `Code.INDEX_MISSING_FILE ==
"index-missing-file"`), with its severity, the group it is listed under, a one-line help
text that says what it means, and its fix (`Code.fix`: the kind of action and what to do).
`ckpt-inspect codes`, `docs/findings.md`, the dashboard and the reports all read this table; nothing
else lists codes.

Codes are never renamed or removed: CI scripts gate on them. Add new ones freely.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType
from typing import Literal

__all__ = [
    "CODES",
    "CODE_HELP",
    "GROUPS",
    "Code",
    "Fix",
    "FixKind",
    "Severity",
    "code_of",
    "code_set",
    "codes_in_group",
    "codes_markdown",
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


# Section titles, in the order `docs/findings.md` and `ckpt-inspect codes` list them.
GROUPS = (
    "Shard integrity",
    "Index against shards",
    "Per-layer sidecars",
    "Model structure against config.json and hf_quant_config.json",
    "DCP-sharded safetensors",
    "Megatron torch_dist",
    "What the model code itself would load",
    "Tensor data (check --deep, check --values)",
    "Files the checkpoint cannot safely give us",
    "Content against a source (ckpt-inspect verify)",
    "Serving: parallel plans and memory per GPU (ckpt-inspect fit)",
    "Serving engines: what vLLM and llama.cpp would load (check --engine, fit)",
)
_S, _I, _P, _M, _D, _T, _L, _X, _U, _V, _F, _G = GROUPS
_E, _W, _N = Severity.ERROR, Severity.WARNING, Severity.INFO


# What kind of action fixes a finding: a repair plan, restoring files or tensors from a source,
# re-exporting from the training run, consolidating, re-sharding, or a person's review.
FixKind = Literal["repair", "restore", "re-export", "consolidate", "reshard", "review"]


@dataclass(frozen=True, slots=True)
class Fix:
    """What fixes a finding of a code: the kind of action and, in words, what to do."""

    kind: FixKind
    text: str


class Code(StrEnum):
    """A finding code: `.severity`, `.group`, `.help` and `.fix` come with it."""

    severity: Severity
    group: str
    help: str
    fix: Fix

    def __new__(cls, value: str, severity: Severity, group: str, text: str) -> Code:
        member = str.__new__(cls, value)
        member._value_ = value
        member.severity = severity
        member.group = group
        member.help = text
        return member

    # -- shard integrity (any safetensors file) ---------------------------------------------
    HEADER_UNREADABLE = (
        "header-unreadable",
        _E,
        _S,
        "The safetensors header cannot be read (too short, length past the end or over the "
        "cap, not a JSON object): the file is truncated or not safetensors; re-copy it.",
    )
    BIN_LEGACY_FORMAT = (
        "bin-legacy-format",
        _E,
        _S,
        "A PyTorch .bin/.pt file in the pre-1.6 torch.save format (one pickle stream, or a tar "
        "archive) instead of the zip archive: its tensors are listed from its pickles, but its "
        "data is not read (no --deep, consolidation or repair from it). Convert it: load it "
        "with torch >= 1.6 (torch.load(path, weights_only=True)) and save it again with "
        "safetensors' save_file (or torch.save).",
    )
    BIN_UNREADABLE = (
        "bin-unreadable",
        _E,
        _S,
        "A PyTorch .bin/.pt file cannot be read: not a zip archive, no <prefix>/data.pkl "
        "record, a truncated or corrupt central directory, or a data.pkl that is not a dict "
        "of tensors (refused by the restricted unpickler, nothing ran). Re-copy or re-save it.",
    )
    BIN_RECORD_MISSING = (
        "bin-record-missing",
        _E,
        _S,
        "A tensor of a PyTorch .bin file points at storage bytes the archive lacks: its "
        "data/<key> record is absent, shorter than the storage, or the tensor runs past it. "
        "torch.load fails on it; re-copy the file or re-save it from the source.",
    )
    GGUF_UNREADABLE = (
        "gguf-unreadable",
        _E,
        _S,
        "A GGUF file's header cannot be read, or breaks a rule llama.cpp's reader refuses a "
        "file for: no GGUF magic, a version other than 2 or 3, a header truncated inside its "
        "metadata or tensor infos, an unknown value type, a count or length over the limits, "
        "an empty or repeated metadata key, an array of arrays, a general.alignment that is "
        "not a UINT32 power of two, a tensor name of 64 bytes or more, more than 4 dimensions, "
        "or a shape whose element or byte count overflows. Re-download or re-convert the "
        "file.",
    )
    GGUF_UNKNOWN_TYPE = (
        "gguf-unknown-type",
        _E,
        _S,
        "A GGUF tensor has a ggml type id the format does not define (a removed or future "
        "quantization), or a first dimension that is not a whole number of its type's "
        "blocks: llama.cpp refuses the file. Re-convert it with a current llama.cpp / gguf.",
    )
    GGUF_SPLIT_MISSING = (
        "gguf-split-missing",
        _E,
        _I,
        "A split GGUF model (NAME-0000i-of-0000N.gguf) lacks parts that split.count declares: "
        "llama.cpp cannot open it. Download the missing parts.",
    )
    GGUF_SPLIT_TENSOR_COUNT_MISMATCH = (
        "gguf-split-tensor-count-mismatch",
        _E,
        _I,
        "The parts of a split GGUF model hold a different number of tensors from what "
        "split.tensors.count says (llama.cpp: 'corrupted model: N tensors expected but M "
        "found'). A part is stale or from another conversion; re-download or re-split.",
    )
    GGUF_SPLIT_INCONSISTENT = (
        "gguf-split-inconsistent",
        _E,
        _I,
        "The parts of a split GGUF model disagree: different split.count or "
        "split.tensors.count, a split.no that is not the file's number minus one, or a "
        "part without split metadata. Parts of two conversions were mixed; re-download or "
        "re-split them together.",
    )
    HEADER_INVALID_ENTRY = (
        "header-invalid-entry",
        _E,
        _S,
        "A tensor entry lacks or mistypes dtype, shape or data_offsets: the writer produced a "
        "broken header; re-export the shard.",
    )
    HEADER_DUPLICATE_KEY = (
        "header-duplicate-key",
        _W,
        _S,
        "The same tensor name appears twice in one header; loaders keep one of them silently.",
    )
    UNKNOWN_DTYPE = (
        "unknown-dtype",
        _E,
        _S,
        "A dtype outside the safetensors list; no standard loader can read it.",
    )
    SIZE_MISMATCH = (
        "size-mismatch",
        _E,
        _S,
        "A tensor's byte range does not match prod(shape) x dtype size: the header is wrong or "
        "the data is packed differently than declared.",
    )
    OFFSET_INVALID = (
        "offset-invalid",
        _E,
        _S,
        "Data offsets leave a gap, overlap or run past the data section; the shard is corrupt.",
    )
    FILE_TRUNCATED = (
        "file-truncated",
        _E,
        _S,
        "The file is shorter than its header says (interrupted copy or write); re-copy or "
        "re-export it.",
    )
    TRAILING_BYTES = (
        "trailing-bytes",
        _W,
        _S,
        "The file is longer than its header says; strict readers reject it.",
    )
    # -- index against shards ---------------------------------------------------------------
    INDEX_UNREADABLE = (
        "index-unreadable",
        _E,
        _I,
        "model.safetensors.index.json is not valid JSON or lacks a weight_map; rebuild it with "
        "`ckpt-inspect repair`.",
    )
    INDEX_UNSAFE_PATH = (
        "index-unsafe-path",
        _E,
        _I,
        "The index points outside the checkpoint folder; never load it as is.",
    )
    INDEX_MISSING_FILE = (
        "index-missing-file",
        _E,
        _I,
        "The index names a shard that is not on disk; its tensors would stay uninitialised. "
        "Copy the shard or rebuild the index.",
    )
    INDEX_DANGLING_TENSOR = (
        "index-dangling-tensor",
        _E,
        _I,
        "The index lists a tensor no shard holds; loading fails or leaves it uninitialised.",
    )
    INDEX_WRONG_FILE = (
        "index-wrong-file",
        _E,
        _I,
        "The index maps a tensor to the wrong shard; rebuild the index.",
    )
    UNINDEXED_TENSOR = (
        "unindexed-tensor",
        _E,
        _I,
        "A shard holds a tensor the index does not list, so loaders silently ignore it (e.g. "
        "lost MTP weights); rebuild the index.",
    )
    UNINDEXED_FILE = (
        "unindexed-file",
        _W,
        _I,
        "A .safetensors file the index never names: a leftover or a forgotten shard.",
    )
    WEIGHTS_NAMED_BY_CONFIG = (
        "weights-named-by-config",
        _E,
        _I,
        "config.json's transformers_weights names the weights transformers reads instead of "
        "model.safetensors or the index's files; save_pretrained never writes it, and other "
        "loaders ignore it.",
    )
    DUPLICATE_TENSOR = (
        "duplicate-tensor",
        _E,
        _I,
        "One tensor name in several shards; loaders keep whichever they read last. Decide "
        "which copy is right, then repair.",
    )
    TOTAL_SIZE_MISMATCH = (
        "total-size-mismatch",
        _W,
        _I,
        "metadata.total_size differs from the sum of tensor bytes; usually harmless, but it "
        "can reveal missing or extra tensors.",
    )
    TOTAL_PARAMETERS_MISMATCH = (
        "total-parameters-mismatch",
        _W,
        _I,
        "metadata.total_parameters differs from what the writer would have counted (model "
        "parameters; saved buffers and quantization scales are not parameters).",
    )
    # -- per-layer sidecars -----------------------------------------------------------------
    SIDECAR_MISSING = (
        "sidecar-missing",
        _E,
        _P,
        "A per-layer shard has no .json sidecar, or a sidecar has no shard.",
    )
    SIDECAR_UNLISTED_TENSOR = (
        "sidecar-unlisted-tensor",
        _E,
        _P,
        "A shard holds a tensor its sidecar does not list (the sidecar was written before the "
        "tensor was added); the merged index misses it too.",
    )
    SIDECAR_DANGLING_TENSOR = (
        "sidecar-dangling-tensor",
        _E,
        _P,
        "A sidecar lists a tensor its shard does not hold.",
    )
    SIDECAR_TOTAL_SIZE_MISMATCH = (
        "sidecar-total-size-mismatch",
        _W,
        _P,
        "A sidecar's total_size differs from its shard's tensor bytes.",
    )
    SIDECAR_INDEX_DISAGREE = (
        "sidecar-index-disagree",
        _E,
        _P,
        "The merged sidecars and model.safetensors.index.json disagree.",
    )
    SIDECAR_UNREADABLE = (
        "sidecar-unreadable",
        _E,
        _P,
        "A per-layer sidecar is not valid JSON or lacks a weight_map.",
    )
    # -- model structure --------------------------------------------------------------------
    CONFIG_UNREADABLE = (
        "config-unreadable",
        _E,
        _M,
        "config.json is not valid JSON (e.g. truncated by concurrent writers); restore it from "
        "the training run.",
    )
    LAYER_MISSING = (
        "layer-missing",
        _E,
        _M,
        "A layer that config.json declares has no tensors.",
    )
    EXPERT_MISSING = (
        "expert-missing",
        _E,
        _M,
        "An MoE layer lacks expert ids the config, the router or its sibling layers declare "
        "(e.g. EP ranks overwrote each other); re-export from the training checkpoint.",
    )
    EXPERT_INCOMPLETE = (
        "expert-incomplete",
        _E,
        _M,
        "An expert has fewer tensors than its siblings (a projection or a quantization scale "
        "is missing).",
    )
    EXPERT_SHAPE_MISMATCH = (
        "expert-shape-mismatch",
        _E,
        _M,
        "An expert tensor's shape or dtype differs from its siblings'.",
    )
    LAYER_KEYSET_OUTLIER = (
        "layer-keyset-outlier",
        _W,
        _M,
        "A layer's set of tensor suffixes differs from the other layers of its kind (extra "
        "_extra_state, partly quantized).",
    )
    MTP_MISSING = (
        "mtp-missing",
        _W,
        _M,
        "The config declares MTP layers but none are stored; MTP speculative decoding will "
        "not work.",
    )
    MTP_NOT_STORED = (
        "mtp-not-stored",
        _N,
        _M,
        "The config declares MTP layers that the writer's model class never stores "
        "(transformers builds no MTP module for it); fine for transformers. MTP speculative "
        "decoding in serving engines needs them: restore them with `ckpt-inspect repair "
        "--from <original release>`.",
    )
    QUANT_CONFIG_UNREADABLE = (
        "quant-config-unreadable",
        _E,
        _M,
        "hf_quant_config.json is not valid JSON.",
    )
    QUANT_CONFIG_MISSING_LAYER = (
        "quant-config-missing-layer",
        _E,
        _M,
        "A module stored quantized that the quantization config does not list "
        "(hf_quant_config.json: no quantized_layers entry and no matching exclude pattern; "
        "compressed-tensors config.json: ignored, or targeted by no config group); loaders "
        "treat it as unquantized.",
    )
    QUANT_CONFIG_STALE_LAYER = (
        "quant-config-stale-layer",
        _W,
        _M,
        "A quantized_layers entry names a module with no tensors.",
    )
    QUANT_SCHEME_MISMATCH = (
        "quant-scheme-mismatch",
        _E,
        _M,
        "A module is stored quantized differently from what the quantization config says: a "
        "plain weight where its scheme packs it, a tensor its scheme needs missing (scale, "
        "zero point, global scale, weight_shape, block scales), a scale or packed shape that "
        "disagrees with the group or block size, or scales on a module the config leaves "
        "unquantized. Serving engines refuse it or load wrong values; re-export the module "
        "with the scheme the config names, or fix the config to what was exported.",
    )
    QUANT_RECIPE_MISMATCH = (
        "quant-recipe-mismatch",
        _W,
        _M,
        "recipe.yaml and config.json's quantization_config resolve to different sets of "
        "quantized modules or different schemes (compared module by module, not literally: "
        "llm-compressor rewrites the ignore list). One of them was edited after the export; "
        "re-export, or make the two agree so the recipe reproduces this checkpoint.",
    )
    # -- DCP-sharded safetensors ------------------------------------------------------------
    DCP_SHARDING_INFO_MISSING = (
        "dcp-sharding-info-missing",
        _E,
        _D,
        "A DCP shard lacks DCP_SHARDING_INFO (or offsets for one of its tensors); its chunks "
        "cannot be placed.",
    )
    DCP_COVERAGE_GAP = (
        "dcp-coverage-gap",
        _E,
        _D,
        "A tensor's chunks do not cover its full shape: a rank's file is missing or short.",
    )
    DCP_CHUNK_OVERLAP = (
        "dcp-chunk-overlap",
        _E,
        _D,
        "Two chunks of one tensor overlap.",
    )
    DCP_DTYPE_CONFLICT = (
        "dcp-dtype-conflict",
        _E,
        _D,
        "Chunks of one tensor disagree on dtype or number of dimensions.",
    )
    MAPPING_UNMAPPED_TENSOR = (
        "mapping-unmapped-tensor",
        _W,
        _D,
        "A tensor is absent from fqn_to_file_index_mapping.json; consolidation has to place "
        "it itself.",
    )
    MAPPING_DANGLING_TENSOR = (
        "mapping-dangling-tensor",
        _W,
        _D,
        "The file-index mapping lists a tensor no shard holds (e.g. a tied alias).",
    )
    MAPPING_COLLAPSED = (
        "mapping-collapsed",
        _W,
        _D,
        "Every tensor maps to one output file, or the output would exceed the shard size "
        "limit; consolidate with a reference index or greedy packing.",
    )
    MAPPING_UNREADABLE = (
        "mapping-unreadable",
        _E,
        _D,
        "fqn_to_file_index_mapping.json is not valid JSON or not {fqn: index}.",
    )
    # -- Megatron torch_dist ----------------------------------------------------------------
    TORCH_DIST_METADATA_UNREADABLE = (
        "torch-dist-metadata-unreadable",
        _E,
        _T,
        "The torch_dist .metadata is missing, corrupt or pickles classes outside the DCP "
        "metadata (refused, never executed).",
    )
    TORCH_DIST_MISSING_FILE = (
        "torch-dist-missing-file",
        _E,
        _T,
        "A .distcp file the metadata points into is missing or too short.",
    )
    TORCH_DIST_CHUNK_GAP = (
        "torch-dist-chunk-gap",
        _E,
        _T,
        "A tensor's chunks do not cover its global size.",
    )
    TORCH_DIST_COMMON_DRIFT = (
        "torch-dist-common-drift",
        _E,
        _T,
        "Common state and sharded metadata disagree (e.g. the rerun state machine is active "
        "but its shards were not saved); loading will fail.",
    )
    TORCH_DIST_METADATA_JSON = (
        "torch-dist-metadata-json",
        _W,
        _T,
        "metadata.json is missing, unreadable or not torch_dist.",
    )
    TORCH_DIST_CHUNK_OVERLAP = (
        "torch-dist-chunk-overlap",
        _E,
        _T,
        "Two stored chunks of one tensor overlap.",
    )
    TORCH_DIST_OBJECT_INCOMPLETE = (
        "torch-dist-object-incomplete",
        _E,
        _T,
        "A sharded object's keys declare a grid of shards (`<key>/shard_<offsets>_<shape>`, "
        "e.g. one per rank) but .metadata lacks some of them: the ranks that need them fail "
        "to load; restore the lost ranks' objects from the original save or re-save.",
    )
    TORCH_DIST_COMMON_UNREADABLE = (
        "torch-dist-common-unreadable",
        _W,
        _T,
        "common.pt cannot be read with weights_only=True.",
    )
    # -- what the model code itself would load ----------------------------------------------
    LOAD_MISSING_TENSOR = (
        "load-missing-tensor",
        _E,
        _L,
        "The model built from config.json expects a tensor (or, under the quantization config, "
        "a scale) the checkpoint lacks, after tied weights and the model's own ignore lists: "
        "transformers would re-initialise it at random, serving engines fail or load garbage; "
        "restore it (`ckpt-inspect repair --from REF`) or fix config.json.",
    )
    LOAD_UNEXPECTED_TENSOR = (
        "load-unexpected-tensor",
        _W,
        _L,
        "The checkpoint holds a tensor the model built from config.json would not load "
        "(transformers drops it; strict loaders refuse it): a config that names the wrong "
        "architecture or sizes, or a stray tensor; MTP layers are not reported.",
    )
    LOAD_SHAPE_MISMATCH = (
        "load-shape-mismatch",
        _E,
        _L,
        "A stored tensor (after transformers' own conversion, e.g. experts stacked) has another "
        "shape than the model built from config.json: loading fails, or with "
        "ignore_mismatched_sizes the weight is re-initialised; fix config.json or the tensor.",
    )
    # -- tensor data ------------------------------------------------------------------------
    TENSOR_ALL_ZERO = (
        "tensor-all-zero",
        _W,
        _X,
        "A tensor holds only zeros: often a tensor that was never written.",
    )
    TENSOR_NONFINITE = (
        "tensor-nonfinite",
        _E,
        _X,
        "A tensor holds NaN or Inf values.",
    )
    DUPLICATE_TENSOR_CONTENT = (
        "duplicate-tensor-content",
        _E,
        _X,
        "One tensor name in several shards with DIFFERENT bytes; loaders keep whichever they "
        "read last.",
    )
    DUPLICATE_TENSOR_IDENTICAL = (
        "duplicate-tensor-identical",
        _N,
        _X,
        "One tensor name in several shards with the same bytes; harmless but wasteful.",
    )
    TENSOR_UNINITIALISED = (
        "tensor-uninitialised",
        _E,
        _X,
        "A tensor's bits look like memory that was never written (torch.empty left as is): a "
        "large share of subnormal values, of magnitudes no weight reaches (> 1e30 in BF16/F32) "
        "or one repeated bit pattern, where the same tensor in the sibling layers or experts "
        "shows none. The converter skipped it (an unmapped expert, a name it did not know): "
        "re-export that tensor from the source checkpoint, or restore it with `ckpt-inspect "
        "repair --from REF`. (`check --values sample|full`)",
    )
    TENSOR_VALUES_OUTLIER = (
        "tensor-values-outlier",
        _W,
        _X,
        "A tensor's statistics are orders of magnitude off the same tensor in its sibling "
        "layers or experts (robust median and MAD over the siblings): std 0 where they vary, "
        "std 10x or more away, or absmax 100x or more away. A rescaled, half-converted or "
        "mis-mapped tensor makes a model that loads but talks gibberish: compare it with the "
        "source checkpoint (`ckpt-inspect diff --data`) and re-export it; `ckpt.values` shows "
        "the statistics of every sibling. (`check --values sample|full`)",
    )
    TENSOR_UNREADABLE = (
        "tensor-unreadable",
        _E,
        _X,
        "A tensor's bytes could not be read (an I/O error, a file that cannot be opened, a "
        "read that came back short because the file got shorter while it was read, or a "
        "remote read that failed): its values were not checked. Re-copy the file from its "
        "source, or check the disk or the connection, then run `check --values` or `check "
        "--deep` again. (Bytes past the end of a truncated file are `file-truncated`.)",
    )
    # -- untrusted input refused ---------------------------------------------------------------
    FILE_UNSAFE = (
        "file-unsafe",
        _E,
        _U,
        "A file the checkpoint names or holds is not a regular file (a FIFO, a device, a "
        "socket), is a link whose target leaves the checkpoint folder, or is a link loop; "
        "remotely, the server redirects it to another origin. It was not read (a FIFO would "
        "hang the reader, /dev/zero exhaust memory, a link to a file elsewhere leak it into "
        "reports, a redirect serve another server's file as this checkpoint); put the real "
        "file in the folder (or trust the origin with --allow-redirect). The Hugging Face "
        "cache layout (snapshots/<rev>/ linking into the same repository's blobs/) is "
        "allowed.",
    )
    PICKLE_HOSTILE = (
        "pickle-hostile",
        _E,
        _U,
        "A pickle (.metadata, common.pt, common state) names callables that run code or reach "
        "the system (subprocess.Popen, eval, os.system...). Refused before unpickling, nothing "
        "ran; do not load this checkpoint with plain torch.load or pickle.",
    )
    PICKLE_BOMB = (
        "pickle-bomb",
        _E,
        _U,
        "A pickle would take unbounded work or memory to unpickle (shared references that "
        "expand past the limit, nesting over 100 levels, a reference cycle, a huge integer). "
        "Refused before unpickling; the file was crafted or is corrupt.",
    )
    QUANT_PATTERN_REFUSED = (
        "quant-pattern-refused",
        _W,
        _U,
        "A module pattern of the quantization config (a compressed-tensors `re:` target or "
        "ignore entry in config.json or recipe.yaml, an hf_quant_config.json exclude_modules "
        "glob, a modules_to_not_convert glob) was not matched, or a module name could not be "
        "matched against it: the pattern needs a backtracking matcher (a backreference, a "
        "lookaround, an atomic group), is not a valid regular expression, or breaks a cap "
        "(pattern or name length, pattern count, matching time). Patterns run on a matcher "
        "without backtracking, so a hostile pattern cannot hang the check; the modules the "
        "pattern decides were NOT checked. Rewrite the pattern without those constructs (or "
        "list the module names); a hostile one also hangs the libraries that load it.",
    )
    CHECK_BUDGET_EXCEEDED = (
        "check-budget-exceeded",
        _W,
        _U,
        "A check would need more work than any real checkpoint asks for (e.g. the chunks of "
        "one tensor form no grid over millions of boundaries): it stopped at its budget, so "
        "what the finding names was NOT verified. A real writer never produces this; the file "
        "was crafted or is corrupt: re-save the checkpoint.",
    )
    TEMP_FILE_LEFT = (
        "temp-file-left",
        _W,
        _U,
        "The folder holds a file named like the temp files ckpt-inspect writes beside a "
        "target before renaming it (`.<name>.tmp-<pid>`, or the journal's): a repair, "
        "restore or consolidation was killed between writing it and renaming it, and its "
        "bytes take disk space nobody sees. The finding names each entry, its size and what "
        "it is; shard-sized leftovers are named too (a consolidation's `<shard>.partial` "
        "output, which `consolidate --resume` finishes, and the staging folder "
        "`.ckpt-inspect-reshard/` of a killed re-shard or restore, which the next one "
        "empties). `ckpt-inspect repair PATH --recover` removes those established as ours (a "
        "regular file of this user named exactly so for the journal, an index, the "
        "quantization config or a file the plan writes, whose process is gone, under the "
        "folder lock); a link, a folder, a file of a running pid or another user, and a name "
        "that only looks like ours are left as they are for you to review.",
    )

    # -- content against a source (verify) ----------------------------------------------------
    FILE_SIZE_MISMATCH = (
        "file-size-mismatch",
        _E,
        _V,
        "A file's size differs from what the source (the manifest, the Hub's listing, the other "
        "checkpoint) records: an interrupted or stitched copy. Copy the file again from the "
        "source, then run `ckpt-inspect verify` again.",
    )
    FILE_HASH_MISMATCH = (
        "file-hash-mismatch",
        _E,
        _V,
        "A file has the recorded size but not the recorded SHA-256: its bytes were damaged in "
        "transfer or on disk (or the source changed since). Copy the file again from the "
        "source; `--level tensor` names the tensors that differ.",
    )
    FILE_MISSING_VS_SOURCE = (
        "file-missing-vs-source",
        _E,
        _V,
        "The source records a file this copy does not have (an incomplete download or upload); "
        "copy it from the source.",
    )
    FILE_EXTRA_VS_SOURCE = (
        "file-extra-vs-source",
        _W,
        _V,
        "This copy has a file the source does not record: a leftover or a file added after the "
        "source was recorded. Remove it, or write the manifest again if it belongs.",
    )
    FILE_NOT_VERIFIED = (
        "file-not-verified",
        _W,
        _V,
        "The source records this file's size but no checksum (a Hub listing entry without "
        "lfs.oid or a git oid of the right form): the size matched, the bytes were NOT "
        "compared. Verify against a manifest, or read the source's copy with `verify "
        "--download`.",
    )
    TENSOR_HASH_MISMATCH = (
        "tensor-hash-mismatch",
        _E,
        _V,
        "A tensor's content hash (or its dtype or shape) differs from the source's: its values "
        "changed. Copy its file again from the source, or restore the tensor with "
        "`ckpt-inspect repair --from SOURCE`.",
    )
    TENSOR_MISSING_VS_SOURCE = (
        "tensor-missing-vs-source",
        _E,
        _V,
        "The source holds a tensor this checkpoint does not; restore it with `ckpt-inspect "
        "repair --from SOURCE`.",
    )
    TENSOR_EXTRA_VS_SOURCE = (
        "tensor-extra-vs-source",
        _W,
        _V,
        "This checkpoint holds a tensor the source does not record; it was added after the "
        "source was recorded, or the checkpoint is not the one the source describes.",
    )
    MANIFEST_UNREADABLE = (
        "manifest-unreadable",
        _E,
        _V,
        "The content manifest cannot be used (not JSON, another format or version, a name "
        "leaving the folder, a malformed size or hash, over a limit): nothing was verified "
        "against it. Write it again with `ckpt-inspect manifest` from a copy you trust.",
    )

    # -- serving: parallel plans and memory per GPU (fit) -------------------------------------
    PARALLEL_HEADS_INDIVISIBLE = (
        "parallel-heads-indivisible",
        _E,
        _F,
        "The tensor-parallel size does not divide the attention heads (or a hybrid model's "
        "Mamba or linear-attention heads, or its Mamba groups): vLLM and SGLang refuse to "
        "start (`ModelConfig.verify_with_parallel_config`, `QKVParallelLinear`, "
        "`MambaMixer2`). Pick a TP size that divides them.",
    )
    PARALLEL_KV_HEADS_INDIVISIBLE = (
        "parallel-kv-heads-indivisible",
        _E,
        _F,
        "The key/value heads cannot be spread over the tensor-parallel ranks: fewer KV heads "
        "than ranks and TP not a multiple of them, or more and not divisible by TP. vLLM and "
        "SGLang refuse to start (`QKVParallelLinear` divides them). Pick a TP size that "
        "divides the KV heads or is a multiple of them.",
    )
    PARALLEL_KV_HEADS_REPLICATED = (
        "parallel-kv-heads-replicated",
        _N,
        _F,
        "More tensor-parallel ranks than key/value heads: each KV head is replicated on "
        "TP / KV heads ranks, as the engines do. It serves, but each rank holds a whole KV "
        "head and its cache: weights and KV cache per GPU do not shrink past TP = KV heads.",
    )
    PARALLEL_BLOCK_MISALIGNED = (
        "parallel-block-misaligned",
        _E,
        _F,
        "A dimension tensor parallelism splits (a dense or MoE intermediate size, the "
        "attention output) does not divide by TP, or its share per rank is not a whole number "
        "of quantization blocks or groups (FP8 block, NVFP4 16, GPTQ / AWQ / "
        "compressed-tensors group size). The engines refuse to start (vLLM and SGLang "
        "`validate_fp8_block_shape`, `Fp8MoEMethod.create_weights`, NVFP4 and Marlin shape "
        "checks). Use a smaller TP, or expert parallelism for the experts (`--ep`).",
    )
    PARALLEL_EXPERTS_INDIVISIBLE = (
        "parallel-experts-indivisible",
        _E,
        _F,
        "The expert-parallel size does not divide the routed experts: SGLang refuses to start "
        "(`FusedMoE` asserts it); vLLM starts and gives the first ranks one expert more "
        "(`determine_expert_map`), so those ranks hold more weights. Pick an EP size that "
        "divides the experts.",
    )
    PARALLEL_STAGES_EXCEED_LAYERS = (
        "parallel-stages-exceed-layers",
        _E,
        _F,
        "More pipeline stages than decoder layers: a stage would hold no layer "
        "(`get_pp_indices` splits the decoder layers over the stages). Use fewer stages.",
    )
    PARALLEL_MTP_LAST_STAGE = (
        "parallel-mtp-last-stage",
        _N,
        _F,
        "The MTP (draft) layers are placed on the last pipeline stage, with the output head, "
        "as vLLM places the draft model (`GPUModelRunner`): that stage holds more weights "
        "than the others. They are loaded only when MTP speculative decoding is asked for.",
    )
    FIT_WEIGHTS_EXCEED_GPU = (
        "fit-weights-exceed-gpu",
        _E,
        _F,
        "The weights of the fullest rank, plus the estimate for activations, CUDA graphs and "
        "the CUDA context, exceed the GPU memory the engine may use (memory x "
        "--gpu-memory-utilization): the engine runs out of memory while loading or has no "
        "room for a KV cache. Use more GPUs (a larger TP, EP or PP) or a larger GPU.",
    )
    FIT_CONTEXT_EXCEEDS_GPU = (
        "fit-context-exceeds-gpu",
        _E,
        _F,
        "The KV cache of one sequence of the asked context (by default the model's "
        "max_position_embeddings, which vLLM serves unless --max-model-len says otherwise) "
        "does not fit next to the weights: vLLM refuses to start "
        "(`check_enough_kv_cache_memory`). Serve a shorter context (the finding gives the "
        "longest that fits), a smaller KV cache dtype, or more GPUs.",
    )
    FIT_CONFIG_INVALID = (
        "fit-config-invalid",
        _W,
        _F,
        "A value config.json gives for serving (heads, head size, layers, window, Mamba "
        "state...) is missing, not a whole number, not positive, or past any real model's: "
        "what depends on it (a divisibility rule, the KV cache, the longest context) was NOT "
        "computed. Fix config.json from the model's release.",
    )

    # -- serving engines: what vLLM and llama.cpp would load ---------------------------------
    ENGINE_WEIGHT_UNMAPPED = (
        "engine-weight-unmapped",
        _E,
        _G,
        "The serving engine's own weight loading (vLLM's `load_weights`, run on a meta model "
        "with the stored names, shapes and dtypes) stopped on a stored tensor it has no "
        "parameter for (`There is no module or parameter named ...`, a KeyError): the engine "
        "refuses to start. The message is the engine's, verbatim. Rename or drop the tensor, "
        "or check that config.json names the right architecture and quantization.",
    )
    ENGINE_SHAPE_MISMATCH = (
        "engine-shape-mismatch",
        _E,
        _G,
        "A stored tensor's shape is not the one the serving engine's parameter takes: the "
        "engine's weight loading raised (its message, verbatim), or it copied the tensor "
        "without a word while the element counts differ (vLLM cuts an oversized tensor and "
        "takes an undersized expert tensor as it is). Re-export the tensor, or fix config.json.",
    )
    ENGINE_WEIGHT_MISSING = (
        "engine-weight-missing",
        _E,
        _G,
        "A parameter of the serving engine's model that its weight loading never received, "
        "or a part of a fused parameter (q/k/v of qkv_proj, gate/up, one expert of the "
        "stacked experts) no stored tensor filled: the engine serves it uninitialised. vLLM "
        "checks this only for unquantized checkpoints, and skips modules whose weights are "
        "post-processed (o_proj, lm_head), so a quantized checkpoint missing a tensor loads "
        "silently. KV-cache scales are exempt, as vLLM exempts them. Restore the tensor "
        "(`ckpt-inspect repair --from REF`).",
    )
    ENGINE_LOAD_FAILED = (
        "engine-load-failed",
        _E,
        _G,
        "The serving engine's own weight loading raised another exception than an unmapped "
        "name or a shape (its message, verbatim): the engine would not start with this "
        "checkpoint. Read the message; it names what the engine could not use.",
    )
    ENGINE_QUANT_UNSUPPORTED = (
        "engine-quant-unsupported",
        _E,
        _G,
        "The engine does not run this quantization scheme on the chosen GPU's compute "
        "capability (its documented support table, with the version the table comes from): "
        "it refuses to start. Serve on a newer GPU, with another engine, or a checkpoint "
        "quantized with a scheme the GPU supports.",
    )
    ENGINE_QUANT_FALLBACK = (
        "engine-quant-fallback",
        _N,
        _G,
        "The engine runs this quantization scheme on the chosen GPU only through a fallback "
        "kernel (e.g. weight-only Marlin: the weights stay quantized, the matmuls run in 16 "
        "bits): it serves, slower than natively and without the activation quantization.",
    )
    GGUF_TENSOR_MISSING = (
        "gguf-tensor-missing",
        _E,
        _G,
        "A GGUF lacks tensors llama.cpp creates for its architecture: blocks up to "
        '{arch}.block_count that hold no tensor (llama.cpp stops with "missing tensor"), or '
        "rope_freqs where config.json scales RoPE as Llama 3 (it then loads, with wrong "
        "positions past the original context). Re-convert from the complete model.",
    )
    GGUF_TENSOR_UNEXPECTED = (
        "gguf-tensor-unexpected",
        _E,
        _G,
        "A GGUF holds tensors llama.cpp does not create for its architecture and block count "
        "(gguf-py's MODEL_TENSORS): it refuses the file with \"wrong number of tensors; "
        'expected N, got M". Re-convert with the llama.cpp the file is meant for, or fix '
        "block_count.",
    )
    GGUF_CONVERT_UNMAPPED = (
        "gguf-convert-unmapped",
        _E,
        _G,
        "Stored tensors llama.cpp's convert_hf_to_gguf.py cannot map to GGUF names for the "
        "config's architecture (gguf-py's TensorNameMap): the conversion stops with \"Can not "
        "map tensor\". Remove or rename them, or check config.json's architecture.",
    )
    TIED_HEAD_DIFFERS = (
        "tied-head-differs",
        _E,
        _G,
        "config.json ties the output head to the embedding (tie_word_embeddings: true) and the "
        "checkpoint stores an lm_head whose values differ from the embedding's: vLLM and "
        "transformers discard the stored head and use the embedding, and the model generates "
        "gibberish. Set tie_word_embeddings to false, or drop the stored head if the "
        "embedding is the one trained.",
    )
    DRAFT_TARGET_MISMATCH = (
        "draft-target-mismatch",
        _E,
        _G,
        "A draft model (EAGLE, EAGLE-3, MTP) does not fit its target: another hidden size, or "
        "a vocabulary of another size than the target's (or than its d2t / t2d mapping): "
        "the engine refuses to start speculative decoding, or proposes tokens the target "
        "never accepts. Use the draft trained for this target.",
    )
    DRAFT_MAPPING_INVALID = (
        "draft-mapping-invalid",
        _E,
        _G,
        "An EAGLE-3 draft's vocabulary mapping is unusable: d2t is not one integer per draft "
        "token, t2d not one boolean per target token, their counts disagree, or a d2t offset "
        "sends a draft token outside the target's vocabulary. Re-export the draft with its "
        "mapping.",
    )
    DRAFT_HEAD_FROM_TARGET = (
        "draft-head-from-target",
        _N,
        _G,
        "The draft model stores no output head (or embedding): the engine takes the target's "
        "(vLLM shares them when the draft lacks them), so the draft works only with a target "
        "whose head has the same vocabulary and hidden size.",
    )


# The fix of every code (a test checks each code has one). Issues (`diagnosis/issues.py`), the
# CLI, the reports and docs/findings.md take it from here.
_FIXES: dict[str, Fix] = {
    # -- shard integrity
    "header-unreadable": Fix("restore", "re-copy the shard from its source, or re-export it"),
    "header-invalid-entry": Fix(
        "re-export", "re-export the shard: its writer produced a broken header"
    ),
    "header-duplicate-key": Fix(
        "re-export", "re-export the shard so that each tensor name appears once"
    ),
    "unknown-dtype": Fix("re-export", "re-export the tensor in a safetensors dtype a loader reads"),
    "size-mismatch": Fix("re-export", "re-export the shard: the header and the data disagree"),
    "offset-invalid": Fix("restore", "re-copy the shard from its source, or re-export it"),
    "file-truncated": Fix(
        "restore", "re-copy the shard (an interrupted copy or write), or re-export it"
    ),
    "trailing-bytes": Fix("restore", "re-copy the shard from its source, or re-export it"),
    # -- index against shards
    "index-unreadable": Fix(
        "repair", "rebuild the index from the shard headers (`ckpt-inspect repair`)"
    ),
    "index-unsafe-path": Fix(
        "repair",
        "do not load the index as is: rebuild it from the shard headers (`ckpt-inspect repair`)",
    ),
    "index-missing-file": Fix(
        "restore",
        "copy the missing shard again, or rebuild the index without it (`ckpt-inspect repair`)",
    ),
    "index-dangling-tensor": Fix(
        "repair", "rebuild the index from the shard headers (`ckpt-inspect repair`)"
    ),
    "index-wrong-file": Fix(
        "repair", "rebuild the index from the shard headers (`ckpt-inspect repair`)"
    ),
    "unindexed-tensor": Fix(
        "repair", "rebuild the index so that it lists every stored tensor (`ckpt-inspect repair`)"
    ),
    "duplicate-tensor": Fix(
        "review", "decide which copy is right, remove the other, then rebuild the index"
    ),
    "total-size-mismatch": Fix(
        "repair", "rebuild the index, which recomputes metadata.total_size (`ckpt-inspect repair`)"
    ),
    "total-parameters-mismatch": Fix(
        "repair",
        "rebuild the index, which recounts metadata.total_parameters (`ckpt-inspect repair`)",
    ),
    # -- per-layer sidecars
    "sidecar-missing": Fix(
        "repair", "rebuild the sidecars from their shards (`ckpt-inspect repair --only sidecars`)"
    ),
    "sidecar-unlisted-tensor": Fix(
        "repair",
        "rebuild each sidecar from its shard's header (`ckpt-inspect repair --only sidecars`)",
    ),
    "sidecar-dangling-tensor": Fix(
        "repair",
        "rebuild each sidecar from its shard's header (`ckpt-inspect repair --only sidecars`)",
    ),
    "sidecar-total-size-mismatch": Fix(
        "repair",
        "rebuild each sidecar from its shard's header (`ckpt-inspect repair --only sidecars`)",
    ),
    "sidecar-index-disagree": Fix(
        "repair", "rebuild the sidecars and the index from the shards (`ckpt-inspect repair`)"
    ),
    "sidecar-unreadable": Fix(
        "repair",
        "rebuild the sidecar from its shard's header (`ckpt-inspect repair --only sidecars`)",
    ),
    # -- model structure
    "config-unreadable": Fix(
        "restore", "restore config.json from the training run or the original release"
    ),
    "layer-missing": Fix("re-export", "re-export the layer from the training checkpoint"),
    "expert-missing": Fix("re-export", "re-export the experts from the training checkpoint"),
    "expert-incomplete": Fix(
        "re-export", "re-export the expert with all its projections and scales"
    ),
    "expert-shape-mismatch": Fix(
        "re-export", "re-export the expert; its siblings show the expected shape and dtype"
    ),
    "mtp-missing": Fix(
        "re-export",
        "re-export with the MTP layers, or set the config's MTP layer count to 0 if the "
        "model has none",
    ),
    "mtp-not-stored": Fix(
        "restore",
        "restore the MTP layers with `ckpt-inspect repair --from <original release>` if "
        "serving needs them",
    ),
    "layer-keyset-outlier": Fix(
        "review",
        "compare the layer's keys with its siblings' in the Tensors tab; the exporter "
        "built that layer's state dict differently",
    ),
    "quant-config-missing-layer": Fix(
        "repair", "add the modules to quantized_layers (`ckpt-inspect repair --only quant-config`)"
    ),
    "quant-config-stale-layer": Fix(
        "review", "remove the stale quantized_layers entries, or restore the modules' tensors"
    ),
    "quant-config-unreadable": Fix("restore", "restore hf_quant_config.json from the export"),
    # -- DCP
    "dcp-sharding-info-missing": Fix(
        "re-export",
        "re-save the rank's file with the DCP writer, or move a stray non-DCP file out of"
        " the folder",
    ),
    "dcp-coverage-gap": Fix(
        "restore", "copy the missing or short rank files again, or re-save the checkpoint"
    ),
    "dcp-chunk-overlap": Fix("re-export", "re-save the checkpoint from the training job"),
    "dcp-dtype-conflict": Fix("re-export", "re-save the checkpoint from the training job"),
    "mapping-collapsed": Fix(
        "consolidate",
        "consolidate with a reference index or greedy packing (`ckpt-inspect consolidate`)",
    ),
    "mapping-unmapped-tensor": Fix(
        "consolidate",
        "consolidation places them itself; give a reference index to decide their files",
    ),
    "mapping-dangling-tensor": Fix("review", "harmless for consolidation (e.g. a tied alias)"),
    "mapping-unreadable": Fix(
        "consolidate", "consolidate with a reference index instead of the unreadable mapping"
    ),
    # -- torch_dist
    "torch-dist-missing-file": Fix("restore", "copy the missing or short .distcp files again"),
    "torch-dist-metadata-unreadable": Fix("restore", "copy .metadata again, or re-save"),
    "torch-dist-chunk-gap": Fix("re-export", "re-save the checkpoint from the training job"),
    "torch-dist-chunk-overlap": Fix("re-export", "re-save the checkpoint from the training job"),
    "torch-dist-metadata-json": Fix(
        "review", "re-save with Megatron's distributed checkpointing, which writes metadata.json"
    ),
    "torch-dist-common-unreadable": Fix("restore", "copy common.pt again, or re-save"),
    "torch-dist-common-drift": Fix(
        "re-export",
        "re-save the checkpoint from the training job; the finding says which state "
        "disagrees and how to load it meanwhile",
    ),
    "torch-dist-object-incomplete": Fix(
        "restore", "restore the lost ranks' objects from the original save, or re-save"
    ),
    # -- load
    "load-missing-tensor": Fix(
        "restore", "restore the tensor (`ckpt-inspect repair --from REF`) or fix config.json"
    ),
    "load-unexpected-tensor": Fix(
        "review",
        "check that config.json names the right architecture and sizes, or remove the stray tensor",
    ),
    "load-shape-mismatch": Fix(
        "review", "fix config.json or re-export the tensor with the model's shape"
    ),
    # -- deep
    "tensor-all-zero": Fix(
        "re-export", "re-export: a tensor that was never written saves as zeros"
    ),
    "tensor-nonfinite": Fix("re-export", "re-export from a step whose weights are finite"),
    "duplicate-tensor-content": Fix(
        "review",
        "decide which copy is right, remove the other shard's copy, then rebuild the index",
    ),
    "duplicate-tensor-identical": Fix("review", "harmless: remove the extra copy to save space"),
    "tensor-uninitialised": Fix(
        "re-export",
        "re-export that tensor from the source checkpoint (the converter skipped it), or "
        "restore it from a healthy copy (`ckpt-inspect repair --from REF`)",
    ),
    "tensor-values-outlier": Fix(
        "re-export",
        "compare it with the source checkpoint (`ckpt-inspect diff --data`) and re-export it; "
        "`ckpt.values` shows the statistics of every sibling",
    ),
    "tensor-unreadable": Fix(
        "restore",
        "re-copy the file from its source (or check the disk or the connection), then run "
        "`check --values` or `check --deep` again",
    ),
    # -- unsafe input
    "file-unsafe": Fix(
        "review",
        "put the real file in the checkpoint folder under a plain name (a copy, not a link "
        "to a file elsewhere) or remove the entry",
    ),
    "pickle-hostile": Fix(
        "review",
        "do not load this checkpoint with plain torch.load or pickle, and tell whoever shared it",
    ),
    "pickle-bomb": Fix(
        "restore", "the file was crafted or is corrupt: restore it from the original save"
    ),
    "quant-pattern-refused": Fix(
        "review",
        "rewrite the pattern without backreferences or lookarounds (or list the module names "
        "it means), within the caps; do not load a checkpoint whose pattern was crafted",
    ),
    "check-budget-exceeded": Fix(
        "re-export", "re-save the checkpoint: a real writer never produces this"
    ),
    "unindexed-file": Fix("review", "remove the stray file, or rebuild the index to include it"),
    "temp-file-left": Fix(
        "review",
        "run `ckpt-inspect repair PATH --recover`, which removes the temp files a killed run "
        "left; delete the entries it keeps yourself once you know no run writes the folder",
    ),
    "weights-named-by-config": Fix(
        "review",
        "remove transformers_weights from config.json, so that every loader reads the same "
        "files, or keep only the weights it names",
    ),
    # -- PyTorch .bin files
    "bin-legacy-format": Fix(
        "re-export",
        "load it with torch >= 1.6 (torch.load(path, weights_only=True)) and save it again "
        "with safetensors' save_file or torch.save",
    ),
    "bin-unreadable": Fix("restore", "re-copy the file from its source, or re-save it"),
    "bin-record-missing": Fix("restore", "re-copy the file, or re-save it from the source"),
    # -- GGUF files
    "gguf-unreadable": Fix("restore", "re-download or re-convert the file"),
    "gguf-unknown-type": Fix("re-export", "re-convert it with a current llama.cpp / gguf"),
    "gguf-split-missing": Fix("restore", "download the missing parts"),
    "gguf-split-tensor-count-mismatch": Fix(
        "restore", "re-download the parts, or re-split the model"
    ),
    "gguf-split-inconsistent": Fix(
        "restore", "re-download the parts, or re-split them together from one conversion"
    ),
    # -- compressed-tensors and block-scaled quantization
    "quant-scheme-mismatch": Fix(
        "re-export",
        "re-export the module with the scheme the config names, or fix the config to what "
        "was exported",
    ),
    "quant-recipe-mismatch": Fix("review", "re-export, or make recipe.yaml and config.json agree"),
    # -- content against a source (verify)
    "file-size-mismatch": Fix(
        "restore", "copy the file again from the source, then run `ckpt-inspect verify` again"
    ),
    "file-hash-mismatch": Fix(
        "restore",
        "copy the file again from the source; `verify --level tensor` names the tensors that "
        "differ",
    ),
    "file-missing-vs-source": Fix("restore", "copy the file from the source"),
    "file-extra-vs-source": Fix(
        "review", "remove the file, or write the manifest again if it belongs"
    ),
    "tensor-hash-mismatch": Fix(
        "restore",
        "copy its file again from the source, or restore the tensor with "
        "`ckpt-inspect repair --from SOURCE`",
    ),
    "tensor-missing-vs-source": Fix(
        "restore", "restore it with `ckpt-inspect repair --from SOURCE`"
    ),
    "tensor-extra-vs-source": Fix(
        "review", "check that the source is the one this checkpoint was made from"
    ),
    "file-not-verified": Fix(
        "review",
        "verify against a manifest written from a copy you trust, or run `ckpt-inspect "
        "verify --download` to hash the source's copy",
    ),
    "manifest-unreadable": Fix(
        "review", "write it again with `ckpt-inspect manifest` from a copy you trust"
    ),  # -- serving (fit)
    "parallel-heads-indivisible": Fix(
        "review",
        "serve with a TP size that divides the heads; `ckpt-inspect fit PATH` lists the "
        "plans that start",
    ),
    "parallel-kv-heads-indivisible": Fix(
        "review", "serve with a TP size that divides the KV heads or is a multiple of them"
    ),
    "parallel-kv-heads-replicated": Fix(
        "review", "nothing to fix; a TP size up to the KV heads uses memory better"
    ),
    "parallel-block-misaligned": Fix(
        "review",
        "serve with a smaller TP size, or with expert parallelism for the experts (`--ep`)",
    ),
    "parallel-experts-indivisible": Fix(
        "review", "serve with an EP size that divides the routed experts"
    ),
    "parallel-stages-exceed-layers": Fix("review", "serve with fewer pipeline stages"),
    "parallel-mtp-last-stage": Fix(
        "review",
        "nothing to fix; leave room on the last stage, or serve without MTP speculative decoding",
    ),
    "fit-weights-exceed-gpu": Fix(
        "review", "serve on more GPUs (a larger TP, EP or PP) or on GPUs with more memory"
    ),
    "fit-context-exceeds-gpu": Fix(
        "review",
        "serve a shorter context (`--max-model-len`), a smaller KV cache dtype "
        "(`--kv-cache-dtype fp8`) or on more GPUs",
    ),
    "fit-config-invalid": Fix("review", "fix config.json from the model's release"),
    # -- serving engines
    "engine-weight-unmapped": Fix(
        "review",
        "rename or drop the tensor the engine names, or fix config.json's architecture or "
        "quantization_config",
    ),
    "engine-shape-mismatch": Fix(
        "re-export", "re-export the tensor with the engine's shape, or fix config.json"
    ),
    "engine-weight-missing": Fix(
        "restore", "restore the tensor (`ckpt-inspect repair --from REF`) or re-export it"
    ),
    "engine-load-failed": Fix(
        "review", "read the engine's message: it names what it could not use"
    ),
    "engine-quant-unsupported": Fix(
        "review",
        "serve on a GPU the scheme supports, with another engine, or from a checkpoint "
        "quantized with a supported scheme",
    ),
    "engine-quant-fallback": Fix("review", "nothing to fix; a newer GPU runs the scheme natively"),
    "gguf-tensor-missing": Fix("re-export", "re-convert the GGUF from the complete model"),
    "gguf-tensor-unexpected": Fix(
        "re-export",
        "re-convert with the llama.cpp the file is meant for, or fix {arch}.block_count",
    ),
    "gguf-convert-unmapped": Fix(
        "review", "remove or rename the tensors, or fix config.json's architectures"
    ),
    "tied-head-differs": Fix(
        "review",
        "set tie_word_embeddings to false in config.json if the stored head is the trained "
        "one; otherwise drop the stored lm_head",
    ),
    "draft-target-mismatch": Fix("review", "use the draft trained for this target"),
    "draft-mapping-invalid": Fix("re-export", "re-export the draft with its d2t / t2d mapping"),
    "draft-head-from-target": Fix(
        "review", "nothing to fix; serve it with the target it was trained for"
    ),
}

for _code in Code:
    _code.fix = _FIXES[_code.value]


def code_of(value: str | Code) -> Code:
    """The `Code` whose string is `value`; a ValueError names an unknown one (a bug)."""
    try:
        return _BY_VALUE[value]
    except KeyError:
        raise ValueError(f"{value!r} is not a finding code") from None


def code_set(*codes: str | Code) -> frozenset[Code]:
    """Codes checked at import time: a misspelt code in a rule's set fails loudly."""
    return frozenset(map(code_of, codes))


_BY_VALUE: dict[str, Code] = {c.value: c for c in Code}

# Read-only views for callers that want plain mappings (the public `CODES` predates `Code`).
CODES: Mapping[str, Severity] = MappingProxyType({c.value: c.severity for c in Code})
CODE_HELP: Mapping[str, str] = MappingProxyType({c.value: c.help for c in Code})


def codes_in_group(group: str) -> Iterable[Code]:
    """The codes listed under `group`, in table order."""
    return (c for c in Code if c.group == group)


def codes_markdown() -> str:
    """The code reference as Markdown (`docs/findings.md` is this text; a test keeps them
    equal, and `ckpt-inspect codes --markdown` prints it)."""
    lines = [
        "# Finding codes",
        "",
        "Every problem checkpoint-inspector reports is a finding with a stable `code`, a "
        "`severity` (`error`, `warning`, `info`), a message a person can act on, and where "
        "known the `file`, `tensor`, `layer` and `expert` it concerns. Codes are an interface: "
        "CI scripts gate on them (`ckpt-inspect check --fail-on`), reports group by them and "
        "repairs are planned from them. A code is never renamed or removed; new ones are added.",
        "",
        "Generated from `inspector._internal.findings.codes.Code` by `make docs` "
        "(or `ckpt-inspect codes --markdown`); edit the table there, not this file.",
    ]
    for group in GROUPS:
        rows = list(codes_in_group(group))
        if not rows:
            continue
        lines += [
            "",
            f"## {group}",
            "",
            "| code | severity | meaning | fix |",
            "|---|---|---|---|",
        ]
        lines += [
            f"| `{c.value}` | {c.severity.value} | {c.help.replace('|', '/')} "
            f"| {c.fix.kind}: {c.fix.text.replace('|', '/')} |"
            for c in rows
        ]
    return "\n".join(lines) + "\n"
