"""`check --values sample|full`: value statistics decoded bit for bit, judged against
siblings. Healthy output of every real writer gets none of the value findings; real writers'
output damaged as converters and loaders damage it (an expert left at never-written memory,
a layer zeroed, a tensor scaled by 1000, NaN in one block, an FP8 scale all zero) is caught
by `full` always, and by `sample` in the sense docs/values.md states."""

from __future__ import annotations

import errno
import json
import os
import shutil
import struct
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from golden_manifest import FIXTURES, MANIFEST, unreadable
from remote_servers import RangeHTTPServer

from inspector import check, scan
from inspector._internal.checks.values import CODES, SampleBudget, value_table, values_check
from inspector._internal.formats.value_decode import decoder_for
from inspector._internal.formats.value_reading import windows_of
from inspector._internal.formats.value_segments import finish, segment_records
from inspector._internal.formats.value_stats import Accumulator

VALUE_CODES = {c.value for c in CODES}
# Golden fixtures whose values the real writer itself damaged (tested on their own below).
VALUES_DAMAGED = {
    "fp8-block/transformers-fp8-save": "transformers' FP8 save leaves the weight_scale_inv "
    "of its bfloat16 projections at torch.empty bits",
}
# Every golden fixture a reader scans: healthy, or damaged in structure only (a lost file,
# a stale index, a truncated config): its tensor values are the real writer's.
WRITERS_VALUES = [
    case for case in sorted(MANIFEST) if unreadable(case) is None and case not in VALUES_DAMAGED
]


# -- decoding -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("dtype", "torch_dtype"),
    [
        ("F8_E4M3", torch.float8_e4m3fn),
        ("F8_E5M2", torch.float8_e5m2),
        ("F8_E4M3FNUZ", torch.float8_e4m3fnuz),
        ("F8_E5M2FNUZ", torch.float8_e5m2fnuz),
        ("F8_E8M0", torch.float8_e8m0fnu),
    ],
)
def test_fp8_decodes_every_byte_as_torch_does(dtype: str, torch_dtype: torch.dtype) -> None:
    codes = torch.arange(256, dtype=torch.uint8)
    expected = codes.view(torch_dtype).to(torch.float32).numpy()
    decoder = decoder_for("w", dtype)
    assert decoder is not None and decoder.decode is not None
    ours = decoder.decode(codes.numpy())
    np.testing.assert_array_equal(ours, expected)  # NaN positions must agree too


def test_bf16_and_f16_decode_as_torch_does() -> None:
    words = torch.arange(65536, dtype=torch.int32).to(torch.uint16)
    for dtype, torch_dtype in (("BF16", torch.bfloat16), ("F16", torch.float16)):
        decoder = decoder_for("w", dtype)
        assert decoder is not None and decoder.decode is not None
        expected = words.view(torch_dtype).to(torch.float32).numpy()
        np.testing.assert_array_equal(decoder.decode(words.numpy()), expected)


def test_mxfp4_u8_scales_decode_as_e8m0_and_packed_weights_are_not_decoded() -> None:
    scales = decoder_for("model.layers.0.mlp.experts.gate_up_proj_scales", "U8")
    assert scales is not None and scales.decode is not None
    assert scales.decode(np.array([127, 128, 0xFF], np.uint8)).tolist()[:2] == [1.0, 2.0]
    blocks = decoder_for("model.layers.0.mlp.experts.gate_up_proj_blocks", "U8")
    assert blocks is not None and blocks.decode is None


def test_statistics_match_numpy_with_nan_and_inf() -> None:
    rng = np.random.default_rng(1)
    values = rng.normal(0.5, 2.0, 100_000).astype(np.float32)
    values[[3, 70_000]] = np.nan
    values[5] = np.inf
    values[10:20] = 0
    acc = Accumulator(decoder_for("w", "F32"))
    for part in np.array_split(values, 7):  # blocks, as a stream reads them
        acc.add(part.tobytes())
    stats = acc.result()
    finite = values[np.isfinite(values)]
    assert (stats.nan, stats.inf, stats.elements) == (2, 1, 100_000)
    assert stats.min == finite.min() and stats.max == finite.max()
    assert stats.mean == pytest.approx(finite.mean(), rel=1e-5)
    assert stats.std == pytest.approx(finite.std(), rel=1e-5)
    assert stats.zero_frac == pytest.approx(10 / len(finite))


