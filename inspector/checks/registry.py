"""Which rule runs for which layout: one typed table, one module per concern.

A rule declares the codes it may emit (a test checks every emitted code is declared). To add
a check, write a module in `inspector/checks/` with a function `ScannedCheckpoint -> findings`
and register it here with the layouts it applies to (None: every layout).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from inspector.checks import dcp, index, quant, sharding, sidecars, structure, torch_dist
from inspector.codes import Code
from inspector.findings import Finding
from inspector.model import LayoutName, ScannedCheckpoint

__all__ = ["RULES", "Rule", "rules_for"]

_L = LayoutName


@dataclass(frozen=True, slots=True)
class Rule:
    """A check: `run(scanned)` gives findings whose codes are all in `codes`; it runs on the
    `layouts` named (None: every layout)."""

    name: str
    layouts: frozenset[LayoutName] | None
    run: Callable[[ScannedCheckpoint], Iterable[Finding]]
    codes: frozenset[Code]


RULES: tuple[Rule, ...] = (
    Rule(
        "index",
        frozenset({_L.HF_SHARDED, _L.MODELOPT_PER_LAYER}),
        index.check_index_of,
        index.CODES,
    ),
    Rule(
        "sidecars", frozenset({_L.MODELOPT_PER_LAYER}), sidecars.check_sidecars_of, sidecars.CODES
    ),
    Rule(
        "collapsed-shards",
        frozenset({_L.SAFETENSORS_SINGLE, _L.HF_SHARDED}),
        sharding.check_collapsed_shards,
        sharding.CODES,
    ),
    Rule("dcp", frozenset({_L.DCP_SHARDED}), dcp.check_dcp, dcp.CODES),
    Rule("torch-dist", frozenset({_L.TORCH_DIST}), torch_dist.check_torch_dist, torch_dist.CODES),
    Rule("structure", None, structure.check_structure, structure.CODES),
    Rule("quant-config", None, quant.check_quant_config, quant.CODES),
)


def rules_for(layout: LayoutName) -> tuple[Rule, ...]:
    """The rules registered for `layout`, in table order."""
    return tuple(r for r in RULES if r.layouts is None or layout in r.layouts)
