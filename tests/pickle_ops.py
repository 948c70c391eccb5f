"""Pickle opcodes written by hand, for streams no pickler writes: a stream that changes a
global it names, aliases one through the memo, or uses opcodes no checkpoint writer emits.
Built from the standard library's opcode table (`pickletools.opcodes`) and `struct`; nothing
here unpickles anything.

`splice` puts such opcodes into a real pickle (a `data.pkl` `torch.save` wrote, a `.metadata`
torch's DCP writer wrote) right after its PROTO opcode, before any FRAME: they run first,
leave the stack as they found it, and the writer's stream follows unchanged."""

from __future__ import annotations

import io
import pickletools
import struct
import zipfile
from pathlib import Path

OP: dict[str, bytes] = {op.name: op.code.encode("latin-1") for op in pickletools.opcodes}


def op(name: str, arg: bytes = b"") -> bytes:
    return OP[name] + arg


def text(value: str) -> bytes:
    raw = value.encode()
    return OP["BINUNICODE"] + struct.pack("<I", len(raw)) + raw


def short_text(value: str) -> bytes:
    raw = value.encode()
    return OP["SHORT_BINUNICODE"] + bytes([len(raw)]) + raw


def integer(value: int) -> bytes:
    return OP["BININT"] + struct.pack("<i", value)


def global_(module: str, name: str) -> bytes:
    return OP["GLOBAL"] + f"{module}\n{name}\n".encode()


def stack_global(module: str, name: str) -> bytes:
    return short_text(module) + short_text(name) + OP["STACK_GLOBAL"]


def str_dict(items: dict[str, bytes]) -> bytes:
    """`{key: value}` with each value already as opcodes."""
    body = b"".join(text(k) + v for k, v in items.items())
    return OP["EMPTY_DICT"] + OP["MARK"] + body + OP["SETITEMS"]


def slot_state(items: dict[str, bytes]) -> bytes:
    """BUILD's `(None, {slot: value})`: the unpickler `setattr`s each slot."""
    return OP["NONE"] + str_dict(items) + OP["TUPLE2"]


def one_list(item: bytes) -> bytes:
    return OP["EMPTY_LIST"] + item + OP["APPEND"]


def binput(index: int) -> bytes:
    return OP["LONG_BINPUT"] + struct.pack("<I", index)


def binget(index: int) -> bytes:
    return OP["LONG_BINGET"] + struct.pack("<I", index)


def frame(body: bytes) -> bytes:
    return OP["FRAME"] + struct.pack("<Q", len(body)) + body


def splice(stream: bytes, ops: bytes) -> bytes:
    """`ops` run right after the PROTO opcode of `stream` (a pickle of protocol 2 or more)."""
    if stream[:1] != OP["PROTO"]:
        raise ValueError("expected a stream that starts with PROTO")
    return stream[:2] + ops + stream[2:]


def rewrite_bin(source: Path, target: Path, ops: bytes) -> None:
    """`source`, a file `torch.save` wrote, copied to `target` with `ops` spliced into its
    `data.pkl`."""
    archive = source.read_bytes()
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(with_data_pkl(archive, splice(data_pkl(archive), ops)))


def data_pkl(archive: bytes) -> bytes:
    """The `data.pkl` of a `torch.save` archive."""
    with zipfile.ZipFile(io.BytesIO(archive)) as zin:
        (name,) = [n for n in zin.namelist() if n.endswith("/data.pkl")]
        return zin.read(name)


def with_data_pkl(archive: bytes, stream: bytes) -> bytes:
    """`archive` (a `torch.save` file) rewritten record by record with `stream` as its
    `data.pkl` (the records stay STORED, as torch writes them)."""
    buffer = io.BytesIO()
    with (
        zipfile.ZipFile(io.BytesIO(archive)) as zin,
        zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as zout,
    ):
        for info in zin.infolist():
            data = stream if info.filename.endswith("/data.pkl") else zin.read(info)
            zout.writestr(info.filename, data)
    return buffer.getvalue()


# -- what the tests splice into a real data.pkl -------------------------------------------------
# Each entry: opcodes that leave the stack as they found it, and the code the `.bin` reader
# must give the file ("pickle-hostile", "bin-unreadable", "pickle-bomb"; None: the stream
# does nothing and the file reads as written). Every one targets what a read hands out for
# a global; none may change how another file is read.

_F32 = global_("torch", "FloatStorage")
_DTYPE_BF16 = {"dtype": text("bfloat16")}
_POP = OP["POP"]

