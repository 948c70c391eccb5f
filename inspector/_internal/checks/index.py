"""Index drift: `model.safetensors.index.json` against the shard headers. Pure functions.

Codes (docs/findings.md): index-missing-file, index-dangling-tensor, index-wrong-file,
unindexed-tensor, unindexed-file, duplicate-tensor, total-size-mismatch,
total-parameters-mismatch. Built so that a checkpoint with 300,000 drifted tensors stays
readable (one finding per missing shard or file, the rest folded) and the usual path costs
one C-level lookup per tensor; the reporting policy: docs/architecture.md, "checks/".
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from itertools import chain, filterfalse, repeat
from typing import TYPE_CHECKING

import numpy as np

from inspector._internal.checkpoint.loaded import (
    WEIGHTS_KEY,
    Kept,
    NamedWeights,
    alone,
    kept_in,
    named_weights,
    read_order,
)
from inspector._internal.checkpoint.naming import layer_expert_numbers
from inspector._internal.checkpoint.parameters import (
    Uncounted,
    parse_count,
    scan_uncounted,
)
from inspector._internal.checkpoint.places import describe_names
from inspector._internal.checkpoint.scanned import IndexDoc, LayoutName, ScannedCheckpoint
from inspector._internal.checkpoint.tensor_shards import (
    HeldTensors,
    held_of,
    held_tensors,
    normalize_member,
    normalized,
)
from inspector._internal.common.display import legible
from inspector._internal.common.filenames import CONFIG_NAME, role_of
from inspector._internal.common.text import examples, plural, short_repr
from inspector._internal.common.units import format_count
from inspector._internal.findings.codes import Code, code_set
from inspector._internal.findings.finding import (
    FOLD,
    Finding,
    FoldPolicy,
    besides,
    fold,
    make_finding,
)
from inspector._internal.formats.safetensors import ShardHeader

if TYPE_CHECKING:
    from inspector._internal.load.verdict import LoadVerdict

__all__ = [
    "CODES",
    "DETAIL_PER_FILE",
    "LAYOUTS",
    "MODEL_CODES",
    "check_duplicates",
    "check_index",
    "check_index_of",
    "fold_tensor_issues",
    "reconcile_total_parameters",
    "reconcile_with_model",
    "unlisted_names",
]

CODES = code_set(
    Code.INDEX_MISSING_FILE,
    Code.INDEX_DANGLING_TENSOR,
    Code.INDEX_WRONG_FILE,
    Code.UNINDEXED_TENSOR,
    Code.UNINDEXED_FILE,
    Code.DUPLICATE_TENSOR,
    Code.TOTAL_SIZE_MISMATCH,
    Code.TOTAL_PARAMETERS_MISMATCH,
)
# The layouts the index rule runs on (`inspector._internal.checks.registry`).
LAYOUTS = frozenset({LayoutName.HF_SHARDED, LayoutName.MODELOPT_PER_LAYER, LayoutName.PYTORCH_BIN})
# What the model rule `reconcile_with_model` may revise.
MODEL_CODES = code_set(Code.TOTAL_PARAMETERS_MISMATCH)
# Tensors listed one by one per file (the fold policy's), for callers that word around it.
DETAIL_PER_FILE = FOLD.per_file


def check_index_of(scanned: ScannedCheckpoint) -> list[Finding]:
    """The index rule: `check_index` on a scan."""
    held = held_of(scanned)  # first: the parameter count then knows whether names repeat
    not_counted = None
    if scanned.index is not None and "total_parameters" in scanned.index.metadata:
        not_counted = scan_uncounted(scanned)
    findings = check_duplicates(held, index=scanned.index, named=named_weights(scanned))
    if scanned.index is None:
        return findings
    return findings + _index_findings(_view_of(scanned), not_counted, FOLD)


def unlisted_names(scanned: ScannedCheckpoint) -> list[str]:
    """The names the readable shards hold that the index does not list, sorted, each once
    ([] without an index). From the index rule's view of the shards, kept with the scan: the
    issue grouping asks again after the rule, and a lookup of every shard name in the index's
    names cost a tenth of a second at 300,000 tensors."""
    index = scanned.index
    if index is None:
        return []
    if scanned.layout in LAYOUTS and len(held_of(scanned).shards) == len(scanned.shards):
        view = _view_of(scanned)
        return sorted({n for s in view.held.shards if s.readable for n in view.unlisted(s)})
    # Where the rule does not run (its view would cost more than this walk), or a file is
    # listed twice (`held_tensors` keeps one): every readable shard's names are asked.
    held = chain.from_iterable(s.names for s in scanned.shards if s.readable)
    return sorted(set(filterfalse(index.name_set().__contains__, held)))


def _view_of(scanned: ScannedCheckpoint) -> _IndexView:
    """The `_IndexView` of a scan with an index, built once."""
    index = scanned.index
    assert index is not None
    return scanned.derived("index-view", lambda: _IndexView.of(index, held_of(scanned)))


def check_named_weights(scanned: ScannedCheckpoint) -> list[Finding]:
    """weights-named-by-config: config.json's `transformers_weights` (`checkpoint.loaded.
    named_weights`) decides what transformers reads, and other loaders ignore it."""
    named = named_weights(scanned)
    if named is None:
        return []
    value = short_repr(named.value) if not isinstance(named.value, str) else named.value
    said = f"{CONFIG_NAME}'s {WEIGHTS_KEY} is '{legible(value)}'"
    if named.problem is not None:
        msg = (
            f"{said}: {named.problem}; no tensor of this folder is taken as loaded, so no "
            "verdict here covers what transformers would read"
        )
        return [make_finding(Code.WEIGHTS_NAMED_BY_CONFIG, msg, file=CONFIG_NAME)]
    files = ", ".join(legible(s.file) for s in named.shards[:3])
    more = f" and {len(named.shards) - 3:,} more" if len(named.shards) > 3 else ""
    msg = (
        f"{said}: transformers reads {files}{more} and nothing else, whatever "
        "model.safetensors or the index say; huggingface_hub, vLLM and other loaders ignore "
        "the entry and read other files; the checks, verify and the load check here follow "
        "transformers"
    )
    return [make_finding(Code.WEIGHTS_NAMED_BY_CONFIG, msg, file=CONFIG_NAME)]


def check_index(
    shards: Sequence[ShardHeader],
    index: IndexDoc | None,
    *,
    held: HeldTensors | None = None,
    not_counted: Uncounted | None = None,
    policy: FoldPolicy = FOLD,
    named: NamedWeights | None = None,
) -> list[Finding]:
    """All index-against-shards findings; only duplicates when there is no index.

    `held` (from `held_tensors(shards)`) may be passed to share it with other checks;
    `not_counted` (from `uncounted_elements`) tells the writers' ways of counting
    `total_parameters` apart (without it, only every stored element is accepted); `named`:
    the weights config.json names (`checkpoint.loaded.named_weights`), which decide the copy
    transformers keeps."""
    held = held or held_tensors(shards)
    findings = check_duplicates(held, index=index, policy=policy, named=named)
    if index is None:
        return findings
    return findings + _index_findings(_IndexView.of(index, held), not_counted, policy)


def _index_findings(
    view: _IndexView, not_counted: Uncounted | None, policy: FoldPolicy
) -> list[Finding]:
    """Every finding of the index against the shards but the duplicates (`check_index`)."""
    index, held = view.index, view.held
    if view.agrees():
        return _total_findings(index, held, _Drift(), not_counted or Uncounted())
    drift = _Drift()
    findings: list[Finding] = []
    findings += _indexed_file_findings(index.file, view, held, drift, policy)
    findings += _listed_tensor_findings(index.file, view, held, drift, policy)
    findings += _unlisted_findings(index.file, view, held, drift, policy)
    findings += _total_findings(index, held, drift, not_counted or Uncounted())
    return findings


# -- the index seen from the shards, computed once ------------------------------------------


@dataclass(frozen=True)
class _IndexView:
    """What the index says of each file, worked out from its file codes.

    `listed` counts the entries per (normalised) file; `hits[file]` how many names of the
    held shard `file` the index maps back to it. A file whose `hits` equal its `listed` count
    (and whose names are distinct) holds every entry the index gives it, so it needs no
    per-name walk. When no name is held twice, both come from one C-level lookup per index
    name in the held map and array counts: no dict of the index, no lookup per shard name.
    Otherwise (`by_name`) each shard name is looked up in the normalised weight map.
    """

    index: IndexDoc
    held: HeldTensors
    files: list[str]  # the normalised file of each file code
    listed: dict[str, int]
    hits: dict[str, int]
    # Distinct names: per held shard, how many of its names the index lists (to any file).
    listed_of: dict[str, int]
    # Names held twice: per held shard, the index's file for each of its names (None: none).
    by_name: dict[str, list[str | None]] | None

    @classmethod
    def of(cls, index: IndexDoc, held: HeldTensors) -> _IndexView:
        files = [normalize_member(f) for f in index.files.values]
        listed: dict[str, int] = {}
        per_code = np.bincount(index.files.codes, minlength=len(files)).tolist()
        for file, count in zip(files, per_code, strict=True):
            if count:
                listed[file] = listed.get(file, 0) + count
        if not held.distinct:
            wmap = normalized(index.lookup_map())
            by_name = {s.file: list(map(wmap.get, s.names)) for s in held.shards}
            hits = {file: got.count(file) for file, got in by_name.items()}
            return cls(index, held, files, listed, hits, {}, by_name)
        position = {s.file: i for i, s in enumerate(held.shards)}
        shard_of_code = np.asarray([position.get(f, -1) for f in files] or [-1], np.int64)
        holder = _holders(index.names, held)
        expected = shard_of_code[index.files.codes] if len(holder) else holder
        back = expected[(holder == expected) & (expected >= 0)]
        n = len(held.shards)
        hit_counts = np.bincount(back, minlength=n).tolist()
        listed_counts = np.bincount(holder[holder >= 0], minlength=n).tolist()
        names = [s.file for s in held.shards]
        return cls(
            index,
            held,
            files,
            listed,
            dict(zip(names, hit_counts, strict=True)),
            dict(zip(names, listed_counts, strict=True)),
            None,
        )

    def agrees(self) -> bool:
        """True when the index and the shards agree entry for entry, so that only the totals
        are left to check: every shard readable, well formed and named by the index (and no
        other file), no name held twice, and every name of each shard mapped back to it. A
        healthy index then needs no walk at all."""
        held = self.held
        if self.by_name is not None or held.unreadable or any(held.invalid.values()):
            return False
        return self.listed.keys() == held.by_file.keys() and all(
            self.listed[s.file] == self.hits[s.file] == len(s.names) for s in held.shards
        )

    def names_at(self, files: set[str]) -> dict[str, list[str]]:
        """The names the index maps to each of `files`, in index order."""
        if not files:
            return {}
        groups: dict[str, list[str]] = {f: [] for f in files}
        codes = [c for c, f in enumerate(self.files) if f in files]
        rows = np.flatnonzero(np.isin(self.index.files.codes, codes))
        names = self.index.names
        for row, code in zip(rows.tolist(), self.index.files.codes[rows].tolist(), strict=True):
            groups[self.files[code]].append(names[row])
        return groups

    def unlisted(self, shard: ShardHeader) -> list[str]:
        """The names of `shard` the index does not list, in header order."""
        if self.by_name is not None:
            got = self.by_name[shard.file]
            if None not in got:
                return []
            return [n for n, g in zip(shard.names, got, strict=True) if g is None]
        listed_here = self.listed_of[shard.file]
        if listed_here == len(shard.names):
            return []
        if not listed_here:
            # No name of it is in the index (names are distinct here): all of them, without
            # a set of the index's names (0.09 s at a million tensors).
            return list(shard.names)
        own = self._own_entries.get(shard.file)
        if own is not None:
            return [n for n in shard.names if n not in own]
        listed = self.index.name_set()
        return [n for n in shard.names if n not in listed]

    @cached_property
    def _own_entries(self) -> dict[str, set[str]]:
        """Per partly listed shard whose listed names the index maps to it alone (its hits
        are all it has listed; names are distinct), the names of its own entries: the rest
        of its names are unlisted. One pass over the index for all of them."""
        files = {
            s.file
            for s in self.held.shards
            if 0 < self.listed_of[s.file] == self.hits[s.file] < len(s.names)
        }
        return {file: set(names) for file, names in self.names_at(files).items()}


# -- facts gathered while checking, for the totals' explanations ----------------------------


class _Drift:
    """Counts the per-tensor checks leave behind for the totals' explanations."""

    def __init__(self) -> None:
        self.unindexed_bytes = 0
        self.unindexed_numel = 0
        self.unindexed_count = 0
        self.unheld_count = 0
        self.unknown_files: list[str] = []


# -- step 1: each file the index names -------------------------------------------------------


def _indexed_file_findings(
    index_file: str, view: _IndexView, held: HeldTensors, drift: _Drift, policy: FoldPolicy
) -> list[Finding]:
    """index-missing-file for absent shards (a hostile index naming thousands of files gets
    `policy.per_code` findings and one summary); one note for each unreadable shard."""
    total = policy.per_code
    findings = []
    absent: list[str] = []
    unheld = {f for f in view.listed if f not in held.by_file or not held.by_file[f].readable}
    listed = view.names_at(unheld)
    for file, names in sorted(listed.items()):
        shard = held.by_file.get(file)
        if shard is None:
            drift.unheld_count += len(names)
            role = role_of(file)
            if role is not None:
                findings.append(_not_a_shard(index_file, file, role, names, held))
                continue
            absent.append(file)
            if len(absent) <= total:
                findings.append(_missing_file(index_file, file, names, held))
        elif not shard.readable:
            drift.unknown_files.append(file)
            msg = (
                f"{legible(index_file)} maps {plural(len(names), 'tensor')} to {legible(file)} "
                f"(e.g. {examples(sorted(names))}), but the header of {legible(file)} cannot "
                "be read "
                f"(see its {shard.findings[0].code if shard.findings else 'header-unreadable'} "
                "finding): "
                "none of them can be loaded or checked, and the index totals were not checked; "
                f"re-copy or re-export {legible(file)}"
            )
            findings.append(make_finding("index-dangling-tensor", msg, file=file))
    rest = absent[total:]
    if rest:
        msg = (
            f"{legible(index_file)} names {plural(len(rest), 'more file')} that are not in the "
            f"folder ({examples(rest)}); regenerate the index (ckpt-inspect repair)"
        )
        findings.append(make_finding("index-missing-file", msg, file=index_file))
    return findings


def _held_elsewhere(names: list[str], held: HeldTensors) -> tuple[int, list[str]]:
    """How many of `names` the readable shards hold, and in which files."""
    elsewhere = [n for n in names if n in held.first]
    return len(elsewhere), sorted({f for n in elsewhere for f in held.holders(n)})


def _not_a_shard(
    index_file: str, file: str, role: str, names: list[str], held: HeldTensors
) -> Finding:
    """index-wrong-file for entries naming a file whose name gives it another role (`role`:
    the config, the index itself): the scan does not read it as a shard, and what is wrong
    is the entry, never the file."""
    count, files = _held_elsewhere(names, held)
    where = f"; the shards hold {count:,} of them ({examples(files)})" if count else ""
    msg = (
        f"{legible(index_file)} maps {plural(len(names), 'tensor')} to {legible(file)} "
        f"(e.g. {examples(sorted(names))}), which is {role}, not a shard: those entries are "
        f"wrong, not {legible(file)}{where}; rebuild the index from the shard headers "
        "(ckpt-inspect repair --only index), which leaves the file as it is"
    )
    return make_finding("index-wrong-file", msg, file=index_file)


def _missing_file(index_file: str, file: str, names: list[str], held: HeldTensors) -> Finding:
    count, files = _held_elsewhere(names, held)
    where = ""
    if count:
        where = (
            f"; {count:,} of them are in other shards ({examples(files)}), so the "
            "shard may have been renamed"
        )
    msg = (
        f"{legible(index_file)} maps {plural(len(names), 'tensor')} to {legible(file)} "
        f"(e.g. {examples(sorted(names))}), but {legible(file)} is not in the checkpoint "
        f"folder{where}; loaders will fail or leave those "
        "weights uninitialised: restore the file, or regenerate the index (ckpt-inspect repair)"
    )
    return make_finding("index-missing-file", msg, file=file)


# -- step 2: each tensor the index lists, in a readable shard -------------------------------


def _listed_tensor_findings(
    index_file: str,
    view: _IndexView,
    held: HeldTensors,
    drift: _Drift,
    policy: FoldPolicy,
) -> list[Finding]:
    """index-wrong-file and index-dangling-tensor, folded per file."""
    wrong: dict[str, list[str]] = {}
    dangling: dict[str, list[str]] = {}
    for file, names in view.names_at(_short_files(view, held)).items():
        present, invalid = held.present(file), held.invalid[file]
        for name in names:
            if name in present or name in invalid:
                continue
            (wrong if name in held.first else dangling).setdefault(file, []).append(name)
    drift.unheld_count += sum(map(len, dangling.values()))
    maybe = _unreadable_note(held)
    wrong_summary = _summary(f"that {legible(index_file)} maps to {{file}} are in other shards")
    dangling_summary = _summary(
        f"that {legible(index_file)} maps to {{file}} are in no shard{maybe}"
    )
    return fold_tensor_issues(
        Code.INDEX_WRONG_FILE, wrong, _wrong_detail(index_file, held), wrong_summary, policy
    ) + fold_tensor_issues(
        Code.INDEX_DANGLING_TENSOR,
        dangling,
        _dangling_detail(index_file, maybe),
        dangling_summary,
        policy,
    )


def _short_files(view: _IndexView, held: HeldTensors) -> set[str]:
    """Readable files the index maps names to that they may not hold: fewer of the shard's
    names point back to it than the index lists there (or its names repeat, so the count
    proves nothing)."""
    short = set()
    for file, listed in view.listed.items():
        shard = held.by_file.get(file)
        if shard is None or not shard.readable:
            continue
        if view.hits[file] != listed or (
            not held.distinct and len(held.present(file)) != len(shard.names)
        ):
            short.add(file)
    return short


def _wrong_detail(index_file: str, held: HeldTensors) -> Callable[[str, str], str]:
    def detail(file: str, name: str) -> str:
        actual = ", ".join(map(legible, held.holders(name)))
        return (
            f"{legible(index_file)} maps '{legible(name)}' to {legible(file)}, which does not "
            f"hold it; it is in {actual}: "
            "loaders will look in the wrong file and fail; point the index at "
            f"{actual} (ckpt-inspect repair)"
        )

    return detail


def _dangling_detail(index_file: str, maybe: str) -> Callable[[str, str], str]:
    def detail(file: str, name: str) -> str:
        return (
            f"{legible(index_file)} maps '{legible(name)}' to {legible(file)}, but no shard "
            f"holds it{maybe}; loaders will "
            "fail or leave it uninitialised: restore the tensor or drop it from the index"
        )

    return detail


def _unreadable_note(held: HeldTensors) -> str:
    unknown = held.unreadable
    if not unknown:
        return ""
    return f" (unless it is in {examples(unknown)}, whose header cannot be read)"


# -- step 3: what the shards hold that the index does not list -------------------------------


def _unlisted_findings(
    index_file: str,
    view: _IndexView,
    held: HeldTensors,
    drift: _Drift,
    policy: FoldPolicy,
) -> list[Finding]:
    """unindexed-tensor in indexed shards; one unindexed-file per file the index never names."""
    unindexed: dict[str, list[str]] = {}
    findings: list[Finding] = []
    single = alone(held.shards, view.index)
    for shard in held.shards:
        missing = view.unlisted(shard)
        _count_unindexed(shard, missing, drift)
        if shard.file not in view.listed:
            findings.append(_unindexed_file(index_file, shard, missing, shard is single))
        elif missing:
            unindexed[shard.file] = missing

    def detail(file: str, name: str) -> str:
        return (
            f"{legible(file)} holds '{legible(name)}', which {legible(index_file)} does not "
            "list: loaders that follow the "
            "index ignore it; add it to the index (ckpt-inspect repair) or remove it"
        )

    summary = _summary(f"in {{file}} are not listed in {legible(index_file)} (loaders ignore them)")
    return findings + fold_tensor_issues(Code.UNINDEXED_TENSOR, unindexed, detail, summary, policy)


def _count_unindexed(shard: ShardHeader, missing: list[str], drift: _Drift) -> None:
    if not missing:
        return
    wanted = set(missing)
    for name, shape, begin, end in zip(
        shard.names, shard.shapes, shard.begins.tolist(), shard.ends.tolist(), strict=True
    ):
        if name in wanted:
            drift.unindexed_bytes += end - begin
            drift.unindexed_numel += math.prod(shape)
    drift.unindexed_count += len(missing)


def _unindexed_file(
    index_file: str, shard: ShardHeader, missing: list[str], read_alone: bool
) -> Finding:
    if not shard.readable:
        content = "tensors that cannot be listed (its header is unreadable)"
    elif not shard.names:
        content = "no tensors"
    else:
        copies = len(shard.names) - len(missing)
        content = f"{plural(len(shard.names), 'tensor')} ({describe_names(shard.names)})"
        if missing:
            content += f", {len(missing):,} of them listed nowhere in the index"
        if copies:
            content += f", {copies:,} of them mapped by the index to other shards"
    if read_alone:  # `checkpoint.loaded.alone`: transformers reads it instead of the index
        msg = (
            f"{legible(shard.file)} holds {content}, but {legible(index_file)} never names "
            f"{legible(shard.file)}: transformers reads {legible(shard.file)} alone while it "
            f"is there and ignores {legible(index_file)}, huggingface_hub's load_torch_model "
            "reads the index's files and not it; move it out, or the index and its shards"
        )
    else:
        msg = (
            f"{legible(shard.file)} holds {content}, but {legible(index_file)} never names "
            f"{legible(shard.file)}: loaders "
            "that follow the index will not read it; add it to the index or move it out"
        )
    return make_finding("unindexed-file", msg, file=shard.file)


# -- duplicates (with or without an index) ----------------------------------------------------


def check_duplicates(
    held: HeldTensors,
    *,
    index: IndexDoc | None,
    policy: FoldPolicy = FOLD,
    named: NamedWeights | None = None,
) -> list[Finding]:
    """duplicate-tensor: one name in several shards; whether the copies agree; which copy
    transformers keeps (`checkpoint.loaded`: the last of the files it reads, whatever the
    name's index entry says; only what config.json names, `named`).

    The finding's `file` is a copy transformers does NOT keep (the first by name).
    """
    if not held.copies:
        return []
    order = read_order(held.shards, index) if named is None else named.shards
    kept = kept_in(order, held.copies)
    groups: dict[str, list[str]] = {}
    for name, idx in held.copies.items():
        files = [held.shards[i].file for i in idx]
        used = kept[name][0].file if name in kept else None
        stray = next((f for f in sorted(files) if f != used), files[0])
        groups.setdefault(stray, []).append(name)
    positions = _positions(held)
    words = _KeptWords(held, index, named)

    def detail(file: str, name: str) -> str:
        return _duplicate_message(name, held, positions, words(name, kept.get(name)))

    summary = _summary("in {file} are also in other shards (duplicates)")
    return fold_tensor_issues(Code.DUPLICATE_TENSOR, groups, detail, summary, policy)


def _positions(held: HeldTensors) -> Callable[[int, str], int]:
    """Entry position of a name in a shard, with each shard's lookup built on first need."""
    cache: dict[int, dict[str, int]] = {}

    def lookup(shard_index: int, name: str) -> int:
        table = cache.get(shard_index)
        if table is None:
            names = held.shards[shard_index].names
            table = cache[shard_index] = {n: i for i, n in enumerate(names)}
        return table[name]

    return lookup


def _duplicate_message(
    name: str, held: HeldTensors, position: Callable[[int, str], int], used: str
) -> str:
    copies = []
    for i in held.copies[name]:
        shard = held.shards[i]
        j = position(i, name)
        copies.append((shard.file, shard.dtype[j], list(shard.shape[j])))
    files = [c[0] for c in copies]
    kinds = {(c[1], tuple(c[2])) for c in copies}
    if len(kinds) == 1:
        agree = f"all copies are {legible(copies[0][1])} {copies[0][2]}"
    else:
        agree = "the copies DIFFER: " + ", ".join(
            f"{legible(f)} has {legible(d)} {s}" for f, d, s in copies
        )
    return (
        f"'{legible(name)}' is in {len(files)} shards ({', '.join(map(legible, files))}); "
        f"{agree}; {used}: keep one copy"
    )


class _KeptWords:
    """Which copy of a duplicated name is loaded, in words: the copy transformers keeps
    (`checkpoint.loaded`), why, and that other loaders may keep another."""

    def __init__(
        self, held: HeldTensors, index: IndexDoc | None, named: NamedWeights | None = None
    ) -> None:
        self.held = held
        self.index = index
        self.named = named
        self.wmap = normalized(index.lookup_map()) if index else {}
        single = alone(held.shards, index)
        self.single = None if single is None else single.file

    def __call__(self, name: str, kept: Kept | None) -> str:
        index, single = self.index, self.single
        file = None if kept is None else kept[0].file
        if self.named is not None:
            reads = f"transformers reads only what config.json's {WEIGHTS_KEY} names"
            if file is None:
                return f"{reads}, which holds no copy: no copy is loaded"
            return f"{reads}, and keeps the copy in {legible(file)}; other loaders ignore it"
        if single is not None:
            reads = f"transformers reads {legible(single)} alone"
            if index is not None:
                reads += f", not the files {legible(index.file)} names"
            if file is None:
                return f"{reads}, and it holds no copy: no copy is loaded"
            if index is None:
                return f"{reads}, and keeps its copy"
            return (
                f"{reads}, and keeps its copy; huggingface_hub's load_torch_model reads "
                f"the files {legible(index.file)} names and may keep another"
            )
        if index is None:
            return (
                "without an index, loaders that read every file in order keep the copy in "
                f"{legible(file or '')}"
            )
        target = self.wmap.get(name)
        if target is None:
            entry = f"{legible(index.file)} lists it nowhere"
        elif target == file:
            entry = f"{legible(index.file)} points to it too"
        else:
            holds = "" if target in self.held.holders(name) else ", which holds no copy"
            entry = f"{legible(index.file)} points to {legible(target)}{holds}"
        if file is None:
            return f"{entry} and names none of these files, so no loader reads any copy"
        return (
            f"transformers keeps the copy in {legible(file)}, the last of the files "
            f"{legible(index.file)} names (it reads them all, in name order, whatever an "
            f"entry says; {entry}); other loaders, such as huggingface_hub's "
            "load_torch_model, may keep another"
        )


# -- step 4: metadata totals ----------------------------------------------------------------


def _total_findings(
    index: IndexDoc, held: HeldTensors, drift: _Drift, not_counted: Uncounted
) -> list[Finding]:
    """total-size-mismatch and total-parameters-mismatch, each with its likeliest cause."""
    if drift.unknown_files or held.unreadable:
        return []
    unique_bytes, unique_numel, copies_bytes, copies_numel = _sizes(held)
    file_sizes = sum(s.file_size for s in held.shards)
    findings = []
    size = _total_size(index, unique_bytes, copies_bytes, file_sizes, drift)
    if size is not None:
        findings.append(size)
    params = _total_parameters(index, unique_numel, copies_numel, drift, not_counted)
    if params is not None:
        findings.append(params)
    return findings


def _sizes(held: HeldTensors) -> tuple[int, int, int, int]:
    """(bytes, elements) of the first copy of every name, then of the other copies.

    Sums over whole columns run in C; only shards holding a later copy of some name are
    walked name by name, to move those entries from the first sums to the second."""
    all_bytes = sum(s.tensor_bytes for s in held.shards)
    all_numel = sum(s.total_numel for s in held.shards)
    copies_bytes = copies_numel = 0
    later = {i for holders in held.copies.values() for i in holders[1:]}
    first = held.first
    for i in sorted(later):
        shard = held.shards[i]
        for name, shape, begin, end in zip(
            shard.names, shard.shapes, shard.begins.tolist(), shard.ends.tolist(), strict=True
        ):
            if first[name] != i:
                copies_bytes += end - begin
                copies_numel += math.prod(shape)
    return all_bytes - copies_bytes, all_numel - copies_numel, copies_bytes, copies_numel


def _total_size(
    index: IndexDoc, unique: int, copies: int, file_sizes: int, drift: _Drift
) -> Finding | None:
    if "total_size" not in index.metadata:
        return None
    stated = parse_count(index.metadata["total_size"])
    head = f"{legible(index.file)} metadata.total_size"
    if stated is None:
        shown = short_repr(index.metadata["total_size"], limit=80)
        msg = f"{head} is {shown}, not a byte count; expected {unique:,}"
        return make_finding("total-size-mismatch", msg, file=index.file)
    if stated == unique:
        return None
    diff = stated - unique
    causes = [
        (
            file_sizes,
            "it equals the sum of the shard FILE sizes (headers included), a convention "
            "some producers use; the tensors themselves weigh less",
        ),
        (
            unique - drift.unindexed_bytes,
            f"it is short by exactly the bytes of the "
            f"{plural(drift.unindexed_count, 'tensor')} the index does not list: the index was "
            "written before they were added",
        ),
        (unique + copies, "it counts every copy of the duplicated tensors"),
    ]
    why = next((text for value, text in causes if value == stated and value != unique), None)
    if why is None and diff > 0 and drift.unheld_count:
        unheld = plural(drift.unheld_count, "tensor")
        why = f"the {unheld} the index lists but no shard holds may account for it"
    why = why or f"neither the sum of file sizes ({file_sizes:,}) nor a known drift explains it"
    msg = (
        f"{head} is {stated:,} but the shards hold {unique:,} tensor bytes (difference "
        f"{diff:+,}); {why}; regenerate the index (ckpt-inspect repair) to fix the total"
    )
    return make_finding("total-size-mismatch", msg, file=index.file)


def _total_parameters(
    index: IndexDoc, unique: int, copies: int, drift: _Drift, not_counted: Uncounted
) -> Finding | None:
    """The stated count against each writer's way of counting the stored elements
    (`Uncounted.counts`): healthy output of any of them is not a finding."""
    if "total_parameters" not in index.metadata:
        return None
    stated = parse_count(index.metadata["total_parameters"])
    head = f"{legible(index.file)} metadata.total_parameters"
    counts = not_counted.counts(unique)
    if stated is None:
        msg = (
            f"{head} is {short_repr(index.metadata['total_parameters'], limit=80)}, not a count; "
            f"expected {format_count(next(iter(counts)))}"
        )
        return make_finding("total-parameters-mismatch", msg, file=index.file)
    if stated in counts:
        return None
    unlisted = {c - drift.unindexed_numel for c in counts}
    if drift.unindexed_count and stated in unlisted:
        unlisted_count = plural(drift.unindexed_count, "tensor")
        why = f"it leaves out exactly the {unlisted_count} the index does not list"
    elif copies and stated == unique + copies:
        why = "it counts every copy of the duplicated tensors"
    else:
        ways = "; ".join(
            f"{format_count(c)} with {Uncounted.WAYS[way]}" for c, way in counts.items()
        )
        why = (
            f"the writers' ways of counting give {ways}, none of them this"
            if len(counts) > 1
            else "transformers counts model parameters only, and no stored tensor here is a "
            "known buffer or a quantization scale"
        ) + "; check before relying on it"
    msg = (
        f"{head} is {format_count(stated)} but the shards hold {format_count(unique)} elements "
        f"(difference {'+' if stated > unique else ''}{format_count(stated - unique)}); {why}"
    )
    return make_finding("total-parameters-mismatch", msg, file=index.file)


def reconcile_total_parameters(
    findings: list[Finding], index: IndexDoc | None, model_parameters: int | None
) -> list[Finding]:
    """`total_parameters` judged against the exact count of the model built from config.json.

    transformers writes `num_parameters()`: parameters only, a tied weight once, buffers
    (saved in the shards) not at all, so a healthy `save_pretrained` index differs from the
    shards' element count whenever the model has persistent buffers. A stated count equal to
    the model's is right; one that matches neither the model nor the shards says both."""
    if index is None or model_parameters is None:
        return findings
    stated = parse_count(index.metadata.get("total_parameters"))
    ours = [f for f in findings if f.code == "total-parameters-mismatch" and f.file == index.file]
    if stated is None or not ours:
        return findings
    rest = [f for f in findings if f not in ours]
    if stated == model_parameters:
        return rest
    msg = (
        f"{ours[0].message}; the model built from config.json has {model_parameters:,} "
        "parameters (what transformers writes: parameters only, tied weights once, buffers "
        "not counted)"
    )
    return [*rest, make_finding("total-parameters-mismatch", msg, file=index.file)]


def reconcile_with_model(
    scanned: ScannedCheckpoint, verdict: LoadVerdict, findings: list[Finding]
) -> list[Finding]:
    """The model rule (`inspector._internal.checks.registry`): `reconcile_total_parameters` with the
    parameter count of the model the load verdict built."""
    return reconcile_total_parameters(findings, scanned.index, verdict.parameters)


# -- folding ------------------------------------------------------------------------------


def fold_tensor_issues(
    code: Code,
    groups: Mapping[str, list[str]],
    detail: Callable[[str, str], str],
    summary: Callable[[str, list[str], int], str],
    policy: FoldPolicy = FOLD,
    *,
    file_of: Callable[[str], str] | None = None,
) -> list[Finding]:
    """Findings for tensor problems grouped by file, under the fold policy (`fold`).

    `detail(group, tensor)` is only called for tensors reported one by one;
    `summary(group, rest, shown)` folds the rest of a group (`shown` were reported singly).
    `file_of(group)` gives the finding's file when groups are not file names.
    """
    ordered = {group: sorted(names) for group, names in groups.items()}
    # The names `fold` lists one by one (its order and budget), parsed in one call: a parse
    # of one name costs as much as one of a thousand (about 2 ms each, 40 findings a check).
    listed, budget = [], policy.per_code
    for group in sorted(ordered):
        shown = max(0, min(policy.per_file, budget, len(ordered[group])))
        budget -= shown
        listed += ordered[group][:shown]
    numbers = dict(zip(listed, layer_expert_numbers(listed), strict=True))

    def where(group: str | None) -> str:
        return file_of(group or "") if file_of else group or ""

    def one(group: str | None, name: str) -> Finding:
        layer, expert = numbers.get(name) or layer_expert_numbers([name])[0]
        message = detail(group or "", name)
        return make_finding(
            code, message, file=where(group), tensor=name, layer=layer, expert=expert
        )

    def rest(group: str | None, names: Sequence[str], shown: int) -> Finding:
        return make_finding(code, summary(group or "", list(names), shown), file=where(group))

    return fold(ordered, one, rest, policy=policy)


def _summary(what: str) -> Callable[[str, list[str], int], str]:
    """A summary builder: '{n} [more ]tensors {what} ({layers, examples})'."""

    def build(file: str, rest: list[str], shown: int) -> str:
        rest_count = plural(len(rest), "more tensor")
        where = what.replace("{file}", legible(file))
        return f"{rest_count}{besides(shown)} {where}: {describe_names(rest)}"

    return build


# -- helpers -------------------------------------------------------------------------------


def _holders(names: tuple[str, ...], held: HeldTensors) -> np.ndarray:
    """The position in `held.shards` of the shard holding each of `names` (-1: none), where
    no name is held twice. Writers list the index in the shards' order: while each run of
    names equals the next shard's names (one C-level tuple comparison, the strings mostly the
    shards' own), the run's holder is that shard; from the first run that differs, each name
    is looked up in `held.first` (0.05 s at 300,000 names, for a drifted index's last few)."""
    holder = np.empty(len(names), dtype=np.int64)
    at = 0
    for i, shard in enumerate(held.shards):
        n = len(shard.names)
        if not n:
            continue
        if names[at : at + n] != shard.names:
            break
        holder[at : at + n] = i
        at += n
    rest = names[at:]
    holder[at:] = np.fromiter(
        map(held.first.get, rest, repeat(-1)), dtype=np.int64, count=len(rest)
    )
    return holder
