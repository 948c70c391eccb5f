"""Checkpoints that are not DCP-sharded, as consolidation sources: every tensor one chunk
(`as_single_chunks`, also for re-sharding and restoring), and a PyTorch `.bin` checkpoint
(`bin_source`), whose strided views and shared storages must become safetensors' contiguous,
unshared tensors. The rule for views and tied names (safetensors' `save_model`): docs/formats.md,
"PyTorch .bin".
"""

from __future__ import annotations

import dataclasses
import re
from collections import defaultdict
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from inspector._internal.checkpoint.loaded import stale_copies
from inspector._internal.checkpoint.naming_rules import BIN_SHARD_NUMBER
from inspector._internal.checkpoint.scanned import (
    DcpChunk,
    DcpInfo,
    LayoutName,
    PytorchBinInfo,
    ScannedCheckpoint,
)
from inspector._internal.checks.index import check_index_of
from inspector._internal.common.display import legible
from inspector._internal.common.filenames import INDEX_SUFFIX, JOURNAL, LOCK, MANIFEST_NAME
from inspector._internal.common.text import examples, plural
from inspector._internal.findings.codes import Code
from inspector._internal.findings.words import refusal_digest
from inspector._internal.formats.bin_shard import strides_of
from inspector._internal.plans.consolidate.records import not_copied
from inspector._internal.storage import EntryKind
from inspector.errors import PlanRefusedError

__all__ = ["BinSource", "as_single_chunks", "bin_source"]

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
