"""The bounded child that reads large `.metadata` files (`pickles.sandbox`): it
computes in another process, a bomb kills only the child and the stream then takes the audited path,
which names what was refused; a healthy file gives exactly what the audited path gives.

The limits are made small here (`FORCED`) so that small hand-built files take the child
path and a bomb costs a second or two (`SHORT_CPU`: one), not the defaults' five."""

from __future__ import annotations

import os
import pickle
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from test_hostile_pickles import _Reduces, dag_key_metadata, deep_key_metadata

from inspector._internal.checkpoint.read_problems import FileRole, ProblemKind, ReadProblem
from inspector._internal.checkpoint.scanned import TorchDistTensor
from inspector._internal.formats.pickles.dcp_metadata import (
    MetadataFormatError,
    _metadata,
    load_dcp_metadata,
    read_dcp_metadata,
)
from inspector._internal.formats.pickles.errors import HostilePickleError, PickleBombError
from inspector._internal.formats.pickles.sandbox import (
    SandboxFailed,
    SandboxLimits,
    run_bounded,
    sandbox_available,
)
from inspector._internal.formats.pickles.stand_ins import Dims, StandIn
from inspector._internal.layouts import torch_dist

pytestmark = pytest.mark.skipif(not sandbox_available(), reason="the sandbox is Linux-only")

FORCED = SandboxLimits(min_size=0, cpu_floor=1.0, memory_floor=512 << 20)
# For a bomb that must exhaust the child's CPU: RLIMIT_CPU counts whole seconds, so FORCED's
# floor plus the per-byte share rounds up to 2 s; this rounds up to the least, 1 s.
SHORT_CPU = SandboxLimits(min_size=0, cpu_floor=0.5, memory_floor=512 << 20)
CLASSES = (TorchDistTensor, ReadProblem, FileRole, ProblemKind)
FIXTURES = Path(__file__).parent / "fixtures" / "writers"


def convert(meta: StandIn) -> object:
    return torch_dist._convert_metadata(meta, rel=".metadata", prefix="")


def in_child(data: bytes) -> object:
    """The `.metadata` read only through the child: no fallback to the audited path."""
    return run_bounded(
        lambda: convert(_metadata(data, audited=False)),
        size=len(data),
        classes=(Dims, *CLASSES),
        limits=FORCED,
    )


def metadata_bytes(entries: int) -> bytes:
    """What torch's DCP writer pickles for `entries` tensors of 4 chunks each."""
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import (
        ChunkStorageMetadata,
        Metadata,
        MetadataIndex,
        TensorProperties,
        TensorStorageMetadata,
    )

    tensors, storage = {}, {}
    for i in range(entries):
        fqn = f"decoder.layers.{i}.mlp.linear_fc1.weight"
        chunks = [
            ChunkStorageMetadata(torch.Size([c * 16, 0]), torch.Size([16, 16])) for c in range(4)
        ]
        tensors[fqn] = TensorStorageMetadata(
            TensorProperties(dtype=torch.bfloat16), torch.Size([64, 16]), chunks
        )
        for c, chunk in enumerate(chunks):
            storage[MetadataIndex(fqn, chunk.offsets)] = _StorageInfo(f"__{c}_0.distcp", i, 512)
    return pickle.dumps(Metadata(state_dict_metadata=tensors, storage_data=storage))


def test_the_child_computes_in_another_process() -> None:
    assert run_bounded(os.getpid, size=0, limits=FORCED) != os.getpid()


def outcome(read: Callable[[], object]) -> tuple[str, object]:
    try:
        return "read", read()
    except Exception as exc:
        return type(exc).__name__, str(exc)


def test_a_healthy_metadata_reads_the_same_through_the_child() -> None:
    data = metadata_bytes(300)
    expected = convert(load_dcp_metadata(data))
    assert in_child(data) == expected
    assert read_dcp_metadata(data, convert, classes=CLASSES, limits=FORCED) == expected
    # megatron-core's own files: the same outcome by either path, whatever it is.
    for path in sorted(FIXTURES.glob("megatron/*/.metadata")):
        data = path.read_bytes()
        sandboxed = outcome(
            lambda d=data: read_dcp_metadata(d, convert, classes=CLASSES, limits=FORCED)
        )
        assert sandboxed == outcome(lambda d=data: convert(load_dcp_metadata(d))), path
    tensors, _bytes, storage, problems = in_child(metadata_bytes(3))
    assert problems == [] and len(storage) == 12
    assert tensors["decoder.layers.0.mlp.linear_fc1.weight"].chunks[1] == ((16, 0), (16, 16))


