"""Will it load? What transformers itself would report for a checkpoint, without tensor data.

`load_verdict(scanned)` builds the model `config.json` names on the meta device, sealed, runs
transformers' own key renaming and weight conversions over the stored names, dtypes and
shapes, and returns what `from_pretrained(..., output_loading_info=True)` would: missing,
unexpected and mismatched keys, with what transformers cannot say added. Transformers is the
authority, so the rules are its own; nothing here raises on a checkpoint (a check that cannot
run is `skipped` with the reason). Details: docs/architecture.md, "load/".
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import logging
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from copy import deepcopy
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import islice, repeat
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import msgspec
import numpy as np
import orjson

from inspector._internal.checkpoint.loaded import kept_copies, kept_signatures
from inspector._internal.checkpoint.parameters import (
    PARAMETER_RULE,
    count_parameters,
    scan_parameters,
)
from inspector._internal.checkpoint.scanned import ScannedCheckpoint

# What a config may ask us to build (a hostile config.json could declare a billion layers),
# the bounds the structure checks use too.
from inspector._internal.checkpoint.spec import MAX_EXPERTS, MAX_LAYER_EXPERTS, MAX_LAYERS
from inspector._internal.common.filenames import CONFIG_NAME
from inspector._internal.common.gc import gc_paused
from inspector._internal.common.text import short_repr
from inspector._internal.common.units import format_count
from inspector._internal.load import cache as verdict_cache
from inspector._internal.load.quant_view import quantization_view
from inspector._internal.load.records import LoadSkipped, ShapeMismatch, Stored
from inspector._internal.load.seal import import_from_folder, sealed

if TYPE_CHECKING:
    import torch

__all__ = [
    "LOADABLE_LAYOUTS",
    "LoadVerdict",
    "bounded_config",
    "clear_model_cache",
    "known_verdict",
    "load_verdict",
    "prepare_load_check",
    "stored_files",
    "stored_tensors",
    "torch_dtype",
    "verdict_digest",
    "verdict_key",
]

# Layouts a loader reads as they are. DCP-sharded folders and Megatron torch_dist are
# consolidated or converted first; their verdict is the one of the result.
LOADABLE_LAYOUTS = frozenset(
    {"hf-sharded", "safetensors-single", "modelopt-per-layer", "pytorch-bin"}
)


def _empty() -> Mapping[str, Any]:
    return MappingProxyType({})


@dataclass(frozen=True)
class LoadVerdict:
    """What the model code would load. Keys are in the model's key space (as transformers
    reports them); `sources` maps a reported key to the stored tensors behind it.

    - `missing`: the model expects it and the checkpoint lacks it (after ties and the class's
      ignore lists; a quantization scale the quantization config requires is named as
      stored, e.g. `...up_proj.weight_scale`);
    - `unexpected`: stored, and the model would not load it;
    - `mismatched`: stored with another shape than the model's;
    - `mtp_skipped`: stored MTP tensors transformers does not load (serving engines do);
    - `quantization_expected`: stored scales and packed weights the quantization config
      accounts for;
    - `parameters`: the model's parameter count as `save_pretrained` writes it
      (`num_parameters()`: parameters only, tied weights once, buffers not counted);
    - `stored_parameters`: the checkpoint's own count, the one the scan shows
      (`inspector._internal.checkpoint.parameters`), and `mtp_parameters` the part of it in MTP
      tensors transformers skips: `parameters_text()` compares them;
    - `skipped`: why the check did not run (then every tuple is empty).
    """

    architecture: str | None = None
    skipped: str | None = None
    missing: tuple[str, ...] = ()
    unexpected: tuple[str, ...] = ()
    mismatched: tuple[ShapeMismatch, ...] = ()
    mtp_skipped: tuple[str, ...] = ()
    quantization_expected: tuple[str, ...] = ()
    parameters: int | None = None
    stored_parameters: int | None = None
    mtp_parameters: int = 0
    quantization: str | None = None
    transformers_version: str | None = None
    # Reported key -> the stored tensors it was built from (unexpected and mismatched keys).
    sources: Mapping[str, tuple[str, ...]] = field(default_factory=_empty, compare=False)
    # Missing key -> how the checkpoint spells it (e.g. `...experts.*.gate_proj.weight`).
    stored_as: Mapping[str, str] = field(default_factory=_empty, compare=False)
    # Key -> why, where it is not simply the model's own expectation.
    reasons: Mapping[str, str] = field(default_factory=_empty, compare=False)

    @property
    def ran(self) -> bool:
        return self.skipped is None

    @property
    def loads(self) -> bool | None:
        """True when nothing is missing or mis-shaped; None when the check was skipped."""
        if self.skipped is not None:
            return None
        return not (self.missing or self.mismatched)

    def summary(self) -> str:
        """One line: will it load, and what stands in the way."""
        if self.skipped is not None:
            return f"skipped: {self.skipped}"
        parts = [f"{len(self.missing):,} missing"] if self.missing else []
        if self.mismatched:
            parts.append(f"{len(self.mismatched):,} with another shape")
        if self.unexpected:
            parts.append(f"{len(self.unexpected):,} unexpected")
        extra = []
        if self.mtp_skipped:
            extra.append(f"{len(self.mtp_skipped):,} MTP tensors transformers skips")
        if self.quantization:
            extra.append(f"quantization: {self.quantization}")
        if self.parameters is not None:
            extra.append(self.parameters_text())
        tail = f" ({'; '.join(extra)})" if extra else ""
        if self.loads:
            head = f"loads as {self.architecture}"
            if self.unexpected:
                head += f" ({parts[-1]} tensors ignored)"
            return head + tail
        return f"does NOT load cleanly as {self.architecture}: {', '.join(parts)}{tail}"

    def parameters_text(self) -> str:
        """'28,496 parameters' when the model and the checkpoint count the same (values:
        `inspector._internal.checkpoint.parameters.PARAMETER_RULE`), else both and what the
        difference is, e.g. '28,496 parameters in the model, 37,040 stored (8,544 in MTP layers
        transformers skips)'. Empty when the check did not run."""
        if self.parameters is None:
            return ""
        model = f"{self.parameters:,} parameters"
        stored = self.stored_parameters
        if stored is None or stored == self.parameters:
            return model
        parts = []
        if self.mtp_parameters:
            parts.append(f"{self.mtp_parameters:,} in MTP tensors transformers skips")
        rest = stored - self.mtp_parameters - self.parameters
        if rest > 0:
            parts.append(f"{rest:,} more in tensors the model does not load")
        elif rest < 0:
            # A count is never negative: the model holds more than is stored, and the verdict
            # says where (a key missing, or a tensor stored smaller: experts missing from a
            # stacked expert tensor shorten it without removing its key).
            where = [
                f"{n:,} tensor{'s' if n != 1 else ''} {what}"
                for n, what in (
                    (len(self.missing), "missing"),
                    (len(self.mismatched), "stored with another shape"),
                )
                if n
            ]
            why = f" ({' and '.join(where)})" if where else ""
            parts.append(f"{-rest:,} fewer than the model holds{why}")
        return f"{model} in the model, {stored:,} stored ({'; '.join(parts)})"

    def to_dict(self, *, limit: int | None = None) -> dict[str, Any]:
        """JSON-ready: every field, mismatches as {key, stored, expected}, and `counts` of
        every list and map. With `limit`, each list and map (and each key's list of stored
        tensors in `sources`) keeps its first `limit` entries: a 300,000-tensor NVFP4
        checkpoint expects 296,028 quantization tensors, and `check --json` stays small
        (`--full` lists them all); `complete` says whether nothing was left out."""
        lists: dict[str, Sequence[Any]] = {
            "missing": self.missing,
            "unexpected": self.unexpected,
            "mismatched": self.mismatched,
            "mtp_skipped": self.mtp_skipped,
            "quantization_expected": self.quantization_expected,
        }
        maps: dict[str, Mapping[str, Any]] = {
            "sources": self.sources,
            "stored_as": self.stored_as,
            "reasons": self.reasons,
        }
        counts = {k: len(v) for k, v in {**lists, **maps}.items()}

        def first(items: Iterable[Any]) -> list[Any]:
            return list(islice(items, limit) if limit is not None else items)

        return {
            "architecture": self.architecture,
            "skipped": self.skipped,
            "loads": self.loads,
            "missing": first(self.missing),
            "unexpected": first(self.unexpected),
            "mismatched": [
                {"key": m.key, "stored": list(m.stored), "expected": list(m.expected)}
                for m in first(self.mismatched)
            ],
            "mtp_skipped": first(self.mtp_skipped),
            "quantization_expected": first(self.quantization_expected),
            "parameters": self.parameters,
            "stored_parameters": self.stored_parameters,
            "mtp_parameters": self.mtp_parameters,
            "parameters_rule": PARAMETER_RULE,
            "quantization": self.quantization,
            "transformers_version": self.transformers_version,
            "sources": {k: first(v) for k, v in first(self.sources.items())},
            "stored_as": dict(first(self.stored_as.items())),
            "reasons": dict(first(self.reasons.items())),
            "counts": counts,
            "complete": limit is None
            or (
                all(n <= limit for n in counts.values())
                and all(len(v) <= limit for v in self.sources.values())
            ),
        }

    @classmethod
    def from_dict(cls, data: object) -> LoadVerdict:
        """The verdict whose complete `to_dict()` (no `limit`) is `data`, checked field by
        field. It comes from another process (`inspector._internal.load.child`) that ran
        transformers on an untrusted config, and with `--trust-remote-code` the folder's own
        code: a field of the wrong type raises ValueError instead of reaching a report."""
        if not isinstance(data, Mapping) or data.get("complete") is not True:
            raise ValueError("a load verdict must be the complete to_dict() of one")
        mismatched = []
        for m in _items(data, "mismatched", Mapping):
            mismatched.append(
                ShapeMismatch(
                    _text(m.get("key")), _shape(m.get("stored")), _shape(m.get("expected"))
                )
            )
        sources = _field(data, "sources", Mapping)
        return cls(
            architecture=_optional(data.get("architecture"), str),
            skipped=_optional(data.get("skipped"), str),
            missing=_texts(data, "missing"),
            unexpected=_texts(data, "unexpected"),
            mismatched=tuple(mismatched),
            mtp_skipped=_texts(data, "mtp_skipped"),
            quantization_expected=_texts(data, "quantization_expected"),
            parameters=_optional(data.get("parameters"), int),
            stored_parameters=_optional(data.get("stored_parameters"), int),
            mtp_parameters=_integer(data.get("mtp_parameters")),
            quantization=_optional(data.get("quantization"), str),
            transformers_version=_optional(data.get("transformers_version"), str),
            sources=MappingProxyType(
                {_text(k): tuple(map(_text, _sequence(v))) for k, v in sources.items()}
            ),
            stored_as=MappingProxyType(_text_map(data, "stored_as")),
            reasons=MappingProxyType(_text_map(data, "reasons")),
        )


