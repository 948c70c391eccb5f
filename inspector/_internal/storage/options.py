"""How remote checkpoints are read (`RemoteOptions`), apart from the reading itself: every scan
makes one, and a local scan must not import `remote.py` (asyncio, ssl and the thread pools)
to make it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from inspector._internal.common.defaults import (
    DEFAULT_CONCURRENCY,
    DEFAULT_READ_AHEAD,
    DEFAULT_READ_TIMEOUT,
    DEFAULT_TIMEOUT,
    MIN_READ_AHEAD,
)
from inspector._internal.storage.guard import RedirectPolicy, origin

__all__ = ["RETRY_WAIT", "RemoteOptions"]

# The first wait before a retry, in seconds; each retry doubles it, times a random factor
# in [0.5, 1.5). Read when a `RemoteOptions` is made, so that tests can shorten it.
RETRY_WAIT = 0.2


@dataclass(frozen=True, slots=True, kw_only=True)
class RemoteOptions:
    """How remote checkpoints are read. `storage_options` go to the fsspec file system as
    they are (`endpoint_url`, `anon`, `profile`, `token`...)."""

    storage_options: Mapping[str, Any] = field(default_factory=dict)
    max_concurrency: int = DEFAULT_CONCURRENCY
    read_ahead: int = DEFAULT_READ_AHEAD
    retries: int = 5
    retry_wait: float = field(default_factory=lambda: RETRY_WAIT)  # see RETRY_WAIT
    # None: a bar on a terminal or in a notebook once a run takes over a second.
    progress: bool | None = None
    # Seconds one operation may take, retries included (a listing, a ranged read of at
    # most 8 MiB); seconds a read may bring no byte before its attempt ends.
    timeout: float = DEFAULT_TIMEOUT
    read_timeout: float = DEFAULT_READ_TIMEOUT
    # Origins (`https://host[:port]`) redirects may go to besides the one a request went to.
    allow_redirects: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.max_concurrency < 1:
            raise ValueError(f"max_concurrency is {self.max_concurrency}; expected 1 or more")
        if self.read_ahead < MIN_READ_AHEAD:
            raise ValueError(
                f"read_ahead is {self.read_ahead} bytes; expected at least {MIN_READ_AHEAD}"
            )
        for name in ("timeout", "read_timeout"):
            value = getattr(self, name)
            if not value > 0:
                raise ValueError(f"{name} is {value} seconds; expected more than 0")
        allowed = tuple(sorted({origin(o) for o in self.allow_redirects}))
        object.__setattr__(self, "allow_redirects", allowed)

    def policy(self, *, hub: bool = False) -> RedirectPolicy:
        """Where redirects may go (`hub`: also Hugging Face's file hosts, see guard.py)."""
        return RedirectPolicy(frozenset(self.allow_redirects), hub=hub)
