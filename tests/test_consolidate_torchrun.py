"""`ckpt-inspect consolidate` under torchrun: 2 processes share the output files (file i goes to
rank i % 2, as torch's own multi-rank consolidation does), rank 0 writes the index last. The
command runs in the run's one torchrun launch (tests/torchrun_job.py, shared with
test_verify_torchrun), after the others, in the same two processes."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from dcp_writers import full_tensors
from safetensors.torch import load_file
from torchrun_job import COMMANDS, consolidate_mapping, job_ranks

from inspector import verify
from inspector._internal.common.filenames import CONFIG_NAME, INDEX_NAME


def test_two_processes_split_the_outputs(torchrun_job: Path) -> None:
    runs = [runs[COMMANDS.index("consolidate")] for runs in job_ranks(torchrun_job)]
    assert [r["rc"] for r in runs] == [0, 0], runs
    names = list(full_tensors())
    mapping = consolidate_mapping()
    source, dest = torchrun_job / "model", torchrun_job / "out"

    # Only rank 0 prints: its plan, then its share of the work and the verification.
    stdout = "".join(r["stdout"] for r in runs)
    assert runs[1]["stdout"] == ""
    assert stdout.count("Consolidation plan") == 1
    assert "(rank 0 of 2): wrote 1 file," in stdout
    assert "verify: re-scanned and checked the output: no finding" in stdout
    assert f"verify data: {len(names)} tensor hashes vs the source: all match" in stdout

    files = sorted(p.name for p in dest.iterdir())
    assert files == [
        "ckpt-inspect-manifest.json",
        CONFIG_NAME,
        "model-00001-of-00003.safetensors",
        "model-00002-of-00003.safetensors",
        "model-00003-of-00003.safetensors",
        INDEX_NAME,
    ]
    index = json.loads((dest / INDEX_NAME).read_text())
    assert index["weight_map"] == {
        n: f"model-{i:05d}-of-00003.safetensors" for n, i in sorted(mapping.items())
    }
    got: dict[str, torch.Tensor] = {}
    for file in dest.glob("*.safetensors"):
        got.update(load_file(file))
    for name, tensor in full_tensors().items():
        assert torch.equal(got[name], tensor), name
    for level in ("size", "hash", "tensor"):
        assert verify(dest, level=level).findings == (), level
    assert verify(dest, against=str(source), level="tensor").findings == ()
