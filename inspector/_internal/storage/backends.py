"""The three things a remote storage asks of a store, one class per store: list a folder,
describe one entry, read a byte range. Each is a coroutine on the file system's event loop
(fsspec's), and each goes through the guard of `inspector/_internal/storage/guard.py`.

Listing and reading are ours rather than the stores' so that every answer is bounded and
checked; the classes: docs/architecture.md, "storage/".
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import re
from typing import Any, Protocol
from urllib.parse import quote, urljoin, urlsplit

from inspector._internal.storage.guard import (
    RemoteAnswerError,
    answer_length,
    check_listing_size,
    take,
)

__all__ = ["Backend", "GcsBackend", "HttpBackend", "HubBackend", "S3Backend"]

# Links of an HTML index page (what servers' directory listings are).
_HREF = re.compile(r"""href\s*=\s*["']([^"'<>\s]+)["']""", re.IGNORECASE)
_PAGE = 1000
_SHA = re.compile(r"[0-9a-f]{40}")
_SHA256 = re.compile(r"[0-9a-f]{64}")


class Backend(Protocol):
    """A store, as the remote storage uses it."""

    loop: asyncio.AbstractEventLoop

    async def listdir(self, key: str) -> list[dict[str, Any]]:
        """Records of the entries directly in folder `key`; FileNotFoundError if absent."""
        ...

    async def info(self, key: str) -> dict[str, Any]:
        """The record of entry `key`; FileNotFoundError if absent."""
        ...

    async def read(self, key: str, start: int, end: int) -> bytes:
        """Bytes [start, end) of file `key` (fewer only at its end)."""
        ...

    def invalidate(self) -> None:
        """Forget what the store's client remembers (listings)."""
        ...


def _raise_for_status(response: Any, url: str) -> None:
    """An error answer as the OSError a local read would give; a redirect that reached us
    (not followed: no location, or not allowed) as an answer we refuse."""
    status = response.status
    if status < 300:
        return
    if status == 404:
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), url)
    if status in (401, 403):
        raise PermissionError(errno.EACCES, f"access denied (HTTP {status})", url)
    if status < 400:
        raise RemoteAnswerError(f"answered with a redirect (HTTP {status}) that is not followed")
    response.raise_for_status()


def _record(name: str, size: Any, *, directory: bool = False) -> dict[str, Any]:
    if directory:
        return {"name": name, "size": 0, "type": "directory"}
    return {"name": name, "size": int(size) if str(size).isdigit() else None, "type": "file"}


# -- HTTP ---------------------------------------------------------------------------------------


class HttpBackend:
    """Plain HTTP(S) servers: a folder is its index page, a file's size comes from HEAD."""

    def __init__(self, fs: Any) -> None:
        self._fs = fs
        self.loop = fs.loop

    def _kwargs(self, extra_headers: dict[str, str] | None = None) -> dict[str, Any]:
        kw = dict(self._fs.kwargs)
        kw["headers"] = {**(kw.get("headers") or {}), **(extra_headers or {})}
        return kw

    async def listdir(self, key: str) -> list[dict[str, Any]]:
        # Not fsspec's `_ls`: its link pattern backtracks (an index page of "<a " and 2,000
        # spaces took 21 CPU-s), it keeps links with a query (?C=M) and counts no entries.
        folder = key.rstrip("/") + "/"
        session = await self._fs.set_session()
        async with session.get(self._fs.encode_url(folder), **self._kwargs()) as response:
            _raise_for_status(response, folder)
            text = (await response.read()).decode("utf-8", "replace")
        out: dict[str, dict[str, Any]] = {}
        for found in _HREF.finditer(text):
            link = urljoin(folder, found.group(1)).split("#", 1)[0].split("?", 1)[0]
            child = link[len(folder) :] if link.startswith(folder) else ""
            if not child or "/" in child.rstrip("/") or link in out:
                continue  # the folder itself, a parent, another folder or host: not ours
            out[link] = _record(link.rstrip("/"), None, directory=link.endswith("/"))
            check_listing_size(len(out), folder)
        return list(out.values())

    async def info(self, key: str) -> dict[str, Any]:
        # Not fsspec's `_info`: any failure of its GET (a refused redirect, a 403, a
        # timeout) comes out as FileNotFoundError, so a refusal would read as "absent".
        session = await self._fs.set_session()
        status = 0
        # HEAD; for a server that does not allow it, the first byte.
        for method, extra in (("HEAD", {}), ("GET", {"Range": "bytes=0-0"})):
            request = session.request(
                method, self._fs.encode_url(key), allow_redirects=True, **self._kwargs(extra)
            )
            async with request as response:
                status = response.status
                if method == "HEAD" and status >= 400 and status not in (401, 403, 404):
                    continue
                _raise_for_status(response, key)
                return _record(key, _size_of(response))
        raise OSError(errno.EIO, f"HTTP {status}", key)

    async def read(self, key: str, start: int, end: int) -> bytes:
        session = await self._fs.set_session()
        ranged = self._kwargs({"Range": f"bytes={start}-{end - 1}"})
        async with session.get(self._fs.encode_url(key), **ranged) as response:
            _raise_for_status(response, key)
            data: bytes = await response.read()
            return data

    def invalidate(self) -> None:
        self._fs.invalidate_cache()


