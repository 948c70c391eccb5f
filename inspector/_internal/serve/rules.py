"""Will a parallel plan start? The divisibility and placement rules vLLM and SGLang check at
start-up, as findings. Pure: config facts in, findings out.

Each rule names the engine function it mirrors, and where the engines differ (experts over
EP, FP8 blocks in merged layers, MXFP4 padding) the finding says which refuses: docs/cli.md,
"Will it serve? (`fit`)", and docs/architecture.md, "serve/".
"""

from __future__ import annotations

from collections.abc import Set as AbstractSet
from dataclasses import dataclass

from inspector._internal.checkpoint.quant_config import SplitBlock
from inspector._internal.checkpoint.spec import ServingSpec
from inspector._internal.common.text import plural
from inspector._internal.common.units import format_bytes
from inspector._internal.findings.codes import Code
from inspector._internal.findings.finding import Finding, make_finding

__all__ = ["PlanFacts", "plan_findings"]


@dataclass(frozen=True)
class PlanFacts:
    """What the rules read: config facts, the quantization block, and which kinds of tensors
    the checkpoint stores (`kinds`) and stores quantized (`quantized`)."""

    serving: ServingSpec
    block: SplitBlock | None
    num_layers: int
    experts: int | None
    kinds: AbstractSet[str]
    quantized: AbstractSet[str]


def plan_findings(facts: PlanFacts, *, tp: int, ep: int, pp: int, mtp_bytes: int) -> list[Finding]:
    """Every reason the engines would refuse TP x EP x PP, and what they do that costs
    memory (KV heads replicated, MTP on the last stage)."""
    found = _heads(facts.serving, tp)
    found += _kv_heads(facts.serving, tp)
    found += _splits(facts, tp=tp, ep=ep)
    found += _experts(facts, ep)
    if pp > facts.num_layers > 0:
        found.append(
            make_finding(
                Code.PARALLEL_STAGES_EXCEED_LAYERS,
                f"PP {pp} is more stages than the {facts.num_layers:,} decoder layers: a stage "
                "would hold none (vLLM and SGLang `get_pp_indices`)",
            )
        )
    if pp > 1 and mtp_bytes:
        found.append(
            make_finding(
                Code.PARALLEL_MTP_LAST_STAGE,
                f"the MTP layers ({format_bytes(mtp_bytes)} per GPU) go to the last of the {pp} "
                "stages, with the output head (vLLM's `GPUModelRunner` puts the draft model on "
                "the last PP rank; SGLang's placement is not modelled)",
            )
        )
    return found


def _heads(s: ServingSpec, tp: int) -> list[Finding]:
    """Attention heads (vLLM `ModelConfig.verify_with_parallel_config`, and both engines'
    `QKVParallelLinear`, which `divide`s them), Mamba heads and groups (vLLM `MambaMixer2`:
    TP must divide the heads, and the groups unless there is one), linear-attention heads
    (the gated delta net `divide`s its key and value heads)."""
    checks = []
    if s.heads is not None:
        checks.append(("attention heads", s.heads))
    if s.mamba is not None:
        checks.append(("Mamba heads", s.mamba.heads))
        if s.mamba.groups != 1:
            checks.append(("Mamba groups", s.mamba.groups))
    if s.linear is not None:
        checks.append(("linear-attention key heads", s.linear.key_heads))
        checks.append(("linear-attention value heads", s.linear.value_heads))
    return [
        make_finding(
            Code.PARALLEL_HEADS_INDIVISIBLE,
            f"TP {tp} does not divide the {count:,} {what}: vLLM and SGLang refuse to start "
            f"(`{_HEAD_RULES[what]}`)",
        )
        for what, count in checks
        if count % tp
    ]


_HEAD_RULES = {
    "attention heads": "ModelConfig.verify_with_parallel_config, QKVParallelLinear",
    "Mamba heads": "MambaMixer2",
    "Mamba groups": "MambaMixer2",
    "linear-attention key heads": "Qwen3NextGatedDeltaNet",
    "linear-attention value heads": "Qwen3NextGatedDeltaNet",
}


