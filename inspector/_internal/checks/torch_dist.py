"""Megatron torch_dist: do the `.distcp` files hold what `.metadata` stores, do the chunks
cover every tensor, does the common state agree with the sharded metadata, is
`metadata.json` the torch_dist one? Pure. Codes: the `torch-dist-*` rows of
docs/findings.md, and `check-budget-exceeded` for chunks no budgeted check can prove;
unreadable files are the reader's problems (`checks.files`).
"""

from __future__ import annotations

import itertools
import math
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from inspector._internal.checkpoint.naming import layer_expert_numbers, sharded_object_key
from inspector._internal.checkpoint.naming_rules import DISTCP_FILE, RERUN_SHARD_KEY
from inspector._internal.checkpoint.scanned import PickledObject, ScannedCheckpoint, TorchDistInfo
from inspector._internal.checks.coverage import MAX_CELLS, Chunk, coverage
from inspector._internal.common.display import legible
from inspector._internal.common.text import examples, fold_ranges, short_repr
from inspector._internal.common.units import format_count
from inspector._internal.findings.codes import Code, code_set
from inspector._internal.findings.finding import FOLD, Finding, fold, make_finding
from inspector._internal.layouts.torch_dist import METADATA_FILE, METADATA_JSON, RERUN_PREFIX

__all__ = ["CODES", "check_torch_dist", "chunk_coverage"]

CODES = code_set(
    Code.TORCH_DIST_MISSING_FILE,
    Code.TORCH_DIST_CHUNK_GAP,
    Code.TORCH_DIST_CHUNK_OVERLAP,
    Code.TORCH_DIST_COMMON_DRIFT,
    Code.TORCH_DIST_OBJECT_INCOMPLETE,
    Code.TORCH_DIST_METADATA_JSON,
    Code.CHECK_BUDGET_EXCEEDED,
)


def check_torch_dist(scanned: ScannedCheckpoint) -> list[Finding]:
    """Drift checks of a torch_dist checkpoint, from scanned data only (no IO)."""
    info = scanned.torch_dist
    if info is None:
        return []
    drift = _check_common_drift(info)
    # The drift finding already names the rerun shards the common state needs.
    judged = {RERUN_PREFIX.rstrip("/")} if drift else set()
    return [
        *_check_files(info),
        *_check_chunks(info),
        *drift,
        *_check_objects(info, skip=judged),
        *_check_metadata_json(scanned, info),
    ]


def _rel(prefix: str, name: str) -> str:
    return f"{prefix}/{name}" if prefix else name


def _meta_rel(info: TorchDistInfo) -> str:
    return _rel(info.iteration_dir, METADATA_FILE)


# -- files -----------------------------------------------------------------------------------


# Chunk lists longer than this are looked up by distinct offsets (`_check_files`).
_SHORT_LIST = 64


def _check_files(info: TorchDistInfo) -> list[Finding]:
    """Storage records pointing into missing or short `.distcp` files, and chunks that have
    no storage record at all."""
    # 1. The furthest byte each file must hold (one pass; details only for bad files).
    ends: dict[str, int] = {}
    for file, start, length in info.storage.values():
        if ends.get(file, -1) < start + length:
            ends[file] = start + length
    bad = {f for f, end in ends.items() if info.distcp_sizes.get(f, -1) < end}
    found = [_file_finding(file, info) for file in sorted(bad)]
    # 2. Chunks and objects the metadata lists but stores nowhere: counted, and only the few
    # a message names kept (tensors may share a chunk list of 300,000 entries).
    storage = info.storage
    keep = FOLD.per_file + 3
    missing: list[tuple[str, tuple[int, ...]]] = []
    count = 0
    listed = (
        *((fqn, tensor.chunks) for fqn, tensor in info.tensors.items()),
        *((key, (((), ()),)) for key in info.byte_keys),
    )
    # A long chunk list is looked up once per distinct offsets (with how often each is
    # listed), and counted once for all the tensors that share it.
    offsets_of: dict[int, Counter[tuple[int, ...]]] = {}
    for fqn, chunks in listed:
        pairs: Iterable[tuple[tuple[int, ...], int]]
        if len(chunks) > _SHORT_LIST:
            if id(chunks) not in offsets_of:
                offsets_of[id(chunks)] = Counter(offsets for offsets, _ in chunks)
            pairs = offsets_of[id(chunks)].items()
        else:
            pairs = ((offsets, 1) for offsets, _ in chunks)
        for offsets, times in pairs:
            if (fqn, offsets) not in storage:
                count += times
                if len(missing) < keep:
                    missing.append((fqn, offsets))
    rel = _meta_rel(info)

    def detail(_file: str | None, item: tuple[str, tuple[int, ...]]) -> Finding:
        fqn, offsets = item
        msg = (
            f"{legible(fqn)}: the chunk at offsets {tuple(offsets)} has no storage record in "
            f"{legible(rel)}, "
            "so no .distcp file holds its bytes; the save was incomplete: re-save the checkpoint"
        )
        return _tensor_finding(Code.TORCH_DIST_MISSING_FILE, msg, rel, fqn)

    summary = _summary(Code.TORCH_DIST_MISSING_FILE, rel, "chunks without storage", total=count)
    return found + fold(missing, detail, summary)


