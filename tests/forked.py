"""A child process per call that starts as a fresh interpreter would after its imports, without
paying them each time: one interpreter runs a prelude (its imports, and a function `run`),
then forks a child for each call, which runs `run(*args)` and answers with its result.

For the tests that run their work in a child for what the child gives them: a process that has
read nothing else (its peak resident memory, VmHWM, starts at its size when forked), or one
whose death (a signal) must not end the test run. Most of a fresh interpreter's CPU goes to
the imports (the scan and the checks: about 0.8 s), paid here once per server.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

# After the prelude: a child per line of JSON arguments on stdin, one line of JSON answer on
# stdout per child ({"result": ...}, {"error": its traceback} or {"died": its exit code}).
_LOOP = """
import json as _json, os as _os, sys as _sys, traceback as _traceback

for _line in _sys.stdin:
    _read, _write = _os.pipe()
    _pid = _os.fork()
    if _pid == 0:
        _os.close(_read)
        try:
            _answer = {"result": run(*_json.loads(_line))}
        except BaseException:
            _answer = {"error": _traceback.format_exc()}
        with _os.fdopen(_write, "w") as _out:
            _out.write(_json.dumps(_answer))
        _os._exit(0)
    _os.close(_write)
    with _os.fdopen(_read) as _answers:
        _text = _answers.read()
    _, _status = _os.waitpid(_pid, 0)
    print(_text or _json.dumps({"died": _os.waitstatus_to_exitcode(_status)}), flush=True)
"""


@contextmanager
def fork_server(prelude: str) -> Iterator[Callable[..., Any]]:
    """Start the interpreter running `prelude` (which defines `run`); yields `call(*args)`:
    `run(*args)` in a child forked for the call, its result (JSON), or an AssertionError with
    the child's traceback or the exit code it died with (a signal's is negative)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", f"{prelude}\n{_LOOP}"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,  # stderr: the test's own (what pytest captures and shows on a failure)
    )
    stdin, stdout = proc.stdin, proc.stdout
    assert stdin is not None and stdout is not None

    def call(*args: Any) -> Any:
        stdin.write(json.dumps(args) + "\n")
        stdin.flush()
        line = stdout.readline()
        assert line, f"the server ended (exit {proc.wait()})"
        answer = json.loads(line)
        assert "died" not in answer, f"the child died (exit {answer['died']})"
        assert "error" not in answer, answer["error"]
        return answer["result"]

    try:
        yield call
    finally:
        stdin.close()
        try:
            proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