def _size_of(response: Any) -> int | None:
    """A file's size from an answer's headers: Content-Range's total, or Content-Length of a
    whole, unencoded answer."""
    total = (response.headers.get("Content-Range") or "").rpartition("/")[2]
    if response.status == 206:
        return int(total) if total.isdigit() else None
    length = response.headers.get("Content-Length") or ""
    encoded = response.headers.get("Content-Encoding", "identity") not in ("identity", "")
    return int(length) if length.isdigit() and not encoded else None


# -- S3 and GCS ---------------------------------------------------------------------------------


class _Bucket:
    """A bucket store through its fsspec file system: our paginated listing (bounded), the
    file system's own metadata request."""

    scheme = ""

    def __init__(self, fs: Any) -> None:
        self._fs = fs
        self.loop = fs.loop

    async def _page(
        self, bucket: str, prefix: str, token: str | None
    ) -> tuple[list[tuple[str, Any]], list[str], str | None]:
        """One page of the folder `prefix`: (files as (key, size), sub-folder prefixes,
        the token of the next page or None)."""
        raise NotImplementedError

    async def listdir(self, key: str) -> list[dict[str, Any]]:
        # Not s3fs' `_lsdir` or gcsfs' `_list_objects`: both follow next-page tokens for as
        # long as the store sends them (pages with no entries and a new token never end).
        bucket, path, _ = self._fs.split_path(key)
        prefix = path.rstrip("/") + "/" if path else ""
        out: list[dict[str, Any]] = []
        token: str | None = None
        pages = 0
        while True:
            files, folders, token = await self._page(bucket, prefix, token)
            out += [_record(f"{bucket}/{name}", size) for name, size in files]
            out += [_record(f"{bucket}/{p.rstrip('/')}", 0, directory=True) for p in folders]
            pages += 1
            check_listing_size(len(out), f"{self.scheme}://{bucket}/{prefix}", pages=pages)
            if not token:
                break
        if not out:
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), key)
        return out

    async def info(self, key: str) -> dict[str, Any]:
        return dict(await self._fs._info(key))

    def invalidate(self) -> None:
        self._fs.invalidate_cache()


