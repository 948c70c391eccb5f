"""Execute every notebook in notebooks/ top to bottom with nbclient; any error fails.

The notebooks are for people: they print and display what matters and assert nothing. This
test checks from the outside that their outputs still tell each story (the finding codes,
the repaired index, the numbers). They read the demo checkpoints from CKPT_DEMO_DIR (written
once per session here) and write their copies under CKPT_WORK_DIR.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
ALL = sorted(NOTEBOOKS.glob("*.ipynb"))
KERNEL = "python3"


@pytest.fixture(scope="session")
def demo_dir(tmp_path_factory: pytest.TempPathFactory, copy_demos) -> Path:
    target = tmp_path_factory.mktemp("demo")
    copy_demos(target)
    return target


@pytest.fixture(scope="session")
def kernel_env(demo_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The environment of the notebook kernels; the python3 kernelspec must be this venv's."""
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
    return {"CKPT_DEMO_DIR": str(demo_dir), "CKPT_WORK_DIR": str(work)}


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
    """Everything a reader sees as text: streams, plain and HTML results."""
    parts = []
    for o in outputs:
        if o.output_type == "stream":
            parts.append(o.text)
        elif "data" in o:
            parts += [str(o.data.get(k, "")) for k in ("text/plain", "text/html")]
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


# Notebooks executed by `test_notebook_runs_top_to_bottom`, kept for the HTML export test.
_EXECUTED: dict[str, nbformat.NotebookNode] = {}
# The one exported to HTML and opened in Chromium.
EXPORTED = "01-explore-a-checkpoint"


def _execute(path: Path, kernel_env: dict[str, str], monkeypatch) -> nbformat.NotebookNode:
    """`path` executed headless by nbclient (what nbconvert --execute and papermill run)."""
    for key, value in kernel_env.items():
        monkeypatch.setenv(key, value)
    book = nbformat.read(path, as_version=4)
    client = NotebookClient(
        book,
        kernel_name=KERNEL,
        timeout=120,
        resources={"metadata": {"path": str(NOTEBOOKS)}},
    )
    client.execute()  # raises CellExecutionError, naming the cell, on the first error
    _EXECUTED[path.stem] = book
    return book


@pytest.mark.parametrize("path", ALL, ids=[p.stem for p in ALL])
def test_notebook_runs_top_to_bottom(path: Path, kernel_env: dict[str, str], monkeypatch):
    book = _execute(path, kernel_env, monkeypatch)
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
    kernel_env: dict[str, str], monkeypatch, tmp_path: Path
):
    """What a person shares after `jupyter nbconvert --execute` and `--to html`: opened
    without the widget manager or the network, the page shows the dashboard's finished
    snapshot and its PNG figures. The notebook executed above is reused (run alone, this
    executes it)."""
    from browser import ARTIFACTS, launch_chromium, sync_playwright_or_fail
    from nbconvert import HTMLExporter

    sync_playwright = sync_playwright_or_fail()
    book = _EXECUTED.get(EXPORTED)
    if book is None:
        book = _execute(NOTEBOOKS / f"{EXPORTED}.ipynb", kernel_env, monkeypatch)
    outputs = [o for cell in book.cells if cell.cell_type == "code" for o in cell.outputs]
    pngs = sum("image/png" in o.get("data", {}) for o in outputs)
    page_file = tmp_path / f"{EXPORTED}.html"
    page_file.write_text(HTMLExporter().from_notebook_node(book)[0], encoding="utf-8")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as pw:
        browser = launch_chromium(pw)
        try:
            page = browser.new_page(viewport={"width": 1300, "height": 1000})
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
            browser.close()
    assert "Will it load?" in text and "checking" not in text and "rendering" not in text, text
    assert pngs >= 3 and shown == pngs
