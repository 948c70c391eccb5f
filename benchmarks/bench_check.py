"""Check benchmark: the full `check` (scan, tables, every drift and structure check) on the
300,000-tensor synthetic checkpoint with drift injected, against the raw-header floor.

    python benchmarks/bench_check.py                   # ~300k tensors
    python benchmarks/bench_check.py --tensors 20000   # quick run
    python benchmarks/bench_check.py --profile 25      # also print the top of a cProfile

The drifted checkpoint is a COPY of the cached synthetic one (`_synthetic.py`): untouched shards
are hard links, so it costs no disk. The drift: the MTP layer's tensors are left out of the
index (unindexed tensors, as in seed modelopt-1422), the index lists `mtp.fc.weight` that no
shard holds (dangling), and one MoE layer keeps only experts 0-63 of 512 (its shards are
rewritten without the others, and the index agrees with them, as in seed modelopt-1631).
The floor is the one of `bench_scan.py`. Target: check / floor <= 3.0.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import struct
import sys
import time
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _synthetic import SyntheticSpec, _write_shard, ensure_checkpoint, spec_for
from bench_scan import best_of, floor, profile

from inspector._internal.checks import check
from inspector._internal.common.filenames import INDEX_NAME
from inspector._internal.findings.finding import Finding
from inspector._internal.scan.entry import scan

TARGET_RATIO = 3.0
KEPT_EXPERTS = 64
_COMPLETE = ".complete"


def full_check(folder: Path) -> list[Finding]:
    """What `ckpt-inspect check --no-model` does, without printing (the model-aware load check
    imports torch and transformers, and is measured on its own by bench_model_load.py)."""
    return check(scan(folder), model=False)


# -- the drifted copy ----------------------------------------------------------------------


def drifted_copy(spec: SyntheticSpec) -> tuple[Path, int]:
    """(folder, layer with missing experts): built once next to the source, then cached."""
    source = ensure_checkpoint(spec)
    layer = spec.first_dense + (spec.layers - spec.first_dense) // 2
    folder = source.parent / f"{source.name}-drift"
    if (folder / _COMPLETE).is_file():
        return folder, layer
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir()
    _inject(source, folder, spec, layer)
    (folder / _COMPLETE).write_text("drift\n")
    return folder, layer


def _inject(source: Path, folder: Path, spec: SyntheticSpec, layer: int) -> None:
    """1. hard-link every shard and copy the JSON files; 2. rewrite the shards holding `layer`'s
    experts without ids >= KEPT_EXPERTS; 3. edit the index: drop those and the MTP tensors,
    add a dangling entry."""
    index = orjson.loads((source / INDEX_NAME).read_bytes())
    for entry in os.scandir(source):
        if entry.name.endswith(".safetensors"):
            os.link(entry.path, folder / entry.name)
        elif entry.name.endswith(".json"):
            shutil.copyfile(entry.path, folder / entry.name)
    expert = re.compile(rf"model\.layers\.{layer}\.mlp\.experts\.(\d+)\.")
    dropped: set[str] = set()
    for file in sorted({f for n, f in index["weight_map"].items() if expert.match(n)}):
        entries = _header_entries(source / file)
        kept = [e for e in entries if not _drop(expert, e[0])]
        dropped |= {e[0] for e in entries} - {e[0] for e in kept}
        (folder / file).unlink()  # break the hard link before rewriting
        _write_shard(folder / file, kept)
    mtp_prefix = f"model.layers.{spec.layers}."
    weight_map = {
        n: f
        for n, f in index["weight_map"].items()
        if n not in dropped and not n.startswith(mtp_prefix)
    }
    weight_map["mtp.fc.weight"] = next(iter(weight_map.values()))
    index["weight_map"] = weight_map
    (folder / INDEX_NAME).write_text(json.dumps(index, indent=2))


def _drop(expert: re.Pattern[str], name: str) -> bool:
    match = expert.match(name)
    return bool(match) and int(match.group(1)) >= KEPT_EXPERTS


def _header_entries(path: Path) -> list[tuple[str, str, tuple[int, ...]]]:
    """(name, dtype, shape) of every tensor, in data order."""
    with open(path, "rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        header = orjson.loads(fh.read(n))
    header.pop("__metadata__", None)
    ordered = sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0])
    return [(name, e["dtype"], tuple(e["shape"])) for name, e in ordered]


# -- reporting -------------------------------------------------------------------------------


def verify(findings: list[Finding], layer: int, spec: SyntheticSpec) -> list[str]:
    """Problems with the findings (the benchmark must measure a check that works)."""
    codes = {f.code for f in findings}
    problems = [
        f"no {code} finding"
        for code in ("unindexed-tensor", "index-dangling-tensor", "expert-missing")
        if code not in codes
    ]
    wanted = f"experts {KEPT_EXPERTS}-{spec.experts - 1} missing"
    hits = [f for f in findings if f.code == "expert-missing" and f.layer == layer]
    if not hits or wanted not in hits[0].message:
        problems.append(f"layer {layer}: expected '{wanted}'")
    return problems


def main(argv: list[str] | None = None) -> int:
    """Build (or reuse) the drifted copy, time floor, scan and full check, print the ratio."""
    args = _parse(argv)
    spec = spec_for(tensors=args.tensors, shards=args.shards)
    t0 = time.perf_counter()
    folder, layer = drifted_copy(spec)
    print(f"checkpoint: {folder} (ready in {time.perf_counter() - t0:.1f} s)")
    floor(folder)  # warm the page cache
    t_floor, n_tensors = best_of(floor, folder, runs=args.runs)
    t_scan, _ = best_of(scan, folder, runs=args.runs)
    t_check, findings = best_of(full_check, folder, runs=args.runs)
    problems = verify(findings, layer, spec)
    _report(args.runs, n_tensors, findings, problems, t_floor, t_scan, t_check)
    if args.profile:
        print(profile(full_check, folder, top=args.profile))
    return 1 if problems else 0


def _report(
    runs: int,
    n_tensors: int,
    findings: list[Finding],
    problems: list[str],
    t_floor: float,
    t_scan: float,
    t_check: float,
) -> None:
    by_code: dict[str, int] = {}
    for f in findings:
        by_code[f.code] = by_code.get(f.code, 0) + 1
    ratio = t_check / t_floor
    print(f"  {n_tensors:,} tensors in headers; findings: {by_code}")
    print(f"best of {runs} (warm page cache):")
    print(f"  floor (open, read length + header, json.loads)    {t_floor:8.3f} s")
    print(f"  scan (headers, index, config; no tables)          {t_scan:8.3f} s", end="")
    print(f"   ratio {t_scan / t_floor:5.2f}")
    print(f"  full check (scan + tables + every check)          {t_check:8.3f} s", end="")
    print(f"   ratio {ratio:5.2f}   (target <= {TARGET_RATIO})")
    for problem in problems:
        print(f"  CHECK WRONG: {problem}")
    print(f"  target {'MET' if ratio <= TARGET_RATIO else 'NOT MET'}")


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tensors", type=int, default=300_000, help="about this many tensors")
    parser.add_argument("--shards", type=int, default=None, help="this many shards")
    parser.add_argument("--runs", type=int, default=3, help="best of this many runs")
    parser.add_argument(
        "--profile", type=int, default=0, metavar="N", help="print a cProfile top N"
    )
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(main())
