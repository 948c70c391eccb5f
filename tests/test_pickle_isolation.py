"""No file changes how another is read (issue 31, item 3).

A `data.pkl` that began `GLOBAL torch FloatStorage; BUILD (None, {"dtype": "bfloat16"})` set
the dtype on the stand-in the `.bin` reader kept in a module-level table: every later `.bin`
of the process (the dashboard's kernel, `diff A B`, the next shard) read its float32 tensors
as bfloat16, a clean shard got `bin-record-missing`, and a dtype of `[]` ended `check` with
an internal error. Each test here writes real files with `torch.save` or torch's DCP writer,
splices hand-made opcodes into their pickle (`pickle_ops`: pickletools and struct, nothing
is unpickled), reads the hostile file, then the clean ones, in this process: the hostile
file is refused, and every clean file reads exactly as it does in a process that read
nothing else (`pickle_ops.read_alone`)."""

from __future__ import annotations

import io
import json
import re
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pickle_ops import (
    BIN_ATTACKS,
    METADATA_ATTACKS,
    OP,
    binget,
    binput,
    data_pkl,
    global_,
    read_alone,
    read_one,
    rewrite_bin,
    slot_state,
    splice,
    stand_in_state,
    text,
    with_data_pkl,
)

from inspector._internal.checkpoint.read_problems import FileRole, ProblemKind, ReadProblem
from inspector._internal.checkpoint.scanned import TorchDistTensor
from inspector._internal.checks import check
from inspector._internal.checks.diff import diff_checkpoints
from inspector._internal.cli.main import main
from inspector._internal.formats.pickles import dcp_metadata, sandbox
from inspector._internal.formats.pickles.allowed import DATA_PKL, METADATA, Reader, stand_ins
from inspector._internal.formats.pickles.audit import audit_pickle, check_pickle
from inspector._internal.formats.pickles.errors import (
    GlobalMutationError,
    HostilePickleError,
    RefusedGlobalError,
)
from inspector._internal.formats.pickles.sandbox import (
    SandboxFailed,
    SandboxLimits,
    run_bounded,
    sandbox_available,
)
from inspector._internal.formats.pickles.stand_ins import Dims
from inspector._internal.formats.pickles.unpickler import unpickle
from inspector._internal.scan.entry import scan

BIN = "pytorch_model.bin"
FORCED = SandboxLimits(min_size=0, cpu_floor=1.0, memory_floor=512 << 20)
REPLY_CLASSES = (Dims, TorchDistTensor, ReadProblem, FileRole, ProblemKind)
# Files the property test reads in any order: clean ones and a spread of hostile ones.
MIXED_BIN = ("build-slots", "build-dtype-setstate", "sparse-memo-alias", "setitems-empty", "ext1")
MIXED_METADATA = ("dtype-setstate", "size-reader-cache", "layout-build-none")


@dataclass(frozen=True)
class Files:
    root: Path
    f32: Path  # folders holding one `.bin` torch.save wrote
    bf16: Path
    legacy: Path  # a `.bin` in the pre-1.6 format (`_use_new_zipfile_serialization=False`)
    dcp: Path  # a folder torch's DCP writer wrote (BF16 and F32 tensors)
    alone: dict[Path, str]  # file -> `read_one` in a process that read nothing else

    def hostile_bin(self, name: str) -> Path:
        return self.root / "bin" / name

    def hostile_dcp(self, name: str) -> Path:
        return self.root / "dcp-hostile" / name


