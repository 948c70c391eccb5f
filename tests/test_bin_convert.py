"""PyTorch `.bin` checkpoints beyond reading their headers: converted into safetensors
(`consolidate`, `repair --only reshard`) bit for bit, their `pytorch_model.bin.index.json`
rebuilt from the files, strided views read element by element (`--deep`, `verify`), and
remote files read with a few bounded ranged reads.

The expected bytes are what the writer's own loader gives: the golden manifest records the
sha256 of every tensor as `torch.load(path, weights_only=True)` returns it (contiguous), and
the files torch.save writes in these tests are loaded back with torch itself."""

from __future__ import annotations

import hashlib
import json
import shutil
import struct
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import xxhash

sys.path.insert(0, str(Path(__file__).parent))

from golden_manifest import FIXTURES, MANIFEST
from remote_servers import RangeHTTPServer

from inspector import verify, write_manifest
from inspector._internal.checkpoint.scan import scan
from inspector._internal.checks import check
from inspector._internal.cli.main import main
from inspector._internal.findings.issues import group_problems
from inspector._internal.formats.tensordata import TensorData
from inspector._internal.load.verdict import load_verdict
from inspector._internal.plans.consolidate import engine as copy_engine
from inspector._internal.plans.consolidate import plan_consolidation
from inspector._internal.plans.repair import plan_repair
from inspector._internal.plans.reshard import plan_reshard
from inspector.errors import PlanRefusedError

BIN_INDEX = "pytorch_model.bin.index.json"
ST_INDEX = "model.safetensors.index.json"


# -- helpers ---------------------------------------------------------------------------------


def raw(t: torch.Tensor) -> bytes:
    """A tensor's values as the bytes safetensors stores: row-major, little endian."""
    t = t.detach().contiguous()
    return t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""


def written(folder: Path) -> tuple[dict[str, tuple[str, list[int], bytes]], dict[str, str]]:
    """Every tensor of every `.safetensors` file of `folder`, read from the bytes with no
    library (name -> dtype, shape, bytes), and the headers' `__metadata__` merged."""
    out: dict[str, tuple[str, list[int], bytes]] = {}
    meta: dict[str, str] = {}
    for path in sorted(folder.glob("*.safetensors")):
        data = path.read_bytes()
        (n,) = struct.unpack("<Q", data[:8])
        header = json.loads(data[8 : 8 + n])
        meta.update(header.pop("__metadata__", {}))
        for name, entry in header.items():
            b, e = entry["data_offsets"]
            out[name] = (entry["dtype"], entry["shape"], data[8 + n + b : 8 + n + e])
    return out, meta


def facts(case: str) -> dict[str, dict[str, Any]]:
    """name -> what the manifest records of the tensor as torch.load returned it."""
    files = MANIFEST[case]["files"]
    return {name: t for f in files.values() for name, t in f["tensors"].items()}


def loud(findings: list[Any]) -> list[tuple[str, str | None]]:
    return [(f.code, f.tensor) for f in findings if f.severity in ("error", "warning")]


def views() -> dict[str, torch.Tensor]:
    """What `torch.save` keeps as it is: transposed and sliced views, a column block of a
    fused weight, a stride-0 expansion, a permuted 3-D view, shared storages."""
    g = torch.Generator().manual_seed(0)
    fused = torch.randn(24, 16, generator=g)
    cube = torch.randn(3, 4, 5, generator=g)
    return {
        "q.weight": fused[:8],  # a row block: contiguous, at a storage offset
        "k.weight": fused[:, 4:9],  # a column block: strided
        "fused.t": fused.t(),
        "every_third": fused.reshape(-1)[1::3],
        "expanded": torch.arange(5.0).expand(4, 5),
        "permuted": cube.permute(2, 0, 1),
        "half.t": torch.randn(7, 9, generator=g).to(torch.bfloat16).t(),
        "plain": torch.randn(5, 3, generator=g),
    }


# -- strided views read element by element (--deep, verify) ---------------------------------


def test_deep_judges_only_the_elements_a_view_covers(tmp_path: Path) -> None:
    base = torch.zeros(6, 8)
    base[:, 0] = 1.0
    base[3, 5] = float("nan")
    torch.save(
        {"col1": base[:, 1], "first2": base[:, :2], "t": base.t()[4:6], "row3": base[3]},
        tmp_path / "pytorch_model.bin",
    )
    findings = check(scan(tmp_path), model=False, deep=True)
    assert sorted((f.code, f.tensor) for f in findings) == [
        ("tensor-all-zero", "col1"),
        ("tensor-nonfinite", "row3"),
        ("tensor-nonfinite", "t"),
    ]


# -- remote: bounded ranged reads ------------------------------------------------------------


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, torch.Tensor]]:
    """A 9 MB `.bin` of 300 small tensors around two 2 MB ones, with strided views and a
    sparse one (11 elements 400 kB apart in a 4 MB storage)."""
    folder = tmp_path_factory.mktemp("http") / "model"
    folder.mkdir()
    g = torch.Generator().manual_seed(1)
    state = {f"layers.{i}.norm.weight": torch.randn(16, generator=g) for i in range(150)}
    state["big.a"] = torch.randn(512, 1024, generator=g)
    state |= views()
    state["sparse"] = torch.randn(1 << 20, generator=g)[::100_000]
    state |= {f"layers.{i}.norm.weight": torch.randn(16, generator=g) for i in range(150, 300)}
    state["big.b"] = torch.randn(1024, 512, generator=g).t()
    torch.save(state, folder / "pytorch_model.bin")
    return folder, state


def test_remote_bin_header_takes_a_few_bounded_reads(
    served: tuple[Path, dict[str, torch.Tensor]],
) -> None:
    """The tail (end record and directory), the pickle and the local headers in merged
    windows: a handful of requests and a few hundred KB for a file of 300+ records, not a
    request per record nor the file."""
    folder, state = served
    local = scan(folder).shards[0]
    with RangeHTTPServer(folder.parent) as server:
        there = scan(f"{server.url}/model/")
        requests, sent = server.requests, server.content_bytes
    shard = there.shards[0]
    assert shard.names == local.names == tuple(state) and not shard.findings
    assert shard.begins.tolist() == local.begins.tolist()
    assert shard.ends.tolist() == local.ends.tolist()
    size = (folder / "pytorch_model.bin").stat().st_size
    assert requests <= 12, requests
    assert sent < size // 10, (sent, size)
