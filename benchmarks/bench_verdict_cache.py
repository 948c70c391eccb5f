"""Verdict cache benchmark: what the load check adds to `check`, `report` and the dashboard the
first time and the second time a checkpoint is looked at, against `--no-model`.

    python benchmarks/bench_verdict_cache.py                   # ~300k tensors
    python benchmarks/bench_verdict_cache.py --tensors 20000   # quick run

The checkpoint is the synthetic NVFP4 MoE of `_synthetic.py` (DeepSeek-V3's architecture, so
the load check builds it; about 296,000 quantization tensors in the verdict). Every command
runs in a fresh interpreter, as a user's would, with a private cache folder
(`CKPT_INSPECT_CACHE_DIR`, emptied first: the user's cache is never touched):

- `check --no-model` (the baseline), `check` the first time (the verdict computed and kept),
  `check` the second time (read from the cache); `report --markdown` and the dashboard's
  state (`CheckpointState.load`, what the Overview waits for; the run fails if the load
  check's process is started) the second time, against their `--no-model` / `model=False`
  runs; all alternated, `--runs` rounds, the median wall and CPU time of each (CPU time is
  the steadier figure on a shared machine);
- in this process (no interpreter start, whose spread on a shared machine is larger than the
  figure): `check` with the verdict read from the cache against `check --no-model`,
  alternated, and where a hit's time goes: the digest of what the verdict reads, the
  environment (versions, the tool's code), reading and checking the entry.

Target: the second time adds under 0.3 s to the baseline.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _synthetic import ensure_checkpoint, spec_for, tensor_count

from inspector._internal.load.cache import CACHE_ENV

TARGET_SECONDS = 0.3
ROOT = Path(__file__).resolve().parent.parent

_TIMED = """
import sys, time
t0 = time.perf_counter()
what, path = sys.argv[1], sys.argv[2]
if what == "dashboard":
    from inspector.widgets.dashboard import CheckpointState
    import inspector._internal.load.child as child
    state = CheckpointState.load(path, model=sys.argv[3] == "model")
    started = child._CHILD._process is not None
    print(time.perf_counter() - t0, started)
else:
    from inspector._internal.cli.main import main
    import contextlib, io
    with contextlib.redirect_stdout(io.StringIO()):
        main([what, path, *sys.argv[3:]])
    print(time.perf_counter() - t0, "torch" in sys.modules)
"""


def fresh(*argv: str) -> tuple[float, float, str]:
    """(wall seconds, CPU seconds of the process and its children, the flag it printed) of
    one timed run in a new interpreter. CPU time is the steadier figure on a shared machine:
    the wall time of a run waits for the other developers' processes too."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-c", _TIMED, *argv], capture_output=True, text=True, cwd=ROOT
    )
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if out.returncode not in (0, 1):
        raise SystemExit(f"{argv}: exit {out.returncode}\n{out.stderr[-3000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, out.stdout.split()[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tensors", type=int, default=300_000)
    parser.add_argument("--runs", type=int, default=3, help="rounds of fresh interpreters")
    args = parser.parse_args()
    print(f"load average at the start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    spec = spec_for(tensors=args.tensors)
    folder = str(ensure_checkpoint(spec))
    print(f"checkpoint: {folder} ({tensor_count(spec):,} tensors, {spec.shards} shards)")
    cache = Path(tempfile.mkdtemp(prefix="bench-verdict-cache-"))
    os.environ[CACHE_ENV] = str(cache)
    try:
        run(folder, cache, args.runs)
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


def run(folder: str, cache: Path, runs: int) -> None:
    rows: dict[str, list[tuple[float, float, str]]] = {}

    def timed(label: str, *argv: str) -> str:
        result = fresh(*argv)
        rows.setdefault(label, []).append(result)
        return result[2]

    for _ in range(runs):  # alternated, so that the machine's mood falls on every row alike
        shutil.rmtree(cache / "verdicts", ignore_errors=True)
        timed("check --no-model", "check", folder, "--no-model")
        assert timed("check, first (computed)", "check", folder) == "True", "imports torch"
        assert timed("check, second (cache hit)", "check", folder) == "False", "no torch"
        timed("report --markdown --no-model", "report", folder, "--markdown", "--no-model")
        assert timed("report --markdown, second", "report", folder, "--markdown") == "False"
        timed("dashboard state, model=False", "dashboard", folder, "plain")
        started = timed("dashboard state, second", "dashboard", folder, "model")
        assert started == "False", "the dashboard started the load check's process on a hit"
    print(f"\nfresh interpreters, {runs} alternated rounds, each from an empty cache")
    print("(median wall and CPU; in brackets what it adds to its command's --no-model row)")
    base: tuple[float, float] = (0.0, 0.0)
    for label, results in rows.items():
        wall = statistics.median(r[0] for r in results)
        cpu = statistics.median(r[1] for r in results)
        if "no-model" in label or "model=False" in label:
            base, added = (wall, cpu), ""
        else:
            added = f"  (+{wall - base[0]:6.2f} s wall, +{cpu - base[1]:6.2f} s CPU)"
        print(f"  {label:30s} {wall:7.2f} s wall {cpu:7.2f} s CPU{added}")
    print("  the dashboard on a hit never started the load check's process")
    where_a_hit_goes(folder, runs)


def where_a_hit_goes(folder: str, runs: int) -> None:
    """In this process (no interpreter start to blur it): `check` with the verdict read from
    the cache against `check` without the model rules, alternated, best of `runs`; then the
    parts of a hit (the scan itself is the baseline's)."""
    from inspector._internal.checks import check
    from inspector._internal.load import cache as verdict_cache
    from inspector._internal.load.verdict import known_verdict, verdict_digest, verdict_key
    from inspector._internal.scan.entry import scan

    plain, hit = [], []
    for _ in range(runs + 1):  # the first pair warms the imports and the page cache
        scanned = scan(folder)
        t0 = time.perf_counter()
        check(scanned, model=False)
        plain.append(time.perf_counter() - t0)
        scanned = scan(folder)
        t0 = time.perf_counter()
        check(scanned)
        hit.append(time.perf_counter() - t0)
    best_plain, best_hit = min(plain[1:]), min(hit[1:])
    print("\ncheck in this process (scan excluded), alternated, best of each:")
    print(
        f"  model=False {best_plain:6.2f} s   cache hit {best_hit:6.2f} s   "
        f"+{best_hit - best_plain:.2f} s   target +{TARGET_SECONDS} s: "
        f"{'met' if best_hit - best_plain < TARGET_SECONDS else 'NOT met'}"
    )
    t0 = time.perf_counter()
    verdict_cache.environment.cache_clear()
    verdict_cache.environment()
    env = time.perf_counter() - t0
    scanned = scan(folder)
    t0 = time.perf_counter()
    verdict_digest(scanned)
    digest = time.perf_counter() - t0
    key = verdict_key(scanned)
    assert key is not None
    t0 = time.perf_counter()
    verdict = known_verdict(scanned)
    read = time.perf_counter() - t0
    assert verdict is not None
    entry = verdict_cache.verdict_folder() / verdict_cache.entry_name(
        {**key, **(verdict_cache.environment() or {})}
    )
    size = entry.stat().st_size
    print("where a hit's time goes:")
    print(f"  environment (versions, the tool's code digest)  {env:6.3f} s")
    print(f"  digest of what the verdict reads                {digest:6.3f} s")
    print(f"  entry read and checked ({size / 1e6:.1f} MB)             {read:6.3f} s")
    print(f"  verdict: {verdict.summary()[:150]}")


if __name__ == "__main__":
    main()
