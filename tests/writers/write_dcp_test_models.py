"""Write the two 2-rank checkpoints several test files read, with the tests' own writer
functions (tests/dcp_writers.py), so that no test spawns a pair of gloo ranks to make them.

Cases (tests/fixtures/writers/torch-dcp/<case>/):

- `test-model`: `model/` saved by PyTorch's REAL `HuggingFaceStorageWriter(save_distributed=
  True)` from 2 gloo ranks (DTensors on a 2-rank CPU DeviceMesh), plus NeMo AutoModel's
  `.hf_metadata/` (config and `fqn_to_file_index_mapping.json`) written from rank 0 the way
  AutoModel does: the checkpoint of tests/test_consolidate.py, test_consolidate_dest.py,
  test_consolidate_torchrun.py, test_dcp_sharded.py and test_healthy_writers.py (conftest's
  `dcp_checkpoint`). bf16, f32, int32, int8 and bool tensors; uneven splits; an empty chunk; a
  0-d tensor only rank 0 keeps.
- `megatron-style-2rank`: a Megatron-style torch_dist run (tracker file and `iter_0000100/`)
  saved by `torch.distributed.checkpoint.save` from 2 gloo ranks, DTensors sharded over a
  2-rank mesh, one rerun-state shard per rank, `metadata.json` and `common.pt` with the rerun
  machine active: the project's `save_megatron_dcp` (inspector/_internal/demo/torch_dist.py)
  stands for Megatron's save path (tests/test_torch_dist.py; the real megatron-core cases are
  under tests/fixtures/writers/megatron/).

The manifest records the sha256 of every tensor of the full state dict the ranks distributed
(`writer_state`). Volatile bytes, left as written: the safetensors library writes the
`__metadata__` object of `test-model` from a Rust HashMap, so the order of its keys changes
from run to run; the `.metadata` of `megatron-style-2rank` pickles `storage_meta.save_id` (a fresh
uuid per save, PyTorch's FileSystemWriter) and `storage_meta.checkpoint_id` (the folder's path
at save time). Every tensor entry, every data byte and every other field of the metadata is
identical across runs (checked by writing both cases twice).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common

# The tests' writer module, and the project's Megatron save path it imports for the torch_dist
# case (a source tree: the writers' environment does not install the project).
sys.path.insert(1, str(_common.REPO))
sys.path.insert(1, str(_common.REPO / "tests"))

import dcp_writers

WRITER = "torch-dcp"
PACKAGE = "torch"
SCRIPT = "write_dcp_test_models.py"


def write_test_model() -> None:
    case = "test-model"
    dest = _common.case_dir(WRITER, case)
    dcp_writers.write_dcp_checkpoint(dest / "model")
    _common.record(
        WRITER,
        case,
        package=PACKAGE,
        script=SCRIPT,
        description=(
            "HuggingFaceStorageWriter(save_distributed=True) from 2 gloo ranks, with NeMo "
            "AutoModel's .hf_metadata/ (tests/dcp_writers.py write_dcp_checkpoint)"
        ),
        healthy=True,
        extra={
            "world_size": dcp_writers.WORLD_SIZE,
            "checkpoint": "model",
            "fqn_to_index_mapping": dcp_writers.MAPPING,
            "shard_dims": {n: p.shard_dim for n, p in dcp_writers.tensor_plan().items()},
            "writer_state": _common.state_dict_hashes(dcp_writers.full_tensors()),
        },
    )


def write_torch_dist_run() -> None:
    case = "megatron-style-2rank"
    dest = _common.case_dir(WRITER, case)
    dcp_writers.write_torch_dist_run(dest)
    _common.record(
        WRITER,
        case,
        package=PACKAGE,
        script=SCRIPT,
        description=(
            "dcp.save of a Megatron-style torch_dist run from 2 gloo ranks, rerun machine "
            "active (tests/dcp_writers.py write_torch_dist_run)"
        ),
        healthy=True,
        extra={
            "world_size": dcp_writers.WORLD_SIZE,
            "shard_dims": {n: d for n, (_, d) in dcp_writers.torch_dist_tensors().items()},
        },
    )


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    write_test_model()
    write_torch_dist_run()
