"""`python -m inspector ...` in a fresh process, as the tests run the CLI from outside.

Tests import it as `from commands import cli` (pytest puts tests/ on the path).
"""

from __future__ import annotations

import shlex
import subprocess
import sys

# The commands that build the model named by config.json unless told `--no-model`.
MODEL_COMMANDS = frozenset({"check", "report", "repair"})
# A shell prefix's user namespace (`cli(..., wrap=...)`).
UNSHARE = ["unshare", "--user", "--map-root-user", "--mount"]


def cli(
    *args: object,
    model: bool = False,
    wrap: str | None = None,
    timeout: float = 300,
    **popen: object,
) -> subprocess.CompletedProcess[str]:
    """Run `python -m inspector ARGS` with no stdin; its output captured as text.

    The model is left out (`--no-model`) unless `model=True`: importing torch and
    transformers costs each process 4-5 s of CPU, and the load check has tests of its own
    (tests/test_model_load.py, tests/test_hostile_load_check.py, the console-script test).
    `wrap` is a shell prefix run in a user namespace (`UNSHARE`) before the CLI."""
    argv = [str(a) for a in args]
    if not model and argv and argv[0] in MODEL_COMMANDS:
        argv.append("--no-model")
    cmd = [sys.executable, "-m", "inspector", *argv]
    if wrap is not None:
        cmd = [*UNSHARE, "sh", "-c", f"{wrap} && exec {shlex.join(cmd)}"]
    return subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL, **popen
    )
