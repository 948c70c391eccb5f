"""Sidecar drift: Model-Optimizer per-layer JSON sidecars against their shards and the merged
index (docs/formats.md, "Model-Optimizer per-layer exports"). Pure. Codes: the `sidecar-*`
rows of docs/findings.md, folded as `checks.index.fold_tensor_issues` folds; which findings
one problem does not repeat: docs/architecture.md, "checks/".
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from inspector._internal.checkpoint.parameters import parse_count
from inspector._internal.checkpoint.places import describe_names
from inspector._internal.checkpoint.read_problems import FileRole, ProblemKind
from inspector._internal.checkpoint.scanned import IndexDoc, ScannedCheckpoint
from inspector._internal.checkpoint.tensor_shards import (
    HeldTensors,
    held_of,
    held_tensors,
    normalized_map,
)
from inspector._internal.checks.index import fold_tensor_issues, normalized
from inspector._internal.common.display import legible
from inspector._internal.common.text import examples, plural, short_repr
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
from inspector._internal.layouts.modelopt_per_layer import shard_of_sidecar, sidecar_name

__all__ = ["CODES", "check_sidecars", "check_sidecars_of"]

CODES = code_set(
    Code.SIDECAR_MISSING,
    Code.SIDECAR_UNLISTED_TENSOR,
    Code.SIDECAR_DANGLING_TENSOR,
    Code.SIDECAR_TOTAL_SIZE_MISMATCH,
    Code.SIDECAR_INDEX_DISAGREE,
)


def check_sidecars_of(scanned: ScannedCheckpoint) -> list[Finding]:
    """The sidecar rule on a scan; a sidecar the reader could not parse is not also called
    missing."""
    shards = {s.file for s in scanned.shards}
    unreadable = {
        shard
        for p in scanned.read_problems
        if p.role is FileRole.SIDECAR and p.kind is ProblemKind.UNREADABLE
        if (shard := shard_of_sidecar(p.file, shards)) is not None
    }
    return check_sidecars(
        scanned.shards,
        scanned.sidecars,
        scanned.index,
        unreadable=unreadable,
        held=held_of(scanned),
    )


def check_sidecars(
    shards: Sequence[ShardHeader],
    sidecars: Mapping[str, IndexDoc],
    index: IndexDoc | None,
    *,
    unreadable: Collection[str] = (),
    held: HeldTensors | None = None,
    policy: FoldPolicy = FOLD,
) -> list[Finding]:
    """All sidecar findings. `sidecars` maps shard file -> its parsed sidecar; `unreadable`
    names the shard files whose sidecar exists but could not be parsed; `held` may be
    shared with the index checks."""
    held = held or held_tensors(shards)
    findings = _missing(held, sidecars, unreadable, policy)
    findings += _against_shards(held, sidecars, policy)
    if index is not None and sidecars:
        findings += _against_index(sidecars, index, policy)
    return findings


# -- step 1: which shards have a sidecar -----------------------------------------------------


def _missing(
    held: HeldTensors,
    sidecars: Mapping[str, IndexDoc],
    unreadable: Collection[str],
    policy: FoldPolicy,
) -> list[Finding]:
    """sidecar-missing both ways: shard without sidecar, sidecar without shard."""
    findings = []
    for shard_file, doc in sorted(sidecars.items()):
        if shard_file not in held.by_file:
            msg = (
                f"{legible(doc.file)} describes {legible(shard_file)} "
                f"({plural(len(doc.weight_map), 'tensor')}), but "
                f"{legible(shard_file)} is not in the folder: restore the shard or delete the "
                "stale sidecar"
            )
            findings.append(make_finding(Code.SIDECAR_MISSING, msg, file=doc.file))
    described = set(sidecars) | set(unreadable)
    if not described:
        return findings
    # Sidecars sit next to top-level shards only; index-named files in sub-folders have none.
    top = [s.file for s in held.shards if "/" not in s.file]
    lacking = sorted(f for f in top if f not in described)
    have = len([f for f in top if f in described])
    advice = "re-export, or regenerate the sidecar from the shard header (ckpt-inspect repair)"

    def detail(_group: str | None, file: str) -> Finding:
        msg = (
            f"{legible(file)} has no sidecar {legible(sidecar_name(file, sidecars))} while "
            f"{have:,} sibling "
            f"shards have one: the export stopped before writing it or it was deleted; {advice}"
        )
        return make_finding(Code.SIDECAR_MISSING, msg, file=file)

    def summary(_group: str | None, rest: Sequence[str], _shown: int) -> Finding:
        msg = (
            f"{len(rest):,} more shards have no .json sidecar while {have:,} have one "
            f"({examples(list(rest))}); {advice}"
        )
        return make_finding(Code.SIDECAR_MISSING, msg, file=rest[0])

    return findings + fold(lacking, detail, summary, policy=policy)


# -- step 2: each sidecar against its own shard ----------------------------------------------


def _against_shards(
    held: HeldTensors, sidecars: Mapping[str, IndexDoc], policy: FoldPolicy
) -> list[Finding]:
    """sidecar-unlisted-tensor, sidecar-dangling-tensor, sidecar-total-size-mismatch."""
    unlisted: dict[str, list[str]] = {}
    dangling: dict[str, list[str]] = {}
    sizes: list[Finding] = []
    shard_of: dict[str, str] = {}
    for shard_file, doc in sidecars.items():
        shard = held.by_file.get(shard_file)
        if shard is None or not shard.readable:
            continue
        shard_of[doc.file] = shard_file
        if _same_names(held, shard, doc.weight_map):
            extra, gone = [], []
        else:
            present = held.present(shard_file)
            extra = [n for n in shard.names if n not in doc.weight_map]
            gone = [
                n for n in doc.weight_map if n not in present and n not in held.invalid[shard_file]
            ]
        if extra:
            unlisted[doc.file] = extra
        if gone:
            dangling[doc.file] = gone
        size = _size_finding(doc, shard, extra)
        if size is not None:
            sizes.append(size)
    return (
        _fold_unlisted(unlisted, shard_of, policy)
        + _fold_dangling(dangling, shard_of, policy)
        + sizes
    )


def _same_names(held: HeldTensors, shard: ShardHeader, listed: Mapping[str, str]) -> bool:
    """True when the sidecar lists exactly the shard's names, proven at C speed: as many
    entries as (distinct) names, and every name among them."""
    if len(listed) != len(shard.names):
        return False
    if not held.distinct and len(held.present(shard.file)) != len(shard.names):
        return False
    return all(map(listed.__contains__, shard.names))


def _fold_unlisted(
    groups: dict[str, list[str]], shard_of: dict[str, str], policy: FoldPolicy
) -> list[Finding]:
    def detail(sidecar: str, name: str) -> str:
        shard = shard_of[sidecar]
        return (
            f"{legible(shard)} holds '{legible(name)}' but its sidecar {legible(sidecar)} does not "
            "list it (the sidecar "
            "was written from a state dict that changed afterwards, e.g. MTP tensors appended): "
            "it is missing from the merged index too; regenerate the sidecar from the shard"
        )

    def summary(sidecar: str, rest: list[str], shown: int) -> str:
        return (
            f"{plural(len(rest), 'more tensor')}{besides(shown)} in {legible(shard_of[sidecar])} "
            f"are not listed in {legible(sidecar)}: {describe_names(rest)}; regenerate the "
            "sidecar from the shard"
        )

    return fold_tensor_issues(Code.SIDECAR_UNLISTED_TENSOR, groups, detail, summary, policy)


def _fold_dangling(
    groups: dict[str, list[str]], shard_of: dict[str, str], policy: FoldPolicy
) -> list[Finding]:
    def detail(sidecar: str, name: str) -> str:
        shard = shard_of[sidecar]
        return (
            f"{legible(sidecar)} lists '{legible(name)}' but {legible(shard)} does not hold it: "
            "the shard was written "
            "from a different state dict than the sidecar; re-export the layer or drop the entry"
        )

    def summary(sidecar: str, rest: list[str], shown: int) -> str:
        return (
            f"{plural(len(rest), 'more tensor')}{besides(shown)} listed in {legible(sidecar)} "
            f"are not in {legible(shard_of[sidecar])}: {describe_names(rest)}"
        )

    return fold_tensor_issues(Code.SIDECAR_DANGLING_TENSOR, groups, detail, summary, policy)


def _size_finding(doc: IndexDoc, shard: ShardHeader, unlisted: list[str]) -> Finding | None:
    """The sidecar's total_size against the shard's tensor bytes, with the likeliest cause."""
    if "total_size" not in doc.metadata:
        return None
    actual = shard.tensor_bytes
    stated = parse_count(doc.metadata["total_size"])
    head = f"{legible(doc.file)} metadata.total_size"
    if stated is None:
        shown = short_repr(doc.metadata["total_size"], limit=80)
        msg = f"{head} is {shown}, not a byte plural; expected {actual:,}"
        return make_finding(Code.SIDECAR_TOTAL_SIZE_MISMATCH, msg, file=doc.file)
    if stated == actual:
        return None
    wanted = set(unlisted)
    unlisted_bytes = sum(
        e - b
        for n, b, e in zip(shard.names, shard.begins.tolist(), shard.ends.tolist(), strict=True)
        if n in wanted
    )
    if unlisted and stated == actual - unlisted_bytes:
        why = (
            f"it is short by exactly the {unlisted_bytes:,} bytes of the {len(unlisted):,} "
            "tensors the sidecar does not list"
        )
    elif stated == shard.file_size:
        why = "it equals the shard's file size (header included) instead of its tensor bytes"
    else:
        why = "no unlisted tensor or file size explains it"
    msg = (
        f"{head} is {stated:,} but {legible(shard.file)} holds {actual:,} tensor bytes (difference "
        f"{stated - actual:+,}); {why}; regenerate the sidecar from the shard"
    )
    return make_finding(Code.SIDECAR_TOTAL_SIZE_MISMATCH, msg, file=doc.file)


# -- step 3: merged sidecars against the index -----------------------------------------------


def _against_index(
    sidecars: Mapping[str, IndexDoc],
    index: IndexDoc,
    policy: FoldPolicy,
) -> list[Finding]:
    """sidecar-index-disagree: tensors in one only, or mapped to different files."""
    merged: dict[str, str] = {}
    for shard_file in sorted(sidecars):
        merged.update(normalized_map(sidecars[shard_file].weight_map))
    groups: dict[str, list[str]] = {"only-sidecars": [], "only-index": [], "different": []}
    indexed = normalized(index.lookup_map())
    if merged == indexed:  # the usual case, compared at C speed
        return []
    for name, file in merged.items():
        target = indexed.get(name)
        if target is None:
            groups["only-sidecars"].append(name)
        elif target != file:
            groups["different"].append(name)
    for name, file in indexed.items():
        # A shard without a readable sidecar is already a sidecar-missing/-unreadable finding.
        if name not in merged and file in sidecars:
            groups["only-index"].append(name)
    groups = {k: v for k, v in groups.items() if v}
    return _fold_disagree(groups, merged, indexed, index.file, policy)


_DISAGREE = {
    "only-sidecars": "are listed by sidecars but not by {index}",
    "only-index": "are in {index} but not in the sidecars of their shards",
    "different": "are mapped to other files by {index} than by the sidecars",
}
_REBUILD = "rebuild the index from the shards (ckpt-inspect repair)"


def _fold_disagree(
    groups: dict[str, list[str]],
    merged: dict[str, str],
    indexed: Mapping[str, str],
    index_file: str,
    policy: FoldPolicy,
) -> list[Finding]:
    def detail(kind: str, name: str) -> str:
        if kind == "only-sidecars":
            where = (
                f"the sidecar of {legible(merged[name])} lists '{legible(name)}' but "
                f"{legible(index_file)} does not"
            )
        elif kind == "only-index":
            where = (
                f"{legible(index_file)} maps '{legible(name)}' to {legible(indexed[name])} but "
                "that shard's sidecar does not list it"
            )
        else:
            where = (
                f"{legible(index_file)} maps '{legible(name)}' to {legible(indexed[name])}, "
                f"the sidecars to {legible(merged[name])}"
            )
        return f"{where}: the index was not merged from these sidecars; {_REBUILD}"

    def summary(kind: str, rest: list[str], shown: int) -> str:
        what = _DISAGREE[kind].replace("{index}", index_file)
        return (
            f"{plural(len(rest), 'more tensor')}{besides(shown)} {what}: "
            f"{describe_names(rest)}; {_REBUILD}"
        )

    return fold_tensor_issues(
        Code.SIDECAR_INDEX_DISAGREE, groups, detail, summary, policy,
        file_of=lambda _kind: index_file,
    )  # fmt: skip
