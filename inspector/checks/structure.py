"""Model structure against `config.json`: layers, experts, MTP, per-layer key sets. Pure.

Expected facts come from the config when it says them and from the siblings' majority when it
does not, so a checkpoint without a config is still checked for internal consistency.
"""

from __future__ import annotations

from collections import Counter, defaultdict

import pandas as pd

from inspector.findings import Finding, examples, fold_ranges, make_finding
from inspector.model import ScannedCheckpoint

__all__ = ["check_structure"]

# Bounded output on pathological checkpoints: beyond this many findings of one code the rest
# are summarized in one finding.
_LIMIT = 200


def check_structure(scanned: ScannedCheckpoint) -> list[Finding]:
    """layer-missing, mtp-missing, expert-missing, expert-incomplete, expert-shape-mismatch,
    layer-keyset-outlier."""
    t = scanned.tensors
    if t.empty:
        return []
    out: list[Finding] = []
    out += _layer_missing(scanned)
    out += _mtp_missing(scanned)
    experts = _expert_rows(t)
    if not experts.empty:
        out += _expert_missing(scanned, experts)
        out += _expert_incomplete(experts)
        out += _expert_shape_mismatch(experts)
    out += _keyset_outliers(scanned)
    return out


# -- layers --------------------------------------------------------------------------------


def _stacked(t: pd.DataFrame) -> bool:
    """torch_dist saves homogeneous stacks without a layer number: layer checks can't apply."""
    no_layer = t["layer"].isna()
    return bool(
        no_layer.any() and t.loc[no_layer, "name"].str.contains(r"\blayers\.", regex=True).any()
    )


def _layer_missing(scanned: ScannedCheckpoint) -> list[Finding]:
    n = scanned.spec.num_layers
    if n is None or _stacked(scanned.tensors):
        return []
    present = set(scanned.tensors["layer"].dropna().astype(int))
    missing = [i for i in range(n) if i not in present]
    if not missing:
        return []
    where = f"{scanned.spec.source or 'config.json'} declares {n} layers (0-{n - 1})"
    if len(missing) > 20:
        return [
            make_finding(
                "layer-missing",
                f"layers {fold_ranges(missing)} have no tensors ({len(missing)} of {n}); {where}",
            )
        ]
    return [
        make_finding("layer-missing", f"layer {i} has no tensors; {where}", layer=i)
        for i in missing
    ]


def _mtp_missing(scanned: ScannedCheckpoint) -> list[Finding]:
    declared = scanned.spec.mtp_layers
    layers = scanned.layers
    stored = int(layers["is_mtp"].sum()) if len(layers) else 0
    has_mtp_tensors = bool((scanned.tensors["kind"] == "mtp").any())
    if declared <= 0 or stored or has_mtp_tensors:
        return []
    return [
        make_finding(
            "mtp-missing",
            f"config declares {declared} MTP layer(s) but no MTP tensor is stored; MTP speculative "
            "decoding will fail. Re-export with the MTP weights (a transformers round trip drops them)",
        )
    ]


# -- experts -------------------------------------------------------------------------------


def _expert_rows(t: pd.DataFrame) -> pd.DataFrame:
    rows = t[t["expert"].notna() & t["layer"].notna()]
    rows = rows[rows["kind"] == "expert"]
    return pd.DataFrame(
        {
            "name": rows["name"].to_numpy(),
            "file": rows["file"].astype(str).to_numpy(),
            "layer": rows["layer"].astype(int).to_numpy(),
            "expert": rows["expert"].astype(int).to_numpy(),
            "key": (rows["module"].astype(str) + "." + rows["param"].astype(str)).to_numpy(),
            "dtype": rows["dtype"].astype(str).to_numpy(),
            "shape": rows["shape"].to_numpy(),
        }
    )


def _expert_missing(scanned: ScannedCheckpoint, e: pd.DataFrame) -> list[Finding]:
    ids_by_layer = e.groupby("layer")["expert"].unique()
    declared = scanned.spec.experts_per_layer
    if declared is not None:
        expected, basis = set(range(declared)), f"config declares {declared}"
    else:
        sizes = Counter(len(ids) for ids in ids_by_layer)
        biggest = max(ids_by_layer, key=len)
        expected, basis = set(int(i) for i in biggest), f"its sibling layers have {len(biggest)}"
        if len(sizes) == 1:
            return []
    moe_layers = set(ids_by_layer.index)
    if scanned.spec.moe_layers is not None:
        present = set(scanned.tensors["layer"].dropna().astype(int))
        moe_layers |= {i for i in scanned.spec.moe_layers if i in present}
    out = []
    files = e.groupby("layer")["file"].agg(lambda s: s.mode().iat[0])
    for layer in sorted(moe_layers):
        have = set(int(i) for i in ids_by_layer.get(layer, ()))
        missing = sorted(expected - have)
        if not missing:
            continue
        file = files.get(layer)
        out.append(
            make_finding(
                "expert-missing",
                f"layer {layer}: experts {fold_ranges(missing)} missing ({len(missing)} of "
                f"{len(expected)}; {basis})" + (f" in {file}" if file else ""),
                file=file,
                layer=layer,
                expert=missing[0] if len(missing) == 1 else None,
            )
        )
    return out


