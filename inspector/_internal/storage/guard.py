"""What a remote server's answers may do to us: the rules every remote request goes through,
whatever the store (S3, GCS, the Hub, plain HTTP). `inspector/_internal/storage/remote.py` builds
its sessions and reads on them; SECURITY.md lists what they promise.

One guard on the session, not checks in each store, so that a new store cannot forget one:
bodies capped at what was asked, redirects kept on the origin, reads that time out
(docs/architecture.md, "storage/").
"""

from __future__ import annotations

import errno
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any
from urllib.parse import urljoin, urlsplit

from inspector._internal.common.display import legible

if TYPE_CHECKING:  # a local scan imports this module, and no asyncio
    import asyncio

__all__ = [
    "ANSWER_CAP",
    "ERROR_CAP",
    "MAX_LISTING",
    "MAX_PAGES",
    "RedirectPolicy",
    "RedirectRefused",
    "RemoteAnswerError",
    "answer_length",
    "bounded_body",
    "check_listing_size",
    "guarded_client",
    "guarded_session_kwargs",
    "on_hub",
    "origin",
    "quoted",
    "s3_http_session_class",
    "socket_timeout",
    "take",
]

# The largest answer that is not file data: a listing page (an S3 page of 1,000 keys is
# about 300 kB, an HTML index of 100,000 files about 10 MB), a JSON API answer.
ANSWER_CAP = 16 << 20
# What is kept of an error page: enough for the store's error code and message.
ERROR_CAP = 64 << 10
# The most entries one folder listing may have (a checkpoint folder holds hundreds to a few
# thousand files; DCP runs of 10,000 ranks hold tens of thousands), and the most pages it
# may come in (stores send up to 1,000 entries a page).
MAX_LISTING = 200_000
MAX_PAGES = 1_000
_CHUNK = 1 << 20
_DEFAULT_PORTS = {"http": 80, "https": 443}
# Hugging Face's own domains: the Hub (huggingface.co, hf.co) and the hosts its file
# downloads are redirected to (cdn-lfs*.hf.co, cas-bridge.xethub.hf.co, ...).
_HUB_DOMAINS = ("huggingface.co", "hf.co")
_RANGE = re.compile(r"bytes=(\d+)-(\d+)$")
_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)$")


class RemoteAnswerError(OSError):
    """An answer we refuse (errno EPROTO): the reason says what the server did and what was
    asked. Reading a file, it is a finding about that file; listing, one line."""

    def __init__(self, reason: str, url: str | None = None) -> None:
        super().__init__(errno.EPROTO, reason, url)


def quoted(text: str) -> str:
    """Text a server chose (a location, a parser's complaint quoting its bytes), as a message
    may quote it: through the one display function, at most `QUOTE_LIMIT` characters."""
    return legible(text, limit=QUOTE_LIMIT)


# Server text in a message is cut shorter than a name: it is context, not the subject.
QUOTE_LIMIT = 300


class RedirectRefused(RemoteAnswerError):
    """A redirect to an origin the policy does not allow; nothing was requested there."""

    def __init__(self, source: str, target: str) -> None:
        self.source = quoted(origin(source))
        try:
            self.target = quoted(origin(target))
        except ValueError:
            self.target = quoted(target)
        super().__init__(
            f"is redirected by the server to another origin ({self.source} -> {self.target}); "
            f"only redirects within {self.source} are followed (--allow-redirect "
            f"{self.target} trusts that origin)"
        )


def origin(url: str) -> str:
    """`scheme://host:port` of a URL, lower case, with the scheme's default port written
    out: two URLs are on the same origin exactly when these are equal. ValueError for a URL
    without a scheme or a host."""
    parts = urlsplit(url.strip())
    scheme = parts.scheme.lower()
    try:
        port = parts.port
    except ValueError:
        raise ValueError(f"{url!r}: not a URL with a valid port") from None
    if not scheme or not parts.hostname:
        raise ValueError(f"{url!r}: expected an origin such as https://host or http://host:8000")
    return f"{scheme}://{parts.hostname.lower()}:{port or _DEFAULT_PORTS.get(scheme, 0)}"


def on_hub(url: str) -> bool:
    """An https URL on one of Hugging Face's own domains (the Hub and its file hosts)."""
    parts = urlsplit(url)
    host = (parts.hostname or "").lower()
    return parts.scheme == "https" and any(
        host == d or host.endswith("." + d) for d in _HUB_DOMAINS
    )


