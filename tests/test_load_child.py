"""The load verdict computed in a child process (`inspector._internal.load.child`): the verdict
the process itself would give, with torch and transformers never imported by the caller; a
folder that changed after the caller's scan is said, not answered for; a child out of time
gives a skipped verdict and the next request a fresh child; the answer is read as untrusted
data, field by field."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import MappingProxyType

import orjson
import pytest
from hf_exports import resaved
from hypothesis import given, settings
from hypothesis import strategies as st
from inspector.widgets.dashboard import CheckpointState

import inspector._internal.checks as checks
from inspector._internal.load import child as load_child
from inspector._internal.load.cache import CACHE_ENV
from inspector._internal.load.child import verdict_apart
from inspector._internal.load.records import ShapeMismatch
from inspector._internal.load.verdict import LoadVerdict, load_verdict, verdict_digest
from inspector._internal.scan.entry import scan

HEALTHY = "healthy-hf-sharded"
SCALE = "model.layers.2.mlp.experts.3.up_proj.weight_scale"


@pytest.fixture
def demos(demo_checkpoints: Path) -> Path:
    """The session's demo checkpoints; every test here that changes one works on a copy."""
    return demo_checkpoints


def _same(a: LoadVerdict, b: LoadVerdict) -> bool:
    maps = ("sources", "stored_as", "reasons")
    return a == b and all(dict(getattr(a, m)) == dict(getattr(b, m)) for m in maps)


