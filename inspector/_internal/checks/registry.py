"""Which rule runs for which layout: one typed table, one module per concern. A rule declares
the codes it may emit (a test checks); to add a check, write a module `ScannedCheckpoint ->
findings` and register it here with its layouts (None: every layout). Model rules get the
load verdict, computed once because building the model is the costly part, and run after the
plain rules, whose findings they may revise with the model's exact facts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from inspector._internal.checkpoint.scanned import LayoutName, ScannedCheckpoint
from inspector._internal.checks import (
    compressed_tensors,
    dcp,
    draft,
    gguf,
    index,
    leftovers,
    llama_cpp,
    model_load,
    quant_blocks,
    quant_config,
    sharding,
    sidecars,
    structure,
    torch_dist,
)
from inspector._internal.findings.codes import Code, code_set
from inspector._internal.findings.finding import Finding

if TYPE_CHECKING:
    from inspector._internal.load.verdict import LoadVerdict

__all__ = ["MODEL_RULES", "RULES", "ModelRule", "Rule", "model_rules_for", "rules_for"]

_L = LayoutName


@dataclass(frozen=True, slots=True)
class Rule:
    """A check: `run(scanned)` gives findings whose codes are all in `codes`; it runs on the
    `layouts` named (None: every layout)."""

    name: str
    layouts: frozenset[LayoutName] | None
    run: Callable[[ScannedCheckpoint], Iterable[Finding]]
    codes: frozenset[Code]


RULES: tuple[Rule, ...] = (
    Rule(
        "index",
        index.LAYOUTS,
        index.check_index_of,
        index.CODES,
    ),
    Rule(
        "named-weights",
        None,
        index.check_named_weights,
        code_set(Code.WEIGHTS_NAMED_BY_CONFIG),
    ),
    Rule(
        "sidecars", frozenset({_L.MODELOPT_PER_LAYER}), sidecars.check_sidecars_of, sidecars.CODES
    ),
    Rule(
        "collapsed-shards",
        frozenset({_L.SAFETENSORS_SINGLE, _L.HF_SHARDED}),
        sharding.check_collapsed_shards,
        sharding.CODES,
    ),
    Rule("dcp", frozenset({_L.DCP_SHARDED}), dcp.check_dcp, dcp.CODES),
    Rule("torch-dist", frozenset({_L.TORCH_DIST}), torch_dist.check_torch_dist, torch_dist.CODES),
    Rule("structure", None, structure.check_structure, structure.CODES),
    Rule("quant-config", None, quant_config.check_quant_config, quant_config.CODES),
    Rule(
        "compressed-tensors",
        None,
        compressed_tensors.check_compressed_tensors,
        compressed_tensors.CODES,
    ),
    Rule("block-quant", None, quant_blocks.check_block_quant, quant_blocks.CODES),
    Rule("draft", None, draft.check_draft, draft.CODES),
    Rule("leftovers", None, leftovers.check_leftovers, leftovers.CODES),
    Rule("gguf", frozenset({_L.GGUF}), gguf.check_gguf, gguf.CODES),
    Rule(
        "llama-cpp-tensors",
        frozenset({_L.GGUF}),
        llama_cpp.check_gguf_tensor_set,
        llama_cpp.CODES,
    ),
)


@dataclass(frozen=True, slots=True)
class ModelRule:
    """A check against the model built from config.json: `run(scanned, verdict, found)` gets
    the load verdict and the findings so far and returns them, revised where the model knows
    better, with its own added; the codes it adds or revises are all in `codes`. It runs on
    the `layouts` named (None: every layout)."""

    name: str
    layouts: frozenset[LayoutName] | None
    run: Callable[[ScannedCheckpoint, LoadVerdict, list[Finding]], list[Finding]]
    codes: frozenset[Code]


MODEL_RULES: tuple[ModelRule, ...] = (
    ModelRule(
        "total-parameters",
        frozenset({_L.HF_SHARDED, _L.MODELOPT_PER_LAYER, _L.PYTORCH_BIN}),
        index.reconcile_with_model,
        index.MODEL_CODES,
    ),
    ModelRule(
        "mtp",
        frozenset({_L.HF_SHARDED, _L.SAFETENSORS_SINGLE, _L.PYTORCH_BIN}),
        structure.revise_mtp_with_model,
        structure.MODEL_CODES,
    ),
    ModelRule("load", None, model_load.add_load_findings, model_load.CODES),
)


def rules_for(layout: LayoutName) -> tuple[Rule, ...]:
    """The rules registered for `layout`, in table order."""
    return tuple(r for r in RULES if r.layouts is None or layout in r.layouts)


def model_rules_for(layout: LayoutName) -> tuple[ModelRule, ...]:
    """The model rules registered for `layout`, in table order."""
    return tuple(r for r in MODEL_RULES if r.layouts is None or layout in r.layouts)
