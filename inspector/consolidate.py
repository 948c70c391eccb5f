"""Consolidate DCP-sharded safetensors into a Hugging Face checkpoint (FORMATS.md section 4).

Two steps, so a person can read what will happen before anything is written:

    plan = plan_consolidation(scan("ckpt/model"), "ckpt/model-consolidated")
    print(plan)              # outputs, tensor counts, bytes, and why this assignment
    result = plan.execute()  # writes model-*-of-*.safetensors + model.safetensors.index.json

Planning is pure (scanned headers in, a frozen plan out). Executing copies bytes: pieces that
are contiguous in the output (whole tensors, row-sharded chunks) go through
`os.copy_file_range`; column-sharded chunks are placed with one strided numpy assignment per
chunk and block of rows. Memory stays bounded by the block size, never by the model.
"""

from __future__ import annotations

import errno
import math
import mmap
import os
import re
import shutil
import threading
import time
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from inspector.atomic import fsync_dir, write_atomic
from inspector.casting import cast_bytes, dtype_for_target
from inspector.dtypes import DTYPE_BITS, FLOAT_DTYPES
from inspector.errors import InspectorError, PlanRefusedError
from inspector.findings import Finding, examples
from inspector.layouts._common import INDEX_NAME, list_safetensors, read_json
from inspector.model import DcpChunk, ScannedCheckpoint
from inspector.safetensors_header import read_shard
from inspector.units import SHARD_SPLIT_SIZE, format_bytes, parse_size

__all__ = [
    "ConsolidationPlan",
    "ConsolidationResult",
    "OutputFile",
    "Piece",
    "PlannedTensor",
    "consolidate",
    "default_destination",
    "plan_consolidation",
    "reference_assignment",
]

# Rows of a non-contiguous tensor are assembled in blocks of about this many bytes, so memory
# is bounded by the block, not by the largest tensor.
BLOCK_BYTES = 8 << 20  # L2/L3-friendly: 8 MB blocks beat 64 MB by 20% on column chunks
_COPY_BLOCK = 64 << 20
_OUTPUT_NAME = "model-{i:05d}-of-{n:05d}.safetensors"
_INDEXED_NAME = re.compile(r"-(\d+)-of-(\d+)\.safetensors$")
_METADATA_CAP = 2_000_000_000
# Findings that make the assembled tensors wrong: consolidation refuses to run on them.
_BLOCKING = frozenset(
    {
        "header-unreadable",
        "header-invalid-entry",
        "unknown-dtype",
        "size-mismatch",
        "offset-invalid",
        "file-truncated",
        "dcp-sharding-info-missing",
        "dcp-coverage-gap",
        "dcp-chunk-overlap",
        "dcp-dtype-conflict",
    }
)


# -- the plan -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Piece:
    """One source chunk of a tensor: where its bytes are, and where it sits in the tensor."""

    file: str
    src_offset: int  # absolute byte offset of the chunk in `file`
    nbytes: int
    offsets: tuple[int, ...]
    shape: tuple[int, ...]
    # Byte offset inside the output tensor when the chunk is one contiguous range, else None.
    dst_offset: int | None


@dataclass(frozen=True, slots=True)
class PlannedTensor:
    name: str
    dtype: str  # source dtype
    out_dtype: str
    shape: tuple[int, ...]
    begin: int  # data offsets in the output file's data section
    end: int
    pieces: tuple[Piece, ...]

    @property
    def contiguous(self) -> bool:
        """True when every chunk is a plain byte range of the output and no cast is needed."""
        return self.dtype == self.out_dtype and all(p.dst_offset is not None for p in self.pieces)


@dataclass(frozen=True, slots=True)
class OutputFile:
    index: int  # 1-based
    name: str
    header: bytes  # the 8-byte length prefix and the padded JSON header
    tensors: tuple[PlannedTensor, ...]

    @property
    def data_bytes(self) -> int:
        return self.tensors[-1].end if self.tensors else 0

    @property
    def size(self) -> int:
        return len(self.header) + self.data_bytes


@dataclass(frozen=True)
class ConsolidationPlan:
    """What `execute` will write, decided from headers only. Print it to review it."""

    source: Path
    dest: Path
    outputs: tuple[OutputFile, ...]
    assignment: str  # which rule chose the output files
    reason: str  # why that rule applied
    dtype: str | None  # the cast target (safetensors dtype), if any
    metadata_files: tuple[str, ...]  # public `.hf_metadata/` files copied to DEST
    notes: tuple[str, ...] = ()
    findings: tuple[Finding, ...] = ()  # non-blocking findings of the source

    @property
    def total_size(self) -> int:
        return sum(o.data_bytes for o in self.outputs)

    @property
    def total_parameters(self) -> int:
        return sum(math.prod(t.shape) for o in self.outputs for t in o.tensors)

    @property
    def weight_map(self) -> dict[str, str]:
        return {t.name: o.name for o in self.outputs for t in o.tensors}

    def describe(self) -> str:
        """A readable summary: every output file, its tensors and bytes, and the reasons."""
        return _describe_plan(self)

    def __str__(self) -> str:
        return self.describe()

    def execute(
        self,
        *,
        resume: bool = False,
        progress: bool = True,
        verify: bool = True,
        verify_data: bool = False,
        workers: int = 1,
        rank: int | None = None,
        world_size: int | None = None,
        fsync: bool = True,
    ) -> ConsolidationResult:
        """Write the outputs, then the index (rank 0), then verify DEST.

        `resume` keeps outputs already complete (same size and header). `verify` re-scans and
        checks DEST; `verify_data` also compares every tensor's content hash with the source.
        `workers` threads write separate files (each holds one 8 MB block buffer). Under
        torchrun, or with `rank`/`world_size`, output i is written by rank i % world_size.
        `fsync=False` skips flushing each output to disk before its rename: a killed process
        still never leaves a partial file under a final name, but a power loss may (for
        scratch destinations that are re-created on failure anyway).
        """
        return _execute(
            self,
            resume=resume,
            progress=progress,
            verify=verify,
            verify_data=verify_data,
            workers=workers,
            rank=rank,
            world_size=world_size,
            fsync=fsync,
        )


