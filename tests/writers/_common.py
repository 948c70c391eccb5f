"""Shared helpers of the real-writers harness (issue 8): where fixtures go, the manifest, the
gloo spawn helper, tensor hashes and the documented CPU shims.

The writer scripts run ONLY in the writers' virtual environment (`make fixtures`); nothing here
is imported by the CI tests, which read the committed fixtures and `MANIFEST.json` alone.

Why a manifest: CI must check our consolidation bit-exactly against what the real writer held
in memory, without installing the writer. Each case therefore records the writer package and
version, the command that regenerates it, what it is (healthy or which seed / damage), and for
DCP-style cases the sha256 of every tensor of the writer's own full state dict.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import socket
import sys
from collections.abc import Callable, Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "writers"
MANIFEST = FIXTURES / "MANIFEST.json"
MAX_CASE_BYTES = 1_000_000


def version(package: str) -> str:
    """The installed version of a distribution, as pip names it."""
    return metadata.version(package)


def case_dir(writer: str, case: str) -> Path:
    """An empty fixture folder `tests/fixtures/writers/<writer>/<case>/` (old content removed,
    so a regenerated case never keeps a stale file from a previous run)."""
    folder = FIXTURES / writer / case
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    return folder


def command(script: str) -> str:
    """How to regenerate a case: the script alone (each script rewrites all of its cases), run
    by the interpreter of the writers' virtual environment it needs (`build/writers-venv`, or
    a sibling such as `build/writers-venv-tf4` for a writer whose pins conflict with it)."""
    return f"build/{Path(sys.prefix).name}/bin/python tests/writers/{script}"


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def record(
    writer: str,
    case: str,
    *,
    package: str,
    script: str,
    description: str,
    healthy: bool,
    damage: str | None = None,
    seed: str | None = None,
    extra: dict[str, Any] | None = None,
    fmt: str | None = None,
    expected: list[str] | None = None,
    expected_words: str | None = None,
) -> None:
    """Add or replace the manifest entry `<writer>/<case>` (read-modify-write of one JSON file;
    scripts run one after another, never at the same time).

    `fmt` names the on-disk format when it is not one the first writers produced
    (`pytorch-bin`, `compressed-tensors`, `mxfp4`, `fp8-block`, `gguf`); `expected` is the
    exact set of error and warning codes a check must report on the case (empty: healthy) and
    `expected_words` says why, for the cases whose expectations live in the manifest."""
    import torch

    folder = FIXTURES / writer / case
    size = folder_bytes(folder)
    if size > MAX_CASE_BYTES:
        raise SystemExit(f"{folder} is {size} bytes, over the {MAX_CASE_BYTES} budget")
    entry: dict[str, Any] = {
        "writer": writer,
        "package": package,
        "version": version(package),
        "torch": torch.__version__,
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
        "command": command(script),
        "description": description,
        "healthy": healthy,
        "seed": seed,
        "damage": damage,
        "bytes": size,
    }
    if fmt is not None:
        entry["format"] = fmt
    if expected is not None:
        if sorted(set(expected)) != sorted(expected) or bool(expected) == healthy:
            raise SystemExit(f"{writer}/{case}: expected codes {expected} vs healthy={healthy}")
        entry["expected_codes"] = sorted(expected)
        entry["expected_findings"] = expected_words
    entry.update(extra or {})
    manifest = json.loads(MANIFEST.read_text()) if MANIFEST.exists() else {}
    manifest[f"{writer}/{case}"] = entry
    MANIFEST.parent.mkdir(parents=True, exist_ok=True)
    MANIFEST.write_text(json.dumps(dict(sorted(manifest.items())), indent=2) + "\n")
    print(f"[{writer}/{case}] {size} bytes: {description}")


def record_expected(
    writer: str,
    case: str,
    *,
    package: str,
    script: str,
    fmt: str,
    description: str,
    expected: list[str],
    words: str,
    damage: str | None = None,
    extra: dict[str, Any] | None = None,
) -> None:
    """`record` for a case whose expectations live in the manifest: healthy exactly when no
    error or warning code is expected."""
    record(
        writer,
        case,
        package=package,
        script=script,
        description=description,
        healthy=not expected,
        damage=damage,
        extra=extra,
        fmt=fmt,
        expected=expected,
        expected_words=words,
    )


def tensor_sha256(tensor: Any) -> str:
    """sha256 of a tensor's raw little-endian row-major bytes: what a safetensors file stores,
    so CI can hash the bytes it reads back without torch semantics getting in the way."""
    import torch

    t = tensor.detach().contiguous().cpu()
    if t.dtype == torch.bool:
        t = t.to(torch.uint8)
    raw = t.reshape(-1).view(torch.uint8) if t.numel() else torch.empty(0, dtype=torch.uint8)
    return hashlib.sha256(raw.numpy().tobytes()).hexdigest()


def state_dict_hashes(state: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """{name: {"dtype", "shape", "sha256"}} for a full (unsharded) state dict."""
    return {
        name: {
            "dtype": str(t.dtype).removeprefix("torch."),
            "shape": list(t.shape),
            "sha256": tensor_sha256(t),
        }
        for name, t in sorted(state.items())
    }


def safetensors_folder_hashes(folder: Path) -> dict[str, dict[str, Any]]:
    """The same hashes for every tensor of every `.safetensors` file under `folder` (used on a
    consolidator's output)."""
    from safetensors.torch import load_file

    out: dict[str, Any] = {}
    for path in sorted(folder.glob("*.safetensors")):
        out.update(state_dict_hashes(load_file(str(path))))
    return dict(sorted(out.items()))


def safetensors_listing(folder: Path) -> dict[str, list[Any]]:
    """{name: [dtype, shape]} of every tensor of every `.safetensors` file in `folder`, from
    the headers: what a quantized case holds, for the manifest."""
    from safetensors import safe_open

    out: dict[str, list[Any]] = {}
    for path in sorted(folder.glob("*.safetensors")):
        with safe_open(str(path), "pt") as f:
            names = f.keys()
            for name in names:
                view = f.get_slice(name)
                out[name] = [view.get_dtype(), list(view.get_shape())]
    return dict(sorted(out.items()))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def spawn(fn: Callable[..., None], world_size: int, *args: Any) -> None:
    """Run `fn(rank, world_size, *args)` in `world_size` fresh processes, each already in a
    gloo process group on 127.0.0.1 (no other address is ever used)."""
    import torch.multiprocessing as tmp

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(free_port())
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    tmp.spawn(_rank_entry, args=(world_size, fn, args), nprocs=world_size, join=True)


def _rank_entry(rank: int, world_size: int, fn: Callable[..., None], args: tuple) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=world_size)
    try:
        fn(rank, world_size, *args)
        dist.barrier()
    finally:
        dist.destroy_process_group()


@contextlib.contextmanager
def cpu_cuda_shims() -> Iterator[None]:
    """No-op stand-ins for the two CUDA calls megatron-core 0.16.1 makes on its save path
    (documented in write_megatron.py's header, where their effect on the bytes is checked):

    - `torch.cuda.synchronize()` after copying tensors "to cpu, non_blocking": the tensors are
      CPU tensors already, there is nothing to wait for.
    - `torch.cuda.current_device()` as the device of a one-element failure flag broadcast after
      the write: the flag lives on the CPU instead, gloo broadcasts it the same way.
    """
    import torch

    saved = (torch.cuda.synchronize, torch.cuda.current_device)
    torch.cuda.synchronize = lambda *a, **k: None  # type: ignore[assignment]
    torch.cuda.current_device = lambda: "cpu"  # type: ignore[assignment]
    try:
        yield
    finally:
        torch.cuda.synchronize, torch.cuda.current_device = saved


def tree_digest(folder: Path) -> dict[str, str]:
    """{relative path: sha256 of the file bytes} of every file under `folder`: used to show a
    shim or a repeated run leaves the written bytes unchanged."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }
