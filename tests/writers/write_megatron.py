"""Write Megatron torch_dist checkpoints with the REAL megatron-core `dist_checkpointing.save`
from 2 gloo ranks on 127.0.0.1, healthy and damaged the way the seeds describe.

Model: a tiny GPTModel (hidden 16, 2 decoder layers, every layer MoE with 4 experts, top-2,
SequentialMLP experts, 1 MTP layer) built from megatron-core's *local* (TransformerEngine-free)
spec, because TransformerEngine needs CUDA. Parallelism: TP=2, EP=2 (expert TP 1), so attention
and MLP tensors are split across the two ranks and each rank owns two experts of every layer.

What is saved is what Megatron-LM's training loop (`generate_state_dict`; the loop itself is not
part of megatron-core) puts into a torch_dist checkpoint: `args` (an argparse Namespace, a few
fields), `checkpoint_version`, `iteration`, `model` (the model's own `sharded_state_dict()`),
`rerun_state_machine` (megatron-core's `RerunStateMachine.state_dict(..., "torch_dist")`, only
when it returns a state: its rank-level part is the ShardedObject `rerun_state_machine_state`)
and `rng_state` (a ShardedObject keyed by (pp, tp) like Megatron-LM's; its payload here is the
CPU RNG states only).

Cases (tests/fixtures/writers/megatron/<case>/):

- `healthy`: one save, rerun state machine idle (mode validate_results, NOT_RUNNING_YET).
- `healthy-rerun-active`: one save after a fault left the rerun machine in
  WILL_RERUN_FROM_CHECKPOINT: common state says active and every rank wrote its
  `rerun_state_machine_state/shard_{rank}_2` object.
- `megatron-4448-cached-plan`: the seed's sequence with a strategy built with
  `cached_metadata=True` (what `--ckpt-assume-constant-structure` selects): two steady saves
  (the plan is validated and cached), then the fault, then a third save. Its cached plan has no
  item for the rerun ShardedObject, so the object is silently dropped: common state says active,
  `.metadata` has no `rerun_state_machine_state/*`.
- `missing-distcp`: the healthy save, then one `.distcp` file deleted (rank 1's second file).
- `megatron-3624-mtp-extra-state`: megatron-core 0.16.1 as released: its
  `MultiTokenPredictionBlock.sharded_state_dict` first calls the generic
  `MegatronModule.sharded_state_dict`, which reaches the `layers` ModuleList through the
  `state_dict()` fallback, then updates with each layer's own `sharded_state_dict`. The other
  cases use the per-layer-only form of the seed's fix (patched in this script, see
  `_mtp_sharded_state_dict_fixed`) so that they are healthy.
- `torch-dist-object-incomplete` (item 7): the rerun machine is active on rank 1 only (rank 0
  finished its rerun, NOT_RUNNING_YET), so only `rerun_state_machine_state/shard_1_2` is
  written while the family declares 2 shards; rank 0 writes the common state, which says idle.
  megatron-core's access-integrity validation rejects this state dict, so this one save passes
  `validate_access_integrity=False` (a public argument of `dist_checkpointing.save`).

CPU shims (see `_common.cpu_cuda_shims`), both on paths that never touch tensor bytes:
`torch.cuda.synchronize` (called after `.to("cpu", non_blocking=...)` of tensors that are CPU
tensors already) and `torch.cuda.current_device` (device of the one-element failure flag that
rank 0 broadcasts after writing `.metadata`). The rerun fault itself is not simulated: the
machine's fault path all-reduces CUDA tensors. The fields it sets on a fault that must be
re-run from a checkpoint (`state = WILL_RERUN_FROM_CHECKPOINT`, `checkpoint_requested = True`,
the iteration) are set directly; everything saved from them goes through megatron-core's own
`state_dict()`.

How the shims are shown not to change the bytes: each case (but the one whose file is
deleted) is loaded back with megatron-core's own `dist_checkpointing.load` into a freshly built
model with other weights and compared tensor by tensor with the model that was saved
(`roundtrip_equal` in the manifest). Tensor bytes in the `.distcp` files are identical run to
run. Volatile bytes the writers themselves make different on every run, left as written:
`.metadata` pickles `storage_meta.save_id` (a fresh uuid per save, PyTorch's FileSystemWriter)
and `storage_meta.checkpoint_id` (the folder path at save time); `common.pt` and every pickled
ShardedObject payload (rerun state, RNG state) are `torch.save` zip archives whose
`.data/serialization_id` record is random per save.

TransformerEngine stand-in (only for the MTP-vs-decoder comparison of seed megatron-3624): TE's
core attention has an `_extra_state` that its own `sharded_state_dict` leaves out; the local
`DotProductAttention` is given the same empty extra state (`_use_te_like_core_attention`), in
every case, so the buggy ModuleList path of 0.16.1 shows the seed's extra key.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common

WRITER = "megatron"
PACKAGE = "megatron-core"
SCRIPT = "write_megatron.py"
WORLD = 2
TP = 2
EP = 2
HIDDEN = 16
VOCAB = 64
LAYERS = 2
EXPERTS = 4


def _config() -> Any:
    import torch
    from megatron.core.transformer.transformer_config import TransformerConfig

    return TransformerConfig(
        num_layers=LAYERS,
        hidden_size=HIDDEN,
        ffn_hidden_size=32,
        num_attention_heads=2,
        num_query_groups=2,
        tensor_model_parallel_size=TP,
        expert_model_parallel_size=EP,
        expert_tensor_parallel_size=1,
        num_moe_experts=EXPERTS,
        moe_router_topk=2,
        moe_ffn_hidden_size=8,
        moe_grouped_gemm=False,
        moe_token_dispatcher_type="allgather",
        mtp_num_layers=1,
        normalization="RMSNorm",
        params_dtype=torch.bfloat16,
        bf16=True,
        use_cpu_initialization=True,
        perform_initialization=True,
        gradient_accumulation_fusion=False,
        bias_dropout_fusion=False,
        masked_softmax_fusion=False,
        apply_rope_fusion=False,
        persist_layer_norm=False,
        add_bias_linear=False,
    )


def _build_model(seed: int) -> Any:
    import torch
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import (
        get_gpt_layer_local_spec,
        get_gpt_mtp_block_spec,
    )

    config = _config()
    layer_spec = get_gpt_layer_local_spec(
        num_experts=EXPERTS, moe_grouped_gemm=False, normalization="RMSNorm"
    )
    mtp_spec = get_gpt_mtp_block_spec(config, layer_spec, use_transformer_engine=False)
    torch.manual_seed(seed)
    return GPTModel(
        config=config,
        transformer_layer_spec=layer_spec,
        vocab_size=VOCAB,
        max_sequence_length=32,
        position_embedding_type="rope",
        mtp_block_spec=mtp_spec,
    )


def _mtp_sharded_state_dict_fixed(
    self: Any, prefix: str = "", sharded_offsets: tuple = (), metadata: dict | None = None
) -> dict:
    """The seed megatron-3624 fix, as behaviour: build the MTP block's sharded state dict from
    each layer's own `sharded_state_dict` only (the block has no tensors outside its layers).
    Same layer prefixes as megatron-core 0.16.1 uses in the per-layer loop."""
    from megatron.core.dist_checkpointing.utils import replace_prefix_for_sharding
    from megatron.core.transformer.multi_token_prediction import get_mtp_layer_offset

    out: dict = {}
    layer_prefix = f"{prefix}layers."
    for layer in self.layers:
        offset = get_mtp_layer_offset(self.config, self.vp_stage)
        sharded_prefix = f"{layer_prefix}{layer.layer_number - 1}."
        state_dict_prefix = f"{layer_prefix}{layer.layer_number - 1 - offset}."
        sd = layer.sharded_state_dict(state_dict_prefix, [], metadata)
        replace_prefix_for_sharding(sd, state_dict_prefix, sharded_prefix)
        out.update(sd)
    return out


def _core_attention_extra_state(self: Any) -> None:
    """TransformerEngine stand-in: TE's core attention carries an `_extra_state` (its FP8
    metadata) that its own `sharded_state_dict` leaves out, exactly like megatron-core's local
    `DotProductAttention.sharded_state_dict` leaves out everything but a learnable softmax
    offset. The local class has no extra state, so it is given one here, empty like the local
    linear layers' (`get_extra_state() -> None`)."""
    return None


