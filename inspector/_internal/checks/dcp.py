"""DCP-sharded safetensors: do the chunks rebuild every tensor, and does the file-index
mapping send the tensors where the reference model had them? Pure.

Codes: dcp-dtype-conflict, dcp-coverage-gap, dcp-chunk-overlap, mapping-unmapped-tensor,
mapping-dangling-tensor, mapping-collapsed, and check-budget-exceeded for chunks no budgeted
check can prove (docs/findings.md). `dcp-sharding-info-missing`
and `mapping-unreadable` come from the reader's problems (`inspector._internal.checks.files`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from inspector._internal.checkpoint.naming import layer_expert_numbers, parse_names
from inspector._internal.checkpoint.naming_rules import DCP_SHARD_FILE
from inspector._internal.checkpoint.scanned import (
    ChunkTable,
    DcpInfo,
    DcpReference,
    IndexDoc,
    LogicalTensors,
    ScannedCheckpoint,
)
from inspector._internal.checks.coverage import MAX_CELLS, Box, Coverage, coverage
from inspector._internal.common.display import legible
from inspector._internal.common.filenames import DCP_MAPPING_NAME
from inspector._internal.common.text import examples, fold_ranges, layers_text, short_repr
from inspector._internal.common.units import SHARD_SPLIT_SIZE, format_bytes, format_count
from inspector._internal.findings.codes import Code, code_set
from inspector._internal.findings.finding import FOLD, Finding, fold, make_finding
from inspector._internal.formats.safetensors import ShardHeader

__all__ = ["CODES", "check_dcp", "uncovered_tensors"]

CODES = code_set(
    Code.DCP_DTYPE_CONFLICT,
    Code.DCP_COVERAGE_GAP,
    Code.DCP_CHUNK_OVERLAP,
    Code.MAPPING_UNMAPPED_TENSOR,
    Code.MAPPING_DANGLING_TENSOR,
    Code.MAPPING_COLLAPSED,
    Code.CHECK_BUDGET_EXCEEDED,
)

# (tensor name, file of the finding, message builder) of one per-tensor problem.
_Item = tuple[str, str, Callable[[], str]]


def check_dcp(scanned: ScannedCheckpoint) -> list[Finding]:
    """The DCP findings of `scanned` (none for other layouts)."""
    dcp = scanned.dcp
    if dcp is None:
        return []
    table = dcp.table
    findings = _dtype_conflicts(table)
    findings += _coverage_problems(table, _lost_chunks(scanned.shards), dcp.shape_sources)
    findings += _missing_rank_files(scanned.shards)
    if dcp.mapping is not None:
        findings += _mapping_problems(dcp, scanned.index, scanned.logical)
    return findings


# -- dtype / ndim ----------------------------------------------------------------------------


def _per_row_of_first(table: ChunkTable, values: np.ndarray) -> np.ndarray:
    """Each chunk row's value of the first chunk of its tensor."""
    counts = np.diff(table.starts)
    return np.repeat(values[table.starts[:-1]], counts)


def _ndims(table: ChunkTable) -> np.ndarray:
    per_shape = np.asarray([len(s) for s in table.shape.values] or [0], dtype=np.int64)
    return per_shape[table.shape.codes]


def _dtype_conflicts(table: ChunkTable) -> list[Finding]:
    """Chunks of one tensor with another dtype or number of dimensions than the first."""
    if not len(table.names):
        return []
    dtypes, ndims = table.dtype.codes, _ndims(table)
    odd = (dtypes != _per_row_of_first(table, dtypes)) | (ndims != _per_row_of_first(table, ndims))
    tensors = np.searchsorted(table.starts, np.flatnonzero(odd), side="right") - 1
    items: list[_Item] = []
    for i in np.unique(tensors).tolist():
        fqn, chunks = table.names[i], table.chunks(i)

        def message(fqn: str = fqn, chunks: tuple = chunks) -> str:
            kinds = {(c.dtype, len(c.shape)) for c in chunks}
            parts = [f"{c.dtype} {list(c.shape)} in {legible(c.file)}" for c in chunks]
            what = "dtype" if len({k[0] for k in kinds}) > 1 else "number of dimensions"
            return (
                f"tensor '{legible(fqn)}': chunks disagree on {what}: {examples(parts)}; "
                "consolidation would mix them, re-save every rank from one model state"
            )

        items.append((fqn, chunks[0].file, message))
    return _per_tensor(Code.DCP_DTYPE_CONFLICT, items, "have chunks that disagree on dtype or ndim")


