"""Fuzz targets: each takes arbitrary bytes and checks the properties every untrusted-input
reader must keep, whatever the input:

- it raises nothing but the errors the reader declares (findings carry the rest);
- it reads at most what its cap allows;
- every finding names a known code, no message quotes more than `MAX_MESSAGE` characters (a
  report must not leak a file's content) and none holds a control character (names are shown
  through `inspector.display.legible`);
- the pickle path refuses bombs and code-running names before unpickling;
- the bounded child that reads large `.metadata` files answers what the audited path
  answers (or reads, within its limits, a stream the audit refuses as a bomb).

Time and memory are bounded by the runner (`run.py`: libFuzzer's -timeout and
-rss_limit_mb under atheris, a per-input deadline and peak RSS under hypothesis) and by the
corpus replay test (`tests/test_fuzz_corpus.py`).
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Callable
from pathlib import Path

from inspector.checks.files import read_problem_findings
from inspector.codes import CODES
from inspector.findings import Finding
from inspector.model import FileRole, ReadProblem

__all__ = ["MAX_MESSAGE", "TARGETS", "header", "index_json", "pickle_metadata", "pickle_sandbox"]

# The longest message a finding may have: names and values quoted from a file are cut.
MAX_MESSAGE = 4_000
HEADER_CAP = 1 << 16


def _check_findings(findings: tuple[Finding, ...] | list[Finding]) -> None:
    for f in findings:
        assert isinstance(f, Finding), f
        assert f.code in CODES, f.code
        assert len(f.message) <= MAX_MESSAGE, (f.code, len(f.message), f.message[:200])
        assert f.message.isprintable(), (f.code, f.message[:200])


def _check_problems(problems: tuple[ReadProblem, ...] | list[ReadProblem]) -> None:
    """A reader's problems, as the findings `check` makes of them."""
    _check_findings(read_problem_findings(problems))


# -- (a) the safetensors header reader --------------------------------------------------------


def header(data: bytes) -> None:
    """`read_header` on any bytes: a ShardHeader with findings, never an exception."""
    from test_header_fuzz import CountingReader  # the byte-counting reader of the header tests

    from inspector.safetensors_header import read_header

    reader = CountingReader(data)
    shard = read_header(reader, file="fuzz.safetensors", cap=HEADER_CAP)
    assert reader.bytes_read <= 8 + HEADER_CAP
    _check_findings(shard.findings)
    n = len(shard.names)
    assert len(shard.dtypes) == len(shard.shapes) == len(shard.begins) == len(shard.ends) == n
    assert all(0 <= b <= e for b, e in zip(shard.begins, shard.ends, strict=True))


# -- (b) index, sidecar and config JSON --------------------------------------------------------

_FOLDER: Path | None = None


def _folder() -> Path:
    """One scratch checkpoint folder per process (in RAM where there is /dev/shm)."""
    global _FOLDER
    if _FOLDER is None:
        base = "/dev/shm" if os.path.isdir("/dev/shm") else None
        _FOLDER = Path(tempfile.mkdtemp(prefix="ckpt-fuzz-", dir=base))
    return _FOLDER


def index_json(data: bytes) -> None:
    """The bytes as `model.safetensors.index.json`, as a per-layer sidecar, and as
    `config.json` + `hf_quant_config.json`: findings, never an exception."""
    from inspector.layouts._common import read_config_files, read_index_doc, salvage_json_prefix
    from inspector.storage import local_location

    folder = _folder()
    for name in ("model.safetensors.index.json", "x.safetensors.json", "config.json"):
        (folder / name).write_bytes(data)
    root = local_location(folder)
    doc, problems = read_index_doc(root / "model.safetensors.index.json", root=root)
    _check_problems(problems)
    if doc is not None:
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in doc.weight_map.items())
        assert all(
            not v.startswith("/") and ".." not in v.split("/") for v in doc.weight_map.values()
        )
    _sidecar, problems = read_index_doc(
        root / "x.safetensors.json", root=root, role=FileRole.SIDECAR
    )
    _check_problems(problems)
    files = read_config_files(root, root=root)
    _check_problems(files.problems)
    assert files.config is None or isinstance(files.config, dict)
    salvage_json_prefix(root / "config.json")