@dataclass(frozen=True, slots=True)
class RedirectPolicy:
    """Which redirects are followed: within one origin always; to `allowed` origins (given
    as `origin()` strings); and with `hub`, from a Hugging Face domain to another https host
    of Hugging Face's own domains (the Hub sends file downloads to its CDN hosts). `hub` is
    set only for `hf://` reads from the Hub itself, never for a mirror or another endpoint."""

    allowed: frozenset[str] = frozenset()
    hub: bool = False

    def refuses(self, source: str, target: str) -> bool:
        try:
            wanted = origin(target)
        except ValueError:
            return True
        if wanted == origin(source) or wanted in self.allowed:
            return False
        return not (self.hub and on_hub(source) and on_hub(target))


# -- bodies -----------------------------------------------------------------------------------


def _asked(headers: Mapping[str, str]) -> tuple[int, int] | None:
    """(first, last) byte of a request's `Range: bytes=first-last`, or None."""
    found = _RANGE.match((headers.get("Range") or "").strip())
    return (int(found.group(1)), int(found.group(2))) if found else None


def answer_length(status: int, content_range: str | None, first: int, last: int) -> int:
    """How many bytes of an answer to `Range: bytes=first-last` are the ones asked: raises
    `RemoteAnswerError` for an answer that is not them (a 200 to a range further than byte 0,
    a 206 for other bytes, another status)."""
    asked = f"bytes {first:,}-{last:,}"
    if status == 206:
        found = _CONTENT_RANGE.match((content_range or "").strip())
        if found is not None and int(found.group(1)) != first:
            raise RemoteAnswerError(
                f"answered {asked} with bytes {int(found.group(1)):,}-{int(found.group(2)):,} "
                "(Content-Range)"
            )
        if found is not None:
            return min(last, int(found.group(2))) - first + 1
        return last - first + 1
    if status == 200 and first == 0:
        return last + 1  # the whole file: its first bytes are the ones asked
    if status == 200:
        raise RemoteAnswerError(
            f"answered a request for {asked} with the whole file (HTTP 200): the server "
            "ignores Range requests, which reading only what is needed relies on; serve the "
            "files with a server that supports them"
        )
    raise RemoteAnswerError(f"answered a request for {asked} with HTTP {status}")


async def take(read: Callable[[int], Awaitable[bytes]], limit: int) -> bytes:
    """At most `limit` bytes from a stream read `read(n)` (up to n bytes, b"" at the end)."""
    parts: list[bytes] = []
    got = 0
    while got < limit:
        chunk = await read(min(limit - got, _CHUNK))
        if not chunk:
            break
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)


def _over_cap(length: int | None) -> RemoteAnswerError:
    """An answer past `ANSWER_CAP`: announced as `length` bytes, or going on past it."""
    limit = f"the {ANSWER_CAP:,}-byte limit for a listing or an API answer"
    what = f"is {length:,} bytes, over {limit}" if length is not None else f"goes on past {limit}"
    return RemoteAnswerError(f"the server's answer {what} (an endless or hostile answer)")


async def bounded_body(response: Any) -> bytes:
    """The body of an aiohttp `ClientResponse`, capped by the rules of this module: the
    range asked for, `ANSWER_CAP` for other answers, `ERROR_CAP` for errors. A body left
    unread is dropped with its connection, so nothing more is received."""
    asked = _asked(response.request_info.headers)
    status = response.status
    try:
        if status >= 300:
            limit = ERROR_CAP
        elif asked is not None:
            limit = answer_length(status, response.headers.get("Content-Range"), *asked)
        else:
            declared = response.headers.get("Content-Length", "")
            if declared.isdigit() and int(declared) > ANSWER_CAP:
                raise _over_cap(int(declared))
            limit = ANSWER_CAP + 1
        body = await take(response.content.read, limit)
        if asked is None and status < 300 and len(body) > ANSWER_CAP:
            raise _over_cap(None)
    except BaseException:
        response.close()
        raise
    if response.content.at_eof():
        response.release()
    else:
        response.close()  # the rest is never read: the connection goes with it
    return body


def check_listing_size(count: int, url: str, *, pages: int = 1) -> None:
    """A listing past `MAX_LISTING` entries or `MAX_PAGES` pages is refused (an endless
    listing)."""
    if count > MAX_LISTING or pages > MAX_PAGES:
        what = f"{MAX_LISTING:,} entries" if count > MAX_LISTING else f"{MAX_PAGES:,} pages"
        raise RemoteAnswerError(
            f"the listing goes on past {what} (an endless or hostile listing, or not a "
            "checkpoint folder); name the checkpoint folder itself",
            url,
        )


# -- aiohttp sessions ----------------------------------------------------------------------------


@cache
def _response_class() -> type:
    """aiohttp's `ClientResponse` whose `read()` (and so `text()`/`json()`) is
    `bounded_body`: every body a library reads through our sessions is capped."""
    import aiohttp

    class BoundedResponse(aiohttp.ClientResponse):
        async def read(self) -> bytes:
            if self._body is None:
                self._body = await bounded_body(self)
            return self._body

    return BoundedResponse


