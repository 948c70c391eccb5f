"""Remote checkpoints: S3 (s3fs), GCS (gcsfs), the Hugging Face Hub (its HTTP API) and
HTTP(S), all on aiohttp sessions carrying the guard of `inspector/_internal/storage/guard.py`.
Optional: `pip install 'checkpoint-inspector[remote]'`; nothing here imports fsspec or
aiohttp until a URL is opened.

Reads are few and bounded because every request is slow and every server is input: a folder
is listed once, a header costs one ranged GET, retries follow one policy. How it reads:
docs/architecture.md, "storage/"; what a server cannot do: SECURITY.md, 3b.
"""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import hashlib
import inspect
import os
import random
import ssl
import threading
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar
from urllib.parse import quote, unquote

from inspector._internal.common.defaults import (
    DEFAULT_READ_AHEAD,
    DEFAULT_READ_TIMEOUT,
    DEFAULT_TIMEOUT,
)
from inspector._internal.common.filenames import TORCH_DIST_METADATA
from inspector._internal.storage.backends import (
    Backend,
    GcsBackend,
    HttpBackend,
    HubBackend,
    S3Backend,
)
from inspector._internal.storage.base import (
    Entry,
    EntryKind,
    IOStats,
    Location,
    RemoteURL,
    TooLargeError,
    check_member,
)
from inspector._internal.storage.guard import (
    RedirectRefused,
    RemoteAnswerError,
    guarded_client,
    guarded_session_kwargs,
    on_hub,
    quoted,
    s3_http_session_class,
    socket_timeout,
)
from inspector._internal.storage.local import file_identity
from inspector._internal.storage.options import RETRY_WAIT, RemoteOptions
from inspector._internal.storage.urls import HfLocation, RemoteTarget, parse_remote
from inspector.errors import (
    CannotInspectError,
    InspectorError,
    RemoteAccessError,
    UnsafeFileError,
)

__all__ = [
    "DEFAULT_READ_AHEAD",
    "DEFAULT_READ_TIMEOUT",
    "DEFAULT_TIMEOUT",
    "RETRY_WAIT",
    "FsspecStorage",
    "RemoteFile",
    "RemoteOptions",
    "open_remote",
]

T = TypeVar("T")
U = TypeVar("U")
# How much of a file's start `prefetch` fetches: a byte count, or a function of the first
# bytes and the file size.
Want = int | Callable[[bytes, int], int]

# The longest single request: longer reads are made of several (each with its deadline).
_BLOCK = 8 << 20
_KEPT_HEADS = 16
_TRANSIENT_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})
# Exception classes (by name, so that no optional library must be importable) that mean the
# connection failed or timed out: worth another try.
_TRANSIENT_NAMES = frozenset(
    {
        "ClientConnectionError",
        "ClientConnectorError",
        "ClientOSError",
        "ClientPayloadError",
        "ServerDisconnectedError",
        "ServerTimeoutError",
        "SocketTimeoutError",
        "EndpointConnectionError",
        "ConnectionClosedError",
        "ReadTimeoutError",
        "ConnectTimeoutError",
        "ResponseStreamingError",
        "IncompleteRead",
        "IncompleteReadError",
        "ChunkedEncodingError",
        "RemoteDisconnected",
        "FSTimeoutError",
    }
)
_TIMEOUT_NAMES = frozenset(
    {
        "ServerTimeoutError",
        "SocketTimeoutError",
        "ReadTimeoutError",
        "ConnectTimeoutError",
        "ConnectionTimeoutError",
        "FSTimeoutError",
        "TimeoutError",
    }
)
_NO_CREDENTIALS = frozenset(
    {
        "NoCredentialsError",
        "PartialCredentialsError",
        "CredentialRetrievalError",
        "DefaultCredentialsError",
        "RefreshError",
        "LocalTokenNotFoundError",
    }
)
# botocore's errors for a profile or config file it cannot use (before: "input/output
# error", which sent the user to the disk).
_BAD_CONFIGURATION = frozenset({"ProfileNotFound", "ConfigParseError", "ConfigNotFound"})
_FILE_SUFFIXES = (".safetensors", ".json", TORCH_DIST_METADATA, ".distcp", ".pt")


