"""`dcp-sharded`: safetensors written by PyTorch DCP's `HuggingFaceStorageWriter` with
`save_distributed=True`, as NeMo AutoModel does during training (FORMATS.md section 4).

    model/
      shard-00001-model-00001-of-00002.safetensors   one file per rank (1-based) and output
      shard-00002-model-00001-of-00002.safetensors   index; each holds one chunk per tensor
      .hf_metadata/ config.json  fqn_to_file_index_mapping.json  [model.safetensors.index.json]

Each file's `__metadata__["DCP_SHARDING_INFO"]` (a JSON string) gives every chunk's
`saved_offsets` in the full tensor; the full shape is the element-wise max of offset + chunk
shape. Torch writes nothing else: no index, no `.metadata`; `.hf_metadata/` is NeMo's.

Folder choice: pointed at a training checkpoint folder (`epoch_0_step_100/`) whose `model/`
subfolder is DCP-sharded, the scan inspects `model/` and `ScannedCheckpoint.path` is that
subfolder, so every `file` is relative to it. A `consolidated/` subfolder is not read.
A reference HF index kept in `.hf_metadata/` lands in `ScannedCheckpoint.index`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from itertools import pairwise
from math import prod
from operator import add
from pathlib import Path

import orjson

from inspector._gc import gc_paused
from inspector.dtypes import nbytes_for
from inspector.findings import Finding, examples, fold_ranges, make_finding
from inspector.layouts._common import (
    INDEX_NAME,
    list_safetensors,
    read_config_files,
    read_index_doc,
    read_json,
    read_shards,
)
from inspector.model import (
    DcpChunk,
    DcpInfo,
    IndexDoc,
    LogicalTensors,
    ModelSpec,
    ScannedCheckpoint,
)
from inspector.naming import parse_names
from inspector.safetensors_header import ShardHeader, read_shard
from inspector.units import SHARD_SPLIT_SIZE, format_bytes

__all__ = [
    "HF_METADATA_DIR",
    "MAPPING_NAME",
    "NAME",
    "SHARD_NAME",
    "Coverage",
    "check",
    "collect_chunks",
    "coverage",
    "detect",
    "full_shape",
    "logical_tensors",
    "scan",
]

NAME = "dcp-sharded"
# shard-{rank:05d}-model-{output index:05d}-of-{count:05d}.safetensors, rank 1-based.
SHARD_NAME = re.compile(r"^shard-(\d+)-model-(\d+)-of-(\d+)\.safetensors$")
HF_METADATA_DIR = ".hf_metadata"
MAPPING_NAME = "fqn_to_file_index_mapping.json"
SHARDING_KEY = "DCP_SHARDING_INFO"
# Per code, this many tensors get a finding of their own; the rest are folded into one.
_MAX_LISTED = 20


# -- detect ----------------------------------------------------------------------------------


def detect(path: Path) -> bool:
    """A DCP-sharded folder, or a checkpoint folder whose `model/` subfolder is one. Cheap:
    file names first, at most one header read."""
    if not path.is_dir():
        return False
    return _dcp_folder(path) is not None


def _dcp_folder(path: Path) -> Path | None:
    if _looks_dcp(path):
        return path
    model = path / "model"
    if not list_safetensors(path) and model.is_dir() and _looks_dcp(model):
        return model
    return None


def _looks_dcp(folder: Path) -> bool:
    files = list_safetensors(folder)
    if any(SHARD_NAME.match(p.name) for p in files):
        return True
    if (folder / HF_METADATA_DIR).is_dir() and (
        files or (folder / HF_METADATA_DIR / MAPPING_NAME).is_file()
    ):
        return True
    if not files:
        return False
    # Renamed files: the first header tells. Only this one header is read.
    first = read_shard(files[0], root=folder)
    return SHARDING_KEY in (first.metadata or {})


# -- scan ------------------------------------------------------------------------------------


def scan(path: Path, *, header_cap: int) -> ScannedCheckpoint:
    """Read every shard header, the sharding info, `.hf_metadata/` (config, mapping, the
    reference index if kept), and rebuild each tensor's full shape from its chunks."""
    # 1. Which folder, and every header in it.
    folder = _dcp_folder(path) if path.is_dir() else None
    folder = folder or (path if path.is_dir() else path.parent)
    shards = read_shards(list_safetensors(folder), root=folder, header_cap=header_cap)
    # 2. Chunks from DCP_SHARDING_INFO, and the full shapes they imply.
    chunks, chunk_problems = collect_chunks(shards)
    with gc_paused():
        full_shapes = {fqn: full_shape(cs) for fqn, cs in chunks.items()}
    # 3. `.hf_metadata/`: mapping, config, reference index.
    meta = _read_hf_metadata(folder)
    dcp = DcpInfo(
        chunks=chunks,
        full_shapes=full_shapes,
        mapping=meta.mapping,
        mapping_file=meta.mapping_file,
        hf_metadata_dir=HF_METADATA_DIR if (folder / HF_METADATA_DIR).is_dir() else None,
    )
    return ScannedCheckpoint(
        path=folder,
        layout=NAME,
        shards=shards,
        index=meta.index,
        config=meta.config,
        quant_config=meta.quant,
        spec=meta.spec,
        dcp=dcp,
        logical=logical_tensors(chunks, full_shapes),
        problems=[*(f for s in shards for f in s.findings), *chunk_problems, *meta.problems],
        json_files=frozenset(meta.found),
    )


