"""Hostile config.json against the load check: it never prompts, never uses the network,
writes nothing outside its own temp folder, and imports no code but the checkpoint folder's
own (and that only with --trust-remote-code), whatever the config nests.

The checkpoints are written by transformers' own `save_pretrained` (Llama, Llava, UperNet),
then their config.json is edited the way a hostile or careless publisher would:

- a nested sub-config carrying an `auto_map` of a type AutoModel lacks (`vision_config` of
  a Llava config): transformers asked "Do you wish to run the custom code? [y/N]" on the
  terminal, and `check`/`report` blocked on it; answering `y` downloaded the module from the
  repository the sub-config's `_name_or_path` names and imported it;
- `"backbone": "org/repo"`: transformers queried the Hub for the repository and downloaded
  its config into the user's Hugging Face cache;
- configs nested deeper than the load check builds, or holding more values.

Every test runs with sockets that fail the test when used (in this process, and in the CLI
run in a terminal through a `sitecustomize` that blocks them), the user's Hugging Face cache
pointed at a temp folder that must stay untouched, and an audit hook that records every act
the seal refused (`inspector._internal.load.seal.REFUSED_EVENT`).
"""

from __future__ import annotations

import builtins
import json
import os
import pty
import re
import select
import shutil
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from inspector._internal.checks import check
from inspector._internal.common.filenames import CONFIG_NAME
from inspector._internal.load.seal import REFUSED_EVENT, Refused, sealed
from inspector._internal.load.verdict import (
    MAX_CONFIG_DEPTH,
    LoadVerdict,
    clear_model_cache,
    load_verdict,
)
from inspector._internal.scan.entry import scan

T = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]
LOAD_CODES = {"load-missing-tensor", "load-unexpected-tensor", "load-shape-mismatch"}
PROMPT = "Do you wish to run the custom code"
# Module code a hostile config points at: importing it leaves a mark in this process.
EVIL_CODE = "import builtins\nbuiltins._ckpt_inspect_evil_imported = True\nclass EvilVision: pass\n"


# -- checkpoints written by transformers ---------------------------------------------------------