def _field(data: Mapping[str, Any], name: str, kind: type) -> Any:
    value = data.get(name)
    if not isinstance(value, kind):
        raise ValueError(f"load verdict field {name!r}: expected {kind.__name__}")
    return value


def _sequence(value: object) -> list[Any]:
    if not isinstance(value, list):
        raise ValueError(f"load verdict: expected a list, got {type(value).__name__}")
    return value


def _items(data: Mapping[str, Any], name: str, kind: type) -> list[Any]:
    items = _field(data, name, list)
    # One C-level pass: a kept verdict lists ~300,000 quantization tensors at 300k tensors.
    if not all(map(isinstance, items, repeat(kind))):
        raise ValueError(f"load verdict field {name!r}: expected a list of {kind.__name__}")
    return items


def _text(value: object) -> str:
    if not isinstance(value, str):
        raise ValueError(f"load verdict: expected a string, got {type(value).__name__}")
    return value


def _texts(data: Mapping[str, Any], name: str) -> tuple[str, ...]:
    return tuple(_items(data, name, str))


def _text_map(data: Mapping[str, Any], name: str) -> dict[str, str]:
    return {_text(k): _text(v) for k, v in _field(data, name, Mapping).items()}


def _integer(value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"load verdict: expected an integer, got {type(value).__name__}")
    return value


