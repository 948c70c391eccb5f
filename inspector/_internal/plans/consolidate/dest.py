"""DEST, the folder a consolidation writes into.

DEST may be an existing checkpoint, or a path inside a downloaded or shared folder where
someone planted a link: so it is opened once without following a link and every step goes
through that descriptor, and nothing is written until every entry of DEST is this very
plan's own output (else refused, or with `overwrite` moved into a backup). The promise:
SECURITY.md, 4; what counts as our own output: docs/architecture.md, "plans/".
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from inspector._internal.common.filenames import INDEX_NAME, MANIFEST_NAME
from inspector._internal.common.text import examples
from inspector._internal.execution.atomic import (
    BACKUP_DIR,
    new_backup_dir,
    open_fresh,
    write_atomic,
)
from inspector._internal.execution.temps import (
    Leftovers,
    find_leftovers,
    parse_temp_name,
    remove_leftovers,
)
from inspector._internal.plans.consolidate.records import OutputFile, PlanView, index_bytes
from inspector._internal.storage import TooLargeError
from inspector.errors import PlanRefusedError, UnsafeFileError, UnsafeInputError

__all__ = ["Dest", "Foreign", "foreign_entries", "is_complete", "not_a_folder", "refusal"]

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
# Copied metadata files (config, tokenizer) are compared whole; none is near this size.
_COMPARE_CAP = 256 << 20


class Dest:
    """DEST as a descriptor opened without following links; every write goes through it."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self.fd = fd

    @classmethod
    def open(cls, path: Path) -> Dest:
        """Create DEST if needed (its parents are the user's path) and open it as a real
        folder; a link or a file there is refused."""
        path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, 0o755)
        try:
            fd = os.open(path, os.O_RDONLY | _DIRECTORY | _NOFOLLOW)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise UnsafeInputError(not_a_folder(path)) from None
            raise
        return cls(path, fd)

    def close(self) -> None:
        os.close(self.fd)

    def __enter__(self) -> Dest:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def names(self) -> list[str]:
        return sorted(os.listdir(self.fd))

    def lstat(self, name: str) -> os.stat_result | None:
        try:
            return os.stat(name, dir_fd=self.fd, follow_symlinks=False)
        except FileNotFoundError:
            return None

    def read(self, name: str, limit: int) -> bytes | None:
        """At most `limit` bytes of a regular file of DEST (never through a link, never
        blocking on a FIFO), or None when it is not one."""
        try:
            fd = os.open(name, os.O_RDONLY | _NOFOLLOW | _NONBLOCK, dir_fd=self.fd)
        except OSError:
            return None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return None
            return _read_at_most(fd, limit)
        finally:
            os.close(fd)

    def open_partial(self, name: str) -> int:
        """`name` created afresh for writing: a stale file or planted link is removed first."""
        return open_fresh(name, dir_fd=self.fd, flags=os.O_RDWR, mode=0o644)

    def rename(self, src: str, dst: str) -> None:
        os.replace(src, dst, src_dir_fd=self.fd, dst_dir_fd=self.fd)

    def remove(self, name: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=self.fd)

    def write(self, name: str, data: bytes) -> None:
        """Temp file, fsync, rename, all inside DEST."""
        write_atomic(Path(name), data, dir_fd=self.fd)

    def sync(self) -> None:
        with contextlib.suppress(OSError):  # some file systems cannot fsync a folder
            os.fsync(self.fd)

    def clear_leftovers(self, plan: PlanView) -> Leftovers:
        """Remove the temp files a killed run of this plan left for the files it writes
        through one (the index, the copied metadata files, the manifest), when their pid is
        gone; report any other entry named like them. Called by rank 0 once every rank has
        checked DEST and before anything is written: this consolidation owns DEST then (a
        second one writing it at once would clash anyway), so the pid is what is left to
        prove (`execution/temps.py`)."""
        names = {INDEX_NAME, MANIFEST_NAME, *(Path(rel).name for rel in plan.metadata_files)}
        found = find_leftovers(self.path, writes=names, locked=True, dir_fd=self.fd)
        return remove_leftovers(self.path, found, dir_fd=self.fd)

    def retire(self, names: list[str]) -> Path | None:
        """Move `names` (any kind of entry, links included, as they are) into a fresh
        `.ckpt-inspect-backup/<time>/` folder of DEST; returns it, or None if no names."""
        if not names:
            return None
        backup = new_backup_dir(self.path)
        parent = self._subfolder(self.fd, BACKUP_DIR)
        try:
            folder = self._subfolder(parent, backup.name)
            try:
                for name in names:
                    os.rename(name, name, src_dir_fd=self.fd, dst_dir_fd=folder)
                os.fsync(folder)
            finally:
                os.close(folder)
        finally:
            os.close(parent)
        self.sync()
        return backup

    def _subfolder(self, parent: int, name: str) -> int:
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, 0o755, dir_fd=parent)
        try:
            return os.open(name, os.O_RDONLY | _DIRECTORY | _NOFOLLOW, dir_fd=parent)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise UnsafeInputError(
                    f"{self.path / BACKUP_DIR} is a symbolic link or a file, not the backup "
                    "folder ckpt-inspect makes; remove it, then run again"
                ) from None
            raise