@dataclass
class _Shared:
    """What the storages of one checkpoint (the root and its sub-folders) share."""

    backend: Backend
    options: RemoteOptions
    protocol: str
    stats: IOStats = field(default_factory=IOStats)
    listings: dict[str, tuple[bool, list[Entry]]] = field(default_factory=dict)
    # Entries described by a metadata request (HEAD), by key: asked once per scan.
    described: dict[str, Entry | None] = field(default_factory=dict)
    # The last few read-aheads by key: detection reads a header the scan reads again.
    heads: OrderedDict[str, bytes] = field(default_factory=OrderedDict)
    # Starts of files fetched ahead by `prefetch` (or why they could not be), until opened.
    prefetched: dict[str, bytes | Exception] = field(default_factory=dict)
    # The longest start of a file a reader needed past its read-ahead so far: shards of one
    # checkpoint have headers of similar length, so later read-aheads cover it in one GET.
    needed: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    # Requests in flight from threads, over every `map` running at once (consolidate writes
    # several files in parallel, each fetching its blocks concurrently): at most
    # max_concurrency, so memory holds at most that many fetched blocks.
    gate: threading.BoundedSemaphore = field(init=False)
    # Requests in flight on the store's event loop (every ranged read goes through it): at
    # most max_concurrency whatever the threads and coroutines asking. Made on the loop.
    _requests: asyncio.Semaphore | None = None

    def __post_init__(self) -> None:
        self.gate = threading.BoundedSemaphore(self.options.max_concurrency)

    def requests(self) -> asyncio.Semaphore:
        """The gate on requests in flight (only ever used on the store's loop)."""
        if self._requests is None:
            self._requests = asyncio.Semaphore(self.options.max_concurrency)
        return self._requests

    def head(self, key: str) -> bytes:
        """What `prefetch` fetched of a file (raising what fetching it raised), or the last
        read-ahead kept for it."""
        with self.lock:
            found = self.prefetched.pop(key, None)
        if found is None:
            with self.lock:
                return self.heads.get(key, b"")
        if isinstance(found, Exception):
            raise found
        self.keep_head(key, found)  # opened again soon, maybe (a config salvaged after a read)
        return found

    def read_ahead(self) -> int:
        # A quarter more than the longest header seen, in whole 4 KiB pages.
        grown = -(-self.needed * 5 // 4 // 4096) * 4096
        return max(self.options.read_ahead, grown)

    def saw_prefix(self, length: int) -> None:
        with self.lock:
            self.needed = max(self.needed, length)

    def keep_head(self, key: str, data: bytes) -> None:
        with self.lock:
            self.heads[key] = data
            while len(self.heads) > _KEPT_HEADS:
                self.heads.popitem(last=False)


class FsspecStorage:
    """A remote folder: `key` is the path its store's backend takes, `url` what people see.
    Build one with `open_remote`."""

    is_local = False

    def __init__(self, shared: _Shared, key: str, url: str) -> None:
        self._shared = shared
        self._key = key.rstrip("/")
        self._url = url.rstrip("/")

    @property
    def path(self) -> RemoteURL:
        return RemoteURL(self._url)

    @property
    def stats(self) -> IOStats:
        return self._shared.stats

    @property
    def options(self) -> RemoteOptions:
        return self._shared.options

    def __repr__(self) -> str:
        return f"FsspecStorage({self._url!r})"

    def sub(self, rel: str) -> FsspecStorage:
        rel = check_member(rel)
        if not rel:
            return self
        return FsspecStorage(self._shared, self._join(rel), f"{self._url}/{rel}")

    def fresh(self) -> FsspecStorage:
        shared = self._shared
        shared.backend.invalidate()
        return FsspecStorage(
            _Shared(shared.backend, shared.options, shared.protocol), self._key, self._url
        )

    def _join(self, rel: str) -> str:
        if not rel:
            return self._key
        if self._shared.protocol == "http":
            return f"{self._key}/{quote(rel, safe='/')}"
        return f"{self._key}/{rel}"

    def _show(self, rel: str) -> str:
        return f"{self._url}/{rel}" if rel else self._url

    # -- listing ---------------------------------------------------------------------------

    def _listing(self, rel: str) -> tuple[bool, list[Entry]]:
        """(authoritative, entries) of folder `rel`, listed once. Not authoritative: the store
        could not list it (an HTTP server without index pages), so absence proves nothing.
        A listing the guard refuses (too long, a redirect elsewhere) is one line
        (`RemoteAccessError`): nothing in the folder can be trusted to be complete."""
        key = self._join(rel)
        shared = self._shared
        with shared.lock:
            cached = shared.listings.get(key)
        if cached is not None:
            return cached
        http = shared.protocol == "http"
        try:
            infos = self._run(partial(shared.backend.listdir, key), rel)
            found = (not http or bool(infos), _entries(infos, key, http=http))
        except (FileNotFoundError, NotADirectoryError):
            found = (not http, [])
        except (RemoteAnswerError, UnsafeFileError) as exc:
            raise _unlistable(self._show(rel), exc) from None
        except OSError:
            found = (False, [])
        with shared.lock:
            shared.listings[key] = found
        return found

    def entries(self, rel: str = "") -> list[Entry]:
        return list(self._listing(check_member(rel))[1])

    def stat(self, rel: str) -> Entry | None:
        rel = check_member(rel)
        if not rel:
            return Entry(self.path.name, EntryKind.DIR)
        parent, _, name = rel.rpartition("/")
        authoritative, entries = self._listing(parent)
        for entry in entries:
            if entry.name == name:
                if entry.kind is EntryKind.FILE and entry.size is None:
                    return self._info(rel, name)
                return entry
        return None if authoritative else self._info(rel, name)

    def _info(self, rel: str, name: str) -> Entry | None:
        """One metadata request (HEAD) for an entry the listing did not describe, once per
        scan. A redirect to another origin makes it a refused entry; other failures leave
        its size unknown and say why when it is opened."""
        key = self._join(rel)
        shared = self._shared
        with shared.lock:
            if key in shared.described:
                return shared.described[key]
        try:
            info = self._run(partial(shared.backend.info, key), rel)
        except (FileNotFoundError, NotADirectoryError):
            found = None
        except UnsafeFileError as exc:
            found = Entry(name, EntryKind.REFUSED, reason=exc.reason)
        except OSError as exc:
            found = Entry(name, EntryKind.FILE, reason=exc.strerror or str(exc))
        else:
            size = info.get("size")
            if info.get("type") == "directory":
                found = Entry(name, EntryKind.DIR)
            else:
                found = Entry(name, EntryKind.FILE, size if isinstance(size, int) else None)
        with shared.lock:
            shared.described[key] = found
        return found

    # -- reading ---------------------------------------------------------------------------

    def open(self, rel: str) -> RemoteFile:
        rel = check_member(rel)
        entry = self.stat(rel)
        shown = self._show(rel)
        if entry is None:
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), shown)
        if entry.kind is EntryKind.DIR:
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), shown)
        if entry.kind is EntryKind.REFUSED:
            raise UnsafeFileError(rel, entry.reason or "is refused by the storage")
        if entry.size is None:
            reason = entry.reason or "the store does not say how large it is"
            raise OSError(errno.EIO, reason, shown)
        return RemoteFile(self, rel, entry.size)

    def read_bytes(self, rel: str, *, cap: int) -> bytes:
        with self.open(rel) as reader:
            size = reader.size()
            if size > cap:
                raise TooLargeError(rel, size, cap)
            return reader.read_range(0, size) if size else b""

    def read_range(self, rel: str, offset: int, length: int) -> bytes:
        rel = check_member(rel)
        entry = self.stat(rel)
        end = offset + length
        if entry is not None and entry.size is not None:
            end = min(end, entry.size)  # fewer bytes only at the end of the file
        return self.fetch(rel, offset, end)

    def read_ranges(self, ranges: Sequence[tuple[str, int, int]]) -> list[bytes]:
        out: list[bytes] = []
        for data in self.try_read_ranges(ranges):
            if not isinstance(data, bytes):
                raise data
            out.append(data)
        return out

    def try_read_ranges(
        self, ranges: Sequence[tuple[str, int, int]]
    ) -> list[bytes | OSError | UnsafeFileError]:
        """The ranges read as coroutines on the store's event loop, `max_concurrency` in
        flight (one thread waits; no thread per request: a request then costs the loop
        only the store client's own work)."""
        jobs: list[tuple[str, int, int]] = []
        sizes: dict[str, int | None] = {}
        for rel, offset, length in ranges:
            rel = check_member(rel)
            if rel not in sizes:
                entry = self.stat(rel)
                sizes[rel] = entry.size if entry is not None else None
            size = sizes[rel]
            end = offset + length if size is None else min(offset + length, size)
            jobs.append((rel, offset, end))
        if not jobs:
            return []
        return self._sync(self._read_all, jobs)

    async def _read_all(
        self, jobs: list[tuple[str, int, int]]
    ) -> list[bytes | OSError | UnsafeFileError]:
        out: list[bytes | OSError | UnsafeFileError] = [b""] * len(jobs)
        todo = iter(range(len(jobs)))

        async def worker() -> None:
            for i in todo:  # shared: each job is taken by one worker
                rel, start, end = jobs[i]
                if end <= start:
                    continue
                try:
                    out[i] = await self._aread(rel, start, end)
                except (OSError, UnsafeFileError) as exc:
                    out[i] = exc  # this range's problem; the others are still read

        await _all([worker() for _ in range(min(self.options.max_concurrency, len(jobs)))])
        return out

    def prefetch(self, wanted: Sequence[tuple[str, Want]], *, desc: str = "") -> None:
        """Fetch the start of many files at once, `max_concurrency` requests in flight, so
        that opening them later costs no request. Per file, `want` is how many bytes from the
        start (an int, e.g. a whole JSON file under its cap), or a function of the first
        bytes (the read-ahead) and the file size that says how many are needed (a
        safetensors header's length): the rest is fetched by a second request only then."""
        jobs: list[tuple[str, str, int, Want]] = []
        for rel, want in wanted:
            rel = check_member(rel)
            key = self._join(rel)
            entry = self.stat(rel)
            with self._shared.lock:
                known = key in self._shared.prefetched or key in self._shared.heads
            if known or entry is None or entry.kind is not EntryKind.FILE or not entry.size:
                continue
            if isinstance(want, int) and entry.size > want:
                continue  # over the reader's cap: it refuses the file without reading it
            jobs.append((rel, key, entry.size, want))
        if not jobs:
            return
        bar = _progress(len(jobs), desc, self.options.progress)
        try:
            self._sync(self._prefetch_async, jobs, bar)
        finally:
            bar.close()

    async def _prefetch_async(self, jobs: list[tuple[str, str, int, Want]], bar: Any) -> None:
        gate = asyncio.Semaphore(self.options.max_concurrency)

        async def fetch(rel: str, start: int, end: int | Callable[[], int]) -> bytes:
            async with gate:
                # A read-ahead is sized when its request goes out: by then the first headers
                # may have shown how long this checkpoint's headers are.
                return await self._aread(rel, start, end if isinstance(end, int) else end())

        async def one(rel: str, key: str, size: int, want: Want) -> None:
            fixed = want if isinstance(want, int) else None
            try:
                first = await fetch(rel, 0, lambda: min(size, fixed or self._shared.read_ahead()))
                need = min(size, want if isinstance(want, int) else want(first, size))
                if need > len(first):
                    self._shared.saw_prefix(need)
                    first += await fetch(rel, len(first), need)
            except (OSError, UnsafeFileError) as exc:
                self._keep(key, exc, bar)  # this file's problem: reported when it is read
                return
            self._keep(key, first, bar)

        await _all([one(*job) for job in jobs])

    def _keep(self, key: str, data: bytes | Exception, bar: Any) -> None:
        with self._shared.lock:
            self._shared.prefetched[key] = data
        bar.update(1)

    def fetch(self, rel: str, start: int, end: int) -> bytes:
        """Bytes [start, end) of file `rel` (`end` at most its size): ranged GETs of at most
        8 MiB, each retried on transient errors within its deadline."""
        if end <= start:
            return b""
        with self._shared.gate:
            return self._sync(self._aread, rel, start, end)

    async def _aread(self, rel: str, start: int, end: int) -> bytes:
        key = self._join(rel)
        read = self._shared.backend.read
        parts = []
        for at in range(start, end, _BLOCK):
            stop = min(end, at + _BLOCK)
            async with self._shared.requests():
                data = await self._acall(partial(read, key, at, stop), rel)
            self._shared.stats.add(len(data))
            if len(data) != stop - at:
                raise RemoteAnswerError(
                    f"sent {len(data):,} of the {stop - at:,} bytes asked (bytes {at:,}-"
                    f"{stop - 1:,}): the server cut the answer, or the file changed during "
                    "the scan",
                    self._show(rel),
                )
            parts.append(bytes(data))
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def map(self, fn: Callable[[T], U], items: Sequence[T], *, desc: str = "") -> list[U]:
        if not items:
            return []
        workers = min(self.options.max_concurrency, len(items))
        bar = _progress(len(items), desc, self.options.progress)
        try:
            if workers == 1:
                out = []
                for item in items:
                    out.append(fn(item))
                    bar.update(1)
                return out
            with ThreadPoolExecutor(workers, thread_name_prefix="ckpt-read") as pool:
                futures = [pool.submit(fn, item) for item in items]
                for future in futures:
                    future.add_done_callback(lambda _: bar.update(1))
                done, _ = wait(futures, return_when=FIRST_EXCEPTION)
                if any(f.exception() is not None for f in done):
                    for future in futures:
                        future.cancel()
                return [f.result() for f in futures]
        finally:
            bar.close()

    # -- errors ----------------------------------------------------------------------------

    def _sync(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """`await fn(*args)` on the store's event loop, from this thread."""
        from fsspec.asyn import sync

        result: T = sync(self._shared.backend.loop, fn, *args)
        return result

    def _run(self, make: Callable[[], Awaitable[T]], rel: str) -> T:
        """`_acall` from this thread, within the gate on requests in flight."""
        with self._shared.gate:
            return self._sync(self._acall, make, rel)

    async def _acall(self, make: Callable[[], Awaitable[T]], rel: str) -> T:
        """`await make()` with retries on throttling, 5xx, dropped connections and read
        timeouts, all within the operation's deadline (`options.timeout`); other errors as
        the OSError a local read would give (`UnsafeFileError` for a redirect to another
        origin), or `RemoteAccessError` when the store refuses us outright (no
        credentials), keeps failing or misses the deadline. One loop for every store:
        fsspec's HTTP file system retries nothing; s3fs' and gcsfs' loops (turned off in
        `_backend` and `_file_system`) have no deadline and their own lists of errors."""
        options = self.options
        loop = asyncio.get_running_loop()
        deadline = loop.time() + options.timeout
        for attempt in range(options.retries + 1):
            scope = asyncio.timeout(max(deadline - loop.time(), 0.0))
            try:
                async with scope:
                    return await make()
            except Exception as exc:
                if scope.expired():
                    raise _late(self._show(rel), options) from exc
                status = _status(exc)
                wait_s = options.retry_wait * (2**attempt) * random.uniform(0.5, 1.5)
                wait_s = min(wait_s, 20.0)
                # Retried while the wait leaves time before the deadline.
                if (
                    attempt < options.retries
                    and _transient(exc, status)
                    and loop.time() + wait_s < deadline
                ):
                    self._shared.stats.add(0, retry=True)
                    await asyncio.sleep(wait_s)
                    continue
                raise _translate(exc, status, self._show(rel), rel, attempt, options) from exc
        raise AssertionError("unreachable")  # the loop returns or raises


class RemoteFile:
    """A `RangeReader` over one remote object. The first read near the start fetches the
    read-ahead; later reads inside it cost nothing, reads past it fetch only what is missing."""

    def __init__(self, storage: FsspecStorage, rel: str, size: int) -> None:
        self.name = storage._show(rel)
        self._storage = storage
        self._rel = rel
        self._size = size
        self._key = storage._join(rel)
        self._head = storage._shared.head(self._key)

    def size(self) -> int:
        return self._size

    def read_range(self, offset: int, length: int) -> bytes:
        if offset < 0 or length < 0:
            raise ValueError(f"{self.name}: negative read range ({offset}, {length})")
        end = min(offset + length, self._size)
        if offset >= end:
            return b""
        shared = self._storage._shared
        ahead = shared.read_ahead()
        if not self._head and offset < ahead:
            self._head = self._storage.fetch(self._rel, 0, min(self._size, max(ahead, end)))
            shared.keep_head(self._key, self._head)
        head = self._head
        if end <= len(head):
            return head[offset:end]
        if offset < len(head):
            if offset < 8 + shared.options.read_ahead:
                shared.saw_prefix(end)  # a header read past the read-ahead
            return head[offset:] + self._storage.fetch(self._rel, len(head), end)
        return self._storage.fetch(self._rel, offset, end)

    def close(self) -> None:
        self._head = b""

    def __enter__(self) -> RemoteFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


async def _all(coroutines: list[Awaitable[None]]) -> None:
    """Run coroutines concurrently; a failure that ends the run (throttled or timed out for
    good, no credentials) cancels the ones still going."""
    tasks = [asyncio.ensure_future(c) for c in coroutines]
    try:
        await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _entries(infos: Any, key: str, *, http: bool) -> list[Entry]:
    """fsspec `ls(detail=True)` records as entries directly in folder `key`. Anything else a
    store returns (an HTTP page's links to other folders or hosts, the folder itself, names
    that are not plain: a NUL, a backslash) is dropped: nothing outside the folder is ever
    reached from here, and every name kept can be joined under it (`check_member`)."""
    out: dict[str, Entry] = {}
    prefix = key.rstrip("/") + "/"
    for info in infos if isinstance(infos, list) else ():
        name = str(info.get("name", ""))
        if not name.startswith(prefix):
            continue
        is_dir = info.get("type") == "directory" or name.endswith("/")
        child = name[len(prefix) :].rstrip("/")
        if http:
            child = unquote(child)
        if not child or "/" in child or child in (".", "..") or "\x00" in child or "\\" in child:
            continue
        size = info.get("size")
        kind = EntryKind.DIR if is_dir else EntryKind.FILE
        sums = {k: info[k] for k in ("sha256", "blob_sha1") if not is_dir and k in info}
        out[child] = Entry(
            child, kind, size if isinstance(size, int) and not is_dir else None, **sums
        )
    return [out[k] for k in sorted(out)]


def _progress(total: int, desc: str, enabled: bool | None) -> Any:
    """A tqdm.auto bar (terminal or notebook), shown only for runs that last (delay)."""
    if enabled is False or not desc:
        return _NoBar()
    from tqdm.auto import tqdm

    # Auto (None): no bar when the output is not a terminal (logs, CI), and none for runs
    # shorter than a second; asked for (True): a bar at once.
    auto = enabled is None
    return tqdm(
        total=total,
        desc=desc,
        unit="file",
        delay=1.0 if auto else 0.0,
        disable=None if auto else False,
        leave=False,
    )


class _NoBar:
    def update(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass


# -- errors -------------------------------------------------------------------------------


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    at: BaseException | None = exc
    while at is not None and at not in seen and len(seen) < 16:
        seen.append(at)
        at = at.__cause__ or at.__context__
    return seen


def _status(exc: BaseException) -> int | None:
    """The HTTP status behind an error of s3fs/botocore, gcsfs or aiohttp (not the status
    aiohttp's own parser errors carry: a body cut short is a dropped connection)."""
    for err in _chain(exc):
        if any(c.__name__ == "HttpProcessingError" for c in type(err).__mro__):
            continue
        response = getattr(err, "response", None)
        if isinstance(response, dict):  # botocore ClientError
            meta = response.get("ResponseMetadata") or {}
            code = meta.get("HTTPStatusCode")
            if isinstance(code, int):
                return code
            if (response.get("Error") or {}).get("Code") in ("SlowDown", "Throttling"):
                return 503
        for owner in (err, response):
            for attr in ("status", "status_code", "code"):
                value = getattr(owner, attr, None)
                if isinstance(value, int) and 100 <= value < 600:
                    return value
    return None


def _names(exc: BaseException) -> set[str]:
    return {cls.__name__ for err in _chain(exc) for cls in type(err).__mro__}


def _transient(exc: BaseException, status: int | None) -> bool:
    if status is not None:
        return status in _TRANSIENT_STATUS
    if isinstance(exc, (FileNotFoundError, PermissionError, IsADirectoryError)):
        return False
    names = _names(exc)
    return bool(names & _TRANSIENT_NAMES) or bool(
        names & {"TimeoutError", "ConnectionError", "ConnectionResetError"}
    )


def _refusal(exc: BaseException) -> RemoteAnswerError | None:
    """The answer the guard refused behind an error (the stores wrap it in their own)."""
    return next((e for e in _chain(exc) if isinstance(e, RemoteAnswerError)), None)


def _translate(
    exc: BaseException,
    status: int | None,
    url: str,
    rel: str,
    attempt: int,
    options: RemoteOptions,
) -> Exception:
    refused = _refusal(exc)
    if isinstance(refused, RedirectRefused):
        return UnsafeFileError(rel or url, refused.strerror or str(refused))
    if refused is not None:
        return RemoteAnswerError(refused.strerror or str(refused), url)
    names = _names(exc)
    if names & _NO_CREDENTIALS:
        return RemoteAccessError(f"{url}: no credentials found ({exc}); {_CREDENTIALS_HINT}")
    if names & _BAD_CONFIGURATION:
        return RemoteAccessError(
            f"{url}: botocore cannot use the AWS configuration ({quoted(str(exc))}); check "
            "the profile (--storage-option profile=..., AWS_PROFILE) and the files "
            "AWS_CONFIG_FILE and AWS_SHARED_CREDENTIALS_FILE name (~/.aws/ by default)"
        )
    if status in (401, 403) or isinstance(exc, PermissionError):
        return PermissionError(errno.EACCES, f"access denied (HTTP {status or 403})", url)
    if status == 404 or isinstance(exc, FileNotFoundError):
        return FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), url)
    if _transient(exc, status) and names & _TIMEOUT_NAMES:
        return RemoteAccessError(
            f"{url}: no data for {options.read_timeout:g} s (--read-timeout) in "
            f"{attempt + 1} attempts; the server stalls: run again later, or raise "
            "--read-timeout"
        )
    if _transient(exc, status):
        what = f"HTTP {status}" if status else type(exc).__name__
        return RemoteAccessError(
            f"{url}: {what} after {attempt + 1} attempts; the store is throttling, "
            "unreachable or cuts its answers short: run again later, or lower --max-concurrency"
        )
    if isinstance(exc, OSError):
        return OSError(exc.errno or errno.EIO, quoted(exc.strerror or str(exc)), url)
    return OSError(errno.EIO, f"{type(exc).__name__}: {quoted(str(exc))}", url)


