"""Draft models for speculative decoding (EAGLE, EAGLE-3) against their own config and, when
given, their target: sizes, the EAGLE-3 vocabulary mapping, and the head they borrow.

The rules are what vLLM's and SGLang's EAGLE loaders do (docs/architecture.md, "checks/");
`d2t` is read through the storage and only when small, and config.json sizes come validated
from `checkpoint.spec`, so a hostile size is a `fit-config-invalid`, never used here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from inspector._internal.checkpoint.loaded import tensor_data
from inspector._internal.checkpoint.scanned import ScannedCheckpoint
from inspector._internal.checkpoint.spec import ServingSpec, serving_spec
from inspector._internal.checkpoint.tables import name_leaves, tensor_columns
from inspector._internal.common.display import legible
from inspector._internal.findings.codes import Code, code_set
from inspector._internal.findings.finding import Finding, make_finding

__all__ = ["CODES", "MAX_MAPPING", "check_draft", "is_draft"]

CODES = code_set(
    Code.DRAFT_TARGET_MISMATCH, Code.DRAFT_MAPPING_INVALID, Code.DRAFT_HEAD_FROM_TARGET
)

# The largest d2t whose values are read (entries): real drafts map 32,000 to 64,000 tokens.
MAX_MAPPING = 1 << 20
_INTEGERS = frozenset({"I64", "I32", "I16", "I8", "U8", "U16", "U32", "U64"})


def is_draft(scanned: ScannedCheckpoint) -> bool:
    """Whether `scanned` is an EAGLE-style draft model (module docstring)."""
    config = scanned.config if isinstance(scanned.config, Mapping) else {}
    names = config.get("architectures")
    if isinstance(names, list) and any(isinstance(n, str) and "Eagle" in n for n in names[:8]):
        return True
    return bool(_stored(scanned, "d2t") or _stored(scanned, "t2d"))


def _stored(scanned: ScannedCheckpoint, leaf: str) -> tuple[str, str, tuple[int, ...]] | None:
    """(name, dtype, shape) of the tensor named `leaf` or `*.leaf` (the first one), from the
    names' last components (`name_leaves`): a name is `d2t` or ends with `.d2t` exactly when
    its last component is `d2t`; a dotted leaf's rows are those of its own last component."""
    head, _, tail = leaf.rpartition(".")
    leaves = name_leaves(scanned)
    if tail not in leaves.values:
        return None
    rows = np.flatnonzero(leaves.codes == leaves.values.index(tail)).tolist()
    columns = tensor_columns(scanned)
    names = columns.names
    if head:
        suffix = "." + leaf
        rows = [r for r in rows if names[r] == leaf or names[r].endswith(suffix)]
    if not rows:
        return None
    row = rows[0]
    dtype = columns.dtypes[int(columns.dtype_codes[row])]
    return names[row], dtype, tuple(int(n) for n in columns.shape[row])


def _draft_vocab(config: Mapping[str, Any] | None) -> int | None:
    value = (config or {}).get("draft_vocab_size")
    return value if type(value) is int and 0 < value <= 1 << 24 else None


def check_draft(
    draft: ScannedCheckpoint, *, target: ScannedCheckpoint | None = None
) -> list[Finding]:
    """The draft's findings (module docstring); with `target`, against it too. Nothing for
    a checkpoint that is not a draft."""
    if not is_draft(draft):
        return []
    mine = serving_spec(draft.config, draft.spec)
    theirs = None if target is None else serving_spec(target.config, target.spec)
    found = _mapping(draft, mine)
    head = _stored(draft, "lm_head.weight")
    embedding = _stored(draft, "embed_tokens.weight")
    borrowed = [what for what, t in (("output head", head), ("embedding", embedding)) if t is None]
    if borrowed:
        found.append(
            make_finding(
                Code.DRAFT_HEAD_FROM_TARGET,
                f"the draft stores no {' and no '.join(borrowed)}: the engine takes the "
                "target's (vLLM's `EagleProposer.load_model` shares them), so it serves only "
                "beside a target of the same hidden size"
                + (" and vocabulary" if head is None else ""),
            )
        )
    if theirs is not None:
        found += _against_target(mine, theirs, head=head, draft=draft)
    return found