def _shape(value: object) -> tuple[int, ...]:
    return tuple(_integer(v) for v in _sequence(value))


def _optional(value: object, kind: type) -> Any:
    if value is None:
        return None
    return _integer(value) if kind is int else _text(value)


def load_verdict(
    scanned: ScannedCheckpoint, *, trust_remote_code: bool = False, cache: bool = True
) -> LoadVerdict:
    """The model code's verdict on `scanned` (see the module docstring).

    `trust_remote_code` lets a config whose architecture transformers does not ship use the
    modelling code in the checkpoint folder (`auto_map`); code from anywhere else is never
    fetched. The model built for a config is cached for the rest of the process.

    `cache` (default) takes the verdict kept in the user's cache for exactly this checkpoint
    content, these options and this environment, when there is one (no torch, no
    transformers imported), and keeps a computed one there; `cache=False` computes it again
    and replaces the kept one (`--no-cache`). See `inspector._internal.load.cache`.
    """
    architecture = _architecture(scanned.config)
    try:
        _precondition(scanned, architecture)
    except LoadSkipped as why:  # decided by the files alone, at no cost: never kept
        return LoadVerdict(architecture=architecture, skipped=str(why))
    key = verdict_key(scanned, trust_remote_code=trust_remote_code)
    if cache and key is not None:
        found = _kept(key, architecture)
        if found is not None:
            return found
    try:
        # Hundreds of thousands of small tuples, all kept: the collector's passes over them
        # would cost more than the work (see inspector._internal.common.gc).
        with gc_paused():
            stored = stored_tensors(scanned)
            quant = quantization_view(scanned, stored)
            # transformers' code runs sealed: no prompt, no network, no write outside a
            # private temp folder (inspector._internal.load.seal).
            with sealed():
                built = _built(architecture, scanned.config, scanned.local_path, trust_remote_code)
                verdict = _verdict(scanned, architecture, built, quant, stored)
    except LoadSkipped as why:
        verdict = LoadVerdict(architecture=architecture, skipped=str(why))
        if _passing(why):
            return verdict
    if key is not None:
        verdict_cache.keep(key, verdict.to_dict())
    return verdict


def known_verdict(
    scanned: ScannedCheckpoint, *, trust_remote_code: bool = False, cache: bool = True
) -> LoadVerdict | None:
    """The verdict of `scanned` when no model needs building: a skip its files decide (no
    config, a layout loaders do not read...) or, with `cache`, the verdict kept in the
    user's cache; None when `load_verdict` would build the model. Imports neither torch nor
    transformers (the dashboard then starts no process for the verdict)."""
    architecture = _architecture(scanned.config)
    try:
        _precondition(scanned, architecture)
    except LoadSkipped as why:
        return LoadVerdict(architecture=architecture, skipped=str(why))
    key = verdict_key(scanned, trust_remote_code=trust_remote_code) if cache else None
    return None if key is None else _kept(key, architecture)


def _kept(key: Mapping[str, Any], architecture: str | None) -> LoadVerdict | None:
    """The verdict kept for `key`, checked field by field like any other answer from outside
    this process (`LoadVerdict.from_dict`); None for no entry or one that does not pass."""
    # Hundreds of thousands of strings, all kept: no collector passes over them meanwhile
    # (see inspector._internal.common.gc).
    with gc_paused():
        data = verdict_cache.kept(key)
        if data is None:
            return None
        try:
            verdict = LoadVerdict.from_dict(data)
        except ValueError:
            return None
    return verdict if verdict.architecture == architecture else None


def _passing(why: LoadSkipped) -> bool:
    """A skip this machine's state caused (memory, a file that could not be read, the
    recursion depth, a refused act of the seal): another run may not meet it, so it is
    not kept."""
    seen: set[int] = set()
    cause = why.__cause__ or why.__context__
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, MemoryError | OSError | RecursionError):
            return True
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return False


def verdict_key(
    scanned: ScannedCheckpoint, *, trust_remote_code: bool = False
) -> dict[str, Any] | None:
    """What decides the verdict of `scanned` besides the environment (versions and the tool's
    code, `inspector._internal.load.cache.environment`): the digest of what the verdict reads
    (`verdict_digest`), `trust_remote_code`, whether the folder is local (a remote checkpoint's
    code is never run) and, when its code may run, the digest of the folder's Python files
    (`inspector._internal.load.cache.code_digest`). The checkpoint's path is not part of it: a
    copy has the verdict of its original. None when the folder's code is too large to digest
    (then nothing is kept)."""
    folder = scanned.local_path
    code = None
    if trust_remote_code and folder is not None:
        code = verdict_cache.code_digest(folder)
        if code is None:
            return None
    return {
        "reads": verdict_digest(scanned),
        "trust_remote_code": trust_remote_code,
        "local": folder is not None,
        "code": code,
    }


def verdict_digest(scanned: ScannedCheckpoint) -> str:
    """A SHA-256 of everything `load_verdict` reads of `scanned`: the layout, config.json
    and the quantization config (exactly, in file order: which `auto_map` entry names the
    model depends on it), the names of the JSON files found, the index's file and its set of
    shards as spelled (their sorted spellings order the reads: `checkpoint.loaded`), and
    every shard's file, readability, tensor names, dtypes, shapes and byte spans (the spans
    tell a `.bin` file's tied weights, which the stored parameter count counts once).
    Computed once per scan.

    The dashboard's child answers with the digest of its own scan, compared with this one
    (`inspector._internal.load.child`); the verdict cache is keyed by it (`verdict_key`).
    Every part goes in framed: JSON values (integers of any size exactly) and little-endian
    arrays whose lengths go first, so two scans that differ never hash the same bytes."""
    return scanned.derived("verdict-digest", lambda: _digest(scanned))


