"""`torch-dist`: a Megatron-LM / PyTorch DCP checkpoint folder (`latest_checkpointed_iteration.txt`
naming `iter_0000100/` or `release/`, holding `.metadata`, `*.distcp`, `metadata.json`,
`common.pt`: docs/formats.md, "Megatron torch_dist"). Only metadata is read (`.metadata`
through `pickles.dcp_metadata`, the common state through `pickles.common_state`);
`.distcp` sizes are recorded for `checks.torch_dist`, which judges.
"""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np

from inspector._internal.checkpoint.read_problems import FileRole, ProblemKind, ReadProblem
from inspector._internal.checkpoint.scanned import (
    LayoutName,
    LogicalTensors,
    PickledObject,
    ScannedCheckpoint,
    TensorSummary,
    TorchDistInfo,
    TorchDistTensor,
)
from inspector._internal.common.columns import Coded
from inspector._internal.common.dtypes import torch_itemsize
from inspector._internal.common.filenames import (
    TORCH_DIST_COMMON,
    TORCH_DIST_LATEST,
    TORCH_DIST_METADATA,
    TORCH_DIST_METADATA_JSON,
)
from inspector._internal.common.gc import gc_paused
from inspector._internal.common.text import examples, short_repr
from inspector._internal.formats.pickles.common_state import Opaque, load_common_state
from inspector._internal.formats.pickles.dcp_metadata import (
    MetadataFormatError,
    read_dcp_metadata,
)
from inspector._internal.formats.pickles.errors import (
    HostilePickleError,
    PickleBombError,
    RefusedGlobalError,
)
from inspector._internal.formats.pickles.stand_ins import Dims, StandIn, TorchDtype
from inspector._internal.layouts._common import is_safe_member, read_json
from inspector._internal.layouts.base import LayoutReader, ScanOptions
from inspector._internal.storage import EntryKind, Location
from inspector.errors import UnsafeFileError

__all__ = [
    "COMMON_FILE",
    "LATEST_FILE",
    "LAYOUT",
    "METADATA_FILE",
    "METADATA_JSON",
    "RERUN_PREFIX",
    "PickledObject",
    "TensorSummary",
    "detect",
    "iteration_folder_name",
    "scan",
]

NAME = LayoutName.TORCH_DIST

LATEST_FILE = TORCH_DIST_LATEST
METADATA_FILE = TORCH_DIST_METADATA
METADATA_JSON = TORCH_DIST_METADATA_JSON
COMMON_FILE = TORCH_DIST_COMMON
# Newer Megatron keeps the common state inside the .distcp files as this sharded object.
COMMON_STATE_KEY = "common_state/shard_0_1"
RERUN_PREFIX = "rerun_state_machine_state/"

# A .metadata of 1.3M entries with many chunks each stays far below this.
METADATA_CAP = 4_000_000_000
# Common state holds args, iteration, scheduler and optimizer hyper-parameters: small.
COMMON_CAP = 512_000_000
_ITERATION_TEXT = re.compile(r"(\d{1,12}|release)")


# -- detection ------------------------------------------------------------------------


def detect(path: Location) -> bool:
    """A DCP folder (`.metadata` without safetensors, `*.distcp`, or a torch_dist
    `metadata.json`), or a Megatron save folder with `latest_checkpointed_iteration.txt`."""
    if not path.is_dir():
        return path.name == METADATA_FILE and _is_dcp_folder(path.parent)
    return _is_dcp_folder(path) or (path / LATEST_FILE).is_file()


def _is_dcp_folder(folder: Location) -> bool:
    # Refused entries count: a `.metadata` that is a FIFO still marks the folder, and the
    # scan reports it.
    names = [e.name for e in folder.entries() if e.kind is not EntryKind.DIR]
    if any(n.endswith(".distcp") for n in names):
        return True
    # DCP's Hugging Face writer also leaves a `.metadata` next to its .safetensors files.
    if METADATA_FILE in names and not any(n.endswith(".safetensors") for n in names):
        return True
    if METADATA_JSON in names:
        value, problem, _ = read_json(folder / METADATA_JSON, cap=1_000_000)
        return problem is None and isinstance(value, dict) and _is_torch_dist(value)
    return False


def _is_torch_dist(doc: dict[str, Any]) -> bool:
    return doc.get("sharded_backend") == "torch_dist"


