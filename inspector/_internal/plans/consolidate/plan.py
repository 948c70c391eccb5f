"""Consolidation planning: which output file each tensor goes to, where each source chunk
lands, the output headers. Pure: scanned headers in, a frozen plan out.

The assignment is an explicit mapping, the run's recorded mapping, a reference checkpoint's
index, or greedy packing by size (huggingface_hub's splitter rule). A checkpoint that is not
DCP-sharded is seen as one chunk per tensor (`as_single_chunks`, also for re-sharding and
restoring); a PyTorch `.bin` checkpoint so (`bin_source`) is converted to safetensors, its
strided views and shared storages made contiguous and unshared (safetensors' `save_model`
rule: docs/formats.md, "PyTorch .bin").
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Any, Unpack

import orjson

from inspector._internal.checkpoint.loaded import stale_copies
from inspector._internal.checkpoint.naming_rules import BIN_SHARD_NUMBER, HF_SHARD_NUMBER
from inspector._internal.checkpoint.parameters import PARAMETER_RULE, parameters_of
from inspector._internal.checkpoint.scanned import (
    DcpChunk,
    DcpInfo,
    LayoutName,
    PytorchBinInfo,
    ScannedCheckpoint,
)
from inspector._internal.checks.dcp import check_dcp, uncovered_tensors
from inspector._internal.checks.index import check_index_of
from inspector._internal.common.display import MESSAGE_LIMIT, legible
from inspector._internal.common.dtypes import DTYPE_BITS, FLOAT_DTYPES
from inspector._internal.common.filenames import (
    INDEX_NAME,
    INDEX_SUFFIX,
    JOURNAL,
    LOCK,
    MANIFEST_NAME,
    SAFETENSORS_WEIGHTS_NAME,
    STAGING,
)
from inspector._internal.common.text import examples, plural
from inspector._internal.common.units import SHARD_SPLIT_SIZE, format_bytes, parse_size
from inspector._internal.diagnosis.references import (
    Reference,
    collapsed_mapping,
    consolidation_reference,
    layout_reference,
)
from inspector._internal.findings.codes import Code, code_set
from inspector._internal.findings.finding import Finding
from inspector._internal.findings.words import refusal_digest
from inspector._internal.formats.bin_shard import strides_of
from inspector._internal.formats.casting import dtype_for_target
from inspector._internal.integrity.refresh import refresh_manifest, source_manifest
from inspector._internal.layouts._common import list_safetensors, read_json, read_shards
from inspector._internal.plans.consolidate.engine import execute_plan, not_a_folder
from inspector._internal.plans.consolidate.records import (
    ConsolidationOptions,
    ConsolidationResult,
    Execution,
    OutputFile,
    Piece,
    PlannedTensor,
    index_bytes,
    not_copied,
)
from inspector._internal.storage import (
    EntryKind,
    LocalStorage,
    RemoteURL,
    Storage,
    is_remote,
    open_location,
)
from inspector.errors import CannotInspectError, PlanRefusedError, UnsafeInputError

__all__ = [
    "BLOCKING",
    "BinSource",
    "Choice",
    "ConsolidationPlan",
    "ConsolidationResult",
    "OutputFile",
    "Piece",
    "PlannedTensor",
    "as_single_chunks",
    "bin_source",
    "choose_assignment",
    "default_destination",
    "index_bytes",
    "plan_consolidation",
    "reference_assignment",
]

# Findings that make the assembled tensors wrong: consolidation refuses to run on them.
BLOCKING = code_set(
    Code.HEADER_UNREADABLE,
    Code.FILE_UNSAFE,
    Code.HEADER_INVALID_ENTRY,
    Code.UNKNOWN_DTYPE,
    Code.SIZE_MISMATCH,
    Code.OFFSET_INVALID,
    Code.FILE_TRUNCATED,
    Code.DCP_SHARDING_INFO_MISSING,
    Code.DCP_COVERAGE_GAP,
    Code.DCP_CHUNK_OVERLAP,
    Code.DCP_DTYPE_CONFLICT,
    Code.CHECK_BUDGET_EXCEEDED,
    # A `.bin` source (`bin_source` refuses these first, with its own words).
    Code.BIN_UNREADABLE,
    Code.BIN_LEGACY_FORMAT,
    Code.BIN_RECORD_MISSING,
    Code.PICKLE_HOSTILE,
    Code.PICKLE_BOMB,
)


OUTPUT_NAME = "model-{i:05d}-of-{n:05d}.safetensors"
# A `.bin` checkpoint converted into one file is named as `save_pretrained` names it, with no
# index beside it.
SINGLE_NAME = SAFETENSORS_WEIGHTS_NAME


@dataclass(frozen=True)
class ConsolidationPlan:
    """What `execute` will write, decided from headers only. Print it to review it."""

    source: Path | RemoteURL
    dest: Path
    outputs: tuple[OutputFile, ...]
    assignment: str  # which rule chose the output files
    reason: str  # why that rule applied
    dtype: str | None  # the cast target (safetensors dtype), if any
    metadata_files: tuple[str, ...]  # public `.hf_metadata/` files copied to DEST
    notes: tuple[str, ...] = ()
    findings: tuple[Finding, ...] = ()  # non-blocking findings of the source
    # allow_partial: tensors written at full shape with zeros where no chunk was found.
    partial: tuple[str, ...] = ()
    # The storage the source was scanned through: every source read goes through it (local
    # or remote), so consolidation reads what the scan read, under the same rules.
    storage: Storage | None = None
    # The source's config.json (how packed weights count as parameters).
    config: Mapping[str, Any] | None = field(default=None, compare=False, repr=False)
    # The file layout a known reference gives the output
    # (`inspector._internal.diagnosis.references`): the verification flags an output collapsed into
    # one file against it.
    layout: Reference | None = None
    # The index written last, or None: a `.bin` checkpoint converted into one file
    # (`model.safetensors`) has none, as `save_pretrained` writes none.
    index_file: str | None = INDEX_NAME
    # Tied names of a `.bin` source left out of the output -> the name written in their place
    # (recorded in that output's `__metadata__`).
    aliases: Mapping[str, str] = field(default_factory=dict)

    @property
    def source_storage(self) -> Storage:
        if self.storage is not None:
            return self.storage
        if not isinstance(self.source, Path):
            raise TypeError(f"{self.source}: a remote source needs its storage")
        return LocalStorage(self.source)

    @property
    def total_size(self) -> int:
        return sum(o.data_bytes for o in self.outputs)

    @cached_property
    def total_parameters(self) -> int:
        """The parameters of the output, counted as everywhere
        (`inspector._internal.checkpoint.parameters`)."""
        tensors = [t for o in self.outputs for t in o.tensors]
        return parameters_of(
            [t.name for t in tensors],
            [t.out_dtype for t in tensors],
            [t.shape for t in tensors],
            config=self.config,
        )

    @property
    def weight_map(self) -> dict[str, str]:
        return {t.name: o.name for o in self.outputs for t in o.tensors}

    def describe(self) -> str:
        """A readable summary: every output file, its tensors and bytes, and the reasons."""
        return describe_plan(self)

    def __str__(self) -> str:
        return self.describe()

    def execute(self, **options: Unpack[ConsolidationOptions]) -> ConsolidationResult:
        """Write the outputs, then the index (rank 0), then verify DEST (the options:
        `Execution`).

        DEST must be empty or hold only this plan's own output (finished outputs, `.partial`
        files, the index and copied files with the planned content); anything else is
        refused (`PlanRefusedError`) unless `overwrite`. A DEST that is a link is refused
        (`UnsafeInputError`). Under torchrun, or with `rank`/`world_size`, output i is
        written by rank i % world_size.
        """
        result = execute_plan(self, Execution.of(options))
        # The source's manifest, carried to DEST: its tensor hashes still say what the values
        # are (`verify DEST --level tensor` proves the copy), the files are DEST's own: every
        # one of them was written by this plan (by any rank, or by an earlier run that
        # `resume` kept), so each is hashed as it is now. Without a source manifest, one
        # kept in DEST is brought up to date the same way.
        if self.dest.name != STAGING and result.rank == 0:
            written = (*(o.name for o in self.outputs), INDEX_NAME, *result.metadata_files)
            kept = source_manifest(self.source_storage)
            refresh_manifest(self.dest, written=written, previous=kept)
        return result


def default_destination(source: str | os.PathLike[str] | RemoteURL) -> Path:
    """Where a consolidation of `source` goes unless told otherwise: a sibling folder
    `<source>-consolidated`. Not inside the source: the output would sit in (and be copied,
    backed up and scanned with) the very checkpoint it replaces. A remote source's goes
    into the current folder, named after it (a consolidation writes locally only)."""
    if isinstance(source, RemoteURL) or (isinstance(source, str) and is_remote(source)):
        return Path.cwd() / f"{str(source).rstrip('/').rsplit('/', 1)[-1]}-consolidated"
    path = Path(source).expanduser().resolve()
    return path.with_name(f"{path.name}-consolidated")


def plan_consolidation(
    scanned: ScannedCheckpoint,
    dest: str | os.PathLike[str],
    *,
    mapping: str | os.PathLike[str] | Mapping[str, int] | None = None,
    reference: str | os.PathLike[str] | None = None,
    max_shard_size: int | str | None = None,
    dtype: str | None = None,
    allow_partial: bool = False,
) -> ConsolidationPlan:
    """Plan the consolidation of a scanned DCP-sharded checkpoint into `dest`, or the
    conversion of a PyTorch `.bin` checkpoint into safetensors.

    Output files are assigned by the first rule that applies: `mapping` (JSON {fqn: 1-based
    index}), `.hf_metadata/fqn_to_file_index_mapping.json`, `reference` (an HF folder or index),
    a reference index kept in `.hf_metadata/`, a `.bin` source's own files (one output per
    file, unless `max_shard_size` is given), else greedy by size in key order (at most
    `max_shard_size`, default 5 GB). Raises `PlanRefusedError` when the source has gaps,
    overlaps or conflicting chunks. A coverage
    gap (a lost rank: full shapes come from every source,
    `inspector._internal.layouts.expected_shapes`) is refused too, unless `allow_partial`: then
    those tensors are written at their full shape with zeros where no chunk was found, and the plan
    and the result say which. A `.bin` source is refused when a file cannot be read, a tensor
    has a dtype safetensors cannot hold, or its index names tensors no file holds.
    """
    # 1. Is there something sound to consolidate?
    converted: BinSource | None = None
    if scanned.layout is LayoutName.PYTORCH_BIN:
        converted = bin_source(scanned)
        scanned = converted.view
    dest_path = _check_dest(scanned, Path(dest))
    explicit = mapping is not None or reference is not None
    findings = _refuse_on_errors(scanned, explicit=explicit, allow_partial=allow_partial)
    partial = _partial_tensors(scanned, findings)
    try:
        target = dtype_for_target(dtype) if dtype else None
        limit = parse_size(SHARD_SPLIT_SIZE if max_shard_size is None else max_shard_size)
    except ValueError as exc:
        raise PlanRefusedError(str(exc)) from None
    # 2. Every tensor with its chunks located in the source files.
    sources = _source_tensors(scanned)
    # 3. Which output file each tensor goes to, and why.
    out_bytes = {s.name: _out_nbytes(s, target) for s in sources.values()}
    own_files = converted.files if converted is not None and max_shard_size is None else None
    choice = choose_assignment(
        scanned, list(sources), out_bytes, mapping, reference, limit, files=own_files
    )
    if choice.collapse_avoided:
        # The plan follows the caller's mapping or reference, or the upstream model the run
        # names, not the collapsed mapping: the collapse no longer affects this plan, so it is
        # not repeated as a warning about it (its reason says what was followed instead).
        # `check` still reports the checkpoint's own mapping-collapsed.
        findings = [f for f in findings if f.code != Code.MAPPING_COLLAPSED]
    # 4. Headers and offsets of every output.
    aliases = dict(converted.aliases) if converted is not None else {}
    single = converted is not None and len(choice.groups) == 1
    outputs = _build_outputs(
        sources, choice.groups, target, set(partial), aliases=aliases, single=single
    )
    if converted is not None:
        metadata_files, skipped = converted.side_files, list(converted.notes)
    else:
        metadata_files, skipped = _public_metadata_files(scanned)
    notes = [*_partial_notes(partial, findings), *choice.notes, *skipped]
    notes += _size_notes(outputs, limit, choice.rule)
    return ConsolidationPlan(
        source=scanned.path,
        storage=scanned.storage,
        dest=dest_path,
        outputs=outputs,
        assignment=choice.rule,
        reason=choice.reason,
        dtype=target,
        metadata_files=metadata_files,
        notes=tuple(notes),
        findings=tuple(findings),
        partial=tuple(partial),
        config=scanned.config,
        layout=layout_reference(scanned),
        index_file=None if single else INDEX_NAME,
        aliases=aliases,
    )


@dataclass(frozen=True, slots=True)
class _Source:
    name: str
    dtype: str
    shape: tuple[int, ...]
    chunks: tuple[DcpChunk, ...]
    locations: tuple[tuple[int, int], ...]  # (absolute offset, nbytes) of each chunk
    # Element strides of a strided `.bin` view (one chunk: the whole tensor), else None.
    strides: tuple[int, ...] | None = None


def _check_dest(scanned: ScannedCheckpoint, dest: Path) -> Path:
    if scanned.dcp is None:
        raise PlanRefusedError(
            f"{scanned.path}: layout is {scanned.layout}, not DCP-sharded safetensors; "
            "only a folder of shard-*-model-*.safetensors files with DCP_SHARDING_INFO, or a "
            "PyTorch .bin checkpoint, can be consolidated"
        )
    # DEST's parents are resolved, DEST itself is not: a link there is refused, not followed.
    absolute = Path(os.path.abspath(dest.expanduser()))
    target = absolute.parent.resolve() / absolute.name
    if isinstance(scanned.path, Path) and target.resolve() == scanned.path.resolve():
        raise PlanRefusedError(
            f"{dest}: DEST is the source folder; write to a new folder such as "
            f"{default_destination(scanned.path)}"
        )
    if target.is_symlink() or (target.exists() and not target.is_dir()):
        raise UnsafeInputError(not_a_folder(target))
    return target


def _refuse_on_errors(
    scanned: ScannedCheckpoint, *, explicit: bool, allow_partial: bool = False
) -> list[Finding]:
    """Raise on findings that would make the output wrong; return the others (with
    `allow_partial`, the coverage gaps too)."""
    found = list(dict.fromkeys([*scanned.read_findings, *check_dcp(scanned)]))
    allowed = {Code.DCP_COVERAGE_GAP} if allow_partial else set()
    blocking = [f for f in found if f.code in BLOCKING and f.code not in allowed]
    if not explicit:
        # Without --mapping/--reference a broken mapping file would silently change the layout.
        blocking += [f for f in found if f.code == "mapping-unreadable"]
    if blocking:
        partial = (
            "; if the loss is known and accepted, --allow-partial writes the tensors with "
            "zeros where no chunk was found"
            if any(f.code == Code.DCP_COVERAGE_GAP for f in blocking)
            else ""
        )
        raise PlanRefusedError(
            f"{scanned.path}: cannot consolidate, these would make the output wrong or "
            f"incomplete: {refusal_digest(blocking, path=scanned.path)}. Fix the source (re-save "
            "the missing "
            "or damaged rank files) or pass --mapping/--reference for a broken mapping file, "
            f"then plan again{partial}."
        )
    return [f for f in found if f not in blocking]


def _partial_tensors(scanned: ScannedCheckpoint, findings: list[Finding]) -> list[str]:
    """The tensors a plan allowed to be partial (only when a coverage gap got through)."""
    if not any(f.code == Code.DCP_COVERAGE_GAP for f in findings):
        return []
    return uncovered_tensors(scanned)


def _partial_notes(partial: list[str], findings: list[Finding]) -> list[str]:
    gaps = [f for f in findings if f.code == Code.DCP_COVERAGE_GAP]
    if not gaps:
        return []
    what = (
        f"PARTIAL {plural(len(partial), 'tensor')}, written at their full shape with ZEROS "
        f"where no rank's file held data: {examples(partial)}"
        if partial
        else "the source lost ranks' files (see its dcp-coverage-gap findings)"
    )
    return [f"WARNING --allow-partial: {what}; the output is not the trained model"]


def _source_tensors(scanned: ScannedCheckpoint) -> dict[str, _Source]:
    """Each tensor's chunks with their absolute byte ranges. Pure (headers only)."""
    where: dict[str, dict[str, tuple[int, int]]] = {}
    strided: dict[str, tuple[int, ...]] = {}
    # Which files may be read is the storage's rule, the scan's too: a shard it refused is a
    # file-unsafe finding, which blocks the plan (BLOCKING) before this point.
    for shard in scanned.shards:
        start = shard.data_start
        where[shard.file] = {
            n: (start + b, e - b)
            for n, b, e in zip(shard.names, shard.begins.tolist(), shard.ends.tolist(), strict=True)
        }
        strided.update(strides_of(shard))  # `.bin` only: one chunk per name, one file
    out: dict[str, _Source] = {}
    table = _dcp(scanned).table
    for i, name in enumerate(table.names):
        chunks = table.chunks(i)
        locations = tuple(where[c.file][name] for c in chunks)
        strides = strided.get(name) if len(chunks) == 1 else None
        source = _Source(name, chunks[0].dtype, table.full[i], chunks, locations, strides)
        _check_sub_byte(source)
        out[name] = source
    if not out:
        raise PlanRefusedError(
            f"{scanned.path}: no tensor chunk could be read from "
            f"{plural(len(scanned.shards), 'file')}; nothing to consolidate"
        )
    return out


