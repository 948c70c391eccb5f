"""The naming rules: which tensor-name families exist, where their layer and expert numbers
are, what kind of block each name belongs to, and the file and key names writers number.

This is the table a person edits to support a new naming scheme (add a `Family`, a kind
rule or a pattern); `inspector._internal.checkpoint.naming` is the engine that applies it to many
names at once. Every layer, expert or rank number the project reads from a name comes from here.
Families and spellings are described in docs/formats.md.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = [
    "BUFFER_PARAMS",
    "DCP_SHARD_FILE",
    "DISTCP_FILE",
    "EXPERT_MODULE",
    "FAMILIES",
    "HF_SHARD_NUMBER",
    "KINDS",
    "KIND_RULES",
    "KV_SCALE_PARAMS",
    "LAYERS_CONTAINER",
    "MTP_OWN_KINDS",
    "QUANT_AUX_PARAMS",
    "QUANT_SIBLING_PARAMS",
    "RERUN_SHARD_KEY",
    "SHARDED_OBJECT_KEY",
    "Family",
    "expert_template",
]

KINDS = (
    "embedding",
    "attention",
    "dense_mlp",
    "expert",
    "shared_expert",
    "router",
    "norm",
    "mtp",
    "output_head",
    "mamba",
    "other",
)


@dataclass(frozen=True, slots=True)
class Family:
    """One naming scheme. `prefix` is matched at the start of a template; its named group
    `layer` (if any) is the layer number, and everything it consumes is stripped from the
    module name (use a lookahead to recognise without stripping)."""

    name: str
    prefix: re.Pattern[str]
    mtp: bool = False
    # Megatron torch_dist stacks homogeneous layers into one tensor with a leading layer axis.
    stacked: bool = False
    # Forces the kind, e.g. vision towers are "other" whatever their inner names say.
    kind: str | None = None


def _family(name: str, prefix: str, **options: object) -> Family:
    return Family(name, re.compile(prefix), **options)  # type: ignore[arg-type]


# Text-model roots in front of `layers.{L}` (plain, multimodal and older HF spellings).
_HF = (
    r"(?:model\.(?:language_model\.|text_model\.|decoder\.)?"
    r"|language_model\.(?:model\.)?|transformer\.|gpt_neox\.)?"
)
_TOWERS = (
    r"visual|vision_tower|vision_model|vision_encoder|vision|audio_tower|audio_model|audio"
    r"|multi_modal_projector|mm_projector"
)

# Tried in order; the first match wins.
FAMILIES: tuple[Family, ...] = (
    _family(
        "mtp",
        r"^(?:model\.)?mtp\.layers\.(?P<layer>#)\.(?:(?:transformer_layer|mtp_model_layer)\.)?",
        mtp=True,
    ),
    _family("mtp", r"^(?=(?:model\.)?mtp\.)", mtp=True),
    _family("vision", rf"^(?=(?:model\.)?(?:{_TOWERS})\.)", kind="other"),
    _family("megatron", r"^(?:module\.)?decoder\.layers\.(?P<layer>#)\."),
    _family("megatron-stacked", r"^(?:module\.)?decoder\.layers\.(?!#\.)", stacked=True),
    _family("megatron", r"^(?=(?:module\.)?(?:embedding|output_layer|decoder)\.)"),
    _family("nemotron-h", r"^backbone\.layers\.(?P<layer>#)\."),
    _family("nemotron-h", r"^(?=backbone\.)"),
    _family("mixtral", rf"^{_HF}layers\.(?P<layer>#)\.(?=block_sparse_moe\.)"),
    _family(
        "fused-experts", rf"^{_HF}layers\.(?P<layer>#)\.(?=(?:mlp|feed_forward)\.experts\.[a-z_]+$)"
    ),
    _family(
        "hf-moe",
        rf"^{_HF}layers\.(?P<layer>#)\."
        r"(?=(?:mlp|feed_forward)\.(?:experts|shared_experts?|shared_expert_gate|gate|router)\.)",
    ),
    _family("hf", rf"^{_HF}layers\.(?P<layer>#)\."),
    _family("other", r"^(?:.*\.)?(?:layers|layer|h|blocks)\.(?P<layer>#)\."),
    _family("hf", r"^(?=model\.|lm_head\.)"),
    _family("other", r"^"),
)


def _tokens(*words: str) -> str:
    return r"(?:^|\.)(?:" + "|".join(words) + r")(?:\.|$)"


# (kind, pattern) tried in order on "module.param" with layer prefix and expert number removed.
KIND_RULES: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (kind, re.compile(pattern))
    for kind, pattern in (
        ("mtp", _tokens("enorm", "hnorm", "eh_proj", "shared_head")),
        ("shared_expert", _tokens("shared_experts?", "shared_expert_gate")),
        ("expert", _tokens("experts", "local_experts")),
        ("router", _tokens("gate", "router")),
        (
            "mamba",
            _tokens("mamba", "ssm")
            + r"|(?:^|\.)mixer\.(?:A_log|D|dt_bias|conv1d|in_proj|out_proj|norm)(?:\.|$)",
        ),
        (
            "attention",
            _tokens(
                "self_attn",
                "self_attention",
                "attention",
                "attn",
                "cross_attn",
                "linear_attn",
                "core_attention",
                "q_proj",
                "k_proj",
                "v_proj",
                "o_proj",
                "qkv_proj",
                "linear_qkv",
                "query_key_value",
                "c_attn",
            ),
        ),
        (
            "dense_mlp",
            _tokens(
                "mlp",
                "feed_forward",
                "ffn",
                "block_sparse_moe",
                "gate_proj",
                "up_proj",
                "down_proj",
                "gate_up_proj",
                "linear_fc1",
                "linear_fc2",
                "fc1",
                "fc2",
                "c_fc",
                "w1",
                "w2",
                "w3",
            ),
        ),
        (
            "embedding",
            _tokens(
                "embed_tokens",
                "word_embeddings",
                "embeddings",
                "embedding",
                "wte",
                "wpe",
                "tok_embeddings",
                "embed_in",
            ),
        ),
        ("output_head", _tokens("lm_head", "output_layer", "embed_out")),
        ("norm", r"(?:^|\.)(?:\w*norm\w*|ln|ln_\w+)(?:\.|$)"),
    )
)

# In MTP blocks, whatever is not a standard block part belongs to the MTP head itself.
MTP_OWN_KINDS = frozenset({"norm", "embedding", "output_head", "other"})
# Template patterns the parsing engine applies (`#` stands for a number):
# an expert number inside a module path,
EXPERT_NUMBER = re.compile(r"(?:^|\.)(?:experts|local_experts)\.#(?=\.|$)")
# a ModelOpt quantizer parameter (`<module>.input_quantizer._amax`),
QUANTIZER_PARAM = re.compile(r"^(.*)\.(\w+_quantizer\.\w+)$")
# a TEGroupedMLP parameter numbered by expert (`linear_fc1.weight7`),
GROUPED_PARAM = re.compile(r"^(.*)\.(weight|bias|_extra_state)#$")
# a fused all-experts projection (GPT-OSS `experts.gate_up_proj_blocks`),
FUSED_PARAM = re.compile(r"^(gate_up_proj|gate_proj|up_proj|down_proj)(?:_(blocks|scales|bias))?$")
# the parameter names a trailing number may follow.
TRAILING_NUMBER = re.compile(r"\.(?:weight|bias|_extra_state)$")


# -- parameter names that are not model parameters ----------------------------------------

# Tensors next to a quantized module's weight: created and loaded by the serving engines
# (Model-Optimizer registers them as buffers; compressed-tensors as parameters).
QUANT_AUX_PARAMS = frozenset(
    {
        "weight_scale",
        "weight_scale_2",
        "weight_scale_inv",
        "input_scale",
        "pre_quant_scale",
        "weight_zero_point",
        "weight_g_idx",
        "weight_shape",
        "weight_global_scale",
        "input_global_scale",
        "input_zero_point",
        "output_scale",
    }
)
# Attention KV-cache scales, on the attention module or its k/v projections.
KV_SCALE_PARAMS = frozenset({"k_scale", "v_scale"})
# Every param name a quantized module or attention block stores besides its weight.
QUANT_SIBLING_PARAMS = QUANT_AUX_PARAMS | KV_SCALE_PARAMS
# Persistent buffers that models register and `save_pretrained` saves, but that are not
# parameters (`num_parameters()` leaves them out): the MoE router's score-correction bias
# (DeepSeek-V3, GLM-4-MoE, Nemotron-H), rotary frequencies some older models keep, and
# batch-norm statistics. Used when no model can be built to say it exactly.
BUFFER_PARAMS = frozenset(
    {"e_score_correction_bias", "inv_freq", "running_mean", "running_var", "num_batches_tracked"}
)


# -- names outside the tensor templates --------------------------------------------------

# `<module>.experts.<id>.<rest>` in a module or tensor name: the expert id, for grouping the
# modules of one projection across experts ("experts.{E}").
EXPERT_MODULE = re.compile(r"\.experts\.(\d+)\.")
# A `layers.` container without a number: Megatron torch_dist stacks its layers instead.
LAYERS_CONTAINER = re.compile(r"\blayers\.")
# DCP `.distcp` data files: `__<rank>_<writer>.distcp`.
DISTCP_FILE = re.compile(r"__(\d+)_\d+\.distcp$")
# DCP-sharded safetensors: shard-{rank:05d}-model-{output index:05d}-of-{count:05d}, rank
# 1-based.
DCP_SHARD_FILE = re.compile(r"^shard-(\d+)-model-(\d+)-of-(\d+)\.safetensors$")
# The file number of an HF shard: `model-00002-of-00008.safetensors` and the non-standard
# `model.safetensors-00002-of-00008.safetensors` both end with it.
HF_SHARD_NUMBER = re.compile(r"-(\d+)-of-(\d+)\.safetensors$")
# Megatron's per-rank rerun state machine key: `shard_<rank>_<world size>`.
RERUN_SHARD_KEY = re.compile(r"shard_(\d+)_(\d+)")
# Any Megatron ShardedObject key: `<key>/shard_<offsets>_<global shape>`, both dot-joined
# (`rng_state/shard_0.1_1.2`, `decoder.layers.mlp.experts.experts.linear_fc1._extra_state/
# shard_1.3_2.4`: layer 1 of 2, expert 3 of 4).
SHARDED_OBJECT_KEY = re.compile(r"(.+)/shard_(\d{1,9}(?:\.\d{1,9})*)_(\d{1,9}(?:\.\d{1,9})*)")


def expert_template(module: str) -> tuple[str, int | None]:
    """('model.layers.3.mlp.experts.{E}.up_proj', 17) for '...experts.17.up_proj'; the name
    itself and None when it holds no expert number."""
    match = EXPERT_MODULE.search(module)
    if match is None:
        return module, None
    return module[: match.start()] + ".experts.{E}." + module[match.end() :], int(match.group(1))
