"""torch_dist `.metadata` benchmark: what bounding the pickle costs against the bare unpickler.

    python benchmarks/bench_torch_dist.py                       # 100k tensors x 8 chunks
    python benchmarks/bench_torch_dist.py --tensors 25000 --chunks 4
    python benchmarks/bench_torch_dist.py --no-plans            # plain DCP, no all_local_plans
    python benchmarks/bench_torch_dist.py --profile 25          # also a cProfile of the load

The `.metadata` is written the way the real writers write it: torch's own DCP dataclasses
(`Metadata`, `TensorStorageMetadata`, `ChunkStorageMetadata`, `MetadataIndex`, `_StorageInfo`)
pickled with `pickle.dump`, as `FileSystemWriter` does. With plans (the default) it also
carries megatron-core 0.16.1's extra payload (tests/fixtures/writers/megatron/*): one
`SavePlan` per rank in `all_local_plans`, each with a `WriteItem` per chunk it saved
(`MetadataIndex`, `WriteItemType.SHARD`, `TensorWriteData(chunk, properties, size)`). The
folder holds sparse `__<rank>_0.distcp` files of the right sizes and Megatron's
`metadata.json`: the scan reads it without a read problem (the shapes vary per expert, so
`check` would judge them; only reading is measured). Built once, cached under
`benchmarks/.cache/`.

Times (best of `--repeat`, wall clock, in this process; the child's time included):

- C unpickle alone: the restricted unpickler (`_metadata`, unaudited), no audit, no bound;
- bare: that unpickle and the conversion to the scan's data, unbounded: the floor of
  reading the file without running its code, and the work every bounded read also does;
- audited: the pure-Python audit (`pickles.audit`), then the same, in this process;
- sandboxed: `read_dcp_metadata` as the scan calls it: the same work in a forked child
  bounded by RLIMIT_CPU / RLIMIT_AS, the result shipped back pickled;
- the whole scan with the sandboxed, the audited and no bound at all.

Target: sandboxed / bare <= 2.0 at 100k tensors x 8 chunks (the bound at most doubles the
cost of reading `.metadata`). Use a quiet machine: the child and this process share the cores.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import gc
import json
import pickle
import pstats
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from inspector._internal.common.gc import gc_paused
from inspector._internal.formats.pickles import dcp_metadata
from inspector._internal.formats.pickles.stand_ins import StandIn
from inspector._internal.layouts import torch_dist
from inspector._internal.scan.entry import scan

TARGET_RATIO = 2.0
CACHE_DIR = Path(__file__).resolve().parent / ".cache"
_COMPLETE = ".complete"
# A few distinct shapes, as a model has (attention, MLP, experts, norms); bf16.
_SHAPES = ((4096, 1024), (2048, 4096), (1024, 2048), (8192, 512))


def ensure_folder(tensors: int, chunks: int, plans: bool) -> Path:
    """The cached torch_dist folder for these parameters (built on first use)."""
    folder = CACHE_DIR / f"torch-dist-v1-t{tensors}-c{chunks}-p{int(plans)}"
    if (folder / _COMPLETE).exists():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    metadata, file_sizes = _metadata(tensors, chunks, plans)
    with open(folder / ".metadata", "wb") as fh:
        pickle.dump(metadata, fh)  # what torch's FileSystemWriter does
    for name, size in file_sizes.items():
        with open(folder / name, "wb") as fh:
            fh.truncate(size)  # sparse: the scan only stats the data files
    (folder / "metadata.json").write_text(
        json.dumps(
            {
                "sharded_backend": "torch_dist",
                "sharded_backend_version": 1,
                "common_backend": "torch",
                "common_backend_version": 1,
            }
        )
    )
    (folder / _COMPLETE).touch()
    print(f"built {folder.name} in {time.perf_counter() - started:.1f} s")
    return folder


def _metadata(tensors: int, chunks: int, plans: bool) -> tuple[Any, dict[str, int]]:
    import torch
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import (
        ChunkStorageMetadata,
        Metadata,
        MetadataIndex,
        StorageMeta,
        TensorProperties,
        TensorStorageMetadata,
    )
    from torch.distributed.checkpoint.planner import (
        SavePlan,
        TensorWriteData,
        WriteItem,
        WriteItemType,
    )

    entries: dict[str, TensorStorageMetadata] = {}
    storage: dict[MetadataIndex, _StorageInfo] = {}
    items: list[list[WriteItem]] = [[] for _ in range(chunks)]  # one rank per chunk
    ends = [0] * chunks
    props = TensorProperties(dtype=torch.bfloat16)
    for t in range(tensors):
        rows, cols = _SHAPES[t % len(_SHAPES)]
        size = torch.Size([rows * chunks, cols])
        layer, expert = divmod(t, 256)
        fqn = f"decoder.layers.{layer}.mlp.experts.local_experts.{expert}.linear_fc1.weight"
        parts = []
        for c in range(chunks):
            chunk = ChunkStorageMetadata(torch.Size([c * rows, 0]), torch.Size([rows, cols]))
            parts.append(chunk)
            index = MetadataIndex(fqn, chunk.offsets)
            length = rows * cols * 2
            storage[index] = _StorageInfo(f"__{c}_0.distcp", ends[c], length)
            ends[c] += length
            if plans:
                data = TensorWriteData(chunk=chunk, properties=props, size=size)
                items[c].append(WriteItem(index, WriteItemType.SHARD, tensor_data=data))
        entries[fqn] = TensorStorageMetadata(props, size, parts)
    meta = Metadata(
        state_dict_metadata=entries,
        storage_data=storage,
        storage_meta=StorageMeta(checkpoint_id="/ckpt/iter_0000100", save_id="bench"),
    )
    if plans:
        meta.all_local_plans = [  # type: ignore[attr-defined]
            SavePlan(items=rank_items, planner_data={}) for rank_items in items
        ]
    return meta, {f"__{c}_0.distcp": ends[c] for c in range(chunks)}


# -- measurements ------------------------------------------------------------------------------


def best_of(repeat: int, fn: Callable[[], object]) -> float:
    """Best wall time of `repeat` runs, each after a full collection, with the collector
    paused as the scan pauses it around `.metadata`."""
    best = float("inf")
    for _ in range(repeat):
        gc.collect()
        with gc_paused():
            started = time.perf_counter()
            result = fn()
            elapsed = time.perf_counter() - started
            del result
        best = min(best, elapsed)
    return best


def _convert(meta: StandIn) -> object:
    return torch_dist._convert_metadata(meta, rel=".metadata", prefix="")


def read_unbounded(data: bytes, convert: Callable[[Any], object] = _convert) -> object:
    """The restricted C unpickler and the conversion, in this process, unbounded: the floor
    of reading the file without running its code (what the bounds are measured against)."""
    return convert(dcp_metadata._metadata(data, audited=False))


def read_audited(data: bytes, convert: Callable[[Any], object] = _convert) -> object:
    """The pure-Python audit, then the unpickle and the conversion, in this process."""
    return convert(dcp_metadata.load_dcp_metadata(data))


def read_sandboxed(data: bytes, convert: Callable[[Any], object] = _convert) -> object:
    """What the scan does: the bounded child for a large file."""
    from inspector._internal.checkpoint.read_problems import FileRole, ProblemKind, ReadProblem
    from inspector._internal.checkpoint.scanned import TorchDistTensor

    classes = (TorchDistTensor, ReadProblem, FileRole, ProblemKind)
    return dcp_metadata.read_dcp_metadata(data, convert, classes=classes)


@contextlib.contextmanager
def scan_reading(reader: Callable[..., object] | None) -> Iterator[None]:
    """The scan with its `.metadata` reader replaced (None: as shipped)."""
    saved = torch_dist.read_dcp_metadata
    if reader is not None:
        torch_dist.read_dcp_metadata = lambda data, convert, **_: reader(data, convert)
    try:
        yield
    finally:
        torch_dist.read_dcp_metadata = saved


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tensors", type=int, default=100_000)
    parser.add_argument("--chunks", type=int, default=8)
    parser.add_argument("--no-plans", action="store_true", help="plain DCP, no all_local_plans")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--profile", type=int, metavar="N", help="print the top N of a profile")
    args = parser.parse_args(argv)

    folder = ensure_folder(args.tensors, args.chunks, not args.no_plans)
    data = (folder / ".metadata").read_bytes()
    note = "" if args.no_plans else " + all_local_plans"
    size = f"{len(data) / 1e6:,.1f} MB"
    print(f".metadata: {size}, {args.tensors:,} tensors x {args.chunks} chunks{note}")
    unpickle = best_of(args.repeat, lambda: dcp_metadata._metadata(data, audited=False))
    bare = best_of(args.repeat, lambda: read_unbounded(data))
    audited = best_of(args.repeat, lambda: read_audited(data))
    sandboxed = best_of(args.repeat, lambda: read_sandboxed(data))
    rows = [
        ("C unpickle alone (restricted, unbounded)", unpickle),
        ("unpickle + conversion, unbounded (bare)", bare),
        ("audit + unpickle + conversion", audited),
        ("sandboxed child (what the scan does)", sandboxed),
    ]
    for label, seconds in rows:
        print(
            f"  {label:<42} {seconds:7.3f} s  {seconds / bare:5.2f}x bare  "
            f"{seconds / unpickle:5.2f}x unpickle"
        )
    scans = {}
    for label, reader in (
        ("scan, sandboxed (as shipped)", None),
        ("scan, audited in process", read_audited),
        ("scan, no bound", read_unbounded),
    ):
        with scan_reading(reader):
            scans[label] = best_of(args.repeat, lambda: scan(folder))
    base = scans["scan, no bound"]
    for label, seconds in scans.items():
        print(f"  {label:<42} {seconds:7.3f} s  {seconds / base:5.2f}x no bound")
    ratio = sandboxed / bare
    verdict = "ok" if ratio <= TARGET_RATIO else "over"
    print(
        f"bounded / bare = {ratio:.2f} sandboxed, {audited / bare:.2f} audited "
        f"(target <= {TARGET_RATIO}: {verdict})"
    )
    if args.profile:
        profiler = cProfile.Profile()
        profiler.runcall(read_audited, data)
        pstats.Stats(profiler).sort_stats("tottime").print_stats(args.profile)
    return 0


if __name__ == "__main__":
    sys.exit(main())
