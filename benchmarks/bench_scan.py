"""Scan benchmark: the full scan to all four tables against the floor of reading the headers.

    python benchmarks/bench_scan.py                    # full size: ~600k tensors, 300 shards
    python benchmarks/bench_scan.py --big              # 1,000,000 tensors in 2,000 shards
    python benchmarks/bench_scan.py --tensors 20000    # quick run
    python benchmarks/bench_scan.py --profile 25       # also print the top of a cProfile

The floor is what any header-only scan must do: for each shard open it, read the 8-byte length,
read the header and `json.loads` it (the target ratio is against it). A stricter floor that
parses with orjson, as the scan itself does, is printed too. The checkpoint is generated once
(sparse files, see `_synthetic.py`) and cached under `benchmarks/.cache/`.
Target: scan / floor <= 2.0.

Memory is measured in fresh child processes (so earlier runs do not hide in the high-water
mark): the peak RSS above the process's size after its imports, and the tracemalloc peak, each
divided by the number of tensors. Targets for `--big` (1M tensors, 2,000 shards): the full
scan with all four tables in under 5 s and under 600 bytes per tensor at its peak.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import json
import os
import pstats
import struct
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _synthetic import ensure_checkpoint, spec_for

from inspector._internal.common.filenames import INDEX_NAME
from inspector._internal.scan.entry import scan

TARGET_RATIO = 2.0
BIG_TENSORS, BIG_SHARDS = 1_000_000, 2_000
BIG_SECONDS, BIG_BYTES_PER_TENSOR = 5.0, 600
_TABLES = ("tensors", "files", "layers", "experts")


def floor(folder: Path, loads: Callable[[bytes], dict] = json.loads) -> int:
    """Open each shard, read the length and the header, parse it. Returns the tensor count."""
    count = 0
    for entry in sorted(os.scandir(folder), key=lambda e: e.name):
        if not entry.name.endswith(".safetensors"):
            continue
        fd = os.open(entry.path, os.O_RDONLY)
        try:
            (n,) = struct.unpack("<Q", os.pread(fd, 8, 0))
            header = loads(os.pread(fd, n, 8))
        finally:
            os.close(fd)
        count += len(header) - ("__metadata__" in header)
    return count


def floor_orjson(folder: Path) -> int:
    """The floor with the faster parser the scan uses."""
    return floor(folder, orjson.loads)


def floor_with_index(folder: Path) -> int:
    """The floor plus parsing `model.safetensors.index.json` (the scan reads it too)."""
    orjson.loads((folder / INDEX_NAME).read_bytes())
    return floor(folder)


def scan_only(folder: Path) -> object:
    """Headers, index and config read and validated, no tables."""
    return scan(folder)


def scan_tables(folder: Path) -> tuple[object, list[str]]:
    """The full scan to every table that exists; table errors are reported, not raised."""
    result = scan(folder)
    missing = []
    for name in _TABLES:
        try:
            getattr(result, name)
        except ImportError as exc:
            missing.append(f"{name} ({exc.name or exc} not importable yet)")
    return result, missing


def best_of(fn: Callable[[Path], object], folder: Path, *, runs: int) -> tuple[float, object]:
    """(best wall time of `runs` calls, last result); garbage collected between runs."""
    best = float("inf")
    result: object = None
    for _ in range(runs):
        result = None
        gc.collect()
        start = time.perf_counter()
        result = fn(folder)
        best = min(best, time.perf_counter() - start)
    return best, result


def traced_peak(fn: Callable[[Path], object], folder: Path) -> int:
    """Peak bytes allocated by Python during one call (tracemalloc slows the call down)."""
    gc.collect()
    tracemalloc.start()
    try:
        fn(folder)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def profile(fn: Callable[[Path], object], folder: Path, *, top: int) -> str:
    """The top `top` functions of one call by cumulative and by own time."""
    prof = cProfile.Profile()
    prof.enable()
    fn(folder)
    prof.disable()
    out = io.StringIO()
    stats = pstats.Stats(prof, stream=out).strip_dirs()
    stats.sort_stats("cumulative").print_stats(top)
    stats.sort_stats("tottime").print_stats(top)
    return out.getvalue()


def main(argv: list[str] | None = None) -> int:
    """Generate (or reuse) the checkpoint, time floor and scan, print the comparison."""
    args = _parse(argv)
    if args.child:
        return _child(Path(args.child[0]), args.child[1])
    if args.big:
        args.tensors, args.shards = BIG_TENSORS, BIG_SHARDS
    spec = spec_for(tensors=args.tensors, shards=args.shards)
    t0 = time.perf_counter()
    folder = ensure_checkpoint(spec)
    print(f"checkpoint: {folder} (ready in {time.perf_counter() - t0:.1f} s)")
    files = sorted(folder.glob("*.safetensors"))
    apparent = sum(f.stat().st_size for f in files)
    on_disk = sum(f.stat().st_blocks * 512 for f in files)
    print(
        f"  {len(files)} shards, {apparent / 1e9:,.1f} GB apparent, {on_disk / 1e6:,.1f} MB on disk"
    )

    floor(folder)  # warm the page cache
    t_floor, n_tensors = best_of(floor, folder, runs=args.runs)
    t_floor_or, _ = best_of(floor_orjson, folder, runs=args.runs)
    t_floor_idx, _ = best_of(floor_with_index, folder, runs=args.runs)
    t_scan, scanned = best_of(scan_only, folder, runs=args.runs)
    t_full, (_, missing) = best_of(scan_tables, folder, runs=args.runs)
    _report(args, n_tensors, len(files), scanned, missing, t_floor, t_floor_idx, t_scan, t_full)
    print(
        f"  stricter floor (orjson.loads)                      {t_floor_or:8.3f} s"
        f"   full scan + tables ratio to it {t_full / t_floor_or:5.2f}"
    )
    if args.big:
        verdict = "MET" if t_full < BIG_SECONDS else "NOT MET"
        print(f"  1M target: full scan + tables < {BIG_SECONDS:.0f} s: {verdict}")
    if args.memory:
        _report_memory(folder, n_tensors, big=args.big)
    if args.profile:
        print(profile(scan_tables, folder, top=args.profile))
    return 0


def _report(
    args, n_tensors, n_files, scanned, missing, t_floor, t_floor_idx, t_scan, t_full
) -> None:
    shard_tensors = sum(len(s.names) for s in scanned.shards)
    print(
        f"  {n_tensors:,} tensors in headers, {shard_tensors:,} read by the scan, "
        f"{len(scanned.read_findings)} findings, layout {scanned.layout}"
    )
    print(f"best of {args.runs} (warm page cache):")
    print(f"  floor (open, read length + header, json.loads)    {t_floor:8.3f} s")
    print(f"  floor + parse index json                           {t_floor_idx:8.3f} s")
    print(
        f"  scan (headers, index, config; no tables)           {t_scan:8.3f} s"
        f"   ratio {t_scan / t_floor:5.2f}"
    )
    label = "full scan + tables " + ("(all four)" if not missing else "(some missing)")
    print(
        f"  {label:<51}{t_full:8.3f} s   ratio {t_full / t_floor:5.2f}   (target <= {TARGET_RATIO})"
    )
    for item in missing:
        print(f"    table not measured: {item}")
    verdict = "MET" if t_full / t_floor <= TARGET_RATIO else "NOT MET"
    print(f"  target {verdict}" + (" (tables missing, scan part only)" if missing else ""))


def _report_memory(folder: Path, n_tensors: int, *, big: bool) -> None:
    """Peak memory of the full scan per tensor, each measured in a fresh process."""
    rss = _in_child(folder, "rss")
    traced = _in_child(folder, "tracemalloc")
    floor_traced = _in_child(folder, "floor")
    print("memory (fresh process each, per tensor):")
    print(f"  tracemalloc peak, floor             {floor_traced / n_tensors:8.0f} B")
    print(f"  tracemalloc peak, scan + tables     {traced / n_tensors:8.0f} B")
    print(f"  peak RSS above imports, scan + tables {rss / n_tensors:6.0f} B")
    if big:
        worst = max(rss, traced) / n_tensors
        verdict = "MET" if worst < BIG_BYTES_PER_TENSOR else "NOT MET"
        print(f"  1M target: < {BIG_BYTES_PER_TENSOR} B per tensor at the peak: {verdict}")


def _in_child(folder: Path, what: str) -> int:
    """Bytes measured by `_child` in a new interpreter."""
    out = subprocess.run(
        [sys.executable, __file__, "--child", str(folder), what],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(out.stdout.split()[-1])


def _child(folder: Path, what: str) -> int:
    """Print one measurement: the RSS high-water mark above the size after imports, or the
    tracemalloc peak, of the full scan (or of the floor)."""
    import inspector._internal.checkpoint.tables  # noqa: F401 (imported before the baseline: the scan needs it)

    fn = floor if what == "floor" else scan_tables
    if what == "rss":
        before = _status("VmRSS")
        fn(folder)
        # VmHWM, not ru_maxrss: a child's ru_maxrss starts from its parent's size at fork.
        print(max(_status("VmHWM") - before, 0))
    else:
        print(traced_peak(fn, folder))
    return 0


def _status(key: str) -> int:
    """A size from /proc/self/status (VmRSS: now; VmHWM: the peak), in bytes."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(f"{key}:"):
                return int(line.split()[1]) * 1024
    return 0


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tensors", type=int, default=None, help="about this many tensors")
    parser.add_argument("--shards", type=int, default=None, help="this many shards")
    parser.add_argument("--runs", type=int, default=3, help="best of this many runs")
    parser.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="N",
        help="print the top N functions of a cProfile of the full scan",
    )
    parser.add_argument(
        "--no-memory", dest="memory", action="store_false", help="skip the memory runs"
    )
    parser.add_argument(
        "--big", action="store_true", help="1,000,000 tensors in 2,000 shards, with targets"
    )
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(main())
