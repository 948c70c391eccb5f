"""Hostile pickles (issue 9, items 4 and 5): bombs that would hang or overflow the unpickler
or the walks over its result, and files that name code-running callables. Each test builds
a minimal torch_dist folder holding one hostile file and scans it; nothing may run, hang or
raise, and each refusal is a finding naming the file."""

from __future__ import annotations

import io
import pickle
import subprocess
import zipfile
from pathlib import Path

import pytest
import torch
from commands import run
from pickle_ops import with_data_pkl

from inspector._internal.checks import check
from inspector._internal.common.text import short_repr
from inspector._internal.formats.pickles.audit import (
    audit_pickle,
    check_pickle,
    hostile_globals,
)
from inspector._internal.formats.pickles.common_state import audit_torch_save
from inspector._internal.formats.pickles.dcp_metadata import load_dcp_metadata
from inspector._internal.formats.pickles.errors import (
    HostilePickleError,
    PickleBombError,
    PickleFormatError,
    RefusedGlobalError,
)
from inspector._internal.scan.entry import scan

# Pickle opcodes used to hand-build streams that Python could not build as objects (the
# tuple-DAG dict would hang in hashing before it could be pickled).
PROTO4, EMPTY_DICT, EMPTY_TUPLE, MEMOIZE, TUPLE2 = b"\x80\x04", b"}", b")", b"\x94", b"\x86"
TUPLE1, SETITEM, STOP, POP = b"\x85", b"s", b".", b"0"


def binget(i: int) -> bytes:
    return b"h" + bytes([i])


def dag_key_metadata(levels: int = 40) -> bytes:
    """`{k: 1}` where k = (k', k') nested `levels` times through the memo: ~7 bytes a level,
    2**levels tuples to hash when the unpickler stores the key (each level is memoized and
    popped, so the dict is still the target when SETITEM comes: the C unpickler takes 30 ms
    at 22 levels, about 2.2 times more per level)."""
    body = EMPTY_TUPLE + MEMOIZE + POP
    for i in range(levels):
        body += binget(i) + binget(i) + TUPLE2 + MEMOIZE + POP
    return PROTO4 + EMPTY_DICT + body + binget(levels) + b"K\x01" + SETITEM + STOP


def deep_key_metadata(depth: int = 100_000) -> bytes:
    """`{((((...)))): 1}`, a key nested `depth` tuples deep."""
    return PROTO4 + EMPTY_DICT + EMPTY_TUPLE + TUPLE1 * depth + b"K\x01" + SETITEM + STOP


def folder_with(tmp_path: Path, files: dict[str, bytes]) -> Path:
    """A torch_dist folder (`.metadata` makes it one) holding `files`."""
    folder = tmp_path / "ckpt"
    folder.mkdir()
    for name, data in files.items():
        (folder / name).write_bytes(data)
    return folder


def empty_metadata() -> bytes:
    from torch.distributed.checkpoint.metadata import Metadata

    return pickle.dumps(Metadata(state_dict_metadata={}))


def torch_bytes(obj: object, **kwargs: object) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer, **kwargs)
    return buffer.getvalue()


def findings_of(folder: Path, code: str) -> list:
    return [f for f in check(scan(folder)) if f.code == code]


# -- item 4: bombs ------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_metadata_tuple_dag_key_is_refused_not_hashed(tmp_path: Path) -> None:
    data = dag_key_metadata(40)
    assert len(data) < 300
    folder = folder_with(tmp_path, {".metadata": data})
    (f,) = findings_of(folder, "pickle-bomb")
    assert f.file == ".metadata"
    assert "through shared references" in f.message and "refused before unpickling" in f.message


@pytest.mark.timeout(60)
def test_metadata_key_nested_100000_deep_is_refused_without_recursion_error(
    tmp_path: Path,
) -> None:
    folder = folder_with(tmp_path, {".metadata": deep_key_metadata(100_000)})
    (f,) = findings_of(folder, "pickle-bomb")
    assert f.file == ".metadata" and "more than 100 levels deep" in f.message


def _list_bomb(levels: int = 40) -> list:
    a: list = []
    for _ in range(levels):
        a = [a, a]
    return a


@pytest.mark.timeout(60)
def test_common_pt_list_bomb_is_refused(tmp_path: Path) -> None:
    common = torch_bytes({"args": _list_bomb(40)})
    assert len(common) < 10_000
    folder = folder_with(tmp_path, {".metadata": empty_metadata(), "common.pt": common})
    (f,) = findings_of(folder, "pickle-bomb")
    assert f.file == "common.pt" and "objects through shared references" in f.message


