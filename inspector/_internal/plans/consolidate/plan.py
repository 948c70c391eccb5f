"""Consolidation planning: which output file each tensor goes to, where each source chunk
lands, the output headers. Pure: scanned headers in, a frozen plan out. A PyTorch `.bin`
checkpoint is planned the same way, each tensor one chunk (`sources.bin_source`): its
conversion to safetensors."""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Any, Unpack

import orjson

from inspector._internal.checkpoint.parameters import PARAMETER_RULE, parameters_of
from inspector._internal.checkpoint.scanned import (
    DcpChunk,
    DcpInfo,
    LayoutName,
    ScannedCheckpoint,
)
from inspector._internal.checks.dcp import check_dcp, uncovered_tensors
from inspector._internal.common.display import MESSAGE_LIMIT, legible
from inspector._internal.common.dtypes import DTYPE_BITS, FLOAT_DTYPES
from inspector._internal.common.filenames import INDEX_NAME, SAFETENSORS_WEIGHTS_NAME, STAGING
from inspector._internal.common.units import SHARD_SPLIT_SIZE, format_bytes, parse_size
from inspector._internal.findings.codes import Code, code_set
from inspector._internal.findings.finding import Finding, examples
from inspector._internal.findings.references import Reference, layout_reference
from inspector._internal.findings.words import plural, refusal_digest
from inspector._internal.formats.bin_shard import strides_of
from inspector._internal.formats.casting import dtype_for_target
from inspector._internal.integrity.refresh import refresh_manifest, source_manifest
from inspector._internal.plans.consolidate.assignment import choose_assignment
from inspector._internal.plans.consolidate.dest import not_a_folder
from inspector._internal.plans.consolidate.driver import execute_plan
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
from inspector._internal.plans.consolidate.sources import BinSource, bin_source
from inspector._internal.storage import EntryKind, LocalStorage, RemoteURL, Storage, is_remote
from inspector.errors import PlanRefusedError, UnsafeInputError

__all__ = [
    "BLOCKING",
    "ConsolidationPlan",
    "ConsolidationResult",
    "OutputFile",
    "Piece",
    "PlannedTensor",
    "default_destination",
    "index_bytes",
    "plan_consolidation",
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
    # A `.bin` source (`sources.bin_source` refuses these first, with its own words).
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
    # (`inspector._internal.findings.references`): the verification flags an output collapsed into
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