def iteration_folder_name(text: str) -> str | None:
    """Megatron's folder for the content of `latest_checkpointed_iteration.txt`:
    "100" -> "iter_0000100", "release" -> "release"; None when the text is neither."""
    text = text.strip()
    if not _ITERATION_TEXT.fullmatch(text):
        return None
    return text if text == "release" else f"iter_{int(text):07d}"


# -- scan -----------------------------------------------------------------------------


def scan(path: Location, options: ScanOptions) -> ScannedCheckpoint:
    """Read `.metadata`, `metadata.json`, the common state and the `.distcp` sizes.

    `options.header_cap` does not apply: torch_dist has no safetensors headers.
    """
    del options
    folder = path if path.is_dir() else path.parent
    folder = Location(folder.as_root())
    # 1. Which folder holds the checkpoint: this one, or the iteration the tracker names.
    problems: list[ReadProblem] = []
    iteration_dir: str | None = ""
    if not _is_dcp_folder(folder):
        iteration_dir, problems = _resolve_iteration(folder)
    if iteration_dir is None:
        return _empty_scan(folder, problems)
    ckpt = folder / iteration_dir
    # 2. The sharded metadata: tensors, byte objects, where each chunk is stored.
    tensors, byte_keys, storage, meta_problems = _read_metadata(ckpt, iteration_dir)
    problems += meta_problems
    # 3. metadata.json, the .distcp sizes, the common state.
    metadata_json, json_rel, json_problems = _read_metadata_json(ckpt, iteration_dir)
    problems += json_problems
    distcp_sizes, size_problems = _distcp_sizes(folder, iteration_dir, storage)
    problems += size_problems
    common, common_file, common_problems = _read_common(folder, iteration_dir, byte_keys, storage)
    problems += common_problems
    # 4. One logical row per tensor key.
    info = TorchDistInfo(
        iteration_dir=iteration_dir,
        metadata_json=metadata_json,
        tensors=tensors,
        byte_keys=tuple(byte_keys),
        storage=storage,
        distcp_sizes=distcp_sizes,
        common=common,
        common_file=common_file,
    )
    return ScannedCheckpoint(
        path=folder.path,
        storage=folder.storage,
        layout=NAME,
        info=info,
        logical=_logical(tensors, storage),
        read_problems=tuple(problems),
        json_files=frozenset({json_rel} if json_rel else ()),
    )


def _empty_scan(folder: Location, problems: list[ReadProblem]) -> ScannedCheckpoint:
    """No iteration folder to read: the problems say why."""
    info = TorchDistInfo("", None, {}, (), {}, {}, None)
    return ScannedCheckpoint(
        folder.path,
        NAME,
        info,
        logical=_logical({}, {}),
        read_problems=tuple(problems),
        storage=folder.storage,
    )


def _rel(prefix: str, name: str) -> str:
    return f"{prefix}/{name}" if prefix else name


def _resolve_iteration(parent: Location) -> tuple[str | None, list[ReadProblem]]:
    """The iteration folder `latest_checkpointed_iteration.txt` names, checked to exist inside
    `parent` (the storage refuses a link out of it); otherwise the newest `iter_*` folder with
    a `.metadata` (or None), and a finding."""
    text = _read_small_text(parent / LATEST_FILE)
    name = iteration_folder_name(text) if text is not None else None
    if name is not None and (parent / name).is_dir():
        return name, []
    fallback = _newest_iteration(parent)
    if name is None:
        shown = "unreadable" if text is None else repr(text[:40])
        why = f"holds {shown}; expected an iteration number such as 100, or 'release'"
    else:
        why = f"names {name}/, which is not a folder inside {parent.name}/"
    then = f"scanning {fallback}/ instead" if fallback else "no iter_* folder to scan instead"
    return fallback, [ReadProblem(LATEST_FILE, FileRole.ITERATION_TRACKER, f"{why} ({then})")]


def _read_small_text(path: Location, *, cap: int = 1024) -> str | None:
    try:
        with path.open() as reader:
            return reader.read_range(0, cap).decode("utf-8")
    except (OSError, UnsafeFileError, UnicodeDecodeError):
        return None


