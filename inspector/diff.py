"""`diff A B`: what differs between two checkpoints, by name, dtype, shape, layer key set and,
on request, content hash (to prove a consolidation or a repair changed no weight)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any

from inspector.model import ScannedCheckpoint
from inspector.tensordata import TensorData

__all__ = ["CheckpointDiff", "LayerKeyDiff", "TensorChange", "diff_checkpoints"]


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

    @property
    def identical(self) -> bool:
        return not (
            self.only_a or self.only_b or self.changed or self.data_differs or self.data_unreadable
        )

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["identical"] = self.identical
        return d


def diff_checkpoints(
    a: ScannedCheckpoint, b: ScannedCheckpoint, *, data: bool = False
) -> CheckpointDiff:
    """Compare two scanned checkpoints; with `data=True` also hash every common tensor."""
    ta, tb = _signature(a), _signature(b)
    only_a = sorted(ta.keys() - tb.keys())
    only_b = sorted(tb.keys() - ta.keys())
    common = sorted(ta.keys() & tb.keys())
    changed = [
        TensorChange(n, ta[n][0], ta[n][1], tb[n][0], tb[n][1]) for n in common if ta[n] != tb[n]
    ]
    layers = _layer_diffs(a, b, set(only_a), set(only_b))
    result = CheckpointDiff(str(a.path), str(b.path), only_a, only_b, changed, layers)
    if not data:
        return result
    same = [n for n in common if ta[n] == tb[n]]
    differs, unreadable = _compare_data(a, b, same)
    return CheckpointDiff(
        result.a, result.b, only_a, only_b, changed, layers, len(same), differs, unreadable
    )


def _signature(s: ScannedCheckpoint) -> dict[str, tuple[str, tuple[int, ...]]]:
    t = s.tensors
    return {
        n: (str(d), tuple(sh))
        for n, d, sh in zip(t["name"], t["dtype"].astype(str), t["shape"], strict=True)
    }


def _layer_diffs(
    a: ScannedCheckpoint, b: ScannedCheckpoint, only_a: set[str], only_b: set[str]
) -> list[LayerKeyDiff]:
    per_layer: dict[int, tuple[list[str], list[str]]] = defaultdict(lambda: ([], []))
    for side, scanned, names in ((0, a, only_a), (1, b, only_b)):
        t = scanned.tensors
        rows = t[t["name"].isin(names) & t["layer"].notna()]
        for name, layer in zip(rows["name"], rows["layer"].astype(int), strict=True):
            per_layer[layer][side].append(_relative_key(name, layer))
    return [
        LayerKeyDiff(layer, tuple(sorted(ka)), tuple(sorted(kb)))
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
    with TensorData(a) as da, TensorData(b) as db:
        for name in names:
            ha, hb = da.tensor_hash(name), db.tensor_hash(name)
            if ha is None or hb is None:
                unreadable.append(name)
            elif ha != hb:
                differs.append(name)
    return differs, unreadable
