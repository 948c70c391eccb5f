"""CLI benchmark: `ckpt-inspect scan` and `ckpt-inspect check --no-model` as a user runs them,
each a fresh process, against the floor process (read every shard header and `json.loads` it).

    python benchmarks/bench_cli.py                        # the drifted ~300k-tensor checkpoint
    python benchmarks/bench_cli.py --tensors 1000000      # 1M tensors
    python benchmarks/bench_cli.py --baseline /tmp/base   # also an older tree (its `inspector`
                                                          # folder's parent), run side by side

The checkpoint is the drifted copy of `bench_check.py` (so `check` has findings to group).
Every tool runs once per round, the rounds interleaved, the best wall and CPU time (user +
system of the child) of `--runs` kept: on a shared machine the CPU ratios hold, the wall
ratios only at a low load. Peak memory is the process's VmHWM
minus that of a process that ran both commands on a missing folder (their imports), per
tensor. Bytecode is written on the first run (PYTHONDONTWRITEBYTECODE is cleared), as on a
user's machine.
Targets at ~300k tensors: scan <= 2.5x the floor, check --no-model <= 3x; at 1M tensors both
under 5 s; peak under 600 bytes per tensor.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _synthetic import spec_for
from bench_check import drifted_copy

ROOT = Path(__file__).resolve().parent.parent
TARGET_SCAN, TARGET_CHECK, BIG_SECONDS, BYTES_PER_TENSOR = 2.5, 3.0, 5.0, 600

HEADER_FLOOR = """
import json, os, struct, sys
count = 0
for entry in sorted(os.scandir(sys.argv[1]), key=lambda e: e.name):
    if entry.name.endswith(".safetensors"):
        fd = os.open(entry.path, os.O_RDONLY)
        try:
            (n,) = struct.unpack("<Q", os.pread(fd, 8, 0))
            header = json.loads(os.pread(fd, n, 8))
        finally:
            os.close(fd)
        count += len(header) - ("__metadata__" in header)
print(count)
"""
# Runs the CLI's main, then prints the peak RSS (VmHWM) on stderr's last line.
_CLI = """
import sys
from inspector._internal.cli.main import main
try:
    code = main()  # as `ckpt-inspect` calls it: this process is the command
except SystemExit as exc:
    code = exc.code
with open("/proc/self/status") as fh:
    peak = next(int(l.split()[1]) for l in fh if l.startswith("VmHWM:"))
print(f"VmHWM {peak}", file=sys.stderr)
"""
# The reference of time and memory: a process that ran `check` and `scan` on a missing folder
# (the CLI imports a command's readers only when it runs, so importing the CLI alone would put
# pandas and the readers into the commands' peak).
_IMPORT_ONLY = _CLI.replace(
    "code = main()  # as `ckpt-inspect` calls it: this process is the command",
    "import contextlib, io\n"
    "    with contextlib.redirect_stderr(io.StringIO()):\n"
    "        main(['check', '/no-such-checkpoint', '--no-model'])\n"
    "        main(['scan', '/no-such-checkpoint'])\n"
    "    code = 0",
)


def run(code: str, args: list[str], tree: Path | None) -> tuple[float, float, int]:
    """(wall seconds, CPU seconds, peak RSS in bytes) of one fresh interpreter running `code`.
    CPU is the child's user + system time: on a shared machine it holds where wall does not."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPATH"] = str(tree or ROOT)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    # In the tree's own folder: `python -c` puts the working folder first on sys.path, so run
    # from this tree, a baseline's child imported this tree's `inspector`, not its own.
    proc = subprocess.run(
        [sys.executable, "-c", code, *args],
        env=env,
        cwd=tree or ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    seconds = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("VmHWM ")]
    if proc.returncode not in (0, 1) or (not lines and code is not HEADER_FLOOR):
        raise SystemExit(f"{args} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    return seconds, cpu, int(lines[-1].split()[1]) * 1024 if lines else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tensors", type=int, default=300_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--baseline", type=Path, help="an older tree to run side by side")
    args = parser.parse_args(argv)
    folder, _ = drifted_copy(spec_for(tensors=args.tensors))
    trees: dict[str, Path | None] = {"this tree": None}
    if args.baseline is not None:
        trees["baseline"] = args.baseline
    tools: dict[str, tuple[str, list[str], Path | None]] = {
        "floor": (HEADER_FLOOR, [str(folder)], None)
    }
    for label, tree in trees.items():
        tools[f"{label}: import"] = (_IMPORT_ONLY, [], tree)
        tools[f"{label}: scan"] = (_CLI, ["scan", str(folder)], tree)
        tools[f"{label}: check --no-model"] = (_CLI, ["check", "--no-model", str(folder)], tree)
    for code, tool_args, tree in tools.values():  # warm the page cache and write bytecode
        run(code, tool_args, tree)
    best = {name: (float("inf"), float("inf"), 0) for name in tools}
    for _ in range(args.runs):
        for name, (code, tool_args, tree) in tools.items():
            seconds, cpu, peak = run(code, tool_args, tree)
            old = best[name]
            best[name] = (min(old[0], seconds), min(old[1], cpu), max(old[2], peak))
    n = int(
        subprocess.run(
            [sys.executable, "-c", HEADER_FLOOR, str(folder)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    print(f"checkpoint: {folder}, {n:,} tensors; best of {args.runs}; load {os.getloadavg()}")
    floor, floor_cpu = best["floor"][:2]
    print(f"  {'':<32}{'wall':>9}  {'ratio':>5}  {'CPU':>9}  {'ratio':>5}")
    for name, (seconds, cpu, peak) in best.items():
        line = (
            f"  {name:<32}{seconds:7.3f} s  {seconds / floor:5.2f}"
            f"  {cpu:7.3f} s  {cpu / floor_cpu:5.2f}"
        )
        label = name.split(":")[0]
        if peak and not name.endswith("import"):
            base = best[f"{label}: import"][2]
            line += f"  peak {(peak - base) / n:5.0f} B/tensor above imports"
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