def _dcp(scanned: ScannedCheckpoint) -> DcpInfo:
    if scanned.dcp is None:  # `_check_dest` refused it already
        raise PlanRefusedError(f"{scanned.path}: not DCP-sharded safetensors")
    return scanned.dcp


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


def _build_outputs(
    sources: dict[str, _Source],
    groups: list[list[str]],
    target: str | None,
    partial: set[str] | frozenset[str] = frozenset(),
    *,
    aliases: Mapping[str, str] | None = None,
    single: bool = False,
) -> tuple[OutputFile, ...]:
    """The output files; `aliases` (left out -> kept) go into the `__metadata__` of the
    output holding the kept name; `single` names one output `model.safetensors`."""
    count = len(groups)
    kept_by: dict[str, dict[str, str]] = {}
    for left, kept in (aliases or {}).items():
        kept_by.setdefault(kept, {})[left] = kept
    outputs = []
    for k, group in enumerate(groups, start=1):
        tensors = []
        offset = 0
        recorded: dict[str, str] = {}
        for name in group:
            tensor = _plan_tensor(sources[name], target, offset, partial=name in partial)
            tensors.append(tensor)
            offset = tensor.end
            recorded.update(kept_by.get(name, {}))
        name = SINGLE_NAME if single else OUTPUT_NAME.format(i=k, n=count)
        header = _header_bytes(tensors, dict(sorted(recorded.items())))
        outputs.append(OutputFile(k, name, header, tuple(tensors)))
    return tuple(outputs)