@pytest.mark.timeout(60)
def test_common_pt_self_referencing_list_is_refused(tmp_path: Path) -> None:
    a: list = []
    a.append(a)
    folder = folder_with(
        tmp_path, {".metadata": empty_metadata(), "common.pt": torch_bytes({"x": a})}
    )
    (f,) = findings_of(folder, "pickle-bomb")
    assert f.file == "common.pt" and "reference cycle" in f.message


def test_memo_index_far_ahead_is_refused() -> None:
    # LONG_BINPUT 2**31: the unpickler would allocate and clear 16 GB of memo slots.
    stream = PROTO4 + b"N" + b"r\x00\x00\x00\x80" + STOP
    with pytest.raises(PickleBombError, match="memo entry at index 2,147,483,648"):
        audit_pickle(stream)


def dag_key_behind_a_sparse_put(levels: int = 40) -> bytes:
    """The tuple-DAG key of `dag_key_metadata`, memoized with MEMOIZE after one `PUT 1000`:
    the unpickler's MEMOIZE stores at the number of slots stored so far (1, 2, 3...), not one
    past the highest index (1001, 1002...), so the BINGETs of each level name 1, 2, 3..."""
    long_binput, long_binget = b"r", b"j"
    body = PROTO4 + b"N" + long_binput + (1000).to_bytes(4, "little") + POP + EMPTY_DICT
    body += EMPTY_TUPLE + MEMOIZE + POP  # slot 1
    for i in range(1, levels + 1):
        get = long_binget + i.to_bytes(4, "little")
        body += get + get + TUPLE2 + MEMOIZE + POP  # slot i + 1
    get = long_binget + (levels + 1).to_bytes(4, "little")
    return body + get + b"K\x01" + SETITEM + STOP


def test_the_memo_is_modelled_as_the_unpickler_keeps_it(tmp_path: Path) -> None:
    """The audit stored MEMOIZE one past the highest index: every BINGET of the bomb above
    showed it an empty slot, and the 542-byte 2**40 hash passed (a `.metadata` under 1 MB is
    unpickled in this process after the audit)."""
    data = dag_key_behind_a_sparse_put(40)
    with pytest.raises(PickleBombError, match="through shared references"):
        audit_pickle(data)
    (f,) = findings_of(folder_with(tmp_path, {".metadata": data}), "pickle-bomb")
    assert f.file == ".metadata"


def test_a_negative_text_memo_index_is_malformed() -> None:
    # `g-1\n`: the unpickler finds no slot -1; a list index would wrap to the last slot.
    with pytest.raises(PickleFormatError, match="negative"):
        audit_pickle(PROTO4 + b"N" + MEMOIZE + b"g-1\n" + STOP)


def test_raw_unicode_names_are_decoded_as_the_unpickler_decodes_them() -> None:
    """Protocol 0's UNICODE is raw-unicode-escape text: `\\u006fs` is the module `os`."""
    stream = b"V\\u006fs\nVsystem\n\x93" + STOP
    with pytest.raises(HostilePickleError, match=r"os\.system"):
        check_pickle(stream)


def test_huge_integer_is_refused() -> None:
    stream = PROTO4 + b"\x8b" + (4096).to_bytes(4, "little") + b"\x01" * 4096 + STOP
    with pytest.raises(PickleBombError, match="integer wider than 128 bytes"):
        audit_pickle(stream)


def test_bounds_are_proportional_to_the_file() -> None:
    """A real `.metadata` expands to about as many objects as it has opcodes: the audit's
    budget (2 objects per byte) leaves it far inside, while a bomb is far outside."""
    from torch.distributed.checkpoint.metadata import (
        ChunkStorageMetadata,
        Metadata,
        TensorProperties,
        TensorStorageMetadata,
    )

    entries = {
        f"decoder.layers.{i}.mlp.linear_fc1.weight": TensorStorageMetadata(
            TensorProperties(dtype=torch.bfloat16),
            torch.Size([64, 16]),
            [ChunkStorageMetadata(torch.Size([c * 16, 0]), torch.Size([16, 16])) for c in range(4)],
        )
        for i in range(500)
    }
    data = pickle.dumps(Metadata(state_dict_metadata=entries))
    audit = audit_pickle(data)
    assert audit.objects < len(data)
    assert audit.depth < 20
    assert load_dcp_metadata(data).kind == "Metadata"


