"""How a quantized checkpoint meets the unquantized model: the quantization view. Pure.

`quantization_view` finds the modules stored quantized, checks that each holds the scales its
scheme requires with the shapes the scheme gives them, and returns the tensors the
full-precision model sees (packed weights at their logical shape, scales set aside as
expected). The schemes are written by hand because transformers has no loader for them on
this machine; they follow what the exporters write and the engines read
(docs/architecture.md, "load/", lists them).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import compress, filterfalse
from operator import and_, itemgetter, methodcaller, not_
from typing import Any

from inspector._internal.checkpoint.naming_rules import (
    KV_SCALE_PARAMS,
    QUANT_AUX_PARAMS,
    QUANT_SIBLING_PARAMS,
)
from inspector._internal.checkpoint.quant_config import exclude_matcher, quant_section
from inspector._internal.checkpoint.scanned import ScannedCheckpoint
from inspector._internal.common.display import legible
from inspector._internal.common.dtypes import DTYPE_BITS, QUANT_DTYPES
from inspector._internal.common.filenames import CONFIG_NAME, QUANT_CONFIG_NAME
from inspector._internal.formats.patterns import PatternBudget, Patterns, compile_patterns
from inspector._internal.load.records import LoadSkipped, ShapeMismatch, Stored

__all__ = ["QUANT_PARAMS", "QuantView", "quantization_view"]

# Tensors next to a quantized module's weight, attention KV-cache scales, and both: the
# table is `inspector._internal.checkpoint.naming_rules`.
_AUX = QUANT_AUX_PARAMS
_KV_SCALES = KV_SCALE_PARAMS
QUANT_PARAMS = QUANT_SIBLING_PARAMS
# Evidence that a module is stored quantized (besides a weight in a packed or 8-bit dtype).
_EVIDENCE = frozenset({"weight_scale", "weight_scale_2", "weight_scale_inv", "weight_packed"})
# Integer dtypes compressed-tensors packs several values into.
_PACKED_INTS = frozenset({"I32", "U32", "I64", "U8", "I8", "I16"})
_RPARTITION = methodcaller("rpartition", ".")
_FIRST = itemgetter(0)
_LAST = itemgetter(2)


@dataclass(frozen=True, slots=True)
class _Scheme:
    """What one quantization scheme stores per module."""

    name: str
    # Logical elements per stored element on the last axis (NVFP4 in U8: 2); negative:
    # compressed-tensors' bits per value, packed into an integer dtype.
    pack: int = 1
    required: tuple[str, ...] = ()
    # `weight_scale` holds one value per `group` inputs: shape `[*out, in/group]`.
    group: int | None = None
    # `block_param` is one value per `block` tile of the weight.
    block: tuple[int, int] | None = None
    block_param: str = "weight_scale_inv"
    # Params whose single value is per tensor.
    scalars: tuple[str, ...] = ()
    weight_param: str = "weight"


@dataclass(frozen=True)
class QuantView:
    """The checkpoint as the full-precision model sees it, and what the quantization config
    says about the rest. `logical` maps names to (dtype, shape); `stored_name` maps a logical
    name back to the stored one where they differ (`weight` <- `weight_packed`)."""

    method: str | None
    logical: Mapping[str, Stored]
    expected: tuple[str, ...] = ()
    missing: tuple[str, ...] = ()
    mismatched: tuple[ShapeMismatch, ...] = ()
    reasons: Mapping[str, str] = field(default_factory=dict)
    stored_name: Mapping[str, str] = field(default_factory=dict)


def quantization_view(scanned: ScannedCheckpoint, stored: Mapping[str, Stored]) -> QuantView:
    """The quantization view of `stored` (see the module docstring); raises `LoadSkipped` for a
    quantization method this check does not model."""
    source = _source(scanned)
    if source is None:
        return QuantView(None, stored)
    kind, where, section = source
    if kind == "modelopt":
        return _apply(stored, _ModelOpt(section, where))
    if kind == "fp8":
        return _apply(stored, _BlockFp8(section, where))
    if kind == "compressed-tensors":
        return _apply(stored, _CompressedTensors(section, where))
    raise LoadSkipped(
        f"{where} names quantization method {kind!r}, which this check does not model; "
        "its scales and packed weights cannot be told from unexpected tensors"
    )


def _source(scanned: ScannedCheckpoint) -> tuple[str, str, Mapping[str, Any]] | None:
    """(method, file it is stated in, its settings), hf_quant_config.json first."""
    if isinstance(scanned.quant_config, Mapping):
        return "modelopt", QUANT_CONFIG_NAME, quant_section(scanned.quant_config)
    config = scanned.config or {}
    qc = config.get("quantization_config")
    if not isinstance(qc, dict):
        text = config.get("text_config")
        qc = text.get("quantization_config") if isinstance(text, dict) else None
    if not isinstance(qc, dict):
        return None
    method = qc.get("quant_method")
    return (method if isinstance(method, str) else repr(method)), CONFIG_NAME, qc


def _undecided(where: str, list_name: str, patterns: Patterns, module: str) -> LoadSkipped:
    """The check is skipped: a refused pattern (or a cap) leaves `module` undecided."""
    reasons = "; ".join(patterns.reasons()[:3])
    return LoadSkipped(
        f"{where} {list_name} cannot be matched against {legible(module)} ({reasons}); "
        "whether it is quantized is not decided (see quant-pattern-refused)"
    )


# -- the schemes ---------------------------------------------------------------------------


class _Rules:
    """Which scheme a module uses; subclasses read one kind of quantization config."""

    method: str = ""
    kv_cache: bool = False

    def scheme(self, module: str, weight: Stored | None) -> _Scheme | None:
        """The module's scheme, or None when the config says it is not quantized."""
        raise NotImplementedError

    def schemes(self, modules: list[str], stored: Mapping[str, Stored]) -> list[_Scheme | None]:
        """`scheme` of each module (subclasses may answer for all at once)."""
        return [self.scheme(m, stored.get(f"{m}.weight")) for m in modules]