def _expert_incomplete(e: pd.DataFrame) -> list[Finding]:
    """An expert with fewer parameter tensors than the union its layer's experts agree on."""
    keys = e.groupby(["layer", "expert"])["key"].agg(frozenset)
    out: list[Finding] = []
    for layer, per_expert in keys.groupby(level=0):
        counts = Counter(k for ks in per_expert for k in ks)
        n = len(per_expert)
        # A key most experts have is expected of all; a rare key is not demanded.
        expected = {k for k, c in counts.items() if c * 2 > n}
        groups: dict[frozenset[str], list[int]] = defaultdict(list)
        for (_, expert), ks in per_expert.items():
            lacking = frozenset(expected - ks)
            if lacking:
                groups[lacking].append(int(expert))
        for lacking, experts in groups.items():
            out.append(
                make_finding(
                    "expert-incomplete",
                    f"layer {layer}: experts {fold_ranges(experts)} lack "
                    f"{examples(sorted(lacking))} that {len(per_expert) - len(experts)} sibling "
                    "experts have",
                    layer=int(layer),
                    expert=experts[0] if len(experts) == 1 else None,
                )
            )
    return out[:_LIMIT]


def _expert_shape_mismatch(e: pd.DataFrame) -> list[Finding]:
    sig = e["dtype"] + " " + e["shape"].map(lambda s: str(list(s)))
    e = e.assign(sig=sig)
    out: list[Finding] = []
    for (layer, key), grp in e.groupby(["layer", "key"], sort=True):
        if grp["sig"].nunique() == 1:
            continue
        common = grp["sig"].mode().iat[0]
        odd = grp[grp["sig"] != common]
        for sig_value, sub in odd.groupby("sig"):
            experts = sorted(sub["expert"].tolist())
            out.append(
                make_finding(
                    "expert-shape-mismatch",
                    f"layer {layer}: {key} of experts {fold_ranges(experts)} is {sig_value}, "
                    f"expected {common} like its siblings",
                    file=str(sub["file"].iat[0]),
                    tensor=str(sub["name"].iat[0]),
                    layer=int(layer),
                    expert=experts[0] if len(experts) == 1 else None,
                )
            )
            if len(out) >= _LIMIT:
                return out
    return out


# -- key sets ------------------------------------------------------------------------------


def _keyset_outliers(scanned: ScannedCheckpoint) -> list[Finding]:
    """A layer whose key suffixes differ from the others of its kind (MTP compared by params)."""
    t = scanned.tensors
    rows = t[t["layer"].notna()]
    if rows.empty:
        return []
    layer_kind = dict(zip(scanned.layers["layer"], scanned.layers["kind"], strict=False))
    is_mtp = dict(zip(scanned.layers["layer"], scanned.layers["is_mtp"], strict=False))
    keys = (rows["module"].astype(str) + "." + rows["param"].astype(str)).to_numpy()
    sets: dict[int, set[str]] = defaultdict(set)
    params: dict[int, set[str]] = defaultdict(set)
    for layer, key, param in zip(
        rows["layer"].astype(int), keys, rows["param"].astype(str), strict=True
    ):
        sets[layer].add(key)
        params[layer].add(param)
    decoder = [l for l in sets if not is_mtp.get(l, False)]
    out = _decoder_outliers(decoder, sets, layer_kind)
    decoder_params = set().union(*(params[l] for l in decoder)) if decoder else set()
    for layer in sorted(l for l in sets if is_mtp.get(l, False)):
        extra = sorted(params[layer] - decoder_params)
        if decoder and extra:
            out.append(
                make_finding(
                    "layer-keyset-outlier",
                    f"MTP layer {layer} carries {examples(extra)} entries that no decoder layer "
                    "has; the MTP block built its state dict differently (check the exporter)",
                    layer=layer,
                )
            )
    return out


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
        frozen = {l: frozenset(sets[l]) for l in members}
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
    return out[:_LIMIT]