@dataclass(frozen=True, slots=True)
class _HfMetadata:
    mapping: dict[str, int] | None
    mapping_file: str | None
    config: dict | None
    quant: dict | None
    spec: ModelSpec
    index: IndexDoc | None
    found: set[str]
    problems: list[Finding]


def _read_hf_metadata(folder: Path) -> _HfMetadata:
    """NeMo's `.hf_metadata/`; config files directly in the folder when it is absent."""
    meta = folder / HF_METADATA_DIR
    mapping, mapping_file, problems = _read_mapping(meta / MAPPING_NAME, root=folder)
    config_dir = meta if (meta / "config.json").is_file() else folder
    config, quant, spec, found, config_problems = read_config_files(config_dir, root=folder)
    problems.extend(config_problems)
    index: IndexDoc | None = None
    if (meta / INDEX_NAME).is_file():
        index, index_problems = read_index_doc(meta / INDEX_NAME, root=folder)
        problems.extend(index_problems)
        found.add(f"{HF_METADATA_DIR}/{INDEX_NAME}")
    if mapping_file is not None:
        found.add(mapping_file)
    return _HfMetadata(mapping, mapping_file, config, quant, spec, index, found, problems)


def collect_chunks(shards: list[ShardHeader]) -> tuple[dict[str, list[DcpChunk]], list[Finding]]:
    """Every tensor's chunks, in file order, from each shard's sharding info. Pure."""
    with gc_paused():
        return _collect(shards)


def _collect(shards: list[ShardHeader]) -> tuple[dict[str, list[DcpChunk]], list[Finding]]:
    chunks: dict[str, list[DcpChunk]] = {}
    problems: list[Finding] = []
    # Offsets, shapes and dtypes repeat across ranks and experts: one shared object per
    # distinct value keeps millions of chunks affordable, and valid offsets are checked once.
    shared: dict[object, object] = {}
    for shard in shards:
        if not shard.readable:
            continue  # the header reader already reported it
        info, problem = _sharding_info(shard)
        if problem is not None:
            problems.append(make_finding("dcp-sharding-info-missing", problem, file=shard.file))
            continue
        missing: list[str] = []
        wrong_rank: list[str] = []
        for name, dtype, shape in zip(shard.names, shard.dtypes, shard.shapes, strict=True):
            offsets = _offsets(info.get(name), shared)
            if offsets is None:
                missing.append(name)
            elif len(offsets) != len(shape):
                wrong_rank.append(f"{name} (offsets {list(offsets)} for shape {list(shape)})")
            else:
                shape = shared.setdefault(shape, shape)
                chunk = DcpChunk(shard.file, offsets, shape, shared.setdefault(dtype, dtype))
                chunks.setdefault(name, []).append(chunk)
        problems.extend(_offset_problems(shard.file, missing, wrong_rank))
    return chunks, problems