def _redirect_guard(policy: RedirectPolicy) -> Any:
    """An aiohttp `TraceConfig` that stops a redirect the policy refuses before it is
    followed (aiohttp follows redirects by itself; this is the hook it offers)."""
    import aiohttp

    async def on_redirect(session: Any, context: Any, params: Any) -> None:
        response = params.response
        source = str(response.url)
        location = response.headers.get("Location") or response.headers.get("URI")
        if location is None:
            return
        target = urljoin(source, location)
        if policy.refuses(source, target):
            response.close()
            raise RedirectRefused(source, target)

    trace = aiohttp.TraceConfig()
    trace.on_request_redirect.append(on_redirect)
    return trace


def guarded_session_kwargs(
    user: Mapping[str, Any],
    *,
    policy: RedirectPolicy,
    read_timeout: float,
    loop: asyncio.AbstractEventLoop | None = None,
) -> dict[str, Any]:
    """Keyword arguments of `aiohttp.ClientSession` with our guard added to the user's own
    (`client_kwargs`/`session_kwargs` storage options): bounded bodies, the redirect policy,
    the read timeout (unless the user set a timeout), identity encoding (byte ranges are
    ranges of the file, and no compressed body expands in memory) and no cookies kept
    (unless the user gave a jar): a session is reused by later scans in the process
    (`remote._reused`), which may send another token (the Hub's is a header of each
    request), so nothing a server sets may ride along with them. `loop`: the loop the
    session will run on, when this is called outside it."""
    import aiohttp

    out = dict(user)
    out.setdefault("cookie_jar", aiohttp.DummyCookieJar(loop=loop))
    out.setdefault("timeout", socket_timeout(read_timeout))
    out["response_class"] = _response_class()
    out["trace_configs"] = [*(out.get("trace_configs") or ()), _redirect_guard(policy)]
    headers = dict(out.get("headers") or {})
    headers.setdefault("Accept-Encoding", "identity")
    out["headers"] = headers
    return out


def guarded_client(policy: RedirectPolicy, read_timeout: float) -> Callable[..., Awaitable[Any]]:
    """A `get_client` for fsspec's HTTP file system: its aiohttp session, with our guard."""

    async def get_client(**kwargs: Any) -> Any:
        import aiohttp

        kwargs.pop("loop", None)  # the session is made on the running loop
        return aiohttp.ClientSession(
            **guarded_session_kwargs(kwargs, policy=policy, read_timeout=read_timeout)
        )

    return get_client


def socket_timeout(read_timeout: float) -> Any:
    """No connection made and no byte read for `read_timeout` seconds ends an attempt; no
    overall limit here (the storage's deadline is)."""
    import aiohttp

    return aiohttp.ClientTimeout(total=None, sock_connect=read_timeout, sock_read=read_timeout)


@cache
def s3_http_session_class() -> type:
    """aiobotocore's HTTP session (`AioConfig(http_session_cls=...)`) with the same guard:
    aiohttp follows no redirect (botocore's synchronous client follows none either; its own
    region redirects still apply), a redirect to another origin is refused by name, and
    bodies botocore reads whole (listing pages, errors) are capped. Object data is read by
    the storage in bounded chunks."""
    from aiobotocore.httpsession import AIOHTTPSession

    class GuardedAIOHTTPSession(AIOHTTPSession):
        async def _get_session(self, proxy_url: Any) -> Any:
            return _NoRedirects(await super()._get_session(proxy_url))

    return GuardedAIOHTTPSession


class _NoRedirects:
    """An aiohttp session as aiobotocore uses it (`await session.request(...)`), answering
    3xx itself instead of following it, and with bounded `read()`s."""

    def __init__(self, session: Any) -> None:
        self._session = session

    async def request(self, method: str, url: Any, **kwargs: Any) -> Any:
        kwargs["allow_redirects"] = False
        response = await self._session.request(method, url, **kwargs)
        location = response.headers.get("Location")
        if 300 <= response.status < 400 and location:
            source = str(response.url)
            target = urljoin(source, location)
            if RedirectPolicy().refuses(source, target):
                response.close()
                raise RedirectRefused(source, target)
        return _BoundedRaw(response)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._session, name)


class _BoundedRaw:
    """An aiohttp response whose `read()` is `bounded_body`; everything else is the
    response's own (streamed object bodies read `.content` in chunks)."""

    def __init__(self, response: Any) -> None:
        self._response = response
        self._read: bytes | None = None

    async def read(self) -> bytes:
        if self._read is None:
            self._read = await bounded_body(self._response)
        return self._read

    def __getattr__(self, name: str) -> Any:
        return getattr(self._response, name)