@dataclass(frozen=True)
class ConsolidationResult:
    """What one process wrote and what the verification of DEST found."""

    dest: Path
    written: tuple[str, ...]
    skipped: tuple[str, ...]  # complete outputs left alone by `resume=True`
    bytes_written: int
    seconds: float
    index_file: str | None  # None on ranks other than 0
    metadata_files: tuple[str, ...]
    rank: int = 0
    world_size: int = 1
    verified: bool = False
    findings: tuple[Finding, ...] = ()
    data_checked: int = 0
    data_mismatches: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        """No finding and no content mismatch in DEST (True on ranks that did not verify)."""
        return not self.findings and not self.data_mismatches

    def describe(self) -> str:
        return _describe_result(self)

    def __str__(self) -> str:
        return self.describe()


def default_destination(source: str | os.PathLike[str]) -> Path:
    """Where a consolidation of `source` goes unless told otherwise: a sibling folder
    `<source>-consolidated`. Not inside the source: the output would sit in (and be copied,
    backed up and scanned with) the very checkpoint it replaces."""
    path = Path(source).expanduser().resolve()
    return path.with_name(f"{path.name}-consolidated")


def plan_consolidation(
    scanned: ScannedCheckpoint,
    dest: str | os.PathLike[str],
    *,
    mapping: str | os.PathLike[str] | Mapping[str, int] | None = None,
    reference: str | os.PathLike[str] | None = None,
    max_shard_size: int | str = SHARD_SPLIT_SIZE,
    dtype: str | None = None,
) -> ConsolidationPlan:
    """Plan the consolidation of a scanned DCP-sharded checkpoint into `dest`.

    Output files are assigned by the first rule that applies: `mapping` (JSON {fqn: 1-based
    index}), `.hf_metadata/fqn_to_file_index_mapping.json`, `reference` (an HF folder or index),
    a reference index kept in `.hf_metadata/`, else greedy by size in key order. Raises
    `PlanRefusedError` when the source has gaps, overlaps or conflicting chunks.
    """
    # 1. Is there something sound to consolidate?
    dest_path = _check_dest(scanned, Path(dest))
    explicit = mapping is not None or reference is not None
    findings = _refuse_on_errors(scanned, explicit=explicit)
    if explicit:
        # The caller's mapping or reference replaces the recorded mapping: its collapse no
        # longer affects this plan, so it is not repeated as a warning about the plan.
        findings = [f for f in findings if f.code != "mapping-collapsed"]
    try:
        target = dtype_for_target(dtype) if dtype else None
        limit = parse_size(max_shard_size)
    except ValueError as exc:
        raise PlanRefusedError(str(exc)) from None
    # 2. Every tensor with its chunks located in the source files.
    sources = _source_tensors(scanned)
    # 3. Which output file each tensor goes to, and why.
    out_bytes = {s.name: _out_nbytes(s, target) for s in sources.values()}
    choice = _choose_assignment(scanned, list(sources), out_bytes, mapping, reference, limit)
    # 4. Headers and offsets of every output.
    outputs = _build_outputs(sources, choice.groups, target)
    notes = [*choice.notes, *_size_notes(outputs, limit, choice.rule)]
    return ConsolidationPlan(
        source=scanned.path,
        dest=dest_path,
        outputs=outputs,
        assignment=choice.rule,
        reason=choice.reason,
        dtype=target,
        metadata_files=_public_metadata_files(scanned),
        notes=tuple(notes),
        findings=tuple(findings),
    )


def consolidate(
    src: str | os.PathLike[str],
    dest: str | os.PathLike[str],
    *,
    mapping: str | os.PathLike[str] | Mapping[str, int] | None = None,
    reference: str | os.PathLike[str] | None = None,
    max_shard_size: int | str = SHARD_SPLIT_SIZE,
    dtype: str | None = None,
    resume: bool = False,
    progress: bool = True,
    verify: bool = True,
    verify_data: bool = False,
    workers: int = 1,
    fsync: bool = True,
) -> ConsolidationResult:
    """Scan `src`, plan and execute in one call (for notebooks and scripts)."""
    from inspector.scan import scan

    plan = plan_consolidation(
        scan(src),
        dest,
        mapping=mapping,
        reference=reference,
        max_shard_size=max_shard_size,
        dtype=dtype,
    )
    return plan.execute(
        resume=resume,
        progress=progress,
        verify=verify,
        verify_data=verify_data,
        workers=workers,
        fsync=fsync,
    )


# -- planning steps -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Source:
    name: str
    dtype: str
    shape: tuple[int, ...]
    chunks: tuple[DcpChunk, ...]
    locations: tuple[tuple[int, int], ...]  # (absolute offset, nbytes) of each chunk


@dataclass(frozen=True, slots=True)
class _Choice:
    rule: str
    reason: str
    groups: list[list[str]]  # tensor names of output 1, 2, ...
    notes: list[str] = field(default_factory=list)


def _check_dest(scanned: ScannedCheckpoint, dest: Path) -> Path:
    if scanned.dcp is None:
        raise PlanRefusedError(
            f"{scanned.path}: layout is {scanned.layout}, not DCP-sharded safetensors; "
            "only a folder of shard-*-model-*.safetensors files with DCP_SHARDING_INFO can be "
            "consolidated"
        )
    resolved = dest.expanduser().resolve()
    if resolved == scanned.path.resolve():
        raise PlanRefusedError(
            f"{dest}: DEST is the source folder; write to a new folder such as "
            f"{default_destination(scanned.path)}"
        )
    return resolved