def _sharding_info(shard: ShardHeader) -> tuple[dict, str | None]:
    raw = (shard.metadata or {}).get(SHARDING_KEY)
    if raw is None:
        return {}, (
            f"{shard.file}: no {SHARDING_KEY} in __metadata__, so its {len(shard.names)} "
            "tensors cannot be placed in the full tensors; re-save this rank's file with the "
            "DCP writer, or move a stray non-DCP file out of the folder"
        )
    try:
        info = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        return {}, f"{shard.file}: {SHARDING_KEY} is not valid JSON ({exc}); re-save this rank"
    if not isinstance(info, dict):
        kind = type(info).__name__
        return {}, (
            f"{shard.file}: {SHARDING_KEY} is a JSON {kind}, expected an object "
            '{tensor: {"saved_offsets": [...]}}; re-save this rank'
        )
    return info, None


def _offsets(entry: object, valid: dict) -> tuple[int, ...] | None:
    """The entry's saved_offsets as a tuple of non-negative ints, or None."""
    offsets = entry.get("saved_offsets") if type(entry) is dict else None
    if type(offsets) is not list:
        return None
    key = tuple(offsets)
    known = valid.get(key)
    if known is not None:
        return known
    if not all(type(o) is int and o >= 0 for o in key):
        return None
    # Only valid tuples are remembered, so an invalid one is never mistaken for a valid one.
    valid[key] = key
    return key


def _offset_problems(file: str, missing: list[str], wrong_rank: list[str]) -> list[Finding]:
    out = []
    if missing:
        out.append(
            make_finding(
                "dcp-sharding-info-missing",
                f"{file}: {SHARDING_KEY} has no valid saved_offsets (a list of non-negative "
                f"integers) for {len(missing)} tensor(s) the file holds: {examples(missing)}; "
                "these chunks cannot be placed, re-save this rank",
                file=file,
                tensor=missing[0] if len(missing) == 1 else None,
            )
        )
    if wrong_rank:
        out.append(
            make_finding(
                "dcp-sharding-info-missing",
                f"{file}: saved_offsets length differs from the chunk's number of dimensions "
                f"for {len(wrong_rank)} tensor(s): {examples(wrong_rank)}; re-save this rank",
                file=file,
                tensor=wrong_rank[0].split(" ")[0] if len(wrong_rank) == 1 else None,
            )
        )
    return out


def full_shape(chunks: list[DcpChunk]) -> tuple[int, ...]:
    """Element-wise max of offset + chunk shape over the chunks with the first chunk's
    number of dimensions (chunks with another one are a dtype conflict, reported by check)."""
    ndim = len(chunks[0].shape)
    ends = [map(add, c.offsets, c.shape) for c in chunks if len(c.shape) == ndim]
    return tuple(map(max, zip(*ends, strict=True)))


def logical_tensors(
    chunks: dict[str, list[DcpChunk]], full_shapes: dict[str, tuple[int, ...]]
) -> LogicalTensors:
    """One row per logical tensor: full shape and bytes; file is the first chunk's file."""
    names = list(chunks)
    firsts = [chunks[n][0] for n in names]
    shapes = [full_shapes[n] for n in names]
    return LogicalTensors(
        name=names,
        file=[c.file for c in firsts],
        dtype=[c.dtype for c in firsts],
        shape=shapes,
        nbytes=[nbytes_for(c.dtype, prod(s)) or 0 for c, s in zip(firsts, shapes, strict=True)],
        begin=[None] * len(names),
        end=[None] * len(names),
    )


