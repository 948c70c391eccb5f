"""Consolidation of REAL DCP-sharded checkpoints (torch's HuggingFaceStorageWriter, 2 gloo ranks)
into Hugging Face checkpoints, compared tensor by tensor with what was saved and byte by byte
with PyTorch's own consolidation."""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
import shutil
import subprocess
import sys
import typing
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from dcp_writers import MAPPING, full_tensors
from safetensors.torch import load_file, save_file

from inspector import ConsolidationOptions, consolidate
from inspector._internal.checks import check
from inspector._internal.cli.main import main
from inspector._internal.common.filenames import CONFIG_NAME, INDEX_NAME
from inspector._internal.common.units import parse_size
from inspector._internal.formats.casting import cast_bytes
from inspector._internal.plans.consolidate import engine as copy_engine
from inspector._internal.plans.consolidate import plan_consolidation, reference_assignment
from inspector._internal.plans.consolidate.plan import ConsolidationPlan
from inspector._internal.plans.consolidate.records import Execution
from inspector._internal.scan.entry import scan
from inspector.errors import InspectorError, PlanRefusedError

FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
TORCH_DTYPE = {
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "F32": torch.float32,
    "F64": torch.float64,
}
ITEM = {"F16": 2, "BF16": 2, "F32": 4, "F64": 8}


@pytest.fixture(scope="module")
def source(dcp_checkpoint: Path) -> Path:
    """The 2-rank DCP checkpoint of the test run (conftest `dcp_checkpoint`), read only."""
    return dcp_checkpoint


@pytest.fixture
def copy_without_mapping(source: Path, tmp_path: Path) -> Path:
    """The source without `.hf_metadata/fqn_to_file_index_mapping.json` (no assignment given)."""
    src = tmp_path / "model"
    shutil.copytree(source, src)
    (src / ".hf_metadata" / "fqn_to_file_index_mapping.json").unlink()
    return src


def load_all(folder: Path) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for file in sorted(folder.glob("*.safetensors")):
        out.update(load_file(file))
    return out


def raw(t: torch.Tensor) -> bytes:
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


# -- the main path -------------------------------------------------------------------------


def test_output_equals_saved_tensors_for_every_dtype(source: Path, tmp_path: Path) -> None:
    dest = tmp_path / "out"
    plan = plan_consolidation(scan(source), dest)
    result = plan.execute(progress=False, verify_data=True)

    saved = full_tensors()
    got = load_all(dest)
    assert set(got) == set(saved)
    for name, tensor in saved.items():
        assert got[name].dtype == tensor.dtype, name
        assert torch.equal(got[name], tensor), name
    # The mapping decided the files; the index says so and counts bytes and parameters.
    index = json.loads((dest / INDEX_NAME).read_text())
    expected_files = {n: f"model-{i:05d}-of-00002.safetensors" for n, i in MAPPING.items()}
    assert index["weight_map"] == expected_files
    assert index["metadata"]["total_size"] == sum(
        t.numel() * t.element_size() for t in saved.values()
    )
    assert index["metadata"]["total_parameters"] == sum(t.numel() for t in saved.values())
    # Public metadata copied, the run's mapping not; nothing half-written left behind.
    assert json.loads((dest / CONFIG_NAME).read_text())["model_type"] == "qwen3_moe"
    assert not (dest / "fqn_to_file_index_mapping.json").exists()
    assert not list(dest.glob("*.partial"))
    assert result.ok and result.verified and result.findings == ()
    assert result.data_checked == len(saved) and result.data_mismatches == ()
    assert sorted(result.written) == [
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
    ]


