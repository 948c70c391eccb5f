"""The test run's one torchrun job (`conftest.torchrun_job`): 2 real ranks (gloo on 127.0.0.1,
CPU) run every CLI command that tests/test_verify_torchrun.py and
tests/test_consolidate_torchrun.py ask about, one after another in the same two processes
(`verify_ranks_probe.py`), as a training loop would. Each launch cost about 6 CPU-s, most of
it torchrun and both ranks importing torch: one launch for the two files, not one each.

`make_job(folder, dcp_checkpoint)` writes the checkpoints the commands read (copies of the
golden fixtures, one damaged after its manifest was recorded), runs the job and keeps in
`folder`: `job.json` (the launch's exit code and output) and `rank<R>.json` (per command,
what the rank printed, its exit code, what it read and wrote). `COMMANDS` names each
command's place in those lists.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

from dcp_writers import full_tensors
from test_verify import DCP, MIXTRAL, OTHER, SHARD, flip_byte

from inspector import write_manifest

TORCHRUN = Path(sys.executable).with_name("torchrun")
PROBE = Path(__file__).resolve().parent / "verify_ranks_probe.py"

# Each command's index in a rank's list of runs.
COMMANDS = (
    "manifest",
    "verify-hash",
    "verify-tensor",
    "verify-against",
    "manifest-dcp",
    "consolidate",
)


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


def consolidate_mapping() -> dict[str, int]:
    """The DCP tensors in three outputs: rank 1 writes files 1 and 3, rank 0 file 2 (and the
    index)."""
    return {n: 1 + k % 3 for k, n in enumerate(full_tensors())}


def make_job(folder: Path, dcp_checkpoint: Path) -> None:
    """Write the commands' checkpoints under `folder` and run the job there (see above)."""
    healthy = folder / "healthy"
    shutil.copytree(MIXTRAL, healthy)
    damaged = folder / "damaged"
    shutil.copytree(MIXTRAL, damaged)
    write_manifest(damaged)  # recorded healthy, then damaged in transfer
    flip_byte(damaged / SHARD, damaged / OTHER)
    dcp = folder / "dcp"
    shutil.copytree(DCP, dcp)
    # The consolidation's source keeps a content manifest: DEST gets its own, every rank's
    # outputs in it.
    source = folder / "model"
    shutil.copytree(dcp_checkpoint, source)
    write_manifest(source)
    (folder / "map.json").write_text(json.dumps(consolidate_mapping()))
    commands = [
        ["manifest", str(healthy), "-o", str(folder / "ranks.json")],
        ["verify", str(damaged), "--level", "hash", "--json"],
        ["verify", str(damaged), "--level", "tensor", "--json"],
        ["verify", str(damaged), "--against", str(healthy), "--level", "hash", "--json"],
        ["manifest", str(dcp), "-o", str(folder / "dcp-ranks.json")],
        ["consolidate", str(source), str(folder / "out"), "--mapping", str(folder / "map.json"),
         "--no-progress", "--verify-data"],
    ]  # fmt: skip
    assert len(commands) == len(COMMANDS)
    (folder / "commands.json").write_text(json.dumps(commands))
    proc = torchrun(str(PROBE), str(folder), str(folder / "commands.json"))
    job = {"rc": proc.returncode, "output": proc.stdout + proc.stderr}
    (folder / "job.json").write_text(json.dumps(job))


def job_ranks(folder: Path) -> list[list[dict[str, Any]]]:
    """What each rank (0, then 1) did for each command (in the order of COMMANDS) in the job
    run in `folder`, once the launch is known to have succeeded."""
    job = json.loads((folder / "job.json").read_text())
    assert job["rc"] == 0, job["output"]
    ranks = [json.loads((folder / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [[run["argv"][0] for run in runs] for runs in ranks] == [
        [c.partition("-")[0] for c in COMMANDS]
    ] * 2
    return ranks
