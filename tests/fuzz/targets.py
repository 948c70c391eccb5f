"""Fuzz targets: each takes arbitrary bytes and checks the properties every untrusted-input
reader must keep, whatever the input:

- it raises nothing but the errors the reader declares (findings carry the rest);
- it reads at most what its cap allows;
- every finding names a known code, no message quotes more than `MAX_MESSAGE` characters (a
  report must not leak a file's content) and none holds a control character (names are shown
  through `inspector._internal.common.display.legible`);
- the pickle path refuses bombs and code-running names before unpickling;
- no pickle read leaves anything behind: every object a stream could reach through what
  the readers hand it (stand-ins, their tables, the reply classes, copyreg's cache) is
  unchanged after each input, and a clean file read next reads as it did before (`.bin`
  `data.pkl` opcodes get a target of their own, `bin_pickle`);
- the bounded child that reads large `.metadata` files answers what the audited path
  answers (or reads, within its limits, a stream the audit refuses as a bomb);
- config.json through the load check never asks on the terminal, never opens a socket or
  starts a process, and finishes within `LOAD_SECONDS`.
- a remote server's answers (status, headers, body: any bytes) give the remote reader
  only its declared errors, never more bytes than were asked, in bounded time;
- module patterns a compressed-tensors config chooses (any regex, against hostile names)
  never backtrack: the checks and the load view's quantization rules end in findings of
  known codes, every accepted pattern answering what Python's `re` answers.
- GGUF metadata values the header reader accepts, gguf's own reader reads the same.
- config.json through `fit` (parallel plans and memory per GPU) gives findings, never an
  exception, a `fit --json` result that serialises, and bounded messages;
- an entry of the load verdict's cache (any bytes where a kept verdict belongs) gives the
  verdict of that checkpoint, checked field by field, or none, never an error.

Time and memory are bounded by the runner (`run.py`: libFuzzer's -timeout and
-rss_limit_mb under atheris, a per-input deadline and peak RSS under hypothesis) and by the
corpus replay test (`tests/test_fuzz_corpus.py`).
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import io
import math
import os
import re
import struct
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any
from unittest import mock

import orjson

from inspector._internal.checkpoint.read_problems import (
    FileRole,
    ReadProblem,
    read_problem_findings,
)
from inspector._internal.common.filenames import CONFIG_NAME, INDEX_NAME
from inspector._internal.findings.codes import CODES
from inspector._internal.findings.finding import Finding
from inspector._internal.load.seal import REFUSED_EVENT
from inspector._internal.storage import Location, TooLargeError
from inspector._internal.storage.guard import MAX_LISTING as _MAX_LISTING
from inspector.errors import CannotInspectError, RemoteAccessError, UnsafeFileError

if TYPE_CHECKING:
    from inspector._internal.formats.gguf_header import GgufHeader

__all__ = [
    "MAX_MESSAGE",
    "PREPARE",
    "TARGETS",
    "bin_pickle",
    "engine_answer",
    "fit_config",
    "gguf",
    "gguf_metadata",
    "header",
    "index_json",
    "load_answer",
    "load_config",
    "manifest",
    "pickle_metadata",
    "pickle_sandbox",
    "quant_patterns",
    "remote_answer",
    "torch_bin",
    "verdict_entry",
]

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

    from inspector._internal.formats import safetensors as safetensors_format
    from inspector._internal.formats.safetensors import read_header

    reader = CountingReader(data)
    shard = read_header(reader, file="fuzz.safetensors", cap=HEADER_CAP)
    assert reader.bytes_read <= 8 + HEADER_CAP
    _check_findings(shard.findings)
    n = len(shard.names)
    assert len(shard.dtypes) == len(shard.shapes) == len(shard.begins) == len(shard.ends) == n
    assert all(0 <= b <= e for b, e in zip(shard.begins, shard.ends, strict=True))
    # The typed decode is a shortcut: without it the header reads exactly the same.
    with mock.patch.object(safetensors_format, "_typed_columns", lambda _raw: None):
        untyped = read_header(CountingReader(data), file="fuzz.safetensors", cap=HEADER_CAP)
    assert shard == untyped, (shard.findings, untyped.findings)


# -- (b) index, sidecar and config JSON --------------------------------------------------------

_FOLDER: Path | None = None


def _folder() -> Path:
    """One scratch checkpoint folder per process (in RAM where there is /dev/shm)."""
    global _FOLDER
    if _FOLDER is None:
        _FOLDER = _scratch("ckpt-fuzz-")
    return _FOLDER


def _scratch(prefix: str) -> Path:
    """A new temp folder, in RAM where there is /dev/shm."""
    base = "/dev/shm" if os.path.isdir("/dev/shm") else None
    return Path(tempfile.mkdtemp(prefix=prefix, dir=base))


def index_json(data: bytes) -> None:
    """The bytes as `model.safetensors.index.json`, as a per-layer sidecar, and as
    `config.json` + `hf_quant_config.json`: findings, never an exception."""
    from inspector._internal.layouts._common import (
        read_config_files,
        read_index_doc,
        salvage_json_prefix,
    )
    from inspector._internal.storage import local_location

    folder = _folder()
    for name in (INDEX_NAME, "x.safetensors.json", CONFIG_NAME):
        (folder / name).write_bytes(data)
    root = local_location(folder)
    doc, problems = read_index_doc(root / INDEX_NAME, root=root)
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
    salvage_json_prefix(root / CONFIG_NAME)


# -- (c) the pickle audit and the restricted unpickler ---------------------------------------

# A `.metadata` torch's DCP writer wrote (a seed of the corpus): read after every input, it
# must read as it did before the first.
_CLEAN_METADATA = Path(__file__).parent / "corpus" / "pickle" / "dcp-metadata.pkl"
_READINGS: dict[str, str] = {}
_READERS = {"bin": ("bin",), "metadata": ("metadata", "reply")}


def _clean(kind: str) -> bytes:
    return _bin_template()[0] if kind == "bin" else _CLEAN_METADATA.read_bytes()


def _isolation(kind: str) -> list[object]:
    """What must not change (`pickle_ops.stand_in_state`), taken before each input; the
    clean file's reading is taken once per process, before the first input."""
    from pickle_ops import read_one, stand_in_state

    if kind not in _READINGS:
        _READINGS[kind] = read_one(kind, _clean(kind))
    return stand_in_state(*_READERS[kind])


