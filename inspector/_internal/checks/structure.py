"""Model structure against `config.json`: layers, experts, MTP, per-layer key sets. Pure.

Expected facts come from the config when it says them and from the siblings' majority when it
does not, so a checkpoint without a config is still checked for internal consistency.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from inspector._internal.checkpoint.naming import KINDS, parse_names
from inspector._internal.checkpoint.naming_rules import LAYERS_CONTAINER, QUANT_SIBLING_PARAMS
from inspector._internal.checkpoint.scanned import LayoutName, ScannedCheckpoint
from inspector._internal.checkpoint.spec import MTP_NOT_STORED
from inspector._internal.checkpoint.tables import ScanColumns, layer_keys, scan_columns
from inspector._internal.checks.draft import is_draft
from inspector._internal.common.display import legible
from inspector._internal.common.filenames import CONFIG_NAME
from inspector._internal.common.text import examples, fold_ranges, fold_spans, plural
from inspector._internal.findings.codes import Code, code_set
from inspector._internal.findings.finding import Finding, besides, fold, fold_findings, make_finding

if TYPE_CHECKING:
    from inspector._internal.load.verdict import LoadVerdict

__all__ = ["CODES", "MODEL_CODES", "check_structure", "revise_mtp_with_model"]


def _unique(
    values: np.ndarray, *, return_counts: bool = False, return_inverse: bool = False
) -> Any:
    """`np.unique` for the non-negative integer codes used here: a bincount when the codes
    are dense enough (no sort, no hash table), `np.unique` otherwise. Same results."""
    values = np.asarray(values)
    top = int(values.max()) + 1 if values.size else 0
    if (
        values.dtype.kind not in "iu"
        or top > 4 * values.size + 1_000_000
        or (values.size and int(values.min()) < 0)
        or (return_inverse and return_counts)
    ):
        if return_inverse:
            return np.unique(values, return_inverse=True)
        return np.unique(values, return_counts=True) if return_counts else np.unique(values)
    counts = np.bincount(values, minlength=top)
    present = np.flatnonzero(counts)
    if return_inverse:
        # Each value's rank among the distinct ones: what np.unique's inverse is, without
        # its sort (a copy and an argsort of every row, at `check`'s peak).
        rank = np.cumsum(counts > 0) - 1
        return present, rank[values]
    return (present, counts[present]) if return_counts else present


CODES = code_set(
    Code.LAYER_MISSING,
    Code.MTP_MISSING,
    Code.MTP_NOT_STORED,
    Code.EXPERT_MISSING,
    Code.EXPERT_INCOMPLETE,
    Code.EXPERT_SHAPE_MISMATCH,
    Code.LAYER_KEYSET_OUTLIER,
)
# What `revise_mtp_with_model` may revise.
MODEL_CODES = code_set(Code.MTP_MISSING, Code.MTP_NOT_STORED)


def check_structure(scanned: ScannedCheckpoint) -> list[Finding]:
    """layer-missing, mtp-missing, expert-missing, expert-incomplete, expert-shape-mismatch,
    layer-keyset-outlier."""
    columns = scan_columns(scanned)
    if not len(columns.tensors.names):
        return []
    out: list[Finding] = []
    # An EAGLE draft's decoder layer is `midlayer` (EAGLE-3) or `layers.0` beside `fc`: its
    # config's num_hidden_layers counts draft layers, not a model's (checks.draft judges it).
    if not is_draft(scanned):
        out += _layer_missing(scanned)
    out += _mtp_missing(scanned)
    experts = _expert_rows(columns)
    if not experts.empty:
        out += _expert_missing(scanned, experts)
        out += _expert_incomplete(experts)
        out += _expert_shape_mismatch(experts)
    out += _keyset_outliers(scanned)
    return out


# -- layers --------------------------------------------------------------------------------


def _stacked(columns: ScanColumns) -> bool:
    """torch_dist saves homogeneous stacks without a layer number: layer checks can't apply."""
    names = columns.tensors.names
    no_layer = np.flatnonzero(columns.numbering.layer < 0).tolist()
    return any(LAYERS_CONTAINER.search(names[row]) for row in no_layer)


def _present_layers(scanned: ScannedCheckpoint) -> set[int]:
    """The layer numbers the tensors table holds: its distinct values first, then a set of
    those few (a set built from the column makes a Python int per tensor). Kept with the
    scan: the layer and the expert rules both ask."""

    def present() -> frozenset[int]:
        layer = scan_columns(scanned).numbering.layer
        return frozenset(_unique(layer[layer >= 0]).tolist())

    return set(scanned.derived("present-layers", present))


