"""Execute every notebook in notebooks/ top to bottom with nbclient; any error fails.

The notebooks are for people: they print and display what matters and assert nothing. This
test checks from the outside that their outputs still tell each story (the finding codes,
the repaired index, the numbers). They read the demo checkpoints from CKPT_DEMO_DIR (written
once per session here) and write their copies under CKPT_WORK_DIR.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from inspector._internal.load.cache import CACHE_ENV

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
ALL = sorted(NOTEBOOKS.glob("*.ipynb"))
KERNEL = "python3"


@pytest.fixture(scope="session")
def demo_dir(tmp_path_factory: pytest.TempPathFactory, copy_demos) -> Path:
    target = tmp_path_factory.mktemp("demo")
    copy_demos(target)
    return target


@pytest.fixture(scope="session")
def kernel_env(
    demo_dir: Path, tmp_path_factory: pytest.TempPathFactory, copy_demo_verdicts
) -> dict[str, str]:
    """The environment of the notebook kernels; the python3 kernelspec must be this venv's.
    Their verdict cache holds the demos' verdicts (`demo_verdicts`): the notebooks are
    about their stories, not about computing a verdict, and each kernel that checks a demo
    would otherwise import torch and transformers to build its model."""
    from jupyter_client.kernelspec import KernelSpecManager

    spec = KernelSpecManager().get_kernel_spec(KERNEL)
    python = Path(spec.argv[0])
    # jupyter_client runs a bare "python" with sys.executable; an absolute path to another
    # interpreter would run the notebooks without this project installed.
    if python.is_absolute() and python.resolve() != Path(sys.executable).resolve():
        pytest.fail(
            f"kernelspec {KERNEL!r} runs {python}, not {sys.executable}; install this venv's: "
            f"{sys.executable} -m ipykernel install --sys-prefix"
        )
    work = tmp_path_factory.mktemp("notebook-work")
    cache = copy_demo_verdicts(tmp_path_factory.mktemp("notebook-verdicts") / "cache")
    _keep_consolidated_verdict(demo_dir, tmp_path_factory.mktemp("consolidated"), cache)
    return {"CKPT_DEMO_DIR": str(demo_dir), "CKPT_WORK_DIR": str(work), CACHE_ENV: str(cache)}


def _keep_consolidated_verdict(demo_dir: Path, work: Path, cache: Path) -> None:
    """Keep in `cache` the verdict of what notebook 04 writes (the collapsed DCP demo
    consolidated with its reference assignment), so that its kernel imports no torch and
    no transformers either. Should the notebook write something else, its kernel computes
    that verdict itself: slower, never wrong (the key is the checkpoint's content)."""
    import shutil

    from inspector import plan_consolidation, scan
    from inspector._internal.load.verdict import load_verdict

    source = Path(shutil.copytree(demo_dir / "automodel-2289-dcp-mapping-collapsed", work / "src"))
    plan_consolidation(scan(source), work / "consolidated").execute()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(CACHE_ENV, str(cache))
        load_verdict(scan(work / "consolidated"))


# What each notebook's outputs must show (text of its printed and displayed results).
EXPECTED: dict[str, list[str]] = {
    "01-explore-a-checkpoint": [
        "tensors; columns: name, file, dtype, shape",
        "missing experts: 0 of ",
        "findings: 0\n",
        "tensor browser: 3 tensors match name ~ *.experts.3.*, dtype F8_E4M3, layer 2",
    ],
    "02-repair-an-index-that-forgot-mtp": [
        "unindexed-tensor",
        "issues: index-misses-tensors, sidecars-disagree\n",
        "wrote: model.safetensors.index.json",
        "findings left after the repair: 0\n",
        "MTP tensors, e.g. mtp.",
    ],
    "03-find-lost-experts": [
        "config-unreadable",
        "expert-missing",
        "layer 1: experts 64-511 missing (448 of 512)",
        "model.layers.1.mlp.experts.3.",
    ],
    "04-rerun-a-collapsed-consolidation": [
        "[mapping-collapsed]",
        "in 1 file\n",
        "in 4 files\n",
        "verify: re-scanned and checked the output: no finding",
        "tensor hashes vs the source: all match",
        "hf-sharded: 4 files, 0 findings\n",
        "the Consolidate button will write 4 files",
    ],
    "05-torch-dist-common-state-drift": [
        "rerun_state_machine_state/shard_0_1",
        "drift: torch-dist-common-drift; healthy: 0 findings\n",
        "Missing key in checkpoint state_dict",
    ],
}


def _html(output) -> str:
    return "".join(output.get("data", {}).get("text/html", ""))


def _plain(output) -> str:
    return "".join(output.get("data", {}).get("text/plain", ""))


def _text(outputs: list) -> str:
    """Everything a reader sees as text: streams, plain and HTML results. A stream's pieces
    are joined as the page shows them: the kernel sends what a cell prints in pieces cut by
    time (its flush every 0.2 s may fall between the words of one `print`), and nbclient
    keeps each piece as an output of its own."""
    parts: list[str] = []
    stream = None  # the name of the stream the last part is a piece of
    for o in outputs:
        if o.output_type == "stream":
            if o.name == stream:
                parts[-1] += o.text
            else:
                parts.append(o.text)
            stream = o.name
        elif "data" in o:
            parts += [str(o.data.get(k, "")) for k in ("text/plain", "text/html")]
            stream = None
    return "\n".join(parts)


def test_every_notebook_is_stored_without_outputs():
    assert [p.name for p in ALL] == [
        "01-explore-a-checkpoint.ipynb",
        "02-repair-an-index-that-forgot-mtp.ipynb",
        "03-find-lost-experts.ipynb",
        "04-rerun-a-collapsed-consolidation.ipynb",
        "05-torch-dist-common-state-drift.ipynb",
    ]
    assert sorted(EXPECTED) == [p.stem for p in ALL]
    for path in ALL:
        book = json.loads(path.read_text())
        for cell in book["cells"]:
            if cell["cell_type"] == "code":
                assert cell["outputs"] == [] and cell["execution_count"] is None, path.name
                # Notebooks are for people: they show results, tests check them from outside.
                assert "assert " not in "".join(cell["source"]), path.name


# The one exported to HTML and opened in Chromium.
EXPORTED = "01-explore-a-checkpoint"
# Notebooks executed at once. A notebook spends much of its time waiting: for its kernel to
# start, for the load verdict's child, for a consolidation's processes. Measured on 2 cores
# (test_notebooks.py alone): one at a time 88 s; three at a time, see the closing note of
# issue 35. More than three only share the same two cores between more kernels.
AT_ONCE = 3


async def _execute(
    path: Path, kernel_env: dict[str, str], slots: asyncio.Semaphore
) -> nbformat.NotebookNode:
    """`path` executed headless by nbclient (what nbconvert --execute and papermill run),
    its kernel with the environment `kernel_env` adds."""
    book = nbformat.read(path, as_version=4)
    client = NotebookClient(
        book,
        kernel_name=KERNEL,
        timeout=120,
        resources={"metadata": {"path": str(NOTEBOOKS)}},
    )
    async with slots:
        # Raises CellExecutionError, naming the cell, on the first error.
        await client.async_execute(env={**os.environ, **kernel_env})
    return book


async def _execute_all(
    paths: list[Path], kernel_env: dict[str, str]
) -> dict[str, nbformat.NotebookNode | BaseException]:
    slots = asyncio.Semaphore(AT_ONCE)
    done = await asyncio.gather(
        *(_execute(p, kernel_env, slots) for p in paths), return_exceptions=True
    )
    return {p.stem: book for p, book in zip(paths, done, strict=True)}


@pytest.fixture(scope="session")
def executed(
    request: pytest.FixtureRequest, kernel_env: dict[str, str]
) -> dict[str, nbformat.NotebookNode | BaseException]:
    """The notebooks this run's tests look at (`test_notebook_runs_top_to_bottom`'s selected
    ones, and EXPORTED for the HTML test), executed `AT_ONCE` at a time, by stem; a notebook
    that failed maps to its error, raised by the test of that notebook alone."""
    wanted = {EXPORTED}
    for item in request.session.items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        if item.path == Path(__file__) and "path" in params:
            wanted.add(params["path"].stem)
    # In a thread of its own: once a browser test of this process has started the session's
    # Chromium, its sync Playwright keeps an event loop running in this thread, where
    # asyncio.run is refused (seen when a browser file ran first in the worker).
    books = [p for p in ALL if p.stem in wanted]
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, _execute_all(books, kernel_env)).result()