def _assert_isolated(kind: str, before: list[object]) -> None:
    """The input changed nothing another read uses (SECURITY.md, "Nothing in a checkpoint
    runs code"): the same state as before it, and the clean file reads as it always did."""
    from pickle_ops import read_one, stand_in_state

    after = stand_in_state(*_READERS[kind])
    assert after == before, "a pickle changed what later reads are handed"
    assert read_one(kind, _clean(kind)) == _READINGS[kind], "a clean file reads differently"


def pickle_metadata(data: bytes) -> None:
    """`.metadata` bytes through the audit, the restricted unpickler and the conversion the
    torch_dist reader does: declared refusals only, and a bounded walk."""
    from inspector._internal.formats.pickles.audit import audit_pickle, hostile_globals
    from inspector._internal.formats.pickles.dcp_metadata import (
        MetadataFormatError,
        load_dcp_metadata,
    )
    from inspector._internal.formats.pickles.errors import (
        HostilePickleError,
        PickleBombError,
        PickleFormatError,
        RefusedGlobalError,
    )
    from inspector._internal.layouts import torch_dist

    before = _isolation("metadata")
    try:
        audit = audit_pickle(data)
    # HostilePickleError: the stream changes a global, or uses a copyreg extension code.
    except (PickleFormatError, PickleBombError, HostilePickleError):
        audit = None
    try:
        meta = load_dcp_metadata(data)
    except (MetadataFormatError, RefusedGlobalError, HostilePickleError, PickleBombError) as exc:
        if isinstance(exc, HostilePickleError) and audit is not None:
            assert hostile_globals(audit.globals)
        assert len(str(exc)) <= MAX_MESSAGE
    else:
        assert audit is not None  # nothing unpickles that the audit refused
        *_, problems = torch_dist._convert_metadata(meta, rel=".metadata", prefix="")
        _check_problems(problems)
    _assert_isolated("metadata", before)


# -- (d) the bounded child against the audited path --------------------------------------------

_ADDRESS = re.compile(r"0x[0-9a-f]+")


def pickle_sandbox(data: bytes) -> None:
    """`.metadata` bytes read through the bounded child (forced, with tight limits) and
    in this process after the audit: the same result or the same refusal. The child may
    read a stream the audit refuses as a bomb or as malformed (it finished within its
    limits, and what comes back is plain data), never one it refuses for its globals."""
    from inspector._internal.checkpoint.read_problems import FileRole, ProblemKind, ReadProblem
    from inspector._internal.checkpoint.scanned import TorchDistTensor
    from inspector._internal.formats.pickles.dcp_metadata import (
        MetadataFormatError,
        load_dcp_metadata,
        read_dcp_metadata,
    )
    from inspector._internal.formats.pickles.errors import (
        HostilePickleError,
        PickleBombError,
        RefusedGlobalError,
    )
    from inspector._internal.formats.pickles.sandbox import SandboxLimits, sandbox_available
    from inspector._internal.layouts import torch_dist

    if not sandbox_available():
        return
    # One second of CPU: the floor alone (the per-byte share would round it up to 2 s).
    limits = SandboxLimits(min_size=0, cpu_floor=1.0, cpu_per_byte=0.0, memory_floor=512 << 20)
    declared = (MetadataFormatError, RefusedGlobalError, HostilePickleError, PickleBombError)

    def convert(meta: object) -> tuple:
        return torch_dist._convert_metadata(meta, rel=".metadata", prefix="")

    def outcome(read: Callable[[], tuple]) -> tuple[tuple | None, Exception | None]:
        try:
            return read(), None
        except declared as exc:
            assert len(str(exc)) <= MAX_MESSAGE
            return None, exc

    before = _isolation("metadata")
    here, refused = outcome(lambda: convert(load_dcp_metadata(data)))
    there, refused_there = outcome(
        lambda: read_dcp_metadata(
            data,
            convert,
            classes=(TorchDistTensor, ReadProblem, FileRole, ProblemKind),
            limits=limits,
        )
    )
    _assert_isolated("metadata", before)
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


# -- (e) config.json through the load check ----------------------------------------------------

# One load check may take this long: building the largest model a config may declare (2,048
# layers) takes a few seconds on a busy machine.
LOAD_SECONDS = 30.0
_CHECKPOINT: Path | None = None
# Acts of the thread running `load_config`, seen by an audit hook: socket use, processes,
# terminal reads, and what the seal refused (the seal's own hook may run first and refuse).
_WATCHED: tuple[int, list[str]] | None = None
_FORBIDDEN = ("socket.", "subprocess.", "os.system", "os.exec", "os.posix_spawn", "builtins.input")
_FORBIDDEN_REFUSALS = ("the network", "an answer from the terminal", "starting a process")


