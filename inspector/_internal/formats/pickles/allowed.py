"""The allow-list: one table of every global a checkpoint's pickle may name, which readers
resolve it, and the stand-in (`pickles.stand_ins`) a read hands the stream for it; and the
classes the bounded child's reply may name (`reply_classes`).

Any other name is refused (`RefusedGlobalError`, or `HostilePickleError` when it runs code;
a reader may give a name a reason of its own). The DCP rows come from `pickletools.dis` of
what torch 2.13's DCP save and megatron-core 0.16's `dist_checkpointing.save` write, plus
older versions' names; the data.pkl rows from what `torch.save` writes for a state dict.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from inspector._internal.common.dtypes import STORAGE_DTYPES, TORCH_DTYPES
from inspector._internal.common.text import short_repr
from inspector._internal.formats.pickles.errors import PickleFormatError, RefusedGlobalError
from inspector._internal.formats.pickles.stand_ins import (
    LAYOUTS,
    MEMORY_FORMATS,
    InertCall,
    SizeReader,
    StorageType,
    TorchDtype,
    TorchName,
    layout,
    mem_format,
    ordered_dict,
    posix_path,
    rebuild_parameter,
    rebuild_tensor_v2,
    rebuild_tensor_v3,
    stand_in_class,
    state_dict,
    windows_path,
    write_item_type,
)

__all__ = [
    "DATA_PKL",
    "METADATA",
    "TABLE",
    "Reader",
    "Row",
    "not_in_reply",
    "reply_classes",
    "stand_ins",
]


@dataclass(frozen=True, slots=True)
class Reader:
    """One kind of pickle the tool reads: the rows of `TABLE` it resolves, and how its
    refusal of another global reads (a clause after the file name)."""

    name: str
    names_as: str  # "pickles": how a message says the stream names a global
    holds: str  # "a DCP metadata class": what every allowed global is
    # Globals refused as unreadable content (`PickleFormatError`) with a reason of their own.
    reasons: Mapping[tuple[str, str], str] = field(default_factory=dict, compare=False)

    def refused(self, module: str, name: str) -> Exception:
        reason = self.reasons.get((module, name))
        if reason is not None:
            return PickleFormatError(reason)
        full = f"{module}.{name}"
        return RefusedGlobalError(
            f"{self.names_as} {short_repr(full, limit=160)}, which is not {self.holds}; "
            "refused, not executed",
            names=(full,),
        )


METADATA = Reader("metadata", "pickles", "a DCP metadata class")
_QUANTIZED = (
    "QInt8Storage",
    "QUInt8Storage",
    "QInt32Storage",
    "QUInt4x2Storage",
    "QUInt2x4Storage",
)
DATA_PKL = Reader(
    "data.pkl",
    "data.pkl names",
    "part of a tensor dict",
    reasons={
        ("torch", kind): (
            f"holds quantized tensors (torch.{kind}), which have no byte layout a safetensors "
            "reader knows; dequantize them before saving"
        )
        for kind in _QUANTIZED
    },
)


@dataclass(frozen=True, slots=True)
class Row:
    """Globals `module.<name>` for each of `names`, resolved by `readers`, each to
    `make(name)`, called once per read."""

    module: str
    names: Collection[str]
    readers: frozenset[Reader]
    make: Callable[[str], Any]


def _calls(fn: Callable[..., Any]) -> Callable[[str], InertCall]:
    return lambda _: InertCall(fn)


def _rows(readers: Iterable[Reader], *rows: tuple[str, Collection[str], Any]) -> list[Row]:
    found = frozenset(readers)
    return [Row(module, names, found, make) for module, names, make in rows]


_DCP = "torch.distributed.checkpoint.metadata"
_DCP_OLD = "torch.distributed._shard.sharded_tensor.metadata"  # torch < 2.1 TensorProperties
_PLANNER = "torch.distributed.checkpoint.planner"
_FILESYSTEM = "torch.distributed.checkpoint.filesystem"
_MCORE = "megatron.core.dist_checkpointing.strategies.torch"
_METADATA_KINDS = (
    "Metadata",
    "TensorStorageMetadata",
    "BytesStorageMetadata",
    "ChunkStorageMetadata",
    "TensorProperties",
    "MetadataIndex",
    "StorageMeta",
)
# megatron-core's decentralized save planner (0.16) keeps every rank's SavePlan in the
# pickled Metadata (`all_local_plans`), with the items of each plan and, for a save that
# reuses a cached plan, the storage prefix of each rank.
_PLAN_KINDS = ("SavePlan", "WriteItem", "TensorWriteData", "BytesIOWriteData")
_UTILS = "torch._utils"

TABLE: tuple[Row, ...] = (
    *_rows(
        (METADATA, DATA_PKL),
        ("torch", tuple(TORCH_DTYPES), lambda name: TorchDtype(name=name)),
    ),
    *_rows(
        (METADATA,),
        (_DCP, _METADATA_KINDS, stand_in_class),
        (_PLANNER, _PLAN_KINDS, stand_in_class),
        (_PLANNER, ("WriteItemType",), _calls(write_item_type)),
        (_FILESYSTEM, ("_StorageInfo", "_StoragePrefix"), stand_in_class),
        (_DCP_OLD, ("TensorProperties",), stand_in_class),
        (_DCP_OLD, ("MEM_FORMAT_ENCODING",), _calls(mem_format)),
        (_DCP, ("_MEM_FORMAT_ENCODING",), _calls(mem_format)),
        (_MCORE, ("MCoreMetadata", "MCoreSavePlan"), stand_in_class),
        ("torch.serialization", ("_get_layout",), _calls(layout)),
        ("collections", ("OrderedDict",), _calls(ordered_dict)),
        ("torch", ("Size",), lambda _: SizeReader()),
        ("torch", LAYOUTS | MEMORY_FORMATS, lambda name: TorchName(name=name)),
        *(
            (module, names, _calls(fn))
            for module in ("pathlib", "pathlib._local")
            for names, fn in (
                (("PosixPath", "PurePosixPath", "Path"), posix_path),
                (("WindowsPath", "PureWindowsPath"), windows_path),
            )
        ),
    ),
    *_rows(
        (DATA_PKL,),
        (_UTILS, ("_rebuild_tensor_v2",), _calls(rebuild_tensor_v2)),
        (_UTILS, ("_rebuild_tensor_v3",), _calls(rebuild_tensor_v3)),
        (
            _UTILS,
            ("_rebuild_parameter", "_rebuild_parameter_with_state"),
            _calls(rebuild_parameter),
        ),
        ("collections", ("OrderedDict",), _calls(state_dict)),
        ("torch.storage", ("UntypedStorage",), lambda _: StorageType(dtype=None)),
        ("torch", ("UntypedStorage",), lambda _: StorageType(dtype=None)),
        ("torch", tuple(STORAGE_DTYPES), lambda name: StorageType(dtype=STORAGE_DTYPES[name])),
    ),
)


def stand_ins(reader: Reader) -> dict[tuple[str, str], Any]:
    """(module, name) -> the stand-in one read by `reader` hands out for that global: made
    anew for every read, so a stream can reach nothing another read uses."""
    return {
        (row.module, name): row.make(name)
        for row in TABLE
        if reader in row.readers
        for name in row.names
    }


def reply_classes(classes: Iterable[type]) -> dict[tuple[str, str], type]:
    """The table of the bounded child's reply (`pickles.sandbox`): the tool's own `classes`,
    each checked to refuse state a reply hands it.

    The reply is the child's work, and the child read hostile bytes: a reply that BUILDs
    on a class it names, or on an enum member (REDUCE gives the shared member), would change
    that object for the whole process. BUILD goes through `__setstate__` when the object
    has one: a frozen dataclass's sets only a new instance's fields (on the class itself it
    fails), an enum's or `Dims`' must refuse (`pickles.stand_ins.refuse_state`). Without one,
    BUILD would set the class's or the member's attributes."""
    allowed = {}
    for cls in classes:
        if getattr(cls, "__setstate__", None) is None:
            raise TypeError(
                f"{cls.__qualname__} takes any state a reply gives it; give it a "
                "__setstate__ (a frozen dataclass with slots has one; refuse_state for "
                "enums and tuples) before naming it in a sandbox reply"
            )
        allowed[(cls.__module__, cls.__qualname__)] = cls
    return allowed


def not_in_reply(module: str, name: str) -> Exception:
    """The reply's refusal of any other name (the child's answer is then not used)."""
    return pickle.UnpicklingError(f"{module}.{name} is not a class of the reply")