BIN_ATTACKS: dict[str, tuple[bytes, str | None]] = {
    # issue 31, item 3: torch.FloatStorage's dtype set through BUILD's slot state
    "build-slots": (_F32 + slot_state(_DTYPE_BF16) + OP["BUILD"] + _POP, "pickle-hostile"),
    "build-dict": (_F32 + str_dict(_DTYPE_BF16) + OP["BUILD"] + _POP, "pickle-hostile"),
    # `X = []`: a dtype no table knows (it ended `check` with an internal error)
    "build-slots-list": (
        _F32 + slot_state({"dtype": OP["EMPTY_LIST"]}) + OP["BUILD"] + _POP,
        "pickle-hostile",
    ),
    # A dtype global's name, through the __setstate__ dataclasses give a frozen class: the
    # float8 tensors of every later file (torch pickles them with `_rebuild_tensor_v3`)
    "build-dtype-setstate": (
        global_("torch", "float8_e4m3fn") + one_list(text("float8_e5m2")) + OP["BUILD"] + _POP,
        "pickle-hostile",
    ),
    "build-none": (_F32 + OP["NONE"] + OP["BUILD"] + _POP, "pickle-hostile"),
    # A function's defaults: a later stream calling it with fewer arguments gets them
    "build-function-defaults": (
        global_("torch._utils", "_rebuild_tensor_v2")
        + slot_state({"__defaults__": OP["NEWTRUE"] + OP["TUPLE1"]})
        + OP["BUILD"]
        + _POP,
        "pickle-hostile",
    ),
    "build-function-dict": (
        global_("collections", "OrderedDict") + str_dict({"x": integer(1)}) + OP["BUILD"] + _POP,
        "pickle-hostile",
    ),
    "stack-global": (
        stack_global("torch", "FloatStorage") + slot_state(_DTYPE_BF16) + OP["BUILD"] + _POP,
        "pickle-hostile",
    ),
    "memo-alias": (
        _F32
        + binput(900)
        + _POP
        + OP["NONE"]
        + _POP
        + binget(900)
        + slot_state(_DTYPE_BF16)
        + OP["BUILD"]
        + _POP,
        "pickle-hostile",
    ),
    "memoize-alias": (
        _F32 + OP["MEMOIZE"] + _POP + binget(0) + slot_state(_DTYPE_BF16) + OP["BUILD"] + _POP,
        "pickle-hostile",
    ),
    "text-memo-alias": (
        _F32 + b"p7\n" + _POP + b"g7\n" + slot_state(_DTYPE_BF16) + OP["BUILD"] + _POP,
        "pickle-hostile",
    ),
    # After a PUT that skips indices, MEMOIZE stores at the number of slots stored (1), not
    # one past the highest index (2): the global is at index 1 for the unpickler
    "sparse-memo-alias": (
        OP["NONE"]
        + binput(1)
        + _POP
        + _F32
        + OP["MEMOIZE"]
        + _POP
        + binget(1)
        + slot_state(_DTYPE_BF16)
        + OP["BUILD"]
        + _POP,
        "pickle-hostile",
    ),
    "dup-alias": (
        _F32 + OP["DUP"] + slot_state(_DTYPE_BF16) + OP["BUILD"] + _POP + _POP,
        "pickle-hostile",
    ),
    "setitem": (
        global_("collections", "OrderedDict") + text("k") + integer(1) + OP["SETITEM"] + _POP,
        "pickle-hostile",
    ),
    "setitems": (
        global_("collections", "OrderedDict")
        + OP["MARK"]
        + text("k")
        + integer(1)
        + OP["SETITEMS"]
        + _POP,
        "pickle-hostile",
    ),
    "append": (_F32 + integer(1) + OP["APPEND"] + _POP, "pickle-hostile"),
    "appends": (_F32 + OP["MARK"] + integer(1) + OP["APPENDS"] + _POP, "pickle-hostile"),
    "additems": (_F32 + OP["MARK"] + integer(1) + OP["ADDITEMS"] + _POP, "pickle-hostile"),
    # An empty batch: the unpickler returns before it looks at the target
    "setitems-empty": (_F32 + OP["MARK"] + OP["SETITEMS"] + _POP, None),
    "framed": (
        frame(_F32 + slot_state(_DTYPE_BF16) + OP["BUILD"] + _POP),
        "pickle-hostile",
    ),
    "ext1": (OP["EXT1"] + bytes([1]) + _POP, "pickle-hostile"),
    "ext2": (OP["EXT2"] + struct.pack("<H", 300) + _POP, "pickle-hostile"),
    "ext4": (OP["EXT4"] + struct.pack("<i", 70000) + _POP, "pickle-hostile"),
    # Calls that hand a stand-in to another stand-in, or to the persistent loader
    "reduce-stand-in-on-stand-in": (
        global_("torch._utils", "_rebuild_parameter")
        + _F32
        + OP["NEWFALSE"]
        + OP["TUPLE2"]
        + OP["REDUCE"]
        + _POP,
        "bin-unreadable",
    ),
    "binpersid-global": (_F32 + OP["BINPERSID"] + _POP, "bin-unreadable"),
    "persid-text": (OP["PERSID"] + b"FloatStorage\n" + _POP, "bin-unreadable"),
    "newobj-ex": (
        _F32 + OP["EMPTY_TUPLE"] + OP["EMPTY_DICT"] + OP["NEWOBJ_EX"] + _POP,
        "bin-unreadable",
    ),
    "newobj": (_F32 + OP["EMPTY_TUPLE"] + OP["NEWOBJ"] + _POP, "bin-unreadable"),
    "obj": (OP["MARK"] + _F32 + OP["OBJ"] + _POP, "bin-unreadable"),
    "inst": (OP["MARK"] + b"itorch\nFloatStorage\n" + _POP, "bin-unreadable"),
    "readonly-buffer": (_F32 + OP["READONLY_BUFFER"] + _POP, "bin-unreadable"),
    "next-buffer": (OP["NEXT_BUFFER"] + _POP, "bin-unreadable"),
    "memo-far-ahead": (OP["NONE"] + binput(1 << 31) + _POP, "pickle-bomb"),
    "memo-get-missing": (binget((1 << 32) - 1) + _POP, "bin-unreadable"),
    "memo-get-negative": (b"g-1\n" + _POP, "bin-unreadable"),
    "deep": (OP["EMPTY_TUPLE"] + OP["TUPLE1"] * 200 + _POP, "pickle-bomb"),
}

