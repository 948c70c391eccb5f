"""PyTorch `.bin` files read header-only: files torch.save wrote, then damaged the way copies
and hostile uploads go wrong. The healthy and damaged checkpoints transformers 4.x wrote are
in the golden fixtures (tests/test_golden_writers.py); these cover what a writer never
produces."""

from __future__ import annotations

import io
import pickle
import shutil
import zipfile
from pathlib import Path

import pytest
import torch

from inspector._internal.checkpoint.loaded import tensor_data
from inspector._internal.checks import check
from inspector._internal.diagnosis.issues import group_problems
from inspector._internal.formats.bin_shard import read_bin_shard
from inspector._internal.plans.repair import plan_repair
from inspector._internal.scan.entry import scan
from inspector._internal.storage import local_location

GOLDEN = Path(__file__).resolve().parent / "fixtures" / "writers"


def _state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "a.weight": torch.randn(4, 8, generator=g),
        "b.weight": torch.randn(3, 2, generator=g).to(torch.bfloat16),
        "c.bias": torch.arange(5, dtype=torch.int64),
    }


def _rezip(
    src: Path, dst: Path, *, drop: str = "", replace: dict[str, bytes] | None = None
) -> None:
    """The archive rewritten record by record (STORED), without `drop`, with `replace`."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            if drop and info.filename.endswith(drop):
                continue
            data = (replace or {}).get(info.filename.rsplit("/", 1)[-1], zin.read(info))
            zout.writestr(info.filename, data)


def _codes(folder: Path) -> set[str]:
    return {f.code for f in check(scan(folder), model=False)}


def test_torch_save_columns_match_torch(tmp_path: Path) -> None:
    state = _state()
    torch.save(state, tmp_path / "pytorch_model.bin")
    scanned = scan(tmp_path)
    assert scanned.layout == "pytorch-bin"
    shard = scanned.shards[0]
    assert shard.names == tuple(state)
    assert shard.dtypes == ["F32", "BF16", "I64"]
    assert shard.shapes == [(4, 8), (3, 2), (5,)]
    with tensor_data(scanned) as data:
        for name, t in state.items():
            view = data.tensor_bytes(name)
            assert (
                view is not None
                and bytes(view) == t.contiguous().view(torch.uint8).numpy().tobytes()
            )
    assert not check(scanned, model=False)


def test_no_storage_byte_is_read(tmp_path: Path) -> None:
    """Header-only: a 4 MB tensor costs a few KB of reads."""
    torch.save({"big": torch.zeros(1 << 20)}, tmp_path / "x.bin")
    read: list[int] = []

    class Counting:
        def __init__(self, data: bytes) -> None:
            self.data = data

        def size(self) -> int:
            return len(self.data)

        def read_range(self, offset: int, length: int) -> bytes:
            read.append(length)
            return self.data[offset : offset + length]

    from inspector._internal.formats.bin_shard import read_bin_columns

    shard = read_bin_columns(Counting((tmp_path / "x.bin").read_bytes()), "x.bin")
    assert shard.names == ("big",) and not shard.findings
    assert sum(read) < 70_000


def test_hostile_data_pkl_is_refused_and_nothing_runs(tmp_path: Path) -> None:
    torch.save(_state(), tmp_path / "good.bin")

    class Evil:
        def __reduce__(self):
            return (exec, ("raise SystemExit('ran')",))

    _rezip(
        tmp_path / "good.bin",
        tmp_path / "pytorch_model.bin",
        replace={"data.pkl": pickle.dumps({"x": Evil()}, protocol=2)},
    )
    (tmp_path / "good.bin").unlink()
    findings = check(scan(tmp_path), model=False)
    assert [f.code for f in findings] == ["pickle-hostile"]
    assert "builtins.exec" in findings[0].message


def test_unknown_global_is_refused_as_unreadable(tmp_path: Path) -> None:
    torch.save(_state(), tmp_path / "good.bin")
    _rezip(
        tmp_path / "good.bin",
        tmp_path / "pytorch_model.bin",
        replace={"data.pkl": pickle.dumps({"x": Path("a")}, protocol=2)},
    )
    (tmp_path / "good.bin").unlink()
    findings = check(scan(tmp_path), model=False)
    assert [f.code for f in findings] == ["bin-unreadable"]
    assert "refused, not executed" in findings[0].message


def test_missing_storage_record(tmp_path: Path) -> None:
    torch.save(_state(), tmp_path / "good.bin")
    _rezip(tmp_path / "good.bin", tmp_path / "pytorch_model.bin", drop="/data/1")
    (tmp_path / "good.bin").unlink()
    shard = scan(tmp_path).shards[0]
    assert shard.names == ("a.weight", "c.bias")
    assert [(f.code, f.tensor) for f in shard.findings] == [("bin-record-missing", "b.weight")]


@pytest.mark.parametrize("cut", [10, 200, -30, -1])
def test_truncated_archive_is_one_finding(tmp_path: Path, cut: int) -> None:
    torch.save(_state(), tmp_path / "good.bin")
    data = (tmp_path / "good.bin").read_bytes()
    (tmp_path / "good.bin").unlink()
    (tmp_path / "pytorch_model.bin").write_bytes(data[:cut])
    findings = check(scan(tmp_path), model=False)
    assert [f.code for f in findings] == ["bin-unreadable"]


def test_legacy_stream_is_refused_in_one_line(tmp_path: Path) -> None:
    torch.save(_state(), tmp_path / "pytorch_model.bin", _use_new_zipfile_serialization=False)
    scanned = scan(tmp_path)
    findings = check(scanned, model=False)
    assert [f.code for f in findings] == ["bin-legacy-format"]
    assert "\n" not in findings[0].message and "torch.load" in findings[0].message
    assert scanned.shards[0].names == tuple(_state())  # listed from its pickles


def test_strided_views_are_placed_in_their_storage(tmp_path: Path) -> None:
    base = torch.arange(40, dtype=torch.float32).reshape(5, 8)
    torch.save({"t": base.t(), "row": base[2]}, tmp_path / "m.bin")
    root = local_location(tmp_path)
    shard = read_bin_shard(root / "m.bin", root=root)
    assert shard.shapes == [(8, 5), (8,)]
    assert shard.strides == {"t": (1, 8)}  # type: ignore[attr-defined]
    assert int(shard.begins[1]) - int(shard.begins[0]) == 2 * 8 * 4  # row 2 of the storage
    with tensor_data(scan(tmp_path)) as data:
        row = data.tensor_bytes("row")
        assert row is not None and bytes(row) == base[2].numpy().tobytes()
        t = data.tensor_bytes("t")  # gathered, never read as a row-major run
        assert t is not None and bytes(t) == base.t().contiguous().numpy().tobytes()


def test_safetensors_beside_bin_win(tmp_path: Path) -> None:
    src = GOLDEN / "transformers4" / "llama-single"
    shutil.copytree(src, tmp_path / "m")
    from safetensors.torch import save_file

    save_file({"x": torch.zeros(2)}, tmp_path / "m" / "model.safetensors")
    assert scan(tmp_path / "m").layout == "safetensors-single"


def test_training_args_bin_is_not_a_weight_file(tmp_path: Path) -> None:
    shutil.copytree(GOLDEN / "transformers4" / "llama-single", tmp_path / "m")
    buf = io.BytesIO()
    pickle.dump({"lr": 1e-3}, buf)
    (tmp_path / "m" / "training_args.bin").write_bytes(buf.getvalue())
    scanned = scan(tmp_path / "m")
    assert [s.file for s in scanned.shards] == ["pytorch_model.bin"]


@pytest.mark.parametrize("case", ["sharded-index-dangling", "sharded-shard-missing"])
def test_bin_index_findings_never_point_at_a_repair_that_writes_nothing(
    tmp_path: Path, case: str
) -> None:
    """`repair` rebuilds safetensors indexes only: an issue of a `.bin` folder whose fix
    says `repair` must name a repair that plans a write, never a no-op."""
    folder = tmp_path / case
    shutil.copytree(GOLDEN / "transformers4" / case, folder)
    ckpt = scan(str(folder))
    problems = group_problems(ckpt, check(ckpt, model=False))
    assert problems
    for problem in problems:
        if problem.action.kind == "repair":
            plan = plan_repair(ckpt, only=set(problem.action.parts))
            assert plan.writes, (problem.key, problem.action)
        else:
            assert "repair --only" not in problem.action.command, problem
