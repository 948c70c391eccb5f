"""Reading helpers shared by the layout readers: JSON files, the index, config, shards.

Every function returns plain data plus `ReadProblem`s; nothing here raises on bad input and
nothing here judges (the checks do).
"""

from __future__ import annotations

import os
import re
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from itertools import chain
from typing import Any, Literal, cast

import msgspec
import numpy as np

from inspector._internal.checkpoint.read_problems import FileRole, ProblemKind, ReadProblem
from inspector._internal.checkpoint.scanned import (
    IndexDoc,
    LayoutInfo,
    LayoutName,
    ScannedCheckpoint,
)
from inspector._internal.checkpoint.spec import SPEC_KEYS, ModelSpec, spec_from_config
from inspector._internal.common.columns import Coded, code_table, frozen
from inspector._internal.common.display import legible
from inspector._internal.common.filenames import CONFIG_NAME, QUANT_CONFIG_NAME, RECIPE_NAME
from inspector._internal.common.progress import track
from inspector._internal.common.text import examples, short_repr
from inspector._internal.findings.finding import FOLD
from inspector._internal.formats.recipe import RECIPE_CAP, QuantModifier, parse_recipe
from inspector._internal.formats.safetensors import (
    DEFAULT_HEADER_CAP,
    ShardHeader,
    header_span,
    read_shard,
)
from inspector._internal.storage import EntryKind, Location, TooLargeError, member_problem
from inspector.errors import UnsafeFileError

__all__ = [
    "JSON_CAP",
    "MAX_JSON_DEPTH",
    "ConfigFiles",
    "decode_json",
    "is_safe_member",
    "list_safetensors",
    "prefetch",
    "read_capped",
    "read_config_files",
    "read_index_doc",
    "read_json",
    "read_shards",
    "relative",
    "shard_names",
    "weight_map_columns",
]

# An index of 1.3M tensors is about 100 MB; anything far past that is not an index.
JSON_CAP = 1_000_000_000
# How deep arrays and objects may nest in a JSON file: real writers nest a few levels (a
# quantization config inside a text config inside config.json). Anything read stays well
# within what the code that walks and writes it back can take (orjson serialises 254 levels,
# Python's recursion limit is about 1,000, shared with the caller's own frames).
MAX_JSON_DEPTH = 128
# msgspec builds the Python objects straight from the bytes; orjson's intermediate document
# costs about 12x the file size at its peak, 1.2 GB for the index of a million tensors.
_DECODER = msgspec.json.Decoder()
# msgspec raises UnicodeDecodeError (not DecodeError) for bytes that are not UTF-8 inside a
# string; both mean "not valid JSON" here.
_NOT_JSON = (msgspec.DecodeError, UnicodeDecodeError)


def relative(path: Location, root: Location) -> str:
    return path.relative_to(root)


def read_json(path: Location, *, cap: int = JSON_CAP) -> tuple[Any, str | None, ProblemKind]:
    """(value, None, _) or (None, reason, kind). Through the storage: a regular file inside
    the folder only, at most `cap` bytes; kind UNSAFE_FILE when the storage refused it."""
    data, problem, kind = read_capped(path, cap, "JSON files")
    if data is None:
        return None, problem, kind
    value, problem = _decode(data)
    return value, problem, ProblemKind.UNREADABLE


def read_capped(
    path: Location, cap: int, what: str
) -> tuple[bytes | None, str | None, ProblemKind]:
    """(bytes, None, _) or (None, reason, kind): the whole file when it is at most `cap`
    bytes (`what` names the limit in the reason). Never raises for a bad file."""
    try:
        return path.read_bytes(cap=cap), None, ProblemKind.UNREADABLE
    except TooLargeError as exc:
        reason = f"is {exc.size:,} bytes, over the {exc.cap:,}-byte limit for {what}"
        return None, reason, ProblemKind.UNREADABLE
    except UnsafeFileError as exc:
        return None, f"{exc.reason}; not read", ProblemKind.UNSAFE_FILE
    except OSError as exc:
        return None, f"cannot be read ({exc.strerror or exc})", ProblemKind.UNREADABLE


def _decode(data: bytes) -> tuple[Any, str | None]:
    value, problem = decode_json(data)
    if problem is not None and problem != _TOO_DEEP:
        problem += "; it may have been truncated by a concurrent writer"
    return value, problem


_TOO_DEEP = (
    f"nests arrays and objects more than {MAX_JSON_DEPTH} levels deep, the limit for JSON "
    "files (writers nest a few); not read"
)


