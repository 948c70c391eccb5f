"""The storage layer itself: `hf://` URLs and revisions (offline, against a Hub stand-in on
127.0.0.1 that `huggingface_hub` really talks to), the local containment rule, options."""

from __future__ import annotations

import errno
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from remote_servers import FakeHub

from inspector._internal.checks import check
from inspector._internal.cli.main import _parser
from inspector._internal.scan.entry import scan
from inspector._internal.storage import EntryKind, LocalStorage, check_member, is_remote
from inspector._internal.storage.remote import _nested
from inspector._internal.storage.urls import HfLocation, parse_hf_url
from inspector.errors import CannotInspectError, RemoteAccessError, UnsafeFileError

SHA = "0123456789abcdef0123456789abcdef01234567"
PR_SHA = "f" * 40

# -- hf:// URLs ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("hf://org/repo", HfLocation("model", "org/repo", None, "")),
        ("hf://org/repo/", HfLocation("model", "org/repo", None, "")),
        ("hf://org/repo@main/sub/dir", HfLocation("model", "org/repo", "main", "sub/dir")),
        ("hf://models/org/repo@v1.0", HfLocation("model", "org/repo", "v1.0", "")),
        ("hf://datasets/org/data@dev/x", HfLocation("dataset", "org/data", "dev", "x")),
        ("hf://spaces/org/app", HfLocation("space", "org/app", None, "")),
        ("hf://org/repo@refs/pr/12", HfLocation("model", "org/repo", "refs/pr/12", "")),
        ("hf://org/repo@refs/pr/12/ckpt", HfLocation("model", "org/repo", "refs/pr/12", "ckpt")),
        (
            "hf://org/repo@refs%2Fpr%2F12/ckpt",
            HfLocation("model", "org/repo", "refs/pr/12", "ckpt"),
        ),
        (
            "hf://org/repo@refs/convert/parquet",
            HfLocation("model", "org/repo", "refs/convert/parquet", ""),
        ),
        ("hf://org/repo@feature%2Fx/sub", HfLocation("model", "org/repo", "feature/x", "sub")),
        (f"hf://org/repo@{SHA}", HfLocation("model", "org/repo", SHA, "")),
        ("hf://org/repo@refs/heads/main", HfLocation("model", "org/repo", "refs", "heads/main")),
    ],
)
def test_hf_urls(url: str, expected: HfLocation) -> None:
    assert parse_hf_url(url) == expected


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("hf://gpt2", "no ORG/REPO"),
        ("hf://datasets/org", "no ORG/REPO"),
        ("hf://org/repo@", "empty revision"),
        ("hf://org/repo@/x", "empty revision"),
        ("hf://org/../x", "not a repository id"),
        ("hf://org/repo/a/../../b", "'.' or '..'"),
        ("s3://bucket/x", "expected an hf:// URL"),
    ],
)
def test_bad_hf_urls(url: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        parse_hf_url(url)


def test_hf_paths_pin_and_encode_revisions() -> None:
    loc = parse_hf_url("hf://datasets/org/data@refs/pr/3/ckpt")
    assert not loc.is_commit and parse_hf_url(f"hf://org/r@{SHA}").is_commit
    assert loc.fs_path() == "datasets/org/data@refs%2Fpr%2F3/ckpt"
    assert loc.fs_path(SHA) == f"datasets/org/data@{SHA}/ckpt"
    assert loc.url() == "hf://datasets/org/data@refs%2Fpr%2F3/ckpt"
    assert parse_hf_url(loc.url()) == loc


def test_which_targets_are_remote() -> None:
    for url in (
        "s3://b/p",
        "S3A://b/p",
        "gs://b/p",
        "gcs://b",
        "hf://o/r",
        "https://h/x",
        "http://h",
    ):
        assert is_remote(url), url
    for local in ("file:///tmp/x", "/tmp/x", "relative/dir", "C:/x", Path("/tmp")):
        assert not is_remote(local), local


@pytest.fixture(scope="module")
def demos(demo_checkpoints: Path) -> dict[str, Path]:
    """The session's demo checkpoints, served as they are (nothing here changes them)."""
    return {p.name: p for p in demo_checkpoints.iterdir() if p.is_dir()}


def test_hf_scan_pins_the_revision_once(demos: dict[str, Path], hub_server: FakeHub) -> None:
    """`@main` is resolved to its commit once; every read then names the commit, so a branch
    that moves during the scan cannot mix two versions of the checkpoint."""
    folder = demos["modelopt-1422-sidecar-drift"]
    repos = {
        "org/tiny": {"main": (SHA, folder), "refs/pr/1": (PR_SHA, demos["healthy-hf-sharded"])}
    }
    with hub_server.serving(repos) as hub:
        options = {"endpoint": hub.url, "token": False}
        there = scan("hf://org/tiny@main", storage_options=options)
        asked_main = list(hub.asked)
        hub.asked.clear()
        pr = scan("hf://org/tiny@refs/pr/1", storage_options=options)
        asked_pr = list(hub.asked)
        served = hub.content_bytes
    assert asked_main[0] == "main" and set(asked_main[1:]) == {SHA}
    assert asked_pr[0] == "refs/pr/1" and set(asked_pr[1:]) == {PR_SHA}
    local = scan(folder)
    root, local_root = str(there.path), str(local.path)
    assert root == "hf://org/tiny@main" and there.layout == local.layout
    assert [(f.code, f.file, f.message.replace(root, "")) for f in check(there, model=False)] == [
        (f.code, f.file, f.message.replace(local_root, "")) for f in check(local, model=False)
    ]
    assert pr.layout == "hf-sharded" and check(pr, model=False) == []
    everything = sum(
        p.stat().st_size for d in (folder, demos["healthy-hf-sharded"]) for p in d.iterdir()
    )
    assert served < everything


def test_hf_missing_repo_and_revision(demos: dict[str, Path], hub_server: FakeHub) -> None:
    with hub_server.serving({"org/tiny": {"main": (SHA, demos["healthy-hf-sharded"])}}) as hub:
        options = {"endpoint": hub.url, "token": False}
        with pytest.raises(RemoteAccessError, match="not found, or private"):
            scan("hf://org/nothing", storage_options=options)
        with pytest.raises((CannotInspectError, RemoteAccessError), match="not found"):
            scan("hf://org/tiny@no-such-branch", storage_options=options)


def test_an_hf_url_is_parsed_once_per_scan(
    demos: dict[str, Path], hub_server: FakeHub, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The URL becomes one typed value (`urls.RemoteTarget`) when the storage opens it; the
    backend, the pinned revision and the Hub's refusal read that value (before, each parsed
    the URL again: three times for a revision the Hub does not know)."""
    from inspector._internal.storage import urls

    parsed: list[str] = []
    real = urls.parse_hf_url
    monkeypatch.setattr(urls, "parse_hf_url", lambda url: parsed.append(url) or real(url))
    with hub_server.serving({"org/tiny": {"main": (SHA, demos["healthy-hf-sharded"])}}) as hub:
        options = {"endpoint": hub.url, "token": False}
        scan("hf://org/tiny@main", storage_options=options)
        with pytest.raises((CannotInspectError, RemoteAccessError), match="not found"):
            scan("hf://org/tiny@no-such-branch", storage_options=options)
    assert parsed == ["hf://org/tiny@main", "hf://org/tiny@no-such-branch"]


# -- local containment ----------------------------------------------------------------------


@pytest.mark.parametrize("bad", ["/etc/passwd", "../x", "a/../../x", "a\\b", "a\x00b"])
def test_member_paths_stay_under_the_root(bad: str) -> None:
    with pytest.raises(ValueError, match="inside the checkpoint folder"):
        check_member(bad)
    assert check_member("./a//b/") == "a/b"


def test_hf_cache_exception_is_exactly_the_cache_layout(tmp_path: Path) -> None:
    """snapshots/<rev>/ may link into <repo>/blobs/<file> of a `models--` repository only."""
    for repo in ("models--org--x", "not-a-cache-repo"):
        blobs = tmp_path / repo / "blobs"
        blobs.mkdir(parents=True)
        (blobs / "b1").write_text("{}")
        (blobs / "deeper").mkdir()
        (blobs / "deeper" / "b2").write_text("{}")
        snap = tmp_path / repo / "snapshots" / "rev"
        snap.mkdir(parents=True)
        (snap / "a.json").symlink_to(blobs / "b1")
        (snap / "b.json").symlink_to(blobs / "deeper" / "b2")
        (snap / "c.json").symlink_to(tmp_path / repo / "elsewhere.json")
        (tmp_path / repo / "elsewhere.json").write_text("{}")
        storage = LocalStorage(snap)
        kinds = {e.name: e.kind for e in storage.entries()}
        allowed = EntryKind.FILE if repo.startswith("models--") else EntryKind.REFUSED
        assert kinds == {
            "a.json": allowed,
            "b.json": EntryKind.REFUSED,
            "c.json": EntryKind.REFUSED,
        }, repo


def test_a_file_swapped_after_the_check_is_refused(tmp_path: Path, monkeypatch) -> None:
    """The descriptor that was opened is checked again (its inode, and on Linux the path the
    kernel gives for it): a file replaced between the check and the open is refused."""
    (tmp_path / "a.json").write_text("{}")
    (tmp_path / "b.json").write_text("[]")
    storage = LocalStorage(tmp_path)
    real_open = os.open

    def swapped(path, flags, *args, **kwargs):  # the race, made deterministic
        if str(path).endswith("a.json"):
            return real_open(str(tmp_path / "b.json"), flags, *args, **kwargs)
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", swapped)
    with pytest.raises(UnsafeFileError, match="replaced while being opened"):
        storage.open("a.json")


def test_a_link_planted_after_the_check_is_not_followed(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "a.json").write_text("{}")
    storage = LocalStorage(tmp_path)
    real_open = os.open

    def planted(path, flags, *args, **kwargs):
        if str(path).endswith("a.json"):
            os.unlink(path)
            os.symlink("/etc/hostname", path)
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", planted)
    with pytest.raises(UnsafeFileError, match="replaced by a link"):
        storage.open("a.json")


def test_unreadable_entries_are_listed_for_the_reader_to_report(tmp_path: Path) -> None:
    (tmp_path / "loop.safetensors").symlink_to("loop.safetensors")
    os.mkfifo(tmp_path / "pipe.safetensors")
    (tmp_path / "dangling.json").symlink_to(tmp_path / "gone")
    storage = LocalStorage(tmp_path)
    entries = {e.name: e for e in storage.entries()}
    assert "dangling.json" not in entries  # nothing there: absent, not refused
    assert entries["loop.safetensors"].kind is EntryKind.REFUSED
    assert "link loop" in (entries["loop.safetensors"].reason or "")
    assert entries["pipe.safetensors"].reason == "is a FIFO, not a regular file"
    with pytest.raises(FileNotFoundError) as missing:
        storage.open("dangling.json")
    assert missing.value.errno == errno.ENOENT


# -- options -----------------------------------------------------------------------------------


def test_storage_options_from_the_command_line() -> None:
    args = _parser().parse_args(
        [
            "scan",
            "s3://b/p",
            "--storage-option",
            "anon=true",
            "--storage-option",
            "endpoint_url=http://127.0.0.1:9000",
            "--storage-option",
            "client_kwargs.region_name=eu-west-1",
            "--max-concurrency",
            "8",
        ]
    )
    assert args.path == "s3://b/p" and args.max_concurrency == 8
    assert _nested(dict(args.storage_option)) == {
        "anon": True,
        "endpoint_url": "http://127.0.0.1:9000",
        "client_kwargs": {"region_name": "eu-west-1"},
    }
    with pytest.raises(SystemExit):
        _parser().parse_args(["scan", "s3://b/p", "--storage-option", "no-equals-sign"])