def _read_mapping(
    path: Path, *, root: Path
) -> tuple[dict[str, int] | None, str | None, list[Finding]]:
    """`fqn_to_file_index_mapping.json`: {fqn: 1-based output index}. Entries whose value is
    not a positive integer are reported and dropped."""
    if not path.is_file():
        return None, None, []
    rel = path.relative_to(root).as_posix()
    value, problem = read_json(path)
    if problem is None and not isinstance(value, dict):
        problem = (
            f"holds a JSON {type(value).__name__}, expected an object {{tensor: output index}}"
        )
    if problem is not None:
        msg = f"{rel} {problem}; regenerate it from the reference model's index"
        return None, rel, [make_finding("mapping-unreadable", msg, file=rel)]
    mapping = {k: v for k, v in value.items() if type(v) is int and v >= 1}
    bad = [f"{k}={v!r}" for k, v in value.items() if k not in mapping]
    if not bad:
        return mapping, rel, []
    msg = (
        f"{rel}: {len(bad)} value(s) are not positive 1-based output file indices: "
        f"{examples(bad)}; those tensors have no output file, regenerate the mapping"
    )
    return mapping, rel, [make_finding("mapping-unreadable", msg, file=rel)]


# -- check -----------------------------------------------------------------------------------


def check(scanned: ScannedCheckpoint) -> list[Finding]:
    """The drift checks of this layout, from scanned data only (no IO)."""
    dcp = scanned.dcp
    if dcp is None:
        return []
    findings = _dtype_conflicts(dcp)
    findings += _coverage_problems(dcp, _lost_chunks(scanned.shards))
    findings += _missing_rank_files(scanned.shards)
    if dcp.mapping is not None:
        findings += _mapping_problems(dcp, scanned.index, scanned.logical)
    return findings


# -- dtype / ndim ----------------------------------------------------------------------------


def _dtype_conflicts(dcp: DcpInfo) -> list[Finding]:
    found: list[tuple[str, str, str]] = []
    for fqn, chunks in dcp.chunks.items():
        dtype, ndim = chunks[0].dtype, len(chunks[0].shape)
        if all(c.dtype == dtype and len(c.shape) == ndim for c in chunks):
            continue
        kinds = {(c.dtype, len(c.shape)) for c in chunks}
        parts = [f"{c.dtype} {list(c.shape)} in {c.file}" for c in chunks]
        what = "dtype" if len({k[0] for k in kinds}) > 1 else "number of dimensions"
        msg = (
            f"tensor {fqn!r}: chunks disagree on {what}: {examples(parts)}; consolidation "
            "would mix them, re-save every rank from one model state"
        )
        found.append((fqn, chunks[0].file, msg))
    return _per_tensor("dcp-dtype-conflict", found, "have chunks that disagree on dtype or ndim")


# -- coverage --------------------------------------------------------------------------------


@dataclass(slots=True)
class Coverage:
    """What a sweep over one tensor's chunks found: union volume, first holes, first overlap."""

    covered: int = 0
    holes: list[tuple[tuple[int, int], ...]] | None = None
    overlap: tuple[DcpChunk, DcpChunk] | None = None


def _lost_chunks(shards: list[ShardHeader]) -> set[tuple[str, str]]:
    """(file, tensor) whose bytes lie past the end of a short file: listed, but not there."""
    lost = set()
    for s in shards:
        if s.readable and s.ends and s.data_start + max(s.ends) > s.file_size:
            limit = s.file_size - s.data_start
            lost.update((s.file, n) for n, e in zip(s.names, s.ends, strict=True) if e > limit)
    return lost