# -- item 5: hostile callables ------------------------------------------------------------


class _Reduces:
    """Pickles as a call to `func(*args)`; loading it with plain pickle would make the call."""

    def __init__(self, func: object, *args: object) -> None:
        self.func, self.args = func, args

    def __reduce__(self):
        return (self.func, self.args)


@pytest.mark.parametrize(
    ("func", "name"),
    [(subprocess.Popen, "subprocess.Popen"), (eval, "builtins.eval"), (exec, "builtins.exec")],
)
def test_common_pt_naming_code_runners_is_hostile(tmp_path: Path, func: object, name: str) -> None:
    marker = tmp_path / "pwned"
    payload = ["touch", str(marker)] if func is subprocess.Popen else f"open({str(marker)!r}, 'w')"
    common = torch_bytes({"args": _Reduces(func, payload), "iteration": 100})
    folder = folder_with(tmp_path, {".metadata": empty_metadata(), "common.pt": common})
    (f,) = findings_of(folder, "pickle-hostile")
    assert not marker.exists()
    assert f.file == "common.pt" and f.severity == "error"
    assert name in f.message and "nothing ran" in f.message


def test_common_state_inside_distcp_naming_os_system_is_hostile(tmp_path: Path) -> None:
    """Newer Megatron stores the common state as a byte object in a `.distcp` file."""
    from inspector._internal.demo.torch_dist import save_megatron_dcp

    marker = tmp_path / "pwned"
    blob = io.BytesIO(torch_bytes([{"args": _Reduces(__import__("os").system, f"touch {marker}")}]))
    folder = tmp_path / "ckpt"
    folder.mkdir()
    save_megatron_dcp(
        {"common_state/shard_0_1": blob, "w": torch.zeros(2)}, folder, metadata_json=True
    )
    (f,) = findings_of(folder, "pickle-hostile")
    assert not marker.exists()
    assert f.file.endswith(".distcp[common_state/shard_0_1]") and "system" in f.message


def test_legacy_torch_format_is_audited_too(tmp_path: Path) -> None:
    common = torch_bytes({"args": _Reduces(eval, "1")}, _use_new_zipfile_serialization=False)
    assert not common.startswith(b"PK")
    with pytest.raises(HostilePickleError, match=r"builtins\.eval"):
        audit_torch_save(common, cap=10**6)


# -- the common state as torch reads it (issue 32, step 3: found attacking the walker) --------


def torch_dag_key(levels: int = 40) -> bytes:
    """`dag_key_metadata` in the opcodes torch's weights-only unpickler knows (no MEMOIZE,
    no POP): each level stays on the stack, and STOP returns the dict on top."""
    body = EMPTY_DICT + b"q\x00" + EMPTY_TUPLE + b"q\x01"
    for i in range(1, levels + 1):
        body += binget(i) + binget(i) + TUPLE2 + b"q" + bytes([i + 1])
    return b"\x80\x02" + body + binget(0) + binget(levels + 1) + b"K\x01" + SETITEM + STOP


def _same_length(stream: bytes) -> bytes:
    """A clean pickle (`{}`, then bytes pushed and dropped) exactly as long as `stream`."""
    n = len(stream) - 10
    return b"\x80\x02}" + b"B" + n.to_bytes(4, "little") + b"y" * n + POP + STOP


def _as_torch_saves(stream: bytes) -> bytes:
    return with_data_pkl(torch_bytes({"k": 1}), stream)


@pytest.mark.timeout(60)
def test_common_pt_with_a_clean_archive_after_it_is_refused(tmp_path: Path) -> None:
    """torch (miniz) reads the first of two torch.save archives written one after the
    other, `zipfile` the second: the audit read the clean second one, torch.load hashed the
    first one's tuple-DAG key for hours. The two readers must agree on the directory."""
    bomb = torch_dag_key(40)
    common = _as_torch_saves(bomb) + _as_torch_saves(_same_length(bomb))
    folder = folder_with(tmp_path, {".metadata": empty_metadata(), "common.pt": common})
    (f,) = findings_of(folder, "torch-dist-common-unreadable")
    assert f.file == "common.pt" and "would read different archives" in f.message


