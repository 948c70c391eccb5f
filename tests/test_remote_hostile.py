"""Hostile servers on 127.0.0.1 against the remote reader: a server that ignores Range and
sends the whole file (or a body that never ends), trickles a byte a second, stalls after its
headers, lists without end, redirects to another origin, or lies about Content-Length.

Each ends in bounded time (seconds, with the tests' short timeouts), bounded memory (measured
in a child process) and a clear result: the right findings, or one line and exit code 2. The
servers are the standard library's Range server behind `remote_servers.Proxy`, whose fault
rule answers the chosen requests itself (`remote_servers.Answer`); the Hub is `FakeHub`.
GCS is `FakeGCS` (the JSON API routes gcsfs uses). S3's answers are tested against moto in
tests/test_remote.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

sys.path.insert(0, str(Path(__file__).parent))

from remote_servers import Answer, FakeGCS, FakeHub, Proxy, RangeHTTPServer

from inspector._internal.checks import check
from inspector._internal.cli.main import main
from inspector._internal.common.filenames import INDEX_NAME
from inspector._internal.scan.entry import scan
from inspector._internal.storage.guard import ANSWER_CAP, MAX_LISTING, RedirectPolicy, origin
from inspector.errors import RemoteAccessError

pytest.importorskip("aiohttp")
pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("quick_retries")]

INDEX = INDEX_NAME
SHA = "a" * 40
# Bounds on every request of a test that does not wait for them (a test whose server
# misbehaves otherwise than planned then fails in seconds); the defaults are 120 s and 30 s.
BOUNDED = {"timeout": 3.0, "read_timeout": 1.0}
BOUNDED_ARGS = ["--timeout", "3", "--read-timeout", "1"]
# For the tests that wait for a stall or a trickle to end: a connection silent for 0.25 s is
# retried, a request ends at 1 s. Healthy requests to the local servers take milliseconds.
FAST_ARGS = ["--timeout", "1", "--read-timeout", "0.25"]


def write_checkpoint(folder: Path) -> Path:
    """Three shards and their index with safetensors' own writer; the last shard's header
    (about 30 KB) is longer than the small read-ahead some tests use."""
    folder.mkdir(parents=True)
    weight_map = {}
    for i in range(3):
        name = f"model-{i + 1:05d}-of-00003.safetensors"
        tensors = {f"model.layers.{i}.mlp.weight": np.ones((64, 64), np.float32)}
        if i == 2:
            extra = {f"model.layers.{i}.extra.{k}.bias": np.ones(2, np.float32) for k in range(300)}
            tensors |= extra
        save_file(tensors, str(folder / name))
        weight_map |= dict.fromkeys(tensors, name)
    (folder / INDEX).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return folder


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The served folder: `ckpt/`, a copy of it at `moved/` (a same-origin redirect's
    target) and, for the other origin, `elsewhere/` with other tensors under the same names."""
    base = tmp_path_factory.mktemp("site")
    write_checkpoint(base / "ckpt")
    shutil.copytree(base / "ckpt", base / "moved")
    other = base / "elsewhere"
    other.mkdir()
    for path in (base / "ckpt").glob("*.safetensors"):
        save_file({"stolen.weight": np.zeros(4, np.float32)}, str(other / path.name))
    return base


@pytest.fixture(scope="module")
def origin_server(site: Path) -> Iterator[RangeHTTPServer]:
    with RangeHTTPServer(site) as server:
        yield server


def comparable(scanned, findings) -> list[tuple]:
    root = str(scanned.path)
    return [(f.code, f.severity, f.file, f.message.replace(root, "<root>")) for f in findings]


@pytest.fixture(scope="module")
def local(site: Path) -> list[tuple]:
    scanned = scan(site / "ckpt")
    return comparable(scanned, check(scanned, model=False))


def served(backend: RangeHTTPServer, rule) -> Proxy:
    return Proxy(backend.url, fault=rule)


def cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str, float]:
    start = time.monotonic()
    code = main(args)
    took = time.monotonic() - start
    out, err = capsys.readouterr()
    assert "Traceback" not in err + out
    return code, out, err, took


def one_line(err: str) -> str:
    assert err.count("\n") == 1, err
    return err


def is_shard(path: str) -> bool:
    return path.startswith("/ckpt/") and path.endswith(".safetensors")


