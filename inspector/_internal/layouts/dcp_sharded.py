"""`dcp-sharded`: safetensors written by PyTorch DCP's `HuggingFaceStorageWriter` with
`save_distributed=True`, as NeMo AutoModel does (docs/formats.md, "DCP-sharded safetensors").
Each chunk's `saved_offsets` come from `DCP_SHARDING_INFO`; the full shape is the element-wise
max of offset + chunk shape. This module reads; `checks.dcp` judges. Which folder is
scanned: docs/architecture.md, "layouts/".
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass
from itertools import pairwise
from math import prod
from operator import add
from pathlib import Path
from typing import Any

import numpy as np

from inspector._internal.checkpoint.naming_rules import DCP_SHARD_FILE
from inspector._internal.checkpoint.read_problems import FileRole, ProblemKind, ReadProblem
from inspector._internal.checkpoint.scanned import (
    ChunkTable,
    DcpInfo,
    DcpReference,
    IndexDoc,
    LayoutName,
    LogicalTensors,
    ScannedCheckpoint,
)
from inspector._internal.common.columns import Coded, frozen
from inspector._internal.common.display import legible
from inspector._internal.common.dtypes import nbytes_for
from inspector._internal.common.filenames import (
    CONFIG_NAME,
    DCP_MAPPING_NAME,
    HF_METADATA_DIR,
    INDEX_NAME,
)
from inspector._internal.common.gc import gc_paused
from inspector._internal.common.text import examples, plural, short_repr
from inspector._internal.formats.safetensors import DEFAULT_HEADER_CAP, ShardHeader, read_shard
from inspector._internal.layouts._common import (
    ConfigFiles,
    decode_json,
    list_safetensors,
    prefetch,
    read_config_files,
    read_index_doc,
    read_json,
    read_shards,
    relative,
)
from inspector._internal.layouts.base import LayoutReader, ScanOptions
from inspector._internal.layouts.expected_shapes import raised_shapes
from inspector._internal.storage import Location, check_member, hf_cache_snapshots, local_location
from inspector.errors import UnsafeFileError

__all__ = [
    "LAYOUT",
    "SHARDING_KEY",
    "chunk_table",
    "detect",
    "find_reference",
    "find_stored_reference",
    "logical_tensors",
    "resolve_reference",
    "scan",
]

NAME = LayoutName.DCP_SHARDED
SHARDING_KEY = "DCP_SHARDING_INFO"


# -- detect ----------------------------------------------------------------------------------


def detect(path: Location) -> bool:
    """A DCP-sharded folder, or a checkpoint folder whose `model/` subfolder is one. Cheap:
    file names first, at most one header read."""
    if not path.is_dir():
        return False
    return _dcp_folder(path) is not None


def _dcp_folder(path: Location) -> Location | None:
    if _looks_dcp(path):
        return path
    model = path / "model"
    if not list_safetensors(path) and model.is_dir() and _looks_dcp(model):
        return model
    return None


def _looks_dcp(folder: Location) -> bool:
    files = list_safetensors(folder)
    if any(DCP_SHARD_FILE.match(p.name) for p in files):
        return True
    if (folder / HF_METADATA_DIR).is_dir() and (
        files or (folder / HF_METADATA_DIR / DCP_MAPPING_NAME).is_file()
    ):
        return True
    if not files or (folder / INDEX_NAME).is_file():
        return False  # DCP's writer leaves no index next to its files
    # Renamed files: the first header tells. Only this one header is read.
    first = read_shard(files[0], root=folder)
    return SHARDING_KEY in (first.metadata or {})


# -- scan ------------------------------------------------------------------------------------


def scan(path: Location, options: ScanOptions) -> ScannedCheckpoint:
    """Read every shard header, the sharding info, `.hf_metadata/` (config, mapping, the
    reference index if kept), and rebuild each tensor's full shape from its chunks."""
    # 1. Which folder, and every header in it.
    folder = _dcp_folder(path) if path.is_dir() else None
    folder = folder or (path if path.is_dir() else path.parent)
    named = folder  # in the storage of the folder the user named
    # Every file is named relative to the DCP folder, read in a storage rooted there (with
    # the confinement of the folder the user named).
    folder = Location(folder.as_root())
    files = list_safetensors(folder)
    kept = folder / HF_METADATA_DIR
    side = [kept / n for n in (DCP_MAPPING_NAME, CONFIG_NAME, INDEX_NAME)]
    prefetch(files, header_cap=options.header_cap, side=[*side, folder / CONFIG_NAME])
    shards = read_shards(files, root=folder, header_cap=options.header_cap)
    # 2. Chunks from DCP_SHARDING_INFO, and the full shapes they imply.
    table, chunk_problems = chunk_table(shards)
    # 3. `.hf_metadata/`: mapping, config, reference index; the upstream checkpoint.
    meta = _read_hf_metadata(folder)
    # The upstream checkpoint: on this machine beside a local checkpoint, in the same store
    # (inside the folder the user named) beside a remote one.
    here = folder.path
    reference = (
        find_reference(here, meta.configs.config, header_cap=options.header_cap)
        if isinstance(here, Path)
        else find_stored_reference(named, meta.configs.config, header_cap=options.header_cap)
    )
    # 4. Every other source of the full shapes: a lost last rank shrinks the chunks' extent.
    full, sources = raised_shapes(
        table.names,
        table.full.tolist(),
        table.dtype.take(table.starts[:-1]).tolist(),
        config=meta.configs.config,
        spec=meta.configs.spec,
        reference=reference.shapes if reference else None,
        reference_label=reference.label if reference else "",
    )
    if sources:
        table = dataclasses.replace(table, full=Coded.encode(full, len(full)))
    dcp = DcpInfo(
        table,
        mapping=meta.mapping,
        mapping_file=meta.mapping_file,
        hf_metadata_dir=HF_METADATA_DIR if (folder / HF_METADATA_DIR).is_dir() else None,
        reference=reference,
        shape_sources=sources,
    )
    return ScannedCheckpoint(
        path=folder.path,
        storage=folder.storage,
        layout=NAME,
        info=dcp,
        shards=shards,
        index=meta.index,
        config=meta.configs.config,
        quant_config=meta.configs.quant,
        spec=meta.configs.spec,
        logical=logical_tensors(table),
        read_problems=(*chunk_problems, *meta.problems),
        json_files=frozenset(meta.found),
    )