# First in this file: the child it ends has only started importing, and the fresh one it
# then starts (torch and transformers imported, 5-8 s of CPU) answers the later tests.
def test_a_child_out_of_time_gives_a_skipped_verdict_then_a_fresh_child(
    demos: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("transformers")
    scanned = scan(demos / HEALTHY)
    load_child.start_verdict_process()
    first = load_child._CHILD._process
    assert first is not None
    monkeypatch.setattr(load_child._CHILD, "seconds", 0.001)
    late = verdict_apart(scanned)
    assert not late.ran and "gave no verdict: no answer within 0.001 s" in late.skipped
    assert first.poll() is not None  # ended, not left running
    monkeypatch.undo()
    assert _same(verdict_apart(scanned), load_verdict(scanned, cache=False))
    assert load_child._CHILD._process not in (None, first)


def test_the_child_gives_the_verdict_this_process_gives(demos: Path, tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    lost = resaved(demos / HEALTHY, tmp_path / "lost",
                   lambda s: {k: v for k, v in s.items() if k != SCALE})  # fmt: skip
    for folder in (demos / HEALTHY, demos / "modelopt-1422-sidecar-drift", lost):
        scanned = scan(folder)
        # Computed here too, not taken from the cache the child kept it in.
        apart, here = verdict_apart(scanned), load_verdict(scanned, cache=False)
        assert _same(apart, here), folder.name
        assert apart.ran and apart.architecture
    assert verdict_apart(scan(lost)).missing == (SCALE,)


def test_the_caller_never_imports_torch_or_transformers(
    demos: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fresh caller asks its child and reads the verdict with neither imported. The child
    there answers with the line the real one writes (`_serve`: the verdict this process
    computes, and the digest), read from a file: the real child's own verdict is the test
    above's, and a second interpreter importing torch and transformers (5-6 s of CPU) would
    only compute it again."""
    pytest.importorskip("transformers")
    scanned = scan(demos / HEALTHY)
    with monkeypatch.context() as patch:  # kept elsewhere: the caller must ask its child
        patch.setenv(CACHE_ENV, str(tmp_path / "elsewhere"))
        verdict = load_verdict(scanned, cache=False)
    answer = tmp_path / "answer"
    answer.write_bytes(
        orjson.dumps({"digest": verdict_digest(scanned), "verdict": verdict.to_dict()}) + b"\n"
    )
    child = (
        "import sys; sys.stdin.readline(); sys.stdout.buffer.write(open(sys.argv[1], 'rb').read())"
    )
    code = (
        "import sys\n"
        "from inspector._internal.scan.entry import scan\n"
        "from inspector._internal.load import child\n"
        "from inspector._internal.load.child import verdict_apart\n"
        "child._CHILD.command = [sys.executable, '-c', sys.argv[2], sys.argv[3]]\n"
        "v = verdict_apart(scan(sys.argv[1]))\n"
        "print(v.ran, v.loads, 'torch' in sys.modules, 'transformers' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(demos / HEALTHY), child, str(answer)],
        capture_output=True, text=True, timeout=600, check=True,
    ).stdout.split()  # fmt: skip
    assert out == ["True", "True", "False", "False"]


def test_a_folder_changed_after_the_scan_is_said_not_answered_for(
    demos: Path, tmp_path: Path
) -> None:
    pytest.importorskip("transformers")
    folder = Path(shutil.copytree(demos / HEALTHY, tmp_path / "ckpt"))
    scanned = scan(folder)
    other = resaved(folder, tmp_path / "other",
                    lambda s: {k: v for k, v in s.items() if k != SCALE})  # fmt: skip
    shutil.rmtree(folder)
    shutil.move(other, folder)
    verdict = verdict_apart(scanned)
    assert not verdict.ran and "changed while the load check read them" in verdict.skipped
    assert not verdict.missing and str(folder) in verdict.skipped
    # Scanned again, the folder gets its own verdict.
    assert verdict_apart(scan(folder)).missing == (SCALE,)
    # A folder gone since the scan: the same.
    shutil.rmtree(folder)
    gone = verdict_apart(scanned)
    assert not gone.ran and "changed while the load check read them" in gone.skipped


class _FakeChild(load_child.VerdictProcess):
    """A child that reads the request, then runs `script` (a hostile or broken child)."""

    def __init__(self, script: str) -> None:
        super().__init__(
            "inspector._internal.load.child",
            what="the load check",
            seconds=load_child.VERDICT_SECONDS,
        )
        self.script = script

    def _started(self) -> subprocess.Popen[bytes]:
        if self._process is None or self._process.poll() is not None:
            code = "import sys\nsys.stdin.readline()\n" + self.script
            self._process = subprocess.Popen(
                [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE
            )
        return self._process


@pytest.mark.parametrize(
    ("script", "said"),
    [
        ("print('not json', flush=True)", "answered with no verdict"),
        ("print('[1, 2]', flush=True)", "answered with no verdict"),
        (
            'print(\'{"verdict": {"complete": true, "missing": 5}}\', flush=True)',
            "answered with no verdict: load verdict field 'mismatched'",
        ),
        ("sys.exit(3)", "its process ended without an answer (exit status 3)"),
        ("sys.stdout.write('x' * 100); sys.stdout.flush(); sys.exit(0)", "ended without"),
    ],
)
def test_a_child_that_answers_no_verdict_gives_a_skipped_one(
    demos: Path, monkeypatch: pytest.MonkeyPatch, script: str, said: str
) -> None:
    fake = _FakeChild(script)
    monkeypatch.setattr(load_child, "_CHILD", fake)
    verdict = verdict_apart(scan(demos / HEALTHY))
    assert not verdict.ran and said in verdict.skipped, verdict.skipped
    assert fake._process is None  # ended: what it writes next cannot be trusted


@pytest.mark.parametrize(
    ("handler", "ended_by"),
    [("signal.SIG_DFL", signal.SIGTERM), ("signal.SIG_IGN", signal.SIGKILL)],
)
def test_close_asks_the_child_to_end_then_makes_it(
    monkeypatch: pytest.MonkeyPatch, handler: str, ended_by: signal.Signals
) -> None:
    # SIGTERM first, so a child that handles it (a measured one saves its line data) can;
    # one that ignores it is killed once _CLOSE_WAIT has passed, and is not left running.
    child = load_child.VerdictProcess("unused", what="a stand-in", seconds=5)
    child.command = [
        sys.executable,
        "-c",
        f"import signal, sys; signal.signal(signal.SIGTERM, {handler}); print(flush=True)"
        "; sys.stdin.read()",
    ]
    monkeypatch.setattr(load_child, "_CLOSE_WAIT", 0.2)
    child.start()
    process = child._process
    assert process is not None and process.stdout is not None
    process.stdout.readline()  # its handler is set
    child.close()
    assert process.returncode == -ended_by and child._process is None


def _stand_in(script: str, *args: str) -> load_child.VerdictProcess:
    """A child of the real `VerdictProcess` (its own session, its pipes) that runs `script`
    once it has read the request, and never answers."""
    child = load_child.VerdictProcess("unused", what="the load check", seconds=600)
    child.command = [sys.executable, "-c", f"import sys\nsys.stdin.readline()\n{script}", *args]
    return child


def _wait_for(path: Path) -> str:
    for _ in range(1200):
        if path.is_file() and path.read_text().endswith("\n"):
            return path.read_text()
        time.sleep(0.05)
    raise AssertionError(f"the stand-in child never wrote {path}")


def test_close_ends_the_child_at_once_while_a_request_waits_on_it(
    demos: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`close` (the kernel shutting down, the dashboard closed) does not wait behind a
    request for its answer (600 s at most): it ends the child, and the request gets a
    skipped verdict that says why."""
    asked = tmp_path / "asked"
    child = _stand_in("open(sys.argv[1], 'w').write('read\\n')\nimport time\ntime.sleep(600)",
                      str(asked))  # fmt: skip
    monkeypatch.setattr(load_child, "_CHILD", child)
    scanned = scan(demos / HEALTHY)
    verdicts: list[LoadVerdict] = []
    request = threading.Thread(target=lambda: verdicts.append(verdict_apart(scanned)))
    request.start()
    _wait_for(asked)
    process = child._process
    assert process is not None
    closing = threading.Thread(target=child.close)
    closing.start()
    try:
        closing.join(60)  # before: close waited for the lock the request held, 600 s
        request.join(60)
        assert not closing.is_alive() and not request.is_alive()
    finally:
        process.kill()  # when not: the request ends, and the test with it
    assert process.returncode == -signal.SIGTERM
    (verdict,) = verdicts
    assert not verdict.ran and "ended before it answered (the check was closed)" in verdict.skipped


def _running(pid: int) -> bool:
    """Whether `pid` still runs (ended, it is gone or a zombie nobody reaps)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not Path("/proc/self/stat").is_file(), reason="reads /proc")
def test_close_ends_the_processes_the_child_started(tmp_path: Path) -> None:
    """Code run with --trust-remote-code may start processes (from a thread the seal does not
    watch); they end with the child, also one that ignores SIGTERM."""
    pids = tmp_path / "pids"
    script = (
        "import subprocess, time\n"
        "a = subprocess.Popen(['sleep', '600'])\n"
        "b = subprocess.Popen(['sh', '-c', 'trap \"\" TERM; sleep 600'])\n"
        "open(sys.argv[1], 'w').write(f'{a.pid} {b.pid}\\n')\n"
        "time.sleep(600)\n"
    )
    child = _stand_in(script, str(pids))
    answers: list[str] = []

    def ask() -> None:
        with pytest.raises(load_child.NoAnswer) as no_answer:
            child.ask({})
        answers.append(str(no_answer.value))

    asking = threading.Thread(target=ask)
    asking.start()
    started = [int(p) for p in _wait_for(pids).split()]
    try:
        child.close()
        asking.join(60)
        assert [pid for pid in started if _running(pid)] == []
        assert answers == ["the load check's process gave no verdict: its process was ended "
                           "before it answered (the check was closed)"]  # fmt: skip
    finally:
        for pid in started:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.skipif(not Path("/proc/self/stat").is_file(), reason="reads /proc")
def test_a_child_that_ended_between_requests_is_ended_with_its_group(tmp_path: Path) -> None:
    """A child that answers, then ends by itself leaving a process it started (code run with
    --trust-remote-code, from a thread the seal does not watch), is ended with its group
    when the next request replaces it: before, the new child was started beside it, and
    `close` ended only the new one's group (the `sleep 600` went on running)."""
    pids = tmp_path / "pids"
    script = (
        "import os, subprocess\n"
        "a = subprocess.Popen(['sleep', '600'])\n"
        "open(sys.argv[1], 'w').write(f'{a.pid}\\n')\n"
        "sys.stdout.write('{}\\n'); sys.stdout.flush()\n"
        "os._exit(0)\n"
    )
    child = _stand_in(script, str(pids))
    try:
        assert child.ask({}) == {}
        (started,) = [int(p) for p in _wait_for(pids).split()]
        first = child._process
        assert first is not None
        for _ in range(1200):
            if not _running(first.pid):
                break
            time.sleep(0.05)
        child.start()  # the next request's child, in place of the one that ended
        assert child._process is not first and first.returncode == 0
        child.close()
        assert not _running(started)
    finally:
        child.close()
        with contextlib.suppress(ProcessLookupError, UnboundLocalError):
            os.kill(started, signal.SIGKILL)


_GOOD = LoadVerdict(
    architecture="DeepseekV3ForCausalLM",
    missing=("a.weight_scale",),
    unexpected=("b",),
    mismatched=(ShapeMismatch("c", (4, 2), (4, 3)),),
    mtp_skipped=("model.layers.3.x",),
    quantization_expected=("d", "e"),
    parameters=28_496,
    stored_parameters=37_040,
    mtp_parameters=8_544,
    quantization="NVFP4",
    transformers_version="5.0.0",
    sources=MappingProxyType({"b": ("b", "b2")}),
    stored_as=MappingProxyType({"a.weight_scale": "a.weight_scale"}),
    reasons=MappingProxyType({"a.weight_scale": "NVFP4 needs it"}),
)


@pytest.mark.parametrize(
    ("name", "bad"),
    [
        ("missing", "a"),
        ("missing", [1]),
        ("parameters", "3"),
        ("parameters", True),
        ("mtp_parameters", None),
        ("architecture", 5),
        ("mismatched", [{"key": "c", "stored": ["4"], "expected": [4]}]),
        ("mismatched", [{"key": None, "stored": [4], "expected": [4]}]),
        ("mismatched", ["c"]),
        ("sources", {"b": "b"}),
        ("sources", ["b"]),
        ("reasons", {"a": 1}),
        ("complete", False),
    ],
)
def test_an_answer_of_the_wrong_shape_is_refused(name: str, bad: object) -> None:
    good = _GOOD.to_dict()
    assert _same(LoadVerdict.from_dict(good), _GOOD)
    with pytest.raises(ValueError):
        LoadVerdict.from_dict({**good, name: bad})


def test_an_answer_that_is_not_an_object_is_refused() -> None:
    for bad in ([_GOOD.to_dict()], "verdict", None, _GOOD.to_dict(limit=0)):
        with pytest.raises(ValueError):
            LoadVerdict.from_dict(bad)


_names = st.lists(st.text(max_size=12), max_size=4).map(tuple)
_shapes = st.lists(st.integers(0, 1 << 40), max_size=4).map(tuple)


@settings(max_examples=150, deadline=None)
@given(
    st.builds(
        LoadVerdict,
        architecture=st.none() | st.text(max_size=20),
        skipped=st.none() | st.text(max_size=40),
        missing=_names,
        unexpected=_names,
        mismatched=st.lists(
            st.builds(ShapeMismatch, st.text(max_size=8), _shapes, _shapes), max_size=3
        ).map(tuple),
        mtp_skipped=_names,
        quantization_expected=_names,
        parameters=st.none() | st.integers(0, 1 << 62),
        stored_parameters=st.none() | st.integers(0, 1 << 62),
        mtp_parameters=st.integers(0, 1 << 62),
        quantization=st.none() | st.text(max_size=20),
        transformers_version=st.none() | st.text(max_size=8),
        sources=st.dictionaries(st.text(max_size=8), _names, max_size=3).map(MappingProxyType),
        stored_as=st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=3).map(
            MappingProxyType
        ),
        reasons=st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=3).map(
            MappingProxyType
        ),
    )
)
def test_a_verdict_crosses_to_its_caller_unchanged(verdict: LoadVerdict) -> None:
    assert _same(LoadVerdict.from_dict(orjson.loads(orjson.dumps(verdict.to_dict()))), verdict)


def test_a_dashboard_state_reads_tensor_data_once(
    demos: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`CheckpointState.load` runs the plain checks while the child computes the verdict,
    then checks with it: `deep` reads the tensors' bytes in the second pass only."""
    real, calls = checks.deep_check, []

    def counted(scanned):
        calls.append(scanned)
        return real(scanned)

    monkeypatch.setattr(checks, "deep_check", counted)
    state = CheckpointState.load(demos / HEALTHY, deep=True)
    assert len(calls) == 1
    assert state.verdict is not None and state.verdict.ran
