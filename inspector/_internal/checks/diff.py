"""`diff A B`: what differs between two checkpoints, by name, dtype, shape, layer key set and,
on request, content hash (to prove a consolidation or a repair changed no weight).

With `reference=True`, A is the checkpoint B was derived from (the BF16 original of a
quantized export, the source of a conversion) and every difference is classified as expected
(quantization scales added, dtype changed by quantization, experts fused or unfused, MTP
added) or unexpected (MTP, experts, lm_head or layers lost, shapes changed, other tensors lost
or added), so that a CI step can accept an export whose differences are all expected.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Collection
from dataclasses import asdict, dataclass, field
from typing import Any

from inspector._internal.checkpoint.loaded import kept_signatures, tensor_data
from inspector._internal.checkpoint.naming import LONG_NAME, parse_names
from inspector._internal.checkpoint.places import places_text
from inspector._internal.checkpoint.scanned import ScannedCheckpoint
from inspector._internal.common.display import legible
from inspector._internal.common.dtypes import FLOAT_DTYPES
from inspector._internal.common.text import examples
from inspector._internal.load.quant_view import QUANT_PARAMS
from inspector.errors import InspectorError

__all__ = [
    "REFERENCE_KINDS",
    "CheckpointDiff",
    "DiffClass",
    "LayerKeyDiff",
    "TensorChange",
    "diff_checkpoints",
    "missing_shards",
]

# Kinds of difference against a reference: (expected?, what it means).
REFERENCE_KINDS: dict[str, tuple[bool, str]] = {
    "quantization-scales-added": (True, "quantization scales added"),
    "quantized": (True, "dtype changed by quantization"),
    "dequantized": (True, "quantization removed (full-precision weight, scales dropped)"),
    "experts-fused": (True, "per-expert tensors fused into one tensor per projection"),
    "experts-unfused": (True, "fused expert tensors split per expert"),
    "mtp-added": (True, "MTP layers added"),
    "lm-head-tied": (True, "lm_head dropped for the tied input embedding"),
    "mtp-lost": (False, "MTP layers lost"),
    "experts-lost": (False, "experts lost"),
    "lm-head-lost": (False, "lm_head lost"),
    "layers-lost": (False, "whole decoder layers lost"),
    "tensors-lost": (False, "tensors lost"),
    "shape-changed": (False, "shape changed"),
    "dtype-changed": (False, "dtype changed, not by quantization"),
    "quantization-scales-lost": (False, "quantization scales lost from a quantized weight"),
    "tensors-added": (False, "tensors added"),
    "data-changed": (False, "same name, dtype and shape, different bytes"),
}


@dataclass(frozen=True, slots=True)
class TensorChange:
    name: str
    a_dtype: str
    a_shape: tuple[int, ...]
    b_dtype: str
    b_shape: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class LayerKeyDiff:
    """Keys (name with the layer prefix removed) one side's layer has and the other's lacks."""

    layer: int
    only_a: tuple[str, ...]
    only_b: tuple[str, ...]
    # An MTP layer (numbered after the decoder layers: `inspector._internal.findings.words`).
    mtp: bool = False


@dataclass(frozen=True, slots=True)
class DiffClass:
    """One kind of difference against the reference (see `REFERENCE_KINDS`), the tensors it
    concerns (A's names for what was lost or changed, B's for what was added) and a line
    that says what and where."""

    kind: str
    expected: bool
    names: tuple[str, ...]
    detail: str


@dataclass(frozen=True)
class CheckpointDiff:
    a: str
    b: str
    only_a: list[str]
    only_b: list[str]
    changed: list[TensorChange]
    layers: list[LayerKeyDiff]
    data_compared: int = 0
    data_differs: list[str] = field(default_factory=list)
    data_unreadable: list[str] = field(default_factory=list)
    # With `reference=True`: every difference, classified (A is the reference).
    reference: tuple[DiffClass, ...] | None = None
    # `only_a` and `only_b` summarised by layer and expert (`places_text`, numbered as each
    # side's tensors table numbers them).
    only_a_places: tuple[str, ...] = ()
    only_b_places: tuple[str, ...] = ()
    # Shard files each side's index names that are not on disk (`missing_shards`).
    a_missing_shards: tuple[str, ...] = ()
    b_missing_shards: tuple[str, ...] = ()
    # With `reference=True`: tensors B holds that A's index maps to its missing shards. They
    # are not compared (A's bytes are not there), instead of counting as added to B.
    not_compared: tuple[str, ...] = ()

    @property
    def identical(self) -> bool:
        return not (
            self.only_a
            or self.only_b
            or self.changed
            or self.data_differs
            or self.data_unreadable
            or self.not_compared
        )

    @property
    def unexpected(self) -> tuple[DiffClass, ...]:
        """The differences a derived checkpoint should not have (empty without a reference)."""
        return tuple(c for c in self.reference or () if not c.expected)

    def to_dict(self) -> dict[str, Any]:
        """Every field, plus `identical`, `only_a_places` / `only_b_places` (the names
        summarised by layer and expert: `inspector._internal.checkpoint.places.places_text`) and,
        against a reference, the number of `unexpected` differences."""
        d = asdict(self)
        d["identical"] = self.identical
        if self.reference is not None:
            d["unexpected"] = len(self.unexpected)
        return d


def diff_checkpoints(
    a: ScannedCheckpoint, b: ScannedCheckpoint, *, data: bool = False, reference: bool = False
) -> CheckpointDiff:
    """Compare two scanned checkpoints; with `data=True` also hash every common tensor; with
    `reference=True` classify each difference, A being the reference B was derived from.

    A side whose index names shard files that are not on disk says so (`a_missing_shards`,
    `b_missing_shards`). Against a reference, the tensors A's index maps to such files are
    not compared, and a reference that holds no tensor at all (an index without its shards)
    is refused: every tensor of B would read as added."""
    a_gone, a_lost = missing_shards(a)
    if reference and a_gone and not len(a.tensors):
        raise InspectorError(
            f"diff --reference: the reference {legible(a.path)} holds no tensor: its index "
            f"{legible(a.index.file if a.index else 'index')} names "
            f"{len(a_gone):,} shard file{'s' if len(a_gone) != 1 else ''} that "
            f"{'are' if len(a_gone) != 1 else 'is'} not in the folder ({examples(a_gone)}); "
            "copy the shards next to the index, or give the folder that holds them as A"
        )
    ta, tb = _signature(a), _signature(b)
    only_a = sorted(ta.keys() - tb.keys())
    only_b = sorted(tb.keys() - ta.keys())
    unread: list[str] = []
    if reference and a_lost:
        lost = set(a_lost)
        unread = [n for n in only_b if n in lost]
        only_b = [n for n in only_b if n not in lost]
    common = sorted(ta.keys() & tb.keys())
    changed = [
        TensorChange(n, ta[n][0], ta[n][1], tb[n][0], tb[n][1]) for n in common if ta[n] != tb[n]
    ]
    layers = _layer_diffs(a, b, set(only_a), set(only_b))
    compared = 0
    differs: list[str] = []
    unreadable: list[str] = []
    if data:
        same = [n for n in common if ta[n] == tb[n]]
        compared = len(same)
        differs, unreadable = _compare_data(a, b, same)
    classes = None
    if reference:
        classes = _Classifier(a, b, ta, tb).classify(only_a, only_b, changed, differs)
    return CheckpointDiff(
        str(a.path),
        str(b.path),
        only_a,
        only_b,
        changed,
        layers,
        compared,
        differs,
        unreadable,
        classes,
        tuple(places_text(only_a, numbers=_numbers(a, only_a))),
        tuple(places_text(only_b, numbers=_numbers(b, only_b))),
        tuple(a_gone),
        tuple(missing_shards(b)[0]),
        tuple(unread),
    )


def missing_shards(scanned: ScannedCheckpoint) -> tuple[list[str], list[str]]:
    """(the shard files `scanned`'s index names that are not on disk, the tensors it maps to
    them), sorted; empty without an index."""
    index = scanned.index
    if index is None:
        return [], []
    on_disk = {s.file for s in scanned.shards}
    weight_map = index.weight_map
    gone = sorted({f for f in weight_map.values() if f not in on_disk})
    if not gone:
        return [], []
    lost = set(gone)
    return gone, sorted(n for n, f in weight_map.items() if f in lost)


def _numbers(scanned: ScannedCheckpoint, names: Collection[str]) -> dict[str, tuple[int, bool]]:
    """Name -> (layer, is MTP) of `names` as `scanned`'s tensors table numbers them (the one
    numbering: `inspector._internal.findings.words`)."""
    t = scanned.tensors
    rows = t[t["name"].isin(set(names)) & t["layer"].notna()]
    return dict(
        zip(
            rows["name"],
            zip(rows["layer"].astype(int).tolist(), rows["is_mtp"].tolist(), strict=True),
            strict=True,
        )
    )


def _signature(s: ScannedCheckpoint) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Name -> (dtype, shape) of every tensor a loader gets: of a name several shards hold,
    the copy it keeps (`kept_signatures`), whose bytes `diff --data` compares (`TensorData`
    reads the same copy); DCP and torch_dist tensors as assembled from their chunks."""
    if s.dcp is None and s.logical is None:
        return kept_signatures(s)
    t = s.tensors
    return {
        n: (str(d), tuple(sh))
        for n, d, sh in zip(t["name"], t["dtype"].astype(str), t["shape"], strict=True)
    }