def _coverage_problems(dcp: DcpInfo, lost: set[tuple[str, str]]) -> list[Finding]:
    gaps: list[tuple[str, str, str]] = []
    overlaps: list[tuple[str, str, str]] = []
    for fqn, chunks in dcp.chunks.items():
        full = dcp.full_shapes[fqn]
        total = prod(full)
        if total == 0:
            continue
        ndim = len(full)
        boxes = [c for c in chunks if len(c.shape) == ndim and 0 not in c.shape]
        if lost:
            boxes = [c for c in boxes if (c.file, fqn) not in lost]
        result = coverage(boxes, full)
        if result.overlap is not None:
            overlaps.append((fqn, result.overlap[0].file, _overlap_message(fqn, result.overlap)))
        if result.covered < total:
            gaps.append((fqn, chunks[0].file, _gap_message(fqn, full, result, chunks, lost)))
    return [
        *_per_tensor("dcp-coverage-gap", gaps, "are not fully covered by their chunks"),
        *_per_tensor("dcp-chunk-overlap", overlaps, "have overlapping chunks"),
    ]


def coverage(chunks: list[DcpChunk], full: tuple[int, ...]) -> Coverage:
    """Exact union volume of the chunk boxes inside `full`, with the first few uncovered
    boxes and the first overlapping pair. Never allocates a tensor.

    Fast path: chunks identical on every dimension but one (row- or column-sharded) are one
    sorted 1-D pass. Otherwise a sweep over breakpoints, one dimension at a time."""
    out = Coverage(holes=[])
    if not chunks:
        out.holes.append(tuple((0, n) for n in full))
        return out
    if not full:
        out.covered = 1
        if len(chunks) > 1:
            out.overlap = (chunks[0], chunks[1])
        return out
    varying = [d for d in range(len(full)) if len({(c.offsets[d], c.shape[d]) for c in chunks}) > 1]
    if len(varying) <= 1:
        _tiled(chunks, full, varying[0] if varying else 0, out)
    else:
        out.covered = _sweep(chunks, full, 0, (), out)
    return out


def _tiled(chunks: list[DcpChunk], full: tuple[int, ...], dim: int, out: Coverage) -> None:
    """All chunks share one box on every dimension except `dim`."""
    first = chunks[0]
    other = 1
    for d in range(len(full)):
        if d != dim:
            # Every chunk spans [offset, offset + shape) here; what lies before is uncovered.
            if first.offsets[d]:
                prefix = tuple(
                    (0, m) if e != d else (0, first.offsets[d]) for e, m in enumerate(full)
                )
                _add_hole(out, prefix)
            other *= first.shape[d]
    length = _intervals(chunks, full, dim, tuple((0, n) for n in full), out)
    out.covered = length * other


def _sweep(
    chunks: list[DcpChunk], full: tuple[int, ...], dim: int, prefix: tuple, out: Coverage
) -> int:
    """Union volume of `chunks` over dimensions dim.. (the earlier ones fixed to `prefix`)."""
    if dim == len(full) - 1:
        box = (*prefix, *((0, n) for n in full[dim:]))
        return _intervals(chunks, full, dim, box, out)
    points = sorted(
        {
            0,
            full[dim],
            *(c.offsets[dim] for c in chunks),
            *(c.offsets[dim] + c.shape[dim] for c in chunks),
        }
    )
    order = sorted(chunks, key=lambda c: c.offsets[dim])
    active: list[DcpChunk] = []
    nxt = 0
    volume = 0
    for a, b in pairwise(points):
        while nxt < len(order) and order[nxt].offsets[dim] <= a:
            active.append(order[nxt])
            nxt += 1
        active = [c for c in active if c.offsets[dim] + c.shape[dim] > a]
        here = (*prefix, (a, b))
        if not active:
            _add_hole(out, (*here, *((0, n) for n in full[dim + 1 :])))
            continue
        volume += (b - a) * _sweep(active, full, dim + 1, here, out)
    return volume


