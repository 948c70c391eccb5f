"""The load verdict in a child interpreter, so that the process that asked stays free.

The verdict imports torch and transformers and builds a model, holding the GIL for seconds;
in a notebook kernel that stalled the dashboard's tabs, so a child takes the work to another
core and the kernel only waits on a pipe. Its answer is untrusted input (SECURITY.md, 1b);
the protocol and the figures: docs/architecture.md, "load/".
"""

from __future__ import annotations

import atexit
import contextlib
import os
import selectors
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import orjson

from inspector._internal.checkpoint.scanned import ScannedCheckpoint
from inspector._internal.common.display import legible
from inspector._internal.load.cache import CACHE_ENV, cache_root
from inspector._internal.load.verdict import (
    LOADABLE_LAYOUTS,
    LoadVerdict,
    known_verdict,
    load_verdict,
    prepare_load_check,
    verdict_digest,
)
from inspector._internal.scan.entry import scan
from inspector.errors import InspectorError

__all__ = [
    "VERDICT_SECONDS",
    "NoAnswer",
    "VerdictProcess",
    "read_answer",
    "read_capped_line",
    "start_verdict_for",
    "start_verdict_process",
    "verdict_apart",
]

# How long a verdict may take in the child before it is ended (the 671B DeepSeek-V3 config
# builds in about a second; a million tensors match in seconds).
VERDICT_SECONDS = 600.0
# The largest answer read: a million-tensor NVFP4 checkpoint's verdict lists its ~1M
# quantization tensors, about 70 MB of JSON.
_ANSWER_CAP = 512 << 20
# The child's CPU share against the kernel and the page (nice 5: a quarter of a core's
# share when all three want one).
_NICENESS = 5
# How long `close` lets a child end on SIGTERM before SIGKILL.
_CLOSE_WAIT = 5.0
# Why a request gets no answer when `close` ended the child while it waited.
_CLOSED = "its process was ended before it answered (the check was closed)"


def start_verdict_process() -> None:
    """Start the child now (when it is not running), so that it imports torch and
    transformers before the first request."""
    _CHILD.start()


def start_verdict_for(
    scanned: ScannedCheckpoint, *, trust_remote_code: bool = False, cache: bool = True
) -> None:
    """Start the child now when `verdict_apart(scanned)` will ask it (no verdict known at no
    cost, a local folder of a layout the check runs on), so that it imports torch and
    transformers while this process does other work (the dashboard: its deferred rules)."""
    if (
        _in_child(scanned)
        and known_verdict(scanned, trust_remote_code=trust_remote_code, cache=cache) is None
    ):
        _CHILD.start()


def _in_child(scanned: ScannedCheckpoint) -> bool:
    """Whether `verdict_apart` computes the verdict of `scanned` in the child."""
    local = scanned.local_path is not None
    return local and scanned.layout in LOADABLE_LAYOUTS and sys.platform != "win32"


def verdict_apart(
    scanned: ScannedCheckpoint, *, trust_remote_code: bool = False, cache: bool = True
) -> LoadVerdict:
    """`load_verdict(scanned)`, computed in the child for a local folder of a layout the check
    runs on; in this process otherwise. A verdict known without building the model (a skip
    the files decide, or with `cache` the one kept in the user's cache: `known_verdict`) is
    given at once, and no child is started for it. The child keeps what it computes in the
    same cache (`cache` as in `load_verdict`). A bug in the child is raised here as
    RuntimeError with the child's traceback; a child that crashed or ran out of time gives a
    skipped verdict that says so."""
    known = known_verdict(scanned, trust_remote_code=trust_remote_code, cache=cache)
    if known is not None:
        return known
    folder = scanned.local_path
    if folder is None or not _in_child(scanned):
        return load_verdict(scanned, trust_remote_code=trust_remote_code, cache=cache)
    request = {
        "path": str(folder),
        "layout": str(scanned.layout),
        "trust_remote_code": trust_remote_code,
        # The child keeps its verdict where this process looks (it may have been started
        # under another setting of the variable).
        "cache": cache,
        "cache_dir": str(cache_root()),
    }
    try:
        answer = _CHILD.ask(request)
    except NoAnswer as why:
        return LoadVerdict(skipped=str(why))
    if "error" in answer:
        raise RuntimeError(f"the load check failed in its process:\n{answer['error']}")
    try:
        verdict = LoadVerdict.from_dict(answer.get("verdict"))
    except ValueError as exc:
        _CHILD.close()  # what it writes next cannot be trusted either
        return LoadVerdict(skipped=f"the load check's process answered with no verdict: {exc}")
    if answer.get("digest") != verdict_digest(scanned):
        return LoadVerdict(
            architecture=verdict.architecture,
            skipped=f"the files of {legible(str(folder))} changed while the load check read "
            "them; re-scan to check them again",
        )
    return verdict


