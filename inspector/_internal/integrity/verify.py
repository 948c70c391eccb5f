"""`verify`: are a checkpoint's bytes what its source recorded (a manifest, an `hf://` repository's
tree listing, another checkpoint; else the manifest kept in the folder)? And `write_manifest`,
which records them. Levels `size` (listings only), `hash` (SHA-256 of files of the same size)
and `tensor` (dtype, shape and content hash, whatever the sharding): docs/verify.md.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from inspector._internal.checkpoint.naming import layer_expert_numbers
from inspector._internal.checkpoint.scanned import ScannedCheckpoint
from inspector._internal.checks import check
from inspector._internal.common.defaults import LEVELS, Level
from inspector._internal.common.display import legible
from inspector._internal.common.filenames import MANIFEST_NAME
from inspector._internal.common.text import examples, plural
from inspector._internal.execution.atomic import write_atomic
from inspector._internal.execution.ranks import Distributed
from inspector._internal.findings.codes import Code, Severity, code_of
from inspector._internal.findings.finding import Finding, fold_by_file, make_finding, sort_findings
from inspector._internal.integrity.hashing import (
    FileDigest,
    Listing,
    hash_files,
    hashed_tensors,
    list_files,
    tensor_spans,
)
from inspector._internal.integrity.manifest import (
    MANIFEST_CAP,
    TENSOR_HASH,
    FileRecord,
    Manifest,
    ManifestError,
    TensorRecord,
    manifest_bytes,
    parse_manifest,
)
from inspector._internal.integrity.verified import record_verification
from inspector._internal.layouts._common import read_capped
from inspector._internal.scan.entry import scan
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

_TABLE_COLUMNS = ["kind", "name", "file", "layer", "status", "expected", "found"]
# What the line says when nothing was found and every byte a loader reads was compared.
ALL_MATCH = "all match"


@dataclass(frozen=True)
class Verification:
    """What `verify` found. `source` names what was compared against, `source_kind` is
    `manifest`, `hub`, `checkpoint` or `none`; `table` has one row per file or tensor
    compared (`status`: ok, size-mismatch, hash-mismatch, missing, extra, unreadable,
    unchecked); `note` says where the level asked for could not fully apply. `level` is the
    level that ran (a Hub repository without tensor hashes is verified at `hash`).

    `clean` is what the line says when nothing is found: "all match" only when every byte a
    loader reads was compared with a hash the source records (`all_match`); otherwise what
    was compared ("all sizes match", "all tensors match", ...)."""

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
    clean: str = ALL_MATCH

    @property
    def ok(self) -> bool:
        """No error: everything compared matched."""
        return not any(f.severity is Severity.ERROR for f in self.findings)

    @property
    def all_match(self) -> bool:
        """Every byte a loader reads was compared with a recorded hash, and matched: no error
        or warning (a file or tensor the source does not record, a file it records no hash
        for, a copy beside the tensor a loader gets) and nothing left uncompared."""
        return self.clean == ALL_MATCH and not any(
            f.severity in (Severity.ERROR, Severity.WARNING) for f in self.findings
        )

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
        what = plural(self.files, "file") + (
            f", {plural(self.tensors, 'tensor')}" if self.tensors else ""
        )
        counts = [
            plural(n, f"{severity} finding")
            for severity in (Severity.ERROR, Severity.WARNING)
            if (n := sum(1 for f in self.findings if f.severity is severity))
        ]
        outcome = ", ".join(counts) or self.clean
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
            "all_match": self.all_match,
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
    storage: Storage | None = None  # another checkpoint (or the Hub's files): hashed when needed
    problem: Finding | None = None  # the source cannot be used: nothing is verified
    # The Hub repository's own manifest, when it keeps one that cannot be used: said, and
    # the repository is verified from its listing as if it kept none.
    published: Finding | None = None
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
            source.tensors, source.published = published.tensors, published.problem
        return source
    return _Source("checkpoint", shown, files, storage=storage)


# -- verify -----------------------------------------------------------------------------------


def verify(
    path: str | Path | Location,
    *,
    against: str | Path | None = None,
    level: Level = "hash",
    download: bool = False,
    workers: int | None = None,
    progress: bool | None = None,
    storage_options: Mapping[str, Any] | None = None,
    max_concurrency: int | None = None,
    timeout: float | None = None,
    read_timeout: float | None = None,
    allow_redirects: Sequence[str] = (),
    distributed: bool = False,
) -> Verification:
    """Compare the checkpoint at `path` with `against` (a manifest file, `hf://org/repo[@rev]`
    or another checkpoint folder, local or remote; None: the folder's own manifest, else
    header extents only) at `level` (`size`, `hash` or `tensor`). Returns the findings and a
    table; raises `CannotInspectError` when `path` or `against` cannot be reached.

    A Hub repository is compared with what it records (its listing, its own manifest): no
    weight is downloaded unless `download` (then its files are read where the listing
    records no checksum, and its tensors where it keeps no usable manifest).

    `distributed`: the ranks of this torchrun job share the reading (files balanced by
    bytes) and every rank returns the same result; every rank must call it alike."""
    if level not in LEVELS:
        raise ValueError(f"level {level!r}; expected one of {', '.join(LEVELS)}")
    ranks = Distributed.start() if distributed else Distributed.alone()
    started = time.monotonic()  # once every rank has joined: their start-up is not the work
    options = _options(
        progress, storage_options, max_concurrency, timeout, read_timeout, allow_redirects
    )
    root = _root(path, options)
    storage = root.as_root()
    # At level hash the scan says which files a loader reads: each is listed and compared
    # wherever it sits (`list_files`), and what it could not read is reported.
    scanned = scan(root) if level == "hash" else None
    mine = list_files(storage, keep=_loader_files(scanned) if scanned is not None else ())
    source = _source(against, root, options)
    run = _Run(
        storage,
        mine,
        source,
        ranks=ranks,
        workers=workers,
        progress=bool(progress),
        download=download,
        level=level,
    )
    if source.problem is not None:
        run.findings.append(source.problem)
        run.clean = "nothing verified"
    elif source.kind == "none":
        run.header_extents(root)
    elif level == "tensor":
        run.tensors(root)
    else:
        run.files(hashes=level == "hash")
        if scanned is not None:  # a loader may read what no listing holds: an index leaving it
            run.loader_unknown(scanned)
    findings = sort_findings(run.folded())
    result = Verification(
        path=str(root.path),
        source=legible(source.shown, limit=300),
        source_kind=source.kind,
        level=run.level,
        when=_now(),
        findings=tuple(findings),
        rows=tuple(run.rows),
        files=run.file_count,
        tensors=run.tensor_count,
        bytes_read=run.bytes_read,
        seconds=time.monotonic() - started,
        note="; ".join(run.notes),
        clean=run.clean,
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


# What a scan reports that leaves the tensors a loader gets unknown: the index's files
# (which decide what a loader reads) that were not read, or an index that cannot be read.
_LOADER_UNKNOWN = frozenset({Code.INDEX_UNSAFE_PATH, Code.INDEX_UNREADABLE, Code.FILE_UNSAFE})


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
        ranks: Distributed | None = None,
        download: bool = False,
        level: Level = "hash",
    ) -> None:
        self.storage, self.mine, self.source = storage, mine, source
        self.ranks = ranks or Distributed.alone()
        self.workers, self.progress, self.download = workers, progress, download
        self.level: Level = level
        self.rows: list[tuple[Any, ...]] = []
        self.findings: list[Finding] = []
        # Findings folded already by the checks that made them (`header_extents`).
        self.folded_already: list[Finding] = []
        self.file_count = self.tensor_count = self.bytes_read = 0
        self.notes: list[str] = []
        self.clean = ALL_MATCH if level != "size" else "all sizes match"

    def folded(self) -> list[Finding]:
        """The findings under the fold policy (`FOLD`): per code, `per_file` listed per file
        and `per_code` in all, the rest counted in summaries; a finding per file for 20,000
        files is 200 findings and one count (`fold_by_file`)."""
        by_code: dict[str, list[Finding]] = {}
        for f in self.findings:
            by_code.setdefault(f.code, []).append(f)
        out: list[Finding] = list(self.folded_already)
        for code, group in by_code.items():
            out += fold_by_file(group, "tensors" if code.startswith("tensor-") else "files")
        return out

    def _file_row(self, rel: str, status: str, expected: Any = None, found: Any = None) -> None:
        self.rows.append(("file", rel, rel, None, status, expected, found))

    # -- no source -----------------------------------------------------------------------

    def header_extents(self, root: Location) -> None:
        scanned = scan(root)
        group = Code.FILE_TRUNCATED.group
        self.folded_already += [f for f in check(scanned, model=False) if _group(f.code) == group]
        self.file_count = len(self.mine.files)
        self.clean = "header extents agree, no bytes compared"
        self.notes.append(
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
        """file -> (algorithm, hex digest) the source records or, for another checkpoint
        (and the Hub's copy of a file its listing records no checksum for, with
        `download`), what its copy hashes to."""
        src = self.source
        out: dict[str, tuple[str, str]] = {}
        for rel, _ in same:
            rec = src.files[rel]
            if rec.sha256:
                out[rel] = ("sha256", rec.sha256)
            elif rel in src.blob_sha1:
                out[rel] = ("git-sha1", src.blob_sha1[rel])
        fetch = src.kind == "checkpoint" or (src.kind == "hub" and self.download)
        if fetch and src.storage is not None:
            theirs = hash_files(
                src.storage,
                [j for j in same if j[0] not in out],
                sha256=True,
                workers=self.workers,
                progress=self.progress,
                desc="hashing the source",
                ranks=self.ranks,
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
            ranks=self.ranks,
        )
        unrecorded = 0
        # The names that have a row already (a source copy that could not be hashed), looked
        # up per file: a scan of the rows for each file was quadratic in the folder's files.
        shown = {r[1] for r in self.rows}
        for rel, size in same:
            if rel not in expected:
                if rel not in shown:
                    unrecorded += 1
                    # Same size says nothing about the bytes: never "match" (issue 31).
                    self.findings.append(
                        make_finding(
                            Code.FILE_NOT_VERIFIED,
                            f"{rel}: {self.source.label} records its size ({size:,} bytes) but "
                            "no checksum; its bytes were not compared"
                            + (
                                " (--download reads the Hub's copy)"
                                if self.source.kind == "hub"
                                else ""
                            ),
                            file=rel,
                        )
                    )
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
            self.notes.append(
                f"{plural(unrecorded, 'file')} compared by size only: the source records no "
                "checksum for them"
            )

    # -- tensors -------------------------------------------------------------------------

    def tensors(self, root: Location) -> None:
        src = self.source
        if src.published is not None:
            self.findings.append(src.published)
        if src.kind == "hub" and src.tensors is None and not self.download:
            # The Hub's listing records files, not tensors: without the repository's own
            # manifest, tensors could only be compared by downloading every weight, which
            # is done only when asked (docs/verify.md).
            why = (
                f"its {MANIFEST_NAME} cannot be used (see manifest-unreadable)"
                if src.published
                else f"it keeps no {MANIFEST_NAME}"
            )
            self.level = "hash"
            self.notes.append(
                f"level tensor asked, but {src.label} records no tensor hashes ({why}): "
                "verified at level hash from the Hub's listing, nothing downloaded; "
                "--download reads its weights to compare tensors"
            )
            self.files(hashes=True)
            self.loader_unknown(scan(root))
            return
        self._refused()
        scanned = scan(root)
        self.loader_unknown(scanned)
        mine, copies, read = _tensor_hashes(
            scanned, self.ranks, workers=self.workers, progress=self.progress
        )
        self.bytes_read += read
        theirs = src.tensors
        if theirs is None and src.storage is not None:
            other = scan(Location(src.storage))
            theirs, _, read = _tensor_hashes(
                other, self.ranks, workers=self.workers, progress=self.progress
            )
            self.bytes_read += read
        if theirs is None or (not mine and not theirs):
            self.notes.append("no tensors to compare (the source records none): files compared")
            self.level = "hash"
            self.files(hashes=True)
            return
        self._compare_tensors(mine, theirs, copies)
        self._other_files(scanned)

    def loader_unknown(self, scanned: ScannedCheckpoint) -> None:
        """What the scan could not read of what a loader reads (an index entry leaving the
        folder, an index that cannot be read, a shard the storage refuses): bytes a loader
        reads were then not compared, or the tensors it gets are not all known, so never
        "match", even where the index is the recorded one."""
        for f in scanned.read_findings:
            if f.code in _LOADER_UNKNOWN and (f.file is None or f.file not in self.mine.refused):
                self.findings.append(f)

    def _other_files(self, scanned: ScannedCheckpoint) -> None:
        """Files a loader may read that are neither a tensor file nor the layout's map of
        the tensors to files (config.json, tokenizer files, code): not compared at this
        level, where names and files change with the sharding, and said."""
        mapped = _loader_files(scanned)
        others = [rel for rel in self.mine.files if rel not in mapped]
        if others:
            self.clean = "all tensors match"
            self.notes.append(
                f"{plural(len(others), 'other file')} not compared at this level "
                f"({examples(others)}): --level hash compares every file"
            )

    def _compare_tensors(
        self,
        mine: Mapping[str, TensorRecord],
        theirs: Mapping[str, TensorRecord],
        copies: Mapping[str, Sequence[TensorRecord]],
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
                held = copies.get(name)
                if held:
                    self._duplicate(name, held, a.file, layer, expert)
                # Every copy a loader may keep is judged, the one transformers keeps last.
                for copy in [c for c in held or () if c.file != a.file] + [a]:
                    self._judge(name, copy, b, layer, expert, beside=copy is not a)
        self.tensor_count = len(names)
        self.file_count = len({r.file for r in mine.values()})

    def _duplicate(
        self,
        name: str,
        held: Sequence[TensorRecord],
        kept: str,
        layer: int | None,
        expert: int | None,
    ) -> None:
        files = [c.file for c in held]
        self.findings.append(
            make_finding(
                Code.DUPLICATE_TENSOR,
                f"'{legible(name)}' is in {len(files)} shards a loader reads "
                f"({examples(files)}): transformers keeps the copy in {legible(kept)} "
                "(the last it reads, whatever the index points to), huggingface_hub's "
                "load_torch_model any of them; each copy is compared with "
                f"{self.source.label}; keep one copy",
                file=files[0],
                tensor=name,
                layer=layer,
                expert=expert,
            )
        )

    def _judge(
        self,
        name: str,
        a: TensorRecord,
        b: TensorRecord,
        layer: int | None,
        expert: int | None,
        *,
        beside: bool,
    ) -> None:
        """One copy `a` of a tensor this checkpoint holds against the source's record `b`."""
        shown = self.source.label
        which = f"the copy of {name} in {a.file}" if beside else f"{name} in {a.file}"
        if (a.dtype, a.shape) != (b.dtype, b.shape):
            self._tensor(
                Code.TENSOR_HASH_MISMATCH,
                f"{which} is {a.dtype} {list(a.shape)}; {shown} has {b.dtype} {list(b.shape)}",
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
                f"{which}: {side} bytes could not be read; not verified",
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
                f"{which}: content differs from {shown} ({TENSOR_HASH} {a.hash}, expected "
                f"{b.hash})",
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
    scanned: ScannedCheckpoint, ranks: Distributed, *, workers: int | None, progress: bool
) -> tuple[dict[str, TensorRecord], dict[str, list[TensorRecord]], int]:
    """Every tensor a loader gets from `scanned` with its content hash (None: unreadable),
    every copy of a name several shards it reads hold, and the bytes read (by every
    rank)."""
    if scanned.dcp is not None:
        records, copies = hashed_tensors(scanned, {}, ranks=ranks)
        return records, copies, sum(int(s.file_size) for s in scanned.shards)
    spans = tensor_spans(scanned)
    storage = scanned.location.as_root() if not scanned.location.rel else scanned.location.storage
    sizes = {s.file: int(s.file_size) for s in scanned.shards}
    done: dict[str, FileDigest] = hash_files(
        storage,
        [(f, sizes[f]) for f in spans],
        sha256=False,
        spans=spans,
        workers=workers,
        progress=progress,
        desc="hashing tensors",
        ranks=ranks,
    )
    by_file = {rel: d.tensors for rel, d in done.items()}
    records, copies = hashed_tensors(scanned, by_file, ranks=ranks)
    return records, copies, sum(d.read for d in done.values())


