"""Pre-flight audit of an untrusted pickle: refuse it before anything unpickles it.

Refusing globals is not enough: a 100-byte stream can make the unpickler hash, walk or nest
without bound, and a stream can change a global's stand-in for every later read. One linear
pass simulates the unpickler's stack and refuses bombs (`PickleBombError`) and mutations of a
global or `EXT` codes (`GlobalMutationError`; data pickles never do either); it lists every
global named ("module.name", or "module:Class.attr") for `hostile_globals`. The limits, the
shapes refused and why: SECURITY.md, "1. Nothing in a checkpoint runs code" and "2. Bounded
work and memory".
"""

from __future__ import annotations

import _compat_pickle
import pickletools
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from inspector._internal.formats.pickles.errors import (
    GlobalMutationError,
    HostilePickleError,
    PickleBombError,
    PickleFormatError,
)

__all__ = [
    "DEFAULT_LIMITS",
    "PickleAudit",
    "PickleLimits",
    "audit_pickle",
    "check_pickle",
    "hostile_globals",
]


@dataclass(frozen=True, slots=True)
class PickleLimits:
    """How much work one pickle may ask for.

    `max_objects` is `objects_floor + objects_per_byte * len(data)`: proportional to the
    file, so a real `.metadata` of millions of entries passes while a 100-byte bomb cannot
    expand to a million objects. Real files stay well below one object per byte (DCP
    `.metadata`: about 0.3; each object is at least one opcode of one byte, and shared
    references mostly point at small objects such as field names and dtypes)."""

    max_depth: int = 100
    objects_floor: int = 1_000_000
    objects_per_byte: int = 2
    max_int_bytes: int = 128

    def max_objects(self, size: int) -> int:
        return self.objects_floor + self.objects_per_byte * size


DEFAULT_LIMITS = PickleLimits()


@dataclass(frozen=True, slots=True)
class PickleAudit:
    """What one audited pickle stream asks for."""

    globals: tuple[str, ...]  # distinct "module.name", in first-use order
    objects: int  # objects the result expands to, shared references followed
    depth: int  # deepest nesting of any value
    shared_refs: int  # memo GETs and DUPs: references handed out more than once
    end: int  # offset just past STOP


# -- the audit ----------------------------------------------------------------------------

# Argument length per opcode byte, from the standard library's opcode table:
# >= 0 fixed bytes, -1 up to a newline, -2/-3/-4/-5 a 1/4/4/8-byte little-endian length
# followed by that many bytes, -6 two newline-terminated lines (GLOBAL, INST).
_ARG: dict[int, int] = {}
for _op in pickletools.opcodes:
    _n = _op.arg.n if _op.arg is not None else 0
    _ARG[ord(_op.code)] = -6 if _op.name in ("GLOBAL", "INST") else _n
_LEN_BYTES = {-2: 1, -3: 4, -4: 4, -5: 8}

# Opcode bytes by name (`_OP.STOP`), and names by byte for messages.
_B = {op.name: ord(op.code) for op in pickletools.opcodes}
_OP: Any = SimpleNamespace(**_B)
_NAMES = {code: name for name, code in _B.items()}


def _ops(names: str) -> frozenset[int]:
    return frozenset(_B[n] for n in names.split())


# Groups of the opcodes `_Audit._rare` handles (the inlined loop takes the frequent ones).
_PUTS = _ops("LONG_BINPUT PUT")
_STRINGS = _ops("BINUNICODE BINUNICODE8 UNICODE SHORT_BINSTRING BINSTRING")
_NAMED = _ops("GLOBAL INST")
_MARK_BUILDS = _ops("TUPLE LIST FROZENSET DICT")
_EXTS = _ops("EXT1 EXT2 EXT4")
_WIDE_INTS = _ops("LONG1 LONG4")
_TEXT_INTS = _ops("INT LONG")