def test_column_sharded_tensors_are_assembled_in_row_blocks(
    source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A tiny block forces several blocks per tensor: the block arithmetic must still be exact.
    monkeypatch.setattr(copy_engine, "BLOCK_BYTES", 40)
    plan = plan_consolidation(scan(source), tmp_path / "out")
    assembled = [t.name for o in plan.outputs for t in o.tensors if not t.contiguous]
    assert "model.layers.0.self_attn.q_proj.weight" in assembled
    assert "model.embed_tokens.weight" not in assembled  # row-sharded: plain byte ranges
    plan.execute(progress=False, verify=False, workers=2)
    got = load_all(tmp_path / "out")
    for name, tensor in full_tensors().items():
        assert torch.equal(got[name], tensor), name


def test_float_tensors_byte_identical_to_torch_consolidation(source: Path, tmp_path: Path) -> None:
    from torch.distributed.checkpoint._consolidate_hf_safetensors import (
        consolidate_safetensors_files,
    )

    saved = full_tensors()
    # PyTorch 2.13 sizes every dtype with torch.finfo: integer and bool tensors raise.
    (tmp_path / "torch-all").mkdir()
    with pytest.raises(TypeError):
        consolidate_safetensors_files(str(source), str(tmp_path / "torch-all"), MAPPING)
    floats = {n: i for n, i in MAPPING.items() if saved[n].dtype in FLOATS}
    (tmp_path / "torch").mkdir()
    consolidate_safetensors_files(str(source), str(tmp_path / "torch"), floats)

    plan_consolidation(scan(source), tmp_path / "ours").execute(progress=False, verify=False)
    theirs = load_all(tmp_path / "torch")
    ours = load_all(tmp_path / "ours")
    assert set(theirs) == set(floats)
    for name in floats:
        assert ours[name].shape == theirs[name].shape
        if saved[name].dim() == 0:
            # Torch 2.13 leaves 0-d tensors as zero bytes; ours holds the saved value.
            assert raw(theirs[name]) == bytes(saved[name].element_size())
            assert raw(ours[name]) == raw(saved[name]) != raw(theirs[name])
        else:
            assert raw(ours[name]) == raw(theirs[name]), name


def test_other_dtypes_from_a_single_process_writer(tmp_path: Path) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import HuggingFaceStorageWriter

    gen = torch.Generator().manual_seed(7)
    state = {
        "w.i64": torch.randint(-(2**40), 2**40, (6, 4), generator=gen),
        "w.u8": torch.randint(0, 255, (5, 3), generator=gen).to(torch.uint8),
        "w.i16": torch.randint(-300, 300, (2, 2), generator=gen).to(torch.int16),
        "w.f8": torch.randn(4, 4, generator=gen).to(torch.float8_e4m3fn),
        "w.f16": torch.randn(3, 5, generator=gen).half(),
        "w.f64": torch.randn(7, generator=gen).double(),
        # Packed 4-bit floats (two per byte), stored by torch as safetensors F4.
        "w.f4": torch.randint(0, 255, (4, 4), generator=gen, dtype=torch.uint8).view(
            torch.float4_e2m1fn_x2
        ),
    }
    src = tmp_path / "src"
    writer = HuggingFaceStorageWriter(
        str(src), fqn_to_index_mapping=dict.fromkeys(state, 1), save_distributed=True
    )
    with pytest.warns(UserWarning):  # torch notes it saves without a process group
        dcp.save(state, storage_writer=writer, no_dist=True)
    scanned = scan(src)
    assert scanned.dcp.chunks["w.f4"][0].dtype == "F4"
    plan = plan_consolidation(scanned, tmp_path / "out", dtype="bf16")
    result = plan.execute(progress=False, verify_data=True)
    got = load_all(tmp_path / "out")
    for name, tensor in state.items():
        if tensor.dtype in (torch.float16, torch.float64):
            assert raw(got[name]) == raw(tensor.to(torch.bfloat16)), name
        else:  # integers and FP8 are copied untouched by a cast
            assert got[name].dtype == tensor.dtype and raw(got[name]) == raw(tensor), name
    assert result.ok and result.data_mismatches == ()


# -- dtype casts ---------------------------------------------------------------------------


@pytest.mark.parametrize("target", ["bf16", "fp16", "fp32"])
def test_cast_changes_floating_tensors_only(source: Path, tmp_path: Path, target: str) -> None:
    want = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[target]
    plan = plan_consolidation(scan(source), tmp_path / "out", dtype=target)
    result = plan.execute(progress=False, verify_data=True)
    got = load_all(tmp_path / "out")
    for name, tensor in full_tensors().items():
        if tensor.dtype in FLOATS:
            assert got[name].dtype == want, name
            assert raw(got[name]) == raw(tensor.to(want)), name
        else:
            assert got[name].dtype == tensor.dtype and torch.equal(got[name], tensor), name
    assert result.ok, result.describe()
    index = json.loads((tmp_path / "out" / INDEX_NAME).read_text())
    assert index["metadata"]["total_size"] == plan.total_size


def _torch_bits(data: np.ndarray, src: str, dst: str) -> np.ndarray:
    tensor = torch.frombuffer(bytearray(data.tobytes()), dtype=TORCH_DTYPE[src])
    return tensor.to(TORCH_DTYPE[dst]).view(torch.uint8).numpy()


@pytest.mark.parametrize("src", ["F16", "BF16", "F32", "F64"])
@pytest.mark.parametrize("dst", ["F16", "BF16", "F32", "F64"])
def test_cast_bytes_bit_exact_against_torch(src: str, dst: str) -> None:
    rng = np.random.default_rng(ITEM[src] * 10 + ITEM[dst])
    # Random bit patterns hit NaN, Inf, subnormals and ties; add the edge values explicitly.
    specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 65504.0, 65520.0, 1e-40, 6e-8, 3e38])
    for n in (4099, 7):
        data = rng.integers(0, 256, size=n * ITEM[src], dtype=np.uint8)
        if src != "BF16":
            with np.errstate(over="ignore"):  # 65520 and 3e38 overflow F16 on purpose
                edge = specials.astype(f"<f{ITEM[src]}")
            data = np.concatenate([edge.view(np.uint8), data])
        ours = cast_bytes(data, src, dst).view(f"<u{ITEM[dst]}")
        theirs = _torch_bits(data, src, dst).view(f"<u{ITEM[dst]}")
        nan = np.isnan(_torch_values(theirs, dst))
        # Non-NaN results must match bit for bit; NaN only as NaN where torch's own payload
        # depends on the element's position (its scalar tail path differs from the vector one).
        assert np.array_equal(ours[~nan], theirs[~nan]), (src, dst, n)
        assert np.isnan(_torch_values(ours, dst)[nan]).all()
        if (src, dst) in {("F32", "BF16"), ("F32", "F16"), ("BF16", "F16"), ("F16", "BF16")}:
            assert np.array_equal(ours, theirs), (src, dst, n)