# -- Range ignored: the whole file, or a body that never ends --------------------------------


def whole_file_forever(site: Path, *, only_shards: bool = True):
    """Every GET of a file in ckpt/ answered 200 with the whole file, then the file again
    and again without end: Range ignored, and a body no one could buffer."""

    def rule(method: str, path: str, n: int) -> Answer | None:
        if method != "GET" or not path.startswith("/ckpt/") or path.endswith("/"):
            return None
        if only_shards and not is_shard(path):
            return None
        return Answer(200, body=(site / path.lstrip("/")).read_bytes(), forever=True)

    return rule


def test_range_ignored_costs_only_the_asked_prefix(
    site: Path, origin_server: RangeHTTPServer, local: list[tuple]
) -> None:
    """A 200 to a range from byte 0 is used for the bytes asked, and nothing more is read:
    the checkpoint scans as locally (headers, index and all), in seconds."""
    with served(origin_server, whole_file_forever(site, only_shards=False)) as proxy:
        start = time.monotonic()
        there = scan(f"{proxy.url}/ckpt/", **BOUNDED)
        took = time.monotonic() - start
    assert comparable(there, check(there, model=False)) == local
    assert took < 10


def test_range_ignored_past_byte_0_is_refused_by_name(
    site: Path, origin_server: RangeHTTPServer
) -> None:
    """A header longer than the read-ahead needs a range that does not start at 0: the
    server's 200 is refused (reading on would download the file), as a finding on that
    shard saying why; the other shards are read."""
    with served(origin_server, whole_file_forever(site)) as proxy:
        there = scan(f"{proxy.url}/ckpt/", read_ahead=4096, **BOUNDED)
    problems = {f.file: f for f in there.read_findings}
    assert [s.readable for s in there.shards] == [True, True, False]
    refused = problems["model-00003-of-00003.safetensors"]
    assert refused.code == "header-unreadable"
    assert "ignores Range requests" in refused.message and "HTTP 200" in refused.message


# -- bodies that trickle or stall --------------------------------------------------------------


def test_a_trickling_body_ends_at_the_deadline(
    site: Path, origin_server: RangeHTTPServer, capsys: pytest.CaptureFixture[str]
) -> None:
    """A byte every 10 ms never trips the read timeout (25 times that); the deadline ends
    it: one line."""

    def rule(method: str, path: str, n: int) -> Answer | None:
        if method == "GET" and path.endswith("model-00002-of-00003.safetensors"):
            return Answer(200, body=(site / path.lstrip("/")).read_bytes(), rate=100.0)
        return None

    with served(origin_server, rule) as proxy:
        code, _, err, took = cli(["scan", f"{proxy.url}/ckpt/", *FAST_ARGS], capsys)
    assert code == 2 and took < 8
    assert "no complete answer within 1 s (--timeout" in one_line(err)
    assert "model-00002-of-00003.safetensors" in err


def test_a_body_that_stalls_after_its_headers_times_out(
    site: Path, origin_server: RangeHTTPServer, capsys: pytest.CaptureFixture[str]
) -> None:
    """Headers, then silence with the connection open: each attempt ends after the read
    timeout, the retries within the deadline: one line, in seconds."""

    def rule(method: str, path: str, n: int) -> Answer | None:
        if method == "GET" and is_shard(path):
            return Answer(200, body=b"", length=1 << 20, stall=True)
        return None

    with served(origin_server, rule) as proxy:
        code, _, err, took = cli(["check", f"{proxy.url}/ckpt/", "--no-model", *FAST_ARGS], capsys)
        asked = Counter(p for p in proxy.paths if p.endswith(".safetensors"))
    assert code == 2 and took < 8
    assert "(--timeout" in one_line(err) or "(--read-timeout)" in err
    # Retried after the read timeout, not given up at once: a shard asked again (counting
    # every shard's requests together, as before, three shards made it true without one).
    assert max(asked.values()) >= 2, asked


# -- listings --------------------------------------------------------------------------------------