def _newest_iteration(parent: Location) -> str | None:
    names = [
        e.name for e in parent.entries() if e.kind is EntryKind.DIR and e.name.startswith("iter_")
    ]
    numbered = [
        (int(n[5:]), n) for n in names if n[5:].isdigit() and (parent / n / METADATA_FILE).is_file()
    ]
    return max(numbered)[1] if numbered else None


# -- .metadata ------------------------------------------------------------------------

_Storage = dict[tuple[str, tuple[int, ...]], tuple[str, int, int]]


def _read_metadata(
    ckpt: Location, prefix: str
) -> tuple[dict[str, TorchDistTensor], list[str], _Storage, list[ReadProblem]]:
    """`.metadata` through the restricted unpickler; every failure is a read problem."""
    rel = _rel(prefix, METADATA_FILE)
    path = ckpt / METADATA_FILE

    def unreadable(
        reason: str, kind: ProblemKind = ProblemKind.UNREADABLE
    ) -> tuple[dict, list, dict, list[ReadProblem]]:
        return {}, [], {}, [ReadProblem(rel, FileRole.TORCH_DIST_METADATA, reason, kind)]

    try:
        with path.open() as reader:
            size = reader.size()
            if size > METADATA_CAP:
                return unreadable(f"is {size:,} bytes, over the {METADATA_CAP:,}-byte limit")
            data = reader.read_range(0, size)
    except FileNotFoundError:
        return unreadable("is missing")
    except UnsafeFileError as exc:
        return unreadable(f"{exc.reason}; not read", ProblemKind.UNSAFE_FILE)
    except OSError as exc:
        return unreadable(f"cannot be read ({exc.strerror or exc})")
    with gc_paused():
        try:
            # A large file is unpickled and converted in a bounded child (plain data comes
            # back), a small one audited and unpickled here: the same results either way.
            return read_dcp_metadata(
                data,
                lambda meta: _convert_metadata(meta, rel=rel, prefix=prefix),
                classes=(TorchDistTensor, ReadProblem, FileRole, ProblemKind),
            )
        # Before RefusedGlobalError: a refused global that runs code is hostile, not unknown.
        except (HostilePickleError, PickleBombError) as exc:
            return unreadable(str(exc), refusal_kind(exc))
        except RefusedGlobalError as exc:
            return unreadable(str(exc))
        except MetadataFormatError as exc:
            return unreadable(f"{exc} (truncated or corrupt)")


def _convert_metadata(
    meta: StandIn, *, rel: str, prefix: str
) -> tuple[dict[str, TorchDistTensor], list[str], _Storage, list[ReadProblem]]:
    """Stand-ins -> plain model data. Malformed entries are skipped and reported once."""
    entries = meta.get("state_dict_metadata")
    entries = entries if isinstance(entries, dict) else {}
    tensors: dict[str, TorchDistTensor] = {}
    byte_keys: list[str] = []
    bad: list[str] = []
    chunk_lists: _ChunkLists = {}
    for key, entry in entries.items():
        kind = entry.kind if isinstance(entry, StandIn) else None
        if isinstance(key, str) and kind == "BytesStorageMetadata":
            byte_keys.append(key)
        elif isinstance(key, str) and (tensor := _tensor_entry(entry, chunk_lists)) is not None:
            tensors[key] = tensor
        else:
            bad.append(short_repr(key))
    storage, bad_storage, unsafe = _storage_map(meta.get("storage_data"), prefix)
    problems = _metadata_problems(rel, entries, bad, bad_storage, unsafe)
    return tensors, byte_keys, storage, problems


# (id of an unpickled chunk list, number of dimensions) -> its chunks, or None if malformed.
_ChunkLists = dict[tuple[int, int], tuple[tuple[Dims, Dims], ...] | None]
# Chunk lists up to this long are converted for each tensor that names them.
_SHORT_LIST = 64


