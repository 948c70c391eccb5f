"""`verify` against its baselines, side by side in one run (ratios, not absolute times).

- `--level hash` against `sha256sum` over the same files, one process per core (`xargs -P`),
  the files in the page cache for both (each run reads them once first);
- `--level tensor` against `--level hash`;
- `manifest` (SHA-256 and every tensor hash, one pass) against `sha256sum`;
- `--level size` against a 163-shard repository on the Hub stand-in: requests made and file
  bytes the server sent (must be 0);
- peak memory (RSS) of a child process running `verify --level hash` and `--level tensor`.

Usage: python benchmarks/bench_verify.py [--shards 8] [--shard-mb 96] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from multiprocessing import Pool
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import numpy as np
from remote_servers import FakeHub
from safetensors.numpy import save_file

from inspector._internal.common.filenames import CONFIG_NAME, INDEX_NAME
from inspector._internal.integrity import verify, write_manifest

CACHE = Path(__file__).resolve().parent / ".cache" / "verify"
TENSOR_MB = 4


def build(folder: Path, shards: int, shard_mb: int) -> list[Path]:
    """An HF-sharded checkpoint of random BF16-sized tensors (4 MiB each) written by
    safetensors' own writer, plus its index; kept between runs."""
    stamp = folder / f".built-{shards}x{shard_mb}"
    files = [folder / f"model-{i + 1:05d}-of-{shards:05d}.safetensors" for i in range(shards)]
    if stamp.exists():
        return files
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    weight_map = {}
    per = max(1, shard_mb // TENSOR_MB)
    for i, file in enumerate(files):
        tensors = {}
        for j in range(per):
            name = f"model.layers.{i * per + j}.mlp.down_proj.weight"
            tensors[name] = rng.integers(0, 1 << 16, (1024, TENSOR_MB * 512), dtype=np.uint16)
            weight_map[name] = file.name
        save_file(tensors, str(file), metadata={"format": "pt"})
    index = {"metadata": {"total_size": 0}, "weight_map": weight_map}
    (folder / INDEX_NAME).write_text(json.dumps(index))
    stamp.touch()
    return files


def warm(files: list[Path]) -> None:
    for f in files:
        with f.open("rb") as fh:
            while fh.read(16 << 20):
                pass


def best(fn, repeat: int) -> float:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def sha256sum(files: list[Path]) -> None:
    cores = str(os.cpu_count() or 1)
    subprocess.run(
        ["xargs", "-0", "-P", cores, "-n", "1", "sha256sum"],
        input=b"\0".join(str(f).encode() for f in files),
        check=True,
        stdout=subprocess.DEVNULL,
    )


def _hashlib_one(path: str) -> str:
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(8 << 20):
            h.update(block)
    return h.hexdigest()


def hashlib_pool(files: list[Path], pool: Pool) -> None:
    """The strongest plain baseline: hashlib (OpenSSL) over whole files, one process per
    core."""
    pool.map(_hashlib_one, [str(f) for f in files])


def peak_rss_mb(folder: Path, level: str) -> float:
    code = (
        "import resource, sys; from inspector._internal.integrity import verify; "
        f"r = verify({str(folder)!r}, level={level!r}); assert r.ok, r.findings; "
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)"
    )
    root = str(Path(__file__).resolve().parent.parent)
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=root
    )
    return int(out.stdout.strip()) / 1024


def hub_size_level(shards: int) -> tuple[int, int, float]:
    """(requests, file bytes sent, seconds) of `verify --level size` of a local copy against
    a `shards`-shard repository on the Hub stand-in."""
    folder = CACHE / f"hub-{shards}"
    stamp = CACHE / f".hub-{shards}-built"
    if not stamp.exists():
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        for i in range(shards):
            name = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
            save_file({f"model.layers.{i}.w": np.full((64, 64), i, np.float32)}, str(folder / name))
        (folder / CONFIG_NAME).write_text("{}")
        stamp.touch()
    copy = CACHE / f"hub-{shards}-copy"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(folder, copy)
    with FakeHub({"org/big": {"main": ("c" * 40, folder)}}) as hub:
        options = {"endpoint": hub.url, "token": False}
        start = time.perf_counter()
        result = verify(copy, against="hf://org/big", level="size", storage_options=options)
        seconds = time.perf_counter() - start
        assert result.ok and result.files == shards + 1, result.findings
        return result.files, hub.content_bytes, seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--shard-mb", type=int, default=96)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    folder = CACHE / "ckpt"
    started = os.getloadavg()
    files = build(folder, args.shards, args.shard_mb)
    total = sum(f.stat().st_size for f in files)
    warm(files)
    manifest_s = best(lambda: write_manifest(folder), args.repeat)
    base = best(lambda: sha256sum(files), args.repeat)
    ours = best(lambda: verify(folder, level="hash"), args.repeat)
    tensor = best(lambda: verify(folder, level="tensor"), args.repeat)
    with Pool(os.cpu_count() or 1) as pool:
        strong = best(lambda: hashlib_pool(files, pool), args.repeat)
        base2 = best(lambda: sha256sum(files), args.repeat)  # again, after ours: load drifts
        strong = min(strong, best(lambda: hashlib_pool(files, pool), args.repeat))
    base = min(base, base2)
    mb = total / 1e6
    print(f"checkpoint: {len(files)} shards, {mb:,.0f} MB, {os.cpu_count()} cores")
    # Ratios are measured side by side, but a shared machine's load says how far to trust them.
    print("load average (1, 5, 15 min) at the start: {:.2f} {:.2f} {:.2f}".format(*started))
    print(f"sha256sum, one process per core : {base:6.2f} s  {mb / base:7,.0f} MB/s")
    print(
        f"hashlib sha256, 1 process/core  : {strong:6.2f} s  {mb / strong:7,.0f} MB/s  "
        f"(verify --level hash: {strong / ours:.2f}x its throughput)"
    )
    print(
        f"verify --level hash             : {ours:6.2f} s  {mb / ours:7,.0f} MB/s  "
        f"throughput {base / ours:.2f}x sha256sum (target >= 0.9x)"
    )
    print(
        f"verify --level tensor           : {tensor:6.2f} s  {mb / tensor:7,.0f} MB/s  "
        f"time {tensor / ours:.2f}x --level hash (target <= 1.3x)"
    )
    print(
        f"manifest (sha256 + tensors)     : {manifest_s:6.2f} s  {mb / manifest_s:7,.0f} MB/s  "
        f"throughput {base / manifest_s:.2f}x sha256sum"
    )
    for level in ("hash", "tensor"):
        print(
            f"peak RSS, verify --level {level:6} : {peak_rss_mb(folder, level):6.0f} MB "
            "(target <= 256 MB)"
        )
    files_listed, sent, seconds = hub_size_level(163)
    print(
        f"--level size vs 163-shard Hub repo: {files_listed} files compared in {seconds:.2f} s, "
        f"{sent} file bytes downloaded (target 0)"
    )
    print("load average (1, 5, 15 min) at the end: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