def _intervals(
    chunks: list[DcpChunk], full: tuple[int, ...], dim: int, box: tuple, out: Coverage
) -> int:
    """Union length along `dim`; records holes (as boxes) and the first overlap."""
    covered = 0
    reach = 0
    last: DcpChunk | None = None
    for c in sorted(chunks, key=lambda c: (c.offsets[dim], c.shape[dim])):
        start, end = c.offsets[dim], c.offsets[dim] + c.shape[dim]
        if start > reach:
            _add_hole(out, _with(box, dim, (reach, start)))
        elif start < reach and out.overlap is None and last is not None:
            out.overlap = (last, c)
        if end > reach:
            covered += end - max(start, reach)
            reach, last = end, c
    if reach < full[dim]:
        _add_hole(out, _with(box, dim, (reach, full[dim])))
    return covered


def _with(box: tuple, dim: int, span: tuple[int, int]) -> tuple:
    return (*box[:dim], span, *box[dim + 1 :])


def _add_hole(out: Coverage, box: tuple) -> None:
    # A few are enough for a message; counting them all could be huge.
    if out.holes is not None and len(out.holes) < 3:
        out.holes.append(box)


def _gap_message(
    fqn: str, full: tuple[int, ...], result: Coverage, chunks: list[DcpChunk], lost: set
) -> str:
    total = prod(full)
    holes = "; ".join(_box_text(b) for b in result.holes or [])
    files = sorted({c.file for c in chunks})
    short = sorted(f for f in files if (f, fqn) in lost)
    cause = f" ({', '.join(short)} is truncated)" if short else ""
    return (
        f"tensor {fqn!r} (full shape {list(full)} from its chunks): chunks cover "
        f"{result.covered:,} of {total:,} elements; uncovered {holes}. Chunks are in "
        f"{examples(files)}{cause}; a rank's file is missing or short, restore it or re-save"
    )


def _box_text(box: tuple) -> str:
    return "[" + ", ".join(f"{a}:{b}" for a, b in box) + "]"


def _overlap_message(fqn: str, pair: tuple[DcpChunk, DcpChunk]) -> str:
    a, b = pair
    return (
        f"tensor {fqn!r}: chunk at offsets {list(a.offsets)} shape {list(a.shape)} in {a.file} "
        f"overlaps chunk at offsets {list(b.offsets)} shape {list(b.shape)} in {b.file}; "
        "consolidation keeps whichever it copies last, re-save from one sharding plan"
    )


def _missing_rank_files(shards: list[ShardHeader]) -> list[Finding]:
    """A rank that wrote some output files but not one that other ranks wrote: its chunks
    of those tensors are gone, and if it was the last rank the full shapes silently shrink
    (they are computed from the chunks present), so the boxes alone cannot tell."""
    present: dict[tuple[int, int], str] = {}
    counts: set[int] = set()
    for s in shards:
        m = SHARD_NAME.match(s.file.rsplit("/", 1)[-1])
        if m and s.readable:
            present[(int(m[1]), int(m[2]))] = s.file
            counts.add(int(m[3]))
    if len(counts) != 1:
        return []
    (count,) = counts
    ranks = {r for r, _ in present}
    outputs = {i for _, i in present}
    findings = []
    for i in sorted(outputs):
        missing = sorted(r for r in ranks if (r, i) not in present)
        if not missing:
            continue
        writers = sorted(r for r in ranks if (r, i) in present)
        names = [f"shard-{r:05d}-model-{i:05d}-of-{count:05d}.safetensors" for r in missing]
        msg = (
            f"{examples(names)} missing or unreadable: ranks {fold_ranges(writers)} wrote output "
            f"file {i} but ranks {fold_ranges(missing)} did not, though they wrote other outputs; "
            f"tensors of output {i} lack those ranks' chunks (full shapes may be understated). "
            "Restore the file(s) or re-save"
        )
        findings.append(make_finding("dcp-coverage-gap", msg, file=names[0]))
    return findings


# -- mapping ---------------------------------------------------------------------------------