def test_an_endless_listing_page_is_one_line(
    origin_server: RangeHTTPServer, capsys: pytest.CaptureFixture[str]
) -> None:
    def rule(method: str, path: str, n: int) -> Answer | None:
        if path == "/ckpt/":
            link = b'<a href="model.safetensors">model.safetensors</a>\n'
            return Answer(200, {"Content-Type": "text/html"}, body=link * 1000, forever=True)
        return None

    with served(origin_server, rule) as proxy:
        code, _, err, took = cli(["scan", f"{proxy.url}/ckpt/", *BOUNDED_ARGS], capsys)
    assert code == 2 and took < 10
    expected = f"cannot be listed: the server's answer goes on past the {ANSWER_CAP:,}-byte limit"
    assert expected in one_line(err)


# The entry cap is 20,000 here, not its 200,000: an index page counts its links against it
# one by one all the same, in a tenth of the links to parse (3 s of CPU at the real cap).
# The cap at its real value is tested on the Hub (test_hub_endless_tree_listing_is_one_line).
def test_a_listing_of_too_many_entries_is_one_line(
    origin_server: RangeHTTPServer,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from inspector._internal.storage import guard

    assert MAX_LISTING == 200_000
    monkeypatch.setattr(guard, "MAX_LISTING", 20_000)
    page = "".join(f'<a href="s{i}.safetensors">x</a>' for i in range(20_001)).encode()
    assert len(page) < ANSWER_CAP

    def rule(method: str, path: str, n: int) -> Answer | None:
        return Answer(200, {"Content-Type": "text/html"}, body=page) if path == "/ckpt/" else None

    with served(origin_server, rule) as proxy:
        code, _, err, _ = cli(["scan", f"{proxy.url}/ckpt/", *BOUNDED_ARGS], capsys)
    assert code == 2 and "goes on past 20,000 entries" in one_line(err)


# -- redirects ---------------------------------------------------------------------------------


def redirect_shards(target: str):
    """Every GET of a shard in ckpt/ redirected (302) to `target` + its name."""

    def rule(method: str, path: str, n: int) -> Answer | None:
        if method == "GET" and is_shard(path):
            return Answer(302, {"Location": target + path.rsplit("/", 1)[1]})
        return None

    return rule


def test_a_redirect_to_another_origin_is_refused(
    site: Path, origin_server: RangeHTTPServer, capsys: pytest.CaptureFixture[str]
) -> None:
    """The other server's files are never requested, and never reported as the checkpoint:
    each shard is a `file-unsafe` finding naming both origins (exit 1)."""
    with Proxy(origin_server.url) as elsewhere:  # another origin, counting its requests
        away = redirect_shards(f"{elsewhere.url}/elsewhere/")
        with served(origin_server, away) as proxy:
            code, out, _, _ = cli(
                ["check", f"{proxy.url}/ckpt/", "--no-model", "--json", *BOUNDED_ARGS], capsys
            )
        assert elsewhere.requests == 0
    result = json.loads(out)
    unsafe = [f for f in result["findings"] if f["code"] == "file-unsafe"]
    assert code == 1 and len(unsafe) == 3
    both = f"({origin(proxy.url)} -> {origin(elsewhere.url)})"
    assert all(both in f["message"] for f in unsafe)
    assert not any("stolen" in json.dumps(f) for f in result["findings"])


def test_a_redirect_of_the_url_itself_to_another_origin_is_refused(
    site: Path, origin_server: RangeHTTPServer
) -> None:
    """A single-file URL that redirects elsewhere: refused the same way."""
    with (
        Proxy(origin_server.url) as other,  # another origin, counting its requests
        served(origin_server, redirect_shards(f"{other.url}/elsewhere/")) as proxy,
    ):
        there = scan(f"{proxy.url}/ckpt/model-00001-of-00003.safetensors", **BOUNDED)
        assert other.requests == 0
    assert [f.code for f in there.read_findings] == ["file-unsafe"]
    assert "is redirected by the server to another origin" in there.read_findings[0].message


def test_a_redirect_within_the_origin_is_followed(
    site: Path, origin_server: RangeHTTPServer, local: list[tuple]
) -> None:
    def rule(method: str, path: str, n: int) -> Answer | None:
        if method == "GET" and is_shard(path):
            return Answer(302, {"Location": "/moved/" + path.rsplit("/", 1)[1]})
        return None

    with served(origin_server, rule) as proxy:
        there = scan(f"{proxy.url}/ckpt/", **BOUNDED)
        moved = [p for p in proxy.paths if p.startswith("GET /moved/")]
    assert comparable(there, check(there, model=False)) == local
    assert len(moved) == 3


def test_allow_redirect_trusts_an_origin(
    site: Path, origin_server: RangeHTTPServer, local: list[tuple], capsys
) -> None:
    """`--allow-redirect ORIGIN` (here to a copy of the checkpoint) follows the redirect."""
    with (
        Proxy(origin_server.url) as mirror,  # another origin, counting its requests
        served(origin_server, redirect_shards(f"{mirror.url}/moved/")) as proxy,
    ):
        there = scan(f"{proxy.url}/ckpt/", allow_redirects=[mirror.url], **BOUNDED)
        args = ["check", f"{proxy.url}/ckpt/", "--no-model", *BOUNDED_ARGS]
        code, *_ = cli([*args, "--allow-redirect", mirror.url], capsys)
        assert mirror.requests >= 6
    assert comparable(there, check(there, model=False)) == local and code == 0


# -- lying Content-Length ------------------------------------------------------------------------


def test_a_content_length_longer_than_the_body_is_one_line(
    site: Path, origin_server: RangeHTTPServer, capsys: pytest.CaptureFixture[str]
) -> None:
    """The connection closes before the announced bytes: retried, then one line."""

    def rule(method: str, path: str, n: int) -> Answer | None:
        if method == "GET" and is_shard(path):
            return Answer(200, body=b"\x00" * 100, length=1 << 20, close=True)
        return None

    with served(origin_server, rule) as proxy:
        code, _, err, took = cli(["scan", f"{proxy.url}/ckpt/", *BOUNDED_ARGS], capsys)
    assert code == 2 and took < 8
    assert "ClientPayloadError after" in one_line(err) and "cuts its answers short" in err


def test_a_content_length_shorter_than_the_range_is_a_finding(
    site: Path, origin_server: RangeHTTPServer
) -> None:
    """A 206 that announces (and sends) fewer bytes than the range asked within the file:
    that shard is unreadable, saying so; the rest of the connection's bytes are never
    taken for another answer."""

    def rule(method: str, path: str, n: int) -> Answer | None:
        if method == "GET" and path.endswith("model-00001-of-00003.safetensors"):
            size = (site / path.lstrip("/")).stat().st_size
            head = {"Content-Range": f"bytes 0-{size - 1}/{size}"}
            return Answer(206, head, body=(site / path.lstrip("/")).read_bytes()[:10])
        return None

    with served(origin_server, rule) as proxy:
        there = scan(f"{proxy.url}/ckpt/", **BOUNDED)
    bad = [f for f in there.read_findings if f.file == "model-00001-of-00003.safetensors"]
    assert [f.code for f in bad] == ["header-unreadable"]
    assert "sent 10 of the" in bad[0].message
    assert [s.readable for s in there.shards] == [False, True, True]


# -- bounded memory, measured -------------------------------------------------------------------

_CHILD = textwrap.dedent(
    """
    import contextlib, io, json, os, resource, sys, time
    import aiohttp, fsspec  # noqa: F401  (imported before the baseline)
    from inspector._internal.cli.main import main
    import inspector._internal.storage.remote  # noqa: F401
    # What `check` and `scan` import when they run (the CLI imports a command's readers only
    # then, to start fast): each run once on a missing folder before the baseline, or their
    # imports would count as growth.
    with contextlib.redirect_stderr(io.StringIO()):
        main(["check", "/no-such-checkpoint", "--no-model"])
        main(["scan", "/no-such-checkpoint"])
    # Each command in a child forked from here, the imports done: a fork costs milliseconds
    # where another interpreter would import everything again. The child's pages of shared
    # libraries are mapped again as it touches them, so its growth is, if anything, larger.
    for args in json.loads(sys.argv[1]):
        pid = os.fork()
        if pid == 0:
            sys.stderr = err = io.StringIO()
            before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            start = time.monotonic()
            code = main(args)
            took = time.monotonic() - start
            after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            grew = (after - before) / 1024
            said = {"code": code, "took": took, "grew_mb": grew, "err": err.getvalue()}
            print("@@" + json.dumps(said), flush=True)
            os._exit(0)
        os.waitpid(pid, 0)
    """
)


def run_children(*commands: list[str]) -> list[dict]:
    """Each command's exit code, time, growth of the process's peak memory (MB) and
    stderr, in a process of its own."""
    repo = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(repo)}
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, json.dumps(commands)],
        capture_output=True,
        text=True,
        timeout=90,
        env=env,
        cwd=repo,
    )
    marked = [json.loads(line[2:]) for line in proc.stdout.splitlines() if line.startswith("@@")]
    assert len(marked) == len(commands), proc.stdout + proc.stderr
    assert not any("Traceback" in m["err"] for m in marked), marked
    assert "Traceback" not in proc.stderr, proc.stderr
    return marked