def _watch(event: str, args: tuple) -> None:
    if _WATCHED is None or _WATCHED[0] != threading.get_ident():
        return
    if event.startswith(_FORBIDDEN):
        _WATCHED[1].append(f"{event} {str(args)[:200]}")
    elif event == REFUSED_EVENT and str(args[0]).startswith(_FORBIDDEN_REFUSALS):
        _WATCHED[1].append(f"refused: {args[0]}")


sys.addaudithook(_watch)


def _checkpoint() -> Path:
    """A tiny Llama written by transformers' `save_pretrained`, once per process (in RAM
    where there is /dev/shm); torch and transformers are imported and one model is built, so
    the first input costs about what every other does."""
    global _CHECKPOINT
    if _CHECKPOINT is None:
        import torch
        import transformers

        from inspector._internal.load.verdict import load_verdict
        from inspector._internal.scan.entry import scan

        folder = _scratch("ckpt-fuzz-load-")
        config = transformers.LlamaConfig(
            vocab_size=64,
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
        )
        torch.manual_seed(0)
        with contextlib.redirect_stderr(io.StringIO()):  # its progress bar
            transformers.LlamaForCausalLM(config).save_pretrained(folder)
        assert load_verdict(scan(folder)).loads
        # The message of a sub-config AutoModel cannot build names every type it can, which
        # imports every configuration module of transformers once (seconds): done here.
        from transformers.models.auto.modeling_auto import MODEL_MAPPING

        assert MODEL_MAPPING.keys()
        _CHECKPOINT = folder
    return _CHECKPOINT


class _NoTerminal:
    """stdin and input() while an input runs: reading the terminal fails the target."""

    def __init__(self) -> None:
        self.reads: list[str] = []

    def read(self, *_: object) -> str:
        self.reads.append("sys.stdin")
        raise AssertionError("the load check read stdin")

    readline = read

    def isatty(self) -> bool:
        return True

    def input(self, prompt: object = "") -> str:
        self.reads.append(f"input({str(prompt)[:200]!r})")
        raise AssertionError("the load check asked on the terminal")


def load_config(data: bytes) -> None:
    """The bytes as config.json of a tiny checkpoint transformers wrote, through `scan`, the
    load check (also with --trust-remote-code) and `check`: no exception, known codes and
    bounded messages, a skip reason of bounded length, nothing asked on the terminal, no
    socket, no process, within `LOAD_SECONDS`."""
    global _WATCHED
    from inspector._internal.checks import check
    from inspector._internal.load.verdict import load_verdict
    from inspector._internal.scan.entry import scan

    folder = _checkpoint()
    (folder / CONFIG_NAME).write_bytes(data)
    terminal, acts = _NoTerminal(), []
    saved = sys.stdin, builtins.input
    sys.stdin, builtins.input = terminal, terminal.input  # type: ignore[assignment]
    _WATCHED = (threading.get_ident(), acts)
    try:
        start = time.monotonic()
        scanned = scan(folder)
        for trust in (False, True):
            verdict = load_verdict(scanned, trust_remote_code=trust)
            assert verdict.skipped is None or len(verdict.skipped) <= MAX_MESSAGE
        _check_findings(check(scanned, verdict=verdict))
        took = time.monotonic() - start
    finally:
        _WATCHED = None
        sys.stdin, builtins.input = saved
    assert not terminal.reads, terminal.reads
    assert not acts, acts
    assert took < LOAD_SECONDS, f"the load check took {took:.1f} s"


def _prepare_load_config() -> None:
    _checkpoint()


# -- (f) a remote server's answers --------------------------------------------------------------

# Statuses a structured input picks from (its first byte).
_STATUSES = (200, 206, 204, 301, 302, 303, 307, 308, 304, 400, 401, 403, 404, 416, 429, 500, 503)


class _AnswerServer:
    """A server on 127.0.0.1 that answers every request with the same bytes (`answer`),
    then closes the connection, or holds it open and silent for `hold` seconds."""

    def __init__(self) -> None:
        self.answer = b""
        self.hold = 0.0
        self.requests = 0
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()

        async def client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                await reader.readuntil(b"\r\n\r\n")
                self.requests += 1
                writer.write(self.answer)
                await writer.drain()
                if self.hold:
                    await asyncio.sleep(self.hold)
            except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
                pass
            finally:
                writer.close()

        async def start() -> None:
            server = await asyncio.start_server(client, "127.0.0.1", 0)
            self.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
            ready.set()

        def run() -> None:
            asyncio.set_event_loop(self.loop)
            self.loop.run_until_complete(start())
            self.loop.run_forever()

        threading.Thread(target=run, daemon=True).start()
        ready.wait(10)


_SERVER: _AnswerServer | None = None
# What the remote reader may raise: OS errors (FileNotFoundError, PermissionError, the
# guard's RemoteAnswerError...), a refused file, a store that fails for good, a cap.
_DECLARED = (OSError, UnsafeFileError, RemoteAccessError, CannotInspectError, TooLargeError)