# -- healthy real writers: none of the value findings --------------------------------------


@pytest.mark.parametrize("case", WRITERS_VALUES)
def test_real_writers_values_give_no_value_finding(case: str) -> None:
    """No tensor-uninitialised, tensor-values-outlier, tensor-all-zero or tensor-nonfinite
    (nor any other value finding) on what a real writer wrote, in either mode."""
    scanned = scan(FIXTURES / case)
    structure = check(scanned, model=False)
    for mode in ("full", "sample"):
        # A fixture damaged in structure (a truncated download) keeps its findings; reading
        # the values adds none, not even one per tensor past the end of the short file.
        found = [f for f in check(scanned, model=False, values=mode) if f not in structure]
        assert found == [], (mode, [f.message for f in found])
    table = value_table(scanned, "full")
    assert len(table) == 0 or table["decoded"].any()


def test_the_values_table_carries_the_tensor_columns() -> None:
    scanned = scan(FIXTURES / "transformers" / "mixtral")
    check(scanned, values="full", model=False)
    table = scanned.values
    assert set(table["mode"]) == {"full"}
    assert {"layer", "expert", "kind", "std", "absmax", "zero_frac", "finding"} <= set(table)
    assert set(table["name"]) == set(scanned.tensors["name"])
    expert = table[table["name"] == "model.layers.1.block_sparse_moe.experts.2.w1.weight"]
    assert (int(expert["layer"].iat[0]), int(expert["expert"].iat[0])) == (1, 2)
    assert int(expert["siblings"].iat[0]) == 7  # 4 experts x 2 layers, itself excluded


# -- damage real writers' output -----------------------------------------------------------


def _copy(case: str, tmp_path: Path) -> Path:
    target = tmp_path / case.replace("/", "-")
    shutil.copytree(FIXTURES / case, target)
    return target


def _damage(folder: Path, name: str, change: Callable[[np.ndarray], np.ndarray]) -> None:
    """Rewrite tensor `name` in place (same dtype and size) with `change(values)`."""
    for path in sorted(folder.glob("*.safetensors")):
        raw = path.read_bytes()
        size = struct.unpack("<Q", raw[:8])[0]
        header = json.loads(raw[8 : 8 + size])
        if name not in header:
            continue
        entry = header[name]
        begin, end = (8 + size + o for o in entry["data_offsets"])
        dtype = {"F32": np.float32, "BF16": np.uint16, "F8_E4M3": np.uint8}[entry["dtype"]]
        values = np.frombuffer(raw[begin:end], dtype=dtype).copy()
        new = np.ascontiguousarray(change(values)).tobytes()
        assert len(new) == end - begin
        with path.open("r+b") as f:
            f.seek(begin)
            f.write(new)
        return
    raise AssertionError(f"{name} is in no shard of {folder}")


def _garbage_bits(values: np.ndarray) -> np.ndarray:
    """Heap memory that held unrelated data: arbitrary bit patterns."""
    return np.random.default_rng(7).integers(0, 2**32, len(values), dtype=np.uint32)