def decode_json(data: bytes | str) -> tuple[Any, str | None]:
    """(value, None) or (None, why not: "is not valid JSON (...)", or nested deeper than
    `MAX_JSON_DEPTH`). Every JSON file and JSON string a checkpoint holds is decoded here.

    The decoder recurses in C once per level and stops with RecursionError at Python's
    recursion limit (shared with the caller's frames): that error is a depth refusal too,
    and a decoded value is measured level by level (`_deeper_than`)."""
    try:
        value = _DECODER.decode(data)
    except _NOT_JSON as exc:
        return None, f"is not valid JSON ({exc})"
    except RecursionError:
        return None, _TOO_DEEP
    if _deeper_than(value, MAX_JSON_DEPTH):
        return None, _TOO_DEEP
    return value, None


def _deeper_than(value: Any, limit: int) -> bool:
    """True when `value` nests lists and dicts more than `limit` levels deep. One level at a
    time, no recursion; a container whose members hold no container (a weight map of a
    million strings) is passed over by one C-level pass over their types."""
    level = [value] if type(value) is dict or type(value) is list else []
    depth = 0
    while level:
        depth += 1
        if depth > limit:
            return True
        below: list[Any] = []
        for container in level:
            members = container.values() if type(container) is dict else container
            kinds = set(map(type, members))
            if dict in kinds or list in kinds:
                below.extend(m for m in members if type(m) is dict or type(m) is list)
        level = below
    return False


def list_safetensors(folder: Location) -> list[Location]:
    """The `.safetensors` entries directly in `folder`, sorted by name: files, and entries
    the storage refuses (a FIFO, a link leaving the folder, a link loop), listed so that
    reading them reports why instead of skipping them."""
    return [
        folder / e.name
        for e in folder.entries()
        if e.name.endswith(".safetensors") and e.kind is not EntryKind.DIR
    ]


def prefetch(
    shards: Sequence[Location],
    *,
    header_cap: int = DEFAULT_HEADER_CAP,
    side: Sequence[Location] = (),
) -> None:
    """Remote stores: every shard's header and the side files (whole, under the JSON cap),
    fetched at once with as many requests in flight as allowed, before any is parsed. The
    readers then read them from memory; a local storage has nothing to do."""
    items: list[tuple[Location, Any]] = [(p, partial(header_span, cap=header_cap)) for p in shards]
    items += [(p, JSON_CAP) for p in side]
    items = [(p, want) for p, want in items if p.refused is None]  # never fetched, reported
    by_storage: dict[int, list[tuple[Location, Any]]] = {}
    for item in items:
        by_storage.setdefault(id(item[0].storage), []).append(item)
    for group in by_storage.values():
        storage = group[0][0].storage
        storage.prefetch([(p.rel, want) for p, want in group], desc="headers")


def read_shards(
    paths: Sequence[Location], *, root: Location, header_cap: int = DEFAULT_HEADER_CAP
) -> tuple[ShardHeader, ...]:
    """Every header; a remote storage fetches them all at once first (`prefetch`)."""
    prefetch(paths, header_cap=header_cap)
    return tuple(
        read_shard(p, root=root, cap=header_cap)
        for p in track(paths, desc="shard headers", unit="file")
    )


def is_safe_member(value: str) -> bool:
    """True when a `weight_map` value names a file inside the checkpoint folder: the storage's
    rule for every member name (`member_problem`), and no leading `~` (a home folder to tools
    that expand it)."""
    return bool(value) and member_problem(value) is None and not value.startswith("~")


class ShardNames:
    """The tensor names of some shards, for `read_index_doc`: the index's names are taken
    from them, so that a name the index and a shard share is one string, not two (about 100
    bytes per tensor of a million).

    Writers list the index in the shards' order; then each run of index names equals the next
    run of shard names (one C-level list comparison) and no name is hashed. Otherwise a dict
    of the shard names not matched yet takes over for the rest: a drifted index (a layer left
    out near its end) hashes those few, not all 300,000 (0.05-0.1 s); a name matched before
    keeps its own string (an index listing a name twice, whose keys are dropped anyway).
    """

    def __init__(self, shards: Sequence[ShardHeader]) -> None:
        self.flat = list(chain.from_iterable(s.names for s in shards))
        self.at = 0
        self.table: dict[str, str] | None = None

    def __call__(self, keys: list[str]) -> list[str]:
        if self.table is None:
            run = self.flat[self.at : self.at + len(keys)]
            if run == keys:
                self.at += len(keys)
                return run
            rest = self.flat[self.at :]
            self.table = dict(zip(rest, rest, strict=True))
            del self.flat
        found = list(map(self.table.get, keys))
        if None in found:  # names no shard holds keep their own string
            return [f if f is not None else k for f, k in zip(found, keys, strict=True)]
        return cast(list[str], found)


