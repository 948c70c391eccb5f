"""Start-up benchmark: what a user waits for before any work, each a fresh process, against the
bare interpreter (`python -c pass`) run side by side.

    python benchmarks/bench_start.py              # 15 rounds
    python benchmarks/bench_start.py --runs 40

Every command runs once per round, the rounds interleaved, and the median wall time is kept:
on a shared machine the ratios hold better than the times. Bytecode is written on the first
run (PYTHONDONTWRITEBYTECODE is cleared), as on a user's machine. Targets: `--version` and
`--help` under 0.25 s, `import inspector` under 0.3 s. `<command> --help` imports that
command's module (the readers, pandas): listed for comparison, with no target.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

TARGET_SECONDS = {"--version": 0.25, "--help": 0.25, "import inspector": 0.3}

CASES: dict[str, list[str]] = {
    "python -c pass": ["-c", "pass"],
    "import inspector": ["-c", "import inspector"],
    "--version": ["-m", "inspector", "--version"],
    "--help": ["-m", "inspector", "--help"],
    "scan --help": ["-m", "inspector", "scan", "--help"],
    "check --help": ["-m", "inspector", "check", "--help"],
    "report --help": ["-m", "inspector", "report", "--help"],
}


def _wall(argv: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, *argv], env=env, check=True, capture_output=True)
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    for argv in CASES.values():  # bytecode written, caches warm
        _wall(argv, env)
    times: dict[str, list[float]] = {name: [] for name in CASES}
    for _ in range(args.runs):
        for name, argv in CASES.items():
            times[name].append(_wall(argv, env))
    base = statistics.median(times["python -c pass"])
    print(f"load average {os.getloadavg()[0]:.2f}; median of {args.runs} runs")
    print(f"{'':18} {'seconds':>8} {'x python':>9}  target")
    for name, values in times.items():
        median = statistics.median(values)
        target = TARGET_SECONDS.get(name)
        verdict = "" if target is None else f"{target:g} s {'ok' if median < target else 'MISSED'}"
        print(f"{name:18} {median:8.3f} {median / base:8.1f}x  {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
