"""Remote checkpoints against real servers on 127.0.0.1: moto's S3 API server with s3fs as the
client (no mocked calls), behind a proxy that counts what is served and can inject
throttling or refusals, and the standard library's HTTP server with Range support.

Every demo checkpoint and every golden writer fixture is uploaded and must give the same
findings as its local copy, case for case (messages compared with the folder's own path or
URL replaced). The servers are the session's (tests/conftest.py); this file's bucket is
`ckpts`. HTTPS is the same code path as HTTP in fsspec (aiohttp with TLS); the tests
use plain HTTP on loopback, where no certificate can be had offline.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import unquote

import numpy as np
import pytest
from safetensors.numpy import save_file

sys.path.insert(0, str(Path(__file__).parent))

from golden_manifest import unreadable
from remote_servers import Answer, Proxy, RangeHTTPServer, S3Store, s3_error

from inspector._internal.checkpoint.scanned import ScannedCheckpoint
from inspector._internal.checks import check
from inspector._internal.checks.values import value_table
from inspector._internal.cli.main import main
from inspector._internal.common.filenames import INDEX_NAME
from inspector._internal.findings.finding import Finding
from inspector._internal.load.verdict import load_verdict, verdict_digest
from inspector._internal.plans.consolidate import plan_consolidation
from inspector._internal.plans.repair import plan_repair
from inspector._internal.scan.entry import scan
from inspector._internal.storage.guard import origin
from inspector.errors import CannotInspectError, PlanRefusedError, RemoteAccessError

pytest.importorskip("s3fs")
pytest.importorskip("moto")
pytestmark = [pytest.mark.timeout(300), pytest.mark.usefixtures("aws_env", "quick_retries")]

FIXTURES = Path(__file__).parent / "fixtures" / "writers"
BUCKET = "ckpts"
INDEX = INDEX_NAME


@pytest.fixture(scope="module")
def endpoint(s3_store: S3Store) -> str:
    return s3_store.url


@pytest.fixture(scope="module")
def bucket(s3_store: S3Store) -> str:
    return s3_store.bucket(BUCKET)


@pytest.fixture(scope="module")
def proxy(endpoint: str) -> Iterator[Proxy]:
    with Proxy(endpoint) as running:
        yield running


@pytest.fixture(scope="module")
def checkpoints(s3_store: S3Store, bucket: str, demo_checkpoints: Path) -> dict[str, Path]:
    """Every demo and golden fixture, local (read, never changed), and uploaded to
    s3://ckpts/<name>/."""
    from inspector._internal.demo import demo_names

    folders = {f"demo/{n}": demo_checkpoints / n for n in demo_names()}
    manifest = json.loads((FIXTURES / "MANIFEST.json").read_text())
    folders.update({f"fixture/{name}": FIXTURES / name for name in manifest})
    for name, folder in folders.items():
        s3_store.put_folder(folder, bucket, name)
    return folders


def plain(paths: list[str]) -> list[str]:
    """Requested paths without their query strings (ranged reads of object data go to
    presigned URLs)."""
    return [p.split("?", 1)[0] for p in paths]


def remote(url: str, proxy: Proxy, **kwargs) -> ScannedCheckpoint:
    return scan(url, storage_options={"endpoint_url": proxy.url}, **kwargs)


def comparable(scanned: ScannedCheckpoint, findings: list[Finding]) -> list[tuple]:
    """Findings with the checkpoint's location (and its run folder's: a DCP run's upstream
    model sits there) written as placeholders."""
    root = str(scanned.path)
    run = root.rsplit("/", 1)[0]

    def text(message: str) -> str:
        return message.replace(root, "<root>").replace(run, "<run>")

    return [
        (f.code, f.severity, f.file, f.tensor, f.layer, f.expert, text(f.message)) for f in findings
    ]


def demo_and_fixture_names() -> list[object]:
    """Every demo and golden fixture; a fixture of a format with no reader yet is a strict
    expected failure with the reason (`tests/golden_manifest.py`), never a silent skip."""
    from inspector._internal.demo import demo_names

    manifest = json.loads((FIXTURES / "MANIFEST.json").read_text())
    fixtures = [
        pytest.param(
            f"fixture/{n}",
            marks=[pytest.mark.xfail(strict=True, reason=why)] if (why := unreadable(n)) else [],
        )
        for n in manifest
    ]
    return [f"demo/{n}" for n in demo_names()] + fixtures


# -- the same findings as the local copy -----------------------------------------------------


@pytest.mark.parametrize("name", demo_and_fixture_names())
def test_same_findings_as_the_local_copy(
    name: str, checkpoints: dict[str, Path], proxy: Proxy
) -> None:
    """Every finding the files give, and the load verdict's input: the verdict is a function
    of what `verdict_digest` covers (the verdict cache serves a copy of a checkpoint by it),
    so equal digests are equal verdicts without building 73 models in a file about
    reading. The verdict of a remote scan is computed and compared once, below."""
    local = scan(checkpoints[name])
    there = remote(f"s3://{BUCKET}/{name}", proxy)
    assert there.layout == local.layout
    assert str(there.path) == f"s3://{BUCKET}/{name}" + (
        "/model" if local.path != checkpoints[name].resolve() else ""
    )
    assert [s.names for s in there.shards] == [s.names for s in local.shards]
    assert comparable(there, check(there, model=False)) == comparable(
        local, check(local, model=False)
    )
    assert verdict_digest(there) == verdict_digest(local)