def _compose(data: bytes, url: str) -> tuple[bytes, float]:
    """The answer an input stands for: the bytes themselves when they start like an HTTP
    answer; otherwise a status (first byte), headers chosen by the bits of the second (a
    chunked body, a Content-Length that lies, a Content-Range, a redirect within or out of
    the origin, a connection held open) and the rest as the body. Returns (bytes, hold)."""
    if data.startswith(b"HTTP/"):
        return data, 0.0
    data = data + b"\0\0" if len(data) < 2 else data
    status, flags, body = _STATUSES[data[0] % len(_STATUSES)], data[1], data[2:]
    lines = [f"HTTP/1.1 {status} X"]
    if flags & 1:
        lines.append("Transfer-Encoding: chunked")
        framed = (f"{len(body):x}\r\n".encode() + body + b"\r\n" if body else b"") + b"0\r\n\r\n"
    else:
        length = len(body) + (1000 if flags & 2 else 0) - (len(body) // 2 if flags & 4 else 0)
        lines.append(f"Content-Length: {length}")
        framed = body
    if flags & 8:
        first = 100 if flags & 16 else 0
        lines.append(f"Content-Range: bytes {first}-{first + len(body) - 1}/{len(body) + first}")
    if flags & 32:
        lines.append("Location: " + ("/ckpt/moved" if flags & 64 else "http://127.0.0.2:9/x"))
    lines.append(f'Link: <{url}/api/next?cursor=1>; rel="next"')
    head = ("\r\n".join(lines) + "\r\n\r\n").encode()
    return head + framed, (0.15 if flags & 128 else 0.0)


def _prepare_remote_answer() -> None:
    """The server, and the HTTP and Hub clients the first input would import (fsspec's HTTP
    file system, huggingface_hub), so that the 6 s bound of each input times the input alone
    (a first input over it, importing under load, failed a CI run)."""
    global _SERVER
    if _SERVER is None:
        _SERVER = _AnswerServer()
    import fsspec.implementations.http  # noqa: F401
    import huggingface_hub.utils  # noqa: F401


def remote_answer(data: bytes) -> None:
    """Every request answered with the input (see `_compose`), through the remote reader
    as a scan uses it: an HTTP folder (listing, HEAD, ranged reads, a whole-file read), a
    single-file URL, and a Hub repository (revision, tree, resolve). Only declared errors,
    with messages of bounded length; never more bytes than asked; within the deadlines."""
    from inspector._internal.storage import RemoteOptions
    from inspector._internal.storage.remote import open_remote

    global _SERVER
    if _SERVER is None:
        _SERVER = _AnswerServer()
    server = _SERVER
    server.answer, server.hold = _compose(data, server.url)
    quick = {"retries": 1, "retry_wait": 0.01, "timeout": 0.5, "read_timeout": 0.1}
    hub = {"endpoint": server.url, "token": False}
    start = time.monotonic()
    for url, options in (
        (f"{server.url}/ckpt/", RemoteOptions(**quick)),
        (f"{server.url}/ckpt/model.safetensors", RemoteOptions(**quick)),
        ("hf://org/repo", RemoteOptions(**quick, storage_options=hub)),
    ):
        try:
            location = open_remote(url, options)
            folder = location.parent if location.rel else location
            entries = folder.entries()
            assert len(entries) <= _MAX_LISTING
            names = [location.name] if location.rel else [e.name for e in entries[:2]]
        except _DECLARED as exc:
            assert len(str(exc)) <= MAX_MESSAGE, str(exc)[:300]
            continue
        for name in names or ["model.safetensors"]:
            _read_some(folder / name)
    assert time.monotonic() - start < 6.0, "an input took longer than its deadlines allow"


def _read_some(file: Location) -> None:
    """Ranged reads and a whole-file read of one remote file: at most what was asked."""
    try:
        with file.open() as reader:
            for offset, length in ((0, 64), (100, 50), (0, 200_000)):
                got = reader.read_range(offset, length)
                assert len(got) <= length, (offset, length, len(got))
        assert len(file.read_bytes(cap=1 << 20)) <= 1 << 20
    except _DECLARED as exc:
        assert len(str(exc)) <= MAX_MESSAGE, str(exc)[:300]


# -- (g) PyTorch .bin archives ----------------------------------------------------------------


BIN_CAP = 1 << 20


def torch_bin(data: bytes) -> None:
    """The bytes as a `torch.save` file: shard columns with findings, never an exception; at
    most the cap read; every tensor's byte range inside the file; nothing imported."""
    from test_header_fuzz import CountingReader

    from inspector._internal.formats.bin_shard import read_bin_columns

    before = _isolation("bin")
    reader = CountingReader(data)
    modules = set(sys.modules)
    shard = read_bin_columns(reader, "fuzz.bin", cap=BIN_CAP)
    assert reader.bytes_read <= 2 * BIN_CAP + 64, reader.bytes_read
    new = {m for m in set(sys.modules) - modules if not m.startswith(("encodings.", "zipfile"))}
    assert not new, new  # nothing the file names is ever imported
    _check_findings(shard.findings)
    n = len(shard.names)
    assert len(shard.dtypes) == len(shard.shapes) == len(shard.begins) == len(shard.ends) == n
    assert all(0 <= b <= e <= len(data) for b, e in zip(shard.begins, shard.ends, strict=True))
    _assert_isolated("bin", before)
    if not any(f.code == "bin-unreadable" for f in shard.findings):
        _reads_as_torch(data, shard)


def _reads_as_torch(data: bytes, shard: Any) -> None:
    """A file the reader takes as readable holds, for every tensor torch.load gives (when it
    loads the file at all), the bytes torch gives at the place the reader names: the zip
    directory, the folder, the record names and the byte order read as torch reads them."""
    import numpy as np
    import torch

    from inspector._internal.formats.bin_shard import data_unread, strides_of

    try:
        loaded = torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")
    except Exception:
        return  # torch refuses it: no value of it is loaded
    if not isinstance(loaded, dict) or data_unread(shard):
        return
    strided = strides_of(shard)
    for name, begin, end in zip(shard.names, shard.begins, shard.ends, strict=True):
        tensor = loaded.get(name)
        if name in strided or not isinstance(tensor, torch.Tensor):
            continue
        want = tensor.detach().contiguous().view(-1).view(torch.uint8).numpy()
        got = np.frombuffer(data[int(begin) : int(end)], np.uint8)
        assert np.array_equal(want, got), f"{name}: torch.load reads other bytes"


# -- (g') data.pkl opcodes inside a real archive ----------------------------------------------

_BIN_TEMPLATE: tuple[bytes, bytes] | None = None


def _bin_template() -> tuple[bytes, bytes]:
    """A `.bin` torch.save wrote (F32, BF16 and float8 tensors: storage classes, a dtype
    global, `_rebuild_tensor_v3`) and its data.pkl, once per process."""
    global _BIN_TEMPLATE
    if _BIN_TEMPLATE is None:
        import torch
        from pickle_ops import data_pkl

        g = torch.Generator().manual_seed(0)
        state = {
            "a.weight": torch.randn(4, 8, generator=g),
            "b.weight": torch.randn(3, 2, generator=g).to(torch.bfloat16),
            "c.scale": torch.randn(4, generator=g).to(torch.float8_e4m3fn),
        }
        buffer = io.BytesIO()
        torch.save(state, buffer)
        archive = buffer.getvalue()
        _BIN_TEMPLATE = archive, data_pkl(archive)
    return _BIN_TEMPLATE


def _prepare_bin() -> None:
    # torch writes the template archive, and one clean read imports what every read needs:
    # once per process, not timed.
    _isolation("bin")
    bin_pickle(b"")


def bin_pickle(data: bytes) -> None:
    """The bytes as the data.pkl of a real `torch.save` archive: the whole stream when they
    start with PROTO (0x80), else opcodes spliced in right after the writer's PROTO (so
    the fuzzer works on BUILD, REDUCE, memo and global opcodes in front of a well-formed
    state dict). Shard columns with findings, never an exception; nothing imported; and the
    read leaves nothing behind (`_assert_isolated`)."""
    from pickle_ops import splice, with_data_pkl
    from test_header_fuzz import CountingReader

    from inspector._internal.formats.bin_shard import read_bin_columns

    archive, stream = _bin_template()
    before = _isolation("bin")
    stream = data if data[:1] == b"\x80" else splice(stream, data)
    hostile = with_data_pkl(archive, stream)
    modules = set(sys.modules)
    shard = read_bin_columns(CountingReader(hostile), "fuzz.bin", cap=BIN_CAP)
    new = {m for m in set(sys.modules) - modules if not m.startswith(("encodings.", "zipfile"))}
    assert not new, new
    _check_findings(shard.findings)
    n = len(shard.names)
    assert len(shard.dtypes) == len(shard.shapes) == len(shard.begins) == len(shard.ends) == n
    _assert_isolated("bin", before)


# -- (h) GGUF headers -------------------------------------------------------------------------

GGUF_CAP = 1 << 20


def gguf(data: bytes) -> None:
    """The bytes as a GGUF file: shard columns with findings, never an exception; at most the
    cap read (the parser reads in 1 MiB blocks, so one block past it at most)."""
    from test_header_fuzz import CountingReader

    from inspector._internal.formats.gguf_shard import read_gguf_columns

    reader = CountingReader(data)
    shard = read_gguf_columns(reader, "fuzz.gguf", cap=GGUF_CAP)
    assert reader.bytes_read <= GGUF_CAP, reader.bytes_read
    _check_findings(shard.findings)
    n = len(shard.names)
    assert len(shard.dtypes) == len(shard.shapes) == len(shard.begins) == len(shard.ends) == n
    assert all(0 <= b <= e for b, e in zip(shard.begins, shard.ends, strict=True))


# -- (h2) GGUF metadata values ---------------------------------------------------------------

# What follows the fuzzed metadata: one tensor info ("t", F32 of 8 values at offset 0), the
# padding and its 32 bytes of data, as GGUFWriter lays them out.
_GGUF_TENSOR = struct.pack("<Q", 1) + b"t" + struct.pack("<IQIQ", 1, 8, 0, 0)
_GGUF_FILES = 0


def _prepare_gguf_metadata() -> None:
    # gguf-py (and the yaml it imports), which the first input compares with: imported there
    # on a busy machine, it went past libFuzzer's per-input timeout.
    import gguf  # noqa: F401


def gguf_metadata(data: bytes) -> None:
    """The bytes as the metadata section of a GGUF file (the first byte gives the key count,
    0 to 31) between a valid header and tensor info: mutations land in keys, value types,
    array item types, counts and string lengths instead of the magic and counts. The
    properties of `gguf`; and when the file reads with no finding, gguf's own reader
    (`GGUFReader`, which llama.cpp maintains) finds the same keys, value types, kept values,
    array lengths and tensor."""
    from test_header_fuzz import CountingReader

    from inspector._internal.formats.gguf_header import GgufError, read_gguf
    from inspector._internal.formats.gguf_shard import read_gguf_columns

    n_kv = data[0] % 32 if data else 0
    body = b"GGUF" + struct.pack("<IQQ", 3, 1, n_kv) + data[1:] + _GGUF_TENSOR
    body += bytes(-len(body) % 32) + bytes(range(32))
    gguf(body)
    if read_gguf_columns(CountingReader(body), "fuzz.gguf", cap=GGUF_CAP).findings:
        return
    try:
        header = read_gguf(CountingReader(body), cap=GGUF_CAP)
    except GgufError as exc:  # no finding, yet unreadable: never
        raise AssertionError(f"read_gguf refused what the shard reader accepted: {exc}") from exc
    _same_as_gguf_py(body, header)


def _same_as_gguf_py(body: bytes, header: GgufHeader) -> None:
    """gguf's `GGUFReader` on the same bytes agrees with `header` (a file it cannot decode
    as UTF-8, which llama.cpp and we read, is not compared)."""
    global _GGUF_FILES
    try:
        import gguf as gguf_py
    except ImportError:  # the differential needs the dev environment
        return
    if any(math.prod(d for d in t.ne if d) >= 1 << 63 for t in header.tensors):
        return  # an empty tensor numpy cannot shape (the other dimensions overflow it)
    from inspector._internal.formats.gguf_header import ArrayInfo, TextInfo

    _GGUF_FILES += 1
    path = _folder() / f"metadata-{_GGUF_FILES}.gguf"
    path.write_bytes(body)
    try:
        reader = gguf_py.GGUFReader(path)
        fields = {k: f for k, f in reader.fields.items() if not k.startswith("GGUF.")}
        ours = dict(header.kv)
        assert list(fields) == list(ours), (list(fields), list(ours))
        for key, field in fields.items():
            value, theirs_type = ours[key], field.types[0].name
            assert theirs_type == header.kv_types[key], (key, theirs_type, header.kv_types[key])
            if isinstance(value, TextInfo):
                continue
            if isinstance(value, ArrayInfo):
                assert value.length == len(field.data), (key, value, len(field.data))
                continue
            _same_value(key, value, field.contents())
        tensors = [
            (t.name, tuple(int(d) for d in t.shape), int(t.data_offset)) for t in reader.tensors
        ]
        assert tensors == [(t.name, t.ne, header.data_offset + t.offset) for t in header.tensors], (
            tensors,
            header.tensors,
        )
    except UnicodeDecodeError:
        return
    finally:
        reader = None
        path.unlink()


def _same_value(key: str, ours: Any, theirs: Any) -> None:
    if isinstance(ours, list):
        assert isinstance(theirs, list) and len(ours) == len(theirs), (key, ours, theirs)
        for a, b in zip(ours, theirs, strict=True):
            _same_value(key, a, b)
    elif isinstance(ours, float):
        assert (math.isnan(ours) and math.isnan(theirs)) or ours == theirs, (key, ours, theirs)
    else:
        assert ours == theirs, (key, ours, theirs)


# -- (i) content manifests ----------------------------------------------------------------------

_MANIFEST_FOLDER: Path | None = None
# What the folder holds: its true manifest, the only one `verify` may call "all match".
_MANIFEST_TRUTH: Any = None


def _manifest_folder() -> Path:
    """A one-shard checkpoint safetensors wrote, once per process (in RAM where there is
    /dev/shm), that each input's manifest is placed in."""
    global _MANIFEST_FOLDER, _MANIFEST_TRUTH
    if _MANIFEST_FOLDER is None:
        import numpy as np
        from safetensors.numpy import save_file

        from inspector._internal.integrity import build_manifest

        folder = _scratch("ckpt-fuzz-manifest-")
        tensors = {"model.layers.0.mlp.weight": np.arange(64, dtype=np.float32).reshape(8, 8)}
        save_file(tensors, str(folder / "model.safetensors"))
        _MANIFEST_TRUTH = build_manifest(folder)
        _MANIFEST_FOLDER = folder
    return _MANIFEST_FOLDER


def _prepare_manifest() -> None:
    _manifest_folder()


def manifest(data: bytes) -> None:
    """The bytes as a content manifest: `parse_manifest` gives a manifest or refuses it with
    `ManifestError` (a bounded reason without control characters), never another error;
    every file name it accepts stays inside the folder and is spelled in normal form, with a
    SHA-256, and no key in it is given twice; and `verify` against it, as the file in a
    checkpoint folder, gives findings of known codes only, and says "all match" only when the
    manifest records exactly what the folder holds (every file's size and SHA-256 at level
    hash, every tensor's dtype, shape and hash at level tensor)."""
    from inspector._internal.integrity import ManifestError, parse_manifest, verify
    from inspector._internal.storage import check_member, member_problem

    parsed = None
    try:
        parsed = parse_manifest(data)
    except ManifestError as exc:
        reason = str(exc)
        assert len(reason) <= MAX_MESSAGE and reason.isprintable(), reason[:200]
    else:
        for name, file in parsed.files.items():
            assert member_problem(name) is None and check_member(name) == name, name
            assert isinstance(file.sha256, str) and len(file.sha256) == 64, name
        for record in parsed.tensors.values():
            assert record.file in parsed.files

        def once(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
            assert len({k for k, _ in pairs}) == len(pairs), "a key given twice was accepted"
            return dict(pairs)

        import json

        json.loads(data, object_pairs_hook=once)
    folder = _manifest_folder()
    (folder / "ckpt-inspect-manifest.json").write_bytes(data)
    truth = _MANIFEST_TRUTH
    for level in ("size", "hash", "tensor"):
        result = verify(folder, level=level)
        _check_findings(list(result.findings))
        if not result.all_match:
            assert "all match" not in result.line(), result.line()
            continue
        assert parsed is not None and level != "size", result.line()
        if level == "hash":
            assert dict(parsed.files) == dict(truth.files), parsed.files
        else:
            got = {n: (t.dtype, t.shape, t.hash) for n, t in parsed.tensors.items()}
            assert got == {n: (t.dtype, t.shape, t.hash) for n, t in truth.tensors.items()}


def load_answer(data: bytes) -> None:
    """The bytes as the answer of the load check's child process (which ran transformers and
    maybe a folder's own code): read as the dashboard reads it, it gives a dict or `NoAnswer`,
    then a verdict or ValueError, never another error; a verdict read back survives its own
    round trip."""
    from inspector._internal.load.child import NoAnswer, read_answer
    from inspector._internal.load.verdict import LoadVerdict

    try:
        answer = read_answer(data)
        verdict = LoadVerdict.from_dict(answer.get("verdict"))
    except (NoAnswer, ValueError):
        return
    assert LoadVerdict.from_dict(verdict.to_dict()) == verdict


def engine_answer(data: bytes) -> None:
    """The bytes as the answer of vLLM's verdict process (which ran vLLM on an untrusted
    config): a dict or `NoAnswer`, then a verdict or ValueError, never another error; its
    findings are made; a verdict read back from its own dict is the same."""
    from inspector._internal.load.child import NoAnswer, read_answer
    from inspector._internal.load.engine import EngineVerdict
    from inspector._internal.serve.engine import verdict_findings

    try:
        verdict = EngineVerdict.from_answer(read_answer(data, what="vLLM's verdict"), tp=1)
    except (NoAnswer, ValueError):
        return
    verdict_findings(verdict)
    verdict.summary()
    assert EngineVerdict.from_answer(verdict.to_dict(), tp=1) == verdict


# -- (j) module patterns of a quantization config ----------------------------------------------

_PATTERN_FOLDER: Path | None = None
_PATTERN_CONFIG: dict = {}
# Names a hostile export may give modules: Python's re backtracks exponentially on the first
# against `(a+)+$`; the second is past the name cap.
_HOSTILE_MODULES = ("a" * 40 + "!", "model.layers.0." + "b" * 2000)
# Short names on which a pattern's answer is compared with Python's re (short, so that Python
# itself stays fast on any pattern: its backtracking grows with the name).
_PROBES = ("", "a", "ab", "lm_head", "model.layers.0.mlp.gate", "x.1", "A b", "inv", "Is")


def _pattern_folder() -> Path:
    """llm-compressor's FP8 export (the golden fixture) with two hostile module names added,
    once per process (in RAM where there is /dev/shm)."""
    global _PATTERN_FOLDER
    if _PATTERN_FOLDER is None:
        import json
        import shutil

        import torch
        from safetensors.torch import load_file, save_file

        golden = Path(__file__).resolve().parents[1] / "fixtures" / "writers" / "llmcompressor"
        folder = _scratch("ckpt-fuzz-patterns-")
        shutil.copytree(golden / "fp8-dynamic", folder, dirs_exist_ok=True)
        tensors = load_file(str(folder / "model.safetensors"))
        for module in _HOSTILE_MODULES:
            tensors[f"{module}.weight"] = torch.zeros(4, 4, dtype=torch.bfloat16)
        save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
        _PATTERN_CONFIG.update(json.loads((folder / CONFIG_NAME).read_text()))
        _PATTERN_FOLDER = folder
    return _PATTERN_FOLDER


def _prepare_quant_patterns() -> None:
    _pattern_folder()
    # `check` and `scan`: pandas among their imports, past libFuzzer's per-input timeout when
    # the first input imported them on a busy machine.
    import inspector._internal.checks
    import inspector._internal.scan.entry  # noqa: F401


def quant_patterns(data: bytes) -> None:
    """The bytes as module patterns of a compressed-tensors export: a JSON object is the
    `quantization_config` itself, other bytes are lines, each an `re:` ignore entry, a
    config group's `re:` target and a recipe.yaml ignore entry. `check` and the load view's
    quantization rules give findings of known codes (or skip), never an exception; every
    pattern the matcher accepts answers Python's `re.match` on short names."""
    import json
    import warnings

    from inspector._internal.checks import check
    from inspector._internal.formats.patterns import compile_patterns
    from inspector._internal.load.quant_view import quantization_view
    from inspector._internal.load.records import LoadSkipped
    from inspector._internal.load.verdict import stored_tensors
    from inspector._internal.scan.entry import scan

    folder = _pattern_folder()
    config = json.loads(json.dumps(_PATTERN_CONFIG))
    try:
        section = json.loads(data)
    except ValueError:
        section = None
    lines = data.decode("utf-8", "replace").split("\n")[:64]
    if not isinstance(section, dict):
        section = dict(config["quantization_config"])
        section["ignore"] = ["lm_head", *(f"re:{line}" for line in lines)]
        group = dict(section["config_groups"]["group_0"])
        group["targets"] = [f"re:{line}" for line in lines[::2]] + ["Linear"]
        section["config_groups"] = {"group_0": group}
    config["quantization_config"] = section
    (folder / CONFIG_NAME).write_text(json.dumps(config))
    recipe = {"stage": {"m": {"QuantizationModifier": {"targets": ["Linear"], "ignore": lines}}}}
    (folder / "recipe.yaml").write_text(json.dumps(recipe))  # YAML reads JSON
    scanned = scan(folder)
    _check_findings(check(scanned, model=False))
    try:
        quantization_view(scanned, stored_tensors(scanned))
    except LoadSkipped as exc:
        assert len(str(exc)) <= MAX_MESSAGE, str(exc)[:200]
    for line in lines[:8]:
        patterns = compile_patterns([line], syntax="regex")
        if patterns.refused:
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            python = re.compile(line)
        for name in _PROBES:
            answer = patterns.match(name)
            assert answer is None or answer == (python.match(name) is not None), (line, name)


# -- (k) config.json through fit ---------------------------------------------------------------

_FIT_FOLDER: Path | None = None


def _fit_folder() -> Path:
    """A tiny MoE with attention, experts, norms and MTP-free layers, written once per process
    by safetensors' own writer (in RAM where there is /dev/shm)."""
    global _FIT_FOLDER
    if _FIT_FOLDER is None:
        import numpy as np
        from safetensors.numpy import save_file

        folder = _scratch("ckpt-fuzz-fit-")
        state = {"model.embed_tokens.weight": np.zeros((64, 16), np.float16)}
        for layer in range(2):
            p = f"model.layers.{layer}"
            for proj, rows in (("q_proj", 16), ("k_proj", 8), ("v_proj", 8), ("o_proj", 16)):
                state[f"{p}.self_attn.{proj}.weight"] = np.zeros((rows, 16), np.float16)
            state[f"{p}.mlp.gate.weight"] = np.zeros((4, 16), np.float16)
            for expert in range(4):
                for proj in ("gate_proj", "up_proj", "down_proj"):
                    shape = (16, 8) if proj == "down_proj" else (8, 16)
                    state[f"{p}.mlp.experts.{expert}.{proj}.weight"] = np.zeros(shape, np.uint8)
                    state[f"{p}.mlp.experts.{expert}.{proj}.weight_scale_inv"] = np.ones(
                        (1, 1), np.float32
                    )
            state[f"{p}.input_layernorm.weight"] = np.ones(16, np.float16)
        state["lm_head.weight"] = np.zeros((64, 16), np.float16)
        save_file(state, str(folder / "model.safetensors"))
        _FIT_FOLDER = folder
    return _FIT_FOLDER


def _prepare_fit_config() -> None:
    _fit_folder()
    # The modules the first input would import (pandas among them: seconds of CPU on a busy
    # machine), imported here so that libFuzzer's per-input timeout times the input alone.
    import inspector._internal.scan.entry
    import inspector._internal.serve.fit  # noqa: F401


def fit_config(data: bytes) -> None:
    """The bytes as config.json of a tiny MoE, through `scan` and `fit` (the matrix, and one
    plan with pipeline stages on a GPU at the longest context a caller may ask): findings of
    known codes with bounded printable messages, a JSON-ready result, never an exception."""
    import json

    from inspector._internal.scan.entry import scan
    from inspector._internal.serve.fit import MAX_CONTEXT, fit

    folder = _fit_folder()
    (folder / CONFIG_NAME).write_bytes(data)
    scanned = scan(folder)
    for options in ({}, {"tp": 4, "ep": 2, "pp": 3, "gpu_memory": 80, "context": MAX_CONTEXT}):
        result = fit(scanned, **options)  # type: ignore[arg-type]
        json.dumps(result.to_dict())
        result.frame()
        for plan in result.plans:
            _check_findings(list(plan.findings))
            assert plan.weights_bytes_per_rank >= 0


# -- (l) an entry of the load verdict's cache --------------------------------------------------

_ENTRY_SCAN: Any = None
# Seeds spell the key of the entry as this placeholder (the real key holds the versions and
# the tool's code digest, which change): the target puts the real key in its place.
ENTRY_KEY = b'"@key"'


def _entry_scan() -> Any:
    """A scanned checkpoint whose verdict the cache would answer for (the file system is not
    read: the scan is built in memory)."""
    global _ENTRY_SCAN
    if _ENTRY_SCAN is None:
        from inspector._internal.checkpoint.scanned import ScannedCheckpoint, ShardedInfo
        from inspector._internal.formats.safetensors import ShardHeader

        shard = ShardHeader.from_columns(
            "model.safetensors", 16, 0, None, ["w"], ["F32"], [[2]], [0], [8]
        )
        config = {"architectures": ["FuzzForCausalLM"]}
        _ENTRY_SCAN = ScannedCheckpoint(
            _scratch("ckpt-fuzz-entry-"), "hf-sharded", ShardedInfo(), (shard,), config=config
        )
    return _ENTRY_SCAN


def verdict_entry(data: bytes) -> None:
    """The bytes as the cache's entry of a checkpoint's verdict (`"@key"` replaced by the real
    key), read as `load_verdict` reads it: the checkpoint's own verdict, one that survives
    its round trip, or none; never an error."""
    from inspector._internal.load import cache
    from inspector._internal.load.verdict import LoadVerdict, known_verdict, verdict_key

    scanned = _entry_scan()
    key, env = verdict_key(scanned), cache.environment()
    if key is None or env is None:
        return  # torch or transformers not installed: nothing is ever kept
    full = {**key, **env}
    folder = cache.verdict_folder()
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    entry = folder / cache.entry_name(full)
    entry.write_bytes(data.replace(ENTRY_KEY, orjson.dumps(full)))
    try:
        verdict = known_verdict(scanned)
    finally:
        entry.unlink()
    if verdict is not None:
        assert verdict.architecture == "FuzzForCausalLM", verdict.architecture
        assert LoadVerdict.from_dict(verdict.to_dict()) == verdict


TARGETS: dict[str, Callable[[bytes], None]] = {
    "header": header,
    "index_json": index_json,
    "pickle": pickle_metadata,
    "pickle_sandbox": pickle_sandbox,
    "load_config": load_config,
    "remote_answer": remote_answer,
    "torch_bin": torch_bin,
    "bin_pickle": bin_pickle,
    "gguf": gguf,
    "gguf_metadata": gguf_metadata,
    "manifest": manifest,
    "load_answer": load_answer,
    "engine_answer": engine_answer,
    "quant_patterns": quant_patterns,
    "fit_config": fit_config,
    "verdict_entry": verdict_entry,
}
# Set-up a target needs once per process (imports, a checkpoint), done before the first
# input is timed.
PREPARE: dict[str, Callable[[], None]] = {
    "load_config": _prepare_load_config,
    "manifest": _prepare_manifest,
    "quant_patterns": _prepare_quant_patterns,
    "fit_config": _prepare_fit_config,
    "remote_answer": _prepare_remote_answer,
    "gguf_metadata": _prepare_gguf_metadata,
    "torch_bin": _prepare_bin,
    "bin_pickle": _prepare_bin,
}
