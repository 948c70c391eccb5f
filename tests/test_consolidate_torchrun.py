"""`ckpt-inspect consolidate` under torchrun: 2 processes share the output files (file i goes to
rank i % 2, as torch's own multi-rank consolidation does), rank 0 writes the index last."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from dcp_writers import full_tensors
from safetensors.torch import load_file

from inspector import verify, write_manifest
from inspector._internal.common.filenames import CONFIG_NAME, INDEX_NAME

TORCHRUN = Path(sys.executable).with_name("torchrun")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def torchrun(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`torchrun --nproc-per-node 2 ARGS...` on 127.0.0.1 (a free port), one OpenMP thread
    per rank; stdout and stderr captured."""
    port = _free_port()
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), **(env or {})}
    env["OMP_NUM_THREADS"] = "1"
    cmd = [
        str(TORCHRUN),
        "--nproc-per-node",
        "2",
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(port),
        *args,
    ]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.skipif(not TORCHRUN.exists(), reason="torchrun is not installed beside python")
def test_two_processes_split_the_outputs(
    tmp_path_factory: pytest.TempPathFactory, dcp_checkpoint: Path
) -> None:
    work = tmp_path_factory.mktemp("torchrun")
    # The source keeps a content manifest: DEST gets its own, every rank's outputs in it.
    source = work / "model"
    shutil.copytree(dcp_checkpoint, source)
    write_manifest(source)
    names = list(full_tensors())
    # Three outputs: rank 1 writes files 1 and 3, rank 0 file 2 (and the index).
    mapping = {n: 1 + k % 3 for k, n in enumerate(names)}
    (work / "map.json").write_text(json.dumps(mapping))
    dest = work / "out"
    proc = torchrun(
        "-m",
        "inspector",
        "consolidate",
        str(source),
        str(dest),
        "--mapping",
        str(work / "map.json"),
        "--no-progress",
        "--verify-data",
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr

    # Only rank 0 prints: its plan, then its share of the work and the verification.
    assert proc.stdout.count("Consolidation plan") == 1
    assert "(rank 0 of 2): wrote 1 file," in proc.stdout
    assert "verify: re-scanned and checked the output: no finding" in proc.stdout
    assert f"verify data: {len(names)} tensor hashes vs the source: all match" in proc.stdout

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
