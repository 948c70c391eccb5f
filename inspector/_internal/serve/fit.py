"""`fit(ckpt, ...)`: for each parallel plan (TP x EP x PP), whether vLLM and SGLang would start
it (`serve/rules`), the weight bytes of the fullest GPU (`serve/placement`, from the stored
tensors), the KV cache per token (`serve/kv`, from config.json) and, with a GPU, whether the
weights fit and the longest context that does. Pure: headers and JSON only.

config.json is untrusted: every value is checked before use (`ServingSpec`), the work is
linear in the tensors and fixed in the plans (at most `MAX_PLANS`), and a value that cannot
be used is a `fit-config-invalid` finding, never an exception. The memory budget:
docs/architecture.md, "serve/".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from inspector._internal.checkpoint.quant_config import (
    SplitBlock,
    split_block,
    split_block_problem,
)
from inspector._internal.checkpoint.scanned import ScannedCheckpoint
from inspector._internal.checkpoint.spec import ServingSpec, serving_spec
from inspector._internal.checks.draft import check_draft
from inspector._internal.common.defaults import DEFAULT_UTILIZATION, MATRIX_TP
from inspector._internal.common.dtypes import KV_CACHE_DTYPES, QUANT_DTYPES
from inspector._internal.common.filenames import CONFIG_NAME
from inspector._internal.common.units import format_bytes
from inspector._internal.findings.codes import Code, Severity
from inspector._internal.findings.finding import Finding, make_finding
from inspector._internal.serve.engine import EngineReport, engine_check
from inspector._internal.serve.gpus import GIB, GPUS, Gpu, gpu_named
from inspector._internal.serve.kv import KvCost, stage_kv
from inspector._internal.serve.placement import (
    WeightLayout,
    pipeline_layers,
    stage_bytes,
    weight_layout,
)
from inspector._internal.serve.quant_support import quant_support_findings
from inspector._internal.serve.rules import PlanFacts, plan_findings
from inspector.errors import InspectorError

__all__ = [
    "ACTIVATION_TOKENS",
    "DEFAULT_UTILIZATION",
    "FIXED_OVERHEAD",
    "MATRIX_TP",
    "FitResult",
    "ParallelPlan",
    "fit",
]

# The estimate of what an engine needs besides weights and KV cache (module docstring).
ACTIVATION_TOKENS = 8192
FIXED_OVERHEAD = GIB
# Bounds on what a caller may ask: no real deployment is near them.
MAX_DEGREE = 1024
MAX_CONTEXT = 1 << 40
MAX_GPU_GIB = 1 << 20
MAX_PLANS = 2 * len(MATRIX_TP)
# Parameter names that only a quantized module stores.
_QUANTIZED_PARAMS = frozenset(
    {"weight_scale", "weight_scale_inv", "weight_scale_2", "weight_packed", "qweight", "blocks"}
)


@dataclass(frozen=True)
class ParallelPlan:
    """One plan: TP x EP x PP, whether it starts (`feasible`: no error finding), every
    reason as a finding, the weight bytes of the fullest GPU (and of each stage's), the KV
    cache of one sequence per stage (`kv`), and with a GPU the longest context that fits."""

    tp: int
    ep: int
    pp: int
    findings: tuple[Finding, ...]
    stage_weights: tuple[int, ...]
    kv: tuple[KvCost, ...] | None
    overhead_bytes: int
    max_context_tokens: int | None
    gpu: str | None

    @property
    def feasible(self) -> bool:
        return not any(f.severity == Severity.ERROR for f in self.findings)

    @property
    def gpus(self) -> int:
        return self.tp * self.pp

    @property
    def weights_bytes_per_rank(self) -> int:
        return max(self.stage_weights, default=0)

    @property
    def kv_bytes_per_token_per_rank(self) -> int | None:
        """Bytes each token of context adds on the fullest rank, past every sliding window
        (full attention and MLA layers); None when config.json does not say."""
        return None if self.kv is None else max((c.per_token for c in self.kv), default=0)

    @property
    def label(self) -> str:
        return f"TP {self.tp} x EP {self.ep} x PP {self.pp}"

    def to_dict(self) -> dict[str, Any]:
        """The `fit --json` contract for one plan (exact keys)."""
        return {
            "tp": self.tp,
            "ep": self.ep,
            "pp": self.pp,
            "feasible": self.feasible,
            "findings": [{"code": f.code, "message": f.message} for f in self.findings],
            "weights_bytes_per_rank": self.weights_bytes_per_rank,
            "kv_bytes_per_token_per_rank": self.kv_bytes_per_token_per_rank,
            "max_context_tokens": self.max_context_tokens,
            "gpu": self.gpu,
        }


@dataclass(frozen=True)
class FitResult:
    """The plans `fit` judged, with what it was asked: the GPU (None: no memory verdict),
    the memory the engine may use of it (`budget_bytes`), the context and the KV dtype."""

    plans: tuple[ParallelPlan, ...]
    gpu: str | None
    budget_bytes: int | None
    context: int | None
    kv_dtype: str
    gpu_memory_utilization: float
    # With `fit(..., engine=...)`: what the serving engine's own check said (its findings
    # are among every plan's).
    engine: EngineReport | None = None

    @property
    def feasible(self) -> tuple[ParallelPlan, ...]:
        """The plans that start (and fit, with a GPU), fewest GPUs first."""
        return tuple(p for p in self.plans if p.feasible)

    def to_dict(self) -> dict[str, Any]:
        """`fit --json`: `{"plans": [...]}`, each plan as `ParallelPlan.to_dict`, and with an
        engine `"engine"` (`EngineReport.to_dict()`)."""
        out: dict[str, Any] = {"plans": [p.to_dict() for p in self.plans]}
        if self.engine is not None:
            out["engine"] = self.engine.to_dict()
        return out

    def frame(self) -> pd.DataFrame:
        """One row per plan: the table the dashboard's Serve tab and the HTML report draw
        (columns: plan, tp, ep, pp, gpus, feasible, weights_bytes_per_rank,
        kv_bytes_per_token_per_rank, max_context_tokens, budget_bytes, codes)."""
        rows = [
            {
                "plan": p.label,
                "tp": p.tp,
                "ep": p.ep,
                "pp": p.pp,
                "gpus": p.gpus,
                "feasible": p.feasible,
                "weights_bytes_per_rank": p.weights_bytes_per_rank,
                "kv_bytes_per_token_per_rank": p.kv_bytes_per_token_per_rank,
                "max_context_tokens": p.max_context_tokens,
                "budget_bytes": self.budget_bytes,
                "codes": ", ".join(dict.fromkeys(f.code for f in p.findings)),
            }
            for p in self.plans
        ]
        frame = pd.DataFrame(rows, columns=_FRAME_COLUMNS)
        for column in ("kv_bytes_per_token_per_rank", "max_context_tokens", "budget_bytes"):
            frame[column] = frame[column].astype("Int64")
        return frame


_FRAME_COLUMNS = [
    "plan",
    "tp",
    "ep",
    "pp",
    "gpus",
    "feasible",
    "weights_bytes_per_rank",
    "kv_bytes_per_token_per_rank",
    "max_context_tokens",
    "budget_bytes",
    "codes",
]


def fit(
    ckpt: ScannedCheckpoint,
    *,
    tp: int | None = None,
    ep: int | None = None,
    pp: int | None = None,
    gpu: str | None = None,
    gpu_memory: float | None = None,
    context: int | None = None,
    kv_dtype: str = "auto",
    gpu_memory_utilization: float = DEFAULT_UTILIZATION,
    target: ScannedCheckpoint | None = None,
    engine: str | None = None,
) -> FitResult:
    """Judge the parallel plans for serving `ckpt` with vLLM or SGLang.

    `tp` (with `ep`, default 1, and `pp`, default 1) judges one plan; without it the matrix
    TP 1, 2, 4, 8, 16, 32, each with EP 1 and, for a MoE model, EP = TP. `gpu` names a GPU
    of the catalogue (`GPUS`), `gpu_memory` gives its memory in GiB instead; with either,
    memory findings and the longest context are computed. `context` is the context to
    serve (default: the model's `max_position_embeddings`), `kv_dtype` one of vLLM's
    `--kv-cache-dtype` names, `gpu_memory_utilization` the share of memory the engine takes.
    With a catalogue GPU, the quantization scheme is judged against the engine's support on
    its compute capability (`serve.quant_support`). `target`: `ckpt` is a draft model
    (EAGLE) for that target, judged against it (`checks.draft`). `engine` ("vllm",
    "llama.cpp", "sglang") also runs that engine's own check (`serve.engine.engine_check`,
    for vLLM its weight loading on a meta model at `tp`, default 1: seconds, not
    milliseconds); its findings join every plan's.
    Bad options raise `InspectorError`; a bad config.json is a finding."""
    memory, gpu_label = _gpu_memory(gpu, gpu_memory)
    _check_options(tp=tp, ep=ep, pp=pp, context=context)
    if kv_dtype not in KV_CACHE_DTYPES:
        raise InspectorError(f"kv_dtype {kv_dtype!r}: expected one of {', '.join(KV_CACHE_DTYPES)}")
    if not 0 < gpu_memory_utilization <= 1:
        raise InspectorError(
            f"gpu_memory_utilization {gpu_memory_utilization}: expected more than 0, at most 1"
        )
    serving, block, layout = _facts(ckpt)
    facts = PlanFacts(
        serving=serving,
        block=block,
        num_layers=layout.num_layers,
        experts=ckpt.spec.experts_per_layer if layout.routed.any() else None,
        kinds=_kinds(ckpt),
        quantized=_quantized_kinds(ckpt),
    )
    general = _config_findings(serving, split_block_problem(ckpt.config))
    general += _speculative(ckpt, target)
    known = gpu_named(gpu) if gpu is not None else None
    if known is not None:
        general += quant_support_findings(ckpt.config, ckpt.quant_config, gpu=known)
    report = None
    if engine is not None:
        # No GPU here: its quantization support is judged above, once.
        report = engine_check(ckpt, engine=engine, tp=tp or 1)
        general += report.findings
    budget = None if memory is None else int(memory * gpu_memory_utilization)
    plans = [
        _plan(
            facts,
            layout,
            tp=t,
            ep=e,
            pp=p,
            general=general,
            budget=budget,
            context=context,
            itemsize=KV_CACHE_DTYPES[kv_dtype],
            gpu=gpu_label,
        )
        for t, e, p in _degrees(tp, ep, pp, moe=bool(layout.routed.any()))
    ]
    return FitResult(
        plans=tuple(plans),
        gpu=gpu_label,
        budget_bytes=budget,
        context=context,
        kv_dtype=kv_dtype,
        gpu_memory_utilization=gpu_memory_utilization,
        engine=report,
    )


def _speculative(ckpt: ScannedCheckpoint, target: ScannedCheckpoint | None) -> list[Finding]:
    """A draft against its target (`checks.draft`), and MTP layers declared but not stored
    (an engine asked for MTP speculative decoding then proposes nothing the target accepts:
    vLLM PR #35548)."""
    found = check_draft(ckpt, target=target)
    declared = ckpt.spec.mtp_layers
    if declared and not ckpt.tensors["is_mtp"].any():
        found.append(
            make_finding(
                Code.MTP_MISSING,
                f"config.json declares {declared:,} MTP layers and none is stored: MTP "
                "speculative decoding (vLLM `--speculative-config` method mtp) has no draft "
                "weights to load; restore them with `ckpt-inspect repair --from <release>`",
            )
        )
    return found


def _facts(ckpt: ScannedCheckpoint) -> tuple[ServingSpec, SplitBlock | None, WeightLayout]:
    """The config facts and the tensors' placement facts, computed once per scan."""

    def build() -> tuple[ServingSpec, SplitBlock | None, WeightLayout]:
        serving = serving_spec(ckpt.config, ckpt.spec)
        block = split_block(ckpt.config, ckpt.quant_config)
        return serving, block, weight_layout(ckpt, serving, block)

    return ckpt.derived("serve-facts", build)


def _plan(
    facts: PlanFacts,
    layout: WeightLayout,
    *,
    tp: int,
    ep: int,
    pp: int,
    general: Sequence[Finding],
    budget: int | None,
    context: int | None,
    itemsize: int,
    gpu: str | None,
) -> ParallelPlan:
    weights = stage_bytes(layout, tp=tp, ep=ep, pp=pp)
    found = [*general, *plan_findings(facts, tp=tp, ep=ep, pp=pp, mtp_bytes=weights.mtp)]
    serving = facts.serving
    kv, missing = stage_kv(
        serving,
        pipeline_layers(len(serving.layer_attention or ()), pp)
        if serving.layer_attention is not None
        else (),
        tp=tp,
        itemsize=itemsize,
        mtp_layers=layout.mtp_layers,
    )
    if missing is not None:
        found.append(
            make_finding(
                Code.FIT_CONFIG_INVALID,
                f"config.json does not give {missing}: the KV cache per token and the "
                "longest context were not computed",
            )
        )
    overhead = _overhead(serving, tp=tp, ep=ep)
    longest = None
    if budget is not None:
        longest, memory = _memory(weights.per_stage, kv, budget, overhead, serving, context)
        found += memory
    return ParallelPlan(
        tp=tp,
        ep=ep,
        pp=pp,
        findings=tuple(found),
        stage_weights=weights.per_stage,
        kv=kv,
        overhead_bytes=overhead,
        max_context_tokens=longest,
        gpu=gpu,
    )


def _memory(
    stages: tuple[int, ...],
    kv: tuple[KvCost, ...] | None,
    budget: int,
    overhead: int,
    serving: ServingSpec,
    context: int | None,
) -> tuple[int | None, list[Finding]]:
    """(The longest context that fits, the memory findings) on a GPU of `budget` bytes."""
    fullest = max(stages, default=0)
    if fullest + overhead > budget:
        return 0, [
            make_finding(
                Code.FIT_WEIGHTS_EXCEED_GPU,
                f"the fullest GPU holds {format_bytes(fullest)} of weights; with the "
                f"{format_bytes(overhead)} estimated for activations, CUDA graphs and the CUDA "
                f"context that is more than the {format_bytes(budget)} the engine may use",
            )
        ]
    if kv is None:
        return None, []
    asked = context or serving.max_position_embeddings
    cap = max(asked or 0, serving.max_position_embeddings or 0) or MAX_CONTEXT
    longest = min(
        cost.longest(budget - weights - overhead, cap)
        for cost, weights in zip(kv, stages, strict=True)
    )
    if asked is None or asked <= longest:
        return longest, []
    worst = max(range(len(kv)), key=lambda s: kv[s].bytes_for(asked) + stages[s])
    need = kv[worst].bytes_for(asked)
    free = budget - stages[worst] - overhead
    source = "asked" if context else "max_position_embeddings, which vLLM serves by default"
    return longest, [
        make_finding(
            Code.FIT_CONTEXT_EXCEEDS_GPU,
            f"one sequence of {asked:,} tokens ({source}) needs {format_bytes(need)} of KV "
            f"cache per GPU, and {format_bytes(max(free, 0))} is left after the weights and "
            f"the estimate: the longest that fits is {longest:,} tokens "
            f"(`--max-model-len {longest}`)",
        )
    ]


def _overhead(serving: ServingSpec, *, tp: int, ep: int) -> int:
    """The estimate of what the engine needs besides weights and cache (module docstring)."""
    moe_tp = tp // ep if ep > 1 else tp
    inner = max(
        (serving.intermediate_size or 0) // tp,
        (serving.shared_intermediate_size or 0) // tp,
        (serving.moe_intermediate_size or 0) // moe_tp,
    )
    activations = ACTIVATION_TOKENS * (4 * (serving.hidden_size or 0) + 2 * inner) * 2
    return FIXED_OVERHEAD + activations


def _config_findings(serving: ServingSpec, block_problem: str | None) -> list[Finding]:
    found = [
        make_finding(
            Code.FIT_CONFIG_INVALID,
            f"{CONFIG_NAME}'s {key} {why}: what depends on it was not computed",
        )
        for key, why in serving.invalid
    ]
    if block_problem is not None:
        found.append(
            make_finding(
                Code.FIT_CONFIG_INVALID,
                f"{CONFIG_NAME}'s quantization_config: {block_problem}: the quantization "
                "block rules were not checked",
            )
        )
    return found


def _kinds(ckpt: ScannedCheckpoint) -> frozenset[str]:
    return frozenset(str(k) for k in ckpt.tensors["kind"].unique())


def _quantized_kinds(ckpt: ScannedCheckpoint) -> frozenset[str]:
    """Kinds of tensors (attention, dense_mlp, expert...) stored quantized: an 8-bit float or
    packed dtype, or a scale or packed parameter beside them."""
    t = ckpt.tensors
    quantized = t["dtype"].isin(QUANT_DTYPES) | t["param"].isin(_QUANTIZED_PARAMS)
    return frozenset(str(k) for k in t.loc[quantized.to_numpy(dtype=bool), "kind"].unique())


def _degrees(
    tp: int | None, ep: int | None, pp: int | None, *, moe: bool
) -> list[tuple[int, int, int]]:
    """The (TP, EP, PP) plans asked for: one, or the matrix (module docstring of `fit`)."""
    stages = pp or 1
    if tp is not None:
        return [(tp, ep or 1, stages)]
    plans = []
    for t in MATRIX_TP:
        if ep is not None:
            if t % ep == 0:
                plans.append((t, ep, stages))
            continue
        plans.append((t, 1, stages))
        if moe and t > 1:
            plans.append((t, t, stages))
    return plans


def _check_options(*, tp: int | None, ep: int | None, pp: int | None, context: int | None) -> None:
    for name, value, high in (
        ("tp", tp, MAX_DEGREE),
        ("ep", ep, MAX_DEGREE),
        ("pp", pp, MAX_DEGREE),
        ("context", context, MAX_CONTEXT),
    ):
        if value is not None and (type(value) is not int or not 1 <= value <= high):
            raise InspectorError(f"{name} {value!r}: expected a whole number from 1 to {high:,}")
    if ep is not None and tp is not None and (ep > tp or tp % ep):
        raise InspectorError(
            f"ep {ep} must divide tp {tp}: the experts' own TP is TP / EP (SGLang's "
            "--ep-size; vLLM's --enable-expert-parallel makes EP = TP)"
        )


def _gpu_memory(gpu: str | None, gpu_memory: float | None) -> tuple[int | None, str | None]:
    """(Bytes of GPU memory, the GPU's label) from `gpu` or `gpu_memory` GiB."""
    if gpu is not None and gpu_memory is not None:
        raise InspectorError("give gpu or gpu_memory, not both")
    if gpu is not None:
        known: Gpu | None = gpu_named(gpu)
        if known is None:
            raise InspectorError(f"gpu {gpu!r} is not in the catalogue: {', '.join(GPUS)}")
        return known.memory_bytes, known.name
    if gpu_memory is not None:
        if isinstance(gpu_memory, bool) or not isinstance(gpu_memory, int | float):
            raise InspectorError(f"gpu_memory {gpu_memory!r}: expected a number of GiB")
        if not 0 < gpu_memory <= MAX_GPU_GIB:
            raise InspectorError(
                f"gpu_memory {gpu_memory!r}: expected more than 0 and at most {MAX_GPU_GIB:,} GiB"
            )
        return int(gpu_memory * GIB), f"{gpu_memory:g} GiB"
    return None, None