def _integer_words(values: np.ndarray) -> np.ndarray:
    """Memory that held small int64 counters and lengths, read as float32."""
    counters = np.arange(len(values) // 2, dtype=np.int64) % 4096
    return counters.view(np.uint32)


def _fill_word(values: np.ndarray) -> np.ndarray:
    """A debug allocator's fill pattern (0xCDCDCDCD)."""
    return np.full(len(values), 0xCDCDCDCD, dtype=np.uint32)


EXPERT = "model.layers.1.block_sparse_moe.experts.2.w1.weight"


@pytest.mark.parametrize("memory", [_garbage_bits, _integer_words, _fill_word])
@pytest.mark.parametrize("mode", ["full", "sample"])
def test_an_expert_left_at_never_written_memory(
    memory: Callable, mode: str, tmp_path: Path
) -> None:
    folder = _copy("transformers/mixtral", tmp_path)
    _damage(folder, EXPERT, lambda v: memory(v).view(np.float32))
    found = check(scan(folder), values=mode, model=False)
    mine = [f for f in found if f.tensor == EXPERT]
    assert mine and {f.code for f in mine} <= {"tensor-uninitialised", "tensor-nonfinite"}, [
        f.message for f in found
    ]
    if memory is not _garbage_bits:  # garbage may hold NaN bit patterns; the others do not
        assert [f.code for f in mine] == ["tensor-uninitialised"]
    assert {f.tensor for f in found if f.code in VALUE_CODES} == {EXPERT}


@pytest.mark.parametrize("mode", ["full", "sample"])
def test_a_layer_zeroed(mode: str, tmp_path: Path) -> None:
    folder = _copy("transformers/qwen3-moe", tmp_path)
    layer = [n for n in scan(folder).tensors["name"] if n.startswith("model.layers.1.")]
    for name in layer:
        _damage(folder, name, np.zeros_like)
    found = check(scan(folder), values=mode, model=False)
    zero = {f.tensor for f in found if f.code == "tensor-all-zero"}
    folded = [f for f in found if f.code == "tensor-all-zero" and f.tensor is None]
    assert zero | set() <= set(layer) and (zero == set(layer) or folded)
    assert {f.code for f in found if f.code in VALUE_CODES} == {"tensor-all-zero"}


@pytest.mark.parametrize("mode", ["full", "sample"])
def test_a_tensor_scaled_by_1000(mode: str, tmp_path: Path) -> None:
    folder = _copy("transformers/mixtral", tmp_path)
    _damage(folder, EXPERT, lambda v: v * np.float32(1000))
    found = [f for f in check(scan(folder), values=mode, model=False) if f.code in VALUE_CODES]
    assert [(f.code, f.tensor) for f in found] == [("tensor-values-outlier", EXPERT)]
    assert "1,000x above" in found[0].message or "above its siblings" in found[0].message


def test_nan_in_one_block_is_caught_by_full(tmp_path: Path) -> None:
    folder = _copy("transformers/qwen3-moe", tmp_path)
    name = "model.layers.1.mlp.experts.3.down_proj.weight"

    def block(v: np.ndarray) -> np.ndarray:
        v[40:48] = np.nan
        return v

    _damage(folder, name, block)
    found = [f for f in check(scan(folder), values="full", model=False) if f.code in VALUE_CODES]
    assert [(f.code, f.tensor) for f in found] == [("tensor-nonfinite", name)]
    assert "8 NaN" in found[0].message


@pytest.mark.parametrize(
    ("case", "scale"),
    [
        ("fp8-block/deepseek-v3", "model.layers.1.mlp.experts.1.gate_proj.weight_scale_inv"),
        ("modelopt/hf-fp8", "model.layers.1.mlp.experts.0.down_proj.weight_scale"),
    ],
)
@pytest.mark.parametrize("mode", ["full", "sample"])
def test_an_fp8_scale_all_zero(case: str, scale: str, mode: str, tmp_path: Path) -> None:
    folder = _copy(case, tmp_path)
    _damage(folder, scale, np.zeros_like)
    found = [f for f in check(scan(folder), values=mode, model=False) if f.code in VALUE_CODES]
    assert [(f.code, f.tensor) for f in found] == [("tensor-all-zero", scale)]


# -- sampling: the stated guarantee, with a fixed seed over many tensors --------------------

_MB = 1 << 20


def _weights(kind: str, n: int, rng: np.random.Generator) -> np.ndarray:
    if kind == "normal":
        return rng.normal(0, 0.02, n).astype(np.float32)
    if kind == "student-t":  # heavy tails, as trained weights have
        return (rng.standard_t(3, n) * 0.01).astype(np.float32)
    # a real writer's weights, tiled with noise to 1 MB
    real = scan(FIXTURES / "transformers" / "mixtral")
    table = value_table(real, "full")
    std = float(table[table["name"] == EXPERT]["std"].iat[0])
    return (rng.normal(0, std, n) * rng.choice([0.5, 1, 2], n)).astype(np.float32)


def _sampled(data: np.ndarray, seeds: range) -> pd.DataFrame:
    """`sample`'s statistics of one BF16 tensor (its words) under each seed: the windows
    `sample` places (the reading module's own offsets), reduced as `sample` reduces them."""
    decoder = decoder_for("w", "BF16")
    assert decoder is not None
    raw = data.view(np.uint8)
    names = [(seed, f"layers.{seed}.w") for seed in seeds]
    windows = [windows_of(n, "f", 0, len(raw), 2, SampleBudget(), s) for s, n in names]
    pieces = [np.concatenate([raw[a : a + n] for a, n in w]) for w in windows]
    words = np.concatenate(pieces).view(np.uint16)
    starts = np.arange(len(pieces)) * (len(pieces[0]) // 2)
    return finish(pd.DataFrame(segment_records(words, starts, decoder)))


@pytest.mark.parametrize("kind", ["normal", "student-t", "writer"])
def test_sample_sees_a_100x_rescale_and_whole_zero_or_nan(kind: str) -> None:
    """1 MB BF16 tensors, 2,000 sampled placements each (seeds 0-1999): a 100x rescale moves
    the sampled std at least 10x (the outlier threshold) every time, while healthy samples
    stay within 3x; whole-zero and whole-NaN tensors read as such every time."""
    rng = np.random.default_rng(2026)
    values = _weights(kind, _MB // 2, rng)
    healthy = (values.view(np.uint32) >> 16).astype(np.uint16)
    scaled = ((values * 100).view(np.uint32) >> 16).astype(np.uint16)
    true_std = float(values.std())
    seeds = range(2000)
    a = _sampled(healthy, seeds)["std"].to_numpy() / true_std
    b = _sampled(scaled, seeds)["std"].to_numpy() / true_std
    assert (b >= 10).all() and (a < 3).all() and (a > 1 / 3).all()
    zeros = _sampled(np.zeros(_MB // 2, np.uint16), range(200))
    nans = _sampled(np.full(_MB // 2, 0x7FC0, np.uint16), range(200))
    assert zeros["all_zero"].all() and (nans["nan"] > 0).all()


def _write_bf16(path: Path, tensors: dict[str, np.ndarray]) -> None:
    """A safetensors file of BF16 tensors given as their uint16 words (safetensors.numpy has
    no bfloat16; the layout is the format's own: length, JSON header, data)."""
    header, offset = {}, 0
    for name, words in tensors.items():
        header[name] = {
            "dtype": "BF16",
            "shape": [len(words)],
            "data_offsets": [offset, offset + words.nbytes],
        }
        offset += words.nbytes
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with path.open("wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        for words in tensors.values():
            f.write(words.tobytes())


def test_sample_end_to_end_over_many_seeds(tmp_path: Path) -> None:
    """A checkpoint of 1 MB BF16 sibling tensors (24 layers) with one rescaled by 100x, one
    zeroed and one NaN: every seed of `sample` finds exactly those three."""
    rng = np.random.default_rng(5)
    tensors = {}
    for layer in range(24):
        w = rng.normal(0, 0.02, _MB // 2).astype(np.float32)
        if layer == 5:
            w *= 100
        if layer == 9:
            w[:] = 0
        if layer == 13:
            w[:] = np.nan
        tensors[f"model.layers.{layer}.mlp.down_proj.weight"] = (w.view(np.uint32) >> 16).astype(
            np.uint16
        )
    _write_bf16(tmp_path / "model.safetensors", tensors)
    scanned = scan(tmp_path)
    expected = {
        ("tensor-values-outlier", "model.layers.5.mlp.down_proj.weight"),
        ("tensor-all-zero", "model.layers.9.mlp.down_proj.weight"),
        ("tensor-nonfinite", "model.layers.13.mlp.down_proj.weight"),
    }
    for seed in range(24):
        found = values_check(scanned, "sample", seed=seed)
        assert {(f.code, f.tensor) for f in found} == expected, seed
    table = value_table(scanned, "sample", seed=3)
    assert (table["elements"] == 1024).all()  # 8 windows of 256 bytes of each 1 MB tensor


def test_transformers_fp8_save_leaves_never_written_scales() -> None:
    """The real writer's own damage: transformers' FP8 save gives the bfloat16 projections a
    weight_scale_inv it never writes (torch.empty): 1e-38, 4.6e-41, 7.4e19."""
    scanned = scan(FIXTURES / "fp8-block" / "transformers-fp8-save")
    for mode in ("full", "sample"):
        found = values_check(scanned, mode)
        codes = {f.code for f in found}
        assert codes == {"tensor-uninitialised"}, [f.message for f in found]
        named = {f.tensor for f in found if f.tensor}
        assert "model.layers.0.self_attn.kv_b_proj.weight_scale_inv" in named or any(
            f.tensor is None for f in found
        )


# -- bytes that cannot be read: a finding naming the file and the tensor, never a gap -------


def _entries(path: Path) -> dict[str, tuple[int, int]]:
    """Absolute [start, end) of every tensor of a safetensors file."""
    raw = path.read_bytes()
    size = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8 : 8 + size])
    return {
        name: (8 + size + e["data_offsets"][0], 8 + size + e["data_offsets"][1])
        for name, e in header.items()
        if name != "__metadata__"
    }


def _every_tensor_has_a_row(scanned: object, mode: str) -> pd.DataFrame:
    table = value_table(scanned, mode)  # type: ignore[arg-type]
    assert sorted(table["name"]) == sorted(set(scanned.tensors["name"]))  # type: ignore[attr-defined]
    return table


@pytest.mark.parametrize("mode", ["sample", "full"])
def test_a_truncated_shard_names_the_tensor_past_its_end(mode: str, tmp_path: Path) -> None:
    folder = _copy("transformers/qwen3-moe", tmp_path)
    shard = max(folder.glob("*.safetensors"), key=lambda p: p.stat().st_size)
    spans = _entries(shard)
    last = max(spans, key=lambda n: spans[n][1])
    start, end = spans[last]
    os.truncate(shard, start + (end - start) // 2)  # an interrupted copy, in the last tensor
    scanned = scan(folder)
    found = [f for f in values_check(scanned, mode) if f.code == "file-truncated"]
    assert [(f.file, f.tensor) for f in found] == [(shard.name, last)]
    assert "past the end" in found[0].message and shard.name in found[0].message
    table = _every_tensor_has_a_row(scanned, mode)
    row = table[table["name"] == last].iloc[0]
    assert row["finding"] == "file-truncated" and row["elements"] == 0
    assert (table[table["name"] != last]["elements"] > 0).all()


@pytest.mark.parametrize("mode", ["sample", "full"])
def test_a_shard_that_cannot_be_opened_names_its_tensors(mode: str, tmp_path: Path) -> None:
    """The file was replaced after the scan (here by a folder): every tensor of it is
    reported unreadable with why; the other shards are read."""
    folder = _copy("transformers/qwen3-moe", tmp_path)
    scanned = scan(folder)
    shards = sorted(folder.glob("*.safetensors"))
    victim = shards[0]
    mine = set(_entries(victim))
    victim.unlink()
    victim.mkdir()
    found = [f for f in values_check(scanned, mode) if f.code == "tensor-unreadable"]
    assert found and {f.file for f in found} == {victim.name}
    named = {f.tensor for f in found if f.tensor}
    assert named <= mine and (named == mine or any(f.tensor is None for f in found))
    table = _every_tensor_has_a_row(scanned, mode)
    lost = table[table["finding"] == "tensor-unreadable"]
    assert set(lost["name"]) == mine and set(lost["file"]) == {victim.name}
    assert (table[~table["name"].isin(mine)]["elements"] > 0).all()


def test_an_io_error_in_one_tensor_names_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read that fails with EIO inside one tensor's bytes (a bad sector): that tensor is
    `tensor-unreadable` with the system's reason, its neighbours have their statistics."""
    folder = _copy("transformers/mixtral", tmp_path)
    shard = next(p for p in folder.glob("*.safetensors") if EXPERT in _entries(p))
    start, end = _entries(shard)[EXPERT]
    inode = shard.stat().st_ino
    real = os.pread

    def pread(fd: int, n: int, offset: int) -> bytes:
        if os.fstat(fd).st_ino == inode and offset < end and offset + n > start:
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return real(fd, n, offset)

    scanned = scan(folder)
    monkeypatch.setattr(os, "pread", pread)
    found = [f for f in values_check(scanned, "sample") if f.code in VALUE_CODES]
    assert [(f.code, f.file, f.tensor) for f in found] == [
        ("tensor-unreadable", shard.name, EXPERT)
    ]
    assert os.strerror(errno.EIO) in found[0].message
    table = _every_tensor_has_a_row(scanned, "sample")
    assert (table[table["name"] != EXPERT]["elements"] > 0).all()


def test_remote_bytes_refused_are_named(tmp_path: Path, range_server: RangeHTTPServer) -> None:
    """The server refuses the data ranges (here after the scan): each tensor of the file is
    reported with the server's answer, in both modes."""
    from remote_servers import Proxy

    folder = _copy("transformers/mixtral", tmp_path)
    names = set(scan(folder).tensors["name"])
    with range_server.serving(tmp_path) as server, Proxy(range_server.url) as proxy:
        there = scan(f"{proxy.url}{server.path}/{folder.name}/")
        proxy.fault = lambda method, path, n: (
            (403, b"no") if method == "GET" and path.endswith(".safetensors") else None
        )
        for mode in ("sample", "full"):
            found = [f for f in values_check(there, mode) if f.code in VALUE_CODES]
            assert {f.code for f in found} == {"tensor-unreadable"}
            assert "access denied (HTTP 403)" in found[0].message
            table = _every_tensor_has_a_row(there, mode)
            assert set(table[table["finding"] == "tensor-unreadable"]["name"]) == names


# -- remote, CLI, report --------------------------------------------------------------------


def test_remote_values_equal_local_and_read_only_the_windows(
    tmp_path: Path, range_server: RangeHTTPServer
) -> None:
    """Over HTTP ranged reads: the same statistics as locally; sample reads a bounded
    number of bytes per tensor, full every byte."""
    rng = np.random.default_rng(11)
    tensors = {
        f"model.layers.{layer}.mlp.down_proj.weight": (
            rng.normal(0, 0.02, _MB // 2).astype(np.float32).view(np.uint32) >> 16
        ).astype(np.uint16)
        for layer in range(4)
    }
    tensors["model.layers.2.mlp.down_proj.weight"][1000:1010] = 0x7FC0  # NaN in one block
    folder = tmp_path / "ckpt"
    folder.mkdir()
    _write_bf16(folder / "model.safetensors", tensors)
    local = scan(folder)
    with range_server.serving(tmp_path) as server:
        there = scan(f"{server.url}/ckpt/")
        before = server.content_bytes
        sampled = value_table(there, "sample")
        sample_bytes = server.content_bytes - before
        full = value_table(there, "full")
        found = values_check(there, "full")
    assert sample_bytes < 4 * SampleBudget().per_tensor + 64 * 1024
    columns = ["name", "elements", "min", "max", "mean", "std", "nan", "zero_frac"]
    expected = value_table(local, "full")[columns]
    assert full[columns].equals(expected)
    assert (sampled["elements"] == 1024).all()
    assert sampled[columns[1:]].equals(value_table(local, "sample")[columns[1:]])
    assert [(f.code, f.tensor) for f in found] == [
        ("tensor-nonfinite", "model.layers.2.mlp.down_proj.weight")
    ]


def test_cli_check_values(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from inspector._internal.cli.main import main

    folder = _copy("transformers/mixtral", tmp_path)
    _damage(folder, EXPERT, lambda v: v * np.float32(1000))
    assert main(["check", str(folder), "--no-model", "--values", "sample", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    codes = {f["code"] for f in result["findings"]}
    assert "tensor-values-outlier" in codes
    assert main(["check", str(folder), "--no-model"]) == 0
    assert "tensor-values-outlier" not in capsys.readouterr().out  # headers only by default
    assert (
        main(["check", str(folder), "--no-model", "--values", "full", "--fail-on", "warning"]) == 1
    )


def test_values_heatmap_marks_outliers_and_the_report_shows_it(tmp_path: Path) -> None:
    from inspector.widgets.figures import values_heatmap
    from inspector.widgets.report import render_html_report

    folder = _copy("transformers/mixtral", tmp_path)
    _damage(folder, EXPERT, lambda v: v * np.float32(1000))
    scanned = scan(folder)
    before = render_html_report(scanned, check(scanned, model=False))
    assert "values-heatmap" not in before  # a report never reads tensor data itself
    findings = check(scanned, values="full", model=False)
    fig = values_heatmap(scanned.values, metric="absmax")
    heat, *marks = fig.data
    assert "w1.weight" in " ".join(map(str, heat.x)) and "layer 1" in heat.y
    assert any("e2" in str(x) for x in heat.x)  # one column per expert
    (mark,) = [m for m in marks if m.name == "tensor-values-outlier"]
    assert list(mark.customdata) == [EXPERT]
    assert EXPERT in {n for row in heat.customdata for n in row}
    html = render_html_report(scanned, findings)
    assert "values-heatmap-figure" in html and "tensor-values-outlier" in html


@pytest.mark.usefixtures("dashboards_closed")
def test_dashboard_values_view(tmp_path: Path) -> None:
    from inspector.widgets.dashboard import Dashboard

    folder = _copy("transformers/mixtral", tmp_path)
    _damage(folder, EXPERT, lambda v: v * np.float32(1000))
    dash = Dashboard(folder, model=False, snapshot=False, progress=False)
    panel = dash.select("Values")
    assert panel.table is None and not panel.plot.children  # nothing read until asked
    assert "tensor-values-outlier" not in set(dash.state.frame["code"])
    panel.sample.click()
    # The value findings join the others: the Overview's issues and the Findings tab.
    assert "tensor-values-outlier" in set(dash.state.frame["code"])
    assert any("tensor-values-outlier" in {f.code for f in p.findings} for p in dash.state.problems)
    assert dash.values == "sample"
    panel = dash.select("Values")  # rebuilt from the new state
    assert panel.table is not None and set(panel.table["mode"]) == {"sample"}
    assert "1 out of line" in panel.status.value
    (figure,) = panel.plot.children
    assert any(t.name == "tensor-values-outlier" for t in figure.data[1:])
    panel.metric.value = "absmax"
    assert "absmax" in panel.plot.children[0].layout.title.text
    panel.show(EXPERT)
    assert "x above its siblings" in panel.details.value and "w1.weight" in panel.details.value
    scanned = scan(folder)
    check(scanned, values="full", model=False)
    again = Dashboard(scanned, model=False, snapshot=False, progress=False)
    shown = again.select("Values")
    assert shown.table is not None and set(shown.table["mode"]) == {"full"}
    assert again.values == "full" and "tensor-values-outlier" in set(again.state.frame["code"])


def test_a_shard_cut_short_before_its_tensors_is_reported_once(tmp_path: Path) -> None:
    """A shard cut just after its header: every window asked for lies past the end. Both
    modes say the file is short once (the structure check's finding) and read the rest."""
    folder = _copy("transformers/mixtral", tmp_path)
    shard = folder / "model-00002-of-00004.safetensors"
    raw = shard.read_bytes()
    shard.write_bytes(raw[: 8 + struct.unpack("<Q", raw[:8])[0]])
    scanned = scan(folder)
    for mode in ("sample", "full"):
        found = check(scanned, model=False, values=mode)
        assert [f.code for f in found if f.file == shard.name] == ["file-truncated"], mode
        table = value_table(scanned, mode)
        cut = table[table["file"] == shard.name]
        assert len(cut) and (cut["finding"] == "file-truncated").all()
        assert (table[table["file"] != shard.name]["finding"] == "").all()


def test_full_read_of_a_file_cut_while_it_is_read_reports_instead_of_crashing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process cuts a shard short in the middle of the full read. Read through a
    memory map that kills the process (SIGBUS); read with `preadv` the reads come back
    short: those tensors are unread with the reason, the rest are read."""
    from inspector._internal.storage.local import LocalFile

    folder = _copy("transformers/mixtral", tmp_path)
    shard = folder / "model-00002-of-00004.safetensors"
    header_end = 8 + struct.unpack("<Q", shard.read_bytes()[:8])[0]
    scanned = scan(folder)
    real = LocalFile.read_into
    cut: list[int] = []

    def cutting(self: LocalFile, buffer: memoryview, offset: int) -> None:
        if os.path.basename(self.name) == shard.name and not cut:
            cut.append(header_end + 1000)
            os.truncate(shard, cut[0])  # the other process, between two reads
        real(self, buffer, offset)

    monkeypatch.setattr(LocalFile, "read_into", cutting)
    table = value_table(scanned, "full")
    assert cut, "the full read never read the shard"
    lost = table[table["file"] == shard.name]
    unread = lost[lost["finding"] == "tensor-unreadable"]
    assert len(unread) and unread["why"].str.contains("got shorter while it was read").all()
    assert (lost[lost["finding"] == ""]["elements"] > 0).all()  # read before the cut
    assert (table[table["file"] != shard.name]["finding"] == "").all()


def test_more_sample_windows_catch_a_small_nan_span_the_default_misses(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One NaN in a 16 KiB tensor: the default 8 windows (2 KiB) miss it where it lies,
    `--sample-windows 64` reads every stratum's 256 bytes (all of it) and names it; another
    seed reads other bytes; the budget is capped and refused with --values full."""
    from safetensors.torch import save_file

    from inspector._internal.cli.main import main

    name = "model.layers.2.mlp.down_proj.weight"
    gen = torch.Generator().manual_seed(0)
    weights = {
        f"model.layers.{layer}.mlp.down_proj.weight": torch.randn(8192, generator=gen).to(
            torch.bfloat16
        )
        / 50
        for layer in range(4)
    }
    missed_at = None
    for at in range(100, 8192, 997):  # a spot the default windows do not read
        damaged = dict(weights, **{name: weights[name].clone()})
        damaged[name][at] = float("nan")
        save_file(damaged, str(tmp_path / "model.safetensors"))
        if not [f for f in check(scan(tmp_path), values="sample", model=False) if f.tensor]:
            missed_at = at
            break
    assert missed_at is not None
    found = check(scan(tmp_path), values="sample", sample_windows=64, model=False)
    assert [(f.code, f.tensor) for f in found] == [("tensor-nonfinite", name)]
    assert "1 NaN" in found[0].message
    scanned = scan(tmp_path)
    seed = next((s for s in range(1, 400) if values_check(scanned, "sample", seed=s)), None)
    assert seed is not None, "some other seed puts a window on the NaN"

    argv = ["check", str(tmp_path), "--no-model", "--json"]
    assert main([*argv, "--sample-windows", "64"]) == 1  # implies --values sample
    assert [f["code"] for f in json.loads(capsys.readouterr().out)["findings"]] == [
        "tensor-nonfinite"
    ]
    assert main([*argv, "--values", "sample", "--sample-seed", str(seed)]) == 1
    capsys.readouterr()
    assert main([*argv, "--values", "full", "--sample-windows", "64"]) == 2
    err = capsys.readouterr().err
    assert "--values full reads every byte" in err and len(err.strip().splitlines()) == 1
    with pytest.raises(SystemExit) as exit_code:
        main([*argv, "--sample-windows", "5000"])
    assert exit_code.value.code == 2
    assert "at most 4,096" in capsys.readouterr().err


def test_a_table_read_with_its_own_budget_is_the_one_reports_show(tmp_path: Path) -> None:
    from inspector._internal.checks.values import computed_value_table

    folder = _copy("transformers/mixtral", tmp_path)
    scanned = scan(folder)
    assert computed_value_table(scanned) is None
    check(scanned, values="sample", sample_windows=2, model=False)
    table = computed_value_table(scanned)
    assert table is not None and table is value_table(scanned, "sample", budget=SampleBudget(2))
    assert table is not value_table(scanned, "sample")  # the default budget is its own table


@pytest.mark.usefixtures("dashboards_closed")
def test_sample_values_after_the_tensors_grid_was_drawn(tmp_path: Path) -> None:
    """Sampling values re-checks and rebuilds every tab; the Tensors grid a page has drawn
    still holds a view on its table then (the page lets go of it later), which must not stop
    the rebuild ("Cannot delete table with views")."""
    from inspector.widgets.dashboard import Dashboard

    folder = _copy("transformers/mixtral", tmp_path)
    dash = Dashboard(folder, model=False, snapshot=False, progress=False)
    tensors = dash.select("Tensors")
    held = tensors.table.view()  # what the page's grid holds while it shows the table
    panel = dash.select("Values")
    panel.sample.click()
    assert dash.values == "sample", (panel.status.value, dash.notice.value)
    assert "Cannot delete" not in panel.status.value + dash.notice.value
    assert set(dash.select("Values").table["mode"]) == {"sample"}
    held.delete()  # the page lets go of its view