def _plan_tensor(
    source: _Source, target: str | None, begin: int, *, partial: bool = False
) -> PlannedTensor:
    bits = DTYPE_BITS[source.dtype]
    pieces = []
    for chunk, (src_offset, nbytes) in zip(source.chunks, source.locations, strict=True):
        if not math.prod(chunk.shape):
            continue  # an empty chunk (more ranks than rows) has nothing to copy
        dst = None
        if source.strides is None and _contiguous(chunk.shape, source.shape):
            dst = _linear_offset(chunk.offsets, source.shape) * bits // 8
        pieces.append(
            Piece(chunk.file, src_offset, nbytes, chunk.offsets, chunk.shape, dst, source.strides)
        )
    out_dtype = _out_dtype(source.dtype, target)
    end = begin + math.prod(source.shape) * DTYPE_BITS[out_dtype] // 8
    return PlannedTensor(
        source.name, source.dtype, out_dtype, source.shape, begin, end, tuple(pieces), partial
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


def _header_bytes(tensors: Iterable[PlannedTensor], aliases: Mapping[str, str]) -> bytes:
    # safetensors' own record of shared tensors left out: {left out: kept}.
    header: dict[str, Any] = {"__metadata__": {"format": "pt", **aliases}}
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
    files = plural(len(big), "output file")
    return [f"{files} over {limit:,} bytes as the {rule} asks: {examples(big)}"]


def _public_metadata_files(scanned: ScannedCheckpoint) -> tuple[tuple[str, ...], list[str]]:
    """Files of `.hf_metadata/` a loader needs (config, tokenizer...), not the run's mappings
    nor a kept reference index, which would clash with the one we write; and a note for each
    such file that is not copied (decided here, so executing the plan never meets it)."""
    meta_dir = _dcp(scanned).hf_metadata_dir
    if meta_dir is None:
        return (), []
    keep, notes = [], []
    for entry in (scanned.location / meta_dir).entries():
        skip = entry.name.startswith("fqn_to_") or entry.name == INDEX_NAME
        if skip or entry.name.endswith(".safetensors") or entry.kind is EntryKind.DIR:
            continue
        # Regular files under plain names only: the storage refuses FIFOs, links out of the
        # folder and names such as `a\\b.json` (`member_problem`).
        rel = f"{meta_dir}/{entry.name}"
        why = not_copied(entry, rel)
        if why is None:
            keep.append(rel)
        else:
            notes.append(why)
    return tuple(keep), notes


def describe_plan(plan: ConsolidationPlan) -> str:
    tensors = sum(len(o.tensors) for o in plan.outputs)
    column = sum(1 for o in plan.outputs for t in o.tensors if not t.contiguous)
    lines = [
        f"Consolidation plan: {plan.source} -> {plan.dest}",
        f"  {tensors:,} tensors, {plan.total_parameters:,} parameters ({PARAMETER_RULE}), "
        f"{format_bytes(plan.total_size)} in {plural(len(plan.outputs), 'file')}",
        f"  assignment: {plan.assignment}",
        f"    why: {plan.reason}",
        f"  copy: {plural(tensors - column, 'tensor')} as byte ranges, {column:,} assembled "
        "(column-sharded, strided or cast)",
    ]
    if plan.dtype:
        cast = sum(1 for o in plan.outputs for t in o.tensors if t.dtype != t.out_dtype)
        lines.append(f"  cast: {plural(cast, 'floating tensor')} to {plan.dtype}; others unchanged")
    # A 250-file plan shows its first and last files; the count says how many were left out.
    many = len(plan.outputs) > 20
    for k, output in enumerate(plan.outputs):
        if many and k == 10:
            lines.append(f"    ... {len(plan.outputs) - 15} more files")
        if not many or k < 10 or k >= len(plan.outputs) - 5:
            lines.append(
                f"    {output.name}: {len(output.tensors):,} tensors, {format_bytes(output.size)}"
            )
    if plan.index_file:
        lines.append(f"    {plan.index_file} (written last)")
    if plan.metadata_files:
        lines.append(
            f"  copied from the source: {', '.join(Path(f).name for f in plan.metadata_files)}"
        )
    lines += [f"  {n}" if n.startswith("WARNING") else f"  note: {n}" for n in plan.notes]
    lines += [f"  source {f.severity} [{f.code}]: {f.message}" for f in plan.findings[:10]]
    return "\n".join(legible(line, limit=MESSAGE_LIMIT) for line in lines)


# -- which output file each tensor goes to -------------------------------------------------


@dataclass(frozen=True, slots=True)
class Choice:
    rule: str
    reason: str
    groups: list[list[str]]  # tensor names of output 1, 2, ...
    notes: list[str] = field(default_factory=list)
    # True when the recorded mapping sends everything to one file and this choice follows
    # something else (the caller's mapping or reference, or the upstream model the run names).
    collapse_avoided: bool = False


def choose_assignment(
    scanned: ScannedCheckpoint,
    names: list[str],
    nbytes: dict[str, int],
    mapping: str | os.PathLike[str] | Mapping[str, int] | None,
    reference: str | os.PathLike[str] | None,
    limit: int,
    *,
    files: Mapping[str, int] | None = None,
) -> Choice:
    """The first assignment rule that applies (see `plan_consolidation`); `files` is the
    1-based number of the source file of each tensor where the source's own files are to be
    followed (a `.bin` checkpoint converted without a size limit)."""
    dcp = scanned.dcp
    if dcp is None:
        raise PlanRefusedError(f"{scanned.path}: not DCP-sharded safetensors")
    if mapping is not None:
        table, label = _load_mapping(mapping)
        why = "given by the caller (mapping=...)"
        choice = _from_index(names, table, f"mapping {label}", why)
        return replace(choice, collapse_avoided=_collapsed(scanned))
    # A recorded mapping that sends everything to one file is the automodel-2289 collapse: an
    # explicit reference is then the user's way out, so it wins; without one, the default
    # never writes the collapse its own check reports.
    recorded = dcp.mapping or {}
    collapsed = _collapsed(scanned)
    named = dcp.reference
    if collapsed and reference is None and named is not None and named.index is not None:
        # The upstream model the run names, found on this machine (`find_reference`): its
        # index is the layout the collapsed mapping should have recorded.
        table = _index_table(named.index.weight_map)
        why = (
            f"{dcp.mapping_file} sends every tensor to one file (a collapsed mapping); "
            f"output files follow {named.label} instead"
        )
        choice = _from_index(names, table, f"reference {named.index.file}", why)
        return replace(choice, collapse_avoided=True)
    if reference is None and collapsed_mapping(scanned):
        kept = consolidation_reference(scanned)
        if kept is not None and scanned.index is not None:
            # The reference index the run kept in `.hf_metadata/`: the one the
            # mapping-collapsed finding names.
            table = _index_table(scanned.index.weight_map)
            why = (
                f"{dcp.mapping_file} sends every tensor to one file (mapping-collapsed); "
                f"output files follow {kept.label} instead ({plural(kept.files, 'file')}; "
                f"--reference {kept.path})"
            )
            choice = _from_index(names, table, f"reference {scanned.index.file}", why)
            return replace(choice, collapse_avoided=True)
        groups = _greedy(names, nbytes, limit)
        rule = f"greedy by size in key order, at most {limit:,} bytes per file"
        why = (
            f"{dcp.mapping_file} sends every tensor to one file over the split size "
            "(mapping-collapsed) and no reference index is known: packed like "
            "huggingface_hub's splitter (pass --reference to follow a model's files)"
        )
        return Choice(rule, why, groups, collapse_avoided=True)
    if recorded and not (collapsed and reference is not None):
        why = "the training run recorded the reference model's file for every tensor"
        return _from_index(names, recorded, f"mapping {dcp.mapping_file}", why)
    if reference is not None:
        table, label = reference_assignment(reference)
        why = "no mapping file; output files follow the reference checkpoint's index"
        if collapsed:
            why = (
                f"{dcp.mapping_file} sends every tensor to one file (a collapsed mapping); "
                "output files follow the reference checkpoint's index instead"
            )
        choice = _from_index(names, table, f"reference {label}", why)
        return replace(choice, collapse_avoided=collapsed)
    if files is not None:
        why = (
            "one output file per .bin file, in their order (as the Hub's conversion writes "
            "them); --max-shard-size packs by size instead"
        )
        return _from_index(names, files, "source .bin files", why)
    if scanned.index is not None:
        table = _index_table(scanned.index.weight_map)
        why = "no mapping file; output files follow the reference index kept by the run"
        return _from_index(names, table, f"reference {scanned.index.file}", why)
    groups = _greedy(names, nbytes, limit)
    rule = f"greedy by size in key order, at most {limit:,} bytes per file"
    why = "no mapping, no reference: packed like huggingface_hub's splitter"
    return Choice(rule, why, groups)


def _collapsed(scanned: ScannedCheckpoint) -> bool:
    """The recorded mapping sends every tensor to one file (seed automodel-2289)."""
    recorded = (scanned.dcp.mapping if scanned.dcp is not None else None) or {}
    return bool(recorded) and len(set(recorded.values())) == 1


def _from_index(names: list[str], table: Mapping[str, int], rule: str, why: str) -> Choice:
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
            f"{plural(len(unmapped), 'tensor')} absent from the {rule}: added to the last output "
            f"file: {examples(unmapped)}"
        )
    dangling = [n for n in table if n not in present]
    if dangling:
        notes.append(
            f"{plural(len(dangling), 'name')} in the {rule} not in the source: skipped "
            f"(tied or removed weights?): {examples(dangling)}"
        )
    if len(order) != max(order) or order[0] != 1:
        notes.append(f"output indices {order[0]}..{max(order)} have gaps; files are renumbered")
    return Choice(rule, why, groups, notes)


