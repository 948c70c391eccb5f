"""Remote scan benchmark: a 300-shard sparse checkpoint on a local S3 server behind a loopback
proxy that adds 20 ms to every request, read with s3fs.

    python benchmarks/bench_remote.py                  # 300 shards, ~30,000 tensors
    python benchmarks/bench_remote.py --tensors 600000 # full-size headers (~200 KB each)
    python benchmarks/bench_remote.py --runs 3 --loop-runs 1 --concurrency 32

Printed in one run:
  - our full scan (`inspector._internal.scan.entry` of the s3:// URL: listing, detection, every
    header, the index and configs), best of --runs;
  - the sequential per-shard header fetch, the obvious loop: list, then for each shard read
    the 8-byte length, then the header, and parse it;
  - the physical floor: ceil(shards / concurrency) x the measured round trip;
  - bytes fetched (as counted by the server) against the sum of the header sizes.
Targets: scan within 2x of the floor, at least 20x faster than the sequential loop, bytes
fetched under 1.2x the headers plus one read-ahead per shard.

The S3 server: moto's server spends about 2.5 ms of CPU per request in one Python process,
which on two cores would hide the round trip being measured (300 requests take 0.75 s of
server time whatever the client does), and it keeps objects in memory, while a sparse
checkpoint has multi-GB files. So the server here is a minimal read-only S3 API (HeadObject,
GetObject with Range, ListObjectsV2) over the checkpoint folder, in its own process together
with the latency proxy (tests/remote_servers.py). The client is the real s3fs. The tests use
moto (tests/test_remote.py).
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import math
import os
import statistics
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from email.utils import formatdate
from pathlib import Path
from urllib.parse import parse_qs, quote, unquote, urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from inspector._internal.common.filenames import (
    CONFIG_NAME,
    INDEX_NAME,
    QUANT_CONFIG_NAME,
)

BUCKET = "bench"


# -- the server process ------------------------------------------------------------------------


class S3Folder:
    """A read-only S3 API over `root` as bucket `BUCKET` (keys are paths under it)."""

    def __init__(self, root: Path) -> None:
        self.root = root.resolve()
        self.bytes = 0
        self.list_bytes = 0
        self.requests = 0

    async def client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                first, *lines = head.decode("latin-1").split("\r\n")
                method, target, _ = first.split(" ", 2)
                headers = {
                    k.strip().lower(): v.strip()
                    for k, _, v in (line.partition(":") for line in lines if ":" in line)
                }
                if int(headers.get("content-length", 0)):
                    await reader.readexactly(int(headers["content-length"]))
                status, out, body = self.answer(method, target, headers)
                self.requests += 1
                self.bytes += len(body)
                out = {**out, "Content-Length": str(out.get("Content-Length", len(body)))}
                text = f"HTTP/1.1 {status}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in out.items())
                writer.write(text.encode() + b"\r\n" + (b"" if method == "HEAD" else body))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    def answer(self, method: str, target: str, headers: dict[str, str]) -> tuple[str, dict, bytes]:
        url = urlsplit(target)
        path = unquote(url.path)
        if path == "/__stats":
            stats = {"bytes": self.bytes, "list_bytes": self.list_bytes, "requests": self.requests}
            return "200 OK", {}, json.dumps(stats).encode()
        bucket, _, key = path.lstrip("/").partition("/")
        if bucket != BUCKET:
            return _error("404 Not Found", "NoSuchBucket")
        if not key:
            query = parse_qs(url.query)
            if method == "GET" and "list-type" in query:
                answer = self.list_objects(query)
                self.list_bytes += len(answer[2])
                return answer
            return "200 OK", {}, b""
        file = (self.root / key).resolve()
        if not file.is_relative_to(self.root) or not file.is_file():
            return _error("404 Not Found", "NoSuchKey", head=method == "HEAD")
        size = file.stat().st_size
        meta = {"ETag": '"0"', "Last-Modified": formatdate(0, usegmt=True)}
        if method == "HEAD":
            return "200 OK", {**meta, "Content-Length": size}, b""
        rng = headers.get("range", "")
        first, last = 0, size - 1
        if rng.startswith("bytes="):
            a, _, b = rng[6:].partition("-")
            first, last = int(a), min(int(b) if b else size - 1, size - 1)
        with open(file, "rb") as fh:
            data = os.pread(fh.fileno(), last - first + 1, first)
        if rng:
            meta["Content-Range"] = f"bytes {first}-{last}/{size}"
            return "206 Partial Content", meta, data
        return "200 OK", meta, data

    def list_objects(self, query: dict[str, list[str]]) -> tuple[str, dict, bytes]:
        prefix = query.get("prefix", [""])[0]
        delimiter = query.get("delimiter", [""])[0]
        limit = int(query.get("max-keys", ["1000"])[0])
        base = self.root / prefix.rpartition("/")[0] if "/" in prefix else self.root
        keys, prefixes = [], set()
        for entry in sorted(os.scandir(base), key=lambda e: e.name) if base.is_dir() else []:
            key = (prefix.rpartition("/")[0] + "/" if "/" in prefix else "") + entry.name
            if not key.startswith(prefix):
                continue
            if entry.is_dir():
                prefixes.add(key + "/")
            else:
                keys.append((key, entry.stat().st_size))
        keys, rows = keys[:limit], []
        for key, size in keys:
            rows.append(
                f"<Contents><Key>{quote(key)}</Key><LastModified>2024-01-01T00:00:00.000Z"
                f"</LastModified><ETag>&quot;0&quot;</ETag><Size>{size}</Size>"
                "<StorageClass>STANDARD</StorageClass></Contents>"
            )
        rows += [
            f"<CommonPrefixes><Prefix>{quote(p)}</Prefix></CommonPrefixes>"
            for p in sorted(prefixes)
        ]
        body = (
            '<?xml version="1.0" encoding="UTF-8"?><ListBucketResult '
            'xmlns="http://s3.amazonaws.com/doc/2006-03-01/">'
            f"<Name>{BUCKET}</Name><Prefix>{quote(prefix)}</Prefix><Delimiter>{delimiter}"
            f"</Delimiter><MaxKeys>{limit}</MaxKeys><KeyCount>{len(rows)}</KeyCount>"
            "<EncodingType>url</EncodingType><IsTruncated>false</IsTruncated>"
            + "".join(rows)
            + "</ListBucketResult>"
        ).encode()
        return "200 OK", {"Content-Type": "application/xml"}, body


def _error(status: str, code: str, *, head: bool = False) -> tuple[str, dict, bytes]:
    body = f"<Error><Code>{code}</Code><Message>{code}</Message></Error>".encode()
    return status, {"Content-Type": "application/xml"}, body


def serve(root: Path, delay: float) -> None:
    """The server process: S3 over `root`, the latency proxy in front; prints both URLs."""
    from remote_servers import Proxy

    async def main() -> None:
        s3 = S3Folder(root)
        server = await asyncio.start_server(s3.client, "127.0.0.1", 0)
        direct = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        with Proxy(direct, delay=delay) as proxy:
            print(json.dumps({"proxy": proxy.url, "direct": direct}), flush=True)
            await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)

    asyncio.run(main())


# -- the client --------------------------------------------------------------------------------


@contextmanager
def serving(root: Path, delay: float) -> Iterator[dict[str, str]]:
    """The S3 server and its delaying proxy over `root`, in a child process (`serve`), for
    the length of the block: yields their URLs (`proxy`, `direct`)."""
    server = subprocess.Popen(
        [sys.executable, __file__, "--serve", str(root), "--delay", str(delay)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        yield json.loads(server.stdout.readline())
    finally:
        if server.stdin:
            server.stdin.close()
        server.wait(10)


def server_stats(direct: str) -> dict[str, int]:
    host, port = urlsplit(direct).hostname, urlsplit(direct).port
    conn = http.client.HTTPConnection(host, port)
    conn.request("GET", "/__stats")
    return json.loads(conn.getresponse().read())


def round_trip(proxy: str, key: str, samples: int = 30) -> float:
    """Median seconds of a 1-byte ranged GET through the proxy on a kept-alive connection."""
    parts = urlsplit(proxy)
    conn = http.client.HTTPConnection(parts.hostname, parts.port)
    times = []
    for _ in range(samples):
        start = time.perf_counter()
        conn.request("GET", f"/{BUCKET}/{quote(key)}", headers={"Range": "bytes=0-0"})
        conn.getresponse().read()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def sequential_loop(proxy: str, prefix: str) -> tuple[float, int]:
    """The obvious loop: list, then per shard the 8-byte length and the header, parsed."""
    import orjson
    import s3fs

    fs = s3fs.S3FileSystem(endpoint_url=proxy, skip_instance_cache=True)
    start = time.perf_counter()
    keys = [k for k in fs.ls(f"{BUCKET}/{prefix}") if k.endswith(".safetensors")]
    tensors = 0
    for key in keys:
        (n,) = struct.unpack("<Q", fs.cat_file(key, start=0, end=8))
        header = orjson.loads(fs.cat_file(key, start=8, end=8 + n))
        tensors += len(header) - ("__metadata__" in header)
    return time.perf_counter() - start, tensors


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tensors", type=int, default=30_000)
    parser.add_argument("--shards", type=int, default=300)
    parser.add_argument("--delay", type=float, default=0.020, help="seconds added per request")
    parser.add_argument("--concurrency", type=int, default=None, help="default: the scan's")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--loop-runs", type=int, default=1)
    parser.add_argument("--serve", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        return serve(args.serve, args.delay)

    from _synthetic import ensure_checkpoint, spec_for

    from inspector._internal.checks import check
    from inspector._internal.scan.entry import scan
    from inspector._internal.storage.remote import DEFAULT_CONCURRENCY, DEFAULT_READ_AHEAD

    os.environ.update(AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench")
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    concurrency = args.concurrency or DEFAULT_CONCURRENCY
    folder = ensure_checkpoint(spec_for(tensors=args.tensors, shards=args.shards))
    shards = sorted(folder.glob("*.safetensors"))
    headers = 0
    for path in shards:
        with open(path, "rb") as fh:
            headers += 8 + struct.unpack("<Q", fh.read(8))[0]
    apparent = sum(p.stat().st_size for p in shards)
    side = sum((folder / n).stat().st_size for n in (INDEX_NAME, CONFIG_NAME, QUANT_CONFIG_NAME))
    with serving(folder.parent, args.delay) as urls:
        proxy, direct, prefix = urls["proxy"], urls["direct"], folder.name
        url = f"s3://{BUCKET}/{prefix}"
        options = {"endpoint_url": proxy}
        rtt = round_trip(proxy, f"{prefix}/{shards[0].name}")
        floor = math.ceil(len(shards) / concurrency) * rtt
        scanned = scan(url, storage_options=options, max_concurrency=concurrency)  # warm-up
        tensors = sum(len(s.names) for s in scanned.shards)
        findings = check(scanned, model=False)
        best, fetched, requests, listing = math.inf, 0, 0, 0
        for _ in range(args.runs):
            before = server_stats(direct)
            start = time.perf_counter()
            scan(url, storage_options=options, max_concurrency=concurrency)
            seconds = time.perf_counter() - start
            after = server_stats(direct)
            if seconds < best:
                best = seconds
                fetched = after["bytes"] - before["bytes"]
                listing = after["list_bytes"] - before["list_bytes"]
                requests = after["requests"] - before["requests"] - 1  # less the stats call
        loop = math.inf
        for _ in range(args.loop_runs):
            seconds, loop_tensors = sequential_loop(proxy, prefix)
            loop = min(loop, seconds)
    allowed = 1.2 * headers + len(shards) * DEFAULT_READ_AHEAD
    print(
        f"checkpoint: {len(shards)} shards, {tensors:,} tensors ({loop_tensors:,} in the loop), "
        f"headers {headers / 1e6:.2f} MB, {apparent / 1e12:.2f} TB of sparse files; "
        f"{len(findings)} findings"
    )
    print(f"round trip through the proxy: {rtt * 1000:.1f} ms (median of 30 1-byte GETs)")
    print(
        f"our scan:        {best:6.3f} s  best of {args.runs}, {requests} requests, "
        f"max_concurrency {concurrency}"
    )
    print(
        f"physical floor:  {floor:6.3f} s  ceil({len(shards)} / {concurrency}) x "
        f"{rtt * 1000:.1f} ms   scan / floor = {best / floor:.2f}  (target <= 2)"
    )
    print(
        f"sequential loop: {loop:6.3f} s  ({2 * len(shards) + 1} requests)   "
        f"loop / scan = {loop / best:.1f}x  (target >= 20)"
    )
    for_headers = fetched - side - listing
    print(
        f"bytes fetched:   {fetched / 1e6:.2f} MB: {listing / 1e3:.0f} kB of listing, "
        f"{side / 1e6:.2f} MB of JSON side files read whole (index, configs), "
        f"{for_headers / 1e6:.2f} MB for the headers = {for_headers / headers:.2f} x their "
        f"{headers / 1e6:.2f} MB; limit 1.2 x headers + {len(shards)} x "
        f"{DEFAULT_READ_AHEAD // 1024} KiB read-ahead = {allowed / 1e6:.2f} MB "
        f"({'met' if for_headers < allowed else 'MISSED'}; "
        f"{'met' if fetched < allowed else 'missed'} counting everything)"
    )


if __name__ == "__main__":
    main()