class S3Backend(_Bucket):
    """S3 and S3-compatible stores through s3fs (credentials, regions, endpoints are its);
    a ranged `GetObject` whose streamed body is read no further than the range.

    Ranged reads of object data go, where they can, as plain ranged GETs of a presigned URL
    (signed once per object every few minutes by the same client, with the same
    credentials) through `direct`, a guarded aiohttp session: botocore's per-request work
    (signing, event hooks, parsing) costs milliseconds of CPU, more than a round trip's
    share when many small windows are read at once. An answer that is not the range asked
    for (an expired URL, another region, a refusal) is read again through `GetObject`,
    whose answer stands, and a store that needs that once is read through it from then on.
    """

    scheme = "s3"

    def __init__(self, fs: Any, direct: tuple[Any, Any] | None = None) -> None:
        super().__init__(fs)
        # The fsspec HTTP file system with the guarded session and the TLS verification
        # (an `ssl` argument of aiohttp), or None: every read through GetObject.
        self._direct = direct
        self._signed: dict[str, tuple[float, str]] = {}

    async def _page(
        self, bucket: str, prefix: str, token: str | None
    ) -> tuple[list[tuple[str, Any]], list[str], str | None]:
        more = {"ContinuationToken": token} if token else {}
        page = await self._fs._call_s3(
            "list_objects_v2", Bucket=bucket, Prefix=prefix, Delimiter="/", MaxKeys=_PAGE, **more
        )
        files = [(str(i.get("Key", "")), i.get("Size")) for i in page.get("Contents") or ()]
        folders = [str(i.get("Prefix", "")) for i in page.get("CommonPrefixes") or ()]
        following = page.get("NextContinuationToken") if page.get("IsTruncated") else None
        return files, folders, following

    async def read(self, key: str, start: int, end: int) -> bytes:
        # Not s3fs' `_cat_file`: it reads the streamed body whole (`Body.read()`: a body
        # that goes on past the range goes on in memory), inside its own retry loop.
        if self._direct is not None:
            data = await self._read_direct(key, start, end)
            if data is not None:
                return data
        bucket, path, version = self._fs.split_path(key)
        answer = await self._fs._call_s3(
            "get_object",
            Bucket=bucket,
            Key=path,
            Range=f"bytes={start}-{end - 1}",
            **({"VersionId": version} if version else {}),
        )
        body = answer["Body"]
        try:
            status = int((answer.get("ResponseMetadata") or {}).get("HTTPStatusCode") or 0)
            want = answer_length(status, answer.get("ContentRange"), start, end - 1)
            return await take(body.read, want)
        finally:
            body.close()

    async def _read_direct(self, key: str, start: int, end: int) -> bytes | None:
        """The range through the presigned URL, or None when `GetObject` must answer."""
        assert self._direct is not None
        direct, tls = self._direct
        url = await self._presigned(key)
        session = await direct.set_session()
        headers = {"Range": f"bytes={start}-{end - 1}"}
        extra = {} if tls is None else {"ssl": tls}
        try:
            async with session.get(
                url, headers=headers, allow_redirects=False, **extra
            ) as response:
                status = response.status
                if status == 206:
                    data: bytes = await response.read()  # bounded: the range (guard.py)
                    return data
        except RemoteAnswerError:
            raise
        except Exception as exc:  # no message may carry the URL: it holds a signature
            raise _DirectError(f"{type(exc).__name__} while reading a byte range") from exc
        self._signed.pop(key, None)
        if status >= 500 or status in (408, 429):  # passing: retried with backoff
            raise _DirectError(f"HTTP {status}", status)
        # Not the range (an expired URL, another region, a refusal, a server ignoring
        # Range): GetObject answers, from now on.
        self._direct = None
        return None

    async def _presigned(self, key: str) -> str:
        now = asyncio.get_running_loop().time()
        found = self._signed.get(key)
        if found is not None and now - found[0] < _RESIGN_AFTER:
            return found[1]
        bucket, path, version = self._fs.split_path(key)
        client = await self._fs.set_session()
        params = {"Bucket": bucket, "Key": path, **({"VersionId": version} if version else {})}
        url = str(
            await client.generate_presigned_url("get_object", Params=params, ExpiresIn=_SIGNED_FOR)
        )
        self._signed[key] = (now, url)
        return url


# A presigned URL is valid for `_SIGNED_FOR` seconds and signed again after `_RESIGN_AFTER`
# (credentials that refresh are picked up then).
_SIGNED_FOR = 3600
_RESIGN_AFTER = 300.0


class _DirectError(OSError):
    """A failed direct read, its message without the request's URL (which holds a
    signature); the original error is its cause, and `status` the HTTP status where there
    is one (retries judge by them)."""

    def __init__(self, reason: str, status: int | None = None) -> None:
        super().__init__(errno.EIO, reason)
        self.status = status


class GcsBackend(_Bucket):
    """Google Cloud Storage through gcsfs (its credentials); its reads go through its
    session, which is built with our guard."""

    scheme = "gs"

    async def _page(
        self, bucket: str, prefix: str, token: str | None
    ) -> tuple[list[tuple[str, Any]], list[str], str | None]:
        page = await self._fs._call(
            "GET",
            "b/{}/o",
            bucket,
            json_out=True,
            prefix=prefix or None,
            delimiter="/",
            maxResults=_PAGE,
            pageToken=token,
        )
        files = [(str(i.get("name", "")), i.get("size")) for i in page.get("items") or ()]
        return files, [str(p) for p in page.get("prefixes") or ()], page.get("nextPageToken")

    async def read(self, key: str, start: int, end: int) -> bytes:
        data: bytes = await self._fs._cat_file(key, start=start, end=end)
        return data


# -- the Hugging Face Hub ----------------------------------------------------------------------