def _state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "a.weight": torch.randn(4, 8, generator=g),
        "b.bias": torch.randn(3, generator=g),
        # float8 is pickled with _rebuild_tensor_v3 and a dtype global (`torch.float8_e4m3fn`)
        "c.scale": torch.randn(4, generator=g).to(torch.float8_e4m3fn),
    }


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Files:
    import torch.distributed.checkpoint as dcp

    root = tmp_path_factory.mktemp("isolation")
    state = _state()
    (root / "f32").mkdir()
    (root / "bf16").mkdir()
    torch.save(state, root / "f32" / BIN)
    half = {k: v.to(torch.bfloat16) if v.dtype == torch.float32 else v for k, v in state.items()}
    torch.save(half, root / "bf16" / BIN)
    for name, (ops, _) in BIN_ATTACKS.items():
        rewrite_bin(root / "f32" / BIN, root / "bin" / name / BIN, ops)
    legacy = io.BytesIO()
    torch.save({"w": torch.ones(2, 2)}, legacy, _use_new_zipfile_serialization=False)
    (root / "legacy.bin").write_bytes(legacy.getvalue())
    # Its pickles, one after another (magic number, protocol, system info, the object):
    # the attack goes right after the object's PROTO.
    at = 0
    for _ in range(3):
        at = audit_pickle(legacy.getvalue(), start=at).end
    hostile = splice(legacy.getvalue()[at:], BIN_ATTACKS["build-slots"][0])
    (root / "legacy-hostile.bin").write_bytes(legacy.getvalue()[:at] + hostile)
    with warnings.catch_warnings():  # "assuming the intent is to save in a single process"
        warnings.simplefilter("ignore", UserWarning)
        dcp.save(
            {"w": torch.ones(2, 2, dtype=torch.bfloat16), "v": torch.ones(3)},
            checkpoint_id=root / "dcp",
        )
    clean = (root / "dcp" / ".metadata").read_bytes()
    for name, (ops, _) in METADATA_ATTACKS.items():
        shutil.copytree(root / "dcp", root / "dcp-hostile" / name)
        (root / "dcp-hostile" / name / ".metadata").write_bytes(splice(clean, ops))
    reads = [
        *[("bin", root / d / BIN) for d in ("f32", "bf16")],
        ("bin", root / "legacy.bin"),
        ("bin", root / "legacy-hostile.bin"),
        *[("bin", root / "bin" / n / BIN) for n in MIXED_BIN],
        ("metadata", root / "dcp" / ".metadata"),
        *[("metadata", root / "dcp-hostile" / n / ".metadata") for n in MIXED_METADATA],
    ]
    alone = dict(zip([p for _, p in reads], read_alone(reads), strict=True))
    return Files(root, root / "f32", root / "bf16", root / "legacy.bin", root / "dcp", alone)


def assert_clean_reads_as_alone(files: Files) -> None:
    for path in (files.f32 / BIN, files.bf16 / BIN, files.legacy):
        assert read_one("bin", path.read_bytes()) == files.alone[path], path
    metadata = files.dcp / ".metadata"
    assert read_one("metadata", metadata.read_bytes()) == files.alone[metadata]


def test_the_clean_files_read_as_torch_wrote_them(files: Files) -> None:
    """The reference the other tests compare with: what torch wrote, read alone."""
    for folder, dtypes in ((files.f32, ["F32", "F32"]), (files.bf16, ["BF16", "BF16"])):
        shard = scan(folder).shards[0]
        assert shard.names == ("a.weight", "b.bias", "c.scale")
        assert shard.dtypes == [*dtypes, "F8_E4M3"] and not shard.findings
        assert repr(shard.dtypes) in files.alone[folder / BIN]
    tensors = scan(files.dcp).tensors
    assert dict(zip(tensors["name"], tensors["dtype"].astype(str), strict=True)) == {
        "w": "BF16",
        "v": "F32",
    }


@pytest.mark.parametrize("name", sorted(BIN_ATTACKS))
def test_a_bin_pickle_acting_on_a_global_is_refused_and_no_later_read_changes(
    files: Files, name: str
) -> None:
    _, expected = BIN_ATTACKS[name]
    before = stand_in_state()
    findings = check(scan(files.hostile_bin(name)), model=False)
    assert {f.code for f in findings} == ({expected} if expected else set())
    assert stand_in_state() == before
    assert_clean_reads_as_alone(files)


def test_a_legacy_stream_acting_on_a_global_is_hostile_and_changes_no_later_read(
    files: Files,
) -> None:
    """A pre-1.6 stream's tensors are listed from its pickles: the same unpickler, the same
    promise; its refusal is `pickle-hostile`, not only `bin-legacy-format`."""
    hostile = files.legacy.with_name("legacy-hostile.bin")
    assert "pickle-hostile" in files.alone[hostile]
    assert "'pickle-hostile'" in read_one("bin", hostile.read_bytes())
    assert "F32" in files.alone[files.legacy] and "pickle-hostile" not in files.alone[files.legacy]
    assert_clean_reads_as_alone(files)


def test_the_refusal_names_the_opcode_and_where_it_is(files: Files) -> None:
    ops, _ = BIN_ATTACKS["build-slots"]
    at = 2 + ops.index(OP["BUILD"] + OP["POP"])  # data.pkl: PROTO 2, then the spliced ops
    (finding,) = check(scan(files.hostile_bin("build-slots")), model=False)
    assert finding.code == "pickle-hostile"
    assert f"BUILD at byte {at} changes torch.FloatStorage" in finding.message
    assert "nothing ran" in finding.message