def _late(url: str, options: RemoteOptions) -> RemoteAccessError:
    return RemoteAccessError(
        f"{url}: no complete answer within {options.timeout:g} s (--timeout, one request "
        "with its retries); the server stalls or is too slow: run again later, or raise "
        "--timeout"
    )


def _unlistable(url: str, exc: OSError | UnsafeFileError) -> RemoteAccessError:
    """A folder listing the guard refused, as one line."""
    reason = exc.reason if isinstance(exc, UnsafeFileError) else exc.strerror or str(exc)
    subject = "" if reason.startswith("the ") else "it "  # "it answered...", "the listing..."
    return RemoteAccessError(f"{url}: cannot be listed: {subject}{reason}")


_CREDENTIALS_HINT = (
    "S3: set AWS_PROFILE or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY (or pass "
    "--storage-option anon=true for a public bucket); GCS: run `gcloud auth "
    "application-default login`; Hugging Face: set HF_TOKEN or run `hf auth login`"
)


# -- opening a URL --------------------------------------------------------------------------


def open_remote(url: str | RemoteTarget, options: RemoteOptions | None = None) -> Location:
    """The `Location` a remote URL names (a folder, or a file in its folder's storage). The
    URL is parsed here once (`parse_remote`); everything below takes the parsed target.

    Raises `CannotInspectError` when nothing is there, the URL is malformed or the remote
    extra is missing, and `RemoteAccessError` when the store refuses us (403, no
    credentials) or its answers are refused (see guard.py)."""
    options = options or RemoteOptions()
    try:
        target = url if isinstance(url, RemoteTarget) else parse_remote(url)
    except ValueError as exc:
        raise CannotInspectError(str(exc)) from None
    protocol, shown = target.protocol, target.shown
    backend, key = _backend(target, options)
    shared = _Shared(backend, options, protocol)
    root = FsspecStorage(shared, key, shown)
    if protocol == "http":
        name = shown.rsplit("/", 1)[-1]
        if target.url.endswith("/") or not name.endswith(_FILE_SUFFIXES):
            return Location(root)
        return _file_location(shared, key, shown)
    if target.hub is not None:
        _pin_revision(root, target.hub, target.url)
        key = root._key
    # One listing tells a folder (its entries, kept for the scan) from anything else; a
    # file is then described by one metadata request.
    try:
        infos = root._run(partial(backend.listdir, key), "")
    except FileNotFoundError:
        infos = []
    except PermissionError:
        raise _denied(shown) from None
    except (RemoteAnswerError, UnsafeFileError) as exc:
        raise _unlistable(shown, exc) from None
    entries = _entries(infos, key, http=False)
    if entries:
        shared.listings[key] = (True, entries)
        return Location(root)
    try:
        itself = root._run(partial(backend.info, key), "")
    except FileNotFoundError:
        raise CannotInspectError(f"{shown}: no such object or prefix; check the URL") from None
    except PermissionError:
        raise _denied(shown) from None
    except (RemoteAnswerError, UnsafeFileError) as exc:
        raise _unlistable(shown, exc) from None
    if itself.get("type") != "file":
        raise CannotInspectError(f"{shown}: no such object or prefix; check the URL")
    return _file_location(shared, key, shown)