class _Global:
    """A global the stream names (an atom for sizes)."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name


_MARK_OBJ = object()  # a MARK on the stack
_ATOM = object()  # any scalar: one object, depth 0, never mutated


class _Audit:
    """One pass over the stream. Stack items are `_ATOM`, `bytes` (a short string, kept
    for STACK_GLOBAL), `_Global`, `_MARK_OBJ`, or a record `[objects, depth, shared]` for
    every value that holds others (containers, reduced objects); a record is shared by all
    stack and memo slots that refer to the same value."""

    def __init__(self, data: bytes | memoryview, start: int, limits: PickleLimits) -> None:
        self.data = data
        self.pos = start
        self.limits = limits
        self.max_objects = limits.max_objects(len(data) - start)
        self.hash_work = 0
        self.depth = 0
        self.globals: dict[str, None] = {}
        self.arg_len = 0  # length of the last length-prefixed argument
        self.proto = 0  # from the PROTO opcode; streams without one are protocol 0 or 1

    # Sizes and depths of stack items ------------------------------------------------------

    def _new(self, items: list[Any]) -> list[Any]:
        size = 1
        depth = 0
        for item in items:
            if type(item) is list:
                size += item[0]
                if item[1] > depth:
                    depth = item[1]
            elif item is _MARK_OBJ:
                raise PickleFormatError("a MARK is used as a value")
            else:
                size += 1
        return self._checked([size, depth + 1, False])

    def _add(self, target: Any, items: list[Any], opname: str) -> None:
        """`target` gains `items` (APPEND, SETITEM, BUILD...)."""
        if type(target) is not list:
            if target is _MARK_OBJ:
                raise PickleFormatError(f"{opname} has no object to apply to")
            if type(target) is _Global and items:  # an empty batch changes nothing
                self._changes_global(target, opname, self.pos - 1)
            # A scalar: the real unpickler fails on it; nothing to bound.
            return
        if target[2]:
            self._cycle(opname)
        grown = self._new(items)
        target[0] += grown[0] - 1
        if grown[1] > target[1]:
            target[1] = grown[1]
        self._checked(target)

    def _checked(self, record: list[Any]) -> list[Any]:
        if record[1] > self.depth:
            self.depth = record[1]
            if record[1] > self.limits.max_depth:
                raise PickleBombError(
                    f"nests values more than {self.limits.max_depth} levels deep; refused "
                    "before unpickling (deep nesting overflows the recursion of any reader)",
                    kind="depth",
                )
        if record[0] > self.max_objects:
            raise PickleBombError(self._too_big("expands to"), kind="size")
        return record

    def _hashed(self, items: list[Any]) -> None:
        """Keys and set items are hashed by the unpickler: their expanded size is work."""
        for item in items:
            self.hash_work += item[0] if type(item) is list else 1
        if self.hash_work > self.max_objects:
            raise PickleBombError(self._too_big("makes the unpickler hash"), kind="size")

    def _too_big(self, what: str) -> str:
        return (
            f"{what} more than {self.max_objects:,} objects through shared references "
            f"(a pickle bomb: {len(self.data):,} bytes); refused before unpickling"
        )

    # The stream ---------------------------------------------------------------------------

    def _arg(self, code: int) -> bytes | int | None:
        kind = _ARG.get(code)
        data, pos = self.data, self.pos
        if kind is None:
            raise PickleFormatError(f"unknown opcode 0x{code:02x} at byte {pos - 1}")
        if kind == 0:
            return None
        if kind > 0:
            end = pos + kind
            if end > len(data):
                raise PickleFormatError("the stream ends inside an opcode argument")
            self.pos = end
            return int.from_bytes(data[pos:end], "little")
        if kind in (-1, -6):
            lines = 2 if kind == -6 else 1
            end = pos
            for _ in range(lines):
                nl = bytes(data[end : end + 65536]).find(b"\n")
                if nl < 0:
                    raise PickleFormatError("a text argument has no newline (over 64 kB?)")
                end += nl + 1
            self.pos = end
            return bytes(data[pos:end])
        width = _LEN_BYTES[kind]
        if pos + width > len(data):
            raise PickleFormatError("the stream ends inside an opcode argument")
        length = int.from_bytes(data[pos : pos + width], "little")
        end = pos + width + length
        if end > len(data):
            raise PickleFormatError(f"an argument of {length:,} bytes runs past the end")
        self.pos = end
        self.arg_len = length
        return bytes(data[pos + width : end]) if length <= 256 else b""

    def _arg_int(self, code: int) -> int:
        """The argument of an opcode that takes a number: fixed-width binary, or a text line
        (GET, PUT)."""
        value = self._arg(code)
        return value if isinstance(value, int) else _int_text(value)

    def _arg_bytes(self, code: int) -> bytes:
        """The argument of an opcode that takes text or bytes (`_ARG` says which do)."""
        value = self._arg(code)
        if not isinstance(value, bytes):
            raise PickleFormatError(f"opcode 0x{code:02x} at byte {self.pos} takes no bytes")
        return value

    def _pop_mark(self, stack: list[Any], marks: list[int]) -> list[Any]:
        if not marks:
            raise PickleFormatError("an opcode needs a MARK and there is none")
        at = marks.pop()
        items = stack[at:]
        del stack[at - 1 :]
        return items

    def _global(self, module: str, name: str) -> _Global:
        if self.proto < 3:
            # Protocols 0-2 name Python 2 modules; unpicklers (torch's too) map them to
            # Python 3 ones (`commands.Popen` -> `subprocess.Popen`): list what is resolved.
            module, name = _compat_pickle.NAME_MAPPING.get((module, name), (module, name))
            module = _compat_pickle.IMPORT_MAPPING.get(module, module)
        # A dotted name walks attributes (`Path.write_text`): shown as "module:qualname".
        full = f"{module}:{name}" if "." in name else f"{module}.{name}"
        self.globals.setdefault(full, None)
        return _Global(full)

    def run(self) -> PickleAudit:
        try:
            return self._run()
        except (IndexError, KeyError, TypeError) as exc:
            # Stack underflow, a memo key never stored, an argument cut short: the stream is
            # malformed, and the real unpickler would fail on it too.
            raise PickleFormatError(
                f"is not a well-formed pickle (truncated or corrupt: {type(exc).__name__})"
            ) from None

    def _run(self) -> PickleAudit:
        # One flat loop over a table of opcode kinds, the most frequent first and inlined:
        # it runs over every opcode of a `.metadata` of tens of millions.
        data = self.data
        pos = self.pos
        stack: list[Any] = []
        push, pop = stack.append, stack.pop
        marks: list[int] = []  # stack lengths just after each MARK
        # Slots by index, kept as the unpickler keeps them: a PUT stores at the index it
        # names, MEMOIZE at the number of slots stored so far (not one past the highest
        # index: after `PUT 1000` the next MEMOIZE stores at 1). A model that differs lets
        # a stream show the audit one value at an index and the unpickler another.
        memo: dict[int, Any] = {}
        shared = hash_work = 0
        max_objects, max_depth = self.max_objects, self.limits.max_depth
        max_int = self.limits.max_int_bytes
        atom, mark_obj, from_bytes = _ATOM, _MARK_OBJ, int.from_bytes
        kinds, skip = _KIND, _ATOM_ARG
        build, tuple1, setitems = _B["BUILD"], _B["TUPLE1"], _B["SETITEMS"]
        empty_tuple, binget = _B["EMPTY_TUPLE"], _B["BINGET"]
        while True:
            code = data[pos]
            pos += 1
            kind = kinds[code]
            if kind == _K_MEMOIZE:
                memo[len(memo)] = stack[-1]
            elif kind == _K_GET:
                if code == binget:
                    item = memo[data[pos]]
                    pos += 1
                else:
                    item = memo[from_bytes(data[pos : pos + 4], "little")]
                    pos += 4
                if type(item) is list:
                    item[2] = True
                shared += 1
                push(item)
            elif kind == _K_ATOM:
                pos += skip[code]
                push(atom)
            elif kind == _K_MARK:
                push(mark_obj)
                marks.append(len(stack))
            elif kind == _K_EMPTY:
                # An empty tuple holds nothing and never changes: a scalar for the bounds.
                push(atom if code == empty_tuple else [1, 1, False])
            elif kind == _K_CALL:
                args = pop()
                func = pop()
                if type(args) is list:
                    size, depth = args[0] + 2, args[1] + 1
                    hash_work += args[0]
                else:
                    size, depth = 3, 1
                    hash_work += 1
                if type(func) is list:
                    size += func[0] - 1
                    if func[1] >= depth:
                        depth = func[1] + 1
                if depth > max_depth or size > max_objects or hash_work > max_objects:
                    self._refuse(size, depth, hash_work)
                push([size, depth, False])
            elif kind == _K_ADD_ONE:
                value = pop()
                target = stack[-1]
                if type(target) is list:
                    if target[2]:
                        self._cycle("BUILD" if code == build else "APPEND")
                    if type(value) is list:
                        target[0] += value[0]
                        if value[1] >= target[1]:
                            target[1] = value[1] + 1
                    else:
                        target[0] += 1
                    if target[1] > max_depth or target[0] > max_objects:
                        self._refuse(target[0], target[1], hash_work)
                elif target is mark_obj:
                    raise IndexError
                elif type(target) is _Global:
                    self._changes_global(target, "BUILD" if code == build else "APPEND", pos - 1)
            elif kind == _K_ADD_MARKED:
                at = marks.pop()
                items = stack[at:]
                del stack[at - 1 :]
                target = stack[-1]
                if code == setitems:
                    if len(items) % 2:
                        raise IndexError
                    for key in items[::2]:
                        hash_work += key[0] if type(key) is list else 1
                if type(target) is list:
                    if target[2]:
                        self._cycle("SETITEMS" if code == setitems else "APPENDS")
                    size, depth = target[0], target[1]
                    for item in items:
                        if type(item) is list:
                            size += item[0]
                            if item[1] >= depth:
                                depth = item[1] + 1
                        else:
                            size += 1
                    target[0], target[1] = size, depth
                    if depth > max_depth or size > max_objects or hash_work > max_objects:
                        self._refuse(size, depth, hash_work)
                elif target is mark_obj:
                    raise IndexError
                elif type(target) is _Global and items:
                    # (An empty batch changes nothing: the unpickler returns before it
                    # looks at the target.)
                    opname = "SETITEMS" if code == setitems else "APPENDS"
                    self._changes_global(target, opname, pos - 1)
            elif kind == _K_TUPLE:
                item = pop()
                if code == tuple1:
                    if type(item) is list:
                        size, depth = item[0] + 1, item[1] + 1
                    elif item is mark_obj:
                        raise IndexError
                    else:
                        size, depth = 2, 1
                else:
                    other = pop()
                    if item is mark_obj or other is mark_obj:
                        raise IndexError
                    size, depth = 1, 1
                    if type(item) is list:
                        size, depth = size + item[0], item[1] + 1
                    else:
                        size += 1
                    if type(other) is list:
                        size += other[0]
                        if other[1] >= depth:
                            depth = other[1] + 1
                    else:
                        size += 1
                if depth > max_depth or size > max_objects:
                    self._refuse(size, depth, hash_work)
                push([size, depth, False])
            elif kind == _K_SHORT_STR:
                end = pos + 1 + data[pos]
                push(data[pos + 1 : end] or atom)
                pos = end
            elif kind == _K_BINPUT:
                _memo_put(memo, data[pos], stack[-1])
                pos += 1
            elif kind == _K_FRAME:
                pos += 8
            else:
                # Everything else: rarer opcodes, through the general helpers.
                self.pos, self.hash_work = pos, hash_work
                if code == _OP.STOP:
                    if len(stack) != 1 or marks:
                        raise PickleFormatError("STOP with an unbalanced stack")
                    root = stack[0]
                    return PickleAudit(
                        globals=tuple(self.globals),
                        objects=root[0] if type(root) is list else 1,
                        depth=root[1] if type(root) is list else 0,
                        shared_refs=shared,
                        end=pos,
                    )
                shared += self._rare(code, stack, marks, memo, max_int)
                pos, hash_work = self.pos, self.hash_work

    def _rare(
        self, code: int, stack: list[Any], marks: list[int], memo: dict[int, Any], max_int: int
    ) -> int:
        """The opcodes the inlined loop does not handle; returns references handed out."""
        op, new = _OP, self._new
        if code in _PUTS:
            _memo_put(memo, self._arg_int(code), stack[-1])
        elif code in _STRINGS:
            value = self._arg_bytes(code)
            if code == op.UNICODE:
                # raw-unicode-escape text, decoded as the unpickler decodes it: `\u006fs`
                # is the module `os` to STACK_GLOBAL, not a name no one knows.
                value = _raw_unicode(value[:-1])
            stack.append(value or _ATOM)
        elif code == op.GET or code == op.DUP:
            item = memo[self._arg_int(code)] if code == op.GET else stack[-1]
            if item is _MARK_OBJ and code == op.DUP:
                raise IndexError
            if type(item) is list:
                item[2] = True
            stack.append(item)
            return 1
        elif code == op.TUPLE3:
            if len(stack) < 3 or (marks and len(stack) - 3 < marks[-1]):
                raise IndexError
            items = stack[-3:]
            del stack[-3:]
            stack.append(new(items))
        elif code == op.ADDITEMS:
            items = self._pop_mark(stack, marks)
            self._hashed(items)
            self._add(stack[-1], items, "ADDITEMS")
        elif code == op.SETITEM:
            value = stack.pop()
            key_item = stack.pop()
            self._hashed([key_item])
            self._add(stack[-1], [key_item, value], "SETITEM")
        elif code == op.STACK_GLOBAL:
            name = stack.pop()
            module = stack.pop()
            stack.append(self._global(_text(module), _text(name)))
        elif code in _NAMED:
            module, name, _ = self._arg_bytes(code).split(b"\n")
            g = self._global(_decode(module), _decode(name))
            stack.append(g if code == op.GLOBAL else new([g, *self._pop_mark(stack, marks)]))
        elif code == op.OBJ:
            items = self._pop_mark(stack, marks)
            if not items:
                raise IndexError
            self._hashed(items[1:])
            stack.append(new(items))
        elif code == op.NEWOBJ_EX:
            items = stack[-3:]
            if len(items) < 3:
                raise IndexError
            del stack[-3:]
            self._hashed(items[1:])
            stack.append(new(items))
        elif code in _MARK_BUILDS:
            items = self._pop_mark(stack, marks)
            if code == op.DICT:
                if len(items) % 2:
                    raise IndexError
                self._hashed(items[::2])
            elif code == op.FROZENSET:
                self._hashed(items)
            stack.append(new(items))
        elif code == op.POP:
            if stack.pop() is _MARK_OBJ:
                marks.pop()
        elif code == op.POP_MARK:
            self._pop_mark(stack, marks)
        elif code == op.BINPERSID:
            stack.append(new([stack.pop()]))
        elif code == op.PERSID:
            self._arg(code)
            stack.append(new([]))
        elif code in _EXTS:
            # Resolved through this process's copyreg registry, and what it resolves to is
            # cached there for every later unpickling: no read may depend on or leave that
            # state. No checkpoint writer registers extension codes.
            at = self.pos - 1
            name = f"copyreg extension {self._arg_int(code)}"
            raise HostilePickleError(
                (name,),
                message=(
                    f"{_NAMES[code]} at byte {at} names {name}, which this process's "
                    "copyreg registry resolves and then caches for every later read; no "
                    "checkpoint writer uses extension codes: a hostile file, refused before "
                    "unpickling (nothing ran)"
                ),
            )
        elif code == op.READONLY_BUFFER:
            _ = stack[-1]  # needs a value to mark read-only
        else:
            scalar = self._arg(code)
            if code == op.PROTO and isinstance(scalar, int):
                self.proto = scalar
            if code in _WIDE_INTS and self.arg_len > max_int:
                raise PickleBombError(_wide_int(max_int), kind="int")
            if code in _TEXT_INTS and isinstance(scalar, bytes) and len(scalar) > 2.5 * max_int:
                raise PickleBombError(_wide_int(max_int), kind="int")
            # Scalars (ints, floats, bytes, buffers) push one atom; PROTO nothing.
            if code != op.PROTO:
                stack.append(_ATOM)
        return 0

    def _refuse(self, size: int, depth: int, hash_work: int) -> None:
        self.hash_work = hash_work
        self._checked([size, depth, False])
        self._hashed([])

    def _changes_global(self, target: _Global, opname: str, at: int) -> None:
        raise GlobalMutationError(target.name, action=f"{opname} at byte {at}")

    def _cycle(self, opname: str) -> None:
        raise PickleBombError(
            f"changes an object after sharing a reference to it ({opname}): a reference "
            "cycle or a hand-made stream, which no checkpoint writer produces",
            kind="cycle",
        )


# Opcode kinds of the inlined loop; every other opcode goes through `_Audit._rare`.
(
    _K_RARE,
    _K_MEMOIZE,
    _K_GET,
    _K_ATOM,
    _K_MARK,
    _K_EMPTY,
    _K_CALL,
    _K_ADD_ONE,
    _K_ADD_MARKED,
    _K_TUPLE,
    _K_SHORT_STR,
    _K_BINPUT,
    _K_FRAME,
) = range(13)
_KIND = [_K_RARE] * 256
_ATOM_ARG = [0] * 256  # argument bytes of the fixed-size scalar opcodes
for _names, _kind in (
    ("MEMOIZE", _K_MEMOIZE),
    ("BINGET LONG_BINGET", _K_GET),
    ("MARK", _K_MARK),
    ("EMPTY_TUPLE EMPTY_DICT EMPTY_LIST EMPTY_SET", _K_EMPTY),
    ("NEWOBJ REDUCE", _K_CALL),
    ("BUILD APPEND", _K_ADD_ONE),
    ("SETITEMS APPENDS", _K_ADD_MARKED),
    ("TUPLE1 TUPLE2", _K_TUPLE),
    ("SHORT_BINUNICODE", _K_SHORT_STR),
    ("BINPUT", _K_BINPUT),
    ("FRAME", _K_FRAME),
    ("BININT1 BININT2 BININT BINFLOAT NONE NEWTRUE NEWFALSE NEXT_BUFFER", _K_ATOM),
):
    for _code in _ops(_names):
        _KIND[_code] = _kind
        if _kind == _K_ATOM:
            _ATOM_ARG[_code] = _ARG[_code]


# Real picklers number memo slots 0, 1, 2...; a stream that jumps far ahead would make the
# unpickler allocate (and clear) memory for every slot up to the index.
_MEMO_SLACK = 1024


def _memo_put(memo: dict[int, Any], key: int, value: Any) -> None:
    if key in memo:
        memo[key] = value
        return
    if key > len(memo) + _MEMO_SLACK:
        raise PickleBombError(
            f"stores a memo entry at index {key:,} after only {len(memo):,} entries (the "
            "unpickler would allocate memory for every slot in between); refused",
            kind="size",
        )
    memo[key] = value


def _wide_int(limit: int) -> str:
    return (
        f"holds an integer wider than {limit} bytes; no checkpoint stores one, and printing "
        "it fails: refused before unpickling"
    )


def _int_text(value: Any) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise PickleFormatError(f"memo key {value!r:.40} is not a number") from None
    if number < 0:
        # The unpickler refuses a negative PUT and finds no negative GET; a list index here
        # would wrap around to another slot.
        raise PickleFormatError(f"memo key {number} is negative")
    return number


def _raw_unicode(raw: bytes) -> bytes:
    try:
        return raw.decode("raw-unicode-escape").encode("utf-8", "surrogatepass")
    except UnicodeError:
        raise PickleFormatError("a UNICODE argument is not raw-unicode-escape text") from None


def _decode(raw: bytes) -> str:
    return raw.decode("utf-8", "replace")


def _text(item: Any) -> str:
    """A STACK_GLOBAL operand: a short string we kept, else something we cannot name."""
    return _decode(item) if type(item) is bytes else "<not a short string>"


def audit_pickle(
    data: bytes | memoryview, *, start: int = 0, limits: PickleLimits = DEFAULT_LIMITS
) -> PickleAudit:
    """Audit one pickle stream starting at `start`; raises `PickleBombError` (unbounded work)
    or `PickleFormatError` (malformed). Linear in the stream's length."""
    return _Audit(data, start, limits).run()


