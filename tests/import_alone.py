"""Import groups of modules, each group in a process of its own that has imported nothing of
`inspector` before: `python tests/import_alone.py` reads one group per line on stdin
(module names separated by spaces, imported in that order) and prints one JSON line per
group, in input order: `[group, null]`, or `[group, last line of the error]`.

Why a fork server and not one fresh interpreter per group: most of a fresh interpreter's
time goes to numpy, pandas and the other libraries the core imports, not to the core. Here
the parent imports those third-party packages once (the top-level packages a probe
interpreter finds loaded after importing every module asked for) and forks a child per
group. A child starts with no `inspector` module loaded, so what the test is about is
unchanged: an import cycle among the core's modules, or a module that only works when
another one was imported first, fails in the child as it would in a fresh interpreter.

A child importing a module of the project gets the project's package without running its
`__init__` (the public facade, which imports most of the core in its own order): otherwise
every module would be imported after the facade's modules, and a module that works only
because the facade imported something first would pass. The group `inspector` alone imports
the facade itself. (Subpackages' `__init__` files run as usual.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import traceback

PROJECT = "inspector"
WORKERS = 2


def _third_party(modules: list[str]) -> list[str]:
    """Top-level packages outside the project loaded by importing `modules` (in a probe)."""
    code = (
        "import importlib, sys\n"
        f"for m in {modules!r}:\n"
        "    try:\n"
        "        importlib.import_module(m)\n"
        "    except Exception:\n"
        "        pass\n"
        "print('\\n'.join(sorted({n.partition('.')[0] for n in sys.modules})))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout
    return [n for n in out.split() if n != PROJECT and not n.startswith("_") and n != "__main__"]


def _preload(packages: list[str]) -> None:
    import contextlib
    import importlib

    for name in packages:
        # Only a speed-up: a package that fails here is imported (and fails) in the child.
        with contextlib.suppress(Exception):
            importlib.import_module(name)
    assert not any(n == PROJECT or n.startswith(f"{PROJECT}.") for n in sys.modules)


def _without_facade() -> None:
    """Register the project's package as found on disk, its `__init__` not run."""
    import importlib.util

    spec = importlib.util.find_spec(PROJECT)
    assert spec is not None and spec.submodule_search_locations is not None
    sys.modules[PROJECT] = importlib.util.module_from_spec(spec)


def _child(group: list[str], write_fd: int) -> None:
    import importlib

    error = None
    try:
        if group[0].startswith(f"{PROJECT}."):
            _without_facade()
        for module in group:
            importlib.import_module(module)
    except BaseException:
        error = traceback.format_exc().strip().splitlines()[-1]
    os.write(write_fd, json.dumps(error).encode())
    os.close(write_fd)
    os._exit(0)


def _start(group: list[str]) -> tuple[int, int]:
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        _child(group, write_fd)
    os.close(write_fd)
    return pid, read_fd


def _finish(pid: int, read_fd: int) -> str | None:
    chunks = []
    while chunk := os.read(read_fd, 65536):
        chunks.append(chunk)
    os.close(read_fd)
    _, status = os.waitpid(pid, 0)
    if not chunks:
        return f"the child died (wait status {status})"
    error: str | None = json.loads(b"".join(chunks))
    return error


def main() -> int:
    groups = [line.split() for line in sys.stdin.read().splitlines() if line.strip()]
    _preload(_third_party(sorted({m for g in groups for m in g})))
    results: list[str | None] = [None] * len(groups)
    running: list[tuple[int, int, int]] = []
    for i, group in enumerate(groups):
        if len(running) >= WORKERS:
            j, pid, fd = running.pop(0)
            results[j] = _finish(pid, fd)
        running.append((i, *_start(group)))
    for j, pid, fd in running:
        results[j] = _finish(pid, fd)
    for group, error in zip(groups, results, strict=True):
        print(json.dumps([group, error]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
