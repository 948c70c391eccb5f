"""`python -m inspector ...` in a fresh process, as the tests run the CLI from outside
(`cli`), and the same command run in the test's process (`run`), for the tests that are
about the command's work rather than the process: each child costs 1-1.3 s of CPU to start.

Tests import them as `from commands import cli, run` (pytest puts tests/ on the path).
"""

from __future__ import annotations

import functools
import io
import locale
import shlex
import subprocess
import sys
import traceback

from inspector._internal.cli.main import main

# The commands that build the model named by config.json unless told `--no-model`.
MODEL_COMMANDS = frozenset({"check", "report", "repair"})
# A shell prefix's user namespace (`cli(..., wrap=...)`).
UNSHARE = ["unshare", "--user", "--map-root-user", "--mount"]


def cli(
    *args: object,
    model: bool = False,
    wrap: str | None = None,
    timeout: float = 300,
    **popen: object,
) -> subprocess.CompletedProcess[str]:
    """Run `python -m inspector ARGS` with no stdin; its output captured as text.

    The model is left out (`--no-model`) unless `model=True`: importing torch and
    transformers costs each process 4-5 s of CPU, and the load check has tests of its own
    (tests/test_model_load.py, tests/test_hostile_load_check.py, the console-script test).
    `wrap` is a shell prefix run in a user namespace (`UNSHARE`) before the CLI."""
    argv = [str(a) for a in args]
    if not model and argv and argv[0] in MODEL_COMMANDS:
        argv.append("--no-model")
    cmd = [sys.executable, "-m", "inspector", *argv]
    if wrap is not None:
        cmd = [*UNSHARE, "sh", "-c", f"{wrap} && exec {shlex.join(cmd)}"]
    return subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL, **popen
    )


@functools.cache
def _child_streams() -> tuple[tuple[str, str], tuple[str, str]]:
    """(encoding, errors) of stdout and of stderr in a `cli` child: what Python gives a
    process whose output is a pipe, under this environment's locale (asked once)."""
    probe = "import sys; o, e = sys.stdout, sys.stderr; print(o.encoding, o.errors)"
    probe += "; print(e.encoding, e.errors)"
    words = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        check=True,
    ).stdout.split()
    return (words[0], words[1]), (words[2], words[3])


def _decoded(data: bytes) -> str:
    # What `subprocess.run(..., text=True)` gives: the locale's encoding, universal newlines.
    text = data.decode(locale.getpreferredencoding(False))
    return text.replace("\r\n", "\n").replace("\r", "\n")


def run(*args: object, model: bool = False) -> subprocess.CompletedProcess[str]:
    """`cli(*args)` run in this process through the CLI's entry function, for the tests that
    are about a command's work, not about the process (exit status of a real process, a pty,
    a kill, an environment, the console script: those keep `cli`).

    It returns what `cli` would: the exit code (`SystemExit` included, an exception that
    escapes `main` is a traceback on stderr and 1, as the interpreter makes it) and the
    output as the same bytes: encoded as a child's pipes encode them (encodings and error
    handlers asked of a child once) and decoded as `subprocess` does, so a character a real
    process could not write fails here too and control characters are compared as bytes.
    stdin is empty and no terminal, as `cli`'s /dev/null. The model is never built here:
    torch and transformers would stay imported in the test process (`model=True` is
    refused)."""
    if model:
        raise ValueError("run() builds no model: use cli(..., model=True) for that")
    argv = [str(a) for a in args]
    if argv and argv[0] in MODEL_COMMANDS:
        argv.append("--no-model")
    (out_enc, out_err), (err_enc, err_err) = _child_streams()
    out, err = io.BytesIO(), io.BytesIO()
    stdout = io.TextIOWrapper(out, encoding=out_enc, errors=out_err, write_through=True)
    stderr = io.TextIOWrapper(err, encoding=err_enc, errors=err_err, write_through=True)
    saved = sys.stdin, sys.stdout, sys.stderr
    sys.stdin, sys.stdout, sys.stderr = io.StringIO(""), stdout, stderr
    try:
        code = main(argv)
    except SystemExit as exit_:  # argparse's usage errors, --help
        code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
        if isinstance(exit_.code, str):
            print(exit_.code, file=sys.stderr)
    except Exception:  # what the interpreter does with an exception nobody caught
        traceback.print_exc(file=sys.stderr)
        code = 1
    finally:
        sys.stdin, sys.stdout, sys.stderr = saved
        stdout.flush()
        stderr.flush()
    return subprocess.CompletedProcess(
        [sys.executable, "-m", "inspector", *argv],
        code,
        _decoded(out.getvalue()),
        _decoded(err.getvalue()),
    )
