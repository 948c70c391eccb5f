"""Servers on 127.0.0.1 for the remote-storage tests and `benchmarks/bench_remote.py`.

- `moto_s3()`: moto's S3 API server (`ThreadedMotoServer`), a real S3 endpoint for s3fs;
  `S3Store` puts buckets and objects into it.
- `Proxy`: an HTTP/1.1 proxy in front of one server that adds a delay to every request
  (a network round trip), counts requests and the response body bytes it passes on (what a
  client really fetched), records the request paths and the most requests it held at once
  (`peak`), and can answer chosen requests itself
  with an error status (throttling, 403) instead of passing them on, or with a hostile
  `Answer` (a body that never ends, trickles or stalls, a lying Content-Length, a redirect).
- `RangeHTTPServer`: the standard library's file server with HTTP Range support and
  keep-alive, counting the bytes of file content it sends.
- `FakeHub`, `FakeGCS`: the few routes of the Hugging Face Hub and of the GCS JSON API that
  a scan uses, over local folders.

Every server binds 127.0.0.1 on a free port and stops with its context manager. The tests
share one of each per process (tests/conftest.py: `s3_store`, `range_server`, `hub_server`),
each test serving its own folder, bucket or repository (`serving(...)`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Self
from urllib.parse import quote

__all__ = [
    "Answer",
    "FakeGCS",
    "FakeHub",
    "Proxy",
    "RangeHTTPServer",
    "S3Store",
    "moto_s3",
    "s3_error",
]


@contextlib.contextmanager
def moto_s3() -> Iterator[str]:
    """moto's S3 server in this process; yields its endpoint URL."""
    import logging

    from moto import backends
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    # moto's server asks for the list of its service packages twice per request
    # (`DomainDispatcherApplication.get_backend_for_host`), which lists and stats its package
    # folder every time: about 2 ms of CPU per request, thousands of requests per run. The
    # folder does not change while the tests run: listed once.
    modules = tuple(backends.list_of_moto_modules())
    backends.list_of_moto_modules = lambda: modules
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


class S3Store:
    """Buckets and objects of the moto server running in this process, put straight into the
    backend its S3 API answers from: what its PutObject and CreateBucket handlers do with a
    request (`moto.s3.responses.S3Response._key_response_put` calls
    `S3Backend.put_object`), without the HTTP round trip and botocore's signing, which cost
    10 ms of CPU a file (a checkpoint upload is not what the tests test; every read goes
    through the server)."""

    def __init__(self, url: str) -> None:
        from moto.core import DEFAULT_ACCOUNT_ID
        from moto.s3.models import s3_backends

        self.url = url
        self._backend = s3_backends[DEFAULT_ACCOUNT_ID]["aws"]

    def bucket(self, name: str) -> str:
        """A new, empty bucket `name` (refused when it exists: each test file has its own)."""
        if name in self._backend.buckets:
            raise ValueError(f"bucket {name} exists already: take another name")
        self._backend.create_bucket(name, "us-east-1")
        return name

    def put(self, bucket: str, key: str, data: bytes) -> None:
        self._backend.put_object(bucket, key, data)

    def put_folder(self, folder: Path, bucket: str, prefix: str) -> None:
        """Every file under `folder` as `bucket/prefix/<its path in the folder>`."""
        for path in sorted(Path(folder).rglob("*")):
            if path.is_file():
                key = f"{prefix}/{path.relative_to(folder).as_posix()}"
                self.put(bucket, key, path.read_bytes())


def s3_error(status: int, code: str, message: str) -> bytes:
    """An S3 error document, as S3 sends it with a 4xx/5xx status."""
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Error><Code>{code}</Code><Message>{message}</Message>"
        "<RequestId>0</RequestId></Error>"
    ).encode()


@dataclass
class Answer:
    """What a hostile server answers. `body` is sent after the headers, then:
    `forever`: the same bytes again and again (a body that never ends, sent chunked unless
    `length` says otherwise); `rate`: at that many bytes a second (a trickle); `stall`: the
    connection stays open and silent. `length` is the Content-Length announced (None: the
    body's; "chunked": chunked encoding): a lie when it differs from what is sent."""

    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    length: int | str | None = None
    forever: bool = False
    rate: float | None = None
    stall: bool = False
    close: bool = False  # the connection is closed after what is sent