# -- (c) the pickle guard and the restricted unpickler ---------------------------------------


def pickle_metadata(data: bytes) -> None:
    """`.metadata` bytes through the guard, the restricted unpickler and the conversion the
    torch_dist reader does: declared refusals only, and a bounded walk."""
    from inspector.layouts import torch_dist
    from inspector.pickle_guard import PickleFormatError, audit_pickle, hostile_globals
    from inspector.safe_pickle import (
        HostilePickleError,
        MetadataFormatError,
        PickleBombError,
        RefusedGlobalError,
        load_dcp_metadata,
    )

    try:
        audit = audit_pickle(data)
    except (PickleFormatError, PickleBombError):
        audit = None
    try:
        meta = load_dcp_metadata(data)
    except (MetadataFormatError, RefusedGlobalError, HostilePickleError, PickleBombError) as exc:
        if isinstance(exc, HostilePickleError):
            assert audit is not None and hostile_globals(audit.globals)
        assert len(str(exc)) <= MAX_MESSAGE
        return
    assert audit is not None  # nothing unpickles that the audit refused
    *_, problems = torch_dist._convert_metadata(meta, rel=".metadata", prefix="")
    _check_problems(problems)


# -- (d) the bounded child against the audited path --------------------------------------------

_ADDRESS = re.compile(r"0x[0-9a-f]+")


def pickle_sandbox(data: bytes) -> None:
    """`.metadata` bytes read through the bounded child (forced, with tight limits) and
    in this process after the audit: the same result or the same refusal. The child may
    read a stream the audit refuses as a bomb or as malformed (it finished within its
    limits, and what comes back is plain data), never one it refuses for its globals."""
    from inspector.layouts import torch_dist
    from inspector.model import FileRole, ProblemKind, ReadProblem, TorchDistTensor
    from inspector.safe_pickle import (
        HostilePickleError,
        MetadataFormatError,
        PickleBombError,
        RefusedGlobalError,
        load_dcp_metadata,
        read_dcp_metadata,
    )
    from inspector.sandbox import SandboxLimits, sandbox_available

    if not sandbox_available():
        return
    limits = SandboxLimits(min_size=0, cpu_floor=1.0, memory_floor=512 << 20)
    declared = (MetadataFormatError, RefusedGlobalError, HostilePickleError, PickleBombError)

    def convert(meta: object) -> tuple:
        return torch_dist._convert_metadata(meta, rel=".metadata", prefix="")

    def outcome(read: Callable[[], tuple]) -> tuple[tuple | None, Exception | None]:
        try:
            return read(), None
        except declared as exc:
            assert len(str(exc)) <= MAX_MESSAGE
            return None, exc

    here, refused = outcome(lambda: convert(load_dcp_metadata(data)))
    there, refused_there = outcome(
        lambda: read_dcp_metadata(
            data,
            convert,
            classes=(TorchDistTensor, ReadProblem, FileRole, ProblemKind),
            limits=limits,
        )
    )
    if refused_there is not None:  # the child gave no answer: the audited path spoke
        assert refused is not None and type(refused_there) is type(refused)
        assert str(refused_there) == str(refused)
        return
    assert there is not None
    *_, problems = there
    _check_problems(problems)
    if refused is not None:
        assert isinstance(refused, (PickleBombError, MetadataFormatError)), refused
        assert not isinstance(refused, (RefusedGlobalError, HostilePickleError))
        return
    # Object addresses in quoted values differ between processes; nothing else may.
    assert _ADDRESS.sub("0x", repr(there)) == _ADDRESS.sub("0x", repr(here))


TARGETS: dict[str, Callable[[bytes], None]] = {
    "header": header,
    "index_json": index_json,
    "pickle": pickle_metadata,
    "pickle_sandbox": pickle_sandbox,
}
