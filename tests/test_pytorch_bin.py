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


def test_the_archive_torch_reads_is_named_by_the_first_record(tmp_path: Path) -> None:
    """A zip holding two torch.save archives, `archive/sub/...` first, then `archive/...`:
    torch names the archive after the first record's path up to its first '/' and loads
    `archive/data.pkl`; the scan, the values and verify read those same bytes, never the
    other archive's (before: the first record ending in /data.pkl, `archive/sub`)."""
    from inspector import verify, write_manifest

    def records(obj: dict, name: str) -> list[tuple[str, bytes]]:
        raw = io.BytesIO()
        torch.save(obj, raw)
        with zipfile.ZipFile(io.BytesIO(raw.getvalue())) as z:
            return [
                (i.filename.replace("archive/", f"{name}/", 1), z.read(i)) for i in z.infolist()
            ]

    good = {"x.weight": torch.arange(8, dtype=torch.float32).reshape(2, 4)}
    other = {"x.weight": torch.full((2, 4), 666.0)}
    folder = tmp_path / "ckpt"
    folder.mkdir()
    path = folder / "pytorch_model.bin"
    torch.save(good, path)
    write_manifest(folder)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        for name, data in records(good, "archive/sub") + records(other, "archive"):
            z.writestr(name, data)
    assert torch.equal(torch.load(path, weights_only=True)["x.weight"], other["x.weight"])
    with tensor_data(scan(folder)) as data:
        stored = data.tensor_bytes("x.weight")
        assert stored is not None and bytes(stored) == other["x.weight"].numpy().tobytes()
    result = verify(folder, level="tensor")
    assert not result.ok and result.mismatches == 1, result.line()


# -- archives torch and other zip readers could read differently ------------------------------
# torch's reader (miniz, through caffe2's PyTorchStreamReader) is the authority: each hostile
# archive is either read exactly as torch.load reads it, or refused with a finding.


def _saved(state: dict[str, torch.Tensor]) -> bytes:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()


def _records(archive: bytes) -> list[tuple[str, bytes]]:
    with zipfile.ZipFile(io.BytesIO(archive)) as z:
        return [(i.filename, z.read(i)) for i in z.infolist()]


