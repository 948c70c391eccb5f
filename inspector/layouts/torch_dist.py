"""`torch-dist`: a Megatron-LM / PyTorch DCP checkpoint folder (FORMATS.md section 5).

    latest_checkpointed_iteration.txt     ("100" -> iter_0000100/, "release" -> release/)
    iter_0000100/ .metadata  __0_0.distcp ...  metadata.json  common.pt

Only metadata is read: `.metadata` through the restricted unpickler of
`inspector.safe_pickle` (nothing it names is imported or run), `metadata.json` as JSON, and
the common state with `torch.load(weights_only=True)`. Tensor bytes in the `.distcp` files
are never read; their sizes are compared with the ranges `.metadata` stores.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from inspector._gc import gc_paused
from inspector.dtypes import torch_itemsize
from inspector.findings import Finding, examples, fold_ranges, make_finding
from inspector.layouts._common import is_safe_member, read_json
from inspector.model import LogicalTensors, ScannedCheckpoint, TorchDistInfo, TorchDistTensor
from inspector.safe_pickle import (
    Dims,
    MetadataFormatError,
    RefusedGlobalError,
    StandIn,
    TorchDtype,
    load_dcp_metadata,
)

__all__ = [
    "NAME",
    "PickledObject",
    "TensorSummary",
    "check",
    "detect",
    "iteration_folder_name",
    "scan",
]

NAME = "torch-dist"

LATEST_FILE = "latest_checkpointed_iteration.txt"
METADATA_FILE = ".metadata"
METADATA_JSON = "metadata.json"
COMMON_FILE = "common.pt"
# Newer Megatron keeps the common state inside the .distcp files as this sharded object.
COMMON_STATE_KEY = "common_state/shard_0_1"
RERUN_PREFIX = "rerun_state_machine_state/"

# A .metadata of 1.3M entries with many chunks each stays far below this.
METADATA_CAP = 4_000_000_000
# Common state holds args, iteration, scheduler and optimizer hyper-parameters: small.
COMMON_CAP = 512_000_000
# Per code, after this many per-tensor findings the rest are folded into one.
_MAX_PER_CODE = 25
# Exact coverage uses a grid of chunk boundaries; above this many cells only volumes are compared.
_MAX_CELLS = 4_000_000
_ITERATION_TEXT = re.compile(r"(\d{1,12}|release)")
_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")
_DISTCP_RANK = re.compile(r"__(\d+)_\d+\.distcp$")


@dataclass(frozen=True, slots=True)
class TensorSummary:
    """A tensor found in the common state, by dtype and shape only."""

    dtype: str
    shape: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class PickledObject:
    """An object of a class the common state names but torch does not allow by default
    (`argparse.Namespace`, Megatron enums). Nothing was imported: this is its pickled form,
    `qualname(*args)` then `state` (e.g. a Namespace's attribute dict)."""

    qualname: str
    args: tuple[Any, ...]
    state: Any


# -- detection ------------------------------------------------------------------------


def detect(path: Path) -> bool:
    """A DCP folder (`.metadata` without safetensors, `*.distcp`, or a torch_dist
    `metadata.json`), or a Megatron save folder with `latest_checkpointed_iteration.txt`."""
    if path.is_file():
        return path.name == METADATA_FILE and _is_dcp_folder(path.parent)
    return path.is_dir() and (_is_dcp_folder(path) or (path / LATEST_FILE).is_file())


def _is_dcp_folder(folder: Path) -> bool:
    try:
        names = [e.name for e in os.scandir(folder) if e.is_file()]
    except OSError:
        return False
    if any(n.endswith(".distcp") for n in names):
        return True
    # DCP's Hugging Face writer also leaves a `.metadata` next to its .safetensors files.
    if METADATA_FILE in names and not any(n.endswith(".safetensors") for n in names):
        return True
    if METADATA_JSON in names:
        value, problem = read_json(folder / METADATA_JSON, cap=1_000_000)
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


def scan(path: Path, *, header_cap: int) -> ScannedCheckpoint:
    """Read `.metadata`, `metadata.json`, the common state and the `.distcp` sizes.

    `header_cap` is accepted for the common layout interface; DCP has no safetensors headers.
    """
    del header_cap
    folder = path.parent if path.is_file() else path
    # 1. Which folder holds the checkpoint: this one, or the iteration the tracker names.
    iteration_dir, problems = ("", []) if _is_dcp_folder(folder) else _resolve_iteration(folder)
    if iteration_dir is None:
        return _empty_scan(folder, problems)
    ckpt = folder / iteration_dir
    # 2. The sharded metadata: tensors, byte objects, where each chunk is stored.
    tensors, byte_keys, storage, meta_problems = _read_metadata(ckpt, iteration_dir)
    problems += meta_problems
    # 3. metadata.json, the .distcp sizes, the common state.
    metadata_json, json_rel, json_problems = _read_metadata_json(ckpt, iteration_dir)
    problems += json_problems
    distcp_sizes = _distcp_sizes(folder, iteration_dir, storage)
    common, common_file, common_problems = _read_common(folder, iteration_dir, byte_keys, storage)
    problems += common_problems
    # 4. One logical row per tensor key.
    info = TorchDistInfo(
        iteration_dir=iteration_dir,
        metadata_json=metadata_json,
        tensors=tensors,
        byte_keys=byte_keys,
        storage=storage,
        distcp_sizes=distcp_sizes,
        common=common,
        common_file=common_file,
    )
    return ScannedCheckpoint(
        path=folder,
        layout=NAME,
        shards=[],
        torch_dist=info,
        logical=_logical(tensors, storage),
        problems=problems,
        json_files=frozenset({json_rel} if json_rel else ()),
    )


def _empty_scan(folder: Path, problems: list[Finding]) -> ScannedCheckpoint:
    """No iteration folder to read: the findings say why."""
    info = TorchDistInfo("", None, {}, [], {}, {}, None)
    logical = _logical({}, {})
    return ScannedCheckpoint(folder, NAME, [], torch_dist=info, logical=logical, problems=problems)


def _rel(prefix: str, name: str) -> str:
    return f"{prefix}/{name}" if prefix else name


def _resolve_iteration(parent: Path) -> tuple[str | None, list[Finding]]:
    """The iteration folder `latest_checkpointed_iteration.txt` names, checked to exist inside
    `parent`; otherwise the newest `iter_*` folder with a `.metadata` (or None), and a finding."""
    text = _read_small_text(parent / LATEST_FILE)
    name = iteration_folder_name(text) if text is not None else None
    if name is not None and _inside(parent, parent / name) and (parent / name).is_dir():
        return name, []
    fallback = _newest_iteration(parent)
    if name is None:
        shown = "unreadable" if text is None else repr(text[:40])
        why = f"holds {shown}; expected an iteration number such as 100, or 'release'"
    else:
        why = f"names {name}/, which is not a folder inside {parent.name}/"
    then = f"scanning {fallback}/ instead" if fallback else "no iter_* folder to scan instead"
    msg = f"{LATEST_FILE} {why} ({then}); rewrite it with the iteration of the last complete save"
    return fallback, [make_finding("torch-dist-metadata-unreadable", msg, file=LATEST_FILE)]


def _read_small_text(path: Path, *, cap: int = 1024) -> str | None:
    try:
        with open(path, "rb") as fh:
            return fh.read(cap).decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def _inside(parent: Path, child: Path) -> bool:
    """True when `child` resolves (symlinks followed) to a path inside `parent`."""
    try:
        return child.resolve().is_relative_to(parent.resolve())
    except (OSError, RuntimeError):
        return False


def _newest_iteration(parent: Path) -> str | None:
    try:
        names = [e.name for e in os.scandir(parent) if e.is_dir() and e.name.startswith("iter_")]
    except OSError:
        return None
    numbered = [
        (int(n[5:]), n)
        for n in names
        if n[5:].isdigit()
        and (parent / n / METADATA_FILE).is_file()
        and _inside(parent, parent / n)
    ]
    return max(numbered)[1] if numbered else None


# -- .metadata ------------------------------------------------------------------------

_Storage = dict[tuple[str, tuple[int, ...]], tuple[str, int, int]]


def _read_metadata(
    ckpt: Path, prefix: str
) -> tuple[dict[str, TorchDistTensor], list[str], _Storage, list[Finding]]:
    """`.metadata` through the restricted unpickler; every failure is a finding."""
    rel = _rel(prefix, METADATA_FILE)
    path = ckpt / METADATA_FILE
    fail = "; the checkpoint cannot be loaded without it: restore it from the original save"

    def unreadable(reason: str) -> tuple[dict, list, dict, list[Finding]]:
        return (
            {},
            [],
            {},
            [make_finding("torch-dist-metadata-unreadable", f"{rel} {reason}{fail}", file=rel)],
        )

    try:
        size = path.stat().st_size
        if size > METADATA_CAP:
            return unreadable(f"is {size:,} bytes, over the {METADATA_CAP:,}-byte limit")
        data = path.read_bytes()
    except FileNotFoundError:
        return unreadable("is missing")
    except OSError as exc:
        return unreadable(f"cannot be read ({exc.strerror or exc})")
    with gc_paused():
        try:
            meta = load_dcp_metadata(data)
        except RefusedGlobalError as exc:
            return unreadable(str(exc))
        except MetadataFormatError as exc:
            return unreadable(f"{exc} (truncated or corrupt)")
        return _convert_metadata(meta, rel=rel, prefix=prefix)


def _convert_metadata(
    meta: StandIn, *, rel: str, prefix: str
) -> tuple[dict[str, TorchDistTensor], list[str], _Storage, list[Finding]]:
    """Stand-ins -> plain model data. Malformed entries are skipped and reported once."""
    entries = meta.get("state_dict_metadata")
    entries = entries if isinstance(entries, dict) else {}
    tensors: dict[str, TorchDistTensor] = {}
    byte_keys: list[str] = []
    bad: list[str] = []
    for key, entry in entries.items():
        kind = entry.kind if isinstance(entry, StandIn) else None
        if isinstance(key, str) and kind == "BytesStorageMetadata":
            byte_keys.append(key)
        elif isinstance(key, str) and (tensor := _tensor_entry(entry)) is not None:
            tensors[key] = tensor
        else:
            bad.append(str(key)[:200])
    storage, bad_storage, unsafe = _storage_map(meta.get("storage_data"), prefix)
    problems = _metadata_problems(rel, entries, bad, bad_storage, unsafe)
    return tensors, byte_keys, storage, problems


def _tensor_entry(entry: Any) -> TorchDistTensor | None:
    """A `TensorStorageMetadata` stand-in as a `TorchDistTensor`, or None if malformed.

    Shapes are `Dims` (checked when unpickled), so this loop only tests types: it runs for
    every chunk of every tensor, millions of times on a large checkpoint."""
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
    ndim = len(size)
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
    return TorchDistTensor(dtype.safetensors, size, tuple(chunks))


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
            bad.append(str(getattr(index, "state", index))[:200])
            continue
        if type(fqn) is not str or type(path) is not str:
            bad.append(str(fqn)[:200])
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
) -> list[Finding]:
    code = "torch-dist-metadata-unreadable"
    problems = []
    if not entries:
        problems.append(
            make_finding(
                code,
                f"{rel} lists no state-dict entries (expected the "
                "tensors and objects of the save); re-save the checkpoint",
                file=rel,
            )
        )
    if bad or bad_storage:
        msg = (
            f"{rel} has {len(bad) + len(bad_storage)} malformed entries "
            f"({examples(sorted(bad + bad_storage))}): expected tensor metadata with a dtype, "
            "a size and chunks, or a storage record with file, offset and length; they are "
            "skipped, and loading them will fail"
        )
        problems.append(make_finding(code, msg, file=rel))
    if unsafe:
        msg = (
            f"{rel} stores {len(unsafe)} entries at paths outside the checkpoint folder "
            f"({examples(sorted(unsafe))}); expected file names inside it; they are ignored"
        )
        problems.append(make_finding(code, msg, file=rel))
    return problems