def _tensor_finding(code: Code, message: str, file: str, fqn: str) -> Finding:
    ((layer, expert),) = layer_expert_numbers([fqn])
    return make_finding(code, message, file=file, tensor=fqn, layer=layer, expert=expert)


def _summary(
    code: Code, file: str, what: str, *, total: int | None = None
) -> Callable[[str | None, Sequence[Any], int], Finding]:
    """The fold summary; `total` counts every item when only the first few were kept."""

    def summary(_group: str | None, rest: Sequence[Any], shown: int) -> Finding:
        more = len(rest) if total is None else total - shown
        named = examples([item[0] for item in rest[:3]])
        named += f" and {more - 3} more" if more > 3 else ""
        message = f"{more:,} more {what} ({named}), not listed one by one"
        return make_finding(code, message, file=file)

    return summary


def _file_finding(file: str, info: TorchDistInfo) -> Finding:
    entries = [(fqn, s + n) for (fqn, _), (f, s, n) in info.storage.items() if f == file]
    names = sorted({fqn for fqn, _ in entries})
    size = info.distcp_sizes.get(file)
    if size is None:
        msg = (
            f"{legible(file)} is missing; {_meta_rel(info)} stores {len(entries)} entries there "
            f"({examples(names)}); restore the file from the original save"
        )
        return make_finding(Code.TORCH_DIST_MISSING_FILE, msg, file=file)
    past = sorted({fqn for fqn, end in entries if end > size})
    end = max(e for _, e in entries)
    msg = (
        f"{legible(file)} is {size:,} bytes but {_meta_rel(info)} stores data up to byte {end:,}; "
        f"{len(past)} entries lie past the end ({examples(past)}): the file was truncated "
        "(interrupted copy or save?); restore it from the original save"
    )
    return make_finding(Code.TORCH_DIST_MISSING_FILE, msg, file=file)


# -- chunks ----------------------------------------------------------------------------------


def _check_chunks(info: TorchDistInfo) -> list[Finding]:
    found: dict[Code, list[tuple[str, str]]] = defaultdict(list)
    rel = _meta_rel(info)
    # Tensors sharded alike share one result: a `.metadata` may give many tensors one chunk
    # list (the pickle memo repeats it for a few bytes; the reader keeps it one object),
    # which is then judged once, and found by identity before it is hashed.
    known: dict[tuple[tuple[int, ...], tuple[Chunk, ...]], tuple[Code, str] | None] = {}
    same: dict[tuple[tuple[int, ...], int], tuple[Code, str] | None] = {}
    for fqn, tensor in info.tensors.items():
        at = (tensor.size, id(tensor.chunks))
        if at not in same:
            key = (tensor.size, tensor.chunks)
            if key not in known:
                known[key] = chunk_coverage(tensor.size, tensor.chunks)
            same[at] = known[key]
        result = same[at]
        if result is not None:
            code, what = result
            found[code].append((fqn, what))

    def detail(code: Code) -> Callable[[str | None, tuple[str, str]], Finding]:
        def build(_group: str | None, item: tuple[str, str]) -> Finding:
            fqn, what = item
            msg = (
                f"{legible(fqn)}: the chunks in {legible(rel)} {what}; the save lost or duplicated "
                "part of this tensor: re-save the checkpoint from a run that holds all ranks"
            )
            return _tensor_finding(code, msg, rel, fqn)

        return build

    def unverified(_group: str | None, item: tuple[str, str]) -> Finding:
        fqn, what = item
        msg = (
            f"{fqn}: the chunks in {rel} {what}; whether they cover it exactly once is NOT "
            "verified. No real save shards a tensor like this: the file was crafted or is "
            "corrupt, re-save the checkpoint"
        )
        return _tensor_finding(Code.CHECK_BUDGET_EXCEEDED, msg, rel, fqn)

    gap, overlap = Code.TORCH_DIST_CHUNK_GAP, Code.TORCH_DIST_CHUNK_OVERLAP
    budget = Code.CHECK_BUDGET_EXCEEDED
    return [
        *fold(found[gap], detail(gap), _summary(gap, rel, "tensors with uncovered regions")),
        *fold(
            found[overlap],
            detail(overlap),
            _summary(overlap, rel, "tensors with overlapping chunks"),
        ),
        *fold(
            found[budget],
            unverified,
            _summary(budget, rel, "tensors whose chunks were not verified"),
        ),
    ]


