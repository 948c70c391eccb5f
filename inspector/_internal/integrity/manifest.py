"""The content manifest: what a checkpoint held when it was written, as one versioned JSON file
(per file: size and SHA-256; per tensor: dtype, shape, file and an xxh3-128 content hash of
its row-major bytes, so differently sharded checkpoints compare tensor by tensor).

A manifest is untrusted: `parse_manifest` reads it under caps and refuses it whole at the
first bad entry (`ManifestError`): a manifest partly wrong cannot vouch for anything. The
rules (`check_member`'s one spelling per file...): docs/verify.md.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec

from inspector._internal.common.display import legible
from inspector._internal.formats.tensordata import TENSOR_HASH
from inspector._internal.layouts._common import decode_json
from inspector._internal.storage import check_member, member_problem

__all__ = [
    "FORMAT",
    "MANIFEST_CAP",
    "MAX_NAME",
    "TENSOR_HASH",
    "VERSION",
    "FileRecord",
    "Manifest",
    "ManifestError",
    "TensorRecord",
    "manifest_bytes",
    "parse_manifest",
]

FORMAT = "checkpoint-inspector-manifest"
VERSION = 1
# The largest manifest read: a 1M-tensor checkpoint's manifest is about 250 MB of JSON. The
# decoded form is what bounds memory; past these counts no real checkpoint goes.
MANIFEST_CAP = 512 << 20
MAX_FILES = 1_000_000
MAX_TENSORS = 4_000_000
MAX_NAME = 4096
MAX_DIMS = 64
_SHA256 = re.compile(r"[0-9a-f]{64}")
_XXH128 = re.compile(r"[0-9a-f]{32}")
_DTYPE = re.compile(r"[A-Za-z0-9_]{1,32}")


class ManifestError(ValueError):
    """A manifest that cannot be used: the reason is a clause that follows the file's name."""


@dataclass(frozen=True, slots=True)
class FileRecord:
    """A file's size and SHA-256. A manifest always records the SHA-256; None only for what
    another source records (a Hub listing entry without a checksum, or with the git SHA-1
    `verify` keeps beside it): such a file is never "match" by its size alone."""

    size: int
    sha256: str | None = None


@dataclass(frozen=True, slots=True)
class TensorRecord:
    dtype: str
    shape: tuple[int, ...]
    file: str
    hash: str | None = None


@dataclass(frozen=True, slots=True)
class Manifest:
    """Files (relative POSIX path -> size, SHA-256) and tensors (name -> dtype, shape, file,
    content hash). `created` is an ISO 8601 UTC time; `tool` what wrote it."""

    files: Mapping[str, FileRecord]
    tensors: Mapping[str, TensorRecord] = field(default_factory=dict)
    created: str = ""
    tool: str = ""
    tensor_hash: str = TENSOR_HASH

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "version": VERSION,
            "created": self.created,
            "tool": self.tool,
            "tensor_hash": self.tensor_hash,
            "files": {
                name: {"size": r.size, "sha256": r.sha256} for name, r in sorted(self.files.items())
            },
            "tensors": {
                name: {"dtype": t.dtype, "shape": list(t.shape), "file": t.file, "hash": t.hash}
                for name, t in sorted(self.tensors.items())
            },
        }


def manifest_bytes(manifest: Manifest) -> bytes:
    """The manifest as the JSON file holds it (keys sorted, one entry per line)."""
    return msgspec.json.format(msgspec.json.encode(manifest.to_json()), indent=1) + b"\n"


def parse_manifest(data: bytes) -> Manifest:
    """The manifest `data` holds; ManifestError says what is wrong with it."""
    if len(data) > MANIFEST_CAP:
        raise ManifestError(f"is {len(data):,} bytes, over the {MANIFEST_CAP:,}-byte limit")
    value, problem = decode_json(data)
    if problem is not None:
        raise ManifestError(problem)
    if not isinstance(value, dict) or value.get("format") != FORMAT:
        raise ManifestError(f'is not a checkpoint manifest (expected "format": "{FORMAT}")')
    version = value.get("version")
    if version != VERSION:
        raise ManifestError(
            f"has version {_shown(version)}; this checkpoint-inspector reads version {VERSION} "
            "(upgrade it, or write the manifest again with `ckpt-inspect manifest`)"
        )
    algorithm = value.get("tensor_hash", TENSOR_HASH)
    if algorithm != TENSOR_HASH:
        raise ManifestError(f'has tensor_hash {_shown(algorithm)}; expected "{TENSOR_HASH}"')
    files = _files(value.get("files"))
    tensors = _tensors(value.get("tensors", {}), files)
    _no_repeated_keys(data, value)
    created, tool = value.get("created", ""), value.get("tool", "")
    return Manifest(
        files,
        tensors,
        created=legible(created, limit=64) if isinstance(created, str) else "",
        tool=legible(tool, limit=128) if isinstance(tool, str) else "",
    )