# -- metadata.json, .distcp sizes ----------------------------------------------------------


def _read_metadata_json(ckpt: Path, prefix: str) -> tuple[dict | None, str | None, list[Finding]]:
    """(doc, relative name if the file exists, findings for an unreadable file).

    Missing or non-torch_dist documents are drift, reported by `check`."""
    path = ckpt / METADATA_JSON
    if not path.is_file():
        return None, None, []
    rel = _rel(prefix, METADATA_JSON)
    value, problem = read_json(path, cap=10_000_000)
    if problem is None and not isinstance(value, dict):
        problem = f"holds a JSON {type(value).__name__}, expected an object"
    if problem is not None:
        msg = (
            f'{rel} {problem}; expected {{"sharded_backend": "torch_dist", ...}}: '
            "rewrite it, or Megatron will not recognise the checkpoint"
        )
        return None, rel, [make_finding("torch-dist-metadata-json", msg, file=rel)]
    return value, rel, []


def _distcp_sizes(folder: Path, prefix: str, storage: _Storage) -> dict[str, int]:
    """Sizes of the `.distcp` files in the checkpoint and of every file the storage map
    names (relative to the scanned folder); files that do not exist are absent."""
    sizes: dict[str, int] = {}
    try:
        for entry in os.scandir(folder / prefix):
            if entry.name.endswith(".distcp") and entry.is_file():
                sizes[_rel(prefix, entry.name)] = entry.stat().st_size
    except OSError:
        pass
    for file in {loc[0] for loc in storage.values()} - sizes.keys():
        try:
            sizes[file] = (folder / file).stat().st_size
        except OSError:
            continue
    return sizes