def _mapping_problems(
    dcp: DcpInfo, index: IndexDoc | None, logical: LogicalTensors | None
) -> list[Finding]:
    mapping = dcp.mapping or {}
    rel = dcp.mapping_file or MAPPING_NAME
    unmapped = [
        (
            fqn,
            cs[0].file,
            f"tensor {fqn!r} is in {cs[0].file} but has no output index in {rel}; "
            "consolidation has no output file for it, add it to the mapping",
        )
        for fqn, cs in dcp.chunks.items()
        if fqn not in mapping
    ]
    dangling = [
        (
            fqn,
            rel,
            f"{rel} maps {fqn!r} to output {idx} but no shard holds it (a tied alias "
            "such as lm_head.weight, or a lost rank?); drop it from the mapping or restore it",
        )
        for fqn, idx in mapping.items()
        if fqn not in dcp.chunks
    ]
    return [
        *_per_tensor("mapping-unmapped-tensor", unmapped, f"are absent from {rel}"),
        *_per_tensor("mapping-dangling-tensor", dangling, f"are listed in {rel} but in no shard"),
        *_collapsed(mapping, rel, index, sum(logical.nbytes) if logical else 0),
    ]


def _collapsed(
    mapping: dict[str, int], rel: str, index: IndexDoc | None, total: int
) -> list[Finding]:
    """Every tensor to one output file although the reference had several (seed
    automodel-2289) or although the output would pass the shard size limit."""
    if len(mapping) < 2 or len(set(mapping.values())) != 1:
        return []
    (target,) = set(mapping.values())
    ref_files = sorted(set(index.weight_map.values())) if index else []
    reasons = []
    if len(ref_files) > 1:
        reasons.append(
            f"the reference index {index.file} names {len(ref_files)} files "
            f"({examples(ref_files, limit=2)})"
        )
    if total > SHARD_SPLIT_SIZE:
        reasons.append(
            f"the tensors total {format_bytes(total)}, over the {format_bytes(SHARD_SPLIT_SIZE)} "
            "per-file limit"
        )
    if not reasons:
        return []
    outcome = f"a single file instead of {len(ref_files)}" if len(ref_files) > 1 else "one file"
    msg = (
        f"{rel} sends all {len(mapping):,} tensors to output file {target} although "
        f"{' and '.join(reasons)}; consolidation would write {outcome}. Known cause: the "
        "output index was parsed from non-standard reference shard names (e.g. "
        "model.safetensors-00001-of-00004.safetensors all read as 1); regenerate the mapping "
        "from the '-NNNNN-of-NNNNN.safetensors' numbers, or pack by size (5 GB per file)"
    )
    return [make_finding("mapping-collapsed", msg, file=rel)]


# -- helpers ---------------------------------------------------------------------------------


def _per_tensor(code: str, items: list[tuple[str, str, str]], what: str) -> list[Finding]:
    """One finding per (tensor, file, message) up to a limit, then one folded summary."""
    if not items:
        return []
    parsed = parse_names([fqn for fqn, _, _ in items])
    # MTP names number their blocks, not decoder layers: no layer for them.
    layers = [-1 if mtp else int(x) for x, mtp in zip(parsed.layer, parsed.mtp, strict=True)]
    experts = [int(x) for x in parsed.expert]
    out = [
        make_finding(
            code, msg, file=file, tensor=fqn, layer=_opt(layers[i]), expert=_opt(experts[i])
        )
        for i, (fqn, file, msg) in enumerate(items[:_MAX_LISTED])
    ]
    rest = [fqn for fqn, _, _ in items[_MAX_LISTED:]]
    if rest:
        where = [x for x in layers[_MAX_LISTED:] if x >= 0]
        in_layers = f" (layers {fold_ranges(where)})" if where else ""
        msg = f"{len(rest):,} more tensors {what}: {examples(rest)}{in_layers}"
        out.append(make_finding(code, msg))
    return out


def _opt(value: int) -> int | None:
    return None if value < 0 else value
