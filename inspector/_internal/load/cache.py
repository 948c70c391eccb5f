"""The load verdict kept in the user's cache, so that a checkpoint's verdict is paid once.

A verdict imports torch and transformers and builds the model, yet changes only when what it
reads changes: each verdict computed is kept as one JSON file, found by a key made of
everything that decides it. The cache is untrusted input in a folder outside the checkpoint:
how it is read and written is SECURITY.md, 4b; the key: docs/architecture.md, "load/".
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import re
import stat
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import msgspec
import orjson

from inspector._internal.execution.atomic import temp_name, write_atomic
from inspector._internal.execution.temps import parse_temp_name
from inspector.errors import UnsafeInputError

__all__ = [
    "CACHE_ENV",
    "MAX_ENTRIES",
    "MAX_ENTRY_BYTES",
    "MAX_TOTAL_BYTES",
    "cache_root",
    "code_digest",
    "entry_name",
    "environment",
    "keep",
    "kept",
    "verdict_folder",
]

# Where the cache is, instead of the user's cache folder (tests point it at a temp folder).
CACHE_ENV = "CKPT_INSPECT_CACHE_DIR"
_APP = "checkpoint-inspector"
_VERDICTS = "verdicts"
_FORMAT = "ckpt-inspect-verdict"
_VERSION = 1
# The largest entry written or read: a 300,000-tensor NVFP4 checkpoint's verdict lists its
# ~300,000 quantization tensors in about 20 MB; a million-tensor one (70 MB) still fits.
MAX_ENTRY_BYTES = 128 << 20
# The folder's bounds, kept by every write: least recently used entries go first.
MAX_TOTAL_BYTES = 512 << 20
MAX_ENTRIES = 512
# The most names of the folder looked at by one write's clean-up (the folder is ours: a
# fuller one was filled by hand, and the bound keeps a write from walking it for long).
_WALK_NAMES = 65_536
# A writer waits this long for another one, then keeps nothing (a write takes well under
# a second; a miss costs seconds already).
_LOCK_SECONDS = 5.0
_LOCK = ".lock"
# The most entries of a folder walked, and bytes of Python files read, for the digest of its
# code (`code_digest`); past either, nothing is kept.
_CODE_ENTRIES = 100_000
_CODE_BYTES = 64 << 20
_CODE_DEPTH = 32
# A temp file older than this is a killed writer's (writers hold the lock while they write).
_STALE_SECONDS = 600.0
_ENTRY = re.compile(r"[0-9a-f]{64}\.json")
# Reads a 16 MB entry (300,000 names) in 2-3x less time than orjson, into plain objects.
_DECODER = msgspec.json.Decoder()
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
# Descriptor-relative calls keep every step inside the folder opened once; where the OS has
# none (Windows) the cache is off.
_USABLE = (
    {os.open, os.mkdir, os.unlink, os.stat} <= os.supports_dir_fd
    and os.scandir in os.supports_fd
    and hasattr(os, "geteuid")
)


def cache_root() -> Path:
    """The tool's cache folder: `$CKPT_INSPECT_CACHE_DIR`, else the user's cache folder for
    the tool (platformdirs). Reached as the user set it up (a link on the way is theirs).
    Only an absolute path is ever used (`_open_folder`): a relative one, from the variable
    or from a home that cannot be found, would put the cache in whatever folder the
    command runs in, a checkpoint's maybe."""
    given = os.environ.get(CACHE_ENV)
    if given:
        return Path(given).expanduser()
    import platformdirs  # only here: most commands never need it

    return Path(platformdirs.user_cache_dir(_APP, appauthor=False))


def verdict_folder() -> Path:
    """The folder of the verdict entries, `cache_root() / "verdicts"`."""
    return cache_root() / _VERDICTS