class HubBackend:
    """One Hub repository at one commit. Keys are `prefix/path` where `prefix` is the
    repository's path as `hf://` URLs write it (`[datasets/]org/name@sha`). Requests go
    through `fs`, an fsspec HTTP file system whose session carries our guard.

    Not huggingface_hub's `HfFileSystem`: its requests (httpx) go outside that session with
    their own retries, and its paging follows a next-page link to any host, token included."""

    def __init__(
        self, fs: Any, *, endpoint: str, repo_type: str, repo_id: str, headers: dict[str, str]
    ) -> None:
        self._fs = fs
        self.loop = fs.loop
        self.endpoint = endpoint.rstrip("/")
        self.repo_type = repo_type
        self.repo_id = repo_id
        self.prefix = ""
        self.sha = ""
        self._headers = headers

    def _api(self, what: str, revision: str, path: str = "") -> str:
        tail = "/" + quote(path, safe="") if path else ""
        return (
            f"{self.endpoint}/api/{self.repo_type}s/{self.repo_id}/{what}/"
            f"{quote(revision, safe='')}{tail}"
        )

    async def _json(self, url: str) -> tuple[Any, str | None]:
        """(the JSON answer, the URL of its next page from the Link header)."""
        session = await self._fs.set_session()
        async with session.get(url, headers=self._headers) as response:
            _hub_status(response, url)
            data = await response.read()
            link = response.links.get("next", {}).get("url")
        try:
            return json.loads(data), str(link) if link else None
        except ValueError:
            raise RemoteAnswerError("the Hub's answer is not JSON", url) from None

    async def revision(self, revision: str | None) -> str:
        """The commit sha `revision` (None: the default branch) names now."""
        url = self._api("revision", revision or "main") + "?expand=sha"
        value, _ = await self._json(url)
        sha = value.get("sha") if isinstance(value, dict) else None
        if not isinstance(sha, str) or not _SHA.fullmatch(sha):
            raise RemoteAnswerError("the Hub's answer names no commit sha", url)
        return sha

    def pin(self, sha: str, prefix: str) -> None:
        """Read at commit `sha`; keys start with `prefix`."""
        self.sha, self.prefix = sha, prefix.rstrip("/")

    def _path(self, key: str) -> str:
        key = key.rstrip("/")
        if key == self.prefix:
            return ""
        if not key.startswith(self.prefix + "/"):
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), key)
        return key[len(self.prefix) + 1 :]

    async def listdir(self, key: str) -> list[dict[str, Any]]:
        url: str | None = self._api("tree", self.sha, self._path(key))
        out: list[dict[str, Any]] = []
        pages = 0
        while url is not None:
            page, next_url = await self._json(url)
            pages += 1
            for item in page if isinstance(page, list) else ():
                if not isinstance(item, dict) or not isinstance(item.get("path"), str):
                    continue
                name = f"{self.prefix}/{item['path']}"
                record = _record(name, item.get("size"), directory=item.get("type") != "file")
                out.append(record | _hub_checksums(item) if record["type"] == "file" else record)
            check_listing_size(len(out), url, pages=pages)
            if next_url is not None and urlsplit(next_url).netloc != urlsplit(url).netloc:
                raise RemoteAnswerError(
                    f"the listing's next page is on another host ({next_url})", url
                )
            url = next_url
        return out

    async def info(self, key: str) -> dict[str, Any]:
        path = self._path(key)
        if not path:
            return {"name": self.prefix, "size": 0, "type": "directory"}
        parent = f"{self.prefix}/{path.rpartition('/')[0]}".rstrip("/")
        for record in await self.listdir(parent):
            if record["name"] == f"{self.prefix}/{path}":
                return record
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), key)

    async def read(self, key: str, start: int, end: int) -> bytes:
        kind = "" if self.repo_type == "model" else f"{self.repo_type}s/"
        url = f"{self.endpoint}/{kind}{self.repo_id}/resolve/{self.sha}/{quote(self._path(key))}"
        session = await self._fs.set_session()
        headers = {**self._headers, "Range": f"bytes={start}-{end - 1}"}
        async with session.get(url, headers=headers) as response:
            _hub_status(response, url)
            data: bytes = await response.read()
            return data

    def invalidate(self) -> None:
        pass  # nothing is remembered between listings


def _hub_checksums(item: dict[str, Any]) -> dict[str, str]:
    """The checksums a Hub tree entry records, as huggingface_hub's `RepoFile` reads them:
    `lfs.oid` is the SHA-256 of an LFS or Xet file's content, `oid` the git blob SHA-1 of a
    file kept in git. Anything not of that form is left out (never trusted as a checksum)."""
    out: dict[str, str] = {}
    lfs = item.get("lfs")
    if lfs is not None:
        # An LFS or Xet file: its `oid` is the git SHA-1 of the pointer file, not of the
        # content, so a malformed `lfs.oid` leaves the file with no checksum at all.
        sha = lfs.get("oid") if isinstance(lfs, dict) else None
        if isinstance(sha, str) and _SHA256.fullmatch(sha):
            out["sha256"] = sha
    elif isinstance(item.get("oid"), str) and _SHA.fullmatch(item["oid"]):
        out["blob_sha1"] = item["oid"]
    return out


def _hub_status(response: Any, url: str) -> None:
    """The Hub's error answers, by its `X-Error-Code` header where it gives one."""
    code = response.headers.get("X-Error-Code", "")
    if response.status in (401, 403, 404) and code in ("RepoNotFound", "GatedRepo"):
        raise PermissionError(errno.EACCES, f"{code} (HTTP {response.status})", url)
    if response.status == 404 or code in ("RevisionNotFound", "EntryNotFound"):
        raise FileNotFoundError(errno.ENOENT, f"{code or 'not found'} (HTTP 404)", url)
    _raise_for_status(response, url)
