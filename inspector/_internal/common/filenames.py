"""Well-known file names: the one table of names whose role in a checkpoint folder is fixed
by the name alone (docs/formats.md).

A file named here is what its name says, whatever else the folder holds: `config.json` is
the model config even next to a `config.safetensors`, so it is never read as that file's
per-layer sidecar and no repair ever writes one over it. Readers, checks and writers take
these names from here; a rule about a name lives in one place.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

__all__ = [
    "BACKUP_DIR",
    "BIN_INDEX_NAME",
    "BIN_WEIGHTS_NAME",
    "CONFIG_NAME",
    "DCP_MAPPING_NAME",
    "GENERATION_CONFIG_NAME",
    "HF_METADATA_DIR",
    "INDEX_NAME",
    "INDEX_SUFFIX",
    "JOURNAL",
    "LOCK",
    "MANIFEST_NAME",
    "QUANT_CONFIG_NAME",
    "RECIPE_NAME",
    "SAFETENSORS_WEIGHTS_NAME",
    "STAGING",
    "TORCH_DIST_COMMON",
    "TORCH_DIST_LATEST",
    "TORCH_DIST_METADATA",
    "TORCH_DIST_METADATA_JSON",
    "WELL_KNOWN",
    "is_well_known",
    "role_of",
]

INDEX_NAME = "model.safetensors.index.json"
BIN_INDEX_NAME = "pytorch_model.bin.index.json"
# The one-file weights: transformers reads them alone, without the index beside them, when
# they exist (`modeling_utils._get_resolved_checkpoint_files`: `SAFE_WEIGHTS_NAME` before
# `SAFE_WEIGHTS_INDEX_NAME`, `WEIGHTS_NAME` before `WEIGHTS_INDEX_NAME`). Shards, not in
# `WELL_KNOWN`: a consolidation writes the first.
SAFETENSORS_WEIGHTS_NAME = "model.safetensors"
BIN_WEIGHTS_NAME = "pytorch_model.bin"
CONFIG_NAME = "config.json"
GENERATION_CONFIG_NAME = "generation_config.json"
QUANT_CONFIG_NAME = "hf_quant_config.json"
# llm-compressor's record of the quantization it ran, beside a compressed-tensors export.
RECIPE_NAME = "recipe.yaml"
# PyTorch DCP's Hugging Face writer: `.hf_metadata/fqn_to_file_index_mapping.json`, with the
# config and index of the model it was saved from beside it.
HF_METADATA_DIR = ".hf_metadata"
DCP_MAPPING_NAME = "fqn_to_file_index_mapping.json"
# Megatron torch_dist.
TORCH_DIST_METADATA = ".metadata"
TORCH_DIST_METADATA_JSON = "metadata.json"
TORCH_DIST_COMMON = "common.pt"
TORCH_DIST_LATEST = "latest_checkpointed_iteration.txt"
# What checkpoint-inspector itself writes into a folder it repairs
# (inspector._internal.execution.atomic).
LOCK = ".ckpt-inspect.lock"
JOURNAL = ".ckpt-inspect-journal.json"
BACKUP_DIR = ".ckpt-inspect-backup"
# The content manifest `ckpt-inspect manifest` writes (docs/verify.md): visible, so that it is
# uploaded and copied with the checkpoint and a copy can be verified against it.
MANIFEST_NAME = "ckpt-inspect-manifest.json"
STAGING = ".ckpt-inspect-reshard"

# Every `<weights>.index.json` (`model.safetensors.index.json`, `pytorch_model.bin.index.json`,
# diffusers' `diffusion_pytorch_model.safetensors.index.json`) is an index.
INDEX_SUFFIX = ".index.json"

# name -> what it is. Names a loader, trainer or exporter gives a fixed meaning.
WELL_KNOWN: Mapping[str, str] = MappingProxyType(
    {
        INDEX_NAME: "the safetensors weight-map index",
        BIN_INDEX_NAME: "the PyTorch weight-map index",
        CONFIG_NAME: "the model config",
        GENERATION_CONFIG_NAME: "the generation config",
        QUANT_CONFIG_NAME: "the Model-Optimizer quantization config",
        RECIPE_NAME: "the llm-compressor recipe",
        "quantization_config.json": "a quantization config",
        "quant_config.json": "a quantization config",
        "adapter_config.json": "the PEFT adapter config",
        "preprocessor_config.json": "the preprocessor config",
        "processor_config.json": "the processor config",
        "video_preprocessor_config.json": "the video preprocessor config",
        "feature_extractor_config.json": "the feature extractor config",
        "image_processor_config.json": "the image processor config",
        "tokenizer.json": "the tokenizer",
        "tokenizer_config.json": "the tokenizer config",
        "special_tokens_map.json": "the tokenizer's special tokens",
        "added_tokens.json": "the tokenizer's added tokens",
        "vocab.json": "the tokenizer vocabulary",
        "chat_template.json": "the chat template",
        "params.json": "the model parameters (Mistral format)",
        "model_index.json": "the diffusers pipeline index",
        "modules.json": "the sentence-transformers modules",
        "sentence_bert_config.json": "the sentence-transformers config",
        "config_sentence_transformers.json": "the sentence-transformers config",
        "trainer_state.json": "the trainer state",
        DCP_MAPPING_NAME: "the DCP file-index mapping",
        TORCH_DIST_METADATA: "the torch_dist / DCP metadata",
        TORCH_DIST_METADATA_JSON: "the torch_dist metadata",
        TORCH_DIST_COMMON: "the torch_dist common state",
        TORCH_DIST_LATEST: "the Megatron iteration tracker",
        LOCK: "checkpoint-inspector's lock",
        JOURNAL: "checkpoint-inspector's write journal",
        MANIFEST_NAME: "checkpoint-inspector's content manifest",
    }
)


def role_of(name: str) -> str | None:
    """The role the file `name` (a name in the folder, or a path whose last part is judged)
    has by its name alone, in words ("the model config"): a row of `WELL_KNOWN`, or "an
    index" for any other `*.index.json`; None for a name that fixes no role."""
    base = name.rsplit("/", 1)[-1]
    if base in WELL_KNOWN:
        return WELL_KNOWN[base]
    return "an index" if base.endswith(INDEX_SUFFIX) else None


def is_well_known(name: str) -> bool:
    """True when the file `name` has a role fixed by its name (`role_of`)."""
    return role_of(name) is not None