def _denied(shown: str) -> RemoteAccessError:
    return RemoteAccessError(
        f"{shown}: access denied (HTTP 403); check that your credentials may read it "
        f"({_CREDENTIALS_HINT})"
    )


def _file_location(shared: _Shared, key: str, shown: str) -> Location:
    parent_key, _, name = key.rstrip("/").rpartition("/")
    parent_url = shown.rsplit("/", 1)[0]
    if shared.protocol == "http":
        name = unquote(name)
    return Location(FsspecStorage(shared, parent_key, parent_url)) / name


def _backend(target: RemoteTarget, options: RemoteOptions) -> tuple[Backend, str]:
    """(the store's backend, the root's key in it)."""
    protocol, url = target.protocol, target.url
    try:
        import fsspec  # noqa: F401
    except ImportError:
        raise CannotInspectError(
            f"{url}: reading remote checkpoints needs the remote extra: "
            "pip install 'checkpoint-inspector[remote]'"
        ) from None
    opts = _nested(options.storage_options)
    try:
        if target.hub is not None:
            return _hub_backend(target.hub, url, opts, options)
        policy = options.policy()
        timeout = options.read_timeout
        made = dict(opts)
        if protocol == "s3":
            made = _s3_defaults(made, options)
        elif protocol == "gcs":
            from fsspec.asyn import get_loop

            made["session_kwargs"] = guarded_session_kwargs(
                made.get("session_kwargs") or {},
                policy=policy,
                read_timeout=timeout,
                loop=get_loop(),  # gcsfs' own: it makes its session there
            )
            made.setdefault("requests_timeout", socket_timeout(timeout))
        elif protocol == "http":
            made["get_client"] = guarded_client(policy, timeout)
        fs = _reused(protocol, opts, options, lambda: _file_system(protocol, made))
        if protocol == "s3":
            fs.retries = 1  # s3fs' own retry loop (a class attribute): ours applies instead
    except ImportError as exc:
        raise CannotInspectError(
            f"{url}: {protocol} needs a package that is not installed ({exc.name}); "
            "pip install 'checkpoint-inspector[remote]'"
        ) from None
    except TypeError as exc:
        raise CannotInspectError(f"{url}: a --storage-option is not understood ({exc})") from None
    if protocol == "http":
        return HttpBackend(fs), url.rstrip("/")
    if protocol == "s3":
        backend: Backend = S3Backend(fs, _direct_reads(opts, options))
    else:
        backend = GcsBackend(fs)
    return backend, url.split("://", 1)[1].rstrip("/")