def _digest(scanned: ScannedCheckpoint) -> str:
    h = hashlib.sha256()

    def add(value: Any) -> None:
        h.update(_JSON.encode(value))
        h.update(b"\0")

    index = scanned.index
    add(
        [
            str(scanned.layout),
            scanned.config,
            scanned.quant_config,
            sorted(scanned.json_files),
            # The files entries name, from the index's coded column (building its weight
            # map of 300,000 names would cost more than the whole digest).
            None if index is None else sorted(index.files.used()),
            # Which index it is: transformers reads `pytorch_model.bin` alone beside a .bin
            # index, not beside a safetensors one (`checkpoint.loaded.alone`).
            None if index is None else index.file,
            len(scanned.shards),
        ]
    )
    for shard in scanned.shards:
        dtype, shape = shard.dtype, shard.shape
        columns = (dtype.codes, shape.codes, shard.begins, shard.ends)
        add([shard.file, shard.readable, len(shard.names), [len(c) for c in columns]])
        add(shard.names)
        add(dtype.values)
        add(shape.values)
        for column, width in zip(columns, ("<i4", "<i4", "<i8", "<i8"), strict=True):
            h.update(np.ascontiguousarray(column, dtype=width).tobytes())
    return h.hexdigest()


def _plain(value: Any) -> Any:
    """What the digest's JSON encoder is given for a type it does not encode itself: the
    scan's read-only views of config.json as dicts, numpy integers as ints."""
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, np.integer):
        return int(value)
    raise TypeError(f"the verdict digest cannot encode {type(value).__name__}")


_JSON = msgspec.json.Encoder(enc_hook=_plain)


def prepare_load_check() -> None:
    """Import what every verdict needs (torch, transformers and its model base class: 6 s on
    2 shared cores) ahead of the first one; nothing when they are not installed."""
    try:
        import torch  # noqa: F401
        import transformers
    except ImportError:
        return
    transformers.PreTrainedModel  # noqa: B018 (transformers imports it on first access)


def clear_model_cache() -> None:
    """Forget the meta models built so far (tests, long-lived notebook sessions)."""
    _build.cache_clear()


def stored_tensors(scanned: ScannedCheckpoint) -> dict[str, Stored]:
    """The tensors a loader reads, name -> (dtype, shape): of a name several of the shards
    it reads hold, the copy transformers keeps (`checkpoint.loaded.kept_signatures`)."""
    return kept_signatures(scanned)


def stored_files(scanned: ScannedCheckpoint, names: Iterable[str]) -> dict[str, str]:
    """The shard each of `names` is read from (the copy `stored_tensors` takes)."""
    kept = kept_copies(scanned, set(names))
    return {name: shard.file for name, (shard, _) in kept.items()}


# -- preconditions ---------------------------------------------------------------------------


def _architecture(config: Mapping[str, Any] | None) -> str | None:
    archs = config.get("architectures") if isinstance(config, Mapping) else None
    if isinstance(archs, list) and archs and isinstance(archs[0], str) and archs[0]:
        return archs[0]
    return None


def _precondition(scanned: ScannedCheckpoint, architecture: str | None) -> None:
    if scanned.layout not in LOADABLE_LAYOUTS:
        raise LoadSkipped(
            f"the {scanned.layout} layout is not what a loader reads; check the Hugging Face "
            "checkpoint it is consolidated or converted into"
        )
    if scanned.config is None:
        if any(f.endswith(CONFIG_NAME) and "quant" not in f for f in scanned.json_files):
            raise LoadSkipped("config.json cannot be read (see its config-unreadable finding)")
        if scanned.layout == "safetensors-single" and (scanned.location / CONFIG_NAME).is_file():
            raise LoadSkipped(
                "a lone .safetensors file was scanned; scan its folder to use config.json"
            )
        raise LoadSkipped("no config.json next to the shards")
    if architecture is None:
        raise LoadSkipped("config.json names no architecture (its `architectures` list is empty)")
    if any(not s.readable for s in scanned.shards):
        raise LoadSkipped("a shard header is unreadable, so the stored tensors are not all known")
    _within_bounds(scanned.config)
    for module in ("torch", "transformers"):
        if importlib.util.find_spec(module) is None:
            raise LoadSkipped(f"{module} is not installed (pip install transformers torch)")


def _within_bounds(config: Mapping[str, Any], depth: int = 0) -> None:
    """Refuse to build what a hostile config.json could make endless: counts of layers or
    experts far past any real model's, at the top level or in a nested sub-config."""
    layers = experts = 1
    for key, value in config.items():
        if isinstance(value, dict) and depth < 3:
            _within_bounds(value, depth + 1)
        if not isinstance(value, int) or isinstance(value, bool):
            continue
        name = key.lower()
        # Counts only (`num_hidden_layers`, `n_routed_experts`), not sizes such as
        # `shared_expert_intermediate_size`.
        if not (name.startswith(("num_", "n_")) or name.endswith(("layers", "experts", "layer"))):
            continue
        # Shown bounded: the key and the number come from an untrusted file.
        if "layer" in name and value > MAX_LAYERS:
            raise LoadSkipped(
                f"config.json {short_repr(key, limit=80)} is {format_count(value)}, over the "
                f"{MAX_LAYERS:,} this check builds"
            )
        if "expert" in name and value > MAX_EXPERTS:
            raise LoadSkipped(
                f"config.json {short_repr(key, limit=80)} is {format_count(value)}, over the "
                f"{MAX_EXPERTS:,} this check builds"
            )
        if name in ("num_hidden_layers", "num_layers", "n_layer"):
            layers = max(layers, value)
        if name in ("n_routed_experts", "num_experts", "num_local_experts"):
            experts = max(experts, value)
    if layers * experts > MAX_LAYER_EXPERTS:
        raise LoadSkipped(
            f"config.json declares {layers:,} layers of {experts:,} experts, over the "
            f"{MAX_LAYER_EXPERTS:,} expert blocks this check builds"
        )


# -- the meta model --------------------------------------------------------------------------


@dataclass(frozen=True)
class _Built:
    """A meta model and the facts about it that every verdict needs."""

    model: Any
    shapes: dict[str, tuple[int, ...]]
    parameters: int
    version: str


