"""Run one function over untrusted input in a child process that the OS bounds.

Why: on a DCP `.metadata` of 100 MB+ a pure-Python audit costs several times the C
unpickler, so the unpickle runs at C speed in a forked child whose CPU time and address
space the kernel limits; a bomb kills the child, never this process. Linux only; elsewhere
`run_bounded` raises `SandboxUnavailable`. Figures and mechanism: docs/architecture.md,
"formats/"; the bounds: SECURITY.md, 2.
"""

from __future__ import annotations

import contextlib
import faulthandler
import math
import os
import pickle
import select
import signal
import sys
import time
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from inspector._internal.formats.pickles.allowed import not_in_reply, reply_classes
from inspector._internal.formats.pickles.unpickler import RestrictedUnpickler
from inspector.errors import InspectorError

try:
    import resource
except ImportError:  # not on Windows: no sandbox there, the audited path is taken
    resource = None  # type: ignore[assignment]

__all__ = [
    "DEFAULT_SANDBOX",
    "SandboxFailed",
    "SandboxLimits",
    "SandboxUnavailable",
    "run_bounded",
    "sandbox_available",
]

T = TypeVar("T")
# Signals a crash or a limit raises in the child (those this platform has).
_FATAL = tuple(
    getattr(signal, name)
    for name in ("SIGSEGV", "SIGBUS", "SIGABRT", "SIGFPE", "SIGILL", "SIGXCPU")
    if hasattr(signal, name)
)


@dataclass(frozen=True, slots=True)
class SandboxLimits:
    """What the child may spend on an input of `size` bytes, and from which size a caller
    uses the child at all.

    Measured on DCP `.metadata` (torch's writer, 25k-100k tensors): unpickling and
    converting costs about 30 ns of CPU and 13 bytes of address space per input byte. The
    defaults allow ten and five times that on top of a floor, so a real file never meets
    them while a 250-byte bomb is stopped after `cpu_floor` seconds or `memory_floor` bytes.
    Below `min_size` the in-process audit is cheaper than a fork."""

    cpu_floor: float = 5.0  # seconds
    cpu_per_byte: float = 300e-9
    memory_floor: int = 1 << 30  # bytes of address space above the parent's at the fork
    memory_per_byte: int = 64
    reply_floor: int = 64 << 20  # the pickled result may be this plus the input's size
    min_size: int = 1 << 20

    def cpu_seconds(self, size: int) -> int:
        return math.ceil(self.cpu_floor + self.cpu_per_byte * size)

    def memory(self, size: int) -> int:
        return self.memory_floor + self.memory_per_byte * size

    def reply_cap(self, size: int) -> int:
        return self.reply_floor + size

    def deadline(self, size: int) -> float:
        """Wall-clock seconds before the child is killed: a child stuck without using CPU
        (stopped, or deadlocked on a lock another thread held at the fork) is not bounded
        by RLIMIT_CPU. Generous, so a loaded machine does not kill a healthy read."""
        return 4.0 * self.cpu_seconds(size) + 30.0


DEFAULT_SANDBOX = SandboxLimits()


class SandboxUnavailable(InspectorError):
    """No bounded child on this platform (not Linux, no fork, no /proc)."""