def test_a_hash_bomb_exhausts_the_childs_cpu_and_is_then_named(tmp_path: Path) -> None:
    data = dag_key_metadata(40)
    assert SHORT_CPU.cpu_seconds(len(data)) == 1
    with pytest.raises(SandboxFailed, match="used more than 1 s of CPU"):
        run_bounded(lambda: _metadata(data, audited=False), size=len(data), limits=SHORT_CPU)
    with pytest.raises(PickleBombError, match="through shared references"):
        read_dcp_metadata(data, convert, classes=CLASSES, limits=SHORT_CPU)


def test_a_100000_deep_key_is_refused_as_too_deep() -> None:
    with pytest.raises(PickleBombError, match="more than 100 levels deep"):
        read_dcp_metadata(deep_key_metadata(100_000), convert, classes=CLASSES, limits=FORCED)


def test_a_memo_index_far_ahead_exhausts_only_the_child() -> None:
    # LONG_BINPUT 2**28: the C unpickler would allocate 2 GB of memo slots.
    data = b"\x80\x04N" + b"r" + (1 << 28).to_bytes(4, "little") + b"."
    with pytest.raises(SandboxFailed):
        run_bounded(lambda: _metadata(data, audited=False), size=len(data), limits=FORCED)
    with pytest.raises(PickleBombError, match="memo entry at index 268,435,456"):
        read_dcp_metadata(data, convert, classes=CLASSES, limits=FORCED)


def test_a_code_running_global_is_hostile_and_nothing_runs(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    data = pickle.dumps(_Reduces(os.system, f"touch {marker}"))
    with pytest.raises(HostilePickleError, match="system"):
        read_dcp_metadata(data, convert, classes=CLASSES, limits=FORCED)
    assert not marker.exists()


def test_a_size_too_wide_to_print_is_refused() -> None:
    from torch.distributed.checkpoint.metadata import (
        Metadata,
        TensorProperties,
        TensorStorageMetadata,
    )

    wide = _Reduces(torch.Size, (2**1200,))  # pickled as torch.Size((2**1200,))
    entry = TensorStorageMetadata(TensorProperties(dtype=torch.float32), wide, [])
    data = pickle.dumps(Metadata(state_dict_metadata={"w": entry}))
    with pytest.raises(PickleBombError, match="integer wider than 128 bytes"):
        read_dcp_metadata(data, convert, classes=CLASSES, limits=FORCED)
    with pytest.raises(SandboxFailed):
        in_child(data)


def test_a_reply_over_its_cap_is_refused() -> None:
    tight = SandboxLimits(min_size=0, cpu_floor=1.0, reply_floor=1000)
    with pytest.raises(SandboxFailed, match="more than"):
        run_bounded(lambda: b"x" * 10_000, size=0, limits=tight)


def test_a_child_that_raises_falls_back_to_the_audited_path() -> None:
    with pytest.raises(MetadataFormatError, match="expected a DCP Metadata"):
        read_dcp_metadata(pickle.dumps([1, 2]), convert, classes=CLASSES, limits=FORCED)


def test_the_reply_resolves_only_the_classes_named() -> None:
    with pytest.raises(SandboxFailed, match="could not be read"):
        run_bounded(lambda: ReadProblem("f", FileRole.CONFIG, "r"), size=0, limits=FORCED)
    assert run_bounded(lambda: sys.maxsize, size=0, limits=FORCED) == sys.maxsize


def test_the_child_works_from_a_worker_thread_while_others_run() -> None:
    """Notebooks and thread pools fork from threads, with other threads running: the child
    takes no lock they may hold, so the answer is the same."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    data = metadata_bytes(50)
    expected = convert(load_dcp_metadata(data))
    stop = threading.Event()
    lock = threading.Lock()

    def busy() -> None:
        while not stop.is_set():
            with lock:
                sum(range(1000))

    spinner = threading.Thread(target=busy)
    spinner.start()
    try:
        with ThreadPoolExecutor(2) as pool:
            results = list(pool.map(lambda _: in_child(data), range(4)))
    finally:
        stop.set()
        spinner.join()
    assert results == [expected] * 4