@pytest.mark.parametrize(
    ("opname", "ops"),
    [
        ("BUILD", slot_state({"dtype": text("bfloat16")}) + OP["BUILD"]),
        ("SETITEM", text("k") + text("v") + OP["SETITEM"]),
        ("SETITEMS", OP["MARK"] + text("k") + text("v") + OP["SETITEMS"]),
        ("APPEND", text("v") + OP["APPEND"]),
        ("APPENDS", OP["MARK"] + text("v") + OP["APPENDS"]),
        ("ADDITEMS", OP["MARK"] + text("v") + OP["ADDITEMS"]),
    ],
)
@pytest.mark.parametrize(
    "reach",
    ["direct", "memo", "memoize", "dup", "stack-global"],
)
def test_the_audit_refuses_every_change_of_a_global_however_it_is_reached(
    opname: str, ops: bytes, reach: str
) -> None:
    named = global_("torch", "FloatStorage")
    lead = {
        "direct": named,
        "memo": named + binput(0) + OP["POP"] + binget(0),
        "memoize": named + OP["MEMOIZE"] + OP["POP"] + binget(0),
        "dup": named + OP["DUP"],
        "stack-global": text("torch") + text("FloatStorage") + OP["STACK_GLOBAL"],
    }[reach]
    stream = OP["PROTO"] + b"\x04" + lead + ops
    at = len(stream) - 1
    stream += OP["POP"] * (2 if reach == "dup" else 1) + OP["NONE"] + OP["STOP"]
    with pytest.raises(GlobalMutationError, match=rf"^{opname} at byte {at} changes torch"):
        check_pickle(stream)


def test_an_empty_batch_is_no_change() -> None:
    """SETITEMS, APPENDS and ADDITEMS with nothing after the MARK: the unpickler returns
    before it looks at the target, so the bounded child reads such a stream too."""
    for opname in ("SETITEMS", "APPENDS", "ADDITEMS"):
        stream = OP["PROTO"] + b"\x04" + global_("torch", "FloatStorage") + OP["MARK"]
        check_pickle(stream + OP[opname] + OP["POP"] + OP["NONE"] + OP["STOP"])


def test_a_global_behind_a_sparse_memo_is_seen_where_the_unpickler_sees_it() -> None:
    """After `PUT 1` the unpickler's MEMOIZE stores at 1 (the number of slots stored), not
    at 2: the audit modelled the latter, so BINGET 1 showed it a constant where the
    unpickler had the global."""
    hidden = BIN_ATTACKS["sparse-memo-alias"][0]
    with pytest.raises(GlobalMutationError, match=r"changes torch\.FloatStorage"):
        check_pickle(OP["PROTO"] + b"\x02" + hidden + OP["NONE"] + OP["STOP"])


def test_diff_of_bf16_and_f32_after_a_hostile_read_says_they_differ(
    files: Files, capsys: pytest.CaptureFixture[str]
) -> None:
    """`ckpt-inspect diff` said "identical" for BF16 against F32 once a hostile `.bin` had
    been read in the process; a BF16 checkpoint whose own file held the attack made every
    F32 one compared with it identical."""
    assert main(["check", str(files.hostile_bin("build-slots")), "--json"]) == 1
    capsys.readouterr()
    assert main(["diff", str(files.bf16), str(files.f32), "--json"]) == 1
    changed = {c["name"]: (c["a_dtype"], c["b_dtype"]) for c in _json(capsys)["changed"]}
    assert changed == {"a.weight": ("BF16", "F32"), "b.bias": ("BF16", "F32")}
    result = diff_checkpoints(scan(files.bf16), scan(files.f32))
    assert not result.identical and len(result.changed) == 2