# -- manifest ---------------------------------------------------------------------------------


def _tool() -> str:
    # Imported here: only a manifest names the tool's version, and importlib.metadata costs
    # every `verify` about 25 ms at start.
    from importlib.metadata import PackageNotFoundError, version

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
    ranks: Distributed | None = None,
) -> Manifest:
    """The manifest of the checkpoint at `path`: every file's size and SHA-256 and every
    tensor's dtype, shape, file and content hash, in one read of each file (with `ranks`,
    each file read by one rank of the job; every rank returns the whole manifest)."""
    ranks = ranks or Distributed.alone()
    options = options or RemoteOptions(progress=progress)
    root = _root(path, options)
    storage = root.as_root()
    scanned = scan(root)
    listing = list_files(storage, keep=_loader_files(scanned))
    if listing.refused:
        rel, reason = next(iter(listing.refused.items()))
        raise CannotInspectError(f"{root.path}/{legible(rel)} {reason}; no manifest written")
    unknown = [rel for rel, size in listing.files.items() if size is None]
    if unknown:
        raise CannotInspectError(
            f"{root.path}/{legible(unknown[0])}: the store does not say its size; no manifest "
            "written"
        )
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
        ranks=ranks,
    )
    for d in done.values():
        if d.error is not None:
            raise CannotInspectError(
                f"{root.path}/{legible(d.file)} {d.error}; no manifest written"
            )
    # The tensor a loader gets, with its hash (`tensors_of`: the copy transformers keeps).
    records, _ = hashed_tensors(scanned, {rel: d.tensors for rel, d in done.items()}, ranks=ranks)
    # Every file read whole (its size is what was read): the same on every rank.
    files = {rel: FileRecord(d.read, d.sha256) for rel, d in sorted(done.items())}
    tensors = {name: r for name, r in records.items() if r.file in files}
    return Manifest(files, tensors, created=_now(), tool=_tool())