# The same for a DCP `.metadata` (the restricted unpickler of `pickles.dcp_metadata`, in this
# process or in the bounded child): the code its folder gets ("pickle-hostile", or
# "torch-dist-metadata-unreadable").
_DCP = "torch.distributed.checkpoint.metadata"

METADATA_ATTACKS: dict[str, tuple[bytes, str | None]] = {
    # torch.bfloat16's stand-in renamed: every later `.metadata` would read bfloat16 as F32
    "dtype-setstate": (
        global_("torch", "bfloat16") + one_list(text("float32")) + OP["BUILD"] + _POP,
        "pickle-hostile",
    ),
    "dtype-slots": (
        global_("torch", "bfloat16") + slot_state({"name": text("float32")}) + OP["BUILD"] + _POP,
        "pickle-hostile",
    ),
    "size-reader-cache": (
        global_("torch", "Size") + slot_state({"_seen": OP["EMPTY_DICT"]}) + OP["BUILD"] + _POP,
        "pickle-hostile",
    ),
    "stand-in-class": (
        global_(_DCP, "Metadata") + slot_state({"kind": text("X")}) + OP["BUILD"] + _POP,
        "pickle-hostile",
    ),
    "layout-build-none": (
        global_("torch", "strided") + OP["NONE"] + OP["BUILD"] + _POP,
        "pickle-hostile",
    ),
    "function-dict": (
        global_("torch.serialization", "_get_layout")
        + str_dict({"x": integer(1)})
        + OP["BUILD"]
        + _POP,
        "pickle-hostile",
    ),
    "memo-alias": (
        global_("torch", "bfloat16")
        + binput(900)
        + _POP
        + binget(900)
        + one_list(text("float32"))
        + OP["BUILD"]
        + _POP,
        "pickle-hostile",
    ),
    "ext1": (OP["EXT1"] + bytes([1]) + _POP, "pickle-hostile"),
    "setitems-empty": (global_("torch", "Size") + OP["MARK"] + OP["SETITEMS"] + _POP, None),
    "persid": (OP["PERSID"] + b"x\n" + _POP, "torch-dist-metadata-unreadable"),
}


# -- the isolation property ------------------------------------------------------------------