class SandboxFailed(InspectorError):
    """The child gave no result: killed by a limit, crashed, or raised. `reason` says which;
    callers then take their in-process path, which says precisely what was refused."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


def sandbox_available() -> bool:
    """True where `run_bounded` can bound a child (Linux with fork and /proc)."""
    return (
        sys.platform == "linux"
        and resource is not None
        and hasattr(os, "fork")
        and _address_space() is not None
    )


def run_bounded(
    fn: Callable[[], T],
    *,
    size: int,
    classes: Iterable[type] = (),
    limits: SandboxLimits = DEFAULT_SANDBOX,
) -> T:
    """`fn()` computed in a forked child bounded for an input of `size` bytes; its result
    is shipped back pickled and read here resolving only `classes` (plus the containers
    and scalars pickle builds without a name). Raises `SandboxFailed` when the child gives
    no result and `SandboxUnavailable` where there is no sandbox."""
    start_space = _address_space() if sandbox_available() else None
    if start_space is None:
        raise SandboxUnavailable("no bounded child process on this platform")
    allowed = reply_classes(classes)
    read_fd, write_fd = os.pipe()
    with warnings.catch_warnings():
        # Python 3.12+ warns when a process with threads forks: the child here takes no lock
        # another thread could hold (no import, no print, no logging; the GIL and malloc are
        # reset at fork), and a child stuck anyway is killed at the deadline.
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # the child: never returns
        _child(fn, write_fd, read_fd, start_space + limits.memory(size), limits.cpu_seconds(size))
    os.close(write_fd)
    status: int | None = None
    try:
        blob = _read_reply(read_fd, limits.reply_cap(size), limits.deadline(size))
        status = _wait(pid)
    finally:
        os.close(read_fd)
        if status is None:  # a deadline, a reply too large, or an interrupt: end the child
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            _wait(pid)
    if status != 0 or not blob:
        raise SandboxFailed(_describe(status, limits, size))
    try:
        return cast(T, RestrictedUnpickler(blob, allowed, refusal=not_in_reply).load())
    except Exception as exc:  # our own child wrote it: a name outside `classes`, a bug
        raise SandboxFailed(f"gave an answer that could not be read ({exc})") from None


def _child(fn: Callable[[], Any], write_fd: int, read_fd: int, space: int, cpu: int) -> None:
    """Set the limits, compute, write the pickled result, exit without cleanup (no atexit,
    no flush of buffers the parent owns)."""
    code = 1
    try:
        os.close(read_fd)
        # A crash or a limit ends the child the default way: no traceback dump
        # (faulthandler) and no handler a fuzzer installed may write reports for it.
        faulthandler.disable()
        for sig in _FATAL:
            signal.signal(sig, signal.SIG_DFL)
        # Hard limits too, so nothing in the child can raise them again. RLIMIT_CPU's soft
        # limit sends SIGXCPU, the hard one a second later SIGKILL; no core files.
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
        resource.setrlimit(resource.RLIMIT_AS, _capped(resource.RLIMIT_AS, space))
        resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))  # it writes no file (a pipe is not)
        blob = pickle.dumps(fn(), protocol=pickle.HIGHEST_PROTOCOL)
        view = memoryview(blob)
        while view:
            view = view[os.write(write_fd, view) :]
        code = 0
    except BaseException:  # any failure: the parent finds out why by itself
        code = 1
    finally:
        os._exit(code)


def _capped(which: int, wanted: int) -> tuple[int, int]:
    _soft, hard = resource.getrlimit(which)
    value = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    return value, value


def _address_space() -> int | None:
    """This process's address space in bytes (the child starts from it), or None."""
    try:
        with open("/proc/self/statm", "rb") as fh:
            return int(fh.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def _read_reply(fd: int, cap: int, deadline: float) -> bytes:
    """Everything the child writes until it closes the pipe: at most `cap` bytes, within
    `deadline` seconds. (Unpickling while the child writes overlapped nothing measurable on
    2 busy cores and needed a file object of its own: the reply is read whole.)"""
    parts: list[bytes] = []
    got = 0
    end = time.monotonic() + deadline
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    while True:
        left = end - time.monotonic()
        if left <= 0:
            raise SandboxFailed(f"gave no answer within {deadline:.0f} s")
        if not poller.poll(min(left, 60.0) * 1000):
            continue
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            return b"".join(parts)
        got += len(chunk)
        if got > cap:
            raise SandboxFailed(f"answered more than {cap:,} bytes")
        parts.append(chunk)


def _wait(pid: int) -> int:
    """The child's wait status, once it is gone (EINTR is retried by Python); -1 when
    something else in this process (a SIGCHLD handler) reaped it first: then its answer
    is not trusted and the caller takes its own path."""
    try:
        return os.waitpid(pid, 0)[1]
    except ChildProcessError:
        return -1


def _describe(status: int, limits: SandboxLimits, size: int) -> str:
    if status == 0:
        return "gave an empty answer"
    if status == -1:
        return "was reaped by someone else; its answer is not used"
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig == signal.SIGXCPU:
            return f"used more than {limits.cpu_seconds(size)} s of CPU"
        if sig == signal.SIGKILL:
            return f"was killed (over {limits.cpu_seconds(size)} s of CPU, or no memory left)"
        return f"crashed (signal {sig}: a C stack overflow, or memory exhausted)"
    return "stopped with an error (a refusal, a malformed stream, or its memory limit)"