# -- common state ---------------------------------------------------------------------


def _read_common(
    folder: Path, prefix: str, byte_keys: list[str], storage: _Storage
) -> tuple[dict[str, Any] | None, str | None, list[Finding]]:
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


def _file_bytes(path: Path, cap: int) -> bytes:
    size = path.stat().st_size
    if size > cap:
        raise ValueError(f"is {size:,} bytes, over the {cap:,}-byte limit for common state")
    return path.read_bytes()


def _range_bytes(path: Path, start: int, length: int) -> bytes:
    if length > COMMON_CAP:
        raise ValueError(
            f"is {length:,} bytes, over the {COMMON_CAP:,}-byte limit for common state"
        )
    with open(path, "rb") as fh:
        fh.seek(start)
        data = fh.read(length)
    if len(data) != length:
        raise ValueError(f"is cut short: {len(data):,} of {length:,} bytes present")
    return data


def _load_common(
    rel: str, read: Any, *, unwrap: bool
) -> tuple[dict[str, Any] | None, str | None, list[Finding]]:
    code = "torch-dist-common-unreadable"
    try:
        import torch  # optional dependency: only the common state needs it
    except ImportError:
        msg = (
            f"{rel} was not read: reading the common state needs torch "
            "(pip install 'checkpoint-inspector[torch]'); drift checks against it are skipped"
        )
        return None, rel, [make_finding(code, msg, file=rel)]
    try:
        value = _unwrap_bytes_io(torch, _inert_torch_load(torch, read()))
    # torch.load on untrusted bytes raises many types (UnpicklingError, RuntimeError from the
    # zip reader, ValueError, EOFError...): each one is a finding, never a crash of the scan.
    except Exception as exc:
        msg = (
            f"{rel} cannot be read with torch.load(weights_only=True) "
            f"({type(exc).__name__}: {str(exc)[:300]}); drift checks against it are skipped"
        )
        return None, rel, [make_finding(code, msg, file=rel)]
    if unwrap and isinstance(value, list) and len(value) == 1:
        value = value[0]  # Megatron saves a sharded object's data as a one-item list
    if not isinstance(value, dict):
        msg = f"{rel} holds a {type(value).__name__}, expected the common state dict"
        return None, rel, [make_finding(code, msg, file=rel)]
    return _plain(value, depth=0), rel, []