def _tensor_entry(entry: Any, chunk_lists: _ChunkLists) -> TorchDistTensor | None:
    """A `TensorStorageMetadata` stand-in as a `TorchDistTensor`, or None if malformed.

    Shapes are `Dims` (checked when unpickled), so this loop only tests types: it runs for
    every chunk of every tensor, millions of times on a large checkpoint. A long chunk list
    the pickle shares between tensors (its memo repeats one list for a few bytes) is
    converted once and stays one shared tuple (`chunk_lists`, by identity: the unpickled
    lists live as long as the conversion), so the work and the result are linear in the
    file."""
    if not isinstance(entry, StandIn) or entry.kind != "TensorStorageMetadata":
        return None
    state = entry.state
    if type(state) is not dict:
        return None
    props = state.get("properties")
    pstate = props.state if isinstance(props, StandIn) else None
    dtype = pstate[0] if type(pstate) is tuple and pstate else _attr(pstate, "dtype")
    size = state.get("size")
    raw_chunks = state.get("chunks")
    if type(dtype) is not TorchDtype or type(size) is not Dims or type(raw_chunks) is not list:
        return None
    if len(raw_chunks) <= _SHORT_LIST:  # as many as ranks: converting beats looking up
        chunks = _chunk_list(raw_chunks, len(size))
    else:
        key = (id(raw_chunks), len(size))
        if key not in chunk_lists:
            chunk_lists[key] = _chunk_list(raw_chunks, len(size))
        chunks = chunk_lists[key]
    return None if chunks is None else TorchDistTensor(dtype.safetensors, size, chunks)


def _chunk_list(raw_chunks: list[Any], ndim: int) -> tuple[tuple[Dims, Dims], ...] | None:
    chunks = []
    for chunk in raw_chunks:
        # Hot loop: EAFP instead of isinstance checks; a non-stand-in has no usable `.state`.
        try:
            cstate = chunk.state
            offsets, sizes = cstate["offsets"], cstate["sizes"]
        except (AttributeError, KeyError, TypeError):
            return None
        if type(offsets) is not Dims or type(sizes) is not Dims:
            return None
        if len(offsets) != ndim or len(sizes) != ndim:
            return None
        chunks.append((offsets, sizes))
    return tuple(chunks)


def _byte_range(start: Any, length: Any) -> bool:
    return type(start) is int and type(length) is int and start >= 0 and length >= 0


def _attr(state: Any, key: str) -> Any:
    return state.get(key) if type(state) is dict else None


def _storage_map(raw: Any, prefix: str) -> tuple[_Storage, list[str], list[str]]:
    """(fqn, chunk offsets) -> (file relative to the scanned folder, offset, length).

    Returns the map, malformed entries, and entries whose path would leave the folder
    (dropped, so nothing downstream ever stats a file outside the checkpoint)."""
    storage: _Storage = {}
    bad: list[str] = []
    unsafe: list[str] = []
    # A few distinct .distcp names serve millions of entries: check and join each once.
    paths: dict[str, str | None] = {}
    for index, info in raw.items() if isinstance(raw, dict) else ():
        # Hot loop: EAFP instead of isinstance checks; a non-stand-in has no usable `.state`.
        try:
            istate, fstate = index.state, info.state
            fqn, offset = istate["fqn"], istate.get("offset")
            path, start, length = fstate["relative_path"], fstate["offset"], fstate["length"]
        except (AttributeError, KeyError, TypeError):
            bad.append(short_repr(getattr(index, "state", index)))
            continue
        if type(fqn) is not str or type(path) is not str:
            bad.append(short_repr(fqn))
        elif not (offset is None or type(offset) is Dims) or not _byte_range(start, length):
            bad.append(fqn)
        else:
            if path not in paths:
                paths[path] = _rel(prefix, path) if is_safe_member(path) else None
            if (rel := paths[path]) is None:
                unsafe.append(f"{fqn} -> {path[:200]!r}")
            else:
                storage[(fqn, offset or ())] = (rel, start, length)
    return storage, bad, unsafe


def _metadata_problems(
    rel: str, entries: dict, bad: list[str], bad_storage: list[str], unsafe: list[str]
) -> list[ReadProblem]:
    role = FileRole.TORCH_DIST_METADATA
    problems = []
    if not entries:
        reason = "lists no state-dict entries (expected the tensors and objects of the save)"
        problems.append(ReadProblem(rel, role, reason))
    if bad or bad_storage:
        reason = (
            f"has {len(bad) + len(bad_storage)} malformed entries "
            f"({examples(sorted(bad + bad_storage))}): expected tensor metadata with a dtype, "
            "a size and chunks, or a storage record with file, offset and length; they are "
            "skipped, and loading them will fail"
        )
        problems.append(ReadProblem(rel, role, reason, ProblemKind.INVALID_ENTRIES))
    if unsafe:
        reason = (
            f"stores {len(unsafe)} entries at paths outside the checkpoint folder "
            f"({examples(sorted(unsafe))}); expected file names inside it; they are ignored"
        )
        problems.append(ReadProblem(rel, role, reason, ProblemKind.UNSAFE_PATH))
    return problems