def _book(executed: dict, stem: str) -> nbformat.NotebookNode:
    book = executed[stem]
    if isinstance(book, BaseException):
        raise book
    return book


@pytest.mark.parametrize("path", ALL, ids=[p.stem for p in ALL])
def test_notebook_runs_top_to_bottom(path: Path, executed: dict, kernel_env: dict[str, str]):
    book = _book(executed, path.stem)
    outputs = [o for cell in book.cells if cell.cell_type == "code" for o in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    text = _text(outputs)
    missing = [want for want in EXPECTED[path.stem] if want not in text]
    assert missing == [], f"{path.name}: outputs lack {missing}"
    # The dashboard cell produced a widget view, not a text repr.
    if "Dashboard" in "".join(cell.source for cell in book.cells):
        views = [
            o for o in outputs if "application/vnd.jupyter.widget-view+json" in o.get("data", {})
        ]
        assert views, f"{path.name}: no widget was displayed"
        # Executed headless (nbclient, as nbconvert and papermill do), the dashboard saved its
        # finished snapshot: the load verdict and the PNG figures, not "checking..." or
        # "rendering..." placeholders that nothing would fill in after the last cell.
        snapshots = [html for o in outputs if "ckpt-snapshot" in (html := _html(o))]
        assert snapshots, f"{path.name}: no snapshot was saved"
        for html in snapshots:
            assert "checking..." not in html and "rendering..." not in html, path.name
        placeholders = [t for o in outputs if "rendering...)" in (t := _plain(o))]
        assert placeholders == [] and any("image/png" in o.get("data", {}) for o in outputs)
    # The working copies are where the env var says (the demo folder itself stays untouched).
    assert not (Path(kernel_env["CKPT_DEMO_DIR"]) / ".ckpt-inspect-backup").exists()


@pytest.mark.browser
def test_an_executed_notebook_saved_as_html_shows_its_snapshot(
    executed: dict, chromium, tmp_path: Path
):
    """What a person shares after `jupyter nbconvert --execute` and `--to html`: opened
    without the widget manager or the network, the page shows the dashboard's finished
    snapshot and its PNG figures. The notebook is the one executed for the test above (run
    alone, this test executes it)."""
    from browser import ARTIFACTS
    from nbconvert import HTMLExporter

    book = _book(executed, EXPORTED)
    outputs = [o for cell in book.cells if cell.cell_type == "code" for o in cell.outputs]
    pngs = sum("image/png" in o.get("data", {}) for o in outputs)
    page_file = tmp_path / f"{EXPORTED}.html"
    page_file.write_text(HTMLExporter().from_notebook_node(book)[0], encoding="utf-8")
    page = chromium.new_page(viewport={"width": 1300, "height": 1000})
    try:
        local = "file://"
        page.route(
            "**/*",
            lambda route: (
                route.continue_() if route.request.url.startswith(local) else route.abort()
            ),
        )
        page.goto(page_file.as_uri(), wait_until="load")
        snapshot = page.locator(".ckpt-snapshot").first
        snapshot.wait_for(state="visible", timeout=30_000)
        text = " ".join(snapshot.inner_text().split())
        shown = page.evaluate(
            "() => [...document.querySelectorAll('.jp-RenderedImage img, .output_png img')]"
            ".filter(img => img.complete && img.naturalWidth > 0 && img.offsetParent)"
            ".length"
        )
        page.screenshot(path=str(ARTIFACTS / "headless-snapshot-html.png"), full_page=True)
    finally:
        page.close()
    assert "Will it load?" in text and "checking" not in text and "rendering" not in text, text
    assert pngs >= 3 and shown == pngs