def _refuse_on_errors(scanned: ScannedCheckpoint, *, explicit: bool) -> list[Finding]:
    """Raise on findings that would make the output wrong; return the others."""
    from inspector.layouts import layout_by_name

    found = list(dict.fromkeys([*scanned.problems, *layout_by_name(scanned.layout).check(scanned)]))
    blocking = [f for f in found if f.code in _BLOCKING]
    if not explicit:
        # Without --mapping/--reference a broken mapping file would silently change the layout.
        blocking += [f for f in found if f.code == "mapping-unreadable"]
    if blocking:
        lines = "\n".join(f"  [{f.code}] {f.message}" for f in blocking[:10])
        more = f"\n  ... and {len(blocking) - 10} more" if len(blocking) > 10 else ""
        raise PlanRefusedError(
            f"{scanned.path}: cannot consolidate, {len(blocking)} problem(s) would make the "
            f"output wrong or incomplete:\n{lines}{more}\nFix the source (re-save the missing "
            "or damaged rank files) or pass --mapping/--reference for a broken mapping file, "
            "then plan again."
        )
    return [f for f in found if f not in blocking]


def _source_tensors(scanned: ScannedCheckpoint) -> dict[str, _Source]:
    """Each tensor's chunks with their absolute byte ranges. Pure (headers only)."""
    where: dict[str, dict[str, tuple[int, int]]] = {}
    root = scanned.path.resolve()
    for shard in scanned.shards:
        if (root / shard.file).resolve().parent != root:
            raise PlanRefusedError(
                f"{shard.file}: is a link to a file outside {root}; consolidation reads only "
                "files inside the checkpoint folder, copy the file in instead of linking it"
            )
        start = shard.data_start
        where[shard.file] = {
            n: (start + b, e - b)
            for n, b, e in zip(shard.names, shard.begins, shard.ends, strict=True)
        }
    out: dict[str, _Source] = {}
    for name, chunks in scanned.dcp.chunks.items():
        locations = tuple(where[c.file][name] for c in chunks)
        source = _Source(
            name, chunks[0].dtype, scanned.dcp.full_shapes[name], tuple(chunks), locations
        )
        _check_sub_byte(source)
        out[name] = source
    if not out:
        raise PlanRefusedError(
            f"{scanned.path}: no tensor chunk could be read from {len(scanned.shards)} file(s); "
            "nothing to consolidate"
        )
    return out


def _check_sub_byte(source: _Source) -> None:
    """Packed dtypes (F4, F6) can only be copied as whole bytes, never split inside one."""
    bits = DTYPE_BITS[source.dtype]
    if bits % 8 == 0:
        return
    for chunk in source.chunks:
        start = _linear_offset(chunk.offsets, source.shape)
        whole = (start * bits) % 8 == 0 and (math.prod(chunk.shape) * bits) % 8 == 0
        if _contiguous(chunk.shape, source.shape) is False or not whole:
            raise PlanRefusedError(
                f"tensor {source.name!r} ({source.dtype}, {bits} bits) has a chunk in "
                f"{chunk.file} at offsets {list(chunk.offsets)} shape {list(chunk.shape)} that "
                "does not start and end on a whole byte of the output; packed tensors can only "
                "be consolidated when sharded along whole bytes, re-save them unsharded"
            )


def _out_nbytes(source: _Source, target: str | None) -> int:
    dtype = _out_dtype(source.dtype, target)
    return math.prod(source.shape) * DTYPE_BITS[dtype] // 8


def _out_dtype(dtype: str, target: str | None) -> str:
    return target if target and dtype in FLOAT_DTYPES else dtype


def _choose_assignment(
    scanned: ScannedCheckpoint,
    names: list[str],
    nbytes: dict[str, int],
    mapping: str | os.PathLike[str] | Mapping[str, int] | None,
    reference: str | os.PathLike[str] | None,
    limit: int,
) -> _Choice:
    """The first assignment rule that applies (see `plan_consolidation`)."""
    dcp = scanned.dcp
    if mapping is not None:
        table, label = _load_mapping(mapping)
        why = "given by the caller (mapping=...)"
        return _from_index(names, table, f"mapping {label}", why)
    # A recorded mapping that sends everything to one file is the automodel-2289 collapse: an
    # explicit reference is then the user's way out, so it wins.
    collapsed = bool(dcp.mapping) and len(set(dcp.mapping.values())) == 1
    if dcp.mapping and not (collapsed and reference is not None):
        why = "the training run recorded the reference model's file for every tensor"
        return _from_index(names, dcp.mapping, f"mapping {dcp.mapping_file}", why)
    if reference is not None:
        table, label = reference_assignment(reference)
        why = "no mapping file; output files follow the reference checkpoint's index"
        if collapsed:
            why = (
                f"{dcp.mapping_file} sends every tensor to one file (a collapsed mapping); "
                "output files follow the reference checkpoint's index instead"
            )
        return _from_index(names, table, f"reference {label}", why)
    if scanned.index is not None:
        table = _index_table(scanned.index.weight_map)
        why = "no mapping file; output files follow the reference index kept by the run"
        return _from_index(names, table, f"reference {scanned.index.file}", why)
    groups = _greedy(names, nbytes, limit)
    rule = f"greedy by size in key order, at most {limit:,} bytes per file"
    why = "no mapping, no reference: packed like huggingface_hub's splitter"
    return _Choice(rule, why, groups)


