"""The load verdict kept in the user's cache (`inspector._internal.load.cache`).

A verdict is computed once, then read (no model built, neither torch nor transformers
imported) until anything that decides it changes: what it reads of the checkpoint (config,
a dtype, a name...), `trust_remote_code` and the folder's code, the versions and the tool's
code. `--no-cache` computes it again and replaces the entry. The cache is untrusted input: a
corrupt, huge, linked, foreign or misplaced entry, a hostile cache folder, concurrent
writers, a read-only or full cache all end in a verdict computed as before, no error, and
nothing written outside the cache folder or over what is not ours.

Every test runs with a cache folder of its own (`verdict_cache_dir`, tests/conftest.py).
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import orjson
import pytest
from commands import UNSHARE
from hf_exports import resaved
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.numpy import save_file
from test_cli_errors import needs_namespace

import inspector._internal.load.verdict as verdict_module
from inspector._internal.checkpoint.scanned import ScannedCheckpoint, ShardedInfo
from inspector._internal.checks import check
from inspector._internal.cli.main import _parser, main
from inspector._internal.common.filenames import CONFIG_NAME, INDEX_NAME, QUANT_CONFIG_NAME
from inspector._internal.formats.safetensors import ShardHeader
from inspector._internal.load import cache as verdict_cache
from inspector._internal.load.records import LoadSkipped
from inspector._internal.load.verdict import (
    LoadVerdict,
    known_verdict,
    load_verdict,
    verdict_digest,
    verdict_key,
)
from inspector._internal.scan.entry import scan

HEALTHY = "healthy-hf-sharded"
NORM = "model.layers.0.input_layernorm.weight"


@pytest.fixture
def folder(demo_checkpoints: Path, tmp_path: Path) -> Path:
    """A private copy of the healthy demo (a tiny quantized DeepSeek-V3 the model builds)."""
    pytest.importorskip("transformers")
    return Path(shutil.copytree(demo_checkpoints / HEALTHY, tmp_path / "ckpt"))


@pytest.fixture
def builds(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The model builds from now on, by architecture: a verdict read from the cache adds none."""
    calls: list[str] = []
    real = verdict_module._built

    def counting(architecture, config, folder, trust):  # type: ignore[no-untyped-def]
        calls.append(architecture)
        return real(architecture, config, folder, trust)

    monkeypatch.setattr(verdict_module, "_built", counting)
    return calls


def _same(a: LoadVerdict, b: LoadVerdict) -> bool:
    maps = ("sources", "stored_as", "reasons")
    return a == b and all(dict(getattr(a, m)) == dict(getattr(b, m)) for m in maps)


def _entry(scanned: ScannedCheckpoint, *, trust_remote_code: bool = False) -> Path:
    """Where the verdict of `scanned` is kept."""
    key = verdict_key(scanned, trust_remote_code=trust_remote_code)
    env = verdict_cache.environment()
    assert key is not None and env is not None
    return verdict_cache.verdict_folder() / verdict_cache.entry_name({**key, **env})


def _entries(cache: Path) -> list[Path]:
    return sorted((cache / "verdicts").glob("*.json"))


# -- computed once, then read ------------------------------------------------------------------


def test_a_verdict_is_computed_once_then_read(
    folder: Path, builds: list[str], verdict_cache_dir: Path, tmp_path: Path
) -> None:
    first = load_verdict(scan(folder))
    assert first.ran and first.loads and builds == ["DeepseekV3ForCausalLM"]
    (entry,) = _entries(verdict_cache_dir)
    assert entry == _entry(scan(folder))
    second = load_verdict(scan(folder))
    assert _same(first, second) and len(builds) == 1
    # The checkpoint's path is not part of the key: a copy has its original's verdict.
    copy = shutil.copytree(folder, tmp_path / "copy")
    assert _same(load_verdict(scan(copy)), first) and len(builds) == 1
    # `check` takes it too, and finds what it finds with the verdict computed.
    computed = check(scan(folder), cache=False)
    assert len(builds) == 2 and check(scan(folder)) == computed and len(builds) == 2