def _unwrap_bytes_io(torch: Any, value: Any) -> Any:
    """Plain DCP (unlike Megatron's planner) pickles a BytesIO object around the payload."""
    if isinstance(value, _Opaque) and value.qualname == "_io.BytesIO":
        inner = value.state[0] if isinstance(value.state, tuple) and value.state else None
        if isinstance(inner, bytes):
            return _inert_torch_load(torch, inner)
    return value


class _Opaque:
    """Inert stand-in torch's weights-only unpickler may construct for a named global."""

    qualname = "?"
    args: tuple[Any, ...] = ()
    state: Any = None

    def __init__(self, *args: Any) -> None:
        self.args = args

    def __setstate__(self, state: Any) -> None:
        self.state = state


def _inert_torch_load(torch: Any, data: bytes) -> Any:
    """`torch.load(weights_only=True)` where each global torch would refuse (Megatron enums,
    `argparse.Namespace`...) is replaced by an `_Opaque` record: nothing is imported."""
    import io

    try:
        names = torch.serialization.get_unsafe_globals_in_checkpoint(io.BytesIO(data))
    except Exception:  # legacy (non-zip) format or a corrupt file: torch.load reports it
        names = []
    stand_ins = [(type("Opaque", (_Opaque,), {"qualname": n}), n) for n in names]
    with torch.serialization.safe_globals(stand_ins):
        return torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")