def _load_mapping(
    mapping: str | os.PathLike[str] | Mapping[str, int],
) -> tuple[dict[str, int], str]:
    if isinstance(mapping, Mapping):
        table, label = dict(mapping), "(in memory)"
    else:
        try:
            value, problem, _ = read_json(open_location(mapping))
        except CannotInspectError as exc:
            raise PlanRefusedError(f"mapping {mapping}: {exc}") from None
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
    """{fqn: 1-based output index} from an HF checkpoint folder or its index file (local or
    a URL).

    The index of a file comes from `-(\\d+)-of-(\\d+).safetensors` at the end of its name, so
    `model-00002-of-00008.safetensors` and `model.safetensors-00002-of-00008.safetensors` are
    both file 2; names without it fall back to their sorted order.
    """
    try:
        path = open_location(reference)
    except CannotInspectError as exc:
        raise PlanRefusedError(f"reference {reference}: {exc}; pass another --reference") from None
    folder = path.is_dir()
    index_path = path / INDEX_NAME if folder else path
    if index_path.is_file() and index_path.name.endswith(".json"):
        value, problem, _ = read_json(index_path)
        weight_map = value.get("weight_map") if isinstance(value, dict) else None
        if problem is not None or not isinstance(weight_map, dict):
            why = problem or 'is not of the form {"weight_map": {tensor: file}}'
            raise PlanRefusedError(f"reference {index_path} {why}; pass another --reference")
        return _index_table(weight_map), str(index_path)
    if folder:
        weight_map = {}
        files = list_safetensors(path)
        for file, shard in zip(files, read_shards(files, root=path), strict=True):
            for name in shard.names:
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
    parsed = {f: HF_SHARD_NUMBER.search(f) for f in files}
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