# Options and environment under which botocore reaches S3 otherwise than a plain HTTPS
# session would (a proxy, a client certificate, extra request parameters, its own
# session): reads then all go through GetObject.
_NOT_DIRECT_OPTIONS = frozenset(
    {"requester_pays", "s3_additional_kwargs", "cache_regions", "use_ssl", "session"}
)
_NOT_DIRECT_ENV = ("HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy")


def _direct_reads(opts: Mapping[str, Any], options: RemoteOptions) -> tuple[Any, Any] | None:
    """The fsspec HTTP file system (guarded session) that reads S3 objects through presigned
    URLs and the TLS verification botocore would apply (`verify`, `AWS_CA_BUNDLE`), or None
    where botocore must make every request itself."""
    client = opts.get("client_kwargs") or {}
    config = opts.get("config_kwargs") or {}
    if (
        _NOT_DIRECT_OPTIONS & set(opts)
        or "config" in client
        or {"proxies", "client_cert"} & set(config)
        or any(os.environ.get(name) for name in _NOT_DIRECT_ENV)
    ):
        return None
    from fsspec.implementations.http import HTTPFileSystem

    verify = client.get("verify", os.environ.get("AWS_CA_BUNDLE") or True)
    tls: Any = None  # aiohttp's default verification
    if verify is False:
        tls = False
    elif isinstance(verify, str):
        tls = ssl.create_default_context(cafile=verify)
    policy, timeout = options.policy(), options.read_timeout
    fs = _reused(
        "s3-direct",
        opts,
        options,
        lambda: HTTPFileSystem(
            get_client=guarded_client(policy, timeout), skip_instance_cache=True
        ),
    )
    return fs, tls