def chunk_coverage(size: tuple[int, ...], chunks: Iterable[Chunk]) -> tuple[Code, str] | None:
    """None when the chunks tile `size` exactly; else (code, what is wrong), worded for a
    torch_dist message ("the chunks in .metadata <what>")."""
    chunks = list(chunks)
    result = coverage(size, chunks)
    # Sizes come from an untrusted .metadata (a hostile one may have 400 axes of 2**40):
    # shown bounded, counts never printed digit by digit.
    shown = short_repr(size)
    if result.outside is not None:
        offsets, sizes = chunks[result.outside]
        return Code.TORCH_DIST_CHUNK_GAP, (
            f"include offsets {short_repr(offsets)} with sizes {short_repr(sizes)}, outside the "
            f"global size {shown}"
        )
    total = result.total
    if not result.verified:
        return Code.CHECK_BUDGET_EXCEEDED, (
            f"({len(chunks):,} listed) form no grid the check could follow within its budget "
            f"(at most {MAX_CELLS:,} cells); they hold as many elements as the global size "
            f"{shown}"
        )
    if result.complete:
        return None
    if not result.exact:
        if result.volume < total:
            return Code.TORCH_DIST_CHUNK_GAP, (
                f"cover at most {format_count(result.volume)} of the {format_count(total)} "
                f"elements of the global size {shown}"
            )
        return Code.TORCH_DIST_CHUNK_OVERLAP, (
            f"hold {format_count(result.volume)} elements for a global size {shown} of "
            f"{format_count(total)}: chunks overlap"
        )
    if result.covered < total:
        hole = result.holes[0]
        at = tuple(a for a, _ in hole)
        extent = tuple(b - a for a, b in hole)
        return Code.TORCH_DIST_CHUNK_GAP, (
            f"cover {result.covered:,} of the {total:,} elements of the global size {size}; "
            f"e.g. the block at offsets {at} with sizes {extent} is in no chunk"
        )
    return Code.TORCH_DIST_CHUNK_OVERLAP, (
        f"overlap: {result.multiple:,} elements of the global size {size} are in more than one "
        f"chunk, e.g. at offsets {result.overlap_at}"
    )


# -- common-state drift (seed megatron-4448) ------------------------------------------------
#
# Keys relied on (Megatron-LM `RerunStateMachine.state_dict` and `save_checkpoint`):
#   common["rerun_state_machine"] = {"mode": RerunMode, "state": RerunState,
#                                    "current_iteration": int}  (newer: rank state sharded as
#   `rerun_state_machine_state/shard_{rank}_{world_size}`); older versions kept only "mode"
#   in common and sharded per (pp, tp) as `rerun_state_machine_state/shard_{pp}.{tp}_{PP}.{TP}`.
#   common["args"].world_size / tensor_model_parallel_size / pipeline_model_parallel_size.
# RerunState.NOT_RUNNING_YET == 0 and RerunMode.DISABLED == "disabled" mean nothing to restore.


def _check_common_drift(info: TorchDistInfo) -> list[Finding]:
    rerun = _field(info.common, "rerun_state_machine")
    if not isinstance(rerun, dict) or _enum(rerun.get("mode")) in (None, "disabled"):
        return []
    state = _enum(rerun.get("state"))
    if "state" in rerun and state in (0, "NOT_RUNNING_YET", None):
        return []
    present = {k[len(RERUN_PREFIX) :] for k in info.byte_keys if k.startswith(RERUN_PREFIX)}
    expected: Mapping[str, Any]
    if "state" in rerun:
        world = _world_size(info, present)
        expected = {f"shard_{r}_{world}": r for r in range(world)} if world else {}
    else:
        expected = _pp_tp_grid(info.common)
    lost = sorted(rank for shard, rank in expected.items() if shard not in present)
    if present and not lost:
        return []
    return [
        _drift_finding(info, rerun, state, world_size=len(expected), lost=lost, present=present)
    ]


