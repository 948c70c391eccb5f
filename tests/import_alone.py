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

Why a group of one module is forked from a process that has imported its package: Python
imports `a.b.m` by importing the package `a.b` in full first (its parents, then its
`__init__`), and only then `m`, which `a.b`'s `__init__` may already have imported. So a child
forked from a process that imported `a.b` from scratch (the package's own group, which that
process answers) and then imports `m` runs exactly what a fresh interpreter runs, without
importing `a.b` again: a package whose `__init__` imports much of the core (`checks`,
`integrity`, `plans.consolidate`) is imported once, not once per module under it. A package
that fails to import fails each module under it with the same error, as in a fresh interpreter.
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
    error: str | None = _receive(pid, read_fd)  # type: ignore[assignment]
    return error


def _receive(pid: int, read_fd: int) -> object:
    """What the child `pid` wrote as JSON on `read_fd`, once it exited; a message if it died."""
    chunks = []
    while chunk := os.read(read_fd, 65536):
        chunks.append(chunk)
    os.close(read_fd)
    _, status = os.waitpid(pid, 0)
    if not chunks:
        return f"the child died (wait status {status})"
    return json.loads(b"".join(chunks))


def _run(groups: list[list[str]]) -> list[str | None]:
    """Each group in a child forked from this process, WORKERS at a time, in input order."""
    results: list[str | None] = [None] * len(groups)
    running: list[tuple[int, int, int]] = []
    for i, group in enumerate(groups):
        if len(running) >= WORKERS:
            j, pid, fd = running.pop(0)
            results[j] = _finish(pid, fd)
        running.append((i, *_start(group)))
    for j, pid, fd in running:
        results[j] = _finish(pid, fd)
    return results


def _package_child(package: str, modules: list[str], write_fd: int) -> None:
    """Import `package` from scratch, then each of `modules` (all directly in it) in a child
    forked from here; writes [the package's error, the modules' errors]."""
    import importlib

    errors: list[str | None]
    try:
        if package.startswith(f"{PROJECT}."):
            _without_facade()
        importlib.import_module(package)
    except BaseException:
        error = traceback.format_exc().strip().splitlines()[-1]
        errors = [error] * (1 + len(modules))
    else:
        errors = [None, *_run([[m] for m in modules])]
    os.write(write_fd, json.dumps(errors).encode())
    os.close(write_fd)
    os._exit(0)


def _by_package(groups: list[list[str]]) -> dict[str, list[int]]:
    """{package: indexes of the one-module groups directly in it}, for the packages that are
    one-module groups themselves, the project's own package excepted: its group runs the
    facade, which its modules must be imported without."""
    alone = {g[0]: i for i, g in enumerate(groups) if len(g) == 1}
    under: dict[str, list[int]] = {}
    for name, i in alone.items():
        parent = name.rpartition(".")[0]
        if parent in alone and parent != PROJECT:
            under.setdefault(parent, []).append(i)
    return under


def main() -> int:
    groups = [line.split() for line in sys.stdin.read().splitlines() if line.strip()]
    _preload(_third_party(sorted({m for g in groups for m in g})))
    results: list[str | None] = [None] * len(groups)
    packages = _by_package(groups)
    alone = {g[0]: i for i, g in enumerate(groups) if len(g) == 1}
    done = {i for members in packages.values() for i in members} | {alone[p] for p in packages}
    plain = [i for i in range(len(groups)) if i not in done]
    for i, error in zip(plain, _run([groups[i] for i in plain]), strict=True):
        results[i] = error
    for package, members in packages.items():
        # One package at a time: its process forks WORKERS children of its own.
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read_fd)
            _package_child(package, [groups[i][0] for i in members], write_fd)
        os.close(write_fd)
        answer = _receive(pid, read_fd)
        errors = answer if isinstance(answer, list) else [answer] * (1 + len(members))
        for i, error in zip([alone[package], *members], errors, strict=True):
            results[i] = error
    for group, error in zip(groups, results, strict=True):
        print(json.dumps([group, error]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