def _file_system(protocol: str, opts: dict[str, Any]) -> Any:
    """fsspec's file system for `protocol`. For GCS, gcsfs' JSON API client itself: gcsfs
    otherwise makes its experimental gRPC client the default, whose requests (a storage
    layout lookup before reads, with its own 30 s timeouts and retries) would not go through
    our guarded session."""
    import fsspec

    if protocol == "gcs":
        from gcsfs.core import GCSFileSystem

        gcs = GCSFileSystem(skip_instance_cache=True, **opts)
        # gcsfs retries every request itself (six tries, waits of 1-32 s: a decorator no
        # option turns off) inside each attempt of ours; undecorated, our policy alone does.
        gcs._request = partial(inspect.unwrap(GCSFileSystem._request), gcs)
        return gcs
    fs = fsspec.filesystem(protocol, skip_instance_cache=True, **opts)
    if protocol == "s3" and fs.session is None:
        # The session s3fs would make (`AioSession(**fs.kwargs)`), with the shared loader.
        fs.session = _botocore_session(fs.kwargs)
    return fs


# botocore's data loaders by data path (`AWS_DATA_PATH`): one per process, shared by every
# S3 session made here. A session's own loader parses botocore's endpoint table and S3's
# service model and rule set afresh (about 180 ms of CPU) for each new client: for every
# other store, identity, proxy or credentials file a process reads through. What a loader
# keeps is botocore's packaged data, the same for every session, and clients of one
# botocore session already share theirs.
_LOADERS: dict[str, Any] = {}
_LOADERS_LOCK = threading.Lock()


