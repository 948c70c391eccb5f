"""Run by torchrun for tests/torchrun_job.py: `python verify_ranks_probe.py OUT COMMANDS`
runs each CLI command of the JSON list COMMANDS in turn, in the same processes (as a training
loop calls `write_manifest` after each save), exactly as `python -m inspector ...` would run
it, and records per command in OUT/rank<RANK>.json what this rank printed, its exit code, the
files it read (every file read by the hashing goes through `hashing._hash_one`), the DCP
tensors it assembled (`TensorData.tensor_bytes`) and the files it wrote (`write_atomic`)."""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import os
import sys
from pathlib import Path
from typing import Any

from inspector._internal.cli.main import main
from inspector._internal.formats.tensordata import TensorData
from inspector._internal.integrity import hashing

# The module, not the function of the same name the package exports.
verify_module = importlib.import_module("inspector._internal.integrity.verify")

out, commands = Path(sys.argv[1]), json.loads(Path(sys.argv[2]).read_text())
rank = int(os.environ["RANK"])
current: dict[str, Any] = {}

real_hash_one = hashing._hash_one
real_tensor_bytes = TensorData.tensor_bytes
real_write = verify_module.write_atomic


def hash_one(storage: Any, rel: str, size: int, **kw: Any) -> Any:
    current["read"].append([str(storage.path), rel, size])
    return real_hash_one(storage, rel, size, **kw)


def tensor_bytes(self: TensorData, name: str) -> Any:
    current["tensors"].append(name)
    return real_tensor_bytes(self, name)


def write_atomic(path: Path, data: bytes, **kw: Any) -> None:
    current["wrote"].append(str(path))
    real_write(path, data, **kw)


hashing._hash_one = hash_one  # type: ignore[assignment]
TensorData.tensor_bytes = tensor_bytes  # type: ignore[method-assign]
verify_module.write_atomic = write_atomic  # type: ignore[assignment]

runs = []
for argv in commands:
    current.update(read=[], tensors=[], wrote=[])
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = main(argv)
    runs.append({"argv": argv, "rc": code, "stdout": printed.getvalue(), **current})
(out / f"rank{rank}.json").write_text(json.dumps(runs))