@dataclass(frozen=True, slots=True)
class _HfMetadata:
    mapping: dict[str, int] | None
    mapping_file: str | None
    configs: ConfigFiles
    index: IndexDoc | None
    found: set[str]
    problems: list[ReadProblem]


def _read_hf_metadata(folder: Location) -> _HfMetadata:
    """NeMo's `.hf_metadata/`; config files directly in the folder when it is absent."""
    meta = folder / HF_METADATA_DIR
    mapping, mapping_file, problems = _read_mapping(meta / DCP_MAPPING_NAME, root=folder)
    config_dir = meta if (meta / CONFIG_NAME).is_file() else folder
    configs = read_config_files(config_dir, root=folder)
    problems.extend(configs.problems)
    found = set(configs.found)
    index: IndexDoc | None = None
    if (meta / INDEX_NAME).is_file():
        index, index_problems = read_index_doc(meta / INDEX_NAME, root=folder)
        problems.extend(index_problems)
        found.add(f"{HF_METADATA_DIR}/{INDEX_NAME}")
    if mapping_file is not None:
        found.add(mapping_file)
    return _HfMetadata(mapping, mapping_file, configs, index, found, problems)


# -- the reference checkpoint ---------------------------------------------------------------

# NeMo AutoModel's consolidation script names the upstream model: `--model-name "org/name"`.
CONSOLIDATE_SCRIPT = "consolidate.sh"
_MODEL_NAME = re.compile(r"""--model-name[= ]+["']?([^"'\s]+)["']?""")
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
_SCRIPT_CAP = 1_000_000


def find_reference(
    folder: Path, config: Mapping[str, Any] | None, *, header_cap: int = DEFAULT_HEADER_CAP
) -> DcpReference | None:
    """The upstream checkpoint the run names, when it is on this machine: its index and
    shard headers (read like the checkpoint's own: capped, regular files only).

    Names come from `consolidate.sh --model-name` (beside the checkpoint or in the run
    folder) and `config.json` `_name_or_path`. A relative name is looked up in the run
    folder (the checkpoint's parent, where the script runs) and the checkpoint folder; a hub
    id also in the Hugging Face cache (`$HF_HUB_CACHE`, `$HF_HOME/hub`,
    `~/.cache/huggingface/hub`: snapshots link to blobs there, as the cache is built)."""
    scripts = [
        (local_location(folder / CONSOLIDATE_SCRIPT), CONSOLIDATE_SCRIPT),
        (local_location(folder.parent / CONSOLIDATE_SCRIPT), f"../{CONSOLIDATE_SCRIPT}"),
    ]
    for name, named_by in _reference_names(scripts, config):
        path = resolve_reference(name, folder)
        if path is not None:
            return _read_reference(local_location(path), str(path), named_by, header_cap)
    return None