def _layer_missing(scanned: ScannedCheckpoint) -> list[Finding]:
    n = scanned.spec.num_layers
    if n is None or _stacked(scan_columns(scanned)):
        return []
    present = _present_layers(scanned)
    missing = [i for i in range(n) if i not in present]
    if not missing:
        return []
    where = f"{legible(scanned.spec.source or CONFIG_NAME)} declares {n} layers (0-{n - 1})"

    def detail(_group: str | None, layer: int) -> Finding:
        return make_finding(
            Code.LAYER_MISSING, f"layer {layer} has no tensors; {where}", layer=layer
        )

    def summary(_group: str | None, rest: Sequence[int], shown: int) -> Finding:
        return make_finding(
            Code.LAYER_MISSING,
            f"layers {fold_ranges(rest)} have no tensors{besides(shown)} "
            f"({len(missing)} of {n} missing); {where}",
        )

    return fold(missing, detail, summary)


def _mtp_missing(scanned: ScannedCheckpoint) -> list[Finding]:
    declared = scanned.spec.mtp_layers
    columns = scan_columns(scanned)
    stored = int(columns.layers["is_mtp"].sum())
    has_mtp_tensors = bool((columns.numbering.kind == _MTP_KIND).any())
    if declared <= 0 or stored or has_mtp_tensors:
        return []
    never = _saved_by_transformers(scanned) and scanned.spec.model_type in MTP_NOT_STORED
    return [_mtp_finding(scanned, not_stored=never)]


# Layouts `save_pretrained` writes. Megatron, Model-Optimizer exports (per-layer, or with
# hf_quant_config.json) and DCP outputs store the MTP layers a config declares.
_PRETRAINED_LAYOUTS = frozenset(
    {LayoutName.HF_SHARDED, LayoutName.SAFETENSORS_SINGLE, LayoutName.PYTORCH_BIN}
)


def _saved_by_transformers(scanned: ScannedCheckpoint) -> bool:
    return scanned.layout in _PRETRAINED_LAYOUTS and scanned.quant_config is None


def _mtp_finding(
    scanned: ScannedCheckpoint, *, not_stored: bool, built: str | None = None
) -> Finding:
    """mtp-not-stored or mtp-missing; `built`: the architecture the model rule built."""
    declared = scanned.spec.mtp_layers
    if not_stored:
        model = scanned.spec.model_type or "this architecture"
        shows = f", as the {legible(built)} built from config.json shows" if built else ""
        return make_finding(
            Code.MTP_NOT_STORED,
            f"config declares {plural(declared, 'MTP layer')} the writer's model class never "
            f"stores ({legible(model)}: transformers builds no MTP module for it{shows}); fine for "
            "transformers. MTP speculative decoding in serving engines needs them: restore "
            "them with `ckpt-inspect repair --from <original release>`",
        )
    has = f"; the {legible(built)} built from config.json has MTP modules" if built else ""
    return make_finding(
        Code.MTP_MISSING,
        f"config declares {plural(declared, 'MTP layer')} but no MTP tensor is stored{has}; MTP "
        "speculative decoding will fail. Re-export with the MTP weights (a transformers "
        "round trip drops them)",
    )


def revise_mtp_with_model(
    scanned: ScannedCheckpoint, verdict: LoadVerdict, findings: list[Finding]
) -> list[Finding]:
    """The model rule (`inspector._internal.checks.registry`): with the model built from
    config.json, whether its class stores MTP layers is known exactly, not from the `MTP_NOT_STORED`
    table: a class with MTP modules misses their keys in the verdict (then the save lost
    them: mtp-missing), one without never stores them (mtp-not-stored)."""
    ours = [f for f in findings if f.code in (Code.MTP_MISSING, Code.MTP_NOT_STORED)]
    if not verdict.ran or not ours or not _saved_by_transformers(scanned):
        return findings
    has_mtp = _names_mtp(scanned, verdict.missing)
    want = Code.MTP_MISSING if has_mtp else Code.MTP_NOT_STORED
    if all(f.code == want for f in ours):
        return findings
    revised = _mtp_finding(scanned, not_stored=not has_mtp, built=verdict.architecture or "model")
    return [*(f for f in findings if f not in ours), revised]