# -- metadata.json, .distcp sizes ----------------------------------------------------------


def _read_metadata_json(
    ckpt: Location, prefix: str
) -> tuple[dict | None, str | None, list[ReadProblem]]:
    """(doc, relative name if the file exists, problems of an unreadable file).

    Missing or non-torch_dist documents are drift, judged by
    `inspector._internal.checks.torch_dist`."""
    path = ckpt / METADATA_JSON
    if not path.is_file():
        return None, None, []
    rel = _rel(prefix, METADATA_JSON)
    value, problem, kind = read_json(path, cap=10_000_000)
    if problem is None and not isinstance(value, dict):
        problem = f"holds a JSON {type(value).__name__}, expected an object"
    if problem is not None:
        return None, rel, [ReadProblem(rel, FileRole.METADATA_JSON, problem, kind)]
    return value, rel, []


def _distcp_sizes(
    folder: Location, prefix: str, storage: _Storage
) -> tuple[dict[str, int], list[ReadProblem]]:
    """Sizes of the `.distcp` files in the checkpoint and of every file the storage map
    names (relative to the scanned folder); files that do not exist are absent, files the
    storage refuses (a FIFO, a link out of the folder) are absent and reported."""
    sizes: dict[str, int] = {}
    refused: dict[str, str] = {}
    for entry in (folder / prefix).entries():
        rel = _rel(prefix, entry.name)
        if entry.name.endswith(".distcp"):
            if entry.kind is EntryKind.FILE and entry.size is not None:
                sizes[rel] = entry.size
            elif entry.kind is EntryKind.REFUSED:
                refused[rel] = entry.reason or "is not a regular file"
    for file in sorted({loc[0] for loc in storage.values()} - sizes.keys() - refused.keys()):
        found = (folder / file).stat()
        if found is not None and found.kind is EntryKind.FILE and found.size is not None:
            sizes[file] = found.size
        elif found is not None and found.kind is EntryKind.REFUSED:
            refused[file] = found.reason or "is not a regular file"
    problems = [
        ReadProblem(f, FileRole.TORCH_DIST_DATA, f"{why}; not read", ProblemKind.UNSAFE_FILE)
        for f, why in sorted(refused.items())
    ]
    return sizes, problems


# -- common state ---------------------------------------------------------------------


def _read_common(
    folder: Location, prefix: str, byte_keys: list[str], storage: _Storage
) -> tuple[dict[str, Any] | None, str | None, list[ReadProblem]]:
    """`common.pt`, or the `common_state` object newer Megatron stores in a `.distcp` file."""
    path = folder / prefix / COMMON_FILE
    if path.is_file():
        rel = _rel(prefix, COMMON_FILE)
        return _load_common(rel, lambda: _file_bytes(path, COMMON_CAP), unwrap=False)
    if COMMON_STATE_KEY in byte_keys and (COMMON_STATE_KEY, ()) in storage:
        file, start, length = storage[(COMMON_STATE_KEY, ())]
        rel = f"{file}[{COMMON_STATE_KEY}]"
        return _load_common(rel, lambda: _range_bytes(folder / file, start, length), unwrap=True)
    return None, None, []


def _file_bytes(path: Location, cap: int) -> bytes:
    with path.open() as reader:
        size = reader.size()
        if size > cap:
            raise ValueError(f"is {size:,} bytes, over the {cap:,}-byte limit for common state")
        return reader.read_range(0, size)


def _range_bytes(path: Location, start: int, length: int) -> bytes:
    if length > COMMON_CAP:
        raise ValueError(
            f"is {length:,} bytes, over the {COMMON_CAP:,}-byte limit for common state"
        )
    with path.open() as reader:
        data = reader.read_range(start, length)
    if len(data) != length:
        raise ValueError(f"is cut short: {len(data):,} of {length:,} bytes present")
    return data