def test_endless_bodies_keep_memory_bounded(site: Path, origin_server: RangeHTTPServer) -> None:
    """Every file answered with a body that never ends (and the index said, by HEAD, to be
    900 MB), and a listing page that never ends: the process grows by a few MB, not by what
    was sent. The index is read in 8 MiB requests: the first is the prefix of the endless
    answer, the second (from 8 MiB) is refused, and the index is a finding."""
    page = b'<a href="model-00001-of-00003.safetensors">x</a>\n' * 100
    whole = whole_file_forever(site, only_shards=False)

    def rule(method: str, path: str, n: int) -> Answer | None:
        if path == "/endless/":
            return Answer(200, {"Content-Type": "text/html"}, body=page, forever=True)
        if method == "HEAD" and path.endswith(INDEX):
            return Answer(200, length=900_000_000)
        return whole(method, path, n)

    with served(origin_server, rule) as proxy:
        files, listing = run_children(
            ["check", f"{proxy.url}/ckpt/", "--no-model", *BOUNDED_ARGS],
            ["scan", f"{proxy.url}/endless/", *BOUNDED_ARGS],
        )
        sent = proxy.body_bytes
    assert files["code"] == 1 and files["took"] < 20 and files["grew_mb"] < 100, files
    assert listing["code"] == 2 and listing["grew_mb"] < 100, listing
    assert "cannot be listed" in listing["err"]
    assert sent > 2 * ANSWER_CAP  # the server did send far more than was kept