def find_stored_reference(
    folder: Location, config: Mapping[str, Any] | None, *, header_cap: int = DEFAULT_HEADER_CAP
) -> DcpReference | None:
    """`find_reference` for a checkpoint in a remote store: the same names, looked up as
    relative paths in the run folder and the checkpoint folder of the same store, never
    above the folder the user named (a remote checkpoint has no "this machine" beside it)."""
    run = folder.parent if folder.rel else None
    scripts = [(folder / CONSOLIDATE_SCRIPT, CONSOLIDATE_SCRIPT)]
    if run is not None:
        scripts.append((run / CONSOLIDATE_SCRIPT, f"../{CONSOLIDATE_SCRIPT}"))
    for name, named_by in _reference_names(scripts, config):
        try:
            rel = check_member(name) if len(name) <= 4096 else ""
        except ValueError:
            continue  # absolute or leaving the store: nothing of this store
        for base in [b for b in (run, folder) if b is not None and rel]:
            where = base / rel
            if where.rel != folder.rel and where.is_dir() and _holds_checkpoint(where):
                return _read_reference(Location(where.as_root()), str(where), named_by, header_cap)
    return None


def _reference_names(
    scripts: list[tuple[Location, str]], config: Mapping[str, Any] | None
) -> list[tuple[str, str]]:
    names: list[tuple[str, str]] = []
    for script, where in scripts:
        text = _small_text(script, _SCRIPT_CAP)
        if text is not None:
            names += [(m.group(1), f"{where} --model-name") for m in _MODEL_NAME.finditer(text)]
    value = config.get("_name_or_path") if isinstance(config, Mapping) else None
    if isinstance(value, str) and value:
        names.append((value, "config.json _name_or_path"))
    return list(dict.fromkeys(names))


def _small_text(path: Location, cap: int) -> str | None:
    """The first `cap` bytes of a file as text (through its storage: a regular file that
    does not link out of its folder), or None."""
    try:
        with path.open() as reader:
            return reader.read_range(0, min(reader.size(), cap)).decode("utf-8", "replace")
    except (OSError, UnsafeFileError):
        return None


def resolve_reference(name: str, folder: Path) -> Path | None:
    """The checkpoint folder a model name (`--model-name`, `_name_or_path`) stands for on this
    machine: an absolute path, a path relative to the run folder (`folder`'s parent) or
    `folder`, or a hub id's snapshot in the Hugging Face cache; never `folder` itself."""
    if "\x00" in name or len(name) > 4096:
        return None
    raw = Path(name).expanduser()
    if raw.is_absolute():
        candidates = [raw]
    elif ".." in raw.parts:
        return None
    else:
        candidates = [folder.parent / raw, folder / raw]
        if _HUB_ID.fullmatch(name):
            candidates += hf_cache_snapshots(name)
    here = folder.resolve()
    for path in candidates:
        try:
            if path.is_dir() and path.resolve() != here and _holds_checkpoint(local_location(path)):
                return path
        except OSError:
            continue
    return None


def _holds_checkpoint(folder: Location) -> bool:
    return (folder / INDEX_NAME).is_file() or bool(list_safetensors(folder))


def _quoted(value: object) -> str:
    """A JSON value as written: a string in quotes (`'2'` is not the number 2), bounded."""
    if isinstance(value, str):
        return f"'{legible(value, limit=80)}'"
    return short_repr(value, limit=80)


def _read_reference(folder: Location, shown: str, named_by: str, header_cap: int) -> DcpReference:
    """Read like a checkpoint of its own: through a storage rooted at the reference folder,
    so its links may not leave it either. `shown`: where it is, as people see it."""
    index = None
    if (folder / INDEX_NAME).is_file():
        index, _ = read_index_doc(folder / INDEX_NAME, root=folder)
        # Named by where it is: it is not a file of the checkpoint.
        index = dataclasses.replace(index, file=f"{shown}/{INDEX_NAME}") if index else None
    shapes: dict[str, tuple[int, ...]] = {}
    for shard in read_shards(list_safetensors(folder), root=folder, header_cap=header_cap):
        if shard.readable:
            for name, shape in zip(shard.names, shard.shapes, strict=True):
                shapes.setdefault(name, tuple(shape))
    return DcpReference(shown, named_by, index, shapes)