def _json(capsys: pytest.CaptureFixture[str]) -> dict:
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("attack", ["build-slots", "build-slots-list"])
def test_a_hostile_shard_leaves_the_next_shard_as_it_reads_alone(
    tmp_path: Path, attack: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two shards huggingface_hub wrote, the first made hostile: `check` reports it
    (exit 1; `X = []` ended it with an internal error, exit 2) and the second shard reads as
    alone (it got `bin-record-missing`: its storages measured with the other dtype)."""
    from huggingface_hub import save_torch_state_dict

    folder = tmp_path / "two-shards"
    folder.mkdir()
    state = {f"layers.{i}.weight": torch.randn(64, 64) for i in range(4)}
    save_torch_state_dict(state, folder, max_shard_size="40KB", safe_serialization=False)
    shards = sorted(folder.glob("*.bin"))
    assert len(shards) >= 2
    alone = read_alone([("bin", shards[1])])[0]
    clean_first = folder / "clean-first.tmp"
    shutil.move(shards[0], clean_first)
    rewrite_bin(clean_first, shards[0], BIN_ATTACKS[attack][0])
    clean_first.unlink()
    assert main(["check", str(folder), "--json"]) == 1
    found = {(f["code"], f["file"]) for f in _json(capsys)["findings"]}
    assert ("pickle-hostile", shards[0].name) in found
    assert not any(file == shards[1].name for _, file in found), found
    assert read_one("bin", shards[1].read_bytes()) == alone


def test_a_bin_converted_after_a_hostile_read_keeps_its_dtypes(
    files: Files, tmp_path: Path
) -> None:
    """The `.bin` converter (consolidate to safetensors) reads through the same reader."""
    from safetensors import safe_open

    assert main(["check", str(files.hostile_bin("memo-alias"))]) == 1
    assert main(["consolidate", str(files.f32), str(tmp_path / "out"), "--no-progress"]) == 0
    (out,) = (tmp_path / "out").glob("*.safetensors")
    with safe_open(out, "pt") as f:
        got = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open has no iter)
    for name, tensor in _state().items():
        assert got[name].dtype == tensor.dtype
        assert torch.equal(got[name].view(torch.uint8), tensor.view(torch.uint8))


@pytest.mark.parametrize("path", ["audited", "child"])
@pytest.mark.parametrize("name", sorted(METADATA_ATTACKS))
def test_a_metadata_pickle_acting_on_a_global_is_refused_and_no_later_read_changes(
    files: Files, name: str, path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The DCP `.metadata` reader, in this process after the audit and in the bounded child
    (no audit there: a stand-in refusing the change sends the file to the audited path)."""
    if path == "child":
        if not sandbox_available():
            pytest.skip("the sandbox is Linux-only")
        defaults = dict(dcp_metadata.read_dcp_metadata.__kwdefaults__ or {})
        defaults["limits"] = FORCED
        monkeypatch.setattr(dcp_metadata.read_dcp_metadata, "__kwdefaults__", defaults)
    _, expected = METADATA_ATTACKS[name]
    before = stand_in_state()
    codes = {f.code for f in check(scan(files.hostile_dcp(name)), model=False)}
    baseline = {f.code for f in check(scan(files.dcp), model=False)}
    assert codes - baseline == ({expected} if expected else set())
    assert stand_in_state() == before
    assert_clean_reads_as_alone(files)
    tensors = scan(files.dcp).tensors
    assert sorted(tensors["dtype"].astype(str)) == ["BF16", "F32"]


@pytest.mark.skipif(not sandbox_available(), reason="the sandbox is Linux-only")
@pytest.mark.parametrize(
    ("target", "state"),
    [
        ("member", OP["EMPTY_DICT"] + text("_value_") + text("x") + OP["SETITEM"]),
        ("member", slot_state({"_name_": text("X")})),
        ("class", slot_state({"__len__": OP["NONE"]})),
    ],
)
def test_the_childs_reply_cannot_change_a_class_or_member_it_names(
    monkeypatch: pytest.MonkeyPatch, target: str, state: bytes
) -> None:
    """The reply is read here with the classes the caller names; a reply that BUILDs on one
    of them, or on an enum member (REDUCE gives the member every reader shares), is refused
    (the child read hostile bytes: its reply is input too)."""
    if target == "member":  # FileRole("config"), the member every reader shares
        named = text(FileRole.__module__) + text("FileRole") + OP["STACK_GLOBAL"]
        named += text("config") + OP["TUPLE1"] + OP["REDUCE"]
    else:  # the class Dims itself
        named = text(Dims.__module__) + text("Dims") + OP["STACK_GLOBAL"]
    reply = OP["PROTO"] + b"\x04" + named + state + OP["BUILD"] + OP["STOP"]
    before = stand_in_state(), dict(vars(Dims))
    monkeypatch.setattr(sandbox.pickle, "dumps", lambda *_, **__: reply)
    with pytest.raises(SandboxFailed, match="could not be read"):
        run_bounded(lambda: None, size=0, classes=REPLY_CLASSES, limits=FORCED)
    monkeypatch.undo()
    assert (stand_in_state(), dict(vars(Dims))) == before
    assert FileRole("config") is FileRole.CONFIG and FileRole.CONFIG.value == "config"


def test_a_reply_class_without_a_setstate_is_refused() -> None:
    class Loose:
        pass

    with pytest.raises(TypeError, match="__setstate__"):
        run_bounded(lambda: None, size=0, classes=(Loose,), limits=FORCED)


@pytest.mark.parametrize(
    ("reader", "module", "name"),
    [
        (METADATA, "torch._utils", "_rebuild_tensor_v2"),
        (METADATA, "torch", "FloatStorage"),
        (METADATA, "torch.storage", "UntypedStorage"),
        (DATA_PKL, "torch", "Size"),
        (DATA_PKL, "pathlib", "PosixPath"),
        (DATA_PKL, "torch.distributed.checkpoint.metadata", "Metadata"),
        (DATA_PKL, "torch.serialization", "_get_layout"),
    ],
)
def test_a_global_of_one_reader_is_refused_by_the_other(
    reader: Reader, module: str, name: str
) -> None:
    """The allow-list is one table, but each row names the readers that resolve it: a
    `.metadata` cannot name what data.pkl is handed, nor the reverse."""
    other = DATA_PKL if reader is METADATA else METADATA
    assert (module, name) in stand_ins(other) and (module, name) not in stand_ins(reader)
    stream = OP["PROTO"] + b"\x02" + global_(module, name) + OP["STOP"]
    with pytest.raises(RefusedGlobalError, match=re.escape(f"{module}.{name}")) as refused:
        unpickle(stream, reader)
    assert not isinstance(refused.value, HostilePickleError)


_QUANTIZED = "holds quantized tensors (torch.{}), which have no byte layout a safetensors reader"
_NOT_TENSOR_DICT = "data.pkl names torch.{}, which is not part of a tensor dict; refused"


@pytest.mark.parametrize(
    ("name", "says"),
    [
        *((kind, _QUANTIZED) for kind in ("QInt8Storage", "QUInt8Storage", "QInt32Storage")),
        *((kind, _QUANTIZED) for kind in ("QUInt4x2Storage", "QUInt2x4Storage")),
        ("QFloat8Storage", _NOT_TENSOR_DICT),
        ("FloatStorage", None),
    ],
)
def test_data_pkl_refuses_a_quantized_storage_with_its_reason(
    files: Files, name: str, says: str | None
) -> None:
    """data.pkl's reader (`allowed.DATA_PKL`) gives torch's quantized storages a reason of
    their own (what to do), any other storage class it lacks the refusal every reader
    gives; a storage class it has reads the file as before."""
    archive = (files.f32 / BIN).read_bytes()
    ops = global_("torch", name) + OP["POP"]
    result = read_one("bin", with_data_pkl(archive, splice(data_pkl(archive), ops)))
    if says is None:  # against bytes of the same length pushed and popped: the same offsets
        same = OP["SHORT_BINBYTES"] + bytes([len(ops) - 3]) + b"x" * (len(ops) - 3) + OP["POP"]
        assert result == read_one("bin", with_data_pkl(archive, splice(data_pkl(archive), same)))
    else:
        assert "'bin-unreadable'" in result and says.format(name) in result


def test_stand_ins_refuse_every_change() -> None:
    """What the readers hand a stream for a global, attacked the way BUILD does it."""
    attribute = "dtype"
    for table in (stand_ins(DATA_PKL), stand_ins(METADATA)):
        for key, stand_in in table.items():
            with pytest.raises((HostilePickleError, TypeError)):
                stand_in.__setstate__({"x": 1})
            with pytest.raises(HostilePickleError):
                setattr(stand_in, attribute, "bfloat16")  # what BUILD's slot state does
            assert not hasattr(stand_in, "__setitem__") or isinstance(stand_in, type), key
    storage = ("torch", "FloatStorage")
    assert stand_ins(DATA_PKL)[storage] is not stand_ins(DATA_PKL)[storage]


_ORDER = st.lists(st.integers(0, 1 << 16), min_size=1, max_size=8)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(order=_ORDER)
def test_reading_files_in_any_order_gives_each_the_result_it_has_alone(
    files: Files, order: list[int]
) -> None:
    before = stand_in_state()
    paths = sorted(files.alone, key=str)
    for index in order:
        path = paths[index % len(paths)]
        kind = "metadata" if path.name == ".metadata" else "bin"
        assert read_one(kind, path.read_bytes()) == files.alone[path], path
    assert stand_in_state() == before


def test_pickle_ops_build_what_pickletools_reads() -> None:
    """The hand-made streams are well-formed opcode sequences (checked without unpickling)."""
    import pickletools

    for ops, _ in BIN_ATTACKS.values():
        stream = OP["PROTO"] + b"\x02" + ops + OP["NONE"] + OP["STOP"]
        names = [opcode.name for opcode, _, _ in pickletools.genops(stream)]
        assert names[-1] == "STOP"
    assert re.fullmatch(rb"c\S+\n\S+\n", global_("torch", "FloatStorage"))