def _from_index(names: list[str], table: Mapping[str, int], rule: str, why: str) -> _Choice:
    """Groups from {fqn: index}: indices renumbered densely, tensors in the table's order,
    tensors the table omits appended to the last file (reported in the notes)."""
    present = set(names)
    order = sorted({i for n, i in table.items() if n in present})
    if not order:
        raise PlanRefusedError(
            f"{rule} names none of the {len(names)} tensors of the source; pass a mapping or "
            "reference that belongs to this model, or neither to pack by size"
        )
    slot = {idx: k for k, idx in enumerate(order)}
    groups: list[list[str]] = [[] for _ in order]
    for name, idx in table.items():
        if name in present:
            groups[slot[idx]].append(name)
    notes: list[str] = []
    unmapped = [n for n in names if n not in table]
    if unmapped:
        groups[-1].extend(unmapped)
        notes.append(
            f"{len(unmapped)} tensor(s) absent from the {rule} were added to the last output "
            f"file: {examples(unmapped)}"
        )
    dangling = [n for n in table if n not in present]
    if dangling:
        notes.append(
            f"{len(dangling)} name(s) in the {rule} are not in the source and are skipped "
            f"(tied or removed weights?): {examples(dangling)}"
        )
    if len(order) != max(order) or order[0] != 1:
        notes.append(f"output indices {order[0]}..{max(order)} have gaps; files are renumbered")
    return _Choice(rule, why, groups, notes)


def _load_mapping(
    mapping: str | os.PathLike[str] | Mapping[str, int],
) -> tuple[dict[str, int], str]:
    if isinstance(mapping, Mapping):
        table, label = dict(mapping), "(in memory)"
    else:
        value, problem = read_json(Path(mapping))
        if problem is not None:
            raise PlanRefusedError(
                f"mapping {mapping} {problem}; pass a JSON object {{fqn: index}}"
            )
        table, label = value, str(mapping)
    if not isinstance(table, dict) or not all(
        isinstance(k, str) and type(v) is int and v >= 1 for k, v in table.items()
    ):
        raise PlanRefusedError(
            f"mapping {label} must be a JSON object {{tensor name: 1-based output file index}}"
        )
    return table, label


def reference_assignment(reference: str | os.PathLike[str]) -> tuple[dict[str, int], str]:
    """{fqn: 1-based output index} from an HF checkpoint folder or its index file.

    The index of a file comes from `-(\\d+)-of-(\\d+).safetensors` at the end of its name, so
    `model-00002-of-00008.safetensors` and `model.safetensors-00002-of-00008.safetensors` are
    both file 2; names without it fall back to their sorted order.
    """
    path = Path(reference).expanduser()
    index_path = path / INDEX_NAME if path.is_dir() else path
    if index_path.is_file() and index_path.name.endswith(".json"):
        value, problem = read_json(index_path)
        weight_map = value.get("weight_map") if isinstance(value, dict) else None
        if problem is not None or not isinstance(weight_map, dict):
            why = problem or 'is not of the form {"weight_map": {tensor: file}}'
            raise PlanRefusedError(f"reference {index_path} {why}; pass another --reference")
        return _index_table(weight_map), str(index_path)
    if path.is_dir():
        weight_map = {}
        for file in list_safetensors(path):
            for name in read_shard(file, root=path).names:
                weight_map.setdefault(name, file.name)
        if weight_map:
            return _index_table(weight_map), f"{path} (shard headers)"
    raise PlanRefusedError(
        f"reference {path} is neither an HF checkpoint folder nor an index file; pass the folder "
        f"holding {INDEX_NAME} or .safetensors files"
    )


def _index_table(weight_map: Mapping[str, Any]) -> dict[str, int]:
    """File names to 1-based indices: parsed from `-NNNNN-of-NNNNN.safetensors`, or the sorted
    file order when any name lacks it or two files claim one index."""
    files = sorted({str(f) for f in weight_map.values()})
    parsed = {f: _INDEXED_NAME.search(f) for f in files}
    numbers = {f: int(m.group(1)) for f, m in parsed.items() if m}
    if len(numbers) == len(files) and len(set(numbers.values())) == len(files):
        index_of = numbers
    else:
        index_of = {f: k + 1 for k, f in enumerate(files)}
    return {str(name): index_of[str(f)] for name, f in weight_map.items()}


def _greedy(names: list[str], nbytes: dict[str, int], limit: int) -> list[list[str]]:
    """huggingface_hub's rule: fill in key order; a tensor over the limit gets its own file."""
    groups: list[list[str]] = []
    current: list[str] = []
    size = 0
    for name in names:
        n = nbytes[name]
        if n > limit:
            groups.append([name])
            continue
        if current and size + n > limit:
            groups.append(current)
            current, size = [], 0
        current.append(name)
        size += n
    if current or not groups:
        groups.append(current)
    return groups


def _build_outputs(
    sources: dict[str, _Source], groups: list[list[str]], target: str | None
) -> tuple[OutputFile, ...]:
    count = len(groups)
    outputs = []
    for k, group in enumerate(groups, start=1):
        tensors = []
        offset = 0
        for name in group:
            tensor = _plan_tensor(sources[name], target, offset)
            tensors.append(tensor)
            offset = tensor.end
        name = _OUTPUT_NAME.format(i=k, n=count)
        outputs.append(OutputFile(k, name, _header_bytes(tensors), tuple(tensors)))
    return tuple(outputs)