def _torch_values(bits: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "BF16":
        return (bits.astype(np.uint32) << 16).view(np.float32)
    return bits.view({"F16": "<f2", "F32": "<f4", "F64": "<f8"}[dtype])


# -- where each tensor goes ----------------------------------------------------------------


def test_explicit_mapping_wins_over_the_runs_mapping(source: Path, tmp_path: Path) -> None:
    names = list(full_tensors())
    mapping = {n: 1 + k % 3 for k, n in enumerate(names)}
    (tmp_path / "map.json").write_text(json.dumps(mapping))
    plan = plan_consolidation(scan(source), tmp_path / "out", mapping=tmp_path / "map.json")
    assert plan.assignment.startswith("mapping") and "map.json" in plan.assignment
    expected = {n: f"model-{i:05d}-of-00003.safetensors" for n, i in mapping.items()}
    assert plan.weight_map == expected
    plan.execute(progress=False)
    assert json.loads((tmp_path / "out" / INDEX_NAME).read_text())["weight_map"] == dict(
        sorted(expected.items())
    )


def _reference(folder: Path, names: dict[int, str]) -> Path:
    """A real HF checkpoint split like MAPPING, its files named by `names[index]`."""
    folder.mkdir()
    saved = full_tensors()
    weight_map = {}
    for index, file in names.items():
        part = {n: saved[n].contiguous() for n, i in MAPPING.items() if i == index}
        save_file(part, folder / file)
        weight_map.update(dict.fromkeys(part, file))
    doc = {"metadata": {"total_size": 0}, "weight_map": weight_map}
    (folder / INDEX_NAME).write_text(json.dumps(doc))
    return folder


def test_reference_names_of_automodel_2289_keep_their_file_count(
    copy_without_mapping: Path, tmp_path: Path
) -> None:
    # Names that a "find the model token" parser read as file 1 every time, collapsing the
    # output into one file; the index comes from -NNNNN-of-NNNNN.safetensors instead.
    names = {
        1: "model.safetensors-00001-of-00002.safetensors",
        2: "model.safetensors-00002-of-00002.safetensors",
    }
    ref = _reference(tmp_path / "ref", names)
    scanned = scan(copy_without_mapping)
    for reference in (ref, ref / INDEX_NAME):
        plan = plan_consolidation(scanned, tmp_path / "out", reference=reference)
        assert plan.assignment.startswith("reference")
        assert len(plan.outputs) == 2
        assert plan.weight_map == {
            n: f"model-{i:05d}-of-00002.safetensors" for n, i in MAPPING.items()
        }
    # Without its index, the reference's shard headers say the same.
    (ref / INDEX_NAME).unlink()
    table, label = reference_assignment(ref)
    assert table == MAPPING and "shard headers" in label


def test_reference_without_numbered_names_falls_back_to_sorted_order(tmp_path: Path) -> None:
    ref = _reference(tmp_path / "ref", {1: "a-embed.safetensors", 2: "b-rest.safetensors"})
    table, _ = reference_assignment(ref / INDEX_NAME)
    assert table == MAPPING
    ref2 = _reference(tmp_path / "ref2", {1: "z.safetensors", 2: "m.safetensors"})
    table2, _ = reference_assignment(ref2)
    assert table2 == {n: 3 - i for n, i in MAPPING.items()}  # sorted: m before z


def test_greedy_packing_follows_huggingface_hub(copy_without_mapping: Path, tmp_path: Path) -> None:
    from huggingface_hub import split_torch_state_dict_into_shards

    scanned = scan(copy_without_mapping)
    saved = full_tensors()
    plan = plan_consolidation(scanned, tmp_path / "out", max_shard_size=4000)
    assert plan.assignment.startswith("greedy")
    in_key_order = {n: saved[n] for n in scanned.dcp.chunks}
    hub = split_torch_state_dict_into_shards(in_key_order, max_shard_size=4000)
    hub_groups = sorted(sorted(v) for v in hub.filename_to_tensors.values())
    assert sorted(sorted(t.name for t in o.tensors) for o in plan.outputs) == hub_groups
    assert len(plan.outputs) > 2
    # The embedding (4 KB of bf16) is over the limit, so it gets a file of its own.
    alone = [o for o in plan.outputs if o.tensors[0].name == "model.embed_tokens.weight"]
    assert len(alone) == 1 and len(alone[0].tensors) == 1
    plan.execute(progress=False)
    got = load_all(tmp_path / "out")
    assert all(torch.equal(got[n], t) for n, t in saved.items())


def test_parse_size_uses_decimal_units() -> None:
    assert parse_size("5GB") == 5 * 10**9
    assert parse_size("5GiB") == 5 * 2**30
    assert parse_size("500MB") == 500 * 10**6
    assert parse_size("1.5KB") == 1500
    assert parse_size(1234) == 1234
    for bad in ("5 parsecs", "", "-1GB", 0):
        with pytest.raises(ValueError):
            parse_size(bad)


# -- crash safety and refusals -------------------------------------------------------------


def test_resume_keeps_complete_outputs_and_redoes_partial_ones(
    source: Path, tmp_path: Path
) -> None:
    dest = tmp_path / "out"
    plan = plan_consolidation(scan(source), dest)
    plan.execute(progress=False, verify=False)
    first, second = (dest / o.name for o in plan.outputs)
    inode = first.stat().st_ino
    # A crash while writing output 2: only its .partial exists, and no index yet.
    second.rename(second.with_name(second.name + ".partial"))
    with open(second.with_name(second.name + ".partial"), "r+b") as fh:
        fh.truncate(100)
    (dest / INDEX_NAME).unlink()

    result = plan.execute(resume=True, progress=False)
    assert result.skipped == (first.name,) and result.written == (second.name,)
    assert first.stat().st_ino == inode  # untouched
    assert not list(dest.glob("*.partial"))
    assert result.ok
    got = load_all(dest)
    assert all(torch.equal(got[n], t) for n, t in full_tensors().items())


def test_resume_rewrites_an_output_whose_header_differs(source: Path, tmp_path: Path) -> None:
    dest = tmp_path / "out"
    plan_consolidation(scan(source), dest).execute(progress=False, verify=False)
    before = {p.name: p.read_bytes() for p in dest.iterdir()}
    # Same names, other dtype: the old files have the right names but not the planned header,
    # so they are not this plan's output: refused, untouched, unless --overwrite.
    plan = plan_consolidation(scan(source), dest, dtype="fp32")
    with pytest.raises(PlanRefusedError, match="--overwrite") as info:
        plan.execute(resume=True, progress=False)
    assert "model-00001-of-00002.safetensors (other content" in str(info.value)
    assert {p.name: p.read_bytes() for p in dest.iterdir()} == before
    result = plan.execute(resume=True, overwrite=True, progress=False)
    assert result.skipped == () and len(result.written) == 2
    assert load_all(dest)["model.norm.weight"].dtype == torch.float32
    # Every replaced file kept, byte for byte; config.json (same content) was not replaced.
    assert result.backup is not None and result.backup.parent == dest / ".ckpt-inspect-backup"
    kept = {p.name: p.read_bytes() for p in result.backup.iterdir()}
    assert kept == {n: b for n, b in before.items() if n != CONFIG_NAME}
    assert f"the originals are in {result.backup}" in str(result)


def test_refuses_a_source_with_a_missing_rank_file(source: Path, tmp_path: Path) -> None:
    src = tmp_path / "model"
    shutil.copytree(source, src)
    (src / "shard-00002-model-00002-of-00002.safetensors").unlink()
    with pytest.raises(PlanRefusedError, match="dcp-coverage-gap") as info:
        plan_consolidation(scan(src), tmp_path / "out")
    assert "re-save" in str(info.value)
    assert not (tmp_path / "out").exists()


def test_refuses_dest_equal_to_source_and_non_dcp_input(source: Path, tmp_path: Path) -> None:
    with pytest.raises(PlanRefusedError, match="source folder"):
        plan_consolidation(scan(source), source)
    hf = _reference(
        tmp_path / "hf",
        {1: "model-00001-of-00002.safetensors", 2: "model-00002-of-00002.safetensors"},
    )
    with pytest.raises(PlanRefusedError, match="not DCP-sharded"):
        plan_consolidation(scan(hf), tmp_path / "out")
    with pytest.raises(PlanRefusedError, match="target dtype"):
        plan_consolidation(scan(source), tmp_path / "out", dtype="int4")


def test_mapping_that_omits_tensors_puts_them_in_the_last_file(
    source: Path, tmp_path: Path
) -> None:
    names = list(full_tensors())
    mapping = {n: 1 for n in names[:3]} | {"model.tied.weight": 2, names[3]: 2}
    plan = plan_consolidation(scan(source), tmp_path / "out", mapping=mapping)
    last = plan.outputs[-1]
    assert {t.name for t in last.tensors} == set(names[3:])
    text = str(plan)
    assert f"{len(names) - 4} tensors absent from the mapping" in text
    assert "model.tied.weight" in text  # the dangling name is reported, not written


# -- the command line ----------------------------------------------------------------------


def test_cli_dry_run_prints_the_plan_and_writes_nothing(
    source: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dest = tmp_path / "out"
    assert main(["consolidate", str(source), str(dest), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "Consolidation plan" in out and "model-00002-of-00002.safetensors" in out
    assert "fqn_to_file_index_mapping.json" in out  # the reason names its source
    assert not dest.exists()
    code = main(
        ["consolidate", str(source), str(dest), "--no-progress", "--verify-data", "--dtype", "fp32"]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    assert "verify data: 15 tensor hashes vs the source: all match" in out
    assert load_all(dest)["model.embed_tokens.weight"].dtype == torch.float32


def test_cli_refusal_is_a_clean_error(
    source: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["consolidate", str(source), str(source)]) == 2
    assert "DEST is the source folder" in capsys.readouterr().err


def test_progress_bar_counts_every_byte(
    source: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = plan_consolidation(scan(source), tmp_path / "out")
    result = plan.execute(progress=True, verify=False)
    assert result.bytes_written == sum(o.size for o in plan.outputs)
    assert (
        sum(os.path.getsize(tmp_path / "out" / o.name) for o in plan.outputs)
        == result.bytes_written
    )
    assert "consolidate" in capsys.readouterr().err  # tqdm writes its bar to stderr


def test_refuses_truncated_shards_and_links_out_of_the_folder(source: Path, tmp_path: Path) -> None:
    src = tmp_path / "model"
    shutil.copytree(source, src)
    victim = src / "shard-00001-model-00002-of-00002.safetensors"
    with open(victim, "r+b") as fh:  # a rank's write cut short
        fh.truncate(victim.stat().st_size - 3)
    with pytest.raises(PlanRefusedError, match="file-truncated"):
        plan_consolidation(scan(src), tmp_path / "out")
    # The intact file, moved out and linked back: never read through the link.
    shutil.copyfile(source / victim.name, tmp_path / "elsewhere.safetensors")
    victim.unlink()
    victim.symlink_to(tmp_path / "elsewhere.safetensors")
    with pytest.raises(PlanRefusedError, match="outside"):
        plan_consolidation(scan(src), tmp_path / "out")


def test_one_call_consolidate_for_notebooks(source: Path, tmp_path: Path) -> None:
    from inspector._internal.plans.consolidate import consolidate

    result = consolidate(source, tmp_path / "out", progress=False, dtype="bf16", workers=2)
    assert result.ok and len(result.written) == 2
    got = load_all(tmp_path / "out")
    assert got["model.layers.0.input_layernorm.weight"].dtype == torch.bfloat16
    assert torch.equal(
        got["model.layers.0.mlp.gate.expert_counts"],
        full_tensors()["model.layers.0.mlp.gate.expert_counts"],
    )
    assert "wrote 2 files" in str(result)


def test_verify_data_catches_a_flipped_byte(source: Path, tmp_path: Path) -> None:
    dest = tmp_path / "out"
    plan = plan_consolidation(scan(source), dest)
    plan.execute(progress=False, verify=False)
    # Resume trusts header and size; only the content hashes can see a damaged byte.
    target = plan.outputs[0]
    tensor = target.tensors[0]
    where = len(target.header) + tensor.begin
    with open(dest / target.name, "r+b") as fh:
        fh.seek(where)
        byte = fh.read(1)[0]
        fh.seek(where)
        fh.write(bytes([byte ^ 0xFF]))
    result = plan.execute(resume=True, progress=False, verify_data=True)
    assert result.written == () and len(result.skipped) == 2
    assert result.data_mismatches == (tensor.name,)
    assert not result.ok and f"1 mismatch: {tensor.name}" in str(result)


def test_copy_without_copy_file_range_gives_the_same_files(
    source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plan = plan_consolidation(scan(source), tmp_path / "kernel")
    plan.execute(progress=False, verify=False)
    # Across file systems the kernel copy fails with EXDEV; then pread/pwrite do the work.
    monkeypatch.setitem(copy_engine._KERNEL_COPY, "ok", False)
    other = plan_consolidation(scan(source), tmp_path / "blocks")
    other.execute(progress=False, verify=False)
    for output in plan.outputs:
        kernel = (tmp_path / "kernel" / output.name).read_bytes()
        assert kernel == (tmp_path / "blocks" / output.name).read_bytes()


# A source shard cut short by another process while its column chunks are copied: the first
# chunk of a file is read whole, then the file is truncated to nothing before its next chunk.
# Run as the CLI in a child process, so a signal ends the child, not the test run.
_CUT_WHILE_COPIED = """
import os, sys
from inspector._internal.cli.main import main
from inspector._internal.plans.consolidate import engine

src, dest = sys.argv[1], sys.argv[2]
real = engine._rows_of
seen = set()

def cutting(piece, rows, item):
    found = real(piece, rows, item)
    if found is not None:
        if piece.file in seen and "cut" not in seen:
            os.truncate(os.path.join(src, piece.file), 0)
            seen.add("cut")
        seen.add(piece.file)
    return found

engine._rows_of = cutting
sys.exit(main(["consolidate", src, dest, "--no-progress"]))
"""


def test_source_cut_while_its_columns_are_copied_fails_cleanly_instead_of_dying(
    source: Path, tmp_path: Path
) -> None:
    """Column chunks were copied out of a memory map of the source shard: a shard truncated
    by another process meanwhile killed the process with SIGBUS (no message, the half-written
    output left behind). Read with `preadv` the read comes back short: one line names the
    shard, where it ended and what to do, exit 2, and DEST holds no partial output."""
    src = tmp_path / "model"
    shutil.copytree(source, src)
    dest = tmp_path / "out"
    run = subprocess.run(
        [sys.executable, "-c", _CUT_WHILE_COPIED, str(src), str(dest)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 2, f"exit {run.returncode}: {run.stderr[-2000:]}"
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1, run.stderr
    cut = [p.name for p in src.glob("*.safetensors") if p.stat().st_size == 0]
    assert len(cut) == 1
    assert str(src / cut[0]) in lines[0]
    assert "the file ended at byte 0: it got shorter while it was read" in lines[0]
    assert copy_engine.AGAIN in lines[0]
    assert not list(dest.glob("*.partial")) and not (dest / INDEX_NAME).exists()


@pytest.mark.parametrize("kernel", [True, False], ids=["copy_file_range", "pread"])
def test_source_cut_while_its_bytes_are_copied_leaves_no_partial_output(
    source: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    cut_on_open: Callable[[Path], dict[str, int]],
    kernel: bool,
) -> None:
    """A source shard that another process cuts in half as soon as the copy opens it: the
    byte copy (the kernel's, or blocks read and written) comes back short. The plan's execute
    raises the project's error naming the shard, the byte where it ended and what to do; the
    partial output is removed and nothing gets a final name."""
    src = tmp_path / "model"
    shutil.copytree(source, src)
    monkeypatch.setitem(copy_engine._KERNEL_COPY, "ok", kernel)
    cut = cut_on_open(src)
    plan = plan_consolidation(scan(src), tmp_path / "out")
    with pytest.raises(InspectorError) as raised:
        plan.execute(progress=False, verify=False)
    ((file, at),) = cut.items()
    message = str(raised.value)
    assert "\n" not in message and str(src / file) in message, message
    assert f"the file ended at byte {at:,}: it got shorter while it was read" in message
    assert copy_engine.AGAIN in message
    left = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert not [n for n in left if n.endswith(".partial")], left
    assert INDEX_NAME not in left


def test_reference_overrides_a_collapsed_recorded_mapping(tmp_path: Path) -> None:
    """automodel-2289: the run recorded a mapping that sends everything to file 1; a reference
    index given by the user restores the 4 output files."""
    from inspector._internal.demo.dcp import write_dcp_demo

    src = write_dcp_demo(tmp_path / "src", collapsed=True)
    reference = src / ".hf_metadata" / INDEX_NAME
    plan = plan_consolidation(scan(src), tmp_path / "out", reference=reference)
    assert len(plan.outputs) == 4
    assert "collapsed mapping" in plan.describe()
    # The reference dealt with the collapse: the plan no longer warns about it.
    assert "mapping-collapsed" not in {f.code for f in plan.findings}
    assert "[mapping-collapsed]" not in plan.describe()


def test_default_consolidation_of_a_collapsed_mapping_follows_the_reference_it_names(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """automodel-2289 without --reference: the recorded mapping sends every tensor to one
    file while the run kept the reference index (4 files) in `.hf_metadata/`. The default
    plan follows that index and says so (it wrote one file and "verified: no finding"
    before); an output that still collapses is flagged by the verification."""
    from inspector._internal.demo.dcp import write_dcp_demo

    src = write_dcp_demo(tmp_path / "src", collapsed=True)
    kept = src / ".hf_metadata" / INDEX_NAME
    plan = plan_consolidation(scan(src), tmp_path / "out")
    assert len(plan.outputs) == 4
    assert plan.assignment == "reference .hf_metadata/model.safetensors.index.json"
    assert "(mapping-collapsed)" in plan.reason and f"--reference {kept}" in plan.reason
    assert "mapping-collapsed" not in {f.code for f in plan.findings}
    result = plan.execute(progress=False)
    assert result.ok and len(scan(tmp_path / "out").files) == 4
    # The CLI's default is the same plan.
    assert main(["consolidate", str(src), str(tmp_path / "cli"), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "in 4 files" in out and "(mapping-collapsed)" in out
    # Following the collapsed mapping on purpose is possible, and not called clean.
    recorded = src / ".hf_metadata" / "fqn_to_file_index_mapping.json"
    collapsed = plan_consolidation(scan(src), tmp_path / "one", mapping=recorded)
    assert len(collapsed.outputs) == 1
    flagged = collapsed.execute(progress=False)
    assert not flagged.ok
    (finding,) = [f for f in flagged.findings if f.code == "mapping-collapsed"]
    assert "names 4 files" in finding.message and f"--reference {kept}" in finding.message
    assert "verify: re-scanned and checked the output: 1 finding" in flagged.describe()


def test_a_collapse_over_the_split_size_without_a_reference_is_packed_by_size(
    tmp_path: Path,
) -> None:
    """No reference anywhere and one file would pass 5 GB: the default packs by size instead
    of writing the collapse."""
    import dataclasses

    from inspector._internal.demo.dcp import write_dcp_demo
    from inspector._internal.plans.consolidate.plan import choose_assignment

    src = write_dcp_demo(tmp_path / "src", collapsed=True)
    (src / ".hf_metadata" / INDEX_NAME).unlink()
    scanned = scan(src)
    big = [n * 1000 + 400_000_000 for n in scanned.logical.nbytes]
    huge = dataclasses.replace(scanned, logical=dataclasses.replace(scanned.logical, nbytes=big))
    names = list(huge.tensors["name"])
    sizes = dict(zip(names, huge.tensors["nbytes"].tolist(), strict=True))
    choice = choose_assignment(huge, names, sizes, None, None, parse_size("5GB"))
    assert choice.rule.startswith("greedy by size") and len(choice.groups) > 1
    assert "(mapping-collapsed)" in choice.reason and choice.collapse_avoided
    # Small, and nothing names several files: one file is right, the mapping is followed.
    small = choose_assignment(scanned, names, dict.fromkeys(names, 1), None, None, 10**9)
    assert small.rule.startswith("mapping") and len(small.groups) == 1


def test_default_destination_is_a_sibling_of_the_source(tmp_path: Path) -> None:
    from inspector._internal.plans.consolidate import default_destination

    src = tmp_path / "run" / "model"
    src.mkdir(parents=True)
    dest = default_destination(src)
    assert dest == tmp_path / "run" / "model-consolidated"
    assert src.resolve() not in dest.resolve().parents


# -- a source that lost a rank: refused, or written partial on request (issue 8, item 4) ---------


def test_lost_rank_is_refused_unless_allowed_partial(
    source: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without rank 2's files the chunks make a smaller, self-consistent model; the hidden
    size and the sibling experts show what is missing. Consolidation refuses; with
    --allow-partial it writes the full shapes with zeros where no chunk was, says so in the
    plan and the result, and exits 1."""
    src = Path(shutil.copytree(source, tmp_path / "model"))
    for name in src.glob("shard-00002-*.safetensors"):
        name.unlink()
    with pytest.raises(PlanRefusedError, match="--allow-partial"):
        plan_consolidation(scan(src), tmp_path / "refused")
    # Block buffers are reused between tensors: make every one hold stale bytes.
    fresh = copy_engine._buffer

    def stale(kind: str, nbytes: int) -> np.ndarray:
        buf = fresh(kind, nbytes)
        buf[:] = 0xFF
        return buf

    monkeypatch.setattr(copy_engine, "_buffer", stale)
    dest = tmp_path / "out"
    code = main(["consolidate", str(src), str(dest), "--no-progress", "--allow-partial"])
    out = capsys.readouterr().out
    assert code == 1, out
    assert "WARNING --allow-partial:" in out and "PARTIAL" in out
    assert "WARNING: " in out and "model.layers.0.input_layernorm.weight" in out
    saved, written = full_tensors(), load_all(dest)
    norm = written["model.layers.0.input_layernorm.weight"]
    assert norm.shape == (32,)
    assert torch.equal(norm[:16], saved["model.layers.0.input_layernorm.weight"][:16])
    assert not norm[16:].any()
    # Column-sharded expert 1's up_proj is assembled block by block: the half that rank 2
    # held is zeros, not the bytes of another tensor left in the block buffer.
    up = written["model.layers.0.mlp.experts.1.up_proj.weight"]
    assert up.shape == (16, 32) and not up[:, 16:].any()
    assert torch.equal(up[:, :16], saved["model.layers.0.mlp.experts.1.up_proj.weight"][:, :16])


def test_collapsed_mapping_follows_the_upstream_the_run_names(tmp_path: Path) -> None:
    """Seed automodel-2289 as NeMo AutoModel 0.7 wrote it: the recorded mapping sends every
    tensor to file 1, and consolidate.sh names the upstream model beside the checkpoint. Its
    index (4 files) is followed without --reference, and the tensors are the writer's."""
    golden = Path(__file__).parent / "fixtures" / "writers" / "automodel"
    run = Path(shutil.copytree(golden / "automodel-2289-collapsed-mapping", tmp_path / "run"))
    plan = plan_consolidation(scan(run / "model"), tmp_path / "out")
    assert len(plan.outputs) == 4
    assert plan.assignment.endswith("upstream/model.safetensors.index.json")
    assert "collapsed mapping" in plan.reason and "consolidate.sh --model-name" in plan.reason
    # The plan does not follow the collapsed mapping, so it does not warn about it; the
    # checkpoint itself still has the problem, and `check` says so.
    assert "mapping-collapsed" not in {f.code for f in plan.findings}
    assert "mapping-collapsed" in {f.code for f in check(scan(run / "model"), model=False)}
    plan.execute(progress=False)
    manifest = json.loads((golden.parent / "MANIFEST.json").read_text())
    expected = manifest["automodel/automodel-2289-collapsed-mapping"]["writer_state"]
    written = load_all(tmp_path / "out")
    assert sorted(written) == sorted(expected)
    for name, tensor in written.items():
        assert list(tensor.shape) == expected[name]["shape"], name


def test_the_execution_options_are_one_set_with_their_defaults_in_one_place() -> None:
    """`consolidate()`, `ConsolidationPlan.execute()` and the driver take one set of options
    (`ConsolidationOptions`), resolved once against the defaults `Execution` holds."""
    fields = [f.name for f in dataclasses.fields(Execution)]
    assert fields == list(typing.get_type_hints(ConsolidationOptions))
    for function in (consolidate, ConsolidationPlan.execute):
        spelled = set(inspect.signature(function).parameters)
        assert not spelled & set(fields), f"{function.__qualname__} spells options out again"
    run = Execution.of({"workers": 3, "fsync": False})
    assert (run.workers, run.fsync, run.verify, run.resume) == (3, False, True, False)
    with pytest.raises(TypeError):
        Execution.of({"wokers": 3})  # type: ignore[typeddict-unknown-key]
