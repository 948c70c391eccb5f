"""A tiny Megatron-LM torch_dist checkpoint (docs/formats.md, "Megatron torch_dist"),
written with the real writers: `torch.distributed.checkpoint.save` for `.metadata` and the
`.distcp` files, `torch.save` for `common.pt`. One process, no process group.

The model is a 2-layer MoE GPT (4 experts, SwiGLU) with one MTP layer, named the way Megatron
saves it: stacked decoder layers with a leading layer axis, experts with an expert axis.
`rerun_drift=True` reproduces seed megatron-4448: the common state says the rerun state
machine is about to re-run a step, but `.metadata` holds no `rerun_state_machine_state` shard.
"""

from __future__ import annotations

import argparse
import enum
import io
import json
import sys
import types
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from inspector._internal.common.filenames import (
    TORCH_DIST_COMMON,
    TORCH_DIST_LATEST,
    TORCH_DIST_METADATA_JSON,
)

__all__ = ["megatron_common_state", "save_megatron_dcp", "write_torch_dist_demo"]

ITERATION = 100
_H, _HEADS, _VOCAB, _LAYERS, _EXPERTS, _MOE_FFN = 32, 4, 128, 2, 4, 16
_RERUN_MODULE = "megatron.core.rerun_state_machine"


class RerunMode(enum.StrEnum):
    """Megatron's rerun-machine modes (same names and values)."""

    DISABLED = "disabled"
    VALIDATE_RESULTS = "validate_results"
    REPORT_DETERMINISM_STATS = "report_determinism_stats"


class RerunState(enum.Enum):
    """Megatron's rerun-machine states (same names and values)."""

    NOT_RUNNING_YET = 0
    INITIAL_RUN = 1
    RERUNNING_IN_PLACE = 2
    WILL_RERUN_FROM_CHECKPOINT = 3
    RERUNNING_FROM_CHECKPOINT = 4
    RERUNNING_AGAIN_FROM_CHECKPOINT = 5


def write_torch_dist_demo(dest: Path, *, rerun_drift: bool = False) -> Path:
    """Write `dest/latest_checkpointed_iteration.txt` and `dest/iter_0000100/` (`.metadata`,
    `__0_0.distcp`, `metadata.json`, `common.pt`) plus `README.txt`; returns `dest`."""
    import torch

    dest = Path(dest)
    iter_dir = dest / f"iter_{ITERATION:07d}"
    iter_dir.mkdir(parents=True, exist_ok=True)
    generator = torch.Generator().manual_seed(4448)
    state = _model_tensors(torch, generator)
    state["rng_state/shard_0.0_1.1"] = _sharded_object(
        torch, {"torch_rng_state": generator.get_state()}
    )
    if not rerun_drift:
        state["rerun_state_machine_state/shard_0_1"] = _sharded_object(torch, _rerun_sentinel())
    save_megatron_dcp(state, iter_dir)
    active = RerunState.WILL_RERUN_FROM_CHECKPOINT if rerun_drift else RerunState.NOT_RUNNING_YET
    common = megatron_common_state(world_size=1, rerun_state=active)
    with megatron_pickle_names():
        torch.save(common, iter_dir / TORCH_DIST_COMMON)
    (dest / TORCH_DIST_LATEST).write_text(str(ITERATION), encoding="utf-8")
    (dest / "README.txt").write_text(_readme(rerun_drift), encoding="utf-8")
    return dest


def save_megatron_dcp(
    state: dict[str, Any], folder: Path, *, metadata_json: bool = True, **save_kwargs: Any
) -> None:
    """`dcp.save` as Megatron calls it: byte objects stored as given (Megatron's planner does
    not re-serialise them), plus Megatron's `metadata.json` unless `metadata_json=False` (a
    rank other than 0). `save_kwargs` go to `dcp.save` (e.g. `process_group`)."""
    import torch.distributed.checkpoint as dcp

    class _RawBytesPlanner(dcp.DefaultSavePlanner):
        def transform_object(self, write_item: Any, obj: Any) -> Any:
            return obj  # the BytesIO already holds torch.save([data]), as in Megatron

    save_kwargs.setdefault("no_dist", "process_group" not in save_kwargs)
    writer = dcp.FileSystemWriter(str(folder), thread_count=1)
    with warnings.catch_warnings():
        # Single-process saves warn that no process group exists; that is the intent here.
        warnings.simplefilter("ignore", UserWarning)
        dcp.save(state, storage_writer=writer, planner=_RawBytesPlanner(), **save_kwargs)
    if metadata_json:
        doc = {
            "sharded_backend": "torch_dist",
            "sharded_backend_version": 1,
            "common_backend": "torch",
            "common_backend_version": 1,
        }
        (Path(folder) / TORCH_DIST_METADATA_JSON).write_text(json.dumps(doc), encoding="utf-8")


def megatron_common_state(*, world_size: int, rerun_state: RerunState) -> dict[str, Any]:
    """What Megatron's `save_checkpoint` keeps in `common.pt`: args, iteration, scheduler and
    the rerun machine's common part (its per-rank part is a sharded object)."""
    args = argparse.Namespace(
        num_layers=_LAYERS,
        hidden_size=_H,
        num_attention_heads=_HEADS,
        num_experts=_EXPERTS,
        moe_ffn_hidden_size=_MOE_FFN,
        mtp_num_layers=1,
        padded_vocab_size=_VOCAB,
        world_size=world_size,
        tensor_model_parallel_size=1,
        pipeline_model_parallel_size=1,
        expert_model_parallel_size=1,
        ckpt_format="torch_dist",
        ckpt_assume_constant_structure=True,
        rerun_mode="validate_results",
    )
    return {
        "args": args,
        "checkpoint_version": 3.0,
        "iteration": ITERATION,
        "num_floating_point_operations_so_far": 1.5e15,
        "opt_param_scheduler": {"max_lr": 3e-4, "min_lr": 3e-5, "num_steps": ITERATION * 256},
        "rerun_state_machine": {
            "mode": RerunMode.VALIDATE_RESULTS,
            "state": rerun_state,
            "current_iteration": ITERATION - 1,
        },
    }