def _plan_tensor(source: _Source, target: str | None, begin: int) -> PlannedTensor:
    bits = DTYPE_BITS[source.dtype]
    pieces = []
    for chunk, (src_offset, nbytes) in zip(source.chunks, source.locations, strict=True):
        if not math.prod(chunk.shape):
            continue  # an empty chunk (more ranks than rows) has nothing to copy
        dst = None
        if _contiguous(chunk.shape, source.shape):
            dst = _linear_offset(chunk.offsets, source.shape) * bits // 8
        pieces.append(Piece(chunk.file, src_offset, nbytes, chunk.offsets, chunk.shape, dst))
    out_dtype = _out_dtype(source.dtype, target)
    end = begin + math.prod(source.shape) * DTYPE_BITS[out_dtype] // 8
    return PlannedTensor(
        source.name, source.dtype, out_dtype, source.shape, begin, end, tuple(pieces)
    )


# Cached: the chunks of same-shaped tensors (every expert, every layer) repeat the same
# (shape, offsets, full shape) triples, and planning 300,000 tensors calls these millions of times.
@lru_cache(maxsize=1 << 16)
def _contiguous(chunk: tuple[int, ...], full: tuple[int, ...]) -> bool:
    """A chunk is one byte range of the full tensor when, after its leading size-1 dims, only
    its first remaining dim may be partial (row-sharded), every later one complete."""
    for d, n in enumerate(chunk):
        if n != 1:
            return chunk[d + 1 :] == full[d + 1 :]
    return True


@lru_cache(maxsize=1 << 16)
def _linear_offset(offsets: tuple[int, ...], full: tuple[int, ...]) -> int:
    linear = 0
    for o, n in zip(offsets, full, strict=True):
        linear = linear * n + o
    return linear


def _header_bytes(tensors: Iterable[PlannedTensor]) -> bytes:
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    for t in tensors:
        header[t.name] = {
            "dtype": t.out_dtype,
            "shape": list(t.shape),
            "data_offsets": [t.begin, t.end],
        }
    raw = orjson.dumps(header)
    # Pad with spaces to 8 bytes so the data section is aligned, as the safetensors writer does.
    raw += b" " * (-len(raw) % 8)
    return len(raw).to_bytes(8, "little") + raw


def _size_notes(outputs: tuple[OutputFile, ...], limit: int, rule: str) -> list[str]:
    if rule.startswith("greedy"):
        return []
    big = [o.name for o in outputs if o.data_bytes > limit and len(o.tensors) > 1]
    if not big:
        return []
    return [f"{len(big)} output file(s) exceed {limit:,} bytes as the {rule} asks: {examples(big)}"]


def _public_metadata_files(scanned: ScannedCheckpoint) -> tuple[str, ...]:
    """Files of `.hf_metadata/` a loader needs (config, tokenizer...), not the run's mappings
    nor a kept reference index, which would clash with the one we write."""
    meta_dir = scanned.dcp.hf_metadata_dir
    if meta_dir is None:
        return ()
    folder = scanned.path / meta_dir
    try:
        entries = sorted(os.scandir(folder), key=lambda e: e.name)
    except OSError:
        return ()
    keep = []
    for entry in entries:
        skip = entry.name.startswith("fqn_to_") or entry.name == INDEX_NAME
        skip = skip or entry.name.endswith(".safetensors") or entry.is_symlink()
        if not skip and entry.is_file() and entry.stat().st_size <= _METADATA_CAP:
            keep.append(f"{meta_dir}/{entry.name}")
    return tuple(keep)


# -- execution ----------------------------------------------------------------------------