def _load_common(
    rel: str, read: Any, *, unwrap: bool
) -> tuple[dict[str, Any] | None, str | None, list[ReadProblem]]:
    role = FileRole.TORCH_DIST_COMMON
    try:
        import torch  # optional dependency: only the common state needs it
    except ImportError:
        reason = (
            "was not read: reading the common state needs torch "
            "(pip install 'checkpoint-inspector[torch]')"
        )
        return None, rel, [ReadProblem(rel, role, reason)]
    try:
        value = load_common_state(torch, read(), cap=COMMON_CAP)
    except UnsafeFileError as exc:
        return (
            None,
            rel,
            [ReadProblem(rel, role, f"{exc.reason}; not read", ProblemKind.UNSAFE_FILE)],
        )
    except (HostilePickleError, PickleBombError) as exc:
        return None, rel, [ReadProblem(rel, role, str(exc), refusal_kind(exc))]
    # torch.load on untrusted bytes raises many types (UnpicklingError, RuntimeError from the
    # zip reader, ValueError, EOFError...): each one is a finding, never a crash of the scan.
    except Exception as exc:
        reason = (
            "cannot be read with torch.load(weights_only=True) "
            f"({type(exc).__name__}: {short_repr(str(exc), limit=300)})"
        )
        return None, rel, [ReadProblem(rel, role, reason)]
    if unwrap and isinstance(value, list) and len(value) == 1:
        value = value[0]  # Megatron saves a sharded object's data as a one-item list
    if not isinstance(value, dict):
        reason = f"holds a {type(value).__name__}, expected the common state dict"
        return None, rel, [ReadProblem(rel, role, reason)]
    return _plain(value, depth=0, seen={}), rel, []


def _plain(value: Any, *, depth: int, seen: dict[int, Any]) -> Any:
    """Tensors -> `TensorSummary`, opaque records -> `PickledObject`, containers recursed.

    `seen` converts each container once (by identity): a value shared a million times
    through the pickle memo is walked once, so the walk is linear in the objects the file
    holds, never in their expanded size."""
    if depth > 32:
        return "<nested too deep>"
    if isinstance(value, (dict, list, tuple, Opaque)):
        key = id(value)
        if key in seen:
            return seen[key]
        seen[key] = "<refers to itself>"  # a cycle (the audit refuses them) stays finite
        seen[key] = _plain_container(value, depth=depth, seen=seen)
        return seen[key]
    if (
        hasattr(value, "dtype")
        and hasattr(value, "shape")
        and type(value).__module__.startswith("torch")
    ):
        return TensorSummary(str(value.dtype).removeprefix("torch."), tuple(value.shape))
    return value


def _plain_container(value: Any, *, depth: int, seen: dict[int, Any]) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v, depth=depth + 1, seen=seen) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        items = [_plain(v, depth=depth + 1, seen=seen) for v in value]
        return items if isinstance(value, list) else tuple(items)
    args = tuple(_plain(a, depth=depth + 1, seen=seen) for a in value.args)
    return PickledObject(value.qualname, args, _plain(value.state, depth=depth + 1, seen=seen))


def refusal_kind(exc: HostilePickleError | PickleBombError) -> ProblemKind:
    """The problem kind of a pickle `pickles.audit` refused (the check
    names the code: pickle-hostile or pickle-bomb)."""
    return ProblemKind.HOSTILE if isinstance(exc, HostilePickleError) else ProblemKind.BOMB


# -- logical tensors --------------------------------------------------------------------


def _logical(tensors: dict[str, TorchDistTensor], storage: _Storage) -> LogicalTensors:
    """One row per tensor key: global shape, bytes, and the file of its first chunk."""
    names, files, dtypes, shapes, nbytes = [], [], [], [], []
    for name, tensor in tensors.items():
        first = storage.get((name, tensor.chunks[0][0])) if tensor.chunks else None
        names.append(name)
        files.append(first[0] if first else "")
        dtypes.append(tensor.dtype)
        shapes.append(tensor.size)
        nbytes.append(math.prod(tensor.size) * torch_itemsize(tensor.dtype))
    return LogicalTensors(
        tuple(names),
        Coded.encode(files),
        Coded.encode(dtypes),
        Coded.encode(shapes),
        np.asarray(nbytes, dtype=np.int64),
    )


LAYOUT = LayoutReader(NAME, detect, scan)
