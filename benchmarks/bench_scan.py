"""Scan benchmark: the full scan to all four tables against the floor of reading the headers.

    python benchmarks/bench_scan.py                    # full size: ~600k tensors, 300 shards
    python benchmarks/bench_scan.py --tensors 20000    # quick run
    python benchmarks/bench_scan.py --profile 25       # also print the top of a cProfile

The floor is what any header-only scan must do: for each shard open it, read the 8-byte length,
read the header and `json.loads` it (the target ratio is against it). A stricter floor that
parses with orjson, as the scan itself does, is printed too. The checkpoint is generated once
(sparse files, see `_synthetic.py`) and cached under `benchmarks/.cache/`.
Target: scan / floor <= 2.0.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import json
import os
import pstats
import resource
import struct
import sys
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _synthetic import ensure_checkpoint, spec_for

from inspector.scan import scan

TARGET_RATIO = 2.0
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
    orjson.loads((folder / "model.safetensors.index.json").read_bytes())
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
    if args.memory:
        _report_memory(folder)
    if args.profile:
        print(profile(scan_tables, folder, top=args.profile))
    return 0


def _report(
    args, n_tensors, n_files, scanned, missing, t_floor, t_floor_idx, t_scan, t_full
) -> None:
    shard_tensors = sum(len(s.names) for s in scanned.shards)
    print(
        f"  {n_tensors:,} tensors in headers, {shard_tensors:,} read by the scan, "
        f"{len(scanned.problems)} findings, layout {scanned.layout}"
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


def _report_memory(folder: Path) -> None:
    peak_floor = traced_peak(floor, folder)
    peak_scan = traced_peak(lambda f: scan_tables(f), folder)
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    print("memory:")
    print(f"  tracemalloc peak, floor       {peak_floor / 1e6:10.1f} MB")
    print(f"  tracemalloc peak, scan+tables {peak_scan / 1e6:10.1f} MB")
    print(f"  ru_maxrss of this process     {maxrss / 1e3:10.1f} MB")


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
        "--no-memory", dest="memory", action="store_false", help="skip the tracemalloc runs"
    )
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(main())