def _zipped(records: list[tuple[str, bytes]]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as z:
        for name, data in records:
            z.writestr(name, data)
    return buffer.getvalue()


def _as_torch_reads(folder: Path, data: bytes) -> tuple[str, list[str]]:
    """Write `data` as the folder's `.bin`; "refused" (with the findings' messages) when the
    scan refuses it, else "read", after checking every tensor's bytes are what torch.load
    gives. A file torch.load refuses, or reads other values of, must be refused."""
    folder.mkdir(exist_ok=True)
    path = folder / "pytorch_model.bin"
    path.write_bytes(data)
    scanned = scan(folder)
    refused = [f.message for f in scanned.read_findings if f.code == "bin-unreadable"]
    try:
        loaded = torch.load(io.BytesIO(data), weights_only=True)
    except Exception:
        assert refused, "torch.load refuses this file, the scan does not"
        return "refused", refused
    if refused:
        return "refused", refused
    assert scanned.shards[0].names == tuple(loaded)
    with tensor_data(scanned) as read:
        for name, t in loaded.items():
            got = read.tensor_bytes(name)
            want = t.contiguous().view(torch.uint8).numpy().tobytes()
            assert got is not None and bytes(got) == want, name
    return "read", []


_GOOD = {"x.weight": torch.arange(8, dtype=torch.float32).reshape(2, 4)}
_EVIL = {"x.weight": torch.full((2, 4), 666.0)}


def test_two_archives_one_after_the_other_are_refused(tmp_path: Path) -> None:
    """torch.load reads the first archive (miniz takes the directory offset the end record
    states), zipfile the second (it shifts offsets to where the directory really is)."""
    both = _saved(_GOOD) + _saved(_EVIL)
    assert torch.equal(
        torch.load(io.BytesIO(both), weights_only=True)["x.weight"], _GOOD["x.weight"]
    )
    verdict, why = _as_torch_reads(tmp_path / "ckpt", both)
    assert verdict == "refused" and "disagree" in why[0], why
    # the same with zip writers that write no zip64 records
    plain = _zipped(_records(_saved(_GOOD))) + _zipped(_records(_saved(_EVIL)))
    assert _as_torch_reads(tmp_path / "plain", plain)[0] == "refused"
    assert _as_torch_reads(tmp_path / "prefixed", b"J" * 100 + _saved(_GOOD))[0] == "refused"


def test_the_folder_is_the_first_records_as_torch_takes_it(tmp_path: Path) -> None:
    """`archive/sub/...` first, then `archive/...`: torch's folder is the first record's name
    up to its first '/', so it loads `archive/data.pkl`; before, the scan took the first
    record ending in /data.pkl (`archive/sub`) and `verify` said all match."""
    sub = [(n.replace("archive/", "archive/sub/", 1), d) for n, d in _records(_saved(_GOOD))]
    data = _zipped(sub + _records(_saved(_EVIL)))
    assert torch.load(io.BytesIO(data), weights_only=True)["x.weight"][0, 0] == 666.0
    # torch refuses the records of archive/sub/ no more than any other inside archive/
    assert _as_torch_reads(tmp_path / "a", data)[0] == "read"
    outside = [*_records(_saved(_GOOD)), ("other/data.pkl", b"x")]
    assert _as_torch_reads(tmp_path / "b", _zipped(outside))[0] == "refused"


def test_record_names_are_compared_as_torch_compares_them(tmp_path: Path) -> None:
    """miniz looks records up ignoring ASCII case: upper-case names are read, and two names
    equal but for case (torch takes whichever its sort finds) are refused."""
    records = _records(_saved(_GOOD))
    upper = [(n.split("/", 1)[0] + "/" + n.split("/", 1)[1].upper(), d) for n, d in records]
    assert _as_torch_reads(tmp_path / "upper", _zipped(upper))[0] == "read"
    evil = [(n.replace("data/0", "DATA/0"), d) for n, d in _records(_saved(_EVIL))]
    twice = records + [r for r in evil if r[0].endswith("DATA/0")]
    verdict, why = _as_torch_reads(tmp_path / "twice", _zipped(twice))
    assert verdict == "refused" and "twice" in why[0], why


@pytest.mark.parametrize(
    ("version", "verdict"),
    [
        (None, "refused"),
        (b"99\n", "refused"),
        (b"0\n", "refused"),
        (b"abc", "refused"),
        (b"-3", "refused"),
        (b"3 and more", "read"),
        (b" 10", "read"),
    ],
)
def test_the_format_version_is_checked_as_torch_checks_it(
    tmp_path: Path, version: bytes | None, verdict: str
) -> None:
    records = [
        (n, version if n.endswith("/version") else d)
        for n, d in _records(_saved(_GOOD))
        if version is not None or not n.endswith("/version")
    ]
    assert _as_torch_reads(tmp_path, _zipped(records))[0] == verdict  # type: ignore[arg-type]


@pytest.mark.parametrize("order", [b"big", b"little\n", b"", b"LITTLE", b" little"])
def test_a_byteorder_other_than_little_is_never_read_as_stored(
    tmp_path: Path, order: bytes
) -> None:
    """torch.load swaps every tensor of a "big" archive and refuses any record but "little"
    or "big": no value, hash or --deep result is taken from the stored bytes (before, the
    values table showed the unswapped values, and a record of "little\\n" or "" passed)."""
    records = [(n, order if n.endswith("/byteorder") else d) for n, d in _records(_saved(_GOOD))]
    folder = tmp_path / "ckpt"
    verdict, why = _as_torch_reads(folder, _zipped(records))
    assert verdict == "refused" and ("big-endian" in why[0] or "refuses" in why[0]), why
    scanned = scan(folder)
    findings = check(scanned, model=False, deep=True, values="full")
    assert [f.code for f in findings] == ["bin-unreadable"]
    assert scanned.values.empty  # no statistics of bytes torch does not load as stored
    with tensor_data(scanned) as read:
        assert read.tensor_bytes("x.weight") is None