class VerdictProcess:
    """One child interpreter running `module`, kept for the next request, and its two pipes;
    one request at a time. `env` turns this process's environment into the child's;
    `what` names the check in messages; `seconds` and `cap` (bytes) bound each answer.

    The child leads a session of its own, so that ending it ends every process it started
    too (code a folder holds, run with `--trust-remote-code`, may start some: SECURITY.md,
    1b). `close` never waits for a request: it ends the child, and the request waiting on
    it gets `NoAnswer`."""

    def __init__(
        self,
        module: str,
        *,
        what: str,
        seconds: float,
        env: Callable[[dict[str, str]], dict[str, str]] | None = None,
        cap: int = _ANSWER_CAP,
    ) -> None:
        self._lock = threading.Lock()  # one request at a time
        self._state = threading.Lock()  # `_process`: `close` takes only this one
        self._process: subprocess.Popen[bytes] | None = None
        self.command = [sys.executable, "-m", module]
        self.what = what
        self.seconds = seconds
        self._env = env
        self._cap = cap

    def start(self) -> None:
        """Start the child unless it runs. Never waits: while a request holds the lock, the
        child runs already. A child that cannot start is started again by `ask`, which
        says why it could not."""
        if not self._lock.acquire(blocking=False):
            return
        try:
            self._started()
        except OSError:
            pass
        finally:
            self._lock.release()

    def _started(self) -> subprocess.Popen[bytes]:
        with self._state:
            if self._process is not None:
                if not _exited(self._process):
                    return self._process
                # It ended by itself since its last answer: what it started goes with it.
                _end(self._process)
            # The child imports this very copy of the package, wherever it was imported from.
            root = str(Path(__file__).resolve().parents[3])
            path = os.environ.get("PYTHONPATH")
            env = {**os.environ, "PYTHONPATH": root + (os.pathsep + path if path else "")}
            self._process = subprocess.Popen(
                self.command,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                env=env if self._env is None else self._env(env),
                close_fds=True,
                start_new_session=True,  # its own process group: see the class docstring
            )
            return self._process

    def ask(self, request: dict[str, Any]) -> dict[str, Any]:
        """The child's answer to `request`: a dict, with `error` (a bug's traceback) or the
        verdict and its digest. `NoAnswer` when the child could not start, ended, ran out
        of time or wrote something else than one JSON object (it is ended then)."""
        with self._lock:
            try:
                process = self._started()
            except OSError as exc:
                raise NoAnswer(f"{self.what}'s process could not start: {exc}") from None
            assert process.stdin is not None and process.stdout is not None
            try:
                process.stdin.write(orjson.dumps(request) + b"\n")
                process.stdin.flush()
                line = read_capped_line(process.stdout, seconds=self.seconds, cap=self._cap)
            except (OSError, TimeoutError) as exc:
                if not self._dropped(process):
                    raise NoAnswer(f"{self.what}'s process gave no verdict: {_CLOSED}") from None
                raise NoAnswer(_why_ended(process, exc, self.what)) from None
            try:
                return read_answer(line, what=self.what)
            except NoAnswer:
                self._dropped(process)
                raise

    def _dropped(self, process: subprocess.Popen[bytes]) -> bool:
        """End `process` after a request it failed, unless `close` took it meanwhile (and
        ends it itself); False then."""
        with self._state:
            if self._process is not process:
                return False
            self._process = None
        _end(process)
        return True

    def close(self) -> None:
        """End the child and every process it started, at once, even while a request waits
        on it (that request gets `NoAnswer`). SIGTERM first: the child sets no handler, so
        it ends at once as with SIGKILL, unless something measures it (`make coverage`'s
        children save their line data on SIGTERM, and SIGKILL would lose it); SIGKILL after
        _CLOSE_WAIT, and to whatever of its group is left."""
        with self._state:
            process, self._process = self._process, None
        if process is not None:
            _end(process, grace=_CLOSE_WAIT)


