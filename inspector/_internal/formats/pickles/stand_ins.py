"""Stand-ins for the globals a pickle names: immutable, and made anew for every read.

A stream can act on what it receives for a global (BUILD, SETITEM, APPEND...), so a stand-in
kept in a module table would carry one file's changes into every later read (issue 31, item
3). Each is made per read (`per_read` tables) and refuses every change: `Inert` (fixed
slots, no BUILD, no item methods), `InertCall` (a function would take attributes), classes
made with `SealedClass`. This holds where the audit does not run (the `pickles.sandbox`
child). Why a frozen dataclass is no defence: SECURITY.md, "No file changes how another is
read". `pickles.allowed` says which global gets which; a bad build is a `PickleFormatError`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import PurePosixPath, PureWindowsPath
from typing import Any, NoReturn, cast

from inspector._internal.common.dtypes import TORCH_DTYPES
from inspector._internal.formats.pickles.audit import DEFAULT_LIMITS
from inspector._internal.formats.pickles.errors import (
    GlobalMutationError,
    PickleBombError,
    PickleFormatError,
)

__all__ = [
    "MAX_DIMS",
    "Dims",
    "Inert",
    "InertCall",
    "SealedClass",
    "SizeReader",
    "StandIn",
    "StorageType",
    "TorchDtype",
    "TorchName",
    "TorchStorage",
    "TorchTensor",
    "refuse_state",
    "stand_in_class",
]


def _refuse(what: str, how: str) -> NoReturn:
    raise GlobalMutationError(what, action=how)


class Inert:
    """An immutable stand-in: its slots are filled once, by keyword, when it is made; then
    nothing changes them. Equality, hash and repr follow the slots, as a frozen dataclass's
    would."""

    __slots__ = ()

    def __init__(self, **values: Any) -> None:
        for name, value in values.items():  # a name that is not a slot: AttributeError
            object.__setattr__(self, name, value)

    def _fields(self) -> tuple[Any, ...]:
        return tuple(getattr(self, name) for name in _slots(type(self)))

    def __setattr__(self, name: str, value: Any) -> None:
        _refuse(type(self).__name__, f"sets its attribute {name!r:.60}")

    def __delattr__(self, name: str) -> None:
        _refuse(type(self).__name__, f"deletes its attribute {name!r:.60}")

    def __setstate__(self, state: Any) -> None:
        _refuse(type(self).__name__, "gives it state (BUILD)")

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other._fields() == self._fields()

    def __hash__(self) -> int:
        return hash((type(self), self._fields()))

    def __repr__(self) -> str:
        shown = ", ".join(f"{n}={getattr(self, n)!r}" for n in _slots(type(self)))
        return f"{type(self).__name__}({shown})"


def _slots(cls: type) -> tuple[str, ...]:
    return tuple(
        name for klass in reversed(cls.__mro__) for name in klass.__dict__.get("__slots__", ())
    )


class InertCall(Inert):
    """A function a pickle may call (REDUCE, OBJ, INST): calls it, and is nothing else."""

    __slots__ = ("fn",)
    fn: Callable[..., Any]

    def __init__(self, fn: Callable[..., Any]) -> None:
        super().__init__(fn=fn)

    def __call__(self, *args: Any) -> Any:
        return self.fn(*args)

    def __repr__(self) -> str:
        return f"<stand-in for {getattr(self.fn, '__name__', '?')}>"


class SealedClass(type):
    """The metaclass of stand-in classes a stream instantiates (NEWOBJ, REDUCE): the class
    itself refuses attribute changes (its instances are new objects of one read)."""

    def __setattr__(cls, name: str, value: Any) -> None:
        _refuse(cls.__name__, f"sets its class attribute {name!r:.60}")

    def __delattr__(cls, name: str) -> None:
        _refuse(cls.__name__, f"deletes its class attribute {name!r:.60}")


def refuse_state(self: object, state: object) -> NoReturn:
    """A `__setstate__` for shared objects a reply may name (enum members, classes): BUILD
    on them is refused instead of changing them for the whole process."""
    _refuse(type(self).__name__, "gives it state (BUILD)")


class TorchDtype(Inert):
    """A `torch.<name>` dtype global, by name only (one per read, immutable)."""

    __slots__ = ("name",)
    name: str

    @property
    def safetensors(self) -> str:
        """The safetensors dtype name (BF16, F32...), or `torch.<name>` when there is none."""
        mapped = TORCH_DTYPES[self.name][0]
        return mapped if mapped is not None else f"torch.{self.name}"

    @property
    def itemsize(self) -> int:
        return TORCH_DTYPES[self.name][1]


# -- DCP `.metadata` -------------------------------------------------------------------------


class TorchName(Inert):
    """A `torch.<name>` layout or memory-format global (`torch.strided`), by name only. Not
    a bare string: BUILD with no state leaves a string unchanged without an error, which
    would let the bounded child read a stream the audit refuses."""

    __slots__ = ("name",)
    name: str


class StandIn(metaclass=SealedClass):
    """An inert record standing in for one pickled class: it only keeps the pickled state.

    `kind` is the class it replaces (e.g. "TensorStorageMetadata"); `state` is what the
    pickle's BUILD opcode handed over (a dict, or a tuple for `TensorProperties`). The
    classes are made for each read (`stand_in_class`) and refuse changes to themselves;
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