class _ModelOpt(_Rules):
    def __init__(self, section: Mapping[str, Any], where: str) -> None:
        self.algo = section.get("quant_algo")
        layers = section.get("quantized_layers")
        self.layers = layers if isinstance(layers, dict) else {}
        patterns = section.get("exclude_modules") or section.get("ignore") or []
        # Matched against the module and `<module>.weight`, as the quant-config check does.
        exclude = exclude_matcher([p for p in patterns if isinstance(p, str)])
        if exclude is None:
            raise LoadSkipped(
                f"{where} exclude_modules holds more wildcard patterns than the check matches "
                "(see check-budget-exceeded)"
            )
        self.exclude = exclude
        self.where = where
        group = section.get("group_size")
        self.group = group if isinstance(group, int) and group > 0 else 16
        self.kv_cache = section.get("kv_cache_quant_algo") is not None
        self.method = f"Model-Optimizer {self.algo} ({where})"

    def schemes(self, modules: list[str], stored: Mapping[str, Stored]) -> list[_Scheme | None]:
        if self.algo == "MIXED_PRECISION":
            return super().schemes(modules, stored)
        # One algorithm for every module not excluded.
        scheme = _modelopt_scheme(self.algo, self.group)
        return [None if self._excluded(m) else scheme for m in modules]

    def _excluded(self, module: str) -> bool:
        excluded = self.exclude(module)
        if excluded is None:
            raise _undecided(self.where, "exclude_modules", self.exclude.globs, module)
        return excluded

    def scheme(self, module: str, weight: Stored | None) -> _Scheme | None:
        if self._excluded(module):
            return None
        algo, group = self.algo, self.group
        if algo == "MIXED_PRECISION":
            entry = self.layers.get(module)
            # A module stored quantized but not listed is quant-config-missing-layer (the
            # quant check); here its scheme is read from how it is stored.
            if isinstance(entry, dict):
                algo = entry.get("quant_algo")
                if isinstance(entry.get("group_size"), int) and entry["group_size"] > 0:
                    group = entry["group_size"]
            else:
                algo = _stored_algo(weight)
        return _modelopt_scheme(algo, group)