# -- the Hugging Face Hub ------------------------------------------------------------------------


def test_hub_redirect_rule() -> None:
    """For hf:// from the Hub itself, redirects may go to https hosts of Hugging Face's own
    domains (its file CDNs); nowhere else, never to http, and never from a mirror."""
    hub = RedirectPolicy(hub=True)
    resolve = "https://huggingface.co/org/m/resolve/" + SHA + "/model.safetensors"
    for cdn in (
        "https://cdn-lfs.hf.co/repos/ab/cd/x?X-Amz-Signature=1",
        "https://cdn-lfs-us-1.hf.co/repos/x",
        "https://cas-bridge.xethub.hf.co/xet-bridge-us/x",
        "https://huggingface.co/api/resolve-cache/x",
        "https://hf.co/x",
    ):
        assert not hub.refuses(resolve, cdn), cdn
    for elsewhere in (
        "http://cdn-lfs.hf.co/x",
        "https://hf.co.evil.example/x",
        "https://evilhf.co/x",
        "https://example.com/x",
        "ftp://cdn-lfs.hf.co/x",
    ):
        assert hub.refuses(resolve, elsewhere), elsewhere
    assert RedirectPolicy().refuses(resolve, "https://cdn-lfs.hf.co/x")
    mirror = RedirectPolicy(hub=True)
    assert mirror.refuses("https://hf-mirror.example/org/m/resolve/x", "https://cdn-lfs.hf.co/x")
    allowed = RedirectPolicy(frozenset({origin("https://cdn.example:8443")}))
    assert not allowed.refuses("https://a.example/x", "https://CDN.example:8443/y")
    assert allowed.refuses("https://a.example/x", "https://cdn.example/y")


@pytest.fixture(scope="module")
def hub_repo(site: Path, hub_server: FakeHub) -> Iterator[FakeHub]:
    with hub_server.serving({"org/tiny": {"main": (SHA, site / "ckpt")}}) as hub:
        yield hub


def _shards_redirected_to(origin: str) -> Callable[[str, str, int], Answer | None]:
    """A Hub endpoint's rule: shard downloads (`resolve/`) sent to `origin`, as the real
    Hub sends them to its CDN."""

    def rule(method: str, path: str, n: int) -> Answer | None:
        if "/resolve/" in path and path.endswith(".safetensors"):
            return Answer(302, {"Location": origin + path})
        return None

    return rule