# -- sources that are not DCP-sharded: one chunk per tensor, and .bin checkpoints ----------

# Index findings that mean tensors the model needs are not on disk: a conversion would
# write an output that silently lacks them, and a new index that no longer says so.
_LOST = (Code.INDEX_MISSING_FILE, Code.INDEX_DANGLING_TENSOR)
# Files of a `.bin` folder that are weights, indexes or checkpoint-inspector's own: never
# copied beside the converted shards.
_WEIGHTS = (".bin", ".pt", ".pth", ".safetensors")
_OURS = frozenset({LOCK, JOURNAL, MANIFEST_NAME})


def as_single_chunks(
    scanned: ScannedCheckpoint, *, only: Collection[str] | None = None, natural: bool = True
) -> ScannedCheckpoint:
    """The checkpoint seen as DCP tensors of one chunk each, in model order (layer 2 before
    layer 10) unless `natural` is False (then in file order), so the consolidation engine
    does the copying; `only` keeps those names. Of a name several shards hold, the copy a
    loader keeps (`stale_copies` names the others)."""
    chunks: dict[str, list[DcpChunk]] = {}
    stale = stale_copies(scanned)
    entries = [
        (name, DcpChunk(s.file, (0,) * len(shape), shape, dtype))
        for s in scanned.shards
        for name, dtype, shape in zip(s.names, s.dtypes, s.shapes, strict=True)
        if (only is None or name in only) and name not in stale.get(s.file, ())
    ]
    if natural:
        entries.sort(key=lambda e: _natural(e[0]))
    for name, chunk in entries:
        chunks[name] = [chunk]
    return dataclasses.replace(
        scanned, layout=LayoutName.DCP_SHARDED, info=DcpInfo.from_chunks(chunks), index=None
    )