def _botocore_session(kwargs: Mapping[str, Any]) -> Any | None:
    """A new aiobotocore session (its own credentials, configuration and profile) whose data
    loader is the one shared for its data path (`_LOADERS`); None, for s3fs to make its own
    session when it connects, when the configuration cannot be read (an unknown profile, a
    config file that does not parse): reading the data path asks for it, and the error is
    then raised where s3fs raises it and reported as it was (here it ended the command as
    an internal error)."""
    from aiobotocore.session import AioSession
    from botocore.exceptions import BotoCoreError

    session = AioSession(**kwargs)
    try:
        path = repr(session.get_config_variable("data_path"))
    except BotoCoreError:
        return None
    with _LOADERS_LOCK:
        loader = _LOADERS.get(path)
        if loader is None:
            _LOADERS[path] = session.get_component("data_loader")
        else:
            session.register_component("data_loader", loader)
    return session


# The file systems made so far, most recently used last: each holds a session and its pool
# of connections, so a process that reads from many stores keeps only the last few.
_FILE_SYSTEMS: OrderedDict[str, Any] = OrderedDict()
_KEPT_FILE_SYSTEMS = 16  # S3 makes two (its client, and the session of presigned reads)
_FILE_SYSTEMS_LOCK = threading.Lock()
# Environment variables that decide credentials and endpoints: a file system made under
# other values is not reused (its session would keep the old credentials).
_CREDENTIAL_ENV = ("AWS_", "HF_", "HUGGING_FACE_", "GOOGLE_", "CLOUDSDK_", "GCSFS_")
# Environment read once when a client is made, not per request: botocore takes its proxies
# (`*_proxy`, `no_proxy`, any letter case) when it makes an endpoint, and an SSL context
# its trusted certificates. A session made under other values would keep going through the
# old proxy (signed requests and object data with it), or past the new one.
_SESSION_ENV = (
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    "NO_GCE_CHECK",  # gcsfs: whether the metadata server's credentials are tried
)


def _decides_session(name: str) -> bool:
    """An environment variable a file system's client reads once, when it is made."""
    return (
        name.startswith(_CREDENTIAL_ENV) or name.lower().endswith("_proxy") or name in _SESSION_ENV
    )


# The parent's file systems in a forked child: kept (see `_forget_after_fork`), never used.
_INHERITED: list[Any] = []


def _forget_after_fork() -> None:
    """In a forked child: no file system of the parent is reused (fsspec refuses them in
    another process, "This class is not fork-safe", and their connections are the
    parent's), and the locks are new (another thread may have held one at the fork). They are
    kept, never used: collecting them would run their finalizers on the parent's loop and
    connections. The shared botocore loaders (`_LOADERS`) hold only data and stay."""
    global _FILE_SYSTEMS_LOCK, _LOADERS_LOCK
    _INHERITED.extend(_FILE_SYSTEMS.values())
    _FILE_SYSTEMS.clear()
    _FILE_SYSTEMS_LOCK = threading.Lock()
    _LOADERS_LOCK = threading.Lock()


os.register_at_fork(after_in_child=_forget_after_fork)


# gcsfs' `token` values that name a way to find credentials, not a file
# (`gcsfs.credentials.GoogleCredentials.connect`).
_GCSFS_TOKEN_METHODS = frozenset({"google_default", "cache", "cloud", "token", "anon", "browser"})


def _credential_files(
    protocol: str, opts: Mapping[str, Any]
) -> list[tuple[str, tuple[int, ...] | None]]:
    """The files the store's credential chain reads, as (path, identity): (device, inode,
    size, mtime, ctime) of a regular file, None when absent. botocore's shared credentials
    and config files (`AWS_SHARED_CREDENTIALS_FILE`, `AWS_CONFIG_FILE`, or under ~/.aws),
    Google's application default credentials (`GOOGLE_APPLICATION_CREDENTIALS`, or under
    `CLOUDSDK_CONFIG` / ~/.config/gcloud), gcsfs' token cache and a key file given as its
    `token` option. A file written since a file system was made (another profile, a new
    login, another service account's key) makes another one. The Hub's token is read for every
    scan (`build_hf_headers`) and sent per request, never kept in a session."""
    env = os.environ.get
    home = os.path.expanduser("~")
    if protocol in ("s3", "s3-direct"):
        paths = [
            env("AWS_SHARED_CREDENTIALS_FILE") or os.path.join(home, ".aws", "credentials"),
            env("AWS_CONFIG_FILE") or os.path.join(home, ".aws", "config"),
        ]
    elif protocol == "gcs":
        gcloud = env("CLOUDSDK_CONFIG") or os.path.join(home, ".config", "gcloud")
        paths = [
            env("GOOGLE_APPLICATION_CREDENTIALS") or "",
            os.path.join(gcloud, "application_default_credentials.json"),
            os.path.join(home, ".gcs_tokens"),  # gcsfs' own token cache (method "cache")
        ]
        token = opts.get("token")
        # gcsfs takes a method name or a service account's key file (`GoogleCredentials`).
        if isinstance(token, str) and token not in _GCSFS_TOKEN_METHODS:
            paths.append(token)
    else:
        return []
    return [(path, file_identity(path)) for path in paths]