def _built(
    architecture: str | None, config: Mapping[str, Any] | None, folder: Path | None, trust: bool
) -> _Built:
    """`folder` is None for a remote checkpoint: its modelling code is never fetched.

    Code references are decided here, never by transformers: the top-level `auto_map` with
    `trust` (the folder's own files only), every other one never (`_for_transformers`). The
    build itself runs sealed, so whatever path a config opens inside transformers, it cannot
    prompt, reach the network or write outside a private temp folder; a build that needed
    one of those is skipped with what it needed."""
    assert architecture is not None and config is not None
    plain, nested_code = _for_transformers(config)
    text = orjson.dumps(plain, option=orjson.OPT_SORT_KEYS).decode()
    reference = _remote_reference(config, architecture)
    code = None
    if trust and reference:
        if folder is None:
            raise LoadSkipped(
                "the config names modelling code in the checkpoint, and the code of a remote "
                "checkpoint is never fetched or run; check a local copy with --trust-remote-code"
            )
        auto_map = config.get("auto_map")
        config_ref = auto_map.get("AutoConfig") if isinstance(auto_map, Mapping) else None
        code = (
            str(folder),
            _local_reference(str(folder), reference),
            _local_reference(str(folder), config_ref),
        )
    with sealed() as seal:
        try:
            return _build(architecture, text, code, reference is not None)
        except LoadSkipped as why:
            needed = seal.needed(why.__cause__)
            if needed is not None:
                raise LoadSkipped(
                    f"building {architecture} from config.json needs {needed}; the load check "
                    "runs offline, never asks for input and writes nothing outside its temp "
                    "folder"
                ) from None
            if nested_code and why.__cause__ is not None:
                where, ref = nested_code[0]
                raise LoadSkipped(
                    f"{why}; config.json {where} names modelling code ({short_repr(ref, limit=80)})"
                    " for a part of the model, and the load check runs no such code (only the "
                    "folder's own top-level auto_map, with --trust-remote-code)"
                ) from None
            raise


def bounded_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """config.json as a model builder other than transformers is given it (vLLM's, in
    `load.engine_child`): within the bounds the load check builds (layers, experts, depth,
    values), every `auto_map` removed at any depth. ValueError with the reason otherwise."""
    try:
        _within_bounds(config)
        cleaned, _ = _for_transformers(config)
    except LoadSkipped as why:
        raise ValueError(str(why)) from None
    return cleaned


# How deep config.json may nest, and how many values it may hold, for the load check to
# build from it: real configs nest a few levels (a quantization or vision config inside a
# text config) and hold at most some hundred thousand values (per-module quantization).
MAX_CONFIG_DEPTH = 32
MAX_CONFIG_VALUES = 2_000_000


def _for_transformers(config: Mapping[str, Any]) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """config.json as transformers is given it: every `auto_map` removed, at any depth.

    transformers resolves a nested `auto_map` by itself (`AutoModel.from_config` of a
    sub-config passes no `trust_remote_code`): it asks on the terminal, then fetches and
    imports the code from the repository the sub-config names. Without one it builds the
    sub-model from its own classes, as it does for a type it ships, or fails (a skip here).
    One pass, bounded: past `MAX_CONFIG_DEPTH` levels or `MAX_CONFIG_VALUES` values the check
    is skipped. Returns (the config, [(where, reference)] of the nested code references)."""
    nested: list[tuple[str, str]] = []
    left = MAX_CONFIG_VALUES

    def walk(value: Any, path: tuple[Any, ...]) -> Any:
        nonlocal left
        if len(path) >= MAX_CONFIG_DEPTH:
            raise LoadSkipped(
                f"config.json nests more than {MAX_CONFIG_DEPTH} levels deep (at "
                f"{_where(path)}); real configs nest a few, and this check builds none deeper"
            )
        left -= len(value)
        if left < 0:
            raise LoadSkipped(
                f"config.json holds more than {MAX_CONFIG_VALUES:,} values; this check builds "
                "no config that large"
            )
        if isinstance(value, Mapping):
            out = {}
            for key, item in value.items():
                if key == "auto_map":
                    if path:
                        nested.extend((f"{_where(path)}.auto_map", r) for r in _references(item))
                    continue
                out[key] = walk(item, (*path, key)) if isinstance(item, Mapping | list) else item
            return out
        return [walk(item, (*path, i)) if isinstance(item, Mapping | list) else item
                for i, item in enumerate(value)]  # fmt: skip

    return walk(config, ()), nested


def _references(auto_map: object) -> list[str]:
    """The code references an `auto_map` value names (`module.Class`, `repo--module.Class`,
    or lists of them, as tokenizers have)."""
    if not isinstance(auto_map, Mapping):
        return [short_repr(auto_map, limit=80)]
    refs = []
    for value in auto_map.values():
        for ref in value if isinstance(value, list) else [value]:
            if isinstance(ref, str) and ref:
                refs.append(ref)
    return refs or [short_repr(dict(auto_map), limit=80)]


def _where(path: tuple[Any, ...]) -> str:
    """A config path for a message (`vision_config.layers[3]`), each key bounded."""
    parts = []
    for key in path:
        if isinstance(key, int):
            parts.append(f"[{key}]")
        else:
            parts.append(("." if parts else "") + short_repr(str(key), limit=40))
    text = "".join(parts)
    return short_repr(text, limit=200)


@lru_cache(maxsize=4)
def _build(
    architecture: str, config_text: str, code: tuple[str, str, str] | None, referenced: bool
) -> _Built:
    """The meta model. `code` is (folder, model class reference, config class reference)
    of the folder's own code, already checked; `referenced`: config.json names code for
    the architecture (for the skip reason when it is not allowed)."""
    import torch
    import transformers

    config_dict = orjson.loads(config_text)
    with _quiet():
        model_cls, config_cls = _classes(architecture, code, referenced)
        try:
            # transformers writes Infinity and NaN as {"__float__": ...} objects.
            decode = getattr(config_cls, "_decode_special_floats", lambda value: value)
            config_dict = decode(config_dict)
            own_type = getattr(config_cls, "model_type", "")
            if code is None and own_type:
                # The architecture is built as transformers defines it, so its key renaming
                # and conversions (looked up by model_type) are that architecture's even when
                # the config names a derived type (Kimi K2's `kimi_k2` is DeepSeek-V3).
                config_dict = {**config_dict, "model_type": own_type}
            config = config_cls.from_dict(config_dict)
            with _meta_init():
                model = model_cls._from_config(config, dtype=torch.bfloat16)
                # Tied as save_pretrained sees the model (its parameter count counts a tied
                # weight once); no_init_weights also skipped the tying init_weights does.
                model.tie_weights()
        except Exception as exc:  # the config is untrusted input: any failure is a skip
            raise LoadSkipped(
                f"transformers {transformers.__version__} cannot build {architecture} from "
                f"config.json ({type(exc).__name__}: {_one_line(exc)})"
            ) from exc
    model.eval()
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    return _Built(model, shapes, model.num_parameters(), transformers.__version__)