def _mapping(draft: ScannedCheckpoint, mine: ServingSpec) -> list[Finding]:
    """d2t and t2d against the draft's own sizes, and d2t's values (module docstring)."""
    d2t, t2d = _stored(draft, "d2t"), _stored(draft, "t2d")
    draft_vocab = _draft_vocab(draft.config)
    head = _stored(draft, "lm_head.weight")
    rows = head[2][0] if head is not None and len(head[2]) == 2 else None
    problems: list[str] = []
    if d2t is not None:
        name, dtype, shape = d2t
        if len(shape) != 1 or dtype not in _INTEGERS:
            problems.append(f"{legible(name)} is {dtype} {list(shape)}, not one integer per token")
        else:
            for what, size in (("draft_vocab_size", draft_vocab), ("lm_head rows", rows)):
                if size is not None and shape[0] != size:
                    problems.append(
                        f"{legible(name)} holds {shape[0]:,} entries, {what} is {size:,}"
                    )
            if mine.vocab_size is not None and not problems:
                problems += _offsets(draft, name, dtype, shape[0], mine.vocab_size)
    if t2d is not None:
        name, dtype, shape = t2d
        if len(shape) != 1 or dtype != "BOOL":
            problems.append(f"{legible(name)} is {dtype} {list(shape)}, not one boolean per token")
        elif mine.vocab_size is not None and shape[0] != mine.vocab_size:
            problems.append(
                f"{legible(name)} holds {shape[0]:,} entries, vocab_size is {mine.vocab_size:,}"
            )
    if d2t is None and draft_vocab is not None and draft_vocab != mine.vocab_size:
        problems.append(
            f"draft_vocab_size {draft_vocab:,} differs from vocab_size and no d2t maps them"
        )
    if not problems:
        return []
    return [
        make_finding(
            Code.DRAFT_MAPPING_INVALID,
            f"the draft's vocabulary mapping: {'; '.join(problems[:6])}: vLLM and SGLang map "
            "draft token i to target token i + d2t[i] (`Eagle3LlamaForCausalLM.load_weights`)",
            tensor=(d2t or t2d or ("", "", ()))[0] or None,
        )
    ]


def _offsets(
    draft: ScannedCheckpoint, name: str, dtype: str, count: int, target_vocab: int
) -> list[str]:
    """Where d2t sends a draft token outside the target's vocabulary (values read whole
    when at most `MAX_MAPPING` entries)."""
    if count > MAX_MAPPING:
        return []
    with tensor_data(draft) as data:
        raw = data.tensor_bytes(name)
    kind = {"I64": "<i8", "I32": "<i4", "I16": "<i2", "I8": "i1", "U8": "u1", "U16": "<u2"}
    if raw is None or dtype not in kind:
        return []
    values = np.frombuffer(raw, dtype=kind[dtype])
    if values.size != count:
        return []
    targets = np.arange(count, dtype=np.int64) + values.astype(np.int64)
    bad = np.flatnonzero((targets < 0) | (targets >= target_vocab))
    if bad.size == 0:
        return []
    first = int(bad[0])
    return [
        f"{bad.size:,} of its offsets send a draft token outside the {target_vocab:,}-token "
        f"vocabulary (draft token {first:,} + {int(values[first]):,} = {int(targets[first]):,})"
    ]


def _against_target(
    mine: ServingSpec,
    theirs: ServingSpec,
    *,
    head: tuple[str, str, tuple[int, ...]] | None,
    draft: ScannedCheckpoint,
) -> list[Finding]:
    problems = []
    for what, a, b in (
        ("hidden size", mine.hidden_size, theirs.hidden_size),
        ("vocabulary (vocab_size)", mine.vocab_size, theirs.vocab_size),
    ):
        if a is not None and b is not None and a != b:
            problems.append(f"the draft's {what} is {a:,}, the target's {b:,}")
    draft_vocab = _draft_vocab(draft.config)
    if head is None and draft_vocab is not None and theirs.vocab_size not in (None, draft_vocab):
        problems.append(
            f"the draft borrows the target's head of {theirs.vocab_size:,} tokens and its "
            f"draft_vocab_size is {draft_vocab:,}"
        )
    if not problems:
        return []
    return [
        make_finding(
            Code.DRAFT_TARGET_MISMATCH,
            f"{'; '.join(problems)}: the engine refuses to start speculative decoding with "
            "this pair (vLLM `SpeculativeConfig` / `EagleProposer` read the target's hidden "
            "states and vocabulary)",
        )
    ]