def _natural(name: str) -> tuple[object, ...]:
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name))


@dataclass(frozen=True)
class BinSource:
    """A `.bin` checkpoint ready to be written as safetensors.

    `view`: its tensors as one-chunk DCP tensors in file order (strided views keep their
    strides in the shards, `strides_of`); `aliases`: tied names left out -> the name written;
    `files`: each written tensor -> the 1-based number of the `.bin` file holding it (the
    Hub's conversion writes one safetensors file per `.bin` file); `side_files`: the folder's
    other files (config, tokenizer) a converted copy needs beside its shards; `notes`."""

    view: ScannedCheckpoint
    aliases: Mapping[str, str] = field(default_factory=dict)
    files: Mapping[str, int] = field(default_factory=dict)
    side_files: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()


def bin_source(scanned: ScannedCheckpoint) -> BinSource:
    """`scanned` (a `.bin` checkpoint) as a consolidation source. Raises `PlanRefusedError`
    when the output could not be the checkpoint: legacy or unreadable files, a dtype
    safetensors has no name for, a tensor in two files, or tensors the index names that no
    file holds."""
    _refuse(scanned)
    aliases = _tied_aliases(scanned)
    order = [n for s in scanned.shards for n in s.names if n not in aliases]
    numbers = _file_numbers([s.file for s in scanned.shards])
    files = {n: numbers[s.file] for s in scanned.shards for n in s.names if n not in aliases}
    view = as_single_chunks(scanned, only=set(order), natural=False)
    side, notes = _side_files(scanned)
    if aliases:
        tied = [f"{legible(a)} (= {legible(k)})" for a, k in aliases.items()]
        notes.insert(
            0,
            f"tied: {plural(len(aliases), 'name')} left out, recorded in __metadata__ as "
            f"safetensors does: {examples(tied)}",
        )
    strided = sum(len(strides_of(s)) for s in scanned.shards)
    if strided:
        notes.insert(0, f"{plural(strided, 'strided view')} written as contiguous values")
    return BinSource(view, aliases, files, side, tuple(notes))