@functools.cache
def environment() -> dict[str, str | None] | None:
    """What decides a verdict besides the checkpoint and the options: the installed versions
    of transformers and torch (as their metadata says, so that this process and the
    dashboard's child, which imported them, agree), Python's, this tool's, and the digest
    of this tool's code. None when a version cannot be known: then nothing is kept.
    Computed once per process, as the code it describes is imported once."""
    # Imported here: a command that keeps no verdict (`check --no-model`) never pays for it.
    import importlib.metadata

    try:
        versions = {name: importlib.metadata.version(name) for name in ("transformers", "torch")}
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return None
    try:
        tool: str | None = importlib.metadata.version(_APP)
    except (importlib.metadata.PackageNotFoundError, ValueError):
        tool = None  # run from a checkout: the code digest says which code
    code = code_digest(Path(__file__).resolve().parents[2])
    if code is None:
        return None
    return {**versions, "python": sys.version, "tool": tool, "tool_code": code}


def code_digest(folder: Path) -> str | None:
    """A SHA-256 of the Python files in `folder` and below, by path, kind and content: the
    tool's own code (`environment()`), or a checkpoint folder's code that
    `trust_remote_code` may run (`import_from_folder` resolves `a.b` to `a/b.py` or
    `a/b/__init__.py`). A link is taken as its target's name (a link among a folder's files
    stops its code from running at all), another kind of file by its kind, never opened (a
    FIFO would block). `__pycache__` is left out: it is never loaded. Walked without
    following links; None past `_CODE_ENTRIES` entries, `_CODE_BYTES` bytes or
    `_CODE_DEPTH` levels, or when a file cannot be read."""
    h = hashlib.sha256()
    entries = size = 0
    for top, dirs, files in os.walk(folder):
        # Python 3.11's walk recurses once per level: a folder nested past any package's
        # depth is refused before it ends in a RecursionError.
        if os.path.relpath(top, folder).count(os.sep) >= _CODE_DEPTH:
            return None
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        entries += len(dirs) + len(files)
        if entries > _CODE_ENTRIES:
            return None
        for name in sorted(files):
            if not name.endswith(".py"):
                continue
            path = os.path.join(top, name)
            found = _code_file(path)
            if found is None:
                return None
            kind, data = found
            size += len(data)
            if size > _CODE_BYTES:
                return None
            h.update(orjson.dumps([os.path.relpath(path, folder), kind, len(data)]))
            h.update(data)
    return h.hexdigest()


def _code_file(path: str) -> tuple[str, bytes] | None:
    """(kind, bytes) of one Python file: ("file", its content), ("link", its target's
    name) or (another kind, nothing)."""
    try:
        info = os.lstat(path)
        if stat.S_ISLNK(info.st_mode):
            return "link", os.fsencode(os.readlink(path))
        if not stat.S_ISREG(info.st_mode):
            return f"mode {stat.S_IFMT(info.st_mode):o}", b""
        fd = os.open(path, os.O_RDONLY | _NOFOLLOW | _NONBLOCK | _CLOEXEC)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return None  # swapped since the lstat: this key would describe neither
            data = _read_capped(fd, _CODE_BYTES)
        finally:
            os.close(fd)
    except OSError:
        return None
    return None if data is None else ("file", data)