def _end(process: subprocess.Popen[bytes], *, grace: float = 0.0) -> None:
    """End `process` and its process group (it leads one: `VerdictProcess._started`):
    SIGTERM and up to `grace` seconds to end, when `grace`; then SIGKILL."""
    if grace:
        _signal(process, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while not _exited(process) and time.monotonic() < deadline:
            time.sleep(0.02)
    _signal(process, signal.SIGKILL)
    process.wait()


def _exited(process: subprocess.Popen[bytes]) -> bool:
    """Whether `process` ended, without reaping it: until it is reaped, its pid, and so the
    id of the group it leads, is given to no other process (`_signal`)."""
    if process.returncode is not None:
        return True
    try:
        return os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except (AttributeError, ChildProcessError):  # no waitid (macOS), or reaped meanwhile
        return process.poll() is not None


def _signal(process: subprocess.Popen[bytes], number: signal.Signals) -> None:
    """Send `number` to `process` and to the process group it leads, while it is not reaped:
    a group id lives as long as its leader's zombie or any member, and once all are gone
    the number can be a new process's (signalling it then could end a process not ours);
    a group already gone (or a child that leads none) is no error."""
    if not hasattr(os, "killpg"):
        process.send_signal(number)
    elif process.returncode is None:
        # Not `process.send_signal`: it reaps the leader first when it can (`poll`), which
        # would end the zombie's hold on the group's id before the group is signalled.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, number)


def read_answer(line: bytes, *, what: str = "the load check") -> dict[str, Any]:
    """The child's answer line as a dict (see `VerdictProcess.ask`); `NoAnswer` when it is
    not one JSON object."""
    try:
        answer = orjson.loads(line)
    except orjson.JSONDecodeError:
        answer = None
    if not isinstance(answer, dict):
        raise NoAnswer(f"{what}'s process answered with no verdict")
    return answer


def read_capped_line(stream: IO[bytes], *, seconds: float, cap: int = _ANSWER_CAP) -> bytes:
    """One line from `stream` (a child's answer), at most `cap` bytes, within `seconds`;
    TimeoutError past it, OSError when the child ended first."""
    deadline = time.monotonic() + seconds
    fd = stream.fileno()
    chunks: list[bytes] = []
    size = 0
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not selector.select(left):
                raise TimeoutError(f"no answer within {seconds:g} s")
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                raise OSError("its process ended without an answer")
            chunks.append(chunk)
            size += len(chunk)
            if chunk.endswith(b"\n"):
                return b"".join(chunks)
            if size > cap:
                raise OSError(f"its answer was larger than {cap >> 20} MiB")


def _why_ended(process: subprocess.Popen[bytes], exc: BaseException, what: str) -> str:
    code = process.poll()
    status = f" (exit status {code})" if code is not None and code != -9 else ""
    return f"{what}'s process gave no verdict: {exc}{status}"


class NoAnswer(Exception):
    """The child gave no verdict: it could not start, ended or ran out of time before it
    answered, or answered something else than one JSON object; the message says which."""


_CHILD = VerdictProcess(
    "inspector._internal.load.child", what="the load check", seconds=VERDICT_SECONDS
)
atexit.register(_CHILD.close)


# -- the child -----------------------------------------------------------------------------


def _serve(requests: IO[bytes], answers: IO[bytes]) -> None:
    """Answer each request line with one answer line, until the requests end."""
    for line in requests:
        answer: dict[str, Any]
        try:
            request = orjson.loads(line)
            try:
                scanned = scan(request["path"], layout=request["layout"])
            except (InspectorError, OSError) as exc:
                # The folder changed since the parent scanned it (the digest says so).
                why = f"the folder could not be read again: {exc}"
                answer = {"digest": None, "verdict": LoadVerdict(skipped=why).to_dict()}
            else:
                os.environ[CACHE_ENV] = str(request["cache_dir"])
                trust, cache = bool(request["trust_remote_code"]), bool(request["cache"])
                verdict = load_verdict(scanned, trust_remote_code=trust, cache=cache)
                answer = {"digest": verdict_digest(scanned), "verdict": verdict.to_dict()}
        except Exception:
            answer = {"error": traceback.format_exc(limit=20)}
        answers.write(orjson.dumps(answer) + b"\n")
        answers.flush()


def _main() -> None:
    # The answers go to the pipe the parent reads; whatever transformers or a folder's code
    # prints goes to stderr (discarded), never into an answer.
    answers = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    requests = os.fdopen(os.dup(0), "rb")
    if hasattr(os, "nice"):
        os.nice(_NICENESS)
    prepare_load_check()
    _serve(requests, answers)


if __name__ == "__main__":
    _main()