# -- chunks ----------------------------------------------------------------------------------


def chunk_table(shards: tuple[ShardHeader, ...]) -> tuple[ChunkTable, list[ReadProblem]]:
    """Every tensor's chunks, in file order, from each shard's sharding info, as one
    columnar table (tensors in order of first appearance). Pure."""
    with gc_paused():
        return _chunk_table(shards)


def _chunk_table(shards: tuple[ShardHeader, ...]) -> tuple[ChunkTable, list[ReadProblem]]:
    problems: list[ReadProblem] = []
    # Offsets repeat across ranks and experts: valid ones are checked once, kept once.
    valid: dict[tuple[Any, ...], tuple[int, ...]] = {}
    names: list[str] = []
    offsets: list[tuple[int, ...]] = []
    files: list[str] = []
    per_shard: list[np.ndarray] = []
    taken: list[ShardHeader] = []
    for shard in shards:
        if not shard.readable:
            continue  # the header reader already reported it
        info, problem = _sharding_info(shard)
        if problem is not None:
            problems.append(ReadProblem(shard.file, FileRole.DCP_SHARDING_INFO, problem))
            continue
        rows: list[int] = []
        missing: list[str] = []
        wrong_rank: list[str] = []
        shapes = shard.shape
        for row, name in enumerate(shard.names):
            found = _offsets(info.get(name), valid)
            if found is None:
                missing.append(name)
            elif len(found) != len(dims := shapes[row]):
                wrong_rank.append(f"{legible(name)} (offsets {list(found)} for shape {list(dims)})")
            else:
                rows.append(row)
                names.append(name)
                offsets.append(found)
        problems.extend(_offset_problems(shard.file, missing, wrong_rank))
        per_shard.append(np.asarray(rows, dtype=np.int64))
        taken.append(shard)
        files.append(shard.file)
    tensor = Coded.encode(names, len(names))
    # Rows of one tensor together, file order kept within (a stable sort).
    order = np.argsort(tensor.codes, kind="stable")
    counts = np.bincount(tensor.codes, minlength=len(tensor.values))
    starts = frozen(np.concatenate([[0], np.cumsum(counts)]).astype(np.int64))
    sizes = [len(r) for r in per_shard]
    file = Coded(np.repeat(np.arange(len(files), dtype=np.int32), sizes), tuple(files))
    dtype = Coded.concat([s.dtype.take(r) for s, r in zip(taken, per_shard, strict=True)])
    shape = Coded.concat([s.shape.take(r) for s, r in zip(taken, per_shard, strict=True)])
    place = Coded.encode(offsets, len(offsets))
    file, dtype = file.take(order), dtype.take(order)
    shape, place = shape.take(order), place.take(order)
    full = _full_shapes(starts, place, shape)
    table = ChunkTable(tensor.values, starts, file, dtype, place, shape, full)
    return table, problems