def test_the_load_verdict_of_a_remote_scan_is_the_local_one(
    checkpoints: dict[str, Path], proxy: Proxy
) -> None:
    """The model built for a remote scan (no folder: its code is never fetched) gives the
    local copy's verdict and findings: here a checkpoint with tensors both missing and
    unexpected for its model."""
    name = "fixture/llmcompressor/lm-head-scales-exported"
    local = scan(checkpoints[name])
    there = remote(f"s3://{BUCKET}/{name}", proxy)
    assert there.local_path is None
    verdict = load_verdict(there, cache=False)  # computed, not a kept one
    assert verdict.to_dict() == load_verdict(local).to_dict() and verdict.skipped is None
    found = comparable(there, check(there))
    assert found == comparable(local, check(local))
    assert {"load-missing-tensor", "load-unexpected-tensor"} <= {f[0] for f in found}


# -- header-only reads ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def big(s3_store: S3Store, bucket: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Four shards of 2 MB of tensor data each, one with a header longer than the read-ahead."""
    folder = tmp_path_factory.mktemp("big") / "ckpt"
    folder.mkdir()
    weight_map = {}
    for i in range(4):
        name = f"model-{i + 1:05d}-of-00004.safetensors"
        tensors = {f"model.layers.{i}.mlp.weight": np.zeros((512, 1024), np.float32)}
        if i == 3:  # 600 small tensors: a header of about 60 KB
            tensors |= {
                f"model.layers.{i}.extra.{k}.bias": np.zeros(2, np.float32) for k in range(600)
            }
        save_file(tensors, str(folder / name))
        weight_map |= dict.fromkeys(tensors, name)
    (folder / INDEX).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    s3_store.put_folder(folder, bucket, "big")
    return folder


def header_len(path: Path) -> int:
    with open(path, "rb") as fh:
        return 8 + struct.unpack("<Q", fh.read(8))[0]


def test_header_only_reads_by_bytes_served(big: Path, proxy: Proxy) -> None:
    shards = sorted(big.glob("*.safetensors"))
    ahead = 16 << 10  # shorter than the long header: its shard needs a second read
    proxy.reset()
    scanned = remote(f"s3://{BUCKET}/big", proxy, read_ahead=ahead)
    served, paths = proxy.body_bytes, plain(proxy.paths)
    local = scan(big)
    assert comparable(scanned, check(scanned, model=False)) == comparable(
        local, check(local, model=False)
    )
    headers = sum(header_len(p) for p in shards)
    data = sum(p.stat().st_size for p in shards)
    index = (big / INDEX).stat().st_size
    # Each header once, plus what its read-ahead took beyond it, plus the index whole; the
    # listing's XML and the root's metadata are the rest. Never tensor data beyond that.
    read_ahead_extra = sum(max(ahead - header_len(p), 0) for p in shards)
    assert served <= headers + read_ahead_extra + index + 16_000
    assert served < data / 50
    gets = [p for p in paths if p.startswith("GET ") and p.endswith(".safetensors")]
    long_header = shards[-1].name
    assert sorted(p.split("/")[-1] for p in gets) == sorted(
        [s.name for s in shards] + [long_header]
    )  # one GET per shard, a second only for the header past the read-ahead
    assert scanned.storage is not None and scanned.storage.stats.bytes <= served
    # Asked for, the data is read (check --deep reads every tensor's bytes).
    proxy.reset()
    deep = [f for f in check(scanned, deep=True, model=False) if f.code == "tensor-all-zero"]
    assert len(deep) == 4 and proxy.body_bytes >= data - headers


def test_default_read_ahead_costs_one_request_per_shard(big: Path, proxy: Proxy) -> None:
    proxy.reset()
    remote(f"s3://{BUCKET}/big", proxy)
    gets = [p for p in plain(proxy.paths) if p.startswith("GET ") and p.endswith(".safetensors")]
    assert len(gets) == 4


@pytest.mark.parametrize("limit", [2, 16])
def test_requests_in_flight_are_bounded(big: Path, endpoint: str, limit: int) -> None:
    """--max-concurrency bounds the requests in flight, and the scan does fill it: the
    four headers and the side files go out together."""
    with Proxy(endpoint, delay=0.05) as slow:
        scanned = scan(
            f"s3://{BUCKET}/big",
            storage_options={"endpoint_url": slow.url},
            max_concurrency=limit,
        )
        peak = slow.peak
    assert len(scanned.shards) == 4
    assert peak == limit if limit == 2 else 4 <= peak <= limit


# -- one client per endpoint and credentials ----------------------------------------------------


