"""Which targets are remote, and what a remote URL names, parsed once (`parse_remote`) into
the `RemoteTarget` the storage opens. Pure (no network, no fsspec).

Supported: `s3://bucket/prefix` (also `s3a://`), `gs://bucket/prefix` (also `gcs://`),
`hf://[models/|datasets/|spaces/]org/repo[@revision][/path]`, `http(s)://host/path`, and
local paths (also `file://`). An `hf://` revision is a branch, a tag or a commit sha; a
revision containing `/` is written percent-encoded (`@feature%2Fx`), except the Hub's own
`refs/pr/N` and `refs/convert/NAME`, which may be written as they are.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import quote, unquote

__all__ = [
    "REMOTE_SCHEMES",
    "HfLocation",
    "RemoteTarget",
    "is_remote",
    "parse_hf_url",
    "parse_remote",
    "scheme_of",
]

# scheme -> fsspec protocol
REMOTE_SCHEMES = {
    "s3": "s3",
    "s3a": "s3",
    "gs": "gcs",
    "gcs": "gcs",
    "hf": "hf",
    "http": "http",
    "https": "http",
}
_SCHEME = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*)://")
_REPO_TYPES = {"models": "model", "datasets": "dataset", "spaces": "space"}
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_SPECIAL_REF = re.compile(r"refs/(?:pr/\d+|convert/\w+)")
_SHA = re.compile(r"[0-9a-f]{40}")


def scheme_of(target: str) -> str | None:
    """The URL scheme of `target` in lower case, or None for a plain path."""
    found = _SCHEME.match(target)
    return found.group(1).lower() if found else None


def is_remote(target: object) -> bool:
    """True for a URL this package reads through fsspec (not `file://`)."""
    return isinstance(target, str) and scheme_of(target) in REMOTE_SCHEMES


@dataclass(frozen=True, slots=True)
class HfLocation:
    """A folder (or file) in a Hugging Face Hub repository."""

    repo_type: str  # "model", "dataset" or "space"
    repo_id: str  # "org/name"
    revision: str | None  # None: the default branch
    path: str  # inside the repository, "" for its root

    @property
    def is_commit(self) -> bool:
        """A full commit sha: already pinned, nothing to resolve."""
        return self.revision is not None and _SHA.fullmatch(self.revision) is not None

    def fs_path(self, revision: str | None = None) -> str:
        """The path `huggingface_hub.HfFileSystem` reads, at `revision` (default: this one).
        Revisions are percent-encoded there, so one with `/` stays one path segment."""
        rev = revision if revision is not None else self.revision
        prefix = "" if self.repo_type == "model" else f"{self.repo_type}s/"
        at = f"@{quote(rev, safe='')}" if rev else ""
        return f"{prefix}{self.repo_id}{at}" + (f"/{self.path}" if self.path else "")

    def url(self, revision: str | None = None) -> str:
        """The `hf://` URL of this location (at `revision`, default this one)."""
        return f"hf://{self.fs_path(revision)}"


def parse_hf_url(url: str) -> HfLocation:
    """Split `hf://[type/]org/repo[@rev][/path]`. ValueError says what was expected."""
    if scheme_of(url) != "hf":
        raise ValueError(f"{url}: expected an hf:// URL")
    rest = url[len("hf://") :].strip("/")
    expected = (
        "expected hf://[datasets/|spaces/]ORG/REPO[@REVISION][/PATH], "
        "e.g. hf://deepseek-ai/DeepSeek-V3@main"
    )
    parts = rest.split("/")
    repo_type = "model"
    if parts and parts[0] in _REPO_TYPES:
        repo_type = _REPO_TYPES[parts.pop(0)]
    if len(parts) < 2:
        raise ValueError(f"{url}: no ORG/REPO; {expected}")
    org, name_rev = parts[0], parts[1]
    tail = parts[2:]
    name, at, rev = name_rev.partition("@")
    revision: str | None = None
    if at:
        # refs/pr/N and refs/convert/NAME may be written unencoded: they span segments.
        joined = "/".join([rev, *tail])
        special = _SPECIAL_REF.match(joined)
        if special and (len(joined) == special.end() or joined[special.end()] == "/"):
            revision = special.group(0)
            tail = [p for p in joined[special.end() :].split("/") if p]
        else:
            revision = unquote(rev)
        if not revision:
            raise ValueError(f"{url}: empty revision after '@'; {expected}")
    if not _NAME.fullmatch(org) or not _NAME.fullmatch(name):
        raise ValueError(f"{url}: {org}/{name} is not a repository id; {expected}")
    path = "/".join(unquote(p) for p in tail if p)
    if any(p in (".", "..") for p in path.split("/")):
        raise ValueError(f"{url}: the path inside the repository may not contain '.' or '..'")
    return HfLocation(repo_type, f"{org}/{name}", revision, path)


@dataclass(frozen=True, slots=True)
class RemoteTarget:
    """A remote URL parsed once for a whole scan: the fsspec protocol of its store and, for
    `hf://`, the repository, revision and path it names."""

    url: str  # as given
    protocol: str  # "s3", "gcs", "hf" or "http"
    hub: HfLocation | None  # for hf:// only

    @property
    def shown(self) -> str:
        """The URL as messages and `RemoteURL` show it: no trailing '/'."""
        return self.url.rstrip("/")


def parse_remote(url: str) -> RemoteTarget:
    """`url` as a `RemoteTarget`. ValueError says what was expected."""
    protocol = REMOTE_SCHEMES.get(scheme_of(url) or "")
    if protocol is None:
        raise ValueError(f"{url}: not a remote URL (expected s3://, gs://, hf://, https://)")
    return RemoteTarget(url, protocol, parse_hf_url(url) if protocol == "hf" else None)
