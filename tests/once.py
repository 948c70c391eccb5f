"""Test data made once per test run and shared by every pytest-xdist worker.

Tests and conftest.py import it as `from once import once_per_run` (pytest puts tests/ on
the path).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest


def shared_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder every process of this test run sees: under pytest-xdist, the parent of the
    workers' own temp folders; alone, this process's temp folder."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def once_per_run(
    tmp_path_factory: pytest.TempPathFactory, name: str, make: Callable[[Path], None]
) -> Path:
    """`shared_dir/name`, made by `make(folder)` in the first process of the run that asks
    for it, under a file lock; the other processes wait for it, then use it as it is."""
    from filelock import FileLock

    root = shared_dir(tmp_path_factory)
    folder, done = root / name, root / f"{name}.done"
    with FileLock(str(root / f"{name}.lock")):
        if not done.exists():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            make(folder)
            done.touch()
    return folder