def _kv_heads(s: ServingSpec, tp: int) -> list[Finding]:
    """Both engines' `QKVParallelLinear`: past TP = KV heads each rank holds one head and
    `divide(tp_size, total_num_kv_heads)` must hold; below it `divide(total_num_kv_heads,
    tp_size)`. MLA caches a latent vector, not KV heads: no rule."""
    attention = s.layer_attention is None or any(
        k in ("full", "sliding") for k in s.layer_attention
    )
    if s.kv_heads is None or s.mla or not attention or tp == 1:
        return []
    kv = s.kv_heads
    if tp > kv and tp % kv == 0:
        return [
            make_finding(
                Code.PARALLEL_KV_HEADS_REPLICATED,
                f"TP {tp} is more than the {kv:,} KV heads: each is replicated on {tp // kv} "
                "ranks, and every rank caches a whole head",
            )
        ]
    if tp > kv or kv % tp:
        return [
            make_finding(
                Code.PARALLEL_KV_HEADS_INDIVISIBLE,
                f"TP {tp} and the {kv:,} KV heads: "
                + (f"{tp} is not a multiple of {kv}" if tp > kv else f"{tp} does not divide {kv}")
                + ": vLLM and SGLang refuse to start (`QKVParallelLinear`)",
            )
        ]
    return []


def _splits(facts: PlanFacts, *, tp: int, ep: int) -> list[Finding]:
    """The dimensions TP splits, each against TP itself and against the quantization block
    (see the module docstring for which engine checks what)."""
    s = facts.serving
    moe_tp = tp // ep if ep > 1 else tp
    moe_size = s.moe_intermediate_size or s.intermediate_size
    head_dim = s.v_head_dim if s.mla else s.head_dim
    attention_out = s.heads * head_dim if s.heads and head_dim else None
    dims = (
        ("dense MLP intermediate size", s.intermediate_size, tp, "dense_mlp"),
        ("shared-expert intermediate size", s.shared_intermediate_size, tp, "shared_expert"),
        ("MoE intermediate size", moe_size, moe_tp, "expert"),
        ("attention output size", attention_out, tp, "attention"),
    )
    found = []
    for what, size, degree, kind in dims:
        if size is None or kind not in facts.kinds:
            continue
        problem = _split_problem(
            size, degree, facts.block if kind in facts.quantized else None, kind
        )
        if problem is not None:
            where = f"TP {degree}" if kind != "expert" or ep == 1 else f"MoE TP {degree} (TP / EP)"
            found.append(
                make_finding(
                    Code.PARALLEL_BLOCK_MISALIGNED, f"the {what} {size:,} over {where}: {problem}"
                )
            )
    return found


def _split_problem(size: int, degree: int, block: SplitBlock | None, kind: str) -> str | None:
    """Why `size` split `degree` ways does not start, or None. (Attention heads that TP
    does not divide are their own finding.)"""
    if size % degree and kind == "attention":
        return None
    if size % degree:
        return (
            f"{degree} does not divide it: vLLM and SGLang refuse to start (the parallel "
            "linear layers `divide` it)"
        )
    per = size // degree
    if block is None or block.padded:
        return None
    fix = "; --ep keeps each expert whole" if kind == "expert" else ""
    if kind == "expert" and block.block_n and per % block.block_n:
        # Both engines' `Fp8MoEMethod.create_weights`, whatever the TP.
        return (
            f"{per:,} per rank is not a multiple of the {block.scheme} (block_n "
            f"{block.block_n}): vLLM and SGLang refuse to start (`{block.rule}`){fix}"
        )
    if degree > 1 and block.block_k and per % block.block_k:
        return (
            f"{per:,} per rank is not a multiple of the {block.scheme} (block_k "
            f"{block.block_k}) the row-parallel input needs: vLLM and SGLang refuse to start "
            f"(`{block.rule}`){fix}"
        )
    if degree > 1 and block.block_n and per % block.block_n and kind != "attention":
        return (
            f"{per:,} per rank is not a multiple of the {block.scheme} (block_n "
            f"{block.block_n}) of the merged gate/up projection: SGLang refuses to start "
            "(`validate_fp8_block_shape`); vLLM lets merged layers through"
        )
    return None


def _experts(facts: PlanFacts, ep: int) -> list[Finding]:
    """SGLang's `FusedMoE.__init__` asserts EP divides the experts; vLLM's
    `determine_expert_map` gives the first `E % EP` ranks one more."""
    experts = facts.experts
    if ep == 1 or experts is None or experts % ep == 0:
        return []
    more, base = experts % ep, experts // ep
    return [
        make_finding(
            Code.PARALLEL_EXPERTS_INDIVISIBLE,
            f"EP {ep} does not divide the {experts:,} routed experts: SGLang refuses to start "
            f"(`FusedMoE`); vLLM starts with {plural(base + 1, 'expert')} on each of the first "
            f"{more:,} ranks and {plural(base, 'expert')} on the others (`determine_expert_map`)",
        )
    ]