@pytest.mark.timeout(60)
def test_legacy_common_pt_with_a_zip_after_it_is_audited_as_torch_reads_it(
    tmp_path: Path,
) -> None:
    """torch reads a file as a zip only when it starts with one (`_is_zipfile`); the audit
    took any file `zipfile` could open for a zip, so a legacy stream followed by a clean
    torch.save archive was audited as the archive and unpickled as the stream."""
    legacy = torch_bytes({"k": 1}, _use_new_zipfile_serialization=False)
    ends = [0]
    for _ in range(4):  # magic number, protocol, system info, the object
        ends.append(audit_pickle(legacy, start=ends[-1]).end)
    hostile = legacy[: ends[3]] + torch_dag_key(40) + legacy[ends[4] :]
    common = hostile + torch_bytes({"k": 1})
    folder = folder_with(tmp_path, {".metadata": empty_metadata(), "common.pt": common})
    (f,) = findings_of(folder, "pickle-bomb")
    assert f.file == "common.pt"


@pytest.mark.timeout(60)
def test_common_pt_data_pkl_named_in_another_case_is_audited(tmp_path: Path) -> None:
    """torch finds `<archive>/data.pkl` ignoring ASCII case (miniz): `data.PKL` is what it
    unpickles, beside a clean `x.pkl` that was all the audit read."""
    buffer = io.BytesIO()
    with (
        zipfile.ZipFile(io.BytesIO(torch_bytes({"k": 1}))) as zin,
        zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as zout,
    ):
        for info in zin.infolist():
            body = zin.read(info)
            if info.filename.endswith("/data.pkl"):
                info.filename, body = info.filename[: -len("pkl")] + "PKL", torch_dag_key(40)
            zout.writestr(info, body)
        zout.writestr("archive/x.pkl", b"\x80\x02}q\x00.")
    folder = folder_with(tmp_path, {".metadata": empty_metadata(), "common.pt": buffer.getvalue()})
    (f,) = findings_of(folder, "pickle-bomb")
    assert f.file == "common.pt"


def test_metadata_naming_os_system_is_hostile_and_still_a_refused_global() -> None:
    import os

    data = pickle.dumps(_Reduces(os.system, "true"))
    with pytest.raises(RefusedGlobalError) as info:
        load_dcp_metadata(data)
    assert isinstance(info.value, HostilePickleError)


def test_unknown_classes_are_not_hostile() -> None:
    """Names a real writer pickles are inert records or unreadable, never 'hostile'."""
    honest = [
        "argparse.Namespace",
        "megatron.core.rerun_state_machine.RerunMode",
        "collections.OrderedDict",
        "torch._utils._rebuild_tensor_v2",
        "torch.bfloat16",
        "builtins.set",
        "_codecs.encode",
        "pathlib.PosixPath",
        "numpy.core.multiarray._reconstruct",
        "numpy.dtype",
        "megatron.training.config:TrainingConfig.Mode",  # a nested class (protocol 4)
    ]
    assert hostile_globals(honest) == ()
    hostile = [
        "os.system",
        "posix.system",
        "nt.system",
        "subprocess.Popen",
        "builtins.getattr",
        "builtins.__import__",
        "builtins.eval",
        "operator.attrgetter",
        "functools.partial",
        "torch.load",
        "numpy.load",
        "pathlib:Path.write_text",
        "mymodule:Config.__init__.__globals__",
        "webbrowser.open",
        "some.module.popen2",
    ]
    assert hostile_globals(hostile) == tuple(hostile)


def test_stack_global_names_are_listed() -> None:
    """Protocol 4 builds a global from two strings on the stack (STACK_GLOBAL)."""

    class Builtin:
        def __reduce__(self):
            return (getattr, ("sys", "upper"))

    with pytest.raises(HostilePickleError, match=r"builtins\.getattr"):
        check_pickle(pickle.dumps(Builtin(), protocol=4))


def test_refusals_echo_a_bounded_part_of_the_file() -> None:
    long_name = "m" * 50_000
    stream = b"c" + long_name.encode() + b"\nsystem\n)R."
    with pytest.raises(HostilePickleError) as info:
        check_pickle(stream)
    assert len(str(info.value)) < 400
    assert len(short_repr(list(range(10**6)))) <= 200


def test_cli_reports_a_bomb_as_a_finding_without_traceback(tmp_path: Path) -> None:
    folder = folder_with(tmp_path, {".metadata": dag_key_metadata(40)})
    proc = run("check", folder)  # the command's work: no process needed (tests/commands.py)
    assert proc.returncode == 1, proc.stderr
    assert "pickle-bomb" in proc.stdout and "Traceback" not in proc.stderr