def _refuse(scanned: ScannedCheckpoint) -> None:
    unreadable = [f for s in scanned.shards for f in s.findings]
    if unreadable:
        raise PlanRefusedError(
            f"{scanned.path}: cannot convert, these files cannot be read as they are: "
            f"{refusal_digest(unreadable, path=scanned.path)}; re-copy or re-save them first"
        )
    odd = sorted(
        {
            f"{legible(n)} ({d.removeprefix('torch.')})"
            for s in scanned.shards
            for n, d in zip(s.names, s.dtypes, strict=True)
            if d.startswith("torch.")
        }
    )
    if odd:
        raise PlanRefusedError(
            f"{scanned.path}: {plural(len(odd), 'tensor')} of a dtype safetensors has no name "
            f"for: {examples(odd)}; convert them in torch first (e.g. complex128 -> complex64)"
        )
    holders: dict[str, int] = defaultdict(int)
    for s in scanned.shards:
        for n in s.names:
            holders[n] += 1
    twice = sorted(n for n, count in holders.items() if count > 1)
    if twice:
        raise PlanRefusedError(
            f"{scanned.path}: {plural(len(twice), 'tensor')} in several files: "
            f"{examples(twice)}; which copy is the model's is not decided here: remove the "
            "stale copies first"
        )
    lost = [f for f in check_index_of(scanned) if f.code in _LOST]
    if lost:
        raise PlanRefusedError(
            f"{scanned.path}: cannot convert, the index names tensors no file holds: "
            f"{refusal_digest(lost, path=scanned.path)}; restore the missing files, or accept "
            "the loss with `ckpt-inspect repair --only index` (the rebuilt index then says "
            "what is there), then convert"
        )


