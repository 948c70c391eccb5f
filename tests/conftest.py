"""Shared pytest fixtures. Checkpoints are written with the real writers."""

from __future__ import annotations

import compileall
import contextlib
import gc
import itertools
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import pytest
from hypothesis import settings
from once import once_per_run, shared_dir

from inspector._internal.load.cache import CACHE_ENV
from inspector._internal.plans.consolidate.engine import SourceFiles

if TYPE_CHECKING:
    from browser import Lab
    from remote_servers import FakeHub, RangeHTTPServer, S3Store

ROOT = Path(__file__).resolve().parents[1]

# No test reads or writes the user's verdict cache (inspector/_internal/load/cache.py): the
# whole session, and every process it starts, uses a private one, and each test a folder of
# its own inside it (`verdict_cache_dir`), so that no verdict kept by one test answers
# another. The exceptions are asked for by name: `demo_verdicts`, the demos' verdicts
# computed once per run for the tests that show them without being about them, and the
# kernels of the session's `jupyter_lab`, which share one folder.
_VERDICT_CACHES = Path(tempfile.mkdtemp(prefix="ckpt-inspect-verdicts-"))
os.environ[CACHE_ENV] = str(_VERDICT_CACHES / "session")
_TEST_NUMBER = itertools.count()


# No property test is timed (a wall-clock limit measures the machine's load, not the code):
# hypothesis' default deadline of 200 ms per example failed test_tables'
# `test_name_column_is_what_pandas_infers` at 306 ms in a whole local run at load 15 (its
# `ci` profile, loaded under CI=true, has none already). Everything else, example counts
# included, stays as the profile in force (`ci` or default) and each test's own settings say.
settings.register_profile("untimed", parent=settings(), deadline=None)
settings.load_profile("untimed")

# nbformat (read by the notebook tests and by nbclient) imports jsonschema, whose format
# checkers build rfc3987-syntax's lark grammar on import: about 2 s of CPU in every test
# process, for an IRI format no notebook schema uses. Without the module, jsonschema simply
# leaves that format unchecked.
sys.modules.setdefault("rfc3987_syntax", None)  # type: ignore[arg-type]