def _classes(
    architecture: str, code: tuple[str, str, str] | None, referenced: bool
) -> tuple[Any, Any]:
    """(model class, config class) for `architecture`: transformers' own, or with
    `trust_remote_code` the checkpoint folder's `auto_map` classes (typed Any: classes made
    from the folder's code have no static type)."""
    import transformers

    if code is not None:
        return _folder_classes(*code)
    model_cls = getattr(transformers, architecture, None) if architecture.isidentifier() else None
    if isinstance(model_cls, type) and issubclass(model_cls, transformers.PreTrainedModel):
        found: Any = model_cls  # transformers is not followed by mypy (pyproject.toml)
        return found, found.config_class
    if referenced:
        raise LoadSkipped(
            f"{architecture} is defined by code in the checkpoint folder (auto_map); allow it "
            "with --trust-remote-code"
        )
    raise LoadSkipped(f"transformers {transformers.__version__} does not know {architecture}")


def _remote_reference(config: Mapping[str, Any], architecture: str) -> str | None:
    """The `auto_map` reference (`module.Class`) of the model class, if the config has one."""
    auto_map = config.get("auto_map")
    if not isinstance(auto_map, Mapping):
        return None
    for key in ("AutoModelForCausalLM", "AutoModel"):
        ref = auto_map.get(key)
        if isinstance(ref, list | tuple):
            ref = ref[0] if ref else None
        if isinstance(ref, str) and ref:
            return ref
    refs = [v for v in auto_map.values() if isinstance(v, str) and v.endswith(f".{architecture}")]
    return refs[0] if refs else None


def _folder_classes(folder: str, model_ref: str, config_ref: str) -> tuple[Any, Any]:
    """The classes the folder's own files define, imported from the folder alone
    (`inspector._internal.load.seal.import_from_folder`: never through transformers' modules
    cache)."""
    try:
        classes = []
        for ref in (model_ref, config_ref):
            module, _, name = ref.rpartition(".")
            classes.append(getattr(import_from_folder(folder, module), name))
    except Exception as exc:  # remote code is arbitrary: any failure is a skip
        raise LoadSkipped(
            f"the checkpoint's own code ({model_ref}) cannot be imported "
            f"({type(exc).__name__}: {_one_line(exc)})"
        ) from None
    return classes[0], classes[1]


def _local_reference(folder: str, ref: object) -> str:
    """`ref` when it names a module file in the checkpoint folder; otherwise a skip."""
    # `repo--module.Class` names code in another repository: never fetched.
    if not isinstance(ref, str) or "--" in ref or not _local_module(folder, ref):
        name = repr(short_repr(ref, limit=120)) if isinstance(ref, str) else short_repr(ref)
        raise LoadSkipped(
            f"auto_map names {name}, which is not a module file in the checkpoint folder; only "
            "code that sits in the folder is run"
        )
    return ref


def _local_module(folder: str, ref: str) -> bool:
    """`ref`'s module is a regular file in the folder, and no Python file there (which the
    module may import) is a link: code from elsewhere is never run."""
    module = ref.rpartition(".")[0]
    path = Path(folder) / f"{module.replace('.', '/')}.py"
    links = [p for p in Path(folder).glob("*.py") if p.is_symlink()]
    return bool(module) and path.is_file() and not path.is_symlink() and not links


@contextlib.contextmanager
def _meta_init() -> Iterator[None]:
    """transformers' own recipe for an empty model: parameters on `meta`, no weight init
    (the values are never looked at); weights are tied as `save_pretrained` sees them."""
    import torch
    from transformers import initialization as init

    with contextlib.ExitStack() as stack:
        stack.enter_context(torch.device("meta"))
        stack.enter_context(init.no_init_weights())
        safe = getattr(init, "meta_device_safe_creation_ops", None)
        if safe is not None:
            stack.enter_context(safe())
        yield


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """transformers logs (and warns) about configs and tying; the verdict says what matters."""
    logger = logging.getLogger("transformers")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.setLevel(level)


# -- simulated loading ----------------------------------------------------------------------


@dataclass
class _Loaded:
    missing: set[str]
    unexpected: set[str]
    mismatched: dict[str, ShapeMismatch]
    sources: dict[str, list[str]]
    errors: dict[str, str]