class _Progress:
    """A byte counter with an optional tqdm bar (tqdm.auto also renders in notebooks)."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.lock = threading.Lock()
        self.done = 0
        self.bar = None
        if enabled:
            from tqdm.auto import tqdm

            self.bar = tqdm(
                total=total, unit="B", unit_scale=True, unit_divisor=1024, desc="consolidate"
            )

    def add(self, n: int) -> None:
        with self.lock:
            self.done += n
            if self.bar is not None:
                self.bar.update(n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _execute(
    plan: ConsolidationPlan,
    *,
    resume: bool,
    progress: bool,
    verify: bool,
    verify_data: bool,
    workers: int,
    rank: int | None,
    world_size: int | None,
    fsync: bool,
) -> ConsolidationResult:
    started = time.perf_counter()
    # 1. Which outputs are ours (output i goes to rank i % world_size, as torch does).
    dist = _Distributed.start(rank, world_size)
    plan.dest.mkdir(parents=True, exist_ok=True)
    mine = [o for o in plan.outputs if o.index % dist.world_size == dist.rank]
    skipped = [o for o in mine if resume and _is_complete(plan.dest / o.name, o)]
    todo = [o for o in mine if o not in skipped]
    if dist.rank == 0:
        # A stale index would make a half-rewritten folder look complete; the new one comes last.
        (plan.dest / INDEX_NAME).unlink(missing_ok=True)
    # 2. Write them, each as `<name>.partial` renamed when complete.
    bar = _Progress(sum(o.size for o in todo), progress)
    try:
        sealer = _Sealer(plan.dest, fsync=fsync)
        try:
            with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
                list(pool.map(lambda o: _write_output(plan, o, bar, sealer), todo))
        finally:
            sealer.wait()
    finally:
        bar.close()
    # 3. Everyone done: rank 0 copies the metadata files and writes the index last.
    dist.barrier()
    index_file, copied, findings, checked, mismatches = None, (), (), 0, ()
    if dist.rank == 0:
        copied = _copy_metadata(plan)
        index_file = _write_index(plan)
    # Nobody returns before the index exists; rank 0 then verifies alone (it may take long).
    dist.finish()
    if dist.rank == 0 and (verify or verify_data):
        findings, checked, mismatches = _verify(plan, checks=verify, data=verify_data)
    return ConsolidationResult(
        dest=plan.dest,
        written=tuple(o.name for o in todo),
        skipped=tuple(o.name for o in skipped),
        bytes_written=bar.done,
        seconds=time.perf_counter() - started,
        index_file=index_file,
        metadata_files=copied,
        rank=dist.rank,
        world_size=dist.world_size,
        verified=dist.rank == 0 and verify,
        findings=tuple(findings),
        data_checked=checked,
        data_mismatches=tuple(mismatches),
    )


def _is_complete(path: Path, output: OutputFile) -> bool:
    """A finished output: final name, expected size, and exactly the planned header."""
    try:
        if path.stat().st_size != output.size:
            return False
        with path.open("rb") as fh:
            return fh.read(len(output.header)) == output.header
    except OSError:
        return False


class _Sealer:
    """fsync + rename of finished outputs on a thread of its own, so the disk writes one file
    back while the next is being copied. At most `depth` files wait (bounded open files)."""

    def __init__(self, dest: Path, *, fsync: bool = True, depth: int = 4) -> None:
        self.dest = dest
        self.fsync = fsync
        self.pool = ThreadPoolExecutor(max_workers=1)
        self.slots = threading.BoundedSemaphore(depth)
        self.pending: list[Any] = []

    def submit(self, fd: int, partial: Path, final: Path) -> None:
        self.slots.acquire()
        self.pending.append(self.pool.submit(self._seal, fd, partial, final))

    def _seal(self, fd: int, partial: Path, final: Path) -> None:
        try:
            try:
                if self.fsync:
                    os.fsync(fd)
            finally:
                os.close(fd)
            # Only a complete (and, by default, durable) file ever gets its final name.
            os.replace(partial, final)
            if self.fsync:
                fsync_dir(self.dest)
        finally:
            self.slots.release()

    def wait(self) -> None:
        self.pool.shutdown(wait=True)
        for future in self.pending:
            future.result()


def _write_output(
    plan: ConsolidationPlan, output: OutputFile, bar: _Progress, sealer: _Sealer
) -> None:
    """Header first, data at final offsets into `<name>.partial`; the sealer then fsyncs and
    renames it, so a crash never leaves a partly written file under the final name."""
    final = plan.dest / output.name
    partial = final.with_name(final.name + ".partial")
    sources = _SourceFiles(plan.source)
    fd = os.open(partial, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        _pwrite_all(fd, output.header, 0)
        bar.add(len(output.header))
        # Size the file up front so every tensor lands at its final offset in any order.
        os.ftruncate(fd, output.size)
        base = len(output.header)
        for tensor in output.tensors:
            if tensor.contiguous:
                _copy_pieces(sources, fd, base + tensor.begin, tensor, bar)
            else:
                _assemble(sources, fd, base + tensor.begin, tensor, bar)
    except BaseException:
        os.close(fd)
        raise
    finally:
        sources.close()
    sealer.submit(fd, partial, final)


class _SourceFiles:
    """Read-only descriptors of source files, opened on first use; paths stay in the folder."""

    def __init__(self, root: Path) -> None:
        self.root = root.resolve()
        self.fds: dict[str, int] = {}
        self.maps: dict[str, np.ndarray | None] = {}

    def fd(self, file: str) -> int:
        if file not in self.fds:
            path = (self.root / file).resolve()
            if path.parent != self.root:
                raise InspectorError(f"{file}: source path leaves {self.root}; refusing to read it")
            self.fds[file] = os.open(path, os.O_RDONLY)
        return self.fds[file]

    def bytes_of(self, file: str) -> np.ndarray | None:
        """The whole file as a read-only byte array over a shared map (pre-faulted), or None
        where it cannot be mapped. Column chunks are then copied straight from the page cache
        into the output block: one copy fewer than reading them into a scratch buffer."""
        if file not in self.maps:
            try:
                flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
                mm = mmap.mmap(self.fd(file), 0, flags=flags, prot=mmap.PROT_READ)
                self.maps[file] = np.frombuffer(mm, dtype=np.uint8)
            except (OSError, ValueError):
                self.maps[file] = None
        return self.maps[file]

    def close(self) -> None:
        self.maps.clear()  # the arrays own their maps; dropping them unmaps
        for fd in self.fds.values():
            os.close(fd)
        self.fds.clear()


def _copy_pieces(
    sources: _SourceFiles, fd: int, start: int, tensor: PlannedTensor, bar: _Progress
) -> None:
    for piece in tensor.pieces:
        _copy_range(
            sources.fd(piece.file), piece.src_offset, fd, start + piece.dst_offset, piece.nbytes
        )
        bar.add(piece.nbytes)


_KERNEL_COPY = {"ok": hasattr(os, "copy_file_range")}


def _copy_range(src: int, src_off: int, dst: int, dst_off: int, count: int) -> None:
    """Copy bytes file to file in the kernel; pread/pwrite in large blocks where unsupported."""
    while count > 0 and _KERNEL_COPY["ok"]:
        try:
            n = os.copy_file_range(src, dst, min(count, 1 << 30), src_off, dst_off)
        except OSError as exc:
            if exc.errno not in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
                raise
            _KERNEL_COPY["ok"] = False  # e.g. across file systems: fall back for good
            break
        if n == 0:
            raise InspectorError(f"source file ended {count:,} bytes early at offset {src_off:,}")
        src_off, dst_off, count = src_off + n, dst_off + n, count - n
    while count > 0:
        block = _pread_exact(src, min(count, _COPY_BLOCK), src_off)
        _pwrite_all(dst, block, dst_off)
        src_off, dst_off, count = src_off + len(block), dst_off + len(block), count - len(block)


def _assemble(
    sources: _SourceFiles, fd: int, start: int, tensor: PlannedTensor, bar: _Progress
) -> None:
    """Place non-contiguous chunks (and casts) block by block of leading-dim rows: per chunk
    and block, one read of its rows and one strided numpy assignment."""
    shape = tensor.shape or (1,)  # a 0-d tensor is one row of one element
    item = DTYPE_BITS[tensor.dtype] // 8
    out_item = DTYPE_BITS[tensor.out_dtype] // 8
    row_bytes = math.prod(shape[1:]) * item
    rows_per_block = max(1, BLOCK_BYTES // max(1, row_bytes))
    block = _buffer("block", min(rows_per_block, shape[0]) * row_bytes)
    for r0 in range(0, shape[0], rows_per_block):
        r1 = min(shape[0], r0 + rows_per_block)
        view = _byte_view(block[: (r1 - r0) * row_bytes], r1 - r0, shape, item)
        for piece in tensor.pieces:
            _place_rows(sources, piece, view, (r0, r1), item)
        data = block[: (r1 - r0) * row_bytes]
        if tensor.out_dtype != tensor.dtype:
            data = cast_bytes(data, tensor.dtype, tensor.out_dtype)
        _pwrite_all(fd, data, start + r0 * (row_bytes // item) * out_item)
        bar.add(len(data))


_THREAD_BUFFERS = threading.local()


def _buffer(kind: str, nbytes: int) -> np.ndarray:
    """A reusable byte buffer of this thread ("block" for assembled rows, "scratch" for chunk
    reads when a source cannot be mapped). Reuse saves the page faults of fresh allocations,
    which cost more than the copy itself; the scratch one is only made when needed."""
    held = getattr(_THREAD_BUFFERS, kind, None)
    if held is None or held.size < nbytes:
        held = np.empty(nbytes, dtype=np.uint8)
        setattr(_THREAD_BUFFERS, kind, held)
    return held[:nbytes]


def _byte_view(buf: np.ndarray, rows: int, shape: tuple[int, ...], item: int) -> np.ndarray:
    """`rows` rows of `shape` as uint8 with the last dim widened to bytes: (r, ..., last*item).
    Contiguous byte runs in the innermost dim let numpy copy whole runs, not single bytes."""
    if len(shape) <= 1:
        return buf.reshape(rows, item)
    return buf.reshape(rows, *shape[1:-1], shape[-1] * item)


def _place_rows(
    sources: _SourceFiles,
    piece: Piece,
    view: np.ndarray,
    rows: tuple[int, int],
    item: int,
) -> None:
    r0, r1 = rows
    offsets, shape = (piece.offsets, piece.shape) if piece.shape else ((0,), (1,))
    lo, hi = max(r0, offsets[0]), min(r1, offsets[0] + shape[0])
    if lo >= hi:
        return
    # The chunk is row-major in its own shape, so its rows lo..hi are one byte range.
    row_bytes = math.prod(shape[1:]) * item
    start, size = piece.src_offset + (lo - offsets[0]) * row_bytes, (hi - lo) * row_bytes
    mapped = sources.bytes_of(piece.file)
    if mapped is not None and start + size <= mapped.size:
        raw = mapped[start : start + size]
    else:
        raw = _buffer("scratch", size)
        _pread_into(sources.fd(piece.file), raw, start)
    src = _byte_view(raw, hi - lo, shape, item)
    where = [slice(lo - r0, hi - r0)]
    if len(shape) > 1:
        where += [slice(o, o + n) for o, n in zip(offsets[1:-1], shape[1:-1], strict=True)]
        where.append(slice(offsets[-1] * item, (offsets[-1] + shape[-1]) * item))
    view[tuple(where)] = src


def _pread_into(fd: int, buf: np.ndarray, offset: int) -> None:
    view = memoryview(buf).cast("B")
    while view:
        n = os.preadv(fd, [view], offset)
        if n == 0:
            raise InspectorError(
                f"source file ended {len(view):,} bytes early at offset {offset:,}"
            )
        view, offset = view[n:], offset + n


def _pread_exact(fd: int, count: int, offset: int) -> bytes:
    data = os.pread(fd, count, offset)
    if len(data) == count:
        return data
    parts = [data]
    got = len(data)
    while got < count:
        more = os.pread(fd, count - got, offset + got)
        if not more:
            raise InspectorError(
                f"source file ended {count - got:,} bytes early at offset {offset + got:,}"
            )
        parts.append(more)
        got += len(more)
    return b"".join(parts)


def _pwrite_all(fd: int, data: bytes | np.ndarray, offset: int) -> None:
    view = memoryview(data).cast("B")
    while view:
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n


def _copy_metadata(plan: ConsolidationPlan) -> tuple[str, ...]:
    copied = []
    for rel in plan.metadata_files:
        name = Path(rel).name
        tmp = plan.dest / (name + ".partial")
        shutil.copyfile(plan.source / rel, tmp, follow_symlinks=False)
        with tmp.open("rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, plan.dest / name)
        copied.append(name)
    return tuple(copied)


def _write_index(plan: ConsolidationPlan) -> str:
    doc = {
        "metadata": {"total_size": plan.total_size, "total_parameters": plan.total_parameters},
        "weight_map": dict(sorted(plan.weight_map.items())),
    }
    write_atomic(plan.dest / INDEX_NAME, orjson.dumps(doc, option=orjson.OPT_INDENT_2) + b"\n")
    return INDEX_NAME


def _verify(
    plan: ConsolidationPlan, *, checks: bool, data: bool
) -> tuple[list[Finding], int, list[str]]:
    """Re-scan DEST and run every check; with `data`, compare content hashes per tensor."""
    from inspector.checks import check
    from inspector.scan import scan
    from inspector.tensordata import TensorData, hash_bytes

    written = scan(plan.dest)
    findings = check(written) if checks else []
    if not data:
        return findings, 0, []
    source = scan(plan.source)
    mismatches: list[str] = []
    checked = 0
    with TensorData(source) as src, TensorData(written) as out:
        for output in plan.outputs:
            for t in output.tensors:
                raw = src.tensor_bytes(t.name)
                if raw is None and t.contiguous:
                    raw = _contiguous_source_bytes(plan.source, t)  # packed F4/F6 tensors
                if raw is not None and t.out_dtype != t.dtype:
                    raw = cast_bytes(np.frombuffer(raw, dtype=np.uint8), t.dtype, t.out_dtype)
                expected = None if raw is None else hash_bytes(raw)
                checked += 1
                if expected is None or expected != out.tensor_hash(t.name):
                    mismatches.append(t.name)
    return findings, checked, mismatches


def _contiguous_source_bytes(root: Path, tensor: PlannedTensor) -> bytes:
    """The tensor's bytes read piece by piece (verification of byte-copied tensors that the
    element-wise assembler cannot place, such as packed sub-byte dtypes)."""
    out = bytearray(tensor.end - tensor.begin)
    sources = _SourceFiles(root)
    try:
        for piece in tensor.pieces:
            data = _pread_exact(sources.fd(piece.file), piece.nbytes, piece.src_offset)
            out[piece.dst_offset : piece.dst_offset + piece.nbytes] = data
    finally:
        sources.close()
    return bytes(out)


class _Distributed:
    """Rank and world size from the arguments or torchrun's environment; a gloo group on CPU
    when several processes share the work (created only if none exists)."""

    def __init__(self, rank: int, world_size: int, owns_group: bool) -> None:
        self.rank, self.world_size, self.owns_group = rank, world_size, owns_group

    @classmethod
    def start(cls, rank: int | None, world_size: int | None) -> _Distributed:
        env_world = int(os.environ.get("WORLD_SIZE", "1"))
        world = world_size if world_size is not None else env_world
        me = rank if rank is not None else int(os.environ.get("RANK", "0"))
        if world <= 1:
            return cls(0, 1, False)
        if not 0 <= me < world:
            raise InspectorError(f"rank {me} is outside world size {world}")
        import torch.distributed as dist

        owns = not dist.is_initialized()
        if owns:
            dist.init_process_group("gloo", rank=me, world_size=world)
        return cls(dist.get_rank(), dist.get_world_size(), owns)

    def barrier(self) -> None:
        if self.world_size > 1:
            import torch.distributed as dist

            dist.barrier()

    def finish(self) -> None:
        if self.world_size > 1:
            import torch.distributed as dist

            dist.barrier()
            if self.owns_group:
                dist.destroy_process_group()


# -- text ---------------------------------------------------------------------------------


def _describe_plan(plan: ConsolidationPlan) -> str:
    tensors = sum(len(o.tensors) for o in plan.outputs)
    column = sum(1 for o in plan.outputs for t in o.tensors if not t.contiguous)
    lines = [
        f"Consolidation plan: {plan.source} -> {plan.dest}",
        f"  {tensors:,} tensors, {plan.total_parameters:,} parameters, "
        f"{format_bytes(plan.total_size)} in {len(plan.outputs)} file(s)",
        f"  assignment: {plan.assignment}",
        f"    why: {plan.reason}",
        f"  copy: {tensors - column:,} tensor(s) as byte ranges, {column:,} assembled "
        "(column-sharded or cast)",
    ]
    if plan.dtype:
        cast = sum(1 for o in plan.outputs for t in o.tensors if t.dtype != t.out_dtype)
        lines.append(f"  cast: {cast:,} floating tensor(s) to {plan.dtype}; others unchanged")
    # A 250-file plan shows its first and last files; the count says how many were left out.
    many = len(plan.outputs) > 20
    for k, output in enumerate(plan.outputs):
        if many and k == 10:
            lines.append(f"    ... {len(plan.outputs) - 15} more files")
        if not many or k < 10 or k >= len(plan.outputs) - 5:
            lines.append(
                f"    {output.name}: {len(output.tensors):,} tensors, {format_bytes(output.size)}"
            )
    lines.append(f"    {INDEX_NAME} (written last)")
    if plan.metadata_files:
        lines.append(
            f"  copied from the source: {', '.join(Path(f).name for f in plan.metadata_files)}"
        )
    lines += [f"  note: {n}" for n in plan.notes]
    lines += [f"  source {f.severity} [{f.code}]: {f.message}" for f in plan.findings[:10]]
    return "\n".join(lines)


def _describe_result(result: ConsolidationResult) -> str:
    rate = result.bytes_written / result.seconds / 1e6 if result.seconds > 0 else 0.0
    who = f" (rank {result.rank} of {result.world_size})" if result.world_size > 1 else ""
    lines = [
        f"Consolidated into {result.dest}{who}: wrote {len(result.written)} file(s), "
        f"{format_bytes(result.bytes_written)} in {result.seconds:.2f} s ({rate:,.1f} MB/s)",
    ]
    if result.skipped:
        kept = examples(list(result.skipped))
        lines.append(f"  resumed: {len(result.skipped)} complete file(s) kept: {kept}")
    if result.index_file:
        lines.append(f"  index: {result.index_file}")
    if result.metadata_files:
        lines.append(f"  copied: {', '.join(result.metadata_files)}")
    if result.verified:
        state = "no finding" if not result.findings else f"{len(result.findings)} finding(s)"
        lines.append(f"  verify: re-scanned and checked the output: {state}")
        lines += [f"    [{f.code}] {f.message}" for f in result.findings[:20]]
    if result.data_checked:
        bad = result.data_mismatches
        state = "all match" if not bad else f"{len(bad)} differ: {examples(list(bad))}"
        lines.append(f"  verify data: {result.data_checked:,} tensor hashes vs the source: {state}")
    return "\n".join(lines)