def write_manifest(
    path: str | Path,
    *,
    output: str | Path | None = None,
    workers: int | None = None,
    progress: bool | None = None,
    distributed: bool = False,
) -> Path:
    """Write the manifest of the local checkpoint folder `path`, atomically (temp file,
    fsync, rename), to `output` or to `MANIFEST_NAME` inside the folder; returns where.

    `distributed`: the ranks of this torchrun job share the reading (files balanced by
    bytes), rank 0 writes, and no rank returns before the file is in place; every rank must
    call it alike (a training loop that saves from every rank calls it from every rank)."""
    if output is None and isinstance(path, str) and is_remote(path):
        raise CannotInspectError(
            f"{path}: a remote checkpoint's manifest is written locally; give -o FILE (then "
            f"upload it into the checkpoint folder as {MANIFEST_NAME})"
        )
    dest = Path(output) if output is not None else Path(path) / MANIFEST_NAME
    if dest.is_dir() or dest.is_symlink():  # before any file is read
        raise CannotInspectError(
            f"{dest} is a folder or a link; the manifest is only written as a regular file"
        )
    ranks = Distributed.start() if distributed else Distributed.alone()
    manifest = build_manifest(path, workers=workers, progress=progress, ranks=ranks)
    if ranks.lead:
        write_atomic(dest, manifest_bytes(manifest))
    ranks.finish()
    return dest


def _loader_files(scanned: ScannedCheckpoint) -> set[str]:
    """The tensor files the scan read and the layout's map of tensors to files: what a
    loader reads by the names the checkpoint gives them."""
    mapped = {s.file for s in scanned.shards} | {d.file for d in scanned.sidecars.values()}
    if scanned.index is not None:
        mapped.add(scanned.index.file)
    if scanned.dcp is not None and scanned.dcp.mapping_file:
        mapped.add(scanned.dcp.mapping_file)
    return mapped