async def _send_answer(
    writer: asyncio.StreamWriter, answer: Answer, method: str, count: Callable[[int], None]
) -> None:
    """Write `answer`, calling `count` with the body bytes as they are written (until the
    client hangs up)."""
    chunked = answer.length == "chunked" or (answer.forever and answer.length is None)
    headers = dict(answer.headers)
    if chunked:
        headers["Transfer-Encoding"] = "chunked"
    else:
        headers["Content-Length"] = str(
            answer.length if answer.length is not None else len(answer.body)
        )
    writer.write(_response(answer.status, headers, b""))
    await writer.drain()
    if method != "HEAD" and answer.body:
        step = 1 if answer.rate else max(len(answer.body), 1)
        while True:
            for at in range(0, len(answer.body), step):
                piece = answer.body[at : at + step]
                writer.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n" if chunked else piece)
                await writer.drain()
                count(len(piece))
                if answer.rate:
                    await asyncio.sleep(len(piece) / answer.rate)
            if not answer.forever:
                break
    if answer.stall:
        await asyncio.sleep(3600)
    if answer.close:
        raise ConnectionResetError("the answer closes the connection")
    if chunked:
        writer.write(b"0\r\n\r\n")


# A fault rule gets (method, path, request number) and returns None (pass the request on),
# (status, body) to answer with, or an `Answer`.
Fault = Callable[[str, str, int], "tuple[int, bytes] | Answer | None"]


class Proxy:
    """See the module docstring. `requests`, `body_bytes`, `paths`, `sent_headers` (each
    request's headers, in the order of `paths`) and `peak` (the most requests in flight at
    once) are totals since the last `reset()`."""

    def __init__(self, backend: str, *, delay: float = 0.0, fault: Fault | None = None) -> None:
        host, _, port = backend.removeprefix("http://").rstrip("/").partition(":")
        self.backend = (host, int(port or 80))
        self.delay = delay
        self.fault = fault
        self.requests = 0
        self.body_bytes = 0
        self.paths: list[str] = []
        self.sent_headers: list[dict[str, str]] = []
        self.peak = 0
        self._in_flight = 0
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._server: asyncio.base_events.Server | None = None
        self.url = ""

    def reset(self) -> None:
        with self._lock:
            self.requests, self.body_bytes, self.paths, self.peak = 0, 0, [], 0
            self.sent_headers = []

    def _sent(self, n: int) -> None:
        with self._lock:
            self.body_bytes += n

    def __enter__(self) -> Proxy:
        self._thread.start()
        self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        async def close() -> None:
            if self._server is not None:
                self._server.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)

        async def start() -> None:
            self._server = await asyncio.start_server(self._client, "127.0.0.1", 0)
            port = self._server.sockets[0].getsockname()[1]
            self.url = f"http://127.0.0.1:{port}"
            self._ready.set()

        self._loop.run_until_complete(start())
        self._loop.run_forever()

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        backend: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                method, path, headers = _parse_request(head)
                body = await _read_body(reader, headers, method=method, request=True)
                with self._lock:
                    self._in_flight += 1
                    self.peak = max(self.peak, self._in_flight)
                try:
                    await self._answer(writer, backend, method, path, headers, body)
                finally:
                    with self._lock:
                        self._in_flight -= 1
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            return
        finally:
            writer.close()
            for _, back_writer in backend:
                back_writer.close()

    async def _answer(
        self,
        writer: asyncio.StreamWriter,
        backend: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]],
        method: str,
        path: str,
        headers: list[tuple[str, str]],
        body: bytes,
    ) -> None:
        """One request: the delay, the fault rule or the backend, the response written."""
        if self.delay:
            await asyncio.sleep(self.delay)
        with self._lock:
            self.requests += 1
            number = self.requests
            self.paths.append(f"{method} {path}")
            self.sent_headers.append({k.lower(): v for k, v in headers})
        answer = self.fault(method, path, number) if self.fault else None
        if isinstance(answer, Answer):
            await _send_answer(writer, answer, method, self._sent)
        elif answer is not None:
            status, data = answer
            sent = {"Content-Type": "application/xml", "Content-Length": str(len(data))}
            writer.write(_response(status, sent, b"" if method == "HEAD" else data))
        else:
            status_line, out_headers, data = await self._forward(
                backend, method, path, headers, body
            )
            with self._lock:
                self.body_bytes += len(data)
            writer.write(_response(status_line, out_headers, data))
        await writer.drain()

    async def _forward(
        self,
        backend: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]],
        method: str,
        path: str,
        headers: list[tuple[str, str]],
        body: bytes,
    ) -> tuple[Any, list[tuple[str, str]], bytes]:
        """One request on this client's backend connection (kept alive when the backend
        allows it, opened again when it closed)."""
        kept = [
            (k, v)
            for k, v in headers
            if k.lower() not in ("connection", "content-length", "transfer-encoding")
        ]
        kept += [("Content-Length", str(len(body))), ("Connection", "keep-alive")]
        lines = [f"{method} {path} HTTP/1.1", *(f"{k}: {v}" for k, v in kept)]
        request = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body
        for attempt in range(2):
            if not backend:
                backend.append(await asyncio.open_connection(*self.backend))
            back_reader, back_writer = backend[0]
            try:
                back_writer.write(request)
                await back_writer.drain()
                head = await back_reader.readuntil(b"\r\n\r\n")
                break
            except (ConnectionError, asyncio.IncompleteReadError):
                back_writer.close()
                backend.clear()  # the backend closed the kept connection: open another
                if attempt:
                    raise
        status_line, out_headers = _parse_response(head)
        code = int(status_line.split(" ", 2)[1])
        bodyless = method == "HEAD" or code in (204, 304) or code < 200
        data = (
            b""
            if bodyless
            else await _read_body(back_reader, out_headers, method=method, request=False)
        )
        closing = (_get(out_headers, "connection") or "").lower() == "close" or (
            not bodyless
            and _get(out_headers, "content-length") is None
            and "chunked" not in (_get(out_headers, "transfer-encoding") or "").lower()
        )
        if closing:
            back_writer.close()
            backend.clear()
        if bodyless:  # keep the backend's Content-Length: a HEAD tells the size with it
            return status_line, [(k, v) for k, v in out_headers if k.lower() != "connection"], b""
        return status_line, _length_headers(out_headers), data


