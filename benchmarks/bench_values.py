"""Value statistics benchmark (`check --values`), three measurements side by side in one run:

    python benchmarks/bench_values.py                     # all three
    python benchmarks/bench_values.py --only full --gb 2  # one of full / sample / remote

1. `full` throughput against a minimal NumPy pass over the same BF16 bytes: 64 MB chunks
   widened to float32, sum and sum of squares, one process per core (multiprocessing), run
   right before and after ours on the same page-cached files; ratio = ours / baseline
   throughput (target >= 0.7).
2. `sample` on a 300,000-tensor local checkpoint (target < 10 s), seconds for
   `value_table(scanned, "sample")` after the scan, on two checkpoints: the sparse synthetic
   DeepSeek-V3-like one of `_synthetic.py` (NVFP4 experts: U8 packed weights, FP8 scales, F32
   scalars; its data are file holes, so every window read costs the kernel a fresh zero
   page) and a dense one with real values in the page cache (300,000 BF16 tensors of 8 KiB,
   normal values: the statistics' work on real numbers).
3. `sample` through the 20 ms latency proxy of `bench_remote.py` (real s3fs against a
   read-only S3 server): seconds against the round-trip floor for the requests it makes,
   ceil(requests / concurrency) x round trip (target within 3x), and the bytes read.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from _synthetic import CACHE_DIR, ensure_checkpoint, spec_for

from inspector._internal.checks.values import value_table
from inspector._internal.scan.entry import scan

_CHUNK = 64 << 20


def _fresh(name: str) -> tuple[Path, bool]:
    """The cache folder `name`, and whether it must be written (not complete yet)."""
    folder = CACHE_DIR / name
    if (folder / ".complete").is_file():
        return folder, False
    folder.mkdir(parents=True, exist_ok=True)
    return folder, True


def _header(header: dict[str, object]) -> bytes:
    """A safetensors file's length and JSON header (padded to 8 bytes)."""
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    return len(raw).to_bytes(8, "little") + raw