def _stored_algo(weight: Stored | None) -> str | None:
    if weight is None:
        return None
    if weight[0] == "U8":
        return "NVFP4"
    return "FP8" if weight[0].startswith("F8_") else None


def _modelopt_scheme(algo: object, group: int) -> _Scheme:
    if isinstance(algo, str):
        return _modelopt_scheme_of(algo, group)
    return _modelopt_scheme_of(repr(algo), group)


@lru_cache(maxsize=64)
def _modelopt_scheme_of(algo: str, group: int) -> _Scheme:
    if algo == "FP8":
        return _Scheme(
            "FP8", required=("weight_scale", "input_scale"), scalars=("weight_scale", "input_scale")
        )
    if algo == "NVFP4":
        return _Scheme(
            "NVFP4",
            pack=2,
            required=("weight_scale", "weight_scale_2", "input_scale"),
            group=group,
            scalars=("weight_scale_2", "input_scale"),
        )
    if algo == "FP8_PB_WO":
        return _Scheme(
            "FP8_PB_WO", required=("weight_scale",), block=(128, 128), block_param="weight_scale"
        )
    raise LoadSkipped(
        f"Model-Optimizer quant_algo {algo!r} is not modelled by this check; its packed weights "
        "and scales cannot be told apart from unexpected tensors"
    )


class _BlockFp8(_Rules):
    def __init__(self, section: Mapping[str, Any], where: str) -> None:
        block = section.get("weight_block_size")
        self.block: tuple[int, int] | None = None
        if (
            isinstance(block, list)
            and len(block) == 2
            and all(isinstance(b, int) and b > 0 for b in block)
        ):
            self.block = (block[0], block[1])
        skip = section.get("modules_to_not_convert") or []
        # transformers' FP8 quantizer skips a module whose name contains an entry.
        self.skip = [p for p in skip if isinstance(p, str) and p]
        size = f"block {self.block[0]}x{self.block[1]} " if self.block else ""
        self.method = f"FP8 {size}({where})"
        self._scheme = _Scheme("FP8", required=("weight_scale_inv",), block=self.block)

    def scheme(self, module: str, weight: Stored | None) -> _Scheme | None:
        if any(p in module for p in self.skip):
            return None
        return self._scheme


class _CompressedTensors(_Rules):
    def __init__(self, section: Mapping[str, Any], where: str) -> None:
        groups = section.get("config_groups")
        schemes = set()
        for group in groups.values() if isinstance(groups, dict) else ():
            weights = group.get("weights") if isinstance(group, dict) else None
            if isinstance(weights, dict):
                schemes.add(
                    (
                        weights.get("num_bits"),
                        weights.get("strategy"),
                        weights.get("group_size"),
                        group.get("format") or section.get("format"),
                    )
                )
        if len(schemes) != 1:
            raise LoadSkipped(
                f"{where} quantization_config (compressed-tensors) has "
                f"{len(schemes) or 'no'} weight schemes; this check models exactly one"
            )
        bits, strategy, group_size, fmt = schemes.pop()
        if not isinstance(bits, int) or bits <= 0:
            raise LoadSkipped(f"{where} compressed-tensors num_bits is {bits!r}, not a bit count")
        packed = isinstance(fmt, str) and "pack" in fmt
        required = ["weight_scale"]
        if fmt == "nvfp4-pack-quantized":
            required.append("weight_global_scale")
        elif packed:
            required.append("weight_shape")
        group = group_size if strategy == "group" and isinstance(group_size, int) else None
        # `-bits`: values are unpacked from integer storage whatever the format says (a
        # `weight_packed` in I32 holds 32/bits of them; an I8 or F8 weight holds one).
        self._scheme = _Scheme(
            f"{fmt} {bits}-bit",
            pack=-bits,
            required=tuple(required),
            group=group if group and group > 0 else None,
            weight_param="weight_packed",
        )
        ignore = [p for p in section.get("ignore") or [] if isinstance(p, str)]
        # compressed-tensors: "re:<regex>" entries (matched at the start of the name, without
        # backtracking), else a module name or its last parts.
        regexes = [p.removeprefix("re:") for p in ignore if p.startswith("re:")]
        self.ignore_re = compile_patterns(regexes, syntax="regex", budget=PatternBudget())
        self.ignore = [p for p in ignore if not p.startswith("re:")]
        self.where = where
        self.kv_cache = section.get("kv_cache_scheme") is not None
        self.method = f"compressed-tensors {fmt} {bits}-bit ({where})"

    def scheme(self, module: str, weight: Stored | None) -> _Scheme | None:
        if any(module == p or module.endswith(f".{p}") for p in self.ignore):
            return None
        ignored = self.ignore_re.match(module)
        if ignored is None:
            raise _undecided(self.where, "quantization_config ignore", self.ignore_re, module)
        return None if ignored else self._scheme