def _simulate(built: _Built, tensors: Mapping[str, Stored]) -> _Loaded:
    """`from_pretrained`'s loading report for tensors of these dtypes and shapes.

    This follows `transformers.core_model_loading.convert_and_load_state_dict_in_model` step
    by step, calling transformers' own renaming (`rename_source_key`), converters and
    conversion ops on meta tensors. Its function itself is not called: it loads values into
    the model (which would change the cached meta model) and builds a renaming object and a
    deep copy per stored tensor (seconds for 50,000 tensors). So a plainly renamed tensor is
    compared with the model's shape directly (what `set_param_for_module` does), a converter
    is copied once per target key, and a few no-ops are skipped (see `_active`, `_Converted`).
    """
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import (
        GroupWeightRename,
        WeightConverter,
        dot_natural_key,
        rename_source_key,
    )
    from transformers.utils.loading_report import LoadStateDictInfo

    model, shapes = built.model, built.shapes
    transforms = get_model_conversion_mapping(model)
    converters = [t for t in transforms if isinstance(t, WeightConverter)]
    by_pattern = {p: c for c in converters for p in c.source_patterns}
    names = list(tensors)
    # Only a group renaming depends on the order keys are met in (its guard key first).
    if any(isinstance(t, GroupWeightRename) for t in transforms):
        names.sort(key=dot_natural_key)
    renamings, converters = _active(transforms, names)
    prefix = model.base_model_prefix
    info = LoadStateDictInfo(
        missing_keys=set(shapes),
        unexpected_keys=set(),
        mismatched_keys=set(),
        conversion_errors={},
        error_msgs=[],
        skipped_pp_keys=set(),
    )
    sources: dict[str, list[str]] = {}
    plain: dict[str, tuple[int, ...]] = {}
    grouped: dict[str, tuple[Any, list[tuple[str, str]]]] = {}
    for original in names:
        renamed, pattern = rename_source_key(original, renamings, converters, prefix, shapes)
        if renamed not in shapes and original in shapes:
            renamed, pattern = rename_source_key(original, [], [], prefix, shapes)
        if renamed in shapes:
            sources.setdefault(renamed, []).append(original)
            if renamed in plain:
                continue  # a key met again: the first stored tensor is the one loaded
            if pattern is None and renamed not in grouped:
                plain[renamed] = tensors[original][1]
                continue
            if renamed not in grouped:
                assert pattern is not None  # a plain key was stored above
                grouped[renamed] = (by_pattern[pattern], [])
            grouped[renamed][1].append((pattern or original, original))
        elif pattern is not None:
            targets = by_pattern[pattern].target_patterns
            for target in targets:
                key = renamed.replace(targets[0], target)
                info.unexpected_keys.add(key)
                sources.setdefault(key, []).append(original)
        else:
            info.unexpected_keys.add(renamed)
            sources.setdefault(renamed, []).append(original)
    mismatched: dict[str, ShapeMismatch] = {}

    def place(key: str, shape: tuple[int, ...]) -> None:
        # `set_param_for_module`: extra state always loads; a name the model does not
        # have is unexpected; otherwise the key is found, and its shape may differ.
        if key.rpartition(".")[2] == "_extra_state":
            info.missing_keys.discard(key)
            return
        expected = shapes.get(key)
        if expected is None:
            info.unexpected_keys.add(key)
            return
        info.missing_keys.discard(key)
        if shape != expected:
            mismatched[key] = ShapeMismatch(key, shape, expected)

    for key, shape in plain.items():
        place(key, shape)
    converted = _Converted(model, shapes, tensors, info)
    for first, (template, members) in grouped.items():
        for key, shape in converted.run(first, template, members).items():
            place(key, shape)
            if key != first:
                sources.setdefault(key, sources.get(first, []))
    _finish(model, info)
    return _Loaded(
        info.missing_keys, info.unexpected_keys, mismatched, sources, info.conversion_errors
    )


def _active(transforms: list[Any], names: list[str]) -> tuple[list[Any], list[Any]]:
    """(renamings, converters) of `transforms` that rename at least one of `names`.

    A transform whose pattern matches no name (after the renamings before it, which chain)
    leaves every key as it is, so skipping it changes nothing; most of the legacy renamings
    every model carries match nothing, and testing them per key costs a second on 300,000
    keys. Only transforms using transformers' own regex matching are tested (C-level over all
    names); after one with its own logic or state, every later one is kept.
    """
    from transformers.core_model_loading import WeightConverter, WeightRenaming, WeightTransform

    def standard(t: Any) -> bool:
        rename = type(t).rename_source_key
        return rename is WeightTransform.rename_source_key and t.scope_prefix is None

    current = names
    known = True  # the names after the renamings kept so far
    renamings: list[Any] = []
    pending = [t for t in transforms if isinstance(t, WeightRenaming)]
    for i, t in enumerate(pending):
        if not standard(t):
            renamings += pending[i:]
            known = False  # outputs unknown from here on
            break
        if any(map(t.compiled_sources.search, current)):
            renamings.append(t)
            current = [t.rename_source_key(n)[0] for n in current]
    converters = [
        t
        for t in transforms
        if isinstance(t, WeightConverter)
        and (not known or not standard(t) or any(map(t.compiled_sources.search, current)))
    ]
    return renamings, converters


class _Converted:
    """Runs transformers' converters (e.g. per-expert tensors stacked into one) on meta
    tensors, once per kind of input.

    Fusing 256 experts of 61 layers is 120 identical conversions: a conversion whose only
    output is its own key is computed once per (converter, dtypes and shapes stored under each
    of its source patterns, the model's shapes of its target keys) and reused. transformers'
    ops read nothing else that shapes depend on (the model's shapes cover `Split` and
    `Transpose(check_dims)`, which look them up), and the order of the tensors under one
    pattern decides where each expert lands, not the shapes.
    """

    def __init__(self, model: Any, shapes: dict[str, tuple[int, ...]], tensors: Any, info: Any):
        self.model, self.shapes, self.tensors, self.info = model, shapes, tensors, info
        self.cache: dict[tuple[Any, ...], tuple[int, ...] | str] = {}

    def run(self, first: str, template: Any, members: list[tuple[str, str]]) -> dict[str, tuple]:
        from transformers.core_model_loading import SkipParameters

        targets = template.target_patterns
        by_pattern: dict[str, list[Stored]] = {}
        for pattern, name in members:
            by_pattern.setdefault(pattern, []).append(self.tensors[name])
        inputs = tuple(sorted((p, tuple(sorted(v))) for p, v in by_pattern.items()))
        expected = tuple(self.shapes.get(first.replace(targets[0], t)) for t in targets)
        key = (id(template), inputs, expected)
        hit = self.cache.get(key)
        if isinstance(hit, str):
            self.info.conversion_errors[first] = hit
            return {}
        if hit is not None:
            return {first: hit}
        converter = deepcopy(template)
        for pattern, name in members:
            converter.add_tensor(first, name, pattern, _meta_tensor(*self.tensors[name]))
        counts = {p: len(t) for p, t in converter.collected_tensors.items()}
        model = self.model
        try:
            realized = converter.convert(
                first, model=model, config=model.config, loading_info=self.info
            )
        except SkipParameters:
            matched = ", ".join(f"{n:,} stored as {p}" for p, n in counts.items())
            self.info.conversion_errors[first] = self.cache[key] = (
                f"transformers cannot build it from the stored tensors ({matched}), and "
                "from_pretrained stops with a conversion error"
            )
            return {}
        out = {k: tuple((v[0] if isinstance(v, list) else v).shape) for k, v in realized.items()}
        if set(out) == {first}:
            self.cache[key] = out[first]
        return out