def _layer_diffs(
    a: ScannedCheckpoint, b: ScannedCheckpoint, only_a: set[str], only_b: set[str]
) -> list[LayerKeyDiff]:
    per_layer: dict[int, tuple[list[str], list[str]]] = defaultdict(lambda: ([], []))
    mtp: set[int] = set()
    for side, scanned, names in ((0, a, only_a), (1, b, only_b)):
        t = scanned.tensors
        rows = t[t["name"].isin(names) & t["layer"].notna()]
        listed = rows["name"].tolist()
        # The key inside its layer follows the number the name itself holds (`mtp.layers.0.`
        # of MTP layer 4).
        own = parse_names(listed).layer.tolist()
        numbers = rows["layer"].astype(int).tolist()
        mtp |= {n for n, m in zip(numbers, rows["is_mtp"].tolist(), strict=True) if m}
        for name, layer, number in zip(listed, numbers, own, strict=True):
            per_layer[layer][side].append(_relative_key(name, number))
    return [
        LayerKeyDiff(layer, tuple(sorted(ka)), tuple(sorted(kb)), layer in mtp)
        for layer, (ka, kb) in sorted(per_layer.items())
    ]


def _relative_key(name: str, layer: int) -> str:
    marker = f".{layer}."
    pos = name.find(marker)
    return name[pos + len(marker) :] if pos >= 0 else name


