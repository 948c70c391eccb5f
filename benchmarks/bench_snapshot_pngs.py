"""Snapshot PNG benchmark: what kaleido and its browser cost to draw a dashboard's static
snapshot figures (widgets/snapshot.py `render_pngs`), with Chromium's headless shell against
the full browser kaleido finds by itself, each round a fresh process, the two interleaved.

    python benchmarks/bench_snapshot_pngs.py               # 3 rounds
    python benchmarks/bench_snapshot_pngs.py --runs 5 --demo healthy-hf-sharded

Each run starts kaleido as a notebook kernel does (its first snapshot), draws the demo's figures
and stops it; CPU seconds are those of every process of the run (the browser's too: its
renderers are not all reaped by their parents, so they are read from /proc while they live,
every 50 ms) less what the run spent before rendering. The median of the rounds is kept, and
the ratio of the two; the PNGs of both browsers are compared byte for byte.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# One run, in a child process: it prints a digest of the PNGs' bytes, their sizes, and the CPU
# seconds it spent before rendering (imports, the scan, the figures), which are not counted.
_CHILD = """
import hashlib, json, sys, time
from inspector import scan
from inspector.widgets.snapshot import render_pngs, snapshot_figures
from inspector.widgets.state import CheckpointState
figures = snapshot_figures(CheckpointState.checked(scan(sys.argv[1]), None))
before = time.process_time()
pngs = render_pngs(figures)
print(json.dumps([hashlib.sha256(b"".join(pngs)).hexdigest(), [len(p) for p in pngs], before]))
"""


def _tree_cpu(root: int, seen: dict[str, float]) -> None:
    """Add to `seen` ({pid:start: CPU seconds}) every live process under `root`."""
    tick = os.sysconf("SC_CLK_TCK")
    parents: dict[int, int] = {}
    stats: dict[int, tuple[str, float]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(name)] = int(fields[1])
        stats[int(name)] = (fields[19], (int(fields[11]) + int(fields[12])) / tick)
    tree, frontier = {root}, [root]
    while frontier:
        pid = frontier.pop()
        for child, parent in parents.items():
            if parent == pid and child not in tree:
                tree.add(child)
                frontier.append(child)
    for pid in tree & stats.keys():
        start, cpu = stats[pid]
        seen[f"{pid}:{start}"] = cpu


def _run(demo: Path, env: dict[str, str]) -> tuple[float, float, list]:
    """(wall s, CPU s of the process tree from the render on, [digest, sizes, _]) of one child
    run; the wall time is the whole run's."""
    seen: dict[str, float] = {}
    start = time.perf_counter()
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(demo)], env=env, stdout=subprocess.PIPE, text=True
    )
    while child.poll() is None:
        _tree_cpu(child.pid, seen)
        time.sleep(0.05)
    wall = time.perf_counter() - start
    out = child.stdout.read() if child.stdout else ""
    if child.returncode != 0:
        raise SystemExit(f"the child run failed (exit {child.returncode})")
    answer = json.loads(out)
    return wall, sum(seen.values()) - answer[2], answer


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--demo", default="modelopt-1631-ep-collision")
    args = parser.parse_args(argv)
    from choreographer.browsers.chromium import Chromium
    from inspector.widgets.snapshot import _HEADLESS_SHELLS

    shell = next(filter(None, map(shutil.which, _HEADLESS_SHELLS)), None)
    full = Chromium.find_browser(skip_local=False)
    if shell is None or full is None:
        raise SystemExit(f"needs a headless shell ({shell}) and a full browser ({full})")
    env = {k: v for k, v in os.environ.items() if k not in ("BROWSER_PATH",)}
    cases = {
        f"full browser ({full})": {**env, "BROWSER_PATH": full},
        f"headless shell ({shell})": env,
    }
    with tempfile.TemporaryDirectory() as tmp:
        from inspector._internal.demo import write_demos

        write_demos(Path(tmp), log=lambda _: None)
        demo = Path(tmp) / args.demo
        results: dict[str, list[tuple[float, float, list]]] = {name: [] for name in cases}
        for _ in range(args.runs):
            for name, case_env in cases.items():
                results[name].append(_run(demo, case_env))
    print(
        f"{args.demo}: a fresh kaleido and its browser, the snapshot's figures, median of "
        f"{args.runs} (load {os.getloadavg()[0]:.1f})"
    )
    medians = {}
    for name, runs in results.items():
        wall = statistics.median(r[0] for r in runs)
        cpu = medians[name] = statistics.median(r[1] for r in runs)
        print(f"  {name}: {cpu:.2f} CPU-s, {wall:.2f} s wall, PNG bytes {runs[0][2][1]}")
    (full_cpu, shell_cpu) = medians.values()
    digests = {r[2][0] for runs in results.values() for r in runs}
    print(
        f"  headless shell / full browser: {shell_cpu / full_cpu:.2f} of the CPU; "
        f"PNGs {'the same' if len(digests) == 1 else 'DIFFERENT'} byte for byte"
    )
    return 0 if len(digests) == 1 else 1


if __name__ == "__main__":
    sys.exit(main())
