"""Problems: findings grouped into root causes, each with its impact and the action that fixes it.

A check reports every symptom it sees: on a Model-Optimizer export whose last shard gained 42
MTP tensors after its JSON files were written, that is 21 `unindexed-tensor` and 21
`sidecar-unlisted-tensor` findings plus two stale totals. A person wants two lines: "the index
misses 42 MTP tensors: they are invisible to loaders; rebuild it" and "the sidecar misses the
same 42". `group_problems` turns findings into such problems. Pure: scanned data and findings
in, problems out; the counts in titles come from the scanned data (the findings themselves
are folded after 20 per file, see `inspector.findings.FOLD`).

Whether a repair plan really fixes a problem is not guessed here: `inspector.repair`'s
`preview_repair` re-checks the checkpoint as the plan would leave it.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from inspector.codes import Code, Severity, severity_rank
from inspector.findings import Finding, fold_ranges
from inspector.model import ScannedCheckpoint
from inspector.units import format_bytes

__all__ = ["Action", "ActionKind", "Problem", "group_problems"]

ActionKind = Literal["repair", "restore", "re-export", "consolidate", "reshard", "review"]


@dataclass(frozen=True, slots=True)
class Action:
    """What fixes a problem: in words, as a command, and (for `repair`) which plan parts."""

    kind: ActionKind
    text: str
    command: str
    # Parts of `plan_repair(only=...)` ("index", "sidecars", "quant-config") for kind "repair".
    parts: tuple[str, ...] = ()

    @property
    def here(self) -> bool:
        """True when `ckpt-inspect repair` (the dashboard's Repair tab) carries it out."""
        return self.kind == "repair"


@dataclass(frozen=True, slots=True)
class Problem:
    """One root cause. `tensors`, `files` and `cells` say where it shows: tensor names (all of
    them when known), files, and (layer, expert) cells of the expert heatmap (expert None:
    the whole layer)."""

    key: str
    severity: Severity
    title: str
    impact: str
    action: Action
    findings: tuple[Finding, ...]
    tensors: tuple[str, ...] = ()
    files: tuple[str, ...] = ()
    cells: tuple[tuple[int, int | None], ...] = ()

    @property
    def codes(self) -> tuple[str, ...]:
        """The distinct codes of its findings, in first-seen order."""
        return tuple(dict.fromkeys(f.code for f in self.findings))

    @property
    def repairable(self) -> bool:
        return self.action.here


# Codes that describe one root cause each; `_RULES` below decides which problem takes them.
_SHARD_DAMAGE = frozenset(
    {
        Code.HEADER_UNREADABLE,
        Code.HEADER_INVALID_ENTRY,
        Code.HEADER_DUPLICATE_KEY,
        Code.UNKNOWN_DTYPE,
        Code.SIZE_MISMATCH,
        Code.OFFSET_INVALID,
        Code.FILE_TRUNCATED,
        Code.TRAILING_BYTES,
    }
)
_INDEX_STALE = frozenset(
    {
        Code.INDEX_UNREADABLE,
        Code.INDEX_UNSAFE_PATH,
        Code.INDEX_DANGLING_TENSOR,
        Code.INDEX_WRONG_FILE,
        Code.TOTAL_SIZE_MISMATCH,
        Code.TOTAL_PARAMETERS_MISMATCH,
    }
)
_SIDECARS = frozenset(
    {
        Code.SIDECAR_MISSING,
        Code.SIDECAR_UNLISTED_TENSOR,
        Code.SIDECAR_DANGLING_TENSOR,
        Code.SIDECAR_TOTAL_SIZE_MISMATCH,
        Code.SIDECAR_INDEX_DISAGREE,
        Code.SIDECAR_UNREADABLE,
    }
)
_EXPERTS = frozenset({Code.EXPERT_MISSING, Code.EXPERT_INCOMPLETE, Code.EXPERT_SHAPE_MISMATCH})
_DCP_GAPS = frozenset(
    {
        Code.DCP_SHARDING_INFO_MISSING,
        Code.DCP_COVERAGE_GAP,
        Code.DCP_CHUNK_OVERLAP,
        Code.DCP_DTYPE_CONFLICT,
    }
)
_MAX_LISTED = 3


def group_problems(scanned: ScannedCheckpoint, findings: Iterable[Finding]) -> tuple[Problem, ...]:
    """The findings of `scanned` as problems, worst first (then the ones fixable here first).

    Every finding belongs to exactly one problem; a finding no rule explains becomes a problem
    of its own code, titled by the code's help text.
    """
    pending = list(dict.fromkeys(findings))
    ctx = _Context(scanned)
    problems: list[Problem] = []
    for rule in _RULES:
        problems.extend(rule(ctx, pending))
        claimed = {f for p in problems for f in p.findings}
        pending = [f for f in pending if f not in claimed]
    problems.extend(_per_code(ctx, pending))
    return tuple(
        sorted(
            problems,
            key=lambda p: (severity_rank(p.severity), not p.repairable, -len(p.findings), p.key),
        )
    )


# -- the scanned data the rules need --------------------------------------------------------


@dataclass
class _Context:
    """The scanned checkpoint plus lookups built on first use (a 300,000-tensor checkpoint
    builds none of them when it has no finding that needs them)."""

    scanned: ScannedCheckpoint
    _sizes: dict[str, int] | None = field(default=None, repr=False)
    _mtp: frozenset[str] | None = field(default=None, repr=False)

    @property
    def path(self) -> str:
        return _quote(str(self.scanned.path))

    def sizes(self) -> dict[str, int]:
        """Tensor name -> bytes, from the shard headers (the first holder wins)."""
        if self._sizes is None:
            sizes: dict[str, int] = {}
            for shard in self.scanned.shards:
                for name, b, e in zip(shard.names, shard.begins, shard.ends, strict=True):
                    sizes.setdefault(name, e - b)
            self._sizes = sizes
        return self._sizes

    def mtp(self) -> frozenset[str]:
        """Names of the MTP tensors (the tensors table knows every spelling)."""
        if self._mtp is None:
            t = self.scanned.tensors
            self._mtp = frozenset(t.loc[t["is_mtp"], "name"].tolist()) if len(t) else frozenset()
        return self._mtp

    def held(self) -> dict[str, frozenset[str]]:
        """Shard file -> the tensor names its header holds (readable shards only)."""
        return {s.file: frozenset(s.names) for s in self.scanned.shards if s.readable}

    def describe(self, names: Sequence[str]) -> str:
        """'42 MTP tensors (17.1 kB)' / '3 tensors (1.2 GB)': count, kind and bytes."""
        sizes = self.sizes()
        total = sum(sizes.get(n, 0) for n in names)
        mtp = self.mtp()
        n_mtp = sum(1 for n in names if n in mtp)
        what = "MTP tensors" if n_mtp == len(names) and names else "tensors"
        if 0 < n_mtp < len(names):
            what = f"tensors ({n_mtp} of them MTP)"
        if len(names) == 1:
            what = what.replace("tensors", "tensor", 1)
        return f"{len(names):,} {what} ({format_bytes(total)})"


# -- grouping rules --------------------------------------------------------------------------


def _index_misses_tensors(ctx: _Context, pending: list[Finding]) -> list[Problem]:
    """Shards hold tensors the index does not list (and the stale totals that follow)."""
    mine = [f for f in pending if f.code in (Code.UNINDEXED_TENSOR, Code.UNINDEXED_FILE)]
    index = ctx.scanned.index
    if not mine or index is None:
        return []
    listed = index.weight_map.keys()
    missing = sorted({n for names in ctx.held().values() for n in names} - listed)
    # The totals are short by exactly these tensors' bytes: the same cause, not a second one.
    totals = [
        f for f in pending if f.code in (Code.TOTAL_SIZE_MISMATCH, Code.TOTAL_PARAMETERS_MISMATCH)
    ]
    files = sorted({f.file for f in mine if f.file})
    described = ctx.describe(missing)
    return [
        Problem(
            key="index-misses-tensors",
            severity=Severity.ERROR,
            title=f"{index.file} misses {described.split(' (')[0]}{_where(missing)}",
            impact=f"{described} invisible to loaders: a model loaded through the index "
            "silently lacks them",
            action=_repair(ctx, "index", f"rebuild {index.file} from the shard headers"),
            findings=tuple(mine + totals),
            tensors=tuple(missing),
            files=tuple(files),
        )
    ]


def _sidecars_disagree(ctx: _Context, pending: list[Finding]) -> list[Problem]:
    """Per-layer sidecars that do not describe their shards."""
    mine = [f for f in pending if f.code in _SIDECARS]
    if not mine:
        return []
    held = ctx.held()
    unlisted = sorted(
        {
            n
            for shard, doc in ctx.scanned.sidecars.items()
            for n in held.get(shard, frozenset()) - doc.weight_map.keys()
        }
    )
    # The sidecar files themselves (a disagreement finding may name the index instead).
    sidecars = sorted({f.file for f in mine if f.file and f.file.endswith(".safetensors.json")})
    which = sidecars[0] if len(sidecars) == 1 else f"{len(sidecars)} sidecars"
    index = ctx.scanned.index
    same = index is not None and bool(unlisted) and not (set(unlisted) & index.weight_map.keys())
    if unlisted:
        title = f"{which} {'misses' if len(sidecars) == 1 else 'miss'} "
        title += f"{'the same ' if same else ''}{ctx.describe(unlisted).split(' (')[0]}"
        title += _where(unlisted)
        impact = (
            f"{ctx.describe(unlisted)} unlisted: tools that read the per-layer sidecars "
            "(Model-Optimizer re-import, per-layer loaders) miss them"
        )
    else:
        codes = Counter(f.code for f in mine)
        title = f"{which} disagree with their shards ({_codes_text(codes)})"
        impact = "per-layer loaders read wrong or incomplete tensor lists"
    return [
        Problem(
            key="sidecars-disagree",
            severity=_worst(mine),
            title=title,
            impact=impact,
            action=_repair(ctx, "sidecars", "rebuild each sidecar from its shard's header"),
            findings=tuple(mine),
            tensors=tuple(unlisted),
            files=tuple(sidecars),
        )
    ]


def _shard_files_missing(ctx: _Context, pending: list[Finding]) -> list[Problem]:
    """The index names shards that are not on disk: their tensors are gone."""
    mine = [f for f in pending if f.code == Code.INDEX_MISSING_FILE]
    if not mine:
        return []
    index = ctx.scanned.index
    on_disk = {s.file for s in ctx.scanned.shards}
    gone = sorted({f for f in (index.weight_map.values() if index else ()) if f not in on_disk})
    lost = sorted(n for n, f in index.weight_map.items() if f in set(gone)) if index else []
    names = ", ".join(gone[:_MAX_LISTED]) + (f" and {len(gone) - 3} more" if len(gone) > 3 else "")
    # Same-named dangling tensors are the missing files' contents, not a second problem.
    dangling = [
        f for f in pending if f.code == Code.INDEX_DANGLING_TENSOR and f.tensor in set(lost)
    ]
    return [
        Problem(
            key="shard-files-missing",
            severity=Severity.ERROR,
            title=f"{len(gone)} shard file{'s' if len(gone) != 1 else ''} named by the index "
            f"{'are' if len(gone) != 1 else 'is'} not on disk: {names}",
            impact=f"{len(lost):,} tensors are lost: loading fails or leaves them uninitialised",
            action=Action(
                "restore",
                f"copy {names} again from the source (rebuilding the index would only hide the "
                "loss), or restore them from a reference copy",
                f"ckpt-inspect repair {ctx.path} --from REF",
            ),
            findings=tuple(mine + dangling),
            tensors=tuple(lost),
            files=tuple(gone),
        )
    ]


def _index_stale(ctx: _Context, pending: list[Finding]) -> list[Problem]:
    """The index is unreadable, points wrong, or carries stale totals."""
    mine = [f for f in pending if f.code in _INDEX_STALE]
    if not mine:
        return []
    codes = Counter(f.code for f in mine)
    cosmetic = set(codes) <= {Code.TOTAL_SIZE_MISMATCH, Code.TOTAL_PARAMETERS_MISMATCH}
    index_file = next((f.file for f in mine if f.file), "model.safetensors.index.json")
    if cosmetic:
        title = f"{index_file} has stale totals ({_codes_text(codes)})"
        impact = "cosmetic: loaders do not use the totals, but size checks and tools that "
        impact += "pre-allocate from them do"
    elif Code.INDEX_UNREADABLE in codes:
        title = f"{index_file} cannot be read"
        impact = "no loader can open the checkpoint through its index"
    else:
        title = f"{index_file} points at the wrong places ({_codes_text(codes)})"
        impact = "loading fails, or reads tensors from files that do not hold them"
    return [
        Problem(
            key="index-stale",
            severity=_worst(mine),
            title=title,
            impact=impact,
            action=_repair(ctx, "index", f"rebuild {index_file} from the shard headers"),
            findings=tuple(mine),
            tensors=tuple(sorted({f.tensor for f in mine if f.tensor})),
            files=(index_file,),
        )
    ]


def _duplicates(ctx: _Context, pending: list[Finding]) -> list[Problem]:
    mine = [f for f in pending if f.code == Code.DUPLICATE_TENSOR]
    if not mine:
        return []
    names = sorted({f.tensor for f in mine if f.tensor})
    return [
        Problem(
            key="duplicate-tensors",
            severity=Severity.ERROR,
            title=f"{len(names) or len(mine):,} tensor names are stored in more than one shard",
            impact="loaders keep whichever copy they read last",
            action=_repair(
                ctx,
                "index",
                "decide which copy is right (duplicates policy: first, last or the index's), "
                "then rebuild the index",
            ),
            findings=tuple(mine),
            tensors=tuple(names),
            files=tuple(sorted({f.file for f in mine if f.file})),
        )
    ]


def _shards_damaged(ctx: _Context, pending: list[Finding]) -> list[Problem]:
    mine = [f for f in pending if f.code in _SHARD_DAMAGE]
    if not mine:
        return []
    files = sorted({f.file for f in mine if f.file})
    counts = ctx.scanned.files.set_index("file")["tensors"] if len(ctx.scanned.files) else None
    held = sum(int(counts.get(f, 0)) for f in files) if counts is not None else 0
    shown = ", ".join(files[:_MAX_LISTED]) + (
        f" and {len(files) - 3} more" if len(files) > 3 else ""
    )
    severity = _worst(mine)
    impact = f"{held:,} tensors in {'them' if len(files) != 1 else 'it'} cannot be trusted"
    if severity != Severity.ERROR:
        impact = "strict readers reject the file; lenient ones load it"
    return [
        Problem(
            key="shards-damaged",
            severity=severity,
            title=f"{len(files)} shard{'s are' if len(files) != 1 else ' is'} damaged: {shown} "
            f"({_codes_text(Counter(f.code for f in mine))})",
            impact=impact,
            action=Action(
                "restore",
                f"copy {shown} again from the source, or re-export "
                f"{'them' if len(files) != 1 else 'it'}; nothing here rewrites shard data",
                f"ckpt-inspect repair {ctx.path} --from REF",
            ),
            findings=tuple(mine),
            files=tuple(files),
        )
    ]


def _config_unreadable(ctx: _Context, pending: list[Finding]) -> list[Problem]:
    mine = [f for f in pending if f.code == Code.CONFIG_UNREADABLE]
    if not mine:
        return []
    return [
        Problem(
            key="config-unreadable",
            severity=Severity.ERROR,
            title="config.json is not valid JSON (truncated or overwritten)",
            impact="transformers cannot load the model (AutoConfig fails); the checks here use "
            "what its readable part says",
            action=Action(
                "restore",
                "restore config.json from the training run or the original model; it cannot "
                "be rebuilt from the shards",
                f"ckpt-inspect repair {ctx.path} --from REF",
            ),
            findings=tuple(mine),
            files=tuple(sorted({f.file for f in mine if f.file})),
        )
    ]


def _experts_missing(ctx: _Context, pending: list[Finding]) -> list[Problem]:
    mine = [f for f in pending if f.code in _EXPERTS]
    if not mine:
        return []
    experts = ctx.scanned.experts
    cells: list[tuple[int, int | None]] = []
    title, impact = "", ""
    if len(experts):
        missing = experts[experts["missing"]]
        partial = experts[
            ~experts["missing"] & (experts["tensors_found"] < experts["tensors_expected"])
        ]
        per_layer = missing.groupby("layer").size()
        expected = int(experts.groupby("layer")["expert"].size().max())
        layers = sorted(int(v) for v in per_layer.index)
        cells = [(layer, None) for layer in layers]
        cells += [(int(r.layer), int(r.expert)) for r in partial.itertuples()][:1000]
        # Bytes that should be there: each missing expert weighs what its present siblings do.
        present = experts[~experts["missing"]]
        mean = float(present["bytes"].mean()) if len(present) else 0.0
        parts = []
        if len(missing):
            counts = set(per_layer.tolist())
            each = f"{counts.pop()} of {expected}" if len(counts) == 1 else "some"
            parts.append(
                f"{each} experts missing in {len(layers)} MoE layer"
                f"{'s' if len(layers) != 1 else ''} ({fold_ranges(layers, limit=6)})"
            )
        if len(partial):
            parts.append(f"{len(partial):,} experts incomplete")
        title = "; ".join(parts) or "experts differ from their siblings"
        impact = (
            f"{len(missing):,} experts (about {format_bytes(mean * len(missing))}) were never "
            "written: the model cannot be loaded as its config declares"
            if len(missing)
            else "some experts lack tensors or have odd shapes: loading fails for them"
        )
    return [
        Problem(
            key="experts-missing",
            severity=Severity.ERROR,
            title=title or f"{len(mine)} expert findings",
            impact=impact or "experts are missing or incomplete",
            action=Action(
                "re-export",
                "re-export from the training checkpoint (for an expert-parallel export: with "
                "global expert ids); the missing weights are not in this folder, so no repair "
                "here can restore them",
                "re-run the exporter",
            ),
            findings=tuple(mine),
            tensors=tuple(sorted({f.tensor for f in mine if f.tensor})),
            files=tuple(sorted({f.file for f in mine if f.file})),
            cells=tuple(cells),
        )
    ]


def _quant_config_missing(ctx: _Context, pending: list[Finding]) -> list[Problem]:
    mine = [f for f in pending if f.code == Code.QUANT_CONFIG_MISSING_LAYER]
    if not mine:
        return []
    return [
        Problem(
            key="quant-config-missing-layers",
            severity=Severity.ERROR,
            title=f"hf_quant_config.json lacks {len(mine):,} quantized module"
            f"{'s' if len(mine) != 1 else ''}",
            impact="loaders treat those modules as unquantized and misread their weights",
            action=_repair(
                ctx,
                "quant-config",
                "add the missing quantized_layers entries from their sibling experts' configs "
                "(opt-in: review the diff)",
            ),
            findings=tuple(mine),
            tensors=tuple(sorted({f.tensor for f in mine if f.tensor})),
            files=("hf_quant_config.json",),
        )
    ]


def _dcp(ctx: _Context, pending: list[Finding]) -> list[Problem]:
    out: list[Problem] = []
    gaps = [f for f in pending if f.code in _DCP_GAPS]
    if gaps:
        out.append(
            Problem(
                key="dcp-chunks-broken",
                severity=Severity.ERROR,
                title=f"DCP chunks do not tile {len({f.tensor for f in gaps}):,} tensors "
                f"({_codes_text(Counter(f.code for f in gaps))})",
                impact="consolidation refuses; a rank's file is missing or short",
                action=Action(
                    "restore",
                    "copy the missing or short rank files again, or re-save the checkpoint",
                    "re-save from the training job",
                ),
                findings=tuple(gaps),
                tensors=tuple(sorted({f.tensor for f in gaps if f.tensor})),
                files=tuple(sorted({f.file for f in gaps if f.file})),
            )
        )
    collapsed = [f for f in pending if f.code == Code.MAPPING_COLLAPSED]
    if collapsed and ctx.scanned.dcp is not None:
        out.append(
            Problem(
                key="mapping-collapsed",
                severity=Severity.WARNING,
                title="the recorded file-index mapping sends every tensor to one output file",
                impact="a consolidation that follows it writes one huge file instead of the "
                "reference model's shards",
                action=Action(
                    "consolidate",
                    "consolidate with the reference model's index (the Consolidate tab's "
                    "reference field) instead of the recorded mapping",
                    f"ckpt-inspect consolidate {ctx.path} DEST --reference REF",
                ),
                findings=tuple(collapsed),
                files=tuple(sorted({f.file for f in collapsed if f.file})),
            )
        )
    elif collapsed:
        out.append(
            Problem(
                key="shards-collapsed",
                severity=Severity.WARNING,
                title="every tensor sits in one file over the 5 GB split size",
                impact="loaders read one huge file; hubs and tools expect shards",
                action=Action(
                    "reshard",
                    "split it into shards of at most 5 GB",
                    f"ckpt-inspect repair {ctx.path} --only reshard",
                ),
                findings=tuple(collapsed),
                files=tuple(sorted({f.file for f in collapsed if f.file})),
            )
        )
    return out


def _per_code(ctx: _Context, pending: list[Finding]) -> list[Problem]:
    """What no rule explains: one problem per code, in the code's own words."""
    by_code: dict[str, list[Finding]] = defaultdict(list)
    for f in pending:
        by_code[f.code].append(f)
    out = []
    for code, items in by_code.items():
        known = Code(code) if code in Code._value2member_map_ else None
        kind, text = _ACTIONS.get(known, ("review", "")) if known else ("review", "")
        help_text = known.help if known else items[0].message
        first = help_text.split("; ")[0].split(": ")[0].rstrip(".")
        layers = sorted({f.layer for f in items if f.layer is not None})
        lead = items[0].message.split("; ")[0]
        title = (
            lead if len(items) == 1 else f"{len(items):,} x {code}: {first[0].lower()}{first[1:]}"
        )
        out.append(
            Problem(
                key=code,
                severity=_worst(items),
                title=title if len(title) <= 200 else title[:197] + "...",
                impact=first,
                action=Action(kind, text or help_text.rstrip("."), _command(ctx, kind)),
                findings=tuple(items),
                tensors=tuple(sorted({f.tensor for f in items if f.tensor})),
                files=tuple(sorted({f.file for f in items if f.file})),
                cells=tuple((layer, None) for layer in layers),
            )
        )
    return out


# What fixes a code that no grouping rule explains; codes not listed get "review" and their
# help text.
_ACTIONS: dict[Code, tuple[ActionKind, str]] = {
    Code.LAYER_MISSING: ("re-export", "re-export: the layer's weights are not in this folder"),
    Code.MTP_MISSING: (
        "re-export",
        "re-export with the MTP layers, or set the config's MTP layer count to 0 if the model "
        "has none",
    ),
    Code.LAYER_KEYSET_OUTLIER: (
        "review",
        "compare the layer's keys with its siblings' in the Tensors tab; the exporter built "
        "that layer's state dict differently",
    ),
    Code.TENSOR_ALL_ZERO: (
        "re-export",
        "re-export: a tensor that was never written saves as zeros",
    ),
    Code.TENSOR_NONFINITE: ("re-export", "re-export from a step whose weights are finite"),
    Code.DUPLICATE_TENSOR_CONTENT: (
        "review",
        "decide which copy is right, remove the other shard's copy, then rebuild the index",
    ),
    Code.DUPLICATE_TENSOR_IDENTICAL: ("review", "harmless: remove the extra copy to save space"),
    Code.TORCH_DIST_COMMON_DRIFT: (
        "re-export",
        "re-save the checkpoint from the training job; the finding says which state disagrees "
        "and how to load it meanwhile",
    ),
    Code.TORCH_DIST_MISSING_FILE: ("restore", "copy the missing or short .distcp files again"),
    Code.TORCH_DIST_METADATA_UNREADABLE: ("restore", "copy .metadata again, or re-save"),
    Code.TORCH_DIST_CHUNK_GAP: ("re-export", "re-save the checkpoint from the training job"),
    Code.TORCH_DIST_CHUNK_OVERLAP: ("re-export", "re-save the checkpoint from the training job"),
    Code.TORCH_DIST_METADATA_JSON: (
        "review",
        "re-save with Megatron's distributed checkpointing, which writes metadata.json",
    ),
    Code.TORCH_DIST_COMMON_UNREADABLE: ("restore", "copy common.pt again, or re-save"),
    Code.QUANT_CONFIG_UNREADABLE: ("restore", "restore hf_quant_config.json from the export"),
    Code.QUANT_CONFIG_STALE_LAYER: (
        "review",
        "remove the stale quantized_layers entries, or restore the modules' tensors",
    ),
    Code.MAPPING_UNMAPPED_TENSOR: (
        "consolidate",
        "consolidation places them itself; give a reference index to decide their files",
    ),
    Code.MAPPING_DANGLING_TENSOR: ("review", "harmless for consolidation (e.g. a tied alias)"),
    Code.MAPPING_UNREADABLE: (
        "consolidate",
        "consolidate with a reference index instead of the unreadable mapping",
    ),
    Code.UNINDEXED_FILE: ("review", "remove the stray file, or rebuild the index to include it"),
}


_RULES: tuple[Callable[[_Context, list[Finding]], list[Problem]], ...] = (
    _shards_damaged,
    _shard_files_missing,
    _index_misses_tensors,
    _index_stale,
    _duplicates,
    _sidecars_disagree,
    _config_unreadable,
    _experts_missing,
    _quant_config_missing,
    _dcp,
)


# -- helpers ---------------------------------------------------------------------------------


def _repair(ctx: _Context, part: str, text: str) -> Action:
    return Action("repair", text, f"ckpt-inspect repair {ctx.path} --only {part}", (part,))


def _command(ctx: _Context, kind: ActionKind) -> str:
    return {
        "restore": f"ckpt-inspect repair {ctx.path} --from REF",
        "re-export": "re-run the exporter",
        "consolidate": f"ckpt-inspect consolidate {ctx.path} DEST --reference REF",
    }.get(kind, f"ckpt-inspect check {ctx.path}")


def _worst(findings: Iterable[Finding]) -> Severity:
    return min((Severity(f.severity) for f in findings), key=severity_rank)


def _codes_text(codes: Counter) -> str:
    return ", ".join(f"{code} x{n}" if n > 1 else str(code) for code, n in codes.most_common())


def _where(names: Sequence[str]) -> str:
    """': mtp.layers.0.*' when every name shares a dotted prefix of two parts or more."""
    if not names:
        return ""
    first, last = min(names), max(names)
    common = []
    for a, b in zip(first.split("."), last.split("."), strict=False):
        if a != b:
            break
        common.append(a)
    return f" ({'.'.join(common)}.*)" if len(common) >= 2 and len(names) > 1 else ""


def _quote(path: str) -> str:
    """A path as a shell word (quoted only when it needs it)."""
    import shlex

    return shlex.quote(path)
