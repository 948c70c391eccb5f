"""Start-up benchmark: what a user waits for before any work, each a fresh process, against the
bare interpreter (`python -c pass`) run side by side.

    python benchmarks/bench_start.py                      # 15 rounds
    python benchmarks/bench_start.py --runs 40
    python benchmarks/bench_start.py --baseline /tmp/base # also an older tree (its `inspector`
                                                          # folder's parent), side by side

Cases: `import inspector`, `--version`, `--help` and `<command> --help` for every command of
the table (plugin commands included). Every case runs once per round, the rounds interleaved,
and the median wall time is kept: on a shared machine the ratios hold better than the times.
Bytecode is written on the first run (PYTHONDONTWRITEBYTECODE is cleared), as on a user's
machine. Targets: `--version`, `--help` and each `<command> --help` under 0.25 s, `import
inspector` under 0.3 s (tests/test_start.py checks what they import, without timing).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FLOOR = "python -c pass"
TARGET_SECONDS, TARGET_IMPORT = 0.25, 0.3


def cases() -> dict[str, list[str]]:
    """Each case's name and the interpreter's arguments."""
    from inspector._internal.cli.main import _commands

    found = {FLOOR: ["-c", "pass"], "import inspector": ["-c", "import inspector"]}
    found["--version"] = ["-m", "inspector", "--version"]
    found["--help"] = ["-m", "inspector", "--help"]
    for command in _commands():
        found[f"{command.name} --help"] = ["-m", "inspector", command.name, "--help"]
    return found


def _wall(argv: list[str], tree: Path, env: dict[str, str]) -> float:
    """Seconds one interpreter takes to run `argv` on `tree`: run from the tree's folder and
    with it on PYTHONPATH (`-c` and `-m` put the working folder first on sys.path)."""
    env = dict(env, PYTHONPATH=str(tree))
    start = time.perf_counter()
    subprocess.run([sys.executable, *argv], cwd=tree, env=env, check=True, capture_output=True)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--baseline", type=Path, help="an older tree to run side by side")
    args = parser.parse_args(argv)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    trees = {"this tree": ROOT}
    if args.baseline is not None:
        trees["baseline"] = args.baseline.resolve()
    runs = {(tree, name): argv for name, argv in cases().items() for tree in trees}
    for (tree, _), case in runs.items():  # bytecode written, caches warm
        _wall(case, trees[tree], env)
    times: dict[tuple[str, str], list[float]] = {key: [] for key in runs}
    for _ in range(args.runs):
        for (tree, name), case in runs.items():
            times[tree, name].append(_wall(case, trees[tree], env))
    median = {key: statistics.median(values) for key, values in times.items()}
    print(f"load average {os.getloadavg()[0]:.2f}; median of {args.runs} runs")
    header = "".join(f"{tree:>22}" for tree in trees)
    print(f"{'':22}{header}  target (this tree)")
    for name in cases():
        row = "".join(
            f"{median[tree, name]:8.3f} s {median[tree, name] / median[tree, FLOOR]:6.1f}x   "
            for tree in trees
        )
        verdict = ""
        if name != FLOOR:
            target = TARGET_IMPORT if name == "import inspector" else TARGET_SECONDS
            kept = median["this tree", name] < target
            verdict = f"{target:g} s {'ok' if kept else 'MISSED'}"
        print(f"{name:22}{row}{verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
