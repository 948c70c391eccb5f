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
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import xxhash

sys.path.insert(0, str(Path(__file__).parent))

from golden_manifest import FIXTURES, MANIFEST
from remote_servers import RangeHTTPServer

from inspector import verify, write_manifest
from inspector._internal.checkpoint.loaded import tensor_data
from inspector._internal.checks import check
from inspector._internal.cli.main import main
from inspector._internal.common.filenames import (
    BIN_INDEX_NAME,
    CONFIG_NAME,
    GENERATION_CONFIG_NAME,
    INDEX_NAME,
    SAFETENSORS_WEIGHTS_NAME,
)
from inspector._internal.diagnosis.issues import group_problems
from inspector._internal.load.verdict import load_verdict
from inspector._internal.plans.consolidate import engine as copy_engine
from inspector._internal.plans.consolidate import plan_consolidation
from inspector._internal.plans.repair import plan_repair
from inspector._internal.plans.reshard import plan_reshard
from inspector._internal.scan.entry import scan
from inspector.errors import PlanRefusedError

BIN_INDEX = BIN_INDEX_NAME
ST_INDEX = INDEX_NAME


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


# -- consolidate: .bin -> safetensors --------------------------------------------------------


@pytest.mark.parametrize(
    ("case", "files"),
    [
        ("torch-save/storage-layouts", [SAFETENSORS_WEIGHTS_NAME]),
        ("torch-save/state-dict", [CONFIG_NAME, SAFETENSORS_WEIGHTS_NAME]),
        (
            "transformers4/llama-single",
            [CONFIG_NAME, GENERATION_CONFIG_NAME, SAFETENSORS_WEIGHTS_NAME],
        ),
        (
            "transformers4/mixtral-sharded",
            [
                CONFIG_NAME,
                GENERATION_CONFIG_NAME,
                *(f"model-0000{i}-of-00008.safetensors" for i in range(1, 9)),
                ST_INDEX,
            ],
        ),
    ],
)
def test_consolidate_writes_every_bin_tensor_bit_exact(
    case: str, files: list[str], tmp_path: Path
) -> None:
    """Every tensor torch.load gives (strided, shared, 0-d, empty, every dtype) is written
    with its values byte for byte; one `.bin` file per output, `model.safetensors` alone."""
    dest = tmp_path / "out"
    plan = plan_consolidation(scan(FIXTURES / case), dest)
    result = plan.execute(progress=False, verify_data=True)
    assert result.ok and result.data_mismatches == ()
    assert sorted(p.name for p in dest.iterdir()) == sorted(files)
    tensors, meta = written(dest)
    expected = facts(case)
    aliases = {k: v for k, v in meta.items() if k != "format"}
    assert set(tensors) | set(aliases) == set(expected) and not set(tensors) & set(aliases)
    assert result.data_checked == len(tensors)
    for name, (_, shape, data) in tensors.items():
        assert shape == expected[name]["shape"], name
        assert hashlib.sha256(data).hexdigest() == expected[name]["sha256"], name
    assert loud(check(scan(dest), model=False)) == []
    if ST_INDEX in files:
        index = json.loads((dest / ST_INDEX).read_text())
        assert index["metadata"]["total_parameters"] == MANIFEST[case]["parameters"]


