"""A restricted unpickler for PyTorch DCP `.metadata` files (docs/formats.md, "Megatron
torch_dist").

`.metadata` is a pickle, and a plain `pickle.load` runs whatever the file names. This
unpickler never imports anything: every global the file may name is looked up in a fixed
list of names, each resolved to an inert stand-in defined here (DCP metadata records,
`torch.Size`, dtypes, layouts, Megatron's `MCoreMetadata`). Any other global is refused
before it is resolved, so a hostile file cannot run code. Torch is not needed, nor imported.
The stand-ins are made for each read and refuse every change (`formats.pickles.stand_ins`): nothing
a file does to them reaches the next file read.

`load_dcp_metadata` audits the stream (`pickles.audit`) before unpickling
it;
`read_dcp_metadata`, what the scan uses, runs large streams without the audit in a child
process the OS bounds (`pickles.sandbox`) and falls back to the audit when the
child gives no answer.

The table was derived by disassembling (`pickletools.dis`) the `.metadata` that
`torch.distributed.checkpoint.save` writes with torch 2.13 and that megatron-core 0.16's
`dist_checkpointing.save` writes (its save plans ride along), plus the names older torch and
Megatron versions are known to pickle.
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Callable, Iterable
from pathlib import PurePosixPath, PureWindowsPath
from typing import Any, TypeVar, cast

from inspector._internal.common.dtypes import (
    TORCH_DTYPES,  # re-exported: the table lives in inspector._internal.common.dtypes
)
from inspector._internal.formats.pickles.audit import (
    DEFAULT_LIMITS,
    HostilePickleError,
    PickleBombError,
    PickleFormatError,
    audit_pickle,
    hostile_globals,
    short_repr,
)
from inspector._internal.formats.pickles.sandbox import (
    DEFAULT_SANDBOX,
    SandboxFailed,
    SandboxLimits,
    SandboxUnavailable,
    run_bounded,
)
from inspector._internal.formats.pickles.stand_ins import (
    Inert,
    InertCall,
    SealedClass,
    refuse_state,
)
from inspector.errors import UnsafeInputError

__all__ = [
    "TORCH_DTYPES",
    "Dims",
    "HostileGlobalError",
    "HostilePickleError",
    "MetadataFormatError",
    "PickleBombError",
    "RefusedGlobalError",
    "StandIn",
    "TorchDtype",
    "load_dcp_metadata",
    "read_dcp_metadata",
]

T = TypeVar("T")

_LAYOUTS = frozenset(
    {
        "strided",
        "sparse_coo",
        "sparse_csr",
        "sparse_csc",
        "sparse_bsr",
        "sparse_bsc",
        "_mkldnn",
        "jagged",
    }
)
_MEMORY_FORMATS = frozenset(
    {"contiguous_format", "preserve_format", "channels_last", "channels_last_3d"}
)


class RefusedGlobalError(UnsafeInputError):
    """The pickle names a global outside the DCP metadata allow-list; nothing was run."""

    def __init__(self, module: str, name: str) -> None:
        self.module = module
        self.name = name
        shown = short_repr(f"{module}.{name}", limit=160)
        super().__init__(
            f"pickles {shown}, which is not a DCP metadata class; refused, not executed"
        )


class HostileGlobalError(RefusedGlobalError, HostilePickleError):
    """The pickle names callables that run code or reach the system (`os.system`,
    `builtins.eval`...): refused like any global outside the allow-list, and reported as a
    hostile file."""

    def __init__(self, names: tuple[str, ...]) -> None:
        HostilePickleError.__init__(self, names)
        self.module, _, self.name = names[0].rpartition(".")


class MetadataFormatError(ValueError):
    """The bytes are not a readable DCP metadata pickle (truncated, corrupt, wrong shape)."""


class TorchDtype(Inert):
    """A `torch.<name>` dtype global, by name only (one per read, immutable)."""

    __slots__ = ("name",)
    name: str

    def __init__(self, name: str) -> None:
        self._fill(name=name)

    @property
    def safetensors(self) -> str:
        """The safetensors dtype name (BF16, F32...), or `torch.<name>` when there is none."""
        mapped = TORCH_DTYPES[self.name][0]
        return mapped if mapped is not None else f"torch.{self.name}"

    @property
    def itemsize(self) -> int:
        return TORCH_DTYPES[self.name][1]


class TorchName(Inert):
    """A `torch.<name>` layout or memory-format global (`torch.strided`), by name only. Not
    a bare string: BUILD with no state leaves a string unchanged without an error, which
    would let the bounded child read a stream the audit refuses."""

    __slots__ = ("name",)
    name: str

    def __init__(self, name: str) -> None:
        self._fill(name=name)


class StandIn(metaclass=SealedClass):
    """An inert record standing in for one pickled class: it only keeps the pickled state.

    `kind` is the class it replaces (e.g. "TensorStorageMetadata"); `state` is what the
    pickle's BUILD opcode handed over (a dict, or a tuple for `TensorProperties`). The
    classes are made for each read (`_stand_in_classes`) and refuse changes to themselves;
    an instance is a new object of one read.
    """

    kind = "StandIn"
    # NEWOBJ creates instances without calling __init__; a stream with no BUILD after it
    # leaves this class default.
    state: Any = None

    def __init__(self) -> None:
        self.state: Any = None

    def __setstate__(self, state: Any) -> None:
        self.state = state

    def get(self, key: str, default: Any = None) -> Any:
        """A field of a dict state, or `default`."""
        return self.state.get(key, default) if isinstance(self.state, dict) else default

    def __repr__(self) -> str:
        return f"<{self.kind} stand-in>"


def _stand_in(kind: str) -> type[StandIn]:
    # One subclass per replaced class, so conversion code can tell them apart by `kind`.
    made = SealedClass(f"{kind}StandIn", (StandIn,), {"kind": kind, "__slots__": ()})
    return cast(type[StandIn], made)


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
_KINDS = (*_METADATA_KINDS, *_PLAN_KINDS, "_StorageInfo", "_StoragePrefix")
_MCORE_KINDS = ("MCoreMetadata", "MCoreSavePlan")


def _stand_in_classes() -> dict[str, type[StandIn]]:
    """A stand-in class per replaced class, made for one read."""
    return {kind: _stand_in(kind) for kind in (*_KINDS, *_MCORE_KINDS)}


class Dims(tuple):
    """A `torch.Size` whose items were checked to be non-negative ints.

    Only `torch.Size` in a pickle can produce one (the class itself is not in the
    allow-list), so later code validates a shape with `type(x) is Dims` instead of walking
    millions of tuples again. The bounded child's reply names the class: BUILD on it, or on
    an instance, is refused (a tuple takes no state)."""

    __slots__ = ()
    __setstate__ = refuse_state


# Sizes kept from a pickle are printed in reports: none may be wider than the audit allows.
_INT_BITS = 8 * DEFAULT_LIMITS.max_int_bytes


class _SizeReader(Inert):
    """`torch.Size(sequence)` -> `Dims`, or a plain tuple when the items are not all
    non-negative ints (the entry holding it is then reported as malformed).

    A large `.metadata` holds millions of sizes but few distinct ones, so results are
    cached per load. A cache hit returns the validated int tuple equal to the input, so an
    input that only compares equal (floats, bools) comes back as clean ints."""

    __slots__ = ("_seen",)
    _seen: dict[tuple[Any, ...], tuple[int, ...]]

    def __init__(self) -> None:
        self._fill(_seen={})

    def __call__(self, *args: Any) -> tuple[int, ...]:
        if len(args) != 1 or type(args[0]) not in (tuple, list):
            raise MetadataFormatError("torch.Size called with something other than one sequence")
        values = tuple(args[0])
        try:
            return self._seen[values]
        except KeyError:
            pass
        except TypeError:  # unhashable items: certainly not ints
            return values
        valid = set(map(type, values)) <= {int} and min(values, default=0) >= 0
        if valid and max(values, default=0).bit_length() > _INT_BITS:
            # Only the sandboxed path meets one (the audit refuses it first); refusing here
            # sends the stream to the audit, which says what it is.
            raise PickleBombError(
                f"holds a size wider than {_INT_BITS} bits; no checkpoint stores one: refused",
                kind="int",
            )
        result = Dims(values) if valid else values
        self._seen[values] = result
        return result


def _layout(name: Any) -> str:
    """`torch.serialization._get_layout("torch.strided")` -> "strided"."""
    if not isinstance(name, str) or name.removeprefix("torch.") not in _LAYOUTS:
        raise MetadataFormatError(f"unknown tensor layout {name!r}")
    return name.removeprefix("torch.")


def _mem_format(value: Any) -> int:
    """`_MEM_FORMAT_ENCODING(0)` -> 0 (contiguous), 1 (channels last), 2 (preserve)."""
    if type(value) is not int:
        raise MetadataFormatError(f"memory-format code {value!r} is not an int")
    return value


def _write_item_type(value: Any) -> int:
    """`WriteItemType(2)` (an Enum pickled by value: TENSOR 1, SHARD 2, BYTE_IO 3) -> 2."""
    if type(value) is not int:
        raise MetadataFormatError(f"write-item type {value!r} is not an int")
    return value


def _ordered_dict(*args: Any) -> dict[Any, Any]:
    # OrderedDict pickles as REDUCE(OrderedDict, ()) followed by SETITEMS; a plain dict
    # keeps the order and supports SETITEMS.
    return dict(*args) if args and isinstance(args[0], (list, tuple)) else {}


def _path(*parts: Any) -> str:
    """`pathlib.PosixPath("/", "ckpt")` (StorageMeta.checkpoint_id) -> its text only."""
    if not all(isinstance(p, str) for p in parts):
        raise MetadataFormatError("a pickled path has non-string parts")
    return str(PurePosixPath(*parts))


def _windows_path(*parts: Any) -> str:
    if not all(isinstance(p, str) for p in parts):
        raise MetadataFormatError("a pickled path has non-string parts")
    return str(PureWindowsPath(*parts))


def _stand_ins() -> dict[tuple[str, str], Any]:
    """(module, name) -> stand-in. The whole allow-list, in one place; made anew for every
    read, so a stream can reach nothing another read uses."""
    dcp = "torch.distributed.checkpoint.metadata"
    old = "torch.distributed._shard.sharded_tensor.metadata"  # torch < 2.1 TensorProperties
    mcore = "megatron.core.dist_checkpointing.strategies.torch"
    classes = _stand_in_classes()
    table: dict[tuple[str, str], Any] = {(dcp, k): classes[k] for k in _METADATA_KINDS}
    planner = "torch.distributed.checkpoint.planner"
    filesystem = "torch.distributed.checkpoint.filesystem"
    table |= {(planner, k): classes[k] for k in _PLAN_KINDS}
    mem_format, path, windows_path = (
        InertCall(_mem_format),
        InertCall(_path),
        InertCall(_windows_path),
    )
    table |= {
        (planner, "WriteItemType"): InertCall(_write_item_type),
        (filesystem, "_StorageInfo"): classes["_StorageInfo"],
        (filesystem, "_StoragePrefix"): classes["_StoragePrefix"],
        (old, "TensorProperties"): classes["TensorProperties"],
        (old, "MEM_FORMAT_ENCODING"): mem_format,
        (dcp, "_MEM_FORMAT_ENCODING"): mem_format,
        (mcore, "MCoreMetadata"): classes["MCoreMetadata"],
        (mcore, "MCoreSavePlan"): classes["MCoreSavePlan"],
        ("torch.serialization", "_get_layout"): InertCall(_layout),
        ("collections", "OrderedDict"): InertCall(_ordered_dict),
        ("torch", "Size"): _SizeReader(),
    }
    table |= {("torch", name): TorchDtype(name) for name in TORCH_DTYPES}
    table |= {("torch", name): TorchName(name) for name in _LAYOUTS | _MEMORY_FORMATS}
    for module in ("pathlib", "pathlib._local"):
        table |= {(module, n): path for n in ("PosixPath", "PurePosixPath", "Path")}
        table |= {(module, n): windows_path for n in ("WindowsPath", "PureWindowsPath")}
    return table


# The names alone, for the audited path's check before anything is unpickled.
_ALLOWED = frozenset(_stand_ins())


class _DcpUnpickler(pickle.Unpickler):
    """Resolves globals from the allow-list only; persistent ids are refused by default."""

    def __init__(self, file: io.BytesIO) -> None:
        super().__init__(file)
        self._stand_ins = _stand_ins()

    def find_class(self, module: str, name: str) -> Any:
        try:
            return self._stand_ins[(module, name)]
        except (KeyError, TypeError):
            raise RefusedGlobalError(str(module), str(name)) from None


def load_dcp_metadata(data: bytes) -> StandIn:
    """Unpickle `.metadata` bytes into stand-ins; returns the `Metadata` stand-in.

    The stream is audited first (`pickles.audit`), so nothing is
    unpickled that would take unbounded work. Raises `HostilePickleError` when the pickle names
    callables that run code, `RefusedGlobalError` when it names anything else outside the
    allow-list, `PickleBombError` when unpickling it would take unbounded work, and
    `MetadataFormatError` when the bytes are truncated, corrupt, or not DCP metadata.
    """
    try:
        audit = audit_pickle(data)
    except PickleFormatError as exc:
        raise MetadataFormatError(str(exc)) from None
    hostile = hostile_globals(audit.globals)
    if hostile:
        raise HostileGlobalError(hostile)
    for name in audit.globals:
        module, _, attr = name.rpartition(".")
        if (module, attr) not in _ALLOWED:
            raise RefusedGlobalError(module, attr)
    return _unpickle(data)


def read_dcp_metadata(
    data: bytes,
    convert: Callable[[StandIn], T],
    *,
    classes: Iterable[type] = (),
    limits: SandboxLimits = DEFAULT_SANDBOX,
) -> T:
    """`convert(load_dcp_metadata(data))`, fast on large files.

    From `limits.min_size` bytes on (where the sandbox exists), the restricted unpickler
    and `convert` run without the audit in a child process the OS bounds (CPU time and
    memory in proportion to the input, `pickles.sandbox`): at C speed, and a
    bomb only kills the child. `convert` must turn the stand-ins into plain data (containers,
    scalars, `Dims` and the `classes` named), which is what comes back. When the child
    gives no result (a refused global, a malformed stream, a limit), the stream takes the
    audited path here, which raises what `load_dcp_metadata` raises and says precisely
    what was refused. Smaller files take the audited path directly."""
    if len(data) >= limits.min_size:
        try:
            return run_bounded(
                lambda: convert(_unpickle(data)),
                size=len(data),
                classes=(Dims, *classes),
                limits=limits,
            )
        except (SandboxUnavailable, SandboxFailed):
            pass
    return convert(load_dcp_metadata(data))


def _unpickle(data: bytes) -> StandIn:
    """The restricted unpickler alone: allow-listed globals, stand-ins, no audit."""
    try:
        value = _DcpUnpickler(io.BytesIO(data)).load()
    # A stand-in refusing a change (HostilePickleError) is hostile whoever noticed it first.
    except (RefusedGlobalError, MetadataFormatError, PickleBombError, HostilePickleError):
        raise
    # Untrusted bytes can make the unpickler raise almost anything (EOFError, KeyError on a
    # bad memo index, TypeError from a stand-in called wrongly, MemoryError...): all of them
    # mean "not readable", never a crash of the scan.
    except Exception as exc:
        raise MetadataFormatError(
            f"is not a readable pickle ({type(exc).__name__}: {short_repr(str(exc))})"
        ) from None
    if not isinstance(value, StandIn) or value.kind not in ("Metadata", "MCoreMetadata"):
        kind = value.kind if isinstance(value, StandIn) else type(value).__name__
        raise MetadataFormatError(f"holds a {kind}, expected a DCP Metadata object")
    return value