def stand_in_class(kind: str) -> type[StandIn]:
    """A new record class for the pickled class `kind`: one per read and name, so that
    conversion code can tell them apart by `kind`."""
    made = SealedClass(f"{kind}StandIn", (StandIn,), {"kind": kind, "__slots__": ()})
    return cast(type[StandIn], made)


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


class SizeReader(Inert):
    """`torch.Size(sequence)` -> `Dims`, or a plain tuple when the items are not all
    non-negative ints (the entry holding it is then reported as malformed).

    A large `.metadata` holds millions of sizes but few distinct ones, so results are
    cached per read. A cache hit returns the validated int tuple equal to the input, so an
    input that only compares equal (floats, bools) comes back as clean ints."""

    __slots__ = ("_seen",)
    _seen: dict[tuple[Any, ...], tuple[int, ...]]

    def __init__(self) -> None:
        super().__init__(_seen={})

    def __call__(self, *args: Any) -> tuple[int, ...]:
        if len(args) != 1 or type(args[0]) not in (tuple, list):
            raise PickleFormatError("torch.Size called with something other than one sequence")
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


def ordered_dict(*args: Any) -> dict[Any, Any]:
    """`collections.OrderedDict(...)`: OrderedDict pickles as REDUCE(OrderedDict, ()) then
    SETITEMS; a plain dict keeps the order and takes SETITEMS."""
    return dict(*args) if args and isinstance(args[0], list | tuple) else {}


def layout(name: Any) -> str:
    """`torch.serialization._get_layout("torch.strided")` -> "strided"."""
    if not isinstance(name, str) or name.removeprefix("torch.") not in LAYOUTS:
        raise PickleFormatError(f"unknown tensor layout {name!r}")
    return name.removeprefix("torch.")


def mem_format(value: Any) -> int:
    """`_MEM_FORMAT_ENCODING(0)` -> 0 (contiguous), 1 (channels last), 2 (preserve)."""
    if type(value) is not int:
        raise PickleFormatError(f"memory-format code {value!r} is not an int")
    return value


def write_item_type(value: Any) -> int:
    """`WriteItemType(2)` (an Enum pickled by value: TENSOR 1, SHARD 2, BYTE_IO 3) -> 2."""
    if type(value) is not int:
        raise PickleFormatError(f"write-item type {value!r} is not an int")
    return value


def posix_path(*parts: Any) -> str:
    """`pathlib.PosixPath("/", "ckpt")` (StorageMeta.checkpoint_id) -> its text only."""
    if not all(isinstance(p, str) for p in parts):
        raise PickleFormatError("a pickled path has non-string parts")
    return str(PurePosixPath(*parts))


def windows_path(*parts: Any) -> str:
    if not all(isinstance(p, str) for p in parts):
        raise PickleFormatError("a pickled path has non-string parts")
    return str(PureWindowsPath(*parts))