def _parse_request(head: bytes) -> tuple[str, str, list[tuple[str, str]]]:
    first, *rest = head.decode("latin-1").split("\r\n")
    method, path, _version = first.split(" ", 2)
    return method, path, _headers(rest)


def _parse_response(head: bytes) -> tuple[str, list[tuple[str, str]]]:
    first, *rest = head.decode("latin-1").split("\r\n")
    return first, _headers(rest)


def _headers(lines: list[str]) -> list[tuple[str, str]]:
    out = []
    for line in lines:
        if ":" in line:
            key, _, value = line.partition(":")
            out.append((key.strip(), value.strip()))
    return out


def _get(headers: list[tuple[str, str]], name: str) -> str | None:
    return next((v for k, v in headers if k.lower() == name), None)


async def _read_body(
    reader: asyncio.StreamReader, headers: list[tuple[str, str]], *, method: str, request: bool
) -> bytes:
    length = _get(headers, "content-length")
    if length is not None:
        return await reader.readexactly(int(length))
    if "chunked" in (_get(headers, "transfer-encoding") or "").lower():
        parts = []
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            if size == 0:
                await reader.readuntil(b"\r\n")
                return b"".join(parts)
            parts.append(await reader.readexactly(size))
            await reader.readexactly(2)
    return b"" if request else await reader.read()


def _length_headers(headers: list[tuple[str, str]]) -> list[tuple[str, str]]:
    return [
        (k, v)
        for k, v in headers
        if k.lower() not in ("connection", "content-length", "transfer-encoding")
    ]


def _response(status: int | str, headers: Any, body: bytes) -> bytes:
    if isinstance(status, int):
        status = f"HTTP/1.1 {status} {HTTPStatus(status).phrase}"
    pairs = list(headers.items()) if isinstance(headers, dict) else list(headers)
    framed = ("content-length", "transfer-encoding")
    if not any(k.lower() in framed for k, _ in pairs):
        pairs.append(("Content-Length", str(len(body))))
    if not any(k.lower() == "connection" for k, _ in pairs):
        pairs.append(("Connection", "keep-alive"))
    lines = [status, *(f"{k}: {v}" for k, v in pairs)]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


# -- a static file server with Range ---------------------------------------------------------

_RANGE = re.compile(r"bytes=(\d*)-(\d*)$")