def _names_mtp(scanned: ScannedCheckpoint, names: Sequence[str]) -> bool:
    """Any of `names` in an MTP block (`mtp.*`, or a layer past the decoder's)."""
    parsed = parse_names(list(names))
    layers = scanned.spec.num_layers
    past = parsed.layer >= layers if layers is not None else np.zeros(len(names), dtype=bool)
    return bool((parsed.mtp | (past & ~parsed.mtp)).any())


# -- experts -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Experts:
    """The expert tensors as integer-coded numpy columns: grouping 300,000 rows is done with
    `np.unique` on combined codes, and Python only loops over the distinct groups."""

    at: np.ndarray  # the expert rows' positions in the tensors table
    file: np.ndarray  # their file, a code into `files`
    files: list[str]
    names: list[str]  # the whole table's names (`at` are positions into it)
    layer: np.ndarray
    expert: np.ndarray
    key: np.ndarray  # index into `keys`
    keys: list[str]
    sig: np.ndarray  # index into `sigs`
    sigs: list[str]

    @property
    def empty(self) -> bool:
        return len(self.layer) == 0


_MTP_KIND = KINDS.index("mtp")
_EXPERT_KIND = KINDS.index("expert")


def _expert_rows(columns: ScanColumns) -> _Experts:
    """The expert tensors (kind expert, with an expert and a layer number), from the scan's
    columns: each column's expert rows taken as codes, no frame."""
    numbering, source = columns.numbering, columns.tensors
    mask = (numbering.kind == _EXPERT_KIND) & (columns.parsed.expert >= 0) & (numbering.layer >= 0)
    at = np.flatnonzero(mask)
    module, param = columns.parsed.texts["module"], columns.parsed.texts["param"]
    key, keys, _ = _key_codes(module.codes[at], module.values, param.codes[at], param.values)
    sig, sigs = _sig_codes(
        source.dtype_codes[at], source.dtypes, source.shape.codes[at], source.shape.values
    )
    return _Experts(
        at=at,
        file=source.file_codes[at],
        files=source.files,
        names=source.names,
        layer=numbering.layer[at],
        expert=columns.parsed.expert[at],
        key=key,
        keys=keys,
        sig=sig,
        sigs=sigs,
    )