# -- hostile names --------------------------------------------------------------------------


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


# Modules whose callables run code, load more pickles, or reach files, processes and the
# network. A checkpoint's data never needs any of them.
_HOSTILE_MODULES = _words(
    """os posix nt subprocess _posixsubprocess sys shutil socket importlib imp runpy pickle
    _pickle cPickle pickletools dill cloudpickle marshal ctypes _ctypes code codeop pty
    commands webbrowser urllib urllib2 http httplib ftplib smtplib telnetlib requests asyncio
    multiprocessing signal tempfile pdb bdb timeit trace profile cProfile pydoc zipimport
    pkgutil site sysconfig io _io operator _operator functools types inspect gc threading
    _thread builtins __builtin__ __builtins__ glob fileinput linecache shelve dbm sqlite3
    yaml jinja2 mako"""
)
# builtins that are harmless data constructors (torch's weights-only loader allows some).
_INERT_BUILTINS = _words(
    "set frozenset bytearray complex int float str bytes bool tuple list dict slice range object"
)
# Code-running entry points of modules that are otherwise data (torch, numpy, pandas).
_HOSTILE_PREFIXES = tuple(
    _words(
        """torch.load torch.save torch.hub. torch.jit. torch.package. torch.ops. torch.classes.
        torch._C. torch._ops. torch.compile torch._dynamo. torch.fx. torch.utils.cpp_extension.
        torch.distributed.rpc. torch.serialization.load torch.storage._load_from_bytes
        numpy.load numpy.save numpy.fromfile numpy.loadtxt numpy.genfromtxt numpy.memmap
        numpy.lib.npyio. numpy.ctypeslib. numpy.testing. numpy.f2py. numpy.distutils.
        pandas.read_ pandas.io."""
    )
)
# Function names that run code or touch the system whatever module they come from.
_HOSTILE_NAMES = _words(
    """system popen Popen eval exec execfile compile __import__ getattr setattr delattr
    __getattribute__ __getattr__ __reduce__ __reduce_ex__ __subclasses__ __globals__
    __builtins__ load loads open remove unlink rmtree rmdir rename kill fork spawn
    check_call check_output call run_path run_module write_text write_bytes touch mkdir
    symlink_to hardlink_to chmod replace"""
)


