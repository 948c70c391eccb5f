"""`verify`: are a checkpoint's bytes what its source recorded? And `write_manifest`, which
records them.

Sources: a manifest file (`ckpt-inspect manifest`); a Hugging Face repository (`hf://org/
repo[@rev]`: sizes and the SHA-256 of every LFS/Xet file, the git blob SHA-1 of the others,
all from the Hub's own tree listing, nothing downloaded); another checkpoint, local or
remote. Without a source, the manifest kept in the folder, else the checks that need none.

Levels: `size` compares file lists and sizes (listings only, no file is read); `hash` adds
the SHA-256 of every file of the same size (streamed, files in parallel); `tensor` compares
every tensor's dtype, shape and content hash, whatever the sharding.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from inspector._internal.checkpoint.naming import layer_expert_numbers
from inspector._internal.checkpoint.scan import scan
from inspector._internal.checkpoint.scanned import ScannedCheckpoint
from inspector._internal.checks import check
from inspector._internal.common.display import legible
from inspector._internal.common.filenames import MANIFEST_NAME
from inspector._internal.findings.codes import Code, Severity, code_of
from inspector._internal.findings.finding import Finding, fold_findings, make_finding, sort_findings
from inspector._internal.integrity.hashing import (
    FileDigest,
    Listing,
    dcp_digests,
    hash_files,
    list_files,
    tensor_spans,
    tensors_of,
)
from inspector._internal.integrity.manifest import (
    MANIFEST_CAP,
    FileRecord,
    Manifest,
    ManifestError,
    TensorRecord,
    manifest_bytes,
    parse_manifest,
)
from inspector._internal.integrity.verified import record_verification
from inspector._internal.layouts._common import read_capped
from inspector._internal.plans.atomic import write_atomic
from inspector._internal.storage import (
    Location,
    RemoteOptions,
    Storage,
    is_remote,
    open_location,
)
from inspector._internal.storage.urls import scheme_of
from inspector.errors import CannotInspectError

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["LEVELS", "Level", "Verification", "build_manifest", "verify", "write_manifest"]

Level = Literal["size", "hash", "tensor"]
LEVELS: tuple[Level, ...] = ("size", "hash", "tensor")
_TABLE_COLUMNS = ["kind", "name", "file", "layer", "status", "expected", "found"]


@dataclass(frozen=True)
class Verification:
    """What `verify` found. `source` names what was compared against, `source_kind` is
    `manifest`, `hub`, `checkpoint` or `none`; `table` has one row per file or tensor
    compared (`status`: ok, size-mismatch, hash-mismatch, missing, extra, unreadable,
    unchecked); `note` says where the level asked for could not fully apply."""

    path: str
    source: str
    source_kind: str
    level: str
    when: str
    findings: tuple[Finding, ...]
    rows: tuple[tuple[Any, ...], ...] = ()
    files: int = 0
    tensors: int = 0
    bytes_read: int = 0
    seconds: float = 0.0
    note: str = ""

    @property
    def ok(self) -> bool:
        """No error: everything compared matched."""
        return not any(f.severity is Severity.ERROR for f in self.findings)

    @property
    def table(self) -> pd.DataFrame:
        import pandas as pd

        return pd.DataFrame(list(self.rows), columns=_TABLE_COLUMNS)

    @property
    def mismatches(self) -> int:
        return sum(1 for r in self.rows if r[4] != "ok")

    def line(self) -> str:
        """One line for the Overview, the HTML report and the Markdown summary: what was
        verified, against what, when, and the outcome."""
        what = f"{self.files:,} files" + (f", {self.tensors:,} tensors" if self.tensors else "")
        errors = sum(1 for f in self.findings if f.severity is Severity.ERROR)
        outcome = "all match" if self.ok else f"{errors:,} error finding(s)"
        return legible(
            f"verified {self.when} at level {self.level} against {self.source}: {what}, "
            f"{outcome}" + (f" ({self.note})" if self.note else ""),
            limit=400,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "source": self.source,
            "source_kind": self.source_kind,
            "level": self.level,
            "when": self.when,
            "ok": self.ok,
            "files": self.files,
            "tensors": self.tensors,
            "bytes_read": self.bytes_read,
            "seconds": round(self.seconds, 3),
            "note": self.note,
            "line": self.line(),
            "findings": [f.to_dict() for f in self.findings],
            "mismatches": [
                dict(zip(_TABLE_COLUMNS, r, strict=True)) for r in self.rows if r[4] != "ok"
            ],
        }


# -- sources ----------------------------------------------------------------------------------


@dataclass
class _Source:
    kind: str
    shown: str
    files: dict[str, FileRecord] = field(default_factory=dict)
    blob_sha1: dict[str, str] = field(default_factory=dict)
    tensors: dict[str, TensorRecord] | None = None
    storage: Storage | None = None  # another checkpoint: hashed when needed
    problem: Finding | None = None
    label: str = ""  # how findings name it (`shown` without the detail)

    def __post_init__(self) -> None:
        self.label = legible(self.label or self.shown, limit=120)


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _root(target: str | Path | Location, options: RemoteOptions) -> Location:
    loc = open_location(target, options=options)
    if not loc.is_dir():
        raise CannotInspectError(
            f"{loc}: not a folder; verify and manifest work on a checkpoint folder"
        )
    return loc


def _manifest_source(loc: Location, shown: str) -> _Source:
    data, problem, _ = read_capped(loc, MANIFEST_CAP, "manifests")
    if data is not None:
        try:
            manifest = parse_manifest(data)
        except ManifestError as exc:
            problem = str(exc)
        else:
            when = f" of {manifest.created}" if manifest.created else ""
            return _Source(
                "manifest",
                f"manifest {shown}{when}",
                dict(manifest.files),
                tensors=dict(manifest.tensors),
                label=shown,
            )
    finding = make_finding(Code.MANIFEST_UNREADABLE, f"{shown} {problem}", file=loc.rel or None)
    return _Source("manifest", f"manifest {shown}", problem=finding)


def _source(against: str | Path | None, root: Location, options: RemoteOptions) -> _Source:
    if against is None:
        own = root / MANIFEST_NAME
        if own.is_file():
            return _manifest_source(own, MANIFEST_NAME)
        return _Source("none", "no source (header extents against file sizes)")
    loc = open_location(against, options=options)
    shown = str(loc.path)
    if not loc.is_dir():
        return _manifest_source(loc, shown)
    storage = loc.as_root()
    theirs = list_files(storage)
    files = {
        rel: FileRecord(size, theirs.sha256.get(rel))
        for rel, size in theirs.files.items()
        if size is not None
    }
    if isinstance(against, str) and scheme_of(against) == "hf":
        source = _Source("hub", shown, files, dict(theirs.blob_sha1), storage=storage)
        kept = loc / MANIFEST_NAME
        if kept.is_file():  # the publisher's own manifest: the Hub's listing has no tensors
            published = _manifest_source(kept, f"{shown}/{MANIFEST_NAME}")
            source.tensors = published.tensors
        return source
    return _Source("checkpoint", shown, files, storage=storage)


# -- verify -----------------------------------------------------------------------------------


def verify(
    path: str | Path | Location,
    *,
    against: str | Path | None = None,
    level: Level = "hash",
    workers: int | None = None,
    progress: bool | None = None,
    storage_options: Mapping[str, Any] | None = None,
    max_concurrency: int | None = None,
    timeout: float | None = None,
    read_timeout: float | None = None,
    allow_redirects: Sequence[str] = (),
) -> Verification:
    """Compare the checkpoint at `path` with `against` (a manifest file, `hf://org/repo[@rev]`
    or another checkpoint folder, local or remote; None: the folder's own manifest, else
    header extents only) at `level` (`size`, `hash` or `tensor`). Returns the findings and a
    table; raises `CannotInspectError` when `path` or `against` cannot be reached."""
    if level not in LEVELS:
        raise ValueError(f"level {level!r}; expected one of {', '.join(LEVELS)}")
    started = time.monotonic()
    options = _options(
        progress, storage_options, max_concurrency, timeout, read_timeout, allow_redirects
    )
    root = _root(path, options)
    storage = root.as_root()
    mine = list_files(storage)
    source = _source(against, root, options)
    run = _Run(storage, mine, source, workers=workers, progress=bool(progress))
    if source.problem is not None:
        run.findings.append(source.problem)
    elif source.kind == "none":
        run.header_extents(root)
    elif level == "tensor":
        run.tensors(root)
    else:
        run.files(hashes=level == "hash")
    findings = sort_findings(run.folded())
    result = Verification(
        path=str(root.path),
        source=legible(source.shown, limit=300),
        source_kind=source.kind,
        level=level,
        when=_now(),
        findings=tuple(findings),
        rows=tuple(run.rows),
        files=run.file_count,
        tensors=run.tensor_count,
        bytes_read=run.bytes_read,
        seconds=time.monotonic() - started,
        note=run.note,
    )
    record_verification(result)
    return result


def _options(
    progress: bool | None,
    storage_options: Mapping[str, Any] | None,
    max_concurrency: int | None,
    timeout: float | None,
    read_timeout: float | None,
    allow_redirects: Sequence[str],
) -> RemoteOptions:
    kw: dict[str, Any] = {
        "storage_options": dict(storage_options or {}),
        "progress": progress,
        "allow_redirects": tuple(allow_redirects),
    }
    for name, value in (
        ("max_concurrency", max_concurrency),
        ("timeout", timeout),
        ("read_timeout", read_timeout),
    ):
        if value is not None:
            kw[name] = value
    return RemoteOptions(**kw)


class _Run:
    """One verification: the rows and findings, built level by level."""

    def __init__(
        self,
        storage: Storage,
        mine: Listing,
        source: _Source,
        *,
        workers: int | None,
        progress: bool,
    ) -> None:
        self.storage, self.mine, self.source = storage, mine, source
        self.workers, self.progress = workers, progress
        self.rows: list[tuple[Any, ...]] = []
        self.findings: list[Finding] = []
        self.file_count = self.tensor_count = self.bytes_read = 0
        self.note = ""

    def folded(self) -> list[Finding]:
        by_code: dict[str, list[Finding]] = {}
        for f in self.findings:
            by_code.setdefault(f.code, []).append(f)
        out: list[Finding] = []
        for code, group in by_code.items():
            what = "tensors" if code.startswith("tensor-") else "files"
            out += fold_findings(group, what) if len(group) > 1 else group
        return out

    def _file_row(self, rel: str, status: str, expected: Any = None, found: Any = None) -> None:
        self.rows.append(("file", rel, rel, None, status, expected, found))

    # -- no source -----------------------------------------------------------------------

    def header_extents(self, root: Location) -> None:
        scanned = scan(root)
        group = Code.FILE_TRUNCATED.group
        self.findings += [f for f in check(scanned, model=False) if _group(f.code) == group]
        self.file_count = len(self.mine.files)
        self.note = (
            f"no source and no {MANIFEST_NAME}: only header extents against file sizes were "
            "checked; write a manifest with `ckpt-inspect manifest` or give --against"
        )

    # -- files ---------------------------------------------------------------------------

    def _refused(self) -> None:
        for rel, reason in self.mine.refused.items():
            self.findings.append(
                make_finding(Code.FILE_UNSAFE, f"{rel} {reason}; not read", file=rel)
            )
            self._file_row(rel, "unreadable", found=reason)

    def files(self, *, hashes: bool) -> None:
        src, mine = self.source, self.mine.files
        self._refused()
        same: list[tuple[str, int]] = []
        for rel in sorted(set(src.files) | set(mine)):
            want = src.files.get(rel)
            size = mine.get(rel)
            if rel in self.mine.refused:
                continue
            if want is None:
                self.findings.append(
                    make_finding(
                        Code.FILE_EXTRA_VS_SOURCE, f"{rel} is not in {src.label}", file=rel
                    )
                )
                self._file_row(rel, "extra", found=size)
            elif rel not in mine:
                self.findings.append(
                    make_finding(
                        Code.FILE_MISSING_VS_SOURCE,
                        f"{rel} ({want.size:,} bytes in {src.label}) is missing",
                        file=rel,
                    )
                )
                self._file_row(rel, "missing", expected=want.size)
            elif size != want.size:
                self.findings.append(
                    make_finding(
                        Code.FILE_SIZE_MISMATCH,
                        f"{rel} is {_bytes(size)}; {src.label} records {want.size:,} bytes",
                        file=rel,
                    )
                )
                self._file_row(rel, "size-mismatch", want.size, size)
            elif hashes:
                same.append((rel, want.size))
            else:
                self._file_row(rel, "ok", want.size, size)
        self.file_count = len(set(src.files) | set(mine))
        if hashes:
            self._hashes(same)

    def _expected_hashes(self, same: list[tuple[str, int]]) -> dict[str, tuple[str, str]]:
        """file -> (algorithm, hex digest) the source records or, for another checkpoint,
        what its copy hashes to."""
        src = self.source
        out: dict[str, tuple[str, str]] = {}
        for rel, _ in same:
            rec = src.files[rel]
            if rec.sha256:
                out[rel] = ("sha256", rec.sha256)
            elif rel in src.blob_sha1:
                out[rel] = ("git-sha1", src.blob_sha1[rel])
        if src.kind == "checkpoint" and src.storage is not None:
            theirs = hash_files(
                src.storage,
                [j for j in same if j[0] not in out],
                sha256=True,
                workers=self.workers,
                progress=self.progress,
                desc="hashing the source",
            )
            for rel, d in theirs.items():
                self.bytes_read += d.read
                if d.sha256 is not None:
                    out[rel] = ("sha256", d.sha256)
                else:
                    self.findings.append(
                        make_finding(
                            Code.FILE_HASH_MISMATCH,
                            f"{rel}: the source's copy {d.error}; not compared",
                            file=rel,
                        )
                    )
                    self._file_row(rel, "unchecked", found=d.error)
        return out

    def _hashes(self, same: list[tuple[str, int]]) -> None:
        expected = self._expected_hashes(same)
        jobs = [j for j in same if j[0] in expected]
        blob = frozenset(rel for rel, (alg, _) in expected.items() if alg == "git-sha1")
        sha = any(alg == "sha256" for alg, _ in expected.values())
        got = hash_files(
            self.storage,
            jobs,
            sha256=sha,
            blob_sha1=blob,
            workers=self.workers,
            progress=self.progress,
        )
        unrecorded = 0
        # The names that have a row already (a source copy that could not be hashed), looked
        # up per file: a scan of the rows for each file was quadratic in the folder's files.
        shown = {r[1] for r in self.rows}
        for rel, size in same:
            if rel not in expected:
                if rel not in shown:
                    unrecorded += 1
                    self._file_row(rel, "unchecked", size, size)
                continue
            alg, want = expected[rel]
            d = got[rel]
            self.bytes_read += d.read
            found = d.blob_sha1 if alg == "git-sha1" else d.sha256
            if d.error is not None:
                code = Code.FILE_UNSAFE if d.unsafe else Code.FILE_HASH_MISMATCH
                self.findings.append(make_finding(code, f"{rel} {d.error}; not verified", file=rel))
                self._file_row(rel, "unreadable", want, d.error)
            elif found != want:
                self.findings.append(
                    make_finding(
                        Code.FILE_HASH_MISMATCH,
                        f"{rel}: {alg} {found} but {self.source.label} records {want} (same size, "
                        "different bytes)",
                        file=rel,
                    )
                )
                self._file_row(rel, "hash-mismatch", want, found)
            else:
                self._file_row(rel, "ok", want, found)
        if unrecorded:
            self.note = f"{unrecorded:,} file(s) compared by size only: the source records no hash"

    # -- tensors -------------------------------------------------------------------------

    def tensors(self, root: Location) -> None:
        self._refused()
        scanned = scan(root)
        mine = _tensor_hashes(scanned, workers=self.workers, progress=self.progress)
        self.bytes_read += mine[1]
        src = self.source
        theirs = src.tensors
        if theirs is None and src.storage is not None:
            other = scan(Location(src.storage))
            theirs, read = _tensor_hashes(other, workers=self.workers, progress=self.progress)
            self.bytes_read += read
        if theirs is None or (not mine[0] and not theirs):
            self.note = "no tensors to compare (the source records none): files compared"
            self.files(hashes=True)
            return
        self._compare_tensors(mine[0], theirs)

    def _compare_tensors(
        self, mine: Mapping[str, TensorRecord], theirs: Mapping[str, TensorRecord]
    ) -> None:
        names = sorted(set(mine) | set(theirs))
        where = dict(zip(names, layer_expert_numbers(names), strict=True))
        shown = self.source.label
        for name in names:
            a, b = mine.get(name), theirs.get(name)
            layer, expert = where[name]
            if a is None and b is not None:
                self._tensor(
                    Code.TENSOR_MISSING_VS_SOURCE,
                    f"{name} ({b.dtype} {list(b.shape)}, in {b.file} in {shown}) is missing",
                    name,
                    b.file,
                    layer,
                    expert,
                    "missing",
                    b.hash,
                    None,
                )
            elif b is None and a is not None:
                self._tensor(
                    Code.TENSOR_EXTRA_VS_SOURCE,
                    f"{name} is not in {shown}",
                    name,
                    a.file,
                    layer,
                    expert,
                    "extra",
                    None,
                    a.hash,
                )
            elif a is not None and b is not None:
                if (a.dtype, a.shape) != (b.dtype, b.shape):
                    self._tensor(
                        Code.TENSOR_HASH_MISMATCH,
                        f"{name} in {a.file} is {a.dtype} {list(a.shape)}; {shown} "
                        f"has {b.dtype} {list(b.shape)}",
                        name,
                        a.file,
                        layer,
                        expert,
                        "dtype-shape-mismatch",
                        f"{b.dtype} {list(b.shape)}",
                        f"{a.dtype} {list(a.shape)}",
                    )
                elif a.hash is None or b.hash is None:
                    side = "this checkpoint's" if a.hash is None else "the source's"
                    self._tensor(
                        Code.TENSOR_HASH_MISMATCH,
                        f"{name} in {a.file}: {side} bytes could not be read; not verified",
                        name,
                        a.file,
                        layer,
                        expert,
                        "unreadable",
                        b.hash,
                        a.hash,
                    )
                elif a.hash != b.hash:
                    self._tensor(
                        Code.TENSOR_HASH_MISMATCH,
                        f"{name} in {a.file}: content differs from {shown} (xxh3-128 "
                        f"{a.hash}, expected {b.hash})",
                        name,
                        a.file,
                        layer,
                        expert,
                        "hash-mismatch",
                        b.hash,
                        a.hash,
                    )
                else:
                    self.rows.append(("tensor", name, a.file, layer, "ok", b.hash, a.hash))
        self.tensor_count = len(names)
        self.file_count = len({r.file for r in mine.values()})

    def _tensor(
        self,
        code: Code,
        message: str,
        name: str,
        file: str,
        layer: int | None,
        expert: int | None,
        status: str,
        expected: Any,
        found: Any,
    ) -> None:
        self.findings.append(
            make_finding(code, message, file=file, tensor=name, layer=layer, expert=expert)
        )
        self.rows.append(("tensor", name, file, layer, status, expected, found))


def _group(code: str) -> str:
    return code_of(code).group


def _bytes(n: int | None) -> str:
    return "of unknown size" if n is None or n < 0 else f"{n:,} bytes"


def _tensor_hashes(
    scanned: ScannedCheckpoint, *, workers: int | None, progress: bool
) -> tuple[dict[str, TensorRecord], int]:
    """Every logical tensor of `scanned` with its content hash (None: unreadable), and the
    bytes read."""
    records = tensors_of(scanned)
    if scanned.dcp is not None:
        digests = dcp_digests(scanned, list(records))
        read = sum(int(s.file_size) for s in scanned.shards)
    else:
        spans = tensor_spans(scanned)
        storage = (
            scanned.location.as_root() if not scanned.location.rel else scanned.location.storage
        )
        jobs = [(f, next(s.file_size for s in scanned.shards if s.file == f)) for f in spans]
        done: dict[str, FileDigest] = hash_files(
            storage,
            jobs,
            sha256=False,
            spans=spans,
            workers=workers,
            progress=progress,
            desc="hashing tensors",
        )
        digests = {}
        for d in done.values():
            digests.update(d.tensors)
        read = sum(d.read for d in done.values())
    out = {
        name: TensorRecord(r.dtype, r.shape, r.file, digests.get(name))
        for name, r in records.items()
    }
    return out, read


# -- manifest ---------------------------------------------------------------------------------


def _tool() -> str:
    try:
        return f"checkpoint-inspector {version('checkpoint-inspector')}"
    except PackageNotFoundError:
        return "checkpoint-inspector"


def build_manifest(
    path: str | Path | Location,
    *,
    workers: int | None = None,
    progress: bool | None = None,
    options: RemoteOptions | None = None,
) -> Manifest:
    """The manifest of the checkpoint at `path`: every file's size and SHA-256 and every
    tensor's dtype, shape, file and content hash, in one read of each file."""
    options = options or RemoteOptions(progress=progress)
    root = _root(path, options)
    storage = root.as_root()
    listing = list_files(storage)
    if listing.refused:
        rel, reason = next(iter(listing.refused.items()))
        raise CannotInspectError(f"{root.path}/{legible(rel)} {reason}; no manifest written")
    unknown = [rel for rel, size in listing.files.items() if size is None]
    if unknown:
        raise CannotInspectError(
            f"{root.path}/{legible(unknown[0])}: the store does not say its size; no manifest "
            "written"
        )
    scanned = scan(root)
    records = tensors_of(scanned)
    spans = tensor_spans(scanned)
    jobs = [(rel, int(size or 0)) for rel, size in listing.files.items()]
    done = hash_files(
        storage,
        jobs,
        sha256=True,
        spans=spans,
        workers=workers,
        progress=bool(progress),
        desc="manifest",
    )
    for d in done.values():
        if d.error is not None:
            raise CannotInspectError(
                f"{root.path}/{legible(d.file)} {d.error}; no manifest written"
            )
    digests: dict[str, str | None] = {}
    for d in done.values():
        digests.update(d.tensors)
    if scanned.dcp is not None:
        digests = dict(dcp_digests(scanned, list(records)))
    files = {
        rel: FileRecord(int(listing.files[rel] or 0), done[rel].sha256) for rel in listing.files
    }
    tensors = {
        name: TensorRecord(r.dtype, r.shape, r.file, digests.get(name))
        for name, r in records.items()
        if r.file in files
    }
    return Manifest(files, tensors, created=_now(), tool=_tool())


def write_manifest(
    path: str | Path,
    *,
    output: str | Path | None = None,
    workers: int | None = None,
    progress: bool | None = None,
) -> Path:
    """Write the manifest of the local checkpoint folder `path`, atomically (temp file,
    fsync, rename), to `output` or to `MANIFEST_NAME` inside the folder; returns where."""
    if output is None and isinstance(path, str) and is_remote(path):
        raise CannotInspectError(
            f"{path}: a remote checkpoint's manifest is written locally; give -o FILE (then "
            f"upload it into the checkpoint folder as {MANIFEST_NAME})"
        )
    manifest = build_manifest(path, workers=workers, progress=progress)
    dest = Path(output) if output is not None else Path(path) / MANIFEST_NAME
    if dest.is_dir() or dest.is_symlink():
        raise CannotInspectError(
            f"{dest} is a folder or a link; the manifest is only written as a regular file"
        )
    write_atomic(dest, manifest_bytes(manifest))
    return dest