def _reused(
    protocol: str, opts: Mapping[str, Any], options: RemoteOptions, make: Callable[[], Any]
) -> Any:
    """One file system per protocol, storage options (the endpoint and any credentials
    given), guard settings, credential environment and credential files: a later scan in
    the same process reuses its session and connections (setting one up costs more than a
    hundred milliseconds of CPU), and still lists every folder afresh. Two reads that differ
    in any of these never share one, so no session carries one store's or one identity's
    state to another (sessions keep no cookies either: `guard.guarded_session_kwargs`).
    The key is a digest: the values it covers include secrets."""
    env = sorted((k, v) for k, v in os.environ.items() if _decides_session(k))
    guard = (options.read_timeout, options.allow_redirects, options.max_concurrency)
    what = (protocol, sorted(opts.items(), key=lambda kv: kv[0]), guard, env)
    key = hashlib.sha256(repr((*what, _credential_files(protocol, opts))).encode()).hexdigest()
    with _FILE_SYSTEMS_LOCK:
        fs = _FILE_SYSTEMS.get(key)
        if fs is None:
            fs = _FILE_SYSTEMS[key] = make()
            while len(_FILE_SYSTEMS) > _KEPT_FILE_SYSTEMS:
                # Dropped, not closed: a scan still reading holds its own reference, and
                # fsspec closes the session when the file system is collected.
                _FILE_SYSTEMS.popitem(last=False)
        _FILE_SYSTEMS.move_to_end(key)
        return fs


def _nested(options: Mapping[str, Any]) -> dict[str, Any]:
    """`{"client_kwargs.region_name": "x"}` -> `{"client_kwargs": {"region_name": "x"}}`."""
    out: dict[str, Any] = {}
    for key, value in options.items():
        *parents, last = key.split(".")
        at = out
        for part in parents:
            at = at.setdefault(part, {})
            if not isinstance(at, dict):
                raise CannotInspectError(f"--storage-option {key}: {part} is not a group")
        at[last] = value
    return out


def _s3_defaults(opts: dict[str, Any], options: RemoteOptions) -> dict[str, Any]:
    """s3fs options: the endpoint from `AWS_ENDPOINT_URL[_S3]`, a connection pool as large as
    the requests in flight, our retries instead of s3fs' and botocore's own loops, the read
    timeout, and the guarded HTTP session (no redirect followed, bodies capped)."""
    opts = dict(opts)
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    client = opts.get("client_kwargs") or {}
    if endpoint and "endpoint_url" not in opts and "endpoint_url" not in client:
        opts["endpoint_url"] = endpoint
    config = dict(opts.get("config_kwargs") or {})
    config.setdefault("retries", {"total_max_attempts": 1, "mode": "standard"})
    config.setdefault("max_pool_connections", max(10, options.max_concurrency))
    config.setdefault("connect_timeout", options.read_timeout)
    config.setdefault("read_timeout", options.read_timeout)
    config["http_session_cls"] = s3_http_session_class()
    # Our requests are built by s3fs from checked paths; botocore's per-request validation
    # of them costs CPU that hundreds of concurrent header reads feel.
    config.setdefault("parameter_validation", False)
    opts["config_kwargs"] = config
    return opts


_HUB_OPTIONS = frozenset({"endpoint", "token"})


def _hub_backend(
    loc: HfLocation, url: str, opts: dict[str, Any], options: RemoteOptions
) -> tuple[Backend, str]:
    """The Hub's backend for the repository `loc` (its revision is pinned by `_pin_revision`
    once the storage exists), and the root's key."""
    from fsspec.implementations.http import HTTPFileSystem
    from huggingface_hub import constants
    from huggingface_hub.utils import build_hf_headers

    unknown = sorted(set(opts) - _HUB_OPTIONS)
    if unknown:
        raise CannotInspectError(
            f"{url}: --storage-option {', '.join(unknown)} is not understood for hf:// "
            "(expected endpoint=URL, token=TOKEN)"
        )
    endpoint = str(opts.get("endpoint") or constants.ENDPOINT).rstrip("/")
    policy = options.policy(hub=on_hub(endpoint))
    fs = _reused(
        "hf",
        {"endpoint": endpoint},
        options,
        lambda: HTTPFileSystem(
            get_client=guarded_client(policy, options.read_timeout), skip_instance_cache=True
        ),
    )
    headers = build_hf_headers(token=opts.get("token"))
    backend = HubBackend(
        fs, endpoint=endpoint, repo_type=loc.repo_type, repo_id=loc.repo_id, headers=headers
    )
    return backend, loc.fs_path()


def _pin_revision(root: FsspecStorage, loc: HfLocation, url: str) -> None:
    """Resolve an `hf://` revision to its commit once, so that every read of the scan sees
    the same files even if the branch moves meanwhile; the root's key then names the commit."""
    backend = root._shared.backend
    assert isinstance(backend, HubBackend)
    sha = loc.revision
    if not loc.is_commit:
        try:
            sha = root._run(partial(backend.revision, loc.revision), "")
        except (FileNotFoundError, PermissionError) as exc:
            raise _hub_refusal(loc, url, str(exc.__cause__)) from None
        except (OSError, UnsafeFileError) as exc:
            reason = exc.reason if isinstance(exc, UnsafeFileError) else exc.strerror or exc
            raise RemoteAccessError(
                f"{url}: cannot reach the Hub ({reason}); check the network or HF_ENDPOINT"
            ) from None
    assert sha is not None
    backend.pin(sha, dataclasses.replace(loc, path="").fs_path(sha))
    root._key = loc.fs_path(sha)


def _hub_refusal(loc: HfLocation, url: str, answer: str) -> InspectorError:
    """The Hub's refusal to say which commit a revision names, by its error code."""
    if "RevisionNotFound" in answer:
        return CannotInspectError(
            f"{url}: revision {loc.revision!r} not found in {loc.repo_id}; expected a "
            "branch, a tag, a commit sha or refs/pr/N"
        )
    if "GatedRepo" in answer:
        return RemoteAccessError(
            f"{url}: {loc.repo_id} is gated; accept its terms on the Hub, then set HF_TOKEN "
            "or run `hf auth login`"
        )
    return RemoteAccessError(
        f"{url}: repository {loc.repo_id} not found, or private without a token; check the "
        "name, set HF_TOKEN or run `hf auth login`"
    )
