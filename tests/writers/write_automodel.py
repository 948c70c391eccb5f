"""Write DCP-sharded safetensors checkpoints with the REAL NeMo AutoModel 0.7 `Checkpointer.
save_model` from 2 gloo ranks on 127.0.0.1: `model/shard-0000R-model-0000I-of-0000N.safetensors`,
`model/.hf_metadata/` (config, `fqn_to_file_index_mapping.json`, ...) and `model/consolidate.sh`.

Model: a tiny transformers Qwen3-MoE (hidden 16, 3 layers, 4 experts), fully sharded with
PyTorch FSDP2 (`fully_shard`) on a 2-rank CPU mesh, so every parameter is a DTensor split over
the two ranks. The "upstream" model NeMo fine-tunes and takes its output file assignment from
is the same tiny model saved by transformers `save_pretrained` in 4 shards; each rank loads it with
`from_pretrained` and `model_repo_id` names that local folder (NeMo accepts a path as it accepts
a hub snapshot). Every case folder holds `model/` (what NeMo wrote: the checkpoint under test)
and `upstream/` (the reference's `model.safetensors.index.json` and `config.json` only). The
ranks work in the case's scratch folder with relative paths, so `consolidate.sh` names
`upstream` and `./model`, the same on every run.

Cases (tests/fixtures/writers/automodel/<case>/):

- `healthy`: upstream shards named `model-0000N-of-00004.safetensors`.
- `automodel-2289-collapsed-mapping`: upstream shards named like Qwen3.5's
  (`model.safetensors-0000N-of-00004.safetensors`, index rewritten to match). NeMo AutoModel
  0.7 already carries the seed's fix (it parses `-(\\d+)-of-(\\d+)\\.safetensors$` and falls
  back to sorted file order), so the one step the seed describes is patched back to its old
  behaviour here (`_pre_2289_mapping`): each upstream file's output index is read from the
  token after a `model` token of `name.split("-")`, and a name with no such token counts as
  file 1. Every upstream file then maps to 1, the mapping collapses and NeMo writes one output
  file per rank.
- `last-rank-lost`: the healthy save, then every file of rank 2 (`shard-00002-*`) deleted.

The manifest records sha256 of every tensor of the full state dict NeMo saved (gathered from
the DTensors, `writer_state`), and of NeMo's own offline consolidator
(`nemo_automodel.components.checkpoint._backports.consolidate_hf_safetensors.
consolidate_safetensors_files`, what `consolidate.sh` runs) and PyTorch's on the healthy and
2289 outputs (`nemo_consolidated`, `torch_consolidated`: hashes, or the error raised).

Install: `pip install --no-deps nemo-automodel==0.7.0` (its declared dependencies include GPU
kernels; the checkpoint modules need only torch, transformers and safetensors). No shim.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common

# The file-name table, from the project's source tree (the writers' environments do not
# install the project; importing it takes the standard library alone).
sys.path.insert(1, str(_common.REPO))

from inspector._internal.common.filenames import CONFIG_NAME, INDEX_NAME

WRITER = "automodel"
PACKAGE = "nemo-automodel"
SCRIPT = "write_automodel.py"
WORLD = 2
UPSTREAM_SHARD = "12KB"


def _config() -> Any:
    from transformers import Qwen3MoeConfig

    return Qwen3MoeConfig(
        vocab_size=64,
        hidden_size=16,
        head_dim=8,
        intermediate_size=32,
        moe_intermediate_size=8,
        num_hidden_layers=3,
        num_attention_heads=2,
        num_key_value_heads=1,
        num_experts=4,
        num_experts_per_tok=2,
        mlp_only_layers=[0],
        tie_word_embeddings=False,
    )


def _model(upstream: Path | None = None) -> Any:
    """The random tiny model (seed 0), or, given `upstream`, the same model loaded from there
    as a fine-tuning run starts (so config.json carries `architectures` like a hub model)."""
    import torch
    from transformers import Qwen3MoeForCausalLM

    if upstream is not None:
        return Qwen3MoeForCausalLM.from_pretrained(upstream)
    torch.manual_seed(0)
    return Qwen3MoeForCausalLM(_config())


def write_upstream(folder: Path, *, qwen35_names: bool) -> None:
    """The model NeMo fine-tunes, as transformers saves it (4 shards + index); with
    `qwen35_names` the shards carry Qwen3.5's upstream names instead."""
    model = _model()
    model.save_pretrained(folder, max_shard_size=UPSTREAM_SHARD)
    if not qwen35_names:
        return
    index_path = folder / INDEX_NAME
    index = json.loads(index_path.read_text())
    renames = {
        name: name.replace("model-", "model.safetensors-", 1)
        for name in set(index["weight_map"].values())
    }
    for old, new in renames.items():
        (folder / old).rename(folder / new)
    index["weight_map"] = {k: renames[v] for k, v in index["weight_map"].items()}
    index_path.write_text(json.dumps(index, indent=2))


def _pre_2289_mapping(reference_model_path: str, key_mapping: Any = None) -> dict[str, int]:
    """The mapping step as it was before the seed's fix: output index = the token after a
    `model` token of the file name split on `-`, file 1 when there is none."""

    def index_of(filename: str) -> int:
        parts = filename.split("/")[-1].split("-")
        for i, part in enumerate(parts[:-1]):
            if part == "model":
                return int(parts[i + 1])
        return 1

    index = json.loads((Path(reference_model_path) / INDEX_NAME).read_text())
    return {fqn: index_of(filename) for fqn, filename in index["weight_map"].items()}