def _files(raw: Any) -> dict[str, FileRecord]:
    if not isinstance(raw, dict):
        raise ManifestError('has no "files" object')
    if len(raw) > MAX_FILES:
        raise ManifestError(f"lists {len(raw):,} files, over the limit of {MAX_FILES:,}")
    out: dict[str, FileRecord] = {}
    for name, rec in raw.items():
        where = f"file '{legible(name)}'"
        _name(name, where)
        problem = member_problem(name)
        if problem is not None:
            raise ManifestError(
                f"names {where}, which {problem}; a manifest may only name files inside the "
                "checkpoint folder"
            )
        # One spelling per file: `a/./b`, `./a`, `a//b` or `a/` would be a second entry for
        # a file the folder lists once (as `check_member` spells it), and `manifest` never
        # writes them.
        plain = check_member(name)
        if plain != name:
            raise ManifestError(
                f"names {where}, which is not in normal form (the folder lists it as "
                f"'{legible(plain)}'); a manifest spells each file one way: relative, '/' "
                "between names, no empty or '.' part"
            )
        if not isinstance(rec, dict):
            raise ManifestError(f"has no size for {where}")
        size, sha = rec.get("size"), rec.get("sha256")
        if type(size) is not int or size < 0:
            raise ManifestError(f"gives {where} the size {_shown(size)}; expected bytes >= 0")
        # Required: `manifest` records every file's SHA-256, and a file without one would be
        # compared by its size alone, which vouches for nothing.
        if not (isinstance(sha, str) and _SHA256.fullmatch(sha)):
            raise ManifestError(f"gives {where} the sha256 {_shown(sha)}; expected 64 hex digits")
        out[name] = FileRecord(size, sha)
    return out


def _tensors(raw: Any, files: Mapping[str, FileRecord]) -> dict[str, TensorRecord]:
    if not isinstance(raw, dict):
        raise ManifestError('has a "tensors" entry that is not an object')
    if len(raw) > MAX_TENSORS:
        raise ManifestError(f"lists {len(raw):,} tensors, over the limit of {MAX_TENSORS:,}")
    out: dict[str, TensorRecord] = {}
    for name, rec in raw.items():
        where = f"tensor '{legible(name)}'"
        _name(name, where)
        if not isinstance(rec, dict):
            raise ManifestError(f"has no record for {where}")
        dtype, shape, file, digest = (rec.get(k) for k in ("dtype", "shape", "file", "hash"))
        if not (isinstance(dtype, str) and _DTYPE.fullmatch(dtype)):
            raise ManifestError(f"gives {where} the dtype {_shown(dtype)}")
        if (
            not isinstance(shape, list)
            or len(shape) > MAX_DIMS
            or any(type(d) is not int or d < 0 for d in shape)
        ):
            raise ManifestError(f"gives {where} the shape {_shown(shape)}")
        if not isinstance(file, str) or file not in files:
            raise ManifestError(f"puts {where} in {_shown(file)}, a file it does not list")
        if digest is not None and not (isinstance(digest, str) and _XXH128.fullmatch(digest)):
            raise ManifestError(f"gives {where} the hash {_shown(digest)}; expected 32 hex digits")
        out[name] = TensorRecord(dtype, tuple(shape), file, digest)
    return out


def _no_repeated_keys(data: bytes, value: Any) -> None:
    """Refuse a key given twice in one object (a file or tensor listed twice, a size given
    twice, two "files" objects...): the decoder keeps the last silently, so what a person
    reads in the file would not be what is verified. Every key of every object ends with a
    quote followed by a colon (white space between), so the bytes hold at least as many
    such matches as keys, and the decoded objects as many members as keys only when no key
    repeats: when the matches are exactly the decoded members, no key repeats. Otherwise (a
    key given twice, or a string that holds a quote and a colon) the document is decoded
    again, pair by pair, to find out."""
    ends = data.count(b'":') + sum(1 for _ in _SPACED_KEY_END.finditer(data))
    if ends == _members(value):
        return
    repeated: list[str] = []

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        out = dict(items)
        if len(out) != len(items) and not repeated:
            seen: set[str] = set()
            for key, _ in items:
                if key in seen:
                    repeated.append(key)
                    break
                seen.add(key)
        return out

    try:  # decoded once already: valid JSON, nested within the bounds
        json.loads(data, object_pairs_hook=pairs)
    except (ValueError, RecursionError) as exc:
        raise ManifestError(f"is not valid JSON ({legible(str(exc), limit=200)})") from None
    if repeated:
        raise ManifestError(
            f"gives the key '{legible(repeated[0])}' twice in one object; a manifest lists "
            "each file and tensor once"
        )


# The end of an object key: its closing quote, white space, the colon (RFC 8259); without
# the white space (what `manifest` writes) it is counted with `bytes.count`.
_SPACED_KEY_END = re.compile(rb'"[ \t\n\r]+:')


def _members(value: dict[str, Any]) -> int:
    """How many members the objects of a decoded manifest hold, or fewer: the records of
    "files" and "tensors" (dicts by now, `_files` and `_tensors`) are counted without what
    they nest, which no manifest `manifest` writes holds, so counting it would only cost
    time. Never more than the document holds: a count short of the keys' ends only sends
    `_no_repeated_keys` the slow way."""
    count = len(value)
    for key, item in value.items():
        if key in ("files", "tensors") and isinstance(item, dict):
            count += len(item) + sum(map(len, item.values()))
            continue
        stack = [item]
        while stack:
            part = stack.pop()
            if isinstance(part, dict):
                count += len(part)
                stack.extend(part.values())
            elif isinstance(part, list):
                stack.extend(part)
    return count


def _name(name: str, where: str) -> None:
    if not name or len(name) > MAX_NAME or "\x00" in name:
        raise ManifestError(
            f"has a {where.split(' ')[0]} name that is empty, has a NUL or is "
            f"over {MAX_NAME:,} characters"
        )


def _shown(value: Any) -> str:
    return f"'{legible(repr(value), limit=80)}'"