def stand_in_state(*readers: str) -> list[object]:
    """Everything a stream could reach through what the pickle readers hand it, as comparable
    data: the module-level objects of the readers (tables, classes, functions and their
    defaults), the classes and enum members the bounded child's reply may name, and
    copyreg's process-wide extension registry and cache. Equal before and after a read: the read
    changed nothing another read uses. The allow-list and the unpickler are always in;
    `readers` picks some of "bin" (`formats.torch_bin`),
    "metadata" (`pickles.dcp_metadata`) and "reply" (`pickles.sandbox` and the classes its
    reply names); all by default."""
    import copyreg

    from inspector._internal.checkpoint import read_problems, scanned
    from inspector._internal.formats import torch_bin
    from inspector._internal.formats.pickles import (
        allowed,
        dcp_metadata,
        sandbox,
        stand_ins,
        unpickler,
    )

    readers = readers or ("bin", "metadata", "reply")
    modules = [stand_ins, allowed, unpickler]
    modules += [torch_bin] if "bin" in readers else []
    modules += [dcp_metadata] if "metadata" in readers else []
    modules += [sandbox, read_problems] if "reply" in readers else []
    out: list[object] = []
    for module in modules:
        for name, value in sorted(vars(module).items()):
            if name.startswith("__"):  # the module's own dunders (`__builtins__`...)
                continue
            if getattr(value, "__module__", module.__name__) == module.__name__:
                out.append((module.__name__, name, _state(value, 0)))
    if "reply" in readers:
        out.append(_state(scanned.TorchDistTensor, 0))
        for member in (*read_problems.FileRole, *read_problems.ProblemKind):
            out.append((repr(member), _state(dict(vars(member)), 1)))
    # What the unpickler reads (the registry) and writes (the cache) for EXT1/2/4.
    out.append(
        (
            _state(dict(copyreg._extension_cache), 1),  # type: ignore[attr-defined]
            _state(dict(copyreg._inverted_registry), 1),  # type: ignore[attr-defined]
        )
    )
    return out


def _state(value: object, depth: int) -> object:
    import types

    if depth > 3 or isinstance(value, types.ModuleType):
        return f"<{type(value).__name__}>"
    if isinstance(value, types.FunctionType):
        return (
            "function",
            value.__qualname__,
            repr(value.__defaults__),
            repr(value.__kwdefaults__),
            id(value.__code__),
            _state(dict(vars(value)), depth + 1),
        )
    if isinstance(value, type):
        skip = ("__dict__", "__weakref__", "__doc__", "__annotations__")
        items = sorted((k, v) for k, v in vars(value).items() if k not in skip)
        return ("class", value.__qualname__, tuple((k, _state(v, depth + 1)) for k, v in items))
    if isinstance(value, dict):
        return tuple(sorted((repr(k), _state(v, depth + 1)) for k, v in value.items()))
    if isinstance(value, list | tuple | set | frozenset):
        return (type(value).__name__, tuple(sorted(repr(_state(v, depth + 1)) for v in value)))
    fields = [(n, repr(getattr(value, n, None))) for n in getattr(type(value), "__slots__", ())]
    return (
        type(value).__qualname__,
        repr(value),
        tuple(fields),
        repr(getattr(value, "__dict__", None)),
    )


def read_one(kind: str, data: bytes) -> str:
    """One file read as the scan reads it, as text that compares equal for equal results:
    a `.bin` (`kind` "bin": its shard columns and findings) or a DCP `.metadata` ("metadata":
    the torch_dist conversion, or the refusal)."""
    if kind == "bin":
        from inspector._internal.formats.bin_shard import read_bin_columns

        class Reader:
            def size(self) -> int:
                return len(data)

            def read_range(self, offset: int, length: int) -> bytes:
                return data[offset : offset + length]

        shard = read_bin_columns(Reader(), "x.bin")
        columns = (shard.names, shard.dtypes, shard.shapes, shard.begins, shard.ends)
        return repr((columns, [(f.code, f.message) for f in shard.findings]))
    from inspector._internal.formats.pickles.dcp_metadata import load_dcp_metadata
    from inspector._internal.layouts import torch_dist

    try:
        meta = load_dcp_metadata(data)
    except Exception as exc:  # the refusal is the result
        return repr((type(exc).__name__, str(exc)))
    return repr(torch_dist._convert_metadata(meta, rel=".metadata", prefix=""))


_ALONE = """
import json, os, sys
sys.path.insert(0, {tests!r})
from pickle_ops import read_one
# Imported once here, before any fork: importing reads no pickle.
import inspector._internal.formats.bin_shard
import inspector._internal.layouts.torch_dist

out = []
for kind, path in json.loads(sys.argv[1]):
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # a process that read nothing yet: this file alone
        os.close(read)
        os.write(write, read_one(kind, open(path, "rb").read()).encode())
        os._exit(0)
    os.close(write)
    chunks = []
    while chunk := os.read(read, 1 << 16):
        chunks.append(chunk)
    os.close(read)
    os.waitpid(pid, 0)
    out.append(b"".join(chunks).decode())
print(json.dumps(out))
"""


def read_alone(files: list[tuple[str, Path]]) -> list[str]:
    """`read_one` of each file, each in a process that read no other pickle: a new
    interpreter forks a child per file."""
    import json
    import subprocess
    import sys

    script = _ALONE.format(tests=str(Path(__file__).resolve().parent))
    arg = json.dumps([(kind, str(path)) for kind, path in files])
    done = subprocess.run(
        [sys.executable, "-c", script, arg], capture_output=True, text=True, check=True
    )
    return list(json.loads(done.stdout.strip().splitlines()[-1]))
