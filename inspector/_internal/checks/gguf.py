"""GGUF files against their own metadata: split parts present and consistent (as llama.cpp
opens them), tensor counts, experts (`{arch}.expert_count` against the expert axis of every
`blk.N.ffn_*_exps` tensor). Pure. The split rules: docs/formats.md.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Sequence

from inspector._internal.checkpoint.scanned import ScannedCheckpoint
from inspector._internal.common.display import legible
from inspector._internal.common.text import examples, fold_ranges
from inspector._internal.findings.codes import Code, code_set
from inspector._internal.findings.finding import Finding, make_finding
from inspector._internal.formats.gguf_shard import GgufShard, kv_int

__all__ = ["CODES", "check_gguf"]

CODES = code_set(
    Code.GGUF_SPLIT_MISSING,
    Code.GGUF_SPLIT_TENSOR_COUNT_MISMATCH,
    Code.GGUF_SPLIT_INCONSISTENT,
    Code.DUPLICATE_TENSOR,
    Code.EXPERT_MISSING,
)

_PART = re.compile(r"^(?P<stem>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")
_EXPERTS = re.compile(r"^blk\.(?P<layer>\d+)\.ffn_\w+_exps\.weight$")
# Parts of one split model a name may declare: gguf-split writes at most 99,999.
_MAX_PARTS = 99_999


def check_gguf(scanned: ScannedCheckpoint) -> list[Finding]:
    shards = [s for s in scanned.shards if isinstance(s, GgufShard)]
    findings: list[Finding] = []
    groups: dict[tuple[str, int], dict[int, GgufShard]] = defaultdict(dict)
    for shard in shards:
        match = _PART.match(shard.file.rsplit("/", 1)[-1])
        if match:
            key = (match["stem"], int(match["count"]))
            groups[key][int(match["no"])] = shard
    for (stem, count), parts in sorted(groups.items()):
        findings += _split(stem, count, parts)
    findings += _experts(shards)
    return findings


def _split(stem: str, count: int, parts: dict[int, GgufShard]) -> list[Finding]:
    readable = {n: s for n, s in parts.items() if s.readable}
    first = readable.get(1) or next(iter(readable.values()), None)
    if first is None:
        return []
    declared = kv_int(first.kv, "split.count") or count
    total = kv_int(first.kv, "split.tensors.count")
    odd: list[str] = []
    claims: list[str] = []  # parts stating another total (a part of another conversion)
    for no, s in sorted(readable.items()):
        name = legible(s.file)
        split_no, split_count = kv_int(s.kv, "split.no"), kv_int(s.kv, "split.count")
        if split_no is None or split_count is None:
            odd.append(f"{name} has no split metadata")
            continue
        if split_no != no - 1:
            odd.append(f"{name} has split.no {split_no}, expected {no - 1}")
        if split_count != declared:
            odd.append(f"{name} says split.count {split_count}, part 1 says {declared}")
        if kv_int(s.kv, "split.tensors.count") != total:
            claims.append(f"{name} says {kv_int(s.kv, 'split.tensors.count')}")
    findings: list[Finding] = []
    where = legible(f"{stem}-*-of-{count:05d}.gguf")
    if odd:
        findings.append(
            make_finding(
                "gguf-split-inconsistent",
                f"{where}: {'; '.join(odd[:8])}; the parts come from different conversions: "
                "download or split them again together",
                file=first.file,
            )
        )
    wanted = min(max(declared, count), _MAX_PARTS)
    missing = [n for n in range(1, wanted + 1) if n not in parts]
    if missing:
        names = [f"{stem}-{n:05d}-of-{count:05d}.gguf" for n in missing]
        findings.append(
            make_finding(
                "gguf-split-missing",
                f"{where}: {len(missing):,} of {wanted:,} parts are missing "
                f"({examples(names)}); llama.cpp cannot open the model: download them",
                file=first.file,
            )
        )
    found = sum(s.tensor_count for s in readable.values())
    complete = not missing and len(readable) == len(parts)
    if total is not None and (claims or (complete and found != total)):
        held = f"the {len(readable):,} parts hold {found:,} tensors" if complete else ""
        said = f"part 1's split.tensors.count is {total:,}"
        other = f" ({'; '.join(claims[:4])})" if claims else ""
        findings.append(
            make_finding(
                "gguf-split-tensor-count-mismatch",
                f"{where}: {', '.join(p for p in (said, held) if p)}{other}; llama.cpp "
                "refuses it ('corrupted model'): a part is stale or from another conversion; "
                "download or split them again",
                file=first.file,
            )
        )
    findings += _duplicates(list(readable.values()))
    return findings


def _duplicates(parts: Sequence[GgufShard]) -> list[Finding]:
    seen: dict[str, str] = {}
    twice: list[tuple[str, str, str]] = []
    for s in parts:
        for name in s.names:
            if name in seen:
                twice.append((name, seen[name], s.file))
            else:
                seen[name] = s.file
    return [
        make_finding(
            "duplicate-tensor",
            f"'{legible(n)}' is in {legible(a)} and in {legible(b)}; llama.cpp refuses a "
            "tensor seen twice: remove the stale part",
            file=b,
            tensor=n,
        )
        for n, a, b in twice[:20]
    ]


def _experts(shards: Sequence[GgufShard]) -> list[Finding]:
    kv = next((s.kv for s in shards if s.kv.get("general.architecture")), None)
    if kv is None:
        return []
    arch = kv.get("general.architecture")
    declared = kv_int(kv, f"{arch}.expert_count") if isinstance(arch, str) else None
    if not declared:
        return []
    short: dict[int, tuple[int, str]] = {}
    for s in shards:
        for name, shape in zip(s.names, s.shapes, strict=True):
            match = _EXPERTS.match(name)
            if match and len(shape) == 3 and shape[0] < declared:
                short.setdefault(int(match["layer"]), (shape[0], s.file))
    return [
        make_finding(
            "expert-missing",
            f"layer {layer}: experts {fold_ranges(range(held, declared))} missing "
            f"({declared - held:,} of {declared:,}; {legible(arch)}.expert_count declares "
            f"{declared:,}, the ffn_*_exps tensors stack {held:,}) in {legible(file)}; "
            "llama.cpp refuses the "
            "shape: re-convert from the complete model, or fix expert_count",
            file=file,
            layer=layer,
        )
        for layer, (held, file) in sorted(short.items())
    ]