def test_a_hit_imports_neither_torch_nor_transformers(folder: Path) -> None:
    """Measured as a user would (`python -X importtime`): the second `check` of a checkpoint
    imports neither."""
    load_verdict(scan(folder))

    def imported(*options: str) -> set[str]:
        proc = subprocess.run(
            [sys.executable, "-X", "importtime", "-m", "inspector", "check", str(folder), *options],
            capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert "load check: loads as DeepseekV3ForCausalLM" in proc.stdout
        return {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines()}

    hit = imported()
    assert "inspector._internal.load.cache" in hit  # the output is read, the cache was used
    assert not {n.partition(".")[0] for n in hit} & {"torch", "transformers"}


# -- every part of the key decides ------------------------------------------------------------


def _edit_config(folder: Path, change: Callable[[dict], dict]) -> None:
    config = json.loads((folder / CONFIG_NAME).read_text())
    (folder / CONFIG_NAME).write_text(json.dumps(change(config), indent=2))


def _to_f32(state: dict) -> dict:
    import torch

    return {k: v.to(torch.float32) if k == NORM else v for k, v in state.items()}


def _renamed(state: dict) -> dict:
    return {(k.replace("input_layernorm", "pre_norm") if k == NORM else k): v
            for k, v in state.items()}  # fmt: skip


EDITS: dict[str, Callable[[Path, Path], Path]] = {
    CONFIG_NAME: lambda f, tmp: (
        _edit_config(f, lambda c: {**c, "rms_norm_eps": 1e-5}),
        f,
    )[1],
    "config.json's key order": lambda f, tmp: (
        _edit_config(f, lambda c: dict(reversed(list(c.items())))),
        f,
    )[1],
    QUANT_CONFIG_NAME: lambda f, tmp: (
        (f / QUANT_CONFIG_NAME).write_text(
            (f / QUANT_CONFIG_NAME).read_text().replace("}", ', "note": 1}', 1)
        ),
        f,
    )[1],
    "a shard's dtype": lambda f, tmp: resaved(f, tmp / "dtype", _to_f32),
    "a tensor's name": lambda f, tmp: resaved(f, tmp / "name", _renamed),
}


@pytest.mark.parametrize("what", EDITS)
def test_what_the_verdict_reads_decides(
    what: str, folder: Path, builds: list[str], tmp_path: Path
) -> None:
    load_verdict(scan(folder))
    before = verdict_digest(scan(folder))
    edited = EDITS[what](folder, tmp_path)
    after = load_verdict(scan(edited))
    assert len(builds) == 2 and verdict_digest(scan(edited)) != before, what  # a miss
    assert _same(load_verdict(scan(edited)), after) and len(builds) == 2  # then a hit


def test_the_options_the_folders_code_and_the_environment_decide(
    folder: Path, builds: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    scanned = scan(folder)
    plain = load_verdict(scanned)
    assert len(builds) == 1
    trusted = load_verdict(scanned, trust_remote_code=True)
    assert len(builds) == 2 and _same(trusted, plain)  # its own entry, the same verdict
    load_verdict(scanned, trust_remote_code=True)
    assert len(builds) == 2
    # The folder's Python files decide only when they may run.
    (folder / "helpers.py").write_text("SCALE = 1\n")
    load_verdict(scan(folder))
    assert len(builds) == 2
    load_verdict(scan(folder), trust_remote_code=True)
    assert len(builds) == 3
    (folder / "helpers.py").write_text("SCALE = 2\n")
    load_verdict(scan(folder), trust_remote_code=True)
    assert len(builds) == 4
    # transformers', torch's, Python's and the tool's versions, and the tool's code.
    real = verdict_cache.environment()
    assert real is not None and set(real) == {"transformers", "torch", "python", "tool",
                                               "tool_code"}  # fmt: skip
    for n, part in enumerate(sorted(real), start=1):
        other = {**real, part: f"{real[part]}-other"}
        monkeypatch.setattr(verdict_cache, "environment", lambda other=other: other)
        load_verdict(scanned)
        load_verdict(scanned)
        assert len(builds) == 4 + n, part
    # Without a version to name it, nothing is kept.
    monkeypatch.setattr(verdict_cache, "environment", lambda: None)
    load_verdict(scanned)
    load_verdict(scanned)
    assert len(builds) == 4 + len(real) + 2


def test_a_skip_the_machine_caused_is_not_kept(
    folder: Path, monkeypatch: pytest.MonkeyPatch, verdict_cache_dir: Path
) -> None:
    calls: list[int] = []

    def failing(*args: object) -> None:
        calls.append(1)
        try:
            raise MemoryError
        except MemoryError as exc:
            raise LoadSkipped("transformers cannot build it (MemoryError)") from exc

    monkeypatch.setattr(verdict_module, "_built", failing)
    assert "MemoryError" in (load_verdict(scan(folder)).skipped or "")
    assert "MemoryError" in (load_verdict(scan(folder)).skipped or "")
    assert len(calls) == 2 and not _entries(verdict_cache_dir)

    def unknown(*args: object) -> None:
        calls.append(1)
        raise LoadSkipped("transformers 0 does not know DeepseekV3ForCausalLM")

    monkeypatch.setattr(verdict_module, "_built", unknown)
    load_verdict(scan(folder))
    assert "does not know" in (load_verdict(scan(folder)).skipped or "")
    assert len(calls) == 3 and len(_entries(verdict_cache_dir)) == 1


def test_a_skip_the_files_decide_is_never_kept(tmp_path: Path, verdict_cache_dir: Path) -> None:
    folder = tmp_path / "ckpt"
    folder.mkdir()
    save_file({"w": np.ones(2, np.float32)}, str(folder / "model.safetensors"))
    assert "no config.json" in (load_verdict(scan(folder)).skipped or "")
    assert not (verdict_cache_dir / "verdicts").exists()


# -- --no-cache -------------------------------------------------------------------------------


def test_no_cache_computes_again_and_replaces_the_entry(
    folder: Path, builds: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    def check_json(*options: str) -> dict:
        main(["check", str(folder), "--json", *options])
        return json.loads(capsys.readouterr().out)["load"]

    assert check_json()["missing"] == [] and len(builds) == 1
    # An entry changed behind our back (still well formed, for this very key) is believed:
    # this is what `check` reads on a hit.
    entry = _entry(scan(folder))
    forged = orjson.loads(entry.read_bytes())
    forged["verdict"]["missing"] = ["lm_head.weight"]
    entry.write_bytes(orjson.dumps(forged))
    assert check_json()["missing"] == ["lm_head.weight"] and len(builds) == 1
    assert check_json("--no-cache")["missing"] == [] and len(builds) == 2
    assert orjson.loads(entry.read_bytes())["verdict"]["missing"] == []
    assert check_json()["missing"] == [] and len(builds) == 2


@pytest.mark.parametrize("command", ["check", "report", "repair"])
def test_every_command_with_the_model_options_takes_no_cache(command: str) -> None:
    assert _parser().parse_args([command, "some/folder", "--no-cache"]).cache is False
    assert _parser().parse_args([command, "some/folder"]).cache is True


# -- hostile entries -----------------------------------------------------------------------------


def _plant(kind: str, entry: Path, good: bytes, tmp_path: Path) -> None:
    entry.unlink()
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_bytes(good)
    if kind == "not JSON":
        entry.write_bytes(b"{not json")
    elif kind == "cut short":
        entry.write_bytes(good[: len(good) // 2])
    elif kind == "another format":
        entry.write_bytes(good.replace(b'"ckpt-inspect-verdict"', b'"pickle"'))
    elif kind == "another key's":
        other = orjson.loads(good)
        other["key"]["trust_remote_code"] = True
        entry.write_bytes(orjson.dumps(other))
    elif kind == "a field of the wrong type":
        bad = orjson.loads(good)
        bad["verdict"]["missing"] = 5
        entry.write_bytes(orjson.dumps(bad))
    elif kind == "another architecture":
        bad = orjson.loads(good)
        bad["verdict"]["architecture"] = "LlamaForCausalLM"
        entry.write_bytes(orjson.dumps(bad))
    elif kind == "nested 100,000 deep":
        entry.write_bytes(b"[" * 100_000 + b"]" * 100_000)
    elif kind == "huge":  # sparse: refused by its size, never read
        with open(entry, "wb") as f:
            f.truncate(verdict_cache.MAX_ENTRY_BYTES + 1)
    elif kind == "a link":
        entry.symlink_to(elsewhere)
    elif kind == "a FIFO":
        os.mkfifo(entry)
    elif kind == "a folder":
        entry.mkdir()
    elif kind == "another user's":
        entry.write_bytes(good)
        os.chown(entry, 54321, 54321)
    elif kind == "a second name of another file":  # a valid entry, but not ours to touch
        os.link(elsewhere, entry)
    else:
        raise AssertionError(kind)


HOSTILE = [
    "not JSON",
    "cut short",
    "another format",
    "another key's",
    "a field of the wrong type",
    "another architecture",
    "nested 100,000 deep",
    "huge",
    "a link",
    "a FIFO",
    "a folder",
    "another user's",
    "a second name of another file",
]
# Not a file as the cache writes it: never read, touched or written over (the verdict is
# computed each time).
NOT_OURS = {"a link", "a FIFO", "a folder", "another user's", "a second name of another file"}


@pytest.mark.parametrize("kind", HOSTILE)
def test_a_hostile_entry_is_a_miss(
    kind: str, folder: Path, builds: list[str], tmp_path: Path
) -> None:
    if kind == "another user's" and os.geteuid() != 0:
        pytest.skip("giving a file to another user needs root")
    truth = load_verdict(scan(folder))
    entry = _entry(scan(folder))
    good = entry.read_bytes()
    _plant(kind, entry, good, tmp_path)
    elsewhere = tmp_path / "elsewhere.json"
    os.utime(elsewhere, (1_000, 1_000))
    again = load_verdict(scan(folder))
    assert _same(again, truth) and len(builds) == 2, kind
    if kind in NOT_OURS:
        info = entry.lstat()  # still what was planted, not replaced by an entry
        assert not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid() or info.st_nlink > 1
        # What a link or a second name leads to is neither written nor touched.
        assert elsewhere.read_bytes() == good and elsewhere.stat().st_mtime == 1_000
    else:
        assert entry.read_bytes() == good  # replaced by the verdict computed
        load_verdict(scan(folder))
        assert len(builds) == 2


def _key_and_verdict(n: int) -> tuple[dict, dict]:
    key = {"reads": f"{n:064x}", "trust_remote_code": False, "local": True, "code": None}
    return key, LoadVerdict(architecture=f"Model{n}ForCausalLM").to_dict()


def test_a_hostile_cache_folder_is_no_cache(
    verdict_cache_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key, verdict = _key_and_verdict(1)
    victim = tmp_path / "victim"
    victim.write_text("precious")
    verdict_cache_dir.mkdir()
    folder = verdict_cache_dir / "verdicts"
    # A link: neither read nor written through, whatever it points to.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    folder.symlink_to(elsewhere)
    assert not verdict_cache.keep(key, verdict) and not list(elsewhere.iterdir())
    folder.unlink()
    # Writable by others: someone else could have planted its entries.
    folder.mkdir(mode=0o700)
    assert verdict_cache.keep(key, verdict) and verdict_cache.kept(key) == verdict
    folder.chmod(0o777)
    assert verdict_cache.kept(key) is None and not verdict_cache.keep(key, verdict)
    folder.chmod(0o700)
    if os.geteuid() == 0:
        os.chown(folder, 54321, 54321)
        assert verdict_cache.kept(key) is None and not verdict_cache.keep(key, verdict)
        os.chown(folder, 0, 0)
    # The lock and a temp file planted as links to a file of ours: written through neither.
    (folder / ".lock").unlink()
    (folder / ".lock").symlink_to(victim)
    name = verdict_cache.entry_name({**key, **verdict_cache.environment()})  # type: ignore[dict-item]
    (folder / f".{name}.tmp-{os.getpid()}").symlink_to(victim)
    other_key, other = _key_and_verdict(2)
    assert verdict_cache.keep(key, verdict) and verdict_cache.keep(other_key, other)
    assert victim.read_text() == "precious" and not (folder / ".lock").is_symlink()
    assert verdict_cache.kept(key) == verdict and verdict_cache.kept(other_key) == other
    # A file where the folder belongs, a root that cannot be made: no cache, no error.
    shutil.rmtree(folder)
    folder.write_text("not a folder")
    assert not verdict_cache.keep(key, verdict) and verdict_cache.kept(key) is None
    monkeypatch.setenv(verdict_cache.CACHE_ENV, str(victim / "below-a-file"))
    assert not verdict_cache.keep(key, verdict) and verdict_cache.kept(key) is None
    assert victim.read_text() == "precious"


def test_a_cache_folder_that_is_not_absolute_is_no_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A relative folder (a variable set so, a home that cannot be found) would put the cache
    wherever the command runs, in a checkpoint folder maybe: it is no cache. Before: the
    entry went to ./rel/verdicts/ of the current folder."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(verdict_cache.CACHE_ENV, "rel")
    key, verdict = _key_and_verdict(1)
    assert not verdict_cache.keep(key, verdict) and verdict_cache.kept(key) is None
    assert not list(tmp_path.iterdir())


@pytest.mark.skipif(os.geteuid() != 0, reason="a link of another user's needs root")
def test_a_cache_folder_that_is_another_users_link_is_no_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In a shared folder (/tmp), another user's link at the cache's name could send it into
    any folder of ours."""
    ours = tmp_path / "ours"
    ours.mkdir()
    link = tmp_path / "shared-cache"
    link.symlink_to(ours)
    os.lchown(link, 54321, 54321)
    monkeypatch.setenv(verdict_cache.CACHE_ENV, str(link))
    assert not verdict_cache.keep(*_key_and_verdict(1)) and not list(ours.iterdir())
    os.lchown(link, os.geteuid(), os.getegid())  # the user's own link: their set-up
    assert verdict_cache.keep(*_key_and_verdict(1)) and (ours / "verdicts").is_dir()


def test_a_folder_nested_past_any_package_keeps_nothing_and_raises_nothing(
    folder: Path, builds: list[str]
) -> None:
    """With `trust_remote_code` the folder's Python files are digested. Python 3.11's walk
    recurses once per level: a tree 1,200 levels deep ended it in a RecursionError (a
    traceback instead of a verdict). The walk now stops at 32 levels (the tree here is 40
    deep: a test's tree as deep as the old failure would break pytest's own clean-up,
    which recurses the same way)."""
    deep = folder
    for _ in range(40):
        deep = deep / "a"
    deep.mkdir(parents=True)
    (deep / "x.py").write_text("")
    assert verdict_cache.code_digest(folder) is None
    assert verdict_key(scan(folder), trust_remote_code=True) is None
    assert load_verdict(scan(folder), trust_remote_code=True).ran
    assert load_verdict(scan(folder), trust_remote_code=True).ran and len(builds) == 2


# -- bounds, concurrency, the file system ------------------------------------------------------


def test_the_folder_keeps_its_bounds_least_recently_used_first(
    verdict_cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(verdict_cache, "MAX_ENTRIES", 3)
    pairs = [_key_and_verdict(n) for n in range(5)]
    for n, (key, verdict) in enumerate(pairs[:3]):
        assert verdict_cache.keep(key, verdict)
        name = verdict_cache.entry_name({**key, **verdict_cache.environment()})  # type: ignore[dict-item]
        os.utime(verdict_cache_dir / "verdicts" / name, (1_000 + n, 1_000 + n))
    assert verdict_cache.kept(pairs[0][0]) == pairs[0][1]  # used now: the newest
    assert verdict_cache.keep(*pairs[3])
    assert [verdict_cache.kept(k) is not None for k, _ in pairs[:4]] == [True, False, True, True]
    # By size too; the entry just written always stays.
    monkeypatch.setattr(verdict_cache, "MAX_TOTAL_BYTES", 1)
    assert verdict_cache.keep(*pairs[4])
    assert [verdict_cache.kept(k) is not None for k, _ in pairs] == [False] * 4 + [True]
    # One verdict over the entry cap is not kept at all.
    monkeypatch.setattr(verdict_cache, "MAX_ENTRY_BYTES", 100)
    assert not verdict_cache.keep(*pairs[0]) and verdict_cache.kept(pairs[0][0]) is None


def test_a_killed_writers_temp_file_is_removed_a_live_ones_kept(verdict_cache_dir: Path) -> None:
    assert verdict_cache.keep(*_key_and_verdict(1))
    folder = verdict_cache_dir / "verdicts"
    old, fresh = folder / f".{'a' * 64}.json.tmp-1", folder / f".{'b' * 64}.json.tmp-2"
    # Named like one but not exactly ours (Arabic digits, a leading zero): never removed.
    alike = [folder / f".{'c' * 64}.json.tmp-\u0661\u0662", folder / f".{'d' * 64}.json.tmp-01"]
    for path in (old, fresh, *alike):
        path.write_text("half")
    for path in (old, *alike):
        os.utime(path, (time.time() - 3_600,) * 2)
    assert verdict_cache.keep(*_key_and_verdict(2))
    assert not old.exists() and fresh.exists() and all(path.exists() for path in alike)


# Three writer processes at once. One interpreter imports the cache, then forks the three:
# each writes and reads with its own open files and flocks, as three separate interpreters
# would. The verdicts they keep are made by the test process (on stdin), and every verdict
# they read back is checked there (their stdout): the probe imports the cache alone, not the
# verdict's module (pandas among what that imports, most of an interpreter's time).
_WRITERS = textwrap.dedent(
    """
    import json, os, sys, traceback
    from inspector._internal.load import cache

    cache.MAX_ENTRIES = 4
    verdicts = json.load(sys.stdin)  # {"reads" of a key: the verdict kept for it}

    def write(me, out):
        for n in range(8):
            shared = n % 3  # the same three keys in every process, and keys of its own
            for reads in (f"{shared:064x}", f"{me:032x}{n:032x}"):
                key = {"reads": reads, "trust_remote_code": False, "local": True, "code": None}
                cache.keep(key, verdicts[reads])
                out.write(json.dumps(cache.kept(key)) + "\\n")

    pids = []
    for me in range(1, 4):
        read, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read)
            code = 0
            try:
                with os.fdopen(write_end, "w") as out:
                    write(me, out)
            except BaseException:
                traceback.print_exc()
                code = 1
            os._exit(code)
        os.close(write_end)
        pids.append((pid, os.fdopen(read)))
    got = [line for _, answers in pids for line in answers.read().splitlines()]
    codes = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid, _ in pids]
    print(json.dumps({"codes": codes, "got": got}))
    """
)


def test_concurrent_writers_leave_whole_entries_within_bounds(verdict_cache_dir: Path) -> None:
    reads = [f"{n:064x}" for n in range(3)]
    reads += [f"{me:032x}{n:032x}" for me in range(1, 4) for n in range(8)]
    verdicts = {r: LoadVerdict(architecture=f"M{r[-6:]}").to_dict() for r in reads}
    proc = subprocess.run(
        [sys.executable, "-c", _WRITERS],
        input=json.dumps(verdicts),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    answer = json.loads(proc.stdout.strip().splitlines()[-1])
    assert answer["codes"] == [0, 0, 0], proc.stderr[-2000:]
    assert len(answer["got"]) == 3 * 8 * 2
    for line in answer["got"]:  # each read whole, or nothing (an entry another one evicted)
        got = json.loads(line)
        assert got is None or LoadVerdict.from_dict(got).architecture.startswith("M"), got
    folder = verdict_cache_dir / "verdicts"
    names = sorted(p.name for p in folder.iterdir())
    entries = [n for n in names if n.endswith(".json")]
    assert names == [".lock", *entries] and len(entries) <= 4  # no temp file left
    for name in entries:
        entry = orjson.loads((folder / name).read_bytes())
        assert verdict_cache.entry_name(entry["key"]) == name
        LoadVerdict.from_dict(entry["verdict"])


# The verdict it keeps (200 kB) comes on stdin, made by this process: the probe imports the
# cache alone, not the verdict's module (pandas among what that imports: 0.6 s of its 1 s).
_READ_ONLY_PROBE = textwrap.dedent(
    """
    import json, sys
    from inspector._internal.load import cache

    verdict = json.load(sys.stdin)

    def pair(n):
        key = {"reads": f"{n:064x}", "trust_remote_code": False, "local": True, "code": None}
        return key, verdict

    print(cache.kept(pair(1)[0]) is not None, cache.keep(*pair(2)), cache.kept(pair(2)[0]))
    """
)


@needs_namespace
@pytest.mark.parametrize("wrap", ["read-only", "full"])
def test_a_read_only_or_full_cache_is_no_error(wrap: str, verdict_cache_dir: Path) -> None:
    """EROFS and ENOSPC from a real file system, in a user namespace: what is kept is still
    read, nothing new is kept, no temp file is left."""
    key = {"reads": f"{1:064x}", "trust_remote_code": False, "local": True, "code": None}
    assert verdict_cache.keep(key, LoadVerdict(architecture="M").to_dict())
    folder = verdict_cache_dir / "verdicts"
    if wrap == "read-only":
        mount = f"mount --bind {folder} {folder} && mount -o remount,ro,bind {folder}"
        expected = "True False None"
    else:  # a 64 kB file system, full before the 200 kB entry is written
        copy = f"cp -a {folder} {folder}.bak"
        mount = (
            f"{copy} && mount -t tmpfs -o size=64k,mode=0700 tmpfs {folder} && "
            f"cp -a {folder}.bak/. {folder}/"
        )
        expected = "True False None"
    cmd = [*UNSHARE, "sh", "-c", f"{mount} && exec {sys.executable} -c '{_READ_ONLY_PROBE}'"]
    verdict = LoadVerdict(architecture="M", missing=("x" * 200_000,)).to_dict()
    proc = subprocess.run(
        cmd, input=json.dumps(verdict), capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == expected.split(), proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr


def test_a_cache_on_another_file_system(monkeypatch: pytest.MonkeyPatch) -> None:
    """The temp file is written beside its entry, so the rename never crosses file systems."""
    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm")
    root = Path(__import__("tempfile").mkdtemp(prefix="ckpt-verdicts-", dir="/dev/shm"))
    try:
        monkeypatch.setenv(verdict_cache.CACHE_ENV, str(root))
        key, verdict = _key_and_verdict(7)
        assert verdict_cache.keep(key, verdict) and verdict_cache.kept(key) == verdict
    finally:
        shutil.rmtree(root)


# -- the digest: no two scans alike ---------------------------------------------------------------


def _scanned(shards: list[list[tuple[str, str, tuple[int, ...], int]]], config: dict) -> str:
    headers = []
    for n, rows in enumerate(shards):
        names = [r[0] for r in rows]
        begins = [r[3] for r in rows]
        headers.append(
            ShardHeader.from_columns(
                f"model-{n}.safetensors", 0, 0, None, names, [r[1] for r in rows],
                [r[2] for r in rows], begins, [b + 2 for b in begins],
            )
        )  # fmt: skip
    scanned = ScannedCheckpoint(Path("."), "hf-sharded", ShardedInfo(), headers, config=config)
    return verdict_digest(scanned)


_rows = st.lists(
    st.tuples(st.sampled_from(["a", "b", 'a", "b', "a\0b", ""]), st.sampled_from(["F16", "BF16"]),
              st.sampled_from([(), (2,), (2, 3), (3, 2)]), st.sampled_from([0, 2])),
    max_size=3,
)  # fmt: skip
_configs = st.sampled_from(
    [{}, {"x": 1}, {"x": 1.0}, {"x": True}, {"x": "1"}, {"x": 2**70}, {"x": [1]}, {"x": None}]
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_rows, min_size=1, max_size=3), _configs, st.lists(_rows, min_size=1, max_size=3),
       _configs)  # fmt: skip
def test_two_scans_have_one_digest_only_when_they_read_alike(
    a: list, config_a: dict, b: list, config_b: dict
) -> None:
    """Names with quotes or NUL, tensors moved across shards, 1 against 1.0 and True, ints
    past 64 bits: the digest's framing never lets two different scans feed the hash the
    same bytes."""
    alike = a == b and json.dumps(config_a) == json.dumps(config_b)
    assert (_scanned(a, config_a) == _scanned(b, config_b)) == alike


def test_tied_and_untied_bin_files_are_two_keys(tmp_path: Path) -> None:
    """The same names, dtypes and shapes in a `.bin` file, once with the head tied to the
    embedding (one storage under two names, as torch.save writes it) and once untied: the
    stored parameter count differs (a tied weight counts once). The digest before this
    change (names, dtypes, shapes) was the same for both, so the cache would have answered
    one with the other's count; the byte spans now tell them apart."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        vocab_size=32, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=2, tie_word_embeddings=False,
        architectures=["LlamaForCausalLM"],
    )  # fmt: skip
    torch.manual_seed(0)
    state = transformers.LlamaForCausalLM(config).state_dict()
    folders = []
    for name in ("untied", "tied"):
        folder = tmp_path / name
        config.save_pretrained(folder)
        written = {k: v.clone() for k, v in state.items()}
        if name == "tied":
            written["lm_head.weight"] = written["model.embed_tokens.weight"]
        torch.save(written, folder / "pytorch_model.bin")
        folders.append(folder)
    untied, tied = (scan(f) for f in folders)
    assert untied.layout == tied.layout == "pytorch-bin"
    assert verdict_digest(untied) != verdict_digest(tied)
    counts = [load_verdict(s).stored_parameters for s in (untied, tied)]
    assert counts[0] is not None and counts[1] is not None and counts[0] > counts[1]


def test_known_verdict_never_builds_or_starts_anything(folder: Path, builds: list[str]) -> None:
    scanned = scan(folder)
    assert known_verdict(scanned) is None and known_verdict(scanned, cache=False) is None
    computed = load_verdict(scanned)
    found = known_verdict(scanned)
    assert found is not None and _same(found, computed) and len(builds) == 1
    assert known_verdict(scanned, cache=False) is None


def test_the_copy_a_loader_keeps_decides_the_key(tmp_path: Path) -> None:
    """Two shards hold `w` with different shapes; the index spells the second shard
    `b.safetensors` in one folder and `./b.safetensors` in the other. transformers reads the
    index's files in the order of their sorted spellings and keeps the last copy
    (`checkpoint.loaded`), so the two folders load different tensors: two keys."""
    folders = []
    for spelling in ("b.safetensors", "./b.safetensors"):
        folder = tmp_path / spelling.replace("/", "_")
        folder.mkdir()
        save_file({"w": np.zeros(2, np.float32)}, str(folder / "a.safetensors"))
        save_file({"w": np.zeros(3, np.float32), "v": np.zeros(1, np.float32)},
                  str(folder / "b.safetensors"))  # fmt: skip
        (folder / CONFIG_NAME).write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
        index = {"metadata": {}, "weight_map": {"w": "a.safetensors", "v": spelling}}
        (folder / INDEX_NAME).write_text(json.dumps(index))
        folders.append(scan(folder))
    plain, dotted = folders
    kept = [verdict_module.stored_tensors(s)["w"] for s in folders]
    assert kept == [("F32", (3,)), ("F32", (2,))]
    assert verdict_digest(plain) != verdict_digest(dotted)
