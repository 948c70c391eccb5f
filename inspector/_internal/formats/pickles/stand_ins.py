"""Stand-ins for the globals a pickle names: immutable, and made anew for every read.

A restricted unpickler hands the stream an inert object for each global it names
(`torch.FloatStorage`, `torch._utils._rebuild_tensor_v2`, a DCP metadata class). The stream
can then act on that object: BUILD sets its attributes (through its `__setstate__`, or with
`setattr` for a `(state, slotstate)` pair, or into its `__dict__`; a frozen dataclass is no
defence: the `__setstate__` dataclasses give it sets fields with `object.__setattr__`), and
SETITEM(S), APPEND(S) and ADDITEMS call its item and list methods. A stand-in kept in a
module-level table would carry what one file did to it into every later read of the
process: a `data.pkl` that set `torch.FloatStorage`'s dtype to bfloat16 made every later
`.bin` read with it (issue 31, item 3).

So every stand-in
- is made by the unpickler that reads one stream (`per_read` tables, built in its
  `__init__`): nothing a read receives from a global outlives the read;
- refuses every change: an `Inert` object has fixed slots, refuses `setattr`, `delattr` and
  BUILD (`__setstate__`), and has no item or list methods; a callable is an `InertCall`
  (a function object would take attributes, `__defaults__` included); a class a stream may
  instantiate is made with `SealedClass`, which refuses changes to the class itself.

The audit refuses such a stream before any of this runs (`pickles.audit`: a mutation of a
global is `pickle-hostile`); these objects make the same promise hold where no audit runs
(the bounded child of `pickles.sandbox`) and against an opcode sequence the audit does not model.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NoReturn

from inspector._internal.formats.pickles.audit import GlobalMutationError

__all__ = ["Inert", "InertCall", "SealedClass", "refuse_state"]


def _refuse(what: str, how: str) -> NoReturn:
    raise GlobalMutationError(what, action=how)


class Inert:
    """An immutable stand-in: its slots are filled once (`_fill`), then nothing changes them.

    Equality, hash and repr follow the slots, as a frozen dataclass's would."""

    __slots__ = ()

    def _fill(self, **values: Any) -> None:
        for name, value in values.items():
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
        self._fill(fn=fn)

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