def bf16_checkpoint(gigabytes: float, files: int) -> Path:
    """Real BF16 values (normal, std 0.02) in `files` shards of 64 MB tensors, cached."""
    folder, write = _fresh(f"values-bf16-{gigabytes:g}gb-{files}")
    if not write:
        return folder
    rng = np.random.default_rng(0)
    per_file = int(gigabytes * (1 << 30)) // files
    tensors = max(1, per_file // _CHUNK)
    for f in range(files):
        header: dict[str, object] = {}
        offset = 0
        for t in range(tensors):
            name = f"model.layers.{f * tensors + t}.mlp.down_proj.weight"
            header[name] = {
                "dtype": "BF16",
                "shape": [_CHUNK // 2 // 4096, 4096],
                "data_offsets": [offset, offset + _CHUNK],
            }
            offset += _CHUNK
        with open(folder / f"model-{f + 1:05d}-of-{files:05d}.safetensors", "wb") as fh:
            fh.write(_header(header))
            for _ in range(tensors):
                words = rng.normal(0, 0.02, _CHUNK // 2).astype(np.float32).view(np.uint32) >> 16
                fh.write(words.astype(np.uint16).tobytes())
    (folder / ".complete").write_text("ok")
    return folder


def _baseline_file(path: str) -> tuple[float, float, int]:
    """The minimal pass over one file: 64 MB chunks, widened, sum and sum of squares."""
    total = squares = 0.0
    size = 0
    with open(path, "rb") as fh:
        n = int.from_bytes(fh.read(8), "little")
        fh.seek(8 + n)
        while chunk := fh.read(_CHUNK):
            x = (np.frombuffer(chunk, np.uint16).astype(np.uint32) << 16).view(np.float32)
            total += float(x.sum())
            squares += float((x * x).sum())
            size += len(chunk)
    return total, squares, size


def baseline(folder: Path, cores: int) -> tuple[float, int]:
    files = sorted(str(p) for p in folder.glob("*.safetensors"))
    start = time.perf_counter()
    with multiprocessing.Pool(cores) as pool:
        sizes = [r[2] for r in pool.map(_baseline_file, files)]
    return time.perf_counter() - start, sum(sizes)


def bench_full(gigabytes: float, runs: int) -> None:
    cores = os.cpu_count() or 1
    folder = bf16_checkpoint(gigabytes, files=2 * cores)
    scanned = scan(folder)
    value_table(scanned, "full", workers=cores)  # warm the page cache
    base_s, ours_s = math.inf, math.inf
    nbytes = 0
    for _ in range(runs):
        seconds, nbytes = baseline(folder, cores)
        base_s = min(base_s, seconds)
        start = time.perf_counter()
        table = value_table(scan(folder), "full", workers=cores)
        ours_s = min(ours_s, time.perf_counter() - start)
    assert len(table) and (table["finding"] == "").all()
    ratio = base_s / ours_s
    print(
        f"full: {nbytes / 1e9:.2f} GB BF16 in {len(table)} tensors, {cores} cores, best of {runs}\n"
        f"  numpy baseline (widen, sum, sum of squares; {cores} processes): {base_s:6.2f} s "
        f"= {nbytes / base_s / 1e9:5.2f} GB/s\n"
        f"  check --values full (scan included):                         {ours_s:6.2f} s "
        f"= {nbytes / ours_s / 1e9:5.2f} GB/s\n"
        f"  ours / baseline throughput = {ratio:.2f}  (target >= 0.7: "
        f"{'met' if ratio >= 0.7 else 'MISSED'})"
    )


def dense_checkpoint(tensors: int, files: int) -> Path:
    """`tensors` BF16 tensors of 8 KiB with normal values (std 0.02), in `files` shards."""
    folder, write = _fresh(f"values-dense-{tensors}-{files}")
    if not write:
        return folder
    rng = np.random.default_rng(1)
    per_file = -(-tensors // files)
    for f in range(files):
        names = [
            f"model.layers.{t // 3000}.mlp.experts.{t // 3 % 1000}.{('w1', 'w2', 'w3')[t % 3]}"
            ".weight"
            for t in range(f * per_file, min(tensors, (f + 1) * per_file))
        ]
        header = {
            name: {"dtype": "BF16", "shape": [64, 64], "data_offsets": [i * 8192, (i + 1) * 8192]}
            for i, name in enumerate(names)
        }
        values = rng.standard_normal(len(names) * 4096, np.float32) * np.float32(0.02)
        with open(folder / f"model-{f + 1:05d}-of-{files:05d}.safetensors", "wb") as fh:
            fh.write(_header(header))
            fh.write((values.view(np.uint32) >> 16).astype(np.uint16).tobytes())
    (folder / ".complete").write_text("ok")
    return folder


def _sample_once(label: str, folder: Path, *, warm: bool) -> None:
    start = time.perf_counter()
    scanned = scan(folder)
    scan_s = time.perf_counter() - start
    for path in folder.glob("*.safetensors") if warm else ():  # in the page cache, as in use
        with open(path, "rb") as fh:
            while fh.read(64 << 20):
                pass
    cpu = os.times()
    start = time.perf_counter()
    table = value_table(scanned, "sample")
    sample_s = time.perf_counter() - start
    used = os.times()
    busy = used.user + used.system - cpu.user - cpu.system
    print(
        f"sample (local, {label}): {len(table):,} tensors in {len(scanned.shards)} shards: "
        f"scan {scan_s:.2f} s, values sample {sample_s:.2f} s ({busy:.2f} s of CPU; target "
        f"< 10 s: {'met' if sample_s < 10 else 'MISSED'}); "
        f"{int(table['elements'].sum()):,} values read; load average "
        f"{os.getloadavg()[0]:.2f}"
    )


def bench_sample(tensors: int) -> None:
    _sample_once("sparse synthetic", ensure_checkpoint(spec_for(tensors=tensors)), warm=False)
    _sample_once("dense BF16", dense_checkpoint(tensors, files=150), warm=True)


def bench_remote(tensors: int, shards: int, delay: float) -> None:
    import bench_remote as br

    from inspector._internal.storage.remote import DEFAULT_CONCURRENCY

    os.environ.update(AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench")
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    folder = ensure_checkpoint(spec_for(tensors=tensors, shards=shards))
    with br.serving(folder.parent, delay) as urls:
        proxy, direct = urls["proxy"], urls["direct"]
        first = sorted(folder.glob("*.safetensors"))[0].name
        rtt = br.round_trip(proxy, f"{folder.name}/{first}")
        url = f"s3://{br.BUCKET}/{folder.name}"
        scanned = scan(url, storage_options={"endpoint_url": proxy})
        before = br.server_stats(direct)
        start = time.perf_counter()
        table = value_table(scanned, "sample")
        seconds = time.perf_counter() - start
        after = br.server_stats(direct)
    requests = after["requests"] - before["requests"] - 1
    fetched = after["bytes"] - before["bytes"]
    floor = math.ceil(requests / DEFAULT_CONCURRENCY) * rtt
    print(
        f"sample (remote, {delay * 1000:.0f} ms proxy): {len(table):,} tensors in {shards} shards, "
        f"{requests:,} requests, {fetched / 1e6:.1f} MB read, {seconds:.2f} s; floor "
        f"ceil({requests} / {DEFAULT_CONCURRENCY}) x {rtt * 1000:.1f} ms = {floor:.2f} s; "
        f"ratio {seconds / floor:.2f} (target <= 3: {'met' if seconds <= 3 * floor else 'MISSED'})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--only", choices=("full", "sample", "remote"))
    parser.add_argument("--gb", type=float, default=1.0, help="size of the full-read checkpoint")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--tensors", type=int, default=300_000)
    parser.add_argument("--remote-tensors", type=int, default=30_000)
    parser.add_argument("--remote-shards", type=int, default=163)
    parser.add_argument("--delay", type=float, default=0.020)
    args = parser.parse_args()
    if args.only in (None, "full"):
        bench_full(args.gb, args.runs)
    if args.only in (None, "sample"):
        bench_sample(args.tensors)
    if args.only in (None, "remote"):
        bench_remote(args.remote_tensors, args.remote_shards, args.delay)


if __name__ == "__main__":
    main()