# -- applying the rules ----------------------------------------------------------------------


def _apply(stored: Mapping[str, Stored], rules: _Rules) -> QuantView:
    """Walk the modules stored quantized; everything else passes through unchanged.

    Built for 600,000 tensors: names are split, quantized modules found and scales set aside
    with C-level passes (`map`, `compress`); Python loops run once per quantized module (its
    weight and required params) and once per scale (its shape, judged once per kind)."""
    names = list(stored)
    values = list(stored.values())
    parts = list(map(_RPARTITION, names))
    mods = list(map(_FIRST, parts))
    params = list(map(_LAST, parts))
    packed = map(
        and_, map("weight".__eq__, params), map(QUANT_DTYPES.__contains__, map(_FIRST, values))
    )
    quantized = set(compress(mods, map(_EVIDENCE.__contains__, params)))
    quantized.update(compress(mods, packed))
    quantized.discard("")
    ordered = sorted(quantized)
    schemes = {m: sc for m, sc in zip(ordered, rules.schemes(ordered, stored), strict=True) if sc}
    view = _View(stored, rules.method)
    view.modules(schemes)
    # Scales of quantized modules: expected, their shapes judged against the scheme.
    aux = list(map(and_, map(schemes.__contains__, mods), map(_AUX.__contains__, params)))
    view.scales(compress(zip(names, mods, params, strict=True), aux))
    gone = view.removed
    gone.update(compress(names, aux))
    kept = map(not_, map(gone.__contains__, names))
    logical = dict(compress(zip(names, values, strict=True), kept))
    logical.update(view.logical)
    expected = view.expected
    if rules.kv_cache:
        kv = [n for n, p in zip(names, params, strict=True) if p in _KV_SCALES and n in logical]
        for name in kv:
            del logical[name]
        expected += kv
    return QuantView(
        rules.method,
        logical,
        tuple(sorted(expected)),
        tuple(sorted(view.missing)),
        tuple(sorted(view.mismatched, key=lambda m: m.key)),
        view.reasons,
        view.stored_name,
    )