# -- coverage --------------------------------------------------------------------------------


def _lost_chunks(shards: Sequence[ShardHeader]) -> set[tuple[str, str]]:
    """(file, tensor) whose bytes lie past the end of a short file: listed, but not there."""
    lost: set[tuple[str, str]] = set()
    for s in shards:
        if s.readable and len(s.ends) and s.data_start + int(s.ends.max()) > s.file_size:
            limit = s.file_size - s.data_start
            lost.update((s.file, s.names[i]) for i in np.flatnonzero(s.ends > limit).tolist())
    return lost


def uncovered_tensors(scanned: ScannedCheckpoint) -> list[str]:
    """Every tensor of a DCP scan whose chunks leave part of its full shape uncovered (what
    `consolidate --allow-partial` writes with zeros there)."""
    dcp = scanned.dcp
    if dcp is None:
        return []
    gaps, _, _ = _coverage_items(dcp.table, _lost_chunks(scanned.shards), dcp.shape_sources)
    return [fqn for fqn, _, _ in gaps]


def _coverage_problems(
    table: ChunkTable, lost: set[tuple[str, str]], sources: Mapping[str, str]
) -> list[Finding]:
    gaps, overlaps, unverified = _coverage_items(table, lost, sources)
    return [
        *_per_tensor(Code.DCP_COVERAGE_GAP, gaps, "are not fully covered by their chunks"),
        *_per_tensor(Code.DCP_CHUNK_OVERLAP, overlaps, "have overlapping chunks"),
        *_per_tensor(Code.CHECK_BUDGET_EXCEEDED, unverified, "have chunks too irregular to verify"),
    ]