def _key_codes(
    module: np.ndarray, modules: Sequence[str], param: np.ndarray, params: Sequence[str]
) -> tuple[np.ndarray, list[str], list[tuple[str, str]]]:
    """`module.param` of each row as a code, with (module, param) of each code, in the order
    of the (module, param) codes; each distinct pair is joined once."""
    width = max(len(params), 1)
    pairs, inverse = _unique(module.astype(np.int64) * width + param, return_inverse=True)
    parts = [(modules[p // width], params[p % width]) for p in pairs.tolist()]
    keys = [f"{m}.{p}" for m, p in parts]
    return np.asarray(inverse).reshape(-1), keys, parts


def _sig_codes(
    dtype: np.ndarray, dtypes: Sequence[str], shape: np.ndarray, shapes: Sequence[tuple[int, ...]]
) -> tuple[np.ndarray, list[str]]:
    """'BF16 [8, 8]' (dtype and shape) of each row as a code, formatted once per pair."""
    n = max(len(shapes), 1)
    pairs, inverse = _unique(dtype.astype(np.int64) * n + shape, return_inverse=True)
    sigs = [f"{dtypes[p // n]} {list(shapes[p % n])}" for p in pairs.tolist()]
    return np.asarray(inverse).reshape(-1), sigs


def _by_first(codes: np.ndarray, width: int) -> dict[int, list[int]]:
    """Distinct `first * width + second` codes -> {first: [second, ...]} (sorted)."""
    out: dict[int, list[int]] = defaultdict(list)
    distinct = _unique(codes)
    if not len(distinct):
        return out
    # Sorted codes: each first's seconds are one run, split where the first changes (a
    # Python step per first, not per code: 85,000 experts in a 1M-tensor check).
    first, second = np.divmod(distinct, width)
    cuts = np.flatnonzero(np.diff(first)) + 1
    starts = [0, *cuts.tolist()]
    runs = np.split(second, cuts)
    out.update(zip(first[starts].tolist(), (r.tolist() for r in runs), strict=True))
    return out


def _expert_missing(scanned: ScannedCheckpoint, e: _Experts) -> list[Finding]:
    """Expert ids a MoE layer lacks, against the most experts any source expects of it (the
    config, the layer's router, the sibling layers: the layers table's experts_expected)."""
    width = int(e.expert.max()) + 1
    ids_by_layer = {k: set(v) for k, v in _by_first(e.layer * width + e.expert, width).items()}
    layers = scan_columns(scanned).layers
    numbers = layers["layer"].tolist()
    expected_of = dict(zip(numbers, layers["experts_expected"].tolist(), strict=True))
    source_of = dict(zip(numbers, list(layers["experts_source"]), strict=True))
    moe_layers = set(ids_by_layer)
    if scanned.spec.moe_layers is not None:
        present = _present_layers(scanned)
        moe_layers |= {i for i in scanned.spec.moe_layers if i in present}
    out = []
    files = _file_mode(e)
    mtp = set(layers["layer"][layers["is_mtp"]].tolist())
    for layer in sorted(moe_layers):
        expected = int(expected_of.get(layer, 0))
        missing = _gaps(expected, ids_by_layer.get(layer, set()))
        if not missing:
            continue
        count = sum(end - start + 1 for start, end in missing)
        file = files.get(layer)
        basis = _expert_basis(source_of.get(layer, ""), expected, layer in mtp)
        out.append(
            make_finding(
                "expert-missing",
                f"{'MTP layer' if layer in mtp else 'layer'} {layer}: experts "
                f"{fold_spans(missing)} missing ({count} of {expected}; {basis})"
                + (f" in {legible(file)}" if file else ""),
                file=file,
                layer=layer,
                expert=missing[0][0] if count == 1 else None,
            )
        )
    return fold_findings(out, "MoE layers with missing experts")


def _gaps(expected: int, present: set[int]) -> list[tuple[int, int]]:
    """The ids of 0..expected-1 not in `present`, as inclusive ranges: from the ids present,
    never a set of every expected id (the siblings' count is the highest id stored plus one,
    and one hostile tensor named `experts.999999999` made that set a billion ints: out of
    memory)."""
    spans: list[tuple[int, int]] = []
    start = 0
    for i in sorted(i for i in present if i < expected):
        if i > start:
            spans.append((start, i - 1))
        start = i + 1
    if start < expected:
        spans.append((start, expected - 1))
    return spans


def _expert_basis(source: str, expected: int, mtp: bool) -> str:
    """Which source set the expectation, as the finding says it."""
    if source == "config":
        return f"config declares {expected}"
    if source == "router":
        block = "block's" if mtp else "layer's"
        return f"the {block} router weight has {expected} rows, one per expert"
    return f"its sibling layers hold experts up to id {expected - 1}"


def _file_mode(e: _Experts) -> dict[int, str]:
    """The file holding most of each layer's expert tensors (ties: the first by name)."""
    file, files = e.file, e.files
    order = np.argsort(np.array(files, dtype=object), kind="stable")
    rank = np.empty(len(files), dtype=np.int64)
    rank[order] = np.arange(len(files))
    width = len(files)
    codes, counts = _unique(e.layer * width + rank[file], return_counts=True)
    best: dict[int, tuple[int, int]] = {}
    for code, count in zip(codes.tolist(), counts.tolist(), strict=True):
        layer, r = divmod(code, width)
        if layer not in best or count > best[layer][0]:
            best[layer] = (count, r)
    return {layer: files[int(order[r])] for layer, (_, r) in best.items()}


def _expert_incomplete(e: _Experts) -> list[Finding]:
    """An expert with fewer parameter tensors than the union its layer's experts agree on."""
    n_keys, width = len(e.keys), int(e.expert.max()) + 1
    triples = _unique((e.layer * width + e.expert) * n_keys + e.key)
    owner, key = np.divmod(triples, n_keys)  # owner = layer * width + expert
    layer = owner // width
    experts_of = {k: len(v) for k, v in _by_first(owner, width).items()}
    # How many experts of its layer hold each key; a key most experts have is expected of
    # all, a rare key is not demanded.
    lk, lk_counts = _unique(layer * n_keys + key, return_counts=True)
    expected: dict[int, set[int]] = defaultdict(set)
    for code, count in zip(lk.tolist(), lk_counts.tolist(), strict=True):
        if count * 2 > experts_of[code // n_keys]:
            expected[code // n_keys].add(code % n_keys)
    is_expected = np.isin(
        layer * n_keys + key, [lyr * n_keys + k for lyr in expected for k in expected[lyr]]
    )
    owners, held = _unique(owner[is_expected], return_counts=True)
    all_owners = _unique(owner)
    # Per owner, the expected keys it holds against those its layer expects (in numpy: one
    # row per expert of the checkpoint).
    holds = np.zeros(len(all_owners), np.int64)
    holds[np.searchsorted(all_owners, owners)] = held
    layers, at = np.unique(all_owners // width, return_inverse=True)
    wants = np.asarray([len(expected.get(n, ())) for n in layers.tolist()], np.int64)[at]
    short = all_owners[holds < wants].tolist()
    return _incomplete_findings(e, short, owner, key, width, expected, experts_of)


def _incomplete_findings(
    e: _Experts,
    short: list[int],
    owner: np.ndarray,
    key: np.ndarray,
    width: int,
    expected: dict[int, set[int]],
    experts_of: dict[int, int],
) -> list[Finding]:
    groups: dict[int, dict[frozenset[str], list[int]]] = defaultdict(lambda: defaultdict(list))
    for code in short:
        layer, expert = divmod(code, width)
        have = set(key[owner == code].tolist())
        lacking = frozenset(e.keys[k] for k in expected[layer] - have)
        groups[layer][lacking].append(expert)
    out: list[Finding] = []
    for layer in sorted(groups):
        for lacking, experts in groups[layer].items():
            out.append(
                make_finding(
                    "expert-incomplete",
                    f"layer {layer}: experts {fold_ranges(experts)} lack "
                    f"{examples(sorted(lacking))} that {experts_of[layer] - len(experts)} sibling "
                    "experts have",
                    layer=layer,
                    expert=experts[0] if len(experts) == 1 else None,
                )
            )
    return fold_findings(out, "expert groups lacking tensors their siblings have")


def _expert_shape_mismatch(e: _Experts) -> list[Finding]:
    n_keys, n_sigs = len(e.keys), len(e.sigs)
    codes, counts = _unique((e.layer * n_keys + e.key) * n_sigs + e.sig, return_counts=True)
    by_group: dict[int, dict[int, int]] = defaultdict(dict)
    for code, count in zip(codes.tolist(), counts.tolist(), strict=True):
        by_group[code // n_sigs][code % n_sigs] = count
    odd = [g for g, sigs in by_group.items() if len(sigs) > 1]
    out: list[Finding] = []
    for group in sorted(odd, key=lambda g: (g // n_keys, e.keys[g % n_keys])):
        layer, key = divmod(group, n_keys)
        counts_of = {e.sigs[s]: c for s, c in by_group[group].items()}
        top = max(counts_of.values())
        common = min(s for s, c in counts_of.items() if c == top)
        for sig_value in sorted(s for s in counts_of if s != common):
            sig = e.sigs.index(sig_value)
            rows = np.flatnonzero((e.layer == layer) & (e.key == key) & (e.sig == sig))
            experts = sorted(e.expert[rows].tolist())
            out.append(
                make_finding(
                    "expert-shape-mismatch",
                    f"layer {layer}: {legible(e.keys[key])} of experts {fold_ranges(experts)} is "
                    f"{legible(sig_value)}, expected {legible(common)} like its siblings",
                    file=e.files[e.file[rows[0]]],
                    tensor=e.names[e.at[rows[0]]],
                    layer=layer,
                    expert=experts[0] if len(experts) == 1 else None,
                )
            )
    return fold_findings(out, "expert tensors whose shape or dtype differs from their siblings'")


# -- key sets ------------------------------------------------------------------------------


def _keyset_outliers(scanned: ScannedCheckpoint) -> list[Finding]:
    """A layer whose keys (`module.param` after the layer prefix, sharded objects included)
    differ from the others of its kind; an MTP block's standard parts (attention, MLP,
    experts, router) against the decoder layers, its own head (enorm, hnorm, eh_proj, final
    norm) left out: entries no decoder layer has, and params of a module that every decoder
    layer holding that module has and the block lacks."""
    rows = layer_keys(scanned)
    if not len(rows.layer):
        return []
    layers = scan_columns(scanned).layers
    layer_kind = dict(zip(layers["layer"].tolist(), layers["kind"], strict=False))
    is_mtp = dict(zip(layers["layer"].tolist(), layers["is_mtp"].tolist(), strict=False))
    layer = rows.layer
    key, keys, parts = _key_codes(rows.module, rows.modules, rows.param, rows.params)
    sets = {
        n: {keys[k] for k in ks} for n, ks in _by_first(layer * len(keys) + key, len(keys)).items()
    }
    decoder = [n for n in sets if not is_mtp.get(n, False)]
    out = _decoder_outliers(decoder, sets, layer_kind)
    if not decoder:
        return out
    decoder_keys = set().union(*(sets[n] for n in decoder))
    common = _common_params(decoder, sets, keys, parts)
    head = rows.kind == _MTP_KIND
    block = {
        n: [keys[k] for k in ks]
        for n, ks in _by_first(layer[~head] * len(keys) + key[~head], len(keys)).items()
    }
    for mtp_layer in sorted(n for n in sets if is_mtp.get(n, False)):
        held = block.get(mtp_layer, [])
        extra = sorted(set(held) - decoder_keys)
        lacking = _lacking(held, common, parts, keys)
        if not extra and not lacking:
            continue
        said = []
        if extra:
            said.append(f"carries {examples(extra)} entries that no decoder layer has")
        if lacking:
            said.append(
                f"lacks {examples(lacking)}, which every decoder layer holding the module has"
            )
        out.append(
            make_finding(
                "layer-keyset-outlier",
                f"MTP layer {mtp_layer} {' and '.join(said)}; the MTP block built its state "
                "dict differently (check the exporter)",
                layer=mtp_layer,
            )
        )
    return out


def _quant_param(param: str) -> bool:
    """A quantization scale or quantizer state (`weight_scale`, `input_quantizer._amax`)."""
    return param in QUANT_SIBLING_PARAMS or param.partition(".")[0].endswith("_quantizer")


def _common_params(
    decoder: list[int], sets: dict[int, set[str]], keys: list[str], parts: list[tuple[str, str]]
) -> dict[str, set[str]]:
    """Module -> the params every decoder layer that holds the module has (one pass over each
    layer's keys)."""
    index = {k: i for i, k in enumerate(keys)}
    common: dict[str, set[str]] = {}
    for n in decoder:
        mine: dict[str, set[str]] = defaultdict(set)
        for k in sets[n]:
            module, param = parts[index[k]]
            mine[module].add(param)
        for module, params in mine.items():
            if module in common:
                common[module] &= params
            else:
                common[module] = params
    return common


def _lacking(
    held: list[str], common: dict[str, set[str]], parts: list[tuple[str, str]], keys: list[str]
) -> list[str]:
    """`module.param` entries of the decoder's common params an MTP block's modules lack. A
    module the block stores unquantized (no scale or quantizer state) while the decoder
    quantizes it lacks only quantization params: exporters leave the MTP block out of
    quantization on purpose (its serving path runs it in full precision), so that is no
    outlier."""
    index = {k: i for i, k in enumerate(keys)}
    mine: dict[str, set[str]] = defaultdict(set)
    for k in held:
        module, param = parts[index[k]]
        mine[module].add(param)
    out = []
    for module, params in mine.items():
        missing = common.get(module, set()) - params
        if not any(map(_quant_param, params)):
            missing = {p for p in missing if not _quant_param(p)}
        out += [f"{module}.{p}" for p in missing]
    return sorted(out)


def _decoder_outliers(
    layers: list[int], sets: dict[int, set[str]], kinds: dict[int, str]
) -> list[Finding]:
    out: list[Finding] = []
    by_kind: dict[str, list[int]] = defaultdict(list)
    for layer in layers:
        by_kind[kinds.get(layer, "other")].append(layer)
    for kind, members in by_kind.items():
        if len(members) < 3:
            continue
        frozen = {n: frozenset(sets[n]) for n in members}
        common, votes = Counter(frozen.values()).most_common(1)[0]
        if votes * 2 <= len(members):
            continue
        for layer in sorted(members):
            extra, lacking = sorted(frozen[layer] - common), sorted(common - frozen[layer])
            if not extra and not lacking:
                continue
            parts = [
                f"extra {examples(extra)}" if extra else "",
                f"lacks {examples(lacking)}" if lacking else "",
            ]
            out.append(
                make_finding(
                    "layer-keyset-outlier",
                    f"layer {layer} ({kind}): key set differs from {votes} sibling {kind} layers: "
                    + "; ".join(p for p in parts if p),
                    layer=layer,
                )
            )
    return fold_findings(out, "layers whose key set differs from their siblings'")