@contextmanager
def megatron_pickle_names() -> Iterator[None]:
    """Make `RerunMode`/`RerunState` pickle under Megatron's module name, as a real Megatron
    save does. Pickle looks classes up in `sys.modules`, so the module (and its parents) are
    registered for the duration of the block only. When Megatron itself is loaded, nothing is
    touched (the classes then pickle under this module's name)."""
    if _RERUN_MODULE in sys.modules:
        yield
        return
    added = [n for n in ("megatron", "megatron.core", _RERUN_MODULE) if n not in sys.modules]
    for name in added:
        sys.modules[name] = types.ModuleType(name)
    module = sys.modules[_RERUN_MODULE]
    try:
        for cls in (RerunMode, RerunState):
            cls.__module__ = _RERUN_MODULE
            setattr(module, cls.__name__, cls)
        yield
    finally:
        for cls in (RerunMode, RerunState):
            cls.__module__ = __name__
        for name in added:
            del sys.modules[name]


def _model_tensors(torch: Any, generator: Any) -> dict[str, Any]:
    """The tiny MoE GPT with MTP, BF16, in Megatron's saved (stacked) naming."""
    qkv, layer = 3 * _H, "decoder.layers."
    shapes = {
        "embedding.word_embeddings.weight": (_VOCAB, _H),
        f"{layer}self_attention.linear_qkv.layer_norm_weight": (_LAYERS, _H),
        f"{layer}self_attention.linear_qkv.weight": (_LAYERS, qkv, _H),
        f"{layer}self_attention.linear_proj.weight": (_LAYERS, _H, _H),
        f"{layer}pre_mlp_layernorm.weight": (_LAYERS, _H),
        f"{layer}mlp.router.weight": (_LAYERS, _EXPERTS, _H),
        f"{layer}mlp.experts.experts.linear_fc1.weight": (_LAYERS, _EXPERTS, 2 * _MOE_FFN, _H),
        f"{layer}mlp.experts.experts.linear_fc2.weight": (_LAYERS, _EXPERTS, _H, _MOE_FFN),
        "decoder.final_layernorm.weight": (_H,),
        "output_layer.weight": (_VOCAB, _H),
    }
    mtp = "mtp.layers.0."
    block = f"{mtp}transformer_layer."
    shapes |= {
        f"{mtp}enorm.weight": (_H,),
        f"{mtp}hnorm.weight": (_H,),
        f"{mtp}eh_proj.weight": (_H, 2 * _H),
        f"{mtp}final_layernorm.weight": (_H,),
        f"{block}self_attention.linear_qkv.layer_norm_weight": (_H,),
        f"{block}self_attention.linear_qkv.weight": (qkv, _H),
        f"{block}self_attention.linear_proj.weight": (_H, _H),
        f"{block}pre_mlp_layernorm.weight": (_H,),
        f"{block}mlp.router.weight": (_EXPERTS, _H),
        f"{block}mlp.experts.experts.linear_fc1.weight": (_EXPERTS, 2 * _MOE_FFN, _H),
        f"{block}mlp.experts.experts.linear_fc2.weight": (_EXPERTS, _H, _MOE_FFN),
    }
    return {
        name: (torch.randn(shape, generator=generator) * 0.02).to(torch.bfloat16)
        for name, shape in shapes.items()
    }


def _sharded_object(torch: Any, data: Any) -> io.BytesIO:
    """A Megatron sharded object as DCP stores it: `torch.save([data])` in a BytesIO."""
    buffer = io.BytesIO()
    torch.save([data], buffer)
    buffer.seek(0)
    return buffer


def _rerun_sentinel() -> dict[str, Any]:
    """The per-rank rerun state in the steady state (nothing to re-run)."""
    return {
        "rerun_requested": False,
        "checkpoint_requested": False,
        "restart_again_requested": False,
        "continue_requested": False,
        "failed_validation_call": None,
        "initial_result": None,
        "suspicious_node": None,
        "suspicious_device": None,
        "data_iterator_checkpoints": None,
        "large_value_counts": {},
        "max_values": {},
    }


def _readme(rerun_drift: bool) -> str:
    title = "megatron-4448-rerun-drift" if rerun_drift else "healthy-torch-dist"
    layout = (
        "A Megatron-LM torch_dist checkpoint of a tiny MoE GPT (2 layers, 4 experts, 1 MTP\n"
        "layer): latest_checkpointed_iteration.txt names iter_0000100/, which holds the DCP\n"
        ".metadata, __0_0.distcp, metadata.json and common.pt.\n"
    )
    if not rerun_drift:
        return f"{title}\n{'=' * len(title)}\n\n{layout}\nNothing is wrong with it.\n"
    story = (
        "\ncommon.pt says the rerun state machine is WILL_RERUN_FROM_CHECKPOINT, but .metadata\n"
        "has no rerun_state_machine_state/shard_0_1 entry: a save after a fault reused a\n"
        "cached save plan (seed megatron-4448). Megatron fails to load it with\n"
        "'Missing key in checkpoint state_dict: rerun_state_machine_state/shard_0_1'.\n"
        "Expected finding: torch-dist-common-drift.\n"
    )
    return f"{title}\n{'=' * len(title)}\n\n{layout}{story}"