def _full_shapes(
    starts: np.ndarray, place: Coded[tuple[int, ...]], shape: Coded[tuple[int, ...]]
) -> Coded[tuple[int, ...]]:
    """Per tensor, the element-wise max of offset + shape over its chunks with the first
    chunk's number of dimensions (others are a conflict the checks report). Tensors sharded
    alike share a chunk pattern, so each pattern is computed once."""
    offsets, shapes = place.values, shape.values
    pair = place.codes.astype(np.int64) * max(len(shapes), 1) + shape.codes
    bounds = starts.tolist()
    pairs = pair.tolist()
    known: dict[tuple[int, ...], tuple[int, ...]] = {}
    out: list[tuple[int, ...]] = []
    width = max(len(shapes), 1)
    for lo, hi in pairwise(bounds):
        key = tuple(pairs[lo:hi])
        full = known.get(key)
        if full is None:
            chunks = [(offsets[k // width], shapes[k % width]) for k in key]
            ndim = len(chunks[0][1])
            ends = [map(add, o, s) for o, s in chunks if len(s) == ndim]
            full = known[key] = tuple(map(max, zip(*ends, strict=True)))
        out.append(full)
    return Coded.encode(out, len(out))


def _sharding_info(shard: ShardHeader) -> tuple[dict[str, Any], str | None]:
    raw = (shard.metadata or {}).get(SHARDING_KEY)
    if raw is None:
        return {}, (
            f"has no {SHARDING_KEY} in __metadata__, so its {len(shard.names)} tensors "
            "cannot be placed in the full tensors"
        )
    info, problem = decode_json(raw)
    if problem is not None:
        return {}, f"has a {SHARDING_KEY} that {problem}"
    if not isinstance(info, dict):
        kind = type(info).__name__
        return {}, (
            f"has a {SHARDING_KEY} that is a JSON {kind}, expected an object "
            '{tensor: {"saved_offsets": [...]}}'
        )
    return info, None


def _offsets(
    entry: object, valid: dict[tuple[Any, ...], tuple[int, ...]]
) -> tuple[int, ...] | None:
    """The entry's saved_offsets as a tuple of non-negative ints, or None."""
    offsets = entry.get("saved_offsets") if type(entry) is dict else None
    if type(offsets) is not list:
        return None
    key = tuple(offsets)
    known = valid.get(key)
    if known is not None:
        return known
    if not all(type(o) is int and o >= 0 for o in key):
        return None
    # Only valid tuples are remembered, so an invalid one is never mistaken for a valid one.
    valid[key] = key
    return key


def _offset_problems(file: str, missing: list[str], wrong_rank: list[str]) -> list[ReadProblem]:
    out = []
    role, kind = FileRole.DCP_SHARDING_INFO, ProblemKind.INVALID_ENTRIES
    if missing:
        out.append(
            ReadProblem(
                file,
                role,
                f"has a {SHARDING_KEY} with no valid saved_offsets (a list of non-negative "
                f"integers) for {plural(len(missing), 'tensor')} the file holds: "
                f"{examples(missing)}; these chunks cannot be placed",
                kind,
                tensor=missing[0] if len(missing) == 1 else None,
            )
        )
    if wrong_rank:
        out.append(
            ReadProblem(
                file,
                role,
                "has saved_offsets whose length differs from the chunk's number of dimensions "
                f"for {plural(len(wrong_rank), 'tensor')}: {examples(wrong_rank)}",
                kind,
                tensor=wrong_rank[0].split(" ")[0] if len(wrong_rank) == 1 else None,
            )
        )
    return out


def logical_tensors(table: ChunkTable) -> LogicalTensors:
    """One row per logical tensor: full shape and bytes; file is the first chunk's file."""
    first = table.starts[:-1]
    dtype = table.dtype.take(first)
    shapes = table.full.tolist()
    nbytes = [nbytes_for(d, prod(s)) or 0 for d, s in zip(dtype.tolist(), shapes, strict=True)]
    return LogicalTensors(
        table.names, table.file.take(first), dtype, table.full, np.asarray(nbytes)
    )


# -- the file-index mapping ------------------------------------------------------------------


def _read_mapping(
    path: Location, *, root: Location
) -> tuple[dict[str, int] | None, str | None, list[ReadProblem]]:
    """`fqn_to_file_index_mapping.json`: {fqn: 1-based output index}. Entries whose value is
    not a positive integer are problems and dropped."""
    if not path.is_file():
        return None, None, []
    rel = relative(path, root)
    value, problem, kind = read_json(path)
    if problem is None and not isinstance(value, dict):
        problem = (
            f"holds a JSON {type(value).__name__}, expected an object {{tensor: output index}}"
        )
    if problem is not None:
        return None, rel, [ReadProblem(rel, FileRole.MAPPING, problem, kind)]
    mapping = {k: v for k, v in value.items() if type(v) is int and v >= 1}
    bad = [k for k in value if k not in mapping]
    if not bad:
        return mapping, rel, []
    shown = ", ".join(f"{legible(k)}={_quoted(value[k])}" for k in bad[:3])
    more = f" and {len(bad) - 3:,} more" if len(bad) > 3 else ""
    reason = (
        f"has {plural(len(bad), 'value')} that {'is' if len(bad) == 1 else 'are'} not positive "
        "1-based output file indices: "
        f"{shown}{more}; those tensors have no output file"
    )
    return mapping, rel, [ReadProblem(rel, FileRole.MAPPING, reason, ProblemKind.INVALID_ENTRIES)]


LAYOUT = LayoutReader(NAME, detect, scan)