def shard_names(shards: Sequence[ShardHeader]) -> ShardNames:
    """See `ShardNames`."""
    return ShardNames(shards)


def read_index_doc(
    path: Location,
    *,
    root: Location,
    role: FileRole = FileRole.INDEX,
    names: Callable[[list[str]], list[str]] | None = None,
    shard_files: Sequence[str] = (),
) -> tuple[IndexDoc | None, list[ReadProblem]]:
    """Parse an index or sidecar into columns. Unsafe `weight_map` paths are problems and
    are dropped, so nothing downstream ever follows them out of the folder. `names` (from
    `shard_names`) gives the strings to use for names the shards hold; `shard_files`, the
    files the index is expected to name (`weight_map_columns`)."""
    rel = relative(path, root)
    not_index = ReadProblem(rel, role, 'is not of the form {"weight_map": {tensor: file}}')
    data, problem, kind = read_capped(path, JSON_CAP, "JSON files")
    canonical = names or _same
    split = (
        weight_map_columns(data, canonical, shard_files=shard_files) if data is not None else None
    )
    value: Any
    if split is not None:
        value, keys, files = split
    else:
        if data is not None:
            value, problem = _decode(data)
        if problem is not None:
            return None, [ReadProblem(rel, role, problem, kind)]
        weight_map = value.get("weight_map") if isinstance(value, dict) else None
        if not isinstance(weight_map, dict):
            return None, [not_index]
        # Values repeat (hundreds of files for 300k tensors): coded once, each distinct one
        # validated once, and the per-entry strings freed with the decoded dict.
        keys = tuple(canonical(list(weight_map)))
        try:
            files = Coded.encode(weight_map.values(), len(keys))
        except TypeError:  # an object or list as a value: unhashable, and not a file name
            return None, [not_index]
        del weight_map
    del data
    if not all(type(v) is str for v in files.values):
        return None, [not_index]
    problems: list[ReadProblem] = []
    unsafe = [i for i, f in enumerate(files.values) if not is_safe_member(f)]
    if unsafe:
        keys, files, problems = _drop_unsafe(rel, role, keys, files, unsafe)
    metadata = value.get("metadata")
    document = {k: (None if k in ("weight_map", "metadata") else v) for k, v in value.items()}
    doc = IndexDoc(rel, keys, files, metadata if isinstance(metadata, dict) else {}, document)
    return doc, problems


def _same(keys: list[str]) -> list[str]:
    return keys


# The weight map of a large index is decoded in pieces (see `weight_map_columns`).
_PIECE_BYTES = 4 << 20
_WEIGHT_MAP = re.compile(rb'"weight_map"\s*:\s*\{')
_PIECE_DECODER = msgspec.json.Decoder(dict[str, str])
# The most shard files whose names are decoded as a Literal (`_files_decoder`). msgspec
# finds a Literal's string in an open-addressing table keyed by murmur2 with no seed, so
# a folder can hold files whose names share one hash (8-byte blocks solved for it, of
# letters, digits, `_` and `-`), and then each entry naming one walks past all of them:
# 60,000 such files took scan 35.6 CPU-s against 8.6 s with plain strings (15,000: 0.8 s
# more). With at most 128, 300,000 entries naming such files decode in 0.13 s against
# 0.09 s as plain strings; 128 files of writer names, 0.08 s.
_LITERAL_FILES = 128