def _read_capped(fd: int, cap: int) -> bytes | None:
    """What `fd` holds, when it is at most `cap` bytes (a file growing while it is read
    stops at the cap); None past it."""
    chunks, size = [], 0
    while size <= cap:
        chunk = os.read(fd, min(cap + 1 - size, 16 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return None if size > cap else b"".join(chunks)


def entry_name(key: Mapping[str, Any]) -> str:
    """The file name of the entry of `key` (complete: with `environment()`)."""
    return hashlib.sha256(orjson.dumps(key, option=orjson.OPT_SORT_KEYS)).hexdigest() + ".json"


def kept(key: Mapping[str, Any]) -> dict[str, Any] | None:
    """The verdict kept for `key` (the caller's part), as `LoadVerdict.to_dict()` wrote it
    and still to be checked field by field (`LoadVerdict.from_dict`); None when there is no
    usable entry (see the module docstring)."""
    full = _full(key)
    if full is None:
        return None
    folder = _open_folder(create=False)
    if folder is None:
        return None
    try:
        data = _read_entry(folder, entry_name(full))
    finally:
        os.close(folder)
    if data is None:
        return None
    try:
        entry = _DECODER.decode(data)
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError):  # nested past the limit
        return None
    if not isinstance(entry, dict) or entry.get("format") != _FORMAT:
        return None
    if entry.get("version") != _VERSION or entry.get("key") != full:
        return None  # another format, or an entry copied under another key's name
    verdict = entry.get("verdict")
    return verdict if isinstance(verdict, dict) else None


def keep(key: Mapping[str, Any], verdict: Mapping[str, Any]) -> bool:
    """Keep `verdict` (a complete `LoadVerdict.to_dict()`) for `key`, replacing the entry
    there; then hold the folder to its bounds. False when nothing was kept (no environment,
    an entry over `MAX_ENTRY_BYTES`, a folder that cannot be written): never an error."""
    full = _full(key)
    if full is None:
        return False
    data = orjson.dumps({"format": _FORMAT, "version": _VERSION, "key": full, "verdict": verdict})
    if len(data) > MAX_ENTRY_BYTES:
        return False
    folder = _open_folder(create=True)
    if folder is None:
        return False
    name = entry_name(full)
    try:
        with _locked(folder):
            if not _replaceable(folder, name):
                return False
            try:
                write_atomic(Path(name), data, dir_fd=folder)
            except BaseException:
                with contextlib.suppress(OSError):  # a full disk leaves no half entry behind
                    os.unlink(temp_name(name), dir_fd=folder)
                raise
            with contextlib.suppress(OSError):  # kept; the clean-up waits for the next write
                _bound(folder, keep=name)
        return True
    # Unwritable, full, locked too long, no flock (filelock before 4 raises
    # NotImplementedError for it): no cache.
    except (OSError, UnsafeInputError, NotImplementedError):
        return False
    finally:
        os.close(folder)


def _full(key: Mapping[str, Any]) -> dict[str, Any] | None:
    if not _USABLE:
        return None
    env = environment()
    return None if env is None else {**key, **env}


def _ours(info: os.stat_result) -> bool:
    return info.st_uid == os.geteuid()


def _open_folder(*, create: bool) -> int | None:
    """A descriptor of the verdicts folder (made with `create`), when it is a folder of
    this user's, reached through no link at its own name, that no one else may write."""
    if not _USABLE:
        return None
    root = cache_root()
    if not root.is_absolute() or not _root_usable(root):
        return None
    try:
        if create:
            root.mkdir(mode=0o700, parents=True, exist_ok=True)
        top = os.open(root, os.O_RDONLY | _DIRECTORY | _CLOEXEC)
        try:
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(_VERDICTS, 0o700, dir_fd=top)
            fd = os.open(_VERDICTS, os.O_RDONLY | _DIRECTORY | _NOFOLLOW | _CLOEXEC, dir_fd=top)
        finally:
            os.close(top)
    except OSError:
        return None
    info = os.fstat(fd)
    if not stat.S_ISDIR(info.st_mode) or not _ours(info) or info.st_mode & 0o022:
        os.close(fd)
        return None
    return fd


def _root_usable(root: Path) -> bool:
    """False when the root's own name is a link another user made (in a shared folder such
    as /tmp, it could send the cache into any folder of ours); a link of ours, or of the
    system's, is the user's set-up."""
    try:
        info = os.lstat(root)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return not stat.S_ISLNK(info.st_mode) or info.st_uid in (os.geteuid(), 0)


def _is_entry(info: os.stat_result) -> bool:
    """A file as this module writes it: regular, ours, of one name (a second name of
    another file is not ours to read, touch or replace)."""
    return stat.S_ISREG(info.st_mode) and _ours(info) and info.st_nlink == 1


def _read_entry(folder: int, name: str) -> bytes | None:
    """The bytes of entry `name`: an entry file (`_is_entry`) of at most `MAX_ENTRY_BYTES`,
    its kind checked before it is opened (a device is never opened) and again after."""
    try:
        seen = os.stat(name, dir_fd=folder, follow_symlinks=False)
        if not _is_entry(seen) or seen.st_size > MAX_ENTRY_BYTES:
            return None
        fd = os.open(name, os.O_RDONLY | _NOFOLLOW | _NONBLOCK | _CLOEXEC, dir_fd=folder)
    except OSError:  # absent, or replaced by a link or a FIFO since
        return None
    try:
        info = os.fstat(fd)
        same = (info.st_dev, info.st_ino) == (seen.st_dev, seen.st_ino)
        if not same or not _is_entry(info) or info.st_size > MAX_ENTRY_BYTES:
            return None
        data = _read_capped(fd, MAX_ENTRY_BYTES)
        if data is not None:
            with contextlib.suppress(OSError):  # used now: evicted last (read-only: as is)
                os.utime(fd)
        return data
    except OSError:
        return None
    finally:
        os.close(fd)


@contextlib.contextmanager
def _locked(folder: int) -> Iterator[None]:
    """The folder's write lock (`filelock` on `.lock` in it; a link, FIFO or folder planted
    there is removed first, never followed)."""
    from filelock import FileLock  # only writers need it

    with contextlib.suppress(FileNotFoundError):
        info = os.stat(_LOCK, dir_fd=folder, follow_symlinks=False)
        if not _is_entry(info):
            if stat.S_ISDIR(info.st_mode):
                raise UnsafeInputError(f"{_LOCK} in the verdict cache is a folder")
            os.unlink(_LOCK, dir_fd=folder)
    with FileLock(_lock_path(folder), timeout=_LOCK_SECONDS):
        yield


def _lock_path(folder: int) -> str:
    """The lock's path through the folder's descriptor where the OS names one (Linux), so
    that the lock is the one in the folder checked; else by name."""
    proc = f"/proc/self/fd/{folder}"
    if os.path.isdir(proc):
        return f"{proc}/{_LOCK}"
    return str(verdict_folder() / _LOCK)


def _replaceable(folder: int, name: str) -> bool:
    """Nothing is at `name`, or an entry file (never a link, a folder, another's file)."""
    try:
        info = os.stat(name, dir_fd=folder, follow_symlinks=False)
    except FileNotFoundError:
        return True
    return _is_entry(info)


def _bound(folder: int, *, keep: str) -> None:
    """Hold the folder to `MAX_ENTRIES` and `MAX_TOTAL_BYTES` (least recently used entries
    removed first, never `keep`), and remove temp files killed writers left. Only regular
    files of ours with our names are counted or removed."""
    now = time.time()
    entries: list[tuple[int, str, int]] = []
    with os.scandir(folder) as listing:
        for seen, item in enumerate(listing):
            if seen >= _WALK_NAMES:
                break
            # A temp file is exactly what `write_atomic` names one of an entry: the one
            # parser of temp names (`execution/temps.py`), which takes ASCII digits only.
            entry, temp = _ENTRY.fullmatch(item.name), parse_temp_name(item.name)
            temp = temp if temp is not None and _ENTRY.fullmatch(temp[0]) else None
            if not (entry or temp):
                continue
            try:
                info = item.stat(follow_symlinks=False)
            except OSError:
                continue
            if not _is_entry(info):
                continue
            if entry:
                entries.append((info.st_mtime_ns, item.name, info.st_size))
            elif now - info.st_mtime > _STALE_SECONDS:
                with contextlib.suppress(OSError):
                    os.unlink(item.name, dir_fd=folder)
    count, total = len(entries), sum(size for _, _, size in entries)
    for _, name, size in sorted(entries):
        if count <= MAX_ENTRIES and total <= MAX_TOTAL_BYTES:
            break
        if name == keep:
            continue
        with contextlib.suppress(OSError):
            os.unlink(name, dir_fd=folder)
        count, total = count - 1, total - size