def _use_te_like_core_attention() -> None:
    from megatron.core.transformer.dot_product_attention import DotProductAttention

    DotProductAttention.get_extra_state = _core_attention_extra_state
    DotProductAttention.set_extra_state = lambda self, state: None


def _rng_state(rank: int) -> Any:
    """Megatron-LM keeps per-(pp, tp) RNG state as one ShardedObject family `rng_state`; the
    payload here is the CPU generators only (no CUDA generator exists)."""
    import numpy as np
    import torch
    from megatron.core import parallel_state as ps
    from megatron.core.dist_checkpointing.mapping import ShardedObject

    payload = [
        {
            "random_rng_state": random.getstate(),
            "np_rng_state": np.random.get_state(),
            "torch_rng_state": torch.get_rng_state(),
        }
    ]
    pp_rank, pp_size = (
        ps.get_pipeline_model_parallel_rank(),
        ps.get_pipeline_model_parallel_world_size(),
    )
    tp_rank, tp_size = (
        ps.get_tensor_model_parallel_rank(),
        ps.get_tensor_model_parallel_world_size(),
    )
    return ShardedObject(
        "rng_state",
        payload,
        (pp_size, tp_size),
        (pp_rank, tp_rank),
        replica_id=ps.get_data_parallel_rank(with_context_parallel=True),
    )