def weight_map_columns(
    data: bytes,
    canonical: Callable[[list[str]], list[str]] = list,
    *,
    shard_files: Sequence[str] = (),
) -> tuple[dict[str, Any], tuple[str, ...], Coded[str]] | None:
    """(document without its weight map, names, files) of an index laid out as writers lay it
    out (one entry per line, `weight_map` the last key), decoded a few MB at a time; None for
    any other layout, which is then decoded whole.

    Why: decoded whole, every entry's file name is a string of its own that is freed once the
    names are coded; the freed strings sit between the kept names and the allocator cannot
    return that memory (about 100 bytes per tensor of a million-tensor index). In pieces, each
    piece reuses the memory the last one freed.

    Sound by construction: the document with the weight map replaced by a random marker must
    decode with the marker as its `weight_map`, and each piece, cut after a `,` that ends a
    line (a JSON string cannot hold a raw newline, so it is between two entries), must decode
    as an object of strings; pieces of members joined by commas are the members of the whole.

    `shard_files` (the files the index should name) are decoded as a Literal: msgspec gives
    each entry that names one of them the one string of its file, no string per entry and no
    hash per coding (10 ms at 300,000 tensors); from the first piece that names another
    file, every value is decoded as a string. Only up to `_LITERAL_FILES` files: more are
    decoded as strings from the start.
    """
    if len(data) < _PIECE_BYTES:
        return None
    # The last "weight_map" key: a writer puts the map last (a nested one comes earlier).
    found = _WEIGHT_MAP.match(data, max(data.rfind(b'"weight_map"'), 0))
    tail = data.rstrip()
    if found is None or not tail.endswith(b"}"):
        return None
    start = found.end()  # just past the weight map's "{"
    end = data.rfind(b"}", start, len(tail) - 1)  # its "}", when it is the last key
    if end < start:
        return None
    # What `secrets.token_hex` returns, without importing `secrets` (hmac, hashlib, random:
    # 5 ms of every scan's start).
    marker = os.urandom(16).hex()
    document, problem = _decode(data[: start - 1] + f'"{marker}"'.encode() + data[end + 1 :])
    if (
        problem is not None
        or not isinstance(document, dict)
        or document.get("weight_map") != marker
    ):
        return None
    names: list[str] = []
    codes: list[np.ndarray] = []
    index: defaultdict[str, int] = code_table()
    decoder = _files_decoder(shard_files)
    at = start
    while at < end:
        cut = data.find(b",\n", min(at + _PIECE_BYTES, end), end)
        stop = end if cut < 0 else cut
        text = b"{" + data[at:stop] + b"}"
        try:
            try:
                piece = decoder.decode(text)
            except msgspec.ValidationError:
                if decoder is _PIECE_DECODER:
                    raise
                decoder = _PIECE_DECODER
                piece = decoder.decode(text)
        except (*_NOT_JSON, msgspec.ValidationError):
            return None
        del text
        names.extend(canonical(list(piece)))
        codes.append(
            np.fromiter(map(index.__getitem__, piece.values()), dtype=np.int32, count=len(piece))
        )
        at = stop + 1
    if len(set(names)) != len(names):
        return None  # a name repeated across pieces: the whole decode says which entry wins
    all_codes = np.concatenate(codes) if codes else np.zeros(0, np.int32)
    return document, tuple(names), Coded(frozen(all_codes), tuple(index))


def _files_decoder(files: Sequence[str]) -> msgspec.json.Decoder[dict[str, str]]:
    """The decoder of weight map pieces whose values are among `files` (see
    `weight_map_columns`); the plain one without files or with more than `_LITERAL_FILES`."""
    distinct = tuple(dict.fromkeys(files))
    if not distinct or len(distinct) > _LITERAL_FILES:
        return _PIECE_DECODER
    known = Literal[distinct]  # type: ignore[valid-type]
    return msgspec.json.Decoder(dict[str, known])


def _drop_unsafe(
    rel: str, role: FileRole, names: tuple[str, ...], files: Coded[str], unsafe: list[int]
) -> tuple[tuple[str, ...], Coded[str], list[ReadProblem]]:
    """The entries whose file leaves the folder, removed; one problem per entry, bounded
    (a hostile index may hold millions: past `FOLD.per_code`, one problem for the rest)."""
    bad = np.isin(files.codes, unsafe)
    rows = np.flatnonzero(bad)
    problems = [
        ReadProblem(
            rel,
            role,
            f"maps '{legible(names[i])}' to '{legible(files[i])}', which leaves the checkpoint "
            "folder; "
            "expected a file name inside it (the entry is ignored)",
            ProblemKind.UNSAFE_PATH,
            tensor=names[i],
        )
        for i in rows[: FOLD.per_code].tolist()
    ]
    rest = rows[FOLD.per_code :].tolist()
    if rest:
        problems.append(
            ReadProblem(
                rel,
                role,
                f"maps {len(rest):,} more tensors to files outside the checkpoint folder "
                f"({examples([names[i] for i in rest[:3]])}); those entries are ignored",
                ProblemKind.UNSAFE_PATH,
            )
        )
    keep = np.flatnonzero(~bad)
    kept_names = tuple(names[i] for i in keep.tolist())
    # Re-coded, so that the unsafe names are gone from the table of files too.
    return kept_names, Coded.encode(files.take(keep).tolist()), problems


@dataclass(frozen=True, slots=True)
class ConfigFiles:
    """`config.json` and `hf_quant_config.json` of a folder, and what they say."""

    config: Mapping[str, Any] | None = None
    quant: Mapping[str, Any] | None = None
    spec: ModelSpec = field(default_factory=ModelSpec)
    found: frozenset[str] = frozenset()
    problems: tuple[ReadProblem, ...] = field(default_factory=tuple)
    recipe: tuple[QuantModifier, ...] | None = None