def _drift_finding(
    info: TorchDistInfo, rerun: dict, state: Any, *, world_size: int, lost: list, present: set
) -> Finding:
    common = info.common_file or "the common state"
    # Values from the common state are untrusted: shown bounded, never str() of a whole tree.
    said = f"mode {short_repr(_enum(rerun.get('mode')), limit=60)}"
    if "state" in rerun:
        iteration = short_repr(rerun.get("current_iteration"), limit=40)
        said += f", state {_state_name(state)}, iteration {iteration}"
    if not present:
        has = f"has no {RERUN_PREFIX}shard_* entries"
    else:
        has = f"has {len(present)} {RERUN_PREFIX}shard_* entries"
    if lost and isinstance(lost[0], int):
        ranks = "rank" if len(lost) == 1 else "ranks"
        want = f"{ranks} {fold_ranges(lost)} missing ({len(lost)} of {world_size})"
    elif lost:
        shown = examples([str(x) for x in lost])
        want = f"(pp, tp) shards {shown} missing ({len(lost)} of {world_size})"
    else:
        want = "world size unknown, expected one per rank"
    key = f"{RERUN_PREFIX}shard_X_{world_size}" if world_size else f"{RERUN_PREFIX}shard_*"
    msg = (
        f"{common} says the rerun state machine is active ({said}) but {_meta_rel(info)} {has} "
        f"({want}); loading fails with 'Missing key in checkpoint state_dict: {key}'. "
        "The save reused a cached plan (--ckpt-assume-constant-structure): load with "
        "--rerun-mode disabled, or re-save with a Megatron that always emits the rerun state"
    )
    return make_finding(Code.TORCH_DIST_COMMON_DRIFT, msg, file=info.common_file or _meta_rel(info))


def _field(obj: Any, name: str) -> Any:
    """`obj[name]` of a dict, or the attribute of a pickled object (e.g. a Namespace)."""
    if isinstance(obj, Mapping):
        return obj.get(name)
    if isinstance(obj, PickledObject) and isinstance(obj.state, dict):
        return obj.state.get(name)
    return getattr(obj, name, None) if obj is not None and not isinstance(obj, (str, int)) else None


def _enum(value: Any) -> Any:
    """An enum member's value, whether pickled (Megatron not installed) or plain."""
    if isinstance(value, PickledObject):
        return value.args[0] if len(value.args) == 1 else None
    return getattr(value, "value", value)


_RERUN_STATES = {
    0: "NOT_RUNNING_YET",
    1: "INITIAL_RUN",
    2: "RERUNNING_IN_PLACE",
    3: "WILL_RERUN_FROM_CHECKPOINT",
    4: "RERUNNING_FROM_CHECKPOINT",
    5: "RERUNNING_AGAIN_FROM_CHECKPOINT",
}


def _state_name(state: Any) -> str:
    return _RERUN_STATES.get(state, str(state)) if isinstance(state, int) else short_repr(state)


def _world_size(info: TorchDistInfo, present: set[str]) -> int | None:
    """From `args.world_size`, else from existing shard keys, else from `__{rank}_*.distcp`."""
    world = _field(_field(info.common, "args"), "world_size")
    if type(world) is int and world > 0:
        return world
    sizes = {int(m.group(2)) for k in present if (m := RERUN_SHARD_KEY.fullmatch(k))}
    if len(sizes) == 1:
        return sizes.pop()
    ranks = {int(m.group(1)) for f in info.distcp_sizes if (m := DISTCP_FILE.search(f))}
    return max(ranks) + 1 if ranks else None


def _pp_tp_grid(common: Any) -> dict[str, tuple[int, int]]:
    """Older Megatron: one rerun shard per (pp, tp) rank pair, from `args`."""
    args = _field(common, "args")
    pp = _field(args, "pipeline_model_parallel_size")
    tp = _field(args, "tensor_model_parallel_size")
    if not (type(pp) is int and type(tp) is int and pp > 0 and tp > 0):
        return {}
    return {f"shard_{p}.{t}_{pp}.{tp}": (p, t) for p in range(pp) for t in range(tp)}


# -- sharded objects ------------------------------------------------------------------------
#
# A Megatron ShardedObject is saved as one bytes entry per shard, keyed
# `{key}/shard_{offsets}_{global shape}` (replicas share a key, so each offset appears once).
# megatron-core's own sharding validation demands every offset of the grid: a family that
# declares a grid (e.g. `rerun_state_machine_state/shard_{rank}_{world size}`) must hold all
# of its cells, whatever the common state says.