def _fault(machine: Any, iteration: int) -> None:
    """Leave the rerun machine as a fault that must be re-run from a checkpoint does."""
    from megatron.core.rerun_state_machine import RerunState

    machine.state = RerunState.WILL_RERUN_FROM_CHECKPOINT
    machine.checkpoint_requested = True
    machine.rerun_requested = True
    machine.current_iteration = iteration


def _args(cached_plan: bool) -> argparse.Namespace:
    """The `args` Megatron-LM's training loop keeps in the common state (an argparse
    Namespace; a few of its fields, those that describe this run)."""
    return argparse.Namespace(
        num_layers=LAYERS,
        hidden_size=HIDDEN,
        num_attention_heads=2,
        num_experts=EXPERTS,
        mtp_num_layers=1,
        tensor_model_parallel_size=TP,
        pipeline_model_parallel_size=1,
        expert_model_parallel_size=EP,
        world_size=WORLD,
        ckpt_format="torch_dist",
        ckpt_assume_constant_structure=cached_plan,
        rerun_mode="validate_results",
        padded_vocab_size=VOCAB,
    )


def _state_dict(
    model: Any, machine: Any, iteration: int, rank: int, cached_plan: bool = False
) -> dict:
    """What Megatron-LM's `generate_state_dict` assembles: `args`, `checkpoint_version`,
    `iteration`, `model`, `rerun_state_machine` (only when the machine returns a state) and
    `rng_state`."""
    sd: dict[str, Any] = {
        "args": _args(cached_plan),
        "checkpoint_version": 3.0,
        "iteration": iteration,
        "model": model.sharded_state_dict(),
        "rng_state": _rng_state(rank),
    }
    rerun = machine.state_dict(None, "torch_dist")
    if rerun:
        sd["rerun_state_machine"] = rerun
    return sd


def _rank_main(rank: int, world: int, case: str, out: str) -> None:
    import torch
    from megatron.core import dist_checkpointing
    from megatron.core import parallel_state as ps
    from megatron.core.dist_checkpointing.strategies.torch import TorchDistSaveShardedStrategy
    from megatron.core.rerun_state_machine import (
        RerunMode,
        get_rerun_state_machine,
        initialize_rerun_state_machine,
    )
    from megatron.core.transformer import multi_token_prediction as mtp

    _use_te_like_core_attention()
    if case != "megatron-3624-mtp-extra-state":
        mtp.MultiTokenPredictionBlock.sharded_state_dict = _mtp_sharded_state_dict_fixed

    ps.initialize_model_parallel(
        tensor_model_parallel_size=TP,
        expert_model_parallel_size=EP,
        expert_tensor_parallel_size=1,
    )
    random.seed(1234)
    import numpy as np

    np.random.seed(1234)
    model = _build_model(seed=1234)
    initialize_rerun_state_machine(mode=RerunMode.VALIDATE_RESULTS)
    machine = get_rerun_state_machine()
    dest = Path(out)

    def save(folder: Path, *, strategy: Any = None, validate: bool = True, it: int = 1) -> None:
        cached = strategy is not None
        if rank == 0:
            folder.mkdir(parents=True, exist_ok=True)
        torch.distributed.barrier()
        with _common.cpu_cuda_shims():
            dist_checkpointing.save(
                _state_dict(model, machine, it, rank, cached),
                str(folder),
                sharded_strategy=strategy,
                validate_access_integrity=validate,
            )
        torch.distributed.barrier()

    if case in ("healthy", "missing-distcp", "megatron-3624-mtp-extra-state"):
        save(dest)
    elif case == "healthy-rerun-active":
        _fault(machine, 1)
        save(dest)
    elif case == "megatron-4448-cached-plan":
        strategy = TorchDistSaveShardedStrategy("torch_dist", 1, cached_metadata=True)
        scratch = dest.parent / f".{dest.name}-steady"
        save(scratch / "iter_0000001", strategy=strategy, it=1)
        save(scratch / "iter_0000002", strategy=strategy, it=2)
        _fault(machine, 3)
        save(dest, strategy=strategy, it=3)
    elif case == "torch-dist-object-incomplete":
        if rank == 1:
            _fault(machine, 1)
        save(dest, validate=False)
    else:
        raise ValueError(case)

    _verify_roundtrip(rank, model, dest, case)
    ps.destroy_model_parallel()