def _finish(model: Any, info: Any) -> None:
    """`_finalize_model_loading`'s bookkeeping: module ties of custom code, weight ties (a tied
    key is not missing when its partner is stored) and the class's ignore lists."""
    if model.is_custom_code():
        # Modules shared by custom code appear twice in the state dict; loading one loads
        # both (mark_tied_weights_as_initialized), so a key whose tensor is the tensor of a
        # loaded key is not missing.
        state = model.state_dict(keep_vars=True)
        loaded = {id(t) for k, t in state.items() if k not in info.missing_keys}
        tied = model.all_tied_weights_keys
        info.missing_keys = {
            k for k in info.missing_keys if k in tied or id(state[k]) not in loaded
        }
    model.tie_weights(missing_keys=info.missing_keys, recompute_mapping=False)
    model._adjust_missing_and_unexpected_keys(info)


def _meta_tensor(dtype: str, shape: tuple[int, ...]) -> torch.Tensor:
    import torch

    return torch.empty(shape, dtype=torch_dtype(dtype), device="meta")


@lru_cache(maxsize=64)
def torch_dtype(dtype: str) -> torch.dtype:
    import torch

    names = {
        "BOOL": "bool",
        "U8": "uint8",
        "I8": "int8",
        "I16": "int16",
        "U16": "uint16",
        "I32": "int32",
        "U32": "uint32",
        "I64": "int64",
        "U64": "uint64",
        "F16": "float16",
        "BF16": "bfloat16",
        "F32": "float32",
        "F64": "float64",
        "F8_E4M3": "float8_e4m3fn",
        "F8_E5M2": "float8_e5m2",
        "F8_E8M0": "float8_e8m0fnu",
    }
    # Only shapes matter to the verdict: a dtype torch cannot hold stands in as uint8.
    return getattr(torch, names.get(dtype, "uint8"), torch.uint8)


# -- the verdict -----------------------------------------------------------------------------


def _verdict(
    scanned: ScannedCheckpoint,
    architecture: str | None,
    built: _Built,
    quant: Any,
    stored: Mapping[str, Stored],
) -> LoadVerdict:
    loaded = _simulate_quietly(built, quant.logical)
    # Back from the quantization view's names (`weight_packed` read as `weight`) to storage.
    stored_name = quant.stored_name
    sources = {
        k: tuple(stored_name.get(n, n) for n in v)
        for k, v in loaded.sources.items()
        if k in loaded.unexpected or k in loaded.mismatched
    }
    mtp = _mtp_names(scanned)
    all_mtp = {k for k, v in sources.items() if v and all(n in mtp for n in v)}
    unexpected = sorted(loaded.unexpected - all_mtp)
    # Stored MTP tensors transformers does not load: reported, or dropped by an ignore list.
    mtp_loaded = {n for k, v in loaded.sources.items() if k in built.shapes for n in v}
    mtp_skipped = sorted(n for n in mtp if n in stored and n not in mtp_loaded)
    mismatched = [loaded.mismatched[k] for k in sorted(loaded.mismatched)]
    reasons = dict(quant.reasons)
    reasons.update((k, v) for k, v in loaded.errors.items() if k in loaded.missing)
    missing = sorted(loaded.missing) + list(quant.missing)
    t = scanned.tensors
    in_mtp = t["name"].isin(set(mtp_skipped)).to_numpy(dtype=bool)
    return LoadVerdict(
        architecture=architecture,
        missing=tuple(missing),
        unexpected=tuple(unexpected),
        mismatched=(*mismatched, *quant.mismatched),
        mtp_skipped=tuple(mtp_skipped),
        quantization_expected=quant.expected,
        parameters=built.parameters,
        stored_parameters=scan_parameters(scanned),
        mtp_parameters=count_parameters(t[in_mtp], config=scanned.config) if in_mtp.any() else 0,
        quantization=quant.method,
        transformers_version=built.version,
        sources=MappingProxyType({k: v for k, v in sources.items() if k not in all_mtp}),
        stored_as=MappingProxyType(_stored_as(built, loaded.missing)),
        reasons=MappingProxyType(reasons),
    )


def _simulate_quietly(built: _Built, logical: Mapping[str, Stored]) -> _Loaded:
    with _quiet():
        try:
            return _simulate(built, logical)
        except LoadSkipped:
            raise
        except Exception as exc:  # transformers' own code on untrusted shapes: skip
            raise LoadSkipped(
                f"transformers failed while matching the stored tensors to the model "
                f"({type(exc).__name__}: {_one_line(exc)})"
            ) from None


def _mtp_names(scanned: ScannedCheckpoint) -> set[str]:
    t = scanned.tensors
    return set(t["name"][t["is_mtp"].to_numpy(dtype=bool)].tolist())


def _stored_as(built: _Built, missing: set[str]) -> dict[str, str]:
    """How a checkpoint stores each missing key, by transformers' own reverse conversion
    (what `save_pretrained` would write), where that differs from the key."""
    if not missing:
        return {}
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import WeightConverter, WeightRenaming, rename_source_key

    try:
        transforms = get_model_conversion_mapping(built.model, add_legacy=False)
        reverse = [t.reverse_transform() for t in transforms[::-1]]
    except Exception:  # a mapping without a reverse only costs the hint
        return {}
    renamings = [t for t in reverse if isinstance(t, WeightRenaming)]
    converters = [t for t in reverse if isinstance(t, WeightConverter)]
    by_pattern = {p: c for c in converters for p in c.source_patterns}
    out = {}
    for key in sorted(missing):
        spelled, pattern = rename_source_key(key, renamings, converters, reverse=True)
        if pattern is not None:
            # One key saved as several tensors (fused experts): name every one.
            targets = by_pattern[pattern].target_patterns
            spelled = " and ".join(spelled.replace(targets[0], t) for t in targets)
        if spelled != key:
            out[key] = spelled
    return out


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= 200 else text[:197] + "..."