def not_a_folder(path: Path) -> str:
    """Why DEST cannot be written into, with what to do (a link, or not a folder)."""
    if os.path.islink(path):
        target = ""
        with contextlib.suppress(OSError):
            target = f" (to {os.readlink(path)})"
        return (
            f"{path}: DEST is a symbolic link{target}; consolidate writes only into a real "
            "folder, never through a link (one planted in a shared or downloaded folder may "
            "point anywhere): pass the folder itself, or remove the link"
        )
    return f"{path}: DEST exists and is not a folder; choose a new or empty folder as DEST"


def is_complete(dest: Dest, output: OutputFile) -> bool:
    """A finished output of this plan: final name, planned size, exactly the planned header."""
    info = dest.lstat(output.name)
    if info is None or not stat.S_ISREG(info.st_mode) or info.st_size != output.size:
        return False
    return dest.read(output.name, len(output.header)) == output.header


@dataclass(frozen=True, slots=True)
class Foreign:
    """An entry of DEST this plan did not write, and whether a name we write replaces it."""

    name: str
    why: str
    replaced: bool


@dataclass(frozen=True, slots=True)
class _Planned:
    """What a file this plan writes holds: `head`, its first bytes (all of them for the
    index and the copied files, the header for an output), its `size`, and `cut` when a
    crash may leave it shorter (a `.partial`, a temp file)."""

    head: bytes
    size: int
    cut: bool = False


def foreign_entries(dest: Dest, plan: PlanView) -> list[Foreign]:
    """Every entry of DEST that is not this plan's own output (see the module docs)."""
    names = dest.names()
    planned = _planned(plan, set(names))
    foreign = []
    for name in names:
        want = planned.get(name) or _temp_of(name, planned)
        why = _not_ours(dest, name, want)
        if why is not None:
            foreign.append(Foreign(name, why, want is not None))
    return foreign


def _planned(plan: PlanView, present: set[str]) -> dict[str, _Planned]:
    out: dict[str, _Planned] = {}
    for output in plan.outputs:
        out[output.name] = _Planned(output.header, output.size)
        # Written header first, then sized: a crash may cut it anywhere.
        out[output.name + ".partial"] = _Planned(output.header, output.size, cut=True)
    if plan.index_file:
        index = index_bytes(plan)
        out[INDEX_NAME] = _Planned(index, len(index))
    for rel in plan.metadata_files:
        name = Path(rel).name
        # Read (remote: fetched) only when DEST holds an entry under its name to compare.
        data = _source_bytes(plan, rel) if name in present else None
        if data is not None:
            out[name] = _Planned(data, len(data))
    return out


def _temp_of(name: str, planned: dict[str, _Planned]) -> _Planned | None:
    """The temp file `write_atomic` writes for the index or a copied file: a prefix."""
    # Exactly the name `write_atomic` gives it (the one parser: look-alike digits are not).
    parsed = parse_temp_name(name)
    want = planned.get(parsed[0]) if parsed else None
    if want is None or want.cut or len(want.head) != want.size:
        return None  # outputs are written as .partial, never through a temp file
    return _Planned(want.head, want.size, cut=True)


def _not_ours(dest: Dest, name: str, want: _Planned | None) -> str | None:
    """Why `name` is not this plan's output, or None when it is."""
    info = dest.lstat(name)
    if info is None:
        return None  # gone meanwhile
    if name == BACKUP_DIR and stat.S_ISDIR(info.st_mode):
        return None  # earlier backups: left as they are, never written into again
    if stat.S_ISLNK(info.st_mode):
        return "a symbolic link"
    if not stat.S_ISREG(info.st_mode):
        return "a folder" if stat.S_ISDIR(info.st_mode) else "not a regular file"
    if want is None:
        # The content manifest (or a temp file of its atomic write) is ours: it is rewritten
        # once the outputs are (`ConsolidationPlan.execute`).
        parsed = parse_temp_name(name)
        ours = name == MANIFEST_NAME or (parsed is not None and parsed[0] == MANIFEST_NAME)
        return None if ours else "not a file this consolidation writes"
    if want.cut:
        got = dest.read(name, min(info.st_size, len(want.head)))
        ok = info.st_size <= want.size and got is not None and want.head.startswith(got)
    else:
        ok = info.st_size == want.size and dest.read(name, len(want.head)) == want.head
    return None if ok else "other content than this plan writes"


def _source_bytes(plan: PlanView, rel: str) -> bytes | None:
    """A source metadata file's bytes, read through the source's storage (a regular file
    inside the folder, local or remote, under the cap), or None."""
    try:
        return plan.source_storage.read_bytes(rel, cap=_COMPARE_CAP)
    except (OSError, TooLargeError, UnsafeFileError):
        return None


def _read_at_most(fd: int, limit: int) -> bytes:
    parts = []
    while limit > 0:
        chunk = os.read(fd, min(limit, 1 << 20))
        if not chunk:
            break
        parts.append(chunk)
        limit -= len(chunk)
    return b"".join(parts)


def refusal(dest: Path, foreign: list[Foreign]) -> PlanRefusedError:
    # What a written file would replace first: that is what the user stands to lose.
    ordered = sorted(foreign, key=lambda f: not f.replaced)
    shown = examples([f"{f.name} ({f.why})" for f in ordered], limit=6)
    return PlanRefusedError(
        f"{dest}: DEST is not empty: {len(foreign)} entr{'y' if len(foreign) == 1 else 'ies'} "
        f"not written by this consolidation: {shown}; consolidate writes only into an empty "
        "folder or one holding its own earlier output of this same plan. Choose an empty "
        "DEST, or pass --overwrite to replace what is there (each replaced entry is first "
        f"moved to {dest / BACKUP_DIR}/<time>/; entries under other names are left alone)"
    )