# The test files that take longest, longest first: pytest-xdist hands them out first, so that
# no long file starts when the others are done. Files not named here follow in collection
# order. Only the speed of the run depends on this list. Measured: seconds per file (setup,
# call and teardown, the first file on a worker paying the session fixtures it uses) of a
# whole `pytest -n 2 --dist loadfile` run on main, 29 Nov 2026: the two workers ran 269 s of
# tests each.
HEAVIEST_FIRST = (
    # One unit of work (ONE_LAB below): 135 s on one worker, lab and Chromium included,
    # in a whole `-n 2` run, 29 Nov 10:25-10:30 at load 0.5-3 (the seconds below: the same run).
    "test_lab_clicks.py",  # 76.0
    "test_lab_browser.py",  # 30.6
    "test_lab_tabs.py",  # 28.3
    "test_dashboard.py",  # 40.8
    "test_remote.py",  # 39.5
    "test_notebooks.py",  # 28.3
    "test_codes_coverage.py",  # 21.4
    "test_values.py",  # 21.4
    "test_hostile_load_check.py",  # 20.0
    "test_architecture.py",  # 16.9
    "test_fuzz_corpus.py",  # 14.5
    "test_model_load.py",  # 11.4
    "test_bounded_work.py",  # 10.6
    "test_report_html.py",  # 9.2
    # Runs the torchrun job (`torchrun_job`), which test_consolidate_torchrun.py only reads:
    # that file is left to the end, where the job is long done and nothing waits for it.
    "test_verify_torchrun.py",  # 9.1
    "test_pickle_isolation.py",  # 8.9
    "test_verify.py",  # 8.7
    "test_report_browser.py",  # 8.4
    "test_verdict_cache.py",  # 7.8
    "test_hostile_names.py",  # 7.8
    "test_load_child.py",  # 7.5
    "test_remote_hostile.py",  # 7.1
    "test_words.py",  # 6.6
    "test_widgets_in_kernel.py",  # 4.8
    "test_start.py",  # 4.6
    "test_repair_properties.py",  # 4.6
    "test_cli_errors.py",  # 4.6
    "test_fit.py",  # 4.5
    "test_check_cli.py",  # 4.4
    "test_sandbox.py",  # 4.3
    "test_header_fuzz.py",  # 4.2
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Heaviest files first (HEAVIEST_FIRST), each file's tests in their own order."""
    rank = {name: i for i, name in enumerate(HEAVIEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


# The files whose tests use the session's JupyterLab: `--dist loadfile` sends them to one
# worker as one unit, so that a run starts one JupyterLab (5-10 s of CPU, and its kernels'
# imports), not one per worker that drew such a file. Every other file stays a unit of its own.
ONE_LAB = ("test_lab_clicks.py", "test_lab_browser.py", "test_lab_tabs.py")


# Optional: a run without pytest-xdist (`-p no:xdist`) has no such hook.
@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under `--dist loadfile`, the scheduler that hands out the ONE_LAB files together (see
    above); None, and pytest-xdist's own, for any other mode."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class OneLabScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            file = super()._split_scope(nodeid)
            return "ONE_LAB" if Path(file).name in ONE_LAB else file

    return OneLabScheduling(config, log)


# Packages that collecting the tests imports (the test modules import them at their top):
# where one of them has no bytecode yet, the libraries are not compiled (a fresh virtual
# environment: neither pip's torch, installed with --no-compile, nor uv compiles).
_COLLECTION_IMPORTS = ("torch", "transformers", "pandas", "moto", "s3fs")


# What the workers waiting for the first one's collection compile meanwhile, a share each:
# libraries it imports too, apart from torch, which it starts with (sympy and mpmath come
# with torch, late in its import). `-X importtime` of a cold collection (29 Nov 2026): torch
# 4.3 s, sympy 1.9, pandas 1.3, aiohttp 0.45, botocore 0.2, in 18.4 s of collecting that one
# worker did while the two others waited. An empty selection on a fresh virtual environment,
# `-n 3`, side by side at load 0.6-1.4: 27.2-29.7 s -> 23.9-24.7 s, the same CPU.
_COMPILE_SHARES = (
    ("sympy", "mpmath", "IPython", "ipywidgets", "jupyter_client"),
    ("pandas", "aiohttp", "botocore", "moto.server", "huggingface_hub", "gguf"),
)


def _compile_a_share(root: Path) -> None:
    """Import the first share of `_COMPILE_SHARES` no other worker took, in a child process:
    its bytecode is what is wanted (the worker's own imports, and their order, stay the
    collection's). A child that fails only leaves the compiling to the collection."""
    import subprocess

    for i, share in enumerate(_COMPILE_SHARES):
        try:
            (root / f"compiling-{i}").touch(exist_ok=False)  # taken by the first to create it
        except FileExistsError:
            continue
        with contextlib.suppress(subprocess.TimeoutExpired):
            subprocess.run(
                [sys.executable, "-c", "import " + ", ".join(share)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                timeout=300,
                check=False,
            )
        return


def _compiled(package: str) -> bool:
    import importlib.util

    spec = importlib.util.find_spec(package)  # does not import it
    return spec is None or spec.cached is None or os.path.exists(spec.cached)


@pytest.hookimpl(wrapper=True)
def pytest_collection(session: pytest.Session) -> Iterator[None]:
    """Under pytest-xdist, in a fresh virtual environment, one worker collects first and the
    others after it. Every worker imports every test module and the libraries they import;
    started together, each compiled the same modules from source (no bytecode is there until
    a process writes it): measured on 29 Nov 2026, collecting alone took 23 CPU-s cold and
    6.4 warm, three at once 56 CPU-s. The first to take the lock collects; the others wait
    for it, then collect together from its bytecode, each compiling a share of the libraries
    meanwhile (`_COMPILE_SHARES`). Where the bytecode is there already, nothing waits."""
    worker_temp = session.config.option.basetemp
    if not os.environ.get("PYTEST_XDIST_WORKER") or not worker_temp:
        return (yield)
    if all(_compiled(p) for p in _COLLECTION_IMPORTS):
        return (yield)
    from filelock import FileLock, Timeout

    root = Path(worker_temp).parent  # the run's shared folder (once.shared_dir)
    done = root / "collected.done"
    lock = FileLock(str(root / "collected.lock"))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        _compile_a_share(root)
        lock.acquire()
    if done.exists():
        lock.release()
    try:
        return (yield)
    finally:
        if lock.is_locked:
            done.touch()
            lock.release()


def pytest_configure(config: pytest.Config) -> None:
    # pytest-xdist's `--dist loadfile` would reorder files by how many tests each holds: keep
    # the order above instead.
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_sessionstart(session: pytest.Session) -> None:
    """Compile the project's modules to bytecode once, before any test. The suite starts
    hundreds of Python processes (the CLI, notebook kernels, the import probe's children);
    where PYTHONDONTWRITEBYTECODE is set, as in many CI images, each of them would compile
    the whole package from source again: about half a second of CPU per process."""
    for folder in ("inspector", "widgets"):
        compileall.compile_dir(ROOT / folder, quiet=1)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Move every object alive once the test modules are imported (the libraries and the
    core, alive until the process ends) out of the cyclic garbage collector's sight
    (`gc.freeze`): each full collection walked them all again, pytest's own at the end of
    the session included. Measured on 29 Nov 2026, full collections' CPU alone:
    `test_values` 0.93 -> 0.58 s, `test_dashboard` 2.28 -> 2.01 s; the three workers of a
    whole `-n 3` run, whose heaps grow to a million objects, 30.7 -> 18.5 s. What the tests
    make after this point is collected as before."""
    gc.collect()
    gc.freeze()


def pytest_unconfigure(config: pytest.Config) -> None:
    shutil.rmtree(_VERDICT_CACHES, ignore_errors=True)


@pytest.fixture(autouse=True)
def verdict_cache_dir() -> Iterator[Path]:
    """This test's own verdict cache folder (made only when a verdict is kept). Set apart
    from the test's `monkeypatch`, which a test may undo midway."""
    folder = _VERDICT_CACHES / f"test-{next(_TEST_NUMBER)}"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(CACHE_ENV, str(folder))
        yield folder


@pytest.fixture
def write_state_dict(tmp_path: Path) -> Callable[..., Path]:
    """Factory: write `{name: torch.Tensor}` with huggingface_hub's sharded writer
    (`save_torch_state_dict`: shards plus `model.safetensors.index.json` when there is more
    than one shard) into a folder under `tmp_path`; returns the folder. `max_shard_size`
    is bytes (int) or a string such as "5GB" or "4KB"."""

    def write(state: dict, *, folder: str = "ckpt", max_shard_size: int | str = "5GB") -> Path:
        from huggingface_hub import save_torch_state_dict

        target = tmp_path / folder
        target.mkdir(parents=True, exist_ok=True)
        save_torch_state_dict(state, target, max_shard_size=max_shard_size)
        return target

    return write


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> Callable[..., SimpleNamespace]:
    """The CLI in this process (`main`), without the model: `cli("check", path, ...)` gives
    (returncode, stdout, stderr). Faster than a process (`commands.cli`) where a test does
    not need one; `check` is given `--no-model`."""
    from inspector._internal.cli.main import main

    def run(*argv: object) -> SimpleNamespace:
        args = [str(a) for a in argv]
        if args[0] == "check":
            args.append("--no-model")
        code = main(args)
        out = capsys.readouterr()
        return SimpleNamespace(returncode=code, stdout=out.out, stderr=out.err)

    return run


@pytest.fixture(scope="session")
def demo_checkpoints(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo checkpoints (`inspector.demo`), written once per test run and shared by every
    process of it: read them, never change them. A test that changes one works on a copy
    (`copy_demos`, a few milliseconds)."""
    from inspector._internal.demo import write_demos

    return once_per_run(
        tmp_path_factory, "demo-checkpoints", lambda folder: write_demos(folder, log=lambda _: None)
    )


@pytest.fixture(scope="session")
def dcp_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A training run's `epoch_0_step_10/model`, saved by 2 gloo processes with PyTorch DCP's
    HuggingFaceStorageWriter (tests/dcp_writers.py): the golden fixture `torch-dcp/test-model`
    (`make fixtures`), copied once per test run and shared by every process of it: read it,
    never change it; a test that damages it works on a copy."""
    golden = Path(__file__).parent / "fixtures" / "writers" / "torch-dcp" / "test-model"
    run = once_per_run(
        tmp_path_factory,
        "dcp-2rank",
        lambda folder: shutil.copytree(golden / "model", folder / "epoch_0_step_10" / "model"),
    )
    return run / "epoch_0_step_10" / "model"


@pytest.fixture(scope="session")
def torchrun_job(tmp_path_factory: pytest.TempPathFactory, dcp_checkpoint: Path) -> Path:
    """The folder of the run's one torchrun job (tests/torchrun_job.py: 2 ranks running the
    CLI commands of test_verify_torchrun and test_consolidate_torchrun in turn), run once per
    test run and shared by every process of it: read it, never change it. Skipped where
    torchrun is not installed beside python."""
    from torchrun_job import TORCHRUN, make_job

    if not TORCHRUN.exists():
        pytest.skip("torchrun is not installed beside python")
    return once_per_run(
        tmp_path_factory, "torchrun-job", lambda folder: make_job(folder, dcp_checkpoint)
    )


@pytest.fixture(scope="session")
def demo_verdicts(tmp_path_factory: pytest.TempPathFactory, demo_checkpoints: Path) -> Path:
    """A verdict cache root (for `CACHE_ENV`) holding the load verdict of every demo
    checkpoint, computed once per test run in the first process that asks and shared by
    every process of it: read it, never write it (`copy_demo_verdicts` gives a copy that
    may be written). For the tests that show a demo's verdict but are not about computing it
    (a notebook's kernel): each of them would import torch and transformers (4-6 s of CPU)
    to build a model that the test process builds in a fraction of a second, its imports
    being done already when another test file of the run needed them. Tests of the verdict,
    its child process or its cache keep their own empty folder (`verdict_cache_dir`)."""

    def make(folder: Path) -> None:
        from inspector._internal.demo import demo_names
        from inspector._internal.load.verdict import load_verdict
        from inspector._internal.scan.entry import scan

        with pytest.MonkeyPatch.context() as patch:
            patch.setenv(CACHE_ENV, str(folder))
            for name in demo_names():
                if (demo_checkpoints / name).is_dir():
                    load_verdict(scan(demo_checkpoints / name))  # kept in `folder`

    return once_per_run(tmp_path_factory, "demo-verdicts", make)


@pytest.fixture(scope="session")
def copy_demo_verdicts(demo_verdicts: Path) -> Callable[[Path], Path]:
    """Factory: a private copy of `demo_verdicts` at a folder (a few small files), which
    the processes given it as their `CACHE_ENV` may add to; returns the folder."""

    def copy(target: Path) -> Path:
        return Path(shutil.copytree(demo_verdicts, target))

    return copy


@pytest.fixture
def kept_demo_verdicts(verdict_cache_dir: Path, copy_demo_verdicts: Callable[[Path], Path]) -> Path:
    """This test's verdict cache (`verdict_cache_dir`) holding the demos' verdicts
    (`demo_verdicts`), for a test that shows the verdict of a demo or of a copy of one (the
    path is not part of the key) but is not about computing it: no model is built for it and
    no load check's child is started. A demo the test changed is checked afresh."""
    return copy_demo_verdicts(verdict_cache_dir)


@pytest.fixture(scope="session")
def copy_demos(demo_checkpoints: Path) -> Callable[[Path], list[Path]]:
    """Factory: a private copy of every demo checkpoint under a folder, as `write_demos` would
    leave it there (same folders, same bytes); returns the folders in writing order."""
    from inspector._internal.demo import demo_names

    def copy(target: Path) -> list[Path]:
        target.mkdir(parents=True, exist_ok=True)
        names = [n for n in demo_names() if (demo_checkpoints / n).is_dir()]
        return [Path(shutil.copytree(demo_checkpoints / n, target / n)) for n in names]

    return copy


@pytest.fixture
def cut_on_open(monkeypatch: pytest.MonkeyPatch) -> Callable[[Path], dict[str, int]]:
    """Factory: from now on, "another process" cuts the first source file a copy opens
    (consolidate, re-shard, `repair --from`), in folder `folder`, to half its size as soon as
    the copy has opened it. Returns {file: the size it was cut to}, filled when that happens."""

    def install(folder: Path) -> dict[str, int]:
        real = SourceFiles.reader
        cut: dict[str, int] = {}

        def cutting(self: SourceFiles, file: str):  # type: ignore[no-untyped-def]
            reader = real(self, file)
            if not cut:
                cut[file] = (folder / file).stat().st_size // 2
                os.truncate(folder / file, cut[file])
            return reader

        monkeypatch.setattr(SourceFiles, "reader", cutting)
        return cut

    return install


# -- servers on 127.0.0.1 (tests/remote_servers.py) ------------------------------------------
# One of each per test process, started by the first test that asks and shared by every
# later one, whichever file it is in: each test serves its own folder, bucket or repository.


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Credentials for moto's server (it accepts any), nothing from the user's set-up."""
    for key in list(os.environ):
        if key.startswith("AWS_"):
            monkeypatch.delenv(key)
    for key, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_CONFIG_FILE": os.devnull,
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
    }.items():
        monkeypatch.setenv(key, value)


@pytest.fixture
def quick_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    """Remote reads retried after 1 ms, not 200 (each retry doubling it): what is retried,
    and how often, is the same; tests of servers that fail wait less (five retries waited
    0.3 s at 10 ms, 0.03 s now)."""
    from inspector._internal.storage import options

    monkeypatch.setattr(options, "RETRY_WAIT", 0.001)


@pytest.fixture(scope="session")
def s3_store() -> Iterator[S3Store]:
    """moto's S3 API server (2-3 s to start); a test file makes buckets of its own in it
    (`S3Store.bucket`) and reads them through `s3_store.url`, with `aws_env`."""
    pytest.importorskip("moto")
    from remote_servers import S3Store, moto_s3

    with moto_s3() as url:
        yield S3Store(url)


@pytest.fixture(scope="session")
def range_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RangeHTTPServer]:
    """The Range HTTP server over every folder of this test run (`shared_dir`: the demo
    checkpoints and every test's `tmp_path`); `range_server.serving(folder)` gives the URL
    of one folder, with the server's counts from zero."""
    from remote_servers import RangeHTTPServer

    with RangeHTTPServer(shared_dir(tmp_path_factory)) as server:
        yield server


@pytest.fixture(scope="session")
def hub_server() -> Iterator[FakeHub]:
    """The Hub stand-in, serving each test's repositories in turn (`hub_server.serving`)."""
    from remote_servers import FakeHub

    with FakeHub({}) as hub:
        yield hub


@pytest.fixture(scope="session")
def vllm_cases(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    """For each case of tests/vllm_cases.py: what vLLM's real loader does and what our
    verdict says ({"engine": "loads" or its exception, "ours": `EngineVerdict.to_dict()`,
    "answer": the child's answer line, "folder"}). Skipped without vLLM (the `[vllm]` extra).
    Made once per test run (`once_per_run`): one process, one vLLM import (6-10 s of CPU),
    answers for the engine alone and, through the real pipe, for every verdict."""
    import importlib.util
    import json

    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vLLM is not installed (the [vllm] extra)")
    folder = once_per_run(tmp_path_factory, "vllm-cases", _vllm_cases)
    results: dict[str, dict] = json.loads((folder / "results.json").read_text())
    return results


def _vllm_cases(root: Path) -> None:
    import json

    from vllm_cases import write_cases, write_hostile

    from inspector._internal.load import engine
    from inspector._internal.scan.entry import scan

    folders = write_cases(root)
    hostile = write_hostile(root / "hostile", folders["healthy"])
    process = engine.ENGINE_PROCESS
    command, ask = process.command, process.ask
    answers: dict[str, dict] = {}

    def recorded(request: dict) -> dict:
        answers[f"{request['path']}@{request['tp']}"] = answer = ask(request)
        return answer

    process.command = [sys.executable, str(ROOT / "tests" / "vllm_cases.py")]
    process.ask = recorded  # type: ignore[method-assign]
    try:
        verdicts = {
            case: engine.engine_verdict(scan(f)) for case, f in {**folders, **hostile}.items()
        }
        # TP 2 predicted in the same process (the group's world size set while building).
        for case in ("healthy", "moe-healthy", "drop-k_proj"):
            verdicts[f"{case}@tp2"] = engine.engine_verdict(scan(folders[case]), tp=2)
        by_engine = ask({"alone": list(map(str, folders.values()))})
    finally:
        process.close()
        process.command = command
        del process.ask
    results = {
        case: {
            "engine": by_engine.get(case),
            "ours": verdicts[case].to_dict(),
            "answer": answers.get(f"{folder}@1"),
            "folder": str(folder),
        }
        for case, folder in {**folders, **hostile}.items()
    }
    for case, verdict in verdicts.items():
        if case.endswith("@tp2"):
            results[case] = {"engine": None, "ours": verdict.to_dict(), "answer": None}
    (root / "results.json").write_text(json.dumps(results))


# -- the browser tests' Chromium and JupyterLab (tests/browser.py) ---------------------------
# One of each per test process, started by the first test that asks (a test run that selects
# no browser test starts neither) and stopped at the end of the run. A browser test:
#
#     def test_x(lab_pages, jupyter_lab, tmp_path):
#         folder = jupyter_lab.folder("x")         # its own folder in the Lab's root
#         ... write notebooks (and checkpoints) into folder ...
#         page = open_notebook(lab_pages, jupyter_lab, "x/book.ipynb", errors)
#         try: ... finally: page.close(); jupyter_lab.shut_down_kernels()
#
# The lab pages share one context, `lab_pages`, for its HTTP cache (what else is shared, and
# what is not: `browser.new_lab_context`); other pages (`chromium.new_page`) are contexts of
# their own. Close a page when done, and shut down the kernels the test started, so that none
# stays in memory holding torch for the rest of the run.


@pytest.fixture(scope="session")
def chromium() -> Iterator[Any]:
    """Debian's Chromium (its headless shell where installed), through Playwright
    (`browser.launch_chromium`): a Playwright `Browser`. Missing tooling skips (fails in CI:
    `browser.sync_playwright_or_fail`)."""
    from browser import ARTIFACTS, launch_chromium, sync_playwright_or_fail

    sync_playwright = sync_playwright_or_fail()
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as pw:
        browser = launch_chromium(pw)
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture(scope="session")
def lab_pages(chromium: Any) -> Iterator[Any]:
    """The Playwright `BrowserContext` every lab page of the run opens in
    (`browser.new_lab_context`, `browser.open_notebook`)."""
    from browser import new_lab_context

    context = new_lab_context(chromium)
    try:
        yield context
    finally:
        context.close()


@pytest.fixture(scope="session")
def jupyter_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    """A JupyterLab on 127.0.0.1 (random port and token, `browser.running_lab`) whose root is
    an empty folder of this run. Each test works in a folder of its own under it
    (`Lab.folder`) and shuts down the kernels it started (`Lab.shut_down_kernels`). Its
    kernels see no CKPT_DEMO_DIR or CKPT_WORK_DIR: a notebook copied into
    `<folder>/notebooks/` finds the demo checkpoints at `<folder>/build/demo` and writes its
    copies under `<folder>/build/notebook-work`, as in a clone of the project. Its kernels
    share one verdict cache folder of their own (the server's environment is fixed when it
    starts, so a test's `verdict_cache_dir` cannot reach them): the lab tests are about the
    page, and a demo's verdict kept by one of them answers the next."""
    from browser import running_lab

    home = tmp_path_factory.mktemp("jupyterlab")
    root = home / "root"
    root.mkdir()
    verdicts = {CACHE_ENV: str(_VERDICT_CACHES / "jupyterlab")}
    unset = ("CKPT_DEMO_DIR", "CKPT_WORK_DIR")
    with running_lab(root, home / "state", env=verdicts, unset=unset) as lab:
        yield lab


@pytest.fixture
def dashboards_closed(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Any]]:
    """Every dashboard the test makes, closed after it (`Dashboard.close`): a worker that ran
    the dashboard tests without closing them held their widgets, panels and tables, its heap
    0.6-1.1 M objects (issue 35)."""
    from inspector.widgets.dashboard import Dashboard

    made: list[Any] = []
    init = Dashboard.__init__

    def recording(self: Dashboard, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        made.append(self)

    monkeypatch.setattr(Dashboard, "__init__", recording)
    yield made
    for dash in made:
        dash.close()