def _coverage_items(
    table: ChunkTable, lost: set[tuple[str, str]], sources: Mapping[str, str]
) -> tuple[list[_Item], list[_Item], list[_Item]]:
    """(gaps, overlaps, unverified): per tensor, the chunks that have its full shape's number
    of dimensions (and whose bytes are in the file) must cover it exactly once. Tensors
    sharded alike share one result. The full shape is the largest any source gives
    (`sources`: which one, where it is not the chunks' own extent). Chunks too irregular
    for the check's budget (`inspector._internal.checks.coverage`) are judged by their volume; when
    it matches, they are `unverified`."""
    ndims = _ndims(table).tolist()
    full_ndim = [len(f) for f in table.full.values]
    files, offsets, shapes = table.file, table.offsets.values, table.shape.values
    pairs = (
        table.offsets.codes.astype(np.int64) * max(len(shapes), 1) + table.shape.codes
    ).tolist()
    file_codes, full_codes = files.codes.tolist(), table.full.codes.tolist()
    known: dict[tuple[int, ...], Coverage] = {}
    gaps: list[_Item] = []
    overlaps: list[_Item] = []
    unverified: list[_Item] = []
    width = max(len(shapes), 1)
    for i, fqn in enumerate(table.names):
        rows = table.rows(i)
        full_code = full_codes[i]
        want = full_ndim[full_code]
        kept = [
            r
            for r in rows
            if ndims[r] == want and not (lost and (files.values[file_codes[r]], fqn) in lost)
        ]
        key = (full_code, *(pairs[r] for r in kept))
        result = known.get(key)
        if result is None:
            boxes = [(offsets[pairs[r] // width], shapes[pairs[r] % width]) for r in kept]
            result = known[key] = coverage(table.full.values[full_code], boxes)
        if result.total == 0:
            continue
        first_file = files[rows[0]]
        if not result.exact:
            item = (fqn, first_file, _volume_message(fqn, table.full[i], result, len(kept)))
            if result.volume > result.total:
                overlaps.append(item)
            elif result.volume < result.total:
                gaps.append(item)
            else:
                unverified.append(item)
            continue
        if result.overlap is not None:
            a, b = (kept[k] for k in result.overlap)
            overlaps.append((fqn, files[a], _overlap_message(table, fqn, a, b)))
        if result.covered < result.total:
            chunk_files = sorted({files[r] for r in rows})
            message = _gap_message(fqn, table.full[i], result, chunk_files, lost, sources)
            gaps.append((fqn, first_file, message))
    return gaps, overlaps, unverified


def _gap_message(
    fqn: str,
    full: tuple[int, ...],
    result: Coverage,
    files: list[str],
    lost: set[tuple[str, str]],
    sources: Mapping[str, str],
) -> Callable[[], str]:
    def message() -> str:
        holes = "; ".join(_box_text(b) for b in result.holes)
        short = sorted(f for f in files if (f, fqn) in lost)
        cause = f" ({', '.join(map(legible, short))} is truncated)" if short else ""
        source = sources.get(fqn)
        shape = (
            f"full shape {list(full)}: {source}"
            if source
            else (f"full shape {list(full)} from its chunks")
        )
        lost_rank = (
            "; the chunks reach less, as when every file of the last rank is gone (DCP stores "
            "no full shape, so nothing else shows it): restore the lost rank's files or re-save"
            if source
            else "; a rank's file is missing or short, restore it or re-save"
        )
        return (
            f"tensor '{legible(fqn)}' ({shape}): chunks cover {result.covered:,} of "
            f"{result.total:,} "
            f"elements; uncovered {holes}. Chunks are in {examples(files)}{cause}{lost_rank}"
        )

    return message


def _volume_message(
    fqn: str, full: tuple[int, ...], result: Coverage, chunks: int
) -> Callable[[], str]:
    def message() -> str:
        held = f"{chunks:,} chunks hold {format_count(result.volume)} elements"
        shape = f"full shape {short_repr(list(full))}, {format_count(result.total)} elements"
        if result.volume > result.total:
            what = "more than the tensor has, so some overlap"
        elif result.volume < result.total:
            what = "fewer than the tensor has, so part of it is in no chunk"
        else:
            what = (
                "as many as the tensor has, but they form no grid the check could follow "
                f"within its budget (at most {MAX_CELLS:,} cells), so whether they cover it "
                "exactly once is NOT verified; no real save shards a tensor like this"
            )
        return (
            f"tensor {fqn!r} ({shape}): its {held}, {what}. The file was crafted or is "
            "corrupt: re-save the checkpoint"
        )

    return message


def _box_text(box: Box) -> str:
    return "[" + ", ".join(f"{a}:{b}" for a, b in box) + "]"


def _overlap_message(table: ChunkTable, fqn: str, a: int, b: int) -> Callable[[], str]:
    def message() -> str:
        oa, sa, fa = table.offsets[a], table.shape[a], table.file[a]
        ob, sb, fb = table.offsets[b], table.shape[b], table.file[b]
        return (
            f"tensor '{legible(fqn)}': chunk at offsets {list(oa)} shape {list(sa)} in "
            f"{legible(fa)} overlaps "
            f"chunk at offsets {list(ob)} shape {list(sb)} in {legible(fb)}; consolidation keeps "
            "whichever it copies last, re-save from one sharding plan"
        )

    return message


def _missing_rank_files(shards: Sequence[ShardHeader]) -> list[Finding]:
    """A rank that wrote some output files but not one that other ranks wrote: its chunks
    of those tensors are gone, and if it was the last rank the full shapes silently shrink
    (they are computed from the chunks present), so the boxes alone cannot tell. A rank
    number below the highest that wrote no file at all lost every file (ranks are numbered
    from 1 without gaps), and its replicated tensors with them."""
    present: dict[tuple[int, int], str] = {}
    counts: set[int] = set()
    for s in shards:
        m = DCP_SHARD_FILE.match(s.file.rsplit("/", 1)[-1])
        if m and s.readable:
            present[(int(m[1]), int(m[2]))] = s.file
            counts.add(int(m[3]))
    if len(counts) != 1:
        return []
    (count,) = counts
    ranks = {r for r, _ in present}
    writers: dict[int, set[int]] = defaultdict(set)
    for r, i in present:
        writers[i].add(r)
    findings = _lost_ranks(ranks, set(writers), count)
    # Only outputs some rank lacks, and only the first few spelled out: file names are
    # untrusted, and ranks x outputs could be millions.
    short = [i for i in sorted(writers) if len(writers[i]) < len(ranks)]
    for i in short[: FOLD.per_file]:
        missing = sorted(ranks - writers[i])
        names = [_rank_file(r, i, count) for r in missing[:3]]
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        one = len(missing) == 1
        msg = (
            f"{', '.join(names)}{more} missing or unreadable: "
            f"{layers_text(writers[i], noun='rank')} wrote output file {i} but "
            f"{layers_text(missing, noun='rank')} did not, though {'it' if one else 'they'} "
            f"wrote other outputs; tensors of output {i} lack {'its' if one else 'their'} "
            f"chunks (full shapes may be understated). Restore "
            f"{'that file' if one else 'those files'} or re-save"
        )
        findings.append(make_finding(Code.DCP_COVERAGE_GAP, msg, file=names[0]))
    rest = short[FOLD.per_file :]
    if rest:
        msg = (
            f"{len(rest):,} more output files (numbers {fold_ranges(rest)}) lack some ranks' "
            "files, as above. Restore the files or re-save"
        )
        findings.append(make_finding(Code.DCP_COVERAGE_GAP, msg))
    return findings


def _rank_file(rank: int, output: int, count: int) -> str:
    return f"shard-{rank:05d}-model-{output:05d}-of-{count:05d}.safetensors"


def _lost_ranks(ranks: set[int], outputs: set[int], count: int) -> list[Finding]:
    # Bounded: the highest rank number comes from untrusted file names.
    top = max(ranks, default=0)
    lost = [r for r in range(1, min(top, 1_000_000)) if r not in ranks]
    if not lost:
        return []
    first = min(outputs)
    names = [_rank_file(r, first, count) for r in lost[:3]]
    more = f" and {len(lost) - 3} more" if len(lost) > 3 else ""
    msg = (
        f"ranks {fold_ranges(lost)} wrote no file at all ({', '.join(names)}{more} and their other "
        f"outputs are missing) while ranks {fold_ranges(sorted(ranks))} did: every chunk of "
        "those ranks is gone, and the tensors only they saved (replicated scalars are written "
        "by one rank) with them. Restore the files or re-save"
    )
    return [make_finding(Code.DCP_COVERAGE_GAP, msg, file=names[0])]


# -- mapping ---------------------------------------------------------------------------------


def _mapping_problems(
    dcp: DcpInfo, index: IndexDoc | None, logical: LogicalTensors | None
) -> list[Finding]:
    mapping = dcp.mapping or {}
    rel = dcp.mapping_file or DCP_MAPPING_NAME
    table = dcp.table
    unmapped: list[_Item] = []
    for i, fqn in enumerate(table.names):
        if fqn not in mapping:
            file = table.file[int(table.starts[i])]
            unmapped.append((fqn, file, _unmapped_message(fqn, file, rel)))
    position = dcp.position
    dangling: list[_Item] = [
        (fqn, rel, _dangling_message(fqn, idx, rel))
        for fqn, idx in mapping.items()
        if fqn not in position
    ]
    total = int(np.sum(logical.nbytes)) if logical is not None else 0
    # The upstream checkpoint the run names, when found: what `consolidate` then follows.
    named = dcp.reference if dcp.reference and dcp.reference.index else None
    return [
        *_per_tensor(Code.MAPPING_UNMAPPED_TENSOR, unmapped, f"are absent from {legible(rel)}"),
        *_per_tensor(
            Code.MAPPING_DANGLING_TENSOR, dangling, f"are listed in {legible(rel)} but in no shard"
        ),
        *_collapsed(mapping, rel, named.index if named else index, total, named),
    ]


def _unmapped_message(fqn: str, file: str, rel: str) -> Callable[[], str]:
    return lambda: (
        f"tensor '{legible(fqn)}' is in {legible(file)} but has no output index in {legible(rel)}; "
        "consolidation has no output file for it, add it to the mapping"
    )


def _dangling_message(fqn: str, idx: int, rel: str) -> Callable[[], str]:
    return lambda: (
        f"{legible(rel)} maps '{legible(fqn)}' to output {idx} but no shard holds it (a tied alias "
        "such as lm_head.weight, or a lost rank?); drop it from the mapping or restore it"
    )


def _collapsed(
    mapping: Mapping[str, int],
    rel: str,
    index: IndexDoc | None,
    total: int,
    named: DcpReference | None = None,
) -> list[Finding]:
    """Every tensor to one output file although the reference had several (seed
    automodel-2289) or although the output would pass the shard size limit. `named`: the
    upstream checkpoint the run names, found on this machine (`index` is its index)."""
    if len(mapping) < 2 or len(set(mapping.values())) != 1:
        return []
    (target,) = set(mapping.values())
    ref_files = sorted(index.files.used()) if index else []
    reasons = []
    if index is not None and len(ref_files) > 1:
        reasons.append(
            f"the reference index {legible(index.file)} names {len(ref_files)} files "
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
    then = f"consolidation would write {outcome}"
    if named is not None and len(ref_files) > 1:
        then = (
            f"consolidators that follow the mapping write {outcome} (`ckpt-inspect "
            f"consolidate` follows {named.label})"
        )
    msg = (
        f"{legible(rel)} sends all {len(mapping):,} tensors to output file {target} although "
        f"{' and '.join(reasons)}; {then}. Known cause: the "
        "output index was parsed from non-standard reference shard names (e.g. "
        "model.safetensors-00001-of-00004.safetensors all read as 1); regenerate the mapping "
        "from the '-NNNNN-of-NNNNN.safetensors' numbers, or pack by size (5 GB per file)"
    )
    return [make_finding(Code.MAPPING_COLLAPSED, msg, file=rel)]


# -- folding ---------------------------------------------------------------------------------


def _per_tensor(code: Code, items: list[_Item], what: str) -> list[Finding]:
    """One finding per tensor under the fold policy, then one summary of the rest (with the
    layers they are in). Messages are only built for the tensors listed."""
    if not items:
        return []

    def detail(_group: str | None, item: _Item) -> Finding:
        fqn, file, message = item
        ((layer, expert),) = layer_expert_numbers([fqn])
        return make_finding(code, message(), file=file, tensor=fqn, layer=layer, expert=expert)

    def summary(_group: str | None, rest: Sequence[_Item], _shown: int) -> Finding:
        names = [fqn for fqn, _, _ in rest]
        parsed = parse_names(names)
        where = np.unique(parsed.layer[(parsed.layer >= 0) & ~parsed.mtp]).tolist()
        in_layers = f" (layers {fold_ranges(where)})" if where else ""
        return make_finding(
            code, f"{len(rest):,} more tensors {what}: {examples(names)}{in_layers}"
        )

    return fold(items, detail, summary)