def _tied_aliases(scanned: ScannedCheckpoint) -> dict[str, str]:
    """Output-head names that are the very view of another name (one storage, offset,
    shape, strides and dtype) in a model whose config.json ties word embeddings: left out
    -> kept."""
    config = scanned.config
    if not config or config.get("tie_word_embeddings") is False:
        return {}
    t = scanned.tensors
    heads = set(t.loc[t["kind"].astype(str) == "output_head", "name"])
    if not heads:
        return {}
    views: dict[tuple[object, ...], list[str]] = defaultdict(list)
    for s in scanned.shards:
        strides = strides_of(s)
        for n, d, shape, b, e in zip(
            s.names, s.dtypes, s.shapes, s.begins.tolist(), s.ends.tolist(), strict=True
        ):
            if e > b:
                views[(s.file, b, e, d, shape, strides.get(n))].append(n)
    aliases: dict[str, str] = {}
    for names in views.values():
        kept = sorted(n for n in names if n not in heads)
        if len(names) > 1 and kept:
            aliases.update((n, kept[0]) for n in sorted(names) if n in heads)
    return aliases


def _file_numbers(files: list[str]) -> dict[str, int]:
    """Each `.bin` file's 1-based number: `-NNNNN-of-NNNNN` in its name when every file has a
    distinct one, else its sorted position."""
    found = {f: BIN_SHARD_NUMBER.search(f) for f in files}
    numbers = {f: int(m.group(1)) for f, m in found.items() if m}
    if len(numbers) == len(files) and len(set(numbers.values())) == len(files):
        return numbers
    return {f: k + 1 for k, f in enumerate(sorted(files))}


def _side_files(scanned: ScannedCheckpoint) -> tuple[tuple[str, ...], list[str]]:
    """The folder's files a converted copy needs beside its shards (config, generation
    config, tokenizer, README...): regular files that are neither weights, indexes, nor
    checkpoint-inspector's own; refused entries are named in a note, never read."""
    if isinstance(scanned.info, PytorchBinInfo) and scanned.info.lone_file:
        return (), []  # one file scanned on its own: its folder is not the checkpoint
    keep: list[str] = []
    notes: list[str] = []
    for entry in scanned.location.entries():
        name = entry.name
        if (
            entry.kind is EntryKind.DIR
            or name.startswith(".")
            or name.endswith(_WEIGHTS)
            or name.endswith(INDEX_SUFFIX)
            or name in _OURS
        ):
            continue
        why = not_copied(entry, name)
        if why is None:
            keep.append(name)
        else:
            notes.append(why)
    return tuple(sorted(keep)), notes