class _View:
    """What the schemes say, module by module and scale by scale; judgements of a scale's
    shape are kept per kind (scheme, param, its dtype and shape, the weight's)."""

    def __init__(self, stored: Mapping[str, Stored], method: str) -> None:
        self.stored = stored
        self.method = method
        self.removed: set[str] = set()
        self.logical: dict[str, Stored] = {}
        self.expected: list[str] = []
        self.missing: list[str] = []
        self.mismatched: list[ShapeMismatch] = []
        self.reasons: dict[str, str] = {}
        self.stored_name: dict[str, str] = {}
        # module -> (scheme, stored weight, logical in_features)
        self.weights: dict[str, tuple[_Scheme, Stored | None, int | None]] = {}
        self.judged: dict[tuple[Any, ...], Any] = {}

    def modules(self, schemes: dict[str, _Scheme]) -> None:
        """Each quantized module's weight read at its logical shape; the params its scheme
        requires and the checkpoint lacks are missing (looked up for all modules at once)."""
        stored, weights, logical = self.stored, self.weights, self.logical
        shapes: dict[tuple[int, Stored], tuple[int, ...]] = {}
        have: list[str] = []
        for module, scheme in schemes.items():
            wname = f"{module}.{scheme.weight_param}"
            if wname not in stored:
                # The other spelling of a quantized weight (`weight` / `weight_packed`).
                wname = f"{module}.weight"
                if wname not in stored and f"{module}.weight_packed" in stored:
                    wname = f"{module}.weight_packed"
            weight = stored.get(wname)
            if weight is None:
                weights[module] = (scheme, None, None)
                continue
            have.append(module)
            kind = (id(scheme), weight)
            shape = shapes.get(kind)
            if shape is None:
                shape = shapes[kind] = _logical_shape(weight, scheme)
            weights[module] = (scheme, weight, shape[-1] if shape else None)
            full = f"{module}.weight"
            self.removed.add(wname)
            logical[full] = ("BF16", shape)
            if wname != full:
                self.stored_name[full] = wname
            if wname != full or shape != weight[1]:
                self.expected.append(wname)
        distinct = {id(s): s for s in schemes.values()}.values()
        required = {p for s in distinct for p in s.required} if have else set()
        for param in sorted(required):
            names = map(f"{{}}.{param}".format, have)
            for name in filterfalse(stored.__contains__, names):
                scheme = weights[name.rpartition(".")[0]][0]
                if param in scheme.required:
                    self.missing.append(name)
                    self.reasons[name] = (
                        f"{scheme.name}, {self.method}: every quantized module stores a {param}"
                    )

    def scales(self, rows: Iterable[tuple[str, str, str]]) -> None:
        """Each (name, module, param) of a scale: expected, and its shape judged."""
        stored, weights, judged = self.stored, self.weights, self.judged
        expected = self.expected
        for name, module, param in rows:
            expected.append(name)
            scheme, weight, in_features = weights[module]
            value = stored[name]
            # Schemes are shared objects: their identity stands for them (hashing a frozen
            # dataclass 450,000 times costs more than the judging it saves).
            kind = (id(scheme), param, value, weight, in_features)
            problem = judged.get(kind, judged)
            if problem is judged:
                problem = judged[kind] = _aux_shape(scheme, param, value, weight, in_features)
            if problem is not None:
                self.mismatched.append(ShapeMismatch(name, value[1], problem[0]))
                self.reasons[name] = f"{scheme.name}, {self.method}: {problem[1]}"


def _logical_shape(weight: Stored, scheme: _Scheme) -> tuple[int, ...]:
    """The full-precision shape of a stored weight (packed values unpacked on the last axis)."""
    dtype, shape = weight
    if not shape or scheme.pack == 1:
        return shape
    if scheme.pack > 1:
        factor = scheme.pack if dtype == "U8" else 1
    else:
        bits = DTYPE_BITS.get(dtype, 0)
        factor = bits // -scheme.pack if dtype in _PACKED_INTS and bits else 1
    return (*shape[:-1], shape[-1] * max(factor, 1))


def _aux_shape(
    scheme: _Scheme,
    param: str,
    aux: Stored,
    weight: Stored | None,
    in_features: int | None,
) -> tuple[tuple[int, ...], str] | None:
    """(expected shape, why) when the stored shape of `param` breaks the scheme, else None."""
    shape = aux[1]
    if param in scheme.scalars and math.prod(shape) != 1:
        return (), f"{param} is one value per tensor"
    if weight is None or in_features is None or not weight[1]:
        return None
    out = weight[1][:-1]
    if param == "weight_scale" and scheme.group and in_features % scheme.group == 0:
        want = (*out, in_features // scheme.group)
        if shape != want:
            return want, f"weight_scale holds one value per {scheme.group} inputs"
    if scheme.block is not None and param == scheme.block_param and len(out) == 1:
        b0, b1 = scheme.block
        want = (-(-out[0] // b0), -(-in_features // b1))
        if shape != want:
            return want, f"{param} holds one value per {b0}x{b1} block of the weight"
    return None
