"""The load verdict in a child interpreter, so that the process that asked stays free.

Why: the verdict imports torch and transformers and builds a model (at 300,000 tensors on 2
shared cores: 6 s of imports, then 4 s to build and match, 3 s when the model is cached).
In a notebook kernel that work held the GIL for seconds after the dashboard's Overview: a tab
clicked meanwhile answered after 1.5 s, and its grid after 10 s. A child process takes that
work to another core, and the kernel only waits on a pipe.

How: `start_verdict_process()` starts one child per process, or the first request does (the
dashboard asks once its Overview is sent; started with the scan, the child's imports slowed
the Overview); `verdict_apart(scanned)` asks it for the verdict of a local folder, unless
this process computed the verdict of that very scan already (`known_verdict`). The child
scans the folder itself (passing the scan would mean pickling it) and answers with the
verdict and a digest of what the verdict read: the layout, config.json, the quantization
config, the JSON files found, the index's shard set, and every shard's names, dtypes and
shapes. When the digest is not the one of the caller's scan, the folder changed in between,
and the verdict says so instead of answering for other files. The child is kept for the next
verdict (a re-scan after a repair finds its model cached) and ends with this process (its
requests pipe closes).

The answer is read as untrusted data: the child ran transformers on an untrusted config (and,
with `trust_remote_code`, the folder's own code), so it is JSON, capped in size and time, and
checked field by field (`LoadVerdict.from_dict`); never unpickled. A remote checkpoint, or
Windows (where a pipe cannot be waited on with a deadline), gets the verdict in this process
(`load_verdict`).
"""

from __future__ import annotations

import atexit
import hashlib
import os
import selectors
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import IO, Any

import orjson

from inspector._internal.checkpoint.scan import scan
from inspector._internal.checkpoint.scanned import ScannedCheckpoint
from inspector._internal.common.display import legible
from inspector._internal.load.verdict import (
    LOADABLE_LAYOUTS,
    LoadVerdict,
    known_verdict,
    load_verdict,
    prepare_load_check,
)
from inspector.errors import InspectorError

__all__ = [
    "VERDICT_SECONDS",
    "NoAnswer",
    "read_answer",
    "start_verdict_process",
    "verdict_apart",
    "verdict_digest",
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


def verdict_digest(scanned: ScannedCheckpoint) -> str:
    """A digest of everything `load_verdict` reads from `scanned` (see the module docstring)."""
    h = hashlib.sha256()

    def add(value: Any) -> None:
        h.update(orjson.dumps(value, option=orjson.OPT_SORT_KEYS, default=str))
        h.update(b"\0")

    add([str(scanned.layout), scanned.config, scanned.quant_config, sorted(scanned.json_files)])
    index = scanned.index
    add(None if index is None else sorted(set(index.weight_map.values())))
    for shard in scanned.shards:
        add([shard.file, shard.readable, list(shard.names), shard.dtypes, shard.shapes])
    return h.hexdigest()


def start_verdict_process() -> None:
    """Start the child now (when it is not running), so that it imports torch and
    transformers before the first request."""
    _CHILD.start()


def verdict_apart(scanned: ScannedCheckpoint, *, trust_remote_code: bool = False) -> LoadVerdict:
    """`load_verdict(scanned)`, computed in the child for a local folder of a layout the check
    runs on; in this process otherwise. A bug in the child is raised here as RuntimeError
    with the child's traceback; a child that crashed or ran out of time gives a skipped
    verdict that says so. A verdict this process computed already for this very scan
    (`check(scanned)` in a notebook, then a dashboard on it) is answered at once: the child
    would import torch and transformers again (about 6 s of CPU) for the same answer."""
    known = known_verdict(scanned, trust_remote_code=trust_remote_code)
    if known is not None:
        return known
    folder = scanned.local_path
    if folder is None or scanned.layout not in LOADABLE_LAYOUTS or sys.platform == "win32":
        return load_verdict(scanned, trust_remote_code=trust_remote_code)
    request = {
        "path": str(folder),
        "layout": str(scanned.layout),
        "trust_remote_code": trust_remote_code,
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


class _Child:
    """One child interpreter and its two pipes; one request at a time."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._process: subprocess.Popen[bytes] | None = None

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
        if self._process is not None and self._process.poll() is None:
            return self._process
        # The child imports this very copy of the package, wherever it was imported from.
        root = str(Path(__file__).resolve().parents[3])
        path = os.environ.get("PYTHONPATH")
        env = {**os.environ, "PYTHONPATH": root + (os.pathsep + path if path else "")}
        self._process = subprocess.Popen(
            [sys.executable, "-m", "inspector._internal.load.child"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
            close_fds=True,
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
                raise NoAnswer(f"the load check's process could not start: {exc}") from None
            assert process.stdin is not None and process.stdout is not None
            try:
                process.stdin.write(orjson.dumps(request) + b"\n")
                process.stdin.flush()
                line = _read_line(process.stdout, deadline=time.monotonic() + VERDICT_SECONDS)
            except (OSError, TimeoutError) as exc:
                self._end(process)
                raise NoAnswer(_why_ended(process, exc)) from None
            try:
                return read_answer(line)
            except NoAnswer:
                self._end(process)
                raise

    def _end(self, process: subprocess.Popen[bytes]) -> None:
        process.kill()
        process.wait()
        self._process = None

    def close(self) -> None:
        with self._lock:
            if self._process is not None:
                self._end(self._process)


def read_answer(line: bytes) -> dict[str, Any]:
    """The child's answer line as a dict (see `_Child.ask`); `NoAnswer` when it is not one
    JSON object."""
    try:
        answer = orjson.loads(line)
    except orjson.JSONDecodeError:
        answer = None
    if not isinstance(answer, dict):
        raise NoAnswer("the load check's process answered with no verdict")
    return answer


def _read_line(stream: IO[bytes], *, deadline: float) -> bytes:
    """One line from `stream` (the child's answer), at most `_ANSWER_CAP` bytes, by
    `deadline`; TimeoutError past it, OSError when the child ended first."""
    fd = stream.fileno()
    chunks: list[bytes] = []
    size = 0
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not selector.select(left):
                raise TimeoutError(f"no answer within {VERDICT_SECONDS:g} s")
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                raise OSError("its process ended without an answer")
            chunks.append(chunk)
            size += len(chunk)
            if chunk.endswith(b"\n"):
                return b"".join(chunks)
            if size > _ANSWER_CAP:
                raise OSError(f"its answer was larger than {_ANSWER_CAP >> 20} MiB")


def _why_ended(process: subprocess.Popen[bytes], exc: BaseException) -> str:
    code = process.poll()
    status = f" (exit status {code})" if code is not None and code != -9 else ""
    return f"the load check's process gave no verdict: {exc}{status}"


class NoAnswer(Exception):
    """The child gave no verdict: it could not start, ended or ran out of time before it
    answered, or answered something else than one JSON object; the message says which."""


_CHILD = _Child()
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
                trust = bool(request["trust_remote_code"])
                verdict = load_verdict(scanned, trust_remote_code=trust)
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