def _compare_data(
    a: ScannedCheckpoint, b: ScannedCheckpoint, names: list[str]
) -> tuple[list[str], list[str]]:
    differs: list[str] = []
    unreadable: list[str] = []
    with tensor_data(a) as da, tensor_data(b) as db:
        for name in names:
            ha, hb = da.tensor_hash(name), db.tensor_hash(name)
            if ha is None or hb is None:
                unreadable.append(name)
            elif ha != hb:
                differs.append(name)
    return differs, unreadable


# -- classification against a reference -------------------------------------------------------

_PER_EXPERT = re.compile(r"^(?P<base>.*\.experts)\.(?P<expert>\d+)\.")
_PACKING = (1, 2, 4, 8)


class _Classifier:
    """Sorts the differences of a derived checkpoint B from its reference A into kinds."""

    def __init__(
        self,
        a: ScannedCheckpoint,
        b: ScannedCheckpoint,
        ta: dict[str, tuple[str, tuple[int, ...]]],
        tb: dict[str, tuple[str, tuple[int, ...]]],
    ) -> None:
        self.a, self.b, self.ta, self.tb = a, b, ta, tb
        self.out: dict[str, list[str]] = defaultdict(list)
        self.notes: dict[str, list[str]] = defaultdict(list)

    def classify(
        self,
        only_a: list[str],
        only_b: list[str],
        changed: list[TensorChange],
        differs: list[str],
    ) -> tuple[DiffClass, ...]:
        lost, added = set(only_a), set(only_b)
        # Scales of a weight A has are quantization, and experts fused or split are a change
        # of form, even inside an MTP layer; what remains of MTP layers was added or lost.
        self._quantization(lost, added)
        self._experts(lost, added)
        self.take("mtp-lost", lost, _mtp(self.a, lost))
        self.take("mtp-added", added, _mtp(self.b, added))
        for c in changed:
            self.out[self._change_kind(c)].append(c.name)
        self._lost(lost)
        self.take("tensors-added", added, set(added))
        self.out["data-changed"].extend(differs)
        return tuple(self._build(kind) for kind in REFERENCE_KINDS if self.out.get(kind))

    def take(self, kind: str, pool: set[str], names: set[str]) -> None:
        self.out[kind].extend(sorted(names))
        pool -= names

    def _quantization(self, lost: set[str], added: set[str]) -> None:
        def module(name: str) -> str:
            return name.rpartition(".")[0]

        def known(name: str) -> bool:
            return f"{module(name)}.weight" in self.ta

        scales_b = {n for n in added if n.rpartition(".")[2] in QUANT_PARAMS and known(n)}
        packed_b = {n for n in added if n.endswith(".weight_packed") and known(n)}
        # compressed-tensors stores the quantized weight as `weight_packed`.
        packed_from = {n for n in lost if n.endswith(".weight") and f"{n}_packed" in packed_b}
        self.take("quantized", lost, packed_from)
        added -= {f"{n}_packed" for n in packed_from}
        self.take("quantization-scales-added", added, scales_b | (packed_b & added))

        # Scales B lost while keeping their weight; a module lost whole (an expert, a layer)
        # is that loss, classified with its weight below, not a loss of scales.
        def kept(name: str) -> bool:
            return any(f"{module(name)}.{w}" in self.tb for w in ("weight", "weight_packed"))

        scales_a = {n for n in lost if n.rpartition(".")[2] in QUANT_PARAMS and kept(n)}
        dequantized = {
            n for n in scales_a if self.tb.get(f"{module(n)}.weight", ("",))[0] in FLOAT_DTYPES
        }
        self.take("dequantized", lost, dequantized)
        self.take("quantization-scales-lost", lost, scales_a - dequantized)

    def _experts(self, lost: set[str], added: set[str]) -> None:
        """Per-expert tensors of one `...experts` module on one side, fused ones on the other."""
        for per, fused, sig_per, sig_fused, kind in (
            (lost, added, self.ta, self.tb, "experts-fused"),
            (added, lost, self.tb, self.ta, "experts-unfused"),
        ):
            groups: dict[str, set[str]] = defaultdict(set)
            for name in per:
                if m := _PER_EXPERT.match(name):
                    groups[m.group("base")].add(name)
            under = _under_experts(fused)
            for base, names in sorted(groups.items()):
                whole = under.get(base, set()) & fused
                if not whole:
                    continue
                numel_per = sum(math.prod(sig_per[n][1]) for n in names)
                numel_fused = sum(math.prod(sig_fused[n][1]) for n in whole)
                experts = {int(m.group("expert")) for n in names if (m := _PER_EXPERT.match(n))}
                leading = sorted({sig_fused[n][1][0] for n in whole if sig_fused[n][1]})
                if numel_per == numel_fused:
                    target = kind
                elif kind == "experts-fused" and numel_fused < numel_per:
                    target = "experts-lost"
                    self.notes[target].append(
                        f"{legible(base)}: {len(experts)} experts stored per expert, fused to "
                        f"{leading}"
                    )
                else:
                    target = "shape-changed"
                self.take(target, per, names)
                fused -= whole

    def _change_kind(self, c: TensorChange) -> str:
        a_float, b_float = c.a_dtype in FLOAT_DTYPES, c.b_dtype in FLOAT_DTYPES
        if a_float != b_float and _packed_alike(c.a_shape, c.b_shape):
            return "quantized" if a_float else "dequantized"
        if c.a_shape != c.b_shape:
            return "shape-changed"
        return "dtype-changed"

    def _lost(self, lost: set[str]) -> None:
        t = self.a.tensors
        rows = t[t["name"].isin(lost)]
        kinds = dict(zip(rows["name"], rows["kind"].astype(str), strict=True))
        numbered = rows[rows["layer"].notna()]
        layer_of = dict(zip(numbered["name"], numbered["layer"].astype(int), strict=True))
        tb = self.b.tensors
        layers_b = set(tb["layer"].dropna().astype(int))
        tied = bool((self.b.config or {}).get("tie_word_embeddings"))
        for name in sorted(lost):
            kind = kinds.get(name)
            if name in layer_of and layer_of[name] not in layers_b:
                self.out["layers-lost"].append(name)
            elif kind == "output_head":
                self.out["lm-head-tied" if tied else "lm-head-lost"].append(name)
            elif kind == "expert" and _PER_EXPERT.match(name):
                self.out["experts-lost"].append(name)
            else:
                self.out["tensors-lost"].append(name)
        lost.clear()

    def _build(self, kind: str) -> DiffClass:
        expected, what = REFERENCE_KINDS[kind]
        names = tuple(self.out[kind])
        # A's names for what B lost or changed, B's for what it added.
        side = self.b if kind.endswith("-added") or kind == "experts-unfused" else self.a
        places = places_text(
            names, limit=4, numbers={**_numbers(self.a, names), **_numbers(side, names)}
        )
        detail = f"{what}: {'; '.join(places)}"
        if self.notes.get(kind):
            detail += "; " + "; ".join(self.notes[kind][:3])
        return DiffClass(kind, expected, names, detail)


def _under_experts(names: set[str]) -> dict[str, set[str]]:
    """`...experts` module -> the names below it that are not per expert: each name filed
    under every `.experts` component it has (one pass over the names, instead of one pass
    per expert module). Names longer than any real tensor's are filed nowhere: each prefix
    is a copy, and a hostile name could hold millions."""
    out: dict[str, set[str]] = defaultdict(set)
    for name in names:
        if len(name) > LONG_NAME or _PER_EXPERT.match(name):
            continue
        at = name.find(".experts.")
        while at >= 0:
            out[name[: at + len(".experts")]].add(name)
            at = name.find(".experts.", at + 1)
    return out


def _mtp(scanned: ScannedCheckpoint, names: set[str]) -> set[str]:
    t = scanned.tensors
    rows = t[t["name"].isin(names) & t["is_mtp"]]
    return set(rows["name"])


def _packed_alike(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    """Same shape, or the same but for the last axis packed k values to an element."""
    if len(a) != len(b) or a[:-1] != b[:-1]:
        return False
    if not a:
        return True
    return any(a[-1] == b[-1] * k or b[-1] == a[-1] * k for k in _PACKING)