def _rank_main(rank: int, world: int, workdir: str, patch_2289: bool) -> None:
    """One training rank, working in `workdir` with relative paths (`upstream`, `.`), so the
    paths NeMo writes into `consolidate.sh` are the fixture's own and the same every run."""
    import torch
    from nemo_automodel.components.checkpoint import checkpointing
    from nemo_automodel.components.checkpoint.config import CheckpointingConfig
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import init_device_mesh

    if patch_2289:
        checkpointing.get_fqn_to_file_index_mapping = _pre_2289_mapping

    os.chdir(workdir)
    upstream, out = "upstream", "."
    mesh = init_device_mesh("cpu", (world,))
    model = _model(Path(upstream))
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    config = CheckpointingConfig(
        enabled=True,
        checkpoint_dir=out,
        model_save_format="safetensors",
        model_repo_id=upstream,
        model_cache_dir=upstream,
        save_consolidated=False,
        is_peft=False,
    )
    checkpointer = checkpointing.Checkpointer(config, dp_rank=rank, tp_rank=0, pp_rank=0)
    checkpointer.save_model(model, out)
    checkpointer.close()
    # The full tensors NeMo saved: gathered from the DTensors of the state dict it saved.
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    full = {
        k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().cpu()
        for k, v in get_model_state_dict(model).items()
    }
    if rank == 0:
        torch.save(full, Path(out) / "writer-state.pt")


def nemo_consolidate(src: Path, mapping: dict[str, int]) -> dict[str, Any]:
    from nemo_automodel.components.checkpoint._backports.consolidate_hf_safetensors import (
        consolidate_safetensors_files,
    )

    return _run_consolidator(consolidate_safetensors_files, src, mapping)


def torch_consolidate(src: Path, mapping: dict[str, int]) -> dict[str, Any]:
    from torch.distributed.checkpoint._consolidate_hf_safetensors import (
        consolidate_safetensors_files,
    )

    return _run_consolidator(consolidate_safetensors_files, src, mapping)


def _run_consolidator(fn: Any, src: Path, mapping: dict[str, int]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "consolidated"
        out.mkdir()
        try:
            fn(str(src), str(out), mapping)
        except Exception as exc:  # recorded: the manifest says whether it ran
            return {"ran": False, "error": f"{type(exc).__name__}: {exc}"}
        files = sorted(p.name for p in out.glob("*.safetensors"))
        return {"ran": True, "files": files, "tensors": _common.safetensors_folder_hashes(out)}


def main() -> None:
    import torch

    cases = {
        "healthy": (False, False),
        "automodel-2289-collapsed-mapping": (True, True),
        "last-rank-lost": (False, False),
    }
    only = sys.argv[1:] or list(cases)
    for case in only:
        qwen35_names, patch = cases[case]
        dest = _common.case_dir(WRITER, case)
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            write_upstream(work / "upstream", qwen35_names=qwen35_names)
            upstream_files = sorted(p.name for p in (work / "upstream").glob("*.safetensors"))
            _common.spawn(_rank_main, WORLD, str(work), patch)
            shutil.copytree(work / "model", dest / "model")
            # The reference NeMo read its output assignment from: its index and config (the
            # shards themselves are not needed to see what the mapping should have been).
            (dest / "upstream").mkdir()
            for name in (INDEX_NAME, CONFIG_NAME):
                shutil.copy2(work / "upstream" / name, dest / "upstream" / name)
            full = torch.load(work / "writer-state.pt", weights_only=True)
        model_dir = dest / "model"
        mapping = json.loads(
            (model_dir / ".hf_metadata" / "fqn_to_file_index_mapping.json").read_text()
        )
        consolidated: dict[str, Any] = {}
        if case != "last-rank-lost":
            consolidated = {
                "nemo_consolidated": nemo_consolidate(model_dir, mapping),
                "torch_consolidated": torch_consolidate(model_dir, mapping),
            }
        else:
            for path in model_dir.glob(f"shard-{WORLD:05d}-*"):
                path.unlink()
        _common.record(
            WRITER,
            case,
            package=PACKAGE,
            script=SCRIPT,
            description={
                "healthy": "Checkpointer.save_model of an FSDP2-sharded Qwen3-MoE, 2 gloo ranks",
                "automodel-2289-collapsed-mapping": (
                    "upstream shards named model.safetensors-0000N-of-00004.safetensors, "
                    "pre-fix file-index parsing"
                ),
                "last-rank-lost": "healthy save, then every shard-00002-* file deleted",
            }[case],
            healthy=case == "healthy",
            seed="automodel-2289" if patch else None,
            damage={
                "healthy": None,
                "automodel-2289-collapsed-mapping": (
                    "fqn_to_file_index_mapping derived with the pre-fix parser: every tensor "
                    "maps to output file 1 although the upstream has 4 files"
                ),
                "last-rank-lost": "all shard-00002-* files deleted",
            }[case],
            extra={
                "world_size": WORLD,
                "checkpoint": "model",
                "reference": "upstream",
                "upstream_files": upstream_files,
                "writer_state": _common.state_dict_hashes(full),
                **consolidated,
            },
        )


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