def folder_checkpoint(
    folder: Location,
    layout: LayoutName,
    info: LayoutInfo,
    shards: Sequence[ShardHeader],
    configs: ConfigFiles,
    *,
    index: IndexDoc | None = None,
    problems: Sequence[ReadProblem] = (),
    json_files: frozenset[str] = frozenset(),
) -> ScannedCheckpoint:
    """The checkpoint the files of `folder` make: its shards and index, with what its config
    files say (`configs`); `problems` and `json_files` are the layout's own."""
    return ScannedCheckpoint(
        path=folder.path,
        storage=folder.as_root(),
        layout=layout,
        info=info,
        shards=tuple(shards),
        index=index,
        config=configs.config,
        quant_config=configs.quant,
        spec=configs.spec,
        read_problems=(*problems, *configs.problems),
        recipe=configs.recipe,
        json_files=configs.found | json_files,
    )


def read_config_files(folder: Location, *, root: Location) -> ConfigFiles:
    """`config.json` and `hf_quant_config.json` in `folder` (names relative to `root`)."""
    found: set[str] = set()
    problems: list[ReadProblem] = []
    docs: dict[str, Any] = {}
    salvaged_spec = ModelSpec()
    for name, role in (
        (CONFIG_NAME, FileRole.CONFIG),
        (QUANT_CONFIG_NAME, FileRole.QUANT_CONFIG),
    ):
        path = folder / name
        if not path.is_file():
            continue
        rel = relative(path, root)
        found.add(rel)
        value, problem, kind = read_json(path)
        if problem is None and not isinstance(value, dict):
            problem = f"holds a JSON {type(value).__name__}, expected an object"
        if problem is not None:
            unsafe = kind is ProblemKind.UNSAFE_FILE
            salvaged = salvage_json_prefix(path) if role is FileRole.CONFIG and not unsafe else {}
            if salvaged:
                salvaged_spec = spec_from_config(salvaged, source=f"{rel} (salvaged)")
                keep = ", ".join(
                    f"{k}={short_repr(salvaged[k], limit=80)}" for k in SPEC_KEYS if k in salvaged
                )
                problem += f"; the structure checks use what its readable part says ({keep})"
            problems.append(ReadProblem(rel, role, problem, kind))
        else:
            docs[name] = value
    config = docs.get(CONFIG_NAME)
    spec = spec_from_config(config, source=CONFIG_NAME) if config is not None else salvaged_spec
    recipe = _read_recipe(folder, root, found, problems)
    return ConfigFiles(
        config, docs.get(QUANT_CONFIG_NAME), spec, frozenset(found), tuple(problems), recipe
    )


def _read_recipe(
    folder: Location, root: Location, found: set[str], problems: list[ReadProblem]
) -> tuple[QuantModifier, ...] | None:
    """llm-compressor's `recipe.yaml`, when there is one (its modifiers, bounded)."""
    path = folder / RECIPE_NAME
    if not path.is_file():
        return None
    rel = relative(path, root)
    found.add(rel)
    data, problem, kind = read_capped(path, RECIPE_CAP, "recipes")
    modifiers: tuple[QuantModifier, ...] = ()
    if data is not None:
        modifiers, problem = parse_recipe(data)
    if problem is not None:
        problems.append(ReadProblem(rel, FileRole.QUANT_CONFIG, problem, kind))
        return None
    return modifiers


_SCALAR = re.compile(rb'"(\w+)"\s*:\s*(-?\d+|true|false|"[^"\\]{0,4096}")\s*[,}\n]')


def salvage_json_prefix(path: Location, *, cap: int = 16_000_000) -> dict[str, Any]:
    """Scalar `"key": value` pairs from the readable part of a damaged JSON file.

    A config truncated by a concurrent writer usually still holds the counts we need (layers,
    experts); the first occurrence of each key wins, so top-level keys before nested ones.
    """
    try:
        with path.open() as reader:
            data = reader.read_range(0, min(reader.size(), cap))
    except (OSError, UnsafeFileError):
        return {}
    out: dict[str, Any] = {}
    for match in _SCALAR.finditer(data):
        key = match.group(1).decode("ascii", "replace")
        if key in out:
            continue
        try:
            out[key] = _DECODER.decode(match.group(2))
        except _NOT_JSON:
            continue
    return {k: v for k, v in out.items() if k in SPEC_KEYS}
