"""`check --deep` benchmark: the tensor-data pass (all-zero, NaN/Inf, duplicate bytes) against
the floor of reading the same bytes, side by side in one run:

    python benchmarks/bench_deep.py                  # both measurements
    python benchmarks/bench_deep.py --tensors 20000  # a smaller many-tensor checkpoint

1. Throughput on large tensors: `deep_check` over the 1 GB BF16 checkpoint of
   `bench_values.py` (64 MB tensors in 4 shards, in the page cache), against the floor of
   reading every byte once in one process (16 MiB `preadv` into one reused buffer, nothing
   else done); ratio = ours / floor seconds.
2. Many small tensors: `deep_check` over the dense checkpoint of `bench_values.py` (8 KiB BF16
   tensors, in the page cache): seconds and microseconds per tensor (what reading a tensor
   costs beyond its bytes).

Each figure is the best of `--runs`. `deep_check` reads in one thread, so the floor does too.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_values import bf16_checkpoint, dense_checkpoint

from inspector._internal.checks.deep import deep_check
from inspector._internal.scan.entry import scan

_BLOCK = 16 << 20


def floor(folder: Path) -> tuple[float, int]:
    """Seconds to read every byte of the folder's shards once (16 MiB `preadv` into one
    buffer), and the bytes read."""
    buffer = np.empty(_BLOCK, np.uint8).data
    total = 0
    start = time.perf_counter()
    for path in sorted(folder.glob("*.safetensors")):
        fd = os.open(path, os.O_RDONLY)
        try:
            at = 0
            while n := os.preadv(fd, [buffer], at):
                at += n
        finally:
            os.close(fd)
        total += at
    return time.perf_counter() - start, total


def _deep(folder: Path) -> tuple[float, int]:
    scanned = scan(folder)
    start = time.perf_counter()
    found = deep_check(scanned)
    seconds = time.perf_counter() - start
    assert not found, [f.message for f in found[:3]]
    return seconds, sum(len(s.names) for s in scanned.shards)


def best(folder: Path, runs: int) -> tuple[float, float, int, int]:
    """Best of `runs` of the floor and of ours, taken turn about on the page-cached folder:
    (floor seconds, our seconds, bytes, tensors)."""
    floor(folder)  # warm the page cache
    floor_s = ours_s = float("inf")
    nbytes = tensors = 0
    for _ in range(runs):
        seconds, nbytes = floor(folder)
        floor_s = min(floor_s, seconds)
        seconds, tensors = _deep(folder)
        ours_s = min(ours_s, seconds)
    return floor_s, ours_s, nbytes, tensors


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="best of this many runs")
    parser.add_argument("--tensors", type=int, default=100_000, help="small tensors (8 KiB)")
    args = parser.parse_args(argv)
    floor_s, ours_s, nbytes, tensors = best(bf16_checkpoint(1, files=4), args.runs)
    print(
        f"large tensors: {nbytes / 1e9:.2f} GB BF16 in {tensors} tensors, best of {args.runs}\n"
        f"  floor (read every byte, 16 MiB preadv, 1 thread): {floor_s:6.3f} s "
        f"= {nbytes / floor_s / 1e9:5.2f} GB/s\n"
        f"  check --deep (tensor data pass):                  {ours_s:6.3f} s "
        f"= {nbytes / ours_s / 1e9:5.2f} GB/s\n"
        f"  ours / floor seconds = {ours_s / floor_s:.2f}"
    )
    small = dense_checkpoint(args.tensors, files=max(1, args.tensors // 2000))
    floor_s, ours_s, nbytes, tensors = best(small, args.runs)
    print(
        f"small tensors: {tensors:,} BF16 tensors of 8 KiB ({nbytes / 1e9:.2f} GB), best of "
        f"{args.runs}\n"
        f"  floor (read every byte):          {floor_s:6.3f} s\n"
        f"  check --deep (tensor data pass):  {ours_s:6.3f} s = "
        f"{(ours_s - floor_s) / tensors * 1e6:.1f} us per tensor above the floor\n"
        f"  load average {os.getloadavg()[0]:.2f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