def signers(proxy: Proxy) -> set[str]:
    """The access key ids that signed the requests `proxy` passed on (in the Authorization
    header, or the query of a presigned URL)."""
    found: set[str] = set()
    for path, headers in zip(proxy.paths, proxy.sent_headers, strict=True):
        text = unquote(path) + " " + headers.get("authorization", "")
        found |= set(re.findall(r"Credential=([^/]+)/", text))
    return found


def test_one_s3_client_per_endpoint_and_credentials(
    big: Path, proxy: Proxy, endpoint: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Scans in one process reuse the S3 client (botocore's set-up, the credentials it
    resolved, its connections) made for the same endpoint, options and credentials, and
    never one made for others: another access key, from the environment or from a
    credentials file rewritten since, or another endpoint gets a client of its own, whose
    requests carry its own key to its own endpoint. Each client has a session of its own,
    and they all share one botocore data loader: botocore's endpoint table is parsed once
    in the process, not once per client (about 180 ms of CPU each)."""
    from aiobotocore.session import AioSession
    from botocore.loaders import JSONFileLoader

    made: list[object] = []
    sessions: list[AioSession] = []
    real = AioSession.create_client

    def counting(self: AioSession, *args: object, **kwargs: object) -> object:
        made.append(kwargs.get("endpoint_url"))
        sessions.append(self)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(AioSession, "create_client", counting)
    parsed: list[str] = []
    real_load = JSONFileLoader.load_file

    def loading(self: JSONFileLoader, file_path: str) -> object:
        parsed.append(file_path)
        return real_load(self, file_path)

    monkeypatch.setattr(JSONFileLoader, "load_file", loading)

    def read(through: Proxy) -> set[str]:
        through.reset()
        assert len(remote(f"s3://{BUCKET}/big", through).shards) == 4
        return signers(through)

    assert read(proxy) == {"testing"}
    before = len(made)  # 0 when an earlier test of this process made the client already
    assert read(proxy) == {"testing"} and len(made) == before  # reused
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "other-key")
    assert read(proxy) == {"other-key"} and len(made) == before + 1
    # Credentials from a file, changed between two scans (another login, another profile).
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    credentials = tmp_path / "credentials"
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(credentials))
    for key_id in ("from-file", "from-file-rewritten"):
        credentials.write_text(
            f"[default]\naws_access_key_id = {key_id}\naws_secret_access_key = s\n"
        )
        assert read(proxy) == {key_id}
    assert len(made) == before + 3
    # Another endpoint: a client of its own; the first endpoint hears nothing of it.
    with Proxy(endpoint) as other:
        proxy.reset()
        assert read(other) == {"from-file-rewritten"} and proxy.requests == 0
    assert len(made) == before + 4 and made[-1] == other.url
    # The first credentials again: their client is still there.
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", os.devnull)
    assert read(proxy) == {"testing"} and len(made) == before + 4
    assert len(set(map(id, sessions))) == len(sessions) >= 4
    assert len({id(s.get_component("data_loader")) for s in sessions}) == 1
    assert sum(Path(p).name == "endpoints" for p in parsed) <= 1, parsed


def test_a_proxy_set_between_scans_gets_a_client_of_its_own(
    big: Path, endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """botocore takes its proxies from the environment when it makes a client: a scan after
    HTTP_PROXY was set (or unset) must not reuse a client made without it (or with it).
    Before, the second scan went straight to the store, past the proxy, and a proxy
    dropped later kept getting the signed requests and object data."""
    with Proxy(endpoint) as forward:  # forwards absolute-form requests: a forward proxy

        def through_proxy() -> int:
            forward.reset()
            assert (
                len(scan(f"s3://{BUCKET}/big", storage_options={"endpoint_url": endpoint}).shards)
                == 4
            )
            return forward.requests

        assert through_proxy() == 0
        monkeypatch.setenv("HTTP_PROXY", forward.url)
        assert through_proxy() > 0
        monkeypatch.delenv("HTTP_PROXY")
        monkeypatch.setenv("http_proxy", forward.url)
        monkeypatch.setenv("no_proxy", "127.0.0.1")
        assert through_proxy() == 0
        monkeypatch.delenv("no_proxy")
        assert through_proxy() > 0
        monkeypatch.delenv("http_proxy")
        assert through_proxy() == 0


def test_a_gcs_key_file_rewritten_between_scans_gets_a_file_system_of_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """gcsfs reads a key file given as its `token` option once, when the file system is
    made: the file rewritten since (another service account) must not reuse it. Before,
    only the path was in the key."""
    from collections import OrderedDict

    from inspector._internal.storage import remote as remote_storage
    from inspector._internal.storage.remote import RemoteOptions, _reused

    monkeypatch.setattr(remote_storage, "_FILE_SYSTEMS", OrderedDict())  # stand-ins only

    key_file = tmp_path / "key.json"
    key_file.write_text('{"client_email": "first@example.iam"}')
    first = _reused("gcs", {"token": str(key_file)}, RemoteOptions(), object)
    assert _reused("gcs", {"token": str(key_file)}, RemoteOptions(), object) is first
    key_file.write_text('{"client_email": "second-account@example.iam"}')
    assert _reused("gcs", {"token": str(key_file)}, RemoteOptions(), object) is not first


def test_a_forked_process_scans_what_its_parent_scanned(
    tmp_path: Path, range_server: RangeHTTPServer
) -> None:
    """A child forked after a remote scan (a multiprocessing worker on Linux) makes file
    systems of its own: fsspec refuses the parent's in another process, and another thread
    of the parent may hold the lock of the reused ones at the fork (held here). Before, its
    scan of the same URL with the same options ended in "RuntimeError: This class is not
    fork-safe"."""
    import signal

    from inspector._internal.storage import remote as remote_storage

    folder = tmp_path / "ckpt"
    folder.mkdir()
    save_file({"w": np.zeros(4, np.float32)}, str(folder / "model.safetensors"))
    with range_server.serving(folder.parent) as server:
        url = f"{server.url}/{folder.name}/"
        expected = len(scan(url).shards)
        read, write = os.pipe()
        with remote_storage._FILE_SYSTEMS_LOCK:
            pid = os.fork()
            if pid == 0:  # the child: its answer on the pipe, then out without clean-up
                os.close(read)
                signal.alarm(60)  # a bound, should it hang
                try:
                    answer = str(len(scan(url).shards))
                except BaseException as exc:
                    answer = f"{type(exc).__name__}: {exc}"
                os.write(write, answer.encode()[:4000])
                os._exit(0)
        os.close(write)
        with os.fdopen(read, "rb") as pipe:
            answer = pipe.read().decode()
        os.waitpid(pid, 0)
        assert answer == str(expected)
        assert len(scan(url).shards) == expected  # the parent's own still serves it


# -- errors: retried, or one clear line ---------------------------------------------------------


def test_throttling_and_5xx_are_retried(big: Path, endpoint: str) -> None:
    hits: dict[str, int] = {}

    def flaky(method: str, path: str, n: int) -> tuple[int, bytes] | None:
        path = path.split("?", 1)[0]  # a presigned read's query string apart
        if ".safetensors" not in path:
            return None
        hits[path] = hits.get(path, 0) + 1
        if hits[path] == 1:
            return 503, s3_error(503, "SlowDown", "Please reduce your request rate.")
        if hits[path] == 2:
            return 500, s3_error(500, "InternalError", "We encountered an internal error.")
        return None

    with Proxy(endpoint, fault=flaky) as failing:
        scanned = scan(f"s3://{BUCKET}/big", storage_options={"endpoint_url": failing.url})
    assert [s.readable for s in scanned.shards] == [True] * 4
    # Every shard and the index failed twice, each failure retried by us (not by botocore).
    assert len(hits) == 5 and scanned.storage is not None
    assert scanned.storage.stats.retries == 2 * len(hits)


def refuse_all(status: int, code: str) -> object:
    return lambda method, path, n: (status, s3_error(status, code, "no"))


def cli_error(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    return err


def test_access_denied_is_one_line(endpoint: str, capsys: pytest.CaptureFixture[str]) -> None:
    with Proxy(endpoint, fault=refuse_all(403, "AccessDenied")) as denying:
        line = cli_error(
            ["scan", f"s3://{BUCKET}/big", "--storage-option", f"endpoint_url={denying.url}"],
            capsys,
        )
    assert f"s3://{BUCKET}/big: access denied (HTTP 403)" in line and "AWS_PROFILE" in line


def test_missing_prefix_is_one_line(proxy: Proxy, capsys: pytest.CaptureFixture[str]) -> None:
    line = cli_error(
        ["check", f"s3://{BUCKET}/nothing-here", "--storage-option", f"endpoint_url={proxy.url}"],
        capsys,
    )
    assert "no such object or prefix" in line


def test_no_credentials_is_one_line(
    proxy: Proxy, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    line = cli_error(
        ["scan", f"s3://{BUCKET}/big", "--storage-option", f"endpoint_url={proxy.url}"], capsys
    )
    assert "no credentials found" in line and "anon=true" in line


@pytest.mark.parametrize("broken", ["profile", "config file"])
def test_an_unusable_aws_configuration_is_one_line(
    broken: str,
    proxy: Proxy,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A profile botocore does not know, or a config file it cannot parse, is named in one
    line. Before: the shared data loader's session asked for its data path when the file
    system was made, and the error ended the command as an internal error ("please report
    this"); before that, an "input/output error" that sent the user to the disk."""
    args = ["scan", f"s3://{BUCKET}/big", "--storage-option", f"endpoint_url={proxy.url}"]
    if broken == "profile":
        args += ["--storage-option", "profile=no-such-profile"]
        expected = "no-such-profile"
    else:
        config = tmp_path / "config"
        config.write_text("[default\nregion = us-east-1\n")
        monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
        expected = str(config)
    line = cli_error(args, capsys)
    assert "cannot use the AWS configuration" in line and expected in line, line


def test_retries_exhausted_is_one_line(endpoint: str, capsys: pytest.CaptureFixture[str]) -> None:
    from inspector._internal.storage import RemoteOptions
    from inspector._internal.storage.remote import open_remote

    with Proxy(endpoint, fault=refuse_all(503, "SlowDown")) as throttling:
        options = RemoteOptions(
            storage_options={"endpoint_url": throttling.url}, retries=2, retry_wait=0.01
        )
        with pytest.raises(RemoteAccessError, match="HTTP 503 after 3 attempts"):
            open_remote(f"s3://{BUCKET}/big", options)


def test_endpoint_from_aws_endpoint_url(big: Path, proxy: Proxy, monkeypatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
    scanned = scan(f"s3://{BUCKET}/big")
    assert len(scanned.shards) == 4


def test_a_weight_map_cannot_send_reads_outside_the_prefix(
    big: Path, s3_store: S3Store, proxy: Proxy
) -> None:
    doc = json.loads((big / INDEX).read_text())
    doc["weight_map"]["stolen"] = "../big-secret/model.safetensors"
    s3_store.put(BUCKET, f"evil/{INDEX}", json.dumps(doc).encode())
    s3_store.put(BUCKET, "big-secret/model.safetensors", b"secret")
    proxy.reset()
    scanned = remote(f"s3://{BUCKET}/evil", proxy)
    assert "index-unsafe-path" in [f.code for f in scanned.read_findings]
    assert all("big-secret" not in p for p in proxy.paths)


# -- HTTP(S) ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["healthy-hf-sharded", "modelopt-1422-sidecar-drift", "healthy-torch-dist"]
)
def test_http_with_range_requests(
    name: str, checkpoints: dict[str, Path], range_server: RangeHTTPServer
) -> None:
    local_folder = checkpoints[f"demo/{name}"]
    with range_server.serving(local_folder.parent) as server:
        there = scan(f"{server.url}/{name}/")
        served = server.content_bytes
    local = scan(local_folder)
    assert comparable(there, check(there, model=False)) == comparable(
        local, check(local, model=False)
    )
    files = sum(p.stat().st_size for p in local_folder.rglob("*") if p.is_file())
    assert 0 < served < files


def test_http_single_file(checkpoints: dict[str, Path], range_server: RangeHTTPServer) -> None:
    folder = checkpoints["demo/healthy-safetensors-single"]
    with range_server.serving(folder) as server:
        there = scan(f"{server.url}/model.safetensors")
    assert there.layout == "safetensors-single" and there.shards[0].readable


# -- consolidate and repair from a remote source ---------------------------------------------


def test_consolidate_from_s3_equals_local_and_resumes(
    checkpoints: dict[str, Path], proxy: Proxy, tmp_path: Path
) -> None:
    name = "demo/healthy-dcp-sharded"
    local = plan_consolidation(scan(checkpoints[name]), tmp_path / "local")
    local.execute(progress=False)
    there = plan_consolidation(remote(f"s3://{BUCKET}/{name}", proxy), tmp_path / "remote")
    result = there.execute(progress=False, verify_data=True, workers=2)
    assert result.ok and result.data_checked > 0
    for path in sorted((tmp_path / "local").iterdir()):
        assert (tmp_path / "remote" / path.name).read_bytes() == path.read_bytes(), path.name
    assert result.metadata_files  # copied from .hf_metadata/: compared on resume below
    proxy.reset()
    source = remote(f"s3://{BUCKET}/{name}", proxy)
    scanned = proxy.body_bytes
    again = plan_consolidation(source, tmp_path / "remote")
    resumed = again.execute(progress=False, resume=True, verify=False)
    assert resumed.written == () and len(resumed.skipped) == len(result.written)
    # Past the scan, resuming fetched at most the metadata files it compares with DEST's
    # copies: no chunk of the finished outputs.
    copied = sum((tmp_path / "remote" / n).stat().st_size for n in result.metadata_files)
    assert proxy.body_bytes - scanned <= copied


def test_consolidate_from_s3_refuses_a_foreign_dest(
    checkpoints: dict[str, Path], proxy: Proxy, tmp_path: Path
) -> None:
    """DEST's rule holds for a remote source: a file this plan does not write stops the run
    before a byte is fetched; --overwrite moves it to the backup folder first."""
    name = "demo/healthy-dcp-sharded"
    dest = tmp_path / "out"
    dest.mkdir()
    plan = plan_consolidation(remote(f"s3://{BUCKET}/{name}", proxy), dest)
    (dest / plan.outputs[0].name).write_bytes(b"someone else's file")
    proxy.reset()
    with pytest.raises(PlanRefusedError, match="DEST is not empty"):
        plan.execute(progress=False, verify=False)
    assert not [p for p in plain(proxy.paths) if p.endswith(".safetensors")]
    result = plan.execute(progress=False, verify=True, overwrite=True)
    assert result.ok and result.replaced == (plan.outputs[0].name,)
    assert result.backup is not None
    assert (result.backup / plan.outputs[0].name).read_bytes() == b"someone else's file"


def test_consolidate_from_s3_column_sharded_bf16(
    checkpoints: dict[str, Path], proxy: Proxy, tmp_path: Path
) -> None:
    """The golden torch DCP fixture (column-sharded chunks) cast on the way: assembled from
    ranged reads, the same bytes as from the local copy."""
    name = "fixture/automodel/healthy"
    local = plan_consolidation(scan(checkpoints[name]), tmp_path / "local", dtype="bf16")
    local.execute(progress=False, verify=False)
    there = plan_consolidation(
        remote(f"s3://{BUCKET}/{name}", proxy), tmp_path / "remote", dtype="bf16"
    )
    there.execute(progress=False, verify=False)
    for path in sorted((tmp_path / "local").iterdir()):
        assert (tmp_path / "remote" / path.name).read_bytes() == path.read_bytes(), path.name


def test_repair_of_a_remote_checkpoint_writes_locally(
    checkpoints: dict[str, Path], proxy: Proxy, tmp_path: Path
) -> None:
    name = "demo/modelopt-1422-sidecar-drift"
    there = remote(f"s3://{BUCKET}/{name}", proxy)
    with pytest.raises(PlanRefusedError, match="--output-dir"):
        plan_repair(there)
    plan = plan_repair(there, output_dir=tmp_path / "repaired")
    assert not plan.empty and "written to" in plan.describe()
    result = plan.execute()
    assert result.remaining is None
    copy = tmp_path / "copy"
    shutil.copytree(checkpoints[name], copy)
    plan_repair(scan(copy)).execute(backup=False)
    for written in result.written:
        assert (tmp_path / "repaired" / written).read_text() == (copy / written).read_text()


def test_cli_commands_take_urls(
    checkpoints: dict[str, Path], proxy: Proxy, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    option = ["--storage-option", f"endpoint_url={proxy.url}", "--max-concurrency", "4"]
    url = f"s3://{BUCKET}/demo/modelopt-1422-sidecar-drift"
    assert main(["check", url, "--json", "--no-model", *option]) == 1
    result = json.loads(capsys.readouterr().out)
    assert result["path"] == url and result["counts"]["error"] > 0
    local = str(checkpoints["demo/modelopt-1422-sidecar-drift"])
    assert main(["diff", local, url, *option]) == 0
    assert main(["scan", url, *option]) == 0
    capsys.readouterr()
    fixed = tmp_path / "fixed"
    assert main(["repair", url, "--yes", "--output-dir", str(fixed), *option]) == 0
    assert "re-check: skipped" in capsys.readouterr().out and any(fixed.iterdir())
    dcp = f"s3://{BUCKET}/demo/healthy-dcp-sharded"
    out = tmp_path / "consolidated"
    assert main(["consolidate", dcp, str(out), "--no-progress", *option]) == 0
    assert main(["consolidate", dcp, str(out), "--no-progress", "--resume", *option]) == 0
    assert "resumed: 4 complete files kept" in capsys.readouterr().out


def test_progress_bar_when_asked(
    big: Path, proxy: Proxy, capsys: pytest.CaptureFixture[str]
) -> None:
    remote(f"s3://{BUCKET}/big", proxy, progress=True)
    assert "headers" in capsys.readouterr().err


def test_unsupported_scheme_is_refused() -> None:
    with pytest.raises(CannotInspectError, match="unsupported URL scheme"):
        scan("ftp://example.invalid/ckpt")


@pytest.mark.usefixtures("dashboards_closed")
def test_dashboard_takes_a_url_and_refreshes_it(
    checkpoints: dict[str, Path], range_server: RangeHTTPServer
) -> None:
    pytest.importorskip("ipywidgets")
    from inspector.widgets.dashboard import Dashboard

    name = "modelopt-1422-sidecar-drift"
    with range_server.serving(checkpoints[f"demo/{name}"].parent) as server:
        dash = Dashboard(f"{server.url}/{name}/")
        assert str(dash.path) == f"{server.url}/{name}" and dash.state.findings
        before = server.requests
        dash.refresh()  # lists and reads again through the same storage
        assert server.requests > before and dash.state.findings
    consolidate = dash.select("Consolidate")
    assert not consolidate.dest.value.startswith("http")  # a local destination


def test_header_cap_holds_remotely(big: Path, proxy: Proxy) -> None:
    """A header longer than the cap is refused from its length alone, as locally: its
    shard costs one read-ahead and never the second read its length would ask for."""
    shards = sorted(big.glob("*.safetensors"))
    long_header = shards[-1]
    ahead = 16 << 10  # shorter than the long header: reading it would take a second GET
    cap = header_len(long_header) - 100
    proxy.reset()
    scanned = remote(f"s3://{BUCKET}/big", proxy, header_cap=cap, read_ahead=ahead)
    served = proxy.body_bytes
    local = scan(big, header_cap=cap)
    assert comparable(scanned, scanned.read_findings) == comparable(local, local.read_findings)
    refused = [f.file for f in scanned.read_findings if f.code == "header-unreadable"]
    assert refused == [long_header.name]
    gets = [p for p in plain(proxy.paths) if p.endswith(long_header.name)]
    assert gets == [f"GET /{BUCKET}/big/{long_header.name}"]
    # The short headers whole (with what their read-ahead took past them), one read-ahead of
    # the long one, the index; the listing's XML is the rest.
    fetched = sum(max(header_len(p), ahead) for p in shards[:-1]) + ahead
    assert served <= fetched + (big / INDEX).stat().st_size + 16_000


@pytest.mark.parametrize("workers", [1, 2])
def test_consolidate_from_s3_keeps_requests_and_memory_bounded(
    checkpoints: dict[str, Path],
    endpoint: str,
    tmp_path: Path,
    workers: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Chunks are fetched in blocks, at most --max-concurrency at once over all the files
    being written: memory holds at most that many blocks. Blocks of 4 KiB here, so the
    demo's tensors take many."""
    from inspector._internal.plans.consolidate import engine

    monkeypatch.setattr(engine, "_REMOTE_BLOCK", 4096)
    name = "demo/healthy-dcp-sharded"
    local = plan_consolidation(scan(checkpoints[name]), tmp_path / "local")
    local.execute(progress=False, verify=False)
    with Proxy(endpoint, delay=0.01) as slow:
        source = scan(
            f"s3://{BUCKET}/{name}", storage_options={"endpoint_url": slow.url}, max_concurrency=2
        )
        plan = plan_consolidation(source, tmp_path / "remote")
        slow.reset()
        plan.execute(progress=False, verify=False, workers=workers)
        peak, requests = slow.peak, slow.requests
    assert peak == 2 and requests > 2 * len(plan.outputs)
    for path in sorted((tmp_path / "local").iterdir()):
        assert (tmp_path / "remote" / path.name).read_bytes() == path.read_bytes(), path.name


# -- object data through presigned URLs ---------------------------------------------------------

VALUE_COLUMNS = ["name", "elements", "min", "max", "mean", "std", "nan", "zero_frac", "all_zero"]


def signed(paths: list[str]) -> list[str]:
    return [p for p in paths if "Signature=" in p]


def test_s3_object_data_is_read_through_presigned_urls(
    checkpoints: dict[str, Path], endpoint: str
) -> None:
    """Ranged reads of object data are plain GETs of presigned URLs (botocore's per-request
    work is the cost of many small reads); the values are the local copy's."""
    name = "fixture/transformers/mixtral"
    expected = value_table(scan(checkpoints[name]), "full")[VALUE_COLUMNS]
    with Proxy(endpoint) as proxy:
        there = remote(f"s3://{BUCKET}/{name}", proxy)
        proxy.reset()
        table = value_table(there, "full")
        reads = list(proxy.paths)
    assert table[VALUE_COLUMNS].equals(expected)
    assert reads and signed(reads) == [p for p in reads if p.startswith("GET ")]


def test_s3_presigned_reads_refused_fall_back_to_get_object(
    checkpoints: dict[str, Path], endpoint: str
) -> None:
    """A store that refuses the presigned URLs (an expired signature, another region): the
    read is made again with GetObject, whose answer stands, and GetObject reads everything
    from then on."""
    name = "fixture/transformers/mixtral"
    expected = value_table(scan(checkpoints[name]), "sample")[VALUE_COLUMNS]

    def refuse_signed(method: str, path: str, n: int) -> tuple[int, bytes] | None:
        if "Signature=" in path:
            return 403, s3_error(403, "AccessDenied", "Request has expired")
        return None

    with Proxy(endpoint, fault=refuse_signed) as proxy:
        there = remote(f"s3://{BUCKET}/{name}", proxy)
        scan_signed = len(signed(proxy.paths))
        proxy.reset()
        table = value_table(there, "sample")
        later = signed(proxy.paths)
    assert table[VALUE_COLUMNS].equals(expected)
    assert 1 <= scan_signed <= 32 and later == []  # refused once (per request in flight)


# -- hostile S3 answers (the HTTP and Hub cases: tests/test_remote_hostile.py) ---------------

# For the tests that wait for a stall to end: a connection silent for 0.25 s is retried and
# the request ends at 1 s (healthy requests to the local servers take milliseconds).
FAST_ARGS = ["--timeout", "1", "--read-timeout", "0.25"]


def on_shards(answer: Callable[[str], Answer]) -> Callable[[str, str, int], Answer | None]:
    """A fault rule answering every GET of a shard of s3://ckpts/big with `answer(path)`."""

    def rule(method: str, path: str, n: int) -> Answer | None:
        path = path.split("?", 1)[0]  # a presigned read's query string apart
        if method == "GET" and path.startswith(f"/{BUCKET}/big/") and path.endswith(".safetensors"):
            return answer(path)
        return None

    return rule


def test_s3_range_ignored_costs_only_the_asked_prefix(big: Path, endpoint: str) -> None:
    """GetObject with a Range answered 200 with the whole object, then again without end:
    the read-ahead from byte 0 is taken from it and nothing more; the long header's second
    read (from further in) is refused by name."""

    def whole(path: str) -> Answer:
        body = (big / path.rsplit("/", 1)[1]).read_bytes()
        head = {"ETag": '"0"', "Content-Type": "binary/octet-stream"}
        return Answer(200, head, body, forever=True)

    with Proxy(endpoint, fault=on_shards(whole)) as hostile:
        start = time.monotonic()
        scanned = scan(
            f"s3://{BUCKET}/big",
            storage_options={"endpoint_url": hostile.url},
            read_ahead=16 << 10,
            # Not FAST: three healthy shards are read through the proxy too, and on a busy
            # machine they alone can take 3 s; the bound that matters is `took` below.
            timeout=10.0,
            read_timeout=3.0,
        )
        took = time.monotonic() - start
    assert took < 15
    assert [s.readable for s in scanned.shards] == [True, True, True, False]
    refused = [f for f in scanned.read_findings if f.file == scanned.shards[-1].file]
    assert refused[0].code == "header-unreadable" and "ignores Range" in refused[0].message


def test_s3_redirect_to_another_origin_is_refused(big: Path, endpoint: str) -> None:
    """aiohttp would follow a 307 to another host by itself (aiobotocore does not stop it):
    the guarded session refuses it, naming both origins, and the other host gets nothing."""
    with Proxy(endpoint) as other:
        away = on_shards(lambda path: Answer(307, {"Location": other.url + path}))
        with Proxy(endpoint, fault=away) as hostile:
            scanned = scan(f"s3://{BUCKET}/big", storage_options={"endpoint_url": hostile.url})
        assert other.requests == 0
    unsafe = [f for f in scanned.read_findings if f.code == "file-unsafe"]
    assert len(unsafe) == 4
    assert f"({origin(hostile.url)} -> {origin(other.url)})" in unsafe[0].message


def test_s3_stalled_body_is_one_line(
    big: Path, endpoint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    stall = on_shards(lambda path: Answer(200, {"ETag": '"0"'}, b"", length=1 << 20, stall=True))
    with Proxy(endpoint, fault=stall) as hostile:
        start = time.monotonic()
        option = f"endpoint_url={hostile.url}"
        line = cli_error(
            ["scan", f"s3://{BUCKET}/big", "--storage-option", option, *FAST_ARGS], capsys
        )
        took = time.monotonic() - start
    assert took < 10
    assert "(--read-timeout)" in line or "(--timeout" in line


def listing_page(n: int, *, keys: int) -> bytes:
    rows = "".join(
        f"<Contents><Key>big/p{n}-{i}.json</Key><Size>2</Size></Contents>" for i in range(keys)
    )
    return (
        '<?xml version="1.0" encoding="UTF-8"?><ListBucketResult '
        'xmlns="http://s3.amazonaws.com/doc/2006-03-01/">'
        f"<Name>{BUCKET}</Name><Prefix>big/</Prefix><KeyCount>{keys}</KeyCount>"
        f"<MaxKeys>1000</MaxKeys><IsTruncated>true</IsTruncated>"
        f"<NextContinuationToken>t{n}</NextContinuationToken>{rows}</ListBucketResult>"
    ).encode()


# The entry cap is 20,000 here, not its 200,000: S3's listing counts its entries against it
# all the same, in 20 pages of botocore's XML parsing instead of 200 (20 ms of CPU each).
# The cap at its real value is tested on the Hub (tests/test_remote_hostile.py). The page
# cap is 100, not its 1,000, for the same reason (each empty page is a request and a parse:
# 1.7 s of CPU for 1,000).
@pytest.mark.parametrize(
    ("answer", "expected", "caps"),
    [
        (
            lambda n: Answer(200, body=listing_page(n, keys=1000)),
            "goes on past 20,000 entries",
            {"MAX_LISTING": 20_000},
        ),
        (
            lambda n: Answer(200, body=listing_page(n, keys=0)),
            "goes on past 100 pages",
            {"MAX_PAGES": 100},
        ),
        (
            lambda n: Answer(200, body=b"<?xml", length=100_000_000, stall=True),
            "over the 16,777,216-byte limit",
            {},
        ),
    ],
    ids=["entries", "pages", "one-huge-page"],
)
def test_s3_endless_listing_is_one_line(
    endpoint: str,
    bucket: str,
    answer,
    expected: str,
    caps: dict[str, int],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from inspector._internal.storage import guard

    assert (guard.MAX_LISTING, guard.MAX_PAGES) == (200_000, 1_000)
    for name, cap in caps.items():
        monkeypatch.setattr(guard, name, cap)

    def rule(method: str, path: str, n: int) -> Answer | None:
        return answer(n) if "list-type=2" in path else None

    with Proxy(endpoint, fault=rule) as hostile:
        start = time.monotonic()
        option = f"endpoint_url={hostile.url}"
        line = cli_error(
            ["scan", f"s3://{BUCKET}/big", "--storage-option", option, "--read-timeout", "1"],
            capsys,
        )
        took = time.monotonic() - start
    assert expected in line and "cannot be listed" in line and took < 60