def _save(model: object, folder: Path) -> Path:
    torch.manual_seed(0)
    model.save_pretrained(folder)  # type: ignore[attr-defined]
    return folder


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("written")
    attn = {"num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 64}
    llama = T.LlamaConfig(**attn, hidden_size=16, intermediate_size=32, num_hidden_layers=1)
    vision = {"model_type": "clip_vision_model", "hidden_size": 16, "intermediate_size": 32,
              "num_hidden_layers": 1, "num_attention_heads": 2, "image_size": 28,
              "patch_size": 14, "projection_dim": 8}  # fmt: skip
    text = {"model_type": "llama", "hidden_size": 16, "intermediate_size": 32,
            "num_hidden_layers": 1, **attn}  # fmt: skip
    llava = T.LlavaConfig(vision_config=vision, text_config=text, image_token_index=63)
    convnext = T.ConvNextConfig(hidden_sizes=[8, 16, 16, 16], depths=[1, 1, 1, 1],
                                out_features=["stage1", "stage2", "stage3", "stage4"])  # fmt: skip
    upernet = T.UperNetConfig(backbone_config=convnext, hidden_size=8, auxiliary_channels=8,
                              num_labels=2, pool_scales=[1, 2])  # fmt: skip
    return {
        "llama": _save(T.LlamaForCausalLM(llama), base / "llama"),
        "llava": _save(T.LlavaForConditionalGeneration(llava), base / "llava"),
        "upernet": _save(T.UperNetForSemanticSegmentation(upernet), base / "upernet"),
    }


def edited(src: Path, dest: Path, edit: Callable[[dict], None]) -> Path:
    shutil.copytree(src, dest)
    config = json.loads((dest / CONFIG_NAME).read_text())
    edit(config)
    (dest / CONFIG_NAME).write_text(json.dumps(config, indent=2))
    return dest


def files_under(folder: Path) -> dict[str, int]:
    return {
        str(p.relative_to(folder)): p.stat().st_size
        for p in sorted(folder.rglob("*"))
        if p.is_file() or p.is_symlink()
    }


# -- the guards ----------------------------------------------------------------------------------


_refusals: list[str] | None = None


def _listen(event: str, args: tuple) -> None:
    if event == REFUSED_EVENT and _refusals is not None:
        _refusals.append(str(args[0]))


sys.addaudithook(_listen)


class Guard:
    """What the code under test tried: socket use (refused here, before the seal could),
    acts the seal refused, reads of stdin outside the seal."""

    def __init__(self, user_hf: Path) -> None:
        self.user_hf = user_hf
        self.sockets: list[object] = []
        self.refused: list[str] = []
        self.stdin_reads = 0
        self.before = files_under(user_hf)

    def assert_clean(self) -> None:
        assert self.sockets == [], self.sockets
        assert not [r for r in self.refused if "terminal" in r], self.refused
        assert self.stdin_reads == 0
        assert files_under(self.user_hf) == self.before, "the user's HF cache was written"
        assert not hasattr(builtins, "_ckpt_inspect_evil_imported"), "hostile code was imported"


class _FailingStdin:
    def __init__(self, guard: Guard) -> None:
        self.guard = guard

    def read(self, *_: object) -> str:
        self.guard.stdin_reads += 1
        raise AssertionError("stdin was read")

    readline = read

    def isatty(self) -> bool:
        return True  # as in a terminal, where transformers' prompt blocks


def _user_hf_cache(root: Path) -> Path:
    """A user's Hugging Face cache that already holds `org/repo`'s config (a ConvNeXt
    backbone): transformers offline would read it; the load check must not."""
    snapshot = root / "hub" / "models--org--repo" / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    convnext = T.ConvNextConfig(hidden_sizes=[8, 16, 16, 16], depths=[1, 1, 1, 1],
                                out_features=["stage1", "stage2", "stage3", "stage4"])  # fmt: skip
    (snapshot / CONFIG_NAME).write_text(convnext.to_json_string())
    (root / "hub" / "models--org--repo" / "refs").mkdir()
    (root / "hub" / "models--org--repo" / "refs" / "main").write_text("0" * 40)
    return root


@pytest.fixture
def guard(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Guard]:
    global _refusals
    import huggingface_hub.constants as hub

    user_hf = _user_hf_cache(tmp_path / "user-hf")
    g = Guard(user_hf)
    original_input = builtins.input
    timeout = T.dynamic_module_utils.TIME_OUT_REMOTE_CODE

    def no_socket(*args: object, **kwargs: object) -> None:
        g.sockets.append(args[1:3] if args and isinstance(args[0], socket.socket) else args[:2])
        raise OSError("the test allows no network")

    for name in ("connect", "connect_ex", "sendto", "bind"):
        monkeypatch.setattr(socket.socket, name, no_socket)
    for name in ("create_connection", "getaddrinfo", "gethostbyname"):
        monkeypatch.setattr(socket, name, no_socket)
    monkeypatch.setenv("HF_HOME", str(user_hf))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(hub, "HF_HOME", str(user_hf))
    monkeypatch.setattr(hub, "HF_HUB_CACHE", str(user_hf / "hub"))
    monkeypatch.setattr(hub, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(T.dynamic_module_utils, "HF_MODULES_CACHE", str(user_hf / "modules"))
    monkeypatch.setattr(sys, "stdin", _FailingStdin(g))
    monkeypatch.delattr(builtins, "_ckpt_inspect_evil_imported", raising=False)
    _refusals = g.refused
    clear_model_cache()
    try:
        yield g
    finally:
        _refusals = None
    # The seal put everything back.
    assert sys.stdin.__class__ is _FailingStdin and builtins.input is original_input
    assert hub.HF_HUB_OFFLINE is False
    assert str(user_hf / "hub") == hub.HF_HUB_CACHE
    assert T.dynamic_module_utils.TIME_OUT_REMOTE_CODE == timeout > 0
    assert "HF_HUB_OFFLINE" not in os.environ


def skipped_quietly(folder: Path, verdict: LoadVerdict) -> str:
    """The verdict's skip reason; a skip gives no load finding and no exception."""
    assert verdict.skipped is not None and verdict.loads is None and not verdict.missing
    assert not [f for f in check(scan(folder), verdict=verdict) if f.code in LOAD_CODES]
    return verdict.skipped


# -- 1. code a nested sub-config names -------------------------------------------------------------


def _vision_auto_map(config: dict) -> None:
    config["vision_config"].update(
        model_type="blip_vision_model",  # a type AutoModel has no class for
        auto_map={"AutoModel": "modeling_evil.EvilVision"},
        _name_or_path="evil/repo",
    )


@pytest.mark.parametrize("trust", [False, True])
def test_nested_auto_map_is_never_asked_about_nor_run(
    written: dict[str, Path], tmp_path: Path, guard: Guard, trust: bool
) -> None:
    folder = edited(written["llava"], tmp_path / "ckpt", _vision_auto_map)
    (folder / "modeling_evil.py").write_text(EVIL_CODE)
    verdict = load_verdict(scan(folder), trust_remote_code=trust)
    reason = skipped_quietly(folder, verdict)
    assert "vision_config.auto_map" in reason and "modeling_evil.EvilVision" in reason
    assert "runs no such code" in reason
    guard.assert_clean()
    assert guard.refused == []  # transformers was never given a reason to ask


@pytest.mark.parametrize(
    "edit",
    [
        lambda c: c["text_config"].update(auto_map={"AutoModel": "modeling_evil.EvilVision"}),
        lambda c: c["vision_config"].update(auto_map={"AutoModel": "evil/repo--m.EvilVision"}),
        lambda c: c["text_config"]["rope_parameters"].update(auto_map={"AutoConfig": "m.C"}),
    ],
    ids=["text_config", "other-repo", "deeper"],
)
def test_nested_auto_map_of_a_type_transformers_ships_builds_its_own_class(
    written: dict[str, Path], tmp_path: Path, guard: Guard, edit: Callable[[dict], None]
) -> None:
    """As transformers does without trust_remote_code: its own class, no question asked."""
    healthy = load_verdict(scan(written["llava"]))
    folder = edited(written["llava"], tmp_path / "ckpt", edit)
    (folder / "modeling_evil.py").write_text(EVIL_CODE)
    verdict = load_verdict(scan(folder), trust_remote_code=True)
    assert verdict.loads and verdict == healthy
    guard.assert_clean()
    assert guard.refused == []


# -- 2. repositories a config names: offline -------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "edit", "expect"),
    [
        ("upernet", lambda c: c.update(backbone="org/repo", backbone_config=None),
         "needs files from the Hugging Face Hub (https://huggingface.co/api/models/org/repo)"),
        ("upernet", lambda c: c.update(backbone="resnet50", backbone_config=None,
                                       use_timm_backbone=True), "Hugging Face Hub"),
        ("upernet", lambda c: c.update(backbone_config="org/repo"), "cannot build"),
        ("llava", lambda c: c.update(text_config="org/repo"), "cannot build"),
        ("llava", lambda c: c.update(vision_config="org/repo"), "cannot build"),
        ("llava", lambda c: c["vision_config"].update(backbone="org/repo"), None),
        ("llava", lambda c: c["vision_config"].update(_name_or_path="org/repo"), None),
        ("llama", lambda c: c.update(_name_or_path="org/repo"), None),
    ],
    ids=["backbone", "timm-backbone", "backbone-config-id", "text-config-id",
         "vision-config-id", "nested-backbone", "nested-name-or-path", "name-or-path"],
)  # fmt: skip
def test_repositories_the_config_names_are_never_fetched(
    written: dict[str, Path],
    tmp_path: Path,
    guard: Guard,
    model: str,
    edit: Callable[[dict], None],
    expect: str | None,
) -> None:
    """No request to any host, nothing read from or written to the user's HF cache (which
    holds `org/repo`: the verdict does not depend on it); what cannot be built offline is
    skipped with the reason."""
    folder = edited(written[model], tmp_path / "ckpt", edit)
    verdict = load_verdict(scan(folder))
    if expect is None:
        assert verdict.loads, verdict.skipped
    else:
        assert expect in skipped_quietly(folder, verdict)
    guard.assert_clean()


def _sitecustomize(folder: Path) -> Path:
    """A `sitecustomize` for the CLI run: every socket use prints a mark and fails; a run
    that imported transformers says so at its exit."""
    folder.mkdir()
    (folder / "sitecustomize.py").write_text(
        textwrap.dedent(
            """
            import socket, sys

            def _blocked(*args, **kwargs):
                sys.stderr.write("SOCKET-USED %r\\n" % (args[1:3],))
                raise OSError("the test allows no network")

            for _name in ("connect", "connect_ex", "sendto", "bind"):
                setattr(socket.socket, _name, _blocked)
            socket.create_connection = socket.getaddrinfo = _blocked

            import atexit

            # Whether this run built a model (transformers imported) or read its verdict.
            atexit.register(
                lambda: "transformers" in sys.modules and sys.stderr.write("MODEL-BUILT\\n")
            )
            """
        )
    )
    return folder


# Runs CLI commands one after another in one interpreter, as `python -m inspector ARGS` runs
# each (runpy), and ends each command's output with a line giving its exit code and whether
# it built a model: whether it imported a model class's module of transformers (a kept
# verdict is read without one; a command after the first finds transformers imported already).
_COMMANDS = """
import json, runpy, sys

def models():
    return {n for n in sys.modules if n.startswith("transformers.models.") and ".modeling_" in n}

for args in json.loads(sys.argv[1]):
    before = models()
    sys.argv = ["inspector", *args]
    try:
        runpy.run_module("inspector", run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as end:
        code = end.code
    sys.stdout.flush()
    sys.stderr.flush()
    print(f"\\nCOMMAND-ENDED {code} {'MODEL-BUILT' if models() - before else ''}", flush=True)
"""


def run_in_terminal(
    args: list[str], env: dict[str, str], timeout: float = 300, *, python: list[str] | None = None
) -> tuple[int, str]:
    """`python -m inspector ARGS` (or `python ARGS` with `python` given) with a
    pseudo-terminal as stdin, stdout and stderr (where transformers' prompt waited for an
    answer); its exit code and everything it printed."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, *(python or ["-m", "inspector"]), *args],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env=env,
        cwd=ROOT,
        start_new_session=True,
    )
    os.close(slave)
    out = bytearray()
    deadline = time.monotonic() + timeout
    try:
        while True:
            if time.monotonic() > deadline:
                raise AssertionError(f"hung: {out.decode(errors='replace')[-2000:]}")
            ready, _, _ = select.select([master], [], [], 1.0)
            if ready:
                try:
                    chunk = os.read(master, 1 << 16)
                except OSError:  # EIO: the child closed the terminal
                    break
                if not chunk:
                    break
                out += chunk
            elif proc.poll() is not None:
                break
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        os.close(master)
    return proc.returncode, out.decode(errors="replace")


def commands_in_terminal(commands: list[list[str]], env: dict[str, str]) -> list[tuple[int, str]]:
    """Each command's exit code and output, the commands run one after another in one
    interpreter in a terminal (`_COMMANDS`); an output ends with MODEL-BUILT when its command
    built a model."""
    code, out = run_in_terminal([json.dumps(commands)], env, python=["-c", _COMMANDS])
    assert code == 0, out[-3000:]
    # [output, exit code, built, output, exit code, built, ..., what the interpreter printed last]
    parts = re.split(r"\r?\nCOMMAND-ENDED (\S+) ?(MODEL-BUILT)?\r?\n", out)
    assert len(parts) == 3 * len(commands) + 1, out[-3000:]
    return [
        (int(parts[i + 1]), parts[i] + ("\nMODEL-BUILT" if parts[i + 2] else ""))
        for i in range(0, 3 * len(commands), 3)
    ]


def test_check_and_report_in_a_terminal_neither_prompt_nor_connect(
    written: dict[str, Path], tmp_path: Path
) -> None:
    nested = edited(written["llava"], tmp_path / "nested", _vision_auto_map)
    (nested / "modeling_evil.py").write_text(EVIL_CODE)
    backbone = edited(
        written["upernet"],
        tmp_path / "backbone",
        lambda c: c.update(backbone="org/repo", backbone_config=None),
    )
    user_hf = _user_hf_cache(tmp_path / "user-hf")
    before = files_under(user_hf)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(_sitecustomize(tmp_path / "site")), str(ROOT)]),
        "HF_HOME": str(user_hf),
        "COLUMNS": "200",
    }
    env.pop("HF_HUB_OFFLINE", None)
    # Two commands that each build a model, run in one interpreter in a terminal (most of a
    # run is importing torch and transformers, 6-7 s of CPU): report the nested code, check
    # the backbone. Then check the nested code with `python -m inspector` in a terminal of
    # its own: the verdict report kept answers it, as it answers a user's second command,
    # and no model is built again (transformers is not even imported).
    built = [
        (["report", str(nested), "--markdown"], "will it load"),
        (["check", str(backbone)], "needs files from the Hugging Face Hub"),
    ]
    results = commands_in_terminal([args for args, _ in built], env)
    again = (["check", str(nested)], "vision_config.auto_map")
    runs = [*built, again]
    results.append(run_in_terminal(again[0], env))
    for (args, expect), (code, out) in zip(runs, results, strict=True):
        assert code in (0, 1), (args, out[-3000:])
        assert PROMPT not in out and "SOCKET-USED" not in out and "Traceback" not in out
        assert expect in " ".join(out.split()), out[-3000:]
        assert ("MODEL-BUILT" in out) == (args != again[0]), (args, out[-3000:])
    assert files_under(user_hf) == before


# -- 3. configs past what the load check builds ----------------------------------------------------


def test_a_config_nested_past_the_budget_is_skipped_with_the_reason(
    written: dict[str, Path], tmp_path: Path, guard: Guard
) -> None:
    def deep(config: dict) -> None:
        node = config["text_config"]
        for _ in range(MAX_CONFIG_DEPTH + 5):
            node["extra"] = {}
            node = node["extra"]

    folder = edited(written["llama"], tmp_path / "ckpt", lambda c: c.update(text_config={}))
    folder = edited(folder, tmp_path / "deep", deep)
    reason = skipped_quietly(folder, load_verdict(scan(folder)))
    assert f"nests more than {MAX_CONFIG_DEPTH} levels deep" in reason
    assert "text_config.extra.extra" in reason
    guard.assert_clean()


def test_a_config_holding_millions_of_values_is_skipped(
    written: dict[str, Path], tmp_path: Path, guard: Guard
) -> None:
    folder = edited(written["llama"], tmp_path / "ckpt", lambda c: c.update(big=[0] * 2_100_000))
    reason = skipped_quietly(folder, load_verdict(scan(folder)))
    assert "holds more than 2,000,000 values" in reason
    guard.assert_clean()


# -- 4. the checkpoint's own code, with --trust-remote-code ----------------------------------------

_TINY_CODE = """
from transformers import LlamaConfig, LlamaForCausalLM

from .tiny_extra import MARK


class TinyConfig(LlamaConfig):
    model_type = "tiny_custom"


class TinyForCausalLM(LlamaForCausalLM):
    config_class = TinyConfig
    mark = MARK
"""


def test_folder_code_runs_from_the_folder_compiled_from_source_writing_nothing(
    written: dict[str, Path], tmp_path: Path, guard: Guard
) -> None:
    """The folder's `.py` files are compiled from source: a `__pycache__` shipped beside them
    (whose bytecode is other code, stamped to match the source's size and time) is never
    loaded; nothing is written into the folder or any cache."""
    folder = edited(
        written["llama"],
        tmp_path / "ckpt",
        lambda c: c.update(
            architectures=["TinyForCausalLM"],
            model_type="tiny_custom",
            auto_map={"AutoConfig": "modeling_tiny.TinyConfig",
                      "AutoModelForCausalLM": "modeling_tiny.TinyForCausalLM"},
        ),
    )  # fmt: skip
    extra = folder / "tiny_extra.py"
    extra.write_text("MARK = 'evil'\nimport builtins\nbuiltins._ckpt_inspect_evil_imported = 1\n")
    import py_compile

    py_compile.compile(str(extra), doraise=True)  # bytecode of other code, in the folder
    stamp = extra.stat()
    source = "MARK = 'source'\n"
    extra.write_text(source + " " * (stamp.st_size - len(source) - 1) + "\n")
    os.utime(extra, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    (folder / "modeling_tiny.py").write_text(_TINY_CODE)
    before = files_under(folder)

    verdict = load_verdict(scan(folder), trust_remote_code=True)
    assert verdict.loads and verdict.architecture == "TinyForCausalLM"
    # This folder's module only: another test may have imported a `modeling_tiny` of its own.
    imported = [
        m
        for n, m in list(sys.modules.items())
        if n.endswith(".modeling_tiny")
        and Path(getattr(m, "__file__", None) or "/").parent == folder
    ]
    assert imported and all(m.TinyForCausalLM.mark == "source" for m in imported)
    assert files_under(folder) == before
    guard.assert_clean()


# -- 5. the seal itself ---------------------------------------------------------------------------


def test_the_seal_refuses_in_its_thread_only(tmp_path: Path) -> None:
    global _refusals
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    address = server.getsockname()
    outside = tmp_path / "outside.txt"
    other: dict[str, object] = {}

    def other_thread() -> None:
        (tmp_path / "other.txt").write_text("written by another thread")
        with socket.create_connection(address, timeout=5):
            other["connected"] = True

    _refusals = refused = []
    try:
        with sealed() as seal:
            for act in (
                lambda: outside.write_text("x"),
                lambda: (tmp_path / "new").mkdir(),
                lambda: socket.create_connection(address, timeout=5),
                lambda: socket.getaddrinfo("huggingface.co", 443),
                lambda: subprocess.run(["true"], check=False),
                lambda: input("Do you wish to run the custom code? [y/N] "),
                lambda: sys.stdin.readline(),
            ):
                with pytest.raises(Refused):
                    act()
            Path(seal.folder, "inside.txt").write_text("ours")
            thread = threading.Thread(target=other_thread)
            thread.start()
            thread.join(10)
            private = seal.folder
    finally:
        _refusals = None
        server.close()
    assert other == {"connected": True} and (tmp_path / "other.txt").is_file()
    assert not outside.exists() and not (tmp_path / "new").exists()
    kinds = ["writing", "changing", "the network", "the network", "starting a process",
             "an answer from the terminal", "an answer from the terminal"]  # fmt: skip
    assert len(refused) == len(kinds)
    assert all(r.startswith(k) for r, k in zip(refused, kinds, strict=True)), refused
    assert seal.refused == refused[: len(seal.refused)]
    assert not os.path.exists(private)
    outside.write_text("after the seal")  # and everything is allowed again


def test_an_installed_library_may_set_itself_up_while_imported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torch creates its compile cache folder when `torch._dynamo` is first imported: an
    import's own set-up is not refused (a half-imported library would break the process);
    the same act from a call after the import is."""
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "setup_at_import.py").write_text(
        "import os, sys\n"
        f"os.makedirs({str(tmp_path / 'cache-at-import')!r}, exist_ok=True)\n"
        f"def later():\n    os.makedirs({str(tmp_path / 'cache-later')!r})\n"
    )
    monkeypatch.syspath_prepend(str(lib))
    with sealed():
        import setup_at_import  # type: ignore[import-not-found]

        with pytest.raises(Refused):
            setup_at_import.later()
    assert (tmp_path / "cache-at-import").is_dir() and not (tmp_path / "cache-later").exists()


def test_bytecode_under_the_pycache_prefix_is_written_and_nothing_else_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With PYTHONPYCACHEPREFIX, importlib writes a module's bytecode into a tree mirroring
    its source folders (the folders one by one, a temp file, a rename), not `__pycache__`:
    a module first imported while a model is built (a transformers model's code) gets its
    bytecode, unrefused; any other write into that tree stays refused."""
    prefix, lib = tmp_path / "prefix", tmp_path / "lib"
    lib.mkdir()
    (lib / "first_built.py").write_text("VALUE = 3\n")
    monkeypatch.setattr(sys, "pycache_prefix", str(prefix))
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    monkeypatch.syspath_prepend(str(lib))
    mirror, tag = Path(f"{prefix}{lib}"), sys.implementation.cache_tag
    with sealed() as seal:
        import first_built  # type: ignore[import-not-found]

        assert first_built.VALUE == 3 and seal.refused == []
        for act in (
            lambda: (mirror / "notes.txt").write_text("x"),
            lambda: (mirror / f"other.{tag}.pyc").write_bytes(b"x"),  # no other.py
            lambda: Path(f"{prefix}{tmp_path}/no-such-source").mkdir(),
            lambda: os.symlink("/etc/passwd", mirror / "first_built.x.pyc"),
            lambda: os.chmod(mirror, 0o777),
        ):
            with pytest.raises(Refused):
                act()
    assert [p.name for p in mirror.iterdir()] == [f"first_built.{tag}.pyc"]


def test_bytecode_in_pycache_is_written_by_importlib_and_nothing_else_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In `__pycache__`, importlib makes the folder, a temp file it creates anew, and a
    rename onto the `.pyc` of an existing `.py`: a module first imported while a model is
    built gets its bytecode. Nothing else there: before, any act on a name `__pycache__` and
    any write to a name holding `.pyc` in one passed (a link named `__pycache__` sending a
    project's later imports to other bytecode, a `chmod 777` of a cache, a direct rewrite of
    a `.pyc`, a `.pyc.sh`), and a change of `sys.pycache_prefix` moved what was allowed."""
    lib = tmp_path / "lib"
    (lib / "sub").mkdir(parents=True)
    (lib / "cached_first.py").write_text("VALUE = 3\n")
    (lib / "sub" / "other.py").write_text("VALUE = 4\n")
    monkeypatch.setattr(sys, "pycache_prefix", None)
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    monkeypatch.syspath_prepend(str(lib))
    cache, tag = lib / "__pycache__", sys.implementation.cache_tag
    with sealed() as seal:
        import cached_first  # type: ignore[import-not-found]

        assert cached_first.VALUE == 3 and seal.refused == []
        written = (cache / f"cached_first.{tag}.pyc").read_bytes()
        for act in (
            lambda: (cache / f"cached_first.{tag}.pyc").write_bytes(b"other code"),
            lambda: os.symlink(tmp_path, lib / "sub" / "__pycache__"),
            lambda: os.chmod(cache, 0o777),
            lambda: (cache / "run.pyc.sh").write_text("x"),
            lambda: shutil.rmtree(cache),
            lambda: os.remove(cache / f"cached_first.{tag}.pyc"),
            lambda: os.mkdir(tmp_path / "no-such-source" / "__pycache__"),
            lambda: (
                setattr(sys, "pycache_prefix", str(tmp_path / "p"))
                or os.mkdir(tmp_path / "p" / str(lib).lstrip(os.sep).split(os.sep)[0])
            ),
        ):
            with pytest.raises(Refused):
                act()
    assert [p.name for p in cache.iterdir()] == [f"cached_first.{tag}.pyc"]
    assert (cache / f"cached_first.{tag}.pyc").read_bytes() == written
    assert not os.path.lexists(lib / "sub" / "__pycache__") and not (tmp_path / "p").exists()


def test_a_path_relative_to_a_folder_descriptor_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A relative path is resolved against a folder descriptor (`dir_fd`) the audit event of
    `os.open` does not carry: the seal resolved it against the working folder, so code in
    the building thread that moved there into the private folder (os.chdir is no write)
    created, removed and made folders anywhere through a descriptor of that folder."""
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("keep")
    fd = os.open(victim, os.O_RDONLY)
    try:
        with sealed() as seal:
            monkeypatch.chdir(seal.folder)
            for act in (
                lambda: os.close(os.open("planted.txt", os.O_WRONLY | os.O_CREAT, dir_fd=fd)),
                lambda: os.remove("keep.txt", dir_fd=fd),
                lambda: os.mkdir("__pycache__", dir_fd=fd),
                lambda: os.rename("keep.txt", "moved.txt", src_dir_fd=fd, dst_dir_fd=fd),
            ):
                with pytest.raises(Refused):
                    act()
            monkeypatch.chdir(tmp_path)
    finally:
        os.close(fd)
    assert sorted(p.name for p in victim.iterdir()) == ["keep.txt"]


def test_a_sqlite_database_outside_the_private_folder_is_refused(tmp_path: Path) -> None:
    """SQLite creates its file itself, not through Python's `open`: `sqlite3.connect` of a
    path anywhere created it from the building thread. In memory, or in the private folder,
    it is let through."""
    import sqlite3

    with sealed() as seal:
        with pytest.raises(Refused):
            sqlite3.connect(tmp_path / "planted.db")
        sqlite3.connect(":memory:").execute("create table t (a)")
        sqlite3.connect(os.path.join(seal.folder, "ours.db")).execute("create table t (a)")
    assert list(tmp_path.iterdir()) == []