class _Threaded:
    """A `ThreadingHTTPServer` on 127.0.0.1 (a free port) served from a thread."""

    def _serve(self, handler: type) -> None:
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        # `shutdown()` waits for the serving loop to look again: every 0.5 s by default,
        # which every stop of a server paid.
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()


class RangeHTTPServer(_Threaded):
    """`http.server` over `root` with `Range: bytes=a-b` answered by 206 (and directory
    listings as HTML links, which fsspec's HTTP file system reads). `content_bytes` counts
    the file bytes sent, `requests` the requests."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root).resolve()
        self.content_bytes = 0
        self.requests = 0
        lock = threading.Lock()
        outer = self

        class Handler(SimpleHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(*args, directory=str(outer.root), **kwargs)

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def send_head(self) -> Any:
                with lock:
                    outer.requests += 1
                path = self.translate_path(self.path)
                if os.path.isdir(path):
                    return super().send_head()
                try:
                    with open(path, "rb") as fh:
                        data = fh.read()
                except OSError:
                    self.send_error(HTTPStatus.NOT_FOUND, "File not found")
                    return None
                found = _RANGE.match(self.headers.get("Range", ""))
                if found is None:
                    self.send_response(HTTPStatus.OK)
                    body = data
                else:
                    first = (
                        int(found.group(1))
                        if found.group(1)
                        else max(len(data) - int(found.group(2)), 0)
                    )
                    last = (
                        int(found.group(2)) if found.group(1) and found.group(2) else len(data) - 1
                    )
                    last = min(last, len(data) - 1)
                    if first > last:
                        self.send_error(HTTPStatus.REQUESTED_RANGE_NOT_SATISFIABLE)
                        return None
                    body = data[first : last + 1]
                    self.send_response(HTTPStatus.PARTIAL_CONTENT)
                    self.send_header("Content-Range", f"bytes {first}-{last}/{len(data)}")
                self.send_header("Content-Type", "application/octet-stream")
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Accept-Ranges", "bytes")
                self.end_headers()
                import io

                if self.command != "HEAD":
                    with lock:
                        outer.content_bytes += len(body)
                return io.BytesIO(body)

        self._serve(Handler)

    def reset(self) -> None:
        self.content_bytes = self.requests = 0

    @contextlib.contextmanager
    def serving(self, folder: Path) -> Iterator[Served]:
        """`folder` (inside `root`) as a server of its own: `url` names it, and the counts
        start from zero."""
        rel = Path(folder).resolve().relative_to(self.root).as_posix()
        self.reset()
        yield Served(self, "" if rel == "." else f"/{quote(rel)}")


@dataclass
class Served:
    """One folder of a shared `RangeHTTPServer`: its `url` (the server's, then `path`) and
    the server's counts."""

    server: RangeHTTPServer
    path: str

    @property
    def url(self) -> str:
        return self.server.url + self.path

    @property
    def content_bytes(self) -> int:
        return self.server.content_bytes

    @property
    def requests(self) -> int:
        return self.server.requests


# -- a Hugging Face Hub stand-in -------------------------------------------------------------


class FakeHub(_Threaded):
    """The few Hub API routes `huggingface_hub` uses to read a repository (repo info at a
    revision, the tree listing, file downloads with Range), over local folders: `repos`
    maps "org/name" to {revision name: (commit sha, folder)}. Counts the file bytes sent and
    records the revisions asked for. `entry`, when given, rewrites each file's entry of the
    tree listing (a hostile or incomplete Hub: checksums missing or malformed). A shared
    stand-in serves each test's repositories in turn (`serving`)."""

    def __init__(
        self,
        repos: dict[str, dict[str, tuple[str, Path]]],
        *,
        entry: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    ) -> None:
        import json as _json
        from urllib.parse import unquote, urlsplit

        self.repos = repos
        self.entry = entry
        self.content_bytes = 0
        self.asked: list[str] = []
        outer = self

        def lookup(repo: str, rev: str) -> tuple[str, Path] | None:
            revisions = outer.repos.get(repo, {})
            if rev in revisions:
                return revisions[rev]
            return next((v for v in revisions.values() if v[0] == rev), None)

        class Handler(SimpleHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _json(self, status: int, value: Any) -> None:
                body = _json.dumps(value).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                if status == 404:
                    self.send_header("X-Error-Code", "RepoNotFound")
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            def do_HEAD(self) -> None:
                self.do_GET()

            def do_GET(self) -> None:
                parts = [unquote(p) for p in urlsplit(self.path).path.split("/") if p]
                if parts[:1] == ["api"] and len(parts) >= 6:
                    repo, what = f"{parts[2]}/{parts[3]}", parts[4]
                    rest = parts[5:]
                    # refs/pr/N arrives as one encoded segment or several.
                    rev, path = rest[0], rest[1:]
                    if rev == "refs" and len(rest) >= 3:
                        rev, path = "/".join(rest[:3]), rest[3:]
                    outer.asked.append(rev)
                    found = lookup(repo, rev)
                    if found is None:
                        return self._json(404, {"error": "Repository not found"})
                    sha, root = found
                    if what == "revision":
                        files = [p for p in root.rglob("*") if p.is_file()]
                        siblings = [{"rfilename": p.relative_to(root).as_posix()} for p in files]
                        return self._json(200, {"id": repo, "sha": sha, "siblings": siblings})
                    if what == "tree":
                        folder = root.joinpath(*path)
                        entries = []
                        for p in sorted(folder.iterdir()):
                            rel = p.relative_to(root).as_posix()
                            if p.is_dir():
                                entries.append({"type": "directory", "path": rel, "oid": "0" * 40})
                            else:
                                item = _tree_file(p, rel)
                                entries.append(outer.entry(item) if outer.entry else item)
                        return self._json(200, entries)
                    return self._json(404, {"error": "not found"})
                if len(parts) >= 4 and parts[2] == "resolve":
                    repo, rev, path = f"{parts[0]}/{parts[1]}", parts[3], parts[4:]
                    if rev == "refs" and len(parts) >= 6:
                        rev, path = "/".join(parts[3:6]), parts[6:]
                    found = lookup(repo, rev)
                    file = found[1].joinpath(*path) if found else None
                    if file is None or not file.is_file():
                        return self._json(404, {"error": "Entry not found"})
                    data = file.read_bytes()
                    found_range = _RANGE.match(self.headers.get("Range", ""))
                    if found_range:
                        first = int(found_range.group(1))
                        last = min(int(found_range.group(2) or len(data) - 1), len(data) - 1)
                        body = data[first : last + 1]
                        self.send_response(206)
                        self.send_header("Content-Range", f"bytes {first}-{last}/{len(data)}")
                    else:
                        body = data
                        self.send_response(200)
                    self.send_header("Content-Length", str(len(body)))
                    self.send_header("X-Repo-Commit", found[0] if found else "")
                    self.send_header("ETag", '"' + "1" * 40 + '"')
                    self.end_headers()
                    if self.command != "HEAD":
                        outer.content_bytes += len(body)
                        self.wfile.write(body)
                    return None
                return self._json(404, {"error": "not found"})

        self._serve(Handler)

    @contextlib.contextmanager
    def serving(
        self,
        repos: dict[str, dict[str, tuple[str, Path]]],
        *,
        entry: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    ) -> Iterator[FakeHub]:
        """These repositories (and `entry`) until the block ends, the counts from zero."""
        self.repos, self.entry = repos, entry
        self.content_bytes, self.asked = 0, []
        try:
            yield self
        finally:
            self.repos, self.entry = {}, None


# Files the Hub keeps in LFS / Xet storage (the default .gitattributes of a model repository
# tracks these suffixes; anything over 10 MiB is refused by git pushes).
_LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".h5", ".msgpack", ".onnx")


def _tree_file(path: Path, rel: str) -> dict[str, Any]:
    """A file's entry in the Hub's tree listing, as `huggingface_hub.hf_api.RepoFile` reads
    it: `oid` is the git blob SHA-1 (of the LFS pointer for LFS files), `lfs.oid` the SHA-256
    of the content, `lfs.size` its size, `lfs.pointerSize` the pointer's, and `xetHash` the
    Xet content hash of files stored on Xet."""
    import hashlib

    data = path.read_bytes()
    size = len(data)
    if not rel.endswith(_LFS_SUFFIXES) and size < 10 << 20:
        blob = hashlib.sha1(b"blob %d\x00" % size + data).hexdigest()
        return {"type": "file", "oid": blob, "size": size, "path": rel}
    sha = hashlib.sha256(data).hexdigest()
    pointer = (
        f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha}\nsize {size}\n"
    ).encode()
    return {
        "type": "file",
        "oid": hashlib.sha1(b"blob %d\x00" % len(pointer) + pointer).hexdigest(),
        "size": size,
        "lfs": {"oid": sha, "size": size, "pointerSize": len(pointer)},
        "xetHash": hashlib.blake2b(data, digest_size=32).hexdigest(),
        "path": rel,
    }