LAYOUTS = frozenset(
    {"strided", "sparse_coo", "sparse_csr", "sparse_csc", "sparse_bsr", "sparse_bsc", "_mkldnn"}
    | {"jagged"}
)
MEMORY_FORMATS = frozenset(
    {"contiguous_format", "preserve_format", "channels_last", "channels_last_3d"}
)


# -- torch.save's data.pkl -------------------------------------------------------------------

# Dimensions of one tensor (torch allows 64).
MAX_DIMS = 64


class StorageType(Inert):
    """`torch.FloatStorage`, `torch.UntypedStorage`...: the dtype its bytes hold."""

    __slots__ = ("dtype",)
    dtype: str | None  # None: UntypedStorage, bytes (the tensor's dtype comes from v3)


class TorchStorage(Inert):
    """A storage a persistent id names: its record's key, dtype and element count."""

    __slots__ = ("dtype", "key", "numel")
    key: str
    dtype: str | None
    numel: int


class TorchTensor(Inert):
    """What `torch._utils._rebuild_tensor_v2` would build, as a record: storage, offset,
    shape and stride in elements, dtype."""

    __slots__ = ("dtype", "offset", "requires_grad", "shape", "storage", "stride")
    storage: TorchStorage
    offset: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: str
    requires_grad: bool

    def with_grad(self, requires_grad: bool) -> TorchTensor:
        fields = {n: getattr(self, n) for n in self.__slots__}
        return TorchTensor(**(fields | {"requires_grad": requires_grad}))


class StateDict(dict[Any, Any]):
    """`collections.OrderedDict` in a data.pkl: a dict that also takes BUILD's `_metadata`
    (a new object of one read)."""


def state_dict(*args: Any) -> StateDict:
    return StateDict(*args) if args and isinstance(args[0], list | tuple) else StateDict()


def _ints(value: Any, what: str) -> tuple[int, ...]:
    if not isinstance(value, tuple | list) or len(value) > MAX_DIMS:
        raise PickleFormatError(f"has a tensor {what} that is not a short tuple of ints")
    if not all(type(v) is int and v >= 0 for v in value):
        raise PickleFormatError(f"has a tensor {what} with a negative or non-int item")
    return tuple(value)


def _rebuild(
    storage: Any, offset: Any, size: Any, stride: Any, dtype: str | None, requires_grad: Any
) -> TorchTensor:
    if not isinstance(storage, TorchStorage):
        raise PickleFormatError("rebuilds a tensor from something that is not a storage")
    if type(offset) is not int or offset < 0:
        raise PickleFormatError("has a tensor with a negative or non-int storage offset")
    shape, strides = _ints(size, "size"), _ints(stride, "stride")
    if len(shape) != len(strides):
        raise PickleFormatError("has a tensor whose size and stride differ in length")
    dtype = dtype if dtype is not None else storage.dtype
    if dtype is None:
        raise PickleFormatError("has a tensor on an untyped storage with no dtype")
    return TorchTensor(
        storage=storage,
        offset=offset,
        shape=shape,
        stride=strides,
        dtype=dtype,
        requires_grad=requires_grad is True,
    )


def rebuild_tensor_v2(
    storage: Any, offset: Any, size: Any, stride: Any, requires_grad: Any, *_: Any
) -> TorchTensor:
    return _rebuild(storage, offset, size, stride, None, requires_grad)


def rebuild_tensor_v3(
    storage: Any,
    offset: Any,
    size: Any,
    stride: Any,
    requires_grad: Any,
    hooks: Any,
    dtype: Any,
    *_: Any,
) -> TorchTensor:
    if not isinstance(dtype, TorchDtype):
        raise PickleFormatError("rebuilds a tensor with a dtype that is not a torch dtype")
    return _rebuild(storage, offset, size, stride, dtype.name, requires_grad)


def rebuild_parameter(data: Any, requires_grad: Any, *_: Any) -> TorchTensor:
    if not isinstance(data, TorchTensor):
        raise PickleFormatError("makes a parameter of something that is not a tensor")
    return data.with_grad(requires_grad is True)