def _verify_roundtrip(rank: int, model: Any, dest: Path, case: str) -> None:
    """Load the model part back with megatron-core's own loader into a freshly built model
    (other weights) and compare every tensor with what was saved."""
    import torch
    from megatron.core import dist_checkpointing

    if case == "missing-distcp":
        return  # the file is deleted after this returns; the healthy case covers the load
    fresh = _build_model(seed=99)
    sharded = {"model": fresh.sharded_state_dict()}
    with _common.cpu_cuda_shims():
        loaded = dist_checkpointing.load(sharded, str(dest), strict="assume_ok_unexpected")
    fresh.load_state_dict(loaded["model"], strict=False)
    saved = {k: v for k, v in model.state_dict().items() if isinstance(v, torch.Tensor)}
    got = {k: v for k, v in fresh.state_dict().items() if isinstance(v, torch.Tensor)}
    equal = saved.keys() == got.keys() and all(torch.equal(saved[k], got[k]) for k in saved)
    if not equal:
        bad = sorted(
            k
            for k in saved.keys() | got.keys()
            if k not in saved or k not in got or not torch.equal(saved[k], got[k])
        )
        print(f"rank {rank} roundtrip differs: {bad}", flush=True)
    flags = [None] * 2
    torch.distributed.all_gather_object(flags, equal)
    if rank == 0:
        (dest.parent / f".{dest.name}-roundtrip.json").write_text(json.dumps(all(flags)))


def main() -> None:
    import shutil

    cases = {
        "healthy": (True, None, None, "idle rerun state machine, one save"),
        "healthy-rerun-active": (
            True,
            None,
            None,
            "rerun state machine active (WILL_RERUN_FROM_CHECKPOINT) in common state, every "
            "rank's rerun_state_machine_state shard saved",
        ),
        "megatron-4448-cached-plan": (
            False,
            "megatron-4448",
            "cached save plan (cached_metadata=True) reused after the rerun machine became "
            "active: common state says active, no rerun_state_machine_state/shard_* entries",
            "third save with a cached plan after a fault",
        ),
        "missing-distcp": (
            False,
            None,
            "healthy save, then __1_1.distcp deleted",
            "one .distcp file lost",
        ),
        "megatron-3624-mtp-extra-state": (
            False,
            "megatron-3624",
            "megatron-core 0.16.1 as released: the MTP block builds part of its sharded state "
            "dict from the ModuleList state_dict() fallback",
            "MTP layer key set differs from the decoder layers",
        ),
        "torch-dist-object-incomplete": (
            False,
            None,
            "rerun machine active on rank 1 only: rerun_state_machine_state holds shard_1_2 "
            "but not shard_0_2 (access validation off)",
            "a sharded-object family missing one of its declared shards",
        ),
    }
    only = sys.argv[1:] or list(cases)
    for case in only:
        healthy, seed, damage, description = cases[case]
        dest = _common.case_dir(WRITER, case)
        _common.spawn(_rank_main, WORLD, case, str(dest))
        scratch = dest.parent / f".{case}-steady"
        if scratch.exists():
            shutil.rmtree(scratch)
        roundtrip_file = dest.parent / f".{case}-roundtrip.json"
        roundtrip = json.loads(roundtrip_file.read_text()) if roundtrip_file.exists() else None
        roundtrip_file.unlink(missing_ok=True)
        if case == "missing-distcp":
            victims = sorted(dest.glob("__1_*.distcp"))
            victims[-1].unlink()
        _common.record(
            WRITER,
            case,
            package=PACKAGE,
            script=SCRIPT,
            description=description,
            healthy=healthy,
            seed=seed,
            damage=damage,
            extra={
                "world_size": WORLD,
                "parallelism": {"tp": TP, "ep": EP, "etp": 1, "pp": 1},
                "spec": "local (TransformerEngine-free)",
                "roundtrip_equal": roundtrip,
            },
        )


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