def test_hub_resolve_redirected_to_another_origin(
    hub_repo: FakeHub, local: list[tuple], capsys: pytest.CaptureFixture[str]
) -> None:
    """The Hub stand-in (a custom endpoint, as a mirror would be) sends resolve/ downloads
    to another origin, as the real Hub sends them to its CDN: refused unless allowed."""
    with (
        Proxy(hub_repo.url) as cdn,
        Proxy(hub_repo.url, fault=_shards_redirected_to(cdn.url)) as endpoint,
    ):
        options = {"endpoint": endpoint.url, "token": False}
        refused = scan("hf://org/tiny", storage_options=options, **BOUNDED)
        assert cdn.requests == 0
        allowed = scan(
            "hf://org/tiny", storage_options=options, allow_redirects=[cdn.url], **BOUNDED
        )
        assert cdn.requests == 3
    unsafe = [f for f in refused.read_findings if f.code == "file-unsafe"]
    assert len(unsafe) == 3
    assert f"({origin(endpoint.url)} -> {origin(cdn.url)})" in unsafe[0].message
    assert comparable(allowed, check(allowed, model=False)) == local


def test_hub_endless_tree_listing_is_one_line(hub_repo: FakeHub) -> None:
    """A tree listing whose Link header always names a next page ends at the cap."""

    def rule(method: str, path: str, n: int) -> Answer | None:
        if "/api/models/org/tiny/tree/" in path:
            page = [{"type": "file", "path": f"p{n}-{i}.json", "size": 2} for i in range(1000)]
            base = path.split("?", 1)[0]
            link = f'<http://127.0.0.1:{port}{base}?cursor={n}>; rel="next"'
            return Answer(200, {"Link": link}, body=json.dumps(page).encode())
        return None

    with Proxy(hub_repo.url, fault=rule) as endpoint:
        port = endpoint.url.rsplit(":", 1)[1]
        start = time.monotonic()
        with pytest.raises(RemoteAccessError, match="goes on past 200,000 entries"):
            scan("hf://org/tiny", storage_options={"endpoint": endpoint.url, "token": False})
        assert time.monotonic() - start < 30


def test_hub_stalled_revision_is_one_line(hub_repo: FakeHub) -> None:
    def rule(method: str, path: str, n: int) -> Answer | None:
        if "/revision/" in path:
            return Answer(200, body=b"{", length=100, stall=True)
        return None

    with Proxy(hub_repo.url, fault=rule) as endpoint:
        start = time.monotonic()
        # The revision is the scan's first request: nothing else has to be answered within
        # the deadline, which ends the stall (the read timeout is longer: one attempt).
        with pytest.raises(RemoteAccessError, match=r"no complete answer within 0\.5 s"):
            options = {"endpoint": endpoint.url, "token": False}
            scan("hf://org/tiny", storage_options=options, timeout=0.5, read_timeout=5.0)
        assert time.monotonic() - start < 4  # under the read timeout: the deadline ended it


# -- Google Cloud Storage ------------------------------------------------------------------------


def test_gcs_scan_equals_local_over_paged_listings(site: Path, local: list[tuple]) -> None:
    """gs:// through gcsfs against the JSON API stand-in: listed page by page (2 entries a
    page here), read by ranges: the same findings as the local copy."""
    pytest.importorskip("gcsfs")
    with FakeGCS({"b": site}, page_size=2) as gcs:
        there = scan("gs://b/ckpt", storage_options={"endpoint_url": gcs.url, "token": "anon"})
        assert gcs.pages >= 2
        files = sum(p.stat().st_size for p in (site / "ckpt").iterdir())
        assert 0 < gcs.content_bytes <= files
    assert str(there.path) == "gs://b/ckpt"
    assert comparable(there, check(there, model=False)) == local