def hostile_globals(names: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """The names that can run code or reach the system (`subprocess.Popen`, `builtins.eval`,
    `os.system`, `operator.attrgetter`, `torch.load`...), in input order.

    A name we merely do not know (a training script's config class, a nested class
    `module:Outer.Inner`) is not hostile: the readers turn it into an inert record or refuse
    it as unreadable. An attribute path through a dunder or to a method that acts
    (`pathlib:Path.write_text`), and a name that cannot be read, are hostile."""
    return tuple(name for name in names if _is_hostile(name))


def _is_hostile(full: str) -> bool:
    if full.startswith("<"):
        return "not a short string" in full
    if ":" in full:
        # An attribute path: a nested class ("module:Outer.Inner") is data; a dunder step
        # (`__globals__`, `__init__`) or a method that acts is a gadget.
        module, _, path = full.partition(":")
        steps = path.split(".")
        return (
            module.split(".", 1)[0] in _HOSTILE_MODULES
            or any(step.startswith("__") for step in steps)
            or any(step in _HOSTILE_NAMES for step in steps[1:])
        )
    module, _, name = full.rpartition(".")
    top = module.split(".", 1)[0]
    if top in ("builtins", "__builtin__") and name in _INERT_BUILTINS and "." not in module[8:]:
        return False
    if top in _HOSTILE_MODULES:
        return True
    last = name.rsplit(".", 1)[-1]
    if last in _HOSTILE_NAMES or last.startswith(("exec", "spawn", "popen")):
        return True
    return full.startswith(_HOSTILE_PREFIXES)


def check_pickle(
    data: bytes | memoryview, *, start: int = 0, limits: PickleLimits = DEFAULT_LIMITS
) -> PickleAudit:
    """`audit_pickle`, then refuse (`HostilePickleError`) a stream naming hostile globals."""
    audit = audit_pickle(data, start=start, limits=limits)
    hostile = hostile_globals(audit.globals)
    if hostile:
        raise HostilePickleError(hostile)
    return audit