def _plain(value: Any, *, depth: int) -> Any:
    """Tensors -> `TensorSummary`, opaque records -> `PickledObject`, containers recursed."""
    if depth > 32:
        return "<nested too deep>"
    if isinstance(value, dict):
        return {k: _plain(v, depth=depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        items = [_plain(v, depth=depth + 1) for v in value]
        return items if isinstance(value, list) else tuple(items)
    if isinstance(value, _Opaque):
        args = tuple(_plain(a, depth=depth + 1) for a in value.args)
        return PickledObject(value.qualname, args, _plain(value.state, depth=depth + 1))
    if (
        hasattr(value, "dtype")
        and hasattr(value, "shape")
        and type(value).__module__.startswith("torch")
    ):
        return TensorSummary(str(value.dtype).removeprefix("torch."), tuple(value.shape))
    return value


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
    none = [None] * len(names)
    return LogicalTensors(names, files, dtypes, shapes, nbytes, none, list(none))


# -- checks (pure) --------------------------------------------------------------------


def check(scanned: ScannedCheckpoint) -> list[Finding]:
    """Drift checks of a torch_dist checkpoint, from scanned data only (no IO)."""
    info = scanned.torch_dist
    if info is None:
        return []
    return [
        *_check_files(info),
        *_check_chunks(info),
        *_check_common_drift(info),
        *_check_metadata_json(scanned, info),
    ]


def _meta_rel(info: TorchDistInfo) -> str:
    return _rel(info.iteration_dir, METADATA_FILE)


def _check_files(info: TorchDistInfo) -> list[Finding]:
    """Storage records pointing into missing or short `.distcp` files, and chunks that have
    no storage record at all."""
    # 1. The furthest byte each file must hold (one pass; details only for bad files).
    ends: dict[str, int] = {}
    for file, start, length in info.storage.values():
        if ends.get(file, -1) < start + length:
            ends[file] = start + length
    bad = {f for f, end in ends.items() if info.distcp_sizes.get(f, -1) < end}
    found = [_file_finding(file, info) for file in sorted(bad)]
    # 2. Chunks and objects the metadata lists but stores nowhere.
    storage = info.storage
    missing = [
        (fqn, offsets)
        for fqn, tensor in info.tensors.items()
        for offsets, _ in tensor.chunks
        if (fqn, offsets) not in storage
    ] + [(key, ()) for key in info.byte_keys if (key, ()) not in storage]
    rel = _meta_rel(info)
    per_tensor = [
        make_finding(
            "torch-dist-missing-file",
            f"{fqn}: the chunk at offsets {tuple(offsets)} has no storage record in {rel}, "
            "so no .distcp file holds its bytes; the save was incomplete: re-save the checkpoint",
            file=rel,
            tensor=fqn,
            layer=_layer(fqn),
        )
        for fqn, offsets in missing
    ]
    return found + _capped(per_tensor, "torch-dist-missing-file", "chunks without storage")


def _file_finding(file: str, info: TorchDistInfo) -> Finding:
    entries = [(fqn, s + n) for (fqn, _), (f, s, n) in info.storage.items() if f == file]
    names = sorted({fqn for fqn, _ in entries})
    size = info.distcp_sizes.get(file)
    if size is None:
        msg = (
            f"{file} is missing; {_meta_rel(info)} stores {len(entries)} entries there "
            f"({examples(names)}); restore the file from the original save"
        )
        return make_finding("torch-dist-missing-file", msg, file=file)
    past = sorted({fqn for fqn, end in entries if end > size})
    end = max(e for _, e in entries)
    msg = (
        f"{file} is {size:,} bytes but {_meta_rel(info)} stores data up to byte {end:,}; "
        f"{len(past)} entries lie past the end ({examples(past)}): the file was truncated "
        "(interrupted copy or save?); restore it from the original save"
    )
    return make_finding("torch-dist-missing-file", msg, file=file)


def _capped(findings: list[Finding], code: str, what: str) -> list[Finding]:
    if len(findings) <= _MAX_PER_CODE:
        return findings
    rest = findings[_MAX_PER_CODE:]
    tensors = [f.tensor for f in rest if f.tensor]
    summary = make_finding(
        code,
        f"{len(rest)} more {what} ({examples(tensors)}), not listed one by one",
        file=findings[0].file,
    )
    return [*findings[:_MAX_PER_CODE], summary]


def _layer(name: str) -> int | None:
    match = _LAYER.search(name)
    return int(match.group(1)) if match else None


def _check_chunks(info: TorchDistInfo) -> list[Finding]:
    gaps: list[Finding] = []
    overlaps: list[Finding] = []
    rel = _meta_rel(info)
    for fqn, tensor in info.tensors.items():
        result = chunk_coverage(tensor.size, tensor.chunks)
        if result is None:
            continue
        code, detail = result
        msg = (
            f"{fqn}: the chunks in {rel} {detail}; the save lost or duplicated part of "
            "this tensor: re-save the checkpoint from a run that holds all ranks"
        )
        finding = make_finding(code, msg, file=rel, tensor=fqn, layer=_layer(fqn))
        (gaps if code == "torch-dist-chunk-gap" else overlaps).append(finding)
    return [
        *_capped(gaps, "torch-dist-chunk-gap", "tensors with uncovered regions"),
        *_capped(overlaps, "torch-dist-chunk-overlap", "tensors with overlapping chunks"),
    ]


_Chunk = tuple[tuple[int, ...], tuple[int, ...]]


def chunk_coverage(size: tuple[int, ...], chunks: Iterable[_Chunk]) -> tuple[str, str] | None:
    """None when the chunks tile `size` exactly; else (code, what is wrong).

    Exact without allocating the tensor: the chunk boundaries cut each axis into intervals,
    and a grid of counters (one per cell of those intervals) says which regions no chunk or
    several chunks cover.
    """
    chunks = list(chunks)
    total = math.prod(size)
    # 1. Chunks outside the global size are corrupt metadata.
    for offsets, sizes in chunks:
        if len(offsets) != len(size) or any(
            o + s > d for o, s, d in zip(offsets, sizes, size, strict=True)
        ):
            return "torch-dist-chunk-gap", (
                f"include offsets {offsets} with sizes {sizes}, outside the global size {size}"
            )
    if total == 0:
        return None
    # 2. Fast path: one chunk, the whole tensor (the common case by far).
    if len(chunks) == 1 and all(o == 0 for o in chunks[0][0]) and chunks[0][1] == size:
        return None
    if _regular_grid(size, chunks):
        return None
    volume = sum(math.prod(s) for _, s in chunks)
    # 3. Boundary grid; when it is too large, volumes are all we can afford.
    bounds = [
        sorted({0, d, *(o[i] for o, _ in chunks), *(o[i] + s[i] for o, s in chunks)})
        for i, d in enumerate(size)
    ]
    if math.prod(len(b) - 1 for b in bounds) > _MAX_CELLS:
        if volume == total:
            return None
        return _volume_only(volume, total, size)
    return _grid_coverage(size, chunks, bounds)


def _regular_grid(size: tuple[int, ...], chunks: list[_Chunk]) -> bool:
    """True when the chunks are exactly the cells of a grid partition of `size` (how TP, EP
    and FSDP shard): along each axis their intervals tile [0, dim) with neither gap nor
    overlap, and every cell of that grid appears once. Pure Python and fast; anything
    else goes to the exact counter grid."""
    cells = 1
    for d, dim in enumerate(size):
        pos = 0
        spans = sorted({(o[d], s[d]) for o, s in chunks})
        for start, length in spans:
            if start != pos or length == 0:
                return False
            pos = start + length
        if pos != dim:
            return False
        cells *= len(spans)
    return cells == len(chunks) == len({o for o, _ in chunks})


def _volume_only(volume: int, total: int, size: tuple[int, ...]) -> tuple[str, str]:
    if volume < total:
        return "torch-dist-chunk-gap", (
            f"cover at most {volume:,} of the {total:,} elements of the global size {size}"
        )
    return "torch-dist-chunk-overlap", (
        f"hold {volume:,} elements for a global size {size} of {total:,}: chunks overlap"
    )


def _grid_coverage(
    size: tuple[int, ...], chunks: list[_Chunk], bounds: list[list[int]]
) -> tuple[str, str] | None:
    counts = np.zeros([len(b) - 1 for b in bounds], dtype=np.int32)
    index = [{v: i for i, v in enumerate(b)} for b in bounds]
    for offsets, sizes in chunks:
        if 0 in sizes:
            continue
        box = tuple(
            slice(index[d][o], index[d][o + s])
            for d, (o, s) in enumerate(zip(offsets, sizes, strict=True))
        )
        counts[box] += 1
    widths = [np.diff(np.asarray(b, dtype=np.int64)) for b in bounds]
    cell_volume = np.ones(counts.shape, dtype=np.int64)
    for d, w in enumerate(widths):
        cell_volume = cell_volume * w.reshape([-1 if i == d else 1 for i in range(len(widths))])
    total = math.prod(size)
    missing = int(cell_volume[counts == 0].sum())
    if missing:
        cell = tuple(int(i) for i in np.argwhere(counts == 0)[0])
        at = tuple(bounds[d][i] for d, i in enumerate(cell))
        extent = tuple(int(widths[d][i]) for d, i in enumerate(cell))
        return "torch-dist-chunk-gap", (
            f"cover {total - missing:,} of the {total:,} elements of the global size {size}; "
            f"e.g. the block at offsets {at} with sizes {extent} is in no chunk"
        )
    doubled = int(cell_volume[counts > 1].sum())
    if doubled:
        cell = tuple(int(i) for i in np.argwhere(counts > 1)[0])
        at = tuple(bounds[d][i] for d, i in enumerate(cell))
        return "torch-dist-chunk-overlap", (
            f"overlap: {doubled:,} elements of the global size {size} are in more than one "
            f"chunk, e.g. at offsets {at}"
        )
    return None


# -- common-state drift (seed megatron-4448) ------------------------------------------------
#
# Keys relied on (Megatron-LM `RerunStateMachine.state_dict` and `save_checkpoint`):
#   common["rerun_state_machine"] = {"mode": RerunMode, "state": RerunState,
#                                    "current_iteration": int}  (newer: rank state sharded as
#   `rerun_state_machine_state/shard_{rank}_{world_size}`); older versions kept only "mode"
#   in common and sharded per (pp, tp) as `rerun_state_machine_state/shard_{pp}.{tp}_{PP}.{TP}`.
#   common["args"].world_size / tensor_model_parallel_size / pipeline_model_parallel_size.
# RerunState.NOT_RUNNING_YET == 0 and RerunMode.DISABLED == "disabled" mean nothing to restore.


def _check_common_drift(info: TorchDistInfo) -> list[Finding]:
    rerun = _field(info.common, "rerun_state_machine")
    if not isinstance(rerun, dict) or _enum(rerun.get("mode")) in (None, "disabled"):
        return []
    state = _enum(rerun.get("state"))
    if "state" in rerun and state in (0, "NOT_RUNNING_YET", None):
        return []
    present = {k[len(RERUN_PREFIX) :] for k in info.byte_keys if k.startswith(RERUN_PREFIX)}
    if "state" in rerun:
        world = _world_size(info, present)
        expected = {f"shard_{r}_{world}": r for r in range(world)} if world else {}
    else:
        expected = _pp_tp_grid(info.common)
    lost = sorted(rank for shard, rank in expected.items() if shard not in present)
    if present and not lost:
        return []
    return [
        _drift_finding(info, rerun, state, world_size=len(expected), lost=lost, present=present)
    ]


def _drift_finding(
    info: TorchDistInfo, rerun: dict, state: Any, *, world_size: int, lost: list, present: set
) -> Finding:
    common = info.common_file or "the common state"
    said = f"mode {_enum(rerun.get('mode'))}"
    if "state" in rerun:
        said += f", state {_state_name(state)}, iteration {rerun.get('current_iteration')}"
    if not present:
        has = f"has no {RERUN_PREFIX}shard_* entries"
    else:
        has = f"has {len(present)} {RERUN_PREFIX}shard_* entries"
    if lost and isinstance(lost[0], int):
        ranks = "rank" if len(lost) == 1 else "ranks"
        want = f"{ranks} {fold_ranges(lost)} missing ({len(lost)} of {world_size})"
    elif lost:
        shown = examples([str(x) for x in lost])
        want = f"(pp, tp) shards {shown} missing ({len(lost)} of {world_size})"
    else:
        want = "world size unknown, expected one per rank"
    key = f"{RERUN_PREFIX}shard_X_{world_size}" if world_size else f"{RERUN_PREFIX}shard_*"
    msg = (
        f"{common} says the rerun state machine is active ({said}) but {_meta_rel(info)} {has} "
        f"({want}); loading fails with 'Missing key in checkpoint state_dict: {key}'. "
        "The save reused a cached plan (--ckpt-assume-constant-structure): load with "
        "--rerun-mode disabled, or re-save with a Megatron that always emits the rerun state"
    )
    return make_finding("torch-dist-common-drift", msg, file=info.common_file or _meta_rel(info))


def _field(obj: Any, name: str) -> Any:
    """`obj[name]` of a dict, or the attribute of a pickled object (e.g. a Namespace)."""
    if isinstance(obj, dict):
        return obj.get(name)
    if isinstance(obj, PickledObject) and isinstance(obj.state, dict):
        return obj.state.get(name)
    return getattr(obj, name, None) if obj is not None and not isinstance(obj, (str, int)) else None


def _enum(value: Any) -> Any:
    """An enum member's value, whether pickled (Megatron not installed) or plain."""
    if isinstance(value, PickledObject):
        return value.args[0] if len(value.args) == 1 else None
    return getattr(value, "value", value)


_RERUN_STATES = {
    0: "NOT_RUNNING_YET",
    1: "INITIAL_RUN",
    2: "RERUNNING_IN_PLACE",
    3: "WILL_RERUN_FROM_CHECKPOINT",
    4: "RERUNNING_FROM_CHECKPOINT",
    5: "RERUNNING_AGAIN_FROM_CHECKPOINT",
}


def _state_name(state: Any) -> str:
    return _RERUN_STATES.get(state, str(state)) if isinstance(state, int) else str(state)


def _world_size(info: TorchDistInfo, present: set[str]) -> int | None:
    """From `args.world_size`, else from existing shard keys, else from `__{rank}_*.distcp`."""
    world = _field(_field(info.common, "args"), "world_size")
    if type(world) is int and world > 0:
        return world
    sizes = {int(m.group(1)) for k in present if (m := re.fullmatch(r"shard_\d+_(\d+)", k))}
    if len(sizes) == 1:
        return sizes.pop()
    ranks = {int(m.group(1)) for f in info.distcp_sizes if (m := _DISTCP_RANK.search(f))}
    return max(ranks) + 1 if ranks else None


def _pp_tp_grid(common: Any) -> dict[str, tuple[int, int]]:
    """Older Megatron: one rerun shard per (pp, tp) rank pair, from `args`."""
    args = _field(common, "args")
    pp = _field(args, "pipeline_model_parallel_size")
    tp = _field(args, "tensor_model_parallel_size")
    if not (type(pp) is int and type(tp) is int and pp > 0 and tp > 0):
        return {}
    return {f"shard_{p}.{t}_{pp}.{tp}": (p, t) for p in range(pp) for t in range(tp)}


# -- metadata.json ------------------------------------------------------------------------


def _check_metadata_json(scanned: ScannedCheckpoint, info: TorchDistInfo) -> list[Finding]:
    rel = _rel(info.iteration_dir, METADATA_JSON)
    if rel in scanned.json_files and info.metadata_json is None:
        return []  # unreadable: already a scan problem
    if not info.tensors and not info.byte_keys and not info.distcp_sizes:
        return []  # nothing of the checkpoint was found; the scan problems say why
    if info.metadata_json is None:
        msg = (
            f"{rel} is missing; Megatron needs it to recognise a torch_dist checkpoint: "
            'write {"sharded_backend": "torch_dist", "sharded_backend_version": 1, '
            '"common_backend": "torch", "common_backend_version": 1}'
        )
        return [make_finding("torch-dist-metadata-json", msg, file=rel)]
    backend = info.metadata_json.get("sharded_backend")
    if backend != "torch_dist":
        msg = (
            f"{rel} says sharded_backend {backend!r}, but the folder holds a DCP torch_dist "
            "checkpoint (.metadata and .distcp files); expected 'torch_dist': fix the file "
            "or Megatron will load it with the wrong strategy"
        )
        return [make_finding("torch-dist-metadata-json", msg, file=rel)]
    return []