def test_cli_consolidate_keeps_the_bin_files_unless_a_size_is_given(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = str(FIXTURES / "transformers4" / "llama-sharded")
    assert main(["consolidate", src, str(tmp_path / "a"), "--no-progress", "--verify-data"]) == 0
    out = capsys.readouterr().out
    assert (
        "assignment: source .bin files" in out
        and "21 tensor hashes vs the source: all match" in out
    )
    assert len(list((tmp_path / "a").glob("model-0000?-of-00003.safetensors"))) == 3
    args = ["consolidate", src, str(tmp_path / "b"), "--no-progress", "--max-shard-size", "1MB"]
    assert main(args) == 0
    written = sorted(p.name for p in (tmp_path / "b").glob("*.safetensors"))
    assert written == [SAFETENSORS_WEIGHTS_NAME]
    assert not (tmp_path / "b" / ST_INDEX).exists()


def test_tied_head_left_out_as_safetensors_records_it(tmp_path: Path) -> None:
    """torch.save(model.state_dict()) keeps lm_head.weight on the embedding's storage: the
    output holds the embedding once, records the alias, and loads clean (tied); with
    tie_word_embeddings false both names are written, each its own copy."""
    config = json.loads((FIXTURES / "torch-save" / "state-dict" / CONFIG_NAME).read_text())
    # config.save_pretrained wrote no `architectures`: name the class so the load check runs.
    for tied in (True, False):
        src = tmp_path / f"src-{tied}"
        shutil.copytree(FIXTURES / "torch-save" / "state-dict", src)
        new = {**config, "architectures": ["LlamaForCausalLM"], "tie_word_embeddings": tied}
        (src / CONFIG_NAME).write_text(json.dumps(new))
        dest = tmp_path / f"out-{tied}"
        plan = plan_consolidation(scan(src), dest)
        assert plan.execute(progress=False, verify_data=True).ok
        tensors, meta = written(dest)
        scanned = scan(dest)
        verdict = load_verdict(scanned)  # transformers builds the model and ties its head
        assert verdict.skipped is None and not verdict.missing and not verdict.unexpected
        assert loud(check(scanned, verdict=verdict)) == [], tied
        if tied:
            assert plan.aliases == {"lm_head.weight": "model.embed_tokens.weight"}
            assert "tied: 1 name left out" in str(plan)
            assert meta == {"format": "pt", "lm_head.weight": "model.embed_tokens.weight"}
            assert "lm_head.weight" not in tensors
        else:
            assert plan.aliases == {} and meta == {"format": "pt"}
            assert tensors["lm_head.weight"][2] == tensors["model.embed_tokens.weight"][2]


def test_strided_views_are_gathered_block_by_block(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tiny block forces many blocks per view: each one's rows are gathered from the
    storage exactly (and a cast applies to the gathered values)."""
    state = views()
    torch.save(state, tmp_path / "pytorch_model.bin")
    monkeypatch.setattr(copy_engine, "BLOCK_BYTES", 24)
    plan = plan_consolidation(scan(tmp_path), tmp_path / "out")
    strided = sorted(t.name for o in plan.outputs for t in o.tensors if not t.contiguous)
    assert strided == ["every_third", "expanded", "fused.t", "half.t", "k.weight", "permuted"]
    assert plan.execute(progress=False, verify_data=True).ok
    tensors, _ = written(tmp_path / "out")
    assert {n: tensors[n][2] for n in state} == {n: raw(t) for n, t in state.items()}
    cast = plan_consolidation(scan(tmp_path), tmp_path / "bf16", dtype="bf16")
    assert cast.execute(progress=False, verify_data=True).ok
    tensors, _ = written(tmp_path / "bf16")
    assert tensors["fused.t"][2] == raw(state["fused.t"].to(torch.bfloat16))


def test_conversion_refused_where_the_output_could_not_be_the_model(tmp_path: Path) -> None:
    with pytest.raises(PlanRefusedError, match="bin-legacy-format"):
        plan_consolidation(scan(FIXTURES / "torch-save" / "legacy-non-zip"), tmp_path / "a")
    missing = FIXTURES / "transformers4" / "sharded-shard-missing"
    with pytest.raises(PlanRefusedError, match=r"index-missing-file.*repair --only index"):
        plan_consolidation(scan(missing), tmp_path / "b")
    torch.save({"z": torch.zeros(2, dtype=torch.complex128)}, tmp_path / "c.bin")
    with pytest.raises(PlanRefusedError, match=r"z \(complex128\)"):
        plan_consolidation(scan(tmp_path), tmp_path / "c")


# -- repair --only reshard: the conversion in place ------------------------------------------


def test_reshard_of_a_source_cut_while_it_is_copied_changes_nothing(
    tmp_path: Path,
    cut_on_open: Callable[[Path], dict[str, int]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Another process cuts a `.bin` shard in half as soon as the re-shard opens it: the copy
    comes back short. One line names the shard, where it ended and what to do; the staged
    output is removed and the folder holds what it held (nothing moved, nothing new)."""
    folder = tmp_path / "llama"
    shutil.copytree(FIXTURES / "transformers4/llama-sharded", folder)
    before = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*"))
    cut = cut_on_open(folder)
    assert main(["repair", str(folder), "--only", "reshard", "--yes"]) == 2
    ((file, at),) = cut.items()
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(folder / file) in err, err
    assert f"the file ended at byte {at:,}: it got shorter while it was read" in err
    assert copy_engine.AGAIN in err
    after = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*"))
    assert after == before


def test_repair_reshard_converts_a_bin_folder_in_place(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    case = "transformers4/llama-sharded"
    folder = tmp_path / "llama"
    shutil.copytree(FIXTURES / case, folder)
    assert main(["repair", str(folder), "--only", "reshard", "--yes"]) == 0
    out = capsys.readouterr().out
    assert "no index: one file" in out and "re-check: no findings" in out
    names = sorted(p.name for p in folder.iterdir() if not p.name.startswith("."))
    assert names == [CONFIG_NAME, GENERATION_CONFIG_NAME, SAFETENSORS_WEIGHTS_NAME]
    backup = next((folder / ".ckpt-inspect-backup").iterdir())
    assert sorted(p.name for p in backup.iterdir()) == sorted(
        [BIN_INDEX, *(f"pytorch_model-0000{i}-of-00003.bin" for i in (1, 2, 3))]
    )
    tensors, _ = written(folder)
    expected = facts(case)
    assert {n: hashlib.sha256(t[2]).hexdigest() for n, t in tensors.items()} == {
        n: t["sha256"] for n, t in expected.items()
    }
    # With a size limit: several shards and their index, greedy in model order.
    folder = tmp_path / "tied"
    shutil.copytree(FIXTURES / "torch-save" / "state-dict", folder)
    plan = plan_reshard(scan(folder), max_shard_size="10kB")
    assert len(plan.copy.outputs) == 3 and plan.index is not None  # type: ignore[union-attr]
    result = plan.execute()
    assert loud(list(result.remaining or ())) == []
    assert json.loads((folder / ST_INDEX).read_text())["metadata"]["total_parameters"] == 5712


# -- repair --only index on pytorch_model.bin.index.json -------------------------------------


def test_drifted_bin_index_is_rebuilt_from_the_files(tmp_path: Path) -> None:
    """Entries pointing at the wrong file, a dropped entry and a name no file holds: the
    rebuilt index is the one transformers wrote."""
    folder = tmp_path / "llama"
    shutil.copytree(FIXTURES / "transformers4" / "llama-sharded", folder)
    original = json.loads((folder / BIN_INDEX).read_text())
    drifted = json.loads(json.dumps(original))
    wmap = drifted["weight_map"]
    wmap["model.norm.weight"] = "pytorch_model-00001-of-00003.bin"
    del wmap["model.layers.0.mlp.up_proj.weight"]
    wmap["model.layers.9.mlp.up_proj.weight"] = "pytorch_model-00002-of-00003.bin"
    (folder / BIN_INDEX).write_text(json.dumps(drifted, indent=2))
    scanned = scan(folder)
    before = {f.code for f in check(scanned, model=False)}
    assert {"index-wrong-file", "unindexed-tensor", "index-dangling-tensor"} <= before
    problem = next(p for p in group_problems(scanned, check(scanned)) if p.key == "index-stale")
    assert problem.action.command.endswith("--only index")
    plan = plan_repair(scanned, only=set(problem.action.parts))
    assert [w.path for w in plan.writes] == [BIN_INDEX]
    result = plan.execute()
    assert loud(list(result.remaining or ())) == []
    assert json.loads((folder / BIN_INDEX).read_text()) == original


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


def test_verify_hashes_strided_and_shared_bin_tensors(tmp_path: Path) -> None:
    """Tensor hashes of a `.bin` folder are those of the values torch.load gives, so the
    folder and its safetensors conversion verify against each other, tensor by tensor."""
    src = tmp_path / "bin"
    torch.save(views(), tmp_path / "x.bin")
    src.mkdir()
    (tmp_path / "x.bin").rename(src / "pytorch_model.bin")
    manifest = json.loads(write_manifest(src).read_text())
    for name, t in views().items():
        assert manifest["tensors"][name]["hash"] == xxhash.xxh3_128(raw(t)).hexdigest(), name
    plan_consolidation(scan(src), tmp_path / "st").execute(progress=False)
    for a, b in ((tmp_path / "st", src), (src, tmp_path / "st")):
        result = verify(a, against=str(b), level="tensor")
        assert result.ok and result.findings == (), [f.message for f in result.findings]
    # A legacy stream's data is never read: its tensors have no hash, never that of no bytes.
    legacy = tmp_path / "legacy"
    shutil.copytree(FIXTURES / "torch-save" / "legacy-non-zip", legacy)
    records = json.loads(write_manifest(legacy).read_text())["tensors"]
    assert records and {r["hash"] for r in records.values()} == {None}


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
    served: tuple[Path, dict[str, torch.Tensor]], range_server: RangeHTTPServer
) -> None:
    """The tail (end record and directory), the pickle and the local headers in merged
    windows: a handful of requests and a few hundred KB for a file of 300+ records, not a
    request per record nor the file."""
    folder, state = served
    local = scan(folder).shards[0]
    with range_server.serving(folder.parent) as server:
        there = scan(f"{server.url}/model/")
        requests, sent = server.requests, server.content_bytes
    shard = there.shards[0]
    assert shard.names == local.names == tuple(state) and not shard.findings
    assert shard.begins.tolist() == local.begins.tolist()
    assert shard.ends.tolist() == local.ends.tolist()
    size = (folder / "pytorch_model.bin").stat().st_size
    assert requests <= 12, requests
    assert sent < size // 10, (sent, size)


def test_remote_bin_views_are_read_and_converted_exactly(
    served: tuple[Path, dict[str, torch.Tensor]], tmp_path: Path, range_server: RangeHTTPServer
) -> None:
    folder, state = served
    with range_server.serving(folder.parent) as server:
        there = scan(f"{server.url}/model/")
        before = server.content_bytes
        with tensor_data(there) as data:
            sparse = data.tensor_bytes("sparse")
            fetched = server.content_bytes - before
            got = {n: bytes(data.tensor_bytes(n) or b"-") for n in views()}
        assert sparse is not None and bytes(sparse) == raw(state["sparse"])
        assert fetched < 4096, fetched  # the runs holding 11 values, not the 4 MB storage
        assert got == {n: raw(state[n]) for n in views()}
        result = plan_consolidation(there, tmp_path / "out").execute(progress=False)
    assert result.ok
    tensors, _ = written(tmp_path / "out")
    assert {n: t[2] for n, t in tensors.items()} == {n: raw(t) for n, t in state.items()}