def test_gcs_hostile_answers(site: Path) -> None:
    """The same guard on gcsfs' session: a download redirected to another origin is refused
    (the other server gets nothing), a 200 to a range further in is refused by name."""
    pytest.importorskip("gcsfs")
    with FakeGCS({"b": site}) as gcs, Proxy(gcs.url) as other:

        def rule(method: str, path: str, n: int) -> Answer | None:
            if path.startswith("/download/") and "model-00001-of" in path:
                return Answer(302, {"Location": other.url + path})
            if path.startswith("/download/") and "model-00003-of" in path:
                body = (site / "ckpt" / "model-00003-of-00003.safetensors").read_bytes()
                return Answer(200, body=body, forever=True)
            return None

        with Proxy(gcs.url, fault=rule) as front:
            options = {"endpoint_url": front.url, "token": "anon"}
            there = scan("gs://b/ckpt", storage_options=options, read_ahead=4096, **BOUNDED)
        assert other.requests == 0
    found = {f.file: f for f in there.read_findings}
    assert found["model-00001-of-00003.safetensors"].code == "file-unsafe"
    assert "another origin" in found["model-00001-of-00003.safetensors"].message
    assert found["model-00003-of-00003.safetensors"].code == "header-unreadable"
    assert "ignores Range" in found["model-00003-of-00003.safetensors"].message
    assert [s.readable for s in there.shards] == [False, True, False]


def test_a_hub_session_carries_no_cookie_to_a_later_scan(hub_repo: FakeHub) -> None:
    """The Hub's session is reused by later scans in the process, which may send another
    token (a header of each request) or none: a cookie the server set for one (a login
    session, a tracker) is never sent back, in that scan or a later one. `localhost`, not
    127.0.0.1: aiohttp's default jar keeps no cookie of an IP address."""

    def rule(method: str, path: str, n: int) -> Answer | None:
        if "/revision/" in path:
            head = {"Set-Cookie": f"hub-session=of-request-{n}; Path=/"}
            return Answer(200, head, body=json.dumps({"sha": SHA}).encode())
        return None

    with Proxy(hub_repo.url, fault=rule) as proxy:
        endpoint = proxy.url.replace("127.0.0.1", "localhost")
        first = scan("hf://org/tiny", storage_options={"endpoint": endpoint, "token": "hf_a"})
        asked_first = list(proxy.sent_headers)
        proxy.reset()
        second = scan("hf://org/tiny", storage_options={"endpoint": endpoint, "token": False})
        asked_second = list(proxy.sent_headers)
    assert len(first.shards) == len(second.shards) == 3
    assert all(h.get("authorization") == "Bearer hf_a" for h in asked_first), asked_first
    assert not any("cookie" in h for h in asked_first + asked_second)
    assert not any("authorization" in h for h in asked_second)


def test_a_redirect_allowed_for_one_scan_is_not_for_the_next(
    site: Path, origin_server: RangeHTTPServer, local: list[tuple]
) -> None:
    """The session a scan with `allow_redirects` used (its policy is part of it) is never the
    one of a later scan without: that scan refuses the redirect to the mirror, which hears
    nothing of it, as in a fresh process; the first scan's session is reused when it is
    asked for again."""
    with (
        Proxy(origin_server.url) as mirror,
        served(origin_server, redirect_shards(f"{mirror.url}/moved/")) as proxy,
    ):
        allowed = scan(f"{proxy.url}/ckpt/", allow_redirects=[mirror.url], **BOUNDED)
        assert mirror.requests == 3
        mirror.reset()
        refused = scan(f"{proxy.url}/ckpt/", **BOUNDED)
        assert mirror.requests == 0
        again = scan(f"{proxy.url}/ckpt/", allow_redirects=[mirror.url], **BOUNDED)
        assert mirror.requests == 3
    assert comparable(allowed, check(allowed, model=False)) == local
    assert comparable(again, check(again, model=False)) == local
    assert [f.code for f in refused.read_findings] == ["file-unsafe"] * 3


def test_a_hub_token_never_reaches_an_allowed_redirect_origin(hub_repo: FakeHub) -> None:
    """A download the Hub's endpoint redirects to an origin the user allowed is followed,
    without the token: it goes to the endpoint's own origin alone, on a session that
    other scans reuse."""
    with (
        Proxy(hub_repo.url) as cdn,
        Proxy(hub_repo.url, fault=_shards_redirected_to(cdn.url)) as endpoint,
    ):
        options = {"endpoint": endpoint.url, "token": "hf_secret"}
        for _ in range(2):  # a fresh session, then the reused one
            cdn.reset()
            there = scan(
                "hf://org/tiny", storage_options=options, allow_redirects=[cdn.url], **BOUNDED
            )
            assert cdn.requests == 3 and all(s.readable for s in there.shards)
            assert not any("authorization" in h for h in cdn.sent_headers)
        to_endpoint = endpoint.sent_headers
    assert all(h.get("authorization") == "Bearer hf_secret" for h in to_endpoint)