# -- a Google Cloud Storage stand-in ---------------------------------------------------------


class FakeGCS(_Threaded):
    """The few routes of the GCS JSON API gcsfs uses to read a bucket (`endpoint_url` of
    gcsfs, with `token="anon"`): objects listed by prefix and delimiter (pages of at most
    `maxResults`, or `page_size`), an object's metadata, and media downloads with Range,
    over local folders: `buckets` maps a bucket name to its folder. Counts the file bytes
    sent and the listing pages served."""

    def __init__(self, buckets: dict[str, Path], *, page_size: int = 1000) -> None:
        import json as _json
        from urllib.parse import parse_qs, unquote, urlsplit

        self.buckets = buckets
        self.page_size = page_size
        self.pages = 0
        self.content_bytes = 0
        outer = self

        class Handler(SimpleHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _send(self, status: int, body: bytes, headers: dict[str, str]) -> None:
                self.send_response(status)
                for key, value in {**headers, "Content-Length": str(len(body))}.items():
                    self.send_header(key, value)
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            def _json(self, status: int, value: Any) -> None:
                body = _json.dumps(value).encode()
                self._send(status, body, {"Content-Type": "application/json"})

            def _meta(self, bucket: str, key: str, file: Path) -> dict[str, Any]:
                size = file.stat().st_size
                return {"kind": "storage#object", "bucket": bucket, "name": key, "size": str(size)}

            def do_HEAD(self) -> None:
                self.do_GET()

            def do_GET(self) -> None:
                url = urlsplit(self.path)
                query = {k: v[0] for k, v in parse_qs(url.query).items()}
                parts = [unquote(p) for p in url.path.split("/") if p]
                media = parts[:1] == ["download"]
                if media:
                    parts = parts[1:]
                if parts[:3] != ["storage", "v1", "b"] or len(parts) < 4:
                    return self._json(404, {"error": {"code": 404, "message": "Not Found"}})
                bucket, rest = parts[3], parts[4:]
                root = outer.buckets.get(bucket)
                if root is None:
                    return self._json(404, {"error": {"code": 404, "message": "No such bucket"}})
                if not rest:
                    return self._json(200, {"kind": "storage#bucket", "name": bucket})
                if rest == ["o"]:
                    return self._list(bucket, root, query)
                key = "/".join(rest[1:])
                file = root / key
                if rest[0] != "o" or not file.is_file():
                    return self._json(404, {"error": {"code": 404, "message": "No such object"}})
                if not media:
                    return self._json(200, self._meta(bucket, key, file))
                data = file.read_bytes()
                found = _RANGE.match(self.headers.get("Range", ""))
                if found is None:
                    return self._send(200, data, {"Content-Type": "application/octet-stream"})
                first = int(found.group(1))
                last = min(int(found.group(2) or len(data) - 1), len(data) - 1)
                outer.content_bytes += last + 1 - first
                head = {"Content-Range": f"bytes {first}-{last}/{len(data)}"}
                return self._send(206, data[first : last + 1], head)

            def _list(self, bucket: str, root: Path, query: dict[str, str]) -> None:
                prefix = query.get("prefix", "")
                folder = root / prefix.rstrip("/") if prefix else root
                names: list[tuple[str, Path]] = []
                if folder.is_dir() and (not prefix or prefix.endswith("/")):
                    names = [(prefix + p.name, p) for p in sorted(folder.iterdir())]
                limit = min(int(query.get("maxResults", 1000)), outer.page_size)
                start = int(query.get("pageToken", "0"))
                outer.pages += 1
                page = names[start : start + limit]
                out: dict[str, Any] = {"kind": "storage#objects"}
                out["items"] = [self._meta(bucket, n, p) for n, p in page if p.is_file()]
                out["prefixes"] = [n + "/" for n, p in page if p.is_dir()]
                if start + limit < len(names):
                    out["nextPageToken"] = str(start + limit)
                return self._json(200, out)

        self._serve(Handler)