# Grid cells visited at most when looking for examples of missing shards (a hostile key may
# declare a grid of 10**18 cells).
_GRID_WALK = 100_000


def _check_objects(info: TorchDistInfo, *, skip: set[str]) -> list[Finding]:
    grids: defaultdict[tuple[str, tuple[int, ...]], set[tuple[int, ...]]] = defaultdict(set)
    for key in info.byte_keys:
        parsed = sharded_object_key(key)
        if parsed is not None and parsed[0] not in skip:
            family, offsets, shape = parsed
            grids[(family, shape)].add(offsets)
    incomplete = []
    for (family, grid), cells in sorted(grids.items()):
        inside = {c for c in cells if all(a < b for a, b in zip(c, grid, strict=True))}
        if len(inside) < math.prod(grid):
            incomplete.append((family, grid, inside))
    rel = _meta_rel(info)

    def detail(_group: str | None, item: tuple[str, tuple[int, ...], set]) -> Finding:
        family, shape, inside = item
        total = math.prod(shape)
        lost = [_object_key(family, cell, shape) for cell in _missing_cells(shape, inside)]
        msg = (
            f"{legible(family)}: its keys declare a grid of {format_count(total)} shards (global "
            f"shape {_dotted(shape)}) but {legible(rel)} lists {len(inside):,}; missing "
            f"{examples(lost)} ({format_count(total - len(inside))} of {format_count(total)}). "
            "The ranks that own them fail to load ('Missing key in checkpoint state_dict'); "
            "the save lost them: restore the lost ranks' objects from the original save, or "
            "re-save"
        )
        return make_finding(Code.TORCH_DIST_OBJECT_INCOMPLETE, msg, file=rel, tensor=lost[0])

    def summary(_group: str | None, rest: Sequence[Any], _shown: int) -> Finding:
        families = [item[0] for item in rest]
        message = (
            f"{len(rest):,} more sharded objects lack shards of their declared grid "
            f"({examples(families)}), not listed one by one"
        )
        return make_finding(Code.TORCH_DIST_OBJECT_INCOMPLETE, message, file=rel)

    return fold(incomplete, detail, summary)


def _missing_cells(shape: tuple[int, ...], present: set[tuple[int, ...]]) -> list[tuple[int, ...]]:
    """A few grid cells absent from `present`, in order (bounded walk; at least one)."""
    out = []
    for cell in itertools.islice(itertools.product(*map(range, shape)), _GRID_WALK):
        if cell not in present:
            out.append(cell)
            if len(out) > 3:
                break
    # Only past the walk can a large grid hide its holes: name the shape instead.
    return out or [tuple(-1 for _ in shape)]


def _dotted(values: tuple[int, ...]) -> str:
    return ".".join(map(str, values))


def _object_key(family: str, cell: tuple[int, ...], shape: tuple[int, ...]) -> str:
    at = _dotted(cell) if min(cell, default=0) >= 0 else "?"
    return f"{family}/shard_{at}_{_dotted(shape)}"


# -- metadata.json ------------------------------------------------------------------------


def _check_metadata_json(scanned: ScannedCheckpoint, info: TorchDistInfo) -> list[Finding]:
    rel = _rel(info.iteration_dir, METADATA_JSON)
    if rel in scanned.json_files and info.metadata_json is None:
        return []  # unreadable: already a scan problem
    if not info.tensors and not info.byte_keys and not info.distcp_sizes:
        return []  # nothing of the checkpoint was found; the scan problems say why
    if info.metadata_json is None:
        msg = (
            f"{legible(rel)} is missing; Megatron needs it to recognise a torch_dist checkpoint: "
            'write {"sharded_backend": "torch_dist", "sharded_backend_version": 1, '
            '"common_backend": "torch", "common_backend_version": 1}'
        )
        return [make_finding(Code.TORCH_DIST_METADATA_JSON, msg, file=rel)]
    backend = info.metadata_json.get("sharded_backend")
    if backend != "torch_dist":
        msg = (
            f"{legible(rel)} says sharded_backend '{legible(backend)}', but the folder holds a DCP "
            "torch_dist "
            "checkpoint (.metadata and .distcp files); expected 'torch_dist': fix the file "
            "or Megatron will load it with the wrong strategy"
        )
        return [make_finding(Code.TORCH_DIST_METADATA_JSON, msg, file=rel)]
    return []
